//! What the writer checks of the server it writes to, on every new connection and once a
//! minute ([`ServerCheck`]): whether Redis may evict keys (its `maxmemory-policy`), which decides
//! how a chunk sent again after a lost reply is treated when its guard is gone, how far
//! Redis's clock is from the agent's, and whether the counters' hashes stay compact listpacks
//! at their longest (`hash-max-listpack-entries`).

use std::time::{Duration, Instant};

use super::{Connection, StoreError};
use crate::telemetry::Telemetry;

/// How often a kept connection's server is checked again (a `CONFIG SET` or a clock stepped
/// meanwhile).
const CHECK_INTERVAL: Duration = Duration::from_secs(60);

/// A clock this far from Redis's is logged: the agent's slices and Redis's expiry times (which
/// the scripts correct for it) disagree, and so do several agents' slices.
const SKEW_WARNING_SECS: f64 = 5.0;

/// Redis's eviction, as `INFO memory` tells it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Eviction {
    /// `maxmemory-policy`, or `unknown` when `INFO` is refused (an ACL user without it).
    pub policy: String,
    /// Whether Redis may evict keys at all: a `maxmemory` and a policy other than `noeviction`.
    pub may_evict: bool,
    /// Whether it may evict keys without a TTL, the exactly-once guard among them
    /// (`allkeys-*`); assumed when unknown.
    pub evicts_guard: bool,
}

impl Eviction {
    /// From `INFO memory` texts, one per server (every master of a cluster): the worst of them.
    pub fn of(texts: &[String]) -> Eviction {
        let mut worst = Eviction {
            policy: "noeviction".into(),
            may_evict: false,
            evicts_guard: false,
        };
        for text in texts {
            let field = |name: &str| {
                text.lines()
                    .find_map(|l| l.trim().strip_prefix(name)?.strip_prefix(':'))
                    .map(str::to_string)
            };
            let limited = field("maxmemory").is_some_and(|m| m != "0");
            let policy = field("maxmemory_policy").unwrap_or_else(|| "unknown".into());
            let may_evict = limited && policy != "noeviction";
            let evicts_guard = may_evict && !policy.starts_with("volatile");
            if (evicts_guard, may_evict) > (worst.evicts_guard, worst.may_evict) {
                worst = Eviction {
                    policy,
                    may_evict,
                    evicts_guard,
                };
            }
        }
        worst
    }

    fn unknown() -> Eviction {
        Eviction {
            policy: "unknown".into(),
            may_evict: true,
            evicts_guard: true,
        }
    }
}

/// The server's `hash-max-listpack-entries` (`hash-max-ziplist-entries` before Redis 7), with
/// the name it goes by; `None` when `CONFIG GET` is refused (an ACL without it).
pub async fn listpack_entries(
    conn: &mut Connection,
) -> Result<Option<(&'static str, u64)>, StoreError> {
    for name in ["hash-max-listpack-entries", "hash-max-ziplist-entries"] {
        match redis::cmd("CONFIG")
            .arg("GET")
            .arg(name)
            .query_async::<Vec<String>>(conn)
            .await
        {
            Ok(pair) => {
                if let Some(limit) = pair.get(1).and_then(|v| v.parse().ok()) {
                    return Ok(Some((name, limit)));
                }
            }
            Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => return Ok(None),
            Err(e) => return Err(e.into()),
        }
    }
    Ok(None)
}

/// The writer's view of its server.
#[derive(Default)]
pub(super) struct ServerCheck {
    checked_at: Option<Instant>,
    eviction: Option<Eviction>,
    skew_large: bool,
    /// The most fields a counter or gauge hash holds; 0: not checked.
    pub(super) hash_fields: u64,
    /// What was last said of the listpack limit, so that each finding is logged once.
    listpack: Option<Listpack>,
}

/// What the server's `hash-max-listpack-entries` (`hash-max-ziplist-entries` before Redis 7)
/// means for the counters' hashes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Listpack {
    Enough,
    TooFew,
    /// `CONFIG GET` refused (an ACL without it) or answered nothing.
    Unknown,
}

impl ServerCheck {
    /// Reads the server's listpack limit and says, once for each finding, whether hashes of
    /// `hash_fields` fields stay listpacks: about 8 bytes a slice instead of a hash table's 60
    /// (docs/operations.md, "Long retentions"). Never changes the server's settings.
    async fn check_listpack(&mut self, conn: &mut Connection) -> Result<(), StoreError> {
        if self.hash_fields == 0 {
            return Ok(());
        }
        let found = listpack_entries(conn).await?;
        let finding = match found {
            Some((_, limit)) if limit >= self.hash_fields => Listpack::Enough,
            Some(_) => Listpack::TooFew,
            None => Listpack::Unknown,
        };
        if self.listpack == Some(finding) {
            return Ok(());
        }
        let needed = self.hash_fields;
        match (finding, found) {
            (Listpack::TooFew, Some((name, limit))) => tracing::warn!(
                "Redis keeps a hash compact (a listpack, about 8 bytes a slice) up to {name} {limit} fields; the configured retention keeps up to {needed} slices in a hash, and each longer hash becomes a hash table of about 60 bytes a slice. To keep them compact: `CONFIG SET {name} {needed}` now, and `{name} {needed}` in redis.conf (docs/operations.md, \"Long retentions\", says what it costs)"
            ),
            (Listpack::Unknown, _) => tracing::info!(
                "Redis refused CONFIG GET hash-max-listpack-entries: whether hashes of {needed} slices stay compact listpacks is not known (docs/operations.md, \"Long retentions\")"
            ),
            _ if self.listpack.is_some() => {
                tracing::info!("Redis now keeps hashes of {needed} slices compact")
            }
            _ => {}
        }
        self.listpack = Some(finding);
        Ok(())
    }

