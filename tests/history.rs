//! A long archive in fixed slots (docs/layout.md, "History: fixed slots"): the cleaner moves the
//! slices older than the book's newest 120 out of the hash into blocks, the Graphite API reads
//! them as it read the hash, a late write into a moved slice is added once, a hash written by an
//! earlier release moves over several passes while the agent writes, and the default layout
//! is the book's.

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use common::*;
use statsd_redis::config::Config;
use statsd_redis::retention::Retention;
use statsd_redis::store::Cleaner;
use statsd_redis::store::cleaner::PassReport;
use statsd_redis::store::clock::Clock;
use statsd_redis::store::history::{self, Geometry, HASH_SLICES};
use statsd_redis::telemetry::Telemetry;

/// A second of minutes for an hour (3600 slices: the small cut) and of minutes for 90 days
/// (129 600: the large one).
const SCHEMA: &str = "1s:1h,1m:90d";

fn cmd<T: redis::FromRedisValue>(redis: &RedisServer, c: &mut redis::Cmd) -> T {
    c.query(&mut redis.conn()).unwrap()
}

/// A cleaner of `store` under `retention` holding the lease, every precision due in its first
/// pass.
async fn leased(store: statsd_redis::store::Store, retention: &Retention) -> Cleaner {
    let mut c = Cleaner::new(
        store,
        "test".into(),
        Duration::from_secs(1),
        retention,
        Arc::new(Telemetry::new()),
    );
    assert!(c.hold_lease().await.unwrap());
    c
}

async fn pass(redis: &RedisServer, now: u64) -> PassReport {
    let mut c = leased(redis.store(), &Retention::parse(SCHEMA).unwrap()).await;
    let report = c.pass(now).await.unwrap();
    assert!(report.completed);
    report
}

/// The first few points where `got` and `want` differ, or none.
fn differences(got: &[(u64, Option<f64>)], want: &[(u64, Option<f64>)]) -> Vec<String> {
    let mut out: Vec<String> = got
        .iter()
        .zip(want)
        .filter(|(g, w)| g != w)
        .take(5)
        .map(|(g, w)| format!("{g:?} where {w:?} was wanted"))
        .collect();
    if got.len() != want.len() {
        out.push(format!("{} points, {} wanted", got.len(), want.len()));
    }
    out
}

/// `render`'s points equal `want`'s, or the first differences.
macro_rules! same {
    ($got:expr, $want:expr, $($what:tt)*) => {{
        let d = differences(&$got, &$want);
        assert!(d.is_empty(), "{}: {d:#?}", format!($($what)*));
    }};
}

/// The Graphite API's points of `target` from `from` to `until`, as (time, value).
fn render(agent: &TestAgent, target: &str, from: u64, until: u64) -> Vec<(u64, Option<f64>)> {
    let v = curl_json(&format!(
        "http://{}/graphite/render?target={target}&from={from}&until={until}&format=json",
        agent.http
    ));
    v[0]["datapoints"]
        .as_array()
        .unwrap_or_else(|| panic!("{target}: {v}"))
        .iter()
        .map(|p| (p[1].as_u64().unwrap(), p[0].as_f64()))
        .collect()
}

/// A render's value at `slice`.
fn render_at(points: &[(u64, Option<f64>)], slice: u64) -> Option<f64> {
    points
        .iter()
        .find(|(s, _)| *s == slice)
        .and_then(|(_, v)| *v)
}

/// The points of a render that hold a value, by time.
fn written(points: Vec<(u64, Option<f64>)>) -> BTreeMap<u64, f64> {
    points
        .into_iter()
        .filter_map(|(at, v)| Some((at, v?)))
        .collect()
}

