//! The per-line path on one core, without sockets: parse (StatsD's lines and carbon's), the
//! reader's path for one line and for a whole datagram, the quantile bucket of a sample, a
//! mapping file's rules; plus building the flush chunks of a closed window and spooling them;
//! the cost of `prometheus_app_metrics` per line (on against off) and per series at each close.
//!
//!     cargo bench --bench pipeline

use std::hint::black_box;
use std::sync::Arc;

use criterion::{Criterion, Throughput, criterion_group, criterion_main};
use statsd_redis::aggregate::{Buckets, ClosedWindow, Ledger, Mapping, Window};
use statsd_redis::ingest::LineHandler;
use statsd_redis::ingest::mapping::Mapper;
use statsd_redis::prometheus::{AppSeries, Cursor};
use statsd_redis::protocol::{MetricType, carbon, parse_line, parse_plain};
use statsd_redis::spool::Spool;
use statsd_redis::store::{ChunkSettings, CounterWrite, Keys, build_chunks};

const LINES: [&[u8]; 4] = [
    b"web.checkout.requests:1|c",
    b"api.latency:12.5|ms|@0.5",
    b"web.requests:1|c|#env:prod,region:eu",
    b"queue.depth:+3|g",
];

/// A 20-line datagram over 1000 series, like the load generator's.
fn datagram(offset: usize) -> Vec<u8> {
    let mut d = Vec::new();
    for i in 0..20 {
        if i > 0 {
            d.push(b'\n');
        }
        d.extend_from_slice(format!("load.{}.c:1|c", (offset + i) % 1000).as_bytes());
    }
    d
}

fn parse(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse");
    g.throughput(Throughput::Elements(1));
    for (name, line) in ["counter", "sampled_timer", "tagged_counter", "gauge_delta"]
        .iter()
        .zip(LINES)
    {
        g.bench_function(*name, |b| b.iter(|| parse_line(black_box(line))));
    }
    g.bench_function("plain_counter", |b| {
        b.iter(|| parse_plain(black_box(LINES[0])))
    });
    // Carbon's plaintext lines, as collectd and carbon-relay send them.
    for (name, line) in [
        (
            "carbon_line",
            &b"collectd.host42.cpu-0.cpu-idle 97.5 1764500000"[..],
        ),
        (
            "carbon_tagged_line",
            b"disk.used;host=a;env=prod 1234 1764500000",
        ),
    ] {
        g.bench_function(name, |b| b.iter(|| carbon::parse_line(black_box(line))));
    }
    g.finish();
}

/// A reader's whole per-line path for one-line datagrams: split, parse (the plain fast path
/// where it applies), name, record, tally.
fn parse_and_record(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse_and_record");
    g.throughput(Throughput::Elements(1));
    for (name, line) in ["counter", "sampled_timer", "tagged_counter", "gauge_delta"]
        .iter()
        .zip(LINES)
    {
        let mut handler = LineHandler::new(true, usize::MAX);
        let mut window = Window::default();
        g.bench_function(*name, |b| {
            b.iter(|| handler.handle_datagram(black_box(line), false, &mut window))
        });
    }
    g.finish();
}

/// What a timer sample costs the agent for its quantiles: its bucket (a logarithm) and the count
/// added to the series' buckets (a binary search in ~20 of them).
fn buckets(c: &mut Criterion) {
    let mut g = c.benchmark_group("buckets");
    g.throughput(Throughput::Elements(1));
    let mapping = Mapping::default();
    let values: Vec<f64> = (0..1024).map(|i| 80.0 + f64::from(i % 40)).collect();
    let mut buckets = Buckets::default();
    let mut i = 0;
    g.bench_function("add_one_sample", |b| {
        b.iter(|| {
            i = (i + 1) % values.len();
            buckets.add(mapping.bucket(black_box(values[i])), 1.0)
        })
    });
    g.finish();
}

fn datagrams(c: &mut Criterion) {
    let mut g = c.benchmark_group("datagram");
    let batch: Vec<Vec<u8>> = (0..50).map(|i| datagram(i * 20)).collect();
    g.throughput(Throughput::Elements(20 * batch.len() as u64));
    let mut handler = LineHandler::new(true, usize::MAX);
    let mut window = Window::default();
    g.bench_function("20_lines_1000_series_known", |b| {
        b.iter(|| {
            for d in &batch {
                handler.handle_datagram(black_box(d), false, &mut window);
            }
        })
    });
    g.finish();
}

