//! Frame demultiplexing: the connection's reader task decodes frames and
//! routes each one to a pending request (by `request_id`), a producer's
//! sends (by `producer_id`, receipts in sequence order) or a consumer's
//! queue (by `consumer_id`), and answers `Ping`.
//!
//! Entries go into a consumer's queue as the broker sent them (blobs,
//! slices of the frame): decompressing and splitting batches is the
//! consumer's, when it takes them off its queue (`crate::consumer::inbox`),
//! so that the one reader of a connection never spends its time on one
//! consumer's messages.

use super::shared::Shared;
use super::READ_CHUNK_BYTES;
use crate::error::{ClientError, Result};
use bytes::{Bytes, BytesMut};
use magnetar_wire::{Command, ErrorCode, FrameDecoder, MessageId};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use tokio::io::AsyncReadExt;
use tokio::net::tcp::OwnedReadHalf;
use tokio::sync::mpsc;

/// What a connection puts in a consumer's queue, with the index of the
/// consumer it is for (0 for a consumer with a queue of its own; a
/// multi-topic consumer's members share one queue).
pub(crate) struct Queued {
    pub(crate) source: u32,
    pub(crate) item: Inbound,
}

/// `topic` is the topic of the broker-side consumer the entries came from (a
/// consumer with a retry topic has two on one queue), shared by every
/// message of it.
pub(crate) enum Inbound {
    /// One entry as the broker sent it: a message or a batch, maybe
    /// compressed; `ack_set` marks a redelivered batch's messages
    /// acknowledged before.
    Entry { topic: Arc<str>, id: MessageId, redelivery_count: u32, ack_set: Vec<u64>, blob: Bytes },
    /// The entries of one `MessageRun`, in order: one queue item per run,
    /// not per entry.
    Run { topic: Arc<str>, redelivery_count: u32, entries: std::vec::IntoIter<(MessageId, Bytes)> },
    /// The consumer's connection slot is gone (closed by us or the broker,
    /// or the connection ended): nothing more comes from it.
    End,
    /// Put by a multi-topic consumer into its own queue: a member joined (or
    /// failed to), so deliveries held back for it can go on.
    Joined,
    /// The broker closed the consumer with a reason the application must
    /// see (`ConsumerClosed`): handed out as this error after what came
    /// before it; `End` follows.
    Failed(ClientError),
}

/// The sending side of a consumer's queue, held by its connection slot.
/// The slot's own `Inbox` puts `Inbound::End` in the queue when it is
/// dropped; its clones (the reader's, for the time of one frame) and a
/// retry topic's slot's do not.
pub(crate) struct Inbox {
    tx: mpsc::UnboundedSender<Queued>,
    source: u32,
    topic: Arc<str>,
    end_on_drop: bool,
}

impl Inbox {
    /// The queue of consumer `source` of `tx`, for messages of `topic`;
    /// `end_on_drop`: whether dropping it ends the consumer's messages.
    pub(crate) fn new(tx: mpsc::UnboundedSender<Queued>, source: u32, topic: Arc<str>, end_on_drop: bool) -> Self {
        Self { tx, source, topic, end_on_drop }
    }

    /// Queues `item` (dropped if the consumer is gone).
    fn send(&self, item: Inbound) {
        let _ = self.tx.send(Queued { source: self.source, item });
    }

    /// No `End` when dropped (the slot of a subscribe that failed).
    pub(crate) fn disarm(&mut self) {
        self.end_on_drop = false;
    }
}

impl Clone for Inbox {
    fn clone(&self) -> Self {
        Self { tx: self.tx.clone(), source: self.source, topic: self.topic.clone(), end_on_drop: false }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        if self.end_on_drop {
            self.send(Inbound::End);
        }
    }
}

