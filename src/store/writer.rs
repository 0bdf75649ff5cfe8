//! Writing closed windows: [`build_chunks`] turns a window into bounded [`FlushChunk`]s (their
//! writes packed in `flush.lua`'s argument layout), numbered in sending order ([`Numbering`]);
//! [`Writer::write`], the flush side's one entry point, sends them (one server: one transaction
//! a chunk, `standalone.rs`; a cluster: slot chunks, `slots.rs`) over one connection,
//! reconnecting after any failure, and reports what Redis refused.

use std::sync::Arc;

use redis::{RedisWrite, Script, ToRedisArgs};

use super::server::ServerCheck;
use super::slots::{FollowUps, build_slot_chunks};
use super::standalone::{Indexed, Progress};
use super::{Cached, Connection, Keys, Store, StoreError, clock, keys};
use crate::aggregate::{Buckets, ClosedWindow, SeriesName, sketch};
use crate::telemetry::{LogLimit, Telemetry, WriteFailure};

/// The flush scripts, each after what they share.
const FLUSH_SCRIPT: &str = concat!(include_str!("hourly.lua"), include_str!("flush.lua"));
const FLUSH_SLOT_SCRIPT: &str = concat!(include_str!("hourly.lua"), include_str!("flush_slot.lua"));

/// A bounded part of a window: applied atomically, and at most once thanks to its number.
#[derive(Debug, Clone)]
pub struct FlushChunk {
    /// Series (and log entries) it carries.
    pub series: usize,
    /// Its place in the run's sending order, from 1: a chunk is applied only above the run's
    /// last applied number (`standalone.rs`; `flush_slot.lua` in a cluster).
    pub seq: u64,
    /// Its writes in `flush.lua`'s argument layout, fixed when the window closed so every retry
    /// sends the same values.
    argv: Argv,
}

/// A chunk's script arguments, packed: one buffer and where each argument ends. It waits in the
/// backlog (coarse groups for up to a period), so it costs 4 bytes per argument beside the bytes
/// themselves, where a `redis::Cmd` costs 16 and grows by doubling; a `Cmd` is made from it only
/// when the chunk is sent.
#[derive(Debug, Clone, Default)]
pub(super) struct Argv {
    data: Vec<u8>,
    ends: Vec<u32>,
}

impl Argv {
    pub(super) fn arg(&mut self, value: impl ToRedisArgs) -> &mut Argv {
        value.write_redis_args(self);
        self
    }

    /// The number of arguments.
    pub(super) fn len(&self) -> usize {
        self.ends.len()
    }

    /// Appends `other`'s arguments.
    pub(super) fn append(&mut self, other: &Argv) {
        let base = self.data.len() as u32;
        self.data.extend_from_slice(&other.data);
        self.ends.extend(other.ends.iter().map(|e| e + base));
    }

    fn iter(&self) -> impl Iterator<Item = &[u8]> {
        let starts = std::iter::once(0).chain(self.ends.iter().copied());
        starts
            .zip(&self.ends)
            .map(|(start, &end)| &self.data[start as usize..end as usize])
    }

    fn end_arg(&mut self) {
        // A chunk holds at most a few megabytes (bounded series, sets cost per 100 members).
        self.ends
            .push(u32::try_from(self.data.len()).unwrap_or(u32::MAX));
    }
}

impl RedisWrite for Argv {
    fn write_arg(&mut self, arg: &[u8]) {
        self.data.extend_from_slice(arg);
        self.end_arg();
    }

    fn writer_for_next_arg(&mut self) -> impl std::io::Write + '_ {
        /// Ends the argument when the caller is done writing it.
        struct Guard<'a>(&'a mut Argv);
        impl Drop for Guard<'_> {
            fn drop(&mut self) {
                self.0.end_arg();
            }
        }
        impl std::io::Write for Guard<'_> {
            fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
                self.0.data.extend_from_slice(buf);
                Ok(buf.len())
            }

            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        Guard(self)
    }
}

impl FlushChunk {
    /// A chunk of `series` series whose arguments are `argv`, numbered 0 until the flusher
    /// numbers it.
    pub(super) fn packed(series: usize, mut argv: Argv) -> FlushChunk {
        argv.data.shrink_to_fit();
        argv.ends.shrink_to_fit();
        FlushChunk {
            series,
            seq: 0,
            argv,
        }
    }

