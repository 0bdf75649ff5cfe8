//! Carbon's `storage-aggregation.conf` (`storage_aggregation`) and `storage-schemas.conf`
//! (`storage_schemas`), read as carbon-cache 1.1 reads them: sections in file order, each a
//! `pattern` (a regular expression searched for anywhere in the path) and its settings; the
//! first section whose pattern matches a path decides. Aggregation: an `xFilesFactor` and an
//! `aggregationMethod`, a missing key taking whisper's default (0.5, `average`), a path no
//! section matches both defaults. Schemas: `retentions`, a path no section matches taking
//! carbon's own fallback, a minute's slices for a week (`60:10080`).

use std::path::Path;

use regex::Regex;

use crate::retention::Retention;

/// Whisper's aggregation methods (`whisper.aggregationMethods`), written into `points.lua`'s
/// arguments by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Average,
    Sum,
    Last,
    Max,
    Min,
    AvgZero,
    AbsMax,
    AbsMin,
}

impl Method {
    pub const ALL: [Method; 8] = [
        Method::Average,
        Method::Sum,
        Method::Last,
        Method::Max,
        Method::Min,
        Method::AvgZero,
        Method::AbsMax,
        Method::AbsMin,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Method::Average => "average",
            Method::Sum => "sum",
            Method::Last => "last",
            Method::Max => "max",
            Method::Min => "min",
            Method::AvgZero => "avg_zero",
            Method::AbsMax => "absmax",
            Method::AbsMin => "absmin",
        }
    }

    /// whisper.aggregate over `known` (not empty), in time order, of `total` slices: as
    /// points.lua computes it, the same operations in the same order.
    pub fn aggregate(self, known: &[f64], total: u64) -> f64 {
        let sum = || known.iter().fold(0.0, |s, v| s + v);
        let pick = |better: fn(f64, f64) -> bool| {
            known[1..]
                .iter()
                .fold(known[0], |m, &v| if better(v, m) { v } else { m })
        };
        match self {
            Method::Average => sum() / known.len() as f64,
            Method::Sum => sum(),
            Method::AvgZero => sum() / total as f64,
            Method::Last => known[known.len() - 1],
            Method::Max => pick(|v, m| v > m),
            Method::Min => pick(|v, m| v < m),
            // Python's max/min with key=abs: the first of equal magnitudes.
            Method::AbsMax => pick(|v, m| v.abs() > m.abs()),
            Method::AbsMin => pick(|v, m| v.abs() < m.abs()),
        }
    }
}

/// How a path's coarser slices are made of the finer ones: the method, and the share of the
/// finer slices that must be known, as whisper's header holds it (a 32-bit float: a configured
/// 0.1 is 0.10000000149…, so one of ten known slices is not enough).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Aggregation {
    pub method: Method,
    pub x_files_factor: f32,
}

impl Default for Aggregation {
    /// Whisper's, for a path no section names.
    fn default() -> Aggregation {
        Aggregation {
            method: Method::Average,
            x_files_factor: 0.5,
        }
    }
}

/// The sections of a `storage-aggregation.conf`, in order.
#[derive(Debug, Clone, Default)]
pub struct Aggregations {
    patterns: FirstMatch,
    rules: Vec<Aggregation>,
}

impl Aggregations {
    /// The file at `path`; none (empty path): every path takes whisper's defaults.
    pub fn load(path: &Path) -> Result<Aggregations, String> {
        if path.as_os_str().is_empty() {
            return Ok(Aggregations::default());
        }
        load(path, Aggregations::parse)
    }

