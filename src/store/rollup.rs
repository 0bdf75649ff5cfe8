//! Carbon's rollups made once a period: a carbon point sets its slice at once, and each
//! coarser slice over it whose interval has already ended is made in the same call, as
//! whisper makes it; a coarser slice whose interval is still open is left pending in
//! `pending:gauge:` (the writer, `points.lua`), and [`Rollups::run`] makes the pending ones every
//! period (`coarse_write_secs`, at least a window) from what the finer archives hold then. A
//! series sending a point every few seconds costs one rollup a period instead of one a point;
//! a coarser archive shows its open interval up to a period late, as `coarse_write_secs` delays
//! the counters' coarser precisions. Agents with a carbon receiver run them.
//!
//! A run is made by the agent, a batch at a time (docs/carbon.md, "Rollups"):
//!
//! 1. **the claim** (`rollup_claim.lua`): the batch's members move from `pending:gauge:` to
//!    `rolling:gauge:`, scored with the run's claim (unique among the claims there);
//! 2. **the reads**: each member's finer slices, level by level, in one pipeline of `HMGET`s
//!    (and `GETRANGE`s of the blocks where the cleaner moved them);
//! 3. **the slices made here**, in whisper's order, each level from the one before as this run
//!    left it;
//! 4. **the writes**, one `MULTI`/`EXEC`: their `HSET`s, their index members, and the claim's
//!    members taken out of `rolling:gauge:` (those still scored with it).
//!
//! Why nothing is lost: a member leaves `pending:gauge:` only into `rolling:gauge:`, and leaves
//! that only with the writes it made. A point written after the claim adds its member to
//! `pending:gauge:` again (with `NX`, to a set it has left), so the next run makes the slice
//! again from what the finer archive holds then, whatever this run read. A run that stops half
//! way (its agent killed, an error) leaves its claim in `rolling:gauge:`, and any run claims it
//! again once it is [`ABANDONED_SECS`] old. Making a slice twice writes the same value, so two
//! runs over one member change nothing twice.

use std::sync::Arc;
use std::time::Duration;

use hashbrown::HashMap;
use redis::{Script, Value};
use tokio_util::sync::CancellationToken;

use super::bulk::{self, BulkPool, Hmget};
use super::clock::Clock;
use super::history::{self, Family, Geometry};
use super::keys;
use super::write::{count_refused, server_error, server_error_text, unexpected};
use super::{Cached, Connection, Store, StoreError};
use crate::storage_conf::Method;
use crate::telemetry::{LogLimit, Telemetry};

/// The most pending members one batch takes.
const RUN_BATCH: usize = 1000;

/// A claim this old (s) is of a run that stopped without finishing (a run's batch takes well
/// under a second): any run claims its members again.
const ABANDONED_SECS: u64 = 30;

/// A claim's score: its second, then a number of its own below this.
const CLAIM_SCALE: u64 = 1_000_000;

/// How far past the hash's own boundary the cleaner may have moved slices into blocks (a clock
/// ahead of the agent's), as the readers allow.
const MOVED_MARGIN: u64 = 300;

/// The most fields one `HMGET` asks.
const FIELDS_A_CALL: usize = 1000;

/// An archive as a pending member names it: precision, seconds kept, slots a block (0: none).
#[derive(Debug, Clone, Copy, PartialEq)]
struct Archive {
    p: u64,
    kept: u64,
    slots: u64,
}

/// A pending rollup: slice `t` of archive `lower` (an index into `archives`, at least 1) to
/// be made again, and every coarser archive's slice over it after it
/// (`<archive>|<slice>|<method>|<xFilesFactor>|<archives>|<path>`, archives counted from 1).
#[derive(Debug, Clone, PartialEq)]
struct Member<'a> {
    lower: usize,
    t: u64,
    method: Method,
    xff: f64,
    archives: Arc<[Archive]>,
    series: &'a str,
}

