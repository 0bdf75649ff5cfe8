//! One server's writes (standalone, or the master Sentinel names): each flush chunk is one
//! `MULTI`/`EXEC` of bare commands — the seven `HINCRBY`s of each counter, a gauge's `HSET`s and
//! their index members — beside one `flush.lua` call for the rest of the chunk (statistics,
//! buckets, sets, logs), and the check that makes it exactly once is made by the agent.
//!
//! # Why a chunk is applied exactly once
//!
//! The guard is the hash `flush:`: per run (field `<agent id>.<run>`) the number of its last
//! chunk applied and Redis's time then. A chunk goes out in two steps on one connection:
//!
//! 1. **The check**: `WATCH <run's watch key>`, `HGET flush: <run>`, `TIME`. The agent decides
//!    from the number read: above the chunk's, or equal, it was applied before (a lost reply, a
//!    late copy); below, it is applied now; missing, the run is new here, or the guard was lost
//!    with Redis's data (apply again: the data went with it) or evicted (a chunk that may have
//!    been applied is dropped, never applied twice).
//! 2. **The transaction**: `MULTI`, the chunk's writes, `HSET flush: <run> "<number> <time>"`,
//!    `SET` and `DEL` of the run's watch key, `EXEC`.
//!
//! Every connection that applies a chunk of the run touches the run's watch key in its `EXEC`.
//! `WATCH` makes an `EXEC` run only when no other connection touched the key since this
//! connection's `WATCH`, and the check's `WATCH` comes before its `HGET`, which comes before the
//! agent's decision. So an `EXEC` runs only if the number the agent decided on is still the
//! guard's number: a copy held up on an old connection and delivered after its retry was
//! applied finds its `WATCH` broken and does nothing (`EXEC` answers nil). A chunk is applied
//! only above the run's last number, which it then becomes, and numbers only grow: no copy is
//! applied twice. The chunks of a call go in order, each only after the one before it was
//! acknowledged (or, for the first, after every earlier one was): none is skipped. The watch
//! key never outlives the `EXEC` that makes it, so exactly once costs one key, the guard. A call
//! that sends chunks again (or replays a spool) watches the guard too: a copy on its way from a
//! version before the transactions writes the guard without touching the watch key.
//!
//! Redis refuses a whole transaction it has not started (out of memory, a replica): nothing of
//! the chunk is written and it is sent again. Writes refused at queueing for their key (an ACL
//! without it) are left out and the chunk sent again without them; writes refused while the
//! transaction runs (another program's key under our names, a count that would overflow) are
//! skipped, the rest applied. Both are counted (`write_failures_total`).
//!
//! # Index members
//!
//! A counter's `known:` member (a gauge's `known:gauge:` one) is needed once its hash exists.
//! The agent adds it with a series' first write at a precision ([`Indexed`]), and again once
//! its last slice there is half the precision's retention old: a slice it wrote in an applied
//! chunk that lately means the hash, and so its member, exists (the cleaner removes a member
//! only with its emptied hash, in one call, and empties a hash only of slices past the
//! retention). When Redis may have lost data (a new connection, the run's field gone) the agent
//! forgets them all.

use hashbrown::{HashMap, HashSet};
use std::sync::Arc;

use redis::Value;

use super::chunk::{number, unexpected};
use super::{Writer, Written};
use crate::retention::Retention;
use crate::store::keys::{self, ChunkKeys};
use crate::store::{Connection, Keys, StoreError};

/// Sends of one chunk that end with nothing applied and no error (a `WATCH` broken by a late
/// copy, writes left out for their ACL) before the call gives up on it.
const MAX_ATTEMPTS: usize = 8;

/// A flush chunk's arguments by section (the layout is documented in `flush.lua`).
struct Sections<'a> {
    args: Vec<&'a [u8]>,
    precisions: Vec<Precision<'a>>,
    /// Where the counters' count is in `args`, and how many there are.
    counters_at: usize,
    counters: usize,
    /// Where the gauges' count is in `args` (after the statistics), and how many there are.
    gauges_at: usize,
    gauges: usize,
    /// How long each precision is kept, as the chunk was made.
    retention: Retention,
    /// When it was read (the agent's clock, s).
    now: u64,
    /// Where the sets' and the logs' counts are.
    sets_at: usize,
    logs_at: usize,
    points: Points,
}

/// A chunk's carbon points sections (`flush.lua`): the points of the present (`p` items,
/// [`super::points`]), which the writer sends as bare commands, and what is left for the script.
#[derive(Default)]
struct Points {
    /// Where the sections start.
    at: usize,
    /// Each section of this build's layout (`plan`).
    sections: Vec<PointsSection>,
    /// Each `p` item: its section and where its series' name is.
    lean: Vec<(usize, usize)>,
    /// Sections of another layout (a spool of an earlier release): left to the script whole.
    unplanned: bool,
}

/// One points section: where its count of archives is, its archives as a pending member names
/// them (`p:kept:slots,...`), and where its items for the script are (first argument, and the
/// one after the last).
struct PointsSection {
    archives_at: usize,
    spec: Vec<u8>,
    scripted: Vec<(usize, usize)>,
}

impl Points {
    /// The sections from `at` to the end of `args`.
    fn read(args: &[&[u8]], at: usize) -> Points {
        let mut points = Points {
            at,
            ..Points::default()
        };
        if args.get(at..) == Some(&[b"0"]) {
            return points;
        }
        let number = |i: usize| args.get(i).and_then(|a| number::<usize>(a));
        let mut i = at;
        while i < args.len() {
            let (Some(b"plan"), Some(n), Some(archives)) =
                (args.get(i).copied(), number(i + 1), number(i + 2))
            else {
                points.unplanned = true;
                return points;
            };
            let archives_at = i + 2;
            let Some(spec) = args.get(archives_at + 1..archives_at + 1 + 3 * archives) else {
                points.unplanned = true;
                return points;
            };
            let spec = spec
                .chunks(3)
                .map(|a| a.join(&b':'))
                .collect::<Vec<_>>()
                .join(&b',');
            i = archives_at + 1 + 3 * archives;
            let mut scripted = Vec::new();
            for _ in 0..n {
                let Some(len) = number(i + 3).filter(|len| i + 4 + len <= args.len()) else {
                    points.unplanned = true;
                    return points;
                };
                let archive = number(i + 5).filter(|a| (1..=archives).contains(a));
                if len == 5 && args[i + 4] == b"p" && archive.is_some() {
                    points.lean.push((points.sections.len(), i));
                } else {
                    scripted.push((i, i + 4 + len));
                }
                i += 4 + len;
            }
            points.sections.push(PointsSection {
                archives_at,
                spec,
                scripted,
            });
        }
        points
    }

