//! `wait_replicas`: a window counts as written only once `WAIT` reports enough replicas. While
//! they are missing the window stays in the backlog and its chunks are sent again and again;
//! each copy after the first is answered "applied before", so nothing is doubled, and once a
//! replica has everything the backlog drains.

mod common;

use std::time::Duration;

use common::*;
use statsd_redis::config::Config;

fn query<T: redis::FromRedisValue>(redis: &RedisServer, cmd: &mut redis::Cmd) -> T {
    cmd.query(&mut redis.conn()).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_the_replicas_asked_for_windows_wait_and_are_applied_once() {
    let (master, port) = RedisServer::start_tcp();
    let agent = TestAgent::start(Config {
        wait_replicas: 1,
        wait_timeout_ms: 50,
        ..test_config(&master)
    });
    let sent = send_load(agent.udp[0], Duration::from_secs(3), 20, 4).await;
    // No replica: WAIT comes back short, the windows stay queued, and are re-sent.
    eventually(Duration::from_secs(10), "short WAITs", || {
        agent.metric("replica_waits_short_total") >= 3.0
    })
    .await;
    assert!(agent.metric("backlog_windows") >= 1.0);
    assert_eq!(agent.metric("flushes_total{outcome=\"ok\"}"), 0.0);
    assert!(agent.metric("chunks_applied_before_total") >= 1.0);

    let replica = RedisServer::start_with(&["--replicaof", "127.0.0.1", &port.to_string()]);
    eventually(Duration::from_secs(30), "the backlog drains", || {
        agent.metric("backlog_windows") == 0.0
    })
    .await;
    assert_eq!(agent.metric("windows_dropped_total"), 0.0);
    agent.stop().await;
    // The replica has what the master has, and the master has each count once.
    eventually(Duration::from_secs(10), "the replica caught up", || {
        replica.counter_total(1, "load.0") == sent[0]
    })
    .await;
    for p in PRECISIONS {
        for (i, &n) in sent.iter().enumerate() {
            let series = format!("load.{i}");
            assert_eq!(master.counter_total(p, &series), n, "{series} at {p}");
            assert_eq!(
                replica.counter_total(p, &series),
                n,
                "replica: {series} at {p}"
            );
        }
    }
    let role: Vec<redis::Value> = query(&replica, &mut redis::cmd("ROLE"));
    assert_eq!(
        redis::from_redis_value_ref::<String>(&role[0]).unwrap(),
        "slave"
    );
}