fn chunks(c: &mut Criterion) {
    let mut window = Window::default();
    let mut handler = LineHandler::new(true, usize::MAX);
    for i in 0..50 {
        handler.handle_datagram(&datagram(i * 20), false, &mut window);
    }
    let closed: ClosedWindow = Ledger::default().close(1_795_320_000, window);
    let settings = ChunkSettings {
        keys: Keys::new(""),
        retention: statsd_redis::retention::Retention::book(
            &[1, 5, 60, 300, 3600, 18000, 86400],
            120,
        ),
        schemas: statsd_redis::config::Config::default().schemas(),
        log_ttl_secs: 0,
        max_series: 100,
        quantiles: Default::default(),
    };
    let mut g = c.benchmark_group("flush");
    g.throughput(Throughput::Elements(closed.counters.len() as u64));
    g.bench_function("build_chunks_1000_counters", |b| {
        b.iter(|| {
            build_chunks(
                black_box(&closed),
                &CounterWrite::everywhere(&[1, 5, 60, 300, 3600, 18000, 86400]),
                &settings,
            )
        })
    });
    // Under storage_schemas, each series written at its own schema's precisions: the window's
    // series matched and grouped before the chunks are made (Debian's storage-schemas.conf,
    // whose `[carbon]` section keeps fewer precisions than its default one).
    let debian = statsd_redis::storage_conf::Schemas::parse(
        "[carbon]\npattern = ^carbon\\.\nretentions = 60:90d\n\
         [default_1min_for_1day]\npattern = .*\nretentions = 60s:1d,5m:30d,1h:3y\n",
    )
    .unwrap();
    for (name, schemas) in [("one_schema", None), ("debian_schemas", Some(debian))] {
        let config = statsd_redis::config::Config {
            // The default section's, for every series, beside the file itself.
            retentions: if schemas.is_none() {
                "60s:1d,5m:30d,1h:3y".into()
            } else {
                String::new()
            },
            schemas: schemas.map(statsd_redis::storage_conf::SharedSchemas::new),
            max_series_per_chunk: 100,
            ..Default::default()
        };
        let chunker = statsd_redis::store::Chunker::new(Keys::new(""), &config);
        let every = CounterWrite::everywhere(&config.counter_precisions());
        g.bench_function(format!("chunker_1000_counters_{name}"), |b| {
            b.iter(|| chunker.chunks(black_box(&closed), &every))
        });
    }
    // What spool_dir costs the closer per window: the window's file written (and removed, as
    // the writer does once Redis has it), without and with fsync, in the target directory's
    // file system.
    let chunks: Vec<_> = build_chunks(
        &closed,
        &CounterWrite::everywhere(&[1, 5, 60, 300, 3600, 18000, 86400]),
        &settings,
    )
    .into_iter()
    .map(Arc::new)
    .collect();
    for fsync in [false, true] {
        let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
        let spool = Spool::open(dir.path(), fsync).unwrap();
        let name = if fsync {
            "spool_1000_counters_fsync"
        } else {
            "spool_1000_counters"
        };
        g.bench_function(name, |b| {
            b.iter(|| {
                let path = spool.write(1_795_320_000, 1, "flush:a.1", &chunks).unwrap();
                spool.remove(&path);
            })
        });
    }
    g.finish();
}

/// statsd_exporter's mapping rules for one name, matched by the first rule or by none, among 1
/// and among 1000 glob rules (the trie keeps them about alike) and 100 regex rules (tried in
/// turn after the globs, as statsd_exporter does).
fn mapping(c: &mut Criterion) {
    let mut g = c.benchmark_group("mapping");
    g.throughput(Throughput::Elements(1));
    let glob = |i: usize| {
        format!(
            "- match: app{i}.*.requests.*\n  name: requests_{i}\n  labels:\n    host: $1\n    code: $2\n"
        )
    };
    let regex = |i: usize| {
        format!(
            "- match: ^svc{i}\\.(.*)\\.latency$\n  match_type: regex\n  name: latency_{i}\n  labels:\n    host: $1\n"
        )
    };
    let files = [
        (
            "1_glob",
            (0..1).map(glob).collect::<String>(),
            "app0.web01.requests.200",
        ),
        (
            "1000_globs",
            (0..1000).map(glob).collect(),
            "app0.web01.requests.200",
        ),
        (
            "100_regexes",
            (0..100).map(regex).collect(),
            "svc0.web01.latency",
        ),
    ];
    for (name, rules, matched) in files {
        let mapper = Mapper::from_yaml(&format!("mappings:\n{rules}")).unwrap();
        g.bench_function(format!("{name}_matched"), |b| {
            b.iter(|| mapper.map(black_box(matched), MetricType::Counter))
        });
        g.bench_function(format!("{name}_unmatched"), |b| {
            b.iter(|| mapper.map(black_box("other.web01.requests.200"), MetricType::Counter))
        });
    }
    g.finish();
}

