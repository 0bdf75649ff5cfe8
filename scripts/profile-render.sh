#!/usr/bin/env bash
# Where a Graphite render's time goes in the agent (issue 52: a render within 2x of Redis's own
# time). A private Redis gets `series` counter series of SCHEMA from python3-whisper files
# (`statsd-redis import whisper`, as scripts/bench-history.sh fills them); the agent (the
# profiling build, cleaner off) answers `requests` renders of 100 series (load.1??.c) from each
# of RANGES (default -1d), with MAX_POINTS Grafana's maxDataPoints (its panel's width), the
# first range's under `perf record -g`. Prints each range's median time, the agent's CPU time
# (/proc, user and system), Redis's own time (INFO commandstats: its commands alone) and its
# process's CPU (INFO cpu: reading the requests and writing the replies too) a render, and the first
# range's top symbols; the profile stays in `out`. NOPERF=1 times the same without perf.
#
#   [SCHEMA=10s:6h,1min:6d,10min:1800d] [RANGES="-1d -1y"] [MAX_POINTS=n] [NOPERF=1] \
#     [PERF_CALLGRAPH="--call-graph dwarf"] \
#     scripts/profile-render.sh [series=200] [requests=200] [out=render.perf]
#
# Needs: apt-get install -y linux-perf python3-whisper
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-200}; requests=${2:-200}; out=${3:-render.perf}
schema=${SCHEMA:-10s:6h,1min:6d,10min:1800d}
[ -n "${NOPERF:-}" ] || command -v perf >/dev/null || { echo "perf is missing: apt-get install -y linux-perf" >&2; exit 1; }
cargo build --profile profiling --quiet --bin statsd-redis
. scripts/common.sh
port=$(free_port)
start_node "$port"
mkwhisper "$dir/whisper" "$series" schema "$schema" >/dev/null
target/profiling/statsd-redis import whisper --redis "redis://127.0.0.1:$port" --retentions "$schema" \
  "$dir/whisper" >/dev/null 2>&1
AGENT=target/profiling/statsd-redis start_agent "$dir/agent.log" --redis "redis://127.0.0.1:$port" \
  --retentions "$schema" --cleaner-enabled false
profiled=false
for from in ${RANGES:--1d}; do
  url="http://127.0.0.1:$http/graphite/render?target=load.1%3F%3F.c&from=$from&format=json${MAX_POINTS:+&maxDataPoints=$MAX_POINTS}"
  # The names' look-up, kept 30 s, out of the timing.
  curl -sg -o /dev/null "$url"
  redis-cli -p "$port" config resetstat >/dev/null
  $profiled || [ -n "${NOPERF:-}" ] || perf_start "$out" "$agent_pid"
  cpu0=$(proc_cpu "$agent_pid")
  redis0=$(redis_usage "-p $port" | cut -d' ' -f1)
  for _ in $(seq "$requests"); do
    curl -sg -o /dev/null -w '%{time_total}\n' "$url"
  done >"$dir/times"
  cpu1=$(proc_cpu "$agent_pid")
  redis1=$(redis_usage "-p $port" | cut -d' ' -f1)
  $profiled || [ -n "${NOPERF:-}" ] || perf_stop
  python3 -c "
import statistics
t = [float(l) for l in open('$dir/times')]
print(f'from=$from: render median {statistics.median(t) * 1e3:.2f} ms over {len(t)},'
      f' the agent\'s CPU {($cpu1 - $cpu0) * 1e3 / len(t):.2f} ms a render', end='')"
  redis-cli -p "$port" info commandstats | tr -d '\r' |
    awk -F'[=,]' -v n="$requests" -v a="$redis0" -v b="$redis1" '/^cmdstat_/ {u += $4} END {
      printf ", Redis own time %.2f ms a render (its process'"'"'s CPU: %.2f ms)\n", u / n / 1e3, (b - a) * 1e3 / n}'
  profiled=true
done
[ -n "${NOPERF:-}" ] || perf report -i "$out" --no-children --percent-limit 1.5 --stdio 2>/dev/null | grep -E '^ +[0-9]' | head -40
