//! Etsy statsd's Graphite names over the agent's series (`graphite_etsy_names`; Etsy's
//! `backends/graphite.js` and `lib/process_metrics.js`; docs/reading.md, "Etsy's names"):
//!
//! | Etsy name (legacy namespace, the default) | the agent's series | a point |
//! |---|---|---|
//! | `stats_counts.<name>` | counter `<name>` | the slice's count; 0 where it has none |
//! | `stats.<name>` | counter `<name>` | the count per second of the slice; 0 where none |
//! | `stats.gauges.<name>` | gauge `<name>` | the slice's value, else the last one before it in the range |
//! | `stats.sets.<name>.count` | set `<name>` | the slice's distinct members; 0 where none |
//! | `stats.timers.<name>.<statistic>` | timer `<name>` | [`Field`]: from the slice's quantile buckets |
//!
//! Without the legacy namespace: `<global_prefix>.<prefix_counter>.<name>.count|rate`,
//! `<global_prefix>.<prefix_gauge>.<name>`, `<global_prefix>.<prefix_set>.<name>.count`, empty
//! prefixes left out; `global_suffix` is a last node after every one. Etsy flushes 0 for a known
//! counter or set that received nothing and a gauge's last value again, so an idle slice reads
//! as those, not null.

use super::names::NodePattern;
use super::series::Point;
use crate::aggregate::StatKind;
use crate::aggregate::sketch::{Bucket, Buckets, Mapping};
use crate::config::Config;

/// How an Etsy name's points come from its series' points.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub enum View {
    /// As the agent's own name reads them.
    #[default]
    Plain,
    /// A counter's count or a set's size, 0 for a slice without one.
    Count,
    /// A counter's count per second of the slice, 0 for a slice without one.
    Rate,
    /// A gauge's value, carried on through the slices without one after it.
    Last,
}

impl View {
    /// The points of a series at `step` seconds a point, its slices starting at `slices`, as
    /// this view shows them. A count is 0 only in a slice the agent has written by now: one
    /// that ended at `settled` or before (a slice still open, or not yet due, stays `null`).
    pub fn apply(self, values: &mut [Point], step: i64, slices: &[i64], settled: i64) {
        let idle = |slice: &i64| slice + step <= settled;
        match self {
            View::Plain => {}
            View::Count => {
                for (v, slice) in values.iter_mut().zip(slices) {
                    if v.is_none() && idle(slice) {
                        *v = Some(0.0);
                    }
                }
            }
            View::Rate => {
                let seconds = step.max(1) as f64;
                for (v, slice) in values.iter_mut().zip(slices) {
                    *v = match *v {
                        Some(count) => Some(count / seconds),
                        None => idle(slice).then_some(0.0),
                    };
                }
            }
            View::Last => {
                let mut last = None;
                for v in values {
                    match v {
                        Some(_) => last = *v,
                        None => *v = last,
                    }
                }
            }
        }
    }
}

/// Where a Graphite series' points come from.
#[derive(Debug, Clone, PartialEq)]
pub enum Kind {
    Counter,
    Gauge,
    Set,
    Stat(StatKind, &'static str),
    /// One of Etsy's statistics of a timer ([`Field`]).
    Etsy(StatKind, Field),
}

/// A statistic Etsy's `lib/process_metrics.js` writes for a timer, made here from a slice's
/// quantile buckets: a value at a rank is its bucket's estimate (within the buckets' accuracy),
/// sums are of the estimates, and a sample rate's weight counts as that many values.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Field {
    Count,
    Sum,
    SumSquares,
    Mean,
    Median,
    Upper,
    Lower,
    Std,
    /// `count_<p>`: the number of values in the lowest (or, below 0, highest) `|p|` percent.
    CountAt(f64),
    MeanAt(f64),
    /// `upper_<p>`, or `lower_<p>` for a negative `p`: the last value in.
    EdgeAt(f64),
    SumAt(f64),
    SumSquaresAt(f64),
}

