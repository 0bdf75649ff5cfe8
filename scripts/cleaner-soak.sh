#!/usr/bin/env bash
# Runs the agent against a private Redis with a steady stream of counter series and the
# cleaner at a short interval, and prints, every 30 s: Redis used_memory, the largest and
# mean number of slices in the 1-second counter hashes, and the size of known:.
#
#   scripts/cleaner-soak.sh [minutes=10] [series=1000] [sample_count=10] [interval_secs=5]
set -euo pipefail
cd "$(dirname "$0")/.."
minutes=${1:-10}; series=${2:-1000}; samples=${3:-10}; interval=${4:-5}
cargo build --release --quiet --bin statsd-redis --example loadgen
. scripts/common.sh
sock="$dir/redis.sock"
start_redis "$sock"
start_agent "$dir/agent.log" --redis "redis+unix://$sock" \
  --sample-count "$samples" --cleaner-interval-secs "$interval"
# Every series 5 times a second, for the whole run.
rate=$((series * 5))
target/release/examples/loadgen send --target "127.0.0.1:$udp" --series "$series" \
  --lines-per-datagram 20 --lines $((rate * minutes * 60)) --rate "$rate" >/dev/null &
sizes='local m, s, n = 0, 0, 0
for _, k in ipairs(redis.call("ZRANGE", "known:", 0, -1)) do
  if string.sub(k, 1, 2) == "1:" then
    local l = redis.call("HLEN", "count:" .. k); n = n + 1; s = s + l; if l > m then m = l end
  end
end
return {m, tostring(n > 0 and s / n or 0), redis.call("ZCARD", "known:")}'
printf '%6s %12s %14s %15s %7s %7s %8s %8s\n' secs used_memory max_1s_slices mean_1s_slices known: passes keys expiring
start=$(date +%s)
while [ $(( $(date +%s) - start )) -lt $((minutes * 60)) ]; do
  sleep 30
  mem=$(redis-cli -s "$sock" info memory | awk -F: '/^used_memory:/ {print $2}' | tr -d '\r')
  read -r max mean known < <(redis-cli -s "$sock" eval "$sizes" 0 | tr "\n" " ") || true
  passes=$(curl -s "127.0.0.1:$http/metrics" | awk '/^statsd_redis_cleaner_passes_total/ {print $2}')
  read -r keys expiring < <(redis-cli -s "$sock" info keyspace | awk -F'[=,]' '/^db0/ {print $2, $4}') || true
  printf '%6d %12s %14s %15.1f %7s %7s %8s %8s\n' $(( $(date +%s) - start )) "$mem" "$max" "$mean" "$known" "$passes" "$keys" "$expiring"
done
curl -s "127.0.0.1:$http/metrics" | grep -E '^statsd_redis_(cleaner|kernel_drops|windows_dropped|flushes_total|lines_received)' || true
