//! The agent's own metrics (docs/operations.md, "Metrics"): every name, label and description in one place.
//!
//! Each agent owns its recorder rather than installing a global one, so several agents in one
//! process (the tests) keep separate counts. Hot paths hold the returned handles, which are
//! plain atomics.

use metrics::{
    Counter, Gauge, Histogram, Key, KeyName, Label, Level, Metadata, Recorder, SharedString, Unit,
};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

use crate::protocol::{BadLine, MetricType};

/// How lines arrive; the label of the receive metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Transport {
    Udp,
    Tcp,
    /// Unix datagram socket.
    Unixgram,
    /// Unix stream socket.
    Unix,
    /// Carbon's plaintext lines over TCP (`carbon_tcp`) and UDP (`carbon_udp`).
    CarbonTcp,
    CarbonUdp,
    /// Carbon's pickle protocol over TCP (`carbon_pickle`).
    CarbonPickle,
}

impl Transport {
    pub const ALL: [Transport; 7] = [
        Transport::Udp,
        Transport::Tcp,
        Transport::Unixgram,
        Transport::Unix,
        Transport::CarbonTcp,
        Transport::CarbonUdp,
        Transport::CarbonPickle,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Transport::Udp => "udp",
            Transport::Tcp => "tcp",
            Transport::Unixgram => "unixgram",
            Transport::Unix => "unix",
            Transport::CarbonTcp => "carbon_tcp",
            Transport::CarbonUdp => "carbon_udp",
            Transport::CarbonPickle => "carbon_pickle",
        }
    }

    /// Whether it carries carbon's lines rather than StatsD's.
    pub fn is_carbon(self) -> bool {
        matches!(
            self,
            Transport::CarbonTcp | Transport::CarbonUdp | Transport::CarbonPickle
        )
    }
}

/// Why Redis refused one write of an applied chunk (the rest of the chunk was applied).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteFailure {
    /// The key holds another type: another program's key under our names.
    WrongType,
    /// `HINCRBY` would leave the signed 64-bit range.
    Overflow,
    /// The hash field holds something that is not an integer.
    NotInteger,
    /// Statistics merged with stored values would be NaN.
    NotANumber,
    /// The Redis user's ACL refuses the command or the key.
    NoPermission,
    Other,
}

impl WriteFailure {
    pub const ALL: [WriteFailure; 6] = [
        WriteFailure::WrongType,
        WriteFailure::Overflow,
        WriteFailure::NotInteger,
        WriteFailure::NotANumber,
        WriteFailure::NoPermission,
        WriteFailure::Other,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            WriteFailure::WrongType => "wrong_type",
            WriteFailure::Overflow => "overflow",
            WriteFailure::NotInteger => "not_integer",
            WriteFailure::NotANumber => "not_a_number",
            WriteFailure::NoPermission => "no_permission",
            WriteFailure::Other => "other",
        }
    }
}

/// Why the HTTP port turned a request away (`basic_auth_users` of the web configuration file).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AuthFailure {
    /// No `Authorization: Basic` header, or one that does not decode.
    Missing,
    UnknownUser,
    WrongPassword,
    /// Answered 503: the request waited too long for its turn at bcrypt.
    Busy,
}

impl AuthFailure {
    pub const ALL: [AuthFailure; 4] = [
        AuthFailure::Missing,
        AuthFailure::UnknownUser,
        AuthFailure::WrongPassword,
        AuthFailure::Busy,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            AuthFailure::Missing => "missing",
            AuthFailure::UnknownUser => "unknown_user",
            AuthFailure::WrongPassword => "wrong_password",
            AuthFailure::Busy => "busy",
        }
    }
}

const PREFIX: &str = "statsd_redis_";

/// A log line for a condition that recurs (a failed accept, a dropped window, a refused write,
/// a bad line) at most once per [`LogLimit::PERIOD`]; the metrics count every occurrence.
#[derive(Debug, Default)]
pub struct LogLimit {
    last: Option<std::time::Instant>,
    /// Occurrences since the last line.
    since: u64,
}

impl LogLimit {
    /// Ten seconds: one line per condition stays readable in any log.
    pub const PERIOD: std::time::Duration = std::time::Duration::from_secs(10);

