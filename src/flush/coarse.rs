//! `coarse_write_secs` (K): the counters at every precision `p > 1` summed in the agent and
//! written once per `min(p, K)` seconds, one [`Level`] per distinct period, instead of every
//! window; the first level also carries the hourly statistics and the index members of the
//! counters written every window. A group's chunks are spread over the next period's windows.
//! With a spool, every close also writes the sums to the state file ([`put_state`], in the file
//! `flush::state` lays out) so that a restart goes on where the crashed run stopped.
//!
//! The closer calls [`Coarse::close`] for each window; with the feature off there is no
//! `Coarse`.

use hashbrown::HashMap;

use super::codec::{
    put_buckets, put_held, put_series, read_buckets, read_held, read_series, read_stat_series,
    u32_le,
};
use super::groups::Held;
use crate::aggregate::{ClosedWindow, SeriesName, StatKind, Stats};
use crate::config::Config;
use crate::spool::ByteReader;
use crate::store::{Chunker, CounterWrite, FlushChunk};

/// What `coarse_write_secs` (K) takes out of the windows' own writes: the counters at every
/// precision `p > 1` are summed and written once per `min(p, K)` seconds, one [`Level`] per
/// distinct period. The first level also carries the hourly statistics and the index members of
/// the counters written every window. Gauges, sets and logs are small beside the counters and
/// written every window.
pub(super) struct Coarse {
    /// What a window's own chunks do with its counters at each precision (gauges and sets are
    /// written at all of them).
    pub(super) window_precisions: Vec<(u64, CounterWrite)>,
    /// Shortest period first.
    pub(super) levels: Vec<Level>,
    /// `flush_interval_secs`: a window's length.
    interval: u64,
    /// What each level's open group summed.
    pub(super) sums: CoarseSums,
}

/// The precisions written once per `period_secs`; their sums are `Coarse::sums` at this level's index.
pub(super) struct Level {
    pub(super) period_secs: u64,
    /// What this level's chunks do with counters at each precision.
    pub(super) precisions: Vec<(u64, CounterWrite)>,
    /// The same without index members, for series this level wrote in the group before too;
    /// `None` where that is not safe (see [`Coarse::new`]).
    pub(super) continuing: Option<Vec<(u64, CounterWrite)>>,
    /// The open group, and the chunks of ended ones spread over the next period's windows.
    pub(super) held: Held,
}

impl Level {
    /// Whether windows starting at `a` and `b` belong to different groups: another slice of one
    /// of the level's precisions, another period, or (for the stats) another hour.
    fn separates(&self, a: u64, b: u64, stats: bool) -> bool {
        let crosses = |p: u64| a / p != b / p;
        crosses(self.period_secs)
            || (stats && crosses(3600))
            || self
                .precisions
                .iter()
                .any(|&(p, c)| c == CounterWrite::Write && crosses(p))
    }
}

