//! `statsd-redis get …` (SPEC §6): queries over what the agent stored, printed as aligned tables
//! (times in UTC) or, with `--json`, as JSON for scripts. Exit codes: 1 unknown series,
//! 2 bad arguments (clap), 3 Redis unreachable.

use std::fmt::Write as _;

use clap::Subcommand;
use serde_json::json;

use crate::aggregate::StatKind;
use crate::config::Config;
use crate::store::{QuantileRange, Store, StoreError, clock};

#[derive(Debug, Clone, Subcommand)]
pub enum Query {
    /// A counter's samples at one precision, oldest first (the book's get_counter).
    Counter {
        series: String,
        #[arg(long, default_value_t = 1)]
        precision: u64,
    },
    /// A timer's, histogram's or distribution's statistics for the current hour (get_stats).
    Stats {
        series: String,
        /// AccessTime (ms), Histogram (h) or Distribution (d).
        #[arg(default_value = "AccessTime", value_parser = parse_stat_kind)]
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
    },
    /// Distinct members of a set per slice.
    Set {
        series: String,
        #[arg(long, default_value_t = 60)]
        precision: u64,
    },
    /// Quantiles of a timer's, histogram's or distribution's values, merged from the buckets
    /// over the range: the current hour (default), the hour before, or the last DURATION.
    Percentiles {
        series: String,
        /// AccessTime (ms), Histogram (h) or Distribution (d).
        #[arg(long = "type", default_value = "AccessTime", value_parser = parse_stat_kind)]
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

pub fn parse_stat_kind(s: &str) -> Result<StatKind, String> {
    match s.to_ascii_lowercase().as_str() {
        "accesstime" | "ms" | "timer" => Ok(StatKind::Timer),
        "histogram" | "h" => Ok(StatKind::Histogram),
        "distribution" | "d" => Ok(StatKind::Distribution),
        _ => Err(format!(
            "unknown statistics type `{s}` (AccessTime, Histogram or Distribution)"
        )),
    }
}

pub fn parse_quantile(s: &str) -> Result<f64, String> {
    s.parse::<f64>()
        .ok()
        .filter(|q| (0.0..=1.0).contains(q))
        .ok_or_else(|| format!("`{s}` is not a quantile between 0 and 1"))
}

/// `90s`, `15m`, `6h`, `2d`, or plain seconds.
pub fn parse_duration(s: &str) -> Result<u64, String> {
    let (number, unit) = match s.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => s.split_at(at),
        None => (s, "s"),
    };
    let scale = match unit {
        "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        _ => return Err(format!("`{s}`: a duration is a number and s, m, h or d")),
    };
    number
        .parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .and_then(|n| n.checked_mul(scale))
        .ok_or_else(|| format!("`{s}`: a duration is a number and s, m, h or d"))
}

/// The range of `get percentiles` and of the API's percentiles: the slices overlapping the
/// `last` seconds at `precision` (by default the finest of `quantile_precisions` whose
/// `sample_count` slices cover it, else the coarsest), or one UTC hour (`current`, `last` or
/// `YYYY-MM-DDTHH`, from the 3600 s slices), the current hour when neither is given.
pub fn quantile_range(
    config: &Config,
    last: Option<u64>,
    hour: Option<&str>,
    precision: Option<u64>,
    now: u64,
) -> Result<QuantileRange, String> {
    let kept = &config.quantile_precisions;
    let Some(secs) = last else {
        if !kept.contains(&3600) {
            return Err(format!(
                "hours are the 3600 s slices, and quantile_precisions is {kept:?}: use --last"
            ));
        }
        let at = match hour.unwrap_or("current") {
            "current" => now,
            "last" => now.saturating_sub(3600),
            text => clock::parse_hour(text).ok_or_else(|| {
                format!("`{text}`: an hour is current, last or YYYY-MM-DDTHH (UTC)")
            })?,
        };
        return Ok(QuantileRange::hour(at));
    };
    let precision = match precision {
        Some(p) if kept.contains(&p) => p,
        Some(p) => {
            return Err(format!(
                "buckets are kept per slice at {kept:?} s (quantile_precisions), not {p}"
            ));
        }
        None => {
            let mut sorted = kept.clone();
            sorted.sort_unstable();
            let covering = sorted
                .iter()
                .find(|&&p| p.saturating_mul(config.sample_count) >= secs);
            *covering
                .or(sorted.last())
                .ok_or("no buckets are kept (quantile_precisions is empty)")?
        }
    };
    let range = QuantileRange::last(secs, precision, now);
    // Older slices have expired (each lives sample_count slices); a range past them would only
    // cost the reader and Redis a call per missing key.
    let kept = config
        .sample_count
        .saturating_add(1)
        .min(MAX_QUANTILE_SLICES);
    if range.len() > kept {
        return Err(format!(
            "the last {secs} s are {} slices of {precision} s; at most {kept} are kept \
             (sample_count {}): ask for less, or a coarser precision of {:?}",
            range.len(),
            config.sample_count,
            config.quantile_precisions
        ));
    }
    Ok(range)
}

/// The most slices one percentiles query reads, whatever `sample_count` is.
const MAX_QUANTILE_SLICES: u64 = 10_000;

#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    Redis(#[from] StoreError),
    #[error("{0}")]
    BadArgument(String),
}

