//! Every Redis key name the agent reads or writes, built here and nowhere else (SPEC §3).
//!
//! With an empty `key_prefix` the names are byte-identical to *Redis in Action* chapter 5, so
//! the book's readers work unchanged. The flush script receives the prefixes it needs from here
//! (`count:` and the `known:` key) and only appends `<precision>:<series>` to them, the same
//! shape as [`Keys::counter`].

/// Key names under one prefix.
#[derive(Debug, Clone)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_string(),
        }
    }

    /// `count:<precision>:<series>`: a HASH of slice start → integer count.
    pub fn counter(&self, precision: u64, series: &str) -> String {
        format!(
            "{}{}",
            self.counter_prefix(),
            known_member(precision, series)
        )
    }

    /// `count:`, to which the flush script appends [`known_member`].
    pub fn counter_prefix(&self) -> String {
        format!("{}count:", self.prefix)
    }

    /// `known:`: the ZSET (all scores 0) indexing every counter hash as `<precision>:<series>`.
    pub fn known(&self) -> String {
        format!("{}known:", self.prefix)
    }

    /// `flush:<agent>:<window>:<chunk>`: set once a flush chunk has been applied.
    pub fn flush_token(&self, agent_id: &str, window: u64, chunk: usize) -> String {
        format!("{}flush:{agent_id}:{window}:{chunk}", self.prefix)
    }
}

/// A member of `known:`: `<precision>:<series>`, as the book's `clean_counters` splits it.
pub fn known_member(precision: u64, series: &str) -> String {
    format!("{precision}:{series}")
}

/// The slice of `window` at `precision`: `floor(window / precision) * precision`.
pub fn slice(window: u64, precision: u64) -> u64 {
    window / precision * precision
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn book_names_without_prefix() {
        let k = Keys::new("");
        assert_eq!(k.counter(5, "hits"), "count:5:hits");
        assert_eq!(k.known(), "known:");
        assert_eq!(known_member(86400, "a;env=prod"), "86400:a;env=prod");
    }

    #[test]
    fn prefix_goes_first() {
        let k = Keys::new("app1:");
        assert_eq!(k.counter(1, "hits"), "app1:count:1:hits");
        assert_eq!(k.known(), "app1:known:");
        assert_eq!(k.flush_token("a", 10, 2), "app1:flush:a:10:2");
    }

    #[test]
    fn slices() {
        assert_eq!(slice(1_700_000_123, 1), 1_700_000_123);
        assert_eq!(slice(1_700_000_123, 60), 1_700_000_100);
        assert_eq!(slice(1_700_000_123, 86400), 1_699_920_000);
    }
}
