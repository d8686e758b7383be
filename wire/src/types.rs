//! Owned Rust views of the protocol's commands and message metadata.
//!
//! These types are the contract between the codec and everything above it
//! (broker, client, tools). The flatbuffers schema in `schema/magnetar.fbs`
//! mirrors them field for field; the codec converts between the two. Strings
//! and small vectors are copied out of the flatbuffer (commands are small);
//! message payloads are never copied: they travel as `Bytes` beside the command.

use bytes::Bytes;
use std::fmt;
use std::str::FromStr;

/// Protocol version spoken by this build. A peer announcing a higher version is
/// answered with the lower of the two; a lower one is refused if unsupported.
pub const PROTOCOL_VERSION: u32 = 2;

/// The first protocol version whose clients accept `MessageRun` frames (and
/// announce their frame limit in `Connect`). A broker sends runs only to a
/// connection whose `Connect` announced at least this version; older
/// clients get one `Message` frame per entry.
pub const PROTOCOL_VERSION_RUNS: u32 = 2;

/// Position of one message: `(ledger, entry, partition, batch_index)`.
///
/// Totally ordered and monotonic per partition (ledger first, then entry, then
/// batch index). `partition` is -1 for a non-partitioned topic, and
/// `batch_index` is -1 for an entry that is not a batch (Pulsar's convention).
/// The text form, `L:E:P:B`, is part of the CLI's JSON contract.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct MessageId {
    pub ledger: u64,
    pub entry: u64,
    pub partition: i32,
    pub batch_index: i32,
}

impl MessageId {
    pub const fn new(ledger: u64, entry: u64, partition: i32, batch_index: i32) -> Self {
        Self { ledger, entry, partition, batch_index }
    }
}

impl fmt::Display for MessageId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}:{}:{}", self.ledger, self.entry, self.partition, self.batch_index)
    }
}

/// Error from parsing the `L:E:P:B` text form of a message id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid message id {0:?}: expected LEDGER:ENTRY:PARTITION:BATCH_INDEX")]
pub struct ParseMessageIdError(pub String);

impl FromStr for MessageId {
    type Err = ParseMessageIdError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let bad = || ParseMessageIdError(s.to_string());
        let mut it = s.split(':');
        let ledger = it.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let entry = it.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let partition = it.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        let batch_index = it.next().ok_or_else(bad)?.parse().map_err(|_| bad())?;
        if it.next().is_some() {
            return Err(bad());
        }
        Ok(Self { ledger, entry, partition, batch_index })
    }
}

/// Typed error codes carried by `Command::Error` and `Command::SendError`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum ErrorCode {
    UnknownError = 0,
    /// The peer sent something that does not follow the protocol; the
    /// connection is closed after this error.
    ProtocolError = 1,
    UnsupportedVersion = 2,
    InvalidTopicName = 3,
    TopicNotFound = 4,
    /// Another producer holds exclusive access, or the producer id is in use.
    ProducerBusy = 5,
    /// An exclusive subscription already has a consumer, or the consumer id is in use.
    ConsumerBusy = 6,
    ProducerNotFound = 7,
    ConsumerNotFound = 8,
    /// The storage layer failed (I/O error, failed fsync); retry later.
    PersistenceError = 9,
    /// The broker is starting or shutting down; retry later.
    ServiceNotReady = 10,
    /// A limit was reached (in-flight bytes, producers per topic, ...); retry later.
    TooManyRequests = 11,
    /// A frame or message failed its checksum.
    ChecksumError = 12,
    /// The message is larger than the broker accepts.
    MessageTooLarge = 13,
    /// Operation not allowed in this state (e.g. cumulative ack on Shared).
    NotAllowed = 14,
    /// The data disk is above its watermark; retry later.
    StorageFull = 15,
    /// Another producer took the topic with `ExclusiveWithFencing`: this
    /// producer may not send any more.
    ProducerFenced = 16,
    /// A `Producer` or `Subscribe` reached a shard's own port (see
    /// `Connected::shard_ports`) for a topic that shard does not own: the
    /// client's lookup is stale; look the topic up again.
    NotOwner = 17,
    /// An entry the consumer's subscription must deliver next failed its
    /// checksum on the broker's disk and is never served; the subscription
    /// stays at it until an operator moves past it (`magnetar admin
    /// subscriptions skip-damaged`). Not retriable.
    DamagedEntry = 18,
    /// The handshake's credentials were refused (a bad, expired or missing
    /// token, an unknown signing key); the connection closes after it.
    AuthenticationError = 19,
    /// The caller's role may not do this (docs/security.md).
    AuthorizationError = 20,
}

