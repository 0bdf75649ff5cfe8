//! A long archive's slices in fixed slots (docs/layout.md, "History: fixed slots"): the
//! counters' and gauges' slices that a long `retentions` precision keeps beyond the newest
//! [`HASH_SLICES`], moved out of the book's hash by the cleaner into strings of fixed-size
//! slots, so that a write never meets a long hash and a read costs what it reads; and a set's
//! slices beyond them, each moved out of its HyperLogLog as its count of distinct members.
//!
//! A block holds [`Geometry::slots`] consecutive slices of one series at one precision, named
//! by its number (`slice / precision / slots`); it is a string of groups of eight slots, each
//! group a flag byte (bit `7 - j` set: slot `j` holds a value) and eight 8-byte big-endian slots
//! (a counter's integer, a gauge's `f64` bits), as `BITFIELD` reads and writes them. A block
//! expires when its newest slice leaves the retention: no slot is ever reused, so none is stale.

use crate::store::bulk::{Answer, Answers, BulkPool, Commands, MULTI_REFUSED, protocol};
use crate::store::{Connection, Keys, StoreError};

/// Slices the book's hash keeps of a long archive: the book's `sample_count`, so that
/// `get_counter` answers on them as it always did.
pub const HASH_SLICES: u64 = 120;

/// Slices a gauge's hash (`gauge:`, carbon's points and StatsD's gauges) keeps of a long
/// archive. No book reader reads that family, and every cost of its hash grows with the
/// hash's length, not the archive's: a point's `HSET` searches the listpack it joins, a
/// rollup reads the hash whole to make an hour of its minutes, a quick visit searches it for
/// the fields that left it. So it keeps a few, the rest in the blocks they move to anyway
/// (docs/layout.md, "History: fixed slots").
pub const GAUGE_HASH_SLICES: u64 = 16;

/// The oldest slice of precision `p` a hash of `family` keeps at `now`: the newest
/// [`HASH_SLICES`] ([`GAUGE_HASH_SLICES`] for a gauge), the one being written among them.
pub fn keep_from(now: u64, p: u64, family: Family) -> u64 {
    let p = p.max(1);
    let kept = match family {
        Family::Gauge => GAUGE_HASH_SLICES,
        Family::Counter | Family::Set => HASH_SLICES,
    };
    (now / p * p).saturating_sub((kept - 1) * p)
}

/// How often (s) the cleaner walks the sets' slices to move the older ones into blocks: the walk
/// `SCAN`s the whole key space.
pub const SET_WALK_SECS: u64 = 300;

/// How long (s) a set's slice keeps its HyperLogLog, at a long archive's precision, after its
/// start (at least until the next slice is over): members that arrive for it meanwhile (a
/// window's, a short backlog's) merge into it exactly. The cleaner moves it into its block after
/// that: a set has no reader that wants the book's 120 slices, and a busy set's HyperLogLog is
/// 12 KiB.
pub const SET_OPEN_SECS: u64 = 120;

/// The oldest slice of a set at precision `p` that keeps its HyperLogLog at `now`.
pub fn set_keep_from(now: u64, p: u64) -> u64 {
    let p = p.max(1);
    now.saturating_sub(SET_OPEN_SECS.max(p)) / p * p
}

/// The oldest slice of a set at precision `p` whose HyperLogLog a reader asks at `now`, when
/// the cleaner runs every `interval` s: those [`set_keep_from`] keeps and those its walk may not
/// have moved yet (older ones are read from the blocks only).
pub fn set_keys_from(now: u64, p: u64, interval: u64) -> u64 {
    set_keep_from(now.saturating_sub(SET_WALK_SECS + 3 * interval), p)
}

/// How far (s) a cleaner's clock may run ahead of a reader's: a reader asks the blocks for
/// slices up to this much newer than its own boundary (the hash's newest 120, a set's open
/// slices), which such a cleaner may already have moved.
const CLOCK_SLACK_SECS: u64 = 300;

/// The slices at precision `p` a reader asks of a family's blocks at `now`: those before this.
/// Newer ones are in the hash (or a set's HyperLogLogs) only, so that a short range, all of it
/// newer, reads no block at all.
fn blocks_before(now: u64, p: u64, family: Family) -> u64 {
    let boundary = match family {
        Family::Set => set_keep_from(now, p),
        Family::Counter | Family::Gauge => keep_from(now, p, family),
    };
    boundary + CLOCK_SLACK_SECS
}

