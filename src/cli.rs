//! `statsd-redis get …` (docs/reading.md): queries over what the agent stored, printed as aligned tables
//! (times in UTC) or, with `--json`, as JSON for scripts. Exit codes: 1 unknown series,
//! 2 bad arguments (clap), 3 Redis unreachable.

use std::fmt::Write as _;

use clap::Subcommand;
use serde_json::json;

use std::str::FromStr;

use crate::aggregate::StatKind;
use crate::config::Config;
use crate::store::query::{Moment, PercentilesQuery, Span, parse_duration, parse_quantile};
use crate::store::{Queries, QueryError, Store, StoreError, clock};

#[derive(Debug, Clone, Subcommand)]
pub enum Query {
    /// A counter's samples at one precision, oldest first (the book's get_counter).
    Counter {
        series: String,
        #[arg(long, default_value_t = 1)]
        precision: u64,
        #[command(flatten)]
        span: SpanArgs,
    },
    /// A timer's, histogram's or distribution's statistics for the current hour (get_stats).
    Stats {
        series: String,
        /// AccessTime (ms), Histogram (h) or Distribution (d).
        #[arg(default_value = "AccessTime", value_parser = StatKind::from_str)]
        kind: StatKind,
    },
    /// The timers with the highest average this hour.
    Slowest {
        #[arg(long, default_value_t = 10)]
        limit: usize,
    },
    /// Recent and common entries of a log (events and service checks).
    Log {
        name: String,
        #[arg(long, default_value = "info")]
        severity: String,
        #[arg(long, default_value_t = 20)]
        limit: usize,
    },
    /// A gauge's current value, or its value per slice with --precision.
    Gauge {
        series: String,
        #[arg(long)]
        precision: Option<u64>,
        #[command(flatten)]
        span: SpanArgs,
    },
    /// Distinct members of a set per slice.
    Set {
        series: String,
        #[arg(long, default_value_t = 60)]
        precision: u64,
        #[command(flatten)]
        span: SpanArgs,
    },
    /// Quantiles of a timer's, histogram's or distribution's values, merged from the buckets
    /// over the range: the current hour (default), the hour before, or the last DURATION.
    Percentiles {
        series: String,
        /// AccessTime (ms), Histogram (h) or Distribution (d).
        #[arg(long = "type", default_value = "AccessTime", value_parser = StatKind::from_str)]
        kind: StatKind,
        /// Quantiles between 0 and 1.
        #[arg(long, value_delimiter = ',', default_value = "0.5,0.9,0.99", value_parser = parse_quantile)]
        quantiles: Vec<f64>,
        /// The slices overlapping this long up to now: 90s, 15m, 6h, 2d (or seconds).
        #[arg(long, value_parser = parse_duration, conflicts_with = "hour")]
        last: Option<u64>,
        /// current, last, or a UTC hour YYYY-MM-DDTHH [default: current].
        #[arg(long)]
        hour: Option<String>,
        /// Slice precision for --last [default: the finest of quantile_precisions that keeps
        /// that long].
        #[arg(long, requires = "last")]
        precision: Option<u64>,
    },
    /// Known counter series (or gauges with --gauges) and their precisions.
    Known {
        /// Glob on the series name (`*` and `?`).
        #[arg(long = "match")]
        pattern: Option<String>,
        #[arg(long)]
        gauges: bool,
    },
}

/// The slices a history query shows [default: the whole retention up to now].
#[derive(Debug, Clone, clap::Args)]
pub struct SpanArgs {
    /// The oldest slice's start: Unix seconds, `now`, or a duration back (`-1d`, `-90m`).
    #[arg(long, value_parser = Moment::from_str, allow_hyphen_values = true)]
    from: Option<Moment>,
    /// The newest slice's start, in the same forms [default: now].
    #[arg(long, value_parser = Moment::from_str, allow_hyphen_values = true)]
    until: Option<Moment>,
}

impl SpanArgs {
    fn span(&self) -> Span {
        Span {
            from: self.from,
            until: self.until,
        }
    }
}

/// The exit code for a query's error: 1 unknown series, 2 bad arguments, 3 Redis unreachable.
pub fn exit_code(error: &QueryError) -> u8 {
    match error {
        QueryError::NotFound(_) => 1,
        QueryError::BadArgument(_) => 2,
        QueryError::Redis(_) => 3,
    }
}

