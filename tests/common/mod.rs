//! Test harness: a private redis-server (unix socket in a temp dir, no persistence) and an
//! agent running in-process on ports the kernel picked.
#![allow(dead_code)]

pub mod answers;
pub mod pki;
pub mod proxy;
pub mod topology;

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream, UdpSocket};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use statsd_redis::agent;
use statsd_redis::config::Config;
pub use statsd_redis::store::clock::Clock;
use statsd_redis::telemetry::Telemetry;
use tokio_util::sync::CancellationToken;

pub const PRECISIONS: [u64; 7] = [1, 5, 60, 300, 3600, 18000, 86400];

/// A redis-server of the test's own; stopped (killed) on drop.
pub struct RedisServer {
    child: Child,
    pub dir: tempfile::TempDir,
    pub socket: PathBuf,
}

impl RedisServer {
    pub fn start() -> RedisServer {
        RedisServer::start_with(&[])
    }

    pub fn start_with(extra: &[&str]) -> RedisServer {
        let dir = tempfile::tempdir().expect("temp dir");
        let socket = dir.path().join("redis.sock");
        let child = spawn_redis(dir.path(), &socket, extra);
        let server = RedisServer { child, dir, socket };
        server.wait_ready();
        server
    }

    fn wait_ready(&self) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            // A server that wants a password answers too.
            if let Ok(mut c) = self.client().get_connection()
                && redis::cmd("PING")
                    .query::<String>(&mut c)
                    .map_or_else(|e| e.code() == Some("NOAUTH"), |_| true)
            {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("redis-server did not answer within 10 s");
    }

    pub fn url(&self) -> String {
        format!("redis+unix://{}", self.socket.display())
    }

    pub fn client(&self) -> redis::Client {
        redis::Client::open(self.url()).unwrap()
    }

    /// The agent's handle on this server, as the default configuration opens it.
    pub fn store(&self) -> statsd_redis::store::Store {
        statsd_redis::store::Store::open(&Config {
            redis: self.url(),
            ..Config::default()
        })
        .unwrap()
    }

    pub fn conn(&self) -> redis::Connection {
        self.client().get_connection().unwrap()
    }

    /// The book's `get_counter`: HGETALL, every field and value parsed as an integer, by slice.
    pub fn get_counter(&self, key: &str) -> BTreeMap<u64, i64> {
        let raw: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg(key)
            .query(&mut self.conn())
            .unwrap();
        raw.into_iter()
            .map(|(slice, count)| {
                let slice = slice
                    .parse()
                    .unwrap_or_else(|_| panic!("{key}: slice {slice:?} is not an integer"));
                let count = count
                    .parse()
                    .unwrap_or_else(|_| panic!("{key}: count {count:?} is not an integer"));
                (slice, count)
            })
            .collect()
    }

    /// Every slice of the hash `key` (`count:…` or `gauge:…`, no prefix) and of its long
    /// archive's blocks (`history:<key>:<slots>:<n>`), as the Graphite API merges them: a
    /// counter's parts added, a gauge's hash value before its block's.
    pub fn history(&self, key: &str) -> BTreeMap<u64, f64> {
        use statsd_redis::store::history::{Family, Geometry};
        let mut conn = self.conn();
        let gauge = key.starts_with("gauge:");
        let family = if gauge {
            Family::Gauge
        } else {
            Family::Counter
        };
        let mut out: BTreeMap<u64, f64> = BTreeMap::new();
        let pattern = format!("history:{key}:*");
        let blocks: Vec<String> = redis::cmd("KEYS").arg(&pattern).query(&mut conn).unwrap();
        let precision: u64 = key.split(':').nth(1).unwrap().parse().unwrap();
        for block in blocks {
            let mut tail = block.rsplit(':');
            let n: u64 = tail.next().unwrap().parse().unwrap();
            let slots: u64 = tail.next().unwrap().parse().unwrap();
            // (Another program's key under a block's name, of another type, holds nothing.)
            let Ok(bytes) = redis::cmd("GET").arg(&block).query::<Vec<u8>>(&mut conn) else {
                continue;
            };
            let g = Geometry { slots };
            for (slot, v) in Geometry::read(0, slots - 1, &bytes, family)
                .into_iter()
                .enumerate()
            {
                if let Some(v) = v {
                    let slice = g.start(precision, n) + slot as u64 * precision;
                    *out.entry(slice).or_default() += v;
                }
            }
        }
        let raw: Vec<(u64, f64)> = redis::cmd("HGETALL").arg(key).query(&mut conn).unwrap();
        for (slice, v) in raw {
            let held = out.entry(slice).or_default();
            *held = if gauge { v } else { *held + v };
        }
        out
    }