/// What a block's slots hold, and how a slice found both in its block and outside (in the hash,
/// or a set's HyperLogLog: written again after its move) reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    /// A count (a 64-bit integer): the parts add.
    Counter,
    /// A value (`f64` bits): the hash's is the newer.
    Gauge,
    /// Distinct members (a 64-bit integer): the larger part (none counted twice).
    Set,
}

impl Family {
    /// A slice's value held both outside its block (`outside`: a hash's field, a
    /// HyperLogLog) and in it.
    pub fn combine(self, outside: f64, block: f64) -> f64 {
        match self {
            Family::Counter => outside + block,
            Family::Gauge => outside,
            Family::Set => outside.max(block),
        }
    }
}

/// How a block is cut: its slots, and its length in bytes (a whole number of groups, sized so
/// that Redis's allocator wastes nothing: the string's bytes plus its 6-byte header fit the
/// size class).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Geometry {
    pub slots: u64,
}

/// Bytes a group of eight slots takes: a flag byte and eight slots of eight bytes.
pub const GROUP_BYTES: u64 = 65;

/// Redis's own bytes a block costs besides its string: the key's name, its entries in the
/// keyspace and the expiry dictionaries, the object header (measured: `MEMORY USAGE` less the
/// string's size class).
const KEY_BYTES: u64 = 100;

/// The two cuts: 248 slots in 2 KiB (2015 bytes), 2008 slots in 16 KiB (16 315 bytes).
pub const SMALL: Geometry = Geometry { slots: 248 };
pub const LARGE: Geometry = Geometry { slots: 2008 };
pub const GEOMETRIES: [Geometry; 2] = [SMALL, LARGE];

impl Geometry {
    /// The cut for an archive of `count` slices beyond the hash: the one that holds it in the
    /// fewest bytes with a block more than it needs (a block lives until its newest slice is
    /// out of the retention); `None` for an archive the hash keeps whole.
    pub fn for_count(count: u64) -> Option<Geometry> {
        if count <= HASH_SLICES {
            return None;
        }
        GEOMETRIES
            .into_iter()
            .min_by_key(|g| (count.div_ceil(g.slots) + 1) * (g.class_bytes() + KEY_BYTES))
    }

    /// A block's length in bytes.
    pub fn bytes(self) -> u64 {
        self.slots / 8 * GROUP_BYTES
    }

    /// The allocator's size class the block's string takes.
    fn class_bytes(self) -> u64 {
        (self.bytes() + 6).next_power_of_two()
    }

    /// The block holding `slice` at `precision`, and the slot in it.
    pub fn locate(self, precision: u64, slice: u64) -> (u64, u64) {
        let index = slice / precision.max(1);
        (index / self.slots, index % self.slots)
    }

    /// The first slice of block `block`.
    pub fn start(self, precision: u64, block: u64) -> u64 {
        block * self.slots * precision
    }

    /// Block `block`'s time to live at `now` (its `EXPIRE`, at least 1 s): until its newest
    /// slice leaves a retention of `kept` seconds.
    pub fn expires_in(self, precision: u64, block: u64, kept: u64, now: u64) -> u64 {
        (self.start(precision, block + 1) + kept)
            .saturating_sub(now)
            .max(1)
    }

    /// The byte range (inclusive, `GETRANGE`'s) holding slots `first..=last`.
    pub fn byte_range(first: u64, last: u64) -> (u64, u64) {
        (
            (first / 8) * GROUP_BYTES,
            (last / 8) * GROUP_BYTES + GROUP_BYTES - 1,
        )
    }

    /// The values of slots `first..=last` out of the bytes `GETRANGE` gave for
    /// [`Geometry::byte_range`] (shorter, or empty, where the block is: a missing block reads as
    /// nothing written), as `f64`: an integer, or a gauge's bits.
    pub fn read(first: u64, last: u64, bytes: &[u8], family: Family) -> Vec<Option<f64>> {
        let mut out = vec![None; (last + 1).saturating_sub(first) as usize];
        Geometry::each(first, last, bytes, family, |i, v| out[i] = Some(v));
        out
    }

