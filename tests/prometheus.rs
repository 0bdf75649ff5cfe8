//! The applications' series on `/metrics` (`prometheus_app_metrics`), through the binary: the
//! page as statsd_exporter v0.30 shows the same lines (docs/prometheus.md), statsd_exporter's
//! escaping cases (`pkg/mapper/escape_test.go`), conflicts refused and counted, `promtool check
//! metrics` parsing every page, and Debian's Prometheus 2.42 answering PromQL over a scrape.

mod common;

use std::io::Write;
use std::net::{SocketAddr, UdpSocket};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use common::*;

/// One histogram by mapping, one counter with a label, everything else unmapped.
const MAPPING: &str = "\
mappings:
- match: api.*.latency
  name: api_latency_seconds
  observer_type: histogram
  histogram_options:
    buckets: [0.05, 0.1, 0.5, 1]
  labels:
    route: $1
- match: jobs.*.done
  name: jobs_done_total
  labels:
    queue: $1
- match: brief.*
  name: brief_$1
  help: Seen lately.
  ttl: 2s
";

struct Agent {
    _child: Child,
    udp: u16,
    http: SocketAddr,
    _dir: tempfile::TempDir,
    _redis: RedisServer,
}

impl Agent {
    fn start(extra: &[&str]) -> Agent {
        let redis = RedisServer::start();
        let dir = tempfile::tempdir().unwrap();
        let mapping = dir.path().join("mapping.yml");
        std::fs::write(&mapping, MAPPING).unwrap();
        let mut args = vec![
            "--prometheus-app-metrics",
            "true",
            "--mapping-file",
            mapping.to_str().unwrap(),
        ];
        args.extend_from_slice(extra);
        let (child, udp, http) = spawn_agent(&redis.url(), &args);
        Agent {
            _child: child,
            udp,
            http: ([127, 0, 0, 1], http).into(),
            _dir: dir,
            _redis: redis,
        }
    }

    fn send(&self, lines: &[&str]) {
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        socket
            .send_to(lines.join("\n").as_bytes(), ("127.0.0.1", self.udp))
            .unwrap();
    }

    fn page(&self) -> String {
        http_get(self.http, "/metrics").1
    }

