//! Every Redis key name the agent reads or writes, built here and nowhere else (docs/layout.md).
//!
//! With an empty `key_prefix` the names are byte-identical to *Redis in Action* chapter 5, so
//! the book's readers work unchanged. The flush scripts receive the prefix and build the same
//! shapes server side (so a chunk carries each series name once, not once per key); one
//! server's transaction builds its bare writes' names here too, as bytes ([`ChunkKeys`]); the
//! tests read everything written back through these functions.

use crate::aggregate::StatKind;

/// Key names under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
    /// Cluster mode: the families whose hourly rollover renames keys (`stats:`, `common:`) take
    /// the series in a hash tag, so the four keys of one series share a slot.
    tagged: bool,
}

impl Keys {
    /// The book's names, for one server or Sentinel.
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_string(),
            tagged: false,
        }
    }

    /// The names in a Redis Cluster: the book's, but `stats:{<series>}:<type>` and
    /// `common:{<name>}:<severity>`.
    pub fn tagged(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_string(),
            tagged: true,
        }
    }

    /// `name`, or `{name}` in cluster mode. The hash tag is what stands between the first `{`
    /// and the next `}`, so the family of keys that share this name share a slot whatever the
    /// name holds, but for a name that starts with `}` (an empty tag hashes the whole key):
    /// that one is tagged `{_}name`, and so is a name that starts with `_}` (or `_}}x` and `}x}`
    /// would both be `{_}}x}`). A tagged name longer than `{_}` starts with it exactly when it is one of these.
    fn tag<'a>(&self, name: &'a str) -> std::borrow::Cow<'a, str> {
        if !self.tagged {
            name.into()
        } else if name.starts_with('}') || name.starts_with("_}") {
            format!("{{_}}{name}").into()
        } else {
            format!("{{{name}}}").into()
        }
    }

    /// What a long archive's blocks of the hash `hash` (`count:…` or `gauge:…`, with the
    /// prefix) are named after ([`crate::store::history`]): `history:` before the hash's name
    /// without the prefix; in a cluster, with the hash tag of the hash's slot after it
    /// (`history:{3c}count:60:x`), so that a block and its hash share a slot and the cleaner
    /// moves slices between them in one script call. A block's key is this,
    /// `:<slots>:<number>`.
    pub fn history_base(&self, hash: &str) -> String {
        let name = hash.strip_prefix(&self.prefix).unwrap_or(hash);
        if self.tagged {
            let tag = slot_tag(slot_of(hash.as_bytes()));
            format!("{}history:{{{tag}}}{name}", self.prefix)
        } else {
            format!("{}history:{name}", self.prefix)
        }
    }

    /// The prefix itself, handed to the flush script.
    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    /// `count:<precision>:<series>`: a HASH of slice start → integer count.
    pub fn counter(&self, precision: u64, series: &str) -> String {
        format!("{}count:{}", self.prefix, known_member(precision, series))
    }

    /// `known:`: the ZSET (all scores 0) indexing every counter hash as `<precision>:<series>`.
    pub fn known(&self) -> String {
        format!("{}known:", self.prefix)
    }

    /// `stats:<series>:<type>`: the hour's ZSET of `min max count sum sumsq`. Its rollover keys
    /// are this name plus `:start`, `:last` and `:pstart`.
    pub fn stats(&self, series: &str, kind: StatKind) -> String {
        format!(
            "{}stats:{}:{}",
            self.prefix,
            self.tag(series),
            kind.redis_name()
        )
    }

    /// `hist:<precision>:<series>:<type>:<slice>`: a HASH of the quantile buckets of one slice
    /// (`quantile_precisions`; 3600 s are the hours), a field per bucket and `a` the relative
    /// accuracy (`aggregate::sketch`), expiring `sample_count` precisions after the slice's start.
    pub fn hist_slice(&self, precision: u64, series: &str, kind: StatKind, slice: u64) -> String {
        format!("{}:{slice}", self.hist_series(precision, series, kind))
    }

    /// `hist:<precision>:<series>:<type>`, a series' quantile slices' keys without the slice:
    /// what its blocks are named after ([`Keys::history_base`], `store::quantile_blocks`).
    pub fn hist_series(&self, precision: u64, series: &str, kind: StatKind) -> String {
        format!(
            "{}hist:{precision}:{series}:{}",
            self.prefix,
            kind.redis_name()
        )
    }

    /// What a block's key is named after ([`Keys::history_base`]): the name without the prefix,
    /// `history:` and a slot tag.
    fn block_name<'k>(&self, key: &'k str) -> Option<&'k str> {
        let name = key.strip_prefix(&self.prefix)?.strip_prefix("history:")?;
        match (self.tagged, name.strip_prefix('{')) {
            (true, Some(tagged)) => Some(tagged.split_once('}')?.1),
            (false, None) => Some(name),
            _ => None,
        }
    }

    /// The pattern of every block of quantile slices of `kind` at `precision` (`SCAN`'s
    /// `MATCH`; `store::quantile_blocks` names them).
    pub fn hist_blocks_pattern(&self, precision: u64, kind: StatKind) -> String {
        format!(
            "{}history:*hist:{precision}:*:{}:*",
            self.prefix,
            kind.redis_name()
        )
    }

    /// The series of a block of quantile slices of `kind` at `precision`; None for any other
    /// key.
    pub fn hist_of_block<'k>(
        &self,
        key: &'k str,
        precision: u64,
        kind: StatKind,
    ) -> Option<&'k str> {
        let rest = self
            .block_name(key)?
            .strip_prefix(&format!("hist:{precision}:"))?;
        let (rest, number) = rest.rsplit_once(':')?;
        let series = rest.strip_suffix(kind.redis_name())?.strip_suffix(':')?;
        number.parse::<u64>().is_ok().then_some(series)
    }

    /// The pattern of every quantile slice's key (`SCAN`'s `MATCH`).
    pub fn hist_pattern(&self) -> String {
        format!("{}hist:*", self.prefix)
    }

    /// A quantile slice's precision, series, type and slice, from its key as
    /// [`Keys::hist_slice`] names it; None for any other key.
    pub fn hist_of<'k>(&self, key: &'k str) -> Option<(u64, &'k str, StatKind, u64)> {
        let name = key.strip_prefix(&self.prefix)?.strip_prefix("hist:")?;
        let (p, rest) = name.split_once(':')?;
        let (rest, slice) = rest.rsplit_once(':')?;
        let (series, kind) = rest.rsplit_once(':')?;
        let kind = *StatKind::ALL.iter().find(|k| k.redis_name() == kind)?;
        Some((p.parse().ok()?, series, kind, slice.parse().ok()?))
    }

    /// The series of a `stats:` key of `kind` (the hour's ZSET, as [`Keys::stats`] names it).
    pub fn series_of_stats(&self, key: &str, kind: StatKind) -> Option<String> {
        let series = key
            .strip_prefix(&self.prefix)?
            .strip_prefix("stats:")?
            .strip_suffix(kind.redis_name())?
            .strip_suffix(':')?;
        if !self.tagged {
            return Some(series.to_string());
        }
        // `{_}` alone is the name `_` (a name is never empty).
        let untagged = match series.strip_prefix("{_}") {
            Some(rest) if !rest.is_empty() => rest,
            _ => series.strip_prefix('{')?.strip_suffix('}')?,
        };
        Some(untagged.to_string())
    }

    /// The pattern of every key of the hourly statistics (`SCAN`'s `MATCH`).
    pub fn stats_pattern(&self) -> String {
        format!("{}stats:*", self.prefix)
    }

    /// For a key of a `stats:` family (as [`Keys::stats`] names it, or its `:start`, `:last`
    /// or `:pstart`), the family's four keys: the hour's ZSET, `:start`, `:last`, `:pstart`.
    /// None for any other key.
    pub fn stats_family_of(&self, key: &str) -> Option<[String; 4]> {
        let name = key.strip_prefix(&self.prefix)?.strip_prefix("stats:")?;
        let base = match name.rsplit_once(':') {
            Some((_, "start" | "last" | "pstart")) => key.rsplit_once(':')?.0,
            _ => key,
        };
        StatKind::ALL
            .iter()
            .any(|&k| self.series_of_stats(base, k).is_some_and(|s| !s.is_empty()))
            .then(|| family(base.to_string()))
    }

    /// `slowest:AccessTime`: timers by the hour's average, the 100 highest kept.
    pub fn slowest(&self) -> String {
        format!("{}slowest:AccessTime", self.prefix)
    }

    /// `gauges:`: HASH of series → current value.
    pub fn gauges(&self) -> String {
        format!("{}gauges:", self.prefix)
    }

    /// `gauge:<precision>:<series>`: HASH of slice start → last value in the slice.
    pub fn gauge(&self, precision: u64, series: &str) -> String {
        format!("{}gauge:{}", self.prefix, known_member(precision, series))
    }

    /// `known:gauge:`: the index of the `gauge:` hashes, like `known:`.
    pub fn known_gauges(&self) -> String {
        format!("{}known:gauge:", self.prefix)
    }

    /// `pending:gauge:`: carbon's coarser slices left for a rollup run (the writer adds them).
    pub fn pending_gauges(&self) -> String {
        format!("{}pending:gauge:", self.prefix)
    }

    /// `rolling:gauge:`: the pending slices a rollup run has claimed, scored with its claim.
    pub fn rolling_gauges(&self) -> String {
        format!("{}rolling:gauge:", self.prefix)
    }

    /// `claims:gauge:`: how many rollup claims have taken members out of `pending:gauge:` (a
    /// writer that saw it unchanged knows the members it added are pending still).
    pub fn gauge_claims(&self) -> String {
        format!("{}claims:gauge:", self.prefix)
    }

    /// `set:<precision>:<series>:<slice>`: a HyperLogLog of the slice's members.
    pub fn set(&self, precision: u64, series: &str, slice: u64) -> String {
        format!("{}:{slice}", self.set_series(precision, series))
    }

    /// `set:<precision>:<series>`, a set's slices' keys without the slice: what a long
    /// archive's blocks of the set are named after ([`Keys::history_base`]).
    pub fn set_series(&self, precision: u64, series: &str) -> String {
        format!("{}set:{precision}:{series}", self.prefix)
    }

    /// The pattern of every set slice's key (`SCAN`'s `MATCH`).
    pub fn set_pattern(&self) -> String {
        format!("{}set:*", self.prefix)
    }

    /// The pattern of every block of a set at `precision` (`SCAN`'s `MATCH`; in a cluster a
    /// block's name holds a slot tag: [`Keys::history_base`]).
    pub fn set_blocks_pattern(&self, precision: u64) -> String {
        format!("{}history:*set:{precision}:*", self.prefix)
    }

    /// The series of a set's block at `precision` (as [`Keys::set_series`] and
    /// [`crate::store::history::block_key`] name it); None for any other key.
    pub fn set_of_block<'k>(&self, key: &'k str, precision: u64) -> Option<&'k str> {
        let rest = self
            .block_name(key)?
            .strip_prefix(&format!("set:{precision}:"))?;
        let (rest, number) = rest.rsplit_once(':')?;
        let (series, slots) = rest.rsplit_once(':')?;
        (number.parse::<u64>().is_ok() && slots.parse::<u64>().is_ok()).then_some(series)
    }

    /// A set slice's key (as [`Keys::set`] names it) read back: its precision, series and
    /// slice. None for any other key.
    pub fn set_of<'k>(&self, key: &'k str) -> Option<(u64, &'k str, u64)> {
        let name = key.strip_prefix(&self.prefix)?.strip_prefix("set:")?;
        let (precision, rest) = name.split_once(':')?;
        let (series, slice) = rest.rsplit_once(':')?;
        Some((precision.parse().ok()?, series, slice.parse().ok()?))
    }

    /// `recent:<name>:<severity>`: LIST of `<asctime> <message>`, newest first, 100 kept.
    pub fn recent(&self, name: &str, severity: &str) -> String {
        format!("{}recent:{name}:{severity}", self.prefix)
    }

    /// `common:<name>:<severity>`: the hour's ZSET of message → count (rollover like `stats:`).
    pub fn common(&self, name: &str, severity: &str) -> String {
        format!("{}common:{}:{severity}", self.prefix, self.tag(name))
    }

    /// `known:` and the `count:` hashes it lists.
    pub fn counter_index(&self) -> Index {
        Index {
            key: self.known(),
            hash_prefix: format!("{}count:", self.prefix),
            block_prefix: format!("{}history:count:", self.prefix),
            gauge: false,
        }
    }

    /// `known:gauge:` and the `gauge:` hashes it lists.
    pub fn gauge_index(&self) -> Index {
        Index {
            key: self.known_gauges(),
            hash_prefix: format!("{}gauge:", self.prefix),
            block_prefix: format!("{}history:gauge:", self.prefix),
            gauge: true,
        }
    }

    /// `cleaner:lock`: the lease of the agent that cleans (its agent id, with a TTL).
    pub fn cleaner_lock(&self) -> String {
        format!("{}cleaner:lock", self.prefix)
    }

    /// `flush:<agent id>.<run>`, the name of a run's chunk numbering (the run random per
    /// start): its field in the guard ([`Keys::guard`]), and where versions before the guard
    /// hash kept the run's last number. In cluster mode this name and `:`, which names the
    /// run's field in each slot's guard ([`Keys::slot_guard`]).
    pub fn flush_sequence(&self, run_id: &str) -> String {
        let slots = if self.tagged { ":" } else { "" };
        format!("{}flush:{run_id}{slots}", self.prefix)
    }

    /// The exactly-once guard of one server (standalone, Sentinel): the hash `flush:`, and the
    /// field in it of the run whose sequence is `sequence` (`<agent id>.<run>`).
    pub fn guard<'s>(&self, sequence: &'s str) -> (String, &'s str) {
        (format!("{}flush:", self.prefix), self.run_of(sequence))
    }

    /// The watch key of the run whose sequence is `sequence`: touched by every transaction that
    /// applies one of its chunks on one server, never kept (`store/write/standalone.rs`).
    pub fn watch(sequence: &str) -> String {
        format!("{sequence}.watch")
    }

    /// In cluster mode, the exactly-once guard of the slot of hash tag `tag`: the hash
    /// `flush:{<tag>}`, and the field in it of the run whose sequence is `sequence`
    /// (`<agent id>.<run>`).
    pub fn slot_guard<'s>(&self, tag: &str, sequence: &'s str) -> (String, &'s str) {
        (
            format!("{}flush:{{{tag}}}", self.prefix),
            self.run_of(sequence),
        )
    }

    /// `<agent id>.<run>` of a [`Keys::flush_sequence`].
    fn run_of<'s>(&self, sequence: &'s str) -> &'s str {
        let run = sequence
            .strip_prefix(&self.prefix)
            .and_then(|s| s.strip_prefix("flush:"))
            .unwrap_or(sequence);
        run.strip_suffix(':').unwrap_or(run)
    }

    /// Whether `sequence` names the per-slot sequence keys of a cluster run: chunks written
    /// for the other mode (a spool from before a change of `redis_mode`) cannot be sent.
    pub fn is_slot_sequence(sequence: &str) -> bool {
        sequence.ends_with(':')
    }
}

