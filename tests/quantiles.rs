//! Quantiles from the buckets in Redis: within the relative accuracy of the exact quantiles of
//! what was sent, for several distributions and sample rates, over real UDP; merged exactly
//! across agents and slices; the agent's own bound on a hash; read by the CLI and the API.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::*;
use statsd_redis::aggregate::{Buckets, ClosedWindow, Mapping, StatKind, Stats};
use statsd_redis::config::Config;
use statsd_redis::store::{ChunkSettings, CounterWrite, QuantileRange, Writer, build_chunks};
use statsd_redis::telemetry::Telemetry;

const QS: [f64; 7] = [0.0, 0.1, 0.5, 0.9, 0.99, 0.999, 1.0];

/// A small deterministic generator (xorshift64*), so the tests need no seed handling.
struct Rng(u64);

impl Rng {
    fn unit(&mut self) -> f64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        ((self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    }

    fn normal(&mut self) -> f64 {
        (-2.0 * self.unit().ln()).sqrt() * (std::f64::consts::TAU * self.unit()).cos()
    }
}

/// `(value, rate)` samples of one distribution.
fn distribution(name: &str, n: usize) -> Vec<(f64, f64)> {
    let mut rng = Rng(0x9E37_79B9_7F4A_7C15 ^ name.len() as u64);
    (0..n)
        .map(|i| match name {
            "uniform" => (1.0 + 999.0 * rng.unit(), 1.0),
            "lognormal" => ((3.0 + 1.2 * rng.normal()).exp(), 1.0),
            "bimodal" => (
                if i % 4 == 0 {
                    800.0 + 50.0 * rng.normal()
                } else {
                    20.0 + 3.0 * rng.normal()
                },
                1.0,
            ),
            // A quarter of the values sent at rate 0.1: each weighs ten.
            _ => {
                let v = (2.0 + 0.8 * rng.normal()).exp();
                (v, if i % 4 == 0 { 0.1 } else { 1.0 })
            }
        })
        .map(|(v, r)| ((v * 1000.0).round() / 1000.0, r))
        .collect()
}

/// The exact weighted quantile: the value of rank `q · (n − 1)`, each value counted `1 / rate`.
fn exact(samples: &[(f64, f64)], q: f64) -> f64 {
    let mut sorted = samples.to_vec();
    sorted.sort_by(|a, b| a.0.total_cmp(&b.0));
    let total: f64 = sorted.iter().map(|(_, r)| 1.0 / r).sum();
    let rank = q * (total - 1.0);
    let mut seen = 0.0;
    for (v, r) in &sorted {
        seen += 1.0 / r;
        if seen > rank {
            return *v;
        }
    }
    sorted.last().unwrap().0
}

fn assert_within(got: f64, want: f64, alpha: f64, what: &str) {
    assert!(
        (got - want).abs() <= alpha * want.abs() * (1.0 + 1e-9),
        "{what}: read {got}, exact {want}"
    );
}

fn send_samples(agent: &TestAgent, series: &str, samples: &[(f64, f64)]) {
    let lines: Vec<String> = samples
        .iter()
        .map(|(v, r)| {
            if *r == 1.0 {
                format!("{series}:{v}|ms")
            } else {
                format!("{series}:{v}|ms|@{r}")
            }
        })
        .collect();
    for chunk in lines.chunks(50) {
        agent.send(chunk.join("\n").as_bytes());
    }
}

/// The hour's quantiles of `series`, once Redis holds `want` values of it.
async fn hour_once_counted(
    reader: &mut statsd_redis::store::Reader,
    series: &str,
    want: f64,
) -> statsd_redis::store::QuantilesView {
    hour_once_counted_within(reader, series, want, Duration::from_secs(5)).await
}

async fn hour_once_counted_within(
    reader: &mut statsd_redis::store::Reader,
    series: &str,
    want: f64,
    within: Duration,
) -> statsd_redis::store::QuantilesView {
    for _ in 0..within.as_millis() / 100 {
        let view = reader
            .quantiles(
                (series, StatKind::Timer),
                &QS,
                QuantileRange::hour(unix_now()),
                (false, None),
            )
            .await
            .unwrap()
            .filter(|v| (v.count - want).abs() < 1e-6);
        if let Some(view) = view {
            return view;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("{series}: not all {want} values arrived");
}

fn total_weight(samples: &[(f64, f64)]) -> f64 {
    samples.iter().map(|(_, r)| 1.0 / r).sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn quantiles_read_back_within_the_accuracy_for_every_distribution() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(test_config(&redis));
    let all: Vec<(&str, Vec<(f64, f64)>)> = ["uniform", "lognormal", "bimodal", "sampled"]
        .into_iter()
        .map(|d| (d, distribution(d, 4000)))
        .collect();
    for (name, samples) in &all {
        send_samples(&agent, &format!("q.{name}"), samples);
    }
    let mut reader = redis.store().reader().await.unwrap();
    for (name, samples) in &all {
        let series = format!("q.{name}");
        let want = total_weight(samples);
        let view = hour_once_counted(&mut reader, &series, want).await;
        assert_eq!(view.relative_accuracy, 0.01);
        for (q, got) in view.quantiles {
            assert_within(got, exact(samples, q), 0.01, &format!("{series} q={q}"));
        }
        // The slices of the last minutes hold the same values.
        let now = unix_now();
        let last = reader
            .quantiles(
                (&series, StatKind::Timer),
                &[0.5, 0.99],
                QuantileRange::last(120, 60, now),
                (false, None),
            )
            .await
            .unwrap()
            .unwrap();
        assert!(
            (last.count - want).abs() < 1e-6,
            "{series}: {} at 60 s",
            last.count
        );
        for (q, got) in last.quantiles {
            assert_within(
                got,
                exact(samples, q),
                0.01,
                &format!("{series} q={q}, 60 s slices"),
            );
        }
    }
    agent.stop().await;
}

/// `quantile_write_secs`: the buckets held for a period come once per slice, whole, while the
/// agent runs (here 5 s periods and slices; the default is a minute), and read back as if
/// they had come with every window.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn buckets_held_for_a_period_read_back_the_same() {
    let redis = RedisServer::start();
    let agent = TestAgent::start(Config {
        quantile_precisions: vec![5, 3600],
        quantile_write_secs: 5,
        ..test_config(&redis)
    });
    let samples = distribution("lognormal", 3000);
    let start = unix_now();
    for part in samples.chunks(500) {
        send_samples(&agent, "held", part);
        tokio::time::sleep(Duration::from_millis(400)).await;
    }
    let mut reader = redis.store().reader().await.unwrap();
    let view = hour_once_counted_within(&mut reader, "held", 3000.0, Duration::from_secs(15)).await;
    for (q, got) in view.quantiles {
        assert_within(got, exact(&samples, q), 0.01, &format!("held q={q}"));
    }
    // Every 5 s slice of the send holds its share, and they add up to all of it.
    let slices: f64 = (start / 5 * 5..=unix_now())
        .step_by(5)
        .map(|s| redis.hist_total(&format!("hist:5:held:AccessTime:{s}")))
        .sum();
    assert_eq!(slices, 3000.0);
    assert!(agent.metric("flushes_total{outcome=\"ok\"}") > 0.0);
    agent.stop().await;
}

/// Two agents sending halves of one stream into one Redis read back as the one stream: the
/// buckets merge by Redis's addition, so the quantiles are those of all the values in one
/// sketch, exactly, and within the accuracy of the exact ones.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_agents_merge_into_the_quantiles_of_the_whole_stream() {
    let redis = RedisServer::start();
    let a = TestAgent::start(test_config(&redis));
    let b = TestAgent::start(test_config(&redis));
    let samples = distribution("lognormal", 3000);
    let (first, second) = samples.split_at(1500);
    send_samples(&a, "merged", first);
    send_samples(&b, "merged", second);
    let mapping = Mapping::default();
    let mut one = Buckets::default();
    for (v, _) in &samples {
        one.add(mapping.bucket(*v), 1.0);
    }
    let mut reader = redis.store().reader().await.unwrap();
    let read = hour_once_counted(&mut reader, "merged", 3000.0).await;
    for (q, got) in read.quantiles {
        assert_eq!(Some(got), one.quantile(&mapping, q), "q={q}: as one sketch");
        assert_within(got, exact(&samples, q), 0.01, &format!("q={q}"));
    }
    a.stop().await;
    b.stop().await;
}

fn timer_window(start: u64, values: &[f64]) -> ClosedWindow {
    let mapping = Mapping::default();
    let mut stats = Stats::new();
    for &v in values {
        stats.count += 1.0;
        stats.sum += v;
        stats.sumsq += v * v;
        stats.min = stats.min.min(v);
        stats.max = stats.max.max(v);
        stats.buckets.add(mapping.bucket(v), 1.0);
    }
    ClosedWindow {
        start,
        stats: vec![("sliced".into(), StatKind::Timer, stats)],
        ..ClosedWindow::default()
    }
}

/// Fifteen one-minute slices read together give the quantiles of all their values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fifteen_one_minute_slices_merge_into_the_quantiles_of_all_their_values() {
    let redis = RedisServer::start();
    let store = redis.store();
    let mut writer = Writer::new(store.clone(), None, Arc::new(Telemetry::new()));
    let settings = ChunkSettings {
        keys: store.keys().clone(),
        retention: statsd_redis::config::Config::default().retention(),
        schemas: statsd_redis::config::Config::default().schemas(),
        log_ttl_secs: 0,
        max_series: 100,
        quantiles: Default::default(),
    };
    let samples = distribution("bimodal", 1500);
    let values: Vec<f64> = samples.iter().map(|s| s.0).collect();
    // Fifteen minutes ending now, one window in each minute.
    let now = unix_now();
    let first_minute = (now / 60 - 14) * 60;
    for (minute, part) in values.chunks(100).enumerate() {
        let window = timer_window(first_minute + 60 * minute as u64 + 7, part);
        let chunks: Vec<_> = build_chunks(&window, &CounterWrite::everywhere(&[60]), &settings)
            .into_iter()
            .enumerate()
            .map(|(i, mut c)| {
                c.seq = (minute * 10 + i + 1) as u64;
                Arc::new(c)
            })
            .collect();
        let written = writer.write_chunks("flush:slices.1", &chunks, &[]).await;
        assert_eq!(written.acknowledged, chunks.len(), "{:?}", written.error);
    }
    let mut reader = store.reader().await.unwrap();
    let view = reader
        .quantiles(
            ("sliced", StatKind::Timer),
            &QS,
            QuantileRange::last(now - first_minute, 60, now),
            (false, None),
        )
        .await
        .unwrap()
        .unwrap();
    assert_eq!(view.slices.len(), 15, "{:?}", view.slices);
    assert_eq!(view.count, 1500.0);
    for (q, got) in view.quantiles {
        assert_within(
            got,
            exact(&samples.iter().map(|s| (s.0, 1.0)).collect::<Vec<_>>(), q),
            0.01,
            &format!("q={q}"),
        );
    }
    // Every slice key expires with its retention: sample_count minutes after its start.
    let key = store
        .keys()
        .hist_slice(60, "sliced", StatKind::Timer, first_minute);
    let expire_at: i64 = redis::cmd("EXPIRETIME")
        .arg(&key)
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(expire_at as u64, first_minute + 120 * 60);
}

