//! The read queries behind both `statsd-redis get` and the JSON API, over a [`Reader`]: each
//! parses its arguments the same way and says "not found" in the same words, whichever asks.
//! The CLI prints the answers as tables or JSON (`cli`), the API as JSON (`http::api`).

use std::str::FromStr;

use super::history::{self, Family, Geometry};
use super::reader::{KnownSeries, LogView, QuantileRange, QuantilesView, Reader, StatsView};
use super::{StoreError, clock};
use crate::aggregate::StatKind;
use crate::config::Config;
use crate::storage_conf::{Family as Named, Namer};

/// Why a query has no answer: exit code 1 / HTTP 404, 2 / 400, 3 / 503.
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    #[error("{0}")]
    NotFound(String),
    #[error("{0}")]
    BadArgument(String),
    #[error("{0}")]
    Redis(#[from] StoreError),
}

pub type QueryResult<T> = Result<T, QueryError>;

/// A moment as `from` and `until` take it: Unix seconds, `now`, or a duration back from now
/// (`-1d`, `-90m`, `-3600`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Moment {
    At(u64),
    Ago(u64),
}

impl Moment {
    pub fn at(self, now: u64) -> u64 {
        match self {
            Moment::At(t) => t,
            Moment::Ago(d) => now.saturating_sub(d),
        }
    }
}

impl FromStr for Moment {
    type Err = String;

    fn from_str(s: &str) -> Result<Moment, String> {
        match s {
            "now" => Ok(Moment::Ago(0)),
            _ => match s.strip_prefix('-') {
                Some(back) => parse_duration(back).map(Moment::Ago),
                None => s.parse().map(Moment::At).map_err(|_| {
                    format!("`{s}`: a time is Unix seconds, `now`, or a duration back (`-1d`)")
                }),
            },
        }
    }
}

/// The slices a read answers with: those whose start lies between `from` and `until`, both
/// included; a missing end is the retention's oldest slice, or the newest slice there is (one
/// a clock ahead wrote included). What is read from Redis is what the span holds, not the
/// whole retention.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Span {
    pub from: Option<Moment>,
    pub until: Option<Moment>,
}

impl Span {
    /// The first and last second the span holds at `now`.
    fn bounds(&self, now: u64) -> QueryResult<(u64, u64)> {
        let from = self.from.map_or(0, |m| m.at(now));
        let until = self.until.map_or(u64::MAX, |m| m.at(now));
        if from > until {
            return Err(QueryError::BadArgument(format!(
                "`from` ({from}) is after `until` ({until})"
            )));
        }
        Ok((from, until))
    }

    /// How a "not found" names the span: nothing for the whole retention.
    fn named(&self) -> &'static str {
        if *self == Span::default() {
            ""
        } else {
            " in that range"
        }
    }
}

/// What `percentiles` reads: the quantiles of a series over a range of slices.
#[derive(Debug, Clone, PartialEq)]
pub struct PercentilesQuery {
    pub kind: StatKind,
    pub quantiles: Vec<f64>,
    /// Seconds up to now; `None`: an hour.
    pub last: Option<u64>,
    /// `current`, `last` or `YYYY-MM-DDTHH` (UTC), when `last` is `None`.
    pub hour: Option<String>,
    /// The slices' precision for `last`; `None`: the finest that keeps that long.
    pub precision: Option<u64>,
    /// Each slice's quantiles too.
    pub by_slice: bool,
}

/// The queries of one reader; `config` says the precisions and how long slices are kept, `now`
/// (Unix seconds) where the present is.
pub struct Queries<'a> {
    pub reader: Reader,
    pub config: &'a Config,
    pub now: u64,
}

