//! graphite-web's Filter Series group (which series to keep) and Filter Data group (which
//! points to keep).

use super::Type::*;
use super::*;
use crate::graphite::pyfmt::percent_g;

const N_FLOAT: Param = Param::new("n", Float).required();
const N_INT: Param = Param::new("n", Integer).required();
const AVERAGE: Lit = Lit::Str("average");
const OPERATORS: &[Lit] = &[
    Lit::Str("!="),
    Lit::Str("<"),
    Lit::Str("<="),
    Lit::Str("="),
    Lit::Str(">"),
    Lit::Str(">="),
];

/// A filter of `filterSeries`' shape: an aggregation of each series against `n`.
const fn threshold(name: &'static str, apply: Apply, description: &'static str) -> Function {
    Function::new(
        name,
        Group::FilterSeries,
        &[SERIES, N_FLOAT],
        Body::Apply(apply),
        description,
    )
}

/// A filter keeping the `n` series with the highest (or lowest) aggregate.
const fn ranked(name: &'static str, apply: Apply, description: &'static str) -> Function {
    Function::new(
        name,
        Group::FilterSeries,
        &[SERIES, N_INT],
        Body::Apply(apply),
        description,
    )
}

pub(super) const FUNCTIONS: &[Function] = &[
    threshold(
        "averageAbove",
        |a, _| keep(a, "average", ">"),
        "The series whose average is above n.",
    ),
    threshold(
        "averageBelow",
        |a, _| keep(a, "average", "<="),
        "The series whose average is at most n.",
    ),
    Function::new(
        "averageOutsidePercentile",
        Group::FilterSeries,
        &[SERIES, N_FLOAT],
        Body::Apply(|a, _| {
            let n = outside(a.float(1));
            let list = a.series(0);
            let averages: Vec<Point> = list.iter().map(|s| safe_avg(&s.points())).collect();
            let low = percentile(&averages, 100.0 - n, false);
            let high = percentile(&averages, n, false);
            Ok(list
                .into_iter()
                .zip(averages)
                .filter(|(_, avg)| !between(low, *avg, high))
                .map(|(s, _)| s)
                .collect())
        }),
        "The series whose average lies outside the nth percentile of the averages.",
    ),
    threshold(
        "currentAbove",
        |a, _| keep(a, "last", ">"),
        "The series whose last value is above n.",
    ),
    threshold(
        "currentBelow",
        |a, _| keep(a, "last", "<="),
        "The series whose last value is at most n.",
    ),
    Function::new(
        "exclude",
        Group::FilterSeries,
        &[SERIES, Param::new("pattern", Str).required()],
        Body::Apply(|a, _| {
            let re = regex("exclude", &a.text(1))?;
            Ok(a.series(0)
                .into_iter()
                .filter(|s| !re.is_match(&s.name))
                .collect())
        }),
        "The series whose name the regular expression does not match.",
    ),
    Function::new(
        "filterSeries",
        Group::FilterSeries,
        &[
            SERIES,
            Param::new("func", AggFunc).required(),
            Param::new("operator", Str).required().options(OPERATORS),
            Param::new("threshold", Float).required(),
        ],
        Body::Apply(|a, _| {
            let (func, operator) = (a.text(1), a.text(2));
            let threshold = a.float(3);
            filter_series(a.series(0), &func, &operator, threshold)
        }),
        "The series whose aggregate compares with the threshold as the operator says.",
    ),
    Function::new(
        "grep",
        Group::FilterSeries,
        &[SERIES, Param::new("pattern", Str).required()],
        Body::Apply(|a, _| {
            let re = regex("grep", &a.text(1))?;
            Ok(a.series(0)
                .into_iter()
                .filter(|s| re.is_match(&s.name))
                .collect())
        }),
        "The series whose name the regular expression matches.",
    ),
    Function::new(
        "highest",
        Group::FilterSeries,
        &[SERIES, N_INT, Param::new("func", AggFunc).default(AVERAGE)],
        Body::Apply(|a, _| {
            let func = a.text(2);
            top(a, &func, true)
        }),
        "The n series with the highest aggregate (the average by default).",
    ),
    ranked(
        "highestAverage",
        |a, _| top(a, "average", true),
        "The n series with the highest average.",
    ),
    ranked(
        "highestCurrent",
        |a, _| top(a, "current", true),
        "The n series whose last value is highest.",
    ),
    ranked(
        "highestMax",
        |a, _| top(a, "max", true),
        "The n series with the highest maximum.",
    ),
    Function::new(
        "limit",
        Group::FilterSeries,
        &[SERIES, N_INT],
        Body::Apply(|a, _| {
            let n = a.int(1);
            let mut list = a.series(0);
            list.truncate(python_end(n, list.len()));
            Ok(list)
        }),
        "The first n series.",
    ),
    Function::new(
        "lowest",
        Group::FilterSeries,
        &[SERIES, N_INT, Param::new("func", AggFunc).default(AVERAGE)],
        Body::Apply(|a, _| {
            let func = a.text(2);
            top(a, &func, false)
        }),
        "The n series with the lowest aggregate (the average by default).",
    ),
    ranked(
        "lowestAverage",
        |a, _| top(a, "average", false),
        "The n series with the lowest average.",
    ),
    ranked(
        "lowestCurrent",
        |a, _| top(a, "current", false),
        "The n series whose last value is lowest.",
    ),
    threshold(
        "maximumAbove",
        |a, _| keep(a, "max", ">"),
        "The series whose maximum is above n.",
    ),
    threshold(
        "maximumBelow",
        |a, _| keep(a, "max", "<="),
        "The series whose maximum is at most n.",
    ),
    threshold(
        "minimumAbove",
        |a, _| keep(a, "min", ">"),
        "The series whose minimum is above n.",
    ),
    threshold(
        "minimumBelow",
        |a, _| keep(a, "min", "<="),
        "The series whose minimum is at most n.",
    ),
    ranked(
        "mostDeviant",
        |a, _| {
            let n = a.int(1);
            let mut deviants: Vec<(f64, Series)> = a
                .series(0)
                .into_iter()
                .filter_map(|s| {
                    let points = s.points();
                    let mean = safe_avg(&points)?;
                    let squares = present(&points)
                        .iter()
                        .fold(0.0, |acc, v| acc + (v - mean).powi(2));
                    let sigma = safe_div(Some(squares), Some(present(&points).len() as f64))?;
                    Some((sigma, s))
                })
                .collect();
            deviants.sort_by(|x, y| y.0.total_cmp(&x.0));
            let end = python_end(n, deviants.len());
            Ok(deviants.into_iter().take(end).map(|(_, s)| s).collect())
        },
        "The n series whose values deviate most from their average.",
    ),
    Function::new(
        "removeBetweenPercentile",
        Group::FilterSeries,
        &[SERIES, N_FLOAT],
        Body::Apply(|a, _| {
            let n = outside(a.float(1));
            let list = a.series(0);
            let points: Vec<_> = list.iter().map(|s| s.points().into_owned()).collect();
            let columns = points.iter().map(|p| p.len()).min().unwrap_or(0);
            let column = |i: usize| points.iter().map(|p| p[i]).collect::<Vec<_>>();
            let low: Vec<Point> = (0..columns)
                .map(|i| percentile(&column(i), 100.0 - n, false))
                .collect();
            let high: Vec<Point> = (0..columns)
                .map(|i| percentile(&column(i), n, false))
                .collect();
            Ok(list
                .into_iter()
                .zip(&points)
                .filter(|(_, p)| {
                    p.iter().enumerate().any(|(i, v)| {
                        !between(
                            low.get(i).copied().flatten(),
                            *v,
                            high.get(i).copied().flatten(),
                        )
                    })
                })
                .map(|(s, _)| s)
                .collect())
        }),
        "The series with a point outside the nth percentile of the points at its time.",
    ),
    Function::new(
        "removeEmptySeries",
        Group::FilterSeries,
        &[SERIES, Param::new("xFilesFactor", Float)],
        Body::Apply(|a, _| {
            let xff = a.opt_float(1).unwrap_or(0.0);
            Ok(a.series(0)
                .into_iter()
                .filter(|s| xff_values(&s.points(), xff))
                .collect())
        }),
        "The series with values (at least the xFilesFactor share of points).",
    ),
    Function::new(
        "unique",
        Group::FilterSeries,
        &[LISTS],
        Body::Apply(|a, _| {
            let mut seen = std::collections::HashSet::new();
            Ok(a.all_series()
                .into_iter()
                .filter(|s| seen.insert(s.name.clone()))
                .collect())
        }),
        "The series with distinct names, the first of each.",
    ),
    Function::new(
        "useSeriesAbove",
        Group::FilterSeries,
        &[
            SERIES,
            Param::new("value", Float).required(),
            Param::new("search", Str).required(),
            Param::new("replace", Str).required(),
        ],
        Body::Refetch(
            |a, _| {
                let value = a.float(1);
                let (search, replace) = (a.text(2), a.text(3));
                let mut names = Vec::new();
                for s in a.peek_series(0) {
                    let name = substitute("useSeriesAbove", &search, &replace, &s.name)?;
                    if safe_max(&s.points()).is_some_and(|m| m > value) {
                        names.push(name);
                    }
                }
                if names.is_empty() {
                    return Ok(Vec::new());
                }
                Ok(vec![Fetch::Target(format!("group({})", names.join(",")))])
            },
            |_, _, fetched| {
                Ok(fetched
                    .into_iter()
                    .flatten()
                    .filter(|s| !s.values.is_empty())
                    .collect())
            },
        ),
        "The series named by replacing search with replace in those with a point above value.",
    ),
    Function::new(
        "removeAbovePercentile",
        Group::FilterData,
        &[SERIES, N_FLOAT],
        Body::Apply(|a, _| remove_percentile(a, true)),
        "Nulls the points above the series' nth percentile.",
    ),
    Function::new(
        "removeAboveValue",
        Group::FilterData,
        &[SERIES, N_FLOAT],
        Body::Apply(|a, _| remove_value(a, true)),
        "Nulls the points above n.",
    ),
    Function::new(
        "removeBelowPercentile",
        Group::FilterData,
        &[SERIES, N_FLOAT],
        Body::Apply(|a, _| remove_percentile(a, false)),
        "Nulls the points below the series' nth percentile.",
    ),
    Function::new(
        "removeBelowValue",
        Group::FilterData,
        &[SERIES, N_FLOAT],
        Body::Apply(|a, _| remove_value(a, false)),
        "Nulls the points below n.",
    ),
];

