//! The agent over real UDP into a real redis-server, read back the way the book reads.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use statsd_redis::config::Config;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nc_style_counter_lands_in_every_precision() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    let sent_at = unix_now();
    agent.send(b"hits:1|c\nhits:2|c");
    eventually(Duration::from_secs(3), "count:86400:hits", || {
        redis.counter_total(86400, "hits") == 3
    })
    .await;
    let written_at = unix_now();
    for p in PRECISIONS {
        let counter = redis.get_counter(&format!("count:{p}:hits"));
        assert_eq!(
            counter.values().sum::<i64>(),
            3,
            "precision {p}: {counter:?}"
        );
        assert_eq!(counter.len(), 1, "one slice at precision {p}");
        let slice = *counter.keys().next().unwrap();
        assert_eq!(slice % p, 0, "slice {slice} is a multiple of {p}");
        assert!(
            slice <= written_at && slice + p > sent_at,
            "slice {slice} holds the send time at {p}"
        );
    }
    let mut known = redis.known("known:");
    known.sort();
    let mut expected: Vec<String> = PRECISIONS.iter().map(|p| format!("{p}:hits")).collect();
    expected.sort();
    assert_eq!(known, expected);
    let scores: Vec<(String, f64)> = redis::cmd("ZRANGE")
        .arg("known:")
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query(&mut redis.conn())
        .unwrap();
    assert!(scores.iter().all(|(_, s)| *s == 0.0), "known: scores are 0");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cadence_client_is_understood() {
    use cadence::prelude::*;
    use cadence::{StatsdClient, UdpMetricSink};

    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let sink = UdpMetricSink::from(agent.udp[0], socket).unwrap();
    let client = StatsdClient::from_sink("app", sink);
    client.count("logins", 2).unwrap();
    client.incr("logins").unwrap();
    client
        .count_with_tags("requests", 5)
        .with_tag("env", "prod")
        .with_tag("code", "200")
        .send();
    client.time("db.query", 12).unwrap();
    client.gauge("queue.depth", 7).unwrap();
    eventually(Duration::from_secs(3), "cadence counters", || {
        redis.counter_total(1, "app.logins") == 3
            && redis.counter_total(60, "app.requests;code=200;env=prod") == 5
    })
    .await;
    assert_eq!(agent.metric(r#"samples_total{type="ms"}"#), 1.0);
    assert_eq!(agent.metric(r#"samples_total{type="g"}"#), 1.0);
    assert_eq!(
        agent.metric("bad_lines_total{reason=\"unknown_type\"}"),
        0.0
    );
    agent.stop().await;
}

/// Tags in every style a client sends, over real UDP and through cadence: kept as sent, folded
/// into one series per tag set, and found by the series name a reader writes down.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tag_styles_and_tag_values_as_sent() {
    use cadence::prelude::*;
    use cadence::{StatsdClient, UdpMetricSink};

    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    agent.send(
        "styles:1|c|#env:prod,dc:a\nstyles,dc=a,env=prod:1|c\nstyles#env=prod,dc=a:1|c\n\
         styles[env=prod,dc=a]:1|c\nsty[dc=a,env=prod]les:1|c\n\
         route:1|c|#path:/cart\nroute:2|c|#path:-cart\ncity:1|c|#name:Zürich\n\
         odd:1|c|#note:a;b  c"
            .as_bytes(),
    );
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let sink = UdpMetricSink::from(agent.udp[0], socket).unwrap();
    let client = StatsdClient::from_sink("app", sink);
    client
        .count_with_tags("req", 4)
        .with_tag("url", "http://a/b?x=1")
        .send();
    for (series, total) in [
        ("styles;dc=a;env=prod", 5),
        ("route;path=/cart", 1),
        ("route;path=-cart", 2),
        ("city;name=Zürich", 1),
        ("odd;note=a_b_c", 1),
        ("app.req;url=http://a/b?x=1", 4),
    ] {
        eventually(Duration::from_secs(3), series, || {
            redis.counter_total(1, series) == total
        })
        .await;
    }
    assert_eq!(
        agent.metric("names_sanitized_total"),
        1.0,
        "only `odd` changed"
    );
    assert_eq!(agent.metric("bad_lines_total"), 0.0);
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_statsd-redis"))
        .args([
            "--redis",
            &redis.url(),
            "get",
            "known",
            "--match",
            "route;path=/*",
        ])
        .output()
        .unwrap();
    let out = String::from_utf8(out.stdout).unwrap();
    assert!(
        out.contains("route;path=/cart") && !out.contains("-cart"),
        "{out}"
    );
    agent.stop().await;
}

/// 100 000 counter lines over 500 series in 20-line datagrams, with bad lines mixed in: every
/// precision holds exactly what was sent, and /metrics counts exactly what arrived.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_thousand_lines_are_all_counted() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut expected: BTreeMap<String, i64> = BTreeMap::new();
    let bad_lines = ["oops", "x:1|q", "y:abc|c", "z:1|c|@2"];
    let mut bad_sent = [0u64; 4];
    let (mut good, mut lines_sent) = (0u64, 0u64);
    let mut datagram = String::new();
    let mut datagrams = 0;
    while good < 100_000 {
        for _ in 0..20 {
            lines_sent += 1;
            if lines_sent % 97 == 0 {
                let i = (lines_sent / 97 % 4) as usize;
                bad_sent[i] += 1;
                datagram.push_str(bad_lines[i]);
            } else {
                let series = format!("load.s{}", good % 500);
                let value = (good % 7) as i64 + 1;
                *expected.entry(series.clone()).or_default() += value;
                datagram.push_str(&format!("{series}:{value}|c"));
                good += 1;
            }
            datagram.push('\n');
        }
        socket.send_to(datagram.as_bytes(), agent.udp[0]).unwrap();
        datagram.clear();
        datagrams += 1;
        // Pace the sender so the test measures counting, not the kernel's buffer.
        if datagrams % 200 == 0 {
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
    }
    eventually(Duration::from_secs(10), "all lines received", || {
        agent.metric("lines_received_total") as u64 == lines_sent
    })
    .await;
    agent.stop().await;

    for p in PRECISIONS {
        let mut got = BTreeMap::new();
        for series in expected.keys() {
            got.insert(series.clone(), redis.counter_total(p, series));
        }
        assert_eq!(got, expected, "totals at precision {p}");
    }
    assert_eq!(redis.known("known:").len(), 500 * PRECISIONS.len());
    // Exactly-once costs one key, the guard hash: a field per run of the agent, and no TTL (an
    // evicting policy takes keys with one first).
    let guards: Vec<String> = redis::cmd("KEYS")
        .arg("flush:*")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(guards, ["flush:"]);
    let runs: i64 = redis::cmd("HLEN")
        .arg("flush:")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(runs, 1);
    let ttl: i64 = redis::cmd("TTL")
        .arg("flush:")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(ttl, -1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_lines_and_bad_lines_by_reason() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    agent.send(
        b"a:1|c\noops\nb:1|x\nc:NaN|g\nd:1|c|@0\n_e{5,4}:title|text\n_sc|db|2|m:down\ne:1|c|zz",
    );
    eventually(Duration::from_secs(3), "lines counted", || {
        agent.metric("lines_received_total") == 8.0
    })
    .await;
    assert_eq!(agent.metric("packets_received_total"), 1.0);
    assert_eq!(
        agent.metric(r#"bad_lines_total{reason="missing_value"}"#),
        1.0
    );
    assert_eq!(
        agent.metric(r#"bad_lines_total{reason="unknown_type"}"#),
        1.0
    );
    assert_eq!(
        agent.metric(r#"bad_lines_total{reason="invalid_value"}"#),
        1.0
    );
    assert_eq!(
        agent.metric(r#"bad_lines_total{reason="invalid_sample_rate"}"#),
        1.0
    );
    assert_eq!(agent.metric(r#"samples_total{type="c"}"#), 2.0);
    assert_eq!(agent.metric("events_total"), 1.0);
    assert_eq!(agent.metric("service_checks_total"), 1.0);
    assert_eq!(agent.metric("unknown_fields_total"), 1.0);
    eventually(Duration::from_secs(3), "a flush", || {
        agent.metric(r#"flushes_total{outcome="ok"}"#) >= 1.0
    })
    .await;
    let text = http_get(agent.http, "/metrics").1;
    for name in [
        "flush_duration_seconds_bucket",
        "kernel_drops_total",
        "backlog_windows",
        "build_info",
    ] {
        assert!(
            text.contains(&format!("statsd_redis_{name}")),
            "/metrics lacks {name}"
        );
    }
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_datagram_keeps_its_whole_lines() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(Config {
        max_datagram_bytes: 512,
        ..test_config(&redis)
    });
    let mut d = String::new();
    for i in 0..100 {
        d.push_str(&format!("trunc.{i:03}:1|c\n"));
    }
    // 1400 bytes into a 512-byte buffer: the whole 14-byte lines before the cut survive.
    agent.send(d.as_bytes());
    eventually(Duration::from_secs(3), "truncation counted", || {
        agent.metric("truncated_datagrams_total") == 1.0
    })
    .await;
    let agent_bad_truncated = agent.metric(r#"bad_lines_total{reason="truncated"}"#);
    agent.stop().await;
    let whole = 512 / "trunc.000:1|c\n".len();
    assert_eq!(agent_bad_truncated, 1.0);
    for i in 0..100 {
        let expected = i64::from(i < whole);
        assert_eq!(
            redis.counter_total(1, &format!("trunc.{i:03}")),
            expected,
            "line {i}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ipv6_key_prefix_and_several_listeners() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(Config {
        udp: vec!["[::1]:0".parse().unwrap(), "127.0.0.1:0".parse().unwrap()],
        key_prefix: "app1:".into(),
        precisions: vec![1, 60],
        ..test_config(&redis)
    });
    agent.send(b"v6:1|c");
    std::net::UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(b"v6:2|c", agent.udp[1])
        .unwrap();
    eventually(Duration::from_secs(3), "prefixed counter", || {
        redis.get_counter("app1:count:60:v6").values().sum::<i64>() == 3
    })
    .await;
    let mut known = redis.known("app1:known:");
    known.sort();
    assert_eq!(known, ["1:v6", "60:v6"]);
    assert!(
        redis.get_counter("count:1:v6").is_empty(),
        "nothing outside the prefix"
    );
    agent.stop().await;
}

/// `/readyz` means "windows are being written", from the writer's own state: 503 with the reason
/// when Redis is gone, when it refuses every write of a window (an ACL user without rights on
/// `count:*`), or when it is out of memory; 200 again once windows go in. A request opens no
/// Redis connection. `/healthz` answers throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readiness_means_windows_are_being_written() {
    let (redis, port) = RedisServer::start_tcp();
    let admin = |args: &[&str]| {
        let mut cmd = redis::cmd(args[0]);
        for a in &args[1..] {
            cmd.arg(*a);
        }
        cmd.query::<redis::Value>(&mut redis.conn()).unwrap()
    };
    // Everything but the counters' hashes.
    admin(&[
        "ACL",
        "SETUSER",
        "writer",
        "on",
        ">pw",
        "+@all",
        "~flush:*",
        "~known:*",
        "~stats:*",
        "~gauge*",
        "~set:*",
        "~hist:*",
        "~cleaner:*",
    ]);
    let agent = TestAgent::start(Config {
        redis: format!("redis://writer:pw@127.0.0.1:{port}/0"),
        cleaner_enabled: false,
        ..test_config(&redis)
    });
    let ready = || http_get(agent.http, "/readyz");
    eventually(Duration::from_secs(3), "ready at start", || {
        ready().0 == 200
    })
    .await;
    let mut watching = redis.conn();
    let mut connections = || -> String {
        let info: String = redis::cmd("INFO")
            .arg("stats")
            .query(&mut watching)
            .unwrap();
        info.lines()
            .find(|l| l.starts_with("total_connections_received:"))
            .unwrap()
            .to_string()
    };
    let before = connections();
    for _ in 0..100 {
        assert_eq!(ready().0, 200);
    }
    assert_eq!(
        connections(),
        before,
        "a /readyz request costs Redis nothing"
    );

    agent.send(b"denied:1|c");
    eventually(Duration::from_secs(5), "refused writes seen", || {
        ready().1.contains("refused")
    })
    .await;
    assert_eq!(ready().0, 503);
    admin(&["ACL", "SETUSER", "writer", "~*"]);
    agent.send(b"allowed:1|c");
    eventually(Duration::from_secs(5), "ready again", || ready().0 == 200).await;

    admin(&["CONFIG", "SET", "maxmemory-policy", "volatile-lru"]);
    admin(&["CONFIG", "SET", "maxmemory", "1"]);
    agent.send(b"oom:1|c");
    eventually(Duration::from_secs(5), "out of memory seen", || {
        let (status, body) = ready();
        status == 503 && body.contains("OOM")
    })
    .await;
    admin(&["CONFIG", "SET", "maxmemory", "0"]);
    eventually(Duration::from_secs(10), "ready after the retry", || {
        ready().0 == 200
    })
    .await;
    assert_eq!(redis.counter_total(1, "oom"), 1);

    drop(redis);
    agent.send(b"gone:1|c");
    eventually(Duration::from_secs(5), "Redis gone seen", || {
        ready().0 == 503
    })
    .await;
    assert_eq!(http_get(agent.http, "/healthz").0, 200);
    agent.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_flushes_the_partial_window() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    agent.send(b"last:5|c");
    agent.stop().await;
    assert_eq!(redis.counter_total(1, "last"), 5);
}

/// A flood of invented names past `max_series_per_window`: each window takes the cap, the
/// series it already has keep counting, and every dropped sample is counted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_series_cap_holds_and_counts_what_it_drops() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(Config {
        max_series_per_window: 10,
        ..test_config(&redis)
    });
    // In one datagram, so in one window: the first ten names, then 20 more, then the first
    // ten again.
    let mut datagram: String = (0..30).map(|i| format!("flood.{i}:1|c\n")).collect();
    datagram.extend((0..10).map(|i| format!("flood.{i}:1|c\n")));
    datagram.push_str("_e{1,1}:t|x");
    agent.send(datagram.as_bytes());
    eventually(Duration::from_secs(5), "the window written", || {
        agent.metric(r#"flushes_total{outcome="ok"}"#) >= 1.0
    })
    .await;
    assert_eq!(agent.metric(r#"samples_dropped_total{type="c"}"#), 20.0);
    assert_eq!(agent.metric("logs_dropped_total"), 0.0);
    agent.stop().await;
    for i in 0..30 {
        let expected = if i < 10 { 2 } else { 0 };
        assert_eq!(
            redis.counter_total(1, &format!("flood.{i}")),
            expected,
            "flood.{i}"
        );
    }
    assert_eq!(redis.known("known:").len(), 10 * PRECISIONS.len());
}

/// `/metrics` carries the process's own metrics, as every Prometheus exporter does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_include_the_process() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    let (_, text) = http_get(agent.http, "/metrics");
    let value = |name: &str| -> f64 {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{name} ")))
            .unwrap_or_else(|| panic!("no {name}"))
            .parse()
            .unwrap()
    };
    assert!(value("process_resident_memory_bytes") > 1e6);
    assert!(value("process_open_fds") >= 3.0);
    assert!(value("process_max_fds") >= value("process_open_fds"));
    assert!(value("process_cpu_seconds_total") >= 0.0);
    let started = value("process_start_time_seconds");
    assert!(started <= unix_now() as f64 + 1.0 && started > unix_now() as f64 - 3600.0);
    assert!(value("process_threads") >= 2.0);
    agent.stop().await;
}