impl Coarse {
    /// The levels `config` asks for; `None` when nothing is deferred.
    pub(super) fn new(config: &Config) -> Option<Coarse> {
        let interval = config.flush_interval_secs;
        let k = config.coarse_write_secs();
        let period = |p: u64| p.min(k);
        let fine = |p: u64| period(p) <= interval;
        let retention = config.retention();
        let precisions = retention.precisions();
        let mut periods: Vec<u64> = precisions.iter().map(|&p| period(p)).collect();
        periods.retain(|&q| q > interval);
        periods.sort_unstable();
        periods.dedup();
        if periods.is_empty() {
            // Off (K at most one window), or every precision is written every window anyway:
            // without a level nothing could add deferred index members, so nothing is deferred.
            return None;
        }
        let levels: Vec<Level> = periods
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let precisions: Vec<(u64, CounterWrite)> = precisions
                    .iter()
                    .map(|&p| {
                        let write = if fine(p) {
                            // A new 1 s slice every second would mean an index ZADD per series
                            // every second; the first level adds it once per its period instead.
                            if i == 0 {
                                CounterWrite::IndexOnly
                            } else {
                                CounterWrite::Skip
                            }
                        } else if period(p) == q {
                            CounterWrite::Write
                        } else {
                            CounterWrite::Skip
                        };
                        (p, write)
                    })
                    .collect();
                // A series written in two groups in a row has, at each of the level's
                // precisions, a hash holding a slice from the group before, which the cleaner
                // keeps for its precision's count of slices: the hash was never emptied, so the index member
                // added with it is still there and is not sent again. Only where that slice
                // outlives the group by a wide margin, and not at the longest level, whose
                // groups add every member once per its period: after a loss of Redis's data,
                // members come back within that period.
                let kept = |&(p, c): &(u64, CounterWrite)| {
                    c == CounterWrite::Skip || retention.seconds(p) >= 3 * q
                };
                let longest = i + 1 == periods.len();
                let continuing = (!longest && precisions.iter().all(kept)).then(|| {
                    precisions
                        .iter()
                        .map(|&(p, c)| match c {
                            CounterWrite::IndexOnly => (p, CounterWrite::Skip),
                            CounterWrite::Write => (p, CounterWrite::WriteUnindexed),
                            other => (p, other),
                        })
                        .collect()
                });
                Level {
                    period_secs: q,
                    precisions,
                    continuing,
                    held: Held::default(),
                }
            })
            .collect();
        let window_precisions = precisions
            .iter()
            .map(|&p| {
                let write = if fine(p) {
                    CounterWrite::WriteUnindexed
                } else {
                    CounterWrite::Skip
                };
                (p, write)
            })
            .collect();
        Some(Coarse {
            window_precisions,
            interval,
            sums: CoarseSums::new(levels.len()),
            levels,
        })
    }

    /// The coarse half of closing window `closed.start`: groups a late close separated from
    /// it end first; its statistics and counters join the open groups' sums; groups that end
    /// with it become chunks, queued to be spread over the next period's windows. Returns the
    /// window's own chunks (the precisions written every window) with its share of those
    /// queued; the `last` window takes all of them.
    pub(super) fn close(
        &mut self,
        mut closed: ClosedWindow,
        last: bool,
        chunker: &Chunker,
    ) -> Vec<FlushChunk> {
        let start = closed.start;
        for i in 0..self.levels.len() {
            let level = &self.levels[i];
            if level
                .held
                .group
                .is_some_and(|group| level.separates(group, start, i == 0))
            {
                self.end_group(i, chunker);
            }
        }
        self.sums.add_stats(std::mem::take(&mut closed.stats));
        let mut chunks = chunker.chunks(&closed, &self.window_precisions);
        for level in &mut self.levels {
            level.held.group.get_or_insert(start);
        }
        self.sums.add_counters(&closed.counters);
        // Its series are in the chunks and the sums now; at many series its keys are a large
        // share of the memory a group's end needs.
        drop(closed);

        let next = start + self.interval;
        for i in 0..self.levels.len() {
            let level = &self.levels[i];
            if last || level.separates(start, next, i == 0) {
                self.end_group(i, chunker);
            }
            chunks.extend(self.levels[i].held.share(last));
        }
        chunks
    }

    /// Ends every level's open group and takes all the chunks queued, as the last window
    /// does: what the sums held come to at the precisions `chunker` writes.
    pub(super) fn drain(&mut self, chunker: &Chunker) -> Vec<FlushChunk> {
        let mut chunks = Vec::new();
        for i in 0..self.levels.len() {
            self.end_group(i, chunker);
            chunks.extend(self.levels[i].held.share(true));
        }
        chunks
    }

    /// Ends level `i`'s open group: its sums become chunks, queued to be spread over the next
    /// period's windows.
    fn end_group(&mut self, i: usize, chunker: &Chunker) {
        let level = &mut self.levels[i];
        let Some(group) = level.held.group.take() else {
            return;
        };
        // At least one: a level's period is longer than a window.
        let windows = (level.period_secs / self.interval) as usize;
        let mut fresh = Vec::new();
        let level = &self.levels[i];
        // Every index member once per longest period, the first group in it: what a loss of
        // Redis's data took comes back.
        let longest = self.levels[self.levels.len() - 1].period_secs;
        let all_new = level.continuing.is_none() || group % longest < level.period_secs;
        // One chunk a part: the sums become chunks without a copy of all of them in between.
        self.sums.take_parts(
            i,
            group,
            chunker.settings.max_series,
            all_new,
            |part, continuing| {
                let precisions = match &level.continuing {
                    Some(unindexed) if continuing => unindexed,
                    _ => &level.precisions,
                };
                fresh.extend(chunker.chunks(&part, precisions));
            },
        );
        self.levels[i].held.queue(fresh, windows);
    }
}

