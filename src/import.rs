//! `statsd-redis import whisper <dir>`: the history Etsy's statsd left in carbon's whisper files,
//! written into the layout (docs/moving-from-graphite.md): counters (`stats_counts.<key>`, or
//! `stats.counters.<key>.count` without `legacyNamespace`) into `count:`, gauges
//! (`stats.gauges.<key>`) into `gauge:`, each with its `known:` member, at every precision
//! whose slices an archive fills exactly: a slice of `p` seconds from an archive whose step
//! divides `p` and that holds all of the slice, the finest such archive, counts summed and a
//! gauge's last value. Archives after the first count only when whisper made them by summing
//! (counts) or by the last value (gauges): an average of counts is no count. A new hash is made
//! whole by `RESTORE` (a long listpack in one pass); slices are set, never added to, so a second
//! import changes nothing; a
//! slice that ends after the cut-off (`--until`, default now) is left to the agent. A file that
//! does not read is named and skipped.
//!
//! Every other file outside Etsy's namespaces (`stats`, `stats_counts`) is a carbon path
//! (docs/carbon.md), imported at the precisions of the schema its path matches into the gauge
//! family's keys: an archive of such a step as whisper holds it, any other precision made of
//! the file's finest archive that holds its slices, rolled up with the path's aggregation (a
//! file carbon made under an older schema, kept whole under the new one); an archive that
//! fits no precision of the schema is named. A tagged path's file
//! (`_tagged/<h>/<h>/<file>.wsp`, `h` its SHA-256's first digits) is named by the path, its
//! dots written `_DOT_`, or, under carbon's default `TAG_HASH_FILENAMES`, by the hash alone:
//! such a path comes from [`TaggedNames`].

use std::collections::btree_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};

use crate::config::Config;
use crate::storage_conf::{self, Method};
use crate::store::{Store, history, keys};

/// One whisper archive: its step, how many points it keeps, and its points (timestamp, value)
/// that are still within it, oldest first.
#[derive(Debug, PartialEq)]
pub struct Archive {
    pub step: u64,
    pub slots: u64,
    pub points: Vec<(u64, f64)>,
}

impl Archive {
    /// The first second it still holds, if it holds any.
    fn start(&self) -> Option<u64> {
        let newest = self.points.last()?.0;
        Some((newest + self.step).saturating_sub(self.step * self.slots))
    }
}

/// Reads a whisper file: a header (aggregation, max retention, xFilesFactor, archive count),
/// each archive's offset, seconds per point and point count, then the points (a 32-bit
/// timestamp and a 64-bit float each), all big-endian. A ring's slots older than its newest
/// point by its whole length are stale and left out.
pub fn read_whisper(bytes: &[u8]) -> Result<Whisper, String> {
    let u32_at = |at: usize| -> Result<u32, String> {
        let b = bytes
            .get(at..at + 4)
            .ok_or_else(|| format!("cut short at byte {at}"))?;
        Ok(u32::from_be_bytes(b.try_into().map_err(|_| "cut short")?))
    };
    let aggregation = match u32_at(0)? {
        1 => Aggregation::Average,
        2 => Aggregation::Sum,
        3 => Aggregation::Last,
        4..=8 => Aggregation::Other,
        n => return Err(format!("aggregation method {n}: not a whisper file")),
    };
    let count = u32_at(12)? as usize;
    if count == 0 || count > 64 {
        return Err(format!("{count} archives: not a whisper file"));
    }
    let mut archives = Vec::with_capacity(count);
    for i in 0..count {
        let info = 16 + 12 * i;
        let (offset, step, slots) = (u32_at(info)?, u32_at(info + 4)?, u32_at(info + 8)?);
        let (offset, step, slots) = (offset as usize, u64::from(step), u64::from(slots));
        let end = offset + 12 * slots as usize;
        if step == 0 || slots == 0 || end > bytes.len() {
            return Err(format!("archive {} does not fit the file", i + 1));
        }
        let mut points: Vec<(u64, f64)> = bytes[offset..end]
            .chunks_exact(12)
            .map(|p| {
                let ts = u32::from_be_bytes([p[0], p[1], p[2], p[3]]);
                let value = f64::from_be_bytes(p[4..12].try_into().unwrap_or_default());
                (u64::from(ts), value)
            })
            .filter(|(ts, v)| *ts != 0 && ts % step == 0 && v.is_finite())
            .collect();
        points.sort_by_key(|p| p.0);
        if let Some(&(newest, _)) = points.last() {
            points.retain(|(ts, _)| ts + step * slots > newest);
        }
        archives.push(Archive {
            step,
            slots,
            points,
        });
    }
    Ok(Whisper {
        aggregation,
        archives,
    })
}

