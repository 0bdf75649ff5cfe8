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
use crate::store::{FlushChunk, InFlight, NO_REDIS_HINT, Outcome, StoreError, Writer};
use crate::telemetry::{LogLimit, Telemetry};

/// First wait after a failed write; doubled per failure up to [`MAX_BACKOFF`].
const MIN_BACKOFF: Duration = Duration::from_millis(250);
/// Short enough that a recovered Redis is written to within seconds.
const MAX_BACKOFF: Duration = Duration::from_secs(5);

/// With nothing to write, the writer checks Redis this often: `redis_up` and the heartbeat
/// (`last_flush_timestamp_seconds`) stay true on an idle agent.
const IDLE_PING: Duration = Duration::from_secs(5);

/// Whether writes reach Redis: one log line when they stop, one when they come back (and one
/// when the error changes meanwhile, at most every 10 s: a Redis restarted with another
/// password is not a broken pipe for ever), the `redis_up` gauge, and what `/readyz` answers.
#[derive(Default)]
struct RedisState {
    /// Since when writes have failed, and the last error logged.
    down_since: Option<(Instant, String)>,
    changed_log: LogLimit,
}

impl RedisState {
    /// Writes reached Redis at `now` (the writer's clock).
    fn up(&mut self, telemetry: &Telemetry, queued: usize, now: Duration) {
        telemetry.redis_up.set(1.0);
        telemetry.readiness.written();
        telemetry.last_flush_timestamp.set(now.as_secs_f64());
        if let Some((since, _)) = self.down_since.take() {
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
        let text = error.to_string();
        telemetry.readiness.failed(text.clone());
        match &mut self.down_since {
            None => {
                tracing::warn!(
                    window,
                    error = %text,
                    backlog = queued,
                    hint = error.no_redis_there().then_some(NO_REDIS_HINT),
                    "cannot write to Redis; windows wait in the backlog and are retried (one line when it is back)"
                );
                self.down_since = Some((Instant::now(), text));
                // A changed reason is logged 10 s into the outage at the earliest: the first
                // seconds go from a broken connection to a refused one as a rule.
                self.changed_log = LogLimit::default();
                self.changed_log.occurred();
            }
            Some((since, logged)) if *logged != text && self.changed_log.occurred().is_some() => {
                tracing::warn!(
                    window,
                    error = %text,
                    backlog = queued,
                    down_seconds = since.elapsed().as_secs_f64().round(),
                    "still cannot write to Redis, now for another reason"
                );
                *logged = text;
            }
            Some(_) => {
                tracing::debug!(window, error = %text, backlog = queued, "write still failing")
            }
        }
    }
}

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
    /// Where a crash would find it.
    pub(super) spooled: Spooled,
}

/// Where a queued window is besides memory.
#[derive(Debug)]
pub(super) enum Spooled {
    /// Nowhere: the agent runs without a spool.
    NoSpool,
    /// In its spool file, removed once the window is written or dropped.
    File(PathBuf),
    /// The spool could not take it (a full disk): a crash would lose it. What its file needs
    /// when the spool has room again: its place among its run's windows, and its chunks as
    /// closed (the writer drops those Redis acknowledged from the queue's copy).
    Unspooled {
        number: u64,
        chunks: Vec<Arc<FlushChunk>>,
    },
}

impl Spooled {
    /// A window's spool file written, or why not (then the window is in memory only).
    pub(super) fn from_write(
        written: std::io::Result<PathBuf>,
        number: u64,
        chunks: &[Arc<FlushChunk>],
    ) -> Spooled {
        match written {
            Ok(path) => Spooled::File(path),
            Err(_) => Spooled::Unspooled {
                number,
                chunks: chunks.to_vec(),
            },
        }
    }

    fn file(&self) -> Option<&PathBuf> {
        match self {
            Spooled::File(path) => Some(path),
            _ => None,
        }
    }
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
    /// Windows the backlog dropped, logged at most once per 10 s.
    drop_log: Mutex<LogLimit>,
}

/// The backlog's gauges, the oldest window waiting and the windows a crash would lose, after
/// `queue` changed.
pub(super) fn publish(queue: &VecDeque<PendingWindow>, telemetry: &Telemetry) {
    let bytes: u64 = queue.iter().map(PendingWindow::bytes).sum();
    let unspooled = queue
        .iter()
        .filter(|w| matches!(w.spooled, Spooled::Unspooled { .. }))
        .count();
    telemetry.backlog_windows.set(queue.len() as f64);
    telemetry.backlog_bytes.set(bytes as f64);
    telemetry.backlog_unspooled_windows.set(unspooled as f64);
    telemetry
        .readiness
        .waiting(queue.iter().map(|w| w.start).min(), unspooled);
}

