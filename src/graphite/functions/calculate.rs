//! graphite-web's Calculate group: functions that compute new series from each one's history
//! (moving windows, Holt-Winters forecasts, regressions, percentiles).

use super::Type::*;
use super::*;
use crate::graphite::pyfmt::percent_g;
use crate::graphite::series::Tags;

const WINDOW: Param = Param::new("windowSize", IntOrInterval)
    .required()
    .suggest(WINDOWS);
const XFF: Param = Param::new("xFilesFactor", Float);
const BOOTSTRAP: Param = Param::new("bootstrapInterval", Interval)
    .default(Lit::Str("7d"))
    .suggest(&[Lit::Str("7d"), Lit::Str("30d")]);
const SEASONALITY: Param = Param::new("seasonality", Interval)
    .default(Lit::Str("1d"))
    .suggest(&[Lit::Str("1d"), Lit::Str("7d")]);
const DELTA: Param = Param::new("delta", Integer).default(Lit::Int(3));

/// A moving window's declaration: `<name>(seriesList, windowSize, xFilesFactor)`.
const fn moving(name: &'static str, description: &'static str) -> Function {
    Function::new(
        name,
        Group::Calculate,
        &[SERIES, WINDOW, XFF],
        Body::Shaped(window_plan, moving_window),
        description,
    )
}

