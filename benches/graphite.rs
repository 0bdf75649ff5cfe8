//! The Graphite API's pieces (docs/benchmarks.md, "Graphite API"): reading an `HMGET` reply of
//! a day of minutes (the bulk reader's parse beside the redis crate's), writing a series' JSON
//! as graphite-web writes it (and a render's body of 100 such series, and of 100 series of a
//! year of days), Python's float repr,
//! consolidating for `maxDataPoints`, `sumSeries` of 100 series, and a block of a timer's
//! packed quantile minutes decoded (and each minute's p99, as a render of `….p99` reads it).
//!
//!     cargo bench --bench graphite

use std::hint::black_box;

use criterion::{Criterion, criterion_group, criterion_main};
use statsd_redis::aggregate::sketch::{Buckets, Mapping};
use statsd_redis::graphite::functions::{self, Ctx, State};
use statsd_redis::graphite::series::{Series, fit};
use statsd_redis::graphite::{Arg, pyfmt, render_json};
use statsd_redis::store::bulk::numbers_in;
use statsd_redis::store::quantile_blocks;

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

/// A block of 64 minutes of a timer, 60 latencies a minute (lognormal around 100 ms, as
/// scripts/hist-bytes.sh makes them) at 1 % accuracy: about 44 buckets a minute.
fn quantile_block() -> Vec<u8> {
    let mapping = Mapping::new(0.01);
    let mut state = 52u64;
    let mut uniform = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        (state >> 11) as f64 / (1u64 << 53) as f64
    };
    let mut block = quantile_blocks::header("0.01");
    for slot in 0..64u8 {
        let mut buckets = Buckets::default();
        for _ in 0..60 {
            let normal = (-2.0 * (1.0 - uniform()).ln()).sqrt()
                * (2.0 * std::f64::consts::PI * uniform()).cos();
            buckets.add(mapping.bucket((100f64.ln() + 0.5 * normal).exp()), 1.0);
        }
        block.extend(quantile_blocks::record(slot, [0, 0, 0, slot], &buckets));
    }
    block
}

/// A function's context with no range (the functions benched here read none).
fn ctx(state: &mut State) -> Ctx<'_> {
    Ctx {
        from: 0,
        until: 0,
        now: 0,
        state,
    }
}

fn bench(c: &mut Criterion) {
    let block = quantile_block();
    c.bench_function("a block of 64 quantile minutes decoded", |b| {
        b.iter(|| quantile_blocks::decode(black_box(&block)))
    });
    c.bench_function(
        "a block of 64 quantile minutes read into one buffer, each minute's p99 (a render's way)",
        |b| {
            let mut read = Buckets::default();
            b.iter(|| {
                let (alpha, records) =
                    quantile_blocks::records(black_box(&block)).expect("a block");
                let mapping = Mapping::new(alpha);
                records
                    .iter()
                    .map(|r| {
                        r.buckets(&mut read)?;
                        read.quantile(&mapping, 0.99)
                    })
                    .collect::<Vec<_>>()
            })
        },
    );
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
        b.iter(|| render_json(vec![one.clone()], None, false))
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
    // A render's whole body, its pieces' bytes counted.
    let body = |data: &[Series]| {
        render_json(data.to_vec(), None, false)
            .iter()
            .map(|piece| piece.len())
            .sum::<usize>()
    };
    c.bench_function("JSON of 100 series x 1441 points (a render's body)", |b| {
        b.iter(|| body(&hundred))
    });
    // A year of days of 100 counters: seven digits a value.
    let days: Vec<Series> = (0..100)
        .map(|i| {
            let values = (0..366)
                .map(|d| Some((86_400 + (i * 7_919 + d * 104_729) % 4_000_000) as f64))
                .collect();
            Series::new(
                &format!("app0.day{i}"),
                1_760_000_000,
                1_760_000_000 + 86_400 * 366,
                86_400,
                values,
            )
        })
        .collect();
    c.bench_function("JSON of 100 series x 366 days (7-digit counts)", |b| {
        b.iter(|| body(&days))
    });
    c.bench_function("sumSeries of 100 series x 1441 points", |b| {
        b.iter(|| {
            let mut state = State::default();
            functions::aggregate(hundred.clone(), "sum", None, &ctx(&mut state))
        })
    });
    // The moving average of bench-graphite.sh's `moving10`, its series as the window's read
    // gives them.
    let ten: Vec<Series> = (0..10).map(|i| series(&format!("s{i}"))).collect();
    let moving = functions::find("movingAverage").expect("declared");
    let functions::Body::Shaped(_, finish) = moving.body else {
        unreachable!("movingAverage reads its window again")
    };
    c.bench_function("movingAverage(10) of 10 series x 1441 points", |b| {
        b.iter(|| {
            let args = vec![Arg::Series(ten.clone()), Arg::Int(10)];
            let mut bound = functions::bind(moving, "movingAverage", args, Vec::new()).unwrap();
            let mut state = State::default();
            finish(&mut bound, &mut ctx(&mut state), vec![ten.clone()]).unwrap()
        })
    });
}

criterion_group!(benches, bench);
criterion_main!(benches);
