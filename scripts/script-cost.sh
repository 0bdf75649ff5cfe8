#!/usr/bin/env bash
# Redis CPU that flush.lua costs for a window of counters, without the agent: a private Redis
# holding `series` counter series with `slices` slices at each listed precision (and their index
# members), then `windows` windows of one EVALSHA per `chunk` series (each series +3 in a new
# slice at each precision), sent with `redis-cli --pipe`. Prints Redis's CPU per window and how
# much of it the HINCRBY calls themselves took; the rest is the script around them.
# `modes` lists what the chunks do at each precision, `precision:mode`, comma-separated, the
# mode as CounterWrite in src/store/writer.rs: 1 written and indexed with a new slice, 2 written
# unindexed, 3 indexed only, 0 nothing. The default, 1:2, is the 1 s precision as written every
# window with coarse_write_secs; 1:3,5:1 is the first coarse level's group, 1:0,5:2 the same for
# series written in the group before.
#
#   scripts/script-cost.sh [script=src/store/flush.lua] [series=110000] [slices=60] [chunk=100] [windows=10] [modes=1:2]
#
# REDIS_ARGS adds redis-server flags (e.g. '--hash-max-listpack-entries 0'); PERF=file records
# Redis's profile (perf record -g) over the timed windows, for `perf report -i file`.
#
# To compare two versions of the script, run it on each, alternately:
#   git show HEAD~1:src/store/flush.lua > /tmp/old.lua; scripts/script-cost.sh /tmp/old.lua
set -euo pipefail
cd "$(dirname "$0")/.."
script=${1:-src/store/flush.lua}; series=${2:-110000}; slices=${3:-60}; chunk=${4:-100}; windows=${5:-10}; modes=${6:-1:2}
. scripts/common.sh
sock="$dir/r.sock"
# shellcheck disable=SC2086 # REDIS_ARGS is a list of flags.
start_redis "$sock" ${REDIS_ARGS:-}
for pm in ${modes//,/ }; do
  p=${pm%%:*}
  redis-cli -s "$sock" eval "for i = 0, $series - 1 do for t = 1, $slices do
    redis.call('HINCRBY', 'count:$p:hc.series' .. i, 1763829600 + $p * t, 1) end
    redis.call('ZADD', 'known:', 0, '$p:hc.series' .. i) end" 0 >/dev/null
done
# The script as the agent loads it: after what the flush scripts share.
sha=$(redis-cli -s "$sock" script load "$(cat src/store/hourly.lua "$script")")
python3 - "$sha" "$windows" "$series" "$chunk" "$slices" "$modes" > "$dir/commands" <<'PY'
import sys
sha, windows, series, chunk, slices = sys.argv[1], *map(int, sys.argv[2:6])
modes = [tuple(map(int, pm.split(':'))) for pm in sys.argv[6].split(',')]
out = sys.stdout.buffer
seq = 0
for w in range(windows):
    for c in range(0, series, chunk):
        end = min(c + chunk, series)
        # flush.lua's ARGV: chunk number, the one before it (0: none), sequence lifetime,
        # prefix, sample count, hour, asctime, log lifetime; the precisions (each with this
        # window's new slice and its mode); the counters; no stats, gauges, sets or logs.
        seq += 1
        args = ['EVALSHA', sha, 1, 'flush:bench', seq, 0, 600, '', 120,
                '2025-11-22T17:00:00', 'Sat Nov 22 17:00:00 2025', 0, len(modes)]
        for p, mode in modes:
            args += [p, 1763829600 + p * (slices + 1 + w), mode]
        args.append(end - c)
        for s in range(c, end):
            args += ['hc.series%d' % s, 3]
        args += [0, 0, 0, 0]
        parts = [b'*%d\r\n' % len(args)]
        for a in args:
            a = str(a).encode()
            parts.append(b'$%d\r\n%s\r\n' % (len(a), a))
        out.write(b''.join(parts))
PY
redis-cli -s "$sock" config resetstat >/dev/null
if [ -n "${PERF:-}" ]; then
  perf record -q -g -F 2000 -o "$PERF" -p "$redis_pid" 2>/dev/null &
  perf_pid=$!
  sleep 0.5
fi
cpu0=$(redis_cpu "$sock")
redis-cli -s "$sock" --pipe < "$dir/commands" | tail -1
cpu1=$(redis_cpu "$sock")
if [ -n "${PERF:-}" ]; then
  kill -INT "$perf_pid"
  wait "$perf_pid" || true
fi
hincrby_usec=$(redis-cli -s "$sock" info commandstats | awk -F'[=,]' '/^cmdstat_hincrby:/ {print $4} END {print 0}' | head -1)
python3 -c "
w = $windows
print('Redis CPU per window of $series series: %.1f ms, of which HINCRBY %.1f ms' % (($cpu1 - $cpu0) * 1000 / w, $hincrby_usec / 1000 / w))"
echo "Redis memory: $(redis-cli -s "$sock" info memory | awk -F: '/^used_memory_human:/ {print $2}' | tr -d '\r')"
