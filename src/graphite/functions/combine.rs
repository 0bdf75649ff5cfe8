//! graphite-web's Combine group: functions that make fewer series of many.

use super::Type::*;
use super::*;
use crate::graphite::pyfmt::percent_g;
use crate::graphite::series::Tags;

const FIRST: Param = Param::new("seriesListFirstPos", SeriesList).required();
const SECOND: Param = Param::new("seriesListSecondPos", SeriesList).required();
const FUNC: Param = Param::new("func", AggFunc).required();
const XFF: Param = Param::new("xFilesFactor", Float);
const POSITION: Param = Param::new("position", Node).multiple();
const OPTIONAL_LISTS: Param = Param::new("seriesLists", SeriesList).multiple();

pub(super) const FUNCTIONS: &[Function] = &[
    Function::new(
        "aggregate",
        Group::Combine,
        &[SERIES, FUNC, XFF],
        Body::Apply(|a, ctx| {
            let func = a.text(1);
            aggregate(a.series(0), &func, a.opt_float(2), ctx)
        }),
        "Combines the series point by point with an aggregation function.",
    ),
    Function::new(
        "aggregateSeriesLists",
        Group::Combine,
        &[FIRST, SECOND, FUNC, XFF],
        Body::Apply(|a, ctx| {
            let func = a.text(2);
            pairwise(a, ctx, &func)
        }),
        "Combines the nth series of the first list with the nth of the second.",
    ),
    Function::new(
        "aggregateWithWildcards",
        Group::Combine,
        &[SERIES, FUNC, POSITION],
        Body::Apply(|a, ctx| {
            let func = a.text(1);
            with_wildcards(a, ctx, &func)
        }),
        "Combines the series whose names are alike but for the nodes at the positions.",
    ),
    Function::new(
        "applyByNode",
        Group::Combine,
        &[
            SERIES,
            Param::new("nodeNum", Node).required(),
            Param::new("templateFunction", Str).required(),
            Param::new("newName", Str),
        ],
        Body::Shaped(apply_by_node_plan, apply_by_node),
        "Evaluates the template (with % for the name up to nodeNum) once per such name.",
    ),
    Function::new(
        "asPercent",
        Group::Combine,
        &[
            SERIES,
            Param::new("total", Any),
            Param::new("nodes", NodeOrTag).multiple(),
        ],
        Body::Apply(|a, ctx| {
            let total = a.arg(1);
            let nodes = a.rest().to_vec();
            as_percent(a.series(0), total, &nodes, ctx)
        }),
        "Each series as a percent of a total: their sum, a series, or a number.",
    )
    .aliases(&["pct"])
    .aggregator(),
    Function::new(
        "averageSeries",
        Group::Combine,
        &[LISTS],
        Body::Apply(|a, ctx| aggregate(a.all_series(), "average", None, ctx)),
        "The average of the series point by point.",
    )
    .aliases(&["avg"])
    .aggregator(),
    Function::new(
        "averageSeriesWithWildcards",
        Group::Combine,
        &[SERIES, POSITION],
        Body::Apply(|a, ctx| with_wildcards(a, ctx, "average")),
        "The average of the series alike but for the nodes at the positions.",
    )
    .aggregator(),
    Function::new(
        "countSeries",
        Group::Combine,
        &[OPTIONAL_LISTS],
        Body::Apply(|a, ctx| {
            let given = !a.rest().is_empty();
            let mut list = a.all_series();
            if !given {
                let mut line = special::constant_line("0", Some(0.0), ctx)?;
                line.path_expression = "countSeries()".into();
                return Ok(vec![line]);
            }
            let Some((start, end, step)) = normalize(&mut list) else {
                return Ok(Vec::new());
            };
            let name = format!("countSeries({})", path_expressions(&list));
            let values = rows(&list).iter().map(|r| Some(r.len() as f64)).collect();
            let mut s = Series::new(&name, start, end, step, values);
            s.x_files_factor = ctx.xff(None);
            Ok(vec![s])
        }),
        "How many series there are, at every point.",
    )
    .aggregator(),
    Function::new(
        "diffSeries",
        Group::Combine,
        &[LISTS],
        Body::Apply(|a, ctx| aggregate(a.all_series(), "diff", None, ctx)),
        "Subtracts the other series from the first, point by point.",
    )
    .aggregator(),
    Function::new(
        "diffSeriesLists",
        Group::Combine,
        &[FIRST, SECOND],
        Body::Apply(|a, ctx| pairwise(a, ctx, "diff")),
        "Subtracts the nth series of the second list from the nth of the first.",
    )
    .aggregator(),
    Function::new(
        "divideSeries",
        Group::Combine,
        &[
            Param::new("dividendSeriesList", SeriesList).required(),
            Param::new("divisorSeries", SeriesList).required(),
        ],
        Body::Apply(|a, ctx| {
            let dividends = a.series(0);
            let divisor = a.series(1);
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
                    .map(|s| quotient(s, &divisor[0], ctx))
                    .collect()),
                n => Err(bad(format!(
                    "divideSeries second argument must reference exactly 1 series (got {n})"
                ))),
            }
        }),
        "Divides each series by one divisor series, point by point.",
    ),
    Function::new(
        "divideSeriesLists",
        Group::Combine,
        &[
            Param::new("dividendSeriesList", SeriesList).required(),
            Param::new("divisorSeriesList", SeriesList).required(),
        ],
        Body::Apply(|a, ctx| {
            let (dividends, divisors) = (a.series(0), a.series(1));
            if dividends.len() != divisors.len() {
                return Err(bad(
                    "dividendSeriesList and divisorSeriesList argument must have equal length"
                        .into(),
                ));
            }
            Ok(dividends
                .iter()
                .zip(&divisors)
                .map(|(s, d)| quotient(s, d, ctx))
                .collect())
        }),
        "Divides the nth series of the first list by the nth of the second.",
    ),
    Function::new(
        "group",
        Group::Combine,
        &[OPTIONAL_LISTS],
        Body::Apply(|a, _| Ok(a.all_series())),
        "The series of every list, as one list.",
    ),
    Function::new(
        "groupByNode",
        Group::Combine,
        &[
            SERIES,
            Param::new("nodeNum", NodeOrTag).required(),
            Param::new("callback", AggOrSeriesFunc).default(Lit::Str("average")),
        ],
        Body::Apply(|a, ctx| {
            let node = a.arg(1).unwrap_or(Arg::None);
            let callback = a.text(2);
            group_by_nodes(a.series(0), &callback, &[node], ctx)
        }),
        "Groups the series by a node (or tag) and combines each group.",
    ),
    Function::new(
        "groupByNodes",
        Group::Combine,
        &[
            SERIES,
            Param::new("callback", AggOrSeriesFunc).required(),
            Param::new("nodes", NodeOrTag).multiple(),
        ],
        Body::Apply(|a, ctx| {
            let callback = a.text(1);
            let nodes = a.rest().to_vec();
            group_by_nodes(a.series(0), &callback, &nodes, ctx)
        }),
        "Groups the series by nodes (or tags) and combines each group.",
    ),
    Function::new(
        "groupByTags",
        Group::Combine,
        &[
            SERIES,
            Param::new("callback", AggOrSeriesFunc).required(),
            Param::new("tags", Tag).required().multiple(),
        ],
        Body::Apply(group_by_tags),
        "Groups the series by tags and combines each group.",
    ),
    Function::new(
        "mapSeries",
        Group::Combine,
        &[
            SERIES,
            Param::new("mapNodes", NodeOrTag).required().multiple(),
        ],
        Body::Apply(|a, _| {
            let nodes = a.rest().to_vec();
            Ok(group_in_order(a.series(0), |s| agg_key(s, &nodes))
                .into_iter()
                .flat_map(|(_, group)| group)
                .collect())
        }),
        "Groups the series by nodes, for reduceSeries (the groups in order, as one list).",
    )
    .aliases(&["map"]),
    Function::new(
        "maxSeries",
        Group::Combine,
        &[LISTS],
        Body::Apply(|a, ctx| aggregate(a.all_series(), "max", None, ctx)),
        "The largest of the series point by point.",
    )
    .aggregator(),
    Function::new(
        "minSeries",
        Group::Combine,
        &[LISTS],
        Body::Apply(|a, ctx| aggregate(a.all_series(), "min", None, ctx)),
        "The smallest of the series point by point.",
    )
    .aggregator(),
    Function::new(
        "multiplySeries",
        Group::Combine,
        &[LISTS],
        Body::Apply(|a, ctx| {
            let lists = a.lists();
            if lists.len() == 1 && lists[0].len() == 1 {
                return Ok(lists.into_iter().flatten().collect());
            }
            aggregate(lists.into_iter().flatten().collect(), "multiply", None, ctx)
        }),
        "Multiplies the series point by point.",
    )
    .aggregator(),
    Function::new(
        "multiplySeriesLists",
        Group::Combine,
        &[FIRST, SECOND],
        Body::Apply(|a, ctx| pairwise(a, ctx, "multiply")),
        "Multiplies the nth series of the first list by the nth of the second.",
    )
    .aggregator(),
    Function::new(
        "multiplySeriesWithWildcards",
        Group::Combine,
        &[SERIES, POSITION],
        Body::Apply(|a, ctx| with_wildcards(a, ctx, "multiply")),
        "Multiplies the series alike but for the nodes at the positions.",
    )
    .aggregator(),
    Function::new(
        "percentileOfSeries",
        Group::Combine,
        &[
            SERIES,
            Param::new("n", Float).required(),
            Param::new("interpolate", Boolean).default(Lit::Bool(false)),
        ],
        Body::Apply(|a, ctx| {
            let (n, interpolate) = (a.float(1), a.boolean(2));
            if n <= 0.0 {
                return Err(bad(
                    "The requested percent is required to be greater than 0".into(),
                ));
            }
            let mut list = a.series(0);
            let Some(first) = list.first() else {
                return Ok(Vec::new());
            };
            let name = format!(
                "percentileOfSeries({},{})",
                first.path_expression,
                percent_g(n)
            );
            let (start, end, step) = normalize(&mut list).unwrap_or_default();
            let values = rows(&list)
                .iter()
                .map(|row| percentile(row, n, interpolate))
                .collect();
            let mut s = Series::new(&name, start, end, step, values);
            s.x_files_factor = ctx.xff(None);
            Ok(vec![s])
        }),
        "The nth percentile of the series at every point.",
    ),
    Function::new(
        "powSeries",
        Group::Combine,
        &[Param::new("seriesList", SeriesList).required().multiple()],
        Body::Apply(|a, ctx| {
            let mut list = a.all_series();
            let Some((start, end, step)) = normalize(&mut list) else {
                return Ok(Vec::new());
            };
            let names: Vec<&str> = list.iter().map(|s| s.name.as_str()).collect();
            let name = format!("powSeries({})", names.join(","));
            let values = rows(&list)
                .iter()
                .map(|row| row.iter().copied().reduce(safe_pow).flatten())
                .collect();
            let mut s = Series::new(&name, start, end, step, values);
            s.x_files_factor = ctx.xff(None);
            Ok(vec![s])
        }),
        "The first series to the power of the second, to the power of the third…",
    )
    .aggregator(),
    Function::new(
        "rangeOfSeries",
        Group::Combine,
        &[LISTS],
        Body::Apply(|a, ctx| aggregate(a.all_series(), "rangeOf", None, ctx)),
        "The largest minus the smallest of the series, point by point.",
    )
    .aggregator(),
    Function::new(
        "reduceSeries",
        Group::Combine,
        &[
            Param::new("seriesLists", SeriesLists).required(),
            Param::new("reduceFunction", Str).required(),
            Param::new("reduceNode", Node).required(),
            Param::new("reduceMatchers", Str).required().multiple(),
        ],
        Body::Apply(reduce_series),
        "Reduces the series that mapSeries grouped, by a function of those at each matcher.",
    )
    .aliases(&["reduce"]),
    Function::new(
        "stddevSeries",
        Group::Combine,
        &[LISTS],
        Body::Apply(|a, ctx| aggregate(a.all_series(), "stddev", None, ctx)),
        "The standard deviation of the series, point by point.",
    )
    .aggregator(),
    Function::new(
        "sumSeries",
        Group::Combine,
        &[LISTS],
        Body::Apply(|a, ctx| aggregate(a.all_series(), "sum", None, ctx)),
        "Adds the series point by point.",
    )
    .aliases(&["sum"])
    .aggregator(),
    Function::new(
        "sumSeriesLists",
        Group::Combine,
        &[FIRST, SECOND],
        Body::Apply(|a, ctx| pairwise(a, ctx, "sum")),
        "Adds the nth series of the first list to the nth of the second.",
    )
    .aggregator(),
    Function::new(
        "sumSeriesWithWildcards",
        Group::Combine,
        &[SERIES, POSITION],
        Body::Apply(|a, ctx| with_wildcards(a, ctx, "sum")),
        "Adds the series alike but for the nodes at the positions.",
    )
    .aggregator(),
    Function::new(
        "weightedAverage",
        Group::Combine,
        &[
            Param::new("seriesListAvg", SeriesList).required(),
            Param::new("seriesListWeight", SeriesList).required(),
            Param::new("nodes", NodeOrTag).multiple(),
        ],
        Body::Apply(weighted_average),
        "The average of the first list weighted by the second, matched by nodes.",
    ),
];

