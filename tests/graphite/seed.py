#!/usr/bin/python3
"""Writes the oracle's fixed dataset (book ch.5 layout) into a PRIVATE Redis.

  ./seed.py --url unix:///path/to/redis.sock [--now 1760001237] [--prefix P]

Every value depends only on (series, precision, k) where k counts slices back from the slice that
holds NOW (k=0), so an answer tells which precision was read:
  counter value = base * (precision index + 1) * 10 + (k % 7)       (integer text, as HINCRBY)
  gauge value   = text given per gauge below                           (float text)
It refuses port 6379 and a non-empty database unless --replace (which deletes only the keys
this dataset writes; it never FLUSHALLs).
"""
import argparse
import json
import sys

import redis

NOW = 1760001237  # 2025-10-09 09:13:57 UTC; not aligned to 5, 60, 300 ... on purpose
PRECISIONS = [1, 5, 60, 300, 3600, 18000, 86400]
SAMPLES = 120

# name -> (base, precisions it is known at, slice filter)
COUNTERS = {
    'web.home.hits': (1, PRECISIONS, None),
    'web.cart.hits': (2, PRECISIONS, lambda k: k % 5 != 3),        # every 5th slice missing
    'web.home.miss': (3, PRECISIONS, None),
    'db.queries': (4, PRECISIONS, None),                            # leaf and branch at once
    'db.queries.slow': (5, PRECISIONS, None),
    'batch.nightly.runs': (6, [300, 3600, 18000, 86400], None),     # cleaned at 1, 5, 60
    'api.calls;env=prod;region=eu': (7, PRECISIONS, None),
    'api.calls;env=dev;region=us': (8, PRECISIONS, None),
    'api.calls;canary;env=prod': (9, PRECISIONS, None),            # DogStatsD bare tag
    'jobs.runs;host=a;host-group=b': (10, PRECISIONS, None),       # agent tag order != graphite's
}
GAUGES = {
    'web.home.latency_ms': lambda i, k: '%s' % (10 + i + k * 0.25),   # 10.0, 10.25, ...
    'db.pool.size': lambda i, k: '7',                                  # integral text
    'queue.depth;env=prod': lambda i, k: '%s' % (0.1 * (k % 4)),       # 0.0, 0.1, 0.2, 0.30000000000000004
}
FUTURE = 'web.home.hits'  # also gets a slice after NOW at every precision (never returned)


def counter_value(base, i, k):
    return base * (i + 1) * 10 + (k % 7)


def build(now):
    """[(key, {field: value})], counters known members, gauge known members."""
    hashes, known, known_gauge = [], [], []
    for name, (base, precs, keep) in COUNTERS.items():
        for p in precs:
            i = PRECISIONS.index(p)
            cur = now - now % p
            ks = range(-1 if name == FUTURE else 0, SAMPLES)
            fields = {str(cur - k * p): str(counter_value(base, i, k))
                      for k in ks if keep is None or keep(k)}
            hashes.append(('count:%d:%s' % (p, name), fields))
            known.append('%d:%s' % (p, name))
    for name, fn in GAUGES.items():
        for i, p in enumerate(PRECISIONS):
            cur = now - now % p
            fields = {str(cur - k * p): fn(i, k) for k in range(SAMPLES)}
            hashes.append(('gauge:%d:%s' % (p, name), fields))
            known_gauge.append('%d:%s' % (p, name))
    return hashes, known, known_gauge


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument('--url', required=True)
    ap.add_argument('--now', type=int, default=NOW)
    ap.add_argument('--prefix', default='')
    ap.add_argument('--replace', action='store_true')
    ap.add_argument('--manifest', help='write the dataset as JSON here')
    a = ap.parse_args()
    r = redis.Redis.from_url(a.url, decode_responses=True)
    info = r.connection_pool.connection_kwargs
    if info.get('port') == 6379 and 'path' not in info:
        sys.exit('refusing to write to port 6379: start a private redis (the test starts one)')
    hashes, known, known_gauge = build(a.now)
    keys = [a.prefix + k for k, _ in hashes] + [a.prefix + 'known:', a.prefix + 'known:gauge:']
    if r.dbsize() and not a.replace:
        sys.exit('database not empty; use --replace to delete only the keys of this dataset')
    pipe = r.pipeline(transaction=False)
    pipe.delete(*keys)
    for key, fields in hashes:
        pipe.hset(a.prefix + key, mapping=fields)
    pipe.zadd(a.prefix + 'known:', {m: 0 for m in known})
    pipe.zadd(a.prefix + 'known:gauge:', {m: 0 for m in known_gauge})
    pipe.execute()
    print('seeded %d hashes, %d known:, %d known:gauge: members, now=%d, prefix=%r'
          % (len(hashes), len(known), len(known_gauge), a.now, a.prefix))
    if a.manifest:
        with open(a.manifest, 'w') as f:
            json.dump({'now': a.now, 'prefix': a.prefix, 'hashes': dict(hashes),
                       'known:': known, 'known:gauge:': known_gauge}, f, indent=1, sort_keys=True)


if __name__ == '__main__':
    main()
