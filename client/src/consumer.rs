//! Consumers: receive messages of one subscription and acknowledge them.

use crate::connection::{Connection, ConsumerSlot, Delivery};
use crate::error::{ClientError, Result};
use crate::message::Message;
use crate::names::normalize_topic;
use magnetar_wire::{AckType, Command, InitialPosition, MessageId, SubscriptionType};
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use tokio::sync::mpsc;
use tokio::sync::mpsc::error::TryRecvError;

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
    pub(crate) durable: bool,
}

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

    /// `false`: a non-durable subscription (a reader's): its position is
    /// kept in memory only, and it disappears with its last consumer.
    pub fn durable(mut self, durable: bool) -> Self {
        self.durable = durable;
        self
    }

    /// Consumer name; empty (the default) lets the broker choose.
    pub fn consumer_name(mut self, name: impl Into<String>) -> Self {
        self.consumer_name = name.into();
        self
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
            durable: self.durable,
        }
    }

    /// Subscribe to the topic by its own name: every partition of a
    /// partitioned topic (one consumer each), or the topic itself.
    pub async fn subscribe_partitioned(self) -> Result<crate::MultiTopicConsumer> {
        let topic = normalize_topic(&self.topic)?;
        let partitions = crate::Admin { conn: self.conn.clone() }.partitions(&topic).await?;
        let multi = crate::MultiTopicConsumer::new(self.subscription.clone(), self.receiver_queue_size as usize);
        if partitions == 0 {
            multi.add_topic(self.with_topic(topic)).await?;
        } else {
            for i in 0..partitions {
                multi.add_topic(self.with_topic(format!("{topic}-partition-{i}"))).await?;
            }
        }
        Ok(multi)
    }

    /// Subscribe to each topic of `topics` (each one by its own name, so a
    /// partitioned one brings all its partitions) through one consumer.
    pub async fn subscribe_topics(self, topics: &[String]) -> Result<crate::MultiTopicConsumer> {
        let multi = crate::MultiTopicConsumer::new(self.subscription.clone(), self.receiver_queue_size as usize);
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
        let multi =
            Arc::new(crate::MultiTopicConsumer::new(self.subscription.clone(), self.receiver_queue_size as usize));
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

    /// Subscribe, then grant the broker the initial flow permits.
    pub async fn subscribe(self) -> Result<Consumer> {
        if self.receiver_queue_size == 0 || self.receiver_queue_size > RECEIVER_QUEUE_SIZE_MAX {
            return Err(ClientError::InvalidOption { option: "receiver_queue_size", reason: "must be in 1..=1048576" });
        }
        if self.subscription.is_empty() {
            return Err(ClientError::InvalidOption { option: "subscription", reason: "must not be empty" });
        }
        let topic = normalize_topic(&self.topic)?;
        let consumer_id = self.conn.next_handle_id();
        let closed = Arc::new(AtomicBool::new(false));
        let queue = self.receiver_queue_size;
        let (deliver, rx) = mpsc::channel(queue as usize);
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
            },
        )?;
        let answer = self
            .conn
            .request("subscribe", |request_id| Command::Subscribe {
                request_id,
                consumer_id,
                topic: topic.clone(),
                subscription: self.subscription.clone(),
                sub_type: self.sub_type,
                consumer_name: self.consumer_name.clone(),
                initial_position: self.initial_position,
                durable: self.durable,
                priority_level: 0,
            })
            .await;
        match answer {
            Ok(Command::Success { .. }) => {}
            Ok(other) => {
                self.conn.remove_consumer(consumer_id);
                return Err(ClientError::UnexpectedResponse { request: "Subscribe", got: format!("{other:?}") });
            }
            Err(e) => {
                self.conn.remove_consumer(consumer_id);
                return Err(e);
            }
        }
        let consumer = Consumer {
            conn: self.conn,
            consumer_id,
            topic,
            subscription: self.subscription,
            rx: tokio::sync::Mutex::new(Receiving { rx, unflowed: 0 }),
            flow_threshold: (queue / 2).max(1),
            closed,
            batches: std::sync::Mutex::new(HashMap::new()),
            chunks: std::sync::Mutex::new(ChunkState::default()),
        };
        consumer.conn.send_command(&Command::Flow { consumer_id, permits: queue }).await?;
        Ok(consumer)
    }
}