    /// A file's text. Refused, where carbon would log and skip a section or fail at its first
    /// write: a section without `pattern`, a pattern that is no regular expression here (Rust's
    /// `regex`: no look-around or back-references), an `xFilesFactor` that is not a number
    /// from 0 to 1, an `aggregationMethod` whisper does not have.
    pub fn parse(text: &str) -> Result<Aggregations, String> {
        let mut patterns = Vec::new();
        let mut rules = Vec::new();
        for (name, pattern, options) in patterned(text)? {
            let get = |key: &str| option(&options, key);
            let mut rule = Aggregation::default();
            if let Some(xff) = get("xfilesfactor") {
                let x: f64 = xff
                    .parse()
                    .ok()
                    .filter(|x| (0.0..=1.0).contains(x))
                    .ok_or_else(|| {
                        format!("[{name}]: xFilesFactor `{xff}`: a number from 0 to 1")
                    })?;
                rule.x_files_factor = x as f32;
            }
            if let Some(method) = get("aggregationmethod") {
                rule.method = Method::ALL
                    .into_iter()
                    .find(|m| m.as_str() == method)
                    .ok_or_else(|| {
                        format!(
                            "[{name}]: aggregationMethod `{method}`: one of {}",
                            Method::ALL.map(Method::as_str).join(", ")
                        )
                    })?;
            }
            patterns.push(pattern);
            rules.push(rule);
        }
        let patterns = FirstMatch(patterns);
        Ok(Aggregations { patterns, rules })
    }

    /// The aggregation of `path` (normalized, tags and all): the first section that matches.
    pub fn of(&self, path: &str) -> Aggregation {
        (self.patterns.index(path)).map_or_else(Aggregation::default, |i| self.rules[i])
    }
}

/// carbon's retention for a path no section of `storage-schemas.conf` matches
/// (`carbon.storage.defaultSchema`): a minute's slices for a week.
pub const FALLBACK_RETENTIONS: &str = "60:10080";

/// The sections of a `storage-schemas.conf`, in order, then carbon's fallback; or the one
/// schema of `retentions` (or the book's precisions) for every path.
#[derive(Debug, Clone, PartialEq)]
pub struct Schemas {
    patterns: FirstMatch,
    /// Each section's retention, then the fallback's.
    retentions: Vec<Retention>,
}

impl Schemas {
    /// One schema for every path.
    pub fn single(retention: Retention) -> Schemas {
        Schemas {
            patterns: FirstMatch::default(),
            retentions: vec![retention],
        }
    }

    /// The file at `path`.
    pub fn load(path: &Path) -> Result<Schemas, String> {
        load(path, Schemas::parse)
    }

    /// A file's text. Refused, where carbon would log and skip a section or stop: a section
    /// without `pattern` or `retentions`, a pattern that is no regular expression here (Rust's
    /// `regex`), a `retentions` carbon or whisper refuses ([`Retention::parse`]), and a file
    /// with no section.
    pub fn parse(text: &str) -> Result<Schemas, String> {
        let mut patterns = Vec::new();
        let mut retentions = Vec::new();
        for (name, pattern, options) in patterned(text)? {
            let text = option(&options, "retentions")
                .ok_or_else(|| format!("[{name}]: no `retentions`"))?;
            let retention =
                Retention::parse(text).map_err(|e| format!("[{name}]: retentions {e}"))?;
            patterns.push(pattern);
            retentions.push(retention);
        }
        if patterns.is_empty() {
            return Err("no section: a [name] with `pattern` and `retentions` is needed".into());
        }
        retentions.push(Retention::parse(FALLBACK_RETENTIONS).expect("carbon's fallback"));
        Ok(Schemas {
            patterns: FirstMatch(patterns),
            retentions,
        })
    }

    /// Which schema `path` (normalized, tags and all; a StatsD series by its name) takes: the
    /// first section that matches, else the fallback (the last).
    pub fn index(&self, path: &str) -> usize {
        (self.patterns.index(path)).unwrap_or(self.retentions.len() - 1)
    }

    /// The retention of schema `i` ([`Schemas::index`]).
    pub fn retention(&self, i: usize) -> &Retention {
        &self.retentions[i.min(self.retentions.len() - 1)]
    }

    /// The retention of `path`.
    pub fn of(&self, path: &str) -> &Retention {
        self.retention(self.index(path))
    }

    /// Every schema, the fallback last.
    pub fn all(&self) -> &[Retention] {
        &self.retentions
    }

    /// Every precision any schema keeps, as long as the longest keeps it
    /// ([`Retention::union`]).
    pub fn union(&self) -> Retention {
        Retention::union(&self.retentions)
    }

    /// What `series` is kept for: each precision as long as the longest of its Graphite
    /// names' schemas keeps it (each name is read by its own, as carbon keeps a file a name).
    pub fn stored(&self, namer: &Namer, family: Family, series: &str) -> Retention {
        self.stored_by(&self.taken(namer, family, series))
    }

