//! The cleaner (docs/layout.md, "The cleaner"): the book's `clean_counters`, run inside the agent. [`Cleaner::run`]
//! holds the `cleaner:lock` lease and makes a pass about every interval; [`Cleaner::pass`] walks
//! `known:` and `known:gauge:` in batches and trims each batch with one `clean.lua` call, then
//! removes what series that stopped leave outside those hashes: the `gauges:` fields of gauges
//! no agent wrote for `forget_idle_secs` ([`Cleaner::forgetting`]) and the `slowest:AccessTime`
//! members whose hour's statistics are gone; every few minutes it deletes the hourly statistics
//! whose hour and the next are over, and moves a long archive's older set slices into blocks.
//!
//! Time comes in as a parameter of [`Cleaner::pass`], so tests clean "200 days later" at once.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::StreamExt;
use redis::Script;
use tokio_util::sync::CancellationToken;

use super::clock::Clock;
use super::history::{self, Geometry};
use super::keys::{self, Index};
use super::quantile_blocks;
use super::{Cached, Connection, Keys, Store, StoreError};
use crate::aggregate::StatKind;
use crate::retention::Retention;
use crate::storage_conf::{Family, Namer, Schemas};
use crate::telemetry::Telemetry;

/// Index members per script call: each member's hash holds its precision's count of slices, so
/// 100 members are ~12 000 fields at the book's 120, a few milliseconds of Redis time (a week
/// of minutes, 10 080 fields a hash, makes a call of a few hundred: still one pass's work).
const BATCH_MEMBERS: usize = 100;

/// How often (s) the `stats:` families are walked: their hours end on the hour, and the walk
/// `SCAN`s the whole key space, which grows with every family's keys.
const STATS_WALK_SECS: u64 = 300;

/// Slots cleaned at once in a cluster.
const CONCURRENT_SLOTS: usize = 16;

/// Every how many passes each long archive's hash is read whole (trim.lua): between, a visit
/// reads only the slices that have left the hash's newest since the pass before (an hour's
/// passes at the default `cleaner_interval_secs`).
const FULL_EVERY: u64 = 60;

/// What one pass did.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct PassReport {
    pub members_visited: u64,
    pub slices_removed: u64,
    /// Slices of long archives moved from their hash into blocks (`store::history`).
    pub slices_moved: u64,
    pub hashes_removed: u64,
    /// `gauges:` fields of idle gauges removed.
    pub gauges_removed: u64,
    /// `slowest:AccessTime` members whose statistics are gone, removed.
    pub slowest_removed: u64,
    /// Keys of hourly statistics whose hour and the next are over, deleted.
    pub stats_removed: u64,
    /// False when the lease was lost part way and the pass stopped.
    pub completed: bool,
}

pub struct Cleaner {
    store: Store,
    connection: Cached,
    keys: Keys,
    owner: String,
    interval: Duration,
    /// How long each precision is kept, as the scripts take it (`Retention::encode`).
    retention: String,
    /// With `storage_schemas`: a hash is trimmed to what its series' names' schemas keep
    /// (`retention`, every schema's longest, cuts the blocks).
    schemas: Option<Trim>,
    /// The long archives' cuts (`Retention::encode_history`).
    history: String,
    /// The precisions, finest first: where a gauge's last write is looked for.
    precisions: Vec<u64>,
    /// A gauge no agent wrote for this long loses its `gauges:` field (`forget_idle_secs`).
    forget_secs: u64,
    /// `gauges:` fields found with no history at any precision in the last pass: removed if
    /// the next pass finds them so again (in a cluster a gauge's field can land before its
    /// history, which other slots hold).
    unjudged: HashSet<String>,
    idle: Script,
    forget: Script,
    stats_clean: Script,
    /// When (the pass's `now`) the `stats:` families were last walked.
    stats_walked: Option<u64>,
    /// The precisions kept in blocks, with their cut and seconds kept: where sets' slices move.
    long: Vec<(u64, Geometry, u64)>,
    /// When (the pass's `now`) the sets' slices were last walked.
    sets_walked: Option<u64>,
    set_move: Script,
    set_drop: Script,
    /// The quantile precisions packed into blocks (`store::quantile_blocks`), with their
    /// seconds kept.
    packed: Vec<(u64, u64)>,
    /// `quantile_precisions`: of which `packed` is made.
    quantile_precisions: Vec<u64>,
    /// When (the pass's `now`) the quantile slices were last walked.
    hists_walked: Option<u64>,
    hist_seal: Script,
    hist_move: Script,
    hist_drop: Script,
    passes: u64,
    /// Per precision, the `now` of the last pass that walked both indexes with it due: every
    /// long archive's slice older than its hash kept then was moved by then (a quick visit asks
    /// only for the slices that have left the hash since: trim.lua).
    moved_at: HashMap<u64, u64>,
    /// The precisions of this pass's members so far.
    walked: HashSet<u64>,
    /// Whether the last lease call found the lease this agent's.
    holding: bool,
    clean: Script,
    clean_slot: Script,
    /// Cluster mode: members taken out of an index whose hash was not checked again yet.
    recheck: Vec<(Index, Vec<u8>)>,
    lease: Script,
    telemetry: Arc<Telemetry>,
}