impl ErrorCode {
    pub fn from_u16(v: u16) -> Self {
        match v {
            1 => Self::ProtocolError,
            2 => Self::UnsupportedVersion,
            3 => Self::InvalidTopicName,
            4 => Self::TopicNotFound,
            5 => Self::ProducerBusy,
            6 => Self::ConsumerBusy,
            7 => Self::ProducerNotFound,
            8 => Self::ConsumerNotFound,
            9 => Self::PersistenceError,
            10 => Self::ServiceNotReady,
            11 => Self::TooManyRequests,
            12 => Self::ChecksumError,
            13 => Self::MessageTooLarge,
            14 => Self::NotAllowed,
            15 => Self::StorageFull,
            16 => Self::ProducerFenced,
            17 => Self::NotOwner,
            18 => Self::DamagedEntry,
            19 => Self::AuthenticationError,
            20 => Self::AuthorizationError,
            _ => Self::UnknownError,
        }
    }

    /// Whether a client may retry the same request later and expect success.
    pub fn is_retriable(self) -> bool {
        matches!(self, Self::PersistenceError | Self::ServiceNotReady | Self::TooManyRequests | Self::StorageFull)
    }
}

/// Credentials a client sends in `Connect`. Its `Debug` prints only the
/// length, so a logged command never shows a token.
#[derive(Clone, PartialEq, Eq, Default)]
pub struct AuthData(pub Vec<u8>);

impl std::fmt::Debug for AuthData {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AuthData({} bytes, not shown)", self.0.len())
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SubscriptionType {
    #[default]
    Exclusive,
    Failover,
    Shared,
    KeyShared,
}

/// Failover on a partitioned topic: which consumer owns which partition
/// (RocketMQ's allocation strategies). The subscription keeps one; a
/// consumer asking for another is refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AllocationStrategy {
    /// Partition `p` to the `p % n`-th consumer (RocketMQ's circle).
    #[default]
    RoundRobin,
    /// Contiguous blocks of partitions, the first ones one larger
    /// (RocketMQ's average).
    Average,
    /// A hash ring with virtual nodes per consumer: a consumer joining or
    /// leaving moves only its share of partitions.
    ConsistentHash,
    /// A partition goes to a consumer of its zone while one exists, else
    /// by `Average` over all consumers.
    Zone,
}

impl AllocationStrategy {
    /// The name on the command line and in stats.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::RoundRobin => "round-robin",
            Self::Average => "average",
            Self::ConsistentHash => "consistent-hash",
            Self::Zone => "zone",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::RoundRobin, Self::Average, Self::ConsistentHash, Self::Zone].into_iter().find(|a| a.as_str() == s)
    }
}

/// Whether the consumers of a subscription share one cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum SubscriptionMode {
    /// One cursor; the subscription type says who gets which message.
    #[default]
    Clustering,
    /// Every consumer receives every message: each (it must be named) has
    /// its own cursor, the subscription `<subscription>/<consumer-name>`.
    Broadcast,
}