/// Buckets of another accuracy under our name are kept, not mixed with ours: that slice's write
/// is refused and counted, the series' other slices and its stats are written.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_foreign_accuracy_is_refused_not_mixed() {
    let redis = RedisServer::start();
    let hour = unix_now() / 3600 * 3600;
    let foreign = format!("hist:3600:foreign:AccessTime:{hour}");
    let _: () = redis::cmd("HSET")
        .arg(&foreign)
        .arg("a")
        .arg("0.05")
        .arg("3")
        .arg("1")
        .query(&mut redis.conn())
        .unwrap();
    let agent = TestAgent::start(test_config(&redis));
    agent.send(
        b"foreign:7|ms
fine:7|ms",
    );
    eventually(Duration::from_secs(3), "the window", || {
        redis.hist_total(&format!("hist:3600:fine:AccessTime:{hour}")) == 1.0
    })
    .await;
    assert_eq!(
        agent.metric("write_failures_total"),
        1.0,
        "the foreign hash"
    );
    let kept: std::collections::BTreeMap<String, String> = redis::cmd("HGETALL")
        .arg(&foreign)
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(kept.len(), 2, "untouched: {kept:?}");
    let minute = unix_now() / 60 * 60;
    let minutes = redis.hist_total(&format!("hist:60:foreign:AccessTime:{minute}"))
        + redis.hist_total(&format!("hist:60:foreign:AccessTime:{}", minute - 60));
    assert_eq!(minutes, 1.0, "the minute's slice is ours");
    let count: f64 = redis::cmd("ZSCORE")
        .arg("stats:foreign:AccessTime")
        .arg("count")
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(count, 1.0);
    agent.stop().await;
}