/// The coarse part of closed windows (`coarse_write_secs`), summed for several levels at once,
/// each taken at its own group's end: counters added per level, statistics (taken with level 0
/// only) merged.
///
/// A counter series is one map entry whatever the number of levels, its sums in a flat table:
/// at many series a map (and a key) per level would be a large share of the agent's memory.
#[derive(Debug)]
pub(super) struct CoarseSums {
    levels: usize,
    /// Each series' row in `sums`, `seen` and `taken`.
    rows: HashMap<SeriesName, u32>,
    /// Row-major, `levels` per row: the sum since the level's group began.
    sums: Vec<i64>,
    /// Whether the series was in a window since the level's group began (a sum of 0 is still
    /// written).
    seen: Vec<bool>,
    /// Whether the level's last take had the series: seen in the group before the current one.
    /// A row is held while any level has it seen or taken.
    taken: Vec<bool>,
    /// Rows of series no level holds any more, to be reused.
    free: Vec<u32>,
    /// Indexed by `StatKind as usize`.
    stats: [HashMap<SeriesName, Stats>; 3],
}

impl CoarseSums {
    pub(super) fn new(levels: usize) -> CoarseSums {
        CoarseSums {
            levels,
            rows: HashMap::new(),
            sums: Vec::new(),
            seen: Vec::new(),
            taken: Vec::new(),
            free: Vec::new(),
            stats: Default::default(),
        }
    }

    /// Adds a later window's counters to every level (a key is copied only for a series new to
    /// the sums).
    pub(super) fn add_counters(&mut self, counters: &[(SeriesName, i64)]) {
        let levels = self.levels;
        if levels == 0 {
            return;
        }
        for (series, n) in counters {
            let row = *self.rows.entry_ref(&**series).or_insert_with(|| {
                match self.free.pop() {
                    Some(row) => row,
                    None => {
                        self.sums.resize(self.sums.len() + levels, 0);
                        self.seen.resize(self.seen.len() + levels, false);
                        self.taken.resize(self.taken.len() + levels, false);
                        // One row per series held at once: far below u32::MAX.
                        (self.sums.len() / levels - 1) as u32
                    }
                }
            }) as usize;
            for i in row * levels..(row + 1) * levels {
                self.sums[i] = self.sums[i].saturating_add(*n);
                self.seen[i] = true;
            }
        }
    }

    /// Every series held, with its sum, `seen` and `taken` at each level: what a restart needs
    /// to go on where this run stopped ([`CoarseSums::restore`]).
    pub(super) fn held(&self) -> impl Iterator<Item = (&SeriesName, &[i64], &[bool], &[bool])> {
        let levels = self.levels;
        self.rows.iter().map(move |(series, &row)| {
            let at = row as usize * levels..(row as usize + 1) * levels;
            (
                series,
                &self.sums[at.clone()],
                &self.seen[at.clone()],
                &self.taken[at],
            )
        })
    }

    /// The statistics summed since level 0's last take.
    pub(super) fn stats(&self) -> impl Iterator<Item = (&SeriesName, StatKind, &Stats)> {
        StatKind::ALL
            .into_iter()
            .zip(&self.stats)
            .flat_map(|(kind, map)| map.iter().map(move |(series, s)| (series, kind, s)))
    }

    /// Holds a series again as [`CoarseSums::held`] gave it (each slice `levels` long).
    pub(super) fn restore(
        &mut self,
        series: SeriesName,
        sums: &[i64],
        seen: &[bool],
        taken: &[bool],
    ) {
        let row = (self.sums.len() / self.levels.max(1)) as u32;
        self.sums.extend_from_slice(sums);
        self.seen.extend_from_slice(seen);
        self.taken.extend_from_slice(taken);
        self.rows.insert(series, row);
    }