/// A consumer's consumption model beyond the subscription type (issue #22).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ConsumptionModel {
    pub mode: SubscriptionMode,
    pub allocation: AllocationStrategy,
    /// Zone allocation: this consumer's zone ("" = none).
    pub zone: String,
    /// Zone allocation: item `i` is partition `i`'s zone ("" or missing =
    /// none).
    pub partition_zones: Vec<String>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum InitialPosition {
    #[default]
    Latest,
    Earliest,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum AckType {
    #[default]
    Individual,
    Cumulative,
}

/// How a producer shares its topic with other producers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ProducerAccessMode {
    /// Any number of producers (the default).
    #[default]
    Shared,
    /// The only producer; a second one is refused with `ProducerBusy`.
    Exclusive,
    /// Waits (the `Producer` request stays unanswered) until the exclusive
    /// producer leaves, then takes over.
    WaitForExclusive,
    /// Takes over at once: every other producer of the topic is fenced (its
    /// later sends fail with `ProducerFenced`).
    ExclusiveWithFencing,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum CompressionType {
    #[default]
    None,
    Lz4,
    Zlib,
    Zstd,
    Snappy,
}

/// One command of the protocol. Requests that expect an answer carry a
/// `request_id` chosen by the client; the answer echoes it.
#[derive(Debug, Clone, PartialEq)]
pub enum Command {
    /// First frame from a client. `max_frame_bytes` (version 2) is the
    /// largest frame the client accepts, 0 when not announced.
    ///
    /// `auth_method` names how the client proves who it is (empty: it does
    /// not; `token`: a JWT in `auth_data`, as Apache Pulsar's token
    /// authentication).
    Connect {
        client_version: String,
        protocol_version: u32,
        max_frame_bytes: u32,
        auth_method: String,
        auth_data: AuthData,
    },
    /// The broker's answer to `Connect`. `max_frame_bytes` is the largest frame
    /// the broker accepts; `shard` is the shard the connection landed on;
    /// `shard_ports[i]` is the port shard `i` listens on by itself (empty:
    /// no per-shard listeners, e.g. an older broker).
    Connected {
        server_version: String,
        protocol_version: u32,
        max_frame_bytes: u32,
        shard: u32,
        shard_ports: Vec<u16>,
    },
    /// Create a producer on a topic. An empty `producer_name` asks the broker to
    /// generate a unique one.
    Producer {
        request_id: u64,
        producer_id: u64,
        topic: String,
        producer_name: String,
        access_mode: ProducerAccessMode,
    },
    /// `last_sequence_id` is the highest sequence id persisted for this
    /// producer name (-1 when none is known).
    ProducerSuccess {
        request_id: u64,
        producer_name: String,
        last_sequence_id: i64,
    },
    /// Publish one entry; the frame's payload is the message blob
    /// (see `encode_message`). `num_messages` > 1 for a batch.
    Send {
        producer_id: u64,
        sequence_id: u64,
        num_messages: u32,
    },
    /// The entry is durable (fdatasync'd) at `message_id`.
    SendReceipt {
        producer_id: u64,
        sequence_id: u64,
        message_id: MessageId,
    },
    /// The entry was not persisted.
    SendError {
        producer_id: u64,
        sequence_id: u64,
        code: ErrorCode,
        message: String,
    },
    Subscribe {
        request_id: u64,
        consumer_id: u64,
        topic: String,
        subscription: String,
        sub_type: SubscriptionType,
        consumer_name: String,
        initial_position: InitialPosition,
        durable: bool,
        /// Failover: the active consumer is the one with the lowest
        /// priority level, ties broken by consumer name.
        priority_level: i32,
        /// Deliver only messages with this tag; empty = no filter.
        filter_tag: String,
        /// Key_Shared sticky mode: inclusive `(start, end)` hash ranges this
        /// consumer owns (the broker checks them: `start <= end <= 65535`).
        /// Empty = auto split.
        key_shared_ranges: Vec<(u32, u32)>,
        /// Broadcast mode and Failover's allocation strategy.
        model: ConsumptionModel,
    },
    /// Generic success answer to a request.
    Success {
        request_id: u64,
    },
    /// Grant the broker `permits` more messages for this consumer.
    Flow {
        consumer_id: u64,
        permits: u32,
    },
    /// A message for a consumer; the frame's payload is the message blob.
    Message {
        consumer_id: u64,
        message_id: MessageId,
        redelivery_count: u32,
        /// Batch entry redelivered after some of its messages were
        /// acknowledged: bit i (of word i / 64) set = message i is acked
        /// and must not be delivered. Empty: none is.
        ack_set: Vec<u64>,
    },
    /// Protocol version 2: consecutive entries for one consumer in one
    /// frame. Entry i has `message_id` with `entry + i`, the run's
    /// `redelivery_count`, no batch-index acks, and the next `lengths[i]`
    /// bytes of the payload as its blob. The decoder checks that there is
    /// at least one length, that they add up to the payload's length and
    /// that the last entry number does not overflow
    /// ([`crate::WireError::BadRun`]); [`crate::run_entries`] splits the
    /// payload.
    MessageRun {
        consumer_id: u64,
        message_id: MessageId,
        redelivery_count: u32,
        lengths: Vec<u32>,
    },
    /// Broker to client: the broker closed this consumer for a reason the
    /// application must see (e.g. [`ErrorCode::DamagedEntry`]), unlike a
    /// bare `CloseConsumer` (topic unloaded: subscribe again). `entry`:
    /// the entry concerned, if any (batch index -1). No answer.
    ConsumerClosed {
        consumer_id: u64,
        code: ErrorCode,
        message: String,
        entry: Option<MessageId>,
    },
    /// Acknowledge. With `AckType::Cumulative` exactly one id is given.
    /// `request_id` 0 means the client does not want an answer.
    Ack {
        consumer_id: u64,
        ack_type: AckType,
        message_ids: Vec<MessageId>,
        request_id: u64,
        /// Empty, or one per id: the message count of the id's batch entry
        /// when the id acknowledges one message of a batch (batch_index >=
        /// 0); 0 acknowledges the whole entry.
        batch_sizes: Vec<u32>,
    },
    CloseProducer {
        request_id: u64,
        producer_id: u64,
    },
    CloseConsumer {
        request_id: u64,
        consumer_id: u64,
    },
    /// Delete the consumer's subscription and detach it (refused with other
    /// consumers attached unless `force`). Answered with `Success`.
    Unsubscribe {
        request_id: u64,
        consumer_id: u64,
        force: bool,
    },
    Ping,
    Pong,
    /// Failure of the request `request_id` (0 when not tied to a request).
    Error {
        request_id: u64,
        code: ErrorCode,
        message: String,
    },
    /// Deliver these unacknowledged messages again; empty = all of this
    /// consumer's unacknowledged messages. No answer.
    RedeliverUnacknowledged {
        consumer_id: u64,
        message_ids: Vec<MessageId>,
    },
    /// Broker to client: this consumer became the active one (or stopped
    /// being it) on a Failover or Exclusive subscription.
    ActiveConsumerChange {
        consumer_id: u64,
        is_active: bool,
    },
    /// Move the subscription's cursor to `message_id` (the next message
    /// delivered), or when `None` to the first message published at or after
    /// `publish_time_ms`. Answered with `Success`; the consumer's permits are
    /// reset to 0, so the client drops its queue and sends a new `Flow`.
    Seek {
        request_id: u64,
        consumer_id: u64,
        message_id: Option<MessageId>,
        publish_time_ms: u64,
    },
    /// Admin: per-subscription statistics of `topic`. Sent with an empty
    /// `json`; answered with the same command carrying a JSON object.
    TopicStats {
        request_id: u64,
        topic: String,
        json: String,
    },
    /// An admin or lookup operation: `op` names it, `json` is a JSON object
    /// with its arguments (see `docs/internals.md`, "Admin and lookup").
    AdminRequest {
        request_id: u64,
        op: String,
        json: String,
    },
    /// The answer to an `AdminRequest`: a JSON value.
    AdminResponse {
        request_id: u64,
        json: String,
    },
}

/// A decoded frame: the command plus its payload (empty for most commands).
/// The payload is a slice of the receive buffer, never copied.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub command: Command,
    pub payload: Bytes,
    /// The payload's CRC-32, when the decoder had it from checking the
    /// frame's checksum (payloads of at least
    /// [`PAYLOAD_CRC_MIN`](crate::PAYLOAD_CRC_MIN) bytes): a receiver that
    /// keeps a checksum of the bytes (the broker's log) takes it instead of
    /// reading them again.
    pub payload_crc: Option<u32>,
}

