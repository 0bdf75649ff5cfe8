use super::*;

fn metric(line: &str) -> MetricLine<'_> {
    match parse_line(line.as_bytes()) {
        Ok(Line::Metric(m)) => m,
        other => panic!("{line}: {other:?}"),
    }
}

fn bad(line: &[u8]) -> BadLine {
    match parse_line(line) {
        Err(e) => e,
        Ok(l) => panic!("{:?} parsed as {l:?}", String::from_utf8_lossy(line)),
    }
}

#[test]
fn simple_counter() {
    let m = metric("a:1|c");
    assert_eq!(m.name, "a");
    assert_eq!(
        m.samples.as_slice(),
        &[Sample {
            kind: MetricType::Counter,
            value: Value::Number(1.0),
            rate: 1.0,
            tags: None,
            timestamp: None,
        }]
    );
}

#[test]
fn fields_in_any_order() {
    let a = metric("a:1|c|@0.5|#env:prod");
    let b = metric("a:1|c|#env:prod|@0.5");
    assert_eq!(a, b);
    assert_eq!(a.samples[0].rate, 0.5);
    assert_eq!(a.samples[0].tags, Some("env:prod"));
}

#[test]
fn timestamp_and_container_fields_are_known() {
    let m = metric("a:1|c|T1700000000|c:abc123|#x");
    assert_eq!(m.unknown_fields, 0);
    assert_eq!(bad(b"a:1|c|Tnope"), BadLine::InvalidTimestamp);
}

#[test]
fn unknown_fields_are_counted_and_ignored() {
    let m = metric("a:1|c|x:unknown");
    assert_eq!(m.unknown_fields, 1);
    assert_eq!(m.samples.len(), 1);
}

/// A field that is only `:`, at the end, first or in the middle of the fields (gostatsd's lexer
/// tests, with several values too): an unknown field, the line's samples whole, nothing bad.
#[test]
fn a_field_that_is_only_a_colon_is_an_unknown_field() {
    for (line, values) in [
        ("new.last.colon:1|g|#|c:xyz|:", &[1.0][..]),
        ("new.first.colon:1|g|:|#|c:xyz", &[1.0]),
        ("new.mid.colon:1|g|#|:|c:xyz", &[1.0]),
        ("a.packing:1:2|ms|#|:|c:xyz", &[1.0, 2.0]),
        ("a.packing:1:2:3|ms|#|:|c:xyz", &[1.0, 2.0, 3.0]),
        ("a.packing:1:2:|ms|#|:|c:xyz", &[1.0, 2.0]),
        ("a.packing:1:2|c|#|:|c:xyz", &[1.0, 2.0]),
        ("a.packing:1:2:3|c|#|:|c:xyz", &[1.0, 2.0, 3.0]),
        ("a.packing:1:2:|c|#|:|c:xyz", &[1.0, 2.0]),
        ("a.packing:1:2|g|#|:|c:xyz", &[1.0, 2.0]),
        ("a.packing:1:2:3|g|#|:|c:xyz", &[1.0, 2.0, 3.0]),
        ("a.packing:1:2:|g|#|:|c:xyz", &[1.0, 2.0]),
    ] {
        let m = metric(line);
        let got: Vec<f64> = m
            .samples
            .iter()
            .map(|s| match s.value {
                Value::Number(n) => n,
                other => panic!("{line}: {other:?}"),
            })
            .collect();
        assert_eq!(got, values, "{line}");
        assert_eq!((m.unknown_fields, m.rejected), (1, None), "{line}");
    }
    // Etsy's segments and Telegraf's empty field before one still start a segment.
    assert_eq!(metric("a:1|c:2|ms").samples.len(), 2);
    assert_eq!(metric("a:0|ms|:1|ms").samples.len(), 2);
}

