//! Series that stop leave nothing behind in Redis: every key of a name no longer sent expires or
//! is removed within a bound set by the configuration (docs/layout.md, the "kept" column), while
//! a second agent on the same Redis that still sends half of the names loses none of them. The
//! agents' clocks are moved on by the test, two hours in all.

mod common;

use std::time::Duration;

use common::*;
use statsd_redis::config::Config;
use statsd_redis::store::clock::Clock;

/// Every type, once, under names that start with `name`.
fn every_type(name: &str) -> String {
    format!(
        "{name}.c:1|c\n{name}.g:5|g\n{name}.t:20|ms\n{name}.h:3|h\n{name}.d:4|d\n\
         {name}.s:u1|s\n_e{{5,4}}:title|text|#service:{name}.e\n"
    )
}

fn config(redis: &RedisServer) -> Config {
    Config {
        retentions: "1s:30s,10s:1m".into(),
        forget_idle_secs: 60,
        cleaner_interval_secs: 1,
        log_idle_secs: 600,
        ..test_config(redis)
    }
}

/// How long a key of each family may live at most once its name stops, as an expiry: the
/// longest retention for set slices, the quantile slices' own retention (two of the coarsest
/// precision: 2 h for the hours), `log_idle_secs` for logs. (The hourly statistics are deleted
/// by the cleaner, once the hour after theirs is over: none may be left.)
fn bound(key: &str) -> i64 {
    match key.split(':').next().unwrap() {
        "set" => 60,
        "hist" => 7200,
        "recent" | "common" => 600,
        other => panic!("{key}: a key of {other} is left"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_name_that_stops_leaves_nothing_without_an_end() {
    let redis = RedisServer::start();
    let start = clock_at(5, 60).now();
    let (a, b) = (Clock::manual(start), Clock::manual(start));
    let stopping = TestAgent::start_at(config(&redis), a.clone());
    let going_on = TestAgent::start_at(config(&redis), b.clone());
    let names: Vec<String> = (0..10).map(|i| format!("gone{i}")).collect();
    let live: Vec<String> = (0..10).map(|i| format!("live{i}")).collect();
    let all: String = names.iter().chain(&live).map(|n| every_type(n)).collect();
    stopping.send_taken(all.as_bytes()).await;
    // 200 s on: the other agent sends the live half every 10 s.
    let half: String = live.iter().map(|n| every_type(n)).collect();
    for _ in 0..20 {
        going_on.send_taken(half.as_bytes()).await;
        for clock in [&a, &b] {
            clock.advance(Duration::from_secs(10));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    going_on.send_taken(half.as_bytes()).await;
    going_on.tick();
    stopping.tick();
    // A cleaner passes each second (either agent's: they share the lease); the 10 s slices are
    // looked at every tenth pass, and two passes decide a field with no history left.
    let gauges = |redis: &RedisServer| -> Vec<String> {
        let mut f: Vec<String> = redis::cmd("HKEYS")
            .arg("gauges:")
            .query(&mut redis.conn())
            .unwrap();
        f.sort();
        f
    };
    let histories = |redis: &RedisServer| -> usize {
        ["count:*gone*", "gauge:*gone*"]
            .iter()
            .map(|pattern| {
                redis::cmd("KEYS")
                    .arg(pattern)
                    .query::<Vec<String>>(&mut redis.conn())
                    .unwrap()
                    .len()
            })
            .sum()
    };
    eventually(
        Duration::from_secs(30),
        "the stopped gauges' fields and histories gone",
        || {
            gauges(&redis) == live.iter().map(|n| format!("{n}.g")).collect::<Vec<_>>()
                && histories(&redis) == 0
        },
    )
    .await;

    // Two hours on: the stopped names' hour and the next are over; the other agent still sends.
    for clock in [&a, &b] {
        clock.advance(Duration::from_secs(7200));
    }
    // A minute more of the live half: the hourly statistics are written once a minute under
    // `retentions` (`coarse_write_secs`).
    for _ in 0..7 {
        going_on.send_taken(half.as_bytes()).await;
        for clock in [&a, &b] {
            clock.advance(Duration::from_secs(10));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let of_gone = |redis: &RedisServer, pattern: &str| -> Vec<String> {
        redis::cmd("KEYS")
            .arg(pattern)
            .query(&mut redis.conn())
            .unwrap()
    };
    eventually(
        Duration::from_secs(10),
        "the stopped names' statistics gone",
        || {
            of_gone(&redis, "stats:gone*").is_empty()
                && of_gone(&redis, "stats:live*:start").len() == 30
                && !redis
                    .known("slowest:AccessTime")
                    .iter()
                    .any(|m| m.starts_with("gone"))
        },
    )
    .await;

    let mut conn = redis.conn();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut conn).unwrap();
    let mut of_stopped = 0;
    for key in &keys {
        let ttl: i64 = redis::cmd("TTL").arg(key).query(&mut conn).unwrap();
        if names.iter().any(|n| key.contains(&format!("{n}."))) {
            of_stopped += 1;
            assert!(
                ttl > 0 && ttl <= bound(key),
                "{key}: TTL {ttl} s, bound {} s",
                bound(key)
            );
        }
    }
    assert!(
        of_stopped > 0,
        "no expiring key of the stopped names was looked at"
    );
    // The indexes and the hashes they index: nothing of a stopped name.
    for index in ["known:", "known:gauge:"] {
        let members = redis.known(index);
        assert!(
            members.iter().all(|m| !m.contains("gone")),
            "{index}: {members:?}"
        );
        for n in &live {
            let series = if index == "known:" { "c" } else { "g" };
            assert!(
                members.contains(&format!("1:{n}.{series}")),
                "{index} lost {n}: {members:?}"
            );
        }
    }
    // The live half has everything: its statistics, counts, sets and logs.
    for n in &live {
        for key in [
            format!("stats:{n}.t:AccessTime"),
            format!("count:1:{n}.c"),
            format!("gauge:10:{n}.g"),
            format!("recent:{n}.e:info"),
        ] {
            assert!(keys.contains(&key), "{key} lost");
        }
    }
    // A name that comes back starts afresh: the agent forgot the gauge, so a delta starts from 0.
    stopping.send_taken(b"gone3.g:+2|g").await;
    stopping.tick();
    eventually(Duration::from_secs(5), "the gauge back", || {
        redis::cmd("HGET")
            .arg("gauges:")
            .arg("gone3.g")
            .query::<Option<String>>(&mut redis.conn())
            .unwrap()
            .as_deref()
            == Some("2.0")
    })
    .await;
    stopping.stop().await;
    going_on.stop().await;
}
