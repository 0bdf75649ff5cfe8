//! A long archive's quantile slices packed into blocks (docs/layout.md, "History: fixed slots",
//! "Quantile slices"). Under `retentions`, at a quantile precision kept for more than
//! [`super::history::HASH_SLICES`] slices ([`crate::retention::Retention::packs_quantiles`]),
//! a slice's bucket hash (`hist:<p>:<series>:<type>:<slice>`) stays a hash while it may
//! still be written ([`OPEN_SECS`]); the cleaner then packs its
//! buckets as one record into the block of [`SLOTS`] consecutive slices of the series:
//! `history:hist:<p>:<series>:<type>:<n>` (in a cluster `history:{tag}hist:…`, the tag of
//! `hist:<p>:<series>:<type>`'s slot), a string of varints a reader decodes whole.
//!
//! A block begins with its accuracy (a varint length, then `a` as the hashes hold it); then
//! records, each a varint length and: the slot (one byte), the part's token (four bytes), and
//! each bucket's step from the one before on one axis ([`key`]) and its count
//! ([`put_bucket`]). A slice's buckets add, so a slice written again after its move (a backlog,
//! a spool replayed) is a second part with a token of its own, and a reader adds the parts.
//!
//! The move is three steps, each in one key's slot and each harmless to repeat (a cluster puts
//! a slice's hash and its block on different masters): `hist_seal.lua` gives the hash a token
//! (field `m`, once) and returns its fields; `hist_move.lua` writes the record under that token,
//! replacing the one a former try wrote; `hist_drop.lua` deletes the hash if it still holds
//! exactly what moved. A reader that finds both a hash and a part of the same token takes the
//! hash (it holds at least what moved).

use std::collections::HashMap;

use super::{Connection, Keys, StoreError};
use crate::aggregate::StatKind;
use crate::aggregate::sketch::{Bucket, Buckets, MAX_BUCKETS, Mapping};
use crate::retention::Retention;

/// Slices a block holds: an hour of minutes, 64 hours of hours. A reader gets a block whole, so
/// a block stays small (a few KiB for a busy timer's minutes), and its key's own bytes, spread
/// over its slices, stay under two bytes a slice.
pub const SLOTS: u64 = 64;

/// How long (s) after its end a quantile slice stays a hash: its buckets are written in the
/// minute after it (`quantile_write_secs`), and a short backlog after that merges into it in
/// place. The cleaner packs it after that.
pub const OPEN_SECS: u64 = 300;

/// How often (s) the cleaner walks the quantile slices (`SCAN hist:*`).
pub const WALK_SECS: u64 = 300;

/// The hash field holding a sealed slice's token.
pub const TOKEN_FIELD: &str = "m";

/// The oldest slice at precision `p` still a hash at `now`: older ones end [`OPEN_SECS`] or
/// more before it, and the cleaner packs them.
pub fn keep_from(now: u64, p: u64) -> u64 {
    let p = p.max(1);
    now.saturating_sub(OPEN_SECS) / p * p
}

/// Where `retention` packs the quantile slices at precision `p`
/// ([`Retention::packs_quantiles`]), the oldest slice whose hash a reader asks at `now` when
/// the cleaner runs every `interval` s: those [`keep_from`] keeps and those its walk may not
/// have packed yet. Older ones are read from their blocks only: a value written late into an
/// older slice, or a hash an earlier release wrote, shows once the next walk packed it. None
/// where the slices are all hashes.
pub fn hashes_from(retention: &Retention, now: u64, p: u64, interval: u64) -> Option<u64> {
    retention
        .packs_quantiles(p)
        .then(|| keep_from(now.saturating_sub(WALK_SECS + 3 * interval), p))
}

/// The block holding `slice` at precision `p`, and its slot there.
pub fn locate(p: u64, slice: u64) -> (u64, u8) {
    let n = slice / p.max(1);
    (n / SLOTS, (n % SLOTS) as u8)
}

/// When a block expires: its newest slice's end of retention (`kept` seconds).
pub fn expires_at(p: u64, block: u64, kept: u64) -> u64 {
    ((block + 1) * SLOTS - 1) * p + kept
}

/// A block's key: `history:hist:60:api:AccessTime:7` (with its slot tag in a cluster).
pub fn block_key(keys: &Keys, p: u64, series: &str, kind: StatKind, block: u64) -> String {
    format!(
        "{}:{block}",
        keys.history_base(&keys.hist_series(p, series, kind))
    )
}

/// A bucket's place on one integer axis: positive values' buckets at their index, zero and the
/// negative values' far above them, so that a slice's buckets step by a byte or two.
fn key(b: Bucket) -> i64 {
    match b {
        Bucket::Positive(i) => i as i64,
        Bucket::Zero => ZERO,
        Bucket::Negative(i) => NEGATIVE + i as i64,
    }
}

const ZERO: i64 = 1 << 40;
const NEGATIVE: i64 = 1 << 42;

fn bucket_of(k: i64) -> Option<Bucket> {
    if k == ZERO {
        Some(Bucket::Zero)
    } else if let Ok(i) = i32::try_from(k) {
        Some(Bucket::Positive(i))
    } else {
        i32::try_from(k - NEGATIVE).ok().map(Bucket::Negative)
    }
}

fn put_varint(out: &mut Vec<u8>, mut n: u64) {
    while n >= 0x80 {
        out.push((n as u8) | 0x80);
        n >>= 7;
    }
    out.push(n as u8);
}

fn varint(bytes: &[u8], at: &mut usize) -> Option<u64> {
    let mut n = 0u64;
    for shift in (0..64).step_by(7) {
        let b = *bytes.get(*at)?;
        *at += 1;
        n |= u64::from(b & 0x7f) << shift;
        if b < 0x80 {
            return Some(n);
        }
    }
    None
}

