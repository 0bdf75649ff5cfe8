//! The reader's per-line path in a plain loop, for measurements criterion can't make: the
//! bench's 50 datagrams of 20 lines over 1000 known series, `runs` times 200 passes. Prints the
//! best and the median time per line over the runs (the best is what a noisy shared machine
//! still shows reliably).
//!
//!     cargo run --release --example line_loop -- 200
//!
//! Instructions per line, exact on any machine: the difference between two runs under
//! valgrind, divided by the 2 000 000 lines ten runs take:
//!
//!     valgrind --tool=cachegrind --cache-sim=no target/release/examples/line_loop 11
//!     valgrind --tool=cachegrind --cache-sim=no target/release/examples/line_loop 1

use std::hint::black_box;
use std::time::Instant;

use statsd_redis::aggregate::Window;
use statsd_redis::ingest::LineHandler;

const PASSES: usize = 200;

fn main() {
    let runs: usize = match std::env::args().nth(1).map(|a| a.parse()) {
        None => 200,
        Some(Ok(n)) if n > 0 => n,
        Some(_) => {
            eprintln!("usage: line_loop [runs > 0]");
            std::process::exit(2);
        }
    };
    let batch: Vec<Vec<u8>> = (0..50)
        .map(|d| {
            let lines: Vec<String> = (0..20)
                .map(|i| format!("load.{}.c:1|c", (d * 20 + i) % 1000))
                .collect();
            lines.join("\n").into_bytes()
        })
        .collect();
    let lines = (PASSES * 50 * 20) as f64;
    let mut handler = LineHandler::new(true, usize::MAX);
    let mut window = Window::default();
    let mut per_line: Vec<f64> = (0..runs)
        .map(|_| {
            let t = Instant::now();
            for _ in 0..PASSES {
                for d in &batch {
                    handler.handle_datagram(black_box(d), false, &mut window);
                }
            }
            t.elapsed().as_nanos() as f64 / lines
        })
        .collect();
    per_line.sort_by(f64::total_cmp);
    println!(
        "{:.1} ns per line best, {:.1} median, over {runs} runs of {lines} lines",
        per_line[0],
        per_line[runs / 2]
    );
}
