//! Non-persistent topics (`non-persistent://…`): messages live only in
//! memory, on their way from the producer to the consumers connected at that
//! moment. A send is acknowledged as soon as it was handed to the
//! subscriptions (nothing touches the disk); a subscription whose consumer
//! has no flow permits left, or that has no consumer, misses the message; a
//! broker restart or a dropped connection loses whatever was in flight; acks
//! are accepted and ignored (nothing is redelivered). Message ids are
//! `0:N:P:-1` with N counting this topic's messages since the broker started.
//! Subscriptions are Exclusive and vanish with their consumer.
//!
//! Owned by the topic's shard; never crosses cores.

use crate::api::{ConsumerEvent, ConsumerRef};
use crate::error::{CoreError, ErrorCode};
use crate::topic::producers::TopicProducers;
use bytes::Bytes;
use magnetar_wire::MessageId;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;

struct Attached {
    consumer: ConsumerRef,
    permits: u64,
    /// Its connection has too much unwritten output: it misses messages
    /// (as one without permits does) until it has room again.
    paused: bool,
}

pub(crate) struct NpTopic {
    pub(crate) key: String,
    partition: i32,
    next_id: Cell<u64>,
    pub(crate) producers: RefCell<TopicProducers>,
    subs: RefCell<HashMap<String, Attached>>,
    /// Messages a subscription missed (no consumer permits), for the log.
    dropped: Cell<u64>,
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
        }
    }

    pub(crate) fn consumer_count(&self) -> usize {
        self.subs.borrow().len()
    }

    pub(crate) fn subscribe(&self, sub: &str, consumer: ConsumerRef, max: u32) -> Result<(), CoreError> {
        let mut subs = self.subs.borrow_mut();
        if let Some(a) = subs.get(sub) {
            if a.consumer != consumer {
                return Err(CoreError::new(
                    ErrorCode::ConsumerBusy,
                    format!("exclusive subscription {sub:?} already has a consumer"),
                ));
            }
            return Ok(());
        }
        if max != 0 && subs.len() >= max as usize {
            return Err(CoreError::new(
                ErrorCode::ConsumerBusy,
                format!("topic {} reached the namespace's max_consumers_per_topic ({max})", self.key),
            ));
        }
        subs.insert(sub.to_string(), Attached { consumer, permits: 0, paused: false });
        Ok(())
    }

    pub(crate) fn flow(&self, sub: &str, consumer: ConsumerRef, permits: u32) {
        if let Some(a) = self.subs.borrow_mut().get_mut(sub) {
            if a.consumer == consumer {
                a.permits = a.permits.saturating_add(u64::from(permits));
            }
        }
    }

    pub(crate) fn pause(&self, sub: &str, consumer: ConsumerRef, paused: bool) {
        if let Some(a) = self.subs.borrow_mut().get_mut(sub) {
            if a.consumer == consumer {
                a.paused = paused;
            }
        }
    }

    pub(crate) fn unsubscribe(&self, sub: &str, consumer: ConsumerRef) {
        let mut subs = self.subs.borrow_mut();
        if subs.get(sub).is_some_and(|a| a.consumer == consumer) {
            subs.remove(sub);
        }
    }

    pub(crate) fn has_consumer(&self, sub: &str, consumer: ConsumerRef) -> bool {
        self.subs.borrow().get(sub).is_some_and(|a| a.consumer == consumer)
    }

    /// Hands `blob` to every subscription that can take it now; returns the
    /// message's id and the events to deliver.
    pub(crate) fn publish(&self, blob: Bytes, num_messages: u32) -> (MessageId, Vec<(ConsumerRef, ConsumerEvent)>) {
        let n = self.next_id.get();
        self.next_id.set(n + 1);
        let message_id = MessageId::new(0, n, self.partition, -1);
        let mut out = Vec::new();
        for a in self.subs.borrow_mut().values_mut() {
            if a.permits == 0 || a.paused {
                self.dropped.set(self.dropped.get() + 1);
                continue;
            }
            a.permits = a.permits.saturating_sub(u64::from(num_messages.max(1)));
            out.push((
                a.consumer,
                ConsumerEvent::Message {
                    consumer_id: a.consumer.consumer_id,
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
