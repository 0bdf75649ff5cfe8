//! Carbon points of a window, placed as whisper places them: each in the finest archive whose
//! retention covers its age, aligned to that archive's slice, one value a slice.

use std::collections::BTreeMap;

use super::SeriesName;
use crate::retention::Retention;
use crate::storage_conf::{Aggregation, Aggregations, Schemas};

/// A point placed: its archive (an index into its schema's archives, finest first), its
/// slice, its value.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Placed {
    pub archive: usize,
    pub slice: u64,
    pub value: f64,
}

/// A carbon series' points, placed, and how its coarser slices are made
/// (`storage_aggregation`).
#[derive(Clone, Debug, PartialEq)]
pub struct SeriesPoints {
    pub series: SeriesName,
    /// Its schema ([`Schemas::index`]), whose archives `placed` counts in.
    pub schema: usize,
    pub aggregation: Aggregation,
    pub placed: Vec<Placed>,
}

/// What became of a window's carbon points.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct PointOutcomes {
    /// Placed into a slice (a later one of the same slice in the window replaced it).
    pub placed: u64,
    /// As old as the longest retention or older: dropped, as whisper drops them.
    pub too_old: u64,
    /// Further ahead than the finest archive keeps: dropped (whisper would write them over the
    /// slot that holds the present).
    pub too_far_ahead: u64,
}

/// The archives, finest first: precision and retention (s).
pub fn archives(retention: &Retention) -> Vec<(u64, u64)> {
    let mut archives: Vec<(u64, u64)> = retention
        .archives()
        .iter()
        .map(|a| (a.precision, a.seconds()))
        .collect();
    archives.sort_unstable();
    archives
}

