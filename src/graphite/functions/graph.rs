//! graphite-web's Graph group: how series are drawn. A JSON render drops the drawing options, so
//! `alpha`, `color` and `lineWidth` change nothing there; the others rename and tag as
//! graphite-web does, `stacked` adds up, `threshold` and `verticalLine` make series.

use super::Type::*;
use super::*;
use crate::graphite::pyfmt::percent_g;

/// A function that only sets a drawing option: the series as they are.
const fn drawing(
    name: &'static str,
    params: &'static [Param],
    description: &'static str,
) -> Function {
    Function::new(
        name,
        Group::Graph,
        params,
        Body::Apply(|a, _| Ok(a.series(0))),
        description,
    )
}

/// A function that renames `<name>(<series>)` and tags `<name>=1`.
const fn marking(name: &'static str, apply: Apply, description: &'static str) -> Function {
    Function::new(
        name,
        Group::Graph,
        &[SERIES],
        Body::Apply(apply),
        description,
    )
}

fn mark(a: &mut Args, function: &str) -> Vec<Series> {
    let mut list = a.series(0);
    for s in &mut list {
        s.tags.set(function, "1");
        s.name = format!("{function}({})", s.name);
    }
    list
}

pub(super) const FUNCTIONS: &[Function] = &[
    drawing(
        "alpha",
        &[SERIES, Param::new("alpha", Float).required()],
        "Draws the series with that opacity (nothing changes in JSON).",
    ),
    Function::new(
        "areaBetween",
        Group::Graph,
        &[SERIES],
        Body::Apply(|a, _| {
            let mut list = a.series(0);
            if list.len() != 2 {
                return Err(bad(format!(
                    "areaBetween series argument must reference *exactly* 2 series (got {})",
                    list.len()
                )));
            }
            list[1].tags.set("areaBetween", "1");
            let name = format!("areaBetween({})", list[1].path_expression);
            let tags = list[1].tags.clone();
            for s in &mut list {
                s.tags = tags.clone();
                s.name = name.clone();
            }
            Ok(list)
        }),
        "Fills the area between two series (both renamed areaBetween(...)).",
    ),
    drawing(
        "color",
        &[SERIES, Param::new("theColor", Str).required()],
        "Draws the series in that color (nothing changes in JSON).",
    ),
    Function::new(
        "dashed",
        Group::Graph,
        &[
            SERIES,
            Param::new("dashLength", Integer).default(Lit::Int(5)),
        ],
        Body::Apply(|a, _| {
            let length = a.int(1);
            let mut list = a.series(0);
            for s in &mut list {
                s.tags.set("dashed", length.to_string());
                s.name = format!("dashed({}, {})", s.name, percent_g(length as f64));
            }
            Ok(list)
        }),
        "Draws the series dashed.",
    ),
    marking(
        "drawAsInfinite",
        |a, _| Ok(mark(a, "drawAsInfinite")),
        "Draws a vertical line wherever a value is not zero.",
    ),
    drawing(
        "lineWidth",
        &[SERIES, Param::new("width", Float).required()],
        "Draws the series with lines that wide (nothing changes in JSON).",
    ),
    marking(
        "secondYAxis",
        |a, _| Ok(mark(a, "secondYAxis")),
        "Draws the series against a second y axis.",
    ),
    Function::new(
        "stacked",
        Group::Graph,
        &[SERIES, Param::new("stack", Str)],
        Body::Apply(|a, ctx| {
            let stack = a.opt_text(1).unwrap_or_else(|| "__DEFAULT__".into());
            let mut totals = ctx.state.stacks.remove(&stack).unwrap_or_default();
            let mut out = Vec::new();
            for mut s in a.series(0) {
                if totals.len() < s.values.len() {
                    totals.resize(s.values.len(), 0.0);
                }
                let values = s
                    .values
                    .iter()
                    .zip(totals.iter_mut())
                    .map(|(v, total)| {
                        v.map(|v| {
                            *total += v;
                            *total
                        })
                    })
                    .collect();
                let name = if stack == "__DEFAULT__" {
                    s.tags.set("stacked", stack.clone());
                    format!("stacked({})", s.name)
                } else {
                    s.name.clone()
                };
                out.push(s.derived(name, values));
            }
            ctx.state.stacks.insert(stack, totals);
            Ok(out)
        }),
        "Draws the series stacked: each the running total of those before it in its stack.",
    ),
    Function::new(
        "threshold",
        Group::Graph,
        &[
            Param::new("value", Float).required(),
            Param::new("label", Str),
            Param::new("color", Str),
        ],
        Body::Apply(|a, ctx| {
            let value = a.float(0);
            let mut line = special::constant_line(&repr_string(value), Some(value), ctx)?;
            if let Some(label) = a.opt_text(1).filter(|l| !l.is_empty()) {
                line.name = label;
            }
            Ok(vec![line])
        }),
        "A line at the value across the range, named label.",
    ),
    Function::new(
        "verticalLine",
        Group::Graph,
        &[
            Param::new("ts", Date).required(),
            Param::new("label", Str),
            Param::new("color", Str),
        ],
        Body::Apply(|a, ctx| {
            let ts = crate::graphite::attime::parse(&a.text(0), ctx.now).map_err(bad)?;
            if ts < ctx.from {
                return Err(bad(format!(
                    "verticalLine(): timestamp {ts} exists before start of range"
                )));
            }
            if ts > ctx.until {
                return Err(bad(format!(
                    "verticalLine(): timestamp {ts} exists after end of range"
                )));
            }
            let label = a.opt_text(1).unwrap_or_else(|| "None".into());
            let mut line = Series::new(&label, ts, ts, 1, vec![Some(1.0), Some(1.0)]);
            line.x_files_factor = ctx.xff(None);
            Ok(vec![line])
        }),
        "A vertical line at a time, named label.",
    ),
];
