//! Cluster mode's flush: [`build_slot_chunks`] groups a closed window's writes by hash slot, one
//! `flush_slot.lua` call per slot chunk with every key declared, and [`Writer::write_slots`]
//! sends a window's slot chunks concurrently (in order within a slot), then the
//! [`FollowUps`]: the writes to the single hot keys (`known:`, `known:gauge:`,
//! `slowest:AccessTime`), which are idempotent and retried until done.

use std::collections::HashMap;
use std::sync::Arc;

use futures_util::StreamExt;
use redis::aio::ConnectionLike;

use super::chunk::{
    Argv, BUCKET_WRITES_PER_SERIES, Parts, SET_MEMBERS_PER_SERIES, put_buckets, unexpected,
};
use super::{
    ChunkSettings, Connection, CounterWrite, FlushChunk, GUARD_IDLE_SECS, Outcome, Writer,
    short_wait,
};
use crate::aggregate::{ClosedWindow, StatKind, sketch};
use crate::store::{Keys, StoreError, clock, keys};

/// Slot chunks in flight at once: enough to keep every master of a large cluster busy, few
/// enough that a failing cluster is not flooded with calls that will fail too.
const CONCURRENT_CHUNKS: usize = 64;

/// ZADD members per follow-up call.
const FOLLOW_UP_BATCH: usize = 1000;

/// One write of a slot chunk, in the order of `flush_slot.lua`'s sections.
enum Op<'a> {
    Counter(String, u64, i64, CounterWrite),
    Gauge(String, u64, f64),
    Values(String, &'a [(crate::aggregate::SeriesName, f64)]),
    Set(String, u64, &'a [crate::aggregate::Member]),
    Stat([String; 4], &'static str, &'a crate::aggregate::Stats),
    Recent(String, String),
    Common([String; 4], &'a str),
    /// A slice's bucket key, when it expires, the buckets.
    Hist(String, u64, &'a crate::aggregate::Buckets),
}

impl Op<'_> {
    fn section(&self) -> usize {
        match self {
            Op::Counter(..) => 0,
            Op::Gauge(..) => 1,
            Op::Values(..) => 2,
            Op::Set(..) => 3,
            Op::Stat(..) => 4,
            Op::Recent(..) => 5,
            Op::Common(..) => 6,
            Op::Hist(..) => 7,
        }
    }

    fn first_key(&self) -> &str {
        match self {
            Op::Counter(k, ..) | Op::Gauge(k, ..) | Op::Values(k, _) | Op::Set(k, ..) => k,
            Op::Recent(k, _) | Op::Hist(k, ..) => k,
            Op::Stat(k, ..) | Op::Common(k, _) => &k[0],
        }
    }

    fn cost(&self) -> usize {
        match self {
            Op::Values(_, pairs) => pairs.len(),
            Op::Set(_, _, members) => 1 + members.len() / SET_MEMBERS_PER_SERIES,
            Op::Hist(_, _, buckets) => 1 + buckets.len() / BUCKET_WRITES_PER_SERIES,
            _ => 1,
        }
    }
}

/// Splits a closed window into slot chunks (argument layout in `flush_slot.lua`), each at most
/// about `max_series × precisions` writes, numbered 0 until the flusher numbers them.
pub fn build_slot_chunks(
    window: &ClosedWindow,
    precisions: &[(u64, CounterWrite)],
    settings: &ChunkSettings,
) -> Vec<FlushChunk> {
    build_slot_parts(Parts::of(window), precisions, settings)
}

/// [`build_slot_chunks`] of `window`'s parts.
pub(super) fn build_slot_parts<'a>(
    window: Parts<'a>,
    precisions: &[(u64, CounterWrite)],
    settings: &ChunkSettings,
) -> Vec<FlushChunk> {
    let keys = &settings.keys;
    let mut slots: HashMap<u16, Vec<Op>> = HashMap::new();
    let mut add = |op: Op<'a>| {
        slots
            .entry(keys::slot_of(op.first_key().as_bytes()))
            .or_default()
            .push(op);
    };
    for (series, n) in window.counters {
        for &(p, write) in precisions {
            if write != CounterWrite::Skip {
                add(Op::Counter(
                    keys.counter(p, series),
                    keys::slice(window.start, p),
                    *n,
                    write,
                ));
            }
        }
    }
    for (series, value) in window.gauges {
        for &(p, _) in precisions {
            add(Op::Gauge(
                keys.gauge(p, series),
                keys::slice(window.start, p),
                *value,
            ));
        }
    }
    for part in window.gauges.chunks(settings.max_series.max(1)) {
        add(Op::Values(keys.gauges(), part));
    }
    for (series, members) in window.sets {
        for &(p, _) in precisions {
            let slice = keys::slice(window.start, p);
            add(Op::Set(
                keys.set(p, series, slice),
                slice + settings.retention.seconds(p),
                members,
            ));
        }
    }
    for (series, kind, stats) in window.stats {
        // A count of 0: the buckets of a group of windows alone (`quantile_write_secs`).
        if stats.count > 0.0 {
            add(Op::Stat(
                keys::family(keys.stats(series, *kind)),
                kind.redis_name(),
                stats,
            ));
        }
        if !stats.buckets.is_empty() {
            for &p in &settings.quantiles.precisions {
                let slice = keys::slice(window.start, p);
                add(Op::Hist(
                    keys.hist_slice(p, series, *kind, slice),
                    slice + settings.retention.seconds(p),
                    &stats.buckets,
                ));
            }
        }
    }
    let asctime = clock::asctime(window.start);
    for log in window.logs {
        let severity = log.severity.as_str();
        add(Op::Recent(
            keys.recent(&log.name, severity),
            format!("{asctime} {}", log.message),
        ));
        add(Op::Common(
            keys::family(keys.common(&log.name, severity)),
            &log.message,
        ));
    }

    let hour = clock::hour_start(window.start);
    let budget = settings.max_series.max(1) * precisions.len().max(1);
    let mut chunks = Vec::new();
    let mut slots: Vec<(u16, Vec<Op>)> = slots.into_iter().collect();
    slots.sort_unstable_by_key(|(slot, _)| *slot);
    for (_, ops) in slots {
        let mut start = 0;
        let mut cost = 0;
        for (i, op) in ops.iter().enumerate() {
            if cost > 0 && cost + op.cost() > budget {
                chunks.push(encode(&ops[start..i], settings, &hour));
                start = i;
                cost = 0;
            }
            cost += op.cost();
        }
        chunks.push(encode(&ops[start..], settings, &hour));
    }
    chunks
}