    pub(super) fn add_stats(&mut self, stats: Vec<(SeriesName, StatKind, Stats)>) {
        for (series, kind, s) in stats {
            self.stats[kind as usize]
                .entry(series)
                .or_insert_with(Stats::new)
                .merge(&s);
        }
    }

    /// What `level` summed since its last take (level 0 also takes the statistics), as windows
    /// starting at `start` of at most `part` series each, handed to `each` one at a time: the
    /// sums of many series are never copied whole beside the chunks made of them.
    ///
    /// Series the level's previous take had too (seen in two groups in a row) come in parts of
    /// their own, handed with `continuing` true unless `all_new`; the others, and the
    /// statistics, with it false.
    pub(super) fn take_parts(
        &mut self,
        level: usize,
        start: u64,
        part: usize,
        all_new: bool,
        mut each: impl FnMut(ClosedWindow, bool),
    ) {
        let part = part.max(1);
        let empty = || ClosedWindow {
            start,
            ..ClosedWindow::default()
        };
        // Indexed by `continuing as usize`.
        let mut current = [empty(), empty()];
        let mut hand_on_when_full = |current: &mut ClosedWindow, continuing: bool| {
            if current.counters.len() + current.stats.len() == part {
                each(std::mem::replace(current, empty()), continuing);
            }
        };
        let levels = self.levels;
        self.rows.retain(|series, row| {
            let row = *row as usize;
            let at = row * levels + level;
            let seen = self.seen[at];
            if seen {
                let continuing = self.taken[at] && !all_new;
                let current = &mut current[continuing as usize];
                current.counters.push((series.clone(), self.sums[at]));
                self.sums[at] = 0;
                self.seen[at] = false;
                hand_on_when_full(current, continuing);
            }
            self.taken[at] = seen;
            let row_levels = row * levels..(row + 1) * levels;
            let held = self.seen[row_levels.clone()].contains(&true)
                || self.taken[row_levels].contains(&true);
            if !held {
                self.free.push(row as u32);
            }
            held
        });
        if self.rows.is_empty() {
            // Nothing held: give the table back (a burst of series must not pin it).
            self.sums = Vec::new();
            self.seen = Vec::new();
            self.taken = Vec::new();
            self.free = Vec::new();
        }
        if level == 0 {
            for (kind, map) in StatKind::ALL.into_iter().zip(&mut self.stats) {
                for (series, s) in map.drain() {
                    current[0].stats.push((series, kind, s));
                    hand_on_when_full(&mut current[0], false);
                }
            }
        }
        for (continuing, window) in current.into_iter().enumerate() {
            if !window.is_empty() {
                each(window, continuing == 1);
            }
        }
    }
}

/// `coarse_write_secs`' part of the spool's state file (`flush::state`): each level's period,
/// open group, per-window share and queued chunks, then the sums (counter rows, statistics).
/// With the feature off: no level and no sums.
pub(super) fn put_state(coarse: Option<&Coarse>, out: &mut Vec<u8>) {
    let levels = coarse.map_or(&[][..], |c| &c.levels[..]);
    out.extend_from_slice(&u32_le(levels.len()));
    for level in levels {
        out.extend_from_slice(&level.period_secs.to_le_bytes());
        put_held(out, &level.held);
    }
    let empty = CoarseSums::new(0);
    let sums = coarse.map_or(&empty, |c| &c.sums);
    out.extend_from_slice(&u32_le(sums.held().count()));
    for (series, levels, seen, taken) in sums.held() {
        put_series(out, series, None);
        for i in 0..levels.len() {
            out.extend_from_slice(&levels[i].to_le_bytes());
            out.push(u8::from(seen[i]) | u8::from(taken[i]) << 1);
        }
    }
    out.extend_from_slice(&u32_le(sums.stats().count()));
    for (series, kind, s) in sums.stats() {
        put_series(out, series, Some(kind));
        for v in [s.count, s.sum, s.sumsq, s.min, s.max] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        put_buckets(out, &s.buckets);
    }
}

/// What [`put_state`] wrote, read whole before anything is taken up.
pub(super) struct HeldState {
    levels: Vec<(u64, Held)>,
    sums: CoarseSums,
    stats: Vec<(SeriesName, StatKind, Stats)>,
}

