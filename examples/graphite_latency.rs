//! The Graphite API's latency beside graphite-web's (`scripts/bench-graphite.sh` runs it):
//!
//! ```text
//! cargo run --release --example graphite_latency -- seed --redis redis+unix:///path.sock \
//!     [--series 10000] [--day-series 1000] [--now T]
//! cargo run --release --example graphite_latency -- measure --redis redis+unix:///path.sock \
//!     --base http://127.0.0.1:9102/graphite [--oracle http://127.0.0.1:8080] [--now T] \
//!     [--runs 30] [--oracle-runs 5] [--only NAME,...] [--keep-alive]
//! ```
//!
//! `seed` writes `known:` for `series` counters `app<a>.host<h>.metric<m>` (10 hosts of 100
//! metrics an app, at the seven default precisions) and a day of 60 s slices (1 440, every 29th
//! missing) for the first `day-series` of them (`app0.host<h>.metric<m>`).
//!
//! `measure` sends each request to the agent (`--base`) and, given `--oracle`, first checks that
//! graphite-web answers the same (the same series in the same order, names, times, values within
//! 1e-9, nulls alike), then times both, interleaved, one request at a time over a fresh
//! connection, and prints for each the median (and 90th percentile) of each, their ratio, and
//! Redis's own time per request (the `usec` of `INFO commandstats`, the agent's runs only) with
//! the agent's multiple of it. With `--keep-alive` the agent's requests go over one connection
//! kept between them, as Grafana's server-side client sends them (Go's `http.Client` keeps its
//! connections); graphite-web's still each over a fresh one (gunicorn's sync workers close
//! every connection).

#[path = "../tests/common/answers.rs"]
mod answers;

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const PRECISIONS: [u64; 7] = [1, 5, 60, 300, 3600, 18000, 86400];

