//! Series names: a metric's name and tags folded into one Graphite-tag string
//! `name;k=v;k2=v2;bare`, tags sorted by key then value so tag order never splits a series.
//!
//! Sanitizing (on by default) treats the two parts differently. The metric name follows Etsy
//! statsd's rule ([`name_byte_allowed`]). Tag keys and values are kept as sent, any UTF-8, as
//! datadog-agent, statsd_exporter, Telegraf and vector keep them (`route:/cart` stays
//! `route=/cart`), changing only what the series form cannot hold: a `;` or a run of whitespace
//! becomes `_`, control characters are dropped, and a `=` in a key becomes `_` (a value may
//! hold `=`: a tag splits at its first one). Each change counts the line as renamed.
//!
//! [`SeriesNamer`] keeps its buffers between lines, so naming a series allocates nothing once
//! the buffers have grown; an untagged name that needs no sanitizing is returned as is.

use std::ops::Range;

use super::BadLine;

/// Bytes a name keeps when sanitizing (Etsy's `keyNameSanitize` plus `;` and `=`).
pub(super) const fn name_byte_allowed(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-' | b';' | b'=')
}

/// Appends `src` to `out` (as it is when `unchanged`), each run of whitespace as one `_` and
/// every other character as `map` gives it (`None`: dropped). Returns whether anything changed.
fn rewrite_into(
    src: &str,
    out: &mut String,
    unchanged: bool,
    map: impl Fn(char) -> Option<char>,
) -> bool {
    if unchanged {
        out.push_str(src);
        return false;
    }
    let mut in_space = false;
    for c in src.chars() {
        if c.is_whitespace() {
            if !in_space {
                out.push('_');
            }
            in_space = true;
            continue;
        }
        in_space = false;
        if let Some(c) = map(c) {
            out.push(c);
        }
    }
    true
}

/// Appends a tag key or value to `out` as sent but for what the series form cannot hold (the
/// module's rule). Returns whether anything changed.
fn clean_tag_into(src: &str, out: &mut String, is_key: bool) -> bool {
    let kept = |c: char| !(c == ';' || c.is_whitespace() || c.is_control() || (is_key && c == '='));
    rewrite_into(src, out, src.chars().all(kept), |c| match c {
        ';' => Some('_'),
        '=' if is_key => Some('_'),
        c if c.is_control() => None,
        c => Some(c),
    })
}

/// Appends `src` sanitized to `out`: whitespace runs become `_`, `/` becomes `-`, every other
/// byte outside the allowed set is dropped. Returns whether anything changed.
fn sanitize_into(src: &str, out: &mut String, allowed: fn(u8) -> bool) -> bool {
    rewrite_into(src, out, src.bytes().all(allowed), |c| match c {
        '/' => Some('-'),
        c if c.is_ascii() && allowed(c as u8) => Some(c),
        _ => None,
    })
}

/// Builds series names with reusable buffers.
#[derive(Debug)]
pub struct SeriesNamer {
    sanitize: bool,
    /// Tag keys left out of series names (`drop_tags`).
    pub drop_tags: Vec<String>,
    out: String,
    tag_text: String,
    tags: Vec<(Range<usize>, Range<usize>)>,
}

impl SeriesNamer {
    pub fn new(sanitize: bool) -> Self {
        SeriesNamer {
            sanitize,
            drop_tags: Vec::new(),
            out: String::new(),
            tag_text: String::new(),
            tags: Vec::new(),
        }
    }

