#!/usr/bin/env bash
# What the cleaner's pass costs Redis at steady state over long archives (docs/layout.md, "The
# cleaner"): SERIES gauge series of SCHEMA (default carbon's 10s:6h,1m:7d,1h:90d,1d:5y) whose
# hashes are full, as a collectd-like stream leaves them: each of the two finest precisions
# (and the third, where it is finer than an hour) holds the newest 120 slices, or all its
# retention keeps when that is fewer, and what a minute brought since the pass before (126 of
# 10 s, 121 of 60 s, 120 of 600 s); a first pass (every hash read whole), a minute of new
# slices (60/p + 1 a precision: 7 of 10 s, 2 of 60 s, 1 of 600 s a series), then the next
# pass: Redis's own time a series (INFO commandstats, where a script's commands count in the
# script's time and again in their own) and Redis's process CPU a series (INFO cpu; the next
# pass's includes Redis idling until it comes) for each pass. RUNS times (median, then the
# runs).
#
#   [AGENT=<build>] [SCHEMA=retentions] [INTERVAL=60] scripts/cleaner-cost.sh [series=20000] [runs=3]
#
# INTERVAL: the agent's cleaner_interval_secs, and the new slices before the next pass those
# seconds' (60/p a minute).
#
# Needs python3-redis.
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-20000}; runs=${2:-3}
schema=${SCHEMA:-10s:6h,1m:7d,1h:90d,1d:5y}
interval=${INTERVAL:-60}
. scripts/common.sh
need_python_redis
kept=$(archives "$schema")
# fill SOCK SERIES ARCHIVES FIRST: each series' hashes of the finer precisions of ARCHIVES
# (`archives`' form; as above), the first fill (FIRST=1) or an interval's new slices (0).
fill() {
  /usr/bin/python3 - "$@" <<'PY'
import redis, sys, time
sock, n, first, interval = sys.argv[1], int(sys.argv[2]), sys.argv[4] == "1", int(sys.argv[5])
archives = [tuple(map(int, a.split(":"))) for a in sys.argv[3].split(",")]
counts = []
for i, (prec, kept) in enumerate(archives):
    if i >= 3 or (i == 2 and prec >= 3600):
        break
    per_pass = max(interval // prec, 1)
    counts.append((prec, min(kept // prec, 120) + per_pass if first else per_pass + 1))
r = redis.Redis(unix_socket_path=sock)
now = int(time.time())
p = r.pipeline(transaction=False)
for i in range(n):
    s = f"collectd.host{i % 500}.cpu{i}.value"
    for prec, count in counts:
        top = now - now % prec
        p.hset(f"gauge:{prec}:{s}", mapping={str(top - k * prec): str(k % 100) for k in range(count)})
        p.zadd("known:gauge:", {f"{prec}:{s}": 0})
    if i % 500 == 0:
        p.execute()
p.execute()
PY
}
first_runs=(); next_runs=(); first_cpu=(); next_cpu=()
for run in $(seq 1 "$runs"); do
  sock=$dir/redis.sock; rm -f "$sock"
  start_redis "$sock"
  fill "$sock" "$series" "$kept" 1 "$interval"
  redis-cli -s "$sock" config resetstat >/dev/null
  r0=$(redis_cpu "$sock")
  start_agent "$dir/agent.log" --redis "unix://$sock" --retentions "$schema" \
    --cleaner-interval-secs "$interval"
  until [ "$(agent_metric "$http" cleaner_passes_total)" != 0 ]; do sleep 0.2; done
  first_runs+=("$(echo "$(redis_usec "$sock") / $series" | bc -l)")
  first_cpu+=("$(echo "($(redis_cpu "$sock") - $r0) * 1000000 / $series" | bc -l)")
  # An interval of writes before the next pass.
  sleep $((interval * 3 / 4))
  fill "$sock" "$series" "$kept" 0 "$interval"
  redis-cli -s "$sock" config resetstat >/dev/null
  r0=$(redis_cpu "$sock")
  until [ "$(agent_metric "$http" cleaner_passes_total)" = 2 ]; do sleep 0.2; done
  [ -n "${COMMANDSTATS:-}" ] && redis-cli -s "$sock" info commandstats | grep -E "cmdstat_" >&2
  next_runs+=("$(echo "$(redis_usec "$sock") / $series" | bc -l)")
  next_cpu+=("$(echo "($(redis_cpu "$sock") - $r0) * 1000000 / $series" | bc -l)")
  kill "$agent_pid"; wait "$agent_pid" 2>/dev/null || true
  kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
done
show_runs "first pass, Redis a series" 1 "${first_runs[@]}"
show_runs "next pass, Redis a series" 1 "${next_runs[@]}"
show_runs "first pass, Redis's process CPU a series" 1 "${first_cpu[@]}"
show_runs "next pass, Redis's process CPU a series (and its idle wait for the pass)" 1 "${next_cpu[@]}"