#[test]
fn etsy_segments_each_have_their_type() {
    let m = metric("a:1|c:5|ms");
    let kinds: Vec<_> = m.samples.iter().map(|s| s.kind).collect();
    assert_eq!(kinds, [MetricType::Counter, MetricType::Timer]);
    let m = metric("a:1|c|@0.5:5|ms");
    assert_eq!((m.samples[0].rate, m.samples[1].rate), (0.5, 1.0));
}

/// Each segment of a multi-value line is stored or counted as bad, never dropped unsaid: a bad
/// or empty later segment keeps the ones before it and marks the line rejected.
#[test]
fn a_bad_later_segment_keeps_the_ones_before_it() {
    for (case, line, kept, reason) in [
        ("a bad value", "a:1|c:x|c", 1, BadLine::InvalidValue),
        (
            "an empty segment at the end",
            "a:1|c:",
            1,
            BadLine::MissingType,
        ),
        (
            "an empty value list",
            "a:1|c:2|ms:|c",
            2,
            BadLine::EmptyValue,
        ),
        ("an unknown type", "a:1|c:2|zz", 1, BadLine::UnknownType),
        (
            "a bad packed value",
            "a:1|c:2:x|ms",
            1,
            BadLine::InvalidValue,
        ),
        ("a bad rate", "a:1|c:2|ms|@2", 1, BadLine::InvalidSampleRate),
    ] {
        let m = metric(line);
        assert_eq!(
            (m.samples.len(), m.rejected),
            (kept, Some(reason)),
            "{case}"
        );
    }
    assert_eq!(
        bad(b"a:x|c:1|c"),
        BadLine::InvalidValue,
        "a bad first segment"
    );
    assert_eq!(metric("a:1|c:2|ms").rejected, None);
}

/// The tag styles statsd_exporter takes besides DogStatsD and InfluxDB, into the same series.
#[test]
fn librato_and_signalfx_tags() {
    for (case, line, name, tags) in [
        (
            "InfluxDB",
            "web.hits,env=prod,dc=a:1|c",
            "web.hits",
            "env=prod,dc=a",
        ),
        (
            "Librato",
            "web.hits#env=prod,dc=a:1|c",
            "web.hits",
            "env=prod,dc=a",
        ),
        (
            "SignalFx",
            "web.hits[env=prod,dc=a]:1|c",
            "web.hits",
            "env=prod,dc=a",
        ),
        (
            "SignalFx mid-name",
            "web[env=prod].hits:1|c",
            "web.hits",
            "env=prod",
        ),
    ] {
        let m = metric(line);
        assert_eq!((&*m.name, m.influx_tags), (name, Some(tags)), "{case}");
    }
    assert_eq!(
        bad(b"a#k=v:1|c|#x:y"),
        BadLine::MixedTagStyles,
        "Librato tags and DogStatsD tags on one line"
    );
}

#[test]
fn dogstatsd_packed_values() {
    assert_eq!(metric("a:1:2:3|ms").samples.len(), 3);
    assert_eq!(metric("a:1::2|ms").samples.len(), 2);
}

#[test]
fn set_member_is_raw_text() {
    assert_eq!(metric("a:1:2|s").samples[0].value, Value::Member(b"1:2"));
}

#[test]
fn gauge_sign_means_delta() {
    assert_eq!(metric("a:+5|g").samples[0].value, Value::GaugeDelta(5.0));
    assert_eq!(metric("a:-3|g").samples[0].value, Value::GaugeDelta(-3.0));
    assert_eq!(metric("a:10|g").samples[0].value, Value::Number(10.0));
    assert_eq!(metric("a:-3|c").samples[0].value, Value::Number(-3.0));
}

#[test]
fn influx_tags_stay_in_the_name_part() {
    let m = metric("a,env=prod:1|c");
    assert_eq!((&*m.name, m.influx_tags), ("a", Some("env=prod")));
}

