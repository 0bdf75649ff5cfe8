//! `quantile_write_secs` (Q, default 60): the statistics' quantile buckets summed in the agent
//! and written once per Q seconds instead of every window. A bucket a window touches costs Redis
//! a field read and written per slice precision, about as much as a whole timer's statistics
//! (docs/benchmarks.md, quantile buckets); summed over a minute, a series' buckets are written
//! once a minute, each bucket once. The statistics themselves still go every window.
//!
//! A group is the windows of one period that share every quantile slice; at its end its sums
//! become chunks of statistics items with a count of 0 (the script writes their buckets only)
//! for the group's slices, spread over the next period's windows as `coarse_write_secs` spreads
//! its groups. With a spool, every close writes the sums and the queued chunks to the state file
//! ([`QuantileGroups::put_state`]), so a crash loses none of them.

use hashbrown::HashMap;

use super::codec::{
    put_buckets, put_held, put_series, read_buckets, read_held, read_stat_series, u32_le,
};
use super::groups::Held;
use crate::aggregate::{Buckets, ClosedWindow, SeriesName, StatKind, Stats};
use crate::config::Config;
use crate::spool::ByteReader;
use crate::store::{Chunker, FlushChunk};

pub(super) struct QuantileGroups {
    /// Q, a multiple of the window's length.
    pub(super) period_secs: u64,
    /// The slice precisions: a group never spans two slices of any of them.
    pub(super) precisions: Vec<u64>,
    interval: u64,
    /// The open group, and the chunks of ended ones spread over the next period's windows.
    pub(super) held: Held,
    /// The group's buckets per series, indexed by `StatKind as usize`.
    pub(super) sums: [HashMap<SeriesName, Buckets>; 3],
}

impl QuantileGroups {
    /// `None` when buckets are written with every window (Q at most a window, or no quantile
    /// precision).
    pub(super) fn new(config: &Config) -> Option<QuantileGroups> {
        let interval = config.flush_interval_secs;
        (config.quantile_write_secs > interval && !config.quantile_precisions.is_empty()).then(
            || QuantileGroups {
                period_secs: config.quantile_write_secs,
                precisions: config.quantile_precisions.clone(),
                interval,
                held: Held::default(),
                sums: Default::default(),
            },
        )
    }

    /// Whether windows starting at `a` and `b` belong to different groups.
    fn separates(&self, a: u64, b: u64) -> bool {
        let crosses = |p: u64| a / p != b / p;
        crosses(self.period_secs) || self.precisions.iter().any(|&p| crosses(p))
    }

    /// Takes the buckets out of `closed`'s statistics into the open group (ended first if a
    /// late close separated it from this window); ends the group when the next window belongs
    /// to another. Returns this window's share of the chunks queued: all of them when `last`.
    pub(super) fn close(
        &mut self,
        closed: &mut ClosedWindow,
        last: bool,
        chunker: &Chunker,
    ) -> Vec<FlushChunk> {
        let start = closed.start;
        if self.held.group.is_some_and(|g| self.separates(g, start)) {
            self.end_group(chunker);
        }
        for (series, kind, stats) in &mut closed.stats {
            if !stats.buckets.is_empty() {
                let buckets = std::mem::take(&mut stats.buckets);
                match self.sums[*kind as usize].get_mut(series) {
                    Some(sum) => sum.merge(&buckets),
                    None => {
                        self.sums[*kind as usize].insert(series.clone(), buckets);
                    }
                }
            }
        }
        self.held.group.get_or_insert(start);
        if last || self.separates(start, start + self.interval) {
            self.end_group(chunker);
        }
        self.held.share(last).collect()
    }

    /// The group's sums become chunks (buckets-only statistics items of the group's window),
    /// dealt over the next period's windows.
    fn end_group(&mut self, chunker: &Chunker) {
        let Some(group) = self.held.group.take() else {
            return;
        };
        let mut window = ClosedWindow {
            start: group,
            ..ClosedWindow::default()
        };
        for (kind, sums) in StatKind::ALL.into_iter().zip(&mut self.sums) {
            for (series, buckets) in sums.drain() {
                let stats = Stats {
                    count: 0.0,
                    sum: 0.0,
                    sumsq: 0.0,
                    min: 0.0,
                    max: 0.0,
                    buckets,
                    values: Vec::new(),
                };
                window.stats.push((series, kind, stats));
            }
        }
        if window.stats.is_empty() {
            return;
        }
        // Sorted: the same sums always make the same chunks (and tests can read them).
        window.stats.sort_by(|a, b| (a.1, &a.0).cmp(&(b.1, &b.0)));
        let windows = (self.period_secs / self.interval).max(1) as usize;
        self.held.queue(chunker.chunks(&window, &[]), windows);
    }

    /// Its part of the spool's state file (`flush::state`): the period and precisions, the open
    /// group, the queued chunks and the buckets summed.
    pub(super) fn put_state(&self, out: &mut Vec<u8>) {
        out.extend_from_slice(&self.period_secs.to_le_bytes());
        out.extend_from_slice(&u32_le(self.precisions.len()));
        for p in &self.precisions {
            out.extend_from_slice(&p.to_le_bytes());
        }
        put_held(out, &self.held);
        let held: Vec<_> = StatKind::ALL
            .into_iter()
            .zip(&self.sums)
            .flat_map(|(kind, map)| map.iter().map(move |(s, b)| (kind, s, b)))
            .collect();
        out.extend_from_slice(&u32_le(held.len()));
        for (kind, series, buckets) in held {
            put_series(out, series, Some(kind));
            put_buckets(out, buckets);
        }
    }
}

/// What [`QuantileGroups::put_state`] wrote, read whole before anything is taken up.
pub(super) struct HeldState {
    period_secs: u64,
    precisions: Vec<u64>,
    held: Held,
    sums: [HashMap<SeriesName, Buckets>; 3],
}

pub(super) fn read_state(r: &mut ByteReader) -> Option<HeldState> {
    let period_secs = r.u64()?;
    let precisions = (0..r.u32()?)
        .map(|_| r.u64())
        .collect::<Option<Vec<u64>>>()?;
    let held = read_held(r)?;
    let mut sums: [HashMap<SeriesName, Buckets>; 3] = Default::default();
    for _ in 0..r.u32()? {
        let (series, kind) = read_stat_series(r)?;
        sums[kind as usize].insert(series, read_buckets(r)?);
    }
    Some(HeldState {
        period_secs,
        precisions,
        held,
        sums,
    })
}

impl HeldState {
    /// Gives `quantiles` what an earlier run held, if it is configured as it was; otherwise
    /// drops it with a warning.
    pub(super) fn take_up(self, quantiles: Option<&mut QuantileGroups>) {
        match quantiles
            .filter(|q| q.period_secs == self.period_secs && q.precisions == self.precisions)
        {
            Some(q) => {
                q.held = self.held;
                q.sums = self.sums;
            }
            None => tracing::warn!(
                "quantile_write_secs or quantile_precisions changed since the spool's buckets were written; they are dropped"
            ),
        }
    }
}
