//! Consumers: receive messages of one subscription and acknowledge them.
//! This module owns the [`Consumer`] handle (receive, acks, seek, close)
//! and its flow permits; the rest is in its parts:
//! - `builder`: options and the Subscribe exchange;
//! - `inbox` and `unpack`: the queue the connection fills with entries as
//!   the broker sent them, unpacked (decompressed, batches split) as they
//!   are taken off;
//! - `acks`, `ack_group`: what an ack means to the broker (batch-index
//!   acks, chunks, the retry topic's consumer) and acks grouped in time;
//! - `tracker` and `timers`: ack timeout and nacks, and the timer task;
//! - `chunking`: reassembly of chunked messages;
//! - `dead_letter`: the dead-letter and retry topics;
//! - `multi`: several topics through one handle.

pub(crate) mod ack_group;
mod acks;
mod builder;
pub(crate) mod chunking;
mod dead_letter;
mod inbox;
pub(crate) mod multi;
mod timers;
pub(crate) mod tracker;
mod unpack;

pub use builder::ConsumerBuilder;
pub use dead_letter::{
    DeadLetterPolicy, Reconsumed, RetryPolicy, PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_REAL_TOPIC,
    PROPERTY_RECONSUME_TIMES, ROCKETMQ_RETRY_DELAYS,
};

use crate::conn::{expect_success, Connection};
use crate::error::{ClientError, Result};
use crate::message::Message;
use ack_group::{AckBatch, AckGroup};
use acks::{ack_commands, group, individual_ack, route, AckMap, RetryRoute};
use dead_letter::Republish;
use inbox::{Delivery, OwnQueue, Queue};
use magnetar_wire::{AckType, Command, MessageId};
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use timers::clock;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::Notify;
use tracker::{NackBackoff, Tracker};

/// Default number of messages the broker may push ahead of `receive`.
pub const DEFAULT_RECEIVER_QUEUE_SIZE: u32 = 1000;
/// Upper bound accepted by [`ConsumerBuilder::receiver_queue_size`].
pub const RECEIVER_QUEUE_SIZE_MAX: u32 = 1 << 20;

/// A consumer of one subscription on one topic. `Send + Sync`; `receive`
/// calls from several tasks are served one at a time.
pub struct Consumer {
    conn: Arc<Connection>,
    consumer_id: u64,
    topic: Arc<str>,
    subscription: String,
    queue: Queue,
    permits: Permits,
    closed: Arc<AtomicBool>,
    active: Arc<AtomicBool>,
    tracker: Arc<Tracker>,
    /// Wakes the timer task: something falls due before it would wake by
    /// itself, or the consumer closed.
    timers: Arc<Notify>,
    nack_backoff: NackBackoff,
    republish: Republish,
    retry: Option<Arc<RetryRoute>>,
    acks: Arc<AckGroup>,
    ack_map: AckMap,
}

/// The flow permits a consumer grants the broker: the whole queue up front,
/// then what the application took, once it took half the queue.
struct Permits {
    /// Messages handed to the application since the last `Flow`.
    unflowed: AtomicU32,
    /// The same for the retry topic's consumer.
    unflowed_retry: AtomicU32,
    threshold: u32,
    queue_size: u32,
    /// Pull mode: no permits up front nor as messages are received; each
    /// `fetch` grants what it asks for.
    pull: bool,
    /// Pull mode: entries the broker may still send, as far as this side
    /// knows (granted by `fetch`, less the entries taken off the queue).
    outstanding: AtomicU32,
}

impl Permits {
    fn new(queue_size: u32, pull: bool) -> Self {
        Self {
            unflowed: AtomicU32::new(0),
            unflowed_retry: AtomicU32::new(0),
            threshold: (queue_size / 2).max(1),
            queue_size,
            pull,
            outstanding: AtomicU32::new(0),
        }
    }

    /// Pull mode: `entries` came off the queue, so the broker has that many
    /// permits fewer.
    fn took(&self, entries: u32) {
        if self.pull && entries > 0 {
            let _ = self
                .outstanding
                .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |o| Some(o.saturating_sub(entries)));
        }
    }
}

impl std::fmt::Debug for Consumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Consumer")
            .field("topic", &self.topic)
            .field("subscription", &self.subscription)
            .finish_non_exhaustive()
    }
}