#[test]
fn bad_lines_by_reason() {
    let cases: &[(&[u8], BadLine)] = &[
        (b"a", BadLine::MissingValue),
        (b"a:1", BadLine::MissingType),
        (b"a:1|", BadLine::MissingType),
        (b":1|c", BadLine::EmptyName),
        (b",x=1:1|c", BadLine::EmptyName),
        (b"a:|c", BadLine::EmptyValue),
        (b"a:::|c", BadLine::EmptyValue),
        (b"a:|s", BadLine::EmptyValue),
        (b"a:1|x", BadLine::UnknownType),
        (b"a:1|C", BadLine::UnknownType),
        (b"a:NaN|g", BadLine::InvalidValue),
        (b"a:inf|g", BadLine::InvalidValue),
        (b"a:0x10|c", BadLine::InvalidValue),
        (b"a:12abc|c", BadLine::InvalidValue),
        (b"a: 1|c", BadLine::InvalidValue),
        (b"a:x|c:1|ms", BadLine::InvalidValue),
        (b"a:2|c|@0", BadLine::InvalidSampleRate),
        (b"a:2|c|@1.5", BadLine::InvalidSampleRate),
        (b"a:2|c|@-0.5", BadLine::InvalidSampleRate),
        (b"a:2|c|@abc", BadLine::InvalidSampleRate),
        (b"a:2|c|@", BadLine::InvalidSampleRate),
        (b"a:2|c|@ 0.5", BadLine::InvalidSampleRate),
        (b"a,env=prod:1|c|#x:y", BadLine::MixedTagStyles),
        (b"a\xff:1|c", BadLine::InvalidUtf8),
        (b"a:1|c|#\xff", BadLine::InvalidUtf8),
    ];
    for (line, reason) in cases {
        assert_eq!(bad(line), *reason, "{:?}", String::from_utf8_lossy(line));
    }
}

#[test]
fn lines_split_on_newlines_and_skip_empty_ones() {
    let got: Vec<_> = lines(b"a:1|c\r\n\nb:2|c\n").collect();
    assert_eq!(got, [&b"a:1|c"[..], b"b:2|c"]);
}

#[test]
fn whole_lines_of_a_truncated_datagram() {
    assert_eq!(whole_lines(b"a:1|c\nb:2"), (&b"a:1|c"[..], true));
    assert_eq!(whole_lines(b"a:1|c\n"), (&b"a:1|c"[..], false));
    assert_eq!(whole_lines(b"a:1|c"), (&b""[..], true));
}

#[test]
fn event_with_fields() {
    let Ok(Line::Event(e)) = parse_line(b"_e{5,4}:title|text|t:error|s:db|#service:api,x") else {
        panic!()
    };
    assert_eq!(
        (e.title, &*e.text, e.alert_type),
        ("title", "text", AlertType::Error)
    );
    assert_eq!((e.source, e.tags), (Some("db"), Some("service:api,x")));
}

#[test]
fn event_lengths_are_checked() {
    assert!(matches!(
        parse_line(b"_e{5,4}:title|text"),
        Ok(Line::Event(_))
    ));
    assert!(matches!(parse_line(b"_e{5,0}:title|"), Ok(Line::Event(_))));
    for line in [
        &b"_e{9,4}:title|text"[..],
        b"_e{5,3}:title|text",
        b"_e{5,4}:titl|etext",
        b"_e{x,4}:title|text",
        b"_e{5,4}title|text",
        b"_e{0,4}:|text",
    ] {
        assert_eq!(
            bad(line),
            BadLine::InvalidEvent,
            "{:?}",
            String::from_utf8_lossy(line)
        );
    }
}

#[test]
fn service_checks() {
    let Ok(Line::ServiceCheck(sc)) = parse_line(b"_sc|db|2|h:host1|#env:prod|m:down hard") else {
        panic!()
    };
    assert_eq!((sc.name, sc.status), ("db", 2));
    assert_eq!(
        (sc.host, sc.tags, sc.message.as_deref()),
        (Some("host1"), Some("env:prod"), Some("down hard"))
    );
    for line in [&b"_sc|db|4"[..], b"_sc||0", b"_sc|db", b"_sc|db|x|m:y"] {
        assert_eq!(bad(line), BadLine::InvalidServiceCheck);
    }
}

