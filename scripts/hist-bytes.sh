#!/usr/bin/env bash
# What a timer's quantile slices cost Redis (issue 52; docs/layout.md "Quantile slices"), beside
# the whisper files Etsy's statsd writes for the same timer (count, count_ps, lower, mean,
# median, std, sum, sum_squares, upper, and count_, mean_, upper_, sum_, sum_squares_ of each
# percent threshold: 14 names at the default threshold 90, 12 bytes a point each).
#
# A private Redis gets `slices` one-minute slices of `series` timers with `values` values a
# minute (lognormal around 100 ms, as latencies are), each slice's hash as the agent writes it
# (its buckets at 1 % relative accuracy: src/aggregate/sketch.rs's mapping, the weighted
# counts, the `a` field; `EXPIREAT`); used_memory's growth a slice. Then the agent (`$AGENT`,
# default target/release/statsd-redis) runs under `$SCHEMA` (default Etsy's
# `10s:6h,1min:6d,10min:1800d`) until its cleaner has packed every slice past five minutes into
# blocks (src/store/quantile_blocks.rs, all at once, as after an upgrade): the Redis CPU that
# took (less that of a pass with nothing to pack), and used_memory's growth a slice again.
# Last, the steady state: five more minutes a timer, as one walk finds them every five
# minutes, packed by a new agent's first pass; its Redis CPU a slice, less that of a pass with
# nothing to pack. Memory is measured after DEBUG
# RELOAD (the key space as a restart loads it: deleting 28 800 keys leaves Redis's key table
# sized for them a while), less what the key space holds empty afterwards (the agent's visits
# leave Redis a few hundred KB of its own, its scripts' Lua memory among them).
#
# With RENDERS=n, once every slice is packed: n renders of the timers' p99 over the last
# `slices` minutes (`bench.*.latency.p99`, JSON), the agent's cleaner off; their median time
# and Redis's own time a render (INFO commandstats), to set a long archive beside a short one
# (TARGET: another target, e.g. `stats.timers.bench.*.latency.upper_90`, Etsy's name, which
# turns `graphite_etsy_names` on);
# the agent's CPU a render (/proc, user and system); the first render's time apart (it
# decodes every block, the others find what it kept); with PERF=file, the renders under
# `perf record -g` (use AGENT=target/profiling/statsd-redis for its symbols).
#
#   [SCHEMA=...] [AGENT=...] [RENDERS=n] [PERF=file] scripts/hist-bytes.sh [series=20] [slices=1440] [values=60]
#
# Needs: apt-get install -y python3-redis
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-20}; slices=${2:-1440}; values=${3:-60}
. scripts/common.sh
need_python_redis
sock=$dir/redis.sock
start_redis "$sock" --enable-debug-command local

# fill FIRST LAST: the minutes FIRST to LAST - 1 back from now of every timer, as hashes; prints
# the buckets a slice.
fill() {
  /usr/bin/python3 - "$sock" "$series" "$1" "$2" "$values" <<'EOF'
import collections, math, random, sys, time
import redis
sock, series, first, last, values = sys.argv[1], *map(int, sys.argv[2:])
r = redis.Redis(unix_socket_path=sock)
alpha = 0.01
gamma = (1 + alpha) / (1 - alpha)
random.seed(52 + first)
now = int(time.time()) // 60 * 60
buckets = 0
for s in range(series):
    pipe = r.pipeline(transaction=False)
    for i in range(first, last):
        slice = now - i * 60
        counts = collections.Counter(
            math.ceil(math.log(random.lognormvariate(math.log(100), 0.5)) / math.log(gamma))
            for _ in range(values))
        buckets += len(counts)
        key = f'hist:60:bench.{s}.latency:AccessTime:{slice}'
        pipe.hset(key, mapping={**{str(b): n for b, n in counts.items()}, 'a': alpha})
        pipe.expireat(key, slice + 6 * 86400)
    pipe.execute()
print(f'{buckets / series / (last - first):.1f}')
EOF
}
used() {
  redis-cli -s "$sock" debug reload >/dev/null
  redis-cli -s "$sock" info memory | tr -d '\r' | awk -F: '/^used_memory:/ {print $2}'
}
keys() { redis-cli -s "$sock" eval "return #redis.call('keys', '$1')" 0; }
# pack: an agent until its cleaner's first pass is over (it walks every quantile slice, and
# packs all but the open minutes: the last five, and the one being written); prints the Redis
# CPU seconds that took.
pack() {
  local before; before=$(redis_cpu "$sock")
  start_agent "$dir/agent.log" --redis "unix://$sock" \
    --retentions "${SCHEMA:-10s:6h,1min:6d,10min:1800d}" --quantile-precisions 60
  until [ "$(agent_metric "$http" cleaner_passes_total)" -ge 1 ]; do
    kill -0 "$agent_pid" || { cat "$dir/agent.log" >&2; exit 1; }
    sleep 0.1
  done
  awk -v a="$before" -v b="$(redis_cpu "$sock")" 'BEGIN { print b - a }'
  kill "$agent_pid"; wait "$agent_pid" || true
  [ "$(keys 'hist:*')" -le $((series * 7)) ] || { echo "not packed" >&2; exit 1; }
}

