//! Non-persistent topics (`non-persistent://…`): messages live only in
//! memory, on their way from the producer to the consumers connected at that
//! moment. A send is acknowledged as soon as it was handed to the
//! subscriptions (nothing touches the disk); a subscription whose chosen
//! consumer has no flow permits left, or that has no consumer, misses the
//! message; a broker restart or a dropped connection loses whatever was in
//! flight; acks are accepted and ignored (nothing is redelivered). Message
//! ids are `0:N:P:-1` with N counting this topic's messages since the broker
//! started. Subscriptions take every type (as persistent ones: Exclusive
//! refuses a second consumer, a consumer of another type than the attached
//! ones is refused) and vanish with their last consumer:
//!
//! - Exclusive and Failover: the active consumer (chosen as on a persistent
//!   subscription, `failover::choose_active`) gets every message.
//! - Shared: round robin over the consumers that have permits.
//! - Key_Shared: the hash space is split evenly over the consumers in the
//!   order they attached; the key's owner gets the message or, without
//!   permits, nobody does (so per-key order holds while membership is
//!   stable). Sticky ranges are refused.
//!
//! Owned by the topic's shard; never crosses cores.

use crate::api::{
    ConsumerEvent, ConsumerRef, ConsumerStats, SubscriptionMetrics, SubscriptionStats, TopicMetrics, TopicStats,
};
use crate::error::{CoreError, ErrorCode};
use crate::stats::RateMeter;
use crate::subscription::dispatcher::failover::{choose_active, Placement};
use crate::subscription::dispatcher::ConsumerState;
use crate::topic::producers::TopicProducers;
use bytes::Bytes;
use magnetar_wire::{MessageId, SubscriptionType};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

/// Events for consumers, to deliver once the topic is no longer borrowed.
pub(crate) type Events = Vec<(ConsumerRef, ConsumerEvent)>;

/// One subscription: its type and its consumers, in attach order.
struct NpSub {
    sub_type: SubscriptionType,
    /// `permits` is what each may still be sent; `unacked` stays 0 (nothing
    /// is tracked after sending).
    consumers: Vec<ConsumerState>,
    /// Consumers whose connection has too much unwritten output: they miss
    /// messages (as one without permits does) until they have room again.
    paused: Vec<ConsumerRef>,
    /// Exclusive/Failover: the active consumer.
    active: Option<ConsumerRef>,
    /// Shared: where the round robin goes on.
    next: usize,
    /// Messages and bytes handed to its consumers.
    out: RateMeter,
}

impl NpSub {
    /// Recomputes the active consumer (Exclusive, Failover) and tells
    /// Failover consumers whose state changed.
    fn choose_active(&mut self, partition: i32, events: &mut Events) {
        if !matches!(self.sub_type, SubscriptionType::Exclusive | SubscriptionType::Failover) {
            return;
        }
        let now = choose_active(&self.consumers, &Placement::round_robin(partition));
        let old = std::mem::replace(&mut self.active, now);
        if old == now || self.sub_type != SubscriptionType::Failover {
            return;
        }
        let listed = |c: ConsumerRef| self.consumers.iter().any(|s| s.consumer == c);
        if let Some(o) = old.filter(|o| listed(*o)) {
            events.push((o, ConsumerEvent::ActiveChange { consumer_id: o.consumer_id, is_active: false }));
        }
        if let Some(n) = now {
            events.push((n, ConsumerEvent::ActiveChange { consumer_id: n.consumer_id, is_active: true }));
        }
    }

    /// The consumer that gets a message with key hash `key_hash` now, by
    /// the subscription's type; `None`: the subscription misses it.
    fn pick(&mut self, key_hash: u16) -> Option<usize> {
        let ready = |c: &ConsumerState, paused: &[ConsumerRef]| c.permits > 0 && !paused.contains(&c.consumer);
        let n = self.consumers.len();
        let i = match self.sub_type {
            SubscriptionType::Exclusive | SubscriptionType::Failover => {
                let active = self.active?;
                self.consumers.iter().position(|c| c.consumer == active)?
            }
            SubscriptionType::Shared => {
                let i = (0..n).map(|k| (self.next + k) % n).find(|&i| ready(&self.consumers[i], &self.paused))?;
                self.next = (i + 1) % n;
                i
            }
            // Even split of the hash space in attach order.
            SubscriptionType::KeyShared => usize::from(key_hash) * n / (usize::from(u16::MAX) + 1),
        };
        ready(self.consumers.get(i)?, &self.paused).then_some(i)
    }
}

pub(crate) struct NpTopic {
    pub(crate) key: String,
    partition: i32,
    next_id: Cell<u64>,
    pub(crate) producers: RefCell<TopicProducers>,
    subs: RefCell<HashMap<String, NpSub>>,
    /// Messages a subscription missed (no consumer permits), for the log.
    dropped: Cell<u64>,
    /// Messages and bytes published.
    rate_in: RateMeter,
}