    /// The schemas `series`' Graphite names take ([`Schemas::index`]), each once, in order:
    /// what [`Schemas::stored_by`] makes its retention of.
    pub fn taken(&self, namer: &Namer, family: Family, series: &str) -> Vec<usize> {
        let mut taken = Vec::with_capacity(3);
        namer.each(family, series, |name| {
            let i = self.index(name);
            if !taken.contains(&i) {
                taken.push(i);
            }
        });
        taken.sort_unstable();
        taken
    }

    /// What a series whose names take schemas `indexes` ([`Schemas::taken`]) is kept for.
    pub fn stored_by(&self, indexes: &[usize]) -> Retention {
        match indexes {
            [one] => self.retention(*one).clone(),
            _ => Retention::union(indexes.iter().map(|&i| self.retention(i))),
        }
    }
}

/// The family of a stored series, as its Graphite names depend on it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Family {
    Counter,
    Gauge,
    Set,
}

/// The Graphite names a series is shown under, which `storage_schemas` matches: its own name,
/// and with `graphite_etsy_names` the names Etsy's statsd writes for it (a counter's count and
/// rate, a gauge's, a set's count), as `graphite::etsy` serves them.
#[derive(Debug, Clone, Default)]
pub struct Namer {
    /// Per family, the nodes before and after the series' name in each of its Etsy names
    /// (none without `graphite_etsy_names`).
    etsy: [Vec<(String, String)>; 3],
}

impl Namer {
    pub fn new(config: &crate::config::Config) -> Namer {
        if !config.graphite_etsy_names {
            return Namer::default();
        }
        let join = |parts: &[&str]| {
            (parts.iter())
                .flat_map(|p| p.split('.'))
                .filter(|n| !n.is_empty())
                .collect::<Vec<_>>()
                .join(".")
        };
        let suffix = config.graphite_etsy_global_suffix.as_str();
        let name = |head: &[&str], tail: &[&str]| (join(head), join(&[tail, &[suffix]].concat()));
        let c = config;
        let prefix = c.graphite_etsy_global_prefix.as_str();
        let etsy = if c.graphite_etsy_legacy_namespace {
            [
                vec![name(&["stats_counts"], &[]), name(&["stats"], &[])],
                vec![name(&["stats", "gauges"], &[])],
                vec![name(&["stats", "sets"], &["count"])],
            ]
        } else {
            let counters = [prefix, &c.graphite_etsy_prefix_counter];
            [
                vec![name(&counters, &["count"]), name(&counters, &["rate"])],
                vec![name(&[prefix, &c.graphite_etsy_prefix_gauge], &[])],
                vec![name(&[prefix, &c.graphite_etsy_prefix_set], &["count"])],
            ]
        };
        Namer { etsy }
    }

    /// `series`' Graphite names, its own first.
    #[cfg(test)]
    pub fn names(&self, family: Family, series: &str) -> Vec<String> {
        let mut names = Vec::new();
        self.each(family, series, |name| names.push(name.to_string()));
        names
    }

    /// Calls `f` with each of `series`' Graphite names, its own first (without allocating
    /// one a name).
    pub fn each(&self, family: Family, series: &str, mut f: impl FnMut(&str)) {
        f(series);
        let etsy = &self.etsy[family as usize];
        if etsy.is_empty() {
            return;
        }
        let (metric, tags) = series.split_at(series.find(';').unwrap_or(series.len()));
        let mut name = String::with_capacity(series.len() + 32);
        for (head, tail) in etsy {
            name.clear();
            for node in [head.as_str(), metric, tail.as_str()] {
                if !node.is_empty() {
                    if !name.is_empty() {
                        name.push('.');
                    }
                    name.push_str(node);
                }
            }
            name.push_str(tags);
            f(&name);
        }
    }
}

/// The [`Schemas`] in force, shared by every clone of the configuration that holds it: a SIGHUP
/// puts a new file's in place for all of them at once (the HTTP side's, the flush's, the
/// cleaner's).
#[derive(Debug, Clone)]
pub struct SharedSchemas(std::sync::Arc<std::sync::RwLock<Schemas>>);

impl SharedSchemas {
    pub fn new(schemas: Schemas) -> SharedSchemas {
        SharedSchemas(std::sync::Arc::new(std::sync::RwLock::new(schemas)))
    }

