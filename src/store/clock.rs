//! The agent's [`Clock`], and the two time strings of the book's layout, in UTC: the hour of `stats:` / `common:` rollover
//! (`YYYY-MM-DDTHH:00:00`, Python's `datetime(...).isoformat()`) and the `time.asctime()` prefix
//! of `recent:` log lines (`Sun Nov 22 04:30:00 2026`).

use std::sync::Arc;
use std::time::Duration;

/// The agent's time: the system's, or one a test sets and moves ([`Clock::manual`]). The
/// closer's window boundaries, the writer's "now" (expiry times, the skew to Redis's clock),
/// the cleaner's passes and the HTTP side's "now" all read the one clock the agent was given,
/// so that a test can put the agent at any moment and move it on without waiting.
#[derive(Clone, Debug)]
pub struct Clock(Option<Arc<tokio::sync::watch::Sender<Duration>>>);

impl Clock {
    /// The system's clock.
    pub fn system() -> Clock {
        Clock(None)
    }

    /// A clock that stands at `at` (since the epoch) until [`Clock::advance`] moves it.
    pub fn manual(at: Duration) -> Clock {
        Clock(Some(Arc::new(tokio::sync::watch::Sender::new(at))))
    }

    /// Time since the epoch now.
    pub fn now(&self) -> Duration {
        match &self.0 {
            None => since_epoch(),
            Some(manual) => *manual.borrow(),
        }
    }

    /// [`Clock::now`] in whole seconds.
    pub fn unix_now(&self) -> u64 {
        self.now().as_secs()
    }

    /// Moves a manual clock on by `by` (a system clock is not moved).
    pub fn advance(&self, by: Duration) {
        if let Some(manual) = &self.0 {
            manual.send_modify(|now| *now += by);
        }
    }

    /// Returns once the clock reads `at` or later.
    pub async fn sleep_until(&self, at: Duration) {
        match &self.0 {
            None => tokio::time::sleep(at.saturating_sub(since_epoch())).await,
            Some(manual) => {
                // The sender lives as long as this clock: the wait ends only when it is met.
                let _ = manual.subscribe().wait_for(|now| *now >= at).await;
            }
        }
    }
}

/// Seconds since the epoch now (0 if the clock is before 1970).
pub fn unix_now() -> u64 {
    since_epoch().as_secs()
}

/// Time since the epoch now, to the nanosecond (zero if the clock is before 1970).
pub fn since_epoch() -> std::time::Duration {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap_or_default()
}