    /// [`Geometry::read`]'s values as they are found: `found(i, value)` for each slot
    /// `first + i` that holds one, a group whose flag byte is empty skipped whole.
    fn each(
        first: u64,
        last: u64,
        bytes: &[u8],
        family: Family,
        mut found: impl FnMut(usize, f64),
    ) {
        let base = (first / 8) * GROUP_BYTES;
        let mut slot = first;
        while slot <= last {
            let group = ((slot / 8) * GROUP_BYTES - base) as usize;
            let Some(&flag) = bytes.get(group) else {
                return;
            };
            let group_last = (slot | 7).min(last);
            if flag != 0 {
                for s in slot..=group_last {
                    if flag & (0x80 >> (s % 8)) == 0 {
                        continue;
                    }
                    let at = group + 1 + (s % 8) as usize * 8;
                    let Some(raw) = bytes.get(at..at + 8) else {
                        return;
                    };
                    let raw = i64::from_be_bytes(raw.try_into().unwrap_or_default());
                    let v = match family {
                        Family::Gauge => f64::from_bits(raw as u64),
                        Family::Counter | Family::Set => raw as f64,
                    };
                    found((s - first) as usize, v);
                }
            }
            slot = group_last + 1;
        }
    }
}

/// A block's key: its hash's [`Keys::history_base`], then the cut's slots and the block's
/// number: `history:count:600:web.hits:2008:129`. `hash` is the hash's name with the prefix.
pub fn block_key(keys: &Keys, hash: &str, geometry: Geometry, block: u64) -> String {
    block_key_at(&keys.history_base(hash), geometry, block)
}

/// [`block_key`] from the hash's [`Keys::history_base`], made once for all of a series' blocks
/// (a render names a few hundred).
fn block_key_at(base: &str, geometry: Geometry, block: u64) -> String {
    let (mut slots, mut number) = (itoa::Buffer::new(), itoa::Buffer::new());
    let (slots, number) = (slots.format(geometry.slots), number.format(block));
    let mut key = String::with_capacity(base.len() + slots.len() + number.len() + 2);
    for part in [base, ":", slots, ":", number] {
        key.push_str(part);
    }
    key
}

/// One read of a block: its key, and the slots and bytes asked.
#[derive(Debug, Clone, PartialEq, Eq)]
struct BlockRead {
    pub key: String,
    pub first: u64,
    pub last: u64,
    /// The first of the asked slices' places in the read this block serves.
    pub at: usize,
}

/// The block reads covering `slices` (ascending, consecutive at `precision`) in every cut.
#[cfg(test)]
fn reads(keys: &Keys, hash: &str, precision: u64, slices: &[i64]) -> Vec<BlockRead> {
    reads_in(&GEOMETRIES, keys, hash, precision, slices)
}

/// The block reads covering `slices` in the cuts `cuts`.
fn reads_in(
    cuts: &[Geometry],
    keys: &Keys,
    hash: &str,
    precision: u64,
    slices: &[i64],
) -> Vec<BlockRead> {
    let mut out = Vec::new();
    let (Some(&first), Some(&last)) = (slices.first(), slices.last()) else {
        return out;
    };
    if first < 0 || precision == 0 {
        return out;
    }
    let base = keys.history_base(hash);
    for &g in cuts {
        let (mut block, mut slot) = g.locate(precision, first as u64);
        let (last_block, last_slot) = g.locate(precision, last as u64);
        let mut at = 0;
        while block <= last_block {
            let end = if block == last_block {
                last_slot
            } else {
                g.slots - 1
            };
            out.push(BlockRead {
                key: block_key_at(&base, g, block),
                first: slot,
                last: end,
                at,
            });
            at += (end - slot + 1) as usize;
            block += 1;
            slot = 0;
        }
    }
    out
}

