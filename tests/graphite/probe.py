#!/usr/bin/python3
"""Sends Grafana-shaped requests to a graphite-web (or to the agent's Graphite API) and saves
every request + answer as one JSON line.

  ./probe.py --base http://127.0.0.1:PORT [--out answers.jsonl] [--now 1760001237] [--only ID,...]
             [--quiet]

Each line: {"id", "what", "method", "path", "params": [[k, v], ...], "status", "content_type",
"body": <text>, "json": <parsed body or null>}. POSTs are form-encoded (Grafana's shape); GETs
put params in the query string. The same file replayed against the agent (same --now, same
Redis) must give the same status and parsed JSON (tests/graphite.rs compares them, and lists
what differs on purpose).
"""
import argparse
import json
import sys
import urllib.error
import urllib.parse
import urllib.request

NOW = '1760001237'
GRAFANA_ACCEPT = 'application/json, text/plain, */*'


def render(pid, what, target, frm='-1h', until='now', mdp=None, extra=(), method='POST', now=True):
    params = []
    for t in ([target] if isinstance(target, str) else target):
        params.append(('target', t))
    if frm is not None:
        params.append(('from', frm))
    if until is not None:
        params.append(('until', until))
    params.append(('format', 'json'))
    if mdp is not None:
        params.append(('maxDataPoints', str(mdp)))
    if now:
        params.append(('now', NOW))
    params.extend(extra)
    return dict(id=pid, what=what, method=method, path='/render', params=params)


def get(pid, what, path, *params, method='GET'):
    return dict(id=pid, what=what, method=method, path=path, params=list(params))


def A(t, ref='A'):
    """Grafana 12 wraps every panel target like this."""
    return 'aliasSub(%s, "(^.*$)", "\\1 %s")' % (t, ref)


