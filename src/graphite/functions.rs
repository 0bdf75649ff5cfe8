//! The render functions, each computing and naming what graphite-web 1.1's computes and names
//! (`render/functions.py`): the answers are compared with graphite-web's own in
//! `tests/graphite.rs`.

use std::collections::HashMap;

use super::pyfmt::{percent_g, repr_string};
use super::series::{CONSOLIDATIONS, Point, Series, Tags, normalize, rows};
use super::{Arg, GraphiteError, bad};

/// Every function the render API takes (aliases included), for `/functions` and for an
/// unknown function's error.
pub const NAMES: &[&str] = &[
    "absolute",
    "aggregate",
    "alias",
    "aliasByNode",
    "aliasByTags",
    "aliasSub",
    "asPercent",
    "averageSeries",
    "avg",
    "consolidateBy",
    "constantLine",
    "countSeries",
    "derivative",
    "diffSeries",
    "divideSeries",
    "exclude",
    "groupByNode",
    "groupByNodes",
    "groupByTags",
    "grep",
    "highestCurrent",
    "highestMax",
    "integral",
    "keepLastValue",
    "limit",
    "lowestCurrent",
    "maxSeries",
    "minSeries",
    "movingAverage",
    "nonNegativeDerivative",
    "offset",
    "perSecond",
    "removeAboveValue",
    "removeBelowValue",
    "scale",
    "scaleToSeconds",
    "seriesByTag",
    "sortByName",
    "sum",
    "sumSeries",
    "summarize",
    "timeShift",
    "transformNull",
];

/// An aggregation function over one row of points (graphite-web's `getAggFunc`).
pub fn agg_func(name: &str) -> Option<fn(&[Point]) -> Point> {
    Some(match name {
        "average" | "avg" => |row| {
            let v: Vec<f64> = row.iter().flatten().copied().collect();
            (!v.is_empty()).then(|| sum(&v) / v.len() as f64)
        },
        "avg_zero" => |row| {
            (!row.is_empty()).then(|| {
                sum(&row.iter().map(|p| p.unwrap_or(0.0)).collect::<Vec<_>>()) / row.len() as f64
            })
        },
        "median" => |row| {
            let mut v: Vec<f64> = row.iter().flatten().copied().collect();
            v.sort_by(f64::total_cmp);
            let mid = v.len() / 2;
            match v.len() {
                0 => None,
                n if n % 2 == 0 => Some((v[mid - 1] + v[mid]) / 2.0),
                _ => Some(v[mid]),
            }
        },
        "sum" | "total" => |row| {
            let v: Vec<f64> = row.iter().flatten().copied().collect();
            (!v.is_empty()).then(|| sum(&v))
        },
        "min" => |row| row.iter().flatten().copied().reduce(f64::min),
        "max" => |row| row.iter().flatten().copied().reduce(f64::max),
        "diff" => |row| {
            let v: Vec<f64> = row.iter().flatten().copied().collect();
            (!v.is_empty()).then(|| v[1..].iter().fold(v[0], |a, b| a + -b))
        },
        "stddev" => |row| {
            let v: Vec<f64> = row.iter().flatten().copied().collect();
            if v.is_empty() {
                return None;
            }
            let avg = sum(&v) / v.len() as f64;
            let sq = v.iter().fold(0.0, |a, x| a + (x - avg) * (x - avg));
            Some((sq / v.len() as f64).sqrt())
        },
        "count" => |row| Some(row.iter().flatten().count() as f64),
        "range" | "rangeOf" => |row| {
            let max = row.iter().flatten().copied().reduce(f64::max)?;
            let min = row.iter().flatten().copied().reduce(f64::min)?;
            Some(max - min)
        },
        "multiply" => |row| {
            if row.iter().any(Option::is_none) {
                return None;
            }
            row.iter().flatten().copied().reduce(|a, b| a * b)
        },
        "last" | "current" => |row| row.iter().rev().flatten().next().copied(),
        _ => return None,
    })
}

/// Python's `sum` over floats: left to right from 0.
fn sum(values: &[f64]) -> f64 {
    values.iter().fold(0.0, |a, b| a + b)
}

/// graphite-web's `formatPathExpressions`: the distinct path expressions, in order, joined.
fn path_expressions(series: &[Series]) -> String {
    let mut seen: Vec<&str> = Vec::new();
    for s in series {
        if !seen.contains(&s.path_expression.as_str()) {
            seen.push(&s.path_expression);
        }
    }
    seen.join(",")
}

/// `aggregate(seriesList, func)`: one series, `<func>Series(<path expressions>)`.
pub fn aggregate(mut list: Vec<Series>, func: &str) -> Result<Vec<Series>, GraphiteError> {
    let func = func.strip_suffix("Series").unwrap_or(func);
    let f =
        agg_func(func).ok_or_else(|| bad(format!("Unsupported aggregation function: {func}")))?;
    let Some((start, end, step)) = normalize(&mut list) else {
        return Ok(Vec::new());
    };
    let name = format!("{func}Series({})", path_expressions(&list));
    // A row without a value is null, whatever the function (graphite-web's `xffValues`).
    let values: Vec<Point> = rows(&list)
        .iter()
        .map(|row| row.iter().any(Option::is_some).then(|| f(row)).flatten())
        .collect();
    // The tags every input has alike, then the new name if `name` differed, then how.
    let mut tags = list[0].tags.clone();
    tags.0
        .retain(|(k, v)| list.iter().all(|s| s.tags.get(k) == Some(v.as_str())));
    if tags.get("name").is_none() {
        tags.set("name", name.clone());
    }
    tags.set("aggregatedBy", func);
    let mut out = Series::new(&name, start, end, step, values);
    out.tags = tags;
    Ok(vec![out])
}