/// A whisper file: how its archives after the first were made from the one before, and its
/// archives, finest first.
#[derive(Debug, PartialEq)]
pub struct Whisper {
    pub aggregation: Aggregation,
    pub archives: Vec<Archive>,
}

/// whisper's aggregation methods (1 average, 2 sum, 3 last; max, min and the others).
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Aggregation {
    Average,
    Sum,
    Last,
    Other,
}

impl Whisper {
    /// The archives whose points are exact for a counter's counts or a gauge's values: the
    /// first (what carbon was sent), and the coarser ones only when made by summing (counts)
    /// or by the last value (gauges); an average of counts is not a count.
    pub fn exact(&self, counter: bool) -> &[Archive] {
        let exact = match self.aggregation {
            Aggregation::Sum => counter,
            Aggregation::Last => !counter,
            _ => false,
        };
        let n = if exact { self.archives.len() } else { 1 };
        &self.archives[..n.min(self.archives.len())]
    }
}

/// What a whisper file holds: Etsy's counts or gauge values, or a carbon path's points.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Kind {
    Counter,
    Gauge,
    Path,
}

/// Carbon's tagged paths by their SHA-256, for the files carbon names by the hash alone: a JSON
/// list of paths (graphite-web's answer to `/tags/findSeries?expr=name=~.`) or one path a
/// line (`import whisper --tagged-names`).
#[derive(Debug, Default)]
pub struct TaggedNames(HashMap<String, String>);

impl TaggedNames {
    pub fn parse(text: &str) -> Result<TaggedNames, String> {
        let paths: Vec<String> = if text.trim_start().starts_with('[') {
            serde_json::from_str(text).map_err(|e| format!("not a JSON list of paths: {e}"))?
        } else {
            text.lines()
                .map(str::trim)
                .filter(|l| !l.is_empty())
                .map(String::from)
                .collect()
        };
        Ok(TaggedNames(
            paths.into_iter().map(|p| (sha256_hex(&p), p)).collect(),
        ))
    }
}

/// The hexadecimal SHA-256 of `text`, as carbon names a tagged path's file.
fn sha256_hex(text: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, text.as_bytes());
    digest.as_ref().iter().map(|b| format!("{b:02x}")).collect()
}

/// What a file holds and the series' name, or why it is not imported.
pub type Found = Result<(Kind, String), String>;

/// What a whisper file under the tree holds, by its path, and the series name; `None` for what
/// is not imported (Etsy's rates, timers and sets), why not for a tagged file whose path is
/// not known.
pub fn series_of(relative: &Path, tagged: &TaggedNames) -> Option<Found> {
    let text = relative.to_str()?.strip_suffix(".wsp")?;
    let parts: Vec<&str> = text.split('/').collect();
    let found = match parts.as_slice() {
        ["stats_counts", key @ ..] if !key.is_empty() => (Kind::Counter, key.join(".")),
        ["stats", "counters", key @ .., "count"] if !key.is_empty() => {
            (Kind::Counter, key.join("."))
        }
        ["stats", "gauges", key @ ..] if !key.is_empty() => (Kind::Gauge, key.join(".")),
        ["_tagged", a, b, file] => return Some(tagged_path([a, b], file, tagged)),
        ["stats" | "stats_counts" | "_tagged", ..] => return None,
        path if path.iter().all(|c| !c.is_empty()) => (Kind::Path, path.join(".")),
        _ => return None,
    };
    Some(Ok(found))
}

