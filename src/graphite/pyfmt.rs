//! Numbers as graphite-web writes them: Python's `repr` of a float (what `json.dumps` prints:
//! shortest round-trip digits, fixed notation for exponents in [-4, 16), else `1e+16`), and
//! `%g` (six significant digits), which some functions use in the names they give.

/// Python's `repr(float)`: `7.0`, `0.30000000000000004`, `1e+16`, `1e-05`, `-0.0`; NaN and the
/// infinities as Python names them (`nan`, `inf`, `-inf`).
pub fn repr(v: f64, out: &mut String) {
    if v.is_nan() {
        out.push_str("nan");
        return;
    }
    if v.is_infinite() {
        out.push_str(if v > 0.0 { "inf" } else { "-inf" });
        return;
    }
    if let Some(d) = Decimals::of(v) {
        let mut room = [0; VALUE_ROOM];
        let len = d.put(&mut room);
        out.push_str(std::str::from_utf8(&room[..len]).unwrap_or_default());
        return;
    }
    // ryu gives the shortest round-trip digits, as Python's repr has them. From 1e-4 up, where
    // ryu writes no exponent, its layout is Python's (`0.000123`, `22.666666666666668`).
    let mut buffer = ryu::Buffer::new();
    let text = buffer.format_finite(v);
    if v.abs() >= 1e-4 && !text.contains('e') {
        out.push_str(text);
        return;
    }
    layout(text.as_bytes(), out);
}

/// A whole number below 1e16 (counts, mostly), which `repr` writes as its digits and `.0`
/// (`-0.0` is not one). A conversion to an integer and back, not `fract`: without SSE4.1 that
/// is a call into libm a point.
pub fn whole(v: f64) -> Option<i64> {
    (v.abs() < 1e16 && (v as i64) as f64 == v && !(v == 0.0 && v.is_sign_negative()))
        .then_some(v as i64)
}

/// The room a value's text is given: Python's repr of a double is at most 24 bytes
/// (`-2.2250738585072014e-308`), a whole number below 1e16 19 (`-9999999999999998.0`).
pub const VALUE_ROOM: usize = 29;

/// Two digits a pair, `00` to `99`.
const PAIRS: &[u8; 200] = b"\
    0001020304050607080910111213141516171819\
    2021222324252627282930313233343536373839\
    4041424344454647484950515253545556575859\
    6061626364656667686970717273747576777879\
    8081828384858687888990919293949596979899";

/// A value as `repr` writes it when it has few decimals, without ryu: its sign, its whole
/// part, and its fraction's digits as a number of `decimals` digits (`-12.05`: 12, 5, 2).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Decimals {
    pub negative: bool,
    pub whole: u64,
    pub fraction: u64,
    pub decimals: usize,
}

impl Decimals {
    /// A whole number below 1e16 ([`whole`], one decimal: `12.0`) or a value of at most four
    /// decimals between 1e-4 and 1e11 ([`Decimals::of_fraction`]).
    pub fn of(v: f64) -> Option<Decimals> {
        match whole(v) {
            Some(n) => Some(Decimals {
                negative: n < 0,
                whole: n.unsigned_abs(),
                fraction: 0,
                decimals: 1,
            }),
            None => Decimals::of_fraction(v),
        }
    }

    /// A value of at most four decimals between 1e-4 and 1e11: the fewest decimals whose
    /// number reads back as `v` are its shortest round-trip digits (no two numbers of four
    /// decimals there are as close as a unit of the last place, so the digits are the only
    /// ones).
    fn of_fraction(v: f64) -> Option<Decimals> {
        let a = v.abs();
        if !(1e-4..1e11).contains(&a) {
            return None;
        }
        for (decimals, scale) in [(1, 10u64), (2, 100), (3, 1000), (4, 10_000)] {
            // Rounded by adding a half and truncating (`round` is a call into libm): any `m`
            // that reads back as `v` is right, whichever way a tie went.
            let m = (a * scale as f64 + 0.5) as u64;
            if m as f64 / scale as f64 == a {
                return Some(Decimals {
                    negative: v < 0.0,
                    whole: m / scale,
                    fraction: m % scale,
                    decimals,
                });
            }
        }
        None
    }