/// Node `n` of a series' name (the part before the first `;`, split on `.`), or, when `n` is no
/// node index there, the tag `n`; `''` when neither (graphite-web's `getNodeOrTag`).
fn node_or_tag(series: &Series, n: &Arg, path: Option<&str>) -> String {
    if let Some(i) = n.as_index() {
        let name = path.unwrap_or(&series.name);
        let nodes: Vec<&str> = name.split(';').next().unwrap_or("").split('.').collect();
        let at = if i < 0 { nodes.len() as i64 + i } else { i };
        if let Some(node) = usize::try_from(at).ok().and_then(|at| nodes.get(at)) {
            return node.to_string();
        }
    }
    series.tags.get(&n.text()).unwrap_or("").to_string()
}

/// graphite-web's `aggKey`: the nodes (or tags) joined with `.`; a name that ends in `)` is
/// read through its first path expression.
fn agg_key(series: &Series, nodes: &[Arg]) -> String {
    let path = series
        .name
        .ends_with(')')
        .then(|| first_path_expression(&series.name))
        .flatten();
    nodes
        .iter()
        .map(|n| node_or_tag(series, n, path.as_deref()))
        .collect::<Vec<_>>()
        .join(".")
}

/// The first path expression inside a function-wrapped name (`sumSeries(a.b,c)` → `a.b`).
fn first_path_expression(name: &str) -> Option<String> {
    let mut e = super::expr::parse(name).ok()?;
    loop {
        match e {
            super::expr::Expr::Path(p) => return Some(p),
            super::expr::Expr::Call(mut c) if !c.args.is_empty() => e = c.args.swap_remove(0),
            _ => return None,
        }
    }
}

