//! One server's write path, driven through the agent's own writer against a private Redis: the
//! guard's upkeep, the string keys of older versions, index members (once a series, and again
//! after Redis lost its data),
//! and a guard key that is not ours.

mod common;

use std::sync::Arc;

use common::*;
use statsd_redis::aggregate::ClosedWindow;
use statsd_redis::config::DEFAULT_PRECISIONS as PRECISIONS;
use statsd_redis::store::{Chunker, FlushChunk, Store, Writer};
use statsd_redis::telemetry::Telemetry;

fn writer(redis: &RedisServer) -> (Writer, Chunker) {
    let config = test_config(redis);
    let store = Store::open(&config).unwrap();
    let chunker = Chunker::new(store.keys().clone(), &config);
    (
        Writer::new(store, None, Arc::new(Telemetry::new())),
        chunker,
    )
}

/// A window of counters `series` (each `n`) at `start`, its chunks numbered from `first`.
fn chunks(
    chunker: &Chunker,
    start: u64,
    series: &[&str],
    n: i64,
    first: u64,
) -> Vec<Arc<FlushChunk>> {
    let window = ClosedWindow {
        start,
        counters: series.iter().map(|s| ((*s).into(), n)).collect(),
        ..ClosedWindow::default()
    };
    numbered(chunker, &window, first)
}

/// `window`'s chunks, numbered from `first`.
fn numbered(chunker: &Chunker, window: &ClosedWindow, first: u64) -> Vec<Arc<FlushChunk>> {
    (first..)
        .zip(chunker.whole(window))
        .map(|(seq, mut chunk)| {
            chunk.seq = seq;
            Arc::new(chunk)
        })
        .collect()
}

/// `chunks` of the run `sequence` written, without an error.
async fn write_ok(
    writer: &mut Writer,
    sequence: &str,
    chunks: &[Arc<FlushChunk>],
    sent_before: &[bool],
) -> statsd_redis::store::Written {
    let written = writer.write_chunks(sequence, chunks, sent_before).await;
    assert!(written.error.is_none(), "{:?}", written.error);
    written
}

fn query<T: redis::FromRedisValue>(redis: &RedisServer, cmd: &mut redis::Cmd) -> T {
    cmd.query(&mut redis.conn()).unwrap()
}

/// The guard keeps no TTL: a run's first chunk drops the fields of runs idle for a week, and
/// only those; a live run's late copy is still refused afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_run_drops_only_the_guard_fields_of_runs_idle_for_a_week() {
    let redis = RedisServer::start();
    let day = 86_400;
    let _: () = query(
        &redis,
        redis::cmd("HSET")
            .arg("flush:")
            .arg("idle.run")
            .arg(format!("5 {}", unix_now() - 8 * day))
            .arg("live.run")
            .arg(format!("5 {}", unix_now() - day)),
    );
    let (mut writer, chunker) = writer(&redis);
    let now = unix_now();
    write_ok(
        &mut writer,
        "flush:new.run",
        &chunks(&chunker, now, &["prune"], 3, 1),
        &[],
    )
    .await;
    let mut fields: Vec<String> = query(&redis, redis::cmd("HKEYS").arg("flush:"));
    fields.sort();
    assert_eq!(fields, ["live.run", "new.run"]);

    let late = write_ok(
        &mut writer,
        "flush:live.run",
        &chunks(&chunker, now, &["prune"], 3, 5),
        &[],
    )
    .await;
    assert_eq!((late.acknowledged, late.replayed), (1, 1));
    for p in PRECISIONS {
        assert_eq!(redis.counter_total(p, "prune"), 3, "precision {p}");
    }
    let keys: Vec<String> = query(&redis, redis::cmd("KEYS").arg("flush:*"));
    assert_eq!(keys, ["flush:"], "the watch key never outlives its EXEC");
}

/// A spool written by a version that kept each run's number in a string key: its chunks are
/// checked against that key, so those applied before are not applied again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_spool_of_an_older_version_is_checked_against_its_string_key() {
    let redis = RedisServer::start();
    let _: () = query(&redis, redis::cmd("SET").arg("flush:old.1").arg(3));
    let (mut writer, chunker) = writer(&redis);
    let now = unix_now();
    let mut all = chunks(&chunker, now, &["spooled"], 2, 1);
    for seq in 2..=4 {
        all.extend(chunks(&chunker, now + seq - 1, &["spooled"], 2, seq));
    }
    let written = write_ok(&mut writer, "flush:old.1", &all, &[true; 4]).await;
    assert_eq!((written.acknowledged, written.replayed), (4, 3));
    assert_eq!(
        redis.counter_total(1, "spooled"),
        2,
        "only the fourth chunk"
    );
    let guard: String = query(&redis, redis::cmd("HGET").arg("flush:").arg("old.1"));
    assert!(guard.starts_with("4 "), "{guard}");
}