    /// Whether anything is left for the script.
    fn scripted(&self, args: &[&[u8]]) -> bool {
        if self.unplanned {
            return args[self.at] != b"0";
        }
        self.sections.iter().any(|s| !s.scripted.is_empty())
    }

    /// The sections for the script: each with the items left for it (none: `0`).
    fn script_args(&self, args: &[&[u8]], cmd: &mut redis::Cmd) {
        if self.unplanned {
            for arg in &args[self.at..] {
                cmd.arg(*arg);
            }
            return;
        }
        let mut any = false;
        for section in &self.sections {
            if section.scripted.is_empty() {
                continue;
            }
            any = true;
            let at = section.archives_at;
            let archives = number::<usize>(args[at]).unwrap_or(0);
            cmd.arg("plan").arg(section.scripted.len());
            for arg in &args[at..at + 1 + 3 * archives] {
                cmd.arg(*arg);
            }
            for &(from, to) in &section.scripted {
                for arg in &args[from..to] {
                    cmd.arg(*arg);
                }
            }
        }
        if !any {
            cmd.arg("0");
        }
    }
}

/// One precision of a chunk: as sent (the precision, its slice), what the chunk does with its
/// counters there, and the two as numbers.
struct Precision<'a> {
    p: &'a [u8],
    slice: &'a [u8],
    mode: u8,
    at: Option<(u64, u64)>,
}

impl<'a> Sections<'a> {
    fn read(args: impl Iterator<Item = &'a [u8]>, now: u64) -> Option<Sections<'a>> {
        let args: Vec<&[u8]> = args.collect();
        // A count (or a mode) larger than the arguments cannot be right: refused before any
        // position is computed from it (a damaged spool file).
        let number = |i: usize| number::<usize>(args.get(i)?).filter(|&n| n <= args.len());
        let count = number(5)?;
        let mut precisions = Vec::with_capacity(count);
        for k in 0..count {
            let at = 6 + 3 * k;
            let (p, slice) = (*args.get(at)?, *args.get(at + 1)?);
            precisions.push(Precision {
                p,
                slice,
                mode: u8::try_from(number(at + 2)?).ok()?,
                at: self::number(p).zip(self::number(slice)),
            });
        }
        let quantiles_at = 6 + 3 * count;
        let counters_at = quantiles_at + 3 + 3 * number(quantiles_at + 2)?;
        let counters = number(counters_at)?;
        // Statistics: series, type, count, sum, sumsq, min, max, then their buckets.
        let stats_at = counters_at + 1 + 2 * counters;
        let mut gauges_at = stats_at + 1;
        for _ in 0..number(stats_at)? {
            gauges_at += 8 + 2 * number(gauges_at + 7)?;
        }
        let gauges = number(gauges_at)?;
        // Sets (series, a count of members, the members), logs (three each), then the points.
        let sets_at = gauges_at + 1 + 2 * gauges;
        let mut logs_at = sets_at + 1;
        for _ in 0..number(sets_at)? {
            logs_at += 2 + number(logs_at + 1)?;
        }
        let points_at = logs_at + 1 + 3 * number(logs_at)?;
        let retention = Retention::decode(std::str::from_utf8(args.get(1)?).ok()?)?;
        // A chunk spooled before carbon's points ends with its logs.
        (args.len() >= points_at).then(|| Sections {
            points: Points::read(&args, points_at),
            args,
            precisions,
            counters_at,
            counters,
            gauges_at,
            gauges,
            retention,
            now,
            sets_at,
            logs_at,
        })
    }

    /// The names of its keys, under the prefix it was made with.
    fn keys(&self) -> ChunkKeys<'a> {
        ChunkKeys {
            prefix: self.args[0],
        }
    }

    /// The counters: series, increment.
    fn counters(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + '_ {
        self.pairs(self.counters_at, self.counters)
    }

    /// The gauges: series, value.
    fn gauges(&self) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + '_ {
        self.pairs(self.gauges_at, self.gauges)
    }

    /// The `n` pairs after the count at `at`.
    fn pairs(&self, at: usize, n: usize) -> impl Iterator<Item = (&'a [u8], &'a [u8])> + '_ {
        self.args[at + 1..at + 1 + 2 * n]
            .chunks(2)
            .map(|pair| (pair[0], pair[1]))
    }

    /// Where the statistics section (its count, then its items) starts.
    fn stats_at(&self) -> usize {
        self.counters_at + 1 + 2 * self.counters
    }

    /// Whether the chunk holds anything for `flush.lua`: statistics, sets, logs, or points
    /// that are not of the present.
    fn has_scripted(&self) -> bool {
        [self.stats_at(), self.sets_at, self.logs_at]
            .iter()
            .any(|&at| self.args[at] != b"0")
            || self.points.scripted(&self.args)
    }

    /// Appends `flush.lua`'s arguments after the agent's time to `cmd`: the chunk's, its
    /// counters, gauges and points of the present left out.
    fn script_args(&self, cmd: &mut redis::Cmd) {
        let none: &[u8] = b"0";
        let parts = [
            &self.args[..self.counters_at],
            &[none],
            &self.args[self.stats_at()..self.gauges_at],
            &[none],
            &self.args[self.sets_at..self.points.at],
        ];
        for arg in parts.into_iter().flatten() {
            cmd.arg(*arg);
        }
        self.points.script_args(&self.args, cmd);
    }

    /// The points of the present: series, archive's precision, slice, value, and the pending
    /// member naming the next archive's slice over it (`points.lua`'s `pending_member`), if any.
    fn lean_points(&self) -> impl Iterator<Item = LeanPoint<'a>> + '_ {
        self.points.lean.iter().map(|&(section, i)| {
            let PointsSection {
                archives_at, spec, ..
            } = &self.points.sections[section];
            let args = &self.args;
            // An archive among the section's (`Points::read` checked it).
            let archive = number::<usize>(args[i + 5]).unwrap_or(1);
            let p = args[archives_at + 1 + 3 * (archive - 1)];
            let kept = number::<u64>(args[archives_at + 2 + 3 * (archive - 1)]).unwrap_or(0);
            let pending = (!args[i + 8].is_empty()).then(|| {
                let lower = (archive + 1).to_string();
                let member: [&[u8]; 6] = [
                    lower.as_bytes(),
                    args[i + 8],
                    args[i + 1],
                    args[i + 2],
                    spec,
                    args[i],
                ];
                member.join(&b'|')
            });
            LeanPoint {
                series: args[i],
                p,
                kept,
                slice: args[i + 6],
                value: args[i + 7],
                pending,
            }
        })
    }
}