/// Applies a function to its evaluated arguments (`movingAverage` and `seriesByTag`, which fetch
/// on their own, are evaluated by the caller).
pub fn apply(
    name: &str,
    args: Vec<Arg>,
    kwargs: HashMap<String, Arg>,
    from: i64,
    until: i64,
) -> Result<Vec<Series>, GraphiteError> {
    let rest = |from: usize| -> Vec<Arg> { args.get(from..).unwrap_or_default().to_vec() };
    let arg = |i: usize, key: &str| -> Option<Arg> {
        kwargs
            .get(key)
            .cloned()
            .or_else(|| args.get(i).cloned())
            .filter(|a| !matches!(a, Arg::None))
    };
    let required = |a: Option<Arg>, what: &str| {
        a.ok_or_else(|| bad(format!("{name}() missing required argument: '{what}'")))
    };
    let list = |a: Option<Arg>| -> Vec<Series> {
        match a {
            Some(Arg::Series(s)) => s,
            _ => Vec::new(),
        }
    };
    // The series of every argument that is one (the multi-list aggregators).
    let all_series = |args: &[Arg]| -> Vec<Series> {
        args.iter()
            .filter_map(|a| match a {
                Arg::Series(s) => Some(s.clone()),
                _ => None,
            })
            .flatten()
            .collect()
    };
    match name {
        "sumSeries" | "sum" => aggregate(all_series(&args), "sum"),
        "averageSeries" | "avg" => aggregate(all_series(&args), "average"),
        "maxSeries" => aggregate(all_series(&args), "max"),
        "minSeries" => aggregate(all_series(&args), "min"),
        "aggregate" => {
            let func = required(arg(1, "func"), "func")?.text();
            aggregate(list(arg(0, "seriesList")), &func)
        }
        "alias" => {
            let new = required(arg(1, "newName"), "newName")?.text();
            let mut l = list(arg(0, "seriesList"));
            for s in &mut l {
                s.name = new.clone();
            }
            Ok(l)
        }
        "aliasSub" => {
            let search = required(arg(1, "search"), "search")?.text();
            let replace = required(arg(2, "replace"), "replace")?.text();
            let re = regex::Regex::new(&search)
                .map_err(|e| bad(format!("aliasSub: bad regular expression {search:?}: {e}")))?;
            let replace = python_replacement(&replace);
            let mut l = list(arg(0, "seriesList"));
            for s in &mut l {
                s.name = re.replace_all(&s.name, replace.as_str()).into_owned();
            }
            Ok(l)
        }
        "aliasByNode" | "aliasByTags" => {
            let nodes = rest(1);
            let mut l = list(arg(0, "seriesList"));
            for s in &mut l {
                s.name = agg_key(s, &nodes);
            }
            Ok(l)
        }
        "constantLine" => {
            let value = required(arg(0, "value"), "value")?.number()?;
            let step = (until - from) / 2;
            if step == 0 {
                return Err(bad(
                    "constantLine needs a range of at least 2 s (it draws 3 points)".into(),
                ));
            }
            let name = repr_string(value);
            let mut s = Series::new(&name, from, until, step, vec![Some(value); 3]);
            s.path_expression = format!("constantLine({name})");
            Ok(vec![s])
        }
        "scale" => {
            let factor = required(arg(1, "factor"), "factor")?.number()?;
            Ok(per_value(
                list(arg(0, "seriesList")),
                "scale",
                Some(factor),
                |v| v * factor,
            ))
        }
        "scaleToSeconds" => {
            let seconds = required(arg(1, "seconds"), "seconds")?;
            let secs = seconds.number()?;
            let mut l = list(arg(0, "seriesList"));
            for s in &mut l {
                s.tags.set("scaleToSeconds", repr_string(secs));
                s.rename(format!(
                    "scaleToSeconds({},{})",
                    s.name,
                    secs.trunc() as i64
                ));
                let factor = secs / s.step as f64;
                map_values(s, |v| v.map(|v| round6(v * factor)));
            }
            Ok(l)
        }
        "perSecond" | "nonNegativeDerivative" => {
            let max = arg(1, "maxValue").map(|a| a.number()).transpose()?;
            let min = arg(2, "minValue").map(|a| a.number()).transpose()?;
            let l = list(arg(0, "seriesList"));
            Ok(l.into_iter()
                .map(|mut s| {
                    let step = s.step as f64;
                    let mut prev = None;
                    let values = s
                        .points()
                        .into_iter()
                        .map(|v| {
                            let (delta, p) = non_negative_delta(v, prev, max, min);
                            prev = p;
                            if name == "perSecond" {
                                delta.map(|d| round6(d / step))
                            } else {
                                delta
                            }
                        })
                        .collect();
                    s.tags.set(name, "1");
                    s.derived(format!("{name}({})", s.name), values)
                })
                .collect())
        }
        "integral" => {
            let l = list(arg(0, "seriesList"));
            Ok(l.into_iter()
                .map(|mut s| {
                    let mut current = 0.0;
                    let values = s
                        .points()
                        .into_iter()
                        .map(|v| {
                            v.map(|v| {
                                current += v;
                                current
                            })
                        })
                        .collect();
                    s.tags.set("integral", "1");
                    s.derived(format!("integral({})", s.name), values)
                })
                .collect())
        }
        "transformNull" => {
            let default = arg(1, "default");
            let value = default
                .as_ref()
                .map(Arg::number)
                .transpose()?
                .unwrap_or(0.0);
            // A typed default is a float (graphite-web converts it); the default default, 0.
            let tag = default
                .as_ref()
                .map_or("0".to_string(), |_| repr_string(value));
            let mut l = list(arg(0, "seriesList"));
            for s in &mut l {
                s.tags.set("transformNull", tag.clone());
                s.rename(format!("transformNull({},{})", s.name, percent_g(value)));
                map_values(s, |v| Some(v.unwrap_or(value)));
            }
            Ok(l)
        }
        "keepLastValue" => {
            let limit = arg(1, "limit")
                .map(|a| a.number())
                .transpose()?
                .unwrap_or(f64::INFINITY);
            let mut l = list(arg(0, "seriesList"));
            for s in &mut l {
                s.rename(format!("keepLastValue({})", s.name));
                let mut nones = 0usize;
                let mut last: Option<f64> = None;
                for i in 0..s.values.len() {
                    match s.values[i] {
                        None => nones += 1,
                        Some(v) => {
                            if nones > 0
                                && nones as f64 <= limit
                                && let Some(l) = last
                            {
                                s.values[i - nones..i].fill(Some(l));
                            }
                            nones = 0;
                            last = Some(v);
                        }
                    }
                }
                let n = s.values.len();
                if nones > 0
                    && nones as f64 <= limit
                    && let Some(l) = last
                {
                    s.values[n - nones..].fill(Some(l));
                }
            }
            Ok(l)
        }
        "consolidateBy" => {
            let func = required(arg(1, "consolidationFunc"), "consolidationFunc")?.text();
            if !CONSOLIDATIONS.contains(&func.as_str()) {
                return Err(bad(format!(
                    "consolidateBy: {func:?} is none of {}",
                    CONSOLIDATIONS.join(", ")
                )));
            }
            let mut l = list(arg(0, "seriesList"));
            for s in &mut l {
                s.consolidation = func.clone();
                s.tags.set("consolidateBy", func.clone());
                s.rename(format!("consolidateBy({},\"{func}\")", s.name));
            }
            Ok(l)
        }
        "summarize" => {
            let interval_text = required(arg(1, "intervalString"), "intervalString")?.text();
            let func = arg(2, "func").map_or("sum".to_string(), |a| a.text());
            let align = arg(3, "alignToFrom").is_some_and(|a| a.truthy());
            let interval = interval_secs(&interval_text)?;
            let f = agg_func(&func)
                .ok_or_else(|| bad(format!("Unsupported aggregation function: {func}")))?;
            let l = list(arg(0, "seriesList"));
            Ok(l.into_iter()
                .map(|mut s| {
                    let (mut start, mut end) = (s.start, s.end);
                    if !align {
                        start = s.start - s.start.rem_euclid(interval);
                        end = s.end - s.end.rem_euclid(interval) + interval;
                    }
                    let (values, aligned_end) = summarize_values(&s, f, interval, start, end);
                    if align {
                        end = aligned_end;
                    }
                    s.tags.set("summarize", interval_text.clone());
                    s.tags.set("summarizeFunction", func.clone());
                    let new = format!(
                        "summarize({}, \"{interval_text}\", \"{func}\"{})",
                        s.name,
                        if align { ", true" } else { "" }
                    );
                    let mut out = s.derived(new, values);
                    out.start = start;
                    out.end = end;
                    out.step = interval;
                    out
                })
                .collect())
        }
        "groupByNode" => {
            let node = required(arg(1, "nodeNum"), "nodeNum")?;
            let callback = arg(2, "callback").map_or("average".to_string(), |a| a.text());
            group_by(
                list(arg(0, "seriesList")),
                &callback,
                |s| agg_key(s, std::slice::from_ref(&node)),
                false,
            )
        }
        "groupByNodes" => {
            let callback = required(arg(1, "callback"), "callback")?.text();
            let nodes = rest(2);
            group_by(
                list(arg(0, "seriesList")),
                &callback,
                |s| agg_key(s, &nodes),
                false,
            )
        }
        "groupByTags" => {
            let callback = required(arg(1, "callback"), "callback")?.text();
            let tags: Vec<String> = rest(2).iter().map(Arg::text).collect();
            if tags.is_empty() {
                return Err(bad("groupByTags(): no tags specified".into()));
            }
            let l = list(arg(0, "seriesList"));
            let names: std::collections::BTreeSet<&str> =
                l.iter().filter_map(|s| s.tags.get("name")).collect();
            let common = if names.len() == 1 {
                names.into_iter().next().unwrap_or_default().to_string()
            } else {
                callback.clone()
            };
            let by_name = tags.iter().any(|t| t == "name");
            let key = |s: &Series| {
                let mut parts: Vec<String> = tags
                    .iter()
                    .filter(|t| !(by_name && *t == "name"))
                    .map(|t| format!("{t}={}", s.tags.get(t).unwrap_or("")))
                    .collect();
                parts.sort();
                let head = if by_name {
                    s.tags.get("name").unwrap_or("").to_string()
                } else {
                    common.clone()
                };
                std::iter::once(head)
                    .chain(parts)
                    .collect::<Vec<_>>()
                    .join(";")
            };
            group_by(l, &callback, key, true)
        }
        "asPercent" => as_percent(list(arg(0, "seriesList")), arg(1, "total"), &rest(2)),
        "highestCurrent" => {
            let n = required(arg(1, "n"), "n")?.number()? as usize;
            let mut l = list(arg(0, "seriesList"));
            let current = |s: &Series| {
                s.points()
                    .iter()
                    .rev()
                    .flatten()
                    .next()
                    .copied()
                    .unwrap_or(f64::NEG_INFINITY)
            };
            l.sort_by(|a, b| current(b).total_cmp(&current(a)));
            l.truncate(n);
            Ok(l)
        }
        "sortByName" => {
            let natural = arg(1, "natural").is_some_and(|a| a.truthy());
            let reverse = arg(2, "reverse").is_some_and(|a| a.truthy());
            let mut l = list(arg(0, "seriesList"));
            let key = |s: &Series| {
                if natural {
                    natural_key(&s.name)
                } else {
                    s.name.clone()
                }
            };
            l.sort_by_cached_key(key);
            if reverse {
                // Python's stable sort with reverse=True keeps equal keys in their order.
                l.reverse();
                let mut i = 0;
                while i < l.len() {
                    let j = (i..l.len())
                        .take_while(|&j| key(&l[j]) == key(&l[i]))
                        .count()
                        + i;
                    l[i..j].reverse();
                    i = j;
                }
            }
            Ok(l)
        }
        "limit" => {
            let n = required(arg(1, "n"), "n")?.number()? as usize;
            let mut l = list(arg(0, "seriesList"));
            l.truncate(n);
            Ok(l)
        }
        "diffSeries" => aggregate(all_series(&args), "diff"),
        "countSeries" => {
            let mut l = all_series(&args);
            let Some((start, end, step)) = normalize(&mut l) else {
                return Ok(Vec::new());
            };
            let name = format!("countSeries({})", path_expressions(&l));
            let values = rows(&l).iter().map(|r| Some(r.len() as f64)).collect();
            Ok(vec![Series::new(&name, start, end, step, values)])
        }
        "divideSeries" => {
            let dividends = list(arg(0, "dividendSeriesList"));
            let divisor = list(arg(1, "divisorSeries"));
            match divisor.len() {
                0 => Ok(dividends
                    .into_iter()
                    .map(|mut s| {
                        s.rename(format!("divideSeries({},MISSING)", s.name));
                        map_values(&mut s, |_| None);
                        s
                    })
                    .collect()),
                1 => Ok(dividends
                    .iter()
                    .map(|s1| {
                        let mut both = vec![s1.clone(), divisor[0].clone()];
                        let (start, end, step) = normalize(&mut both).unwrap_or_default();
                        let (a, b) = (both[0].points(), both[1].points());
                        let values = (0..a.len().max(b.len()))
                            .map(|i| {
                                match (a.get(i).copied().flatten(), b.get(i).copied().flatten()) {
                                    (Some(x), Some(y)) if y != 0.0 => Some(x / y),
                                    _ => None,
                                }
                            })
                            .collect();
                        let name = format!("divideSeries({},{})", s1.name, divisor[0].name);
                        Series::new(&name, start, end, step, values)
                    })
                    .collect()),
                n => Err(bad(format!(
                    "divideSeries second argument must reference exactly 1 series (got {n})"
                ))),
            }
        }
        "derivative" => {
            let l = list(arg(0, "seriesList"));
            Ok(l.into_iter()
                .map(|mut s| {
                    let mut prev: Point = None;
                    let values = s
                        .points()
                        .into_iter()
                        .map(|v| {
                            let d = match (prev, v) {
                                (Some(p), Some(v)) => Some(v - p),
                                _ => None,
                            };
                            prev = v;
                            d
                        })
                        .collect();
                    s.tags.set("derivative", "1");
                    s.derived(format!("derivative({})", s.name), values)
                })
                .collect())
        }
        "absolute" => Ok(per_value(
            list(arg(0, "seriesList")),
            "absolute",
            None,
            f64::abs,
        )),
        "offset" => {
            let factor = required(arg(1, "factor"), "factor")?.number()?;
            Ok(per_value(
                list(arg(0, "seriesList")),
                "offset",
                Some(factor),
                |v| v + factor,
            ))
        }
        "removeBelowValue" | "removeAboveValue" => {
            let n = required(arg(1, "n"), "n")?.number()?;
            let below = name == "removeBelowValue";
            let mut l = list(arg(0, "seriesList"));
            for s in &mut l {
                s.rename(format!("{name}({}, {})", s.name, percent_g(n)));
                map_values(s, |v| match v {
                    Some(v) if (below && v < n) || (!below && v > n) => None,
                    other => other,
                });
            }
            Ok(l)
        }
        "exclude" | "grep" => {
            let pattern = required(arg(1, "pattern"), "pattern")?.text();
            let re = regex::Regex::new(&pattern)
                .map_err(|e| bad(format!("{name}: bad regular expression {pattern:?}: {e}")))?;
            let keep = name == "grep";
            Ok(list(arg(0, "seriesList"))
                .into_iter()
                .filter(|s| re.is_match(&s.name) == keep)
                .collect())
        }
        "highestMax" | "lowestCurrent" => {
            let n = required(arg(1, "n"), "n")?.number()? as usize;
            let mut l = list(arg(0, "seriesList"));
            let key = |s: &Series| {
                let points = s.points();
                let v = if name == "highestMax" {
                    points.iter().flatten().copied().reduce(f64::max)
                } else {
                    points.iter().rev().flatten().next().copied()
                };
                v.unwrap_or(f64::NEG_INFINITY)
            };
            if name == "highestMax" {
                l.sort_by(|a, b| key(b).total_cmp(&key(a)));
            } else {
                l.sort_by(|a, b| key(a).total_cmp(&key(b)));
            }
            l.truncate(n);
            Ok(l)
        }
        _ => Err(bad(format!(
            "Received request for unknown function: {name}"
        ))),
    }
}

