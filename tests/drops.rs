//! Every drop is visible: datagrams the kernel drops on a full receive queue are counted, so
//! received + dropped always equals sent; several SO_REUSEPORT readers lose nothing.

mod common;

use std::time::Duration;

use common::*;
use statsd_redis::config::Config;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kernel_drops_are_counted_exactly() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(Config {
        // The kernel's minimum: a burst overflows it at once.
        receive_buffer_bytes: 1,
        ..test_config(&redis)
    });
    let sent = tokio::task::spawn_blocking({
        let to = agent.udp[0];
        move || {
            let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
            let line = b"burst:1|c\nburst:1|c\nburst:1|c\nburst:1|c\nburst:1|c";
            for _ in 0..50_000 {
                socket.send_to(line, to).unwrap();
            }
            // The drop count rides on the next datagram the socket queues.
            std::thread::sleep(Duration::from_millis(200));
            socket.send_to(b"burst:1|c", to).unwrap();
            50_001
        }
    })
    .await
    .unwrap();
    eventually(
        Duration::from_secs(5),
        "every datagram received or counted as dropped",
        || {
            agent.metric("packets_received_total") + agent.metric("kernel_drops_total")
                == sent as f64
        },
    )
    .await;
    let dropped = agent.metric("kernel_drops_total");
    assert!(dropped > 0.0, "the burst overflowed the receive queue");
    let received = agent.metric("packets_received_total");
    agent.stop().await;
    // What was received is in Redis, exactly.
    assert_eq!(
        redis.counter_total(1, "burst") as f64,
        (received - 1.0) * 5.0 + 1.0
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn several_readers_share_the_port_and_lose_nothing() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(Config {
        udp_readers: 3,
        ..test_config(&redis)
    });
    assert_eq!(agent.udp.len(), 3);
    assert!(agent.udp.iter().all(|a| *a == agent.udp[0]), "one port");
    // Many senders: the kernel spreads them across the readers by source port.
    let mut sent = 0;
    for s in 0..30 {
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        for _ in 0..100 {
            socket
                .send_to(
                    format!("shared.{}:1|c\nshared.all:2|c", s % 3).as_bytes(),
                    agent.udp[0],
                )
                .unwrap();
            sent += 1;
        }
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    eventually(Duration::from_secs(5), "all received", || {
        agent.metric("packets_received_total") == sent as f64
    })
    .await;
    agent.stop().await;
    assert_eq!(redis.counter_total(60, "shared.all"), 2 * sent);
    let per_series: i64 = (0..3)
        .map(|s| redis.counter_total(1, &format!("shared.{s}")))
        .sum();
    assert_eq!(per_series, sent);
}