/// A JSON API answer's `samples`, by slice.
fn samples_of(answer: &serde_json::Value) -> BTreeMap<u64, f64> {
    answer["samples"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"))
        .iter()
        .map(|s| (s[0].as_u64().unwrap(), s[1].as_f64().unwrap()))
        .collect()
}

fn config(redis: &RedisServer) -> Config {
    Config {
        retentions: SCHEMA.into(),
        cleaner_enabled: false,
        // Every precision written with each window, as the test reads it at once.
        coarse_write_secs: Some(0),
        ..test_config(redis)
    }
}

/// Sends `lines` in datagrams of 40, each taken into the open window, then closes it and waits
/// until the window of `second` is written.
async fn send_window(agent: &TestAgent, redis: &RedisServer, lines: &[String], second: u64) {
    for batch in lines.chunks(40) {
        agent.send_taken(batch.join("\n").as_bytes()).await;
    }
    agent.send_taken(b"h.tick:1|c").await;
    agent.tick();
    eventually(Duration::from_secs(10), "the window written", || {
        redis.get_counter("count:1:h.tick").contains_key(&second)
    })
    .await;
}

/// Counters and gauges stamped over sixty days: every slice the minutes' hash held is read back
/// the same from its blocks once the cleaner moved it, counts as sent; the hash keeps the newest
/// 120 minutes; a count sent late into a moved minute adds to it once, and a late gauge value
/// replaces its minute's; a second pass changes nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_slices_read_back_as_the_hash_held_them() {
    let redis = RedisServer::start();
    let t = unix_now() / 60 * 60 - 60;
    let agent = TestAgent::start_at(config(&redis), Clock::manual(Duration::from_secs(t)));
    // 700 counts over sixty days (some minutes twice), 300 gauge values on minutes of their own,
    // and a few within the last hour (the seconds' archive, and the hash's newest minutes).
    let mut sent: BTreeMap<u64, i64> = BTreeMap::new();
    let mut lines = Vec::new();
    for k in 1..=700u64 {
        let at = t - (k * 7_919) % (60 * 86_400) - 1;
        let n = (k % 13) as i64 + 1;
        *sent.entry(at / 60 * 60).or_default() += n;
        lines.push(format!("h.c:{n}|c|T{at}"));
    }
    for k in 1..=300u64 {
        let at = t - k * 17_280 - 30;
        lines.push(format!("h.g:{}|g|T{at}", k as f64 / 4.0));
    }
    for k in 1..=50u64 {
        let at = t - k * 61;
        *sent.entry(at / 60 * 60).or_default() += 1;
        lines.push(format!("h.c:1|c|T{at}"));
    }
    // A gauge of 130 neighbouring minutes: its hash keeps the newest 16 once moved.
    for k in 1..=130u64 {
        lines.push(format!("h.gn:{k}|g|T{}", t - k * 60 + 5));
    }
    send_window(&agent, &redis, &lines, t).await;
    let neighbours_before = render(&agent, "h.gn", t - 61 * 86_400, t);
    let known = neighbours_before.iter().filter(|p| p.1.is_some()).count();
    assert_eq!(known, 130);
    let from = t - 61 * 86_400;
    let counts_before = render(&agent, "h.c", from, t);
    let gauges_before = render(&agent, "h.g", from, t);
    let seconds_before = render(&agent, "h.c", t - 3000, t);
    let hash_before = redis.get_counter("count:60:h.c").len();
    // The JSON API's (and the CLI's) samples: the hash's, then with the blocks' too.
    let api = |path: &str| curl_json(&format!("http://{}/api/v1/{path}", agent.http));
    let api_counts = api("counter/h.c?precision=60");
    let api_gauges = api("gauge/h.g?precision=60");
    assert!(hash_before > 600, "{hash_before} minutes in the hash");
    // Every count sent, in its minute.
    let summed: BTreeMap<u64, i64> = counts_before
        .iter()
        .filter_map(|&(at, v)| Some((at, v? as i64)))
        .collect();
    assert_eq!(summed, sent);

    let report = pass(&redis, t + 1).await;
    assert!(
        report.slices_moved as usize > hash_before - 130,
        "{report:?}"
    );
    let keep_from = history::keep_from(t + 1, 60, history::Family::Counter);
    let left = redis.get_counter("count:60:h.c");
    assert!(
        left.len() <= HASH_SLICES as usize,
        "{} minutes left",
        left.len()
    );
    assert!(left.keys().all(|&s| s >= keep_from), "{left:?}");
    let gauge_keep = history::keep_from(t + 1, 60, history::Family::Gauge);
    let neighbours: Vec<u64> = cmd(&redis, redis::cmd("HKEYS").arg("gauge:60:h.gn"));
    assert_eq!(neighbours.len() as u64, history::GAUGE_HASH_SLICES - 1);
    assert!(
        neighbours.iter().all(|&s| s >= gauge_keep),
        "{neighbours:?}"
    );
    same!(
        render(&agent, "h.gn", t - 61 * 86_400, t),
        neighbours_before,
        "a gauge's minutes once moved"
    );
    let seconds = redis.get_counter("count:1:h.c");
    assert!(
        seconds
            .keys()
            .all(|&s| s >= history::keep_from(t + 1, 1, history::Family::Counter))
    );
    let blocks: Vec<String> = cmd(&redis, redis::cmd("KEYS").arg("history:*"));
    assert!(
        blocks
            .iter()
            .any(|b| b.starts_with("history:count:60:h.c:2008:")),
        "{blocks:?}"
    );
    assert!(
        blocks
            .iter()
            .any(|b| b.starts_with("history:gauge:60:h.g:2008:")),
        "{blocks:?}"
    );
    assert!(
        blocks
            .iter()
            .any(|b| b.starts_with("history:count:1:h.c:248:")),
        "{blocks:?}"
    );
    // A block is made whole at once, in its size class, and lives until its newest minute
    // leaves the 90 days.
    let large = blocks.iter().find(|b| b.contains(":2008:")).unwrap();
    let len: u64 = cmd(&redis, redis::cmd("STRLEN").arg(large));
    assert_eq!(len, history::LARGE.bytes());
    let used: u64 = cmd(&redis, redis::cmd("MEMORY").arg("USAGE").arg(large));
    assert!(used <= 16_384 + 150, "{large}: {used} bytes");
    let n: u64 = large.rsplit(':').next().unwrap().parse().unwrap();
    let ends = Geometry { slots: 2008 }.start(60, n + 1) + 90 * 86_400;
    let ttl: i64 = cmd(&redis, redis::cmd("TTL").arg(large));
    assert!(
        (ttl - (ends as i64 - (t + 1) as i64)).abs() <= 5,
        "{large}: ttl {ttl}"
    );

    same!(
        render(&agent, "h.c", from, t),
        counts_before,
        "counts once moved"
    );
    assert_eq!(api("counter/h.c?precision=60"), api_counts);
    assert_eq!(api("gauge/h.g?precision=60"), api_gauges);
    let samples: BTreeMap<u64, i64> = api_counts["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| (s[0].as_u64().unwrap(), s[1].as_i64().unwrap()))
        .collect();
    assert_eq!(samples, sent);
    // A range: exactly the slices that start in it, and the blocks it spans, not the 60 days'.
    let getranges = || redis.calls("getrange");
    let (a, b) = (t - 30 * 86_400 + 60, t - 29 * 86_400);
    let before = getranges();
    let day = api(&format!("counter/h.c?precision=60&from={a}&until={b}"));
    let day_reads = getranges() - before;
    let before = getranges();
    api("counter/h.c?precision=60");
    let whole_reads = getranges() - before;
    let in_day: BTreeMap<u64, i64> = sent.range(a..=b).map(|(k, v)| (*k, *v)).collect();
    assert!(in_day.len() > 5, "{in_day:?}");
    let day: BTreeMap<u64, i64> = samples_of(&day)
        .into_iter()
        .map(|(k, v)| (k, v as i64))
        .collect();
    assert_eq!(day, in_day);
    // The CLI's, with a time back from now, as its flags take it.
    let out = run_ok(
        bin().args([
            "get",
            "--json",
            "counter",
            "h.c",
            "--precision",
            "60",
            "--from",
            &a.to_string(),
            "--until",
            &format!("-{}", unix_now() - b),
            "--redis",
            &redis.url(),
            "--retentions",
            SCHEMA,
        ]),
        "statsd-redis get counter",
    );
    let cli: Vec<(u64, i64)> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(cli.into_iter().collect::<BTreeMap<_, _>>(), in_day);
    assert!(
        day_reads <= 2 && whole_reads >= 40,
        "a day read {day_reads} blocks, the whole retention {whole_reads}"
    );
    let gauge_day = samples_of(&api(&format!("gauge/h.g?precision=60&from={a}&until={b}")));
    let gauges_in_day: BTreeMap<u64, f64> = samples_of(&api_gauges)
        .into_iter()
        .filter(|(k, _)| (a..=b).contains(k))
        .collect();
    assert!(!gauges_in_day.is_empty());
    assert_eq!(gauge_day, gauges_in_day);
    // A range with no slice is not found; one upside down, or a time that is none, is refused.
    let status = |path: &str| {
        let url = format!("http://{}/api/v1/{path}", agent.http);
        let out = std::process::Command::new("curl")
            .args(["-s", "-o", "/dev/null", "-w", "%{http_code}", &url])
            .output()
            .unwrap();
        String::from_utf8(out.stdout).unwrap()
    };
    let (old, older) = (t - 80 * 86_400, t - 79 * 86_400);
    assert_eq!(
        status(&format!(
            "counter/h.c?precision=60&from={old}&until={older}"
        )),
        "404"
    );
    assert_eq!(
        status(&format!("counter/h.c?precision=60&from={b}&until={a}")),
        "400"
    );
    assert_eq!(status("counter/h.c?precision=60&from=yesterday"), "400");
    same!(
        render(&agent, "h.g", from, t),
        gauges_before,
        "gauges once moved"
    );
    same!(
        render(&agent, "h.c", t - 3000, t),
        seconds_before,
        "seconds once moved"
    );

    // Late: a count into a moved minute, a gauge value into another.
    // (A gauge value older than the gauge's latest is written where no later value is: its
    // own minute.)
    let (late_count, late_gauge) = (*sent.keys().next().unwrap(), t - 5 * 17_280 - 30);
    send_window(
        &agent,
        &redis,
        &[
            format!("h.c:5|c|T{}", late_count + 7),
            format!("h.g:42.5|g|T{late_gauge}"),
        ],
        t + 1,
    )
    .await;
    let at = |points: &[(u64, Option<f64>)], s: u64| points.iter().find(|p| p.0 == s).unwrap().1;
    let counts_late = render(&agent, "h.c", from, t);
    let gauge_minute = late_gauge / 60 * 60;
    assert_eq!(
        at(&counts_late, late_count),
        Some((sent[&late_count] + 5) as f64)
    );
    let gauges_late = render(&agent, "h.g", from, t);
    assert_eq!(at(&gauges_late, gauge_minute), Some(42.5));
    // The two, and the gauge's latest value, which the agent wrote again at its own minute
    // with the late one's window (tests/timestamps.rs); at the first pass's time, so that no
    // other slice has aged out of a hash since.
    let report = pass(&redis, t + 1).await;
    assert_eq!(report.slices_moved, 3, "{report:?}");
    same!(
        render(&agent, "h.c", from, t),
        counts_late,
        "the late count moved"
    );
    same!(
        render(&agent, "h.g", from, t),
        gauges_late,
        "the late gauge moved"
    );
    let hash = redis.get_counter("count:60:h.c");
    assert!(!hash.contains_key(&late_count));
    let gauges: Vec<u64> = cmd(&redis, redis::cmd("HKEYS").arg("gauge:60:h.g"));
    assert!(gauges.iter().all(|&s| s >= keep_from), "{gauges:?}");
    // Nothing is left to move: a pass again changes nothing.
    assert_eq!(pass(&redis, t + 1).await.slices_moved, 0);
    same!(render(&agent, "h.c", from, t), counts_late, "a pass again");
    agent.stop().await;
}

/// A minutes' hash of 50 000 slices, as the previous release wrote it under a 90-day retention,
/// moves into blocks over passes (at most 20 000 slices a call) while the agent keeps writing
/// the series: after each pass, every slice reads back, the agent's counts added once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_earlier_releases_long_hash_moves_while_the_series_is_written() {
    let redis = RedisServer::start();
    let t = unix_now() / 60 * 60 - 60;
    let mut conn = redis.conn();
    let mut old: BTreeMap<u64, i64> = BTreeMap::new();
    for batch in (1..=50_000u64).collect::<Vec<_>>().chunks(5000) {
        let mut c = redis::cmd("HSET");
        c.arg("count:60:m");
        for k in batch {
            let slice = t - k * 60;
            old.insert(slice, (k % 97) as i64 + 1);
            c.arg(slice).arg((k % 97) as i64 + 1);
        }
        c.query::<()>(&mut conn).unwrap();
    }
    cmd::<()>(&redis, redis::cmd("ZADD").arg("known:").arg(0).arg("60:m"));
    let agent = TestAgent::start_at(config(&redis), Clock::manual(Duration::from_secs(t)));
    let from = t - 50_001 * 60;
    let before = render(&agent, "m", from, t);
    let want = |extra: i64| -> Vec<(u64, Option<f64>)> {
        before
            .iter()
            .map(|&(s, v)| match (s == t, v) {
                (true, v) => (s, Some(v.unwrap_or(0.0) + extra as f64)),
                (false, v) => (s, v),
            })
            .collect()
    };
    assert_eq!(before.iter().filter(|p| p.1.is_some()).count(), 50_000);
    let mut written = 0;
    let mut second = t;
    for round in 1..=3 {
        // The agent writes the current minute between passes.
        send_window(&agent, &redis, &["m:3|c".to_string()], second).await;
        second += 1;
        written += 3;
        let report = pass(&redis, second).await;
        let left: u64 = cmd(&redis, redis::cmd("HLEN").arg("count:60:m"));
        if round == 1 {
            assert_eq!(report.slices_moved, 20_000, "{report:?}");
        }
        same!(
            render(&agent, "m", from, t),
            want(written),
            "after pass {round}, {left} left"
        );
    }
    let left = redis.get_counter("count:60:m");
    assert!(left.len() <= HASH_SLICES as usize, "{}", left.len());
    assert_eq!(
        redis.history("count:60:m").values().sum::<f64>(),
        (old.values().sum::<i64>() + written) as f64
    );
    agent.stop().await;
}

