//! Broker configuration shared (immutably) by all shards.

use std::path::PathBuf;
use std::time::Duration;

#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Root of all data; each shard keeps its log in `shard-<i>/`.
    pub data_dir: PathBuf,
    /// Number of shards (glommio executors), normally one per CPU.
    pub shards: u32,
    /// Pin shard i to CPU `i % cpus`.
    pub pin_cpus: bool,
    /// Bundles per namespace: a namespace's hash ring is split into this many
    /// ranges, each owned by one shard.
    pub bundles_per_namespace: u32,
    /// Largest message blob (metadata + payload) accepted from a producer.
    pub message_bytes_max: u32,
    /// How often acknowledged positions are written to the log.
    pub cursor_persist_interval: Duration,
    /// Storage: entry-log segment size.
    pub segment_bytes: u64,
    /// Write zeros over new segments instead of only fallocating them (see
    /// `magnetar_storage::LogConfig::prezero_segments`).
    pub prezero_segments: bool,
    /// Storage: zero segments this far ahead of the tail in the background
    /// (`magnetar_storage::LogConfig::zero_ahead_bytes`; 0: never).
    pub zero_ahead_bytes: u64,
    /// Storage: a lone small batch's blocking write + fdatasync slower than
    /// this pauses that path (`magnetar_storage::LogConfig::lone_sync_max`;
    /// zero: never block the shard).
    pub lone_sync_max: std::time::Duration,
    /// Storage: how long the shard thread yields the CPU in a loop while
    /// it waits for a lone batch's request, before it sleeps
    /// (`magnetar_storage::DmaDisk::new`'s `lone_yield_max`; zero: sleep at once).
    pub lone_yield_max: std::time::Duration,
    /// Storage: freed segments kept per shard for reuse
    /// (`magnetar_storage::LogConfig::recycle_segments`; 0: unlink them).
    pub recycle_segments: usize,
    /// Storage: recent entries kept in memory per shard.
    pub write_cache_bytes: usize,
    /// Bound on each shard's cache of ledger index pages (the index of
    /// entries older than the last checkpoint is read from disk a page at
    /// a time; see `magnetar_storage::LogConfig::index_cache_bytes`).
    pub index_cache_bytes: usize,
    /// Storage: largest single group-commit write.
    pub flush_bytes_max: usize,
    /// Storage: accept a tmpfs data directory (no O_DIRECT durability there).
    pub allow_tmpfs: bool,
    /// Storage: open a log whose recovery finds damage inside data that may
    /// have been acknowledged by truncating it there (logging what was
    /// dropped) instead of refusing to start
    /// (`magnetar_storage::LogConfig::accept_data_loss`).
    pub accept_data_loss: bool,
    /// How long shutdown waits for in-flight produce requests.
    pub shutdown_drain_timeout: Duration,
    /// Data-disk watermarks: warn levels, the level at which produce is
    /// refused with `StorageFull`, and where usage comes from.
    pub disk_watermarks: crate::disk_watch::DiskWatermarks,
    /// Dispatch to a consumer pauses while it holds this many unacknowledged
    /// messages (Pulsar's `maxUnackedMessagesPerConsumer`).
    pub unacked_per_consumer_max: u32,
    /// Dispatch on a subscription pauses while this many of its messages are
    /// unacknowledged; also the bound of entries set aside for replay.
    pub unacked_per_subscription_max: u32,
    /// Delayed messages indexed in memory per subscription; more are read
    /// again from the log when the index drains (bounded memory).
    pub delayed_index_max: u32,
    /// When a topic's current ledger rolls over.
    pub ledger_rollover: crate::topic::ledgers::Rollover,
    /// How often each shard enforces retention and TTL on its topics.
    pub retention_check_interval: Duration,
    /// After a restart, how long a subscription keeps the type it had
    /// against a consumer of another type, while its own consumers reconnect.
    pub subscription_type_hold: Duration,
    /// A loaded topic idle this long (nothing attached, nothing held only
    /// in memory; see `shard/unload.rs`) is unloaded; zero: never.
    pub topic_idle_unload: Duration,
    /// The port each shard listens on by itself (index = shard id), named in
    /// lookup answers so a client can connect straight to a topic's owner;
    /// empty when there are no per-shard listeners. Plain data: the network
    /// layer binds the ports, the core only reports them.
    pub shard_ports: Vec<u16>,
    /// Who a connection is (tokens, client certificates, the anonymous
    /// role); `None`: authentication is off, every caller is anonymous and
    /// nothing is authorized (see `docs/security.md`).
    pub authentication: Option<std::sync::Arc<crate::auth::Authenticator>>,
    /// Roles that may do everything (`--superuser-roles`).
    pub superuser_roles: Vec<String>,
}

impl BrokerConfig {
    pub fn new(data_dir: impl Into<PathBuf>, shards: u32) -> Self {
        Self {
            data_dir: data_dir.into(),
            shards,
            pin_cpus: true,
            bundles_per_namespace: 16,
            message_bytes_max: 5 * 1024 * 1024,
            cursor_persist_interval: Duration::from_millis(100),
            segment_bytes: 256 * 1024 * 1024,
            prezero_segments: false,
            zero_ahead_bytes: 8 << 20,
            lone_sync_max: std::time::Duration::from_millis(1),
            lone_yield_max: std::time::Duration::from_millis(1),
            recycle_segments: 2,
            write_cache_bytes: 256 * 1024 * 1024,
            index_cache_bytes: 64 * 1024 * 1024,
            flush_bytes_max: 4 * 1024 * 1024,
            allow_tmpfs: false,
            accept_data_loss: false,
            shutdown_drain_timeout: Duration::from_secs(5),
            disk_watermarks: crate::disk_watch::DiskWatermarks::default(),
            unacked_per_consumer_max: 50_000,
            unacked_per_subscription_max: 200_000,
            delayed_index_max: 100_000,
            ledger_rollover: crate::topic::ledgers::Rollover::default(),
            retention_check_interval: Duration::from_secs(120),
            subscription_type_hold: Duration::from_secs(30),
            topic_idle_unload: Duration::from_secs(60),
            shard_ports: Vec::new(),
            authentication: None,
            superuser_roles: Vec::new(),
        }
    }
}
