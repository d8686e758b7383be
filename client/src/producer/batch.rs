//! Producer-side batching: messages gathered into one entry by count, bytes
//! and delay, optionally one batch per key (key-based batching, so that a
//! Key_Shared consumer gets whole batches of one key). The batch payload
//! format is in `magnetar_wire::batch` and `docs/format.md`; a batch is
//! compressed as a whole. A "batch" of one message goes out as a plain
//! message. Each batch has one sequence id; its messages carry
//! `sequence id + index`.

use crate::error::{ClientError, Result};
use crate::message::OutgoingMessage;
use crate::producer::{EntryBody, ProducerCore, SendFuture};
use magnetar_wire::{encode_batch_record_into, BatchMessage, CompressionType, MessageId, MessageMetadata};
use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::task::{Context, Poll, Waker};
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

struct Container {
    msgs: Vec<OutgoingMessage>,
    bytes: usize,
    first_at: Instant,
    /// The receipt every message of this batch shares.
    receipt: Arc<BatchReceipt>,
    /// Hands the entry's receipt (or the error that kept the batch from
    /// going out) to the batch's resolver task, with whether it went out as
    /// a batch (a "batch" of one goes out as a plain message).
    sent: oneshot::Sender<(Result<SendFuture>, bool)>,
}

/// The receipt shared by the messages of one batch, so that a batched send
/// costs no channel, timer or task of its own: the batch's resolver task
/// completes it once; message `i` then reads the entry's id with
/// `batch_index` i.
#[derive(Default)]
pub(crate) struct BatchReceipt {
    /// The entry's id and whether it was a batch, once stored: what every
    /// message's future reads, without taking the lock.
    stored: std::sync::OnceLock<(MessageId, bool)>,
    state: std::sync::Mutex<ReceiptState>,
}

#[derive(Default)]
struct ReceiptState {
    outcome: Option<Result<MessageId>>,
    /// The entry was a batch (its messages get their batch index).
    batched: bool,
    /// The wakers of the messages' futures that wait; each future remembers
    /// its place here.
    wakers: Vec<Waker>,
}

impl BatchReceipt {
    fn lock(&self) -> std::sync::MutexGuard<'_, ReceiptState> {
        // Only plain field updates happen under the lock; a poisoned lock
        // still holds consistent data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Message `index`'s outcome, or `Pending` with the task's waker
    /// registered (at `*registered`, reused on later polls).
    pub(crate) fn poll(
        &self,
        index: u32,
        registered: &mut Option<usize>,
        cx: &mut Context<'_>,
    ) -> Poll<Result<MessageId>> {
        if let Some(&(id, batched)) = self.stored.get() {
            return Poll::Ready(Ok(batch_message_id(id, batched, index)));
        }
        let mut st = self.lock();
        let batched = st.batched;
        match &mut st.outcome {
            Some(Ok(id)) => Poll::Ready(Ok(batch_message_id(*id, batched, index))),
            // The one message of a plain entry gets the error itself.
            Some(Err(e)) if !batched => {
                let copy = copy_error(e);
                Poll::Ready(Err(std::mem::replace(e, copy)))
            }
            Some(Err(e)) => Poll::Ready(Err(copy_error(e))),
            None => {
                match registered.and_then(|i| st.wakers.get_mut(i)) {
                    Some(w) => {
                        if !w.will_wake(cx.waker()) {
                            w.clone_from(cx.waker());
                        }
                    }
                    None => {
                        *registered = Some(st.wakers.len());
                        st.wakers.push(cx.waker().clone());
                    }
                }
                Poll::Pending
            }
        }
    }

    /// Sets the outcome, unless one is already set (the first one stays).
    fn complete(&self, outcome: Result<MessageId>, batched: bool) {
        let wakers = {
            let mut st = self.lock();
            if st.outcome.is_some() {
                return;
            }
            if let Ok(id) = &outcome {
                // Set once, under the lock, before the outcome: a future
                // that misses it here finds the outcome under the lock.
                let _ = self.stored.set((*id, batched));
            }
            st.outcome = Some(outcome);
            st.batched = batched;
            std::mem::take(&mut st.wakers)
        };
        for w in wakers {
            w.wake();
        }
    }
}

/// The id of message `index` of an entry stored as `id`: its batch index
/// set when the entry was a batch, else the entry's id itself.
fn batch_message_id(id: MessageId, batched: bool, index: u32) -> MessageId {
    if batched {
        MessageId { batch_index: i32::try_from(index).unwrap_or(i32::MAX), ..id }
    } else {
        id
    }
}

