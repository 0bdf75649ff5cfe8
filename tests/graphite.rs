//! The Graphite API, answer for answer against graphite-web: graphite-web 1.1.10 (its webapp,
//! fetched once from PyPI, on Debian's `graphite-web` 1.1.8 install: `tests/graphite/graphite-web.sh`)
//! reads the same private Redis through a storage finder of the test's own
//! (`tests/graphite/redis_finder.py`: the book's layout as one whisper file per series, an
//! archive per precision; graphite-web's own tag database kept in step with `known:`), the
//! requests Grafana's Graphite data source sends (`tests/graphite/probe.py`: its health check,
//! panel targets wrapped in `aliasSub`, browsing, tag autocomplete, every function of the
//! registry in three requests or more, `maxDataPoints`, ranges that switch precision, time
//! forms, errors, CSV) go to both with `now` pinned, and the parsed answers must agree: the same
//! series in the same order, names, tags, timestamps, values within 1e-9, nulls in the same
//! places; the same status; CSV byte for byte. `/functions` is compared with graphite-web's own
//! declarations.

mod common;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::answers::{differences, finite};
use common::*;
use serde_json::{Value, json};
use statsd_redis::config::Config;

/// The seeded data's now (2025-10-09 09:13:57 UTC, aligned to nothing).
const NOW: &str = "1760001237";

/// Requests the agent answers otherwise than graphite-web on purpose, and why.
const DIFFERENT: &[(&str, &str)] = &[
    (
        "err.unparsable",
        "a target that does not parse is a 400 naming the position; graphite-web renders the longest prefix that parses (200, [] here)",
    ),
    (
        "err.trailing_paren",
        "as err.unparsable (graphite-web drops the `)`)",
    ),
    (
        "err.trailing_space",
        "as err.unparsable (graphite-web drops ` foo`)",
    ),
    (
        "tags.list",
        "`/tags` lists graphite-web's own database rows, which the agent has not; Grafana does not ask for it",
    ),
    ("tags.detail", "as tags.list"),
    (
        "functions",
        "graphite-web 1.1.8 answers 500 under Python 3.11 (inspect.getargspec is gone); the agent lists its functions",
    ),
    ("functions.one", "as functions"),
    (
        "all.identity.2",
        "a call with keyword arguments only: graphite-web's grammar does not read it as a call, fetches the function's name as a path and answers []; the agent calls the function",
    ),
    (
        "all.asPercent.2",
        "a series list given by keyword: graphite-web prefetches only the path expressions of positional arguments, so there the keyword's list is empty (a 400); the agent reads it",
    ),
    (
        "all.timeSlice.0",
        "a relative time as an argument (`endSliceAt`'s default `now`): graphite-web reads it against the clock, ignoring the request's `now=`; the agent against the request's `now`",
    ),
];

/// graphite-web answers these with 500 (an error raised inside a function: a traceback page);
/// the agent with 400 and what is wrong.
const ERRORS_SAID: &[&str] = &[
    "fn.seriesByTag.all_match_empty",
    "fn.groupByTags.missing_tag",
    "fn.constantLine.one_second",
    "err.bad_summarize",
    "err.missing_arg",
    "fn.highestCurrent.default",
    "mdp.5min_0",
    "all.holtWintersConfidenceArea.2",
    "all.areaBetween.1",
];

/// Not comparable: `intervals` of find's json format come from the wall clock; events are
/// posted to graphite-web's own database (the agent's come from DogStatsD events: below).
const SKIPPED: &[&str] = &["find.json", "events.post", "events.range", "events.tags"];

fn harness() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/graphite")
}

/// graphite-web over `redis`, stopped when dropped.
struct GraphiteWeb {
    state: tempfile::TempDir,
    url: String,
}

impl GraphiteWeb {
    fn start(redis: &RedisServer) -> GraphiteWeb {
        assert!(
            Path::new("/usr/bin/graphite-manage").exists(),
            "this test runs graphite-web: apt-get install -y --no-install-recommends graphite-web python3-redis"
        );
        let state = tempfile::tempdir().unwrap();
        let out = Command::new(harness().join("graphite-web.sh"))
            .arg("start")
            .env(
                "ORACLE_REDIS_URL",
                format!("unix://{}", redis.socket.display()),
            )
            .env("ORACLE_STATE", state.path())
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "graphite-web did not start: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let url = std::fs::read_to_string(state.path().join("url")).unwrap();
        GraphiteWeb {
            state,
            url: url.trim().to_string(),
        }
    }
}

impl Drop for GraphiteWeb {
    fn drop(&mut self) {
        let _ = Command::new(harness().join("graphite-web.sh"))
            .arg("stop")
            .env("ORACLE_STATE", self.state.path())
            .output();
    }
}

