//! The dispatcher task of one subscription: replay, then fresh entries,
//! within permits and the unacked limits, with delayed entries held back
//! until their time. Owned by the topic's shard; never crosses cores.

use super::context::{DeliverySink, DispatchCtx, DispatchLimits, LogReader};
use super::{key_hash, Ask, Pick};
use crate::api::{ConsumerEvent, ConsumerRef};
use crate::clock::now_ms;
use crate::error::ErrorCode;
use crate::subscription::{Pending, Subscription};
use crate::topic::Topic;
use bytes::Bytes;
use futures::FutureExt;
use std::collections::HashSet;
use std::rc::{Rc, Weak};
use std::time::Duration;

/// Starts the dispatcher of `sub`: it runs until the shard closes, in the
/// task queue `tq` (the shard's dispatch queue, with fewer shares than the
/// default queue where the log's flusher runs, so catch-up reads from disk
/// do not slow the fsync path of receipts).
pub(crate) fn spawn<S: DeliverySink + 'static, L: LogReader + 'static>(
    ctx: DispatchCtx<S, L>,
    tq: glommio::TaskQueueHandle,
    topic: Rc<Topic>,
    sub: Rc<Subscription>,
) {
    let topic = Rc::downgrade(&topic);
    match glommio::spawn_local_into(async move { run(ctx, topic, sub).await }, tq) {
        Ok(t) => {
            t.detach();
        }
        // Only if the queue were gone: it lives as long as the shard.
        Err(e) => tracing::error!("cannot spawn a dispatcher in its task queue: {e}"),
    }
}

/// The task holds its topic by a [`Weak`] while it waits and strongly only
/// during a pass: an idle topic's one strong reference is then its shard's
/// registry, which is what unloading it checks (`shard/unload.rs`). A
/// topic gone from memory (unloaded) stops its dispatchers.
async fn run<S: DeliverySink, L: LogReader>(ctx: DispatchCtx<S, L>, topic: Weak<Topic>, sub: Rc<Subscription>) {
    loop {
        let next_due = sub.delayed.borrow().next_due_ms();
        match next_due {
            Some(at) => {
                let wait = Duration::from_millis(at.saturating_sub(now_ms()));
                futures::select_biased! {
                    _ = sub.wake.wait().fuse() => {}
                    _ = glommio::timer::sleep(wait).fuse() => {}
                }
            }
            None => sub.wake.wait().await,
        }
        // An unloaded or deleted topic, or a non-durable subscription whose
        // consumer left, stops its dispatcher.
        let Some(topic) = topic.upgrade() else { return };
        if ctx.is_closed() || topic.deleted.get() || sub.removed.get() {
            return;
        }
        for (entry, hash) in sub.delayed.borrow_mut().take_due(now_ms()) {
            sub.replay.borrow_mut().insert(entry, hash);
        }
        // Delayed entries dropped for room: read the log again from there.
        // Everything on the way is acked, held, set aside or indexed, and
        // skipped below; only the dropped entries are indexed again.
        let reread = sub.delayed.borrow_mut().take_reread_from();
        if let Some(from) = reread {
            sub.read_pos.set(sub.read_pos.get().min(from));
        }
        // Boxed: a pass's future (reads, deliveries) is large and lives
        // only while the pass runs; inline it would be held by every idle
        // subscription's task, a cost per subscription on a shard with
        // many topics.
        Box::pin(pass(&ctx, &topic, &sub)).await;
    }
}

/// What a pass learned about one entry's metadata.
struct Peeked {
    key_hash: u16,
    deliver_at_ms: u64,
    tag_matches: bool,
    /// Messages in the entry (a batch holds many), for the permit count.
    messages: u32,
}

