//! Carbon's plaintext protocol (`path value timestamp`, docs/carbon.md), read as carbon-cache
//! 1.1 reads it: the line split on whitespace into exactly three fields, value and timestamp
//! as Python's `float()` reads them, a NaN value dropped, a timestamp of `-1` meaning now, and
//! a tagged path (`disk.used;host=a;env=prod`) normalized as carbon's `TaggedSeries` formats
//! it.

use std::borrow::Cow;

use super::BadLine;

/// One point of a carbon line.
#[derive(Clone, Debug, PartialEq)]
pub struct Point<'a> {
    /// The path, normalized ([`normalize`]).
    pub path: Cow<'a, str>,
    /// The path as sent (what carbon's lists match).
    pub sent: &'a str,
    pub value: f64,
    /// Unix seconds as sent; `None`: now (carbon's `-1`).
    pub at: Option<f64>,
}

/// What a line is: a point, or a point carbon drops without a word (a NaN value, its path as
/// sent), which the agent counts.
#[derive(Clone, Debug, PartialEq)]
pub enum Parsed<'a> {
    Point(Point<'a>),
    NotANumber(&'a str),
}

impl<'a> Parsed<'a> {
    /// The path as sent (what carbon's lists match).
    pub fn sent(&self) -> &'a str {
        match self {
            Parsed::Point(p) => p.sent,
            Parsed::NotANumber(sent) => sent,
        }
    }
}

/// Parses one line (without its newline).
pub fn parse_line(line: &[u8]) -> Result<Parsed<'_>, BadLine> {
    let line = std::str::from_utf8(line).map_err(|_| BadLine::InvalidUtf8)?;
    let [path, value, at] = if line.is_ascii() {
        ascii_fields(line)
    } else {
        three(line.split_whitespace())
    }
    .ok_or(BadLine::FieldCount)?;
    let value = python_float(value).ok_or(BadLine::InvalidValue)?;
    let at = python_float(at).ok_or(BadLine::InvalidTimestamp)?;
    point(path, value, at)
}

/// Exactly three fields, or `None`.
fn three<'a>(mut fields: impl Iterator<Item = &'a str>) -> Option<[&'a str; 3]> {
    match (fields.next(), fields.next(), fields.next(), fields.next()) {
        (Some(a), Some(b), Some(c), None) => Some([a, b, c]),
        _ => None,
    }
}

/// The fields `str::split_whitespace` finds in an ASCII line (whose whitespace is these six
/// bytes), found a byte at a time: splitting by `char` decoded each one and was an eighth of the
/// agent's CPU on a batch of carbon lines (docs/benchmarks.md, "Carbon lines read as bytes").
fn ascii_fields(line: &str) -> Option<[&str; 3]> {
    let space = |b: u8| matches!(b, b' ' | b'\t' | b'\n' | 0x0b | 0x0c | b'\r');
    let bytes = line.as_bytes();
    let (mut fields, mut n, mut i) = ([""; 3], 0, 0);
    while i < bytes.len() {
        if space(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        while i < bytes.len() && !space(bytes[i]) {
            i += 1;
        }
        // Any byte of an ASCII text is a character's boundary.
        *fields.get_mut(n)? = &line[start..i];
        n += 1;
    }
    (n == 3).then_some(fields)
}

/// A point from its three fields as numbers (a plaintext line's, or a pickle item's), as
/// carbon's `metricReceived` takes it.
pub fn point(path: &str, value: f64, at: f64) -> Result<Parsed<'_>, BadLine> {
    if !at.is_finite() {
        // Carbon's int() of it raises: the connection (or the rest of the datagram) is lost
        // there; here only the line.
        return Err(BadLine::InvalidTimestamp);
    }
    let sent = path;
    let path = normalize(path)?;
    if value.is_nan() {
        return Ok(Parsed::NotANumber(sent));
    }
    if value.is_infinite() {
        // Whisper would keep it; no reader can show it (JSON has no infinity).
        return Err(BadLine::OutOfRange);
    }
    // Carbon takes int(timestamp) == -1 as now: any timestamp in (-2, -1].
    let at = (at.trunc() != -1.0).then_some(at);
    Ok(Parsed::Point(Point {
        path,
        sent,
        value,
        at,
    }))
}

