//! One window's state per series (docs/layout.md): counters, timer/histogram/distribution stats,
//! gauge updates, set members and log entries.
//!
//! Readers [`Window::record`] into their own window; the flusher takes every reader's window at
//! the boundary, [`Window::merge`]s them, and hands the result to the [`Ledger`], which keeps
//! what lives across windows (counter carries, gauge values) and produces a [`ClosedWindow`] of
//! exactly the values to write.

mod log;
pub mod points;
pub mod sketch;

pub use log::{LogEntry, Severity};
pub use sketch::{Bucket, Buckets, Mapping};

use std::collections::BTreeMap;
use std::hash::{Hash, Hasher};

use compact_str::CompactString;
use hashbrown::hash_map::EntryRef;
use hashbrown::{Equivalent, HashMap, HashSet};

use crate::protocol::{MAX_INCREMENT, MetricType, Sample, Value};

/// How a series shows on the Prometheus page (`prometheus_app_metrics`): from the mapping rule
/// that named it at ingest ([`Window::page_options`]), else the mapping file's `defaults`.
#[derive(Clone, Debug, PartialEq)]
pub struct PageOptions {
    /// An observer's histogram of these upper bounds, or a summary (`None`).
    pub histogram: Option<Vec<f64>>,
    /// A summary's quantiles, ascending, over the last `max_age_secs` in `age_buckets` steps.
    pub quantiles: Vec<f64>,
    pub max_age_secs: u64,
    pub age_buckets: u64,
    /// Seconds a series may go unseen before it leaves the page; 0: never.
    pub ttl_secs: u64,
    /// What every value is multiplied by on the page (after a timer's ms → s).
    pub scale: Option<f64>,
    /// The family's HELP text, when not the default one.
    pub help: Option<String>,
}

impl Default for PageOptions {
    /// statsd_exporter's (client_golang's): a summary of 0.5, 0.9 and 0.99 over ten minutes
    /// in five age buckets; never expired.
    fn default() -> PageOptions {
        PageOptions {
            histogram: None,
            quantiles: vec![0.5, 0.9, 0.99],
            max_age_secs: 600,
            age_buckets: 5,
            ttl_secs: 0,
            scale: None,
            help: None,
        }
    }
}

/// Timers, histograms and distributions keep the same statistics under different ZSET names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum StatKind {
    Timer,
    Histogram,
    Distribution,
}

impl StatKind {
    pub const ALL: [StatKind; 3] = [StatKind::Timer, StatKind::Histogram, StatKind::Distribution];

    /// The book's `<type>` part of `stats:<series>:<type>`.
    pub fn redis_name(self) -> &'static str {
        match self {
            StatKind::Timer => "AccessTime",
            StatKind::Histogram => "Histogram",
            StatKind::Distribution => "Distribution",
        }
    }
}

/// count, sum and sum of squares weighted by `1 / rate`; min and max unweighted; the values'
/// histogram for quantiles ([`sketch`]), weighted like the count.
#[derive(Clone, Debug, PartialEq)]
pub struct Stats {
    pub count: f64,
    pub sum: f64,
    pub sumsq: f64,
    pub min: f64,
    pub max: f64,
    pub buckets: Buckets,
    /// Each value and its weight, kept only for the Prometheus page (`prometheus_app_metrics`,
    /// [`Window::observe`]): its histograms need the values themselves, not their buckets.
    pub values: Vec<(f64, f64)>,
}

impl Default for Stats {
    fn default() -> Self {
        Stats::new()
    }
}

impl Stats {
    pub fn new() -> Stats {
        Stats {
            count: 0.0,
            sum: 0.0,
            sumsq: 0.0,
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            buckets: Buckets::default(),
            values: Vec::new(),
        }
    }

    fn add(&mut self, value: f64, weight: f64, mapping: &Mapping, observe: bool) {
        if observe {
            self.values.push((value, weight));
        }
        self.count += weight;
        self.sum += value * weight;
        self.sumsq += value * value * weight;
        self.min = self.min.min(value);
        self.max = self.max.max(value);
        self.buckets.add(mapping.bucket(value), weight);
    }