    /// The schemas in force.
    pub fn get(&self) -> Schemas {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Puts `schemas` in force for every holder.
    pub fn replace(&self, schemas: Schemas) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = schemas;
    }
}

impl PartialEq for SharedSchemas {
    fn eq(&self, other: &SharedSchemas) -> bool {
        self.get() == other.get()
    }
}

/// The patterns of a file's sections, in order: the first found anywhere in a path decides.
/// Tried one at a time: the common files' first sections are few and fail fast, where a
/// `RegexSet` runs them all (3x slower on Debian's storage-schemas.conf, docs/benchmarks.md).
#[derive(Debug, Clone, Default)]
struct FirstMatch(Vec<Regex>);

impl FirstMatch {
    fn index(&self, path: &str) -> Option<usize> {
        self.0.iter().position(|r| r.is_match(path))
    }
}

impl PartialEq for FirstMatch {
    fn eq(&self, other: &FirstMatch) -> bool {
        self.0
            .iter()
            .map(Regex::as_str)
            .eq(other.0.iter().map(Regex::as_str))
    }
}

/// A carbon file at `path`, read by `parse`; an error names the file.
fn load<T>(path: &Path, parse: impl Fn(&str) -> Result<T, String>) -> Result<T, String> {
    let text = crate::config::read_text(path).map_err(|e| format!("{}: {e}", path.display()))?;
    parse(&text).map_err(|e| format!("{}: {e}", path.display()))
}

/// The sections of a carbon file, each with its name, its `pattern` compiled and its options;
/// a section without a pattern, or one that does not compile, is refused.
fn patterned(text: &str) -> Result<Vec<(String, Regex, Options)>, String> {
    sections(text)?
        .into_iter()
        .map(|(name, options)| {
            let pattern =
                option(&options, "pattern").ok_or_else(|| format!("[{name}]: no `pattern`"))?;
            let regex = pattern_of(pattern).map_err(|e| format!("[{name}]: {e}"))?;
            Ok((name, regex, options))
        })
        .collect()
}

/// The value of option `key` (lowercase) in a section, the last given.
fn option<'a>(options: &'a [(String, String)], key: &str) -> Option<&'a String> {
    options.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v)
}

/// A pattern of carbon's files as a regular expression, or why not in one line (the `regex`
/// crate's message spans several, the pattern drawn with a caret under the fault).
pub(crate) fn pattern_of(pattern: &str) -> Result<Regex, String> {
    Regex::new(pattern).map_err(|e| {
        let text = e.to_string();
        let why = text.lines().last().unwrap_or_default().trim();
        format!("pattern `{pattern}`: {}", why.trim_start_matches("error: "))
    })
}

/// A section's options (key, value), in order.
type Options = Vec<(String, String)>;

/// A section's name and its options.
type Section = (String, Options);

