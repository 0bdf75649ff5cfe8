//! The declarations against graphite-web 1.1.10's registry, and binding as its
//! `validateParams` binds.

use super::*;

/// Every name of graphite-web 1.1.10's `SeriesFunctions` (`render/functions.py:5976-6148`).
const REGISTRY: &[&str] = &[
    "absolute",
    "add",
    "aggregate",
    "aggregateLine",
    "aggregateSeriesLists",
    "aggregateWithWildcards",
    "alias",
    "aliasByMetric",
    "aliasByNode",
    "aliasByTags",
    "aliasQuery",
    "aliasSub",
    "alpha",
    "applyByNode",
    "areaBetween",
    "asPercent",
    "averageAbove",
    "averageBelow",
    "averageOutsidePercentile",
    "averageSeries",
    "averageSeriesWithWildcards",
    "avg",
    "cactiStyle",
    "changed",
    "color",
    "compressPeriodicGaps",
    "consolidateBy",
    "constantLine",
    "countSeries",
    "cumulative",
    "currentAbove",
    "currentBelow",
    "dashed",
    "delay",
    "derivative",
    "diffSeries",
    "diffSeriesLists",
    "divideSeries",
    "divideSeriesLists",
    "drawAsInfinite",
    "events",
    "exclude",
    "exp",
    "exponentialMovingAverage",
    "fallbackSeries",
    "filterSeries",
    "grep",
    "group",
    "groupByNode",
    "groupByNodes",
    "groupByTags",
    "highest",
    "highestAverage",
    "highestCurrent",
    "highestMax",
    "hitcount",
    "holtWintersAberration",
    "holtWintersConfidenceArea",
    "holtWintersConfidenceBands",
    "holtWintersForecast",
    "identity",
    "integral",
    "integralByInterval",
    "interpolate",
    "invert",
    "isNonNull",
    "keepLastValue",
    "legendValue",
    "limit",
    "lineWidth",
    "linearRegression",
    "log",
    "logit",
    "lower",
    "lowest",
    "lowestAverage",
    "lowestCurrent",
    "map",
    "mapSeries",
    "maxSeries",
    "maximumAbove",
    "maximumBelow",
    "minMax",
    "minSeries",
    "minimumAbove",
    "minimumBelow",
    "mostDeviant",
    "movingAverage",
    "movingMax",
    "movingMedian",
    "movingMin",
    "movingSum",
    "movingWindow",
    "multiplySeries",
    "multiplySeriesLists",
    "multiplySeriesWithWildcards",
    "nPercentile",
    "nonNegativeDerivative",
    "offset",
    "offsetToZero",
    "pct",
    "perSecond",
    "percentileOfSeries",
    "pow",
    "powSeries",
    "randomWalk",
    "randomWalkFunction",
    "rangeOfSeries",
    "reduce",
    "reduceSeries",
    "removeAbovePercentile",
    "removeAboveValue",
    "removeBelowPercentile",
    "removeBelowValue",
    "removeBetweenPercentile",
    "removeEmptySeries",
    "round",
    "scale",
    "scaleToSeconds",
    "secondYAxis",
    "seriesByTag",
    "setXFilesFactor",
    "sigmoid",
    "sin",
    "sinFunction",
    "smartSummarize",
    "sortBy",
    "sortByMaxima",
    "sortByMinima",
    "sortByName",
    "sortByTotal",
    "squareRoot",
    "stacked",
    "stddevSeries",
    "stdev",
    "substr",
    "sum",
    "sumSeries",
    "sumSeriesLists",
    "sumSeriesWithWildcards",
    "summarize",
    "threshold",
    "time",
    "timeFunction",
    "timeShift",
    "timeSlice",
    "timeStack",
    "transformNull",
    "unique",
    "upper",
    "useSeriesAbove",
    "verticalLine",
    "weightedAverage",
    "xFilesFactor",
];

