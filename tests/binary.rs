//! The `statsd-redis` binary as an operator runs it: configuration errors, precedence, and a
//! SIGTERM that loses nothing.

mod common;

use std::net::{TcpStream, UdpSocket};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// Runs to completion; returns exit code, stdout, stderr.
fn run(cmd: &mut Command) -> (i32, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn assert_config_error(cmd: &mut Command, key: &str) {
    let (code, _, stderr) = run(cmd);
    assert_eq!(code, 2, "{stderr}");
    assert_eq!(stderr.trim_end().lines().count(), 1, "one line: {stderr:?}");
    assert!(stderr.contains(key), "{stderr:?} names {key}");
}

#[test]
fn bad_values_exit_2_with_one_line_naming_the_key() {
    assert_config_error(bin().args(["--sample-count", "0"]), "sample_count");
    assert_config_error(bin().args(["--retentions", "7s:1d,1m:7d"]), "retentions");
    assert_config_error(
        bin().args(["--retentions", "1m:7d", "--sample-count", "1440"]),
        "retentions",
    );
    assert_config_error(bin().args(["--sample-count", "ten"]), "--sample-count");
    assert_config_error(
        bin().env("STATSD_REDIS_PRECISIONS", "1,x"),
        "STATSD_REDIS_PRECISIONS (--precisions)",
    );
    assert_config_error(bin().args(["--redis", "http://nope"]), "redis");
    assert_config_error(bin().args(["--udp", "not-an-address"]), "--udp");
    assert_config_error(bin().args(["--no-such-flag"]), "--no-such-flag");
    assert_config_error(
        bin().args(["--flush-interval-secs", "2", "--coarse-write-secs", "5"]),
        "coarse_write_secs",
    );

    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("bad.toml");
    std::fs::write(&file, "flush_interval_secs = \"1s\"\n").unwrap();
    assert_config_error(bin().arg("--config").arg(&file), "flush_interval_secs");
    std::fs::write(&file, "sampel_count = 3\n").unwrap();
    assert_config_error(bin().arg("--config").arg(&file), "sampel_count");
    assert_config_error(bin().args(["--config", "/nonexistent.toml"]), "config");
    // Carbon's receivers and files.
    std::fs::write(&file, "[a]\npattern = .\naggregationMethod = median\n").unwrap();
    assert_config_error(
        bin().arg("--storage-aggregation").arg(&file),
        "storage_aggregation",
    );
    assert_config_error(
        bin().args(["--storage-aggregation", "/nonexistent.conf"]),
        "storage_aggregation",
    );
    assert_config_error(
        bin().args(["--carbon-tcp", ":2003", "--redis-mode", "cluster"]),
        "carbon_tcp",
    );
    std::fs::write(&file, "^web\\.\n(\n").unwrap();
    assert_config_error(
        bin().arg("--carbon-blacklist").arg(&file),
        "carbon_blacklist",
    );
    std::fs::write(&file, "[a]\npattern = .\nretentions = 60:1d,61:2d\n").unwrap();
    assert_config_error(bin().arg("--storage-schemas").arg(&file), "storage_schemas");
    std::fs::write(&file, "[a]\npattern = .\nretentions = 60:1d\n").unwrap();
    assert_config_error(
        bin()
            .arg("--storage-schemas")
            .arg(&file)
            .args(["--retentions", "10s:6h"]),
        "storage_schemas",
    );
    assert_config_error(
        bin()
            .arg("--storage-schemas")
            .arg(&file)
            .args(["--sample-count", "200"]),
        "storage_schemas",
    );
    // A path to an endless stream is refused at its size, not read for ever.
    for (flag, key) in [
        ("--config", "config"),
        ("--mapping-file", "mapping_file"),
        ("--storage-aggregation", "storage_aggregation"),
        ("--storage-schemas", "storage_schemas"),
        ("--carbon-whitelist", "carbon_whitelist"),
        ("--web-config-file", "web_config_file"),
        ("--redis-tls-ca-file", "redis_tls_ca_file"),
    ] {
        let (code, _, stderr) = run(bin().args([flag, "/dev/zero"]));
        assert_eq!(code, 2, "{flag}: {stderr}");
        assert!(
            stderr.contains(key) && stderr.contains("larger than 64 MiB"),
            "{flag}: {stderr}"
        );
    }
}

#[test]
fn flag_beats_environment_beats_file_beats_default() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("c.toml");
    std::fs::write(
        &file,
        "key_prefix = \"file:\"\nsample_count = 50\nflush_interval_secs = 2\n",
    )
    .unwrap();
    let (code, out, err) = run(bin()
        .arg("--print-config")
        .arg("--config")
        .arg(&file)
        .env("STATSD_REDIS_KEY_PREFIX", "env:")
        .env("STATSD_REDIS_SAMPLE_COUNT", "60")
        .args(["--sample-count", "70"]));
    assert_eq!(code, 0, "{err}");
    let c: toml::Table = out.parse().unwrap();
    assert_eq!(c["sample_count"].as_integer(), Some(70), "flag over env");
    assert_eq!(c["key_prefix"].as_str(), Some("env:"), "env over file");
    assert_eq!(
        c["flush_interval_secs"].as_integer(),
        Some(2),
        "file over default"
    );
    assert_eq!(c["http"].as_str(), Some("127.0.0.1:9102"), "default");
}

