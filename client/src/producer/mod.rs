//! Producers: publish messages to one topic and await their receipts. This
//! module owns the builder and the producer's registration (on the topic
//! owner's connection, through `conn::pool`), sequence ids and the
//! in-flight bound, frames built in place around the payload, and chunked
//! sends; `batch` gathers messages into entries, `partitioned` routes over
//! a topic's partitions, `reconnect` survives lost connections.

pub(crate) mod batch;
mod builder;
mod frame;
pub(crate) mod partitioned;
pub(crate) mod reconnect;

use crate::conn::Connection;
use crate::error::{ClientError, Result};
use crate::message::OutgoingMessage;
use batch::{BatchReceipt, Batcher, BatchingOptions};
pub use builder::ProducerBuilder;
use bytes::Bytes;
use frame::ENTRY_HEADROOM_BYTES;
pub(crate) use frame::{metadata_variable_bytes, EntryBody};
use magnetar_wire::{Command, CompressionType, MessageId, MessageMetadata};
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::sync::{oneshot, Semaphore};

/// Default bound on sends awaiting their receipt, per producer.
pub const DEFAULT_MAX_PENDING: usize = 1000;
/// Upper bound accepted by [`ProducerBuilder::max_pending`] (tokio's
/// semaphore limit is far above; this keeps memory per producer sane).
pub const MAX_PENDING_MAX: usize = 1 << 20;

/// Default chunk size: below the broker's 5 MiB message limit with room for
/// the metadata.
pub const DEFAULT_CHUNK_BYTES: usize = 4 * 1024 * 1024;

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// The producer's connection-facing half: sequence ids, in-flight bound,
/// frames. Shared by the [`Producer`] handle and its batch flusher task.
pub(crate) struct ProducerCore {
    pub(crate) conn: Arc<Connection>,
    producer_id: u64,
    topic: String,
    name: String,
    max_pending: usize,
    block_if_queue_full: bool,
    /// One permit per send awaiting its receipt.
    permits: Arc<Semaphore>,
    /// Held while assigning a sequence id and queueing the frame, so that the
    /// frames hit the socket in sequence-id order.
    next_sequence_id: tokio::sync::Mutex<u64>,
    last_sequence_id: i64,
    closed: Arc<AtomicBool>,
    compression: CompressionType,
    /// Payloads above this many bytes (after compression) are chunked.
    chunk_bytes: Option<usize>,
}

impl ProducerCore {
    pub(crate) fn compression(&self) -> CompressionType {
        self.compression
    }

    /// The producer name (the broker's choice when none was given).
    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn closed_error(&self) -> ClientError {
        // Closed on purpose (by us or the broker) wins over a connection
        // that broke afterwards.
        if self.is_closed() {
            return ClientError::ProducerClosed { producer_name: self.name.clone() };
        }
        match self.conn.closed_reason() {
            Some(reason) => ClientError::Disconnected { reason },
            None => ClientError::ProducerClosed { producer_name: self.name.clone() },
        }
    }

    /// Queue one message as its own entry (compressed when the producer
    /// compresses).
    pub(crate) async fn send_single(&self, msg: OutgoingMessage) -> Result<SendFuture> {
        let compression = self.compression;
        let explicit = msg.sequence_id;
        let payload_len = msg.payload.len();
        let uncompressed_size = u32::try_from(payload_len)
            .map_err(|_| ClientError::MessageTooLarge { size: payload_len, max_frame_bytes: u32::MAX })?;
        let compressed = match compression {
            CompressionType::None => None,
            codec => Some(crate::compression::compress(codec, &msg.payload)?),
        };
        if let Some(chunk_bytes) = self.chunk_bytes {
            let payload = compressed.clone().unwrap_or_else(|| msg.payload.clone());
            if payload.len() > chunk_bytes {
                return self.send_chunked(msg, payload, uncompressed_size, chunk_bytes).await;
            }
        }
        let headroom = self.headroom(metadata_variable_bytes(&msg));
        self.send_entry(1, explicit, move |sequence_id| {
            // The one copy of the payload: into the frame's buffer.
            let body = EntryBody::copy_of(compressed.as_deref().unwrap_or(&msg.payload), headroom);
            let metadata = MessageMetadata {
                sequence_id,
                event_time_ms: msg.event_time_ms.unwrap_or(0),
                partition_key: msg.key,
                properties: msg.properties,
                num_messages: 1,
                compression,
                uncompressed_size,
                deliver_at_ms: msg.deliver_at_ms.unwrap_or(0),
                tag: msg.tag,
                ..MessageMetadata::default()
            };
            Ok((metadata, body))
        })
        .await
    }