fn python(args: &[&str]) -> String {
    let out = Command::new("/usr/bin/python3")
        .args(args)
        .current_dir(harness())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python3 {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Every datapoint's value made 0.
fn mask_values(v: &mut Value) {
    for series in v.as_array_mut().into_iter().flatten() {
        for point in series["datapoints"].as_array_mut().into_iter().flatten() {
            point[0] = Value::from(0);
        }
    }
}

/// Every request of the corpus, graphite-web's answer beside the agent's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answers_as_graphite_web_answers() {
    let redis = RedisServer::start();
    let url = format!("unix://{}", redis.socket.display());
    python(&["seed.py", "--url", &url, "--now", NOW]);
    let agent = TestAgent::start(Config {
        cleaner_enabled: false,
        ..test_config(&redis)
    });
    let graphite = GraphiteWeb::start(&redis);
    let answers = graphite.state.path().join("answers.jsonl");
    python(&[
        "probe.py",
        "--base",
        &graphite.url,
        "--out",
        answers.to_str().unwrap(),
        "--now",
        NOW,
        "--quiet",
    ]);
    let mut failures = Vec::new();
    let (mut compared, mut different) = (0, 0);
    for line in std::fs::read_to_string(&answers).unwrap().lines() {
        let want: Value = serde_json::from_str(line).unwrap();
        let id = want["id"].as_str().unwrap().to_string();
        if SKIPPED.contains(&id.as_str()) {
            continue;
        }
        let params: Vec<(String, String)> = want["params"]
            .as_array()
            .unwrap()
            .iter()
            .map(|kv| {
                (
                    kv[0].as_str().unwrap().into(),
                    kv[1].as_str().unwrap().into(),
                )
            })
            .collect();
        let query = serde_urlencoded::to_string(&params).unwrap();
        let path = format!("/graphite{}", want["path"].as_str().unwrap());
        let (status, _, body) =
            http_request(agent.http, want["method"].as_str().unwrap(), &path, &query);
        let want_status = want["status"].as_u64().unwrap() as u16;
        if let Some((_, why)) = DIFFERENT.iter().find(|(d, _)| *d == id) {
            different += 1;
            assert_ne!(
                (status, body.as_str()),
                (want_status, want["body"].as_str().unwrap()),
                "{id} answers as graphite-web now: drop it from DIFFERENT ({why})"
            );
            continue;
        }
        compared += 1;
        if ERRORS_SAID.contains(&id.as_str()) {
            if !(want_status == 500 && status == 400) {
                failures.push(format!(
                    "{id}: status {status}, graphite-web {want_status}: expected 400 for its 500"
                ));
            }
            continue;
        }
        if status != want_status {
            failures.push(format!(
                "{id}: status {status} != graphite-web's {want_status}: {body}"
            ));
            continue;
        }
        if want_status >= 500 {
            continue;
        }
        let mut got = serde_json::from_str::<Value>(&finite(&body));
        let mut want_json = want["json"].clone();
        if id.starts_with("rand.") {
            // Random values: the names, tags, times and number of points compare.
            for v in [&mut want_json].into_iter().chain(got.as_mut().ok()) {
                mask_values(v);
            }
        }
        match (&want_json, got) {
            (Value::Null, _) if id.starts_with("csv.") => {
                let want_body = want["body"].as_str().unwrap();
                if body != want_body {
                    failures.push(format!("{id}:\n{want_body}\n!=\n{body}"));
                }
            }
            (Value::Null, _) => {
                // A text answer (400 `Invalid parameters (…)`, `/version`): the status says it.
            }
            (want_json, Ok(got)) => {
                let mut diffs = Vec::new();
                differences(want_json, &got, "$", &mut diffs);
                if !diffs.is_empty() {
                    diffs.truncate(8);
                    failures.push(format!("{id}:\n    {}", diffs.join("\n    ")));
                }
            }
            (_, Err(e)) => failures.push(format!("{id}: not JSON ({e}): {body}")),
        }
    }
    assert!(compared > 180, "only {compared} requests compared");
    assert!(
        failures.is_empty(),
        "{} of {compared} answers differ from graphite-web's ({different} differ on purpose):\n{}",
        failures.len(),
        failures.join("\n")
    );
    drop(agent);
}

/// `/functions` lists every function of graphite-web 1.1.10's registry with the group and the
/// parameters (type, required, default, multiple, options, suggestions) graphite-web declares,
/// read from its function objects (its own `/functions` answers 500 under Python 3.11).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn functions_list_what_graphite_web_declares() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(Config {
        cleaner_enabled: false,
        ..test_config(&redis)
    });
    let graphite = GraphiteWeb::start(&redis);
    let out = Command::new(harness().join("graphite-web.sh"))
        .arg("index")
        .env("ORACLE_STATE", graphite.state.path())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let declared: Value =
        serde_json::from_str(&finite(&String::from_utf8_lossy(&out.stdout))).unwrap();
    let (status, _, body) = http_request(agent.http, "GET", "/graphite/functions", "");
    assert_eq!(status, 200);
    let listed: Value = serde_json::from_str(&finite(&body)).unwrap();
    let declared = declared.as_object().unwrap();
    assert_eq!(declared.len(), 154);
    let mut failures = Vec::new();
    for (name, want) in declared {
        let got = &listed[name];
        if got.is_null() {
            failures.push(format!("{name}: not listed"));
            continue;
        }
        let got = json!({"group": got["group"], "params": got["params"]});
        let mut diffs = Vec::new();
        differences(want, &got, name, &mut diffs);
        failures.extend(diffs);
    }
    let extra: Vec<&String> = listed
        .as_object()
        .unwrap()
        .keys()
        .filter(|k| !declared.contains_key(*k))
        .collect();
    assert!(extra.is_empty(), "listed but not graphite-web's: {extra:?}");
    assert!(failures.is_empty(), "{}", failures.join("\n"));

    // One function, one group, nested by group.
    let (status, _, body) = http_request(agent.http, "GET", "/graphite/functions/movingMedian", "");
    assert_eq!(status, 200);
    let one: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(one["group"], "Calculate");
    assert_eq!(one["params"][1]["name"], "windowSize");
    let (status, _, _) = http_request(agent.http, "GET", "/graphite/functions/noSuchThing", "");
    assert_eq!(status, 404);
    let (_, _, body) = http_request(agent.http, "GET", "/graphite/functions", "group=Sorting");
    let sorting: Value = serde_json::from_str(&body).unwrap();
    let mut names: Vec<&String> = sorting.as_object().unwrap().keys().collect();
    names.sort();
    assert_eq!(
        names,
        [
            "sortBy",
            "sortByMaxima",
            "sortByMinima",
            "sortByName",
            "sortByTotal"
        ]
    );
    let (_, _, body) = http_request(agent.http, "GET", "/graphite/functions", "grouped=1");
    let grouped: Value = serde_json::from_str(&finite(&body)).unwrap();
    assert_eq!(grouped.as_object().unwrap().len(), 9, "nine groups");
    assert!(grouped["Filter Data"]["removeBelowValue"].is_object());
    drop(agent);
}