pub(super) async fn reader_loop(
    shared: Arc<Shared>,
    mut rd: OwnedReadHalf,
    mut decoder: FrameDecoder,
    mut buf: BytesMut,
    write: mpsc::WeakSender<Bytes>,
    pong: Bytes,
) {
    let mut shutdown = shared.shutdown.subscribe();
    // One wait for shutdown for the whole loop: a new one per read
    // registered with the watch (and unregistered) each time.
    let stopped = shutdown.changed();
    tokio::pin!(stopped);
    shared.touch();
    let reason = 'conn: loop {
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    shared.touch();
                    if let Err(reason) = dispatch(&shared, frame.command, frame.payload, &write, &pong).await {
                        break 'conn reason;
                    }
                }
                Ok(None) => break,
                // A bad length or checksum loses the frame boundary: nothing
                // after it can be trusted.
                Err(e) if e.is_fatal() => break 'conn format!("undecodable frame from broker: {e}"),
                // The frame was sound but its command was not understood (e.g.
                // a newer broker); the decoder skipped it.
                Err(e) => tracing::warn!(error = %e, "skipped a frame from the broker"),
            }
        }
        buf.reserve(READ_CHUNK_BYTES);
        tokio::select! {
            read = rd.read_buf(&mut buf) => match read {
                Ok(0) => break 'conn "broker closed the connection".to_string(),
                Ok(_) => {}
                Err(e) => break 'conn format!("read from broker failed: {e}"),
            },
            _ = &mut stopped => return,
        }
    };
    shared.fail(reason);
}