n=$((series * slices))
base=$(used)
per_slice=$(fill 0 "$slices")
hashes=$(used)
echo "$series timers, $slices one-minute slices each, $values values a minute: $per_slice buckets a slice"
awk -v u="$hashes" -v b="$base" -v n="$n" 'BEGIN {
  printf "  a hash a slice:     %.0f bytes a slice (%.1f a point of the 14 Etsy names)\n", (u - b) / n, (u - b) / n / 14 }'
echo "  whisper, 14 names:  168 bytes a slice (12.0 a point)"
cpu=$(pack)
blocks=$(keys 'history:hist:*')
packed=$(used)
if [ -n "${RENDERS:-}" ]; then
  target=${TARGET:-bench.*.latency.p99}
  start_agent "$dir/agent.log" --redis "unix://$sock" --cleaner-enabled false \
    --retentions "${SCHEMA:-10s:6h,1min:6d,10min:1800d}" --quantile-precisions 60 \
    ${TARGET:+--graphite-etsy-names true}
  url="http://127.0.0.1:$http/graphite/render?target=$target&from=-$((slices * 60))s&format=json"
  until curl -sf -o /dev/null "http://127.0.0.1:$http/healthz"; do sleep 0.1; done
  # The first render decodes every block; the Graphite API keeps what it took from each
  # (quantile_blocks::Memo), which the renders after it find.
  curl -sg -o /dev/null -w '%{time_total}\n' "$url" |
    awk '{printf "  the first render (nothing kept yet): %.2f ms\n", $1 * 1000}'
  curl -sg "$url" | python3 -c 'import json,sys; a=json.load(sys.stdin); print("  rendered:", len(a), "series,", sum(v is not None for s in a for v, _ in s["datapoints"]), "points")'
  redis-cli -s "$sock" config resetstat >/dev/null
  [ -z "${PERF:-}" ] || perf_start "$PERF" "$agent_pid"
  cpu0=$(proc_cpu "$agent_pid")
  for _ in $(seq "$RENDERS"); do curl -sg -o /dev/null -w '%{time_total}\n' "$url"; done |
    sort -n | awk '{t[NR] = $1} END {printf "  render '"$target"' of the last %d minutes: median %.2f ms\n", '"$slices"', t[int((NR + 1) / 2)] * 1000}'
  cpu1=$(proc_cpu "$agent_pid")
  [ -z "${PERF:-}" ] || perf_stop
  awk -v a="$cpu0" -v b="$cpu1" -v n="$RENDERS" \
    'BEGIN {printf "  the agent'"'"'s CPU: %.2f ms a render\n", (b - a) * 1000 / n}'
  redis-cli -s "$sock" info commandstats | tr -d '\r' |
    awk -F'[=,]' -v n="$RENDERS" '/^cmdstat_/ {u += $4} END {printf "  of which Redis: %.2f ms a render\n", u / n / 1000}'
  kill "$agent_pid"; wait "$agent_pid" || true
fi
idle=$(pack)
fill 6 11 >/dev/null
steady=$(pack)
redis-cli -s "$sock" flushall >/dev/null
awk -v u="$packed" -v b="$(used)" -v n="$n" -v k="$blocks" 'BEGIN {
  printf "  packed (%d blocks): %.0f bytes a slice (%.1f a point of the 14 Etsy names)\n", k, (u - b) / n, (u - b) / n / 14 }'
awk -v c="$cpu" -v i="$idle" -v n="$n" 'BEGIN {
  printf "  the pack of them all: %.1f µs of Redis CPU a slice\n", (c - i) * 1e6 / n }'
awk -v c="$steady" -v i="$idle" -v n="$((series * 5))" 'BEGIN {
  printf "  a walk of five minutes a timer: %.1f µs of Redis CPU a slice\n", (c - i) * 1e6 / n }'
