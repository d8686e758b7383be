//! A producer's options, and its registration with the broker: on the
//! connection to the topic's owner (`conn::pool`), continuing after the
//! sequence id the broker persisted for its name.

use super::batch::BatchingOptions;
use super::{partitioned, Producer, ProducerCore, MAX_PENDING_MAX};
use crate::conn::pool::Origin;
use crate::conn::Connection;
use crate::error::{ClientError, Result};
use crate::names::normalize_topic;
use magnetar_wire::{Command, CompressionType, ProducerAccessMode};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// Options of a producer; made by [`Client::producer`](crate::Client::producer).
///
/// ```no_run
/// # async fn f(client: magnetar_client::Client) -> Result<(), magnetar_client::ClientError> {
/// let producer = client.producer("orders").name("p1").max_pending(500).create().await?;
/// # Ok(()) }
/// ```
#[must_use = "call .create().await"]
pub struct ProducerBuilder {
    pub(crate) origin: Origin,
    pub(crate) topic: String,
    pub(crate) name: Option<String>,
    pub(crate) max_pending: usize,
    pub(crate) access_mode: ProducerAccessMode,
    pub(crate) batching: Option<BatchingOptions>,
    pub(crate) compression: CompressionType,
    pub(crate) chunk_bytes: Option<usize>,
    pub(crate) block_if_queue_full: bool,
}

impl ProducerBuilder {
    /// A builder with the defaults: generated name, `DEFAULT_MAX_PENDING`,
    /// shared access, no batching, compression or chunking, blocking when full.
    pub(crate) fn new(origin: Origin, topic: String) -> Self {
        Self {
            origin,
            topic,
            name: None,
            max_pending: crate::DEFAULT_MAX_PENDING,
            access_mode: ProducerAccessMode::Shared,
            batching: None,
            compression: CompressionType::None,
            chunk_bytes: None,
            block_if_queue_full: true,
        }
    }

    /// Producer name, unique per topic; the broker generates one if unset.
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = Some(name.into());
        self
    }

    /// How many sends may await their receipt at once (default 1000);
    /// `send_async` waits for a free slot beyond that.
    pub fn max_pending(mut self, max_pending: usize) -> Self {
        self.max_pending = max_pending;
        self
    }

    /// What `send_async` does when `max_pending` sends await receipts: wait
    /// for a free slot (`true`, the default) or fail at once with
    /// [`ClientError::ProducerQueueFull`] (`false`), for callers that must
    /// never block.
    pub fn block_if_queue_full(mut self, block: bool) -> Self {
        self.block_if_queue_full = block;
        self
    }

    /// How this producer shares the topic (default `Shared`). With
    /// `WaitForExclusive`, `create` waits (without a deadline) until the
    /// current exclusive producer leaves.
    pub fn access_mode(mut self, mode: ProducerAccessMode) -> Self {
        self.access_mode = mode;
        self
    }

    /// A producer on the topic's name covering every partition (or the topic
    /// itself when it is not partitioned), routing with `routing`.
    pub async fn create_partitioned(self, routing: partitioned::RoutingMode) -> Result<crate::PartitionedProducer> {
        partitioned::PartitionedProducer::create(self, routing).await
    }

    /// Batch messages (by count, bytes and delay; per key with
    /// `key_based`). Off by default: each send is one entry.
    pub fn batching(mut self, options: BatchingOptions) -> Self {
        self.batching = Some(options);
        self
    }

    /// Compress each entry's payload (a message's, or a batch's) with `codec`.
    pub fn compression(mut self, codec: CompressionType) -> Self {
        self.compression = codec;
        self
    }

    /// Split messages whose (compressed) payload is above `chunk_bytes` into
    /// chunks the consumer reassembles (`DEFAULT_CHUNK_BYTES` = 4 MiB fits
    /// the broker's default 5 MiB message limit). Not with batching: a
    /// batched message is never chunked.
    pub fn chunking(mut self, chunk_bytes: usize) -> Self {
        self.chunk_bytes = Some(chunk_bytes.max(1));
        self
    }

    /// Register the producer with the broker: on the connection to the
    /// shard that owns the topic when the broker has per-shard ports
    /// (looked up again when that shard answers `NotOwner`), else on the
    /// client's connection.
    pub async fn create(self) -> Result<Producer> {
        if self.max_pending == 0 || self.max_pending > MAX_PENDING_MAX {
            return Err(ClientError::InvalidOption { option: "max_pending", reason: "must be in 1..=1048576" });
        }
        let topic = normalize_topic(&self.topic)?;
        if let Some(b) = &self.batching {
            b.validate()?;
        }
        let (builder, name) = (&self, topic.as_str());
        let (conn, answer) = self
            .origin
            .on_owner(name, true, |conn| async move {
                let answer = builder.register(&conn, name).await?;
                Ok((conn, answer))
            })
            .await?;
        let (producer_id, name, last_sequence_id, closed) = answer;
        // Continue after what the broker has persisted for this name, so a
        // restarted named producer never reuses a sequence id (dedup-safe).
        let next_sequence_id = u64::try_from(last_sequence_id.saturating_add(1)).unwrap_or(0);
        let core = Arc::new(ProducerCore {
            conn,
            producer_id,
            topic,
            name,
            max_pending: self.max_pending,
            permits: Arc::new(Semaphore::new(self.max_pending)),
            next_sequence_id: tokio::sync::Mutex::new(next_sequence_id),
            last_sequence_id,
            closed,
            compression: self.compression,
            chunk_bytes: self.chunk_bytes,
            block_if_queue_full: self.block_if_queue_full,
        });
        Ok(Producer::new(core, self.batching))
    }

    /// Creates the producer on `conn`: its id, name, last sequence id and
    /// closed flag.
    async fn register(&self, conn: &Arc<Connection>, topic: &str) -> Result<(u64, String, i64, Arc<AtomicBool>)> {
        let producer_id = conn.next_handle_id();
        let requested_name = self.name.clone().unwrap_or_default();
        let access_mode = self.access_mode;
        let after = match access_mode {
            // Waiting for the topic is the point; a year stands for "no deadline".
            ProducerAccessMode::WaitForExclusive => Duration::from_secs(365 * 24 * 3600),
            _ => conn.options.operation_timeout,
        };
        let answer = conn
            .request_within("create producer", after, |request_id| Command::Producer {
                request_id,
                producer_id,
                topic: topic.to_string(),
                producer_name: requested_name.clone(),
                access_mode,
            })
            .await?;
        let Command::ProducerSuccess { producer_name, last_sequence_id, .. } = answer else {
            return Err(ClientError::UnexpectedResponse { request: "Producer", got: format!("{answer:?}") });
        };
        let name = if producer_name.is_empty() { requested_name } else { producer_name };
        let closed = Arc::new(AtomicBool::new(false));
        conn.register_producer(producer_id, name.clone(), closed.clone())?;
        Ok((producer_id, name, last_sequence_id, closed))
    }
}
