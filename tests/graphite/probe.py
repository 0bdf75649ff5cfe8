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


def render(pid, what, target, frm='-1h', until='now', mdp=None, extra=(), method='POST', now=True,
           fmt='json'):
    params = []
    for t in ([target] if isinstance(target, str) else target):
        params.append(('target', t))
    if frm is not None:
        params.append(('from', frm))
    if until is not None:
        params.append(('until', until))
    params.append(('format', fmt))
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


# Every function of graphite-web 1.1.10's registry (`render/functions.py`, `SeriesFunctions`), in
# three requests or more: nulls (web.cart.hits lacks every 5th slice), series of unequal steps
# (a `summarize` beside a raw series), an empty list (nothing.here), keyword arguments. An entry
# is a target, or (target, from) or (target, from, maxDataPoints), or a list of targets (one
# request). Probes whose id starts with `rand.` answer random values: only their shape compares.
# The oracle runs graphite-web 1.1.10's own functions, so those Debian's 1.1.8 lacks are checked
# against their source: compressPeriodicGaps (render/functions.py:5909, with _compressPeriodicGaps
# at :154), upper and lower (toUpperCase :2833, toLowerCase :2867), and 1.1.10's moving window,
# which ends at the point it is drawn at (movingWindow :1350, `range(windowPoints + 1, len + 1)`).
H, C, M, W = 'web.home.hits', 'web.cart.hits', 'web.home.miss', 'web.*.*'
E = 'nothing.here'
U = "summarize(web.home.miss,'10s','sum')"          # a step of 10 s beside the 5 s ones
TAGGED = "seriesByTag('name=api.calls')"
TWO = 'group(db.queries,web.home.miss)'             # as many series as web.*.hits
EVERY_FUNCTION = [
    ('aggregate', ["aggregate(web.*.*,'sum')", "aggregate(web.*.*,func='max',xFilesFactor=0.9)",
                   "aggregate(nothing.here,'avg')", "aggregate(group(%s,%s),'median')" % (C, U),
                   "aggregate(web.*.*,'sumSeries')", "aggregate(web.*.*,'avg_zero')",
                   "aggregate(web.*.*,'bogus')"]),
    ('aggregateSeriesLists', ["aggregateSeriesLists(web.*.hits,%s,'max')" % TWO,
                              "aggregateSeriesLists(web.*.hits,%s,func='diff',xFilesFactor=1)" % TWO,
                              "aggregateSeriesLists(web.*.hits,web.home.miss,'sum')"]),
    ('aggregateWithWildcards', ["aggregateWithWildcards(web.*.*,'sum',1)",
                                "aggregateWithWildcards(*.*.*,'avg',0,2)",
                                "aggregateWithWildcards(web.*.*,func='max')",
                                "aggregateWithWildcards(nothing.here,'sum',1)"]),
    ('applyByNode', ["applyByNode(web.*.hits,1,'sumSeries(%.*)')",
                     "applyByNode(web.*.hits,1,'sumSeries(%.*)','%.total')",
                     "applyByNode(nothing.here,1,'sumSeries(%)')",
                     "applyByNode(web.*.*,nodeNum=0,templateFunction='countSeries(%.*.*)')"]),
    ('asPercent', ["asPercent(web.*.*,%s)" % E, "asPercent(web.*.*,None,1)",
                   "asPercent(web.*.*,total=web.home.hits)", "asPercent(%s,%s)" % (C, U)]),
    ('pct', ["pct(web.*.hits)", "pct(web.home.hits,100)", "pct(web.home.*,web.home.miss,1)"]),
    ('averageSeries', ["averageSeries(%s,%s)" % (C, U), "averageSeries(nothing.here)",
                       "averageSeries(web.*.*,db.queries)"]),
    ('avg', ["avg(web.*.*)", "avg(%s,%s)" % (H, U), "avg(nothing.here)"]),
    ('averageSeriesWithWildcards', ["averageSeriesWithWildcards(web.*.*,1)",
                                    "averageSeriesWithWildcards(*.*.*,0,2)",
                                    "averageSeriesWithWildcards(nothing.here,1)"]),
    ('countSeries', ["countSeries()", "countSeries(nothing.here)", "countSeries(web.*.hits,db.queries)"]),
    ('diffSeries', ["diffSeries(web.*.*)", "diffSeries(nothing.here)", "diffSeries(%s,%s)" % (C, U)]),
    ('diffSeriesLists', ["diffSeriesLists(web.*.hits,%s)" % TWO,
                         "diffSeriesLists(nothing.here,nothing.here)",
                         "diffSeriesLists(%s,web.*.hits)" % TWO]),
    ('divideSeries', ["divideSeries(%s,%s)" % (C, U), "divideSeries(nothing.here,web.home.hits)",
                      "divideSeries(web.*.*,web.*.hits)"]),
    ('divideSeriesLists', ["divideSeriesLists(web.*.hits,%s)" % TWO,
                           "divideSeriesLists(web.*.hits,web.home.miss)",
                           "divideSeriesLists(nothing.here,nothing.here)"]),
    ('group', ["group(web.home.hits,db.queries)", "group()", "group(nothing.here,web.cart.hits)"]),
    ('groupByNode', ["groupByNode(web.*.*,1,callback='maxSeries')",
                     "groupByNode(%s,'env','sum')" % TAGGED, "groupByNode(nothing.here,1)",
                     "groupByNode(web.*.*,-1,'avg_zero')"]),
    ('groupByNodes', ["groupByNodes(web.*.*,'sum',1,2)", "groupByNodes(web.*.*,'avg')",
                      "groupByNodes(%s,'sum','region',0)" % TAGGED,
                      "groupByNodes(web.*.*,'stddevSeries',2)"]),
    ('groupByTags', ["groupByTags(%s,'max','region')" % TAGGED,
                     "groupByTags(%s,'sumSeries','env','name')" % TAGGED,
                     "groupByTags(nothing.here,'sum','env')"]),
    ('mapSeries', ["reduceSeries(mapSeries(web.home.*,1),'divideSeries',2,'hits','miss')",
                   "reduceSeries(mapSeries(web.home.*,1),'sumSeries',2,'hits','miss')",
                   "reduceSeries(mapSeries(nothing.here,1),'sumSeries',2,'hits','miss')"]),
    ('map', ["reduce(map(web.home.*,1),'asPercent',2,'hits','miss')",
             "reduce(map(web.home.*,0),'diffSeries',2,'miss','hits')",
             "reduce(map(db.queries*,0),'sumSeries',1,'queries')"]),
    ('reduceSeries', ["reduceSeries(mapSeries(web.home.*,1),'multiplySeries',2,'hits','miss')",
                      "reduceSeries(mapSeries(web.home.*,1),'sumSeries',-1,'hits','miss')",
                      "reduceSeries(mapSeries(web.home.*,1),'minSeries',2,'hits')"]),
    ('reduce', ["reduce(map(web.home.*,1),'maxSeries',2,'hits','miss')",
                "reduce(map(web.home.*,1),'divideSeries',2,'miss','hits')",
                "reduce(nothing.here,'sumSeries',2,'hits')"]),
    ('maxSeries', ["maxSeries(%s,%s)" % (C, U), "maxSeries(nothing.here)", "maxSeries(web.*.*)"]),
    ('minSeries', ["minSeries(%s,%s)" % (C, U), "minSeries(nothing.here)", "minSeries(web.*.*)"]),
    ('multiplySeries', ["multiplySeries(web.home.*)", "multiplySeries(web.home.hits)",
                        "multiplySeries(web.*.*)", "multiplySeries(%s,%s)" % (H, U)]),
    ('multiplySeriesLists', ["multiplySeriesLists(web.*.hits,%s)" % TWO,
                             "multiplySeriesLists(nothing.here,nothing.here)",
                             "multiplySeriesLists(web.*.hits,web.*.hits)"]),
    ('multiplySeriesWithWildcards', ["multiplySeriesWithWildcards(web.*.*,2)",
                                     "multiplySeriesWithWildcards(web.home.*,2)",
                                     "multiplySeriesWithWildcards(nothing.here,1)"]),
    ('percentileOfSeries', ["percentileOfSeries(web.*.*,50)", "percentileOfSeries(web.*.*,90,true)",
                            "percentileOfSeries(web.*.*,n=75,interpolate=true)",
                            "percentileOfSeries(nothing.here,50)", "percentileOfSeries(group(%s,%s),95)" % (C, U)]),
    ('powSeries', ["powSeries(scale(web.home.*,0.1))", "powSeries(web.cart.hits,constantLine(0.5))",
                   "powSeries(nothing.here)", "powSeries(%s,%s)" % (H, U)]),
    ('rangeOfSeries', ["rangeOfSeries(web.*.*)", "rangeOfSeries(%s,%s)" % (C, U),
                       "rangeOfSeries(nothing.here)"]),
    ('stddevSeries', ["stddevSeries(web.*.*)", "stddevSeries(web.home.*)", "stddevSeries(nothing.here)",
                      "stddevSeries(%s,%s)" % (C, U)]),
    ('sumSeries', ["sumSeries(%s,%s)" % (C, U), "sumSeries(web.*.*,nothing.here)", "sumSeries(web.cart.hits)"]),
    ('sum', ["sum(web.*.hits)", "sum(%s,%s)" % (C, U), "sum(nothing.here)"]),
    ('sumSeriesLists', ["sumSeriesLists(web.*.hits,%s)" % TWO, "sumSeriesLists(nothing.here,nothing.here)",
                        "sumSeriesLists(web.*.hits,web.home.miss)"]),
    ('sumSeriesWithWildcards', ["sumSeriesWithWildcards(web.*.*,1)", "sumSeriesWithWildcards(*.*.*,0)",
                                "sumSeriesWithWildcards(nothing.here,1)"]),
    ('weightedAverage', ["weightedAverage(web.*.hits,%s,1)" % TWO,
                         "weightedAverage(web.home.hits,web.home.miss)",
                         "weightedAverage(nothing.here,nothing.here)",
                         "weightedAverage(web.*.hits,web.home.miss)"]),
    ('absolute', ["absolute(web.cart.hits)", "absolute(offset(web.*.*,-25))", "absolute(nothing.here)"]),
    ('add', ["add(web.home.hits,5)", "add(web.cart.hits,-2.5)", "add(web.*.*,constant=1)"]),
    ('compressPeriodicGaps', ["compressPeriodicGaps(removeBelowValue(web.home.hits,16))",
                              ("compressPeriodicGaps(removeBelowValue(web.home.hits,16))", '-1min'),
                              "compressPeriodicGaps(web.home.hits)", "compressPeriodicGaps(nothing.here)"]),
    ('delay', ["delay(web.home.hits,2)", "delay(web.cart.hits,-3)", "delay(web.home.hits,0)",
               "delay(web.home.hits,steps=100)"]),
    ('derivative', ["derivative(web.*.*)", "derivative(nothing.here)", "derivative(%s)" % U]),
    ('exp', ["exp(scale(web.home.hits,0.1))", "exp(web.cart.hits)", "exp(nothing.here)"]),
    ('hitcount', ["hitcount(web.home.hits,'30s')", "hitcount(web.cart.hits,'1min',true)",
                  "hitcount(web.home.hits,intervalString='7s')", "hitcount(nothing.here,'1min')",
                  ("hitcount(web.home.hits,'1h',true)", '-2h')]),
    ('integral', ["integral(web.*.*)", "integral(nothing.here)", "integral(%s)" % U]),
    ('integralByInterval', ["integralByInterval(web.home.hits,'1min')",
                            "integralByInterval(web.cart.hits,'30s')",
                            "integralByInterval(web.*.*,intervalUnit='2min')"]),
    ('interpolate', ["interpolate(web.cart.hits)", "interpolate(web.cart.hits,0)",
                     "interpolate(removeBelowValue(web.home.hits,14),2)",
                     "interpolate(removeBelowValue(web.home.hits,14),limit=1)"]),
    ('invert', ["invert(web.home.hits)", "invert(offset(web.home.hits,-23))", "invert(web.cart.hits)"]),
    ('isNonNull', ["isNonNull(web.cart.hits)", "isNonNull(web.*.*)", "isNonNull(nothing.here)"]),
    ('keepLastValue', ["keepLastValue(removeBelowValue(web.home.hits,24),limit=2)",
                       "keepLastValue(nothing.here)", "keepLastValue(removeBelowValue(web.home.hits,24),3)"]),
    ('log', ["log(web.home.hits)", "log(web.home.hits,2)", "log(offset(web.home.hits,-23),base=10)"]),
    ('logit', ["logit(scale(web.home.hits,0.01))", "logit(web.cart.hits)", "logit(scale(web.cart.hits,0.02))"]),
    ('minMax', ["minMax(web.home.hits)", "minMax(web.cart.hits)", "minMax(db.pool.size)"]),
    ('nonNegativeDerivative', ["nonNegativeDerivative(web.home.*,maxValue=25)",
                               "nonNegativeDerivative(nothing.here)", "nonNegativeDerivative(%s)" % U]),
    ('offset', ["offset(web.cart.hits,2)", "offset(web.*.*,factor=0.5)", "offset(nothing.here,1)"]),
    ('offsetToZero', ["offsetToZero(web.home.hits)", "offsetToZero(web.cart.hits)", "offsetToZero(nothing.here)"]),
    ('perSecond', ["perSecond(web.home.hits)", "perSecond(web.home.hits,minValue=22)",
                   "perSecond(%s)" % U]),
    ('pow', ["pow(web.home.hits,2)", "pow(web.cart.hits,0.5)", "pow(offset(web.home.hits,-23),-1)",
             "pow(scale(web.home.hits,-1),factor=0.5)"]),
    ('round', ["round(scale(web.home.hits,0.123))", "round(scale(web.home.hits,0.123),2)",
               "round(scale(web.cart.hits,-12.34),-1)", "round(scale(web.home.hits,0.125),precision=1)"]),
    ('scale', ["scale(web.cart.hits,-2)", "scale(nothing.here,2)", "scale(web.*.*,factor='3')"]),
    ('scaleToSeconds', ["scaleToSeconds(web.cart.hits,60)", "scaleToSeconds(web.home.hits,seconds=0.5)",
                        "scaleToSeconds(%s,1)" % U]),
    ('sigmoid', ["sigmoid(scale(web.home.hits,0.1))", "sigmoid(web.cart.hits)",
                 "sigmoid(offset(web.home.hits,-23))"]),
    ('smartSummarize', ["smartSummarize(web.home.hits,'1min')", "smartSummarize(web.home.hits,'30s','max')",
                        "smartSummarize(web.cart.hits,'1min','avg','minutes')",
                        ("smartSummarize(web.home.hits,'10min','sum','hours')", '-1h'),
                        ("smartSummarize(web.home.hits,intervalString='1h',func='last',alignTo='days')", '-1d')]),
    ('squareRoot', ["squareRoot(web.home.hits)", "squareRoot(scale(web.cart.hits,-1))", "squareRoot(nothing.here)"]),
    ('summarize', ["summarize(web.cart.hits,'1min','avg',true)", "summarize(nothing.here,'1min')",
                   "summarize(web.home.hits,intervalString='90s',func='max',alignToFrom=true)"]),
    ('timeShift', ["timeShift(web.cart.hits,'-1min',resetEnd=false)", "timeShift(nothing.here,'1h')",
                   "timeShift(web.*.hits,'30s')", "timeShift(removeEmptySeries(web.*.*),'1min')"]),
    ('timeSlice', ["timeSlice(web.home.hits,'1760001000')",
                   "timeSlice(web.cart.hits,'1760001000','1760001150')",
                   "timeSlice(web.*.*,startSliceAt='09:10_20251009',endSliceAt='09:12_20251009')"]),
    ('timeStack', ["timeStack(web.home.hits,'1min',0,3)", "timeStack(web.cart.hits,'10s',1,3)",
                   "timeStack(web.home.hits,timeShiftUnit='30s',timeShiftEnd=2)", "timeStack(nothing.here)"]),
    ('transformNull', ["transformNull(web.cart.hits,-1,web.home.hits)",
                       "transformNull(web.cart.hits,default=5)", "transformNull(nothing.here)",
                       "transformNull(web.cart.hits,0,nothing.here)"]),
    ('sinFunction', ["sinFunction('wave')", "sinFunction('wave',2,30)", "sinFunction('wave',step=10)"]),
    ('sin', ["sin('The.time')", "sin('x',amplitude=3)", ("sin('x',5,600)", '-1h')]),
    ('timeFunction', ["timeFunction('t')", "timeFunction('t',30)", "timeFunction('t',step=120)"]),
    ('time', ["time('t')", ("time('t',600)", '-1h'), "time('The.time',step=7)"]),
    ('aggregateLine', ["aggregateLine(web.home.hits)", "aggregateLine(web.cart.hits,'max')",
                       "aggregateLine(web.home.hits,'sum',true)", "aggregateLine(nothing.here)"]),
    ('exponentialMovingAverage', ["exponentialMovingAverage(web.home.hits,5)",
                                  "exponentialMovingAverage(web.cart.hits,'1min')",
                                  "exponentialMovingAverage(web.home.hits,windowSize=3)",
                                  "exponentialMovingAverage(nothing.here,5)"]),
    ('holtWintersForecast', ["holtWintersForecast(web.home.hits)",
                             ("holtWintersForecast(web.home.hits,'1d','6h')", '-1h'),
                             ("holtWintersForecast(web.cart.hits,bootstrapInterval='2h',seasonality='10min')", '-1h'),
                             "holtWintersForecast(nothing.here)"]),
    ('holtWintersConfidenceBands', ["holtWintersConfidenceBands(web.home.hits)",
                                    ("holtWintersConfidenceBands(web.cart.hits,2,'2h','10min')", '-1h'),
                                    ("holtWintersConfidenceBands(web.home.hits,delta=5,bootstrapInterval='1d')", '-1h')]),
    ('holtWintersAberration', ["holtWintersAberration(web.home.hits,3,'4min','1min')",
                               "holtWintersAberration(web.cart.hits,1,'4min','30s')",
                               ("holtWintersAberration(web.home.hits,delta=0,bootstrapInterval='50min',seasonality='10min')", '-1h')]),
    ('holtWintersConfidenceArea', ["holtWintersConfidenceArea(web.home.hits)",
                                   ("holtWintersConfidenceArea(web.cart.hits,2,'2h','10min')", '-1h'),
                                   "holtWintersConfidenceArea(web.*.hits)"]),
    ('identity', ["identity('x')", ("identity('x')", '-1h'), "identity(name='y')"]),
    ('linearRegression', ["linearRegression(web.home.hits)",
                          "linearRegression(web.cart.hits,'1760001000','1760001200')",
                          "linearRegression(web.*.*,startSourceAt='09:05_20251009')",
                          "linearRegression(nothing.here)"]),
    ('movingAverage', ["movingAverage(web.home.hits,5,0.9)", "movingAverage(nothing.here,3)",
                       "movingAverage(web.cart.hits,windowSize='30s',xFilesFactor=0.5)",
                       # a first argument whose series depend on the data
                       "movingAverage(removeEmptySeries(group(web.home.hits,nothing.here)),2)"]),
    ('movingMax', ["movingMax(web.cart.hits,5)", "movingMax(web.home.hits,'1min')",
                   "movingMax(web.cart.hits,windowSize=3,xFilesFactor=1)"]),
    ('movingMin', ["movingMin(web.cart.hits,'1min')", "movingMin(web.home.hits,4)",
                   "movingMin(nothing.here,2)"]),
    ('movingMedian', ["movingMedian(web.home.hits,4,0.5)", "movingMedian(web.cart.hits,'30s')",
                      "movingMedian(web.cart.hits,windowSize=6)"]),
    ('movingSum', ["movingSum(web.cart.hits,windowSize=3,xFilesFactor=1)", "movingSum(web.home.hits,'1min')",
                   "movingSum(%s,3)" % U]),
    ('movingWindow', ["movingWindow(web.cart.hits,5,'max')", "movingWindow(web.home.hits,'30s',func='avg_zero')",
                      "movingWindow(web.cart.hits,3,'median',0.7)", "movingWindow(web.cart.hits,3)"]),
    ('nPercentile', ["nPercentile(web.home.hits,50)", "nPercentile(web.cart.hits,95)",
                     "nPercentile(web.*.*,n=10)", "nPercentile(nothing.here,50)"]),
    ('stdev', ["stdev(web.home.hits,5)", "stdev(web.cart.hits,10,0.5)", "stdev(web.home.hits,points=3)"]),
    ('averageAbove', ["averageAbove(web.*.*,25)", "averageAbove(nothing.here,1)", "averageAbove(web.*.*,n='50')"]),
    ('averageBelow', ["averageBelow(web.*.*,25)", "averageBelow(nothing.here,1)", "averageBelow(web.*.*,n=50)"]),
    ('averageOutsidePercentile', ["averageOutsidePercentile(web.*.*,25)", "averageOutsidePercentile(web.*.*,90)",
                                  "averageOutsidePercentile(nothing.here,50)"]),
    ('currentAbove', ["currentAbove(web.*.*,20)", "currentAbove(nothing.here,1)", "currentAbove(web.*.*,n=50)"]),
    ('currentBelow', ["currentBelow(web.*.*,20)", "currentBelow(nothing.here,1)", "currentBelow(web.*.*,n=50)"]),
    ('exclude', ["exclude(nothing.here,'x')", "exclude(*.*.*,'hits$')", "exclude(web.*.*,pattern='cart')"]),
    ('grep', ["grep(nothing.here,'x')", "grep(*.*.*,'hits$')", "grep(web.*.*,pattern='cart')"]),
    ('filterSeries', ["filterSeries(web.*.*,'max','>',30)", "filterSeries(web.*.*,'sum','<=',1000)",
                      "filterSeries(web.*.*,'last','!=',21)",
                      "filterSeries(web.*.*,func='average',operator='>=',threshold=20)",
                      "filterSeries(web.*.*,'max','gt',1)", "filterSeries(nothing.here,'max','<',1)"]),
    ('highest', ["highest(web.*.*,2,'max')", "highest(web.*.*,n=1,func='sum')", "highest(nothing.here,2)",
                 "highest(web.*.*,-1)"]),
    ('highestAverage', ["highestAverage(web.*.*,2)", "highestAverage(nothing.here,1)", "highestAverage(web.*.*,n=1)"]),
    ('highestCurrent', ["highestCurrent(web.*.*,n=2)", "highestCurrent(nothing.here,1)", "highestCurrent(*.*.*,3)"]),
    ('highestMax', ["highestMax(web.*.*,n=1)", "highestMax(nothing.here,1)", "highestMax(*.*.*,3)"]),
    ('limit', ["limit(web.*.*,n=1)", "limit(nothing.here,1)", "limit(web.*.*,-1)"]),
    ('lowest', ["lowest(web.*.*,2,'max')", "lowest(web.*.*,n=1,func='sum')", "lowest(nothing.here,2)"]),
    ('lowestAverage', ["lowestAverage(web.*.*,2)", "lowestAverage(nothing.here,1)", "lowestAverage(web.*.*,n=1)"]),
    ('lowestCurrent', ["lowestCurrent(web.*.*,n=1)", "lowestCurrent(nothing.here,1)", "lowestCurrent(*.*.*,3)"]),
    ('maximumAbove', ["maximumAbove(web.*.*,30)", "maximumAbove(nothing.here,1)", "maximumAbove(web.*.*,n=60)"]),
    ('maximumBelow', ["maximumBelow(web.*.*,30)", "maximumBelow(nothing.here,1)", "maximumBelow(web.*.*,n=60)"]),
    ('minimumAbove', ["minimumAbove(web.*.*,30)", "minimumAbove(nothing.here,1)", "minimumAbove(web.*.*,n=60)"]),
    ('minimumBelow', ["minimumBelow(web.*.*,30)", "minimumBelow(nothing.here,1)", "minimumBelow(web.*.*,n=60)"]),
    ('mostDeviant', ["mostDeviant(web.*.*,2)", "mostDeviant(*.*.*,n=1)", "mostDeviant(nothing.here,2)"]),
    ('removeBetweenPercentile', ["removeBetweenPercentile(group(web.home.*,db.queries),30)",
                                 "removeBetweenPercentile(group(web.home.*,db.queries),n=70)",
                                 "removeBetweenPercentile(nothing.here,30)"]),
    ('removeEmptySeries', ["removeEmptySeries(web.*.*)", "removeEmptySeries(group(web.home.hits,nothing.here))",
                           "removeEmptySeries(web.cart.hits,0.9)", "removeEmptySeries(web.*.*,xFilesFactor=0.5)"]),
    ('unique', ["unique(web.*.*,web.home.*)", "unique(web.home.hits,web.home.hits)", "unique(nothing.here)"]),
    ('useSeriesAbove', ["useSeriesAbove(web.home.*,25,'home','cart')", "useSeriesAbove(web.home.*,1000,'home','cart')",
                        "useSeriesAbove(web.home.*,value=25,search='web',replace='db')"]),
    ('removeAbovePercentile', ["removeAbovePercentile(web.home.hits,50)", "removeAbovePercentile(web.cart.hits,90)",
                               "removeAbovePercentile(web.*.*,n=25)"]),
    ('removeAboveValue', ["removeAboveValue(web.*.*,n=25)", "removeAboveValue(nothing.here,1)",
                          "removeAboveValue(%s,100)" % U]),
    ('removeBelowPercentile', ["removeBelowPercentile(web.home.hits,50)", "removeBelowPercentile(web.cart.hits,90)",
                               "removeBelowPercentile(web.*.*,n=25)"]),
    ('removeBelowValue', ["removeBelowValue(web.*.*,n=25)", "removeBelowValue(nothing.here,1)",
                          "removeBelowValue(%s,100)" % U]),
    ('sortBy', ["sortBy(web.*.*)", "sortBy(web.*.*,'max',true)", "sortBy(web.*.*,func='last',reverse=false)",
                "sortBy(nothing.here)"]),
    ('sortByMaxima', ["sortByMaxima(web.*.*)", "sortByMaxima(*.*.*)", "sortByMaxima(nothing.here)"]),
    ('sortByMinima', ["sortByMinima(web.*.*)", "sortByMinima(*.*.*)", "sortByMinima(offset(web.*.*,-100))"]),
    ('sortByName', ["sortByName(nothing.here)", "sortByName(web.*.*,reverse=true)", "sortByName(*.*.*,natural=true)"]),
    ('sortByTotal', ["sortByTotal(web.*.*)", "sortByTotal(*.*.*)", "sortByTotal(nothing.here)"]),
    ('alias', ["alias(web.*.*,'all')", "alias(nothing.here,'x')", "alias(web.home.hits,newName='n')"]),
    ('aliasByMetric', ["aliasByMetric(web.*.*)", "aliasByMetric(sumSeries(web.*.hits))",
                       "aliasByMetric(%s)" % TAGGED, "aliasByMetric(scale(web.home.hits,2))"]),
    ('aliasByNode', ["aliasByNode(web.*.*,-2,0)", "aliasByNode(nothing.here,1)",
                     "aliasByNode(sumSeries(web.*.hits),1)"]),
    ('aliasByTags', ["aliasByTags(%s,'env')" % TAGGED, "aliasByTags(nothing.here,'env')",
                     "aliasByTags(web.*.*,1,'name')"]),
    ('aliasQuery', [r"aliasQuery(web.home.*,'web\.home\.(\w+)','db.queries','%d queries')",
                    "aliasQuery(web.home.hits,'hits','miss','miss now %s')",
                    "aliasQuery(web.*.hits,'web','db','%.1f')", "aliasQuery(nothing.here,'a','b','%s')"]),
    ('aliasSub', ["aliasSub(nothing.here,'a','b')", r"aliasSub(web.*.*,'^web\.(\w+)\.(\w+)$','\2 of \1')",
                  "aliasSub(web.home.hits,search='hits',replace='HITS')"]),
    ('legendValue', ["legendValue(web.*.*,'avg')", "legendValue(web.*.*,'last','max','si')",
                     "legendValue(scale(web.home.hits,1000),'sum','binary')", "legendValue(web.home.hits,'bogus')",
                     "legendValue(web.cart.hits,'total','min')"]),
    ('upper', ["upper(web.home.hits)", "upper(web.home.hits,0,-1)", "upper(%s,1)" % TAGGED]),
    ('lower', ["lower(upper(web.*.*))", "lower(upper(web.home.hits),2,5)", "lower(nothing.here)"]),
    ('alpha', ["alpha(web.home.hits,0.5)", "alpha(nothing.here,1)", "alpha(web.*.*,alpha=0.1)"]),
    ('areaBetween', ["areaBetween(group(web.home.hits,web.home.miss))", "areaBetween(web.*.*)", "areaBetween(group(web.home.miss,web.cart.hits))"]),
    ('color', ["color(web.*.*,'red')", "color(nothing.here,'blue')", "color(web.home.hits,theColor='00ff00')"]),
    ('dashed', ["dashed(web.home.hits)", "dashed(web.*.*,2)", "dashed(web.home.hits,dashLength=3)"]),
    ('drawAsInfinite', ["drawAsInfinite(web.cart.hits)", "drawAsInfinite(nothing.here)", "drawAsInfinite(web.*.*)"]),
    ('lineWidth', ["lineWidth(web.home.hits,3)", "lineWidth(nothing.here,1)", "lineWidth(web.*.*,width=0.5)"]),
    ('secondYAxis', ["secondYAxis(web.*.hits)", "secondYAxis(nothing.here)", "secondYAxis(sumSeries(web.*.*))"]),
    ('stacked', ["stacked(web.*.*)", "stacked(web.*.hits,'A')", ['stacked(web.home.hits)', 'stacked(web.home.miss)'],
                 ["stacked(web.home.hits,'A')", "stacked(web.home.miss,'B')", "stacked(web.cart.hits,'A')"]]),
    ('threshold', ["threshold(100)", "threshold(1.5,'limit')", "threshold(2,label='x',color='red')"]),
    ('verticalLine', ["verticalLine('1760001000','deploy')", "verticalLine('1760001100','deploy','red')",
                      "verticalLine('1760000000','early')", "verticalLine('1760009000','late')"]),
    ('cactiStyle', ["cactiStyle(web.*.*)", "cactiStyle(scale(web.*.*,1234),'si')",
                    "cactiStyle(scale(web.home.hits,4096),'binary','b')", "cactiStyle(web.home.hits,units='req')",
                    "cactiStyle(nothing.here)"]),
    ('changed', ["changed(web.cart.hits)", "changed(db.pool.size)", "changed(removeBelowValue(web.home.hits,24))"]),
    ('consolidateBy', [("consolidateBy(web.cart.hits,'min')", '-5min', 7), ("consolidateBy(web.home.hits,'last')", '-1h', 10),
                       ("consolidateBy(web.cart.hits,consolidationFunc='first')", '-5min', 7)]),
    ('constantLine', ["constantLine(-3)", "constantLine(0.5)", ("constantLine(1)", '-1h', 2)]),
    ('cumulative', [("cumulative(web.home.hits)", '-5min', 7), ("cumulative(web.cart.hits)", '-1h', 10),
                    "cumulative(nothing.here)"]),
    ('events', ["events('*')", "events('deploy','web')", ("events('*')", '-10min', 10)]),
    ('fallbackSeries', ["fallbackSeries(nothing.here,web.home.hits)", "fallbackSeries(web.home.hits,web.cart.hits)",
                        "fallbackSeries(nothing.here,nothing.either)"]),
    ('randomWalkFunction', ["randomWalkFunction('walk')", "randomWalkFunction('walk',10)",
                            "randomWalkFunction('walk',step=30)"]),
    ('randomWalk', ["randomWalk('walk')", "randomWalk('walk',step=15)", ("randomWalk('w',600)", '-1h')]),
    ('setXFilesFactor', [("setXFilesFactor(web.cart.hits,0.9)", '-5min', 7), "sumSeries(setXFilesFactor(web.*.*,0.7))",
                         ("setXFilesFactor(web.cart.hits,xFilesFactor=0.1)", '-5min', 7)]),
    ('xFilesFactor', [("xFilesFactor(web.cart.hits,0.9)", '-5min', 7), "averageSeries(xFilesFactor(web.*.*,1))",
                      "xFilesFactor(nothing.here,0.5)"]),
    ('seriesByTag', ["seriesByTag('name=~api','env=dev')", "seriesByTag('name=nothing')", "seriesByTag('region=~^u')"]),
    ('substr', ["substr(web.home.hits,1)", "substr(sumSeries(web.*.hits),0,2)", "substr(web.home.hits,-2)",
                "substr(scale(web.home.hits,2),1)", "substr(web.home.hits,start=1,stop=2)"]),
]


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
    for name, targets in EVERY_FUNCTION:
        for i, t in enumerate(targets):
            frm, mdp = '-5min', None
            if isinstance(t, tuple):
                t, frm, mdp = (t + (None,))[:3]
            prefix = 'rand' if name.startswith('randomWalk') else 'all'
            r(render('%s.%s.%d' % (prefix, name, i), name, t, frm=frm, mdp=mdp))
    # --- format=csv: the text itself compares -------------------------------------------------
    for i, t in enumerate(["summarize(web.cart.hits,'1min','avg')", 'aliasByMetric(web.*.*)',
                           'stacked(web.*.hits)', "holtWintersForecast(web.home.hits,'4min','1min')",
                           'removeBelowValue(web.cart.hits,43)', "legendValue(web.home.hits,'avg','max')",
                           'nothing.here', 'scale(web.home.latency_ms,0.1)']):
        r(render('csv.%d' % i, 'csv', t, frm='-5min', fmt='csv'))
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
