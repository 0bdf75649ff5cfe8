//! The once-a-window loop (SPEC §3.7–§3.9), as two halves that share the backlog queue:
//! the *closer* takes every reader's window at each boundary, on schedule, closes it through the
//! [`Ledger`] and queues its chunks; the *writer* writes the queue to Redis oldest first.
//!
//! Closing never waits for Redis, so each window stays one window even when writes are slower
//! than a window: overload shows as a growing `backlog_windows`, never as seconds merged into one
//! slice. While Redis fails the queue grows up to `max_backlog_windows` (then the oldest window
//! is dropped and counted) and is retried with backoff. Chunks are numbered in sending order and
//! Redis applies each number once, so neither a retry after a lost reply nor a late copy
//! applies anything twice. With a [`Spool`], each window is on disk before it is queued (and
//! the coarse sums with it), and what an earlier run left there is queued first.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::aggregate::{
    Bucket, Buckets, ClosedWindow, CoarseSums, DROPPED_LOGS, Ledger, SeriesName, StatKind, Stats,
    Window,
};
use crate::config::Config;
use crate::config::RedisMode;
use crate::protocol::MetricType;
use crate::spool::{Reader, Spool, put_bytes, put_chunk};
use crate::store::{
    ChunkSettings, CounterWrite, FlushChunk, FollowUps, Keys, QuantileSettings, StoreError, Writer,
    build_chunks, build_slot_chunks,
};
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
        telemetry.last_flush.set(unix_now().as_secs_f64());
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

/// Windows whose cap dropped samples are logged at most this often (all are counted).
const DROP_LOG_INTERVAL: Duration = Duration::from_secs(10);

/// A closed window's chunks not yet acknowledged.
#[derive(Debug)]
struct PendingWindow {
    /// Its place in the queue, from 1 (set when queued): two windows may share a start and a
    /// run (a clock stepped back), never this.
    id: u64,
    start: u64,
    /// The sequence key of the run that numbered the chunks.
    sequence: Arc<str>,
    chunks: Vec<Arc<FlushChunk>>,
    /// Its spool file, removed once the window is written or dropped.
    file: Option<PathBuf>,
}

impl PendingWindow {
    fn bytes(&self) -> u64 {
        self.chunks.iter().map(|c| c.bytes() as u64).sum()
    }
}

/// Closed windows not yet written, oldest first. The front one may be being written.
#[derive(Default)]
struct Backlog {
    windows: Mutex<VecDeque<PendingWindow>>,
    /// Windows queued so far: the id of the last one.
    queued: std::sync::atomic::AtomicU64,
    /// A window was queued, or the closer finished.
    changed: Notify,
}