/// A carbon point of the present, as the writer sends it bare (`Sections::lean_points`).
struct LeanPoint<'a> {
    series: &'a [u8],
    p: &'a [u8],
    /// How long the point's archive is kept (s).
    kept: u64,
    slice: &'a [u8],
    value: &'a [u8],
    pending: Option<Vec<u8>>,
}

/// How long [`Indexed`] keeps a series that is not written, and the most series it keeps: about
/// 70 bytes each (a 30-byte name), so at most about 70 MB for counters and as much for gauges.
/// A series written all along adds its members again once this long (its record starts afresh).
const KEEP_INDEXED_SECS: u64 = 600;
const MAX_INDEXED: usize = 1_000_000;

/// The slices (precision, start) a chunk wrote and indexed its counters at.
type Slices = Arc<[(u64, u64)]>;

/// What the agent knows of its own index members: per series, the slices (precision, start) of
/// the last applied chunk that wrote and indexed it. A write at a precision where that slice is
/// young needs no member; any other does.
#[derive(Default)]
pub(super) struct Indexed {
    series: HashMap<Box<[u8]>, Slices>,
    /// When entries not written for [`KEEP_INDEXED_SECS`] were last dropped (agent's clock, s).
    pruned: u64,
}

impl Indexed {
    /// Whether `series`' index member at `at`'s precision is surely there: this writer wrote a
    /// slice of that precision in an applied chunk, young enough (within half of `kept`, the
    /// precision's retention) that the cleaner cannot have emptied its hash since: the cleaner
    /// empties a hash only of slices past the retention (a long archive's move keeps a field),
    /// and removes a member only with its emptied hash, in one call. Any slice of the precision
    /// will do, not only the one written now: a series written every window adds its member
    /// once a record, not once a slice (at 1 s, every window).
    fn surely_has(&self, series: &[u8], at: Option<(u64, u64)>, kept: u64, now: u64) -> bool {
        at.is_some_and(|(precision, _)| {
            self.series.get(series).is_some_and(|slices| {
                slices
                    .iter()
                    .any(|&(p, start)| p == precision && start.saturating_add(kept / 2) > now)
            })
        })
    }

    /// Whether a chunk applied lately indexed `series` at `precision`, at any slice.
    fn has_precision(&self, series: &[u8], precision: u64) -> bool {
        self.series
            .get(series)
            .is_some_and(|slices| slices.iter().any(|&(p, _)| p == precision))
    }

    fn applied(&mut self, series: &[u8], slices: &Slices) {
        match self.series.get_mut(series) {
            Some(known) => *known = slices.clone(),
            None => {
                self.series.insert(series.into(), slices.clone());
            }
        }
    }

    /// Forgets everything, when Redis may have lost data (a new connection, a run's guard field
    /// gone): the next write of every series adds its members.
    pub(super) fn clear(&mut self) {
        self.series.clear();
    }

    /// Drops, once a minute, the series not written for [`KEEP_INDEXED_SECS`] (one that comes
    /// back adds its members again: a `ZADD` member per precision). A flood of new names is
    /// bounded too: past a million series the record starts afresh.
    fn prune(&mut self, now: u64) {
        if self.series.len() > MAX_INDEXED {
            self.clear();
        }
        if now < self.pruned + 60 {
            return;
        }
        self.pruned = now;
        self.series.retain(|_, slices| {
            let latest = slices.iter().map(|&(_, start)| start).max().unwrap_or(0);
            latest + KEEP_INDEXED_SECS > now
        });
    }
}

/// The most pending members [`Pending`] keeps between two claims (about 150 bytes each).
const MAX_PENDING: usize = 1_000_000;

/// The carbon rollups (`pending:gauge:` members) this writer added in applied chunks since the
/// last claim it saw: a point of the present whose member is among them needs no `ZADD NX`. A
/// point every 5 s adds its minute's member once, not twelve times.
///
/// Why a member known here is pending still: only a rollup claim takes members out of
/// `pending:gauge:`, and a claim that takes any counts itself in `claims:gauge:`
/// (`rollup_claim.lua`). The writer's check watches that count and reads it: a count other than
/// the one these members were added under forgets them all, and a claim between the check and
/// the `EXEC` breaks the `WATCH`, so nothing is applied and the chunk is sent again after a new
/// check. A member is recorded only once its transaction applied, under the count it read.
#[derive(Default)]
pub(super) struct Pending {
    /// `claims:gauge:` as the last check read it (`None`: it could not, and nothing is
    /// known).
    claims: Option<Option<Vec<u8>>>,
    members: HashSet<Box<[u8]>>,
}

impl Pending {
    /// The check read `claims` (`None`: an ACL refused it): another count than before, or none,
    /// forgets every member.
    fn claims_read(&mut self, claims: Option<Option<Vec<u8>>>) {
        if claims.is_none() || claims != self.claims {
            self.clear();
            self.claims = claims;
        }
    }

    fn has(&self, member: &[u8]) -> bool {
        self.members.contains(member)
    }

    fn added(&mut self, members: Vec<Vec<u8>>) {
        if self.claims.is_none() {
            return;
        }
        if self.members.len() + members.len() > MAX_PENDING {
            self.clear();
        }
        self.members
            .extend(members.into_iter().map(Vec::into_boxed_slice));
    }

    /// Forgets every member, when Redis may have lost data (with [`Indexed::clear`]).
    pub(super) fn clear(&mut self) {
        self.members.clear();
    }
}

/// What the check read: the run's last applied number (`None`: no field, nor a string key of an
/// older version), Redis's time, the fields of runs idle for a week, and whether the flush
/// script is loaded.
struct GuardRead {
    last: Option<u64>,
    now: u64,
    idle: Vec<Vec<u8>>,
    script_loaded: bool,
}

/// One queued command of a transaction: what its reply means.
#[derive(Clone, Copy)]
enum Queued {
    /// A counter's or gauge's write or index members: a refusal is counted, the rest goes on.
    Book,
    /// The `flush.lua` call: its reply lists the writes it skipped.
    Script,
    /// The guard and the watch key: refused, the chunk is not applied.
    Guard,
}

/// Where a transaction's writes are queued, and the keys an ACL refused, left out.
struct Book<'p> {
    left_out: &'p HashSet<Vec<u8>>,
    pipe: &'p mut redis::Pipeline,
    queued: &'p mut Vec<Queued>,
}

