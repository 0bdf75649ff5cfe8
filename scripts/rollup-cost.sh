#!/usr/bin/env bash
# What carbon's rollups cost (docs/carbon.md, "Open intervals, once a period"): an agent (release
# build, carbon's schema 10s:6h,1m:7d,1h:90d,1d:5y, its rollups held back) takes SERIES series'
# points of the open minute, as collectd's rounds leave them, and is killed before a rollup
# runs; a second agent of the same schema (its rollups every second, no cleaner) then makes
# them: Redis's own time (INFO commandstats, where a script's commands count in the script's
# time and again in their own), Redis's process CPU while the rollups ran (its reading of
# commands and writing of replies too) and the agent's CPU (/proc) a pending member. Then a
# cleaner pass over what that leaves (an agent with only its cleaner): Redis's time a series.
# RUNS times (median, then the runs). FULL=1: each series' finer hashes (every archive but the
# coarsest) first hold their newest 120 slices, as a series that has sent for a few days leaves
# them, so the rollup reads its intervals out of full hashes. SCHEMA: carbon's retentions
# (default 10s:6h,1m:7d,1h:90d,1d:5y).
#
#   [AGENT=<build>] [FULL=1] [SCHEMA=retentions] scripts/rollup-cost.sh [series=20000] [runs=3]
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-20000}; runs=${2:-3}
. scripts/common.sh
need_python_redis
schema=${SCHEMA:-10s:6h,1m:7d,1h:90d,1d:5y}
redis_runs=(); process_runs=(); agent_runs=(); cleaner_runs=()
for run in $(seq 1 "$runs"); do
  sock=$dir/redis.sock; rm -f "$sock"
  start_redis "$sock"
  if [ "${FULL:-0}" = 1 ]; then
    fill_full "$sock" "$series" "$schema"
  fi
  carbon=$(free_port)
  start_agent "$dir/agent.log" --redis "unix://$sock" --retentions "$schema" \
    --carbon-tcp "127.0.0.1:$carbon" --coarse-write-secs 3600 --cleaner-enabled false
  /usr/bin/python3 - "$carbon" "$sock" "$series" "$agent_pid" <<'PY'
import os, redis, signal, socket, sys, time
port, sock, series, agent = int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
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
PY
  { wait "$agent_pid"; } 2>/dev/null || true
  redis-cli -s "$sock" config resetstat >/dev/null
  start_agent "$dir/agent.log" --redis "unix://$sock" --retentions "$schema" \
    --carbon-tcp "127.0.0.1:$(free_port)" --coarse-write-secs 1 --cleaner-enabled false
  a0=$(proc_cpu "$agent_pid"); r0=$(proc_cpu "$redis_pid")
  until [ "$(redis-cli -s "$sock" zcard pending:gauge:)" = 0 ] &&
    [ "$(redis-cli -s "$sock" zcard rolling:gauge:)" = 0 ]; do sleep 0.1; done
  a1=$(proc_cpu "$agent_pid"); r1=$(proc_cpu "$redis_pid")
  [ -n "${COMMANDSTATS:-}" ] && redis-cli -s "$sock" info commandstats | grep -E "cmdstat_" >&2
  redis_runs+=("$(echo "$(redis_usec "$sock") / $series" | bc -l)")
  process_runs+=("$(echo "($r1 - $r0) * 1000000 / $series" | bc -l)")
  agent_runs+=("$(echo "($a1 - $a0) * 1000000 / $series" | bc -l)")
  kill "$agent_pid"; wait "$agent_pid" 2>/dev/null || true
  redis-cli -s "$sock" config resetstat >/dev/null
  start_agent "$dir/agent.log" --redis "unix://$sock" --retentions "$schema"
  until [ "$(agent_metric "$http" cleaner_passes_total)" != 0 ]; do sleep 0.2; done
  cleaner_runs+=("$(echo "$(redis_usec "$sock") / $series" | bc -l)")
  kill "$agent_pid"; wait "$agent_pid" 2>/dev/null || true
  kill "$redis_pid"; wait "$redis_pid" 2>/dev/null || true
done
show_runs "rollup, Redis a pending member" 2 "${redis_runs[@]}"
show_runs "rollup, Redis's process CPU a pending member" 2 "${process_runs[@]}"
show_runs "rollup, the agent a pending member" 2 "${agent_runs[@]}"
show_runs "cleaner pass, Redis a series" 2 "${cleaner_runs[@]}"