def probes():
    P = []
    r = P.append
    # --- Grafana's own requests -------------------------------------------------------------
    r(render('grafana.aliasSub', 'panel query as Grafana 12 sends it', A('web.*.hits'), mdp=1000))
    r(render('grafana.health', 'health check', 'constantLine(100)', mdp=100))
    r(render('grafana.health.get', 'health check via GET', 'constantLine(100)', mdp=100, method='GET'))
    r(render('grafana.backend_epoch', 'backend mode sends epoch seconds',
             A('web.home.hits', 'B'), frm='1760000937', until='1760001237', mdp=100))
    r(render('grafana.two_targets', 'two targets, output in request order then by name',
             ['web.home.*', 'db.queries'], frm='-1min', mdp=1000))
    # --- one probe per function -------------------------------------------------------------
    f = lambda pid, t, frm='-5min', **kw: r(render('fn.' + pid, t, t, frm=frm, **kw))
    f('aliasSub', 'aliasSub(web.*.hits,"^web\\.(\\w+)\\.hits$","\\1")')
    f('alias', "alias(web.home.hits,'Home')")
    f('aliasByNode', 'aliasByNode(web.*.hits,1)')
    f('aliasByNode.multi', 'aliasByNode(web.*.hits,0,-1)')
    f('aliasByNode.tagged', "aliasByNode(seriesByTag('name=api.calls'),1)")
    f('aliasByTags', "aliasByTags(seriesByTag('name=api.calls'),'region','env')")
    f('aliasByTags.name', "aliasByTags(seriesByTag('name=api.calls'),'name',1)")
    f('constantLine', 'constantLine(100)')
    f('constantLine.float', 'constantLine(1.5)')
    f('seriesByTag', "seriesByTag('name=api.calls','env=prod')")
    f('seriesByTag.dq_space', 'seriesByTag("name=api.calls", "env=prod")')
    f('seriesByTag.regex', "seriesByTag('name=~api','region=~^e')")
    f('seriesByTag.neq', "seriesByTag('name=api.calls','env!=prod')")
    f('seriesByTag.dotted', "seriesByTag('name=web.home.hits')")
    f('seriesByTag.dotted_regex', "seriesByTag('name=~web\\..*\\.hits')")
    f('seriesByTag.gauge', "seriesByTag('name=queue.depth')")
    f('seriesByTag.reordered', "seriesByTag('name=jobs.runs')")
    f('seriesByTag.bare', "seriesByTag('name=api.calls','canary=')")
    f('seriesByTag.none', "seriesByTag('name=nothing.here')")
    f('seriesByTag.all_match_empty', "seriesByTag('env!=prod')")
    f('sumSeries', 'sumSeries(web.*.hits)')
    f('sumSeries.two_args', 'sumSeries(web.home.hits,web.cart.hits)')
    f('sumSeries.tagged', "sumSeries(seriesByTag('name=api.calls'))")
    f('sumSeries.piped', "seriesByTag('name=api.calls')|sumSeries()")
    f('sumSeries.none', 'sumSeries(nothing.*)')
    f('averageSeries', 'averageSeries(web.*.hits)')
    f('maxSeries', 'maxSeries(web.*.hits)')
    f('minSeries', 'minSeries(web.*.hits)')
    f('groupByNode', "groupByNode(web.*.*,2,'sum')")
    f('groupByNode.default', 'groupByNode(web.*.hits,1)')
    f('groupByTags', "groupByTags(seriesByTag('name=api.calls'),'sum','env')")
    f('groupByTags.name', "groupByTags(seriesByTag('name=api.calls'),'average','name')")
    f('scale', 'scale(web.home.hits,0.5)')
    f('scale.tenth', 'scale(web.home.hits,0.1)')
    f('scale.huge', 'scale(web.home.hits,1e20)')
    f('scale.inf', 'scale(web.home.hits,1e308)', frm='-10s')
    f('scaleToSeconds', 'scaleToSeconds(web.home.hits,1)')
    f('scaleToSeconds.third', 'scaleToSeconds(web.home.hits,0.3333333)')
    f('perSecond', 'perSecond(web.cart.hits)')
    f('summarize', "summarize(web.home.hits,'1min','sum')")
    f('summarize.avg_align', "summarize(web.home.hits,'1min','avg',true)")
    f('summarize.default', "summarize(web.cart.hits,'1min')")
    f('summarize.1h', "summarize(web.home.hits,'1min','sum')", frm='-1h')
    f('consolidateBy', "consolidateBy(web.home.hits,'sum')", mdp=7)
    f('consolidateBy.max', "consolidateBy(web.cart.hits,'max')", mdp=7)
    f('movingAverage', 'movingAverage(web.cart.hits,3)')
    f('movingAverage.time', "movingAverage(web.cart.hits,'1min')")
    f('transformNull', 'transformNull(web.cart.hits,0)')
    f('transformNull.default', 'transformNull(web.cart.hits)')
    f('keepLastValue', 'keepLastValue(web.cart.hits)')
    f('keepLastValue.limit', 'keepLastValue(web.cart.hits,1)')
    f('nonNegativeDerivative', 'nonNegativeDerivative(web.cart.hits)')
    f('nonNegativeDerivative.max', 'nonNegativeDerivative(web.home.hits,30)')
    f('nonNegativeDerivative.min', 'nonNegativeDerivative(web.home.hits,None,20)')
    f('perSecond.max', 'perSecond(web.home.hits,30)')
    f('integral', 'integral(web.cart.hits)')
    f('asPercent', 'asPercent(web.*.hits)')
    f('asPercent.total', 'asPercent(web.home.hits,web.home.miss)')
    f('asPercent.num', 'asPercent(web.home.hits,200)')
    f('highestCurrent', 'highestCurrent(web.*.*,1)')
    f('highestCurrent.default', 'highestCurrent(web.*.*)')
    f('sortByName', 'sortByName(*.*.*)')
    f('sortByName.natural', 'sortByName(*.*.*,true,true)')
    f('limit', 'limit(web.*.*,2)')
    f('nested', "alias(sumSeries(scale(web.*.hits,2)),'total')")
    f('sumSeries.tagged_dq_space', 'sumSeries(seriesByTag("name=api.calls", "env=prod"))')
    f('aliasByNode.out_of_range', 'aliasByNode(web.*.hits,5)')
    f('groupByNode.count', "groupByNode(web.*.*,1,'count')")
    f('groupByTags.missing_tag', "groupByTags(seriesByTag('name=api.calls'),'sum','dc')")
    f('scale.g_format', 'scale(web.home.hits,0.1234567)')
    f('movingAverage.precision_switch', "movingAverage(web.home.hits,'10min')")
    f('constantLine.one_second', 'constantLine(100)', frm='-1s')
    f('constantLine.two_seconds', 'constantLine(100)', frm='-2s')
    f('diffSeries', 'diffSeries(web.home.hits,web.cart.hits)')
    f('countSeries', 'countSeries(web.*.*)')
    f('divideSeries', 'divideSeries(web.*.hits,web.home.miss)')
    f('divideSeries.missing', 'divideSeries(web.*.hits,nothing.here)')
    f('derivative', 'derivative(web.cart.hits)')
    f('absolute', 'absolute(scale(web.home.hits,-1))')
    f('offset', 'offset(web.home.hits,-10.5)')
    f('removeBelowValue', 'removeBelowValue(web.home.hits,14)')
    f('removeAboveValue', 'removeAboveValue(web.cart.hits,44)')
    f('exclude', "exclude(web.*.*,'miss')")
    f('grep', "grep(web.*.*,'^web\\.home')")
    f('highestMax', 'highestMax(web.*.*,2)')
    f('lowestCurrent', 'lowestCurrent(web.*.*,2)')
    f('timeShift', "timeShift(web.home.hits,'1h')")
    f('timeShift.minutes', "timeShift(web.cart.hits,'-10min')", frm='-1h')
    f('timeShift.noreset', "timeShift(web.home.hits,'5min',false)")
    # --- maxDataPoints consolidation ----------------------------------------------------------
    m = lambda pid, t, frm, mdp, **kw: r(render('mdp.' + pid, 'maxDataPoints', t, frm=frm, mdp=mdp, **kw))
    m('1h_7', 'web.home.hits', '-1h', 7)
    m('5min_7', 'web.home.hits', '-5min', 7)
    m('1h_40', 'web.home.hits', '-1h', 40)
    m('5min_60', 'web.home.hits', '-5min', 60)
    m('5min_59', 'web.home.hits', '-5min', 59)
    m('5min_1', 'web.home.hits', '-5min', 1)
    m('5min_0', 'web.home.hits', '-5min', 0)
    m('gaps_7', 'web.cart.hits', '-5min', 7)
    m('mixed_steps', ['web.home.hits', 'constantLine(1)'], '-5min', 10)
    m('none', 'web.home.hits', '-1min', None)
    m('not_a_number', 'web.home.hits', '-1min', None, extra=[('maxDataPoints', 'abc')])
    m('noNullPoints', 'web.cart.hits', '-1min', None, extra=[('noNullPoints', 'true')])
    # --- ranges: precision switch -------------------------------------------------------------
    for frm in ['-1min', '-2min', '-121s', '-5min', '-10min', '-1h', '-2h', '-6h', '-10h', '-2d',
                '-5d', '-10d', '-30d', '-120d', '-200d']:
        r(render('range.' + frm, 'range', 'web.home.hits', frm=frm))
    r(render('range.-2h_until-1h', 'now-from picks the precision, not until-from',
             'web.home.hits', frm='-2h', until='-1h'))
    r(render('range.future', 'from after now', 'web.home.hits', frm='+1h', until='+2h'))
    r(render('range.fine_gone', 'series known only at 300 s and coarser, at -5min',
             'batch.nightly.runs', frm='-5min'))
    r(render('range.fine_gone_1h', 'same at -1h', 'batch.nightly.runs', frm='-1h'))
    r(render('range.swapped', 'from after until: swapped', 'web.home.hits', frm='now', until='-1min'))
    r(render('range.one_second', 'from=-1s', 'web.home.hits', frm='-1s'))
    # --- time parsing -------------------------------------------------------------------------
    t = lambda pid, frm, until='now': r(render('time.' + pid, 'time parsing', 'web.home.hits', frm=frm, until=until))
    t('HH:MM_YYYYMMDD', '09:00_20251009', '09:05_20251009')
    t('YYYYMMDD', '20251009')
    t('epoch', '1760000937', '1760001237')
    t('now-1h', 'now-1h')
    t('-1h30min', '-1h30min')
    t('-90s', '-90s')
    t('-1hours', '-1hours')
    t('-1w', '-1w')
    t('-1mon', '-1mon')
    t('-1y', '-1y')
    t('midnight', 'midnight')
    t('noon_yesterday', 'noon yesterday', 'midnight')
    t('MM/DD/YY', '10/09/25')
    t('oct9', '09:00 oct 9', '09:10 oct 9')
    t('-1H_upper', '-1H')
    t('default_from', None)
    r(render('time.until_default', 'no until', 'web.home.hits', frm='-1min', until=None))
    # --- gauges, tags, odd names --------------------------------------------------------------
    r(render('gauge.latency', 'gauge, float text', 'web.home.latency_ms', frm='-1min'))
    r(render('gauge.pool', 'gauge, integral text', 'db.pool.size', frm='-1min'))
    r(render('gauge.tagged', 'tagged gauge', 'queue.depth;env=prod', frm='-10s'))
    r(render('leafbranch.leaf', 'a path that is leaf and branch', 'db.queries', frm='-10s'))
    r(render('leafbranch.glob', 'glob over it', 'db.queries*', frm='-10s'))
    r(render('leafbranch.children', 'children', 'db.queries.*', frm='-10s'))
    r(render('bare.direct', 'bare-tag series typed as a path', 'api.calls;canary;env=prod', frm='-10s'))
    r(render('bare.sum', 'aggregated with others', 'sumSeries(api.calls;canary;env=prod,api.calls;env=prod;region=eu)', frm='-10s'))
    r(render('tagged.direct', 'tagged series typed as a path', 'api.calls;env=prod;region=eu', frm='-10s'))
    r(render('tagged.direct_agent_order', 'agent-order name typed as a path', 'jobs.runs;host=a;host-group=b', frm='-10s'))
    r(render('tagged.direct_canonical', 'canonical name typed as a path', 'jobs.runs;host-group=b;host=a', frm='-10s'))
    r(render('glob.braces', 'braces', '{web,db}.*', frm='-10s'))
    r(render('glob.charclass', 'char class and ?', 'web.[ch]*.h?ts', frm='-10s'))
    r(render('glob.none', 'no match', 'nothing.here', frm='-10s'))
    r(render('glob.star_all', 'top-level glob hits tagged?', '*', frm='-10s'))
    # --- errors ---------------------------------------------------------------------------------
    r(render('err.unknown_function', 'unknown function', 'fooBar(web.home.hits)'))
    r(render('err.unparsable', 'unparsable', 'sumSeries(web.*.hits'))
    r(render('err.-5m', 'm is not a unit', 'web.home.hits', frm='-5m'))
    r(render('err.bad_from', 'garbage from', 'web.home.hits', frm='yesterdayish'))
    r(render('err.empty_range', 'from == until', 'web.home.hits', frm='now', until='now'))
    r(render('err.bad_arg', 'wrong argument type', 'aliasByNode(web.*.hits,"x")'))
    r(render('err.bad_summarize', 'bad interval', "summarize(web.home.hits,'1x')"))
    r(render('err.missing_arg', 'missing argument', 'scale(web.home.hits)'))
    r(render('err.trailing_paren', 'unbalanced: parsed as far as it goes', 'web.home.hits)', frm='-10s'))
    r(render('err.trailing_space', 'text after a space is ignored', 'web.home.hits foo', frm='-10s'))
    r(render('err.kwarg', 'keyword argument', "summarize(web.home.hits,intervalString='1min',func='max')", frm='-5min'))
    r(render('err.no_target', 'no target at all', [], frm='-1min'))
    r(render('err.empty_target', 'empty target', '', frm='-1min'))
    # --- browsing ---------------------------------------------------------------------------------
    fq = lambda pid, *params, method='GET': r(get('find.' + pid, 'metrics/find', '/metrics/find', *params, method=method))
    fq('root', ('query', '*'))
    fq('root.post', ('query', '*'), ('from', '-6h'), ('until', 'now'), method='POST')
    fq('web', ('query', 'web.*'))
    fq('web.*.*', ('query', 'web.*.*'))
    fq('db', ('query', 'db.*'))
    fq('db.queries', ('query', 'db.queries'))
    fq('db.queries.*', ('query', 'db.queries.*'))
    fq('leaf', ('query', 'web.home.hits'))
    fq('leaf.children', ('query', 'web.home.hits.*'))
    fq('none', ('query', 'nothing.*'))
    fq('braces', ('query', '{web,db}.*'))
    fq('prefix', ('query', 'web.h*'))
    fq('wildcards', ('query', 'web.*'), ('wildcards', '1'))
    fq('completer.web', ('query', 'web.'), ('format', 'completer'))
    fq('completer.db', ('query', 'db.q'), ('format', 'completer'))
    fq('json', ('query', 'db.*'), ('format', 'json'))
    fq('tagged', ('query', 'api.calls;env=prod;region=eu'))
    fq('missing_query')
    fq('empty_query', ('query', ''))
    fq('bad_format', ('query', '*'), ('format', 'xml'))
    eq = lambda pid, *params: r(get('expand.' + pid, 'metrics/expand', '/metrics/expand', *params))
    eq('web', ('query', 'web.*'))
    eq('leaves', ('query', 'web.*.*'), ('leavesOnly', '1'))
    eq('group', ('query', 'web.*'), ('query', 'db.*'), ('groupByExpr', '1'))
    eq('db', ('query', 'db.*'))
    # --- tags -----------------------------------------------------------------------------------
    tq = lambda pid, path, *params: r(get('tags.' + pid, 'tags', path, *params))
    tq('tags', '/tags/autoComplete/tags')
    tq('tags.prefix', '/tags/autoComplete/tags', ('tagPrefix', 'e'))
    tq('tags.expr', '/tags/autoComplete/tags', ('expr', 'name=api.calls'))
    tq('tags.limit', '/tags/autoComplete/tags', ('limit', '2'))
    tq('tags.grafana', '/tags/autoComplete/tags', ('expr', 'name=api.calls'), ('tagPrefix', ''), ('limit', '100'))
    tq('tags.all_empty', '/tags/autoComplete/tags', ('expr', 'env!=prod'))
    tq('values.env', '/tags/autoComplete/values', ('tag', 'env'))
    tq('values.name', '/tags/autoComplete/values', ('tag', 'name'))
    tq('values.name_prefix', '/tags/autoComplete/values', ('tag', 'name'), ('valuePrefix', 'api'))
    tq('values.expr', '/tags/autoComplete/values', ('expr', 'name=api.calls'), ('tag', 'region'))
    tq('values.no_tag', '/tags/autoComplete/values', ('expr', 'name=api.calls'))
    tq('values.all_empty', '/tags/autoComplete/values', ('expr', 'env!=prod'), ('tag', 'region'))
    tq('findSeries', '/tags/findSeries', ('expr', 'name=api.calls'))
    tq('findSeries.two', '/tags/findSeries', ('expr', 'name=api.calls'), ('expr', 'env=prod'))
    tq('findSeries.regex', '/tags/findSeries', ('expr', 'name=~web'))
    tq('findSeries.none', '/tags/findSeries')
    tq('findSeries.all_empty', '/tags/findSeries', ('expr', 'env!=prod'))
    tq('list', '/tags')
    tq('detail', '/tags/env')
    # --- other endpoints -----------------------------------------------------------------------
    r(get('version', 'version', '/version'))
    r(get('functions', 'function index', '/functions'))
    r(get('index', 'index.json (all leaves)', '/metrics/index.json'))
    r(get('functions.one', 'one function', '/functions/sumSeries'))
    r(get('events', 'annotations (events ignore now=, so -1h is the wall clock)', '/events/get_data', ('from', '-1h'), ('until', 'now'), ('now', NOW)))
    r(dict(id='events.post', what='store an event (graphite-web own DB)', method='POST', path='/events',
           params=[], json_body={'what': 'deploy web', 'tags': ['deploy', 'web'], 'when': 1760001000, 'data': 'v1.2.3'}))
    r(get('events.range', 'events between epochs', '/events/get_data', ('from', '1760000000'), ('until', '1760002000')))
    r(get('events.tags', 'events by tag', '/events/get_data', ('from', '1760000000'), ('until', '1760002000'), ('tags', 'deploy')))
    r(get('events.tags_none', 'no event has the tag', '/events/get_data', ('from', '1760000000'), ('until', '1760002000'), ('tags', 'nope')))
    return P


