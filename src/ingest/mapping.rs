//! statsd_exporter's mapping files (`mapping_file`): rules that turn a dotted StatsD name into a
//! name and labels, or drop it, read from the YAML a team already has
//! (docs/operations.md, "Mapping"). The mapped series is `name;label=value;…`, the line's own
//! tags kept beside the labels.
//!
//! As statsd_exporter matches: glob rules first, each `*` one whole dot-separated component,
//! the first rule in the file winning (with `glob_disable_ordering`, the first found preferring
//! literal components); then regex rules, in order, unanchored. The glob rules are one trie of
//! components, walked once per name, and the regex rules one set, matched in one pass: a
//! thousand rules cost a lookup about what one costs (`cargo bench --bench pipeline -- mapping`).

use std::collections::HashMap;
use std::sync::LazyLock;

use regex::Regex;
use serde::Deserialize;

use crate::protocol::MetricType;

/// statsd_exporter's grammar of a glob `match`, a mapped `name` and a label key.
static GLOB: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^(\*|[a-zA-Z_][a-zA-Z0-9_\-]*)(\.\*|\.[a-zA-Z0-9_][a-zA-Z0-9_\-]*)*$")
        .expect("a valid pattern")
});
static NAME: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^([a-zA-Z_]|\$\{?\d+\}?)([a-zA-Z0-9_]|\$\{?\d+\}?)*$").expect("a valid pattern")
});
static LABEL: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"^[a-zA-Z_][a-zA-Z0-9_]+$").expect("a valid pattern"));
/// A capture reference in a glob rule's template: `$1`, `${1}` (anything else after `$` is
/// replaced by nothing, as statsd_exporter does).
static REFERENCE: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"\$\{?([a-zA-Z0-9_$]+)\}?").expect("a valid pattern"));

