//! TLS to a self-hosted Redis: a server whose certificate a private CA signed, which also asks
//! for the client's (`tls-auth-clients yes`). Certificates made by the test with `openssl`.

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

/// A private Redis listening with TLS on `port` (its own certificate, clients' checked against
/// the CA) and on its unix socket without, for the test's reads.
fn tls_redis(certs: &Path, port: u16) -> RedisServer {
    let file = |name: &str| certs.join(name).to_str().unwrap().to_string();
    RedisServer::start_with(&[
        "--tls-port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--tls-cert-file",
        &file("server.pem"),
        "--tls-key-file",
        &file("server.key"),
        "--tls-ca-cert-file",
        &file("ca.pem"),
        "--tls-auth-clients",
        "yes",
    ])
}

/// With the CA and a client certificate the agent writes over TLS; without the client
/// certificate Redis refuses it, without the CA it refuses Redis (and `/readyz` says why);
/// `#insecure`, files that are not PEM and a key that is not the certificate's stop it at
/// start, naming the key.
#[test]
fn a_private_ca_and_a_client_certificate() {
    let certs = tempfile::tempdir().unwrap();
    common::pki::make_certificates(certs.path());
    let port = free_port();
    let redis = tls_redis(certs.path(), port);
    let url = format!("rediss://127.0.0.1:{port}/0");
    let file = |name: &str| certs.path().join(name).to_str().unwrap().to_string();
    let (ca, cert, key) = (file("ca.pem"), file("client.pem"), file("client.key"));
    let server_key = file("server.key");

    let (agent, udp, http) = spawn_agent(
        &url,
        &[
            "--redis-tls-ca-file",
            &ca,
            "--redis-tls-cert-file",
            &cert,
            "--redis-tls-key-file",
            &key,
        ],
    );
    let agent = Killed(agent);
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket.send_to(b"tls.hits:3|c", ("127.0.0.1", udp)).unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while redis.counter_total(1, "tls.hits") != 3 {
        assert!(std::time::Instant::now() < deadline, "not written over TLS");
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(http_get(([127, 0, 0, 1], http).into(), "/readyz").0, 200);
    drop(agent);

    for (args, why) in [
        (vec!["--redis-tls-ca-file", &ca], "no client certificate"),
        (
            vec!["--redis-tls-cert-file", &cert, "--redis-tls-key-file", &key],
            "no CA",
        ),
    ] {
        let (agent, _, http) = spawn_agent(&url, &args);
        let agent = Killed(agent);
        std::thread::sleep(Duration::from_millis(1500));
        let (status, body) = http_get(([127, 0, 0, 1], http).into(), "/readyz");
        assert_eq!(status, 503, "{why}: {body}");
        drop(agent);
    }

    for (args, key) in [
        (vec!["--redis", &format!("{url}#insecure")], "`redis`"),
        (
            vec!["--redis", &url, "--redis-tls-ca-file", &key],
            "`redis_tls_ca_file`",
        ),
        (
            vec!["--redis", &url, "--redis-tls-cert-file", &cert],
            "`redis_tls_key_file`",
        ),
        (
            vec![
                "--redis",
                &url,
                "--redis-tls-cert-file",
                &cert,
                "--redis-tls-key-file",
                &server_key,
            ],
            "`redis_tls_key_file`",
        ),
        (
            vec![
                "--redis",
                "redis://127.0.0.1:6379/0",
                "--redis-tls-ca-file",
                &ca,
            ],
            "`redis_tls_ca_file`",
        ),
    ] {
        let out = bin()
            .args(["--udp", "127.0.0.1:0"])
            .args(&args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(key) && err.lines().count() == 1,
            "{args:?}: {err}"
        );
    }
}