impl Book<'_> {
    /// Queues `command key args…` unless an ACL refused `key`; whether it was queued.
    fn write(&mut self, command: &str, key: &[u8], args: &[&[u8]]) -> bool {
        if !self.left_out.is_empty() && self.left_out.contains(key) {
            return false;
        }
        let cmd = self.pipe.cmd(command).arg(key);
        for arg in args {
            cmd.arg(*arg);
        }
        self.queued.push(Queued::Book);
        true
    }
}

/// One `ZADD` of index members `<precision>:<series>`, score 0.
struct Index<'k> {
    key: &'k [u8],
    command: redis::Cmd,
    members: usize,
}

impl<'k> Index<'k> {
    fn new(key: &'k [u8]) -> Index<'k> {
        let mut command = redis::cmd("ZADD");
        command.arg(key);
        Index {
            key,
            command,
            members: 0,
        }
    }

    fn add(&mut self, precision: &[u8], series: &[u8]) {
        self.command
            .arg(b"0")
            .arg(keys::known_member_bytes(precision, series));
        self.members += 1;
    }

    fn queue(self, book: &mut Book) {
        if self.members > 0 && !book.left_out.contains(self.key) {
            book.pipe.add_command(self.command);
            book.queued.push(Queued::Book);
        }
    }
}

/// The series and slices of a chunk's points of the present, to record in [`Indexed`].
type PointsIndexed<'a> = Vec<(&'a [u8], (u64, u64))>;

/// Queues the chunk's carbon points of the present (`points.lua` applies the rest): each
/// one's `HSET` into its archive's hash, then one `ZADD` of the index members they need (as a
/// gauge's: [`Indexed`], the point's archive kept as long as its schema says) and one `ZADD NX`
/// of the pending rollups of the slices over them, scored with the agent's time (a member
/// there already keeps its score: a rollup run takes the oldest first), but those [`Pending`]
/// knows are there. Returns the series and slices to record in [`Indexed`] once the chunk is
/// applied, and the pending members to record in [`Pending`].
fn queue_points<'a>(
    sections: &Sections<'a>,
    book: &mut Book,
    indexed: &Indexed,
    seen: &Pending,
) -> (PointsIndexed<'a>, Vec<Vec<u8>>) {
    let mut indexing = Vec::new();
    let mut added = Vec::new();
    if sections.points.lean.is_empty() {
        return (indexing, added);
    }
    let names = sections.keys();
    let known = names.known_gauges();
    let pending_key = names.pending_gauges();
    let mut index = Index::new(&known);
    let mut pending = redis::cmd("ZADD");
    pending.arg(&pending_key).arg("NX");
    let now = sections.now.to_string();
    let mut key = Vec::new();
    for point in sections.lean_points() {
        names.gauge_into(&mut key, point.p, point.series);
        if book.write("HSET", &key, &[point.slice, point.value]) {
            let at = number::<u64>(point.p).zip(number::<u64>(point.slice));
            if !indexed.surely_has(point.series, at, point.kept, sections.now) {
                index.add(point.p, point.series);
            }
            indexing.extend(at.map(|at| (point.series, at)));
            if let Some(member) = point.pending.filter(|m| !seen.has(m)) {
                pending.arg(&now).arg(&member);
                added.push(member);
            }
        }
    }
    index.queue(book);
    if !added.is_empty() && !book.left_out.contains(&pending_key) {
        book.pipe.add_command(pending);
        book.queued.push(Queued::Book);
    }
    if !book.left_out.is_empty() {
        indexing.clear();
        added.clear();
    }
    (indexing, added)
}

/// What to record in [`Indexed`] once the chunk is applied: the slices its counters' (or
/// gauges') series were written and indexed at; none when writes were left out.
fn indexing(slices: Vec<(u64, u64)>, book: &Book) -> Option<Slices> {
    (!slices.is_empty() && book.left_out.is_empty()).then(|| slices.into())
}

/// [`Writer::indexed`]'s entries: counters' members (`known:`), gauges' (`known:gauge:`).
pub(super) const COUNTERS: usize = 0;
pub(super) const GAUGES: usize = 1;

/// How one send of a chunk ended.
enum Sent {
    Applied,
    AppliedBefore,
    /// Nothing applied: a broken `WATCH` or writes left out; send again.
    Again,
}

impl Writer {
    /// The check, alone (the first of a call; later ones ride on the transaction before).
    async fn check(
        &mut self,
        conn: &mut Connection,
        keys: &RunKeys,
    ) -> Result<GuardRead, StoreError> {
        let mut pipe = redis::pipe();
        keys.check(&mut pipe, self.script.get_hash());
        let replies: Vec<redis::RedisResult<Value>> =
            pipe.ignore_errors().query_async(conn).await?;
        self.read_check(conn, keys, &replies).await
    }

    /// The check's replies (WATCH, HGET, TIME, SCRIPT EXISTS, WATCH and GET of the claims)
    /// read; when the run has no field,
    /// its older string key and the guard's idle fields are read too.
    async fn read_check(
        &mut self,
        conn: &mut Connection,
        keys: &RunKeys,
        replies: &[redis::RedisResult<Value>],
    ) -> Result<GuardRead, StoreError> {
        let [watch, field, time, exists, watch_claims, claims] = replies else {
            return Err(unexpected("the check's replies"));
        };
        let ok = |reply: &redis::RedisResult<Value>| reply.clone().map_err(StoreError::from);
        let (_, field, time, exists) = (ok(watch)?, ok(field)?, ok(time)?, ok(exists)?);
        // The claims' count, unless an ACL without its key refused it (a StatsD agent's least
        // privilege): then every pending member is added.
        let claims = match (watch_claims, claims) {
            (Ok(_), Ok(claims)) => redis::from_redis_value_ref::<Option<Vec<u8>>>(claims).ok(),
            _ => None,
        };
        let field: Option<Vec<u8>> =
            redis::from_redis_value_ref(&field).map_err(redis::RedisError::from)?;
        let (now, _): (u64, u64) =
            redis::from_redis_value_ref(&time).map_err(redis::RedisError::from)?;
        let exists: Vec<bool> =
            redis::from_redis_value_ref(&exists).map_err(redis::RedisError::from)?;
        let mut read = GuardRead {
            last: field.as_deref().and_then(leading_number),
            now,
            idle: Vec::new(),
            script_loaded: exists.first() == Some(&true),
        };
        self.pending.claims_read(claims);
        if field.is_none() {
            self.forget_members();
            type Runs = Vec<(Vec<u8>, Vec<u8>)>;
            let (legacy, runs): (Option<Vec<u8>>, Runs) = redis::pipe()
                .cmd("GET")
                .arg(&keys.sequence)
                .cmd("HGETALL")
                .arg(&keys.guard)
                .query_async(conn)
                .await?;
            read.last = legacy.as_deref().and_then(leading_number);
            read.idle = runs
                .into_iter()
                .filter(|(_, value)| {
                    let at = value
                        .split(|b| *b == b' ')
                        .nth(1)
                        .and_then(number::<u64>)
                        .unwrap_or(0);
                    at + super::GUARD_IDLE_SECS < now
                })
                .map(|(run, _)| run)
                .collect();
        }
        Ok(read)
    }