/// One series' blocks asked by [`Blocks::plan`]: what they are named after (a hash's name, or
/// a set's [`Keys::set_series`]), the precision, the slices (ascending, consecutive at
/// `precision`), and which of the caller's lists of values (the hash's or the HyperLogLogs',
/// one a slice) the blocks' are added to.
pub struct Asked<'a> {
    pub name: String,
    pub precision: u64,
    /// The cut the configured retention makes (`Retention::history`): its blocks are read at
    /// once, the other cut's only where one of them exists (a retention changed).
    pub cut: Geometry,
    pub slices: &'a [i64],
    pub family: Family,
    /// The caller's list of values these slices' are (each series' its own).
    pub values: usize,
    /// Whether the hash `name` is read (`HGETALL`) with these blocks, in one transaction: a
    /// slice the cleaner moves from it into its block between two reads would be read twice.
    /// [`Blocks::add`] gives back its reply.
    pub with_hash: bool,
}

/// Block reads a render makes in one pipeline at most: past this (a year of ten-minute slices
/// of 100 series is about 2 700), a pipeline a series, all at once, whose replies the runtime's
/// workers parse side by side.
const ONE_PIPELINE_READS: usize = 2048;

/// A read's block reads, planned before any is sent, so that the Graphite API's bulk reader can
/// send them in the same write as the hashes' reads ([`Blocks::bulk_commands`]), one
/// transaction with them: no move of the cleaner's falls between the two. Where it does not,
/// each series' hash is read with its own blocks ([`Asked::with_hash`], [`Blocks::with_hashes`]).
pub struct Blocks<'a> {
    /// Each series asked, its own cut's reads and the other cut's.
    series: Vec<(Asked<'a>, Vec<BlockRead>, Vec<BlockRead>)>,
}