impl Cleaner {
    pub fn new(
        store: Store,
        owner: String,
        interval: Duration,
        retention: &Retention,
        telemetry: Arc<Telemetry>,
    ) -> Cleaner {
        let mut cleaner = Cleaner {
            keys: store.keys().clone(),
            store,
            connection: Cached::default(),
            owner,
            interval,
            retention: String::new(),
            schemas: None,
            history: String::new(),
            precisions: Vec::new(),
            forget_secs: 86_400,
            unjudged: HashSet::new(),
            idle: Script::new(include_str!("idle.lua")),
            forget: Script::new(include_str!("forget.lua")),
            stats_clean: Script::new(include_str!("stats_clean.lua")),
            stats_walked: None,
            long: Vec::new(),
            sets_walked: None,
            set_move: Script::new(include_str!("set_move.lua")),
            set_drop: Script::new(include_str!("set_drop.lua")),
            packed: Vec::new(),
            quantile_precisions: Vec::new(),
            hists_walked: None,
            hist_seal: Script::new(include_str!("hist_seal.lua")),
            hist_move: Script::new(include_str!("hist_move.lua")),
            hist_drop: Script::new(include_str!("hist_drop.lua")),
            passes: 0,
            moved_at: HashMap::new(),
            walked: HashSet::new(),
            holding: false,
            clean: Script::new(concat!(
                include_str!("retention.lua"),
                include_str!("numbers.lua"),
                include_str!("history.lua"),
                include_str!("trim.lua"),
                include_str!("clean.lua")
            )),
            recheck: Vec::new(),
            clean_slot: Script::new(concat!(
                include_str!("retention.lua"),
                include_str!("numbers.lua"),
                include_str!("history.lua"),
                include_str!("trim.lua"),
                include_str!("clean_slot.lua")
            )),
            lease: Script::new(include_str!("lease.lua")),
            telemetry,
        };
        cleaner.keep(retention);
        cleaner
    }

    /// Gauges no agent wrote for `secs` lose their `gauges:` field (`forget_idle_secs`; a day
    /// unless set).
    pub fn forgetting(mut self, secs: u64) -> Cleaner {
        self.forget_secs = secs;
        self
    }

    /// Trims each hash to what its series' names' schemas keep (`storage_schemas`:
    /// [`Schemas::stored`], [`Retention::within`]); the blocks stay cut as the retention `new`
    /// took (every schema's longest) says.
    pub fn trimming(mut self, schemas: Schemas, namer: Namer) -> Cleaner {
        self.trim_by(schemas, namer);
        self
    }

    fn trim_by(&mut self, schemas: Schemas, namer: Namer) {
        self.schemas = (schemas.all().len() > 1).then(|| Trim {
            union: schemas.union(),
            schemas,
            namer,
            encoded: HashMap::new(),
        });
    }

