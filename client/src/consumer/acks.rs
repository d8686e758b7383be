//! What an acknowledgement means to the broker, and which broker-side
//! consumer it goes to: the batch-ack map (a message of a batch is a
//! batch-index ack until its last sibling acknowledges the entry), chunked
//! messages (acknowledging one acknowledges all its chunks), the retry
//! topic's consumer (by ledger), and the `Ack` commands that carry them.
//! Grouping acks in time is `ack_group`'s.

use super::ack_group::AckBatch;
use super::chunking::{Fed, Reassembly};
use super::inbox::Delivery;
use crate::message::Message;
use magnetar_wire::{AckType, Command, MessageId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The retry topic's broker-side consumer, and the ledgers its messages
/// came from: ledger ids are unique across a broker's topics, so an id's
/// ledger says which consumer acks (and redelivery requests) belong to.
pub(super) struct RetryRoute {
    pub(super) consumer_id: u64,
    pub(super) topic: Arc<str>,
    pub(super) ledgers: std::sync::Mutex<std::collections::HashSet<u64>>,
}

impl RetryRoute {
    fn owns(&self, id: &MessageId) -> bool {
        self.ledgers.lock().unwrap_or_else(|p| p.into_inner()).contains(&id.ledger)
    }
}

/// The broker-side consumer an id belongs to.
pub(super) fn route(main: u64, retry: &Option<Arc<RetryRoute>>, id: &MessageId) -> u64 {
    match retry {
        Some(r) if r.owns(id) => r.consumer_id,
        _ => main,
    }
}

/// `items` grouped by the consumer the id of each (`id_of`) belongs to,
/// in order.
pub(super) fn group<T: Copy>(
    main: u64,
    retry: &Option<Arc<RetryRoute>>,
    items: &[T],
    id_of: impl Fn(&T) -> &MessageId,
) -> Vec<(u64, Vec<T>)> {
    let mut out: Vec<(u64, Vec<T>)> = Vec::new();
    for item in items {
        let c = route(main, retry, id_of(item));
        match out.iter_mut().find(|(k, _)| *k == c) {
            Some((_, v)) => v.push(*item),
            None => out.push((c, vec![*item])),
        }
    }
    out
}

/// The `Ack` commands that carry `batch`, each to the consumer its ids
/// belong to.
pub(super) fn ack_commands(main: u64, retry: &Option<Arc<RetryRoute>>, batch: AckBatch) -> Vec<Command> {
    let mut out = Vec::new();
    let sized: Vec<(MessageId, u32)> = batch.individual.into_iter().zip(batch.batch_sizes).collect();
    for (consumer_id, acks) in group(main, retry, &sized, |(id, _)| id) {
        for acks in acks.chunks(1000) {
            out.push(individual_ack(consumer_id, acks, 0));
        }
    }
    if let Some((id, size)) = batch.cumulative {
        let consumer_id = route(main, retry, &id);
        let batch_sizes = if size > 0 { vec![size] } else { Vec::new() };
        out.push(Command::Ack {
            consumer_id,
            ack_type: AckType::Cumulative,
            message_ids: vec![id],
            request_id: 0,
            batch_sizes,
        });
    }
    out
}

/// One `Ack` of `acks` (id, batch size); the sizes go on the wire only
/// when some id is a batch-index ack.
pub(super) fn individual_ack(consumer_id: u64, acks: &[(MessageId, u32)], request_id: u64) -> Command {
    let batch_sizes =
        if acks.iter().any(|(_, n)| *n > 0) { acks.iter().map(|(_, n)| *n).collect() } else { Vec::new() };
    Command::Ack {
        consumer_id,
        ack_type: AckType::Individual,
        message_ids: acks.iter().map(|(id, _)| *id).collect(),
        request_id,
        batch_sizes,
    }
}

/// A batch handed out: which of its messages are acknowledged, and how
/// many are not.
struct BatchAcks {
    acked: Vec<bool>,
    left: usize,
}

/// Chunked messages being reassembled, and the chunk ids of whole ones
/// handed out (acknowledging the message acknowledges them all).
#[derive(Default)]
struct ChunkState {
    reassembly: Reassembly,
    handed_out: HashMap<MessageId, Vec<MessageId>>,
}

/// The consumer's acknowledgement bookkeeping: batches and chunked
/// messages handed out and not wholly acknowledged.
#[derive(Default)]
pub(super) struct AckMap {
    /// Batches handed out and not wholly acknowledged: (ledger, entry,
    /// partition) → acked flag per batch index. The broker acknowledges
    /// entries, so an entry is acked only once all its messages are.
    batches: Mutex<HashMap<(u64, u64, i32), BatchAcks>>,
    chunks: Mutex<ChunkState>,
    /// Whether `chunks.handed_out` has any (set under its lock): an ack
    /// looks there only then, without taking the lock per ack otherwise.
    chunks_out: AtomicBool,
}

impl AckMap {
    /// Passes non-chunks through; collects chunks, returning the whole
    /// message with its last chunk. Chunks dropped (expired, out of order)
    /// go to `stray`, to be acknowledged so the broker does not keep them.
    pub(super) fn assemble(&self, msg: Message, stray: &mut Vec<MessageId>) -> Option<Delivery> {
        let mut st = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
        stray.extend(st.reassembly.expire());
        match st.reassembly.feed(msg, stray) {
            Ok(Fed::Complete(m, ids)) => {
                st.handed_out.insert(m.id, ids);
                self.chunks_out.store(true, Ordering::Release);
                Some(Ok(*m))
            }
            Ok(Fed::Pending) => None,
            Err(e) => Some(Err(e)),
        }
    }

    fn lock_batches(&self) -> MutexGuard<'_, HashMap<(u64, u64, i32), BatchAcks>> {
        self.batches.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn track_batch(&self, delivery: &Delivery) {
        let Ok(m) = delivery else { return };
        if m.id.batch_index < 0 {
            return;
        }
        let size = m.entry.num_messages();
        if size <= 1 {
            return;
        }
        let n = usize::try_from(size).unwrap_or(0);
        self.lock_batches().entry((m.id.ledger, m.id.entry, m.id.partition)).or_insert_with(|| {
            // A redelivered batch: messages acknowledged before are not
            // handed out again, and count as acknowledged here.
            let acked: Vec<bool> =
                (0..n).map(|i| m.ack_set.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0)).collect();
            let left = acked.iter().filter(|a| !**a).count();
            BatchAcks { acked, left }
        });
    }

    /// The acks to send to the broker for acknowledging `ids`, each with its
    /// batch size: a message of a batch is a batch-index ack (size = the
    /// batch's) until its last sibling, which acknowledges the entry (size
    /// 0); a cumulative ack inside a batch likewise; a reassembled chunked
    /// message acknowledges all its chunks.
    pub(super) fn broker_acks(&self, ack_type: AckType, ids: &[MessageId]) -> Vec<(MessageId, u32)> {
        let mut out = Vec::with_capacity(ids.len());
        self.broker_acks_each(ack_type, ids, |id, size| out.push((id, size)));
        out
    }

    /// `broker_acks`, each handed to `emit` (no list per ack).
    pub(super) fn broker_acks_each(&self, ack_type: AckType, ids: &[MessageId], mut emit: impl FnMut(MessageId, u32)) {
        // Locked on first need: an individual ack of a message not of a
        // batch (the usual case) needs no batch bookkeeping.
        let mut locked = None;
        for id in ids {
            // The message of `id` was handed out before its ack (by this
            // thread, or one the application synchronized with), so the
            // flag set with it is seen here.
            let chunk_ids = if self.chunks_out.load(Ordering::Acquire) {
                let mut chunks = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
                let ids = chunks.handed_out.remove(id);
                self.chunks_out.store(!chunks.handed_out.is_empty(), Ordering::Release);
                ids
            } else {
                None
            };
            if let Some(chunk_ids) = chunk_ids {
                if ack_type == AckType::Individual {
                    for c in chunk_ids {
                        emit(c, 0);
                    }
                    continue;
                }
            }
            if ack_type == AckType::Individual && id.batch_index < 0 {
                emit(*id, 0);
                continue;
            }
            let batches = locked.get_or_insert_with(|| self.lock_batches());
            let key = (id.ledger, id.entry, id.partition);
            if ack_type == AckType::Cumulative {
                batches.retain(|(l, e, p), _| !(*p == id.partition && (*l, *e) < (id.ledger, id.entry)));
            }
            let Some(batch) = batches.get_mut(&key).filter(|_| id.batch_index >= 0) else {
                emit(*id, 0);
                continue;
            };
            let size = u32::try_from(batch.acked.len()).unwrap_or(u32::MAX);
            let index = usize::try_from(id.batch_index).unwrap_or(usize::MAX);
            let upto = match ack_type {
                AckType::Individual => index..index.saturating_add(1),
                AckType::Cumulative => 0..index.saturating_add(1),
            };
            for f in batch.acked.iter_mut().take(upto.end).skip(upto.start) {
                if !*f {
                    *f = true;
                    batch.left -= 1;
                }
            }
            if batch.left == 0 {
                batches.remove(&key);
                emit(*id, 0);
            } else {
                emit(*id, size);
            }
        }
    }
}
