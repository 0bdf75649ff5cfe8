//! Under `storage_schemas`, a window's StatsD series written only at the precisions their
//! names' schemas keep ([`Schemas::stored`]): the window's counters, gauges and sets grouped
//! by the precisions each is written at, each group made into chunks of its own (a chunk lists
//! its precisions once, for all its series).

use std::collections::HashMap;

use super::chunk::{CounterWrite, Parts};
use crate::aggregate::{ClosedWindow, Member, SeriesName};
use crate::storage_conf::{Family, Namer, Schemas};

/// The series of a window written at one list of precisions.
#[derive(Debug, Default)]
pub(super) struct Group {
    pub precisions: Vec<(u64, CounterWrite)>,
    counters: Vec<(SeriesName, i64)>,
    gauges: Vec<(SeriesName, f64)>,
    sets: Vec<(SeriesName, Vec<Member>)>,
}

impl Group {
    /// The group's parts of `window`; the `first` group also carries what no precision list
    /// decides (statistics, logs, carbon's points).
    pub fn parts<'a>(&'a self, window: &'a ClosedWindow, first: bool) -> Parts<'a> {
        let whole = Parts::of(window);
        Parts {
            counters: &self.counters,
            gauges: &self.gauges,
            sets: &self.sets,
            stats: if first { whole.stats } else { &[] },
            logs: if first { whole.logs } else { &[] },
            points: if first { whole.points } else { &[] },
            ..whole
        }
    }
}

/// `window`'s series grouped by the part of `precisions` their names' schemas keep, the
/// group of every precision first; `None` when every schema keeps them all (no series is left
/// out of any), or the window has no counters, gauges or sets.
pub(super) fn by_precisions(
    window: &ClosedWindow,
    precisions: &[(u64, CounterWrite)],
    schemas: &Schemas,
    namer: &Namer,
) -> Option<Vec<Group>> {
    let keeps = |i: usize| schemas.retention(i).precisions();
    let all_keep =
        (0..schemas.all().len()).all(|i| precisions.iter().all(|(p, _)| keeps(i).contains(p)));
    // (Past 128 sections, a file far beyond any seen, every series is written at every
    // precision and trimmed by the cleaner.)
    if all_keep
        || schemas.all().len() > 128
        || (window.counters.is_empty() && window.gauges.is_empty() && window.sets.is_empty())
    {
        return None;
    }
    // The group of each combination of schemas a series' names take (a bit a schema).
    let mut groups: Vec<Group> = Vec::new();
    let mut of_mask: HashMap<u128, usize> = HashMap::new();
    let mut group_of = |family: Family, series: &str| -> usize {
        let mut mask = 0u128;
        namer.each(family, series, |name| mask |= 1u128 << schemas.index(name));
        if let Some(&g) = of_mask.get(&mask) {
            return g;
        }
        let indexes: Vec<usize> = (0..128).filter(|i| mask & (1u128 << i) != 0).collect();
        let stored = schemas.stored_by(&indexes).precisions();
        let list: Vec<(u64, CounterWrite)> = (precisions.iter())
            .filter(|(p, _)| stored.contains(p))
            .copied()
            .collect();
        let g = match groups.iter().position(|g| g.precisions == list) {
            Some(g) => g,
            None => {
                groups.push(Group {
                    precisions: list,
                    ..Group::default()
                });
                groups.len() - 1
            }
        };
        of_mask.insert(mask, g);
        g
    };
    let counters: Vec<usize> = (window.counters.iter())
        .map(|(series, _)| group_of(Family::Counter, series))
        .collect();
    let gauges: Vec<usize> = (window.gauges.iter())
        .map(|(series, _)| group_of(Family::Gauge, series))
        .collect();
    let sets: Vec<usize> = (window.sets.iter())
        .map(|(series, _)| group_of(Family::Set, series))
        .collect();
    for ((series, n), g) in window.counters.iter().zip(counters) {
        groups[g].counters.push((series.clone(), *n));
    }
    for ((series, value), g) in window.gauges.iter().zip(gauges) {
        groups[g].gauges.push((series.clone(), *value));
    }
    for ((series, members), g) in window.sets.iter().zip(sets) {
        groups[g].sets.push((series.clone(), members.clone()));
    }
    // The longest list first (most often every precision, which then leads as before), then
    // in the order met.
    groups.sort_by_key(|g| std::cmp::Reverse(g.precisions.len()));
    Some(groups)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::retention::Retention;

    #[test]
    fn each_series_goes_with_the_precisions_its_schemas_keep() {
        let schemas = Schemas::parse(
            "[short]\npattern = ^s\\.\nretentions = 10s:1h,1m:1d\n\
             [long]\npattern = ^l\\.\nretentions = 1m:7d,1h:1y\n",
        )
        .unwrap();
        let every: Vec<(u64, CounterWrite)> = CounterWrite::everywhere(&[10, 60, 3600]);
        let window = ClosedWindow {
            start: 1000,
            counters: vec![("l.a".into(), 1), ("s.a".into(), 2), ("x".into(), 3)],
            gauges: vec![("s.g".into(), 4.0)],
            ..ClosedWindow::default()
        };
        let groups = by_precisions(&window, &every, &schemas, &Namer::default()).unwrap();
        let got: Vec<(Vec<u64>, Vec<&str>, Vec<&str>)> = groups
            .iter()
            .map(|g| {
                (
                    g.precisions.iter().map(|p| p.0).collect(),
                    g.counters.iter().map(|c| &*c.0).collect(),
                    g.gauges.iter().map(|c| &*c.0).collect(),
                )
            })
            .collect();
        assert_eq!(
            got,
            [
                (vec![60, 3600], vec!["l.a"], vec![]),
                (vec![10, 60], vec!["s.a"], vec!["s.g"]),
                (vec![60], vec!["x"], vec![]),
            ]
        );
        // Every schema keeps every precision listed: one whole window, as without schemas.
        let one = Schemas::single(Retention::parse("10s:1h,1m:1d").unwrap());
        let fine = CounterWrite::everywhere(&[10, 60]);
        assert!(by_precisions(&window, &fine, &one, &Namer::default()).is_none());
    }
}
