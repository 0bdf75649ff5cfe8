//! Writing closed windows: [`build_chunks`] turns a window into bounded [`FlushChunk`]s, each a
//! ready `EVALSHA` of `flush.lua` with its own token; [`Writer`] sends them over one
//! multiplexed connection, reconnecting after any failure.

use std::time::Duration;

use redis::aio::MultiplexedConnection;
use redis::{AsyncConnectionConfig, Client, Cmd, Script};

use super::{Keys, StoreError, keys};
use crate::aggregate::ClosedWindow;
use crate::telemetry::Telemetry;

const FLUSH_SCRIPT: &str = include_str!("flush.lua");

/// One script call of a window: applied atomically, and at most once thanks to its token.
#[derive(Debug, Clone)]
pub struct FlushChunk {
    pub window: u64,
    pub index: usize,
    pub series: usize,
    cmd: Cmd,
}

/// Splits a closed window into chunks of at most `max_series` series each.
pub fn build_chunks(
    window: &ClosedWindow,
    keys: &Keys,
    precisions: &[u64],
    agent_id: &str,
    token_ttl_secs: u64,
    max_series: usize,
) -> Vec<FlushChunk> {
    let sha = Script::new(FLUSH_SCRIPT).get_hash().to_string();
    window
        .counters
        .chunks(max_series)
        .enumerate()
        .map(|(index, counters)| {
            let mut cmd = redis::cmd("EVALSHA");
            cmd.arg(&sha)
                .arg(1)
                .arg(keys.flush_token(agent_id, window.start, index))
                .arg(token_ttl_secs)
                .arg(keys.counter_prefix())
                .arg(keys.known())
                .arg(precisions.len());
            for &p in precisions {
                cmd.arg(p).arg(keys::slice(window.start, p));
            }
            cmd.arg(counters.len());
            for (series, n) in counters {
                cmd.arg(&**series).arg(*n);
            }
            FlushChunk {
                window: window.start,
                index,
                series: counters.len(),
                cmd,
            }
        })
        .collect()
}

/// Sends flush chunks to Redis.
pub struct Writer {
    client: Client,
    connection: Option<MultiplexedConnection>,
    connected_before: bool,
    timeout: Duration,
    script: Script,
    telemetry: std::sync::Arc<Telemetry>,
}

/// What happened to a chunk that reached Redis.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Applied {
    Now,
    /// Its token existed: an earlier attempt had applied it and only the reply was lost.
    Before,
}

impl Writer {
    pub fn new(client: Client, timeout: Duration, telemetry: std::sync::Arc<Telemetry>) -> Writer {
        Writer {
            client,
            connection: None,
            connected_before: false,
            timeout,
            script: Script::new(FLUSH_SCRIPT),
            telemetry,
        }
    }

    async fn connection(&mut self) -> Result<MultiplexedConnection, StoreError> {
        if let Some(c) = &self.connection {
            return Ok(c.clone());
        }
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(self.timeout))
            .set_response_timeout(Some(self.timeout));
        let connection = self
            .client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        if self.connected_before {
            self.telemetry.redis_reconnects.increment(1);
        }
        self.connected_before = true;
        self.connection = Some(connection.clone());
        Ok(connection)
    }

    /// Applies one chunk. Any error drops the connection, so the next call starts afresh.
    pub async fn write_chunk(&mut self, chunk: &FlushChunk) -> Result<Applied, StoreError> {
        let result = self.try_write(chunk).await;
        if result.is_err() {
            self.connection = None;
            self.telemetry.redis_errors.increment(1);
        }
        result
    }

    async fn try_write(&mut self, chunk: &FlushChunk) -> Result<Applied, StoreError> {
        let mut conn = self.connection().await?;
        let applied: i64 = match chunk.cmd.query_async(&mut conn).await {
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                self.script.prepare_invoke().load_async(&mut conn).await?;
                chunk.cmd.query_async(&mut conn).await?
            }
            other => other?,
        };
        Ok(if applied == 1 {
            Applied::Now
        } else {
            Applied::Before
        })
    }

    /// `PING` over a fresh connection, for readiness checks.
    pub async fn ping(client: &Client, timeout: Duration) -> Result<(), StoreError> {
        let config = AsyncConnectionConfig::new()
            .set_connection_timeout(Some(timeout))
            .set_response_timeout(Some(timeout));
        let mut conn = client
            .get_multiplexed_async_connection_with_config(&config)
            .await?;
        redis::cmd("PING").query_async::<()>(&mut conn).await?;
        Ok(())
    }
}
