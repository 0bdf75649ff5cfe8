//! DogStatsD events (`_e{<title len>,<text len>}:<title>|<text>|...`) and service checks
//! (`_sc|<name>|<status>|...`), parsed with their lengths checked.
//!
//! As datadog-agent and Telegraf do: every optional field is one `|`-separated field, the
//! message `m:` too (what a client puts after it, `|c:<container>` or `|#tags`, is not part of
//! it); an optional field that does not parse (`|t:test`, `|d:abc`) or is not known is ignored
//! and counted, the rest kept; the escaped newline `\n` that clients send in an event's text and
//! a check's message is a newline.

use std::borrow::Cow;

use super::{BadLine, utf8, value};

/// An event's alert type, which becomes the severity of its log entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlertType {
    Error,
    Warning,
    Info,
    Success,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Event<'a> {
    pub title: &'a str,
    pub text: Cow<'a, str>,
    pub timestamp: Option<u64>,
    pub host: Option<&'a str>,
    pub aggregation_key: Option<&'a str>,
    pub priority: Option<&'a str>,
    pub source: Option<&'a str>,
    pub alert_type: AlertType,
    pub tags: Option<&'a str>,
    /// Optional fields not understood, or whose value did not parse; ignored.
    pub unknown_fields: u32,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServiceCheck<'a> {
    pub name: &'a str,
    /// 0 ok, 1 warning, 2 critical, 3 unknown.
    pub status: u8,
    pub timestamp: Option<u64>,
    pub host: Option<&'a str>,
    pub tags: Option<&'a str>,
    pub message: Option<Cow<'a, str>>,
    /// Optional fields not understood, or whose value did not parse; ignored.
    pub unknown_fields: u32,
}

/// The text with each escaped newline (`\n`, two bytes) as a newline.
fn unescape(text: &str) -> Cow<'_, str> {
    if text.contains("\\n") {
        Cow::Owned(text.replace("\\n", "\n"))
    } else {
        Cow::Borrowed(text)
    }
}

fn parse_len(b: &[u8]) -> Option<usize> {
    if b.is_empty() || b.len() > 6 || !b.iter().all(u8::is_ascii_digit) {
        return None;
    }
    std::str::from_utf8(b).ok()?.parse().ok()
}

/// `_e{5,4}:title|text[|d:ts][|h:host][|k:key][|p:prio][|s:source][|t:type][|#tags]`; the lengths
/// are byte counts of title and text and must match exactly.
pub fn parse_event(line: &[u8]) -> Result<Event<'_>, BadLine> {
    let bad = BadLine::InvalidEvent;
    let body = line.strip_prefix(b"_e{").ok_or(bad)?;
    let close = body.iter().position(|b| *b == b'}').ok_or(bad)?;
    let (lens, rest) = body.split_at(close);
    let (title_len, text_len) = {
        let comma = lens.iter().position(|b| *b == b',').ok_or(bad)?;
        (
            parse_len(&lens[..comma]).ok_or(bad)?,
            parse_len(&lens[comma + 1..]).ok_or(bad)?,
        )
    };
    let rest = rest.strip_prefix(b"}:").ok_or(bad)?;
    if title_len == 0 || rest.len() < title_len + 1 + text_len {
        return Err(bad);
    }
    let (title, rest) = rest.split_at(title_len);
    let rest = rest.strip_prefix(b"|").ok_or(bad)?;
    let (text, rest) = rest.split_at(text_len);
    if !rest.is_empty() && rest[0] != b'|' {
        return Err(bad);
    }
    let mut event = Event {
        title: utf8(title).map_err(|_| bad)?,
        text: unescape(utf8(text).map_err(|_| bad)?),
        timestamp: None,
        host: None,
        aggregation_key: None,
        priority: None,
        source: None,
        alert_type: AlertType::Info,
        tags: None,
        unknown_fields: 0,
    };
    for field in rest.split(|b| *b == b'|').skip(1) {
        let field = utf8(field).map_err(|_| bad)?;
        if let Some(tags) = field.strip_prefix('#') {
            event.tags = Some(tags);
            continue;
        }
        let known = match field.split_at_checked(2) {
            Some(("d:", v)) => value::parse_timestamp(v.as_bytes())
                .map(|ts| event.timestamp = Some(ts))
                .is_ok(),
            Some(("h:", v)) => {
                event.host = Some(v);
                true
            }
            Some(("k:", v)) => {
                event.aggregation_key = Some(v);
                true
            }
            Some(("p:", v)) => {
                event.priority = Some(v);
                true
            }
            Some(("s:", v)) => {
                event.source = Some(v);
                true
            }
            Some(("t:", v)) => alert_type(v).map(|t| event.alert_type = t).is_some(),
            // The origin of the sender (container id, cardinality): not stored.
            Some(("c:", _)) => true,
            _ => field.starts_with("card:"),
        };
        event.unknown_fields += u32::from(!known);
    }
    Ok(event)
}

fn alert_type(v: &str) -> Option<AlertType> {
    Some(match v {
        "error" => AlertType::Error,
        "warning" => AlertType::Warning,
        "info" => AlertType::Info,
        "success" => AlertType::Success,
        _ => return None,
    })
}

/// `_sc|name|status[|d:ts][|h:host][|#tags][|m:message][|c:container]...`.
pub fn parse_service_check(line: &[u8]) -> Result<ServiceCheck<'_>, BadLine> {
    let bad = BadLine::InvalidServiceCheck;
    let line = utf8(line).map_err(|_| bad)?;
    let mut parts = line.splitn(3, '|').skip(1);
    let name = parts.next().filter(|n| !n.is_empty()).ok_or(bad)?;
    let rest = parts.next().ok_or(bad)?;
    let (status, fields) = rest.split_once('|').unwrap_or((rest, ""));
    let status = match status {
        "0" => 0,
        "1" => 1,
        "2" => 2,
        "3" => 3,
        _ => return Err(bad),
    };
    let mut check = ServiceCheck {
        name,
        status,
        timestamp: None,
        host: None,
        tags: None,
        message: None,
        unknown_fields: 0,
    };
    for field in fields.split('|').filter(|f| !f.is_empty()) {
        let known = if let Some(tags) = field.strip_prefix('#') {
            check.tags = Some(tags);
            true
        } else if let Some(message) = field.strip_prefix("m:") {
            check.message = Some(unescape(message));
            true
        } else if let Some(ts) = field.strip_prefix("d:") {
            value::parse_timestamp(ts.as_bytes())
                .map(|ts| check.timestamp = Some(ts))
                .is_ok()
        } else if let Some(host) = field.strip_prefix("h:") {
            check.host = Some(host);
            true
        } else {
            field.starts_with("c:") || field.starts_with("card:")
        };
        check.unknown_fields += u32::from(!known);
    }
    Ok(check)
}
