//! A carbon series' points of a window, planned by the agent for `points.lua` (docs/carbon.md,
//! "What the agent works out itself"): whisper's carrying down done where the window alone
//! decides it, so that Redis runs as little Lua a point as possible.
//!
//! - A coarser slice whose interval has ended and whose every finer slice the window itself
//!   writes (a batch, a backfill) is made here: no finer slice of Redis's can weigh in, since
//!   the window replaces them all.
//! - One the window writes only in part is asked of the script, which makes it from what the
//!   finer archive holds then; one still open is left pending for the rollup, as before.
//! - Of a long archive, a window's values older than the slices the book's hash keeps go into
//!   their blocks: whole groups of eight slots as the block's own bytes (one `SETRANGE` a run of
//!   groups), groups it fills in part by the script, which reads the group first.
//!
//! The script applies a plan as whisper's `__archive_update_many` would have gone: each
//! archive's points, then each coarser archive in turn, stopping below the first that gets no
//! slice. The plan's decisions depend on the window's points, its time and the schema only, so
//! a chunk sent again carries the same plan and applies it to the same effect.

use hashbrown::{HashMap, HashSet};

use super::chunk::Argv;
use crate::aggregate::points::SeriesPoints;
use crate::storage_conf::Aggregation;
use crate::store::history::{self, GROUP_BYTES};

/// An archive of a points section: its precision, the seconds it keeps, and the slots of its
/// blocks (0: its hash keeps it whole).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Archive {
    pub p: u64,
    pub kept: u64,
    pub slots: u64,
}

/// Values the agent writes into one archive: into its hash, into the blocks by the script (old
/// slices of groups written in part), and whole groups of slots.
#[derive(Debug, Default, PartialEq)]
struct Values {
    hash: Vec<(u64, f64)>,
    old: Vec<(u64, f64)>,
    runs: Vec<Run>,
}

/// Consecutive whole groups of one block: where they start (bytes), their bytes, their slices.
#[derive(Debug, PartialEq)]
struct Run {
    block: u64,
    at: u64,
    bytes: Vec<u8>,
    slices: Vec<u64>,
}

/// A coarser archive's part of a chain: the slices made here, those the script makes, those
/// left pending.
#[derive(Debug, Default, PartialEq)]
struct Level {
    made: Values,
    asks: Vec<u64>,
    defers: Vec<u64>,
}

/// One archive's points and, level by level, the coarser archives below it.
#[derive(Debug, PartialEq)]
struct Chain {
    archive: usize,
    points: Values,
    levels: Vec<Level>,
}

/// Writes `series`' item of a points section: its name, method, xFilesFactor, the count of the
/// arguments after that count, then either `p` and the single point of the present
/// (archive, slice, value, and the slice of the next archive left pending, or empty), or its
/// chains (`points.lua`, `write_points`, reads both).
pub(super) fn put_item(cmd: &mut Argv, s: &SeriesPoints, archives: &[Archive], now: u64) {
    cmd.arg(&*s.series)
        .arg(s.aggregation.method.as_str())
        .arg(f64::from(s.aggregation.x_files_factor));
    let (lean, chains) = match present(s, archives, now) {
        Some(point) => (Some(point), Vec::new()),
        None => {
            let chains = plan(s, archives, now);
            (lean(&chains), chains)
        }
    };
    // The lean item's five arguments go straight in; a plan's are counted first.
    if let Some((archive, slice, value, pending)) = lean {
        cmd.arg(5).arg("p").arg(archive + 1).arg(slice).arg(value);
        match pending {
            Some(t) => cmd.arg(t),
            None => cmd.arg(""),
        };
        return;
    }
    let mut item = Argv::default();
    item.arg(chains.len());
    for c in &chains {
        item.arg(c.archive + 1);
        put_values(&mut item, &c.points);
        item.arg(c.levels.len());
        for l in &c.levels {
            put_values(&mut item, &l.made);
            item.arg(l.asks.len()).arg(&l.asks[..]);
            item.arg(l.defers.len()).arg(&l.defers[..]);
        }
    }
    cmd.arg(item.len());
    cmd.append(&item);
}

