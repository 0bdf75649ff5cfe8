//! The Grafana dashboards shipped in `dist/grafana/`: each loads, names only the data sources
//! the provisioning files make, every Graphite target (and template variable query) answers
//! 200 with data from the agent on test traffic, and every Prometheus expression names metrics
//! the agent's `/metrics` exports.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use serde_json::Value;

const DASHBOARDS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dist/grafana/dashboards");
const PROVISIONING: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/dist/grafana/provisioning");

fn dashboards() -> Vec<(String, Value)> {
    let mut out: Vec<(String, Value)> = std::fs::read_dir(DASHBOARDS)
        .unwrap()
        .flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            let text = std::fs::read_to_string(e.path()).unwrap();
            let json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{name}: {e}"));
            (name, json)
        })
        .collect();
    out.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(out.len(), 2, "the health and the overview dashboards");
    out
}

/// Each query of a dashboard: its data source's uid, and the Graphite target or PromQL.
fn queries(dashboard: &Value) -> Vec<(String, String)> {
    let uid = |q: &Value| {
        q["datasource"]["uid"]
            .as_str()
            .unwrap_or_default()
            .to_string()
    };
    let mut out = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().unwrap() {
            let text = target["target"].as_str().or(target["expr"].as_str());
            out.push((uid(target), text.unwrap().to_string()));
        }
    }
    for var in dashboard["templating"]["list"].as_array().unwrap() {
        let query = match &var["query"] {
            Value::String(q) => q.clone(),
            q => q["query"].as_str().unwrap().to_string(),
        };
        out.push((uid(var), query));
    }
    out
}

/// A Graphite target with its template variables replaced by their queries (what "All" asks
/// for), one within another.
fn expanded(target: &str, dashboard: &Value) -> String {
    let vars: BTreeMap<String, String> = dashboard["templating"]["list"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|v| Some((v["name"].as_str()?.to_string(), v["query"].as_str()?.into())))
        .collect();
    let mut out = target.to_string();
    while let Some((name, query)) = vars.iter().find(|(n, _)| out.contains(&format!("${n}"))) {
        out = out.replace(&format!("${name}"), query);
    }
    out
}

#[test]
fn the_provisioning_files_make_the_data_sources_the_dashboards_name() {
    let read = |path: &str| -> yaml_serde::Value {
        let text = std::fs::read_to_string(format!("{PROVISIONING}/{path}")).unwrap();
        yaml_serde::from_str(&text).unwrap()
    };
    let sources = read("datasources/statsd-redis.yaml");
    let made: BTreeSet<(String, String)> = sources["datasources"]
        .as_sequence()
        .unwrap()
        .iter()
        .map(|s| {
            let field = |k: &str| s[k].as_str().unwrap().to_string();
            (field("uid"), field("type"))
        })
        .collect();
    let graphite = &sources["datasources"][0];
    assert!(graphite["url"].as_str().unwrap().ends_with("/graphite"));
    let providers = read("dashboards/statsd-redis.yaml");
    assert_eq!(providers["providers"][0]["type"].as_str(), Some("file"));
    for (name, dashboard) in dashboards() {
        assert!(
            dashboard["uid"].is_string() && dashboard["title"].is_string(),
            "{name}"
        );
        for (uid, query) in queries(&dashboard) {
            let kind = if uid.ends_with("graphite") {
                "graphite"
            } else {
                "prometheus"
            };
            assert!(
                made.contains(&(uid.clone(), kind.to_string())),
                "{name}: {query} names data source {uid:?}"
            );
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_query_answers_from_the_agent() {
    let redis = RedisServer::start();
    // A relay target, so that the relay's metrics exist (they are made per target).
    let relayed = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let config = statsd_redis::config::Config {
        relay: vec![format!("udp://{}", relayed.local_addr().unwrap())],
        ..test_config(&redis)
    };
    let agent = TestAgent::start(config);
    // Test traffic of every kind, at two and three levels, for a few windows.
    for i in 0..3 {
        agent.send(
            format!(
                "app.requests:{}|c\napp.api.hits:3|c\napp.latency:{}|ms\napp.api.latency:{}|ms\n\
                 app.queue:{}|g\napp.users:u{i}|s\nbad line",
                5 + i,
                10 + i,
                40 + i,
                7 + i
            )
            .as_bytes(),
        );
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    eventually(Duration::from_secs(10), "the traffic written", || {
        redis.counter_total(1, "app.requests") == 18
    })
    .await;
    tokio::time::sleep(Duration::from_millis(1200)).await;
    let exported: BTreeSet<String> = http_get(agent.http, "/metrics")
        .1
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect();
    let mut graphite = 0;
    let mut prometheus = 0;
    for (name, dashboard) in dashboards() {
        for (uid, query) in queries(&dashboard) {
            if uid.ends_with("prometheus") {
                prometheus += 1;
                let names = query
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                    .filter(|w| w.starts_with("statsd_redis_"));
                for metric in names {
                    let base = metric.strip_suffix("_bucket").unwrap_or(metric);
                    assert!(exported.contains(base), "{name}: {query}: no {metric}");
                }
                continue;
            }
            graphite += 1;
            let target = expanded(&query, &dashboard);
            let escaped: String = form_urlencoded(&target);
            let (path, params) = if query == target && !query.contains('(') {
                ("/graphite/metrics/find", format!("query={escaped}"))
            } else {
                let params = format!("target={escaped}&from=-5min&format=json");
                ("/graphite/render", params)
            };
            let (status, _, body) = http_request(agent.http, "GET", path, &params);
            assert_eq!(status, 200, "{name}: {target}: {body}");
            let answer: Value = serde_json::from_str(&body).unwrap();
            let has_data = answer.as_array().unwrap().iter().any(|item| {
                item["datapoints"]
                    .as_array()
                    .is_none_or(|points| points.iter().any(|p| p[0].is_number()))
            });
            assert!(has_data, "{name}: {target}: no data in {body}");
        }
    }
    assert_eq!((graphite, prometheus), (7, 14), "every query was asked");
    agent.stop().await;
}

/// A query string's value, as a browser encodes it.
fn form_urlencoded(text: &str) -> String {
    text.bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'*' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}