/// Runs `query` against the Redis of `config`; returns what to print.
pub async fn run(config: &Config, query: &Query, as_json: bool) -> Result<String, QueryError> {
    if let Query::Gauge {
        precision: None,
        span,
        ..
    } = query
        && span.span() != Span::default()
    {
        return Err(QueryError::BadArgument(
            "--from and --until show slices: give --precision too".into(),
        ));
    }
    // The configuration was validated, so the store opens.
    let store = Store::open(config).map_err(|e| {
        StoreError::Redis(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "invalid configuration",
            e.to_string(),
        )))
    })?;
    let mut queries = Queries {
        reader: store.reader().await?,
        config,
        now: crate::store::clock::unix_now(),
    };
    let mut out = String::new();
    match query {
        Query::Counter {
            series,
            precision,
            span,
        } => {
            let samples = queries.counter(series, *precision, span.span()).await?;
            if as_json {
                return Ok(json!(samples).to_string());
            }
            table(
                &mut out,
                &["slice (UTC)", "count"],
                samples
                    .iter()
                    .map(|(s, c)| vec![clock::datetime(*s), c.to_string()]),
            );
        }
        Query::Stats { series, kind } => {
            let s = queries.stats(series, *kind).await?;
            if as_json {
                return Ok(json!(s).to_string());
            }
            let rows = [
                ("count", s.count),
                ("average", s.average),
                ("stddev", s.stddev),
                ("min", s.min),
                ("max", s.max),
                ("sum", s.sum),
                ("sumsq", s.sumsq),
            ];
            table(
                &mut out,
                &["stat", "value"],
                rows.iter().map(|(k, v)| vec![k.to_string(), number(*v)]),
            );
        }
        Query::Slowest { limit } => {
            let slowest = queries.slowest(*limit).await?;
            if as_json {
                return Ok(json!(slowest).to_string());
            }
            table(
                &mut out,
                &["series", "average"],
                slowest.iter().map(|(s, a)| vec![s.clone(), number(*a)]),
            );
        }
        Query::Log {
            name,
            severity,
            limit,
        } => {
            let log = queries.log(name, severity, *limit).await?;
            if as_json {
                return Ok(json!(log).to_string());
            }
            table(
                &mut out,
                &["recent"],
                log.recent.iter().map(|r| vec![r.clone()]),
            );
            out.push('\n');
            table(
                &mut out,
                &["count", "common this hour"],
                log.common.iter().map(|(m, c)| vec![number(*c), m.clone()]),
            );
        }
        Query::Gauge {
            series,
            precision: None,
            ..
        } => {
            let v = queries.gauge(series).await?;
            return Ok(if as_json {
                json!(v).to_string()
            } else {
                format!("{}\n", number(v))
            });
        }
        Query::Gauge {
            series,
            precision: Some(p),
            span,
        } => {
            let samples = queries.gauge_samples(series, *p, span.span()).await?;
            if as_json {
                return Ok(json!(samples).to_string());
            }
            table(
                &mut out,
                &["slice (UTC)", "value"],
                samples
                    .iter()
                    .map(|(s, v)| vec![clock::datetime(*s), number(*v)]),
            );
        }
        Query::Set {
            series,
            precision,
            span,
        } => {
            let samples = queries.set(series, *precision, span.span()).await?;
            if as_json {
                return Ok(json!(samples).to_string());
            }
            table(
                &mut out,
                &["slice (UTC)", "distinct"],
                samples
                    .iter()
                    .map(|(s, n)| vec![clock::datetime(*s), n.to_string()]),
            );
        }
        Query::Percentiles {
            series,
            kind,
            quantiles,
            last,
            hour,
            precision,
        } => {
            let query = PercentilesQuery {
                kind: *kind,
                quantiles: quantiles.clone(),
                last: *last,
                hour: hour.clone(),
                precision: *precision,
                by_slice: false,
            };
            let view = queries.percentiles(series, &query).await?;
            if as_json {
                return Ok(json!(view).to_string());
            }
            let over = match view.slices.as_slice() {
                [hour] if view.precision == 3600 => {
                    format!("the hour {}", clock::hour_start(*hour))
                }
                slices => format!(
                    "{} slices of {} s from {} (UTC)",
                    slices.len(),
                    view.precision,
                    slices
                        .first()
                        .map_or(String::new(), |s| clock::datetime(*s))
                ),
            };
            let _ = writeln!(
                out,
                "{series} ({}): {} values over {over}; each quantile within {}% of the exact one",
                kind.redis_name(),
                number(view.count),
                number(view.relative_accuracy * 100.0)
            );
            if let (Some(from), Some(&first), Some(&last)) =
                (view.arriving_from, view.slices.first(), view.slices.last())
                && from <= last
            {
                let _ = writeln!(
                    out,
                    "the slices from {} (UTC) on may still be receiving values",
                    clock::datetime(from.max(first))
                );
            }
            table(
                &mut out,
                &["quantile", "value"],
                view.quantiles.iter().map(|(q, v)| {
                    vec![
                        format!("p{}", number(q * 100.0)),
                        significant(*v, view.relative_accuracy),
                    ]
                }),
            );
        }
        Query::Known { pattern, gauges } => {
            let known = queries.known(*gauges, pattern.as_deref()).await?;
            if as_json {
                return Ok(json!(known).to_string());
            }
            let rows = known.iter().map(|k| {
                let p: Vec<String> = k.precisions.iter().map(u64::to_string).collect();
                vec![k.series.clone(), p.join(",")]
            });
            table(&mut out, &["series", "precisions"], rows);
        }
    }
    Ok(out)
}

