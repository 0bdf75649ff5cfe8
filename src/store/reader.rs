//! Reading the layout back (docs/reading.md): the book's readers (`get_counter`, `get_stats`) and the
//! rest of what the agent writes, over one connection. Shared by the CLI and the HTTP API.

use std::collections::BTreeMap;

use serde::Serialize;

use super::keys::{self, Keys};
use super::{Connection, StoreError};
use crate::aggregate::{Bucket, Buckets, Mapping, StatKind};

/// One hour of statistics, as the book's `get_stats` returns them.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct StatsView {
    pub min: f64,
    pub max: f64,
    pub count: f64,
    pub sum: f64,
    pub sumsq: f64,
    pub average: f64,
    /// Sample standard deviation; the variance is clamped at 0 so float noise never yields NaN.
    pub stddev: f64,
}

impl StatsView {
    fn from_zset(data: &BTreeMap<String, f64>) -> Option<StatsView> {
        let get = |k: &str| data.get(k).copied();
        let (count, sum, sumsq) = (get("count")?, get("sum")?, get("sumsq")?);
        let average = if count > 0.0 { sum / count } else { 0.0 };
        let numerator = sumsq - if count > 0.0 { sum * sum / count } else { 0.0 };
        let denominator = if count - 1.0 > 0.0 { count - 1.0 } else { 1.0 };
        Some(StatsView {
            min: get("min").unwrap_or(0.0),
            max: get("max").unwrap_or(0.0),
            count,
            sum,
            sumsq,
            average,
            stddev: (numerator / denominator).max(0.0).sqrt(),
        })
    }
}

/// A series in an index and the precisions it is kept at.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct KnownSeries {
    pub series: String,
    pub precisions: Vec<u64>,
}

/// Recent (newest first) and common (most frequent first) entries of one log.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct LogView {
    pub recent: Vec<String>,
    pub common: Vec<(String, f64)>,
}

/// Which buckets quantiles are read from: the slices at `precision` from `first` to `last`
/// (slice starts, both included).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QuantileRange {
    pub precision: u64,
    pub first: u64,
    pub last: u64,
}

impl QuantileRange {
    /// The slices at `precision` that overlap the `secs` seconds up to `now` (the newest one
    /// still filling).
    pub fn last(secs: u64, precision: u64, now: u64) -> QuantileRange {
        let precision = precision.max(1);
        QuantileRange {
            precision,
            first: keys::slice(now.saturating_sub(secs), precision),
            last: keys::slice(now, precision),
        }
    }

    /// The UTC hour that holds `at`.
    pub fn hour(at: u64) -> QuantileRange {
        QuantileRange::last(0, 3600, at)
    }

    fn slices(&self) -> impl Iterator<Item = u64> {
        (self.first..=self.last).step_by(self.precision as usize)
    }

    /// How many slices the range spans (at least one).
    pub fn slice_count(&self) -> u64 {
        (self.last.saturating_sub(self.first)) / self.precision + 1
    }
}

/// Keys a listing's `SCAN` looks at, at most, before it answers with what it found.
const SCAN_EXAMINED: usize = 100_000;

/// Quantiles read back from the buckets.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct QuantilesView {
    /// `(q, value)`, each value within `relative_accuracy` of the exact quantile of what was
    /// sent (relative to it; values within 1e-9 of zero read as 0).
    pub quantiles: Vec<(f64, f64)>,
    pub relative_accuracy: f64,
    /// The weighted number of values (each counted `1 / rate`).
    pub count: f64,
    pub precision: u64,
    /// The slices read, oldest first (those without values too).
    pub slices: Vec<u64>,
    /// Each slice's own count and quantiles, oldest first, slices without values left out
    /// (only when asked for).
    pub by_slice: Vec<SliceQuantiles>,
    /// The oldest slice that may still receive values (`query::arriving_from`): the agent's
    /// queries fill it in from its config; a bare reader does not know it.
    pub arriving_from: Option<u64>,
}

