//! Carbon's plaintext receivers (`carbon_tcp`, `carbon_udp`) side by side with carbon-cache
//! 1.1.7 itself (Debian's graphite-carbon, whisper files): the same lines go to both, over TCP
//! and UDP, and every series reads back alike, the agent's through its Graphite API and
//! carbon's through `whisper.fetch` (what graphite-web reads), at ranges that pick each of the
//! schema's three archives: points in the finest archive that keeps their age, late points,
//! repeated slices, too old, `-1`, NaN, bad lines, coarser slices written at and not below the
//! xFilesFactor, and a coarser slice recomputed after the finer ones it is made of moved into
//! the agent's blocks.

mod common;

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{TcpStream, UdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use common::answers::differences;
use common::*;
use redis::Commands;
use serde_json::Value;

const SCHEMA: &str = "10s:6h,1m:7d,1h:90d";

/// One section a method, at an xFilesFactor of 0, one of 0.1 (whisper keeps it as a 32-bit
/// float: 6 known minutes of an hour's 60 are below it), and carbon's default for the rest.
const AGGREGATION: &str = "\
[sum]
pattern = \\.sum$
xFilesFactor = 0
aggregationMethod = sum

[last]
pattern = \\.last$
xFilesFactor = 0
aggregationMethod = last

[max]
pattern = \\.max$
xFilesFactor = 0
aggregationMethod = max

[min]
pattern = \\.min$
xFilesFactor = 0
aggregationMethod = min

[avg_zero]
pattern = \\.avg_zero$
xFilesFactor = 0
aggregationMethod = avg_zero

[absmax]
pattern = \\.absmax$
xFilesFactor = 0
aggregationMethod = absmax

[absmin]
pattern = \\.absmin$
xFilesFactor: 0
AggregationMethod: absmin

[tenth]
pattern = ^t\\.tenth
xFilesFactor = 0.1
";

/// carbon-cache on free ports with `SCHEMA` for every path and `AGGREGATION` (carbon's default
/// for the paths it does not name: average, xFilesFactor 0.5), killed when dropped.
struct Carbon {
    dir: tempfile::TempDir,
    tcp: u16,
    udp: u16,
    pickle: u16,
    _process: Killed,
}

impl Carbon {
    fn start() -> Carbon {
        Carbon::start_in(tempfile::tempdir().unwrap(), "ENABLE_TAGS = False\n")
    }

    /// In `dir` (its whisper files in `dir/whisper`), `settings` added to carbon.conf.
    fn start_in(dir: tempfile::TempDir, settings: &str) -> Carbon {
        let schemas = format!("[all]\npattern = .*\nretentions = {SCHEMA}\n");
        Carbon::start_with(dir, settings, &schemas)
    }

    /// [`Carbon::start_in`] with `schemas` as its storage-schemas.conf.
    fn start_with(dir: tempfile::TempDir, settings: &str, schemas: &str) -> Carbon {
        assert!(
            Path::new("/usr/bin/carbon-cache").exists(),
            "this test runs carbon: apt-get install -y --no-install-recommends graphite-carbon python3-whisper"
        );
        let root = dir.path();
        for d in ["conf", "whisper", "log", "pids", "lists"] {
            std::fs::create_dir_all(root.join(d)).unwrap();
        }
        let (tcp, udp, pickle, query) = (free_port(), free_port(), free_port(), free_port());
        let r = root.display();
        std::fs::write(
            root.join("conf/carbon.conf"),
            format!(
                "[cache]\nSTORAGE_DIR = {r}/\nLOCAL_DATA_DIR = {r}/whisper/\nWHITELISTS_DIR = {r}/lists/\n\
                 CONF_DIR = {r}/conf/\nLOG_DIR = {r}/log/\nPID_DIR = {r}/pids/\nUSER =\n\
                 ENABLE_LOGROTATION = False\nMAX_CACHE_SIZE = inf\nMAX_UPDATES_PER_SECOND = inf\n\
                 MAX_CREATES_PER_MINUTE = inf\nMIN_TIMESTAMP_RESOLUTION = 0\n\
                 LINE_RECEIVER_INTERFACE = 127.0.0.1\nLINE_RECEIVER_PORT = {tcp}\n\
                 ENABLE_UDP_LISTENER = True\nUDP_RECEIVER_INTERFACE = 127.0.0.1\nUDP_RECEIVER_PORT = {udp}\n\
                 PICKLE_RECEIVER_INTERFACE = 127.0.0.1\nPICKLE_RECEIVER_PORT = {pickle}\nCACHE_QUERY_INTERFACE = 127.0.0.1\nCACHE_QUERY_PORT = {query}\n\
                 CACHE_WRITE_STRATEGY = sorted\nWHISPER_AUTOFLUSH = False\nCARBON_METRIC_INTERVAL = 0\n\
                 {settings}"
            ),
        )
        .unwrap();
        std::fs::write(root.join("conf/storage-schemas.conf"), schemas).unwrap();
        std::fs::write(root.join("conf/storage-aggregation.conf"), AGGREGATION).unwrap();
        let process = Command::new("/usr/bin/carbon-cache")
            .arg(format!("--config={r}/conf/carbon.conf"))
            .arg(format!("--pidfile={r}/pids/carbon.pid"))
            .args(["--nodaemon", "start"])
            .env("GRAPHITE_ROOT", root)
            .stdout(std::fs::File::create(root.join("log/out")).unwrap())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let process = Killed(process);
        let deadline = std::time::Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(("127.0.0.1", tcp)).is_err() {
            assert!(
                std::time::Instant::now() < deadline,
                "carbon-cache did not listen: {}",
                std::fs::read_to_string(root.join("log/out")).unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        Carbon {
            dir,
            tcp,
            udp,
            pickle,
            _process: process,
        }
    }

    fn whisper_file(&self, path: &str) -> PathBuf {
        self.dir
            .path()
            .join("whisper")
            .join(format!("{}.wsp", path.replace('.', "/")))
    }

    /// `whisper.fetch` of `path` over `[from, until]`: the points with their times, as
    /// graphite-web reads them (None: no file).
    fn fetch(&self, path: &str, from: u64, until: u64) -> Option<Vec<(u64, Option<f64>)>> {
        let file = self.whisper_file(path);
        if !file.exists() {
            return None;
        }
        let out = run_ok(
            Command::new("/usr/bin/python3").args([
                "-c",
                "import json, sys, whisper\n\
                 (start, end, step), values = whisper.fetch(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]))\n\
                 print(json.dumps([[start + i * step, v] for i, v in enumerate(values)]))",
                &file.display().to_string(),
                &from.to_string(),
                &until.to_string(),
            ]),
            "whisper.fetch (apt-get install -y python3-whisper)",
        );
        let points: Value = serde_json::from_slice(&out.stdout).unwrap();
        Some(
            points
                .as_array()
                .unwrap()
                .iter()
                .map(|p| (p[0].as_u64().unwrap(), p[1].as_f64()))
                .collect(),
        )
    }
}

/// The agent's render of `path` over `[from, until]` (None: no such series).
fn render(http: u16, path: &str, from: u64, until: u64) -> Option<Vec<(u64, Option<f64>)>> {
    let answer = curl_json(&format!(
        "http://127.0.0.1:{http}/graphite/render?target={path}&from={from}&until={until}&format=json"
    ));
    let series = answer.as_array().unwrap().first()?;
    Some(
        series["datapoints"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| (p[1].as_u64().unwrap(), p[0].as_f64()))
            .collect(),
    )
}

/// Sends `lines` over TCP to `port` in one connection.
fn send_tcp(port: u16, lines: &[String]) {
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(lines.concat().as_bytes()).unwrap();
}

/// Sends `lines` over UDP to `port`, a few a datagram.
fn send_udp(port: u16, lines: &[String]) {
    let s = UdpSocket::bind("127.0.0.1:0").unwrap();
    for datagram in lines.chunks(3) {
        s.send_to(datagram.concat().as_bytes(), ("127.0.0.1", port))
            .unwrap();
    }
}

fn line(path: &str, value: f64, at: i64) -> String {
    format!("{path} {value} {at}\n")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn carbon_lines_read_back_as_carbon_cache_keeps_them() {
    let redis = RedisServer::start();
    let carbon = Carbon::start();
    let aggregation = carbon.dir.path().join("conf/storage-aggregation.conf");
    let (agent_tcp, agent_udp) = (free_port(), free_port());
    let (agent, _, http) = spawn_agent(
        &redis.url(),
        &[
            // Open intervals' coarser slices rolled up every second.
            "--coarse-write-secs",
            "1",
            "--retentions",
            SCHEMA,
            "--carbon-tcp",
            &format!("127.0.0.1:{agent_tcp}"),
            "--carbon-udp",
            &format!("127.0.0.1:{agent_udp}"),
            "--cleaner-interval-secs",
            "1",
            "--storage-aggregation",
            &aggregation.display().to_string(),
        ],
    );
    let _agent = Killed(agent);

    // Sent while the current ten seconds are well under way, so that `-1` is the same slice
    // for both.
    while !(2..6).contains(&(unix_now() % 10)) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now = unix_now() as i64;
    let minute = now - now % 60;
    let mut tcp = Vec::new();
    let mut udp = Vec::new();
    // Every ten seconds of the last 30 minutes, a little off the slice's start.
    for k in 1..=180 {
        tcp.push(line("c.full", (k * 7 % 23) as f64 + 0.25, now - k * 10 + 3));
    }
    // Minutes of 2 (below the xFilesFactor) and 3 of 6 known slices (at it).
    for k in 0..2 {
        tcp.push(line("c.partial", k as f64, minute - 600 + k * 10));
    }
    for k in 0..3 {
        tcp.push(line("c.partial", 10.0 + k as f64, minute - 300 + k * 10));
    }
    // Seven hours old, out of order: the minutes' archive itself.
    for k in [5, 1, 4, 0, 3, 2, 9, 8, 7, 6] {
        tcp.push(line("c.hours", k as f64 * 1.5, minute - 7 * 3600 - k * 60));
    }
    // Eight days old: the hours' archive; a hundred days: dropped by both.
    tcp.push(line("c.days", 42.0, now - 8 * 86400));
    tcp.push(line("c.days", 43.0, now - 100 * 86400));
    // A repeated timestamp: the last sent; a later timestamp of the same slice, sent later.
    tcp.push(line("c.dup", 1.0, minute - 120));
    tcp.push(line("c.dup", 2.0, minute - 120));
    tcp.push(line("c.dup", 5.0, minute - 60));
    tcp.push(line("c.dup", 6.0, minute - 57));
    // Now, NaN, bad lines, and separators carbon takes.
    tcp.push("c.now 7 -1\n".into());
    tcp.push(format!("c.nan nan {}\nc.nan 1 {}\n", now - 30, now - 40));
    tcp.push(format!("c.ws\t\t3.5   {}\r\n", now - 50));
    tcp.push("bad\nc.bad 1\nc.bad x 1\nc.bad 1 N\n".into());
    for k in 0..12 {
        udp.push(line("c.udp", k as f64, now - 5 - k * 10));
    }
    // Each method over minutes of one to six known slices, negative values and ties of
    // magnitude among them.
    let methods = ["sum", "last", "max", "min", "avg_zero", "absmax", "absmin"];
    for method in methods {
        for m in 1..=6 {
            for k in 0..m {
                let v = ((m * 7 + k * 5) % 11) as f64 - 5.0;
                tcp.push(line(
                    &format!("m.{method}"),
                    v,
                    minute - 600 + m * 60 + k * 10,
                ));
            }
        }
    }
    // Six known minutes of an hour are below an xFilesFactor of 0.1, seven at it.
    let hour = minute - 7 * 3600 - (minute - 7 * 3600) % 3600;
    for (path, known) in [("t.tenth.six", 6), ("t.tenth.seven", 7)] {
        for k in 0..known {
            tcp.push(line(path, k as f64, hour + k * 60));
        }
    }
    // Two of a minute 40 minutes ago: below the xFilesFactor, until a third comes once the
    // agent's cleaner moved the first into its blocks.
    let late = minute - 2400;
    tcp.push(line("c.late", 1.0, late));
    tcp.push(line("c.late", 2.0, late + 10));

    for port in [carbon.tcp, agent_tcp] {
        send_tcp(port, &tcp);
    }
    for port in [carbon.udp, agent_udp] {
        send_udp(port, &udp);
    }
    eventually(
        Duration::from_secs(20),
        "the agent moved c.late's first slice into a block",
        || {
            !redis
                .conn()
                .keys::<_, Vec<String>>("history:gauge:10:c.late:*")
                .unwrap()
                .is_empty()
        },
    )
    .await;
    let third = [line("c.late", 6.0, late + 20)];
    for port in [carbon.tcp, agent_tcp] {
        send_tcp(port, &third);
    }

    let mut paths = vec![
        "c.full",
        "c.partial",
        "c.hours",
        "c.days",
        "c.dup",
        "c.now",
        "c.nan",
        "c.ws",
        "c.udp",
        "c.late",
        "t.tenth.six",
        "t.tenth.seven",
    ];
    let method_paths: Vec<String> = methods.iter().map(|m| format!("m.{m}")).collect();
    paths.extend(method_paths.iter().map(String::as_str));
    let until = now as u64;
    // Ranges that pick the ten seconds, the minutes and the hours.
    let ranges = [
        (until - 5 * 3600, until),
        (until - 6 * 86400, until),
        (until - 89 * 86400, until),
    ];
    let last = agree_with_carbon(&carbon, http, &paths, &ranges).await;
    assert!(last.is_empty(), "{last}");
    for &path in &paths {
        let held = ranges.iter().any(|&(from, until)| {
            carbon
                .fetch(path, from, until)
                .is_some_and(|p| p.iter().any(|(_, v)| v.is_some()))
        });
        assert!(held, "{path}: carbon kept nothing to compare");
    }
    // What both dropped, the agent counted.
    let metric = |m: &str| metric_at(format!("127.0.0.1:{http}").parse().unwrap(), m);
    assert_eq!(metric("carbon_points_total{outcome=\"too_old\"}"), 1.0);
    assert_eq!(metric("carbon_points_total{outcome=\"not_a_number\"}"), 1.0);
    assert_eq!(metric("bad_lines_total{transport=\"carbon_tcp\"}"), 4.0);
    assert!(carbon.fetch("c.bad", until - 3600, until).is_none());
    // The schema's other shapes: the last minute c.partial kept is the one at the factor.
    let minutes = render(http, "c.partial", until - 6 * 86400, until).unwrap();
    let written: Vec<(u64, f64)> = minutes
        .iter()
        .filter_map(|(t, v)| v.map(|v| (*t, v)))
        .collect();
    assert_eq!(written, [((minute - 300) as u64, 11.0)]);
    let hours = |path| {
        render(http, path, until - 89 * 86400, until)
            .unwrap()
            .into_iter()
            .filter(|(_, v)| v.is_some())
            .count()
    };
    assert_eq!((hours("t.tenth.six"), hours("t.tenth.seven")), (0, 1));
}

/// Points in flight while Redis is down, then the agent killed (SIGKILL): the spool brings them
/// to the Redis that comes back, each slice once, the coarser one made of them.
/// The precisions at which `series` has a hash of `family` (`count`, `gauge`), in order.
fn held(conn: &mut redis::Connection, family: &str, series: &str) -> Vec<u64> {
    let mut held: Vec<u64> = conn
        .keys::<_, Vec<String>>(format!("{family}:*:{series}"))
        .unwrap()
        .iter()
        .map(|k| k.split(':').nth(1).unwrap().parse().unwrap())
        .collect();
    held.sort_unstable();
    held
}

/// What differs between carbon's files (`whisper.fetch`) and the agent's renders at `http`,
/// for each of `paths` over each of `ranges`, retried for up to 30 s (both write a while
/// after the lines); empty when everything agrees.
async fn agree_with_carbon(
    carbon: &Carbon,
    http: u16,
    paths: &[&str],
    ranges: &[(u64, u64)],
) -> String {
    let mut last = String::new();
    for _ in 0..60 {
        let mut differences = Vec::new();
        for &path in paths {
            // Both written first: carbon's cache writes its files a while after the lines.
            if !carbon.whisper_file(path).exists() {
                differences.push(format!("{path}: carbon wrote no file yet"));
                continue;
            }
            for &(from, until) in ranges {
                let (want, got) = (
                    carbon.fetch(path, from, until),
                    render(http, path, from, until),
                );
                if want != got {
                    let shown = |p: &Option<Vec<(u64, Option<f64>)>>| {
                        p.as_ref().map(|p| {
                            let step = p.get(1).map_or(0, |b| b.0 - p[0].0);
                            let known: BTreeMap<u64, f64> =
                                p.iter().filter_map(|(t, v)| Some((*t, (*v)?))).collect();
                            (step, known)
                        })
                    };
                    differences.push(format!(
                        "{path} over {}: carbon {:?}, agent {:?}",
                        until - from,
                        shown(&want),
                        shown(&got)
                    ));
                }
            }
        }
        if differences.is_empty() {
            return String::new();
        }
        last = differences.join("\n");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    last
}

/// Debian's storage-schemas.conf (`[carbon]`, and its `[default_1min_for_1day]` narrowed to
/// `d.`), a short and a long section, and carbon's own fallback for every other path.
const SCHEMAS: &str = "\
[carbon]
pattern = ^carbon\\.
retentions = 60:90d

[short]
pattern = ^s\\.
retentions = 10s:1h,1m:1d

[long]
pattern = ^l\\.
retentions = 10s:1d,1m:7d

[default_1min_for_1day]
pattern = ^d\\.
retentions = 60s:1d,5m:30d,1h:3y
";

/// `storage_schemas`: the same file for carbon-cache and the agent; each path's points kept,
/// carried down and read back through its own schema's archives (graphite-web's choice of
/// archive at ranges that pick each of them), a path no section matches under carbon's
/// fallback; each StatsD series read and trimmed by its own schema too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_path_keeps_its_own_schema_as_carbon_cache_does() {
    let redis = RedisServer::start();
    let carbon = Carbon::start_with(
        tempfile::tempdir().unwrap(),
        "ENABLE_TAGS = False\n",
        SCHEMAS,
    );
    let schemas = carbon.dir.path().join("conf/storage-schemas.conf");
    let schemas = schemas.display().to_string();
    let agent_tcp = free_port();
    let (agent, udp, http) = spawn_agent(
        &redis.url(),
        &[
            "--storage-schemas",
            &schemas,
            "--carbon-tcp",
            &format!("127.0.0.1:{agent_tcp}"),
            "--cleaner-interval-secs",
            "1",
            // Every precision every window: the counters' keys show at once.
            "--coarse-write-secs",
            "0",
        ],
    );
    let _agent = Killed(agent);

    while !(2..6).contains(&(unix_now() % 10)) {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let now = unix_now() as i64;
    let paths = ["carbon.a", "s.a", "l.a", "d.a", "other.a"];
    let mut lines = Vec::new();
    for (n, path) in (0i64..).zip(paths) {
        // Every ten seconds of the last 20 minutes, every minute of the last three hours,
        // then single points at ages only some schemas keep.
        for k in 1..=120 {
            lines.push(line(path, (k * 7 % 23 + n) as f64, now - k * 10 + 3));
        }
        for k in 21..=180 {
            lines.push(line(path, (k % 13 + n) as f64 + 0.5, now - k * 60 + 1));
        }
        for (days, value) in [(3, 1.0), (10, 2.0), (60, 3.0), (100, 4.0), (700, 5.0)] {
            lines.push(line(path, value + n as f64, now - days * 86400 - 7));
        }
    }
    for port in [carbon.tcp, agent_tcp] {
        send_tcp(port, &lines);
    }

    let until = now as u64;
    // Ranges that pick each archive of each schema, and some past the shorter ones.
    let ranges: Vec<(u64, u64)> = [
        1800,
        5 * 3600,
        2 * 86400,
        20 * 86400,
        80 * 86400,
        800 * 86400,
    ]
    .iter()
    .map(|&r| (until - r, until))
    .collect();
    let last = agree_with_carbon(&carbon, http, &paths, &ranges).await;
    assert!(last.is_empty(), "{last}");
    // Carbon's files imported into another Redis under the same file, read by an agent over
    // it: the same answers.
    let imported = RedisServer::start();
    run_ok(
        bin()
            .args(["import", "whisper"])
            .arg(carbon.dir.path().join("whisper"))
            .args(["--redis", &imported.url(), "--storage-schemas", &schemas])
            // The minute under way too (by default the import leaves it to the agent).
            .args(["--until", &(until + 3600).to_string()]),
        "statsd-redis import whisper",
    );
    let (reader, _, reader_http) = spawn_agent(&imported.url(), &["--storage-schemas", &schemas]);
    let _reader = Killed(reader);
    let last = agree_with_carbon(&carbon, reader_http, &paths, &ranges).await;
    assert!(last.is_empty(), "imported: {last}");
    // Points are kept only in their own schema's hashes.
    let mut conn = redis.conn();
    for (path, precisions) in [
        ("carbon.a", &[60][..]),
        ("s.a", &[10, 60]),
        ("l.a", &[10, 60]),
        ("d.a", &[60, 300, 3600]),
        ("other.a", &[60]),
    ] {
        assert_eq!(held(&mut conn, "gauge", path), precisions, "{path}");
    }

    // A StatsD counter of each schema: read at its own archives, trimmed to its own length.
    // A slice two hours old at 10 s: kept in blocks for l. (a day), trimmed for s. (an
    // hour) and for a path whose schema does not list 10 s (the book's 120 slices).
    let old = (now - 7200 - now % 10) as u64;
    for name in ["s.c", "l.c", "other.c"] {
        let _: () = conn.hset(format!("count:10:{name}"), old, 5).unwrap();
        let _: () = conn.zadd("known:", format!("10:{name}"), 0).unwrap();
    }
    let statsd = UdpSocket::bind("127.0.0.1:0").unwrap();
    statsd
        .send_to(b"s.c:1|c\nl.c:1|c\nother.c:1|c", ("127.0.0.1", udp))
        .unwrap();
    // (None while the hash is empty: the old slice trimmed, the new one not yet written.)
    let cli = |name: &str| -> Vec<(u64, i64)> {
        let out = bin()
            .args([
                "get",
                "--json",
                "counter",
                name,
                "--precision",
                "10",
                "--redis",
                &redis.url(),
                "--storage-schemas",
                &schemas,
            ])
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() && stderr.contains("no counter") {
            return Vec::new();
        }
        assert!(out.status.success(), "statsd-redis get counter: {stderr}");
        serde_json::from_slice(&out.stdout).unwrap()
    };
    eventually(
        Duration::from_secs(30),
        "the cleaner trimmed s.c's and other.c's old slice and moved l.c's into a block",
        || {
            let old_in = |name: &str| cli(name).iter().any(|(t, _)| *t == old);
            let wrote = |name: &str| cli(name).iter().any(|(t, n)| *t > old && *n == 1);
            // (A pass trims and moves batch by batch: l.c's block may come a moment later.)
            let moved = !redis
                .conn()
                .keys::<_, Vec<String>>("history:count:10:l.c:*")
                .unwrap()
                .is_empty();
            !old_in("s.c")
                && !old_in("other.c")
                && old_in("l.c")
                && moved
                && wrote("s.c")
                && wrote("l.c")
        },
    )
    .await;
    // Each counter written only at its own schema's precisions, of the four any section has.
    for (name, precisions) in [
        ("s.c", &[10, 60][..]),
        ("l.c", &[10, 60]),
        ("other.c", &[60]),
    ] {
        assert_eq!(held(&mut conn, "count", name), precisions, "{name}");
    }
    // The Graphite API shows each counter at its own schema's finest archive that covers the
    // range: ten seconds for s.c over half an hour, a minute for other.c (carbon's fallback).
    let step = |name: &str| {
        let p = render(http, name, until - 1800, until + 60).unwrap();
        p[1].0 - p[0].0
    };
    assert_eq!((step("s.c"), step("other.c")), (10, 60));
    // Every kept point was compared: each path has points carbon kept.
    for path in paths {
        let held = ranges.iter().any(|&(from, until)| {
            carbon
                .fetch(path, from, until)
                .is_some_and(|p| p.iter().any(|(_, v)| v.is_some()))
        });
        assert!(held, "{path}: carbon kept nothing to compare");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn points_through_an_outage_and_a_kill_arrive_whole() {
    let mut redis = RedisServer::start();
    redis.kill();
    let spool = tempfile::tempdir().unwrap();
    let port = free_port();
    let args = [
        // Open intervals' coarser slices rolled up every second.
        "--coarse-write-secs",
        "1",
        "--retentions",
        SCHEMA,
        "--carbon-tcp",
        &format!("127.0.0.1:{port}"),
        "--spool-dir",
        &spool.path().display().to_string(),
    ];
    let (agent, _, http) = spawn_agent(&redis.url(), &args);
    let mut agent = Killed(agent);
    let now = unix_now() as i64;
    let minute = now - now % 60 - 120;
    // Up to three minutes old: older than the slices a gauge's hash keeps, so some are set
    // straight into their block; the series is read from both.
    let lines: Vec<String> = (0..6)
        .map(|k| line("c.outage", k as f64, minute + k * 10))
        .collect();
    send_tcp(port, &lines);
    let http: std::net::SocketAddr = format!("127.0.0.1:{http}").parse().unwrap();
    eventually(Duration::from_secs(10), "the points placed", || {
        metric_at(http, "carbon_points_total{outcome=\"placed\"}") == 6.0
    })
    .await;
    // Placed at the close, then spooled before the window is queued.
    tokio::time::sleep(Duration::from_millis(500)).await;
    agent.kill();
    redis.restart_after(Duration::ZERO, &[]);
    let (again, _, _) = spawn_agent(&redis.url(), &args);
    let _again = Killed(again);
    let want_fine: BTreeMap<u64, f64> = (0..6)
        .map(|k| ((minute + k * 10) as u64, k as f64))
        .collect();
    let want_minute = BTreeMap::from([(minute as u64, 2.5)]);
    eventually(
        Duration::from_secs(20),
        "the spooled points written",
        || {
            redis.history("gauge:10:c.outage") == want_fine
                && redis.history("gauge:60:c.outage") == want_minute
        },
    )
    .await;
}

/// A coarser slice whose interval is still open is not made with each point but left pending
/// in Redis, written by the same script as the point, and made by the next rollup run: the
/// agent killed before that run, the next one makes it, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_intervals_rollup_waits_for_its_run_and_survives_a_kill() {
    let redis = RedisServer::start();
    let port = free_port();
    let args = |period: &'static str| {
        vec![
            "--retentions".to_string(),
            SCHEMA.to_string(),
            "--carbon-tcp".to_string(),
            format!("127.0.0.1:{port}"),
            "--coarse-write-secs".to_string(),
            period.to_string(),
        ]
    };
    let spawn = |a: Vec<String>| {
        let a: Vec<&str> = a.iter().map(String::as_str).collect();
        spawn_agent(&redis.url(), &a)
    };
    // Early in a minute, so that it is still open when the points are written.
    while !(2..20).contains(&(unix_now() % 60)) {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let (agent, _, http) = spawn(args("600"));
    let mut agent = Killed(agent);
    let now = unix_now() as i64;
    let minute = now - now % 60;
    let lines: Vec<String> = (0..6)
        .map(|k| line("r.open", k as f64, minute + k * 10))
        .collect();
    send_tcp(port, &lines);
    let http: std::net::SocketAddr = format!("127.0.0.1:{http}").parse().unwrap();
    let mut conn = redis.conn();
    eventually(Duration::from_secs(10), "the points written", || {
        conn.hlen::<_, usize>("gauge:10:r.open").unwrap() == 6
    })
    .await;
    let minutes: BTreeMap<String, String> = conn.hgetall("gauge:60:r.open").unwrap();
    assert!(minutes.is_empty(), "the open minute waits: {minutes:?}");
    let pending: Vec<String> = conn.zrange("pending:gauge:", 0, -1).unwrap();
    assert_eq!(pending.len(), 1, "{pending:?}");
    assert!(pending[0].ends_with("|r.open"), "{pending:?}");
    assert_eq!(metric_at(http, "carbon_rollups_total"), 0.0);
    agent.kill();

    let (again, _, http) = spawn(args("1"));
    let _again = Killed(again);
    let http: std::net::SocketAddr = format!("127.0.0.1:{http}").parse().unwrap();
    eventually(Duration::from_secs(10), "the next agent's run", || {
        metric_at(http, "carbon_rollups_total") == 1.0
    })
    .await;
    let minutes: BTreeMap<String, String> = conn.hgetall("gauge:60:r.open").unwrap();
    assert_eq!(
        minutes,
        BTreeMap::from([(minute.to_string(), "2.5".to_string())])
    );
    // One known minute of sixty: below the hour's xFilesFactor, as whisper leaves it.
    assert_eq!(conn.hlen::<_, usize>("gauge:3600:r.open").unwrap(), 0);
    let pending: Vec<String> = conn.zrange("pending:gauge:", 0, -1).unwrap();
    assert!(pending.is_empty(), "{pending:?}");
    // A later point of the same minute leaves it pending again, and the next run makes it.
    send_tcp(port, &[line("r.open", 11.0, minute + 50)]);
    eventually(Duration::from_secs(10), "the minute made again", || {
        conn.hget::<_, _, Option<String>>("gauge:60:r.open", minute)
            .unwrap()
            .as_deref()
            == Some("3.5")
    })
    .await;
}

/// A rollup run claims its batch out of `pending:gauge:` before it reads: a run that stopped
/// after its claim (its agent killed) leaves the members in `rolling:gauge:`, and a later run
/// claims them again once the claim is old, but not while it is young (another agent's run in
/// progress); a point written while a run works adds its member to `pending:gauge:` again, so
/// whatever that run wrote, the next run makes the slice with the point; a member whose finer
/// hash's name holds another type is refused and counted, the rest of its batch made.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollup_stopped_half_way_or_raced_by_a_point_loses_nothing() {
    use statsd_redis::store::rollup::Rollups;
    let redis = RedisServer::start();
    let store = statsd_redis::store::Store::open(&test_config(&redis)).unwrap();
    let telemetry = std::sync::Arc::new(statsd_redis::telemetry::Telemetry::new());
    let mut rollups = Rollups::new(store, Duration::from_secs(60), telemetry.clone());
    let mut conn = redis.conn();
    let now = unix_now();
    let minute = now - now % 60;
    let member = |series: &str| format!("2|{minute}|sum|0|10:21600:0,60:604800:0|{series}");
    let made = |conn: &mut redis::Connection, series: &str| -> Option<f64> {
        conn.hget(format!("gauge:60:{series}"), minute).unwrap()
    };
    for (series, values) in [("r.dead", [1, 2]), ("r.busy", [3, 4]), ("r.raced", [5, 6])] {
        for (k, v) in values.iter().enumerate() {
            let () = conn
                .hset(format!("gauge:10:{series}"), minute + 10 * k as u64, v)
                .unwrap();
        }
    }
    // A run claimed r.dead 100 s ago and was killed; another, claiming r.busy now, works on.
    let () = conn.zadd("pending:gauge:", member("r.dead"), now).unwrap();
    assert_eq!(
        claim_rollups(&mut conn, (now - 100) * 1_000_000 + 7),
        [member("r.dead")]
    );
    let () = conn.zadd("pending:gauge:", member("r.busy"), now).unwrap();
    assert_eq!(
        claim_rollups(&mut conn, now * 1_000_000 + 5),
        [member("r.busy")]
    );
    assert_eq!(rollups.run_once(now).await.unwrap(), 1);
    assert_eq!(made(&mut conn, "r.dead"), Some(3.0));
    assert_eq!(
        made(&mut conn, "r.busy"),
        None,
        "a young claim is left to its run"
    );
    let rolling: Vec<String> = conn.zrange("rolling:gauge:", 0, -1).unwrap();
    assert_eq!(rolling, [member("r.busy")]);
    assert_eq!(rollups.run_once(now + 31).await.unwrap(), 1);
    assert_eq!(made(&mut conn, "r.busy"), Some(7.0));

    // A run claims r.raced and reads 5 and 6; a point arrives (the writer's HSET and ZADD NX);
    // then the run writes what it read, and lets its claim go.
    let () = conn.zadd("pending:gauge:", member("r.raced"), now).unwrap();
    let score = now * 1_000_000 + 9;
    assert_eq!(claim_rollups(&mut conn, score), [member("r.raced")]);
    let () = conn.hset("gauge:10:r.raced", minute + 20, 7).unwrap();
    let added: u64 = redis::cmd("ZADD")
        .arg("pending:gauge:")
        .arg("NX")
        .arg(now)
        .arg(member("r.raced"))
        .query(&mut conn)
        .unwrap();
    assert_eq!(added, 1, "the point's member is pending again");
    let () = conn.hset("gauge:60:r.raced", minute, 11).unwrap();
    let () = redis::cmd("ZREMRANGEBYSCORE")
        .arg("rolling:gauge:")
        .arg(score)
        .arg(score)
        .query(&mut conn)
        .unwrap();
    // Beside it, a member whose finer hash's name holds another program's string: refused,
    // counted, and the rest of the batch made.
    let () = conn.set("gauge:10:r.wrong", "x").unwrap();
    let () = conn.zadd("pending:gauge:", member("r.wrong"), now).unwrap();
    assert_eq!(rollups.run_once(now).await.unwrap(), 2);
    assert_eq!(made(&mut conn, "r.raced"), Some(18.0));
    assert!(
        telemetry
            .render()
            .contains("statsd_redis_write_failures_total{reason=\"wrong_type\"} 1"),
        "{}",
        telemetry.render()
    );
    assert_eq!(conn.zcard::<_, usize>("pending:gauge:").unwrap(), 0);
    assert_eq!(conn.zcard::<_, usize>("rolling:gauge:").unwrap(), 0);
    let known: Vec<String> = conn.zrange("known:gauge:", 0, -1).unwrap();
    assert_eq!(known, ["60:r.busy", "60:r.dead", "60:r.raced"]);
}

/// A rollup makes an hour of minutes most of which the cleaner moved into their block (a
/// gauge's hash keeps its newest 16): one `GETRANGE` of their neighbouring slots for the level,
/// the hash's value of a minute found in both read over the block's, a block's empty slot not
/// known (the hour below its xFilesFactor then, as whisper leaves it).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollup_reads_an_hours_moved_minutes_as_one_range() {
    use statsd_redis::store::history::{self, Geometry};
    use statsd_redis::store::rollup::Rollups;
    let redis = RedisServer::start();
    let config = test_config(&redis);
    let store = statsd_redis::store::Store::open(&config).unwrap();
    let telemetry = std::sync::Arc::new(statsd_redis::telemetry::Telemetry::new());
    let mut rollups = Rollups::new(store, Duration::from_secs(60), telemetry);
    let mut conn = redis.conn();
    let now = unix_now();
    // Three hours ago: every minute of it older than the newest 16 the hash keeps.
    let hour = now - now % 3600 - 3 * 3600;
    let spec = "10:21600:248,60:604800:2008,3600:7776000:248";
    let member = |series: &str, xff: f64| format!("3|{hour}|sum|{xff}|{spec}|{series}");
    let geometry = Geometry { slots: 2008 };
    let keys = statsd_redis::store::Keys::new(&config.key_prefix);
    // Minutes k = 0..59 hold k + 1 in the block, but minute 59, left out (an empty slot); the
    // hash holds minutes 50..59, minute 50 newer (100) than its block's.
    let mut blocks: BTreeMap<u64, Vec<(u64, f64)>> = BTreeMap::new();
    for k in 0..59u64 {
        let (block, at) = geometry.locate(60, hour + 60 * k);
        blocks.entry(block).or_default().push((at, (k + 1) as f64));
    }
    for series in ["r.moved", "r.gap"] {
        let hash = format!("gauge:60:{series}");
        for (&block, slots) in &blocks {
            let key = history::block_key(&keys, &hash, geometry, block);
            let bytes = history::block_bytes(geometry, slots, history::Family::Gauge);
            let () = conn.set(key, bytes).unwrap();
        }
        if series == "r.moved" {
            for k in 50..60u64 {
                let v = if k == 50 { 100.0 } else { (k + 1) as f64 };
                let () = conn.hset(&hash, hour + 60 * k, v).unwrap();
            }
        }
    }
    let () = conn
        .zadd("pending:gauge:", member("r.moved", 1.0), now)
        .unwrap();
    let () = conn
        .zadd("pending:gauge:", member("r.gap", 1.0), now)
        .unwrap();
    let () = redis::cmd("CONFIG")
        .arg("RESETSTAT")
        .query(&mut conn)
        .unwrap();
    assert_eq!(rollups.run_once(now).await.unwrap(), 2);
    // 1 + ... + 60, minute 50 read as the hash's 100 rather than the block's 51.
    let sum: f64 = (1..=60).map(f64::from).sum::<f64>() - 51.0 + 100.0;
    let made = |conn: &mut redis::Connection, series: &str| -> Option<f64> {
        conn.hget(format!("gauge:3600:{series}"), hour).unwrap()
    };
    assert_eq!(made(&mut conn, "r.moved"), Some(sum));
    // Minute 59 in neither: 59 of 60 known, below an xFilesFactor of 1.
    assert_eq!(made(&mut conn, "r.gap"), None);
    // (An hour may straddle two blocks: a range each.) Read from blocks: r.moved's minutes
    // 0..49, r.gap's 0..59.
    let spanned = |minutes: u64| {
        let first = geometry.locate(60, hour).0;
        geometry.locate(60, hour + 60 * (minutes - 1)).0 - first + 1
    };
    let ranges = spanned(50) + spanned(60);
    assert_eq!(
        redis.calls("getrange"),
        ranges,
        "one range a series' level's block"
    );
}

/// A batch's points older than the slices a long archive's hash keeps go straight into its
/// blocks, before any cleaner pass: the hash stays short, a group the batch fills in part keeps
/// the slots it held, and a value the hash held for such a slice gives way to the newer one,
/// whether the script set it (a group in part) or the agent made the group's bytes (whole);
/// a block's name held by another program's key takes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn old_points_of_a_batch_go_straight_into_blocks() {
    let redis = RedisServer::start();
    let port = free_port();
    let (agent, _, http) = spawn_agent(
        &redis.url(),
        &[
            "--retentions",
            SCHEMA,
            "--carbon-tcp",
            &format!("127.0.0.1:{port}"),
            // One pass at the start, before the points; none after.
            "--cleaner-interval-secs",
            "3600",
        ],
    );
    let _agent = Killed(agent);
    let now = unix_now() as i64;
    let start = now - now % 10 - 3000;
    // A value for a slice that the batch below writes again.
    send_tcp(port, &[line("b.old", -1.0, start + 100)]);
    let mut conn = redis.conn();
    eventually(Duration::from_secs(10), "the lone point", || {
        conn.hlen::<_, usize>("gauge:10:b.old").unwrap() == 1
    })
    .await;
    // Every other slice of 300, then the rest: the second batch fills groups in part.
    let value = |k: i64| (k * 7 % 13) as f64 + 0.5;
    let evens: Vec<String> = (0..300)
        .step_by(2)
        .map(|k| line("b.old", value(k), start + k * 10))
        .collect();
    send_tcp(port, &evens);
    eventually(Duration::from_secs(10), "the first batch", || {
        !conn
            .keys::<_, Vec<String>>("history:gauge:10:b.old:*")
            .unwrap()
            .is_empty()
    })
    .await;
    let odds: Vec<String> = (1..300)
        .step_by(2)
        .map(|k| line("b.old", value(k), start + k * 10))
        .collect();
    send_tcp(port, &odds);
    let want: BTreeMap<u64, f64> = (0..300)
        .map(|k| ((start + k * 10) as u64, value(k)))
        .collect();
    let from = start as u64 - 10;
    let until = (start + 3000) as u64;
    let mut got = BTreeMap::new();
    for _ in 0..50 {
        got = render(http, "b.old", from, until)
            .unwrap_or_default()
            .into_iter()
            .filter_map(|(t, v)| Some((t, v?)))
            .collect();
        if got == want {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(got, want);
    let fields = conn.hlen::<_, usize>("gauge:10:b.old").unwrap();
    assert!(fields <= 121, "the hash holds {fields} fields");
    assert_eq!(
        metric_at(
            format!("127.0.0.1:{http}").parse().unwrap(),
            "cleaner_slices_moved_total"
        ),
        0.0
    );
    // A batch that fills whole groups sends them as the blocks' own bytes: a lone older value
    // in the hash gives way to them.
    send_tcp(port, &[line("b.old", -5.0, start + 200)]);
    eventually(Duration::from_secs(10), "the lone older value", || {
        conn.hget::<_, _, Option<f64>>("gauge:10:b.old", start + 200)
            .unwrap()
            == Some(-5.0)
    })
    .await;
    let whole_batch = |shift: f64| -> (Vec<String>, BTreeMap<u64, f64>) {
        let values = (0..300).map(|k| (start + k * 10, value(k) + shift));
        (
            values.clone().map(|(t, v)| line("b.old", v, t)).collect(),
            values.map(|(t, v)| (t as u64, v)).collect(),
        )
    };
    let (lines, want) = whole_batch(100.0);
    send_tcp(port, &lines);
    eventually(Duration::from_secs(10), "the batch of whole groups", || {
        redis.history("gauge:10:b.old") == want
    })
    .await;
    // Where another program holds a block's name, the slices it would hold go to the hash
    // instead, and its key is left as it was.
    let theirs = format!("history:gauge:10:b.old:248:{}", (start + 200) / 10 / 248);
    let _: () = conn.del(&theirs).unwrap();
    let _: () = conn.hset(&theirs, "x", "y").unwrap();
    let (lines, want) = whole_batch(200.0);
    send_tcp(port, &lines);
    eventually(
        Duration::from_secs(10),
        "the batch beside another type",
        || redis.history("gauge:10:b.old") == want,
    )
    .await;
    let kept: Vec<String> = redis::cmd("HGETALL").arg(&theirs).query(&mut conn).unwrap();
    assert_eq!(kept, ["x", "y"]);
    let held: BTreeMap<u64, f64> = conn.hgetall("gauge:10:b.old").unwrap();
    assert_eq!(
        held.get(&((start + 200) as u64)),
        Some(&(value(20) + 200.0))
    );
}

/// `storage_aggregation` read again at SIGHUP: slices written from then on aggregate by the
/// edited file (carbon's paths it already has too, which carbon never does), those written
/// before keep theirs, and a file that does not read keeps the running one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_aggregation_file_applies_at_sighup() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("storage-aggregation.conf");
    let method =
        |m: &str| format!("[h]\npattern = ^h\\.\nxFilesFactor = 0\naggregationMethod = {m}\n");
    std::fs::write(&file, method("sum")).unwrap();
    let port = free_port();
    let (agent, _, _) = spawn_agent(
        &redis.url(),
        &[
            // Open intervals' coarser slices rolled up every second.
            "--coarse-write-secs",
            "1",
            "--retentions",
            SCHEMA,
            "--carbon-tcp",
            &format!("127.0.0.1:{port}"),
            "--storage-aggregation",
            &file.display().to_string(),
        ],
    );
    let agent = Killed(agent);
    let now = unix_now() as i64;
    let minute = now - now % 60 - 600;
    let minute_of =
        |m: i64| -> Vec<String> { (1..=3).map(|k| line("h.x", k as f64, m + k * 10)).collect() };
    let mut conn = redis.conn();
    let mut minutes = || -> BTreeMap<i64, String> { conn.hgetall("gauge:60:h.x").unwrap() };

    send_tcp(port, &minute_of(minute));
    eventually(Duration::from_secs(10), "the sum", || {
        minutes().get(&minute).map(String::as_str) == Some("6")
    })
    .await;
    std::fs::write(&file, method("max")).unwrap();
    sighup(&agent.0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    send_tcp(port, &minute_of(minute + 60));
    eventually(Duration::from_secs(10), "the max", || {
        minutes().get(&(minute + 60)).map(String::as_str) == Some("3")
    })
    .await;
    std::fs::write(&file, "[h]\npattern = (\n").unwrap();
    sighup(&agent.0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    send_tcp(port, &minute_of(minute + 120));
    eventually(Duration::from_secs(10), "still the max", || {
        minutes().get(&(minute + 120)).map(String::as_str) == Some("3")
    })
    .await;
    assert_eq!(
        minutes()[&minute],
        "6",
        "a minute written before keeps its sum"
    );
}

/// `storage_schemas` read again at SIGHUP and applied to every series, stored ones included:
/// a longer retention is read from then on, a shorter one trimmed at the cleaner's next pass;
/// a file that does not read keeps the running one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_edited_schemas_file_applies_at_sighup() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("storage-schemas.conf");
    let schema = |r: &str| format!("[s]\npattern = ^s\\.\nretentions = {r}\n");
    std::fs::write(&file, schema("10s:1h,1m:1d")).unwrap();
    let port = free_port();
    let (agent, _, http) = spawn_agent(
        &redis.url(),
        &[
            // Open intervals' coarser slices rolled up every second.
            "--coarse-write-secs",
            "1",
            "--storage-schemas",
            &file.display().to_string(),
            "--carbon-tcp",
            &format!("127.0.0.1:{port}"),
            "--cleaner-interval-secs",
            "1",
        ],
    );
    let agent = Killed(agent);
    let now = unix_now() as i64;
    let until = now as u64;
    // The step of a render of the last `secs`.
    let step = |secs: u64| {
        let p = render(http, "s.x", until - secs, until + 300).unwrap();
        p[1].0 - p[0].0
    };
    let ten = |age: i64| (now - age) - (now - age) % 10;
    // Whether the hash or a block holds the 10 s slice: an old point alone stays in the hash,
    // but the cleaner's full pass moves it once a newer one is there.
    let at_ten =
        |slice: i64| -> Option<f64> { redis.history("gauge:10:s.x").get(&(slice as u64)).copied() };
    // Whether the hash holds it: what a shorter retention trims (a block keeps its expiry).
    let mut conn = redis.conn();
    let mut in_hash = |slice: i64| -> Option<f64> { conn.hget("gauge:10:s.x", slice).unwrap() };

    send_tcp(
        port,
        &[line("s.x", 1.0, ten(1800)), line("s.x", 2.0, ten(5400))],
    );
    eventually(Duration::from_secs(10), "the points", || {
        at_ten(ten(1800)).is_some()
    })
    .await;
    assert_eq!(at_ten(ten(5400)), None, "an hour and a half: the minutes'");
    assert_eq!(step(7200), 60);

    // Longer: two hours is read at 10 s, and a point that old is placed there.
    std::fs::write(&file, schema("10s:3h,1m:1d")).unwrap();
    sighup(&agent.0);
    eventually(Duration::from_secs(10), "two hours at 10 s", || {
        step(7200) == 10
    })
    .await;
    send_tcp(port, &[line("s.x", 3.0, ten(6000))]);
    eventually(
        Duration::from_secs(10),
        "a point 100 minutes old at 10 s",
        || at_ten(ten(6000)).is_some(),
    )
    .await;

    // Shorter: the cleaner trims what the new file no longer keeps.
    std::fs::write(&file, schema("10s:20min,1m:1d")).unwrap();
    sighup(&agent.0);
    eventually(
        Duration::from_secs(30),
        "the 10 s slices past 20 minutes trimmed",
        || in_hash(ten(1800)).is_none() && in_hash(ten(6000)).is_none(),
    )
    .await;
    assert_eq!((step(600), step(7200)), (10, 60));

    // A file that does not read: the running one stays.
    std::fs::write(&file, "[s]\npattern = (\nretentions = 10s:3h\n").unwrap();
    sighup(&agent.0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!((step(600), step(7200)), (10, 60));
}

/// `storage_schemas` of one section, for the paths under `c.`.
fn c_schema(retentions: &str) -> String {
    format!("[c]\npattern = ^c\\.\nretentions = {retentions}\n")
}

/// Sends `c.hits:1|c` to the agent's `udp`, five a datagram every 20 ms for `d`; returns how
/// many.
fn send_counts(udp: u16, d: Duration) -> u64 {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let (until, mut sent) = (std::time::Instant::now() + d, 0);
    while std::time::Instant::now() < until {
        socket
            .send_to("c.hits:1|c\n".repeat(5).as_bytes(), ("127.0.0.1", udp))
            .unwrap();
        sent += 5;
        std::thread::sleep(Duration::from_millis(20));
    }
    sent
}

/// Counts go on until halfway through a group of five seconds (`coarse_write_secs = 5`: two
/// windows' sums held back), then `file` changes from `10s:1h,1m:1d` to `10s:1h,5m:1d,1h:7d`
/// and the agent gets a SIGHUP; returns the counts sent.
fn change_precisions_halfway(agent: &Killed, udp: u16, file: &Path) -> u64 {
    let mut sent = send_counts(udp, Duration::from_secs(6));
    while unix_now() % 5 != 2 {
        sent += send_counts(udp, Duration::from_millis(100));
    }
    sent += send_counts(udp, Duration::from_millis(300));
    std::fs::write(file, c_schema("10s:1h,5m:1d,1h:7d")).unwrap();
    sighup(&agent.0);
    sent
}

/// Each of the `sent` counts once at 10 s (both files keep it), once across 60 s (dropped) and
/// 300 s (added), and at 3600 s as at 300 s.
async fn counted_once_across_the_change(redis: &RedisServer, sent: u64) {
    let sent = sent as f64;
    let total = |p: u64| -> f64 { redis.history(&format!("count:{p}:c.hits")).values().sum() };
    eventually(Duration::from_secs(30), "every count at 10 s", || {
        total(10) == sent && total(60) + total(300) == sent
    })
    .await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(total(10), sent, "counted once at the precision both keep");
    assert_eq!(
        total(60) + total(300),
        sent,
        "once across the dropped and the added"
    );
    assert!(total(60) > 0.0 && total(300) > 0.0);
    assert_eq!(total(3600), total(300));
}

/// A `storage_schemas` file of other precisions applies at SIGHUP too. What
/// `coarse_write_secs` held back is written at the running precisions, and every window from
/// then on at the new ones: a counter sent all along is counted once at the precision both
/// files keep, and once across the one dropped and the one added. A carbon path's points are
/// placed and rolled up at the new precisions, and read there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_schemas_file_of_other_precisions_applies_at_sighup() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("storage-schemas.conf");
    std::fs::write(&file, c_schema("10s:1h,1m:1d")).unwrap();
    let port = free_port();
    let (agent, udp, http) = spawn_agent(
        &redis.url(),
        &[
            // Every precision's sums held back five seconds.
            "--coarse-write-secs",
            "5",
            "--storage-schemas",
            &file.display().to_string(),
            "--carbon-tcp",
            &format!("127.0.0.1:{port}"),
        ],
    );
    let agent = Killed(agent);
    let sent =
        change_precisions_halfway(&agent, udp, &file) + send_counts(udp, Duration::from_secs(3));
    counted_once_across_the_change(&redis, sent).await;
    let known: Vec<String> = redis.conn().zrange("known:", 0, -1).unwrap();
    for member in ["10:c.hits", "60:c.hits", "300:c.hits", "3600:c.hits"] {
        assert!(known.contains(&member.to_string()), "{member}: {known:?}");
    }

    // A carbon path after the change: ten-second points of the last 20 minutes, their whole
    // five minutes made of them, nothing at 60 s; a render of 12 hours reads 300 s.
    let now = unix_now() as i64;
    let lines: Vec<String> = (1..=120)
        .map(|k| line("c.p", k as f64, now - k * 10))
        .collect();
    send_tcp(port, &lines);
    let fives = || redis.history("gauge:300:c.p");
    eventually(Duration::from_secs(10), "the path's five minutes", || {
        fives().len() >= 3
    })
    .await;
    assert!(redis.history("gauge:60:c.p").is_empty());
    let points = render(http, "c.p", now as u64 - 43_200, now as u64).unwrap();
    assert_eq!(points[1].0 - points[0].0, 300);
    for (slice, value) in fives() {
        // The average of its thirty points, k = (now - t) / 10 for each of them.
        let ks: Vec<i64> = (1..=120)
            .filter(|k| (slice as i64..slice as i64 + 300).contains(&(now - k * 10)))
            .collect();
        if ks.len() == 30 {
            let want = ks.iter().sum::<i64>() as f64 / 30.0;
            assert!(
                (value - want).abs() < 1e-9,
                "{slice}: {value} against {want}"
            );
        }
    }
}

/// The same change of precisions with Redis down and the agent killed right after it: the sums
/// held back at the change go out in a spooled window, the new precisions' sums in the state
/// file, and the agent started again (on the new file) writes each count once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_change_of_precisions_through_an_outage_and_a_kill_counts_once() {
    let mut redis = RedisServer::start();
    redis.kill();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("storage-schemas.conf");
    std::fs::write(&file, c_schema("10s:1h,1m:1d")).unwrap();
    let spool = dir.path().join("spool");
    let args = [
        "--coarse-write-secs",
        "5",
        "--storage-schemas",
        &file.display().to_string(),
        "--spool-dir",
        &spool.display().to_string(),
    ];
    let (agent, udp, _) = spawn_agent(&redis.url(), &args);
    let mut agent = Killed(agent);
    let sent =
        change_precisions_halfway(&agent, udp, &file) + send_counts(udp, Duration::from_secs(2));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    agent.kill();
    redis.restart_after(Duration::ZERO, &[]);
    let (again, _, _) = spawn_agent(&redis.url(), &args);
    let _again = Killed(again);
    counted_once_across_the_change(&redis, sent).await;
}

/// Under `graphite_etsy_names` each Graphite name of a StatsD series takes its own section, as
/// carbon gives each of Etsy's files its own: a counter's count, its rate and the agent's own
/// name read by three schemas, and the counter kept as long as the longest of them; a gauge
/// whose names keep 10 s for an hour trimmed to that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etsy_names_take_their_own_schemas() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("storage-schemas.conf");
    std::fs::write(
        &file,
        "[counts]\npattern = ^stats_counts\\.\nretentions = 10s:1d,1m:7d\n\n\
         [stats]\npattern = ^stats\\.\nretentions = 10s:1h,1m:7d\n",
    )
    .unwrap();
    let (agent, udp, http) = spawn_agent(
        &redis.url(),
        &[
            // Open intervals' coarser slices rolled up every second.
            "--coarse-write-secs",
            "1",
            "--storage-schemas",
            &file.display().to_string(),
            "--graphite-etsy-names",
            "true",
            "--cleaner-interval-secs",
            "1",
        ],
    );
    let _agent = Killed(agent);
    let now = unix_now() as i64;
    let until = now as u64;
    let old = (now - 7200 - now % 10) as u64;
    let mut conn = redis.conn();
    let _: () = conn.hset("count:10:app.hits", old, 5).unwrap();
    let _: () = conn.zadd("known:", "10:app.hits", 0).unwrap();
    let _: () = conn.hset("gauge:10:g", old, 5).unwrap();
    let _: () = conn.zadd("known:gauge:", "10:g", 0).unwrap();
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(b"app.hits:1|c\ng:3|g", ("127.0.0.1", udp))
        .unwrap();
    eventually(
        Duration::from_secs(30),
        "the cleaner trimmed the gauge's old slice and moved the counter's into a block",
        || {
            let blocks: Vec<String> = conn.keys("history:count:10:app.hits:*").unwrap();
            let gauge: Option<String> = conn.hget("gauge:10:g", old).unwrap();
            !blocks.is_empty() && gauge.is_none()
        },
    )
    .await;
    let step = |path: &str, secs: u64| {
        let p = render(http, path, until - secs, until + 60).unwrap();
        p[1].0 - p[0].0
    };
    assert_eq!(
        [
            step("stats_counts.app.hits", 7200),
            step("stats.app.hits", 7200),
            step("stats.app.hits", 1800),
            step("app.hits", 1800),
        ],
        [10, 60, 10, 60]
    );
    // The count's two hours at 10 s hold the old slice, read back from its block.
    let counts = render(http, "stats_counts.app.hits", until - 7300, until).unwrap();
    assert!(counts.contains(&(old, Some(5.0))), "{counts:?}");
}

/// Carbon's `whitelist.conf` and `blacklist.conf` (`USE_WHITELIST = True`) given to carbon-cache
/// and to the agent alike: the same paths kept and dropped, the drops counted; an edited
/// whitelist applies at SIGHUP.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn carbons_lists_keep_and_drop_what_carbon_cache_does() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let conf = dir.path().join("conf");
    std::fs::create_dir_all(&conf).unwrap();
    let (white, black) = (conf.join("whitelist.conf"), conf.join("blacklist.conf"));
    std::fs::write(&white, "# what we keep\n^web\\.\n\n  ^db\\.  \n").unwrap();
    std::fs::write(&black, "\\.debug\\.\ntmp$\n").unwrap();
    let carbon = Carbon::start_in(dir, "ENABLE_TAGS = False\nUSE_WHITELIST = True\n");
    let port = free_port();
    let (agent, _, http) = spawn_agent(
        &redis.url(),
        &[
            // Open intervals' coarser slices rolled up every second.
            "--coarse-write-secs",
            "1",
            "--retentions",
            SCHEMA,
            "--carbon-tcp",
            &format!("127.0.0.1:{port}"),
            "--carbon-whitelist",
            &white.display().to_string(),
            "--carbon-blacklist",
            &black.display().to_string(),
        ],
    );
    let agent = Killed(agent);
    let now = unix_now() as i64;
    let paths = [
        "web.a",
        "db.c",
        "web.debug.b",
        "web.tmp",
        "app.d",
        "x.web.e",
    ];
    let mut lines: Vec<String> = paths.iter().map(|p| line(p, 1.0, now - 30)).collect();
    // The lists come before the NaN check, as in carbon's metricReceived.
    lines.push(format!("web.debug.n nan {}\n", now - 30));
    for to in [carbon.tcp, port] {
        send_tcp(to, &lines);
    }
    let (from, until) = (now as u64 - 3600, now as u64);
    eventually(Duration::from_secs(30), "both kept web.a and db.c", || {
        ["web.a", "db.c"]
            .iter()
            .all(|p| carbon.whisper_file(p).exists() && render(http, p, from, until).is_some())
    })
    .await;
    for path in paths {
        assert_eq!(
            render(http, path, from, until).is_some(),
            carbon.whisper_file(path).exists(),
            "{path}"
        );
    }
    let metric = |m: &str| metric_at(format!("127.0.0.1:{http}").parse().unwrap(), m);
    assert_eq!(metric("carbon_points_total{outcome=\"blacklisted\"}"), 3.0);
    assert_eq!(metric("carbon_points_total{outcome=\"not_a_number\"}"), 0.0);
    assert_eq!(
        metric("carbon_points_total{outcome=\"not_whitelisted\"}"),
        2.0
    );

    std::fs::write(&white, "^web\\.\n^db\\.\n^app\\.\n").unwrap();
    sighup(&agent.0);
    tokio::time::sleep(Duration::from_secs(2)).await;
    send_tcp(port, &[line("app.d", 2.0, now - 20)]);
    eventually(
        Duration::from_secs(10),
        "app.d taken after the SIGHUP",
        || render(http, "app.d", from, until).is_some(),
    )
    .await;
}

/// Carbon's pickle receiver beside carbon-cache's: messages as carbon-relay sends them (Python's
/// `pickle.dumps(points, protocol=2)`) and as Dropwizard's `PickledGraphite` writes them
/// (protocol 0, the timestamp a long, the value a string), items carbon skips among good ones;
/// and, to the agent alone (carbon closes the connection there), a message over
/// `carbon_pickle_max_bytes` between two good ones on one connection.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pickles_read_back_as_carbon_cache_keeps_them() {
    let redis = RedisServer::start();
    let carbon = Carbon::start();
    let port = free_port();
    let (agent, _, http) = spawn_agent(
        &redis.url(),
        &[
            // Open intervals' coarser slices rolled up every second.
            "--coarse-write-secs",
            "1",
            "--retentions",
            SCHEMA,
            "--carbon-pickle",
            &format!("127.0.0.1:{port}"),
            "--carbon-pickle-max-bytes",
            "4096",
        ],
    );
    let _agent = Killed(agent);
    let now = unix_now() as i64;
    let minute = now - now % 60 - 120;
    let out = run_ok(
        Command::new("/usr/bin/python3").args([
            "-c",
            "import pickle, struct, sys\n\
             m = int(sys.argv[1])\n\
             def framed(p): return struct.pack('!L', len(p)) + p\n\
             two = [('p.two', (m + k * 10, k * 1.5)) for k in range(6)]\n\
             mixed = [('p.mixed', (m, 1)), ('bad', 1), ('p.mixed', (m + 10, 'x')), ('p.mixed', (m + 20, '2.5')), 7, ('p.mixed', (m + 30, None)), ('p.mixed', (m + 40, 4))]\n\
             refused = [('p.refused', (m, 1)), (b'p.bytes', (m, 1))]\n\
             zero = b''.join(b\"(S'p.zero'\\n(L%dL\\nS'%d.25'\\ntta\" % (m + k * 10, k) for k in range(4))\n\
             sys.stdout.buffer.write(framed(pickle.dumps(two, protocol=2)) + framed(pickle.dumps(mixed, protocol=2)) + framed(b'(l' + zero + b'.') + framed(pickle.dumps(refused, protocol=2)))",
            &minute.to_string(),
        ]),
        "python3",
    );
    let messages = out.stdout;
    for port in [carbon.pickle, port] {
        let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
        s.write_all(&messages).unwrap();
    }
    // Past the limit: skipped, the messages either side kept.
    let big = [&[0, 0, 0x20, 0][..], &[b'x'; 0x2000]].concat();
    let after = run_ok(
        Command::new("/usr/bin/python3").args([
            "-c",
            "import pickle, struct, sys; p = pickle.dumps([('p.after', (int(sys.argv[1]), 9))], protocol=2); sys.stdout.buffer.write(struct.pack('!L', len(p)) + p)",
            &minute.to_string(),
        ]),
        "python3",
    )
    .stdout;
    let mut s = TcpStream::connect(("127.0.0.1", port)).unwrap();
    s.write_all(&[&big[..], &after].concat()).unwrap();
    drop(s);

    let until = now as u64;
    let ranges = [(until - 5 * 3600, until), (until - 6 * 86400, until)];
    let paths = ["p.two", "p.mixed", "p.zero"];
    // Python 3 pickles bytes at protocol 2 as a call of `_codecs.encode`: carbon's unpickler
    // refuses the message whole, and so does the agent.
    let mut last = String::new();
    for _ in 0..40 {
        last.clear();
        for path in paths {
            for &(from, until) in &ranges {
                let (want, got) = (
                    carbon.fetch(path, from, until),
                    render(http, path, from, until),
                );
                if want.is_none() || want != got {
                    let known = |p: Option<Vec<(u64, Option<f64>)>>| {
                        p.map(|p| {
                            p.into_iter()
                                .filter(|(_, v)| v.is_some())
                                .collect::<Vec<_>>()
                        })
                    };
                    last += &format!("{path}: carbon {:?}, agent {:?}\n", known(want), known(got));
                }
            }
        }
        if last.is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    assert!(last.is_empty(), "{last}");
    let later = render(http, "p.after", until - 3600, until).unwrap();
    assert_eq!(
        later.iter().filter_map(|p| p.1).collect::<Vec<_>>(),
        [9.0],
        "the message after the long one"
    );
    let metric = |m: &str| metric_at(format!("127.0.0.1:{http}").parse().unwrap(), m);
    assert_eq!(metric("bad_lines_total{reason=\"pickle_too_large\"}"), 1.0);
    assert!(carbon.fetch("p.refused", until - 3600, until).is_none());
    assert!(render(http, "p.refused", until - 3600, until).is_none());
    assert_eq!(metric("bad_lines_total{reason=\"invalid_pickle\"}"), 1.0);
    // ('bad', 1) and 7 are no pair, 'x' and None no number; and the two messages.
    assert_eq!(metric("bad_lines_total{transport=\"carbon_pickle\"}"), 6.0);
}

/// Tagged paths, normalized as carbon normalizes them (tags sorted as `;k=v` texts, a repeated
/// tag's last value, `name=` the path's), and untagged ones, sent to carbon-cache and the
/// agent: `seriesByTag` renders, the tags API, globbed renders at ranges that pick the ten
/// seconds and the minutes, a function of them and `find` answer alike from graphite-web over
/// carbon's files and tag database and from the agent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tagged_paths_answer_as_graphite_web_over_carbon() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("whisper")).unwrap();
    // graphite-web over carbon's files and tag database (carbon registers each tagged path
    // with its tags API).
    let web = GraphiteWeb::over(&dir.path().join("whisper"));
    let carbon = Carbon::start_in(
        dir,
        &format!(
            "ENABLE_TAGS = True\nTAG_UPDATE_INTERVAL = 1\nTAG_HASH_FILENAMES = True\nGRAPHITE_URL = {}\n",
            web.url
        ),
    );
    let redis = RedisServer::start();
    let port = free_port();
    let (agent, _, http) = spawn_agent(
        &redis.url(),
        &[
            // Open intervals' coarser slices rolled up every second.
            "--coarse-write-secs",
            "1",
            "--retentions",
            SCHEMA,
            "--carbon-tcp",
            &format!("127.0.0.1:{port}"),
        ],
    );
    let _agent = Killed(agent);
    let now = unix_now() as i64;
    let minute = now - now % 60 - 120;
    let mut lines = Vec::new();
    for k in 0..6 {
        let t = minute + k * 10;
        lines.push(line("disk.used;host=a;env=prod", k as f64, t));
        lines.push(line("disk.used;env=prod;host=b", 10.0 + k as f64, t));
        // Repeated: the last; `name=` the path's; `host2` sorts before `host` as `;k=v` texts.
        lines.push(line(
            "disk.used;host=c;env=dev;env=test",
            20.0 + k as f64,
            t,
        ));
        lines.push(line(
            "disk.free;name=other;host=a;host2=x",
            30.0 + k as f64,
            t,
        ));
    }
    // Untagged paths beside them: ten-second points of the last half hour, minutes of seven
    // hours ago.
    for k in 1..=180 {
        lines.push(line("u.plain.a", (k % 17) as f64 / 4.0, now - k * 10));
    }
    for k in 0..30 {
        lines.push(line("u.plain.b", k as f64, minute - 7 * 3600 + k * 60));
    }
    for port in [carbon.tcp, port] {
        send_tcp(port, &lines);
    }
    let agent_url = format!("http://127.0.0.1:{http}/graphite");
    let until = now as u64;
    let requests = [
        format!(
            "/render?target={}&from={}&until={until}&format=json",
            query_encode("seriesByTag('name=disk.used')"),
            until - 3600
        ),
        format!(
            "/render?target={}&from={}&until={until}&format=json",
            query_encode("seriesByTag('env=~p.*','host!=b')"),
            until - 3600
        ),
        format!(
            "/render?target={}&from={}&until={until}&format=json",
            query_encode("sumSeries(seriesByTag('name=~disk.*'))"),
            until - 3600
        ),
        format!(
            "/render?target={}&from={}&until={until}&format=json",
            query_encode("seriesByTag('host2=x')"),
            until - 6 * 86400
        ),
        "/tags/findSeries?expr=env%3Dprod".to_string(),
        "/tags/findSeries?expr=name%3D~disk.*".to_string(),
        "/tags/autoComplete/tags".to_string(),
        "/tags/autoComplete/values?tag=env".to_string(),
        format!(
            "/render?target=u.plain.*&from={}&until={until}&format=json",
            until - 3600
        ),
        format!(
            "/render?target=u.plain.*&from={}&until={until}&format=json",
            until - 6 * 86400
        ),
        format!(
            "/render?target={}&from={}&until={until}&format=json",
            query_encode("summarize(u.plain.a,'5min','max')"),
            until - 3600
        ),
        "/metrics/find?query=u.*".to_string(),
        "/metrics/find?query=u.plain.*".to_string(),
    ];
    // What differs between graphite-web's answers and an agent's, retried while carbon writes.
    let compare = |agent_url: String| {
        let (web, requests) = (&web, &requests);
        async move {
            let mut last = Vec::new();
            for _ in 0..60 {
                last.clear();
                for request in requests {
                    let (want, got) = (
                        curl_json(&format!("{}{request}", web.url)),
                        curl_json(&format!("{agent_url}{request}")),
                    );
                    let empty = want.as_array().is_some_and(Vec::is_empty);
                    if empty {
                        last.push(format!("{request}: graphite-web has nothing yet"));
                    }
                    differences(&want, &got, request, &mut last);
                }
                if last.is_empty() {
                    break;
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
            last
        }
    };
    let last = compare(agent_url).await;
    assert!(last.is_empty(), "{}", last.join("\n"));

    // The same files imported into another Redis: the tagged ones, named by their hash, from
    // the paths graphite-web lists (a file that lists none of them is named as skipped).
    let listed = carbon.dir.path().join("tagged.json");
    let names = curl_json(&format!("{}/tags/findSeries?expr=name%3D~.", web.url));
    let tagged = names
        .as_array()
        .into_iter()
        .flatten()
        .filter(|n| n.as_str().is_some_and(|n| n.contains(';')))
        .count();
    assert_eq!(tagged, 4, "{names}");
    std::fs::write(&listed, names.to_string()).unwrap();
    let imported = RedisServer::start();
    let whisper = carbon.dir.path().join("whisper");
    let import = |names: &Path| {
        run_ok(
            bin()
                .args(["import", "whisper"])
                .arg(&whisper)
                .arg("--tagged-names")
                .arg(names)
                .args(["--redis", &imported.url(), "--retentions", SCHEMA])
                // The minute of `until` too, though it may not have ended yet when the import
                // runs (by default a slice that ends after now is left to the agent).
                .args(["--until", &(until + 3600).to_string()]),
            "statsd-redis import whisper",
        )
    };
    let unlisted = carbon.dir.path().join("none.txt");
    std::fs::write(&unlisted, "other.path;a=b\n").unwrap();
    let out = import(&unlisted);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("skipped 4"), "{said}");
    let out = import(&listed);
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("skipped 0"), "{said}");
    let (reader, _, http) = spawn_agent(&imported.url(), &["--retentions", SCHEMA]);
    let _reader = Killed(reader);
    let last = compare(format!("http://127.0.0.1:{http}/graphite")).await;
    assert!(last.is_empty(), "imported: {}", last.join("\n"));
}

/// A chunk spooled by a build before the agent planned points holds its points section in the
/// older layout (each point's archive, slice and value): the script refuses each of its series
/// by name, as a write Redis refused (counted and logged by the agent), instead of reading it as
/// a plan; a planned section after it is applied.
#[test]
fn a_points_section_of_an_earlier_release_is_refused_not_misread() {
    let redis = RedisServer::start();
    let script = redis::Script::new(concat!(
        include_str!("../src/store/retention.lua"),
        include_str!("../src/store/hourly.lua"),
        include_str!("../src/store/numbers.lua"),
        include_str!("../src/store/points.lua"),
        include_str!("../src/store/flush.lua")
    ));
    let now = unix_now();
    let slice = now - now % 10;
    let archives = ["2", "10", "21600", "248", "60", "604800", "2008"];
    let mut call = script.prepare_invoke();
    // The agent's time, prefix, retention, hour, asctime, log lifetime; no precisions; the
    // quantiles' accuracy, most buckets, no slice precisions; no counters, statistics, gauges,
    // sets or logs.
    call.arg(now)
        .arg("")
        .arg("10:2160,60:10080")
        .arg("2026-11-29T06:00:00")
        .arg("Sun Nov 29 06:00:00 2026")
        .arg(0)
        .arg(0)
        .arg(0.01)
        .arg(100)
        .arg(&["0"; 6]);
    // The earlier layout: two series, one point each.
    call.arg(2).arg(&archives);
    for (path, value) in [("old.a", 2.5), ("old.b", 3.5)] {
        call.arg(path).arg("average").arg(0.5).arg(1);
        call.arg(1).arg(slice).arg(value);
    }
    // This build's: one chain, a point into the first archive, its minute left pending.
    call.arg("plan").arg(1).arg(&archives);
    call.arg("new.a").arg("average").arg(0.5).arg(14);
    call.arg(1).arg(1).arg(1).arg(slice).arg(4.5).arg(0).arg(0);
    call.arg(1).arg(&["0"; 4]).arg(1).arg(now - now % 60);
    let refused: Vec<String> = call.invoke(&mut redis.conn()).unwrap();
    assert_eq!(refused.len(), 4, "{refused:?}");
    assert_eq!(
        (&refused[0][..], &refused[2][..]),
        ("gauge:old.a", "gauge:old.b")
    );
    assert!(refused[1].contains("earlier release"), "{}", refused[1]);
    let mut conn = redis.conn();
    let keys: Vec<String> = conn.keys("*old*").unwrap();
    assert!(keys.is_empty(), "{keys:?}");
    let new: BTreeMap<u64, f64> = conn.hgetall("gauge:10:new.a").unwrap();
    assert_eq!(new, BTreeMap::from([(slice, 4.5)]));
    assert_eq!(conn.zcard::<_, usize>("pending:gauge:").unwrap(), 1);
}

/// Batches past the scripts' own limits (Lua's `unpack` takes about 8 000 values): a week of
/// every other minute of one path (5 000 points, each group of eight slots written in part)
/// and half a day of ten-second points under a one-day archive made of them (the day, asked
/// of the script, reads 8 640 finer slices) are written whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_past_luas_limits_are_written_whole() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let schemas = dir.path().join("storage-schemas.conf");
    std::fs::write(
        &schemas,
        "[sparse]\npattern = ^wide\\.sparse$\nretentions = 10s:2d,1m:14d\n\
         [dense]\npattern = ^wide\\.dense$\nretentions = 10s:2d,1d:60d\n",
    )
    .unwrap();
    let port = free_port();
    let (agent, _, _) = spawn_agent(
        &redis.url(),
        &[
            "--storage-schemas",
            schemas.to_str().unwrap(),
            "--carbon-tcp",
            &format!("127.0.0.1:{port}"),
        ],
    );
    let _agent = Killed(agent);
    let now = unix_now() as i64;
    let minute = now - now % 60;
    let at = |k: i64| minute - 3 * 86_400 - 2 * 60 * k;
    let sparse: Vec<String> = (0..5000)
        .map(|k| line("wide.sparse", k as f64, at(k)))
        .collect();
    send_tcp(port, &sparse);
    let day = now - now % 86_400 - 86_400;
    let dense: Vec<String> = (0..4320)
        .map(|k| line("wide.dense", 2.0, day + 10 * k))
        .collect();
    send_tcp(port, &dense);
    let done = || {
        redis.history("gauge:60:wide.sparse").len() == 5000
            && redis.history("gauge:86400:wide.dense") == BTreeMap::from([(day as u64, 2.0)])
    };
    for _ in 0..100 {
        if done() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let held = redis.history("gauge:60:wide.sparse");
    assert_eq!(held.len(), 5000, "the sparse week");
    assert_eq!(
        redis.history("gauge:86400:wide.dense"),
        BTreeMap::from([(day as u64, 2.0)]),
        "the dense day: {} ten-second points",
        redis.history("gauge:10:wide.dense").len()
    );
    assert_eq!(held.get(&(at(0) as u64)), Some(&0.0));
    assert_eq!(held.get(&(at(4999) as u64)), Some(&4999.0));
}
