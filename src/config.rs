//! Configuration (README "Configuration"): built-in defaults, overlaid by a TOML file, overlaid by environment
//! variables and flags (clap reads both; a flag wins over its variable).
//!
//! Entry points: [`Args`] (the flags) and [`Args::into_config`]. Every key is documented in
//! `config.example.toml`; a bad value is a [`ConfigError`] that names its key.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use clap::Args as ClapArgs;
use serde::{Deserialize, Serialize};

/// The agent's settings. Field names are the TOML keys; units are in the names.
#[derive(Debug, Clone, PartialEq, Deserialize, Serialize)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    /// UDP addresses to receive StatsD on (written as [`parse_listen`] takes them).
    #[serde(deserialize_with = "udp_addrs")]
    pub udp: Vec<SocketAddr>,
    /// TCP addresses to receive newline-delimited StatsD on; none by default.
    #[serde(deserialize_with = "tcp_addrs")]
    pub tcp: Vec<SocketAddr>,
    /// TCP addresses to receive carbon's plaintext lines on (`path value timestamp`), as
    /// carbon-cache's `LINE_RECEIVER_PORT` (2003); none by default.
    #[serde(deserialize_with = "tcp_addrs")]
    pub carbon_tcp: Vec<SocketAddr>,
    /// UDP addresses to receive carbon's plaintext lines on, one or more a datagram
    /// (carbon's `ENABLE_UDP_LISTENER`); none by default.
    #[serde(deserialize_with = "udp_addrs")]
    pub carbon_udp: Vec<SocketAddr>,
    /// TCP addresses to receive carbon's pickle protocol on (carbon-relay, Dropwizard's
    /// `PickledGraphite`), as carbon-cache's `PICKLE_RECEIVER_PORT` (2004); none by default.
    #[serde(deserialize_with = "tcp_addrs")]
    pub carbon_pickle: Vec<SocketAddr>,
    /// The longest pickle message taken (carbon's `PICKLE_RECEIVER_MAX_LENGTH`); a longer one
    /// is skipped and counted, the connection going on.
    pub carbon_pickle_max_bytes: usize,
    /// Carbon's `storage-aggregation.conf`: how each carbon path's coarser slices are made
    /// (`crate::storage_conf`); none: whisper's defaults (average, xFilesFactor 0.5).
    pub storage_aggregation: PathBuf,
    /// Carbon's `whitelist.conf`: when it holds any pattern, only the carbon paths one of them
    /// matches are taken (`USE_WHITELIST`); none: every path.
    pub carbon_whitelist: PathBuf,
    /// Carbon's `blacklist.conf`: the carbon paths one of its patterns matches are dropped.
    pub carbon_blacklist: PathBuf,
    /// Unix datagram sockets to create and receive StatsD on (DogStatsD's UDS transport).
    pub unix_datagram: Vec<PathBuf>,
    /// Unix stream sockets to create and receive newline-delimited StatsD on.
    pub unix_stream: Vec<PathBuf>,
    /// Permissions of the unix socket files, in octal.
    pub unix_socket_mode: String,
    /// Open connections each stream listener (TCP, unix stream) takes; past it the listener
    /// pauses, and new connections wait in the kernel's backlog until one closes.
    pub max_connections: usize,
    /// A stream connection that sends nothing for this long is closed; 0: never.
    pub stream_idle_timeout_secs: u64,
    /// Redis URL: `redis://[:password@]host:port/db`, `rediss://` for TLS, `redis+unix:///path`.
    /// With Sentinel, only its password, database and TLS are used (the sentinels name the
    /// master); with Cluster, it is the seed node when `redis_cluster_nodes` is empty.
    pub redis: String,
    /// How to reach Redis: one server, a master found through Sentinel, or a Redis Cluster.
    pub redis_mode: RedisMode,
    /// Sentinel mode: the sentinels, `host:port` or `redis://[:password@]host:port`.
    pub redis_sentinels: Vec<String>,
    /// Sentinel mode: the name the sentinels monitor the master under.
    pub redis_master_name: String,
    /// Cluster mode: seed nodes, `redis://[:password@]host:port` (any of them will do).
    pub redis_cluster_nodes: Vec<String>,
    /// TLS (`rediss://`): the certificate authorities (PEM) that sign Redis's certificate, a
    /// private CA's; empty: the Mozilla roots built in.
    pub redis_tls_ca_file: PathBuf,
    /// TLS: this client's certificate (PEM), for a Redis that asks for one
    /// (`tls-auth-clients`); with `redis_tls_key_file`.
    pub redis_tls_cert_file: PathBuf,
    /// TLS: the private key (PEM) of `redis_tls_cert_file`.
    pub redis_tls_key_file: PathBuf,
    /// A write counts as done only when this many replicas have it (`WAIT`; in a cluster, of
    /// every master); 0: when the master has it.
    pub wait_replicas: u32,
    /// How long one `WAIT` waits for the replicas.
    pub wait_timeout_ms: u64,
    /// Address of the HTTP server (`/metrics`, `/healthz`, `/readyz`).
    pub http: SocketAddr,
    /// exporter-toolkit's web configuration file (YAML, node_exporter's `--web.config.file`):
    /// TLS, client certificates, bcrypt users and headers for the HTTP port; empty: plain HTTP,
    /// open. Read again at each SIGHUP.
    pub web_config_file: PathBuf,
    /// With `basic_auth_users` in `web_config_file`, `/healthz` and `/readyz` still answer
    /// without a user (probes; they tell nothing of the data); false: they ask for one too.
    pub web_open_probes: bool,
    /// Prepended to every Redis key the agent writes.
    pub key_prefix: String,
    /// Counter precisions in seconds.
    pub precisions: Vec<u64>,
    /// Samples kept per counter at each precision (used by the cleaner).
    pub sample_count: u64,
    /// carbon's `retentions` (`10s:6h,1m:7d,1h:90d,1d:5y`): the precisions, each with how long
    /// it is kept, in place of `precisions` and `sample_count`; empty: those two.
    pub retentions: String,
    /// Carbon's `storage-schemas.conf`: each path's retentions by the first section whose
    /// pattern matches it (`crate::storage_conf::Schemas`), in place of `retentions`; none: one
    /// schema for every path.
    pub storage_schemas: PathBuf,
    /// `storage_schemas` as read (by [`Args::into_config`]), shared by the configuration's
    /// clones (a SIGHUP replaces it in place); none without the file.
    #[serde(skip)]
    pub schemas: Option<crate::storage_conf::SharedSchemas>,
    /// Relative accuracy of the quantiles read back from the timer, histogram and distribution
    /// buckets (DDSketch's α).
    pub quantile_relative_accuracy: f64,
    /// Precisions (seconds) of the slices the quantile buckets are kept in (3600: the hours
    /// that `get percentiles --hour` reads); each slice expires after `sample_count` of them.
    pub quantile_precisions: Vec<u64>,
    /// The quantile buckets are summed in the agent and written once per this many seconds
    /// (each bucket once, not every window); 0: with every window. A multiple of
    /// `flush_interval_secs`, at most the shortest quantile precision.
    pub quantile_write_secs: u64,
    /// Length of an aggregation window, in seconds.
    pub flush_interval_secs: u64,
    /// Readers per UDP address: sockets sharing the port with `SO_REUSEPORT`, each with its own
    /// window, so that several cores can read when many clients send.
    pub udp_readers: usize,
    /// Kernel receive buffer asked for on each UDP socket (capped by `net.core.rmem_max`).
    pub receive_buffer_bytes: usize,
    /// Read buffer per datagram; larger datagrams are truncated and their last line dropped.
    pub max_datagram_bytes: usize,
    /// Sanitize metric names and tags like Etsy statsd.
    pub sanitize_names: bool,
    /// Closed windows kept in memory while Redis is unavailable; the oldest is dropped past this.
    pub max_backlog_windows: usize,
    /// The same bound in bytes of queued flush chunks (and so of the spool).
    pub max_backlog_bytes: u64,
    /// Directory where closed windows wait on disk until Redis has them, replayed at start-up;
    /// empty: no spool (a crash loses the backlog).
    pub spool_dir: PathBuf,
    /// `fsync` each spool file (and the directory) before the window is queued.
    pub spool_fsync: bool,
    /// New series a window takes per type (counters, each statistics type, gauges, sets); the
    /// samples of further new series are dropped and counted.
    pub max_series_per_window: usize,
    /// Gauges, and counters' carried fractions, not updated for this long are forgotten; the
    /// cleaner removes the `gauges:` field of a gauge no agent wrote for this long.
    pub forget_idle_secs: u64,
    /// A counter or gauge timestamped (`|T`) further back than this is dropped and counted; 0:
    /// the longest retention, `sample_count` × the coarsest precision.
    pub max_timestamp_age_secs: u64,
    /// Only metrics whose name (without its tags) matches one of these globs are kept (`*` any
    /// run of characters, `?` one); empty: all.
    pub keep_names: Vec<String>,
    /// Metrics whose name matches one of these globs are dropped.
    pub drop_names: Vec<String>,
    /// Metric types dropped: `c`, `ms`, `h`, `d`, `g`, `s`.
    pub drop_types: Vec<String>,
    /// Tag keys removed from every metric before its series name is made.
    pub drop_tags: Vec<String>,
    /// StatsD servers (`udp://host:port`, `tcp://host:port`) that get every received line as
    /// it came.
    pub relay: Vec<String>,
    /// statsd_exporter's mapping rules (YAML), applied after the filters; empty: none.
    pub mapping_file: PathBuf,
    /// Show the applications' series on `/metrics` too, as statsd_exporter does.
    pub prometheus_app_metrics: bool,
    /// Log keys (`recent:`, `common:`) nobody wrote for this long expire; 0: never.
    pub log_idle_secs: u64,
    /// How long shutdown may spend writing the last window and the backlog.
    pub shutdown_timeout_secs: u64,
    /// How long one Redis call may take before it counts as failed.
    pub redis_timeout_ms: u64,
    /// Series per flush chunk (one transaction; a script call per slot in a cluster).
    pub max_series_per_chunk: usize,
    /// 0: every precision every window. Otherwise K: counters at precision `p` are summed in the
    /// agent and written once per `min(p, K)` seconds; the hourly statistics go with the shortest
    /// such period. Unset: 60 with `retentions` or `storage_schemas` (a write into a long
    /// listpack scans it), else 0; read it with [`Config::coarse_write_secs`]. Also the period
    /// of carbon's rollup runs (`crate::store::rollup`), at least a window.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub coarse_write_secs: Option<u64>,
    /// The Graphite API also serves Etsy statsd's Graphite names (`stats_counts.<name>`,
    /// `stats.<name>`, `stats.timers.<name>.<statistic>`, `stats.gauges.<name>`,
    /// `stats.sets.<name>.count`) over the same series.
    pub graphite_etsy_names: bool,
    /// Etsy's `legacyNamespace`: `stats_counts.<name>` and `stats.<name>` for counters (the
    /// prefixes below are then not used); false: `<prefix>.<prefix_counter>.<name>.count|rate`.
    pub graphite_etsy_legacy_namespace: bool,
    /// Etsy's `globalPrefix`, without `legacyNamespace`.
    pub graphite_etsy_global_prefix: String,
    /// Etsy's `globalSuffix`: a last node after every Etsy name; empty: none.
    pub graphite_etsy_global_suffix: String,
    /// Etsy's `prefixCounter`, without `legacyNamespace`.
    pub graphite_etsy_prefix_counter: String,
    /// Etsy's `prefixTimer`, without `legacyNamespace`.
    pub graphite_etsy_prefix_timer: String,
    /// Etsy's `prefixGauge`, without `legacyNamespace`.
    pub graphite_etsy_prefix_gauge: String,
    /// Etsy's `prefixSet`, without `legacyNamespace`.
    pub graphite_etsy_prefix_set: String,
    /// Etsy's `percentThreshold`: the percents of a timer's values its `_<p>` statistics
    /// take (the lowest; the highest for a negative one).
    pub graphite_etsy_percent_threshold: Vec<f64>,
    /// This agent's name in flush sequence keys and the cleaner lease; empty means a random one
    /// per start.
    pub agent_id: String,
    /// Run the cleaner that trims counters and gauges to `sample_count` slices.
    pub cleaner_enabled: bool,
    /// What is logged: a level (`error`, `warn`, `info`, `debug`, `trace`) or `tracing` filter
    /// directives (`info,statsd_redis::store=debug`). `RUST_LOG`, when set, wins. SIGHUP applies
    /// a new value.
    pub log_level: String,
    /// `text` (one line per event, for people) or `json` (one JSON object per line).
    pub log_format: LogFormat,
    /// About how often the cleaner makes a pass; precision `p` is checked every
    /// `max(1, p / cleaner_interval_secs)` passes.
    pub cleaner_interval_secs: u64,
}

