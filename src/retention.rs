//! How long each precision is kept: `retentions` in carbon's syntax (`10s:6h,1m:7d,1h:90d`), or
//! the book's `precisions` with one `sample_count` for all of them.
//!
//! Entry points: [`Retention::parse`] (the key), [`Retention::book`], and the questions every
//! part of the agent asks of it: [`Retention::samples`] (how many slices of a precision are
//! kept) and [`Retention::seconds`]. [`Retention::encode`] is the form the flush and cleaner
//! scripts take.

use std::fmt;

/// One precision and how many of its slices are kept (whisper's archive: seconds per point and
/// points).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Archive {
    pub precision: u64,
    pub count: u64,
}

impl Archive {
    /// How long a slice is kept, in seconds.
    pub fn seconds(&self) -> u64 {
        self.precision.saturating_mul(self.count)
    }
}

/// The precisions the counters, gauges and sets are kept at, each with its count.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Retention {
    /// In the order configured (the book's spelling keeps its list's order; carbon's is sorted).
    archives: Vec<Archive>,
    /// The book's spelling: every precision, listed or not, keeps this many slices.
    uniform: Option<u64>,
}

/// carbon's units (whisper's `UnitMultipliers`): a unit is any prefix of these words, the first
/// that fits (`m` is minutes).
const UNITS: [(&str, u64); 6] = [
    ("seconds", 1),
    ("minutes", 60),
    ("hours", 3600),
    ("days", 86_400),
    ("weeks", 7 * 86_400),
    ("years", 365 * 86_400),
];

/// The longest any precision may be kept: far past any dashboard, and short enough that a
/// slice plus its retention (an expiry time, a cut-off) is nowhere near overflowing.
const LONGEST_SECS: u64 = 100 * 365 * 86_400;

/// `<digits><unit>` or `<digits>`: the number and the unit's seconds (`None` when bare).
fn quantity(text: &str) -> Result<(u64, Option<u64>), String> {
    let digits = text.bytes().take_while(u8::is_ascii_digit).count();
    let (number, unit) = text.split_at(digits);
    let number: u64 = number
        .parse()
        .map_err(|_| format!("`{text}`: a number with an optional unit (s, m/min, h, d, w, y)"))?;
    if unit.is_empty() {
        return Ok((number, None));
    }
    let seconds = UNITS
        .iter()
        .find(|(word, _)| unit.bytes().all(|b| b.is_ascii_lowercase()) && word.starts_with(unit))
        .map(|&(_, s)| s)
        .ok_or_else(|| format!("`{text}`: unknown unit `{unit}` (s, m/min, h, d, w, y)"))?;
    Ok((number, Some(seconds)))
}

impl Retention {
    /// The book's spelling: each of `precisions` keeps `sample_count` slices.
    pub fn book(precisions: &[u64], sample_count: u64) -> Retention {
        Retention {
            archives: precisions
                .iter()
                .map(|&precision| Archive {
                    precision,
                    count: sample_count,
                })
                .collect(),
            uniform: Some(sample_count),
        }
    }

    /// carbon's `retentions` (storage-schemas.conf): `precision:retention` pairs separated by
    /// commas, read as whisper reads them: a bare precision is seconds, a bare retention a count
    /// of points, and a retention with a unit is that long (`1m:7d` keeps 10 080 minutes).
    /// Refused as carbon refuses them: a repeated precision, one that does not divide the next,
    /// a coarser precision that keeps no longer than a finer one; and a count under 2.
    pub fn parse(text: &str) -> Result<Retention, String> {
        let mut archives = Vec::new();
        for def in text.split(',').map(str::trim) {
            let (precision, retention) = def
                .split_once(':')
                .ok_or_else(|| format!("`{def}`: precision:retention, as `1m:7d`"))?;
            let (n, unit) = quantity(precision.trim())?;
            let precision = n.saturating_mul(unit.unwrap_or(1));
            if precision == 0 {
                return Err(format!("`{def}`: a precision of at least one second"));
            }
            let count = match quantity(retention.trim())? {
                (n, None) => n,
                (n, Some(unit)) => n.saturating_mul(unit) / precision,
            };
            if count < 2 {
                return Err(format!(
                    "`{def}`: keeps {count} slices, at least 2 are needed"
                ));
            }
            if precision.saturating_mul(count) > LONGEST_SECS {
                return Err(format!("`{def}`: keeps longer than 100 years"));
            }
            archives.push(Archive { precision, count });
        }
        archives.sort_by_key(|a| a.precision);
        for pair in archives.windows(2) {
            let (fine, coarse) = (pair[0], pair[1]);
            if fine.precision == coarse.precision {
                return Err(format!("precision {}s is given twice", fine.precision));
            }
            if !coarse.precision.is_multiple_of(fine.precision) {
                return Err(format!(
                    "precision {}s does not divide the next, {}s",
                    fine.precision, coarse.precision
                ));
            }
            if coarse.seconds() <= fine.seconds() {
                return Err(format!(
                    "precision {}s keeps {}s, no longer than the finer {}s keeps ({}s)",
                    coarse.precision,
                    coarse.seconds(),
                    fine.precision,
                    fine.seconds()
                ));
            }
        }
        Ok(Retention {
            archives,
            uniform: None,
        })
    }

