//! Etsy statsd's Graphite names over the agent's series (`graphite_etsy_names`; Etsy's
//! `backends/graphite.js` and `lib/process_metrics.js`; docs/reading.md, "Etsy's names"):
//!
//! | Etsy name (legacy namespace, the default) | the agent's series | a point |
//! |---|---|---|
//! | `stats_counts.<name>` | counter `<name>` | the slice's count; 0 where it has none |
//! | `stats.<name>` | counter `<name>` | the count per second of the slice; 0 where none |
//! | `stats.gauges.<name>` | gauge `<name>` | the slice's value, else the last one before it in the range |
//! | `stats.sets.<name>.count` | set `<name>` | the slice's distinct members; 0 where none |
//!
//! Without the legacy namespace: `<global_prefix>.<prefix_counter>.<name>.count|rate`,
//! `<global_prefix>.<prefix_gauge>.<name>`, `<global_prefix>.<prefix_set>.<name>.count`, empty
//! prefixes left out; `global_suffix` is a last node after every one. Etsy flushes 0 for a known
//! counter or set that received nothing and a gauge's last value again, so an idle slice reads
//! as those, not null.

use super::names::NodePattern;
use super::series::Point;
use super::source::Kind;
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
    /// The points of a series at `step` seconds a point, as this view shows them.
    pub fn apply(self, values: &mut [Point], step: i64) {
        match self {
            View::Plain => {}
            View::Count => values.iter_mut().for_each(|v| *v = Some(v.unwrap_or(0.0))),
            View::Rate => {
                let step = step.max(1) as f64;
                values
                    .iter_mut()
                    .for_each(|v| *v = Some(v.unwrap_or(0.0) / step));
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

/// The nodes before a name, the kind of series under them, the nodes after it.
#[derive(Debug, Clone, PartialEq)]
pub struct Namespace {
    pub head: Vec<String>,
    pub kind: Kind,
    pub tail: Vec<String>,
    pub view: View,
}

impl Namespace {
    fn new(head: &[&str], kind: Kind, tail: &[&str], suffix: &[String], view: View) -> Namespace {
        let nodes = |parts: &[&str]| -> Vec<String> {
            parts
                .iter()
                .flat_map(|p| p.split('.'))
                .filter(|n| !n.is_empty())
                .map(String::from)
                .collect()
        };
        let mut tail = nodes(tail);
        tail.extend(suffix.iter().cloned());
        Namespace {
            head: nodes(head),
            kind,
            tail,
            view,
        }
    }

    /// The Etsy path of an agent's Graphite path with the first `tail` nodes of the tail.
    pub fn path(&self, name: &str, tail: usize) -> String {
        let mut nodes: Vec<&str> = self.head.iter().map(String::as_str).collect();
        nodes.push(name);
        nodes.extend(self.tail[..tail].iter().map(String::as_str));
        nodes.join(".")
    }

    /// The agent's Graphite name behind an Etsy path (its tags kept), if the path is in this
    /// namespace.
    pub fn name_of(&self, path: &str) -> Option<String> {
        let (metric, tags) = match path.split_once(';') {
            Some((m, t)) => (m, Some(t)),
            None => (path, None),
        };
        let nodes: Vec<&str> = metric.split('.').collect();
        let (h, t) = (self.head.len(), self.tail.len());
        if nodes.len() <= h + t
            || nodes[..h] != self.head[..]
            || nodes[nodes.len() - t..] != self.tail[..]
        {
            return None;
        }
        let name = nodes[h..nodes.len() - t].join(".");
        Some(match tags {
            Some(tags) => format!("{name};{tags}"),
            None => name,
        })
    }

    /// What a glob's nodes ask of this namespace: the branches of its head they end in, or
    /// the agent's names to find (each with the number of tail nodes the glob's last nodes
    /// match).
    pub fn plan(&self, parts: &[String]) -> Result<Vec<Plan>, String> {
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
        let mut plans = Vec::new();
        for matched in 0..=self.tail.len().min(rest.len() - 1) {
            let (name, tail) = rest.split_at(rest.len() - matched);
            let mut fits = true;
            for (part, node) in tail.iter().zip(&self.tail) {
                fits &= NodePattern::new(part)?.matches(node);
            }
            if fits {
                plans.push(Plan::Names {
                    pattern: name.join("."),
                    matched,
                });
            }
        }
        Ok(plans)
    }
}

/// See [`Namespace::plan`].
#[derive(Debug, Clone, PartialEq)]
pub enum Plan {
    Branch(String),
    Names { pattern: String, matched: usize },
}

/// The namespaces the configuration asks for, the longest heads first (a path that two could
/// name is the more specific one's: `stats.gauges.x` is a gauge); none when the Etsy names are
/// off.
pub fn namespaces(config: &Config) -> Vec<Namespace> {
    if !config.graphite_etsy_names {
        return Vec::new();
    }
    let suffix: Vec<String> = config
        .graphite_etsy_global_suffix
        .split('.')
        .filter(|n| !n.is_empty())
        .map(String::from)
        .collect();
    let mut all = if config.graphite_etsy_legacy_namespace {
        vec![
            Namespace::new(&["stats_counts"], Kind::Counter, &[], &suffix, View::Count),
            Namespace::new(&["stats"], Kind::Counter, &[], &suffix, View::Rate),
            Namespace::new(&["stats", "gauges"], Kind::Gauge, &[], &suffix, View::Last),
            Namespace::new(
                &["stats", "sets"],
                Kind::Set,
                &["count"],
                &suffix,
                View::Count,
            ),
        ]
    } else {
        let prefix = config.graphite_etsy_global_prefix.as_str();
        let counters = [prefix, config.graphite_etsy_prefix_counter.as_str()];
        vec![
            Namespace::new(&counters, Kind::Counter, &["count"], &suffix, View::Count),
            Namespace::new(&counters, Kind::Counter, &["rate"], &suffix, View::Rate),
            Namespace::new(
                &[prefix, config.graphite_etsy_prefix_gauge.as_str()],
                Kind::Gauge,
                &[],
                &suffix,
                View::Last,
            ),
            Namespace::new(
                &[prefix, config.graphite_etsy_prefix_set.as_str()],
                Kind::Set,
                &["count"],
                &suffix,
                View::Count,
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
            .filter_map(|n| Some((n.kind.clone(), n.view, n.name_of(path)?)))
            .collect()
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
    fn a_glob_is_planned_per_namespace() {
        let legacy = config(true, "");
        let sets = namespaces(&legacy)
            .into_iter()
            .find(|n| n.kind == Kind::Set)
            .unwrap();
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
                    matched: 0
                },
                Plan::Names {
                    pattern: "a".into(),
                    matched: 1
                }
            ]
        );
        assert_eq!(
            sets.plan(&parts("stats.sets.a.rate")).unwrap(),
            [Plan::Names {
                pattern: "a.rate".into(),
                matched: 0
            }]
        );
        assert_eq!(sets.path("a.b", 1), "stats.sets.a.b.count");
    }

    #[test]
    fn idle_slices_read_as_etsy_flushes_them() {
        let mut counts = vec![None, Some(6.0), None];
        View::Count.apply(&mut counts, 60);
        assert_eq!(counts, [Some(0.0), Some(6.0), Some(0.0)]);
        let mut rates = vec![Some(6.0), None];
        View::Rate.apply(&mut rates, 60);
        assert_eq!(rates, [Some(0.1), Some(0.0)]);
        let mut gauges = vec![None, Some(3.0), None, Some(-1.0), None];
        View::Last.apply(&mut gauges, 10);
        assert_eq!(gauges, [None, Some(3.0), Some(3.0), Some(-1.0), Some(-1.0)]);
    }
}