/// The path of carbon's tagged file `file` in the directories `dirs`, as the agent keeps it
/// (normalized as its carbon receivers normalize it): from the name, or from `tagged` by the
/// hash; refused when the directories are not the path's hash's, where carbon would not have
/// filed it.
fn tagged_path(dirs: [&str; 2], file: &str, tagged: &TaggedNames) -> Found {
    let path = if file.contains(';') {
        file.replace("_DOT_", ".")
    } else {
        tagged.0.get(file).cloned().ok_or(
            "a tagged path's file named by its hash: give the path in --tagged-names \
             (graphite-web's /tags/findSeries?expr=name=~.)",
        )?
    };
    let hash = sha256_hex(&path);
    if hash[..3] != *dirs[0] || hash[3..6] != *dirs[1] {
        return Err(format!(
            "`{path}` is not filed here by carbon (its SHA-256 is {hash})"
        ));
    }
    let normalized = crate::protocol::carbon::normalize(&path)
        .map_err(|why| format!("`{path}`: {}", why.as_str()))?;
    Ok((Kind::Path, normalized.into_owned()))
}

/// The slices of precision `p` that `archives` fill, each from the first of them (in the order
/// given) whose step divides `p` and that holds the whole slice, ending by `until` and within
/// the precision's retention (its count of slices before `now`): the archive's points in the
/// slice aggregated as whisper makes a coarser slot of finer ones (`__propagate`: the method,
/// written when the share of the slice's `p / step` slots that hold a point reaches the
/// xFilesFactor). That archive decides: a slice it holds without a point, or with too few, is
/// left out.
pub fn slices(
    archives: &[&Archive],
    p: u64,
    aggregation: storage_conf::Aggregation,
    (until, now, samples): (u64, u64, u64),
) -> BTreeMap<u64, f64> {
    let mut out: BTreeMap<u64, Option<f64>> = BTreeMap::new();
    let oldest_kept = now.saturating_sub(samples * p);
    let mut known = Vec::new();
    for archive in archives.iter().filter(|a| p.is_multiple_of(a.step)) {
        let (Some(start), Some(&(newest, _))) = (archive.start(), archive.points.last()) else {
            continue;
        };
        let first = start.div_ceil(p) * p;
        let mut points = archive.points.iter().peekable();
        let mut slice = first.max(oldest_kept / p * p + p);
        let total = p / archive.step;
        // Whole slices only: the archive's points reach the slice's end.
        while slice + p <= until.min(newest + archive.step) {
            known.clear();
            while let Some(&&(ts, v)) = points.peek() {
                if ts >= slice + p {
                    break;
                }
                points.next();
                if ts >= slice {
                    known.push(v);
                }
            }
            let enough = known.len() as f64 / total as f64 >= f64::from(aggregation.x_files_factor);
            if let Entry::Vacant(e) = out.entry(slice) {
                e.insert(
                    (!known.is_empty() && enough)
                        .then(|| aggregation.method.aggregate(&known, total)),
                );
            }
            slice += p;
        }
    }
    out.into_iter().filter_map(|(t, v)| Some((t, v?))).collect()
}

/// What one import did.
#[derive(Debug, Default, PartialEq)]
pub struct Imported {
    pub files: usize,
    pub skipped: Vec<(PathBuf, String)>,
    /// Archives of imported files that fit none of the precisions their path keeps.
    pub left_out: Vec<(PathBuf, String)>,
    /// Whisper points read, and slices written.
    pub points: usize,
    pub slices: usize,
}