impl Queries<'_> {
    /// [`arriving_from`] now, under this agent's config.
    pub fn arriving_from(&self, schedule: Schedule, precision: u64) -> u64 {
        arriving_from(self.config, schedule, precision, self.now)
    }

    /// The book's `get_counter`: a counter's slices at `precision` in `span`, oldest first; of
    /// a long archive, its blocks' slices too.
    pub async fn counter(
        &mut self,
        series: &str,
        precision: u64,
        span: Span,
    ) -> QueryResult<Vec<(u64, i64)>> {
        let bounds = span.bounds(self.now)?;
        // The hash and its blocks in one read: a slice the cleaner moves from one into the
        // other between two reads would count twice.
        let mut samples =
            match self.history_range((series, precision, Named::Counter), true, bounds) {
                Some((range, cut)) => {
                    let (samples, older) = (self.reader)
                        .counter_with_history(series, precision, (range, self.now), cut)
                        .await?;
                    // A series with no hash has no history (it keeps its newest slice there).
                    if samples.is_empty() {
                        samples
                    } else {
                        combined(samples, older, |n, v| n.unwrap_or(0) + v as i64)
                    }
                }
                None => self.reader.counter(series, precision).await?,
            };
        within(&mut samples, bounds);
        found(samples, || {
            format!(
                "no counter `{series}` at precision {precision}{}",
                span.named()
            )
        })
    }

    /// What `series` is kept for: its names' schemas' (`storage_schemas`), else the agent's.
    fn stored(&self, family: Named, series: &str) -> crate::retention::Retention {
        (self.config.schemas()).stored(&Namer::new(self.config), family, series)
    }

    /// The slices a long archive's blocks may hold of `series` at `precision` (its own
    /// schema's retention up to now) within `(from, until)`, when the series has a hash there
    /// (the hash keeps its newest slice while it has history), and the agent's cut.
    fn history_range(
        &self,
        (series, precision, family): (&str, u64, Named),
        has_hash: bool,
        (from, until): (u64, u64),
    ) -> Option<((u64, u64), Geometry)> {
        let cut = self.config.retention().history(precision)?;
        let kept = self.stored(family, series).seconds(precision);
        let from = from.max(self.now.saturating_sub(kept));
        let until = until.min(self.now);
        (has_hash && from <= until).then_some(((from, until), cut))
    }

    /// `samples` (the hash's, or a set's HyperLogLogs', oldest first) with what the blocks of
    /// `name` (a hash's name, or a set's) hold over `range` in the retention's `cut`, oldest
    /// first: a slice only in a block is `combine(None, its value)`, one in both
    /// `combine(Some(sample), the block's value)`.
    async fn with_blocks<T: Copy>(
        &mut self,
        samples: Vec<(u64, T)>,
        (name, precision, family): (&str, u64, Family),
        (range, cut): ((u64, u64), Geometry),
        combine: impl Fn(Option<T>, f64) -> T,
    ) -> Result<Vec<(u64, T)>, StoreError> {
        let older = self
            .reader
            .history(name, precision, (range, self.now), (cut, family))
            .await?;
        Ok(combined(samples, older, combine))
    }

    /// A gauge's value per slice at `precision` in `span`, oldest first (of a long archive, its
    /// blocks' too); empty when it has none there.
    pub async fn gauge_history(
        &mut self,
        series: &str,
        precision: u64,
        span: Span,
    ) -> QueryResult<Vec<(u64, f64)>> {
        let bounds = span.bounds(self.now)?;
        let mut samples = self.reader.gauge_samples(series, precision).await?;
        if let Some(history) = self.history_range(
            (series, precision, Named::Gauge),
            !samples.is_empty(),
            bounds,
        ) {
            let hash = self.reader.keys().gauge(precision, series);
            let series = (hash.as_str(), precision, Family::Gauge);
            // The hash's value is the newer where both hold a slice.
            samples = self
                .with_blocks(samples, series, history, |g, v| g.unwrap_or(v))
                .await?;
        }
        within(&mut samples, bounds);
        Ok(samples)
    }

    /// The book's `get_stats` for the current hour.
    pub async fn stats(&mut self, series: &str, kind: StatKind) -> QueryResult<StatsView> {
        self.reader.stats(series, kind).await?.ok_or_else(|| {
            QueryError::NotFound(format!(
                "no {} statistics for `{series}` this hour",
                kind.redis_name()
            ))
        })
    }

    /// Quantiles merged from the buckets over the range `query` names.
    pub async fn percentiles(
        &mut self,
        series: &str,
        query: &PercentilesQuery,
    ) -> QueryResult<QuantilesView> {
        let range = quantile_range(
            self.config,
            query.last,
            query.hour.as_deref(),
            query.precision,
            self.now,
        )
        .map_err(QueryError::BadArgument)?;
        let view = self
            .reader
            .quantiles(
                (series, query.kind),
                &query.quantiles,
                range,
                (
                    query.by_slice,
                    super::quantile_blocks::hashes_from(
                        &self.config.retention(),
                        self.now,
                        range.precision,
                        self.config.cleaner_interval_secs,
                    ),
                ),
            )
            .await?
            .map(|view| QuantilesView {
                arriving_from: Some(self.arriving_from(Schedule::Buckets, range.precision)),
                ..view
            });
        view.ok_or_else(|| {
            QueryError::NotFound(format!(
                "no {} values of `{series}` in that range",
                query.kind.redis_name()
            ))
        })
    }

    /// The timers with the highest average this hour, highest first.
    pub async fn slowest(&mut self, limit: usize) -> QueryResult<Vec<(String, f64)>> {
        Ok(self.reader.slowest(limit).await?)
    }

    /// A log's newest entries and this hour's most common ones.
    pub async fn log(&mut self, name: &str, severity: &str, limit: usize) -> QueryResult<LogView> {
        let log = self.reader.log(name, severity, limit).await?;
        if log.recent.is_empty() && log.common.is_empty() {
            return Err(QueryError::NotFound(format!(
                "no log `{name}` with severity {severity}"
            )));
        }
        Ok(log)
    }

    /// A gauge's current value.
    pub async fn gauge(&mut self, series: &str) -> QueryResult<f64> {
        self.reader
            .gauge(series)
            .await?
            .ok_or_else(|| QueryError::NotFound(format!("no gauge `{series}`")))
    }

    /// A gauge's value per slice at `precision` in `span`, oldest first.
    pub async fn gauge_samples(
        &mut self,
        series: &str,
        precision: u64,
        span: Span,
    ) -> QueryResult<Vec<(u64, f64)>> {
        let samples = self.gauge_history(series, precision, span).await?;
        found(samples, || {
            format!(
                "no gauge `{series}` at precision {precision}{}",
                span.named()
            )
        })
    }

    /// A set's distinct members per slice at `precision` in `span`, for the slices kept: of a
    /// long archive, the newest in their HyperLogLogs and the older in blocks.
    pub async fn set(
        &mut self,
        series: &str,
        precision: u64,
        span: Span,
    ) -> QueryResult<Vec<(u64, u64)>> {
        let (from, until) = span.bounds(self.now)?;
        let retention = self.config.retention();
        let own = self.stored(Named::Set, series).samples(precision);
        let newest = super::keys::slice(until.min(self.now), precision);
        let kept = super::keys::slice(self.now, precision)
            .saturating_sub(own.saturating_sub(1) * precision);
        // The first slice that starts at or after `from`.
        let oldest = kept.max(from.div_ceil(precision.max(1)) * precision);
        if oldest > newest {
            return Err(QueryError::NotFound(format!(
                "no set `{series}` at precision {precision} in that range"
            )));
        }
        let cut = retention.history(precision);
        // What the cleaner has surely moved is read from the blocks only.
        let from_keys = match cut {
            Some(_) => oldest.max(history::set_keys_from(
                self.now,
                precision,
                self.config.cleaner_interval_secs,
            )),
            None => oldest,
        };
        let mut samples = self
            .reader
            .set(series, precision, (from_keys, newest))
            .await?;
        if let Some(cut) = cut {
            let name = self.reader.keys().set_series(precision, series);
            let series = (name.as_str(), precision, Family::Set);
            // The larger part where both hold a slice.
            samples = self
                .with_blocks(samples, series, ((oldest, newest), cut), |n, v| {
                    n.map_or(v as u64, |n| n.max(v as u64))
                })
                .await?;
        }
        found(samples, || {
            format!("no set `{series}` at precision {precision}{}", span.named())
        })
    }

    /// Known counter series (or gauges) whose name matches `pattern`, with their precisions.
    pub async fn known(
        &mut self,
        gauges: bool,
        pattern: Option<&str>,
    ) -> QueryResult<Vec<KnownSeries>> {
        Ok(self.reader.known(gauges, pattern).await?)
    }
}