    /// Every key and its value in `DUMP`'s form (type, encoding and value), by name.
    pub fn snapshot(&self) -> BTreeMap<String, Vec<u8>> {
        let mut conn = self.conn();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
        keys.into_iter()
            .map(|k| {
                let dump: Vec<u8> = redis::cmd("DUMP").arg(&k).query(&mut conn).unwrap();
                (k, dump)
            })
            .collect()
    }

    /// Sum over all slices of `count:<p>:<series>`.
    pub fn counter_total(&self, precision: u64, series: &str) -> i64 {
        self.get_counter(&format!("count:{precision}:{series}"))
            .values()
            .sum()
    }

    /// The weighted number of values in a quantile bucket hash (its bucket fields; `a` and
    /// anything else skipped).
    pub fn hist_total(&self, key: &str) -> f64 {
        let fields: BTreeMap<String, String> = redis::cmd("HGETALL")
            .arg(key)
            .query(&mut self.conn())
            .unwrap();
        fields
            .iter()
            .filter(|(f, _)| statsd_redis::aggregate::Bucket::parse(f).is_some())
            .filter_map(|(_, c)| c.parse::<f64>().ok())
            .sum()
    }

    /// Every key and what it holds (a hash's fields and values, a sorted set's members and
    /// scores, a string's bytes: a long archive's block), as text.
    pub fn everything(&self) -> BTreeMap<String, String> {
        let mut conn = self.conn();
        let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
        keys.into_iter()
            .map(|k| {
                let kind: String = redis::cmd("TYPE").arg(&k).query(&mut conn).unwrap();
                let flat: Vec<String> = match kind.as_str() {
                    "hash" => redis::cmd("HGETALL").arg(&k).query(&mut conn).unwrap(),
                    "string" => {
                        let bytes: Vec<u8> = redis::cmd("GET").arg(&k).query(&mut conn).unwrap();
                        vec![String::new(), format!("{}", bytes.escape_ascii())]
                    }
                    _ => redis::cmd("ZRANGE")
                        .arg(&k)
                        .arg(0)
                        .arg(-1)
                        .arg("WITHSCORES")
                        .query(&mut conn)
                        .unwrap(),
                };
                // Field and value (member and score) together, so that no two swap unseen.
                let mut pairs: Vec<String> = flat.chunks(2).map(|p| p.join("=")).collect();
                pairs.sort();
                (k, pairs.join(","))
            })
            .collect()
    }

    /// [`RedisServer::everything`] as its readers see it: each counter's and gauge's slices
    /// from its hash and its blocks together ([`RedisServer::history`]), the blocks not apart.
    /// Where a long archive's slice lies depends on its age when written (the hash keeps the
    /// newest), so two imports a few seconds apart may place the same 1 s slices differently.
    pub fn as_read(&self) -> BTreeMap<String, String> {
        self.everything()
            .into_iter()
            .filter(|(k, _)| !k.starts_with("history:"))
            .map(|(k, v)| {
                if k.starts_with("count:") || k.starts_with("gauge:") {
                    let slices = format!("{:?}", self.history(&k));
                    (k, slices)
                } else {
                    (k, v)
                }
            })
            .collect()
    }

    pub fn known(&self, key: &str) -> Vec<String> {
        redis::cmd("ZRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query(&mut self.conn())
            .unwrap()
    }

    /// How many times `command` (lower case) was called, from `INFO commandstats`.
    pub fn calls(&self, command: &str) -> u64 {
        let info: String = redis::cmd("INFO")
            .arg("commandstats")
            .query(&mut self.conn())
            .unwrap();
        let prefix = format!("cmdstat_{command}:calls=");
        info.lines()
            .find_map(|l| l.strip_prefix(prefix.as_str()))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().unwrap())
    }
}

