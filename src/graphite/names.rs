//! How the agent's series look in Graphite (docs/reading.md, "Grafana"): tagged names in graphite-web's
//! canonical form, and a glob over dotted names matched node by node.
//!
//! The agent writes a tagged series `name;k=v;…` with its tags sorted by key, then value;
//! graphite-web sorts the `;k=v` texts themselves, which differs where a key is a prefix of
//! another followed by a byte below `=` (`host=a;host-group=b` is `host-group=b;host=a` there).
//! A series whose tags graphite-web would refuse (a DogStatsD bare tag such as `canary`, an empty
//! value, a value starting with `~`) keeps its name as it is and has only the `name` tag, as
//! carbon keeps such a series.

/// A tagged name, read as graphite-web's `TaggedSeries.parse` reads it.
#[derive(Debug, Clone, PartialEq)]
pub struct Tagged {
    pub metric: String,
    /// In the order they are written; a repeated key keeps its place and its last value.
    pub tags: Vec<(String, String)>,
}

impl Tagged {
    /// Its tags as graphite-web's tag dict holds them: in order, then `name`, the metric.
    pub fn into_tags(self) -> Vec<(String, String)> {
        let mut tags = self.tags;
        tags.push(("name".into(), self.metric));
        tags
    }
}

/// `name;k=v;…` if graphite-web takes it as a tagged series; `None` for a dotted name or one
/// whose tags it refuses.
pub fn parse_tagged(name: &str) -> Option<Tagged> {
    let mut segments = name.split(';');
    let metric = segments.next()?;
    let metric = metric.trim_start_matches('~');
    if metric.is_empty() || !name.contains(';') {
        return None;
    }
    let mut tags: Vec<(String, String)> = Vec::new();
    for segment in segments {
        let (key, value) = segment.split_once('=')?;
        if key.is_empty()
            || value.is_empty()
            || key.contains(['!', '^', '='])
            || value.starts_with('~')
        {
            return None;
        }
        match tags.iter_mut().find(|(k, _)| k == key) {
            Some(tag) => tag.1 = value.to_string(),
            None => tags.push((key.to_string(), value.to_string())),
        }
    }
    Some(Tagged {
        metric: metric.to_string(),
        tags,
    })
}

/// graphite-web's canonical name of a tagged series: the metric, then the `;k=v` texts sorted.
pub fn format(metric: &str, tags: &[(String, String)]) -> String {
    let mut parts: Vec<String> = tags
        .iter()
        .filter(|(k, _)| k != "name")
        .map(|(k, v)| format!(";{k}={v}"))
        .collect();
    parts.sort();
    format!("{metric}{}", parts.concat())
}

/// The Graphite name of an agent series: canonical when tagged, else as it is.
pub fn graphite_name(series: &str) -> String {
    match parse_tagged(series) {
        Some(t) => format(&t.metric, &t.tags),
        None => series.to_string(),
    }
}

/// The agent's name of a Graphite name: tags sorted by key, then value.
pub fn agent_name(name: &str) -> String {
    match parse_tagged(name) {
        Some(mut t) => {
            t.tags.sort();
            let tags: String = t.tags.iter().map(|(k, v)| format!(";{k}={v}")).collect();
            format!("{}{tags}", t.metric)
        }
        None => name.to_string(),
    }
}

/// One node of a dotted glob: `*`, `?`, `[…]`, `[!…]`, and `{a,b}` alternatives, as Python's
/// `fnmatch` over graphite-web's brace expansion. Only an alternative with a wildcard is a
/// regular expression: a literal is compared, and `*` matches without either (compiling costs
/// more than a browse's whole match).
#[derive(Debug, Clone)]
pub struct NodePattern {
    alternatives: Vec<Alternative>,
    literal: Option<String>,
    /// What every node it matches starts with (`1??`: `1`).
    prefix: String,
    /// `*`: every node (the common level of a browse).
    any: bool,
}

#[derive(Debug, Clone)]
enum Alternative {
    Literal(String),
    Glob(regex::Regex),
}

impl NodePattern {
    pub fn new(node: &str) -> Result<NodePattern, String> {
        let any = node == "*";
        let alternatives = expand_braces(node, MAX_ALTERNATIVES).ok_or_else(|| {
            let shown: String = node.chars().take(60).collect();
            format!(
                "the glob node `{shown}…` expands to more than {MAX_ALTERNATIVES} alternatives, the limit"
            )
        })?;
        let literal = (alternatives.len() == 1 && !has_wildcard(&alternatives[0]))
            .then(|| alternatives[0].clone());
        let prefix = (alternatives.iter())
            .map(|a| &a[..a.find(WILDCARDS).unwrap_or(a.len())])
            .reduce(|common, a| {
                let same = (common.char_indices().zip(a.chars()))
                    .find(|((_, x), y)| x != y)
                    .map_or(common.len().min(a.len()), |((i, _), _)| i);
                &common[..same]
            })
            .unwrap_or_default()
            .to_string();
        let alternatives = if any {
            Vec::new()
        } else {
            alternatives
                .into_iter()
                .map(|a| {
                    if !has_wildcard(&a) {
                        return Ok(Alternative::Literal(a));
                    }
                    regex::Regex::new(&fnmatch_regex(&a))
                        .map(Alternative::Glob)
                        .map_err(|e| {
                            let shown: String = node.chars().take(60).collect();
                            format!("bad pattern `{shown}`: {e}")
                        })
                })
                .collect::<Result<_, _>>()?
        };
        Ok(NodePattern {
            any,
            alternatives,
            literal,
            prefix,
        })
    }