/// The DogStatsD details the reference parsers (datadog-agent, Telegraf) agree on, a case each:
/// the line, then what is kept: message (or event text), tags, unknown fields.
#[test]
fn dogstatsd_event_and_service_check_cases() {
    /// Case, line, message or text kept, tags, unknown fields.
    type Case = (
        &'static str,
        &'static [u8],
        &'static str,
        Option<&'static str>,
        u32,
    );
    let cases: [Case; 9] = [
        (
            "fields after the message are not part of it",
            b"_sc|db|1|m:slow|c:abc123|card:high|#env:prod",
            "slow",
            Some("env:prod"),
            0,
        ),
        (
            "the message may come first",
            b"_sc|db|1|m:slow|h:host1",
            "slow",
            None,
            0,
        ),
        (
            "an escaped newline in a message",
            b"_sc|db|2|m:line one\\nline two",
            "line one\nline two",
            None,
            0,
        ),
        (
            "a check's unparseable timestamp is ignored and counted",
            b"_sc|db|0|d:abc|m:fine",
            "fine",
            None,
            1,
        ),
        (
            "a check's unknown field is ignored and counted",
            b"_sc|db|0|x:1|m:fine",
            "fine",
            None,
            1,
        ),
        (
            "an escaped newline in an event's text",
            b"_e{5,9}:title|one\\ntwo!|#env:a",
            "one\ntwo!",
            Some("env:a"),
            0,
        ),
        (
            "an event's unknown alert type is ignored and counted",
            b"_e{5,4}:title|text|t:test|s:db",
            "text",
            None,
            1,
        ),
        (
            "an event's unparseable timestamp is ignored and counted",
            b"_e{5,4}:title|text|d:abc|p:low",
            "text",
            None,
            1,
        ),
        (
            "an event's container id is not an unknown field",
            b"_e{5,4}:title|text|c:abc|card:low",
            "text",
            None,
            0,
        ),
    ];
    for (case, line, text, tags, unknown) in cases {
        let got = match parse_line(line) {
            Ok(Line::ServiceCheck(sc)) => (
                sc.message.unwrap_or_default().into_owned(),
                sc.tags,
                sc.unknown_fields,
            ),
            Ok(Line::Event(e)) => (e.text.into_owned(), e.tags, e.unknown_fields),
            other => panic!("{case}: {other:?}"),
        };
        assert_eq!(got, (text.to_string(), tags, unknown), "{case}");
    }
    let Ok(Line::Event(e)) = parse_line(b"_e{5,4}:title|text|t:test|t:error") else {
        panic!()
    };
    assert_eq!(
        e.alert_type,
        AlertType::Error,
        "a later good field still counts"
    );
}

