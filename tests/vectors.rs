//! The protocol vectors of the core issue, each checked after one flush: datagram → parser →
//! window → ledger, exactly the path a reader and the flusher take (without sockets or Redis).

use statsd_redis::aggregate::{ClosedWindow, Ledger, StatKind, Window};
use statsd_redis::ingest::LineHandler;
use statsd_redis::protocol::{BadLine, MetricType};
use statsd_redis::telemetry::Tally;

struct Flushed {
    closed: ClosedWindow,
    tally: Tally,
}

impl Flushed {
    fn counters(&self) -> Vec<(String, i64)> {
        let mut v: Vec<_> = self
            .closed
            .counters
            .iter()
            .map(|(s, n)| (s.to_string(), *n))
            .collect();
        v.sort();
        v
    }

    fn only_counter(&self) -> (String, i64) {
        let c = self.counters();
        assert_eq!(c.len(), 1, "{c:?}");
        c[0].clone()
    }

    fn bad(&self) -> Vec<&'static str> {
        BadLine::ALL
            .iter()
            .filter(|b| self.tally.bad[**b as usize] > 0)
            .map(|b| b.as_str())
            .collect()
    }

    fn timer(&self, series: &str) -> (f64, f64, f64, f64) {
        let s = self
            .closed
            .stats
            .iter()
            .find(|s| &*s.0 == series && s.1 == StatKind::Timer)
            .map(|s| s.2.clone())
            .expect("timer series");
        (s.count, s.sum, s.min, s.max)
    }
}

/// One window holding `datagrams`, closed by `ledger`.
fn flush_with(ledger: &mut Ledger, start: u64, datagrams: &[&[u8]]) -> Flushed {
    let mut handler = LineHandler::new(true, usize::MAX);
    let mut window = Window::default();
    for d in datagrams {
        handler.handle_datagram(d, false, &mut window);
    }
    Flushed {
        closed: ledger.close(start, window),
        tally: handler.tally,
    }
}

fn flush(datagram: &str) -> Flushed {
    flush_with(&mut Ledger::default(), 0, &[datagram.as_bytes()])
}

fn assert_bad(datagram: &str, reason: &str) {
    let f = flush(datagram);
    assert_eq!(f.bad(), [reason], "{datagram:?}");
    assert!(f.closed.is_empty(), "{datagram:?} recorded {:?}", f.closed);
}

#[test]
fn plain_counter() {
    assert_eq!(flush("a:1|c").only_counter(), ("a".into(), 1));
}

#[test]
fn empty_lines_are_skipped_without_error() {
    let f = flush("a:1|c\n\nb:2|c");
    assert_eq!(f.counters(), [("a".into(), 1), ("b".into(), 2)]);
    assert_eq!(f.tally.bad_lines(), 0);
    assert_eq!(f.tally.lines, 2);
}

#[test]
fn crlf_is_accepted() {
    assert_eq!(flush("a:1|c\r\n").only_counter(), ("a".into(), 1));
}

#[test]
fn sampled_counter() {
    assert_eq!(flush("a:2|c|@0.5").only_counter().1, 4);
    assert_eq!(flush("a:2|c|@1e-1").only_counter().1, 20);
}

#[test]
fn invalid_sample_rates() {
    for line in [
        "a:2|c|@0",
        "a:2|c|@1.5",
        "a:2|c|@-0.5",
        "a:2|c|@abc",
        "a:2|c|@",
        "a:2|c|@ 0.5",
    ] {
        assert_bad(line, "invalid_sample_rate");
    }
}

#[test]
fn malformed_lines() {
    assert_bad("a:1", "missing_type");
    assert_bad("a", "missing_value");
    assert_bad(":1|c", "empty_name");
    assert_bad("a:|c", "empty_value");
    assert_bad("a:1|x", "unknown_type");
    assert_bad("a:|s", "empty_value");
}