/// Stored blobs were verified whole when appended, and the log's checksum
/// vouches for their bytes since: the bounds-checked delivery peek reads
/// the few fields needed without running the verifier again.
fn peek(sub: &Subscription, blob: &Bytes) -> Peeked {
    match crate::entry::for_delivery(blob) {
        Ok(p) => Peeked {
            key_hash: key_hash(p.ordering_key, p.partition_key),
            deliver_at_ms: p.deliver_at_ms,
            tag_matches: sub.filter_tag.borrow().as_deref().is_none_or(|want| p.tag == Some(want.as_bytes())),
            messages: p.num_messages.max(1),
        },
        // Validated when appended; if it cannot be read now it is delivered
        // as it is and the client reports it.
        Err(_) => Peeked { key_hash: 0, deliver_at_ms: 0, tag_matches: true, messages: 1 },
    }
}

fn ask<'a>(
    limits: &DispatchLimits,
    sub: &Subscription,
    entry: u64,
    key_hash: u16,
    blocked: &'a HashSet<ConsumerRef>,
) -> Ask<'a> {
    Ask {
        entry,
        key_hash,
        outstanding_floor: [sub.pending.borrow().first(), sub.replay.borrow().keys().next().copied()]
            .into_iter()
            .flatten()
            .min()
            .unwrap_or(u64::MAX),
        unacked_per_consumer_max: limits.unacked_per_consumer_max,
        blocked,
    }
}

/// Whether the subscription may hand out anything at all right now.
fn open<S: DeliverySink, L: LogReader>(ctx: &DispatchCtx<S, L>, sub: &Subscription) -> bool {
    !ctx.is_closed()
        && sub.pending.borrow().len() < ctx.limits.unacked_per_subscription_max as usize
        && sub.consumers.borrow().iter().any(|c| c.permits > 0 && c.unacked < ctx.limits.unacked_per_consumer_max)
}

/// The wall clock for the delivery counters, read once per
/// `CLOCK_READS_EVERY` deliveries: the counters' rates are per second, so
/// a clock read per delivered entry would be cost on the hot path for no
/// precision anyone sees.
struct CoarseClock {
    now_ms: u64,
    left: u32,
}

const CLOCK_READS_EVERY: u32 = 64;

impl CoarseClock {
    fn new() -> Self {
        Self { now_ms: now_ms(), left: CLOCK_READS_EVERY }
    }

    fn now_ms(&mut self) -> u64 {
        if self.left == 0 {
            *self = Self::new();
        }
        self.left -= 1;
        self.now_ms
    }
}

/// Deliveries of a pass not yet handed to their consumer's sink:
/// consecutive entries of one ledger for one consumer, with one redelivery
/// count and no batch-index acks, go out as one `ConsumerEvent::Run` (one
/// channel push and wake-up per run instead of per entry; the connection
/// writes a run as one frame to clients that accept runs). Handed over
/// when the next delivery does not extend the run, when it is full, before
/// the pass may wait on a read, and at the end of the pass.
struct RunOut {
    consumer: Option<ConsumerRef>,
    first: magnetar_wire::MessageId,
    redelivery_count: u32,
    blobs: Vec<Bytes>,
    bytes: usize,
}

/// Entries one run event holds at most.
const RUN_OUT_ENTRIES_MAX: usize = 256;
/// Blob bytes one run event holds at most (a connection splits a run
/// further to fit its client's frame limit).
const RUN_OUT_BYTES_MAX: usize = 256 * 1024;

impl RunOut {
    fn new() -> Self {
        Self {
            consumer: None,
            first: magnetar_wire::MessageId::new(0, 0, -1, -1),
            redelivery_count: 0,
            blobs: Vec::new(),
            bytes: 0,
        }
    }