pub(super) const FUNCTIONS: &[Function] = &[
    Function::new(
        "aggregateLine",
        Group::Calculate,
        &[
            SERIES,
            Param::new("func", AggFunc).default(Lit::Str("average")),
            Param::new("keepStep", Boolean).default(Lit::Bool(false)),
        ],
        Body::Apply(|a, ctx| {
            let f = agg(&a.text(1))?;
            let keep_step = a.boolean(2);
            let mut out = Vec::new();
            for s in a.series(0) {
                let value = f(&s.points());
                let name = match value {
                    Some(v) => format!("aggregateLine({}, {})", s.name, percent_g(v)),
                    None => format!("aggregateLine({}, None)", s.name),
                };
                let line = if keep_step {
                    let n = s.values.len();
                    s.derived(name, vec![value; n])
                } else {
                    let shown = value.map_or("None".into(), repr_string);
                    let mut line = special::constant_line(&shown, value, ctx)?;
                    line.rename(name);
                    line
                };
                out.push(line);
            }
            Ok(out)
        }),
        "A line at an aggregate of each series (its average by default).",
    ),
    Function::new(
        "exponentialMovingAverage",
        Group::Calculate,
        &[SERIES, WINDOW],
        Body::Shaped(window_plan, |a, _, mut fetched| {
            let window = a.arg(1).unwrap_or(Arg::None);
            let preview = preview(a)?;
            let mut out = Vec::new();
            for mut s in fetched.pop().unwrap_or_default() {
                let (name, points, constant) = match &window {
                    Arg::Str(text) => (
                        format!("exponentialMovingAverage({},\"{text}\")", s.name),
                        (preview / s.step) as usize,
                        2.0 / (preview as f64 + 1.0),
                    ),
                    other => {
                        let n = other.as_index().unwrap_or(0);
                        (
                            format!("exponentialMovingAverage({},{n})", s.name),
                            n.max(0) as usize,
                            2.0 / (n as f64 + 1.0),
                        )
                    }
                };
                s.tags.set("exponentialMovingAverage", window.text());
                let values = &s.values;
                let mut ema = safe_avg(&values[..points.min(values.len())]).unwrap_or(0.0);
                let mut new = vec![Some(round6(ema))];
                for v in values.iter().skip(points) {
                    new.push(v.map(|v| {
                        ema = constant * v + (1.0 - constant) * ema;
                        round6(ema)
                    }));
                }
                let mut e = s.derived(name, new);
                e.start = s.start + preview;
                out.push(e);
            }
            Ok(out)
        }),
        "An exponential moving average over a window of points or of time.",
    ),
    Function::new(
        "holtWintersAberration",
        Group::Calculate,
        &[SERIES, DELTA, BOOTSTRAP, SEASONALITY],
        Body::Refetch(bootstrap_plan, |a, _, mut fetched| {
            let bands = confidence_bands(a, fetched.pop().unwrap_or_default())?;
            let mut out = Vec::new();
            for mut s in a.series(0) {
                let band = |which: &str| {
                    let name = format!("holtWintersConfidence{which}({})", s.name);
                    bands
                        .iter()
                        .find(|b| b.name == name)
                        .map(|b| b.values.clone())
                };
                let (Some(lower), Some(upper)) = (band("Lower"), band("Upper")) else {
                    return Err(bad(format!(
                        "holtWintersAberration: no confidence bands for {}",
                        s.name
                    )));
                };
                let values = s
                    .points()
                    .iter()
                    .enumerate()
                    .map(|(i, v)| {
                        let v = (*v)?;
                        let (l, u) = (
                            lower.get(i).copied().flatten(),
                            upper.get(i).copied().flatten(),
                        );
                        Some(match (l, u) {
                            (_, Some(u)) if v > u => v - u,
                            (Some(l), _) if v < l => v - l,
                            _ => 0.0,
                        })
                    })
                    .map(|v| v.or(Some(0.0)))
                    .collect();
                s.tags.set("holtWintersAberration", "1");
                let name = format!("holtWintersAberration({})", s.name);
                let mut new = Series::new(&name, s.start, s.end, s.step, values);
                new.tags = s.tags.clone();
                new.x_files_factor = s.x_files_factor;
                out.push(new);
            }
            Ok(out)
        }),
        "How far each point lies outside the Holt-Winters confidence bands (0 inside).",
    ),
    Function::new(
        "holtWintersConfidenceArea",
        Group::Calculate,
        &[SERIES, DELTA, BOOTSTRAP, SEASONALITY],
        Body::Shaped(bootstrap_plan, |a, _, mut fetched| {
            let mut bands = confidence_bands(a, fetched.pop().unwrap_or_default())?;
            if bands.len() != 2 {
                return Err(bad(
                    "holtWintersConfidenceArea takes exactly one series (areaBetween draws two bands)"
                        .into(),
                ));
            }
            let name = format!("holtWintersConfidenceArea({})", bands[1].path_expression);
            let mut tags = bands[1].tags.clone();
            tags.set("holtWintersConfidenceArea", "1");
            for b in &mut bands {
                b.tags = tags.clone();
                b.rename(name.clone());
            }
            Ok(bands)
        }),
        "The area between the Holt-Winters confidence bands.",
    ),
    Function::new(
        "holtWintersConfidenceBands",
        Group::Calculate,
        &[SERIES, DELTA, BOOTSTRAP, SEASONALITY],
        Body::Shaped(bootstrap_plan, |a, _, mut fetched| {
            confidence_bands(a, fetched.pop().unwrap_or_default())
        }),
        "The Holt-Winters forecast plus and minus delta deviations: a lower and an upper band.",
    ),
    Function::new(
        "holtWintersForecast",
        Group::Calculate,
        &[SERIES, BOOTSTRAP, SEASONALITY],
        Body::Shaped(bootstrap_plan, |a, _, mut fetched| {
            let preview = offset(&a.text(1))?;
            let seasonality = a.text(2);
            let mut out = Vec::new();
            for mut s in fetched.pop().unwrap_or_default() {
                let analysis = holt_winters(&s, &seasonality)?;
                s.tags.set("holtWintersForecast", "1");
                s.tags.set("holtWintersDeviation", "1");
                let skip = (preview / s.step).max(0) as usize;
                let name = format!("holtWintersForecast({})", s.name);
                let values = analysis
                    .predictions
                    .get(skip..)
                    .unwrap_or_default()
                    .to_vec();
                let mut new = Series::new(&name, s.start + preview, s.end, s.step, values);
                new.tags = s.tags.clone();
                new.x_files_factor = s.x_files_factor;
                out.push(new);
            }
            Ok(out)
        }),
        "The Holt-Winters forecast of each series, learnt over the bootstrap interval before.",
    ),
    Function::new(
        "identity",
        Group::Calculate,
        &[Param::new("name", Str).required()],
        Body::Apply(|a, ctx| {
            let name = a.text(0);
            bounded("identity", (ctx.until - ctx.from) / 60)?;
            let values = (ctx.from..ctx.until)
                .step_by(60)
                .map(|t| Some(t as f64))
                .collect();
            let mut s = Series::new(&name, ctx.from, ctx.until, 60, values);
            s.path_expression = format!("identity(\"{name}\")");
            s.x_files_factor = ctx.xff(None);
            Ok(vec![s])
        }),
        "The time itself, in Unix seconds, every minute.",
    ),
    Function::new(
        "linearRegression",
        Group::Calculate,
        &[
            SERIES,
            Param::new("startSourceAt", Date),
            Param::new("endSourceAt", Date),
        ],
        Body::Shaped(
            |a, ctx| {
                let (from, until) = source_range(a, ctx)?;
                Ok(vec![Fetch::First { from, until }])
            },
            |a, ctx, mut fetched| {
                let (from, until) = source_range(a, ctx)?;
                let sources = fetched.pop().unwrap_or_default();
                let mut out = Vec::new();
                for (source, mut s) in sources.iter().zip(a.series(0)) {
                    s.tags.set("linearRegressions", format!("{from}, {until}"));
                    let name = format!("linearRegression({}, {from}, {until})", s.name);
                    let Some((factor, offset)) = regression(source) else {
                        continue;
                    };
                    let values = (0..s.values.len())
                        .map(|i| Some(offset + (s.start + i as i64 * s.step) as f64 * factor))
                        .collect();
                    let mut new = Series::new(&name, s.start, s.end, s.step, values);
                    new.tags = s.tags.clone();
                    new.x_files_factor = s.x_files_factor;
                    out.push(new);
                }
                Ok(out)
            },
        ),
        "The least-squares line through each series (over another range, if given).",
    ),
    moving(
        "movingAverage",
        "The average of the points in a moving window ending at each point.",
    ),
    moving(
        "movingMax",
        "The largest of the points in a moving window ending at each point.",
    ),
    moving(
        "movingMedian",
        "The median of the points in a moving window ending at each point.",
    ),
    moving(
        "movingMin",
        "The smallest of the points in a moving window ending at each point.",
    ),
    moving(
        "movingSum",
        "The sum of the points in a moving window ending at each point.",
    ),
    Function::new(
        "movingWindow",
        Group::Calculate,
        &[
            SERIES,
            WINDOW,
            Param::new("func", AggFunc).default(Lit::Str("average")),
            XFF,
        ],
        Body::Shaped(window_plan, moving_window),
        "An aggregation of the points in a moving window ending at each point.",
    ),
    Function::new(
        "nPercentile",
        Group::Calculate,
        &[SERIES, Param::new("n", Float).required()],
        Body::Apply(|a, _| {
            let n = a.float(1);
            if n == 0.0 {
                return Err(bad(
                    "The requested percent is required to be greater than 0".into(),
                ));
            }
            Ok(a.series(0)
                .into_iter()
                .filter_map(|s| n_percentile(s, n))
                .collect())
        }),
        "A line at the nth percentile of each series.",
    ),
    Function::new(
        "stdev",
        Group::Calculate,
        &[
            SERIES,
            Param::new("points", Integer).required(),
            Param::new("windowTolerance", Float).default(Lit::Float(0.1)),
        ],
        Body::Apply(|a, _| {
            let points = a.int(1);
            let tolerance = a.float(2);
            if points <= 0 {
                return Err(bad(format!("stdev: points must be positive, got {points}")));
            }
            let mut out = Vec::new();
            for mut s in a.series(0) {
                s.tags.set("stdev", points.to_string());
                let name = format!("stdev({},{points})", s.name);
                let values = s.points();
                let (mut valid, mut total, mut squares) = (0i64, 0.0f64, 0.0f64);
                let mut new = Vec::with_capacity(values.len());
                for (i, v) in values.iter().enumerate() {
                    if i as i64 >= points
                        && let Some(dropped) = values[i - points as usize]
                    {
                        valid -= 1;
                        total -= dropped;
                        squares -= dropped * dropped;
                    }
                    if let Some(v) = v {
                        valid += 1;
                        total += v;
                        squares += v * v;
                    }
                    new.push(
                        (valid > 0 && valid as f64 / points as f64 >= tolerance)
                            .then(|| {
                                let d = valid as f64 * squares - total * total;
                                (d >= 0.0).then(|| d.sqrt() / valid as f64)
                            })
                            .flatten(),
                    );
                }
                out.push(s.derived(name, new));
            }
            Ok(out)
        }),
        "The standard deviation of the points in a moving window of that many points.",
    ),
];