    pub(crate) fn merge(&mut self, other: &Stats) {
        self.count += other.count;
        self.sum += other.sum;
        self.sumsq += other.sumsq;
        self.min = self.min.min(other.min);
        self.max = self.max.max(other.max);
        self.buckets.merge(&other.buckets);
        self.values.extend_from_slice(&other.values);
    }
}

/// What a window did to a gauge: the last absolute value it set, if any, plus the deltas after it.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GaugeUpdate {
    pub set: Option<f64>,
    pub delta: f64,
}

impl GaugeUpdate {
    /// `self` followed by `later`.
    fn then(self, later: GaugeUpdate) -> GaugeUpdate {
        match later.set {
            Some(_) => later,
            None => GaugeUpdate {
                set: self.set,
                delta: self.delta + later.delta,
            },
        }
    }

    fn apply(self, current: Option<f64>) -> f64 {
        self.set.or(current).unwrap_or(0.0) + self.delta
    }
}

/// A series name as the aggregation keeps it: up to 24 bytes inside the map's own slot, so a
/// lookup reads the name where it finds the slot, and a typical name costs no allocation of its
/// own; longer ones go to the heap.
pub type SeriesName = CompactString;

/// A series name as a window looks it up: hashed like the `str` it wraps, so it finds the
/// [`SeriesName`] keys, and compared without a call into `memcmp`, which costs more than the
/// compare for names this short.
struct Name<'a>(&'a str);

impl Hash for Name<'_> {
    fn hash<H: Hasher>(&self, state: &mut H) {
        self.0.hash(state);
    }
}

impl Equivalent<SeriesName> for Name<'_> {
    fn equivalent(&self, key: &SeriesName) -> bool {
        same_bytes(self.0.as_bytes(), key.as_bytes())
    }
}

impl From<&Name<'_>> for SeriesName {
    fn from(name: &Name<'_>) -> SeriesName {
        SeriesName::new(name.0)
    }
}

/// `a == b`, eight bytes at a time (the last word overlapping the one before it).
#[inline]
fn same_bytes(a: &[u8], b: &[u8]) -> bool {
    let n = a.len();
    if n != b.len() {
        return false;
    }
    if n < 8 {
        return a.iter().zip(b).all(|(x, y)| x == y);
    }
    let word = |s: &[u8], i: usize| u64::from_le_bytes(s[i..i + 8].try_into().unwrap_or_default());
    let mut i = 0;
    while i + 8 < n {
        if word(a, i) != word(b, i) {
            return false;
        }
        i += 8;
    }
    word(a, n - 8) == word(b, n - 8)
}

/// The value of `series` in `map`, inserted with `new` unless the map already holds `max`
/// series: then `None`, and the sample is dropped.
#[inline(always)]
fn slot<'m, V>(
    map: &'m mut HashMap<SeriesName, V>,
    series: &str,
    max: usize,
    new: impl FnOnce() -> V,
) -> Option<&'m mut V> {
    let full = map.len() >= max;
    match map.entry_ref(&Name(series)) {
        EntryRef::Occupied(e) => Some(e.into_mut()),
        EntryRef::Vacant(e) if !full => Some(e.insert(new())),
        EntryRef::Vacant(_) => None,
    }
}