impl Consumer {
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Whether messages of `topic` (a message's own `Arc`, or an equal
    /// name) come from this consumer or its retry topic.
    pub(crate) fn delivers(&self, topic: &Arc<str>) -> bool {
        Arc::ptr_eq(&self.topic, topic) || self.retry.as_ref().is_some_and(|r| Arc::ptr_eq(&r.topic, topic))
    }

    /// Like `delivers`, by name.
    pub(crate) fn delivers_named(&self, topic: &str) -> bool {
        *self.topic == *topic || self.retry.as_ref().is_some_and(|r| *r.topic == *topic)
    }

    pub fn subscription(&self) -> &str {
        &self.subscription
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    pub(crate) fn closed_error(&self) -> ClientError {
        // Closed on purpose (by us or the broker) wins over a connection
        // that broke afterwards.
        if self.is_closed() {
            return ClientError::ConsumerClosed { subscription: self.subscription.clone() };
        }
        match self.conn.closed_reason() {
            Some(reason) => ClientError::Disconnected { reason },
            None => ClientError::ConsumerClosed { subscription: self.subscription.clone() },
        }
    }

    /// Wait for the next message. Messages already delivered are still
    /// returned after the connection breaks; then this fails with
    /// `Disconnected` (or `ConsumerClosed`). A message whose blob cannot be
    /// decoded is returned as `Err(ClientError::Wire(..))` and the next call
    /// goes on with the following one. No timeout: wrap it in
    /// `tokio::time::timeout` to bound the wait. Cancel-safe: a `receive`
    /// dropped before it completes loses no message.
    pub async fn receive(&self) -> Result<Message> {
        let own = self.own_queue()?;
        // Uncontended (the usual case): no semaphore wait future per message.
        let mut q = match own.try_lock() {
            Ok(q) => q,
            Err(_) => own.lock().await,
        };
        if !q.rest.is_empty() {
            // Yield to the runtime now and then, as a `recv` per message
            // would, so a long batch does not starve the other tasks.
            tokio::task::coop::consume_budget().await;
        }
        loop {
            let delivery = match q.rest.next() {
                Some(d) => d,
                None => match q.rx.recv().await {
                    // Nothing below awaits, so an item taken off the queue is
                    // always returned, kept in `rest` or handed to the
                    // dead-letter task (cancel safety).
                    Some(queued) => {
                        let entries = q.load(queued.item);
                        self.permits.took(entries);
                        continue;
                    }
                    None => return Err(self.closed_error()),
                },
            };
            self.grant_uncounted(q.rest.take_uncounted_permits());
            if let Some(delivery) = self.accept(delivery) {
                return delivery;
            }
        }
    }

    fn own_queue(&self) -> Result<&tokio::sync::Mutex<OwnQueue>> {
        match &self.queue {
            Queue::Own(rx) => Ok(rx),
            Queue::Shared => Err(ClientError::InvalidOption {
                option: "receive",
                reason: "this consumer's messages arrive through its multi-topic consumer",
            }),
        }
    }

    /// A delivery taken off the queue, on its way to the application:
    /// counts its permit, reassembles chunks, screens for the dead-letter
    /// topic and tracks batches. `None`: nothing to hand out for it (yet).
    /// Never awaits.
    ///
    /// A message that is not a chunk nor due for the dead-letter topic (the
    /// usual case) is only looked at, not passed through `assemble` and
    /// `screen` by value: each pass copied it (a `Message` is 160 bytes).
    #[inline]
    pub(crate) fn accept(&self, delivery: Delivery) -> Option<Delivery> {
        self.after_receive(&delivery);
        let delivery = match &delivery {
            Ok(m) if m.entry.is_chunk() => self.assemble(delivery)?,
            _ => delivery,
        };
        let delivery = match &delivery {
            Ok(m) if self.republish.dead_letter.as_ref().is_some_and(|dl| m.redelivery_count > dl.max_redeliveries) => {
                self.screen(delivery)?
            }
            Ok(m) => {
                if self.tracker.received(m.id, clock) {
                    self.timers.notify_one();
                }
                delivery
            }
            Err(_) => delivery,
        };
        self.ack_map.track_batch(&delivery);
        Some(delivery)
    }

    /// Up to `max` messages: waits for the first, then takes what is already
    /// here without waiting.
    pub async fn receive_batch(&self, max: usize) -> Result<Vec<Message>> {
        let mut out = vec![self.receive().await?];
        while out.len() < max {
            match self.try_receive()? {
                Some(m) => out.push(m),
                None => break,
            }
        }
        Ok(out)
    }

    /// The consumer as a `Stream` of messages (ends when the consumer is
    /// closed or the connection ends).
    pub fn stream(&self) -> impl futures::Stream<Item = Result<Message>> + '_ {
        futures_util_unfold(self)
    }

    /// Message-listener style: a task calls `on_message(consumer, message)`
    /// for each message, one at a time, until the consumer is closed or the
    /// connection ends (a message that cannot be decoded is skipped with a
    /// warning). Needs a tokio runtime.
    pub fn listen<F, Fut>(self: Arc<Self>, mut on_message: F) -> tokio::task::JoinHandle<()>
    where
        F: FnMut(Arc<Consumer>, Message) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + Send + 'static,
    {
        tokio::spawn(async move {
            loop {
                match self.receive().await {
                    Ok(m) => on_message(self.clone(), m).await,
                    Err(ClientError::Wire(e)) => tracing::warn!(error = %e, "listener skipped an undecodable message"),
                    Err(_) => return,
                }
            }
        })
    }

    /// The next message if one is already here, without waiting. `Ok(None)`
    /// also when another task is inside `receive`.
    pub fn try_receive(&self) -> Result<Option<Message>> {
        let Ok(mut q) = self.own_queue()?.try_lock() else { return Ok(None) };
        loop {
            let delivery = match q.rest.next() {
                Some(d) => d,
                None => match q.rx.try_recv() {
                    Ok(queued) => {
                        q.load(queued.item);
                        continue;
                    }
                    Err(TryRecvError::Empty) => return Ok(None),
                    Err(TryRecvError::Disconnected) => return Err(self.closed_error()),
                },
            };
            if let Some(delivery) = self.accept(delivery) {
                return delivery.map(Some);
            }
        }
    }

    /// Failover: whether the broker last said this consumer is the active one.
    pub fn is_active(&self) -> bool {
        self.active.load(Ordering::Acquire)
    }

    /// Negative acknowledgement: the message comes back (to this or another
    /// consumer) after the backoff delay for its redelivery count.
    pub fn negative_acknowledge(&self, msg: &Message) {
        let delay = self.nack_backoff.delay(msg.redelivery_count);
        if self.tracker.nacked(msg.id, delay, clock()) {
            self.timers.notify_one();
        }
    }

    /// Ask the broker to deliver again every message this consumer holds
    /// unacknowledged, at once. Messages waiting in the local queue are
    /// dropped first (they come again), as Pulsar does.
    pub async fn redeliver_unacknowledged(&self) -> Result<()> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        let own = self.own_queue()?;
        self.flush_acks().await?;
        // Their permits are granted again, as if received.
        let mut q = own.lock().await;
        let entries = q.drain(|delivery| self.after_receive(delivery));
        let uncounted = q.rest.take_uncounted_permits();
        drop(q);
        self.permits.took(entries);
        self.grant_uncounted(uncounted);
        let command = Command::RedeliverUnacknowledged { consumer_id: self.consumer_id, message_ids: Vec::new() };
        self.conn.send_command(&command).await?;
        if let Some(r) = &self.retry {
            let command = Command::RedeliverUnacknowledged { consumer_id: r.consumer_id, message_ids: Vec::new() };
            self.conn.send_command(&command).await?;
        }
        Ok(())
    }

