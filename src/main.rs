//! The `statsd-redis` binary: flags → [`Config`] → [`agent::run`], or `get …` → [`cli::run`].
//! Exit codes: 0 fine, 1 runtime failure (or, for `get`, an unknown series), 2 bad
//! configuration or arguments, 3 (`get`) Redis unreachable.

use std::process::ExitCode;
use std::sync::Arc;

use anyhow::Context;
use clap::Parser;
use statsd_redis::config::{Args, Config, LogFormat};
use statsd_redis::store::Store;
use statsd_redis::telemetry::Telemetry;
use statsd_redis::{agent, cli};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing_subscriber::EnvFilter;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;

#[derive(Parser)]
#[command(
    name = "statsd-redis",
    version = concat!(env!("CARGO_PKG_VERSION"), " (", env!("STATSD_REDIS_COMMIT"), ")"),
    about = "StatsD/DogStatsD agent writing Redis in Action's layout"
)]
struct Cli {
    /// Print the effective configuration (defaults < file < environment < flags) as TOML and exit.
    #[arg(long)]
    print_config: bool,
    #[command(flatten)]
    args: Args,
    #[command(subcommand)]
    command: Option<Command>,
}

#[derive(clap::Subcommand)]
enum Command {
    /// Read back what the agent stored in Redis (uses the Redis settings, --key-prefix, and
    /// the precisions and write schedule of --config: give it the agent's).
    Get {
        /// Print JSON instead of a table.
        #[arg(long, global = true)]
        json: bool,
        #[command(subcommand)]
        query: cli::Query,
    },
    /// Bring history into the layout (uses the Redis settings, --key-prefix, precisions and
    /// sample_count of --config: give it the agent's).
    Import {
        #[command(subcommand)]
        source: ImportSource,
    },
}

#[derive(clap::Subcommand)]
enum ImportSource {
    /// The whisper files Etsy's statsd left through carbon: counters (stats_counts.*) and
    /// gauges (stats.gauges.*), at every precision their archives fill whole; every other
    /// path at its schema's precisions, its archives as whisper holds them.
    Whisper {
        /// carbon's storage directory (the one holding stats_counts/ and stats/).
        dir: std::path::PathBuf,
        /// Leave alone the slices that end after this moment (Unix seconds): those the agent
        /// writes [default: now].
        #[arg(long)]
        until: Option<u64>,
        /// The tagged paths whose files carbon named by their hash (TAG_HASH_FILENAMES): a
        /// file of graphite-web's answer to /tags/findSeries?expr=name=~. or one path a line.
        #[arg(long)]
        tagged_names: Option<std::path::PathBuf>,
    },
}

/// One malloc arena for the whole process. glibc gives each thread that allocates an arena of
/// its own (up to 8 per core), and keys allocated by a reader thread but freed by the flusher
/// fragment them all: at 110 000 active series the agent's peak RSS was 88 MB with the default
/// and 55 MB with one arena (docs/benchmarks.md). Small allocations still come from each
/// thread's cache without the arena lock, and the per-line path allocates nothing.
///
/// The arena keeps up to [`KEPT_FREE`] of freed memory at its top instead of handing it back
/// at every `free`, and takes blocks below [`OWN_MAPPING`] from the heap: a Graphite render of a
/// day of 100 series holds a few MB (its points, the blocks' replies), and each render faulted
/// that memory in again, page by page (a tenth of its CPU; docs/benchmarks.md, "Renders:
/// one write, freed memory kept"). Larger blocks are still mapped and unmapped alone.
fn one_malloc_arena() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: mallopt only sets tunables; it runs before any other thread exists.
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
        libc::mallopt(libc::M_TRIM_THRESHOLD, KEPT_FREE);
        libc::mallopt(libc::M_MMAP_THRESHOLD, OWN_MAPPING);
    }
}

/// Freed memory (bytes) the malloc arena keeps at its top before handing it back.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const KEPT_FREE: libc::c_int = 8 << 20;

/// Blocks (bytes) at least this large get a mapping of their own, unmapped when freed.
#[cfg(all(target_os = "linux", target_env = "gnu"))]
const OWN_MAPPING: libc::c_int = 4 << 20;

/// SIGHUP's default action ends the process, and the reload handler is installed only once the
/// configuration is read and the runtime runs: a `systemctl reload` racing a start would kill
/// the agent. Ignored from the first instruction until that handler replaces the action (a
/// reload that early has nothing to reload: the configuration is being read anyway).
fn ignore_hangups_until_handled() {
    // SAFETY: sets a signal's disposition to SIG_IGN; no handler code runs.
    unsafe {
        libc::signal(libc::SIGHUP, libc::SIG_IGN);
    }
}