/// Past this, a bucket's count code follows its step as a varint of its own.
const CODE_ESCAPE: u64 = 127;

/// A bucket `step` past the one before it, weighing `w`, as releases before [`put_coded`] wrote
/// it (their records are read still; tests write them). Its count's code is twice a whole
/// count below 2^52, or 1 for any other, whose `f64` bits follow (a rate's weights are
/// fractions). One varint holds the step past the next bucket (zigzag) above seven bits of
/// the code (`CODE_ESCAPE`: the code follows), so that a bucket next to the one before, with a
/// count below 64, takes one byte.
#[cfg(test)]
fn put_bucket(out: &mut Vec<u8>, step: i64, w: f64) {
    let code = if whole(w) { 2 * w as u64 } else { 1 };
    let gap = step - 1;
    let zigzag = ((gap << 1) ^ (gap >> 63)) as u64;
    put_varint(out, zigzag << 7 | code.min(CODE_ESCAPE));
    if code >= CODE_ESCAPE {
        put_varint(out, code);
    }
    if code == 1 {
        out.extend_from_slice(&w.to_bits().to_be_bytes());
    }
}

/// [`put_bucket`]'s step and count, read back.
fn bucket(bytes: &[u8], at: &mut usize) -> Option<(i64, f64)> {
    let head = varint(bytes, at)?;
    let zigzag = head >> 7;
    let gap = ((zigzag >> 1) as i64) ^ -((zigzag & 1) as i64);
    let code = match head & CODE_ESCAPE {
        CODE_ESCAPE => varint(bytes, at)?,
        code => code,
    };
    let w = if code == 1 {
        let bits = bytes.get(*at..*at + 8)?;
        *at += 8;
        f64::from_bits(u64::from_be_bytes(bits.try_into().ok()?))
    } else {
        (code / 2) as f64
    };
    Some((gap.checked_add(1)?, w))
}

/// A block's first bytes: its accuracy, as the hashes' `a` field holds it.
pub fn header(alpha: &str) -> Vec<u8> {
    let mut out = Vec::with_capacity(alpha.len() + 1);
    put_varint(&mut out, alpha.len() as u64);
    out.extend_from_slice(alpha.as_bytes());
    out
}

/// A slice's record: its slot (its high bit set: the buckets are [`put_coded`]'s), its part's
/// token and its buckets, behind the record's length. (A record whose slot's high bit is clear
/// holds its buckets as [`put_bucket`]'s varints, as releases before the coded ones wrote them;
/// it reads back the same.)
pub fn record(slot: u8, token: [u8; 4], buckets: &Buckets) -> Vec<u8> {
    let mut body = vec![slot | CODED];
    body.extend_from_slice(&token);
    let mut sorted: Vec<(i64, f64)> = buckets.iter().map(|(b, w)| (key(b), w)).collect();
    sorted.sort_unstable_by_key(|(k, _)| *k);
    put_coded(&mut body, &sorted);
    let mut out = Vec::with_capacity(body.len() + 3);
    put_varint(&mut out, body.len() as u64);
    out.extend_from_slice(&body);
    out
}

/// Whether a bucket's count is a whole number below 2^52 (coded as an integer; any other
/// weight, a rate's fraction, as its `f64` bits).
fn whole(w: f64) -> bool {
    w >= 0.0 && w.fract() == 0.0 && w < (1u64 << 52) as f64
}

/// The slot byte's flag of a record whose buckets are coded in bits ([`put_coded`]).
const CODED: u8 = 0x80;

/// The counts' codes of `sorted`, and whether they are all whole: then a count's code is the
/// count less one (a whole count from 1 below 2^52, as nearly every slice holds), else the
/// count plus one for such a count and 0 for any other (its `f64` bits follow: a rate's
/// weights are fractions).
fn count_codes(sorted: &[(i64, f64)]) -> (Vec<u64>, bool) {
    let counting = sorted.iter().all(|(_, w)| whole(*w) && *w >= 1.0);
    let codes = sorted
        .iter()
        .map(|&(_, w)| match (counting, whole(w)) {
            (true, _) => w as u64 - 1,
            (false, true) => w as u64 + 1,
            (false, false) => 0,
        })
        .collect();
    (codes, counting)
}

/// Past this many ones, a Rice code's quotient gives way to its value's 64 bits.
const RICE_ESCAPE: u64 = 32;

/// The Rice parameter for the next code after the running mean `m` of the codes before it.
fn rice_k(m: u64) -> u32 {
    (64 - m.leading_zeros()).saturating_sub(1)
}

/// The flag of [`put_coded`]'s parameter byte: the counts are not all whole.
const FRACTIONS: u8 = 0x80;

