//! Graphite's times (`from`, `until`, `now`), read as graphite-web's `parseATTime` reads them, in
//! UTC: `now`, an offset from it (`-5min`, `-1h30min`, `-7d`, `-1mon` = 30 days, `-1y` = 365
//! days; a unit is known by its first letters: `s`, `min`, `h`, `d`, `w`, `mon`, `y`, so `-5m`
//! is an error, as there), Unix seconds, and a reference with an offset: `HH:MM`, `noon`,
//! `midnight`, `teatime`, `Xam`/`Xpm`, then `today`/`yesterday`/`tomorrow`, `YYYYMMDD`,
//! `MM/DD/YY[YY]`, a month name and day (`oct9`), or a weekday (`HH:MM_YYYYMMDD` is 09:00 of
//! that day). Spaces, `_` and `,` are dropped first.

use crate::store::clock::{MONTHS, civil_from_days, days_from_civil};
/// The years a time may fall in, as Python's `datetime` (graphite-web's) has them, and the
/// same as Unix seconds (0001-01-01 00:00:00 to 9999-12-31 23:59:59).
const YEARS: std::ops::RangeInclusive<i64> = 1..=9999;
const SECONDS: std::ops::RangeInclusive<i64> = -62_135_596_800..=253_402_300_799;
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// `text` as Unix seconds, `now` being Unix seconds; an error says what it could not read, in
/// graphite-web's words.
pub fn parse(text: &str, now: i64) -> Result<i64, String> {
    let s: String = text
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| !matches!(c, '_' | ',' | ' '))
        .collect();
    if !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()) {
        let ymd = s.len() == 8
            && s[..4].parse::<u32>().is_ok_and(|y| y > 1900)
            && s[4..6].parse::<u32>().is_ok_and(|m| m < 13)
            && s[6..].parse::<u32>().is_ok_and(|d| d < 32);
        if !ymd {
            return s
                .parse()
                .ok()
                .filter(|t| in_range(*t))
                .ok_or_else(|| format!("Invalid timestamp: {s}"));
        }
    }
    let (reference, offset) = match s.find('+').or_else(|| s.find('-')) {
        Some(at) => (&s[..at], &s[at..]),
        None => (s.as_str(), ""),
    };
    reference_time(reference, now)?
        .checked_add(offset_secs(offset)?)
        .filter(|t| in_range(*t))
        .ok_or_else(|| format!("year is out of range: {text}"))
}

/// Whether Unix seconds `t` fall in the years a time may have (1 to 9999).
pub fn in_range(t: i64) -> bool {
    SECONDS.contains(&t)
}

/// A civil time of day on `now`'s date, in seconds.
fn reference_time(reference: &str, now: i64) -> Result<i64, String> {
    if reference.is_empty() || reference == "now" {
        return Ok(now);
    }
    let mut r = reference;
    let (mut hour, mut minute) = (0i64, 0i64);
    let number = |t: &str| -> Result<i64, String> {
        t.parse()
            .map_err(|_| format!("invalid literal for int() with base 10: '{t}'"))
    };
    if let Some(i) = r.find(':').filter(|i| (1..3).contains(i)) {
        hour = number(&r[..i])?;
        // The two characters after the `:`.
        let end = r[i + 1..]
            .char_indices()
            .nth(2)
            .map_or(r.len(), |(j, _)| i + 1 + j);
        minute = number(&r[i + 1..end])?;
        r = &r[end..];
        if let Some(rest) = r.strip_prefix("am") {
            r = rest;
        } else if let Some(rest) = r.strip_prefix("pm") {
            hour = (hour + 12) % 24;
            r = rest;
        }
    }
    if let Some(i) = r.find("am").filter(|i| (1..3).contains(i)) {
        hour = number(&r[..i])?;
        r = &r[i + 2..];
    }
    if let Some(i) = r.find("pm").filter(|i| (1..3).contains(i)) {
        hour = (number(&r[..i])? + 12) % 24;
        r = &r[i + 2..];
    }
    for (word, h) in [("noon", 12), ("midnight", 0), ("teatime", 16)] {
        if let Some(rest) = r.strip_prefix(word) {
            (hour, minute) = (h, 0);
            r = rest;
            break;
        }
    }
    let today = now.div_euclid(86400);
    let (year, _, _) = civil_from_days(today);
    let head = r.get(..3).unwrap_or("");
    let month_of = |name: &str| MONTHS.iter().position(|m| m.eq_ignore_ascii_case(name));
    let day = match r {
        "" | "today" => today,
        "yesterday" => today - 1,
        "tomorrow" => today + 1,
        _ if r.matches('/').count() == 2 => {
            let parts: Vec<i64> = r.split('/').map(number).collect::<Result<_, _>>()?;
            let (m, d, mut y) = (parts[0], parts[1], parts[2]);
            if y < 1900 {
                y += 1900;
            }
            if y < 1970 {
                y += 100;
            }
            date(y, m, d)?
        }
        _ if r.len() == 8 && r.bytes().all(|b| b.is_ascii_digit()) => {
            date(number(&r[..4])?, number(&r[4..6])?, number(&r[6..])?)?
        }
        _ if month_of(head).is_some() => {
            let month = month_of(head).unwrap_or(0) as i64 + 1;
            let tail = r.as_bytes();
            let d = if r.len() >= 2 && tail[r.len() - 2..].iter().all(u8::is_ascii_digit) {
                number(&r[r.len() - 2..])?
            } else if tail.last().is_some_and(u8::is_ascii_digit) {
                number(&r[r.len() - 1..])?
            } else {
                return Err("Day of month required after month name".into());
            };
            date(year, month, d)?
        }
        _ if WEEKDAYS.contains(&head) => {
            // 1970-01-01 was a Thursday.
            let weekday = (today + 4).rem_euclid(7);
            let wanted = WEEKDAYS.iter().position(|w| *w == head).unwrap_or(0) as i64;
            today - (weekday - wanted).rem_euclid(7)
        }
        _ => return Err(format!("Unknown day reference: {reference}")),
    };
    Ok(day * 86400 + hour * 3600 + minute * 60)
}