    /// Its arguments one by one.
    pub(super) fn args(&self) -> impl Iterator<Item = &[u8]> {
        self.argv.iter()
    }

    /// A slot chunk's data keys (after their count).
    pub(super) fn data_keys(&self) -> impl Iterator<Item = &[u8]> {
        self.argv.iter().skip(1).take(self.data_key_count())
    }

    /// A slot chunk's number of data keys: its first argument.
    pub(super) fn data_key_count(&self) -> usize {
        self.argv
            .iter()
            .next()
            .and_then(|n| std::str::from_utf8(n).ok()?.parse().ok())
            .unwrap_or(0)
    }

    /// The hash slot of a slot chunk (cluster mode): its first data key's, after the key count.
    pub fn slot(&self) -> u16 {
        keys::slot_of(self.data_keys().next().unwrap_or_default())
    }

    /// The packed script arguments (bytes, and where each argument ends), for the spool.
    pub fn parts(&self) -> (&[u8], &[u32]) {
        (&self.argv.data, &self.argv.ends)
    }

    /// A chunk from its [`FlushChunk::parts`], as read back from the spool; `None` unless the
    /// ends are in order within `data`.
    pub fn from_parts(
        seq: u64,
        series: usize,
        data: Vec<u8>,
        ends: Vec<u32>,
    ) -> Option<FlushChunk> {
        let ordered = ends.windows(2).all(|w| w[0] <= w[1]);
        let within = ends.last().is_none_or(|&e| e as usize <= data.len());
        (ordered && within).then_some(FlushChunk {
            series,
            seq,
            argv: Argv { data, ends },
        })
    }

    /// Bytes it keeps in memory (and about as many in the spool).
    pub fn bytes(&self) -> usize {
        self.argv.data.len() + 4 * self.argv.ends.len()
    }
}

/// What a chunk may hold: `max_series` series, a set costing one more per this many members...
pub(super) const SET_MEMBERS_PER_SERIES: usize = 100;
/// ... and a statistics item one more per this many bucket writes (its buckets times the
/// quantile precisions; a bucket write costs Redis about a twentieth of a counter series at
/// the seven precisions): a chunk of a minute's buckets (`quantile_write_secs`), or of wide
/// histograms, keeps Redis busy for about as long as any other chunk, a few milliseconds.
pub(super) const BUCKET_WRITES_PER_SERIES: usize = 24;

/// The part of a closed window that one chunk carries, as index ranges into its vectors.
#[derive(Default)]
struct Part {
    counters: (usize, usize),
    stats: (usize, usize),
    gauges: (usize, usize),
    sets: (usize, usize),
    logs: (usize, usize),
}

/// Splits `[0, len)` of each section (`counters` of the window's counters) into chunks of at
/// most `budget` cost, in section order.
fn plan(window: &ClosedWindow, counters: usize, budget: usize, quantiles: usize) -> Vec<Part> {
    let set_cost = |i: usize| 1 + window.sets[i].1.len() / SET_MEMBERS_PER_SERIES;
    let stat_cost =
        |i: usize| 1 + window.stats[i].2.buckets.len() * quantiles / BUCKET_WRITES_PER_SERIES;
    let sections: [(usize, &dyn Fn(usize) -> usize); 5] = [
        (counters, &|_| 1),
        (window.stats.len(), &stat_cost),
        (window.gauges.len(), &|_| 1),
        (window.sets.len(), &set_cost),
        (window.logs.len(), &|_| 1),
    ];
    let mut chunks = Vec::new();
    let mut current = Part::default();
    let mut cost = 0;
    for (section, (len, item_cost)) in sections.iter().enumerate() {
        let mut start = 0;
        for item in 0..*len {
            let c = item_cost(item);
            if cost > 0 && cost + c > budget {
                *current.section(section) = (start, item);
                chunks.push(std::mem::take(&mut current));
                start = item;
                cost = 0;
            }
            cost += c;
        }
        *current.section(section) = (start, *len);
    }
    if cost > 0 {
        chunks.push(current);
    }
    chunks
}

impl Part {
    fn section(&mut self, i: usize) -> &mut (usize, usize) {
        [
            &mut self.counters,
            &mut self.stats,
            &mut self.gauges,
            &mut self.sets,
            &mut self.logs,
        ]
        .into_iter()
        .nth(i)
        .expect("five sections")
    }
}

