//! Least privilege in Redis: the agent's whole cycle run as a Redis user holding exactly the
//! ACL docs/operations.md gives (read from the page, so the page and the test cannot part):
//! every metric type, events and service checks, coarse and quantile writes, the cleaner, the
//! Graphite API with Etsy's names, the CLI, and `import whisper` into a new hash and into one the
//! agent wrote. Redis's `ACL LOG` must stay empty and every count come back exact; a user short
//! of one command gets an error that names the command.

mod common;

use std::net::UdpSocket;
use std::time::{Duration, Instant};

use common::*;

/// The `ACL SETUSER <user>` line docs/operations.md gives (the agent's, `statsd-redis`, the
/// reader's, `statsd-reader`, or the sentinels' user, `statsd-sentinel`).
fn documented_acl(user: &str) -> String {
    let page = include_str!("../docs/operations.md");
    let lines: Vec<&str> = page
        .lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with(&format!("ACL SETUSER {user} ")))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "docs/operations.md gives one line for {user}"
    );
    lines[0].to_string()
}

/// Runs an `ACL SETUSER` line as the server's default user, with `key_prefix` "" (`~*`, `%R~*`)
/// and a password for its placeholder.
fn set_user(redis: &RedisServer, line: &str) {
    let line = line
        .replace(">PASSWORD", ">secret")
        .replace("~PREFIX*", "~*");
    let words: Vec<&str> = line.split_whitespace().collect();
    redis::cmd(words[0])
        .arg(&words[1..])
        .query::<()>(&mut redis.conn())
        .unwrap_or_else(|e| panic!("{line}: {e}"));
}

fn acl_log(redis: &RedisServer) -> Vec<redis::Value> {
    redis::cmd("ACL")
        .arg("LOG")
        .query(&mut redis.conn())
        .unwrap()
}

fn as_user(redis: &RedisServer, user: &str) -> String {
    format!("{}?user={user}&pass=secret", redis.url())
}

/// `statsd-redis get …` as the ACL user, its JSON.
fn get(url: &str, args: &[&str]) -> serde_json::Value {
    let out = run_ok(
        bin().arg("get").args(args).args(["--json", "--redis", url]),
        "statsd-redis get",
    );
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{args:?}: {e}: {}", String::from_utf8_lossy(&out.stdout)))
}

/// A whisper file of one counter (10 s points for an hour, then minutes) under `root`, at
/// `rel`, with a point of 3 every 10 s for the half hour before `end`.
fn write_whisper(root: &std::path::Path, rel: &str, end: u64) {
    let script = r#"
import os, sys, whisper
path, end = sys.argv[1], int(sys.argv[2])
os.makedirs(os.path.dirname(path), exist_ok=True)
whisper.create(path, [(10, 360), (60, 1440)], xFilesFactor=0, aggregationMethod='sum')
whisper.update_many(path, [(t, 3) for t in range(end - 1800, end, 10)], now=end)
"#;
    let path = root.join(rel);
    with_python_whisper(script, &[path.to_str().unwrap(), &end.to_string()]);
}