/// One slot chunk's arguments: the number of data keys, the keys, then `flush_slot.lua`'s ARGV
/// after its first four (which the writer adds).
fn encode(ops: &[Op], settings: &ChunkSettings, hour: &str) -> FlushChunk {
    let mut keys = Argv::default();
    let mut args = Argv::default();
    args.arg(settings.keys.prefix())
        .arg(hour)
        .arg(settings.log_ttl_secs)
        .arg(settings.quantiles.alpha)
        .arg(sketch::MAX_BUCKETS);
    // Counters and gauges in runs of one slice (and mode): the slice once per run, not per key,
    // as each argument costs Redis a parse and a Lua string.
    let run_of = |op: &Op| match op {
        Op::Counter(_, slice, _, write) => (*slice, *write as u8),
        Op::Gauge(_, slice, _) => (*slice, 0),
        _ => (0, 0),
    };
    let mut series = 0;
    for section in 0..8 {
        let mut these: Vec<&Op> = ops.iter().filter(|op| op.section() == section).collect();
        series += these.len();
        if section < 2 {
            these.sort_by_key(|op| run_of(op));
            let runs = these.chunk_by(|a, b| run_of(a) == run_of(b));
            args.arg(runs.clone().count());
            for run in runs {
                let (slice, mode) = run_of(run[0]);
                args.arg(slice).arg(mode).arg(run.len());
                for op in run {
                    match op {
                        Op::Counter(key, _, n, _) => {
                            keys.arg(key);
                            args.arg(n);
                        }
                        Op::Gauge(key, _, value) => {
                            keys.arg(key);
                            args.arg(value);
                        }
                        _ => unreachable!("sections 0 and 1 hold counters and gauges"),
                    }
                }
            }
            continue;
        }
        args.arg(these.len());
        for op in these {
            match op {
                Op::Counter(..) | Op::Gauge(..) => unreachable!("sections 0 and 1"),
                Op::Values(key, pairs) => {
                    keys.arg(key);
                    args.arg(pairs.len());
                    for (series, value) in pairs.iter() {
                        args.arg(&**series).arg(value);
                    }
                }
                Op::Set(key, expire_at, members) => {
                    keys.arg(key);
                    args.arg(expire_at).arg(members.len());
                    for m in members.iter() {
                        args.arg(&**m);
                    }
                }
                Op::Stat(family, kind, s) => {
                    for key in family {
                        keys.arg(key);
                    }
                    args.arg(*kind)
                        .arg(s.count)
                        .arg(s.sum)
                        .arg(s.sumsq)
                        .arg(s.min)
                        .arg(s.max);
                }
                Op::Recent(key, entry) => {
                    keys.arg(key);
                    args.arg(entry);
                }
                Op::Common(family, message) => {
                    for key in family {
                        keys.arg(key);
                    }
                    args.arg(*message);
                }
                Op::Hist(key, expire_at, buckets) => {
                    keys.arg(key);
                    args.arg(expire_at);
                    put_buckets(&mut args, buckets);
                }
            }
        }
    }
    let mut argv = Argv::default();
    argv.arg(keys.len());
    argv.append(&keys);
    argv.append(&args);
    FlushChunk::packed(series, argv)
}

