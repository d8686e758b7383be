//! One shard: a glommio executor's share of the broker.
//!
//! A `Shard` owns the topics whose bundles map to it, its own entry log, and
//! its ends of the cross-shard mesh. Connections (in the net crate) talk to
//! the `Broker` handle of the shard they landed on; the handle routes each
//! request to the owner shard, through the mesh when that is another shard.
//! Everything here is owned by one shard and never crosses cores; only
//! `MeshMsg` values travel between shards.

use crate::config::BrokerConfig;
use crate::error::{CoreError, ErrorCode};
use crate::ledgers::decode_topic_record;
use crate::ledgers::{LedgerInfo, Lookup, TopicLedgers};
use crate::mesh::{Mesh, MeshMsg};
use crate::metadata::{Metadata, Policies};
use crate::ownership;
use crate::producers::Admission;
use crate::signal::Signal;
use crate::sub_state::SubState;
use crate::topic::{NewConsumer, Subscription, Topic};
use crate::topic_name::{Domain, TopicName};
use bytes::Bytes;
use futures::channel::oneshot;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use glommio::channels::local_channel::LocalSender;
use magnetar_storage::EntryLog;
use magnetar_wire::{AckType, InitialPosition, MessageId, ProducerAccessMode, SubscriptionType};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

/// Ledger ids are unique across shards: `seq * LEDGER_ID_SHARD_STRIDE + shard`.
pub const LEDGER_ID_SHARD_STRIDE: u64 = 1024;
/// Most shards a broker may run (ledger ids reserve room for this many).
pub const SHARDS_MAX: u32 = LEDGER_ID_SHARD_STRIDE as u32;

/// Shares of the dispatchers' task queue; the default queue (flusher,
/// produce path) has 1000.
const DISPATCH_SHARES: usize = 250;

const META_TOPIC_PREFIX: &[u8] = b"t/";
const META_CURSOR_PREFIX: &[u8] = b"c/";
/// `s/<topic>\n<sub>`: a subscription's state beside its cursor (`sub_state.rs`).
const META_SUB_STATE_PREFIX: &[u8] = b"s/";
/// `d/<topic>`: the topic's dedup snapshot (see `dedup.rs`).
const META_DEDUP_PREFIX: &[u8] = b"d/";
/// `x/<ledger>`: the ledger of a deleted topic, kept so that its id is never
/// handed out again (the log may still hold its entries).
const META_DELETED_LEDGER_PREFIX: &[u8] = b"x/";

/// Where a consumer's events go: a sink registered on some shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConsumerRef {
    pub shard: u32,
    pub sink: u64,
    pub consumer_id: u64,
}

/// What a subscription sends to a consumer's connection.
#[derive(Debug)]
pub enum ConsumerEvent {
    Message {
        consumer_id: u64,
        message_id: MessageId,
        redelivery_count: u32,
        blob: Bytes,
        /// Batch-index acks of a redelivered batch (`Command::Message::ack_set`).
        ack_set: Vec<u64>,
    },
    /// Consecutive entries of one ledger for one consumer, in one event:
    /// entry i has `first` with entry number `first.entry + i`, the run's
    /// `redelivery_count` and no batch-index acks. The connection writes
    /// them as `MessageRun` frames to clients of protocol version 2 and as
    /// one `Message` frame each to older ones. Never empty.
    Run { consumer_id: u64, first: MessageId, redelivery_count: u32, blobs: Vec<Bytes> },
    /// The broker closed the consumer (e.g. unreadable data); the client should
    /// be told and may subscribe again.
    Closed { consumer_id: u64, code: ErrorCode, message: String },
    /// Failover: the consumer became (or stopped being) the active one.
    ActiveChange { consumer_id: u64, is_active: bool },
}

impl ConsumerEvent {
    /// The entries a `Message` or `Run` event delivers, in order:
    /// `(message_id, redelivery_count, blob)`; none for other events.
    pub fn deliveries(self) -> Vec<(MessageId, u32, Bytes)> {
        match self {
            Self::Message { message_id, redelivery_count, blob, .. } => vec![(message_id, redelivery_count, blob)],
            Self::Run { first, redelivery_count, blobs, .. } => blobs
                .into_iter()
                .enumerate()
                .map(|(i, blob)| (MessageId { entry: first.entry + i as u64, ..first }, redelivery_count, blob))
                .collect(),
            Self::Closed { .. } | Self::ActiveChange { .. } => Vec::new(),
        }
    }
}

/// A producer attached to a topic, as seen by the connection that created it.
#[derive(Debug, Clone)]
pub struct ProducerHandle {
    pub topic: String,
    pub owner: u32,
    pub producer_name: String,
    pub last_sequence_id: i64,
}

/// A consumer attached to a subscription, as seen by its connection.
#[derive(Debug, Clone)]
pub struct ConsumerHandle {
    pub topic: String,
    pub subscription: String,
    pub owner: u32,
    pub consumer: ConsumerRef,
}

#[derive(Debug, Clone)]
pub struct SubscribeRequest {
    pub topic: String,
    pub subscription: String,
    pub consumer_id: u64,
    pub sub_type: SubscriptionType,
    pub consumer_name: String,
    pub initial_position: InitialPosition,
    pub durable: bool,
    /// Failover: lower is preferred (Pulsar's priority level).
    pub priority_level: i32,
    /// Deliver only messages with this tag; empty = all.
    pub filter_tag: String,
    /// Key_Shared sticky mode: inclusive hash ranges this consumer owns;
    /// empty = auto split. Checked by `key_shared::check_sticky_ranges`.
    pub key_shared_ranges: Vec<(u32, u32)>,
}

/// Where a seek moves a subscription's cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SeekTarget {
    /// The next message delivered is this one.
    Id(MessageId),
    /// The next message delivered is the first published at or after this
    /// time (milliseconds since the Unix epoch).
    PublishTime(u64),
}

/// What shard 0 says about a topic before its owner creates or loads it.
#[derive(Debug, Clone)]
pub(crate) struct TopicPolicy {
    pub(crate) policies: Policies,
    /// The topic is partition i < N of a partitioned topic: it may be
    /// created whatever the auto-creation policy says.
    pub(crate) in_partitioned: bool,
}

/// A request executed on the owner shard.
#[derive(Debug)]
pub(crate) enum Op {
    CreateProducer {
        topic: String,
        name: String,
        mode: ProducerAccessMode,
        policy: TopicPolicy,
    },
    Send {
        topic: String,
        producer: String,
        sequence_id: u64,
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
    /// On shard 0: an admin operation (see `admin.rs`).
    Admin {
        op: String,
        json: String,
    },
    /// On shard 0: the namespace policies that govern `topic`.
    TopicPolicy {
        topic: String,
    },
    /// On any shard: its [`ShardTraffic`] counters.
    Traffic,
    /// On any shard: the topics of its log whose full name starts with `prefix`.
    ListTopics {
        prefix: String,
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
    Producer { name: String, last_sequence_id: i64 },
    Sent(MessageId),
    Done,
    Json(String),
    Policy(TopicPolicy),
    Topics(Vec<String>),
    Stats(String),
    Traffic(ShardTraffic),
}

pub(crate) type OpResult = Result<Reply, CoreError>;

pub(crate) struct Shard {
    pub(crate) id: u32,
    pub(crate) nshards: u32,
    pub(crate) config: Arc<BrokerConfig>,
    pub(crate) log: EntryLog,
    /// The metadata store's typed view; `Some` on shard 0 only.
    pub(crate) metadata: Option<Metadata>,
    pub(crate) topics: RefCell<HashMap<String, Rc<Topic>>>,
    /// Non-persistent topics with producers or consumers attached.
    np_topics: RefCell<HashMap<String, Rc<crate::nonpersistent::NpTopic>>>,
    next_ledger_seq: Cell<u64>,
    /// Ledgers the log held when the shard started (deleted ones excluded):
    /// a closed ledger of a topic record missing here was deleted by
    /// retention before the record was rewritten (a crash in between).
    ledgers_at_start: std::collections::HashSet<u64>,
    mesh: Mesh,
    pending: RefCell<HashMap<u64, oneshot::Sender<OpResult>>>,
    next_req: Cell<u64>,
    sinks: RefCell<HashMap<u64, LocalSender<ConsumerEvent>>>,
    next_sink: Cell<u64>,
    next_producer: Cell<u64>,
    /// Appends on this shard not yet durable (shutdown waits for them).
    inflight: Cell<u64>,
    draining: Cell<bool>,
    closed: Cell<bool>,
    dirty_cursors: RefCell<Vec<(Rc<Topic>, Rc<Subscription>)>>,
    /// Subscriptions whose redelivery counts changed, written at most once
    /// per `REDELIVERY_COUNTS_PERSIST_INTERVAL_MS` (see `flush_counts`).
    dirty_counts: RefCell<Vec<(Rc<Topic>, Rc<Subscription>)>>,
    cursor_flush: Signal,
    pub(crate) started_ms: u64,
    /// Data disk usage in percent at the last check, and whether produce is
    /// refused because it reached the refusal watermark.
    disk_pct: Cell<u8>,
    storage_full: Cell<bool>,
    /// Task queue of the dispatchers, whose catch-up reads go to disk: fewer
    /// shares than the default queue, where the log's flusher (the fsync
    /// path of every receipt) runs.
    pub(crate) dispatch_tq: glommio::TaskQueueHandle,
    /// Producer and consumer requests this shard sent over the mesh to a
    /// topic's owner (a client connected to the wrong shard), and consumer
    /// events (deliveries, closes) it sent to a consumer's connection on
    /// another shard: what shard-aware clients avoid. Admin, lookup and
    /// policy requests are not counted (they go to shard 0 by design).
    cross_shard_requests: Cell<u64>,
    cross_shard_events: Cell<u64>,
}

/// What one shard sent over the mesh on behalf of producers and consumers
/// since it started (admin `broker.shard-stats`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardTraffic {
    pub shard: u32,
    /// Producer and consumer requests (create, send, subscribe, flow, ack,
    /// close, redeliver, seek) routed to the topic's owner on another shard.
    pub cross_shard_requests: u64,
    /// Consumer events (a message to deliver, a close, an active-consumer
    /// change) sent to a consumer whose connection is on another shard; a
    /// run of deliveries counts one per entry.
    pub cross_shard_events: u64,
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
}

fn topic_meta_key(topic: &str) -> Vec<u8> {
    let mut k = META_TOPIC_PREFIX.to_vec();
    k.extend_from_slice(topic.as_bytes());
    k
}

/// Cursor keys are `c/<topic>\n<subscription>`; names never contain '\n'.
fn cursor_meta_key(topic: &str, sub: &str) -> Vec<u8> {
    sub_meta_key(META_CURSOR_PREFIX, topic, sub)
}

fn sub_meta_key(prefix: &[u8], topic: &str, sub: &str) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(topic.as_bytes());
    k.push(b'\n');
    k.extend_from_slice(sub.as_bytes());
    k
}

