//! The byte encodings of the spool's state file ([`super::state`]): a held-back queue of
//! chunks, a series name, quantile buckets. Integers little-endian.

use std::collections::VecDeque;

use super::groups::Held;
use crate::aggregate::{Bucket, Buckets, SeriesName, StatKind};
use crate::spool::{ByteReader, put_bytes, put_chunk};

pub(super) fn u32_le(n: usize) -> [u8; 4] {
    (n as u32).to_le_bytes()
}

/// A held-back group queue: its open group (or none), how many queued chunks a window takes,
/// and the queued chunks.
pub(super) fn put_held(out: &mut Vec<u8>, held: &Held) {
    out.extend_from_slice(&held.group.unwrap_or(u64::MAX).to_le_bytes());
    out.extend_from_slice(&u32_le(held.per_window));
    out.extend_from_slice(&u32_le(held.queued.len()));
    for chunk in &held.queued {
        put_chunk(out, chunk);
    }
}

/// What [`put_held`] wrote.
pub(super) fn read_held(r: &mut ByteReader) -> Option<Held> {
    let group = Some(r.u64()?).filter(|&g| g != u64::MAX);
    let per_window = r.u32()? as usize;
    let n = r.u32()? as usize;
    let queued = (0..n).map(|_| r.chunk()).collect::<Option<VecDeque<_>>>()?;
    Some(Held {
        group,
        queued,
        per_window,
    })
}

/// A series name, and the kind of its statistics when `kind` is given.
pub(super) fn put_series(out: &mut Vec<u8>, series: &SeriesName, kind: Option<StatKind>) {
    put_bytes(out, series.as_bytes());
    if let Some(kind) = kind {
        out.push(kind as u8);
    }
}

pub(super) fn read_series(r: &mut ByteReader) -> Option<SeriesName> {
    Some(SeriesName::from(std::str::from_utf8(r.bytes()?).ok()?))
}

/// What [`put_series`] wrote with a kind.
pub(super) fn read_stat_series(r: &mut ByteReader) -> Option<(SeriesName, StatKind)> {
    let series = read_series(r)?;
    Some((series, *StatKind::ALL.get(r.u8()? as usize)?))
}

pub(super) fn put_buckets(out: &mut Vec<u8>, buckets: &Buckets) {
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

pub(super) fn read_buckets(r: &mut ByteReader) -> Option<Buckets> {
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