/// Route one frame from the broker. An `Err` is a protocol violation that
/// ends the connection.
pub(super) async fn dispatch(
    shared: &Shared,
    command: Command,
    payload: Bytes,
    write: &mpsc::WeakSender<Bytes>,
    pong: &Bytes,
) -> std::result::Result<(), String> {
    match command {
        Command::ProducerSuccess { request_id, .. }
        | Command::Success { request_id }
        | Command::AdminResponse { request_id, .. }
        | Command::TopicStats { request_id, .. } => {
            complete_request(shared, request_id, Ok(command));
        }
        Command::Error { request_id: 0, code, message } => {
            // Not tied to a request (e.g. a fire-and-forget ack failed).
            tracing::warn!(?code, %message, "broker reported an error");
        }
        Command::Error { request_id, code, message } => {
            complete_request(shared, request_id, Err(ClientError::Broker { code, message }));
        }
        Command::SendReceipt { producer_id, sequence_id, message_id } => {
            let mut st = shared.lock();
            let Some(slot) = st.producers.get_mut(&producer_id) else {
                tracing::debug!(producer_id, sequence_id, "receipt for an unknown producer");
                return Ok(());
            };
            match slot.inflight.front() {
                Some(front) if front.sequence_id == sequence_id => {
                    if let Some(send) = slot.inflight.pop_front() {
                        send.finish(Ok(message_id));
                    }
                }
                Some(front) if front.sequence_id < sequence_id => {
                    // Receipts must come in sequence order: one for a later
                    // message means the broker skipped ours; whether it is
                    // stored is unknown, so the connection cannot be trusted.
                    return Err(format!(
                        "receipt for sequence id {sequence_id} of producer {producer_id} \
                         before the one for {}",
                        front.sequence_id
                    ));
                }
                // Older than anything in flight: a duplicate; harmless.
                _ => tracing::debug!(producer_id, sequence_id, "receipt for a send not in flight"),
            }
        }
        Command::SendError { producer_id, sequence_id, code, message } => {
            let mut st = shared.lock();
            if let Some(slot) = st.producers.get_mut(&producer_id) {
                if let Some(pos) = slot.inflight.iter().position(|s| s.sequence_id == sequence_id) {
                    if let Some(send) = slot.inflight.remove(pos) {
                        send.finish(Err(ClientError::Broker { code, message }));
                    }
                }
            }
        }
        Command::Message { consumer_id, message_id, redelivery_count, ack_set } => {
            let Some(deliver) = consumer_target(shared, consumer_id) else {
                tracing::debug!(consumer_id, %message_id, "message for an unknown consumer");
                return Ok(());
            };
            // Queued as it came: the consumer unpacks it when it takes it
            // off its queue (a bad entry is then that message's error).
            deliver.send(Inbound::Entry {
                topic: deliver.topic.clone(),
                id: message_id,
                redelivery_count,
                ack_set,
                blob: payload,
            });
        }
        Command::MessageRun { consumer_id, message_id, redelivery_count, lengths } => {
            let Some(deliver) = consumer_target(shared, consumer_id) else {
                tracing::debug!(consumer_id, %message_id, "message run for an unknown consumer");
                return Ok(());
            };
            // The decoder checked the lengths against the payload; a run
            // that does not fit is a broker fault, and ends the connection.
            // Its entries (slices of the frame) go into the queue as one item.
            let entries = magnetar_wire::run_entries(message_id, &lengths, &payload).map_err(|e| e.to_string())?;
            let entries = entries.collect::<Vec<_>>().into_iter();
            deliver.send(Inbound::Run { topic: deliver.topic.clone(), redelivery_count, entries });
        }
        Command::CloseProducer { producer_id, .. } => {
            // The broker closed our producer (e.g. topic unloaded).
            let slot = shared.lock().producers.remove(&producer_id);
            if let Some(slot) = slot {
                slot.closed.store(true, Ordering::Release);
                for send in slot.inflight {
                    send.finish(Err(ClientError::ProducerClosed { producer_name: slot.name.clone() }));
                }
            }
        }
        Command::CloseConsumer { consumer_id, .. } => {
            let slot = shared.lock().consumers.remove(&consumer_id);
            if let Some(slot) = slot {
                tracing::debug!(subscription = %slot.subscription, "consumer closed by the broker");
                slot.closed.store(true, Ordering::Release);
                slot.timers.notify_one();
            }
        }
        Command::ConsumerClosed { consumer_id, code, message, entry } => {
            let slot = shared.lock().consumers.remove(&consumer_id);
            if let Some(slot) = slot {
                tracing::warn!(subscription = %slot.subscription, ?code, %message, "consumer closed by the broker");
                let error = match (code, entry) {
                    (ErrorCode::DamagedEntry, Some(entry)) => {
                        ClientError::DamagedEntry { subscription: slot.subscription.clone(), entry, message }
                    }
                    _ => ClientError::Broker { code, message },
                };
                slot.deliver.send(Inbound::Failed(error));
                slot.closed.store(true, Ordering::Release);
                slot.timers.notify_one();
            }
        }
        Command::ActiveConsumerChange { consumer_id, is_active } => {
            if let Some(slot) = shared.lock().consumers.get(&consumer_id) {
                slot.active.store(is_active, Ordering::Release);
            }
        }
        Command::Ping => {
            // Best effort: if the write queue is full the connection is
            // evidently alive and busy, and the broker will see traffic.
            if let Some(w) = write.upgrade() {
                let _ = w.try_send(pong.clone());
            }
        }
        Command::Pong => {}
        other => return Err(format!("unexpected command from broker: {other:?}")),
    }
    Ok(())
}

/// Where deliveries to `consumer_id` go (`None` for a consumer this
/// connection does not know, e.g. closed meanwhile). A clone, so that the
/// state lock is not held while queueing.
fn consumer_target(shared: &Shared, consumer_id: u64) -> Option<Inbox> {
    let st = shared.lock();
    st.consumers.get(&consumer_id).map(|c| c.deliver.clone())
}

fn complete_request(shared: &Shared, request_id: u64, answer: Result<Command>) {
    let waiter = shared.lock().requests.remove(&request_id);
    match waiter {
        Some(w) => {
            let _ = w.send(answer);
        }
        // Timed out already, or a fire-and-forget request (id 0).
        None => tracing::debug!(request_id, "answer to no pending request"),
    }
}