/// The writes a window's slot chunks leave to the single hot keys, gathered from their replies.
#[derive(Debug, Default)]
pub struct FollowUps {
    /// `known:` members whose hash got a new slice.
    pub known: Vec<Vec<u8>>,
    /// `known:gauge:` members likewise.
    pub known_gauges: Vec<Vec<u8>>,
    /// Timer series and their hour's average, for `slowest:AccessTime`.
    pub slowest: Vec<(Vec<u8>, f64)>,
    /// The hour's stats keys of the timers of chunks applied before, whose averages their
    /// replies no longer hold: read back when the follow-ups are written.
    pub averages_to_read: Vec<String>,
}

impl FollowUps {
    fn take(&mut self, reply: &[redis::Value], keys: &Keys) {
        let list = |i: usize| -> Vec<Vec<u8>> {
            reply
                .get(i)
                .and_then(|v| redis::from_redis_value_ref(v).ok())
                .unwrap_or_default()
        };
        self.known.extend(list(1));
        self.known_gauges.extend(list(2));
        let timers = list(3);
        for pair in timers.chunks(2) {
            if let [key, average] = pair
                && let Some(series) = std::str::from_utf8(key)
                    .ok()
                    .and_then(|k| keys.series_of_stats(k, StatKind::Timer))
                && let Some(average) = std::str::from_utf8(average)
                    .ok()
                    .and_then(|a| a.parse().ok())
            {
                self.slowest.push((series.into_bytes(), average));
            }
        }
    }

    /// For a chunk applied before (its reply lost, a spool replayed, a window sent again),
    /// whose reply holds no lists: the index member of every counter and gauge hash it wrote,
    /// and its timers' stats keys, whose averages are read back. More than it added, which
    /// costs only a `ZADD`: a member whose hash is gone, the cleaner removes.
    fn take_all(&mut self, chunk: &FlushChunk, keys: &Keys) {
        let counters = keys.counter_index().hash_prefix;
        let gauges = keys.gauge_index().hash_prefix;
        for key in chunk.data_keys() {
            if let Some(member) = key.strip_prefix(counters.as_bytes()) {
                self.known.push(member.to_vec());
            } else if let Some(member) = key.strip_prefix(gauges.as_bytes()) {
                self.known_gauges.push(member.to_vec());
            } else if let Ok(key) = std::str::from_utf8(key)
                && keys.series_of_stats(key, StatKind::Timer).is_some()
            {
                self.averages_to_read.push(key.to_string());
            }
        }
    }

