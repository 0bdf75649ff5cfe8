//! The Graphite API's pieces (docs/benchmarks.md, "Graphite API"): reading an `HMGET` reply of
//! a day of minutes (the bulk reader's parse beside the redis crate's), writing a series' JSON
//! as graphite-web writes it (and a render's body of 100 such series), Python's float repr,
//! consolidating for `maxDataPoints`, and `sumSeries` of 100 series.
//!
//!     cargo bench --bench graphite

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use statsd_redis::graphite::functions::{self, Ctx, State};
use statsd_redis::graphite::series::{Series, fit};
use statsd_redis::graphite::{pyfmt, render_json};
use statsd_redis::store::bulk::numbers_in;

const POINTS: usize = 1441;

/// A day of minutes, counts and every 29th missing.
fn counts() -> Vec<Option<f64>> {
    (0..POINTS)
        .map(|i| (i % 29 != 0).then_some((1 + (i * 7) % 97) as f64))
        .collect()
}

/// The `HMGET` reply Redis sends for [`counts`].
fn reply() -> Vec<u8> {
    let mut out = format!("*{POINTS}\r\n").into_bytes();
    for v in counts() {
        match v {
            Some(v) => {
                let text = (v as i64).to_string();
                out.extend(format!("${}\r\n{text}\r\n", text.len()).bytes());
            }
            None => out.extend(b"$-1\r\n"),
        }
    }
    out
}

fn series(name: &str) -> Series {
    Series::new(
        name,
        1_760_000_000,
        1_760_000_000 + 60 * POINTS as i64,
        60,
        counts(),
    )
}

fn bench(c: &mut Criterion) {
    let reply = reply();
    c.bench_function("reply of 1441 values: the bulk reader", |b| {
        b.iter(|| numbers_in(black_box(&reply)))
    });
    c.bench_function("reply of 1441 values: the redis crate, then numbers", |b| {
        b.iter(|| {
            let v = redis::parse_redis_value(black_box(&reply)).expect("a reply");
            let redis::Value::Array(items) = v else {
                panic!("an array")
            };
            items
                .iter()
                .map(|i| match i {
                    redis::Value::BulkString(b) => statsd_redis::store::bulk::number(b),
                    _ => None,
                })
                .collect::<Vec<_>>()
        })
    });
    let one = series("app0.host1.metric1");
    c.bench_function("JSON of a series of 1441 points", |b| {
        b.iter(|| render_json(vec![one.clone()], None, false).collect::<Vec<_>>())
    });
    c.bench_function("repr of 1441 floats (thirds)", |b| {
        b.iter(|| {
            let mut out = String::new();
            for i in 0..POINTS {
                pyfmt::repr(black_box(i as f64 / 3.0), &mut out);
            }
            out
        })
    });
    c.bench_function(
        "repr of 1441 floats (tenths: a moving average of counts)",
        |b| {
            b.iter(|| {
                let mut out = String::new();
                for i in 0..POINTS {
                    pyfmt::repr(black_box(i as f64 / 10.0), &mut out);
                }
                out
            })
        },
    );
    c.bench_function("maxDataPoints=100 of 1441 points", |b| {
        b.iter(|| {
            let mut s = one.clone();
            fit(&mut s, 100, 60 * POINTS as i64);
            s.points().into_owned()
        })
    });
    let hundred: Vec<Series> = (0..100)
        .map(|i| series(&format!("app0.host1.metric{i}")))
        .collect();
    c.bench_function("JSON of 100 series x 1441 points (a render's body)", |b| {
        b.iter(|| {
            render_json(hundred.clone(), None, false)
                .map(|piece| piece.len())
                .sum::<usize>()
        })
    });
    c.bench_function("sumSeries of 100 series x 1441 points", |b| {
        b.iter(|| {
            let mut state = State::default();
            let ctx = Ctx {
                from: 0,
                until: 0,
                now: 0,
                state: &mut state,
            };
            functions::aggregate(hundred.clone(), "sum", None, &ctx)
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