/// The migration killed halfway: a 40 000-minute hash as the previous release wrote it, the
/// agent (the binary) counting into its current minute; SIGKILL once the cleaner's first call
/// moved 20 000 slices; a new agent moves the rest at its start and counts on. Every slice
/// reads back, each count once: a call moves its slices and deletes their fields atomically,
/// so a kill between two calls leaves each slice in the hash or in its block.
#[test]
fn the_migration_killed_halfway_loses_no_slice() {
    let redis = RedisServer::start();
    let t = unix_now() / 60 * 60 - 120;
    let mut conn = redis.conn();
    let mut total = 0i64;
    for batch in (1..=40_000u64).collect::<Vec<_>>().chunks(5000) {
        let mut c = redis::cmd("HSET");
        c.arg("count:60:mig");
        for k in batch {
            total += (k % 89) as i64 + 1;
            c.arg(t - k * 60).arg((k % 89) as i64 + 1);
        }
        c.query::<()>(&mut conn).unwrap();
    }
    cmd::<()>(
        &redis,
        redis::cmd("ZADD").arg("known:").arg(0).arg("60:mig"),
    );
    // A lease of a second, which the killed agent's cleaner leaves behind; every start's first
    // pass visits every precision.
    let flags = [
        "--retentions",
        SCHEMA,
        "--coarse-write-secs",
        "0",
        "--cleaner-interval-secs",
        "1",
    ];
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let hlen = || -> u64 { cmd(&redis, redis::cmd("HLEN").arg("count:60:mig")) };
    let sum = || -> f64 { redis.history("count:60:mig").values().sum() };
    let count_until = |wanted: f64| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while sum() != wanted {
            assert!(
                std::time::Instant::now() < deadline,
                "{} of {wanted}",
                sum()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };
    let (agent, udp, _) = spawn_agent(&redis.url(), &flags);
    let mut agent = Killed(agent);
    socket.send_to(b"mig:5|c", ("127.0.0.1", udp)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while hlen() > 40_000 - 19_000 {
        assert!(std::time::Instant::now() < deadline, "no move: {}", hlen());
        std::thread::sleep(Duration::from_millis(20));
    }
    count_until((total + 5) as f64);
    agent.kill();
    assert!(hlen() > 15_000, "the first call only: {} fields", hlen());
    let (agent, udp, http) = spawn_agent(&redis.url(), &flags);
    let mut agent = Killed(agent);
    socket.send_to(b"mig:7|c", ("127.0.0.1", udp)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while hlen() > HASH_SLICES + 2 {
        assert!(
            std::time::Instant::now() < deadline,
            "not moved: {}",
            hlen()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    count_until((total + 12) as f64);
    let answer = curl_json(&format!(
        "http://127.0.0.1:{http}/graphite/render?target=mig&from={}&format=json",
        t - 40_001 * 60
    ));
    let points: Vec<f64> = answer[0]["datapoints"]
        .as_array()
        .unwrap_or_else(|| panic!("{answer}"))
        .iter()
        .filter_map(|p| p[0].as_f64())
        .collect();
    // Every old minute, and the one or two the agents counted into.
    assert!(
        (40_001..=40_002).contains(&points.len()),
        "{} minutes",
        points.len()
    );
    assert_eq!(points.iter().sum::<f64>(), (total + 12) as f64);
    let (code, log, _) = agent.terminate();
    assert_eq!(code, Some(0), "{log}");
}

/// The book's layout has no blocks: with the default configuration no precision is cut into
/// them (so the cleaner's script is given no cuts and trims as the book's `clean_counters`);
/// carbon's spelling cuts each archive longer than 120 slices.
#[test]
fn the_books_layout_has_no_blocks() {
    let book = Config::default().retention();
    assert!(book.precisions().iter().all(|&p| book.history(p).is_none()));
    assert_eq!(book.encode_history(), "");
    let carbon = Retention::parse(SCHEMA).unwrap();
    assert_eq!(carbon.encode_history(), "1:248,60:2008");
}

/// A count that would take its slot past the 64-bit range stays in the hash (its field is not
/// deleted, so nothing is lost), and the slot keeps what it held; the rest of the hash moves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_count_that_would_overflow_its_slot_stays_in_the_hash() {
    let redis = RedisServer::start();
    let now = unix_now() / 60 * 60;
    let (old, other) = (now - 86_400, now - 86_460);
    let hset = |slice: u64, n: i64| {
        cmd::<()>(
            &redis,
            redis::cmd("HSET").arg("count:60:big").arg(slice).arg(n),
        );
    };
    hset(old, i64::MAX - 10);
    hset(now, 1);
    cmd::<()>(
        &redis,
        redis::cmd("ZADD").arg("known:").arg(0).arg("60:big"),
    );
    assert_eq!(pass(&redis, now).await.slices_moved, 1);
    hset(old, 11);
    hset(other, 7);
    assert_eq!(pass(&redis, now).await.slices_moved, 1);
    let hash = redis.get_counter("count:60:big");
    assert_eq!(hash.get(&old), Some(&11), "{hash:?}");
    assert!(!hash.contains_key(&other));
    assert_eq!(
        slot_value(&redis, "count:60:big", old, history::Family::Counter),
        Some((i64::MAX - 10) as f64)
    );
}

/// What the slot of minute `at` holds in the block of `hash` (a minute hash of the long cut),
/// its hash aside.
fn slot_value(redis: &RedisServer, hash: &str, at: u64, family: history::Family) -> Option<f64> {
    let g = history::LARGE;
    let (block, slot) = g.locate(60, at);
    let key = history::block_key(&statsd_redis::store::Keys::new(""), hash, g, block);
    let bytes: Vec<u8> = cmd(redis, redis::cmd("GET").arg(&key));
    let (a, b) = Geometry::byte_range(slot, slot);
    Geometry::read(slot, slot, &bytes[a as usize..=b as usize], family)[0]
}

/// A reader reads a long archive's hash, then its blocks, and the cleaner (another client) may
/// move slices in between: the fault held here, the reader's `GETRANGE`s held back by a proxy
/// while a pass moves the older minutes. A render's reads, and the JSON API's (and so the
/// CLI's) of a counter, are one transaction, so a moved count is read once, where a read of the
/// hash before the move and of the block after it would count it twice.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_between_a_renders_hash_and_block_reads_counts_once() {
    read_across_a_move(2, |across| render_totals(across, "race.c.*", 86_400)).await;
}

/// A render of more block reads than one pipeline takes (2 048: here 40 series, all read at
/// once for `sortByName`, over the 90 days their minutes are kept, 67 reads each) reads each
/// series' hash and blocks in a transaction of its own, as in a cluster (`tests/cluster.rs`
/// reads them there, in each series' slot).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_between_a_long_renders_reads_counts_once() {
    read_across_a_move(40, |across| {
        render_totals(across, "sortByName(race.c.*)", 90 * 86_400)
    })
    .await;
}

/// Without the bulk reader (Sentinel's and TLS's topologies): the Graphite API's source over
/// the redis crate's connection reads its series' hashes and blocks in one transaction.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_between_the_crate_readers_hash_and_block_reads_counts_once() {
    read_across_a_move(2, |across| {
        use statsd_redis::graphite::source::{Remembered, Source};
        let config = Config {
            redis: across.redis.clone(),
            ..across.config.clone()
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        runtime.block_on(async {
            let store = statsd_redis::store::Store::open(&config).unwrap();
            let remembered = Remembered::default();
            let now = across.t as i64;
            let conn = store.connect().await.unwrap();
            let mut source = Source::new(conn, store.keys(), &config, &remembered);
            let leaves = source.leaves("race.c.*").await.unwrap();
            let series = source.fetch_all(&leaves, now - 86_400, now, now).await;
            (series.unwrap().iter())
                .map(|s| (s.name.clone(), s.values.iter().flatten().sum()))
                .collect()
        })
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_move_between_the_json_apis_hash_and_block_reads_counts_once() {
    read_across_a_move(1, |across| {
        let answer = curl_json(&format!(
            "http://{}/api/v1/counter/race.c.0?precision=60",
            across.http
        ));
        BTreeMap::from([("race.c.0".to_string(), samples_of(&answer).values().sum())])
    })
    .await;
}

/// What a read across a move is given: the agent's HTTP address, its configuration, the URL
/// of the Redis it reads (through the proxy), and its time.
struct Across {
    http: std::net::SocketAddr,
    config: Config,
    redis: String,
    t: u64,
}

/// The sum of each series' points in a render of `target` over the `range` seconds before `t`,
/// by its name.
fn render_totals(across: &Across, target: &str, range: u64) -> BTreeMap<String, f64> {
    let url = format!(
        "http://{}/graphite/render?target={target}&from={}&until={}&format=json",
        across.http,
        across.t - range,
        across.t
    );
    let rendered = curl_json(&url);
    (rendered
        .as_array()
        .unwrap_or_else(|| panic!("{url}"))
        .iter())
    .map(|s| {
        let points = s["datapoints"].as_array().unwrap();
        let sum = points.iter().filter_map(|p| p[0].as_f64()).sum();
        (s["target"].as_str().unwrap().to_string(), sum)
    })
    .collect()
}

/// 200 minutes of counts for each of `series` series `race.c.<n>`, each series' its own (the
/// hash's newest 120 stay, the older 80 move), read by `total` (each series' sum, by name)
/// before, across and after a pass that moves them.
async fn read_across_a_move(series: u64, total: fn(&Across) -> BTreeMap<String, f64>) {
    use common::proxy::{FaultProxy, Mode};
    let (redis, port) = RedisServer::start_tcp();
    let proxy = FaultProxy::start(([127, 0, 0, 1], port).into(), 3).await;
    let t = unix_now() / 60 * 60 - 60;
    let via_proxy = Config {
        redis: format!("redis://{}/0", proxy.addr),
        ..config(&redis)
    };
    let agent = TestAgent::start_at(via_proxy.clone(), Clock::manual(Duration::from_secs(t)));
    let count = |n: u64, k: u64| (k % 7 + 1) * (n + 1);
    let lines: Vec<String> = (0..series)
        .flat_map(|n| {
            (1..=200u64).map(move |k| format!("race.c.{n}:{}|c|T{}", count(n, k), t - k * 60))
        })
        .collect();
    send_window(&agent, &redis, &lines, t).await;
    let across = Arc::new(Across {
        http: agent.http,
        redis: via_proxy.redis.clone(),
        config: via_proxy,
        t,
    });
    let read = move || {
        let across = across.clone();
        tokio::task::spawn_blocking(move || total(&across))
    };
    let sent: BTreeMap<String, f64> = (0..series)
        .map(|n| {
            let sum: u64 = (1..=200u64).map(|k| count(n, k)).sum();
            (format!("race.c.{n}"), sum as f64)
        })
        .collect();
    assert_eq!(read().await.unwrap(), sent);

    proxy.set_mode(Mode::HoldFrom(b"GETRANGE"));
    let reading = read();
    eventually(
        Duration::from_secs(10),
        "the reader's block reads held",
        || !proxy.held.lock().unwrap().is_empty(),
    )
    .await;
    let report = pass(&redis, t + 1).await;
    assert!(report.slices_moved >= 79 * series, "{report:?}");
    proxy.release();
    assert_eq!(reading.await.unwrap(), sent, "a read across the move");
    assert_eq!(read().await.unwrap(), sent);
    agent.stop().await;
}

/// A gauge's moved value keeps its `f64` bits, whatever they are: negatives, the type's edges,
/// subnormals, `-0` and the infinities, as the hash's text gave them; and a count keeps its
/// value up to the edges of the 64-bit range, read back from its slot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn moved_values_keep_their_bits_at_the_edges_of_their_types() {
    let redis = RedisServer::start();
    let now = unix_now() / 60 * 60;
    let gauges = [
        "-0.1",
        "-1e300",
        "2.2250738585072014e-308",
        "5e-324",
        "-0",
        "1.7976931348623157e308",
        "-1.7976931348623157e308",
        "123456789.123",
        "inf",
        "-inf",
        "0.5",
        "-4294967296.0000005",
    ];
    let counts = [
        "1",
        "-1",
        "999999999999999999",
        "-99999999999999999",
        "9223372036854775807",
        "-9223372036854775808",
        "4294967296",
        "-4294967297",
    ];
    // Old minutes, neighbours and not, in the blocks of two cuts' worth of a day ago.
    let slice = |k: usize| now - 86_400 - (k as u64) * 60 * if k.is_multiple_of(2) { 1 } else { 7 };
    for (k, v) in gauges.iter().enumerate() {
        cmd::<()>(
            &redis,
            redis::cmd("HSET").arg("gauge:60:bits").arg(slice(k)).arg(v),
        );
    }
    for (k, v) in counts.iter().enumerate() {
        cmd::<()>(
            &redis,
            redis::cmd("HSET").arg("count:60:wide").arg(slice(k)).arg(v),
        );
    }
    for (hash, index, member) in [
        ("gauge:60:bits", "known:gauge:", "60:bits"),
        ("count:60:wide", "known:", "60:wide"),
    ] {
        cmd::<()>(&redis, redis::cmd("HSET").arg(hash).arg(now).arg("1"));
        cmd::<()>(&redis, redis::cmd("ZADD").arg(index).arg(0).arg(member));
    }
    let report = pass(&redis, now).await;
    assert_eq!(
        report.slices_moved as usize,
        gauges.len() + counts.len(),
        "{report:?}"
    );
    for (k, v) in gauges.iter().enumerate() {
        let want: f64 = v.parse().unwrap();
        let got = slot_value(&redis, "gauge:60:bits", slice(k), history::Family::Gauge)
            .unwrap_or_else(|| panic!("{v}: no value"));
        assert_eq!(got.to_bits(), want.to_bits(), "{v}: read {got}");
    }
    for (k, v) in counts.iter().enumerate() {
        let want: i64 = v.parse().unwrap();
        let got = slot_value(&redis, "count:60:wide", slice(k), history::Family::Counter);
        assert_eq!(got, Some(want as f64), "{v}");
    }
    assert_eq!(redis.get_counter("count:60:wide").len(), 1);
}

/// Between full passes a visit of a long archive's hash is quick (trim.lua): it asks only for
/// the slices that left the newest 120 since the pass before. What it leaves waits for the next
/// full pass (every 60th, and the first after the lease came back): a late count older than
/// that (into a slice already moved: the two parts add, read so meanwhile) and a series' only
/// slice (the newest keeps its hash). A hash holding more than the newest and those is read
/// whole at once (an earlier release's).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quick_visit_moves_what_left_the_hash_and_a_full_pass_the_rest() {
    let redis = RedisServer::start();
    let now = unix_now() / 60 * 60 - 3600;
    let minute = |k: u64| now - k * 60;
    let hset = |key: &str, slice: u64, n: i64| {
        cmd::<()>(&redis, redis::cmd("HSET").arg(key).arg(slice).arg(n));
    };
    let index = |member: &str| {
        cmd::<()>(&redis, redis::cmd("ZADD").arg("known:").arg(0).arg(member));
    };
    for k in 0..125 {
        hset("count:60:q", minute(k), k as i64 + 1);
    }
    hset("count:60:r", minute(118), 5);
    index("60:q");
    index("60:r");
    // Minutes due at every pass.
    let mut c = Cleaner::new(
        redis.store(),
        "test".into(),
        Duration::from_secs(60),
        &Retention::parse(SCHEMA).unwrap(),
        Arc::new(Telemetry::new()),
    );
    assert!(c.hold_lease().await.unwrap());
    let full = c.pass(now).await.unwrap();
    assert_eq!(full.slices_moved, 5, "the full pass: q's five oldest");
    let hlen = |key: &str| cmd::<u64>(&redis, redis::cmd("HLEN").arg(key));
    assert_eq!(hlen("count:60:q"), HASH_SLICES);

    // Three minutes on: three new ones; a late count into a moved minute and one into a minute
    // long before the quick visit's; an earlier release's hash of 200 minutes.
    let later = now + 180;
    for k in 1..=3 {
        hset("count:60:q", now + k * 60, 1);
    }
    hset("count:60:q", minute(122), 1000);
    hset("count:60:q", minute(200), 99);
    for k in 0..200 {
        hset("count:60:s", minute(k), 1);
    }
    index("60:s");
    let agent = TestAgent::start_at(config(&redis), Clock::manual(Duration::from_secs(later)));
    let late = |agent: &TestAgent| {
        written(render(agent, "q", minute(205), minute(115)))
            .into_iter()
            .filter(|(at, _)| [minute(122), minute(200)].contains(at))
            .collect::<Vec<_>>()
    };
    // Minute 122 held 123 and went into its block: the late 1000 adds to it.
    let want = vec![(minute(200), 99.0), (minute(122), 1123.0)];
    assert_eq!(late(&agent), want, "read before the quick visit");
    let quick = c.pass(later).await.unwrap();
    // The hash keeps minute 116 (three minutes on: `later`'s newest 120) to minute 0 of s.
    assert_eq!(
        quick.slices_moved,
        3 + (200 - 117),
        "q's three that left; s's older than the newest 120, read whole"
    );
    assert_eq!(hlen("count:60:s"), 117);
    assert_eq!(hlen("count:60:q"), HASH_SLICES + 2, "the late ones wait");
    assert_eq!(hlen("count:60:r"), 1, "r's only minute stays");
    assert_eq!(late(&agent), want, "read after the quick visit");

    // Quick visits move nothing more; the 60th pass is full.
    for pass in 2..60 {
        assert_eq!(c.pass(later).await.unwrap().slices_moved, 0, "pass {pass}");
    }
    assert_eq!(
        c.pass(later).await.unwrap().slices_moved,
        2,
        "the full pass"
    );
    assert_eq!(hlen("count:60:q"), HASH_SLICES);
    assert_eq!(hlen("count:60:r"), 1, "r's only minute still stays");
    assert_eq!(late(&agent), want, "read after the full pass");

    // The lease given up and taken again (another agent may have cleaned meanwhile): the next
    // pass reads every hash whole.
    hset("count:60:q", minute(300), 1);
    assert_eq!(
        c.pass(later).await.unwrap().slices_moved,
        0,
        "a quick visit"
    );
    c.release_lease().await.unwrap();
    assert!(c.hold_lease().await.unwrap());
    assert_eq!(
        c.pass(later).await.unwrap().slices_moved,
        1,
        "whole once the lease came back"
    );
    agent.stop().await;
}

/// Under Sentinel the Graphite API reads through the redis crate, not the bulk reader: a moved
/// minute reads back the same there too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn under_sentinel_moved_slices_read_back_the_same() {
    let sentinels = common::topology::Sentinels::start();
    let t = unix_now() / 60 * 60 - 60;
    let config = Config {
        udp: vec!["127.0.0.1:0".parse().unwrap()],
        http: "127.0.0.1:0".parse().unwrap(),
        redis_mode: statsd_redis::config::RedisMode::Sentinel,
        redis_sentinels: sentinels.sentinel_addrs(),
        redis_master_name: sentinels.master_name().to_string(),
        retentions: SCHEMA.into(),
        cleaner_enabled: false,
        coarse_write_secs: Some(0),
        quantile_write_secs: 0,
        ..Config::default()
    };
    let agent = TestAgent::start_at(config.clone(), Clock::manual(Duration::from_secs(t)));
    let lines: Vec<String> = (1..=200u64)
        .map(|k| format!("s.c:{k}|c|T{}", t - k * 3_600))
        .chain(["s.c:1|c".to_string()])
        .collect();
    for batch in lines.chunks(40) {
        agent.send_taken(batch.join("\n").as_bytes()).await;
    }
    agent.tick();
    let mut conn = sentinels.conn(sentinels.master_port());
    eventually(Duration::from_secs(10), "the window written", || {
        redis::cmd("HEXISTS")
            .arg("count:1:s.c")
            .arg(t)
            .query::<bool>(&mut conn)
            .unwrap_or(false)
    })
    .await;
    let from = t - 201 * 3_600;
    let before = render(&agent, "s.c", from, t);
    assert_eq!(before.iter().filter_map(|p| p.1).sum::<f64>(), 20_101.0);
    let store = statsd_redis::store::Store::open(&config).unwrap();
    let mut c = leased(store, &config.retention()).await;
    let report = c.pass(t + 1).await.unwrap();
    // All but the hour-old one, within the hash's newest 120 minutes.
    assert_eq!(report.slices_moved, 199, "{report:?}");
    same!(
        render(&agent, "s.c", from, t),
        before,
        "under Sentinel, once moved"
    );
    agent.stop().await;
}

/// Another program's key under a block's name (of another type) takes nothing: the slices it
/// would hold stay in the hash, the pass completes, and the key is left as it was.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_key_at_a_blocks_name_keeps_its_slices_in_the_hash() {
    let redis = RedisServer::start();
    let now = unix_now() / 60 * 60;
    let (old, other) = (now - 86_400, now - 30 * 86_400);
    for slice in [old, other, now] {
        cmd::<()>(
            &redis,
            redis::cmd("HSET").arg("count:60:f").arg(slice).arg(2),
        );
    }
    cmd::<()>(&redis, redis::cmd("ZADD").arg("known:").arg(0).arg("60:f"));
    let g = history::LARGE;
    let keys = statsd_redis::store::Keys::new("");
    let theirs = history::block_key(&keys, "count:60:f", g, g.locate(60, old).0);
    cmd::<()>(&redis, redis::cmd("HSET").arg(&theirs).arg("x").arg("y"));
    assert_eq!(pass(&redis, now).await.slices_moved, 1);
    let hash = redis.get_counter("count:60:f");
    assert!(
        hash.contains_key(&old) && !hash.contains_key(&other),
        "{hash:?}"
    );
    let kept: Vec<String> = cmd(&redis, redis::cmd("HGETALL").arg(&theirs));
    assert_eq!(kept, ["x", "y"]);
    assert_eq!(redis.history("count:60:f").values().sum::<f64>(), 6.0);
}

/// A series idle for longer than its retention, then written again: what its blocks held is
/// never read as current. A block is named by its slices' absolute time, so a new write never
/// lands in an old block's slot; and a read asks only the slices within the retention, so a
/// block still waiting out its `EXPIRE` shows nothing either.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_series_idle_past_its_retention_shows_only_its_new_points() {
    let redis = RedisServer::start();
    let t = unix_now() / 600 * 600 - 600;
    let schema = "1s:200";
    let config = Config {
        retentions: schema.into(),
        ..config(&redis)
    };
    let clock = Clock::manual(Duration::from_secs(t));
    let agent = TestAgent::start_at(config, clock.clone());
    let old: Vec<String> = (1..=150u64)
        .map(|k| format!("idle.c:{k}|c|T{}", t - 151 + k))
        .collect();
    send_window(&agent, &redis, &old, t).await;
    let mut c = leased(redis.store(), &Retention::parse(schema).unwrap()).await;
    assert!(c.pass(t + 1).await.unwrap().slices_moved > 0);
    let before: f64 = render(&agent, "idle.c", t - 190, t)
        .iter()
        .filter_map(|p| p.1)
        .sum();
    assert_eq!(before, (1..=150).sum::<u64>() as f64);
    // Idle for 1000 s (the clock stands at t + 1 after the window), then one count.
    let back = t + 1001;
    clock.advance(Duration::from_secs(1000));
    send_window(&agent, &redis, &["idle.c:7|c".to_string()], back).await;
    assert!(c.pass(back + 1).await.unwrap().completed);
    let points = render(&agent, "idle.c", back - 190, back);
    let written: Vec<_> = points.iter().filter(|p| p.1.is_some()).collect();
    assert_eq!(written, [&(back, Some(7.0))], "only the new count");
    // Asked for the old seconds too: the range is clamped to the retention, as whisper's.
    let all = render(&agent, "idle.c", t - 190, back);
    let written: Vec<_> = all.iter().filter(|p| p.1.is_some()).collect();
    assert_eq!(
        written,
        [&(back, Some(7.0))],
        "only the new count, from {}",
        t - 190
    );
    let blocks: Vec<String> = cmd(&redis, redis::cmd("KEYS").arg("history:count:1:idle.c:*"));
    assert!(
        !blocks.is_empty(),
        "the old block still waits out its EXPIRE"
    );
    agent.stop().await;
}