    /// Move the subscription's cursor so that `id` is the next message
    /// delivered (earlier ones count as acknowledged, later ones as not).
    /// Messages already in the local queue are dropped. Messages the broker
    /// sent just before the seek may still arrive after it.
    pub async fn seek(&self, id: MessageId) -> Result<()> {
        self.seek_to(Some(id), 0).await
    }

    /// Move the cursor to the first message published at or after
    /// `publish_time_ms` (milliseconds since the Unix epoch).
    pub async fn seek_by_time(&self, publish_time_ms: u64) -> Result<()> {
        self.seek_to(None, publish_time_ms).await
    }

    async fn seek_to(&self, message_id: Option<MessageId>, publish_time_ms: u64) -> Result<()> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        let own = self.own_queue()?;
        self.flush_acks().await?;
        let consumer_id = self.consumer_id;
        // Hold the queue while seeking so no `receive` hands out a message
        // from before the seek once it is answered.
        let mut q = own.lock().await;
        let answer = self
            .conn
            .request("seek", |request_id| Command::Seek { request_id, consumer_id, message_id, publish_time_ms })
            .await?;
        expect_success(answer, "Seek")?;
        // The broker set our permits to 0: drop what is queued and grant
        // the whole queue again.
        q.discard();
        self.permits.unflowed.store(0, Ordering::Relaxed);
        self.tracker.clear();
        if self.permits.pull {
            // The next `fetch` grants what it asks for.
            self.permits.outstanding.store(0, Ordering::Relaxed);
            return Ok(());
        }
        self.conn.send_command(&Command::Flow { consumer_id, permits: self.permits.queue_size }).await
    }

    /// Pull consumption (a consumer built with `pull_mode(true)`): returns
    /// up to `max` messages, waiting until `max` are here or `timeout` has
    /// passed (long poll), then whatever arrived (maybe none). The request
    /// grants the broker the permits it lacks for `max` entries; entries
    /// granted and not yet arrived when a fetch times out count toward the
    /// next one (so at most `max` entries are ever outstanding). Acks,
    /// negative acks, ack timeout and redelivery work as for `receive`.
    pub async fn fetch(&self, max: u32, timeout: std::time::Duration) -> Result<Vec<Message>> {
        if !self.permits.pull {
            return Err(ClientError::InvalidOption {
                option: "fetch",
                reason: "needs a consumer built with pull_mode(true)",
            });
        }
        if max == 0 || max > RECEIVER_QUEUE_SIZE_MAX {
            return Err(ClientError::InvalidOption { option: "fetch", reason: "max must be in 1..=1048576" });
        }
        if self.is_closed() {
            return Err(self.closed_error());
        }
        let deadline = tokio::time::Instant::now() + timeout;
        let outstanding = self.permits.outstanding.load(Ordering::Relaxed);
        if outstanding < max {
            let permits = max - outstanding;
            self.permits.outstanding.fetch_add(permits, Ordering::Relaxed);
            self.conn.send_command(&Command::Flow { consumer_id: self.consumer_id, permits }).await?;
        }
        let mut out = Vec::new();
        while out.len() < max as usize {
            match tokio::time::timeout_at(deadline, self.receive()).await {
                Ok(Ok(m)) => out.push(m),
                // What was fetched goes out first; a lasting error (the
                // connection) shows on the next call.
                Ok(Err(e)) if out.is_empty() => return Err(e),
                Ok(Err(_)) | Err(_) => break,
            }
        }
        Ok(out)
    }

    /// Grants back permits the broker charged for an entry that was handed
    /// out as an error, beyond the one that error counts as
    /// (`inbox::Unpacking::take_uncounted_permits`). At most the queue
    /// size: the broker never held more permits than that to charge.
    pub(crate) fn grant_uncounted(&self, n: u32) {
        let n = n.min(self.permits.queue_size);
        if n == 0 || self.permits.pull {
            // (Pull mode: permits come with each `fetch`.)
            return;
        }
        let unflowed = &self.permits.unflowed;
        if unflowed.fetch_add(n, Ordering::Relaxed).saturating_add(n) >= self.permits.threshold {
            let permits = unflowed.swap(0, Ordering::Relaxed);
            if permits == 0 {
                return;
            }
            let consumer_id = self.consumer_id;
            if let Err(e) = self.conn.send_command_nowait(&Command::Flow { consumer_id, permits }) {
                tracing::debug!(error = %e, "flow not sent");
            }
        }
    }

    /// Grant more permits once half the queue has been handed out, so the
    /// broker always has room to keep sending without a Flow per message.
    /// A failure to send the Flow is not the message's failure: it only
    /// happens when the connection is gone, and then permits are moot.
    fn after_receive(&self, delivery: &Delivery) {
        if self.permits.pull {
            // Permits come with each `fetch` (pull mode has no retry topic).
            return;
        }
        let from_retry = match (&self.retry, delivery) {
            (Some(r), Ok(m)) if m.topic == r.topic => {
                r.ledgers.lock().unwrap_or_else(|p| p.into_inner()).insert(m.id.ledger);
                true
            }
            _ => false,
        };
        let (unflowed, consumer_id) = match &self.retry {
            Some(r) if from_retry => (&self.permits.unflowed_retry, r.consumer_id),
            _ => (&self.permits.unflowed, self.consumer_id),
        };
        if unflowed.fetch_add(1, Ordering::Relaxed) + 1 >= self.permits.threshold {
            // Another thread may have taken them just now.
            let permits = unflowed.swap(0, Ordering::Relaxed);
            if permits == 0 {
                return;
            }
            if let Err(e) = self.conn.send_command_nowait(&Command::Flow { consumer_id, permits }) {
                tracing::debug!(error = %e, "flow not sent");
            }
        }
    }

    async fn send_ack(&self, ack_type: AckType, id: &MessageId) -> Result<()> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        match ack_type {
            AckType::Individual => self.tracker.acked(id),
            AckType::Cumulative => self.tracker.acked_cumulative(id),
        }
        // What the broker acknowledges (see `broker_acks`).
        if self.acks.enabled() {
            let cumulative = ack_type == AckType::Cumulative;
            let mut full = Vec::new();
            let mut wake = false;
            self.ack_map.broker_acks_each(ack_type, std::slice::from_ref(id), |id, size| {
                let added = self.acks.add(id, size, cumulative, clock);
                full.extend(added.full);
                wake |= added.wake;
            });
            if wake {
                self.timers.notify_one();
            }
            for batch in full {
                self.send_acks(batch).await?;
            }
            return Ok(());
        }
        for (id, size) in self.ack_map.broker_acks(ack_type, std::slice::from_ref(id)) {
            let consumer_id = route(self.consumer_id, &self.retry, &id);
            let batch_sizes = if size > 0 { vec![size] } else { Vec::new() };
            let command = Command::Ack { consumer_id, ack_type, message_ids: vec![id], request_id: 0, batch_sizes };
            self.conn.send_command(&command).await?;
        }
        Ok(())
    }

    /// Passes non-chunks through; collects chunks, returning the whole
    /// message with its last chunk. Chunks dropped (expired, out of order)
    /// are acknowledged so the broker does not keep them.
    fn assemble(&self, delivery: Delivery) -> Option<Delivery> {
        let msg = match delivery {
            Ok(m) if m.entry.is_chunk() => m,
            other => return Some(other),
        };
        let mut stray = Vec::new();
        let result = self.ack_map.assemble(msg, &mut stray);
        if !stray.is_empty() {
            let ack = Command::Ack {
                consumer_id: self.consumer_id,
                ack_type: AckType::Individual,
                message_ids: stray,
                request_id: 0,
                batch_sizes: Vec::new(),
            };
            if let Err(e) = self.conn.send_command_nowait(&ack) {
                tracing::debug!(error = %e, "ack of dropped chunks not sent");
            }
        }
        result
    }

    async fn send_acks(&self, batch: AckBatch) -> Result<()> {
        for command in ack_commands(self.consumer_id, &self.retry, batch) {
            self.conn.send_command(&command).await?;
        }
        Ok(())
    }

    /// Sends the acks waiting in the group now.
    pub async fn flush_acks(&self) -> Result<()> {
        let batch = self.acks.take_all();
        if batch.is_empty() {
            return Ok(());
        }
        self.send_acks(batch).await
    }

    /// Acknowledge one message. Returns once the ack is grouped or queued on
    /// the connection (the broker does not answer); acks and a later
    /// `close()` reach the broker in order.
    pub async fn ack(&self, id: &MessageId) -> Result<()> {
        self.send_ack(AckType::Individual, id).await
    }

    /// Acknowledge every message up to and including `id`.
    pub async fn ack_cumulative(&self, id: &MessageId) -> Result<()> {
        self.send_ack(AckType::Cumulative, id).await
    }

    /// Acknowledge and wait for the broker's confirmation (within the
    /// operation timeout). With `AckType::Cumulative`, `ids` must hold exactly one id.
    pub async fn ack_confirmed(&self, ack_type: AckType, ids: &[MessageId]) -> Result<()> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        if ids.is_empty() || (ack_type == AckType::Cumulative && ids.len() != 1) {
            return Err(ClientError::InvalidOption {
                option: "ids",
                reason: "one id or more; exactly one for a cumulative ack",
            });
        }
        for id in ids {
            match ack_type {
                AckType::Individual => self.tracker.acked(id),
                AckType::Cumulative => self.tracker.acked_cumulative(id),
            }
        }
        // Grouped acks first: the confirmation then covers them too.
        self.flush_acks().await?;
        let broker_acks = self.ack_map.broker_acks(ack_type, ids);
        for (consumer_id, acks) in group(self.consumer_id, &self.retry, &broker_acks, |(id, _)| id) {
            let answer = self
                .conn
                .request("ack", |request_id| {
                    let mut command = individual_ack(consumer_id, &acks, request_id);
                    if let Command::Ack { ack_type: t, .. } = &mut command {
                        *t = ack_type;
                    }
                    command
                })
                .await?;
            expect_success(answer, "Ack")?;
        }
        Ok(())
    }

    /// Close the consumer on the broker. Unacknowledged messages go back to
    /// the subscription; messages still in the local queue are dropped.
    pub async fn close(&self) -> Result<()> {
        if self.is_closed() {
            return Ok(());
        }
        // Acks still grouped go before the close, so the broker has them.
        if let Err(e) = self.flush_acks().await {
            tracing::debug!(error = %e, "grouped acks not sent before close");
        }
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
        }
        // The timer task ends.
        self.timers.notify_one();
        if let Some(r) = &self.retry {
            let retry_id = r.consumer_id;
            let closed = self
                .conn
                .request("close consumer", |request_id| Command::CloseConsumer { request_id, consumer_id: retry_id })
                .await;
            self.conn.remove_consumer(retry_id);
            if let Err(e) = closed {
                tracing::debug!(error = %e, "closing the retry consumer");
            }
        }
        let consumer_id = self.consumer_id;
        let answer =
            self.conn.request("close consumer", |request_id| Command::CloseConsumer { request_id, consumer_id }).await;
        self.conn.remove_consumer(consumer_id);
        expect_success(answer?, "CloseConsumer")
    }

    /// Deletes this consumer's subscription (for a broadcast consumer, its
    /// own cursor `<subscription>/<name>`) and closes the consumer. With
    /// other consumers attached the broker refuses (`ConsumerBusy`) unless
    /// `force`; the consumer then stays open. A retry topic's subscription
    /// is left alone.
    pub async fn unsubscribe(&self, force: bool) -> Result<()> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        let consumer_id = self.consumer_id;
        let answer = self
            .conn
            .request("unsubscribe", |request_id| Command::Unsubscribe { request_id, consumer_id, force })
            .await;
        expect_success(answer?, "Unsubscribe")?;
        // The broker detached it; closing the rest (the retry consumer, the
        // timers) may find it gone.
        self.conn.remove_consumer(consumer_id);
        match self.close().await {
            Ok(()) | Err(ClientError::Broker { .. }) => Ok(()),
            Err(e) => Err(e),
        }
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        if !self.closed.swap(true, Ordering::AcqRel) {
            for command in ack_commands(self.consumer_id, &self.retry, self.acks.take_all()) {
                self.conn.try_send_command(&command);
            }
            self.conn.try_send_command(&Command::CloseConsumer { request_id: 0, consumer_id: self.consumer_id });
            self.conn.remove_consumer(self.consumer_id);
            if let Some(r) = &self.retry {
                self.conn.try_send_command(&Command::CloseConsumer { request_id: 0, consumer_id: r.consumer_id });
                self.conn.remove_consumer(r.consumer_id);
            }
        }
        // The timer task ends (`closed` is set, whoever closed it).
        self.timers.notify_one();
    }
}

fn futures_util_unfold(consumer: &Consumer) -> impl futures::Stream<Item = Result<Message>> + '_ {
    futures::stream::unfold(consumer, |c| async move {
        match c.receive().await {
            Ok(m) => Some((Ok(m), c)),
            Err(ClientError::ConsumerClosed { .. } | ClientError::Disconnected { .. }) => None,
            Err(e) => Some((Err(e), c)),
        }
    })
}
