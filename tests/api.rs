//! Reading back: the JSON API under /api/v1/ and `statsd-redis get …`, against a live agent and
//! a private Redis.

mod common;

use std::time::Duration;

use common::*;
use serde_json::{Value, json};

fn get_json(agent: &TestAgent, path: &str) -> (u16, Value) {
    let (status, body) = http_get(agent.http, path);
    (
        status,
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("{path}: {e}: {body:?}")),
    )
}

async fn agent_with_data() -> (RedisServer, TestAgent) {
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    for _ in 0..5 {
        agent.send(b"hits:1|c");
    }
    agent.send(b"ctx:100|ms\nctx:200|ms\nfast:5|ms\nsize:3|h\ntemp:21.5|g\nusers:a|s\nusers:b|s\n_e{4,0}:boom||t:error|#service:api");
    for i in 0..120 {
        agent.send(format!("web.page{i:03};env=prod:1|c").as_bytes());
    }
    eventually(Duration::from_secs(3), "flushed", || {
        redis.counter_total(5, "hits") == 5 && redis.known("known:").len() == 121 * PRECISIONS.len()
    })
    .await;
    (redis, agent)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_answers_every_query() {
    let (redis, agent) = agent_with_data().await;
    let slice = *redis.get_counter("count:5:hits").keys().next().unwrap();

    let (status, body) = get_json(&agent, "/api/v1/counter/hits?precision=5");
    assert_eq!(status, 200);
    assert_eq!(body["samples"], json!([[slice, 5]]));

    let (status, body) = get_json(&agent, "/api/v1/stats/ctx");
    assert_eq!(status, 200);
    let s = &body["stats"];
    assert_eq!(
        (
            s["count"].as_f64(),
            s["average"].as_f64(),
            s["min"].as_f64()
        ),
        (Some(2.0), Some(150.0), Some(100.0))
    );
    assert!((s["stddev"].as_f64().unwrap() - 70.710678).abs() < 1e-5);
    assert_eq!(
        get_json(&agent, "/api/v1/stats/size?type=Histogram").1["stats"]["sum"],
        3.0
    );

    let (_, body) = get_json(&agent, "/api/v1/slowest?limit=10");
    let names: Vec<&str> = body
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["series"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["ctx", "fast"]);
    assert_eq!(body[0]["stats"]["max"], 200.0);

    let (_, body) = get_json(&agent, "/api/v1/log/api?severity=error");
    assert!(body["recent"][0].as_str().unwrap().ends_with(" boom"));
    assert_eq!(body["common"], json!([["boom", 1.0]]));
    assert_eq!(
        get_json(&agent, "/api/v1/logs").1,
        json!([{"name": "api", "severity": "error"}])
    );

    let (_, body) = get_json(&agent, "/api/v1/gauge/temp");
    assert_eq!(body["value"], 21.5);
    let (_, body) = get_json(&agent, "/api/v1/set/users?precision=60");
    assert_eq!(body["samples"][0][1], 2);

    let (_, body) = get_json(&agent, "/api/v1/known?match=page1&per_page=10&page=2");
    assert_eq!(body["total"], 20, "page100..page119");
    assert_eq!(body["series"][0]["series"], "web.page110;env=prod");
    assert_eq!(body["series"][0]["precisions"], json!(PRECISIONS));
    assert_eq!(
        get_json(&agent, "/api/v1/known?match=web.*&per_page=500").1["total"],
        120
    );

    let (_, body) = get_json(&agent, "/api/v1/vitals");
    assert_eq!(body["lines_received"], 5.0 + 8.0 + 120.0);
    assert!(body["last_flush_unix"].as_f64().unwrap() > 0.0);
    assert_eq!(body["precisions"], json!(PRECISIONS));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_errors_are_json_with_the_right_status() {
    let (_redis, agent) = agent_with_data().await;
    for path in [
        "/api/v1/counter/nope",
        "/api/v1/counter/hits?precision=7",
        "/api/v1/stats/nope",
        "/api/v1/log/nope",
        "/api/v1/gauge/nope",
        "/api/v1/set/nope",
        "/api/v1/nothing-here",
        "/api/v2/counter/hits",
    ] {
        let (status, body) = get_json(&agent, path);
        assert_eq!(status, 404, "{path}");
        assert!(
            body["error"].as_str().unwrap().contains("no "),
            "{path}: {body}"
        );
    }
    for path in [
        "/api/v1/counter/hits?precision=x",
        "/api/v1/counter/hits?precision=0",
        "/api/v1/stats/ctx?type=Bogus",
        "/api/v1/slowest?limit=-1",
        "/api/v1/known?page=0",
    ] {
        let (status, body) = get_json(&agent, path);
        assert_eq!(status, 400, "{path}");
        assert!(body["error"].is_string(), "{path}: {body}");
    }
    agent.stop().await;
}

/// The unindexed listing matches while it scans: a series past the first 500 names is found
/// by its pattern, and a listing cut at 500 says it is not complete.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn series_listing_matches_before_it_truncates() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    let lines: Vec<String> = (0..600)
        .map(|i| format!("a.t{i:03}:1|ms"))
        .chain(["zz.wanted:1|ms".to_string()])
        .collect();
    for chunk in lines.chunks(50) {
        agent.send(chunk.join("\n").as_bytes());
    }
    // Every timer flushed: a datagram read by one reader as the window closes lands in the
    // next window, so the last one sent may be written before some of the others.
    eventually(Duration::from_secs(5), "flushed", || {
        redis::cmd("KEYS")
            .arg("stats:*:AccessTime")
            .query::<Vec<String>>(&mut redis.conn())
            .unwrap()
            .len()
            == lines.len()
    })
    .await;
    let (_, body) = get_json(&agent, "/api/v1/series?type=timer&match=wanted");
    assert_eq!(body, json!({"series": ["zz.wanted"], "complete": true}));
    let (_, body) = get_json(&agent, "/api/v1/series?type=timer");
    assert_eq!(body["series"].as_array().unwrap().len(), 500);
    assert_eq!(body["complete"], false);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_says_503_when_redis_is_gone() {
    let (mut redis, agent) = agent_with_data().await;
    redis.kill();
    let (status, body) = get_json(&agent, "/api/v1/counter/hits");
    assert_eq!(status, 503, "{body}");
    agent.shutdown.cancel();
}

fn get(redis: &RedisServer, args: &[&str]) -> (i32, String, String) {
    let out = bin()
        .arg("--redis")
        .arg(redis.url())
        .arg("get")
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cli_prints_tables_and_json() {
    let (redis, agent) = agent_with_data().await;
    agent.stop().await;
    let slice = *redis.get_counter("count:5:hits").keys().next().unwrap();

    let (code, out, err) = get(&redis, &["counter", "hits", "--precision", "5"]);
    assert_eq!(code, 0, "{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "header and one row: {out}");
    assert!(lines[1].ends_with(" 5"), "{out}");
    let (_, out, _) = get(&redis, &["counter", "hits", "--precision", "5", "--json"]);
    assert_eq!(out.trim(), format!("[[{slice},5]]"));

    let (_, out, _) = get(&redis, &["stats", "ctx", "--json"]);
    let stats: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(stats["average"], 150.0);
    let (_, out, _) = get(&redis, &["stats", "ctx"]);
    assert!(
        out.lines()
            .any(|l| l.starts_with("average") && l.ends_with(" 150")),
        "{out}"
    );

    let (_, out, _) = get(&redis, &["slowest", "--limit", "1"]);
    assert_eq!(
        out.lines()
            .nth(1)
            .unwrap()
            .split_whitespace()
            .collect::<Vec<_>>(),
        ["ctx", "150"]
    );
    let (_, out, _) = get(&redis, &["log", "api", "--severity", "error", "--json"]);
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["common"],
        json!([["boom", 1.0]])
    );
    let (_, out, _) = get(&redis, &["gauge", "temp"]);
    assert_eq!(out.trim(), "21.5");
    let (_, out, _) = get(&redis, &["set", "users", "--json"]);
    assert_eq!(serde_json::from_str::<Value>(&out).unwrap()[0][1], 2);
    let (_, out, _) = get(&redis, &["known", "--match", "web.page00?*"]);
    assert_eq!(out.lines().count(), 1 + 10, "{out}");

    let (code, _, err) = get(&redis, &["counter", "nope"]);
    assert_eq!(code, 1, "unknown series: {err}");
    assert!(err.contains("no counter `nope`"));
    let (code, _, _) = get(&redis, &["counter", "hits", "--precision", "x"]);
    assert_eq!(code, 2, "bad argument");
    let out = bin()
        .args(["--redis", "redis://127.0.0.1:1/0", "get", "known"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(3), "Redis unreachable");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_recovers_after_a_redis_restart() {
    let (mut redis, agent) = agent_with_data().await;
    assert_eq!(get_json(&agent, "/api/v1/counter/hits?precision=5").0, 200);
    redis.restart_after(Duration::from_millis(100), &[]);
    // The old connection died with the server; the next request may fail, later ones must not.
    let _ = get_json(&agent, "/api/v1/known");
    eventually(Duration::from_secs(3), "API answers again", || {
        get_json(&agent, "/api/v1/known").0 == 200
    })
    .await;
    agent.stop().await;
}

/// A flood of `known?match=` requests over a large index (200 000 members) never holds up the
/// window closer: the HTTP server runs on its own threads, the index is read in ranges (a
/// prefix glob reads only its range), and at most four API requests run at once (the rest wait
/// or are told the server is busy). Every second's counts stay in their own 1 s slice, and
/// `/healthz` answers throughout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_index_queries_holds_up_no_window() {
    let redis = RedisServer::start();
    let mut conn = redis.conn();
    for batch in 0..20 {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg("known:");
        for i in 0..10_000 {
            zadd.arg(0).arg(format!("60:flood.{batch}.{i:05}"));
        }
        let _: () = zadd.query(&mut conn).unwrap();
    }
    let agent = TestAgent::start(test_config(&redis));
    let (status, page) = get_json(&agent, "/api/v1/known?match=flood.7.0012*");
    assert_eq!(status, 200);
    assert_eq!(page["total"], 10, "a prefix reads its range: {page}");

    let http = agent.http;
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood: Vec<_> = (0..16)
        .map(|_| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    answers.push(http_get(http, "/api/v1/known?match=*9*&per_page=5").0);
                }
                answers
            })
        })
        .collect();
    let healthz = std::thread::spawn(move || {
        (0..40)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(100));
                http_get(http, "/healthz").0
            })
            .collect::<Vec<_>>()
    });
    // 50 a second for 4 s, each second's into its own slice.
    for _ in 0..200 {
        agent.send(b"steady:1|c");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let answers: Vec<u16> = flood.into_iter().flat_map(|t| t.join().unwrap()).collect();
    assert!(
        answers.iter().all(|s| *s == 200 || *s == 503),
        "{answers:?}"
    );
    assert!(answers.contains(&200));
    assert!(healthz.join().unwrap().iter().all(|s| *s == 200));
    steady_written_second_by_second(&redis).await;
    agent.stop().await;
}

