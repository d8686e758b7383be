//! Producer-side batching: messages gathered into one entry by count, bytes
//! and delay, optionally one batch per key (key-based batching, so that a
//! Key_Shared consumer gets whole batches of one key). The batch payload
//! format is in `magnetar_wire::batch` and `docs/format.md`; a batch is
//! compressed as a whole. A "batch" of one message goes out as a plain
//! message. Each batch has one sequence id; its messages carry
//! `sequence id + index`.

use crate::error::{ClientError, Result};
use crate::message::OutgoingMessage;
use crate::producer::{ProducerCore, SendFuture};
use bytes::{Bytes, BytesMut};
use magnetar_wire::{encode_batch_record_into, BatchMessage, MessageId, MessageMetadata};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// How a producer batches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchingOptions {
    /// A batch is sent once it holds this many messages (default 1000).
    pub max_messages: usize,
    /// ... or this many payload bytes (default 128 KiB).
    pub max_bytes: usize,
    /// ... or its first message waited this long (default 10 ms).
    pub max_delay: Duration,
    /// One batch per message key (messages without a key share one).
    pub key_based: bool,
}

impl Default for BatchingOptions {
    fn default() -> Self {
        Self { max_messages: 1000, max_bytes: 128 * 1024, max_delay: Duration::from_millis(10), key_based: false }
    }
}

/// Most messages in one batch (the broker's and consumers' decoders accept
/// up to `magnetar_wire::BATCH_MESSAGES_MAX`).
pub const BATCH_MESSAGES_LIMIT: usize = 100_000;

impl BatchingOptions {
    pub(crate) fn validate(&self) -> Result<()> {
        if self.max_messages == 0 || self.max_messages > BATCH_MESSAGES_LIMIT {
            return Err(ClientError::InvalidOption { option: "batch max_messages", reason: "must be in 1..=100000" });
        }
        if self.max_bytes == 0 {
            return Err(ClientError::InvalidOption { option: "batch max_bytes", reason: "must be above 0" });
        }
        if self.max_delay.is_zero() {
            return Err(ClientError::InvalidOption { option: "batch max_delay", reason: "must be above 0" });
        }
        Ok(())
    }
}

struct Pending {
    msg: OutgoingMessage,
    done: oneshot::Sender<Result<MessageId>>,
}

struct Container {
    msgs: Vec<Pending>,
    bytes: usize,
    first_at: Instant,
}

/// The open batches of one producer.
pub(crate) struct Batcher {
    options: BatchingOptions,
    /// Key (`None` unless key-based) → open batch. Held across the send of
    /// a full batch, so batches leave in the order they filled.
    open: tokio::sync::Mutex<BTreeMap<Option<String>, Container>>,
}

/// A failed entry fails each of its messages; `ClientError` is not `Clone`.
fn copy_error(e: &ClientError) -> ClientError {
    match e {
        ClientError::Broker { code, message } => ClientError::Broker { code: *code, message: message.clone() },
        ClientError::Disconnected { reason } => ClientError::Disconnected { reason: reason.clone() },
        ClientError::ProducerClosed { producer_name } => {
            ClientError::ProducerClosed { producer_name: producer_name.clone() }
        }
        ClientError::Timeout { operation, after } => ClientError::Timeout { operation, after: *after },
        other => ClientError::Disconnected { reason: other.to_string() },
    }
}

impl Batcher {
    pub(crate) fn new(options: BatchingOptions) -> Self {
        Self { options, open: tokio::sync::Mutex::new(BTreeMap::new()) }
    }

    pub(crate) async fn add(&self, core: &ProducerCore, msg: OutgoingMessage) -> Result<SendFuture> {
        if core.is_closed() {
            return Err(ClientError::ProducerClosed { producer_name: core.name().to_string() });
        }
        let (done, rx) = oneshot::channel();
        let key = if self.options.key_based { msg.key.clone() } else { None };
        let len = msg.payload.len();
        let mut open = self.open.lock().await;
        // Would not fit: send what the key's batch holds first.
        let full_before = open.get(&key).is_some_and(|c| !c.msgs.is_empty() && c.bytes + len > self.options.max_bytes);
        if full_before {
            if let Some(c) = open.remove(&key) {
                send_batch(core, c).await;
            }
        }
        let c = open.entry(key.clone()).or_insert_with(|| Container {
            msgs: Vec::new(),
            bytes: 0,
            first_at: Instant::now(),
        });
        c.msgs.push(Pending { msg, done });
        c.bytes += len;
        if c.msgs.len() >= self.options.max_messages || c.bytes >= self.options.max_bytes {
            if let Some(c) = open.remove(&key) {
                send_batch(core, c).await;
            }
        }
        Ok(SendFuture::new(rx, u64::MAX, core.conn.options.operation_timeout + self.options.max_delay))
    }