/// A window's single point whose next archive's slice is still open (or that has no next
/// archive): the lean item [`plan`] makes of it, without its tables (most windows of a series
/// sending every few seconds).
fn present(
    s: &SeriesPoints,
    archives: &[Archive],
    now: u64,
) -> Option<(usize, u64, f64, Option<u64>)> {
    let [point] = &s.placed[..] else { return None };
    match archives.get(point.archive + 1) {
        None => Some((point.archive, point.slice, point.value, None)),
        Some(next) => {
            let t = point.slice - point.slice % next.p;
            (t + next.p > now).then_some((point.archive, point.slice, point.value, Some(t)))
        }
    }
}

/// The common item, a point of the present: one slice into the hash, the next archive's slice
/// over it (if any) left pending.
fn lean(chains: &[Chain]) -> Option<(usize, u64, f64, Option<u64>)> {
    let [c] = chains else { return None };
    let ([(slice, value)], [], []) = (&c.points.hash[..], &c.points.old[..], &c.points.runs[..])
    else {
        return None;
    };
    match &c.levels[..] {
        [] => Some((c.archive, *slice, *value, None)),
        [l] if l.made == Values::default() && l.asks.is_empty() && l.defers.len() == 1 => {
            Some((c.archive, *slice, *value, Some(l.defers[0])))
        }
        _ => None,
    }
}

/// Values as the script reads them: the hash's pairs, the old pairs, the runs (block, byte
/// offset, bytes), then every run's slices.
fn put_values(cmd: &mut Argv, v: &Values) {
    cmd.arg(v.hash.len());
    for (slice, value) in &v.hash {
        cmd.arg(slice).arg(value);
    }
    cmd.arg(v.old.len());
    for (slice, value) in &v.old {
        cmd.arg(slice).arg(value);
    }
    cmd.arg(v.runs.len());
    for r in &v.runs {
        cmd.arg(r.block).arg(r.at);
        redis::RedisWrite::write_arg(cmd, &r.bytes);
    }
    for r in &v.runs {
        cmd.arg(&r.slices[..]);
    }
}

/// The plan of `s`'s points at `now`: a chain a archive they fall into, finest first, as the
/// script goes (points.lua, `write_points`, before this plan: the same decisions, made there).
fn plan(s: &SeriesPoints, archives: &[Archive], now: u64) -> Vec<Chain> {
    let mut known: Vec<HashMap<u64, f64>> = vec![HashMap::new(); archives.len()];
    let mut chains = Vec::new();
    for group in s.placed.chunk_by(|x, y| x.archive == y.archive) {
        let a = group[0].archive;
        let slices: Vec<u64> = group.iter().map(|p| p.slice).collect();
        known[a].extend(group.iter().map(|p| (p.slice, p.value)));
        let points = split(
            group.iter().map(|p| (p.slice, p.value)).collect(),
            archives[a],
            now,
        );
        // The points whose slice in some archive is left pending (its rollup carries them
        // further down), and by archive the slices such a rollup reaches anyway.
        let mut deferred = HashSet::new();
        let mut covered: Option<Vec<HashSet<u64>>> = None;
        let mut levels = Vec::new();
        for lower in a + 1..archives.len() {
            let p = archives[lower].p;
            let mut seen = HashSet::new();
            let mut level = Level::default();
            let mut made = Vec::new();
            for &point in &slices {
                let t = point - point % p;
                let open = t + p > now;
                if !deferred.contains(&point) && seen.insert(t) {
                    if open {
                        if !covered.as_ref().is_some_and(|c| c[lower].contains(&t)) {
                            level.defers.push(t);
                            let c =
                                covered.get_or_insert_with(|| vec![HashSet::new(); archives.len()]);
                            for (l, below) in archives.iter().enumerate().skip(lower + 1) {
                                c[l].insert(t - t % below.p);
                            }
                        }
                    } else {
                        match whole(&known[lower - 1], t, archives, lower, now, s.aggregation) {
                            Some(v) => made.push((t, v)),
                            None => level.asks.push(t),
                        }
                    }
                }
                if open {
                    deferred.insert(point);
                }
            }
            known[lower].extend(made.iter().copied());
            let goes_on = !made.is_empty() || !level.asks.is_empty();
            level.made = split(made, archives[lower], now);
            levels.push(level);
            if !goes_on {
                break;
            }
        }
        while levels.last() == Some(&Level::default()) {
            levels.pop();
        }
        chains.push(Chain {
            archive: a,
            points,
            levels,
        });
    }
    chains
}