/// `sorted` buckets (key, count), coded in bits: their number and the first key (varints), a
/// byte (the first Rice parameter; [`FRACTIONS`]), then for each bucket its step past the one
/// before (Elias gamma: one bit for the next bucket; none for the first) and its count's code
/// ([`count_codes`]) in a Rice code whose parameter follows the running mean of the codes
/// before it (neighbouring buckets hold like counts; the tails' small ones take two bits). A
/// minute of a thousand latencies at 1 % takes about five and a half bits a bucket, where
/// [`put_bucket`]'s varints take nine or ten.
fn put_coded(out: &mut Vec<u8>, sorted: &[(i64, f64)]) {
    put_varint(out, sorted.len() as u64);
    let Some(&(first, _)) = sorted.first() else {
        return;
    };
    put_varint(out, ((first << 1) ^ (first >> 63)) as u64);
    let (codes, counting) = count_codes(sorted);
    let k0 = rice_k(codes[0]);
    out.push(k0 as u8 | if counting { 0 } else { FRACTIONS });
    let mut m = 1u64 << k0;
    let mut bits = Bits::new(out);
    for (i, (&(key, w), &code)) in sorted.iter().zip(&codes).enumerate() {
        if i > 0 {
            let step = (key - sorted[i - 1].0) as u64;
            let n = 63 - step.leading_zeros();
            bits.put(0, n);
            bits.put(step, n + 1);
        }
        let k = rice_k(m);
        match code >> k {
            q if q >= RICE_ESCAPE => {
                bits.put(u64::MAX, RICE_ESCAPE as u32);
                bits.put(code, 64);
            }
            q => {
                bits.put(u64::MAX, q as u32);
                bits.put(0, 1);
                bits.put(code, k);
            }
        }
        if !counting && code == 0 {
            bits.put(w.to_bits(), 64);
        }
        m = m / 2 + code / 2 + (m & code & 1);
    }
}

/// Writes bits onto a byte vector, most significant first; the last byte padded with zeros.
struct Bits<'a> {
    out: &'a mut Vec<u8>,
    used: u32,
}

impl<'a> Bits<'a> {
    fn new(out: &'a mut Vec<u8>) -> Bits<'a> {
        Bits { out, used: 8 }
    }

    /// The low `n` bits of `value` (n <= 64).
    fn put(&mut self, value: u64, n: u32) {
        for i in (0..n).rev() {
            if self.used == 8 {
                self.out.push(0);
                self.used = 0;
            }
            let bit = (value >> i) & 1;
            *self.out.last_mut().expect("pushed") |= (bit as u8) << (7 - self.used);
            self.used += 1;
        }
    }
}

/// The longest step [`BitReader::next_short`] reads (its bits less one: a step below 2^16).
const SHORT_STEP_BITS: u32 = 15;

/// Reads what [`Bits`] wrote, through a word of the bits to come; `None` past the end.
struct BitReader<'a> {
    bytes: &'a [u8],
    /// The next byte to load.
    next: usize,
    /// The bits loaded and not read, first in the highest.
    word: u64,
    loaded: u32,
}

impl<'a> BitReader<'a> {
    fn new(bytes: &'a [u8]) -> BitReader<'a> {
        BitReader {
            bytes,
            next: 0,
            word: 0,
            loaded: 0,
        }
    }

    fn load(&mut self) {
        // Eight bytes at once where there are eight: the bytes past the whole ones loaded go in
        // too, at their own places, as the next load puts them again.
        if let Some(chunk) = self.bytes.get(self.next..self.next + 8) {
            let chunk = u64::from_be_bytes(chunk.try_into().expect("eight bytes"));
            self.word |= chunk >> self.loaded;
            let whole = (63 - self.loaded) / 8;
            self.next += whole as usize;
            self.loaded += whole * 8;
            return;
        }
        while self.loaded <= 56 {
            let Some(&b) = self.bytes.get(self.next) else {
                return;
            };
            self.word |= u64::from(b) << (56 - self.loaded);
            self.loaded += 8;
            self.next += 1;
        }
    }

    /// The next `n` bits (n <= 64) as a number.
    fn take(&mut self, n: u32) -> Option<u64> {
        if n == 0 {
            return Some(0);
        }
        if n > 56 {
            let high = self.take(n - 32)?;
            return Some(high << 32 | self.take(32)?);
        }
        self.load();
        if n > self.loaded {
            return None;
        }
        let v = self.word >> (64 - n);
        self.word <<= n;
        self.loaded -= n;
        Some(v)
    }

    /// The common case read at once: (with `step`) a step of at most [`SHORT_STEP_BITS`] bits
    /// and a Rice code of parameter `k` whose quotient is short, all in the loaded word: the
    /// step (1 without `step`) and the code. `None` (nothing read) for any other.
    fn next_short(&mut self, step: bool, k: u32) -> Option<(u64, u64)> {
        self.load();
        let (gap, used) = if step {
            // Elias gamma: `z` zeros, then the step's `z + 1` bits.
            let z = self.word.leading_zeros();
            if z > SHORT_STEP_BITS {
                return None;
            }
            ((self.word << z) >> (63 - z), 2 * z + 1)
        } else {
            (1, 0)
        };
        let rest = self.word << used;
        let q = rest.leading_ones();
        let len = used + q + 1 + k;
        if q >= RICE_ESCAPE as u32 || k > 24 || len > self.loaded {
            return None;
        }
        let low = match k {
            0 => 0,
            k => (rest << (q + 1)) >> (64 - k),
        };
        self.word = self.word.checked_shl(len).unwrap_or(0);
        self.loaded -= len;
        Some((gap, u64::from(q) << k | low))
    }

    /// Consumes the ones (`ones`) or zeros in a row from here, at most `most`, and says how
    /// many; the bit that ends them stays.
    fn run(&mut self, ones: bool, most: u32) -> Option<u32> {
        let mut n = 0;
        loop {
            if n == most {
                return Some(n);
            }
            self.load();
            let cap = self.loaded.min(most - n);
            if cap == 0 {
                return None;
            }
            let w = if ones { self.word } else { !self.word };
            let r = w.leading_ones().min(cap);
            self.word = self.word.checked_shl(r).unwrap_or(0);
            self.loaded -= r;
            n += r;
            if r < cap {
                return Some(n);
            }
        }
    }
}

/// [`put_coded`]'s buckets read back, onto `list` (empty: a buffer used again); `None` for
/// bytes it did not write.
fn coded(bytes: &[u8], mut list: Vec<(Bucket, f64)>) -> Option<Buckets> {
    let mut at = 0;
    let n = varint(bytes, &mut at)?;
    if n == 0 {
        return (at == bytes.len()).then(|| Buckets::from_ordered(list));
    }
    // A bucket takes a bit at least, and a record holds at most `MAX_BUCKETS`. The list is
    // made its length at once: a bucket written into its place needs no check of room.
    if n > 8 * bytes.len() as u64 || n > MAX_BUCKETS as u64 {
        return None;
    }
    list.resize(n as usize, (Bucket::Zero, 0.0));
    let zigzag = varint(bytes, &mut at)?;
    let mut key = ((zigzag >> 1) as i64) ^ -((zigzag & 1) as i64);
    let flags = *bytes.get(at)?;
    let (k0, counting) = (flags & !FRACTIONS, flags & FRACTIONS == 0);
    let mut m = 1u64.checked_shl(u32::from(k0))?;
    let mut bits = BitReader::new(&bytes[at + 1..]);
    for (i, place) in list.iter_mut().enumerate() {
        let k = rice_k(m);
        // The common bucket, a short step on with a count of a short code: from the word at once.
        let (step, code) = match bits.next_short(i > 0, k) {
            Some(read) => read,
            None => {
                let mut step = 0;
                if i > 0 {
                    let zeros = bits.run(false, 64)?;
                    if zeros > 62 {
                        return None;
                    }
                    step = bits.take(zeros + 1)?;
                }
                let q = u64::from(bits.run(true, RICE_ESCAPE as u32)?);
                let code = if q == RICE_ESCAPE {
                    bits.take(64)?
                } else {
                    bits.take(1)?;
                    q << k | bits.take(k)?
                };
                (step, code)
            }
        };
        if i > 0 {
            key = key.checked_add(i64::try_from(step).ok()?)?;
        }
        // A code we wrote is below 2^53 (a whole count's is below 2^52): as an `i64` it turns
        // into a float in one instruction, where a `u64` takes several.
        let c = i64::try_from(code).ok().filter(|c| *c < 1 << 53)?;
        let w = match (counting, c) {
            (true, c) => c as f64 + 1.0,
            (false, 0) => f64::from_bits(bits.take(64)?),
            (false, c) => (c - 1) as f64,
        };
        *place = (bucket_of(key)?, w);
        m = m / 2 + code / 2 + (m & code & 1);
    }
    // The keys rise, so positive values' buckets (all but zero's and the negatives', whose
    // keys are above theirs) come in value order.
    if key < ZERO {
        return Some(Buckets::from_ordered(list));
    }
    let mut buckets = Buckets::with_capacity(list.len());
    for (b, w) in list {
        buckets.add(b, w);
    }
    Some(buckets)
}

/// One part of a slice, as a block holds it, its buckets not read yet.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Record<'a> {
    pub slot: u8,
    pub token: [u8; 4],
    /// Its buckets: coded in bits ([`put_coded`]), or an earlier release's varints.
    coded: bool,
    bytes: &'a [u8],
}