/// The configuration from the flags, the environment and the file, validated (what its files
/// and lists hold included), and its `redis*` keys checked by opening a store (nothing is
/// connected): a bad URL is a configuration error.
fn settle(args: Args) -> Result<Config, statsd_redis::config::ConfigError> {
    let config = args.into_config()?;
    agent::check(&config)?;
    Store::check(&config)?;
    Ok(config)
}

fn main() -> ExitCode {
    ignore_hangups_until_handled();
    one_malloc_arena();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) if e.use_stderr() => {
            // One line that names the flag, or the environment variable the value came from;
            // clap's usage hints would bury it.
            let text = e.to_string();
            let line = text.lines().next().unwrap_or("invalid arguments");
            eprintln!(
                "{}",
                from_environment(&e, line).unwrap_or_else(|| line.to_string())
            );
            return ExitCode::from(2);
        }
        Err(e) => {
            let _ = e.print();
            return ExitCode::SUCCESS;
        }
    };
    let config = match settle(cli.args.clone()) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    if let Some(Command::Get { json, query }) = &cli.command {
        return get(&config, query, *json);
    }
    if let Some(Command::Import {
        source:
            ImportSource::Whisper {
                dir,
                until,
                tagged_names,
            },
    }) = &cli.command
    {
        return import_whisper(&config, dir, *until, tagged_names.as_deref());
    }
    if cli.print_config {
        match toml::to_string(&config.redacted()) {
            Ok(text) => {
                write_out(&text);
                return ExitCode::SUCCESS;
            }
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(1);
            }
        }
    }
    let log_level = init_logs(&config);
    let reload = Reload {
        args: cli.args,
        log_level,
        running: config.clone(),
        agent: None,
    };
    match run(config, reload) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {}", causes(&e));
            ExitCode::from(1)
        }
    }
}

/// An error and its causes, each cause that the text so far does not already say (many errors
/// print their cause in their own message).
fn causes(e: &anyhow::Error) -> String {
    let mut text = e.to_string();
    for cause in e.chain().skip(1).map(ToString::to_string) {
        if !text.contains(&cause) {
            text = format!("{text}: {cause}");
        }
    }
    text
}

/// clap names the flag even when the bad value came from its `STATSD_REDIS_*` variable: when
/// the flag is not on the command line and the variable is set, the line names the variable.
fn from_environment(e: &clap::Error, line: &str) -> Option<String> {
    let arg = e.get(clap::error::ContextKind::InvalidArg)?.to_string();
    let flag = arg.split_whitespace().next()?.strip_prefix("--")?;
    let on_command_line =
        std::env::args().any(|a| a == format!("--{flag}") || a.starts_with(&format!("--{flag}=")));
    let variable = format!("STATSD_REDIS_{}", flag.replace('-', "_").to_uppercase());
    (!on_command_line && std::env::var_os(&variable).is_some())
        .then(|| line.replace(&format!("'{arg}'"), &format!("{variable} (--{flag})")))
}

/// Writes to stdout; a reader that went away (`| head`) ends the output quietly, not in a
/// panic.
fn write_out(text: &str) {
    use std::io::Write;
    let _ = std::io::stdout().lock().write_all(text.as_bytes());
}

/// `import whisper`: a progress line on stderr, each file that does not read named, then what
/// was imported. Exit code 2 when `dir` is no directory, 3 when Redis cannot be reached.
#[tokio::main(flavor = "current_thread")]
async fn import_whisper(
    config: &Config,
    dir: &std::path::Path,
    until: Option<u64>,
    tagged_names: Option<&std::path::Path>,
) -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    if !dir.is_dir() {
        eprintln!("error: {}: not a directory", dir.display());
        return ExitCode::from(2);
    }
    let tagged = match tagged_names.map(|path| {
        statsd_redis::config::read_text(path)
            .map_err(|e| e.to_string())
            .and_then(|text| statsd_redis::import::TaggedNames::parse(&text))
            .map_err(|e| format!("--tagged-names {}: {e}", path.display()))
    }) {
        None => Default::default(),
        Some(Ok(tagged)) => tagged,
        Some(Err(e)) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    let until = until.unwrap_or_else(statsd_redis::store::clock::unix_now);
    let progress = |done: &statsd_redis::import::Imported, files: usize| {
        eprint!(
            "\rimporting {}: {}/{files} files, {} points read, {} slices written",
            dir.display(),
            done.files + done.skipped.len(),
            done.points,
            done.slices
        );
    };
    match statsd_redis::import::import(config, dir, (until, &tagged), progress).await {
        Ok(imported) => {
            eprintln!();
            for (path, why) in &imported.skipped {
                eprintln!("skipped {}: {why}", path.display());
            }
            for (path, why) in &imported.left_out {
                eprintln!("left out of {}: {why}", path.display());
            }
            write_out(&format!(
                "imported {} files ({} points read, {} slices written), skipped {}\n",
                imported.files,
                imported.points,
                imported.slices,
                imported.skipped.len()
            ));
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("\nerror: {e}");
            ExitCode::from(3)
        }
    }
}