    /// An occurrence: `Some(n)` when it is to be logged, `n` the occurrences the line stands
    /// for (this one and those left unlogged since the last line).
    pub fn occurred(&mut self) -> Option<u64> {
        self.since += 1;
        let now = std::time::Instant::now();
        if self
            .last
            .is_some_and(|t| now.duration_since(t) < LogLimit::PERIOD)
        {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.since))
    }
}

/// Whether windows are being written, as `/readyz` answers it: from the writer's own state
/// (its last attempt, the oldest window waiting), never from a Redis call per request.
#[derive(Debug, Default)]
pub struct Readiness(std::sync::Mutex<ReadyState>);

#[derive(Debug, Default)]
struct ReadyState {
    /// When the writer last found Redis taking its writes: a window written, or with nothing to
    /// write, a `PING` answered.
    last_ok: Option<std::time::Instant>,
    /// Why its last attempt did not count, when it did not.
    failing: Option<String>,
    /// The start (Unix s) of the oldest window not yet written.
    oldest_waiting: Option<u64>,
    /// Windows waiting that the spool could not take: a crash would lose them.
    unspooled: usize,
}

impl Readiness {
    /// Not ready once the writer has not reached Redis, or the oldest window has waited, this
    /// long: windows are not being written.
    pub const STALE: std::time::Duration = std::time::Duration::from_secs(30);

    fn state(&self) -> std::sync::MutexGuard<'_, ReadyState> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The writer's last attempt reached Redis and was taken.
    pub fn written(&self) {
        let mut state = self.state();
        state.last_ok = Some(std::time::Instant::now());
        state.failing = None;
    }

    /// The writer's last attempt failed (`why`), or Redis refused most of its writes.
    pub fn failed(&self, why: String) {
        self.state().failing = Some(why);
    }

    /// The start of the oldest window waiting (`None` when none waits), and how many of those
    /// waiting the spool could not take.
    pub fn waiting(&self, oldest: Option<u64>, unspooled: usize) {
        let mut state = self.state();
        state.oldest_waiting = oldest;
        state.unspooled = unspooled;
    }

    /// What a crash would lose now, when it would lose windows: they are written all the same
    /// (so the agent is ready), but the spool could not take them.
    pub fn at_risk(&self) -> Option<String> {
        match self.state().unspooled {
            0 => None,
            n => Some(format!(
                "{n} windows waiting are in memory only (the spool could not take them): a crash now would lose them"
            )),
        }
    }

    /// `Ok` when windows are being written, else why not; `now` in Unix seconds.
    pub fn check(&self, now: u64) -> Result<(), String> {
        let state = self.state();
        if let Some(why) = &state.failing {
            return Err(format!("the last write to Redis failed: {why}"));
        }
        match state.last_ok {
            None => return Err("no write has reached Redis yet".into()),
            Some(t) if t.elapsed() > Readiness::STALE => {
                return Err(format!(
                    "no write has reached Redis for {} s",
                    t.elapsed().as_secs()
                ));
            }
            Some(_) => {}
        }
        match state.oldest_waiting {
            Some(start) if now.saturating_sub(start) > Readiness::STALE.as_secs() => Err(format!(
                "the oldest window waiting to be written is {} s old",
                now - start
            )),
            _ => Ok(()),
        }
    }
}

/// The outcomes of timestamped samples, in [`Telemetry::timestamped`]'s order.
pub const TIMESTAMP_OUTCOMES: [&str; 5] =
    ["earlier", "current", "too_old", "too_far_ahead", "ignored"];

/// Why a series of a window is left off the page; the label `reason` of
/// `statsd_redis_app_series_refused_total`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refused {
    /// The name already shows another type: the first type seen wins.
    TypeConflict,
    /// The name beside another would make the page invalid (a summary `x` and a counter
    /// `x_count`).
    NameCollision,
    /// Nothing is left of the name after escaping.
    EmptyName,
    /// A new series while the page already holds `max_series_per_window` series.
    SeriesCap,
}

impl Refused {
    pub const ALL: [Refused; 4] = [
        Refused::TypeConflict,
        Refused::NameCollision,
        Refused::EmptyName,
        Refused::SeriesCap,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Refused::TypeConflict => "type_conflict",
            Refused::NameCollision => "name_collision",
            Refused::EmptyName => "empty_name",
            Refused::SeriesCap => "series_cap",
        }
    }
}