impl Field {
    /// Etsy's names of a timer's statistics, with `count_ps` (the count per second), for the
    /// percent thresholds given: `(name, field, view)`.
    pub fn all(thresholds: &[f64]) -> Vec<(String, Field, View)> {
        let mut out = Vec::new();
        for &p in thresholds {
            // Etsy's `String(p)`, its first `.` as `_`, its `-` as `top`.
            let name = format!("{p}").replacen('.', "_", 1).replacen('-', "top", 1);
            let edge = if p < 0.0 { "lower" } else { "upper" };
            out.push((format!("count_{name}"), Field::CountAt(p), View::Plain));
            out.push((format!("mean_{name}"), Field::MeanAt(p), View::Plain));
            out.push((format!("{edge}_{name}"), Field::EdgeAt(p), View::Plain));
            out.push((format!("sum_{name}"), Field::SumAt(p), View::Plain));
            out.push((
                format!("sum_squares_{name}"),
                Field::SumSquaresAt(p),
                View::Plain,
            ));
        }
        for (name, field, view) in [
            ("std", Field::Std, View::Plain),
            ("upper", Field::Upper, View::Plain),
            ("lower", Field::Lower, View::Plain),
            ("count", Field::Count, View::Count),
            ("count_ps", Field::Count, View::Rate),
            ("sum", Field::Sum, View::Plain),
            ("sum_squares", Field::SumSquares, View::Plain),
            ("mean", Field::Mean, View::Plain),
            ("median", Field::Median, View::Plain),
        ] {
            out.push((name.to_string(), field, view));
        }
        out
    }

    /// This statistic of a slice's buckets; `None` for a slice without values (Etsy writes
    /// only `count` and `count_ps`, both 0, for an idle timer: their views give the 0), or a
    /// threshold that takes no value.
    pub fn of(self, buckets: &Buckets, mapping: &Mapping) -> Point {
        let n = buckets.total();
        if n <= 0.0 {
            return None;
        }
        // Each bucket's estimate is worked out where it is asked for (an `exp`), not for all.
        let value = |b| mapping.value(b);
        // The value of rank `i` (from 0) in value order.
        let at = |i: f64| {
            let mut seen = 0.0;
            for (b, w) in buckets.iter() {
                seen += w;
                if seen > i {
                    return Some(value(b));
                }
            }
            buckets.iter().next_back().map(|(b, _)| value(b))
        };
        let sum = |power: i32| {
            buckets
                .iter()
                .map(|(b, w)| value(b).powi(power) * w)
                .sum::<f64>()
        };
        // The `np` lowest (`top` false) or highest values' sums of powers 1 and 2.
        let part = |np: f64, top: bool| {
            let (mut left, mut sums) = (np, (0.0, 0.0));
            // Whether more are wanted.
            let mut take = |(b, w): (Bucket, f64)| {
                let (v, t) = (value(b), w.min(left));
                left -= t;
                sums.0 += v * t;
                sums.1 += v * v * t;
                left > 0.0
            };
            if top {
                buckets.iter().rev().take_while(|e| take(*e)).for_each(drop);
            } else {
                buckets.iter().take_while(|e| take(*e)).for_each(drop);
            }
            sums
        };
        // Etsy's `Math.round(|p| / 100 * n)` values in the threshold; all of a single value's.
        let np = |p: f64| {
            let np = if n <= 1.0 {
                n
            } else {
                (p.abs() / 100.0 * n).round()
            };
            (np > 0.0).then_some(np)
        };
        match self {
            Field::Count => Some(n),
            Field::Sum => Some(sum(1)),
            Field::SumSquares => Some(sum(2)),
            Field::Mean => Some(sum(1) / n),
            Field::Upper => buckets.iter().next_back().map(|(b, _)| value(b)),
            Field::Lower => buckets.iter().next().map(|(b, _)| value(b)),
            Field::Std => {
                let mean = sum(1) / n;
                let spread: f64 = buckets
                    .iter()
                    .map(|(b, w)| (value(b) - mean).powi(2) * w)
                    .sum();
                Some((spread / n).sqrt())
            }
            Field::Median => {
                let count = n.floor();
                if count % 2.0 == 1.0 || count < 2.0 {
                    at((count / 2.0).floor())
                } else {
                    Some((at(count / 2.0 - 1.0)? + at(count / 2.0)?) / 2.0)
                }
            }
            Field::CountAt(p) => np(p),
            Field::MeanAt(p) => np(p).map(|np| part(np, p < 0.0).0 / np),
            Field::SumAt(p) => np(p).map(|np| part(np, p < 0.0).0),
            Field::SumSquaresAt(p) => np(p).map(|np| part(np, p < 0.0).1),
            Field::EdgeAt(p) => {
                let np = np(p)?;
                at(if p < 0.0 { n - np } else { np - 1.0 })
            }
        }
    }
}

