//! The writing half of the flush: closed windows queued oldest first ([`Backlog`], bounded
//! by `max_backlog_windows` and `max_backlog_bytes`), and [`write_backlog`], which writes them
//! to Redis, retrying with backoff, and removes each from the queue (and its spool file) once
//! Redis has all of it.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::config::Config;
use crate::spool::Spool;
use crate::store::{FlushChunk, FollowUps, StoreError, Writer, clock};
use crate::telemetry::Telemetry;

/// First wait after a failed write; doubled per failure up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(250);
/// Short enough that a recovered Redis is written to within seconds.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// With nothing to write, the writer checks Redis this often: `redis_up` and the heartbeat
/// (`last_flush_timestamp_seconds`) stay true on an idle agent.
const IDLE_PING: Duration = Duration::from_secs(5);

/// Whether writes reach Redis: one log line when they stop, one when they come back, and the
/// `redis_up` gauge, instead of a line per failed attempt.
#[derive(Default)]
struct RedisState {
    /// Since when writes have failed.
    down_since: Option<Instant>,
}

impl RedisState {
    fn up(&mut self, telemetry: &Telemetry, queued: usize) {
        telemetry.redis_up.set(1.0);
        telemetry
            .last_flush_timestamp
            .set(clock::since_epoch().as_secs_f64());
        if let Some(since) = self.down_since.take() {
            tracing::info!(
                down_seconds = since.elapsed().as_secs_f64().round(),
                backlog = queued,
                "Redis is reachable again; writing the windows that waited"
            );
        }
    }

    fn down(
        &mut self,
        telemetry: &Telemetry,
        window: Option<u64>,
        error: &StoreError,
        queued: usize,
    ) {
        telemetry.redis_up.set(0.0);
        match self.down_since {
            None => {
                tracing::warn!(
                    window,
                    error = %error,
                    backlog = queued,
                    "cannot write to Redis; windows wait in the backlog and are retried (one line when it is back)"
                );
                self.down_since = Some(Instant::now());
            }
            Some(_) => {
                tracing::debug!(window, error = %error, backlog = queued, "write still failing")
            }
        }
    }
}

/// Chunks sent in one pipeline: Redis runs the next while the agent reads a reply, instead of
/// idling for a round trip per chunk. Redis runs a pipeline's scripts back to back, so other
/// clients may wait for up to this many chunks (~2 ms each at the default size).
const PIPELINED_CHUNKS: usize = 4;

/// A closed window's chunks not yet acknowledged.
#[derive(Debug)]
pub(super) struct PendingWindow {
    /// Its place in the queue, from 1 (set when queued): two windows may share a start and a
    /// run (a clock stepped back), never this.
    pub(super) id: u64,
    pub(super) start: u64,
    /// The sequence key of the run that numbered the chunks.
    pub(super) sequence: Arc<str>,
    pub(super) chunks: Vec<Arc<FlushChunk>>,
    /// Per chunk, whether it was sent before without an answer (or comes from a spool): Redis
    /// may have applied it.
    pub(super) sent: Vec<bool>,
    /// Its spool file, removed once the window is written or dropped.
    pub(super) file: Option<PathBuf>,
}

impl PendingWindow {
    pub(super) fn bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.bytes() as u64).sum()
    }
}

/// Closed windows not yet written, oldest first. The front one may be being written.
#[derive(Default)]
pub(super) struct Backlog {
    windows: Mutex<VecDeque<PendingWindow>>,
    /// Windows queued so far: the id of the last one.
    queued: std::sync::atomic::AtomicU64,
    /// A window was queued, or the closer finished.
    pub(super) changed: Notify,
}

impl Backlog {
    pub(super) fn lock(&self) -> MutexGuard<'_, VecDeque<PendingWindow>> {
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logs the end of the final flush: all written, or what the shutdown timeout left.
    pub(super) fn report_final(&self, spooled: bool, shutdown_timeout: Duration) {
        let unwritten = self.lock();
        if unwritten.is_empty() {
            tracing::info!("final flush written");
            return;
        }
        let series: usize = unwritten
            .iter()
            .flat_map(|w| &w.chunks)
            .map(|c| c.series)
            .sum();
        let kept = if spooled {
            "they stay in the spool and are written at the next start"
        } else {
            "they are lost (no spool_dir)"
        };
        tracing::error!(
            windows = unwritten.len(),
            series,
            timeout = ?shutdown_timeout,
            "shutdown timeout: {} windows were not written to Redis; {kept}",
            unwritten.len()
        );
    }

    /// Queues a window, then drops the oldest while either bound is exceeded (never the one
    /// just queued), removing their spool files.
    pub(super) fn push(
        &self,
        mut window: PendingWindow,
        config: &Config,
        spool: Option<&Spool>,
        telemetry: &Telemetry,
    ) {
        window.id = self
            .queued
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
            + 1;
        let mut queue = self.lock();
        queue.push_back(window);
        let mut bytes: u64 = queue.iter().map(PendingWindow::bytes).sum();
        while queue.len() > config.max_backlog_windows
            || (bytes > config.max_backlog_bytes && queue.len() > 1)
        {
            let Some(dropped) = queue.pop_front() else {
                break;
            };
            bytes -= dropped.bytes();
            tracing::error!(
                window = dropped.start,
                "backlog full: dropped the oldest unwritten window"
            );
            telemetry.windows_dropped.increment(1);
            if let (Some(spool), Some(file)) = (spool, &dropped.file) {
                spool.remove(file);
            }
        }
        telemetry.backlog_windows.set(queue.len() as f64);
        telemetry.backlog_bytes.set(bytes as f64);
        drop(queue);
        self.changed.notify_one();
    }
}