/// The outcomes of carbon points, in [`Telemetry::carbon_points`]'s order.
pub const POINT_OUTCOMES: [&str; 7] = [
    "placed",
    "too_old",
    "too_far_ahead",
    "not_a_number",
    "series_cap",
    "blacklisted",
    "not_whitelisted",
];

/// Flush duration buckets: a healthy flush takes milliseconds; the upper buckets show a Redis
/// that is slow or timing out. Between 0.1 and 1 s, where a busy agent's flushes fall against
/// its 1 s window, they are 100 ms apart, so a p99 read from them is within 0.1 s.
const FLUSH_BUCKETS: [f64; 20] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9,
    1.0, 2.5, 5.0, 10.0,
];

/// Counts of what the readers received; one per reader, added to the shared handles after each
/// batch so the per-line path touches no shared memory.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Tally {
    pub packets: u64,
    pub bytes: u64,
    pub lines: u64,
    pub bad: [u64; BadLine::ALL.len()],
    pub samples: [u64; MetricType::ALL.len()],
    /// Of them, dropped by the filters.
    pub filtered: [u64; MetricType::ALL.len()],
    pub events: u64,
    pub service_checks: u64,
    pub unknown_fields: u64,
    pub names_sanitized: u64,
    pub truncated_datagrams: u64,
}

impl Tally {
    pub fn bad_lines(&self) -> u64 {
        self.bad.iter().sum()
    }
}

/// What one transport's readers received (labelled `transport`).
pub struct Received {
    pub packets: Counter,
    pub bytes: Counter,
    pub lines: Counter,
    pub bad: [Counter; BadLine::ALL.len()],
    pub samples: [Counter; MetricType::ALL.len()],
    pub events: Counter,
    pub service_checks: Counter,
    pub unknown_fields: Counter,
    pub names_sanitized: Counter,
    pub truncated_datagrams: Counter,
}

/// A stream transport's connections (labelled `transport`).
pub struct Connections {
    pub open: Gauge,
    pub accepted: Counter,
    pub at_limit: Counter,
    pub idle_closed: Counter,
}

pub struct Telemetry {
    handle: PrometheusHandle,
    /// Kept to register the metrics of what the configuration names (relay targets).
    recorder: metrics_exporter_prometheus::PrometheusRecorder,
    received: [Received; Transport::ALL.len()],
    connections: [Connections; 4],
    /// Samples dropped by the series cap, by type.
    pub samples_dropped: [Counter; MetricType::ALL.len()],
    /// Samples dropped by the filters, by type.
    pub samples_filtered: [Counter; MetricType::ALL.len()],
    pub logs_dropped: Counter,
    /// Series of a window left off the Prometheus page (`prometheus_app_metrics`), by
    /// [`Refused`].
    pub app_series_refused: [Counter; Refused::ALL.len()],
    /// Timestamped samples by outcome: [`TIMESTAMP_OUTCOMES`].
    pub timestamped: [Counter; 5],
    /// Carbon points by outcome: [`POINT_OUTCOMES`].
    pub carbon_points: [Counter; 7],
    pub kernel_drops: Counter,
    pub active_series: [Gauge; MetricType::ALL.len()],
    pub flushes_ok: Counter,
    pub flushes_failed: Counter,
    pub flush_duration: Histogram,
    pub backlog_windows: Gauge,
    pub last_flush_timestamp: Gauge,
    pub redis_up: Gauge,
    pub windows_dropped: Counter,
    pub backlog_bytes: Gauge,
    /// Spool writes that failed, by kind: a window's file, the state file.
    pub spool_window_errors: Counter,
    pub spool_state_errors: Counter,
    pub backlog_unspooled_windows: Gauge,
    pub spool_windows_loaded: Counter,
    pub chunks_applied_before: Counter,
    pub write_failures: [Counter; WriteFailure::ALL.len()],
    pub redis_errors: Counter,
    pub cleaner_passes: Counter,
    pub carbon_rollups: Counter,
    pub cleaner_members_visited: Counter,
    pub cleaner_slices_removed: Counter,
    pub cleaner_slices_moved: Counter,
    pub cleaner_counters_removed: Counter,
    pub cleaner_gauges_removed: Counter,
    pub cleaner_slowest_removed: Counter,
    pub cleaner_stats_removed: Counter,
    pub cleaner_pass_duration: Histogram,
    pub cleaner_lease_held: Gauge,
    pub redis_reconnects: Counter,
    pub replica_waits_short: Counter,
    pub chunks_guard_lost: Counter,
    pub redis_clock_skew: Gauge,
    /// Requests the HTTP port turned away, by [`AuthFailure`].
    pub http_auth_failures: [Counter; AuthFailure::ALL.len()],
    pub http_tls_handshake_failures: Counter,
    /// Redis's `maxmemory-policy` and whether it may evict keys, rendered with the process
    /// metrics (its label changes with the server's setting).
    redis_eviction: std::sync::Mutex<Option<(String, bool)>>,
    pub readiness: Readiness,
}