/// A window's length before the range: seconds for an interval (`'5min'`), the series' longest
/// step times the points for a count.
fn preview(a: &Args) -> Result<i64> {
    match a.arg(1) {
        Some(Arg::Str(text)) => Ok(offset(&text)?.abs()),
        Some(other) => {
            let n = other.as_index().unwrap_or(0);
            let step = a.peek_series(0).iter().map(|s| s.step).max().unwrap_or(0);
            bounded("this window", n)?;
            Ok(step.saturating_mul(n.max(0)))
        }
        None => Ok(0),
    }
}

/// Reads the first argument again from the window's length before the range.
fn window_plan(a: &Args, ctx: &Ctx) -> Result<Vec<Fetch>> {
    if a.peek_series(0).is_empty() {
        return Ok(Vec::new());
    }
    let preview = preview(a)?;
    let from = ctx
        .from
        .checked_sub(preview)
        .filter(|t| crate::graphite::attime::in_range(*t))
        .ok_or_else(|| bad(format!("{}'s window reaches before the year 1", a.called)))?;
    Ok(vec![Fetch::First {
        from,
        until: ctx.until,
    }])
}

/// graphite-web 1.1.10's `movingWindow` (and the five that call it): each point the aggregate
/// of the window of points ending at it (1.1.8's window ended before it:
/// `render/functions.py:1350` changed).
fn moving_window(a: &mut Args, _: &mut Ctx, mut fetched: Vec<Vec<Series>>) -> Result<Vec<Series>> {
    let (func, xff) = match a.called.as_str() {
        "movingWindow" => (a.text(2), a.opt_float(3)),
        name => (name["moving".len()..].to_lowercase(), a.opt_float(2)),
    };
    let f = agg(&func)?;
    // Python's `'moving' + func.capitalize()`.
    let tag = format!(
        "moving{}{}",
        func[..1].to_uppercase(),
        func[1..].to_lowercase()
    );
    let window = a.arg(1).unwrap_or(Arg::None);
    let preview = preview(a)?;
    let mut out = Vec::new();
    for mut s in fetched.pop().unwrap_or_default() {
        let (name, points) = match &window {
            Arg::Str(text) => (
                format!("{tag}({},\"{text}\")", s.name),
                (preview / s.step) as usize,
            ),
            other => {
                let n = other.as_index().unwrap_or(0);
                (format!("{tag}({},{n})", s.name), n.max(0) as usize)
            }
        };
        s.tags.set(&tag, window.text());
        let xff = xff.unwrap_or(s.x_files_factor);
        let values = s.points();
        let new: Vec<Point> = (points + 1..=values.len())
            .map(|i| {
                let window = &values[i - points..i];
                let present = window.iter().flatten().count();
                xff_ok(present, points as f64, xff)
                    .then(|| f(window))
                    .flatten()
            })
            .collect();
        let mut m = s.derived(name, new);
        m.start = s.start + preview;
        out.push(m);
    }
    Ok(out)
}