mod never_panics {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]
        #[test]
        fn on_arbitrary_bytes(data in proptest::collection::vec(any::<u8>(), 0..200)) {
            let mut namer = SeriesNamer::new(true);
            for line in lines(&data) {
                if let Ok(Line::Metric(m)) = parse_line(line) {
                    for s in &m.samples {
                        let _ = namer.series(&m.name, m.influx_tags, s.tags);
                    }
                }
            }
        }

        #[test]
        fn plain_fast_path_agrees_with_the_full_parser(data in "[a-z.=; _,/-]{0,6}:[-+0-9.ea:]{0,5}\\|(c|ms|g|s|h|d|x|)(\\|@[0-9.:e]{0,4}|\\|#[a-z:]{0,4}|:[0-9]\\|c|\\|T[0-9]{0,3}|\\|c:x|)") {
            for line in lines(data.as_bytes()) {
                if let Some((name, sample, used)) = parse_plain(line) {
                    prop_assert_eq!(used, line.len());
                    let Ok(Line::Metric(m)) = parse_line(line) else {
                        return Err(TestCaseError::fail(format!("{line:?}: fast path accepted a line the parser rejects")));
                    };
                    prop_assert_eq!(&*m.name, name);
                    prop_assert_eq!(m.influx_tags, None);
                    prop_assert_eq!(m.unknown_fields, 0);
                    prop_assert_eq!(&m.samples[..], &[sample][..]);
                    let mut namer = SeriesNamer::new(true);
                    prop_assert_eq!(namer.series(&m.name, None, None), Ok((name, false)));
                }
            }
        }

        #[test]
        fn plain_name_len_agrees_with_the_table(data in proptest::collection::vec(any::<u8>(), 0..70)) {
            let want = data.iter().position(|&b| !PLAIN_NAME[usize::from(b)]).unwrap_or(data.len());
            prop_assert_eq!(plain_name_len(&data), want);
        }

        #[test]
        fn on_protocol_shaped_bytes(data in "[a-z_:|@#,=.\\-+0-9ecgmshdT{}\n\r ]{0,120}") {
            let mut namer = SeriesNamer::new(true);
            for line in lines(data.as_bytes()) {
                if let Ok(Line::Metric(m)) = parse_line(line) {
                    prop_assert!(!m.samples.is_empty());
                    for s in &m.samples {
                        prop_assert!(s.rate > 0.0 && s.rate <= 1.0);
                        let _ = namer.series(&m.name, m.influx_tags, s.tags);
                    }
                }
            }
        }
    }
}

#[test]
fn plain_names_of_every_length() {
    // Long enough for whole 16-byte blocks, the first non-name byte at every position.
    for len in 0..40 {
        for stop in [b':', b' ', b'\n', b'|', b',', b'#', 0x80, 0xff] {
            let mut line = "a.b-c_d;e=f9Z".repeat(4).into_bytes();
            line.truncate(len);
            line.push(stop);
            line.extend_from_slice(b"xyz:1|c");
            assert_eq!(
                plain_name_len(&line),
                len,
                "{:?}",
                String::from_utf8_lossy(&line)
            );
        }
    }
}

#[test]
fn plain_fast_path_takes_the_common_lines_and_leaves_the_rest() {
    fn plain(l: &[u8]) -> Option<(String, MetricType, Value<'_>, f64)> {
        parse_plain(l).map(|(n, s, _)| (n.to_string(), s.kind, s.value, s.rate))
    }
    assert_eq!(
        plain(b"web.requests:1|c"),
        Some((
            "web.requests".into(),
            MetricType::Counter,
            Value::Number(1.0),
            1.0
        ))
    );
    assert_eq!(
        plain(b"api.latency:12.5|ms|@0.5"),
        Some((
            "api.latency".into(),
            MetricType::Timer,
            Value::Number(12.5),
            0.5
        ))
    );
    assert_eq!(
        plain(b"q:-3|g"),
        Some(("q".into(), MetricType::Gauge, Value::GaugeDelta(-3.0), 1.0))
    );
    // On a datagram: the first line, and the bytes it took with its newline.
    let used = |d: &[u8]| parse_plain(d).map(|(_, _, used)| used);
    assert_eq!(used(b"a:1|c\nb:2|c"), Some(6));
    assert_eq!(used(b"api.latency:12.5|ms|@0.5\nb:2|c"), Some(25));
    assert_eq!(used(b"a:1|c"), Some(5));
    assert_eq!(used(b"a:1|c\r\nb:2|c"), None);
    assert_eq!(used(b"a:1\nb:2|c"), None);
    for other in [
        &b"web.requests:1|c|#env:prod"[..],
        b"web.requests,env=prod:1|c",
        b"my page:1|c",
        b"a:1:2|c",
        b"a:1|c:5|ms",
        b"a:1|c|@0.5:2|c",
        b"users:alice|s",
        b"a:1|c|T1700000000",
        b"a:1|x",
        b"a:x|c",
        b"a:1|c|@2",
        b":1|c",
        b"_sc|db|0",
        b"_e{1,1}:a|b",
    ] {
        assert_eq!(plain(other), None, "{}", String::from_utf8_lossy(other));
    }
}
