//! Where a request runs: the mesh protocol between shards (`Op`, `Reply`)
//! and the owner side's dispatch of each op. Owned by one shard; only
//! `MeshMsg` values cross cores.

use super::mesh::MeshMsg;
use super::valid_subscription_name;
use super::Shard;
use crate::api::{
    AdminReply, AdminRequest, ConsumerEvent, ConsumerRef, FoundMessages, SeekTarget, ShardTraffic, SubscribeRequest,
    TopicStats,
};
use crate::error::{CoreError, ErrorCode};
use crate::metadata::Policies;
use crate::subscription::Subscription;
use crate::topic::producers::Admission;
use crate::topic::Topic;
use crate::topic_name::TopicName;
use bytes::Bytes;
use futures::channel::oneshot;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use magnetar_wire::{AckType, MessageId, ProducerAccessMode};
use std::rc::Rc;

/// What shard 0 says about a topic before its owner creates or loads it.
#[derive(Debug, Clone)]
pub(crate) struct TopicPolicy {
    pub(crate) policies: Policies,
    /// The topic is partition i < N of a partitioned topic: it may be
    /// created whatever the auto-creation policy says.
    pub(crate) in_partitioned: bool,
    /// When `in_partitioned`: the partitioned topic's partition count
    /// (allocation strategies need it); else 0.
    pub(crate) partitions: u32,
}

/// A request executed on the owner shard.
#[derive(Debug)]
pub(crate) enum Op {
    CreateProducer {
        topic: String,
        name: String,
        mode: ProducerAccessMode,
        policy: TopicPolicy,
        /// The topic epoch the producer names (a reconnecting exclusive
        /// producer; see `topic/producers.rs`).
        epoch: Option<u64>,
        /// Told when a `WaitForExclusive` producer joins the topic's queue,
        /// before the reply (which comes once it holds the topic).
        queued: Option<oneshot::Sender<()>>,
    },
    Send {
        topic: String,
        producer: String,
        num_messages: u32,
        blob: Bytes,
        /// The blob's CRC-32 when the connection had it (see `send_checked`).
        blob_crc: Option<u32>,
    },
    CloseProducer {
        topic: String,
        name: String,
    },
    Subscribe {
        req: SubscribeRequest,
        consumer: ConsumerRef,
        policy: TopicPolicy,
    },
    Flow {
        topic: String,
        subscription: String,
        consumer: ConsumerRef,
        permits: u32,
    },
    /// The consumer's connection has too much unwritten output (`true`) or
    /// has room again (`false`); see `Broker::pause_delivery`.
    Pause {
        topic: String,
        subscription: String,
        consumer: ConsumerRef,
        paused: bool,
    },
    Ack {
        topic: String,
        subscription: String,
        consumer: ConsumerRef,
        ack_type: AckType,
        ids: Vec<MessageId>,
        durable: bool,
        /// Empty, or per id its batch's size (batch-index acks).
        batch_sizes: Vec<u32>,
    },
    CloseConsumer {
        topic: String,
        subscription: String,
        consumer: ConsumerRef,
    },
    /// The consumer's client deletes its subscription (Pulsar's
    /// UNSUBSCRIBE): refused while other consumers are attached unless
    /// `force`.
    Unsubscribe {
        topic: String,
        subscription: String,
        consumer: ConsumerRef,
        force: bool,
    },
    Redeliver {
        topic: String,
        subscription: String,
        consumer: ConsumerRef,
        ids: Vec<MessageId>,
    },
    Seek {
        topic: String,
        subscription: String,
        consumer: ConsumerRef,
        target: SeekTarget,
    },
    TopicStats {
        topic: String,
    },
    /// On shard 0: an admin operation (see `admin.rs`), once `caller` is
    /// authorized for it.
    Admin {
        request: AdminRequest,
        caller: crate::api::Principal,
    },
    /// On shard 0: the namespace policies that govern `topic`, once the
    /// caller, if any (`None`: the broker itself), is authorized for the
    /// access.
    TopicPolicy {
        topic: String,
        caller: Option<(crate::api::Principal, crate::authz::TopicAccess)>,
    },
    /// On any shard: its [`ShardTraffic`] counters.
    Traffic,
    /// On any shard: at most `limit` of its topics whose full name starts
    /// with `prefix` and sorts after `after`, sorted.
    ListTopics {
        prefix: String,
        after: Option<String>,
        limit: usize,
    },
    /// On the owner: create (or load) a non-partitioned topic.
    CreateTopic {
        topic: String,
    },
    /// On the owner: delete a topic without producers or consumers.
    DeleteTopic {
        topic: String,
    },
    /// On the owner: the id of the topic's last durable entry.
    LastMessageId {
        topic: String,
    },
    /// On the owner: move a subscription past its damaged entry.
    SkipDamaged {
        topic: String,
        subscription: String,
    },
    /// On the owner: an operator's change to a subscription, or a peek
    /// (`sub_admin.rs`).
    SubscriptionAdmin {
        topic: String,
        subscription: String,
        op: crate::api::SubscriptionOp,
    },
    /// On the owner: messages of the topic with this key (`find.rs`).
    FindMessages {
        topic: String,
        key: String,
        before_ms: Option<u64>,
        limit: u32,
    },
}

