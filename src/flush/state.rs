//! The spool's state file: what a restart needs of the writes the closer holds back, replaced
//! at every close while `coarse_write_secs` or `quantile_write_secs` holds anything back:
//!
//! 1. the window just closed: its start, its run's sequence key and its chunks (a crash between
//!    the state file and the window's own file still finds the window);
//! 2. `coarse_write_secs`: each level's period, open group, chunks queued, and the sums (counter
//!    rows and statistics);
//! 3. `quantile_write_secs` (absent in files of earlier versions): the period and precisions,
//!    the open group, the chunks queued, and the buckets summed.
//!
//! Integers little-endian. Parts written under another configuration are dropped with a
//! warning; the window is always taken up.

use std::collections::VecDeque;
use std::sync::Arc;

use super::coarse::{Coarse, CoarseSums};
use super::quantiles::QuantileGroups;
use crate::aggregate::{Bucket, Buckets, SeriesName, StatKind, Stats};
use crate::spool::{ByteReader, put_bytes, put_chunk};
use crate::store::FlushChunk;

fn u32_le(n: usize) -> [u8; 4] {
    (n as u32).to_le_bytes()
}

/// The state after closing window `start` (its chunks numbered under `sequence`).
pub(super) fn write(
    start: u64,
    sequence: &str,
    chunks: &[Arc<FlushChunk>],
    coarse: Option<&Coarse>,
    quantiles: Option<&QuantileGroups>,
) -> Vec<u8> {
    let mut out = Vec::new();
    out.extend_from_slice(&start.to_le_bytes());
    put_bytes(&mut out, sequence.as_bytes());
    out.extend_from_slice(&u32_le(chunks.len()));
    for chunk in chunks {
        put_chunk(&mut out, chunk);
    }
    let levels = coarse.map_or(&[][..], |c| &c.levels[..]);
    out.extend_from_slice(&u32_le(levels.len()));
    for level in levels {
        out.extend_from_slice(&level.period_secs.to_le_bytes());
        put_queue(&mut out, level.group, level.per_window, &level.queued);
    }
    let empty = CoarseSums::new(0);
    let sums = coarse.map_or(&empty, |c| &c.sums);
    out.extend_from_slice(&u32_le(sums.held().count()));
    for (series, levels, seen, taken) in sums.held() {
        put_bytes(&mut out, series.as_bytes());
        for i in 0..levels.len() {
            out.extend_from_slice(&levels[i].to_le_bytes());
            out.push(u8::from(seen[i]) | u8::from(taken[i]) << 1);
        }
    }
    out.extend_from_slice(&u32_le(sums.stats().count()));
    for (series, kind, s) in sums.stats() {
        put_bytes(&mut out, series.as_bytes());
        out.push(kind as u8);
        for v in [s.count, s.sum, s.sumsq, s.min, s.max] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        put_buckets(&mut out, &s.buckets);
    }
    if let Some(q) = quantiles {
        out.extend_from_slice(&q.period_secs.to_le_bytes());
        out.extend_from_slice(&u32_le(q.precisions.len()));
        for p in &q.precisions {
            out.extend_from_slice(&p.to_le_bytes());
        }
        put_queue(&mut out, q.group, q.per_window, &q.queued);
        let held: Vec<_> = StatKind::ALL
            .into_iter()
            .zip(&q.sums)
            .flat_map(|(kind, map)| map.iter().map(move |(s, b)| (kind, s, b)))
            .collect();
        out.extend_from_slice(&u32_le(held.len()));
        for (kind, series, buckets) in held {
            put_bytes(&mut out, series.as_bytes());
            out.push(kind as u8);
            put_buckets(&mut out, buckets);
        }
    }
    out
}

