#!/usr/bin/env bash
# High cardinality: 100 000 counter series and 10 000 timer series, each active every second,
# for 60 s (two load generators, one line per series per second). Prints, every 10 s, the
# agent's backlog and RSS, then the flush-duration quantiles from its histogram, the agent's
# memory per active series above its idle baseline, and the Redis CPU the run cost.
#
#   scripts/bench-cardinality.sh [seconds=60] [counters=100000] [timers=10000] [precisions=1,5,60,300,3600,18000,86400]
#
# AGENT_ARGS adds agent flags, e.g. AGENT_ARGS='--coarse-write-secs 5'. AGENT_LOG=file keeps the
# agent's log; with RUST_LOG=statsd_redis=debug it has a line per window written, with its
# duration. REDIS_COMMANDSTATS=1 also prints Redis's `INFO commandstats` for the run. The agent's
# own CPU for the run is printed too (e.g. to weigh AGENT_ARGS='--spool-dir DIR').
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}; counters=${2:-100000}; timers=${3:-10000}; precisions=${4:-1,5,60,300,3600,18000,86400}
cargo build --release --quiet --bin statsd-redis --example loadgen
. scripts/common.sh
rss_kb() { awk '/^VmRSS/ {print $2}' "/proc/$1/status"; }
sock="$dir/r.sock"
start_redis "$sock"
# shellcheck disable=SC2086
start_agent "${AGENT_LOG:-$dir/agent.log}" --redis "redis+unix://$sock" \
  --precisions "$precisions" --cleaner-enabled false ${AGENT_ARGS:-}
pid=$agent_pid
sleep 1
idle_kb=$(rss_kb $pid); cpu0=$(redis_cpu "$sock"); agent0=$(proc_cpu $pid); redis-cli -s "$sock" config resetstat >/dev/null
target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$counters" --prefix hc \
  --lines-per-datagram 20 --lines $((counters * secs)) --rate "$counters" >/dev/null &
gen1=$!
target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$timers" --prefix ht --types ms \
  --lines-per-datagram 20 --lines $((timers * secs)) --rate "$timers" >/dev/null &
gen2=$!
printf '%5s %8s %10s\n' secs backlog rss_kb
for t in $(seq 10 10 "$secs"); do
  sleep 10
  backlog=$(curl -s "127.0.0.1:$http/metrics" | awk '$1 == "statsd_redis_backlog_windows" {print $2}')
  printf '%5d %8s %10s\n' "$t" "$backlog" "$(rss_kb $pid)"
done
# The writer may still be working off a backlog: wait for it (bounded) before the figures.
for _ in $(seq 1 120); do
  backlog=$(curl -s "127.0.0.1:$http/metrics" | awk '$1 == "statsd_redis_backlog_windows" {print $2}')
  [ "${backlog:-0}" = 0 ] && break
  sleep 1
done
echo "backlog after sending: ${backlog:-?} windows; windows dropped: $(curl -s "127.0.0.1:$http/metrics" | awk '$1 == "statsd_redis_windows_dropped_total" {print $2}')"
peak_kb=$(awk '/^VmHWM/ {print $2}' "/proc/$pid/status")
wait $gen1 $gen2 || true
agent1=$(proc_cpu $pid)
sleep 2
cpu1=$(redis_cpu "$sock")
curl -s "127.0.0.1:$http/metrics" | python3 -c '
import sys
b = [(float(l.split("le=\"")[1].split("\"")[0].replace("+Inf", "inf")), float(l.split()[-1]))
     for l in sys.stdin if l.startswith("statsd_redis_flush_duration_seconds_bucket")]
total = b[-1][1]
for q in (0.5, 0.99):
    print("flush p%d <= %s s (of %d flushes)" % (q * 100, next(le for le, c in b if c >= q * total), total))'
echo "agent RSS: idle $idle_kb KiB, under load $peak_kb KiB: $(( (peak_kb - idle_kb) * 1024 / (counters + timers) )) bytes per active series"
echo "Redis CPU for the run: $(python3 -c "print(round($cpu1 - $cpu0, 2))") s over ${secs} s"
echo "agent CPU for the run: $(python3 -c "print(round($agent1 - $agent0, 2))") s"
if [ -n "${REDIS_COMMANDSTATS:-}" ]; then
  redis-cli -s "$sock" info commandstats | awk -F'[:=,]' '/^cmdstat_/ && $3 > 1000 {printf "%-22s %10d calls %8.2f s %6.2f us/call\n", $1, $3, $5 / 1e6, $7}'
fi
