//! Numbers on the wire: values, sample rates and timestamps, with a strict grammar.
//!
//! `f64::from_str` alone accepts `inf`, `NaN` and `infinity`; StatsD values are plain decimals
//! (`1`, `-5`, `1.5`, `1e3`, `.5`), so the text is checked against that grammar first.

use super::{BadLine, MetricType};

/// Largest counter increment, `value / rate`, in magnitude: 2^53, up to which doubles hold
/// every whole number, so a window's total and its carried fraction stay exact. A stored count
/// has room for 1024 such increments before it would leave the signed 64-bit range.
pub const MAX_INCREMENT: f64 = 9_007_199_254_740_992.0;

/// Largest timer, histogram, distribution or gauge value in magnitude, and largest sample
/// weight `1 / rate`: 2^63. A sum of squares of such samples stays finite for more samples
/// than can ever arrive, so no sum becomes infinite and no difference of two NaN.
pub const MAX_VALUE: f64 = 9_223_372_036_854_775_808.0;

/// Whether a sample of `kind` with this value and rate can be added without leaving the ranges
/// above (sets carry no number and are always in range).
#[inline(always)]
pub fn in_range(kind: MetricType, value: f64, rate: f64) -> bool {
    let weighable = MAX_VALUE * rate >= 1.0;
    match kind {
        MetricType::Counter => value.abs() <= MAX_INCREMENT * rate && weighable,
        MetricType::Gauge | MetricType::Set => value.abs() <= MAX_VALUE,
        _ => value.abs() <= MAX_VALUE && weighable,
    }
}

/// Exact powers of ten: every one up to 1e22 is a double without rounding.
const POW10: [f64; 23] = [
    1e0, 1e1, 1e2, 1e3, 1e4, 1e5, 1e6, 1e7, 1e8, 1e9, 1e10, 1e11, 1e12, 1e13, 1e14, 1e15, 1e16,
    1e17, 1e18, 1e19, 1e20, 1e21, 1e22,
];

/// Parses `[+-]? digits? ('.' digits?)? ([eE] [+-]? digits)?` with at least one mantissa digit.
///
/// Values are almost always short (`1`, `12.5`): with at most 15 significant digits and a power
/// of ten up to 22 both the mantissa and the power are exact doubles, so one multiplication or
/// division rounds correctly (Clinger's fast path). Anything longer goes to `str::parse`, after
/// the same grammar check.
#[inline(always)]
fn parse_decimal(b: &[u8], allow_sign: bool) -> Option<f64> {
    // The usual value, a small whole number (`1`, `250`): exact as a double up to 15 digits.
    if !b.is_empty() && b.len() <= 15 && b.iter().all(u8::is_ascii_digit) {
        let whole = b.iter().fold(0u64, |m, d| m * 10 + u64::from(d - b'0'));
        return Some(whole as f64);
    }
    parse_fraction(b, allow_sign)
}