fn dedup_meta_key(topic: &str) -> Vec<u8> {
    let mut k = META_DEDUP_PREFIX.to_vec();
    k.extend_from_slice(topic.as_bytes());
    k
}

fn valid_subscription_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 256 && s.chars().all(|c| !c.is_control())
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

impl Shard {
    pub(crate) fn new(id: u32, nshards: u32, config: Arc<BrokerConfig>, log: EntryLog, mesh: Mesh) -> Rc<Self> {
        // Ledger ids already used on this shard come from the topic records
        // (every ledger they list), the deleted topics' records and the log.
        let mut seq = 0u64;
        let deleted = log.meta_prefix(META_DELETED_LEDGER_PREFIX);
        let ledgers_at_start: std::collections::HashSet<u64> = log.ledgers().into_iter().map(|(l, _)| l).collect();
        for (_, v) in log.meta_prefix(META_TOPIC_PREFIX).into_iter().chain(deleted) {
            for l in decode_topic_record(&v).unwrap_or_default() {
                seq = seq.max(l.id / LEDGER_ID_SHARD_STRIDE + 1);
            }
        }
        for &l in &ledgers_at_start {
            seq = seq.max(l / LEDGER_ID_SHARD_STRIDE + 1);
        }
        for l in orphan_ledgers(&log, &ledgers_at_start) {
            match log.delete_ledger(l) {
                Ok(_) => tracing::info!(
                    shard = id,
                    ledger = l,
                    "deleted a ledger no topic names (topic deleted before a crash)"
                ),
                Err(e) => tracing::warn!(shard = id, ledger = l, "cannot delete an orphan ledger: {e}"),
            }
        }
        let metadata = (id == 0).then(|| {
            let store: Rc<dyn crate::metadata::MetadataStore> =
                Rc::new(crate::metadata::LogMetadataStore::new(log.clone()));
            Metadata::new(store)
        });
        Rc::new(Self {
            id,
            nshards,
            config,
            log,
            metadata,
            topics: RefCell::new(HashMap::new()),
            np_topics: RefCell::new(HashMap::new()),
            next_ledger_seq: Cell::new(seq),
            ledgers_at_start,
            mesh,
            pending: RefCell::new(HashMap::new()),
            next_req: Cell::new(1),
            sinks: RefCell::new(HashMap::new()),
            next_sink: Cell::new(1),
            next_producer: Cell::new(0),
            inflight: Cell::new(0),
            draining: Cell::new(false),
            closed: Cell::new(false),
            dirty_cursors: RefCell::new(Vec::new()),
            dirty_counts: RefCell::new(Vec::new()),
            cursor_flush: Signal::new(),
            started_ms: now_ms(),
            disk_pct: Cell::new(0),
            storage_full: Cell::new(false),
            dispatch_tq: glommio::executor().create_task_queue(
                glommio::Shares::Static(DISPATCH_SHARES),
                glommio::Latency::NotImportant,
                "dispatch",
            ),
            cross_shard_requests: Cell::new(0),
            cross_shard_events: Cell::new(0),
        })
    }

    pub(crate) fn traffic(&self) -> ShardTraffic {
        ShardTraffic {
            shard: self.id,
            cross_shard_requests: self.cross_shard_requests.get(),
            cross_shard_events: self.cross_shard_events.get(),
        }
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.get()
    }

    // ---------------------------------------------------------------- routing

    /// Runs `op` on `owner`: here directly, elsewhere through the mesh. The
    /// synchronous part of the op (e.g. the append) happens in mesh order, so
    /// requests from one connection keep their order.
    pub(crate) fn call(self: &Rc<Self>, owner: u32, op: Op) -> LocalBoxFuture<'static, OpResult> {
        if owner == self.id {
            return self.handle_op(op);
        }
        if is_client_op(&op) {
            self.cross_shard_requests.set(self.cross_shard_requests.get() + 1);
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
        if to.shard == self.id {
            self.deliver_local(to.sink, event);
        } else {
            // A run counts once per entry, as its deliveries did one by one.
            let n = match &event {
                ConsumerEvent::Run { blobs, .. } => blobs.len() as u64,
                _ => 1,
            };
            self.cross_shard_events.set(self.cross_shard_events.get() + n);
            self.mesh.send(to.shard, MeshMsg::Event { sink: to.sink, event });
        }
    }

    fn deliver_local(&self, sink: u64, event: ConsumerEvent) {
        // A sink that is gone (connection closed) drops the event; the owner
        // learns of the close through CloseConsumer and redelivers.
        if let Some(tx) = self.sinks.borrow().get(&sink) {
            let _ = tx.try_send(event);
        }
    }

    // ------------------------------------------------------------ owner side

