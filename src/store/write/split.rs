//! Under `storage_schemas`, a window's StatsD series written only at the precisions their
//! names' schemas keep ([`Schemas::stored`]): the window's counters, gauges and sets grouped
//! by the precisions each is written at, each group made into chunks of its own (a chunk lists
//! its precisions once, for all its series).

use std::collections::{BTreeMap, HashMap};

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
    if all_keep
        || (window.counters.is_empty() && window.gauges.is_empty() && window.sets.is_empty())
    {
        return None;
    }
    // The precisions kept, by the combination of schemas a series' names take.
    let mut kept: HashMap<Vec<usize>, Vec<u64>> = HashMap::new();
    let mut list_of = |family: Family, series: &str| -> Vec<u64> {
        let indexes = schemas.indexes(&namer.names(family, series));
        (kept.entry(indexes).or_insert_with_key(|indexes| {
            let stored = schemas.stored_by(indexes).precisions();
            (precisions.iter())
                .map(|(p, _)| *p)
                .filter(|p| stored.contains(p))
                .collect()
        }))
        .clone()
    };
    let mut groups: BTreeMap<Vec<u64>, Group> = BTreeMap::new();
    for (series, n) in &window.counters {
        let list = list_of(Family::Counter, series);
        group(&mut groups, list, precisions)
            .counters
            .push((series.clone(), *n));
    }
    for (series, value) in &window.gauges {
        let list = list_of(Family::Gauge, series);
        group(&mut groups, list, precisions)
            .gauges
            .push((series.clone(), *value));
    }
    for (series, members) in &window.sets {
        let list = list_of(Family::Set, series);
        (group(&mut groups, list, precisions).sets).push((series.clone(), members.clone()));
    }
    // The longest list first: most often every precision, which then leads as before.
    let mut groups: Vec<Group> = groups.into_values().collect();
    groups.sort_by_key(|g| std::cmp::Reverse(g.precisions.len()));
    Some(groups)
}

/// The group of the precisions `list`, made when it is the first.
fn group<'g>(
    groups: &'g mut BTreeMap<Vec<u64>, Group>,
    list: Vec<u64>,
    precisions: &[(u64, CounterWrite)],
) -> &'g mut Group {
    groups.entry(list).or_insert_with_key(|list| Group {
        precisions: (precisions.iter())
            .filter(|(p, _)| list.contains(p))
            .copied()
            .collect(),
        ..Group::default()
    })
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
                (vec![10, 60], vec!["s.a"], vec!["s.g"]),
                (vec![60, 3600], vec!["l.a"], vec![]),
                (vec![60], vec!["x"], vec![]),
            ]
        );
        // Every schema keeps every precision listed: one whole window, as without schemas.
        let one = Schemas::single(Retention::parse("10s:1h,1m:1d").unwrap());
        let fine = CounterWrite::everywhere(&[10, 60]);
        assert!(by_precisions(&window, &fine, &one, &Namer::default()).is_none());
    }
}