/// One slice's quantiles, for a chart over time.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct SliceQuantiles {
    pub slice: u64,
    pub count: f64,
    pub quantiles: Vec<(f64, f64)>,
}

fn quantiles_of(buckets: &Buckets, mapping: &Mapping, qs: &[f64]) -> Vec<(f64, f64)> {
    qs.iter()
        .filter_map(|&q| Some((q, buckets.quantile(mapping, q)?)))
        .collect()
}

/// A bucket hash as written by the flush: its accuracy and its buckets; `None` when it holds
/// none.
pub(crate) fn parse_buckets(fields: &[(String, String)]) -> Option<(f64, Buckets)> {
    let alpha = fields.iter().find(|(f, _)| f == "a")?.1.parse().ok()?;
    let mut buckets = Buckets::default();
    for (field, count) in fields {
        if let (Some(bucket), Ok(count)) = (Bucket::parse(field), count.parse::<f64>()) {
            buckets.add(bucket, count);
        }
    }
    Some((alpha, buckets))
}

pub struct Reader {
    conn: Connection,
    keys: Keys,
}

impl Reader {
    pub fn new(conn: Connection, keys: Keys) -> Reader {
        Reader { conn, keys }
    }

    /// The names it reads.
    pub fn keys(&self) -> &Keys {
        &self.keys
    }

    /// The book's `get_counter`: `[(slice, count)]` oldest first; empty when unknown.
    pub async fn counter(
        &mut self,
        series: &str,
        precision: u64,
    ) -> Result<Vec<(u64, i64)>, StoreError> {
        let raw: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(self.keys.counter(precision, series))
            .query_async(&mut self.conn)
            .await?;
        Ok(counts(raw))
    }

    /// [`Reader::counter`] and what its hash's blocks hold ([`Reader::history`], `Counter`),
    /// read in one transaction (in a cluster, in the hash's slot): a slice the cleaner moves
    /// from the hash into its block between two reads would be counted in both.
    pub async fn counter_with_history(
        &mut self,
        series: &str,
        precision: u64,
        range_now: ((u64, u64), u64),
        cut: super::history::Geometry,
    ) -> Result<(Vec<(u64, i64)>, Vec<(u64, f64)>), StoreError> {
        let hash = self.keys.counter(precision, series);
        let (raw, older) = self
            .blocks(
                &hash,
                precision,
                range_now,
                (cut, super::history::Family::Counter),
                true,
            )
            .await?;
        let raw: Vec<(String, String)> = match raw {
            Some(raw) => redis::from_redis_value(raw).map_err(redis::RedisError::from)?,
            None => Vec::new(),
        };
        Ok((counts(raw), older))
    }

    /// What the blocks of the hash `hash` at `precision` (a long archive's older slices,
    /// [`crate::store::history`]) hold from slice `from` to slice `until`, as they stand at `now`, oldest first:
    /// the slots asked of each block of the configured `cut`, and of the other cut's where one
    /// exists ([`super::history::Blocks`]).
    pub async fn history(
        &mut self,
        hash: &str,
        precision: u64,
        range_now: ((u64, u64), u64),
        cut_family: (super::history::Geometry, super::history::Family),
    ) -> Result<Vec<(u64, f64)>, StoreError> {
        Ok(self
            .blocks(hash, precision, range_now, cut_family, false)
            .await?
            .1)
    }