/// Everything received in one window, keyed by series name.
#[derive(Debug, Default)]
pub struct Window {
    pub counters: HashMap<SeriesName, f64>,
    /// Indexed by `StatKind as usize`.
    pub stats: [HashMap<SeriesName, Stats>; 3],
    pub gauges: HashMap<SeriesName, GaugeUpdate>,
    pub sets: HashMap<SeriesName, HashSet<Member>>,
    pub logs: Vec<LogEntry>,
    /// Counters and gauges sent with a timestamp (`|T`), by series: (timestamp, value) in the
    /// order they came; the ledger decides where each lands.
    pub stamped: HashMap<SeriesName, Vec<Stamped>>,
    /// Timestamps on other samples (timers, sets, gauge deltas…), taken as of now.
    pub stamps_ignored: u64,
    /// Carbon points, by series: (timestamp, value) in the order they came
    /// ([`points::place`] places them when the window closes).
    pub points: HashMap<SeriesName, Vec<(f64, f64)>>,
    /// Carbon points with a NaN value (carbon drops them without a word), and points of new
    /// series dropped because the window held `max_series_per_window` carbon series.
    pub points_nan: u64,
    pub points_capped: u64,
    /// Carbon points carbon's lists refused (`carbon_blacklist`, `carbon_whitelist`).
    pub points_blacklisted: u64,
    pub points_not_whitelisted: u64,
    /// The seconds this window counts a timestamped value in, as it comes (from its start to
    /// [`STAMP_AHEAD_SECS`] past its end), once the closer has said which they are; and how
    /// many such values it took.
    pub current: Option<std::ops::Range<u64>>,
    pub stamps_current: u64,
    /// Samples of new series dropped because their map was full, by `MetricType as usize`;
    /// log entries dropped last.
    pub dropped: [u64; MetricType::ALL.len() + 1],
    /// How timer, histogram and distribution values are bucketed.
    pub mapping: Mapping,
    /// Whether statistics keep their values ([`Stats::values`]) for the Prometheus page.
    pub observe: bool,
    /// With `observe`: the page options of the series named by a mapping rule whose options
    /// are not the defaults', as the rule that matched at ingest gave them.
    pub page_options: HashMap<SeriesName, std::sync::Arc<PageOptions>>,
    /// With `observe`: the names as sent of the series whose name sanitizing changed, for the
    /// page, which escapes the name as sent.
    pub page_names: HashMap<SeriesName, Box<str>>,
}

/// A timestamped value: a counter's increment (weighted by its rate) or a gauge's value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Stamped {
    pub at: u64,
    pub gauge: bool,
    pub value: f64,
    /// How many samples it holds (those of one second that came one after another).
    pub samples: u64,
}

/// Where [`Window::dropped`] counts log entries.
pub const DROPPED_LOGS: usize = MetricType::ALL.len();

impl Window {
    pub fn new(mapping: Mapping) -> Window {
        Window {
            mapping,
            ..Window::default()
        }
    }

    /// Everything received so far, leaving an empty window of the same mapping.
    pub fn take(&mut self) -> Window {
        let empty = Window {
            observe: self.observe,
            ..Window::new(self.mapping)
        };
        std::mem::replace(self, empty)
    }

    /// [`Window::take`], the window left counting timestamped values of `next` (a window's
    /// start and end) as it takes them.
    pub fn take_for(&mut self, next: std::ops::Range<u64>) -> Window {
        let taken = self.take();
        self.current = Some(next.start..next.end + STAMP_AHEAD_SECS);
        taken
    }

    /// Adds one sample of `series`, unless the series is new and its type already has `max`
    /// series in this window: then the sample is counted in [`Window::dropped`]. Known series
    /// are updated in place without allocating.
    #[inline(always)]
    pub fn record(&mut self, series: &str, sample: &Sample<'_>, max: usize) {
        let weight = 1.0 / sample.rate;
        let recorded = match sample.timestamp {
            None => self.record_now(series, sample.kind, sample.value, weight, max),
            Some(at) => self.record_stamped(series, sample, at, weight, max),
        };
        if recorded.is_none() {
            self.dropped[sample.kind as usize] += 1;
        }
    }