/// What a chunk does with its counters at one precision. Gauges and sets are written at every
/// precision the chunk lists.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CounterWrite {
    /// Nothing at this precision.
    Skip = 0,
    /// `HINCRBY`, and the index member with a new slice.
    Write = 1,
    /// `HINCRBY` only (`coarse_write_secs`): a later chunk of this agent adds the index member
    /// (the 1 s precision, indexed once per period, not every second), or it is there already
    /// (a series a coarse level wrote in the group before too).
    WriteUnindexed = 2,
    /// The index member only, for counters that earlier chunks wrote unindexed.
    IndexOnly = 3,
}

impl CounterWrite {
    /// Every precision written and indexed: a window written whole.
    pub fn everywhere(precisions: &[u64]) -> Vec<(u64, CounterWrite)> {
        precisions
            .iter()
            .map(|&p| (p, CounterWrite::Write))
            .collect()
    }
}

/// What every chunk of an agent carries beside its window's data.
#[derive(Debug, Clone)]
pub struct ChunkSettings {
    pub keys: Keys,
    pub sample_count: u64,
    /// Idle lifetime of the log keys (`recent:`, `common:`); 0: none.
    pub log_ttl_secs: u64,
    pub max_series: usize,
    pub quantiles: QuantileSettings,
}

#[cfg(test)]
impl ChunkSettings {
    /// Settings of the unit tests: `prefix`, `max_series` a chunk, the other defaults.
    pub(crate) fn for_tests(prefix: &str, max_series: usize) -> ChunkSettings {
        ChunkSettings {
            keys: Keys::new(prefix),
            sample_count: 120,
            log_ttl_secs: 0,
            max_series,
            quantiles: Default::default(),
        }
    }
}

/// How the statistics' quantile buckets are kept (`quantile_relative_accuracy`,
/// `quantile_precisions`).
#[derive(Debug, Clone, PartialEq)]
pub struct QuantileSettings {
    pub alpha: f64,
    pub precisions: Vec<u64>,
}

impl Default for QuantileSettings {
    fn default() -> Self {
        let config = crate::config::Config::default();
        QuantileSettings {
            alpha: config.quantile_relative_accuracy,
            precisions: config.quantile_precisions,
        }
    }
}

/// Makes a closed window's chunks: `flush.lua` chunks, or slot chunks in a cluster.
pub struct Chunker {
    pub settings: ChunkSettings,
    cluster: bool,
    /// Every precision written and indexed: how a window is written whole.
    everywhere: Vec<(u64, CounterWrite)>,
}

impl Chunker {
    pub fn new(keys: Keys, config: &crate::config::Config) -> Chunker {
        Chunker {
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
            cluster: config.redis_mode == crate::config::RedisMode::Cluster,
            everywhere: CounterWrite::everywhere(&config.precisions),
        }
    }

    /// The chunks writing `window` at `precisions` (what each does with the counters).
    pub fn chunks(
        &self,
        window: &ClosedWindow,
        precisions: &[(u64, CounterWrite)],
    ) -> Vec<FlushChunk> {
        if self.cluster {
            build_slot_chunks(window, precisions, &self.settings)
        } else {
            build_chunks(window, precisions, &self.settings)
        }
    }

    /// The chunks writing `window` whole, at every precision.
    pub fn whole(&self, window: &ClosedWindow) -> Vec<FlushChunk> {
        self.chunks(window, &self.everywhere)
    }

    /// How this mode numbers a run's chunks.
    pub fn numbering(&self) -> Numbering {
        Numbering {
            per_slot: self.cluster.then(Default::default),
            last: 0,
        }
    }

    /// Whether chunks spooled under `sequence` can be sent in this mode: a spool written
    /// before a change of `redis_mode` cannot.
    pub fn takes_sequence(&self, sequence: &str) -> bool {
        Keys::is_slot_sequence(sequence) == self.cluster
    }
}

/// Numbers a run's chunks in sending order, from 1: one count for the run on one server, one per
/// hash slot in a cluster (whose sequence keys are one per slot).
#[derive(Debug)]
pub struct Numbering {
    per_slot: Option<std::collections::HashMap<u16, u64>>,
    last: u64,
}

