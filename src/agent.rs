//! Wiring: [`bind`] opens the sockets (so callers, tests included, learn the real addresses
//! before anything runs), [`run`] starts readers, flusher and HTTP server and owns the shutdown
//! order: stop the readers (each reads what the kernel still holds), then the final flush.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::aggregate::{Mapping, Window};
use crate::config::{Config, RedisMode, redacted};
use crate::flush::Flusher;
use crate::http::{AppState, router, web_config};
use crate::ingest::datagram::{self, DatagramReader};
use crate::ingest::relay::{Relay, Target};
use crate::ingest::rules::{Rules, SharedRules};
use crate::ingest::stream;
use crate::ingest::{BadLineLog, LineHandler, SocketFile, Transport};
use crate::prometheus::AppSeries;
use crate::spool::{Spool, SpoolError};
use crate::store::clock::Clock;
use crate::store::{Cleaner, Store, Writer};
use crate::telemetry::Telemetry;

#[derive(Debug, thiserror::Error)]
pub enum AgentError {
    #[error("cannot listen on UDP {addr}: {source}")]
    Udp {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot listen on {what}: {source}")]
    Listen {
        what: String,
        source: std::io::Error,
    },
    #[error("cannot listen on HTTP {addr}: {source}")]
    Http {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error(transparent)]
    Config(#[from] crate::config::ConfigError),
    #[error(transparent)]
    Spool(#[from] SpoolError),
}

/// The agent's sockets, bound but not yet read.
#[derive(Debug)]
pub struct Listeners {
    pub udp: Vec<datagram::BoundUdp>,
    /// Carbon's plaintext lines over UDP (`carbon_udp`).
    pub carbon_udp: Vec<datagram::BoundUdp>,
    pub unix_datagram: Vec<(std::os::unix::net::UnixDatagram, SocketFile)>,
    /// TCP (StatsD's and carbon's) and unix stream listeners.
    pub streams: Vec<stream::Listener>,
    pub http: std::net::TcpListener,
}

impl Listeners {
    pub fn tcp_addrs(&self) -> Vec<SocketAddr> {
        self.stream_addrs(Transport::Tcp)
    }

    pub fn carbon_tcp_addrs(&self) -> Vec<SocketAddr> {
        self.stream_addrs(Transport::CarbonTcp)
    }

    pub fn carbon_pickle_addrs(&self) -> Vec<SocketAddr> {
        self.stream_addrs(Transport::CarbonPickle)
    }

    fn stream_addrs(&self, transport: Transport) -> Vec<SocketAddr> {
        self.streams
            .iter()
            .filter_map(|s| match s {
                stream::Listener::Tcp(l, t) if *t == transport => l.local_addr().ok(),
                _ => None,
            })
            .collect()
    }

    pub fn carbon_udp_addrs(&self) -> Vec<SocketAddr> {
        self.carbon_udp
            .iter()
            .filter_map(|u| u.socket.local_addr().ok())
            .collect()
    }

    pub fn udp_addrs(&self) -> Vec<SocketAddr> {
        self.udp
            .iter()
            .filter_map(|u| u.socket.local_addr().ok())
            .collect()
    }

    pub fn http_addr(&self) -> Option<SocketAddr> {
        self.http.local_addr().ok()
    }
}

/// What [`Config::validate`] leaves to the modules that read it: the filters and the mapping
/// file, the relay's targets (none of them the agent itself), the web configuration file. One
/// error naming the key, as for the rest of the configuration.
pub fn check(config: &Config) -> Result<(), crate::config::ConfigError> {
    Rules::from_config(config)?;
    Target::parse_checked(config)?;
    web_config::load_configured(config)?;
    crate::storage_conf::Aggregations::load(&config.storage_aggregation)
        .map_err(|e| crate::config::err("storage_aggregation", e))?;
    Ok(())
}

/// Binds every UDP address and the HTTP address of `config`.
pub fn bind(config: &Config) -> Result<Listeners, AgentError> {
    let mut sockets = Vec::new();
    let shared = config.udp_readers > 1;
    for &addr in &config.udp {
        let bind = |addr| {
            datagram::bind(addr, config.receive_buffer_bytes, shared)
                .map_err(|source| AgentError::Udp { addr, source })
        };
        let first = bind(addr)?;
        // Port 0 picks a port once; the other readers share the one picked.
        let port_addr = first.socket.local_addr().unwrap_or(addr);
        tracing::info!(
            addr = %port_addr,
            readers = config.udp_readers,
            receive_buffer_bytes = first.receive_buffer_bytes,
            requested = config.receive_buffer_bytes,
            "listening for StatsD (UDP; the kernel reports twice the usable buffer)"
        );
        // The kernel reports twice what it grants; less than asked means net.core.rmem_max
        // capped it (no CAP_NET_ADMIN), and bursts that the buffer was meant for are dropped.
        if first.receive_buffer_bytes / 2 < config.receive_buffer_bytes {
            tracing::warn!(
                addr = %port_addr,
                granted = first.receive_buffer_bytes / 2,
                requested = config.receive_buffer_bytes,
                "the kernel granted a smaller UDP receive buffer than asked: raise net.core.rmem_max (sysctl -w net.core.rmem_max={}) or give the agent CAP_NET_ADMIN",
                config.receive_buffer_bytes
            );
        }
        sockets.push(first);
        for _ in 1..config.udp_readers {
            sockets.push(bind(port_addr)?);
        }
    }
    let listen_err = |what: String| move |source| AgentError::Listen { what, source };
    let mode = config.socket_mode()?;
    let mut unix_datagram = Vec::new();
    // `unixgram:///run/x.sock` and `unix:///run/x.sock` as the Datadog clients write them.
    let unscheme = |path: &std::path::Path, scheme: &str| {
        let text = path.to_string_lossy();
        text.strip_prefix(scheme)
            .map_or_else(|| path.to_path_buf(), std::path::PathBuf::from)
    };
    for path in &config.unix_datagram {
        let path = &unscheme(path, "unixgram://");
        let bound = datagram::bind_unix(path, mode, config.receive_buffer_bytes).map_err(
            listen_err(format!("unix datagram socket {}", path.display())),
        )?;
        tracing::info!(path = %path.display(), "listening for StatsD (unix datagrams)");
        unix_datagram.push(bound);
    }
    let mut streams = Vec::new();
    let tcp = [
        (&config.tcp, Transport::Tcp, "StatsD (TCP)"),
        (
            &config.carbon_tcp,
            Transport::CarbonTcp,
            "carbon's plaintext lines (TCP)",
        ),
        (
            &config.carbon_pickle,
            Transport::CarbonPickle,
            "carbon's pickle protocol (TCP)",
        ),
    ];
    for (addrs, transport, what) in tcp {
        for &addr in addrs {
            let listener = stream::Listener::bind_tcp(addr, transport)
                .map_err(listen_err(format!("{what} {addr}")))?;
            tracing::info!(addr = %addr, "listening for {what}");
            streams.push(listener);
        }
    }
    let mut carbon_udp = Vec::new();
    for &addr in &config.carbon_udp {
        let bound = datagram::bind(addr, config.receive_buffer_bytes, false)
            .map_err(|source| AgentError::Udp { addr, source })?;
        tracing::info!(addr = %bound.socket.local_addr().unwrap_or(addr), "listening for carbon's plaintext lines (UDP)");
        carbon_udp.push(bound);
    }
    for path in &config.unix_stream {
        let path = &unscheme(path, "unix://");
        let listener = stream::Listener::bind_unix(path, mode)
            .map_err(listen_err(format!("unix stream socket {}", path.display())))?;
        tracing::info!(path = %path.display(), "listening for StatsD (unix stream)");
        streams.push(listener);
    }
    let http_err = |source| AgentError::Http {
        addr: config.http,
        source,
    };
    let http = std::net::TcpListener::bind(config.http).map_err(http_err)?;
    http.set_nonblocking(true).map_err(http_err)?;
    tracing::info!(
        addr = %http.local_addr().unwrap_or(config.http),
        "serving /metrics, /healthz, /readyz, the JSON API and the dashboard (HTTP)"
    );
    Ok(Listeners {
        udp: sockets,
        carbon_udp,
        unix_datagram,
        streams,
        http,
    })
}

/// A random id for flush sequence keys and the cleaner lease when the configuration names none.
fn agent_id(config: &Config) -> String {
    if config.agent_id.is_empty() {
        format!("{:016x}", rand::random::<u64>())
    } else {
        config.agent_id.clone()
    }
}

/// Runs the agent until `shutdown` is cancelled, then stops in order and returns. Its time is
/// `clock`'s ([`Clock::system`] but in tests).
pub async fn run(
    config: Config,
    listeners: Listeners,
    telemetry: Arc<Telemetry>,
    clock: Clock,
    shutdown: CancellationToken,
) -> Result<(), AgentError> {
    let (_, reloads) = tokio::sync::watch::channel(config.clone());
    run_reloading(config, listeners, telemetry, clock, shutdown, reloads).await
}

/// [`run`], taking from `reloads` the keys of a reloaded configuration that apply without a
/// restart (`max_series_per_chunk`, `max_backlog_windows`, `max_backlog_bytes`,
/// `cleaner_interval_secs`, the filters; the binary applies `log_level` itself).
pub async fn run_reloading(
    config: Config,
    listeners: Listeners,
    telemetry: Arc<Telemetry>,
    clock: Clock,
    shutdown: CancellationToken,
    reloads: tokio::sync::watch::Receiver<Config>,
) -> Result<(), AgentError> {
    // Before any reader: the first window holds whatever they take from now on.
    let opened = clock.now();
    let store = Store::open(&config)?;
    let spool = if config.spool_dir.as_os_str().is_empty() {
        None
    } else {
        Some(Spool::open(&config.spool_dir, config.spool_fsync)?)
    };
    // Every step that can fail comes before the first spawn (the stream listeners' registration
    // below included): a failure returns, and the binary exits 1, instead of leaving readers
    // running.
    let web = Arc::new(web_config::Shared::new(web_config::load_configured(
        &config,
    )?));
    let rules = Rules::from_config(&config)?;
    warn_ignored(&rules);
    let rules = Arc::new(SharedRules::new(rules));
    let mapping = Mapping::new(config.quantile_relative_accuracy);
    let app_series = config.prometheus_app_metrics.then(|| {
        Arc::new(AppSeries::new(
            rules.clone(),
            mapping,
            config.max_series_per_window,
        ))
    });
    let app = router(
        AppState::new(
            telemetry.clone(),
            store.clone(),
            config.clone(),
            clock.clone(),
            web.clone(),
        )
        .with_app_series(app_series.clone()),
    );
    let server = crate::http::serve(
        listeners.http,
        app,
        web.clone(),
        telemetry.clone(),
        shutdown.clone(),
    )
    .map_err(|source| AgentError::Http {
        addr: config.http,
        source,
    })?;
    let tracker = TaskTracker::new();
    let relay = match config.relay.as_slice() {
        [] => None,
        targets => {
            let targets = Target::parse_all(targets)?;
            let relay =
                Relay::start(&targets, &telemetry).map_err(|source| AgentError::Listen {
                    what: "the relay".into(),
                    source,
                })?;
            Some(relay)
        }
    };

    let mut windows = Vec::new();
    let mut new_window = || {
        let window = Arc::new(Mutex::new(Window {
            observe: app_series.is_some(),
            ..Window::new(mapping)
        }));
        windows.push(window.clone());
        window
    };
    let mut serving = Vec::new();
    for listener in listeners.streams {
        let settings = stream::Settings {
            window: new_window(),
            telemetry: telemetry.clone(),
            sanitize_names: config.sanitize_names,
            max_series: config.max_series_per_window,
            max_line_bytes: config.max_datagram_bytes,
            max_pickle_bytes: config.carbon_pickle_max_bytes,
            max_connections: config.max_connections,
            idle_timeout: (config.stream_idle_timeout_secs > 0)
                .then(|| Duration::from_secs(config.stream_idle_timeout_secs)),
            bad_lines: Arc::new(BadLineLog::default()),
            rules: rules.clone(),
            relay: relay.clone(),
        };
        let transport = listener.transport();
        let serve = stream::serve(listener, settings, tracker.clone(), shutdown.clone()).map_err(
            |source| AgentError::Listen {
                what: format!("the {} listener", transport.as_str()),
                source,
            },
        )?;
        serving.push(serve);
    }
    let datagram_sockets = listeners
        .udp
        .into_iter()
        .map(|bound| (Transport::Udp, bound.socket.into(), None))
        .chain(
            listeners
                .carbon_udp
                .into_iter()
                .map(|bound| (Transport::CarbonUdp, bound.socket.into(), None)),
        )
        .chain(
            listeners
                .unix_datagram
                .into_iter()
                .map(|(socket, file)| (Transport::Unixgram, socket.into(), Some(file))),
        );
    for (transport, socket, file) in datagram_sockets {
        let reader = DatagramReader {
            socket,
            transport,
            window: new_window(),
            handler: LineHandler::new(config.sanitize_names, config.max_series_per_window)
                .with_rules(rules.clone())
                .with_relay(relay.clone())
                .for_transport(transport),
            telemetry: telemetry.clone(),
            max_datagram_bytes: config.max_datagram_bytes,
        };
        let stop = shutdown.clone();
        tracker.spawn_blocking(move || {
            reader.run(stop);
            drop::<Option<SocketFile>>(file);
        });
    }
    for serve in serving {
        tracker.spawn(serve);
    }
    tracker.close();

    let id = agent_id(&config);
    match config.redis_mode {
        RedisMode::Standalone => {
            tracing::info!(agent_id = %id, redis = %redacted(&config.redis), "agent started")
        }
        RedisMode::Sentinel => tracing::info!(
            agent_id = %id,
            sentinels = ?config.redis_sentinels.iter().map(|s| redacted(s)).collect::<Vec<_>>(),
            master = %config.redis_master_name,
            "agent started (Redis through Sentinel)"
        ),
        RedisMode::Cluster => {
            let seeds = match config.redis_cluster_nodes.as_slice() {
                [] => std::slice::from_ref(&config.redis),
                seeds => seeds,
            };
            tracing::info!(
                agent_id = %id,
                seeds = ?seeds.iter().map(|s| redacted(s)).collect::<Vec<_>>(),
                "agent started (Redis Cluster)"
            )
        }
    }
    let cleaner = config.cleaner_enabled.then(|| {
        let cleaner = Cleaner::new(
            store.clone(),
            id.clone(),
            Duration::from_secs(config.cleaner_interval_secs),
            &config.retention(),
            telemetry.clone(),
        )
        .forgetting(config.forget_idle_secs)
        .trimming(config.schemas(), crate::storage_conf::Namer::new(&config))
        .packing(&config.quantile_precisions, &config.retention());
        tokio::spawn(cleaner.run(clock.clone(), shutdown.clone(), Some(reloads.clone())))
    });
    // Carbon's open coarser slices (`crate::store::rollup`), by the agents that take carbon's
    // points (a reader's Redis user may call no script).
    let rollups_stop = CancellationToken::new();
    let carbon = !(config.carbon_tcp.is_empty()
        && config.carbon_udp.is_empty()
        && config.carbon_pickle.is_empty());
    let rollups = carbon.then(|| {
        let period = config.coarse_write_secs().max(config.flush_interval_secs);
        let rollups = crate::store::rollup::Rollups::new(
            store.clone(),
            Duration::from_secs(period),
            telemetry.clone(),
        );
        tokio::spawn(rollups.run(clock.clone(), rollups_stop.clone()))
    });
    tokio::spawn(take_rules(reloads.clone(), rules, shutdown.clone()));
    tokio::spawn(take_web_config(reloads.clone(), web, shutdown.clone()));
    let wait = (config.wait_replicas > 0).then_some((config.wait_replicas, config.wait_timeout_ms));
    let writer =
        Writer::new(store.clone(), wait, telemetry.clone()).with_hash_fields(Cleaner::most_fields(
            &config.retention(),
            Duration::from_secs(config.cleaner_interval_secs),
        ));
    let flusher_stop = CancellationToken::new();
    // Chunks are numbered per run, not per agent: a restart with the same agent_id starts its
    // own sequence.
    let run_id = format!("{id}.{:08x}", rand::random::<u32>());
    let flusher = tokio::spawn(
        Flusher::new(
            windows,
            writer,
            &run_id,
            spool,
            config.clone(),
            (clock, opened),
            telemetry.clone(),
        )
        .with_reloads(reloads)
        .with_app_series(app_series)
        .run(flusher_stop.clone()),
    );

    shutdown.cancelled().await;
    tracing::info!("shutting down: reading what is queued, then the final flush");
    tracker.wait().await;
    flusher_stop.cancel();
    let _ = flusher.await;
    rollups_stop.cancel();
    if let Some(rollups) = rollups {
        let _ = rollups.await;
    }
    if let Some(cleaner) = cleaner {
        let _ = cleaner.await;
    }
    let _ = tokio::task::spawn_blocking(move || server.join()).await;
    Ok(())
}

/// Gives the readers the filters of each reloaded configuration (validated before it is sent:
/// they compile) until `stop`.
async fn take_rules(
    mut reloads: tokio::sync::watch::Receiver<Config>,
    rules: Arc<SharedRules>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = reloads.changed() => if changed.is_err() { return },
        }
        let compiled = Rules::from_config(&reloads.borrow_and_update());
        match compiled {
            Ok(new) => {
                warn_ignored(&new);
                rules.replace(new)
            }
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: the filters do not compile; the running ones are kept")
            }
        }
    }
}