/// Moves the manual `clock` on to `at` (or, from there, a few seconds on) and waits until the
/// agent's open window is one that started then: after a jump its closer closes the windows in
/// between one by one, and lines taken before it caught up would land in an earlier one. A
/// marker is sent into the open window until one is written at the second it was sent at.
/// Returns the open window's second.
async fn move_to(agent: &TestAgent, redis: &RedisServer, clock: &Clock, at: u64) -> u64 {
    let now = clock.unix_now();
    if at > now + 1 {
        clock.advance(Duration::from_secs(at - 1 - now));
    }
    for _ in 0..30 {
        // A marker series of its own each time: the cleaner trims and moves the older ones.
        let opened = clock.unix_now();
        agent
            .send_taken(format!("h.sync.{opened}:1|c").as_bytes())
            .await;
        agent.tick();
        let marker = || redis.history(&format!("count:1:h.sync.{opened}"));
        eventually(Duration::from_secs(10), "the marker written", || {
            !marker().is_empty()
        })
        .await;
        if marker().contains_key(&opened) {
            return clock.unix_now();
        }
    }
    panic!("the agent's windows did not catch up with its clock in 30 tries");
}

/// The set slices' keys of `series` at `precision`, by slice.
fn set_slices(redis: &RedisServer, precision: u64, series: &str) -> Vec<u64> {
    let keys: Vec<String> = cmd(
        redis,
        redis::cmd("KEYS").arg(format!("set:{precision}:{series}:*")),
    );
    let mut slices: Vec<u64> = keys
        .iter()
        .map(|k| k.rsplit(':').next().unwrap().parse().unwrap())
        .collect();
    slices.sort_unstable();
    slices
}