impl Record<'_> {
    /// Its buckets, read into `into` (a buffer used again: what it held goes); `None` for bytes
    /// we did not write (`into` is left empty).
    pub fn buckets(&self, into: &mut Buckets) -> Option<()> {
        let list = std::mem::take(into).into_empty_list();
        *into = if self.coded {
            coded(self.bytes, list)?
        } else {
            let mut buckets = Buckets::from_ordered(list);
            let (mut i, mut prev) = (0, 0i64);
            while i < self.bytes.len() {
                let (step, w) = bucket(self.bytes, &mut i)?;
                prev = prev.checked_add(step)?;
                buckets.add(bucket_of(prev)?, w);
            }
            buckets
        };
        Some(())
    }
}

/// A block's accuracy and records (their buckets read by [`Record::buckets`]); `None` for
/// bytes that are no block (another program's string).
pub fn records(bytes: &[u8]) -> Option<(f64, Vec<Record<'_>>)> {
    let mut at = 0;
    let len = varint(bytes, &mut at)? as usize;
    let alpha = std::str::from_utf8(bytes.get(at..at.checked_add(len)?)?)
        .ok()?
        .parse()
        .ok()?;
    at += len;
    let mut records = Vec::with_capacity(SLOTS as usize);
    while at < bytes.len() {
        let len = varint(bytes, &mut at)? as usize;
        let body = bytes.get(at..at.checked_add(len)?)?;
        at += len;
        let (&slot, rest) = body.split_first()?;
        records.push(Record {
            slot: slot & !CODED,
            token: rest.get(..4)?.try_into().ok()?,
            coded: slot & CODED != 0,
            bytes: &rest[4..],
        });
    }
    Some((alpha, records))
}

/// One part of a slice, as a block holds it.
#[derive(Debug, Clone, PartialEq)]
pub struct Part {
    pub slot: u8,
    pub token: [u8; 4],
    pub buckets: Buckets,
}

/// A block's accuracy and parts, every record's buckets read; `None` for bytes that are no
/// block (another program's string).
pub fn decode(bytes: &[u8]) -> Option<(f64, Vec<Part>)> {
    let (alpha, records) = records(bytes)?;
    let parts = records
        .iter()
        .map(|r| {
            let mut buckets = Buckets::default();
            r.buckets(&mut buckets)?;
            Some(Part {
                slot: r.slot,
                token: r.token,
                buckets,
            })
        })
        .collect::<Option<_>>()?;
    Some((alpha, parts))
}

/// A token as the hash's `m` field holds it (eight hex digits).
pub fn token_text(token: [u8; 4]) -> String {
    format!("{:08x}", u32::from_be_bytes(token))
}

