//! Timestamped counters and gauges of earlier seconds (DogStatsD's `|T`): written at the
//! slices of their own second, at each precision whose retention still holds it, as small
//! windows of their own queued ahead of the window they came in: the same chunks, numbering
//! and spool, so exactly once as everything else.

use std::collections::BTreeMap;

use super::Closer;
use crate::aggregate::{ClosedWindow, StampOutcomes, StampedValue, StampedWrite};
use crate::store::{CounterWrite, FlushChunk, keys};

impl Closer {
    /// The chunks of the values of earlier seconds in the window starting at `start`.
    pub(super) fn stamped_chunks(&self, start: u64, stamped: Vec<StampedWrite>) -> Vec<FlushChunk> {
        let end = start + self.config.flush_interval_secs;
        let retention = self.config.retention();
        let mut windows: BTreeMap<(u64, Vec<u64>), ClosedWindow> = BTreeMap::new();
        for w in stamped {
            // The precisions whose retention holds the second, less those whose slice holds a
            // later value of the gauge.
            let precisions: Vec<u64> = retention
                .archives()
                .iter()
                .map(|a| a.precision)
                .filter(|&p| keys::slice(w.at, p) + retention.seconds(p) > end)
                .filter(|&p| match w.value {
                    StampedValue::Gauge {
                        later: Some(later), ..
                    } => keys::slice(w.at, p) != keys::slice(later, p),
                    _ => true,
                })
                .collect();
            if precisions.is_empty() {
                continue;
            }
            let window = windows.entry((w.at, precisions)).or_default();
            window.start = w.at;
            match w.value {
                StampedValue::Counter(n) => window.counters.push((w.series, n)),
                StampedValue::Gauge { value, .. } => window.gauges.push((w.series, value)),
            }
        }
        windows
            .into_iter()
            .flat_map(|((_, precisions), window)| {
                let precisions: Vec<(u64, CounterWrite)> = CounterWrite::everywhere(&precisions);
                self.chunker.chunks(&window, &precisions)
            })
            .collect()
    }

    /// Counts what became of the window's timestamped samples; those dropped are also logged,
    /// at most every 10 s.
    pub(super) fn report_stamps(&mut self, outcomes: StampOutcomes, ignored: u64) {
        let counts = [
            outcomes.earlier,
            outcomes.current,
            outcomes.too_old,
            outcomes.too_far_ahead,
            ignored,
        ];
        for (counter, n) in self.telemetry.timestamped.iter().zip(counts) {
            counter.increment(n);
        }
        let dropped = outcomes.too_old + outcomes.too_far_ahead;
        if dropped > 0
            && let Some(windows) = self.stamp_log.occurred()
        {
            tracing::warn!(
                too_old = outcomes.too_old,
                too_far_ahead = outcomes.too_far_ahead,
                max_timestamp_age_secs = self.config.timestamp_age_limit(),
                ahead_secs = crate::aggregate::STAMP_AHEAD_SECS,
                windows,
                "timestamped samples dropped: older than the limit, or further ahead than the window's end by more than ahead_secs (counted in timestamped_samples_total; windows: windows with such samples since the last such line)"
            );
        }
    }
}