/// A set's minutes at a long retention: written through the agent for 150 minutes, its own
/// cleaner (every second) moves the slices past `SET_OPEN_SECS` out of their HyperLogLogs into
/// blocks (the minutes written meanwhile, as the walks came); the Graphite API and the JSON API read every minute's distinct
/// members as Redis counted them before the move; members written late into a moved minute
/// (as a backlog would) read as the larger part, and move again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sets_older_slices_move_into_blocks_and_read_back_the_same() {
    let redis = RedisServer::start();
    let minutes = 150;
    let t0 = unix_now() / 60 * 60 - minutes * 60;
    let clock = Clock::manual(Duration::from_secs(t0));
    let agent = TestAgent::start_at(
        Config {
            cleaner_enabled: true,
            cleaner_interval_secs: 1,
            ..config(&redis)
        },
        clock.clone(),
    );
    // Minute m: m % 9 + 1 members, some shared with the minute before. Redis's own count of
    // the same members (a HyperLogLog of the test's) is what each minute must read.
    let mut want: BTreeMap<u64, f64> = BTreeMap::new();
    for m in 0..minutes {
        let at = t0 + m * 60;
        let members: Vec<String> = (0..m % 9 + 1).map(|k| format!("u{}", m * 3 + k)).collect();
        let scratch = format!("scratch:{m}");
        let n: u64 = cmd(&redis, redis::cmd("PFADD").arg(&scratch).arg(&members));
        assert_eq!(n, 1);
        let count: u64 = cmd(&redis, redis::cmd("PFCOUNT").arg(&scratch));
        want.insert(at, count as f64);
        let lines: Vec<String> = members.iter().map(|u| format!("h.s:{u}|s")).collect();
        let second = move_to(&agent, &redis, &clock, at).await;
        assert!(second < at + 60);
        send_window(&agent, &redis, &lines, second).await;
    }
    // Past the cleaner's next walk of the sets, then until it moved every minute (the last
    // written ended more than SET_OPEN_SECS before).
    clock.advance(Duration::from_secs(history::SET_WALK_SECS));
    let now = t0 + minutes * 60 + history::SET_WALK_SECS;
    assert!(history::set_keep_from(now, 60) > t0 + (minutes - 1) * 60);
    eventually(Duration::from_secs(20), "the minutes moved", || {
        set_slices(&redis, 60, "h.s").is_empty()
    })
    .await;
    // The blocks the minutes span (two when they straddle a block's end).
    let mut blocks: Vec<String> = cmd(&redis, redis::cmd("KEYS").arg("history:set:60:h.s:*"));
    blocks.sort();
    let spanned: Vec<String> = (t0 / 60 / 2008..=(t0 / 60 + minutes - 1) / 2008)
        .map(|n| format!("history:set:60:h.s:2008:{n}"))
        .collect();
    assert_eq!(blocks, spanned);
    for block in &blocks {
        let len: u64 = cmd(&redis, redis::cmd("STRLEN").arg(block));
        assert_eq!(len, history::LARGE.bytes());
        let ttl: i64 = cmd(&redis, redis::cmd("TTL").arg(block));
        assert!(ttl > 89 * 86_400, "{block}: ttl {ttl}");
    }

    let from = t0 - 60;
    assert_eq!(written(render(&agent, "h.s", from, now)), want, "Graphite");
    let api = |path: &str| curl_json(&format!("http://{}/api/v1/{path}", agent.http));
    let samples = samples_of(&api("set/h.s?precision=60"));
    assert_eq!(samples, want, "the JSON API");
    // A range of them: from a moved minute's start to just before another's.
    let (a, b) = (t0 + 20 * 60, t0 + 90 * 60 - 1);
    let part = samples_of(&api(&format!("set/h.s?precision=60&from={a}&until={b}")));
    let in_part: BTreeMap<u64, f64> = want.range(a..=b).map(|(k, v)| (*k, *v)).collect();
    assert_eq!(in_part.len(), 70);
    assert_eq!(part, in_part, "a range of the JSON API");
    // Found by name from its blocks alone, as a set that stopped long ago is.
    let found = api("series?type=set&precision=60&match=h.s");
    assert_eq!(found["series"], serde_json::json!(["h.s"]), "{found}");

    // Late members into two moved minutes: one member already counted (the minute reads the
    // same), and forty new ones (the minute reads the larger part, forty). A reader asks the
    // HyperLogLogs only of the minutes the cleaner may not have moved yet: the late ones show
    // once the next walk has moved them.
    let (same, more) = (t0 + 9 * 60, t0 + 10 * 60);
    let _: u64 = cmd(
        &redis,
        redis::cmd("PFADD")
            .arg(format!("set:60:h.s:{same}"))
            .arg("u27"),
    );
    let forty: Vec<String> = (0..40).map(|k| format!("late{k}")).collect();
    let _: u64 = cmd(
        &redis,
        redis::cmd("PFADD")
            .arg(format!("set:60:h.s:{more}"))
            .arg(&forty),
    );
    assert_eq!(
        written(render(&agent, "h.s", from, now)),
        want,
        "before the walk"
    );
    want.insert(more, 40.0);
    clock.advance(Duration::from_secs(history::SET_WALK_SECS));
    eventually(Duration::from_secs(20), "the late minutes moved", || {
        !set_slices(&redis, 60, "h.s").contains(&more)
            && !set_slices(&redis, 60, "h.s").contains(&same)
    })
    .await;
    let now = now + history::SET_WALK_SECS;
    assert_eq!(
        written(render(&agent, "h.s", from, now)),
        want,
        "moved again"
    );
    agent.stop().await;
}