def finite(v):
    """The parsed answer with infinities (graphite-web writes 1e9999) as the strings "1e9999" and
    "-1e9999", so that the answer file stays JSON for any reader."""
    if isinstance(v, float) and v in (float('inf'), float('-inf')):
        return '1e9999' if v > 0 else '-1e9999'
    if isinstance(v, list):
        return [finite(x) for x in v]
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    return v


def send(base, p):
    data = urllib.parse.urlencode([tuple(kv) for kv in p['params']])
    url = base + p['path']
    headers = {'Accept': GRAFANA_ACCEPT}
    if p.get('json_body') is not None:
        headers['Content-Type'] = 'application/json'
        req = urllib.request.Request(url, data=json.dumps(p['json_body']).encode(), headers=headers, method='POST')
    elif p['method'] == 'POST':
        headers['Content-Type'] = 'application/x-www-form-urlencoded'
        req = urllib.request.Request(url, data=data.encode(), headers=headers, method='POST')
    else:
        req = urllib.request.Request(url + ('?' + data if data else ''), headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            status, ctype, body = resp.status, resp.headers.get('Content-Type'), resp.read()
    except urllib.error.HTTPError as e:
        status, ctype, body = e.code, e.headers.get('Content-Type'), e.read()
    text = body.decode('utf-8', 'replace')
    try:
        parsed = finite(json.loads(text))
    except ValueError:
        parsed = None
    return dict(p, status=status, content_type=ctype, body=text, json=parsed)


def main():
    global NOW
    ap = argparse.ArgumentParser()
    ap.add_argument('--base', required=True)
    ap.add_argument('--out', default='answers.jsonl')
    ap.add_argument('--now', default=NOW)
    ap.add_argument('--only')
    ap.add_argument('--quiet', action='store_true')
    a = ap.parse_args()
    NOW = a.now
    only = set(a.only.split(',')) if a.only else None
    n = 0
    with open(a.out, 'w') as out:
        for p in probes():
            if only and p['id'] not in only:
                continue
            ans = send(a.base.rstrip('/'), p)
            out.write(json.dumps(ans, sort_keys=True) + '\n')
            n += 1
            if not a.quiet:
                print('### %s  %s %s %s -> %s' % (p['id'], p['method'], p['path'],
                                                    urllib.parse.urlencode(p['params']), ans['status']))
                print(ans['body'] if len(ans['body']) < 4000 else ans['body'][:4000] + ' ...')
    print('%d answers written to %s' % (n, a.out), file=sys.stderr)


if __name__ == '__main__':
    main()
