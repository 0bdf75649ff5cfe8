//! The chunk vocabulary both topologies share: a [`FlushChunk`] (its writes packed in
//! `flush.lua`'s argument layout, [`Argv`]), what a chunk may hold ([`plan`] and the cost
//! constants), what it does with counters at each precision ([`CounterWrite`]), the settings
//! every chunk carries, and the one-server encoder [`build_chunks`].

use redis::{RedisWrite, ToRedisArgs};

use crate::aggregate::points::SeriesPoints;
use crate::aggregate::{
    Buckets, ClosedWindow, LogEntry, Member, SeriesName, StatKind, Stats, sketch,
};
use crate::retention::Retention;
use crate::storage_conf::Schemas;
use crate::store::{Keys, StoreError, clock, keys};

/// What a set of chunks writes of a closed window: all of it ([`Parts::of`]), or under
/// `storage_schemas` the series that one list of precisions is written for
/// ([`super::Chunker::chunks`]).
#[derive(Debug, Clone, Copy)]
pub struct Parts<'a> {
    pub start: u64,
    pub counters: &'a [(SeriesName, i64)],
    pub stats: &'a [(SeriesName, StatKind, Stats)],
    pub gauges: &'a [(SeriesName, f64)],
    pub sets: &'a [(SeriesName, Vec<Member>)],
    pub logs: &'a [LogEntry],
    pub points: &'a [SeriesPoints],
}

impl<'a> Parts<'a> {
    /// The whole of `window`.
    pub fn of(window: &'a ClosedWindow) -> Parts<'a> {
        Parts {
            start: window.start,
            counters: &window.counters,
            stats: &window.stats,
            gauges: &window.gauges,
            sets: &window.sets,
            logs: &window.logs,
            points: &window.points,
        }
    }
}

/// A bounded part of a window: applied atomically, and at most once thanks to its number.
#[derive(Debug, Clone)]
pub struct FlushChunk {
    /// Series (and log entries) it carries.
    pub series: usize,
    /// Its place in the run's sending order, from 1: a chunk is applied only above the run's
    /// last applied number (`standalone.rs`; `flush_slot.lua` in a cluster).
    pub seq: u64,
    /// Its writes in `flush.lua`'s argument layout, fixed when the window closed so every retry
    /// sends the same values.
    argv: Argv,
}

/// A chunk's script arguments, packed: one buffer and where each argument ends. It waits in the
/// backlog (coarse groups for up to a period), so it costs 4 bytes per argument beside the bytes
/// themselves, where a `redis::Cmd` costs 16 and grows by doubling; a `Cmd` is made from it only
/// when the chunk is sent.
#[derive(Debug, Clone, Default)]
pub(super) struct Argv {
    data: Vec<u8>,
    ends: Vec<u32>,
}

impl Argv {
    pub(super) fn arg(&mut self, value: impl ToRedisArgs) -> &mut Argv {
        value.write_redis_args(self);
        self
    }

    /// The number of arguments.
    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Appends `other`'s arguments.
    pub(super) fn append(&mut self, other: &Argv) {
        let base = self.data.len() as u32;
        self.data.extend_from_slice(&other.data);
        self.ends.extend(other.ends.iter().map(|e| e + base));
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .map(|(start, &end)| &self.data[start as usize..end as usize])
    }

    fn end_arg(&mut self) {
        // A chunk holds at most a few megabytes (bounded series, sets cost per 100 members).
        self.ends
            .push(u32::try_from(self.data.len()).unwrap_or(u32::MAX));
    }
}

impl RedisWrite for Argv {
    fn write_arg(&mut self, arg: &[u8]) {
        self.data.extend_from_slice(arg);
        self.end_arg();
    }

    fn writer_for_next_arg(&mut self) -> impl std::io::Write + '_ {
        /// Ends the argument when the caller is done writing it.
        struct Guard<'a>(&'a mut Argv);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                self.0.end_arg();
            }
        }
        impl std::io::Write for Guard<'_> {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.data.extend_from_slice(buf);
                Ok(buf.len())
            }

            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        Guard(self)
    }
}

impl FlushChunk {
    /// A chunk of `series` series whose arguments are `argv`, numbered 0 until the flusher
    /// numbers it.
    pub(super) fn packed(series: usize, mut argv: Argv) -> FlushChunk {
        argv.data.shrink_to_fit();
        argv.ends.shrink_to_fit();
        FlushChunk {
            series,
            seq: 0,
            argv,
        }
    }