/// A listen address as users of the StatsD daemons write it: `host:port`, `[v6 address]:port`,
/// `:port` (every interface, IPv4 and IPv6), a host name resolved now (its first address), each
/// optionally behind `<scheme>://` (`udp://`, `tcp://`) when the scheme is the list's own.
pub fn parse_listen(text: &str, scheme: &str) -> Result<SocketAddr, String> {
    let bare = match text.split_once("://") {
        Some((s, rest)) if s == scheme => rest,
        Some((s, _)) => return Err(format!("`{text}`: a {scheme} address, not {s}://")),
        None => text,
    };
    if let Some(port) = bare.strip_prefix(':') {
        let port: u16 = port.parse().map_err(|_| format!("`{text}`: not a port"))?;
        return Ok(SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port)));
    }
    if let Ok(addr) = bare.parse() {
        return Ok(addr);
    }
    std::net::ToSocketAddrs::to_socket_addrs(bare)
        .map_err(|e| format!("`{text}`: {e}"))?
        .next()
        .ok_or_else(|| format!("`{text}`: the name has no address"))
}

fn parse_udp(text: &str) -> Result<SocketAddr, String> {
    parse_listen(text, "udp")
}

fn parse_tcp(text: &str) -> Result<SocketAddr, String> {
    parse_listen(text, "tcp")
}

fn listen_addrs<'de, D: serde::Deserializer<'de>>(
    d: D,
    scheme: &str,
) -> Result<Vec<SocketAddr>, D::Error> {
    Vec::<String>::deserialize(d)?
        .iter()
        .map(|a| parse_listen(a, scheme).map_err(serde::de::Error::custom))
        .collect()
}

fn udp_addrs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<SocketAddr>, D::Error> {
    listen_addrs(d, "udp")
}

fn tcp_addrs<'de, D: serde::Deserializer<'de>>(d: D) -> Result<Vec<SocketAddr>, D::Error> {
    listen_addrs(d, "tcp")
}

/// How log lines are written (`log_format`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

/// How the agent reaches Redis (`redis_mode`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Deserialize, Serialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum RedisMode {
    /// One server at the `redis` URL.
    #[default]
    Standalone,
    /// The master named `redis_master_name`, asked of `redis_sentinels` at every (re)connect.
    Sentinel,
    /// A Redis Cluster reached through `redis_cluster_nodes` (or `redis`).
    Cluster,
}

pub const DEFAULT_PRECISIONS: [u64; 7] = [1, 5, 60, 300, 3600, 18000, 86400];