#[test]
fn every_name_of_graphite_webs_registry_is_declared_and_no_other() {
    assert_eq!(REGISTRY.len(), 154);
    let missing: Vec<&&str> = REGISTRY.iter().filter(|n| find(n).is_none()).collect();
    assert!(missing.is_empty(), "not declared: {missing:?}");
    let extra: Vec<&str> = names()
        .into_iter()
        .filter(|n| !REGISTRY.contains(n))
        .collect();
    assert!(extra.is_empty(), "not graphite-web's: {extra:?}");
}

#[test]
fn aliases_call_their_function() {
    for (alias, function) in [
        ("avg", "averageSeries"),
        ("sum", "sumSeries"),
        ("pct", "asPercent"),
        ("map", "mapSeries"),
        ("reduce", "reduceSeries"),
        ("randomWalk", "randomWalkFunction"),
        ("sin", "sinFunction"),
        ("time", "timeFunction"),
        ("xFilesFactor", "setXFilesFactor"),
        ("log", "log"),
    ] {
        assert_eq!(find(alias).map(|f| f.name), Some(function), "{alias}");
    }
}

#[test]
fn groups_are_graphite_webs_attributes() {
    // graphite-web's `.group` attributes differ from the comments in its registry for these.
    for (name, group) in [
        ("isNonNull", Group::Transform),
        ("powSeries", Group::Combine),
        ("identity", Group::Calculate),
        ("sin", Group::Transform),
        ("time", Group::Transform),
        ("removeAboveValue", Group::FilterData),
        ("unique", Group::FilterSeries),
    ] {
        assert_eq!(find(name).map(|f| f.group), Some(group), "{name}");
    }
}

fn series(name: &str) -> Arg {
    Arg::Series(vec![Series::new(name, 0, 60, 60, vec![Some(1.0)])])
}

fn bound(name: &str, args: Vec<Arg>, kwargs: Vec<(&str, Arg)>) -> Result<Args> {
    let kwargs = kwargs
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect();
    bind(find(name).expect("declared"), name, args, kwargs)
}

fn error(r: Result<Args>) -> String {
    match r {
        Err(GraphiteError::BadRequest(m)) => m,
        other => panic!("expected a bad request, got {other:?}"),
    }
}

#[test]
fn arguments_bind_by_position_and_keyword_with_their_types() {
    let a = bound(
        "summarize",
        vec![series("a")],
        vec![
            ("intervalString", Arg::Str("1min".into())),
            ("func", Arg::Str("max".into())),
        ],
    )
    .unwrap();
    assert_eq!(
        (a.text(1), a.text(2), a.boolean(3)),
        ("1min".into(), "max".into(), false)
    );
    // Numbers as quoted strings, booleans as strings, as graphite-web's validators take them.
    let a = bound("scale", vec![series("a"), Arg::Str(" 2.5".into())], vec![]).unwrap();
    assert_eq!(a.float(1), 2.5);
    let a = bound(
        "sortByName",
        vec![series("a"), Arg::Str("true".into()), Arg::Int(0)],
        vec![],
    )
    .unwrap();
    assert!(a.boolean(1) && !a.boolean(2));
    let a = bound("keepLastValue", vec![series("a")], vec![]).unwrap();
    assert_eq!(a.float(1), f64::INFINITY, "the declared default");
    let a = bound(
        "aliasByNode",
        vec![series("a"), Arg::Int(-1), Arg::Str("env".into())],
        vec![],
    )
    .unwrap();
    assert_eq!(a.rest().len(), 2);
    let a = bound("limit", vec![series("a"), Arg::Str("3".into())], vec![]).unwrap();
    assert_eq!(a.int(1), 3);
}