    /// [`Reader::history`], with the hash `hash` read with the blocks where `with_hash`
    /// ([`super::history::Asked::with_hash`]): its reply.
    async fn blocks(
        &mut self,
        hash: &str,
        precision: u64,
        ((from, until), now): ((u64, u64), u64),
        (cut, family): (super::history::Geometry, super::history::Family),
        with_hash: bool,
    ) -> Result<(Option<redis::Value>, Vec<(u64, f64)>), StoreError> {
        let p = precision.max(1);
        let slices: Vec<i64> = (from / p..=until / p).map(|i| (i * p) as i64).collect();
        let mut values = vec![vec![None; slices.len()]];
        let asked = super::history::Asked {
            name: hash.to_string(),
            precision: p,
            cut,
            slices: &slices,
            family,
            values: 0,
            with_hash,
        };
        let blocks = super::history::Blocks::plan(&self.keys, now, vec![asked]);
        let hash = blocks.add(&self.conn, None, None, &mut values).await?;
        let values = values.pop().unwrap_or_default();
        let older = slices
            .iter()
            .zip(values)
            .filter_map(|(s, v)| Some((*s as u64, v?)))
            .collect();
        Ok((hash.into_iter().next().map(|(_, _, reply)| reply), older))
    }

    /// The book's `get_stats` for the current hour; `None` when there are none.
    pub async fn stats(
        &mut self,
        series: &str,
        kind: StatKind,
    ) -> Result<Option<StatsView>, StoreError> {
        let data: BTreeMap<String, f64> = redis::cmd("ZRANGE")
            .arg(self.keys.stats(series, kind))
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query_async(&mut self.conn)
            .await?;
        Ok(StatsView::from_zset(&data))
    }

    /// Quantiles `qs` of a series' values over `range`, merged from its bucket hashes (where
    /// its precision is packed, those from `hashes_from` on, and its blocks:
    /// [`super::quantile_blocks::read`]); `None` when the range holds none. Buckets of another
    /// accuracy than the first found are taken at their estimates (their error adds to it).
    /// With `by_slice`, each slice's quantiles too.
    pub async fn quantiles(
        &mut self,
        (series, kind): (&str, StatKind),
        qs: &[f64],
        range: QuantileRange,
        (by_slice, hashes_from): (bool, Option<u64>),
    ) -> Result<Option<QuantilesView>, StoreError> {
        let slices: Vec<u64> = range.slices().collect();
        let mut merged: super::quantile_blocks::Slice = None;
        let mut each = Vec::new();
        // A block's slices at a time: what is held at once stays bounded however long the
        // range, and each block is read once.
        let block = |s: &u64| super::quantile_blocks::locate(range.precision, *s).0;
        for batch in slices.chunk_by(|a, b| block(a) == block(b)) {
            let read = super::quantile_blocks::read(
                &self.conn,
                &self.keys,
                (series, kind, range.precision),
                batch,
                hashes_from,
                None,
                |mapping, buckets| {
                    super::quantile_blocks::add(&mut merged, mapping.alpha(), buckets);
                    let count = buckets.total();
                    (by_slice && count > 0.0).then(|| (count, quantiles_of(buckets, mapping, qs)))
                },
            )
            .await?;
            each.extend(batch.iter().zip(read).filter_map(|(slice, q)| {
                let (count, quantiles) = q.flatten()?;
                Some(SliceQuantiles {
                    slice: *slice,
                    count,
                    quantiles,
                })
            }));
        }
        let Some((alpha, buckets)) = merged.filter(|(_, b)| b.total() > 0.0) else {
            return Ok(None);
        };
        let mapping = Mapping::new(alpha);
        Ok(Some(QuantilesView {
            quantiles: quantiles_of(&buckets, &mapping, qs),
            relative_accuracy: mapping.alpha(),
            count: buckets.total(),
            precision: range.precision,
            slices,
            by_slice: each,
            arriving_from: None,
        }))
    }