/// A number as Python's `float()` reads it: Rust's own syntax (signs, exponents, `inf`,
/// `infinity`, `nan` in any case), plus underscores between digits (`1_000`).
pub(crate) fn python_float(text: &str) -> Option<f64> {
    if !text.contains('_') {
        return text.parse().ok();
    }
    let bytes = text.as_bytes();
    let between_digits = bytes.iter().enumerate().all(|(i, &b)| {
        b != b'_'
            || (i > 0
                && bytes[i - 1].is_ascii_digit()
                && bytes.get(i + 1).is_some_and(u8::is_ascii_digit))
    });
    between_digits
        .then(|| text.replace('_', "").parse().ok())
        .flatten()
}

/// A path as the agent keeps it. Empty components are left out (`a..b` and `.a.b.` are
/// `a.b`): carbon keeps the text but writes them to the same whisper file, `a/b.wsp`, which
/// is the series graphite-web shows. A tagged path (`name;k=v;…`) is formatted as carbon's
/// `TaggedSeries` formats it: leading `~` off the name, a repeated tag's last value, a `name`
/// tag replaced by the name, the `;k=v` texts sorted as strings.
pub fn normalize(path: &str) -> Result<Cow<'_, str>, BadLine> {
    if plain(path.as_bytes()) {
        return Ok(Cow::Borrowed(path));
    }
    formatted(path)
}

/// [`normalize`] of any path, plain or not.
fn formatted(path: &str) -> Result<Cow<'_, str>, BadLine> {
    let (name, tags) = match path.split_once(';') {
        None => (path, None),
        Some((name, tags)) => (name, Some(tags)),
    };
    let name = name.trim_start_matches('~');
    let name: Cow<str> = if name.split('.').any(str::is_empty) {
        let parts: Vec<&str> = name.split('.').filter(|c| !c.is_empty()).collect();
        Cow::Owned(parts.join("."))
    } else {
        Cow::Borrowed(name)
    };
    if name.is_empty() {
        return Err(BadLine::EmptyName);
    }
    let Some(tags) = tags else {
        return Ok(name);
    };
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    for tag in tags.split(';') {
        let (key, value) = tag.split_once('=').ok_or(BadLine::InvalidTags)?;
        let bad_key = key.is_empty() || key.contains(['!', '^']);
        let bad_value = value.is_empty() || value.starts_with('~');
        if bad_key || bad_value {
            return Err(BadLine::InvalidTags);
        }
        if key == "name" {
            continue;
        }
        match pairs.iter_mut().find(|(k, _)| *k == key) {
            Some(pair) => pair.1 = value,
            None => pairs.push((key, value)),
        }
    }
    Ok(Cow::Owned(tagged(&name, pairs, path.len())))
}

/// `name` and its tags as carbon's `TaggedSeries` writes them, the `;k=v` texts sorted as
/// strings: compared as those texts without making them (a text, a sort of texts and their
/// joining took a tagged line 0.8 µs).
fn tagged(name: &str, mut pairs: Vec<(&str, &str)>, capacity: usize) -> String {
    fn text<'a>((k, v): &(&'a str, &'a str)) -> impl Iterator<Item = u8> + 'a {
        k.bytes().chain([b'=']).chain(v.bytes())
    }
    pairs.sort_unstable_by(|a, b| text(a).cmp(text(b)));
    let mut out = String::with_capacity(capacity);
    out.push_str(name);
    for (k, v) in pairs {
        for part in [";", k, "=", v] {
            out.push_str(part);
        }
    }
    out
}

/// Whether a path is kept as sent (most are): not empty, no tags, no leading `~`, no empty
/// component; one pass over its bytes.
fn plain(path: &[u8]) -> bool {
    let mut prev = b'.';
    for &b in path {
        if b == b';' || (b == b'.' && prev == b'.') {
            return false;
        }
        prev = b;
    }
    prev != b'.' && path.first() != Some(&b'~')
}

#[cfg(test)]
mod tests {
    use super::*;