/// An index ZSET of `<precision>:<series>` members and the prefix that, with a member appended,
/// names the hash the member stands for.
#[derive(Debug, Clone, PartialEq)]
pub struct Index {
    pub key: String,
    pub hash_prefix: String,
    /// Where a long archive's blocks of these hashes are named (`store::history`):
    /// `<prefix>history:count:`, `<prefix>history:gauge:`.
    pub block_prefix: String,
    pub gauge: bool,
}

/// The names one server's transaction writes, as bytes, under a chunk's own prefix (a chunk keeps
/// the prefix it was made with; a spool may hold chunks of an earlier one): the same shapes as
/// [`Keys`]' (a test holds them to it), made into one reused buffer per write.
pub struct ChunkKeys<'a> {
    pub prefix: &'a [u8],
}

impl ChunkKeys<'_> {
    /// [`Keys::counter`] into `out`, `precision` as sent.
    pub fn counter_into(&self, out: &mut Vec<u8>, precision: &[u8], series: &[u8]) {
        self.join(out, &[b"count:", precision, b":", series]);
    }

    /// [`Keys::gauge`] into `out`.
    pub fn gauge_into(&self, out: &mut Vec<u8>, precision: &[u8], series: &[u8]) {
        self.join(out, &[b"gauge:", precision, b":", series]);
    }

    /// [`Keys::known`].
    pub fn known(&self) -> Vec<u8> {
        [self.prefix, b"known:"].concat()
    }

    /// [`Keys::known_gauges`].
    pub fn known_gauges(&self) -> Vec<u8> {
        [self.prefix, b"known:gauge:"].concat()
    }

    /// [`Keys::pending_gauges`].
    pub fn pending_gauges(&self) -> Vec<u8> {
        [self.prefix, b"pending:gauge:"].concat()
    }

    /// [`Keys::gauges`].
    pub fn gauges(&self) -> Vec<u8> {
        [self.prefix, b"gauges:"].concat()
    }

    fn join(&self, out: &mut Vec<u8>, parts: &[&[u8]]) {
        out.clear();
        out.extend_from_slice(self.prefix);
        for part in parts {
            out.extend_from_slice(part);
        }
    }
}