    /// Series with statistics of `kind` this hour (their `stats:` ZSET exists; with `long`, a
    /// packed quantile precision `precision`: or a block of its quantile slices there) or, with
    /// `kind` `None`, sets with a slice at `precision` (with `long`, a precision kept in blocks:
    /// or a block there), whose name matches `pattern` (a glob; a plain word matches anywhere),
    /// found with a bounded `SCAN`, by name: at most `max`, and whether that is all of them.
    pub async fn series_of(
        &mut self,
        kind: Option<StatKind>,
        (precision, long): (u64, bool),
        pattern: Option<&str>,
        max: usize,
    ) -> Result<(Vec<String>, bool), StoreError> {
        let prefix = self.keys.prefix();
        let scans = match kind {
            Some(kind) if long => vec![
                format!("{prefix}stats:*:{}", kind.redis_name()),
                self.keys.hist_blocks_pattern(precision, kind),
            ],
            Some(kind) => vec![format!("{prefix}stats:*:{}", kind.redis_name())],
            None if long => vec![
                format!("{prefix}set:{precision}:*"),
                self.keys.set_blocks_pattern(precision),
            ],
            None => vec![format!("{prefix}set:{precision}:*")],
        };
        let mut names = std::collections::BTreeSet::new();
        let keys = &self.keys;
        let mut complete = true;
        for scan in scans {
            complete &= self
                .conn
                .scan_keys(&scan, SCAN_EXAMINED, |key| {
                    let name = match kind {
                        Some(kind) => keys.series_of_stats(&key, kind).or_else(|| {
                            keys.hist_of_block(&key, precision, kind)
                                .map(str::to_string)
                        }),
                        None => keys
                            .set_of(&key)
                            .map(|(_, series, _)| series)
                            .or_else(|| keys.set_of_block(&key, precision))
                            .map(str::to_string),
                    };
                    if let Some(name) = name.filter(|n| pattern.is_none_or(|p| glob_match(p, n))) {
                        names.insert(name);
                    }
                    names.len() <= max
                })
                .await?;
        }
        let all = complete && names.len() <= max;
        Ok((names.into_iter().take(max).collect(), all))
    }

    /// The slowest timers by the hour's average, slowest first.
    pub async fn slowest(&mut self, limit: usize) -> Result<Vec<(String, f64)>, StoreError> {
        Ok(redis::cmd("ZREVRANGE")
            .arg(self.keys.slowest())
            .arg(0)
            .arg(limit.max(1) - 1)
            .arg("WITHSCORES")
            .query_async(&mut self.conn)
            .await?)
    }

    pub async fn log(
        &mut self,
        name: &str,
        severity: &str,
        limit: usize,
    ) -> Result<LogView, StoreError> {
        let recent = redis::cmd("LRANGE")
            .arg(self.keys.recent(name, severity))
            .arg(0)
            .arg(limit.max(1) - 1)
            .query_async(&mut self.conn)
            .await?;
        let common = redis::cmd("ZREVRANGE")
            .arg(self.keys.common(name, severity))
            .arg(0)
            .arg(limit.max(1) - 1)
            .arg("WITHSCORES")
            .query_async(&mut self.conn)
            .await?;
        Ok(LogView { recent, common })
    }

    /// Names and severities that have `recent:` logs, found with a bounded `SCAN`.
    pub async fn log_names(&mut self, max: usize) -> Result<Vec<(String, String)>, StoreError> {
        let prefix = self.keys.recent("", "");
        let prefix = &prefix[..prefix.len() - 1]; // `recent:` (the `:` between name and severity dropped)
        let mut names = std::collections::BTreeSet::new();
        self.conn
            .scan_keys(&format!("{prefix}*"), SCAN_EXAMINED, |key| {
                if let Some((name, severity)) = key[prefix.len()..].rsplit_once(':') {
                    names.insert((name.to_string(), severity.to_string()));
                }
                names.len() < max
            })
            .await?;
        Ok(names.into_iter().collect())
    }

    /// A gauge's current value.
    pub async fn gauge(&mut self, series: &str) -> Result<Option<f64>, StoreError> {
        Ok(redis::cmd("HGET")
            .arg(self.keys.gauges())
            .arg(series)
            .query_async(&mut self.conn)
            .await?)
    }

