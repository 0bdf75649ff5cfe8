//! Carbon's `storage-aggregation.conf` (`storage_aggregation`), read as carbon-cache 1.1 reads
//! it: sections in file order, each a `pattern` (a regular expression searched for anywhere in
//! the path), an `xFilesFactor` and an `aggregationMethod`; the first section whose pattern
//! matches a path decides, a missing key takes whisper's default (0.5, `average`), and a path
//! no section matches takes both defaults.

use std::path::Path;

use regex::{Regex, RegexSet};

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
    patterns: Option<RegexSet>,
    rules: Vec<Aggregation>,
}

impl Aggregations {
    /// The file at `path`; none (empty path): every path takes whisper's defaults.
    pub fn load(path: &Path) -> Result<Aggregations, String> {
        if path.as_os_str().is_empty() {
            return Ok(Aggregations::default());
        }
        let text =
            crate::config::read_text(path).map_err(|e| format!("{}: {e}", path.display()))?;
        Aggregations::parse(&text).map_err(|e| format!("{}: {e}", path.display()))
    }

    /// A file's text. Refused, where carbon would log and skip a section or fail at its first
    /// write: a section without `pattern`, a pattern that is no regular expression here (Rust's
    /// `regex`: no look-around or back-references), an `xFilesFactor` that is not a number
    /// from 0 to 1, an `aggregationMethod` whisper does not have.
    pub fn parse(text: &str) -> Result<Aggregations, String> {
        let mut patterns = Vec::new();
        let mut rules = Vec::new();
        for (name, options) in sections(text)? {
            let get = |key: &str| options.iter().rev().find(|(k, _)| k == key).map(|(_, v)| v);
            let pattern = get("pattern").ok_or_else(|| format!("[{name}]: no `pattern`"))?;
            Regex::new(pattern).map_err(|e| format!("[{name}]: pattern `{pattern}`: {e}"))?;
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
            patterns.push(pattern.clone());
            rules.push(rule);
        }
        let patterns = (!patterns.is_empty())
            .then(|| RegexSet::new(&patterns).map_err(|e| e.to_string()))
            .transpose()?;
        Ok(Aggregations { patterns, rules })
    }

    /// The aggregation of `path` (normalized, tags and all): the first section that matches.
    pub fn of(&self, path: &str) -> Aggregation {
        self.patterns
            .as_ref()
            .and_then(|set| set.matches(path).iter().next())
            .map_or_else(Aggregation::default, |i| self.rules[i])
    }
}

/// A section's name and its options (key, value), in order.
type Section = (String, Vec<(String, String)>);

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
}