    /// Bytes to leave free before an entry's payload for the frame head and
    /// the message metadata of this producer's entries, given the bytes of
    /// the entry's key, properties and tag (`EntryBody` falls back to a copy
    /// should it not be enough).
    pub(crate) fn headroom(&self, variable_bytes: usize) -> usize {
        ENTRY_HEADROOM_BYTES.saturating_add(self.name.len()).saturating_add(variable_bytes)
    }

    /// Queue one entry of `num_messages` messages. `build` gets the entry's
    /// sequence id (the explicit one, or the next) and returns its metadata
    /// and payload; producer name, publish time and message count are filled
    /// in here. Waits while `max_pending` entries await their receipts.
    pub(crate) async fn send_entry(
        &self,
        num_messages: u32,
        explicit_sequence_id: Option<u64>,
        build: impl FnOnce(u64) -> Result<(MessageMetadata, EntryBody)>,
    ) -> Result<SendFuture> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        let permit = if self.block_if_queue_full {
            self.permits.clone().acquire_owned().await.map_err(|_| self.closed_error())?
        } else {
            self.permits.clone().try_acquire_owned().map_err(|e| match e {
                tokio::sync::TryAcquireError::NoPermits => {
                    ClientError::ProducerQueueFull { producer_name: self.name.clone(), max_pending: self.max_pending }
                }
                tokio::sync::TryAcquireError::Closed => self.closed_error(),
            })?
        };
        let mut next = self.next_sequence_id.lock().await;
        // Re-check: close() or a broken connection may have come while we waited.
        if self.is_closed() {
            return Err(self.closed_error());
        }
        self.send_locked(&mut next, permit, num_messages, explicit_sequence_id, build).await
    }

    /// The part of `send_entry` done under the sequence lock (`next`).
    async fn send_locked(
        &self,
        next: &mut u64,
        permit: tokio::sync::OwnedSemaphorePermit,
        num_messages: u32,
        explicit_sequence_id: Option<u64>,
        build: impl FnOnce(u64) -> Result<(MessageMetadata, EntryBody)>,
    ) -> Result<SendFuture> {
        let sequence_id = explicit_sequence_id.unwrap_or(*next);
        let (mut metadata, body) = build(sequence_id)?;
        metadata.producer_name = self.name.clone();
        metadata.sequence_id = sequence_id;
        metadata.publish_time_ms = now_ms();
        metadata.num_messages = num_messages;
        let command = Command::Send { producer_id: self.producer_id, sequence_id, num_messages };
        let frame = body.into_frame(&command, &metadata, self.conn.server.max_frame_bytes)?;
        let (done, rx) = oneshot::channel();
        // The connection's send timer fails it if no receipt comes in time.
        self.conn.push_inflight(self.producer_id, sequence_id, done, permit)?;
        *next = (*next).max(sequence_id.saturating_add(u64::from(num_messages)));
        // If this fails the connection is down, and failing it already
        // completed the in-flight entry with the same error.
        self.conn.write_send(frame, self.producer_id, sequence_id).await?;
        Ok(SendFuture::new(rx, sequence_id))
    }

    /// Sends a compressed payload above the chunk size as chunks sharing one
    /// sequence id, all under one hold of the sequence lock (so no other
    /// send comes between them). The receipt is the last chunk's id, or the
    /// first chunk error.
    async fn send_chunked(
        &self,
        msg: OutgoingMessage,
        payload: Bytes,
        uncompressed_size: u32,
        chunk_bytes: usize,
    ) -> Result<SendFuture> {
        let len = payload.len();
        let num_chunks = u32::try_from(len.div_ceil(chunk_bytes))
            .map_err(|_| ClientError::MessageTooLarge { size: len, max_frame_bytes: u32::MAX })?;
        let total_chunk_msg_size =
            u32::try_from(len).map_err(|_| ClientError::MessageTooLarge { size: len, max_frame_bytes: u32::MAX })?;
        let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map_or(0, |d| d.as_nanos());
        let mut next = self.next_sequence_id.lock().await;
        let uuid = format!("{}-{}-{nanos:x}", self.name, *next);
        let headroom = self.headroom(metadata_variable_bytes(&msg).saturating_add(uuid.len()));
        let mut sequence_id = msg.sequence_id;
        let mut receipts = Vec::with_capacity(num_chunks as usize);
        for chunk_id in 0..num_chunks {
            if self.is_closed() {
                return Err(self.closed_error());
            }
            let permit = self.permits.clone().acquire_owned().await.map_err(|_| self.closed_error())?;
            let start = chunk_id as usize * chunk_bytes;
            let part = &payload[start..len.min(start + chunk_bytes)];
            let (uuid, msg) = (uuid.clone(), &msg);
            let receipt = self
                .send_locked(&mut next, permit, 1, sequence_id, move |seq| {
                    let metadata = MessageMetadata {
                        sequence_id: seq,
                        event_time_ms: msg.event_time_ms.unwrap_or(0),
                        partition_key: msg.key.clone(),
                        properties: msg.properties.clone(),
                        compression: self.compression,
                        uncompressed_size,
                        chunk: Some(magnetar_wire::ChunkInfo { uuid, chunk_id, num_chunks, total_chunk_msg_size }),
                        deliver_at_ms: msg.deliver_at_ms.unwrap_or(0),
                        tag: msg.tag.clone(),
                        ..MessageMetadata::default()
                    };
                    Ok((metadata, EntryBody::copy_of(part, headroom)))
                })
                .await?;
            sequence_id = Some(receipt.sequence_id());
            receipts.push(receipt);
        }
        drop(next);
        let (tx, rx) = oneshot::channel();
        tokio::spawn(async move {
            let mut last = Err(ClientError::Disconnected { reason: "no chunk sent".into() });
            for r in receipts {
                match r.await {
                    Ok(id) => last = Ok(id),
                    Err(e) => {
                        last = Err(e);
                        break;
                    }
                }
            }
            let _ = tx.send(last);
        });
        let after = self.conn.options.operation_timeout.saturating_mul(2);
        Ok(SendFuture::within(rx, sequence_id.unwrap_or(u64::MAX), after))
    }

    /// Wait until every send made so far has its receipt (or error).
    pub async fn flush(&self) -> Result<()> {
        let max = u32::try_from(self.max_pending).unwrap_or(u32::MAX);
        let after = self.conn.options.operation_timeout;
        match tokio::time::timeout(after, self.permits.acquire_many(max)).await {
            Ok(_) => Ok(()),
            Err(_) => Err(ClientError::Timeout { operation: "flush", after }),
        }
    }

    /// Wait for in-flight receipts (within the operation timeout), then close
    /// the producer on the broker. Later sends fail with `ProducerClosed`.
    pub async fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        let flushed = self.flush().await;
        let producer_id = self.producer_id;
        let answer =
            self.conn.request("close producer", |request_id| Command::CloseProducer { request_id, producer_id }).await;
        self.conn.remove_producer(producer_id);
        self.permits.close();
        flushed?;
        crate::conn::expect_success(answer?, "CloseProducer")
    }
}

