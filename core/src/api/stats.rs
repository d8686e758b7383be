//! A topic's statistics as values ([`Broker::topic_stats`](super::Broker::topic_stats)),
//! taken on the topic's owner shard at one instant. Plain numbers: a door
//! renders them (the native door as JSON; a metrics door as samples).

use magnetar_wire::SubscriptionType;

/// One topic (or one partition).
#[derive(Debug, Clone, PartialEq)]
pub struct TopicStats {
    pub topic: String,
    /// The next topic position to be written (entries numbered across
    /// ledgers).
    pub next_entry: u64,
    /// The stored ledgers, oldest first, the last one current.
    pub ledgers: Vec<LedgerStats>,
    /// Messages and bytes per second appended to the topic, over the last
    /// second or so.
    pub msg_rate_in: f64,
    pub byte_rate_in: f64,
    /// Sorted by name.
    pub subscriptions: Vec<SubscriptionStats>,
}

/// One stored ledger of a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerStats {
    pub ledger: u64,
    /// Topic position of its first entry.
    pub first: u64,
    pub entries: u64,
    pub bytes: u64,
}

/// One subscription of a topic.
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionStats {
    pub name: String,
    pub sub_type: SubscriptionType,
    /// Topic position below which every entry is acknowledged.
    pub ack_floor: u64,
    /// Entries not acknowledged (sent or not; a batch entry counts once).
    pub msg_backlog: u64,
    /// Their messages (a batch not read since a restart counts as one).
    pub backlog_messages: u64,
    /// Their stored bytes (estimated past the first 65,536 entries).
    pub backlog_bytes: u64,
    /// Entries delivered and not acknowledged.
    pub unacked: u64,
    /// Delayed messages not yet due.
    pub delayed: u64,
    /// Entries waiting to be delivered again.
    pub replay: u64,
    /// Messages sent to consumers since the topic was loaded.
    pub msg_out_total: u64,
    /// Messages and bytes per second sent to this subscription's consumers.
    pub msg_rate_out: f64,
    pub byte_rate_out: f64,
    pub durable: bool,
    pub filter_tag: Option<String>,
    /// Failover's allocation strategy (`AllocationStrategy::as_str`).
    pub allocation: &'static str,
    /// Entries the dispatcher read from storage.
    pub entries_read: u64,
    /// Entries a tag filter skipped from the index alone, unread.
    pub skipped_by_index: u64,
    /// Batches partly acknowledged (batch-index acks).
    pub partial_batches: u64,
    pub consumers: Vec<ConsumerStats>,
}

/// One consumer of a subscription.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConsumerStats {
    pub name: String,
    pub priority: i32,
    pub permits: u64,
    pub unacked: u32,
    /// The active consumer of a Failover/Exclusive subscription; always
    /// true for the other types.
    pub active: bool,
    /// Where its client connects from (as its door reported it; may be empty).
    pub address: String,
    /// Messages sent to it again (redelivery count above 0) since it attached.
    pub redelivered: u64,
}

/// A topic's figures for a metrics exporter: what
/// [`TopicStats`] has, less what costs index lookups (backlog bytes) or
/// allocations per consumer, plus the totals counters need. Taken on the
/// topic's owner shard by [`Broker::for_each_topic_metrics`](super::Broker::for_each_topic_metrics).
#[derive(Debug, Clone, PartialEq)]
pub struct TopicMetrics {
    pub topic: String,
    pub producers: u64,
    /// Messages and bytes per second appended, over the last second or so.
    pub msg_rate_in: f64,
    pub byte_rate_in: f64,
    /// Messages and bytes appended since the topic was loaded.
    pub msg_in_total: u64,
    pub bytes_in_total: u64,
    /// Bytes of the topic's stored entries (all its ledgers).
    pub storage_bytes: u64,
    /// Sorted by name.
    pub subscriptions: Vec<SubscriptionMetrics>,
}

/// One subscription's figures for a metrics exporter.
#[derive(Debug, Clone, PartialEq)]
pub struct SubscriptionMetrics {
    pub name: String,
    /// Messages not acknowledged ([`SubscriptionStats::backlog_messages`]).
    pub backlog_messages: u64,
    /// Entries delivered and not acknowledged.
    pub unacked: u64,
    /// Delayed messages not yet due.
    pub delayed: u64,
    pub msg_rate_out: f64,
    pub byte_rate_out: f64,
    /// Messages and bytes sent to consumers since the topic was loaded.
    pub msg_out_total: u64,
    pub bytes_out_total: u64,
    pub consumers: u64,
}