/// The open batches of one producer.
pub(crate) struct Batcher {
    options: BatchingOptions,
    /// The open batches and those closed but not yet sent. A plain lock,
    /// held only to add a message or to close a batch, never across an
    /// await: adding a message is the per-message path, and an async lock
    /// there (acquire, then a release that locks its waiter list) was ~4 %
    /// of the canonical bench's client CPU (issue #6).
    batches: std::sync::Mutex<Batches>,
    /// Held while sending closed batches: whoever holds it sends them in
    /// the order they were closed, so batches leave in the order they filled.
    sending: tokio::sync::Mutex<()>,
    /// Wakes the flusher: a batch opened that falls due before the flusher
    /// would wake by itself, or the producer closed.
    pub(crate) wake: tokio::sync::Notify,
}

#[derive(Default)]
struct Batches {
    /// Key (`None` unless key-based) → open batch.
    open: BTreeMap<Option<String>, Container>,
    /// Closed batches, oldest first, waiting for `Batcher::send_closed`.
    closed: VecDeque<Container>,
    /// When the flusher wakes by itself (`flush_due`'s answer); `None`: it
    /// sleeps until woken.
    armed: Option<Instant>,
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
        Self {
            options,
            batches: std::sync::Mutex::new(Batches::default()),
            sending: tokio::sync::Mutex::new(()),
            wake: tokio::sync::Notify::new(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Batches> {
        // Nothing under this lock can panic halfway through an update that
        // matters: a poisoned lock still holds whole batches.
        self.batches.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Margin for the flusher's lateness in a batch's receipt deadline.
    fn slack(&self) -> Duration {
        (self.options.max_delay / 2).max(Duration::from_millis(1))
    }

    /// A new, empty batch whose first message is `first_len` bytes, and its
    /// resolver task.
    fn open_batch(&self, core: &ProducerCore, first_len: usize) -> Container {
        // Tokio's clock, which the flusher sleeps on (std's but on a test's paused clock).
        let first_at = tokio::time::Instant::now().into_std();
        let receipt = Arc::new(BatchReceipt::default());
        let (sent, rx) = oneshot::channel();
        let after = core.conn.options.operation_timeout.saturating_add(self.options.max_delay);
        // A batch goes out `max_delay` after its first message (and the
        // flusher's lateness), so every message still gets `after` from its
        // own send. (A timeout too large for the clock means none: a year.)
        let wait = after.saturating_add(self.options.max_delay).saturating_add(self.slack());
        let deadline = first_at.checked_add(wait).unwrap_or_else(|| first_at + Duration::from_secs(365 * 24 * 3600));
        tokio::spawn(resolve(receipt.clone(), rx, deadline.into(), after));
        let capacity = (self.options.max_bytes / first_len.max(1))
            .saturating_add(1)
            .min(self.options.max_messages)
            .min(BATCH_CAPACITY_MAX);
        Container { msgs: Vec::with_capacity(capacity), bytes: 0, first_at, receipt, sent }
    }

    pub(crate) async fn add(self: &Arc<Self>, core: &Arc<ProducerCore>, msg: OutgoingMessage) -> Result<SendFuture> {
        if core.is_closed() {
            return Err(ClientError::ProducerClosed { producer_name: core.name().to_string() });
        }
        // Adding a message touches no tokio resource, so a loop of sends
        // would otherwise run until a batch has to wait for a free slot,
        // holding up the other tasks of its thread (the connection's reader
        // with the receipts, a consumer): spend one unit of the task's
        // budget, as the async lock this replaced did, so that such a loop
        // yields every 128 messages or so.
        tokio::task::coop::consume_budget().await;
        let (receipt, closed_any, wake) = {
            let key = if self.options.key_based { msg.key.clone() } else { None };
            let len = msg.payload.len();
            let mut guard = self.lock();
            let b = &mut *guard;
            // Would not fit: close what the key's batch holds first.
            let full_before =
                b.open.get(&key).is_some_and(|c| !c.msgs.is_empty() && c.bytes + len > self.options.max_bytes);
            if full_before {
                if let Some(c) = b.open.remove(&key) {
                    b.closed.push_back(c);
                }
            }
            let mut wake = false;
            let c = match b.open.entry(key) {
                std::collections::btree_map::Entry::Occupied(e) => e.into_mut(),
                std::collections::btree_map::Entry::Vacant(e) => {
                    let c = e.insert(self.open_batch(core, len));
                    // Wake the flusher if it would sleep past this batch's time
                    // (none when max_delay is out of the clock's range:
                    // batches then close by size only).
                    if let Some(due) = c.first_at.checked_add(self.options.max_delay) {
                        if b.armed.is_none_or(|a| due < a) {
                            b.armed = Some(due);
                            wake = true;
                        }
                    }
                    c
                }
            };
            // Below BATCH_MESSAGES_LIMIT, so it fits.
            let index = u32::try_from(c.msgs.len()).unwrap_or(u32::MAX);
            let receipt = SendFuture::batched(c.receipt.clone(), index);
            c.msgs.push(msg);
            c.bytes += len;
            if c.msgs.len() >= self.options.max_messages || c.bytes >= self.options.max_bytes {
                let key = if self.options.key_based { c.msgs.last().and_then(|m| m.key.clone()) } else { None };
                if let Some(c) = b.open.remove(&key) {
                    b.closed.push_back(c);
                }
            }
            (receipt, !b.closed.is_empty(), wake)
        };
        if wake {
            self.wake.notify_one();
        }
        if closed_any {
            self.send_closed_detached(core).await;
        }
        Ok(receipt)
    }

    /// [`send_closed`](Self::send_closed) in a task of its own, which the
    /// caller waits for (so `max_pending` still holds the caller back) but
    /// cannot cancel: whoever sends takes batches other tasks closed off the
    /// queue, and a caller dropped halfway (`timeout(send_async)`) would
    /// otherwise drop one of those with it and fail its messages.
    async fn send_closed_detached(self: &Arc<Self>, core: &Arc<ProducerCore>) {
        let (batcher, core) = (self.clone(), core.clone());
        let _ = tokio::spawn(async move { batcher.send_closed(&core).await }).await;
    }

    /// Sends the closed batches, oldest first (including those another
    /// task closed and has not sent yet).
    async fn send_closed(&self, core: &ProducerCore) {
        let _sending = self.sending.lock().await;
        loop {
            let next = self.lock().closed.pop_front();
            match next {
                Some(c) => send_batch(core, c).await,
                None => return,
            }
        }
    }

    /// Sends every open batch now.
    pub(crate) async fn flush_all(self: &Arc<Self>, core: &Arc<ProducerCore>) -> Result<()> {
        {
            let mut guard = self.lock();
            let b = &mut *guard;
            let open = std::mem::take(&mut b.open);
            b.closed.extend(open.into_values());
        }
        self.send_closed_detached(core).await;
        Ok(())
    }

    /// Sends the batches whose first message waited `max_delay`.
    /// Returns when the oldest batch still open falls due (`None`: none is
    /// open), recorded as the flusher's deadline: a batch opened later that
    /// falls due sooner wakes it.
    async fn flush_due(&self, core: &ProducerCore) -> Option<Instant> {
        let next_due = {
            let mut guard = self.lock();
            let b = &mut *guard;
            let now = tokio::time::Instant::now().into_std();
            let due: Vec<Option<String>> = b
                .open
                .iter()
                .filter(|(_, c)| now.saturating_duration_since(c.first_at) >= self.options.max_delay)
                .map(|(k, _)| k.clone())
                .collect();
            for k in due {
                if let Some(c) = b.open.remove(&k) {
                    b.closed.push_back(c);
                }
            }
            // Closed batches left by an `add` whose future was dropped
            // before it sent them go out here too.
            b.armed = b.open.values().filter_map(|c| c.first_at.checked_add(self.options.max_delay)).min();
            (b.armed, !b.closed.is_empty())
        };
        if next_due.1 {
            self.send_closed(core).await;
        }
        next_due.0
    }
}

/// Most messages a new batch makes room for up front (more grow the vector).
const BATCH_CAPACITY_MAX: usize = 1024;
/// Bytes a batch record takes beyond its payload, key and properties (its
/// length field and the fixed part of its metadata), for sizing the buffer.
const RECORD_OVERHEAD_BYTES: usize = 64;

/// The producer's timer: sends batches that waited long enough. Ends with
/// the producer.
///
/// Sleeps until the oldest open batch falls due, and without one until a
/// batch opens (`Batcher::wake`; a `notify_one` before it waits is kept):
/// an idle producer's flusher does not wake. (It woke every `max_delay / 2`,
/// 5 ms by default, whether a batch was open or not.)
pub(crate) async fn flush_loop(core: Arc<ProducerCore>, batcher: Arc<Batcher>) {
    while !core.is_closed() {
        match batcher.flush_due(&core).await {
            Some(due) => {
                tokio::select! {
                    () = tokio::time::sleep_until(due.into()) => {}
                    () = batcher.wake.notified() => {}
                }
            }
            None => batcher.wake.notified().await,
        }
    }
}

/// A batch's resolver: waits until the batch went out (by `deadline`), then
/// for its entry's receipt, and completes the batch's receipt with it.
async fn resolve(
    receipt: Arc<BatchReceipt>,
    sent: oneshot::Receiver<(Result<SendFuture>, bool)>,
    deadline: tokio::time::Instant,
    after: Duration,
) {
    /// Should the task be dropped before it completes the receipt (the
    /// runtime shutting down), its messages fail rather than wait forever.
    struct Abandoned(Arc<BatchReceipt>);
    impl Drop for Abandoned {
        fn drop(&mut self) {
            self.0.complete(Err(ClientError::Disconnected { reason: "send abandoned by the client".into() }), true);
        }
    }
    let receipt = Abandoned(receipt);
    let (outcome, batched) = match tokio::time::timeout_at(deadline, sent).await {
        Ok(Ok((Ok(entry), batched))) => (entry.await, batched),
        Ok(Ok((Err(e), batched))) => (Err(e), batched),
        // The batch was dropped unsent (the producer was dropped).
        Ok(Err(_)) => (Err(ClientError::Disconnected { reason: "send abandoned by the client".into() }), true),
        Err(_) => (Err(ClientError::Timeout { operation: "send receipt", after }), true),
    };
    receipt.0.complete(outcome, batched);
}

/// Sends one batch as one entry and hands its receipt (or the error) to the
/// batch's resolver.
async fn send_batch(core: &ProducerCore, c: Container) {
    let Container { mut msgs, bytes, sent, .. } = c;
    if msgs.len() == 1 {
        let Some(msg) = msgs.pop() else { return };
        let _ = sent.send((core.send_single(msg).await, false));
        return;
    }
    let n = u32::try_from(msgs.len()).unwrap_or(u32::MAX);
    let compression = core.compression();
    // Key-based batches hold one key: it becomes the entry's key too.
    let shared_key =
        msgs.first().and_then(|m| m.key.clone()).filter(|k| msgs.iter().all(|m| m.key.as_deref() == Some(k.as_str())));
    let records_bytes = msgs.iter().fold(bytes, |a, m| {
        a.saturating_add(RECORD_OVERHEAD_BYTES).saturating_add(crate::producer::metadata_variable_bytes(m))
    });
    let headroom = core.headroom(shared_key.as_ref().map_or(0, |k| k.len().saturating_add(8)));
    let entry = core
        .send_entry(n, None, move |sequence_id| {
            // Uncompressed, the records are the entry's payload: they go
            // straight into the frame's buffer (the payloads' one copy).
            let plain = compression == CompressionType::None;
            let mut body = EntryBody::with_capacity(if plain { headroom } else { 0 }, records_bytes);
            for (i, m) in msgs.into_iter().enumerate() {
                let record = BatchMessage {
                    properties: m.properties,
                    partition_key: m.key,
                    ordering_key: None,
                    event_time_ms: m.event_time_ms.unwrap_or(0),
                    sequence_id: sequence_id.saturating_add(i as u64),
                    payload: m.payload,
                };
                encode_batch_record_into(&record, body.tail());
            }
            let size = body.payload().len();
            let uncompressed_size =
                u32::try_from(size).map_err(|_| ClientError::MessageTooLarge { size, max_frame_bytes: u32::MAX })?;
            if !plain {
                body = EntryBody::copy_of(&crate::compression::compress(compression, body.payload())?, headroom);
            }
            let metadata = MessageMetadata {
                partition_key: shared_key,
                compression,
                uncompressed_size,
                ..MessageMetadata::default()
            };
            Ok((metadata, body))
        })
        .await;
    let _ = sent.send((entry, true));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn poll_now(receipt: &BatchReceipt, index: u32) -> Poll<Result<MessageId>> {
        receipt.poll(index, &mut None, &mut Context::from_waker(Waker::noop()))
    }

    /// Goal: a batch's receipt gives message i the entry id with batch index
    /// i (a plain entry's id unchanged), the first outcome stays, and a
    /// resolver dropped with its runtime fails the batch instead of leaving
    /// its messages waiting. Method: receipts completed by hand; a resolver
    /// spawned on a runtime that is then dropped.
    #[test]
    fn batch_receipts_resolve_once_and_never_hang() {
        let id = MessageId::new(4, 9, 2, -1);
        let batched = BatchReceipt::default();
        assert!(poll_now(&batched, 0).is_pending());
        batched.complete(Ok(id), true);
        batched.complete(Err(ClientError::Disconnected { reason: "late".into() }), true);
        assert!(matches!(poll_now(&batched, 3), Poll::Ready(Ok(got)) if got == MessageId::new(4, 9, 2, 3)));
        let plain = BatchReceipt::default();
        plain.complete(Ok(id), false);
        assert!(matches!(poll_now(&plain, 0), Poll::Ready(Ok(got)) if got == id));

        let receipt = Arc::new(BatchReceipt::default());
        let (_sent, rx) = oneshot::channel();
        {
            let rt = tokio::runtime::Builder::new_current_thread().enable_time().build().unwrap();
            let deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
            rt.block_on(async {
                tokio::spawn(resolve(receipt.clone(), rx, deadline, Duration::from_secs(1)));
                tokio::task::yield_now().await;
            });
        }
        match poll_now(&receipt, 0) {
            Poll::Ready(Err(ClientError::Disconnected { reason })) => assert!(reason.contains("abandoned"), "{reason}"),
            other => panic!("expected Disconnected, got {other:?}"),
        }
    }
}