fn metadata() -> Metadata<'static> {
    Metadata::new(module_path!(), Level::INFO, Some(module_path!()))
}

fn key(name: &str, labels: &[(&'static str, &'static str)]) -> Key {
    let labels: Vec<Label> = labels.iter().map(|(k, v)| Label::new(*k, *v)).collect();
    Key::from_parts(format!("{PREFIX}{name}"), labels)
}

impl Telemetry {
    pub fn new() -> Telemetry {
        let recorder = PrometheusBuilder::new()
            .set_buckets_for_metric(
                Matcher::Full(format!("{PREFIX}flush_duration_seconds")),
                &FLUSH_BUCKETS,
            )
            .expect("bucket list is not empty")
            .set_buckets_for_metric(
                Matcher::Full(format!("{PREFIX}cleaner_pass_duration_seconds")),
                &FLUSH_BUCKETS,
            )
            .expect("bucket list is not empty")
            .build_recorder();
        let handle = recorder.handle();
        let r = &recorder;
        let counter = |name: &str, help: &'static str, labels: &[(&'static str, &'static str)]| {
            let k = key(name, labels);
            r.describe_counter(
                KeyName::from(k.name().to_string()),
                None,
                SharedString::const_str(help),
            );
            r.register_counter(&k, &metadata())
        };
        let gauge = |name: &str, help: &'static str, labels: &[(&'static str, &'static str)]| {
            let k = key(name, labels);
            r.describe_gauge(
                KeyName::from(k.name().to_string()),
                None,
                SharedString::const_str(help),
            );
            r.register_gauge(&k, &metadata())
        };
        let build_info = gauge(
            "build_info",
            "Always 1; the labels say which build runs (the version and the git commit).",
            &[
                ("version", env!("CARGO_PKG_VERSION")),
                ("commit", env!("STATSD_REDIS_COMMIT")),
            ],
        );
        build_info.set(1.0);
        let flush_duration_key = key("flush_duration_seconds", &[]);
        r.describe_histogram(
            KeyName::from(flush_duration_key.name().to_string()),
            Some(Unit::Seconds),
            SharedString::const_str("Time to write one window (all its chunks) to Redis."),
        );
        let received = |t: Transport| {
            let l = ("transport", t.as_str());
            Received {
                packets: counter(
                    "packets_received_total",
                    "Datagrams received (UDP, unix datagram sockets).",
                    &[l],
                ),
                bytes: counter("bytes_received_total", "Payload bytes received.", &[l]),
                lines: counter(
                    "lines_received_total",
                    "Non-empty lines received, good and bad.",
                    &[l],
                ),
                bad: BadLine::ALL.map(|b| {
                    counter(
                        "bad_lines_total",
                        "Lines rejected, by reason.",
                        &[("reason", b.as_str()), l],
                    )
                }),
                samples: MetricType::ALL.map(|m| {
                    counter(
                        "samples_total",
                        "Samples accepted, by StatsD type.",
                        &[("type", m.as_str()), l],
                    )
                }),
                events: counter("events_total", "DogStatsD events accepted.", &[l]),
                service_checks: counter(
                    "service_checks_total",
                    "DogStatsD service checks accepted.",
                    &[l],
                ),
                unknown_fields: counter(
                    "unknown_fields_total",
                    "Optional line fields that were not understood and ignored (the sample was kept).",
                    &[l],
                ),
                names_sanitized: counter(
                    "names_sanitized_total",
                    "Lines whose metric name or tags were changed by sanitizing.",
                    &[l],
                ),
                truncated_datagrams: counter(
                    "truncated_datagrams_total",
                    "Datagrams larger than the read buffer; their partial last line was dropped.",
                    &[l],
                ),
            }
        };
        let connections = |t: Transport| {
            let l = ("transport", t.as_str());
            Connections {
                open: gauge("connections_open", "Stream connections open now.", &[l]),
                accepted: counter(
                    "connections_accepted_total",
                    "Stream connections accepted.",
                    &[l],
                ),
                at_limit: counter(
                    "connections_at_limit_total",
                    "Times a listener stopped accepting because max_connections were open (new connections wait in the kernel's backlog until one closes).",
                    &[l],
                ),
                idle_closed: counter(
                    "connections_idle_closed_total",
                    "Stream connections closed after stream_idle_timeout_secs without data.",
                    &[l],
                ),
            }
        };
        Telemetry {
            received: Transport::ALL.map(received),
            connections: [
                Transport::Tcp,
                Transport::Unix,
                Transport::CarbonTcp,
                Transport::CarbonPickle,
            ]
            .map(connections),
            samples_dropped: MetricType::ALL.map(|t| {
                counter(
                    "samples_dropped_total",
                    "Samples dropped, by type and reason: series_cap (a new series while the window already held max_series_per_window series of its type), filtered (keep_names, drop_names, drop_types).",
                    &[("type", t.as_str()), ("reason", "series_cap")],
                )
            }),
            samples_filtered: MetricType::ALL.map(|t| {
                counter(
                    "samples_dropped_total",
                    "Samples dropped, by type and reason: series_cap (a new series while the window already held max_series_per_window series of its type), filtered (keep_names, drop_names, drop_types).",
                    &[("type", t.as_str()), ("reason", "filtered")],
                )
            }),
            timestamped: TIMESTAMP_OUTCOMES.map(|outcome| {
                counter(
                    "timestamped_samples_total",
                    "Samples sent with a timestamp (|T), by outcome: earlier (written at the slices of their own second), current (of the window they came in, or a little ahead: counted in it), too_old (past max_timestamp_age_secs: dropped), too_far_ahead (dropped), ignored (on another type than counters and gauges' values: taken as of now).",
                    &[("outcome", outcome)],
                )
            }),
            carbon_points: POINT_OUTCOMES.map(|outcome| {
                counter(
                    "carbon_points_total",
                    "Carbon points (carbon_tcp, carbon_udp) by outcome: placed (into the slice of the finest precision that keeps their age; a later point of the same slice replaces it), too_old (as old as the longest retention: dropped, as whisper drops them), too_far_ahead (further ahead than the finest precision keeps: dropped), not_a_number (a NaN value: dropped, as carbon drops it), series_cap (a new series while the window already held max_series_per_window carbon series), blacklisted (a pattern of carbon_blacklist matches the path), not_whitelisted (carbon_whitelist has patterns and none matches it).",
                    &[("outcome", outcome)],
                )
            }),
            app_series_refused: Refused::ALL.map(|r| {
                counter(
                    "app_series_refused_total",
                    "With prometheus_app_metrics: series left off /metrics, once per window they came in, by reason: type_conflict (the name already shows another type; the first seen wins), name_collision (beside another name it would make the page invalid, as a summary x beside a counter x_count), empty_name, series_cap (a new series while the page holds max_series_per_window).",
                    &[("reason", r.as_str())],
                )
            }),
            logs_dropped: counter(
                "logs_dropped_total",
                "Events and service checks dropped because the window already held max_series_per_window of them.",
                &[],
            ),
            kernel_drops: counter(
                "kernel_drops_total",
                "Datagrams the kernel dropped because a socket's receive queue was full (SO_RXQ_OVFL).",
                &[],
            ),
            active_series: MetricType::ALL.map(|t| {
                gauge(
                    "active_series",
                    "Series written in the last flushed window, by StatsD type.",
                    &[("type", t.as_str())],
                )
            }),
            flushes_ok: counter(
                "flushes_total",
                "Window writes to Redis, by outcome.",
                &[("outcome", "ok")],
            ),
            flushes_failed: counter(
                "flushes_total",
                "Window writes to Redis, by outcome.",
                &[("outcome", "error")],
            ),
            flush_duration: r.register_histogram(&flush_duration_key, &metadata()),
            backlog_windows: gauge(
                "backlog_windows",
                "Closed windows waiting to be written to Redis.",
                &[],
            ),
            last_flush_timestamp: gauge(
                "last_flush_timestamp_seconds",
                "When the writer last found Redis taking its writes (unix seconds): a window written, or with nothing to write an answered PING (every 5 s).",
                &[],
            ),
            redis_up: gauge(
                "redis_up",
                "1 while the writer's last write (or, idle, its PING every 5 s) reached Redis; 0 after a failed one.",
                &[],
            ),
            windows_dropped: counter(
                "windows_dropped_total",
                "Windows dropped unwritten because the backlog was full.",
                &[],
            ),
            backlog_bytes: gauge(
                "backlog_bytes",
                "Bytes of flush chunks waiting to be written (bounded by max_backlog_bytes).",
                &[],
            ),
            spool_window_errors: counter(
                "spool_write_errors_total",
                "Spool writes that failed, by kind: a window as it closed (kept in memory only until the spool takes it: backlog_unspooled_windows), the state file of the sums held back (a crash loses them until the next one is written).",
                &[("kind", "window")],
            ),
            spool_state_errors: counter(
                "spool_write_errors_total",
                "Spool writes that failed, by kind: a window as it closed (kept in memory only until the spool takes it: backlog_unspooled_windows), the state file of the sums held back (a crash loses them until the next one is written).",
                &[("kind", "state")],
            ),
            backlog_unspooled_windows: gauge(
                "backlog_unspooled_windows",
                "Windows in the backlog that the spool could not take (a full disk): in memory only, a crash would lose them. Written to the spool, oldest first, when it has room again.",
                &[],
            ),
            spool_windows_loaded: counter(
                "spool_windows_loaded_total",
                "Windows an earlier run left in the spool, loaded at start to be written.",
                &[],
            ),
            chunks_applied_before: counter(
                "chunks_applied_before_total",
                "Copies of flush chunks (retries after a lost reply, late deliveries) that Redis had applied before, so not again.",
                &[],
            ),
            write_failures: WriteFailure::ALL.map(|w| {
                counter(
                    "write_failures_total",
                    "Writes of applied flush chunks that Redis refused and the chunk skipped, by reason.",
                    &[("reason", w.as_str())],
                )
            }),
            redis_errors: counter("redis_errors_total", "Failed Redis calls.", &[]),
            cleaner_passes: counter(
                "cleaner_passes_total",
                "Cleaner passes made by this agent.",
                &[],
            ),
            carbon_rollups: counter(
                "carbon_rollups_total",
                "Coarser slices of carbon points left pending while their interval was open, made by this agent's rollup runs (once per coarse_write_secs).",
                &[],
            ),
            cleaner_members_visited: counter(
                "cleaner_members_visited_total",
                "Index members (known:, known:gauge:) the cleaner looked at.",
                &[],
            ),
            cleaner_slices_removed: counter(
                "cleaner_slices_removed_total",
                "Slices older than sample_count samples deleted by the cleaner.",
                &[],
            ),
            cleaner_slices_moved: counter(
                "cleaner_slices_moved_total",
                "Slices of long archives the cleaner moved from their hash into blocks of fixed slots.",
                &[],
            ),
            cleaner_counters_removed: counter(
                "cleaner_counters_removed_total",
                "Counter and gauge hashes the cleaner found empty or gone and removed from their index.",
                &[],
            ),
            cleaner_gauges_removed: counter(
                "cleaner_gauges_removed_total",
                "gauges: fields of gauges no agent wrote for forget_idle_secs, removed by the cleaner.",
                &[],
            ),
            cleaner_slowest_removed: counter(
                "cleaner_slowest_removed_total",
                "slowest:AccessTime members whose hourly statistics expired, removed by the cleaner.",
                &[],
            ),
            cleaner_stats_removed: counter(
                "cleaner_stats_removed_total",
                "Keys of hourly statistics (stats:) deleted by the cleaner once the hour after theirs was over.",
                &[],
            ),
            cleaner_pass_duration: {
                let k = key("cleaner_pass_duration_seconds", &[]);
                r.describe_histogram(
                    KeyName::from(k.name().to_string()),
                    Some(Unit::Seconds),
                    SharedString::const_str("Time one cleaner pass took."),
                );
                r.register_histogram(&k, &metadata())
            },
            cleaner_lease_held: gauge(
                "cleaner_lease_held",
                "1 while this agent holds cleaner:lock (only the holder cleans).",
                &[],
            ),
            redis_reconnects: counter(
                "redis_reconnects_total",
                "New Redis connections after the first.",
                &[],
            ),
            replica_waits_short: counter(
                "replica_waits_short_total",
                "WAITs that saw fewer replicas than wait_replicas within wait_timeout_ms; their chunks were sent again.",
                &[],
            ),
            chunks_guard_lost: counter(
                "chunks_guard_lost_total",
                "Chunks sent again after a lost reply that found their run's guard evicted (an allkeys-* maxmemory-policy): not applied again, since Redis may have applied them; their writes may be lost.",
                &[],
            ),
            redis_clock_skew: gauge(
                "redis_clock_skew_seconds",
                "Redis's clock minus the agent's, measured on every new connection and once a minute.",
                &[],
            ),
            http_auth_failures: AuthFailure::ALL.map(|f| {
                counter(
                    "http_auth_failures_total",
                    "HTTP requests turned away by basic_auth_users (web_config_file), by reason: missing (no Basic credentials), unknown_user, wrong_password (401), busy (503: no turn at bcrypt within 5 s).",
                    &[("reason", f.as_str())],
                )
            }),
            http_tls_handshake_failures: counter(
                "http_tls_handshake_failures_total",
                "TLS handshakes on the HTTP port that failed or timed out (a client without the certificate client_auth_type asks for, an untrusted server certificate, plain HTTP to the TLS port).",
                &[],
            ),
            redis_eviction: Default::default(),
            readiness: Readiness::default(),
            handle,
            recorder,
        }
    }

    /// A relay target's counters of lines: sent, and dropped (its queue full, or a send that
    /// failed).
    pub fn relay_lines(&self, target: &str) -> [Counter; 2] {
        let help = |what: &'static str| SharedString::const_str(what);
        let label = || vec![Label::new("target", target.to_string())];
        let sent = Key::from_parts(format!("{PREFIX}relay_sent_total"), label());
        let dropped = Key::from_parts(format!("{PREFIX}relay_dropped_total"), label());
        let r = &self.recorder;
        r.describe_counter(
            KeyName::from(sent.name().to_string()),
            None,
            help("Lines relayed to each target (relay), as they came."),
        );
        r.describe_counter(
            KeyName::from(dropped.name().to_string()),
            None,
            help("Lines not relayed to a target: its queue was full (a slow or unreachable target), or the send failed."),
        );
        [
            r.register_counter(&sent, &metadata()),
            r.register_counter(&dropped, &metadata()),
        ]
    }

    /// Adds a reader's tally to its transport's counters.
    pub fn publish(&self, transport: Transport, t: &Tally) {
        let r = &self.received[transport as usize];
        r.packets.increment(t.packets);
        r.bytes.increment(t.bytes);
        r.lines.increment(t.lines);
        for (c, n) in r.bad.iter().zip(t.bad) {
            if n > 0 {
                c.increment(n);
            }
        }
        for (c, n) in r.samples.iter().zip(t.samples) {
            if n > 0 {
                c.increment(n);
            }
        }
        for (c, n) in self.samples_filtered.iter().zip(t.filtered) {
            if n > 0 {
                c.increment(n);
            }
        }
        r.events.increment(t.events);
        r.service_checks.increment(t.service_checks);
        r.unknown_fields.increment(t.unknown_fields);
        r.names_sanitized.increment(t.names_sanitized);
        r.truncated_datagrams.increment(t.truncated_datagrams);
    }

    /// A stream transport's connection counts (`Tcp`, `Unix`, `CarbonTcp`, `CarbonPickle`).
    pub fn connections(&self, transport: Transport) -> &Connections {
        let i = match transport {
            Transport::Unix => 1,
            Transport::CarbonTcp => 2,
            Transport::CarbonPickle => 3,
            _ => 0,
        };
        &self.connections[i]
    }

    /// Redis's `maxmemory-policy`, as the writer last read it, and whether Redis may evict
    /// keys under it (a `maxmemory` is set and the policy is not `noeviction`).
    pub fn set_redis_eviction(&self, policy: &str, may_evict: bool) {
        *self
            .redis_eviction
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = Some((policy.to_string(), may_evict));
    }

    /// The Prometheus text exposition of every metric, then the process's own.
    pub fn render(&self) -> String {
        self.handle.run_upkeep();
        let mut text = self.handle.render();
        if let Some((policy, may_evict)) = &*self
            .redis_eviction
            .lock()
            .unwrap_or_else(|p| p.into_inner())
        {
            text.push_str(&format!(
                "# HELP {PREFIX}redis_evicts_keys 1 when Redis may evict keys (a maxmemory and a maxmemory-policy other than noeviction), 0 when not; the label is the policy.\n\
                 # TYPE {PREFIX}redis_evicts_keys gauge\n\
                 {PREFIX}redis_evicts_keys{{policy=\"{}\"}} {}\n",
                policy.escape_default(),
                u8::from(*may_evict)
            ));
        }
        text.push_str(&process_metrics());
        text
    }
}