    /// Its arguments one by one.
    pub(super) fn args(&self) -> impl Iterator<Item = &[u8]> {
        self.argv.iter()
    }

    /// A slot chunk's data keys (after their count).
    pub(super) fn data_keys(&self) -> impl Iterator<Item = &[u8]> {
        self.argv.iter().skip(1).take(self.data_key_count())
    }

    /// A slot chunk's number of data keys: its first argument.
    pub(super) fn data_key_count(&self) -> usize {
        self.argv.iter().next().and_then(number).unwrap_or(0)
    }

    /// The hash slot of a slot chunk (cluster mode): its first data key's, after the key count.
    pub fn slot(&self) -> u16 {
        keys::slot_of(self.data_keys().next().unwrap_or_default())
    }

    /// The packed script arguments (bytes, and where each argument ends), for the spool.
    pub fn parts(&self) -> (&[u8], &[u32]) {
        (&self.argv.data, &self.argv.ends)
    }

    /// A chunk from its [`FlushChunk::parts`], as read back from the spool; `None` unless the
    /// ends are in order within `data`.
    pub fn from_parts(
        seq: u64,
        series: usize,
        data: Vec<u8>,
        ends: Vec<u32>,
    ) -> Option<FlushChunk> {
        let ordered = ends.windows(2).all(|w| w[0] <= w[1]);
        let within = ends.last().is_none_or(|&e| e as usize <= data.len());
        (ordered && within).then_some(FlushChunk {
            series,
            seq,
            argv: Argv { data, ends },
        })
    }

    /// Bytes it keeps in memory (and about as many in the spool).
    pub fn bytes(&self) -> usize {
        self.argv.data.len() + 4 * self.argv.ends.len()
    }
}

/// What a chunk may hold: `max_series` series, a set costing one more per this many members...
pub(super) const SET_MEMBERS_PER_SERIES: usize = 100;
/// ... and a statistics item one more per this many bucket writes (its buckets times the
/// quantile precisions; a bucket write costs Redis about a twentieth of a counter series at
/// the seven precisions): a chunk of a minute's buckets (`quantile_write_secs`), or of wide
/// histograms, keeps Redis busy for about as long as any other chunk, a few milliseconds.
pub(super) const BUCKET_WRITES_PER_SERIES: usize = 24;

/// ... and a carbon series one more per this many points (a point's write and the
/// recomputed coarser slices cost Redis about what a counter series' seven writes do).
pub(super) const POINTS_PER_SERIES: usize = 4;

/// The part of a closed window that one chunk carries, as index ranges into its vectors.
#[derive(Default)]
struct Part {
    counters: (usize, usize),
    stats: (usize, usize),
    gauges: (usize, usize),
    sets: (usize, usize),
    logs: (usize, usize),
    points: (usize, usize),
}

/// Splits `[0, len)` of each section (`counters` of the window's counters) into chunks of at
/// most `budget` cost, in section order.
fn plan(window: Parts<'_>, counters: usize, budget: usize, quantiles: usize) -> Vec<Part> {
    let set_cost = |i: usize| 1 + window.sets[i].1.len() / SET_MEMBERS_PER_SERIES;
    let stat_cost =
        |i: usize| 1 + window.stats[i].2.buckets.len() * quantiles / BUCKET_WRITES_PER_SERIES;
    let point_cost = |i: usize| 1 + window.points[i].placed.len() / POINTS_PER_SERIES;
    let sections: [(usize, &dyn Fn(usize) -> usize); 6] = [
        (counters, &|_| 1),
        (window.stats.len(), &stat_cost),
        (window.gauges.len(), &|_| 1),
        (window.sets.len(), &set_cost),
        (window.logs.len(), &|_| 1),
        (window.points.len(), &point_cost),
    ];
    let mut chunks = Vec::new();
    let mut current = Part::default();
    let mut cost = 0;
    for (section, (len, item_cost)) in sections.iter().enumerate() {
        let mut start = 0;
        for item in 0..*len {
            let c = item_cost(item);
            if cost > 0 && cost + c > budget {
                *current.section(section) = (start, item);
                chunks.push(std::mem::take(&mut current));
                start = item;
                cost = 0;
            }
            cost += c;
        }
        *current.section(section) = (start, *len);
    }
    if cost > 0 {
        chunks.push(current);
    }
    chunks
}