impl<'a> Blocks<'a> {
    /// The `GETRANGE`s of just the slots asked that a block may hold ([`blocks_before`]) as of
    /// `now`, in the configured retention's cut, and the other cut's blocks over the range.
    /// A series with nothing to read is left out unless its hash is read with them.
    pub fn plan(keys: &Keys, now: u64, asked: Vec<Asked<'a>>) -> Blocks<'a> {
        let series = asked
            .into_iter()
            .map(|mut a| {
                let before = blocks_before(now, a.precision, a.family) as i64;
                a.slices = &a.slices[..a.slices.partition_point(|s| *s < before)];
                let others: Vec<Geometry> =
                    GEOMETRIES.into_iter().filter(|g| *g != a.cut).collect();
                let own = reads_in(&[a.cut], keys, &a.name, a.precision, a.slices);
                let other = reads_in(&others, keys, &a.name, a.precision, a.slices);
                (a, own, other)
            })
            .filter(|(a, own, other)| a.with_hash || !own.is_empty() || !other.is_empty())
            .collect();
        Blocks { series }
    }

    /// Reads each counter's and gauge's hash with its blocks ([`Asked::with_hash`]), for a
    /// caller that does not send [`Blocks::bulk_commands`]: the `values` of those series.
    pub fn with_hashes(&mut self) -> Vec<usize> {
        (self.series.iter_mut())
            .filter(|(a, _, _)| a.family != Family::Set)
            .map(|(a, _, _)| {
                a.with_hash = true;
                a.values
            })
            .collect()
    }

    /// The commands the bulk reader sends for these reads on `conn` (each series' `GETRANGE`s,
    /// then one `EXISTS` of every series' other cut's blocks), when one pipeline takes them:
    /// on one server, at most [`ONE_PIPELINE_READS`], no hash read with them. [`Blocks::add`]
    /// takes their replies.
    pub fn bulk_commands(&self, conn: &Connection) -> Option<Commands> {
        if self.series.is_empty()
            || !matches!(conn, Connection::Single(_))
            || self.replies() > ONE_PIPELINE_READS
            || self.series.iter().any(|(a, _, _)| a.with_hash)
        {
            return None;
        }
        let mut pipe = Commands::default();
        for (_, own, _) in &self.series {
            block_commands(own, &[], |args, bytes| pipe.push_expecting(args, bytes));
        }
        if self.series.iter().any(|(_, _, other)| !other.is_empty()) {
            pipe.push(&exists(self.series.iter().flat_map(|(_, _, other)| other)));
        }
        Some(pipe)
    }

    /// Replies the series' reads get, in all.
    fn replies(&self) -> usize {
        (self.series.iter())
            .map(|(a, own, other)| replies(a.with_hash, own, other))
            .sum()
    }

    /// Adds to each series' values (`values[asked.values]`, one a slice) what its blocks hold:
    /// from `answers`, the replies to [`Blocks::bulk_commands`] where the caller sent them,
    /// else read here (the same commands through `bulk` where it has one; else the redis
    /// crate's: on one server every series' reads in one pipeline unless that is more than
    /// [`ONE_PIPELINE_READS`], else, and in a cluster, a pipeline a series, all at once: a
    /// series' blocks share one slot). The other cut's slots are read only where one of its
    /// blocks exists (slices written while another retention cut them).
    ///
    /// Gives back the replies to the hashes read with their blocks ([`Asked::with_hash`]),
    /// each with its series' `values` and family: a pipeline holding one is a transaction (`MULTI` …
    /// `EXEC`, in the series' slot).
    pub async fn add(
        self,
        conn: &Connection,
        bulk: Option<&BulkPool>,
        answers: Option<Answers>,
        values: &mut [Vec<Option<f64>>],
    ) -> Result<Vec<HashRead>, StoreError> {
        let mut hashes = Vec::new();
        if self.series.is_empty() {
            return Ok(hashes);
        }
        let one_pipeline =
            matches!(conn, Connection::Single(_)) && self.replies() <= ONE_PIPELINE_READS;
        let answers = match (answers, bulk.filter(|b| b.available())) {
            (Some(answers), _) => Some(answers),
            (None, Some(bulk)) => match self.bulk_commands(conn) {
                Some(pipe) => Some(bulk.pipeline(&pipe).await?),
                None => None,
            },
            (None, None) => None,
        };
        let series = &self.series;
        // Per series, whether the other cut has a block.
        let elsewhere: Vec<bool> = match answers {
            Some(answers) => {
                // The replies' bytes read in place of the redis crate's values (a day of
                // minutes of 100 series is 1.1 MB of them), and the one EXISTS after them.
                let mut at = 0;
                for (a, own, _) in series {
                    let bytes: Vec<&[u8]> = (at..at + own.len())
                        .map(|i| match answers.get(i) {
                            Some(Answer::Bytes(b)) => b,
                            _ => &[],
                        })
                        .collect();
                    if let Some(v) = values.get_mut(a.values) {
                        merge(v, own, &bytes, a.family);
                    }
                    at += own.len();
                }
                let others_exist = matches!(answers.get(at), Some(Answer::Integer(n)) if n > 0);
                series
                    .iter()
                    .map(|(_, _, other)| others_exist && !other.is_empty())
                    .collect()
            }
            None if one_pipeline => {
                let atomic = series.iter().any(|(a, _, _)| a.with_hash);
                let all = transaction(atomic, &mut conn.clone(), |pipe| {
                    for (a, own, other) in series {
                        crate_commands(a, a.with_hash, own, other, pipe);
                    }
                })
                .await?;
                let mut all = all.into_iter();
                series
                    .iter()
                    .map(|(a, own, other)| {
                        let n = replies(a.with_hash, own, other);
                        let list = values.get_mut(a.values);
                        let reads = (a, &own[..], &other[..], a.with_hash);
                        take(reads, all.by_ref().take(n).collect(), list, &mut hashes)
                    })
                    .collect()
            }
            None => {
                let each =
                    (series.iter()).map(|(a, own, other)| (a, &own[..], &other[..], a.with_hash));
                each_series(conn, each, values, &mut hashes).await?
            }
        };
        // The other cut's slots, where it has a block: rare.
        let found = series
            .iter()
            .zip(elsewhere)
            .filter(|(_, found)| *found)
            .map(|((a, _, other), _)| (a, &other[..], &[][..], false));
        each_series(conn, found, values, &mut Vec::new()).await?;
        Ok(hashes)
    }
}

/// A hash read with its blocks ([`Asked::with_hash`]): its series' `values`, its family and
/// its `HGETALL`'s reply.
pub type HashRead = (usize, Family, redis::Value);

/// A series' reads for [`each_series`]: the series, its own cut's blocks or the other cut's,
/// the other cut's (none when those are its blocks), and whether its hash is read with them.
type Reads<'s> = (&'s Asked<'s>, &'s [BlockRead], &'s [BlockRead], bool);

/// Each series' reads ([`crate_commands`]) in a pipeline of its own, all at once (a
/// transaction where its hash is read with them), its replies merged into its values as they
/// come (never all of them held at once); for each, whether the other cut has a block. The
/// hashes' replies are pushed to `hashes`.
async fn each_series<'s>(
    conn: &Connection,
    series: impl Iterator<Item = Reads<'s>>,
    values: &mut [Vec<Option<f64>>],
    hashes: &mut Vec<HashRead>,
) -> Result<Vec<bool>, StoreError> {
    let mut lists: Vec<Option<&mut Vec<Option<f64>>>> = values.iter_mut().map(Some).collect();
    let calls = series.map(|(a, own, other, hash)| {
        let list = lists.get_mut(a.values).and_then(Option::take);
        let mut conn = conn.clone();
        async move {
            let build = |pipe: &mut redis::Pipeline| crate_commands(a, hash, own, other, pipe);
            let replies = transaction(hash, &mut conn, build).await?;
            let mut read = Vec::new();
            let found = take((a, own, other, hash), replies, list, &mut read);
            Ok::<_, StoreError>((found, read))
        }
    });
    let read = futures_util::future::try_join_all(calls).await?;
    Ok(read
        .into_iter()
        .map(|(found, read)| {
            hashes.extend(read);
            found
        })
        .collect())
}

