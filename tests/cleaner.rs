//! The cleaner against a real redis-server: trimming to the newest samples, removing dead index
//! members, the lease between agents, and the race with a concurrent writer.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use statsd_redis::aggregate::ClosedWindow;
use statsd_redis::retention::Retention;
use statsd_redis::store::{ChunkSettings, Cleaner, CounterWrite, Keys, Writer, build_chunks};
use statsd_redis::telemetry::Telemetry;

fn cleaner(redis: &RedisServer, owner: &str, interval_secs: u64, sample_count: u64) -> Cleaner {
    retention_cleaner(
        redis,
        owner,
        interval_secs,
        &Retention::book(&[1, 5, 60, 300, 3600, 18000, 86400], sample_count),
    )
}

fn retention_cleaner(
    redis: &RedisServer,
    owner: &str,
    interval_secs: u64,
    retention: &Retention,
) -> Cleaner {
    Cleaner::new(
        redis.store(),
        owner.into(),
        Duration::from_secs(interval_secs),
        retention,
        Arc::new(Telemetry::new()),
    )
}

fn cmd<T: redis::FromRedisValue>(redis: &RedisServer, c: &mut redis::Cmd) -> T {
    c.query(&mut redis.conn()).unwrap()
}

fn seed(redis: &RedisServer, key: &str, slices: impl IntoIterator<Item = u64>) {
    let mut c = redis.conn();
    for s in slices {
        redis::cmd("HSET")
            .arg(key)
            .arg(s)
            .arg(1)
            .query::<()>(&mut c)
            .unwrap();
    }
}

fn index(redis: &RedisServer, key: &str, member: &str) {
    cmd::<()>(redis, redis::cmd("ZADD").arg(key).arg(0).arg(member));
}

#[tokio::test]
async fn keeps_the_newest_samples_and_drops_what_is_empty() {
    let redis = RedisServer::start();
    let now = unix_now();
    seed(&redis, "count:1:x", now - 499..=now);
    index(&redis, "known:", "1:x");
    let day = 86_400;
    seed(&redis, "count:86400:x", [(now - 200 * day) / day * day]);
    index(&redis, "known:", "86400:x");

    let mut c = cleaner(&redis, "a", 60, 120);
    assert!(c.hold_lease().await.unwrap());
    let report = c.pass(now).await.unwrap();

    let mut slices: Vec<u64> = cmd(&redis, redis::cmd("HKEYS").arg("count:1:x"));
    slices.sort();
    assert_eq!(
        slices,
        (now - 119..=now).collect::<Vec<_>>(),
        "exactly the 120 newest"
    );
    assert!(!cmd::<bool>(
        &redis,
        redis::cmd("EXISTS").arg("count:86400:x")
    ));
    assert_eq!(redis.known("known:"), ["1:x"]);
    assert_eq!(
        (
            report.slices_removed,
            report.hashes_removed,
            report.members_visited
        ),
        (381, 1, 2)
    );
    assert!(report.completed);
}

/// With `retentions`, each precision is trimmed at its own count, counters and gauges alike; a
/// precision no longer listed keeps as long as the listed one that would hold its points.
#[tokio::test]
async fn each_precision_keeps_its_own_count() {
    let redis = RedisServer::start();
    let now = unix_now() / 3600 * 3600;
    let retention = Retention::parse("10s:5m,1m:2h").unwrap();
    seed(&redis, "count:10:x", (0..100).map(|i| now - i * 10));
    index(&redis, "known:", "10:x");
    seed(&redis, "count:60:x", (0..200).map(|i| now - i * 60));
    index(&redis, "known:", "60:x");
    seed(&redis, "gauge:60:g", (0..200).map(|i| now - i * 60));
    index(&redis, "known:gauge:", "60:g");
    // 5 minutes, held by the minutes: two hours, 24 slices.
    seed(&redis, "count:300:x", (0..50).map(|i| now - i * 300));
    index(&redis, "known:", "300:x");

    // An interval of 1 s: every precision is due in the first pass.
    let mut c = retention_cleaner(&redis, "a", 1, &retention);
    assert!(c.hold_lease().await.unwrap());
    c.pass(now).await.unwrap();
    let kept = |key: &str| {
        let mut slices: Vec<u64> = cmd(&redis, redis::cmd("HKEYS").arg(key));
        slices.sort();
        slices
    };
    let newest = |n: u64, p: u64| (0..n).rev().map(|i| now - i * p).collect::<Vec<_>>();
    assert_eq!(kept("count:10:x"), newest(30, 10));
    assert_eq!(kept("count:60:x"), newest(120, 60));
    assert_eq!(kept("gauge:60:g"), newest(120, 60));
    assert_eq!(kept("count:300:x"), newest(24, 300));
}