/// What a slice holds, for [`arriving_from`]: each is written on its own schedule.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Schedule {
    /// Counters: every window, or once per `min(p, coarse_write_secs)` at a coarse precision
    /// (a period of a window or less is every window).
    Counters,
    /// Gauges and sets: every window.
    Values,
    /// Quantile buckets: every window, or once per `quantile_write_secs` after its group.
    Buckets,
}

/// The start of the oldest slice at `precision` that may still receive values at `now`: its
/// last window has not been written yet, or its group of windows is still being dealt over the
/// next period's windows. Slices before it are complete (unless the agent is behind: its
/// `backlog_windows`). A chart draws the slices from here on as still arriving, not as a drop.
pub fn arriving_from(config: &Config, schedule: Schedule, precision: u64, now: u64) -> u64 {
    let interval = config.flush_interval_secs;
    // A group of windows never spans two slices: the slice's last group ends with it and is
    // dealt over the next period's windows (coarse: min(p, K); buckets: Q), unless that period
    // is a window or less (written with every window).
    let period = match schedule {
        Schedule::Counters => precision.min(config.coarse_write_secs()),
        Schedule::Buckets => config.quantile_write_secs,
        Schedule::Values => 0,
    };
    let held = if period > interval { period } else { 0 };
    super::keys::slice(now.saturating_sub(interval + held), precision.max(1))
}