/// (year, month 1-12, day 1-31) of days since 1970-01-01 (proleptic Gregorian).
pub(crate) fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Days since 1970-01-01 of a (year, month 1-12, day 1-31), the inverse of `civil_from_days`.
pub(crate) fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let y = year - i64::from(month <= 2);
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((month + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

/// The start (epoch seconds) of the UTC hour written `YYYY-MM-DDTHH` (`:00:00` may follow), as
/// [`hour_start`] writes it; `None` for anything else.
pub fn parse_hour(text: &str) -> Option<u64> {
    let text = text
        .strip_suffix(":00:00")
        .or_else(|| text.strip_suffix(":00"))
        .unwrap_or(text);
    let (date, hour) = text.split_once('T')?;
    let mut parts = date.splitn(3, '-');
    let (y, m, d) = (parts.next()?, parts.next()?, parts.next()?);
    let (y, m, d, h): (i64, u32, u32, u64) = (
        y.parse().ok()?,
        m.parse().ok()?,
        d.parse().ok()?,
        hour.parse().ok()?,
    );
    if !(1..=12).contains(&m) || !(1..=31).contains(&d) || h > 23 {
        return None;
    }
    let days = days_from_civil(y, m, d);
    // A day past the month's end (02-30) would be read as one of the next month.
    (civil_from_days(days) == (y, m, d))
        .then(|| {
            u64::try_from(days)
                .ok()
                .map(|days| days * 86_400 + h * 3600)
        })
        .flatten()
}

/// The UTC hour holding `secs`, as `YYYY-MM-DDTHH:00:00`.
pub fn hour_start(secs: u64) -> String {
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    format!("{y:04}-{m:02}-{d:02}T{:02}:00:00", secs % 86_400 / 3600)
}

/// `secs` as `YYYY-MM-DD HH:MM:SS` (UTC), for tables people read.
pub fn datetime(secs: u64) -> String {
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    let t = secs % 86_400;
    format!(
        "{y:04}-{m:02}-{d:02} {:02}:{:02}:{:02}",
        t / 3600,
        t % 3600 / 60,
        t % 60
    )
}

/// Month names as `asctime` writes them.
pub(crate) const MONTHS: [&str; 12] = [
    "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
];

/// `secs` as C's `asctime` prints it (in UTC): `Www Mmm dd hh:mm:ss yyyy`, day padded by a space.
pub fn asctime(secs: u64) -> String {
    const DAYS: [&str; 7] = ["Thu", "Fri", "Sat", "Sun", "Mon", "Tue", "Wed"];
    let days = secs / 86_400;
    let (y, m, d) = civil_from_days(days as i64);
    let t = secs % 86_400;
    format!(
        "{} {} {d:2} {:02}:{:02}:{:02} {y}",
        DAYS[(days % 7) as usize],
        MONTHS[m as usize - 1],
        t / 3600,
        t % 3600 / 60,
        t % 60
    )
}

/// The time at the start of a `recent:` log entry (`<asctime> <message>`, as [`asctime`] writes
/// it) and the message after it.
pub fn parse_asctime(entry: &str) -> Option<(u64, &str)> {
    let (stamp, message) = (entry.get(..24)?, entry.get(25..).unwrap_or(""));
    let name = stamp.get(4..7)?;
    let month = MONTHS.iter().position(|m| *m == name)? as u32 + 1;
    let day: u32 = stamp.get(8..10)?.trim().parse().ok()?;
    let (h, mi, s): (u64, u64, u64) = (
        stamp.get(11..13)?.parse().ok()?,
        stamp.get(14..16)?.parse().ok()?,
        stamp.get(17..19)?.parse().ok()?,
    );
    let year: i64 = stamp.get(20..24)?.parse().ok()?;
    let days = u64::try_from(days_from_civil(year, month, day)).ok()?;
    Some((days * 86_400 + h * 3600 + mi * 60 + s, message))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hours() {
        assert_eq!(hour_start(0), "1970-01-01T00:00:00");
        assert_eq!(hour_start(1_795_320_489), "2026-11-22T04:00:00");
        assert_eq!(hour_start(951_825_600), "2000-02-29T12:00:00");
        assert_eq!(datetime(1_795_320_489), "2026-11-22 04:08:09");
        for secs in [0, 1_795_320_489 / 3600 * 3600, 951_825_600] {
            assert_eq!(parse_hour(&hour_start(secs)), Some(secs));
        }
        assert_eq!(parse_hour("2026-11-22T04"), Some(1_795_320_000));
        assert_eq!(parse_hour("2026-02-30T04"), None);
        assert_eq!(parse_hour("2026-11-22T24"), None);
    }

    #[test]
    fn asctimes() {
        assert_eq!(asctime(0), "Thu Jan  1 00:00:00 1970");
        assert_eq!(asctime(1_795_320_489), "Sun Nov 22 04:08:09 2026");
        assert_eq!(asctime(951_825_600), "Tue Feb 29 12:00:00 2000");
        let entry = format!("{} deploy: v2", asctime(1_795_320_489));
        assert_eq!(parse_asctime(&entry), Some((1_795_320_489, "deploy: v2")));
    }

    #[tokio::test]
    async fn a_manual_clock_wakes_its_sleepers_when_moved_past_their_time() {
        let clock = Clock::manual(Duration::from_secs(100));
        let mut sleeper = tokio::spawn({
            let clock = clock.clone();
            async move { clock.sleep_until(Duration::from_secs(102)).await }
        });
        clock.advance(Duration::from_secs(1));
        let early = tokio::time::timeout(Duration::from_millis(50), &mut sleeper).await;
        assert!(early.is_err(), "101 < 102");
        clock.advance(Duration::from_millis(1500));
        tokio::time::timeout(Duration::from_secs(5), sleeper)
            .await
            .expect("woken at 102.5")
            .unwrap();
        assert_eq!(clock.unix_now(), 102);
        // A time already passed returns at once.
        clock.sleep_until(Duration::from_secs(50)).await;
    }
}