#[test]
fn the_whole_cycle_runs_as_the_documented_acl_user() {
    let redis = RedisServer::start();
    set_user(&redis, &documented_acl("statsd-redis"));
    let url = as_user(&redis, "statsd-redis");
    let carbon = free_port();
    let carbon_addr = format!("127.0.0.1:{carbon}");
    let (agent, udp, http) = spawn_agent(
        &url,
        &[
            "--carbon-tcp",
            &carbon_addr,
            "--coarse-write-secs",
            "5",
            "--quantile-write-secs",
            "5",
            "--cleaner-interval-secs",
            "1",
            "--graphite-etsy-names",
            "true",
        ],
    );
    let mut agent = Killed(agent);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let send = |text: &str| {
        socket.send_to(text.as_bytes(), ("127.0.0.1", udp)).unwrap();
    };
    for _ in 0..10 {
        send("acl.c:1|c\nacl.c:9|c|@0.5");
    }
    send("acl.g:5|g\nacl.g:+3|g\nacl.s:a|s\nacl.s:b|s\nacl.s:a|s");
    send("acl.t:10|ms\nacl.t:30|ms\nacl.h:4|h\nacl.d:2|d\nacl.tagged:1|c|#env:prod");
    send("_e{9,5}:acl.event|hello\n_sc|acl.check|1|m:late");
    // Carbon's points: a five-second slice made of them (at once, or by a rollup run).
    let now = unix_now();
    let five = now - now % 5;
    let lines: String = (0..5)
        .map(|k| format!("acl.carbon {k} {}\n", five + k))
        .collect();
    std::net::TcpStream::connect(&carbon_addr)
        .and_then(|mut s| std::io::Write::write_all(&mut s, lines.as_bytes()))
        .unwrap();

    // The counter's total at the finest precision, written every window.
    let wanted = 10 * (1 + 18);
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis.counter_total(1, "acl.c") != wanted {
        assert!(Instant::now() < deadline, "{:?}", acl_log(&redis));
        std::thread::sleep(Duration::from_millis(100));
    }
    // The Graphite API, as Grafana asks it, under Etsy's name and the agent's own.
    let base = format!("http://127.0.0.1:{http}/graphite");
    let render = |target: &str| {
        let answer = curl_json(&format!(
            "{base}/render?target={target}&from=-5min&format=json"
        ));
        answer[0]["datapoints"].as_array().map_or(0.0, |points| {
            points.iter().filter_map(|p| p[0].as_f64()).sum()
        })
    };
    // With coarse writes a new series is indexed with its group's write, a few seconds on.
    let deadline = Instant::now() + Duration::from_secs(15);
    for target in ["stats_counts.acl.c", "acl.c", "ac%3F.c", "acl.%7Bc,x%7D"] {
        while render(target) != wanted as f64 {
            assert!(Instant::now() < deadline, "{target}: {}", render(target));
            std::thread::sleep(Duration::from_millis(200));
        }
    }
    let found = curl_json(&format!("{base}/metrics/find?query=acl.*"));
    assert!(found.to_string().contains("\"acl.c\""), "{found}");

    // SIGTERM writes every sum still held (coarse and quantile), then the cleaner's and the
    // readers' work is done as the same user.
    let (code, log, _) = agent.terminate();
    assert_eq!(code, Some(0), "{log}");
    let made: Option<f64> =
        redis::Commands::hget(&mut redis.conn(), "gauge:5:acl.carbon", five).unwrap();
    assert_eq!(made, Some(2.0), "{:?}", acl_log(&redis));
    for precision in [5, 60, 300, 3600, 18_000, 86_400] {
        assert_eq!(
            redis.counter_total(precision, "acl.c"),
            wanted,
            "{precision}"
        );
    }
    let counter = get(&url, &["counter", "acl.c", "--precision", "86400"]);
    let total: i64 = counter
        .as_array()
        .unwrap_or_else(|| panic!("{counter}"))
        .iter()
        .map(|s| s[1].as_i64().unwrap())
        .sum();
    assert_eq!(total, wanted);
    let gauge = get(&url, &["gauge", "acl.g"]);
    assert_eq!(gauge.as_f64(), Some(8.0), "{gauge}");
    let stats = get(&url, &["stats", "acl.t"]);
    assert_eq!(stats["count"].as_f64(), Some(2.0), "{stats}");
    assert_eq!(stats["sum"].as_f64(), Some(40.0), "{stats}");
    let percentiles = get(&url, &["percentiles", "acl.h", "--type", "Histogram"]);
    assert_eq!(percentiles["count"].as_f64(), Some(1.0), "{percentiles}");
    let distribution = get(&url, &["percentiles", "acl.d", "--type", "Distribution"]);
    assert_eq!(distribution["count"].as_f64(), Some(1.0), "{distribution}");
    let set = get(&url, &["set", "acl.s"]);
    assert_eq!(set[0][1].as_i64(), Some(2), "{set}");
    let events = get(&url, &["log", "events"]);
    assert!(events.to_string().contains("hello"), "{events}");
    let check = get(&url, &["log", "acl.check", "--severity", "warning"]);
    assert!(check.to_string().contains("late"), "{check}");
    let known = get(&url, &["known"]);
    assert!(known.to_string().contains("acl.tagged;env=prod"), "{known}");
    assert_eq!(get(&url, &["slowest"])[0][0].as_str(), Some("acl.t"));

    // import whisper: a new name (a hash made whole) and the agent's own (slices added).
    let files = tempfile::tempdir().unwrap();
    // Whole minutes an hour back: within the minutes' two hours, before anything the agent wrote.
    let end = unix_now() / 60 * 60 - 3600;
    write_whisper(files.path(), "stats_counts/acl/imported.wsp", end);
    write_whisper(files.path(), "stats_counts/acl/c.wsp", end);
    let out = run_ok(
        bin()
            .args(["import", "whisper"])
            .arg(files.path())
            .args(["--redis", &url]),
        "statsd-redis import whisper",
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("imported 2 files"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert_eq!(redis.counter_total(60, "acl.imported"), 180 * 3);
    assert_eq!(redis.counter_total(60, "acl.c"), wanted + 180 * 3);
    assert_eq!(acl_log(&redis), Vec::<redis::Value>::new());

    // The reader's ACL: the CLI, and an agent that serves the APIs over what others wrote
    // (no traffic, no cleaner), read everything back and write nothing.
    set_user(&redis, &documented_acl("statsd-reader"));
    let reader = as_user(&redis, "statsd-reader");
    let before = redis.snapshot();
    let counter = get(&reader, &["counter", "acl.c", "--precision", "60"]);
    let total: i64 = counter
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s[1].as_i64().unwrap())
        .sum();
    assert_eq!(total, wanted + 180 * 3);
    for args in [
        &["stats", "acl.t"][..],
        &["percentiles", "acl.h", "--type", "Histogram"],
        &["gauge", "acl.g"],
        &["set", "acl.s"],
        &["log", "events"],
        &["known"],
        &["slowest"],
    ] {
        get(&reader, args);
    }
    let (agent, _, http) = spawn_agent(
        &reader,
        &[
            "--cleaner-enabled",
            "false",
            "--graphite-etsy-names",
            "true",
        ],
    );
    let mut agent = Killed(agent);
    let base = format!("http://127.0.0.1:{http}");
    // By name, and by a glob (its series looked up, then kept while the indexes' sizes hold).
    for target in ["stats_counts.acl.c", "stats_counts.ac%3F.c"] {
        let answer = curl_json(&format!(
            "{base}/graphite/render?target={target}&from=-2h&format=json"
        ));
        let points = answer[0]["datapoints"]
            .as_array()
            .unwrap_or_else(|| panic!("{target}: {answer}"));
        let sum: f64 = points.iter().filter_map(|p| p[0].as_f64()).sum();
        assert_eq!(sum, (wanted + 180 * 3) as f64, "{target}");
    }
    let found = curl_json(&format!("{base}/graphite/metrics/find?query=acl.*"));
    assert!(found.to_string().contains("acl.imported"), "{found}");
    std::thread::sleep(Duration::from_secs(2));
    let (code, log, _) = agent.terminate();
    assert_eq!(code, Some(0), "{log}");
    assert!(redis.snapshot() == before, "the reader wrote nothing");
    assert_eq!(acl_log(&redis), Vec::<redis::Value>::new());
}

/// A user without one command the scripts call: the agent's log names the command and the ACL.
#[test]
fn a_refused_command_is_named() {
    let redis = RedisServer::start();
    set_user(
        &redis,
        &documented_acl("statsd-redis").replace(" +hincrby", ""),
    );
    let url = as_user(&redis, "statsd-redis");
    let (agent, udp, http) = spawn_agent(&url, &[]);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    // Sent until a refusal is counted: a fixed wait was too short on a loaded machine.
    let deadline = Instant::now() + Duration::from_secs(20);
    while metric_at(
        ([127, 0, 0, 1], http).into(),
        r#"write_failures_total{reason="no_permission"}"#,
    ) == 0.0
    {
        assert!(Instant::now() < deadline, "no refusal counted in 20 s");
        socket.send_to(b"acl.c:1|c", ("127.0.0.1", udp)).unwrap();
        std::thread::sleep(Duration::from_millis(500));
    }
    let (_, log, _) = terminate(agent);
    let line = log
        .lines()
        .find(|l| l.contains("'hincrby'"))
        .unwrap_or_else(|| panic!("{log}"));
    assert!(line.contains("reason=\"no_permission\""), "{line}");
    assert!(line.contains("A Redis user of least privilege"), "{line}");
}

/// Without `+info` and `+config|get` (a site that keeps `CONFIG GET requirepass` from the
/// agent), the agent still writes every count; the checks they serve are unknowns.
#[test]
fn without_info_and_config_get_the_agent_still_writes() {
    let redis = RedisServer::start();
    let line = documented_acl("statsd-redis")
        .replace(" +info", "")
        .replace(" +config|get", "");
    set_user(&redis, &line);
    let (agent, udp, _) = spawn_agent(
        &as_user(&redis, "statsd-redis"),
        &["--retentions", "1s:10m,1m:1d"],
    );
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..5 {
        socket.send_to(b"acl.c:2|c", ("127.0.0.1", udp)).unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis.counter_total(1, "acl.c") != 10 {
        assert!(Instant::now() < deadline, "{:?}", acl_log(&redis));
        std::thread::sleep(Duration::from_millis(100));
    }
    let (code, log, _) = terminate(agent);
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(redis.counter_total(60, "acl.c"), 10);
    assert!(
        log.contains("Redis refused CONFIG GET hash-max-listpack-entries"),
        "{log}"
    );
}

/// In a cluster, each node holding the agent's user with the documented line and what the
/// page says a cluster adds (`+cluster|slots +asking`): counters written exactly, the cleaner
/// run in every slot, and no node's `ACL LOG` holds a refusal.
#[test]
fn in_a_cluster_the_documented_additions_suffice() {
    let cluster = common::topology::Cluster::start();
    let line = format!("{} +cluster|slots +asking", documented_acl("statsd-redis"))
        .replace(">PASSWORD", ">secret")
        .replace("~PREFIX*", "~*");
    let words: Vec<&str> = line.split_whitespace().collect();
    let ports = cluster.live();
    for &port in &ports {
        redis::cmd(words[0])
            .arg(&words[1..])
            .query::<()>(&mut cluster.conn(port))
            .unwrap_or_else(|e| panic!("{line}: {e}"));
    }
    let seeds: Vec<String> = ports
        .iter()
        .map(|p| format!("redis://statsd-redis:secret@127.0.0.1:{p}"))
        .collect();
    let (agent, udp, _) = spawn_agent(
        &seeds[0],
        &[
            "--redis-mode",
            "cluster",
            "--redis-cluster-nodes",
            &seeds.join(","),
            "--cleaner-interval-secs",
            "1",
        ],
    );
    let agent = Killed(agent);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..20 {
        socket
            .send_to(
                format!("acl.{i}:3|c\nacl.t:{i}|ms").as_bytes(),
                ("127.0.0.1", udp),
            )
            .unwrap();
    }
    let total = |series: &str| -> i64 {
        cluster
            .hgetall(&format!("count:60:{series}"))
            .iter()
            .map(|(_, n)| n.parse::<i64>().unwrap())
            .sum()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    while (0..20).any(|i| total(&format!("acl.{i}")) != 3) {
        assert!(Instant::now() < deadline, "not written");
        std::thread::sleep(Duration::from_millis(200));
    }
    // Two of the cleaner's passes (every slot) at least.
    std::thread::sleep(Duration::from_secs(3));
    drop(agent);
    for &port in &ports {
        let log: Vec<redis::Value> = redis::cmd("ACL")
            .arg("LOG")
            .query(&mut cluster.conn(port))
            .unwrap();
        assert_eq!(log, Vec::<redis::Value>::new(), "node {port}");
    }
}

/// Under Sentinel, the data nodes holding the agent's line plus `+role`, and the sentinels a
/// user with `+sentinel|masters +sentinel|slaves +ping` (as the page says): every count
/// written, and neither a node's nor a sentinel's `ACL LOG` holds a refusal.
#[test]
fn under_sentinel_the_documented_additions_suffice() {
    let sentinels = common::topology::Sentinels::start();
    let run = |port: u16, line: &str| {
        let words: Vec<&str> = line.split_whitespace().collect();
        redis::cmd(words[0])
            .arg(&words[1..])
            .query::<()>(&mut sentinels.conn(port))
            .unwrap_or_else(|e| panic!("{port}: {line}: {e}"));
    };
    let agent_line = format!("{} +role", documented_acl("statsd-redis"))
        .replace(">PASSWORD", ">secret")
        .replace("~PREFIX*", "~*");
    for port in sentinels.server_ports() {
        run(port, &agent_line);
    }
    let sentinel_line = documented_acl("statsd-sentinel").replace(">PASSWORD", ">secret");
    for port in sentinels.sentinel_ports() {
        run(port, &sentinel_line);
    }
    let addrs: Vec<String> = sentinels
        .sentinel_ports()
        .iter()
        .map(|p| format!("redis://statsd-sentinel:secret@127.0.0.1:{p}"))
        .collect();
    let (agent, udp, _) = spawn_agent(
        "redis://statsd-redis:secret@127.0.0.1:1/0",
        &[
            "--redis-mode",
            "sentinel",
            "--redis-sentinels",
            &addrs.join(","),
            "--redis-master-name",
            sentinels.master_name(),
        ],
    );
    let agent = Killed(agent);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .send_to(b"acl.c:3|c\nacl.t:5|ms", ("127.0.0.1", udp))
        .unwrap();
    let total = || -> i64 {
        let raw: Vec<(String, String)> = redis::cmd("HGETALL")
            .arg("count:60:acl.c")
            .query(&mut sentinels.conn(sentinels.master_port()))
            .unwrap();
        raw.iter().map(|(_, n)| n.parse::<i64>().unwrap()).sum()
    };
    let deadline = Instant::now() + Duration::from_secs(15);
    let logs = || -> Vec<(u16, Vec<redis::Value>)> {
        sentinels
            .server_ports()
            .into_iter()
            .chain(sentinels.sentinel_ports())
            .map(|port| {
                let log = redis::cmd("ACL")
                    .arg("LOG")
                    .query(&mut sentinels.conn(port))
                    .unwrap();
                (port, log)
            })
            .collect()
    };
    while total() != 3 {
        assert!(Instant::now() < deadline, "not written: {:?}", logs());
        std::thread::sleep(Duration::from_millis(200));
    }
    drop(agent);
    for (port, log) in logs() {
        assert_eq!(log, Vec::<redis::Value>::new(), "{port}");
    }
}

/// A long archive under the documented lines: the agent's cleaner moves old minutes into blocks
/// (`BITFIELD`, `SETBIT`, `SETRANGE`, `EXPIRE`; a set's: `PFCOUNT`, `DEL`; a quantile slice's:
/// `HSETNX`, `HGETALL`, `SET`, `EXPIREAT`), `import whisper` writes blocks whole and then
/// slot by slot over them, and the agent and the reader read them back (`GETRANGE`); `ACL LOG`
/// stays empty and the reader writes nothing.
#[test]
fn a_long_archive_moves_and_reads_back_as_the_documented_users() {
    let redis = RedisServer::start();
    set_user(&redis, &documented_acl("statsd-redis"));
    let url = as_user(&redis, "statsd-redis");
    let schema = ["--retentions", "1s:1h,1m:90d"];
    let flags = [schema[0], schema[1], "--coarse-write-secs", "0"];
    let (agent, udp, _) = spawn_agent(&url, &flags);
    let mut agent = Killed(agent);
    let now = unix_now();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let lines: Vec<String> = (3..=32u64)
        .flat_map(|h| {
            let at = now - h * 3600;
            [
                format!("acl.long:{h}|c|T{at}"),
                format!("acl.lg:{h}|g|T{at}"),
            ]
        })
        .collect();
    socket
        .send_to(lines.join("\n").as_bytes(), ("127.0.0.1", udp))
        .unwrap();
    let wanted: u64 = (3..=32).sum();
    let deadline = Instant::now() + Duration::from_secs(10);
    while redis.get_counter("count:60:acl.long").len() != 30 {
        assert!(
            Instant::now() < deadline,
            "not written: {:?}",
            acl_log(&redis)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    // A set's minutes as the agent writes them (a HyperLogLog each): h members, h hours back.
    for h in 3..=32u64 {
        let members: Vec<String> = (0..h).map(|m| format!("m{m}")).collect();
        let key = format!("set:60:acl.s:{}", (now - h * 3600) / 60 * 60);
        let _: u64 = redis::cmd("PFADD")
            .arg(key)
            .arg(members)
            .query(&mut redis.conn())
            .unwrap();
    }
    // A timer's minutes as the agent writes their quantile buckets (a hash each): a value of
    // bucket 345, h times, h hours back.
    for h in 3..=32u64 {
        let key = format!("hist:60:acl.t:AccessTime:{}", (now - h * 3600) / 60 * 60);
        let _: () = redis::cmd("HSET")
            .arg(key)
            .arg("a")
            .arg("0.01")
            .arg("345")
            .arg(h)
            .query(&mut redis.conn())
            .unwrap();
    }
    // A start's first pass visits every precision (later ones, a minute's once a minute) and
    // walks the sets and the quantile slices.
    let (code, log, _) = agent.terminate();
    assert_eq!(code, Some(0), "{log}");
    let (agent, _, http) = spawn_agent(&url, &flags);
    let mut agent = Killed(agent);
    let deadline = Instant::now() + Duration::from_secs(10);
    let left = |pattern: &str| {
        redis::cmd("KEYS")
            .arg(pattern)
            .query::<Vec<String>>(&mut redis.conn())
            .unwrap()
            .len()
    };
    while redis.get_counter("count:60:acl.long").len() > 1
        || redis.history("count:60:acl.long").values().sum::<f64>() != wanted as f64
        || redis.history("gauge:60:acl.lg").len() != 30
        || left("set:60:acl.s:*") > 0
        || left("hist:60:acl.t:*") > 0
    {
        assert!(
            Instant::now() < deadline,
            "not moved: {:?}",
            acl_log(&redis)
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    // The timer's values counted from its packed minutes (the JSON API's quantiles).
    let timed = |http: u16| -> f64 {
        let answer = curl_json(&format!(
            "http://127.0.0.1:{http}/api/v1/percentiles/acl.t?last=2d&precision=60"
        ));
        answer["count"]
            .as_f64()
            .unwrap_or_else(|| panic!("{answer}"))
    };
    let render = |http: u16, target: &str| -> f64 {
        let answer = curl_json(&format!(
            "http://127.0.0.1:{http}/graphite/render?target={target}&from=-2d&format=json"
        ));
        answer[0]["datapoints"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"))
            .iter()
            .filter_map(|p| p[0].as_f64())
            .sum()
    };
    // The JSON API's counter: its hash and blocks in one transaction.
    let counted = |http: u16| -> f64 {
        let answer = curl_json(&format!(
            "http://127.0.0.1:{http}/api/v1/counter/acl.long?precision=60"
        ));
        answer["samples"]
            .as_array()
            .unwrap_or_else(|| panic!("{answer}"))
            .iter()
            .filter_map(|s| s[1].as_f64())
            .sum()
    };
    assert_eq!(render(http, "acl.long"), wanted as f64);
    assert_eq!(render(http, "acl.lg"), wanted as f64);
    assert_eq!(render(http, "acl.s"), wanted as f64);
    assert_eq!(timed(http), wanted as f64);
    assert_eq!(counted(http), wanted as f64);
    let (code, log, _) = agent.terminate();
    assert_eq!(code, Some(0), "{log}");

    // Minutes three hours back: older than the hash keeps, so into blocks; twice.
    let files = tempfile::tempdir().unwrap();
    write_whisper(
        files.path(),
        "stats_counts/acl/old.wsp",
        now / 60 * 60 - 3 * 3600,
    );
    for _ in 0..2 {
        run_ok(
            bin()
                .args(["import", "whisper"])
                .arg(files.path())
                .args(["--redis", &url])
                .args(schema),
            "statsd-redis import whisper",
        );
    }
    // The hash keeps the newest minute, as the cleaner leaves it.
    assert_eq!(redis.get_counter("count:60:acl.old").len(), 1);
    assert_eq!(
        redis.history("count:60:acl.old").values().sum::<f64>(),
        180.0 * 3.0
    );
    assert_eq!(acl_log(&redis), Vec::<redis::Value>::new());

    set_user(&redis, &documented_acl("statsd-reader"));
    let before = redis.snapshot();
    let reader = as_user(&redis, "statsd-reader");
    let (agent, _, http) = spawn_agent(
        &reader,
        &[schema[0], schema[1], "--cleaner-enabled", "false"],
    );
    let mut agent = Killed(agent);
    assert_eq!(render(http, "acl.long"), wanted as f64);
    assert_eq!(render(http, "acl.old"), 180.0 * 3.0);
    assert_eq!(render(http, "acl.s"), wanted as f64);
    assert_eq!(timed(http), wanted as f64);
    assert_eq!(counted(http), wanted as f64);
    let (code, log, _) = agent.terminate();
    assert_eq!(code, Some(0), "{log}");
    assert!(redis.snapshot() == before, "the reader wrote nothing");
    assert_eq!(acl_log(&redis), Vec::<redis::Value>::new());

    // A reader made by an earlier release's line, without MULTI: its reads go apart, as they
    // did, with a warning, and its connection stays (the redis crate's own transaction, refused
    // MULTI, lost it: "broken pipe" to the next read).
    let earlier = documented_acl("statsd-reader").replace(" +multi +exec", "");
    set_user(&redis, &earlier);
    let (agent, _, http) = spawn_agent(
        &reader,
        &[schema[0], schema[1], "--cleaner-enabled", "false"],
    );
    let mut agent = Killed(agent);
    assert_eq!(render(http, "acl.long"), wanted as f64);
    assert_eq!(counted(http), wanted as f64);
    assert_eq!(counted(http), wanted as f64);
    // The CLI's counter, read the same way.
    let counter = get(
        &reader,
        &[
            "counter",
            "acl.long",
            "--precision",
            "60",
            schema[0],
            schema[1],
        ],
    );
    let samples = counter.as_array().unwrap_or_else(|| panic!("{counter}"));
    let total: f64 = samples.iter().filter_map(|s| s[1].as_f64()).sum();
    assert_eq!(total, wanted as f64);
    let (code, log, _) = agent.terminate();
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(log.matches("Redis refused MULTI").count(), 2, "{log}");
    assert!(redis.snapshot() == before, "the reader wrote nothing");

    // A reader refused a command of the transaction's: the answer names that command, not
    // only EXEC's abort.
    set_user(
        &redis,
        &documented_acl("statsd-reader").replace(" +getrange", " -getrange"),
    );
    let (agent, _, http) = spawn_agent(
        &reader,
        &[schema[0], schema[1], "--cleaner-enabled", "false"],
    );
    let mut agent = Killed(agent);
    let answer = curl_json(&format!(
        "http://127.0.0.1:{http}/api/v1/counter/acl.long?precision=60"
    ));
    let error = answer["error"].as_str().unwrap_or_default();
    assert!(error.contains("'getrange'"), "{answer}");
    let (code, log, _) = agent.terminate();
    assert_eq!(code, Some(0), "{log}");
}