impl Backlog {
    fn lock(&self) -> MutexGuard<'_, VecDeque<PendingWindow>> {
        self.windows.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Queues a window, then drops the oldest while either bound is exceeded (never the one
    /// just queued), removing their spool files.
    fn push(
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
    settings: ChunkSettings,
    /// This run's sequence key, the number of the last chunk queued, and of the last window
    /// spooled (its file's place in the replay order).
    sequence: Arc<str>,
    last_seq: u64,
    last_window: u64,
    /// Cluster mode: windows become slot chunks, numbered per slot (the sequence key is one per
    /// slot: this run's name with the slot's hash tag).
    slot_seqs: Option<std::collections::HashMap<u16, u64>>,
    config: Config,
    telemetry: Arc<Telemetry>,
    coarse: Coarse,
    /// When samples dropped by the series cap were last logged.
    last_drop_log: Option<Instant>,
    spool: Option<Arc<Spool>>,
    /// Configurations a SIGHUP read: the keys that apply to a running flusher are taken at
    /// the next close ([`Closer::take_reload`]).
    reloads: Option<tokio::sync::watch::Receiver<Config>>,
}

/// What `coarse_write_secs` (K) takes out of the windows' own writes: the counters at every
/// precision `p > 1` are summed and written once per `min(p, K)` seconds, one [`Level`] per
/// distinct period. The first level also carries the hourly statistics and the index members of
/// the counters written every window. Gauges, sets and logs are small beside the counters and
/// written every window.
struct Coarse {
    /// What a window's own chunks do with its counters at each precision (gauges and sets are
    /// written at all of them).
    window_precisions: Vec<(u64, CounterWrite)>,
    /// Shortest period first.
    levels: Vec<Level>,
    /// What each level's open group summed.
    sums: CoarseSums,
}

/// The precisions written once per `period_secs`; their sums are `Coarse::sums` at this level's index.
struct Level {
    period_secs: u64,
    /// What this level's chunks do with counters at each precision.
    precisions: Vec<(u64, CounterWrite)>,
    /// The same without index members, for series this level wrote in the group before too;
    /// `None` where that is not safe (see [`Coarse::new`]).
    continuing: Option<Vec<(u64, CounterWrite)>>,
    /// The current group's first window.
    group: Option<u64>,
    /// Chunks of finished groups, spread over the following period's windows so that a group's
    /// end does not make one window several times as costly as the others.
    queued: VecDeque<FlushChunk>,
    per_window: usize,
}

impl Level {
    /// Whether windows starting at `a` and `b` belong to different groups: another slice of one
    /// of the level's precisions, another period, or (for the stats) another hour.
    fn separates(&self, a: u64, b: u64, stats: bool) -> bool {
        let crosses = |p: u64| a / p != b / p;
        crosses(self.period_secs)
            || (stats && crosses(3600))
            || self
                .precisions
                .iter()
                .any(|&(p, c)| c == CounterWrite::Write && crosses(p))
    }
}

impl Coarse {
    fn new(config: &Config) -> Coarse {
        let interval = config.flush_interval_secs;
        let k = config.coarse_write_secs;
        let period = |p: u64| p.min(k);
        let fine = |p: u64| period(p) <= interval;
        let mut periods: Vec<u64> = config.precisions.iter().map(|&p| period(p)).collect();
        periods.retain(|&q| q > interval);
        periods.sort_unstable();
        periods.dedup();
        if periods.is_empty() {
            // Off (K at most one window), or every precision is written every window anyway:
            // without a level nothing could add deferred index members, so nothing is deferred.
            return Coarse {
                window_precisions: CounterWrite::everywhere(&config.precisions),
                levels: Vec::new(),
                sums: CoarseSums::new(0),
            };
        }
        let levels: Vec<Level> = periods
            .iter()
            .enumerate()
            .map(|(i, &q)| {
                let precisions: Vec<(u64, CounterWrite)> = config
                    .precisions
                    .iter()
                    .map(|&p| {
                        let write = if fine(p) {
                            // A new 1 s slice every second would mean an index ZADD per series
                            // every second; the first level adds it once per its period instead.
                            if i == 0 {
                                CounterWrite::IndexOnly
                            } else {
                                CounterWrite::Skip
                            }
                        } else if period(p) == q {
                            CounterWrite::Write
                        } else {
                            CounterWrite::Skip
                        };
                        (p, write)
                    })
                    .collect();
                // A series written in two groups in a row has, at each of the level's
                // precisions, a hash holding a slice from the group before, which the cleaner
                // keeps for sample_count slices: the hash was never emptied, so the index member
                // added with it is still there and is not sent again. Only where that slice
                // outlives the group by a wide margin, and not at the longest level, whose
                // groups add every member once per its period: after a loss of Redis's data,
                // members come back within that period.
                let kept = |&(p, c): &(u64, CounterWrite)| {
                    c == CounterWrite::Skip || config.sample_count.saturating_mul(p) >= 3 * q
                };
                let longest = i + 1 == periods.len();
                let continuing = (!longest && precisions.iter().all(kept)).then(|| {
                    precisions
                        .iter()
                        .map(|&(p, c)| match c {
                            CounterWrite::IndexOnly => (p, CounterWrite::Skip),
                            CounterWrite::Write => (p, CounterWrite::WriteUnindexed),
                            other => (p, other),
                        })
                        .collect()
                });
                Level {
                    period_secs: q,
                    precisions,
                    continuing,
                    group: None,
                    queued: VecDeque::new(),
                    per_window: 0,
                }
            })
            .collect();
        let window_precisions = config
            .precisions
            .iter()
            .map(|&p| {
                let write = if fine(p) {
                    CounterWrite::WriteUnindexed
                } else {
                    CounterWrite::Skip
                };
                (p, write)
            })
            .collect();
        Coarse {
            window_precisions,
            sums: CoarseSums::new(levels.len()),
            levels,
        }
    }
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
    /// Takes the reloadable keys of each configuration `reloads` brings (SIGHUP).
    pub fn with_reloads(mut self, reloads: tokio::sync::watch::Receiver<Config>) -> Flusher {
        self.closer.reloads = Some(reloads);
        self
    }

    /// `run_id` names this run of the agent (`<agent id>.<random>`): its chunks are numbered
    /// under the sequence key `flush:<run_id>`.
    pub fn new(
        windows: Vec<Arc<Mutex<Window>>>,
        writer: Writer,
        run_id: &str,
        spool: Option<Spool>,
        config: Config,
        telemetry: Arc<Telemetry>,
    ) -> Flusher {
        let keys = writer.keys().clone();
        Flusher {
            shutdown_timeout: Duration::from_secs(config.shutdown_timeout_secs),
            telemetry: telemetry.clone(),
            writer,
            closer: Closer {
                windows,
                ledger: Ledger::new(config.forget_idle_secs),
                sequence: keys.flush_sequence(run_id).into(),
                last_seq: 0,
                last_window: 0,
                slot_seqs: (config.redis_mode == RedisMode::Cluster).then(Default::default),
                settings: ChunkSettings {
                    keys,
                    sample_count: config.sample_count,
                    log_ttl_secs: config.log_idle_secs,
                    max_series: config.max_series_per_chunk,
                    quantiles: QuantileSettings {
                        alpha: config.quantile_relative_accuracy,
                        precisions: config.quantile_precisions.clone(),
                    },
                },
                coarse: Coarse::new(&config),
                last_drop_log: None,
                spool: spool.map(Arc::new),
                reloads: None,
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
            mut writer,
            shutdown_timeout,
            telemetry,
        } = self;
        let backlog = Backlog::default();
        let spool = closer.spool.clone();
        if let Some(spool) = &spool {
            closer.replay(spool, &backlog);
        }
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
                _ = write_backlog(&mut writer, &backlog, &closed, spool.as_deref(), &telemetry) => {}
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
                .flat_map(|w| &w.chunks)
                .map(|c| c.series)
                .sum();
            let kept = if spool.is_some() {
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
    }
}

impl Closer {
    /// Queues the windows earlier runs left in the spool, ahead of this run's, and takes up
    /// the coarse sums where the last run left them.
    fn replay(&mut self, spool: &Spool, backlog: &Backlog) {
        let last_closed = spool.load_state().and_then(|state| {
            let restored = self.restore(&state);
            if restored.is_none() {
                tracing::error!(
                    "spool state file is not one this version wrote; the sums it held are lost"
                );
            }
            restored
        });
        let mut windows = match spool.load() {
            Ok(windows) => windows,
            Err(e) => {
                tracing::error!(error = %e, "cannot read the spool; its windows are not written");
                Vec::new()
            }
        };
        // The last window closed before the crash, if its own file was never written. (If it
        // was written to Redis and removed, Redis answers that its chunks were applied.) It gets
        // a file now: this run's first close replaces the state file that held it.
        // It was its run's last window to close, so it goes after that run's files.
        if let Some((start, sequence, chunks)) = last_closed.filter(|(start, sequence, chunks)| {
            !chunks.is_empty()
                && !windows.iter().any(|f| {
                    f.start == *start
                        && f.sequence == *sequence
                        && f.chunks.first().map(|c| (c.seq, c.slot()))
                            == chunks.first().map(|c| (c.seq, c.slot()))
                })
        }) {
            let chunks: Vec<Arc<FlushChunk>> = chunks.into_iter().map(Arc::new).collect();
            let number = 1 + windows
                .iter()
                .filter(|w| w.sequence == sequence)
                .map(|w| w.number)
                .max()
                .unwrap_or(0);
            let path = spool
                .write(start, number, &sequence, &chunks)
                .inspect_err(|e| {
                    self.telemetry.spool_write_errors.increment(1);
                    tracing::error!(window = start, error = %e, "cannot spool the window");
                })
                .unwrap_or_default();
            windows.push(crate::spool::SpooledWindow {
                start,
                number,
                sequence,
                chunks,
                path,
            });
        }
        if !windows.is_empty() {
            tracing::info!(
                windows = windows.len(),
                "writing the windows an earlier run left in the spool"
            );
        }
        let cluster = self.slot_seqs.is_some();
        for w in windows {
            if Keys::is_slot_sequence(&w.sequence) != cluster {
                tracing::error!(
                    window = w.start,
                    path = %w.path.display(),
                    "this spool file was written for another redis_mode; it is kept aside (*.bad), not replayed"
                );
                let _ = std::fs::rename(&w.path, w.path.with_extension("bad"));
                continue;
            }
            self.telemetry.spool_windows_loaded.increment(1);
            let pending = PendingWindow {
                id: 0,
                start: w.start,
                sequence: w.sequence.into(),
                chunks: w.chunks,
                file: Some(w.path).filter(|p| !p.as_os_str().is_empty()),
            };
            backlog.push(pending, &self.config, Some(spool), &self.telemetry);
        }
    }

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
            self.close(boundary - interval, false, backlog);
        }
        self.close(window_start(unix_now(), interval), true, backlog);
    }

    /// Takes every reader's window for the period starting at `start` and queues it; the `last`
    /// one also takes every coarse sum still held.
    /// Takes the keys of a reloaded configuration that apply without a restart: chunk size
    /// and backlog bounds (the others were logged as waiting for one).
    fn take_reload(&mut self) {
        let Some(reloads) = self.reloads.as_mut() else {
            return;
        };
        if reloads.has_changed().unwrap_or(false) {
            let new = reloads.borrow_and_update();
            self.settings.max_series = new.max_series_per_chunk;
            self.config.max_series_per_chunk = new.max_series_per_chunk;
            self.config.max_backlog_windows = new.max_backlog_windows;
            self.config.max_backlog_bytes = new.max_backlog_bytes;
        }
    }

    fn close(&mut self, start: u64, last: bool, backlog: &Backlog) {
        self.take_reload();
        let mut merged = Window::default();
        for shared in &self.windows {
            let taken = shared.lock().unwrap_or_else(|p| p.into_inner()).take();
            merged.merge(taken);
        }
        self.report_drops(&merged);
        let mut closed = self.ledger.close(start, merged);
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

        // A window that comes later than the next one expected (a late close skipped a
        // boundary) must not join a group of another slice or hour.
        for i in 0..self.coarse.levels.len() {
            let level = &self.coarse.levels[i];
            if level
                .group
                .is_some_and(|group| level.separates(group, start, i == 0))
            {
                self.end_group(i);
            }
        }
        if !self.coarse.levels.is_empty() {
            self.coarse
                .sums
                .add_stats(std::mem::take(&mut closed.stats));
        }
        let mut chunks = self.chunks(&closed, &self.coarse.window_precisions);

        for level in &mut self.coarse.levels {
            level.group.get_or_insert(start);
        }
        self.coarse.sums.add_counters(&closed.counters);
        // Its series are in the chunks and the sums now; at many series its keys are a large
        // share of the memory a group's end needs.
        drop(closed);

        let interval = self.config.flush_interval_secs;
        let next = start + interval;
        for i in 0..self.coarse.levels.len() {
            let level = &self.coarse.levels[i];
            if last || level.separates(start, next, i == 0) {
                self.end_group(i);
            }
            let level = &mut self.coarse.levels[i];
            let attach = if last {
                level.queued.len()
            } else {
                level.per_window.min(level.queued.len())
            };
            chunks.extend(level.queued.drain(..attach));
        }
        let chunks: Vec<Arc<FlushChunk>> = chunks
            .into_iter()
            .map(|mut chunk| {
                let last = match &mut self.slot_seqs {
                    Some(slots) => slots.entry(chunk.slot()).or_default(),
                    None => &mut self.last_seq,
                };
                *last += 1;
                chunk.seq = *last;
                Arc::new(chunk)
            })
            .collect();
        // The coarse sums on disk, with this window's chunks: a crash between the two files
        // still finds the window.
        if let Some(spool) = self
            .spool
            .as_ref()
            .filter(|_| !self.coarse.levels.is_empty())
            && let Err(e) = spool.write_state(self.coarse_state(start, &chunks))
        {
            self.telemetry.spool_write_errors.increment(1);
            tracing::error!(window = start, error = %e, "cannot spool the coarse sums");
        }
        if chunks.is_empty() {
            return;
        }
        // On disk before it is queued: once the writer may have sent a chunk, a crash must
        // find the window in the spool.
        self.last_window += 1;
        let file = self.spool.as_ref().and_then(|spool| {
            spool
                .write(start, self.last_window, &self.sequence, &chunks)
                .inspect_err(|e| {
                    self.telemetry.spool_write_errors.increment(1);
                    tracing::error!(window = start, error = %e, "cannot spool the window; it is kept in memory only");
                })
                .ok()
        });
        let pending = PendingWindow {
            id: 0,
            start,
            sequence: self.sequence.clone(),
            chunks,
            file,
        };
        backlog.push(
            pending,
            &self.config,
            self.spool.as_deref(),
            &self.telemetry,
        );
    }

    /// What a restart needs of `coarse_write_secs` to go on where the close of window `start`
    /// left it: the sums of the open groups, the chunks of ended groups not yet given to a
    /// window, and the window's own chunks. Integers little-endian; [`Closer::restore`] reads it.
    fn coarse_state(&self, start: u64, chunks: &[Arc<FlushChunk>]) -> Vec<u8> {
        let u32_le = |n: usize| (n as u32).to_le_bytes();
        let mut out = Vec::new();
        out.extend_from_slice(&start.to_le_bytes());
        put_bytes(&mut out, self.sequence.as_bytes());
        out.extend_from_slice(&u32_le(chunks.len()));
        for chunk in chunks {
            put_chunk(&mut out, chunk);
        }
        out.extend_from_slice(&u32_le(self.coarse.levels.len()));
        for level in &self.coarse.levels {
            out.extend_from_slice(&level.period_secs.to_le_bytes());
            out.extend_from_slice(&level.group.unwrap_or(u64::MAX).to_le_bytes());
            out.extend_from_slice(&u32_le(level.per_window));
            out.extend_from_slice(&u32_le(level.queued.len()));
            for chunk in &level.queued {
                put_chunk(&mut out, chunk);
            }
        }
        let sums = &self.coarse.sums;
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
            out.extend_from_slice(&u32_le(s.buckets.len()));
            for (bucket, weight) in s.buckets.iter() {
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
        out
    }

    /// Takes up a [`Closer::coarse_state`]: the levels' groups and queued chunks and the sums,
    /// if the levels are those of this configuration; returns the window written with it
    /// (start, sequence key, chunks). `None` if it does not read.
    fn restore(&mut self, state: &[u8]) -> Option<(u64, String, Vec<FlushChunk>)> {
        let mut r = Reader(state);
        let start = r.u64()?;
        let sequence = r.string()?;
        let n = r.u32()? as usize;
        let chunks = (0..n).map(|_| r.chunk()).collect::<Option<Vec<_>>>()?;
        let levels = r.u32()? as usize;
        let mut restored = Vec::with_capacity(levels);
        for _ in 0..levels {
            let period = r.u64()?;
            let group = Some(r.u64()?).filter(|&g| g != u64::MAX);
            let per_window = r.u32()? as usize;
            let n = r.u32()? as usize;
            let queued = (0..n).map(|_| r.chunk()).collect::<Option<VecDeque<_>>>()?;
            restored.push((period, group, per_window, queued));
        }
        let periods: Vec<u64> = self.coarse.levels.iter().map(|l| l.period_secs).collect();
        if restored.iter().map(|l| l.0).ne(periods.iter().copied()) {
            tracing::warn!(
                "coarse_write_secs or the precisions changed since the spool's sums were written; they are dropped"
            );
            return Some((start, sequence, chunks));
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
            stats.push((
                series,
                kind,
                Stats {
                    count,
                    sum,
                    sumsq,
                    min,
                    max,
                    buckets,
                },
            ));
        }
        if !r.0.is_empty() {
            return None;
        }
        sums.add_stats(stats);
        self.coarse.sums = sums;
        for (level, (_, group, per_window, queued)) in self.coarse.levels.iter_mut().zip(restored) {
            level.group = group;
            level.per_window = per_window;
            level.queued = queued;
        }
        Some((start, sequence, chunks))
    }

    /// Counts what the series cap dropped from `window`, and now and then names who filled it.
    fn report_drops(&mut self, window: &Window) {
        if window.dropped.iter().all(|&n| n == 0) {
            return;
        }
        for (counter, n) in self.telemetry.samples_dropped.iter().zip(window.dropped) {
            counter.increment(n);
        }
        self.telemetry
            .logs_dropped
            .increment(window.dropped[DROPPED_LOGS]);
        let now = Instant::now();
        if self
            .last_drop_log
            .is_none_or(|t| now.duration_since(t) >= DROP_LOG_INTERVAL)
        {
            self.last_drop_log = Some(now);
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

    /// Ends level `i`'s open group: its sums become chunks, queued to be spread over the next
    /// period's windows.
    fn end_group(&mut self, i: usize) {
        let level = &mut self.coarse.levels[i];
        let Some(group) = level.group.take() else {
            return;
        };
        // At least one: a level's period is longer than a window.
        let windows = (level.period_secs / self.config.flush_interval_secs) as usize;
        let mut fresh = Vec::new();
        let mut sums = std::mem::replace(&mut self.coarse.sums, CoarseSums::new(0));
        let level = &self.coarse.levels[i];
        // Every index member once per longest period, the first group in it: what a loss of
        // Redis's data took comes back.
        let longest = self.coarse.levels[self.coarse.levels.len() - 1].period_secs;
        let all_new = level.continuing.is_none() || group % longest < level.period_secs;
        // One chunk a part: the sums become chunks without a copy of all of them in between.
        sums.take_parts(
            i,
            group,
            self.config.max_series_per_chunk,
            all_new,
            |part, continuing| {
                let precisions = match &level.continuing {
                    Some(unindexed) if continuing => unindexed,
                    _ => &level.precisions,
                };
                fresh.extend(self.chunks(&part, precisions));
            },
        );
        self.coarse.sums = sums;
        let level = &mut self.coarse.levels[i];
        level.queued.extend(deal(fresh, windows));
        level.per_window = level.queued.len().div_ceil(windows);
    }

    fn chunks(&self, window: &ClosedWindow, precisions: &[(u64, CounterWrite)]) -> Vec<FlushChunk> {
        if self.slot_seqs.is_some() {
            build_slot_chunks(window, precisions, &self.settings)
        } else {
            build_chunks(window, precisions, &self.settings)
        }
    }
}

/// Orders a group's chunks for `windows` windows that take them in turn, as many each: chunk
/// `j` goes to the `j % windows`th. A group's chunks of one kind come together (its timers'
/// stats after its counters) and cost Redis more or less than the others; taken in blocks,
/// they made one window of every period the slowest.
fn deal<T>(chunks: Vec<T>, windows: usize) -> impl Iterator<Item = T> {
    let mut hands: Vec<Vec<T>> = (0..windows).map(|_| Vec::new()).collect();
    for (j, chunk) in chunks.into_iter().enumerate() {
        hands[j % windows].push(chunk);
    }
    hands.into_iter().flatten()
}

/// Writes queued windows oldest first, retrying a failed chunk with backoff, until the queue is
/// empty after `closed`. One server takes a window's chunks a pipeline at a time, in order; a
/// cluster takes all of them at once (in order within a slot), then their follow-ups.
async fn write_backlog(
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
        let next = backlog.lock().front().map(|w| {
            let end = if writer.is_cluster() {
                w.chunks.len()
            } else {
                PIPELINED_CHUNKS.min(w.chunks.len())
            };
            (w.id, w.start, w.sequence.clone(), w.chunks[..end].to_vec())
        });
        let Some((id, start, sequence, chunks)) = next else {
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
            let written = writer.write_slots(&sequence, &chunks, follow_ups).await;
            (written.acknowledged, written.replayed, written.error)
        } else {
            let written = writer.write_chunks(&sequence, &chunks).await;
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
                let mut sent = acknowledged.iter();
                front
                    .chunks
                    .retain(|_| !sent.next().copied().unwrap_or(false));
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{Sample, Value};

    /// A closer over one reader's window, coarse writes every 5 windows.
    fn closer(coarse_write_secs: u64) -> (Closer, Arc<Mutex<Window>>) {
        let config = Config {
            coarse_write_secs,
            max_series_per_chunk: 100,
            ..Config::default()
        };
        let window = Arc::new(Mutex::new(Window::default()));
        let closer = Closer {
            windows: vec![window.clone()],
            ledger: Ledger::default(),
            settings: ChunkSettings {
                keys: Keys::new(""),
                sample_count: config.sample_count,
                log_ttl_secs: 0,
                max_series: config.max_series_per_chunk,
                quantiles: Default::default(),
            },
            sequence: "flush:a".into(),
            last_seq: 0,
            last_window: 0,
            slot_seqs: None,
            coarse: Coarse::new(&config),
            last_drop_log: None,
            spool: None,
            reloads: None,
            config,
            telemetry: Arc::new(Telemetry::new()),
        };
        (closer, window)
    }

    fn record(window: &Mutex<Window>, series: usize) {
        let sample = Sample {
            kind: MetricType::Counter,
            value: Value::Number(1.0),
            rate: 1.0,
            tags: None,
        };
        let mut w = window.lock().unwrap();
        for i in 0..series {
            w.record(&format!("s{i}"), &sample, usize::MAX);
        }
    }

    /// Chunks queued per window for windows 100..100+n with `series` counters each.
    fn chunks_per_window(coarse_write_secs: u64, series: usize, n: u64) -> Vec<usize> {
        chunks_per_window_at(coarse_write_secs, series, 100..100 + n)
    }

    fn chunks_per_window_at(
        coarse_write_secs: u64,
        series: usize,
        starts: impl IntoIterator<Item = u64>,
    ) -> Vec<usize> {
        let (mut closer, window) = closer(coarse_write_secs);
        let backlog = Backlog::default();
        for start in starts {
            record(&window, series);
            closer.close(start, false, &backlog);
        }
        backlog.lock().iter().map(|w| w.chunks.len()).collect()
    }

    #[test]
    fn the_backlog_is_bounded_in_bytes_and_its_spool_follows_it() {
        let (mut closer, window) = closer(0);
        let dir = tempfile::tempdir().unwrap();
        closer.spool = Some(Arc::new(Spool::open(dir.path(), false).unwrap()));
        let backlog = Backlog::default();
        record(&window, 250);
        closer.close(100, false, &backlog);
        let one = backlog.lock()[0].bytes();
        closer.config.max_backlog_bytes = 2 * one + one / 2;
        for start in 101..105 {
            record(&window, 250);
            closer.close(start, false, &backlog);
        }
        let queued: Vec<u64> = backlog.lock().iter().map(|w| w.start).collect();
        assert_eq!(queued, [103, 104]);
        let files = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == "window"))
            .count();
        assert_eq!(files, 2);
        // One window larger than the bound is still kept.
        closer.config.max_backlog_bytes = one / 2;
        record(&window, 250);
        closer.close(105, false, &backlog);
        assert_eq!(backlog.lock().len(), 1);
    }

    #[test]
    fn a_restart_takes_up_the_coarse_sums_and_the_window_only_the_state_held() {
        let dir = tempfile::tempdir().unwrap();
        let spool_files = || {
            let mut names: Vec<String> = std::fs::read_dir(dir.path())
                .unwrap()
                .flatten()
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .filter(|n| n.ends_with(".window"))
                .collect();
            names.sort();
            names
        };
        let (mut first, window) = closer(5);
        first.spool = Some(Arc::new(Spool::open(dir.path(), false).unwrap()));
        let backlog = Backlog::default();
        for start in 100..103 {
            record(&window, 250);
            first.close(start, false, &backlog);
        }
        // The crash came between the state file and window 102's own file.
        let last = spool_files().pop().unwrap();
        std::fs::remove_file(dir.path().join(&last)).unwrap();
        let held: Vec<i64> = first.coarse.sums.held().map(|(_, s, _, _)| s[0]).collect();
        drop(first);

        let (mut again, _) = closer(5);
        let spool = Arc::new(Spool::open(dir.path(), false).unwrap());
        again.spool = Some(spool.clone());
        let replayed = Backlog::default();
        again.replay(&spool, &replayed);
        let starts: Vec<u64> = replayed.lock().iter().map(|w| w.start).collect();
        assert_eq!(starts, [100, 101, 102]);
        assert_eq!(spool_files().len(), 3, "window 102 has a file again");
        let restored: Vec<i64> = again.coarse.sums.held().map(|(_, s, _, _)| s[0]).collect();
        assert_eq!(
            (restored.len(), restored.iter().sum::<i64>()),
            (250, 3 * 250)
        );
        assert_eq!(restored.iter().sum::<i64>(), held.iter().sum::<i64>());
        assert_eq!(again.coarse.levels[0].group, Some(100));
    }

    #[test]
    fn a_group_is_dealt_so_that_each_window_gets_a_share_of_every_kind() {
        // Nine counter chunks, then three costlier stats chunks, over three windows of four.
        let group = (0..12).map(|j| if j < 9 { 'c' } else { 's' }).collect();
        let dealt: Vec<char> = deal(group, 3).collect();
        for take in dealt.chunks(4) {
            assert_eq!(take.iter().filter(|&&k| k == 's').count(), 1, "{dealt:?}");
        }
        assert_eq!(deal(vec![1, 2], 5).collect::<Vec<_>>(), [1, 2]);
    }

    #[test]
    fn a_late_close_does_not_mix_slices_in_a_group() {
        // Window 104 was never closed (a late close skipped its boundary): the 100..103 group
        // must end when 105 comes, not take 105..109 into the 5 s slice of 100.
        assert_eq!(
            chunks_per_window_at(5, 250, [100, 101, 102, 103, 105, 106, 107, 108, 109]),
            [3, 3, 3, 3, 4, 4, 4, 3, 4]
        );
    }

    #[test]
    fn without_a_coarse_precision_nothing_is_deferred() {
        let config = Config {
            precisions: vec![1],
            coarse_write_secs: 5,
            ..Config::default()
        };
        let coarse = Coarse::new(&config);
        assert_eq!(coarse.window_precisions, CounterWrite::everywhere(&[1]));
        assert!(coarse.levels.is_empty());
    }

    #[test]
    fn without_coarse_writes_every_window_is_written_whole() {
        assert_eq!(chunks_per_window(0, 250, 3), [3, 3, 3]);
    }

    #[test]
    fn a_group_is_written_once_and_spread_over_the_next_windows() {
        // Precision 1 every window (3 chunks of 250 series); 5 s to 1 day once per 5 s group
        // (windows 100..104, then 105..109), its 3 chunks spread one per following window.
        assert_eq!(
            chunks_per_window(5, 250, 12),
            [3, 3, 3, 3, 4, 4, 4, 3, 3, 4, 4, 4]
        );
    }

    #[test]
    fn each_precision_is_written_once_per_its_slice_or_per_coarse_write_secs() {
        use CounterWrite::*;
        let config = Config {
            coarse_write_secs: 60,
            ..Config::default()
        };
        let coarse = Coarse::new(&config);
        let precisions = |modes: [CounterWrite; 7]| {
            let mut v = Vec::from(crate::config::DEFAULT_PRECISIONS);
            v.iter_mut()
                .zip(modes)
                .map(|(p, m)| (*p, m))
                .collect::<Vec<_>>()
        };
        assert_eq!(
            coarse.window_precisions,
            precisions([WriteUnindexed, Skip, Skip, Skip, Skip, Skip, Skip])
        );
        let levels: Vec<_> = coarse
            .levels
            .iter()
            .map(|l| (l.period_secs, l.precisions.clone()))
            .collect();
        assert_eq!(
            levels,
            [
                (
                    5,
                    precisions([IndexOnly, Write, Skip, Skip, Skip, Skip, Skip])
                ),
                (
                    60,
                    precisions([Skip, Skip, Write, Write, Write, Write, Write])
                ),
            ]
        );
        // Series of two 5 s groups in a row write without index members; the longest level
        // always adds them.
        assert_eq!(
            coarse.levels[0].continuing,
            Some(precisions([
                Skip,
                WriteUnindexed,
                Skip,
                Skip,
                Skip,
                Skip,
                Skip
            ]))
        );
        assert_eq!(coarse.levels[1].continuing, None);
        // Unless the cleaner may empty a hash between two groups: 4 slices of 1 s < 3 × 5 s.
        let few_slices = Coarse::new(&Config {
            sample_count: 4,
            ..config
        });
        assert_eq!(few_slices.levels[0].continuing, None);
    }

    #[test]
    fn chunks_are_numbered_in_sending_order_across_fine_and_coarse_chunks() {
        let (mut closer, window) = closer(5);
        let backlog = Backlog::default();
        for start in 100..112 {
            record(&window, 250);
            closer.close(start, start == 111, &backlog);
        }
        let queue = backlog.lock();
        let numbers: Vec<u64> = queue
            .iter()
            .flat_map(|w| w.chunks.iter().map(|c| c.seq))
            .collect();
        assert_eq!(numbers, (1..=numbers.len() as u64).collect::<Vec<_>>());
        // The last window takes every coarse chunk still held: the third of the 105..109 group's
        // and the partial group of windows 110 and 111.
        assert_eq!(queue.back().map(|w| w.chunks.len()), Some(3 + 1 + 3));
    }
}