impl Default for Config {
    fn default() -> Self {
        Config {
            udp: vec![SocketAddr::from(([127, 0, 0, 1], 8125))],
            tcp: Vec::new(),
            carbon_tcp: Vec::new(),
            carbon_udp: Vec::new(),
            carbon_pickle: Vec::new(),
            carbon_pickle_max_bytes: 1 << 20,
            storage_aggregation: PathBuf::new(),
            carbon_whitelist: PathBuf::new(),
            carbon_blacklist: PathBuf::new(),
            unix_datagram: Vec::new(),
            unix_stream: Vec::new(),
            // Any local user may send, as over UDP on loopback; only the agent's user may
            // replace the file. (Sending needs write permission; reading is never asked for.)
            unix_socket_mode: "0622".into(),
            max_connections: 1024,
            // Off: a client library keeps its connection for the life of the process and may
            // send rarely; one closed under it loses the next line it writes. Dead peers are
            // found by TCP keepalive instead.
            stream_idle_timeout_secs: 0,
            redis: "redis://127.0.0.1:6379/0".into(),
            redis_mode: RedisMode::Standalone,
            redis_sentinels: Vec::new(),
            redis_master_name: "mymaster".into(),
            redis_cluster_nodes: Vec::new(),
            redis_tls_ca_file: PathBuf::new(),
            redis_tls_cert_file: PathBuf::new(),
            redis_tls_key_file: PathBuf::new(),
            wait_replicas: 0,
            // A replica on the same network acknowledges within a millisecond; longer means it
            // is behind or gone, and the window waits in the backlog instead.
            wait_timeout_ms: 500,
            http: SocketAddr::from(([127, 0, 0, 1], 9102)),
            web_config_file: PathBuf::new(),
            // Kubernetes' and systemd's probes carry no password, and a probe answered 401
            // would take a healthy agent out of service.
            web_open_probes: true,
            key_prefix: String::new(),
            precisions: DEFAULT_PRECISIONS.to_vec(),
            // The number of samples the chapter's text keeps.
            sample_count: 120,
            // The book's spelling above.
            retentions: String::new(),
            storage_schemas: PathBuf::new(),
            schemas: None,
            // 1 %: a p99 of 200 ms reads back between 198 and 202 ms.
            quantile_relative_accuracy: 0.01,
            // "The last 15 minutes" (two hours of minutes) and "yesterday 14:00" (five days
            // of hours).
            quantile_precisions: vec![60, 3600],
            // A minute: the buckets' Redis cost falls to a fraction of the statistics' (each
            // bucket written once a minute instead of every second), and the minute slice is
            // written whole once, when it ends.
            quantile_write_secs: 60,
            flush_interval_secs: 1,
            // One reader keeps the other core for the flush on a 2-core machine; a single
            // sender's datagrams always reach the same reader anyway.
            udp_readers: 1,
            // The kernel doubles the size asked for and charges about 830 bytes per small
            // datagram: 32 MiB queues ~80 000 of them, 200 ms of a stalled reader at 400 000
            // datagrams/s. 8 MiB (50 ms) lost datagrams in 2 of 10 full-speed single-line runs on a
            // busy 2-core machine. Memory is charged only while datagrams wait.
            receive_buffer_bytes: 32 << 20,
            // The largest UDP payload: any datagram is read whole.
            max_datagram_bytes: 65535,
            sanitize_names: true,
            // An hour of one-second windows.
            max_backlog_windows: 3600,
            // A window of 100 000 series queues about 4 MB of chunks: 1 GiB holds a few minutes
            // of that, and the hour of windows above at a few thousand series.
            max_backlog_bytes: 1 << 30,
            spool_dir: PathBuf::new(),
            // A spool file survives the agent's crash in the page cache; fsync is for surviving
            // the machine's, at a disk flush per window.
            spool_fsync: false,
            // Four times the 110 000 series one Redis core takes at coarse_write_secs = 60; ~280
            // bytes each at most 140 MB per type.
            max_series_per_window: 500_000,
            // A day: a gauge's value (the base of its deltas) outlives any pause of its sender
            // but not the churn of names that never come back.
            forget_idle_secs: 86_400,
            max_timestamp_age_secs: 0,
            keep_names: Vec::new(),
            drop_names: Vec::new(),
            drop_types: Vec::new(),
            drop_tags: Vec::new(),
            relay: Vec::new(),
            mapping_file: PathBuf::new(),
            prometheus_app_metrics: false,
            // A week.
            log_idle_secs: 604_800,
            shutdown_timeout_secs: 10,
            redis_timeout_ms: 2000,
            // One chunk's EXEC blocks Redis; at the 7 default precisions 100 series take ~0.5 ms
            // (2 ms at most) here: see docs/benchmarks.md and scripts/chunk-timing.sh.
            max_series_per_chunk: 100,
            // Off: every window is written whole, once a second (docs/layout.md, "Many series"). At 5, six of the
            // seven default precisions are written every 5 s: a third of the Redis work.
            coarse_write_secs: None,
            // Off: the Etsy names are a second tree over the same series, which only users
            // moving from Etsy statsd's dashboards want in their browser (docs/reading.md).
            graphite_etsy_names: false,
            // Etsy's defaults (backends/graphite.js).
            graphite_etsy_legacy_namespace: true,
            graphite_etsy_global_prefix: "stats".into(),
            graphite_etsy_global_suffix: String::new(),
            graphite_etsy_prefix_counter: "counters".into(),
            graphite_etsy_prefix_timer: "timers".into(),
            graphite_etsy_prefix_gauge: "gauges".into(),
            graphite_etsy_prefix_set: "sets".into(),
            graphite_etsy_percent_threshold: vec![90.0],
            agent_id: String::new(),
            cleaner_enabled: true,
            log_level: "info".into(),
            log_format: LogFormat::Text,
            // The book's cleaner sleeps a minute between passes.
            cleaner_interval_secs: 60,
        }
    }
}

/// A configuration problem, always naming the key it is about.
#[derive(Debug, thiserror::Error, PartialEq)]
#[error("invalid value for `{key}`: {message}")]
pub struct ConfigError {
    pub key: String,
    pub message: String,
}

/// The largest file the agent reads as configuration (its own file, the mapping, carbon's
/// schema files, the web configuration, certificates and keys): a path to a device or an
/// endless stream (`/dev/zero`) is an error, not a hang.
pub const MAX_FILE_BYTES: u64 = 64 << 20;

/// The file at `path`, when it holds at most [`MAX_FILE_BYTES`].
pub fn read_file(path: &Path) -> std::io::Result<Vec<u8>> {
    use std::io::Read as _;
    let mut bytes = Vec::new();
    std::fs::File::open(path)?
        .take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "larger than 64 MiB (a configuration file is smaller)",
        ));
    }
    Ok(bytes)
}

/// The text of the file at `path`, as [`read_file`] reads it.
pub fn read_text(path: &Path) -> std::io::Result<String> {
    String::from_utf8(read_file(path)?).map_err(|_| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "stream did not contain valid UTF-8",
        )
    })
}

pub(crate) fn err(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError {
        key: key.into(),
        message: message.into(),
    }
}

/// A Redis URL without its password, for logs and printed configurations.
pub fn redacted(url: &str) -> String {
    let (url, query) = url
        .split_once('?')
        .map_or((url, None), |(u, q)| (u, Some(q)));
    let mut out = match (url.find("://"), url.rfind('@')) {
        (Some(scheme), Some(at)) if at > scheme => {
            format!("{}://***@{}", &url[..scheme], &url[at + 1..])
        }
        _ => url.to_string(),
    };
    // A unix socket's password goes in the query: `redis+unix:///r.sock?pass=…`.
    if let Some(query) = query {
        let params: Vec<String> = query
            .split('&')
            .map(|p| match p.split_once('=') {
                Some((k, _)) if matches!(k, "pass" | "password") => format!("{k}=***"),
                _ => p.to_string(),
            })
            .collect();
        out = format!("{out}?{}", params.join("&"));
    }
    out
}

impl Config {
    /// The configuration with every password replaced by `***` and `coarse_write_secs` in force
    /// (`--print-config`).
    pub fn redacted(&self) -> Config {
        Config {
            redis: redacted(&self.redis),
            redis_sentinels: self.redis_sentinels.iter().map(|u| redacted(u)).collect(),
            redis_cluster_nodes: self
                .redis_cluster_nodes
                .iter()
                .map(|u| redacted(u))
                .collect(),
            coarse_write_secs: Some(self.coarse_write_secs()),
            ..self.clone()
        }
    }

    /// `unix_socket_mode` as permission bits.
    pub fn socket_mode(&self) -> Result<u32, ConfigError> {
        u32::from_str_radix(self.unix_socket_mode.trim_start_matches("0o"), 8)
            .ok()
            .filter(|m| *m <= 0o777)
            .ok_or_else(|| err("unix_socket_mode", "must be octal permissions, 0 to 0777"))
    }

    /// Parses a TOML document; unknown keys and mistyped values are errors naming the key.
    pub fn from_toml(text: &str) -> Result<Config, ConfigError> {
        let de =
            toml::Deserializer::parse(text).map_err(|e| err("config", e.message().to_string()))?;
        serde_path_to_error::deserialize(de).map_err(|e| {
            let key = e.path().to_string();
            err(
                if key == "." { "config" } else { &key },
                e.inner().message().to_string(),
            )
        })
    }

