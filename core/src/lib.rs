//! magnetar-core: the broker without its sockets.
//!
//! Shards (one glommio executor each) own bundles of topics; topics append
//! to their shard's entry log; subscriptions keep durable cursors and
//! dispatch within flow permits. The network layer reaches all of it through
//! the per-shard [`Broker`] handle, which routes requests to the owner shard
//! over the cross-shard mesh.

mod admin;
pub mod api;
mod atomics;
pub mod auth;
pub mod authz;
mod clock;
pub mod config;
pub mod disk_watch;
mod entry;
pub mod error;
mod find;
pub mod metadata;
mod nonpersistent;
pub mod ownership;
mod shard;
pub mod signal;
mod stats;
mod store;
mod subscription;
mod topic;
pub mod topic_name;
mod topic_policies;

pub use api::{
    Broker, ConsumerEvent, ConsumerHandle, ConsumerRef, Principal, ProducerHandle, SeekTarget, ShardTraffic,
    SubscribeRequest,
};
pub use config::BrokerConfig;
// Offline tools (inspect) and tests read persisted records through these paths.
pub use error::{CoreError, StartError};
pub use magnetar_storage::stage;
pub use shard::launch;
pub use shard::launch::{launch, Running};
pub use shard::metrics;
pub use shard::{LEDGER_ID_SHARD_STRIDE, SHARDS_MAX};
pub use store::decode_topic_meta;
pub use subscription::{cursor, sub_state};
pub use topic::{dedup, ledgers};
pub use topic_name::TopicName;

/// The seed of a randomized unit test: `MAGNETAR_SEED` when set (to replay
/// a failure), else the clock. Printed with the test's name.
#[cfg(test)]
pub(crate) fn test_seed(test: &str) -> u64 {
    let seed = std::env::var("MAGNETAR_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(1, |d| d.as_nanos() as u64)
    });
    println!("{test}: MAGNETAR_SEED={seed}");
    seed
}