#[test]
fn defaults_match_the_spec() {
    let (code, out, _) = run(bin().arg("--print-config"));
    assert_eq!(code, 0);
    let c: toml::Table = out.parse().unwrap();
    assert_eq!(
        c["udp"].as_array().unwrap()[0].as_str(),
        Some("127.0.0.1:8125")
    );
    assert_eq!(c["redis"].as_str(), Some("redis://127.0.0.1:6379/0"));
    assert_eq!(c["http"].as_str(), Some("127.0.0.1:9102"));
}

/// A step that fails after the sockets are bound (here: the spool directory, locked by another
/// agent) ends the binary with exit 1 and says why; nothing was spawned that would keep it
/// running.
#[test]
fn a_failure_after_binding_exits_1_instead_of_hanging() {
    let redis = RedisServer::start();
    let spool = tempfile::tempdir().unwrap();
    let spool_dir = spool.path().to_str().unwrap();
    let (first, _, first_http) = spawn_agent(&redis.url(), &["--spool-dir", spool_dir]);
    let first = Killed(first);
    // The HTTP port is bound before the spool is locked, and answers only after: an answer
    // means the first agent holds the spool (on a slow machine the second could win the lock).
    let (status, _) = http_get(([127, 0, 0, 1], first_http).into(), "/healthz");
    assert_eq!(status, 200);
    let (udp, http, tcp) = (free_port(), free_port(), free_port());
    let mut second = bin()
        .args(["--udp", &format!("127.0.0.1:{udp}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args(["--tcp", &format!("127.0.0.1:{tcp}")])
        .args(["--redis", &redis.url(), "--spool-dir", spool_dir])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = second.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = second.kill();
            panic!("the second agent still runs 10 s after its spool failed");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut log = String::new();
    std::io::Read::read_to_string(second.stderr.as_mut().unwrap(), &mut log).unwrap();
    assert_eq!(status.code(), Some(1), "{log}");
    assert!(log.contains("in use by another agent"), "{log}");
    drop(first);
}

#[test]
fn sigterm_right_after_sending_loses_nothing() {
    let redis = RedisServer::start();
    let (child, udp, _) = spawn_agent(&redis.url(), &[]);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in 0..200 {
        let d: String = (0..10)
            .map(|j| format!("term.{}:1|c\n", (i + j) % 10))
            .collect();
        socket.send_to(d.as_bytes(), ("127.0.0.1", udp)).unwrap();
    }
    let (code, log, _) = terminate(child);
    assert_eq!(code, Some(0), "{log}");
    for p in PRECISIONS {
        let total: i64 = (0..10)
            .map(|s| redis.counter_total(p, &format!("term.{s}")))
            .sum();
        assert_eq!(total, 2000, "precision {p}\n{log}");
    }
}

#[test]
fn sigterm_with_redis_down_exits_within_the_timeout_and_says_what_was_lost() {
    let mut redis = RedisServer::start();
    let (child, udp, _) = spawn_agent(
        &redis.url(),
        &["--shutdown-timeout-secs", "2", "--redis-timeout-ms", "300"],
    );
    redis.kill();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.send_to(b"lost:1|c", ("127.0.0.1", udp)).unwrap();
    std::thread::sleep(Duration::from_millis(1500));
    socket.send_to(b"lost:1|c", ("127.0.0.1", udp)).unwrap();
    let (code, log, took) = terminate(child);
    assert_eq!(code, Some(0), "{log}");
    assert!(took < Duration::from_secs(4), "took {took:?}");
    assert!(log.contains("windows were not written"), "{log}");
    assert!(
        log.contains("windows=2") || log.contains("windows=3"),
        "{log}"
    );
}

#[test]
fn printed_configurations_never_show_a_password() {
    let (code, out, _) = run(bin().args([
        "--redis",
        "redis://:s3cret@127.0.0.1:1/0",
        "--redis-sentinels",
        "redis://:s3cret@127.0.0.1:2",
        "--print-config",
    ]));
    assert_eq!(code, 0);
    assert!(!out.contains("s3cret"), "{out}");
    assert!(out.contains("redis://***@127.0.0.1:1/0"), "{out}");
    // A unix socket's password goes in the query string.
    let (code, out, _) = run(bin().args([
        "--redis",
        "redis+unix:///run/redis.sock?user=agent&pass=s3cret&db=2",
        "--print-config",
    ]));
    assert_eq!(code, 0);
    assert!(!out.contains("s3cret"), "{out}");
    assert!(
        out.contains("redis+unix:///run/redis.sock?user=agent&pass=***&db=2"),
        "{out}"
    );
}

#[test]
fn a_reader_that_goes_away_ends_the_output_quietly() {
    let mut child = bin()
        .arg("--print-config")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // The pipe's reading end closed before the agent writes: its write fails with EPIPE.
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0));
    assert!(
        out.stderr.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Redis stopped and started again: `redis_up` goes to 0 and back, the log says so once each
/// way (not once per retry), and every window written meanwhile arrives once.
#[test]
fn redis_going_away_and_coming_back_is_logged_once_each_way() {
    let mut redis = RedisServer::start();
    let (child, udp, http) = spawn_agent(&redis.url(), &[]);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let wait_for = |what: &str, check: &dyn Fn() -> bool| {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !check() {
            assert!(Instant::now() < deadline, "timed out waiting for {what}");
            std::thread::sleep(Duration::from_millis(100));
        }
    };
    let up = || metric_at(format!("127.0.0.1:{http}").parse().unwrap(), "redis_up");
    socket.send_to(b"outage:1|c", ("127.0.0.1", udp)).unwrap();
    wait_for("the first window written", &|| {
        redis.counter_total(86400, "outage") == 1
    });
    assert_eq!(up(), 1.0);
    let errors = || {
        metric_at(
            format!("127.0.0.1:{http}").parse().unwrap(),
            "redis_errors_total",
        )
    };
    let failed = errors();
    redis.kill();
    for _ in 0..3 {
        socket.send_to(b"outage:1|c", ("127.0.0.1", udp)).unwrap();
        std::thread::sleep(Duration::from_millis(1100));
    }
    wait_for("redis_up 0", &|| up() == 0.0);
    // Several failed retries (0.25 s doubling) before Redis comes back.
    wait_for("three failed retries", &|| errors() >= failed + 3.0);
    redis.restart_after(Duration::ZERO, &[]);
    wait_for("redis_up 1 again", &|| up() == 1.0);
    wait_for("the waiting windows", &|| {
        redis.counter_total(86400, "outage") == 3
    });
    let (code, log, _) = terminate(child);
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(
        log.matches("cannot write to Redis; windows wait").count(),
        1,
        "{log}"
    );
    assert_eq!(log.matches("Redis is reachable again").count(), 1, "{log}");
}

/// SIGHUP under load: nothing is lost, a new `log_level` applies at once, another changed key
/// is reported as waiting for a restart, and a configuration that does not read is refused
/// with the running one kept.
#[test]
fn sighup_reloads_without_losing_anything() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.toml");
    std::fs::write(&file, "log_level = \"info\"\n").unwrap();
    let file_arg = file.to_str().unwrap().to_string();
    let (child, udp, _) = spawn_agent(&redis.url(), &["--config", &file_arg]);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut sent = 0;
    let mut send_for = |d: Duration| {
        let until = Instant::now() + d;
        while Instant::now() < until {
            socket.send_to(b"hup:1|c", ("127.0.0.1", udp)).unwrap();
            sent += 1;
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    send_for(Duration::from_millis(1500));
    std::fs::write(
        &file,
        "log_level = \"debug\"\nsample_count = 60\nmax_series_per_chunk = 10\n",
    )
    .unwrap();
    sighup(&child);
    send_for(Duration::from_millis(1500));
    std::fs::write(&file, "sample_count = 0\n").unwrap();
    sighup(&child);
    send_for(Duration::from_millis(1500));
    let (code, log, _) = terminate(child);
    assert_eq!(code, Some(0), "{log}");
    assert_eq!(redis.counter_total(86400, "hup"), sent, "{log}");
    assert!(log.contains("SIGHUP: log_level applied"), "{log}");
    assert!(
        log.contains("SIGHUP: applied") && log.contains("max_series_per_chunk"),
        "{log}"
    );
    assert!(log.contains("DEBUG"), "debug lines after the reload: {log}");
    assert!(
        log.contains("key=sample_count") && log.contains("takes effect at the next start"),
        "{log}"
    );
    assert!(
        log.contains("SIGHUP: the configuration does not read"),
        "{log}"
    );
}

/// A `systemctl reload` racing the start: systemd (`Type=notify`) holds it until the agent says
/// READY=1 on `NOTIFY_SOCKET`, so a SIGHUP right after that never ends the agent (ten starts);
/// the HTTP port already answers then.
#[test]
fn a_sighup_right_after_ready_never_kills_the_agent() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify");
    let systemd = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
    systemd
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    for _ in 0..10 {
        let (udp, http) = (free_port(), free_port());
        let child = bin()
            .args(["--udp", &format!("127.0.0.1:{udp}")])
            .args(["--http", &format!("127.0.0.1:{http}")])
            .args(["--redis", &redis.url()])
            .env("NOTIFY_SOCKET", &notify)
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let mut child = Killed(child);
        let mut message = [0u8; 64];
        let n = systemd.recv(&mut message).expect("READY=1 within 10 s");
        assert_eq!(&message[..n], b"READY=1");
        sighup(&child.0);
        assert!(TcpStream::connect(("127.0.0.1", http)).is_ok());
        std::thread::sleep(Duration::from_millis(50));
        assert!(
            child.0.try_wait().unwrap().is_none(),
            "the agent ended on a SIGHUP right after READY=1"
        );
        let (code, log, _) = terminate(std::mem::replace(
            &mut child.0,
            bin()
                .arg("--version")
                .stdout(Stdio::null())
                .spawn()
                .unwrap(),
        ));
        assert_eq!(code, Some(0), "{log}");
    }
}

#[test]
fn json_logs_are_one_object_a_line() {
    let redis = RedisServer::start();
    let (child, _, _) = spawn_agent(&redis.url(), &["--log-format", "json"]);
    let (code, log, _) = terminate(child);
    assert_eq!(code, Some(0));
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        assert!(v["level"].is_string() && v["fields"].is_object(), "{line}");
    }
    assert!(log.contains("agent started"), "{log}");
}

/// The systemd unit in dist/ passes `systemd-analyze verify` (Debian's systemd package), with
/// its ExecStart pointed at the binary built here, and without a single warning.
#[test]
fn the_systemd_unit_verifies() {
    let unit = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/dist/statsd-redis.service"
    ))
    .unwrap()
    .replace("/usr/bin/statsd-redis", env!("CARGO_BIN_EXE_statsd-redis"));
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("statsd-redis.service");
    std::fs::write(&path, unit).unwrap();
    let out = Command::new("systemd-analyze")
        .arg("verify")
        .arg(&path)
        .output()
        .unwrap_or_else(|e| panic!("cannot run systemd-analyze ({e}): apt-get install -y systemd"));
    // What it says of other units on this machine (another package's obsolete settings) is
    // not ours.
    let said: Vec<String> = String::from_utf8_lossy(&out.stderr)
        .lines()
        .filter(|l| !l.starts_with('/') || l.starts_with(path.to_str().unwrap()))
        .filter(|l| !l.trim().is_empty())
        .map(String::from)
        .collect();
    assert!(out.status.success() && said.is_empty(), "{said:?}");
}

