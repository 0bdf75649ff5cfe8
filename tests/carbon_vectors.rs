//! Carbon's own receiver tests (its `test_protocols.py`: valid and invalid lines, datagrams of
//! several lines, UTF-8 names, `-1`, NaN, pickles valid, malformed and of the wrong shapes) as
//! vectors (`tests/carbon/protocol_vectors.json`, made by `scripts/carbon-vectors.py` with
//! Python's own pickle module), run through the agent's carbon receivers: the points each case
//! records are those carbon's `metricReceived` is called with.

use statsd_redis::aggregate::Window;
use statsd_redis::ingest::{LineHandler, Transport};

fn unhex(text: &str) -> Vec<u8> {
    (0..text.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&text[i..i + 2], 16).unwrap())
        .collect()
}

#[test]
fn carbons_own_protocol_cases() {
    let text = include_str!("carbon/protocol_vectors.json");
    let vectors: serde_json::Value = serde_json::from_str(text).unwrap();
    let cases = vectors["cases"].as_array().unwrap();
    assert!(cases.len() >= 20, "{} cases", cases.len());
    for case in cases {
        let name = case["name"].as_str().unwrap();
        let data = unhex(case["hex"].as_str().unwrap());
        let transport = match case["transport"].as_str().unwrap() {
            "line" => Transport::CarbonTcp,
            "datagram" => Transport::CarbonUdp,
            _ => Transport::CarbonPickle,
        };
        let mut handler = LineHandler::new(true, usize::MAX).for_transport(transport);
        let mut window = Window::default();
        let before = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        match transport {
            Transport::CarbonTcp => handler.handle_lines(&data, &mut window),
            Transport::CarbonUdp => handler.handle_datagram(&data, false, &mut window),
            _ => handler.handle_pickle(&data, &mut window),
        }
        let mut got: Vec<(String, f64, f64)> = window
            .points
            .iter()
            .flat_map(|(s, points)| points.iter().map(|&(at, v)| (s.to_string(), at, v)))
            .collect();
        got.sort_by(|a, b| a.1.total_cmp(&b.1));
        let want = case["points"].as_array().unwrap();
        assert_eq!(got.len(), want.len(), "{name}: {got:?}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!(g.0, w[0].as_str().unwrap(), "{name}");
            match w[1].as_str() {
                // time.time() when the line came.
                Some("now") => assert!((g.1 - before).abs() < 5.0, "{name}: {g:?}"),
                _ => assert_eq!(g.1, w[1].as_f64().unwrap(), "{name}"),
            }
            assert_eq!(g.2, w[2].as_f64().unwrap(), "{name}");
        }
        // What carbon drops is counted: a bad line, an item skipped, NaN.
        let dropped = handler.tally.bad_lines() + window.points_nan;
        let lines = handler.tally.lines;
        assert_eq!(
            lines,
            dropped + want.len() as u64,
            "{name}: every line or item either a point or counted"
        );
    }
}