/// The move's two steps, a member arriving between them: the slot takes the count first
/// (`set_move.lua`), and the HyperLogLog, counting more by the time of its delete
/// (`set_drop.lua`), stays for the next walk, which takes its larger count; another program's
/// key under a set slice's name is left as it is, and the pass completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_between_a_sets_move_and_its_delete_is_kept() {
    let redis = RedisServer::start();
    let now = unix_now() / 60 * 60;
    let slice = now - 200 * 60;
    let key = format!("set:60:race:{slice}");
    let _: u64 = cmd(&redis, redis::cmd("PFADD").arg(&key).arg("a").arg("b"));
    let block = history::block_key(
        &statsd_redis::store::Keys::new(""),
        "set:60:race",
        history::LARGE,
        slice / 60 / 2008,
    );
    let slot = (slice / 60) % 2008;
    let moved: (i64, u64) = redis::Script::new(include_str!("../src/store/set_move.lua"))
        .key(&block)
        .arg(slot)
        .arg(2008)
        .arg(3600)
        .arg(2)
        .invoke(&mut redis.conn())
        .unwrap();
    assert_eq!(moved, (0, 2));
    let _: u64 = cmd(&redis, redis::cmd("PFADD").arg(&key).arg("c"));
    let dropped: u64 = redis::Script::new(include_str!("../src/store/set_drop.lua"))
        .key(&key)
        .arg(moved.1)
        .invoke(&mut redis.conn())
        .unwrap();
    assert_eq!(dropped, 0, "the key counting more stays");
    let _: () = cmd(
        &redis,
        redis::cmd("SET")
            .arg(format!("set:60:race:{}", slice - 60))
            .arg("x"),
    );
    let report = pass(&redis, now).await;
    assert_eq!(report.slices_moved, 1, "{report:?}");
    assert!(
        set_slices(&redis, 60, "race").len() == 1,
        "the foreign key stays"
    );
    let (a, b) = Geometry::byte_range(slot, slot);
    let bytes: Vec<u8> = cmd(&redis, redis::cmd("GETRANGE").arg(&block).arg(a).arg(b));
    assert_eq!(
        Geometry::read(slot, slot, &bytes, history::Family::Set),
        [Some(3.0)]
    );
}