    /// Whether a chunk sent before without an answer must be marked (the guard may have been
    /// evicted): unknown counts as yes.
    pub(super) fn evicts_guard(&self) -> bool {
        self.eviction.as_ref().is_none_or(|e| e.evicts_guard)
    }

    /// A new connection: perhaps to another server (a failover), checked before it is used.
    pub(super) fn check_again(&mut self) {
        self.checked_at = None;
    }

    /// Whether it is time to check again.
    pub(super) fn due(&self) -> bool {
        self.checked_at
            .is_none_or(|t| t.elapsed() >= CHECK_INTERVAL)
    }

    /// Reads the policy and the clock over `conn`, exports both (the skew against the agent's
    /// time `now`), and logs a change. A refused `INFO` or `TIME` (ACLs) is an unknown, not a
    /// failure; a connection that fails is.
    pub(super) async fn check(
        &mut self,
        mut conn: Connection,
        telemetry: &Telemetry,
        now: std::time::Duration,
    ) -> Result<(), StoreError> {
        self.checked_at = Some(Instant::now());
        let eviction = match redis::cmd("INFO")
            .arg("memory")
            .query_async::<redis::Value>(&mut conn)
            .await
        {
            Ok(reply) => Eviction::of(&texts(reply)),
            Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => Eviction::unknown(),
            Err(e) => return Err(e.into()),
        };
        if self.eviction.as_ref() != Some(&eviction) {
            if eviction.may_evict {
                tracing::warn!(
                    maxmemory_policy = %eviction.policy,
                    "Redis may evict keys: counts and index members are lost with them, and under allkeys-* a chunk sent again after a lost reply whose guard was evicted is dropped (counted in chunks_guard_lost_total) rather than risk applying it twice. Set maxmemory-policy noeviction (docs/layout.md, \"Writes: atomic, exactly once, through outages\")"
                );
            } else if self.eviction.is_some() {
                tracing::info!(maxmemory_policy = %eviction.policy, "Redis no longer evicts keys");
            }
            telemetry.set_redis_eviction(&eviction.policy, eviction.may_evict);
            self.eviction = Some(eviction);
        }
        match redis::cmd("TIME")
            .query_async::<(u64, u64)>(&mut conn)
            .await
        {
            Ok((secs, micros)) => {
                let redis_now = secs as f64 + micros as f64 / 1e6;
                let skew = redis_now - now.as_secs_f64();
                telemetry.redis_clock_skew.set(skew);
                let large = skew.abs() >= SKEW_WARNING_SECS;
                if large && !self.skew_large {
                    tracing::warn!(
                        skew_seconds = (skew * 10.0).round() / 10.0,
                        "Redis's clock is this far ahead of the agent's (negative: behind): slices are the agent's time, expiry times are moved to Redis's; several agents' slices disagree by their own skews. Synchronize the clocks (NTP)"
                    );
                } else if !large && self.skew_large {
                    tracing::info!("Redis's clock and the agent's agree again");
                }
                self.skew_large = large;
            }
            Err(e) if matches!(e.kind(), redis::ErrorKind::Server(_)) => {}
            Err(e) => return Err(e.into()),
        }
        self.check_listpack(&mut conn).await
    }
}

/// The text of an `INFO` reply: one server's, or each master's of a cluster (a map by node).
fn texts(reply: redis::Value) -> Vec<String> {
    match reply {
        redis::Value::Map(nodes) => nodes
            .into_iter()
            .filter_map(|(_, text)| redis::from_redis_value(text).ok())
            .collect(),
        other => redis::from_redis_value(other).into_iter().collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_policy_of_the_masters_counts() {
        let info = |max: &str, policy: &str| {
            format!("# Memory\r\nused_memory:1\r\nmaxmemory:{max}\r\nmaxmemory_policy:{policy}\r\n")
        };
        let none = Eviction::of(&[info("0", "allkeys-lru")]);
        assert!(
            !none.may_evict && !none.evicts_guard,
            "no maxmemory: nothing evicted"
        );
        let volatile = Eviction::of(&[info("100", "volatile-lru")]);
        assert!(volatile.may_evict && !volatile.evicts_guard);
        let worst = Eviction::of(&[
            info("100", "noeviction"),
            info("100", "volatile-ttl"),
            info("100", "allkeys-lfu"),
        ]);
        assert_eq!(worst.policy, "allkeys-lfu");
        assert!(worst.evicts_guard);
        assert!(Eviction::unknown().evicts_guard);
    }
}