    /// A gauge's last value per slice at `precision`, oldest first.
    pub async fn gauge_samples(
        &mut self,
        series: &str,
        precision: u64,
    ) -> Result<Vec<(u64, f64)>, StoreError> {
        let raw: Vec<(String, f64)> = redis::cmd("HGETALL")
            .arg(self.keys.gauge(precision, series))
            .query_async(&mut self.conn)
            .await?;
        let mut samples: Vec<(u64, f64)> = raw
            .iter()
            .filter_map(|(s, v)| Some((s.parse().ok()?, *v)))
            .collect();
        samples.sort_unstable_by_key(|s| s.0);
        Ok(samples)
    }

    /// Distinct members per slice of a set at `precision` in its slices' HyperLogLogs, from
    /// slice `from` to slice `until`, oldest first; slices without members are left out.
    pub async fn set(
        &mut self,
        series: &str,
        precision: u64,
        (from, until): (u64, u64),
    ) -> Result<Vec<(u64, u64)>, StoreError> {
        let p = precision.max(1);
        let slices: Vec<u64> = (from.div_ceil(p)..=until / p).map(|i| i * p).collect();
        let counts: Vec<u64> = self
            .conn
            .each_key(
                "PFCOUNT",
                slices.iter().map(|s| self.keys.set(precision, series, *s)),
            )
            .await?;
        Ok(slices
            .into_iter()
            .zip(counts)
            .filter(|(_, n)| *n > 0)
            .collect())
    }

    /// The counter that counted most in the last two slices of its finest precision of a
    /// minute or more (else its finest), among the first [`BUSIEST_AMONG`] of the index; the
    /// first of them when none counted; `None` with no counter. With that precision.
    pub async fn busiest_counter(&mut self, now: u64) -> Result<Option<(String, u64)>, StoreError> {
        let index = self.keys.counter_index();
        let precisions = index_precisions(&mut self.conn, &index.key).await?;
        let Some(&precision) = precisions
            .iter()
            .filter(|&&p| p >= 60)
            .min()
            .or_else(|| precisions.iter().min())
        else {
            return Ok(None);
        };
        let start = format!("{precision}:");
        let members = lex_range(
            &mut self.conn,
            &index.key,
            format!("[{start}").as_bytes(),
            format!("({precision};").as_bytes(),
            BUSIEST_AMONG,
        )
        .await?;
        let slice = keys::slice(now, precision);
        let slices = [slice.saturating_sub(precision), slice];
        // One call per series, all at once: in a cluster their keys live in other slots.
        let counts: Vec<Vec<Option<i64>>> =
            futures_util::future::try_join_all(members.iter().map(|member| {
                let mut conn = self.conn.clone();
                let key = self.keys.counter(precision, &member[start.len()..]);
                async move {
                    redis::cmd("HMGET")
                        .arg(key)
                        .arg(&slices[..])
                        .query_async(&mut conn)
                        .await
                }
            }))
            .await?;
        let total =
            |c: &Vec<Option<i64>>| c.iter().flatten().map(|n| n.unsigned_abs()).sum::<u64>();
        // The first of the largest: `max_by_key` keeps the last.
        let busiest = counts
            .iter()
            .enumerate()
            .rev()
            .max_by_key(|(_, c)| total(c))
            .map(|(i, _)| members[i][start.len()..].to_string());
        Ok(busiest.map(|series| (series, precision)))
    }

