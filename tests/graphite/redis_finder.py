"""graphite-web 1.1.8 storage finder + tag DB over "Redis in Action" ch.5's counter layout.

Test-only oracle for statsd-redis. graphite-web does the globbing, tag matching, function maths,
consolidation and JSON; this module only lists names and reads slices.

Layout read (all keys behind an optional prefix):
  known:        ZSET of "<p>:<series>" (scores 0) -> HASH count:<p>:<series>  slice -> integer count
  known:gauge:  ZSET of "<p>:<series>"            -> HASH gauge:<p>:<series>  slice -> float text

Configuration (environment, read when graphite-web imports this module):
  ORACLE_REDIS_URL     redis://127.0.0.1:6380/0 or unix:///tmp/x.sock (required; no default, so the
                       oracle never reads a Redis nobody named). The finder only reads (ZRANGE, HMGET).
  ORACLE_KEY_PREFIX    key prefix, default ''
  ORACLE_PRECISIONS    comma list, default 1,5,60,300,3600,18000,86400 (the whisper "archives")
  ORACLE_SAMPLE_COUNT  points kept per precision, default 120 (archive p has retention p*count)
  ORACLE_GAUGE_PREFIX  name prefix under which gauges are shown, default '' (same namespace as
                       counters; on a clash the counter wins). E.g. 'stats.gauges.'.
  ORACLE_TAG_DOTTED    1 (default): dotted series go into the tag DB too, as carbon
                       (ENABLE_TAGS=True) does, so seriesByTag('name=web.home.hits') finds them.

settings:  STORAGE_FINDERS = ('redis_finder.RedisFinder',)
           TAGDB = 'redis_finder.RedisKnownTagDB'
"""
import fnmatch
import os
import threading
import time

import redis

from graphite.finders import expand_braces
from graphite.finders.utils import BaseFinder
from graphite.intervals import Interval, IntervalSet
from graphite.logger import log
from graphite.node import BranchNode, LeafNode
from graphite.readers.utils import BaseReader
from graphite.tags.localdatabase import LocalDatabaseTagDB
from graphite.tags.utils import TaggedSeries

REDIS_URL = os.environ.get('ORACLE_REDIS_URL')
PREFIX = os.environ.get('ORACLE_KEY_PREFIX', '')
PRECISIONS = sorted(int(p) for p in os.environ.get(
    'ORACLE_PRECISIONS', '1,5,60,300,3600,18000,86400').split(',') if p.strip())
SAMPLE_COUNT = int(os.environ.get('ORACLE_SAMPLE_COUNT', '120'))
GAUGE_PREFIX = os.environ.get('ORACLE_GAUGE_PREFIX', '')
TAG_DOTTED = os.environ.get('ORACLE_TAG_DOTTED', '1') == '1'
MAX_RETENTION = PRECISIONS[-1] * SAMPLE_COUNT

_client = None
_client_lock = threading.Lock()


def client():
    global _client
    with _client_lock:
        if _client is None:
            if not REDIS_URL:
                raise RuntimeError('ORACLE_REDIS_URL is not set')
            _client = redis.Redis.from_url(REDIS_URL, decode_responses=True)
        return _client


def load_series():
    """{graphite name: (kind, redis series)} for every series in known: or known:gauge: at any
    precision. kind is 'count' or 'gauge'."""
    pipe = client().pipeline(transaction=False)
    pipe.zrange(PREFIX + 'known:', 0, -1)
    pipe.zrange(PREFIX + 'known:gauge:', 0, -1)
    counters, gauges = pipe.execute()
    out = {}
    for kind, members, name_prefix in (('gauge', gauges, GAUGE_PREFIX), ('count', counters, '')):
        for member in members:
            p, sep, series = member.partition(':')
            if not sep or not p.isdigit() or not series:
                continue
            # counters are written last, so a counter wins a clash with an unprefixed gauge
            out[name_prefix + series] = (kind, series)
    return out


def canonical(name):
    """graphite's canonical form of a tagged name (tags sorted as ';k=v' strings), or None when
    graphite rejects it (bare tag, empty value, value starting with '~', ...)."""
    try:
        return TaggedSeries.parse(name).path
    except Exception:
        return None


class RedisReader(BaseReader):
    """Reads one series as one whisper file with archives p:SAMPLE_COUNT for every p would."""
    __slots__ = ('kind', 'series')

    def __init__(self, kind, series):
        self.kind = kind
        self.series = series

    def get_intervals(self):
        now = int(time.time())
        return IntervalSet([Interval(now - MAX_RETENTION, now)])

    def fetch(self, startTime, endTime, now=None, requestContext=None):
        # whisper.file_fetch (python3-whisper 1.1.4, whisper.py:891-941)
        if now is None:
            now = int(time.time())
        from_t, until_t = int(startTime), int(endTime)
        if from_t > until_t:
            raise ValueError("Invalid time interval: from time '%s' is after until time '%s'"
                             % (from_t, until_t))
        oldest = now - MAX_RETENTION
        if from_t > now:       # range in the future
            return None
        if until_t < oldest:   # range beyond retention
            return None
        from_t = max(from_t, oldest)
        until_t = min(until_t, now)
        diff = now - from_t
        step = PRECISIONS[-1]
        for p in PRECISIONS:   # finest archive whose retention covers now - from
            if p * SAMPLE_COUNT >= diff:
                step = p
                break
        # whisper.__archive_fetch (whisper.py:944-958)
        from_i = from_t - (from_t % step) + step
        until_i = until_t - (until_t % step) + step
        if from_i == until_i:
            until_i += step
        slices = list(range(from_i, until_i, step))
        raw = client().hmget('%s%s:%d:%s' % (PREFIX, self.kind, step, self.series), slices) \
            if slices else []
        values = [None if v is None else float(v) for v in raw]
        return (from_i, until_i, step), values

    def __repr__(self):
        return '<RedisReader %s:%s>' % (self.kind, self.series)


