use super::*;
use crate::protocol::{MetricType, Sample, Value};

fn sample(kind: MetricType, value: Value<'_>) -> Sample<'_> {
    Sample {
        kind,
        value,
        rate: 1.0,
        tags: None,
        timestamp: None,
    }
}

#[test]
fn merge_adds_counters_and_stats() {
    let mut a = Window::default();
    let mut b = Window::default();
    a.record(
        "x",
        &sample(MetricType::Counter, Value::Number(2.0)),
        usize::MAX,
    );
    b.record(
        "x",
        &sample(MetricType::Counter, Value::Number(3.0)),
        usize::MAX,
    );
    a.record(
        "t",
        &sample(MetricType::Timer, Value::Number(1.0)),
        usize::MAX,
    );
    b.record(
        "t",
        &sample(MetricType::Timer, Value::Number(9.0)),
        usize::MAX,
    );
    a.merge(b);
    assert_eq!(a.counters.get("x"), Some(&5.0));
    let t = a.stats[StatKind::Timer as usize].get("t").unwrap();
    assert_eq!(
        (t.count, t.sum, t.sumsq, t.min, t.max),
        (2.0, 10.0, 82.0, 1.0, 9.0)
    );
}

#[test]
fn merge_applies_later_gauge_updates_after_earlier_ones() {
    let mut a = Window::default();
    let mut b = Window::default();
    a.record(
        "g",
        &sample(MetricType::Gauge, Value::Number(10.0)),
        usize::MAX,
    );
    b.record(
        "g",
        &sample(MetricType::Gauge, Value::GaugeDelta(-4.0)),
        usize::MAX,
    );
    a.merge(b);
    assert_eq!(
        a.gauges.get("g"),
        Some(&GaugeUpdate {
            set: Some(10.0),
            delta: -4.0
        })
    );

    let mut c = Window::default();
    c.record(
        "g",
        &sample(MetricType::Gauge, Value::Number(1.0)),
        usize::MAX,
    );
    a.merge(c);
    assert_eq!(
        a.gauges.get("g"),
        Some(&GaugeUpdate {
            set: Some(1.0),
            delta: 0.0
        })
    );
}

#[test]
fn merge_unions_set_members() {
    let mut a = Window::default();
    let mut b = Window::default();
    a.record(
        "s",
        &sample(MetricType::Set, Value::Member(b"u1")),
        usize::MAX,
    );
    b.record(
        "s",
        &sample(MetricType::Set, Value::Member(b"u1")),
        usize::MAX,
    );
    b.record(
        "s",
        &sample(MetricType::Set, Value::Member(b"u2")),
        usize::MAX,
    );
    a.merge(b);
    assert_eq!(a.sets.get("s").map(|m| m.len()), Some(2));
}

#[test]
fn float_noise_does_not_lose_a_unit() {
    let mut w = Window::default();
    for _ in 0..10 {
        w.record(
            "x",
            &sample(MetricType::Counter, Value::Number(0.1)),
            usize::MAX,
        );
    }
    let closed = Ledger::default().close(0, w);
    assert_eq!(closed.counters, [("x".into(), 1)]);
}

#[test]
fn negative_fractions_carry_toward_zero() {
    let mut ledger = Ledger::default();
    let mut w = Window::default();
    w.record(
        "x",
        &sample(MetricType::Counter, Value::Number(-1.5)),
        usize::MAX,
    );
    assert_eq!(ledger.close(0, w).counters, [("x".into(), -1)]);
    let mut w = Window::default();
    w.record(
        "x",
        &sample(MetricType::Counter, Value::Number(-1.5)),
        usize::MAX,
    );
    assert_eq!(ledger.close(1, w).counters, [("x".into(), -2)]);
}

#[test]
fn empty_window_closes_empty() {
    assert!(Ledger::default().close(5, Window::default()).is_empty());
}

#[test]
fn series_names_compare_whole() {
    let names = [
        "",
        "a",
        "ab",
        "abcdefg",
        "abcdefgh",
        "abcdefghi",
        "load.1.c",
        "load.1.d",
    ];
    let long = [
        "web.checkout.requests",
        "web.checkout.requestz",
        "xeb.checkout.requests",
    ];
    for a in names.iter().chain(&long) {
        for b in names.iter().chain(&long) {
            assert_eq!(
                same_bytes(a.as_bytes(), b.as_bytes()),
                a == b,
                "{a:?} {b:?}"
            );
        }
    }
    for len in 0..40 {
        let a: Vec<u8> = (0..len).map(|i| b'a' + (i % 26) as u8).collect();
        assert!(same_bytes(&a, &a.clone()));
        for at in 0..len {
            let mut b = a.clone();
            b[at] = b'.';
            assert!(!same_bytes(&a, &b), "{len} {at}");
        }
    }
    // One series per name, found again by its name.
    let mut w = Window::default();
    for name in names.iter().chain(&long).skip(1) {
        w.record(
            name,
            &sample(MetricType::Counter, Value::Number(1.0)),
            usize::MAX,
        );
        w.record(
            name,
            &sample(MetricType::Counter, Value::Number(2.0)),
            usize::MAX,
        );
    }
    assert_eq!(w.counters.len(), names.len() + long.len() - 1);
    assert!(w.counters.values().all(|v| *v == 3.0));
}

#[test]
fn a_window_writes_at_most_the_largest_increment_and_carries_the_rest() {
    let mut ledger = Ledger::default();
    let mut w = Window::default();
    for _ in 0..3 {
        w.record(
            "x",
            &sample(MetricType::Counter, Value::Number(MAX_INCREMENT)),
            usize::MAX,
        );
    }
    let written = |c: ClosedWindow| c.counters[0].1;
    assert_eq!(written(ledger.close(0, w)), MAX_INCREMENT as i64);
    let mut next = Window::default();
    next.record(
        "x",
        &sample(MetricType::Counter, Value::Number(0.0)),
        usize::MAX,
    );
    assert_eq!(written(ledger.close(1, next)), MAX_INCREMENT as i64);
    let mut last = Window::default();
    last.record(
        "x",
        &sample(MetricType::Counter, Value::Number(-1.0)),
        usize::MAX,
    );
    assert_eq!(written(ledger.close(2, last)), MAX_INCREMENT as i64 - 1);
}

#[test]
fn idle_gauges_and_carries_are_forgotten() {
    let mut ledger = Ledger::new(3600);
    let mut w = Window::default();
    w.record(
        "g",
        &sample(MetricType::Gauge, Value::Number(10.0)),
        usize::MAX,
    );
    w.record(
        "c",
        &sample(MetricType::Counter, Value::Number(0.5)),
        usize::MAX,
    );
    ledger.close(1000, w);
    ledger.close(1000 + 3600, Window::default());
    assert_eq!(ledger.gauge("g"), Some(10.0), "idle for exactly the limit");
    ledger.close(1000 + 3601, Window::default());
    assert_eq!(ledger.gauge("g"), Some(10.0), "looked at once a minute");
    ledger.close(1000 + 3600 + 60, Window::default());
    assert_eq!(ledger.gauge("g"), None);
    // The carried half is gone too: half a count more makes no whole one.
    let mut w = Window::default();
    w.record(
        "c",
        &sample(MetricType::Counter, Value::Number(0.5)),
        usize::MAX,
    );
    assert_eq!(ledger.close(1000 + 3700, w).counters[0].1, 0);
}

#[test]
fn the_series_cap_drops_new_series_only_and_counts_their_samples() {
    let mut w = Window::default();
    for name in ["a", "b", "c", "a", "c"] {
        w.record(name, &sample(MetricType::Counter, Value::Number(1.0)), 2);
    }
    w.record("t", &sample(MetricType::Timer, Value::Number(1.0)), 2);
    assert_eq!(w.counters.len(), 2);
    assert_eq!(w.counters.get("a"), Some(&2.0));
    assert_eq!(w.dropped[MetricType::Counter as usize], 2);
    assert_eq!(w.dropped[MetricType::Timer as usize], 0);
    for _ in 0..3 {
        w.record_log(
            LogEntry {
                name: "n".into(),
                severity: Severity::Info,
                message: "m".into(),
            },
            2,
        );
    }
    assert_eq!((w.logs.len(), w.dropped[DROPPED_LOGS]), (2, 1));
    let mut other = Window::default();
    other.record("z", &sample(MetricType::Counter, Value::Number(1.0)), 1);
    other.record("y", &sample(MetricType::Counter, Value::Number(1.0)), 1);
    w.merge(other);
    assert_eq!(w.dropped[MetricType::Counter as usize], 3);
}

#[test]
fn busiest_prefixes_name_who_fills_a_window() {
    let mut w = Window::default();
    for name in ["api.a", "api.b", "api;env=x", "web.a", "db"] {
        w.record(
            name,
            &sample(MetricType::Counter, Value::Number(1.0)),
            usize::MAX,
        );
    }
    w.record(
        "web.t",
        &sample(MetricType::Timer, Value::Number(1.0)),
        usize::MAX,
    );
    assert_eq!(
        w.busiest_prefixes(2),
        [("api".to_string(), 3), ("web".to_string(), 2)]
    );
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]
    /// Whatever lines arrive, at the edges of every type, nothing the agent keeps or writes
    /// is NaN or infinite.
    #[test]
    fn the_ledger_never_holds_nan_or_infinity(
        datagrams in proptest::collection::vec(
            proptest::collection::vec(
                (
                    "[abc]",
                    proptest::sample::select(vec![
                        "1", "-1", "1e308", "-1e308", "1.7976931348623157e308", "9223372036854775807",
                        "9007199254740992", "-9007199254740993", "1e-310", "4.9e-324", "+1e300",
                        "-1e300", "+9e18", "-9e18", "0.1", "NaN", "inf",
                    ]),
                    proptest::sample::select(vec!["c", "ms", "h", "d", "g"]),
                    proptest::sample::select(vec![
                        "", "|@1", "|@0.5", "|@1e-300", "|@4.9e-324", "|@1e-16", "|@1e-19",
                    ]),
                ),
                1..20,
            ),
            1..6,
        )
    ) {
        let mut ledger = Ledger::default();
        let mut handler = crate::ingest::LineHandler::new(true, usize::MAX);
        for (i, lines) in datagrams.iter().enumerate() {
            let text: Vec<String> = lines
                .iter()
                .map(|(name, v, t, rate)| format!("{name}:{v}|{t}{rate}"))
                .collect();
            let mut w = Window::default();
            handler.handle_datagram(text.join("\n").as_bytes(), false, &mut w);
            let finite_window = w.counters.values().all(|v| v.is_finite())
                && w.stats.iter().flat_map(HashMap::values).all(|s| {
                    [s.count, s.sum, s.sumsq].iter().all(|v| v.is_finite())
                })
                && w.gauges.values().all(|g| g.delta.is_finite() && g.set.is_none_or(f64::is_finite));
            proptest::prop_assert!(finite_window, "{:?}", text);
            let closed = ledger.close(i as u64, w);
            let finite_stats = closed.stats.iter().all(|(_, _, s)| {
                [s.count, s.sum, s.sumsq, s.min, s.max].iter().all(|v| v.is_finite())
            });
            proptest::prop_assert!(finite_stats);
            proptest::prop_assert!(closed.gauges.iter().all(|(_, v)| v.is_finite()));
            let bounded = closed.counters.iter().all(|(_, n)| n.unsigned_abs() <= MAX_INCREMENT as u64);
            proptest::prop_assert!(bounded);
            proptest::prop_assert!(ledger.carries.values().all(|(c, _)| c.is_finite()));
            proptest::prop_assert!(ledger.gauges.values().all(|g| g.value.is_finite()));
        }
    }
}