/// Blocks a former retention cut otherwise (a week of minutes: 248 slots a block) under the
/// configured one (90 days of minutes: 2008): a render and the JSON API read the slots asked in
/// the configured cut and, where the other cut has a block over the range (one `EXISTS`), its
/// slots too.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slices_of_a_former_retentions_cut_are_read_too() {
    let redis = RedisServer::start();
    let t = unix_now() / 60 * 60 - 60;
    let keys = statsd_redis::store::Keys::new("");
    let family = history::Family::Counter;
    let mut want: BTreeMap<u64, f64> = BTreeMap::new();
    // Three days back in the small cut, five days back in the large one, the newest minute in
    // the hash.
    for (geometry, days, value) in [(history::SMALL, 3, 7.0), (history::LARGE, 5, 11.0)] {
        let slice = (t - days * 86_400) / 60 * 60;
        let (block, slot) = geometry.locate(60, slice);
        let bytes = history::block_bytes(geometry, &[(slot, value)], family);
        cmd::<()>(
            &redis,
            redis::cmd("SET")
                .arg(history::block_key(&keys, "count:60:xc", geometry, block))
                .arg(bytes),
        );
        want.insert(slice, value);
    }
    cmd::<()>(&redis, redis::cmd("HSET").arg("count:60:xc").arg(t).arg(2));
    cmd::<()>(&redis, redis::cmd("ZADD").arg("known:").arg(0).arg("60:xc"));
    want.insert(t, 2.0);
    // A series beside it without a block of the former cut: one render asks for both.
    cmd::<()>(&redis, redis::cmd("HSET").arg("count:60:ac").arg(t).arg(5));
    cmd::<()>(&redis, redis::cmd("ZADD").arg("known:").arg(0).arg("60:ac"));
    let agent = TestAgent::start_at(config(&redis), Clock::manual(Duration::from_secs(t + 1)));
    let got = written(render(&agent, "xc", t - 6 * 86_400, t + 1));
    assert_eq!(got, want, "Graphite");
    let both = curl_json(&format!(
        "http://{}/graphite/render?target=%3Fc&from={}&until={}&format=json",
        agent.http,
        t - 6 * 86_400,
        t + 1
    ));
    let by_name: BTreeMap<String, BTreeMap<u64, f64>> = both
        .as_array()
        .unwrap_or_else(|| panic!("{both}"))
        .iter()
        .map(|s| {
            let points = s["datapoints"].as_array().expect("datapoints");
            let points = points
                .iter()
                .map(|p| (p[1].as_u64().unwrap(), p[0].as_f64()));
            (
                s["target"].as_str().unwrap_or("").to_string(),
                written(points.collect()),
            )
        })
        .collect();
    let ac = BTreeMap::from([(t, 5.0)]);
    assert_eq!(
        by_name,
        BTreeMap::from([("ac".to_string(), ac), ("xc".to_string(), want.clone())]),
        "two series, one with a former cut's blocks"
    );
    let api = curl_json(&format!(
        "http://{}/api/v1/counter/xc?precision=60",
        agent.http
    ));
    let samples = samples_of(&api);
    assert_eq!(samples, want, "the JSON API");
    agent.stop().await;
}

/// A cleaner pass at `now` that also packs the quantile slices at the default
/// `quantile_precisions` (minutes and hours).
async fn packing_pass(redis: &RedisServer, now: u64) -> PassReport {
    let retention = Retention::parse(SCHEMA).unwrap();
    let mut c = leased(redis.store(), &retention)
        .await
        .packing(&[60, 3600], &retention);
    let report = c.pass(now).await.unwrap();
    assert!(report.completed);
    report
}

/// The quantile slices' keys of `series`, by precision and slice.
fn hist_slices(redis: &RedisServer, series: &str) -> Vec<(u64, u64)> {
    let keys: Vec<String> = cmd(redis, redis::cmd("KEYS").arg(format!("hist:*:{series}:*")));
    let mut slices: Vec<(u64, u64)> = keys
        .iter()
        .map(|k| {
            let parts: Vec<&str> = k.split(':').collect();
            (parts[1].parse().unwrap(), parts[4].parse().unwrap())
        })
        .collect();
    slices.sort_unstable();
    slices
}

/// A timer's statistics as the Graphite API renders them up to `t`: four days (minutes) and
/// three hours, each statistic in turn.
fn timer_renders(agent: &TestAgent, series: &str, t: u64) -> Vec<Vec<(u64, Option<f64>)>> {
    let mut out = Vec::new();
    for (from, until) in [(t - 4 * 86_400, t), (t - 3 * 3600, t)] {
        for stat in ["count", "sum", "mean", "min", "max", "p50", "p90", "p999"] {
            out.push(render(agent, &format!("{series}.{stat}"), from, until));
        }
    }
    out
}

/// A timer's and a histogram's quantile slices over three days, stamped (`|T`) through the
/// agent, with rates (fractional weights), zero and negative values: once the cleaner packed
/// every slice past `OPEN_SECS` into blocks, the Graphite API's statistics at minutes and hours
/// and the JSON API's quantiles of each minute read exactly as they did from the hashes; a
/// value sent late into a packed minute is a second part, and the minute then reads as a twin
/// series that had the value from the start; a timer whose hour's statistics are gone is found
/// by its blocks.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn packed_quantile_slices_read_back_as_their_hashes_held_them() {
    let redis = RedisServer::start();
    let t = unix_now() / 3600 * 3600 - 60;
    // A reader asks the hashes of the slices the cleaner may not have packed yet (those of a
    // walk and three cleaner intervals): at three days' intervals, every slice's, so that the
    // hashes written below read before the pack.
    let agent = TestAgent::start_at(
        Config {
            quantile_write_secs: 0,
            cleaner_interval_secs: 3 * 86_400,
            ..config(&redis)
        },
        Clock::manual(Duration::from_secs(t)),
    );
    // One value of each through the agent (the hour's statistics name them), and 600 minutes
    // over three days written as the flush writes a minute's and an hour's buckets.
    let live = ["h.t:1|ms", "h.u:1|ms", "h.n:1|h"].map(String::from);
    send_window(&agent, &redis, &live, t).await;
    let mapping = statsd_redis::aggregate::Mapping::new(0.01);
    let add = |series: &str, kind: &str, at: u64, v: f64, weight: f64| {
        for p in [60, 3600] {
            let key = format!("hist:{p}:{series}:{kind}:{}", at / p * p);
            let field = mapping.bucket(v).field();
            let _: () = cmd(&redis, redis::cmd("HSET").arg(&key).arg("a").arg("0.01"));
            let _: f64 = cmd(
                &redis,
                redis::cmd("HINCRBYFLOAT").arg(&key).arg(field).arg(weight),
            );
            let _: () = cmd(
                &redis,
                redis::cmd("EXPIREAT").arg(&key).arg(at + 90 * 86_400),
            );
        }
    };
    let late_at = t - 2 * 86_400 + 30;
    add("h.u", "AccessTime", late_at, 7777.0, 1.0);
    for k in 1..=600u64 {
        let at = t - (k * 7_919) % (3 * 86_400) - 1;
        let v = (k * 37 % 5000) as f64 / 4.0 + 0.5;
        let weight = if k % 5 == 0 { 1.0 / 0.3 } else { 1.0 };
        add("h.t", "AccessTime", at, v, weight);
        add("h.u", "AccessTime", at, v, weight);
        add("h.n", "Histogram", at, (k % 7) as f64 - 3.0, 1.0);
    }
    let reads = |series: &str| timer_renders(&agent, series, t);
    let api = |series: &str, kind: &str| {
        curl_json(&format!(
            "http://{}/api/v1/percentiles/{series}?type={kind}&last=3d&precision=60\
             &by_slice=true&quantiles=0,0.5,0.9,0.99,1",
            agent.http
        ))
    };
    let before = (reads("h.t"), reads("h.n"));
    let api_before = (api("h.t", "ms"), api("h.n", "h"));
    assert!(
        written(before.0[0].clone()).len() > 300,
        "{:?}",
        before.0[0]
    );
    assert!(hist_slices(&redis, "h.t").len() > 500);

    let report = packing_pass(&redis, t + 1).await;
    let keep = statsd_redis::store::quantile_blocks::keep_from(t + 1, 60);
    let left = hist_slices(&redis, "h.t");
    assert!(left.iter().all(|&(p, s)| s + p > keep), "{left:?}");
    assert!(report.slices_moved > 1000, "{report:?}");
    let blocks: Vec<String> = cmd(&redis, redis::cmd("KEYS").arg("history:hist:60:h.t:*"));
    assert!(blocks.len() > 30, "{blocks:?}");
    let ttl: i64 = cmd(&redis, redis::cmd("TTL").arg(&blocks[0]));
    assert!(ttl > 86 * 86_400, "{}: ttl {ttl}", blocks[0]);
    assert_eq!((reads("h.t"), reads("h.n")), before, "Graphite, packed");
    assert_eq!(
        (api("h.t", "ms"), api("h.n", "h")),
        api_before,
        "the JSON API, packed"
    );
    assert_eq!(
        packing_pass(&redis, t + 1).await.slices_moved,
        0,
        "a second pass"
    );

    // The renders keep what they decoded of a block by its bytes (`quantile_blocks::Memo`): the
    // same renders again read the same; a block rewritten since (a record replaced: its slot
    // and token, other buckets) reads as its new bytes, the rest as before.
    assert_eq!(reads("h.n"), before.1, "the histogram again, remembered");
    let mut blocks: Vec<String> = cmd(&redis, redis::cmd("KEYS").arg("history:hist:60:h.n:*"));
    blocks.sort();
    let bytes: Vec<u8> = cmd(&redis, redis::cmd("GET").arg(&blocks[0]));
    let (_, parts) = statsd_redis::store::quantile_blocks::decode(&bytes).unwrap();
    let n: u64 = blocks[0].rsplit(':').next().unwrap().parse().unwrap();
    let slice = (n * statsd_redis::store::quantile_blocks::SLOTS + u64::from(parts[0].slot)) * 60;
    let mut buckets = statsd_redis::aggregate::Buckets::default();
    buckets.add(mapping.bucket(1234.5), 1.0);
    let record =
        statsd_redis::store::quantile_blocks::record(parts[0].slot, parts[0].token, &buckets);
    let _: i64 = redis::Script::new(include_str!("../src/store/hist_move.lua"))
        .key(&blocks[0])
        .arg(statsd_redis::store::quantile_blocks::header("0.01"))
        .arg(t + 90 * 86_400)
        .arg(record)
        .invoke(&mut redis.conn())
        .unwrap();
    let minutes = t - 4 * 86_400;
    let max = render(&agent, "h.n.max", minutes, t);
    let (was, now) = (render_at(&before.1[4], slice), render_at(&max, slice));
    assert_ne!(was, now, "minute {slice}");
    assert_eq!(
        now,
        Some(mapping.value(mapping.bucket(1234.5))),
        "minute {slice}"
    );
    let others = |points: &[(u64, Option<f64>)]| -> Vec<(u64, Option<f64>)> {
        points
            .iter()
            .filter(|(s, _)| *s != slice)
            .copied()
            .collect()
    };
    assert_eq!(others(&max), others(&before.1[4]), "the other minutes");

    // A value late into a packed minute: a new hash, read once the next walk packed it.
    add("h.t", "AccessTime", late_at, 7777.0, 1.0);
    assert_eq!(
        hist_slices(&redis, "h.t").len(),
        left.len() + 2,
        "the minute's and hour's"
    );
    packing_pass(&redis, t + 1).await;
    assert_eq!(hist_slices(&redis, "h.t"), left);
    assert_eq!(reads("h.t"), reads("h.u"), "two parts read as one");
    let packed = reads("h.t");
    agent.stop().await;

    // The timer stopped long ago: its hour's statistics are gone (the cleaner deletes them two
    // hours on), its packed slices still name it to a new agent's Graphite API and JSON API.
    let _: u64 = cmd(&redis, redis::cmd("DEL").arg("stats:h.t:AccessTime"));
    let agent = TestAgent::start_at(
        Config {
            cleaner_interval_secs: 3 * 86_400,
            ..config(&redis)
        },
        Clock::manual(Duration::from_secs(t)),
    );
    assert_eq!(
        timer_renders(&agent, "h.t", t),
        packed,
        "found by its blocks"
    );
    let found = curl_json(&format!(
        "http://{}/api/v1/series?type=timer&precision=60&match=h.t",
        agent.http
    ));
    assert_eq!(found["series"], serde_json::json!(["h.t"]), "{found}");
    agent.stop().await;
}

