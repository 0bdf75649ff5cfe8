//! Everything Redis: key names ([`keys`]), the flush script and the [`Writer`] that applies
//! flush chunks exactly once.

mod clock;
pub mod keys;
mod writer;

pub use keys::Keys;
pub use writer::{Applied, FlushChunk, Writer, build_chunks};

/// A failed Redis call.
#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
}
