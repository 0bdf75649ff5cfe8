//! How fast the JSON API answers, over real HTTP, from a live agent reading a private Redis:
//! every query for a counter with 120 samples, and the known-series search over 10 000 series.
//!
//!     cargo bench --bench api

#[path = "../tests/common/mod.rs"]
mod common;

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
    let agent = TestAgent::start(test_config(&redis));
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
            assert!(body.contains("\"total\":10,"), "ten series match: {body}");
        }
        group.bench_function(name, |b| b.iter(|| http_get(agent.http, path)));
    }
    group.finish();
    agent.shutdown.cancel();
}

criterion_group!(benches, api);
criterion_main!(benches);
