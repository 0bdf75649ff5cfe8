//! A deterministic StatsD load generator, and the checker that compares Redis with what it sent.
//!
//! ```text
//! cargo run --release --example loadgen -- send --target 127.0.0.1:8125 --series 1000 \
//!     --lines-per-datagram 20 --lines 1000000 [--rate 200000] [--types c,ms,g,s] [--totals FILE] \
//!     [--transport udp|tcp|unixgram]
//! cargo run --release --example loadgen -- check --redis redis://127.0.0.1:6379/0 --totals FILE
//! ```
//!
//! Line `i` goes to series `<prefix>.<i % series>` with value 1, so the totals are exact and
//! known in advance. UDP datagrams go out in `sendmmsg` batches of 64; over `tcp` (target an
//! address) the same datagrams are written to one connection, each ending in a newline; over
//! `unixgram` (target a socket path) each is one blocking `send`, which waits while the
//! socket's queue is full instead of losing the datagram. `--rate` paces lines per
//! second (0 = as fast as the kernel takes them). `--totals` writes `series<TAB>count` for every
//! counter series; `check` reads them back at every precision and exits 1 on any difference.

use std::collections::BTreeMap;
use std::io::Write;
use std::net::{TcpStream, UdpSocket};
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixDatagram;
use std::time::{Duration, Instant};

const BATCH: usize = 64;

struct Send {
    transport: String,
    target: String,
    series: u64,
    lines_per_datagram: u64,
    lines: u64,
    rate: u64,
    types: Vec<String>,
    prefix: String,
    totals: Option<String>,
}

fn arg<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1))
        .map(|s| s.as_str())
}

fn num(args: &[String], name: &str, default: u64) -> u64 {
    arg(args, name).map_or(default, |v| {
        v.parse()
            .unwrap_or_else(|_| panic!("{name}: not a number: {v}"))
    })
}

const USAGE: &str = "usage: loadgen send [--transport udp|tcp|unixgram] [--target ADDR|PATH] [--series N] [--lines-per-datagram N] [--lines N] [--rate LINES/S] [--types c,ms,g,s] [--prefix P] [--totals FILE]\n       loadgen check [--redis URL] --totals FILE [--precisions LIST] [--key-prefix P]";

/// Every argument after the command is one of `flags` followed by its value: anything else
/// (a typo, `--help`) prints the usage and exits, rather than send a million datagrams.
fn only(args: &[String], flags: &[&str]) {
    let mut rest = args.iter().skip(1);
    while let Some(flag) = rest.next() {
        if flag == "--help" || flag == "-h" {
            println!("{USAGE}");
            std::process::exit(0);
        }
        if !flags.contains(&flag.as_str()) || rest.next().is_none() {
            eprintln!("loadgen: unknown argument or missing value: {flag}\n{USAGE}");
            std::process::exit(2);
        }
    }
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(|s| s.as_str()) {
        Some("send") => {
            only(
                &args,
                &[
                    "--transport",
                    "--target",
                    "--series",
                    "--lines-per-datagram",
                    "--lines",
                    "--rate",
                    "--types",
                    "--prefix",
                    "--totals",
                ],
            );
            let send = Send {
                transport: arg(&args, "--transport").unwrap_or("udp").to_string(),
                target: arg(&args, "--target")
                    .unwrap_or("127.0.0.1:8125")
                    .to_string(),
                series: num(&args, "--series", 1000).max(1),
                lines_per_datagram: num(&args, "--lines-per-datagram", 1).max(1),
                lines: num(&args, "--lines", 1_000_000),
                rate: num(&args, "--rate", 0),
                types: arg(&args, "--types")
                    .unwrap_or("c")
                    .split(',')
                    .map(String::from)
                    .collect(),
                prefix: arg(&args, "--prefix").unwrap_or("load").to_string(),
                totals: arg(&args, "--totals").map(String::from),
            };
            run_send(&send);
        }
        Some("check") => {
            only(
                &args,
                &["--redis", "--totals", "--precisions", "--key-prefix"],
            );
            let redis = arg(&args, "--redis").unwrap_or("redis://127.0.0.1:6379/0");
            let totals = arg(&args, "--totals").expect("--totals FILE");
            let precisions: Vec<u64> = arg(&args, "--precisions")
                .unwrap_or("1,5,60,300,3600,18000,86400")
                .split(',')
                .map(|p| p.parse().expect("--precisions"))
                .collect();
            std::process::exit(run_check(
                redis,
                totals,
                &precisions,
                arg(&args, "--key-prefix").unwrap_or(""),
            ));
        }
        Some("--help" | "-h") => println!("{USAGE}"),
        _ => {
            eprintln!("{USAGE}");
            std::process::exit(2);
        }
    }
}

fn line(send: &Send, i: u64, out: &mut Vec<u8>) {
    let kind = &send.types[(i / send.series) as usize % send.types.len()];
    let series = i % send.series;
    let value = if kind == "s" { i % 97 } else { 1 };
    write!(out, "{}.{}.{kind}:{value}|{kind}", send.prefix, series).unwrap();
}

/// Where the datagrams go.
enum Sink {
    Udp(UdpSocket),
    Tcp(std::io::BufWriter<TcpStream>),
    Unixgram(UnixDatagram),
}