#[derive(Debug)]
pub(crate) enum Reply {
    Producer {
        name: String,
        last_sequence_id: i64,
        /// The topic epoch (`None`: no exclusive producer ever took it).
        epoch: Option<u64>,
    },
    Sent(MessageId),
    Done,
    Admin(AdminReply),
    Policy(TopicPolicy),
    Topics(Vec<String>),
    TopicStats(TopicStats),
    Traffic(ShardTraffic),
    LastMessageId(Option<MessageId>),
    Found(FoundMessages),
    /// A stored entry, whole.
    Entry(crate::api::StoredEntry),
    /// The damaged entry a subscription was moved past.
    Skipped(MessageId),
}

pub(crate) type OpResult = Result<Reply, CoreError>;

impl Shard {
    // ---------------------------------------------------------------- routing

    /// Runs `op` on `owner`: here directly, elsewhere through the mesh. The
    /// synchronous part of the op (e.g. the append) happens in mesh order, so
    /// requests from one connection keep their order.
    pub(crate) fn call(self: &Rc<Self>, owner: u32, op: Op) -> LocalBoxFuture<'static, OpResult> {
        if owner == self.id {
            return self.handle_op(op);
        }
        if is_client_op(&op) {
            self.metrics.cross_shard_requests.add(1);
        }
        let req_id = self.next_req.get();
        self.next_req.set(req_id + 1);
        let (tx, rx) = oneshot::channel();
        self.pending.borrow_mut().insert(req_id, tx);
        self.mesh.send(owner, MeshMsg::Request { from: self.id, req_id, op });
        async move {
            rx.await.unwrap_or_else(|_| {
                Err(CoreError::new(ErrorCode::ServiceNotReady, "owner shard is not answering (shutting down?)"))
            })
        }
        .boxed_local()
    }

    /// Handles one message from another shard.
    pub(crate) fn on_mesh(self: &Rc<Self>, msg: MeshMsg) {
        match msg {
            MeshMsg::Request { from, req_id, op } => {
                let fut = self.handle_op(op);
                let me = self.clone();
                glommio::spawn_local(async move {
                    let result = fut.await;
                    me.mesh.send(from, MeshMsg::Reply { req_id, result });
                })
                .detach();
            }
            MeshMsg::Reply { req_id, result } => {
                if let Some(tx) = self.pending.borrow_mut().remove(&req_id) {
                    let _ = tx.send(result);
                }
            }
            MeshMsg::Event { sink, event } => self.deliver_local(sink, event),
        }
    }

    /// Sends an event to a consumer's sink, wherever it lives.
    pub(crate) fn deliver(&self, to: ConsumerRef, event: ConsumerEvent) {
        match &event {
            ConsumerEvent::Message { blob, .. } => {
                self.metrics.entries_out.add(1);
                self.metrics.bytes_out.add(blob.len() as u64);
            }
            ConsumerEvent::Run { blobs, .. } => {
                self.metrics.entries_out.add(blobs.len() as u64);
                self.metrics.bytes_out.add(blobs.iter().map(|b| b.len() as u64).sum());
            }
            ConsumerEvent::Closed { .. } | ConsumerEvent::ActiveChange { .. } => {}
        }
        if to.shard == self.id {
            self.deliver_local(to.sink, event);
        } else {
            // A run counts once per entry, as its deliveries did one by one.
            let n = match &event {
                ConsumerEvent::Run { blobs, .. } => blobs.len() as u64,
                _ => 1,
            };
            self.metrics.cross_shard_events.add(n);
            self.mesh.send(to.shard, MeshMsg::Event { sink: to.sink, event });
        }
    }

    pub(super) fn deliver_local(&self, sink: u64, event: ConsumerEvent) {
        // A sink that is gone (connection closed) drops the event; the owner
        // learns of the close through CloseConsumer and redelivers.
        if let Some(tx) = self.sinks.borrow().get(&sink) {
            let _ = tx.try_send(event);
        }
    }

    // ------------------------------------------------------------ owner side

    pub(super) fn handle_op(self: &Rc<Self>, op: Op) -> LocalBoxFuture<'static, OpResult> {
        if self.closed.get() {
            return futures::future::ready(Err(CoreError::new(ErrorCode::ServiceNotReady, "shard is shut down")))
                .boxed_local();
        }
        if is_non_persistent(&op) {
            return futures::future::ready(self.handle_non_persistent(op)).boxed_local();
        }
        match op {
            Op::Send { topic, producer, num_messages, blob, blob_crc } => {
                self.handle_send(&topic, &producer, num_messages, blob, blob_crc)
            }
            Op::CreateProducer { topic, name, mode, policy, epoch, queued } => {
                let me = self.clone();
                async move { me.handle_create_producer(&topic, name, mode, policy, epoch, queued).await }.boxed_local()
            }
            Op::CloseProducer { topic, name } => {
                if let Some(t) = self.topics.borrow().get(&topic) {
                    t.producers.borrow_mut().remove(&topic, &name);
                }
                futures::future::ready(Ok(Reply::Done)).boxed_local()
            }
            Op::Subscribe { req, consumer, policy } => {
                let me = self.clone();
                async move { me.handle_subscribe(req, consumer, policy).await }.boxed_local()
            }
            Op::Admin { request, caller } => {
                let me = self.clone();
                async move { crate::admin::authorized_execute(&me, &caller, request).await.map(Reply::Admin) }
                    .boxed_local()
            }
            Op::TopicPolicy { topic, caller } => {
                let me = self.clone();
                async move {
                    if let Some((principal, access)) = caller {
                        crate::admin::authorize_topic(&me, &principal, &topic, access).await?;
                    }
                    crate::admin::topic_policy(&me, &topic).await.map(Reply::Policy)
                }
                .boxed_local()
            }
            Op::Traffic => futures::future::ready(Ok(Reply::Traffic(self.traffic()))).boxed_local(),
            Op::ListTopics { prefix, after, limit } => {
                let mut names = self.store.topic_names(&prefix, after.as_deref(), limit);
                // Non-persistent topics exist while they have a producer or
                // a consumer; they are listed meanwhile.
                let after_ok = |k: &String| after.as_ref().is_none_or(|a| k > a);
                names.extend(self.np_topics.borrow().keys().filter(|k| k.starts_with(&prefix) && after_ok(k)).cloned());
                names.sort_unstable();
                names.truncate(limit);
                futures::future::ready(Ok(Reply::Topics(names))).boxed_local()
            }
            Op::CreateTopic { topic } => {
                let me = self.clone();
                async move {
                    let tn = TopicName::parse(&topic)?;
                    let (_, lsn) = me.get_or_create_topic(&tn)?;
                    match lsn {
                        Some(lsn) => me.log.wait_durable(lsn).await?,
                        None => {
                            return Err(CoreError::new(ErrorCode::NotAllowed, format!("topic {topic} already exists")))
                        }
                    }
                    Ok(Reply::Done)
                }
                .boxed_local()
            }
            Op::DeleteTopic { topic } => {
                let me = self.clone();
                async move { me.handle_delete_topic(&topic).await }.boxed_local()
            }
            Op::LastMessageId { topic } => {
                let me = self.clone();
                async move { me.handle_last_message_id(&topic).await.map(Reply::LastMessageId) }.boxed_local()
            }
            Op::SkipDamaged { topic, subscription } => {
                let me = self.clone();
                async move { me.handle_skip_damaged(&topic, &subscription).await }.boxed_local()
            }
            Op::SubscriptionAdmin { topic, subscription, op } => {
                let me = self.clone();
                async move { me.handle_subscription_admin(&topic, &subscription, op).await }.boxed_local()
            }
            Op::FindMessages { topic, key, before_ms, limit } => {
                let me = self.clone();
                async move { crate::find::find_messages(&me, &topic, &key, before_ms, limit).await.map(Reply::Found) }
                    .boxed_local()
            }
            Op::Flow { topic, subscription, consumer, permits } => {
                if let Some(sub) = self.subscription(&topic, &subscription) {
                    sub.flow(consumer, permits);
                }
                futures::future::ready(Ok(Reply::Done)).boxed_local()
            }
            Op::Pause { topic, subscription, consumer, paused } => {
                if let Some(sub) = self.subscription(&topic, &subscription) {
                    sub.pause(consumer, paused);
                }
                futures::future::ready(Ok(Reply::Done)).boxed_local()
            }
            Op::Ack { topic, subscription, consumer, ack_type, ids, durable, batch_sizes } => {
                self.metrics.acks.add(1);
                let me = self.clone();
                let result = self.handle_ack(&topic, &subscription, consumer, ack_type, (&ids, &batch_sizes), durable);
                async move {
                    let lsn = result?;
                    if durable {
                        if let Some(lsn) = lsn {
                            me.log.wait_durable(lsn).await?;
                        }
                    }
                    Ok(Reply::Done)
                }
                .boxed_local()
            }
            Op::CloseConsumer { topic, subscription, consumer } => {
                let t = self.topics.borrow().get(&topic).cloned();
                if let (Some(t), Some(sub)) = (t, self.subscription(&topic, &subscription)) {
                    crate::subscription::requests::close_consumer(&t, &sub, self, consumer);
                }
                futures::future::ready(Ok(Reply::Done)).boxed_local()
            }
            Op::Unsubscribe { topic, subscription, consumer, force } => {
                let me = self.clone();
                async move { me.handle_unsubscribe(&topic, &subscription, consumer, force).await }.boxed_local()
            }
            Op::Seek { topic, subscription, consumer, target } => {
                let me = self.clone();
                async move { me.handle_seek(&topic, &subscription, consumer, target).await }.boxed_local()
            }
            Op::TopicStats { topic } => {
                let r = (|| {
                    let tn = TopicName::parse(&topic)?;
                    // Loaded, or known from its metadata record (then loading
                    // it creates nothing); an unknown topic is not created.
                    let known = self.topics.borrow().contains_key(&topic) || self.store.topic_recorded(&topic);
                    if !known {
                        return Err(CoreError::new(ErrorCode::TopicNotFound, format!("no topic {topic}")));
                    }
                    let (t, _) = self.get_or_create_topic(&tn)?;
                    Ok(Reply::TopicStats(crate::stats::topic_stats(&self.log, &t)))
                })();
                futures::future::ready(r).boxed_local()
            }
            Op::Redeliver { topic, subscription, consumer, ids } => {
                if let (Some(t), Some(sub)) =
                    (self.topics.borrow().get(&topic).cloned(), self.subscription(&topic, &subscription))
                {
                    crate::subscription::requests::redeliver(&t, &sub, consumer, &ids);
                }
                futures::future::ready(Ok(Reply::Done)).boxed_local()
            }
        }
    }

    /// Runs an op about a non-persistent topic (see `is_non_persistent`);
    /// all synchronous: nothing waits for a disk.
    pub(super) fn handle_non_persistent(&self, op: Op) -> OpResult {
        let np = |t: &str| self.np_topics.borrow().get(t).cloned();
        let not_loaded =
            || CoreError::new(ErrorCode::TopicNotFound, "non-persistent topic has no producer or consumer");
        match op {
            Op::CreateProducer { topic, name, mode, policy, epoch, .. } => {
                if mode == ProducerAccessMode::WaitForExclusive {
                    return Err(CoreError::new(
                        ErrorCode::NotAllowed,
                        "WaitForExclusive is not supported on non-persistent topics",
                    ));
                }
                let t = self.np_topic(&topic);
                let name = self.producer_names.or_generate(name);
                // The epoch of a non-persistent topic lives as long as the
                // topic (as in Pulsar).
                let max = policy.policies.max_producers_per_topic;
                let added = t.producers.borrow_mut().add(&topic, &name, mode, max, epoch)?;
                match added {
                    Admission::Attached { epoch, .. } => Ok(Reply::Producer { name, last_sequence_id: -1, epoch }),
                    Admission::Wait(_) => unreachable!("WaitForExclusive is refused above"),
                }
            }
            Op::Send { topic, producer, num_messages, blob, .. } => {
                let t = np(&topic).ok_or_else(not_loaded)?;
                t.producers.borrow().check_send(&topic, &producer)?;
                crate::topic::publish::check_message_size(&self.config, blob.len())?;
                let meta = crate::entry::check(&blob)?;
                let key_hash =
                    crate::subscription::dispatcher::key_hash(meta.ordering_key, meta.partition_key.map(str::as_bytes));
                let (id, events) = t.publish(blob, num_messages, key_hash);
                for (to, ev) in events {
                    self.deliver(to, ev);
                }
                Ok(Reply::Sent(id))
            }
            Op::CloseProducer { topic, name } => {
                if let Some(t) = np(&topic) {
                    t.producers.borrow_mut().remove(&topic, &name);
                    self.drop_idle_np(&t);
                }
                Ok(Reply::Done)
            }
            Op::Subscribe { req, consumer, policy } => {
                if !valid_subscription_name(&req.subscription) {
                    return Err(CoreError::new(ErrorCode::NotAllowed, "invalid subscription name"));
                }
                let t = self.np_topic(&req.topic);
                let r = t.subscribe(&req.subscription, &req, consumer, policy.policies.max_consumers_per_topic);
                match r {
                    Ok(events) => {
                        for (to, ev) in events {
                            self.deliver(to, ev);
                        }
                        Ok(Reply::Done)
                    }
                    Err(e) => {
                        self.drop_idle_np(&t);
                        Err(e)
                    }
                }
            }
            Op::Flow { topic, subscription, consumer, permits } => {
                if let Some(t) = np(&topic) {
                    t.flow(&subscription, consumer, permits);
                }
                Ok(Reply::Done)
            }
            Op::Pause { topic, subscription, consumer, paused } => {
                if let Some(t) = np(&topic) {
                    t.pause(&subscription, consumer, paused);
                }
                Ok(Reply::Done)
            }
            Op::Ack { topic, subscription, consumer, .. } => {
                // Nothing is kept, so there is nothing to acknowledge.
                match np(&topic) {
                    Some(t) if t.has_consumer(&subscription, consumer) => Ok(Reply::Done),
                    _ => Err(CoreError::new(ErrorCode::ConsumerNotFound, "consumer is not attached")),
                }
            }
            // A non-persistent subscription holds no state beyond its
            // consumers: unsubscribing is closing.
            Op::CloseConsumer { topic, subscription, consumer }
            | Op::Unsubscribe { topic, subscription, consumer, .. } => {
                if let Some(t) = np(&topic) {
                    for (to, ev) in t.unsubscribe(&subscription, consumer) {
                        self.deliver(to, ev);
                    }
                    self.drop_idle_np(&t);
                }
                Ok(Reply::Done)
            }
            Op::TopicStats { topic } => np(&topic).map(|t| Reply::TopicStats(t.stats())).ok_or_else(not_loaded),
            // A non-persistent topic exists while it is used: deleting one
            // that is in use is refused (as Pulsar does without `force`),
            // one nobody uses is not there to delete.
            Op::DeleteTopic { topic } => match np(&topic) {
                Some(t) => Err(CoreError::new(
                    ErrorCode::NotAllowed,
                    format!(
                        "non-persistent topic {topic} has {} producers and {} consumers: close them first",
                        t.producers.borrow().len(),
                        t.consumer_count()
                    ),
                )),
                None => Err(not_loaded()),
            },
            other => Err(CoreError::new(ErrorCode::UnknownError, format!("internal: {other:?} is not a topic op"))),
        }
    }

    pub(super) fn np_topic(&self, key: &str) -> Rc<crate::nonpersistent::NpTopic> {
        let partition = TopicName::parse(key).ok().and_then(|t| t.partition()).and_then(|p| i32::try_from(p).ok());
        self.np_topics
            .borrow_mut()
            .entry(key.to_string())
            .or_insert_with(|| Rc::new(crate::nonpersistent::NpTopic::new(key.to_string(), partition.unwrap_or(-1))))
            .clone()
    }

    /// Forgets a non-persistent topic nobody uses any more.
    pub(super) fn drop_idle_np(&self, t: &crate::nonpersistent::NpTopic) {
        if t.producers.borrow().len() == 0 && t.consumer_count() == 0 {
            self.np_topics.borrow_mut().remove(&t.key);
        }
    }

    /// The topic and subscription `consumer` is attached to, or why not.
    pub(super) fn attached(
        &self,
        topic: &str,
        subscription: &str,
        consumer: ConsumerRef,
    ) -> Result<(Rc<Topic>, Rc<Subscription>), CoreError> {
        let t = self.topics.borrow().get(topic).cloned();
        crate::subscription::requests::attached(t, subscription, consumer)
    }

    pub(super) fn subscription(&self, topic: &str, sub: &str) -> Option<Rc<Subscription>> {
        self.topics.borrow().get(topic)?.subs.borrow().get(sub).cloned()
    }
}