/// A password in the Redis URL shows in no log line and no metric.
#[test]
fn a_password_never_reaches_the_logs_or_metrics() {
    let (child, _, http) = spawn_agent(
        "redis://:s3cret@127.0.0.1:1/0",
        &["--redis-timeout-ms", "200"],
    );
    std::thread::sleep(Duration::from_millis(1500));
    let metrics = http_get(format!("127.0.0.1:{http}").parse().unwrap(), "/metrics").1;
    let (_, log, _) = terminate(child);
    assert!(
        !log.contains("s3cret") && !metrics.contains("s3cret"),
        "{log}"
    );
    assert!(log.contains("***@127.0.0.1:1/0"), "{log}");
    // Nothing listens there: the first warning says how to get a Redis.
    assert!(
        log.contains("cannot write to Redis") && log.contains("apt-get install -y redis-server"),
        "{log}"
    );
}

#[test]
fn get_help_lists_only_what_get_uses_and_version_names_the_commit() {
    let (_, help, _) = run(bin().args(["get", "--help"]));
    assert!(
        help.contains("--redis <URL>") && help.contains("--key-prefix"),
        "{help}"
    );
    for agent_only in [
        "--udp-readers",
        "--spool-dir",
        "--cleaner-enabled",
        "--http",
    ] {
        assert!(!help.contains(agent_only), "{agent_only} in {help}");
    }
    let (code, version, _) = run(bin().arg("--version"));
    assert_eq!(code, 0);
    assert!(
        version.contains(env!("CARGO_PKG_VERSION")) && version.contains('('),
        "{version}"
    );
}