/// The nodes after a name in one namespace, and what its points are.
#[derive(Debug, Clone, PartialEq)]
pub struct Tail {
    pub nodes: Vec<String>,
    pub view: View,
    /// The timer statistic, in the timers' namespace.
    pub field: Option<Field>,
}

impl Tail {
    /// The kind of an Etsy name ending with this tail, over a series of `kind`: a timer's
    /// statistic is this tail's.
    pub fn kind_of(&self, kind: &Kind) -> Kind {
        match (kind, self.field) {
            (Kind::Etsy(stat, _), Some(field)) => Kind::Etsy(*stat, field),
            (kind, _) => kind.clone(),
        }
    }
}

/// The nodes before a name, the kind of series under them (for timers, any of their
/// statistics), the nodes each of its names may end with.
#[derive(Debug, Clone, PartialEq)]
pub struct Namespace {
    pub head: Vec<String>,
    pub kind: Kind,
    pub tails: Vec<Tail>,
}

/// `parts` split at their dots, empty ones left out.
fn nodes(parts: &[&str]) -> Vec<String> {
    parts
        .iter()
        .flat_map(|p| p.split('.'))
        .filter(|n| !n.is_empty())
        .map(String::from)
        .collect()
}

impl Namespace {
    fn new(head: &[&str], kind: Kind, tails: &[(&str, View)], suffix: &[String]) -> Namespace {
        let tails = tails
            .iter()
            .map(|(tail, view)| Tail {
                nodes: nodes(&[tail])
                    .into_iter()
                    .chain(suffix.iter().cloned())
                    .collect(),
                view: *view,
                field: None,
            })
            .collect();
        Namespace {
            head: nodes(head),
            kind,
            tails,
        }
    }

    /// The timers' namespace: a tail per statistic.
    fn timers(head: &[&str], thresholds: &[f64], suffix: &[String]) -> Namespace {
        let tails = Field::all(thresholds)
            .into_iter()
            .map(|(name, field, view)| Tail {
                nodes: std::iter::once(name)
                    .chain(suffix.iter().cloned())
                    .collect(),
                view,
                field: Some(field),
            })
            .collect();
        Namespace {
            head: nodes(head),
            kind: Kind::Etsy(StatKind::Timer, Field::Count),
            tails,
        }
    }

    /// The Etsy path of an agent's Graphite path with the first `matched` nodes of a tail.
    pub fn path(&self, name: &str, tail: &Tail, matched: usize) -> String {
        let mut nodes: Vec<&str> = self.head.iter().map(String::as_str).collect();
        nodes.push(name);
        nodes.extend(tail.nodes[..matched].iter().map(String::as_str));
        nodes.join(".")
    }

    /// The agent's Graphite name behind an Etsy path (its tags kept) and the tail it ends
    /// with, if the path is in this namespace.
    pub fn name_of(&self, path: &str) -> Option<(String, &Tail)> {
        let (metric, tags) = match path.split_once(';') {
            Some((m, t)) => (m, Some(t)),
            None => (path, None),
        };
        let nodes: Vec<&str> = metric.split('.').collect();
        let h = self.head.len();
        if nodes.len() <= h || nodes[..h] != self.head[..] {
            return None;
        }
        self.tails.iter().find_map(|tail| {
            let t = tail.nodes.len();
            if nodes.len() <= h + t || nodes[nodes.len() - t..] != tail.nodes[..] {
                return None;
            }
            let name = nodes[h..nodes.len() - t].join(".");
            Some((
                match tags {
                    Some(tags) => format!("{name};{tags}"),
                    None => name,
                },
                tail,
            ))
        })
    }