impl Sink {
    fn open(send: &Send) -> Sink {
        match send.transport.as_str() {
            "udp" => {
                let any = if send.target.starts_with('[') {
                    "[::]:0"
                } else {
                    "0.0.0.0:0"
                };
                let socket = UdpSocket::bind(any).unwrap();
                socket.connect(&send.target).unwrap();
                Sink::Udp(socket)
            }
            "tcp" => Sink::Tcp(std::io::BufWriter::with_capacity(
                1 << 16,
                TcpStream::connect(&send.target).unwrap(),
            )),
            "unixgram" => {
                let socket = UnixDatagram::unbound().unwrap();
                socket.connect(&send.target).unwrap();
                Sink::Unixgram(socket)
            }
            other => panic!("--transport: udp, tcp or unixgram, not {other}"),
        }
    }

    fn send(&mut self, datagrams: &[Vec<u8>]) {
        match self {
            Sink::Udp(socket) => send_batch(socket, datagrams),
            Sink::Tcp(stream) => {
                for d in datagrams {
                    stream.write_all(d).unwrap();
                    stream.write_all(b"\n").unwrap();
                }
            }
            Sink::Unixgram(socket) => {
                for d in datagrams {
                    socket.send(d).unwrap();
                }
            }
        }
    }
}

fn run_send(send: &Send) {
    let mut sink = Sink::open(send);
    let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
    let mut datagrams: Vec<Vec<u8>> = vec![Vec::new(); BATCH];
    let (mut sent_lines, mut sent_datagrams) = (0u64, 0u64);
    let started = Instant::now();
    while sent_lines < send.lines {
        let mut n = 0;
        while n < BATCH && sent_lines < send.lines {
            let d = &mut datagrams[n];
            d.clear();
            for _ in 0..send.lines_per_datagram {
                if sent_lines == send.lines {
                    break;
                }
                if !d.is_empty() {
                    d.push(b'\n');
                }
                line(send, sent_lines, d);
                let kind = &send.types[(sent_lines / send.series) as usize % send.types.len()];
                if kind == "c" {
                    *counts.entry(sent_lines % send.series).or_default() += 1;
                }
                sent_lines += 1;
            }
            n += 1;
        }
        sink.send(&datagrams[..n]);
        sent_datagrams += n as u64;
        if send.rate > 0 {
            let due = Duration::from_secs_f64(sent_lines as f64 / send.rate as f64);
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait);
            }
        }
    }
    if let Sink::Tcp(stream) = &mut sink {
        stream.flush().unwrap();
    }
    drop(sink);
    let secs = started.elapsed().as_secs_f64();
    println!(
        "sent {sent_lines} lines in {sent_datagrams} datagrams in {secs:.3} s ({:.0} lines/s, {:.0} datagrams/s)",
        sent_lines as f64 / secs,
        sent_datagrams as f64 / secs
    );
    if let Some(path) = &send.totals {
        let mut f = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
        for (series, count) in &counts {
            writeln!(f, "{}.{series}.c\t{count}", send.prefix).unwrap();
        }
    }
}

/// Sends every datagram; sendmmsg may take fewer than offered, so it loops.
fn send_batch(socket: &UdpSocket, datagrams: &[Vec<u8>]) {
    let mut iovs: Vec<libc::iovec> = datagrams
        .iter()
        .map(|d| libc::iovec {
            iov_base: d.as_ptr() as *mut _,
            iov_len: d.len(),
        })
        .collect();
    // SAFETY: mmsghdr is plain data; zeroed is an empty header.
    let mut msgs: Vec<libc::mmsghdr> = (0..datagrams.len())
        .map(|_| unsafe { std::mem::zeroed() })
        .collect();
    for (m, iov) in msgs.iter_mut().zip(iovs.iter_mut()) {
        m.msg_hdr.msg_iov = iov;
        m.msg_hdr.msg_iovlen = 1;
    }
    let mut done = 0;
    while done < msgs.len() {
        // SAFETY: msgs[done..] point at live iovecs and buffers.
        let n = unsafe {
            libc::sendmmsg(
                socket.as_raw_fd(),
                msgs[done..].as_mut_ptr(),
                (msgs.len() - done) as u32,
                0,
            )
        };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted
                || e.raw_os_error() == Some(libc::ENOBUFS)
            {
                continue;
            }
            // ECONNREFUSED from an earlier datagram: nobody listens; keep going.
            if e.kind() == std::io::ErrorKind::ConnectionRefused {
                continue;
            }
            panic!("sendmmsg: {e}");
        }
        done += n as usize;
    }
}

fn run_check(url: &str, totals: &str, precisions: &[u64], key_prefix: &str) -> i32 {
    let mut conn = redis::Client::open(url).unwrap().get_connection().unwrap();
    let text = std::fs::read_to_string(totals).unwrap();
    let (mut series, mut bad) = (0, 0);
    for l in text.lines() {
        let (name, expected) = l.split_once('\t').unwrap();
        let expected: i64 = expected.parse().unwrap();
        series += 1;
        for p in precisions {
            let hash: BTreeMap<String, i64> = redis::cmd("HGETALL")
                .arg(format!("{key_prefix}count:{p}:{name}"))
                .query(&mut conn)
                .unwrap();
            let got: i64 = hash.values().sum();
            if got != expected {
                bad += 1;
                if bad <= 10 {
                    eprintln!("count:{p}:{name}: expected {expected}, Redis holds {got}");
                }
            }
        }
    }
    println!(
        "checked {series} series at {} precisions: {bad} differences",
        precisions.len()
    );
    i32::from(bad > 0)
}
