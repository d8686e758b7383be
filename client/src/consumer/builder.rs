//! Building a consumer and subscribing it: the options, the Subscribe
//! exchange (written once, for the consumer and for its retry topic's
//! consumer), the consumer's connection slot and queue, and the initial
//! flow permits. Also the multi-topic forms (partitions, lists, patterns).

use super::ack_group::{AckGroup, ACK_GROUP_MAX_DEFAULT, ACK_GROUP_TIME_DEFAULT};
use super::acks::{AckMap, RetryRoute};
use super::dead_letter::{DeadLetterPolicy, Republish, RetryPolicy};
use super::inbox::{OwnQueue, Queue};
use super::timers::spawn_timer_task;
use super::tracker::{NackBackoff, Tracker};
use super::{Consumer, Permits, DEFAULT_RECEIVER_QUEUE_SIZE, RECEIVER_QUEUE_SIZE_MAX};
use crate::conn::demux::{Inbox, Queued};
use crate::conn::pool::Origin;
use crate::conn::{expect_success, Connection, ConsumerSlot};
use crate::error::{ClientError, Result};
use crate::names::normalize_topic;
use magnetar_wire::{
    AllocationStrategy, Command, ConsumptionModel, InitialPosition, SubscriptionMode, SubscriptionType,
};
use std::sync::atomic::AtomicBool;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, Notify};

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
#[derive(Clone)]
pub struct ConsumerBuilder {
    pub(crate) origin: Origin,
    pub(crate) topic: String,
    pub(crate) subscription: String,
    pub(crate) sub_type: SubscriptionType,
    pub(crate) initial_position: InitialPosition,
    pub(crate) receiver_queue_size: u32,
    pub(crate) consumer_name: String,
    pub(crate) priority_level: i32,
    pub(crate) filter_tag: String,
    pub(crate) key_shared_ranges: Vec<(u16, u16)>,
    pub(crate) model: ConsumptionModel,
    pub(crate) nack_backoff: NackBackoff,
    pub(crate) ack_timeout: Option<Duration>,
    pub(crate) dead_letter: Option<DeadLetterPolicy>,
    pub(crate) retry_enabled: bool,
    pub(crate) retry_policy: Option<RetryPolicy>,
    pub(crate) ack_group_time: Duration,
    pub(crate) ack_group_max: usize,
    pub(crate) durable: bool,
    /// How often `subscribe_partitioned` / `subscribe_topics` look up the
    /// partition counts again, to subscribe partitions added later.
    pub(crate) partitions_refresh: Duration,
    pub(crate) pull: bool,
    /// A multi-topic consumer's shared queue and this member's index in
    /// it; `None`: the consumer gets a queue of its own.
    pub(crate) inbox: Option<(mpsc::UnboundedSender<Queued>, u32)>,
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
    /// inclusive within `0..=65535` (the hash is Pulsar's Murmur3 of the
    /// ordering key, else the key, modulo 65536). Empty (the default) = auto split.
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

    /// Failover on a partitioned topic: how partitions are spread over the
    /// subscription's consumers (default round robin: partition `p` to the
    /// `p % n`-th consumer by name). The first consumer of an idle
    /// subscription sets it, and it is kept with the subscription; a
    /// consumer asking for another is refused (`ConsumerBusy`), and a
    /// strategy other than round robin on another subscription type
    /// (`NotAllowed`). When a consumer joins or leaves, the partitions that
    /// change owner go to their new owner, unacknowledged messages first,
    /// in order.
    pub fn allocation(mut self, strategy: AllocationStrategy) -> Self {
        self.model.allocation = strategy;
        self
    }

    /// Zone allocation: this consumer's zone label.
    pub fn zone(mut self, zone: impl Into<String>) -> Self {
        self.model.zone = zone.into();
        self
    }

