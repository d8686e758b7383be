//! Values that cross the broker API: handles of producers and consumers,
//! requests, and the events a subscription sends to a consumer's door.

use crate::error::ErrorCode;
use bytes::Bytes;
use magnetar_wire::{InitialPosition, MessageId, SubscriptionType};

/// Where a consumer's events go: a sink registered on some shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConsumerRef {
    pub shard: u32,
    pub sink: u64,
    pub consumer_id: u64,
}

/// What a subscription sends to a consumer's connection.
#[derive(Debug)]
pub enum ConsumerEvent {
    Message {
        consumer_id: u64,
        message_id: MessageId,
        redelivery_count: u32,
        blob: Bytes,
        /// Batch-index acks of a redelivered batch (`Command::Message::ack_set`).
        ack_set: Vec<u64>,
    },
    /// Consecutive entries of one ledger for one consumer, in one event:
    /// entry i has `first` with entry number `first.entry + i`, the run's
    /// `redelivery_count` and no batch-index acks. The connection writes
    /// them as `MessageRun` frames to clients of protocol version 2 and as
    /// one `Message` frame each to older ones. Never empty.
    Run { consumer_id: u64, first: MessageId, redelivery_count: u32, blobs: Vec<Bytes> },
    /// The broker closed the consumer (e.g. unreadable data); the client should
    /// be told and may subscribe again. `entry`: the entry concerned, if any
    /// (a damaged one: `ErrorCode::DamagedEntry`).
    Closed { consumer_id: u64, code: ErrorCode, message: String, entry: Option<MessageId> },
    /// Failover: the consumer became (or stopped being) the active one.
    ActiveChange { consumer_id: u64, is_active: bool },
}

impl ConsumerEvent {
    /// The entries a `Message` or `Run` event delivers, in order:
    /// `(message_id, redelivery_count, blob)`; none for other events.
    pub fn deliveries(self) -> Vec<(MessageId, u32, Bytes)> {
        match self {
            Self::Message { message_id, redelivery_count, blob, .. } => vec![(message_id, redelivery_count, blob)],
            Self::Run { first, redelivery_count, blobs, .. } => blobs
                .into_iter()
                .enumerate()
                .map(|(i, blob)| (MessageId { entry: first.entry + i as u64, ..first }, redelivery_count, blob))
                .collect(),
            Self::Closed { .. } | Self::ActiveChange { .. } => Vec::new(),
        }
    }
}

/// A producer attached to a topic, as seen by the connection that created it.
#[derive(Debug, Clone)]
pub struct ProducerHandle {
    pub topic: String,
    pub owner: u32,
    pub producer_name: String,
    pub last_sequence_id: i64,
    /// The topic's epoch (Pulsar's `topic_epoch`): how many times an
    /// exclusive producer took the topic, less one; `None` if none ever did.
    pub topic_epoch: Option<u64>,
}

/// A consumer attached to a subscription, as seen by its connection.
#[derive(Debug, Clone)]
pub struct ConsumerHandle {
    pub topic: String,
    pub subscription: String,
    pub owner: u32,
    pub consumer: ConsumerRef,
}

#[derive(Debug, Clone)]
pub struct SubscribeRequest {
    pub topic: String,
    pub subscription: String,
    pub consumer_id: u64,
    pub sub_type: SubscriptionType,
    pub consumer_name: String,
    pub initial_position: InitialPosition,
    pub durable: bool,
    /// Failover: lower is preferred (Pulsar's priority level).
    pub priority_level: i32,
    /// Deliver only messages with this tag; empty = all.
    pub filter_tag: String,
    /// Key_Shared sticky mode: inclusive hash ranges this consumer owns;
    /// empty = auto split. Checked by `key_shared::check_sticky_ranges`.
    pub key_shared_ranges: Vec<(u32, u32)>,
    /// Broadcast mode, and Failover's allocation strategy (with zones).
    pub model: magnetar_wire::ConsumptionModel,
    /// Where the consumer's client connects from, as its door reports it
    /// (shown in stats; empty when unknown). The core reads nothing into it.
    pub client_address: String,
}

/// Where a seek moves a subscription's cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekTarget {
    /// The next message delivered is this one.
    Id(MessageId),
    /// The next message delivered is the first published at or after this
    /// time (milliseconds since the Unix epoch).
    PublishTime(u64),
}

/// What one shard sent over the mesh on behalf of producers and consumers
/// since it started (admin `broker.shard-stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardTraffic {
    pub shard: u32,
    /// Producer and consumer requests (create, send, subscribe, flow, ack,
    /// close, redeliver, seek) routed to the topic's owner on another shard.
    pub cross_shard_requests: u64,
    /// Consumer events (a message to deliver, a close, an active-consumer
    /// change) sent to a consumer whose connection is on another shard; a
    /// run of deliveries counts one per entry.
    pub cross_shard_events: u64,
}