    /// [`Window::record`] for a sample with a timestamp. Timestamps are DogStatsD's for
    /// counters and gauges (not their deltas): on other samples they are counted, and the
    /// value is taken as of now.
    #[cold]
    fn record_stamped(
        &mut self,
        series: &str,
        sample: &Sample<'_>,
        at: u64,
        weight: f64,
        max: usize,
    ) -> Option<()> {
        match (sample.kind, sample.value) {
            // Of this window: taken as it comes, in order with the others (a delta after it).
            (MetricType::Counter | MetricType::Gauge, value @ Value::Number(_))
                if self.current.as_ref().is_some_and(|c| c.contains(&at)) =>
            {
                let recorded = self.record_now(series, sample.kind, value, weight, max);
                self.stamps_current += u64::from(recorded.is_some());
                recorded
            }
            (MetricType::Counter | MetricType::Gauge, Value::Number(v)) => {
                let gauge = sample.kind == MetricType::Gauge;
                let value = if gauge { v } else { v * weight };
                slot(&mut self.stamped, series, max, Vec::new).map(|values| {
                    // A batch of one second (the usual case) stays one value.
                    match values.last_mut() {
                        Some(last) if last.at == at && last.gauge == gauge => {
                            last.value = if gauge { value } else { last.value + value };
                            last.samples += 1;
                        }
                        _ => values.push(Stamped {
                            at,
                            gauge,
                            value,
                            samples: 1,
                        }),
                    }
                })
            }
            (kind, value) => {
                self.stamps_ignored += 1;
                self.record_now(series, kind, value, weight, max)
            }
        }
    }

    /// [`Window::record`] for a value of this window.
    #[inline(always)]
    fn record_now(
        &mut self,
        series: &str,
        kind: MetricType,
        value: Value<'_>,
        weight: f64,
        max: usize,
    ) -> Option<()> {
        match (kind, value) {
            (MetricType::Counter, Value::Number(v)) => {
                slot(&mut self.counters, series, max, || 0.0).map(|c| *c += v * weight)
            }
            (MetricType::Gauge, Value::Number(v)) => {
                let update = GaugeUpdate {
                    set: Some(v),
                    delta: 0.0,
                };
                slot(&mut self.gauges, series, max, GaugeUpdate::default)
                    .map(|g| *g = g.then(update))
            }
            (MetricType::Gauge, Value::GaugeDelta(d)) => {
                let update = GaugeUpdate {
                    set: None,
                    delta: d,
                };
                slot(&mut self.gauges, series, max, GaugeUpdate::default)
                    .map(|g| *g = g.then(update))
            }
            (MetricType::Set, Value::Member(m)) => slot(&mut self.sets, series, max, HashSet::new)
                .map(|members| {
                    if !members.contains(m) {
                        members.insert(m.into());
                    }
                }),
            (kind, Value::Number(v)) => {
                let kind = match kind {
                    MetricType::Timer => StatKind::Timer,
                    MetricType::Histogram => StatKind::Histogram,
                    _ => StatKind::Distribution,
                };
                let (mapping, observe) = (&self.mapping, self.observe);
                slot(&mut self.stats[kind as usize], series, max, Stats::new)
                    .map(|s| s.add(v, weight, mapping, observe))
            }
            // The parser pairs members only with sets and deltas only with gauges.
            _ => Some(()),
        }
    }

    /// Keeps a carbon point of `series` (`at`: Unix seconds), unless the series is new and the
    /// window already holds `max` carbon series.
    pub fn record_point(&mut self, series: &str, at: f64, value: f64, max: usize) {
        match slot(&mut self.points, series, max, Vec::new) {
            Some(points) => points.push((at, value)),
            None => self.points_capped += 1,
        }
    }

    /// Keeps a log entry unless the window already holds `max`.
    pub fn record_log(&mut self, entry: LogEntry, max: usize) {
        if self.logs.len() < max {
            self.logs.push(entry);
        } else {
            self.dropped[DROPPED_LOGS] += 1;
        }
    }

    /// Notes the page options of `series`, a series of this window named by a mapping rule;
    /// up to `max` series, as the window's own maps.
    pub fn note_page_options(
        &mut self,
        series: &str,
        options: &std::sync::Arc<PageOptions>,
        max: usize,
    ) {
        note_once(&mut self.page_options, series, max, || options.clone());
    }