#[tokio::test]
async fn index_members_without_a_hash_are_removed() {
    let redis = RedisServer::start();
    index(&redis, "known:", "5:deleted.by.hand");
    index(&redis, "known:gauge:", "60:evicted");
    let mut c = cleaner(&redis, "a", 60, 120);
    assert!(c.hold_lease().await.unwrap());
    c.pass(unix_now()).await.unwrap();
    assert!(redis.known("known:").is_empty());
    assert!(redis.known("known:gauge:").is_empty());
}

/// A member whose key another program holds, of another type, is not ours to trim: it goes, the
/// key stays as it is, and the batch's other members are trimmed as usual.
#[tokio::test]
async fn index_members_of_another_programs_keys_are_removed() {
    let redis = RedisServer::start();
    let now = unix_now();
    cmd::<()>(&redis, redis::cmd("SET").arg("count:60:theirs").arg("x"));
    index(&redis, "known:", "60:theirs");
    seed(&redis, "count:1:ours", now - 499..=now);
    index(&redis, "known:", "1:ours");
    let mut c = cleaner(&redis, "a", 60, 120);
    assert!(c.hold_lease().await.unwrap());
    c.pass(now).await.unwrap();
    assert_eq!(redis.known("known:"), ["1:ours"]);
    let theirs: String = cmd(&redis, redis::cmd("GET").arg("count:60:theirs"));
    assert_eq!(theirs, "x");
    let kept: usize = cmd(&redis, redis::cmd("HLEN").arg("count:1:ours"));
    assert_eq!(kept, 120);
}

#[tokio::test]
async fn gauges_are_trimmed_like_counters() {
    let redis = RedisServer::start();
    let now = unix_now() / 60 * 60;
    seed(&redis, "gauge:60:g", (0..20).map(|i| now - i * 60));
    index(&redis, "known:gauge:", "60:g");
    let mut c = cleaner(&redis, "a", 60, 10);
    assert!(c.hold_lease().await.unwrap());
    c.pass(now).await.unwrap();
    assert_eq!(cmd::<u64>(&redis, redis::cmd("HLEN").arg("gauge:60:g")), 10);
    assert_eq!(redis.known("known:gauge:"), ["60:g"]);
}

#[tokio::test]
async fn coarse_precisions_are_checked_every_p_over_interval_passes() {
    let redis = RedisServer::start();
    let now = unix_now();
    index(&redis, "known:", "300:y");
    let mut c = cleaner(&redis, "a", 60, 2);
    assert!(c.hold_lease().await.unwrap());
    // 300 / 60 = 5: passes 0 and 5 check precision 300, passes 1-4 do not.
    let mut cleaned = Vec::new();
    for _ in 0..6 {
        seed(&redis, "count:300:y", [now / 300 * 300, 0]);
        c.pass(now).await.unwrap();
        cleaned.push(cmd::<u64>(&redis, redis::cmd("HLEN").arg("count:300:y")) == 1);
    }
    assert_eq!(cleaned, [true, false, false, false, false, true]);
}

