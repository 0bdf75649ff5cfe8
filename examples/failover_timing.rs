//! How long the agent stops writing when Redis fails over or reshards under a steady load, and
//! whether it still writes every count exactly once (`scripts/failover-timing.sh` runs it).
//! Each scenario runs `runs` times on a fresh private topology, set up by the tests' own harness
//! (`tests/common/topology.rs`: loopback ports picked free, a temp dir per server):
//!
//! * `cluster`: 3 masters + 3 replicas (cluster-node-timeout 2000); a master SIGKILLed 6 s into
//!   the load, a different one each run;
//! * `sentinel`: a master, 2 replicas, 3 sentinels; the agent with `--wait-replicas 1`; the
//!   master SIGKILLed 6 s in;
//! * `reshard`: the 3 + 3 cluster, the same load once without and once with 1024 slots moved
//!   between two masters (`redis-cli --cluster reshard`) 6 s in.
//!
//! Per run, in seconds after the kill: `a` until Redis was whole again (a replica promoted and
//! every live node `cluster_state:ok`; or every sentinel naming the same new master, which says
//! it is master), `b` until the agent wrote a window again (the end of the longest gap in its
//! `last_flush_timestamp_seconds`, polled every 100 ms), `gap` that gap, `c` until its backlog
//! was empty again; then, once the load has drained and the agent stopped, the exact totals of
//! every series at every precision (`lost`, `doubled`) and the agent's own counts. For the
//! reshard: its wall time, the flush duration's p50/p99 (histogram bounds), the longest gap
//! between windows written, and `redis-cli --cluster check` after. Then the medians.
//!
//!     cargo build --release --bin statsd-redis --example loadgen --example failover_timing
//!     target/release/examples/failover_timing [runs=3] [secs=20] [series=2000] [rate=20000] [scenarios=cluster,sentinel,reshard]

#[allow(dead_code)]
#[path = "../tests/common/topology.rs"]
mod topology;

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use topology::{Cluster, Sentinels};

const PRECISIONS: [u64; 7] = [1, 5, 60, 300, 3600, 18000, 86400];
/// Seconds into the load when the master is killed or the reshard starts.
const KILL_AT: f64 = 6.0;

/// A port free on 127.0.0.1 (the topology harness asks for it by this name).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// The topology harness claims a cluster node's bus port by this name; this program starts one
/// topology at a time, so there is no other to keep it from.
fn claim_port(_: u16) -> bool {
    true
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

fn sleep_until(t: f64) {
    let left = t - now();
    if left > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(left));
    }
}

/// `GET path` on the agent's HTTP port: the status code and the body.
fn get(http: u16, path: &str) -> Result<(u16, String), String> {
    let mut s = TcpStream::connect(("127.0.0.1", http)).map_err(|e| e.to_string())?;
    s.set_read_timeout(Some(Duration::from_millis(500))).ok();
    s.write_all(format!("GET {path} HTTP/1.0\r\nHost: agent\r\n\r\n").as_bytes())
        .map_err(|e| e.to_string())?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(|e| e.to_string())?;
    let (head, body) = text.split_once("\r\n\r\n").ok_or("no body")?;
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or("no status")?;
    Ok((status, body.to_string()))
}

/// The agent's metrics: each series (with its labels) and its value.
fn metrics(http: u16) -> Result<HashMap<String, f64>, String> {
    let (_, body) = get(http, "/metrics")?;
    Ok(body
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (k, v) = l.rsplit_once(' ')?;
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect())
}

/// A metric's value, summed over its labels.
fn metric(all: &HashMap<String, f64>, name: &str) -> f64 {
    let name = format!("statsd_redis_{name}");
    all.iter()
        .filter(|(k, _)| **k == name || k.starts_with(&format!("{name}{{")))
        .map(|(_, v)| v)
        .sum()
}

struct Agent {
    child: Child,
    udp: u16,
    http: u16,
}