/// Keeps the samples whose slice starts between `from` and `until`.
fn within<T>(samples: &mut Vec<(u64, T)>, (from, until): (u64, u64)) {
    samples.retain(|(slice, _)| (from..=until).contains(slice));
}

/// `samples`, or not found (`what`) when there are none.
fn found<T>(samples: Vec<T>, what: impl FnOnce() -> String) -> QueryResult<Vec<T>> {
    if samples.is_empty() {
        Err(QueryError::NotFound(what()))
    } else {
        Ok(samples)
    }
}

impl FromStr for StatKind {
    type Err = String;

    /// The book's names and the protocol's: `AccessTime`/`ms`/`timer`, `Histogram`/`h`,
    /// `Distribution`/`d`, in any case.
    fn from_str(s: &str) -> Result<StatKind, String> {
        match s.to_ascii_lowercase().as_str() {
            "accesstime" | "ms" | "timer" => Ok(StatKind::Timer),
            "histogram" | "h" => Ok(StatKind::Histogram),
            "distribution" | "d" => Ok(StatKind::Distribution),
            _ => Err(format!(
                "unknown statistics type `{s}` (AccessTime, Histogram or Distribution)"
            )),
        }
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
/// retention covers it, else the coarsest), or one UTC hour (`current`, `last` or
/// `YYYY-MM-DDTHH`, from the 3600 s slices), the current hour when neither is given.
fn quantile_range(
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
    let retention = config.retention();
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
            let covering = sorted.iter().find(|&&p| retention.seconds(p) >= secs);
            *covering
                .or(sorted.last())
                .ok_or("no buckets are kept (quantile_precisions is empty)")?
        }
    };
    let range = QuantileRange::last(secs, precision, now);
    // Older slices have expired (each lives its precision's count of slices); a range past
    // them would only cost the reader and Redis a call per missing key.
    let samples = retention.samples(precision);
    let kept = samples.saturating_add(1).min(MAX_QUANTILE_SLICES);
    if range.slice_count() > kept {
        return Err(format!(
            "the last {secs} s are {} slices of {precision} s; at most {kept} are kept \
             (its retention is {samples} slices): ask for less, or a coarser precision of {:?}",
            range.slice_count(),
            config.quantile_precisions
        ));
    }
    Ok(range)
}