/// The writer adds index members with the first write of each slice; when Redis loses its data
/// in the middle of a slice (a restart without persistence, a FLUSHALL), the next write brings
/// every member back at once, not a slice later. Counters and gauges alike.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_members_come_back_at_once_after_redis_lost_its_data() {
    let redis = RedisServer::start();
    let (mut writer, chunker) = writer(&redis);
    // Two windows in the same slice of every precision above 1 s.
    let start = unix_now() / 86_400 * 86_400 + 7;
    let window = |start| ClosedWindow {
        start,
        counters: vec![("x".into(), 1)],
        gauges: vec![("g".into(), 2.5)],
        ..ClosedWindow::default()
    };
    let members = |index: &str| {
        let mut m = redis.known(index);
        m.sort();
        m
    };
    let expected = |series: &str| {
        let mut m: Vec<String> = PRECISIONS.iter().map(|p| format!("{p}:{series}")).collect();
        m.sort();
        m
    };
    write_ok(
        &mut writer,
        "flush:w.1",
        &numbered(&chunker, &window(start), 1),
        &[],
    )
    .await;
    assert_eq!(members("known:"), expected("x"));
    assert_eq!(members("known:gauge:"), expected("g"));

    let _: () = query(&redis, &mut redis::cmd("FLUSHALL"));
    write_ok(
        &mut writer,
        "flush:w.1",
        &numbered(&chunker, &window(start + 1), 2),
        &[],
    )
    .await;
    assert_eq!(members("known:"), expected("x"));
    assert_eq!(members("known:gauge:"), expected("g"));
    for p in PRECISIONS {
        assert_eq!(redis.counter_total(p, "x"), 1, "precision {p}");
        let values: Vec<f64> = query(&redis, redis::cmd("HVALS").arg(format!("gauge:{p}:g")));
        assert_eq!(values, [2.5], "precision {p}");
    }
    let current: f64 = query(&redis, redis::cmd("HGET").arg("gauges:").arg("g"));
    assert_eq!(current, 2.5);
}

/// A series written every window adds its index members with its first window only: a slice
/// of the same precision written lately in an applied chunk means the hash, and its member, are
/// there (the 1 s precision's new slice every window used to add its member every window).
/// The members stay right: each precision's, once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_series_written_every_window_adds_its_index_members_once() {
    let redis = RedisServer::start();
    let (mut writer, chunker) = writer(&redis);
    let start = unix_now();
    for (i, at) in (start..start + 5).enumerate() {
        let window = ClosedWindow {
            start: at,
            counters: vec![("x".into(), 1)],
            gauges: vec![("g".into(), 2.5)],
            ..ClosedWindow::default()
        };
        write_ok(
            &mut writer,
            "flush:w.1",
            &numbered(&chunker, &window, i as u64 + 1),
            &[],
        )
        .await;
        // One `ZADD` for the counters' index and one for the gauges', in the first window.
        assert_eq!(redis.calls("zadd"), 2, "window {i}");
    }
    for (index, series) in [("known:", "x"), ("known:gauge:", "g")] {
        let mut members = redis.known(index);
        members.sort();
        let mut expected: Vec<String> =
            PRECISIONS.iter().map(|p| format!("{p}:{series}")).collect();
        expected.sort();
        assert_eq!(members, expected);
    }
    assert_eq!(redis.counter_total(1, "x"), 5);
}

/// Another program's key of another type where the guard goes: the chunk is refused before
/// anything is written, and said to be.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_guard_key_that_is_not_ours_stops_the_chunk_before_any_write() {
    let redis = RedisServer::start();
    let _: () = query(&redis, redis::cmd("SET").arg("flush:").arg("theirs"));
    let (mut writer, chunker) = writer(&redis);
    let written = writer
        .write_chunks(
            "flush:w.1",
            &chunks(&chunker, unix_now(), &["x"], 1, 1),
            &[],
        )
        .await;
    assert_eq!(written.acknowledged, 0);
    let error = written.error.expect("an error").to_string();
    assert!(error.contains("WRONGTYPE"), "{error}");
    let keys: Vec<String> = query(&redis, redis::cmd("KEYS").arg("*"));
    assert_eq!(keys, ["flush:"]);
}

/// Under `retentions`, `coarse_write_secs` is 60 by default and the 1 s precision is written
/// every window without index members (the minute's group adds them once a period); a series
/// no chunk of late indexed there is indexed with its first window all the same, so Graphite
/// finds a brand-new counter at once, not up to two minutes later.
#[test]
fn a_brand_new_counter_is_found_at_once_under_retentions() {
    let redis = RedisServer::start();
    // Far from a minute's end: the minute's group cannot be what indexes it.
    while !(5..35).contains(&(unix_now() % 60)) {
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let (agent, udp, http) = spawn_agent(&redis.url(), &["--retentions", "1s:6h,1m:7d"]);
    let _agent = Killed(agent);
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.send_to(b"fresh.c:1|c", ("127.0.0.1", udp)).unwrap();
    // (Graphite keeps the names it looked up for 30 s: asked once the member is there.)
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while redis.known("known:").is_empty() {
        assert!(
            std::time::Instant::now() < deadline,
            "not indexed within 10 s: {:?}",
            redis.get_counter("count:1:fresh.c")
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let found = curl_json(&format!(
        "http://127.0.0.1:{http}/graphite/metrics/find?query=fresh.*"
    ));
    assert_eq!(found[0]["id"], "fresh.c", "{found}");
    assert_eq!(redis.known("known:"), ["1:fresh.c"]);
}