impl<'a> Member<'a> {
    /// `None` for a member the agent did not write (no such method, no such archive): dropped.
    /// `specs` keeps the archive lists read so far (a batch's members share a few).
    fn parse(text: &'a str, specs: &mut Vec<(&'a str, Arc<[Archive]>)>) -> Option<Member<'a>> {
        let mut parts = text.splitn(6, '|');
        let mut next = || parts.next();
        let (lower, t, method, xff, spec, series) =
            (next()?, next()?, next()?, next()?, next()?, next()?);
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        if !digits(lower) || !digits(t) || series.is_empty() {
            return None;
        }
        let archives = match specs.iter().find(|(text, _)| *text == spec) {
            Some((_, archives)) => archives.clone(),
            None => {
                let archives: Arc<[Archive]> = spec
                    .split(',')
                    .map(|a| {
                        let mut n = a.split(':').map(|x| x.parse::<u64>().ok());
                        match (n.next()??, n.next()??, n.next()??, n.next()) {
                            (p, kept, slots, None) if p > 0 => Some(Archive { p, kept, slots }),
                            _ => None,
                        }
                    })
                    .collect::<Option<_>>()?;
                specs.push((spec, archives.clone()));
                archives
            }
        };
        let lower = lower.parse::<usize>().ok()?;
        (lower > 1 && lower <= archives.len()).then_some(())?;
        Some(Member {
            lower: lower - 1,
            t: t.parse().ok()?,
            method: Method::ALL.into_iter().find(|m| m.as_str() == method)?,
            xff: xff.parse().ok().filter(|x: &f64| x.is_finite())?,
            archives,
            series,
        })
    }

    /// The slice of archive `level` over the member's slice, and the finer slices it is made
    /// of.
    fn interval(&self, level: usize) -> (u64, impl Iterator<Item = u64> + use<>) {
        let (p, finer) = (self.archives[level].p, self.archives[level - 1].p);
        let t = self.t - self.t % p;
        (t, (0..(p / finer).max(1)).map(move |k| t + k * finer))
    }
}

/// A finer slice one level needs: where its value comes from.
#[derive(Clone, Copy)]
enum Read {
    /// The `i`th field of an `HMGET`'s reply.
    Field(usize, usize),
    /// The `k`th slot of the `b`th `GETRANGE` of a block: `Block(b, k)`.
    Block(usize, usize),
}

/// The rollup runs of one agent.
pub struct Rollups {
    store: Store,
    connection: Cached,
    claim: Script,
    /// The finer slices' reads, where Redis is one server reached without TLS.
    bulk: BulkPool,
    period: Duration,
    telemetry: Arc<Telemetry>,
    /// A rollup Redis refused (a key of another type) is counted and logged as the flush's are.
    failure_log: LogLimit,
}

impl Rollups {
    pub fn new(store: Store, period: Duration, telemetry: Arc<Telemetry>) -> Rollups {
        Rollups {
            connection: Cached::default(),
            claim: Script::new(include_str!("rollup_claim.lua")),
            bulk: BulkPool::new(store.bulk_target(), 1),
            period,
            telemetry,
            failure_log: LogLimit::default(),
            store,
        }
    }

    /// Makes every pending rollup as of `now`, a batch a claim; returns how many were taken.
    pub async fn run_once(&mut self, now: u64) -> Result<u64, StoreError> {
        let mut taken = 0;
        loop {
            let (mut conn, _) = self.connection.get(&self.store).await?;
            let result = self.batch(&mut conn, now).await;
            let n = match result {
                Ok(n) => n,
                Err(e) => {
                    self.connection.forget();
                    self.telemetry.redis_errors.increment(1);
                    return Err(e);
                }
            };
            taken += n as u64;
            self.telemetry.carbon_rollups.increment(n as u64);
            if n < RUN_BATCH {
                return Ok(taken);
            }
        }
    }

