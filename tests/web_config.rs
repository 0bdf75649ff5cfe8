//! The HTTP port behind exporter-toolkit's web configuration file (`web_config_file`), proven
//! with the programs that meet it: Debian's Prometheus 2.42 scraping with `basic_auth` and
//! `tls_config`, curl sending what Grafana's Graphite data source sends, and `promtool check
//! web-config` judging the same files the agent reads. The CA, the certificates and the users
//! are made by each test (`openssl`, `htpasswd -B`, the bcrypt crate).

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// `htpasswd -nbBC 10`'s hash of `password`: `$2y$`, as people make them.
fn htpasswd(password: &str) -> String {
    let out = run_ok(
        program("htpasswd", "apache2-utils").args(["-nbBC", "10", "", password]),
        "htpasswd",
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .trim()
        .trim_start_matches(':')
        .to_string()
}

/// A directory with the CA (`ca.pem`), the server's certificate for 127.0.0.1 (`server.*`), a
/// client's signed by the CA (`client.*`) and one signed by nobody (`stranger.*`).
fn pki() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    pki::make_certificates(dir.path());
    pki::make_stranger(dir.path());
    dir
}

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).to_str().unwrap().to_string()
}

fn promtool_check(file: &Path) -> Output {
    program("promtool", "prometheus")
        .args(["check", "web-config"])
        .arg(file)
        .output()
        .unwrap()
}

/// `statsd-redis --print-config` with the file: how the agent judges it before it starts.
fn agent_check(file: &Path) -> Output {
    bin()
        .arg("--web-config-file")
        .arg(file)
        .arg("--print-config")
        .output()
        .unwrap()
}

