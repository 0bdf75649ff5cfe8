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

use std::sync::Arc;

use super::Closer;
use super::coarse::{self, Coarse};
use super::codec::u32_le;
use super::quantiles::{self, QuantileGroups};
use crate::spool::{ByteReader, put_bytes, put_chunk};
use crate::store::FlushChunk;

impl Closer {
    /// With a spool, while `coarse_write_secs` or `quantile_write_secs` holds anything back:
    /// the state file replaced after closing window `start`, with that window's chunks, so
    /// that a crash between the two files still finds the window.
    pub(super) fn spool_held(&mut self, start: u64, chunks: &[Arc<FlushChunk>]) {
        let holding = self.coarse.is_some() || self.quantiles.is_some();
        let Some(spool) = self.spool.as_ref().filter(|_| holding) else {
            return;
        };
        let held = write(
            start,
            &self.sequence,
            chunks,
            self.coarse.as_ref(),
            self.quantiles.as_ref(),
        );
        if let Err(e) = spool.write_state(held) {
            self.telemetry.spool_state_errors.increment(1);
            if let Some(times) = self.state_spool_log.occurred() {
                tracing::error!(window = start, error = %e, times, "cannot spool the sums held back; the outdated state file is removed, so a crash before the next write loses them (never applies them twice)");
            }
        }
    }
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
    coarse::put_state(coarse, &mut out);
    if let Some(q) = quantiles {
        q.put_state(&mut out);
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
    let held_coarse = coarse::read_state(&mut r)?;
    let held_quantiles = if r.0.is_empty() {
        None
    } else {
        Some(quantiles::read_state(&mut r)?)
    };
    if !r.0.is_empty() {
        return None;
    }
    held_coarse.take_up(coarse);
    if let Some(held) = held_quantiles {
        held.take_up(quantiles);
    }
    Some((start, sequence, chunks))
}
