//! DogStatsD events (`_e{<title len>,<text len>}:<title>|<text>|...`) and service checks
//! (`_sc|<name>|<status>|...`), parsed with their lengths and fields checked.

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
    pub text: &'a str,
    pub timestamp: Option<u64>,
    pub host: Option<&'a str>,
    pub aggregation_key: Option<&'a str>,
    pub priority: Option<&'a str>,
    pub source: Option<&'a str>,
    pub alert_type: AlertType,
    pub tags: Option<&'a str>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct ServiceCheck<'a> {
    pub name: &'a str,
    /// 0 ok, 1 warning, 2 critical, 3 unknown.
    pub status: u8,
    pub timestamp: Option<u64>,
    pub host: Option<&'a str>,
    pub tags: Option<&'a str>,
    pub message: Option<&'a str>,
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
        text: utf8(text).map_err(|_| bad)?,
        timestamp: None,
        host: None,
        aggregation_key: None,
        priority: None,
        source: None,
        alert_type: AlertType::Info,
        tags: None,
    };
    for field in rest.split(|b| *b == b'|').skip(1) {
        let field = utf8(field).map_err(|_| bad)?;
        if let Some(tags) = field.strip_prefix('#') {
            event.tags = Some(tags);
            continue;
        }
        match field.split_at_checked(2) {
            Some(("d:", v)) => {
                event.timestamp = Some(value::parse_timestamp(v.as_bytes()).map_err(|_| bad)?)
            }
            Some(("h:", v)) => event.host = Some(v),
            Some(("k:", v)) => event.aggregation_key = Some(v),
            Some(("p:", v)) => event.priority = Some(v),
            Some(("s:", v)) => event.source = Some(v),
            Some(("t:", v)) => {
                event.alert_type = match v {
                    "error" => AlertType::Error,
                    "warning" => AlertType::Warning,
                    "info" => AlertType::Info,
                    "success" => AlertType::Success,
                    _ => return Err(bad),
                }
            }
            _ => {}
        }
    }
    Ok(event)
}

/// `_sc|name|status[|d:ts][|h:host][|#tags][|m:message]`; the message runs to the end of line.
pub fn parse_service_check(line: &[u8]) -> Result<ServiceCheck<'_>, BadLine> {
    let bad = BadLine::InvalidServiceCheck;
    let line = utf8(line).map_err(|_| bad)?;
    let mut parts = line.splitn(3, '|').skip(1);
    let name = parts.next().filter(|n| !n.is_empty()).ok_or(bad)?;
    let rest = parts.next().ok_or(bad)?;
    let (status, mut fields) = rest.split_once('|').unwrap_or((rest, ""));
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
    };
    while !fields.is_empty() {
        if let Some(message) = fields.strip_prefix("m:") {
            check.message = Some(message);
            break;
        }
        let (field, rest) = fields.split_once('|').unwrap_or((fields, ""));
        fields = rest;
        if let Some(tags) = field.strip_prefix('#') {
            check.tags = Some(tags);
        } else if let Some(ts) = field.strip_prefix("d:") {
            check.timestamp = Some(value::parse_timestamp(ts.as_bytes()).map_err(|_| bad)?);
        } else if let Some(host) = field.strip_prefix("h:") {
            check.host = Some(host);
        }
    }
    Ok(check)
}