/// The replies to the commands `build` puts in a pipeline, sent as one transaction when
/// `atomic` (`MULTI` … `EXEC` around them, in the one write: the redis crate's own
/// transactions fail when `MULTI` is refused). A user refused `MULTI` (a reader made by an
/// earlier release's ACL line) has each command answered as it comes, as before, with a
/// warning once, as the bulk reader does.
async fn transaction(
    atomic: bool,
    conn: &mut Connection,
    build: impl FnOnce(&mut redis::Pipeline),
) -> Result<Vec<redis::Value>, StoreError> {
    use redis::Value;
    let mut pipe = redis::pipe();
    if !atomic {
        build(&mut pipe);
        return Ok(pipe.query_async(conn).await?);
    }
    pipe.ignore_errors().cmd("MULTI");
    build(&mut pipe);
    let commands = pipe.cmd_iter().count() - 1;
    pipe.cmd("EXEC");
    let mut replies: Vec<Value> = pipe.query_async(conn).await?;
    // `+OK`, a `+QUEUED` a command (or the error that refused it), then EXEC's array of their
    // replies; or, MULTI refused, its error, each command's reply, and EXEC's error.
    let exec = replies.pop();
    let multi = (!replies.is_empty()).then(|| replies.remove(0));
    let replies = match (multi, exec) {
        (Some(Value::Okay), Some(Value::Array(replies))) if replies.len() == commands => replies,
        (Some(Value::Okay), exec) => {
            // A command refused when queued says why; else EXEC's own answer.
            let refused = replies.into_iter().chain(exec).find_map(|r| match r {
                Value::ServerError(e) => Some(e),
                _ => None,
            });
            return Err(match refused {
                Some(e) => redis::RedisError::from(e).into(),
                None => protocol("EXEC's replies"),
            });
        }
        (Some(Value::ServerError(_)), Some(_)) if replies.len() == commands => {
            static WARNED: std::sync::atomic::AtomicBool =
                std::sync::atomic::AtomicBool::new(false);
            if !WARNED.swap(true, std::sync::atomic::Ordering::Relaxed) {
                tracing::warn!("{MULTI_REFUSED}");
            }
            replies
        }
        _ => return Err(protocol("MULTI's replies")),
    };
    replies
        .into_iter()
        .map(|reply| match reply {
            Value::ServerError(e) => Err(redis::RedisError::from(e).into()),
            reply => Ok(reply),
        })
        .collect()
}

/// How many replies a series' reads get: its hash's where `hash`, one a block of its own cut,
/// and one `EXISTS` of the other cut's blocks.
fn replies(hash: bool, own: &[BlockRead], other: &[BlockRead]) -> usize {
    usize::from(hash) + own.len() + usize::from(!other.is_empty())
}