    /// Checks the values that types alone don't.
    /// (What the keys' files and lists hold, the filters, the mapping file, the relay's targets
    /// and the web configuration file, is checked by their own modules: `agent::check`.)
    pub fn validate(&self) -> Result<(), ConfigError> {
        for (key, value) in [
            (
                "graphite_etsy_global_prefix",
                &self.graphite_etsy_global_prefix,
            ),
            (
                "graphite_etsy_global_suffix",
                &self.graphite_etsy_global_suffix,
            ),
            (
                "graphite_etsy_prefix_counter",
                &self.graphite_etsy_prefix_counter,
            ),
            (
                "graphite_etsy_prefix_timer",
                &self.graphite_etsy_prefix_timer,
            ),
            (
                "graphite_etsy_prefix_gauge",
                &self.graphite_etsy_prefix_gauge,
            ),
            ("graphite_etsy_prefix_set", &self.graphite_etsy_prefix_set),
        ] {
            if !value
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b))
            {
                return Err(err(
                    key,
                    format!("{value:?}: letters, digits, `_`, `-` and `.` only"),
                ));
            }
        }
        if let Some(p) = self
            .graphite_etsy_percent_threshold
            .iter()
            .find(|p| !(-100.0..=100.0).contains(*p) || **p == 0.0 || **p == -100.0)
        {
            return Err(err(
                "graphite_etsy_percent_threshold",
                format!("{p}: a percent between -100 and 100, not 0 or -100"),
            ));
        }
        if self.udp.is_empty()
            && self.tcp.is_empty()
            && self.unix_datagram.is_empty()
            && self.unix_stream.is_empty()
            && self.carbon_tcp.is_empty()
            && self.carbon_udp.is_empty()
            && self.carbon_pickle.is_empty()
        {
            return Err(err(
                "udp",
                "at least one listener (udp, tcp, unix_datagram, unix_stream, carbon_tcp, carbon_udp or carbon_pickle) is needed",
            ));
        }
        if self.redis_mode == RedisMode::Cluster {
            for (key, addrs) in [
                ("carbon_tcp", &self.carbon_tcp),
                ("carbon_udp", &self.carbon_udp),
                ("carbon_pickle", &self.carbon_pickle),
            ] {
                if !addrs.is_empty() {
                    return Err(err(
                        key,
                        "carbon's receivers take one Redis server (standalone or Sentinel), not yet a Redis Cluster",
                    ));
                }
            }
        }
        for (key, paths) in [
            ("unix_datagram", &self.unix_datagram),
            ("unix_stream", &self.unix_stream),
        ] {
            if paths.iter().any(|p| p.as_os_str().is_empty()) {
                return Err(err(key, "a socket path may not be empty"));
            }
        }
        self.socket_mode()?;
        if self.carbon_pickle_max_bytes == 0 || self.carbon_pickle_max_bytes > u32::MAX as usize {
            return Err(err(
                "carbon_pickle_max_bytes",
                "from 1 to 4294967295 (a message's length is 4 bytes)",
            ));
        }
        if self.max_connections == 0 {
            return Err(err("max_connections", "must be at least 1"));
        }
        if self.precisions.is_empty() {
            return Err(err("precisions", "at least one precision is needed"));
        }
        if self.precisions.contains(&0) {
            return Err(err(
                "precisions",
                "precisions are whole seconds, at least 1",
            ));
        }
        let mut sorted = self.precisions.clone();
        sorted.sort_unstable();
        sorted.dedup();
        if sorted.len() != self.precisions.len() {
            return Err(err("precisions", "each precision may appear once"));
        }
        if self.sample_count == 0 {
            return Err(err("sample_count", "must be at least 1"));
        }
        if !self.storage_schemas.as_os_str().is_empty() {
            if !self.retentions.is_empty() {
                return Err(err(
                    "storage_schemas",
                    "give either storage_schemas or retentions, not both",
                ));
            }
            if self.precisions != DEFAULT_PRECISIONS || self.sample_count != 120 {
                return Err(err(
                    "storage_schemas",
                    "give either storage_schemas or precisions with sample_count, not both",
                ));
            }
        }
        if !self.retentions.is_empty() {
            crate::retention::Retention::parse(&self.retentions)
                .map_err(|e| err("retentions", e))?;
            if self.precisions != DEFAULT_PRECISIONS || self.sample_count != 120 {
                return Err(err(
                    "retentions",
                    "give either retentions or precisions with sample_count, not both",
                ));
            }
        }
        if !(self.quantile_relative_accuracy >= 0.0001 && self.quantile_relative_accuracy <= 0.5) {
            return Err(err(
                "quantile_relative_accuracy",
                "must be between 0.0001 and 0.5",
            ));
        }
        if self.quantile_precisions.contains(&0) {
            return Err(err(
                "quantile_precisions",
                "precisions are whole seconds, at least 1",
            ));
        }
        if self.flush_interval_secs == 0 || self.flush_interval_secs > 60 {
            return Err(err("flush_interval_secs", "must be between 1 and 60"));
        }
        let shortest = self.quantile_precisions.iter().min().copied();
        if !self
            .quantile_write_secs
            .is_multiple_of(self.flush_interval_secs)
            || shortest.is_some_and(|p| self.quantile_write_secs > p)
        {
            return Err(err(
                "quantile_write_secs",
                "must be 0 or a multiple of flush_interval_secs, at most the shortest of quantile_precisions",
            ));
        }
        if self.udp_readers == 0 || self.udp_readers > 64 {
            return Err(err("udp_readers", "must be between 1 and 64"));
        }
        if self.max_datagram_bytes < 512 || self.max_datagram_bytes > 65535 {
            return Err(err("max_datagram_bytes", "must be between 512 and 65535"));
        }
        if self.max_backlog_windows == 0 {
            return Err(err("max_backlog_windows", "must be at least 1"));
        }
        if self.max_backlog_bytes < 1 << 20 {
            return Err(err("max_backlog_bytes", "must be at least 1048576 (1 MiB)"));
        }
        if self.max_series_per_window == 0 {
            return Err(err("max_series_per_window", "must be at least 1"));
        }
        if self.max_timestamp_age_secs > 0 && self.max_timestamp_age_secs < self.flush_interval_secs
        {
            return Err(err(
                "max_timestamp_age_secs",
                "must be 0 (the longest retention) or at least flush_interval_secs",
            ));
        }
        if self.forget_idle_secs < 60 {
            return Err(err("forget_idle_secs", "must be at least 60"));
        }
        // Longer, and a slow WAIT would end as a timed-out call and a new connection.
        if self.wait_timeout_ms == 0
            || (self.wait_replicas > 0 && self.wait_timeout_ms >= self.redis_timeout_ms)
        {
            return Err(err(
                "wait_timeout_ms",
                "must be at least 1, and less than redis_timeout_ms when wait_replicas is set",
            ));
        }
        if self.redis_timeout_ms == 0 {
            return Err(err("redis_timeout_ms", "must be at least 1"));
        }
        if self.max_series_per_chunk == 0 {
            return Err(err("max_series_per_chunk", "must be at least 1"));
        }
        let coarse = self.coarse_write_secs();
        if !coarse.is_multiple_of(self.flush_interval_secs) || coarse > 3600 {
            return Err(err(
                "coarse_write_secs",
                "must be 0 or a multiple of flush_interval_secs, at most 3600",
            ));
        }
        if self.cleaner_interval_secs == 0 {
            return Err(err("cleaner_interval_secs", "must be at least 1"));
        }
        if tracing_subscriber::EnvFilter::try_new(&self.log_level).is_err() {
            return Err(err(
                "log_level",
                "must be a level (error, warn, info, debug, trace) or tracing filter directives",
            ));
        }
        if self.agent_id.contains(char::is_whitespace) {
            return Err(err("agent_id", "must not contain whitespace"));
        }
        Ok(())
    }
}

/// The configuration file read when `--config` names none, if it exists (the systemd unit's).
pub const DEFAULT_CONFIG_FILE: &str = "/etc/statsd-redis/config.toml";

