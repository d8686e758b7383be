//! Consumers: receive messages of one subscription and acknowledge them.

use crate::ack_group::{AckBatch, AckGroup};
use crate::connection::{Connection, ConsumerSlot, Delivery};
use crate::error::{ClientError, Result};
use crate::message::{Message, OutgoingMessage};
use crate::names::normalize_topic;
use crate::producer::{Producer, ProducerBuilder};
use crate::tracker::{NackBackoff, Tracker};
use magnetar_wire::{AckType, Command, InitialPosition, MessageId, SubscriptionType};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TryRecvError;
use tokio::sync::Notify;

/// Default number of messages the broker may push ahead of `receive`.
pub const DEFAULT_RECEIVER_QUEUE_SIZE: u32 = 1000;
/// Upper bound accepted by [`ConsumerBuilder::receiver_queue_size`].
pub const RECEIVER_QUEUE_SIZE_MAX: u32 = 1 << 20;

/// Options of a consumer; made by [`Client::subscribe`](crate::Client::subscribe).
///
/// ```no_run
/// # use magnetar_client::{InitialPosition, SubscriptionType};
/// # async fn f(client: magnetar_client::Client) -> Result<(), magnetar_client::ClientError> {
/// let consumer = client
///     .subscribe("orders", "s1")
///     .sub_type(SubscriptionType::Exclusive)
///     .initial_position(InitialPosition::Earliest)
///     .receiver_queue_size(1000)
///     .subscribe()
///     .await?;
/// # Ok(()) }
/// ```
#[must_use = "call .subscribe().await"]
pub struct ConsumerBuilder {
    pub(crate) conn: Arc<Connection>,
    pub(crate) topic: String,
    pub(crate) subscription: String,
    pub(crate) sub_type: SubscriptionType,
    pub(crate) initial_position: InitialPosition,
    pub(crate) receiver_queue_size: u32,
    pub(crate) consumer_name: String,
    pub(crate) priority_level: i32,
    pub(crate) filter_tag: String,
    pub(crate) key_shared_ranges: Vec<(u16, u16)>,
    pub(crate) nack_backoff: NackBackoff,
    pub(crate) ack_timeout: Option<Duration>,
    pub(crate) dead_letter: Option<DeadLetterPolicy>,
    pub(crate) retry_enabled: bool,
    pub(crate) ack_group_time: Duration,
    pub(crate) ack_group_max: usize,
    pub(crate) durable: bool,
    /// A multi-topic consumer's shared queue and this member's index in
    /// it; `None`: the consumer gets a queue of its own.
    pub(crate) inbox: Option<(mpsc::UnboundedSender<Queued>, u32)>,
}

/// Where messages go after too many deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterPolicy {
    /// A message delivered this many times again (redelivery count above it)
    /// goes to the dead-letter topic instead of the application.
    pub max_redeliveries: u32,
    /// Default `<topic>-<subscription>-DLQ`.
    pub topic: Option<String>,
}

/// Property naming the topic a dead-lettered or retried message came from.
pub const PROPERTY_REAL_TOPIC: &str = "REAL_TOPIC";
/// Property holding the original message id (`L:E:P:B`).
pub const PROPERTY_ORIGIN_MESSAGE_ID: &str = "ORIGIN_MESSAGE_ID";
/// Property counting how often `reconsume_later` sent a message around.
pub const PROPERTY_RECONSUME_TIMES: &str = "RECONSUMETIMES";

impl ConsumerBuilder {
    /// Default `Exclusive`.
    pub fn sub_type(mut self, sub_type: SubscriptionType) -> Self {
        self.sub_type = sub_type;
        self
    }

    /// Where a new subscription starts; default `Latest`. Ignored by the
    /// broker when the subscription already exists (its cursor wins).
    pub fn initial_position(mut self, position: InitialPosition) -> Self {
        self.initial_position = position;
        self
    }

    /// Flow permits granted up front, and the bound of the local queue
    /// (default 1000). Permits are replenished by half the queue at a time as
    /// the application receives.
    pub fn receiver_queue_size(mut self, size: u32) -> Self {
        self.receiver_queue_size = size;
        self
    }

    /// Consumer name; empty (the default) lets the broker choose.
    pub fn consumer_name(mut self, name: impl Into<String>) -> Self {
        self.consumer_name = name.into();
        self
    }

    /// Failover: the active consumer is one with the lowest level (default 0),
    /// then the first by name.
    pub fn priority_level(mut self, level: i32) -> Self {
        self.priority_level = level;
        self
    }

    /// Only messages with this tag are delivered; the others count as
    /// acknowledged for the subscription (evaluated by the broker). Set by
    /// the first consumer of an idle subscription.
    pub fn filter_tag(mut self, tag: impl Into<String>) -> Self {
        self.filter_tag = tag.into();
        self
    }

    /// Key_Shared sticky mode (Pulsar's `KeySharedPolicySticky`): this
    /// consumer owns exactly these key hash ranges, each `(start, end)`
    /// inclusive within `0..=65535` (the hash is CRC-32 of the ordering
    /// key, else the key, modulo 65536). Empty (the default) = auto split.
    ///
    /// The broker refuses the subscribe (`ConsumerBusy`) when a range
    /// overlaps one of another consumer of the subscription, or when the
    /// subscription's attached consumers use the other mode (the first
    /// consumer decides); and (`NotAllowed`) a range with `start > end`,
    /// more than 256 ranges, ranges overlapping each other, or ranges on a
    /// subscription type other than Key_Shared. Messages whose key hash no
    /// consumer owns are not delivered: they wait until a consumer owning
    /// them attaches.
    pub fn key_shared_ranges(mut self, ranges: Vec<(u16, u16)>) -> Self {
        self.key_shared_ranges = ranges;
        self
    }