impl Backlog {
    pub(super) fn lock(&self) -> MutexGuard<'_, VecDeque<PendingWindow>> {
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Logs the end of the final flush: all written, or what the shutdown timeout left (in the
    /// spool for the next start, or lost).
    pub(super) fn report_final(&self, shutdown_timeout: Duration) {
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
        let kept = unwritten
            .iter()
            .filter(|w| w.spooled.file().is_some())
            .count();
        let why = if unwritten
            .iter()
            .any(|w| matches!(w.spooled, Spooled::NoSpool))
        {
            "no spool_dir"
        } else {
            "the spool could not take them"
        };
        tracing::error!(
            windows = unwritten.len(),
            series,
            timeout = ?shutdown_timeout,
            "shutdown timeout: {} windows were not written to Redis; {kept} stay in the spool and are written at the next start, {} are lost ({why})",
            unwritten.len(),
            unwritten.len() - kept,
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
            telemetry.windows_dropped.increment(1);
            let logged = self
                .drop_log
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .occurred();
            if let Some(windows) = logged {
                tracing::error!(
                    window = dropped.start,
                    windows,
                    "backlog full: dropped the oldest unwritten windows (windows: how many since the last such line; all are counted in windows_dropped_total)"
                );
            }
            if let (Some(spool), Some(file)) = (spool, dropped.spooled.file()) {
                spool.remove(file);
            }
        }
        publish(&queue, telemetry);
        drop(queue);
        self.changed.notify_one();
    }
}

/// Writes queued windows oldest first, retrying a failed chunk with backoff, until the queue is
/// empty after `closed`: as many chunks a call as the writer takes ([`Writer::batch`]), then
/// what the window's chunks left ([`Writer::finish`]).
pub(super) async fn write_backlog(
    writer: &mut Writer,
    backlog: &Backlog,
    closed: &CancellationToken,
    spool: Option<&Spool>,
    telemetry: &Telemetry,
) {
    let mut backoff = MIN_BACKOFF;
    let mut redis = RedisState::default();
    // Whether Redis takes writes is known from the start (`/readyz`, `redis_up`).
    match writer.ping().await {
        Ok(()) => redis.up(telemetry, 0, writer.clock().now()),
        Err(e) => redis.down(telemetry, None, &e, 0),
    }
    let mut current: Option<Current> = None;
    loop {
        let next = backlog.lock().front_mut().map(|w| {
            let end = writer.batch(w.chunks.len());
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
                    Ok(()) => redis.up(telemetry, 0, writer.clock().now()),
                    Err(e) => redis.down(telemetry, None, &e, 0),
                }
            }
            continue;
        };
        if let Some(mut left) = current.take_if(|c| c.id != id) {
            // A window the backlog dropped part-written: what its acknowledged chunks left (a
            // cluster's index members and averages) is written all the same, once.
            if let Err(e) = writer.finish(&mut left.in_flight).await {
                tracing::warn!(error = %e, "could not write a dropped window's index members");
            }
        }
        let Current {
            started,
            in_flight,
            items,
            ..
        } = current.get_or_insert_with(|| Current {
            id,
            started: Instant::now(),
            in_flight: InFlight::default(),
            items: 0,
        });
        // Without chunks left (all acknowledged, what they left failed) `write` sends nothing
        // and only `finish` below goes.
        let Outcome {
            acknowledged,
            replayed,
            mut error,
        } = writer
            .write(&sequence, &chunks, &sent_before, in_flight)
            .await;
        if replayed > 0 {
            telemetry.chunks_applied_before.increment(replayed as u64);
            tracing::info!(
                window = start,
                chunks = replayed,
                "chunks were applied before (a lost reply, or a window sent again); not applied again"
            );
        }
        *items += chunks
            .iter()
            .zip(&acknowledged)
            .filter(|(_, a)| **a)
            .map(|(c, _)| c.series)
            .sum::<usize>();
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
        let mut refused_most = None;
        if done && let Err(e) = writer.finish(in_flight).await {
            done = false;
            error = Some(e);
        }
        if done {
            let mut queue = backlog.lock();
            if queue.front().is_some_and(|w| w.id == id) {
                let finished = queue.pop_front();
                publish(&queue, telemetry);
                drop(queue);
                if let (Some(spool), Some(finished)) = (spool, finished)
                    && let Some(file) = finished.spooled.file()
                {
                    spool.remove(file);
                }
                let seconds = started.elapsed().as_secs_f64();
                telemetry.flush_duration.record(seconds);
                tracing::debug!(window = start, seconds, "window written");
                telemetry.flushes_ok.increment(1);
            }
            // Applied, but Redis refused as many writes as the window had items (an ACL
            // without rights on our keys, say): not being written either.
            let (refused, example) = writer.take_refused();
            if refused > 0 && refused >= *items as u64 {
                refused_most = Some(format!(
                    "Redis refused {refused} writes of a window of {items} items, such as: {}",
                    example.unwrap_or_default()
                ));
            }
        }
        let queued = backlog.lock().len();
        match error {
            None => {
                backoff = MIN_BACKOFF;
                redis.up(telemetry, queued, writer.clock().now());
                if let Some(why) = refused_most {
                    telemetry.readiness.failed(why);
                }
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

/// The window being written: when its first chunk was sent, what its acknowledged chunks left
/// to write, and the items of its chunks acknowledged so far.
struct Current {
    id: u64,
    started: Instant,
    in_flight: InFlight,
    items: usize,
}

/// Keeps the items whose chunk was not acknowledged (`acknowledged` covers the first ones).
fn keep_unacknowledged<T>(items: &mut Vec<T>, acknowledged: &[bool]) {
    let mut done = acknowledged.iter();
    items.retain(|_| !done.next().copied().unwrap_or(false));
}