impl NpTopic {
    pub(crate) fn new(key: String, partition: i32) -> Self {
        Self {
            key,
            partition,
            next_id: Cell::new(0),
            producers: RefCell::new(TopicProducers::default()),
            subs: RefCell::new(HashMap::new()),
            dropped: Cell::new(0),
            rate_in: RateMeter::default(),
        }
    }

    /// Consumers attached, over all subscriptions.
    pub(crate) fn consumer_count(&self) -> usize {
        self.subs.borrow().values().map(|s| s.consumers.len()).sum()
    }

    /// Attaches `consumer` to `sub` (created with its type when new);
    /// returns the events to deliver (Failover's active change).
    pub(crate) fn subscribe(
        &self,
        sub: &str,
        req: &crate::api::SubscribeRequest,
        consumer: ConsumerRef,
        max: u32,
    ) -> Result<Events, CoreError> {
        if !req.key_shared_ranges.is_empty() {
            return Err(CoreError::new(
                ErrorCode::NotAllowed,
                "Key_Shared sticky ranges are not supported on non-persistent topics",
            ));
        }
        if req.model.allocation != magnetar_wire::AllocationStrategy::RoundRobin {
            return Err(CoreError::new(
                ErrorCode::NotAllowed,
                "allocation strategies other than round-robin are not supported on non-persistent topics",
            ));
        }
        let count = self.consumer_count();
        let mut subs = self.subs.borrow_mut();
        let s = subs.entry(sub.to_string()).or_insert_with(|| NpSub {
            sub_type: req.sub_type,
            consumers: Vec::new(),
            paused: Vec::new(),
            active: None,
            next: 0,
            out: RateMeter::default(),
        });
        if s.consumers.iter().any(|c| c.consumer == consumer) {
            return Ok(Vec::new());
        }
        let refused = if s.sub_type == SubscriptionType::Exclusive && !s.consumers.is_empty() {
            Some(format!("exclusive subscription {sub:?} already has a consumer"))
        } else if s.sub_type != req.sub_type && !s.consumers.is_empty() {
            Some(format!(
                "subscription {sub:?} is {:?} and has consumers; cannot attach a {:?} consumer",
                s.sub_type, req.sub_type
            ))
        } else if max != 0 && count >= max as usize {
            Some(format!("topic {} reached the namespace's max_consumers_per_topic ({max})", self.key))
        } else {
            None
        };
        if let Some(why) = refused {
            if s.consumers.is_empty() {
                subs.remove(sub);
            }
            return Err(CoreError::new(ErrorCode::ConsumerBusy, why));
        }
        // An idle subscription does not exist (it vanished with its last
        // consumer), so the first consumer always sets the type.
        s.sub_type = req.sub_type;
        s.consumers.push(ConsumerState {
            consumer,
            name: req.consumer_name.clone(),
            priority: req.priority_level,
            permits: 0,
            unacked: 0,
            joined_at: None,
            address: req.client_address.clone(),
            redelivered: 0,
            zone: String::new(),
        });
        let mut events = Vec::new();
        let before = s.active;
        s.choose_active(self.partition, &mut events);
        if s.sub_type == SubscriptionType::Failover && s.active == before && s.active != Some(consumer) {
            // Not the active one: say so, so it knows it is a standby.
            events
                .push((consumer, ConsumerEvent::ActiveChange { consumer_id: consumer.consumer_id, is_active: false }));
        }
        Ok(events)
    }

    fn with_consumer(&self, sub: &str, consumer: ConsumerRef, f: impl FnOnce(&mut NpSub, usize)) {
        if let Some(s) = self.subs.borrow_mut().get_mut(sub) {
            if let Some(i) = s.consumers.iter().position(|c| c.consumer == consumer) {
                f(s, i);
            }
        }
    }

    pub(crate) fn flow(&self, sub: &str, consumer: ConsumerRef, permits: u32) {
        self.with_consumer(sub, consumer, |s, i| {
            s.consumers[i].permits = s.consumers[i].permits.saturating_add(u64::from(permits));
        });
    }

    pub(crate) fn pause(&self, sub: &str, consumer: ConsumerRef, paused: bool) {
        self.with_consumer(sub, consumer, |s, _| {
            s.paused.retain(|c| *c != consumer);
            if paused {
                s.paused.push(consumer);
            }
        });
    }

    /// Detaches `consumer`; the subscription goes with its last consumer.
    /// Returns the events to deliver (Failover's active change).
    pub(crate) fn unsubscribe(&self, sub: &str, consumer: ConsumerRef) -> Events {
        let mut events = Vec::new();
        let mut subs = self.subs.borrow_mut();
        let Some(s) = subs.get_mut(sub) else { return events };
        s.consumers.retain(|c| c.consumer != consumer);
        s.paused.retain(|c| *c != consumer);
        if s.consumers.is_empty() {
            subs.remove(sub);
        } else {
            s.choose_active(self.partition, &mut events);
        }
        events
    }