/// Flags of the agent; each also reads `STATSD_REDIS_<FLAG>` from the environment.
#[derive(Debug, Default, Clone, ClapArgs)]
pub struct Args {
    /// TOML configuration file (every key: config.example.toml) [default:
    /// /etc/statsd-redis/config.toml when it exists].
    #[arg(long, global = true, env = "STATSD_REDIS_CONFIG", value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// UDP address to receive StatsD on (host:port, :port, name:port, udp://...); repeat for
    /// several [default: 127.0.0.1:8125].
    #[arg(
        long,
        env = "STATSD_REDIS_UDP",
        value_name = "ADDR",
        value_delimiter = ',',
        value_parser = parse_udp
    )]
    pub udp: Option<Vec<SocketAddr>>,
    /// TCP address to receive newline-delimited StatsD on; repeat for several [default: none].
    #[arg(
        long,
        env = "STATSD_REDIS_TCP",
        value_name = "ADDR",
        value_delimiter = ',',
        value_parser = parse_tcp
    )]
    pub tcp: Option<Vec<SocketAddr>>,
    /// TCP address to receive carbon's plaintext lines on; repeat for several [default: none].
    #[arg(
        long,
        env = "STATSD_REDIS_CARBON_TCP",
        value_name = "ADDR",
        value_delimiter = ',',
        value_parser = parse_tcp
    )]
    pub carbon_tcp: Option<Vec<SocketAddr>>,
    /// UDP address to receive carbon's plaintext lines on; repeat for several [default: none].
    #[arg(
        long,
        env = "STATSD_REDIS_CARBON_UDP",
        value_name = "ADDR",
        value_delimiter = ',',
        value_parser = parse_udp
    )]
    pub carbon_udp: Option<Vec<SocketAddr>>,
    /// TCP address to receive carbon's pickle protocol on; repeat for several [default: none].
    #[arg(
        long,
        env = "STATSD_REDIS_CARBON_PICKLE",
        value_name = "ADDR",
        value_delimiter = ',',
        value_parser = parse_tcp
    )]
    pub carbon_pickle: Option<Vec<SocketAddr>>,
    /// The longest carbon pickle message taken [default: 1048576].
    #[arg(
        long,
        env = "STATSD_REDIS_CARBON_PICKLE_MAX_BYTES",
        value_name = "BYTES"
    )]
    pub carbon_pickle_max_bytes: Option<usize>,
    /// Carbon's storage-aggregation.conf, for carbon's paths [default: none].
    #[arg(
        long,
        global = true,
        env = "STATSD_REDIS_STORAGE_AGGREGATION",
        value_name = "PATH"
    )]
    pub storage_aggregation: Option<PathBuf>,
    /// Carbon's whitelist.conf: only the carbon paths its patterns match [default: none].
    #[arg(long, env = "STATSD_REDIS_CARBON_WHITELIST", value_name = "PATH")]
    pub carbon_whitelist: Option<PathBuf>,
    /// Carbon's blacklist.conf: the carbon paths its patterns match are dropped [default: none].
    #[arg(long, env = "STATSD_REDIS_CARBON_BLACKLIST", value_name = "PATH")]
    pub carbon_blacklist: Option<PathBuf>,
    /// Unix datagram socket to create and receive on; repeat for several [default: none].
    #[arg(
        long,
        env = "STATSD_REDIS_UNIX_DATAGRAM",
        value_name = "PATH",
        value_delimiter = ','
    )]
    pub unix_datagram: Option<Vec<PathBuf>>,
    /// Unix stream socket to create and receive on; repeat for several [default: none].
    #[arg(
        long,
        env = "STATSD_REDIS_UNIX_STREAM",
        value_name = "PATH",
        value_delimiter = ','
    )]
    pub unix_stream: Option<Vec<PathBuf>>,
    /// Permissions of the unix socket files, octal [default: 0622].
    #[arg(long, env = "STATSD_REDIS_UNIX_SOCKET_MODE", value_name = "MODE")]
    pub unix_socket_mode: Option<String>,
    /// Open connections per stream listener [default: 1024].
    #[arg(long, env = "STATSD_REDIS_MAX_CONNECTIONS", value_name = "N")]
    pub max_connections: Option<usize>,
    /// Close stream connections silent this long; 0 never [default: 0].
    #[arg(
        long,
        env = "STATSD_REDIS_STREAM_IDLE_TIMEOUT_SECS",
        value_name = "SECS"
    )]
    pub stream_idle_timeout_secs: Option<u64>,
    /// Redis URL [default: redis://127.0.0.1:6379/0].
    #[arg(long, global = true, env = "STATSD_REDIS_REDIS", value_name = "URL")]
    pub redis: Option<String>,
    /// standalone, sentinel or cluster [default: standalone].
    #[arg(
        long,
        global = true,
        env = "STATSD_REDIS_REDIS_MODE",
        value_name = "MODE"
    )]
    pub redis_mode: Option<RedisMode>,
    /// Sentinel addresses, host:port (sentinel mode) [default: none].
    #[arg(
        long,
        global = true,
        env = "STATSD_REDIS_REDIS_SENTINELS",
        value_name = "ADDR",
        value_delimiter = ','
    )]
    pub redis_sentinels: Option<Vec<String>>,
    /// Master name the sentinels know [default: mymaster].
    #[arg(
        long,
        global = true,
        env = "STATSD_REDIS_REDIS_MASTER_NAME",
        value_name = "NAME"
    )]
    pub redis_master_name: Option<String>,
    /// Cluster seed node URLs (cluster mode) [default: the --redis URL].
    #[arg(
        long,
        global = true,
        env = "STATSD_REDIS_REDIS_CLUSTER_NODES",
        value_name = "URL",
        value_delimiter = ','
    )]
    pub redis_cluster_nodes: Option<Vec<String>>,
    /// TLS: PEM file of the CAs that sign Redis's certificate [default: the built-in roots].
    #[arg(
        long,
        global = true,
        env = "STATSD_REDIS_REDIS_TLS_CA_FILE",
        value_name = "PATH"
    )]
    pub redis_tls_ca_file: Option<PathBuf>,
    /// TLS: this client's certificate (PEM), for tls-auth-clients [default: none].
    #[arg(
        long,
        global = true,
        env = "STATSD_REDIS_REDIS_TLS_CERT_FILE",
        value_name = "PATH"
    )]
    pub redis_tls_cert_file: Option<PathBuf>,
    /// TLS: the key of --redis-tls-cert-file (PEM) [default: none].
    #[arg(
        long,
        global = true,
        env = "STATSD_REDIS_REDIS_TLS_KEY_FILE",
        value_name = "PATH"
    )]
    pub redis_tls_key_file: Option<PathBuf>,
    /// Replicas that must have a write (WAIT) before it counts as done [default: 0].
    #[arg(long, env = "STATSD_REDIS_WAIT_REPLICAS", value_name = "N")]
    pub wait_replicas: Option<u32>,
    /// Timeout of one WAIT for the replicas [default: 500].
    #[arg(long, env = "STATSD_REDIS_WAIT_TIMEOUT_MS", value_name = "MS")]
    pub wait_timeout_ms: Option<u64>,
    /// HTTP address for /metrics, /healthz, /readyz [default: 127.0.0.1:9102].
    #[arg(long, env = "STATSD_REDIS_HTTP", value_name = "ADDR")]
    pub http: Option<SocketAddr>,
    /// exporter-toolkit's web configuration file (TLS, users, headers for the HTTP port);
    /// read again at each SIGHUP [default: none].
    #[arg(long, env = "STATSD_REDIS_WEB_CONFIG_FILE", value_name = "PATH")]
    pub web_config_file: Option<PathBuf>,
    /// /healthz and /readyz answer without a user of web_config_file [default: true].
    #[arg(long, env = "STATSD_REDIS_WEB_OPEN_PROBES", value_name = "BOOL")]
    pub web_open_probes: Option<bool>,
    /// Prefix for every Redis key [default: none].
    #[arg(
        long,
        global = true,
        env = "STATSD_REDIS_KEY_PREFIX",
        value_name = "PREFIX"
    )]
    pub key_prefix: Option<String>,
    /// Counter precisions in seconds [default: 1,5,60,300,3600,18000,86400].
    #[arg(
        long,
        env = "STATSD_REDIS_PRECISIONS",
        value_name = "SECS",
        value_delimiter = ','
    )]
    pub precisions: Option<Vec<u64>>,
    /// Samples kept per counter and precision [default: 120].
    #[arg(
        long,
        global = true,
        env = "STATSD_REDIS_SAMPLE_COUNT",
        value_name = "N"
    )]
    pub sample_count: Option<u64>,
    /// carbon's retentions, `10s:6h,1m:7d,1h:90d`, in place of --precisions and --sample-count
    /// [default: none].
    #[arg(
        long,
        global = true,
        env = "STATSD_REDIS_RETENTIONS",
        value_name = "RETENTIONS"
    )]
    pub retentions: Option<String>,
    /// carbon's storage-schemas.conf: each path's retentions, in place of --retentions
    /// [default: none].
    #[arg(
        long,
        global = true,
        env = "STATSD_REDIS_STORAGE_SCHEMAS",
        value_name = "PATH"
    )]
    pub storage_schemas: Option<PathBuf>,
    /// Relative accuracy of quantiles [default: 0.01].
    #[arg(
        long,
        env = "STATSD_REDIS_QUANTILE_RELATIVE_ACCURACY",
        value_name = "ALPHA"
    )]
    pub quantile_relative_accuracy: Option<f64>,
    /// Precisions at which quantile buckets are kept per slice [default: 60,3600].
    #[arg(
        long,
        global = true,
        env = "STATSD_REDIS_QUANTILE_PRECISIONS",
        value_name = "SECS",
        value_delimiter = ','
    )]
    pub quantile_precisions: Option<Vec<u64>>,
    /// Write the quantile buckets once per this many seconds, summed (0: every window)
    /// [default: 60].
    #[arg(long, env = "STATSD_REDIS_QUANTILE_WRITE_SECS", value_name = "SECS")]
    pub quantile_write_secs: Option<u64>,
    /// Aggregation window in seconds [default: 1].
    #[arg(long, env = "STATSD_REDIS_FLUSH_INTERVAL_SECS", value_name = "SECS")]
    pub flush_interval_secs: Option<u64>,
    /// Readers (SO_REUSEPORT sockets) per UDP address [default: 1].
    #[arg(long, env = "STATSD_REDIS_UDP_READERS", value_name = "N")]
    pub udp_readers: Option<usize>,
    /// Kernel receive buffer per UDP socket [default: 33554432].
    #[arg(long, env = "STATSD_REDIS_RECEIVE_BUFFER_BYTES", value_name = "BYTES")]
    pub receive_buffer_bytes: Option<usize>,
    /// Read buffer per datagram [default: 65535].
    #[arg(long, env = "STATSD_REDIS_MAX_DATAGRAM_BYTES", value_name = "BYTES")]
    pub max_datagram_bytes: Option<usize>,
    /// Sanitize metric names like Etsy statsd [default: true].
    #[arg(long, env = "STATSD_REDIS_SANITIZE_NAMES", value_name = "BOOL")]
    pub sanitize_names: Option<bool>,
    /// Windows kept while Redis is down [default: 3600].
    #[arg(long, env = "STATSD_REDIS_MAX_BACKLOG_WINDOWS", value_name = "N")]
    pub max_backlog_windows: Option<usize>,
    /// Bytes of flush chunks kept while Redis is down (memory, and the spool) [default: 1073741824].
    #[arg(long, env = "STATSD_REDIS_MAX_BACKLOG_BYTES", value_name = "BYTES")]
    pub max_backlog_bytes: Option<u64>,
    /// Directory for the crash-safe spool of unwritten windows [default: none].
    #[arg(long, env = "STATSD_REDIS_SPOOL_DIR", value_name = "DIR")]
    pub spool_dir: Option<PathBuf>,
    /// fsync each spool file [default: false].
    #[arg(long, env = "STATSD_REDIS_SPOOL_FSYNC", value_name = "BOOL")]
    pub spool_fsync: Option<bool>,
    /// New series per window and type; more are dropped and counted [default: 500000].
    #[arg(long, env = "STATSD_REDIS_MAX_SERIES_PER_WINDOW", value_name = "N")]
    pub max_series_per_window: Option<usize>,
    /// Forget gauges and counter remainders idle this long [default: 86400].
    #[arg(long, env = "STATSD_REDIS_FORGET_IDLE_SECS", value_name = "SECS")]
    pub forget_idle_secs: Option<u64>,
    /// Drop counters and gauges timestamped (|T) further back; 0 the longest retention
    /// [default: 0].
    #[arg(long, env = "STATSD_REDIS_MAX_TIMESTAMP_AGE_SECS", value_name = "SECS")]
    pub max_timestamp_age_secs: Option<u64>,
    /// Keep only metrics whose name matches one of these globs; none: all [default: none].
    #[arg(
        long,
        env = "STATSD_REDIS_KEEP_NAMES",
        value_name = "GLOB",
        value_delimiter = ','
    )]
    pub keep_names: Option<Vec<String>>,
    /// Drop metrics whose name matches one of these globs [default: none].
    #[arg(
        long,
        env = "STATSD_REDIS_DROP_NAMES",
        value_name = "GLOB",
        value_delimiter = ','
    )]
    pub drop_names: Option<Vec<String>>,
    /// Drop metrics of these types: c, ms, h, d, g, s [default: none].
    #[arg(
        long,
        env = "STATSD_REDIS_DROP_TYPES",
        value_name = "TYPE",
        value_delimiter = ','
    )]
    pub drop_types: Option<Vec<String>>,
    /// Remove these tag keys from every metric [default: none].
    #[arg(
        long,
        env = "STATSD_REDIS_DROP_TAGS",
        value_name = "KEY",
        value_delimiter = ','
    )]
    pub drop_tags: Option<Vec<String>>,
    /// Relay every received line to these StatsD servers: udp://host:port, tcp://host:port
    /// [default: none].
    #[arg(
        long,
        env = "STATSD_REDIS_RELAY",
        value_name = "URL",
        value_delimiter = ','
    )]
    pub relay: Option<Vec<String>>,
    /// statsd_exporter's mapping file (YAML); read again at each SIGHUP [default: none].
    #[arg(long, env = "STATSD_REDIS_MAPPING_FILE", value_name = "PATH")]
    pub mapping_file: Option<PathBuf>,
    /// Also show the applications' series on /metrics, as statsd_exporter does [default: false].
    #[arg(long, env = "STATSD_REDIS_PROMETHEUS_APP_METRICS", value_name = "BOOL")]
    pub prometheus_app_metrics: Option<bool>,
    /// Expire log keys idle this long; 0 never [default: 604800].
    #[arg(long, env = "STATSD_REDIS_LOG_IDLE_SECS", value_name = "SECS")]
    pub log_idle_secs: Option<u64>,
    /// Time allowed for the final flush on SIGTERM/SIGINT [default: 10].
    #[arg(long, env = "STATSD_REDIS_SHUTDOWN_TIMEOUT_SECS", value_name = "SECS")]
    pub shutdown_timeout_secs: Option<u64>,
    /// Timeout of one Redis call [default: 2000].
    #[arg(
        long,
        global = true,
        env = "STATSD_REDIS_REDIS_TIMEOUT_MS",
        value_name = "MS"
    )]
    pub redis_timeout_ms: Option<u64>,
    /// Series per flush chunk, one transaction [default: 100].
    #[arg(long, env = "STATSD_REDIS_MAX_SERIES_PER_CHUNK", value_name = "N")]
    pub max_series_per_chunk: Option<usize>,
    /// Write counters at precision p once per min(p, SECS) seconds, and timer stats with the
    /// shortest such period, summed in the agent; 0 writes everything every window [default: 60
    /// with --retentions, else 0].
    #[arg(long, env = "STATSD_REDIS_COARSE_WRITE_SECS", value_name = "SECS")]
    pub coarse_write_secs: Option<u64>,
    /// Serve Etsy statsd's Graphite names too [default: false].
    #[arg(long, env = "STATSD_REDIS_GRAPHITE_ETSY_NAMES", value_name = "BOOL")]
    pub graphite_etsy_names: Option<bool>,
    /// Etsy's legacyNamespace [default: true].
    #[arg(
        long,
        env = "STATSD_REDIS_GRAPHITE_ETSY_LEGACY_NAMESPACE",
        value_name = "BOOL"
    )]
    pub graphite_etsy_legacy_namespace: Option<bool>,
    /// Etsy's globalPrefix [default: stats].
    #[arg(
        long,
        env = "STATSD_REDIS_GRAPHITE_ETSY_GLOBAL_PREFIX",
        value_name = "PREFIX"
    )]
    pub graphite_etsy_global_prefix: Option<String>,
    /// Etsy's globalSuffix [default: none].
    #[arg(
        long,
        env = "STATSD_REDIS_GRAPHITE_ETSY_GLOBAL_SUFFIX",
        value_name = "SUFFIX"
    )]
    pub graphite_etsy_global_suffix: Option<String>,
    /// Etsy's prefixCounter [default: counters].
    #[arg(
        long,
        env = "STATSD_REDIS_GRAPHITE_ETSY_PREFIX_COUNTER",
        value_name = "PREFIX"
    )]
    pub graphite_etsy_prefix_counter: Option<String>,
    /// Etsy's prefixTimer [default: timers].
    #[arg(
        long,
        env = "STATSD_REDIS_GRAPHITE_ETSY_PREFIX_TIMER",
        value_name = "PREFIX"
    )]
    pub graphite_etsy_prefix_timer: Option<String>,
    /// Etsy's prefixGauge [default: gauges].
    #[arg(
        long,
        env = "STATSD_REDIS_GRAPHITE_ETSY_PREFIX_GAUGE",
        value_name = "PREFIX"
    )]
    pub graphite_etsy_prefix_gauge: Option<String>,
    /// Etsy's prefixSet [default: sets].
    #[arg(
        long,
        env = "STATSD_REDIS_GRAPHITE_ETSY_PREFIX_SET",
        value_name = "PREFIX"
    )]
    pub graphite_etsy_prefix_set: Option<String>,
    /// Etsy's percentThreshold [default: 90.0].
    #[arg(
        long,
        env = "STATSD_REDIS_GRAPHITE_ETSY_PERCENT_THRESHOLD",
        value_name = "PERCENT",
        value_delimiter = ',',
        allow_negative_numbers = true
    )]
    pub graphite_etsy_percent_threshold: Option<Vec<f64>>,
    /// Agent name in flush sequence keys and the cleaner lease [default: random per start].
    #[arg(long, env = "STATSD_REDIS_AGENT_ID", value_name = "ID")]
    pub agent_id: Option<String>,
    /// Run the cleaner [default: true].
    #[arg(long, env = "STATSD_REDIS_CLEANER_ENABLED", value_name = "BOOL")]
    pub cleaner_enabled: Option<bool>,
    /// Seconds between cleaner passes [default: 60].
    #[arg(long, env = "STATSD_REDIS_CLEANER_INTERVAL_SECS", value_name = "SECS")]
    pub cleaner_interval_secs: Option<u64>,
    /// Log level or filter directives [default: info].
    #[arg(long, env = "STATSD_REDIS_LOG_LEVEL", value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// text or json [default: text].
    #[arg(long, env = "STATSD_REDIS_LOG_FORMAT", value_name = "FORMAT")]
    pub log_format: Option<LogFormat>,
}