#[test]
fn invalid_values() {
    for line in ["a:NaN|g", "a:inf|g", "a:0x10|c", "a:12abc|c", "a: 1|c"] {
        assert_bad(line, "invalid_value");
    }
}

#[test]
fn counter_values() {
    assert_eq!(flush("a:-5|c").only_counter().1, -5);
    assert_eq!(flush("a:1.5|c\na:1.5|c").only_counter().1, 3);
    assert_eq!(flush("a:1e3|c").only_counter().1, 1000);
}

#[test]
fn etsy_multi_segment_lines() {
    assert_eq!(flush("a:1|c:2|c").only_counter().1, 3);
    let f = flush("a:1|c:5|ms");
    assert_eq!(f.only_counter().1, 1);
    assert_eq!(f.timer("a"), (1.0, 5.0, 5.0, 5.0));
}

#[test]
fn dogstatsd_packed_values() {
    assert_eq!(flush("a:1:2:3|ms").timer("a"), (3.0, 6.0, 1.0, 3.0));
    assert_eq!(flush("a:1::2|ms").timer("a"), (2.0, 3.0, 1.0, 2.0));
}

#[test]
fn sampled_timer_weights_count_and_sum_not_min_max() {
    assert_eq!(flush("a:5|ms|@0.1").timer("a"), (10.0, 50.0, 5.0, 5.0));
}

#[test]
fn gauge_delta_on_unknown_gauge() {
    assert_eq!(flush("a:+5|g").closed.gauges, [("a".into(), 5.0)]);
}

#[test]
fn gauges_persist_with_deltas() {
    let mut ledger = Ledger::default();
    let f = flush_with(&mut ledger, 0, &[b"a:10|g", b"a:-3|g", b"a:+1|g"]);
    assert_eq!(f.closed.gauges, [("a".into(), 8.0)]);
    // Nothing sent: the agent still knows 8, and a delta applies to it.
    let f = flush_with(&mut ledger, 1, &[]);
    assert!(f.closed.gauges.is_empty());
    assert_eq!(ledger.gauge("a"), Some(8.0));
    let f = flush_with(&mut ledger, 2, &[b"a:+2|g"]);
    assert_eq!(f.closed.gauges, [("a".into(), 10.0)]);
}

#[test]
fn gauge_ignores_sample_rate() {
    assert_eq!(flush("a:5|g|@0.5").closed.gauges, [("a".into(), 5.0)]);
}

#[test]
fn set_member_is_raw_text() {
    let f = flush("a:1:2|s");
    assert_eq!(f.closed.sets.len(), 1);
    assert_eq!(f.closed.sets[0].1, [b"1:2".to_vec().into_boxed_slice()]);
}

#[test]
fn tag_order_never_splits_a_series() {
    let f = flush("a:1|c|#env:prod,x\na:1|c|#x,env:prod");
    assert_eq!(f.only_counter(), ("a;env=prod;x".into(), 2));
}

#[test]
fn fields_in_any_order() {
    let f = flush("a:1|c|@0.5|#env:prod\na:1|c|#env:prod|@0.5");
    assert_eq!(f.only_counter(), ("a;env=prod".into(), 4));
}

#[test]
fn influx_tags() {
    assert_eq!(flush("a,env=prod:1|c").only_counter().0, "a;env=prod");
    assert_bad("a,env=prod:1|c|#x:y", "mixed_tag_styles");
}

#[test]
fn unknown_field_keeps_the_sample() {
    let f = flush("a:1|c|x:unknown");
    assert_eq!(f.only_counter().1, 1);
    assert_eq!(f.tally.unknown_fields, 1);
}

#[test]
fn names_are_sanitized() {
    assert_eq!(flush("my key:1|c").only_counter().0, "my_key");
    assert_eq!(flush("a/b:1|c").only_counter().0, "a-b");
    let f = flush("a$b:1|c");
    assert_eq!(f.only_counter().0, "ab");
    assert_eq!(f.tally.names_sanitized, 1);
}