/// Reads the first argument again from the bootstrap interval before the range.
fn bootstrap_plan(a: &Args, ctx: &Ctx) -> Result<Vec<Fetch>> {
    let at = if a.called == "holtWintersForecast" {
        1
    } else {
        2
    };
    let preview = offset(&a.text(at))?;
    let from = ctx
        .from
        .checked_sub(preview)
        .filter(|t| crate::graphite::attime::in_range(*t))
        .ok_or_else(|| {
            bad(format!(
                "{}'s bootstrap reaches before the year 1",
                a.called
            ))
        })?;
    Ok(vec![Fetch::First {
        from,
        until: ctx.until,
    }])
}

/// What `holtWintersAnalysis` gives the functions.
struct HoltWinters {
    predictions: Vec<Point>,
    deviations: Vec<Point>,
}

/// graphite-web's `holtWintersAnalysis`: α = γ = 0.1, β = 0.0035, a season of `seasonality`.
fn holt_winters(s: &Series, seasonality: &str) -> Result<HoltWinters> {
    let (alpha, gamma, beta) = (0.1, 0.1, 0.0035);
    let season = (offset(seasonality)? / s.step).max(0) as usize;
    let points = s.points();
    let n = points.len();
    let mut intercepts: Vec<Option<f64>> = Vec::with_capacity(n);
    let mut slopes: Vec<f64> = Vec::with_capacity(n);
    let mut seasonals: Vec<f64> = Vec::with_capacity(n);
    let mut predictions: Vec<Point> = Vec::with_capacity(n);
    let mut deviations: Vec<Point> = Vec::with_capacity(n);
    let last_of = |list: &Vec<f64>, i: usize| {
        i.checked_sub(season)
            .and_then(|j| list.get(j).copied())
            .unwrap_or(0.0)
    };
    let mut next_pred: Option<f64> = None;
    for (i, actual) in points.iter().enumerate() {
        let Some(actual) = *actual else {
            intercepts.push(None);
            slopes.push(0.0);
            seasonals.push(0.0);
            predictions.push(next_pred);
            deviations.push(Some(0.0));
            next_pred = None;
            continue;
        };
        let (last_intercept, last_slope, prediction) = if i == 0 {
            (actual, 0.0, Some(actual))
        } else {
            let li = intercepts.last().copied().flatten().unwrap_or(actual);
            (li, slopes.last().copied().unwrap_or(0.0), next_pred)
        };
        let last_seasonal = last_of(&seasonals, i);
        let next_last_seasonal = last_of(&seasonals, i + 1);
        let last_dev = i
            .checked_sub(season)
            .and_then(|j| deviations.get(j).copied().flatten())
            .unwrap_or(0.0);
        let intercept =
            alpha * (actual - last_seasonal) + (1.0 - alpha) * (last_intercept + last_slope);
        let slope = beta * (intercept - last_intercept) + (1.0 - beta) * last_slope;
        let seasonal = gamma * (actual - intercept) + (1.0 - gamma) * last_seasonal;
        next_pred = Some(intercept + slope + next_last_seasonal);
        let deviation =
            gamma * (actual - prediction.unwrap_or(0.0)).abs() + (1.0 - gamma) * last_dev;
        intercepts.push(Some(intercept));
        slopes.push(slope);
        seasonals.push(seasonal);
        predictions.push(prediction);
        deviations.push(Some(deviation));
    }
    Ok(HoltWinters {
        predictions,
        deviations,
    })
}