    /// Notes the name as sent of `series`, whose name sanitizing changed; up to `max` series.
    pub fn note_page_name(&mut self, series: &str, sent: &str, max: usize) {
        note_once(&mut self.page_names, series, max, || sent.into());
    }

    /// Folds a window of the same period, received after `self`, into `self`. Each reader
    /// caps its own window, so a merged window holds up to `udp_readers` times the cap.
    pub fn merge(&mut self, other: Window) {
        if self.is_empty()
            && self.dropped == [0; MetricType::ALL.len() + 1]
            && self.stamps_ignored == 0
            && self.stamps_current == 0
            && self.points_nan == 0
            && self.points_capped == 0
            && self.points_blacklisted == 0
            && self.points_not_whitelisted == 0
        {
            // The usual case (one reader): take its maps instead of rebuilding them.
            *self = other;
            return;
        }
        for (series, v) in other.counters {
            *self.counters.entry(series).or_insert(0.0) += v;
        }
        for (mine, theirs) in self.stats.iter_mut().zip(other.stats) {
            for (series, s) in theirs {
                mine.entry(series).or_insert_with(Stats::new).merge(&s);
            }
        }
        for (series, g) in other.gauges {
            let slot = self.gauges.entry(series).or_default();
            *slot = slot.then(g);
        }
        for (series, members) in other.sets {
            self.sets.entry(series).or_default().extend(members);
        }
        self.logs.extend(other.logs);
        for (series, stamped) in other.stamped {
            self.stamped.entry(series).or_default().extend(stamped);
        }
        for (series, points) in other.points {
            self.points.entry(series).or_default().extend(points);
        }
        self.points_nan += other.points_nan;
        self.points_capped += other.points_capped;
        self.points_blacklisted += other.points_blacklisted;
        self.points_not_whitelisted += other.points_not_whitelisted;
        for (series, options) in other.page_options {
            self.page_options.entry(series).or_insert(options);
        }
        for (series, sent) in other.page_names {
            self.page_names.entry(series).or_insert(sent);
        }
        self.stamps_ignored += other.stamps_ignored;
        self.stamps_current += other.stamps_current;
        for (mine, theirs) in self.dropped.iter_mut().zip(other.dropped) {
            *mine += theirs;
        }
    }

    /// The `n` name prefixes (up to the first `.` or `;`) with the most series in the window,
    /// most first: who fills the window when the cap is reached.
    pub fn busiest_prefixes(&self, n: usize) -> Vec<(String, usize)> {
        let names = self
            .counters
            .keys()
            .chain(self.stats.iter().flat_map(HashMap::keys))
            .chain(self.gauges.keys())
            .chain(self.sets.keys());
        let mut counts: HashMap<&str, usize> = HashMap::new();
        for name in names {
            let prefix = name.split(['.', ';']).next().unwrap_or_default();
            *counts.entry(prefix).or_default() += 1;
        }
        let mut busiest: Vec<(String, usize)> = counts
            .into_iter()
            .map(|(p, c)| (p.to_string(), c))
            .collect();
        busiest.sort_unstable_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        busiest.truncate(n);
        busiest
    }

    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
            && self.stats.iter().all(HashMap::is_empty)
            && self.gauges.is_empty()
            && self.sets.is_empty()
            && self.logs.is_empty()
            && self.stamped.is_empty()
            && self.points.is_empty()
    }
}

/// The first value noted for `series` in `map`, which holds up to `max` series.
fn note_once<V>(
    map: &mut HashMap<SeriesName, V>,
    series: &str,
    max: usize,
    value: impl FnOnce() -> V,
) {
    if map.len() < max || map.contains_key(series) {
        map.entry_ref(series).or_insert_with(value);
    }
}

/// A set member: the raw bytes of the value.
pub type Member = Box<[u8]>;