impl QueryError {
    pub fn exit_code(&self) -> u8 {
        match self {
            QueryError::NotFound(_) => 1,
            QueryError::Redis(_) => 3,
            QueryError::BadArgument(_) => 2,
        }
    }
}

/// Runs `query` against the Redis of `config`; returns what to print.
pub async fn run(config: &Config, query: &Query, as_json: bool) -> Result<String, QueryError> {
    // The configuration was validated, so the store opens.
    let store = Store::open(config).map_err(|e| {
        StoreError::Redis(redis::RedisError::from((
            redis::ErrorKind::InvalidClientConfig,
            "invalid configuration",
            e.to_string(),
        )))
    })?;
    let mut reader = store.reader().await?;
    let not_found = |what: String| Err(QueryError::NotFound(what));
    let mut out = String::new();
    match query {
        Query::Counter { series, precision } => {
            let samples = reader.counter(series, *precision).await?;
            if samples.is_empty() {
                return not_found(format!("no counter `{series}` at precision {precision}"));
            }
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
            let Some(s) = reader.stats(series, *kind).await? else {
                return not_found(format!(
                    "no {} statistics for `{series}` this hour",
                    kind.redis_name()
                ));
            };
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
            let slowest = reader.slowest(*limit).await?;
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
            let log = reader.log(name, severity, *limit).await?;
            if log.recent.is_empty() && log.common.is_empty() {
                return not_found(format!("no log `{name}` with severity {severity}"));
            }
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
        } => {
            let Some(v) = reader.gauge(series).await? else {
                return not_found(format!("no gauge `{series}`"));
            };
            return Ok(if as_json {
                json!(v).to_string()
            } else {
                format!("{}\n", number(v))
            });
        }
        Query::Gauge {
            series,
            precision: Some(p),
        } => {
            let samples = reader.gauge_samples(series, *p).await?;
            if samples.is_empty() {
                return not_found(format!("no gauge `{series}` at precision {p}"));
            }
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
        Query::Set { series, precision } => {
            let samples = reader
                .set(series, *precision, clock::unix_now(), config.sample_count)
                .await?;
            if samples.is_empty() {
                return not_found(format!("no set `{series}` at precision {precision}"));
            }
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
            let range = quantile_range(
                config,
                *last,
                hour.as_deref(),
                *precision,
                clock::unix_now(),
            )
            .map_err(QueryError::BadArgument)?;
            let Some(view) = reader
                .quantiles(series, *kind, quantiles, range, false)
                .await?
            else {
                return not_found(format!(
                    "no {} values of `{series}` in that range",
                    kind.redis_name()
                ));
            };
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
            let known = reader.known(*gauges, pattern.as_deref()).await?;
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

    #[test]
    fn durations_and_ranges() {
        assert_eq!(parse_duration("15m"), Ok(900));
        assert_eq!(parse_duration("90"), Ok(90));
        assert_eq!(parse_duration("2d"), Ok(172_800));
        assert!(parse_duration("5x").is_err() && parse_duration("0m").is_err());
        let config = Config::default();
        let now = 1_795_320_489;
        let range = |last, hour, p| quantile_range(&config, last, hour, p, now);
        assert_eq!(
            range(Some(900), None, None),
            Ok(QuantileRange::last(900, 60, now)),
            "120 minutes cover 15"
        );
        assert_eq!(
            range(Some(86_400), None, None),
            Ok(QuantileRange::last(86_400, 3600, now)),
            "a day needs hours"
        );
        assert!(
            range(Some(900), None, Some(5)).is_err(),
            "5 s slices are not kept"
        );
        let too_long = range(Some(365 * 86_400), None, Some(60)).unwrap_err();
        assert!(too_long.contains("525601 slices"), "{too_long}");
        assert!(
            range(Some(365 * 86_400), None, None).is_err(),
            "past every slice kept"
        );
        assert_eq!(
            range(Some(120 * 60), None, Some(60)).map(|r| r.len()),
            Ok(121)
        );
        let many = Config {
            sample_count: 1_000_000,
            ..Config::default()
        };
        assert!(quantile_range(&many, Some(365 * 86_400), None, Some(60), now).is_err());
        assert_eq!(range(None, None, None), Ok(QuantileRange::hour(now)));
        assert_eq!(
            range(None, Some("last"), None),
            Ok(QuantileRange::hour(now - 3600))
        );
        assert_eq!(
            range(None, Some("2026-11-21T14"), None),
            Ok(QuantileRange::hour(1_795_320_000 - 14 * 3600))
        );
        assert!(range(None, Some("yesterday"), None).is_err());
    }

    #[test]
    fn stat_kinds() {
        assert_eq!(parse_stat_kind("ms"), Ok(StatKind::Timer));
        assert_eq!(parse_stat_kind("Histogram"), Ok(StatKind::Histogram));
        assert!(parse_stat_kind("x").is_err());
    }
}