/// Imports every whisper file under `root` (carbon's storage directory, holding `stats_counts/`
/// and `stats/`) into the Redis of `config`; slices ending after `until` are left alone.
/// `progress` is told how far it is: files done of all, points read, slices written.
pub async fn import(
    config: &Config,
    root: &Path,
    (until, tagged): (u64, &TaggedNames),
    mut progress: impl FnMut(&Imported, usize),
) -> Result<Imported, String> {
    let mut found = Vec::new();
    collect(root, root, tagged, &mut found);
    let total = found.len();
    let (mut files, mut done) = (Vec::new(), Imported::default());
    for (path, what) in found {
        match what {
            Ok((kind, series)) => files.push((path, kind, series)),
            Err(why) => done.skipped.push((path, why)),
        }
    }
    files.sort();
    let store = Store::open(config).map_err(|e| e.to_string())?;
    let mut conn = store.connect().await.map_err(|e| e.to_string())?;
    let keys = store.keys().clone();
    let now = crate::store::clock::unix_now();
    let retention = config.retention();
    let (schemas, aggregations) = (config.schemas(), path_aggregations(config)?);
    for (path, kind, series) in &files {
        let counter = *kind == Kind::Counter;
        let whisper = match std::fs::read(path)
            .map_err(|e| e.to_string())
            .and_then(|bytes| read_whisper(&bytes))
        {
            Ok(whisper) => whisper,
            Err(why) => {
                done.skipped.push((path.clone(), why));
                progress(&done, total);
                continue;
            }
        };
        done.points += whisper
            .archives
            .iter()
            .map(|a| a.points.len())
            .sum::<usize>();
        // The index members and the gauge's value in one pipeline, after the hashes.
        let mut pipe = redis::pipe();
        let archives = whisper.exact(counter);
        // Etsy's counts summed and gauges' last values, from the finest archive; a carbon
        // path's slices from its archive of that step, else from its finest that holds them,
        // rolled up as the path's own are, at its schema's precisions only.
        let own = (*kind == Kind::Path).then(|| (schemas.of(series), aggregations.of(series)));
        if let Some((schema, _)) = own {
            let precisions = schema.precisions();
            for w in &whisper.archives {
                if !w.points.is_empty() && precisions.iter().all(|p| p % w.step != 0) {
                    let why = format!(
                        "its {} s archive ({} points) makes no slice of its schema's ({})",
                        w.step,
                        w.points.len(),
                        schema.encode()
                    );
                    done.left_out.push((path.clone(), why));
                }
            }
        }
        let mut order: Vec<&Archive> = match own {
            Some(_) => whisper.archives.iter().collect(),
            None => archives.iter().collect(),
        };
        let etsy = storage_conf::Aggregation {
            method: if counter { Method::Sum } else { Method::Last },
            x_files_factor: 0.0,
        };
        for a in retention.archives() {
            let p = a.precision;
            let (aggregation, count) = match own {
                Some((schema, rollup)) => match schema.archives().iter().find(|s| s.precision == p)
                {
                    Some(s) => (rollup, s.count),
                    None => continue,
                },
                None => (etsy, a.count),
            };
            order.sort_by_key(|w| (own.is_some() && w.step != p, w.step));
            let mut found = slices(&order, p, aggregation, (until, now, count));
            if found.is_empty() {
                continue;
            }
            let (key, index, family) = if counter {
                (
                    keys.counter(p, series),
                    keys.known(),
                    history::Family::Counter,
                )
            } else {
                (
                    keys.gauge(p, series),
                    keys.known_gauges(),
                    history::Family::Gauge,
                )
            };
            // A long archive's slices older than the hash keeps go into its blocks.
            let (older, newer) = match retention.history(p) {
                Some(g) => {
                    let keep_from = history::keep_from(now, p, family);
                    let mut newer = found.split_off(&keep_from);
                    // The hash keeps at least the newest slice, as the cleaner leaves it: the
                    // hash and its index member stand for the series while it has history.
                    if newer.is_empty()
                        && let Some((slice, v)) = found.pop_last()
                    {
                        newer.insert(slice, v);
                    }
                    (Some((g, found)), newer)
                }
                None => (None, found),
            };
            if let Some((g, older)) = older {
                let written = set_blocks(
                    &mut conn,
                    &keys,
                    &key,
                    g,
                    p,
                    a.seconds(),
                    &older,
                    family,
                    now,
                )
                .await
                .map_err(|e| format!("{}: {e}", path.display()))?;
                done.slices += written;
            }
            let fields: Vec<(String, String)> = newer
                .iter()
                .map(|(slice, v)| (slice.to_string(), number(*v, counter)))
                .collect();
            set_hash(&mut conn, &key, &fields)
                .await
                .map_err(|e| format!("{}: {e}", path.display()))?;
            pipe.zadd(&index, keys::known_member(p, series), 0).ignore();
            done.slices += fields.len();
        }
        if *kind == Kind::Gauge
            && let Some(&(_, last)) = archives
                .iter()
                .filter_map(|a| a.points.last())
                .max_by_key(|p| p.0)
                .filter(|(ts, _)| *ts < until)
        {
            pipe.hset_nx(keys.gauges(), series, last).ignore();
        }
        let _: () = pipe
            .query_async(&mut conn)
            .await
            .map_err(|e| format!("{}: {e}", path.display()))?;
        done.files += 1;
        progress(&done, total);
    }
    Ok(done)
}

/// `storage_aggregation`'s sections (read and checked with the rest of the configuration).
fn path_aggregations(config: &Config) -> Result<storage_conf::Aggregations, String> {
    storage_conf::Aggregations::load(&config.storage_aggregation)
        .map_err(|e| format!("storage_aggregation: {e}"))
}