pub(super) fn read_state(r: &mut ByteReader) -> Option<HeldState> {
    let levels = r.u32()? as usize;
    let mut restored = Vec::with_capacity(levels);
    for _ in 0..levels {
        let period = r.u64()?;
        restored.push((period, read_held(r)?));
    }
    let mut sums = CoarseSums::new(levels);
    for _ in 0..r.u32()? {
        let series = read_series(r)?;
        let (mut row, mut seen, mut taken) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..levels {
            row.push(r.u64()? as i64);
            let flags = r.u8()?;
            seen.push(flags & 1 != 0);
            taken.push(flags & 2 != 0);
        }
        sums.restore(series, &row, &seen, &taken);
    }
    let mut stats = Vec::new();
    for _ in 0..r.u32()? {
        let (series, kind) = read_stat_series(r)?;
        let mut v = [0.0; 5];
        for x in &mut v {
            *x = f64::from_bits(r.u64()?);
        }
        let [count, sum, sumsq, min, max] = v;
        let buckets = read_buckets(r)?;
        let s = Stats {
            count,
            sum,
            sumsq,
            min,
            max,
            buckets,
            values: Vec::new(),
        };
        stats.push((series, kind, s));
    }
    Some(HeldState {
        levels: restored,
        sums,
        stats,
    })
}

