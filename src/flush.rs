//! The once-a-window loop: at each window boundary take every reader's window, close it through
//! the [`Ledger`], queue its chunks, and write the queue to Redis oldest first (SPEC §3.7–§3.9).
//!
//! The queue is the backlog: while Redis fails it grows up to `max_backlog_windows` (then the
//! oldest window is dropped and counted), and it is retried with backoff. Each chunk carries its
//! token, so a retry after a lost reply never applies anything twice.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use crate::aggregate::{Ledger, StatKind, Window};
use crate::config::Config;
use crate::protocol::MetricType;
use crate::store::{Applied, FlushChunk, Keys, Writer, build_chunks};
use crate::telemetry::Telemetry;

/// First wait after a failed write; doubled per failure up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(250);
/// Short enough that a recovered Redis is written to within seconds.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// Added to a flush token's lifetime beyond the longest retry horizon.
const TOKEN_TTL_MARGIN_SECS: u64 = 60;

/// A closed window's chunks, those before `next` already applied.
#[derive(Debug)]
struct PendingWindow {
    start: u64,
    chunks: Vec<FlushChunk>,
    next: usize,
}

pub struct Flusher {
    windows: Vec<Arc<Mutex<Window>>>,
    ledger: Ledger,
    writer: Writer,
    backlog: VecDeque<PendingWindow>,
    keys: Keys,
    agent_id: String,
    token_ttl_secs: u64,
    config: Config,
    telemetry: Arc<Telemetry>,
    backoff: Duration,
    retry_at: Option<Instant>,
}

fn unix_now() -> Duration {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
}

/// Start of the window holding `now`.
fn window_start(now: Duration, interval: u64) -> u64 {
    now.as_secs() / interval * interval
}

impl Flusher {
    pub fn new(
        windows: Vec<Arc<Mutex<Window>>>,
        writer: Writer,
        agent_id: String,
        config: Config,
        telemetry: Arc<Telemetry>,
    ) -> Flusher {
        // A token must outlive every retry of its chunk: a window is retried only while it is in
        // the backlog (at most max_backlog_windows intervals), then during the shutdown; the
        // margin covers the last backoff. Longer would only keep more token keys in Redis.
        let backlog_secs = config.max_backlog_windows as u64 * config.flush_interval_secs;
        let token_ttl_secs = backlog_secs + config.shutdown_timeout_secs + TOKEN_TTL_MARGIN_SECS;
        Flusher {
            windows,
            ledger: Ledger::default(),
            writer,
            backlog: VecDeque::new(),
            keys: Keys::new(&config.key_prefix),
            agent_id,
            token_ttl_secs,
            config,
            telemetry,
            backoff: MIN_BACKOFF,
            retry_at: None,
        }
    }

    /// Flushes at every window boundary until `stop` is cancelled (after the readers have
    /// stopped), then writes the partial window and the backlog within the shutdown timeout.
    pub async fn run(mut self, stop: CancellationToken) {
        let interval = self.config.flush_interval_secs;
        loop {
            let now = unix_now();
            let boundary = window_start(now, interval) + interval;
            let wait = Duration::from_secs(boundary).saturating_sub(now);
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
            self.close_window(boundary - interval);
            if self.retry_at.is_none_or(|t| Instant::now() >= t) {
                self.write_backlog().await;
            }
        }

        self.close_window(window_start(unix_now(), interval));
        let timeout = Duration::from_secs(self.config.shutdown_timeout_secs);
        let deadline = Instant::now() + timeout;
        while !self.backlog.is_empty() && Instant::now() < deadline {
            let _ = tokio::time::timeout_at(deadline.into(), self.write_backlog()).await;
            if !self.backlog.is_empty() {
                let pause = self
                    .backoff
                    .min(deadline.saturating_duration_since(Instant::now()));
                tokio::time::sleep(pause).await;
            }
        }
        if self.backlog.is_empty() {
            tracing::info!("final flush written");
        } else {
            let series: usize = self
                .backlog
                .iter()
                .flat_map(|w| &w.chunks[w.next..])
                .map(|c| c.series)
                .sum();
            tracing::error!(
                windows = self.backlog.len(),
                series,
                ?timeout,
                "shutdown timeout: {} windows were not written to Redis",
                self.backlog.len()
            );
        }
    }

    /// Takes every reader's window for the period starting at `start` and queues it.
    fn close_window(&mut self, start: u64) {
        let mut merged = Window::default();
        for shared in &self.windows {
            let taken = std::mem::take(&mut *shared.lock().unwrap_or_else(|p| p.into_inner()));
            merged.merge(taken);
        }
        let closed = self.ledger.close(start, merged);
        let active = [
            closed.counters.len(),
            closed
                .stats
                .iter()
                .filter(|s| s.1 == StatKind::Timer)
                .count(),
            closed
                .stats
                .iter()
                .filter(|s| s.1 == StatKind::Histogram)
                .count(),
            closed
                .stats
                .iter()
                .filter(|s| s.1 == StatKind::Distribution)
                .count(),
            closed.gauges.len(),
            closed.sets.len(),
        ];
        for (t, n) in MetricType::ALL.iter().zip(active) {
            self.telemetry.active_series[*t as usize].set(n as f64);
        }
        let chunks = build_chunks(
            &closed,
            &self.keys,
            &self.config.precisions,
            self.config.sample_count,
            &self.agent_id,
            self.token_ttl_secs,
            self.config.max_series_per_chunk,
        );
        if chunks.is_empty() {
            return;
        }
        self.backlog.push_back(PendingWindow {
            start,
            chunks,
            next: 0,
        });
        while self.backlog.len() > self.config.max_backlog_windows {
            if let Some(dropped) = self.backlog.pop_front() {
                tracing::error!(
                    window = dropped.start,
                    "backlog full: dropped the oldest unwritten window"
                );
                self.telemetry.windows_dropped.increment(1);
            }
        }
        self.telemetry
            .backlog_windows
            .set(self.backlog.len() as f64);
    }

    /// Writes queued windows oldest first until the queue is empty or a write fails.
    async fn write_backlog(&mut self) {
        while let Some(pending) = self.backlog.front_mut() {
            let started = Instant::now();
            while pending.next < pending.chunks.len() {
                match self.writer.write_chunk(&pending.chunks[pending.next]).await {
                    Ok(applied) => {
                        if applied == Applied::Before {
                            self.telemetry.chunks_applied_before.increment(1);
                            tracing::info!(
                                window = pending.start,
                                chunk = pending.next,
                                "chunk was applied before its reply was lost; not applied again"
                            );
                        }
                        pending.next += 1;
                    }
                    Err(e) => {
                        let window = pending.start;
                        tracing::warn!(window, error = %e, backlog = self.backlog.len(), "flush failed; will retry");
                        self.telemetry.flushes_failed.increment(1);
                        self.retry_at = Some(Instant::now() + self.backoff);
                        self.backoff = (self.backoff * 2).min(MAX_BACKOFF);
                        return;
                    }
                }
            }
            self.telemetry
                .flush_duration
                .record(started.elapsed().as_secs_f64());
            self.telemetry.flushes_ok.increment(1);
            self.telemetry.last_flush.set(unix_now().as_secs_f64());
            self.backlog.pop_front();
            self.telemetry
                .backlog_windows
                .set(self.backlog.len() as f64);
            self.backoff = MIN_BACKOFF;
            self.retry_at = None;
        }
    }
}