    /// Applies chunks of one run in order on one server; see the module's documentation.
    pub(super) async fn write_one_server(
        &mut self,
        conn: &mut Connection,
        sequence: &str,
        chunks: &[Arc<super::FlushChunk>],
        sent_before: &[bool],
        done: &mut Written,
    ) -> Result<(), StoreError> {
        let (guard, run) = self.keys().guard(sequence);
        let keys = RunKeys {
            watch: Keys::watch(sequence),
            sequence: sequence.to_string(),
            run: run.to_string(),
            guard,
            // A copy of a chunk sent before may be on its way from an earlier version of the
            // agent, whose script writes the guard without touching the watch key: such a call
            // watches the guard itself too.
            watch_guard: sent_before.contains(&true),
            claims: self.keys().gauge_claims(),
        };
        let mut read = self.check(conn, &keys).await?;
        let mut prev = 0;
        for (i, chunk) in chunks.iter().enumerate() {
            let Some(sections) = Sections::read(chunk.args(), self.clock.unix_now()) else {
                // Only a damaged spool file could hold one: it is dropped, said, not retried.
                self.refused("(flush chunk)", "ERR a flush chunk that does not parse");
                done.acknowledged += 1;
                prev = 0;
                continue;
            };
            let in_doubt = self.in_doubt(sent_before.get(i) == Some(&true));
            let mut left_out: HashSet<Vec<u8>> = HashSet::new();
            let mut attempts = 0;
            loop {
                attempts += 1;
                if attempts > MAX_ATTEMPTS {
                    return Err(unexpected(
                        "a flush chunk found its guard changed by another connection time after time",
                    ));
                }
                let Some(last) = read.last.or((!in_doubt).then_some(0)) else {
                    // Its guard is gone although the chunk may have been applied.
                    let () = redis::cmd("UNWATCH").query_async(conn).await?;
                    self.guard_lost(sequence);
                    if i + 1 < chunks.len() {
                        read = self.check(conn, &keys).await?;
                    }
                    break;
                };
                if last < chunk.seq && prev > 0 && last != prev {
                    let () = redis::cmd("UNWATCH").query_async(conn).await?;
                    return Err(unexpected(
                        "a flush chunk was not applied after the one before it failed",
                    ));
                }
                let apply = last < chunk.seq;
                if apply && sections.has_scripted() && !read.script_loaded {
                    self.script.prepare_invoke().load_async(conn).await?;
                    read.script_loaded = true;
                }
                let mut pipe = redis::pipe();
                pipe.ignore_errors();
                pipe.cmd("MULTI");
                let mut queued = Vec::new();
                let mut indexing = [None, None];
                let (mut points_indexed, mut points_pending) = (Vec::new(), Vec::new());
                if apply {
                    for field in &read.idle {
                        pipe.cmd("HDEL").arg(&keys.guard).arg(field);
                        queued.push(Queued::Guard);
                    }
                    let mut book = Book {
                        left_out: &left_out,
                        pipe: &mut pipe,
                        queued: &mut queued,
                    };
                    indexing = [
                        self.queue_counters(&sections, &mut book),
                        self.queue_gauges(&sections, &mut book),
                    ];
                    (points_indexed, points_pending) =
                        queue_points(&sections, &mut book, &self.indexed[GAUGES], &self.pending);
                }
                if apply && sections.has_scripted() {
                    let mut script = redis::cmd("EVALSHA");
                    script.arg(self.script.get_hash()).arg(0).arg(sections.now);
                    sections.script_args(&mut script);
                    pipe.add_command(script);
                    queued.push(Queued::Script);
                }
                let number = if apply { chunk.seq } else { last };
                pipe.cmd("HSET")
                    .arg(&keys.guard)
                    .arg(&keys.run)
                    .arg(format!("{number} {}", read.now));
                pipe.cmd("SET").arg(&keys.watch).arg(1);
                pipe.cmd("DEL").arg(&keys.watch);
                queued.extend([Queued::Guard, Queued::Guard, Queued::Guard]);
                pipe.cmd("EXEC");
                // The next check rides along: it serves the next chunk, or this one again.
                let next = i + 1 < chunks.len();
                if next {
                    keys.check(&mut pipe, self.script.get_hash());
                }
                let replies: Vec<redis::RedisResult<Value>> = pipe.query_async(conn).await?;
                let (transaction, check) = replies.split_at(queued.len() + 2);
                let sent =
                    self.read_transaction(transaction, &pipe, &queued, &mut left_out, apply)?;
                if matches!(sent, Sent::Applied) {
                    // Recorded before the next check is read: a check that finds the run's
                    // field gone (Redis lost data since) forgets this too.
                    let now = sections.now;
                    for (series, at) in points_indexed {
                        self.indexed[GAUGES].applied(series, &Slices::from([at]));
                    }
                    self.pending.added(std::mem::take(&mut points_pending));
                    let sections_of = [
                        (sections.counters_at, sections.counters),
                        (sections.gauges_at, sections.gauges),
                    ];
                    for ((indexed, slices), (at, n)) in
                        self.indexed.iter_mut().zip(indexing).zip(sections_of)
                    {
                        if let Some(slices) = slices {
                            for (name, _) in sections.pairs(at, n) {
                                indexed.applied(name, &slices);
                            }
                        }
                        indexed.prune(now);
                    }
                }
                if next {
                    read = self.read_check(conn, &keys, check).await?;
                } else if matches!(sent, Sent::Again) {
                    read = self.check(conn, &keys).await?;
                }
                match sent {
                    Sent::Applied => {}
                    Sent::AppliedBefore => done.replayed += 1,
                    Sent::Again => continue,
                }
                break;
            }
            done.acknowledged += 1;
            prev = chunk.seq;
        }
        Ok(())
    }

