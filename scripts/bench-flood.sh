#!/usr/bin/env bash
# A cardinality flood past the series cap: invented counter names, every line a new series,
# at `rate` lines a second for `secs` seconds, against an agent capped at `cap` series per
# window. Prints the samples the cap dropped (counted, and checked against what was sent and
# what Redis got), the agent's peak memory and its memory per series at the cap, and the
# backlog (which must stay small: the cap bounds each window's chunks too).
#
#   scripts/bench-flood.sh [secs=30] [rate=100000] [cap=50000]
#
# The precisions are 1 and 60 s, so that Redis keeps up and the memory measured is the
# agent's windows, not a backlog. AGENT_ARGS adds agent flags.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-30}; rate=${2:-100000}; cap=${3:-50000}
cargo build --release --quiet --bin statsd-redis --example loadgen
. scripts/common.sh
sock="$dir/r.sock"
start_redis "$sock"
# shellcheck disable=SC2086
start_agent "$dir/agent.log" --redis "redis+unix://$sock" \
  --precisions 1,60 --cleaner-enabled false --max-series-per-window "$cap" ${AGENT_ARGS:-}
pid=$agent_pid
sleep 1
metric() { curl -s "127.0.0.1:$http/metrics" | awk -v m="statsd_redis_$1" '$1 == m || index($1, m "{") == 1 { s += $2; n++ } END { if (n) print s }'; }
idle_kb=$(awk '/^VmRSS/ {print $2}' "/proc/$pid/status")
lines=$((rate * secs))
# As many series as lines: no name comes twice.
target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$lines" --prefix flood \
  --lines-per-datagram 20 --lines "$lines" --rate "$rate" >/dev/null
sleep 2
for _ in $(seq 1 60); do [ "$(metric backlog_windows)" = 0 ] && break; sleep 1; done
peak_kb=$(awk '/^VmHWM/ {print $2}' "/proc/$pid/status")
received=$(metric lines_received_total)
dropped=$(metric 'samples_dropped_total{type="c"}')
kernel=$(metric kernel_drops_total)
written=$(redis-cli -s "$sock" --scan --pattern 'count:1:*' | wc -l)
echo "sent $lines lines ($rate new series a second for $secs s), cap $cap series per window"
echo "received $received (kernel drops: $kernel); dropped by the cap: $dropped; series in Redis: $written"
echo "received = dropped + written: $(python3 -c "print(int(float('$received')) == int(float('$dropped')) + $written)")"
echo "backlog after: $(metric backlog_windows) windows, $(metric backlog_bytes) bytes; windows dropped: $(metric windows_dropped_total)"
echo "agent RSS: idle $idle_kb KiB, peak $peak_kb KiB: $(( (peak_kb - idle_kb) * 1024 / cap )) bytes per series at the cap"
grep -m1 'series cap reached' "$dir/agent.log" | cut -c1-300 || true