/// A request: its name, path and parameters (`now` is added).
type Request = (&'static str, &'static str, Vec<(&'static str, String)>);

fn requests() -> Vec<Request> {
    let render = |targets: &[&str]| {
        let mut p: Vec<(&str, String)> =
            targets.iter().map(|t| ("target", t.to_string())).collect();
        p.extend([
            ("from", "-1d".to_string()),
            ("until", "now".to_string()),
            ("format", "json".to_string()),
        ]);
        p
    };
    vec![
        ("render100", "/render", render(&["app0.host1.*"])),
        ("sum100", "/render", render(&["sumSeries(app0.host1.*)"])),
        (
            "moving10",
            "/render",
            render(&["aliasByNode(movingAverage(app0.host2.metric1[0-9],10),2)"]),
        ),
        (
            "find",
            "/metrics/find",
            vec![("query", "app3.host4.*".to_string())],
        ),
        ("render1000", "/render", render(&["app0.*.*"])),
        (
            "alias1000",
            "/render",
            render(&["aliasByNode(app0.*.*,1,2)"]),
        ),
        ("dashboard20", "/render", render(DASHBOARD)),
    ]
}

/// A dashboard of 20 targets, one panel each, over functions beyond the common few.
const DASHBOARD: &[&str] = &[
    "sumSeries(app0.host1.metric1*)",
    "aliasByMetric(app0.host2.metric[0-4])",
    "movingMedian(app0.host3.metric1,10)",
    "perSecond(app0.host3.metric2)",
    "highestMax(app0.host4.metric[0-9]*,3)",
    "sortByMaxima(app0.host5.metric[0-9])",
    "asPercent(app0.host6.metric1,app0.host6.metric2)",
    "summarize(app0.host7.metric[0-9],'1h','max')",
    "hitcount(app0.host8.metric1,'1h')",
    "integral(app0.host8.metric2)",
    "exponentialMovingAverage(app0.host9.metric1,20)",
    "holtWintersForecast(app0.host9.metric2,'2h','1h')",
    "timeShift(app0.host0.metric1,'1h')",
    "stacked(app0.host0.metric[2-4])",
    "removeBelowPercentile(app0.host0.metric5,50)",
    "nPercentile(app0.host0.metric6,95)",
    "groupByNode(app0.host1.metric2*,2,'sum')",
    "linearRegression(app0.host2.metric7)",
    "smartSummarize(app0.host2.metric8,'1h','avg')",
    "aggregateLine(app0.host2.metric9,'max')",
];

fn arg(args: &[String], name: &str) -> Option<String> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let num = |name: &str, default: u64| -> u64 {
        arg(&args, name).map_or(default, |v| v.parse().expect("a number"))
    };
    let now = num("--now", 1_760_001_237);
    let redis = arg(&args, "--redis").expect("--redis URL");
    match args.first().map(String::as_str) {
        Some("seed") => seed(
            &redis,
            num("--series", 10_000),
            num("--day-series", 1000),
            now,
        ),
        Some("measure") => measure(
            &redis,
            &arg(&args, "--base").expect("--base URL"),
            arg(&args, "--oracle").as_deref(),
            now,
            (num("--runs", 30) as usize, num("--oracle-runs", 5) as usize),
            arg(&args, "--only"),
            args.iter().any(|a| a == "--keep-alive"),
        ),
        _ => {
            eprintln!(
                "usage: graphite_latency seed --redis URL [--series N] [--day-series N] [--now T]\n       graphite_latency measure --redis URL --base URL [--oracle URL] [--now T] [--runs N] [--oracle-runs N] [--only NAME,...] [--keep-alive]"
            );
            std::process::exit(2);
        }
    }
}

fn name(i: u64) -> String {
    format!("app{}.host{}.metric{}", i / 1000, i / 100 % 10, i % 100)
}

fn seed(url: &str, series: u64, day_series: u64, now: u64) {
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("Redis");
    for chunk in (0..series).collect::<Vec<_>>().chunks(1000) {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg("known:");
        for i in chunk {
            for p in PRECISIONS {
                zadd.arg(0).arg(format!("{p}:{}", name(*i)));
            }
        }
        let () = zadd.query(&mut conn).expect("ZADD");
    }
    let minute = now - now % 60;
    for k in 0..day_series {
        let mut hset = redis::cmd("HSET");
        hset.arg(format!("count:60:{}", name(k)));
        for s in (0..1440).filter(|s| (s + k) % 29 != 0) {
            hset.arg(minute - s * 60).arg(1 + (s * 7 + k * 13) % 97);
        }
        let () = hset.query(&mut conn).expect("HSET");
    }
    println!(
        "seeded {series} series ({} known: members), {day_series} with a day of minutes",
        series * 7
    );
}

/// One request over a fresh connection (`Connection: close`); its body, and the time it took.
fn request(base: &str, path: &str, query: &str) -> (Vec<u8>, Duration) {
    Kept::default().send(base, path, query, true)
}

/// One connection kept between requests (`--keep-alive`), made again when the server closed it.
#[derive(Default)]
struct Kept {
    conn: Option<(TcpStream, BufReader<TcpStream>)>,
}

impl Kept {
    /// [`Kept::send`] over the kept connection.
    fn request(&mut self, base: &str, path: &str, query: &str) -> (Vec<u8>, Duration) {
        self.send(base, path, query, false)
    }

    /// A `POST` of `query` to `path` under `base` (with `close`, asking the server to close the
    /// connection after it); its body, and the time it took (a connection made counted in the
    /// request that made it).
    fn send(&mut self, base: &str, path: &str, query: &str, close: bool) -> (Vec<u8>, Duration) {
        let (addr, path) = split_base(base, path);
        let started = Instant::now();
        let (write, read) = self.conn.get_or_insert_with(|| {
            // As Go's net/http does: no small write waits for the one before it to be acked.
            let s = TcpStream::connect(&addr).expect("connect");
            s.set_nodelay(true).expect("TCP_NODELAY");
            let read = BufReader::new(s.try_clone().expect("a clone"));
            (s, read)
        });
        let connection = if close { "Connection: close\r\n" } else { "" };
        let request = format!(
            "POST {path} HTTP/1.1\r\nHost: bench\r\n{connection}Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n{query}",
            query.len()
        );
        write.write_all(request.as_bytes()).expect("write");
        let line = |read: &mut BufReader<TcpStream>| {
            let mut l = String::new();
            read.read_line(&mut l).expect("read");
            l.trim_end().to_string()
        };
        let status = line(read);
        assert!(
            status.starts_with("HTTP/1.1 200") || status.starts_with("HTTP/1.0 200"),
            "{path}: {status}"
        );
        let (mut length, mut chunked, mut closing) = (None, false, close);
        loop {
            let header = line(read).to_lowercase();
            if header.is_empty() {
                break;
            }
            let (name, value) = header.split_once(':').unwrap_or((&header, ""));
            match (name.trim(), value.trim()) {
                ("content-length", n) => length = n.parse().ok(),
                ("transfer-encoding", "chunked") => chunked = true,
                ("connection", "close") => closing = true,
                _ => {}
            }
        }
        let mut out = Vec::new();
        match (chunked, length) {
            (true, _) => loop {
                let size = usize::from_str_radix(&line(read), 16).expect("a chunk size");
                let mut chunk = vec![0; size];
                read.read_exact(&mut chunk).expect("a chunk");
                out.extend_from_slice(&chunk);
                line(read);
                if size == 0 {
                    break;
                }
            },
            (false, Some(length)) => {
                out.resize(length, 0);
                read.read_exact(&mut out).expect("a body");
            }
            // A body as long as the connection.
            (false, None) => {
                read.read_to_end(&mut out).expect("a body");
                closing = true;
            }
        }
        let took = started.elapsed();
        if closing {
            self.conn = None;
        }
        (out, took)
    }
}

/// The address of `base` (`http://host:port/prefix`) and `path` under its prefix.
fn split_base(base: &str, path: &str) -> (String, String) {
    let rest = base.trim_start_matches("http://");
    let (addr, prefix) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let path = if prefix.is_empty() {
        path.to_string()
    } else {
        format!("/{prefix}{path}")
    };
    (addr.to_string(), path)
}

/// Where two answers differ, as the oracle test compares them (the first difference), or
/// `None`.
fn difference(want: &[u8], got: &[u8]) -> Option<String> {
    let parse = |b: &[u8]| -> serde_json::Value {
        serde_json::from_str(&answers::finite(&String::from_utf8_lossy(b))).expect("JSON")
    };
    let mut found = Vec::new();
    answers::differences(&parse(want), &parse(got), "$", &mut found);
    found.into_iter().next()
}

/// Redis's command time so far, in microseconds (`INFO commandstats`).
fn redis_usec(conn: &mut redis::Connection) -> f64 {
    let info: String = redis::cmd("INFO")
        .arg("commandstats")
        .query(conn)
        .expect("INFO");
    info.lines()
        .filter_map(|l| l.split("usec=").nth(1))
        .filter_map(|rest| rest.split(',').next()?.parse::<f64>().ok())
        .sum()
}

fn percentiles(mut times: Vec<f64>) -> (f64, f64) {
    times.sort_by(f64::total_cmp);
    let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.9))
}

