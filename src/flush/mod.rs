//! The once-a-window loop (docs/layout.md, "Writes: atomic, exactly once, through outages"), as two halves that share the backlog queue:
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

mod backlog;
mod coarse;
mod codec;
mod groups;
mod points;
mod quantiles;
mod replay;
mod report;
mod stamped;
mod state;
#[cfg(test)]
mod tests;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::aggregate::{Ledger, Window};
use crate::config::Config;
use crate::prometheus::AppSeries;
use crate::spool::Spool;
use crate::store::clock::Clock;
use crate::store::{Chunker, FlushChunk, Numbering, Writer};
use crate::telemetry::{LogLimit, Telemetry};
use backlog::{Backlog, PendingWindow, Spooled, publish, write_backlog};
use coarse::Coarse;
use quantiles::QuantileGroups;

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
    chunker: Chunker,
    /// This run's sequence key, how its chunks are numbered, and the number of the last window
    /// spooled (its file's place in the replay order).
    sequence: Arc<str>,
    numbering: Numbering,
    last_window: u64,
    config: Config,
    /// Where the boundaries are: the system's clock, or a test's.
    clock: Clock,
    /// When the agent opened its first window: before its readers started, so that nothing
    /// they take before the closer first runs lands in a window closed a boundary late.
    opened: Duration,
    telemetry: Arc<Telemetry>,
    /// `coarse_write_secs`, when it defers anything.
    coarse: Option<Coarse>,
    /// `quantile_write_secs`, when it defers the buckets.
    quantiles: Option<QuantileGroups>,
    /// How carbon's paths aggregate (`storage_aggregation`), read again at a SIGHUP.
    aggregations: crate::storage_conf::Aggregations,
    /// Samples dropped by the series cap: logged at most every 10 s.
    drop_log: LogLimit,
    /// Timestamped samples dropped (too old, too far ahead): logged at most every 10 s.
    stamp_log: LogLimit,
    /// Spool writes that failed (a full disk fails every one), windows' and the state file's
    /// apart so that neither hides the other: each logged at most every 10 s.
    window_spool_log: LogLimit,
    state_spool_log: LogLimit,
    spool: Option<Arc<Spool>>,
    /// Configurations a SIGHUP read: the keys that apply to a running flusher are taken at
    /// the next close ([`Closer::take_reload`]).
    reloads: Option<tokio::sync::watch::Receiver<Config>>,
    /// With `prometheus_app_metrics`: the page's series, fed from each merged window.
    app_series: Option<Arc<AppSeries>>,
}

/// Start of the window holding `now`.
fn window_start(now: Duration, interval: u64) -> u64 {
    now.as_secs() / interval * interval
}

/// How many windows the closer closes one after another when it finds itself behind (a
/// stalled process, a clock moved on); further behind, it goes on from the window holding now.
const CATCH_UP_WINDOWS: u64 = 60;

/// The boundary to wait for after the one at `closed`: the next, unless the clock went back by
/// more than a window, or on by more than `min(CATCH_UP_WINDOWS, room)` windows (`room`: the
/// windows the backlog can still take, so that catching up never pushes out the window that
/// holds what was read meanwhile); then the one after `now`.
fn next_boundary(closed: u64, now: Duration, interval: u64, room: u64) -> u64 {
    let next = closed + interval;
    let current = window_start(now, interval);
    let catch_up = CATCH_UP_WINDOWS.min(room);
    if current + interval < closed || current >= next + catch_up * interval {
        current + interval
    } else {
        next
    }
}

impl Flusher {
    /// Feeds `app_series` (`prometheus_app_metrics`) from each merged window.
    pub fn with_app_series(mut self, app_series: Option<Arc<AppSeries>>) -> Flusher {
        self.closer.app_series = app_series;
        self
    }

    /// Takes the reloadable keys of each configuration `reloads` brings (SIGHUP).
    pub fn with_reloads(mut self, reloads: tokio::sync::watch::Receiver<Config>) -> Flusher {
        self.closer.reloads = Some(reloads);
        self
    }