    fn push(
        &mut self,
        sink: &impl DeliverySink,
        consumer: ConsumerRef,
        id: magnetar_wire::MessageId,
        redelivery_count: u32,
        blob: Bytes,
    ) {
        let extends = self.consumer == Some(consumer)
            && self.redelivery_count == redelivery_count
            && self.first.ledger == id.ledger
            && self.first.partition == id.partition
            && self.first.batch_index == id.batch_index
            && self.first.entry.checked_add(self.blobs.len() as u64) == Some(id.entry)
            && self.blobs.len() < RUN_OUT_ENTRIES_MAX
            && self.bytes.saturating_add(blob.len()) <= RUN_OUT_BYTES_MAX;
        if !extends {
            self.flush(sink);
            self.consumer = Some(consumer);
            self.first = id;
            self.redelivery_count = redelivery_count;
        }
        self.bytes = self.bytes.saturating_add(blob.len());
        self.blobs.push(blob);
    }

    fn flush(&mut self, sink: &impl DeliverySink) {
        let Some(consumer) = self.consumer.take() else { return };
        self.bytes = 0;
        let event = if self.blobs.len() == 1 {
            let blob = self.blobs.pop().unwrap_or_default();
            ConsumerEvent::Message {
                consumer_id: consumer.consumer_id,
                message_id: self.first,
                redelivery_count: self.redelivery_count,
                blob,
                ack_set: Vec::new(),
            }
        } else {
            ConsumerEvent::Run {
                consumer_id: consumer.consumer_id,
                first: self.first,
                redelivery_count: self.redelivery_count,
                blobs: std::mem::replace(&mut self.blobs, Vec::with_capacity(RUN_OUT_ENTRIES_MAX.min(64))),
            }
        };
        sink.deliver(consumer, event);
    }
}

/// One dispatch pass: hands out what the consumers can take now.
pub(crate) async fn pass<S: DeliverySink, L: LogReader>(
    ctx: &DispatchCtx<S, L>,
    topic: &Rc<Topic>,
    sub: &Rc<Subscription>,
) {
    let mut out = RunOut::new();
    pass_into(ctx, topic, sub, &mut out).await;
    out.flush(&ctx.sink);
}

/// Awaits `read`; when it cannot finish at once (the disk, a background
/// read), what `out` gathered goes out first: a consumer removed or made
/// inactive during the wait must not get it afterwards.
async fn flush_if_waiting<T>(
    sink: &impl DeliverySink,
    out: &mut RunOut,
    read: impl std::future::Future<Output = T>,
) -> T {
    let mut read = std::pin::pin!(read);
    match futures::poll!(read.as_mut()) {
        std::task::Poll::Ready(r) => r,
        std::task::Poll::Pending => {
            out.flush(sink);
            read.await
        }
    }
}