/// Days since the epoch of a civil date, checked.
fn date(year: i64, month: i64, day: i64) -> Result<i64, String> {
    if !YEARS.contains(&year) {
        return Err(format!("year {year} is out of range"));
    }
    if !(1..=12).contains(&month) {
        return Err("month must be in 1..12".into());
    }
    let days = days_from_civil(year, month as u32, 1) + day - 1;
    if day < 1 || civil_from_days(days).1 != month as u32 {
        return Err("day is out of range for month".into());
    }
    Ok(days)
}

/// `+1h30min`, `-5min`: signed seconds.
fn offset_secs(offset: &str) -> Result<i64, String> {
    if offset.is_empty() {
        return Ok(0);
    }
    let (sign, mut rest) = match offset.as_bytes()[0] {
        b'+' => (1, &offset[1..]),
        b'-' => (-1, &offset[1..]),
        b'0'..=b'9' => (1, offset),
        _ => return Err(format!("Invalid offset: {offset}")),
    };
    let mut total = 0i64;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        let number: i64 = rest[..digits].parse().map_err(|_| {
            format!(
                "invalid literal for int() with base 10: '{}'",
                &rest[..digits]
            )
        })?;
        rest = &rest[digits..];
        let letters = rest.bytes().take_while(u8::is_ascii_alphabetic).count();
        let unit = &rest[..letters];
        rest = &rest[letters..];
        let seconds = if unit.starts_with('s') {
            1
        } else if unit.starts_with("min") {
            60
        } else if unit.starts_with('h') {
            3600
        } else if unit.starts_with('d') {
            86400
        } else if unit.starts_with('w') {
            7 * 86400
        } else if unit.starts_with("mon") {
            30 * 86400
        } else if unit.starts_with('y') {
            365 * 86400
        } else {
            return Err(format!("Invalid offset unit '{unit}'"));
        };
        total = number
            .checked_mul(sign * seconds)
            .and_then(|n| total.checked_add(n))
            .ok_or_else(|| format!("Invalid offset: {offset} is out of range"))?;
    }
    Ok(total)
}

#[cfg(test)]
mod tests {
    use super::parse;

    /// 2025-10-09 09:13:57 UTC, a Thursday: the oracle's pinned now.
    const NOW: i64 = 1760001237;

    #[test]
    fn times_as_graphite_web_reads_them() {
        for (text, at) in [
            ("now", NOW),
            ("-5min", NOW - 300),
            ("-1h30min", NOW - 5400),
            ("-1H", NOW - 3600),
            ("now-1h", NOW - 3600),
            ("-1w", NOW - 7 * 86400),
            ("-1mon", NOW - 30 * 86400),
            ("-1y", NOW - 365 * 86400),
            ("1760000937", 1760000937),
            ("09:00_20251009", 1760000400),
            ("20251009", 1759968000),
            ("midnight", 1759968000),
            ("10/09/25", 1759968000),
            ("09:00 oct 9", 1760000400),
            ("noon yesterday", 1759924800),
            ("thursday", 1759968000),
            ("mon", 1759708800),
        ] {
            assert_eq!(parse(text, NOW), Ok(at), "{text}");
        }
    }

    #[test]
    fn errors_as_graphite_web_words_them() {
        assert_eq!(parse("-5m", NOW), Err("Invalid offset unit 'm'".into()));
        assert_eq!(
            parse("yesterdayish", NOW),
            Err("Unknown day reference: yesterdayish".into())
        );
    }

    /// Characters of several bytes where a reference's letters or digits are looked for, and
    /// times past Python's years (graphite-web's limit), are errors, never a panic or a wrap.
    #[test]
    fn odd_bytes_and_far_times_are_errors() {
        for text in [
            "0*€?",
            "ééé",
            "1:aé",
            "mo€",
            "12/31/10000",
            "99999999999999999",
            "now+9999999999999999y",
            "-9223372036854775807s-9223372036854775807s",
        ] {
            assert!(parse(text, NOW).is_err(), "{text}");
        }
        assert_eq!(parse("253402300799", NOW), Ok(253_402_300_799));
    }
}