impl Drop for ProducerCore {
    fn drop(&mut self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            // Best effort; request id 0 asks for no answer.
            self.conn.try_send_command(&Command::CloseProducer { request_id: 0, producer_id: self.producer_id });
            self.conn.remove_producer(self.producer_id);
        }
    }
}

/// A producer on one topic. Sends are pipelined: up to `max_pending` entries
/// await their receipts at once, and receipts arrive in send order. With
/// batching, messages are gathered into entries (see [`BatchingOptions`]).
/// `Send + Sync`; share it with an `Arc` to send from several tasks (sends
/// from concurrent tasks are ordered by when each gets the internal lock).
pub struct Producer {
    pub(crate) core: Arc<ProducerCore>,
    batcher: Option<Arc<Batcher>>,
    flusher: Option<tokio::task::JoinHandle<()>>,
}

impl std::fmt::Debug for Producer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Producer")
            .field("topic", &self.core.topic)
            .field("name", &self.core.name)
            .finish_non_exhaustive()
    }
}

impl Drop for Producer {
    fn drop(&mut self) {
        if let Some(f) = self.flusher.take() {
            f.abort();
        }
    }
}

impl Producer {
    fn new(core: Arc<ProducerCore>, batching: Option<BatchingOptions>) -> Self {
        match batching {
            None => Self { core, batcher: None, flusher: None },
            Some(options) => {
                let batcher = Arc::new(Batcher::new(options));
                let flusher = Some(tokio::spawn(batch::flush_loop(core.clone(), batcher.clone())));
                Self { core, batcher: Some(batcher), flusher }
            }
        }
    }

