//! One window's state per series (docs/layout.md): counters, timer/histogram/distribution stats,
//! gauge updates, set members and log entries.
//!
//! Readers [`Window::record`] into their own window; the flusher takes every reader's window at
//! the boundary, [`Window::merge`]s them, and hands the result to the [`Ledger`], which keeps
//! what lives across windows (counter carries, gauge values) and produces a [`ClosedWindow`] of
//! exactly the values to write.

mod log;
pub mod sketch;

pub use log::{LogEntry, Severity};
pub use sketch::{Bucket, Buckets, Mapping};

use std::hash::{Hash, Hasher};

use compact_str::CompactString;
use hashbrown::hash_map::EntryRef;
use hashbrown::{Equivalent, HashMap, HashSet};

use crate::protocol::{MAX_INCREMENT, MetricType, Sample, Value};

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
        }
    }

    fn add(&mut self, value: f64, weight: f64, mapping: &Mapping) {
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
    /// Samples of new series dropped because their map was full, by `MetricType as usize`;
    /// log entries dropped last.
    pub dropped: [u64; MetricType::ALL.len() + 1],
    /// How timer, histogram and distribution values are bucketed.
    pub mapping: Mapping,
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
        std::mem::replace(self, Window::new(self.mapping))
    }

    /// Adds one sample of `series`, unless the series is new and its type already has `max`
    /// series in this window: then the sample is counted in [`Window::dropped`]. Known series
    /// are updated in place without allocating.
    pub fn record(&mut self, series: &str, sample: &Sample<'_>, max: usize) {
        let weight = 1.0 / sample.rate;
        let recorded = match (sample.kind, sample.value) {
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
                let mapping = &self.mapping;
                slot(&mut self.stats[kind as usize], series, max, Stats::new)
                    .map(|s| s.add(v, weight, mapping))
            }
            // The parser pairs members only with sets and deltas only with gauges.
            _ => Some(()),
        };
        if recorded.is_none() {
            self.dropped[sample.kind as usize] += 1;
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

    /// Folds a window of the same period, received after `self`, into `self`. Each reader
    /// caps its own window, so a merged window holds up to `udp_readers` times the cap.
    pub fn merge(&mut self, other: Window) {
        if self.is_empty() && self.dropped == [0; MetricType::ALL.len() + 1] {
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
}

impl ClosedWindow {
    pub fn is_empty(&self) -> bool {
        self.counters.is_empty()
            && self.stats.is_empty()
            && self.gauges.is_empty()
            && self.sets.is_empty()
            && self.logs.is_empty()
    }
}

/// Sums closer than this to a whole number are that number: `0.1 / 0.1`-style float noise must
/// not turn an exact total into a carried 0.999....
const WHOLE_EPSILON: f64 = 1e-9;

/// What lives across windows: each counter's carried fraction and each gauge's value, with the
/// window that last touched them; those idle for `forget_after` seconds are forgotten.
#[derive(Debug)]
pub struct Ledger {
    carries: HashMap<SeriesName, (f64, u64)>,
    gauges: HashMap<SeriesName, (f64, u64)>,
    forget_after: u64,
    last_sweep: u64,
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

impl Ledger {
    pub fn new(forget_idle_secs: u64) -> Ledger {
        Ledger {
            carries: HashMap::new(),
            gauges: HashMap::new(),
            forget_after: forget_idle_secs,
            last_sweep: 0,
        }
    }

    /// Turns a window into the values to write; must be called in window order.
    pub fn close(&mut self, start: u64, window: Window) -> ClosedWindow {
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
            self.gauges.retain(|_, (_, at)| *at >= oldest);
        }
        for (series, v) in window.counters {
            let mut total = v + self.carries.remove(&series).map_or(0.0, |c| c.0);
            if (total - total.round()).abs() < WHOLE_EPSILON {
                total = total.round();
            }
            // A window writes at most MAX_INCREMENT either way and carries the rest, like a
            // fraction: many huge increments in one window are written over the next ones,
            // never lost to a saturated cast or an overflowing HINCRBY.
            let whole = total.trunc().clamp(-MAX_INCREMENT, MAX_INCREMENT);
            if total != whole {
                self.carries.insert(series.clone(), (total - whole, start));
            }
            closed.counters.push((series, whole as i64));
        }
        in_fixed_order(&mut closed.counters, |(series, _)| series);
        for (kind, stats) in StatKind::ALL.into_iter().zip(window.stats) {
            closed
                .stats
                .extend(stats.into_iter().map(|(series, s)| (series, kind, s)));
        }
        for (series, update) in window.gauges {
            let value = update.apply(self.gauges.get(&series).map(|g| g.0));
            self.gauges.insert(series.clone(), (value, start));
            closed.gauges.push((series, value));
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
        self.gauges.get(series).map(|g| g.0)
    }
}

#[cfg(test)]
mod tests;