    /// The node's text when it has no wildcard.
    pub fn literal(&self) -> Option<&str> {
        self.literal.as_deref()
    }

    /// What every node it matches starts with: the text before the first wildcard that its
    /// alternatives share (`1??`: `1`; `web{1,2}*`: `web`; `*`: nothing).
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn matches(&self, node: &str) -> bool {
        self.any
            || self.alternatives.iter().any(|a| match a {
                Alternative::Literal(l) => l == node,
                Alternative::Glob(r) => r.is_match(node),
            })
    }
}

/// The characters that make a glob node's alternative a pattern (braces are expanded first).
const WILDCARDS: [char; 3] = ['*', '?', '['];

fn has_wildcard(s: &str) -> bool {
    s.contains(WILDCARDS)
}

/// The alternatives one glob node may expand to (`{a,b}{c,d}` is four): each is a pattern
/// matched against every candidate, and their number grows as the product of the lists.
pub const MAX_ALTERNATIVES: usize = 1000;

/// `a{b,c}d{e,f}` → `abde`, `abdf`, `acde`, `acdf` (graphite-web's `expand_braces`: the first
/// brace pair, recursively); `None` past `max` alternatives.
fn expand_braces(s: &str, max: usize) -> Option<Vec<String>> {
    let (Some(open), Some(close)) = (s.find('{'), s.find('}')) else {
        return Some(vec![s.to_string()]);
    };
    if close < open {
        return Some(vec![s.to_string()]);
    }
    let (before, inside, after) = (&s[..open], &s[open + 1..close], &s[close + 1..]);
    let mut out: Vec<String> = Vec::new();
    for alternative in inside.split(',') {
        out.extend(expand_braces(
            &format!("{before}{alternative}{after}"),
            max,
        )?);
        if out.len() > max {
            return None;
        }
    }
    out.dedup();
    Some(out)
}

/// Python's `fnmatch.translate`, anchored.
fn fnmatch_regex(pattern: &str) -> String {
    let chars: Vec<char> = pattern.chars().collect();
    let mut out = String::from("^(?s:");
    let mut i = 0;
    while i < chars.len() {
        match chars[i] {
            '*' => out.push_str(".*"),
            '?' => out.push('.'),
            '[' => {
                let mut j = i + 1;
                if chars.get(j) == Some(&'!') {
                    j += 1;
                }
                if chars.get(j) == Some(&']') {
                    j += 1;
                }
                while j < chars.len() && chars[j] != ']' {
                    j += 1;
                }
                if j >= chars.len() {
                    out.push_str("\\[");
                } else {
                    let mut class: String = chars[i + 1..j].iter().collect();
                    class = class.replace('\\', "\\\\");
                    if let Some(rest) = class.strip_prefix('!') {
                        class = format!("^{rest}");
                    } else if class.starts_with('^') {
                        class = format!("\\{class}");
                    }
                    out.push('[');
                    out.push_str(&class);
                    out.push(']');
                    i = j;
                }
            }
            c => out.push_str(&regex::escape(&c.to_string())),
        }
        i += 1;
    }
    out.push_str(")$");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn canonical_names_as_graphite_web_sorts_them() {
        assert_eq!(
            graphite_name("jobs.runs;host=a;host-group=b"),
            "jobs.runs;host-group=b;host=a"
        );
        assert_eq!(
            agent_name("jobs.runs;host-group=b;host=a"),
            "jobs.runs;host=a;host-group=b"
        );
        assert_eq!(
            graphite_name("api.calls;canary;env=prod"),
            "api.calls;canary;env=prod"
        );
        assert_eq!(parse_tagged("api.calls;canary;env=prod"), None);
        assert_eq!(parse_tagged("a;k=~x"), None);
        assert_eq!(graphite_name("web.home.hits"), "web.home.hits");
    }

    #[test]
    fn node_patterns_as_fnmatch_and_braces() {
        let p = NodePattern::new("{home,cart}").unwrap();
        assert!(p.matches("home") && p.matches("cart") && !p.matches("miss"));
        let p = NodePattern::new("h?t[sx]").unwrap();
        assert!(p.matches("hits") && p.matches("hatx") && !p.matches("hit"));
        let p = NodePattern::new("[!a]*").unwrap();
        assert!(p.matches("bc") && !p.matches("abc"));
        assert_eq!(NodePattern::new("hits").unwrap().literal(), Some("hits"));
        assert_eq!(NodePattern::new("h*").unwrap().literal(), None);
        let prefix = |n: &str| NodePattern::new(n).unwrap().prefix().to_string();
        assert_eq!(prefix("1??"), "1");
        assert_eq!(prefix("web{1,2}*"), "web");
        assert_eq!(prefix("{app1,app2}"), "app");
        assert_eq!(prefix("{home,cart}"), "");
        assert_eq!(prefix("*"), "");
        assert_eq!(prefix("é[ab]x"), "é");
        assert!(NodePattern::new("a.b").unwrap().matches("a.b"));
        // 2^10 alternatives are past the limit; the refusal comes before they are made.
        let exponential = "{a,b}".repeat(30);
        assert!(
            NodePattern::new(&exponential)
                .unwrap_err()
                .contains("limit")
        );
        assert!(NodePattern::new(&"{a,b}".repeat(9)).is_ok());
    }
}
