//! Numbers on the wire: values, sample rates and timestamps, with a strict grammar.
//!
//! `f64::from_str` alone accepts `inf`, `NaN` and `infinity`; StatsD values are plain decimals
//! (`1`, `-5`, `1.5`, `1e3`, `.5`), so the text is checked against that grammar first.

use super::BadLine;

/// True when `b` is `[+-]? digits? ('.' digits?)? ([eE] [+-]? digits)?` with at least one
/// mantissa digit.
fn is_decimal(b: &[u8], allow_sign: bool) -> bool {
    let mut i = 0;
    if allow_sign && matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let digits = |i: &mut usize| {
        let start = *i;
        while *i < b.len() && b[*i].is_ascii_digit() {
            *i += 1;
        }
        *i - start
    };
    let mut mantissa = digits(&mut i);
    if i < b.len() && b[i] == b'.' {
        i += 1;
        mantissa += digits(&mut i);
    }
    if mantissa == 0 {
        return false;
    }
    if i < b.len() && matches!(b[i], b'e' | b'E') {
        i += 1;
        if i < b.len() && matches!(b[i], b'+' | b'-') {
            i += 1;
        }
        if digits(&mut i) == 0 {
            return false;
        }
    }
    i == b.len()
}

fn parse_decimal(b: &[u8], allow_sign: bool) -> Option<f64> {
    if !is_decimal(b, allow_sign) {
        return None;
    }
    // The grammar check leaves only ASCII.
    let v: f64 = std::str::from_utf8(b).ok()?.parse().ok()?;
    v.is_finite().then_some(v)
}

/// A metric value: a finite decimal, optionally signed.
pub fn parse_number(b: &[u8]) -> Result<f64, BadLine> {
    parse_decimal(b, true).ok_or(BadLine::InvalidValue)
}

/// A sample rate: an unsigned decimal with `0 < r <= 1`.
pub fn parse_sample_rate(b: &[u8]) -> Result<f64, BadLine> {
    match parse_decimal(b, false) {
        Some(r) if r > 0.0 && r <= 1.0 => Ok(r),
        _ => Err(BadLine::InvalidSampleRate),
    }
}

/// A unix timestamp in whole seconds.
pub fn parse_timestamp(b: &[u8]) -> Result<u64, BadLine> {
    if b.is_empty() || !b.iter().all(u8::is_ascii_digit) {
        return Err(BadLine::InvalidTimestamp);
    }
    std::str::from_utf8(b)
        .ok()
        .and_then(|s| s.parse().ok())
        .ok_or(BadLine::InvalidTimestamp)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn decimals_are_accepted() {
        for (text, v) in [
            ("1", 1.0),
            ("-5", -5.0),
            ("+5", 5.0),
            ("1.5", 1.5),
            ("1e3", 1000.0),
            ("1E-3", 0.001),
            (".5", 0.5),
            ("5.", 5.0),
        ] {
            assert_eq!(parse_number(text.as_bytes()), Ok(v), "{text}");
        }
    }

    #[test]
    fn non_decimals_are_rejected() {
        for text in [
            "NaN", "nan", "inf", "-inf", "infinity", "0x10", "12abc", " 1", "1 ", "", "-", ".",
            "1e", "1e+", "1..2", "1e999", "--1",
        ] {
            assert_eq!(
                parse_number(text.as_bytes()),
                Err(BadLine::InvalidValue),
                "{text}"
            );
        }
    }

    #[test]
    fn sample_rates() {
        assert_eq!(parse_sample_rate(b"1e-3"), Ok(0.001));
        assert_eq!(parse_sample_rate(b"1"), Ok(1.0));
        for text in ["0", "1.5", "-0.5", "abc", "", " 0.5", "+0.5", "NaN"] {
            assert_eq!(
                parse_sample_rate(text.as_bytes()),
                Err(BadLine::InvalidSampleRate),
                "{text}"
            );
        }
    }

    #[test]
    fn timestamps() {
        assert_eq!(parse_timestamp(b"1700000000"), Ok(1_700_000_000));
        assert_eq!(parse_timestamp(b"-1"), Err(BadLine::InvalidTimestamp));
        assert_eq!(
            parse_timestamp(b"99999999999999999999999"),
            Err(BadLine::InvalidTimestamp)
        );
    }
}
