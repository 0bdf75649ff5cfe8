//! What the closer reports of each window: active series per type, and the samples the series
//! cap dropped (counted always, logged now and then with the prefixes that filled it).

use super::Closer;
use crate::aggregate::{ClosedWindow, DROPPED_LOGS, StatKind, Window};
use crate::protocol::MetricType;

impl Closer {
    /// Active series per type, for `active_series`.
    pub(super) fn report_active(&self, closed: &ClosedWindow) {
        let stats_of = |kind| closed.stats.iter().filter(|s| s.1 == kind).count();
        let active = [
            closed.counters.len(),
            stats_of(StatKind::Timer),
            stats_of(StatKind::Histogram),
            stats_of(StatKind::Distribution),
            closed.gauges.len(),
            closed.sets.len(),
        ];
        for (t, n) in MetricType::ALL.iter().zip(active) {
            self.telemetry.active_series[*t as usize].set(n as f64);
        }
    }

    /// Counts what the series cap dropped from `window`, and now and then names who filled it.
    pub(super) fn report_drops(&mut self, window: &Window) {
        if window.dropped.iter().all(|&n| n == 0) {
            return;
        }
        for (counter, n) in self.telemetry.samples_dropped.iter().zip(window.dropped) {
            counter.increment(n);
        }
        self.telemetry
            .logs_dropped
            .increment(window.dropped[DROPPED_LOGS]);
        if self.drop_log.occurred().is_some() {
            let busiest: Vec<String> = window
                .busiest_prefixes(5)
                .into_iter()
                .map(|(prefix, series)| format!("{prefix} ({series} series)"))
                .collect();
            tracing::warn!(
                dropped = window.dropped.iter().sum::<u64>(),
                max_series_per_window = self.config.max_series_per_window,
                busiest = busiest.join(", "),
                "series cap reached: samples of new series dropped (counted in samples_dropped_total)"
            );
        }
    }
}
