//! Log entries (docs/layout.md, "The Redis layout", logs): what DogStatsD events and service checks become, named and graded
//! the way the book's `log_recent` / `log_common` expect.

use crate::protocol::{AlertType, Event, ServiceCheck};

/// The book's severities, as they appear in `recent:<name>:<severity>`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    Info,
    Warning,
    Error,
    Critical,
    Unknown,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Info => "info",
            Severity::Warning => "warning",
            Severity::Error => "error",
            Severity::Critical => "critical",
            Severity::Unknown => "unknown",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct LogEntry {
    pub name: String,
    pub severity: Severity,
    pub message: String,
}

fn tag_value<'a>(tags: Option<&'a str>, key: &str) -> Option<&'a str> {
    tags?.split(',').find_map(|t| {
        t.split_once(':')
            .filter(|(k, v)| *k == key && !v.is_empty())
            .map(|(_, v)| v)
    })
}

impl LogEntry {
    /// Named by the `service` tag, else the source, else `events`; graded by the alert type.
    pub fn from_event(event: &Event<'_>) -> LogEntry {
        let name = tag_value(event.tags, "service")
            .or(event.source.filter(|s| !s.is_empty()))
            .unwrap_or("events");
        let severity = match event.alert_type {
            AlertType::Error => Severity::Error,
            AlertType::Warning => Severity::Warning,
            AlertType::Info | AlertType::Success => Severity::Info,
        };
        let message = if event.text.is_empty() {
            event.title.to_string()
        } else {
            format!("{}: {}", event.title, event.text)
        };
        LogEntry {
            name: name.to_string(),
            severity,
            message,
        }
    }

    /// Named by the check; status 0/1/2/3 graded info/warning/critical/unknown.
    pub fn from_service_check(check: &ServiceCheck<'_>) -> LogEntry {
        let (severity, word) = match check.status {
            0 => (Severity::Info, "ok"),
            1 => (Severity::Warning, "warning"),
            2 => (Severity::Critical, "critical"),
            _ => (Severity::Unknown, "unknown"),
        };
        LogEntry {
            name: check.name.to_string(),
            severity,
            message: check.message.as_deref().unwrap_or(word).to_string(),
        }
    }
}
