//! graphite-web's Transform group: functions that change each series' values (or times) one by
//! one.

use super::Type::*;
use super::*;
use crate::graphite::pyfmt::percent_g;

const INTERVAL: Param = Param::new("intervalString", Interval).required().suggest(&[
    Lit::Str("10min"),
    Lit::Str("1h"),
    Lit::Str("1d"),
]);
const SHIFTS: &[Lit] = &[
    Lit::Str("1h"),
    Lit::Str("6h"),
    Lit::Str("12h"),
    Lit::Str("1d"),
    Lit::Str("2d"),
    Lit::Str("7d"),
    Lit::Str("14d"),
    Lit::Str("30d"),
];
const LIMIT: Param = Param::new("limit", IntOrInf).default(Lit::Inf);
const MAX_VALUE: Param = Param::new("maxValue", Float);
const MIN_VALUE: Param = Param::new("minValue", Float);

pub(super) const FUNCTIONS: &[Function] = &[
    Function::new(
        "absolute",
        Group::Transform,
        &[SERIES],
        Body::Apply(|a, _| {
            Ok(per_value(a.series(0), "absolute", "1", "", |v| {
                v.map(f64::abs)
            }))
        }),
        "The absolute value of every point.",
    )
    .per_series(),
    Function::new(
        "add",
        Group::Transform,
        &[SERIES, Param::new("constant", Float).required()],
        Body::Apply(|a, _| {
            let c = a.float(1);
            let shown = format!(",{}", c.trunc() as i64);
            Ok(per_value(
                a.series(0),
                "add",
                &repr_string(c),
                &shown,
                |v| v.map(|v| v + c),
            ))
        }),
        "Adds the constant to every point.",
    )
    .per_series(),
    Function::new(
        "compressPeriodicGaps",
        Group::Transform,
        &[SERIES],
        Body::Apply(|a, _| {
            Ok(a.series(0)
                .into_iter()
                .map(|mut s| {
                    s.rename(format!("compressPeriodicGaps({})", s.name));
                    compress_periodic_gaps(s)
                })
                .collect())
        }),
        "Takes a series written at a longer period than its step to that period (graphite-web 1.1.10).",
    ),
    Function::new(
        "delay",
        Group::Transform,
        &[SERIES, Param::new("steps", Integer).required()],
        Body::Apply(|a, _| {
            let steps = a.int(1);
            Ok(a.series(0)
                .into_iter()
                .map(|mut s| {
                    let n = s.values.len();
                    let k = (steps.unsigned_abs() as usize).min(n);
                    let values: Vec<Point> = if steps < 0 {
                        let mut v = s.values[k..].to_vec();
                        v.extend(std::iter::repeat_n(None, k));
                        v
                    } else {
                        let mut v = vec![None; k];
                        // Python's `series[:-steps]`, which for 0 is `series[:0]`: nothing
                        // (graphite-web's delay by 0 steps has no values).
                        let keep = if steps == 0 { 0 } else { n - k };
                        v.extend_from_slice(&s.values[..keep]);
                        v
                    };
                    s.tags.set("delay", steps.to_string());
                    s.derived(format!("delay({},{steps})", s.name), values)
                })
                .collect())
        }),
        "Shifts every point that many steps later (earlier for a negative number).",
    ),
    Function::new(
        "derivative",
        Group::Transform,
        &[SERIES],
        Body::Apply(|a, _| {
            Ok(a.series(0)
                .into_iter()
                .map(|s| {
                    let name = format!("derivative({})", s.name);
                    derive(s, ("derivative", "1".into()), name, |_, points| {
                        let mut prev: Point = None;
                        points
                            .into_iter()
                            .map(|v| {
                                let d = match (prev, v) {
                                    (Some(p), Some(v)) => Some(v - p),
                                    _ => None,
                                };
                                prev = v;
                                d
                            })
                            .collect()
                    })
                })
                .collect())
        }),
        "The change from the previous point.",
    )
    .per_series(),
    Function::new(
        "exp",
        Group::Transform,
        &[SERIES],
        Body::Apply(|a, _| Ok(per_value(a.series(0), "exp", "e", "", |v| v.map(f64::exp)))),
        "e to the power of every point.",
    )
    .per_series(),
    Function::new(
        "hitcount",
        Group::Transform,
        &[
            SERIES,
            INTERVAL,
            Param::new("alignToInterval", Boolean).default(Lit::Bool(false)),
        ],
        Body::Refetch(hitcount_plan, hitcount),
        "Turns rates into counts per interval (each point as hits over its step).",
    ),
    Function::new(
        "integral",
        Group::Transform,
        &[SERIES],
        Body::Apply(|a, _| {
            Ok(a.series(0)
                .into_iter()
                .map(|s| {
                    let name = format!("integral({})", s.name);
                    derive(s, ("integral", "1".into()), name, |_, points| {
                        let mut current = 0.0;
                        points
                            .into_iter()
                            .map(|v| {
                                v.map(|v| {
                                    current += v;
                                    current
                                })
                            })
                            .collect()
                    })
                })
                .collect())
        }),
        "The running total of each series.",
    )
    .per_series(),
    Function::new(
        "integralByInterval",
        Group::Transform,
        &[SERIES, Param::new("intervalUnit", Str).required()],
        Body::Apply(|a, ctx| {
            let unit = a.text(1);
            let duration = offset(&unit)?.abs();
            if duration == 0 {
                return Err(bad(format!(
                    "integralByInterval: the interval {unit:?} is empty"
                )));
            }
            let start = ctx.from;
            Ok(a.series(0)
                .into_iter()
                .map(|s| {
                    let name = format!("integralByInterval({},'{unit}')", s.name);
                    derive(
                        s,
                        ("integralByInterval", unit.clone()),
                        name,
                        |s, points| {
                            let (mut t, mut current) = (s.start, 0.0);
                            points
                                .into_iter()
                                .map(|v| {
                                    if (t - start).div_euclid(duration)
                                        != (t - start - s.step).div_euclid(duration)
                                    {
                                        current = 0.0;
                                    }
                                    if let Some(v) = v {
                                        current += v;
                                    }
                                    t += s.step;
                                    Some(current)
                                })
                                .collect()
                        },
                    )
                })
                .collect())
        }),
        "The running total of each series, starting again at every interval.",
    ),
    Function::new(
        "interpolate",
        Group::Transform,
        &[SERIES, LIMIT],
        Body::Apply(|a, _| {
            let limit = a.float(1);
            let mut list = a.series(0);
            for s in &mut list {
                s.rename(format!("interpolate({})", s.name));
                let mut nones = 0usize;
                for i in 1..s.values.len() {
                    match s.values[i] {
                        None => nones += 1,
                        Some(_) if nones == 0 => {}
                        Some(v) => {
                            let before = s.values[i - nones - 1];
                            if let Some(b) = before
                                && nones as f64 <= limit
                            {
                                for (k, at) in (i - nones..i).enumerate() {
                                    s.values[at] =
                                        Some(b + (k + 1) as f64 * (v - b) / (nones + 1) as f64);
                                }
                            }
                            nones = 0;
                        }
                    }
                }
            }
            Ok(list)
        }),
        "Fills gaps by drawing a line between the points either side, up to limit points.",
    ),
    Function::new(
        "invert",
        Group::Transform,
        &[SERIES],
        Body::Apply(|a, _| {
            Ok(per_value(a.series(0), "invert", "1", "", |v| {
                safe_pow(v, Some(-1.0))
            }))
        }),
        "1 divided by every point.",
    )
    .per_series(),
    Function::new(
        "isNonNull",
        Group::Transform,
        &[SERIES],
        Body::Apply(|a, _| {
            Ok(per_value(a.series(0), "isNonNull", "1", "", |v| {
                Some(if v.is_some() { 1.0 } else { 0.0 })
            }))
        }),
        "1 where a series has a value, 0 where not.",
    )
    .per_series(),
    Function::new(
        "keepLastValue",
        Group::Transform,
        &[SERIES, LIMIT],
        Body::Apply(|a, _| {
            let limit = a.float(1);
            let mut list = a.series(0);
            for s in &mut list {
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
            Ok(list)
        }),
        "Fills gaps with the last value seen, up to limit points.",
    )
    .per_series(),
    Function::new(
        "log",
        Group::Transform,
        &[SERIES, Param::new("base", Integer).default(Lit::Int(10))],
        Body::Apply(|a, _| {
            let base = a.int(1);
            if base == 1 || base <= 0 {
                return Err(bad(format!("log: a base of {base} has no logarithm")));
            }
            let ln_base = (base as f64).ln();
            Ok(a.series(0)
                .into_iter()
                .map(|s| {
                    let name = format!("log({}, {base})", s.name);
                    derive(s, ("log", base.to_string()), name, |_, points| {
                        points
                            .into_iter()
                            .map(|v| v.filter(|v| *v > 0.0).map(|v| v.ln() / ln_base))
                            .collect()
                    })
                })
                .collect())
        }),
        "The logarithm of every point to the base (null at or below zero).",
    )
    .per_series(),
    Function::new(
        "logit",
        Group::Transform,
        &[SERIES],
        Body::Apply(|a, _| {
            Ok(per_value(a.series(0), "logit", "logit", "", |v| {
                let v = v?;
                if v == 1.0 {
                    return None;
                }
                let r = v / (1.0 - v);
                (r > 0.0).then(|| r.ln())
            }))
        }),
        "The logit of every point, log(v / (1 - v)).",
    )
    .per_series(),
    Function::new(
        "minMax",
        Group::Transform,
        &[SERIES],
        Body::Apply(|a, _| {
            let mut list = a.series(0);
            for s in &mut list {
                s.rename(format!("minMax({})", s.name));
                let points = s.points();
                let min = safe_min(&points).unwrap_or(0.0);
                let max = safe_max(&points).unwrap_or(0.0);
                map_values(s, |v| {
                    v.map(|v| {
                        if max == min {
                            0.0
                        } else {
                            (v - min) / (max - min)
                        }
                    })
                });
            }
            Ok(list)
        }),
        "Scales each series to between 0 (its minimum) and 1 (its maximum).",
    )
    .per_series(),
    Function::new(
        "nonNegativeDerivative",
        Group::Transform,
        &[SERIES, MAX_VALUE, MIN_VALUE],
        Body::Apply(|a, _| Ok(derivatives(a, false))),
        "The change from the previous point, null where it decreases.",
    )
    .per_series(),
    Function::new(
        "offset",
        Group::Transform,
        &[SERIES, Param::new("factor", Float).required()],
        Body::Apply(|a, _| Ok(with_factor(a, "offset", |v, f| v.map(|v| v + f)))),
        "Adds factor to every point.",
    )
    .per_series(),
    Function::new(
        "offsetToZero",
        Group::Transform,
        &[SERIES],
        Body::Apply(|a, _| {
            let mut list = a.series(0);
            for s in &mut list {
                let min = safe_min(&s.points());
                s.tags
                    .set("offsetToZero", min.map_or("None".into(), repr_string));
                s.rename(format!("offsetToZero({})", s.name));
                map_values(s, |v| Some(v? - min?));
            }
            Ok(list)
        }),
        "Subtracts each series' minimum from it.",
    )
    .per_series(),
    Function::new(
        "perSecond",
        Group::Transform,
        &[SERIES, MAX_VALUE, MIN_VALUE],
        Body::Apply(|a, _| Ok(derivatives(a, true))),
        "The change from the previous point per second, null where it decreases.",
    )
    .per_series(),
    Function::new(
        "pow",
        Group::Transform,
        &[SERIES, Param::new("factor", Float).required()],
        Body::Apply(|a, _| Ok(with_factor(a, "pow", |v, f| safe_pow(v, Some(f))))),
        "Every point to the power of factor.",
    )
    .per_series(),
    Function::new(
        "round",
        Group::Transform,
        &[
            SERIES,
            Param::new("precision", Integer).default(Lit::Int(0)),
        ],
        Body::Apply(|a, _| {
            let precision = a.opt_int(1).filter(|_| a.given(1));
            let digits = precision.unwrap_or(0);
            let mut list = a.series(0);
            for s in &mut list {
                s.tags.set("round", digits.to_string());
                let name = match precision {
                    None => format!("round({})", s.name),
                    Some(p) => format!("round({},{p})", s.name),
                };
                s.rename(name);
                map_values(s, |v| v.map(|v| python_round(v, digits)));
            }
            Ok(list)
        }),
        "Rounds every point to that many decimals (Python's round: half to even).",
    )
    .per_series(),
    Function::new(
        "scale",
        Group::Transform,
        &[SERIES, Param::new("factor", Float).required()],
        Body::Apply(|a, _| Ok(with_factor(a, "scale", |v, f| v.map(|v| v * f)))),
        "Multiplies every point by factor.",
    )
    .per_series(),
    Function::new(
        "scaleToSeconds",
        Group::Transform,
        &[SERIES, Param::new("seconds", Float).required()],
        Body::Apply(|a, _| {
            let secs = a.float(1);
            let mut list = a.series(0);
            for s in &mut list {
                s.tags.set("scaleToSeconds", repr_string(secs));
                s.rename(format!(
                    "scaleToSeconds({},{})",
                    s.name,
                    secs.trunc() as i64
                ));
                let factor = secs / s.step as f64;
                map_values(s, |v| v.map(|v| round6(v * factor)));
            }
            Ok(list)
        }),
        "Every point as a value per that many seconds.",
    )
    .per_series(),
    Function::new(
        "sigmoid",
        Group::Transform,
        &[SERIES],
        Body::Apply(|a, _| {
            Ok(per_value(a.series(0), "sigmoid", "sigmoid", "", |v| {
                v.map(|v| 1.0 / (1.0 + (-v).exp()))
            }))
        }),
        "The sigmoid of every point, 1 / (1 + e^-v).",
    )
    .per_series(),
    Function::new(
        "sinFunction",
        Group::Transform,
        &[
            Param::new("name", Str).required(),
            Param::new("amplitude", Integer).default(Lit::Int(1)),
            Param::new("step", Integer).default(Lit::Int(60)),
        ],
        Body::Apply(|a, ctx| {
            let amplitude = a.int(1) as f64;
            generated(&a.text(0), a.int(2), ctx, |t| (t as f64).sin() * amplitude)
        }),
        "A sine wave of the time, times amplitude.",
    )
    .aliases(&["sin"]),
    Function::new(
        "smartSummarize",
        Group::Transform,
        &[
            SERIES,
            INTERVAL,
            Param::new("func", AggFunc).default(Lit::Str("sum")),
            Param::new("alignTo", Str).options(&[
                Lit::None,
                Lit::Str("years"),
                Lit::Str("months"),
                Lit::Str("weeks"),
                Lit::Str("days"),
                Lit::Str("hours"),
                Lit::Str("minutes"),
                Lit::Str("seconds"),
                Lit::Bool(true),
                Lit::Bool(false),
            ]),
        ],
        Body::Refetch(smart_summarize_plan, smart_summarize),
        "Combines the points of each interval into one, the intervals counted from the start (aligned to alignTo).",
    ),
    Function::new(
        "squareRoot",
        Group::Transform,
        &[SERIES],
        Body::Apply(|a, _| {
            Ok(per_value(a.series(0), "squareRoot", "1", "", |v| {
                safe_pow(v, Some(0.5))
            }))
        }),
        "The square root of every point.",
    )
    .per_series(),
    Function::new(
        "summarize",
        Group::Transform,
        &[
            SERIES,
            INTERVAL,
            Param::new("func", AggFunc).default(Lit::Str("sum")),
            Param::new("alignToFrom", Boolean).default(Lit::Bool(false)),
        ],
        Body::Apply(|a, _| {
            let text = a.text(1);
            let func = a.text(2);
            let align = a.boolean(3);
            let interval = interval_secs(&text)?;
            let f = agg(&func)?;
            let mut out = Vec::new();
            for mut s in a.series(0) {
                let (mut start, mut end) = (s.start, s.end);
                if !align {
                    start = s.start - s.start.rem_euclid(interval);
                    end = s.end - s.end.rem_euclid(interval) + interval;
                }
                bounded("summarize", (end - start) / interval)?;
                let (values, aligned_end) = summarize_values(&s, f, interval, start, end);
                if align {
                    end = aligned_end;
                }
                s.tags.set("summarize", text.clone());
                s.tags.set("summarizeFunction", func.clone());
                let name = format!(
                    "summarize({}, \"{text}\", \"{func}\"{})",
                    s.name,
                    if align { ", true" } else { "" }
                );
                let mut new = s.derived(name, values);
                (new.start, new.end, new.step) = (start, end, interval);
                out.push(new);
            }
            Ok(out)
        }),
        "Combines the points of each interval into one.",
    ),
    Function::new(
        "timeFunction",
        Group::Transform,
        &[
            Param::new("name", Str).required(),
            Param::new("step", Integer).default(Lit::Int(60)),
        ],
        Body::Apply(|a, ctx| generated(&a.text(0), a.int(1), ctx, |t| t as f64)),
        "The time itself, in Unix seconds, at every step.",
    )
    .aliases(&["time"]),
    Function::new(
        "timeShift",
        Group::Transform,
        &[
            SERIES,
            Param::new("timeShift", Interval).required().suggest(SHIFTS),
            Param::new("resetEnd", Boolean).default(Lit::Bool(true)),
            Param::new("alignDst", Boolean).default(Lit::Bool(false)),
        ],
        Body::Shaped(
            |a, ctx| {
                let (_, delta) = shift(&a.text(1))?;
                let from = ctx.from.checked_add(delta);
                let until = ctx.until.checked_add(delta);
                match (from, until) {
                    (Some(from), Some(until)) if in_years(from) && in_years(until) => {
                        Ok(vec![Fetch::First { from, until }])
                    }
                    _ => Err(bad("timeShift reaches outside the years 1 to 9999".into())),
                }
            },
            |a, _, mut fetched| {
                let (text, _) = shift(&a.text(1))?;
                let reset_end = a.boolean(2);
                let list = a.series(0);
                let Some(first) = list.first() else {
                    return Ok(Vec::new());
                };
                let mut shifted = fetched.pop().unwrap_or_default();
                for s in &mut shifted {
                    s.tags.set("timeShift", text.clone());
                    s.name = format!("timeShift({}, \"{text}\")", s.name);
                    s.end = if reset_end {
                        first.end
                    } else {
                        s.end - s.start + first.start
                    };
                    s.start = first.start;
                }
                Ok(shifted)
            },
        ),
        "The series as they were that long before (`1d`, `7d`), drawn over now.",
    ),
    Function::new(
        "timeSlice",
        Group::Transform,
        &[
            SERIES,
            Param::new("startSliceAt", Date).required(),
            Param::new("endSliceAt", Date).default(Lit::Str("now")),
        ],
        Body::Apply(|a, ctx| {
            let at = |text: String| crate::graphite::attime::parse(&text, ctx.now).map_err(bad);
            let start = at(a.text(1))?;
            let end = at(a.text(2))?;
            let mut list = a.series(0);
            for s in &mut list {
                s.tags.set("timeSliceStart", start.to_string());
                s.tags.set("timeSliceEnd", end.to_string());
                s.name = format!("timeSlice({}, {start}, {end})", s.name);
                let mut t = ctx.from;
                for v in &mut s.values {
                    if t < start || t > end {
                        *v = None;
                    }
                    t += s.step;
                }
            }
            Ok(list)
        }),
        "Keeps the points between two times, nulls the rest.",
    ),
    Function::new(
        "timeStack",
        Group::Transform,
        &[
            SERIES,
            Param::new("timeShiftUnit", Interval)
                .default(Lit::Str("1d"))
                .suggest(SHIFTS),
            Param::new("timeShiftStart", Integer).default(Lit::Int(0)),
            Param::new("timeShiftEnd", Integer).default(Lit::Int(7)),
        ],
        Body::Shaped(
            |a, ctx| {
                if a.peek_series(0).is_empty() {
                    return Ok(Vec::new());
                }
                let (_, delta) = shift(&a.text(1))?;
                let (first, last) = (a.int(2), a.int(3));
                if last.saturating_sub(first) > MAX_SHIFTS {
                    return Err(bad(format!(
                        "timeStack: {} shifts, more than {MAX_SHIFTS}, the limit",
                        last.saturating_sub(first)
                    )));
                }
                (first..last)
                    .map(|n| {
                        let d = delta.checked_mul(n);
                        let from = d.and_then(|d| ctx.from.checked_add(d));
                        let until = d.and_then(|d| ctx.until.checked_add(d));
                        match (from, until) {
                            (Some(from), Some(until)) if in_years(from) && in_years(until) => {
                                Ok(Fetch::First { from, until })
                            }
                            _ => Err(bad("timeStack reaches outside the years 1 to 9999".into())),
                        }
                    })
                    .collect()
            },
            |a, _, fetched| {
                let (unit, _) = shift(&a.text(1))?;
                let first_shift = a.int(2);
                let list = a.series(0);
                let Some(first) = list.first() else {
                    return Ok(Vec::new());
                };
                let mut out = Vec::new();
                for (n, shifted) in (first_shift..).zip(fetched) {
                    for mut s in shifted {
                        s.tags.set("timeShiftUnit", unit.clone());
                        s.tags.set("timeShift", n.to_string());
                        s.rename(format!("timeShift({}, {unit}, {n})", s.name));
                        s.start = first.start;
                        s.end = first.end;
                        out.push(s);
                    }
                }
                Ok(out)
            },
        ),
        "The series as they were at each of several shifts back, drawn over now.",
    ),
    Function::new(
        "transformNull",
        Group::Transform,
        &[
            SERIES,
            Param::new("default", Float).default(Lit::Int(0)),
            Param::new("referenceSeries", SeriesList),
        ],
        Body::Apply(|a, _| {
            let value = a.float(1);
            // A given default is a float (graphite-web converts it); the default default, 0.
            let tag = if a.given(1) {
                repr_string(value)
            } else {
                "0".into()
            };
            let reference = a.series(2);
            let defaults: Vec<Point> = rows(&reference)
                .iter()
                .map(|row| row.iter().any(Option::is_some).then_some(value))
                .collect();
            let mut list = a.series(0);
            for s in &mut list {
                s.tags.set("transformNull", tag.clone());
                if reference.is_empty() {
                    s.rename(format!("transformNull({},{})", s.name, percent_g(value)));
                } else {
                    s.tags.set("referenceSeries", "1");
                    s.rename(format!(
                        "transformNull({},{},referenceSeries)",
                        s.name,
                        percent_g(value)
                    ));
                }
                if defaults.is_empty() {
                    map_values(s, |v| Some(v.unwrap_or(value)));
                } else {
                    let n = s.values.len().max(defaults.len());
                    s.values = (0..n)
                        .map(|i| {
                            s.values
                                .get(i)
                                .copied()
                                .flatten()
                                .or(defaults.get(i).copied().flatten())
                        })
                        .collect();
                }
            }
            Ok(list)
        }),
        "Replaces nulls with default (where the reference series has a value, if given).",
    )
    .per_series(),
];

use crate::graphite::attime::in_range as in_years;

/// `scale`, `offset` and `pow`: a function of each value and the factor; each series renamed
/// `<function>(<name>,<factor as %g>)` and tagged with the factor.
fn with_factor(a: &mut Args, function: &str, f: fn(Point, f64) -> Point) -> Vec<Series> {
    let factor = a.float(1);
    let shown = format!(",{}", percent_g(factor));
    per_value(a.series(0), function, &repr_string(factor), &shown, |v| {
        f(v, factor)
    })
}

/// `nonNegativeDerivative` and `perSecond`.
fn derivatives(a: &mut Args, per_second: bool) -> Vec<Series> {
    let (max, min) = (a.opt_float(1), a.opt_float(2));
    let function = if per_second {
        "perSecond"
    } else {
        "nonNegativeDerivative"
    };
    a.series(0)
        .into_iter()
        .map(|s| {
            let name = format!("{function}({})", s.name);
            derive(s, (function, "1".into()), name, |s, points| {
                let step = s.step as f64;
                let mut prev = None;
                points
                    .into_iter()
                    .map(|v| {
                        let (delta, p) = non_negative_delta(v, prev, max, min);
                        prev = p;
                        if per_second {
                            delta.map(|d| round6(d / step))
                        } else {
                            delta
                        }
                    })
                    .collect()
            })
        })
        .collect()
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

/// A shift as `timeShift` takes it: without a sign it goes back. The text as named, and the
/// signed seconds.
fn shift(text: &str) -> Result<(String, i64)> {
    let text = if text.starts_with(|c: char| c.is_ascii_digit()) {
        format!("-{text}")
    } else {
        text.to_string()
    };
    let delta = offset(&text)?;
    Ok((text, delta))
}

/// Python's `round(v, digits)`: half to even on the exact value.
pub(super) fn python_round(v: f64, digits: i64) -> f64 {
    if !v.is_finite() {
        return v;
    }
    if digits >= 0 {
        let d = digits.min(300) as usize;
        return format!("{v:.d$}").parse().unwrap_or(v);
    }
    let p = 10f64.powi((-digits).min(308) as i32);
    let q = v / p;
    let r = q.round();
    let r = if (q - q.trunc()).abs() == 0.5 {
        2.0 * (q / 2.0).round()
    } else {
        r
    };
    r * p
}

/// A series generated from the time (`time`, `sin`): a value every `step` from the request's
/// start while before its end.
fn generated(name: &str, step: i64, ctx: &Ctx, f: impl Fn(i64) -> f64) -> Result<Vec<Series>> {
    if step <= 0 {
        return Err(bad(format!("step must be positive, got {step}")));
    }
    bounded("this step", (ctx.until - ctx.from) / step)?;
    let values = (0..)
        .map(|i| ctx.from + i * step)
        .take_while(|t| *t < ctx.until)
        .map(|t| Some(f(t)))
        .collect();
    let mut s = Series::new(name, ctx.from, ctx.until, step, values);
    s.x_files_factor = ctx.xff(None);
    Ok(vec![s])
}

/// graphite-web 1.1.10's `_compressPeriodicGaps`: a series whose values come every k steps with
/// nulls between, summarized to k steps (the last value), from its first value; else as it is.
fn compress_periodic_gaps(s: Series) -> Series {
    let truthy = |v: Point| v.is_some_and(|v| v != 0.0);
    let points = s.points();
    let (mut first, mut second) = (0usize, 0usize);
    for (i, v) in points.iter().enumerate() {
        if truthy(*v) {
            if first > 0 {
                second = i;
                break;
            }
            first = i;
        }
    }
    let guess = second as i64 - first as i64;
    let third = second as i64 + guess;
    let values = &s.values;
    let at = |i: i64| values.get(i as usize).copied().flatten();
    let periodic = guess > 1
        && third <= values.len() as i64 - 2
        && truthy(at(third))
        && at(third - 1).is_none()
        && at(third + 1).is_none();
    if !periodic {
        return s;
    }
    let interval = guess * s.step;
    let start = s.start + first as i64 * s.step;
    let last = agg_func("last").expect("last is an aggregation");
    let (values, _) = summarize_values(&s, last, interval, start, s.end);
    let end = start + interval * (values.len() as i64 - 1);
    Series {
        start,
        end,
        step: interval,
        values,
        values_per_point: 1,
        ..s
    }
}

fn hitcount_plan(a: &Args, ctx: &Ctx) -> Result<Vec<Fetch>> {
    if !a.boolean(2) {
        return Ok(Vec::new());
    }
    let interval = interval_secs(&a.text(1))?;
    let truncate = [86_400, 3600, 60]
        .into_iter()
        .find(|unit| interval >= *unit)
        .unwrap_or(1);
    let from = ctx.from - ctx.from.rem_euclid(truncate);
    Ok(vec![Fetch::First {
        from,
        until: ctx.until,
    }])
}

/// graphite-web's `hitcount`: each point's value times the seconds of it inside each bucket.
fn hitcount(a: &mut Args, _: &mut Ctx, mut fetched: Vec<Vec<Series>>) -> Result<Vec<Series>> {
    let text = a.text(1);
    let align = a.boolean(2);
    let interval = interval_secs(&text)?;
    let list = if align {
        let mut list = fetched.pop().unwrap_or_default();
        for s in &mut list {
            let count = (s.end - s.start).div_euclid(interval);
            s.end = s.start + count * interval + interval;
        }
        list
    } else {
        a.series(0)
    };
    let mut out = Vec::new();
    for mut s in list {
        let step = s.step;
        let buckets = ((s.end - s.start) as f64 / interval as f64).ceil() as i64;
        bounded("hitcount", buckets)?;
        let mut sums: Vec<Vec<f64>> = vec![Vec::new(); buckets.max(0) as usize];
        let start = s.end - buckets * interval;
        for (i, &v) in s.points().iter().enumerate() {
            let Some(v) = v else { continue };
            let t = s.start + i as i64 * step;
            let (first, first_mod) = (
                (t - start).div_euclid(interval),
                (t - start).rem_euclid(interval),
            );
            let end_t = t + step;
            let (mut last, mut last_mod) = (
                (end_t - start).div_euclid(interval),
                (end_t - start).rem_euclid(interval),
            );
            if last >= buckets {
                last = buckets - 1;
                last_mod = interval;
            }
            let mut put = |b: i64, x: f64| {
                if let Some(bucket) = usize::try_from(b).ok().and_then(|b| sums.get_mut(b)) {
                    bucket.push(x);
                }
            };
            if first == last {
                if first >= 0 {
                    put(first, v * (last_mod - first_mod) as f64);
                }
            } else {
                if first >= 0 {
                    put(first, v * (interval - first_mod) as f64);
                }
                for b in first + 1..last {
                    put(b, v * interval as f64);
                }
                if last_mod > 0 {
                    put(last, v * last_mod as f64);
                }
            }
        }
        let values = sums
            .iter()
            .map(|b| (!b.is_empty()).then(|| sum(b)))
            .collect();
        s.tags.set("hitcount", text.clone());
        let name = format!(
            "hitcount({}, \"{text}\"{})",
            s.name,
            if align { ", true" } else { "" }
        );
        let mut new = s.derived(name, values);
        new.start = start;
        new.step = interval;
        out.push(new);
    }
    Ok(out)
}

/// The unit `smartSummarize` aligns to (graphite-web's `getUnitString`), when it is a string.
fn align_unit(a: &Args) -> Result<Option<String>> {
    match a.arg(3) {
        Some(Arg::Str(s)) => {
            let unit = ["s", "min", "h", "d", "w", "mon", "y"]
                .into_iter()
                .find(|u| s.starts_with(u))
                .ok_or_else(|| bad(format!("Invalid offset unit '{s}'")))?;
            Ok(Some(unit.to_string()))
        }
        _ => Ok(None),
    }
}

fn smart_summarize_plan(a: &Args, ctx: &Ctx) -> Result<Vec<Fetch>> {
    let Some(unit) = align_unit(a)? else {
        return Ok(Vec::new());
    };
    let s = ctx.from;
    let days = s.div_euclid(86_400);
    let (y, m, _) = crate::store::clock::civil_from_days(days);
    let midnight = days * 86_400;
    let from = match unit.as_str() {
        "y" => crate::store::clock::days_from_civil(y, 1, 1) * 86_400,
        "mon" => crate::store::clock::days_from_civil(y, m, 1) * 86_400,
        "w" => {
            let text = a.text(3);
            let wanted = text
                .chars()
                .last()
                .and_then(|c| c.to_digit(10))
                .map_or(1, i64::from);
            // 1970-01-01 was a Thursday (ISO day 4).
            let weekday = (days + 3).rem_euclid(7) + 1;
            let back = (weekday - wanted).rem_euclid(7);
            midnight - back * 86_400
        }
        "d" => midnight,
        "h" => s - s.rem_euclid(3600),
        "min" => s - s.rem_euclid(60),
        _ => s,
    };
    Ok(vec![Fetch::First {
        from,
        until: ctx.until,
    }])
}

fn smart_summarize(
    a: &mut Args,
    _: &mut Ctx,
    mut fetched: Vec<Vec<Series>>,
) -> Result<Vec<Series>> {
    let text = a.text(1);
    let func = a.text(2);
    let interval = interval_secs(&text)?;
    let f = agg(&func)?;
    let list = if align_unit(a)?.is_some() {
        fetched.pop().unwrap_or_default()
    } else {
        a.series(0)
    };
    let mut out = Vec::new();
    for mut s in list {
        bounded("smartSummarize", (s.end - s.start) / interval)?;
        let (values, end) = summarize_values(&s, f, interval, s.start, s.end);
        s.tags.set("smartSummarize", text.clone());
        s.tags.set("smartSummarizeFunction", func.clone());
        let name = format!("smartSummarize({}, \"{text}\", \"{func}\")", s.name);
        let mut new = s.derived(name, values);
        new.end = end;
        new.step = interval;
        out.push(new);
    }
    Ok(out)
}