/// Counters' and gauges' points come through the bulk reader (a connection of the API's own):
/// it logs in with the URL's password, selects the URL's database, and after Redis restarts a
/// render reads from a new connection, answering as before (a Redis failure is a 503, never a
/// 400: the shared connection is then dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_bulk_reader_logs_in_selects_and_reconnects() {
    let mut redis = RedisServer::start_with(&["--requirepass", "s3cret"]);
    let url = format!("redis+unix://{}?db=3&pass=s3cret", redis.socket.display());
    let now = unix_now() as i64;
    let minute = now - now % 60;
    let seed = |url: &str| {
        let mut c = redis::Client::open(url).unwrap().get_connection().unwrap();
        let mut hset = redis::cmd("HSET");
        hset.arg("count:60:bulk.hits");
        for k in 1..=10 {
            hset.arg(minute - k * 60).arg(k);
        }
        let () = hset.query(&mut c).unwrap();
        let () = redis::cmd("HSET")
            .arg("gauge:60:bulk.level")
            .arg(minute - 60)
            .arg("2.5")
            .query(&mut c)
            .unwrap();
        let () = redis::cmd("ZADD")
            .arg("known:")
            .arg(0)
            .arg("60:bulk.hits")
            .query(&mut c)
            .unwrap();
        let () = redis::cmd("ZADD")
            .arg("known:gauge:")
            .arg(0)
            .arg("60:bulk.level")
            .query(&mut c)
            .unwrap();
    };
    seed(&url);
    let agent = TestAgent::start(Config {
        cleaner_enabled: false,
        redis: url.clone(),
        ..test_config(&redis)
    });
    let render = || {
        let query = serde_urlencoded::to_string([
            ("target", "bulk.*"),
            ("from", "-20min"),
            ("until", "now"),
            ("format", "json"),
        ])
        .unwrap();
        let (status, _, body) = http_request(agent.http, "POST", "/graphite/render", &query);
        assert_eq!(status, 200, "{body}");
        let answer: Value = serde_json::from_str(&body).unwrap();
        answer
            .as_array()
            .unwrap()
            .iter()
            .map(|s| {
                let points: Vec<f64> = s["datapoints"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .filter_map(|p| p[0].as_f64())
                    .collect();
                (s["target"].as_str().unwrap().to_string(), points)
            })
            .collect::<Vec<_>>()
    };
    let want = vec![
        (
            "bulk.hits".to_string(),
            (1..=10).rev().map(f64::from).collect::<Vec<_>>(),
        ),
        ("bulk.level".to_string(), vec![2.5]),
    ];
    assert_eq!(render(), want);
    assert_eq!(render(), want, "again, on the connection kept");
    redis.restart_after(std::time::Duration::ZERO, &["--requirepass", "s3cret"]);
    seed(&url);
    // The first request after the restart may find the shared connection broken (a 503 that
    // drops it); the next reads the points on a new bulk connection, the kept one being dead.
    let query = serde_urlencoded::to_string([("target", "bulk.hits"), ("from", "-20min")]).unwrap();
    let (status, _, body) = http_request(agent.http, "POST", "/graphite/render", &query);
    assert!(status == 200 || status == 503, "{status}: {body}");
    assert_eq!(render(), want, "after a restart, on a new connection");
    drop(agent);
}