/// graphite-web's `holtWintersConfidenceBands`: per series a lower and an upper band, their
/// tags those every Holt-Winters step set on the one tag dict they share.
fn confidence_bands(a: &Args, fetched: Vec<Series>) -> Result<Vec<Series>> {
    let delta = a.int(1) as f64;
    let preview = offset(&a.text(2))?;
    let seasonality = a.text(3);
    let mut out = Vec::new();
    for s in fetched {
        let analysis = holt_winters(&s, &seasonality)?;
        let skip = (preview / s.step).max(0) as usize;
        let tail = |v: &[Point]| v.get(skip..).unwrap_or_default().to_vec();
        let (forecast, deviation) = (tail(&analysis.predictions), tail(&analysis.deviations));
        let (mut upper, mut lower) = (Vec::new(), Vec::new());
        for (f, d) in forecast.iter().zip(&deviation) {
            match (f, d) {
                (Some(f), Some(d)) => {
                    upper.push(Some(f + delta * d));
                    lower.push(Some(f - delta * d));
                }
                _ => {
                    upper.push(None);
                    lower.push(None);
                }
            }
        }
        let mut tags: Tags = s.tags.clone();
        for t in [
            "holtWintersForecast",
            "holtWintersDeviation",
            "holtWintersConfidenceUpper",
            "holtWintersConfidenceLower",
        ] {
            tags.set(t, "1");
        }
        let start = s.start + preview;
        for (which, values) in [("Lower", lower), ("Upper", upper)] {
            let name = format!("holtWintersConfidence{which}({})", s.name);
            let mut band = Series::new(&name, start, s.end, s.step, values);
            band.tags = tags.clone();
            band.path_expression = s.path_expression.clone();
            band.x_files_factor = s.x_files_factor;
            out.push(band);
        }
    }
    Ok(out)
}

