#!/usr/bin/env bash
# What the cleaner's pass costs Redis at steady state over long archives (docs/layout.md, "The
# cleaner"): SERIES gauge series of carbon's schema 10s:6h,1m:7d,1h:90d,1d:5y whose hashes are
# full (the newest 120 slices and what came since the pass before: 126 of 10 s, 121 of 60 s),
# as a collectd-like stream leaves them, a first pass (every hash read whole), a minute of new
# slices (7 of 10 s, 2 of 60 s a series), then the next pass: Redis's own time a series
# (INFO commandstats) for each pass. RUNS times (median, then the runs).
#
#   [AGENT=<build>] scripts/cleaner-cost.sh [series=20000] [runs=3]
#
# Needs python3-redis.
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-20000}; runs=${2:-3}
. scripts/common.sh
need_python_redis
# fill SOCK SERIES MINUTE: each series' 10 s and 60 s hashes, `count` newest slices each.
fill() {
  /usr/bin/python3 - "$@" <<'PY'
import redis, sys, time
sock, n, count10, count60 = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r = redis.Redis(unix_socket_path=sock)
now = int(time.time())
p = r.pipeline(transaction=False)
for i in range(n):
    s = f"collectd.host{i % 500}.cpu{i}.value"
    for prec, count in ((10, count10), (60, count60)):
        top = now - now % prec
        p.hset(f"gauge:{prec}:{s}", mapping={str(top - k * prec): str(k % 100) for k in range(count)})
        p.zadd("known:gauge:", {f"{prec}:{s}": 0})
    if i % 500 == 0:
        p.execute()
p.execute()
PY
}
first_runs=(); next_runs=()
for run in $(seq 1 "$runs"); do
  sock=$dir/redis.sock; rm -f "$sock"
  start_redis "$sock"
  fill "$sock" "$series" 126 121
  redis-cli -s "$sock" config resetstat >/dev/null
  start_agent "$dir/agent.log" --redis "unix://$sock" --retentions 10s:6h,1m:7d,1h:90d,1d:5y
  until [ "$(agent_metric "$http" cleaner_passes_total)" != 0 ]; do sleep 0.2; done
  first_runs+=("$(echo "$(redis_usec "$sock") / $series" | bc -l)")
  # A minute of writes before the next pass (a pass every 60 s).
  sleep 45
  fill "$sock" "$series" 7 2
  redis-cli -s "$sock" config resetstat >/dev/null
  until [ "$(agent_metric "$http" cleaner_passes_total)" = 2 ]; do sleep 0.2; done
  next_runs+=("$(echo "$(redis_usec "$sock") / $series" | bc -l)")
  kill "$agent_pid"; wait "$agent_pid" 2>/dev/null || true
  kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
done
show_runs "first pass, Redis a series" 1 "${first_runs[@]}"
show_runs "next pass, Redis a series" 1 "${next_runs[@]}"