/// The `process_*` metrics that every Prometheus exporter has (CPU, memory, descriptors, start
/// time, threads), read from `/proc` at each scrape; empty where `/proc` is missing.
fn process_metrics() -> String {
    let Ok(stat) = std::fs::read_to_string("/proc/self/stat") else {
        return String::new();
    };
    // After the command name in parentheses: field 3 (state) onwards, so field n is at n - 3.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map_or(Vec::new(), |(_, rest)| rest.split_whitespace().collect());
    let field = |n: usize| fields.get(n - 3).and_then(|f| f.parse::<f64>().ok());
    // SAFETY: sysconf and getrlimit only read system values into plain data.
    let (ticks, page, max_fds) = unsafe {
        let mut limit: libc::rlimit = std::mem::zeroed();
        libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit);
        (
            libc::sysconf(libc::_SC_CLK_TCK) as f64,
            libc::sysconf(libc::_SC_PAGESIZE) as f64,
            limit.rlim_cur as f64,
        )
    };
    let boot = std::fs::read_to_string("/proc/stat").ok().and_then(|s| {
        s.lines()
            .find_map(|l| l.strip_prefix("btime ")?.trim().parse::<f64>().ok())
    });
    let open_fds = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()) as f64;
    let mut out = String::new();
    let mut put = |name: &str, kind: &str, help: &str, value: Option<f64>| {
        if let Some(v) = value {
            out.push_str(&format!(
                "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {v}\n"
            ));
        }
    };
    let cpu = field(14).zip(field(15)).map(|(u, s)| (u + s) / ticks);
    put(
        "process_cpu_seconds_total",
        "counter",
        "User and system CPU time spent, in seconds.",
        cpu,
    );
    put(
        "process_resident_memory_bytes",
        "gauge",
        "Resident memory size in bytes.",
        field(24).map(|p| p * page),
    );
    put(
        "process_virtual_memory_bytes",
        "gauge",
        "Virtual memory size in bytes.",
        field(23),
    );
    put(
        "process_open_fds",
        "gauge",
        "Open file descriptors.",
        Some(open_fds),
    );
    put(
        "process_max_fds",
        "gauge",
        "The limit of open file descriptors.",
        Some(max_fds),
    );
    put(
        "process_threads",
        "gauge",
        "Threads of the process.",
        field(20),
    );
    let start = boot.zip(field(22)).map(|(b, t)| b + t / ticks);
    put(
        "process_start_time_seconds",
        "gauge",
        "Start time of the process since the epoch, in seconds.",
        start,
    );
    out
}

impl Default for Telemetry {
    fn default() -> Self {
        Telemetry::new()
    }
}

impl std::fmt::Debug for Telemetry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Telemetry").finish_non_exhaustive()
    }
}