    /// Series of an index (`known:` for counters, `known:gauge:` for gauges) whose name matches
    /// `pattern` (`*` any run, `?` one character), with their precisions, by name.
    ///
    /// The index is read in ranges, never whole in one call (a call over 700 000 members holds
    /// Redis for most of a second): members are `<precision>:<series>`, all scored 0, so a
    /// series prefix (the pattern's text before its first wildcard) is one lexical range per
    /// precision, each read [`KNOWN_BATCH`] members at a time; the precisions are found by
    /// skipping from one to the next.
    pub async fn known(
        &mut self,
        gauges: bool,
        pattern: Option<&str>,
    ) -> Result<Vec<KnownSeries>, StoreError> {
        let index = if gauges {
            self.keys.gauge_index()
        } else {
            self.keys.counter_index()
        };
        let glob = pattern.map(Glob::new);
        let prefix = glob.as_ref().map_or("", Glob::prefix);
        let mut by_series: BTreeMap<String, Vec<u64>> = BTreeMap::new();
        for p in index_precisions(&mut self.conn, &index.key).await? {
            index_series(&mut self.conn, &index.key, p, prefix, |series| {
                if glob.as_ref().is_none_or(|g| g.matches(series)) {
                    match by_series.get_mut(series) {
                        Some(precisions) => precisions.push(p),
                        None => {
                            by_series.insert(series.to_string(), vec![p]);
                        }
                    }
                }
            })
            .await?;
        }
        Ok(by_series
            .into_iter()
            .map(|(series, mut precisions)| {
                precisions.sort_unstable();
                KnownSeries { series, precisions }
            })
            .collect())
    }
}

/// `ZRANGEBYLEX key min max LIMIT 0 count`: an index read by range (every score is 0).
pub async fn lex_range(
    conn: &mut Connection,
    key: &str,
    min: &[u8],
    max: &[u8],
    count: usize,
) -> Result<Vec<String>, StoreError> {
    Ok(redis::cmd("ZRANGEBYLEX")
        .arg(key)
        .arg(min)
        .arg(max)
        .arg("LIMIT")
        .arg(0)
        .arg(count)
        .query_async(conn)
        .await?)
}

/// Index members read per call: Redis answers 10 000 in a few milliseconds, so no other client
/// waits long behind one of them.
pub const KNOWN_BATCH: usize = 10_000;

/// How many counters [`Reader::busiest_counter`] compares: the dashboard's first view costs
/// at most this many reads.
pub const BUSIEST_AMONG: usize = 1000;

/// The precisions an index (members `<precision>:<series>`, all scored 0) holds members of,
/// found by skipping from one to the next: a call per precision. A member that does not start
/// with a number is not ours and is skipped.
pub async fn index_precisions(conn: &mut Connection, key: &str) -> Result<Vec<u64>, StoreError> {
    let mut precisions = Vec::new();
    let mut from = b"-".to_vec();
    while let Some(first) = lex_range(conn, key, &from, b"+", 1).await?.pop() {
        match first.split(':').next().and_then(|p| p.parse::<u64>().ok()) {
            Some(p) => {
                precisions.push(p);
                // Past every member `<p>:…` (`;` follows `:`; `<p><digit>…` sorts before).
                from = format!("[{p};").into_bytes();
            }
            None => from = [b"(", first.as_bytes()].concat(),
        }
    }
    Ok(precisions)
}

/// The series of an index at precision `p` whose names start with `prefix`, in name order, to
/// `each`: one lexical range, read [`KNOWN_BATCH`] members at a time.
pub async fn index_series(
    conn: &mut Connection,
    key: &str,
    p: u64,
    prefix: &str,
    mut each: impl FnMut(&str),
) -> Result<(), StoreError> {
    let start = format!("{p}:{prefix}");
    let skip = start.len() - prefix.len();
    // No member holds the byte 0xFF (UTF-8 never does): the end of the prefix's range.
    let end = [b"(", start.as_bytes(), b"\xff"].concat();
    let mut at = [b"[", start.as_bytes()].concat();
    loop {
        let batch = lex_range(conn, key, &at, &end, KNOWN_BATCH).await?;
        for member in &batch {
            each(&member[skip..]);
        }
        match batch.last() {
            Some(last) if batch.len() == KNOWN_BATCH => at = [b"(", last.as_bytes()].concat(),
            _ => return Ok(()),
        }
    }
}