/// `linearRegression`'s source range: the request's, or the times given.
fn source_range(a: &Args, ctx: &Ctx) -> Result<(i64, i64)> {
    let at = |i: usize, default: i64| -> Result<i64> {
        match a.opt_text(i) {
            Some(t) => crate::graphite::attime::parse(&t, ctx.now).map_err(bad),
            None => Ok(default),
        }
    };
    Ok((at(1, ctx.from)?, at(2, ctx.until)?))
}

/// graphite-web's `_linearRegressionAnalysis`: the line's factor and offset, none for fewer
/// than two points.
fn regression(s: &Series) -> Option<(f64, f64)> {
    let points = s.points();
    let present: Vec<(f64, f64)> = points
        .iter()
        .enumerate()
        .filter_map(|(i, v)| v.map(|v| (i as f64, v)))
        .collect();
    let n = present.len() as f64;
    let sum_i: f64 = present.iter().map(|p| p.0).sum();
    let sum_v = present.iter().fold(0.0, |a, p| a + p.1);
    let sum_ii: f64 = present.iter().map(|p| p.0 * p.0).sum();
    let sum_iv = present.iter().fold(0.0, |a, p| a + p.0 * p.1);
    let denominator = n * sum_ii - sum_i * sum_i;
    if denominator == 0.0 {
        return None;
    }
    let factor = (n * sum_iv - sum_i * sum_v) / denominator / s.step as f64;
    let offset = (sum_ii * sum_v - sum_iv * sum_i) / denominator - factor * s.start as f64;
    Some((factor, offset))
}

/// graphite-web's `nPercentile` of one series: a line at it, or nothing for an empty series.
pub(super) fn n_percentile(mut s: Series, n: f64) -> Option<Series> {
    let mut sorted = present(&s.points());
    sorted.sort_by(f64::total_cmp);
    if sorted.is_empty() {
        return None;
    }
    let p = percentile(
        &sorted.iter().map(|v| Some(*v)).collect::<Vec<_>>(),
        n,
        false,
    )?;
    s.tags.set("nPercentile", repr_string(n));
    let name = format!("nPercentile({}, {})", s.name, percent_g(n));
    let count = ((s.end - s.start) / s.step).max(0) as usize;
    Some(s.derived(name, vec![Some(p); count]))
}