#[tokio::main(flavor = "current_thread")]
async fn get(config: &Config, query: &cli::Query, json: bool) -> ExitCode {
    let _ = rustls::crypto::ring::default_provider().install_default();
    match cli::run(config, query, json).await {
        Ok(text) => {
            write_out(&text);
            if json {
                write_out("\n");
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(cli::exit_code(&e))
        }
    }
}

type LogFilter = tracing_subscriber::reload::Handle<EnvFilter, tracing_subscriber::Registry>;

/// Logs to stderr in `log_format`, filtered by `RUST_LOG` when set, else by `log_level`; returns
/// the handle that changes the filter on SIGHUP (`None` while `RUST_LOG` rules).
fn init_logs(config: &Config) -> Option<LogFilter> {
    // An empty RUST_LOG is no filter at all, not one that logs nothing.
    let from_env = std::env::var("RUST_LOG")
        .is_ok_and(|v| !v.trim().is_empty())
        .then(|| EnvFilter::try_from_default_env().ok())
        .flatten();
    let env_rules = from_env.is_some();
    let filter = from_env.unwrap_or_else(|| EnvFilter::new(&config.log_level));
    let (filter, handle) = tracing_subscriber::reload::Layer::new(filter);
    let registry = tracing_subscriber::registry().with(filter);
    let stderr = std::io::stderr;
    match config.log_format {
        LogFormat::Text => registry
            .with(
                tracing_subscriber::fmt::layer()
                    .with_writer(stderr)
                    .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr())),
            )
            .init(),
        LogFormat::Json => registry
            .with(tracing_subscriber::fmt::layer().json().with_writer(stderr))
            .init(),
    }
    (!env_rules).then_some(handle)
}

/// What SIGHUP needs: the flags and environment to read the configuration again with, the log
/// filter to change, and the configuration running.
struct Reload {
    args: Args,
    log_level: Option<LogFilter>,
    running: Config,
    /// Hands the running agent a configuration whose reloadable keys changed.
    agent: Option<tokio::sync::watch::Sender<Config>>,
}

/// Keys a SIGHUP applies to the running agent (`log_level` in the binary, the others through
/// [`agent::run_reloading`]), besides the files of [`REREAD`]; a change to any other waits for
/// a restart.
const RELOADABLE: [&str; 9] = [
    "log_level",
    "max_series_per_chunk",
    "max_backlog_windows",
    "max_backlog_bytes",
    "cleaner_interval_secs",
    "keep_names",
    "drop_names",
    "drop_types",
    "drop_tags",
];

/// Files a SIGHUP reads again, their names changed or not (what changed is in them), and
/// applies.
const REREAD: [&str; 6] = [
    "mapping_file",
    "web_config_file",
    "storage_aggregation",
    "storage_schemas",
    "carbon_whitelist",
    "carbon_blacklist",
];

/// Whether a SIGHUP applies `key`.
fn reloadable(key: &str) -> bool {
    RELOADABLE.contains(&key) || REREAD.contains(&key)
}

impl Reload {
    /// Reads the configuration again. A bad one is logged and the running one kept;
    /// `log_level` is applied; any other key that changed is logged as taking effect at the
    /// next start (the sockets, windows, writer and cleaner were made from the old values).
    fn apply(&mut self) {
        let new = match settle(self.args.clone()) {
            Ok(new) => new,
            Err(e) => {
                tracing::error!(error = %e, "SIGHUP: the configuration does not read; the running one is kept");
                return;
            }
        };
        if new.log_level != self.running.log_level {
            match &self.log_level {
                Some(handle) => match handle.reload(EnvFilter::new(&new.log_level)) {
                    Ok(()) => {
                        tracing::info!(log_level = %new.log_level, "SIGHUP: log_level applied")
                    }
                    Err(e) => tracing::error!(error = %e, "SIGHUP: cannot change the log filter"),
                },
                None => tracing::warn!("SIGHUP: RUST_LOG is set, so log_level does not apply"),
            }
        }
        let (old, fresh) = (toml_table(&self.running), toml_table(&new));
        let reread = |key: &str, value: &toml::Value| {
            REREAD.contains(&key) && value.as_str().is_some_and(|path| !path.is_empty())
        };
        let mut changed: Vec<&String> = fresh
            .iter()
            .filter(|(key, value)| old.get(*key) != Some(*value) || reread(key, value))
            .map(|(key, _)| key)
            .collect();
        if changed.is_empty() {
            tracing::info!("SIGHUP: the configuration is unchanged");
        }
        if changed.iter().any(|k| *k == "storage_schemas") && !self.take_schemas(&new) {
            changed.retain(|k| *k != "storage_schemas");
        }
        for key in changed.iter().filter(|k| !reloadable(k)) {
            tracing::warn!(key = %key, "SIGHUP: this key changed; it takes effect at the next start");
        }
        let applied: Vec<&&String> = changed
            .iter()
            .filter(|k| k.as_str() != "log_level" && reloadable(k))
            .collect();
        self.running = Config {
            log_level: new.log_level,
            max_series_per_chunk: new.max_series_per_chunk,
            max_backlog_windows: new.max_backlog_windows,
            max_backlog_bytes: new.max_backlog_bytes,
            cleaner_interval_secs: new.cleaner_interval_secs,
            keep_names: new.keep_names,
            drop_names: new.drop_names,
            drop_types: new.drop_types,
            drop_tags: new.drop_tags,
            mapping_file: new.mapping_file,
            web_config_file: new.web_config_file,
            storage_aggregation: new.storage_aggregation,
            carbon_whitelist: new.carbon_whitelist,
            carbon_blacklist: new.carbon_blacklist,
            ..self.running.clone()
        };
        if !applied.is_empty()
            && let Some(agent) = &self.agent
        {
            agent.send_replace(self.running.clone());
            tracing::info!(keys = ?applied, "SIGHUP: applied");
        }
    }

