//! # statsd-redis
//!
//! A StatsD / DogStatsD UDP agent that aggregates in one-second windows and writes them into
//! Redis in the layout of *Redis in Action* chapter 5.
//!
//! ## Layout
//! The modules follow a datagram:
//! * [`protocol`]: pure parsing, bytes → lines → samples, events and service checks; series names.
//! * [`ingest`]: UDP sockets; each reader parses into its own [`aggregate::Window`].
//! * [`aggregate`]: one window's state per series, merged across readers; the [`aggregate::Ledger`]
//!   keeps what lives across windows (counter carries, gauge values).
//! * [`flush`]: at every window boundary, close the window and queue it (`flush/mod.rs`); a writer
//!   works the queue (the backlog, `flush/backlog.rs`) oldest first, with retry;
//!   `coarse_write_secs` in `flush/coarse.rs` alone.
//! * [`spool`]: closed windows on disk until Redis has them, replayed after a crash.
//! * [`store`]: the [`store::Store`] handle (one server, Sentinel or Redis Cluster), Redis key
//!   names (one place), the flush and cleaner scripts, the writer (per slot in a cluster), the
//!   cleaner, the reader and the queries the CLI and the API share.
//! * [`http`]: `/metrics`, `/healthz`, `/readyz`, the JSON API, the Graphite API and the
//!   dashboard; behind exporter-toolkit's web configuration file, TLS and bcrypt users.
//! * [`graphite`]: the layout read back as Graphite: targets, functions, names, as
//!   graphite-web answers them.
//! * [`prometheus`]: the applications' series on `/metrics` (`prometheus_app_metrics`), fed
//!   from each closed window, as statsd_exporter shows them.
//! * [`telemetry`]: every self-metric, named and described in one place.
//! * [`config`]: defaults, TOML file, environment and flags; [`retention`]: how long each
//!   precision is kept.
//! * [`agent`]: binds the sockets and runs everything with one shutdown order.
//! * [`cli`]: `statsd-redis get …`, the queries' answers as tables or JSON.
//! * [`import`]: `statsd-redis import whisper …`, the history of carbon's whisper files.
//!
//! `docs/architecture.md` follows a datagram step by step, with the file and function of each.

pub mod agent;
pub mod aggregate;
pub mod cli;
pub mod config;
pub mod flush;
pub mod graphite;
pub mod http;
pub mod import;
pub mod ingest;
pub mod prometheus;
pub mod protocol;
pub mod retention;
pub mod spool;
pub mod storage_conf;
pub mod store;
pub mod telemetry;