    fn handle_op(self: &Rc<Self>, op: Op) -> LocalBoxFuture<'static, OpResult> {
        if self.closed.get() {
            return futures::future::ready(Err(CoreError::new(ErrorCode::ServiceNotReady, "shard is shut down")))
                .boxed_local();
        }
        if is_non_persistent(&op) {
            return futures::future::ready(self.handle_non_persistent(op)).boxed_local();
        }
        match op {
            Op::Send { topic, producer, sequence_id, num_messages, blob, blob_crc } => {
                self.handle_send(&topic, &producer, sequence_id, num_messages, blob, blob_crc)
            }
            Op::CreateProducer { topic, name, mode, policy } => {
                let me = self.clone();
                async move { me.handle_create_producer(&topic, name, mode, policy).await }.boxed_local()
            }
            Op::CloseProducer { topic, name } => {
                if let Some(t) = self.topics.borrow().get(&topic) {
                    t.producers.borrow_mut().remove(&name);
                }
                futures::future::ready(Ok(Reply::Done)).boxed_local()
            }
            Op::Subscribe { req, consumer, policy } => {
                let me = self.clone();
                async move { me.handle_subscribe(req, consumer, policy).await }.boxed_local()
            }
            Op::Admin { op, json } => {
                let me = self.clone();
                async move { crate::admin::execute(me, &op, &json).await.map(Reply::Json) }.boxed_local()
            }
            Op::TopicPolicy { topic } => {
                let me = self.clone();
                async move { crate::admin::topic_policy(&me, &topic).await.map(Reply::Policy) }.boxed_local()
            }
            Op::Traffic => futures::future::ready(Ok(Reply::Traffic(self.traffic()))).boxed_local(),
            Op::ListTopics { prefix } => {
                let mut key = META_TOPIC_PREFIX.to_vec();
                key.extend_from_slice(prefix.as_bytes());
                let names = self
                    .log
                    .meta_prefix(&key)
                    .into_iter()
                    .filter_map(|(k, _)| String::from_utf8(k.get(META_TOPIC_PREFIX.len()..)?.to_vec()).ok())
                    .collect();
                futures::future::ready(Ok(Reply::Topics(names))).boxed_local()
            }
            Op::CreateTopic { topic } => {
                let me = self.clone();
                async move {
                    let tn = TopicName::parse(&topic)
                        .map_err(|e| CoreError::new(ErrorCode::InvalidTopicName, e.to_string()))?;
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
            Op::LastMessageId { topic } => futures::future::ready(self.last_message_id(&topic).map(|id| match id {
                Some(id) => Reply::Json(format!("{{\"id\":\"{id}\"}}")),
                None => Reply::Json("{\"id\":null}".to_string()),
            }))
            .boxed_local(),
            Op::FindMessages { topic, key, before_ms, limit } => {
                let me = self.clone();
                async move {
                    let v = crate::find::find_messages(&me, &topic, &key, before_ms, limit).await?;
                    Ok(Reply::Json(v.to_string()))
                }
                .boxed_local()
            }
            Op::Flow { topic, subscription, consumer, permits } => {
                if let Some(sub) = self.subscription(&topic, &subscription) {
                    sub.flow(consumer, permits);
                }
                futures::future::ready(Ok(Reply::Done)).boxed_local()
            }
            Op::Ack { topic, subscription, consumer, ack_type, ids, durable, batch_sizes } => {
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
                if let Some(sub) = self.subscription(&topic, &subscription) {
                    sub.remove_consumer(self, consumer);
                    // A non-durable subscription (a reader) lives only as long
                    // as its consumer: nothing of it is kept.
                    if !sub.durable && sub.consumer_count() == 0 {
                        if let Some(t) = self.topics.borrow().get(&topic) {
                            t.subs.borrow_mut().remove(&subscription);
                        }
                        sub.removed.set(true);
                        sub.wake.notify();
                    }
                }
                futures::future::ready(Ok(Reply::Done)).boxed_local()
            }
            Op::Seek { topic, subscription, consumer, target } => {
                let me = self.clone();
                async move { me.handle_seek(&topic, &subscription, consumer, target).await }.boxed_local()
            }
            Op::TopicStats { topic } => {
                let r = (|| {
                    let tn = TopicName::parse(&topic)
                        .map_err(|e| CoreError::new(ErrorCode::InvalidTopicName, e.to_string()))?;
                    // Loaded, or known from its metadata record (then loading
                    // it creates nothing); an unknown topic is not created.
                    let known =
                        self.topics.borrow().contains_key(&topic) || self.log.meta(&topic_meta_key(&topic)).is_some();
                    if !known {
                        return Err(CoreError::new(ErrorCode::TopicNotFound, format!("no topic {topic}")));
                    }
                    let (t, _) = self.get_or_create_topic(&tn)?;
                    Ok(Reply::Stats(crate::stats::topic_stats_json(&self.log, &t)))
                })();
                futures::future::ready(r).boxed_local()
            }
            Op::Redeliver { topic, subscription, consumer, ids } => {
                if let (Some(t), Some(sub)) =
                    (self.topics.borrow().get(&topic).cloned(), self.subscription(&topic, &subscription))
                {
                    let entries: Vec<u64> = ids.iter().filter_map(|id| t.position_of(id).ok().flatten()).collect();
                    // Ids of another ledger are none of ours: nothing to do
                    // for them, but an all-foreign list must not mean "all".
                    if ids.is_empty() || !entries.is_empty() {
                        sub.redeliver(consumer, &entries);
                    }
                }
                futures::future::ready(Ok(Reply::Done)).boxed_local()
            }
        }
    }

    /// Runs an op about a non-persistent topic (see `is_non_persistent`);
    /// all synchronous: nothing waits for a disk.
    fn handle_non_persistent(&self, op: Op) -> OpResult {
        let np = |t: &str| self.np_topics.borrow().get(t).cloned();
        let not_loaded =
            || CoreError::new(ErrorCode::TopicNotFound, "non-persistent topic has no producer or consumer");
        match op {
            Op::CreateProducer { topic, name, mode, policy } => {
                if mode == ProducerAccessMode::WaitForExclusive {
                    return Err(CoreError::new(
                        ErrorCode::NotAllowed,
                        "WaitForExclusive is not supported on non-persistent topics",
                    ));
                }
                let t = self.np_topic(&topic);
                let name = if name.is_empty() {
                    let n = self.next_producer.get();
                    self.next_producer.set(n + 1);
                    format!("magnetar-{}-{}-{}", self.id, self.started_ms, n)
                } else {
                    name
                };
                let added = t.producers.borrow_mut().add(&topic, &name, mode, policy.policies.max_producers_per_topic);
                added.map(|_| Reply::Producer { name, last_sequence_id: -1 })
            }
            Op::Send { topic, producer, num_messages, blob, .. } => {
                let t = np(&topic).ok_or_else(not_loaded)?;
                t.producers.borrow().check_send(&topic, &producer)?;
                if blob.len() > self.config.message_bytes_max as usize {
                    return Err(CoreError::new(
                        ErrorCode::MessageTooLarge,
                        format!(
                            "message of {} bytes exceeds the limit of {}",
                            blob.len(),
                            self.config.message_bytes_max
                        ),
                    ));
                }
                magnetar_wire::peek_message(&blob)
                    .map_err(|e| CoreError::new(ErrorCode::ProtocolError, format!("bad message blob: {e}")))?;
                let (id, events) = t.publish(blob, num_messages);
                for (to, ev) in events {
                    self.deliver(to, ev);
                }
                Ok(Reply::Sent(id))
            }
            Op::CloseProducer { topic, name } => {
                if let Some(t) = np(&topic) {
                    t.producers.borrow_mut().remove(&name);
                    self.drop_idle_np(&t);
                }
                Ok(Reply::Done)
            }
            Op::Subscribe { req, consumer, policy } => {
                if !valid_subscription_name(&req.subscription) {
                    return Err(CoreError::new(ErrorCode::NotAllowed, "invalid subscription name"));
                }
                let t = self.np_topic(&req.topic);
                let r = t.subscribe(&req.subscription, consumer, policy.policies.max_consumers_per_topic);
                if r.is_err() {
                    self.drop_idle_np(&t);
                }
                r.map(|_| Reply::Done)
            }
            Op::Flow { topic, subscription, consumer, permits } => {
                if let Some(t) = np(&topic) {
                    t.flow(&subscription, consumer, permits);
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
            Op::CloseConsumer { topic, subscription, consumer } => {
                if let Some(t) = np(&topic) {
                    t.unsubscribe(&subscription, consumer);
                    self.drop_idle_np(&t);
                }
                Ok(Reply::Done)
            }
            other => Err(CoreError::new(ErrorCode::UnknownError, format!("internal: {other:?} is not a topic op"))),
        }
    }

    fn np_topic(&self, key: &str) -> Rc<crate::nonpersistent::NpTopic> {
        let partition = TopicName::parse(key).ok().and_then(|t| t.partition()).and_then(|p| i32::try_from(p).ok());
        self.np_topics
            .borrow_mut()
            .entry(key.to_string())
            .or_insert_with(|| Rc::new(crate::nonpersistent::NpTopic::new(key.to_string(), partition.unwrap_or(-1))))
            .clone()
    }

    /// Forgets a non-persistent topic nobody uses any more.
    fn drop_idle_np(&self, t: &crate::nonpersistent::NpTopic) {
        if t.producers.borrow().len() == 0 && t.consumer_count() == 0 {
            self.np_topics.borrow_mut().remove(&t.key);
        }
    }

    /// The topic and subscription `consumer` is attached to, or why not.
    fn attached(
        &self,
        topic: &str,
        subscription: &str,
        consumer: ConsumerRef,
    ) -> Result<(Rc<Topic>, Rc<Subscription>), CoreError> {
        let not_found = |why: &str| CoreError::new(ErrorCode::ConsumerNotFound, why);
        let t = self.topics.borrow().get(topic).cloned().ok_or_else(|| not_found("topic not loaded"))?;
        let sub = t.subs.borrow().get(subscription).cloned().ok_or_else(|| not_found("no such subscription"))?;
        if !sub.has_consumer(consumer) {
            return Err(not_found("consumer is not attached"));
        }
        Ok((t, sub))
    }

    fn subscription(&self, topic: &str, sub: &str) -> Option<Rc<Subscription>> {
        self.topics.borrow().get(topic)?.subs.borrow().get(sub).cloned()
    }

    fn handle_send(
        self: &Rc<Self>,
        topic: &str,
        producer: &str,
        sequence_id: u64,
        num_messages: u32,
        blob: Bytes,
        blob_crc: Option<u32>,
    ) -> LocalBoxFuture<'static, OpResult> {
        crate::stage::mark("2_owner_send");
        let appended = (|| {
            if self.draining.get() {
                return Err(CoreError::new(ErrorCode::ServiceNotReady, "broker is shutting down"));
            }
            let t = self
                .topics
                .borrow()
                .get(topic)
                .cloned()
                .ok_or_else(|| CoreError::new(ErrorCode::ProducerNotFound, "topic not loaded on its owner"))?;
            if self.storage_full.get() {
                // Retriable: consumers keep reading, and produce resumes by
                // itself once usage drops below the watermark.
                return Err(CoreError::new(
                    ErrorCode::StorageFull,
                    format!(
                        "data disk is {}% full; produce is refused at {}% until space is freed",
                        self.disk_pct.get(),
                        self.config.disk_watermarks.refuse_pct
                    ),
                ));
            }
            t.producers.borrow().check_send(topic, producer)?;
            if blob.len() > self.config.message_bytes_max as usize {
                return Err(CoreError::new(
                    ErrorCode::MessageTooLarge,
                    format!("message of {} bytes exceeds the limit of {}", blob.len(), self.config.message_bytes_max),
                ));
            }
            if num_messages == 0 {
                return Err(CoreError::new(ErrorCode::ProtocolError, "send with num_messages 0"));
            }
            // A batch no consumer could split (`decode_batch` refuses it)
            // would be stored and then undeliverable; its count would also
            // inflate the backlog and rate figures.
            if num_messages > magnetar_wire::BATCH_MESSAGES_MAX {
                return Err(CoreError::new(
                    ErrorCode::ProtocolError,
                    format!(
                        "send says {num_messages} messages; a batch holds at most {}",
                        magnetar_wire::BATCH_MESSAGES_MAX
                    ),
                ));
            }
            // Validate the metadata now so that no consumer is ever handed an
            // entry it cannot decode.
            let peek = magnetar_wire::peek_message(&blob)
                .map_err(|e| CoreError::new(ErrorCode::ProtocolError, format!("bad message blob: {e}")))?;
            if peek.num_messages != 0 && peek.num_messages != num_messages {
                return Err(CoreError::new(
                    ErrorCode::ProtocolError,
                    format!("send says {num_messages} messages, its metadata {}", peek.num_messages),
                ));
            }
            let tracked = t.dedup.loaded.get() || t.dedup.loading.get();
            let seq = peek.sequence_id;
            let chunk = peek.chunk.map_or(0, |(id, _)| id);
            if t.dedup.enabled.get() {
                if peek.producer_name != producer {
                    return Err(CoreError::new(
                        ErrorCode::ProtocolError,
                        format!("message metadata names producer {:?}, not {producer:?}", peek.producer_name),
                    ));
                }
                if let crate::dedup::Check::Duplicate(original) = t.dedup.check(producer, seq, chunk) {
                    return Ok(Err((t, original)));
                }
            }
            // The index keeps publish time and key hash beside the position,
            // for seek by time and lookup by key without reading payloads.
            let extras = magnetar_storage::IndexExtras {
                publish_time_ms: peek.publish_time_ms,
                key_hash: peek.partition_key.map_or(0, |k| magnetar_storage::key_hash(k.as_bytes())),
                tag_hash: magnetar_storage::tag_hash(peek.tag.map(str::as_bytes)),
            };
            self.maybe_roll(&t);
            let (ledger, first) = {
                let l = t.ledgers.borrow();
                (l.current().id, l.current().first)
            };
            let bytes = blob.len() as u64;
            let a = self.log.append_checked(ledger, blob, blob_crc, extras)?;
            t.ledgers.borrow_mut().appended(a.entry, bytes);
            let pos = first + a.entry;
            t.rate_in.record(now_ms(), u64::from(num_messages), bytes);
            t.note_messages(pos, num_messages);
            assert_eq!(pos, t.next_entry.get(), "positions of a topic are dense");
            t.next_entry.set(pos + 1);
            if tracked {
                t.dedup.record(producer, seq, chunk, num_messages, pos, a.lsn);
            }
            let id = MessageId::new(ledger, a.entry, t.partition, -1);
            Ok(Ok((t, (id, pos, a.lsn))))
        })();
        let (topic, appended) = match appended {
            Ok(Ok(x)) => x,
            Ok(Err((t, original))) => {
                // A resend: answer with the original receipt, once durable.
                let me = self.clone();
                return async move {
                    match original {
                        Some((pos, lsn)) => {
                            me.log.wait_durable(lsn).await?;
                            // Its ledger may be gone by retention since.
                            let id = t.message_id(pos).unwrap_or_else(|| crate::dedup::duplicate_id(t.partition));
                            Ok(Reply::Sent(id))
                        }
                        None => Ok(Reply::Sent(crate::dedup::duplicate_id(t.partition))),
                    }
                }
                .boxed_local();
            }
            Err(e) => return futures::future::ready(Err(e)).boxed_local(),
        };
        let _ = sequence_id;
        self.inflight.set(self.inflight.get() + 1);
        let me = self.clone();
        let (id, pos, lsn) = appended;
        async move {
            let r = me.log.wait_durable(lsn).await;
            crate::stage::mark("7_owner_durable");
            me.inflight.set(me.inflight.get() - 1);
            r?;
            topic.on_durable(pos);
            Ok(Reply::Sent(id))
        }
        .boxed_local()
    }

    /// Loads the topic (from recovered metadata) or creates it. Returns the
    /// log position of its creation record, if it was created now.
    fn get_or_create_topic(self: &Rc<Self>, name: &TopicName) -> Result<(Rc<Topic>, Option<u64>), CoreError> {
        let key = name.to_string();
        if let Some(t) = self.topics.borrow().get(&key) {
            return Ok((t.clone(), None));
        }
        if name.domain == Domain::NonPersistent {
            return Err(CoreError::new(ErrorCode::NotAllowed, "non-persistent topics are not supported yet"));
        }
        let partition = name.partition().map(|p| p as i32).unwrap_or(-1);
        let meta_key = topic_meta_key(&key);
        let (ledgers, created_lsn) = match self.log.meta(&meta_key).as_deref().and_then(decode_topic_record) {
            Some(list) => {
                let (ledgers, repaired) = self.recovered_ledgers(&key, list);
                if repaired {
                    self.log.put_meta(&meta_key, Bytes::from(ledgers.encode()))?;
                }
                (ledgers, None)
            }
            None => {
                let ledger = self.allocate_ledger();
                let ledgers = TopicLedgers::new(vec![LedgerInfo {
                    id: ledger,
                    first: 0,
                    entries: 0,
                    bytes: 0,
                    created_ms: now_ms(),
                    closed_ms: 0,
                }]);
                let lsn = self.log.put_meta(&meta_key, Bytes::from(ledgers.encode()))?;
                tracing::info!(topic = %key, ledger, shard = self.id, "created topic");
                (ledgers, Some(lsn))
            }
        };
        let topic = Rc::new(Topic::new(name.clone(), key.clone(), ledgers, partition));
        // Restore durable subscriptions.
        let mut prefix = META_CURSOR_PREFIX.to_vec();
        prefix.extend_from_slice(key.as_bytes());
        prefix.push(b'\n');
        for (k, v) in self.log.meta_prefix(&prefix) {
            let Ok(sub_name) = std::str::from_utf8(&k[prefix.len()..]) else { continue };
            let cursor = crate::cursor::CursorRecord::decode(&v)
                .and_then(|rec| crate::cursor::Cursor::from_record(&rec, &topic.ledgers.borrow()));
            match cursor {
                Ok(cursor) => {
                    let sub = Subscription::new(
                        sub_name.to_string(),
                        SubscriptionType::Exclusive,
                        true,
                        cursor,
                        partition,
                        self.config.delayed_index_max as usize,
                    );
                    // Type, filter, batch acks, redelivery counts. Without a
                    // record (older data) the first consumer sets the type.
                    let state_key = sub_meta_key(META_SUB_STATE_PREFIX, &key, sub_name);
                    match self.log.meta(&state_key).filter(|v| !v.is_empty()).map(|v| SubState::decode(&v)) {
                        Some(Ok(state)) => crate::sub_state::restore(
                            &sub,
                            state,
                            &topic.ledgers.borrow(),
                            now_ms(),
                            self.config.subscription_type_hold.as_millis() as u64,
                        ),
                        Some(Err(e)) => {
                            tracing::error!(topic = %key, sub = sub_name, "unreadable subscription state: {e}")
                        }
                        None => {}
                    }
                    topic.subs.borrow_mut().insert(sub_name.to_string(), sub.clone());
                    crate::dispatcher::task::spawn(self.clone(), topic.clone(), sub);
                }
                Err(e) => tracing::error!(topic = %key, sub = sub_name, "unreadable cursor record: {e}"),
            }
        }
        self.topics.borrow_mut().insert(key, topic.clone());
        Ok((topic, created_lsn))
    }

    /// A new ledger id: larger than every id this shard handed out before.
    pub(crate) fn allocate_ledger(&self) -> u64 {
        let seq = self.next_ledger_seq.get();
        self.next_ledger_seq.set(seq + 1);
        seq * LEDGER_ID_SHARD_STRIDE + u64::from(self.id)
    }

    /// A topic's ledgers from its record and the log: the current ledger's
    /// entries and bytes come from the log; leading closed ledgers the log
    /// no longer has were deleted by retention just before a crash (the
    /// deletion is written before the record) and are dropped. Returns
    /// whether the list changed that way (the caller rewrites the record).
    fn recovered_ledgers(&self, topic: &str, mut list: Vec<LedgerInfo>) -> (TopicLedgers, bool) {
        let gone = crate::ledgers::deleted_prefix(&list, |id| self.ledgers_at_start.contains(&id));
        if gone > 0 {
            let ids: Vec<u64> = list[..gone].iter().map(|l| l.id).collect();
            tracing::info!(topic, ledgers = ?ids, "ledgers deleted by retention before a restart dropped from the topic");
            list.drain(..gone);
        }
        let cur = list.last_mut().expect("a topic record lists a ledger");
        cur.entries = self.log.next_entry(cur.id);
        cur.bytes =
            (0..cur.entries).filter_map(|e| self.log.index_entry(cur.id, e)).map(|i| u64::from(i.body_len)).sum();
        if cur.created_ms == 0 {
            // A version 1 record does not say: count its age from now.
            cur.created_ms = now_ms();
        }
        (TopicLedgers::new(list), gone > 0)
    }

    /// Rolls the topic's current ledger over if it is due (see
    /// [`crate::ledgers::Rollover`]). Called before an append; a rollover
    /// that cannot be written leaves the current ledger in place (if the
    /// log failed, the append right after reports it).
    pub(crate) fn maybe_roll(&self, t: &Topic) {
        let now = now_ms();
        if self.config.ledger_rollover.due(&t.ledgers.borrow(), now) {
            if let Err(e) = self.roll_ledger(t, now) {
                tracing::warn!(topic = %t.key, "ledger rollover failed, appending to the current ledger: {e}");
            }
        }
    }

    /// Closes the topic's current ledger and opens a new one. The new list
    /// is a metadata record in the same log, ahead of every append to the
    /// new ledger, so a crash can never leave entries of a ledger the topic
    /// does not list; producers do not wait for it (their appends queue
    /// behind it in the same group commit).
    pub(crate) fn roll_ledger(&self, t: &Topic, now: u64) -> Result<u64, CoreError> {
        let id = self.allocate_ledger();
        let mut next = t.ledgers.borrow().clone();
        let closed = next.current().clone();
        next.roll(id, now);
        let lsn = self.log.put_meta(&topic_meta_key(&t.key), Bytes::from(next.encode()))?;
        *t.ledgers.borrow_mut() = next;
        tracing::info!(
            topic = %t.key,
            closed = closed.id,
            entries = closed.entries,
            bytes = closed.bytes,
            ledger = id,
            "ledger rolled over"
        );
        Ok(lsn)
    }

    /// Writes the topic record (after retention changed the ledger list).
    pub(crate) fn persist_topic_record(&self, t: &Topic) -> Result<u64, CoreError> {
        let bytes = t.ledgers.borrow().encode();
        Ok(self.log.put_meta(&topic_meta_key(&t.key), Bytes::from(bytes))?)
    }

    /// Every topic recorded in this shard's log, loaded (retention needs
    /// them all, not only those with clients since the restart).
    pub(crate) fn load_all_topics(self: &Rc<Self>) -> Vec<Rc<Topic>> {
        let mut out = Vec::new();
        for (k, _) in self.log.meta_prefix(META_TOPIC_PREFIX) {
            let Some(name) = k.get(META_TOPIC_PREFIX.len()..).and_then(|n| std::str::from_utf8(n).ok()) else {
                continue;
            };
            let Ok(tn) = TopicName::parse(name) else { continue };
            match self.get_or_create_topic(&tn) {
                Ok((t, _)) => out.push(t),
                Err(e) => tracing::warn!(topic = name, "retention: cannot load topic: {e}"),
            }
        }
        out
    }

    /// Whether `tn` exists (loaded or recorded in the log).
    fn topic_exists(&self, key: &str) -> bool {
        self.topics.borrow().contains_key(key) || self.log.meta(&topic_meta_key(key)).is_some()
    }

    /// Refuses to create `tn` when its namespace does not auto-create topics.
    fn check_auto_creation(&self, tn: &TopicName, policy: &TopicPolicy) -> Result<(), CoreError> {
        let key = tn.to_string();
        if !policy.in_partitioned && !policy.policies.auto_topic_creation && !self.topic_exists(&key) {
            return Err(CoreError::new(
                ErrorCode::TopicNotFound,
                format!(
                    "topic {key} does not exist and namespace {} does not create topics automatically",
                    tn.namespace_name()
                ),
            ));
        }
        Ok(())
    }

    async fn handle_create_producer(
        self: Rc<Self>,
        topic: &str,
        name: String,
        mode: ProducerAccessMode,
        policy: TopicPolicy,
    ) -> OpResult {
        let tn = TopicName::parse(topic).map_err(|e| CoreError::new(ErrorCode::InvalidTopicName, e.to_string()))?;
        self.check_auto_creation(&tn, &policy)?;
        let (t, lsn) = self.get_or_create_topic(&tn)?;
        let name = if name.is_empty() {
            let n = self.next_producer.get();
            self.next_producer.set(n + 1);
            format!("magnetar-{}-{}-{}", self.id, self.started_ms, n)
        } else {
            name
        };
        if policy.policies.deduplication {
            self.ensure_dedup_loaded(&t).await?;
        }
        t.dedup.enabled.set(policy.policies.deduplication);
        let admission = t.producers.borrow_mut().add(topic, &name, mode, policy.policies.max_producers_per_topic)?;
        if let Admission::Wait(rx) = admission {
            // WaitForExclusive: the topic attaches us when the holder leaves.
            if rx.await.is_err() {
                return Err(CoreError::new(ErrorCode::ServiceNotReady, "topic unloaded while waiting"));
            }
        }
        if let Some(lsn) = lsn {
            if let Err(e) = self.log.wait_durable(lsn).await {
                t.producers.borrow_mut().remove(&name);
                return Err(e.into());
            }
        }
        let last_sequence_id =
            if t.dedup.enabled.get() { t.dedup.last_persisted(&name, self.log.durable_lsn()) } else { -1 };
        Ok(Reply::Producer { name, last_sequence_id })
    }

    async fn handle_subscribe(
        self: Rc<Self>,
        req: SubscribeRequest,
        consumer: ConsumerRef,
        policy: TopicPolicy,
    ) -> OpResult {
        let tn =
            TopicName::parse(&req.topic).map_err(|e| CoreError::new(ErrorCode::InvalidTopicName, e.to_string()))?;
        self.check_auto_creation(&tn, &policy)?;
        if !valid_subscription_name(&req.subscription) {
            return Err(CoreError::new(
                ErrorCode::NotAllowed,
                "subscription names must be 1 to 256 characters without control characters",
            ));
        }
        crate::sub_state::check_filter_tag(&req.filter_tag)?;
        crate::dispatcher::key_shared::check_sticky_ranges(req.sub_type, &req.key_shared_ranges)?;
        let (t, created_lsn) = self.get_or_create_topic(&tn)?;
        let max = policy.policies.max_consumers_per_topic;
        let attached: usize = t.subs.borrow().values().map(|s| s.consumer_count()).sum();
        if max != 0 && attached >= max as usize {
            return Err(CoreError::new(
                ErrorCode::ConsumerBusy,
                format!("topic {} reached the namespace's max_consumers_per_topic ({max})", t.key),
            ));
        }
        let existing = t.subs.borrow().get(&req.subscription).cloned();
        let (sub, sub_lsn) = match existing {
            Some(sub) => (sub, None),
            None => {
                let floor = match req.initial_position {
                    InitialPosition::Earliest => t.ledgers.borrow().start(),
                    InitialPosition::Latest => t.next_entry.get(),
                };
                let cursor = crate::cursor::Cursor::new(floor);
                let sub = Subscription::new(
                    req.subscription.clone(),
                    req.sub_type,
                    req.durable,
                    cursor,
                    t.partition,
                    self.config.delayed_index_max as usize,
                );
                t.subs.borrow_mut().insert(req.subscription.clone(), sub.clone());
                crate::dispatcher::task::spawn(self.clone(), t.clone(), sub.clone());
                let lsn = if req.durable { Some(self.persist_cursor(&t, &sub)?) } else { None };
                (sub, lsn)
            }
        };
        let name = if req.consumer_name.is_empty() {
            format!("consumer-{}-{}-{}", consumer.shard, consumer.sink, consumer.consumer_id)
        } else {
            req.consumer_name.clone()
        };
        sub.add_consumer(
            &self,
            NewConsumer {
                consumer,
                sub_type: req.sub_type,
                name,
                priority: req.priority_level,
                filter_tag: req.filter_tag.clone(),
                key_shared_ranges: req.key_shared_ranges.clone(),
            },
        )?;
        if sub.state_dirty.get() {
            self.mark_cursor_dirty(&t, &sub);
        }
        for lsn in [created_lsn, sub_lsn].into_iter().flatten() {
            if let Err(e) = self.log.wait_durable(lsn).await {
                sub.remove_consumer(&self, consumer);
                return Err(e.into());
            }
        }
        Ok(Reply::Done)
    }

    /// Rebuilds the topic's dedup state: snapshot, then a replay of the
    /// durable entries after it. Appends made meanwhile are tracked live.
    async fn ensure_dedup_loaded(self: &Rc<Self>, t: &Rc<Topic>) -> Result<(), CoreError> {
        while t.dedup.loading.get() {
            glommio::timer::sleep(Duration::from_millis(2)).await;
        }
        if t.dedup.loaded.get() {
            return Ok(());
        }
        t.dedup.loading.set(true);
        let result = async {
            let snap: crate::dedup::Snapshot = match self.log.meta(&dedup_meta_key(&t.key)) {
                Some(v) => serde_json::from_slice(&v).map_err(|e| {
                    CoreError::new(ErrorCode::PersistenceError, format!("unreadable dedup snapshot of {}: {e}", t.key))
                })?,
                None => crate::dedup::Snapshot::default(),
            };
            t.dedup.restore(&snap);
            let end = t.next_entry.get();
            while t.durable_next.get() < end && !self.closed.get() {
                glommio::timer::sleep(Duration::from_millis(2)).await;
            }
            // Positions count across ledgers; those retention deleted teach nothing.
            let from = snap.next_entry.max(t.ledgers.borrow().start());
            for entry in from..end {
                let Some((ledger, e)) = t.ledgers.borrow().locate(entry) else { continue };
                match self.log.read(ledger, e).await {
                    Ok(blob) => match magnetar_wire::peek_message(&blob) {
                        Ok(p) => {
                            let chunk = p.chunk.map_or(0, |(id, _)| id);
                            t.dedup.record(p.producer_name, p.sequence_id, chunk, p.num_messages, entry, 0)
                        }
                        Err(e) => tracing::warn!(topic = %t.key, entry, "dedup replay: undecodable entry: {e}"),
                    },
                    // Gone (retention) or unreadable: nothing to learn from it.
                    Err(e) => tracing::warn!(topic = %t.key, entry, "dedup replay: cannot read entry: {e}"),
                }
            }
            tracing::info!(topic = %t.key, from = snap.next_entry, to = end, "dedup state restored");
            Ok(())
        }
        .await;
        t.dedup.loading.set(false);
        if result.is_ok() {
            t.dedup.loaded.set(true);
        }
        result
    }

    /// Writes the dedup snapshot of every topic whose state changed.
    fn flush_dedup(&self) -> Result<Option<u64>, CoreError> {
        let mut last = None;
        let topics: Vec<Rc<Topic>> = self.topics.borrow().values().cloned().collect();
        for t in topics {
            if !t.dedup.loaded.get() || t.dedup.loading.get() || !t.dedup.dirty.replace(false) {
                continue;
            }
            let snap = t.dedup.snapshot(t.next_entry.get());
            let bytes = serde_json::to_vec(&snap)
                .map_err(|e| CoreError::new(ErrorCode::UnknownError, format!("encoding a dedup snapshot: {e}")))?;
            last = Some(self.log.put_meta(&dedup_meta_key(&t.key), Bytes::from(bytes))?);
        }
        Ok(last)
    }

    /// The ledgers of a topic of this shard (loaded or only recorded), in
    /// order; `None` when it does not exist.
    pub(crate) fn topic_ledger_ids(&self, topic: &str) -> Option<Vec<u64>> {
        if let Some(t) = self.topics.borrow().get(topic) {
            return Some(t.ledgers.borrow().all().iter().map(|l| l.id).collect());
        }
        // Ledgers already deleted by retention may still be listed: the key
        // index answers only for ledgers that exist.
        let list = self.log.meta(&topic_meta_key(topic)).as_deref().and_then(decode_topic_record)?;
        Some(list.iter().map(|l| l.id).collect())
    }

    /// The last durable entry of `topic` as `L:E:P:-1` (a batch's last
    /// message is not singled out), `None` when the topic has no entry.
    fn last_message_id(&self, topic: &str) -> Result<Option<MessageId>, CoreError> {
        let tn = TopicName::parse(topic).map_err(|e| CoreError::new(ErrorCode::InvalidTopicName, e.to_string()))?;
        let partition = tn.partition().and_then(|p| i32::try_from(p).ok()).unwrap_or(-1);
        let (ledgers, next) = match self.topics.borrow().get(topic) {
            Some(t) => (t.ledgers.borrow().clone(), t.durable_next.get()),
            None => {
                let Some(list) = self.log.meta(&topic_meta_key(topic)).as_deref().and_then(decode_topic_record) else {
                    return Err(CoreError::new(ErrorCode::TopicNotFound, format!("topic {topic} does not exist")));
                };
                let (ledgers, _) = self.recovered_ledgers(topic, list);
                let next = ledgers.next();
                (ledgers, next)
            }
        };
        Ok(next.checked_sub(1).and_then(|p| ledgers.message_id(p, partition)))
    }

    async fn handle_delete_topic(self: Rc<Self>, topic: &str) -> OpResult {
        if !self.topic_exists(topic) {
            return Err(CoreError::new(ErrorCode::TopicNotFound, format!("topic {topic} does not exist")));
        }
        if let Some(t) = self.topics.borrow().get(topic) {
            let consumers: usize = t.subs.borrow().values().map(|s| s.consumer_count()).sum();
            if t.producers.borrow().len() > 0 || consumers > 0 {
                return Err(CoreError::new(
                    ErrorCode::NotAllowed,
                    format!("topic {topic} has connected producers or consumers"),
                ));
            }
        }
        let key = topic_meta_key(topic);
        let Some(list) = self.log.meta(&key).as_deref().and_then(decode_topic_record) else {
            return Err(CoreError::new(ErrorCode::TopicNotFound, format!("topic {topic} does not exist")));
        };
        let ledger = list.last().map_or(0, |l| l.id);
        if let Some(t) = self.topics.borrow_mut().remove(topic) {
            t.deleted.set(true);
            for s in t.subs.borrow().values() {
                s.wake.notify();
            }
        }
        // The newest ledger id stays reserved (x/ record, a version 1 topic
        // record) so that the allocator never hands it (or an older one)
        // out again; the ledgers themselves are deleted, freeing the space.
        let mut tomb = META_DELETED_LEDGER_PREFIX.to_vec();
        tomb.extend_from_slice(&ledger.to_le_bytes());
        let mut v1 = vec![crate::ledgers::TOPIC_RECORD_V1];
        v1.extend_from_slice(&ledger.to_le_bytes());
        self.log.put_meta(&tomb, Bytes::from(v1))?;
        let mut prefix = META_CURSOR_PREFIX.to_vec();
        prefix.extend_from_slice(topic.as_bytes());
        prefix.push(b'\n');
        for (k, _) in self.log.meta_prefix(&prefix) {
            self.log.put_meta(&k, Bytes::new())?;
        }
        let mut prefix = META_SUB_STATE_PREFIX.to_vec();
        prefix.extend_from_slice(topic.as_bytes());
        prefix.push(b'\n');
        for (k, v) in self.log.meta_prefix(&prefix) {
            if !v.is_empty() {
                self.log.put_meta(&k, Bytes::new())?;
            }
        }
        if self.log.meta(&dedup_meta_key(topic)).is_some() {
            self.log.put_meta(&dedup_meta_key(topic), Bytes::new())?;
        }
        let mut lsn = self.log.put_meta(&key, Bytes::new())?;
        // The ledgers go after the topic record: a crash in between leaves
        // ledgers no record names, which the next start deletes (see
        // `orphan_ledgers`), never a topic whose ledgers are gone.
        for l in &list {
            match self.log.delete_ledger(l.id) {
                Ok(d) => lsn = d,
                // Never written to, or already gone.
                Err(magnetar_storage::StorageError::LedgerDeleted { .. }) => {}
                Err(e) => tracing::warn!(topic, ledger = l.id, "deleting a ledger of a deleted topic: {e}"),
            }
        }
        self.log.wait_durable(lsn).await?;
        tracing::info!(topic, ledger, shard = self.id, "deleted topic");
        Ok(Reply::Done)
    }

    async fn handle_seek(
        self: Rc<Self>,
        topic: &str,
        subscription: &str,
        consumer: ConsumerRef,
        target: SeekTarget,
    ) -> OpResult {
        let (t, sub) = self.attached(topic, subscription, consumer)?;
        let lookup = match target {
            SeekTarget::Id(id) => Some(t.ledgers.borrow().lookup(id.ledger, id.entry)),
            SeekTarget::PublishTime(_) => None,
        };
        let entry = match (target, lookup) {
            (_, Some(Lookup::At(p))) => p.min(t.durable_next.get()),
            // Deleted by retention: the oldest message kept is next.
            (_, Some(Lookup::Trimmed)) => t.ledgers.borrow().start(),
            (SeekTarget::Id(id), _) => {
                return Err(CoreError::new(ErrorCode::NotAllowed, format!("seek to {id}: not a message of {topic}")))
            }
            (SeekTarget::PublishTime(ms), _) => self.first_entry_published_at(&t, ms).await?,
        };
        sub.reset_to(entry, consumer);
        if sub.durable {
            let lsn = self.persist_cursor(&t, &sub)?;
            self.log.wait_durable(lsn).await?;
        }
        tracing::info!(topic, subscription, entry, ?target, "seek");
        Ok(Reply::Done)
    }

    /// The first entry whose publish time is at or after `ms`, by binary
    /// search over the durable entries' metadata. Publish times are set by
    /// producers' clocks, so this assumes they grow with the entry id (a
    /// time index is issue #3's); an unreadable entry fails the seek.
    async fn first_entry_published_at(&self, t: &Topic, ms: u64) -> Result<u64, CoreError> {
        let (mut lo, mut hi) = (t.ledgers.borrow().start(), t.durable_next.get());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let Some((ledger, entry)) = t.ledgers.borrow().locate(mid) else {
                // Deleted by retention meanwhile: search what is left.
                lo = t.ledgers.borrow().start().max(mid + 1);
                continue;
            };
            let blob = self.log.read(ledger, entry).await?;
            let published = magnetar_wire::peek_message(&blob)
                .map_err(|e| CoreError::new(ErrorCode::PersistenceError, format!("entry {mid}: {e}")))?
                .publish_time_ms;
            if published < ms {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        Ok(lo)
    }

    /// Applies an ack. With `persist_now` the cursor record is written at once
    /// and its log position returned; otherwise the periodic flusher writes it.
    fn handle_ack(
        self: &Rc<Self>,
        topic: &str,
        subscription: &str,
        consumer: ConsumerRef,
        ack_type: AckType,
        (ids, batch_sizes): (&[MessageId], &[u32]),
        persist_now: bool,
    ) -> Result<Option<u64>, CoreError> {
        let (t, sub) = self.attached(topic, subscription, consumer)?;
        if ack_type == AckType::Cumulative && ids.len() != 1 {
            return Err(CoreError::new(ErrorCode::ProtocolError, "a cumulative ack carries exactly one id"));
        }
        if !batch_sizes.is_empty() && batch_sizes.len() != ids.len() {
            return Err(CoreError::new(ErrorCode::ProtocolError, "an ack's batch sizes must be one per id, or none"));
        }
        let acked = sub.ack(&t, ack_type, ids, batch_sizes);
        // A refused ack may have applied the ids before the refused one.
        if acked.as_ref().map_or(true, |changed| *changed) {
            self.mark_cursor_dirty(&t, &sub);
        }
        acked?;
        if !(persist_now && sub.durable) {
            return Ok(None);
        }
        if sub.dirty.get() {
            return Ok(Some(self.persist_cursor(&t, &sub)?));
        }
        // Nothing new, but the last cursor record may not be on disk yet:
        // the answer waits for it all the same.
        Ok(Some(sub.persisted_lsn.get()))
    }

    /// Writes the cursor record, and the state record when it changed
    /// (the state first: a crash between them leaves bits for entries the
    /// cursor does not yet acknowledge, never the other way round).
    /// On failure the subscription is queued again (both records marked
    /// changed), so the next flush retries it: a write error delays a
    /// cursor, never drops it.
    pub(crate) fn persist_cursor(&self, topic: &Rc<Topic>, sub: &Rc<Subscription>) -> Result<u64, CoreError> {
        let state_dirty = sub.state_dirty.replace(false);
        sub.dirty.set(false);
        let written = self.write_cursor_records(topic, sub, state_dirty);
        if written.is_ok() && state_dirty {
            // The state record carries every redelivery count.
            sub.counts_dirty.set(false);
            sub.state_written_ms.set(now_ms());
        }
        if written.is_err() {
            if state_dirty {
                sub.state_dirty.set(true);
            }
            self.mark_cursor_dirty(topic, sub);
        }
        written
    }

    fn write_cursor_records(&self, topic: &Topic, sub: &Subscription, state_dirty: bool) -> Result<u64, CoreError> {
        if state_dirty {
            let state = crate::sub_state::encode(sub, &topic.ledgers.borrow());
            self.log.put_meta(&sub_meta_key(META_SUB_STATE_PREFIX, &topic.key, &sub.name), Bytes::from(state))?;
        }
        let bytes = sub.cursor.borrow().to_record(&topic.ledgers.borrow()).encode();
        let lsn = self.log.put_meta(&cursor_meta_key(&topic.key, &sub.name), Bytes::from(bytes))?;
        sub.persisted_lsn.set(lsn);
        Ok(lsn)
    }

    pub(crate) fn mark_cursor_dirty(&self, topic: &Rc<Topic>, sub: &Rc<Subscription>) {
        if !sub.dirty.replace(true) {
            self.dirty_cursors.borrow_mut().push((topic.clone(), sub.clone()));
        }
    }

    /// Notes that a redelivery count of `sub` changed. Unlike an ack, this
    /// does not queue a write at once: the state record carrying the counts
    /// can be ~1.5 MB (10,000 partly acked batches' bits and 10,000 counts),
    /// and under constant redelivery rewriting it on every cursor flush
    /// (10 times a second) is write amplification for a figure that only
    /// needs to be roughly right after a crash (docs/semantics.md states the
    /// lag).
    pub(crate) fn mark_counts_dirty(&self, topic: &Rc<Topic>, sub: &Rc<Subscription>) {
        if !sub.counts_dirty.replace(true) {
            self.dirty_counts.borrow_mut().push((topic.clone(), sub.clone()));
        }
    }

    /// Writes the state record of subscriptions whose redelivery counts
    /// changed and whose state record is at least
    /// `REDELIVERY_COUNTS_PERSIST_INTERVAL_MS` old (all of them if `force`);
    /// the others wait in the queue.
    fn flush_counts(&self, force: bool) -> Result<Option<u64>, CoreError> {
        let now = now_ms();
        let batch = std::mem::take(&mut *self.dirty_counts.borrow_mut());
        persist_each(batch, |(t, s)| {
            if !s.counts_dirty.get() {
                // Written meanwhile along with another change.
                return Ok(None);
            }
            if !s.durable || s.removed.get() {
                s.counts_dirty.set(false);
                return Ok(None);
            }
            if !force && !crate::sub_state::counts_write_due(now, s.state_written_ms.get()) {
                self.dirty_counts.borrow_mut().push((t.clone(), s.clone()));
                return Ok(None);
            }
            s.state_dirty.set(true);
            self.persist_cursor(t, s).map(Some)
        })
    }

    /// Writes every changed cursor to the log. Returns the last position written.
    fn flush_cursors(&self) -> Result<Option<u64>, CoreError> {
        self.flush_cursors_and_counts(false)
    }

    fn flush_cursors_and_counts(&self, force_counts: bool) -> Result<Option<u64>, CoreError> {
        let dedup = self.flush_dedup()?;
        let dirty = std::mem::take(&mut *self.dirty_cursors.borrow_mut());
        // Every subscription taken is written or (by `persist_cursor`)
        // queued again: stopping at the first error would leave the rest
        // marked dirty but in no queue, never persisted again.
        let last = persist_each(dirty, |(t, s)| {
            if !(s.dirty.get() && s.durable) {
                s.dirty.set(false);
                return Ok(None);
            }
            self.persist_cursor(t, s).map(Some)
        });
        let counts = self.flush_counts(force_counts);
        Ok(counts?.or(last?).or(dedup))
    }

    /// Background task: persists changed cursors every interval.
    pub(crate) async fn cursor_flusher(self: Rc<Self>) {
        let interval = self.config.cursor_persist_interval;
        while !self.closed.get() {
            glommio::timer::sleep(interval).await;
            if let Err(e) = self.flush_cursors() {
                tracing::error!(shard = self.id, "persisting cursors failed: {e}");
            }
        }
    }

    /// Background task: measures the data disk every `check_interval`, logs
    /// when usage rises past a warning level, and refuses produce at or
    /// above the refusal level (resuming below it).
    pub(crate) async fn disk_watch(self: Rc<Self>) {
        let wm = self.config.disk_watermarks.clone();
        let dir = self.config.data_dir.clone();
        while !self.closed.get() {
            match wm.measure(&dir) {
                Ok(pct) => self.on_disk_usage(pct, &wm),
                Err(e) => tracing::warn!(shard = self.id, dir = %dir.display(), "cannot measure disk usage: {e}"),
            }
            glommio::timer::sleep(wm.check_interval).await;
        }
    }

    /// Measures the data disk now (after retention freed space, so that a
    /// refused produce resumes without waiting for the next check).
    pub(crate) fn measure_disk(&self) {
        let wm = &self.config.disk_watermarks;
        if let Ok(pct) = wm.measure(&self.config.data_dir) {
            self.on_disk_usage(pct, wm);
        }
    }

    fn on_disk_usage(&self, pct: u8, wm: &crate::disk_watch::DiskWatermarks) {
        let before = self.disk_pct.replace(pct);
        for &level in &wm.warn_pcts {
            if before < level && pct >= level {
                tracing::warn!(shard = self.id, used_pct = pct, level, "data disk usage passed a warning level");
            }
        }
        let full = pct >= wm.refuse_pct;
        if full != self.storage_full.replace(full) {
            if full {
                tracing::error!(
                    shard = self.id,
                    used_pct = pct,
                    refuse_pct = wm.refuse_pct,
                    "data disk full: refusing produce requests (StorageFull) until space is freed"
                );
            } else {
                tracing::info!(
                    shard = self.id,
                    used_pct = pct,
                    "data disk below the refusal level: accepting produce again"
                );
            }
        }
    }

    /// Clean shutdown: stop taking produce requests, let in-flight ones
    /// finish, persist cursors, close the log (which syncs and writes the
    /// clean-shutdown marker).
    pub(crate) async fn shutdown(self: &Rc<Self>) {
        self.draining.set(true);
        let deadline = std::time::Instant::now() + self.config.shutdown_drain_timeout;
        while self.inflight.get() > 0 && std::time::Instant::now() < deadline {
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
        if self.inflight.get() > 0 {
            tracing::warn!(
                shard = self.id,
                inflight = self.inflight.get(),
                "shutdown: in-flight appends did not finish"
            );
        }
        if let Err(e) = self.flush_cursors_and_counts(true) {
            tracing::error!(shard = self.id, "persisting cursors at shutdown failed: {e}");
        }
        self.closed.set(true);
        self.cursor_flush.notify();
        for t in self.topics.borrow().values() {
            for s in t.subs.borrow().values() {
                s.wake.notify();
            }
        }
        match self.log.close().await {
            Ok(()) => tracing::info!(shard = self.id, "log closed cleanly"),
            Err(e) => tracing::error!(shard = self.id, "closing the log failed: {e}"),
        }
    }
}

/// Ledgers of the log that no topic record names: a topic deletion writes
/// the empty topic record before deleting the ledgers, so a crash in between
/// leaves these (every ledger is named by its topic's record before its
/// first entry is appended). Nothing when any topic record does not decode
/// (a format this version does not know might name them).
fn orphan_ledgers(log: &EntryLog, in_log: &std::collections::HashSet<u64>) -> Vec<u64> {
    let mut named = std::collections::HashSet::new();
    for (_, v) in log.meta_prefix(META_TOPIC_PREFIX) {
        match decode_topic_record(&v) {
            Some(list) => named.extend(list.into_iter().map(|l| l.id)),
            None => return Vec::new(),
        }
    }
    let mut out: Vec<u64> = in_log.iter().copied().filter(|l| !named.contains(l)).collect();
    out.sort_unstable();
    out
}

/// Whether `op` is a producer/consumer op on a non-persistent topic.
fn is_non_persistent(op: &Op) -> bool {
    const NP: &str = "non-persistent://";
    match op {
        Op::CreateProducer { topic, .. }
        | Op::Send { topic, .. }
        | Op::CloseProducer { topic, .. }
        | Op::Flow { topic, .. }
        | Op::Ack { topic, .. }
        | Op::CloseConsumer { topic, .. } => topic.starts_with(NP),
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
            | Op::Ack { .. }
            | Op::CloseConsumer { .. }
            | Op::Redeliver { .. }
            | Op::Seek { .. }
    )
}

/// Decodes a topic record (`t/<topic>` metadata value, either version):
/// the topic's current ledger id. `None` for a value in an unknown format.
/// Public for offline tools; [`decode_topic_record`] gives every ledger.
pub fn decode_topic_meta(v: &[u8]) -> Option<u64> {
    decode_topic_record(v).and_then(|l| l.last().map(|l| l.id))
}

// ------------------------------------------------------------------ handle

impl Broker {
    pub(crate) fn new(shard: Rc<Shard>) -> Self {
        Self { shard, owner_only: false }
    }

    /// A handle for the connections of this shard's own port: producers and
    /// consumers of topics owned by another shard are refused with
    /// `NotOwner` rather than routed over the mesh.
    pub fn owner_only(&self) -> Broker {
        Broker { shard: self.shard.clone(), owner_only: true }
    }

    pub fn shard_id(&self) -> u32 {
        self.shard.id
    }

    /// This shard's counters of requests and events that crossed the mesh
    /// (see [`ShardTraffic`]).
    pub fn traffic(&self) -> ShardTraffic {
        self.shard.traffic()
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
    async fn resolve_topic(&self, topic: &str) -> Result<(String, u32, TopicPolicy), CoreError> {
        let tn = TopicName::parse(topic).map_err(|e| CoreError::new(ErrorCode::InvalidTopicName, e.to_string()))?;
        let key = tn.to_string();
        let policy = match self.shard.call(0, Op::TopicPolicy { topic: key.clone() }).await? {
            Reply::Policy(p) => p,
            other => return Err(unexpected(other)),
        };
        let owner = ownership::shard_of(&tn, policy.policies.bundles, self.shard.nshards);
        Ok((key, owner, policy))
    }

    /// [`resolve_topic`](Self::resolve_topic) for a producer or consumer:
    /// on a shard's own port, a topic of another shard is refused.
    async fn resolve_client_topic(&self, topic: &str) -> Result<(String, u32, TopicPolicy), CoreError> {
        let resolved = self.resolve_topic(topic).await?;
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

    /// Runs an admin operation (on shard 0) and returns its JSON answer.
    pub async fn admin(&self, op: &str, json: &str) -> Result<String, CoreError> {
        match self.shard.call(0, Op::Admin { op: op.to_string(), json: json.to_string() }).await? {
            Reply::Json(j) => Ok(j),
            other => Err(unexpected(other)),
        }
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
        self.create_producer_with(topic, producer_name, ProducerAccessMode::Shared).await
    }

    /// Attaches a producer with an access mode; with `WaitForExclusive` this
    /// resolves only when the producer holds the topic.
    pub async fn create_producer_with(
        &self,
        topic: &str,
        producer_name: &str,
        mode: ProducerAccessMode,
    ) -> Result<ProducerHandle, CoreError> {
        let (topic, owner, policy) = self.resolve_client_topic(topic).await?;
        let op = Op::CreateProducer { topic: topic.clone(), name: producer_name.to_string(), mode, policy };
        match self.shard.call(owner, op).await? {
            Reply::Producer { name, last_sequence_id } => {
                Ok(ProducerHandle { topic, owner, producer_name: name, last_sequence_id })
            }
            other => Err(unexpected(other)),
        }
    }

    /// Publishes one entry. The append is queued (in order) before this
    /// returns; the future resolves when the entry is durable.
    pub fn send(
        &self,
        producer: &ProducerHandle,
        sequence_id: u64,
        num_messages: u32,
        blob: Bytes,
    ) -> LocalBoxFuture<'static, Result<MessageId, CoreError>> {
        self.send_checked(producer, sequence_id, num_messages, blob, None)
    }

    /// [`send`](Self::send) of a blob whose CRC-32 the caller has, computed
    /// over these very bytes (the connection, from the frame's checksum):
    /// the log derives the record's checksum from it instead of hashing the
    /// blob again.
    pub fn send_checked(
        &self,
        producer: &ProducerHandle,
        sequence_id: u64,
        num_messages: u32,
        blob: Bytes,
        blob_crc: Option<u32>,
    ) -> LocalBoxFuture<'static, Result<MessageId, CoreError>> {
        let op = Op::Send {
            topic: producer.topic.clone(),
            producer: producer.producer_name.clone(),
            sequence_id,
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
        let (topic, owner, policy) = self.resolve_client_topic(&req.topic).await?;
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

    /// Per-subscription statistics of `topic` as a JSON object.
    pub async fn topic_stats(&self, topic: &str) -> Result<String, CoreError> {
        // The owner comes from the namespace's bundle count (shard 0 knows it).
        let (topic, owner, _) = self.resolve_topic(topic).await?;
        match self.shard.call(owner, Op::TopicStats { topic }).await? {
            Reply::Stats(json) => Ok(json),
            other => Err(unexpected(other)),
        }
    }

    pub async fn close_consumer(&self, c: &ConsumerHandle) -> Result<(), CoreError> {
        let op =
            Op::CloseConsumer { topic: c.topic.clone(), subscription: c.subscription.clone(), consumer: c.consumer };
        self.shard.call(c.owner, op).await.map(|_| ())
    }
}

fn unexpected(r: Reply) -> CoreError {
    CoreError::new(ErrorCode::UnknownError, format!("internal: unexpected reply {r:?}"))
}

/// Runs `persist` on every item of `batch`, whatever fails: returns the last
/// position written, or the first error once all were tried.
fn persist_each<T, E>(batch: Vec<T>, mut persist: impl FnMut(&T) -> Result<Option<u64>, E>) -> Result<Option<u64>, E> {
    let (mut last, mut first_err) = (None, None);
    for item in &batch {
        match persist(item) {
            Ok(Some(lsn)) => last = Some(lsn),
            Ok(None) => {}
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(last),
    }
}

#[cfg(test)]
mod flush_tests {
    use super::persist_each;

    #[test]
    fn a_failed_write_does_not_skip_the_rest_of_the_batch() {
        // Goal: one subscription whose record cannot be written (e.g. a
        // state record over the entry size limit) must not stop the others
        // in the same flush from being written. Method: fail the second of
        // five; all five must be tried and the error still reported.
        let mut tried = Vec::new();
        let r = persist_each(vec![1u64, 2, 3, 4, 5], |&i| {
            tried.push(i);
            if i == 2 {
                Err("too large")
            } else {
                Ok(Some(i * 10))
            }
        });
        assert_eq!(tried, vec![1, 2, 3, 4, 5]);
        assert_eq!(r, Err("too large"));
        assert_eq!(persist_each(vec![1u64, 2], |&i| Ok::<_, ()>((i == 1).then_some(7))), Ok(Some(7)));
    }
}