/// The agent's own data, as it writes it from StatsD traffic, read by both: counters and gauges
/// sent over UDP, flushed, then Grafana's requests at a `now` just after, the same answers. Sets
/// and timers, which graphite-web knows nothing of, are checked against what was sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn what_the_agent_writes_reads_back_alike() {
    let redis = RedisServer::start();
    // Within one minute and one 5 s slice, so that the answers are whole: the agent's clock
    // stands 11 s into a minute until moved.
    let clock = clock_at(11, 60);
    let agent = TestAgent::start_at(
        Config {
            cleaner_enabled: false,
            ..test_config(&redis)
        },
        clock.clone(),
    );
    let sent = clock.unix_now();
    agent.send_taken(b"shop.orders:3|c\nshop.orders:4|c\nshop.refunds:1|c\nshop.queue:12|g\nshop.checkout:100|ms\nshop.checkout:300|ms\nshop.buyers:alice|s\nshop.buyers:bob|s\nshop.orders;region=eu:5|c\n_e{6,9}:deploy|shop v1.2|#service:shop").await;
    clock.advance(std::time::Duration::from_secs(1));
    eventually(std::time::Duration::from_secs(5), "flushed", || {
        redis.counter_total(1, "shop.orders") == 7
    })
    .await;
    let now = (sent + 3).to_string();
    let graphite = GraphiteWeb::start(&redis);
    let http = agent.http;
    let ask = |base: &str, method: &str, path: &str, params: &[(&str, &str)]| -> (u16, Value) {
        let query = serde_urlencoded::to_string(params).unwrap();
        let (status, _, body) = match base {
            "agent" => http_request(http, method, &format!("/graphite{path}"), &query),
            url => {
                let addr: SocketAddr = url.trim_start_matches("http://").parse().unwrap();
                http_request(addr, method, path, &query)
            }
        };
        (status, serde_json::from_str(&body).unwrap_or(Value::Null))
    };
    for (path, params) in [
        (
            "/render",
            vec![
                (
                    "target",
                    r#"aliasSub(shop.{orders,refunds,queue}, "(^.*$)", "\1 A")"#,
                ),
                ("from", "-1min"),
                ("until", "now"),
                ("maxDataPoints", "30"),
            ],
        ),
        (
            "/render",
            vec![
                ("target", "sumSeries(shop.{orders,refunds})"),
                ("from", "-5min"),
                ("until", "now"),
            ],
        ),
        (
            "/render",
            vec![
                ("target", "summarize(shop.orders,'1min','sum')"),
                ("from", "-10min"),
                ("until", "now"),
            ],
        ),
        (
            "/render",
            vec![
                ("target", "seriesByTag('name=shop.orders')"),
                ("from", "-1h"),
                ("until", "now"),
            ],
        ),
        (
            "/render",
            vec![
                ("target", "shop.queue"),
                ("from", "-2min"),
                ("until", "now"),
            ],
        ),
        (
            "/metrics/find",
            vec![("query", "shop.{orders,queue,refunds}")],
        ),
        ("/tags/autoComplete/values", vec![("tag", "region")]),
    ] {
        let mut params = params.clone();
        if path == "/render" {
            params.push(("format", "json"));
        }
        params.push(("now", &now));
        let method = if path == "/render" { "POST" } else { "GET" };
        let (status, want) = ask(&graphite.url, method, path, &params);
        let (got_status, got) = ask("agent", method, path, &params);
        assert_eq!((got_status, status), (200, 200), "{path} {params:?}");
        let mut diffs = Vec::new();
        differences(&want, &got, "$", &mut diffs);
        assert!(diffs.is_empty(), "{path} {params:?}:\n{}", diffs.join("\n"));
    }

    // What graphite-web cannot read: a set's distinct members and a timer's statistics, in the
    // slice that holds the window; an event, as an annotation.
    let render = |target: &str, from: &str| {
        let query = serde_urlencoded::to_string([
            ("target", target),
            ("from", from),
            ("until", "now"),
            ("now", now.as_str()),
        ])
        .unwrap();
        let (status, _, body) = http_request(http, "GET", "/graphite/render", &query);
        assert_eq!(status, 200, "{target}: {body}");
        let series: Value = serde_json::from_str(&body).unwrap();
        series[0]["datapoints"]
            .as_array()
            .unwrap()
            .iter()
            .filter_map(|p| p[0].as_f64())
            .collect::<Vec<f64>>()
    };
    assert_eq!(render("shop.buyers", "-1min"), [2.0]);
    assert_eq!(render("shop.checkout.count", "-1h"), [2.0]);
    let p50 = render("shop.checkout.p50", "-1h")[0];
    assert!((p50 - 100.0).abs() <= 1.0, "p50 {p50} within 1 % of 100");
    let max = render("shop.checkout.max", "-1h")[0];
    assert!((max - 300.0).abs() <= 3.0, "max {max} within 1 % of 300");
    let find = ask(
        "agent",
        "GET",
        "/metrics/find",
        &[("query", "shop.checkout.*")],
    )
    .1;
    let leaves: Vec<&str> = find
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|n| n["text"].as_str())
        .collect();
    assert!(
        leaves.contains(&"p99") && leaves.contains(&"count"),
        "{leaves:?}"
    );
    let from = (sent - 60).to_string();
    let until = (sent + 60).to_string();
    let query = serde_urlencoded::to_string([
        ("from", from.as_str()),
        ("until", until.as_str()),
        ("tags", "shop"),
    ])
    .unwrap();
    let (status, _, body) = http_request(http, "GET", "/graphite/events/get_data", &query);
    assert_eq!(status, 200);
    let events: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(events[0]["what"], "deploy: shop v1.2");
    assert_eq!(events[0]["tags"], serde_json::json!(["shop", "info"]));
    assert!(events[0]["when"].as_i64().unwrap().abs_diff(sent as i64) <= 2);
}