#[test]
fn a_wrong_argument_names_the_function_and_the_parameter() {
    for (name, args, kwargs, says) in [
        (
            "scale",
            vec![series("a")],
            vec![],
            "Missing required parameter \"factor\" for function \"scale\"",
        ),
        (
            "scale",
            vec![series("a"), Arg::Str("x".into())],
            vec![],
            "Invalid \"float\" value specified for function \"scale\" parameter \"factor\": 'x'",
        ),
        (
            "limit",
            vec![series("a"), Arg::Float(1.5)],
            vec![],
            "parameter \"n\": 1.5",
        ),
        (
            "scale",
            vec![Arg::Str("a".into()), Arg::Int(1)],
            vec![],
            "Invalid \"seriesList\" value specified for function \"scale\" parameter \"seriesList\"",
        ),
        (
            "scale",
            vec![series("a"), Arg::Int(1), Arg::Int(2)],
            vec![],
            "Too many parameters specified for function \"scale\"",
        ),
        (
            "aggregate",
            vec![series("a")],
            vec![("func", Arg::Str("sum".into())), ("other", Arg::Int(1))],
            "Unexpected key word arguments: other",
        ),
        (
            "summarize",
            vec![series("a"), Arg::Str("1x".into())],
            vec![],
            "parameter \"intervalString\": '1x'",
        ),
        (
            "aggregate",
            vec![series("a"), Arg::Str("bogus".into())],
            vec![],
            "Unsupported aggregation function: bogus",
        ),
        (
            "sortByName",
            vec![series("a"), Arg::Str("maybe".into())],
            vec![],
            "Invalid \"boolean\" value",
        ),
    ] {
        let m = error(bound(name, args, kwargs));
        assert!(m.contains(says), "{name}: {m}");
    }
}

#[test]
fn the_deprecated_series_suffix_is_an_aggregation_too() {
    assert!(
        bound(
            "aggregate",
            vec![series("a"), Arg::Str("sumSeries".into())],
            vec![]
        )
        .is_ok()
    );
    assert!(
        bound(
            "groupByNode",
            vec![series("a"), Arg::Int(0), Arg::Str("sumSeries".into())],
            vec![]
        )
        .is_ok()
    );
}

#[test]
fn the_index_lists_params_as_graphite_web_does() {
    let f = find("keepLastValue").unwrap();
    let text = with_infinity(info("keepLastValue", f));
    assert!(text.contains("\"default\":1e9999"), "{text}");
    let v = info("groupByNode", find("groupByNode").unwrap());
    let options = v["params"][2]["options"].as_array().unwrap();
    assert!(
        options.iter().any(|o| o == "sumSeries"),
        "aggregators are callbacks"
    );
    assert!(options.iter().any(|o| o == "avg_zero"));
    assert_eq!(v["params"][2]["default"], "average");
    assert_eq!(v["group"], "Combine");
    let smart = info("smartSummarize", find("smartSummarize").unwrap());
    // Sorted by Python's str: 'False', 'None', 'True', then the units.
    assert_eq!(smart["params"][3]["options"][0], false);
    assert_eq!(smart["params"][3]["options"][1], Value::Null);
}

#[test]
fn python_round_is_half_to_even_on_the_exact_value() {
    use super::transform::python_round;
    assert_eq!(python_round(2.5, 0), 2.0);
    assert_eq!(python_round(3.5, 0), 4.0);
    assert_eq!(python_round(0.125, 2), 0.12);
    assert_eq!(python_round(2.675, 2), 2.67);
    assert_eq!(python_round(1250.0, -2), 1200.0);
}

#[test]
fn percentiles_as_graphite_web_ranks_them() {
    let p: Vec<Point> = [1.0, 2.0, 3.0, 4.0, 5.0].map(Some).to_vec();
    assert_eq!(percentile(&p, 50.0, false), Some(3.0));
    assert_eq!(percentile(&p, 90.0, false), Some(5.0));
    assert_eq!(percentile(&p, 50.0, true), Some(3.0));
    assert_eq!(percentile(&p, 10.0, true), Some(1.0));
    assert_eq!(percentile(&[None], 50.0, false), None);
}