pub fn token_of(text: &str) -> Option<[u8; 4]> {
    (text.len() == 8)
        .then(|| u32::from_str_radix(text, 16).ok())
        .flatten()
        .map(u32::to_be_bytes)
}

/// A slice's buckets, with their accuracy.
pub type Slice = Option<(f64, Buckets)>;

/// A record of a slice [`read`] asked: the slice's place, its block's accuracy, the record and,
/// with a memo, where its block's answers are and its place among them.
type Found<'a> = (usize, f64, Record<'a>, Option<(usize, usize)>);

/// What one statistic gave for each record of the blocks read before, by the block's bytes
/// (docs/layout.md, "Quantile slices"): a dashboard's refresh decodes only the blocks that
/// changed since. A record's answer depends on its bytes and the statistic alone (the block's
/// accuracy is among its bytes), so an answer kept is never stale: a block rewritten (a pack
/// after a late write, a record replaced) has other bytes and is decoded again. Bounded: two
/// generations of at most half [`Memo::LIMIT`] bytes each (a block's bytes and its answers);
/// when the newer one is full it becomes the older and the older goes, and a block found in
/// the older is carried into the newer.
pub struct Memo<T> {
    held: std::sync::Mutex<[Generation<T>; 2]>,
    limit: usize,
}

/// A [`Memo`]'s generation: statistic → block's bytes → each record's answer; its bytes.
type Generation<T> = (
    hashbrown::HashMap<String, hashbrown::HashMap<Box<[u8]>, Answers<T>>>,
    usize,
);

/// Each record's answer of a block, in the block's order (`None`: bytes we did not write).
type Answers<T> = std::sync::Arc<[Option<T>]>;

impl<T> Default for Memo<T> {
    fn default() -> Self {
        Memo {
            held: Default::default(),
            limit: Self::LIMIT,
        }
    }
}

impl<T> Memo<T> {
    /// The bytes a memo keeps at most: one statistic of a day of minutes of about 300 timers
    /// at 60 values a minute.
    pub const LIMIT: usize = 64 << 20;

    /// The answers of `statistic` kept for `block`.
    fn get(&self, statistic: &str, block: &[u8]) -> Option<Answers<T>> {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(answers) = held[0].0.get(statistic).and_then(|m| m.get(block)) {
            return Some(answers.clone());
        }
        let answers = held[1].0.get_mut(statistic)?.remove(block)?;
        held[1].1 -= Self::cost(block, &answers);
        self.put(&mut held, statistic, block, answers.clone());
        Some(answers)
    }

    /// Keeps `answers` of `statistic` for `block`.
    fn keep(&self, statistic: &str, block: &[u8], answers: Answers<T>) {
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        self.put(&mut held, statistic, block, answers);
    }

    fn put(
        &self,
        held: &mut [Generation<T>; 2],
        statistic: &str,
        block: &[u8],
        answers: Answers<T>,
    ) {
        let cost = Self::cost(block, &answers);
        if cost > self.limit / 2 {
            return;
        }
        if held[0].1 + cost > self.limit / 2 {
            held[1] = std::mem::take(&mut held[0]);
        }
        let previous = held[0]
            .0
            .entry_ref(statistic)
            .or_default()
            .insert(block.into(), answers);
        held[0].1 += cost - previous.map_or(0, |a| Self::cost(block, &a));
    }

    /// What an entry holds: its bytes, its answers and about what a map's entry costs besides.
    fn cost(block: &[u8], answers: &[Option<T>]) -> usize {
        block.len() + std::mem::size_of_val(answers) + 64
    }
}