/// Every file the tests serve is one promtool accepts and the agent takes; every file promtool
/// refuses, the agent refuses at start with one line naming `web_config_file` and exit 2; and
/// what promtool accepts but rustls cannot do is refused by name the same way.
#[test]
fn promtool_and_the_agent_judge_the_same_files() {
    let dir = pki();
    let d = dir.path();
    let hash = htpasswd("secret");
    let crate_hash = bcrypt::hash("secret", 4).unwrap();
    let tls = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n";
    let good = [
        ("empty", String::new()),
        (
            "users_only",
            format!("basic_auth_users:\n  alice: {hash}\n  bob: {crate_hash}\n"),
        ),
        ("tls_only", tls.to_string()),
        (
            "tls_absolute_paths",
            format!(
                "tls_server_config:\n  cert_file: {}\n  key_file: {}\n",
                path(d, "server.pem"),
                path(d, "server.key")
            ),
        ),
        (
            "mutual_tls_users_headers",
            format!(
                "{tls}  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\n  min_version: TLS13\nhttp_server_config:\n  http2: false\n  headers:\n    X-Frame-Options: deny\n    X-Content-Type-Options: nosniff\n    Strict-Transport-Security: max-age=31536000\n    Content-Security-Policy: default-src 'self'\n    X-XSS-Protection: 1; mode=block\nbasic_auth_users:\n  grafana: {hash}\n"
            ),
        ),
        (
            "tls12_suites_curves",
            format!(
                "{tls}  min_version: TLS12\n  max_version: TLS12\n  cipher_suites:\n  - TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256\n  - TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256\n  curve_preferences: [X25519, CurveP256, CurveP384]\n  prefer_server_cipher_suites: false\n"
            ),
        ),
        (
            "verify_if_given",
            format!("{tls}  client_auth_type: VerifyClientCertIfGiven\n  client_ca_file: ca.pem\n"),
        ),
        (
            "request_client_cert",
            format!("{tls}  client_auth_type: RequestClientCert\n"),
        ),
        (
            "require_any_client_cert",
            format!("{tls}  client_auth_type: RequireAnyClientCert\n"),
        ),
        (
            "no_client_cert",
            format!("{tls}  client_auth_type: NoClientCert\n"),
        ),
        (
            "null_sections",
            "tls_server_config:\nbasic_auth_users:\n".into(),
        ),
    ];
    // Each bad file, and a word the agent's line must carry.
    let bad = [
        (
            "unknown_key",
            "tls_config:\n  cert_file: server.pem\n".to_string(),
            "tls_config",
        ),
        (
            "unknown_tls_key",
            format!("{tls}  client_allowed_sans: [a]\n"),
            "client_allowed_sans",
        ),
        (
            "key_without_cert",
            "tls_server_config:\n  key_file: server.key\n".into(),
            "missing cert_file",
        ),
        (
            "cert_without_key",
            "tls_server_config:\n  cert_file: server.pem\n".into(),
            "missing key_file",
        ),
        (
            "client_auth_alone",
            "tls_server_config:\n  client_auth_type: RequireAndVerifyClientCert\n".into(),
            "missing cert_file",
        ),
        (
            "missing_certificate_file",
            "tls_server_config:\n  cert_file: nowhere.pem\n  key_file: server.key\n".into(),
            "nowhere.pem",
        ),
        (
            "key_of_another_certificate",
            "tls_server_config:\n  cert_file: server.pem\n  key_file: client.key\n".into(),
            "key_file",
        ),
        (
            "plain_password",
            "basic_auth_users:\n  alice: secret\n".into(),
            "bcrypt",
        ),
        (
            "cost_below_4",
            format!("basic_auth_users:\n  alice: $2y$03${}\n", &hash[7..]),
            "cost 3",
        ),
        (
            "user_twice",
            format!("basic_auth_users:\n  alice: {hash}\n  alice: {hash}\n"),
            "twice",
        ),
        (
            "users_as_a_list",
            "basic_auth_users: [alice]\n".into(),
            "basic_auth_users",
        ),
        (
            "invalid_client_auth",
            format!("{tls}  client_auth_type: Sometimes\n"),
            "Sometimes",
        ),
        (
            "ca_without_policy",
            format!("{tls}  client_ca_file: ca.pem\n"),
            "without a Client Auth Policy",
        ),
        (
            "unknown_version",
            format!("{tls}  min_version: TLS111\n"),
            "TLS111",
        ),
        (
            "invented_cipher",
            format!("{tls}  cipher_suites: [TLS_INVENTED_WITH_ROT13]\n"),
            "TLS_INVENTED_WITH_ROT13",
        ),
        (
            "invented_curve",
            format!("{tls}  curve_preferences: [CurveP999]\n"),
            "CurveP999",
        ),
        (
            "header_not_allowed",
            "http_server_config:\n  headers:\n    Server: statsd-redis\n".into(),
            "\"Server\"",
        ),
        (
            "header_value_not_allowed",
            "http_server_config:\n  headers:\n    X-Frame-Options: DENY\n".into(),
            "X-Frame-Options",
        ),
        (
            "http2_not_a_bool",
            "http_server_config:\n  http2: maybe\n".into(),
            "http2",
        ),
        (
            "not_yaml",
            "basic_auth_users: {alice: [\n".into(),
            "web_config_file",
        ),
    ];
    // promtool takes these; rustls cannot serve them, and the agent says so rather than serve
    // something else.
    let refused_by_name = [
        ("tls10", format!("{tls}  min_version: TLS10\n"), "TLS10"),
        ("tls11", format!("{tls}  max_version: TLS11\n"), "TLS11"),
        (
            "cbc_suite",
            format!("{tls}  cipher_suites: [TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA]\n"),
            "TLS_ECDHE_RSA_WITH_AES_128_CBC_SHA",
        ),
        (
            "p521",
            format!("{tls}  curve_preferences: [CurveP521]\n"),
            "CurveP521",
        ),
        (
            "verify_without_ca",
            format!("{tls}  client_auth_type: RequireAndVerifyClientCert\n"),
            "client_ca_file",
        ),
        (
            "max_below_min",
            format!("{tls}  min_version: TLS13\n  max_version: TLS12\n"),
            "max_version",
        ),
        (
            "crypt_blowfish_2x",
            format!("basic_auth_users:\n  alice: $2x${}\n", &hash[4..]),
            "$2a$, $2b$ or $2y$",
        ),
    ];
    let write = |name: &str, text: &str| {
        let file = d.join(format!("{name}.yml"));
        std::fs::write(&file, text).unwrap();
        file
    };
    let mut wrong = Vec::new();
    for (name, text) in &good {
        let file = write(name, text);
        let promtool = promtool_check(&file);
        if !promtool.status.success() {
            wrong.push(format!("good {name}: promtool refuses it: {promtool:?}"));
        }
        let agent = agent_check(&file);
        if !agent.status.success() {
            wrong.push(format!(
                "good {name}: the agent refuses it: {}",
                String::from_utf8_lossy(&agent.stderr)
            ));
        }
    }
    let refuses = |name: &str, file: &Path, said: &str, wrong: &mut Vec<String>| {
        let agent = agent_check(file);
        let line = String::from_utf8_lossy(&agent.stderr).to_string();
        if agent.status.code() != Some(2)
            || line.lines().count() != 1
            || !line.contains("`web_config_file`")
            || !line.contains(said)
        {
            wrong.push(format!(
                "bad {name}: want exit 2 and one line naming {said:?}, got {:?}: {line}",
                agent.status.code()
            ));
        }
    };
    for (name, text, said) in &bad {
        let file = write(name, text);
        if promtool_check(&file).status.success() {
            wrong.push(format!("bad {name}: promtool accepts it"));
        }
        refuses(name, &file, said, &mut wrong);
    }
    // At start as for --print-config: the agent stops before it binds anything.
    let start = bin()
        .args([
            "--http",
            "127.0.0.1:0",
            "--udp",
            "127.0.0.1:0",
            "--web-config-file",
        ])
        .arg(d.join("plain_password.yml"))
        .output()
        .unwrap();
    assert_eq!(start.status.code(), Some(2), "{start:?}");
    let missing = d.join("absent.yml");
    assert!(!promtool_check(&missing).status.success());
    refuses("absent", &missing, "absent.yml", &mut wrong);
    for (name, text, said) in &refused_by_name {
        let file = write(name, text);
        if !promtool_check(&file).status.success() {
            wrong.push(format!(
                "{name}: promtool refuses it too: move it to the bad files"
            ));
        }
        refuses(name, &file, said, &mut wrong);
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// An agent binary serving `web_config` (written into `dir`), against a private Redis: the
/// process, its UDP and HTTP ports, and the config's path.
fn agent_with(
    dir: &Path,
    web_config: &str,
    redis: &RedisServer,
    extra: &[&str],
) -> (Killed, u16, u16, PathBuf) {
    let file = dir.join("web.yml");
    std::fs::write(&file, web_config).unwrap();
    let mut args = vec!["--web-config-file", file.to_str().unwrap()];
    args.extend_from_slice(extra);
    let (child, udp, http) = spawn_agent(&redis.url(), &args);
    (Killed(child), udp, http, file)
}

/// curl as Grafana's Graphite data source calls the agent: Basic credentials on every request,
/// the private CA (`--cacert`), its client certificate (`--cert`, `--key`), the data source's
/// custom headers. Returns the exit code, the status and the headers, and the body.
fn curl(url: &str, args: &[&str]) -> (i32, String, String) {
    let out = program("curl", "curl")
        .args(["-sS", "--max-time", "10", "-D", "-", url])
        .args(args)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    let (head, body) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    (
        out.status.code().unwrap_or(-1),
        head.to_string(),
        body.to_string(),
    )
}

fn status(head: &str) -> u16 {
    head.split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

/// Grafana's requests under `RequireAndVerifyClientCert` with users: with the CA, its client
/// certificate and the password, it finds, renders and lists functions; without the password,
/// or with another, 401 and `WWW-Authenticate: Basic` on every path (probes aside, which still
/// need the certificate); without a client certificate, or with one no CA signed, the handshake
/// fails and no request is answered. The file's headers are on every response.
#[test]
fn grafana_reads_the_graphite_api_over_mutual_tls_with_a_password() {
    let dir = pki();
    let d = dir.path();
    let redis = RedisServer::start();
    let hash = htpasswd("grafana-secret");
    let web = format!(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\nhttp_server_config:\n  headers:\n    X-Frame-Options: deny\nbasic_auth_users:\n  grafana: {hash}\n"
    );
    let (_agent, udp, http, _) = agent_with(d, &web, &redis, &[]);
    let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    socket
        .send_to(b"checkout.hits:3|c", ("127.0.0.1", udp))
        .unwrap();
    // Written before the first find: the Graphite API remembers for a while what it found.
    let deadline = Instant::now() + Duration::from_secs(30);
    while redis.counter_total(1, "checkout.hits") != 3 {
        assert!(Instant::now() < deadline, "the counter was never written");
        std::thread::sleep(Duration::from_millis(100));
    }
    let (ca, cert, key) = (
        path(d, "ca.pem"),
        path(d, "client.pem"),
        path(d, "client.key"),
    );
    let base = format!("https://127.0.0.1:{http}");
    let grafana = [
        "--cacert",
        &ca,
        "--cert",
        &cert,
        "--key",
        &key,
        "-u",
        "grafana:grafana-secret",
        "-H",
        "X-Grafana-Org-Id: 1",
    ];
    let (code, head, body) = curl(
        &format!("{base}/graphite/metrics/find?query=checkout.*"),
        &grafana,
    );
    assert_eq!((code, status(&head)), (0, 200), "{head}{body}");
    assert!(
        head.starts_with("HTTP/2 "),
        "curl and the agent agree on HTTP/2 (ALPN): {head}"
    );
    assert!(
        head.to_ascii_lowercase().contains("x-frame-options: deny"),
        "{head}"
    );
    assert!(body.contains("checkout.hits"), "{body}");
    // Grafana posts its renders as a form.
    let (_, head, body) = curl(
        &format!("{base}/graphite/render"),
        &[
            &grafana[..],
            &[
                "--data",
                "target=sum(checkout.*)&from=-5min&until=now&format=json&maxDataPoints=100",
            ],
        ]
        .concat(),
    );
    assert_eq!(status(&head), 200, "{head}{body}");
    assert!(body.contains("\"datapoints\""), "{body}");
    let (_, head, body) = curl(&format!("{base}/graphite/functions"), &grafana);
    assert_eq!(status(&head), 200, "{head}");
    assert!(body.contains("sumSeries"));

    let with_cert = ["--cacert", &ca, "--cert", &cert, "--key", &key];
    for path in [
        "/",
        "/metrics",
        "/api/v1/known",
        "/graphite/metrics/find?query=*",
        "/nowhere",
    ] {
        for credentials in [
            &[][..],
            &["-u", "grafana:wrong"],
            &["-u", "nobody:grafana-secret"],
        ] {
            let (code, head, _) = curl(
                &format!("{base}{path}"),
                &[&with_cert[..], credentials].concat(),
            );
            assert_eq!(
                (code, status(&head)),
                (0, 401),
                "{path} {credentials:?}: {head}"
            );
            let lower = head.to_ascii_lowercase();
            assert!(lower.contains("www-authenticate: basic"), "{head}");
            assert!(
                lower.contains("x-frame-options: deny"),
                "headers on a 401 too: {head}"
            );
        }
    }
    // Probes answer without a password (web_open_probes), over the same mutual TLS.
    let (_, head, _) = curl(&format!("{base}/healthz"), &with_cert);
    assert_eq!(status(&head), 200, "{head}");

    // No client certificate, or one no CA of ours signed: the handshake fails, nothing answers.
    for args in [
        vec!["--cacert", &ca, "-u", "grafana:grafana-secret"],
        vec![
            "--cacert",
            &ca,
            "--cert",
            &path(d, "stranger.pem"),
            "--key",
            &path(d, "stranger.key"),
            "-u",
            "grafana:grafana-secret",
        ],
    ] {
        let (code, head, _) = curl(&format!("{base}/graphite/functions"), &args);
        assert_ne!(code, 0, "{args:?}: answered {head}");
        assert_eq!(status(&head), 0, "{args:?}: answered {head}");
    }
    // Without the CA, curl does not trust the agent either.
    let (code, _, _) = curl(
        &format!("{base}/healthz"),
        &["--cert", &cert, "--key", &key],
    );
    assert_eq!(code, 60, "an untrusted certificate is curl's exit 60");
    let (_, head, body) = curl(&format!("{base}/metrics"), &grafana);
    assert_eq!(status(&head), 200);
    let failures = |reason: &str| auth_failures(&body, reason);
    assert_eq!(
        (
            failures("missing"),
            failures("wrong_password"),
            failures("unknown_user")
        ),
        (5.0, 5.0, 5.0),
        "{body}"
    );
    assert!(body.contains("statsd_redis_http_tls_handshake_failures_total"));
}

/// `statsd_redis_http_auth_failures_total{reason}` in a `/metrics` text.
fn auth_failures(metrics: &str, reason: &str) -> f64 {
    let series = format!("statsd_redis_http_auth_failures_total{{reason=\"{reason}\"}} ");
    metrics
        .lines()
        .find_map(|l| l.strip_prefix(&series)?.parse().ok())
        .unwrap_or(0.0)
}

/// Debian's Prometheus 2.42 scrapes `/metrics` with `basic_auth` and `tls_config` (CA, client
/// certificate) under `RequireAndVerifyClientCert`: its target is up (its own API says so); with
/// a wrong password it is down with the 401 in `lastError`; without the client certificate,
/// down too.
#[test]
fn prometheus_scrapes_with_basic_auth_and_tls() {
    let dir = pki();
    let d = dir.path();
    let redis = RedisServer::start();
    let hash = htpasswd("scrape-secret");
    let web = format!(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n  client_auth_type: RequireAndVerifyClientCert\n  client_ca_file: ca.pem\nbasic_auth_users:\n  prometheus: {hash}\n"
    );
    let (_agent, _, http, _) = agent_with(d, &web, &redis, &[]);
    let job = |name: &str, password: &str, client_cert: bool| {
        let cert = match client_cert {
            true => format!(
                "\n    cert_file: {}\n    key_file: {}",
                path(d, "client.pem"),
                path(d, "client.key")
            ),
            false => String::new(),
        };
        format!(
            "- job_name: {name}\n  scheme: https\n  basic_auth:\n    username: prometheus\n    password: {password}\n  tls_config:\n    ca_file: {}{cert}\n  static_configs:\n  - targets: ['127.0.0.1:{http}']\n",
            path(d, "ca.pem")
        )
    };
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n{}{}{}",
        job("right", "scrape-secret", true),
        job("wrong_password", "guess", true),
        job("no_client_cert", "scrape-secret", false),
    );
    let (_prometheus, port) = prometheus(d, &config);
    let deadline = Instant::now() + Duration::from_secs(30);
    let targets = loop {
        let answer = Command::new("curl")
            .args(["-s", &format!("http://127.0.0.1:{port}/api/v1/targets")])
            .output()
            .unwrap();
        let targets: serde_json::Value = serde_json::from_slice(&answer.stdout).unwrap_or_default();
        let active = targets["data"]["activeTargets"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        let scraped = active.len() == 3 && active.iter().all(|t| t["health"] != "unknown");
        if scraped {
            break active;
        }
        assert!(
            Instant::now() < deadline,
            "Prometheus never scraped: {targets}"
        );
        std::thread::sleep(Duration::from_millis(250));
    };
    let target = |job: &str| {
        targets
            .iter()
            .find(|t| t["labels"]["job"] == job)
            .unwrap_or_else(|| panic!("{job}: {targets:?}"))
            .clone()
    };
    let right = target("right");
    assert_eq!(right["health"], "up", "{right}");
    let wrong = target("wrong_password");
    assert_eq!(wrong["health"], "down", "{wrong}");
    assert_eq!(
        wrong["lastError"], "server returned HTTP status 401 Unauthorized",
        "{wrong}"
    );
    let no_cert = target("no_client_cert");
    assert_eq!(no_cert["health"], "down", "{no_cert}");
    // Under TLS 1.3 the server's refusal (an alert) comes after the client's side of the
    // handshake: the client reads it ("tls: certificate required"), or finds the connection
    // closed while it writes its request, as timing has it.
    let error = no_cert["lastError"].as_str().unwrap();
    assert!(
        ["tls", "broken pipe", "connection reset"]
            .iter()
            .any(|e| error.contains(e)),
        "{no_cert}"
    );
}

/// Certificates renewed on disk are served from the next handshake, without SIGHUP; a SIGHUP
/// takes the file's new users; a file that no longer reads leaves the running one in force.
#[test]
fn renewed_certificates_and_reloaded_users() {
    let dir = pki();
    let d = dir.path();
    let renewed = pki();
    let redis = RedisServer::start();
    let web = |password: &str| {
        format!(
            "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\nbasic_auth_users:\n  grafana: {}\n",
            bcrypt::hash(password, 4).unwrap()
        )
    };
    let (agent, _, http, file) = agent_with(d, &web("first"), &redis, &[]);
    let base = format!("https://127.0.0.1:{http}/metrics");
    let get = |ca: &Path, password: &str| {
        let (code, head, _) = curl(
            &base,
            &[
                "--cacert",
                &path(ca, "ca.pem"),
                "-u",
                &format!("grafana:{password}"),
            ],
        );
        (code, status(&head))
    };
    assert_eq!(get(d, "first"), (0, 200));
    assert_eq!(
        get(renewed.path(), "first").0,
        60,
        "the new CA is not yet the one"
    );

    // A renewal: the new key, then the new certificate, each written in place.
    for name in ["server.key", "server.pem"] {
        std::fs::copy(renewed.path().join(name), d.join(name)).unwrap();
    }
    assert_eq!(
        get(renewed.path(), "first"),
        (0, 200),
        "the renewed certificate is served"
    );

    std::fs::write(&file, web("second")).unwrap();
    let hangup = |agent: &Killed| {
        // SAFETY: signalling our own child process.
        sighup(&agent.0);
    };
    hangup(&agent);
    let deadline = Instant::now() + Duration::from_secs(10);
    while get(renewed.path(), "second") != (0, 200) {
        assert!(
            Instant::now() < deadline,
            "SIGHUP did not take the new user"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(get(renewed.path(), "first"), (0, 401));

    std::fs::write(&file, "basic_auth_users:\n  grafana: not-a-hash\n").unwrap();
    hangup(&agent);
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(
        get(renewed.path(), "second"),
        (0, 200),
        "a bad file keeps the running one"
    );
    let mut agent = agent;
    // SAFETY: signalling our own child process.
    unsafe { libc::kill(agent.0.id() as i32, libc::SIGTERM) };
    assert!(agent.0.wait().unwrap().success());
    let mut log = String::new();
    std::io::Read::read_to_string(&mut agent.0.stderr.take().unwrap(), &mut log).unwrap();
    assert!(log.contains("the running one is kept"), "{log}");
}

/// A blocking HTTP/1.1 GET with an `Authorization` header (or none); the status.
fn get_as(addr: std::net::SocketAddr, path: &str, authorization: Option<&str>) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(20))).unwrap();
    let header = authorization.map_or(String::new(), |a| format!("Authorization: {a}\r\n"));
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: test\r\n{header}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    let _ = s.read_to_string(&mut response);
    response
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

fn basic(user: &str, password: &str) -> String {
    use base64::Engine;
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
    )
}

/// A flood of wrong passwords — thousands a second over many connections: none, repeated,
/// unknown users, and a new one each time that bcrypt (cost 10) must check — delays no window:
/// each second's counts are written in their own 1 s slice, the right user's scrapes keep their
/// 200 (its password was verified once), and every failure is counted by reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_flood_of_wrong_passwords_holds_up_no_window() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("web.yml");
    let hash = bcrypt::hash("right", 10).unwrap();
    std::fs::write(&file, format!("basic_auth_users:\n  prometheus: {hash}\n")).unwrap();
    let agent = TestAgent::start(statsd_redis::config::Config {
        web_config_file: file,
        ..test_config(&redis)
    });
    let http = agent.http;
    let right = basic("prometheus", "right");
    assert_eq!(get_as(http, "/metrics", Some(&right)), 200);
    assert_eq!(get_as(http, "/healthz", None), 200, "probes are open");

    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let flood: Vec<_> = (0..16)
        .map(|thread| {
            let stop = stop.clone();
            std::thread::spawn(move || {
                let mut answers = Vec::new();
                let mut n = 0;
                while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                    n += 1;
                    let authorization = match thread % 4 {
                        0 => None,
                        1 => Some(basic("prometheus", "guess")),
                        2 => Some(basic(&format!("user{n}"), "guess")),
                        _ => Some(basic("prometheus", &format!("guess{thread}.{n}"))),
                    };
                    answers.push(get_as(http, "/api/v1/known", authorization.as_deref()));
                }
                answers
            })
        })
        .collect();
    let scrapes = std::thread::spawn(move || {
        (0..40)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(100));
                get_as(http, "/metrics", Some(&right))
            })
            .collect::<Vec<_>>()
    });
    let started = Instant::now();
    // 50 a second for 4 s, each second's into its own slice.
    let mut sent_at = Vec::new();
    let mut written_in_flood = Vec::new();
    for i in 0..200 {
        agent.send(b"steady:1|c");
        sent_at.push(started.elapsed());
        tokio::time::sleep(Duration::from_millis(20)).await;
        if i % 50 == 49 {
            written_in_flood.push((started.elapsed(), redis.counter_total(1, "steady")));
        }
    }
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    // On time: a count's window closes within a second and is written within about another,
    // so whatever was sent 2.5 s before a look is in Redis by then.
    let late: Vec<_> = written_in_flood
        .iter()
        .filter(|(at, written)| {
            let due = sent_at
                .iter()
                .filter(|s| **s + Duration::from_millis(2500) < *at)
                .count();
            (*written as usize) < due
        })
        .collect();
    assert!(
        late.is_empty(),
        "windows written late under the flood: {written_in_flood:?}"
    );
    let flooded = started.elapsed();
    let answers: Vec<u16> = flood.into_iter().flat_map(|t| t.join().unwrap()).collect();
    assert!(
        answers.iter().all(|s| *s == 401 || *s == 503),
        "{answers:?}"
    );
    let per_second = answers.len() as f64 / flooded.as_secs_f64();
    assert!(
        per_second > 1000.0,
        "a flood: {per_second:.0} requests a second"
    );
    assert!(scrapes.join().unwrap().iter().all(|s| *s == 200));
    steady_written_second_by_second(&redis).await;
    let text = agent.telemetry.render();
    let failures = |reason: &str| auth_failures(&text, reason);
    for reason in ["missing", "wrong_password", "unknown_user"] {
        assert!(failures(reason) > 0.0, "{reason}: {text}");
    }
    let counted: f64 = ["missing", "wrong_password", "unknown_user", "busy"]
        .map(failures)
        .iter()
        .sum();
    assert_eq!(counted as usize, answers.len());
    agent.stop().await;
}