/// [`parse_decimal`] for anything but a short whole number.
#[inline(never)]
fn parse_fraction(b: &[u8], allow_sign: bool) -> Option<f64> {
    let mut i = 0;
    let negative = allow_sign && b.first() == Some(&b'-');
    if allow_sign && matches!(b.first(), Some(b'+' | b'-')) {
        i += 1;
    }
    let mut mantissa: u64 = 0;
    let mut digits = 0usize; // mantissa digits seen
    let mut significant = 0usize; // digits after leading zeros
    let mut scale: i64 = 0; // digits after the point
    while i < b.len() && b[i].is_ascii_digit() {
        push_digit(&mut mantissa, &mut significant, b[i]);
        digits += 1;
        i += 1;
    }
    if i < b.len() && b[i] == b'.' {
        i += 1;
        while i < b.len() && b[i].is_ascii_digit() {
            push_digit(&mut mantissa, &mut significant, b[i]);
            digits += 1;
            scale += 1;
            i += 1;
        }
    }
    if digits == 0 {
        return None;
    }
    let mut exponent: i64 = 0;
    if i < b.len() && matches!(b[i], b'e' | b'E') {
        i += 1;
        let negative_exp = b.get(i) == Some(&b'-');
        if matches!(b.get(i), Some(b'+' | b'-')) {
            i += 1;
        }
        let start = i;
        while i < b.len() && b[i].is_ascii_digit() {
            exponent = (exponent * 10 + i64::from(b[i] - b'0')).min(100_000);
            i += 1;
        }
        if i == start {
            return None;
        }
        if negative_exp {
            exponent = -exponent;
        }
    }
    if i != b.len() {
        return None;
    }
    let power = exponent - scale;
    let value = if significant <= 15 && power.unsigned_abs() <= 22 {
        let m = mantissa as f64;
        if power >= 0 {
            m * POW10[power as usize]
        } else {
            m / POW10[(-power) as usize]
        }
    } else {
        // The grammar check leaves only ASCII.
        std::str::from_utf8(&b[usize::from(allow_sign && matches!(b[0], b'+' | b'-'))..])
            .ok()?
            .parse()
            .ok()?
    };
    let value = if negative { -value } else { value };
    value.is_finite().then_some(value)
}

fn push_digit(mantissa: &mut u64, significant: &mut usize, d: u8) {
    if *significant > 0 || d != b'0' {
        *significant += 1;
    }
    if *significant <= 19 {
        *mantissa = *mantissa * 10 + u64::from(d - b'0');
    }
}

/// A metric value: a finite decimal, optionally signed.
#[inline]
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
    fn fast_path_agrees_with_the_standard_parser() {
        for text in [
            "0",
            "1",
            "12.5",
            "0.1",
            "0.3",
            "1e-3",
            "123456789012345",
            "1234567890123456789",
            "3.14159",
            "2.5e10",
            "7e22",
            "7e23",
            "1e-22",
            "1e-23",
            "0.000001",
            "99999.99999",
            "-0.0",
            "00012",
            "1.7976931348623157e308",
        ] {
            let expected: f64 = text.parse().unwrap();
            let got = parse_number(text.as_bytes()).unwrap();
            assert_eq!(got.to_bits(), expected.to_bits(), "{text}");
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
    fn values_beyond_exact_sums_are_out_of_range() {
        use MetricType::*;
        // 2^53 is a counter's largest increment, after the rate.
        assert!(in_range(Counter, 9_007_199_254_740_992.0, 1.0));
        assert!(!in_range(Counter, 9_007_199_254_740_994.0, 1.0));
        assert!(!in_range(Counter, 9_223_372_036_854_775_807.0, 1.0));
        assert!(!in_range(Counter, 1.0, 1e-300));
        assert!(!in_range(Counter, -1e300, 1.0));
        assert!(in_range(Counter, 1e-310, 1.0));
        // 1 / 4.9e-324 is infinite, whatever it multiplies.
        assert!(!in_range(Counter, 1e-310, 4.9e-324));
        assert!(in_range(Timer, 9_223_372_036_854_775_807.0, 1.0));
        assert!(!in_range(Timer, 1e300, 1.0));
        // A weight of 1e300 (or of infinity, after a denormal rate).
        assert!(!in_range(Histogram, 1.0, 1e-300));
        assert!(!in_range(Distribution, 1.0, 5e-324));
        assert!(in_range(Distribution, 1.0, 1e-18));
        assert!(!in_range(Gauge, -1e19, 1.0));
        assert!(in_range(Gauge, -1e18, 1e-300));
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

    proptest::proptest! {
        #[test]
        fn fast_path_agrees_on_random_decimals(text in "-?[0-9]{1,20}(\\.[0-9]{0,12})?([eE][-+]?[0-9]{1,3})?") {
            let expected: f64 = text.parse().unwrap();
            match parse_number(text.as_bytes()) {
                Ok(v) => proptest::prop_assert_eq!(v.to_bits(), expected.to_bits(), "{}", text),
                Err(_) => proptest::prop_assert!(!expected.is_finite(), "{}", text),
            }
        }
    }
}
