//! Writing closed windows: [`build_chunks`] turns a window into bounded [`FlushChunk`]s (their
//! writes packed in `flush.lua`'s argument layout), numbered in sending order ([`Numbering`]);
//! [`Writer::write`], the flush side's one entry point, sends them (one server: one transaction
//! a chunk, `standalone.rs`; a cluster: slot chunks, `cluster.rs`) over one connection,
//! reconnecting after any failure, and reports what Redis refused.

use std::sync::Arc;

use redis::Script;

mod chunk;
mod cluster;
mod points;
mod split;
mod standalone;

pub(super) use chunk::unexpected;
pub use chunk::{ChunkSettings, CounterWrite, FlushChunk, QuantileSettings, build_chunks};
pub(crate) use cluster::read_averages;
pub(super) use cluster::server_error_text;
pub use cluster::{FollowUps, build_slot_chunks};
pub(super) use standalone::server_error;

use super::clock::Clock;
use super::server::ServerCheck;
use super::{Cached, Connection, Keys, Store, StoreError};
use crate::aggregate::ClosedWindow;
use crate::telemetry::{LogLimit, Telemetry, WriteFailure};
use standalone::{Indexed, Pending};

/// The flush scripts, each after what they share.
const FLUSH_SCRIPT: &str = concat!(
    include_str!("../retention.lua"),
    include_str!("../hourly.lua"),
    include_str!("../numbers.lua"),
    include_str!("../points.lua"),
    include_str!("../flush.lua")
);
const FLUSH_SLOT_SCRIPT: &str = concat!(
    include_str!("../hourly.lua"),
    include_str!("../flush_slot.lua")
);

/// Makes a closed window's chunks: `flush.lua` chunks, or slot chunks in a cluster.
pub struct Chunker {
    pub settings: ChunkSettings,
    /// The Graphite names `storage_schemas` matches a series by.
    namer: crate::storage_conf::Namer,
    cluster: bool,
    /// Every precision written and indexed: how a window is written whole.
    everywhere: Vec<(u64, CounterWrite)>,
}

impl Chunker {
    pub fn new(keys: Keys, config: &crate::config::Config) -> Chunker {
        Chunker {
            settings: ChunkSettings {
                keys,
                retention: config.retention(),
                schemas: config.schemas(),
                log_ttl_secs: config.log_idle_secs,
                max_series: config.max_series_per_chunk,
                quantiles: QuantileSettings {
                    alpha: config.quantile_relative_accuracy,
                    precisions: config.quantile_precisions.clone(),
                },
            },
            namer: crate::storage_conf::Namer::new(config),
            cluster: config.redis_mode == crate::config::RedisMode::Cluster,
            everywhere: CounterWrite::everywhere(&config.counter_precisions()),
        }
    }

    /// The chunks writing `window` at `precisions` (what each does with the counters); under
    /// `storage_schemas`, each series only at those its names' schemas keep.
    pub fn chunks(
        &self,
        window: &ClosedWindow,
        precisions: &[(u64, CounterWrite)],
    ) -> Vec<FlushChunk> {
        let schemas = &self.settings.schemas;
        match split::by_precisions(window, precisions, schemas, &self.namer) {
            None => self.build(chunk::Parts::of(window), precisions),
            Some(groups) => (groups.iter().enumerate())
                .flat_map(|(i, g)| self.build(g.parts(window, i == 0), &g.precisions))
                .collect(),
        }
    }