    /// Delay before a negatively acknowledged message comes back:
    /// `min × 2^redelivery_count`, at most `max` (default 1 s .. 60 s).
    pub fn negative_ack_backoff(mut self, min: Duration, max: Duration) -> Self {
        self.nack_backoff = NackBackoff { min, max };
        self
    }

    /// Messages not acknowledged this long after `receive` are redelivered
    /// (default: never).
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.ack_timeout = Some(timeout);
        self
    }

    /// Ack grouping: acks are sent together every `time` or every `max`
    /// acks (default 100 ms, 1,000). `Duration::ZERO` sends each ack at once.
    pub fn ack_group(mut self, time: Duration, max: usize) -> Self {
        self.ack_group_time = time;
        self.ack_group_max = max;
        self
    }

    /// Also consume `<topic>-<subscription>-RETRY` (same subscription name
    /// and type, from the earliest message), where `reconsume_later` sends
    /// messages: they come back through this consumer after their delay.
    pub fn retry_enabled(mut self, enabled: bool) -> Self {
        self.retry_enabled = enabled;
        self
    }

    /// Send messages redelivered more than `policy.max_redeliveries` times
    /// to a dead-letter topic (then acknowledge them) instead of returning them.
    pub fn dead_letter_policy(mut self, policy: DeadLetterPolicy) -> Self {
        self.dead_letter = Some(policy);
        self
    }

    /// `false`: a non-durable subscription (a reader's): its position is
    /// kept in memory only, and it disappears with its last consumer.
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    fn wire_ranges(&self) -> Vec<(u32, u32)> {
        self.key_shared_ranges.iter().map(|&(s, e)| (u32::from(s), u32::from(e))).collect()
    }

    fn with_topic(&self, topic: String) -> ConsumerBuilder {
        ConsumerBuilder {
            conn: self.conn.clone(),
            topic,
            subscription: self.subscription.clone(),
            sub_type: self.sub_type,
            initial_position: self.initial_position,
            receiver_queue_size: self.receiver_queue_size,
            consumer_name: self.consumer_name.clone(),
            priority_level: self.priority_level,
            filter_tag: self.filter_tag.clone(),
            key_shared_ranges: self.key_shared_ranges.clone(),
            nack_backoff: self.nack_backoff,
            ack_timeout: self.ack_timeout,
            dead_letter: self.dead_letter.clone(),
            retry_enabled: self.retry_enabled,
            ack_group_time: self.ack_group_time,
            ack_group_max: self.ack_group_max,
            durable: self.durable,
            inbox: self.inbox.clone(),
        }
    }

    /// Subscribe to the topic by its own name: every partition of a
    /// partitioned topic (one consumer each), or the topic itself.
    pub async fn subscribe_partitioned(self) -> Result<crate::MultiTopicConsumer> {
        let multi = crate::MultiTopicConsumer::new(self.subscription.clone());
        let topic = self.topic.clone();
        self.add_by_name(&multi, &topic).await?;
        Ok(multi)
    }

    /// Subscribe to each topic of `topics` (each one by its own name, so a
    /// partitioned one brings all its partitions) through one consumer.
    pub async fn subscribe_topics(self, topics: &[String]) -> Result<crate::MultiTopicConsumer> {
        let multi = crate::MultiTopicConsumer::new(self.subscription.clone());
        for t in topics {
            self.add_by_name(&multi, t).await?;
        }
        Ok(multi)
    }

    /// Adds `topic` (all its partitions when partitioned) to `multi`.
    pub(crate) async fn add_by_name(&self, multi: &crate::MultiTopicConsumer, topic: &str) -> Result<()> {
        let topic = normalize_topic(topic)?;
        let partitions = crate::Admin { conn: self.conn.clone() }.partitions(&topic).await?;
        if partitions == 0 {
            multi.add_topic(self.with_topic(topic)).await
        } else {
            for i in 0..partitions {
                multi.add_topic(self.with_topic(format!("{topic}-partition-{i}"))).await?;
            }
            Ok(())
        }
    }

    /// Subscribe to every topic of one namespace whose full name matches
    /// `pattern` (a regular expression over `persistent://tenant/ns/topic`,
    /// anchored at both ends; tenant and namespace must be literal). The
    /// namespace is listed again every `refresh`, and topics created later
    /// that match (and partitions added later) are subscribed too.
    pub async fn subscribe_pattern(
        self,
        pattern: &str,
        refresh: std::time::Duration,
    ) -> Result<Arc<crate::MultiTopicConsumer>> {
        let (namespace, regex) = crate::multi::parse_pattern(pattern)?;
        let multi = Arc::new(crate::MultiTopicConsumer::new(self.subscription.clone()));
        crate::multi::add_matching(&self, &multi, &namespace, &regex).await?;
        let weak = Arc::downgrade(&multi);
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(refresh).await;
                let Some(multi) = weak.upgrade() else { return };
                if let Err(e) = crate::multi::add_matching(&self, &multi, &namespace, &regex).await {
                    tracing::warn!(error = %e, "topics pattern refresh failed");
                }
            }
        });
        multi.adopt_task(task);
        Ok(multi)
    }

    /// Subscribe, then grant the broker the initial flow permits. The
    /// consumer lives on the connection to the shard that owns the topic
    /// when the broker has per-shard ports (looked up again when that shard
    /// answers `NotOwner`), else on the client's connection. With a retry
    /// topic (`enable_retry`) it stays on the client's connection: both
    /// subscriptions share one connection and their owners may differ.
    pub async fn subscribe(self) -> Result<Consumer> {
        let topic = normalize_topic(&self.topic)?;
        let mut lookups = 0;
        loop {
            let shard_aware = !self.retry_enabled && lookups < crate::routing::NOT_OWNER_LOOKUPS_MAX;
            let conn = self.conn.for_topic(&topic, shard_aware).await;
            let mut on = self.with_topic(topic.clone());
            on.conn = conn;
            match on.subscribe_here().await {
                Err(e) if shard_aware && crate::routing::is_not_owner(&e) => {
                    tracing::debug!(%topic, error = %e, "consumer refused by a shard that does not own the topic");
                    lookups += 1;
                }
                result => return result,
            }
        }
    }

    /// Subscribe on this builder's connection.
    async fn subscribe_here(self) -> Result<Consumer> {
        if self.receiver_queue_size == 0 || self.receiver_queue_size > RECEIVER_QUEUE_SIZE_MAX {
            return Err(ClientError::InvalidOption { option: "receiver_queue_size", reason: "must be in 1..=1048576" });
        }
        if self.subscription.is_empty() {
            return Err(ClientError::InvalidOption { option: "subscription", reason: "must not be empty" });
        }
        let topic = normalize_topic(&self.topic)?;
        let consumer_id = self.conn.next_handle_id();
        if self.ack_timeout.is_some_and(|t| t < Duration::from_millis(100)) {
            return Err(ClientError::InvalidOption { option: "ack_timeout", reason: "must be at least 100 ms" });
        }
        let closed = Arc::new(AtomicBool::new(false));
        let active = Arc::new(AtomicBool::new(false));
        let queue = self.receiver_queue_size;
        let topic: Arc<str> = topic.into();
        // The queue holds what the broker sent within our permits (twice that
        // with a retry topic: two broker-side consumers share it), plus at
        // most one batch entry past them each; a multi-topic consumer's
        // queue holds that for each of its members.
        let (tx, source, own) = match self.inbox.clone() {
            Some((tx, source)) => (tx, source, None),
            None => {
                let (tx, rx) = mpsc::unbounded_channel();
                (tx, 0, Some(rx))
            }
        };
        let deliver = Inbox { tx: tx.clone(), source, end_on_drop: true };
        let timers = Arc::new(Notify::new());
        let retry_deliver = Inbox { tx, source, end_on_drop: false };
        // Registered before subscribing: the broker may push messages right
        // after its Success, before our Flow even (it should not, but then
        // they are not lost).
        self.conn.register_consumer(
            consumer_id,
            ConsumerSlot {
                topic: topic.clone(),
                subscription: self.subscription.clone(),
                closed: closed.clone(),
                deliver,
                active: active.clone(),
                timers: timers.clone(),
            },
        )?;
        let answer = self
            .conn
            .request("subscribe", |request_id| Command::Subscribe {
                request_id,
                consumer_id,
                topic: topic.to_string(),
                subscription: self.subscription.clone(),
                sub_type: self.sub_type,
                consumer_name: self.consumer_name.clone(),
                initial_position: self.initial_position,
                durable: self.durable,
                priority_level: self.priority_level,
                filter_tag: self.filter_tag.clone(),
                key_shared_ranges: self.wire_ranges(),
            })
            .await;
        match answer {
            Ok(Command::Success { .. }) => {}
            Ok(other) => {
                self.conn.forget_consumer(consumer_id);
                return Err(ClientError::UnexpectedResponse { request: "Subscribe", got: format!("{other:?}") });
            }
            Err(e) => {
                self.conn.forget_consumer(consumer_id);
                return Err(e);
            }
        }
        let retry = if self.retry_enabled {
            let retry_topic: Arc<str> = format!("{topic}-{}-RETRY", self.subscription).into();
            let retry_id = self.conn.next_handle_id();
            self.conn.register_consumer(
                retry_id,
                ConsumerSlot {
                    topic: retry_topic.clone(),
                    subscription: self.subscription.clone(),
                    closed: closed.clone(),
                    deliver: retry_deliver,
                    active: Arc::new(AtomicBool::new(false)),
                    timers: timers.clone(),
                },
            )?;
            let answer = self
                .conn
                .request("subscribe", |request_id| Command::Subscribe {
                    request_id,
                    consumer_id: retry_id,
                    topic: retry_topic.to_string(),
                    subscription: self.subscription.clone(),
                    sub_type: self.sub_type,
                    consumer_name: self.consumer_name.clone(),
                    initial_position: InitialPosition::Earliest,
                    durable: true,
                    priority_level: self.priority_level,
                    filter_tag: String::new(),
                    // The same owners for the retry topic's keys.
                    key_shared_ranges: self.wire_ranges(),
                })
                .await;
            if !matches!(answer, Ok(Command::Success { .. })) {
                self.conn.remove_consumer(retry_id);
                self.conn.try_send_command(&Command::CloseConsumer { request_id: 0, consumer_id });
                self.conn.forget_consumer(consumer_id);
                return Err(match answer {
                    Err(e) => e,
                    Ok(other) => ClientError::UnexpectedResponse { request: "Subscribe", got: format!("{other:?}") },
                });
            }
            Some(Arc::new(RetryRoute { consumer_id: retry_id, topic: retry_topic, ledgers: Default::default() }))
        } else {
            drop(retry_deliver);
            None
        };
        let tracker = Arc::new(Tracker::new(self.ack_timeout));
        let acks = Arc::new(AckGroup::new(self.ack_group_time, self.ack_group_max));
        spawn_timer_task(
            self.conn.clone(),
            consumer_id,
            retry.clone(),
            tracker.clone(),
            acks.clone(),
            closed.clone(),
            timers.clone(),
        );
        let dead_letter = self.dead_letter.map(|p| {
            let dlq_topic = p.topic.clone().unwrap_or_else(|| format!("{topic}-{}-DLQ", self.subscription));
            Arc::new(DeadLetter {
                max_redeliveries: p.max_redeliveries,
                topic: dlq_topic,
                producer: Default::default(),
            })
        });
        let consumer = Consumer {
            conn: self.conn,
            consumer_id,
            topic,
            subscription: self.subscription,
            queue: match own {
                Some(rx) => Queue::Own(tokio::sync::Mutex::new(OwnQueue { rx, rest: Vec::new().into_iter() })),
                None => Queue::Shared,
            },
            unflowed: AtomicU32::new(0),
            unflowed_retry: AtomicU32::new(0),
            flow_threshold: (queue / 2).max(1),
            receiver_queue_size: queue,
            closed,
            active,
            tracker,
            timers,
            nack_backoff: self.nack_backoff,
            dead_letter,
            retry_producer: Default::default(),
            retry,
            acks,
            batches: std::sync::Mutex::new(HashMap::new()),
            chunks: std::sync::Mutex::new(ChunkState::default()),
            chunks_out: AtomicBool::new(false),
        };
        consumer.conn.send_command(&Command::Flow { consumer_id, permits: queue }).await?;
        if let Some(r) = &consumer.retry {
            consumer.conn.send_command(&Command::Flow { consumer_id: r.consumer_id, permits: queue }).await?;
        }
        Ok(consumer)
    }
}

