//! The filters (`keep_names`, `drop_names`, `drop_types`, `drop_tags`) through the binary, from
//! its configuration file and again after a SIGHUP: what they remove is counted, never written,
//! and never fills the series cap.

mod common;

use std::net::UdpSocket;
use std::time::Duration;

use common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_drop_before_aggregation_and_reload_on_sighup() {
    let redis = RedisServer::start();
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("agent.toml");
    std::fs::write(
        &file,
        "keep_names = [\"api.*\", \"web.*\"]\n\
         drop_names = [\"*.debug.*\"]\n\
         drop_types = [\"h\"]\n\
         drop_tags = [\"container_id\", \"pod\"]\n\
         max_series_per_window = 3\n\
         cleaner_enabled = false\n",
    )
    .unwrap();
    let file_arg = file.to_str().unwrap().to_string();
    let (child, udp, http) = spawn_agent(&redis.url(), &["--config", &file_arg]);
    let http = ([127, 0, 0, 1], http).into();
    let socket = UdpSocket::bind("127.0.0.1:0").unwrap();
    let send = |lines: &str| {
        socket
            .send_to(lines.as_bytes(), ("127.0.0.1", udp))
            .unwrap();
    };
    // Ten series the filters remove, before three that fill the cap exactly.
    let removed: Vec<String> = (0..10)
        .map(|i| format!("noise.{i}:1|c\napi.debug.{i}:1|c\napi.size:{i}|h"))
        .collect();
    send(&removed.join("\n"));
    send(
        "api.hits:1|c|#route:cart,container_id:abc123,pod:p-1\n\
         api.hits:2|c|#route:cart,container_id:def456\n\
         web.load:3|g\n\
         api.lat:5|ms|#pod:p-2",
    );
    eventually(Duration::from_secs(5), "the window written", || {
        redis.counter_total(1, "api.hits;route=cart") == 3
    })
    .await;
    let filtered = |kind: &str| {
        metric_at(
            http,
            &format!("samples_dropped_total{{type=\"{kind}\",reason=\"filtered\"}}"),
        )
    };
    assert_eq!(filtered("c"), 20.0);
    assert_eq!(filtered("h"), 10.0);
    assert_eq!(
        metric_at(http, "samples_dropped_total{reason=\"series_cap\"}"),
        0.0,
        "filtered series never reach the cap"
    );
    let known = redis.known("known:");
    assert!(
        known
            .iter()
            .all(|m| !m.contains("noise") && !m.contains("debug")),
        "{known:?}"
    );
    let mut stats: Vec<String> = redis::cmd("KEYS")
        .arg("stats:*")
        .query(&mut redis.conn())
        .unwrap();
    stats.sort();
    let want = ["stats:api.lat:AccessTime", "stats:api.lat:AccessTime:start"];
    assert_eq!(stats, want, "the pod tag is gone");

    // SIGHUP: the noise is kept now, the debug names still dropped.
    std::fs::write(
        &file,
        "drop_names = [\"*.debug.*\"]\nmax_series_per_window = 3\ncleaner_enabled = false\n",
    )
    .unwrap();
    sighup(&child);
    eventually(Duration::from_secs(5), "the filters reloaded", || {
        send("noise.0:1|c\napi.debug.0:1|c");
        redis.counter_total(1, "noise.0") > 0
    })
    .await;
    let (code, log, _) = terminate(child);
    assert_eq!(code, Some(0), "{log}");
    assert!(redis.counter_total(1, "api.debug.0") == 0, "{log}");
    assert!(
        log.contains("SIGHUP: applied") && log.contains("keep_names"),
        "{log}"
    );
}

/// A filter that does not compile stops the start with one line naming its key, exit code 2.
#[test]
fn a_bad_filter_stops_the_start_naming_its_key() {
    let out = bin()
        .args(["--drop-types", "c,xyz", "--udp", "127.0.0.1:0"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(stderr.trim().lines().count(), 1, "{stderr}");
    assert!(
        stderr.contains("drop_types") && stderr.contains("xyz"),
        "{stderr}"
    );
}
