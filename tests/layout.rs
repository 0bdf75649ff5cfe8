//! Every StatsD type in the book's layout, read back with the book's reader semantics; the
//! hourly rollover; exactly-once flushes through a lost reply; and a Redis outage.

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::*;
use statsd_redis::aggregate::StatKind;
use statsd_redis::config::Config;
use statsd_redis::store::Keys;

/// The book's `get_stats`: the ZSET as a map, plus average and sample standard deviation.
fn get_stats(redis: &RedisServer, key: &str) -> BTreeMap<String, f64> {
    let mut data: BTreeMap<String, f64> = redis::cmd("ZRANGE")
        .arg(key)
        .arg(0)
        .arg(-1)
        .arg("WITHSCORES")
        .query::<Vec<(String, f64)>>(&mut redis.conn())
        .unwrap()
        .into_iter()
        .collect();
    if let (Some(&count), Some(&sum), Some(&sumsq)) =
        (data.get("count"), data.get("sum"), data.get("sumsq"))
    {
        data.insert("average".into(), sum / count);
        let numerator = sumsq - sum * sum / count;
        data.insert(
            "stddev".into(),
            (numerator / (count - 1.0).max(1.0)).max(0.0).sqrt(),
        );
    }
    data
}

fn get<T: redis::FromRedisValue>(redis: &RedisServer, cmd: &mut redis::Cmd) -> T {
    cmd.query(&mut redis.conn()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn timers_histograms_and_distributions_become_hourly_stats() {
    clear_of_the_hour(60).await;
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    agent.send(b"ctx:100|ms\nctx:200|ms\nfast:50|ms\nsize:3|h\nsize:5|h|@0.5\nlat:7|d");
    let keys = Keys::new("");
    eventually(Duration::from_secs(3), "stats written", || {
        get_stats(&redis, &keys.stats("lat", StatKind::Distribution)).contains_key("count")
    })
    .await;
    let ctx = get_stats(&redis, &keys.stats("ctx", StatKind::Timer));
    assert_eq!(
        (
            ctx["min"],
            ctx["max"],
            ctx["count"],
            ctx["sum"],
            ctx["sumsq"]
        ),
        (100.0, 200.0, 2.0, 300.0, 50000.0)
    );
    assert_eq!(ctx["average"], 150.0);
    assert!((ctx["stddev"] - 70.710678).abs() < 1e-5, "{ctx:?}");
    let size = get_stats(&redis, "stats:size:Histogram");
    assert_eq!(
        (size["count"], size["sum"], size["min"], size["max"]),
        (3.0, 13.0, 3.0, 5.0)
    );
    assert_eq!(get_stats(&redis, "stats:lat:Distribution")["sum"], 7.0);
    let start: String = get(&redis, redis::cmd("GET").arg("stats:ctx:AccessTime:start"));
    assert_eq!(start, hour_of(unix_now()));

    // The book's slowest list: highest average first.
    let slowest: Vec<(String, f64)> = get(
        &redis,
        redis::cmd("ZREVRANGE")
            .arg("slowest:AccessTime")
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES"),
    );
    assert_eq!(
        slowest,
        [("ctx".to_string(), 150.0), ("fast".to_string(), 50.0)]
    );

    // A second window merges into the same hour: min/max kept, the rest added.
    agent.send(b"ctx:10|ms");
    eventually(Duration::from_secs(3), "second window merged", || {
        get_stats(&redis, "stats:ctx:AccessTime")["count"] == 3.0
    })
    .await;
    let ctx = get_stats(&redis, "stats:ctx:AccessTime");
    assert_eq!((ctx["min"], ctx["max"], ctx["sum"]), (10.0, 200.0, 310.0));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn slowest_keeps_the_hundred_highest() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    let lines: String = (1..=150).map(|i| format!("page{i}:{i}|ms\n")).collect();
    agent.send(lines.as_bytes());
    // The window's timers may come in several chunks: the ranking is read once all have.
    eventually(Duration::from_secs(3), "every timer written", || {
        get::<Vec<String>>(&redis, redis::cmd("KEYS").arg("stats:page*:AccessTime")).len() == 150
    })
    .await;
    let top: Vec<String> = get(
        &redis,
        redis::cmd("ZREVRANGE")
            .arg("slowest:AccessTime")
            .arg(0)
            .arg(-1),
    );
    assert_eq!(top.len(), 100);
    assert_eq!((top[0].as_str(), top[99].as_str()), ("page150", "page51"));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gauges_hold_the_current_and_per_slice_values() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(Config {
        precisions: vec![1, 60],
        ..test_config(&redis)
    });
    agent.send(b"temp:10|g\ntemp:-3|g\ntemp:+1|g\nfresh:+5|g");
    eventually(Duration::from_secs(3), "gauges written", || {
        get::<BTreeMap<String, f64>>(&redis, redis::cmd("HGETALL").arg("gauges:")).len() == 2
    })
    .await;
    let gauges: BTreeMap<String, f64> = get(&redis, redis::cmd("HGETALL").arg("gauges:"));
    assert_eq!(
        gauges,
        BTreeMap::from([("fresh".into(), 5.0), ("temp".into(), 8.0)])
    );
    let per_minute: BTreeMap<u64, f64> = get(&redis, redis::cmd("HGETALL").arg("gauge:60:temp"));
    assert_eq!(per_minute.values().copied().collect::<Vec<_>>(), [8.0]);
    assert!(per_minute.keys().all(|s| s % 60 == 0));
    let mut known: Vec<String> = redis.known("known:gauge:");
    known.sort();
    assert_eq!(known, ["1:fresh", "1:temp", "60:fresh", "60:temp"]);
    // A delta in a later window starts from the remembered value.
    agent.send(b"temp:+2|g");
    eventually(Duration::from_secs(3), "delta applied", || {
        get::<BTreeMap<String, f64>>(&redis, redis::cmd("HGETALL").arg("gauges:"))["temp"] == 10.0
    })
    .await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sets_count_distinct_members_per_slice_and_expire() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(Config {
        precisions: vec![1, 60],
        sample_count: 10,
        ..test_config(&redis)
    });
    let sent = unix_now();
    agent.send(b"users:alice|s\nusers:bob|s\nusers:alice|s\nusers:1:2|s");
    let minute = sent / 60 * 60;
    let key = Keys::new("").set(60, "users", minute);
    eventually(Duration::from_secs(3), "set written", || {
        get::<u64>(&redis, redis::cmd("PFCOUNT").arg(&key)) > 0
    })
    .await;
    assert_eq!(get::<u64>(&redis, redis::cmd("PFCOUNT").arg(&key)), 3);
    let expire_at: u64 = get(&redis, redis::cmd("EXPIRETIME").arg(&key));
    assert_eq!(expire_at, minute + 10 * 60);
    agent.stop().await;
}

/// The agent's clock 300 s behind Redis's (libfaketime under the agent): the expiry times the
/// agent computes on its own clock (a slice's start plus its retention) are moved to Redis's, so
/// a 1 s set slice lives its 120 s, not none, and a minute's quantile buckets their two hours,
/// not 300 s less. The skew is exported.
#[test]
fn a_clock_behind_redis_expires_nothing_early() {
    let redis = RedisServer::start();
    let args = ["--quantile-write-secs", "0", "--cleaner-enabled", "false"];
    let (agent, udp, http) = spawn_agent_with_clock("-300s", &redis.url(), &args);
    let agent = Killed(agent);
    let members: String = (0..600).map(|i| format!("users:u{i}|s\n")).collect();
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .send_to(format!("{members}lat:5|ms").as_bytes(), ("127.0.0.1", udp))
        .unwrap();
    // Written: the window's set slices and its minute's buckets (or, expired on write, never).
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    while std::time::Instant::now() < deadline
        && get::<Vec<String>>(&redis, redis::cmd("KEYS").arg("hist:60:lat:*")).is_empty()
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    let sets: Vec<String> = get(&redis, redis::cmd("KEYS").arg("set:1:users:*"));
    assert!(!sets.is_empty(), "the 1 s slices expired on write");
    let members: u64 = sets
        .iter()
        .map(|k| get::<u64>(&redis, redis::cmd("PFCOUNT").arg(k)))
        .sum();
    assert!((590..=610).contains(&members), "{members} of 600");
    for key in &sets {
        let ttl: i64 = get(&redis, redis::cmd("TTL").arg(key));
        assert!((110..=120).contains(&ttl), "{key}: {ttl} s left of 120");
    }
    let buckets: Vec<String> = get(&redis, redis::cmd("KEYS").arg("hist:60:lat:*"));
    assert_eq!(buckets.len(), 1);
    let ttl: i64 = get(&redis, redis::cmd("TTL").arg(&buckets[0]));
    assert!(ttl > 120 * 60 - 90, "{}: {ttl} s left of 7200", buckets[0]);
    let skew = metric_at(([127, 0, 0, 1], http).into(), "redis_clock_skew_seconds");
    assert!((295.0..305.0).contains(&skew), "skew {skew}");
    drop(agent);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn events_and_service_checks_become_recent_and_common_logs() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    agent.send(
        b"_e{9,12}:disk full|on /var/data|t:error|#service:api\n_e{9,12}:disk full|on /var/data|t:error|#service:api\n\
          _sc|db|2|m:replica down\n_sc|db|0\n_e{6,0}:deploy||s:ci",
    );
    eventually(Duration::from_secs(3), "logs written", || {
        get::<usize>(&redis, redis::cmd("LLEN").arg("recent:ci:info")) == 1
    })
    .await;
    let recent: Vec<String> = get(
        &redis,
        redis::cmd("LRANGE").arg("recent:api:error").arg(0).arg(-1),
    );
    assert_eq!(recent.len(), 2);
    // time.asctime() prefix: "Sun Nov 22 04:30:00 2026 disk full: on /var/data".
    let (stamp, message) = recent[0].split_at(24);
    assert_eq!(message, " disk full: on /var/data");
    assert_eq!(stamp.len(), 24);
    assert!(stamp.ends_with(&hour_of(unix_now())[..4]), "{stamp}");
    let common: Vec<(String, f64)> = get(
        &redis,
        redis::cmd("ZRANGE")
            .arg("common:api:error")
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES"),
    );
    assert_eq!(common, [("disk full: on /var/data".to_string(), 2.0)]);
    let critical: Vec<String> = get(
        &redis,
        redis::cmd("LRANGE")
            .arg("recent:db:critical")
            .arg(0)
            .arg(-1),
    );
    assert!(critical[0].ends_with(" replica down"), "{critical:?}");
    let ok: Vec<String> = get(
        &redis,
        redis::cmd("LRANGE").arg("recent:db:info").arg(0).arg(-1),
    );
    assert!(ok[0].ends_with(" ok"), "{ok:?}");
    let start: String = get(&redis, redis::cmd("GET").arg("common:api:error:start"));
    assert_eq!(start, hour_of(unix_now()));
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recent_logs_keep_the_newest_hundred() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    let lines: String = (0..150)
        .map(|i| format!("_sc|job|1|m:run {i:03}\n"))
        .collect();
    agent.send(lines.as_bytes());
    // The window's 150 logs come in two chunks (`max_series_per_chunk`, 100): read once the
    // second has landed, its last line on top.
    eventually(Duration::from_secs(3), "every chunk's logs written", || {
        get::<Option<String>>(
            &redis,
            redis::cmd("LINDEX").arg("recent:job:warning").arg(0),
        )
        .is_some_and(|newest| newest.ends_with("run 149"))
    })
    .await;
    let recent: Vec<String> = get(
        &redis,
        redis::cmd("LRANGE")
            .arg("recent:job:warning")
            .arg(0)
            .arg(-1),
    );
    let runs: Vec<&str> = recent.iter().map(|l| &l[l.len() - 3..]).collect();
    let newest_first: Vec<String> = (50..150).rev().map(|i| format!("{i:03}")).collect();
    assert_eq!(runs, newest_first, "the newest hundred, newest first");
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_older_hour_rolls_over_to_last_and_pstart() {
    let redis = RedisServer::start();
    // Ten minutes into an hour, the statistics of the hour before (the cleaner deletes an hour
    // once the next one is over: docs/layout.md), the logs of one long gone (they keep theirs).
    let clock = clock_at(600, 3600);
    let at = clock.unix_now();
    let previous_hour = hour_of(at - 3600);
    let old_hour = "2000-01-01T00:00:00";
    let mut c = redis.conn();
    redis::pipe()
        .cmd("ZADD")
        .arg("stats:ctx:AccessTime")
        .arg(1)
        .arg("min")
        .arg(9)
        .arg("max")
        .arg(3)
        .arg("count")
        .arg(15)
        .arg("sum")
        .arg(83)
        .arg("sumsq")
        .cmd("SET")
        .arg("stats:ctx:AccessTime:start")
        .arg(&previous_hour)
        .cmd("ZADD")
        .arg("common:db:critical")
        .arg(4)
        .arg("old message")
        .cmd("SET")
        .arg("common:db:critical:start")
        .arg(old_hour)
        .query::<()>(&mut c)
        .unwrap();
    let agent = TestAgent::start_at(test_config(&redis), clock);
    agent.send_taken(b"ctx:42|ms\n_sc|db|2|m:new message").await;
    agent.tick();
    eventually(Duration::from_secs(3), "rollover", || {
        get::<Option<String>>(&redis, redis::cmd("GET").arg("common:db:critical:pstart")).is_some()
    })
    .await;
    let now_hour = hour_of(at);

    let last = get_stats(&redis, "stats:ctx:AccessTime:last");
    assert_eq!(
        (last["count"], last["sum"], last["min"], last["max"]),
        (3.0, 15.0, 1.0, 9.0)
    );
    let pstart: String = get(&redis, redis::cmd("GET").arg("stats:ctx:AccessTime:pstart"));
    assert_eq!(pstart, previous_hour);
    let current = get_stats(&redis, "stats:ctx:AccessTime");
    assert_eq!(
        (
            current["count"],
            current["sum"],
            current["min"],
            current["max"]
        ),
        (1.0, 42.0, 42.0, 42.0)
    );
    let start: String = get(&redis, redis::cmd("GET").arg("stats:ctx:AccessTime:start"));
    assert_eq!(start, now_hour);

    let last: Vec<(String, f64)> = get(
        &redis,
        redis::cmd("ZRANGE")
            .arg("common:db:critical:last")
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES"),
    );
    assert_eq!(last, [("old message".to_string(), 4.0)]);
    let current: Vec<(String, f64)> = get(
        &redis,
        redis::cmd("ZRANGE")
            .arg("common:db:critical")
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES"),
    );
    assert_eq!(current, [("new message".to_string(), 1.0)]);
    let pstart: String = get(&redis, redis::cmd("GET").arg("common:db:critical:pstart"));
    assert_eq!(pstart, old_hour);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_reply_is_retried_without_applying_twice() {
    clear_of_the_hour(60).await;
    let (redis, port) = RedisServer::start_tcp();
    let proxy = LossyProxy::start(([127, 0, 0, 1], port).into()).await;
    let agent = TestAgent::start(Config {
        redis: format!("redis://{}/0", proxy.addr),
        // The proxy cuts the first `[1]` reply: let it be the flush's.
        cleaner_enabled: false,
        ..test_config(&redis)
    });
    agent.send(b"once:7|c\nonce.t:5|ms\nonce.g:+3|g\n_sc|once|1|m:retried");
    eventually(
        Duration::from_secs(10),
        "the retry found the chunk applied",
        || agent.metric("chunks_applied_before_total") == 1.0,
    )
    .await;
    assert_eq!(proxy.cuts.load(std::sync::atomic::Ordering::SeqCst), 1);
    assert!(agent.metric("redis_errors_total") >= 1.0);
    agent.stop().await;
    for p in PRECISIONS {
        assert_eq!(redis.counter_total(p, "once"), 7, "precision {p}");
    }
    assert_eq!(get_stats(&redis, "stats:once.t:AccessTime")["count"], 1.0);
    let hour = unix_now() / 3600 * 3600;
    assert_eq!(
        redis.hist_total(&format!("hist:3600:once.t:AccessTime:{hour}")),
        1.0
    );
    let gauge: f64 = get(&redis, redis::cmd("HGET").arg("gauges:").arg("once.g"));
    assert_eq!(gauge, 3.0);
    assert_eq!(
        get::<usize>(&redis, redis::cmd("LLEN").arg("recent:once:warning")),
        1
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ten_second_outage_loses_and_doubles_nothing() {
    let aof = ["--appendonly", "yes", "--appendfsync", "always"];
    let mut redis = RedisServer::start_with(&aof);
    let agent = TestAgent::start(Config {
        redis_timeout_ms: 500,
        ..test_config(&redis)
    });
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let to = agent.udp[0];
    let mut sent = send_steadily(&socket, to, Duration::from_secs(2)).await;
    // Down for ten seconds while the sending goes on.
    let outage = tokio::task::spawn_blocking(move || {
        redis.restart_after(Duration::from_secs(10), &aof);
        redis
    });
    sent += send_steadily(&socket, to, Duration::from_secs(11)).await;
    let redis = outage.await.unwrap();
    sent += send_steadily(&socket, to, Duration::from_secs(1)).await;
    eventually(Duration::from_secs(15), "backlog written", || {
        agent.metric("backlog_windows") == 0.0
    })
    .await;
    assert!(
        agent.metric(r#"flushes_total{outcome="error"}"#) >= 1.0,
        "the outage was seen"
    );
    assert_eq!(agent.metric("windows_dropped_total"), 0.0);
    assert!(agent.metric("redis_reconnects_total") >= 1.0);
    agent.stop().await;
    for p in PRECISIONS {
        assert_eq!(redis.counter_total(p, "steady"), sent, "precision {p}");
    }
}

/// Sends 3 counts every 20 ms for `d`; returns how many were sent.
async fn send_steadily(socket: &std::net::UdpSocket, to: std::net::SocketAddr, d: Duration) -> i64 {
    let until = std::time::Instant::now() + d;
    let mut sent = 0;
    while std::time::Instant::now() < until {
        socket.send_to(b"steady:1|c\nsteady:2|c", to).unwrap();
        sent += 3;
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_backlog_drops_the_oldest_window_and_counts_it() {
    let mut redis = RedisServer::start();
    let agent = TestAgent::start(Config {
        max_backlog_windows: 2,
        redis_timeout_ms: 200,
        ..test_config(&redis)
    });
    redis.kill();
    let started = std::time::Instant::now();
    while started.elapsed() < Duration::from_millis(4500) {
        agent.send(b"dropped:1|c");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    eventually(Duration::from_secs(3), "drops counted", || {
        agent.metric("windows_dropped_total") >= 2.0
    })
    .await;
    assert_eq!(agent.metric("backlog_windows"), 2.0);
    agent.shutdown.cancel();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn windows_close_on_schedule_while_redis_is_slow() {
    let redis = RedisServer::start_with(&["--enable-debug-command", "yes"]);
    let agent = TestAgent::start(Config {
        redis_timeout_ms: 10_000,
        ..test_config(&redis)
    });
    // Redis serves nothing for 3 s: every write in that time waits.
    let mut conn = redis.conn();
    let stall = std::thread::spawn(move || {
        redis::cmd("DEBUG")
            .arg("SLEEP")
            .arg(3)
            .query::<()>(&mut conn)
            .unwrap()
    });
    let mut seconds = std::collections::BTreeSet::new();
    let mut sent = 0;
    let mut largest_backlog = 0.0f64;
    let until = std::time::Instant::now() + Duration::from_millis(3500);
    while std::time::Instant::now() < until {
        agent.send(b"stall:1|c");
        sent += 1;
        seconds.insert(unix_now());
        largest_backlog = largest_backlog.max(agent.metric("backlog_windows"));
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    stall.join().unwrap();
    eventually(Duration::from_secs(10), "backlog written", || {
        agent.metric("backlog_windows") == 0.0
    })
    .await;
    agent.stop().await;

    assert!(
        largest_backlog >= 2.0,
        "the stall showed as backlog: {largest_backlog}"
    );
    let slices = redis.get_counter("count:1:stall");
    assert_eq!(slices.values().sum::<i64>(), sent);
    // Each second of sending is its own 1-second slice, none holding several seconds.
    assert!(
        slices.len() + 1 >= seconds.len(),
        "{} slices for {} seconds: {slices:?}",
        slices.len(),
        seconds.len()
    );
    assert!(slices.values().all(|&n| n <= 12), "{slices:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coarse_writes_keep_every_precision_and_the_stats_exact() {
    // The whole test's statistics in one hour (its waits add up to about 20 s at most).
    clear_of_the_hour(60).await;
    let redis = RedisServer::start();
    // 1 s every window; 2 s once per 2 s with the stats; 3 s and 60 s once per 3 s.
    let precisions = [1, 2, 3, 60];
    let agent = TestAgent::start(Config {
        coarse_write_secs: Some(3),
        precisions: precisions.to_vec(),
        ..test_config(&redis)
    });
    let (mut sent, mut timed) = (0, 0);
    let until = std::time::Instant::now() + Duration::from_millis(2500);
    while std::time::Instant::now() < until {
        agent
            .send(b"grouped:1|c\ngrouped:2|c\ngrouped.lat:10|ms\ngrouped.lat:30|ms\ngrouped.g:7|g");
        sent += 3;
        timed += 2;
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // Written while running, within two periods.
    eventually(Duration::from_secs(15), "every precision written", || {
        precisions
            .iter()
            .all(|&p| redis.counter_total(p, "grouped") == sent)
    })
    .await;
    let lat = get_stats(&redis, "stats:grouped.lat:AccessTime");
    assert_eq!(
        (lat["count"], lat["sum"]),
        (timed as f64, 20.0 * timed as f64)
    );
    assert_eq!((lat["min"], lat["max"]), (10.0, 30.0));
    let slowest: Option<f64> = get(
        &redis,
        redis::cmd("ZSCORE")
            .arg("slowest:AccessTime")
            .arg("grouped.lat"),
    );
    assert_eq!(slowest, Some(20.0));
    let known = redis.known("known:");
    let known_gauges = redis.known("known:gauge:");
    for p in precisions {
        assert!(known.contains(&format!("{p}:grouped")), "{p}: {known:?}");
        // Gauges are written at every precision every window, as without coarse writes.
        assert!(
            known_gauges.contains(&format!("{p}:grouped.g")),
            "{p}: {known_gauges:?}"
        );
    }
    let gauge: Option<f64> = get(&redis, redis::cmd("HGET").arg("gauges:").arg("grouped.g"));
    assert_eq!(gauge, Some(7.0));

    // What arrives just before a shutdown is written at every precision too.
    agent.send(b"grouped:4|c\ngrouped.lat:50|ms");
    tokio::time::sleep(Duration::from_millis(100)).await;
    agent.stop().await;
    for p in precisions {
        assert_eq!(redis.counter_total(p, "grouped"), sent + 4, "precision {p}");
    }
    let lat = get_stats(&redis, "stats:grouped.lat:AccessTime");
    assert_eq!((lat["count"], lat["max"]), (timed as f64 + 1.0, 50.0));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn index_members_lost_with_redis_data_come_back_within_the_longest_period() {
    let redis = RedisServer::start();
    // 1 s every window; 2 s once per 2 s (with the 1 s index); 6 s once per 6 s.
    let precisions = [1, 2, 6];
    let agent = TestAgent::start(Config {
        coarse_write_secs: Some(6),
        precisions: precisions.to_vec(),
        ..test_config(&redis)
    });
    let members: Vec<String> = precisions.iter().map(|p| format!("{p}:steady")).collect();
    let indexed = || {
        let known = redis.known("known:");
        members.iter().all(|m| known.contains(m))
    };
    let sending = async {
        loop {
            agent.send(b"steady:1|c");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    let checks = async {
        eventually(
            Duration::from_secs(15),
            "indexed at every precision",
            indexed,
        )
        .await;
        // The index lost, as with a Redis restarted without its data: the series goes on being
        // written in group after group, which alone would not add its members again.
        let _: () = get(&redis, redis::cmd("DEL").arg("known:"));
        eventually(
            Duration::from_secs(15),
            "indexed again within the longest period",
            indexed,
        )
        .await;
    };
    tokio::select! {
        _ = sending => unreachable!("sends until the checks end"),
        _ = checks => {}
    }
    agent.stop().await;
}