/// An error whose message already names its cause says it once.
#[test]
fn a_start_up_error_says_its_cause_once() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("notes.txt");
    std::fs::write(&file, "mine").unwrap();
    let (code, _, err) = run(bin()
        .args(["--udp", "127.0.0.1:0", "--http", "127.0.0.1:0"])
        .args(["--unix-stream", file.to_str().unwrap()]));
    assert_eq!(code, 1, "{err}");
    assert_eq!(err.matches("not a socket").count(), 1, "{err}");
}

/// Logs that recur are rate-limited and say how many times: out of descriptors, `accept` fails
/// again and again (one line per 10 s, not ten a second); a full backlog drops a window a
/// second (one line per 10 s). An outage whose cause changes says the new cause (a Redis
/// restarted with a password the agent does not have is not a broken pipe for good).
#[test]
fn recurring_errors_are_logged_now_and_then_with_their_latest_cause() {
    use std::os::unix::process::CommandExt;
    let mut redis = RedisServer::start();
    let tcp = free_port();
    let (udp, http) = (free_port(), free_port());
    let mut agent = bin();
    agent
        .args(["--udp", &format!("127.0.0.1:{udp}")])
        .args(["--http", &format!("127.0.0.1:{http}")])
        .args(["--tcp", &format!("127.0.0.1:{tcp}")])
        .args(["--redis", &redis.url(), "--max-backlog-windows", "1"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    // SAFETY: setrlimit in the child before exec; no allocation, no lock.
    unsafe {
        agent.pre_exec(|| {
            let limit = libc::rlimit {
                rlim_cur: 64,
                rlim_max: 64,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let child = agent.spawn().unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while TcpStream::connect(("127.0.0.1", http)).is_err() {
        assert!(Instant::now() < deadline, "agent did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    // More connections than descriptors: accept fails for 3 s.
    let held: Vec<TcpStream> = (0..100)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", tcp)).ok())
        .collect();
    std::thread::sleep(Duration::from_secs(3));
    drop(held);
    // Redis gone: a window a second, a backlog of one, so a window dropped a second; then back
    // with a password.
    redis.kill();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for _ in 0..4 {
        socket.send_to(b"dropped:1|c", ("127.0.0.1", udp)).unwrap();
        std::thread::sleep(Duration::from_millis(1000));
    }
    redis.restart_after(Duration::ZERO, &["--requirepass", "another"]);
    // A changed cause is logged 10 s into the outage at the earliest, then retries come every
    // 5 s at most.
    for _ in 0..14 {
        socket.send_to(b"dropped:1|c", ("127.0.0.1", udp)).unwrap();
        std::thread::sleep(Duration::from_millis(1000));
    }
    let (_, log, _) = terminate(child);
    // One line per listener (the HTTP one may run out of descriptors too).
    let tcp_accepts = log
        .lines()
        .filter(|l| l.contains("accept failed") && l.contains("tcp"));
    assert_eq!(tcp_accepts.count(), 1, "{log}");
    assert!(log.matches("HTTP accept failed").count() <= 1, "{log}");
    assert!(log.contains("backlog full"), "{log}");
    assert!(log.matches("backlog full").count() <= 2, "{log}");
    assert!(
        log.contains("now for another reason") && log.contains("AUTH"),
        "{log}"
    );
}
