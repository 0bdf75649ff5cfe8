//! Exactly once under the faults that break naive retries: a copy of a flush delivered after
//! its retry was acknowledged, and a connection that stalls and cuts at random under load.

mod common;

use std::net::{SocketAddr, UdpSocket};
use std::sync::atomic::Ordering;
use std::time::Duration;

use common::proxy::{FaultProxy, Mode};
use common::*;
use statsd_redis::config::Config;

fn via_proxy(redis: &RedisServer, proxy: &FaultProxy) -> Config {
    Config {
        redis: format!("redis://{}/0", proxy.addr),
        // Retries come quickly after a stall.
        redis_timeout_ms: 300,
        // Only the flusher talks to Redis: every held write is a flush.
        cleaner_enabled: false,
        ..test_config(redis)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_delivered_after_its_retry_was_acknowledged_is_not_applied_again() {
    let (redis, port) = RedisServer::start_tcp();
    let proxy = FaultProxy::start(([127, 0, 0, 1], port).into(), 1).await;
    let agent = TestAgent::start(via_proxy(&redis, &proxy));
    // A first flush loads the script, so the held copy is a whole flush.
    agent.send(b"warm:1|c");
    eventually(Duration::from_secs(10), "first flush", || {
        redis.counter_total(1, "warm") == 1
    })
    .await;

    proxy.set_mode(Mode::HoldNextFlush);
    agent.send(b"late:5|c\nlate.t:2|ms");
    // The agent times out on the held copy and writes the chunk again on a new connection.
    eventually(Duration::from_secs(10), "the retry was applied", || {
        redis.counter_total(1, "late") == 5
    })
    .await;
    // Later flushes are acknowledged too, before the old copy arrives.
    agent.send(b"after:1|c");
    eventually(Duration::from_secs(10), "a later flush", || {
        redis.counter_total(1, "after") == 1
    })
    .await;
    proxy.release();
    eventually(
        Duration::from_secs(10),
        "the held copy reached Redis",
        || proxy.delivered_late.load(Ordering::SeqCst) == 1,
    )
    .await;

    assert!(agent.metric("redis_errors_total") >= 1.0);
    agent.stop().await;
    for p in PRECISIONS {
        assert_eq!(redis.counter_total(p, "late"), 5, "precision {p}");
    }
    let count: f64 = redis::cmd("ZSCORE")
        .arg("stats:late.t:AccessTime")
        .arg("count")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(count, 1.0);
}

/// Sends `lines` counts a datagram to `series` series, every 10 ms for `d`: about 5000 lines a
/// second at 50. Returns the total sent to each series.
async fn send_load(to: SocketAddr, d: Duration, lines: usize, series: usize) -> Vec<i64> {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let mut sent = vec![0; series];
    let datagram: String = (0..lines)
        .map(|i| format!("load.{}:1|c\n", i % series))
        .collect();
    let until = std::time::Instant::now() + d;
    while std::time::Instant::now() < until {
        socket.send_to(datagram.as_bytes(), to).unwrap();
        for i in 0..lines {
            sent[i % series] += 1;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    sent
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn random_stalls_and_cuts_under_load_neither_lose_nor_double() {
    let (redis, port) = RedisServer::start_tcp();
    let proxy = FaultProxy::start(([127, 0, 0, 1], port).into(), 7).await;
    let agent = TestAgent::start(via_proxy(&redis, &proxy));
    proxy.set_mode(Mode::Chaos);
    let sent = send_load(agent.udp[0], Duration::from_secs(20), 50, 10).await;
    proxy.set_mode(Mode::Pass);
    eventually(Duration::from_secs(30), "backlog written", || {
        agent.metric("backlog_windows") == 0.0
    })
    .await;
    let (cuts, stalls) = (
        proxy.cuts.load(Ordering::SeqCst),
        proxy.stalls.load(Ordering::SeqCst),
    );
    assert!(
        cuts >= 3 && stalls >= 3,
        "faults: {cuts} cuts, {stalls} stalls"
    );
    assert_eq!(agent.metric("windows_dropped_total"), 0.0);
    agent.stop().await;
    // Stalled writes still in the proxy arrive within its longest stall.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for p in PRECISIONS {
        for (i, &n) in sent.iter().enumerate() {
            let series = format!("load.{i}");
            assert_eq!(
                redis.counter_total(p, &series),
                n,
                "{series} at precision {p}"
            );
        }
    }
}
