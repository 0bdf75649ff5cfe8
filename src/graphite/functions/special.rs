//! graphite-web's Special group: consolidation and xFilesFactor, constant and random series,
//! events, names cut to nodes, fallbacks, legends.

use super::Type::*;
use super::*;
use crate::graphite::series::CONSOLIDATIONS;

pub(super) const FUNCTIONS: &[Function] = &[
    Function::new(
        "cactiStyle",
        Group::Special,
        &[
            SERIES,
            Param::new("system", Str).options(&[Lit::Str("si"), Lit::Str("binary")]),
            Param::new("units", Str),
        ],
        Body::Apply(|a, _| {
            let (system, units) = (a.opt_text(1), a.opt_text(2));
            Ok(cacti_style(
                a.series(0),
                system.as_deref(),
                units.as_deref(),
            ))
        }),
        "Adds the last, largest and smallest value to each name, in columns.",
    ),
    Function::new(
        "changed",
        Group::Special,
        &[SERIES],
        Body::Apply(|a, _| {
            let mut list = a.series(0);
            for s in &mut list {
                s.rename(format!("changed({})", s.name));
                let mut previous: Point = None;
                for v in &mut s.values {
                    let value = *v;
                    *v = Some(match previous {
                        None => {
                            previous = value;
                            0.0
                        }
                        Some(p) if value.is_some_and(|x| x != p) => {
                            previous = value;
                            1.0
                        }
                        Some(_) => 0.0,
                    });
                }
            }
            Ok(list)
        }),
        "1 where the value changed from the one before, else 0.",
    ),
    Function::new(
        "consolidateBy",
        Group::Special,
        &[
            SERIES,
            Param::new("consolidationFunc", Str).required().options(&[
                Lit::Str("sum"),
                Lit::Str("average"),
                Lit::Str("avg"),
                Lit::Str("avg_zero"),
                Lit::Str("min"),
                Lit::Str("max"),
                Lit::Str("first"),
                Lit::Str("last"),
            ]),
        ],
        Body::Apply(|a, _| {
            let func = a.text(1);
            consolidate_by(a.series(0), &func)
        }),
        "How points are combined when there are more than maxDataPoints.",
    ),
    Function::new(
        "constantLine",
        Group::Special,
        &[Param::new("value", Float).required()],
        Body::Apply(|a, ctx| {
            let value = a.float(0);
            Ok(vec![constant_line(&repr_string(value), Some(value), ctx)?])
        }),
        "A line at the value across the range.",
    ),
    Function::new(
        "cumulative",
        Group::Special,
        &[SERIES],
        Body::Apply(|a, _| consolidate_by(a.series(0), "sum")),
        "Points combined by their sum when there are more than maxDataPoints.",
    ),
    Function::new(
        "events",
        Group::Special,
        &[Param::new("tags", Str).required().multiple()],
        Body::Refetch(
            |a, ctx| {
                bounded("events", ctx.until - ctx.from)?;
                let tags: Vec<String> = a.rest().iter().map(Arg::text).collect();
                let all = tags.len() == 1 && tags[0] == "*";
                Ok(vec![Fetch::Events(if all { Vec::new() } else { tags })])
            },
            |a, ctx, fetched| {
                let tags: Vec<String> = a.rest().iter().map(Arg::text).collect();
                let name = format!("events(\"{}\")", tags.join("\", \""));
                let (start, end) = (ctx.from, ctx.until);
                let mut values: Vec<Point> = vec![None; (end - start).max(0) as usize];
                for when in fetched.iter().flatten().flat_map(|s| present(&s.values)) {
                    let at = when as i64 - start;
                    if let Some(v) = usize::try_from(at).ok().and_then(|i| values.get_mut(i)) {
                        *v = Some(v.unwrap_or(0.0) + 1.0);
                    }
                }
                let mut s = Series::new(&name, start, end, 1, values);
                s.consolidation = "sum".into();
                s.x_files_factor = ctx.xff(None);
                Ok(vec![s])
            },
        ),
        "How many DogStatsD events and service checks (with all the tags; `*`: any) there were each second.",
    ),
    Function::new(
        "fallbackSeries",
        Group::Special,
        &[SERIES, Param::new("fallback", SeriesList).required()],
        Body::Apply(|a, _| {
            let list = a.series(0);
            Ok(if list.is_empty() { a.series(1) } else { list })
        }),
        "The series, or the fallback when there are none.",
    ),
    Function::new(
        "randomWalkFunction",
        Group::Special,
        &[
            Param::new("name", Str).required(),
            Param::new("step", Integer).default(Lit::Int(60)),
        ],
        Body::Apply(|a, ctx| {
            let (name, step) = (a.text(0), a.int(1));
            if step <= 0 {
                return Err(bad(format!("step must be positive, got {step}")));
            }
            bounded("this step", (ctx.until - ctx.from) / step)?;
            let mut current = 0.0;
            let values = (ctx.from..ctx.until)
                .step_by(step as usize)
                .map(|_| {
                    let v = current;
                    current += rand::random::<f64>() - 0.5;
                    Some(v)
                })
                .collect();
            let mut s = Series::new(&name, ctx.from, ctx.until, step, values);
            s.x_files_factor = ctx.xff(None);
            Ok(vec![s])
        }),
        "A random walk from 0, a step of at most ±0.5 every step seconds.",
    )
    .aliases(&["randomWalk"]),
    Function::new(
        "seriesByTag",
        Group::Special,
        &[Param::new("tagExpressions", Str).required().multiple()],
        Body::Tagged,
        "The series whose tags match every expression (=, !=, =~, !=~).",
    ),
    Function::new(
        "setXFilesFactor",
        Group::Special,
        &[SERIES, Param::new("xFilesFactor", Float).required()],
        Body::Apply(|a, ctx| {
            let xff = a.float(1);
            ctx.state.xff = Some(xff);
            let mut list = a.series(0);
            for s in &mut list {
                s.x_files_factor = xff;
                s.tags.set("xFilesFactor", repr_string(xff));
            }
            Ok(list)
        }),
        "The share of a consolidated point's values that must be present (else it is null).",
    )
    .aliases(&["xFilesFactor"]),
    Function::new(
        "substr",
        Group::Special,
        &[
            SERIES,
            Param::new("start", Node).default(Lit::Int(0)),
            Param::new("stop", Node).default(Lit::Int(0)),
        ],
        Body::Apply(|a, _| {
            let (start, stop) = (a.int(1), a.int(2));
            Ok(substr(a.series(0), start, stop))
        }),
        "Names each series by the nodes from start to stop of the name inside its calls.",
    ),
];