    /// What a glob's nodes ask of this namespace: the branches of its head they end in, or
    /// the agent's names to find, with the tail whose first nodes the glob's last nodes match
    /// (none when they match no tail node).
    pub fn plan(&self, parts: &[String]) -> Result<Vec<Plan<'_>>, String> {
        let h = self.head.len();
        for (part, node) in parts.iter().zip(&self.head) {
            if !NodePattern::new(part)?.matches(node) {
                return Ok(Vec::new());
            }
        }
        if parts.len() <= h {
            return Ok(vec![Plan::Branch(self.head[..parts.len()].join("."))]);
        }
        let rest = &parts[h..];
        let patterns: Vec<NodePattern> = rest
            .iter()
            .map(|p| NodePattern::new(p))
            .collect::<Result<_, _>>()?;
        let mut plans = vec![Plan::Names {
            pattern: rest.join("."),
            tail: None,
        }];
        for tail in &self.tails {
            for matched in 1..=tail.nodes.len().min(rest.len() - 1) {
                let at = rest.len() - matched;
                if patterns[at..]
                    .iter()
                    .zip(&tail.nodes)
                    .all(|(p, node)| p.matches(node))
                {
                    plans.push(Plan::Names {
                        pattern: rest[..at].join("."),
                        tail: Some((tail, matched)),
                    });
                }
            }
        }
        Ok(plans)
    }
}

/// See [`Namespace::plan`].
#[derive(Debug, Clone, PartialEq)]
pub enum Plan<'a> {
    Branch(String),
    Names {
        pattern: String,
        tail: Option<(&'a Tail, usize)>,
    },
}

