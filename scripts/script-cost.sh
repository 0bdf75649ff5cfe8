#!/usr/bin/env bash
# Redis CPU that flush.lua costs for a window of counters at the 1 s precision, without the
# agent: a private Redis holding `series` counter hashes of `slices` slices each, then `windows`
# windows of one EVALSHA per `chunk` series (each series +3 in a new slice), sent with
# `redis-cli --pipe`. Prints Redis's CPU per window and how much of it the HINCRBY calls
# themselves took; the rest is the script around them. `mode` is what the chunks do at 1 s
# (CounterWrite in src/store/writer.rs): 2 written unindexed (the 1 s precision with
# coarse_write_secs), 1 written and indexed with the new slice, 3 indexed only.
#
#   scripts/script-cost.sh [script=src/store/flush.lua] [series=110000] [slices=60] [chunk=100] [windows=10] [mode=2]
#
# To compare two versions of the script, run it on each, alternately:
#   git show HEAD~1:src/store/flush.lua > /tmp/old.lua; scripts/script-cost.sh /tmp/old.lua
set -euo pipefail
cd "$(dirname "$0")/.."
script=${1:-src/store/flush.lua}; series=${2:-110000}; slices=${3:-60}; chunk=${4:-100}; windows=${5:-10}; mode=${6:-2}
dir=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null || true; rm -rf "$dir"' EXIT
sock="$dir/r.sock"
redis-server --port 0 --unixsocket "$sock" --save '' --appendonly no --dir "$dir" --daemonize no >/dev/null &
until redis-cli -s "$sock" ping >/dev/null 2>&1; do sleep 0.05; done
redis_cpu() { redis-cli -s "$sock" info cpu | awk -F: '/^used_cpu_(user|sys):/ {s += $2} END {print s}'; }
redis-cli -s "$sock" eval "for i = 0, $series - 1 do for t = 1, $slices do
  redis.call('HINCRBY', 'count:1:hc.series' .. i, 1763830000 + t, 1) end end" 0 >/dev/null
sha=$(redis-cli -s "$sock" script load "$(cat "$script")")
python3 - "$sha" "$windows" "$series" "$chunk" "$slices" "$mode" > "$dir/commands" <<'PY'
import sys
sha, windows, series, chunk, slices, mode = sys.argv[1], *map(int, sys.argv[2:])
out = sys.stdout.buffer
for w in range(windows):
    for c in range(0, series, chunk):
        end = min(c + chunk, series)
        # flush.lua's ARGV: token lifetime, prefix, sample count, hour, asctime; one precision
        # (1 s, this window's slice, mode); the counters; no stats, gauges, sets or logs.
        args = ['EVALSHA', sha, 1, 'flush:bench:%d:%d' % (w, c), 600, '', 120,
                '2025-11-22T17:00:00', 'Sat Nov 22 17:00:00 2025', 1, 1, 1763830000 + slices + 1 + w,
                mode, end - c]
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
cpu0=$(redis_cpu)
redis-cli -s "$sock" --pipe < "$dir/commands" | tail -1
cpu1=$(redis_cpu)
hincrby_usec=$(redis-cli -s "$sock" info commandstats | awk -F'[=,]' '/^cmdstat_hincrby:/ {print $4} END {print 0}' | head -1)
python3 -c "
w = $windows
print('Redis CPU per window of $series series: %.1f ms, of which HINCRBY %.1f ms' % (($cpu1 - $cpu0) * 1000 / w, $hincrby_usec / 1000 / w))"