    /// The number as Python's `repr` writes it (`-12.0`, `1234.05`), at the start of `room`:
    /// its digits written where they go, the whole part two at a time (a copy out of a buffer
    /// of its own would read back bytes just written one at a time, which stalls the
    /// processor; a render's JSON writes its points so). Returns its length.
    pub fn put(self, room: &mut [u8; VALUE_ROOM]) -> usize {
        let decimals = self.decimals.clamp(1, 4);
        let mut m = self.whole;
        let sign = usize::from(self.negative);
        let end =
            (sign + m.checked_ilog10().unwrap_or(0) as usize + 1).min(VALUE_ROOM - 1 - decimals);
        let mut at = end;
        while m >= 10 && at >= 2 {
            let pair = (m % 100) as usize * 2;
            m /= 100;
            at -= 2;
            room[at..at + 2].copy_from_slice(&PAIRS[pair..pair + 2]);
        }
        if at > sign {
            at -= 1;
            room[at] = b'0' + (m % 10) as u8;
        }
        if self.negative {
            room[0] = b'-';
        }
        room[end] = b'.';
        let mut fraction = self.fraction;
        for i in (1..=decimals).rev() {
            room[end + i] = b'0' + (fraction % 10) as u8;
            fraction /= 10;
        }
        end + 1 + decimals
    }
}

/// ryu's text of a finite float laid out again as Python lays it out, without an allocation.
fn layout(text: &[u8], out: &mut String) {
    let (sign, text) = match text.strip_prefix(b"-") {
        Some(t) => ("-", t),
        None => ("", text),
    };
    let (mantissa, exp) = match text.iter().position(|b| *b == b'e') {
        Some(at) => (
            &text[..at],
            std::str::from_utf8(&text[at + 1..])
                .ok()
                .and_then(|e| e.parse::<i32>().ok())
                .unwrap_or(0),
        ),
        None => (text, 0),
    };
    // The significant digits and the power of ten of the first: `mantissa × 10^exp` is
    // `0.d1d2… × 10^(exponent + 1)`.
    let mut digits = [0u8; 40];
    let mut n = 0;
    let mut point = mantissa.len();
    for (i, b) in mantissa.iter().enumerate() {
        if *b == b'.' {
            point = i;
        } else if n < digits.len() {
            digits[n] = *b;
            n += 1;
        }
    }
    let leading = digits[..n].iter().take_while(|d| **d == b'0').count();
    let digits_all = &digits[leading..n];
    let trailing = digits_all.iter().rev().take_while(|d| **d == b'0').count();
    let digits = &digits_all[..digits_all.len() - trailing];
    let digits = std::str::from_utf8(digits).unwrap_or("0");
    let exponent = point as i32 - 1 - leading as i32 + exp;
    out.push_str(sign);
    if (-4..16).contains(&exponent) {
        if exponent < 0 {
            out.push_str("0.");
            for _ in 0..(-exponent - 1) {
                out.push('0');
            }
            out.push_str(digits);
        } else {
            let point = exponent as usize + 1;
            if digits.len() <= point {
                out.push_str(digits);
                for _ in digits.len()..point {
                    out.push('0');
                }
                out.push_str(".0");
            } else {
                out.push_str(&digits[..point]);
                out.push('.');
                out.push_str(&digits[point..]);
            }
        }
    } else {
        out.push_str(&digits[..1]);
        if digits.len() > 1 {
            out.push('.');
            out.push_str(&digits[1..]);
        }
        out.push('e');
        out.push(if exponent < 0 { '-' } else { '+' });
        if exponent.abs() < 10 {
            out.push('0');
        }
        integer(i64::from(exponent.abs()), out);
    }
}

/// An integer's digits, without the formatting machinery (a render writes one per point).
pub fn integer(n: i64, out: &mut String) {
    out.push_str(itoa::Buffer::new().format(n));
}

/// [`repr`] into a new string.
pub fn repr_string(v: f64) -> String {
    let mut s = String::new();
    repr(v, &mut s);
    s
}

/// Python's `'%g' % v`: six significant digits, trailing zeros dropped, exponent notation below
/// 1e-4 or from 1e6 on (`0.5`, `100`, `1e+06`, `1e-05`).
pub fn percent_g(v: f64) -> String {
    if v.is_nan() {
        return "nan".into();
    }
    if v.is_infinite() {
        return if v > 0.0 { "inf" } else { "-inf" }.into();
    }
    if v == 0.0 {
        return if v.is_sign_negative() { "-0" } else { "0" }.into();
    }
    // The exponent after rounding to six significant digits.
    let sci = format!("{v:.5e}");
    let (mantissa, exponent) = sci.split_once('e').unwrap_or((&sci, "0"));
    let exponent: i32 = exponent.parse().unwrap_or(0);
    let trim = |s: &str| -> String {
        if s.contains('.') {
            s.trim_end_matches('0').trim_end_matches('.').to_string()
        } else {
            s.to_string()
        }
    };
    if (-4..6).contains(&exponent) {
        let decimals = (5 - exponent).max(0) as usize;
        trim(&format!("{v:.decimals$}"))
    } else {
        format!(
            "{}e{}{:02}",
            trim(mantissa),
            if exponent < 0 { '-' } else { '+' },
            exponent.abs()
        )
    }
}