/// Each `client_auth_type` as Go means it, with curl presenting no certificate, the CA's
/// client certificate, or one nobody signed; `min_version`/`max_version` as curl's TLS 1.2 and
/// 1.3 meet them; `http2: false` serving HTTP/1.1.
#[test]
fn client_auth_types_and_versions_as_go_means_them() {
    let dir = pki();
    let d = dir.path();
    let redis = RedisServer::start();
    let tls = "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\n";
    let ca = path(d, "ca.pem");
    let none: Vec<String> = vec![];
    let signed = vec![
        "--cert".to_string(),
        path(d, "client.pem"),
        "--key".into(),
        path(d, "client.key"),
    ];
    let stranger = vec![
        "--cert".to_string(),
        path(d, "stranger.pem"),
        "--key".into(),
        path(d, "stranger.key"),
    ];
    // Which of (none, signed, stranger) get an answer.
    for (client_auth, answered) in [
        ("NoClientCert", [true, true, true]),
        ("RequestClientCert", [true, true, true]),
        ("RequireAnyClientCert", [false, true, true]),
        ("VerifyClientCertIfGiven", [true, true, false]),
        ("RequireAndVerifyClientCert", [false, true, false]),
    ] {
        let ca_line = match client_auth {
            "NoClientCert" => String::new(),
            _ => "  client_ca_file: ca.pem\n".into(),
        };
        let web = format!("{tls}  client_auth_type: {client_auth}\n{ca_line}");
        let (_agent, _, http, _) = agent_with(d, &web, &redis, &[]);
        for (certificate, want) in [&none, &signed, &stranger].into_iter().zip(answered) {
            let mut args = vec!["--cacert", &ca];
            args.extend(certificate.iter().map(String::as_str));
            let (code, head, _) = curl(&format!("https://127.0.0.1:{http}/healthz"), &args);
            assert_eq!(
                (code == 0 && status(&head) == 200),
                want,
                "{client_auth} with {certificate:?}: curl {code}, {head}"
            );
        }
    }
    for (versions, tls12, tls13) in [
        ("  min_version: TLS13\n", false, true),
        ("  max_version: TLS12\n", true, false),
        ("", true, true),
    ] {
        let web = format!("{tls}{versions}http_server_config:\n  http2: false\n");
        let (_agent, _, http, _) = agent_with(d, &web, &redis, &[]);
        let url = format!("https://127.0.0.1:{http}/healthz");
        let (code, head, _) = curl(&url, &["--cacert", &ca, "--tls-max", "1.2"]);
        assert_eq!(code == 0, tls12, "{versions:?} over TLS 1.2: {head}");
        let (code, head, _) = curl(&url, &["--cacert", &ca, "--tlsv1.3"]);
        assert_eq!(code == 0, tls13, "{versions:?} over TLS 1.3: {head}");
        if code == 0 {
            assert!(head.starts_with("HTTP/1.1 200"), "http2: false: {head}");
        }
    }
}