/// The quantile buckets of `series` at precision `p` for each of `slices` (ascending): from
/// their hashes alone, or, where the precision is packed (`hashes_from` given: [`hashes_from`]),
/// from the hashes of the slices from there on and from the blocks of every slice, a slice's
/// parts added (a part whose token a hash still holds is that hash's, which holds at least
/// what moved; a record that is no record of ours is no part). Each slice found is handed to
/// `each` (its accuracy's mapping and its buckets), in order; what it returns is the slice's
/// answer, `None` for a slice with nothing. A slice of one part (nearly every packed one) is
/// read into one buffer used again for the next, and a mapping is made once for the slices of
/// one accuracy (nearly always all of them).
///
/// With a `memo` and the statistic `each` computes, a slice of one part in a block is answered
/// by what `each` gave for it before ([`Memo`]), and a block not remembered has each of its
/// records answered and kept: `each` then runs for records not asked and not for those
/// remembered, so it must depend on the buckets alone.
pub async fn read<T: Clone>(
    conn: &Connection,
    keys: &Keys,
    (series, kind, p): (&str, StatKind, u64),
    slices: &[u64],
    hashes_from: Option<u64>,
    memo: Option<(&Memo<T>, &str)>,
    mut each: impl FnMut(&Mapping, &Buckets) -> T,
) -> Result<Vec<Option<T>>, StoreError> {
    let asked = slices.partition_point(|s| *s < hashes_from.unwrap_or(0));
    let hashes: Vec<Vec<(String, String)>> = conn
        .each_key(
            "HGETALL",
            slices[asked..]
                .iter()
                .map(|s| keys.hist_slice(p, series, kind, *s)),
        )
        .await?;
    let mut held: Vec<Slice> = vec![None; asked];
    let mut sealed: HashMap<u64, [u8; 4]> = HashMap::new();
    for (s, hash) in slices[asked..].iter().zip(&hashes) {
        if let Some(token) = hash
            .iter()
            .find(|(f, _)| f == TOKEN_FIELD)
            .and_then(|(_, t)| token_of(t))
        {
            sealed.insert(*s, token);
        }
        held.push(super::reader::parse_buckets(hash));
    }
    let blocks: Vec<Option<Vec<u8>>> = match (hashes_from, slices.first(), slices.last()) {
        (Some(_), Some(first), Some(last)) => {
            let (first, last) = (locate(p, *first).0, locate(p, *last).0);
            conn.each_key(
                "GET",
                (first..=last).map(|n| block_key(keys, p, series, kind, n)),
            )
            .await?
        }
        _ => Vec::new(),
    };
    // The slices asked are ascending, nearly always every one of a range: a slice's place is
    // its distance from the first, checked, else found by a search.
    let at = |slice: u64| {
        let guess = ((slice.checked_sub(slices[0])?) / p.max(1)) as usize;
        match slices.get(guess) {
            Some(s) if *s == slice => Some(guess),
            _ => slices.binary_search(&slice).ok(),
        }
    };
    let mut mapping = Mapping::default();
    let mut answer = |alpha: f64, buckets: &Buckets| {
        if mapping.alpha() != alpha {
            mapping = Mapping::new(alpha);
        }
        each(&mapping, buckets)
    };
    let mut read = Buckets::default();
    let first_block = slices.first().map_or(0, |s| locate(p, *s).0);
    let mut found: Vec<Found> = Vec::new();
    let mut remembered: Vec<Answers<T>> = Vec::new();
    for (n, bytes) in (first_block..).zip(&blocks) {
        let Some(bytes) = bytes.as_deref() else {
            continue;
        };
        let Some((alpha, records)) = records(bytes) else {
            continue;
        };
        let answers = memo.map(|(memo, statistic)| {
            memo.get(statistic, bytes).unwrap_or_else(|| {
                let answers: Answers<T> = records
                    .iter()
                    .map(|r| r.buckets(&mut read).map(|()| answer(alpha, &read)))
                    .collect();
                memo.keep(statistic, bytes, answers.clone());
                answers
            })
        });
        let block = answers.map(|a| {
            remembered.push(a);
            remembered.len() - 1
        });
        for (j, record) in records.into_iter().enumerate() {
            let slice = (n * SLOTS + u64::from(record.slot)) * p;
            let Some(i) = at(slice) else { continue };
            if sealed.get(&slice) != Some(&record.token) {
                found.push((i, alpha, record, block.map(|b| (b, j))));
            }
        }
    }
    // In the slices' order, a slice's records in the order their blocks hold them (a pack
    // writes a block's records in the order its walk met the slices): counted a slice, then
    // each put in its place; `ends[i]` is then where slice `i`'s records end.
    let mut ends = vec![0; slices.len()];
    for (i, ..) in &found {
        ends[*i] += 1;
    }
    let mut sum = 0;
    for end in &mut ends {
        (sum, *end) = (sum + *end, sum);
    }
    let mut ordered = found.clone();
    for record in found {
        ordered[ends[record.0]] = record;
        ends[record.0] += 1;
    }
    let mut out = Vec::with_capacity(slices.len());
    for (i, held) in held.into_iter().enumerate() {
        let from = i.checked_sub(1).map_or(0, |j| ends[j]);
        out.push(match (held, &ordered[from..ends[i]]) {
            (None, []) => None,
            (None, [(_, _, _, Some((b, j)))]) => remembered[*b][*j].clone(),
            (None, [(_, alpha, record, None)]) => {
                record.buckets(&mut read).map(|()| answer(*alpha, &read))
            }
            (mut slice, records) => {
                for (_, alpha, record, _) in records {
                    if record.buckets(&mut read).is_some() {
                        add(&mut slice, *alpha, &read);
                    }
                }
                slice.map(|(alpha, buckets)| answer(alpha, &buckets))
            }
        });
    }
    Ok(out)
}

