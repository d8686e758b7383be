//! The broker API: what every front door calls.
//!
//! A [`Broker`] is the handle of one shard; a door (the native protocol in
//! the net crate today) holds the handle of the shard its connection landed
//! on and calls its typed methods; the handle routes each request to the
//! topic's owner shard. Owned by one shard; never crosses cores.

mod admin;
mod stats;
mod types;

pub use admin::*;
pub use stats::*;
pub use types::*;

use crate::authz::TopicAccess;
use crate::config::BrokerConfig;
use crate::error::{CoreError, ErrorCode};
use crate::ownership;
use crate::shard::{Op, Reply, Shard, TopicPolicy};
use crate::topic_name::TopicName;
use bytes::Bytes;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use glommio::channels::local_channel::LocalSender;
use magnetar_wire::{AckType, MessageId, ProducerAccessMode};
use std::rc::Rc;

/// Topics whose metrics [`Broker::for_each_topic_metrics`] takes between
/// two yields to the shard's other tasks.
pub const TOPIC_METRICS_PER_YIELD: usize = 64;

/// Who is calling: set by a door from its handshake (see
/// [`crate::auth::Authenticator`]). Every request is authorized against it
/// in the core, once, for every door ([`crate::authz`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Principal {
    /// No credentials: what every caller is while authentication is off.
    #[default]
    Anonymous,
    /// A role: a token's subject, a client certificate's subject, or the
    /// anonymous role.
    Role(String),
}

/// The handle a connection uses to reach the broker; one per shard, cheap to
/// clone, never crosses cores.
#[derive(Clone)]
pub struct Broker {
    pub(crate) shard: Rc<Shard>,
    /// Set for the connections of a shard's own port: producers and
    /// consumers of topics another shard owns are refused with `NotOwner`
    /// (the client looked up a stale owner), instead of crossing the mesh.
    owner_only: bool,
    /// Who is calling; every request is authorized against it.
    principal: Principal,
}

// ------------------------------------------------------------------ handle

impl Broker {
    pub(crate) fn new(shard: Rc<Shard>) -> Self {
        Self { shard, owner_only: false, principal: Principal::Anonymous }
    }

    /// A handle for the connections of this shard's own port: producers and
    /// consumers of topics owned by another shard are refused with
    /// `NotOwner` rather than routed over the mesh.
    pub fn owner_only(&self) -> Broker {
        Broker { owner_only: true, ..self.clone() }
    }

    /// The same handle acting for `principal` (a door sets it from its
    /// handshake, before the connection's first request).
    pub fn with_principal(&self, principal: Principal) -> Broker {
        Broker { principal, ..self.clone() }
    }

    /// Who this handle acts for.
    pub fn principal(&self) -> &Principal {
        &self.principal
    }

    pub fn shard_id(&self) -> u32 {
        self.shard.id
    }

    /// This shard's counters of requests and events that crossed the mesh
    /// (see [`ShardTraffic`]).
    pub fn traffic(&self) -> ShardTraffic {
        self.shard.traffic()
    }

    /// This shard's metrics, to write (doors count their connections) or
    /// to keep for reading from another thread.
    pub fn metrics(&self) -> &std::sync::Arc<crate::shard::metrics::ShardMetrics> {
        &self.shard.metrics
    }

    /// This shard's metrics and its log's figures, now (on the shard).
    pub fn metrics_snapshot(&self) -> crate::shard::metrics::ShardMetricsSnapshot {
        self.shard.metrics_snapshot()
    }

    /// Hands `visit` the metrics figures of every topic this shard owns and
    /// has loaded, persistent ones first, then non-persistent ones (those
    /// with a producer or a consumer now), in no particular order (no mesh
    /// hop: an exporter asks each shard). Yields to the shard's other tasks
    /// every [`TOPIC_METRICS_PER_YIELD`] topics, so that many topics never
    /// hold up produce for long: `visit` should do bounded work per topic.
    pub async fn for_each_topic_metrics(&self, mut visit: impl FnMut(&TopicMetrics)) {
        let topics: Vec<Rc<crate::topic::Topic>> = self.shard.topics.borrow().values().cloned().collect();
        for (i, t) in topics.iter().enumerate() {
            if i > 0 && i % TOPIC_METRICS_PER_YIELD == 0 {
                futures_lite::future::yield_now().await;
            }
            if !t.deleted.get() {
                visit(&crate::stats::topic_metrics(t));
            }
        }
        let np: Vec<Rc<crate::nonpersistent::NpTopic>> = self.shard.np_topics.borrow().values().cloned().collect();
        for (i, t) in np.iter().enumerate() {
            if i % TOPIC_METRICS_PER_YIELD == 0 {
                futures_lite::future::yield_now().await;
            }
            visit(&t.metrics());
        }
    }