/// A series' reads added to a pipeline of the redis crate's: its hash's `HGETALL` where
/// `hash`, then its [`block_commands`].
fn crate_commands(
    a: &Asked,
    hash: bool,
    own: &[BlockRead],
    other: &[BlockRead],
    pipe: &mut redis::Pipeline,
) {
    if hash {
        pipe.cmd("HGETALL").arg(&a.name);
    }
    block_commands(own, other, |args, _| {
        let mut command = redis::Cmd::new();
        for arg in args {
            command.arg(*arg);
        }
        pipe.add_command(command);
    });
}

/// Merges a series' replies to [`crate_commands`] (its hash's, its blocks' bytes, then what
/// EXISTS counted) into `values`, its hash's reply pushed to `hashes` with the series'
/// `values`; true when the other cut has a block.
fn take(
    (a, own, other, hash): Reads,
    replies: Vec<redis::Value>,
    values: Option<&mut Vec<Option<f64>>>,
    hashes: &mut Vec<HashRead>,
) -> bool {
    let mut replies = replies.into_iter();
    if hash && let Some(reply) = replies.next() {
        hashes.push((a.values, a.family, reply));
    }
    let replies: Vec<redis::Value> = replies.collect();
    let bytes: Vec<&[u8]> = replies
        .iter()
        .take(own.len())
        .map(|v| match v {
            redis::Value::BulkString(b) => b.as_slice(),
            _ => &[],
        })
        .collect();
    if let Some(values) = values {
        merge(values, own, &bytes, a.family);
    }
    !other.is_empty() && matches!(replies.get(own.len()), Some(redis::Value::Int(n)) if *n > 0)
}

/// A series' block commands, each given to `command` with the bytes its reply holds at most:
/// its own cut's `GETRANGE`s, then one `EXISTS` of the other cut's blocks.
fn block_commands(
    own: &[BlockRead],
    other: &[BlockRead],
    mut command: impl FnMut(&[&[u8]], usize),
) {
    let (mut from, mut to) = (itoa::Buffer::new(), itoa::Buffer::new());
    for block in own {
        let (a, b) = Geometry::byte_range(block.first, block.last);
        let bytes = (b - a + 1) as usize;
        let (a, b) = (from.format(a).as_bytes(), to.format(b).as_bytes());
        command(&[b"GETRANGE", block.key.as_bytes(), a, b], bytes);
    }
    if !other.is_empty() {
        command(&exists(other), 0);
    }
}

/// `EXISTS` of the blocks' keys.
fn exists<'a>(blocks: impl IntoIterator<Item = &'a BlockRead>) -> Vec<&'a [u8]> {
    let mut command: Vec<&[u8]> = vec![b"EXISTS"];
    command.extend(blocks.into_iter().map(|b| b.key.as_bytes()));
    command
}

/// Adds what the blocks hold into `values` (one per slice of `slices`), a slice held in both
/// (moved, then written late) combined as [`Family`] says.
fn merge<B: AsRef<[u8]>>(
    values: &mut [Option<f64>],
    reads: &[BlockRead],
    replies: &[B],
    family: Family,
) {
    for (read, bytes) in reads.iter().zip(replies) {
        Geometry::each(read.first, read.last, bytes.as_ref(), family, |i, v| {
            if let Some(slot) = values.get_mut(read.at + i) {
                *slot = Some(slot.map_or(v, |outside| family.combine(outside, v)));
            }
        });
    }
}