impl Numbering {
    pub fn number(&mut self, chunk: &mut FlushChunk) {
        let last = match &mut self.per_slot {
            Some(slots) => slots.entry(chunk.slot()).or_default(),
            None => &mut self.last,
        };
        *last += 1;
        chunk.seq = *last;
    }
}

/// Splits a closed window into chunks of at most `max_series` series each, each packed in
/// `flush.lua`'s argument layout (documented there), numbered 0 until the flusher numbers them
/// in sending order.
pub fn build_chunks(
    window: &ClosedWindow,
    precisions: &[(u64, CounterWrite)],
    settings: &ChunkSettings,
) -> Vec<FlushChunk> {
    let keys = &settings.keys;
    let hour = clock::hour_start(window.start);
    let asctime = clock::asctime(window.start);
    // Counters that no listed precision takes (all of them coarse) are left out, not sent.
    let counted = precisions.iter().any(|(_, c)| *c != CounterWrite::Skip);
    let all_counters: &[(SeriesName, i64)] = if counted { &window.counters } else { &[] };
    let quantiles = settings.quantiles.precisions.len();
    plan(window, all_counters.len(), settings.max_series, quantiles)
        .into_iter()
        .map(|part| {
            let mut cmd = Argv::default();
            cmd.arg(keys.prefix())
                .arg(settings.sample_count)
                .arg(&hour)
                .arg(&asctime)
                .arg(settings.log_ttl_secs)
                .arg(precisions.len());
            for &(p, counters) in precisions {
                cmd.arg(p)
                    .arg(keys::slice(window.start, p))
                    .arg(counters as u8);
            }
            let quantiles = &settings.quantiles;
            cmd.arg(quantiles.alpha)
                .arg(sketch::MAX_BUCKETS)
                .arg(quantiles.precisions.len());
            for &p in &quantiles.precisions {
                let slice = keys::slice(window.start, p);
                cmd.arg(p).arg(slice).arg(slice + settings.sample_count * p);
            }
            let counters = &all_counters[part.counters.0..part.counters.1];
            cmd.arg(counters.len());
            for (series, n) in counters {
                cmd.arg(&**series).arg(*n);
            }
            let stats = &window.stats[part.stats.0..part.stats.1];
            cmd.arg(stats.len());
            for (series, kind, s) in stats {
                cmd.arg(&**series)
                    .arg(kind.redis_name())
                    .arg(s.count)
                    .arg(s.sum)
                    .arg(s.sumsq)
                    .arg(s.min)
                    .arg(s.max);
                put_buckets(&mut cmd, &s.buckets);
            }
            let gauges = &window.gauges[part.gauges.0..part.gauges.1];
            cmd.arg(gauges.len());
            for (series, value) in gauges {
                cmd.arg(&**series).arg(*value);
            }
            let sets = &window.sets[part.sets.0..part.sets.1];
            cmd.arg(sets.len());
            for (series, members) in sets {
                cmd.arg(&**series).arg(members.len());
                for m in members {
                    cmd.arg(&**m);
                }
            }
            let logs = &window.logs[part.logs.0..part.logs.1];
            cmd.arg(logs.len());
            for log in logs {
                cmd.arg(&log.name)
                    .arg(log.severity.as_str())
                    .arg(&log.message);
            }
            FlushChunk::packed(
                counters.len() + stats.len() + gauges.len() + sets.len() + logs.len(),
                cmd,
            )
        })
        .collect()
}

/// A statistics item's buckets: their count, then field and weight of each.
pub(super) fn put_buckets(cmd: &mut Argv, buckets: &Buckets) {
    cmd.arg(buckets.len());
    for (bucket, weight) in buckets.iter() {
        cmd.arg(bucket.field());
        // Whole counts (no sample rate) as integers: the script stores a new bucket's count
        // as sent, and Redis keeps an integer string as a number.
        if weight.fract() == 0.0 && weight.abs() < 1e15 {
            cmd.arg(weight as i64);
        } else {
            cmd.arg(weight);
        }
    }
}

/// Chunks of one server sent in one call (one round trip each, in order; a `WAIT` after them
/// with `wait_replicas`).
const CHUNKS_PER_CALL: usize = 4;