    /// The producer name (the broker's choice when none was given).
    pub fn name(&self) -> &str {
        &self.core.name
    }

    /// Full topic name.
    pub fn topic(&self) -> &str {
        &self.core.topic
    }

    /// The broker shard this producer's connection landed on: the topic's
    /// owner when the client connects shard-aware (the default against a
    /// broker with per-shard ports), unless routing fell back to the
    /// shared port.
    pub fn shard(&self) -> u32 {
        self.core.conn.server.shard
    }

    /// The highest sequence id the broker had persisted for this producer
    /// name when the producer was created (needs broker dedup); -1 when none.
    pub fn last_sequence_id(&self) -> i64 {
        self.core.last_sequence_id
    }

    /// Entries that await their receipt right now.
    pub fn pending(&self) -> usize {
        self.core.max_pending - self.core.permits.available_permits()
    }

    pub fn is_closed(&self) -> bool {
        self.core.is_closed()
    }

    /// Send one message and wait until it is durable; returns its id.
    pub async fn send(&self, msg: OutgoingMessage) -> Result<MessageId> {
        self.send_async(msg).await?.await
    }

    /// Queue one message and return as soon as it is on its way (or in the
    /// current batch), with a future for its receipt. Waits while
    /// `max_pending` entries await their receipts. Receipts complete in the
    /// order of `send_async` calls (per key with key-based batching).
    /// Dropping the returned future does not cancel the send. With batching,
    /// dropping `send_async`'s own future while it waits (say, under a
    /// timeout) does not cancel a batch already closed either, the caller's
    /// or another task's: those are sent by a task of their own.
    pub async fn send_async(&self, msg: OutgoingMessage) -> Result<SendFuture> {
        match &self.batcher {
            // A message with its own sequence id, a delivery time or a tag
            // goes alone, after what is batched (those are entry-level fields).
            Some(b) if msg.sequence_id.is_none() && msg.deliver_at_ms.is_none() && msg.tag.is_none() => {
                b.add(&self.core, msg).await
            }
            Some(b) => {
                b.flush_all(&self.core).await?;
                self.core.send_single(msg).await
            }
            None => self.core.send_single(msg).await,
        }
    }

    /// Send what is batched now, then wait until every send made so far has
    /// its receipt (or error).
    pub async fn flush(&self) -> Result<()> {
        if let Some(b) = &self.batcher {
            b.flush_all(&self.core).await?;
        }
        self.core.flush().await
    }

    /// Send what is batched, wait for in-flight receipts (within the
    /// operation timeout), then close the producer on the broker. Later sends
    /// fail with `ProducerClosed`.
    pub async fn close(&self) -> Result<()> {
        if let Some(b) = &self.batcher {
            if !self.core.is_closed() {
                b.flush_all(&self.core).await?;
            }
        }
        let closed = self.core.close().await;
        if let Some(b) = &self.batcher {
            // The flusher ends.
            b.wake.notify_one();
        }
        closed
    }
}

