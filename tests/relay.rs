//! The relay through the binary: an agent relays every line it receives to two other agents
//! (real StatsD servers, one over UDP, one over TCP), each with a Redis of its own, and all
//! three hold the same data; a TCP target that is down costs the agent nothing, its lines are
//! counted as dropped, and once it listens the relay connects again. A relay to the agent's
//! own listener is refused at start and at SIGHUP; two agents relaying to each other, which no
//! one agent's configuration shows, count a line again at every round.

mod common;

use std::io::BufRead;
use std::net::UdpSocket;
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

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

/// The binary with `args` ends by itself within 10 s (it is killed, and the test fails, if it
/// started instead); its exit code and what it wrote on stderr.
fn refused(args: &[&str]) -> (Option<i32>, String) {
    let mut child = bin()
        .args(["--http", "127.0.0.1:0"])
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("{args:?}: the agent started instead of refusing the relay");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut stderr = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut stderr).unwrap();
    (status.code(), stderr)
}

#[test]
fn a_relay_to_the_agents_own_listener_is_refused() {
    let p = free_port();
    let other = free_port();
    let udp = |a: &str| ["--udp".to_string(), a.replace('P', &p.to_string())];
    let own = format!("udp://127.0.0.1:{p}");
    for (case, listeners, relay, listener) in [
        (
            "same_address",
            udp("127.0.0.1:P").to_vec(),
            own.clone(),
            format!("UDP listener 127.0.0.1:{p}"),
        ),
        (
            "ipv4_wildcard",
            udp("0.0.0.0:P").to_vec(),
            own.clone(),
            format!("UDP listener 0.0.0.0:{p}"),
        ),
        (
            "dual_stack_wildcard",
            udp(":P").to_vec(),
            own.clone(),
            format!("UDP listener [::]:{p}"),
        ),
        (
            "dual_stack_written_out",
            udp("[::]:P").to_vec(),
            own.clone(),
            format!("UDP listener [::]:{p}"),
        ),
        (
            "tcp_to_own_tcp",
            [
                udp("127.0.0.1:P"),
                ["--tcp".into(), format!("127.0.0.1:{other}")],
            ]
            .concat(),
            format!("tcp://127.0.0.1:{other}"),
            format!("TCP listener 127.0.0.1:{other}"),
        ),
        (
            // Whichever address `localhost` resolves to first, one of the two listeners has it.
            "host_name",
            [udp("127.0.0.1:P"), udp("[::1]:P")].concat(),
            format!("udp://localhost:{p}"),
            format!(":{p}: every line would come back"),
        ),
    ] {
        let mut args: Vec<&str> = listeners.iter().map(String::as_str).collect();
        args.extend(["--relay", &relay]);
        let (code, stderr) = refused(&args);
        assert_eq!(code, Some(2), "{case}: {stderr}");
        assert_eq!(
            stderr.trim_end().lines().count(),
            1,
            "{case}: one line: {stderr:?}"
        );
        assert!(
            stderr.starts_with(&format!("error: invalid value for `relay`: `{relay}`")),
            "{case}: {stderr}"
        );
        assert!(
            stderr.contains(&listener),
            "{case}: {stderr} names {listener}"
        );
    }
}

/// A relay to another port, or over UDP to a port where the agent has only a TCP listener,
/// starts, and each line is counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_relay_elsewhere_is_accepted() {
    let redis = RedisServer::start();
    let (tcp, elsewhere) = (free_port(), UdpSocket::bind("127.0.0.1:0").unwrap());
    let relay = format!(
        "udp://127.0.0.1:{tcp},udp://{}",
        elsewhere.local_addr().unwrap()
    );
    let tcp_listen = format!("127.0.0.1:{tcp}");
    let (agent, udp, http) = spawn_agent(&redis.url(), &["--tcp", &tcp_listen, "--relay", &relay]);
    let _agent = Killed(agent);
    let http = ([127, 0, 0, 1], http).into();
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(b"accepted.once:1|c", ("127.0.0.1", udp))
        .unwrap();
    eventually(Duration::from_secs(5), "relayed to both", || {
        metric_at(http, "relay_sent_total") == 2.0
    })
    .await;
    let mut datagram = [0; 64];
    let n = elsewhere.recv(&mut datagram).unwrap();
    assert_eq!(&datagram[..n], b"accepted.once:1|c\n");
    eventually(Duration::from_secs(5), "written", || {
        redis.counter_total(86400, "accepted.once") == 1
    })
    .await;
    assert_eq!(metric_at(http, "lines_received_total"), 1.0);
}