/// A window ready to write: every value final, counters as integers.
#[derive(Debug, Default, PartialEq)]
pub struct ClosedWindow {
    /// Start of the window, epoch seconds.
    pub start: u64,
    pub counters: Vec<(SeriesName, i64)>,
    pub stats: Vec<(SeriesName, StatKind, Stats)>,
    /// The gauges this window touched, with their value after it.
    pub gauges: Vec<(SeriesName, f64)>,
    pub sets: Vec<(SeriesName, Vec<Member>)>,
    pub logs: Vec<LogEntry>,
    /// Timestamped values of earlier seconds, to write at the slices of their own second.
    pub stamped: Vec<StampedWrite>,
    /// What became of the window's timestamped values.
    pub stamps: StampOutcomes,
    /// Carbon points, placed, by series.
    pub points: Vec<points::SeriesPoints>,
}

impl ClosedWindow {
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
            && self.stats.is_empty()
            && self.gauges.is_empty()
            && self.sets.is_empty()
            && self.logs.is_empty()
            && self.stamped.is_empty()
            && self.points.is_empty()
    }
}

/// A timestamped value of an earlier second than its window's.
#[derive(Clone, Debug, PartialEq)]
pub struct StampedWrite {
    pub at: u64,
    pub series: SeriesName,
    pub value: StampedValue,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum StampedValue {
    /// A counter's whole increment (the fraction is carried like any counter's).
    Counter(i64),
    /// A gauge's value; `later` is the timestamp of a later value the agent has written, when
    /// there is one: the slices that hold that one keep it.
    Gauge { value: f64, later: Option<u64> },
}

/// What became of a window's timestamped counters and gauges.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct StampOutcomes {
    /// Of an earlier second: written at its slices.
    pub earlier: u64,
    /// Of the window's own seconds, or at most [`STAMP_AHEAD_SECS`] ahead: counted in it.
    pub current: u64,
    /// Older than the limit (`max_timestamp_age_secs`): dropped.
    pub too_old: u64,
    /// Further ahead: dropped.
    pub too_far_ahead: u64,
}

/// How far ahead of the window's end a timestamp may be and still count in it: a client whose
/// clock runs a little fast.
pub const STAMP_AHEAD_SECS: u64 = 10;

/// Sums closer than this to a whole number are that number: `0.1 / 0.1`-style float noise must
/// not turn an exact total into a carried 0.999....
const WHOLE_EPSILON: f64 = 1e-9;

/// What lives across windows: each counter's carried fraction and each gauge's value, with the
/// window that last touched them; those idle for `forget_after` seconds are forgotten.
#[derive(Debug)]
pub struct Ledger {
    carries: HashMap<SeriesName, (f64, u64)>,
    gauges: HashMap<SeriesName, GaugeState>,
    forget_after: u64,
    last_sweep: u64,
    /// The window's length and how far back a timestamped value is taken.
    interval: u64,
    max_age: u64,
}

/// A gauge's current value, the window that last touched it (for forgetting), and the moment
/// the value belongs to: its timestamp, or the start of the window it came in.
#[derive(Clone, Copy, Debug)]
struct GaugeState {
    value: f64,
    touched: u64,
    stamp: u64,
}

/// How often the ledger looks for idle entries: each look visits every entry.
const SWEEP_SECS: u64 = 60;

impl Default for Ledger {
    fn default() -> Ledger {
        Ledger::new(86_400)
    }
}

/// Puts a window's items in one order that is the same every window (by a hash of the name
/// with fixed keys), where a window's hash map gives a new one each time: Redis then meets a
/// series' keys in the order it made them, and spends about a third less on each `HINCRBY`
/// (`scripts/write-cost.sh`, docs/benchmarks.md). 1 ms for 20 000 series, 90 ms for a million.
fn in_fixed_order<T>(items: &mut [T], name: impl Fn(&T) -> &SeriesName) {
    items.sort_by_cached_key(|item| {
        let mut hasher = std::hash::DefaultHasher::new();
        name(item).as_str().hash(&mut hasher);
        hasher.finish()
    });
}