async fn pass_into<S: DeliverySink, L: LogReader>(
    ctx: &DispatchCtx<S, L>,
    topic: &Rc<Topic>,
    sub: &Rc<Subscription>,
    out: &mut RunOut,
) {
    let mut clock = CoarseClock::new();
    // Consumers that had to pass an entry by in this pass: nothing later
    // goes to them in this pass, so their keys keep log order.
    let mut blocked: HashSet<ConsumerRef> = HashSet::new();

    // 1. Replay, in log order.
    let mut from = 0u64;
    loop {
        if !open(ctx, sub) {
            return;
        }
        let next = sub.replay.borrow().range(from..).next().map(|(e, h)| (*e, *h));
        let Some((entry, hash)) = next else { break };
        from = entry + 1;
        if sub.cursor.borrow().is_acked(entry) {
            sub.replay.borrow_mut().remove(&entry);
            continue;
        }
        let pick = sub.policy.borrow().pick(&sub.consumers.borrow(), &ask(&ctx.limits, sub, entry, hash, &blocked));
        match pick {
            Pick::Stop => return,
            Pick::SetAside(c) => {
                blocked.insert(c);
                continue;
            }
            Pick::Hold => continue,
            Pick::Deliver(_) => {}
        }
        // Replayed entries are mostly in the log's caches.
        let blob = match flush_if_waiting(&ctx.sink, out, read(ctx, topic, sub, entry)).await {
            Ok(b) => b,
            Err(e) => {
                // What this pass delivered goes out before the close, so a
                // client hands it out before the error.
                out.flush(&ctx.sink);
                fail_read(ctx, topic, sub, entry, e);
                return;
            }
        };
        // The read awaited: decide again on the current state.
        if !sub.replay.borrow().contains_key(&entry) || sub.cursor.borrow().is_acked(entry) {
            continue;
        }
        let pick = sub.policy.borrow().pick(&sub.consumers.borrow(), &ask(&ctx.limits, sub, entry, hash, &blocked));
        match pick {
            Pick::Stop => return,
            Pick::SetAside(c) => {
                blocked.insert(c);
            }
            Pick::Hold => {}
            Pick::Deliver(i) => {
                sub.replay.borrow_mut().remove(&entry);
                let messages = peek(sub, &blob).messages;
                deliver(ctx, topic, sub, out, i, entry, hash, messages, blob, clock.now_ms());
            }
        }
    }

    // 2. Fresh entries, in log order.
    loop {
        if !open(ctx, sub) {
            return;
        }
        let pos = sub.read_pos.get();
        if pos >= topic.durable_next.get() {
            return;
        }
        let start = topic.ledgers.borrow().start();
        if pos < start {
            // Deleted by retention (a reader's position; durable
            // subscriptions are never behind it): skip to what is kept.
            sub.ack_below(&topic.ledgers.borrow(), start);
            continue;
        }
        if sub.cursor.borrow().is_acked(pos)
            || sub.replay.borrow().contains_key(&pos)
            || sub.pending.borrow().contains(pos)
            || sub.delayed.borrow().contains(pos)
        {
            sub.read_pos.set(pos + 1);
            continue;
        }
        let located = topic.ledgers.borrow().locate(pos);
        if located.is_some_and(|(l, e)| super::filter::unmatched_by_index(&ctx.log, sub, l, e)) {
            // Filtered out without reading the entry: it counts as
            // acknowledged for this subscription.
            sub.counters.skipped_by_index.set(sub.counters.skipped_by_index.get() + 1);
            sub.read_pos.set(pos + 1);
            if sub.cursor.borrow_mut().ack(pos) {
                ctx.dirty.mark_cursor(topic, sub);
            }
            continue;
        }
        // Entries set aside are bounded like the unacked ones.
        if sub.replay.borrow().len() >= ctx.limits.unacked_per_subscription_max as usize {
            return;
        }
        let blob = match flush_if_waiting(&ctx.sink, out, read_fresh(ctx, topic, sub, pos)).await {
            Ok(b) => b,
            Err(e) => {
                out.flush(&ctx.sink);
                fail_read(ctx, topic, sub, pos, e);
                return;
            }
        };
        if sub.read_pos.get() != pos || sub.cursor.borrow().is_acked(pos) {
            continue;
        }
        let peeked = peek(sub, &blob);
        if !peeked.tag_matches {
            // Filtered out: it counts as acknowledged for this subscription.
            sub.read_pos.set(pos + 1);
            if sub.cursor.borrow_mut().ack(pos) {
                ctx.dirty.mark_cursor(topic, sub);
            }
            continue;
        }
        // 0: not delayed (no clock read per entry).
        if peeked.deliver_at_ms != 0 && peeked.deliver_at_ms > now_ms() {
            sub.read_pos.set(pos + 1);
            let mut delayed = sub.delayed.borrow_mut();
            delayed.insert(peeked.deliver_at_ms, pos, peeked.key_hash);
            tracing::trace!(topic = %topic.key, sub = %sub.name, entry = pos, delayed = delayed.len(), "delayed");
            continue;
        }
        let pick =
            sub.policy.borrow().pick(&sub.consumers.borrow(), &ask(&ctx.limits, sub, pos, peeked.key_hash, &blocked));
        match pick {
            Pick::Stop => return,
            Pick::SetAside(c) => {
                blocked.insert(c);
                sub.read_pos.set(pos + 1);
                sub.replay.borrow_mut().insert(pos, peeked.key_hash);
            }
            Pick::Hold => {
                sub.read_pos.set(pos + 1);
                sub.replay.borrow_mut().insert(pos, peeked.key_hash);
            }
            Pick::Deliver(i) => {
                sub.read_pos.set(pos + 1);
                deliver(ctx, topic, sub, out, i, pos, peeked.key_hash, peeked.messages, blob, clock.now_ms());
            }
        }
    }
}