    /// Zone allocation: the zone label of each partition (item `i` is
    /// partition `i`'s; missing or empty = no zone). Kept with the
    /// subscription like the strategy: every consumer must give the same.
    pub fn partition_zones(mut self, zones: Vec<String>) -> Self {
        self.model.partition_zones = zones;
        self
    }

    /// Broadcast (RocketMQ's broadcasting consumption): this consumer
    /// receives every message of the topic, with a cursor of its own, the
    /// subscription `<subscription>/<consumer-name>`; reconnecting under the
    /// same name resumes where it left, and unsubscribing deletes it. Needs
    /// a consumer name (`NotAllowed` otherwise). Default clustering: the
    /// subscription's consumers share one cursor.
    pub fn mode(mut self, mode: SubscriptionMode) -> Self {
        self.model.mode = mode;
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

    /// Bound `reconsume_later` (and give `reconsume` its delays): a message
    /// retried `policy.max_retries` times goes to the dead-letter topic
    /// (the dead-letter policy's, else `<topic>-<subscription>-DLQ`) the
    /// next time it is reconsumed. Turns `retry_enabled` on.
    pub fn retry_policy(mut self, policy: RetryPolicy) -> Self {
        self.retry_policy = Some(policy);
        self.retry_enabled = true;
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
        ConsumerBuilder { topic, ..self.clone() }
    }

    /// Pull consumption: the broker sends nothing until
    /// [`Consumer::fetch`](super::Consumer::fetch) asks (no permits up
    /// front, none granted as messages are received). Not with a retry
    /// topic, nor through a multi-topic consumer.
    pub fn pull_mode(mut self, pull: bool) -> Self {
        self.pull = pull;
        self
    }

    /// How often a consumer subscribed by a partitioned topic's name
    /// (`subscribe_partitioned`, `subscribe_topics`) looks the partition
    /// count up again and subscribes partitions added since (default
    /// [`PARTITIONS_REFRESH_INTERVAL`](crate::PARTITIONS_REFRESH_INTERVAL),
    /// as producers do).
    pub fn partitions_refresh(mut self, every: Duration) -> Self {
        self.partitions_refresh = every;
        self
    }

    /// Subscribe to the topic by its own name: every partition of a
    /// partitioned topic (one consumer each), or the topic itself.
    /// Partitions added later are subscribed too (see
    /// [`partitions_refresh`](Self::partitions_refresh)).
    pub async fn subscribe_partitioned(self) -> Result<Arc<crate::MultiTopicConsumer>> {
        let topic = self.topic.clone();
        self.subscribe_topics(&[topic]).await
    }

    /// Subscribe to each topic of `topics` (each one by its own name, so a
    /// partitioned one brings all its partitions) through one consumer.
    /// Partitions added later to a partitioned one are subscribed too.
    pub async fn subscribe_topics(self, topics: &[String]) -> Result<Arc<crate::MultiTopicConsumer>> {
        let multi = Arc::new(crate::MultiTopicConsumer::new(self.subscription.clone()));
        let mut partitioned = Vec::new();
        for t in topics {
            if self.add_by_name(&multi, t).await? {
                partitioned.push(t.clone());
            }
        }
        if partitioned.is_empty() || self.partitions_refresh.is_zero() {
            return Ok(multi);
        }
        // A partition added later is new to this subscription: it starts
        // from its first message, else whatever a producer sent to it
        // before this refresh saw it would be skipped.
        let template = ConsumerBuilder { initial_position: InitialPosition::Earliest, ..self };
        let weak = Arc::downgrade(&multi);
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(template.partitions_refresh).await;
                let Some(multi) = weak.upgrade() else { return };
                for t in &partitioned {
                    if let Err(e) = template.add_by_name(&multi, t).await {
                        tracing::warn!(topic = %t, error = %e, "partitions refresh failed");
                    }
                }
            }
        });
        multi.adopt_task(task);
        Ok(multi)
    }

    /// Adds `topic` (all its partitions when partitioned) to `multi`.
    /// Those already consumed are skipped. Returns whether it is partitioned.
    pub(crate) async fn add_by_name(&self, multi: &crate::MultiTopicConsumer, topic: &str) -> Result<bool> {
        let topic = normalize_topic(topic)?;
        let partitions = self.origin.admin().partitions(&topic).await?;
        if partitions == 0 {
            multi.add_topic(self.with_topic(topic)).await?;
        } else {
            for i in 0..partitions {
                multi.add_topic(self.with_topic(format!("{topic}-partition-{i}"))).await?;
            }
        }
        Ok(partitions > 0)
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
        let (namespace, regex) = super::multi::parse_pattern(pattern)?;
        let multi = Arc::new(crate::MultiTopicConsumer::new(self.subscription.clone()));
        super::multi::add_matching(&self, &multi, &namespace, &regex).await?;
        let weak = Arc::downgrade(&multi);
        let task = tokio::spawn(async move {
            loop {
                tokio::time::sleep(refresh).await;
                let Some(multi) = weak.upgrade() else { return };
                if let Err(e) = super::multi::add_matching(&self, &multi, &namespace, &regex).await {
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
        if self.receiver_queue_size == 0 || self.receiver_queue_size > RECEIVER_QUEUE_SIZE_MAX {
            return Err(ClientError::InvalidOption { option: "receiver_queue_size", reason: "must be in 1..=1048576" });
        }
        if self.subscription.is_empty() {
            return Err(ClientError::InvalidOption { option: "subscription", reason: "must not be empty" });
        }
        if self.pull && (self.retry_enabled || self.inbox.is_some()) {
            return Err(ClientError::InvalidOption {
                option: "pull_mode",
                reason: "a pull consumer has no retry topic and is not part of a multi-topic consumer",
            });
        }
        if self.ack_timeout.is_some_and(|t| t < Duration::from_millis(100)) {
            return Err(ClientError::InvalidOption { option: "ack_timeout", reason: "must be at least 100 ms" });
        }
        self.origin.on_owner(&topic, !self.retry_enabled, |conn| self.subscribe_on(conn, &topic)).await
    }

    /// Subscribe on `conn` to `topic` (a full name).
    async fn subscribe_on(&self, conn: Arc<Connection>, topic: &str) -> Result<Consumer> {
        let consumer_id = conn.next_handle_id();
        let closed = Arc::new(AtomicBool::new(false));
        let active = Arc::new(AtomicBool::new(false));
        let timers = Arc::new(Notify::new());
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
        let slot = |deliver, active| ConsumerSlot {
            subscription: self.subscription.clone(),
            closed: closed.clone(),
            deliver,
            active,
            timers: timers.clone(),
        };
        let main = Subscription {
            consumer_id,
            topic: topic.clone(),
            initial_position: self.initial_position,
            durable: self.durable,
            filter_tag: self.filter_tag.clone(),
        };
        let deliver = Inbox::new(tx.clone(), source, topic.clone(), true);
        self.exchange(&conn, main, slot(deliver, active.clone())).await?;
        let retry = if self.retry_enabled {
            let retry_topic: Arc<str> = format!("{topic}-{}-RETRY", self.subscription).into();
            let retry_id = conn.next_handle_id();
            let subscription = Subscription {
                consumer_id: retry_id,
                topic: retry_topic.clone(),
                initial_position: InitialPosition::Earliest,
                durable: true,
                filter_tag: String::new(),
            };
            // The main slot's inbox ends the queue; this one does not.
            let deliver = Inbox::new(tx, source, retry_topic.clone(), false);
            if let Err(e) = self.exchange(&conn, subscription, slot(deliver, Arc::new(AtomicBool::new(false)))).await {
                conn.try_send_command(&Command::CloseConsumer { request_id: 0, consumer_id });
                conn.forget_consumer(consumer_id);
                return Err(e);
            }
            Some(Arc::new(RetryRoute { consumer_id: retry_id, topic: retry_topic, ledgers: Default::default() }))
        } else {
            None
        };
        let tracker = Arc::new(Tracker::new(self.ack_timeout));
        let acks = Arc::new(AckGroup::new(self.ack_group_time, self.ack_group_max));
        spawn_timer_task(
            conn.clone(),
            consumer_id,
            retry.clone(),
            tracker.clone(),
            acks.clone(),
            closed.clone(),
            timers.clone(),
        );
        let republish = Republish::new(
            self.origin.pool.clone(),
            self.dead_letter.clone(),
            self.retry_policy.clone(),
            &topic,
            &self.subscription,
        );
        let consumer = Consumer {
            conn,
            consumer_id,
            topic,
            subscription: self.subscription.clone(),
            queue: match own {
                Some(rx) => Queue::Own(tokio::sync::Mutex::new(OwnQueue::new(rx))),
                None => Queue::Shared,
            },
            permits: Permits::new(queue, self.pull),
            closed,
            active,
            tracker,
            timers,
            nack_backoff: self.nack_backoff,
            republish,
            retry,
            acks,
            ack_map: AckMap::default(),
        };
        if !self.pull {
            consumer.conn.send_command(&Command::Flow { consumer_id, permits: queue }).await?;
        }
        if let Some(r) = &consumer.retry {
            consumer.conn.send_command(&Command::Flow { consumer_id: r.consumer_id, permits: queue }).await?;
        }
        Ok(consumer)
    }

    /// The Subscribe exchange of one broker-side consumer on `conn`. Its
    /// connection slot is registered first: the broker may push messages
    /// right after its Success, before our Flow even (it should not, but
    /// then they are not lost). When it fails the slot goes, without an
    /// `End` in the queue.
    async fn exchange(&self, conn: &Connection, s: Subscription, slot: ConsumerSlot) -> Result<()> {
        conn.register_consumer(s.consumer_id, slot)?;
        let answer = conn
            .request("subscribe", |request_id| Command::Subscribe {
                request_id,
                consumer_id: s.consumer_id,
                topic: s.topic.to_string(),
                subscription: self.subscription.clone(),
                sub_type: self.sub_type,
                consumer_name: self.consumer_name.clone(),
                initial_position: s.initial_position,
                durable: s.durable,
                priority_level: self.priority_level,
                filter_tag: s.filter_tag,
                // The retry topic's keys have the same owners.
                key_shared_ranges: self.wire_ranges(),
                model: self.model.clone(),
            })
            .await;
        let subscribed = answer.and_then(|answer| expect_success(answer, "Subscribe"));
        if subscribed.is_err() {
            conn.forget_consumer(s.consumer_id);
        }
        subscribed
    }
}

/// What differs between the Subscribe of a consumer and of its retry
/// topic's consumer (the rest is the builder's).
struct Subscription {
    consumer_id: u64,
    topic: Arc<str>,
    initial_position: InitialPosition,
    durable: bool,
    filter_tag: String,
}

impl ConsumerBuilder {
    /// A builder with the defaults.
    pub(crate) fn new(origin: Origin, topic: String, subscription: String) -> Self {
        Self {
            origin,
            topic,
            subscription,
            sub_type: SubscriptionType::default(),
            initial_position: InitialPosition::default(),
            receiver_queue_size: DEFAULT_RECEIVER_QUEUE_SIZE,
            consumer_name: String::new(),
            priority_level: 0,
            filter_tag: String::new(),
            key_shared_ranges: Vec::new(),
            model: ConsumptionModel::default(),
            nack_backoff: NackBackoff::default(),
            ack_timeout: None,
            dead_letter: None,
            retry_enabled: false,
            retry_policy: None,
            ack_group_time: ACK_GROUP_TIME_DEFAULT,
            ack_group_max: ACK_GROUP_MAX_DEFAULT,
            durable: true,
            partitions_refresh: crate::PARTITIONS_REFRESH_INTERVAL,
            pull: false,
            inbox: None,
        }
    }
}