class _Tree(object):
    __slots__ = ('children', 'leaf')

    def __init__(self):
        self.children = {}
        self.leaf = None  # (kind, series) when a series ends here


def build_tree(series):
    root = _Tree()
    for name, target in series.items():
        if ';' in name:
            continue  # tagged series are reached through the tag DB, not the dotted tree
        node = root
        parts = name.split('.')
        if any(p == '' for p in parts):
            continue  # 'a..b' or '.a' cannot be a whisper path either
        for part in parts:
            node = node.children.setdefault(part, _Tree())
        node.leaf = target
    return root


def _has_wildcard(p):
    return '[' in p or '*' in p or '?' in p


def _descendants(node, rel=()):
    """os.walk analogue: this node and every branch below it, as relative parts."""
    yield rel, node
    for name in sorted(node.children):
        child = node.children[name]
        if child.children:
            for item in _descendants(child, rel + (name,)):
                yield item


def _find(node, patterns, prefix):
    """StandardFinder._find_paths over the in-memory tree (finders/standard.py:107-177).
    Yields (path parts, node, is_leaf)."""
    raw, rest = patterns[0], patterns[1:]
    for pattern in expand_braces(raw):
        wild = _has_wildcard(pattern)
        branch_names = [n for n, c in node.children.items() if c.children and not n.startswith('.')]
        leaf_names = [n for n, c in node.children.items() if c.leaf is not None and not n.startswith('.')]
        pats = rest
        if pattern == '**':
            subs = [(rel, sub) for rel, sub in _descendants(node)]
            if not pats:
                pats = ['*']
            for rel, sub in subs:
                for item in _find(sub, pats, prefix + rel):
                    yield item
            continue
        if wild:
            m_branches = fnmatch.filter(branch_names, pattern)
            m_leaves = fnmatch.filter(leaf_names, pattern)
        else:
            m_branches = [pattern] if pattern in branch_names else []
            m_leaves = [pattern] if pattern in leaf_names else []
        if pats:
            for name in m_branches:
                for item in _find(node.children[name], pats, prefix + (name,)):
                    yield item
        else:
            for name in m_leaves:
                yield prefix + (name,), node.children[name], True
            for name in m_branches:
                yield prefix + (name,), node.children[name], False


class RedisFinder(BaseFinder):
    local = True
    tags = False  # graphite-web resolves seriesByTag through TAGDB, then asks for exact paths

    def find_nodes(self, query):
        series = load_series()
        pattern = query.pattern
        if ';' in pattern and not pattern.startswith('_tagged.'):
            # An exact tagged path (what the tag DB returns, or a target typed as is), looked up
            # as carbon stores it: under graphite's canonical name (carbon/cache.py:42 rewrites
            # every incoming name with TaggedSeries.parse(..).path), or as is when graphite cannot
            # parse it (bare tags: carbon logs the error and stores the raw name).
            for name, target in series.items():
                if ';' in name and (canonical(name) or name) == pattern:
                    yield LeafNode(pattern, RedisReader(*target))
                    return
            return
        clean = pattern.replace('\\', '')
        seen = set()
        for parts, node, is_leaf in _find(build_tree(series), clean.split('.'), ()):
            path = '.'.join(parts)
            if (path, is_leaf) in seen:
                continue
            seen.add((path, is_leaf))
            if is_leaf:
                yield LeafNode(path, RedisReader(*node.leaf))
            elif not query.leaves_only:
                yield BranchNode(path)


class RedisKnownTagDB(LocalDatabaseTagDB):
    """graphite's own LocalDatabaseTagDB (SQL tables in the oracle's temp sqlite DB), kept in step
    with known: / known:gauge: before every read, so that graphite-web itself does all tag
    matching (seriesByTag, /tags/findSeries, /tags/autoComplete/*)."""

    _lock = threading.Lock()
    _synced = set()      # names currently entered in the tag DB
    rejected = {}        # name -> reason graphite refused it (bare tags and the like)

    def _sync(self):
        with self._lock:
            names = set(load_series())
            wanted = set(n for n in names if ';' in n or TAG_DOTTED)
            for name in sorted(wanted - self._synced):
                try:
                    self.tag_series(name)
                except Exception as err:
                    self.rejected[name] = str(err)
                    if self.log:
                        self.log.info('redis_finder: tag DB refuses %r: %s' % (name, err))
                self._synced.add(name)
            for name in sorted(self._synced - wanted):
                if name not in self.rejected:
                    try:
                        self.del_series(name)
                    except Exception:
                        pass
                self.rejected.pop(name, None)
                self._synced.discard(name)

    def find_series(self, tags, requestContext=None):
        self._sync()
        return super(RedisKnownTagDB, self).find_series(tags, requestContext=requestContext)

    def get_series(self, path, requestContext=None):
        self._sync()
        return super(RedisKnownTagDB, self).get_series(path, requestContext=requestContext)

    def list_tags(self, tagFilter=None, limit=None, requestContext=None):
        self._sync()
        return super(RedisKnownTagDB, self).list_tags(tagFilter=tagFilter, limit=limit,
                                                      requestContext=requestContext)

    def get_tag(self, tag, valueFilter=None, limit=None, requestContext=None):
        self._sync()
        return super(RedisKnownTagDB, self).get_tag(tag, valueFilter=valueFilter, limit=limit,
                                                    requestContext=requestContext)

    def list_values(self, tag, valueFilter=None, limit=None, requestContext=None):
        self._sync()
        return super(RedisKnownTagDB, self).list_values(tag, valueFilter=valueFilter, limit=limit,
                                                        requestContext=requestContext)