    pub fn is_empty(&self) -> bool {
        self.known.is_empty()
            && self.known_gauges.is_empty()
            && self.slowest.is_empty()
            && self.averages_to_read.is_empty()
    }
}

impl Writer {
    /// Sends a window's slot chunks of the run whose sequence keys start with `sequence`:
    /// the chunks of one slot one after the other (each only once the one before it is
    /// acknowledged), different slots concurrently. Replies' index members and averages are
    /// added to `follow_ups`.
    ///
    /// With `wait_replicas`, a pass that ends in an error acknowledges nothing: its chunks
    /// answered so far were not waited for (`WAIT` follows a whole pass), and counting them
    /// written would lose them with a master that dies before its replica has them. Sent again,
    /// they answer *applied before* and are waited for then. Follow-ups gathered are kept
    /// whatever the pass's end: they are `ZADD`s of members and averages, harmless to repeat
    /// and to make for a hash that turns out lost (the cleaner removes its member).
    pub async fn write_slots(
        &mut self,
        sequence: &str,
        chunks: &[Arc<FlushChunk>],
        sent_before: &[bool],
        follow_ups: &mut FollowUps,
    ) -> Outcome {
        let mut acknowledged = vec![false; chunks.len()];
        let conn = match self.connection().await {
            Ok(c) => c,
            Err(e) => {
                self.connection_failed();
                return Outcome {
                    acknowledged,
                    replayed: 0,
                    error: Some(e),
                };
            }
        };
        let mut by_slot: HashMap<u16, Vec<usize>> = HashMap::new();
        for (i, chunk) in chunks.iter().enumerate() {
            by_slot.entry(chunk.slot()).or_default().push(i);
        }
        let keys = self.keys().clone();
        let keys = &keys;
        let now = self.clock.unix_now();
        let in_doubt: Vec<bool> = (0..chunks.len())
            .map(|i| self.in_doubt(sent_before.get(i) == Some(&true)))
            .collect();
        let in_doubt = &in_doubt;
        let script = &self.slot_script;
        // After the first failure nothing more is sent: the rest would most likely fail too,
        // each after a whole timeout (a cluster connection whose slot refresh hung after a
        // failover kept every call waiting out its timeout: thousands of calls a window, over a
        // minute), and the retry goes over a new connection.
        let failed = std::sync::atomic::AtomicBool::new(false);
        let failed = &failed;
        let results: Vec<Vec<(usize, ChunkReply)>> = futures_util::stream::iter(by_slot)
            .map(|(slot, indexes)| {
                let mut conn = conn.clone();
                let guard = keys.slot_guard(keys::slot_tag(slot), sequence);
                async move {
                    let mut out = Vec::new();
                    for i in indexes {
                        if failed.load(std::sync::atomic::Ordering::Relaxed) {
                            break;
                        }
                        let r = send_slot_chunk(
                            &mut conn,
                            script,
                            &guard,
                            (in_doubt[i], now),
                            &chunks[i],
                        )
                        .await;
                        let error = r.is_err();
                        out.push((i, r));
                        if error {
                            failed.store(true, std::sync::atomic::Ordering::Relaxed);
                            break;
                        }
                    }
                    out
                }
            })
            .buffer_unordered(CONCURRENT_CHUNKS)
            .collect()
            .await;
        let mut error = None;
        let mut replayed = 0;
        for (i, result) in results.into_iter().flatten() {
            match result {
                Ok(reply) => {
                    acknowledged[i] = true;
                    let applied = redis::from_redis_value_ref::<i64>(&reply[0]).ok();
                    if applied == Some(-2) {
                        self.guard_lost(sequence);
                    }
                    if applied != Some(1) {
                        replayed += usize::from(applied == Some(0));
                        follow_ups.take_all(&chunks[i], keys);
                    } else {
                        if let Some(redis::Value::Array(failures)) = reply.get(4) {
                            self.report_failures(failures);
                        }
                        follow_ups.take(&reply, keys);
                    }
                }
                // A chunk whose keys are not in one slot would be refused for ever and hold up
                // every window after it: counted, logged and skipped. (Key names are built so
                // that this cannot happen: a guard against a bug, not a path.)
                Err(StoreError::Redis(e))
                    if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::CrossSlot) =>
                {
                    acknowledged[i] = true;
                    let key = chunks[i].data_keys().next().unwrap_or_default();
                    self.refused(&String::from_utf8_lossy(key), &server_error_text(&e));
                }
                Err(e) => error = Some(e),
            }
        }
        if self.wait.is_some() && error.is_some() {
            acknowledged.fill(false);
        }
        if let Some((replicas, timeout_ms)) = self.wait
            && error.is_none()
            && acknowledged.iter().any(|a| *a)
        {
            // Sent to every master (the cluster connection keeps one connection a master, the
            // one the chunks went over) and answered with the fewest replicas any of them got.
            let mut conn = conn.clone();
            match redis::cmd("WAIT")
                .arg(replicas)
                .arg(timeout_ms)
                .query_async::<u32>(&mut conn)
                .await
            {
                Ok(got) if got >= replicas => {}
                Ok(got) => {
                    self.telemetry.replica_waits_short.increment(1);
                    acknowledged.fill(false);
                    error = Some(short_wait(got, replicas, timeout_ms));
                }
                Err(e) => {
                    acknowledged.fill(false);
                    error = Some(e.into());
                }
            }
        }
        if error.is_some() {
            self.connection_failed();
        }
        Outcome {
            acknowledged,
            replayed,
            error,
        }
    }

    /// Writes the follow-ups (ZADDs and a trim: each safe to repeat); they are kept on failure.
    pub async fn write_follow_ups(&mut self, follow_ups: &FollowUps) -> Result<(), StoreError> {
        let keys = self.keys().clone();
        let result = async {
            let mut conn = self.connection().await?;
            let mut calls = Vec::new();
            for (key, members) in [
                (keys.known(), &follow_ups.known),
                (keys.known_gauges(), &follow_ups.known_gauges),
            ] {
                for batch in members.chunks(FOLLOW_UP_BATCH) {
                    let mut cmd = redis::cmd("ZADD");
                    cmd.arg(&key);
                    for m in batch {
                        cmd.arg("0").arg(m);
                    }
                    calls.push((key.clone(), cmd));
                }
            }
            let read = read_averages(&conn, &keys, &follow_ups.averages_to_read).await?;
            if !follow_ups.slowest.is_empty() || !read.is_empty() {
                let slowest = keys.slowest();
                let batches = follow_ups.slowest.chunks(FOLLOW_UP_BATCH);
                for batch in batches.chain(read.chunks(FOLLOW_UP_BATCH)) {
                    let mut cmd = redis::cmd("ZADD");
                    cmd.arg(&slowest);
                    for (series, average) in batch {
                        cmd.arg(average).arg(series);
                    }
                    calls.push((slowest.clone(), cmd));
                }
                let mut trim = redis::cmd("ZREMRANGEBYRANK");
                trim.arg(&slowest).arg(0).arg(-101);
                calls.push((slowest, trim));
            }
            let mut refused = Vec::new();
            for (key, cmd) in calls {
                match cmd.query_async::<()>(&mut conn).await {
                    Ok(()) => {}
                    // Another program's key of another type (or a value Redis will never take):
                    // refused for good, so counted and skipped like a chunk's refused write,
                    // not retried for ever.
                    Err(e) if matches!(e.code(), Some("WRONGTYPE" | "ERR")) => {
                        refused.push((key, server_error_text(&e)))
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            Ok(refused)
        }
        .await;
        let result = result.map(|refused| {
            for (key, error) in refused {
                self.refused(&key, &error);
            }
        });
        if result.is_err() {
            self.connection_failed();
        }
        result
    }
}

/// A server's error as Redis wrote it (`WRONGTYPE Operation against…`), as the scripts report
/// the writes they skip.
pub(crate) fn server_error_text(e: &redis::RedisError) -> String {
    match (e.code(), e.detail()) {
        (Some(code), Some(detail)) => format!("{code} {detail}"),
        _ => e.to_string(),
    }
}

/// The hour's average of each timer whose `stats:` key is in `stats_keys`, as the script
/// computes it (for chunks answered *applied before*, whose replies hold none; for the
/// cleaner's `slowest:` members put back), read concurrently: a spool replayed can bring a
/// window's worth.
pub(crate) async fn read_averages(
    conn: &Connection,
    keys: &Keys,
    stats_keys: &[String],
) -> Result<Vec<(Vec<u8>, f64)>, StoreError> {
    let replies: Vec<_> = futures_util::stream::iter(stats_keys.iter().cloned())
        .map(|key: String| {
            let mut conn = conn.clone();
            async move {
                let scores = redis::cmd("ZMSCORE")
                    .arg(&key)
                    .arg("sum")
                    .arg("count")
                    .query_async::<Vec<Option<f64>>>(&mut conn)
                    .await;
                (key, scores)
            }
        })
        .buffer_unordered(CONCURRENT_CHUNKS)
        .collect()
        .await;
    let mut averages = Vec::new();
    for (key, scores) in replies {
        let scores = match scores {
            Ok(scores) => scores,
            // Another program's key: its chunk counted that refusal already.
            Err(e) if e.code() == Some("WRONGTYPE") => continue,
            Err(e) => return Err(e.into()),
        };
        if let [Some(sum), Some(count)] = scores[..]
            && count > 0.0
            && let Some(series) = keys.series_of_stats(&key, StatKind::Timer)
        {
            averages.push((series.into_bytes(), sum / count));
        }
    }
    Ok(averages)
}

/// A slot chunk's reply, or why it was not acknowledged.
type ChunkReply = Result<Vec<redis::Value>, StoreError>;

/// One slot chunk: `EVALSHA`, and on `NOSCRIPT` (a node that never saw it: a promoted replica,
/// a restarted master) the script loaded on every master and sent once more. Returns the reply
/// of a chunk that was applied now or before.
async fn send_slot_chunk(
    conn: &mut Connection,
    script: &redis::Script,
    (guard, run): &(String, &str),
    (in_doubt, now): (bool, u64),
    chunk: &FlushChunk,
) -> ChunkReply {
    let data_keys = chunk.data_key_count();
    let mut args = chunk.args().skip(1);
    let mut cmd = redis::cmd("EVALSHA");
    cmd.arg(script.get_hash()).arg(data_keys + 1).arg(guard);
    for key in args.by_ref().take(data_keys) {
        cmd.arg(key);
    }
    cmd.arg(chunk.seq)
        .arg(run)
        .arg(u8::from(in_doubt))
        .arg(now)
        .arg(GUARD_IDLE_SECS);
    for arg in args {
        cmd.arg(arg);
    }
    // A server error comes back inside the reply.
    let send = |conn: &mut Connection| {
        let cmd = &cmd;
        let mut conn = conn.clone();
        async move { conn.req_packed_command(cmd).await?.extract_error() }
    };
    let reply = match send(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(conn).await?;
            send(conn).await?
        }
        other => other?,
    };
    let reply: Vec<redis::Value> =
        redis::from_redis_value(reply).map_err(redis::RedisError::from)?;
    match reply
        .first()
        .and_then(|v| redis::from_redis_value_ref::<i64>(v).ok())
    {
        Some(-2 | 0 | 1) => Ok(reply),
        _ => Err(unexpected("a slot chunk's reply is not flush_slot.lua's")),
    }
}
