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
use std::sync::{Arc, LazyLock};

use regex::Regex;
use serde::Deserialize;

use crate::aggregate::PageOptions;
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
    timer_type: Option<ObserverType>,
    #[serde(default)]
    ttl: Option<yaml_serde::Value>,
    #[serde(default)]
    summary_options: Option<SummaryYaml>,
    #[serde(default)]
    histogram_options: Option<HistogramYaml>,
    #[serde(default)]
    buckets: Option<Vec<f64>>,
    #[serde(default)]
    quantiles: Option<Vec<Objective>>,
}

/// `summary_options`: the quantiles (each with the error statsd_exporter's stream allows),
/// the time they cover (a Go duration) and in how many age buckets; `buf_cap` sizes
/// client_golang's buffer, which the agent's sketch has not.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct SummaryYaml {
    #[serde(default)]
    quantiles: Option<Vec<Objective>>,
    #[serde(default)]
    max_age: Option<yaml_serde::Value>,
    #[serde(default)]
    age_buckets: Option<u32>,
    #[serde(default)]
    buf_cap: Option<u32>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Objective {
    quantile: f64,
    /// Read, not used: the agent's sketch has its own relative accuracy.
    #[serde(default, rename = "error")]
    _error: f64,
}

/// `histogram_options`: the buckets; the native histogram's keys shape only statsd_exporter's
/// protobuf page.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct HistogramYaml {
    #[serde(default)]
    buckets: Option<Vec<f64>>,
    #[serde(default)]
    native_histogram_bucket_factor: Option<f64>,
    #[serde(default)]
    native_histogram_max_buckets: Option<u32>,
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
    help: Option<String>,
    #[serde(default)]
    ttl: Option<yaml_serde::Value>,
    #[serde(default)]
    scale: Option<f64>,
    #[serde(default)]
    buckets: Option<Vec<f64>>,
    #[serde(default)]
    quantiles: Option<Vec<Objective>>,
    #[serde(default)]
    summary_options: Option<SummaryYaml>,
    #[serde(default)]
    histogram_options: Option<HistogramYaml>,
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
    /// Keys read and accepted that shape only statsd_exporter's own output, not the agent's.
    pub ignored_keys: Vec<&'static str>,
    /// How series show on the Prometheus page (`prometheus_app_metrics`): by default, and for
    /// each rule whose options differ from the default's.
    pub page_default: Arc<PageOptions>,
    page: Vec<Option<Arc<PageOptions>>>,
}