    /// The due members of a batch of `index`, grouped by the retention (as the scripts take
    /// it) their series' names keep them for.
    fn by_schema<'m>(
        &mut self,
        index: &Index,
        due: Vec<&'m Vec<u8>>,
    ) -> Vec<(String, Vec<&'m Vec<u8>>)> {
        let Some(trim) = &mut self.schemas else {
            return (!due.is_empty())
                .then(|| (self.retention.clone(), due))
                .into_iter()
                .collect();
        };
        let family = if index.gauge {
            Family::Gauge
        } else {
            Family::Counter
        };
        let mut groups: HashMap<Vec<usize>, Vec<&Vec<u8>>> = HashMap::new();
        for m in due {
            let series = m
                .iter()
                .position(|b| *b == b':')
                .map_or(&m[..], |i| &m[i + 1..]);
            let series = String::from_utf8_lossy(series);
            let taken = trim.schemas.taken(&trim.namer, family, &series);
            groups.entry(taken).or_default().push(m);
        }
        groups
            .into_iter()
            .map(|(indexes, members)| {
                let encoded = trim.encoded.entry(indexes).or_insert_with_key(|indexes| {
                    trim.schemas.stored_by(indexes).within(&trim.union).encode()
                });
                (encoded.clone(), members)
            })
            .collect()
    }

    /// Packs the quantile slices at `precisions` (`quantile_precisions`) that `retention`
    /// keeps long into blocks ([`Retention::packs_quantiles`]).
    pub fn packing(mut self, precisions: &[u64], retention: &Retention) -> Cleaner {
        self.quantile_precisions = precisions.to_vec();
        self.keep(retention);
        self
    }

    /// Takes `retention` (the agent's: what is written, where blocks are cut) for everything
    /// the cleaner derives from it.
    fn keep(&mut self, retention: &Retention) {
        self.retention = retention.encode();
        self.history = retention.encode_history();
        // Other cuts: every hash read whole once.
        self.moved_at.clear();
        self.precisions = retention.precisions();
        self.precisions.sort_unstable();
        self.long = (retention.precisions().into_iter())
            .filter_map(|p| Some((p, retention.history(p)?, retention.seconds(p))))
            .collect();
        self.packed = (self.quantile_precisions.iter())
            .filter(|&&p| retention.packs_quantiles(p))
            .map(|&p| (p, retention.seconds(p)))
            .collect();
    }

    async fn connection(&mut self) -> Result<Connection, StoreError> {
        Ok(self.connection.get(&self.store).await?.0)
    }

    /// Forgets the connection after an error so the next call reconnects.
    fn failed<T>(&mut self, r: Result<T, StoreError>) -> Result<T, StoreError> {
        if r.is_err() {
            self.connection.forget();
            self.telemetry.redis_errors.increment(1);
        }
        r
    }

    /// The lease lives one interval: a dead holder is replaced within one interval and a tick.
    fn lease_ms(&self) -> u64 {
        self.interval.as_millis().max(1000) as u64
    }

    async fn lease_call(&mut self, action: &str) -> Result<bool, StoreError> {
        let mut conn = self.connection().await?;
        let r = self
            .lease
            .key(self.keys.cleaner_lock())
            .arg(&self.owner)
            .arg(self.lease_ms())
            .arg(action)
            .invoke_async::<i64>(&mut conn)
            .await
            .map_err(StoreError::from);
        self.failed(r).map(|held| held == 1)
    }

    /// Takes the lease if it is free, renews it if it is ours; false while another agent has it.
    pub async fn hold_lease(&mut self) -> Result<bool, StoreError> {
        let held = self.lease_call("hold").await?;
        if held && !self.holding {
            // Another agent's passes cleaned meanwhile, maybe under another retention: every
            // hash read whole once.
            self.moved_at.clear();
        }
        self.holding = held;
        self.telemetry
            .cleaner_lease_held
            .set(if held { 1.0 } else { 0.0 });
        Ok(held)
    }

    /// Gives the lease up (if ours) so another agent can take over at once.
    pub async fn release_lease(&mut self) -> Result<(), StoreError> {
        self.lease_call("release").await?;
        self.holding = false;
        self.telemetry.cleaner_lease_held.set(0.0);
        Ok(())
    }

    /// Whether this pass checks `precision`: every `max(1, precision / interval)` passes.
    fn due(&self, precision: u64) -> bool {
        self.passes
            .is_multiple_of(passes_between(precision, self.interval.as_secs()))
    }

    /// The most fields a hash of `retention` holds with this cleaner's cadence: its precision's
    /// count, the slices that arrive between two of the cleaner's visits, and the one being
    /// written (what `hash-max-listpack-entries` must allow for the hashes to stay listpacks).
    pub fn most_fields(retention: &Retention, interval: Duration) -> u64 {
        let interval = interval.as_secs().max(1);
        retention
            .archives()
            .iter()
            .map(|a| {
                let between = passes_between(a.precision, interval) * interval;
                // A long archive's hash keeps its newest slices; the rest are in blocks.
                let kept = match retention.history(a.precision) {
                    Some(_) => a.count.min(crate::store::history::HASH_SLICES),
                    None => a.count,
                };
                kept + between.div_ceil(a.precision) + 1
            })
            .max()
            .unwrap_or(0)
    }

    /// One pass over both indexes as of `now` (epoch seconds), renewing the lease per batch.
    /// The caller must hold the lease.
    pub async fn pass(&mut self, now: u64) -> Result<PassReport, StoreError> {
        let started = Instant::now();
        let mut report = PassReport::default();
        if !self.recheck.is_empty() {
            let mut conn = self.connection().await?;
            let r = self.recheck(&mut conn).await;
            report.hashes_removed += self.failed(r)?;
        }
        self.walked.clear();
        let indexes = self
            .clean_index(&self.keys.counter_index(), now, &mut report)
            .await?
            && self
                .clean_index(&self.keys.gauge_index(), now, &mut report)
                .await?;
        if indexes {
            for p in std::mem::take(&mut self.walked) {
                self.moved_at.insert(p, now);
            }
        }
        report.completed = indexes
            && self.clean_gauges(now, &mut report).await?
            && self.walk(Walk::Stats, now, &mut report).await?
            && self.walk(Walk::Sets, now, &mut report).await?
            && self.walk(Walk::Hists, now, &mut report).await?
            && self.clean_slowest(&mut report).await?;
        self.passes += 1;
        let t = &self.telemetry;
        t.cleaner_passes.increment(1);
        t.cleaner_members_visited.increment(report.members_visited);
        t.cleaner_slices_removed.increment(report.slices_removed);
        t.cleaner_slices_moved.increment(report.slices_moved);
        t.cleaner_counters_removed.increment(report.hashes_removed);
        t.cleaner_gauges_removed.increment(report.gauges_removed);
        t.cleaner_slowest_removed.increment(report.slowest_removed);
        t.cleaner_stats_removed.increment(report.stats_removed);
        t.cleaner_pass_duration
            .record(started.elapsed().as_secs_f64());
        Ok(report)
    }

    /// The quick visits of this pass (trim.lua): `precision:since` of each precision moved by
    /// an earlier pass, none every [`FULL_EVERY`] passes (each hash read whole: the late slices
    /// older than a quick visit asks for moved, the slices past the retention deleted).
    fn quick(&self) -> String {
        if self.passes.is_multiple_of(FULL_EVERY) {
            return String::new();
        }
        let pairs: Vec<String> = (self.moved_at.iter())
            .map(|(p, since)| format!("{p}:{since}"))
            .collect();
        pairs.join(",")
    }

    /// Walks `index` in lexicographic order (all scores are 0), a batch per round trip.
    /// Returns false if the lease was lost.
    async fn clean_index(
        &mut self,
        index: &Index,
        now: u64,
        report: &mut PassReport,
    ) -> Result<bool, StoreError> {
        let mut after: Vec<u8> = b"-".to_vec();
        loop {
            if !self.hold_lease().await? {
                return Ok(false);
            }
            let mut conn = self.connection().await?;
            let r = redis::cmd("ZRANGEBYLEX")
                .arg(&index.key)
                .arg(&after)
                .arg("+")
                .arg("LIMIT")
                .arg(0)
                .arg(BATCH_MEMBERS)
                .query_async::<Vec<Vec<u8>>>(&mut conn)
                .await
                .map_err(StoreError::from);
            let members = self.failed(r)?;
            let Some(last) = members.last() else {
                return Ok(true);
            };
            after = [b"(".as_slice(), last].concat();
            report.members_visited += members.len() as u64;
            let due: Vec<&Vec<u8>> = members
                .iter()
                .filter(|m| precision_of(m).is_none_or(|p| self.due(p)))
                .collect();
            self.walked
                .extend(due.iter().filter_map(|m| precision_of(m)));
            let quick = self.quick();
            for (retention, due) in self.by_schema(index, due) {
                let r = if self.store.is_cluster() {
                    self.clean_slots(&mut conn, index, (now, &retention, &quick), &due)
                        .await
                } else {
                    self.clean
                        .arg(&index.key)
                        .arg(&index.hash_prefix)
                        .arg(now)
                        .arg(&retention)
                        .arg(&self.history)
                        .arg(&index.block_prefix)
                        .arg(u8::from(index.gauge))
                        .arg(&quick)
                        .arg(due)
                        .invoke_async::<(u64, u64, u64)>(&mut conn)
                        .await
                        .map_err(StoreError::from)
                };
                let (slices, removed, moved) = self.failed(r)?;
                report.slices_removed += slices;
                report.slices_moved += moved;
                report.hashes_removed += removed;
            }
            if members.len() < BATCH_MEMBERS {
                return Ok(true);
            }
        }
    }

    /// `clean.lua`'s work in a cluster, where the index and the hashes live in different slots:
    /// each slot's hashes trimmed by one `clean_slot.lua` call, the members of the hashes that
    /// are gone removed from the index, then each such hash checked again and its member put
    /// back if a writer made it anew meanwhile. A writer's new slice either came before that
    /// check (seen) or after it (the writer's own follow-up adds the member, after its chunk).
    async fn clean_slots(
        &mut self,
        conn: &mut Connection,
        index: &Index,
        (now, retention, quick): (u64, &str, &str),
        members: &[&Vec<u8>],
    ) -> Result<(u64, u64, u64), StoreError> {
        let hash = |m: &[u8]| [index.hash_prefix.as_bytes(), m].concat();
        let mut by_slot: HashMap<u16, Vec<Vec<u8>>> = HashMap::new();
        for m in members {
            by_slot
                .entry(keys::slot_of(&hash(m)))
                .or_default()
                .push(m.to_vec());
        }
        let calls = by_slot.into_values().map(|members| {
            let hashes = members.iter().map(|m| hash(m)).collect();
            let settings = SlotSettings {
                now,
                retention,
                history: &self.history,
                quick,
                keys: &self.keys,
                gauge: index.gauge,
            };
            clean_slot(
                conn.clone(),
                self.clean_slot.clone(),
                hashes,
                members,
                settings,
            )
        });
        let results: Vec<Result<SlotCleaned, StoreError>> = futures_util::stream::iter(calls)
            .buffer_unordered(CONCURRENT_SLOTS)
            .collect()
            .await;
        let (mut slices, mut gone, mut moved) = (0, Vec::new(), 0);
        for r in results {
            let (s, g, m) = r?;
            slices += s;
            moved += m;
            gone.extend(g);
        }
        if gone.is_empty() {
            return Ok((slices, 0, moved));
        }
        // Remembered before they leave the index: a re-check cut short (an error, a lost
        // connection) goes on at the next pass instead of leaving a live hash unindexed.
        self.recheck
            .extend(gone.iter().map(|m| (index.clone(), m.clone())));
        redis::cmd("ZREM")
            .arg(&index.key)
            .arg(&gone)
            .query_async::<()>(conn)
            .await?;
        Ok((slices, self.recheck(conn).await?, moved))
    }

    /// Checks each member taken out of its index again: its hash made anew meanwhile puts it
    /// back. Returns how many stay out.
    async fn recheck(&mut self, conn: &mut Connection) -> Result<u64, StoreError> {
        let mut removed = 0;
        while let Some((index, member)) = self.recheck.last() {
            let hash = [index.hash_prefix.as_bytes(), member].concat();
            let exists: bool = redis::cmd("EXISTS").arg(hash).query_async(conn).await?;
            if exists {
                redis::cmd("ZADD")
                    .arg(&index.key)
                    .arg("0")
                    .arg(member)
                    .query_async::<()>(conn)
                    .await?;
            } else {
                removed += 1;
            }
            self.recheck.pop();
        }
        Ok(removed)
    }

    /// Walks `gauges:` (`HSCAN`, a batch per round trip) and removes the field of every gauge
    /// no agent wrote for `forget_secs`, judged from its history. Returns false if the lease
    /// was lost.
    async fn clean_gauges(
        &mut self,
        now: u64,
        report: &mut PassReport,
    ) -> Result<bool, StoreError> {
        let key = self.keys.gauges();
        let mut unjudged = HashSet::new();
        let mut cursor = 0u64;
        loop {
            let mut conn = self.connection().await?;
            let r = redis::cmd("HSCAN")
                .arg(&key)
                .arg(cursor)
                .arg("COUNT")
                .arg(BATCH_MEMBERS)
                .query_async::<(u64, Vec<Vec<u8>>)>(&mut conn)
                .await
                .map_err(StoreError::from);
            let (next, flat) = self.failed(r)?;
            // A field that is not UTF-8 is no series of ours: left alone. A hash kept as a
            // listpack answers whole, whatever COUNT says: judged a batch at a time.
            let fields: Vec<(String, Vec<u8>)> = flat
                .chunks_exact(2)
                .filter_map(|kv| Some((String::from_utf8(kv[0].clone()).ok()?, kv[1].clone())))
                .collect();
            for batch in fields.chunks(BATCH_MEMBERS) {
                if !self.hold_lease().await? {
                    return Ok(false);
                }
                let r = self
                    .forget_idle(&mut conn, &key, now, batch, &mut unjudged)
                    .await;
                report.gauges_removed += self.failed(r)?;
            }
            if next == 0 {
                self.unjudged = unjudged;
                return Ok(true);
            }
            cursor = next;
        }
    }

    /// Removes the `gauges:` fields of the idle gauges among `fields` (series and the value
    /// read); returns how many stay removed. The removal takes a field only while it holds the
    /// value read, and a gauge found written again just after is put back: a field is never
    /// lost to a gauge that an agent still writes.
    async fn forget_idle(
        &self,
        conn: &mut Connection,
        key: &str,
        now: u64,
        fields: &[(String, Vec<u8>)],
        unjudged: &mut HashSet<String>,
    ) -> Result<u64, StoreError> {
        let series: Vec<&str> = fields.iter().map(|(s, _)| s.as_str()).collect();
        let verdicts = self.judge(conn, now, &series).await?;
        let mut idle = Vec::new();
        for ((series, value), verdict) in fields.iter().zip(verdicts) {
            match verdict {
                Written::Lately => {}
                Written::Before => idle.push((series, value)),
                Written::Unknown if self.unjudged.contains(series) => idle.push((series, value)),
                Written::Unknown => {
                    unjudged.insert(series.clone());
                }
            }
        }
        if idle.is_empty() {
            return Ok(0);
        }
        let mut call = self.forget.prepare_invoke();
        call.key(key);
        for (series, value) in &idle {
            call.arg(series).arg(value);
        }
        let removed: Vec<String> = call.invoke_async(conn).await?;
        let removed: Vec<&str> = removed.iter().map(String::as_str).collect();
        let again = self.judge(conn, now, &removed).await?;
        let mut gone = 0;
        for (series, verdict) in removed.iter().zip(again) {
            if verdict != Written::Lately {
                gone += 1;
            } else if let Some((_, value)) = idle.iter().find(|(s, _)| s == series) {
                redis::cmd("HSETNX")
                    .arg(key)
                    .arg(series)
                    .arg(value)
                    .query_async::<()>(conn)
                    .await?;
            }
        }
        Ok(gone)
    }

    /// When each gauge of `series` was last written, as its history shows: the finest
    /// precision that still has its hash decides.
    async fn judge(
        &self,
        conn: &Connection,
        now: u64,
        series: &[&str],
    ) -> Result<Vec<Written>, StoreError> {
        let mut verdicts = vec![Written::Unknown; series.len()];
        let mut open: Vec<usize> = (0..series.len()).collect();
        for &p in &self.precisions {
            if open.is_empty() {
                break;
            }
            let hashes: Vec<(String, u64)> = open
                .iter()
                .map(|&i| (self.keys.gauge(p, series[i]), p))
                .collect();
            let found = self.idle_verdicts(conn, now, &hashes).await?;
            open = open
                .into_iter()
                .zip(found)
                .filter_map(|(i, v)| {
                    verdicts[i] = match v {
                        0 => Written::Lately,
                        1 => Written::Before,
                        _ => return Some(i),
                    };
                    None
                })
                .collect();
        }
        Ok(verdicts)
    }

    /// `idle.lua` over `hashes` (each with its precision): one call on one server, a call per
    /// slot in a cluster; a verdict per hash, in their order.
    async fn idle_verdicts(
        &self,
        conn: &Connection,
        now: u64,
        hashes: &[(String, u64)],
    ) -> Result<Vec<i64>, StoreError> {
        let mut by_slot: HashMap<u16, Vec<usize>> = HashMap::new();
        for (i, (hash, _)) in hashes.iter().enumerate() {
            let slot = if self.store.is_cluster() {
                keys::slot_of(hash.as_bytes())
            } else {
                0
            };
            by_slot.entry(slot).or_default().push(i);
        }
        let calls = by_slot.into_values().map(|positions| {
            let mut conn = conn.clone();
            let mut call = self.idle.prepare_invoke();
            call.arg(now).arg(self.forget_secs);
            for &i in &positions {
                call.key(&hashes[i].0).arg(hashes[i].1);
            }
            async move {
                let verdicts: Vec<i64> = call.invoke_async(&mut conn).await?;
                Ok::<_, StoreError>((positions, verdicts))
            }
        });
        let results: Vec<Result<_, StoreError>> = futures_util::stream::iter(calls)
            .buffer_unordered(CONCURRENT_SLOTS)
            .collect()
            .await;
        let mut verdicts = vec![2; hashes.len()];
        for r in results {
            let (positions, found) = r?;
            for (i, v) in positions.into_iter().zip(found) {
                verdicts[i] = v;
            }
        }
        Ok(verdicts)
    }

    /// Removes the `slowest:AccessTime` members whose hour's statistics are gone (deleted a
    /// full hour after their hour); one written again meanwhile is put back with its hour's
    /// average. Returns false if the lease was lost.
    async fn clean_slowest(&mut self, report: &mut PassReport) -> Result<bool, StoreError> {
        if !self.hold_lease().await? {
            return Ok(false);
        }
        let mut conn = self.connection().await?;
        let r = self.remove_slowest(&mut conn).await;
        report.slowest_removed += self.failed(r)?;
        Ok(true)
    }

    async fn remove_slowest(&self, conn: &mut Connection) -> Result<u64, StoreError> {
        let key = self.keys.slowest();
        let members: Vec<Vec<u8>> = redis::cmd("ZRANGE")
            .arg(&key)
            .arg(0)
            .arg(-1)
            .query_async(conn)
            .await?;
        let series: Vec<String> = members
            .into_iter()
            .filter_map(|m| String::from_utf8(m).ok())
            .collect();
        let stats = |s: &String| self.keys.stats(s, StatKind::Timer);
        let present = exist(conn, series.iter().map(stats).collect()).await?;
        let gone: Vec<&String> = series
            .iter()
            .zip(present)
            .filter(|(_, present)| !present)
            .map(|(s, _)| s)
            .collect();
        if gone.is_empty() {
            return Ok(0);
        }
        redis::cmd("ZREM")
            .arg(&key)
            .arg(&gone)
            .query_async::<()>(conn)
            .await?;
        let present = exist(conn, gone.iter().map(|s| stats(s)).collect()).await?;
        let back: Vec<String> = gone
            .iter()
            .zip(&present)
            .filter(|(_, present)| **present)
            .map(|(s, _)| stats(s))
            .collect();
        let averages = super::write::read_averages(conn, &self.keys, &back).await?;
        if !averages.is_empty() {
            let mut zadd = redis::cmd("ZADD");
            zadd.arg(&key);
            for (series, average) in &averages {
                zadd.arg(*average).arg(series);
            }
            zadd.query_async::<()>(conn).await?;
        }
        Ok((gone.len() - averages.len()) as u64)
    }

    /// Every few minutes (of the pass's `now`), walks the key space (`SCAN`, on every master of
    /// a cluster) for one of [`Walk`]'s families. Returns false if the lease was lost.
    async fn walk(
        &mut self,
        walk: Walk,
        now: u64,
        report: &mut PassReport,
    ) -> Result<bool, StoreError> {
        let (pattern, last, every) = match walk {
            Walk::Stats => (
                self.keys.stats_pattern(),
                self.stats_walked,
                STATS_WALK_SECS,
            ),
            Walk::Sets if self.long.is_empty() => return Ok(true),
            Walk::Sets => (
                self.keys.set_pattern(),
                self.sets_walked,
                history::SET_WALK_SECS,
            ),
            Walk::Hists if self.packed.is_empty() => return Ok(true),
            Walk::Hists => (
                self.keys.hist_pattern(),
                self.hists_walked,
                quantile_blocks::WALK_SECS,
            ),
        };
        if last.is_some_and(|at| now < at + every && now >= at) {
            return Ok(true);
        }
        let mut conn = self.connection().await?;
        let r = conn.masters().await;
        for node in self.failed(r)? {
            let mut cursor = 0;
            loop {
                if !self.hold_lease().await? {
                    return Ok(false);
                }
                let mut conn = self.connection().await?;
                let r = conn.scan_page(&node, cursor, &pattern).await;
                let (next, keys) = self.failed(r)?;
                match walk {
                    Walk::Stats => {
                        let r = self.clean_families(&conn, now, keys).await;
                        report.stats_removed += self.failed(r)?;
                    }
                    Walk::Sets => {
                        let r = self.move_sets(&conn, now, keys).await;
                        report.slices_moved += self.failed(r)?;
                    }
                    Walk::Hists => {
                        let r = self.pack_hists(&conn, now, keys).await;
                        report.slices_moved += self.failed(r)?;
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        match walk {
            Walk::Stats => self.stats_walked = Some(now),
            Walk::Sets => self.sets_walked = Some(now),
            Walk::Hists => self.hists_walked = Some(now),
        }
        Ok(true)
    }

    /// Moves each of `keys` that is a set's slice of a long archive, older than
    /// [`history::set_keep_from`], into its block: its count (`PFCOUNT`) into its slot
    /// (`set_move.lua`, in the block's slot), then its HyperLogLog deleted unless it counts more
    /// by then (`set_drop.lua`, in its own slot); each step repeated changes nothing, so a pass
    /// stopped between them loses nothing. Concurrently. Returns how many slices moved.
    async fn move_sets(
        &self,
        conn: &Connection,
        now: u64,
        keys: Vec<String>,
    ) -> Result<u64, StoreError> {
        let moves = keys.into_iter().filter_map(|key| {
            let (p, series, slice) = self.keys.set_of(&key)?;
            let &(_, geometry, kept) = self.long.iter().find(|l| l.0 == p)?;
            if slice >= history::set_keep_from(now, p) || slice + kept <= now {
                return None;
            }
            let (block, slot) = geometry.locate(p, slice);
            let name = self.keys.set_series(p, series);
            let block_key = history::block_key(&self.keys, &name, geometry, block);
            let ttl = geometry.expires_in(p, block, kept, now);
            let mut put = self.set_move.prepare_invoke();
            put.key(block_key).arg(slot).arg(geometry.slots).arg(ttl);
            let mut drop = self.set_drop.prepare_invoke();
            drop.key(&key);
            let mut conn = conn.clone();
            Some(async move {
                let count = match redis::cmd("PFCOUNT")
                    .arg(&key)
                    .query_async::<u64>(&mut conn)
                    .await
                {
                    Ok(n) => n,
                    // Another program's key under a set's name: left as it is.
                    Err(e) if e.code().is_some() => return Ok(0),
                    Err(e) => return Err(e),
                };
                if count == 0 {
                    return Ok(0);
                }
                let (held, stored): (i64, u64) = put.arg(count).invoke_async(&mut conn).await?;
                if held < 0 {
                    // Another program's key under the block's name: the slice stays.
                    return Ok(0);
                }
                drop.arg(stored).invoke_async::<u64>(&mut conn).await
            })
        });
        summed(moves).await
    }

    /// Packs each of `keys` that is a quantile slice of a packed precision, older than
    /// [`quantile_blocks::keep_from`], into its block: the hashes sealed with a token each
    /// (`hist_seal.lua`, a call for a slot's: all of them on one server), each block's records
    /// written (`hist_move.lua`, a call a block), then the hashes deleted that still hold what
    /// moved (`hist_drop.lua`, a call for a slot's); each step repeated changes nothing, so a
    /// pass stopped between them loses nothing and counts nothing twice. Returns how many
    /// slices moved.
    async fn pack_hists(
        &self,
        conn: &Connection,
        now: u64,
        keys: Vec<String>,
    ) -> Result<u64, StoreError> {
        let mut slices: Vec<Packing> = Vec::new();
        for key in keys {
            let Some((p, series, kind, slice)) = self.keys.hist_of(&key) else {
                continue;
            };
            let Some(&(_, kept)) = self.packed.iter().find(|l| l.0 == p) else {
                continue;
            };
            if slice >= quantile_blocks::keep_from(now, p) || slice + kept <= now {
                continue;
            }
            let (n, slot) = quantile_blocks::locate(p, slice);
            slices.push(Packing {
                block: quantile_blocks::block_key(&self.keys, p, series, kind, n),
                expires_at: quantile_blocks::expires_at(p, n, kept),
                slot,
                fields: Vec::new(),
                key,
            });
        }
        // Sealed: each slice's fields (none for a key that is no hash by now).
        let seals = self
            .by_slot(&slices, 0..slices.len())
            .into_iter()
            .map(|positions| {
                let mut call = self.hist_seal.prepare_invoke();
                for &i in &positions {
                    let token = quantile_blocks::token_text(rand::random());
                    call.key(&slices[i].key).arg(token);
                }
                let mut conn = conn.clone();
                async move {
                    let sealed: Vec<Option<Vec<(String, String)>>> =
                        call.invoke_async(&mut conn).await?;
                    Ok::<_, StoreError>((positions, sealed))
                }
            });
        let sealed: Vec<Result<_, StoreError>> = futures_util::stream::iter(seals)
            .buffer_unordered(CONCURRENT_SLOTS)
            .collect()
            .await;
        for r in sealed {
            let (positions, fields) = r?;
            for (i, fields) in positions.into_iter().zip(fields) {
                slices[i].fields = fields.unwrap_or_default();
            }
        }
        // Written: each block's records, a call a block.
        let mut blocks: HashMap<&str, Vec<usize>> = HashMap::new();
        for (i, s) in slices.iter().enumerate() {
            blocks.entry(&s.block).or_default().push(i);
        }
        let moves = blocks
            .into_values()
            .filter_map(|positions| self.pack_block(conn.clone(), &slices, positions));
        let moved: Vec<Result<Vec<usize>, StoreError>> = futures_util::stream::iter(moves)
            .buffer_unordered(CONCURRENT_SLOTS)
            .collect()
            .await;
        let mut written = Vec::new();
        for r in moved {
            written.extend(r?);
        }
        // Deleted: each hash that still holds what its record holds.
        let drops = self.by_slot(&slices, written).into_iter().map(|positions| {
            let mut call = self.hist_drop.prepare_invoke();
            for &i in &positions {
                let s = &slices[i];
                call.key(&s.key).arg(s.fields.len() * 2);
                for (f, v) in &s.fields {
                    call.arg(f).arg(v);
                }
            }
            let mut conn = conn.clone();
            async move { call.invoke_async::<u64>(&mut conn).await }
        });
        summed(drops).await
    }

    /// The `positions` of `slices` grouped for one script call each: by slot in a cluster, all
    /// together on one server, at most [`PACK_BATCH`] a call.
    fn by_slot(
        &self,
        slices: &[Packing],
        positions: impl IntoIterator<Item = usize>,
    ) -> Vec<Vec<usize>> {
        let mut by_slot: HashMap<u16, Vec<usize>> = HashMap::new();
        for i in positions {
            let slot = if self.store.is_cluster() {
                keys::slot_of(slices[i].key.as_bytes())
            } else {
                0
            };
            by_slot.entry(slot).or_default().push(i);
        }
        by_slot
            .into_values()
            .flat_map(|p| {
                p.chunks(PACK_BATCH)
                    .map(<[usize]>::to_vec)
                    .collect::<Vec<_>>()
            })
            .collect()
    }

    /// The `hist_move.lua` call for one block's sealed `slices` at `positions`, answering the
    /// positions written; None when none is sealed. A block holds one accuracy: slices of
    /// another wait out their retention as hashes.
    fn pack_block<'s>(
        &'s self,
        mut conn: Connection,
        slices: &[Packing],
        positions: Vec<usize>,
    ) -> Option<impl std::future::Future<Output = Result<Vec<usize>, StoreError>> + use<'s>> {
        let alpha_of = |i: &usize| {
            let fields = &slices[*i].fields;
            fields
                .iter()
                .find(|(f, _)| f == "a")
                .map(|(_, v)| v.clone())
        };
        let alpha = positions.iter().find_map(alpha_of)?;
        let mut call = self.hist_move.prepare_invoke();
        let first = &slices[positions[0]];
        call.key(&first.block)
            .arg(quantile_blocks::header(&alpha))
            .arg(first.expires_at);
        let mut written = Vec::new();
        for i in positions {
            let s = &slices[i];
            let token = s
                .fields
                .iter()
                .find(|(f, _)| f == quantile_blocks::TOKEN_FIELD);
            let (Some(token), Some((_, buckets))) = (
                token.and_then(|(_, t)| quantile_blocks::token_of(t)),
                super::reader::parse_buckets(&s.fields),
            ) else {
                continue;
            };
            if alpha_of(&i).as_ref() != Some(&alpha) {
                continue;
            }
            call.arg(quantile_blocks::record(s.slot, token, &buckets));
            written.push(i);
        }
        Some(async move {
            let n: i64 = call.invoke_async(&mut conn).await?;
            // Another program's key, or a block of another accuracy: the hashes stay.
            Ok(if n < 0 { Vec::new() } else { written })
        })
    }

    /// `stats_clean.lua` on the family of each of `keys` that is one of the hourly statistics'
    /// (a call a family, concurrently: a family's keys share a slot, not those of several).
    async fn clean_families(
        &self,
        conn: &Connection,
        now: u64,
        keys: Vec<String>,
    ) -> Result<u64, StoreError> {
        let families: HashSet<[String; 4]> = keys
            .iter()
            .filter_map(|key| self.keys.stats_family_of(key))
            .collect();
        let calls = families.into_iter().map(|family| {
            let mut conn = conn.clone();
            let mut call = self.stats_clean.prepare_invoke();
            for key in family {
                call.key(key);
            }
            call.arg(now);
            async move { call.invoke_async::<u64>(&mut conn).await }
        });
        summed(calls).await
    }

    /// Cleans until `stop`: a pass at start-up and then about every interval while this agent
    /// holds the lease; otherwise it tries for the lease every quarter interval. Each pass is
    /// as of `clock`'s time.
    pub async fn run(
        mut self,
        clock: Clock,
        stop: CancellationToken,
        mut reloads: Option<tokio::sync::watch::Receiver<crate::config::Config>>,
    ) {
        let mut last_pass: Option<Instant> = None;
        loop {
            // A SIGHUP's cleaner_interval_secs and storage_schemas apply from the next pass on.
            if let Some(r) = reloads
                .as_mut()
                .filter(|r| r.has_changed().unwrap_or(false))
            {
                let new = r.borrow_and_update();
                self.interval = Duration::from_secs(new.cleaner_interval_secs);
                if new.schemas.is_some() {
                    self.keep(&new.retention());
                    self.trim_by(new.schemas(), Namer::new(&new));
                }
            }
            let tick = (self.interval / 4).max(Duration::from_millis(100));
            match self.hold_lease().await {
                Ok(true) if last_pass.is_none_or(|t| t.elapsed() >= self.interval) => {
                    last_pass = Some(Instant::now());
                    match self.pass(clock.unix_now()).await {
                        Ok(r) => tracing::debug!(?r, "cleaner pass"),
                        Err(e) => tracing::warn!(error = %e, "cleaner pass failed"),
                    }
                }
                Ok(true) => {}
                Ok(false) => last_pass = None,
                Err(e) => tracing::warn!(error = %e, "cleaner cannot reach Redis"),
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(tick) => {}
            }
        }
        if let Err(e) = self.release_lease().await {
            tracing::warn!(error = %e, "cleaner could not release its lease; it expires by itself");
        }
    }
}

/// Quantile slices sealed or deleted in one script call, at most.
const PACK_BATCH: usize = 256;

/// A quantile slice on its way into its block ([`Cleaner::pack_hists`]).
struct Packing {
    key: String,
    block: String,
    expires_at: u64,
    slot: u8,
    /// Its hash's fields and values as sealed.
    fields: Vec<(String, String)>,
}

/// What a walk of the key space looks for.
#[derive(Debug, Clone, Copy)]
enum Walk {
    /// The hourly statistics' families whose hour and the next are over.
    Stats,
    /// A long archive's set slices past `history::SET_OPEN_SECS`.
    Sets,
    /// A long archive's quantile slices past `quantile_blocks::OPEN_SECS`.
    Hists,
}

/// When a gauge was last written, as its history tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Written {
    /// Within the last `forget_idle_secs`, or maybe so.
    Lately,
    /// Longer ago.
    Before,
    /// Its history holds nothing at any precision.
    Unknown,
}