/// A whole block's string, for the importer: `points` are (slot, value) pairs.
pub fn block_bytes(geometry: Geometry, points: &[(u64, f64)], family: Family) -> Vec<u8> {
    let mut out = vec![0u8; geometry.bytes() as usize];
    for &(slot, value) in points {
        let group = ((slot / 8) * GROUP_BYTES) as usize;
        out[group] |= 0x80 >> (slot % 8);
        let raw = match family {
            Family::Gauge => value.to_bits() as i64,
            Family::Counter | Family::Set => value as i64,
        };
        let at = group + 1 + (slot % 8) as usize * 8;
        out[at..at + 8].copy_from_slice(&raw.to_be_bytes());
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scripts that move and write a long archive's slices keep the hash's length as the
    /// readers do.
    #[test]
    fn the_scripts_keep_the_hashes_length_the_readers_do() {
        let history = format!(
            "local HASH_SLICES, GAUGE_HASH_SLICES, GROUP, MOST_MOVED = {HASH_SLICES}, \
             {GAUGE_HASH_SLICES}, {GROUP_BYTES}, 20000"
        );
        assert!(include_str!("history.lua").contains(&history), "{history}");
        let points = format!(
            "local POINT_HASH_SLICES, POINT_GROUP, POINT_MARGIN = {GAUGE_HASH_SLICES}, \
             {GROUP_BYTES}, {CLOCK_SLACK_SECS}"
        );
        assert!(include_str!("points.lua").contains(&points), "{points}");
    }

    #[test]
    fn geometries_fill_their_size_class() {
        assert_eq!((SMALL.bytes(), SMALL.class_bytes()), (2015, 2048));
        assert_eq!((LARGE.bytes(), LARGE.class_bytes()), (16_315, 16_384));
        assert_eq!(Geometry::for_count(120), None);
        assert_eq!(Geometry::for_count(2160), Some(SMALL));
        assert_eq!(Geometry::for_count(8640), Some(SMALL));
        assert_eq!(Geometry::for_count(259_200), Some(LARGE));
    }

    #[test]
    fn a_block_reads_back_what_was_put_in_it() {
        let points = [(0, 5.0), (7, -3.0), (8, 1e15), (247, 0.0)];
        let bytes = block_bytes(SMALL, &points, Family::Counter);
        let got = Geometry::read(0, 247, &bytes, Family::Counter);
        assert_eq!(got.iter().flatten().count(), 4);
        assert_eq!(
            (got[0], got[7], got[8], got[247]),
            (Some(5.0), Some(-3.0), Some(1e15), Some(0.0))
        );
        assert_eq!(got[1], None);
        // A part, as GETRANGE gives it.
        let (a, b) = Geometry::byte_range(7, 8);
        let part = &bytes[a as usize..=b as usize];
        assert_eq!(
            Geometry::read(7, 8, part, Family::Counter),
            vec![Some(-3.0), Some(1e15)]
        );
        let gauges = block_bytes(SMALL, &[(3, -0.25), (4, f64::MAX)], Family::Gauge);
        let got = Geometry::read(3, 5, &gauges, Family::Gauge);
        assert_eq!(got, vec![Some(-0.25), Some(f64::MAX), None]);
        assert_eq!(Geometry::read(0, 3, &[], Family::Counter), vec![None; 4]);
    }

    #[test]
    fn reads_cover_the_slices_in_both_cuts() {
        let slices: Vec<i64> = (0..300).map(|i| 600 * (247 + i)).collect();
        let r = reads(&Keys::new("p:"), "p:count:600:a", 600, &slices);
        assert_eq!(r[0].key, "p:history:count:600:a:248:0");
        assert_eq!((r[0].first, r[0].last, r[0].at), (247, 247, 0));
        assert_eq!((r[1].first, r[1].last, r[1].at), (0, 247, 1));
        assert_eq!((r[2].first, r[2].last, r[2].at), (0, 50, 249));
        let large: Vec<_> = r.iter().filter(|b| b.key.contains(":2008:")).collect();
        assert_eq!(large.len(), 1);
        assert_eq!((large[0].first, large[0].last, large[0].at), (247, 546, 0));
        let mut values = vec![None; 300];
        values[0] = Some(1.0);
        let small = block_bytes(SMALL, &[(247, 2.0)], Family::Counter);
        let big = block_bytes(LARGE, &[(248, 4.0)], Family::Counter);
        let replies: Vec<Vec<u8>> = r
            .iter()
            .map(|b| {
                let (x, y) = Geometry::byte_range(b.first, b.last);
                let whole = if b.key.contains(":2008:") {
                    &big
                } else if b.key.ends_with(":248:0") {
                    &small
                } else {
                    return Vec::new();
                };
                whole[x as usize..=y as usize].to_vec()
            })
            .collect();
        let mut sets = values.clone();
        merge(&mut values, &r, &replies, Family::Counter);
        assert_eq!(
            (values[0], values[1], values[2]),
            (Some(3.0), Some(4.0), None)
        );
        // A set's slice held in both reads as the larger part.
        merge(&mut sets, &r, &replies, Family::Set);
        assert_eq!((sets[0], sets[1], sets[2]), (Some(2.0), Some(4.0), None));
    }
}