/// graphite-web's `aggregateSeriesLists`: the nth of each list combined.
fn pairwise(a: &mut Args, ctx: &mut Ctx, func: &str) -> Result<Vec<Series>> {
    let (first, second) = (a.series(0), a.series(1));
    // `aggregateSeriesLists`' own xFilesFactor (the others have no fourth parameter).
    let xff = a.opt_float(3);
    if first.len() != second.len() {
        return Err(bad(
            "seriesListFirstPos and seriesListSecondPos argument must have equal length".into(),
        ));
    }
    let mut out = Vec::new();
    for (s1, s2) in first.into_iter().zip(second) {
        let names = format!("{},{}", s1.name, s2.name);
        let Some(mut s) = aggregate(vec![s1, s2], func, xff, ctx)?.pop() else {
            continue;
        };
        let head = s
            .name
            .find("Series(")
            .map_or("", |i| &s.name[..i])
            .to_string();
        s.name = format!("{head}Series({names})");
        out.push(s);
    }
    Ok(out)
}

/// graphite-web's `aggregateWithWildcards`: grouped by the name without the positions' nodes.
fn with_wildcards(a: &mut Args, ctx: &mut Ctx, func: &str) -> Result<Vec<Series>> {
    let positions: Vec<i64> = a.rest().iter().filter_map(Arg::as_index).collect();
    let key = |s: &Series| {
        s.name
            .split('.')
            .enumerate()
            .filter(|(i, _)| !positions.contains(&(*i as i64)))
            .map(|(_, n)| n)
            .collect::<Vec<_>>()
            .join(".")
    };
    let mut out = Vec::new();
    for (k, group) in group_in_order(a.series(0), key) {
        if let Some(mut s) = aggregate(group, func, None, ctx)?.pop() {
            s.name = k;
            out.push(s);
        }
    }
    Ok(out)
}