/// statsd_exporter's default histogram buckets (client_golang's `DefBuckets`), in seconds.
pub const DEFAULT_BUCKETS: [f64; 11] = [
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// The page options of the file's `defaults`, as statsd_exporter fills them in: a summary of
/// its three quantiles over ten minutes unless said otherwise, never expired.
fn default_options(d: &Defaults) -> Result<PageOptions, String> {
    let mut options = PageOptions {
        ttl_secs: duration_secs(d.ttl.as_ref(), "ttl")?,
        ..PageOptions::default()
    };
    summary_over(
        &mut options,
        d.summary_options.as_ref(),
        d.quantiles.as_ref(),
    )?;
    if d.observer_type.or(d.timer_type) == Some(ObserverType::Histogram) {
        let buckets = d
            .histogram_options
            .as_ref()
            .and_then(|h| h.buckets.as_ref());
        let buckets = bounds(buckets.or(d.buckets.as_ref()));
        options.histogram = Some(buckets.unwrap_or_else(|| DEFAULT_BUCKETS.to_vec()));
    }
    Ok(options)
}

/// A rule's page options, its own keys over the defaults' as statsd_exporter merges them.
fn rule_options(rule: &Rule, defaults: &Defaults, d: &PageOptions) -> Result<PageOptions, String> {
    if rule.scale.is_some_and(|s| !s.is_finite()) {
        return Err("scale is not a finite number".into());
    }
    let mut options = PageOptions {
        help: rule.help.clone().filter(|h| !h.is_empty()),
        scale: rule.scale,
        ..d.clone()
    };
    let ttl = duration_secs(rule.ttl.as_ref(), "ttl")?;
    if ttl > 0 {
        options.ttl_secs = ttl;
    }
    let summary = rule.summary_options.as_ref();
    let own_quantiles = summary.and_then(|s| s.quantiles.as_ref());
    let own_buckets = rule
        .histogram_options
        .as_ref()
        .and_then(|h| h.buckets.as_ref());
    if own_quantiles.is_some() && rule.quantiles.is_some() {
        return Err("quantiles both at the top level and in summary_options".into());
    }
    if own_buckets.is_some() && rule.buckets.is_some() {
        return Err("buckets both at the top level and in histogram_options".into());
    }
    let kind = rule.observer_type.or(rule.timer_type);
    let histogram = match kind.or(defaults.observer_type.or(defaults.timer_type)) {
        Some(ObserverType::Histogram) if summary.is_some() => {
            return Err("a histogram observer with summary_options".into());
        }
        Some(ObserverType::Summary) if rule.histogram_options.is_some() => {
            return Err("a summary observer with histogram_options".into());
        }
        Some(ObserverType::Histogram) => true,
        // Buckets alone make a histogram where the defaults' observer is one.
        _ => false,
    };
    options.histogram = if histogram {
        // The defaults' buckets, given with or without a default histogram observer.
        let fallback = defaults.histogram_options.as_ref();
        let fallback = fallback.and_then(|h| h.buckets.as_ref());
        let fallback = bounds(fallback.or(defaults.buckets.as_ref()));
        let fallback = fallback.unwrap_or_else(|| DEFAULT_BUCKETS.to_vec());
        Some(bounds(own_buckets.or(rule.buckets.as_ref())).unwrap_or(fallback))
    } else {
        None
    };
    summary_over(&mut options, summary, rule.quantiles.as_ref())?;
    Ok(options)
}

/// `summary_options` (and the deprecated top-level `quantiles`) over `options`: each key given
/// and not 0 replaces the one there.
fn summary_over(
    options: &mut PageOptions,
    summary: Option<&SummaryYaml>,
    legacy_quantiles: Option<&Vec<Objective>>,
) -> Result<(), String> {
    let own = summary.and_then(|s| s.quantiles.as_ref());
    if let Some(q) = own.or(legacy_quantiles) {
        options.quantiles = quantiles(q)?;
    }
    let max_age = summary.and_then(|s| s.max_age.as_ref());
    let max_age = duration_secs(max_age, "summary_options.max_age")?;
    if max_age > 0 {
        options.max_age_secs = max_age;
    }
    if let Some(n) = summary.and_then(|s| s.age_buckets).filter(|n| *n > 0) {
        // Each summary series keeps a sketch per age bucket: a count meant for a buffer of
        // client_golang's would make every series that many sketches.
        if n > MAX_AGE_BUCKETS {
            return Err(format!(
                "summary_options.age_buckets: {n} is more than {MAX_AGE_BUCKETS} (each summary keeps a quantile sketch per age bucket)"
            ));
        }
        options.age_buckets = n.into();
    }
    Ok(())
}

/// The most age buckets a summary may have; client_golang's default is 5.
const MAX_AGE_BUCKETS: u32 = 1000;

/// Histogram bounds in order, once each, `+Inf` left to the page (as client_golang takes them);
/// `None` for no list or an empty one (statsd_exporter's default buckets).
fn bounds(buckets: Option<&Vec<f64>>) -> Option<Vec<f64>> {
    let mut b: Vec<f64> = buckets?.iter().copied().filter(|x| x.is_finite()).collect();
    b.sort_by(f64::total_cmp);
    b.dedup();
    (!b.is_empty()).then_some(b)
}

/// Quantiles ascending, once each; each within 0 and 1.
fn quantiles(objectives: &[Objective]) -> Result<Vec<f64>, String> {
    let mut q: Vec<f64> = objectives.iter().map(|o| o.quantile).collect();
    if let Some(bad) = q.iter().find(|q| !(0.0..=1.0).contains(*q)) {
        return Err(format!("the quantile {bad} is not between 0 and 1"));
    }
    q.sort_by(f64::total_cmp);
    q.dedup();
    Ok(q)
}

/// A Go duration (`90s`, `1m30s`, `1.5h`, `500ms`; a bare integer is nanoseconds, as Go's
/// YAML reads it) in whole seconds, rounded up; 0 for none.
fn duration_secs(value: Option<&yaml_serde::Value>, key: &str) -> Result<u64, String> {
    let bad = || format!("{key}: not a duration such as 90s, 10m or 1h30m");
    let nanos = match value {
        None => 0.0,
        Some(v) if v.is_null() => 0.0,
        Some(v) => match (v.as_u64(), v.as_str()) {
            (Some(n), _) => n as f64,
            (None, Some(text)) => go_duration_nanos(text).ok_or_else(bad)?,
            _ => return Err(bad()),
        },
    };
    Ok((nanos / 1e9).ceil() as u64)
}

/// Go's `time.ParseDuration`, in nanoseconds; `None` for text it refuses or a negative one.
fn go_duration_nanos(text: &str) -> Option<f64> {
    if text == "0" {
        return Some(0.0);
    }
    let mut rest = text.strip_prefix('+').unwrap_or(text);
    if rest.is_empty() {
        return None;
    }
    let mut total = 0.0;
    while !rest.is_empty() {
        let number = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let value: f64 = rest[..number].parse().ok()?;
        rest = &rest[number..];
        let unit = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale = match &rest[..unit] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        rest = &rest[unit..];
        total += value * scale;
    }
    Some(total)
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
        /// The rule's place in the file, for [`Mapper::page_options`].
        rule: usize,
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
        mapper.page_default = Arc::new(default_options(d).map_err(|e| format!("defaults: {e}"))?);
        mapper.note_options_ignored(d.summary_options.as_ref(), d.histogram_options.as_ref());
        let default_match = d.match_type.unwrap_or(MatchType::Glob);
        for (i, rule) in file.mappings.iter().enumerate() {
            // One line: the regex crate's errors point at the pattern on lines of their own.
            let at = |message: String| {
                let message = message.split_whitespace().collect::<Vec<_>>().join(" ");
                format!("rule {} (match {:?}): {message}", i + 1, rule.pattern)
            };
            mapper.take_rule(rule, d, default_match).map_err(at)?;
        }
        if !mapper.regexes.is_empty() {
            let patterns = mapper.regexes.iter().map(|(r, _)| r.as_str());
            mapper.regex_set = Some(regex::RegexSet::new(patterns).map_err(|e| e.to_string())?);
        }
        Ok(mapper)
    }

    /// Notes the keys of statsd_exporter's options that shape only its own output.
    fn note_options_ignored(
        &mut self,
        summary: Option<&SummaryYaml>,
        histogram: Option<&HistogramYaml>,
    ) {
        for (present, key) in [
            (
                summary.is_some_and(|s| s.buf_cap.is_some()),
                "summary_options.buf_cap",
            ),
            (
                histogram.is_some_and(|h| {
                    h.native_histogram_bucket_factor.is_some()
                        || h.native_histogram_max_buckets.is_some()
                }),
                "histogram_options.native_histogram_*",
            ),
        ] {
            if present && !self.ignored_keys.contains(&key) {
                self.ignored_keys.push(key);
            }
        }
    }

    fn take_rule(
        &mut self,
        rule: &Rule,
        defaults: &Defaults,
        default_match: MatchType,
    ) -> Result<(), String> {
        self.note_options_ignored(
            rule.summary_options.as_ref(),
            rule.histogram_options.as_ref(),
        );
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
        let options = rule_options(rule, defaults, &self.page_default)?;
        self.page
            .push((options != *self.page_default).then(|| Arc::new(options)));
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

    /// The page options of the series rule `rule` names, when they are not the defaults'.
    pub fn page_options(&self, rule: usize) -> Option<&Arc<PageOptions>> {
        self.page.get(rule)?.as_ref()
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
            let expand = |t: &Template| match t {
                Template::Glob(pieces) => Template::glob_expand(pieces, &captures),
                Template::Regex(_) => String::new(),
            };
            return self.mapped(index, expand);
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
                return self.mapped(*index, expand);
            }
        }
        Mapped::Unmatched
    }

    fn mapped(&self, rule: usize, expand: impl Fn(&Template) -> String) -> Mapped {
        let output = &self.outputs[rule];
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
            rule,
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

    fn to(rule: usize, name: &str, labels: &[(&str, &str)]) -> Mapped {
        Mapped::To {
            name: name.into(),
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
            honor_labels: false,
            rule,
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
                0,
                "dispatch_events",
                &[
                    ("action", "send"),
                    ("job", "test"),
                    ("outcome", "ok"),
                    ("processor", "Foo")
                ]
            )
        );
        assert_eq!(m.map("web.signup.x", c), to(2, "signup_web", &[]));
        assert_eq!(m.map("web.signup.x", MetricType::Gauge), Mapped::Unmatched);
        assert_eq!(m.map("a.b--c", c), to(3, "request_total", &[("job", "a")]));
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
    fn rules_options_are_their_own_over_the_defaults() {
        let m = Mapper::from_yaml(
            "defaults:\n  ttl: 1m\n  summary_options:\n    quantiles:\n    - quantile: 0.99\n      error: 0.001\n    - quantile: 0.5\n      error: 0.05\n    max_age: 5m\n    age_buckets: 3\n    buf_cap: 10\nmappings:\n\
             - match: api.*.latency\n  name: api_seconds\n  help: Latency.\n  observer_type: histogram\n  histogram_options:\n    buckets: [1, 0.1]\n\
             - match: db.*\n  name: db_seconds\n  observer_type: histogram\n\
             - match: q.*\n  name: q_seconds\n  timer_type: histogram\n  buckets: [1, .inf, 0.5, 1]\n\
             - match: s.*\n  name: s_bytes\n  quantiles:\n  - quantile: 0.9\n  ttl: 1500ms\n  scale: 1024\n\
             - match: plain.*\n  name: plain\n",
        )
        .unwrap();
        let d = PageOptions {
            quantiles: vec![0.5, 0.99],
            max_age_secs: 300,
            age_buckets: 3,
            ttl_secs: 60,
            ..PageOptions::default()
        };
        assert_eq!(*m.page_default, d);
        let histogram = |b: &[f64]| Some(b.to_vec());
        let api = m.page_options(0).unwrap();
        assert_eq!(api.histogram, histogram(&[0.1, 1.0]));
        assert_eq!((api.help.as_deref(), api.ttl_secs), (Some("Latency."), 60));
        assert_eq!(
            m.page_options(1).unwrap().histogram,
            histogram(&DEFAULT_BUCKETS)
        );
        assert_eq!(m.page_options(2).unwrap().histogram, histogram(&[0.5, 1.0]));
        let s = m.page_options(3).unwrap();
        assert_eq!((s.histogram.as_ref(), &s.quantiles[..]), (None, &[0.9][..]));
        assert_eq!(
            (s.ttl_secs, s.scale, s.max_age_secs),
            (2, Some(1024.0), 300)
        );
        assert_eq!(m.page_options(4), None, "the defaults' own");
        assert_eq!(m.ignored_keys, ["summary_options.buf_cap"]);
        let buckets = Mapper::from_yaml(
            "defaults:\n  histogram_options:\n    buckets: [1, 10]\nmappings:\n- match: a.*\n  name: a\n  observer_type: histogram\n",
        )
        .unwrap();
        assert_eq!(buckets.page_default.histogram, None, "a summary by default");
        assert_eq!(
            buckets.page_options(0).unwrap().histogram,
            histogram(&[1.0, 10.0])
        );
        for (yaml, histogram) in [
            (
                "defaults:\n  observer_type: histogram\n",
                DEFAULT_BUCKETS.to_vec(),
            ),
            (
                "defaults:\n  observer_type: histogram\n  histogram_options:\n    buckets: []\n",
                DEFAULT_BUCKETS.to_vec(),
            ),
            (
                "defaults:\n  timer_type: histogram\n  buckets: [5]\n",
                vec![5.0],
            ),
        ] {
            let m = Mapper::from_yaml(yaml).unwrap();
            assert_eq!(m.page_default.histogram, Some(histogram), "{yaml}");
        }
    }

    #[test]
    fn options_statsd_exporter_refuses_are_refused() {
        for (yaml, said) in [
            (
                "mappings:\n- match: a.*\n  name: x\n  observer_type: histogram\n  summary_options:\n    max_age: 1m\n",
                "a histogram observer with summary_options",
            ),
            (
                "mappings:\n- match: a.*\n  name: x\n  observer_type: summary\n  histogram_options:\n    buckets: [1]\n",
                "a summary observer with histogram_options",
            ),
            (
                "mappings:\n- match: a.*\n  name: x\n  quantiles:\n  - quantile: 0.5\n  summary_options:\n    quantiles:\n    - quantile: 0.9\n",
                "quantiles both",
            ),
            (
                "mappings:\n- match: a.*\n  name: x\n  ttl: 10 minutes\n",
                "rule 1 (match \"a.*\"): ttl: not a duration",
            ),
            (
                "defaults:\n  summary_options:\n    quantiles:\n    - quantile: 1.5\n",
                "defaults: the quantile 1.5",
            ),
            (
                "mappings:\n- match: a.*\n  name: x\n  histogram_options:\n    buckets: [a]\n",
                "buckets",
            ),
            (
                "mappings:\n- match: a.*\n  name: x\n  scale: .nan\n",
                "scale is not a finite number",
            ),
            (
                "defaults:\n  summary_options:\n    age_buckets: 4294967295\n",
                "defaults: summary_options.age_buckets: 4294967295 is more than 1000",
            ),
        ] {
            let e = Mapper::from_yaml(yaml).unwrap_err();
            assert!(e.contains(said), "{yaml}: {e}");
        }
    }

    #[test]
    fn go_durations_as_go_reads_them() {
        for (text, nanos) in [
            ("0", Some(0.0)),
            ("90s", Some(90e9)),
            ("1m30s", Some(90e9)),
            ("1.5h", Some(5400e9)),
            ("500ms", Some(5e8)),
            ("2us", Some(2e3)),
            ("10", None),
            ("-1s", None),
            ("", None),
            ("1d", None),
        ] {
            assert_eq!(go_duration_nanos(text), nanos, "{text:?}");
        }
    }
}
