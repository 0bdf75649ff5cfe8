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

/// The groups of a window made so far, and the group of each combination of schemas met.
struct Groups<'p> {
    precisions: &'p [(u64, CounterWrite)],
    groups: Vec<Group>,
    of_taken: HashMap<Vec<usize>, usize>,
}

impl Groups<'_> {
    /// The group of a series whose names take schemas `taken` ([`Schemas::taken`]): of the
    /// precisions listed, those they keep.
    fn of(&mut self, taken: Vec<usize>, schemas: &Schemas) -> &mut Group {
        let g = match self.of_taken.get(&taken) {
            Some(&g) => g,
            None => {
                let stored = schemas.stored_by(&taken).precisions();
                let list: Vec<(u64, CounterWrite)> = (self.precisions.iter())
                    .filter(|(p, _)| stored.contains(p))
                    .copied()
                    .collect();
                let g = match self.groups.iter().position(|g| g.precisions == list) {
                    Some(g) => g,
                    None => {
                        self.groups.push(Group {
                            precisions: list,
                            ..Group::default()
                        });
                        self.groups.len() - 1
                    }
                };
                self.of_taken.insert(taken, g);
                g
            }
        };
        &mut self.groups[g]
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
    let mut groups = Groups {
        precisions,
        groups: Vec::new(),
        of_taken: HashMap::new(),
    };
    for (series, n) in &window.counters {
        let g = groups.of(schemas.taken(namer, Family::Counter, series), schemas);
        g.counters.push((series.clone(), *n));
    }
    for (series, value) in &window.gauges {
        let g = groups.of(schemas.taken(namer, Family::Gauge, series), schemas);
        g.gauges.push((series.clone(), *value));
    }
    for (series, members) in &window.sets {
        let g = groups.of(schemas.taken(namer, Family::Set, series), schemas);
        g.sets.push((series.clone(), members.clone()));
    }
    let mut groups = groups.groups;
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