/// Replaces every stored value (graphite-web's in-place `series[i] = f(series[i])`).
/// A function of each value, as graphite-web's `scale`, `offset` and `absolute` apply it: each
/// series renamed `<function>(<name>[,<factor>])` and tagged `<function>=<factor>` (`1` without
/// one).
fn per_value(
    mut list: Vec<Series>,
    function: &str,
    factor: Option<f64>,
    f: impl Fn(f64) -> f64,
) -> Vec<Series> {
    for s in &mut list {
        let (tag, shown) = match factor {
            Some(factor) => (repr_string(factor), format!(",{}", percent_g(factor))),
            None => ("1".to_string(), String::new()),
        };
        s.tags.set(function, tag);
        s.rename(format!("{function}({}{shown})", s.name));
        map_values(s, |v| v.map(&f));
    }
    list
}

fn map_values(s: &mut Series, f: impl Fn(Point) -> Point) {
    for v in &mut s.values {
        *v = f(*v);
    }
}

/// Python's `round(x, 6)`.
fn round6(v: f64) -> f64 {
    let r = (v * 1e6).round() / 1e6;
    if r.is_finite() { r } else { v }
}

/// graphite-web's `_nonNegativeDelta`: the delta, and what becomes the previous value.
fn non_negative_delta(
    val: Point,
    prev: Point,
    max: Option<f64>,
    min: Option<f64>,
) -> (Point, Point) {
    if let (Some(m), Some(v)) = (max, val)
        && v > m
    {
        return (None, None);
    }
    if let (Some(m), Some(v)) = (min, val)
        && v < m
    {
        return (None, None);
    }
    let (Some(v), Some(p)) = (val, prev) else {
        return (None, val);
    };
    if v >= p {
        return (Some(v - p), val);
    }
    if let Some(m) = max {
        return (Some(m + 1.0 + v - p - min.unwrap_or(0.0)), val);
    }
    if let Some(m) = min {
        return (Some(v - m), val);
    }
    (None, val)
}