/// A rollup run's claim of at most 1 000 pending members (`rollup_claim.lua`, as
/// `store::rollup::Rollups` calls it), scored `score`, taking back claims of any age: the
/// members it took.
pub fn claim_rollups(conn: &mut redis::Connection, score: u64) -> Vec<String> {
    redis::Script::new(include_str!("../../src/store/rollup_claim.lua"))
        .key("pending:gauge:")
        .key("rolling:gauge:")
        .key("claims:gauge:")
        .arg(score)
        .arg(0)
        .arg(1000)
        .invoke(conn)
        .unwrap()
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A config for tests: loopback port 0 everywhere, the given Redis.
pub fn test_config(redis: &RedisServer) -> Config {
    Config {
        udp: vec!["127.0.0.1:0".parse().unwrap()],
        http: "127.0.0.1:0".parse().unwrap(),
        redis: redis.url(),
        // The quantile buckets with every window, as the tests read them within seconds; the
        // default (held for a minute) has tests of its own (`quantile_write_secs`).
        quantile_write_secs: 0,
        ..Config::default()
    }
}

/// An agent running on the current tokio runtime.
pub struct TestAgent {
    pub udp: Vec<SocketAddr>,
    pub tcp: Vec<SocketAddr>,
    pub http: SocketAddr,
    pub shutdown: CancellationToken,
    pub telemetry: Arc<Telemetry>,
    /// The agent's time: the system's, or a manual clock the test moves.
    pub clock: Clock,
    flush_interval: Duration,
    /// Taken by [`TestAgent::stop`].
    task: Option<tokio::task::JoinHandle<()>>,
}

/// A test that fails before it stops its agent must still end: the runtime waits for the
/// agent's blocking readers, which stop only when told to.
impl Drop for TestAgent {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

impl TestAgent {
    pub fn start(config: Config) -> TestAgent {
        TestAgent::start_at(config, Clock::system())
    }

    /// An agent whose time is `clock`'s: a [`Clock::manual`] one stands still until the test
    /// moves it, so that windows close when the test says.
    pub fn start_at(config: Config, clock: Clock) -> TestAgent {
        let listeners = agent::bind(&config).expect("bind");
        let udp = listeners.udp_addrs();
        let tcp = listeners.tcp_addrs();
        let http = listeners.http_addr().unwrap();
        let shutdown = CancellationToken::new();
        let telemetry = Arc::new(Telemetry::new());
        let flush_interval = Duration::from_secs(config.flush_interval_secs);
        let task = tokio::spawn({
            let clock = clock.clone();
            let shutdown = shutdown.clone();
            let telemetry = telemetry.clone();
            async move {
                agent::run(config, listeners, telemetry, clock, shutdown)
                    .await
                    .unwrap()
            }
        });
        TestAgent {
            udp,
            tcp,
            http,
            shutdown,
            telemetry,
            clock,
            flush_interval,
            task: Some(task),
        }
    }

    /// With a manual clock, moves it on by a flush interval, so that the open window closes;
    /// with the system's, windows close by themselves.
    pub fn tick(&self) {
        self.clock.advance(self.flush_interval);
    }

    /// Sends one datagram to the first UDP address, as `nc -u` would.
    pub fn send(&self, datagram: &[u8]) {
        let s = UdpSocket::bind(if self.udp[0].is_ipv6() {
            "[::1]:0"
        } else {
            "127.0.0.1:0"
        })
        .unwrap();
        s.send_to(datagram, self.udp[0]).unwrap();
    }

    /// [`TestAgent::send`], then waits until the agent has taken every line into its open
    /// window: a manual clock moved after this closes them in that window.
    pub async fn send_taken(&self, datagram: &[u8]) {
        let before = self.metric("lines_received_total");
        self.send(datagram);
        let lines = datagram
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .count();
        eventually(Duration::from_secs(5), "the lines received", || {
            self.metric("lines_received_total") >= before + lines as f64
        })
        .await;
    }

    /// Stops the agent and waits for its final flush.
    pub async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }

    /// One metric's value from `/metrics` (0 when absent), e.g. `bad_lines_total{reason="x"}`:
    /// the sum over the series that carry at least the labels given.
    pub fn metric(&self, name_and_labels: &str) -> f64 {
        metric_at(self.http, name_and_labels)
    }
}

/// A blocking HTTP/1.1 GET; returns status and body.
pub fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    let (status, _, body) = http_request(addr, "GET", path, "");
    (status, body)
}