/// graphite-web's `groupByNodes`.
fn group_by_nodes(
    list: Vec<Series>,
    callback_name: &str,
    nodes: &[Arg],
    ctx: &mut Ctx,
) -> Result<Vec<Series>> {
    let mut out = Vec::new();
    for (k, group) in group_in_order(list, |s| agg_key(s, nodes)) {
        if let Some(mut s) = callback(callback_name, group, ctx)? {
            s.name = k;
            out.push(s);
        }
    }
    Ok(out)
}

/// graphite-web's `groupByTags`: the key a tagged name of the tags (`name` first, the common one
/// or the callback's), which the group's series then carries.
fn group_by_tags(a: &mut Args, ctx: &mut Ctx) -> Result<Vec<Series>> {
    let callback_name = a.text(1);
    let tags: Vec<String> = a.rest().iter().map(Arg::text).collect();
    if tags.is_empty() {
        return Err(bad("groupByTags(): no tags specified".into()));
    }
    let list = a.series(0);
    let names: std::collections::BTreeSet<&str> =
        list.iter().filter_map(|s| s.tags.get("name")).collect();
    let common = if names.len() == 1 {
        names.into_iter().next().unwrap_or_default().to_string()
    } else {
        callback_name.clone()
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
    let mut out = Vec::new();
    for (k, group) in group_in_order(list, key) {
        let Some(mut s) = callback(&callback_name, group, ctx)? else {
            continue;
        };
        // graphite-web parses the key as a tagged name: a series without one of the tags
        // makes an empty value, which it refuses.
        if crate::graphite::tags_of(&k).is_none() {
            return Err(bad(format!(
                "groupByTags: a series lacks one of the tags, so {k:?} is no tagged name"
            )));
        }
        s.name = k.clone();
        s.path_expression = k.clone();
        s.tags = Tags::of_name(&k);
        out.push(s);
    }
    Ok(out)
}

/// Python's `'.'.join(nodes[a:b])`.
fn node_slice(nodes: &[&str], from: Option<i64>, to: Option<i64>) -> String {
    nodes[python_range(nodes.len(), from, to)].join(".")
}

/// graphite-web's `reduceSeries`: per name up to `reduceNode`, the series whose node there is
/// each matcher, given to the function one list each.
fn reduce_series(a: &mut Args, ctx: &mut Ctx) -> Result<Vec<Series>> {
    let function = a.text(1);
    let node = a.int(2);
    let matchers: Vec<String> = a.rest().iter().map(Arg::text).collect();
    let mut keys: Vec<String> = Vec::new();
    let mut groups: HashMap<String, Vec<Option<Series>>> = HashMap::new();
    for s in a.series(0) {
        let nodes: Vec<&str> = s.name.split('.').collect();
        let at = if node < 0 {
            nodes.len() as i64 + node
        } else {
            node
        };
        let Some(this) = usize::try_from(at).ok().and_then(|i| nodes.get(i)) else {
            return Err(bad(format!("reduceSeries: {} has no node {node}", s.name)));
        };
        let key = format!(
            "{}.reduce.{function}",
            node_slice(&nodes, Some(0), Some(node))
        );
        if let Some(i) = matchers.iter().position(|m| m == this) {
            let slot = groups.entry(key.clone()).or_insert_with(|| {
                keys.push(key.clone());
                vec![None; matchers.len()]
            });
            slot[i] = Some(s);
        }
    }
    let mut out = Vec::new();
    for k in keys {
        let group = groups.remove(&k).unwrap_or_default();
        let lists = group
            .into_iter()
            .map(|s| {
                s.map(|s| Arg::Series(vec![s]))
                    .ok_or_else(|| bad(format!("reduceSeries: {k} lacks a series for a matcher")))
            })
            .collect::<Result<Vec<Arg>>>()?;
        if let Some(mut s) = call(&function, lists, ctx)?.into_iter().next() {
            s.name = k;
            out.push(s);
        }
    }
    Ok(out)
}

fn apply_by_node_plan(a: &Args, _: &Ctx) -> Result<Vec<Fetch>> {
    let template = a.text(2);
    Ok(prefixes(a)
        .into_iter()
        .map(|p| Fetch::Target(template.replace('%', &p)))
        .collect())
}

/// `applyByNode`'s prefixes: each name up to `nodeNum`, distinct, sorted.
fn prefixes(a: &Args) -> Vec<String> {
    let node = a.int(1);
    let mut prefixes: Vec<String> = a
        .peek_series(0)
        .iter()
        .map(|s| {
            let nodes: Vec<&str> = s.name.split('.').collect();
            node_slice(&nodes, None, Some(node + 1))
        })
        .collect();
    prefixes.sort();
    prefixes.dedup();
    prefixes
}

fn apply_by_node(a: &mut Args, _: &mut Ctx, fetched: Vec<Vec<Series>>) -> Result<Vec<Series>> {
    let prefixes = prefixes(a);
    let new_name = a.opt_text(3);
    let list = a.series(0);
    let Some(last) = list.last() else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (prefix, results) in prefixes.iter().zip(fetched) {
        for mut s in results {
            if let Some(n) = &new_name {
                s.name = n.replace('%', prefix);
            }
            s.path_expression = prefix.clone();
            s.start = last.start;
            s.end = last.end;
            out.push(s);
        }
    }
    Ok(out)
}

/// `divideSeries` of one series by another, normalized to their common step.
fn quotient(s: &Series, divisor: &Series, ctx: &Ctx) -> Series {
    let mut both = vec![s.clone(), divisor.clone()];
    let (start, end, step) = normalize(&mut both).unwrap_or_default();
    let values = rows(&both).iter().map(|r| safe_div(r[0], r[1])).collect();
    let name = format!("divideSeries({},{})", s.name, divisor.name);
    let mut out = Series::new(&name, start, end, step, values);
    out.x_files_factor = ctx.xff(None);
    out
}

/// graphite-web's `weightedAverage`.
fn weighted_average(a: &mut Args, ctx: &mut Ctx) -> Result<Vec<Series>> {
    let nodes = a.rest().to_vec();
    let (avgs, weights) = (a.series(0), a.series(1));
    if avgs.len() != weights.len() {
        return Err(bad(format!(
            "weightedAverage must receive the same number of series for seriesListAvg and seriesListWeight but received respectively {} and {}",
            avgs.len(),
            weights.len()
        )));
    }
    let mut keys: Vec<String> = Vec::new();
    let mut pairs: HashMap<String, (Option<&Series>, Option<&Series>)> = HashMap::new();
    for (avg, weight) in avgs.iter().zip(&weights) {
        for (s, is_avg) in [(avg, true), (weight, false)] {
            let k = agg_key(s, &nodes);
            let entry = pairs.entry(k.clone()).or_insert_with(|| {
                keys.push(k.clone());
                (None, None)
            });
            if is_avg {
                entry.0 = Some(s);
            } else {
                entry.1 = Some(s);
            }
        }
    }
    let xff = ctx.xff(None);
    let mut products = Vec::new();
    for k in &keys {
        let (Some(avg), Some(weight)) = pairs[k] else {
            continue;
        };
        let (x, w) = (avg.points(), weight.points());
        let values = (0..x.len().max(w.len()))
            .map(|i| {
                let (a, b) = (x.get(i).copied().flatten(), w.get(i).copied().flatten());
                Some(a? * b?)
            })
            .collect();
        let name = format!("product({},{})", weight.name, avg.name);
        let mut p = Series::new(&name, avg.start, avg.end, avg.step, values);
        p.x_files_factor = xff;
        products.push(p);
    }
    if products.is_empty() {
        return Ok(Vec::new());
    }
    let sorted = |list: &[Series]| {
        let set: std::collections::BTreeSet<&str> =
            list.iter().map(|s| s.path_expression.as_str()).collect();
        set.into_iter().collect::<Vec<_>>().join(",")
    };
    let name = format!(
        "weightedAverage({}, {}, {})",
        sorted(&avgs),
        sorted(&weights),
        nodes
            .iter()
            .map(Arg::python_str)
            .collect::<Vec<_>>()
            .join(",")
    );
    let Some(total) = aggregate(products, "sum", None, ctx)?.pop() else {
        return Ok(Vec::new());
    };
    let Some(weight) = aggregate(weights, "sum", None, ctx)?.pop() else {
        return Ok(Vec::new());
    };
    let (t, w) = (total.points(), weight.points());
    let values = (0..t.len().max(w.len()))
        .map(|i| safe_div(t.get(i).copied().flatten(), w.get(i).copied().flatten()))
        .collect();
    let mut s = Series::new(&name, total.start, total.end, total.step, values);
    s.x_files_factor = xff;
    Ok(vec![s])
}

/// `asPercent(seriesList, total=None, *nodes)`.
fn as_percent(
    mut list: Vec<Series>,
    total: Option<Arg>,
    nodes: &[Arg],
    ctx: &Ctx,
) -> Result<Vec<Series>> {
    let xff = ctx.xff(None);
    normalize(&mut list);
    let percent = |v: Point, t: Point| safe_div(v, t).map(|q| q * 100.0);
    let sum_of = |group: &mut Vec<Series>| -> Series {
        if group.len() == 1 {
            return group[0].clone();
        }
        let name = format!("sumSeries({})", path_expressions(group));
        let (start, end, step) = normalize(group).unwrap_or_default();
        let values = rows(group).iter().map(|r| safe_sum(r)).collect();
        let mut s = Series::new(&name, start, end, step, values);
        s.x_files_factor = xff;
        s
    };
    let pair = |s1: &Series, s2: &Series| -> Series {
        let mut both = vec![s1.clone(), s2.clone()];
        let (start, end, step) = normalize(&mut both).unwrap_or_default();
        let values = rows(&both).iter().map(|r| percent(r[0], r[1])).collect();
        let mut s = Series::new(
            &format!("asPercent({},{})", s1.name, s2.name),
            start,
            end,
            step,
            values,
        );
        s.x_files_factor = xff;
        s
    };
    if !nodes.is_empty() {
        let groups = group_in_order(list, |s| agg_key(s, nodes));
        let mut keys: Vec<String> = groups.iter().map(|(k, _)| k.clone()).collect();
        let mut by_key: HashMap<String, Vec<Series>> = groups.into_iter().collect();
        let mut totals: HashMap<String, Series> = HashMap::new();
        match total {
            None => {
                for k in &keys {
                    let t = sum_of(by_key.get_mut(k).expect("grouped"));
                    totals.insert(k.clone(), t);
                }
            }
            Some(Arg::Series(total)) => {
                for (k, mut group) in group_in_order(total, |s| agg_key(s, nodes)) {
                    if !keys.contains(&k) {
                        keys.push(k.clone());
                    }
                    totals.insert(k, sum_of(&mut group));
                }
            }
            Some(_) => return Err(bad("total must be None or a seriesList".into())),
        }
        let mut out = Vec::new();
        for k in &keys {
            match (by_key.get(k), totals.get(k)) {
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
            rows(&list).iter().map(|r| safe_sum(r)).collect(),
            format!("sumSeries({})", path_expressions(&list)),
        ),
        Some(Arg::Series(t)) => {
            if t.len() != 1 && t.len() != list.len() {
                return Err(bad("asPercent second argument must be missing, a single digit, reference exactly 1 series or reference the same number of series as the first argument".into()));
            }
            if t.len() == list.len() {
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
            (total.points().into_owned(), total.name.clone())
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
            let mut out = Series::new(
                &format!("asPercent({},{total_text})", s.name),
                s.start,
                s.end,
                s.step,
                values,
            );
            out.x_files_factor = xff;
            out
        })
        .collect())
}
