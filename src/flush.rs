//! The once-a-window loop (SPEC §3.7–§3.9), as two halves that share the backlog queue:
//! the *closer* takes every reader's window at each boundary, on schedule, closes it through the
//! [`Ledger`] and queues its chunks; the *writer* writes the queue to Redis oldest first.
//!
//! Closing never waits for Redis, so each window stays one window even when writes are slower
//! than a window: overload shows as a growing `backlog_windows`, never as seconds merged into one
//! slice. While Redis fails the queue grows up to `max_backlog_windows` (then the oldest window
//! is dropped and counted) and is retried with backoff. Each chunk carries its token, so a retry
//! after a lost reply never applies anything twice.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;
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
    chunks: Vec<Arc<FlushChunk>>,
    next: usize,
}

/// Closed windows not yet written, oldest first. The front one may be being written.
#[derive(Default)]
struct Backlog {
    windows: Mutex<VecDeque<PendingWindow>>,
    /// A window was queued, or the closer finished.
    changed: Notify,
}

impl Backlog {
    fn lock(&self) -> MutexGuard<'_, VecDeque<PendingWindow>> {
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }
}

pub struct Flusher {
    closer: Closer,
    writer: Writer,
    shutdown_timeout: Duration,
    telemetry: Arc<Telemetry>,
}

/// Takes the readers' windows at each boundary and queues them, ready to write.
struct Closer {
    windows: Vec<Arc<Mutex<Window>>>,
    ledger: Ledger,
    keys: Keys,
    agent_id: String,
    token_ttl_secs: u64,
    config: Config,
    telemetry: Arc<Telemetry>,
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
            shutdown_timeout: Duration::from_secs(config.shutdown_timeout_secs),
            telemetry: telemetry.clone(),
            writer,
            closer: Closer {
                windows,
                ledger: Ledger::default(),
                keys: Keys::new(&config.key_prefix),
                agent_id,
                token_ttl_secs,
                config,
                telemetry,
            },
        }
    }

    /// Closes a window at every boundary and writes the backlog until `stop` is cancelled
    /// (after the readers have stopped); then closes the partial window and writes what is
    /// queued within the shutdown timeout.
    pub async fn run(self, stop: CancellationToken) {
        let Flusher {
            mut closer,
            writer,
            shutdown_timeout,
            telemetry,
        } = self;
        let backlog = Backlog::default();
        let closed = CancellationToken::new();
        let closing = async {
            closer.run(&backlog, &stop).await;
            closed.cancel();
            backlog.changed.notify_one();
        };
        let writing = async {
            let deadline = async {
                closed.cancelled().await;
                tokio::time::sleep(shutdown_timeout).await;
            };
            tokio::select! {
                _ = write_backlog(writer, &backlog, &closed, &telemetry) => {}
                _ = deadline => {}
            }
        };
        tokio::join!(closing, writing);

        let unwritten = backlog.lock();
        if unwritten.is_empty() {
            tracing::info!("final flush written");
        } else {
            let series: usize = unwritten
                .iter()
                .flat_map(|w| &w.chunks[w.next..])
                .map(|c| c.series)
                .sum();
            tracing::error!(
                windows = unwritten.len(),
                series,
                timeout = ?shutdown_timeout,
                "shutdown timeout: {} windows were not written to Redis",
                unwritten.len()
            );
        }
    }
}

impl Closer {
    /// Closes a window at every boundary until `stop`, then the partial window.
    async fn run(&mut self, backlog: &Backlog, stop: &CancellationToken) {
        let interval = self.config.flush_interval_secs;
        loop {
            let now = unix_now();
            let boundary = window_start(now, interval) + interval;
            let wait = Duration::from_secs(boundary).saturating_sub(now);
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
            self.close(boundary - interval, backlog);
        }
        self.close(window_start(unix_now(), interval), backlog);
    }

    /// Takes every reader's window for the period starting at `start` and queues it.
    fn close(&mut self, start: u64, backlog: &Backlog) {
        let mut merged = Window::default();
        for shared in &self.windows {
            let taken = std::mem::take(&mut *shared.lock().unwrap_or_else(|p| p.into_inner()));
            merged.merge(taken);
        }
        let closed = self.ledger.close(start, merged);
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
        let mut queue = backlog.lock();
        queue.push_back(PendingWindow {
            start,
            chunks: chunks.into_iter().map(Arc::new).collect(),
            next: 0,
        });
        while queue.len() > self.config.max_backlog_windows {
            if let Some(dropped) = queue.pop_front() {
                tracing::error!(
                    window = dropped.start,
                    "backlog full: dropped the oldest unwritten window"
                );
                self.telemetry.windows_dropped.increment(1);
            }
        }
        self.telemetry.backlog_windows.set(queue.len() as f64);
        drop(queue);
        backlog.changed.notify_one();
    }
}

/// Writes queued windows oldest first, retrying a failed chunk with backoff, until the queue is
/// empty after `closed`.
async fn write_backlog(
    mut writer: Writer,
    backlog: &Backlog,
    closed: &CancellationToken,
    telemetry: &Telemetry,
) {
    let mut backoff = MIN_BACKOFF;
    // The window being written and when its first chunk was sent.
    let mut current: Option<(u64, Instant)> = None;
    loop {
        let next = backlog
            .lock()
            .front()
            .map(|w| (w.start, w.next, w.chunks[w.next].clone()));
        let Some((start, index, chunk)) = next else {
            if closed.is_cancelled() {
                return;
            }
            backlog.changed.notified().await;
            continue;
        };
        let started = match current {
            Some((s, t)) if s == start => t,
            _ => current.insert((start, Instant::now())).1,
        };
        match writer.write_chunk(&chunk).await {
            Ok(applied) => {
                backoff = MIN_BACKOFF;
                if applied == Applied::Before {
                    telemetry.chunks_applied_before.increment(1);
                    tracing::info!(
                        window = start,
                        chunk = index,
                        "chunk was applied before its reply was lost; not applied again"
                    );
                }
                let mut queue = backlog.lock();
                // The closer may have dropped this window meanwhile (backlog full).
                let Some(front) = queue.front_mut().filter(|w| w.start == start) else {
                    continue;
                };
                front.next += 1;
                if front.next == front.chunks.len() {
                    queue.pop_front();
                    telemetry.backlog_windows.set(queue.len() as f64);
                    telemetry
                        .flush_duration
                        .record(started.elapsed().as_secs_f64());
                    telemetry.flushes_ok.increment(1);
                    telemetry.last_flush.set(unix_now().as_secs_f64());
                }
            }
            Err(e) => {
                let queued = backlog.lock().len();
                tracing::warn!(window = start, error = %e, backlog = queued, "flush failed; will retry");
                telemetry.flushes_failed.increment(1);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}
