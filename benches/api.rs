//! How fast the JSON API answers, over real HTTP, from a live agent reading a private Redis:
//! every query for a counter with 120 samples, and the known-series search over 10 000 series.
//! And what `web_config_file` costs a request: a scrape of `/metrics` with TLS and a Basic user
//! against plain HTTP, on a new connection and on a kept one, and the 401 of an unknown user
//! against a known user's wrong password (each a new password: bcrypt at cost 10).
//!
//!     cargo bench --bench api

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;

use common::{RedisServer, TestAgent, http_get, test_config, unix_now};
use criterion::{Criterion, criterion_group, criterion_main};

/// 120 samples at every precision for `hits`, an hour of timer stats, logs, a gauge, a set,
/// and 10 000 other counter series in `known:`.
fn seed(redis: &RedisServer) {
    let mut c = redis.conn();
    let now = unix_now();
    let mut pipe = redis::pipe();
    for p in common::PRECISIONS {
        for i in 0..120 {
            pipe.cmd("HSET")
                .arg(format!("count:{p}:hits"))
                .arg((now / p - i) * p)
                .arg(i + 1)
                .ignore();
        }
        pipe.cmd("ZADD")
            .arg("known:")
            .arg(0)
            .arg(format!("{p}:hits"))
            .ignore();
    }
    for i in 0..10_000 {
        pipe.cmd("ZADD")
            .arg("known:")
            .arg(0)
            .arg(format!("1:svc.endpoint{i:05}.requests"))
            .ignore();
    }
    for (series, avg) in [("checkout", 120.0), ("login", 30.0)] {
        pipe.cmd("ZADD")
            .arg(format!("stats:{series}:AccessTime"))
            .arg(avg)
            .arg("min")
            .arg(avg)
            .arg("max")
            .arg(10)
            .arg("count")
            .arg(avg * 10.0)
            .arg("sum")
            .arg(avg * avg * 10.0)
            .arg("sumsq")
            .ignore();
        pipe.cmd("ZADD")
            .arg("slowest:AccessTime")
            .arg(avg)
            .arg(series)
            .ignore();
    }
    for i in 0..100 {
        pipe.cmd("LPUSH")
            .arg("recent:db:critical")
            .arg(format!("Sun Nov 22 04:00:00 2026 down {i}"))
            .ignore();
        pipe.cmd("ZINCRBY")
            .arg("common:db:critical")
            .arg(1)
            .arg(format!("down {}", i % 10))
            .ignore();
    }
    pipe.cmd("HSET")
        .arg("gauges:")
        .arg("temp")
        .arg(21.5)
        .ignore();
    pipe.cmd("PFADD")
        .arg(format!("set:60:users:{}", now / 60 * 60))
        .arg("a")
        .arg("b")
        .ignore();
    pipe.query::<()>(&mut c).unwrap();
}

fn api(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let redis = RedisServer::start();
    seed(&redis);
    // Without the cleaner: the seeded index of 10 000 series has no hashes behind it, and the
    // cleaner's first pass would empty it (the search then found nothing).
    let config = statsd_redis::config::Config {
        cleaner_enabled: false,
        ..test_config(&redis)
    };
    let agent = TestAgent::start(config);
    let mut group = c.benchmark_group("api");
    for (name, path) in [
        ("counter_120_samples", "/api/v1/counter/hits?precision=1"),
        ("stats", "/api/v1/stats/checkout"),
        ("slowest_10", "/api/v1/slowest?limit=10"),
        ("log_20", "/api/v1/log/db?severity=critical&limit=20"),
        ("gauge", "/api/v1/gauge/temp"),
        ("set_120_slices", "/api/v1/set/users?precision=60"),
        (
            "known_search_10k_series",
            "/api/v1/known?match=endpoint0042&per_page=50",
        ),
        ("known_page_10k_series", "/api/v1/known?page=3&per_page=50"),
        ("vitals", "/api/v1/vitals"),
    ] {
        let (status, body) = http_get(agent.http, path);
        assert_eq!(status, 200, "{path}");
        if name == "known_search_10k_series" {
            let answer: serde_json::Value = serde_json::from_str(&body).unwrap();
            assert_eq!(answer["total"], 10, "ten series match: {body}");
        }
        group.bench_function(name, |b| b.iter(|| http_get(agent.http, path)));
    }
    group.finish();
    agent.shutdown.cancel();
}