    /// Puts the new `storage_schemas` in force for every part of the agent (they share it),
    /// when the running agent has such a file (the flusher sets up the precisions it writes
    /// again when they changed). Setting or unsetting the key waits for the next start.
    fn take_schemas(&mut self, new: &Config) -> bool {
        if let (Some(running), Some(fresh)) = (&self.running.schemas, &new.schemas) {
            running.replace(fresh.get());
            self.running.storage_schemas = new.storage_schemas.clone();
            return true;
        }
        tracing::warn!(
            key = "storage_schemas",
            reason = "it was set or unset",
            "SIGHUP: this key changed; it takes effect at the next start"
        );
        false
    }
}

fn toml_table(config: &Config) -> toml::Table {
    toml::Table::try_from(config).unwrap_or_default()
}

#[tokio::main]
async fn run(config: Config, mut reload: Reload) -> anyhow::Result<()> {
    let _ = rustls::crypto::ring::default_provider().install_default();
    // Before the sockets are bound: a SIGTERM right after the "listening" log line must find
    // the handler in place, not end the process unflushed; a SIGHUP reloads, never kills.
    let shutdown = CancellationToken::new();
    tokio::spawn(cancel_on_signal(signals()?, shutdown.clone()));
    let mut hangups = signal(SignalKind::hangup()).context("cannot install signal handlers")?;
    let (to_agent, reloads) = tokio::sync::watch::channel(config.clone());
    reload.agent = Some(to_agent);
    tokio::spawn(async move {
        while hangups.recv().await.is_some() {
            reload.apply();
        }
    });
    let listeners = agent::bind(&config)?;
    notify_ready();
    agent::run_reloading(
        config,
        listeners,
        Arc::new(Telemetry::new()),
        statsd_redis::store::clock::Clock::system(),
        shutdown,
        reloads,
    )
    .await?;
    Ok(())
}

/// Tells systemd (`Type=notify`, the unit in dist/) that the agent is up: its sockets are bound
/// (datagrams queue in them from now on) and SIGHUP reloads. systemd holds a `systemctl reload`
/// asked for during the start until then; under `Type=exec` it would send the SIGHUP right after
/// exec, before any code of the agent could ignore it. Nothing is sent without `NOTIFY_SOCKET`.
fn notify_ready() {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::net::{SocketAddr, UnixDatagram};
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let sent = UnixDatagram::unbound().and_then(|socket| {
        let path = path.as_bytes();
        let addr = match path.strip_prefix(b"@") {
            Some(name) => {
                <SocketAddr as std::os::linux::net::SocketAddrExt>::from_abstract_name(name)?
            }
            None => SocketAddr::from_pathname(std::ffi::OsStr::from_bytes(path))?,
        };
        socket.send_to_addr(b"READY=1", &addr)
    });
    if let Err(e) = sent {
        tracing::warn!(error = %e, "cannot tell systemd that the agent is ready (NOTIFY_SOCKET)");
    }
}

fn signals() -> anyhow::Result<(Signal, Signal)> {
    let handler = |kind| signal(kind).context("cannot install signal handlers");
    Ok((
        handler(SignalKind::terminate())?,
        handler(SignalKind::interrupt())?,
    ))
}

async fn cancel_on_signal((mut term, mut int): (Signal, Signal), shutdown: CancellationToken) {
    tokio::select! {
        _ = term.recv() => tracing::info!("SIGTERM"),
        _ = int.recv() => tracing::info!("SIGINT"),
    }
    shutdown.cancel();
}