impl Part {
    fn section(&mut self, i: usize) -> &mut (usize, usize) {
        [
            &mut self.counters,
            &mut self.stats,
            &mut self.gauges,
            &mut self.sets,
            &mut self.logs,
            &mut self.points,
        ]
        .into_iter()
        .nth(i)
        .expect("six sections")
    }
}

/// What a chunk does with its counters at one precision. Gauges and sets are written at every
/// precision the chunk lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterWrite {
    /// Nothing at this precision.
    Skip = 0,
    /// `HINCRBY`, and the index member with a new slice.
    Write = 1,
    /// `HINCRBY` only (`coarse_write_secs`): a later chunk of this agent adds the index member
    /// (the 1 s precision, indexed once per period, not every second), or it is there already
    /// (a series a coarse level wrote in the group before too).
    WriteUnindexed = 2,
    /// The index member only, for counters that earlier chunks wrote unindexed.
    IndexOnly = 3,
}

impl CounterWrite {
    /// Every precision written and indexed: a window written whole.
    pub fn everywhere(precisions: &[u64]) -> Vec<(u64, CounterWrite)> {
        precisions
            .iter()
            .map(|&p| (p, CounterWrite::Write))
            .collect()
    }
}

/// What every chunk of an agent carries beside its window's data.
#[derive(Debug, Clone)]
pub struct ChunkSettings {
    pub keys: Keys,
    /// How long each precision's slices are kept (sets' and quantile slices' expiry; the
    /// scripts take it as `Retention::encode` writes it).
    pub retention: Retention,
    /// Each path's own schema (`storage_schemas`): the archives a carbon series' points are
    /// placed in and carried down through.
    pub schemas: Schemas,
    /// Idle lifetime of the log keys (`recent:`, `common:`); 0: none.
    pub log_ttl_secs: u64,
    pub max_series: usize,
    pub quantiles: QuantileSettings,
}

#[cfg(test)]
impl ChunkSettings {
    /// Settings of the unit tests: `prefix`, `max_series` a chunk, the other defaults.
    pub(crate) fn for_tests(prefix: &str, max_series: usize) -> ChunkSettings {
        ChunkSettings {
            keys: Keys::new(prefix),
            retention: Retention::book(&crate::config::DEFAULT_PRECISIONS, 120),
            schemas: Schemas::single(Retention::book(&crate::config::DEFAULT_PRECISIONS, 120)),
            log_ttl_secs: 0,
            max_series,
            quantiles: Default::default(),
        }
    }
}

/// How the statistics' quantile buckets are kept (`quantile_relative_accuracy`,
/// `quantile_precisions`).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantileSettings {
    pub alpha: f64,
    pub precisions: Vec<u64>,
}

impl Default for QuantileSettings {
    fn default() -> Self {
        let config = crate::config::Config::default();
        QuantileSettings {
            alpha: config.quantile_relative_accuracy,
            precisions: config.quantile_precisions,
        }
    }
}

/// Splits a closed window into chunks of at most `max_series` series each, each packed in
/// `flush.lua`'s argument layout (documented there), numbered 0 until the flusher numbers them
/// in sending order.
pub fn build_chunks(
    window: &ClosedWindow,
    precisions: &[(u64, CounterWrite)],
    settings: &ChunkSettings,
) -> Vec<FlushChunk> {
    build_parts(Parts::of(window), precisions, settings)
}