/// A counter's `total` as the whole number a window writes and the rest it carries. Float
/// noise is rounded away (`0.1 / 0.1`), and a window writes at most MAX_INCREMENT either way,
/// carrying the rest like a fraction: many huge increments in one window are written over the
/// next ones, never lost to a saturated cast or an overflowing HINCRBY.
fn whole_and_carry(mut total: f64) -> (f64, f64) {
    if (total - total.round()).abs() < WHOLE_EPSILON {
        total = total.round();
    }
    let whole = total.trunc().clamp(-MAX_INCREMENT, MAX_INCREMENT);
    (whole, total - whole)
}

impl Ledger {
    pub fn new(forget_idle_secs: u64) -> Ledger {
        Ledger {
            carries: HashMap::new(),
            gauges: HashMap::new(),
            forget_after: forget_idle_secs,
            last_sweep: 0,
            interval: 1,
            max_age: u64::MAX,
        }
    }

    /// Windows of `interval` seconds; timestamped values older than `max_age` are dropped.
    pub fn with_stamps(mut self, interval: u64, max_age: u64) -> Ledger {
        self.interval = interval;
        self.max_age = max_age;
        self
    }

    /// Turns a window into the values to write; must be called in window order.
    pub fn close(&mut self, start: u64, mut window: Window) -> ClosedWindow {
        // Sized up front: at many series, a doubling vector's spare half is a large share of the
        // agent's memory.
        let mut closed = ClosedWindow {
            start,
            counters: Vec::with_capacity(window.counters.len()),
            stats: Vec::with_capacity(window.stats.iter().map(HashMap::len).sum()),
            gauges: Vec::with_capacity(window.gauges.len()),
            ..ClosedWindow::default()
        };
        if start >= self.last_sweep + SWEEP_SECS {
            self.last_sweep = start;
            let oldest = start.saturating_sub(self.forget_after);
            self.carries.retain(|_, (_, at)| *at >= oldest);
            self.gauges.retain(|_, g| g.touched >= oldest);
        }
        let stamped = self.sort_stamped(start, &mut window, &mut closed.stamps);
        for (series, v) in window.counters {
            let total = v + self.carries.remove(&series).map_or(0.0, |c| c.0);
            let (whole, carry) = whole_and_carry(total);
            if carry != 0.0 {
                self.carries.insert(series.clone(), (carry, start));
            }
            closed.counters.push((series, whole as i64));
        }
        in_fixed_order(&mut closed.counters, |(series, _)| series);
        for (kind, stats) in StatKind::ALL.into_iter().zip(window.stats) {
            closed
                .stats
                .extend(stats.into_iter().map(|(series, s)| (series, kind, s)));
        }
        // Earlier seconds first: the window's own values are later than all of them.
        closed.stamped = self.close_stamped(start, stamped);
        for (series, update) in window.gauges {
            let value = update.apply(self.gauges.get(&series).map(|g| g.value));
            let state = GaugeState {
                value,
                touched: start,
                stamp: start,
            };
            self.gauges.insert(series.clone(), state);
            closed.gauges.push((series, value));
        }
        // A gauge given an older value than its latest: its current value is written again
        // after it (with the window's slices), so that `gauges:` keeps the latest.
        for w in &closed.stamped {
            if let StampedValue::Gauge { later: Some(_), .. } = w.value
                && !closed.gauges.iter().any(|(s, _)| *s == w.series)
                && let Some(g) = self.gauges.get(&w.series)
            {
                closed.gauges.push((w.series.clone(), g.value));
            }
        }
        closed.sets = window
            .sets
            .into_iter()
            .map(|(series, members)| (series, members.into_iter().collect()))
            .collect();
        in_fixed_order(&mut closed.stats, |(series, ..)| series);
        in_fixed_order(&mut closed.gauges, |(series, _)| series);
        in_fixed_order(&mut closed.sets, |(series, _)| series);
        closed.logs = window.logs;
        closed
    }

    /// The current value of a gauge, as the agent knows it.
    pub fn gauge(&self, series: &str) -> Option<f64> {
        self.gauges.get(series).map(|g| g.value)
    }