    pub(crate) fn has_consumer(&self, sub: &str, consumer: ConsumerRef) -> bool {
        self.subs.borrow().get(sub).is_some_and(|s| s.consumers.iter().any(|c| c.consumer == consumer))
    }

    /// Hands `blob` (key hash `key_hash`) to each subscription's chosen
    /// consumer that can take it now; returns the message's id and the
    /// events to deliver.
    pub(crate) fn publish(&self, blob: Bytes, num_messages: u32, key_hash: u16) -> (MessageId, Events) {
        let n = self.next_id.get();
        self.next_id.set(n + 1);
        let message_id = MessageId::new(0, n, self.partition, -1);
        let now = crate::clock::now_ms();
        let msgs = u64::from(num_messages.max(1));
        let bytes = blob.len() as u64;
        self.rate_in.record(now, msgs, bytes);
        let mut out = Vec::new();
        for s in self.subs.borrow_mut().values_mut() {
            let Some(i) = s.pick(key_hash) else {
                self.dropped.set(self.dropped.get() + 1);
                continue;
            };
            s.out.record(now, msgs, bytes);
            let c = &mut s.consumers[i];
            c.permits = c.permits.saturating_sub(msgs);
            out.push((
                c.consumer,
                ConsumerEvent::Message {
                    consumer_id: c.consumer.consumer_id,
                    message_id,
                    redelivery_count: 0,
                    blob: blob.clone(),
                    ack_set: Vec::new(),
                },
            ));
        }
        (message_id, out)
    }
}

impl NpTopic {
    /// Its figures for a metrics exporter: nothing is stored, so storage
    /// and backlogs are 0.
    pub(crate) fn metrics(&self) -> TopicMetrics {
        let now = crate::clock::now_ms();
        let (msg_rate_in, byte_rate_in) = self.rate_in.rates(now);
        let (msg_in_total, bytes_in_total) = self.rate_in.totals();
        let mut subscriptions: Vec<SubscriptionMetrics> = self
            .subs
            .borrow()
            .iter()
            .map(|(name, s)| {
                let (msg_rate_out, byte_rate_out) = s.out.rates(now);
                let (msg_out_total, bytes_out_total) = s.out.totals();
                SubscriptionMetrics {
                    name: name.clone(),
                    backlog_messages: 0,
                    unacked: 0,
                    delayed: 0,
                    msg_rate_out,
                    byte_rate_out,
                    msg_out_total,
                    bytes_out_total,
                    consumers: s.consumers.len() as u64,
                }
            })
            .collect();
        subscriptions.sort_by(|a, b| a.name.cmp(&b.name));
        TopicMetrics {
            topic: self.key.clone(),
            producers: self.producers.borrow().len() as u64,
            msg_rate_in,
            byte_rate_in,
            msg_in_total,
            bytes_in_total,
            storage_bytes: 0,
            subscriptions,
        }
    }

    /// Its statistics now: no ledgers, no backlog; `next_entry` counts the
    /// messages published since the topic was loaded.
    pub(crate) fn stats(&self) -> TopicStats {
        let now = crate::clock::now_ms();
        let (msg_rate_in, byte_rate_in) = self.rate_in.rates(now);
        let subs = self.subs.borrow();
        let mut names: Vec<&String> = subs.keys().collect();
        names.sort();
        let subscriptions = names
            .into_iter()
            .filter_map(|name| subs.get(name).map(|s| (name, s)))
            .map(|(name, s)| {
                let (msg_rate_out, byte_rate_out) = s.out.rates(now);
                let single = matches!(s.sub_type, SubscriptionType::Exclusive | SubscriptionType::Failover);
                let consumers = s
                    .consumers
                    .iter()
                    .map(|c| ConsumerStats {
                        name: c.name.clone(),
                        priority: c.priority,
                        permits: c.permits,
                        unacked: 0,
                        active: !single || s.active == Some(c.consumer),
                        address: c.address.clone(),
                        redelivered: 0,
                    })
                    .collect();
                SubscriptionStats {
                    name: name.clone(),
                    sub_type: s.sub_type,
                    ack_floor: 0,
                    msg_backlog: 0,
                    backlog_messages: 0,
                    backlog_bytes: 0,
                    unacked: 0,
                    delayed: 0,
                    replay: 0,
                    msg_out_total: s.out.totals().0,
                    msg_rate_out,
                    byte_rate_out,
                    durable: false,
                    filter_tag: None,
                    // The only strategy non-persistent topics take.
                    allocation: magnetar_wire::AllocationStrategy::RoundRobin.as_str(),
                    entries_read: 0,
                    skipped_by_index: 0,
                    partial_batches: 0,
                    consumers,
                }
            })
            .collect();
        TopicStats {
            topic: self.key.clone(),
            next_entry: self.next_id.get(),
            ledgers: Vec::new(),
            msg_rate_in,
            byte_rate_in,
            subscriptions,
        }
    }
}
