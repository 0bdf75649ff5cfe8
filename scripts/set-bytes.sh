#!/usr/bin/env bash
# What a set's history costs Redis a point at a long schema (issue 52; docs/layout.md "History:
# fixed slots"), against a HyperLogLog key a slice (the layout before it). A private Redis is
# filled with `series` sets as they stand at the cleaner's steady state just before a walk:
# each precision kept in blocks holds its archive in blocks (each made by the cleaner's own
# src/store/set_move.lua, whole at once, with its EXPIRE), and its open slices (the last
# SET_OPEN_SECS, and what five minutes between walks and a pass add) as HyperLogLogs of `members`
# members each (PFADD and EXPIREAT, as the flush writes them); a precision of at most 120 slices
# keeps them all as HyperLogLogs. Then used_memory's growth a point kept, beside the same
# sets' slices each a HyperLogLog (measured on 20 000 of them) and whisper's 12 bytes for
# Etsy's `stats.sets.<name>.count`.
#
#   [SCHEMA=10s:6h,1min:6d,10min:1800d] scripts/set-bytes.sh [series=20] [members=20]
#
# Needs: apt-get install -y python3-redis
set -euo pipefail
cd "$(dirname "$0")/.."
series=${1:-20}; members=${2:-20}
schema=${SCHEMA:-10s:6h,1min:6d,10min:1800d}
. scripts/common.sh
need_python_redis
start_redis "$dir/redis.sock"
/usr/bin/python3 - "$dir/redis.sock" "$series" "$members" "$schema" <<'EOF'
import math, re, sys, time
import redis
sock, series, members, schema = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
r = redis.Redis(unix_socket_path=sock)
UNITS = {'s': 1, 'min': 60, 'm': 60, 'h': 3600, 'd': 86400, 'w': 604800, 'y': 31536000}
def secs(text):
    n, unit = re.fullmatch(r'(\d+)([a-z]*)', text).groups()
    return int(n) * UNITS[unit or 's']
archives = []
for part in schema.split(','):
    p, keep = part.split(':')
    p = secs(p)
    count = secs(keep) // p if re.search(r'[a-z]', keep) else int(keep)
    archives.append((p, count))
# src/store/history.rs: the cuts, and the one an archive takes.
CUTS = [(248, 2048), (2008, 16384)]
def cut(count):
    if count <= 120:
        return None
    return min(CUTS, key=lambda c: (math.ceil(count / c[0]) + 1) * (c[1] + 100))[0]
OPEN, WALK, INTERVAL = 120, 300, 60
move = r.register_script(open('src/store/set_move.lua').read())
def used():
    return int(r.info('memory')['used_memory'])
now = int(time.time())
base = used()
points = 0
for s in range(series):
    pipe = r.pipeline(transaction=False)
    for p, count in archives:
        points += count
        oldest = (now - count * p) // p * p + p
        slots = cut(count)
        # The slices still HyperLogLogs: all of a short archive; of a long one, those of the
        # last SET_OPEN_SECS and those since the last walk.
        open_from = oldest if slots is None else (now - max(OPEN, p) - WALK - INTERVAL) // p * p
        for slice in range(max(open_from, oldest), now // p * p + 1, p):
            key = f'set:{p}:bench.{s}.users:{slice}'
            pipe.pfadd(key, *[f'user{s}.{slice}.{m}' for m in range(members)])
            pipe.expireat(key, slice + count * p)
        if slots is None:
            continue
        first, last = oldest // p // slots, (open_from - p) // p // slots
        for block in range(first, last + 1):
            start = block * slots * p
            ttl = max(start + slots * p + count * p - now, 1)
            move(keys=[f'history:set:{p}:bench.{s}.users:{slots}:{block}'],
                 args=[0, slots, ttl, members], client=pipe)
    pipe.execute()
grown = used() - base
# The layout before: a HyperLogLog key a slice, for every slice kept.
r.flushall()
base = used()
sample = 20000
pipe = r.pipeline(transaction=False)
for i in range(sample):
    slice = now // 600 * 600 - i * 600
    key = f'set:600:bench.{i % 100}.users:{slice}'
    pipe.pfadd(key, *[f'user{i}.{m}' for m in range(members)])
    pipe.expireat(key, slice + 86400 * 1800)
pipe.execute()
per_key = (used() - base) / sample
print(f'schema {schema}, {series} sets of {members} members a slice, {points // series} slices a set')
print(f'  blocks + open HyperLogLogs: {grown / points:.2f} bytes a point ({grown / series / 1e6:.2f} MB a set)')
print(f'  a HyperLogLog a slice:      {per_key:.0f} bytes a point')
print(f'  whisper (stats.sets.<name>.count): 12.00 bytes a point')
EOF