/// Reads a [`write`]: returns the window written with it (start, sequence key, chunks), and
/// gives `coarse` and `quantiles` what they held if they are configured as they were. `None`
/// if it does not read.
pub(super) fn restore(
    state: &[u8],
    coarse: Option<&mut Coarse>,
    quantiles: Option<&mut QuantileGroups>,
) -> Option<(u64, String, Vec<FlushChunk>)> {
    let mut r = ByteReader(state);
    let start = r.u64()?;
    let sequence = r.string()?;
    let n = r.u32()? as usize;
    let chunks = (0..n).map(|_| r.chunk()).collect::<Option<Vec<_>>>()?;

    let levels = r.u32()? as usize;
    let mut restored = Vec::with_capacity(levels);
    for _ in 0..levels {
        let period = r.u64()?;
        restored.push((period, read_queue(&mut r)?));
    }
    let mut sums = CoarseSums::new(levels);
    for _ in 0..r.u32()? {
        let series = SeriesName::from(std::str::from_utf8(r.bytes()?).ok()?);
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
        let series = SeriesName::from(std::str::from_utf8(r.bytes()?).ok()?);
        let kind = *StatKind::ALL.get(r.u8()? as usize)?;
        let mut v = [0.0; 5];
        for x in &mut v {
            *x = f64::from_bits(r.u64()?);
        }
        let [count, sum, sumsq, min, max] = v;
        let buckets = read_buckets(&mut r)?;
        let s = Stats {
            count,
            sum,
            sumsq,
            min,
            max,
            buckets,
        };
        stats.push((series, kind, s));
    }

    let mut held_quantiles = None;
    if !r.0.is_empty() {
        let period = r.u64()?;
        let precisions = (0..r.u32()?)
            .map(|_| r.u64())
            .collect::<Option<Vec<u64>>>()?;
        let queue = read_queue(&mut r)?;
        let mut sums: [hashbrown::HashMap<SeriesName, Buckets>; 3] = Default::default();
        for _ in 0..r.u32()? {
            let series = SeriesName::from(std::str::from_utf8(r.bytes()?).ok()?);
            let kind = *StatKind::ALL.get(r.u8()? as usize)?;
            sums[kind as usize].insert(series, read_buckets(&mut r)?);
        }
        held_quantiles = Some((period, precisions, queue, sums));
    }
    if !r.0.is_empty() {
        return None;
    }

    let periods: Vec<u64> = coarse.as_ref().map_or(Vec::new(), |c| {
        c.levels.iter().map(|l| l.period_secs).collect()
    });
    match coarse.filter(|_| restored.iter().map(|l| l.0).eq(periods.iter().copied())) {
        Some(coarse) => {
            sums.add_stats(stats);
            coarse.sums = sums;
            for (level, (_, (group, per_window, queued))) in coarse.levels.iter_mut().zip(restored)
            {
                level.group = group;
                level.per_window = per_window;
                level.queued = queued;
            }
        }
        None if levels > 0 => tracing::warn!(
            "coarse_write_secs or the precisions changed since the spool's sums were written; they are dropped"
        ),
        None => {}
    }
    if let Some((period, precisions, (group, per_window, queued), sums)) = held_quantiles {
        match quantiles.filter(|q| q.period_secs == period && q.precisions == precisions) {
            Some(q) => {
                q.group = group;
                q.per_window = per_window;
                q.queued = queued;
                q.sums = sums;
            }
            None => tracing::warn!(
                "quantile_write_secs or quantile_precisions changed since the spool's buckets were written; they are dropped"
            ),
        }
    }
    Some((start, sequence, chunks))
}

type Queue = (Option<u64>, usize, VecDeque<FlushChunk>);

/// An open group (or none), how many queued chunks a window takes, and the queued chunks.
fn put_queue(
    out: &mut Vec<u8>,
    group: Option<u64>,
    per_window: usize,
    queued: &VecDeque<FlushChunk>,
) {
    out.extend_from_slice(&group.unwrap_or(u64::MAX).to_le_bytes());
    out.extend_from_slice(&u32_le(per_window));
    out.extend_from_slice(&u32_le(queued.len()));
    for chunk in queued {
        put_chunk(out, chunk);
    }
}

fn read_queue(r: &mut ByteReader) -> Option<Queue> {
    let group = Some(r.u64()?).filter(|&g| g != u64::MAX);
    let per_window = r.u32()? as usize;
    let n = r.u32()? as usize;
    let queued = (0..n).map(|_| r.chunk()).collect::<Option<VecDeque<_>>>()?;
    Some((group, per_window, queued))
}

fn put_buckets(out: &mut Vec<u8>, buckets: &Buckets) {
    out.extend_from_slice(&u32_le(buckets.len()));
    for (bucket, weight) in buckets.iter() {
        let (side, index) = match bucket {
            Bucket::Negative(i) => (0u8, i),
            Bucket::Zero => (1, 0),
            Bucket::Positive(i) => (2, i),
        };
        out.push(side);
        out.extend_from_slice(&index.to_le_bytes());
        out.extend_from_slice(&weight.to_le_bytes());
    }
}

fn read_buckets(r: &mut ByteReader) -> Option<Buckets> {
    let mut buckets = Buckets::default();
    for _ in 0..r.u32()? {
        let side = r.u8()?;
        let index = r.u32()? as i32;
        let bucket = match side {
            0 => Bucket::Negative(index),
            1 => Bucket::Zero,
            2 => Bucket::Positive(index),
            _ => return None,
        };
        buckets.add(bucket, f64::from_bits(r.u64()?));
    }
    Some(buckets)
}