/// Places each series' points (`(timestamp, value)` as they came) at `now`, in the archives
/// of the series' own schema (`storage_schemas`). Within a window,
/// as within one of whisper's `update_many` batches, a slice takes the point with the latest
/// timestamp, and of equal timestamps the last that came (carbon's cache keeps the last);
/// across windows the later write replaces the earlier, as across whisper's writes.
pub fn place(
    points: Vec<(SeriesName, Vec<(f64, f64)>)>,
    schemas: &Schemas,
    now: u64,
    aggregations: &Aggregations,
) -> (Vec<SeriesPoints>, PointOutcomes) {
    let mut outcomes = PointOutcomes::default();
    let all: Vec<Vec<(u64, u64)>> = schemas.all().iter().map(archives).collect();
    let placed = points
        .into_iter()
        .filter_map(|(series, values)| {
            let schema = schemas.index(&series);
            let archives = &all[schema];
            let longest = archives.iter().map(|a| a.1).max().unwrap_or(0);
            let ahead = archives.first().map_or(0, |a| a.1);
            let mut slices: BTreeMap<(usize, u64), (f64, f64)> = BTreeMap::new();
            for (at, value) in values {
                // Whisper's int(): toward zero.
                let t = at.trunc();
                let age = now as f64 - t;
                if age >= longest as f64 || t < 0.0 {
                    outcomes.too_old += 1;
                    continue;
                }
                if -age > ahead as f64 {
                    outcomes.too_far_ahead += 1;
                    continue;
                }
                let t = t as u64;
                // The finest archive that keeps that long (a point ahead of now: the finest).
                let archive = archives.iter().position(|a| a.1 as f64 >= age).unwrap_or(0);
                let p = archives[archive].0;
                let slot = slices.entry((archive, t - t % p)).or_insert((at, value));
                if at >= slot.0 {
                    *slot = (at, value);
                }
                outcomes.placed += 1;
            }
            let placed: Vec<Placed> = slices
                .into_iter()
                .map(|((archive, slice), (_, value))| Placed {
                    archive,
                    slice,
                    value,
                })
                .collect();
            (!placed.is_empty()).then(|| SeriesPoints {
                aggregation: aggregations.of(&series),
                schema,
                series,
                placed,
            })
        })
        .collect();
    (placed, outcomes)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn etsy() -> Schemas {
        Schemas::single(Retention::parse("10s:6h,1m:7d,1h:90d").unwrap())
    }

    fn placed(points: &[(f64, f64)], now: u64) -> (Vec<Placed>, PointOutcomes) {
        let aggregations = Aggregations::default();
        let (mut series, outcomes) = place(
            vec![("a".into(), points.to_vec())],
            &etsy(),
            now,
            &aggregations,
        );
        (series.pop().map(|s| s.placed).unwrap_or_default(), outcomes)
    }

    fn at(archive: usize, slice: u64, value: f64) -> Placed {
        Placed {
            archive,
            slice,
            value,
        }
    }

    #[test]
    fn a_point_lands_in_the_finest_archive_that_keeps_its_age() {
        let now = 1_000_000_000;
        let (p, o) = placed(
            &[
                (now as f64 - 5.0, 1.0),
                // Exactly six hours old: still the 10 s archive's, as whisper has it.
                ((now - 6 * 3600) as f64, 2.0),
                ((now - 6 * 3600 - 1) as f64, 3.0),
                ((now - 90 * 86400) as f64, 4.0),
                ((now - 90 * 86400 + 1) as f64, 5.0),
                (-5.0, 6.0),
            ],
            now,
        );
        let fit = |t: u64, p: u64| t - t % p;
        assert_eq!(
            p,
            [
                at(0, now - 6 * 3600, 2.0),
                at(0, now - 10, 1.0),
                at(1, fit(now - 6 * 3600 - 1, 60), 3.0),
                at(2, fit(now - 90 * 86400 + 1, 3600), 5.0),
            ]
        );
        assert_eq!(
            o,
            PointOutcomes {
                placed: 4,
                too_old: 2,
                too_far_ahead: 0,
            }
        );
    }

    #[test]
    fn a_slice_takes_the_latest_timestamp_then_the_last_sent() {
        let now = 1_000_000_000;
        let t = (now - 100) as f64;
        let (p, _) = placed(&[(t + 3.0, 1.0), (t + 1.0, 2.0), (t, 3.0)], now);
        assert_eq!(p, [at(0, now - 100, 1.0)]);
        let (p, _) = placed(&[(t + 3.0, 1.0), (t + 3.0, 2.0)], now);
        assert_eq!(p, [at(0, now - 100, 2.0)]);
    }

    #[test]
    fn ahead_of_now_only_as_far_as_the_finest_archive_keeps() {
        let now = 1_000_000_000;
        let (p, o) = placed(
            &[
                ((now + 6 * 3600) as f64, 1.0),
                ((now + 6 * 3600 + 1) as f64, 2.0),
            ],
            now,
        );
        assert_eq!(p, [at(0, now + 6 * 3600, 1.0)]);
        assert_eq!(o.too_far_ahead, 1);
    }

    #[test]
    fn each_series_takes_its_own_schemas_archives() {
        let now = 1_000_000_000;
        let schemas = Schemas::parse(
            "[short]\npattern = ^s\\.\nretentions = 10s:1h,1m:1d\n\
             [long]\npattern = ^l\\.\nretentions = 1m:90d\n",
        )
        .unwrap();
        let two_hours = (now - 7200) as f64;
        let (placed, o) = place(
            vec![
                ("l.a".into(), vec![(two_hours, 1.0)]),
                (
                    "other".into(),
                    vec![(two_hours, 2.0), ((now - 8 * 86400) as f64, 3.0)],
                ),
                (
                    "s.a".into(),
                    vec![(two_hours, 4.0), ((now - 2 * 86400) as f64, 5.0)],
                ),
            ],
            &schemas,
            now,
            &Aggregations::default(),
        );
        let got: Vec<(&str, usize, Vec<Placed>)> = placed
            .iter()
            .map(|s| (&*s.series, s.schema, s.placed.clone()))
            .collect();
        let minute = now - 7200 - (now - 7200) % 60;
        assert_eq!(
            got,
            [
                ("l.a", 1, vec![at(0, minute, 1.0)]),
                // carbon's fallback, a week of minutes: eight days is too old.
                ("other", 2, vec![at(0, minute, 2.0)]),
                // Two hours is past the 10 s archive: the minutes'; two days past both.
                ("s.a", 0, vec![at(1, minute, 4.0)]),
            ]
        );
        assert_eq!(o.too_old, 2);
    }
}