/// The most slices one percentiles query reads, whatever `sample_count` is.
const MAX_QUANTILE_SLICES: u64 = 10_000;

/// `samples` (oldest first) with the blocks' `older` slices: a slice only in a block is
/// `combine(None, its value)`, one in both `combine(Some(sample), the block's value)`.
fn combined<T: Copy>(
    samples: Vec<(u64, T)>,
    older: Vec<(u64, f64)>,
    combine: impl Fn(Option<T>, f64) -> T,
) -> Vec<(u64, T)> {
    let mut all: std::collections::BTreeMap<u64, T> = samples.into_iter().collect();
    for (slice, v) in older {
        let held = all.get(&slice).copied();
        all.insert(slice, combine(held, v));
    }
    all.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn moments_and_spans() {
        let now = 1_800_000_000;
        let at = |s: &str| s.parse::<Moment>().map(|m| m.at(now));
        assert_eq!(at("now"), Ok(now));
        assert_eq!(at("-1d"), Ok(now - 86_400));
        assert_eq!(at("-90m"), Ok(now - 5_400));
        assert_eq!(at("-3600"), Ok(now - 3_600));
        assert_eq!(at("1700000000"), Ok(1_700_000_000));
        for bad in ["", "-", "-0", "yesterday", "-1y", "1.5", "+1d"] {
            assert!(at(bad).is_err(), "{bad:?}");
        }
        assert_eq!(Span::default().bounds(now).unwrap(), (0, u64::MAX));
        let span = |from: &str, until: &str| Span {
            from: Some(from.parse().unwrap()),
            until: Some(until.parse().unwrap()),
        };
        assert_eq!(
            span("-2d", "-1d").bounds(now).unwrap(),
            (now - 172_800, now - 86_400)
        );
        assert!(span("-1d", "-2d").bounds(now).is_err());
        let mut samples = vec![(60, 'a'), (120, 'b'), (180, 'c')];
        within(&mut samples, (61, 180));
        assert_eq!(samples, [(120, 'b'), (180, 'c')]);
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
            range(Some(120 * 60), None, Some(60)).map(|r| r.slice_count()),
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
    fn slices_still_arriving() {
        use Schedule::{Buckets, Counters, Values};
        let now = 1_795_320_489; // 14:08:09 UTC
        let k60 = Config {
            quantile_write_secs: 0,
            coarse_write_secs: Some(60),
            ..Config::default()
        };
        let (def, minute, hour) = (Config::default(), now / 60 * 60, now / 3600 * 3600);
        // A coarse slice's last group is dealt over the next min(p, K) seconds.
        let (g5, g300) = ((now - 1 - 5) / 5 * 5, (now - 1 - 60) / 300 * 300);
        for (config, schedule, p, want, what) in [
            (&def, Counters, 1, now - 1, "the window being written"),
            (&def, Counters, 60, minute, "the minute filling"),
            (&def, Values, 3600, hour, "the hour filling"),
            // A minute's buckets are written during the next minute: 14:07 is still arriving.
            (&def, Buckets, 60, minute - 60, "the minute before too"),
            (&def, Buckets, 3600, hour, "the hour filling"),
            (&k60, Buckets, 60, minute, "buckets every window"),
            (&k60, Counters, 1, now - 1, "1 s counters every window"),
            (&k60, Counters, 5, g5, "a 5 s group being dealt"),
            (&k60, Counters, 300, g300, "a 60 s group being dealt"),
            (&k60, Values, 5, (now - 1) / 5 * 5, "gauges every window"),
        ] {
            assert_eq!(arriving_from(config, schedule, p, now), want, "{what}");
        }
    }

    #[test]
    fn stat_kinds() {
        assert_eq!("ms".parse(), Ok(StatKind::Timer));
        assert_eq!("Histogram".parse(), Ok(StatKind::Histogram));
        assert!("x".parse::<StatKind>().is_err());
    }
}