/// `statsd-redis get percentiles <series> <args>` against `redis`, with the test agent's
/// `quantile_write_secs` (0) and its clock `behind` s behind the machine's (libfaketime); its
/// stdout.
fn get_percentiles(redis: &RedisServer, behind: u64, series: &str, args: &[&str]) -> String {
    let out = with_clock(bin(), &format!("-{behind}s"))
        .args(["--redis", &redis.url(), "--quantile-write-secs", "0"])
        .args(["get", "percentiles", series])
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cli_and_the_api_read_percentiles() {
    // The hour's hash is copied to earlier hours below: all of it within one hour. The agent's
    // clock stands ten minutes into one, and the CLI's runs from there.
    let clock = clock_at(600, 3600);
    let hour = clock.unix_now() / 3600 * 3600;
    let behind = unix_now() - clock.unix_now();
    let cli_now = || unix_now() - behind;
    let redis = RedisServer::start();
    let agent = TestAgent::start_at(
        Config {
            quantile_relative_accuracy: 0.02,
            ..test_config(&redis)
        },
        clock,
    );
    let values: Vec<(f64, f64)> = (1..=100).map(|v| (f64::from(v), 1.0)).collect();
    send_samples(&agent, "page.time", &values);
    // Histograms and distributions, the second sampled at a half (each value counts twice).
    agent.send(b"body.size:100|h\nbody.size:200|h\nbody.size:300|h");
    agent.send(b"queue.wait:4|d|@0.5\nqueue.wait:8|d|@0.5");
    eventually(Duration::from_secs(5), "every line received", || {
        agent.metric("lines_received_total") == 105.0
    })
    .await;
    agent.tick();
    let count = |key: &str| {
        redis::cmd("ZSCORE")
            .arg(key)
            .arg("count")
            .query::<Option<f64>>(&mut redis.conn())
            .unwrap()
    };
    eventually(Duration::from_secs(3), "stats", || {
        count("stats:page.time:AccessTime") == Some(100.0)
            && count("stats:body.size:Histogram") == Some(3.0)
            && count("stats:queue.wait:Distribution").is_some()
    })
    .await;
    let out = get_percentiles(
        &redis,
        behind,
        "page.time",
        &["--quantiles", "0.5,0.99", "--json"],
    );
    let json: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        json["relative_accuracy"], 0.02,
        "the hash says which accuracy: {json}"
    );
    assert_eq!(json["count"], 100.0);
    let p99 = json["quantiles"][1][1].as_f64().unwrap();
    assert_within(p99, 99.0, 0.02, "CLI p99");
    let before = cli_now();
    let text = get_percentiles(&redis, behind, "page.time", &["--last", "5m"]);
    assert!(
        text.contains("within 2% of the exact one") && text.contains("p99"),
        "{text}"
    );
    // With buckets written every window, the minute of the window being written.
    let filling = |t: u64| {
        format!(
            "the slices from {} (UTC) on may still be receiving values",
            statsd_redis::store::clock::datetime((t - 1) / 60 * 60)
        )
    };
    assert!(
        text.contains(&filling(before)) || text.contains(&filling(cli_now())),
        "the minute still filling is named: {text}"
    );

    // `--type` by the book's name and by the protocol's; the buckets of `h` and `d` values.
    let sizes = get_percentiles(
        &redis,
        behind,
        "body.size",
        &["--type", "Histogram", "--quantiles", "0.5", "--json"],
    );
    let sizes: serde_json::Value = serde_json::from_str(&sizes).unwrap();
    assert_eq!(sizes["count"], 3.0);
    assert_within(
        sizes["quantiles"][0][1].as_f64().unwrap(),
        200.0,
        0.02,
        "h p50",
    );
    let waits = get_percentiles(&redis, behind, "queue.wait", &["--type", "d", "--json"]);
    let waits: serde_json::Value = serde_json::from_str(&waits).unwrap();
    assert_eq!(waits["count"], 4.0, "each value counted 1 / rate times");
    let timer_only = bin()
        .args(["--redis", &redis.url(), "get", "percentiles", "body.size"])
        .output()
        .unwrap();
    assert_eq!(
        timer_only.status.code(),
        Some(1),
        "body.size has no timer values"
    );

    // `--hour last` and `--hour YYYY-MM-DDTHH` read the 3600 s slice of that hour: the current
    // hour's hash copied to the one before and to one two days ago.
    let current = format!("hist:3600:page.time:AccessTime:{hour}");
    for earlier in [hour - 3600, hour - 48 * 3600] {
        redis::cmd("COPY")
            .arg(&current)
            .arg(format!("hist:3600:page.time:AccessTime:{earlier}"))
            .query::<i64>(&mut redis.conn())
            .unwrap();
    }
    let last = get_percentiles(&redis, behind, "page.time", &["--hour", "last"]);
    let name = statsd_redis::store::clock::hour_start(hour - 3600);
    assert!(
        last.contains(&format!("100 values over the hour {name}")),
        "{last}"
    );
    let day_before = &statsd_redis::store::clock::hour_start(hour - 48 * 3600)[..13];
    let old = get_percentiles(
        &redis,
        behind,
        "page.time",
        &["--hour", day_before, "--json"],
    );
    let old: serde_json::Value = serde_json::from_str(&old).unwrap();
    assert_eq!(old["slices"], serde_json::json!([hour - 48 * 3600]));
    assert_within(
        old["quantiles"][2][1].as_f64().unwrap(),
        99.0,
        0.02,
        "old p99",
    );

    let (status, body) = http_get(
        agent.http,
        "/api/v1/percentiles/page.time?quantiles=0.5&last=15m",
    );
    assert_eq!(status, 200, "{body}");
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_within(
        json["quantiles"][0]["value"].as_f64().unwrap(),
        50.0,
        0.02,
        "API p50",
    );
    assert_eq!(json["precision"], 60);
    let before = agent.clock.unix_now();
    let (_, body) = http_get(
        agent.http,
        "/api/v1/percentiles/page.time?quantiles=0.5&last=5m&by_slice=true",
    );
    let json: serde_json::Value = serde_json::from_str(&body).unwrap();
    let arriving = json["arriving_from"].as_u64().unwrap();
    assert!(
        [before, agent.clock.unix_now()]
            .map(|t| (t - 1) / 60 * 60)
            .contains(&arriving),
        "the minute of the window being written: {body}"
    );
    let per_minute: f64 = json["by_slice"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["count"].as_f64().unwrap())
        .sum();
    assert_eq!(per_minute, 100.0, "{body}");
    let (_, body) = http_get(agent.http, "/api/v1/series?type=timer&match=page");
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&body).unwrap()["series"],
        serde_json::json!(["page.time"])
    );
    let (status, _) = http_get(agent.http, "/api/v1/percentiles/page.time?quantiles=2");
    assert_eq!(status, 400);
    let (status, body) = http_get(agent.http, "/api/v1/percentiles/page.time?last=365d");
    assert_eq!(status, 400, "a year of slices is refused, not read: {body}");
    assert!(body.contains("slices"), "{body}");
    let (status, _) = http_get(agent.http, "/api/v1/percentiles/nothing.here");
    assert_eq!(status, 404);
    agent.stop().await;
}