/// What a window being written carries from one [`Writer::write`] to the next: in a cluster,
/// the writes its acknowledged chunks leave for the hot keys (index members, averages).
#[derive(Debug, Default)]
pub struct InFlight {
    follow_ups: FollowUps,
}

/// What one [`Writer::write`] got done.
#[derive(Debug)]
pub struct Outcome {
    /// Per chunk, in the order given: acknowledged (applied now or before).
    pub acknowledged: Vec<bool>,
    /// Of them, the chunks Redis had applied before (a lost reply, a late copy).
    pub replayed: usize,
    /// Set when a chunk is not acknowledged: it is to be sent again.
    pub error: Option<StoreError>,
}

impl Writer {
    /// How many of a window's `remaining` chunks go in one [`Writer::write`]: a few on one
    /// server, all in a cluster (in order within a slot, slots concurrently).
    pub fn batch(&self, remaining: usize) -> usize {
        if self.is_cluster() {
            remaining
        } else {
            CHUNKS_PER_CALL.min(remaining)
        }
    }

    /// Writes chunks of the run whose sequence key is `sequence`, the first of them following
    /// only acknowledged ones; `sent_before[i]`: chunk `i` may have reached Redis before. The
    /// one entry point of the flush side, whatever the topology.
    pub async fn write(
        &mut self,
        sequence: &str,
        chunks: &[Arc<FlushChunk>],
        sent_before: &[bool],
        in_flight: &mut InFlight,
    ) -> Outcome {
        if self.is_cluster() {
            return self
                .write_slots(sequence, chunks, sent_before, &mut in_flight.follow_ups)
                .await;
        }
        let written = self.write_chunks(sequence, chunks, sent_before).await;
        let mut acknowledged = vec![false; chunks.len()];
        acknowledged[..written.acknowledged].fill(true);
        Outcome {
            acknowledged,
            replayed: written.replayed,
            error: written.error,
        }
    }

    /// Writes what a window's acknowledged chunks left (a cluster's follow-ups), once its
    /// chunks are all acknowledged or the window was dropped: idempotent, sent until done.
    pub async fn finish(&mut self, in_flight: &mut InFlight) -> Result<(), StoreError> {
        if !in_flight.follow_ups.is_empty() {
            self.write_follow_ups(&in_flight.follow_ups).await?;
            in_flight.follow_ups = FollowUps::default();
        }
        Ok(())
    }
}

/// How long a run that writes nothing keeps its field in the guard: a copy of a chunk delayed
/// longer than this (Redis closes idle connections long before: `tcp-keepalive` 300 s) could be
/// applied again, and so could the last chunks of a spool replayed this long after its crash.
pub const GUARD_IDLE_SECS: u64 = 7 * 24 * 3600;

/// Sends flush chunks to Redis.
pub struct Writer {
    store: Store,
    connection: Cached,
    connected_before: bool,
    /// `wait_replicas` and `wait_timeout_ms`: chunks count as acknowledged only once `WAIT`
    /// reports this many replicas.
    pub(super) wait: Option<(u32, u64)>,
    pub(super) script: Script,
    /// The index members this writer has added (one server): counters', gauges'.
    pub(super) indexed: [Indexed; 2],
    /// Cluster mode's per-slot script, and a hash tag for each slot (made on first use).
    pub(super) slot_script: Script,
    slot_tags: Option<Arc<Vec<String>>>,
    pub(super) telemetry: Arc<Telemetry>,
    /// Refused writes and chunks dropped for a lost guard: counted always, logged once per
    /// 10 s.
    failure_log: LogLimit,
    guard_log: LogLimit,
    /// Writes Redis refused since [`Writer::take_refused`], and the first of them.
    refused: (u64, Option<String>),
    /// The server's eviction policy and clock, checked on every new connection.
    pub(super) server: ServerCheck,
}

/// The reason of a Redis error text.
fn write_failure(error: &str) -> WriteFailure {
    if error.starts_with("WRONGTYPE") {
        WriteFailure::WrongType
    } else if error.contains("overflow") {
        WriteFailure::Overflow
    } else if error.contains("not an integer") {
        WriteFailure::NotInteger
    } else if error.contains("not a number") || error.contains("NaN") {
        WriteFailure::NotANumber
    } else {
        WriteFailure::Other
    }
}

