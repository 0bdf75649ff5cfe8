//! The stream and unix transports end to end: raw sockets, and the client libraries that offer
//! them (Python `statsd` and `datadog`, Node `hot-shots`), into a real redis-server.

mod common;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::{UnixDatagram, UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::*;
use statsd_redis::agent;
use statsd_redis::config::Config;

/// A config with a TCP listener on a free port and unix sockets in `dir`.
fn config(redis: &RedisServer, dir: &Path) -> Config {
    // The unix sockets in the scheme forms the Datadog clients write.
    let with =
        |scheme: &str, file: &str| PathBuf::from(format!("{scheme}{}", dir.join(file).display()));
    Config {
        tcp: vec!["127.0.0.1:0".parse().unwrap()],
        unix_datagram: vec![with("unixgram://", "dgram.sock")],
        unix_stream: vec![with("unix://", "stream.sock")],
        ..test_config(redis)
    }
}

async fn counted(redis: &RedisServer, series: &str, total: i64) {
    eventually(Duration::from_secs(5), series, || {
        redis.counter_total(86400, series) == total
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tcp_joins_lines_split_across_writes_and_takes_crlf_and_a_last_line_without_newline() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(config(&redis, dir.path()));
    let mut s = TcpStream::connect(agent.tcp[0]).unwrap();
    s.write_all(b"split.a:1|c\nsplit.b:").unwrap();
    tokio::time::sleep(Duration::from_millis(100)).await;
    s.write_all(b"2|c\r\nsplit.c:3|c|#route:/cart").unwrap();
    drop(s);
    counted(&redis, "split.a", 1).await;
    counted(&redis, "split.b", 2).await;
    counted(&redis, "split.c;route=/cart", 3).await;
    assert_eq!(
        agent.metric(r#"lines_received_total{transport="tcp"}"#),
        3.0
    );
    assert_eq!(
        agent.metric(r#"lines_received_total{transport="udp"}"#),
        0.0
    );
    assert_eq!(agent.metric(r#"bad_lines_total{transport="tcp"}"#), 0.0);
    assert_eq!(
        agent.metric(r#"connections_accepted_total{transport="tcp"}"#),
        1.0
    );
    eventually(Duration::from_secs(2), "connection closed", || {
        agent.metric(r#"connections_open{transport="tcp"}"#) == 0.0
    })
    .await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_1_mib_line_without_newline_is_dropped_and_the_connection_goes_on() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(config(&redis, dir.path()));
    let mut s = TcpStream::connect(agent.tcp[0]).unwrap();
    s.write_all(b"before:1|c\n").unwrap();
    s.write_all(&vec![b'x'; 1 << 20]).unwrap();
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.write_all(b"xxx:1|c\nafter:1|c\n").unwrap();
    counted(&redis, "after", 1).await;
    s.write_all(b"later:5|c\n").unwrap();
    counted(&redis, "later", 5).await;
    assert_eq!(redis.counter_total(86400, "before"), 1);
    assert_eq!(
        agent.metric(r#"bad_lines_total{reason="line_too_long",transport="tcp"}"#),
        1.0
    );
    assert!(
        redis.known("known:").iter().all(|m| !m.contains("xxx")),
        "nothing of the long line is recorded"
    );
    drop(s);
    agent.stop().await;
}

/// Reads until the peer closes (Ok) or `within` passes (Err).
fn closed_within(s: &mut TcpStream, within: Duration) -> std::io::Result<()> {
    s.set_read_timeout(Some(within))?;
    let mut buf = [0; 16];
    match s.read(&mut buf)? {
        0 => Ok(()),
        n => panic!("the agent sent {n} bytes"),
    }
}

/// Past `max_connections` the listener waits: a connection past the limit stays in the
/// kernel's backlog with its lines until one closes, then is read (it used to be accepted and
/// closed, losing what its client had written).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_clients_time_out_and_connections_past_the_limit_wait() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(Config {
        stream_idle_timeout_secs: 1,
        max_connections: 2,
        ..config(&redis, dir.path())
    });
    let mut silent: Vec<TcpStream> = (0..2)
        .map(|_| TcpStream::connect(agent.tcp[0]).unwrap())
        .collect();
    eventually(Duration::from_secs(2), "two open", || {
        agent.metric(r#"connections_open{transport="tcp"}"#) == 2.0
    })
    .await;
    let mut third = TcpStream::connect(agent.tcp[0]).unwrap();
    third.write_all(b"waited:1|c\n").unwrap();
    eventually(Duration::from_secs(2), "the listener at its limit", || {
        agent.metric(r#"connections_at_limit_total{transport="tcp"}"#) >= 1.0
    })
    .await;
    assert_eq!(
        agent.metric(r#"connections_accepted_total{transport="tcp"}"#),
        2.0,
        "the third waits in the backlog"
    );
    for s in &mut silent {
        closed_within(s, Duration::from_secs(3)).expect("a silent client is closed");
    }
    assert_eq!(
        agent.metric(r#"connections_idle_closed_total{transport="tcp"}"#),
        2.0
    );
    counted(&redis, "waited", 1).await;
    closed_within(&mut third, Duration::from_secs(3)).expect("then read, then idle");
    let mut s = TcpStream::connect(agent.tcp[0]).unwrap();
    s.write_all(b"room.again:1|c\n").unwrap();
    counted(&redis, "room.again", 1).await;
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn five_hundred_concurrent_connections_each_deliver_their_lines() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(config(&redis, dir.path()));
    let mut streams: Vec<TcpStream> = (0..500)
        .map(|_| TcpStream::connect(agent.tcp[0]).unwrap())
        .collect();
    for (i, s) in streams.iter_mut().enumerate() {
        s.write_all(format!("conc:1|c\nconc.{}:2|c\n", i % 10).as_bytes())
            .unwrap();
    }
    eventually(Duration::from_secs(5), "500 open", || {
        agent.metric(r#"connections_accepted_total{transport="tcp"}"#) == 500.0
    })
    .await;
    drop(streams);
    counted(&redis, "conc", 500).await;
    for i in 0..10 {
        counted(&redis, &format!("conc.{i}"), 100).await;
    }
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stop_records_what_every_transport_had_received() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(config(&redis, dir.path()));
    let mut tcp = TcpStream::connect(agent.tcp[0]).unwrap();
    let mut unix = UnixStream::connect(dir.path().join("stream.sock")).unwrap();
    let dgram = UnixDatagram::unbound().unwrap();
    // Connected and written, but never accepted by the agent before the stop.
    let mut late = TcpStream::connect(agent.tcp[0]).unwrap();
    tcp.write_all(b"drain.tcp:1|c\n").unwrap();
    unix.write_all(b"drain.unix:2|c\ndrain.cut:1|c|#t").unwrap();
    dgram
        .send_to(b"drain.dgram:3|c", dir.path().join("dgram.sock"))
        .unwrap();
    late.write_all(b"drain.late:4|c\n").unwrap();
    agent.stop().await;
    assert_eq!(redis.counter_total(86400, "drain.tcp"), 1);
    assert_eq!(redis.counter_total(86400, "drain.unix"), 2);
    assert_eq!(redis.counter_total(86400, "drain.dgram"), 3);
    assert_eq!(redis.counter_total(86400, "drain.late"), 4);
    assert!(
        redis
            .known("known:")
            .iter()
            .all(|m| !m.contains("drain.cut")),
        "a line cut by the stop is not recorded"
    );
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unix_sockets_take_their_mode_replace_a_stale_file_and_are_removed_at_stop() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let (dgram_path, stream_path) = (
        dir.path().join("dgram.sock"),
        dir.path().join("stream.sock"),
    );
    // What a crashed run leaves: socket files nobody listens on.
    drop(UnixDatagram::bind(&dgram_path).unwrap());
    drop(UnixListener::bind(&stream_path).unwrap());
    let agent = TestAgent::start(Config {
        unix_socket_mode: "0660".into(),
        ..config(&redis, dir.path())
    });
    assert_eq!((mode(&dgram_path), mode(&stream_path)), (0o660, 0o660));

    // Live sockets and other files are never taken over.
    let taken = agent::bind(&config(&redis, dir.path())).unwrap_err();
    assert!(taken.to_string().contains("dgram.sock"), "{taken}");
    let other = dir.path().join("notes.txt");
    std::fs::write(&other, "mine").unwrap();
    let in_the_way = agent::bind(&Config {
        unix_stream: vec![other.clone()],
        unix_datagram: vec![],
        ..config(&redis, dir.path())
    })
    .unwrap_err();
    assert!(
        in_the_way.to_string().contains("not a socket"),
        "{in_the_way}"
    );
    assert_eq!(std::fs::read_to_string(&other).unwrap(), "mine");

    let d = UnixDatagram::unbound().unwrap();
    d.send_to(b"uds.dgram:1|c\nuds.dgram:2|c", &dgram_path)
        .unwrap();
    let mut s = UnixStream::connect(&stream_path).unwrap();
    s.write_all(b"uds.stream:5|c\n").unwrap();
    drop(s);
    counted(&redis, "uds.dgram", 3).await;
    counted(&redis, "uds.stream", 5).await;
    assert_eq!(
        agent.metric(r#"packets_received_total{transport="unixgram"}"#),
        1.0
    );
    assert_eq!(
        agent.metric(r#"lines_received_total{transport="unix"}"#),
        1.0
    );
    agent.stop().await;
    assert!(!dgram_path.exists() && !stream_path.exists());
}

/// Another process's sockets are never removed: a live socket of the other kind at our path
/// (the probe fails with something else than "refused"), nor a socket someone put at our path
/// while we ran.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn another_process_s_socket_files_are_left_alone() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("theirs.sock");
    let live = UnixListener::bind(&theirs).unwrap();
    let refused = agent::bind(&Config {
        unix_datagram: vec![theirs.clone()],
        unix_stream: vec![],
        ..config(&redis, dir.path())
    })
    .unwrap_err();
    assert!(refused.to_string().contains("theirs.sock"), "{refused}");
    UnixStream::connect(&theirs).expect("their socket still answers");

    let agent = TestAgent::start(config(&redis, dir.path()));
    let ours = dir.path().join("stream.sock");
    std::fs::remove_file(&ours).unwrap();
    let _replacement = UnixListener::bind(&ours).unwrap();
    agent.stop().await;
    assert!(
        ours.exists(),
        "the socket put there after ours is not removed at our stop"
    );
    assert!(!dir.path().join("dgram.sock").exists(), "ours is");
    drop(live);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn python_statsd_tcp_and_unix_clients() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(config(&redis, dir.path()));
    python(&format!(
        r#"
import statsd
t = statsd.TCPStatsClient("127.0.0.1", {port})
for _ in range(10): t.incr("py.tcp")
t.timing("py.tcp.time", 12)
with t.pipeline() as p:
    p.incr("py.tcp.piped", 3)
    p.gauge("py.tcp.gauge", 7)
t.close()
u = statsd.UnixSocketStatsClient("{unix}")
for _ in range(10): u.incr("py.unix")
u.close()
"#,
        port = agent.tcp[0].port(),
        unix = dir.path().join("stream.sock").display(),
    ));
    counted(&redis, "py.tcp", 10).await;
    counted(&redis, "py.tcp.piped", 3).await;
    counted(&redis, "py.unix", 10).await;
    let mut conn = redis.conn();
    let gauge: f64 = redis::cmd("HGET")
        .arg("gauges:")
        .arg("py.tcp.gauge")
        .query(&mut conn)
        .unwrap();
    assert_eq!(gauge, 7.0);
    let count: f64 = redis::cmd("ZSCORE")
        .arg("stats:py.tcp.time:AccessTime")
        .arg("count")
        .query(&mut conn)
        .unwrap();
    assert_eq!(count, 1.0);
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_datadog_client_over_its_unix_socket() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(config(&redis, dir.path()));
    python(&format!(
        r#"
from datadog.dogstatsd import DogStatsd
# A socket timeout makes the client wait for room in the socket's queue (10 datagrams by
# default, net.unix.max_dgram_qlen) instead of dropping what does not fit.
d = DogStatsd(socket_path="{path}", disable_telemetry=True, socket_timeout=5)
for _ in range(20): d.increment("dd.uds", tags=["env:test"])
d.histogram("dd.uds.h", 5, tags=["env:test"])
d.service_check("dd.check", 1, message="slow\nsince noon", tags=["env:test"])
d.event("deploy", "line one\nline two", alert_type="error", tags=["service:shop"])
d.flush()
d.close_socket()
"#,
        path = dir.path().join("dgram.sock").display(),
    ));
    counted(&redis, "dd.uds;env=test", 20).await;
    // The client escapes newlines as \n; the agent stores them as newlines again.
    let recent = |key: &str| -> Vec<String> {
        redis::cmd("LRANGE")
            .arg(key)
            .arg(0)
            .arg(-1)
            .query(&mut redis.conn())
            .unwrap()
    };
    eventually(Duration::from_secs(3), "the logs", || {
        !recent("recent:dd.check:warning").is_empty() && !recent("recent:shop:error").is_empty()
    })
    .await;
    assert!(
        recent("recent:dd.check:warning")[0].ends_with(" slow\nsince noon"),
        "{:?}",
        recent("recent:dd.check:warning")
    );
    assert!(recent("recent:shop:error")[0].ends_with(" deploy: line one\nline two"));
    assert!(agent.metric(r#"packets_received_total{transport="unixgram"}"#) >= 1.0);
    assert_eq!(
        agent.metric(r#"bad_lines_total{transport="unixgram"}"#),
        0.0
    );
    agent.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_shots_over_tcp_and_unix_datagrams() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let agent = TestAgent::start(config(&redis, dir.path()));
    node(&format!(
        r#"
const StatsD = require('hot-shots');
const errors = e => {{ console.error(e); process.exit(1); }};
const tcp = new StatsD({{ protocol: 'tcp', host: '127.0.0.1', port: {port}, errorHandler: errors }});
const uds = new StatsD({{ protocol: 'uds', path: '{path}', errorHandler: errors }});
for (let i = 0; i < 10; i++) {{ tcp.increment('hs.tcp', 1, ['k:v']); uds.increment('hs.uds', 2); }}
tcp.gauge('hs.tcp.gauge', 4);
setTimeout(() => tcp.close(() => uds.close(() => process.exit(0))), 300);
"#,
        port = agent.tcp[0].port(),
        path = dir.path().join("dgram.sock").display(),
    ));
    counted(&redis, "hs.tcp;k=v", 10).await;
    counted(&redis, "hs.uds", 20).await;
    agent.stop().await;
}

/// `:port` listens on every interface of both families, and a host name is resolved at start.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn colon_port_takes_both_families_and_names_resolve() {
    let redis = RedisServer::start();
    let any = statsd_redis::config::parse_listen(":0", "udp").unwrap();
    let agent = TestAgent::start(Config {
        udp: vec![any],
        tcp: vec![statsd_redis::config::parse_listen("tcp://localhost:0", "tcp").unwrap()],
        ..test_config(&redis)
    });
    let port = agent.udp[0].port();
    let v4 = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    v4.send_to(b"both:1|c", ("127.0.0.1", port)).unwrap();
    let v6 = std::net::UdpSocket::bind("[::1]:0").unwrap();
    v6.send_to(b"both:2|c", ("::1", port)).unwrap();
    let mut s = TcpStream::connect(agent.tcp[0]).unwrap();
    s.write_all(b"named:3|c\n").unwrap();
    drop(s);
    counted(&redis, "both", 3).await;
    counted(&redis, "named", 3).await;
    agent.stop().await;
}