/// Metadata of one entry, stored in front of its payload (the "message blob").
/// Close to Pulsar's `MessageMetadata` so a Pulsar front door is a codec.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct MessageMetadata {
    pub producer_name: String,
    pub sequence_id: u64,
    /// Set by the client when it sends; milliseconds since the Unix epoch.
    pub publish_time_ms: u64,
    /// 0 when not set.
    pub event_time_ms: u64,
    pub partition_key: Option<String>,
    pub ordering_key: Option<Bytes>,
    pub properties: Vec<(String, String)>,
    /// Messages in this entry: 1 unless batched.
    pub num_messages: u32,
    /// 0 when not set: deliver at once.
    pub deliver_at_ms: u64,
    pub compression: CompressionType,
    pub uncompressed_size: u32,
    /// Chunking (issue #5): all chunks of one message share `uuid`.
    pub chunk: Option<ChunkInfo>,
    /// RocketMQ-style tag for broker-side filtering (issue #4).
    pub tag: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ChunkInfo {
    pub uuid: String,
    pub chunk_id: u32,
    pub num_chunks: u32,
    pub total_chunk_msg_size: u32,
}

impl Command {
    /// The variant's name, for logs and errors.
    pub fn name(&self) -> &'static str {
        match self {
            Self::Connect { .. } => "Connect",
            Self::Connected { .. } => "Connected",
            Self::Producer { .. } => "Producer",
            Self::ProducerSuccess { .. } => "ProducerSuccess",
            Self::Send { .. } => "Send",
            Self::SendReceipt { .. } => "SendReceipt",
            Self::SendError { .. } => "SendError",
            Self::Subscribe { .. } => "Subscribe",
            Self::Success { .. } => "Success",
            Self::Flow { .. } => "Flow",
            Self::Message { .. } => "Message",
            Self::Ack { .. } => "Ack",
            Self::CloseProducer { .. } => "CloseProducer",
            Self::CloseConsumer { .. } => "CloseConsumer",
            Self::Unsubscribe { .. } => "Unsubscribe",
            Self::Ping => "Ping",
            Self::Pong => "Pong",
            Self::Error { .. } => "Error",
            Self::RedeliverUnacknowledged { .. } => "RedeliverUnacknowledged",
            Self::ActiveConsumerChange { .. } => "ActiveConsumerChange",
            Self::Seek { .. } => "Seek",
            Self::TopicStats { .. } => "TopicStats",
            Self::AdminRequest { .. } => "AdminRequest",
            Self::AdminResponse { .. } => "AdminResponse",
            Self::MessageRun { .. } => "MessageRun",
            Self::ConsumerClosed { .. } => "ConsumerClosed",
        }
    }

    /// Whether frames of this command carry a payload (the message blob).
    /// Every other command's payload must be empty.
    pub fn carries_payload(&self) -> bool {
        matches!(self, Self::Send { .. } | Self::Message { .. } | Self::MessageRun { .. })
    }
}
