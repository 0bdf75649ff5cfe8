//! What the readers do to a sample before it reaches a window: the filters (`keep_names`,
//! `drop_names`, `drop_types`, `drop_tags`), then the mapping rules (`mapping_file`); and to a
//! carbon point, carbon's lists (`carbon_whitelist`, `carbon_blacklist`). Made from the
//! configuration at start and again at each SIGHUP; a reader takes the new rules at its next
//! datagram ([`SharedRules`]).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::mapping::Mapper;
use crate::config::{Config, ConfigError, err};
use crate::protocol::MetricType;
use crate::store::reader::Glob;

/// The filters, compiled.
#[derive(Debug, Default)]
pub struct Rules {
    /// When any, only names one of them matches are kept.
    keep: Vec<Glob>,
    drop: Vec<Glob>,
    drop_types: [bool; MetricType::ALL.len()],
    /// Tag keys removed before the series name is made.
    pub drop_tags: Vec<String>,
    /// The mapping file's rules (none without one).
    pub mapper: Mapper,
    /// Carbon's whitelist and blacklist, their patterns in file order.
    carbon_whitelist: Vec<regex::Regex>,
    carbon_blacklist: Vec<regex::Regex>,
}

/// Why carbon's lists refuse a path.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Listed {
    /// A pattern of the blacklist matches it (carbon's `blacklistMatches`).
    Blacklisted,
    /// The whitelist has patterns and none matches it (carbon's `whitelistRejects`).
    NotWhitelisted,
}

impl Rules {
    /// The rules `config` asks for; a bad one is an error naming its key.
    pub fn from_config(config: &Config) -> Result<Rules, ConfigError> {
        let mut drop_types = [false; MetricType::ALL.len()];
        for name in &config.drop_types {
            let kind = MetricType::from_wire(name.as_bytes()).ok_or_else(|| {
                err(
                    "drop_types",
                    format!("{name:?} is not a StatsD type (c, ms, h, d, g, s)"),
                )
            })?;
            drop_types[kind as usize] = true;
        }
        Ok(Rules {
            keep: globs("keep_names", &config.keep_names)?,
            drop: globs("drop_names", &config.drop_names)?,
            drop_types,
            drop_tags: config.drop_tags.clone(),
            mapper: read_mapping(&config.mapping_file)?,
            carbon_whitelist: read_list("carbon_whitelist", &config.carbon_whitelist)?,
            carbon_blacklist: read_list("carbon_blacklist", &config.carbon_blacklist)?,
        })
    }

    /// Whether carbon's lists refuse carbon path `path` (as sent), checked as carbon's
    /// `metricReceived` checks them: the blacklist first, each pattern searched for anywhere.
    #[inline]
    pub fn refuses(&self, path: &str) -> Option<Listed> {
        if self.carbon_blacklist.iter().any(|r| r.is_match(path)) {
            return Some(Listed::Blacklisted);
        }
        let listed = self.carbon_whitelist.is_empty()
            || self.carbon_whitelist.iter().any(|r| r.is_match(path));
        (!listed).then_some(Listed::NotWhitelisted)
    }

    /// Whether a sample of metric `name` (without its tags) and type `kind` is kept.
    #[inline]
    pub fn keeps(&self, name: &str, kind: MetricType) -> bool {
        !self.drop_types[kind as usize]
            && (self.keep.is_empty() || self.keep.iter().any(|g| g.matches(name)))
            && !self.drop.iter().any(|g| g.matches(name))
    }

    /// Whether the rules keep and name every sample as it is, `drop_tags` aside (the reader's
    /// namer applies those, to tagged lines only).
    pub fn is_empty(&self) -> bool {
        self.keep.is_empty()
            && self.drop.is_empty()
            && self.drop_types == [false; MetricType::ALL.len()]
            && self.mapper.is_empty()
    }

    /// Whether carbon's lists hold any pattern.
    pub fn has_carbon_lists(&self) -> bool {
        !(self.carbon_whitelist.is_empty() && self.carbon_blacklist.is_empty())
    }
}

/// The rules of the mapping file at `path` (none for an empty path).
fn read_mapping(path: &std::path::Path) -> Result<Mapper, ConfigError> {
    if path.as_os_str().is_empty() {
        return Ok(Mapper::default());
    }
    let text = crate::config::read_text(path)
        .map_err(|e| err("mapping_file", format!("{}: {e}", path.display())))?;
    Mapper::from_yaml(&text).map_err(|e| err("mapping_file", format!("{}: {e}", path.display())))
}

/// A carbon list file (`whitelist.conf`, `blacklist.conf`) read as carbon's `RegexList` reads
/// it: a pattern a line, trimmed; a line that starts with `#`, or is blank, is skipped. Where
/// carbon logs and skips a pattern it cannot compile, the agent refuses the file, naming the
/// line (Rust's `regex`: no look-around or back-references).
fn read_list(key: &str, path: &std::path::Path) -> Result<Vec<regex::Regex>, ConfigError> {
    if path.as_os_str().is_empty() {
        return Ok(Vec::new());
    }
    let text =
        crate::config::read_text(path).map_err(|e| err(key, format!("{}: {e}", path.display())))?;
    parse_list(&text).map_err(|e| err(key, format!("{}: {e}", path.display())))
}