    /// Claims, makes and writes one batch; returns how many members it took.
    async fn batch(&mut self, conn: &mut Connection, now: u64) -> Result<usize, StoreError> {
        let keys = self.store.keys();
        let (pending, rolling, claims) = (
            keys.pending_gauges(),
            keys.rolling_gauges(),
            keys.gauge_claims(),
        );
        // A claim's number is its own among those in progress (the script refuses one in use:
        // another is drawn), so letting go of it lets go of no other run's members.
        let mut tries = 0;
        let (claim, claimed) = loop {
            let claim = now * CLAIM_SCALE + rand::random_range(0..CLAIM_SCALE);
            let claimed: Option<Vec<String>> = self
                .claim
                .key(&pending)
                .key(&rolling)
                .key(&claims)
                .arg(claim)
                .arg(now.saturating_sub(ABANDONED_SECS) * CLAIM_SCALE)
                .arg(RUN_BATCH)
                .invoke_async(conn)
                .await?;
            tries += 1;
            match claimed {
                Some(claimed) => break (claim, claimed),
                None if tries < 8 => continue,
                None => return Err(unexpected("no free rollup claim number")),
            }
        };
        if claimed.is_empty() {
            return Ok(0);
        }
        let mut specs = Vec::new();
        let members: Vec<Member> = claimed
            .iter()
            .filter_map(|m| Member::parse(m, &mut specs))
            .collect();
        let keys = self.store.keys().clone();
        // Each member's hashes, named once: `hashes[i][a]` of archive `a`, from the one before
        // `lower` (the finest it reads) to the coarsest; none for the archives finer than that.
        let hashes: Vec<Vec<String>> = members
            .iter()
            .map(|m| {
                let named = |(a, archive): (usize, &Archive)| match a + 1 < m.lower {
                    true => String::new(),
                    false => keys.gauge(archive.p, m.series),
                };
                m.archives.iter().enumerate().map(named).collect()
            })
            .collect();

        // Every level's finer slices, read as they are now.
        let mut reads: Vec<Vec<Vec<Read>>> = Vec::with_capacity(members.len());
        let mut requests: Vec<(&str, Vec<i64>)> = Vec::new();
        for (m, names) in members.iter().zip(&hashes) {
            let mut levels = vec![Vec::new(); m.archives.len()];
            for (level, slices) in levels.iter_mut().enumerate().skip(m.lower) {
                let mut fields = m.interval(level).1.map(|t| t as i64).peekable();
                while fields.peek().is_some() {
                    let part: Vec<i64> = fields.by_ref().take(FIELDS_A_CALL).collect();
                    slices.extend((0..part.len()).map(|i| Read::Field(requests.len(), i)));
                    requests.push((&names[level - 1], part));
                }
            }
            reads.push(levels);
        }
        let fields = self.read_fields(conn, &requests).await?;

        // Slices missing from a long archive's hash, older than it keeps: from their blocks,
        // a `GETRANGE` a level's block (an hour's minutes are neighbouring slots).
        let mut pipe = redis::pipe();
        let mut ranges: Vec<(u64, u64)> = Vec::new();
        for ((m, levels), names) in members.iter().zip(&mut reads).zip(&hashes) {
            for (level, slots) in levels.iter_mut().enumerate().skip(m.lower) {
                let finer = m.archives[level - 1];
                let Some(geometry) = (finer.slots > 0).then_some(Geometry { slots: finer.slots })
                else {
                    continue;
                };
                let in_hash = history::keep_from(now, finer.p, Family::Gauge) + MOVED_MARGIN;
                let mut missing: Vec<(&mut Read, u64, u64)> = Vec::new();
                for (slot, slice) in slots.iter_mut().zip(m.interval(level).1) {
                    let Read::Field(c, f) = *slot else { continue };
                    // (A read Redis refused leaves its member out, below.)
                    if fields[c].get(f).is_none_or(|v| v.is_some()) || slice >= in_hash {
                        continue;
                    }
                    let (block, at) = geometry.locate(finer.p, slice);
                    missing.push((slot, block, at));
                }
                for run in missing.chunk_by_mut(|a, b| a.1 == b.1) {
                    let (block, first, last) = (run[0].1, run[0].2, run[run.len() - 1].2);
                    let (from, to) = Geometry::byte_range(first, last);
                    pipe.cmd("GETRANGE")
                        .arg(history::block_key(
                            &keys,
                            &names[level - 1],
                            geometry,
                            block,
                        ))
                        .arg(from)
                        .arg(to);
                    for (slot, _, at) in run.iter_mut() {
                        **slot = Read::Block(ranges.len(), (*at - first) as usize);
                    }
                    ranges.push((first, last));
                }
            }
        }
        let mut blocks: Vec<Vec<Option<f64>>> = Vec::new();
        if !ranges.is_empty() {
            let replies: Vec<redis::RedisResult<Vec<u8>>> =
                pipe.ignore_errors().query_async(conn).await?;
            for (reply, (first, last)) in replies.into_iter().zip(ranges) {
                // A name of another type reads as no value, as the script read it.
                let bytes = reply.unwrap_or_default();
                blocks.push(Geometry::read(first, last, &bytes, Family::Gauge));
            }
        }

        // Made in order, each level from the finer one as this batch left it. Unlike whisper's
        // carrying down, a member goes on past a slice too little known to be written: it
        // stands for the coarser slices over its own too (the writer adds none of theirs), and
        // making one from the finer archive as it is gives what whisper's last write gave.
        // A slice made: its member, archive, start and value.
        let mut made: HashMap<(&str, u64, u64), f64> = HashMap::new();
        let mut writes: Vec<(usize, usize, u64, f64)> = Vec::new();
        let mut known = Vec::new();
        for (i, (m, levels)) in members.iter().zip(&reads).enumerate() {
            let refused = |r: &Read| matches!(*r, Read::Field(c, _) if fields[c].is_empty());
            if levels.iter().flatten().any(refused) {
                continue;
            }
            for (level, slots) in levels.iter().enumerate().skip(m.lower) {
                let (finer, archive) = (m.archives[level - 1], m.archives[level]);
                let (t, slices) = m.interval(level);
                let stale = i128::from(now) - i128::from(finer.kept);
                known.clear();
                let mut total = 0;
                for (slice, read) in slices.zip(slots) {
                    total += 1;
                    let v = made
                        .get(&(m.series, finer.p, slice))
                        .copied()
                        .or(match *read {
                            Read::Field(c, f) => fields[c].get(f).copied().flatten(),
                            Read::Block(b, k) => blocks[b].get(k).copied().flatten(),
                        });
                    // A slice past the archive's retention is whisper's stale slot: not known.
                    if let Some(v) = v.filter(|_| i128::from(slice) > stale) {
                        known.push(v);
                    }
                }
                if known.is_empty() || (known.len() as f64) / (total as f64) < m.xff {
                    continue;
                }
                let value = m.method.aggregate(&known, total);
                if value.is_finite() {
                    made.insert((m.series, archive.p, t), value);
                    writes.push((i, level, t, value));
                }
            }
        }

        // The slices and their index members, and the claim let go, at once.
        let mut pipe = redis::pipe();
        pipe.ignore_errors().cmd("MULTI");
        let mut queued: Vec<&str> = Vec::new();
        for &(i, level, t, value) in &writes {
            let key = &hashes[i][level];
            pipe.cmd("HSET").arg(key).arg(t).arg(value);
            queued.push(key);
        }
        let index = keys.known_gauges();
        if !writes.is_empty() {
            let mut indexed: Vec<(&str, u64)> = writes
                .iter()
                .map(|&(i, level, ..)| (members[i].series, members[i].archives[level].p))
                .collect();
            indexed.sort_unstable();
            indexed.dedup();
            let zadd = pipe.cmd("ZADD").arg(&index);
            for (series, p) in indexed {
                zadd.arg(0).arg(keys::known_member(p, series));
            }
            queued.push(&index);
        }
        pipe.cmd("ZREMRANGEBYSCORE")
            .arg(&rolling)
            .arg(claim)
            .arg(claim);
        queued.push("");
        pipe.cmd("EXEC");
        let mut replies: Vec<redis::RedisResult<Value>> = pipe.query_async(conn).await?;
        // Refused as a whole (an ACL without a key): the claim stays, to be claimed again.
        let results = match replies.pop() {
            Some(Ok(Value::Array(results))) => results,
            Some(Err(e)) => return Err(e.into()),
            _ => return Err(unexpected("a rollup's EXEC")),
        };
        for (result, key) in results.iter().zip(&queued) {
            if let Value::ServerError(e) = result {
                let error = server_error(e);
                count_refused(&self.telemetry, &mut self.failure_log, key, &error);
            }
        }
        Ok(claimed.len())
    }