#[tokio::test]
async fn many_index_members_are_walked_in_batches() {
    let redis = RedisServer::start();
    let now = unix_now();
    let mut c = redis.conn();
    let mut pipe = redis::pipe();
    for i in 0..1050 {
        pipe.cmd("HSET")
            .arg(format!("count:1:s{i:04}"))
            .arg(now - 1000)
            .arg(1)
            .ignore();
        pipe.cmd("ZADD")
            .arg("known:")
            .arg(0)
            .arg(format!("1:s{i:04}"))
            .ignore();
    }
    pipe.query::<()>(&mut c).unwrap();
    let mut cl = cleaner(&redis, "a", 60, 120);
    assert!(cl.hold_lease().await.unwrap());
    let report = cl.pass(now).await.unwrap();
    assert_eq!(
        (report.members_visited, report.hashes_removed),
        (1050, 1050)
    );
    assert!(redis.known("known:").is_empty());
}

/// A write into a hash the cleaner is emptying keeps (or puts back) its `known:` member.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_concurrent_write_keeps_its_index_member() {
    let redis = RedisServer::start();
    let telemetry = Arc::new(Telemetry::new());
    let mut writer = Writer::new(redis.store(), None, telemetry);
    let mut c = cleaner(&redis, "a", 1, 10);
    assert!(c.hold_lease().await.unwrap());
    let now = unix_now();
    let keys = Keys::new("");
    for i in 0..100 {
        seed(&redis, "count:1:race", [now - 1000]);
        index(&redis, "known:", "1:race");
        let window = ClosedWindow {
            start: now + i,
            counters: vec![("race".into(), 1)],
            ..ClosedWindow::default()
        };
        let settings = ChunkSettings {
            keys: keys.clone(),
            retention: Retention::book(&[1], 10),
            schemas: statsd_redis::storage_conf::Schemas::single(Retention::book(&[1], 10)),
            log_ttl_secs: 0,
            max_series: 100,
            quantiles: Default::default(),
        };
        let chunks: Vec<_> = build_chunks(&window, &CounterWrite::everywhere(&[1]), &settings)
            .into_iter()
            .map(|mut chunk| {
                chunk.seq = i + 1;
                Arc::new(chunk)
            })
            .collect();
        let (pass, write) = tokio::join!(c.pass(now), writer.write_chunks("flush:w", &chunks, &[]));
        pass.unwrap();
        assert!(write.error.is_none(), "{:?}", write.error);
        assert_eq!(redis.known("known:"), ["1:race"], "iteration {i}");
        assert!(cmd::<bool>(
            &redis,
            redis::cmd("EXISTS").arg("count:1:race")
        ));
    }
}