/// `prometheus_app_metrics`: the reader's path for one line with the key off and on (on, a
/// timer's value is also kept for the page; counters and gauges cost nothing more), each
/// window taken every 10 000 lines as the closer would; and the closer's cost of feeding the
/// page a window of 1000 counters and 1000 timers.
fn app_metrics(c: &mut Criterion) {
    let mut g = c.benchmark_group("app_metrics");
    g.throughput(Throughput::Elements(1));
    for (name, line) in ["counter", "sampled_timer", "tagged_counter", "gauge_delta"]
        .iter()
        .zip(LINES)
    {
        for observe in [false, true] {
            let mut handler = LineHandler::new(true, usize::MAX);
            let mut window = Window {
                observe,
                ..Window::default()
            };
            let mut n = 0u32;
            let key = if observe { "on" } else { "off" };
            g.bench_function(format!("{name}_{key}"), |b| {
                b.iter(|| {
                    handler.handle_datagram(black_box(line), false, &mut window);
                    n += 1;
                    if n == 10_000 {
                        n = 0;
                        black_box(window.take());
                    }
                })
            });
        }
    }
    let window = || {
        let mut window = Window {
            observe: true,
            ..Window::default()
        };
        let mut handler = LineHandler::new(true, usize::MAX);
        for i in 0..1000 {
            let d = format!("app.{i}.hits:1|c\napp.{i}.latency:{}|ms", i % 300);
            handler.handle_datagram(d.as_bytes(), false, &mut window);
        }
        window
    };
    let app = AppSeries::new(Arc::default(), Mapping::default(), usize::MAX);
    let mut start = 0;
    g.throughput(Throughput::Elements(2000));
    g.bench_function("absorb_1000_counters_1000_timers", |b| {
        b.iter_batched(
            window,
            |w| {
                start += 1;
                app.absorb(start, &w)
            },
            criterion::BatchSize::LargeInput,
        )
    });
    g.throughput(Throughput::Elements(2000));
    g.bench_function("render_1000_counters_1000_summaries", |b| {
        b.iter(|| {
            let mut page = String::new();
            app.render(&mut page, &|_| false);
            page
        })
    });
    // A page of 100 000 series (50 000 counters, 50 000 summaries): what one piece of a
    // scrape holds the closer up for, and the whole page written in pieces.
    let big = AppSeries::new(Arc::default(), Mapping::default(), usize::MAX);
    for batch in 0..50 {
        let mut w = Window {
            observe: true,
            ..Window::default()
        };
        let mut handler = LineHandler::new(true, usize::MAX);
        for i in batch * 1000..(batch + 1) * 1000 {
            let d = format!("big.{i}.hits:1|c\nbig.{i}.latency:{}|ms", i % 300);
            handler.handle_datagram(d.as_bytes(), false, &mut w);
        }
        big.absorb(1, &w);
    }
    g.throughput(Throughput::Elements(1));
    g.bench_function("render_piece_64k_of_100000_series", |b| {
        b.iter(|| {
            let mut piece = String::new();
            let mut cursor = Cursor::default();
            big.render_some(&mut cursor, &mut piece, 64 * 1024, &|_| false);
            piece
        })
    });
    g.sample_size(10);
    g.bench_function("render_100000_series_in_64k_pieces", |b| {
        b.iter(|| {
            let (mut cursor, mut bytes) = (Cursor::default(), 0);
            loop {
                let mut piece = String::new();
                let more = big.render_some(&mut cursor, &mut piece, 64 * 1024, &|_| false);
                bytes += piece.len();
                if !more {
                    return bytes;
                }
            }
        })
    });
    g.finish();
}

criterion_group!(
    benches,
    app_metrics,
    parse,
    parse_and_record,
    buckets,
    datagrams,
    chunks,
    mapping
);
criterion_main!(benches);