/// Python's replacement text (`\1`, `\g<1>`, `\g<name>`) in the regex crate's (`${1}`).
fn python_replacement(replace: &str) -> String {
    let chars: Vec<char> = replace.chars().collect();
    let mut out = String::new();
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '$' => out.push_str("$$"),
            '\\' if i + 1 < chars.len() => {
                let next = chars[i + 1];
                if next.is_ascii_digit() {
                    let digits: String = chars[i + 1..]
                        .iter()
                        .take(2)
                        .take_while(|c| c.is_ascii_digit())
                        .collect();
                    out.push_str(&format!("${{{digits}}}"));
                    i += 1 + digits.len();
                    continue;
                }
                if next == 'g'
                    && chars.get(i + 2) == Some(&'<')
                    && let Some(close) = chars[i + 3..].iter().position(|c| *c == '>')
                {
                    let group: String = chars[i + 3..i + 3 + close].iter().collect();
                    out.push_str(&format!("${{{group}}}"));
                    i += 4 + close;
                    continue;
                }
                match next {
                    'n' => out.push('\n'),
                    't' => out.push('\t'),
                    '\\' => out.push('\\'),
                    other => {
                        out.push('\\');
                        out.push(other);
                    }
                }
                i += 2;
                continue;
            }
            c => out.push(c),
        }
        i += 1;
    }
    out
}

/// `'1min'`, `'1h'`: seconds (graphite-web's `parseTimeOffset`).
pub fn interval_secs(text: &str) -> Result<i64, GraphiteError> {
    let secs = super::attime::parse(&format!("now+{}", text.trim_start_matches(['+', '-'])), 0)
        .map_err(bad)?;
    if secs <= 0 {
        return Err(bad(format!("interval {text:?} is not positive")));
    }
    Ok(secs)
}