/// What a connection puts in a consumer's queue, with the index of the
/// consumer it is for (0 for a consumer with a queue of its own; a
/// multi-topic consumer's members share one queue).
pub(crate) struct Queued {
    pub(crate) source: u32,
    pub(crate) item: Inbound,
}

#[allow(clippy::large_enum_variant, reason = "boxing would allocate per message; the other variants are rare")]
pub(crate) enum Inbound {
    Delivery(Delivery),
    /// The messages of one batch entry, in order: one queue item per entry,
    /// not per message. The receiving side keeps what it has not handed out
    /// yet (`OwnQueue::rest`, `Receiving::rest`) and goes on with it first.
    Batch(std::vec::IntoIter<Message>),
    /// The consumer's connection slot is gone (closed by us or the broker,
    /// or the connection ended): nothing more comes from it.
    End,
    /// A multi-topic consumer's member joined (or failed to): deliveries
    /// held back because they came before it was known can go on.
    Joined,
}

/// The sending side of a consumer's queue, held by its connection slot.
/// The slot's own `Inbox` puts `Inbound::End` in the queue when it is
/// dropped; its clones (the connection's, for the time of one frame, and a
/// retry topic's slot) do not.
pub(crate) struct Inbox {
    tx: mpsc::UnboundedSender<Queued>,
    source: u32,
    end_on_drop: bool,
}