    /// `run_id` names this run of the agent (`<agent id>.<random>`): its chunks are numbered
    /// under the sequence key `flush:<run_id>`. Windows close at `clock`'s boundaries, the first
    /// after `opened` (when the readers began to fill them); the writer takes the same clock.
    pub fn new(
        windows: Vec<Arc<Mutex<Window>>>,
        writer: Writer,
        run_id: &str,
        spool: Option<Spool>,
        config: Config,
        (clock, opened): (Clock, Duration),
        telemetry: Arc<Telemetry>,
    ) -> Flusher {
        let writer = writer.with_clock(clock.clone());
        let keys = writer.keys().clone();
        let chunker = Chunker::new(keys.clone(), &config);
        Flusher {
            shutdown_timeout: Duration::from_secs(config.shutdown_timeout_secs),
            telemetry: telemetry.clone(),
            writer,
            closer: Closer {
                windows,
                ledger: Ledger::new(config.forget_idle_secs)
                    .with_stamps(config.flush_interval_secs, config.timestamp_age_limit()),
                sequence: keys.flush_sequence(run_id).into(),
                last_window: 0,
                numbering: chunker.numbering(),
                chunker,
                coarse: Coarse::new(&config),
                quantiles: QuantileGroups::new(&config),
                // Read when the configuration was (`agent::check`): a file gone since is
                // logged, and every path takes whisper's defaults until a SIGHUP reads one.
                aggregations: crate::storage_conf::Aggregations::load(&config.storage_aggregation)
                    .unwrap_or_else(|e| {
                        tracing::error!(error = %e, "storage_aggregation does not read; whisper's defaults apply");
                        Default::default()
                    }),
                drop_log: LogLimit::default(),
                stamp_log: LogLimit::default(),
                window_spool_log: LogLimit::default(),
                state_spool_log: LogLimit::default(),
                spool: spool.map(Arc::new),
                reloads: None,
                app_series: None,
                config,
                clock,
                opened,
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

        backlog.report_final(shutdown_timeout);
    }
}

impl Closer {
    /// Closes a window at every boundary until `stop`, then the partial window. A boundary
    /// passed while the closer was held up is closed late rather than skipped (within
    /// [`next_boundary`]'s bounds): the windows after the first are then empty but for the shares
    /// dealt to them of ended groups (`coarse_write_secs`, `quantile_write_secs`), which so go
    /// out on their schedule.
    async fn run(&mut self, backlog: &Backlog, stop: &CancellationToken) {
        let interval = self.config.flush_interval_secs;
        let mut boundary = window_start(self.opened, interval) + interval;
        loop {
            tokio::select! {
                biased;
                _ = stop.cancelled() => break,
                _ = self.clock.sleep_until(Duration::from_secs(boundary)) => {}
            }
            self.close(boundary - interval, false, backlog);
            let room = (self.config.max_backlog_windows as u64)
                .saturating_sub(backlog.lock().len() as u64);
            boundary = next_boundary(boundary, self.clock.now(), interval, room);
        }
        self.close(window_start(self.clock.now(), interval), true, backlog);
    }

    /// Takes the keys of a reloaded configuration that apply without a restart: chunk size,
    /// backlog bounds, storage_schemas and storage_aggregation (the others were logged as
    /// waiting for one). Returns the chunks of what `coarse_write_secs` held back when the
    /// schemas' precisions changed: summed for the running precisions, written at them.
    fn take_reload(&mut self) -> Vec<FlushChunk> {
        let Some(reloads) = self.reloads.as_mut() else {
            return Vec::new();
        };
        if !reloads.has_changed().unwrap_or(false) {
            return Vec::new();
        }
        let new = reloads.borrow_and_update().clone();
        self.chunker.settings.max_series = new.max_series_per_chunk;
        self.config.max_series_per_chunk = new.max_series_per_chunk;
        self.config.max_backlog_windows = new.max_backlog_windows;
        self.config.max_backlog_bytes = new.max_backlog_bytes;
        match crate::storage_conf::Aggregations::load(&new.storage_aggregation) {
            Ok(a) => self.aggregations = a,
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: storage_aggregation does not read; the running one is kept")
            }
        }
        // storage_schemas (put in force by the binary, shared with `self.config`): each carbon
        // path's archives, and the union's expiries.
        if new.schemas.is_none() {
            return Vec::new();
        }
        let retention = new.retention();
        let precisions = retention.precisions();
        if precisions == self.chunker.settings.retention.precisions() {
            self.chunker.settings.schemas = new.schemas();
            self.chunker.settings.retention = retention;
            return Vec::new();
        }
        // Another set of precisions: the sums held back go out at the running ones now, and
        // the windows from this one on are written, and summed, at the new ones (as a restart
        // would, without one).
        let held = (self.coarse.as_mut()).map_or_else(Vec::new, |c| c.drain(&self.chunker));
        self.chunker = Chunker::new(self.chunker.settings.keys.clone(), &self.config);
        self.coarse = Coarse::new(&self.config);
        tracing::info!(
            ?precisions,
            "storage_schemas: the precisions written from this window on"
        );
        held
    }

    /// Takes every reader's window for the period starting at `start`, closes it, and queues
    /// its chunks (on disk first, with a spool); the `last` one also takes every coarse sum
    /// still held.
    fn close(&mut self, start: u64, last: bool, backlog: &Backlog) {
        let held = self.take_reload();
        let mut merged = Window::default();
        for shared in &self.windows {
            let next = start + self.config.flush_interval_secs;
            let next = next..next + self.config.flush_interval_secs;
            let taken = shared
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .take_for(next);
            merged.merge(taken);
        }
        self.report_drops(&merged);
        if let Some(app) = &self.app_series {
            let refused = app.absorb(start, &merged);
            for (counter, n) in self.telemetry.app_series_refused.iter().zip(refused) {
                counter.increment(n);
            }
        }
        let ignored = merged.stamps_ignored;
        let points = self.place_points(start, &mut merged);
        let mut closed = self.ledger.close(start, merged);
        closed.points = points;
        self.report_stamps(closed.stamps, ignored);
        // Earlier seconds first, as they came before the window's own values.
        let earlier = self.stamped_chunks(start, std::mem::take(&mut closed.stamped));
        self.report_active(&closed);
        let grouped = match &mut self.quantiles {
            None => Vec::new(),
            Some(q) => q.close(&mut closed, last, &self.chunker),
        };
        let mut chunks = held;
        chunks.extend(earlier);
        chunks.extend(match &mut self.coarse {
            None => self.chunker.whole(&closed),
            Some(coarse) => coarse.close(closed, last, &self.chunker),
        });
        chunks.extend(grouped);
        let chunks = self.number(chunks);
        // Windows the spool could not take before go first, at every close.
        let spool = self.spool.clone();
        if let Some(spool) = &spool {
            self.respool(spool, backlog);
        }
        self.spool_held(start, &chunks);
        if chunks.is_empty() {
            return;
        }
        // On disk before it is queued: once the writer may have sent a chunk, a crash must
        // find the window in the spool.
        self.last_window += 1;
        let spooled = match spool {
            None => Spooled::NoSpool,
            Some(spool) => {
                let written = spool.write(start, self.last_window, &self.sequence, &chunks);
                if let Err(e) = &written {
                    self.window_not_spooled(start, e);
                }
                Spooled::from_write(written, self.last_window, &chunks)
            }
        };
        let pending = PendingWindow {
            id: 0,
            start,
            sequence: self.sequence.clone(),
            sent: vec![false; chunks.len()],
            chunks,
            spooled,
        };
        backlog.push(
            pending,
            &self.config,
            self.spool.as_deref(),
            &self.telemetry,
        );
    }

    /// Counts and logs a window the spool could not take.
    fn window_not_spooled(&mut self, start: u64, error: &std::io::Error) {
        self.telemetry.spool_window_errors.increment(1);
        if let Some(times) = self.window_spool_log.occurred() {
            tracing::error!(window = start, error = %error, times, "cannot spool the window; it is kept in memory only, and a crash before it is written loses it (backlog_unspooled_windows counts those; times: windows not spooled since the last such line)");
        }
    }

    /// Writes to the spool, oldest first, the queued windows it could not take before, until
    /// one fails again: a crash then loses none of those it took. Each keeps its number, so a
    /// replay still sends its run's windows in the order their chunks were numbered.
    fn respool(&self, spool: &Spool, backlog: &Backlog) {
        let unspooled: Vec<_> = backlog
            .lock()
            .iter()
            .filter_map(|w| match &w.spooled {
                Spooled::Unspooled { number, chunks } => {
                    Some((w.id, w.start, *number, w.sequence.clone(), chunks.clone()))
                }
                _ => None,
            })
            .collect();
        let mut taken = 0;
        for (id, start, number, sequence, chunks) in unspooled {
            // Still no room: counted and logged when the window closed; the gauge says it.
            let Ok(path) = spool.write(start, number, &sequence, &chunks) else {
                break;
            };
            let mut queue = backlog.lock();
            match queue.iter_mut().find(|w| w.id == id) {
                Some(window) => window.spooled = Spooled::File(path),
                // Written (or dropped) meanwhile: its file is not needed.
                None => spool.remove(&path),
            }
            taken += 1;
        }
        if taken > 0 {
            publish(&backlog.lock(), &self.telemetry);
            tracing::info!(
                windows = taken,
                "the spool took windows it could not take before; a crash no longer loses them"
            );
        }
    }

    /// Numbers chunks in sending order.
    fn number(&mut self, chunks: Vec<FlushChunk>) -> Vec<Arc<FlushChunk>> {
        chunks
            .into_iter()
            .map(|mut chunk| {
                self.numbering.number(&mut chunk);
                Arc::new(chunk)
            })
            .collect()
    }
}