/// graphite-web's `_summarizeValues`.
fn summarize_values(
    s: &Series,
    f: fn(&[Point]) -> Point,
    interval: i64,
    start: i64,
    end: i64,
) -> (Vec<Point>, i64) {
    let points = s.points();
    let step = s.step * s.values_per_point.max(1) as i64;
    let stamps: Vec<i64> = (0..)
        .map(|i| s.start + i * step)
        .take_while(|t| *t < s.end)
        .collect();
    let n = stamps.len().min(points.len());
    let interval_points = interval as f64 / s.step as f64;
    let (mut i, mut t) = (0usize, start);
    let mut out = Vec::new();
    while t < end {
        let mut first = i;
        let mut non_null = 0;
        while i < n && stamps[i] < t + interval {
            if stamps[i] <= t {
                first = i;
            }
            if stamps[i] >= t && points[i].is_some() {
                non_null += 1;
            }
            i += 1;
        }
        let enough = non_null > 0 && non_null as f64 / interval_points >= s.x_files_factor;
        out.push(if enough { f(&points[first..i]) } else { None });
        t += interval;
    }
    (out, t)
}

/// Groups by `key` (first-seen order) and aggregates each group with `callback` (a function's
/// name or an aggregation); the group's series is named by its key.
fn group_by(
    list: Vec<Series>,
    callback: &str,
    key: impl Fn(&Series) -> String,
    tags_from_key: bool,
) -> Result<Vec<Series>, GraphiteError> {
    let mut keys: Vec<String> = Vec::new();
    let mut groups: HashMap<String, Vec<Series>> = HashMap::new();
    for s in list {
        let k = key(&s);
        if !groups.contains_key(&k) {
            keys.push(k.clone());
        }
        groups.entry(k).or_default().push(s);
    }
    let mut out = Vec::new();
    for k in keys {
        let group = groups.remove(&k).unwrap_or_default();
        let func = match callback {
            "sumSeries" | "sum" => "sum",
            "averageSeries" | "avg" => "average",
            "maxSeries" => "max",
            "minSeries" => "min",
            other => other,
        };
        let Some(mut s) = aggregate(group, func)?.pop() else {
            continue;
        };
        s.name = k.clone();
        if tags_from_key {
            // graphite-web parses the key as a tagged name: a series without one of the tags
            // makes an empty value, which it refuses.
            if super::tags_of(&k).is_none() {
                return Err(bad(format!(
                    "groupByTags: a series lacks one of the tags, so {k:?} is no tagged name"
                )));
            }
            s.path_expression = k.clone();
            s.tags = Tags::of_name(&k);
        }
        out.push(s);
    }
    Ok(out)
}

/// `asPercent(seriesList, total=None, *nodes)`.
fn as_percent(
    mut list: Vec<Series>,
    total: Option<Arg>,
    nodes: &[Arg],
) -> Result<Vec<Series>, GraphiteError> {
    normalize(&mut list);
    let percent = |v: Point, t: Point| match (v, t) {
        (Some(v), Some(t)) if t != 0.0 => Some(v / t * 100.0),
        _ => None,
    };
    let sum_of = |group: &mut Vec<Series>| -> Series {
        if group.len() == 1 {
            return group[0].clone();
        }
        let name = format!("sumSeries({})", path_expressions(group));
        let (start, end, step) = normalize(group).unwrap_or_default();
        let values = rows(group)
            .iter()
            .map(|r| agg_func("sum").and_then(|f| f(r)))
            .collect();
        Series::new(&name, start, end, step, values)
    };
    let pair = |s1: &Series, s2: &Series| -> Series {
        let mut both = vec![s1.clone(), s2.clone()];
        let (start, end, step) = normalize(&mut both).unwrap_or_default();
        let (a, b) = (both[0].points(), both[1].points());
        let n = a.len().max(b.len());
        let values = (0..n)
            .map(|i| percent(a.get(i).copied().flatten(), b.get(i).copied().flatten()))
            .collect();
        Series::new(
            &format!("asPercent({},{})", s1.name, s2.name),
            start,
            end,
            step,
            values,
        )
    };
    if !nodes.is_empty() {
        let mut keys: Vec<String> = Vec::new();
        let mut groups: HashMap<String, Vec<Series>> = HashMap::new();
        for s in &list {
            let k = agg_key(s, nodes);
            if !groups.contains_key(&k) {
                keys.push(k.clone());
            }
            groups.entry(k).or_default().push(s.clone());
        }
        let mut totals: HashMap<String, Series> = HashMap::new();
        match total {
            None => {
                for k in &keys {
                    let t = sum_of(groups.get_mut(k).expect("grouped"));
                    totals.insert(k.clone(), t);
                }
            }
            Some(Arg::Series(total)) => {
                let mut by_key: HashMap<String, Vec<Series>> = HashMap::new();
                for s in total {
                    let k = agg_key(&s, nodes);
                    if !keys.contains(&k) {
                        keys.push(k.clone());
                    }
                    by_key.entry(k).or_default().push(s);
                }
                for (k, mut group) in by_key {
                    totals.insert(k, sum_of(&mut group));
                }
            }
            Some(_) => return Err(bad("total must be None or a seriesList".into())),
        }
        let mut out = Vec::new();
        for k in &keys {
            match (groups.get(k), totals.get(k)) {
                (None, Some(t)) => {
                    let mut s = t.with(
                        format!("asPercent(MISSING,{})", t.name),
                        vec![None; t.points().len()],
                    );
                    s.tags = Tags::of_name(&s.name);
                    s.values_per_point = 1;
                    out.push(s);
                }
                (Some(group), None) => {
                    for s1 in group {
                        let mut s = s1.with(
                            format!("asPercent({},MISSING)", s1.name),
                            vec![None; s1.points().len()],
                        );
                        s.tags = Tags::of_name(&s.name);
                        s.values_per_point = 1;
                        out.push(s);
                    }
                }
                (Some(group), Some(t)) => out.extend(group.iter().map(|s1| pair(s1, t))),
                (None, None) => {}
            }
        }
        return Ok(out);
    }
    let (total_values, total_text): (Vec<Point>, String) = match &total {
        None => (
            rows(&list)
                .iter()
                .map(|r| agg_func("sum").and_then(|f| f(r)))
                .collect(),
            format!("sumSeries({})", path_expressions(&list)),
        ),
        Some(Arg::Series(t)) => {
            if t.len() != 1 && t.len() != list.len() {
                return Err(bad("asPercent second argument must be missing, a single digit, reference exactly 1 series or reference the same number of series as the first argument".into()));
            }
            if t.len() == list.len() && t.len() != 1 {
                let mut a = list.clone();
                let mut b = t.clone();
                a.sort_by(|x, y| x.name.cmp(&y.name));
                b.sort_by(|x, y| x.name.cmp(&y.name));
                return Ok(a.iter().zip(&b).map(|(s1, s2)| pair(s1, s2)).collect());
            }
            let mut both: Vec<Series> = list.iter().cloned().chain(t.iter().cloned()).collect();
            normalize(&mut both);
            let total = both.pop().expect("the total");
            list = both;
            (total.points(), total.name.clone())
        }
        Some(other) => {
            let v = other.number()?;
            let n = list.first().map_or(0, |s| s.points().len());
            (vec![Some(v); n], other.python_str())
        }
    };
    Ok(list
        .iter()
        .map(|s| {
            let points = s.points();
            let n = points.len().max(total_values.len());
            let values = (0..n)
                .map(|i| {
                    percent(
                        points.get(i).copied().flatten(),
                        total_values.get(i).copied().flatten(),
                    )
                })
                .collect();
            Series::new(
                &format!("asPercent({},{total_text})", s.name),
                s.start,
                s.end,
                s.step,
                values,
            )
        })
        .collect())
}