/// Bad input gets a clear answer, never a stall or a crash: a target that does not parse is a
/// 400 naming the position, an unknown function a 400 naming it, a glob past the series one
/// request may read, calls nested past 64 (a stack's worth of evaluation), braces that
/// multiply past 1000 alternatives and functions whose work grows with their arguments
/// (`hitcount`'s buckets, a window, `timeStack`'s shifts, a bootstrap) a 400 naming the limit.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_targets_get_a_clear_answer() {
    let redis = RedisServer::start();
    let mut zadd = redis::cmd("ZADD");
    zadd.arg("known:");
    for i in 0..=statsd_redis::graphite::MAX_SERIES {
        zadd.arg(0).arg(format!("60:many.s{i}"));
    }
    let _: () = zadd.query(&mut redis.conn()).unwrap();
    let agent = TestAgent::start(Config {
        cleaner_enabled: false,
        ..test_config(&redis)
    });
    let nested = format!("{}many.s1{}", "sumSeries(".repeat(300), ")".repeat(300));
    let piped = format!("many.s1{}", "|scale(1)".repeat(300));
    for (target, says) in [
        (nested.as_str(), "deeper than 64"),
        (piped.as_str(), "deeper than 64"),
        ("sumSeries(many.s1", "position 17"),
        ("fooBar(many.s1)", "unknown function: fooBar"),
        ("many.*", "more than 10000 series"),
        (
            "scale(many.s1)",
            "Missing required parameter \"factor\" for function \"scale\"",
        ),
        (
            "movingAverage(many.s1,9223372036854775807)",
            "more than 1000000, the limit",
        ),
        (
            "movingAverage(many.s1,'5000y')",
            "reaches before the year 1",
        ),
    ] {
        let query = serde_urlencoded::to_string([("target", target), ("from", "-1h")]).unwrap();
        let (status, _, body) = http_request(agent.http, "POST", "/graphite/render", &query);
        assert_eq!(status, 400, "{target}: {body}");
        assert!(body.contains(says), "{target}: {body}");
    }
    // Work that grows with a function's arguments is refused past its limit, naming it.
    for (target, says) in [
        ("hitcount(many.s1,'1s')", "more than 1000000, the limit"),
        ("summarize(many.s1,'1s')", "more than 1000000, the limit"),
        ("time('t',1)", "more than 1000000, the limit"),
        ("identity('t')", "more than 1000000, the limit"),
        ("events('*')", "more than 1000000, the limit"),
        ("movingMax(many.s1,2000000)", "more than 1000000, the limit"),
        (
            "timeStack(many.s1,'1min',0,1000)",
            "1000 shifts, more than 100, the limit",
        ),
        (
            "holtWintersForecast(many.s1,'2500y')",
            "bootstrap reaches before the year 1",
        ),
        ("timeShift(many.s1,'+7990y')", "outside the years 1 to 9999"),
    ] {
        let query = serde_urlencoded::to_string([("target", target), ("from", "-2y")]).unwrap();
        let (status, _, body) = http_request(agent.http, "POST", "/graphite/render", &query);
        assert_eq!(status, 400, "{target}: {body}");
        assert!(body.contains(says), "{target}: {body}");
    }
    for query in [
        "query=many.*",
        &format!("query=many.{}", "{a,b}".repeat(30)),
    ] {
        let (status, _, body) = http_request(agent.http, "GET", "/graphite/metrics/find", query);
        assert_eq!(status, 400, "{body}");
        assert!(body.contains("limit"), "{body}");
    }
    drop(agent);
}

