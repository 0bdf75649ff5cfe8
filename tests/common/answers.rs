//! Comparing JSON answers as the Graphite API's tests compare them with graphite-web's (the
//! oracle test and `examples/graphite_latency.rs`).

use serde_json::Value;

/// A JSON answer with graphite-web's infinities (`1e9999`, beyond what a double parses) as
/// strings, as `probe.py` keeps them.
pub fn finite(body: &str) -> String {
    body.replace("-1e9999", "\"-inf\"")
        .replace("1e9999", "\"1e9999\"")
        .replace("\"-inf\"", "\"-1e9999\"")
}

/// Where two parsed answers differ: numbers within 1e-9 (relative), everything else equal.
pub fn differences(want: &Value, got: &Value, at: &str, out: &mut Vec<String>) {
    match (want, got) {
        (Value::Number(a), Value::Number(b)) => {
            let (a, b) = (
                a.as_f64().unwrap_or(f64::NAN),
                b.as_f64().unwrap_or(f64::NAN),
            );
            if (a - b).abs() > 1e-9 * a.abs().max(b.abs()).max(1.0) {
                out.push(format!("{at}: {a} != {b}"));
            }
        }
        (Value::Object(a), Value::Object(b)) => {
            let keys = |o: &serde_json::Map<String, Value>| {
                let mut k: Vec<String> = o.keys().cloned().collect();
                k.sort();
                k
            };
            if keys(a) != keys(b) {
                out.push(format!("{at}: keys {:?} != {:?}", keys(a), keys(b)));
            }
            for (k, v) in a {
                if let Some(w) = b.get(k) {
                    differences(v, w, &format!("{at}.{k}"), out);
                }
            }
        }
        (Value::Array(a), Value::Array(b)) => {
            if a.len() != b.len() {
                out.push(format!("{at}: length {} != {}", a.len(), b.len()));
            }
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                differences(x, y, &format!("{at}[{i}]"), out);
            }
        }
        (a, b) if a != b => out.push(format!("{at}: {a} != {b}")),
        _ => {}
    }
}