/// Python's `list[:n]` end: a negative `n` counts from the end.
fn python_end(n: i64, len: usize) -> usize {
    if n < 0 {
        (len as i64 + n).max(0) as usize
    } else {
        (n as usize).min(len)
    }
}

/// The percentile pair's upper one: `n` below 50 stands for `100 - n`.
fn outside(n: f64) -> f64 {
    if n < 50.0 { 100.0 - n } else { n }
}

/// `low < v < high`, false where any is missing.
fn between(low: Point, v: Point, high: Point) -> bool {
    matches!((low, v, high), (Some(l), Some(v), Some(h)) if l < v && v < h)
}

/// graphite-web's `filterSeries`.
fn filter_series(
    list: Vec<Series>,
    func: &str,
    operator: &str,
    threshold: f64,
) -> Result<Vec<Series>> {
    let f = agg(func)?;
    let compare: fn(Point, f64) -> bool = match operator {
        "=" => |v, t| v == Some(t),
        "!=" => |v, t| v != Some(t),
        ">" => |v, t| v.is_some_and(|v| v > t),
        ">=" => |v, t| v.is_some_and(|v| v >= t),
        "<" => |v, t| v.is_none_or(|v| v < t),
        "<=" => |v, t| v.is_none_or(|v| v <= t),
        other => return Err(bad(format!("Unsupported operator: {other}"))),
    };
    Ok(list
        .into_iter()
        .filter(|s| compare(f(&s.points()), threshold))
        .collect())
}