    pub fn shards(&self) -> u32 {
        self.shard.nshards
    }

    pub fn config(&self) -> &BrokerConfig {
        &self.shard.config
    }

    /// True once shutdown began: stop accepting and reading requests.
    pub fn is_draining(&self) -> bool {
        self.shard.draining.get()
    }

    /// The shard owning `topic`.
    pub fn owner_of(&self, topic: &TopicName) -> u32 {
        ownership::shard_of(topic, self.shard.config.bundles_per_namespace, self.shard.nshards)
    }

    /// Parses `topic`, asks shard 0 for its policies (namespace exists, not a
    /// partitioned topic's own name) and finds its owner with the
    /// namespace's bundle count.
    /// `access` is what the caller needs on the topic; shard 0 checks it
    /// before anything else.
    async fn resolve_topic(&self, topic: &str, access: TopicAccess) -> Result<(String, u32, TopicPolicy), CoreError> {
        let tn = TopicName::parse(topic)?;
        let key = tn.to_string();
        let caller = Some((self.principal.clone(), access));
        let policy = match self.shard.call(0, Op::TopicPolicy { topic: key.clone(), caller }).await? {
            Reply::Policy(p) => p,
            other => return Err(unexpected(other)),
        };
        let owner = ownership::shard_of(&tn, policy.policies.bundles, self.shard.nshards);
        Ok((key, owner, policy))
    }

    /// [`resolve_topic`](Self::resolve_topic) for a producer or consumer:
    /// on a shard's own port, a topic of another shard is refused.
    async fn resolve_client_topic(
        &self,
        topic: &str,
        access: TopicAccess,
    ) -> Result<(String, u32, TopicPolicy), CoreError> {
        let resolved = self.resolve_topic(topic, access).await?;
        if self.owner_only && resolved.1 != self.shard.id {
            return Err(CoreError::new(
                ErrorCode::NotOwner,
                format!(
                    "topic {} is owned by shard {}, not by shard {} (look it up again)",
                    resolved.0, resolved.1, self.shard.id
                ),
            ));
        }
        Ok(resolved)
    }

    /// Runs an admin operation (on shard 0, after checking the caller may);
    /// [`AdminRequest`] says which [`AdminReply`] each one answers.
    pub async fn admin(&self, request: AdminRequest) -> Result<AdminReply, CoreError> {
        match self.shard.call(0, Op::Admin { request, caller: self.principal.clone() }).await? {
            Reply::Admin(reply) => Ok(reply),
            other => Err(unexpected(other)),
        }
    }

    /// Checks that this handle's caller is a superuser (`Ok` while
    /// authorization is off): what the broker-wide operations outside
    /// [`AdminRequest`] need (the HTTP door's health check and cluster
    /// configuration, as in Pulsar).
    pub fn check_superuser(&self) -> Result<(), CoreError> {
        let config = &self.shard.config;
        crate::authz::check_superuser(config.authentication.is_some(), &config.superuser_roles, &self.principal)
    }

    /// Registers where this connection's consumer events go.
    pub fn register_sink(&self, tx: LocalSender<ConsumerEvent>) -> u64 {
        let id = self.shard.next_sink.get();
        self.shard.next_sink.set(id + 1);
        self.shard.sinks.borrow_mut().insert(id, tx);
        id
    }

    pub fn unregister_sink(&self, sink: u64) {
        self.shard.sinks.borrow_mut().remove(&sink);
    }

    pub async fn create_producer(&self, topic: &str, producer_name: &str) -> Result<ProducerHandle, CoreError> {
        self.create_producer_with(topic, producer_name, ProducerAccessMode::Shared, None).await
    }

    /// Attaches a producer with an access mode; with `WaitForExclusive` this
    /// resolves only when the producer holds the topic. `epoch`: the topic
    /// epoch a reconnecting exclusive producer names (it is refused with
    /// `ProducerFenced` if another exclusive producer held the topic since).
    pub async fn create_producer_with(
        &self,
        topic: &str,
        producer_name: &str,
        mode: ProducerAccessMode,
        epoch: Option<u64>,
    ) -> Result<ProducerHandle, CoreError> {
        self.create_producer_queued(topic, producer_name, mode, epoch, None).await
    }