/// A sample call of each function declared `per_series` (its arguments after the series).
fn per_series_calls() -> Vec<(&'static str, Vec<Arg>)> {
    let text = |s: &str| Arg::Str(s.into());
    vec![
        ("alias", vec![text("x")]),
        ("aliasByMetric", vec![]),
        ("aliasByNode", vec![Arg::Int(1), Arg::Int(-1)]),
        ("aliasByTags", vec![text("env"), Arg::Int(0)]),
        ("aliasSub", vec![text(r"b(\d)"), text(r"c\1")]),
        ("absolute", vec![]),
        ("add", vec![Arg::Float(2.5)]),
        ("derivative", vec![]),
        ("exp", vec![]),
        ("integral", vec![]),
        ("invert", vec![]),
        ("isNonNull", vec![]),
        ("keepLastValue", vec![Arg::Int(1)]),
        ("log", vec![Arg::Int(10)]),
        ("logit", vec![]),
        ("minMax", vec![]),
        ("nonNegativeDerivative", vec![Arg::Float(100.0)]),
        ("offset", vec![Arg::Float(-1.0)]),
        ("offsetToZero", vec![]),
        ("perSecond", vec![]),
        ("pow", vec![Arg::Float(2.0)]),
        ("round", vec![Arg::Int(1)]),
        ("scale", vec![Arg::Float(0.5)]),
        ("scaleToSeconds", vec![Arg::Float(1.0)]),
        ("sigmoid", vec![]),
        ("squareRoot", vec![]),
        ("transformNull", vec![Arg::Float(-1.0)]),
    ]
}

/// What a streamed render relies on (`graphite::Streamed`): a `per_series` function's answer
/// for a list is its answers for each series alone, in order, and each keeps its series'
/// times and number of points (the render's `maxDataPoints` and "any data" are worked out
/// from the series before the functions).
#[test]
fn per_series_functions_answer_a_list_as_its_series_one_by_one() {
    let calls = per_series_calls();
    let mut flagged: Vec<&str> = declarations()
        .filter(|f| f.per_series)
        .map(|f| f.name)
        .collect();
    let mut sampled: Vec<&str> = calls.iter().map(|(name, _)| *name).collect();
    flagged.sort_unstable();
    sampled.sort_unstable();
    assert_eq!(
        flagged, sampled,
        "every per_series function has a sample call"
    );
    let list = vec![
        Series::new(
            "a.b1.c;env=prod",
            0,
            360,
            60,
            vec![
                Some(3.0),
                None,
                Some(-2.5),
                Some(0.0),
                Some(7.25),
                Some(1.0),
            ],
        ),
        Series::new(
            "a.b2.d",
            0,
            360,
            60,
            vec![None, None, Some(0.5), Some(0.25), None, Some(9.0)],
        ),
        Series::new(
            "x",
            60,
            180,
            30,
            vec![Some(1e9), Some(2e9), None, Some(5.0)],
        ),
    ];
    let apply = |name: &str, args: &[Arg], list: Vec<Series>| -> Vec<Series> {
        let f = find(name).expect("declared");
        let Body::Apply(apply) = f.body else {
            panic!("{name}: a per_series function is applied, not planned");
        };
        let mut all = vec![Arg::Series(list)];
        all.extend(args.iter().cloned());
        let mut bound = bind(f, name, all, Vec::new()).expect("binds");
        let mut state = State::default();
        let mut ctx = Ctx {
            from: 0,
            until: 360,
            now: 400,
            state: &mut state,
        };
        apply(&mut bound, &mut ctx).expect("applies")
    };
    for (name, args) in &calls {
        let whole = apply(name, args, list.clone());
        let one_by_one: Vec<Series> = list
            .iter()
            .flat_map(|s| apply(name, args, vec![s.clone()]))
            .collect();
        assert_eq!(whole, one_by_one, "{name}");
        assert_eq!(whole.len(), list.len(), "{name}");
        for (out, s) in whole.iter().zip(&list) {
            assert_eq!(
                (out.start, out.end, out.step, out.values.len()),
                (s.start, s.end, s.step, s.values.len()),
                "{name}: {}",
                out.name
            );
        }
    }
}