/// A sampled counter of an earlier second writes its whole part there and carries the fraction
/// like any counter's, into the next window that counts the series; the series cap takes the
/// timestamped values of a series as one series.
#[test]
fn timestamped_counters_carry_their_fraction_and_count_against_the_cap() {
    let stamped = |value, rate, at| Sample {
        rate,
        timestamp: Some(at),
        ..sample(MetricType::Counter, Value::Number(value))
    };
    let mut ledger = Ledger::default().with_stamps(1, 3600);
    let mut w = Window::default();
    for _ in 0..10 {
        w.record("c", &stamped(1.0, 0.3, 99_990), 1);
    }
    w.record("other", &stamped(1.0, 1.0, 99_990), 1);
    assert_eq!(w.dropped[MetricType::Counter as usize], 1, "the cap");
    let closed = ledger.close(100_000, w);
    let write = StampedWrite {
        at: 99_990,
        series: "c".into(),
        value: StampedValue::Counter(33),
    };
    assert_eq!(closed.stamped, [write]);
    assert_eq!(closed.stamps.earlier, 10);
    let mut w = Window::default();
    w.record("c", &sample(MetricType::Counter, Value::Number(1.0)), 1);
    let closed = ledger.close(100_001, w);
    // 10 / 0.3 = 33.33…: the third is carried on (1.33 written as 1, 2.33 as 2).
    assert_eq!(closed.counters, [("c".into(), 1)]);
    let mut w = Window::default();
    w.record("c", &sample(MetricType::Counter, Value::Number(2.0)), 1);
    w.record("c", &stamped(1.0, 0.5, 96_000), 1);
    let closed = ledger.close(100_002, w);
    assert_eq!(closed.counters, [("c".into(), 2)]);
    assert_eq!(closed.stamps.too_old, 1);
}