/// Sets `fields` in the hash `key`. A new hash is made whole by `RESTORE` (one pass, a listpack
/// when it fits the server's limit; `HSET` would search a listpack for each new field). A hash
/// that exists (the agent wrote it, or an import before) gets only the fields it lacks or holds
/// otherwise: a second import writes nothing. `RESTORE` refuses to replace a key made
/// meanwhile, which then takes the second way.
async fn set_hash(
    conn: &mut crate::store::Connection,
    key: &str,
    fields: &[(String, String)],
) -> redis::RedisResult<()> {
    let exists: bool = redis::cmd("EXISTS").arg(key).query_async(conn).await?;
    if !exists {
        let restored = redis::cmd("RESTORE")
            .arg(key)
            .arg(0)
            .arg(crate::store::dump::hash_payload(fields))
            .query_async::<()>(conn)
            .await;
        match restored {
            Ok(()) => return Ok(()),
            Err(e) if e.code() == Some("BUSYKEY") => {}
            Err(e) => return Err(e),
        }
    }
    let held: std::collections::HashMap<String, String> =
        redis::cmd("HGETALL").arg(key).query_async(conn).await?;
    let missing: Vec<(&str, &str)> = fields
        .iter()
        .filter(|(f, v)| held.get(f) != Some(v))
        .map(|(f, v)| (f.as_str(), v.as_str()))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let mut pipe = redis::pipe();
    // HSET of many pairs, not the redis crate's HMSET: one command fewer in the agent's ACL.
    for batch in missing.chunks(1000) {
        pipe.cmd("HSET").arg(key).arg(batch).ignore();
    }
    pipe.query_async(conn).await
}

/// Sets a long archive's older `slices` in its blocks (`store::history`), each block by one call
/// of `import_block.lua` (a new one made whole by one `SET`), all of an archive's in one
/// pipeline; returns how many were set.
#[allow(clippy::too_many_arguments)]
async fn set_blocks(
    conn: &mut crate::store::Connection,
    keys: &crate::store::Keys,
    hash: &str,
    geometry: history::Geometry,
    p: u64,
    kept_secs: u64,
    slices: &BTreeMap<u64, f64>,
    family: history::Family,
    now: u64,
) -> redis::RedisResult<usize> {
    let mut by_block: BTreeMap<u64, Vec<(u64, f64)>> = BTreeMap::new();
    for (&slice, &v) in slices {
        let (block, slot) = geometry.locate(p, slice);
        by_block.entry(block).or_default().push((slot, v));
    }
    if by_block.is_empty() {
        return Ok(0);
    }
    static SCRIPT: std::sync::LazyLock<redis::Script> =
        std::sync::LazyLock::new(|| redis::Script::new(include_str!("store/import_block.lua")));
    let script = &*SCRIPT;
    let mut pipe = redis::pipe();
    for (block, points) in by_block {
        let start = geometry.start(p, block);
        let ttl = geometry.expires_in(p, block, kept_secs, now);
        pipe.cmd("EVALSHA")
            .arg(script.get_hash())
            .arg(2)
            .arg(history::block_key(keys, hash, geometry, block))
            .arg(hash)
            .arg(history::block_bytes(geometry, &points, family))
            .arg(ttl)
            .arg(start)
            .arg(p)
            .arg(points.len());
    }
    // A server that does not hold the script yet (the first archive, or one restarted) gets
    // it, and the pipeline again: each call sets, so one applied before changes nothing.
    let set: Vec<usize> = match pipe.query_async(conn).await {
        Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
            script.prepare_invoke().load_async(conn).await?;
            pipe.query_async(conn).await?
        }
        other => other?,
    };
    Ok(set.iter().sum())
}

/// A slice's value as the agent writes it: counts as integers.
fn number(v: f64, counter: bool) -> String {
    if counter && v.fract() == 0.0 && v.abs() < 9.0e15 {
        format!("{}", v as i64)
    } else {
        format!("{v}")
    }
}