    /// As [`create_producer_with`](Self::create_producer_with); `queued`
    /// is told, before this resolves, when a `WaitForExclusive` producer
    /// joins the topic's queue (it resolves once the producer holds the
    /// topic), so that a door can say so first.
    pub async fn create_producer_queued(
        &self,
        topic: &str,
        producer_name: &str,
        mode: ProducerAccessMode,
        epoch: Option<u64>,
        queued: Option<futures::channel::oneshot::Sender<()>>,
    ) -> Result<ProducerHandle, CoreError> {
        let (topic, owner, policy) = self.resolve_client_topic(topic, TopicAccess::Produce).await?;
        let name = producer_name.to_string();
        let op = Op::CreateProducer { topic: topic.clone(), name, mode, policy, epoch, queued };
        match self.shard.call(owner, op).await? {
            Reply::Producer { name, last_sequence_id, epoch } => {
                Ok(ProducerHandle { topic, owner, producer_name: name, last_sequence_id, topic_epoch: epoch })
            }
            other => Err(unexpected(other)),
        }
    }

    /// Publishes one entry. The append is queued (in order) before this
    /// returns; the future resolves when the entry is durable. The producer
    /// sequence id the broker keeps (dedup) is the one in the blob's metadata.
    pub fn send(
        &self,
        producer: &ProducerHandle,
        num_messages: u32,
        blob: Bytes,
    ) -> LocalBoxFuture<'static, Result<MessageId, CoreError>> {
        self.send_checked(producer, num_messages, blob, None)
    }

    /// [`send`](Self::send) of a blob whose CRC-32 the caller has, computed
    /// over these very bytes (the connection, from the frame's checksum):
    /// the log derives the record's checksum from it instead of hashing the
    /// blob again.
    pub fn send_checked(
        &self,
        producer: &ProducerHandle,
        num_messages: u32,
        blob: Bytes,
        blob_crc: Option<u32>,
    ) -> LocalBoxFuture<'static, Result<MessageId, CoreError>> {
        let op = Op::Send {
            topic: producer.topic.clone(),
            producer: producer.producer_name.clone(),
            num_messages,
            blob,
            blob_crc,
        };
        let fut = self.shard.call(producer.owner, op);
        async move {
            match fut.await? {
                Reply::Sent(id) => Ok(id),
                other => Err(unexpected(other)),
            }
        }
        .boxed_local()
    }

    pub async fn close_producer(&self, producer: &ProducerHandle) -> Result<(), CoreError> {
        let op = Op::CloseProducer { topic: producer.topic.clone(), name: producer.producer_name.clone() };
        self.shard.call(producer.owner, op).await.map(|_| ())
    }

    /// Attaches a consumer; its messages go to `sink` (see `register_sink`).
    pub async fn subscribe(&self, mut req: SubscribeRequest, sink: u64) -> Result<ConsumerHandle, CoreError> {
        broadcast_subscription(&mut req)?;
        let (topic, owner, policy) = self.resolve_client_topic(&req.topic, TopicAccess::Consume).await?;
        req.topic = topic.clone();
        let consumer = ConsumerRef { shard: self.shard.id, sink, consumer_id: req.consumer_id };
        let subscription = req.subscription.clone();
        self.shard.call(owner, Op::Subscribe { req, consumer, policy }).await?;
        Ok(ConsumerHandle { topic, subscription, owner, consumer })
    }

    /// Grants the consumer `permits` more messages.
    pub fn flow(&self, c: &ConsumerHandle, permits: u32) {
        let op =
            Op::Flow { topic: c.topic.clone(), subscription: c.subscription.clone(), consumer: c.consumer, permits };
        let fut = self.shard.call(c.owner, op);
        glommio::spawn_local(fut).detach();
    }

    /// Stops (`paused`) or resumes delivery to the consumer without touching
    /// its permits: a connection calls it when the output it has not yet
    /// written to the client passes its bound, so the broker stops reading
    /// entries for a client that does not read them. Permits granted while
    /// paused count once it resumes. On a non-persistent topic a paused
    /// consumer misses messages, as one without permits does.
    pub fn pause_delivery(&self, c: &ConsumerHandle, paused: bool) {
        let op =
            Op::Pause { topic: c.topic.clone(), subscription: c.subscription.clone(), consumer: c.consumer, paused };
        let fut = self.shard.call(c.owner, op);
        glommio::spawn_local(fut).detach();
    }

    /// Acknowledges; with `durable`, resolves only once the cursor is on disk.
    pub fn ack(
        &self,
        c: &ConsumerHandle,
        ack_type: AckType,
        ids: Vec<MessageId>,
        durable: bool,
    ) -> LocalBoxFuture<'static, Result<(), CoreError>> {
        self.ack_with_batch_sizes(c, ack_type, ids, Vec::new(), durable)
    }

    /// [`ack`](Self::ack) where `batch_sizes` (empty, or one per id) makes an
    /// id with a batch index and a size above 1 acknowledge only that
    /// message of its batch (the entry once all of them are).
    pub fn ack_with_batch_sizes(
        &self,
        c: &ConsumerHandle,
        ack_type: AckType,
        ids: Vec<MessageId>,
        batch_sizes: Vec<u32>,
        durable: bool,
    ) -> LocalBoxFuture<'static, Result<(), CoreError>> {
        let op = Op::Ack {
            topic: c.topic.clone(),
            subscription: c.subscription.clone(),
            consumer: c.consumer,
            ack_type,
            ids,
            durable,
            batch_sizes,
        };
        let fut = self.shard.call(c.owner, op);
        async move { fut.await.map(|_| ()) }.boxed_local()
    }

    /// Delivers again the given unacknowledged messages of this consumer
    /// (all of them when `ids` is empty), to any consumer of the subscription.
    pub fn redeliver_unacknowledged(&self, c: &ConsumerHandle, ids: Vec<MessageId>) {
        let op =
            Op::Redeliver { topic: c.topic.clone(), subscription: c.subscription.clone(), consumer: c.consumer, ids };
        let fut = self.shard.call(c.owner, op);
        glommio::spawn_local(fut).detach();
    }

    /// Moves the subscription's cursor (see [`SeekTarget`]); the consumer's
    /// permits drop to 0.
    pub async fn seek(&self, c: &ConsumerHandle, target: SeekTarget) -> Result<(), CoreError> {
        let op =
            Op::Seek { topic: c.topic.clone(), subscription: c.subscription.clone(), consumer: c.consumer, target };
        self.shard.call(c.owner, op).await.map(|_| ())
    }

    /// Per-subscription statistics of `topic`.
    pub async fn topic_stats(&self, topic: &str) -> Result<TopicStats, CoreError> {
        // The owner comes from the namespace's bundle count (shard 0 knows it).
        let (topic, owner, _) = self.resolve_topic(topic, TopicAccess::ProduceOrConsume).await?;
        match self.shard.call(owner, Op::TopicStats { topic }).await? {
            Reply::TopicStats(stats) => Ok(stats),
            other => Err(unexpected(other)),
        }
    }

    /// Deletes the subscription of consumer `c` at its own request (Pulsar's
    /// UNSUBSCRIBE; the consume permission it subscribed with suffices, as
    /// in Pulsar). On success `c` is detached; with other consumers
    /// attached it is refused (`ConsumerBusy`) unless `force`.
    pub async fn unsubscribe(&self, c: &ConsumerHandle, force: bool) -> Result<(), CoreError> {
        let op = Op::Unsubscribe {
            topic: c.topic.clone(),
            subscription: c.subscription.clone(),
            consumer: c.consumer,
            force,
        };
        self.shard.call(c.owner, op).await.map(|_| ())
    }

    pub async fn close_consumer(&self, c: &ConsumerHandle) -> Result<(), CoreError> {
        let op =
            Op::CloseConsumer { topic: c.topic.clone(), subscription: c.subscription.clone(), consumer: c.consumer };
        self.shard.call(c.owner, op).await.map(|_| ())
    }
}

/// Broadcast mode: every consumer receives every message, so each has a
/// subscription of its own, `<subscription>/<consumer-name>`, created with
/// it and kept while it is away (a consumer coming back under the same name
/// resumes where it left); it goes when the consumer unsubscribes (or an
/// operator deletes it). Its type is the one asked for. A broadcast
/// consumer must be named: its name is its cursor's.
fn broadcast_subscription(req: &mut SubscribeRequest) -> Result<(), CoreError> {
    if req.model.mode != magnetar_wire::SubscriptionMode::Broadcast {
        return Ok(());
    }
    if req.consumer_name.is_empty() {
        return Err(CoreError::new(
            ErrorCode::NotAllowed,
            "a broadcast consumer needs a name: its cursor is the subscription <subscription>/<consumer-name>",
        ));
    }
    req.subscription = format!("{}/{}", req.subscription, req.consumer_name);
    Ok(())
}

fn unexpected(r: Reply) -> CoreError {
    CoreError::new(ErrorCode::UnknownError, format!("internal: unexpected reply {r:?}"))
}
