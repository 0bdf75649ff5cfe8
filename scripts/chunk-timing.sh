#!/usr/bin/env bash
# Measures how long one flush chunk (one MULTI/EXEC: src/store/write/standalone.rs) keeps Redis busy,
# for several chunk sizes, from Redis's own latency tracking (an EXEC's time holds its writes').
# Counters at the 7 default precisions: each series costs 7 HINCRBY, plus an index
# member for each slice it starts.
#
#   scripts/chunk-timing.sh [series per window, default 4000]
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-4000}
cargo build --release --quiet --bin statsd-redis --example loadgen
. scripts/common.sh

printf '%-10s %8s %12s %12s %12s\n' chunk calls median_us p99_us max_us
for chunk in 100 250 500 1000; do
  sock="$dir/redis-$chunk.sock"
  start_redis "$sock" --latency-tracking-info-percentiles "50 99 100"
  start_agent "$dir/agent-$chunk.log" --redis "redis+unix://$sock" --max-series-per-chunk "$chunk"
  # Every series in every window: 5 lines per series per second for 6 seconds.
  target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$series" \
    --lines-per-datagram 20 --lines $((series * 30)) --rate $((series * 5)) >/dev/null
  kill -TERM $agent_pid; wait $agent_pid
  # EXEC is not in the SLOWLOG (its commands are, one by one): its percentiles come from
  # Redis's latency tracking (p100 is the longest call).
  redis-cli -s "$sock" info all | tr -d '\r' | python3 -c '
import re, sys
text = sys.stdin.read()
calls = re.search(r"^cmdstat_exec:calls=(\d+)", text, re.M)
pct = re.search(r"^latency_percentiles_usec_exec:(.*)$", text, re.M)
if not calls or not pct:
    print("no EXEC calls seen"); sys.exit(1)
p = dict(kv.split("=") for kv in pct.group(1).split(","))
print("%-10s %8s %12s %12s %12s" % (sys.argv[1], calls.group(1), p["p50"], p["p99"], p["p100"]))' "$chunk"
  kill $redis_pid; wait $redis_pid 2>/dev/null || true
done