struct Receiving {
    rx: mpsc::Receiver<Delivery>,
    /// Messages handed to the application since the last `Flow`.
    unflowed: u32,
}

/// A consumer of one subscription on one topic. `Send + Sync`; `receive`
/// calls from several tasks are served one at a time.
pub struct Consumer {
    conn: Arc<Connection>,
    consumer_id: u64,
    topic: String,
    subscription: String,
    rx: tokio::sync::Mutex<Receiving>,
    flow_threshold: u32,
    closed: Arc<AtomicBool>,
    /// Batches handed out and not wholly acknowledged: (ledger, entry,
    /// partition) → acked flag per batch index. The broker acknowledges
    /// entries, so an entry is acked only once all its messages are.
    batches: std::sync::Mutex<HashMap<(u64, u64, i32), Vec<bool>>>,
    chunks: std::sync::Mutex<ChunkState>,
}

/// Chunked messages being reassembled, and the chunk ids of whole ones
/// handed out (acknowledging the message acknowledges them all).
#[derive(Default)]
struct ChunkState {
    reassembly: crate::chunking::Reassembly,
    handed_out: HashMap<MessageId, Vec<MessageId>>,
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

    pub fn subscription(&self) -> &str {
        &self.subscription
    }

    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    fn closed_error(&self) -> ClientError {
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
        let mut receiving = self.rx.lock().await;
        loop {
            match receiving.rx.recv().await {
                // Nothing below awaits, so a message taken off the queue is
                // always returned or kept (cancel safety).
                Some(delivery) => {
                    self.after_receive(&mut receiving);
                    let Some(delivery) = self.assemble(delivery) else { continue };
                    self.track_batch(&delivery);
                    return delivery;
                }
                None => return Err(self.closed_error()),
            }
        }
    }

    /// The next message if one is already here, without waiting. `Ok(None)`
    /// also when another task is inside `receive`.
    pub fn try_receive(&self) -> Result<Option<Message>> {
        let Ok(mut receiving) = self.rx.try_lock() else { return Ok(None) };
        loop {
            match receiving.rx.try_recv() {
                Ok(delivery) => {
                    self.after_receive(&mut receiving);
                    let Some(delivery) = self.assemble(delivery) else { continue };
                    self.track_batch(&delivery);
                    return delivery.map(Some);
                }
                Err(TryRecvError::Empty) => return Ok(None),
                Err(TryRecvError::Disconnected) => return Err(self.closed_error()),
            }
        }
    }

    /// Grant more permits once half the queue has been handed out, so the
    /// broker always has room to keep sending without a Flow per message.
    /// A failure to send the Flow is not the message's failure: it only
    /// happens when the connection is gone, and then permits are moot.
    fn after_receive(&self, receiving: &mut Receiving) {
        receiving.unflowed += 1;
        if receiving.unflowed >= self.flow_threshold {
            let permits = std::mem::take(&mut receiving.unflowed);
            if let Err(e) = self.conn.send_command_nowait(&Command::Flow { consumer_id: self.consumer_id, permits }) {
                tracing::debug!(error = %e, "flow not sent");
            }
        }
    }

