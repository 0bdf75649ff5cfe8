//! Writes windows of counter (or timer) series through the agent's own writer, as one server or
//! as a Redis Cluster takes them (one script call per chunk of series, or per slot chunk and the
//! follow-ups), without the UDP side: `scripts/cluster-cost.sh` runs it against a standalone
//! Redis and a cluster and divides each one's CPU by its `HINCRBY` calls;
//! `scripts/quantile-cost.sh` writes timers with and without their quantile buckets.
//!
//! cargo run --release --example flush_cost -- --redis URL [--cluster] [--series N] [--windows N] [--start SECS]
//!     [--step SECS] [--bare] [--warmup N [--masters URL,URL...]] [--timers --samples N [--no-buckets | --buckets-only] [--quantile-precisions 60,3600] | --gauges | --sets M]
//!
//! With `--timers` each series is a timer with `--samples` values a window, spread like latencies
//! (log-normal, median 100 ms), into the hourly stats and the quantile buckets (none with
//! `--no-buckets`: the script then writes the stats alone, as before buckets existed; with
//! `--buckets-only` the buckets alone, as `quantile_write_secs` writes a period's sums).
//! `--gauges` writes gauges instead, `--sets M` sets of M members a window each.
//! `--step` is the time between windows (default 1 s; 60 writes each minute's slice anew).
//! `--start` is the first window's start (default: now); a second run that goes on where a first
//! one stopped writes into the hashes the first one made, as an agent does all day.
//! `--bare` sends the counters' book commands bare instead, as the floor the writer is measured
//! against: per chunk of 1000 series one pipeline of the seven `HINCRBY`s of each and one `ZADD`
//! of their 1 s `known:` members, no guard (`scripts/write-cost.sh`).
//! `--warmup N` writes N windows first, unmeasured, in the same run (they create the keys), then
//! prints the server's CPU over the measured windows and its `HINCRBY` calls (from `INFO`, asked
//! of the node `--redis` names, or summed over every node `--masters` names: a cluster's masters).

use std::sync::Arc;
use std::time::Instant;

