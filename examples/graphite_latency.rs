//! The Graphite API's latency, beside graphite-web's (`scripts/bench-graphite.sh` runs it):
//!
//! ```text
//! cargo run --release --example graphite_latency -- seed --redis redis+unix:///path.sock \
//!     --series 1000000 --day-series 100 --now 1760001237
//! cargo run --release --example graphite_latency -- measure --base http://127.0.0.1:9102/graphite \
//!     --now 1760001237 [--runs 30]
//! ```
//!
//! `seed` writes `known:` for `apps × hosts × metrics` series (`app<i>.host<j>.metric<k>`, at the
//! seven default precisions: 7 members each) and a day of 60 s slices (1440) for the
//! `app1.host1.*` counters. `measure` times, one request at a time, a `find` of a prefix
//! (`app42.host7.*`), a `find` at the root, and a `render` of the 100 `app1.host1.*` series over
//! a day, and prints the minimum, median and 90th percentile of each in milliseconds.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const PRECISIONS: [u64; 7] = [1, 5, 60, 300, 3600, 18000, 86400];

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
    match args.first().map(String::as_str) {
        Some("seed") => seed(
            &arg(&args, "--redis").expect("--redis URL"),
            num("--series", 1_000_000),
            num("--day-series", 100),
            now,
        ),
        Some("measure") => measure(
            &arg(&args, "--base").expect("--base URL"),
            now,
            num("--runs", 30) as usize,
        ),
        _ => {
            eprintln!(
                "usage: graphite_latency seed --redis URL [--series N] [--day-series N] [--now T]\n       graphite_latency measure --base URL [--now T] [--runs N]"
            );
            std::process::exit(2);
        }
    }
}

fn seed(url: &str, series: u64, day_series: u64, now: u64) {
    let mut conn = redis::Client::open(url)
        .and_then(|c| c.get_connection())
        .expect("Redis");
    let per_app = 10_000;
    let mut members = Vec::with_capacity(10_000);
    let mut pipe = redis::pipe();
    for i in 0..series {
        let name = format!("app{}.host{}.metric{}", i / per_app, i / 100 % 100, i % 100);
        for p in PRECISIONS {
            members.push(format!("{p}:{name}"));
        }
        if members.len() >= 10_000 {
            let mut zadd = redis::cmd("ZADD");
            zadd.arg("known:");
            for m in members.drain(..) {
                zadd.arg(0).arg(m);
            }
            pipe.add_command(zadd);
        }
        if pipe.cmd_iter().count() >= 20 {
            let () = pipe.query(&mut conn).expect("ZADD");
            pipe = redis::pipe();
        }
    }
    if !members.is_empty() {
        let mut zadd = redis::cmd("ZADD");
        zadd.arg("known:");
        for m in members.drain(..) {
            zadd.arg(0).arg(m);
        }
        pipe.add_command(zadd);
    }
    let () = pipe.query(&mut conn).expect("ZADD");
    let minute = now - now % 60;
    for k in 0..day_series {
        let mut hset = redis::cmd("HSET");
        hset.arg(format!("count:60:app1.host1.metric{k}"));
        for s in 0..1440 {
            hset.arg(minute - s * 60).arg(1 + (s + k) % 17);
        }
        let () = hset.query(&mut conn).expect("HSET");
    }
    println!(
        "seeded {series} series ({} members), {day_series} with a day of minutes",
        series * 7
    );
}

/// One request, its body discarded; the time it took.
fn request(base: &str, path: &str, query: &str) -> Duration {
    let rest = base.trim_start_matches("http://");
    let (addr, prefix) = rest.split_once('/').map_or((rest, ""), |(a, p)| (a, p));
    let started = Instant::now();
    let mut s = TcpStream::connect(addr).expect("connect");
    let body = query.as_bytes();
    write!(
        s,
        "POST /{prefix}{path} HTTP/1.1\r\nHost: bench\r\nConnection: close\r\nContent-Type: application/x-www-form-urlencoded\r\nContent-Length: {}\r\n\r\n",
        body.len()
    )
    .expect("write");
    s.write_all(body).expect("write");
    let mut response = Vec::new();
    s.read_to_end(&mut response).expect("read");
    assert!(
        response.starts_with(b"HTTP/1.1 200") || response.starts_with(b"HTTP/1.0 200"),
        "{path}: {}",
        String::from_utf8_lossy(&response[..response.len().min(300)])
    );
    started.elapsed()
}

fn measure(base: &str, now: u64, runs: usize) {
    let now = now.to_string();
    let encode = |pairs: &[(&str, &str)]| {
        pairs
            .iter()
            .map(|(k, v)| format!("{k}={}", v.replace('*', "%2A").replace(' ', "%20")))
            .collect::<Vec<_>>()
            .join("&")
    };
    for (what, path, query) in [
        (
            "find a prefix (app42.host7.*)",
            "/metrics/find",
            encode(&[("query", "app42.host7.*"), ("now", &now)]),
        ),
        (
            "find the root (*)",
            "/metrics/find",
            encode(&[("query", "*"), ("now", &now)]),
        ),
        (
            "render 100 series x a day at 60 s",
            "/render",
            encode(&[
                ("target", "app1.host1.*"),
                ("from", "-1d"),
                ("until", "now"),
                ("format", "json"),
                ("now", &now),
            ]),
        ),
    ] {
        request(base, path, &query);
        let mut times: Vec<f64> = (0..runs)
            .map(|_| request(base, path, &query).as_secs_f64() * 1000.0)
            .collect();
        times.sort_by(f64::total_cmp);
        let at = |q: f64| times[((times.len() - 1) as f64 * q).round() as usize];
        println!(
            "{what:<36} runs {runs:>3}  min {:>9.2} ms  p50 {:>9.2} ms  p90 {:>9.2} ms",
            at(0.0),
            at(0.5),
            at(0.9)
        );
    }
}