/// A level of many small branches (thousands of `load.<i>.c`, as a fleet of hosts), beside a
/// large branch, leaves and branches that are leaves too, found whole by `find` and by a render
/// whatever the glob: `*`, a literal prefix (`1??`), alternatives.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_level_of_many_branches_is_found_whole() {
    let redis = RedisServer::start();
    let mut counters = redis::cmd("ZADD");
    counters.arg("known:");
    for p in [10, 60] {
        for i in 0..2000 {
            counters.arg(0).arg(format!("{p}:load.{i}.c"));
            if i % 7 == 0 {
                counters.arg(0).arg(format!("{p}:load.{i}.d"));
            }
            if i % 13 == 0 {
                counters.arg(0).arg(format!("{p}:load.{i}"));
            }
        }
        for j in 0..300 {
            counters.arg(0).arg(format!("{p}:load.big.{j}"));
        }
    }
    let _: () = counters.query(&mut redis.conn()).unwrap();
    let mut gauges = redis::cmd("ZADD");
    gauges.arg("known:gauge:");
    for i in 0..50 {
        gauges.arg(0).arg(format!("60:load.g{i}"));
    }
    // Gauges under the same level: names no counter has, and one a counter has too.
    for i in 2000..2005 {
        gauges.arg(0).arg(format!("60:load.{i}.c"));
    }
    gauges.arg(0).arg("60:load.3.c");
    let _: () = gauges.query(&mut redis.conn()).unwrap();
    let agent = TestAgent::start(Config {
        cleaner_enabled: false,
        ..test_config(&redis)
    });
    // A request's JSON answer (200 OK), and the strings of one key of each of its items.
    let get = |path: &str, query: &[(&str, &str)]| -> Value {
        let query = serde_urlencoded::to_string(query).unwrap();
        let (status, _, body) = http_request(agent.http, "GET", path, &query);
        assert_eq!(status, 200, "{body}");
        serde_json::from_str(&body).unwrap()
    };
    let strings = |items: &Value, key: &str| -> Vec<String> {
        let items = items.as_array().unwrap().iter();
        items
            .map(|i| i[key].as_str().unwrap().to_string())
            .collect()
    };
    let find = |query: &str| -> std::collections::BTreeSet<String> {
        let nodes = get("/graphite/metrics/find", &[("query", query)]);
        strings(&nodes, "text").into_iter().collect()
    };
    let names = |r: std::ops::Range<i32>| -> std::collections::BTreeSet<String> {
        r.map(|i| i.to_string()).collect()
    };
    let mut all = names(0..2005);
    all.insert("big".into());
    all.extend((0..50).map(|i| format!("g{i}")));
    assert_eq!(find("load.*"), all);
    assert_eq!(find("load.1??"), names(100..200));
    let mut tens = names(10..20);
    tens.extend(names(20..30));
    assert_eq!(find("load.{1,2}?"), tens);
    assert_eq!(find("load.b*"), ["big".to_string()].into());
    assert_eq!(find("load.big.*").len(), 300);
    // A render's names: its last literal node is looked up, not walked; it names what a
    // find lists as leaves there, once each.
    let render = |target: &str| -> Vec<String> {
        let query = [("target", target), ("from", "-1h"), ("format", "json")];
        strings(&get("/graphite/render", &query), "target")
    };
    let paths = |r: std::ops::Range<i32>, leaf: &str| -> Vec<String> {
        r.map(|i| format!("load.{i}.{leaf}")).collect()
    };
    assert_eq!(render("load.1??.c"), paths(100..200, "c"));
    let mut leaves_c: Vec<String> = paths(0..2005, "c");
    leaves_c.sort();
    assert_eq!(render("load.*.c"), leaves_c);
    let mut leaves_d: Vec<String> = (0..2000)
        .filter(|i| i % 7 == 0)
        .map(|i| format!("load.{i}.d"))
        .collect();
    leaves_d.sort();
    assert_eq!(render("load.*.d"), leaves_d);
    assert_eq!(render("load.b?g.7"), ["load.big.7"]);
    // A name that is only a branch at the last node is no series.
    assert!(render("load.b?g").is_empty());
    // The leaves the walk of every node finds (`/metrics/expand`, as a browse walks).
    let expanded = |query: &str| -> Vec<String> {
        let found = get(
            "/graphite/metrics/expand",
            &[("query", query), ("leavesOnly", "1")],
        );
        let found = found["results"].as_array().unwrap().iter();
        let mut found: Vec<String> = found.map(|p| p.as_str().unwrap().to_string()).collect();
        found.sort();
        found
    };
    for pattern in [
        "load.*.c",
        "load.*.d",
        "load.1??.c",
        "load.b?g.7",
        "load.b?g",
    ] {
        let (rendered, walked) = (render(pattern), expanded(pattern));
        let apart: Vec<&String> = rendered
            .iter()
            .filter(|p| !walked.contains(p))
            .chain(walked.iter().filter(|p| !rendered.contains(p)))
            .collect();
        assert!(apart.is_empty(), "{pattern}: not in both: {apart:?}");
        assert_eq!(rendered.len(), walked.len(), "{pattern}");
    }
    // A glob's series are kept while the indexes keep their sizes: the same render again walks
    // no tree; a new series (or one gone) is named by the next render.
    let walks = redis.calls("zrangebylex") + redis.calls("zmscore");
    assert_eq!(render("load.*.d"), leaves_d);
    assert_eq!(redis.calls("zrangebylex") + redis.calls("zmscore"), walks);
    let _: () = redis::cmd("ZADD")
        .arg("known:")
        .arg(0)
        .arg("60:load.1.d")
        .query(&mut redis.conn())
        .unwrap();
    let mut more = leaves_d.clone();
    more.push("load.1.d".into());
    more.sort();
    assert_eq!(render("load.*.d"), more);
    let _: () = redis::cmd("ZREM")
        .arg("known:")
        .arg("10:load.0.d")
        .arg("60:load.0.d")
        .query(&mut redis.conn())
        .unwrap();
    more.retain(|p| p != "load.0.d");
    assert_eq!(render("load.*.d"), more);
    drop(agent);
}

