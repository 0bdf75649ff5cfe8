//! The per-line path allocates nothing for series the window already holds: a counting global
//! allocator watches a reader's `handle_datagram` after one warm-up datagram per series set.

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU64, Ordering};

use statsd_redis::aggregate::Window;
use statsd_redis::ingest::LineHandler;

struct Counting;

static ALLOCATIONS: AtomicU64 = AtomicU64::new(0);

std::thread_local! {
    /// Whether this thread's allocations count: the test's own, not the harness's threads'
    /// (which allocate now and then while the test runs).
    static COUNTED: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

fn count() {
    if COUNTED.with(|c| c.get()) {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
    }
}

// SAFETY: forwards to the system allocator; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        count();
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        count();
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

#[test]
fn known_series_cost_no_allocation_per_line() {
    // Every kind of line: plain, sampled, tagged both ways, sanitized, multi-value, gauge, set.
    let datagram: &[u8] =
        b"web.requests:1|c\napi.latency:12.5|ms|@0.5\nweb.requests:1|c|#env:prod,region:eu\n\
        web.requests,env=prod:1|c\nmy page/views:1|c\nsizes:1:2:3|h\nq:1|c:5|ms\nqueue.depth:+3|g\n\
        users:alice|s\nlat:7|d\nbad line\n_sc|db|0";
    let mut handler = LineHandler::new(true, usize::MAX);
    let mut window = Window::default();
    // The first pass creates the series (their keys are allocated once per window) and the
    // namer's buffers; a service check becomes a log entry, which owns its text.
    handler.handle_datagram(datagram, false, &mut window);
    window.logs.reserve(10_000);
    handler.bad_example = Some((statsd_redis::protocol::BadLine::MissingValue, String::new()));

    COUNTED.with(|c| c.set(true));
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    for _ in 0..1000 {
        handler.handle_datagram(datagram, false, &mut window);
    }
    COUNTED.with(|c| c.set(false));
    let per_datagram = (ALLOCATIONS.load(Ordering::Relaxed) - before) as f64 / 1000.0;
    // The service check's log entry (name and message strings) is the only owned data per line.
    assert_eq!(
        per_datagram, 2.0,
        "allocations per datagram beyond the log entry's two strings"
    );
    assert_eq!(handler.tally.lines, 12 * 1001);
    assert_eq!(window.counters.len(), 5);
}