/// A line at `value` across the request's range: three points, half the range apart, named
/// `name` (graphite-web's `constantLine`).
pub(super) fn constant_line(name: &str, value: Point, ctx: &Ctx) -> Result<Series> {
    let step = (ctx.until - ctx.from) / 2;
    if step == 0 {
        return Err(bad(
            "constantLine needs a range of at least 2 s (it draws 3 points)".into(),
        ));
    }
    let mut s = Series::new(name, ctx.from, ctx.until, step, vec![value; 3]);
    s.path_expression = format!("constantLine({name})");
    s.x_files_factor = ctx.xff(None);
    Ok(s)
}

fn consolidate_by(mut list: Vec<Series>, func: &str) -> Result<Vec<Series>> {
    if !CONSOLIDATIONS.contains(&func) {
        return Err(bad(format!(
            "consolidateBy: {func:?} is none of {}",
            CONSOLIDATIONS.join(", ")
        )));
    }
    for s in &mut list {
        s.consolidation = func.to_string();
        s.tags.set("consolidateBy", func);
        s.rename(format!("consolidateBy({},\"{func}\")", s.name));
    }
    Ok(list)
}

/// graphite-web's `substr`: the nodes `start..stop` (Python's slice; 0 for the end) of the
/// name inside its calls, cut at its first comma.
pub(super) fn substr(mut list: Vec<Series>, start: i64, stop: i64) -> Vec<Series> {
    for s in &mut list {
        let left = s.name.rfind('(').map_or(0, |i| i + 1);
        let right = s.name.find(')').unwrap_or(s.name.len() + 1);
        let clean = if right > left {
            &s.name[left..right.min(s.name.len())]
        } else {
            ""
        };
        let nodes: Vec<&str> = clean.split('.').collect();
        let range = python_range(nodes.len(), Some(start), (stop != 0).then_some(stop));
        let name = nodes.get(range).map(|n| n.join(".")).unwrap_or_default();
        s.name = match name.find(',') {
            Some(comma) => name[..comma].to_string(),
            None => name,
        };
    }
    list
}

/// graphite-web's `cactiStyle`.
fn cacti_style(mut list: Vec<Series>, system: Option<&str>, units: Option<&str>) -> Vec<Series> {
    if list.is_empty() {
        return list;
    }
    let fmt = |x: f64| match (system, units) {
        (Some(system), _) => {
            let (v, prefix) = alias::format_units(x, system, units);
            match units {
                Some(_) => format!("{v:.2} {prefix}"),
                None => format!("{v:.2}{prefix}"),
            }
        }
        (None, Some(units)) => format!("{x:.2} {units}"),
        (None, None) => format!("{x:.2}"),
    };
    // Python's `int(v or 3)`: 3 for none or zero.
    let width = |f: AggFn| {
        list.iter()
            .map(|s| {
                let v = f(&s.points()).filter(|v| *v != 0.0).unwrap_or(3.0);
                fmt(v.trunc()).chars().count()
            })
            .max()
            .unwrap_or(0)
            + 3
    };
    let name_len = list
        .iter()
        .map(|s| s.name.chars().count())
        .max()
        .unwrap_or(0);
    let (last_len, max_len, min_len) = (width(safe_last), width(safe_max), width(safe_min));
    for s in &mut list {
        let points = s.points();
        let shown = |v: Point| v.map_or("nan".to_string(), &fmt);
        s.name = format!(
            "{:<name_len$} Current:{:<last_len$} Max:{:<max_len$} Min:{:<min_len$} ",
            s.name,
            shown(safe_last(&points)),
            shown(safe_max(&points)),
            shown(safe_min(&points)),
        );
    }
    list
}