/// Slice `t` of archive `lower`, made of the finer archive's `known` values when they hold
/// every slice of its interval (whisper's `__propagate` with all of them known), else `None`.
fn whole(
    known: &HashMap<u64, f64>,
    t: u64,
    archives: &[Archive],
    lower: usize,
    now: u64,
    aggregation: Aggregation,
) -> Option<f64> {
    let higher = archives[lower - 1];
    let total = archives[lower].p / higher.p;
    // A slice past the archive's retention is whisper's stale slot: the script decides.
    let stale = i128::from(now) - i128::from(higher.kept);
    let mut values = Vec::with_capacity(total as usize);
    for k in 0..total {
        let slice = t + k * higher.p;
        if i128::from(slice) <= stale {
            return None;
        }
        values.push(*known.get(&slice)?);
    }
    if 1.0 < f64::from(aggregation.x_files_factor) {
        return None;
    }
    let value = aggregation.method.aggregate(&values, total);
    value.is_finite().then_some(value)
}

/// Where `values` (slices in order) of `archive` go: older than the hash keeps (but the newest,
/// which keeps the hash and its index member) into blocks, whole groups as runs of bytes.
fn split(values: Vec<(u64, f64)>, archive: Archive, now: u64) -> Values {
    let mut out = Values::default();
    if archive.slots == 0 || values.len() < 2 {
        out.hash = values;
        return out;
    }
    let p = archive.p;
    let keep = history::keep_from(now, p, history::Family::Gauge);
    let newest = values.iter().map(|v| v.0).max().unwrap_or(0);
    let mut old: Vec<(u64, f64)> = Vec::new();
    for v in values {
        if v.0 < keep && v.0 != newest {
            old.push(v);
        } else {
            out.hash.push(v);
        }
    }
    for group in old.chunk_by(|x, y| x.0 / p / 8 == y.0 / p / 8) {
        let first = group[0].0 / p;
        if group.len() < 8 {
            out.old.extend_from_slice(group);
            continue;
        }
        let (block, slot) = (first / archive.slots, first % archive.slots);
        let at = slot / 8 * GROUP_BYTES;
        let run = match out.runs.last_mut() {
            Some(r) if r.block == block && r.at + r.bytes.len() as u64 == at => r,
            _ => {
                out.runs.push(Run {
                    block,
                    at,
                    bytes: Vec::new(),
                    slices: Vec::new(),
                });
                out.runs.last_mut().expect("just pushed")
            }
        };
        run.bytes.push(0xff);
        for (slice, value) in group {
            run.bytes.extend_from_slice(&value.to_bits().to_be_bytes());
            run.slices.push(*slice);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::aggregate::points::Placed;
    use crate::storage_conf::Method;

    /// Carbon's schema as a points section holds it: 10 s for 6 h (blocks of 248), 1 min for
    /// 7 d (2008), 1 h for 90 d (248), 1 d for 5 y (248).
    fn carbon() -> Vec<Archive> {
        let a = |p, kept, slots| Archive { p, kept, slots };
        vec![
            a(10, 21_600, 248),
            a(60, 604_800, 2008),
            a(3600, 7_776_000, 248),
            a(86_400, 157_680_000, 248),
        ]
    }

    fn series(method: Method, xff: f32, placed: Vec<Placed>) -> SeriesPoints {
        SeriesPoints {
            series: "s".into(),
            schema: 0,
            aggregation: Aggregation {
                method,
                x_files_factor: xff,
            },
            placed,
        }
    }

    fn points(archive: usize, from: u64, step: u64, n: u64) -> Vec<Placed> {
        (0..n)
            .map(|k| Placed {
                archive,
                slice: from + k * step,
                value: (k % 7) as f64 - 2.5,
            })
            .collect()
    }

    const NOW: u64 = 1_000_000_000 - 1_000_000_000 % 86_400 + 7 * 3600 + 1234;

    #[test]
    fn a_point_of_the_present_is_set_and_its_minute_left_pending() {
        let t = NOW - NOW % 10;
        let chains = plan(
            &series(Method::Average, 0.5, points(0, t, 10, 1)),
            &carbon(),
            NOW,
        );
        assert_eq!(lean(&chains), Some((0, t, -2.5, Some(NOW - NOW % 60))));
    }

    #[test]
    fn a_single_point_takes_the_short_way_to_the_plans_lean_item() {
        // Every archive, slices around now and a day back: the short way gives what the plan
        // gives, or leaves the point to it.
        for archive in 0..4 {
            for back in [0, 5, 10, 55, 60, 3_599, 3_600, 86_400] {
                let p = carbon()[archive].p;
                let slice = (NOW - back) - (NOW - back) % p;
                let s = series(
                    Method::Average,
                    0.5,
                    vec![Placed {
                        archive,
                        slice,
                        value: 1.5,
                    }],
                );
                let short = present(&s, &carbon(), NOW);
                let planned = lean(&plan(&s, &carbon(), NOW));
                assert!(short.is_none() || short == planned, "{archive} {back}");
                if archive == 3 || back < 5 {
                    assert!(short.is_some(), "{archive} {back}");
                }
            }
        }
    }

    #[test]
    fn an_hour_of_points_makes_its_ended_minutes_and_leaves_the_open_ones_pending() {
        // 360 points of 10 s up to now: the minutes and hour they fill whole are made here, the
        // ended hour they fill in part is asked, the open minute and hour are pending, and the
        // points older than the hash's 16 go to blocks.
        let from = NOW - NOW % 10 - 3590;
        let chains = plan(
            &series(Method::Sum, 0.5, points(0, from, 10, 360)),
            &carbon(),
            NOW,
        );
        let [c] = &chains[..] else {
            panic!("{chains:?}")
        };
        let keep = history::keep_from(NOW, 10, history::Family::Gauge);
        assert!(c.points.hash.iter().all(|v| v.0 >= keep));
        let in_blocks: usize =
            c.points.runs.iter().map(|r| r.slices.len()).sum::<usize>() + c.points.old.len();
        assert_eq!(in_blocks + c.points.hash.len(), 360);
        assert!(c.points.old.len() < 16, "only the edges' groups");
        for r in &c.points.runs {
            assert_eq!(
                r.bytes.len() as u64,
                r.slices.len() as u64 / 8 * GROUP_BYTES
            );
        }
        let minutes = &c.levels[0];
        // The first minute holds the batch's first point only when it starts one.
        let whole_minutes: Vec<u64> = (0..60)
            .map(|k| from - from % 60 + k * 60)
            .filter(|m| *m >= from && m + 60 <= NOW)
            .collect();
        // Those older than the minutes' hash keeps go to blocks too, whole groups as runs.
        let mut made: Vec<u64> = (minutes.made.hash.iter().chain(&minutes.made.old))
            .map(|v| v.0)
            .chain(
                minutes
                    .made
                    .runs
                    .iter()
                    .flat_map(|r| r.slices.iter().copied()),
            )
            .collect();
        made.sort_unstable();
        assert_eq!(made, whole_minutes);
        // The batch starts in the middle of a minute: Redis's slices before it may weigh in.
        assert_ne!(from % 60, 0);
        assert_eq!(minutes.asks, [from - from % 60]);
        assert_eq!(minutes.defers, [NOW - NOW % 60]);
        // The newest whole minute's value (in the hash): the sum of its six points.
        let last = whole_minutes[whole_minutes.len() - 1];
        let expect: f64 = (0..6)
            .map(|k| (((last - from) / 10 + k) % 7) as f64 - 2.5)
            .sum();
        assert!(
            minutes.made.hash.contains(&(last, expect)),
            "{:?}",
            minutes.made.hash
        );
        let hours = &c.levels[1];
        assert_eq!(hours.made, Values::default());
        assert_eq!(hours.asks, [NOW - NOW % 3600 - 3600]);
        assert_eq!(
            hours.defers,
            Vec::<u64>::new(),
            "the open hour is the minute's"
        );
    }

    #[test]
    fn a_batch_of_old_minutes_is_made_down_to_the_day() {
        // A whole day of minutes, two days ago: its hours and the day itself are made here.
        let day = NOW - NOW % 86_400 - 2 * 86_400;
        let chains = plan(
            &series(Method::Max, 1.0, points(1, day, 60, 1440)),
            &carbon(),
            NOW,
        );
        let [c] = &chains[..] else {
            panic!("{chains:?}")
        };
        assert_eq!(c.levels.len(), 2);
        let hours: Vec<u64> = (c.levels[0].made.hash.iter().chain(&c.levels[0].made.old))
            .map(|v| v.0)
            .chain(c.levels[0].made.runs.iter().flat_map(|r| r.slices.clone()))
            .collect();
        assert_eq!(hours.len(), 24);
        assert!(c.levels[0].asks.is_empty());
        assert_eq!(c.levels[1].made.hash, [(day, 3.5)]);
        // The minutes past the hash's 16 went to blocks, in runs of whole groups.
        assert!(c.points.runs.iter().map(|r| r.slices.len()).sum::<usize>() >= 1300);
    }

    #[test]
    fn a_minute_not_all_in_the_window_is_asked_and_a_stale_one_too() {
        let now = NOW - NOW % 60 + 30;
        let minute = now - now % 60 - 60;
        // Five of the minute's six slices: Redis's sixth may weigh in.
        let mut five = points(0, minute, 10, 6);
        five.remove(2);
        let chains = plan(&series(Method::Average, 0.0, five), &carbon(), now);
        assert_eq!(chains[0].levels[0].asks, [minute]);
        // xFilesFactor above 1 makes nothing, as whisper's comparison has it.
        let chains = plan(
            &series(Method::Average, 1.5, points(0, minute, 10, 6)),
            &carbon(),
            now,
        );
        assert_eq!(chains[0].levels[0].asks, [minute]);
    }

    #[test]
    fn whole_groups_go_as_the_blocks_own_bytes() {
        let a = Archive {
            p: 10,
            kept: 21_600,
            slots: 248,
        };
        let now = 100_000;
        let values: Vec<(u64, f64)> = (0..40).map(|k| (50_000 + k * 10, k as f64)).collect();
        let v = split(values.clone(), a, now);
        // 50 000 / 10 = index 5000, slot 40 of block 20: its groups are whole and consecutive,
        // one run.
        assert_eq!(v.runs.len(), 1);
        let r = &v.runs[0];
        assert_eq!((r.block, r.at), (20, 40 / 8 * 65));
        assert_eq!(r.slices.len(), 32);
        assert_eq!(r.bytes[0], 0xff);
        assert_eq!(r.bytes[1..9], 0.0f64.to_bits().to_be_bytes());
        // The newest stays in the hash; the group it leaves in part goes to the script.
        assert_eq!(v.hash, [values[39]]);
        assert_eq!(v.old, values[32..39]);
    }
}