/// The pack's three steps, the worst moment between them: a slice sealed and written into its
/// block, then a value into its hash before the delete (as a late window's), then the pass
/// stopped there. A reader that asks the hash takes it over the block's part of the same token,
/// one that asks only the block reads the part; the next pass writes the slice again under
/// that token, replacing the part, and deletes the hash: the block holds the slice once, with
/// every value.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slice_written_between_its_pack_and_its_delete_counts_once() {
    use statsd_redis::store::quantile_blocks as qb;
    let redis = RedisServer::start();
    let now = unix_now() / 60 * 60;
    let slice = now - 200 * 60;
    let hash = format!("hist:60:race:AccessTime:{slice}");
    let _: () = cmd(
        &redis,
        redis::cmd("HSET")
            .arg(&hash)
            .arg("a")
            .arg("0.01")
            .arg("345")
            .arg("3"),
    );
    // A foreign key among the sealed: false for it, the slice's fields for the slice.
    let _: () = cmd(
        &redis,
        redis::cmd("SET").arg("hist:60:race:AccessTime:60").arg("x"),
    );
    let mut sealed: Vec<Option<Vec<(String, String)>>> =
        redis::Script::new(include_str!("../src/store/hist_seal.lua"))
            .key("hist:60:race:AccessTime:60")
            .key(&hash)
            .arg("00000001")
            .arg("0000abcd")
            .invoke(&mut redis.conn())
            .unwrap();
    assert_eq!(sealed[0], None);
    let sealed = sealed.pop().flatten().unwrap();
    let (n, slot) = qb::locate(60, slice);
    let block = format!("history:hist:60:race:AccessTime:{n}");
    let mut buckets = statsd_redis::aggregate::Buckets::default();
    buckets.add(statsd_redis::aggregate::Bucket::Positive(345), 3.0);
    let records: i64 = redis::Script::new(include_str!("../src/store/hist_move.lua"))
        .key(&block)
        .arg(qb::header("0.01"))
        .arg(now + 3600)
        .arg(qb::record(slot, [0, 0, 0xab, 0xcd], &buckets))
        .invoke(&mut redis.conn())
        .unwrap();
    assert_eq!(records, 1);
    let _: f64 = cmd(
        &redis,
        redis::cmd("HINCRBYFLOAT").arg(&hash).arg("345").arg(2),
    );
    let drop_script = redis::Script::new(include_str!("../src/store/hist_drop.lua"));
    let mut drop = drop_script.prepare_invoke();
    drop.key(&hash).arg(sealed.len() * 2);
    for (f, v) in &sealed {
        drop.arg(f).arg(v);
    }
    let dropped: u64 = drop.invoke(&mut redis.conn()).unwrap();
    assert_eq!(dropped, 0, "the hash written since stays");

    // A reader that asks the slice's hash (its cleaner's intervals are days) takes it over
    // the block's part of its token; one that asks only the blocks of a slice that old reads
    // the part that moved, the rest once the next walk packed it. Neither counts it twice.
    let agent = TestAgent::start_at(config(&redis), Clock::manual(Duration::from_secs(now)));
    let days = TestAgent::start_at(
        Config {
            cleaner_interval_secs: 86_400,
            ..config(&redis)
        },
        Clock::manual(Duration::from_secs(now)),
    );
    // The hour's statistics name the timer.
    send_window(&agent, &redis, &["race:1|ms".to_string()], now).await;
    let count = |agent: &TestAgent| written(render(agent, "race.count", slice - 60, slice + 60));
    assert_eq!(
        count(&days),
        BTreeMap::from([(slice, 5.0)]),
        "the hash over its part"
    );
    assert_eq!(count(&agent), BTreeMap::from([(slice, 3.0)]), "the part");
    packing_pass(&redis, now).await;
    let left: u64 = cmd(&redis, redis::cmd("EXISTS").arg(&hash));
    assert_eq!(left, 0, "the hash packed");
    let bytes: Vec<u8> = cmd(&redis, redis::cmd("GET").arg(&block));
    let (_, parts) = qb::decode(&bytes).unwrap();
    assert_eq!(parts.len(), 1, "{parts:?}");
    assert_eq!(parts[0].buckets.total(), 5.0);
    assert_eq!(count(&agent), BTreeMap::from([(slice, 5.0)]), "packed once");
    assert_eq!(count(&days), BTreeMap::from([(slice, 5.0)]), "packed once");
    agent.stop().await;
    days.stop().await;
}

/// A pack tried by an earlier release (its record's buckets as varints) and done again by
/// this one after an upgrade (the hash kept its token): the new record, its buckets coded in
/// bits, replaces the earlier one of the same slot and token, so the slice counts once; a
/// record of another slot stays.
#[test]
fn a_pack_repeated_across_an_upgrade_replaces_the_earlier_record() {
    use statsd_redis::aggregate::{Bucket, Buckets};
    use statsd_redis::store::quantile_blocks as qb;
    let redis = RedisServer::start();
    let block = "history:hist:60:up:AccessTime:7";
    let token = [0, 0, 0xab, 0xcd];
    // The earlier release's records, slots 3 and 4: a bucket one step past 0 (Positive(1)),
    // count 1 (code 2), one byte.
    let earlier = |slot: u8| [&[6u8, slot][..], &token, &[2]].concat();
    let script = redis::Script::new(include_str!("../src/store/hist_move.lua"));
    let move_records = |records: &[Vec<u8>]| -> i64 {
        let mut call = script.prepare_invoke();
        call.key(block)
            .arg(qb::header("0.01"))
            .arg(unix_now() + 3600);
        for r in records {
            call.arg(r);
        }
        call.invoke(&mut redis.conn()).unwrap()
    };
    assert_eq!(move_records(&[earlier(3), earlier(4)]), 2);
    let mut buckets = Buckets::default();
    buckets.add(Bucket::Positive(1), 1.0);
    buckets.add(Bucket::Positive(345), 3.0);
    assert_eq!(move_records(&[qb::record(3, token, &buckets)]), 1);
    let bytes: Vec<u8> = cmd(&redis, redis::cmd("GET").arg(block));
    let (_, parts) = qb::decode(&bytes).unwrap();
    let got: Vec<(u8, [u8; 4], usize)> = parts
        .iter()
        .map(|p| (p.slot, p.token, p.buckets.len()))
        .collect();
    assert_eq!(got, [(3, token, 2), (4, token, 1)]);
}
