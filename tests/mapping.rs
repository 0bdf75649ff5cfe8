//! statsd_exporter's own mapper tests (its `pkg/mapper/mapper_test.go`, turned into
//! `tests/mapping/vectors.json` by `scripts/mapper-vectors.py`) run through the binary: each
//! scenario's mapping file given to an agent as `mapping_file`, each case's metric sent as a
//! line of its type, and the series written checked against the name and labels statsd_exporter
//! gives it. A file statsd_exporter refuses stops the agent's start (exit code 2, one line
//! naming `mapping_file`).

mod common;

use std::net::UdpSocket;
use std::time::Duration;

use common::*;
use serde::Deserialize;

#[derive(Deserialize)]
struct Scenario {
    test: String,
    config: String,
    bad: bool,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Case {
    metric: String,
    #[serde(rename = "type")]
    kind: String,
    name: String,
    labels: std::collections::BTreeMap<String, String>,
    not_present: bool,
}

fn scenarios() -> Vec<Scenario> {
    let text = include_str!("mapping/vectors.json");
    serde_json::from_str(text).unwrap()
}

impl Case {
    /// The series the agent writes for the case, `None` when the rules drop it. Labels of empty
    /// value are left out, as Prometheus leaves them out; statsd_exporter's test lists them.
    fn series(&self, drops: bool) -> Option<String> {
        // statsd_exporter's test gives some metrics no rule matches the name its exporter
        // escapes them to (and checks it only when a rule matches): such a metric keeps its
        // name here.
        let escaped: String = self
            .metric
            .chars()
            .map(|c| if c.is_ascii_alphanumeric() { c } else { '_' })
            .collect();
        let unmatched = self.labels.is_empty() && self.name == escaped;
        if self.not_present || unmatched || (self.name.is_empty() && !drops) {
            return Some(self.metric.clone());
        }
        if self.name.is_empty() {
            return None;
        }
        let mut series = self.name.clone();
        for (k, v) in self.labels.iter().filter(|(_, v)| !v.is_empty()) {
            series.push_str(&format!(";{k}={v}"));
        }
        Some(series)
    }

    fn wire_type(&self) -> &'static str {
        match self.kind.as_str() {
            "gauge" => "g",
            "observer" => "ms",
            _ => "c",
        }
    }
}

/// Whether the agent with key prefix `prefix` wrote `series` of the case's type.
fn written(redis: &RedisServer, prefix: &str, case: &Case, series: &str) -> bool {
    let mut conn = redis.conn();
    let (key, member) = match case.kind.as_str() {
        "gauge" => (format!("{prefix}known:gauge:"), format!("1:{series}")),
        "observer" => {
            let key = format!("{prefix}stats:{series}:AccessTime");
            return redis::cmd("EXISTS").arg(&key).query(&mut conn).unwrap();
        }
        _ => (format!("{prefix}known:"), format!("1:{series}")),
    };
    let score: Option<f64> = redis::cmd("ZSCORE")
        .arg(&key)
        .arg(&member)
        .query(&mut conn)
        .unwrap();
    score.is_some()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statsd_exporters_mapper_tests_through_the_binary() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let all = scenarios();
    assert!(all.len() >= 60, "the vectors load");
    let mut running = Vec::new();
    let mut checked = 0;
    for (i, s) in all.iter().enumerate() {
        let file = dir.path().join(format!("mapping-{i}.yml"));
        std::fs::write(&file, &s.config).unwrap();
        let file = file.to_str().unwrap().to_string();
        if s.bad {
            // Refused: before anything is bound.
            let out = bin()
                .args(["--mapping-file", &file, "--udp", "127.0.0.1:0"])
                .args(["--http", "127.0.0.1:0", "--redis", &redis.url()])
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{}: {stderr}", s.test);
            assert_eq!(stderr.trim().lines().count(), 1, "{}: {stderr}", s.test);
            assert!(stderr.contains("mapping_file"), "{}: {stderr}", s.test);
            checked += 1;
            continue;
        }
        let prefix = format!("s{i}:");
        let args = ["--mapping-file", &file, "--key-prefix", &prefix];
        let (agent, udp, http) = spawn_agent(&redis.url(), &args);
        let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
        for case in &s.cases {
            let line = format!("{}:1|{}", case.metric, case.wire_type());
            socket.send_to(line.as_bytes(), ("127.0.0.1", udp)).unwrap();
        }
        running.push((Killed(agent), i, prefix, http));
    }
    for (_agent, i, prefix, http) in &running {
        let s = &all[*i];
        let drops = s.config.contains("action: drop");
        let mut dropped = 0.0;
        for case in &s.cases {
            match case.series(drops) {
                Some(series) => {
                    eventually(Duration::from_secs(10), &s.test, || {
                        written(&redis, prefix, case, &series)
                    })
                    .await;
                }
                None => dropped += 1.0,
            }
            checked += 1;
        }
        let http = ([127, 0, 0, 1], *http).into();
        let filtered = "samples_dropped_total{reason=\"filtered\"}";
        assert_eq!(metric_at(http, filtered), dropped, "{}", s.test);
    }
    // Every case, and every file statsd_exporter refuses but those the agent takes on purpose.
    assert_eq!(checked, 66 + 11);
}

/// A mapping file changed and SIGHUP: the new rules apply; a file that no longer reads keeps
/// the running rules, and says which rule is wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_reads_the_mapping_file_again() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("mapping.yml");
    let rules = |name: &str| {
        format!("mappings:\n- match: app.*.requests\n  name: {name}\n  labels:\n    host: $1\n")
    };
    std::fs::write(&file, rules("requests_total")).unwrap();
    let file_arg = file.to_str().unwrap().to_string();
    let (child, udp, _) = spawn_agent(&redis.url(), &["--mapping-file", &file_arg]);
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let send = || {
        socket
            .send_to(b"app.web01.requests:1|c|#env:prod", ("127.0.0.1", udp))
            .unwrap()
    };
    send();
    eventually(Duration::from_secs(5), "mapped", || {
        redis.counter_total(1, "requests_total;env=prod;host=web01") == 1
    })
    .await;
    std::fs::write(&file, rules("hits_total")).unwrap();
    sighup(&child);
    eventually(Duration::from_secs(5), "mapped by the new rules", || {
        send();
        redis.counter_total(1, "hits_total;env=prod;host=web01") > 0
    })
    .await;
    std::fs::write(&file, rules("bad-name")).unwrap();
    sighup(&child);
    // What the loop above sent is written within a window or two.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    let before = redis.counter_total(1, "hits_total;env=prod;host=web01");
    send();
    eventually(Duration::from_secs(5), "the running rules kept", || {
        redis.counter_total(1, "hits_total;env=prod;host=web01") == before + 1
    })
    .await;
    let (code, log, _) = terminate(child);
    assert_eq!(code, Some(0), "{log}");
    assert!(
        log.contains("SIGHUP: the configuration does not read") && log.contains("rule 1"),
        "{log}"
    );
}