    /// [`Indexed::surely_has`], the precision kept as the chunk's retention says.
    fn has_member(
        &self,
        kind: usize,
        sections: &Sections,
        series: &[u8],
        at: Option<(u64, u64)>,
    ) -> bool {
        let kept = at.map_or(0, |(precision, _)| sections.retention.seconds(precision));
        self.indexed[kind].surely_has(series, at, kept, sections.now)
    }

    /// Queues the chunk's counters: the `HINCRBY`s at each precision that writes them (but
    /// those left out), then one `ZADD` of the index members they need.
    fn queue_counters(&self, sections: &Sections, book: &mut Book) -> Option<Slices> {
        let names = sections.keys();
        let known = names.known();
        let mut index = Index::new(&known);
        let mut slices = Vec::new();
        let mut key = Vec::new();
        for precision in &sections.precisions {
            let Precision { p, slice, mode, at } = *precision;
            let (write, index_new, index_all) = (mode == 1 || mode == 2, mode == 1, mode == 3);
            // Written unindexed (`coarse_write_secs`: the period's groups add the members),
            // but a series no chunk of late indexed at this precision is indexed at once, so
            // that a brand-new series is found (Graphite, the API) from its first window, not
            // a period or two later.
            let index_unseen = mode == 2;
            if let (true, Some(at)) = (index_new || index_unseen, at) {
                slices.push(at);
            }
            for (series, n) in sections.counters() {
                names.counter_into(&mut key, p, series);
                let refused = !book.left_out.is_empty() && book.left_out.contains(&key);
                if write && !refused {
                    book.write("HINCRBY", &key, &[slice, n]);
                }
                if !refused
                    && (index_all
                        || (index_new && !self.has_member(COUNTERS, sections, series, at))
                        || (index_unseen
                            && !at.is_some_and(|(q, _)| {
                                self.indexed[COUNTERS].has_precision(series, q)
                            })))
                {
                    index.add(p, series);
                }
            }
        }
        index.queue(book);
        indexing(slices, book)
    }

    /// Queues the chunk's gauges: each one's current value in `gauges:` and its value in the
    /// slice of every precision, then one `ZADD` of the index members they need.
    fn queue_gauges(&self, sections: &Sections, book: &mut Book) -> Option<Slices> {
        if sections.gauges == 0 {
            return None;
        }
        let names = sections.keys();
        let current = names.gauges();
        let known = names.known_gauges();
        let mut index = Index::new(&known);
        let mut key = Vec::new();
        for (series, value) in sections.gauges() {
            book.write("HSET", &current, &[series, value]);
            for &Precision { p, slice, at, .. } in &sections.precisions {
                names.gauge_into(&mut key, p, series);
                if book.write("HSET", &key, &[slice, value])
                    && !self.has_member(GAUGES, sections, series, at)
                {
                    index.add(p, series);
                }
            }
        }
        index.queue(book);
        let slices = sections.precisions.iter().filter_map(|p| p.at).collect();
        indexing(slices, book)
    }

    /// Reads the replies of `MULTI` … `EXEC`: refusals at queueing (left out next time, or the
    /// chunk fails), the transaction's outcome, and the writes it skipped.
    fn read_transaction(
        &mut self,
        replies: &[redis::RedisResult<Value>],
        pipe: &redis::Pipeline,
        queued: &[Queued],
        left_out: &mut HashSet<Vec<u8>>,
        apply: bool,
    ) -> Result<Sent, StoreError> {
        let (Some(multi), Some(exec)) = (replies.first(), replies.last()) else {
            return Err(unexpected("a transaction's replies"));
        };
        multi.clone()?;
        // The key of the `i`th queued command (after MULTI), for what Redis said of it.
        let key = |i: usize| -> Vec<u8> {
            let arg = pipe
                .cmd_iter()
                .nth(i + 1)
                .and_then(|c| c.args_iter().nth(1));
            match arg {
                Some(redis::Arg::Simple(key)) => key.to_vec(),
                _ => Vec::new(),
            }
        };
        let mut again = false;
        for (i, (reply, what)) in replies[1..replies.len() - 1].iter().zip(queued).enumerate() {
            let Err(e) = reply else { continue };
            match what {
                Queued::Book if e.code() == Some("NOPERM") => {
                    let key = key(i);
                    self.refused(&String::from_utf8_lossy(&key), &e.to_string());
                    left_out.insert(key);
                    again = true;
                }
                // Refused before it started (out of memory, a replica, a guard it may not
                // write): nothing is applied.
                _ => return Err(e.clone().into()),
            }
        }
        if again {
            // EXEC answers EXECABORT: nothing was applied.
            return Ok(Sent::Again);
        }
        let results = match exec {
            Ok(Value::Nil) => return Ok(Sent::Again),
            Ok(Value::Array(results)) => results,
            Ok(_) => return Err(unexpected("EXEC's reply")),
            Err(e) => return Err(e.clone().into()),
        };
        for (i, (result, what)) in results.iter().zip(queued).enumerate() {
            match (result, what) {
                (Value::ServerError(e), Queued::Book) => {
                    self.refused(&String::from_utf8_lossy(&key(i)), &server_error(e));
                }
                (Value::ServerError(e), Queued::Script) => {
                    self.refused("(flush.lua)", &server_error(e));
                }
                (Value::ServerError(e), Queued::Guard) => {
                    // The guard could not be written: another program's key of another type
                    // under its name. Everything else went in; the chunk is not acknowledged
                    // and will find the guard as it was, so it is sent again and counted twice:
                    // said loudly rather than hidden.
                    return Err(StoreError::Redis(redis::RedisError::from((
                        redis::ErrorKind::Client,
                        "the exactly-once guard could not be written",
                        server_error(e),
                    ))));
                }
                (Value::Array(failures), Queued::Script) => self.report_failures(failures),
                _ => {}
            }
        }
        Ok(if apply {
            Sent::Applied
        } else {
            Sent::AppliedBefore
        })
    }
}

/// The keys and field of one run's guard.
struct RunKeys {
    guard: String,
    run: String,
    /// The run's string key of versions before the guard hash (read when it has no field).
    sequence: String,
    /// Touched by every transaction that applies a chunk of the run; never kept.
    watch: String,
    /// Whether the check watches the guard too.
    watch_guard: bool,
    /// `claims:gauge:`, watched and read by the check ([`Pending`]).
    claims: String,
}