    /// Each precision with its count, in the configured order.
    pub fn archives(&self) -> &[Archive] {
        &self.archives
    }

    /// The precisions, in the configured order.
    pub fn precisions(&self) -> Vec<u64> {
        self.archives.iter().map(|a| a.precision).collect()
    }

    /// How many slices of precision `p` are kept. A precision not listed (a quantile
    /// precision, or one a former configuration wrote) keeps as long as the coarsest listed
    /// precision at most as coarse as it (the finest listed when none is): the archive whisper
    /// would keep its points in. The book's spelling keeps `sample_count` of every precision.
    pub fn samples(&self, p: u64) -> u64 {
        if let Some(n) = self.uniform {
            return n;
        }
        if let Some(a) = self.archives.iter().find(|a| a.precision == p) {
            return a.count;
        }
        let holder = self
            .archives
            .iter()
            .filter(|a| a.precision <= p)
            .max_by_key(|a| a.precision)
            .or_else(|| self.archives.iter().min_by_key(|a| a.precision));
        holder.map_or(2, |a| a.seconds().div_ceil(p.max(1)).max(2))
    }

    /// How long a slice of precision `p` is kept, in seconds.
    pub fn seconds(&self, p: u64) -> u64 {
        self.samples(p).saturating_mul(p)
    }

    /// The longest any listed precision is kept, in seconds.
    pub fn longest_secs(&self) -> u64 {
        self.archives
            .iter()
            .map(Archive::seconds)
            .max()
            .unwrap_or(0)
    }

    /// The form the flush and cleaner scripts take (`flush.lua`'s sample count, `trim.lua`):
    /// the book's one count (`120`), or `precision:count` pairs (`10:2160,60:10080`), finest
    /// first, from which a script finds an unlisted precision's count as [`Retention::samples`]
    /// does.
    pub fn encode(&self) -> String {
        if let Some(n) = self.uniform {
            return n.to_string();
        }
        let mut sorted = self.archives.clone();
        sorted.sort_by_key(|a| a.precision);
        sorted
            .iter()
            .map(|a| format!("{}:{}", a.precision, a.count))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// Every precision any of `all` lists, each kept as long as the longest of them keeps it
    /// (`storage_schemas`: what the agent writes and where a long archive's blocks are cut).
    pub fn union<'a>(all: impl IntoIterator<Item = &'a Retention>) -> Retention {
        let mut archives: Vec<Archive> = Vec::new();
        for a in all.into_iter().flat_map(|r| &r.archives) {
            match archives.iter_mut().find(|b| b.precision == a.precision) {
                Some(b) => b.count = b.count.max(a.count),
                None => archives.push(*a),
            }
        }
        archives.sort_by_key(|a| a.precision);
        Retention {
            archives,
            uniform: None,
        }
    }

    /// What the cleaner keeps of a series of this schema when the agent writes `union`'s
    /// precisions (`storage_schemas`): this schema's archives, and each precision of `union` it
    /// does not list at the book's 120 slices (at most as many as `union` keeps), which no
    /// Graphite read of the series takes.
    pub fn within(&self, union: &Retention) -> Retention {
        let mut archives = self.archives.clone();
        for a in &union.archives {
            if !archives.iter().any(|b| b.precision == a.precision) {
                archives.push(Archive {
                    precision: a.precision,
                    count: a.count.min(crate::store::history::HASH_SLICES),
                });
            }
        }
        archives.sort_by_key(|a| a.precision);
        Retention {
            archives,
            uniform: None,
        }
    }

    /// Reads [`Retention::encode`]'s form back (a spool written by an earlier version carries
    /// the one count).
    pub fn decode(text: &str) -> Option<Retention> {
        if let Ok(n) = text.parse::<u64>() {
            return Some(Retention {
                archives: Vec::new(),
                uniform: Some(n),
            });
        }
        let archives = text
            .split(',')
            .map(|pair| {
                let (p, n) = pair.split_once(':')?;
                Some(Archive {
                    precision: p.parse().ok().filter(|&p| p > 0)?,
                    count: n.parse().ok()?,
                })
            })
            .collect::<Option<Vec<_>>>()?;
        Some(Retention {
            archives,
            uniform: None,
        })
    }

    /// How the slices of precision `p` beyond the hash's newest
    /// [`HASH_SLICES`](crate::store::history::HASH_SLICES) are cut into blocks; `None` where
    /// the hash keeps them all: the book's spelling, a precision not listed, or an archive of
    /// at most that many slices.
    pub fn history(&self, p: u64) -> Option<crate::store::history::Geometry> {
        if self.uniform.is_some() {
            return None;
        }
        let archive = self.archives.iter().find(|a| a.precision == p)?;
        crate::store::history::Geometry::for_count(archive.count)
    }