/// Past 2048 buckets a hash folds those nearest zero on its larger side, as the agent does:
/// nothing is lost, the extremes and the signs stay, and fields someone else put in the hash
/// are left alone (they used to fail the script half-way).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hash_past_its_bound_collapses_next_to_zero() {
    let redis = RedisServer::start();
    let hour = unix_now() / 3600 * 3600;
    let key = format!("hist:3600:wide:AccessTime:{hour}");
    let mut hset = redis::cmd("HSET");
    hset.arg(&key).arg("a").arg("0.01");
    hset.arg("note")
        .arg("by hand")
        .arg("nx")
        .arg("1")
        .arg("-5000")
        .arg("many");
    for i in 0..2000 {
        hset.arg(format!("n{i}")).arg(1);
    }
    let _: () = hset.query(&mut redis.conn()).unwrap();
    let agent = TestAgent::start(test_config(&redis));
    let lines: Vec<String> = (0..1000)
        .map(|i| format!("wide:{:.9}|ms", 1.0205f64.powi(i)))
        .collect();
    for chunk in lines.chunks(50) {
        agent.send(chunk.join("\n").as_bytes());
    }
    eventually(Duration::from_secs(3), "the window", || {
        redis.hist_total(&key) == 3000.0
    })
    .await;
    let fields: std::collections::BTreeMap<String, f64> = redis::cmd("HGETALL")
        .arg(&key)
        .query::<std::collections::BTreeMap<String, String>>(&mut redis.conn())
        .unwrap()
        .into_iter()
        .filter_map(|(f, c)| Some((f, c.parse().ok()?)))
        .filter(|(f, _)| f != "a" && f != "nx")
        .collect();
    assert_eq!(fields.len(), 2048);
    let foreign: Vec<Option<String>> = redis::cmd("HMGET")
        .arg(&key)
        .arg(&["note", "nx", "-5000"])
        .query(&mut redis.conn())
        .unwrap();
    assert_eq!(
        foreign,
        [
            Some("by hand".into()),
            Some("1".into()),
            Some("many".into())
        ]
    );
    assert_eq!(
        fields.get("n952"),
        Some(&953.0),
        "n0..n951 folded into n952"
    );
    assert!(!fields.contains_key("n951") && fields.contains_key("n1999"));
    let mut reader = redis.store().reader().await.unwrap();
    let view = reader
        .quantiles(
            ("wide", StatKind::Timer),
            &[0.0, 1.0],
            QuantileRange::hour(unix_now()),
            (false, None),
        )
        .await
        .unwrap()
        .unwrap();
    let mapping = Mapping::default();
    assert_eq!(
        view.quantiles[0].1,
        mapping.value(statsd_redis::aggregate::Bucket::Negative(1999))
    );
    assert_within(view.quantiles[1].1, 1.0205f64.powi(999), 0.01, "p100");
    agent.stop().await;
}