impl RunKeys {
    /// The check's commands. The claims' count is watched by a `WATCH` of its own, which an
    /// ACL may refuse without the guard's going unwatched.
    fn check(&self, pipe: &mut redis::Pipeline, script: &str) {
        pipe.cmd("WATCH").arg(&self.watch);
        if self.watch_guard {
            pipe.arg(&self.guard);
        }
        pipe.cmd("HGET")
            .arg(&self.guard)
            .arg(&self.run)
            .cmd("TIME")
            .cmd("SCRIPT")
            .arg("EXISTS")
            .arg(script)
            .cmd("WATCH")
            .arg(&self.claims)
            .cmd("GET")
            .arg(&self.claims);
    }
}

/// The number at the start of a guard's value ("<number> <time>", or a bare number).
fn leading_number(value: &[u8]) -> Option<u64> {
    number(value.split(|b| *b == b' ').next()?)
}

/// A Redis error as Redis says it: its code, then the rest.
pub(crate) fn server_error(e: &redis::ServerError) -> String {
    format!("{} {}", e.code(), e.details().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::ClosedWindow;
    use crate::store::{ChunkSettings, CounterWrite, build_chunks};

    fn chunk(window: &ClosedWindow) -> super::super::FlushChunk {
        let precisions = [(1, CounterWrite::Write), (60, CounterWrite::IndexOnly)];
        build_chunks(window, &precisions, &ChunkSettings::for_tests("p:", 100)).remove(0)
    }

    #[test]
    fn a_chunk_reads_back_by_section() {
        let mut window = ClosedWindow {
            start: 120,
            counters: vec![("a".into(), 3), ("b".into(), -2)],
            ..ClosedWindow::default()
        };
        let c = chunk(&window);
        let sections = Sections::read(c.args(), 0).unwrap();
        assert_eq!(sections.keys().prefix, b"p:");
        let precisions: Vec<_> = sections
            .precisions
            .iter()
            .map(|p| (p.p, p.slice, p.mode))
            .collect();
        assert_eq!(
            precisions,
            [(&b"1"[..], &b"120"[..], 1), (&b"60"[..], &b"120"[..], 3)]
        );
        let counters: Vec<_> = sections.counters().collect();
        assert_eq!(counters, [(&b"a"[..], &b"3"[..]), (&b"b"[..], &b"-2"[..])]);
        assert!(!sections.has_scripted(), "counters only");

        window.gauges = vec![("g".into(), 1.5)];
        let c = chunk(&window);
        let sections = Sections::read(c.args(), 0).unwrap();
        assert_eq!(sections.counters().count(), 2);
        assert_eq!(
            sections.gauges().collect::<Vec<_>>(),
            [(&b"g"[..], &b"1.5"[..])]
        );
        assert!(!sections.has_scripted(), "gauges go bare too");

        let mut stats = crate::aggregate::Stats::new();
        stats.count = 1.0;
        stats
            .buckets
            .add(crate::aggregate::Bucket::Positive(3), 1.0);
        window.stats = vec![("t".into(), crate::aggregate::StatKind::Timer, stats)];
        window.sets = vec![("s".into(), vec![b"m"[..].into()])];
        let c = chunk(&window);
        let sections = Sections::read(c.args(), 0).unwrap();
        assert_eq!(
            sections.gauges().count(),
            1,
            "found past the statistics' buckets"
        );
        assert!(sections.has_scripted());
        let args: Vec<&[u8]> = c.args().collect();
        let script = script_args(&sections);
        // The chunk's own arguments, but for counters and gauges left out.
        assert_eq!(script.len(), args.len() - 4 - 2);
        assert_eq!(script[sections.counters_at], b"0");
        assert!(
            script.ends_with(&[
                b"1".to_vec(),
                b"s".into(),
                b"1".into(),
                b"m".into(),
                b"0".into(),
                b"0".into()
            ]),
            "{script:?}"
        );
    }

    /// `flush.lua`'s arguments as `Sections::script_args` gives them.
    fn script_args(sections: &Sections) -> Vec<Vec<u8>> {
        let mut cmd = redis::cmd("EVALSHA");
        sections.script_args(&mut cmd);
        cmd.args_iter()
            .skip(1)
            .map(|a| match a {
                redis::Arg::Simple(a) => a.to_vec(),
                _ => Vec::new(),
            })
            .collect()
    }

    #[test]
    fn a_points_index_and_pending_members_are_left_out_while_surely_there() {
        use crate::aggregate::points::{Placed, SeriesPoints};
        use crate::storage_conf::Aggregation;
        let window = ClosedWindow {
            start: 120,
            points: vec![SeriesPoints {
                series: "now.a".into(),
                schema: 0,
                aggregation: Aggregation::default(),
                placed: vec![Placed {
                    archive: 1,
                    slice: 120,
                    value: 1.0,
                }],
            }],
            ..ClosedWindow::default()
        };
        let c = chunk(&window);
        // The index `ZADD`s a transaction queues for the chunk, and what it records.
        let queued_with = |now: u64, indexed: &Indexed, pending: &Pending| {
            let sections = Sections::read(c.args(), now).unwrap();
            let mut pipe = redis::pipe();
            let (left_out, mut queued) = (HashSet::new(), Vec::new());
            let mut book = Book {
                left_out: &left_out,
                pipe: &mut pipe,
                queued: &mut queued,
            };
            let (record, added) = queue_points(&sections, &mut book, indexed, pending);
            let record: Vec<(Vec<u8>, (u64, u64))> =
                record.into_iter().map(|(s, at)| (s.to_vec(), at)).collect();
            let count = |key: &[u8]| {
                pipe.cmd_iter()
                    .filter(|c| c.args_iter().nth(1) == Some(redis::Arg::Simple(key)))
                    .count()
            };
            let zadds = (count(b"p:known:gauge:"), count(b"p:pending:gauge:"));
            (zadds, record, added)
        };
        let queued = |now: u64, indexed: &Indexed| queued_with(now, indexed, &Pending::default());
        let mut indexed = Indexed::default();
        let (zadds, record, added) = queued(120, &indexed);
        assert_eq!(
            (zadds, record),
            ((1, 1), vec![(b"now.a".to_vec(), (5, 120))])
        );
        let member = b"3|120|average|0.5|1:120:0,5:600:0,60:7200:0,300:36000:0,3600:432000:0,\
            18000:2160000:0,86400:10368000:0|now.a"
            .to_vec();
        assert_eq!(added, std::slice::from_ref(&member));
        indexed.applied(b"now.a", &Slices::from([(5, 120)]));
        assert_eq!(queued(120, &indexed).0.0, 0, "its slice was indexed");
        // The 5 s archive is kept 600 s: a slice older than half of it is indexed again.
        assert_eq!(queued(420, &indexed).0.0, 1);
        indexed.clear();
        assert_eq!(queued(120, &indexed).0.0, 1, "Redis may have lost it");

        // A pending member this writer added under the claims count it reads is not added
        // again; another count, or data lost, adds it.
        let mut pending = Pending::default();
        pending.claims_read(Some(Some(b"3".to_vec())));
        pending.added(vec![member.clone()]);
        let (zadds, _, added) = queued_with(120, &indexed, &pending);
        assert_eq!((zadds.1, added.len()), (0, 0), "pending still");
        pending.claims_read(Some(Some(b"3".to_vec())));
        assert_eq!(
            queued_with(120, &indexed, &pending).0.1,
            0,
            "the same count"
        );
        pending.claims_read(Some(Some(b"4".to_vec())));
        assert_eq!(queued_with(120, &indexed, &pending).0.1, 1, "a claim since");
        pending.added(vec![member.clone()]);
        pending.clear();
        assert_eq!(
            queued_with(120, &indexed, &pending).0.1,
            1,
            "Redis may have lost it"
        );
        // An ACL that refuses the count: nothing is known, nothing recorded.
        pending.claims_read(None);
        pending.added(vec![member]);
        assert_eq!(
            queued_with(120, &indexed, &pending).0.1,
            1,
            "the count unread"
        );
    }

    #[test]
    fn points_of_the_present_go_bare_and_the_rest_to_the_script() {
        use crate::aggregate::points::{Placed, SeriesPoints};
        use crate::storage_conf::{Aggregation, Method};
        let series = |name: &str, placed: Vec<Placed>| SeriesPoints {
            series: name.into(),
            schema: 0,
            aggregation: Aggregation {
                method: Method::Max,
                x_files_factor: 0.5,
            },
            placed,
        };
        let at = |archive, slice| Placed {
            archive,
            slice,
            value: 2.5,
        };
        // The book's precisions (1, 5, 60, ... s): at 120, slice 120 of 1 s is of the present
        // (its 5 s slice open), and two points of 1 s are a chain for the script.
        let mut window = ClosedWindow {
            start: 120,
            points: vec![
                series("now.a", vec![at(0, 120)]),
                series("two.b", vec![at(0, 100), at(0, 101)]),
                series("now.c", vec![at(6, 86_400)]),
            ],
            ..ClosedWindow::default()
        };
        let c = chunk(&window);
        let sections = Sections::read(c.args(), 120).unwrap();
        let lean: Vec<_> = sections
            .lean_points()
            .map(|l| (l.series, l.p, l.slice, l.value, l.pending))
            .collect();
        let spec =
            "1:120:0,5:600:0,60:7200:0,300:36000:0,3600:432000:0,18000:2160000:0,86400:10368000:0";
        assert_eq!(
            lean,
            [
                (
                    &b"now.a"[..],
                    &b"1"[..],
                    &b"120"[..],
                    &b"2.5"[..],
                    Some(format!("2|120|max|0.5|{spec}|now.a").into_bytes())
                ),
                (
                    &b"now.c"[..],
                    &b"86400"[..],
                    &b"86400"[..],
                    &b"2.5"[..],
                    None
                ),
            ]
        );
        assert!(sections.has_scripted());
        let script = script_args(&sections);
        let plan = script.iter().position(|a| a == b"plan").unwrap();
        assert_eq!(script[plan + 1], b"1", "the chain alone");
        assert_eq!(script[plan + 3 + 3 * 7], b"two.b");
        // Points of the present only: nothing for the script.
        window.points.remove(1);
        let c = chunk(&window);
        let sections = Sections::read(c.args(), 120).unwrap();
        assert!(!sections.has_scripted());
        assert!(script_args(&sections).ends_with(&[b"0".to_vec()]));
    }

    #[test]
    fn a_truncated_chunk_does_not_read() {
        let window = ClosedWindow {
            start: 120,
            counters: vec![("a".into(), 3)],
            ..ClosedWindow::default()
        };
        let c = chunk(&window);
        let args: Vec<&[u8]> = c.args().collect();
        for end in 0..args.len() - 4 {
            assert!(
                Sections::read(args[..end].iter().copied(), 0).is_none(),
                "{end}"
            );
        }
        // One spooled before carbon's points ends with its logs: it reads, nothing for the
        // script.
        let before_points = Sections::read(args[..args.len() - 1].iter().copied(), 0).unwrap();
        assert!(!before_points.has_scripted());
        // A count past the arguments (a damaged spool file) reads as nothing, without a huge
        // allocation or an overflow.
        for (at, huge) in [
            (5, "18446744073709551615"),
            (5, "4000000000"),
            (21, "99999"),
        ] {
            let mut damaged = args.clone();
            damaged[at] = huge.as_bytes();
            assert!(Sections::read(damaged.into_iter(), 0).is_none(), "{at}");
        }
    }

    #[test]
    fn members_are_known_per_precision_while_young_and_forgotten_after_ten_minutes() {
        let mut indexed = Indexed::default();
        let slices: Slices = [(1, 100), (60, 60)].into();
        indexed.applied(b"s", &slices);
        // Kept 120 s at 1 s, 3 600 s at 60 s: known while the last slice is younger than half.
        let has = |indexed: &Indexed, series: &[u8], p: u64, now: u64| {
            indexed.surely_has(series, Some((p, now - now % p)), 60 * p.max(2), now)
        };
        assert!(has(&indexed, b"s", 60, 60));
        assert!(
            has(&indexed, b"s", 60, 120),
            "a new slice of a young precision"
        );
        assert!(has(&indexed, b"s", 1, 159));
        assert!(!has(&indexed, b"s", 1, 160), "half of its retention old");
        assert!(!has(&indexed, b"s", 5, 100), "a precision not written");
        assert!(!has(&indexed, b"t", 1, 100), "another series");
        assert!(!indexed.surely_has(b"s", None, 120, 100), "no slice");
        indexed.prune(119);
        assert!(has(&indexed, b"s", 60, 180), "written lately");
        indexed.prune(700);
        assert!(!has(&indexed, b"s", 60, 700), "not written for ten minutes");

        // A day's slice lasts, but a series not written for ten minutes goes.
        let day: Slices = [(1, 86_400 + 5), (86_400, 86_400)].into();
        indexed.applied(b"d", &day);
        indexed.prune(86_400 + 5 + 599);
        assert!(has(&indexed, b"d", 86_400, 86_400 + 5 + 599));
        indexed.prune(86_400 + 5 + 600 + 60);
        assert!(!has(&indexed, b"d", 86_400, 86_400 + 5 + 600 + 60));
    }
}