/// The files under `dir` that [`series_of`] names: what each holds, or why it is skipped.
fn collect(root: &Path, dir: &Path, tagged: &TaggedNames, out: &mut Vec<(PathBuf, Found)>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            collect(root, &path, tagged, out);
        } else if let Some(found) = path
            .strip_prefix(root)
            .ok()
            .and_then(|relative| series_of(relative, tagged))
        {
            out.push((path, found));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An archive as a test gives it: step, slots, points.
    type Given<'a> = (u32, u32, &'a [(u32, f64)]);

    /// A whisper file of the archives given, written as whisper lays it out (each point in the
    /// slot of its interval).
    fn whisper(archives: &[Given<'_>]) -> Vec<u8> {
        let mut out = Vec::new();
        for v in [1u32, 0, 0, archives.len() as u32] {
            out.extend_from_slice(&v.to_be_bytes());
        }
        let mut offset = 16 + 12 * archives.len() as u32;
        for (step, slots, _) in archives {
            for v in [offset, *step, *slots] {
                out.extend_from_slice(&v.to_be_bytes());
            }
            offset += 12 * slots;
        }
        for (step, slots, points) in archives {
            let mut ring = vec![[0u8; 12]; *slots as usize];
            let base = points.first().map_or(0, |p| p.0);
            for (ts, v) in *points {
                let at = ((ts - base) / step % slots) as usize;
                ring[at][..4].copy_from_slice(&ts.to_be_bytes());
                ring[at][4..].copy_from_slice(&v.to_be_bytes());
            }
            out.extend(ring.iter().flatten());
        }
        out
    }

    #[test]
    fn archives_read_back_without_their_stale_slots() {
        // Six slots of 10 s written for 8 intervals: the first two were overwritten.
        let points: Vec<(u32, f64)> = (0..8).map(|i| (1000 + 10 * i, i as f64)).collect();
        let file = read_whisper(&whisper(&[(10, 6, &points), (60, 10, &[(960, 5.0)])])).unwrap();
        assert_eq!(file.aggregation, Aggregation::Average);
        assert_eq!(
            file.exact(true).len(),
            1,
            "an average of counts is not a count"
        );
        let read = file.archives;
        let kept: Vec<u64> = read[0].points.iter().map(|p| p.0).collect();
        assert_eq!(kept, [1020, 1030, 1040, 1050, 1060, 1070]);
        assert_eq!(read[1].points, [(960, 5.0)]);
        assert!(read_whisper(&[0u8; 10]).is_err());
        let mut cut = whisper(&[(10, 6, &points)]);
        cut.truncate(40);
        assert!(read_whisper(&cut).unwrap_err().contains("does not fit"));
    }

    #[test]
    fn slices_come_whole_from_the_finest_archive_that_holds_them() {
        // 10 s points for 1000..1120, then a 60 s archive reaching further back.
        let fine: Vec<(u64, f64)> = (0..12).map(|i| (1000 + 10 * i, 1.0)).collect();
        let archives = [
            Archive {
                step: 10,
                slots: 12,
                points: fine,
            },
            Archive {
                step: 60,
                slots: 100,
                points: vec![(840, 30.0), (900, 40.0), (960, 2.0), (1020, 6.0)],
            },
        ];
        let limits = (10_000, 10_000, 1_000);
        let finest: Vec<&Archive> = archives.iter().collect();
        let (sum, last) = (rollup(Method::Sum, 0.0), rollup(Method::Last, 0.0));
        // 60 s slices: 1020 whole from the 10 s points; 1080 is not whole there (its points
        // end at 1110), 1000..1020 is part of the slice 960, which the 60 s archive holds.
        let minutes = slices(&finest, 60, sum, limits);
        let want = BTreeMap::from([(840, 30.0), (900, 40.0), (960, 2.0), (1020, 6.0)]);
        assert_eq!(minutes, want);
        // 5 s slices: no archive's step divides 5.
        assert!(slices(&finest, 5, sum, limits).is_empty());
        // A gauge's last value; nothing that ends after the cut-off.
        let gauge = slices(&finest, 60, last, (1020, 10_000, 1_000));
        assert_eq!(gauge.get(&960), Some(&2.0));
        assert!(!gauge.contains_key(&1020));
        // Nothing older than the precision's retention.
        let kept = slices(&finest, 60, sum, (10_000, 1100, 3));
        assert_eq!(kept.keys().copied().collect::<Vec<_>>(), [960, 1020]);
        // The archive of the slice's own step first: its slot as it holds it.
        let own = [&archives[1], &archives[0]];
        assert_eq!(slices(&own, 60, sum, limits).get(&1020), Some(&6.0));
    }

    fn rollup(method: Method, x_files_factor: f32) -> storage_conf::Aggregation {
        storage_conf::Aggregation {
            method,
            x_files_factor,
        }
    }

    /// A carbon path's coarser slice is its finer points rolled up as whisper rolls them up:
    /// the method over the known slots, written only when their share reaches xFilesFactor
    /// (a 32-bit float, as in whisper's header).
    #[test]
    fn a_coarser_slice_is_rolled_up_with_its_xfilesfactor() {
        // Ten 6 s slots of the minute 1200, seven of them known; the minute 1260 whole.
        let mut points: Vec<(u64, f64)> = (0..7).map(|i| (1200 + 6 * i, i as f64)).collect();
        points.extend((0..10).map(|i| (1260 + 6 * i, 10.0)));
        let fine = Archive {
            step: 6,
            slots: 100,
            points,
        };
        let at = |a: storage_conf::Aggregation| slices(&[&fine], 60, a, (10_000, 10_000, 1_000));
        let average = at(rollup(Method::Average, 0.7));
        assert_eq!(average, BTreeMap::from([(1200, 3.0), (1260, 10.0)]));
        assert_eq!(at(rollup(Method::AvgZero, 0.5))[&1200], 2.1);
        assert_eq!(at(rollup(Method::Max, 0.0))[&1200], 6.0);
        // 0.7 as whisper's header holds it is 0.69999998…: seven of ten reach it. 0.71 does
        // not: the minute is left out, the whole one kept.
        let strict = at(rollup(Method::Sum, 0.71));
        assert_eq!(strict, BTreeMap::from([(1260, 100.0)]));
    }

    #[test]
    fn paths_name_counters_gauges_and_carbons_paths() {
        let none = TaggedNames::default();
        let of = |p: &str| series_of(Path::new(p), &none).map(Result::unwrap);
        assert_eq!(
            of("stats_counts/api/hits.wsp"),
            Some((Kind::Counter, "api.hits".into()))
        );
        assert_eq!(
            of("stats/counters/api/hits/count.wsp"),
            Some((Kind::Counter, "api.hits".into()))
        );
        assert_eq!(
            of("stats/gauges/queue.wsp"),
            Some((Kind::Gauge, "queue".into()))
        );
        assert_eq!(of("stats/api/hits.wsp"), None, "a rate");
        assert_eq!(of("stats/timers/api/upper_90.wsp"), None);
        assert_eq!(of("stats/sets/users/count.wsp"), None);
        assert_eq!(
            of("collectd/web1/cpu-0/idle.wsp"),
            Some((Kind::Path, "collectd.web1.cpu-0.idle".into()))
        );
        assert_eq!(of("notes.txt"), None);
    }

    /// Carbon's own example (its test_database.py): the path's file with TAG_HASH_FILENAMES
    /// off, and with it on (the default), the hash's, found from a list of paths.
    #[test]
    fn tagged_files_by_their_name_or_their_hash() {
        let path = "stats.example.counts;tag1=value1";
        let hash = sha256_hex(path);
        assert!(hash.starts_with("872252"), "{hash}");
        let none = TaggedNames::default();
        let want = Some(Ok((Kind::Path, path.to_string())));
        let named = "_tagged/872/252/stats_DOT_example_DOT_counts;tag1=value1.wsp";
        assert_eq!(series_of(Path::new(named), &none), want);
        let hashed = format!("_tagged/872/252/{hash}.wsp");
        let unknown = series_of(Path::new(&hashed), &none).unwrap();
        assert!(unknown.unwrap_err().contains("--tagged-names"));
        for list in [
            format!("[\"other;a=b\", \"{path}\"]"),
            format!("other;a=b\n  {path}  \n\n"),
        ] {
            let tagged = TaggedNames::parse(&list).unwrap();
            assert_eq!(series_of(Path::new(&hashed), &tagged), want, "{list}");
        }
        // Under directories that are not its hash's, or a name whose tags the agent refuses.
        let elsewhere = "_tagged/000/252/stats_DOT_example_DOT_counts;tag1=value1.wsp";
        assert!(series_of(Path::new(elsewhere), &none).unwrap().is_err());
        assert!(TaggedNames::parse("[1, 2]").is_err());
    }
}