/// One HTTP/1.1 request (`GET` with the parameters in `query`, or `POST` with them as a form
/// body, as Grafana sends them): status, content type and body.
pub fn http_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    query: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
    let request = match method {
        "POST" => format!(
            "POST {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{query}",
            query.len()
        ),
        _ if query.is_empty() => {
            format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        }
        _ => format!("GET {path}?{query} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"),
    };
    s.write_all(request.as_bytes()).unwrap();
    let mut response = String::new();
    s.read_to_string(&mut response).unwrap();
    let status = response[9..12].parse().unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap_or((&response, ""));
    let content_type = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-type:")
                .map(|v| v.trim().to_string())
        })
        .unwrap_or_default();
    let chunked = head
        .to_ascii_lowercase()
        .contains("transfer-encoding: chunked");
    let body = if chunked {
        dechunk(body)
    } else {
        body.to_string()
    };
    (status, content_type, body)
}

/// A chunked body's content.
fn dechunk(mut body: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = body.split_once("\r\n") {
        let size = usize::from_str_radix(size.trim(), 16).expect("a chunk size");
        if size == 0 {
            break;
        }
        out.push_str(&rest[..size]);
        body = &rest[size + 2..];
    }
    out
}

/// Polls `check` until it holds; panics with `what` after `timeout`.
pub async fn eventually(timeout: Duration, what: &str, mut check: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !check() {
        assert!(Instant::now() < deadline, "timed out waiting for: {what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

pub fn unix_now() -> u64 {
    statsd_redis::store::clock::unix_now()
}

/// Waits, when fewer than `needed` seconds are left of the hour, until the next one has begun:
/// a test that adds up an hour's statistics (the book's `stats:` rolls over to `:last` at the
/// hour) then finds them all in one hour.
pub async fn clear_of_the_hour(needed: u64) {
    let left = 3600 - unix_now() % 3600;
    if left < needed {
        tokio::time::sleep(Duration::from_secs(left + 1)).await;
    }
}

/// The UTC hour of `secs` as the book writes it (`YYYY-MM-DDTHH:00:00`), computed independently
/// through `date`.
pub fn hour_of(secs: u64) -> String {
    let out = std::process::Command::new("date")
        .args(["-u", "-d", &format!("@{secs}"), "+%Y-%m-%dT%H:00:00"])
        .output()
        .unwrap();
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

/// The latest second, up to now, that lies `into` seconds into a `period` (second 10 of a
/// minute: `moment(10, 60)`), where a test puts its agent's clock instead of waiting for it.
pub fn moment(into: u64, period: u64) -> u64 {
    moment_at(unix_now(), into, period)
}

fn moment_at(now: u64, into: u64, period: u64) -> u64 {
    let start = now / period * period + into;
    if start <= now { start } else { start - period }
}

/// A manual clock half a second past [`moment`]`(into, period)`.
pub fn clock_at(into: u64, period: u64) -> Clock {
    Clock::manual(Duration::from_secs(moment(into, period)) + Duration::from_millis(500))
}

/// How far (s) behind the machine's a spawned agent's clock runs when it is to stand, from now,
/// `into` seconds into a `period` ([`spawn_agent_behind`]): at most a period, so that nothing the
/// agent writes is old to Redis.
pub fn behind_to(into: u64, period: u64) -> u64 {
    let now = unix_now();
    now - moment_at(now, into, period)
}

/// [`spawn_agent`] with its clock `behind` seconds behind the machine's (libfaketime).
pub fn spawn_agent_behind(behind: u64, redis_url: &str, extra: &[&str]) -> (Child, u16, u16) {
    spawn_agent_with_clock(&format!("-{behind}s"), redis_url, extra)
}

impl RedisServer {
    /// Kills the server (no shutdown save) and starts it again on the same socket and data dir.
    pub fn restart_after(&mut self, down: Duration, extra: &[&str]) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        std::thread::sleep(down);
        let _ = std::fs::remove_file(&self.socket);
        self.child = spawn_redis(self.dir.path(), &self.socket, extra);
        self.wait_ready();
    }

    /// Kills the server for good (its data dir stays until drop).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts a server that also listens on a TCP port of 127.0.0.1 (for the proxy tests).
    pub fn start_tcp() -> (RedisServer, u16) {
        let port = free_port();
        let server = RedisServer::start_with(&["--port", &port.to_string(), "--bind", "127.0.0.1"]);
        (server, port)
    }
}

pub fn spawn_redis(dir: &std::path::Path, socket: &std::path::Path, extra: &[&str]) -> Child {
    Command::new("redis-server")
        .args([
            "--port",
            "0",
            "--save",
            "",
            "--appendonly",
            "no",
            "--daemonize",
            "no",
        ])
        .arg("--unixsocket")
        .arg(socket)
        .arg("--dir")
        .arg(dir)
        .args(extra)
        .stdout(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!(
                "cannot start redis-server ({e}): the tests need Debian's redis-server package \
                 (apt-get install -y redis-server redis-tools)"
            )
        })
}

/// A TCP proxy of the test's own in front of Redis. While armed, the first replies to a flush
/// chunk's transaction (`MULTI` answered, its first write queued: the whole `MULTI` … `EXEC` is
/// on its way to Redis) are swallowed and the client connection cut: the write happened, the
/// agent never hears of it.
pub struct LossyProxy {
    pub addr: SocketAddr,
    pub armed: Arc<std::sync::atomic::AtomicBool>,
    pub cuts: Arc<std::sync::atomic::AtomicUsize>,
}

impl LossyProxy {
    pub async fn start(upstream: SocketAddr) -> LossyProxy {
        use std::sync::atomic::{AtomicBool, AtomicUsize};
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let armed = Arc::new(AtomicBool::new(true));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (a, c) = (armed.clone(), cuts.clone());
        tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = tokio::net::TcpStream::connect(upstream).await else {
                    continue;
                };
                let (mut cr, mut cw) = client.into_split();
                let (mut sr, mut sw) = server.into_split();
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 1 << 16];
                    while let Ok(n) = cr.read(&mut buf).await {
                        if n == 0 || sw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
                let (a, c) = (a.clone(), c.clone());
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 1 << 16];
                    while let Ok(n) = sr.read(&mut buf).await {
                        if n == 0 {
                            break;
                        }
                        if buf[..n].starts_with(b"+OK\r\n+QUEUED\r\n")
                            && a.swap(false, std::sync::atomic::Ordering::SeqCst)
                        {
                            c.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                            let _ = cw.shutdown().await;
                            return;
                        }
                        if cw.write_all(&buf[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        LossyProxy { addr, armed, cuts }
    }
}

/// The agent binary, with no `STATSD_REDIS_*` variables inherited from the test's environment.
pub fn bin() -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_statsd-redis"));
    for (k, _) in std::env::vars() {
        if k.starts_with("STATSD_REDIS_") {
            c.env_remove(k);
        }
    }
    c.env_remove("RUST_LOG");
    c
}

/// Runs `command` to its end; panics, naming `what` and with its output, unless it succeeded.
pub fn run_ok(command: &mut Command, what: &str) -> std::process::Output {
    let out = command
        .output()
        .unwrap_or_else(|e| panic!("{what} could not run: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// `text` percent-encoded for a query string (letters, digits, `.`, `_` and `*` as they are).
pub fn query_encode(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'.' | b'_' | b'*' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// A GET of `url` through curl (graphite-web's or the agent's JSON), its body as JSON.
pub fn curl_json(url: &str) -> serde_json::Value {
    let out = Command::new("curl")
        .args(["-s", "--max-time", "20", url])
        .output()
        .expect("curl: apt-get install -y curl");
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{url}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// Ports this test program handed out ([`free_port`], [`claim_port`]).
static GIVEN: std::sync::Mutex<std::collections::BTreeSet<u16>> =
    std::sync::Mutex::new(std::collections::BTreeSet::new());

/// A port of 127.0.0.1 free for TCP and UDP, never handed out before by this test program: the
/// kernel may hand a port let go out again, and two tests running at once must not be given the
/// same one (an agent's HTTP port taken by another test's Redis would answer its requests with
/// a reset).
pub fn free_port() -> u16 {
    loop {
        let s = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let p = s.local_addr().unwrap().port();
        // The UDP port of the same number must be free too.
        if UdpSocket::bind(("127.0.0.1", p)).is_ok() && claim_port(p) {
            return p;
        }
    }
}

/// Marks `p` as handed out, so that [`free_port`] never gives it (a cluster node's bus port,
/// its port + 10000, which the kernel would otherwise hand to another test until the node
/// binds it); false when it was already.
pub fn claim_port(p: u16) -> bool {
    GIVEN.lock().unwrap().insert(p)
}

/// Starts the binary on free ports; returns it with its UDP and HTTP ports once HTTP answers.
pub fn spawn_agent(redis_url: &str, extra: &[&str]) -> (Child, u16, u16) {
    spawn_agent_in(bin(), redis_url, extra)
}

/// libfaketime, which runs a program of the tests' on a clock of their choosing.
const FAKETIME_LIBRARY: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1";

/// [`spawn_agent`] with its clock running `offset` from the machine's (libfaketime's `-300s`).
pub fn spawn_agent_with_clock(offset: &str, redis_url: &str, extra: &[&str]) -> (Child, u16, u16) {
    spawn_agent_in(with_clock(bin(), offset), redis_url, extra)
}

/// `command` run with its clock `offset` from the machine's (libfaketime's `-300s`).
pub fn with_clock(mut command: Command, offset: &str) -> Command {
    assert!(
        std::path::Path::new(FAKETIME_LIBRARY).exists(),
        "this test needs libfaketime: apt-get install -y faketime"
    );
    command
        .env("LD_PRELOAD", FAKETIME_LIBRARY)
        .env("FAKETIME", offset)
        .env("DONT_FAKE_MONOTONIC", "1");
    command
}

pub fn spawn_agent_in(mut agent: Command, redis_url: &str, extra: &[&str]) -> (Child, u16, u16) {
    let (udp, http) = (free_port(), free_port());
    let child = agent
        .args([
            "--udp",
            &format!("127.0.0.1:{udp}"),
            "--http",
            &format!("127.0.0.1:{http}"),
        ])
        .args(["--redis", redis_url])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The HTTP port is bound after the UDP ones: once it answers, datagrams are received. An
    // answer, not a connection: a connection alone was once taken while the first request
    // after it was reset (tests/acl.rs, cause not found). Behind a web config (TLS perhaps),
    // a connection.
    let plain = !extra.contains(&"--web-config-file");
    let deadline = Instant::now() + Duration::from_secs(10);
    while !answers(http, plain) {
        assert!(Instant::now() < deadline, "agent did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    (child, udp, http)
}

/// Whether the agent's HTTP port takes a connection and, with `request`, answers `/healthz`.
fn answers(http: u16, request: bool) -> bool {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", http)) else {
        return false;
    };
    if !request {
        return true;
    }
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let mut head = [0u8; 12];
    s.write_all(b"GET /healthz HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .is_ok()
        && s.read_exact(&mut head).is_ok()
        && head.starts_with(b"HTTP/1.1 ")
}

/// An agent process killed (SIGKILL) when dropped, so a failing test leaves none behind.
/// SIGTERM, then the exit code and everything the agent logged.
pub fn terminate(mut child: std::process::Child) -> (Option<i32>, String, Duration) {
    terminate_in_place(&mut child)
}

/// [`terminate`] of a child still owned by its caller.
pub fn terminate_in_place(child: &mut std::process::Child) -> (Option<i32>, String, Duration) {
    let signalled = Instant::now();
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let status = child.wait().unwrap();
    let took = signalled.elapsed();
    let mut log = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut log).unwrap();
    (status.code(), log, took)
}

/// A small file system of its own (tmpfs) at a directory, for a spool that fills up. It is
/// mounted in a mount namespace of its own (`unshare`, from util-linux, in a user namespace so
/// that no root is needed), held by a process that sleeps; programs run in it by
/// [`SmallDisk::command`], and the test reaches its files through [`SmallDisk::path`].
pub struct SmallDisk {
    holder: Child,
    dir: tempfile::TempDir,
}

impl SmallDisk {
    /// A tmpfs of `bytes` (in pages of 4 KiB: a file takes one at least).
    pub fn new(bytes: u64) -> SmallDisk {
        let dir = tempfile::tempdir().unwrap();
        let script = format!(
            "mount -t tmpfs -o size={bytes} tmpfs {} && echo mounted && exec sleep infinity",
            dir.path().display()
        );
        let mut holder = Command::new("unshare")
            .args(["--user", "--map-root-user", "--mount", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .expect("unshare (util-linux) runs the small file system");
        let mut said = [0u8; 8];
        let read = holder.stdout.take().unwrap().read_exact(&mut said);
        assert!(
            read.is_ok() && &said == b"mounted\n",
            "cannot mount a tmpfs in a user namespace (unshare --user --map-root-user --mount)"
        );
        SmallDisk { holder, dir }
    }

    /// The file system's root as this process reaches it.
    pub fn path(&self) -> PathBuf {
        let inside = self.dir.path().strip_prefix("/").unwrap();
        PathBuf::from(format!("/proc/{}/root", self.holder.id())).join(inside)
    }

    /// The directory as programs run by [`SmallDisk::command`] see it.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// `program` run where the file system is mounted.
    pub fn command(&self, program: Command) -> Command {
        let mut command = Command::new("nsenter");
        command
            .args(["-t", &self.holder.id().to_string(), "--user", "--mount"])
            .arg("--preserve-credentials")
            .arg(program.get_program())
            .args(program.get_args());
        for (k, v) in program.get_envs() {
            match v {
                Some(v) => command.env(k, v),
                None => command.env_remove(k),
            };
        }
        command
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

pub struct Killed(pub Child);

impl Killed {
    /// SIGTERM, as a shutdown would: [`terminate`].
    pub fn terminate(&mut self) -> (Option<i32>, String, Duration) {
        terminate_in_place(&mut self.0)
    }

    /// SIGKILL now, as a crash would.
    pub fn kill(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

impl Drop for Killed {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The 200 lines `steady:1|c` a flood test sent (one every 20 ms) all written, and each in its
/// own second: no second's slice holds more than a second of them (a window held up by the
/// flood would be written late, with the next windows' lines in it).
pub async fn steady_written_second_by_second(redis: &RedisServer) {
    eventually(Duration::from_secs(5), "all written", || {
        redis.counter_total(1, "steady") == 200
    })
    .await;
    let slices = redis.get_counter("count:1:steady");
    assert!(
        slices.values().all(|n| *n <= 60),
        "a second's slice holds more than a second of counts: {slices:?}"
    );
}

/// Runs a Python `script` with Debian's python3 and its `python3-whisper` (carbon's library),
/// with `args` as `sys.argv[1:]`: whisper files written as carbon writes them. Returns what it
/// printed.
pub fn with_python_whisper(script: &str, args: &[&str]) -> std::process::Output {
    run_ok(
        Command::new("/usr/bin/python3")
            .args(["-c", script])
            .args(args),
        "python3-whisper (apt-get install -y python3-whisper)",
    )
}

/// A SIGHUP to `child` (an agent this test started): reload its configuration.
pub fn sighup(child: &Child) {
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(child.id() as i32, libc::SIGHUP) };
}

/// One metric's value from the `/metrics` of the agent at `http` (0 when absent).
pub fn metric_at(http: SocketAddr, name_and_labels: &str) -> f64 {
    metric_in(&http_get(http, "/metrics").1, name_and_labels)
}

/// [`metric_at`] of a page already read.
pub fn metric_in(text: &str, name_and_labels: &str) -> f64 {
    let (name, wanted) = split_labels(name_and_labels);
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, labels) = split_labels(series.strip_prefix("statsd_redis_")?);
            (n == name && wanted.iter().all(|w| labels.contains(w)))
                .then(|| value.parse::<f64>().unwrap())
        })
        .sum()
}

/// `name{a="x",b="y"}` as the name and its labels.
fn split_labels(series: &str) -> (&str, Vec<&str>) {
    match series.split_once('{') {
        Some((name, labels)) => (
            name,
            labels
                .trim_end_matches('}')
                .split(',')
                .filter(|l| !l.is_empty())
                .collect(),
        ),
        None => (series, Vec::new()),
    }
}

/// Sends `lines` counts a datagram to `series` series, every 10 ms for `d`: about 5000 lines a
/// second at 50. Returns the total sent to each series.
pub async fn send_load(to: SocketAddr, d: Duration, lines: usize, series: usize) -> Vec<i64> {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut sent = vec![0; series];
    let datagram: String = (0..lines)
        .map(|i| format!("load.{}:1|c\n", i % series))
        .collect();
    let until = std::time::Instant::now() + d;
    while std::time::Instant::now() < until {
        socket.send_to(datagram.as_bytes(), to).unwrap();
        for i in 0..lines {
            sent[i % series] += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sent
}

/// A program the tests run, or a failure that names the Debian package it comes in.
pub fn program(name: &str, package: &str) -> Command {
    let found = Command::new("sh")
        .args(["-c", &format!("command -v {name}")])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "{name} is missing: apt-get install -y {package} (scripts/test.sh installs it)"
    );
    Command::new(name)
}

/// A Prometheus child on a free port with `config`, its data in `dir`.
pub fn prometheus(dir: &std::path::Path, config: &str) -> (Killed, u16) {
    let file = dir.join("prometheus.yml");
    std::fs::write(&file, config).unwrap();
    let port = free_port();
    let child: Child = program("prometheus", "prometheus")
        .arg(format!("--config.file={}", file.display()))
        .arg(format!(
            "--storage.tsdb.path={}",
            dir.join("data").display()
        ))
        .arg(format!("--web.listen-address=127.0.0.1:{port}"))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    (Killed(child), port)
}

/// `promtool check metrics` parses the page: it may only find what statsd_exporter's page has
/// too (counters named as sent, without `_total`), never a line it cannot parse.
pub fn promtool_accepts(page: &str) {
    for problem in promtool_lints(page) {
        assert!(
            problem.contains("counter metrics should have \"_total\" suffix"),
            "promtool: {problem}\n{page}"
        );
    }
}

/// What `promtool check metrics` says of a page it parses (its lint: names, suffixes, help);
/// a page it cannot parse fails the test.
pub fn promtool_lints(page: &str) -> Vec<String> {
    let mut child = program("promtool", "prometheus")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // promtool: 0 clean, 3 lint problems only, 1 a page it cannot parse.
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "promtool refuses the page ({:?}): {said}\n{page}",
        out.status
    );
    said.lines().map(str::to_string).collect()
}

/// The client libraries, installed once from PyPI and the npm registry into this test
/// target's own directory.
pub fn clients() -> &'static std::path::Path {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let dir = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("clients");
        let run = |what: &str, cmd: &mut Command| {
            let out = cmd.output().unwrap_or_else(|e| {
                panic!("{what} could not run ({e}): install python3-pip and npm (apt-get install -y python3-pip npm)")
            });
            assert!(
                out.status.success(),
                "{what} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            );
        };
        if !dir.join("py/statsd").exists() || !dir.join("py/datadog").exists() {
            run(
                "pip install statsd datadog",
                Command::new("python3").args(["-m", "pip", "install", "--quiet", "--target"]).arg(dir.join("py")).args(["statsd==4.0.1", "datadog==0.56.0"]),
            );
        }
        if !dir.join("node_modules/unix-dgram").exists() {
            std::fs::create_dir_all(&dir).unwrap();
            run(
                "npm install hot-shots unix-dgram",
                Command::new("npm")
                    .current_dir(&dir)
                    .args(["install", "--silent", "--no-audit", "--no-fund", "--no-save", "hot-shots@11", "unix-dgram@2"]),
            );
        }
        dir
    })
}

pub fn python(script: &str) {
    let mut python = Command::new("python3");
    python.env("PYTHONPATH", clients().join("py"));
    run_ok(python.args(["-c", script]), "python3");
}

pub fn node(script: &str) {
    let mut node = Command::new("node");
    node.env("NODE_PATH", clients().join("node_modules"));
    run_ok(node.args(["-e", script]), "node");
}

/// graphite-web 1.1.10 over the whisper files under a folder (tests/graphite/graphite-web.sh),
/// stopped when dropped.
pub struct GraphiteWeb {
    state: tempfile::TempDir,
    pub url: String,
}

impl GraphiteWeb {
    pub fn over(whisper: &std::path::Path) -> GraphiteWeb {
        let state = tempfile::tempdir().unwrap();
        run_ok(
            Command::new(Self::script())
                .arg("start")
                .env("ORACLE_WHISPER_DIR", whisper)
                .env("ORACLE_STATE", state.path()),
            "graphite-web",
        );
        let url = std::fs::read_to_string(state.path().join("url")).unwrap();
        GraphiteWeb {
            url: url.trim().to_string(),
            state,
        }
    }

    fn script() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/graphite/graphite-web.sh")
    }
}

impl Drop for GraphiteWeb {
    fn drop(&mut self) {
        let _ = Command::new(Self::script())
            .arg("stop")
            .env("ORACLE_STATE", self.state.path())
            .output();
    }
}