/// `sortByName(natural=true)`'s key: every run of digits padded to ten.
fn natural_key(name: &str) -> String {
    let mut out = String::new();
    let mut digits = String::new();
    for c in name.chars().chain(std::iter::once('\0')) {
        if c.is_ascii_digit() {
            digits.push(c);
            continue;
        }
        if !digits.is_empty() {
            let n: u128 = digits.parse().unwrap_or(0);
            out.push_str(&format!("{n:010}"));
            digits.clear();
        }
        if c != '\0' {
            out.push(c);
        }
    }
    out
}

/// `movingAverage`'s window: points for a count, seconds for an interval.
pub enum Window {
    Points(i64),
    Interval(i64, String),
}

impl Window {
    pub fn of(arg: &Arg) -> Result<Window, GraphiteError> {
        match arg {
            Arg::Str(text) => Ok(Window::Interval(interval_secs(text)?.abs(), text.clone())),
            other => Ok(Window::Points(other.number()? as i64)),
        }
    }
}

/// `movingAverage` over series fetched `preview` seconds earlier than the request (the caller
/// fetched them).
pub fn moving_average(fetched: Vec<Series>, window: &Window, preview: i64) -> Vec<Series> {
    fetched
        .into_iter()
        .map(|mut s| {
            let (name, points, tag) = match window {
                Window::Interval(_, text) => (
                    format!("movingAverage({},\"{text}\")", s.name),
                    (preview / s.step) as usize,
                    text.clone(),
                ),
                Window::Points(n) => (
                    format!("movingAverage({},{n})", s.name),
                    *n as usize,
                    n.to_string(),
                ),
            };
            s.tags.set("movingAverage", tag);
            let values = s.points();
            let out: Vec<Point> = (points..values.len())
                .map(|i| {
                    let present: Vec<f64> =
                        values[i - points..i].iter().flatten().copied().collect();
                    (!present.is_empty()
                        && present.len() as f64 / points as f64 >= s.x_files_factor)
                        .then(|| sum(&present) / present.len() as f64)
                })
                .collect();
            let mut new = s.derived(name, out);
            new.start = s.start + preview;
            new
        })
        .collect()
}