    /// Sends every open batch now.
    pub(crate) async fn flush_all(&self, core: &ProducerCore) -> Result<()> {
        let mut open = self.open.lock().await;
        for (_, c) in std::mem::take(&mut *open) {
            send_batch(core, c).await;
        }
        Ok(())
    }

    /// Sends the batches whose first message waited `max_delay`.
    async fn flush_due(&self, core: &ProducerCore) {
        let mut open = self.open.lock().await;
        let due: Vec<Option<String>> = open
            .iter()
            .filter(|(_, c)| c.first_at.elapsed() >= self.options.max_delay)
            .map(|(k, _)| k.clone())
            .collect();
        for k in due {
            if let Some(c) = open.remove(&k) {
                send_batch(core, c).await;
            }
        }
    }
}

/// The producer's timer: sends batches that waited long enough. Ends with
/// the producer.
pub(crate) async fn flush_loop(core: Arc<ProducerCore>, batcher: Arc<Batcher>) {
    let tick = (batcher.options.max_delay / 2).max(Duration::from_millis(1));
    while !core.is_closed() {
        tokio::time::sleep(tick).await;
        batcher.flush_due(&core).await;
    }
}

/// Sends one batch as one entry and arranges for each message's receipt.
/// Errors go to the messages' receipts.
async fn send_batch(core: &ProducerCore, c: Container) {
    let mut msgs = c.msgs;
    if msgs.len() == 1 {
        let Some(Pending { msg, done }) = msgs.pop() else { return };
        match core.send_single(msg).await {
            Ok(fut) => {
                tokio::spawn(async move {
                    let _ = done.send(fut.await);
                });
            }
            Err(e) => {
                let _ = done.send(Err(e));
            }
        }
        return;
    }
    let n = u32::try_from(msgs.len()).unwrap_or(u32::MAX);
    let compression = core.compression();
    // Key-based batches hold one key: it becomes the entry's key too.
    let shared_key = msgs
        .first()
        .and_then(|p| p.msg.key.clone())
        .filter(|k| msgs.iter().all(|p| p.msg.key.as_deref() == Some(k.as_str())));
    let records: Vec<BatchMessage> = msgs
        .iter()
        .map(|p| BatchMessage {
            properties: p.msg.properties.clone(),
            partition_key: p.msg.key.clone(),
            ordering_key: None,
            event_time_ms: p.msg.event_time_ms.unwrap_or(0),
            sequence_id: 0,
            payload: p.msg.payload.clone(),
        })
        .collect();
    let sent = core
        .send_entry(n, None, move |sequence_id| {
            let mut buf = BytesMut::new();
            for (i, mut r) in records.into_iter().enumerate() {
                r.sequence_id = sequence_id.saturating_add(i as u64);
                encode_batch_record_into(&r, &mut buf);
            }
            let uncompressed_size = u32::try_from(buf.len())
                .map_err(|_| ClientError::MessageTooLarge { size: buf.len(), max_frame_bytes: u32::MAX })?;
            let payload: Bytes = crate::compression::compress(compression, &buf)?;
            let metadata = MessageMetadata {
                partition_key: shared_key,
                compression,
                uncompressed_size,
                ..MessageMetadata::default()
            };
            Ok((metadata, payload))
        })
        .await;
    match sent {
        Ok(fut) => {
            tokio::spawn(async move {
                let result = fut.await;
                for (i, p) in msgs.into_iter().enumerate() {
                    let r = match &result {
                        Ok(id) => Ok(MessageId { batch_index: i32::try_from(i).unwrap_or(i32::MAX), ..*id }),
                        Err(e) => Err(copy_error(e)),
                    };
                    let _ = p.done.send(r);
                }
            });
        }
        Err(e) => {
            for p in msgs {
                let _ = p.done.send(Err(copy_error(&e)));
            }
        }
    }
}