/// A request on a kept connection: writes it, reads the answer whole (by its length); the
/// status.
fn request_on<S: Read + Write>(stream: &mut S, path: &str, authorization: Option<&str>) -> u16 {
    let header = authorization.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    // One write: a request in pieces waits for the server's delayed ACK (Nagle), 40 ms.
    let request = format!("GET {path} HTTP/1.1\r\nHost: bench\r\n{header}\r\n");
    stream.write_all(request.as_bytes()).unwrap();
    stream.flush().unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8];
    while !head.ends_with(b"\r\n\r\n") {
        stream.read_exact(&mut byte).unwrap();
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    let length: usize = head
        .lines()
        .find_map(|l| {
            l.to_ascii_lowercase()
                .strip_prefix("content-length:")
                .map(|v| v.trim().parse().unwrap())
        })
        .unwrap_or(0);
    let mut body = vec![0; length];
    stream.read_exact(&mut body).unwrap();
    head[9..12].parse().unwrap()
}

fn connect(addr: SocketAddr) -> TcpStream {
    let stream = TcpStream::connect(addr).unwrap();
    stream.set_nodelay(true).unwrap();
    stream
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    let encoded = base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
    format!("Basic {encoded}")
}

fn http_security(c: &mut Criterion) {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let _guard = rt.enter();
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    common::pki::make_certificates(dir.path());
    let web = dir.path().join("web.yml");
    let hash = bcrypt::hash("scrape-secret", 10).unwrap();
    std::fs::write(
        &web,
        format!("tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\nbasic_auth_users:\n  prometheus: {hash}\n"),
    )
    .unwrap();
    let plain = TestAgent::start(test_config(&redis));
    let secured = TestAgent::start(statsd_redis::config::Config {
        web_config_file: web.clone(),
        ..test_config(&redis)
    });
    let users = dir.path().join("users.yml");
    std::fs::write(&users, format!("basic_auth_users:\n  prometheus: {hash}\n")).unwrap();
    let users_only = TestAgent::start(statsd_redis::config::Config {
        web_config_file: users,
        ..test_config(&redis)
    });

    use rustls::pki_types::pem::PemObject;
    let mut roots = rustls::RootCertStore::empty();
    for cert in rustls::pki_types::CertificateDer::pem_file_iter(dir.path().join("ca.pem")).unwrap()
    {
        roots.add(cert.unwrap()).unwrap();
    }
    let client = Arc::new(
        rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth(),
    );
    let tls_connect = |addr: SocketAddr| {
        let connection =
            rustls::ClientConnection::new(client.clone(), "127.0.0.1".try_into().unwrap()).unwrap();
        rustls::StreamOwned::new(connection, connect(addr))
    };
    let right = basic("prometheus", "scrape-secret");
    // Both agents have read their files (an answer comes after): a run whose filter skips this
    // group ends at once, and the files' directory with it.
    assert_eq!(
        request_on(&mut tls_connect(secured.http), "/healthz", None),
        200
    );
    assert_eq!(http_get(users_only.http, "/healthz").0, 200);

    let mut group = c.benchmark_group("http_security");
    group.bench_function("metrics_plain_new_connection", |b| {
        b.iter(|| assert_eq!(request_on(&mut connect(plain.http), "/metrics", None), 200))
    });
    group.bench_function("metrics_tls_basic_new_connection", |b| {
        b.iter(|| {
            assert_eq!(
                request_on(&mut tls_connect(secured.http), "/metrics", Some(&right)),
                200
            )
        })
    });
    let mut kept = connect(plain.http);
    group.bench_function("metrics_plain_kept_connection", |b| {
        b.iter(|| assert_eq!(request_on(&mut kept, "/metrics", None), 200))
    });
    let mut kept = tls_connect(secured.http);
    group.bench_function("metrics_tls_basic_kept_connection", |b| {
        b.iter(|| assert_eq!(request_on(&mut kept, "/metrics", Some(&right)), 200))
    });
    group.finish();

    // Each 401 is a bcrypt check (a new password every time, so none is cached): 50-odd ms.
    let mut group = c.benchmark_group("http_401");
    group.sample_size(10);
    let mut kept = connect(users_only.http);
    let mut n = 0u64;
    for (name, user) in [
        ("known_user_wrong_password", "prometheus"),
        ("unknown_user", "nobody"),
    ] {
        group.bench_function(name, |b| {
            b.iter(|| {
                n += 1;
                let authorization = basic(user, &format!("guess{n}"));
                assert_eq!(request_on(&mut kept, "/metrics", Some(&authorization)), 401)
            })
        });
    }
    group.finish();
    for agent in [plain, secured, users_only] {
        agent.shutdown.cancel();
    }
}

criterion_group!(benches, http_security, api);
criterion_main!(benches);