impl Config {
    /// The precisions and how many slices each keeps: with `storage_schemas`, every precision
    /// of any of its schemas, as long as the longest keeps it (what is written, and where a long
    /// archive's blocks are cut); `retentions` when given; else `precisions` with
    /// `sample_count` (a configuration that `validate` refused reads as the latter).
    pub fn retention(&self) -> crate::retention::Retention {
        use crate::retention::Retention;
        if let Some(schemas) = &self.schemas {
            return schemas.get().union();
        }
        match self.retentions.as_str() {
            "" => Retention::book(&self.precisions, self.sample_count),
            text => Retention::parse(text)
                .unwrap_or_else(|_| Retention::book(&self.precisions, self.sample_count)),
        }
    }

    /// Each path's own schema: `storage_schemas`' sections, or [`Config::retention`] for every
    /// path.
    pub fn schemas(&self) -> crate::storage_conf::Schemas {
        match &self.schemas {
            Some(s) => s.get(),
            None => crate::storage_conf::Schemas::single(self.retention()),
        }
    }

    /// Whether the retention is carbon's (`retentions` or `storage_schemas`) rather than the
    /// book's.
    pub fn carbon_retention(&self) -> bool {
        !self.retentions.is_empty() || self.schemas.is_some()
    }

    /// The counter, gauge and set precisions in force, in the configured order.
    pub fn counter_precisions(&self) -> Vec<u64> {
        self.retention().precisions()
    }