impl HeldState {
    /// Gives `coarse` what an earlier run held, if it has the same levels; otherwise drops it
    /// with a warning.
    pub(super) fn take_up(self, coarse: Option<&mut Coarse>) {
        let periods: Vec<u64> = coarse.as_ref().map_or(Vec::new(), |c| {
            c.levels.iter().map(|l| l.period_secs).collect()
        });
        match coarse.filter(|_| self.levels.iter().map(|l| l.0).eq(periods.iter().copied())) {
            Some(coarse) => {
                let mut sums = self.sums;
                sums.add_stats(self.stats);
                coarse.sums = sums;
                for (level, (_, held)) in coarse.levels.iter_mut().zip(self.levels) {
                    level.held = held;
                }
            }
            None if !self.levels.is_empty() => tracing::warn!(
                "coarse_write_secs or the precisions changed since the spool's sums were written; they are dropped"
            ),
            None => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{Buckets, Mapping};

    #[test]
    fn coarse_sums_add_counters_and_merge_stats_across_windows() {
        let mut sums = CoarseSums::new(1);
        let m = Mapping::default();
        let bucket_of = |values: &[f64]| {
            let mut b = Buckets::default();
            for &v in values {
                b.add(m.bucket(v), 1.0);
            }
            b
        };
        let stat = |v: f64| Stats {
            count: 1.0,
            sum: v,
            sumsq: v * v,
            min: v,
            max: v,
            buckets: bucket_of(&[v]),
            values: Vec::new(),
        };
        sums.add_counters(&[("a".into(), 2), ("b".into(), -1)]);
        sums.add_stats(vec![("t".into(), StatKind::Timer, stat(10.0))]);
        sums.add_counters(&[("a".into(), 3)]);
        sums.add_stats(vec![
            ("t".into(), StatKind::Timer, stat(4.0)),
            ("t".into(), StatKind::Histogram, stat(7.0)),
        ]);
        let mut parts = Vec::new();
        sums.take_parts(0, 100, 3, false, |part, continuing| {
            assert!(
                !continuing,
                "a first take has no series from the group before"
            );
            parts.push(part)
        });
        let sizes: Vec<_> = parts
            .iter()
            .map(|p| p.counters.len() + p.stats.len())
            .collect();
        assert_eq!(sizes, [3, 1], "parts fill across counters and stats");
        assert!(parts.iter().all(|p| p.start == 100));
        let mut taken = parts
            .into_iter()
            .fold(ClosedWindow::default(), |mut all, p| {
                all.counters.extend(p.counters);
                all.stats.extend(p.stats);
                all
            });
        taken.counters.sort();
        taken.stats.sort_by_key(|s| s.1);
        assert_eq!(taken.counters, [("a".into(), 5), ("b".into(), -1)]);
        let timer = Stats {
            count: 2.0,
            sum: 14.0,
            sumsq: 116.0,
            min: 4.0,
            max: 10.0,
            buckets: bucket_of(&[4.0, 10.0]),
            values: Vec::new(),
        };
        assert_eq!(
            taken.stats,
            [
                ("t".into(), StatKind::Timer, timer),
                ("t".into(), StatKind::Histogram, stat(7.0))
            ]
        );
        let mut parts = 0;
        sums.take_parts(0, 105, 100, false, |_, _| parts += 1);
        assert_eq!(parts, 0, "a take empties the sums");
    }

    #[test]
    fn coarse_sums_keep_levels_apart_and_reuse_rows_no_level_holds() {
        fn take(sums: &mut CoarseSums, level: usize) -> Vec<(SeriesName, i64)> {
            let mut all = Vec::new();
            sums.take_parts(level, 0, 2, false, |part, _| all.extend(part.counters));
            all.sort();
            all
        }
        let mut sums = CoarseSums::new(2);
        sums.add_counters(&[("a".into(), 1), ("b".into(), 0)]);
        assert_eq!(
            take(&mut sums, 0),
            [("a".into(), 1), ("b".into(), 0)],
            "a sum of 0 is still written"
        );
        sums.add_counters(&[("a".into(), 2), ("c".into(), 5)]);
        assert_eq!(take(&mut sums, 0), [("a".into(), 2), ("c".into(), 5)]);
        sums.add_counters(&[("d".into(), 1)]);
        assert_eq!(
            take(&mut sums, 1),
            [
                ("a".into(), 3),
                ("b".into(), 0),
                ("c".into(), 5),
                ("d".into(), 1)
            ]
        );
        assert_eq!(take(&mut sums, 0), [("d".into(), 1)]);
        assert_eq!(take(&mut sums, 1), []);
        assert_eq!(
            sums.rows.len(),
            1,
            "only d is still held: level 0's last take had it"
        );
        assert_eq!(sums.free.len(), 3);
        sums.add_counters(&[("e".into(), 1)]);
        assert_eq!(sums.sums.len(), 4 * 2, "e took a free row");
        assert_eq!(take(&mut sums, 0), [("e".into(), 1)]);
        assert_eq!(take(&mut sums, 1), [("e".into(), 1)]);
        assert_eq!(take(&mut sums, 0), []);
        assert_eq!(take(&mut sums, 1), []);
        assert!(
            sums.rows.is_empty() && sums.sums.is_empty(),
            "nothing held, tables released"
        );
    }

    #[test]
    fn coarse_sums_tell_series_of_two_groups_in_a_row_apart() {
        fn take(sums: &mut CoarseSums, all_new: bool) -> [Vec<SeriesName>; 2] {
            let mut by_kind: [Vec<SeriesName>; 2] = Default::default();
            sums.take_parts(0, 0, 2, all_new, |part, continuing| {
                assert!(
                    part.stats.is_empty() || !continuing,
                    "statistics go with the new"
                );
                by_kind[continuing as usize].extend(part.counters.into_iter().map(|c| c.0));
            });
            by_kind.iter_mut().for_each(|names| names.sort());
            by_kind
        }
        let names = |n: &[&str]| n.iter().map(|&s| SeriesName::from(s)).collect::<Vec<_>>();
        let mut sums = CoarseSums::new(1);
        sums.add_counters(&[("a".into(), 1), ("b".into(), 1)]);
        assert_eq!(take(&mut sums, false), [names(&["a", "b"]), names(&[])]);
        sums.add_counters(&[("a".into(), 1), ("c".into(), 1), ("d".into(), 1)]);
        sums.add_stats(vec![("t".into(), StatKind::Timer, Stats::new())]);
        assert_eq!(
            take(&mut sums, false),
            [names(&["c", "d"]), names(&["a"])],
            "a was in the group before; c and d are new"
        );
        // b skipped a group: new again.
        sums.add_counters(&[("a".into(), 1), ("b".into(), 1), ("c".into(), 1)]);
        assert_eq!(take(&mut sums, false), [names(&["b"]), names(&["a", "c"])]);
        sums.add_counters(&[("a".into(), 1), ("c".into(), 1)]);
        assert_eq!(
            take(&mut sums, true),
            [names(&["a", "c"]), names(&[])],
            "all new when asked"
        );
    }
}
