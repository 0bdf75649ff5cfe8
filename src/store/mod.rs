//! Everything Redis: key names ([`keys`]), the flush script and the [`Writer`] that applies
//! flush chunks exactly once, and the [`Cleaner`] that trims old slices.

pub mod cleaner;
pub mod clock;
pub mod keys;
pub mod reader;
mod writer;

use std::time::Duration;

use redis::AsyncConnectionConfig;
use redis::aio::MultiplexedConnection;

pub use cleaner::Cleaner;
pub use keys::Keys;
pub use reader::Reader;
pub use writer::{
    Applied, ChunkSettings, CounterWrite, FlushChunk, SEQUENCE_TTL_SECS, WriteFailure, Writer,
    Written, build_chunks,
};

/// A failed Redis call.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}

/// A new multiplexed connection whose connect and every call time out after `timeout`.
pub async fn connect(
    client: &redis::Client,
    timeout: Duration,
) -> Result<MultiplexedConnection, StoreError> {
    let config = AsyncConnectionConfig::new()
        .set_connection_timeout(Some(timeout))
        .set_response_timeout(Some(timeout));
    Ok(client
        .get_multiplexed_async_connection_with_config(&config)
        .await?)
}

/// `PING` over a fresh connection, for readiness checks.
pub async fn ping(client: &redis::Client, timeout: Duration) -> Result<(), StoreError> {
    let mut conn = connect(client, timeout).await?;
    redis::cmd("PING").query_async::<()>(&mut conn).await?;
    Ok(())
}