use statsd_redis::aggregate::{ClosedWindow, Mapping, StatKind, Stats};
use statsd_redis::config::{Config, DEFAULT_PRECISIONS, RedisMode};
use statsd_redis::store::{
    ChunkSettings, CounterWrite, FollowUps, Store, Writer, build_chunks, build_slot_chunks,
};
use statsd_redis::telemetry::Telemetry;

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let mut args = std::env::args().skip(1);
    let (mut redis, mut cluster, mut series, mut windows) = (String::new(), false, 20_000, 10);
    let (mut timers, mut samples, mut buckets, mut stats_too, mut step) =
        (false, 20, true, true, 1);
    let mut warmup = 0;
    let mut bare = false;
    let (mut gauges, mut set_members) = (false, 0);
    let mut masters: Vec<String> = Vec::new();
    let mut quantile_precisions = Config::default().quantile_precisions;
    let mut start = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    while let Some(arg) = args.next() {
        let mut value = || args.next().expect("a value after the flag");
        match arg.as_str() {
            "--redis" => redis = value(),
            "--cluster" => cluster = true,
            "--series" => series = value().parse().expect("--series N"),
            "--windows" => windows = value().parse().expect("--windows N"),
            "--start" => start = value().parse().expect("--start SECS"),
            "--timers" => timers = true,
            "--samples" => samples = value().parse().expect("--samples N"),
            "--no-buckets" => buckets = false,
            "--buckets-only" => stats_too = false,
            "--step" => step = value().parse().expect("--step SECS"),
            "--bare" => bare = true,
            "--gauges" => gauges = true,
            "--sets" => set_members = value().parse().expect("--sets M"),
            "--warmup" => warmup = value().parse().expect("--warmup N"),
            "--masters" => masters = value().split(',').map(String::from).collect(),
            "--quantile-precisions" => {
                quantile_precisions = value()
                    .split(',')
                    .filter(|p| !p.is_empty())
                    .map(|p| p.parse().expect("--quantile-precisions LIST"))
                    .collect()
            }
            other => panic!("unknown argument {other}"),
        }
    }
    if masters.is_empty() {
        masters.push(redis.clone());
    }
    let config = Config {
        redis_cluster_nodes: if cluster { vec![redis.clone()] } else { vec![] },
        redis,
        redis_mode: if cluster {
            RedisMode::Cluster
        } else {
            RedisMode::Standalone
        },
        ..Config::default()
    };
    let store = Store::open(&config).expect("redis settings");
    let settings = ChunkSettings {
        keys: store.keys().clone(),
        retention: config.retention(),
        schemas: config.schemas(),
        log_ttl_secs: 0,
        max_series: config.max_series_per_chunk,
        quantiles: statsd_redis::store::QuantileSettings {
            precisions: quantile_precisions,
            ..Default::default()
        },
    };
    let mapping = Mapping::default();
    let mut rng = 0x9E37_79B9_7F4A_7C15u64;
    let mut normal = move || {
        let mut unit = || {
            rng ^= rng >> 12;
            rng ^= rng << 25;
            rng ^= rng >> 27;
            ((rng.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 11) as f64 + 0.5) / (1u64 << 53) as f64
        };
        (-2.0 * unit().ln()).sqrt() * (std::f64::consts::TAU * unit()).cos()
    };
    let precisions = CounterWrite::everywhere(&DEFAULT_PRECISIONS);
    let mut writer = Writer::new(store, None, Arc::new(Telemetry::new()));
    let sequence = format!(
        "flush:cost.{:08x}{}",
        rand::random::<u32>(),
        if cluster { ":" } else { "" }
    );
    let mut seqs = std::collections::HashMap::<u16, u64>::new();
    let mut last = 0;
    let mut seconds = 0.0;
    let mut before = None;
    for w in 0..warmup + windows {
        if w == warmup && warmup > 0 {
            before = Some(server_usage(&masters).await);
        }
        let window = if timers {
            let stats = (0..series)
                .map(|i| {
                    let mut s = Stats::new();
                    for _ in 0..samples {
                        let v = (100.0 * (0.5 * normal()).exp()).round();
                        s.count += 1.0;
                        s.sum += v;
                        s.sumsq += v * v;
                        s.min = s.min.min(v);
                        s.max = s.max.max(v);
                        if buckets {
                            s.buckets.add(mapping.bucket(v), 1.0);
                        }
                    }
                    if !stats_too {
                        (s.count, s.sum, s.sumsq, s.min, s.max) = (0.0, 0.0, 0.0, 0.0, 0.0);
                    }
                    (format!("ht.{i}").into(), StatKind::Timer, s)
                })
                .collect();
            ClosedWindow {
                start: start + w * step,
                stats,
                ..ClosedWindow::default()
            }
        } else if gauges {
            ClosedWindow {
                start: start + w * step,
                gauges: (0..series)
                    .map(|i| (format!("hg.{i}").into(), (w + i) as f64))
                    .collect(),
                ..ClosedWindow::default()
            }
        } else if set_members > 0 {
            ClosedWindow {
                start: start + w * step,
                sets: (0..series)
                    .map(|i| {
                        let members = (0..set_members)
                            .map(|m| format!("{}", (w * 7 + m) % 1000).into_bytes().into())
                            .collect();
                        (format!("hs.{i}").into(), members)
                    })
                    .collect(),
                ..ClosedWindow::default()
            }
        } else {
            ClosedWindow {
                start: start + w * step,
                counters: (0..series).map(|i| (format!("hc.{i}").into(), 3)).collect(),
                ..ClosedWindow::default()
            }
        };
        let began = Instant::now();
        if bare {
            write_bare(&config.redis, &window).await;
        } else if cluster {
            let chunks: Vec<_> = build_slot_chunks(&window, &precisions, &settings)
                .into_iter()
                .map(|mut c| {
                    let seq = seqs.entry(c.slot()).or_default();
                    *seq += 1;
                    c.seq = *seq;
                    Arc::new(c)
                })
                .collect();
            let mut follow_ups = FollowUps::default();
            let written = writer
                .write_slots(&sequence, &chunks, &[], &mut follow_ups)
                .await;
            assert!(written.error.is_none(), "{:?}", written.error);
            writer
                .write_follow_ups(&follow_ups)
                .await
                .expect("follow-ups");
        } else {
            let chunks: Vec<_> = build_chunks(&window, &precisions, &settings)
                .into_iter()
                .map(|mut c| {
                    last += 1;
                    c.seq = last;
                    Arc::new(c)
                })
                .collect();
            for pipeline in chunks.chunks(4) {
                let written = writer.write_chunks(&sequence, pipeline, &[]).await;
                assert!(written.error.is_none(), "{:?}", written.error);
            }
        }
        if w >= warmup {
            seconds += began.elapsed().as_secs_f64();
        }
    }
    println!(
        "{windows} windows of {series} {} series: {:.3} s per window",
        if timers {
            "timer"
        } else if gauges {
            "gauge"
        } else if set_members > 0 {
            "set"
        } else {
            "counter"
        },
        seconds / windows as f64
    );
    if let Some((cpu0, calls0)) = before {
        let (cpu1, calls1) = server_usage(&masters).await;
        let (cpu, calls) = (cpu1 - cpu0, calls1 - calls0);
        println!(
            "Redis CPU {cpu:.2} s, {:.2} us per series and window, HINCRBY {calls}, {:.2} us per HINCRBY",
            cpu / (windows * series) as f64 * 1e6,
            cpu / calls.max(1) as f64 * 1e6
        );
    }
}