/// The file, as statsd_exporter reads it (unknown keys refused).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    #[serde(default)]
    defaults: Defaults,
    #[serde(default)]
    mappings: Vec<Rule>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Defaults {
    #[serde(default)]
    match_type: Option<MatchType>,
    #[serde(default)]
    glob_disable_ordering: bool,
    #[serde(default)]
    observer_type: Option<ObserverType>,
    #[serde(default)]
    ttl: Option<yaml_serde::Value>,
    #[serde(default)]
    summary_options: Option<yaml_serde::Value>,
    #[serde(default)]
    histogram_options: Option<yaml_serde::Value>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Rule {
    #[serde(rename = "match")]
    pattern: String,
    #[serde(default)]
    name: String,
    #[serde(default)]
    labels: Option<std::collections::BTreeMap<String, String>>,
    #[serde(default)]
    match_type: Option<MatchType>,
    #[serde(default)]
    match_metric_type: Option<RuleType>,
    #[serde(default)]
    action: Option<Action>,
    #[serde(default)]
    honor_labels: bool,
    #[serde(default)]
    observer_type: Option<ObserverType>,
    #[serde(default)]
    timer_type: Option<ObserverType>,
    #[serde(default)]
    help: Option<yaml_serde::Value>,
    #[serde(default)]
    ttl: Option<yaml_serde::Value>,
    #[serde(default)]
    scale: Option<yaml_serde::Value>,
    #[serde(default)]
    buckets: Option<yaml_serde::Value>,
    #[serde(default)]
    quantiles: Option<yaml_serde::Value>,
    #[serde(default)]
    summary_options: Option<yaml_serde::Value>,
    #[serde(default)]
    histogram_options: Option<yaml_serde::Value>,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum MatchType {
    Glob,
    Regex,
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum ObserverType {
    Histogram,
    Summary,
}

/// statsd_exporter's `match_metric_type`: `observer` is timers, histograms and distributions.
#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum RuleType {
    Counter,
    Gauge,
    Observer,
}

impl RuleType {
    fn takes(self, kind: MetricType) -> bool {
        match self {
            RuleType::Counter => kind == MetricType::Counter,
            RuleType::Gauge => kind == MetricType::Gauge,
            RuleType::Observer => matches!(
                kind,
                MetricType::Timer | MetricType::Histogram | MetricType::Distribution
            ),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Deserialize)]
#[serde(rename_all = "lowercase")]
enum Action {
    Map,
    Drop,
}

/// A compiled rule's output: its name and label templates, its type filter and action.
#[derive(Debug)]
struct Output {
    name: Template,
    labels: Vec<(String, Template)>,
    kind: Option<RuleType>,
    drop: bool,
    honor_labels: bool,
}

/// A name or label value with capture references: literal parts and capture numbers (from 1).
#[derive(Debug)]
enum Template {
    /// A glob rule's: pieces of literal text and captures.
    Glob(Vec<Piece>),
    /// A regex rule's: expanded by the regex (`$1`, `${1}`, `$name`).
    Regex(String),
}

#[derive(Debug)]
enum Piece {
    Text(String),
    Capture(usize),
}

impl Template {
    /// A glob rule's template; references past `captures` (or not numbers) are left out.
    fn glob(text: &str, captures: usize) -> Template {
        let mut pieces = Vec::new();
        let mut last = 0;
        for m in REFERENCE.captures_iter(text) {
            let whole = m.get(0).expect("a match");
            pieces.push(Piece::Text(text[last..whole.start()].to_string()));
            if let Ok(n) = m[1].parse::<usize>()
                && (1..=captures).contains(&n)
            {
                pieces.push(Piece::Capture(n));
            }
            last = whole.end();
        }
        pieces.push(Piece::Text(text[last..].to_string()));
        Template::Glob(pieces)
    }

    fn glob_expand(pieces: &[Piece], captures: &[&str]) -> String {
        let mut out = String::new();
        for piece in pieces {
            match piece {
                Piece::Text(t) => out.push_str(t),
                Piece::Capture(n) => out.push_str(captures.get(n - 1).copied().unwrap_or("")),
            }
        }
        out
    }
}

/// One node of the glob trie: the rules that end here, and the next component's nodes.
#[derive(Debug, Default)]
struct Node {
    literal: HashMap<String, usize>,
    star: Option<usize>,
    ends: Vec<usize>,
}

/// The mapping rules, compiled.
#[derive(Debug, Default)]
pub struct Mapper {
    outputs: Vec<Output>,
    nodes: Vec<Node>,
    unordered: bool,
    /// The regex rules: each compiled for its captures, all in one set that finds in one pass
    /// which of them match.
    regexes: Vec<(Regex, usize)>,
    regex_set: Option<regex::RegexSet>,
    /// Keys read and accepted that only shape statsd_exporter's Prometheus output.
    pub ignored_keys: Vec<&'static str>,
    /// What observes timers, histograms and distributions on the Prometheus page
    /// (`prometheus_app_metrics`).
    pub observers: Observers,
}

/// statsd_exporter's default histogram buckets (client_golang's `DefBuckets`), in seconds.
pub const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// How a mapped name's observations show on the Prometheus page: a summary (`None`, the
/// default, as statsd_exporter's) or a histogram of these upper bounds.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Observer {
    pub histogram: Option<Vec<f64>>,
}

/// The rules' observers by the names they make. The page is fed from closed windows, which
/// know a series by its mapped name only, so a rule is found again by its `name` template (a
/// capture matching anything); the first rule whose template matches wins, else the defaults.
#[derive(Debug, Default)]
pub struct Observers {
    rules: Vec<(Regex, Observer)>,
    default: Observer,
}

impl Observers {
    /// The observer of series named `name` (a mapped name, before escaping).
    pub fn of(&self, name: &str) -> &Observer {
        self.rules
            .iter()
            .find(|(r, _)| r.is_match(name))
            .map_or(&self.default, |(_, o)| o)
    }
}

/// An observer from a rule's (or the defaults') `observer_type` and buckets.
fn observer(
    kind: Option<ObserverType>,
    buckets: Option<&yaml_serde::Value>,
    fallback: &Observer,
) -> Result<Observer, String> {
    // An empty list is statsd_exporter's default buckets, as a missing one is.
    let buckets = match buckets {
        None => None,
        Some(v) => Some(
            v.as_sequence()
                .and_then(|s| {
                    s.iter()
                        .map(yaml_serde::Value::as_f64)
                        .collect::<Option<Vec<f64>>>()
                })
                .ok_or("histogram_options.buckets is not a list of numbers")?,
        )
        .map(|mut b| {
            // Bounds in order, once each, `+Inf` left to the page (as client_golang takes them).
            b.retain(|x| x.is_finite());
            b.sort_by(f64::total_cmp);
            b.dedup();
            b
        })
        .filter(|b| !b.is_empty()),
    };
    Ok(match kind {
        Some(ObserverType::Summary) => Observer::default(),
        Some(ObserverType::Histogram) => Observer {
            histogram: Some(buckets.unwrap_or_else(|| {
                fallback
                    .histogram
                    .clone()
                    .unwrap_or_else(|| DEFAULT_BUCKETS.to_vec())
            })),
        },
        None => match (&fallback.histogram, buckets) {
            (Some(_), Some(b)) => Observer { histogram: Some(b) },
            _ => fallback.clone(),
        },
    })
}

/// `histogram_options.buckets` of an options mapping.
fn buckets_of(options: &Option<yaml_serde::Value>) -> Option<&yaml_serde::Value> {
    options.as_ref().and_then(|o| o.get("buckets"))
}

/// A rule's `name` template as a pattern over the names it makes: its captures match anything.
fn name_pattern(template: &str) -> Result<Regex, String> {
    let mut pattern = String::from("^");
    let mut last = 0;
    for m in REFERENCE.find_iter(template) {
        pattern.push_str(&regex::escape(&template[last..m.start()]));
        pattern.push_str(".*");
        last = m.end();
    }
    pattern.push_str(&regex::escape(&template[last..]));
    pattern.push('$');
    Regex::new(&pattern).map_err(|e| e.to_string())
}

/// What the rules make of a metric.
#[derive(Debug, PartialEq)]
pub enum Mapped {
    /// No rule matches: the name stays.
    Unmatched,
    /// A `drop` rule matches.
    Drop,
    /// The new name, its labels (those of empty value left out, as Prometheus leaves them), and
    /// whether the line's own tags win over labels of the same key (`honor_labels`).
    To {
        name: String,
        labels: Vec<(String, String)>,
        honor_labels: bool,
    },
}

impl Mapper {
    /// Reads a mapping file's text. An error names the rule (its place and `match`) or the
    /// YAML's line.
    pub fn from_yaml(text: &str) -> Result<Mapper, String> {
        let file: File = if text.trim().is_empty() {
            File::default()
        } else {
            yaml_serde::from_str(text).map_err(|e| {
                let message = e.to_string();
                message.split_whitespace().collect::<Vec<_>>().join(" ")
            })?
        };
        let mut mapper = Mapper {
            nodes: vec![Node::default()],
            unordered: file.defaults.glob_disable_ordering,
            ..Mapper::default()
        };
        let d = &file.defaults;
        mapper.note_ignored(d.ttl.is_some(), "ttl");
        mapper.note_ignored(d.summary_options.is_some(), "summary_options");
        mapper.observers.default = observer(
            d.observer_type,
            buckets_of(&d.histogram_options),
            &Observer::default(),
        )
        .map_err(|e| format!("defaults: {e}"))?;
        let default_match = d.match_type.unwrap_or(MatchType::Glob);
        for (i, rule) in file.mappings.iter().enumerate() {
            // One line: the regex crate's errors point at the pattern on lines of their own.
            let at = |message: String| {
                let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
                format!("rule {} (match {:?}): {message}", i + 1, rule.pattern)
            };
            mapper.take_rule(rule, default_match).map_err(at)?;
        }
        if !mapper.regexes.is_empty() {
            let patterns = mapper.regexes.iter().map(|(r, _)| r.as_str());
            mapper.regex_set = Some(regex::RegexSet::new(patterns).map_err(|e| e.to_string())?);
        }
        Ok(mapper)
    }

    fn note_ignored(&mut self, present: bool, key: &'static str) {
        if present && !self.ignored_keys.contains(&key) {
            self.ignored_keys.push(key);
        }
    }

    fn take_rule(&mut self, rule: &Rule, default_match: MatchType) -> Result<(), String> {
        for (present, key) in [
            (rule.help.is_some(), "help"),
            (rule.ttl.is_some(), "ttl"),
            (rule.scale.is_some(), "scale"),
            (rule.quantiles.is_some(), "quantiles"),
            (rule.summary_options.is_some(), "summary_options"),
        ] {
            self.note_ignored(present, key);
        }
        if rule.name.is_empty() {
            return Err("no name".into());
        }
        if !NAME.is_match(&rule.name) {
            return Err(format!(
                "the name {:?} is not a metric name (letters, digits, _ and $n)",
                rule.name
            ));
        }
        let labels = rule.labels.clone().unwrap_or_default();
        if let Some(bad) = labels.keys().find(|k| !LABEL.is_match(k)) {
            return Err(format!("the label key {bad:?} is not a label name"));
        }
        let kind = rule.observer_type.or(rule.timer_type);
        let buckets = buckets_of(&rule.histogram_options).or(rule.buckets.as_ref());
        if kind.is_some() || buckets.is_some() {
            let observer = observer(kind, buckets, &self.observers.default)?;
            self.observers
                .rules
                .push((name_pattern(&rule.name)?, observer));
        }
        let index = self.outputs.len();
        let glob = rule.match_type.unwrap_or(default_match) == MatchType::Glob;
        let (name, labels) = if glob {
            if !GLOB.is_match(&rule.pattern) {
                return Err("not a glob of dot-separated names and `*`s".into());
            }
            let captures = rule.pattern.split('.').filter(|c| *c == "*").count();
            self.add_glob(&rule.pattern, index);
            (
                Template::glob(&rule.name, captures),
                labels
                    .into_iter()
                    .map(|(k, v)| (k, Template::glob(&v, captures)))
                    .collect(),
            )
        } else {
            let regex = Regex::new(&rule.pattern).map_err(|e| e.to_string())?;
            self.regexes.push((regex, index));
            (
                Template::Regex(rule.name.clone()),
                labels
                    .into_iter()
                    .map(|(k, v)| (k, Template::Regex(v)))
                    .collect(),
            )
        };
        self.outputs.push(Output {
            name,
            labels,
            kind: rule.match_metric_type,
            drop: rule.action == Some(Action::Drop),
            honor_labels: rule.honor_labels,
        });
        Ok(())
    }

    fn add_glob(&mut self, pattern: &str, index: usize) {
        let mut at = 0;
        for component in pattern.split('.') {
            let next = if component == "*" {
                self.nodes[at].star
            } else {
                self.nodes[at].literal.get(component).copied()
            };
            at = match next {
                Some(next) => next,
                None => {
                    self.nodes.push(Node::default());
                    let new = self.nodes.len() - 1;
                    if component == "*" {
                        self.nodes[at].star = Some(new);
                    } else {
                        self.nodes[at].literal.insert(component.to_string(), new);
                    }
                    new
                }
            };
        }
        self.nodes[at].ends.push(index);
    }

    pub fn is_empty(&self) -> bool {
        self.outputs.is_empty()
    }

    /// What the rules make of metric `name` of type `kind`.
    pub fn map(&self, name: &str, kind: MetricType) -> Mapped {
        if self.is_empty() {
            return Mapped::Unmatched;
        }
        let mut best: Option<(usize, Vec<&str>)> = None;
        if self.nodes.len() > 1 {
            let components: Vec<&str> = name.split('.').collect();
            self.walk(0, &components, kind, &mut Vec::new(), &mut best);
        }
        if let Some((index, captures)) = best {
            let output = &self.outputs[index];
            let expand = |t: &Template| match t {
                Template::Glob(pieces) => Template::glob_expand(pieces, &captures),
                Template::Regex(_) => String::new(),
            };
            return self.mapped(output, expand);
        }
        let matching = match &self.regex_set {
            Some(set) => set.matches(name),
            None => return Mapped::Unmatched,
        };
        for (regex, index) in matching.iter().map(|i| &self.regexes[i]) {
            let output = &self.outputs[*index];
            if output.kind.is_some_and(|k| !k.takes(kind)) {
                continue;
            }
            if let Some(captures) = regex.captures(name) {
                let expand = |t: &Template| match t {
                    Template::Regex(template) => {
                        let mut out = String::new();
                        captures.expand(template, &mut out);
                        out
                    }
                    Template::Glob(_) => String::new(),
                };
                return self.mapped(output, expand);
            }
        }
        Mapped::Unmatched
    }

    fn mapped(&self, output: &Output, expand: impl Fn(&Template) -> String) -> Mapped {
        if output.drop {
            return Mapped::Drop;
        }
        let labels = output
            .labels
            .iter()
            .map(|(k, t)| (k.clone(), expand(t)))
            .filter(|(_, v)| !v.is_empty())
            .collect();
        Mapped::To {
            name: expand(&output.name),
            labels,
            honor_labels: output.honor_labels,
        }
    }

    /// Depth first from `node` over the components left, literal before `*`: with ordering,
    /// keeps the earliest rule that matches; without, stops at the first found.
    fn walk<'n>(
        &self,
        node: usize,
        components: &[&'n str],
        kind: MetricType,
        stars: &mut Vec<&'n str>,
        best: &mut Option<(usize, Vec<&'n str>)>,
    ) {
        let Some((first, rest)) = components.split_first() else {
            let ends = self.nodes[node].ends.iter().copied();
            let taken = ends
                .filter(|&i| self.outputs[i].kind.is_none_or(|k| k.takes(kind)))
                .min();
            if let Some(index) = taken
                && best.as_ref().is_none_or(|(b, _)| index < *b)
            {
                *best = Some((index, stars.clone()));
            }
            return;
        };
        if let Some(&next) = self.nodes[node].literal.get(*first) {
            self.walk(next, rest, kind, stars, best);
        }
        if self.unordered && best.is_some() {
            return;
        }
        if let Some(next) = self.nodes[node].star {
            stars.push(first);
            self.walk(next, rest, kind, stars, best);
            stars.pop();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn to(name: &str, labels: &[(&str, &str)]) -> Mapped {
        Mapped::To {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            honor_labels: false,
        }
    }

    #[test]
    fn globs_capture_components_and_the_first_rule_wins() {
        let m = Mapper::from_yaml(
            "mappings:\n\
             - match: test.dispatcher.*.*.*\n  name: dispatch_events\n  labels:\n    processor: $1\n    action: ${2}\n    outcome: \"$3\"\n    job: test\n\
             - match: test.*.*.*.*\n  name: other\n\
             - match: '*.signup.*'\n  name: signup_${1}\n  match_metric_type: counter\n\
             - match: (.*)\\.(.*)--(.*)\n  match_type: regex\n  name: request_total\n  labels:\n    job: $1\n\
             - match: drop.*\n  name: x\n  action: drop\n",
        )
        .unwrap();
        let c = MetricType::Counter;
        assert_eq!(
            m.map("test.dispatcher.Foo.send.ok", c),
            to(
                "dispatch_events",
                &[
                    ("action", "send"),
                    ("job", "test"),
                    ("outcome", "ok"),
                    ("processor", "Foo")
                ]
            )
        );
        assert_eq!(m.map("web.signup.x", c), to("signup_web", &[]));
        assert_eq!(m.map("web.signup.x", MetricType::Gauge), Mapped::Unmatched);
        assert_eq!(m.map("a.b--c", c), to("request_total", &[("job", "a")]));
        assert_eq!(m.map("drop.me", c), Mapped::Drop);
        assert_eq!(
            m.map("drop.me.too", c),
            Mapped::Unmatched,
            "one component a *"
        );
    }

    #[test]
    fn bad_rules_are_named() {
        for (yaml, said) in [
            (
                "mappings:\n- match: a.*\n  name: \"bad-name\"\n",
                "rule 1 (match \"a.*\")",
            ),
            (
                "mappings:\n- match: a.*\n  name: x\n- match: a.b*\n  name: y\n",
                "rule 2",
            ),
            (
                "mappings:\n- match: a.*\n  nmae: x\n",
                "unknown field `nmae`",
            ),
            (
                "mappings:\n- match: (\n  match_type: regex\n  name: x\n",
                "rule 1",
            ),
            (
                "mappings:\n- match: a\n  name: x\n  match_metric_type: set\n",
                "set",
            ),
        ] {
            let e = Mapper::from_yaml(yaml).unwrap_err();
            assert!(e.contains(said), "{yaml}: {e}");
        }
    }

    #[test]
    fn keys_for_prometheus_alone_are_accepted_and_named() {
        let m = Mapper::from_yaml(
            "defaults:\n  ttl: 1m\nmappings:\n- match: a.*\n  name: x\n  buckets: [1, 2]\n  scale: 0.001\n",
        )
        .unwrap();
        assert_eq!(m.ignored_keys, ["ttl", "scale"]);
    }

    #[test]
    fn observers_found_by_the_names_rules_make() {
        let m = Mapper::from_yaml(
            "defaults:\n  observer_type: summary\nmappings:\n\
             - match: api.*.latency\n  name: api_${1}_seconds\n  observer_type: histogram\n  histogram_options:\n    buckets: [0.1, 1]\n\
             - match: db.*\n  name: db_seconds\n  observer_type: histogram\n\
             - match: q.*\n  name: q_seconds\n  observer_type: histogram\n  buckets: [1, .inf, 0.5, 1]\n\
             - match: other.*\n  name: other\n",
        )
        .unwrap();
        let histogram = |b: &[f64]| Observer {
            histogram: Some(b.to_vec()),
        };
        assert_eq!(
            m.observers.of("api_checkout_seconds"),
            &histogram(&[0.1, 1.0])
        );
        assert_eq!(m.observers.of("db_seconds"), &histogram(&DEFAULT_BUCKETS));
        assert_eq!(m.observers.of("other"), &Observer::default());
        assert_eq!(
            m.observers.of("q_seconds"),
            &histogram(&[0.5, 1.0]),
            "sorted"
        );
        assert_eq!(
            m.observers.of("api_seconds_x"),
            &Observer::default(),
            "anchored"
        );
        let all = Mapper::from_yaml(
            "defaults:\n  observer_type: histogram\n  histogram_options:\n    buckets: [5]\n",
        )
        .unwrap();
        assert_eq!(all.observers.of("anything"), &histogram(&[5.0]));
        let empty =
            "defaults:\n  observer_type: histogram\n  histogram_options:\n    buckets: []\n";
        let empty = Mapper::from_yaml(empty).unwrap();
        assert_eq!(empty.observers.of("x"), &histogram(&DEFAULT_BUCKETS));
        let bad = "mappings:\n- match: a.*\n  name: x\n  histogram_options:\n    buckets: [a]\n";
        assert!(Mapper::from_yaml(bad).unwrap_err().contains("buckets"));
    }
}