/// Whether `op` is a producer/consumer op on a non-persistent topic.
fn is_non_persistent(op: &Op) -> bool {
    const NP: &str = "non-persistent://";
    match op {
        Op::CreateProducer { topic, .. }
        | Op::Send { topic, .. }
        | Op::CloseProducer { topic, .. }
        | Op::Flow { topic, .. }
        | Op::Pause { topic, .. }
        | Op::Ack { topic, .. }
        | Op::CloseConsumer { topic, .. }
        | Op::Unsubscribe { topic, .. }
        | Op::TopicStats { topic }
        | Op::DeleteTopic { topic } => topic.starts_with(NP),
        Op::Subscribe { req, .. } => req.topic.starts_with(NP),
        _ => false,
    }
}

/// Whether `op` is a producer's or consumer's request (what a shard-aware
/// client sends straight to the owner), as opposed to admin and metadata.
fn is_client_op(op: &Op) -> bool {
    matches!(
        op,
        Op::CreateProducer { .. }
            | Op::Send { .. }
            | Op::CloseProducer { .. }
            | Op::Subscribe { .. }
            | Op::Flow { .. }
            | Op::Pause { .. }
            | Op::Ack { .. }
            | Op::CloseConsumer { .. }
            | Op::Unsubscribe { .. }
            | Op::Redeliver { .. }
            | Op::Seek { .. }
    )
}
