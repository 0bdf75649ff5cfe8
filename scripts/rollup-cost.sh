#!/usr/bin/env bash
# What one carbon rollup costs Redis (docs/carbon.md, "Rollups"): the agent (release build,
# carbon's schema 10s:6h,1m:7d,1h:90d,1d:5y, its rollups held back) takes SERIES series' points
# of the open minute, as collectd's rounds leave them; it is killed before a rollup runs, and the
# rollup script (hourly.lua, points.lua, rollup.lua, as src/store/rollup.rs joins them) is then
# called here a batch of 1000 members at a time: Redis's own time for it (INFO commandstats) a
# pending member, and the same on a copy of the data made again, RUNS times (median, then the
# runs). Then a cleaner pass over what that leaves (an agent of the same schema with only its
# cleaner): Redis's time for it (its commands, outside a transaction) a series.
#
#   scripts/rollup-cost.sh [series=20000] [runs=3]
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-20000}; runs=${2:-3}
. scripts/common.sh
need_python_redis
script=$dir/rollup.lua
cat src/store/hourly.lua src/store/points.lua src/store/rollup.lua > "$script"
results=(); cleaner=()
for run in $(seq 1 "$runs"); do
  sock=$dir/redis.sock; rm -f "$sock"
  start_redis "$sock"
  carbon=$(free_port)
  start_agent "$dir/agent.log" --redis "unix://$sock" --retentions 10s:6h,1m:7d,1h:90d,1d:5y \
    --carbon-tcp "127.0.0.1:$carbon" --coarse-write-secs 3600 --cleaner-enabled false
  results+=("$(/usr/bin/python3 - "$carbon" "$sock" "$series" "$script" "$agent_pid" <<'PY'
import os, redis, signal, socket, sys, time
port, sock, series, script, agent = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), sys.argv[4], int(sys.argv[5])
r = redis.Redis(unix_socket_path=sock)
# Two points a series, ten seconds apart, both in the minute still open.
now = int(time.time())
if now % 60 > 40:
    time.sleep(62 - now % 60)
    now = int(time.time())
s = socket.create_connection(("127.0.0.1", port))
for at in (now - 10, now):
    s.sendall("".join(f"collectd.host{i % 500}.cpu{i}.value {i % 100} {at}\n" for i in range(series)).encode())
s.close()
while r.zcard("pending:gauge:") < series:
    time.sleep(0.1)
time.sleep(1.5)
os.kill(agent, signal.SIGKILL)
r.config_resetstat()
sha = r.script_load(open(script).read())
taken = 0
while True:
    n = r.evalsha(sha, 0, now, "", 1000)[0]
    taken += n
    if n < 1000:
        break
usec = int(r.info("commandstats")["cmdstat_evalsha"]["usec"])
print(f"{usec / taken:.2f} {taken}")
r.config_resetstat()
PY
)")
  kill "$agent_pid" 2>/dev/null || true; wait "$agent_pid" 2>/dev/null || true
  # A cleaner pass over what is there now: an agent of the same schema with only its cleaner.
  start_agent "$dir/agent.log" --redis "unix://$sock" --retentions 10s:6h,1m:7d,1h:90d,1d:5y
  until [ "$(agent_metric "$http" cleaner_passes_total)" != 0 ]; do sleep 0.2; done
  cleaner+=("$(redis-cli -s "$sock" info commandstats | tr -d '\r' |
    awk -F'[=,]' -v n="$series" '/^cmdstat_/ && !/cmdstat_(exec|info|config)/ {u += $4} END {printf "%.2f", u / n}')")
  kill "$agent_pid" 2>/dev/null || true; wait "$agent_pid" 2>/dev/null || true
  kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
done
printf '%s\n' "${results[@]}" | sort -n | awk '{v[NR]=$1; n=$2} END {printf "rollup: %.2f us a pending member (median of %d; %d members)\n", v[int((NR+1)/2)], NR, n}'
printf 'runs: '; printf '%s ' "${results[@]%% *}"; echo
printf '%s\n' "${cleaner[@]}" | sort -n | awk '{v[NR]=$1} END {printf "cleaner pass: %.2f us a series (median of %d)\n", v[int((NR+1)/2)], NR}'
printf 'runs: '; printf '%s ' "${cleaner[@]}"; echo