    /// Passes non-chunks through; collects chunks, returning the whole
    /// message with its last chunk. Chunks dropped (expired, out of order)
    /// are acknowledged so the broker does not keep them.
    fn assemble(&self, delivery: Delivery) -> Option<Delivery> {
        let msg = match delivery {
            Ok(m) if m.metadata.chunk.is_some() => m,
            other => return Some(other),
        };
        let mut stray = Vec::new();
        let result = {
            let mut st = self.chunks.lock().unwrap_or_else(|p| p.into_inner());
            stray.extend(st.reassembly.expire());
            match st.reassembly.feed(msg, &mut stray) {
                Ok(crate::chunking::Fed::Complete(m, ids)) => {
                    st.handed_out.insert(m.id, ids);
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
            };
            if let Err(e) = self.conn.send_command_nowait(&ack) {
                tracing::debug!(error = %e, "ack of dropped chunks not sent");
            }
        }
        result
    }

    fn lock_batches(&self) -> std::sync::MutexGuard<'_, HashMap<(u64, u64, i32), Vec<bool>>> {
        self.batches.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn track_batch(&self, delivery: &Delivery) {
        let Ok(m) = delivery else { return };
        if m.id.batch_index < 0 || m.metadata.num_messages <= 1 {
            return;
        }
        let n = usize::try_from(m.metadata.num_messages).unwrap_or(0);
        self.lock_batches().entry((m.id.ledger, m.id.entry, m.id.partition)).or_insert_with(|| vec![false; n]);
    }

    /// The ids to send to the broker for acknowledging `ids`: a message of a
    /// batch is acknowledged on the broker only with its last sibling; a
    /// cumulative ack inside a batch acknowledges up to the entry before.
    fn broker_acks(&self, ack_type: AckType, ids: &[MessageId]) -> Vec<MessageId> {
        let mut batches = self.lock_batches();
        let mut out = Vec::with_capacity(ids.len());
        for id in ids {
            // A chunked message: all its chunks (individually; a cumulative
            // ack on the last chunk covers them anyway).
            let chunk_ids = self.chunks.lock().unwrap_or_else(|p| p.into_inner()).handed_out.remove(id);
            if let Some(chunk_ids) = chunk_ids {
                if ack_type == AckType::Individual {
                    out.extend(chunk_ids);
                    continue;
                }
            }
            let key = (id.ledger, id.entry, id.partition);
            if ack_type == AckType::Cumulative {
                batches.retain(|(l, e, p), _| !(*p == id.partition && (*l, *e) < (id.ledger, id.entry)));
            }
            let Some(flags) = batches.get_mut(&key).filter(|_| id.batch_index >= 0) else {
                out.push(*id);
                continue;
            };
            let index = usize::try_from(id.batch_index).unwrap_or(usize::MAX);
            match ack_type {
                AckType::Individual => {
                    if let Some(f) = flags.get_mut(index) {
                        *f = true;
                    }
                }
                AckType::Cumulative => {
                    for f in flags.iter_mut().take(index.saturating_add(1)) {
                        *f = true;
                    }
                }
            }
            if flags.iter().all(|f| *f) {
                batches.remove(&key);
                out.push(*id);
            } else if ack_type == AckType::Cumulative && id.entry > 0 {
                out.push(MessageId::new(id.ledger, id.entry - 1, id.partition, -1));
            }
        }
        out
    }

    async fn send_ack(&self, ack_type: AckType, id: &MessageId) -> Result<()> {
        if self.is_closed() {
            return Err(self.closed_error());
        }
        let message_ids = self.broker_acks(ack_type, std::slice::from_ref(id));
        if message_ids.is_empty() {
            return Ok(());
        }
        let command = Command::Ack { consumer_id: self.consumer_id, ack_type, message_ids, request_id: 0 };
        self.conn.send_command(&command).await
    }

    /// Acknowledge one message. Returns once the ack is queued on the
    /// connection (the broker does not answer); acks and a later `close()`
    /// reach the broker in order.
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
        let consumer_id = self.consumer_id;
        let message_ids = self.broker_acks(ack_type, ids);
        if message_ids.is_empty() {
            return Ok(());
        }
        let answer = self
            .conn
            .request("ack", |request_id| Command::Ack {
                consumer_id,
                ack_type,
                message_ids: message_ids.clone(),
                request_id,
            })
            .await?;
        match answer {
            Command::Success { .. } => Ok(()),
            other => Err(ClientError::UnexpectedResponse { request: "Ack", got: format!("{other:?}") }),
        }
    }

    /// Close the consumer on the broker. Unacknowledged messages go back to
    /// the subscription; messages still in the local queue are dropped.
    pub async fn close(&self) -> Result<()> {
        if self.closed.swap(true, Ordering::AcqRel) {
            return Ok(());
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
            self.conn.try_send_command(&Command::CloseConsumer { request_id: 0, consumer_id: self.consumer_id });
            self.conn.remove_consumer(self.consumer_id);
        }
    }
}