    /// The series name of a metric, and whether sanitizing changed anything.
    ///
    /// `influx` is the `k=v,...` text from the name, `dog` the `k:v,...` text of `#tags`; at most
    /// one of them is given (the parser rejects lines with both).
    pub fn series<'s>(
        &'s mut self,
        name: &'s str,
        influx: Option<&str>,
        dog: Option<&str>,
    ) -> Result<(&'s str, bool), BadLine> {
        self.series_labelled(name, influx, dog, &[], false)
    }

    /// [`SeriesNamer::series`] with the `labels` a mapping rule gave: beside the line's tags,
    /// and over a tag of the same key unless `honor_tags` (statsd_exporter's `honor_labels`).
    pub fn series_labelled<'s>(
        &'s mut self,
        name: &'s str,
        influx: Option<&str>,
        dog: Option<&str>,
        labels: &[(String, String)],
        honor_tags: bool,
    ) -> Result<(&'s str, bool), BadLine> {
        let tags = match (influx, dog) {
            (Some(t), _) => Some((t, '=')),
            (None, Some(t)) => Some((t, ':')),
            (None, None) => None,
        };
        if tags.is_none()
            && labels.is_empty()
            && (!self.sanitize || name.bytes().all(name_byte_allowed))
        {
            if name.is_empty() {
                return Err(BadLine::EmptyName);
            }
            return Ok((name, false));
        }

        self.out.clear();
        let mut renamed = self.push_name(name);
        if self.out.is_empty() {
            return Err(BadLine::EmptyName);
        }
        self.tag_text.clear();
        self.tags.clear();
        if let Some((text, kv_separator)) = tags {
            renamed |= self.collect_tags(text, kv_separator);
        }
        for (key, value) in labels {
            let text = &self.tag_text;
            let tagged = |t: &(Range<usize>, Range<usize>)| text[t.0.clone()] == *key;
            if self.tags.iter().any(tagged) {
                if honor_tags {
                    continue;
                }
                let text = &self.tag_text;
                self.tags.retain(|t| text[t.0.clone()] != *key);
            }
            let key_range = self.push_tag_part(key, true, &mut renamed);
            let value_range = self.push_tag_part(value, false, &mut renamed);
            self.tags.push((key_range, value_range));
        }
        let text = &self.tag_text;
        self.tags.sort_unstable_by(|a, b| {
            (&text[a.0.clone()], &text[a.1.clone()]).cmp(&(&text[b.0.clone()], &text[b.1.clone()]))
        });
        self.tags.dedup_by(|a, b| {
            text[a.0.clone()] == text[b.0.clone()] && text[a.1.clone()] == text[b.1.clone()]
        });
        for (key, value) in &self.tags {
            self.out.push(';');
            self.out.push_str(&text[key.clone()]);
            if !value.is_empty() {
                self.out.push('=');
                self.out.push_str(&text[value.clone()]);
            }
        }
        Ok((&self.out, renamed))
    }

    /// Appends the metric name to `out`, sanitized when switched on.
    fn push_name(&mut self, name: &str) -> bool {
        if !self.sanitize {
            self.out.push_str(name);
            return false;
        }
        sanitize_into(name, &mut self.out, name_byte_allowed)
    }

    /// Adds `k<sep>v,k2,...` to `tag_text`/`tags`; tags whose key is empty are dropped.
    fn collect_tags(&mut self, text: &str, kv_separator: char) -> bool {
        let mut renamed = false;
        for tag in text.split(',').filter(|t| !t.is_empty()) {
            // `|#a:b,#c:d`: a `#` before each DogStatsD tag is a separator, as statsd_exporter
            // reads it, not part of the key.
            let tag = match kv_separator {
                ':' => tag.strip_prefix('#').unwrap_or(tag),
                _ => tag,
            };
            let (key, value) = tag.split_once(kv_separator).unwrap_or((tag, ""));
            if self.drop_tags.iter().any(|dropped| dropped == key) {
                continue;
            }
            let key_range = self.push_tag_part(key, true, &mut renamed);
            let value_range = self.push_tag_part(value, false, &mut renamed);
            if key_range.is_empty() {
                renamed = true;
                continue;
            }
            self.tags.push((key_range, value_range));
        }
        renamed
    }

    fn push_tag_part(&mut self, part: &str, is_key: bool, renamed: &mut bool) -> Range<usize> {
        let start = self.tag_text.len();
        if self.sanitize {
            *renamed |= clean_tag_into(part, &mut self.tag_text, is_key);
        } else {
            self.tag_text.push_str(part);
        }
        start..self.tag_text.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn series(
        sanitize: bool,
        name: &str,
        influx: Option<&str>,
        dog: Option<&str>,
    ) -> (String, bool) {
        let mut namer = SeriesNamer::new(sanitize);
        let (s, r) = namer.series(name, influx, dog).unwrap();
        (s.to_string(), r)
    }

    #[test]
    fn plain_name_is_borrowed_unchanged() {
        assert_eq!(
            series(true, "hits.page-1_x", None, None),
            ("hits.page-1_x".into(), false)
        );
    }

    #[test]
    fn sanitizing_like_etsy() {
        assert_eq!(series(true, "my key", None, None), ("my_key".into(), true));
        assert_eq!(
            series(true, "my  \t key", None, None),
            ("my_key".into(), true)
        );
        assert_eq!(series(true, "a/b", None, None), ("a-b".into(), true));
        assert_eq!(series(true, "a$b", None, None), ("ab".into(), true));
        assert_eq!(series(true, "héllo", None, None), ("hllo".into(), true));
    }

    #[test]
    fn sanitizing_can_be_switched_off() {
        assert_eq!(series(false, "a$b c", None, None), ("a$b c".into(), false));
    }

    #[test]
    fn name_that_sanitizes_to_nothing_is_empty() {
        let mut namer = SeriesNamer::new(true);
        assert_eq!(namer.series("$$", None, None), Err(BadLine::EmptyName));
        assert_eq!(
            namer.series("$$", None, Some("a:b")),
            Err(BadLine::EmptyName)
        );
    }

    #[test]
    fn tags_sorted_by_key_then_value() {
        let a = series(true, "a", None, Some("env:prod,x"));
        let b = series(true, "a", None, Some("x,env:prod"));
        assert_eq!(a, ("a;env=prod;x".into(), false));
        assert_eq!(a, b);
        assert_eq!(series(true, "a", None, Some("k:2,k:1")).0, "a;k=1;k=2");
    }

    #[test]
    fn influx_tags_fold_the_same_way() {
        assert_eq!(series(true, "a", Some("env=prod"), None).0, "a;env=prod");
        assert_eq!(
            series(true, "a", Some("z=1,b=2"), None).0,
            series(true, "a", None, Some("b:2,z:1")).0
        );
    }

    /// Tag keys and values as sent, but for what the series form cannot hold; a case each.
    #[test]
    fn tag_values_are_kept_as_sent() {
        for (case, tags, want, renamed) in [
            ("a path", "route:/cart", "a;route=/cart", false),
            ("a URL", "url:http://a/b?x=1", "a;url=http://a/b?x=1", false),
            ("paths that differ stay apart", "k:a/b", "a;k=a/b", false),
            (
                "non-ASCII letters",
                "city:Zürich,名:値",
                "a;city=Zürich;名=値",
                false,
            ),
            ("a value may hold =", "q:x=1", "a;q=x=1", false),
            ("; in a value", "k:x;y", "a;k=x_y", true),
            ("whitespace runs", "k:a  b\tc", "a;k=a_b_c", true),
            ("control characters", "k:a\u{7}b", "a;k=ab", true),
        ] {
            assert_eq!(
                series(true, "a", None, Some(tags)),
                (want.to_string(), renamed),
                "{case}"
            );
        }
        assert_eq!(
            series(true, "a", Some("k=v=w"), None),
            ("a;k=v=w".into(), false),
            "an InfluxDB tag splits at its first ="
        );
        assert_eq!(
            series(true, "a", None, Some("k=x:v")),
            ("a;k_x=v".into(), true),
            "= in a key"
        );
    }

    #[test]
    fn duplicate_and_empty_tags() {
        assert_eq!(series(true, "a", None, Some("x,,x")).0, "a;x");
        assert_eq!(
            series(true, "a", None, Some(":v,k:v")),
            ("a;k=v".into(), true)
        );
    }
}
