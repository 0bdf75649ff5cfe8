#!/usr/bin/env bash
# What a timer's quantile slices cost Redis (issue 52; docs/layout.md "Quantiles"), beside the
# whisper files Etsy's statsd writes for the same timer (count, count_ps, lower, mean, median,
# std, sum, sum_squares, upper, and count_, mean_, upper_, sum_, sum_squares_ of each percent
# threshold: 14 names at the default threshold 90, 12 bytes a point each). A private Redis gets
# `slices` one-minute slices of `series` timers with `values` values a minute (lognormal around
# 100 ms, as latencies are), each slice's hash as the agent writes it (its buckets at 1 %
# relative accuracy: src/aggregate/sketch.rs's mapping, the weighted counts, the `a` field;
# `EXPIREAT`); then used_memory's growth a slice. Then the agent (`$AGENT`, default
# target/release/statsd-redis) runs under `$SCHEMA` (default Etsy's `10s:6h,1min:6d,10min:1800d`)
# until its cleaner has packed every slice past five minutes into blocks
# (src/store/quantile_blocks.rs), and used_memory's growth a slice is measured again, and
# the Redis CPU the pack took. Both
# after DEBUG RELOAD: the key space as a restart loads it, its table sized to the keys held
# (deleting 28 800 keys leaves Redis's table sized for them for a while).
#
#   [SCHEMA=...] [AGENT=...] scripts/hist-bytes.sh [series=20] [slices=1440] [values=60]
#
# Needs: apt-get install -y python3-redis
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-20}; slices=${2:-1440}; values=${3:-60}
. scripts/common.sh
need_python_redis
start_redis "$dir/redis.sock" --enable-debug-command local
/usr/bin/python3 - "$dir/redis.sock" "$series" "$slices" "$values" >"$dir/hashes" <<'EOF'
import collections, math, random, sys, time
import redis
sock, series, slices, values = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
r = redis.Redis(unix_socket_path=sock)
alpha = 0.01
gamma = (1 + alpha) / (1 - alpha)
random.seed(52)
now = int(time.time()) // 60 * 60
base = int(r.info('memory')['used_memory'])
buckets = 0
for s in range(series):
    pipe = r.pipeline(transaction=False)
    for i in range(slices):
        slice = now - i * 60
        counts = collections.Counter(
            math.ceil(math.log(random.lognormvariate(math.log(100), 0.5)) / math.log(gamma))
            for _ in range(values))
        buckets += len(counts)
        key = f'hist:60:bench.{s}.latency:AccessTime:{slice}'
        pipe.hset(key, mapping={**{str(b): n for b, n in counts.items()}, 'a': alpha})
        pipe.expireat(key, slice + 6 * 86400)
    pipe.execute()
r.execute_command('DEBUG', 'RELOAD')
grown = int(r.info('memory')['used_memory']) - base
n = series * slices
print(f'{series} timers, {slices} one-minute slices each, {values} values a minute: '
      f'{buckets / n:.1f} buckets a slice')
print(f'  a hash a slice:     {grown / n:.0f} bytes a slice ({grown / n / 14:.1f} a point of the 14 Etsy names)')
print(f'  whisper, 14 names:  168 bytes a slice (12.0 a point)')
print(f'slices {n}')
EOF
grep -v '^slices ' "$dir/hashes"
read -r _ n < <(grep '^slices ' "$dir/hashes")
cpu=$(redis_cpu "$dir/redis.sock")
start_agent "$dir/agent.log" --redis "unix://$dir/redis.sock" \
  --retentions "${SCHEMA:-10s:6h,1min:6d,10min:1800d}" --quantile-precisions 60
keys() { redis-cli -s "$dir/redis.sock" eval "return #redis.call('keys', '$1')" 0; }
# Packed when only the open minutes (the last five, and the one being written) are hashes.
until [ "$(keys 'hist:*')" -le $((series * 7)) ]; do
  kill -0 "$agent_pid" || { cat "$dir/agent.log" >&2; exit 1; }
  sleep 0.5
done
cpu=$(awk -v a="$cpu" -v b="$(redis_cpu "$dir/redis.sock")" 'BEGIN { print b - a }')
kill "$agent_pid"; wait "$agent_pid" || true
used() {
  redis-cli -s "$dir/redis.sock" debug reload >/dev/null
  redis-cli -s "$dir/redis.sock" info memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}'
}
blocks=$(keys 'history:hist:*')
packed=$(used)
# What the keys hold: the agent's visit leaves Redis a few hundred KB of its own (its scripts'
# Lua memory among them), which an empty key space keeps too.
redis-cli -s "$dir/redis.sock" flushall >/dev/null
awk -v u="$packed" -v b="$(used)" -v n="$n" -v k="$blocks" 'BEGIN {
  printf "  packed (%d blocks): %.0f bytes a slice (%.1f a point of the 14 Etsy names)\n", k, (u - b) / n, (u - b) / n / 14 }'
awk -v c="$cpu" -v n="$n" 'BEGIN { printf "  the pack: %.1f µs of Redis CPU a slice (with the polling of this script)\n", c * 1e6 / n }'