    /// `coarse_write_secs` in force: as configured, or by default a minute with `retentions`
    /// (each write into a week of minutes scans its listpack: once a minute instead of every
    /// second keeps Redis's CPU under the book's defaults') and 0 without. The minute is rounded
    /// up to a multiple of `flush_interval_secs`, as the key must be.
    pub fn coarse_write_secs(&self) -> u64 {
        let window = self.flush_interval_secs.max(1);
        match (self.coarse_write_secs, !self.carbon_retention()) {
            (Some(k), _) => k,
            (None, false) if window <= 3600 => 60u64.div_ceil(window) * window,
            (None, _) => 0,
        }
    }

    /// How far back a timestamped value is taken: `max_timestamp_age_secs`, or by default the
    /// longest retention.
    pub fn timestamp_age_limit(&self) -> u64 {
        match self.max_timestamp_age_secs {
            0 => self.retention().longest_secs(),
            age => age,
        }
    }
}

impl Args {
    /// Defaults, then the file (if any), then these flags/variables; validated.
    pub fn into_config(self) -> Result<Config, ConfigError> {
        let default_file = Path::new(DEFAULT_CONFIG_FILE);
        let file = self
            .config
            .as_deref()
            .or_else(|| default_file.exists().then_some(default_file));
        let mut config = match file {
            Some(path) => {
                let text = read_text(path)
                    .map_err(|e| err("config", format!("{}: {e}", path.display())))?;
                Config::from_toml(&text)?
            }
            None => Config::default(),
        };
        // Every field of `Args` is named here (the destructuring has no `..`): a flag that is
        // declared but not applied does not compile. `every_key_has_a_flag_and_a_variable`
        // checks the other way, that every key has its flag.
        macro_rules! overlay {
            ($($field:ident),*) => {
                let Args { config: _, $($field),* } = self;
                $( if let Some(v) = $field { config.$field = v.into(); } )*
            };
        }
        overlay!(
            udp,
            tcp,
            carbon_tcp,
            carbon_udp,
            carbon_pickle,
            carbon_pickle_max_bytes,
            storage_aggregation,
            carbon_whitelist,
            carbon_blacklist,
            unix_datagram,
            unix_stream,
            unix_socket_mode,
            max_connections,
            stream_idle_timeout_secs,
            redis,
            redis_mode,
            redis_sentinels,
            redis_master_name,
            redis_cluster_nodes,
            redis_tls_ca_file,
            redis_tls_cert_file,
            redis_tls_key_file,
            wait_replicas,
            wait_timeout_ms,
            http,
            web_config_file,
            web_open_probes,
            udp_readers,
            key_prefix,
            precisions,
            sample_count,
            retentions,
            storage_schemas,
            quantile_relative_accuracy,
            quantile_precisions,
            quantile_write_secs,
            flush_interval_secs,
            receive_buffer_bytes,
            max_datagram_bytes,
            sanitize_names,
            max_backlog_windows,
            max_backlog_bytes,
            spool_dir,
            spool_fsync,
            max_series_per_window,
            forget_idle_secs,
            max_timestamp_age_secs,
            keep_names,
            drop_names,
            drop_types,
            drop_tags,
            relay,
            mapping_file,
            prometheus_app_metrics,
            log_idle_secs,
            shutdown_timeout_secs,
            redis_timeout_ms,
            max_series_per_chunk,
            coarse_write_secs,
            graphite_etsy_names,
            graphite_etsy_legacy_namespace,
            graphite_etsy_global_prefix,
            graphite_etsy_global_suffix,
            graphite_etsy_prefix_counter,
            graphite_etsy_prefix_timer,
            graphite_etsy_prefix_gauge,
            graphite_etsy_prefix_set,
            graphite_etsy_percent_threshold,
            agent_id,
            cleaner_enabled,
            cleaner_interval_secs,
            log_level,
            log_format
        );
        if !config.storage_schemas.as_os_str().is_empty() {
            config.schemas = Some(crate::storage_conf::SharedSchemas::new(
                crate::storage_conf::Schemas::load(&config.storage_schemas)
                    .map_err(|e| err("storage_schemas", e))?,
            ));
        }
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn listen_addresses_in_the_forms_people_write() {
        let any = |port| SocketAddr::from((std::net::Ipv6Addr::UNSPECIFIED, port));
        assert_eq!(parse_listen(":8125", "udp"), Ok(any(8125)));
        assert_eq!(parse_listen("udp://:8125", "udp"), Ok(any(8125)));
        assert_eq!(
            parse_listen("127.0.0.1:9", "tcp"),
            Ok("127.0.0.1:9".parse().unwrap())
        );
        assert_eq!(
            parse_listen("[::1]:9", "udp"),
            Ok("[::1]:9".parse().unwrap())
        );
        assert!(
            parse_listen("localhost:8125", "udp")
                .unwrap()
                .ip()
                .is_loopback()
        );
        assert!(
            parse_listen("tcp://:8125", "udp").is_err(),
            "another list's scheme"
        );
        assert!(parse_listen(":x", "udp").is_err());
        let c =
            Config::from_toml("udp = [\":8125\", \"udp://localhost:9\"]\ntcp = [\"tcp://:8126\"]")
                .unwrap();
        assert_eq!((c.udp[0], c.tcp[0]), (any(8125), any(8126)));
        assert!(c.udp[1].ip().is_loopback());
    }

    #[test]
    fn passwords_are_redacted() {
        let config = Config {
            redis: "redis://:s3cret@db:6379/0".into(),
            redis_sentinels: vec!["redis://user:s3cret@s1:26379".into(), "s2:26379".into()],
            ..Config::default()
        };
        let printed = toml::to_string(&config.redacted()).unwrap();
        assert!(!printed.contains("s3cret"), "{printed}");
        assert!(printed.contains("redis://***@db:6379/0") && printed.contains("s2:26379"));
    }

    #[test]
    fn example_file_parses_to_the_defaults() {
        let text = include_str!("../config.example.toml");
        assert_eq!(Config::from_toml(text), Ok(Config::default()));
    }

    #[test]
    fn every_key_is_in_the_example_file() {
        let text = include_str!("../config.example.toml");
        let table: toml::Table = text.parse().unwrap();
        let defaults = toml::Table::try_from(Config::default().redacted()).unwrap();
        // A key whose default depends on another is there as a comment (a value would override
        // the dependent default).
        for key in defaults.keys() {
            assert!(
                table.contains_key(key) || text.contains(&format!("\n# {key} = ")),
                "config.example.toml lacks `{key}`"
            );
        }
    }

    #[test]
    fn every_key_has_a_flag_and_a_variable() {
        let command = <Args as clap::Args>::augment_args(clap::Command::new("statsd-redis"));
        let defaults = toml::Table::try_from(Config::default().redacted()).unwrap();
        for key in defaults.keys() {
            let arg = command
                .get_arguments()
                .find(|a| a.get_id().as_str() == key)
                .unwrap_or_else(|| panic!("`{key}` has no flag"));
            assert_eq!(
                arg.get_long(),
                Some(key.replace('_', "-").as_str()),
                "{key}"
            );
            let variable = format!("STATSD_REDIS_{}", key.to_uppercase());
            assert_eq!(
                arg.get_env().and_then(|v| v.to_str()),
                Some(variable.as_str()),
                "{key}"
            );
        }
    }

    /// The `[default: …]` each flag's help shows is the default the agent really has: a value as
    /// `--print-config` writes it (lists joined by commas), or, for an empty one, `none`.
    #[test]
    fn every_flags_help_shows_the_real_default() {
        let command = <Args as clap::Args>::augment_args(clap::Command::new("statsd-redis"));
        let defaults = toml::Table::try_from(Config::default().redacted()).unwrap();
        // Defaults that depend on something else, said in words.
        let said = [
            ("redis_cluster_nodes", "the --redis URL"),
            ("redis_tls_ca_file", "the built-in roots"),
            ("agent_id", "random per start"),
            ("coarse_write_secs", "60 with --retentions, else 0"),
        ];
        let mut wrong = Vec::new();
        for (key, value) in &defaults {
            let arg = command
                .get_arguments()
                .find(|a| a.get_id().as_str() == key)
                .unwrap();
            let help = arg.get_help().map(|h| h.to_string()).unwrap_or_default();
            let Some(shown) = help
                .rsplit_once("[default: ")
                .and_then(|(_, rest)| rest.strip_suffix("].").or(rest.strip_suffix(']')))
                .map(|shown| shown.replace('\n', " "))
            else {
                wrong.push(format!("`{key}`: its help shows no default"));
                continue;
            };
            let real = match value {
                toml::Value::String(s) => s.clone(),
                toml::Value::Array(a) => a
                    .iter()
                    .map(|v| v.as_str().map_or_else(|| v.to_string(), String::from))
                    .collect::<Vec<_>>()
                    .join(","),
                other => other.to_string(),
            };
            let expected = match said.iter().find(|(k, _)| k == key) {
                Some((_, words)) => words.to_string(),
                None if real.is_empty() => "none".into(),
                None => real,
            };
            if shown != expected {
                wrong.push(format!("`{key}`: help {shown:?}, real {expected:?}"));
            }
        }
        assert!(wrong.is_empty(), "{wrong:#?}");
    }

    #[test]
    fn retentions_replace_the_books_spelling() {
        let c = Config::from_toml("retentions = \"10s:6h,1m:7d,1h:90d,1d:5y\"").unwrap();
        c.validate().unwrap();
        assert_eq!(c.counter_precisions(), [10, 60, 3600, 86_400]);
        assert_eq!(c.retention().samples(60), 10_080);
        assert_eq!(c.timestamp_age_limit(), 5 * 365 * 86_400);
        let book = Config::default();
        assert_eq!(book.counter_precisions(), DEFAULT_PRECISIONS);
        assert_eq!(book.retention().samples(86_400), 120);
        assert_eq!(book.timestamp_age_limit(), 120 * 86_400);
    }

    /// Under `retentions` the coarse precisions are written once a minute unless the key says
    /// otherwise (an explicit 0 included); the book's spelling keeps every window. The value in
    /// force is what `--print-config` shows.
    #[test]
    fn coarse_write_secs_defaults_to_a_minute_under_retentions() {
        let printed =
            |c: &Config| toml::Table::try_from(c.redacted()).unwrap()["coarse_write_secs"].clone();
        let schema = Config::from_toml("retentions = \"10s:6h,1m:7d\"").unwrap();
        assert_eq!(schema.coarse_write_secs(), 60);
        assert_eq!(printed(&schema).as_integer(), Some(60));
        let every =
            Config::from_toml("retentions = \"10s:6h,1m:7d\"\ncoarse_write_secs = 0").unwrap();
        assert_eq!(every.coarse_write_secs(), 0);
        assert_eq!(printed(&every).as_integer(), Some(0));
        assert_eq!(Config::default().coarse_write_secs(), 0);
        assert_eq!(printed(&Config::default()).as_integer(), Some(0));
        let flag = Args {
            retentions: Some("10s:6h,1m:7d".into()),
            coarse_write_secs: Some(10),
            ..Args::default()
        };
        assert_eq!(flag.into_config().unwrap().coarse_write_secs(), 10);
        let slow = Config::from_toml(
            "retentions = \"70s:1h\"\nflush_interval_secs = 7\nquantile_write_secs = 0",
        )
        .unwrap();
        slow.validate().unwrap();
        assert_eq!(slow.coarse_write_secs(), 63);
    }

    #[test]
    fn unknown_key_is_named() {
        let e = Config::from_toml("sample_cout = 5").unwrap_err();
        assert_eq!(e.key, "sample_cout");
        assert!(e.message.contains("unknown field"), "{e}");
    }

    #[test]
    fn mistyped_value_is_named() {
        let e = Config::from_toml("sample_count = \"ten\"").unwrap_err();
        assert_eq!(e.key, "sample_count");
        let e = Config::from_toml("udp = [\"nowhere\"]").unwrap_err();
        assert_eq!(e.key, "udp");
        assert!(e.message.contains("`nowhere`"), "{e}");
    }

    #[test]
    fn invalid_values_are_named() {
        let bad = |f: fn(&mut Config), key: &str| {
            let mut c = Config::default();
            f(&mut c);
            assert_eq!(c.validate().unwrap_err().key, key);
        };
        bad(|c| c.sample_count = 0, "sample_count");
        bad(|c| c.retentions = "1m:7d,7s:1d".into(), "retentions");
        bad(|c| c.retentions = "1m:1".into(), "retentions");
        bad(
            |c| {
                c.retentions = "1m:7d".into();
                c.sample_count = 1440;
            },
            "retentions",
        );
        bad(
            |c| {
                c.retentions = "1m:7d".into();
                c.precisions = vec![60];
            },
            "retentions",
        );
        bad(
            |c| c.graphite_etsy_global_suffix = "a;b".into(),
            "graphite_etsy_global_suffix",
        );
        bad(
            |c| c.graphite_etsy_prefix_set = "se ts".into(),
            "graphite_etsy_prefix_set",
        );
        bad(
            |c| c.graphite_etsy_prefix_timer = "t*".into(),
            "graphite_etsy_prefix_timer",
        );
        bad(
            |c| c.graphite_etsy_percent_threshold = vec![90.0, 0.0],
            "graphite_etsy_percent_threshold",
        );
        bad(|c| c.precisions = vec![], "precisions");
        bad(|c| c.precisions = vec![1, 0], "precisions");
        bad(|c| c.precisions = vec![5, 5], "precisions");
        bad(|c| c.flush_interval_secs = 0, "flush_interval_secs");
        bad(|c| c.udp = vec![], "udp");
        bad(|c| c.unix_socket_mode = "0999".into(), "unix_socket_mode");
        bad(|c| c.unix_stream = vec![PathBuf::new()], "unix_stream");
        bad(|c| c.max_connections = 0, "max_connections");
        bad(|c| c.log_level = "info,store=loud".into(), "log_level");
        bad(
            |c| c.quantile_relative_accuracy = 0.0,
            "quantile_relative_accuracy",
        );
        bad(
            |c| c.quantile_relative_accuracy = f64::NAN,
            "quantile_relative_accuracy",
        );
        bad(|c| c.quantile_precisions = vec![0], "quantile_precisions");
        bad(|c| c.quantile_write_secs = 120, "quantile_write_secs");
        bad(|c| c.max_datagram_bytes = 100, "max_datagram_bytes");
        bad(|c| c.cleaner_interval_secs = 0, "cleaner_interval_secs");
        bad(|c| c.max_backlog_bytes = 1000, "max_backlog_bytes");
        bad(|c| c.max_series_per_window = 0, "max_series_per_window");
        bad(|c| c.forget_idle_secs = 1, "forget_idle_secs");
        bad(
            |c| {
                c.wait_replicas = 1;
                c.wait_timeout_ms = 2000;
            },
            "wait_timeout_ms",
        );
    }

    #[test]
    fn flags_override_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("c.toml");
        std::fs::write(&path, "sample_count = 7\nkey_prefix = \"file:\"\n").unwrap();
        let args = Args {
            config: Some(path),
            sample_count: Some(9),
            ..Args::default()
        };
        let c = args.into_config().unwrap();
        assert_eq!((c.sample_count, c.key_prefix.as_str()), (9, "file:"));
    }
}
