//! Carbon's rollups made once a period: a carbon point sets its slice at once, and each
//! coarser slice over it whose interval has already ended is made in the same call, as
//! whisper makes it; a coarser slice whose interval is still open is left pending in
//! `pending:gauge:` (`points.lua`), and [`Rollups::run`] makes the pending ones every period
//! (`coarse_write_secs`, at least a window) from what the finer archives hold then. A series
//! sending a point every few seconds costs one rollup a period instead of one a point; a
//! coarser archive shows its open interval up to a period late, as `coarse_write_secs` delays
//! the counters' coarser precisions. The pending members are in Redis, written by the same
//! script as their points, so neither an agent killed between runs nor an outage loses one.
//! Agents with a carbon receiver run them.

use std::sync::Arc;
use std::time::Duration;

use redis::Script;
use tokio_util::sync::CancellationToken;

use super::clock::Clock;
use super::write::{count_refused, refused_pairs};
use super::{Cached, Store, StoreError};
use crate::telemetry::{LogLimit, Telemetry};

/// The most pending members one script call takes.
const RUN_BATCH: usize = 1000;

/// The rollup runs of one agent.
pub struct Rollups {
    store: Store,
    connection: Cached,
    script: Script,
    period: Duration,
    telemetry: Arc<Telemetry>,
    /// A rollup Redis refused (a key of another type) is counted and logged as the flush's are.
    failure_log: LogLimit,
}

impl Rollups {
    pub fn new(store: Store, period: Duration, telemetry: Arc<Telemetry>) -> Rollups {
        Rollups {
            store,
            connection: Cached::default(),
            script: Script::new(concat!(
                include_str!("hourly.lua"),
                include_str!("points.lua"),
                include_str!("rollup.lua")
            )),
            period,
            telemetry,
            failure_log: LogLimit::default(),
        }
    }

    /// Makes every pending rollup as of `now`, a batch a call; returns how many were taken.
    pub async fn run_once(&mut self, now: u64) -> Result<u64, StoreError> {
        let mut taken = 0;
        loop {
            let (mut conn, _) = self.connection.get(&self.store).await?;
            let reply: Result<Vec<redis::Value>, StoreError> = self
                .script
                .arg(now)
                .arg(self.store.keys().prefix())
                .arg(RUN_BATCH)
                .invoke_async(&mut conn)
                .await
                .map_err(StoreError::from);
            let reply = match reply {
                Ok(reply) => reply,
                Err(e) => {
                    self.connection.forget();
                    self.telemetry.redis_errors.increment(1);
                    return Err(e);
                }
            };
            let n: u64 = reply
                .first()
                .and_then(|v| redis::from_redis_value_ref(v).ok())
                .unwrap_or(0);
            for (key, error) in refused_pairs(reply.get(1..).unwrap_or_default()) {
                count_refused(&self.telemetry, &mut self.failure_log, &key, &error);
            }
            taken += n;
            self.telemetry.carbon_rollups.increment(n);
            if (n as usize) < RUN_BATCH {
                return Ok(taken);
            }
        }
    }

    /// A run every period until `stop`, then a last one (the final flush's points are in by
    /// then when the caller stops this after the flusher).
    pub async fn run(mut self, clock: Clock, stop: CancellationToken) {
        loop {
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(self.period) => {}
            }
            if let Err(e) = self.run_once(clock.unix_now()).await {
                tracing::warn!(error = %e, "carbon rollup run failed; the next run takes what it left");
            }
        }
        if let Err(e) = self.run_once(clock.unix_now()).await {
            tracing::warn!(error = %e, "the last carbon rollup run failed; the next start takes what it left");
        }
    }
}