    /// The `HMGET`s' values, in order; a request Redis refused (a key of another type) is
    /// counted and reads as no values. Through the bulk reader where there is one (replies read
    /// in place), else, or when Redis refused one, through the redis crate, a reply each.
    async fn read_fields(
        &mut self,
        conn: &mut Connection,
        requests: &[(&str, Vec<i64>)],
    ) -> Result<Vec<Vec<Option<f64>>>, StoreError> {
        if requests.is_empty() {
            return Ok(Vec::new());
        }
        if self.bulk.available() {
            let hmgets: Vec<Hmget> = requests
                .iter()
                .map(|(key, fields)| Hmget {
                    key: key.as_bytes(),
                    fields,
                    // An hour's minutes, a day's hours: the hash is short (a long archive's
                    // holds its newest 16 slices, the rest in blocks; a short archive at most
                    // 120), and one scan of it costs Redis less than sixty field scans.
                    whole: fields.len() > bulk::FEW_FIELDS,
                })
                .collect();
            if let Ok(values) = self.bulk.hmget(&hmgets).await {
                return Ok(values);
            }
        }
        let mut pipe = redis::pipe();
        for (key, fields) in requests {
            pipe.cmd("HMGET").arg(key).arg(fields);
        }
        let replies: Vec<redis::RedisResult<Value>> =
            pipe.ignore_errors().query_async(conn).await?;
        let mut out = Vec::with_capacity(replies.len());
        for (reply, (key, _)) in replies.iter().zip(requests) {
            out.push(match reply {
                Ok(Value::Array(values)) => values.iter().map(number).collect(),
                Ok(_) => Vec::new(),
                Err(e) => {
                    let error = server_error_text(e);
                    count_refused(&self.telemetry, &mut self.failure_log, key, &error);
                    Vec::new()
                }
            });
        }
        Ok(out)
    }