/// A number as people write it: integers without a fraction, others to 6 significant places.
pub fn number(v: f64) -> String {
    if v.fract() == 0.0 && v.abs() < 1e15 {
        format!("{v:.0}")
    } else {
        let s = format!("{v:.6}");
        s.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// A value known to within `alpha` (relative), with the digits that says and no more: 4
/// significant ones at 1 %.
fn significant(v: f64, alpha: f64) -> String {
    if v == 0.0 || !v.is_finite() {
        return number(v);
    }
    let digits = (-alpha.log10()).ceil() as i32 + 2;
    let scale = 10f64.powi(digits - 1 - v.abs().log10().floor() as i32);
    number((v * scale).round() / scale)
}

/// Left-aligned text columns, right-aligned numeric ones.
fn table(out: &mut String, header: &[&str], rows: impl Iterator<Item = Vec<String>>) {
    let rows: Vec<Vec<String>> = rows.collect();
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for r in &rows {
        for (w, c) in widths.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let numeric: Vec<bool> = (0..header.len())
        .map(|i| !rows.is_empty() && rows.iter().all(|r| r[i].parse::<f64>().is_ok()))
        .collect();
    let line = |out: &mut String, cells: Vec<&str>| {
        let mut parts = Vec::new();
        for (i, c) in cells.iter().enumerate() {
            let pad = widths[i] - c.chars().count();
            parts.push(if numeric[i] {
                format!("{}{c}", " ".repeat(pad))
            } else if i + 1 == cells.len() {
                c.to_string()
            } else {
                format!("{c}{}", " ".repeat(pad))
            });
        }
        let _ = writeln!(out, "{}", parts.join("  "));
    };
    line(out, header.to_vec());
    for r in &rows {
        line(out, r.iter().map(String::as_str).collect());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantile_values_keep_the_digits_their_accuracy_gives() {
        assert_eq!(significant(100.494568, 0.01), "100.5");
        assert_eq!(significant(0.0123456, 0.01), "0.01235");
        assert_eq!(significant(320583.4, 0.01), "320600");
        assert_eq!(significant(-4.5678, 0.001), "-4.5678");
    }

    #[test]
    fn numbers() {
        assert_eq!(number(5.0), "5");
        assert_eq!(number(150.5), "150.5");
        assert_eq!(number(70.71067811865476), "70.710678");
    }

    #[test]
    fn tables_align() {
        let mut out = String::new();
        table(
            &mut out,
            &["slice (UTC)", "count"],
            [
                vec!["2026-11-22 04:00:00".into(), "5".into()],
                vec!["2026-11-22 04:00:01".into(), "12".into()],
            ]
            .into_iter(),
        );
        assert_eq!(
            out,
            "slice (UTC)          count\n2026-11-22 04:00:00      5\n2026-11-22 04:00:01     12\n"
        );
    }
}