    /// Keeps a series' carried fraction for its next window (none kept for 0).
    fn keep_carry(&mut self, carry: Option<(SeriesName, f64)>, start: u64) {
        if let Some((series, c)) = carry.filter(|(_, c)| *c != 0.0) {
            self.carries.insert(series, (c, start));
        }
    }

    /// Sorts the window's timestamped values: those of its own seconds (or a little ahead)
    /// join its other values, those too old or too far ahead are dropped, and those of earlier
    /// seconds are returned in the order they came.
    fn sort_stamped(
        &self,
        start: u64,
        window: &mut Window,
        outcomes: &mut StampOutcomes,
    ) -> Vec<(SeriesName, Stamped)> {
        let end = start + self.interval;
        outcomes.current += window.stamps_current;
        let mut earlier = Vec::new();
        for (series, values) in std::mem::take(&mut window.stamped) {
            for v in values {
                if v.at >= end + STAMP_AHEAD_SECS {
                    outcomes.too_far_ahead += v.samples;
                } else if v.at >= start {
                    outcomes.current += v.samples;
                    if v.gauge {
                        let set = GaugeUpdate {
                            set: Some(v.value),
                            delta: 0.0,
                        };
                        let g = window.gauges.entry(series.clone()).or_default();
                        *g = g.then(set);
                    } else {
                        *window.counters.entry(series.clone()).or_insert(0.0) += v.value;
                    }
                } else if end - v.at > self.max_age {
                    outcomes.too_old += v.samples;
                } else {
                    outcomes.earlier += v.samples;
                    earlier.push((series.clone(), v));
                }
            }
        }
        earlier
    }

    /// The writes of the values of earlier seconds: counters summed per second (whole, the
    /// fraction carried), gauges the last value of each second; a gauge's value becomes its
    /// current one when nothing later is known.
    fn close_stamped(
        &mut self,
        start: u64,
        values: Vec<(SeriesName, Stamped)>,
    ) -> Vec<StampedWrite> {
        // Ordered maps: counters by series then second (a series' fraction carried from one
        // second to the next), gauges by second (the last that came of one second winning).
        let mut counters: BTreeMap<(SeriesName, u64), f64> = BTreeMap::new();
        let mut gauges: BTreeMap<(u64, SeriesName), f64> = BTreeMap::new();
        for (series, v) in values {
            if v.gauge {
                gauges.insert((v.at, series), v.value);
            } else {
                *counters.entry((series, v.at)).or_insert(0.0) += v.value;
            }
        }
        let mut writes = Vec::with_capacity(counters.len() + gauges.len());
        let mut carrying: Option<(SeriesName, f64)> = None;
        for ((series, at), v) in counters {
            // What the series carries (from earlier windows, or its earlier second here) goes
            // into this second; what is left of it, to the next, and then to later windows.
            let carried = match carrying.take() {
                Some((s, c)) if s == series => c,
                other => {
                    self.keep_carry(other, start);
                    self.carries.remove(&series).map_or(0.0, |c| c.0)
                }
            };
            let (whole, carry) = whole_and_carry(v + carried);
            carrying = Some((series.clone(), carry));
            if whole != 0.0 {
                let value = StampedValue::Counter(whole as i64);
                writes.push(StampedWrite { at, series, value });
            }
        }
        self.keep_carry(carrying, start);
        for ((at, series), value) in gauges {
            let latest = GaugeState {
                value,
                touched: start,
                stamp: at,
            };
            let later = match self.gauges.get_mut(&series) {
                Some(g) if g.stamp > at => Some(g.stamp),
                Some(g) => {
                    *g = latest;
                    None
                }
                None => {
                    self.gauges.insert(series.clone(), latest);
                    None
                }
            };
            let value = StampedValue::Gauge { value, later };
            writes.push(StampedWrite { at, series, value });
        }
        writes
    }
}

#[cfg(test)]
mod tests;