    /// Whether the quantile slices at precision `p` are packed into blocks
    /// (`store::quantile_blocks`): a `retentions` schema keeps more than the book's 120 of them.
    pub fn packs_quantiles(&self, p: u64) -> bool {
        self.uniform.is_none() && self.samples(p) > crate::store::history::HASH_SLICES
    }

    /// The cleaner's argument: `precision:slots` for each precision kept in blocks
    /// ([`Retention::history`]), or empty.
    pub fn encode_history(&self) -> String {
        self.archives
            .iter()
            .filter_map(|a| {
                Some(format!(
                    "{}:{}",
                    a.precision,
                    self.history(a.precision)?.slots
                ))
            })
            .collect::<Vec<_>>()
            .join(",")
    }
}

/// Carbon's spelling, each precision and retention in the largest unit that divides it:
/// `10s:6h,1m:7d,1h:90d,1d:5y`; the book's, `120 slices of 1s,5s,...`.
impl fmt::Display for Retention {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let unit = |secs: u64| {
            let (word, n) = UNITS
                .iter()
                .rev()
                .find(|(_, n)| secs.is_multiple_of(*n))
                .map_or(("seconds", 1), |&(w, n)| (w, n));
            let short = if word == "minutes" { "m" } else { &word[..1] };
            format!("{}{short}", secs / n)
        };
        let defs: Vec<String> = self
            .archives
            .iter()
            .map(|a| match self.uniform {
                Some(_) => unit(a.precision),
                None => format!("{}:{}", unit(a.precision), unit(a.seconds())),
            })
            .collect();
        match self.uniform {
            Some(n) => write!(f, "{n} slices of {}", defs.join(",")),
            None => f.write_str(&defs.join(",")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn archives(text: &str) -> Vec<(u64, u64)> {
        Retention::parse(text)
            .unwrap()
            .archives()
            .iter()
            .map(|a| (a.precision, a.count))
            .collect()
    }

    #[test]
    fn carbons_schema_as_whisper_reads_it() {
        assert_eq!(
            archives("10s:6h,1m:7d,1h:90d,1d:5y"),
            [(10, 2160), (60, 10_080), (3600, 2160), (86_400, 1825)]
        );
        // A bare precision is seconds, a bare retention points; units are word prefixes.
        assert_eq!(archives("60:1440"), [(60, 1440)]);
        assert_eq!(
            archives("1min:1w, 1hour:1year"),
            [(60, 10_080), (3600, 8760)]
        );
        assert_eq!(archives("5seconds:2minutes"), [(5, 24)]);
        // Listed coarse first: sorted, as whisper sorts its archives.
        assert_eq!(archives("1h:90d,1m:7d"), [(60, 10_080), (3600, 2160)]);
    }

    #[test]
    fn what_carbon_refuses_is_refused() {
        for bad in [
            "",
            "10s",
            "10x:6h",
            "s:6h",
            "0s:6h",
            "10s:6q",
            "10s:10s",
            "1m:1",
            "1m:7d,60s:1d",
            "7s:1d,1m:7d",
            "1m:7d,1h:1d",
            "1m:7d,1h:7d",
            "-1:5",
            "1s:101y",
            "1:99999999999999999999",
        ] {
            assert!(Retention::parse(bad).is_err(), "{bad:?} was taken");
        }
    }

    #[test]
    fn each_precision_its_count_and_the_unlisted_as_their_holder() {
        let r = Retention::parse("10s:6h,1m:7d,1h:90d,1d:5y").unwrap();
        assert_eq!(r.samples(60), 10_080);
        assert_eq!(r.seconds(3600), 90 * 86_400);
        // 5 minutes: held by the minutes, a week. 1 s: by the 10 s, six hours.
        assert_eq!(r.seconds(300), 7 * 86_400);
        assert_eq!(r.seconds(1), 6 * 3600);
        assert_eq!(r.longest_secs(), 5 * 365 * 86_400);
        let book = Retention::book(&[1, 5, 60], 120);
        assert_eq!((book.samples(60), book.samples(3600)), (120, 120));
        assert_eq!(book.longest_secs(), 7200);
    }

    #[test]
    fn scripts_read_what_the_agent_encodes() {
        for r in [
            Retention::parse("1h:90d,10s:6h,1m:7d").unwrap(),
            Retention::book(&[1, 5], 120),
        ] {
            let back = Retention::decode(&r.encode()).unwrap();
            for p in [1, 5, 10, 60, 300, 3600, 86_400] {
                assert_eq!(back.samples(p), r.samples(p), "{p}");
            }
        }
        assert_eq!(
            Retention::parse("1h:90d,10s:6h").unwrap().encode(),
            "10:2160,3600:2160"
        );
        assert_eq!(Retention::decode("10:x"), None);
    }

    #[test]
    fn printed_in_carbons_units() {
        let r = Retention::parse("10:2160,60:10080,3600:2160,86400:1825").unwrap();
        assert_eq!(r.to_string(), "10s:6h,1m:1w,1h:90d,1d:5y");
        assert_eq!(Retention::parse(&r.to_string()).unwrap(), r);
        assert_eq!(
            Retention::book(&[1, 60], 120).to_string(),
            "120 slices of 1s,1m"
        );
    }
}