/// Writes queued windows oldest first, retrying a failed chunk with backoff, until the queue is
/// empty after `closed`. One server takes a window's chunks a pipeline at a time, in order; a
/// cluster takes all of them at once (in order within a slot), then their follow-ups.
pub(super) async fn write_backlog(
    writer: &mut Writer,
    backlog: &Backlog,
    closed: &CancellationToken,
    spool: Option<&Spool>,
    telemetry: &Telemetry,
) {
    let mut backoff = MIN_BACKOFF;
    let mut redis = RedisState::default();
    // The window being written, when its first chunk was sent, and (cluster) its follow-ups.
    let mut current: Option<(u64, Instant, FollowUps)> = None;
    loop {
        let next = backlog.lock().front_mut().map(|w| {
            let end = if writer.is_cluster() {
                w.chunks.len()
            } else {
                PIPELINED_CHUNKS.min(w.chunks.len())
            };
            let sent = w.sent[..end].to_vec();
            // From now on these may have been applied, whatever comes back.
            w.sent[..end].fill(true);
            (
                w.id,
                w.start,
                w.sequence.clone(),
                w.chunks[..end].to_vec(),
                sent,
            )
        });
        let Some((id, start, sequence, chunks, sent_before)) = next else {
            if closed.is_cancelled() {
                return;
            }
            if tokio::time::timeout(IDLE_PING, backlog.changed.notified())
                .await
                .is_err()
            {
                match writer.ping().await {
                    Ok(()) => redis.up(telemetry, 0),
                    Err(e) => redis.down(telemetry, None, &e, 0),
                }
            }
            continue;
        };
        if let Some((_, _, left)) = current.take_if(|c| c.0 != id) {
            // A window the backlog dropped part-written: what its acknowledged chunks left for
            // the hot keys is written all the same (once; they are only index members and
            // averages).
            if !left.is_empty()
                && let Err(e) = writer.write_follow_ups(&left).await
            {
                tracing::warn!(error = %e, "could not write a dropped window's index members");
            }
        }
        let (_, started, follow_ups) =
            current.get_or_insert_with(|| (id, Instant::now(), FollowUps::default()));
        // Without chunks left (all acknowledged, the follow-ups failed) only the follow-ups go.
        let (acknowledged, replayed, mut error) = if chunks.is_empty() {
            (Vec::new(), 0, None)
        } else if writer.is_cluster() {
            let written = writer
                .write_slots(&sequence, &chunks, &sent_before, follow_ups)
                .await;
            (written.acknowledged, written.replayed, written.error)
        } else {
            let written = writer.write_chunks(&sequence, &chunks, &sent_before).await;
            let mut acknowledged = vec![false; chunks.len()];
            acknowledged[..written.acknowledged].fill(true);
            (acknowledged, written.replayed, written.error)
        };
        if replayed > 0 {
            telemetry.chunks_applied_before.increment(replayed as u64);
            tracing::info!(
                window = start,
                chunks = replayed,
                "chunks were applied before (a lost reply, or a window sent again); not applied again"
            );
        }
        // The closer may have dropped this window meanwhile (backlog full).
        let unwritten = {
            let mut queue = backlog.lock();
            queue.front_mut().filter(|w| w.id == id).map(|front| {
                keep_unacknowledged(&mut front.chunks, &acknowledged);
                keep_unacknowledged(&mut front.sent, &acknowledged);
                front.chunks.len()
            })
        };
        let mut done = unwritten == Some(0);
        if done && !follow_ups.is_empty() {
            match writer.write_follow_ups(follow_ups).await {
                Ok(()) => *follow_ups = FollowUps::default(),
                Err(e) => {
                    done = false;
                    error = Some(e);
                }
            }
        }
        if done {
            let mut queue = backlog.lock();
            if queue.front().is_some_and(|w| w.id == id) {
                let finished = queue.pop_front();
                telemetry.backlog_windows.set(queue.len() as f64);
                let bytes: u64 = queue.iter().map(PendingWindow::bytes).sum();
                telemetry.backlog_bytes.set(bytes as f64);
                drop(queue);
                if let (Some(spool), Some(file)) = (spool, finished.and_then(|w| w.file)) {
                    spool.remove(&file);
                }
                let seconds = started.elapsed().as_secs_f64();
                telemetry.flush_duration.record(seconds);
                tracing::debug!(window = start, seconds, "window written");
                telemetry.flushes_ok.increment(1);
            }
        }
        let queued = backlog.lock().len();
        match error {
            None => {
                backoff = MIN_BACKOFF;
                redis.up(telemetry, queued);
            }
            Some(e) => {
                redis.down(telemetry, Some(start), &e, queued);
                telemetry.flushes_failed.increment(1);
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(MAX_BACKOFF);
            }
        }
    }
}

/// Keeps the items whose chunk was not acknowledged (`acknowledged` covers the first ones).
fn keep_unacknowledged<T>(items: &mut Vec<T>, acknowledged: &[bool]) {
    let mut done = acknowledged.iter();
    items.retain(|_| !done.next().copied().unwrap_or(false));
}