/// A render in JSON is read and written a part at a time (docs/reading.md, "Renders
/// streamed"), its paths, bare or inside functions that treat each series alone (`aliasByNode`,
/// `scale`, `perSecond`…), as the answer is written, its other targets evaluated whole in their
/// places: its answer is byte for byte what the same targets give inside `group()` (which is
/// evaluated whole), over parts, with `maxDataPoints`, `noNullPoints`, several targets and
/// none; an argument a function refuses is a 400 as before; when Redis fails after the answer
/// began, the body ends short of its closing `]`, never as a whole answer with series missing,
/// and the next render is whole again; a client that leaves early ends the reading and its
/// turn.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_streamed_render_says_what_a_whole_evaluation_says() {
    use common::proxy::{FaultProxy, Mode};
    let (redis, port) = RedisServer::start_tcp();
    let proxy = FaultProxy::start(([127, 0, 0, 1], port).into(), 3).await;
    let now = unix_now() as i64;
    let minute = now - now % 60;
    // 600 counters of an hour of minutes (every 7th missing: nulls), 5 gauges: 36 300 points,
    // more than two parts.
    let mut c = redis.conn();
    let mut known = redis::cmd("ZADD");
    known.arg("known:");
    for i in 0..600 {
        let mut hset = redis::cmd("HSET");
        hset.arg(format!("count:60:many.{i}"));
        for k in (1..=60).filter(|k| (k + i) % 7 != 0) {
            hset.arg(minute - k * 60).arg(k * 1000 + i);
        }
        let () = hset.query(&mut c).unwrap();
        known.arg(0).arg(format!("60:many.{i}"));
    }
    let () = known.query(&mut c).unwrap();
    for g in 0..5 {
        let () = redis::cmd("HSET")
            .arg(format!("gauge:60:many.g{g}"))
            .arg(minute - 120)
            .arg(format!("{g}.25"))
            .query(&mut c)
            .unwrap();
        let () = redis::cmd("ZADD")
            .arg("known:gauge:")
            .arg(0)
            .arg(format!("60:many.g{g}"))
            .query(&mut c)
            .unwrap();
    }
    let agent = TestAgent::start(Config {
        cleaner_enabled: false,
        redis: format!("redis://{}/0", proxy.addr),
        ..test_config(&redis)
    });
    let at = (minute + 30).to_string();
    let render = |targets: &[&str], more: &[(&str, &str)]| -> String {
        let mut query = vec![("from", "-1h"), ("now", at.as_str()), ("format", "json")];
        query.extend(targets.iter().map(|t| ("target", *t)));
        query.extend_from_slice(more);
        let query = serde_urlencoded::to_string(&query).unwrap();
        let (status, _, body) = http_request(agent.http, "POST", "/graphite/render", &query);
        assert_eq!(status, 200, "{body}");
        body
    };
    let whole = render(&["many.*"], &[]);
    let answer: Value = serde_json::from_str(&whole).unwrap();
    let answer = answer.as_array().unwrap();
    assert_eq!(answer.len(), 605);
    let many5 = answer.iter().find(|s| s["target"] == "many.5").unwrap();
    let points: Vec<Option<f64>> = many5["datapoints"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p[0].as_f64())
        .collect();
    let want: Vec<Option<f64>> = (0..60)
        .rev()
        .map(|k| (k > 0 && (k + 5) % 7 != 0).then(|| (k * 1000 + 5) as f64))
        .collect();
    assert_eq!(points, want, "many.5, oldest first");
    for (targets, grouped, more) in [
        (&["many.*"][..], "group(many.*)", &[][..]),
        (&["many.*"], "group(many.*)", &[("maxDataPoints", "7")][..]),
        (&["many.*"], "group(many.*)", &[("noNullPoints", "1")][..]),
        (&["many.1*", "many.g*"], "group(many.1*, many.g*)", &[]),
        (&["nothing.*"], "group(nothing.*)", &[]),
        (&["nothing.*", "many.g1"], "group(nothing.*, many.g1)", &[]),
        // Functions that treat each series alone are applied a part at a time.
        (
            &["aliasByNode(many.*, 1)"],
            "group(aliasByNode(many.*, 1))",
            &[],
        ),
        (
            &["scale(perSecond(many.*), 2)"],
            "group(scale(perSecond(many.*), 2))",
            &[("maxDataPoints", "7")],
        ),
        (
            &["nonNegativeDerivative(keepLastValue(many.*))"],
            "group(nonNegativeDerivative(keepLastValue(many.*)))",
            &[("noNullPoints", "1")],
        ),
        (
            &["alias(many.1*, 'x')", "many.g*"],
            "group(alias(many.1*, 'x'), many.g*)",
            &[],
        ),
        (
            &[r"aliasSub(many.*, 'y\.(\d)', 'n\1')"],
            r"group(aliasSub(many.*, 'y\.(\d)', 'n\1'))",
            &[],
        ),
        (
            &[
                "transformNull(aliasByMetric(nothing.*))",
                "offset(many.g1, -1)",
            ],
            "group(transformNull(aliasByMetric(nothing.*)), offset(many.g1, -1))",
            &[],
        ),
        // Other functions' targets are evaluated whole, in their places among the parts.
        (
            &["sumSeries(many.1*)", "aliasByNode(many.*, 1)", "many.g*"],
            "group(sumSeries(many.1*), aliasByNode(many.*, 1), many.g*)",
            &[("maxDataPoints", "7")],
        ),
        (
            &["many.2*", "highestMax(many.*, 3)", "nothing.*", "many.g1"],
            "group(many.2*, highestMax(many.*, 3), nothing.*, many.g1)",
            &[],
        ),
        (
            &["sumSeries(nothing.*)", "constantLine(5)"],
            "group(sumSeries(nothing.*), constantLine(5))",
            &[],
        ),
    ] {
        assert_eq!(
            render(targets, more),
            render(&[grouped], more),
            "{targets:?} {more:?}"
        );
    }
    assert_eq!(render(&["nothing.*"], &[]), "[]");
    // A function's argument it refuses is the request's error, before any series is read.
    let refused = |target: &str| {
        let query = serde_urlencoded::to_string([("target", target), ("from", "-1h")]).unwrap();
        let (status, _, body) = http_request(agent.http, "POST", "/graphite/render", &query);
        (status, body)
    };
    let (status, body) = refused("log(many.*, 1)");
    assert_eq!(status, 400, "{body}");
    assert_eq!((status, body), refused("group(log(many.*, 1))"));
    // Redis's connection cut whenever the last part is asked (its last series, `many.99`): the
    // first part was read before the answer began, so the answer is a 200 that ends short.
    proxy.set_mode(Mode::CutWritesWith(b"count:60:many.99\r\n"));
    for (targets, first) in [
        (&["many.*"][..], "many.0"),
        (&["scale(many.*, 1)"], "scale(many.0,1)"),
        (&["sumSeries(many.g*)", "many.*"], "sumSeries(many.g*)"),
    ] {
        let mut query = vec![("from", "-1h"), ("now", at.as_str())];
        query.extend(targets.iter().map(|t| ("target", *t)));
        let query = serde_urlencoded::to_string(query).unwrap();
        let target = targets.join(", ");
        let raw = raw_response(agent.http, &format!("/graphite/render?{query}"));
        assert!(
            raw.starts_with("HTTP/1.1 200"),
            "{target}: {}",
            &raw[..raw.len().min(200)]
        );
        assert!(
            raw.contains(&format!("\"target\": \"{first}\"")),
            "{target}: the first part was sent"
        );
        assert!(
            !raw.contains("many.99"),
            "{target}: the failed part was not"
        );
        assert!(
            !raw.ends_with("\r\n0\r\n\r\n") && !raw.trim_end().ends_with(']'),
            "{target}: the body ends short: {}",
            &raw[raw.len().saturating_sub(200)..]
        );
    }
    assert!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst) >= 3);
    proxy.set_mode(Mode::Pass);
    let query =
        serde_urlencoded::to_string([("target", "many.*"), ("from", "-1h"), ("now", &at)]).unwrap();
    assert_eq!(render(&["many.*"], &[]), whole, "whole again");
    // Clients that leave after the answer's first bytes: each render's reading ends with its
    // body and hands back its turn (four API requests at once; a turn kept would leave the
    // next request waiting 5 s for a 503).
    for _ in 0..6 {
        let mut s = std::net::TcpStream::connect(agent.http).unwrap();
        let request = format!(
            "GET /graphite/render?{query} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n"
        );
        std::io::Write::write_all(&mut s, request.as_bytes()).unwrap();
        let mut head = [0u8; 1024];
        std::io::Read::read_exact(&mut s, &mut head).unwrap();
        assert!(head.starts_with(b"HTTP/1.1 200"));
    }
    assert_eq!(
        render(&["many.*"], &[]),
        whole,
        "after the clients that left"
    );
    drop(agent);
}

/// A response as it came, however it ended (a connection cut in the body is no error here).
fn raw_response(addr: SocketAddr, path: &str) -> String {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))
        .unwrap();
    let request = format!("GET {path} HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n");
    s.write_all(request.as_bytes()).unwrap();
    let mut raw = Vec::new();
    let mut buf = [0u8; 65536];
    while let Ok(n) = s.read(&mut buf) {
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
    }
    String::from_utf8_lossy(&raw).into_owned()
}
