//! The client's error type.

use magnetar_wire::{ErrorCode, WireError};
use std::time::Duration;

/// Everything that can go wrong in the client. Operating errors only: broken
/// invariants inside the client are `assert!`ed, not returned.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// The service URL is not `magnetar://HOST:PORT` or `HOST:PORT`.
    #[error("invalid service url {url:?}: {reason}")]
    InvalidUrl { url: String, reason: &'static str },

    /// The topic name is not `persistent://tenant/namespace/topic`, `tenant/namespace/topic` or `topic`.
    #[error("invalid topic name {topic:?}: {reason}")]
    InvalidTopic { topic: String, reason: &'static str },

    /// An invalid option was given to a builder (e.g. `max_pending(0)`).
    #[error("invalid option {option}: {reason}")]
    InvalidOption { option: &'static str, reason: &'static str },

    /// The TCP connection to the broker could not be opened.
    #[error("cannot connect to {addr}: {source}")]
    Connect { addr: String, source: std::io::Error },

    /// Reading or writing the socket failed.
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),

    /// A frame or message from the broker could not be decoded, or one of ours
    /// could not be encoded.
    #[error("wire error: {0}")]
    Wire(#[from] WireError),

    /// The broker answered the request with an error.
    #[error("broker error {code:?}: {message}")]
    Broker { code: ErrorCode, message: String },

    /// The connection is gone (closed by either side, I/O error, protocol
    /// violation, keepalive timeout). Every request pending on it fails with
    /// this error; `reason` says what ended the connection.
    #[error("disconnected from broker: {reason}")]
    Disconnected { reason: String },

    /// The broker did not answer within the operation timeout.
    #[error("{operation} timed out after {after:?}")]
    Timeout { operation: &'static str, after: Duration },

    /// The broker answered with a command that does not fit the request.
    #[error("unexpected answer to {request}: {got}")]
    UnexpectedResponse { request: &'static str, got: String },

    /// The message does not fit in one frame of the broker's frame limit.
    #[error("message of {size} bytes is larger than the broker's frame limit of {max_frame_bytes} bytes")]
    MessageTooLarge { size: usize, max_frame_bytes: u32 },

    /// `max_pending` sends await their receipts and the producer was built
    /// with `block_if_queue_full(false)`.
    #[error("producer {producer_name:?} has {max_pending} sends awaiting receipts (queue full)")]
    ProducerQueueFull { producer_name: String, max_pending: usize },

    /// The producer was closed (by `close()` or by the broker).
    #[error("producer {producer_name:?} is closed")]
    ProducerClosed { producer_name: String },

    #[error("{codec} compression: {reason}")]
    Compression { codec: String, reason: String },

    /// The consumer was closed (by `close()` or by the broker).
    #[error("consumer of subscription {subscription:?} is closed")]
    ConsumerClosed { subscription: String },

    /// The broker closed the consumer because `entry`, the next one its
    /// subscription must deliver, is damaged on the broker's disk (fails
    /// its checksum; never served). Subscribing again meets the same entry
    /// until an operator moves the subscription past it (`magnetar admin
    /// subscriptions skip-damaged TOPIC SUB`). Not retriable.
    #[error("subscription {subscription:?}: damaged entry {}:{}: {message}", entry.ledger, entry.entry)]
    DamagedEntry { subscription: String, entry: magnetar_wire::MessageId, message: String },
}

impl ClientError {
    /// Whether retrying the same operation later could succeed.
    pub fn is_retriable(&self) -> bool {
        match self {
            Self::Broker { code, .. } => code.is_retriable(),
            Self::Io(_)
            | Self::Connect { .. }
            | Self::Disconnected { .. }
            | Self::Timeout { .. }
            | Self::ProducerQueueFull { .. } => true,
            _ => false,
        }
    }
}

pub type Result<T, E = ClientError> = std::result::Result<T, E>;