impl Agent {
    /// The release binary with `flags`, ready once `/readyz` answers 200.
    fn start(flags: &[String], log: &Path) -> Agent {
        let (udp, http) = (free_port(), free_port());
        let child = Command::new("target/release/statsd-redis")
            .args(["--udp", &format!("127.0.0.1:{udp}")])
            .args(["--http", &format!("127.0.0.1:{http}")])
            .args(["--cleaner-enabled", "false", "--redis-timeout-ms", "500"])
            .args(flags)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(log).unwrap())
            .spawn()
            .expect("target/release/statsd-redis: cargo build --release --bin statsd-redis");
        let deadline = Instant::now() + Duration::from_secs(20);
        while !ready(http) {
            assert!(Instant::now() < deadline, "the agent never became ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        std::thread::sleep(Duration::from_secs(1));
        Agent { child, udp, http }
    }

    /// Waits until the window of `load_end` is closed and nothing is queued (at most 150 s:
    /// long enough for a stalled writer to recover), and notes what the agent counted.
    fn drain(&self, load_end: f64, notes: &mut BTreeMap<String, f64>) {
        let deadline = Instant::now() + Duration::from_secs(150);
        loop {
            let drained = metrics(self.http).is_ok_and(|m| {
                now() >= load_end.floor() + 1.5 && metric(&m, "backlog_windows") == 0.0
            });
            if drained {
                break;
            }
            if Instant::now() > deadline {
                notes.insert("drain_timed_out".into(), 1.0);
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        if let Ok(m) = metrics(self.http) {
            for name in [
                "windows_dropped_total",
                "backlog_windows",
                "kernel_drops_total",
                "chunks_applied_before_total",
                "redis_reconnects_total",
            ] {
                notes.insert(name.trim_end_matches("_total").into(), metric(&m, name));
            }
        }
    }

    /// SIGTERM, and a hang noted.
    fn stop(mut self, notes: &mut BTreeMap<String, f64>) {
        // SAFETY: signalling a child of this process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(15);
        while self.child.try_wait().unwrap().is_none() {
            if Instant::now() > deadline {
                notes.insert("hung_on_sigterm".into(), 1.0);
                let _ = self.child.kill();
                let _ = self.child.wait();
                break;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

fn ready(http: u16) -> bool {
    get(http, "/readyz").is_ok_and(|(status, _)| status == 200)
}

/// The load generator in the background: `rate` lines a second for `secs` over `series`
/// counter series named `<prefix>...`, 20 lines a datagram; its totals in `totals`.
struct Load {
    child: Child,
    started: f64,
    totals: PathBuf,
}

impl Load {
    fn start(udp: u16, cfg: &Settings, prefix: &str, dir: &Path) -> Load {
        let totals = dir.join(format!("totals-{prefix}"));
        let child = Command::new("target/release/examples/loadgen")
            .args(["send", "--target", &format!("127.0.0.1:{udp}")])
            .args(["--series", &cfg.series.to_string(), "--prefix", prefix])
            .args(["--lines-per-datagram", "20"])
            .args(["--lines", &(cfg.rate * cfg.secs).to_string()])
            .args(["--rate", &cfg.rate.to_string()])
            .arg("--totals")
            .arg(&totals)
            .stdout(Stdio::null())
            .spawn()
            .expect("target/release/examples/loadgen: cargo build --release --example loadgen");
        Load {
            child,
            started: now(),
            totals,
        }
    }

    /// Waits for the load to end; when it ended.
    fn finish(mut self) -> (f64, PathBuf) {
        self.child.wait().unwrap();
        (now(), self.totals)
    }
}

/// The agent's write time and backlog every 100 ms, from [`Monitor::start`] until stopped.
struct Monitor {
    rows: Arc<Mutex<Vec<(f64, f64, f64)>>>,
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<()>,
}

impl Monitor {
    fn start(http: u16) -> Monitor {
        let rows = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = std::thread::spawn({
            let (rows, stop) = (rows.clone(), stop.clone());
            move || {
                while !stop.load(Ordering::SeqCst) {
                    let t = now();
                    if let Ok(m) = metrics(http) {
                        let row = (
                            t,
                            metric(&m, "last_flush_timestamp_seconds"),
                            metric(&m, "backlog_windows"),
                        );
                        rows.lock().unwrap().push(row);
                    }
                    sleep_until(t + 0.1);
                }
            }
        });
        Monitor { rows, stop, thread }
    }

    fn stop(self) -> Vec<(f64, f64, f64)> {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap();
        std::mem::take(&mut self.rows.lock().unwrap())
    }
}

/// The distinct write times seen, in order.
fn write_times(rows: &[(f64, f64, f64)]) -> Vec<f64> {
    let mut seen: Vec<f64> = Vec::new();
    for &(_, last, _) in rows {
        if last > 0.0 && seen.last() != Some(&last) {
            seen.push(last);
        }
    }
    seen
}

/// `b`, `gap` and `c` after the kill at `kill` (see the top of this file), and the largest
/// backlog seen.
fn after_the_kill(rows: &[(f64, f64, f64)], kill: f64, out: &mut BTreeMap<String, f64>) {
    let seen = write_times(rows);
    let longest = (1..seen.len())
        .filter(|&i| seen[i] > kill)
        .map(|i| (seen[i] - seen[i - 1], seen[i]))
        .max_by(|a, b| a.0.total_cmp(&b.0));
    if let Some((gap, resume)) = longest {
        out.insert("b".into(), resume - kill);
        out.insert("gap".into(), gap);
        if let Some(&(t, _, _)) = rows.iter().find(|r| r.0 >= resume && r.2 == 0.0) {
            out.insert("c".into(), t - kill);
        }
    }
    let most = rows.iter().map(|r| r.2).fold(0.0, f64::max);
    out.insert("max_backlog".into(), most);
}

/// The longest gap between two windows written, up to the load's end.
fn longest_gap(rows: &[(f64, f64, f64)], end: f64) -> f64 {
    let seen = write_times(rows);
    seen.windows(2)
        .filter(|w| w[0] <= end + 1.5)
        .map(|w| w[1] - w[0])
        .fold(0.0, f64::max)
}

/// Every series' count hash at every precision, summed by `hgetall`, against the totals the
/// load generator wrote: counts lost and doubled, keys wrong.
fn check_totals(
    totals: &Path,
    mut hgetall: impl FnMut(&str) -> Vec<(String, String)>,
    out: &mut BTreeMap<String, f64>,
) {
    let (mut lost, mut doubled, mut wrong, mut keys) = (0i64, 0i64, 0, 0);
    for line in std::fs::read_to_string(totals).unwrap().lines() {
        let Some((name, sent)) = line.split_once('\t') else {
            continue;
        };
        let sent: i64 = sent.parse().unwrap();
        for p in PRECISIONS {
            let key = format!("count:{p}:{name}");
            let got: i64 = hgetall(&key)
                .iter()
                .map(|(_, v)| v.parse::<i64>().unwrap_or(0))
                .sum();
            keys += 1;
            if got != sent {
                wrong += 1;
                if wrong <= 5 {
                    eprintln!("    {key}: sent {sent}, Redis holds {got}");
                }
            }
            lost += (sent - got).max(0);
            doubled += (got - sent).max(0);
        }
    }
    out.insert("lost".into(), lost as f64);
    out.insert("doubled".into(), doubled as f64);
    out.insert("keys_wrong".into(), wrong as f64);
    out.insert("keys".into(), keys as f64);
}

/// The flush-duration histogram's buckets (upper bound, count).
fn flush_buckets(http: u16) -> Vec<(f64, f64)> {
    let mut b: Vec<(f64, f64)> = metrics(http)
        .unwrap_or_default()
        .into_iter()
        .filter(|(k, _)| k.starts_with("statsd_redis_flush_duration_seconds_bucket"))
        .filter_map(|(k, v)| {
            let le = k.split("le=\"").nth(1)?.split('"').next()?;
            Some((le.replace("+Inf", "inf").parse().ok()?, v))
        })
        .collect();
    b.sort_by(|x, y| x.0.total_cmp(&y.0));
    b
}

/// p50 and p99 (bucket upper bounds) of the flushes between two snapshots.
fn percentiles(before: &[(f64, f64)], after: &[(f64, f64)], out: &mut BTreeMap<String, f64>) {
    let counts: Vec<(f64, f64)> = after
        .iter()
        .map(|&(le, c)| {
            let was = before.iter().find(|b| b.0 == le).map_or(0.0, |b| b.1);
            (le, c - was)
        })
        .collect();
    let total = counts.last().map_or(0.0, |c| c.1);
    out.insert("windows".into(), total);
    for (name, q) in [("p50", 0.5), ("p99", 0.99)] {
        if let Some(&(le, _)) = counts.iter().find(|c| total > 0.0 && c.1 >= q * total) {
            out.insert(name.into(), le);
        }
    }
}

struct Settings {
    runs: usize,
    secs: u64,
    series: u64,
    rate: u64,
}

fn show(label: &str, values: &BTreeMap<String, f64>) {
    let text: Vec<String> = values.iter().map(|(k, v)| format!("{k}={v:.2}")).collect();
    println!("    {label}: {}", text.join(" "));
}

/// The agent with `flags` under the load; at [`KILL_AT`] `kill`, which returns once Redis is
/// whole again (`a`); then `b`, `c` and the agent's own counts, once the load has drained and the
/// agent stopped. With the totals sent and what `kill` returned.
fn killed_under_load<R>(
    flags: &[String],
    cfg: &Settings,
    dir: &Path,
    kill: impl FnOnce() -> R,
) -> (BTreeMap<String, f64>, PathBuf, R) {
    let agent = Agent::start(flags, &dir.join("agent.log"));
    let load = Load::start(agent.udp, cfg, "fo", dir);
    sleep_until(load.started + KILL_AT - 1.0);
    let monitor = Monitor::start(agent.http);
    sleep_until(load.started + KILL_AT);
    let killed = now();
    let back = kill();
    let mut out = BTreeMap::from([("a".to_string(), now() - killed)]);
    let (end, totals) = load.finish();
    agent.drain(end, &mut out);
    agent.stop(&mut out);
    after_the_kill(&monitor.stop(), killed, &mut out);
    (out, totals, back)
}

fn cluster_failover(run: usize, cfg: &Settings, dir: &Path) -> BTreeMap<String, f64> {
    let mut cluster = Cluster::start();
    let masters = cluster.masters();
    let victim = masters[(run - 1) % masters.len()];
    let seeds = cluster.seeds().join(",");
    let flags = ["--redis-mode", "cluster", "--redis-cluster-nodes", &seeds].map(String::from);
    let (mut out, totals, _) = killed_under_load(&flags, cfg, dir, || {
        cluster.kill(victim);
        cluster.wait_failover(victim, Duration::from_secs(60))
    });
    check_totals(&totals, |key| cluster.hgetall(key), &mut out);
    println!("  run {run}: killed master :{victim}");
    out
}

fn sentinel_failover(run: usize, cfg: &Settings, dir: &Path) -> BTreeMap<String, f64> {
    let mut sentinels = Sentinels::start();
    let old = sentinels.master_port();
    let addrs = sentinels
        .sentinel_addrs()
        .iter()
        .map(|a| a.trim_start_matches("redis://").to_string())
        .collect::<Vec<_>>()
        .join(",");
    let flags = [
        "--redis-mode",
        "sentinel",
        "--redis-sentinels",
        &addrs,
        "--redis-master-name",
        sentinels.master_name(),
        "--wait-replicas",
        "1",
        "--wait-timeout-ms",
        "200",
    ]
    .map(String::from);
    let (mut out, totals, new) = killed_under_load(&flags, cfg, dir, || {
        sentinels.kill(old);
        sentinels.wait_new_master(old, Duration::from_secs(60))
    });
    let mut conn = sentinels.conn(new);
    check_totals(
        &totals,
        |key| redis::cmd("HGETALL").arg(key).query(&mut conn).unwrap(),
        &mut out,
    );
    println!("  run {run}: killed master :{old}, new master :{new}");
    out
}

/// The load on a running cluster, with 1024 slots moved `from` → `to` at [`KILL_AT`] when
/// asked; the measures prefixed by `label`.
fn load_run(
    cluster: &Cluster,
    label: &str,
    reshard: Option<(u16, u16)>,
    cfg: &Settings,
    dir: &Path,
    out: &mut BTreeMap<String, f64>,
) {
    let seeds = cluster.seeds().join(",");
    let flags = ["--redis-mode", "cluster", "--redis-cluster-nodes", &seeds].map(String::from);
    let agent = Agent::start(&flags, &dir.join(format!("agent-{label}.log")));
    let before = flush_buckets(agent.http);
    let load = Load::start(agent.udp, cfg, label, dir);
    let monitor = Monitor::start(agent.http);
    let mut mine = BTreeMap::new();
    if let Some((from, to)) = reshard {
        sleep_until(load.started + KILL_AT);
        let t = now();
        cluster.reshard(from, to, 1024);
        mine.insert("reshard_secs".to_string(), now() - t);
        mine.insert(
            "load_left".to_string(),
            load.started + cfg.secs as f64 - now(),
        );
    }
    let (end, totals) = load.finish();
    // Drained first: the windows of the load are all in the histogram.
    agent.drain(end, &mut mine);
    percentiles(&before, &flush_buckets(agent.http), &mut mine);
    agent.stop(&mut mine);
    mine.insert("max_write_gap".into(), longest_gap(&monitor.stop(), end));
    check_totals(&totals, |key| cluster.hgetall(key), &mut mine);
    out.extend(mine.into_iter().map(|(k, v)| (format!("{label}_{k}"), v)));
}

fn reshard(run: usize, cfg: &Settings, dir: &Path) -> BTreeMap<String, f64> {
    let cluster = Cluster::start();
    let masters = cluster.masters();
    let (from, to) = (masters[(run - 1) % 3], masters[run % 3]);
    println!("  run {run}: 1024 slots :{from} -> :{to}");
    let mut out = BTreeMap::new();
    load_run(&cluster, "base", None, cfg, dir, &mut out);
    load_run(&cluster, "reshard", Some((from, to)), cfg, dir, &mut out);
    let checked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| cluster.check()));
    println!(
        "    redis-cli --cluster check: {}",
        if checked.is_ok() {
            "clean"
        } else {
            "FAILED (above)"
        }
    );
    out
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let arg = |i: usize, default: &str| args.get(i).cloned().unwrap_or(default.into());
    let cfg = Settings {
        runs: arg(0, "3").parse().expect("runs"),
        secs: arg(1, "20").parse().expect("secs"),
        series: arg(2, "2000").parse().expect("series"),
        rate: arg(3, "20000").parse().expect("rate"),
    };
    let scenarios = arg(4, "cluster,sentinel,reshard");
    let work = tempfile::tempdir().unwrap();
    println!(
        "failover-timing: {} runs; load {} counter series, {} lines/s, 20 lines/datagram, {} s; kill/reshard at {KILL_AT} s",
        cfg.runs, cfg.series, cfg.rate, cfg.secs
    );
    for scenario in scenarios.split(',') {
        println!("== {scenario}");
        let mut results = Vec::new();
        for run in 1..=cfg.runs {
            let dir = work.path().join(format!("{scenario}-{run}"));
            std::fs::create_dir_all(&dir).unwrap();
            let out = match scenario {
                "cluster" => cluster_failover(run, &cfg, &dir),
                "sentinel" => sentinel_failover(run, &cfg, &dir),
                "reshard" => reshard(run, &cfg, &dir),
                other => panic!("unknown scenario {other} (cluster, sentinel, reshard)"),
            };
            show("measured", &out);
            results.push(out);
        }
        let mut by_key: BTreeMap<String, Vec<f64>> = BTreeMap::new();
        for r in &results {
            for (k, v) in r {
                by_key.entry(k.clone()).or_default().push(*v);
            }
        }
        let medians = by_key.into_iter().map(|(k, v)| (k, median(v))).collect();
        show(&format!("median of {}", results.len()), &medians);
    }
    if let Ok(keep) = std::env::var("KEEP") {
        let status = Command::new("cp")
            .args(["-r", &work.path().display().to_string(), &keep])
            .status()
            .unwrap();
        assert!(status.success());
        println!("run files kept in {keep}");
    }
}