/// What one call of [`Writer::write_chunks`] got done: the chunks acknowledged, in order, and
/// why the rest were not.
#[derive(Debug)]
pub struct Written {
    /// How many of the chunks, from the first, Redis has (and, with `wait_replicas`, enough
    /// replicas): applied now or before.
    pub acknowledged: usize,
    /// Of the chunks Redis answered, those it had applied before (a lost reply, a late copy).
    pub replayed: usize,
    /// Set when fewer chunks than were sent are acknowledged: they are to be sent again.
    pub error: Option<StoreError>,
}

impl Writer {
    /// `wait`: replicas and timeout (ms) for `WAIT` after each call; `None` when the master's
    /// reply is enough.
    pub fn new(store: Store, wait: Option<(u32, u64)>, telemetry: Arc<Telemetry>) -> Writer {
        Writer {
            store,
            connection: Cached::default(),
            connected_before: false,
            wait,
            script: Script::new(FLUSH_SCRIPT),
            indexed: Default::default(),
            slot_script: Script::new(FLUSH_SLOT_SCRIPT),
            slot_tags: None,
            telemetry,
            failure_log: LogLimit::default(),
            guard_log: LogLimit::default(),
            refused: (0, None),
            server: ServerCheck::default(),
        }
    }

    /// Key names as the store's mode writes them.
    pub fn keys(&self) -> &Keys {
        self.store.keys()
    }

    /// Whether windows go out as slot chunks ([`Writer::write_slots`]).
    pub fn is_cluster(&self) -> bool {
        self.store.is_cluster()
    }

    pub(super) fn slot_tags(&mut self) -> Arc<Vec<String>> {
        self.slot_tags
            .get_or_insert_with(|| Arc::new(keys::slot_tags()))
            .clone()
    }

    /// Checks that Redis answers, over the writer's own connection (made if need be).
    pub async fn ping(&mut self) -> Result<(), StoreError> {
        let mut conn = self.connection().await?;
        let result = redis::cmd("PING").query_async::<()>(&mut conn).await;
        if result.is_err() {
            self.connection_failed();
        }
        Ok(result?)
    }

    /// Drops the connection after a failure, so the next call connects afresh.
    pub(super) fn connection_failed(&mut self) {
        self.connection.forget();
        self.telemetry.redis_errors.increment(1);
    }

    /// The writer's connection, made if need be; its server's eviction policy and clock are
    /// checked when it is new, and once a minute.
    pub(super) async fn connection(&mut self) -> Result<Connection, StoreError> {
        let (connection, new) = self.connection.get(&self.store).await?;
        if new {
            if self.connected_before {
                self.telemetry.redis_reconnects.increment(1);
            }
            self.connected_before = true;
            // A new connection may be to a server that lost data (a restart, a failover).
            self.indexed.iter_mut().for_each(Indexed::clear);
            self.server.check_again();
        }
        if self.server.due() {
            let checked = self.server.check(connection.clone(), &self.telemetry).await;
            if let Err(e) = checked {
                self.connection_failed();
                return Err(e);
            }
        }
        Ok(connection)
    }

    /// Whether a chunk sent before without an answer is in doubt (dropped, not applied, if its
    /// guard is gone): only where Redis may have evicted its guard.
    pub(super) fn in_doubt(&self, sent_before: bool) -> bool {
        sent_before && self.server.evicts_guard()
    }

    /// Counts (and now and then logs) a chunk that found its guard gone although it may have
    /// been applied: not applied again.
    pub(super) fn guard_lost(&mut self, sequence: &str) {
        self.telemetry.chunks_guard_lost.increment(1);
        if let Some(times) = self.guard_log.occurred() {
            tracing::error!(
                sequence,
                times,
                "a chunk sent again after a lost reply found its guard evicted: Redis may have applied it, so it is dropped, not applied twice (its writes may be lost; chunks_guard_lost_total). Set maxmemory-policy noeviction"
            );
        }
    }