impl Inbox {
    /// Queues `delivery`; false if the consumer is gone.
    pub(crate) fn send(&self, delivery: Delivery) -> bool {
        self.tx.send(Queued { source: self.source, item: Inbound::Delivery(delivery) }).is_ok()
    }

    /// Queues the messages of one batch entry as one item.
    pub(crate) fn send_batch(&self, messages: Vec<Message>) -> bool {
        self.tx.send(Queued { source: self.source, item: Inbound::Batch(messages.into_iter()) }).is_ok()
    }
}

impl Inbox {
    /// No `End` when dropped (the slot of a subscribe that failed).
    pub(crate) fn disarm(&mut self) {
        self.end_on_drop = false;
    }
}

impl Clone for Inbox {
    fn clone(&self) -> Self {
        Self { tx: self.tx.clone(), source: self.source, end_on_drop: false }
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        if self.end_on_drop {
            let _ = self.tx.send(Queued { source: self.source, item: Inbound::End });
        }
    }
}

/// A consumer's own queue: the channel, and what is left of the batch entry
/// taken off it last (handed out before anything else).
pub(crate) struct OwnQueue {
    rx: mpsc::UnboundedReceiver<Queued>,
    rest: std::vec::IntoIter<Message>,
}

impl OwnQueue {
    /// The next delivery of `item`; keeps the rest of a batch.
    fn take(&mut self, item: Inbound) -> Option<Delivery> {
        match item {
            Inbound::Delivery(d) => Some(d),
            Inbound::Batch(mut batch) => {
                let first = batch.next()?;
                self.rest = batch;
                Some(Ok(first))
            }
            // The queue closes once the retry topic's slot is gone too.
            Inbound::End | Inbound::Joined => None,
        }
    }

    /// Drops what is queued; calls `dropped` for each delivery.
    fn drain(&mut self, mut dropped: impl FnMut(&Delivery)) {
        for m in std::mem::take(&mut self.rest) {
            dropped(&Ok(m));
        }
        while let Ok(queued) = self.rx.try_recv() {
            match queued.item {
                Inbound::Delivery(d) => dropped(&d),
                Inbound::Batch(batch) => batch.for_each(|m| dropped(&Ok(m))),
                Inbound::End | Inbound::Joined => {}
            }
        }
    }
}

/// Where a consumer's messages wait for the application.
enum Queue {
    /// A queue of its own, read by `receive`.
    Own(tokio::sync::Mutex<OwnQueue>),
    /// A member of a multi-topic consumer: its messages wait in the shared
    /// queue, and the multi-topic consumer hands each to `accept`.
    Shared,
}

/// The retry topic's broker-side consumer, and the ledgers its messages
/// came from: ledger ids are unique across a broker's topics, so an id's
/// ledger says which consumer acks (and redelivery requests) belong to.
struct RetryRoute {
    consumer_id: u64,
    topic: Arc<str>,
    ledgers: std::sync::Mutex<std::collections::HashSet<u64>>,
}