#[test]
fn invalid_utf8_name_is_bad() {
    let f = flush_with(&mut Ledger::default(), 0, &[b"a\xc3\x28:1|c"]);
    assert_eq!(f.bad(), ["invalid_utf8"]);
}

#[test]
fn large_datagram_counts_every_line() {
    let mut d = String::new();
    let mut n = 0;
    while d.len() < 9000 {
        d.push_str(&format!("series.{}:1|c\n", n % 10));
        n += 1;
    }
    let f = flush(&d);
    assert_eq!(f.tally.lines, n);
    assert_eq!(f.closed.counters.iter().map(|c| c.1).sum::<i64>(), n as i64);
}

#[test]
fn events_and_service_checks() {
    let f = flush("_e{5,4}:title|text");
    assert_eq!(f.tally.events, 1);
    assert_eq!(f.closed.logs.len(), 1);
    assert_eq!(f.closed.logs[0].message, "title: text");
    assert_bad("_e{9,4}:title|text", "invalid_event");
    let f = flush("_sc|db|2|m:down");
    assert_eq!(f.tally.service_checks, 1);
    assert_eq!(
        (
            f.closed.logs[0].name.as_str(),
            f.closed.logs[0].severity.as_str()
        ),
        ("db", "critical")
    );
}

#[test]
fn fractions_carry_to_the_next_window() {
    let mut ledger = Ledger::default();
    // 1 / 0.3 = 3.33..., three times: 3, 3 (6.67 - 3), 4 (10.0 - 6): the total stays exact.
    let got: Vec<i64> = (0..3)
        .map(|w| {
            flush_with(&mut ledger, w, &[b"a:1|c|@0.3"])
                .only_counter()
                .1
        })
        .collect();
    assert_eq!(got, [3, 3, 4]);
    assert_eq!(got.iter().sum::<i64>(), 10);
}

#[test]
fn truncated_datagram_loses_only_its_partial_line() {
    let mut handler = LineHandler::new(true, usize::MAX);
    let mut window = Window::default();
    handler.handle_datagram(b"a:1|c\nb:1|c\nc:1", true, &mut window);
    let closed = Ledger::default().close(0, window);
    assert_eq!(closed.counters.len(), 2);
    assert_eq!(handler.tally.truncated_datagrams, 1);
    assert_eq!(handler.tally.bad[BadLine::Truncated as usize], 1);
}

#[test]
fn samples_are_counted_by_type() {
    let f = flush("a:1|c\nb:1|ms\nc:1|h\nd:1|d\ne:1|g\nf:x|s");
    for t in MetricType::ALL {
        assert_eq!(f.tally.samples[t as usize], 1, "{t:?}");
    }
}

/// statsd_exporter's vectors: a `#` before each DogStatsD tag separates, it is not a key's.
#[test]
fn a_hash_before_each_dogstatsd_tag() {
    assert_eq!(
        flush("foo:100|c|#tag1:bar,#tag2:baz").only_counter(),
        ("foo;tag1=bar;tag2=baz".into(), 100)
    );
}

/// Telegraf's `valid.multiple` vector: an empty field before the `:` of the next segment ends
/// its segment, so the last value is stored (twelve samples, the largest 1).
#[test]
fn an_empty_field_before_the_next_segment() {
    let f = flush("valid.multiple:0|ms|@0.1:0|ms|:1|ms");
    assert_eq!(f.timer("valid.multiple"), (12.0, 1.0, 0.0, 1.0));
    assert!(f.bad().is_empty(), "{:?}", f.bad());
    assert_eq!(f.tally.unknown_fields, 0);
}

/// A `#` not followed by `k=v` tags is a byte of the name, as Etsy statsd and vector read it:
/// sanitizing then removes it.
#[test]
fn a_hash_in_a_name_without_tags_after_it() {
    assert_eq!(
        flush("foo. @& bar_$!#.baz:1|c").only_counter(),
        ("foo.__bar_.baz".into(), 1)
    );
    assert_eq!(flush("web#env=prod:1|c").only_counter().0, "web;env=prod");
}