    /// Applies chunks of the run whose sequence key is `sequence` on one server, in order, one
    /// round trip each (`standalone.rs`); every chunk before the first was acknowledged. The
    /// chunks after the first one not acknowledged are not sent, so sending them all again
    /// from there is safe, and so is any copy of one still on its way. Any error drops the
    /// connection, so the next call starts afresh.
    ///
    /// `sent_before[i]`: chunk `i` was sent before without an answer (or comes from a spool),
    /// so Redis may have applied it.
    pub async fn write_chunks(
        &mut self,
        sequence: &str,
        chunks: &[Arc<FlushChunk>],
        sent_before: &[bool],
    ) -> Written {
        let result = self.try_write(sequence, chunks, sent_before).await;
        let written = match result {
            Ok(written) => written,
            Err(error) => Written {
                acknowledged: 0,
                replayed: 0,
                error: Some(error),
            },
        };
        if written.error.is_some() {
            self.connection_failed();
        }
        written
    }

    async fn try_write(
        &mut self,
        sequence: &str,
        chunks: &[Arc<FlushChunk>],
        sent_before: &[bool],
    ) -> Result<Written, StoreError> {
        let mut conn = self.connection().await?;
        let mut done = Progress::default();
        let result = self
            .write_one_server(&mut conn, sequence, chunks, sent_before, &mut done)
            .await;
        let Progress {
            mut acknowledged,
            replayed,
        } = done;
        let mut error = result.err();
        if error.is_some() && self.wait.is_some() {
            // No WAIT on a connection that failed: the chunks applied are sent again, answered
            // "applied before" and waited for then.
            acknowledged = 0;
        }
        if let Some((replicas, timeout_ms)) = self.wait
            && acknowledged > 0
        {
            // Every write of this connection so far, those of an earlier call included: a chunk
            // re-sent after a short WAIT answers "applied before" and is waited for again (its
            // transaction makes a write for that, so a new connection waits for it too).
            let got: u32 = redis::cmd("WAIT")
                .arg(replicas)
                .arg(timeout_ms)
                .query_async(&mut conn)
                .await?;
            if got < replicas {
                self.telemetry.replica_waits_short.increment(1);
                acknowledged = 0;
                error = Some(short_wait(got, replicas, timeout_ms));
            }
        }
        Ok(Written {
            acknowledged,
            replayed,
            error,
        })
    }

    /// The writes Redis refused (and skipped) since the last call, and the first of them.
    pub fn take_refused(&mut self) -> (u64, Option<String>) {
        std::mem::take(&mut self.refused)
    }

    /// Counts (and now and then logs) the writes Redis refused: `key, error` pairs.
    pub(super) fn report_failures(&mut self, pairs: &[redis::Value]) {
        for pair in pairs.chunks(2) {
            let text =
                |v: &redis::Value| redis::from_redis_value_ref::<String>(v).unwrap_or_default();
            let (key, error) = (text(&pair[0]), pair.get(1).map(text).unwrap_or_default());
            self.refused(&key, &error);
        }
    }

    /// Counts (and now and then logs) one write Redis refused and the writer skipped.
    pub(super) fn refused(&mut self, key: &str, error: &str) {
        self.refused.0 += 1;
        self.refused
            .1
            .get_or_insert_with(|| format!("{key}: {error}"));
        let reason = write_failure(error);
        self.telemetry.write_failures[reason as usize].increment(1);
        if let Some(times) = self.failure_log.occurred() {
            tracing::warn!(
                key,
                error,
                reason = reason.as_str(),
                times,
                "Redis refused a write and it was skipped (more are counted in write_failures_total)"
            );
        }
    }
}