impl RetryRoute {
    fn owns(&self, id: &MessageId) -> bool {
        self.ledgers.lock().unwrap_or_else(|p| p.into_inner()).contains(&id.ledger)
    }
}

/// The broker-side consumer an id belongs to.
fn route(main: u64, retry: &Option<Arc<RetryRoute>>, id: &MessageId) -> u64 {
    match retry {
        Some(r) if r.owns(id) => r.consumer_id,
        _ => main,
    }
}

/// `ids` grouped by the consumer they belong to, in order.
fn group(main: u64, retry: &Option<Arc<RetryRoute>>, ids: &[MessageId]) -> Vec<(u64, Vec<MessageId>)> {
    let mut out: Vec<(u64, Vec<MessageId>)> = Vec::new();
    for id in ids {
        let c = route(main, retry, id);
        match out.iter_mut().find(|(k, _)| *k == c) {
            Some((_, v)) => v.push(*id),
            None => out.push((c, vec![*id])),
        }
    }
    out
}

/// A consumer of one subscription on one topic. `Send + Sync`; `receive`
/// calls from several tasks are served one at a time.
pub struct Consumer {
    conn: Arc<Connection>,
    consumer_id: u64,
    topic: Arc<str>,
    subscription: String,
    queue: Queue,
    /// Messages handed to the application since the last `Flow`.
    unflowed: AtomicU32,
    /// The same for the retry topic's consumer.
    unflowed_retry: AtomicU32,
    flow_threshold: u32,
    receiver_queue_size: u32,
    closed: Arc<AtomicBool>,
    active: Arc<AtomicBool>,
    tracker: Arc<Tracker>,
    /// Wakes the timer task: something falls due before it would wake by
    /// itself, or the consumer closed.
    timers: Arc<Notify>,
    nack_backoff: NackBackoff,
    dead_letter: Option<Arc<DeadLetter>>,
    retry_producer: tokio::sync::Mutex<Option<Producer>>,
    retry: Option<Arc<RetryRoute>>,
    acks: Arc<AckGroup>,
    /// Batches handed out and not wholly acknowledged: (ledger, entry,
    /// partition) → acked flag per batch index. The broker acknowledges
    /// entries, so an entry is acked only once all its messages are.
    batches: std::sync::Mutex<HashMap<(u64, u64, i32), BatchAcks>>,
    chunks: std::sync::Mutex<ChunkState>,
    /// Whether `chunks.handed_out` has any (set under its lock): an ack
    /// looks there only then, without taking the lock per ack otherwise.
    chunks_out: AtomicBool,
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
    reassembly: crate::chunking::Reassembly,
    handed_out: HashMap<MessageId, Vec<MessageId>>,
}

/// The `Ack` commands that carry `batch`, each to the consumer its ids
/// belong to.
fn ack_commands(main: u64, retry: &Option<Arc<RetryRoute>>, batch: AckBatch) -> Vec<Command> {
    let mut out = Vec::new();
    let sized: Vec<(MessageId, u32)> = batch.individual.into_iter().zip(batch.batch_sizes).collect();
    for (consumer_id, acks) in group_sized(main, retry, &sized) {
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
fn individual_ack(consumer_id: u64, acks: &[(MessageId, u32)], request_id: u64) -> Command {
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

/// `group` for acks carrying their batch sizes.
fn group_sized(
    main: u64,
    retry: &Option<Arc<RetryRoute>>,
    acks: &[(MessageId, u32)],
) -> Vec<(u64, Vec<(MessageId, u32)>)> {
    let mut out: Vec<(u64, Vec<(MessageId, u32)>)> = Vec::new();
    for a in acks {
        let c = route(main, retry, &a.0);
        match out.iter_mut().find(|(k, _)| *k == c) {
            Some((_, v)) => v.push(*a),
            None => out.push((c, vec![*a])),
        }
    }
    out
}

/// The batch size to send with the ack of a message sent to the dead-letter
/// topic: a message of a batch is acknowledged alone (its siblings may not
/// have reached their limit).
fn dead_letter_batch_size(msg: &Message) -> Vec<u32> {
    let size = msg.entry.num_messages();
    if msg.id.batch_index >= 0 && size > 1 {
        vec![size]
    } else {
        Vec::new()
    }
}

struct DeadLetter {
    max_redeliveries: u32,
    topic: String,
    producer: tokio::sync::Mutex<Option<Producer>>,
}

/// The clock the consumer's timers read, wherever they are updated: tokio's
/// (std's `Instant::now()`, except on a test's paused clock), so that the
/// timer task, which sleeps on tokio's, and the updates agree.
fn clock() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Serves the consumer's timers (see `run_timers`) on the current runtime.
fn spawn_timer_task(
    conn: Arc<Connection>,
    consumer_id: u64,
    retry: Option<Arc<RetryRoute>>,
    tracker: Arc<Tracker>,
    acks: Arc<AckGroup>,
    closed: Arc<AtomicBool>,
    wake: Arc<Notify>,
) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
    let shared = conn.shared.clone();
    let shut_down = crate::connection::shut_down(&shared);
    let open = move || !closed.load(Ordering::Acquire) && crate::connection::is_open(&shared);
    let send = move |command: Command| {
        let conn = conn.clone();
        async move { conn.send_command(&command).await }
    };
    handle.spawn(run_timers(consumer_id, retry, tracker, acks, wake, shut_down, open, send));
}

/// The consumer's timer task: sends grouped acks that are due and asks the
/// broker back for messages whose nack delay or ack timeout passed. It
/// sleeps until the earliest deadline (`Tracker::arm`, `AckGroup::arm`):
/// without grouped acks, nacks or ids on the ack-timeout wheel it does not
/// wake at all, until an update that falls due sooner wakes it through
/// `wake` (a `notify_one` before it waits is kept, so none is lost). Ends
/// when `open` says no (checked at each wake-up: the consumer wakes it when
/// it closes, the connection's reader when the broker closes it), when
/// `shut_down` completes (the connection went down) or a send fails.
#[allow(clippy::too_many_arguments)]
async fn run_timers<S, F>(
    consumer_id: u64,
    retry: Option<Arc<RetryRoute>>,
    tracker: Arc<Tracker>,
    acks: Arc<AckGroup>,
    wake: Arc<Notify>,
    shut_down: impl std::future::Future<Output = ()>,
    open: impl Fn() -> bool,
    send: S,
) where
    S: Fn(Command) -> F,
    F: std::future::Future<Output = Result<()>>,
{
    let mut shut_down = std::pin::pin!(shut_down);
    loop {
        if !open() {
            return;
        }
        let now = clock();
        let due = tracker.tick(now);
        // Grouped acks go before a redelivery request, due or not: the
        // broker sends a batch back with the bits of the acks it has,
        // and the acks still grouped here would come back as messages.
        let batch = if due.is_empty() { acks.take_due(now) } else { Some(acks.take_all()) };
        if let Some(batch) = batch.filter(|b| !b.is_empty()) {
            for command in ack_commands(consumer_id, &retry, batch) {
                if let Err(e) = send(command).await {
                    tracing::debug!(error = %e, "grouped acks not sent");
                    return;
                }
            }
        }
        if !due.is_empty() {
            // Several frames for many ids keep each frame small.
            for (consumer_id, ids) in group(consumer_id, &retry, &due) {
                for ids in ids.chunks(1000) {
                    let command = Command::RedeliverUnacknowledged { consumer_id, message_ids: ids.to_vec() };
                    if let Err(e) = send(command).await {
                        tracing::debug!(error = %e, "redelivery request not sent");
                        return;
                    }
                }
            }
        }
        // Whatever changes after `arm` and falls due sooner notifies.
        let next = match (tracker.arm(), acks.arm()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at.into()) => {}
                    () = wake.notified() => {}
                    () = &mut shut_down => return,
                }
            }
            None => {
                tokio::select! {
                    () = wake.notified() => {}
                    () = &mut shut_down => return,
                }
            }
        }
    }
}