/// A number for JSON as graphite-web's `json.dumps` writes it, with its replacement of NaN by
/// `null` and infinity by `1e9999`.
pub fn json_number(v: f64, out: &mut String) {
    if v.is_nan() {
        out.push_str("null");
    } else if v.is_infinite() {
        out.push_str(if v > 0.0 { "1e9999" } else { "-1e9999" });
    } else {
        repr(v, out);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn floats_as_python_writes_them() {
        for (v, text) in [
            (7.0, "7.0"),
            (0.1 + 0.2, "0.30000000000000004"),
            (22.666666666666668, "22.666666666666668"),
            (1e16, "1e+16"),
            (9999999999999998.0, "9999999999999998.0"),
            (2.3e21, "2.3e+21"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (-0.0, "-0.0"),
            (123456.789, "123456.789"),
            (-1.5e-7, "-1.5e-07"),
            (-42.0, "-42.0"),
            (9007199254740993.0, "9007199254740992.0"),
            (1.0e100, "1e+100"),
            (0.5, "0.5"),
        ] {
            assert_eq!(repr_string(v), text, "{v}");
        }
    }

    /// Whole numbers of each length, and at each edge of one, written by [`Decimals::put`] as
    /// Rust writes them with one decimal (the render's JSON writes its points with `put` too).
    #[test]
    fn whole_numbers_as_python_writes_them() {
        for e in 0..16 {
            let p = 10f64.powi(e);
            for v in [p - 1.0, p, p + 1.0, -p, -(p - 1.0)] {
                assert_eq!(repr_string(v), format!("{v:.1}"), "{v:e}");
            }
        }
    }

    /// ryu's own layout, where [`repr`] takes it, is the one Python's rules give.
    #[test]
    fn ryus_layout_is_pythons_where_it_is_taken() {
        let mut state = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..200_000 {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            // Half of them spread over the powers of ten around the fixed layout's bounds.
            let v = if state.is_multiple_of(2) {
                f64::from_bits(state)
            } else {
                (state >> 11) as f64 / (1u64 << 53) as f64 * 10f64.powi((state % 24) as i32 - 6)
            };
            if !v.is_finite() {
                continue;
            }
            let (mut fast, mut general) = (String::new(), String::new());
            repr(v, &mut fast);
            layout(ryu::Buffer::new().format_finite(v).as_bytes(), &mut general);
            if v.fract() != 0.0 || v.abs() >= 1e16 {
                assert_eq!(fast, general, "{v:e}");
            }
        }
        // Numbers of a few decimals, the quick way's.
        for m in (1..2_000_000u64).step_by(61) {
            for scale in [10.0, 100.0, 1000.0, 10_000.0, 100_000.0] {
                for v in [
                    m as f64 / scale,
                    -(m as f64) / scale,
                    m as f64 * 37.0 / scale,
                ] {
                    let (mut fast, mut general) = (String::new(), String::new());
                    repr(v, &mut fast);
                    layout(ryu::Buffer::new().format_finite(v).as_bytes(), &mut general);
                    if v.fract() != 0.0 {
                        assert_eq!(fast, general, "{v:e}");
                    }
                }
            }
        }
        for v in [
            1e-4,
            0.00012345,
            1.5,
            123.25,
            1e15 + 0.5,
            0.1,
            0.0005,
            10.05,
            -0.3,
        ] {
            let mut general = String::new();
            layout(ryu::Buffer::new().format_finite(v).as_bytes(), &mut general);
            assert_eq!(repr_string(v), general, "{v:e}");
        }
    }

    #[test]
    fn percent_g_as_python_writes_it() {
        for (v, text) in [
            (0.5, "0.5"),
            (100.0, "100"),
            (2.0, "2"),
            (1e6, "1e+06"),
            (123456.0, "123456"),
            (1234567.0, "1.23457e+06"),
            (1e-5, "1e-05"),
            (0.0001, "0.0001"),
            (1e20, "1e+20"),
            (0.3333333, "0.333333"),
            (-2.5, "-2.5"),
        ] {
            assert_eq!(percent_g(v), text, "{v}");
        }
    }
}