/// Entries a run read from the log holds at most (with `RUN_BYTES_MAX`).
const RUN_ENTRIES_MAX: usize = 1024;
/// Log bytes one run reads at most: one disk request, like the storage
/// read-ahead it replaces for a subscription catching up.
const RUN_BYTES_MAX: usize = 1 << 20;
/// Below this many wanted entries a fresh entry is read on its own (through
/// the log's read cache and read-ahead): a consumer with few permits would
/// otherwise issue one small disk request per entry.
const RUN_ENTRIES_MIN: usize = 16;

/// Fresh entries of one ledger read in one run, not yet looked at: the
/// entry at topic position `first + i` is `(ledger, first_entry + i)`; and
/// the read of the next run, started when this one is half used so the disk
/// works while the dispatcher delivers. Each run is bounded by
/// `RUN_BYTES_MAX` and by the permits the consumers had when it was asked
/// for, so at most two runs' worth of the consumers' permits are held.
#[derive(Default)]
pub(crate) struct ReadAhead {
    first: u64,
    ledger: u64,
    first_entry: u64,
    entries: std::collections::VecDeque<Bytes>,
    /// Entries the current run had when read (when to start the next).
    run_len: usize,
    next: Option<NextRun>,
}

/// A run being read in the background, from topic position `pos` stored
/// as `(ledger, entry)`.
struct NextRun {
    pos: u64,
    ledger: u64,
    entry: u64,
    rx: futures::channel::oneshot::Receiver<Result<Vec<Bytes>, magnetar_storage::StorageError>>,
}

impl ReadAhead {
    /// The entry at topic position `pos`, stored as `(ledger, entry)`, if
    /// the run holds it; entries before it are dropped (skipped by the
    /// dispatcher). Anything else empties the run.
    fn take(&mut self, pos: u64, ledger: u64, entry: u64) -> Option<Bytes> {
        if self.entries.is_empty() {
            return None;
        }
        let skip = pos.checked_sub(self.first).map(|d| usize::try_from(d).unwrap_or(usize::MAX));
        match skip {
            Some(k) if k < self.entries.len() && self.ledger == ledger && self.first_entry + k as u64 == entry => {
                self.entries.drain(..k);
                self.first = pos + 1;
                self.first_entry = entry + 1;
                self.entries.pop_front()
            }
            _ => {
                self.entries.clear();
                None
            }
        }
    }
}

/// How many fresh entries from `pos` the consumers can take now: their
/// permits (each entry takes at least one), within the unacked limits and
/// what is durable.
fn run_len(limits: &DispatchLimits, topic: &Topic, sub: &Subscription, pos: u64) -> usize {
    let per_consumer = limits.unacked_per_consumer_max;
    let takers: u64 = sub
        .consumers
        .borrow()
        .iter()
        .filter(|c| c.permits > 0 && c.unacked < per_consumer)
        .map(|c| c.permits.min(u64::from(per_consumer - c.unacked)))
        .sum();
    // Deliveries happen only while fewer than the limit are pending (`open`).
    let pending = sub.pending.borrow().len();
    let max = limits.unacked_per_subscription_max as usize;
    assert!(pending <= max, "{pending} entries pending, over the subscription's limit of {max}");
    let room = max - pending;
    let durable = topic.durable_next.get().saturating_sub(pos);
    usize::try_from(takers.min(durable)).unwrap_or(usize::MAX).min(room).min(RUN_ENTRIES_MAX)
}