/// A glob (`*` any run, `?` one character), case sensitive, as Redis's `MATCH` without
/// character classes; `?` is one character, so tag values as sent (`city=Z?rich`) match as they
/// read. Compiled once, matched without allocating.
#[derive(Debug, Clone)]
pub struct Glob {
    pattern: Vec<char>,
    prefix: String,
}

impl Glob {
    pub fn new(pattern: &str) -> Glob {
        let literal = pattern.find(['*', '?']).unwrap_or(pattern.len());
        Glob {
            pattern: pattern.chars().collect(),
            prefix: pattern[..literal].to_string(),
        }
    }

    /// The text every match starts with: the pattern before its first wildcard.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn matches(&self, text: &str) -> bool {
        let pattern = &self.pattern;
        let char_at = |i: usize| text[i..].chars().next().unwrap_or_default();
        let (mut p, mut t) = (0, 0);
        // After a `*`: where it stands in the pattern, and how far into the text it reaches.
        let mut star: Option<(usize, usize)> = None;
        while t < text.len() {
            let c = char_at(t);
            if p < pattern.len() && (pattern[p] == '?' || pattern[p] == c) {
                p += 1;
                t += c.len_utf8();
            } else if p < pattern.len() && pattern[p] == '*' {
                star = Some((p, t));
                p += 1;
            } else if let Some((sp, st)) = star {
                p = sp + 1;
                t = st + char_at(st).len_utf8();
                star = Some((sp, t));
            } else {
                return false;
            }
        }
        pattern[p..].iter().all(|c| *c == '*')
    }
}

/// Whether `text` matches the glob `pattern` (see [`Glob`]).
pub fn glob_match(pattern: &str, text: &str) -> bool {
    Glob::new(pattern).matches(text)
}

/// A counter hash's `HGETALL` as `(slice, count)`, oldest first (fields that are no numbers
/// left out).
fn counts(raw: Vec<(String, String)>) -> Vec<(u64, i64)> {
    let mut samples: Vec<(u64, i64)> = raw
        .iter()
        .filter_map(|(s, c)| Some((s.parse().ok()?, c.parse().ok()?)))
        .collect();
    samples.sort_unstable();
    samples
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn globs() {
        assert!(glob_match("*", "anything"));
        assert!(glob_match("web.*", "web.hits"));
        assert!(glob_match("*hits*", "web.hits;env=prod"));
        assert!(glob_match("h?ts", "hits"));
        assert!(!glob_match("web.*", "api.hits"));
        assert!(!glob_match("hits", "hits2"));
        assert!(glob_match("", ""));
        assert!(glob_match("city;name=Z?rich", "city;name=Zürich"));
    }

    #[test]
    fn stats_like_the_book() {
        let data = BTreeMap::from([
            ("min".to_string(), 100.0),
            ("max".to_string(), 200.0),
            ("count".to_string(), 2.0),
            ("sum".to_string(), 300.0),
            ("sumsq".to_string(), 50000.0),
        ]);
        let s = StatsView::from_zset(&data).unwrap();
        assert_eq!(s.average, 150.0);
        assert!((s.stddev - 70.710678).abs() < 1e-5);
    }

    #[test]
    fn single_sample_and_float_noise_give_zero_stddev_not_nan() {
        let one = BTreeMap::from([
            ("count".to_string(), 1.0),
            ("sum".to_string(), 0.1),
            ("sumsq".to_string(), 0.010000000000000002 - 1e-18),
        ]);
        let s = StatsView::from_zset(&one).unwrap();
        assert_eq!(s.stddev, 0.0);
        let noisy = BTreeMap::from([
            ("count".to_string(), 3.0),
            ("sum".to_string(), 0.30000000000000004),
            ("sumsq".to_string(), 0.03),
        ]);
        assert!(!StatsView::from_zset(&noisy).unwrap().stddev.is_nan());
        assert_eq!(StatsView::from_zset(&BTreeMap::new()), None);
    }
}