/// The error of a `WAIT` that saw fewer replicas than asked.
pub(super) fn short_wait(got: u32, replicas: u32, timeout_ms: u64) -> StoreError {
    StoreError::Redis(redis::RedisError::from((
        redis::ErrorKind::Client,
        "fewer replicas than wait_replicas acknowledged the writes",
        format!("{got} of {replicas} within {timeout_ms} ms"),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::{LogEntry, Severity};

    fn window(counters: usize, sets: &[usize], logs: usize) -> ClosedWindow {
        ClosedWindow {
            start: 100,
            counters: (0..counters).map(|i| (format!("c{i}").into(), 1)).collect(),
            sets: sets
                .iter()
                .enumerate()
                .map(|(i, m)| {
                    (
                        format!("s{i}").into(),
                        (0..*m).map(|j| j.to_string().into_bytes().into()).collect(),
                    )
                })
                .collect(),
            logs: (0..logs)
                .map(|_| LogEntry {
                    name: "n".into(),
                    severity: Severity::Info,
                    message: "m".into(),
                })
                .collect(),
            ..ClosedWindow::default()
        }
    }

    fn chunk_sizes(w: &ClosedWindow, budget: usize) -> Vec<usize> {
        build_chunks(
            w,
            &CounterWrite::everywhere(&[1, 60]),
            &ChunkSettings::for_tests("", budget),
        )
        .iter()
        .map(|c| c.series)
        .collect()
    }

    #[test]
    fn refusals_are_named_by_reason() {
        for (error, reason) in [
            (
                "WRONGTYPE Operation against a key holding the wrong kind of value",
                WriteFailure::WrongType,
            ),
            (
                "ERR increment or decrement would overflow",
                WriteFailure::Overflow,
            ),
            ("ERR hash value is not an integer", WriteFailure::NotInteger),
            (
                "ERR statistics would not be a number (NaN)",
                WriteFailure::NotANumber,
            ),
            ("ERR something else", WriteFailure::Other),
        ] {
            assert_eq!(write_failure(error), reason, "{error}");
        }
    }

    #[test]
    fn packed_arguments_are_those_a_command_would_send() {
        let member: &[u8] = b"\x00\xffm";
        let mut argv = Argv::default();
        argv.arg(3600u64)
            .arg("")
            .arg(-7i64)
            .arg(0.1f64)
            .arg(f64::MAX)
            .arg(member);
        let mut cmd = redis::Cmd::new();
        cmd.arg(3600u64)
            .arg("")
            .arg(-7i64)
            .arg(0.1f64)
            .arg(f64::MAX)
            .arg(member);
        let expected: Vec<&[u8]> = cmd
            .args_iter()
            .filter_map(|a| match a {
                redis::Arg::Simple(bytes) => Some(bytes),
                _ => None,
            })
            .collect();
        assert_eq!(expected.len(), 6);
        assert_eq!(argv.iter().collect::<Vec<_>>(), expected);
    }

    #[test]
    fn chunks_respect_the_budget_across_sections() {
        assert_eq!(chunk_sizes(&window(5, &[], 0), 2), [2, 2, 1]);
        assert_eq!(chunk_sizes(&window(3, &[1], 2), 2), [2, 2, 2]);
        assert_eq!(chunk_sizes(&window(0, &[], 0), 2), Vec::<usize>::new());
    }

    #[test]
    fn counters_no_precision_takes_are_left_out() {
        let w = window(5, &[1], 0);
        let skip = [(1, CounterWrite::Skip), (60, CounterWrite::Skip)];
        let chunks = build_chunks(&w, &skip, &ChunkSettings::for_tests("", 100));
        assert_eq!(chunks.iter().map(|c| c.series).collect::<Vec<_>>(), [1]);
    }

    #[test]
    fn big_sets_cost_more() {
        // 250 members cost 3; a chunk still takes at least one item.
        assert_eq!(chunk_sizes(&window(1, &[250, 1], 0), 3), [1, 1, 1]);
    }

    #[test]
    fn wide_histograms_cost_more() {
        use crate::aggregate::{Bucket, StatKind, Stats};
        let wide = |buckets: i32| {
            let mut s = Stats::new();
            for i in 0..buckets {
                s.buckets.add(Bucket::Positive(i), 1.0);
            }
            s
        };
        let mut w = window(0, &[], 0);
        // Two quantile precisions by default: 2048 buckets are 4096 writes, costing 171.
        w.stats = [2048, 10, 2048, 10]
            .iter()
            .enumerate()
            .map(|(i, &b)| (format!("h{i}").into(), StatKind::Histogram, wide(b)))
            .collect();
        assert_eq!(chunk_sizes(&w, 172), [2, 2]);
        assert_eq!(chunk_sizes(&w, 400), [4]);
        assert_eq!(chunk_sizes(&w, 171), [1, 1, 1, 1]);
    }

    #[test]
    fn every_item_lands_in_exactly_one_chunk() {
        let w = window(7, &[1, 500, 2], 4);
        let chunks = build_chunks(
            &w,
            &CounterWrite::everywhere(&[1]),
            &ChunkSettings::for_tests("", 4),
        );
        assert_eq!(chunks.iter().map(|c| c.series).sum::<usize>(), 7 + 3 + 4);
    }
}