/// What an agent writes on stderr, line by line as it comes.
fn log_lines(child: &mut Child) -> mpsc::Receiver<String> {
    let (lines, receiver) = mpsc::channel();
    let stderr = std::io::BufReader::new(child.stderr.take().unwrap());
    std::thread::spawn(move || {
        for line in stderr.lines().map_while(Result::ok) {
            if lines.send(line).is_err() {
                break;
            }
        }
    });
    receiver
}

/// A SIGHUP to a configuration whose relay reaches the agent's own listener is refused: the
/// line says why, and the running configuration is kept (the file's new `drop_names`, which
/// would drop the line sent after it, does not apply); each line is still counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sighup_to_a_relay_to_itself_keeps_the_running_configuration() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.toml");
    std::fs::write(&file, "").unwrap();
    let file_arg = file.to_str().unwrap().to_string();
    let (mut child, udp, http) = spawn_agent(&redis.url(), &["--config", &file_arg]);
    let log = log_lines(&mut child);
    let agent = Killed(child);
    let http = ([127, 0, 0, 1], http).into();
    std::fs::write(
        &file,
        format!("drop_names = [\"selfloop.*\"]\nrelay = [\"udp://127.0.0.1:{udp}\"]\n"),
    )
    .unwrap();
    // SAFETY: signalling our own child process.
    sighup(&agent.0);
    let refusal = loop {
        let line = log
            .recv_timeout(Duration::from_secs(10))
            .expect("a line about the SIGHUP");
        if line.contains("SIGHUP") {
            break line;
        }
    };
    assert!(
        refusal.contains("the running one is kept")
            && refusal.contains("invalid value for `relay`")
            && refusal.contains(&format!("own UDP listener 127.0.0.1:{udp}")),
        "{refusal}"
    );
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(b"selfloop.c:1|c", ("127.0.0.1", udp))
        .unwrap();
    eventually(Duration::from_secs(5), "written", || {
        redis.counter_total(86400, "selfloop.c") == 1
    })
    .await;
    // Two more windows: still once.
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(redis.counter_total(86400, "selfloop.c"), 1);
    assert_eq!(metric_at(http, "lines_received_total"), 1.0);
    assert_eq!(metric_at(http, "relay_sent_total"), 0.0);
}

/// Two agents that relay to each other: each configuration is valid on its own, and one line
/// sent to A goes round for as long as both run. What shows it: the line's counter keeps
/// growing in both Redis servers, and each agent's `lines_received_total` and
/// `relay_sent_total` grow past what was sent (docs/operations.md, "Relay").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_relaying_to_each_other_count_a_line_at_every_round() {
    let (redis_a, redis_b) = (RedisServer::start(), RedisServer::start());
    // B's port is held until B starts, so that A's own port is another.
    let held = UdpSocket::bind("127.0.0.1:0").unwrap();
    let b_port = held.local_addr().unwrap().port();
    let to_b = format!("udp://127.0.0.1:{b_port}");
    let (a, a_udp, a_http) = spawn_agent(&redis_a.url(), &["--relay", &to_b]);
    let _a = Killed(a);
    drop(held);
    let (b_listen, to_a) = (
        format!("127.0.0.1:{b_port}"),
        format!("udp://127.0.0.1:{a_udp}"),
    );
    let (b, _, b_http) = spawn_agent(&redis_b.url(), &["--udp", &b_listen, "--relay", &to_a]);
    let _b = Killed(b);
    UdpSocket::bind("127.0.0.1:0")
        .unwrap()
        .send_to(b"loop.canary:1|c", ("127.0.0.1", a_udp))
        .unwrap();
    eventually(
        Duration::from_secs(10),
        "the line counted three times",
        || {
            redis_a.counter_total(86400, "loop.canary") >= 3
                && redis_b.counter_total(86400, "loop.canary") >= 3
        },
    )
    .await;
    let (a_http, b_http) = (
        ([127, 0, 0, 1], a_http).into(),
        ([127, 0, 0, 1], b_http).into(),
    );
    // The metrics are published a batch at a time, a little after the lines are counted.
    eventually(
        Duration::from_secs(10),
        "both agents received and relayed the line three times",
        || {
            [a_http, b_http].iter().all(|&http| {
                metric_at(http, "lines_received_total") >= 3.0
                    && metric_at(http, "relay_sent_total") >= 3.0
            })
        },
    )
    .await;
}