/// [`build_chunks`] of `window`'s parts.
pub(super) fn build_parts(
    window: Parts<'_>,
    precisions: &[(u64, CounterWrite)],
    settings: &ChunkSettings,
) -> Vec<FlushChunk> {
    let keys = &settings.keys;
    let hour = clock::hour_start(window.start);
    let asctime = clock::asctime(window.start);
    // Counters that no listed precision takes (all of them coarse) are left out, not sent.
    let counted = precisions.iter().any(|(_, c)| *c != CounterWrite::Skip);
    let all_counters: &[(SeriesName, i64)] = if counted { window.counters } else { &[] };
    let quantiles = settings.quantiles.precisions.len();
    plan(window, all_counters.len(), settings.max_series, quantiles)
        .into_iter()
        .map(|part| {
            let mut cmd = Argv::default();
            cmd.arg(keys.prefix())
                .arg(settings.retention.encode())
                .arg(&hour)
                .arg(&asctime)
                .arg(settings.log_ttl_secs)
                .arg(precisions.len());
            for &(p, counters) in precisions {
                cmd.arg(p)
                    .arg(keys::slice(window.start, p))
                    .arg(counters as u8);
            }
            let quantiles = &settings.quantiles;
            cmd.arg(quantiles.alpha)
                .arg(sketch::MAX_BUCKETS)
                .arg(quantiles.precisions.len());
            for &p in &quantiles.precisions {
                let slice = keys::slice(window.start, p);
                cmd.arg(p)
                    .arg(slice)
                    .arg(slice + settings.retention.seconds(p));
            }
            let counters = &all_counters[part.counters.0..part.counters.1];
            cmd.arg(counters.len());
            for (series, n) in counters {
                cmd.arg(&**series).arg(*n);
            }
            let stats = &window.stats[part.stats.0..part.stats.1];
            cmd.arg(stats.len());
            for (series, kind, s) in stats {
                cmd.arg(&**series)
                    .arg(kind.redis_name())
                    .arg(s.count)
                    .arg(s.sum)
                    .arg(s.sumsq)
                    .arg(s.min)
                    .arg(s.max);
                put_buckets(&mut cmd, &s.buckets);
            }
            let gauges = &window.gauges[part.gauges.0..part.gauges.1];
            cmd.arg(gauges.len());
            for (series, value) in gauges {
                cmd.arg(&**series).arg(*value);
            }
            let sets = &window.sets[part.sets.0..part.sets.1];
            cmd.arg(sets.len());
            for (series, members) in sets {
                cmd.arg(&**series).arg(members.len());
                for m in members {
                    cmd.arg(&**m);
                }
            }
            let logs = &window.logs[part.logs.0..part.logs.1];
            cmd.arg(logs.len());
            for log in logs {
                cmd.arg(&log.name)
                    .arg(log.severity.as_str())
                    .arg(&log.message);
            }
            let points = &window.points[part.points.0..part.points.1];
            put_points(&mut cmd, points, settings, window.start);
            FlushChunk::packed(
                counters.len()
                    + stats.len()
                    + gauges.len()
                    + sets.len()
                    + logs.len()
                    + points.len(),
                cmd,
            )
        })
        .collect()
}

/// A statistics item's buckets: their count, then field and weight of each.
pub(super) fn put_buckets(cmd: &mut Argv, buckets: &Buckets) {
    cmd.arg(buckets.len());
    for (bucket, weight) in buckets.iter() {
        cmd.arg(bucket.field());
        // Whole counts (no sample rate) as integers: the script stores a new bucket's count
        // as sent, and Redis keeps an integer string as a number.
        if weight.fract() == 0.0 && weight.abs() < 1e15 {
            cmd.arg(weight as i64);
        } else {
            cmd.arg(weight);
        }
    }
}

/// The points sections (`flush.lua`), one a schema that `points` use (none: one empty
/// section, `0`): `plan` and its count (`plan`: of this build's layout); then the schema's archives (precision, seconds kept,
/// slots a block or 0: the agent's [`Retention::history`], where the cleaner cuts blocks),
/// then each series' item as the agent planned it ([`super::points::put_item`]).
fn put_points(cmd: &mut Argv, points: &[SeriesPoints], settings: &ChunkSettings, now: u64) {
    if points.is_empty() {
        cmd.arg(0);
        return;
    }
    let mut schemas: Vec<usize> = points.iter().map(|s| s.schema).collect();
    schemas.sort_unstable();
    schemas.dedup();
    for schema in schemas {
        let points: Vec<&SeriesPoints> = points.iter().filter(|s| s.schema == schema).collect();
        put_schema_points(
            cmd,
            &points,
            settings,
            settings.schemas.retention(schema),
            now,
        );
    }
}

/// One points section: `points`, all of the schema `own`.
fn put_schema_points(
    cmd: &mut Argv,
    points: &[&SeriesPoints],
    settings: &ChunkSettings,
    own: &Retention,
    now: u64,
) {
    cmd.arg("plan").arg(points.len());
    let archives: Vec<super::points::Archive> = crate::aggregate::points::archives(own)
        .into_iter()
        .map(|(p, kept)| super::points::Archive {
            p,
            kept,
            slots: settings.retention.history(p).map_or(0, |g| g.slots),
        })
        .collect();
    cmd.arg(archives.len());
    for a in &archives {
        cmd.arg(a.p).arg(a.kept).arg(a.slots);
    }
    for s in points {
        super::points::put_item(cmd, s, &archives, now);
    }
}