fn measure(
    redis: &str,
    base: &str,
    oracle: Option<&str>,
    now: u64,
    (runs, oracle_runs): (usize, usize),
    only: Option<String>,
    keep_alive: bool,
) {
    let mut kept = Kept::default();
    let mut ours = |query: &str, path: &str| {
        if keep_alive {
            kept.request(base, path, query)
        } else {
            request(base, path, query)
        }
    };
    let mut conn = redis::Client::open(redis)
        .and_then(|c| c.get_connection())
        .expect("Redis");
    let now = now.to_string();
    let only: Option<Vec<String>> = only.map(|o| o.split(',').map(String::from).collect());
    println!(
        "{:<12} {:>12} {:>12} {:>14} {:>8} {:>12} {:>9}",
        "request", "agent p50", "agent p90", "graphite-web", "ratio", "Redis", "agent/Redis"
    );
    for (what, path, mut params) in requests() {
        if only.as_ref().is_some_and(|o| !o.iter().any(|n| n == what)) {
            continue;
        }
        params.push(("now", now.clone()));
        let query = serde_urlencoded::to_string(&params).expect("a query");
        let (answer, _) = ours(&query, path);
        if let Some(oracle) = oracle {
            let (theirs, _) = request(oracle, path, &query);
            if let Some(d) = difference(&theirs, &answer) {
                panic!("{what}: the agent answers otherwise than graphite-web: {d}");
            }
        }
        let mut agent = Vec::new();
        let mut other = Vec::new();
        let mut redis_time = 0.0;
        for i in 0..runs.max(oracle_runs) {
            if i < runs {
                let before = redis_usec(&mut conn);
                agent.push(ours(&query, path).1.as_secs_f64() * 1000.0);
                redis_time += redis_usec(&mut conn) - before;
            }
            if let Some(oracle) = oracle.filter(|_| i < oracle_runs) {
                other.push(request(oracle, path, &query).1.as_secs_f64() * 1000.0);
            }
        }
        // The INFO calls themselves are counted: one each, a few microseconds.
        let redis_ms = redis_time / runs.max(1) as f64 / 1000.0;
        let (p50, p90) = percentiles(agent);
        let (theirs, ratio) = if other.is_empty() {
            ("-".to_string(), "-".to_string())
        } else {
            let (o50, _) = percentiles(other);
            (format!("{o50:.2} ms"), format!("{:.1}x", o50 / p50))
        };
        println!(
            "{what:<12} {:>9.2} ms {:>9.2} ms {theirs:>14} {ratio:>8} {redis_ms:>9.2} ms {:>8.2}x",
            p50,
            p90,
            p50 / redis_ms.max(1e-9)
        );
    }
}