fn parse_list(text: &str) -> Result<Vec<regex::Regex>, String> {
    let mut list = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let pattern = line.trim();
        if line.starts_with('#') || pattern.is_empty() {
            continue;
        }
        list.push(
            crate::storage_conf::pattern_of(pattern).map_err(|e| format!("line {}: {e}", n + 1))?,
        );
    }
    Ok(list)
}

/// Name globs (`*` any run of characters, dots too; `?` one character; the rest literal), as
/// the store's [`Glob`] matches them.
fn globs(key: &str, patterns: &[String]) -> Result<Vec<Glob>, ConfigError> {
    if let Some(empty) = patterns.iter().position(String::is_empty) {
        return Err(err(key, format!("pattern {} is empty", empty + 1)));
    }
    Ok(patterns.iter().map(|p| Glob::new(p)).collect())
}

/// The readers' rules, replaced at a SIGHUP: each reader keeps an `Arc` of the rules it uses
/// and looks at the version once a datagram (one atomic load).
#[derive(Debug, Default)]
pub struct SharedRules {
    version: AtomicU64,
    rules: Mutex<Arc<Rules>>,
}

impl SharedRules {
    pub fn new(rules: Rules) -> SharedRules {
        SharedRules {
            version: AtomicU64::new(0),
            rules: Mutex::new(Arc::new(rules)),
        }
    }

    /// Replaces the rules.
    pub fn replace(&self, rules: Rules) {
        *self.rules.lock().unwrap_or_else(|p| p.into_inner()) = Arc::new(rules);
        self.version.fetch_add(1, Ordering::Release);
    }

    /// The rules, if they changed since `version` (which is then moved on).
    pub fn changed_since(&self, version: &mut u64) -> Option<Arc<Rules>> {
        let now = self.version.load(Ordering::Acquire);
        if now == *version {
            return None;
        }
        *version = now;
        Some(self.rules.lock().unwrap_or_else(|p| p.into_inner()).clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rules(keep: &[&str], drop: &[&str], types: &[&str]) -> Result<Rules, ConfigError> {
        let strings = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        Rules::from_config(&Config {
            keep_names: strings(keep),
            drop_names: strings(drop),
            drop_types: strings(types),
            ..Config::default()
        })
    }

    #[test]
    fn carbons_lists_as_carbon_reads_them() {
        let list = |text: &str| parse_list(text).unwrap();
        let rules = |white: &str, black: &str| Rules {
            carbon_whitelist: list(white),
            carbon_blacklist: list(black),
            ..Rules::default()
        };
        // Comments only at the start of a line; blank lines and surrounding blanks ignored.
        let r = rules("# web only\n\n  ^web\\.  \n  #x\n", "\\.debug\\.\n");
        assert!(
            r.is_empty() && r.has_carbon_lists(),
            "StatsD's rules stay empty"
        );
        assert_eq!(r.refuses("web.a"), None);
        assert_eq!(r.refuses("db.a"), Some(Listed::NotWhitelisted));
        // "  #x" is a pattern: carbon skips only lines that start with '#'.
        assert_eq!(r.refuses("a#x"), None);
        // The blacklist first, searched anywhere.
        assert_eq!(r.refuses("web.debug.a"), Some(Listed::Blacklisted));
        let none = rules("", "");
        assert!(!none.has_carbon_lists());
        assert_eq!(none.refuses("anything"), None);
        let e = parse_list("ok\n(\n").unwrap_err();
        assert!(e.contains("line 2"), "{e}");
    }

    #[test]
    fn globs_keep_and_drop_names_and_types() {
        let r = rules(&["api.*", "web.?.hits"], &["*.debug.*", "api.tmp"], &["h"]).unwrap();
        let c = MetricType::Counter;
        assert!(r.keeps("api.requests", c));
        assert!(r.keeps("api.a.b.c", c), "* crosses dots");
        assert!(r.keeps("web.1.hits", c));
        assert!(!r.keeps("web.12.hits", c), "? is one character");
        assert!(!r.keeps("db.requests", c), "not kept");
        assert!(!r.keeps("api.x.debug.y", c), "dropped");
        assert!(!r.keeps("api.tmp", c));
        assert!(r.keeps("api.tmp2", c), "a glob matches the whole name");
        assert!(!r.keeps("api.size", MetricType::Histogram), "the type");
        assert!(r.keeps("api.(x)+[y]", c), "regex characters are literal");
        assert!(rules(&[], &[], &[]).unwrap().is_empty());
        let only_tags = Rules {
            drop_tags: vec!["pod".into()],
            ..Rules::default()
        };
        assert!(only_tags.is_empty(), "drop_tags alone keeps the fast path");
    }

    #[test]
    fn a_bad_rule_names_its_key() {
        assert_eq!(rules(&[], &[], &["x"]).unwrap_err().key, "drop_types");
        assert_eq!(rules(&[""], &[], &[]).unwrap_err().key, "keep_names");
    }
}