/// A function's group and parameters (name, type, required; `*` before a name: repeated), as
/// `/functions` lists them.
pub fn signature(name: &str) -> (&'static str, Vec<(&'static str, &'static str, bool)>) {
    let series = ("seriesList", "seriesList", true);
    let lists = ("*seriesLists", "seriesList", true);
    match name {
        "sumSeries" | "sum" | "averageSeries" | "avg" | "maxSeries" | "minSeries" => {
            ("Combine", vec![lists])
        }
        "aggregate" => (
            "Combine",
            vec![
                series,
                ("func", "aggFunc", true),
                ("xFilesFactor", "float", false),
            ],
        ),
        "alias" => ("Alias", vec![series, ("newName", "string", true)]),
        "aliasSub" => (
            "Alias",
            vec![
                series,
                ("search", "string", true),
                ("replace", "string", true),
            ],
        ),
        "aliasByNode" => ("Alias", vec![series, ("*nodes", "nodeOrTag", true)]),
        "aliasByTags" => ("Alias", vec![series, ("*tags", "nodeOrTag", true)]),
        "asPercent" => (
            "Combine",
            vec![
                series,
                ("total", "any", false),
                ("*nodes", "nodeOrTag", false),
            ],
        ),
        "consolidateBy" => (
            "Special",
            vec![series, ("consolidationFunc", "string", true)],
        ),
        "constantLine" => ("Special", vec![("value", "float", true)]),
        "groupByNode" => (
            "Combine",
            vec![
                series,
                ("nodeNum", "nodeOrTag", true),
                ("callback", "aggOrSeriesFunc", false),
            ],
        ),
        "groupByNodes" => (
            "Combine",
            vec![
                series,
                ("callback", "aggOrSeriesFunc", true),
                ("*nodes", "nodeOrTag", false),
            ],
        ),
        "groupByTags" => (
            "Combine",
            vec![
                series,
                ("callback", "aggOrSeriesFunc", true),
                ("*tags", "tag", true),
            ],
        ),
        "highestCurrent" => ("Filter Series", vec![series, ("n", "integer", true)]),
        "integral" => ("Transform", vec![series]),
        "keepLastValue" => ("Transform", vec![series, ("limit", "intOrInf", false)]),
        "limit" => ("Filter Series", vec![series, ("n", "integer", true)]),
        "movingAverage" => (
            "Calculate",
            vec![series, ("windowSize", "intOrInterval", true)],
        ),
        "nonNegativeDerivative" | "perSecond" => (
            "Transform",
            vec![
                series,
                ("maxValue", "float", false),
                ("minValue", "float", false),
            ],
        ),
        "scale" => ("Transform", vec![series, ("factor", "float", true)]),
        "scaleToSeconds" => ("Transform", vec![series, ("seconds", "float", true)]),
        "seriesByTag" => ("Special", vec![("*tagExpressions", "string", true)]),
        "sortByName" => (
            "Sorting",
            vec![
                series,
                ("natural", "boolean", false),
                ("reverse", "boolean", false),
            ],
        ),
        "summarize" => (
            "Transform",
            vec![
                series,
                ("intervalString", "interval", true),
                ("func", "aggFunc", false),
                ("alignToFrom", "boolean", false),
            ],
        ),
        "transformNull" => ("Transform", vec![series, ("default", "float", false)]),
        "diffSeries" | "countSeries" => ("Combine", vec![lists]),
        "divideSeries" => (
            "Combine",
            vec![
                ("dividendSeriesList", "seriesList", true),
                ("divisorSeries", "seriesList", true),
            ],
        ),
        "derivative" | "absolute" => ("Transform", vec![series]),
        "offset" => ("Transform", vec![series, ("factor", "float", true)]),
        "removeBelowValue" | "removeAboveValue" => {
            ("Filter Data", vec![series, ("n", "float", true)])
        }
        "exclude" | "grep" => ("Filter Series", vec![series, ("pattern", "string", true)]),
        "highestMax" | "lowestCurrent" => ("Filter Series", vec![series, ("n", "integer", true)]),
        "timeShift" => (
            "Transform",
            vec![
                series,
                ("timeShift", "interval", true),
                ("resetEnd", "boolean", false),
            ],
        ),
        _ => ("Special", vec![]),
    }
}

/// One line on what a function does, for `/functions`.
pub fn description(name: &str) -> &'static str {
    match name {
        "sumSeries" | "sum" => "Adds the series point by point.",
        "averageSeries" | "avg" => "The average of the series point by point.",
        "maxSeries" => "The largest of the series point by point.",
        "minSeries" => "The smallest of the series point by point.",
        "aggregate" => "Combines the series point by point with an aggregation function.",
        "alias" => "Names every series newName.",
        "aliasSub" => {
            "Renames the series with a regular expression and its replacement (\\1 for a group)."
        }
        "aliasByNode" => "Names each series by nodes of its name, or by its tags.",
        "aliasByTags" => "Names each series by its tags, or nodes of its name.",
        "asPercent" => "Each series as a percent of a total: their sum, a series, or a number.",
        "consolidateBy" => "How points are combined when there are more than maxDataPoints.",
        "constantLine" => "A line at the value across the range.",
        "groupByNode" => "Groups the series by a node and combines each group.",
        "groupByNodes" => "Groups the series by nodes and combines each group.",
        "groupByTags" => "Groups the series by tags and combines each group.",
        "highestCurrent" => "The n series whose last value is highest.",
        "integral" => "The running total of each series.",
        "keepLastValue" => "Fills gaps with the last value seen, up to limit points.",
        "limit" => "The first n series.",
        "movingAverage" => "The average of the points in a moving window before each point.",
        "nonNegativeDerivative" => "The change from the previous point, null where it decreases.",
        "perSecond" => "The change from the previous point per second, null where it decreases.",
        "scale" => "Multiplies every point by factor.",
        "scaleToSeconds" => "Every point as a value per that many seconds.",
        "seriesByTag" => "The series whose tags match every expression (=, !=, =~, !=~).",
        "sortByName" => "Sorts the series by name.",
        "summarize" => "Combines the points of each interval into one.",
        "transformNull" => "Replaces nulls with default.",
        "diffSeries" => "Subtracts the other series from the first, point by point.",
        "countSeries" => "How many series there are, at every point.",
        "divideSeries" => "Divides each series by one divisor series, point by point.",
        "derivative" => "The change from the previous point.",
        "absolute" => "The absolute value of every point.",
        "offset" => "Adds factor to every point.",
        "removeBelowValue" => "Nulls the points below n.",
        "removeAboveValue" => "Nulls the points above n.",
        "exclude" => "The series whose name the regular expression does not match.",
        "grep" => "The series whose name the regular expression matches.",
        "highestMax" => "The n series with the highest maximum.",
        "lowestCurrent" => "The n series whose last value is lowest.",
        "timeShift" => "The series as they were that long before (`1d`, `7d`), drawn over now.",
        _ => "",
    }
}