/// The receipt of one send: resolves to the message id once the broker has
/// made the message durable, or to the error that prevented it. Times out
/// after the client's operation timeout, counted from when `send_async`
/// queued the message, just before it returns (for a chunked message,
/// twice that); the outcome is settled then, whether or not the future is
/// being polled. A batched message shares its batch's
/// receipt: it times out if its batch did not go out within the operation
/// timeout plus twice the batch delay and a margin (half the delay, at least
/// 1 ms) of the batch's first message, or if the batch's entry
/// got no receipt within the operation timeout of being sent.
#[must_use = "the receipt says whether the message was stored"]
pub struct SendFuture {
    receipt: Receipt,
    sequence_id: u64,
}

enum Receipt {
    /// The receipt of an entry of its own; the connection's send timer
    /// completes it with `Timeout` when it is overdue.
    Entry { rx: oneshot::Receiver<Result<MessageId>> },
    /// A receipt with a deadline of its own (a chunked message's, made of
    /// its chunks' receipts).
    Timed { rx: oneshot::Receiver<Result<MessageId>>, timeout: Pin<Box<tokio::time::Sleep>>, after: Duration },
    /// Message `index` of a batch; `waker` is where this future's waker sits
    /// in the batch's receipt once registered.
    Batched { batch: Arc<BatchReceipt>, index: u32, waker: Option<usize> },
}

impl SendFuture {
    /// The receipt of a send recorded with `Connection::push_inflight`
    /// (whose timer fails it when overdue).
    pub(crate) fn new(rx: oneshot::Receiver<Result<MessageId>>, sequence_id: u64) -> Self {
        Self { receipt: Receipt::Entry { rx }, sequence_id }
    }

    /// A receipt that times out `after` from now.
    pub(crate) fn within(rx: oneshot::Receiver<Result<MessageId>>, sequence_id: u64, after: Duration) -> Self {
        Self { receipt: Receipt::Timed { rx, timeout: Box::pin(tokio::time::sleep(after)), after }, sequence_id }
    }

    /// Message `index` of the batch whose receipt is `batch`.
    pub(crate) fn batched(batch: Arc<BatchReceipt>, index: u32) -> Self {
        Self { receipt: Receipt::Batched { batch, index, waker: None }, sequence_id: u64::MAX }
    }

    /// The sequence id this message's entry was sent with (`u64::MAX` for a
    /// batched message: its batch gets an id when it goes out).
    pub fn sequence_id(&self) -> u64 {
        self.sequence_id
    }
}

impl Future for SendFuture {
    type Output = Result<MessageId>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match &mut self.receipt {
            Receipt::Entry { rx } => poll_receipt(rx, cx),
            Receipt::Timed { rx, timeout, after } => {
                if let Poll::Ready(outcome) = poll_receipt(rx, cx) {
                    return Poll::Ready(outcome);
                }
                if timeout.as_mut().poll(cx).is_ready() {
                    return Poll::Ready(Err(ClientError::Timeout { operation: "send receipt", after: *after }));
                }
                Poll::Pending
            }
            Receipt::Batched { batch, index, waker } => batch.poll(*index, waker, cx),
        }
    }
}

/// The outcome sent to `rx`, if any yet.
fn poll_receipt(rx: &mut oneshot::Receiver<Result<MessageId>>, cx: &mut Context<'_>) -> Poll<Result<MessageId>> {
    match Pin::new(rx).poll(cx) {
        Poll::Ready(Ok(outcome)) => Poll::Ready(outcome),
        // Never sent: the sender is gone (a chunked message's task, dropped
        // as the runtime shut down).
        Poll::Ready(Err(_)) => {
            Poll::Ready(Err(ClientError::Disconnected { reason: "send abandoned by the client".into() }))
        }
        Poll::Pending => Poll::Pending,
    }
}
