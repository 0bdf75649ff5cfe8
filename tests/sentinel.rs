//! Sentinel mode against a private 1 master + 2 replicas + 3 sentinels: the master killed under
//! load with `wait_replicas = 1`, nothing lost or doubled on the promoted replica; the old master
//! restarted becomes a replica and changes nothing.

mod common;

use std::time::Duration;

use common::topology::Sentinels;
use common::*;
use statsd_redis::config::{Config, RedisMode};

fn totals(conn: &mut redis::Connection, precision: u64, series: &str) -> i64 {
    let raw: Vec<(String, String)> = redis::cmd("HGETALL")
        .arg(format!("count:{precision}:{series}"))
        .query(conn)
        .unwrap();
    raw.iter().map(|(_, c)| c.parse::<i64>().unwrap()).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_master_killed_under_load_with_wait_loses_and_doubles_nothing() {
    let mut sentinels = Sentinels::start();
    let agent = TestAgent::start(Config {
        udp: vec!["127.0.0.1:0".parse().unwrap()],
        http: "127.0.0.1:0".parse().unwrap(),
        redis_mode: RedisMode::Sentinel,
        redis_sentinels: sentinels.sentinel_addrs(),
        redis_master_name: sentinels.master_name().to_string(),
        wait_replicas: 1,
        wait_timeout_ms: 200,
        redis_timeout_ms: 500,
        ..Config::default()
    });
    let load = tokio::spawn(send_load(agent.udp[0], Duration::from_secs(10), 50, 20));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let old = sentinels.master_port();
    sentinels.kill(old);
    let new = sentinels.wait_new_master(old, Duration::from_secs(30));
    let sent = load.await.unwrap();
    eventually(Duration::from_secs(30), "backlog written", || {
        agent.metric("backlog_windows") == 0.0
    })
    .await;
    assert_eq!(agent.metric("windows_dropped_total"), 0.0);
    assert!(agent.metric("redis_reconnects_total") >= 1.0);
    agent.stop().await;

    let check = |sentinels: &Sentinels, port: u16| {
        let mut conn = sentinels.conn(port);
        for p in PRECISIONS {
            for (i, &n) in sent.iter().enumerate() {
                let series = format!("load.{i}");
                assert_eq!(
                    totals(&mut conn, p, &series),
                    n,
                    "{series} at {p} on {port}"
                );
            }
        }
    };
    check(&sentinels, new);
    // The CLI finds the new master through the sentinels.
    let out = bin()
        .args(["get", "counter", "load.0", "--precision", "86400", "--json"])
        .args([
            "--redis-mode",
            "sentinel",
            "--redis-sentinels",
            &sentinels.sentinel_addrs().join(","),
        ])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let samples: Vec<(u64, i64)> = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(samples.iter().map(|s| s.1).sum::<i64>(), sent[0]);
    // The old master comes back as a replica, with the master's data. (The sentinels may have
    // moved the master on meanwhile: the one they name now.)
    sentinels.restart(old);
    let master = sentinels.master_port();
    sentinels.wait_replica_of(old, master, Duration::from_secs(30));
    check(&sentinels, master);
    check(&sentinels, old);
}