    fn point(line: &str) -> Point<'_> {
        match parse_line(line.as_bytes()) {
            Ok(Parsed::Point(p)) => p,
            other => panic!("{line:?}: {other:?}"),
        }
    }

    #[test]
    fn lines_as_carbon_reads_them() {
        let p = point("a.b 1.5 1700000000");
        assert_eq!(
            (&*p.path, p.value, p.at),
            ("a.b", 1.5, Some(1_700_000_000.0))
        );
        // Any run of whitespace, tabs and a carriage return included.
        let p = point("  a.b\t\t-2e3   1700000000.9 \r");
        assert_eq!((p.value, p.at), (-2000.0, Some(1_700_000_000.9)));
        assert_eq!(point("a 1_000 +10").value, 1000.0);
        // int(timestamp) == -1 is now.
        assert_eq!(point("a 1 -1").at, None);
        assert_eq!(point("a 1 -1.9").at, None);
        assert_eq!(point("a 1 -2").at, Some(-2.0));
        assert_eq!(
            parse_line(b"a nan 100"),
            Ok(Parsed::NotANumber("a")),
            "a NaN value is dropped"
        );
    }

    #[test]
    fn bad_lines_name_their_reason() {
        for (line, reason) in [
            (&b""[..], BadLine::FieldCount),
            (b"a 1", BadLine::FieldCount),
            (b"a 1 2 3", BadLine::FieldCount),
            (b"a b c", BadLine::InvalidValue),
            (b"a 0x10 1", BadLine::InvalidValue),
            (b"a 1_ 1", BadLine::InvalidValue),
            (b"a 1 N", BadLine::InvalidTimestamp),
            (b"a 1 nan", BadLine::InvalidTimestamp),
            (b"a 1 inf", BadLine::InvalidTimestamp),
            (b"a inf 1", BadLine::OutOfRange),
            (b"\xff 1 1", BadLine::InvalidUtf8),
            (b"... 1 1", BadLine::EmptyName),
            (b"a;k 1 1", BadLine::InvalidTags),
            (b"a;=v 1 1", BadLine::InvalidTags),
            (b"a;k= 1 1", BadLine::InvalidTags),
            (b"a;k=~v 1 1", BadLine::InvalidTags),
            (b"a;k!=v 1 1", BadLine::InvalidTags),
            (b";k=v 1 1", BadLine::EmptyName),
        ] {
            assert_eq!(
                parse_line(line),
                Err(reason),
                "{:?}",
                String::from_utf8_lossy(line)
            );
        }
    }

    proptest::proptest! {
        #![proptest_config(proptest::prelude::ProptestConfig::with_cases(20000))]
        /// The byte-wise ways (an ASCII line's fields, a plain path) find what the general
        /// ones find, over every kind of whitespace, ASCII or not, and every character a path
        /// is normalized by.
        #[test]
        fn the_fast_ways_agree_with_the_general_ones(
            chars in proptest::collection::vec(proptest::sample::select(vec![
                ' ', '\t', '\n', '\x0b', '\x0c', '\r', '\x1c', '\u{85}', '\u{a0}', '\u{2003}',
                '.', ';', '=', '~', '!', '_', 'a', 'b', '1', '-', 'é',
            ]), 0..24)
        ) {
            let line: String = chars.into_iter().collect();
            let general = three(line.split_whitespace());
            if line.is_ascii() {
                proptest::prop_assert_eq!(ascii_fields(&line), general);
            }
            for field in line.split_whitespace() {
                proptest::prop_assert_eq!(normalize(field), formatted(field));
            }
        }

        /// Tags sorted as their texts are, whatever the keys and values hold.
        #[test]
        fn tags_are_sorted_as_their_texts(
            tags in proptest::collection::btree_map("[a-c.=_~!]{1,3}", "[a-c=.]{1,3}", 0..6)
        ) {
            let pairs: Vec<(&str, &str)> = tags
                .iter()
                .filter(|(k, _)| !k.contains('='))
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect();
            let mut texts: Vec<String> = pairs.iter().map(|(k, v)| format!(";{k}={v}")).collect();
            texts.sort_unstable();
            proptest::prop_assert_eq!(tagged("m", pairs, 0), format!("m{}", texts.concat()));
        }
    }

    #[test]
    fn paths_normalized_as_carbon_names_them() {
        for (sent, kept) in [
            ("a.b", "a.b"),
            ("a..b", "a.b"),
            (".a.b.", "a.b"),
            ("~a.b", "a.b"),
            ("disk.used;host=a;env=prod", "disk.used;env=prod;host=a"),
            // Repeated: the last; `name` is the path's; sorted as `;k=v` texts.
            ("m;env=test2;env=test", "m;env=test"),
            ("m;name=other;a=1", "m;a=1"),
            ("m;host=a;host2=b", "m;host2=b;host=a"),
            ("m;k=v=w", "m;k=v=w"),
        ] {
            assert_eq!(normalize(sent).as_deref(), Ok(kept), "{sent}");
        }
    }
}