/// The counts `calls` answer, added, [`CONCURRENT_SLOTS`] of them at a time.
async fn summed(
    calls: impl Iterator<Item = impl std::future::Future<Output = redis::RedisResult<u64>>>,
) -> Result<u64, StoreError> {
    let answers: Vec<redis::RedisResult<u64>> = futures_util::stream::iter(calls)
        .buffer_unordered(CONCURRENT_SLOTS)
        .collect()
        .await;
    let mut n = 0;
    for a in answers {
        n += a?;
    }
    Ok(n)
}

/// Whether each of `keys` exists (`EXISTS` each, concurrently: in a cluster they live on any
/// node).
async fn exist(conn: &Connection, keys: Vec<String>) -> Result<Vec<bool>, StoreError> {
    let replies: Vec<(usize, Result<bool, redis::RedisError>)> =
        futures_util::stream::iter(keys.into_iter().enumerate())
            .map(|(i, key)| {
                let mut conn = conn.clone();
                async move {
                    (
                        i,
                        redis::cmd("EXISTS").arg(key).query_async(&mut conn).await,
                    )
                }
            })
            .buffer_unordered(CONCURRENT_SLOTS)
            .collect()
            .await;
    let mut present = vec![false; replies.len()];
    for (i, r) in replies {
        present[i] = r?;
    }
    Ok(present)
}