/// The namespaces the configuration asks for, the longest heads first (a path that two could
/// name is the more specific one's: `stats.gauges.x` is a gauge); none when the Etsy names are
/// off.
pub fn namespaces(config: &Config) -> Vec<Namespace> {
    if !config.graphite_etsy_names {
        return Vec::new();
    }
    let suffix = nodes(&[&config.graphite_etsy_global_suffix]);
    let thresholds = &config.graphite_etsy_percent_threshold;
    let mut all = if config.graphite_etsy_legacy_namespace {
        vec![
            Namespace::new(
                &["stats_counts"],
                Kind::Counter,
                &[("", View::Count)],
                &suffix,
            ),
            Namespace::new(&["stats"], Kind::Counter, &[("", View::Rate)], &suffix),
            Namespace::timers(&["stats", "timers"], thresholds, &suffix),
            Namespace::new(
                &["stats", "gauges"],
                Kind::Gauge,
                &[("", View::Last)],
                &suffix,
            ),
            Namespace::new(
                &["stats", "sets"],
                Kind::Set,
                &[("count", View::Count)],
                &suffix,
            ),
        ]
    } else {
        let prefix = config.graphite_etsy_global_prefix.as_str();
        vec![
            Namespace::new(
                &[prefix, &config.graphite_etsy_prefix_counter],
                Kind::Counter,
                &[("count", View::Count), ("rate", View::Rate)],
                &suffix,
            ),
            Namespace::timers(
                &[prefix, &config.graphite_etsy_prefix_timer],
                thresholds,
                &suffix,
            ),
            Namespace::new(
                &[prefix, &config.graphite_etsy_prefix_gauge],
                Kind::Gauge,
                &[("", View::Last)],
                &suffix,
            ),
            Namespace::new(
                &[prefix, &config.graphite_etsy_prefix_set],
                Kind::Set,
                &[("count", View::Count)],
                &suffix,
            ),
        ]
    };
    all.sort_by_key(|n| std::cmp::Reverse(n.head.len()));
    all
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(legacy: bool, suffix: &str) -> Config {
        Config {
            graphite_etsy_names: true,
            graphite_etsy_legacy_namespace: legacy,
            graphite_etsy_global_suffix: suffix.into(),
            ..Config::default()
        }
    }

    fn names_of(config: &Config, path: &str) -> Vec<(Kind, View, String)> {
        namespaces(config)
            .iter()
            .filter_map(|n| {
                let (name, tail) = n.name_of(path)?;
                Some((tail.kind_of(&n.kind), tail.view, name))
            })
            .collect()
    }

    /// `storage_schemas` matches a series by the names `storage_conf::Namer` gives it: the
    /// Etsy paths this module serves it under.
    #[test]
    fn the_schemas_names_are_the_etsy_paths() {
        use crate::storage_conf::{Family, Namer};
        for (legacy, suffix) in [(true, ""), (true, "s.x"), (false, ""), (false, "sfx")] {
            let config = config(legacy, suffix);
            for (family, kind) in [
                (Family::Counter, Kind::Counter),
                (Family::Gauge, Kind::Gauge),
                (Family::Set, Kind::Set),
            ] {
                let mut served: Vec<String> = namespaces(&config)
                    .iter()
                    .filter(|n| n.kind == kind)
                    .flat_map(|n| n.tails.iter().map(|t| n.path("a.b", t, t.nodes.len())))
                    .collect();
                let mut named = Namer::new(&config).names(family, "a.b");
                assert_eq!(named.remove(0), "a.b");
                served.sort();
                named.sort();
                assert_eq!(
                    named, served,
                    "{family:?}, legacy {legacy}, suffix {suffix:?}"
                );
            }
        }
    }

    #[test]
    fn etsy_paths_name_the_agents_series() {
        let legacy = config(true, "");
        assert_eq!(
            names_of(&legacy, "stats_counts.api.hits"),
            [(Kind::Counter, View::Count, "api.hits".to_string())]
        );
        // The gauge's namespace first: `stats.gauges.q` is a gauge, or a counter `gauges.q`.
        assert_eq!(
            names_of(&legacy, "stats.gauges.q"),
            [
                (Kind::Gauge, View::Last, "q".to_string()),
                (Kind::Counter, View::Rate, "gauges.q".to_string())
            ]
        );
        assert_eq!(
            names_of(&legacy, "stats.sets.users.count;env=prod")[0],
            (Kind::Set, View::Count, "users;env=prod".to_string())
        );
        let timer = |field| Kind::Etsy(StatKind::Timer, field);
        assert_eq!(
            names_of(&legacy, "stats.timers.api.upper_90")[0],
            (timer(Field::EdgeAt(90.0)), View::Plain, "api".to_string())
        );
        assert_eq!(
            names_of(&legacy, "stats.timers.api.count_ps")[0],
            (timer(Field::Count), View::Rate, "api".to_string())
        );
        assert!(names_of(&legacy, "stats_counts").is_empty());
        let modern = config(false, "eu.1");
        assert_eq!(
            names_of(&modern, "stats.counters.api.hits.rate.eu.1"),
            [(Kind::Counter, View::Rate, "api.hits".to_string())]
        );
        assert!(names_of(&modern, "stats.counters.api.hits.rate").is_empty());
        let bare = Config {
            graphite_etsy_global_prefix: String::new(),
            ..config(false, "")
        };
        assert_eq!(
            names_of(&bare, "gauges.q")[0],
            (Kind::Gauge, View::Last, "q".to_string())
        );
        assert!(namespaces(&Config::default()).is_empty());
    }

    #[test]
    fn thresholds_are_named_as_etsy_names_them() {
        let names: Vec<String> = Field::all(&[90.0, 99.9, -10.0])
            .into_iter()
            .map(|(n, _, _)| n)
            .collect();
        for name in [
            "count_90",
            "upper_90",
            "sum_squares_99_9",
            "upper_99_9",
            "lower_top10",
            "mean_top10",
            "count_ps",
            "median",
            "std",
        ] {
            assert!(names.iter().any(|n| n == name), "{name}: {names:?}");
        }
    }

    #[test]
    fn a_glob_is_planned_per_namespace() {
        let legacy = config(true, "");
        let all = namespaces(&legacy);
        let sets = all.iter().find(|n| n.kind == Kind::Set).unwrap();
        let count = &sets.tails[0];
        let parts = |p: &str| p.split('.').map(String::from).collect::<Vec<_>>();
        assert_eq!(
            sets.plan(&parts("stats")).unwrap(),
            [Plan::Branch("stats".into())]
        );
        assert_eq!(
            sets.plan(&parts("stats.s*")).unwrap(),
            [Plan::Branch("stats.sets".into())]
        );
        assert!(sets.plan(&parts("stats.gauges.*")).unwrap().is_empty());
        // `stats.sets.a.*`: the names under `a`, or the set `a` and its `count`.
        assert_eq!(
            sets.plan(&parts("stats.sets.a.*")).unwrap(),
            [
                Plan::Names {
                    pattern: "a.*".into(),
                    tail: None
                },
                Plan::Names {
                    pattern: "a".into(),
                    tail: Some((count, 1))
                }
            ]
        );
        assert_eq!(
            sets.plan(&parts("stats.sets.a.rate")).unwrap(),
            [Plan::Names {
                pattern: "a.rate".into(),
                tail: None
            }]
        );
        assert_eq!(sets.path("a.b", count, 1), "stats.sets.a.b.count");
    }

    #[test]
    fn idle_slices_read_as_etsy_flushes_them() {
        // Slices at 0, 60, 120 and 180; written up to 180 (the last is still open).
        let slices = [0, 60, 120, 180];
        let mut counts = vec![None, Some(6.0), None, None];
        View::Count.apply(&mut counts, 60, &slices, 180);
        assert_eq!(counts, [Some(0.0), Some(6.0), Some(0.0), None]);
        let mut rates = vec![Some(6.0), None, None, Some(3.0)];
        View::Rate.apply(&mut rates, 60, &slices, 180);
        assert_eq!(rates, [Some(0.1), Some(0.0), Some(0.0), Some(0.05)]);
        let mut gauges = vec![None, Some(3.0), None, Some(-1.0), None];
        View::Last.apply(&mut gauges, 10, &[0, 10, 20, 30, 40], 0);
        assert_eq!(gauges, [None, Some(3.0), Some(3.0), Some(-1.0), Some(-1.0)]);
    }

    /// Etsy's statistics of ten values 10, 20, … 100 (`lib/process_metrics.js`), from buckets
    /// of 1 % accuracy: counts exact, each value within 1 %.
    #[test]
    fn timer_statistics_as_etsy_computes_them() {
        let mapping = Mapping::new(0.01);
        let mut buckets = Buckets::default();
        for v in 1..=10 {
            buckets.add(mapping.bucket(v as f64 * 10.0), 1.0);
        }
        let of = |f: Field| f.of(&buckets, &mapping).unwrap();
        let near = |f: Field, want: f64| {
            let got = of(f);
            assert!(
                (got - want).abs() <= 0.01 * want.abs() + 1e-9,
                "{f:?}: {got} vs {want}"
            );
        };
        assert_eq!(of(Field::Count), 10.0);
        assert_eq!(of(Field::CountAt(90.0)), 9.0);
        assert_eq!(of(Field::CountAt(-20.0)), 2.0);
        assert_eq!(Field::CountAt(1.0).of(&buckets, &mapping), None);
        near(Field::Sum, 550.0);
        near(Field::SumSquares, 38_500.0);
        near(Field::Mean, 55.0);
        near(Field::Median, 55.0);
        near(Field::Upper, 100.0);
        near(Field::Lower, 10.0);
        near(Field::Std, 28.722813232690143);
        near(Field::EdgeAt(90.0), 90.0);
        near(Field::SumAt(90.0), 450.0);
        near(Field::MeanAt(90.0), 50.0);
        near(Field::SumSquaresAt(90.0), 28_500.0);
        near(Field::EdgeAt(-20.0), 90.0);
        near(Field::SumAt(-20.0), 190.0);
        assert_eq!(Field::Count.of(&Buckets::default(), &mapping), None);
    }
}