/// Reads one fresh entry: from the subscription's current run, else by
/// reading a new run from the log (see [`read`] for errors).
async fn read_fresh<S: DeliverySink, L: LogReader>(
    ctx: &DispatchCtx<S, L>,
    topic: &Rc<Topic>,
    sub: &Rc<Subscription>,
    pos: u64,
) -> Result<Bytes, magnetar_storage::StorageError> {
    let Some((ledger, e)) = topic.ledgers.borrow().locate(pos) else {
        return read(ctx, topic, sub, pos).await;
    };
    let taken = sub.ahead.borrow_mut().take(pos, ledger, e);
    if let Some(b) = taken {
        sub.counters.entries_read.set(sub.counters.entries_read.get() + 1);
        start_next_run(ctx, topic, sub);
        return Ok(b);
    }
    // The run read in the background, if it starts here (a failed one is
    // read again below, which reports the error).
    let next = sub.ahead.borrow_mut().next.take();
    let prefetched = match next {
        Some(n) if (n.pos, n.ledger, n.entry) == (pos, ledger, e) => n.rx.await.ok().and_then(Result::ok),
        _ => None,
    };
    let run = match prefetched.filter(|r| !r.is_empty()) {
        Some(run) => run,
        None => {
            let want = run_len(&ctx.limits, topic, sub, pos);
            if want < RUN_ENTRIES_MIN {
                return read(ctx, topic, sub, pos).await;
            }
            match ctx.log.read_run(ledger, e, want, RUN_BYTES_MAX).await {
                Ok(run) => run,
                // Damage somewhere in the run: read this entry alone, so
                // that what is readable before the damaged entry goes out
                // and the error names the damaged entry itself.
                Err(magnetar_storage::StorageError::Corrupt { .. }) => return read(ctx, topic, sub, pos).await,
                Err(err) => {
                    sub.counters.entries_read.set(sub.counters.entries_read.get() + 1);
                    return Err(err);
                }
            }
        }
    };
    sub.counters.entries_read.set(sub.counters.entries_read.get() + 1);
    let mut run = std::collections::VecDeque::from(run);
    let first = run.pop_front();
    {
        let mut a = sub.ahead.borrow_mut();
        let run_len = run.len() + 1;
        // A background read started while this one was awaited is kept
        // only if it starts where this run ends (`take` checks).
        let next = a.next.take();
        *a = ReadAhead { first: pos + 1, ledger, first_entry: e + 1, entries: run, run_len, next };
    }
    start_next_run(ctx, topic, sub);
    // A run holds at least one entry.
    first.ok_or(magnetar_storage::StorageError::NoSuchEntry { ledger, entry: e })
}

/// Once the current run is half used, starts reading the next one in the
/// background (in the dispatch task queue), sized by the permits the
/// consumers have now: the disk reads it while the dispatcher delivers.
fn start_next_run<S: DeliverySink, L: LogReader>(ctx: &DispatchCtx<S, L>, topic: &Topic, sub: &Subscription) {
    let (pos, left) = {
        let a = sub.ahead.borrow();
        if a.next.is_some() || a.entries.len() * 2 > a.run_len {
            return;
        }
        (a.first + a.entries.len() as u64, a.entries.len())
    };
    let Some((ledger, entry)) = topic.ledgers.borrow().locate(pos) else { return };
    // The entries still in this run take permits first.
    let want = run_len(&ctx.limits, topic, sub, pos).saturating_sub(left);
    if want < RUN_ENTRIES_MIN {
        return;
    }
    if let Some(rx) = ctx.log.read_run_ahead(ledger, entry, want, RUN_BYTES_MAX) {
        sub.ahead.borrow_mut().next = Some(NextRun { pos, ledger, entry, rx });
    }
}