/// Slices removed, and the members whose hash is gone.
/// Every how many passes the hashes of `precision` are trimmed: a coarse precision gains a slice
/// in many passes' time, so it is looked at once per its precision.
fn passes_between(precision: u64, interval_secs: u64) -> u64 {
    (precision / interval_secs.max(1)).max(1)
}

type SlotCleaned = (u64, Vec<Vec<u8>>, u64);

/// What every `clean_slot.lua` call of one batch is given besides its hashes.
struct SlotSettings<'a> {
    now: u64,
    retention: &'a str,
    history: &'a str,
    quick: &'a str,
    keys: &'a Keys,
    gauge: bool,
}

/// One `clean_slot.lua` call over `hashes` (of one slot, indexed as `members`); returns the
/// slices removed, the members whose hash is gone and the slices moved into blocks.
async fn clean_slot(
    mut conn: Connection,
    script: Script,
    hashes: Vec<Vec<u8>>,
    members: Vec<Vec<u8>>,
    s: SlotSettings<'_>,
) -> Result<SlotCleaned, StoreError> {
    let mut call = script.prepare_invoke();
    call.arg(s.now)
        .arg(s.retention)
        .arg(s.history)
        .arg(u8::from(s.gauge))
        .arg(s.quick);
    for (hash, m) in hashes.iter().zip(&members) {
        let base = s.keys.history_base(&String::from_utf8_lossy(hash));
        call.key(hash).arg(precision_of(m).unwrap_or(0)).arg(base);
    }
    let (slices, gone, moved): (u64, Vec<usize>, u64) = call.invoke_async(&mut conn).await?;
    let gone = gone
        .into_iter()
        .filter_map(|k| members.get(k.checked_sub(1)?).cloned())
        .collect();
    Ok((slices, gone, moved))
}

/// What the cleaner trims each series to under `storage_schemas` ([`Cleaner::trimming`]).
struct Trim {
    schemas: Schemas,
    namer: Namer,
    /// Every schema's precisions, as long as the longest keeps each.
    union: Retention,
    /// The retention, as the scripts take it, of each combination of schemas met.
    encoded: HashMap<Vec<usize>, String>,
}

/// The precision of a `<precision>:<series>` member.
fn precision_of(member: &[u8]) -> Option<u64> {
    let end = member.iter().position(|b| *b == b':')?;
    std::str::from_utf8(&member[..end]).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn precision_of_members() {
        assert_eq!(precision_of(b"86400:a;b=c"), Some(86400));
        assert_eq!(precision_of(b"x:a"), None);
        assert_eq!(precision_of(b"60"), None);
    }
}