/// Sections of an INI text as Python's `ConfigParser` reads them: `[name]`, then `key = value`
/// or `key: value` lines (keys lowercased, both sides trimmed), full-line comments (`#`, `;`),
/// an indented line continuing the value before it; `[DEFAULT]`'s keys apply to every section.
fn sections(text: &str) -> Result<Vec<Section>, String> {
    let mut defaults: Vec<(String, String)> = Vec::new();
    let mut sections: Vec<Section> = Vec::new();
    let mut in_default = false;
    for (n, raw) in text.lines().enumerate() {
        let line = raw.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        let options = if in_default {
            &mut defaults
        } else {
            match sections.last_mut() {
                Some(s) => &mut s.1,
                None if line.starts_with('[') => &mut defaults,
                None => return Err(format!("line {}: an option before any [section]", n + 1)),
            }
        };
        if raw.starts_with([' ', '\t']) && !options.is_empty() {
            let last = options.last_mut().expect("not empty");
            last.1 = format!("{}\n{line}", last.1);
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            in_default = name == "DEFAULT";
            if !in_default {
                if sections.iter().any(|(s, _)| s == name) {
                    return Err(format!("line {}: section [{name}] given twice", n + 1));
                }
                sections.push((name.to_string(), Vec::new()));
            }
            continue;
        }
        let at = line
            .find(['=', ':'])
            .ok_or_else(|| format!("line {}: `{line}`: key = value", n + 1))?;
        let (key, value) = (line[..at].trim(), line[at + 1..].trim());
        options.push((key.to_lowercase(), value.to_string()));
    }
    for (_, options) in &mut sections {
        for (key, value) in &defaults {
            if !options.iter().any(|(k, _)| k == key) {
                options.push((key.clone(), value.clone()));
            }
        }
    }
    Ok(sections)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn aggregations_are_whispers() {
        let v = [3.0, -7.0, 7.0, 1.0];
        assert_eq!(Method::Average.aggregate(&v, 6), 1.0);
        assert_eq!(Method::AvgZero.aggregate(&v, 8), 0.5);
        assert_eq!(Method::Sum.aggregate(&v, 6), 4.0);
        assert_eq!(Method::Last.aggregate(&v, 6), 1.0);
        assert_eq!(Method::Max.aggregate(&v, 6), 7.0);
        assert_eq!(Method::Min.aggregate(&v, 6), -7.0);
        assert_eq!(
            Method::AbsMax.aggregate(&v, 6),
            -7.0,
            "the first of equal magnitudes"
        );
        assert_eq!(Method::AbsMin.aggregate(&v, 6), 1.0);
    }

    /// carbon's example file, with the methods whisper added since.
    const EXAMPLE: &str = "\
# Aggregation methods for whisper files.
[min]
pattern = \\.min$
xFilesFactor = 0.1
aggregationMethod = min

[max]
pattern = \\.max$
xFilesFactor = 0.1
aggregationMethod = max

[sum]
pattern = \\.count$
xFilesFactor = 0
aggregationMethod = sum

[abs]
pattern = ^abs\\.
AggregationMethod: absmax

[default_average]
pattern = .*
xFilesFactor = 0.5
aggregationMethod = average
";

    #[test]
    fn the_first_matching_section_decides() {
        let a = Aggregations::parse(EXAMPLE).unwrap();
        let of = |p| a.of(p);
        assert_eq!(of("a.b.min").method, Method::Min);
        assert_eq!(of("a.b.min").x_files_factor, 0.1f32);
        // Unanchored: found anywhere; the first of several.
        assert_eq!(of("web.x.count").method, Method::Sum);
        // Searched in the normalized path, tags and all, as carbon does.
        assert_eq!(of("x.count;host=a").method, Method::Average);
        // The first that matches, though a later one matches too.
        assert_eq!(of("abs.x.max").method, Method::Max);
        assert_eq!(of("abs.x.y").method, Method::AbsMax);
        assert_eq!(
            of("abs.x.y").x_files_factor,
            0.5,
            "a missing key: whisper's"
        );
        assert_eq!(of("a.b").method, Method::Average);
        assert_eq!(Aggregations::default().of("a"), Aggregation::default());
        let none = Aggregations::parse("[only]\npattern = ^z\naggregationMethod = last\n").unwrap();
        assert_eq!(none.of("a"), Aggregation::default());
        // [DEFAULT] applies to every section.
        let d = Aggregations::parse("[DEFAULT]\nxFilesFactor = 0\n[s]\npattern = .\n").unwrap();
        assert_eq!(d.of("a").x_files_factor, 0.0);
    }

    #[test]
    fn what_carbon_refuses_is_refused() {
        for (text, says) in [
            ("[a]\nxFilesFactor = 0\n", "no `pattern`"),
            ("[a]\npattern = (\n", "pattern"),
            ("[a]\npattern = (?=x)\n", "pattern"),
            ("[a]\npattern = .\nxFilesFactor = 2\n", "from 0 to 1"),
            ("[a]\npattern = .\nxFilesFactor = x\n", "from 0 to 1"),
            (
                "[a]\npattern = .\naggregationMethod = median\n",
                "one of average",
            ),
            ("pattern = .\n", "before any"),
            ("[a]\npattern = .\n[a]\npattern = .\n", "twice"),
            ("[a]\npattern .\n", "key = value"),
        ] {
            let e = Aggregations::parse(text).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }

    /// Debian's `/etc/carbon/storage-schemas.conf`, and sections carbon's example shows.
    const SCHEMAS: &str = "\
# Schema definitions for Whisper files. Entries are scanned in order,
[carbon]
pattern = ^carbon\\.
retentions = 60:90d

[tagged]
pattern = ;env=prod(;|$)
retentions = 10s:1h,1m:1d

[default_1min_for_1day]
pattern = .*
retentions = 60s:1d,5m:30d,1h:3y
";

    #[test]
    fn the_first_matching_schema_decides() {
        let s = Schemas::parse(SCHEMAS).unwrap();
        let of = |p| s.of(p).encode();
        assert_eq!(of("carbon.agents.a.cpu"), "60:129600");
        // Unanchored, searched in the normalized path, tags and all.
        assert_eq!(of("disk.used;env=prod;host=a"), "10:360,60:1440");
        assert_eq!(
            of("disk.used;env=production"),
            "60:1440,300:8640,3600:26280"
        );
        assert_eq!(of("a.carbon.x"), "60:1440,300:8640,3600:26280");
        assert_eq!(s.index("carbon.x"), 0);
        // Every precision any section keeps, as long as the longest keeps it.
        assert_eq!(s.union().encode(), "10:360,60:129600,300:8640,3600:26280");
        // Nothing matches: carbon's fallback, a week of minutes.
        let only = Schemas::parse("[c]\npattern = ^carbon\\.\nretentions = 10s:1d\n").unwrap();
        assert_eq!(only.of("app.x").encode(), "60:10080");
        assert_eq!(only.index("app.x"), 1);
        assert_eq!(only.union().encode(), "10:8640,60:10080");
        // What the cleaner keeps: a precision the schema does not list, the book's 120.
        let kept = |p| only.of(p).within(&only.union()).encode();
        assert_eq!(kept("app.x"), "10:120,60:10080");
        assert_eq!(kept("carbon.x"), "10:8640,60:120");
        let one = Schemas::single(Retention::parse("10s:6h").unwrap());
        assert_eq!(one.of("anything").encode(), "10:2160");
    }

    #[test]
    fn a_series_is_kept_as_long_as_its_longest_named_schema_says() {
        let s = Schemas::parse(
            "[counts]\npattern = ^stats_counts\\.\nretentions = 10s:1d\n\
             [rates]\npattern = ^stats\\.\nretentions = 10s:6h,1m:7d\n",
        )
        .unwrap();
        let mut config = crate::config::Config {
            graphite_etsy_names: true,
            ..Default::default()
        };
        let names = |c: &crate::config::Config, f, series| Namer::new(c).names(f, series);
        assert_eq!(
            names(&config, Family::Counter, "app.hits;env=a"),
            [
                "app.hits;env=a",
                "stats_counts.app.hits;env=a",
                "stats.app.hits;env=a"
            ]
        );
        let stored = |c: &crate::config::Config, f, series| s.stored(&Namer::new(c), f, series);
        assert_eq!(
            stored(&config, Family::Counter, "app.hits").encode(),
            "10:8640,60:10080"
        );
        assert_eq!(names(&config, Family::Set, "u")[1], "stats.sets.u.count");
        config.graphite_etsy_legacy_namespace = false;
        config.graphite_etsy_global_suffix = "sfx".into();
        assert_eq!(
            names(&config, Family::Counter, "app.hits")[1..],
            [
                "stats.counters.app.hits.count.sfx",
                "stats.counters.app.hits.rate.sfx"
            ]
        );
        assert_eq!(names(&config, Family::Gauge, "g")[1], "stats.gauges.g.sfx");
        config.graphite_etsy_names = false;
        assert_eq!(names(&config, Family::Gauge, "g"), ["g"]);
        // A name no section matches: carbon's fallback.
        assert_eq!(stored(&config, Family::Gauge, "g").encode(), "60:10080");
    }

    #[test]
    fn what_carbon_refuses_in_schemas_is_refused() {
        for (text, says) in [
            ("[a]\nretentions = 60:1d\n", "no `pattern`"),
            ("[a]\npattern = .\n", "no `retentions`"),
            ("[a]\npattern = (\nretentions = 60:1d\n", "pattern"),
            (
                "[a]\npattern = .\nretentions = 60:1d,61:2d\n",
                "[a]: retentions",
            ),
            ("[a]\npattern = .\nretentions = 10X:1d\n", "[a]: retentions"),
            ("# nothing\n", "no section"),
        ] {
            let e = Schemas::parse(text).unwrap_err();
            assert!(e.contains(says), "{text:?}: {e}");
        }
    }
}