/// [`known_member`] as bytes.
pub fn known_member_bytes(precision: &[u8], series: &[u8]) -> Vec<u8> {
    [precision, b":", series].concat()
}

/// A member of `known:`: `<precision>:<series>`, as the book's `clean_counters` splits it.
pub fn known_member(precision: u64, series: &str) -> String {
    format!("{precision}:{series}")
}

/// Hash slots of a Redis Cluster.
pub const SLOTS: u16 = 16384;

/// The cluster hash slot of `key`, as Redis computes it: CRC16 (XMODEM) of the key, or of its
/// hash tag (what stands between the first `{` and the next `}`, when that is not empty).
pub fn slot_of(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&b| b == b'{').and_then(|open| {
        let close = key[open + 1..].iter().position(|&b| b == b'}')?;
        (close > 0).then(|| &key[open + 1..open + 1 + close])
    });
    crc16::State::<crc16::XMODEM>::calculate(tagged.unwrap_or(key)) % SLOTS
}

/// For every slot, a short hash tag that lands in it, so that a key of ours (a flush sequence
/// key) can be put into the slot of the data it guards.
pub fn slot_tags() -> Vec<String> {
    let mut tags = vec![String::new(); SLOTS as usize];
    let mut missing = SLOTS as usize;
    // About 170 000 candidates fill all 16 384 slots (coupon collector); a few milliseconds.
    for n in 0u32.. {
        let tag = format!("{n:x}");
        let slot = &mut tags[slot_of(tag.as_bytes()) as usize];
        if slot.is_empty() {
            *slot = tag;
            missing -= 1;
            if missing == 0 {
                break;
            }
        }
    }
    tags
}