/// Connections that send half a request head (or nothing) are closed after the header timeout,
/// not held with their descriptors; more than the connection limit of them at once only make
/// later connections wait their turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn half_sent_requests_are_not_held() {
    use std::io::{Read, Write};
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    let http = agent.http;
    let half: Vec<std::net::TcpStream> = (0..600)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(http).unwrap();
            s.write_all(b"GET /healthz HTTP/1.1\r\nHost: te").unwrap();
            s
        })
        .collect();
    let started = std::time::Instant::now();
    let answered = tokio::task::spawn_blocking(move || http_get(http, "/healthz").0)
        .await
        .unwrap();
    assert_eq!(answered, 200);
    // Those past the connection limit wait their turn in the kernel's backlog first.
    let limit = 2 * statsd_redis::http::HEADER_TIMEOUT + Duration::from_secs(5);
    for mut s in half {
        s.set_read_timeout(Some(
            limit.saturating_sub(started.elapsed()) + Duration::from_secs(1),
        ))
        .unwrap();
        // Closed by the server: end of file (perhaps after a 408), or a reset.
        let mut buf = [0u8; 256];
        let closed = loop {
            match s.read(&mut buf) {
                Ok(0) => break true,
                Ok(_) => continue,
                Err(e) => break e.kind() == std::io::ErrorKind::ConnectionReset,
            }
        };
        assert!(closed, "a half-sent request was held");
    }
    assert!(started.elapsed() < limit + Duration::from_secs(2));
    agent.stop().await;
}

/// A request whose body never arrives takes no turn among the four API requests that may run
/// at once: the body is read first, within 10 s (then 408), so others are answered meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_body_that_never_arrives_holds_no_turn() {
    use std::io::{Read, Write};
    let (_redis, agent) = agent_with_data().await;
    let http = agent.http;
    let slow: Vec<std::net::TcpStream> = (0..6)
        .map(|_| {
            let mut s = std::net::TcpStream::connect(http).unwrap();
            s.write_all(b"POST /graphite/render HTTP/1.1\r\nHost: t\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: 1000\r\n\r\ntarget=")
                .unwrap();
            s
        })
        .collect();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (status, _) = get_json(&agent, "/api/v1/known?match=web");
    assert_eq!(status, 200, "answered while six bodies are on their way");
    for mut s in slow {
        s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        let mut answer = String::new();
        let _ = s.read_to_string(&mut answer);
        assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    }
    agent.stop().await;
}