/// A counter sent only with earlier timestamps, sampled: its fractions add up across windows
/// and are written, not held for ever.
#[test]
fn a_counter_stamped_only_earlier_loses_no_fraction() {
    let mut ledger = Ledger::default().with_stamps(1, 3600);
    let mut written = 0;
    for i in 0..30 {
        let start = 100_000 + i;
        let mut w = Window::default();
        let sample = Sample {
            rate: 0.3,
            timestamp: Some(start - 10),
            ..sample(MetricType::Counter, Value::Number(1.0))
        };
        w.record("c", &sample, usize::MAX);
        for write in ledger.close(start, w).stamped {
            if let StampedValue::Counter(n) = write.value {
                written += n;
            }
        }
    }
    // 30 / 0.3 = 100, less what may still be carried (under one).
    assert!((99..=100).contains(&written), "{written}");
}

/// A window that knows its seconds takes a value stamped within them as it comes: in order
/// with the unstamped ones (a delta after it adds to it), and under the series cap.
#[test]
fn a_value_stamped_in_its_own_window_counts_in_arrival_order() {
    let mut ledger = Ledger::default().with_stamps(1, 3600);
    let mut open = Window::default();
    drop(open.take_for(100..101));
    let stamped = Sample {
        timestamp: Some(100),
        ..sample(MetricType::Gauge, Value::Number(1.0))
    };
    open.record("g", &stamped, 1);
    open.record("g", &sample(MetricType::Gauge, Value::GaugeDelta(5.0)), 1);
    let counter = Sample {
        timestamp: Some(100),
        ..sample(MetricType::Counter, Value::Number(1.0))
    };
    open.record("c", &counter, 1);
    open.record("d", &counter, 1);
    assert_eq!(open.dropped[MetricType::Counter as usize], 1, "the cap");
    let closed = ledger.close(100, open.take());
    assert_eq!(closed.gauges, [("g".into(), 6.0)]);
    assert_eq!(closed.counters, [("c".into(), 1)]);
    assert_eq!(closed.stamps.current, 2);
}