    /// A run every period until `stop`, then a last one (the final flush's points are in by
    /// then when the caller stops this after the flusher).
    pub async fn run(mut self, clock: Clock, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(self.period) => {}
            }
            if let Err(e) = self.run_once(clock.unix_now()).await {
                tracing::warn!(error = %e, "carbon rollup run failed; the next run takes what it left");
            }
        }
        if let Err(e) = self.run_once(clock.unix_now()).await {
            tracing::warn!(error = %e, "the last carbon rollup run failed; the next start takes what it left");
        }
    }
}

/// A finer slice's value as the bulk reader reads it: a number, else none.
fn number(value: &Value) -> Option<f64> {
    match value {
        Value::BulkString(bytes) => bulk::number(bytes),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_read_as_the_writer_names_them() {
        let mut specs = Vec::new();
        let text = "2|1020|absmax|0.5|10:21600:248,60:604800:2008|a.b|c";
        let m = Member::parse(text, &mut specs).unwrap();
        assert_eq!(
            m,
            Member {
                lower: 1,
                t: 1020,
                method: Method::AbsMax,
                xff: 0.5,
                archives: vec![
                    Archive {
                        p: 10,
                        kept: 21_600,
                        slots: 248
                    },
                    Archive {
                        p: 60,
                        kept: 604_800,
                        slots: 2008
                    },
                ]
                .into(),
                series: "a.b|c",
            }
        );
        let (t, slices) = m.interval(1);
        assert_eq!(
            (t, slices.collect::<Vec<_>>()),
            (1020, vec![1020, 1030, 1040, 1050, 1060, 1070])
        );
        // Not the agent's: no such method, archive, or a first archive to make.
        for bad in [
            "2|1020|median|0.5|10:60:0,60:120:0|s",
            "3|1020|max|0.5|10:60:0,60:120:0|s",
            "1|1020|max|0.5|10:60:0,60:120:0|s",
            "2|1020|max|x|10:60:0,60:120:0|s",
            "2|1020|max|0.5|10:60,60:120:0|s",
            "2|1020|max|0.5|10:60:0,60:120:0|",
        ] {
            assert_eq!(Member::parse(bad, &mut specs), None, "{bad}");
        }
        // A spec read before is shared, not read again.
        let again = Member::parse("2|1080|max|0|10:21600:248,60:604800:2008|d", &mut specs);
        assert!(Arc::ptr_eq(&again.unwrap().archives, &m.archives));
        assert_eq!(specs.len(), 2, "the good spec and 10:60:0,60:120:0");
    }
}