fn keep(a: &mut Args, func: &str, operator: &str) -> Result<Vec<Series>> {
    let n = a.float(1);
    filter_series(a.series(0), func, operator, n)
}

/// graphite-web's `highest` and `lowest`: sorted by the aggregate (a series without one as
/// -infinity), stable, then the first n.
fn top(a: &mut Args, func: &str, highest: bool) -> Result<Vec<Series>> {
    let f = agg(func)?;
    let n = a.int(1);
    let mut keyed: Vec<(f64, Series)> = a
        .series(0)
        .into_iter()
        .map(|s| (f(&s.points()).unwrap_or(f64::NEG_INFINITY), s))
        .collect();
    if highest {
        keyed.sort_by(|x, y| y.0.total_cmp(&x.0));
    } else {
        keyed.sort_by(|x, y| x.0.total_cmp(&y.0));
    }
    let end = python_end(n, keyed.len());
    Ok(keyed.into_iter().take(end).map(|(_, s)| s).collect())
}

fn remove_value(a: &mut Args, above: bool) -> Result<Vec<Series>> {
    let n = a.float(1);
    let function = if above {
        "removeAboveValue"
    } else {
        "removeBelowValue"
    };
    let mut list = a.series(0);
    for s in &mut list {
        s.rename(format!("{function}({}, {})", s.name, percent_g(n)));
        map_values(s, |v| match v {
            Some(v) if (above && v > n) || (!above && v < n) => None,
            other => other,
        });
    }
    Ok(list)
}

fn remove_percentile(a: &mut Args, above: bool) -> Result<Vec<Series>> {
    let n = a.float(1);
    if n == 0.0 {
        return Err(bad(
            "The requested percent is required to be greater than 0".into(),
        ));
    }
    let function = if above {
        "removeAbovePercentile"
    } else {
        "removeBelowPercentile"
    };
    let mut list = a.series(0);
    for s in &mut list {
        s.rename(format!("{function}({}, {})", s.name, percent_g(n)));
        let Some(line) = calculate::n_percentile(s.clone(), n) else {
            continue;
        };
        // nPercentile tags the series it reads (its copy shares the tag dict).
        s.tags = line.tags;
        let p = line.values.first().copied().flatten();
        map_values(s, |v| match (v, p) {
            (Some(v), Some(p)) if above && v > p => None,
            (Some(v), Some(p)) if !above && v < p => None,
            (None, _) if !above => None,
            (other, _) => other,
        });
    }
    Ok(list)
}