/// Reads the web configuration file again at each reloaded configuration (its name changed or
/// not: a SIGHUP is how new users, headers or a new CA take effect) until `stop`. A file that
/// does not read keeps the running one.
async fn take_web_config(
    mut reloads: tokio::sync::watch::Receiver<Config>,
    web: Arc<web_config::Shared>,
    stop: CancellationToken,
) {
    loop {
        tokio::select! {
            _ = stop.cancelled() => return,
            changed = reloads.changed() => if changed.is_err() { return },
        }
        let config = reloads.borrow_and_update().clone();
        // Off the runtime: the certificates and the CA are read from disk.
        match tokio::task::spawn_blocking(move || web_config::load_configured(&config)).await {
            Ok(Ok(new)) => {
                if new.is_none() && web.current().is_some() {
                    tracing::warn!(
                        "SIGHUP: web_config_file is now empty: the HTTP port serves plain HTTP without passwords"
                    );
                }
                web.replace(new);
            }
            Ok(Err(e)) => {
                tracing::error!(error = %e, "SIGHUP: the web configuration file does not read; the running one is kept")
            }
            Err(_) => {}
        }
    }
}

/// Names, once per reading of the mapping file, the keys it holds that the agent ignores.
fn warn_ignored(rules: &Rules) {
    let keys = &rules.mapper.ignored_keys;
    if !keys.is_empty() {
        tracing::warn!(
            keys = ?keys,
            "mapping_file: these keys shape only statsd_exporter's own output (its summaries' buffer, its protobuf native histograms); they are accepted and ignored"
        );
    }
}