#[test]
fn one_agent_cleans_at_a_time_and_another_takes_over_when_it_dies() {
    let redis = RedisServer::start();
    let interval = 2;
    let args = ["--cleaner-interval-secs", "2"];
    let (mut first, _, first_http) = spawn_agent(
        &redis.url(),
        &[&args[..], &["--agent-id", "first"]].concat(),
    );
    // Let the first agent take the lease before the second starts.
    let deadline = std::time::Instant::now() + Duration::from_secs(5);
    while metric_at(([127, 0, 0, 1], first_http).into(), "cleaner_passes_total") < 1.0 {
        assert!(
            std::time::Instant::now() < deadline,
            "first agent never cleaned"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let (mut second, _, second_http) = spawn_agent(
        &redis.url(),
        &[&args[..], &["--agent-id", "second"]].concat(),
    );
    std::thread::sleep(Duration::from_secs(3 * interval));
    let first_passes = metric_at(([127, 0, 0, 1], first_http).into(), "cleaner_passes_total");
    assert!(
        first_passes >= 3.0,
        "the holder keeps cleaning: {first_passes}"
    );
    assert_eq!(
        metric_at(([127, 0, 0, 1], second_http).into(), "cleaner_passes_total"),
        0.0,
        "never both"
    );
    assert_eq!(
        cmd::<String>(&redis, redis::cmd("GET").arg("cleaner:lock")),
        "first"
    );

    first.kill().unwrap();
    first.wait().unwrap();
    let killed = std::time::Instant::now();
    while metric_at(([127, 0, 0, 1], second_http).into(), "cleaner_passes_total") < 1.0 {
        assert!(
            killed.elapsed() < Duration::from_secs(2 * interval),
            "no takeover within two intervals"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        cmd::<String>(&redis, redis::cmd("GET").arg("cleaner:lock")),
        "second"
    );
    second.kill().unwrap();
    second.wait().unwrap();
}

/// Two agents with `retentions`: whichever holds the lease trims each precision at its own count
/// (not the book's 120 for all), and the one that takes over from a dead holder does the same.
#[test]
fn two_agents_trim_each_precision_at_its_count_whoever_holds_the_lease() {
    let redis = RedisServer::start();
    // Seconds kept for 30 s, tens of seconds for 10 minutes; the book's 120 would keep 2 and
    // 20 minutes. Each seeded slice sits at least 25 s from its cutoff, so the test's own pace
    // cannot move it across.
    let args = [
        "--cleaner-interval-secs",
        "1",
        "--retentions",
        "1s:30s,10s:10m",
    ];
    let seed_both = || {
        let now = unix_now();
        let tens = now / 10 * 10;
        cmd::<()>(&redis, redis::cmd("DEL").arg("count:1:x").arg("count:10:x"));
        seed(&redis, "count:1:x", [now - 60, now - 5]);
        index(&redis, "known:", "1:x");
        seed(&redis, "count:10:x", [tens - 900, tens - 300]);
        index(&redis, "known:", "10:x");
        [vec![now - 5], vec![tens - 300]]
    };
    let fields = |key: &str| {
        let mut slices: Vec<u64> = cmd(&redis, redis::cmd("HKEYS").arg(key));
        slices.sort();
        slices
    };
    let trimmed_by = |http: u16, young: &[Vec<u64>; 2]| {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while [fields("count:1:x"), fields("count:10:x")] != *young {
            assert!(
                std::time::Instant::now() < deadline,
                "not trimmed at the retention's counts: {:?} {:?}, want {young:?}",
                fields("count:1:x"),
                fields("count:10:x")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        // The pass is counted when it ends, after the trimming seen above and the walks that
        // follow it (gauges:, the hourly statistics, slowest:).
        while metric_at(([127, 0, 0, 1], http).into(), "cleaner_passes_total") < 1.0 {
            assert!(
                std::time::Instant::now() < deadline,
                "the trimming agent counted no pass"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    };

    let young = seed_both();
    let (first, _, first_http) = spawn_agent(
        &redis.url(),
        &[&args[..], &["--agent-id", "first"]].concat(),
    );
    let mut first = Killed(first);
    trimmed_by(first_http, &young);
    let (second, _, second_http) = spawn_agent(
        &redis.url(),
        &[&args[..], &["--agent-id", "second"]].concat(),
    );
    let _second = Killed(second);
    first.kill();
    let young = seed_both();
    trimmed_by(second_http, &young);
    assert_eq!(
        cmd::<String>(&redis, redis::cmd("GET").arg("cleaner:lock")),
        "second"
    );
}

fn hset(redis: &RedisServer, key: &str, field: &str, value: &str) {
    cmd::<()>(redis, redis::cmd("HSET").arg(key).arg(field).arg(value));
}

fn gauge_fields(redis: &RedisServer) -> Vec<String> {
    let mut fields: Vec<String> = cmd(redis, redis::cmd("HKEYS").arg("gauges:"));
    fields.sort();
    fields
}

/// A gauge's `gauges:` field goes once no agent wrote the gauge for `forget_idle_secs`, as the
/// finest precision still holding its history shows; a field with no history at all goes at the
/// second pass that finds it so.
#[tokio::test]
async fn gauges_idle_for_the_forget_time_lose_their_field() {
    let redis = RedisServer::start();
    let now = unix_now() / 3600 * 3600;
    let retention = Retention::parse("10s:1h,1m:1d").unwrap();
    // (name, its history: precision and newest slice, if any)
    let gauges: [(&str, Option<(u64, u64)>); 7] = [
        ("live", Some((10, now))),
        ("recent", Some((10, now - 300))),
        ("just_in_time", Some((10, now - 600))),
        ("idle", Some((10, now - 610))),
        ("coarse", Some((60, now - 120))),
        ("coarse_idle", Some((60, now - 3600))),
        ("orphan", None),
    ];
    for (name, history) in gauges {
        hset(&redis, "gauges:", name, "1.5");
        if let Some((p, newest)) = history {
            seed(
                &redis,
                &format!("gauge:{p}:{name}"),
                [newest - 2 * p, newest],
            );
        }
    }
    // Another program's key under a gauge's history name judges nothing: as no history.
    hset(&redis, "gauges:", "foreign", "2");
    cmd::<()>(&redis, redis::cmd("SET").arg("gauge:10:foreign").arg("x"));

    let mut c = retention_cleaner(&redis, "a", 60, &retention).forgetting(600);
    assert!(c.hold_lease().await.unwrap());
    let report = c.pass(now).await.unwrap();
    assert_eq!(report.gauges_removed, 2);
    assert_eq!(
        gauge_fields(&redis),
        [
            "coarse",
            "foreign",
            "just_in_time",
            "live",
            "orphan",
            "recent"
        ]
    );
    let report = c.pass(now).await.unwrap();
    assert_eq!(report.gauges_removed, 2, "no history, twice");
    assert_eq!(
        gauge_fields(&redis),
        ["coarse", "just_in_time", "live", "recent"]
    );
    // The history is the cleaner's as before: a gauge's slices are trimmed by its index only.
    assert!(cmd::<bool>(
        &redis,
        redis::cmd("EXISTS").arg("gauge:10:idle")
    ));
    // Ten seconds on, the gauge last written 600 s before its slice's end has been idle long
    // enough.
    c.pass(now + 10).await.unwrap();
    assert_eq!(gauge_fields(&redis), ["coarse", "live", "recent"]);
}

/// The race the removal is built for: gauges idle for long, written again (with the value
/// they had) while a cleaner passes again and again, judging and removing them. Every field is
/// there afterwards, though the cleaner did remove idle ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gauge_written_again_during_the_pass_keeps_its_field() {
    let redis = RedisServer::start();
    let telemetry = Arc::new(Telemetry::new());
    let mut writer = Writer::new(redis.store(), None, telemetry);
    let now = unix_now();
    let settings = ChunkSettings {
        keys: Keys::new(""),
        retention: Retention::book(&[1], 10),
        schemas: statsd_redis::storage_conf::Schemas::single(Retention::book(&[1], 10)),
        log_ttl_secs: 0,
        max_series: 1000,
        quantiles: Default::default(),
    };
    let mut seq = 0;
    let mut chunks = |start: u64, round: u64| -> Vec<Arc<_>> {
        let window = ClosedWindow {
            start,
            gauges: (0..300)
                .map(|j| (format!("r{round}.g{j}").into(), 7.0))
                .collect(),
            ..ClosedWindow::default()
        };
        build_chunks(&window, &CounterWrite::everywhere(&[1]), &settings)
            .into_iter()
            .map(|mut chunk| {
                seq += 1;
                chunk.seq = seq;
                Arc::new(chunk)
            })
            .collect()
    };
    let stop = tokio_util::sync::CancellationToken::new();
    let cleaning = tokio::spawn({
        let mut c = cleaner(&redis, "a", 1, 10).forgetting(60);
        let stop = stop.clone();
        async move {
            assert!(c.hold_lease().await.unwrap());
            let mut removed = 0;
            while !stop.is_cancelled() {
                removed += c.pass(now).await.unwrap().gauges_removed;
            }
            removed
        }
    });
    for round in 0..40 {
        // Idle: written 1000 s ago (its index emptied, so that passes stay short).
        let old = chunks(now - 1000, round);
        let written = writer.write_chunks("flush:w", &old, &[]).await;
        assert!(written.error.is_none(), "{:?}", written.error);
        cmd::<()>(&redis, redis::cmd("DEL").arg("known:gauge:"));
        tokio::time::sleep(Duration::from_micros(round % 8 * 250)).await;
        let again = chunks(now, round);
        let written = writer.write_chunks("flush:w", &again, &[]).await;
        assert!(written.error.is_none(), "{:?}", written.error);
    }
    // A pass that began before the last write ends before this one starts.
    tokio::time::sleep(Duration::from_millis(200)).await;
    stop.cancel();
    let removed = cleaning.await.unwrap();
    assert!(
        removed > 0,
        "the cleaner removed no idle gauge: no race was run"
    );
    for round in 0..40 {
        let kept: Vec<Option<String>> = cmd(
            &redis,
            redis::cmd("HMGET").arg("gauges:").arg(
                (0..300)
                    .map(|j| format!("r{round}.g{j}"))
                    .collect::<Vec<_>>(),
            ),
        );
        assert!(
            kept.iter().all(|v| v.is_some()),
            "round {round}: {} fields lost",
            kept.iter().filter(|v| v.is_none()).count()
        );
    }
}

/// A `slowest:AccessTime` member goes with its hour's statistics; one whose statistics are
/// there stays.
#[tokio::test]
async fn slowest_members_go_with_their_statistics() {
    let redis = RedisServer::start();
    cmd::<()>(
        &redis,
        redis::cmd("ZADD")
            .arg("slowest:AccessTime")
            .arg(9)
            .arg("gone")
            .arg(3)
            .arg("kept"),
    );
    cmd::<()>(
        &redis,
        redis::cmd("ZADD")
            .arg("stats:kept:AccessTime")
            .arg(1)
            .arg("count"),
    );
    let mut c = cleaner(&redis, "a", 60, 120);
    assert!(c.hold_lease().await.unwrap());
    let report = c.pass(unix_now()).await.unwrap();
    assert_eq!(report.slowest_removed, 1);
    assert_eq!(redis.known("slowest:AccessTime"), ["kept"]);
}

/// A family of hourly statistics is deleted once the hour after the one it holds is over (the
/// hour's ZSET with `:start`, `:last` with `:pstart`, each by its own hour), whoever wrote it;
/// what holds no hour is left alone. The walk is made every five minutes.
#[tokio::test]
async fn hourly_statistics_go_when_the_next_hour_is_over() {
    let redis = RedisServer::start();
    let now = unix_now() / 3600 * 3600 + 1800;
    let hour = |back: u64| hour_of(now - back * 3600);
    let zset = |key: &str| cmd::<()>(&redis, redis::cmd("ZADD").arg(key).arg(1).arg("count"));
    let family = |name: &str, start: Option<String>, pstart: Option<String>| {
        let base = format!("stats:{name}");
        zset(&base);
        zset(&format!("{base}:last"));
        for (suffix, hour) in [(":start", start), (":pstart", pstart)] {
            if let Some(hour) = hour {
                let key = format!("{base}{suffix}");
                cmd::<()>(&redis, redis::cmd("SET").arg(key).arg(hour));
            }
        }
    };
    family("live:AccessTime", Some(hour(0)), Some(hour(1)));
    family("quiet:Histogram", Some(hour(1)), Some(hour(2)));
    family("gone:Distribution", Some(hour(2)), Some(hour(3)));
    family(
        "ancient:AccessTime",
        Some("2000-01-01T00:00:00".into()),
        None,
    );
    family("hourless:AccessTime", None, None);
    zset("stats:other:Thing");

    let mut c = cleaner(&redis, "a", 60, 120);
    assert!(c.hold_lease().await.unwrap());
    let report = c.pass(now).await.unwrap();
    // quiet's :last and :pstart, all of gone's, ancient's hour.
    assert_eq!(report.stats_removed, 2 + 4 + 2);
    let mut left: Vec<String> = cmd(&redis, redis::cmd("KEYS").arg("stats:*"));
    left.sort();
    assert_eq!(
        left,
        [
            "stats:ancient:AccessTime:last",
            "stats:hourless:AccessTime",
            "stats:hourless:AccessTime:last",
            "stats:live:AccessTime",
            "stats:live:AccessTime:last",
            "stats:live:AccessTime:pstart",
            "stats:live:AccessTime:start",
            "stats:other:Thing",
            "stats:quiet:Histogram",
            "stats:quiet:Histogram:start",
        ]
    );
    // Every five minutes: a family gone stale meanwhile waits for the next walk.
    family("later:AccessTime", Some(hour(2)), None);
    assert_eq!(c.pass(now + 60).await.unwrap().stats_removed, 0);
    assert_eq!(c.pass(now + 300).await.unwrap().stats_removed, 2);
}