/// Adds `buckets` of accuracy `alpha` into a slice read so far (a foreign accuracy's buckets
/// at their estimates, as merging hashes does).
pub(crate) fn add(slice: &mut Slice, alpha: f64, buckets: &Buckets) {
    match slice {
        None => *slice = Some((alpha, buckets.clone())),
        Some((mine, all)) if *mine == alpha => all.merge(buckets),
        Some((mine, all)) => {
            let (to, from) = (Mapping::new(*mine), Mapping::new(alpha));
            for (b, w) in buckets.iter() {
                all.add(to.bucket(from.value(b)), w);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn buckets(list: &[(Bucket, f64)]) -> Buckets {
        let mut b = Buckets::default();
        for &(bucket, w) in list {
            b.add(bucket, w);
        }
        b
    }

    #[test]
    fn a_memo_keeps_two_generations_of_at_most_half_its_limit() {
        let memo = Memo::<u64> {
            held: Default::default(),
            limit: 2 * (Memo::<u64>::cost(&[0; 100], &[Some(0)]) * 3),
        };
        let block = |n: u8| [n; 100];
        let answers = |n: u64| -> Answers<u64> { vec![Some(n)].into() };
        for n in 0..3 {
            memo.keep("p99", &block(n), answers(n.into()));
        }
        memo.keep("p50", &block(0), answers(50));
        // The fourth did not fit beside the first three: they went into the older generation.
        let held = |memo: &Memo<u64>| memo.held.lock().unwrap()[0].1;
        assert_eq!(held(&memo), Memo::<u64>::cost(&[0; 100], &[Some(0)]));
        assert_eq!(memo.get("p99", &block(1)).as_deref(), Some(&[Some(1)][..]));
        assert_eq!(memo.get("p50", &block(0)).as_deref(), Some(&[Some(50)][..]));
        assert_eq!(memo.get("p50", &block(1)), None, "another statistic");
        assert_eq!(memo.get("p99", &[1; 99]), None, "other bytes");
        // Three more: the newer generation (p50's, p99 1's carried over) became the older, and
        // the first generation's are gone but what was carried.
        for n in 3..6 {
            memo.keep("p99", &block(n), answers(n.into()));
        }
        assert_eq!(memo.get("p99", &block(0)), None);
        assert_eq!(memo.get("p99", &block(2)), None);
        assert_eq!(memo.get("p99", &block(1)).as_deref(), Some(&[Some(1)][..]));
        assert_eq!(memo.get("p99", &block(5)).as_deref(), Some(&[Some(5)][..]));
        // What is larger than a generation is not kept.
        memo.keep("p99", &[9; 1000], answers(9));
        assert_eq!(memo.get("p99", &[9; 1000]), None);
        let total = |memo: &Memo<u64>| {
            let held = memo.held.lock().unwrap();
            held[0].1 + held[1].1
        };
        assert!(total(&memo) <= memo.limit, "{}", total(&memo));
    }

    #[test]
    fn a_block_reads_back_what_was_packed() {
        let one = buckets(&[
            (Bucket::Negative(7), 2.0),
            (Bucket::Zero, 1.0),
            (Bucket::Positive(-300), 1.0),
            (Bucket::Positive(345), 3.0),
            (Bucket::Positive(346), 10.0 / 3.0),
            (Bucket::Positive(i32::MAX), 1e15),
            (Bucket::Negative(i32::MIN + 1), (1u64 << 52) as f64),
        ]);
        let two = buckets(&[(Bucket::Positive(1), 1.0)]);
        let mut block = header("0.01");
        block.extend(record(0, [1, 2, 3, 4], &one));
        block.extend(record(63, [0xff; 4], &two));
        block.extend(record(5, [0; 4], &Buckets::default()));
        let (alpha, parts) = decode(&block).unwrap();
        assert_eq!(alpha, 0.01);
        assert_eq!(parts.len(), 3);
        assert_eq!((parts[0].slot, parts[0].token), (0, [1, 2, 3, 4]));
        assert_eq!(parts[0].buckets, one);
        assert_eq!((parts[1].slot, parts[1].buckets.clone()), (63, two));
        assert_eq!(parts[2].buckets, Buckets::default());
    }

    /// A record as releases before the coded buckets wrote it: its slot's high bit clear, a
    /// varint a bucket.
    fn varint_record(slot: u8, token: [u8; 4], buckets: &Buckets) -> Vec<u8> {
        let mut body = vec![slot];
        body.extend_from_slice(&token);
        let mut sorted: Vec<(i64, f64)> = buckets.iter().map(|(b, w)| (key(b), w)).collect();
        sorted.sort_unstable_by_key(|(k, _)| *k);
        let mut prev = 0i64;
        for (k, w) in sorted {
            put_bucket(&mut body, k - prev, w);
            prev = k;
        }
        let mut out = Vec::new();
        put_varint(&mut out, body.len() as u64);
        out.extend_from_slice(&body);
        out
    }

    #[test]
    fn an_earlier_releases_varint_records_read_back_beside_coded_ones() {
        let mut list: Vec<(Bucket, f64)> = (340..384).map(|i| (Bucket::Positive(i), 1.0)).collect();
        // Length, slot, token, the first bucket (its step from 0: three bytes), then a byte each.
        assert_eq!(
            varint_record(0, [0; 4], &buckets(&list)).len(),
            1 + 1 + 4 + 3 + 43
        );
        list[10].1 = 64.0;
        list[20].0 = Bucket::Positive(400);
        list.push((Bucket::Zero, 2.5));
        let old = buckets(&list);
        let new = buckets(&[(Bucket::Positive(7), 3.0), (Bucket::Negative(2), 1.0)]);
        let mut block = header("0.01");
        block.extend(varint_record(9, [1, 2, 3, 4], &old));
        block.extend(record(10, [5, 6, 7, 8], &new));
        let (_, parts) = decode(&block).unwrap();
        assert_eq!(
            parts,
            [
                Part {
                    slot: 9,
                    token: [1, 2, 3, 4],
                    buckets: old,
                },
                Part {
                    slot: 10,
                    token: [5, 6, 7, 8],
                    buckets: new,
                },
            ]
        );
    }

    #[test]
    fn a_busy_minutes_buckets_take_under_six_bits_each() {
        // 127 neighbouring buckets, counts from 1 in the tails to 20 in the middle, as a
        // thousand latencies give them (and every fifth bucket one further on: a gap): the
        // header (length, slot, token, count, first key, parameter), then under six bits a
        // bucket, a fifth fewer bytes than the varints.
        let list: Vec<(Bucket, f64)> = (0..127)
            .map(|i| {
                let x = (i as f64 - 63.0) / 30.0;
                let count = (20.0 * (-x * x).exp()).round() + 1.0;
                (Bucket::Positive(400 + i + i / 5), count)
            })
            .collect();
        let b = buckets(&list);
        let r = record(5, [0; 4], &b);
        assert!(
            r.len() <= 2 + 1 + 4 + 1 + 2 + 1 + 127 * 6 / 8,
            "{}",
            r.len()
        );
        let old = varint_record(5, [0; 4], &b).len();
        assert!(r.len() * 10 < old * 7, "{} against {old}", r.len());
        let mut block = header("0.01");
        block.extend(r);
        assert_eq!(decode(&block).unwrap().1[0].buckets, b);
    }

    #[test]
    fn coded_counts_at_the_edges_of_their_codes_read_back() {
        let list = [
            (Bucket::Negative(i32::MIN + 1), (1u64 << 52) as f64),
            (Bucket::Negative(3), 0.0),
            (Bucket::Zero, 0.25),
            (Bucket::Positive(i32::MIN), 1.0),
            (Bucket::Positive(-1), ((1u64 << 52) - 1) as f64),
            (Bucket::Positive(0), 1e300),
            (Bucket::Positive(1), f64::MIN_POSITIVE),
            (Bucket::Positive(1 << 20), 3.0),
            (Bucket::Positive(i32::MAX), 1e15),
        ];
        // Whole counts alone (each code the count less one), then fractions among them.
        let whole = [
            (Bucket::Positive(2), 1.0),
            (Bucket::Positive(3), ((1u64 << 52) - 1) as f64),
            (Bucket::Positive(9), 1.0),
        ];
        let mut block = header("0.02");
        block.extend(record(1, [2; 4], &buckets(&whole)));
        assert_eq!(decode(&block).unwrap().1[0].buckets, buckets(&whole));
        for n in 1..=list.len() {
            let b = buckets(&list[..n]);
            let mut block = header("0.02");
            block.extend(record(63, [9; 4], &b));
            let (_, parts) = decode(&block).unwrap();
            assert_eq!((parts[0].slot, &parts[0].buckets), (63, &b), "{n}");
        }
    }

    #[test]
    fn a_record_that_is_none_of_ours_spoils_only_itself() {
        let b = buckets(&[(Bucket::Positive(460), 3.0), (Bucket::Positive(463), 1.0)]);
        let mut block = header("0.01");
        let mut bad = record(1, [0, 0, 0, 1], &b);
        // Its bucket count (the first byte after length, slot and token): more buckets than
        // its bits could hold.
        bad[6] = 0x7f;
        for r in [
            record(0, [0, 0, 0, 0], &b),
            bad,
            record(2, [0, 0, 0, 2], &b),
        ] {
            block.extend(r);
        }
        let (alpha, records) = records(&block).expect("a block");
        assert_eq!(alpha, 0.01);
        let mut read = Buckets::default();
        let got: Vec<Option<Buckets>> = records
            .iter()
            .map(|r| r.buckets(&mut read).map(|()| read.clone()))
            .collect();
        assert_eq!(got, [Some(b.clone()), None, Some(b)]);
        // Read whole, the block is no block.
        assert_eq!(decode(&block), None);
    }

    #[test]
    fn what_is_no_block_decodes_to_nothing() {
        for bytes in [
            &b""[..],
            b"\x05ab",
            b"\x040.01\x09\x00",
            b"\x040.01\x06\x00\x01\x02\x03\x04\x80",
            b"\x040.01\x06\x00\x01\x02\x03\x04\x7f",
        ] {
            assert_eq!(decode(bytes), None, "{bytes:?}");
        }
        assert_eq!(decode(b"\x04junk"), None);
    }

    /// A fixed stream of pseudo-random numbers from `seed`.
    fn xorshift(mut state: u64) -> impl FnMut() -> u64 {
        move || {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            state
        }
    }

    #[test]
    fn no_bytes_make_the_decoder_panic() {
        // Another program's string under a block's name: random bytes, and a real block's
        // bytes with one changed, decode to something or nothing, never a panic.
        let mut block = header("0.01");
        let b = buckets(&[(Bucket::Positive(300), 3.0), (Bucket::Zero, 0.5)]);
        block.extend(record(3, [9; 4], &b));
        let mut next = xorshift(52);
        for _ in 0..20_000 {
            let len = (next() % 40) as usize;
            let random: Vec<u8> = (0..len).map(|_| next() as u8).collect();
            let _ = decode(&random);
            let mut changed = block.clone();
            let at = (next() as usize) % changed.len();
            changed[at] = next() as u8;
            let _ = decode(&changed);
        }
    }

    #[test]
    fn random_slices_read_back_whatever_their_codes() {
        // Buckets of every kind, steps from one to thousands, counts from one to huge and
        // fractions: the bits read back at every alignment, through the word's loads.
        let mut next = xorshift(53);
        for _ in 0..2_000 {
            let mut b = Buckets::default();
            let mut i = (next() % 2000) as i32 - 1000;
            for _ in 0..(next() % 300) {
                i = i.saturating_add(
                    1 + (next() % [1, 1, 1, 3, 5000][(next() % 5) as usize]) as i32,
                );
                let w = match next() % 10 {
                    0 => (next() % (1 << 53)) as f64,
                    1 => (next() % 1000) as f64 / 7.0,
                    2 => 0.0,
                    _ => (1 + next() % 40) as f64,
                };
                let bucket = match next() % 20 {
                    0 => Bucket::Zero,
                    1 => Bucket::Negative(i),
                    _ => Bucket::Positive(i),
                };
                b.add(bucket, w);
            }
            let mut block = header("0.01");
            block.extend(record((next() % 64) as u8, [7; 4], &b));
            assert_eq!(decode(&block).unwrap().1[0].buckets, b);
        }
    }

    #[test]
    fn a_slice_finds_its_block_and_slot() {
        assert_eq!(locate(60, 0), (0, 0));
        assert_eq!(locate(60, 63 * 60), (0, 63));
        assert_eq!(locate(60, 64 * 60), (1, 0));
        assert_eq!(expires_at(60, 1, 600), 127 * 60 + 600);
        assert_eq!(keep_from(1000, 60), 660);
        assert_eq!(
            token_of(&token_text([0, 1, 0xab, 0xff])),
            Some([0, 1, 0xab, 0xff])
        );
        assert_eq!(token_of("xyz"), None);
    }
}
