#!/usr/bin/python3
"""Copies the agent's counter series from Redis into whisper files (graphite-web's standard finder).

  ./whisper_from_redis.py --url unix:///path/redis.sock --dir DIR [--precision 60]
                          [--points 1440] [--match 'web.*']

For every member "<p>:<name>" of known: at precision p (names with ';' are skipped: tagged series),
reads the hash count:<p>:<name> (slice start -> integer count) and writes DIR/<name, . as />.wsp
with one archive p:points (aggregation 'sum', xFilesFactor 0) holding exactly those slices (only
the newest `points` slices fit; older ones are counted as dropped). A file is created, empty,
even when the hash is. Existing files of the same name are replaced. Points are written with
whisper's "now" set to the series' newest slice, so old data is kept (graphite-web reads it
relative to the request's now: pass &now=... to render data older than the archive).
"""
import argparse
import fnmatch
import os

import redis
import whisper

BATCH = 1000  # series per Redis pipeline
# HGETALL as one 'field value field value ...' string: redis-py's pure-Python reply parser (no
# hiredis for Debian's python) would take more time per field than whisper takes per point.
HGETALL_FLAT = "return table.concat(redis.call('HGETALL', KEYS[1]), ' ')"

ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
ap.add_argument('--url', required=True, help='redis URL, e.g. unix:///tmp/redis.sock')
ap.add_argument('--dir', required=True, help='whisper root to create')
ap.add_argument('--precision', type=int, default=60)
ap.add_argument('--points', type=int, default=1440, help='archive length')
ap.add_argument('--match', default='*', help='fnmatch glob on the series name (default all)')
args = ap.parse_args()
p, points = args.precision, args.points

r = redis.Redis.from_url(args.url, decode_responses=True)
hgetall_flat = r.register_script(HGETALL_FLAT)
prefix = '%d:' % p
names = sorted(m[len(prefix):] for m in r.zrange('known:', 0, -1)
               if m.startswith(prefix) and ';' not in m[len(prefix):]
               and fnmatch.fnmatchcase(m[len(prefix):], args.match))
names = [n for n in names if all(n.split('.'))]  # no empty path components

files = written = dropped = 0
for i in range(0, len(names), BATCH):
    batch = names[i:i + BATCH]
    pipe = r.pipeline(transaction=False)
    for name in batch:
        hgetall_flat(keys=['count:%d:%s' % (p, name)], client=pipe)
    for name, flat in zip(batch, pipe.execute()):
        path = os.path.join(args.dir, *name.split('.')) + '.wsp'
        os.makedirs(os.path.dirname(path), exist_ok=True)
        if os.path.exists(path):
            os.remove(path)
        whisper.create(path, [(p, points)], xFilesFactor=0, aggregationMethod='sum')
        flat = flat.split()
        times = [int(t) for t in flat[0::2]]
        if times:
            newest = max(times)
            kept = [(t, v) for t, v in zip(times, flat[1::2]) if t > newest - p * points]
            whisper.update_many(path, kept, now=newest)  # it sorts, and makes values floats
            written += len(kept)
            dropped += len(times) - len(kept)
        files += 1

print('%d files, %d points written, %d dropped (older than %d slices), precision %d, dir %s'
      % (files, written, dropped, points, p, args.dir))