/// Publishes `msg` to `topic` with its origin as properties, on a producer
/// created on first use.
async fn republish(
    conn: &Arc<Connection>,
    slot: &tokio::sync::Mutex<Option<Producer>>,
    topic: &str,
    msg: &Message,
    extra: Vec<(String, String)>,
    deliver_at_ms: Option<u64>,
) -> Result<MessageId> {
    let mut slot = slot.lock().await;
    if slot.as_ref().is_none_or(|p| p.is_closed()) {
        let builder = ProducerBuilder::new(conn.clone(), topic.to_string());
        *slot = Some(builder.create().await?);
    }
    let Some(producer) = slot.as_ref() else {
        return Err(ClientError::InvalidOption { option: "producer", reason: "not created" });
    };
    let mut out = OutgoingMessage::new(msg.payload.clone());
    out.key = msg.key().map(str::to_string);
    out.tag = msg.tag().map(str::to_string);
    out.event_time_ms = msg.event_time_ms();
    out.deliver_at_ms = deliver_at_ms;
    out.properties = msg
        .properties()
        .iter()
        .filter(|(k, _)| k != PROPERTY_REAL_TOPIC && k != PROPERTY_ORIGIN_MESSAGE_ID && k != PROPERTY_RECONSUME_TIMES)
        .cloned()
        .collect();
    let real_topic = msg.property(PROPERTY_REAL_TOPIC).unwrap_or(&msg.topic).to_string();
    let origin = msg.property(PROPERTY_ORIGIN_MESSAGE_ID).map(str::to_string).unwrap_or_else(|| msg.id.to_string());
    out.properties.push((PROPERTY_REAL_TOPIC.into(), real_topic));
    out.properties.push((PROPERTY_ORIGIN_MESSAGE_ID.into(), origin));
    out.properties.extend(extra);
    producer.send(out).await
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
        match self.conn.shared.closed_reason() {
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
        if q.rest.len() != 0 {
            // What a `recv` per message did: yield to the runtime now and
            // then, so a long batch does not starve the other tasks.
            tokio::task::coop::consume_budget().await;
        }
        loop {
            let delivery = match q.rest.next() {
                Some(m) => Ok(m),
                None => match q.rx.recv().await {
                    // Nothing below awaits, so a message taken off the queue is
                    // always returned, kept in `rest` or handed to the
                    // dead-letter task (cancel safety).
                    Some(queued) => match q.take(queued.item) {
                        Some(d) => d,
                        None => continue,
                    },
                    None => return Err(self.closed_error()),
                },
            };
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
            Ok(m) if self.dead_letter.as_ref().is_some_and(|dl| m.redelivery_count > dl.max_redeliveries) => {
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
        self.track_batch(&delivery);
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

    /// Tracks a delivered message, or sends it to the dead-letter topic
    /// (returning `None`) when it came too often.
    fn screen(&self, delivery: Delivery) -> Option<Delivery> {
        let msg = match delivery {
            Ok(msg) => msg,
            Err(e) => return Some(Err(e)),
        };
        if let Some(dl) = &self.dead_letter {
            if msg.redelivery_count > dl.max_redeliveries {
                let dl = dl.clone();
                let conn = self.conn.clone();
                let consumer_id = route(self.consumer_id, &self.retry, &msg.id);
                // A task, so `receive` stays cancel-safe; the message is
                // acknowledged only once the dead-letter topic has it.
                if let Ok(handle) = tokio::runtime::Handle::try_current() {
                    handle.spawn(async move {
                        match republish(&conn, &dl.producer, &dl.topic, &msg, Vec::new(), None).await {
                            Ok(_) => {
                                let ack = Command::Ack {
                                    consumer_id,
                                    ack_type: AckType::Individual,
                                    message_ids: vec![msg.id],
                                    request_id: 0,
                                    batch_sizes: dead_letter_batch_size(&msg),
                                };
                                let _ = conn.send_command(&ack).await;
                            }
                            Err(e) => tracing::warn!(error = %e, id = %msg.id, "dead-letter publish failed"),
                        }
                    });
                    return None;
                }
            }
        }
        if self.tracker.received(msg.id, clock) {
            self.timers.notify_one();
        }
        Some(Ok(msg))
    }

    /// The next message if one is already here, without waiting. `Ok(None)`
    /// also when another task is inside `receive`.
    pub fn try_receive(&self) -> Result<Option<Message>> {
        let Ok(mut q) = self.own_queue()?.try_lock() else { return Ok(None) };
        loop {
            let delivery = match q.rest.next() {
                Some(m) => Ok(m),
                None => match q.rx.try_recv() {
                    Ok(queued) => match q.take(queued.item) {
                        Some(d) => d,
                        None => continue,
                    },
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
        own.lock().await.drain(|delivery| self.after_receive(delivery));
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
        match answer {
            Command::Success { .. } => {}
            other => return Err(ClientError::UnexpectedResponse { request: "Seek", got: format!("{other:?}") }),
        }
        // The broker set our permits to 0: drop what is queued and grant
        // the whole queue again.
        q.drain(|_| {});
        self.unflowed.store(0, Ordering::Relaxed);
        self.tracker.clear();
        self.conn.send_command(&Command::Flow { consumer_id, permits: self.receiver_queue_size }).await
    }

    /// Consume `msg` again after `delay`: it is published to
    /// `<topic>-<subscription>-RETRY` with a delivery time, then acknowledged
    /// here. With `retry_enabled(true)` this consumer also consumes that
    /// topic, so the message comes back here; its `RECONSUMETIMES` property
    /// counts the rounds.
    pub async fn reconsume_later(&self, msg: &Message, delay: Duration) -> Result<MessageId> {
        let base = msg.property(PROPERTY_REAL_TOPIC).unwrap_or(&self.topic).to_string();
        let retry_topic = format!("{base}-{}-RETRY", self.subscription);
        let times = msg.property(PROPERTY_RECONSUME_TIMES).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0) + 1;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let at = u64::try_from(now.saturating_add(delay).as_millis()).unwrap_or(u64::MAX);
        let extra = vec![(PROPERTY_RECONSUME_TIMES.to_string(), times.to_string())];
        let id = republish(&self.conn, &self.retry_producer, &retry_topic, msg, extra, Some(at)).await?;
        self.ack(&msg.id).await?;
        Ok(id)
    }

    /// Grant more permits once half the queue has been handed out, so the
    /// broker always has room to keep sending without a Flow per message.
    /// A failure to send the Flow is not the message's failure: it only
    /// happens when the connection is gone, and then permits are moot.
    fn after_receive(&self, delivery: &Delivery) {
        let from_retry = match (&self.retry, delivery) {
            (Some(r), Ok(m)) if m.topic == r.topic => {
                r.ledgers.lock().unwrap_or_else(|p| p.into_inner()).insert(m.id.ledger);
                true
            }
            _ => false,
        };
        let (unflowed, consumer_id) = match &self.retry {
            Some(r) if from_retry => (&self.unflowed_retry, r.consumer_id),
            _ => (&self.unflowed, self.consumer_id),
        };
        if unflowed.fetch_add(1, Ordering::Relaxed) + 1 >= self.flow_threshold {
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
            self.broker_acks_each(ack_type, std::slice::from_ref(id), |id, size| {
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
        for (id, size) in self.broker_acks(ack_type, std::slice::from_ref(id)) {
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
        let result = {
            let mut st = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
            stray.extend(st.reassembly.expire());
            match st.reassembly.feed(msg, &mut stray) {
                Ok(crate::chunking::Fed::Complete(m, ids)) => {
                    st.handed_out.insert(m.id, ids);
                    self.chunks_out.store(true, Ordering::Release);
                    Some(Ok(*m))
                }
                Ok(crate::chunking::Fed::Pending) => None,
                Err(e) => Some(Err(e)),
            }
        };
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

    fn lock_batches(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u64, i32), BatchAcks>> {
        self.batches.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn track_batch(&self, delivery: &Delivery) {
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
    fn broker_acks(&self, ack_type: AckType, ids: &[MessageId]) -> Vec<(MessageId, u32)> {
        let mut out = Vec::with_capacity(ids.len());
        self.broker_acks_each(ack_type, ids, |id, size| out.push((id, size)));
        out
    }

    /// `broker_acks`, each handed to `emit` (no list per ack).
    fn broker_acks_each(&self, ack_type: AckType, ids: &[MessageId], mut emit: impl FnMut(MessageId, u32)) {
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
        let broker_acks = self.broker_acks(ack_type, ids);
        for (consumer_id, acks) in group_sized(self.consumer_id, &self.retry, &broker_acks) {
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
            match answer {
                Command::Success { .. } => {}
                other => return Err(ClientError::UnexpectedResponse { request: "Ack", got: format!("{other:?}") }),
            }
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
        match answer? {
            Command::Success { .. } => Ok(()),
            other => Err(ClientError::UnexpectedResponse { request: "CloseConsumer", got: format!("{other:?}") }),
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tracker::ACK_TIMEOUT_BUCKETS;
    use std::sync::atomic::AtomicUsize;

    fn id(e: u64) -> MessageId {
        MessageId::new(1, e, 0, -1)
    }

    fn now() -> Instant {
        tokio::time::Instant::now().into_std()
    }

    /// Goal: a consumer's timer task does not wake while nothing is
    /// pending (it woke every 10 ms: 1,000 times in 10 s), yet grouped acks
    /// go out at the group time, a nack comes back at its delay (within the
    /// 10 ms grid), grouped acks go before a redelivery request, an unacked
    /// message comes back after the ack timeout, and the task ends when the
    /// consumer closes. Method: `run_timers` on tokio's paused clock, its
    /// commands into a channel with their send times, its wake-ups counted
    /// by its `open` check.
    #[tokio::test(start_paused = true)]
    async fn an_idle_consumer_timer_task_sleeps_until_something_falls_due() {
        let ms = Duration::from_millis;
        let ack_timeout = Duration::from_secs(1);
        let tracker = Arc::new(Tracker::new_at(Some(ack_timeout), now()));
        let acks = Arc::new(AckGroup::new(ms(100), 1000));
        let wake = Arc::new(Notify::new());
        let wakes = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicBool::new(true));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run_timers(
            7,
            None,
            tracker.clone(),
            acks.clone(),
            wake.clone(),
            std::future::pending(),
            {
                let (wakes, open) = (wakes.clone(), open.clone());
                move || {
                    wakes.fetch_add(1, Ordering::Relaxed);
                    open.load(Ordering::Acquire)
                }
            },
            move |command| {
                let sent = tx
                    .send((tokio::time::Instant::now(), command))
                    .map_err(|_| ClientError::Disconnected { reason: "test over".into() });
                async move { sent }
            },
        ));
        let idle = |what: &'static str| {
            let wakes = wakes.clone();
            async move {
                let before = wakes.load(Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(10)).await;
                assert_eq!(wakes.load(Ordering::Relaxed) - before, 0, "woke while idle ({what})");
            }
        };
        tokio::task::yield_now().await;
        assert_eq!(wakes.load(Ordering::Relaxed), 1, "the task looked once");
        // The paused clock jumps to the timeout if the task never sends.
        async fn next(
            rx: &mut mpsc::UnboundedReceiver<(tokio::time::Instant, Command)>,
        ) -> (tokio::time::Instant, Command) {
            let sent = tokio::time::timeout(Duration::from_secs(60), rx.recv()).await;
            sent.expect("the task sent nothing: a lost wake-up").expect("the task ended")
        }
        idle("from the start").await;
        assert!(rx.try_recv().is_err());

        // A grouped ack goes out at the group time.
        let t1 = tokio::time::Instant::now();
        let added = acks.add(id(1), 0, false, now);
        assert!(added.wake);
        wake.notify_one();
        let (at, ack) = next(&mut rx).await;
        assert_eq!(at - t1, ms(100));
        assert!(matches!(&ack, Command::Ack { message_ids, .. } if *message_ids == [id(1)]), "{ack:?}");
        idle("after the ack").await;

        // A nack comes back at its delay, after the acks grouped before it.
        let t2 = tokio::time::Instant::now();
        if tracker.nacked(id(2), Duration::from_secs(1), now()) {
            wake.notify_one();
        }
        tokio::time::sleep(ms(950)).await;
        assert!(acks.add(id(3), 0, false, now).wake.then(|| wake.notify_one()).is_some());
        let (at, ack) = next(&mut rx).await;
        assert!(matches!(&ack, Command::Ack { message_ids, .. } if *message_ids == [id(3)]), "{ack:?}");
        assert_eq!(at - t2, Duration::from_secs(1), "sent with the nack's request, before its group time");
        let (at, redeliver) = next(&mut rx).await;
        assert_eq!(at - t2, Duration::from_secs(1));
        assert!(
            matches!(&redeliver, Command::RedeliverUnacknowledged { consumer_id: 7, message_ids } if *message_ids == [id(2)]),
            "{redeliver:?}"
        );
        // Off the grid: at most one NACK_TICK late, never early.
        tokio::time::sleep(ms(3)).await;
        let t3 = tokio::time::Instant::now();
        if tracker.nacked(id(4), ms(20), now()) {
            wake.notify_one();
        }
        let (at, _) = next(&mut rx).await;
        assert!(at - t3 >= ms(20) && at - t3 <= ms(30), "{:?}", at - t3);
        idle("after the nacks").await;

        // An unacked message comes back after the ack timeout; one acked
        // does not, and the wheel stops once empty.
        let t4 = tokio::time::Instant::now();
        assert!(tracker.received(id(5), now), "the first id into the wheel wakes the task");
        wake.notify_one();
        assert!(!tracker.received(id(6), now));
        tracker.acked(&id(6));
        let (at, redeliver) = next(&mut rx).await;
        assert!(
            matches!(&redeliver, Command::RedeliverUnacknowledged { message_ids, .. } if *message_ids == [id(5)]),
            "{redeliver:?}"
        );
        let after = at - t4;
        assert!(after >= ack_timeout && after <= ack_timeout + ack_timeout / ACK_TIMEOUT_BUCKETS, "{after:?}");
        idle("after the ack timeout").await;

        // Closing wakes it to end.
        open.store(false, Ordering::Release);
        wake.notify_one();
        tokio::time::timeout(ms(1), task).await.expect("the task ended").unwrap();
    }
}