/// The same file served by Prometheus 2.42 itself (its `--web.config.file` is exporter-toolkit
/// v0.8.2's code) and by the agent: every kind of credentials, good and malformed, the
/// CVE-2022-46146 pair among them, meets the same status, `WWW-Authenticate` and headers.
#[test]
fn the_agent_answers_as_exporter_toolkit_does() {
    use base64::Engine;
    let dir = pki();
    let d = dir.path();
    let redis = RedisServer::start();
    let hash = htpasswd("alice123");
    let web = format!(
        "tls_server_config:\n  cert_file: server.pem\n  key_file: server.key\nhttp_server_config:\n  headers:\n    X-Frame-Options: sameorigin\n    Content-Security-Policy: default-src 'self'\nbasic_auth_users:\n  alice: {hash}\n"
    );
    let (_agent, _, agent_http, file) = agent_with(d, &web, &redis, &[]);
    let config = "scrape_configs: []\n";
    std::fs::write(d.join("prometheus.yml"), config).unwrap();
    let toolkit_port = free_port();
    let _toolkit = Killed(
        program("prometheus", "prometheus")
            .arg(format!(
                "--config.file={}",
                d.join("prometheus.yml").display()
            ))
            .arg(format!("--storage.tsdb.path={}", d.join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{toolkit_port}"))
            .arg(format!("--web.config.file={}", file.display()))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    let encode = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let (prefix, rest) = hash.split_at(20);
    let cases = [
        ("none", None),
        ("right", Some(format!("Basic {}", encode("alice:alice123")))),
        (
            "lowercase scheme",
            Some(format!("basic {}", encode("alice:alice123"))),
        ),
        (
            "wrong password",
            Some(format!("Basic {}", encode("alice:alice124"))),
        ),
        (
            "unknown user",
            Some(format!("Basic {}", encode("bob:alice123"))),
        ),
        ("not base64", Some("Basic !!!".to_string())),
        ("no colon", Some(format!("Basic {}", encode("alice")))),
        ("bearer", Some("Bearer alice123".to_string())),
        // CVE-2022-46146: a name carrying part of the hash, then a password carrying the rest.
        (
            "cve first",
            Some(format!(
                "Basic {}",
                encode(&format!("alice{prefix}:{rest}alice123"))
            )),
        ),
        (
            "cve second",
            Some(format!(
                "Basic {}",
                encode(&format!("alice:{prefix}{rest}alice123"))
            )),
        ),
        (
            "right again",
            Some(format!("Basic {}", encode("alice:alice123"))),
        ),
    ];
    let ca = path(d, "ca.pem");
    let answer = |port: u16, authorization: &Option<String>| {
        let mut args = vec!["--cacert".to_string(), ca.clone()];
        if let Some(a) = authorization {
            args.extend(["-H".to_string(), format!("Authorization: {a}")]);
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let (code, head, _) = curl(&format!("https://127.0.0.1:{port}/metrics"), &args);
        assert_eq!(code, 0, "{head}");
        let header = |name: &str| {
            head.lines()
                .find_map(|l| {
                    let (n, v) = l.split_once(':')?;
                    n.eq_ignore_ascii_case(name).then(|| v.trim().to_string())
                })
                .unwrap_or_default()
        };
        (
            status(&head),
            header("WWW-Authenticate"),
            header("X-Frame-Options"),
            header("Content-Security-Policy"),
        )
    };
    let deadline = Instant::now() + Duration::from_secs(20);
    while Command::new("curl")
        .args([
            "-sf",
            "--cacert",
            &ca,
            &format!("https://127.0.0.1:{toolkit_port}/-/healthy"),
            "-u",
            "alice:alice123",
        ])
        .output()
        .is_ok_and(|o| !o.status.success())
    {
        assert!(Instant::now() < deadline, "Prometheus did not start");
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut differ = Vec::new();
    for (name, authorization) in &cases {
        let (toolkit, agent) = (
            answer(toolkit_port, authorization),
            answer(agent_http, authorization),
        );
        if toolkit != agent {
            differ.push(format!("{name}: toolkit {toolkit:?}, agent {agent:?}"));
        }
    }
    assert!(differ.is_empty(), "{differ:#?}");
    assert_eq!(answer(agent_http, &cases[1].1).0, 200);
    assert_eq!(answer(agent_http, &cases[9].1).0, 401);
}
