#!/usr/bin/env bash
# Measures how long one flush chunk (one MULTI/EXEC: src/store/standalone.rs) keeps Redis busy,
# for several chunk sizes, from Redis's own SLOWLOG (every call logged; an EXEC's time holds its
# writes'). Counters at the 7 default precisions: each series costs 7 HINCRBY, plus an index
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
  start_redis "$sock" --slowlog-log-slower-than 0 --slowlog-max-len 2000000
  udp=$(free_port); http=$(free_port)
  target/release/statsd-redis --udp "127.0.0.1:$udp" --http "127.0.0.1:$http" \
    --redis "redis+unix://$sock" --max-series-per-chunk "$chunk" 2>"$dir/agent-$chunk.log" &
  agent_pid=$!
  until curl -s "127.0.0.1:$http/healthz" >/dev/null; do sleep 0.05; done
  # Every series in every window: 5 lines per series per second for 6 seconds.
  target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$series" \
    --lines-per-datagram 20 --lines $((series * 30)) --rate $((series * 5)) >/dev/null
  kill -TERM $agent_pid; wait $agent_pid
  # SLOWLOG entries: id, timestamp, duration (us), [command args...]; keep EXEC durations.
  redis-cli -s "$sock" --json slowlog get 2000000 | python3 -c '
import json, sys
entries = json.load(sys.stdin)
d = sorted(e[2] for e in entries if str(e[3][0]).lower() == "exec")
if not d:
    print("no EXEC calls logged"); sys.exit(1)
pct = lambda q: d[min(len(d) - 1, int(q * len(d)))]
print("%-10s %8d %12d %12d %12d" % (sys.argv[1], len(d), pct(0.5), pct(0.99), d[-1]))' "$chunk"
  kill $redis_pid; wait $redis_pid 2>/dev/null || true
done