    fn build(
        &self,
        parts: chunk::Parts<'_>,
        precisions: &[(u64, CounterWrite)],
    ) -> Vec<FlushChunk> {
        if self.cluster {
            cluster::build_slot_parts(parts, precisions, &self.settings)
        } else {
            chunk::build_parts(parts, precisions, &self.settings)
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
        if chunks.is_empty() {
            // All acknowledged: what they left (a cluster's follow-ups) goes with `finish`.
            return Outcome {
                acknowledged: Vec::new(),
                replayed: 0,
                error: None,
            };
        }
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
    wait: Option<(u32, u64)>,
    script: Script,
    /// The index members this writer has added (one server): counters', gauges'.
    indexed: [Indexed; 2],
    /// The carbon rollups this writer has left pending (one server) since the last claim.
    pending: Pending,
    /// Cluster mode's per-slot script.
    slot_script: Script,
    telemetry: Arc<Telemetry>,
    /// Refused writes and chunks dropped for a lost guard: counted always, logged once per
    /// 10 s.
    failure_log: LogLimit,
    guard_log: LogLimit,
    /// Writes Redis refused since [`Writer::take_refused`], and the first of them.
    refused: (u64, Option<String>),
    /// The server's eviction policy and clock, checked on every new connection.
    server: ServerCheck,
    /// The agent's time, against which expiry times are moved to Redis's clock.
    clock: Clock,
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
    } else if super::refused_by_acl(error) {
        WriteFailure::NoPermission
    } else {
        WriteFailure::Other
    }
}

/// What one call of [`Writer::write_chunks`] got done: the chunks acknowledged, in order, and
/// why the rest were not.
#[derive(Debug, Default)]
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
            pending: Pending::default(),
            slot_script: Script::new(FLUSH_SLOT_SCRIPT),
            telemetry,
            failure_log: LogLimit::default(),
            guard_log: LogLimit::default(),
            refused: (0, None),
            server: ServerCheck::default(),
            clock: Clock::system(),
        }
    }

    /// The most fields a counter or gauge hash holds (`Cleaner::most_fields`): the server is
    /// asked whether its hashes that long stay listpacks, and told to raise the limit if not.
    pub fn with_hash_fields(mut self, fields: u64) -> Writer {
        self.server.hash_fields = fields;
        self
    }

    /// The agent's time is `clock`'s (the system's otherwise).
    pub fn with_clock(self, clock: Clock) -> Writer {
        Writer { clock, ..self }
    }

    /// The agent's time, as this writer reads it.
    pub fn clock(&self) -> &Clock {
        &self.clock
    }

    /// Forgets the index members and pending rollups this writer added, when Redis may have
    /// lost data: the next write of every series adds its own again.
    fn forget_members(&mut self) {
        self.indexed.iter_mut().for_each(Indexed::clear);
        self.pending.clear();
    }

    /// Key names as the store's mode writes them.
    pub fn keys(&self) -> &Keys {
        self.store.keys()
    }

    /// Whether windows go out as slot chunks ([`Writer::write_slots`]).
    pub fn is_cluster(&self) -> bool {
        self.store.is_cluster()
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
    fn connection_failed(&mut self) {
        self.connection.forget();
        self.telemetry.redis_errors.increment(1);
    }

    /// The writer's connection, made if need be; its server's eviction policy and clock are
    /// checked when it is new, and once a minute.
    async fn connection(&mut self) -> Result<Connection, StoreError> {
        let (connection, new) = self.connection.get(&self.store).await?;
        if new {
            if self.connected_before {
                self.telemetry.redis_reconnects.increment(1);
            }
            self.connected_before = true;
            // A new connection may be to a server that lost data (a restart, a failover).
            self.forget_members();
            self.server.check_again();
        }
        if self.server.due() {
            let checked = self
                .server
                .check(connection.clone(), &self.telemetry, self.clock.now())
                .await;
            if let Err(e) = checked {
                self.connection_failed();
                return Err(e);
            }
        }
        Ok(connection)
    }

    /// Whether a chunk sent before without an answer is in doubt (dropped, not applied, if its
    /// guard is gone): only where Redis may have evicted its guard.
    fn in_doubt(&self, sent_before: bool) -> bool {
        sent_before && self.server.evicts_guard()
    }

    /// Counts (and now and then logs) a chunk that found its guard gone although it may have
    /// been applied: not applied again.
    fn guard_lost(&mut self, sequence: &str) {
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
        // What the call got done before it ended, an error or not.
        let mut done = Written::default();
        let result = self
            .write_one_server(&mut conn, sequence, chunks, sent_before, &mut done)
            .await;
        let Written {
            mut acknowledged,
            replayed,
            ..
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
    fn report_failures(&mut self, pairs: &[redis::Value]) {
        for (key, error) in refused_pairs(pairs) {
            self.refused(&key, &error);
        }
    }

    /// Counts (and now and then logs) one write Redis refused and the writer skipped.
    fn refused(&mut self, key: &str, error: &str) {
        self.refused.0 += 1;
        self.refused
            .1
            .get_or_insert_with(|| format!("{key}: {error}"));
        count_refused(&self.telemetry, &mut self.failure_log, key, error);
    }
}

/// The `key, error` pairs of a script's reply (the writes it skipped), as text.
pub(super) fn refused_pairs(pairs: &[redis::Value]) -> impl Iterator<Item = (String, String)> + '_ {
    let text = |v: &redis::Value| redis::from_redis_value_ref::<String>(v).unwrap_or_default();
    pairs
        .chunks(2)
        .map(move |pair| (text(&pair[0]), pair.get(1).map(text).unwrap_or_default()))
}

/// Counts one write Redis refused and a script skipped, by reason, and logs it at `log`'s rate.
pub(super) fn count_refused(telemetry: &Telemetry, log: &mut LogLimit, key: &str, error: &str) {
    let reason = write_failure(error);
    telemetry.write_failures[reason as usize].increment(1);
    if let Some(times) = log.occurred() {
        tracing::warn!(
            key,
            error = format!("{error}{}", super::acl_hint(error)),
            reason = reason.as_str(),
            times,
            "Redis refused a write and it was skipped (more are counted in write_failures_total)"
        );
    }
}

/// The error of a `WAIT` that saw fewer replicas than asked.
fn short_wait(got: u32, replicas: u32, timeout_ms: u64) -> StoreError {
    StoreError::Redis(redis::RedisError::from((
        redis::ErrorKind::Client,
        "fewer replicas than wait_replicas acknowledged the writes",
        format!("{got} of {replicas} within {timeout_ms} ms"),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

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
}