    /// The page once it holds every one of `lines` (windows close each second).
    fn page_with(&self, lines: &[&str]) -> String {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let page = self.page();
            if lines.iter().all(|l| page.lines().any(|p| p == *l)) {
                return page;
            }
            let missing: Vec<_> = lines
                .iter()
                .filter(|l| !page.lines().any(|p| p == **l))
                .collect();
            assert!(
                Instant::now() < deadline,
                "missing {missing:?} from the page:\n{page}"
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// The lines of `family` (its HELP, TYPE and samples) on `page`.
fn family(page: &str, name: &str) -> Vec<String> {
    page.lines()
        .filter(|l| {
            let l = l
                .strip_prefix("# HELP ")
                .or_else(|| l.strip_prefix("# TYPE "))
                .unwrap_or(l);
            let n = l.split([' ', '{']).next().unwrap_or_default();
            n == name
                || ["_sum", "_count", "_bucket"]
                    .map(|s| format!("{name}{s}"))
                    .contains(&n.to_string())
        })
        .map(str::to_string)
        .collect()
}

/// `promtool check metrics` parses the page: it may only find what statsd_exporter's page has
/// too (counters named as sent, without `_total`), never a line it cannot parse.
fn promtool_accepts(page: &str) {
    let mut child = program("promtool", "prometheus")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child
        .stdin
        .take()
        .unwrap()
        .write_all(page.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    // promtool: 0 clean, 3 lint problems only, 1 a page it cannot parse.
    assert!(
        matches!(out.status.code(), Some(0 | 3)),
        "promtool refuses the page ({:?}): {said}\n{page}",
        out.status
    );
    for problem in said.lines() {
        assert!(
            problem.contains("counter metrics should have \"_total\" suffix"),
            "promtool: {problem}\n{page}"
        );
    }
}

/// Each type as statsd_exporter shows it: counters summed with their rate, gauges set and
/// moved, timers in seconds as summaries, `h` and `d` as sent, a mapped histogram, tags of
/// every dialect as labels, sets as the members of the last window.
#[test]
fn each_type_as_statsd_exporter_shows_it() {
    let agent = Agent::start(&[]);
    agent.send(&[
        "foo.bar:1|c",
        "foo.bar:3|c|@0.5",
        "g:5|g",
        "g:+2|g",
        "t:100|ms",
        "t:100|ms",
        "t:100|ms",
        "size:512|h",
        "d.x:0.5|d",
        "api.checkout.latency:30|ms",
        "api.checkout.latency:70|ms",
        "api.checkout.latency:300|ms",
        "api.checkout.latency:2000|ms",
        "jobs.email.done:2|c",
        "req:1|c|#Method:GET,tag.with.dots:x,09digits:y,url:http://a/b?c=d",
        "inf,host=a:1|c",
        "users:a|s",
        "users:b|s",
        "users:a|s",
    ]);
    let page = agent.page_with(&[
        "t_count 3",
        "users 2",
        "api_latency_seconds_count{route=\"checkout\"} 4",
    ]);
    let help = "Metric autogenerated by statsd-redis.";
    let want = |name: &str, kind: &str, samples: &[&str]| {
        let mut lines = vec![
            format!("# HELP {name} {help}"),
            format!("# TYPE {name} {kind}"),
        ];
        lines.extend(samples.iter().map(|s| s.to_string()));
        assert_eq!(family(&page, name), lines, "{name}:\n{page}");
    };
    want("foo_bar", "counter", &["foo_bar 7"]);
    want("g", "gauge", &["g 7"]);
    want(
        "t",
        "summary",
        &[
            "t{quantile=\"0.5\"} 0.1",
            "t{quantile=\"0.9\"} 0.1",
            "t{quantile=\"0.99\"} 0.1",
            "t_sum 0.30000000000000004",
            "t_count 3",
        ],
    );
    want(
        "size",
        "summary",
        &[
            "size{quantile=\"0.5\"} 512",
            "size{quantile=\"0.9\"} 512",
            "size{quantile=\"0.99\"} 512",
            "size_sum 512",
            "size_count 1",
        ],
    );
    want(
        "d_x",
        "summary",
        &[
            "d_x{quantile=\"0.5\"} 0.5",
            "d_x{quantile=\"0.9\"} 0.5",
            "d_x{quantile=\"0.99\"} 0.5",
            "d_x_sum 0.5",
            "d_x_count 1",
        ],
    );
    want(
        "api_latency_seconds",
        "histogram",
        &[
            "api_latency_seconds_bucket{route=\"checkout\",le=\"0.05\"} 1",
            "api_latency_seconds_bucket{route=\"checkout\",le=\"0.1\"} 2",
            "api_latency_seconds_bucket{route=\"checkout\",le=\"0.5\"} 3",
            "api_latency_seconds_bucket{route=\"checkout\",le=\"1\"} 3",
            "api_latency_seconds_bucket{route=\"checkout\",le=\"+Inf\"} 4",
            "api_latency_seconds_sum{route=\"checkout\"} 2.4",
            "api_latency_seconds_count{route=\"checkout\"} 4",
        ],
    );
    want(
        "jobs_done_total",
        "counter",
        &["jobs_done_total{queue=\"email\"} 2"],
    );
    want(
        "req",
        "counter",
        &["req{Method=\"GET\",_09digits=\"y\",tag_with_dots=\"x\",url=\"http://a/b?c=d\"} 1"],
    );
    want("inf", "counter", &["inf{host=\"a\"} 1"]);
    want("users", "gauge", &["users 2"]);
    promtool_accepts(&page);
    // A set is the members of the last window: none came since.
    agent.page_with(&["users 0", "foo_bar 7", "g 7"]);
}

/// statsd_exporter's `pkg/mapper/escape_test.go`, case by case, through the binary; its empty
/// name is a bad line here (`:1|c`), refused before any name is made. With `sanitize_names`
/// off the name reaches the page as sent; with it on (the default), Etsy's sanitizing drops
/// what it does not keep first (docs/prometheus.md).
#[test]
fn names_escaped_as_statsd_exporter_escapes_them() {
    // The empty name is a bad line here: the page gets the others.
    let cases: Vec<(&str, &str)> = include_str!("prometheus/escape_cases.txt")
        .lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| l.split_once('\t'))
        .filter(|(name, _)| !name.is_empty())
        .collect();
    let agent = Agent::start(&["--sanitize-names", "false"]);
    let lines: Vec<String> = cases.iter().map(|(n, _)| format!("{n}:1|c")).collect();
    agent.send(&lines.iter().map(String::as_str).collect::<Vec<_>>());
    let want: Vec<String> = cases.iter().map(|(_, e)| format!("{e} 1")).collect();
    let page = agent.page_with(&want.iter().map(String::as_str).collect::<Vec<_>>());
    promtool_accepts(&page);
}

/// The first type seen wins; later samples of another type are counted and left off; a name
/// that would make the page invalid beside another is refused; the page stays valid.
#[test]
fn conflicts_are_refused_and_counted() {
    let agent = Agent::start(&[]);
    agent.send(&["x:1|c", "t:100|ms"]);
    agent.page_with(&["x 1", "t_count 1"]);
    agent.send(&["x:5|g", "x:2|ms", "t_count:1|c", "t_sum:4|g"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while metric_at(
        agent.http,
        "app_series_refused_total{reason=\"name_collision\"}",
    ) < 2.0
    {
        assert!(Instant::now() < deadline, "{}", agent.page());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert_eq!(
        metric_at(
            agent.http,
            "app_series_refused_total{reason=\"type_conflict\"}"
        ),
        2.0
    );
    let page = agent.page();
    assert_eq!(family(&page, "x")[2..], ["x 1"], "{page}");
    assert!(
        !page
            .lines()
            .any(|l| l.starts_with("# TYPE t_count") || l.starts_with("# TYPE t_sum")),
        "{page}"
    );
    promtool_accepts(&page);
}

/// A rule's `ttl` takes its series off the page once unseen that long; the others stay.
#[test]
fn a_series_unseen_for_its_ttl_leaves_the_page() {
    let agent = Agent::start(&[]);
    let sent = Instant::now();
    agent.send(&["brief.a:1|c", "stays:1|c"]);
    let page = agent.page_with(&["brief_a 1", "stays 1"]);
    assert_eq!(family(&page, "brief_a")[0], "# HELP brief_a Seen lately.");
    let deadline = Instant::now() + Duration::from_secs(10);
    while agent.page().contains("brief_a") {
        assert!(Instant::now() < deadline, "{}", agent.page());
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(
        sent.elapsed() >= Duration::from_secs(2),
        "gone before its ttl"
    );
    let page = agent.page();
    assert!(page.lines().any(|l| l == "stays 1"), "{page}");
    // Sent again, it starts from nothing.
    agent.send(&["brief.a:5|c"]);
    agent.page_with(&["brief_a 5"]);
}

/// A page of 30 000 series is sent in pieces (HTTP/1.1 chunks) as it is written, whole and
/// valid.
#[test]
fn a_large_page_is_sent_in_pieces() {
    let agent = Agent::start(&[]);
    let lines: Vec<String> = (0..30_000).map(|i| format!("many.c{i}:{i}|c")).collect();
    for batch in lines.chunks(100) {
        agent.send(&batch.iter().map(String::as_str).collect::<Vec<_>>());
    }
    agent.page_with(&["many_c0 0", "many_c29999 29999"]);
    let mut s = std::net::TcpStream::connect(agent.http).unwrap();
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: test\r\nConnection: close\r\n\r\n")
        .unwrap();
    let mut response = String::new();
    std::io::Read::read_to_string(&mut s, &mut response).unwrap();
    let head = response
        .split("\r\n\r\n")
        .next()
        .unwrap()
        .to_ascii_lowercase();
    assert!(head.contains("transfer-encoding: chunked"), "{head}");
    let page = agent.page();
    let samples = page.lines().filter(|l| l.starts_with("many_c")).count();
    assert_eq!(samples, 30_000);
    promtool_accepts(&page);
}

/// A PromQL query of Prometheus's HTTP API: the first sample's value, when there is one (none
/// while Prometheus is still starting).
fn query(port: u16, promql: &str) -> Option<f64> {
    let out = std::process::Command::new("curl")
        .args(["-s", "--max-time", "5"])
        .arg(format!(
            "http://127.0.0.1:{port}/api/v1/query?query={}",
            query_encode(promql)
        ))
        .output()
        .expect("curl: apt-get install -y curl");
    let answer: serde_json::Value = serde_json::from_slice(&out.stdout).ok()?;
    answer["data"]["result"][0]["value"][1]
        .as_str()
        .and_then(|v| v.parse().ok())
}

/// Debian's Prometheus 2.42 scrapes the agent every second: the rate of a counter sent at a
/// steady 50 a second, a gauge's value, a summary's quantile and `histogram_quantile` over the
/// mapped histogram answer as the lines say.
#[test]
fn prometheus_answers_promql_over_the_page() {
    let agent = Agent::start(&[]);
    let dir = tempfile::tempdir().unwrap();
    let config = format!(
        "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n- job_name: agent\n  static_configs:\n  - targets: ['{}']\n",
        agent.http
    );
    let (_prometheus, port) = prometheus(dir.path(), &config);
    agent.send(&[
        "queue.depth:42|g",
        "t:100|ms",
        "api.checkout.latency:30|ms",
        "api.checkout.latency:70|ms",
        "api.checkout.latency:300|ms",
        "api.checkout.latency:2000|ms",
    ]);
    // 10 every 200 ms, 50 a second, while Prometheus is asked.
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let sender = {
        let (stop, udp) = (stop.clone(), agent.udp);
        std::thread::spawn(move || {
            let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                socket.send_to(b"hits:10|c", ("127.0.0.1", udp)).unwrap();
                std::thread::sleep(Duration::from_millis(200));
            }
        })
    };
    let deadline = Instant::now() + Duration::from_secs(40);
    let expect = |promql: &str, ok: &dyn Fn(f64) -> bool| loop {
        let got = query(port, promql);
        if got.is_some_and(ok) {
            return;
        }
        assert!(Instant::now() < deadline, "{promql}: {got:?}");
        std::thread::sleep(Duration::from_millis(250));
    };
    expect("queue_depth", &|v| v == 42.0);
    expect("t{quantile=\"0.99\"}", &|v| v == 0.1);
    // Ranks 2 and 3.6 of 4: the top of the 0.1 bucket, and the last finite bound.
    expect(
        "histogram_quantile(0.5, api_latency_seconds_bucket{route=\"checkout\"})",
        &|v| (v - 0.1).abs() < 1e-9,
    );
    expect(
        "histogram_quantile(0.9, api_latency_seconds_bucket)",
        &|v| v == 1.0,
    );
    // Over seconds of steady sending: 50 a second, within a scrape's and a window's jitter.
    expect("rate(hits[5s])", &|v| (35.0..=65.0).contains(&v));
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    sender.join().unwrap();
}