/// Reads one entry. Unreadable data (failed checksum, I/O error) is an
/// error, never served: the caller hands out what it gathered, then closes
/// the consumers with the reason ([`fail_read`]).
async fn read<S: DeliverySink, L: LogReader>(
    ctx: &DispatchCtx<S, L>,
    topic: &Rc<Topic>,
    sub: &Rc<Subscription>,
    entry: u64,
) -> Result<Bytes, magnetar_storage::StorageError> {
    sub.counters.entries_read.set(sub.counters.entries_read.get() + 1);
    let located = topic.ledgers.borrow().locate(entry);
    match located {
        Some((ledger, e)) => ctx.log.read(ledger, e).await,
        None => Err(magnetar_storage::StorageError::NoSuchEntry { ledger: u64::MAX, entry }),
    }
}

/// Closes every consumer of `sub` with the reason `entry` (a topic
/// position) cannot be read: `DamagedEntry` naming the entry when its bytes
/// failed verification (the subscription then waits at it, and says so to
/// every consumer that comes, until an operator skips it), else
/// `PersistenceError` (an I/O error; retriable).
fn fail_read<S: DeliverySink, L: LogReader>(
    ctx: &DispatchCtx<S, L>,
    topic: &Topic,
    sub: &Subscription,
    entry: u64,
    e: magnetar_storage::StorageError,
) {
    let id = topic.message_id(entry);
    let name = id.map_or_else(|| format!("at position {entry}"), |id| format!("{}:{}", id.ledger, id.entry));
    let (code, message) = match &e {
        magnetar_storage::StorageError::Corrupt { .. } => {
            sub.damaged.set(Some(entry));
            tracing::error!(
                topic = %topic.key, subscription = %sub.name, entry = %name,
                "damaged entry, never served; `magnetar admin subscriptions skip-damaged` moves past it: {e}"
            );
            (
                ErrorCode::DamagedEntry,
                format!(
                    "entry {name} of {} is damaged on the broker's disk and is never served ({e}); \
                     `magnetar admin subscriptions skip-damaged {} {}` moves the subscription past it",
                    topic.key, topic.key, sub.name
                ),
            )
        }
        _ => {
            tracing::error!(topic = %topic.key, entry = %name, "read failed: {e}");
            (ErrorCode::PersistenceError, format!("cannot read entry {name} of {}: {e}", topic.key))
        }
    };
    sub.ahead.borrow_mut().entries.clear();
    let consumers: Vec<ConsumerRef> = sub.consumers.borrow().iter().map(|c| c.consumer).collect();
    for c in consumers {
        sub.remove_consumer(&ctx.sink, c);
        ctx.sink.deliver(
            c,
            ConsumerEvent::Closed { consumer_id: c.consumer_id, code, message: message.clone(), entry: id },
        );
    }
}