/// The counters of `window` as bare commands at the default precisions: the seven `HINCRBY`s
/// of each series and its 1 s `known:` member, 1000 series a pipeline.
async fn write_bare(url: &str, window: &ClosedWindow) {
    let client = redis::Client::open(url).expect("the URL");
    let mut conn = client
        .get_multiplexed_async_connection()
        .await
        .expect("a connection");
    for chunk in window.counters.chunks(1000) {
        let mut pipe = redis::pipe();
        let mut zadd = redis::cmd("ZADD");
        zadd.arg("known:");
        for (series, n) in chunk {
            for p in DEFAULT_PRECISIONS {
                pipe.cmd("HINCRBY")
                    .arg(format!("count:{p}:{series}"))
                    .arg(window.start / p * p)
                    .arg(*n)
                    .ignore();
            }
            zadd.arg(0).arg(format!("1:{series}"));
        }
        pipe.add_command(zadd).ignore();
        let () = pipe.query_async(&mut conn).await.expect("bare commands");
    }
}

/// The servers' CPU time so far (user and system, s) and their `HINCRBY` calls, summed.
async fn server_usage(urls: &[String]) -> (f64, u64) {
    let (mut cpu, mut calls) = (0.0, 0);
    for url in urls {
        let client = redis::Client::open(url.as_str()).expect("a node's URL");
        let mut conn = client
            .get_multiplexed_async_connection()
            .await
            .expect("a connection for INFO");
        let info: String = redis::cmd("INFO")
            .arg("cpu")
            .arg("commandstats")
            .query_async(&mut conn)
            .await
            .expect("INFO");
        let field = |line: &str, name: &str| {
            line.strip_prefix(name)
                .map(|v| v.split(',').next().unwrap_or("").to_string())
        };
        for line in info.lines() {
            for name in ["used_cpu_user:", "used_cpu_sys:"] {
                if let Some(v) = field(line, name) {
                    cpu += v.trim().parse::<f64>().unwrap_or(0.0);
                }
            }
            if let Some(v) = field(line, "cmdstat_hincrby:calls=") {
                calls += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    (cpu, calls)
}
