#!/usr/bin/env bash
# One of bench-graphite.sh's requests (examples/graphite_latency.rs: render100, sum100, moving10,
# find, render1000, alias1000, dashboard20), `runs` times against one build on Redis seeded as
# bench-graphite.sh seeds it: its p50 and Redis's own time (the example's line), then a request's
# Redis commands (INFO commandstats), Redis's process CPU (INFO cpu) and the agent's CPU (/proc).
# A render cannot be quicker than Redis's process CPU for it: scripts/read-cost.sh says how far
# that lies above Redis's own time. PERF=file profiles the agent meanwhile (`perf record -g`; use
# the profiling build: AGENT=target/profiling/statsd-redis). KEEP_ALIVE=1 sends the requests over
# one kept connection, as Grafana's server-side client does, instead of a fresh one each.
#   [AGENT=<build>] [PERF=file] [KEEP_ALIVE=1] scripts/request-cost.sh [request=dashboard20] [runs=200]
set -euo pipefail
cd "$(dirname "$0")/.."
. scripts/common.sh
only=${1:-dashboard20}; runs=${2:-200}
seed_graphite >/dev/null
start_agent "$dir/agent.log" "${graphite_flags[@]}"
measure() {
  target/release/examples/graphite_latency measure --redis "$redis" \
    --base "http://127.0.0.1:$http/graphite" --now "$now" --runs "$1" --oracle-runs 0 --only "$only" \
    ${KEEP_ALIVE:+--keep-alive}
}
measure 20 >/dev/null
redis-cli -s "$dir/redis.sock" config resetstat >/dev/null
redis0=$(redis_cpu "$dir/redis.sock"); agent0=$(proc_cpu "$agent_pid")
[ -z "${PERF:-}" ] || perf_start "$PERF" "$agent_pid"
measure "$runs"
[ -z "${PERF:-}" ] || perf_stop
redis1=$(redis_cpu "$dir/redis.sock"); agent1=$(proc_cpu "$agent_pid")
redis-cli -s "$dir/redis.sock" info commandstats | tr -d '\r' |
  awk -F'[=,:]' -v n="$runs" '/^cmdstat_/ && !/cmdstat_(info|config)/ {
    printf "%s: %.1f calls, %.0f µs a request\n", substr($1, 9), $3 / n, $5 / n }'
echo "$redis0 $redis1 $agent0 $agent1 $runs" |
  awk '{printf "a request: Redis'"'"'s process CPU %.2f ms, the agent'"'"'s CPU %.2f ms\n", ($2 - $1) * 1e3 / $5, ($4 - $3) * 1e3 / $5}'
[ -z "${PERF:-}" ] || perf report -i "$PERF" --no-children --percent-limit 1.5 --stdio 2>/dev/null |
  grep -E '^ +[0-9]' | head -30