/// [`slot_tags`]' tag of `slot`, made once.
pub fn slot_tag(slot: u16) -> &'static str {
    static TAGS: std::sync::OnceLock<Vec<String>> = std::sync::OnceLock::new();
    &TAGS.get_or_init(slot_tags)[slot as usize]
}

/// The rollover family of an hourly key: itself, `:start`, `:last`, `:pstart`.
pub fn family(key: String) -> [String; 4] {
    let [start, last, pstart] =
        [":start", ":last", ":pstart"].map(|suffix| format!("{key}{suffix}"));
    [key, start, last, pstart]
}

/// The slice of `window` at `precision`: `floor(window / precision) * precision`.
pub fn slice(window: u64, precision: u64) -> u64 {
    window / precision * precision
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_family_of_each_stats_key() {
        let keys = super::Keys::new("p.");
        let base = |k: &str| keys.stats_family_of(k).map(|f| f[0].clone());
        for key in [
            "p.stats:a:b:AccessTime",
            "p.stats:a:b:AccessTime:start",
            "p.stats:a:b:AccessTime:last",
            "p.stats:a:b:AccessTime:pstart",
        ] {
            assert_eq!(
                base(key).as_deref(),
                Some("p.stats:a:b:AccessTime"),
                "{key}"
            );
        }
        assert_eq!(
            keys.stats_family_of("p.stats:h:Histogram").unwrap(),
            [
                "p.stats:h:Histogram",
                "p.stats:h:Histogram:start",
                "p.stats:h:Histogram:last",
                "p.stats:h:Histogram:pstart"
            ]
        );
        let tagged = super::Keys::tagged("");
        assert_eq!(
            tagged
                .stats_family_of("stats:{x}:Distribution:last")
                .map(|f| f[0].clone())
                .as_deref(),
            Some("stats:{x}:Distribution")
        );
        for other in [
            "p.stats:a:Other",
            "p.stats::start",
            "stats:a:AccessTime",
            "p.stats:AccessTime",
            "p.stats::AccessTime",
            "p.count:1:x",
        ] {
            assert_eq!(base(other), None, "{other}");
        }
    }

    use super::*;

    #[test]
    fn a_chunks_byte_names_are_those_of_keys() {
        let keys = Keys::new("p:");
        let chunk = ChunkKeys { prefix: b"p:" };
        let mut out = Vec::new();
        chunk.counter_into(&mut out, b"60", b"a.b;t=v");
        assert_eq!(out, keys.counter(60, "a.b;t=v").as_bytes());
        chunk.gauge_into(&mut out, b"5", b"g");
        assert_eq!(out, keys.gauge(5, "g").as_bytes());
        assert_eq!(chunk.known(), keys.known().as_bytes());
        assert_eq!(chunk.known_gauges(), keys.known_gauges().as_bytes());
        assert_eq!(chunk.gauges(), keys.gauges().as_bytes());
        assert_eq!(
            known_member_bytes(b"60", b"x"),
            known_member(60, "x").as_bytes()
        );
    }

    #[test]
    fn a_stats_key_gives_its_series_back() {
        for keys in [Keys::new("p:"), Keys::tagged("p:")] {
            for series in ["web.time", "a;b=c", "}odd", "_}x", "_}}x", "}x}", "_"] {
                let key = keys.stats(series, StatKind::Histogram);
                assert_eq!(
                    keys.series_of_stats(&key, StatKind::Histogram).as_deref(),
                    Some(series)
                );
                assert_eq!(keys.series_of_stats(&key, StatKind::Timer), None);
            }
        }
    }

    #[test]
    fn tagged_names_do_not_collide() {
        let keys = Keys::tagged("");
        let names = ["_}}x", "}x}", "_}x", "}x", "x}", "{x}", "_x"];
        let mut tagged: Vec<String> = names
            .iter()
            .map(|n| keys.stats(n, StatKind::Timer))
            .collect();
        tagged.sort();
        tagged.dedup();
        assert_eq!(tagged.len(), names.len(), "{tagged:?}");
    }

    #[test]
    fn book_names_without_prefix() {
        let k = Keys::new("");
        assert_eq!(k.counter(5, "hits"), "count:5:hits");
        assert_eq!(k.known(), "known:");
        assert_eq!(known_member(86400, "a;env=prod"), "86400:a;env=prod");
        assert_eq!(k.stats("ctx", StatKind::Timer), "stats:ctx:AccessTime");
        assert_eq!(k.slowest(), "slowest:AccessTime");
        assert_eq!(k.gauge(60, "g"), "gauge:60:g");
        assert_eq!(k.set(5, "u", 10), "set:5:u:10");
        assert_eq!(k.recent("db", "info"), "recent:db:info");
        assert_eq!(k.common("db", "info"), "common:db:info");
    }

    #[test]
    fn cluster_names_tag_the_rollover_families_only() {
        let k = Keys::tagged("p:");
        assert_eq!(k.stats("ctx", StatKind::Timer), "p:stats:{ctx}:AccessTime");
        assert_eq!(k.common("db", "info"), "p:common:{db}:info");
        assert_eq!(k.counter(5, "hits"), "p:count:5:hits");
        assert_eq!(k.recent("db", "info"), "p:recent:db:info");
        assert_eq!(k.gauge(60, "g"), "p:gauge:60:g");
        // Whatever the name holds, a family shares one slot.
        for name in ["}x", "a}b", "{a", "a{b}c", "}", "{}"] {
            let family = k.common(name, "info");
            let slot = slot_of(family.as_bytes());
            for suffix in [":start", ":last", ":pstart"] {
                assert_eq!(
                    slot_of(format!("{family}{suffix}").as_bytes()),
                    slot,
                    "{name:?}"
                );
            }
        }
        assert_eq!(k.common("}x", "info"), "p:common:{_}}x:info");
    }

    #[test]
    fn prefix_goes_first() {
        let k = Keys::new("app1:");
        assert_eq!(k.counter(1, "hits"), "app1:count:1:hits");
        assert_eq!(k.known(), "app1:known:");
        assert_eq!(k.flush_sequence("a.1f"), "app1:flush:a.1f");
        assert_eq!(
            k.guard(&k.flush_sequence("a.1f")),
            ("app1:flush:".to_string(), "a.1f")
        );
        let tagged = Keys::tagged("app1:");
        let sequence = tagged.flush_sequence("a.1f");
        assert_eq!(
            tagged.slot_guard("3c", &sequence),
            ("app1:flush:{3c}".to_string(), "a.1f")
        );
        assert_eq!(k.cleaner_lock(), "app1:cleaner:lock");
        let gauges = k.gauge_index();
        assert_eq!(gauges.key, "app1:known:gauge:");
        assert_eq!(
            format!("{}{}", gauges.hash_prefix, known_member(5, "g")),
            k.gauge(5, "g")
        );
        let counters = k.counter_index();
        assert_eq!(
            format!("{}{}", counters.hash_prefix, known_member(5, "c")),
            k.counter(5, "c")
        );
    }

    #[test]
    fn slots_are_those_redis_computes() {
        // CLUSTER KEYSLOT answers, from the Redis Cluster specification and a 7.0 server.
        assert_eq!(slot_of(b"foo"), 12182);
        assert_eq!(slot_of(b"somekey"), 11058);
        assert_eq!(slot_of(b"{user1000}.following"), slot_of(b"user1000"));
        assert_eq!(slot_of(b"foo{}{bar}"), slot_of(b"foo{}{bar}".as_slice()));
        assert_ne!(slot_of(b"foo{}{bar}"), slot_of(b"bar"));
        assert_eq!(slot_of(b"foo{{bar}}zap"), slot_of(b"{bar"));
        let tags = slot_tags();
        for slot in [0, 1, 8000, SLOTS - 1] {
            let tag = &tags[slot as usize];
            assert_eq!(slot_of(format!("flush:a.1{{{tag}}}").as_bytes()), slot);
        }
    }

    #[test]
    fn set_keys_read_back() {
        let k = Keys::new("p:");
        let key = k.set(600, "web.users;dc=a:b", 1_700_000_400);
        assert_eq!(key, "p:set:600:web.users;dc=a:b:1700000400");
        assert_eq!(
            k.set_of(&key),
            Some((600, "web.users;dc=a:b", 1_700_000_400))
        );
        assert_eq!(k.set_of("p:set:600:x"), None);
        assert_eq!(k.set_of("set:600:x:1"), None);
        assert_eq!(k.set_of("p:set:ten:x:1"), None);
        assert_eq!(
            k.history_base(&k.set_series(600, "x")),
            "p:history:set:600:x"
        );
        assert_eq!(
            k.set_of_block("p:history:set:600:a:b:2008:7", 600),
            Some("a:b")
        );
        assert_eq!(k.set_of_block("p:history:set:600:a:2008:7", 60), None);
        let hist = k.hist_slice(60, "a:b", StatKind::Distribution, 120);
        assert_eq!(
            k.hist_of(&hist),
            Some((60, "a:b", StatKind::Distribution, 120))
        );
        assert_eq!(k.hist_of("p:hist:60:a:Other:120"), None);
        assert_eq!(k.hist_of("p:set:60:a:120"), None);
        let block = crate::store::quantile_blocks::block_key(&k, 60, "a:b", StatKind::Timer, 7);
        assert_eq!(k.hist_of_block(&block, 60, StatKind::Timer), Some("a:b"));
        assert_eq!(k.hist_of_block(&block, 3600, StatKind::Timer), None);
        assert_eq!(k.hist_of_block(&block, 60, StatKind::Histogram), None);
        let tagged = Keys::tagged("p:");
        let block = crate::store::quantile_blocks::block_key(&tagged, 60, "a", StatKind::Timer, 7);
        assert!(block.starts_with("p:history:{"), "{block}");
        assert_eq!(tagged.hist_of_block(&block, 60, StatKind::Timer), Some("a"));
        assert_eq!(k.set_of_block("p:history:count:600:a:2008:7", 600), None);
        let tagged = Keys::tagged("p:");
        let block = format!(
            "{}:248:3",
            tagged.history_base(&tagged.set_series(60, "a}b"))
        );
        assert!(block.starts_with("p:history:{"), "{block}");
        assert_eq!(tagged.set_of_block(&block, 60), Some("a}b"));
    }

    #[test]
    fn slices() {
        assert_eq!(slice(1_700_000_123, 1), 1_700_000_123);
        assert_eq!(slice(1_700_000_123, 60), 1_700_000_100);
        assert_eq!(slice(1_700_000_123, 86400), 1_699_920_000);
    }
}
