//! The relay through the binary: an agent relays every line it receives to two other agents
//! (real StatsD servers, one over UDP, one over TCP), each with a Redis of its own, and all
//! three hold the same data; a TCP target that is down costs the agent nothing, its lines are
//! counted as dropped, and once it listens the relay connects again.

mod common;

use std::net::UdpSocket;
use std::time::Duration;

use common::*;

/// Lines of every type, tags and sample rates, in datagrams as a client sends them.
fn traffic(i: usize) -> String {
    format!(
        "rel.hits:1|c|#route:cart\nrel.sampled:1|c|@0.5\nrel.lat:{}|ms\nrel.queue:{}|g\n\
         rel.users:u{}|s\nrel.bad:x|c",
        i % 100,
        i,
        i % 7
    )
}

fn send(udp: u16, datagrams: std::ops::Range<usize>) {
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    for i in datagrams {
        socket
            .send_to(traffic(i).as_bytes(), ("127.0.0.1", udp))
            .unwrap();
        if i % 50 == 0 {
            std::thread::sleep(Duration::from_millis(5));
        }
    }
}

/// What one agent wrote: counters at every precision, the timer's count, the gauge, the set's
/// members at the day precision.
fn written(redis: &RedisServer) -> Vec<String> {
    let mut out: Vec<String> = PRECISIONS
        .iter()
        .flat_map(|p| {
            [
                redis.counter_total(*p, "rel.hits;route=cart"),
                redis.counter_total(*p, "rel.sampled"),
            ]
        })
        .map(|n| n.to_string())
        .collect();
    let mut conn = redis.conn();
    let count: Option<String> = redis::cmd("ZSCORE")
        .arg("stats:rel.lat:AccessTime")
        .arg("count")
        .query(&mut conn)
        .unwrap();
    let gauge: Option<String> = redis::cmd("HGET")
        .arg("gauges:")
        .arg("rel.queue")
        .query(&mut conn)
        .unwrap();
    out.extend([count.unwrap_or_default(), gauge.unwrap_or_default()]);
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn relayed_agents_hold_what_the_relaying_one_holds() {
    let (redis, by_udp, by_tcp) = (
        RedisServer::start(),
        RedisServer::start(),
        RedisServer::start(),
    );
    let (udp_target, udp_port, udp_http) = spawn_agent(&by_udp.url(), &[]);
    let tcp_port = free_port();
    let tcp_listen = format!("127.0.0.1:{tcp_port}");
    let (tcp_target, _, tcp_http) = spawn_agent(&by_tcp.url(), &["--tcp", &tcp_listen]);
    let (_udp_target, _tcp_target) = (Killed(udp_target), Killed(tcp_target));
    let relay = format!("udp://127.0.0.1:{udp_port},tcp://127.0.0.1:{tcp_port}");
    let (agent, udp, http) = spawn_agent(&redis.url(), &["--relay", &relay]);
    let _agent = Killed(agent);
    tokio::task::spawn_blocking(move || send(udp, 0..1000))
        .await
        .unwrap();
    let http = ([127, 0, 0, 1], http).into();
    eventually(Duration::from_secs(10), "everything written", || {
        redis.counter_total(1, "rel.hits;route=cart") == 1000
    })
    .await;
    let lines = 6000.0;
    assert_eq!(metric_at(http, "lines_received_total"), lines);
    for target in relay.split(',') {
        let sent = format!("relay_sent_total{{target=\"{target}\"}}");
        eventually(Duration::from_secs(5), "every line relayed", || {
            metric_at(http, &sent) == lines
        })
        .await;
    }
    assert_eq!(metric_at(http, "relay_dropped_total"), 0.0);
    for (target, target_http) in [(&by_udp, udp_http), (&by_tcp, tcp_http)] {
        let target_http = ([127, 0, 0, 1], target_http).into();
        eventually(Duration::from_secs(10), "the target wrote it all", || {
            target.counter_total(1, "rel.hits;route=cart") == 1000
        })
        .await;
        assert_eq!(metric_at(target_http, "lines_received_total"), lines);
        // The bad line too, as it came.
        assert_eq!(metric_at(target_http, "bad_lines_total"), 1000.0);
        eventually(Duration::from_secs(5), "the same data", || {
            written(target) == written(&redis)
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_is_down_costs_nothing_and_is_reconnected() {
    let (redis, later) = (RedisServer::start(), RedisServer::start());
    let tcp_port = free_port();
    let relay = format!("tcp://127.0.0.1:{tcp_port}");
    let (agent, udp, http) = spawn_agent(&redis.url(), &["--relay", &relay]);
    let _agent = Killed(agent);
    let http = ([127, 0, 0, 1], http).into();
    tokio::task::spawn_blocking(move || send(udp, 0..500))
        .await
        .unwrap();
    eventually(Duration::from_secs(10), "everything written", || {
        redis.counter_total(1, "rel.hits;route=cart") == 500
    })
    .await;
    assert_eq!(metric_at(http, "relay_dropped_total"), 3000.0, "counted");
    assert_eq!(metric_at(http, "relay_sent_total"), 0.0);

    // The target comes up: within the backoff (at most 5 s) the relay connects again.
    let tcp_listen = format!("127.0.0.1:{tcp_port}");
    let (target, _, _) = spawn_agent(&later.url(), &["--tcp", &tcp_listen]);
    let _target = Killed(target);
    eventually(Duration::from_secs(15), "relayed again", || {
        send(udp, 0..1);
        later.counter_total(1, "rel.hits;route=cart") > 0
    })
    .await;
    eventually(Duration::from_secs(5), "every line sent or counted", || {
        let accounted =
            metric_at(http, "relay_sent_total") + metric_at(http, "relay_dropped_total");
        accounted == metric_at(http, "lines_received_total")
    })
    .await;
}