/// A number written as text in a chunk's arguments or a reply.
pub(super) fn number<T: std::str::FromStr>(bytes: &[u8]) -> Option<T> {
    std::str::from_utf8(bytes).ok()?.parse().ok()
}

/// A reply the writer cannot read, as an error.
pub(crate) fn unexpected(what: &'static str) -> StoreError {
    StoreError::Redis(redis::RedisError::from((redis::ErrorKind::Client, what)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{LogEntry, Severity};

    fn window(counters: usize, sets: &[usize], logs: usize) -> ClosedWindow {
        ClosedWindow {
            start: 100,
            counters: (0..counters).map(|i| (format!("c{i}").into(), 1)).collect(),
            sets: sets
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    (
                        format!("s{i}").into(),
                        (0..*m).map(|j| j.to_string().into_bytes().into()).collect(),
                    )
                })
                .collect(),
            logs: (0..logs)
                .map(|_| LogEntry {
                    name: "n".into(),
                    severity: Severity::Info,
                    message: "m".into(),
                })
                .collect(),
            ..ClosedWindow::default()
        }
    }

    fn chunk_sizes(w: &ClosedWindow, budget: usize) -> Vec<usize> {
        build_chunks(
            w,
            &CounterWrite::everywhere(&[1, 60]),
            &ChunkSettings::for_tests("", budget),
        )
        .iter()
        .map(|c| c.series)
        .collect()
    }

    #[test]
    fn packed_arguments_are_those_a_command_would_send() {
        let member: &[u8] = b"\x00\xffm";
        let mut argv = Argv::default();
        argv.arg(3600u64)
            .arg("")
            .arg(-7i64)
            .arg(0.1f64)
            .arg(f64::MAX)
            .arg(member);
        let mut cmd = redis::Cmd::new();
        cmd.arg(3600u64)
            .arg("")
            .arg(-7i64)
            .arg(0.1f64)
            .arg(f64::MAX)
            .arg(member);
        let expected: Vec<&[u8]> = cmd
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(bytes) => Some(bytes),
                _ => None,
            })
            .collect();
        assert_eq!(expected.len(), 6);
        assert_eq!(argv.iter().collect::<Vec<_>>(), expected);
    }

    #[test]
    fn chunks_respect_the_budget_across_sections() {
        assert_eq!(chunk_sizes(&window(5, &[], 0), 2), [2, 2, 1]);
        assert_eq!(chunk_sizes(&window(3, &[1], 2), 2), [2, 2, 2]);
        assert_eq!(chunk_sizes(&window(0, &[], 0), 2), Vec::<usize>::new());
    }

    #[test]
    fn counters_no_precision_takes_are_left_out() {
        let w = window(5, &[1], 0);
        let skip = [(1, CounterWrite::Skip), (60, CounterWrite::Skip)];
        let chunks = build_chunks(&w, &skip, &ChunkSettings::for_tests("", 100));
        assert_eq!(chunks.iter().map(|c| c.series).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn big_sets_cost_more() {
        // 250 members cost 3; a chunk still takes at least one item.
        assert_eq!(chunk_sizes(&window(1, &[250, 1], 0), 3), [1, 1, 1]);
    }

    #[test]
    fn wide_histograms_cost_more() {
        use crate::aggregate::{Bucket, StatKind, Stats};
        let wide = |buckets: i32| {
            let mut s = Stats::new();
            for i in 0..buckets {
                s.buckets.add(Bucket::Positive(i), 1.0);
            }
            s
        };
        let mut w = window(0, &[], 0);
        // Two quantile precisions by default: 2048 buckets are 4096 writes, costing 171.
        w.stats = [2048, 10, 2048, 10]
            .iter()
            .enumerate()
            .map(|(i, &b)| (format!("h{i}").into(), StatKind::Histogram, wide(b)))
            .collect();
        assert_eq!(chunk_sizes(&w, 172), [2, 2]);
        assert_eq!(chunk_sizes(&w, 400), [4]);
        assert_eq!(chunk_sizes(&w, 171), [1, 1, 1, 1]);
    }

    #[test]
    fn every_item_lands_in_exactly_one_chunk() {
        let w = window(7, &[1, 500, 2], 4);
        let chunks = build_chunks(
            &w,
            &CounterWrite::everywhere(&[1]),
            &ChunkSettings::for_tests("", 4),
        );
        assert_eq!(chunks.iter().map(|c| c.series).sum::<usize>(), 7 + 3 + 4);
    }
}