/// `num_messages` comes from the caller's peek of `blob`: a peek reads the
/// metadata, and reading it a second time here would cost on every
/// delivered message for nothing new.
#[allow(clippy::too_many_arguments)]
fn deliver<S: DeliverySink, L: LogReader>(
    ctx: &DispatchCtx<S, L>,
    topic: &Rc<Topic>,
    sub: &Rc<Subscription>,
    out: &mut RunOut,
    i: usize,
    entry: u64,
    key_hash: u16,
    num_messages: u32,
    blob: Bytes,
    now_ms: u64,
) {
    // Just read, and retention deletes only what every durable cursor is
    // past (readers are moved past it, which the caller checked after the
    // read): the position is stored.
    let message_id = topic.message_id(entry);
    assert!(message_id.is_some(), "dispatching position {entry} of {}, which is not stored", topic.key);
    let Some(message_id) = message_id else { return };
    topic.note_messages(entry, num_messages);
    // A batch some of whose messages are acknowledged goes out with their
    // bits, and the client hands out only the others.
    let (ack_set, acked) = match sub.batch_acks.borrow().get((message_id.ledger, message_id.entry)) {
        Some(bits) if bits.size() == num_messages => (bits.words().to_vec(), bits.acked_count()),
        _ => (Vec::new(), 0),
    };
    let consumer = {
        let mut consumers = sub.consumers.borrow_mut();
        let c = &mut consumers[i];
        assert!(c.permits > 0, "dispatch without a permit");
        // `Ask::can_take` and `open` hold these: the limits bound memory.
        assert!(c.unacked < ctx.limits.unacked_per_consumer_max, "dispatch past the consumer's unacked limit");
        // Permits count messages: a batch takes as many as it hands out (it
        // goes out whole, even past the consumer's last permits).
        c.permits = c.permits.saturating_sub(u64::from(num_messages - acked));
        c.unacked += 1;
        c.consumer
    };
    sub.policy.borrow_mut().delivered(i, &sub.consumers.borrow());
    sub.delivered_total.set(sub.delivered_total.get() + 1);
    sub.counters.out.record(now_ms, u64::from(num_messages - acked), blob.len() as u64);
    // Counted before only if it left a consumer unacknowledged (or came
    // back with the state record); usually the map is empty.
    let deliveries = {
        let mut d = sub.deliveries.borrow_mut();
        if d.is_empty() {
            1
        } else {
            d.remove(&entry).unwrap_or(0).saturating_add(1)
        }
    };
    let redelivery_count = deliveries - 1;
    if redelivery_count > 0 {
        sub.consumers.borrow_mut()[i].redelivered += u64::from(num_messages - acked);
        // Redelivery counts persist (bounded, and rate-limited) so they go
        // on after a restart.
        ctx.dirty.mark_counts(topic, sub);
    }
    let previous = sub.pending.borrow_mut().insert(entry, Pending { consumer, key_hash, num_messages, deliveries });
    assert!(previous.is_none(), "entry {entry} delivered while another consumer holds it");
    assert!(
        sub.pending.borrow().len() <= ctx.limits.unacked_per_subscription_max as usize,
        "dispatch past the subscription's unacked limit"
    );
    if ack_set.is_empty() {
        out.push(&ctx.sink, consumer, message_id, redelivery_count, blob);
    } else {
        // Per consumer, events keep delivery order.
        out.flush(&ctx.sink);
        ctx.sink.deliver(
            consumer,
            ConsumerEvent::Message { consumer_id: consumer.consumer_id, message_id, redelivery_count, blob, ack_set },
        );
    }
}

#[cfg(test)]
mod tests {
    use super::ReadAhead;
    use bytes::Bytes;

    fn run(first: u64, ledger: u64, first_entry: u64, n: u64) -> ReadAhead {
        let entries = (0..n).map(|i| Bytes::from(vec![i as u8])).collect();
        ReadAhead { first, ledger, first_entry, entries, run_len: n as usize, next: None }
    }

    /// Goal: a run hands out the entry at a position only when the position
    /// is stored where the run read it; skipped positions drop what is
    /// before them; anything else empties the run (read again).
    #[test]
    fn take_matches_position_and_location() {
        let mut a = run(100, 7, 40, 5);
        assert_eq!(a.take(100, 7, 40), Some(Bytes::from(vec![0u8])));
        // 101 skipped by the dispatcher (acked): 102 is entry 42.
        assert_eq!(a.take(102, 7, 42), Some(Bytes::from(vec![2u8])));
        assert_eq!(a.entries.len(), 2);
        // Stored elsewhere than the run says: not served, the run is gone.
        assert_eq!(a.take(103, 8, 0), None);
        assert!(a.entries.is_empty());

        let mut a = run(100, 7, 40, 5);
        // Before the run (a seek back) or past it: empty.
        assert_eq!(a.take(99, 7, 39), None);
        assert!(a.entries.is_empty());
        let mut a = run(100, 7, 40, 5);
        assert_eq!(a.take(105, 7, 45), None);
        assert!(a.entries.is_empty());
        let mut a = run(100, 7, 40, 5);
        assert_eq!(a.take(104, 7, 44), Some(Bytes::from(vec![4u8])));
        assert!(a.entries.is_empty());
    }
}
