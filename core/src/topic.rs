//! Topics and subscriptions on their owner shard.
//!
//! A topic appends to one ledger of its shard's entry log. Each subscription
//! has a cursor and a dispatcher task that reads durable entries in log order
//! and hands them to its consumer within the consumer's flow permits. All of
//! this is owned by the topic's shard and never crosses cores.

use crate::cursor::Cursor;
use crate::error::{CoreError, ErrorCode};
use crate::shard::{ConsumerEvent, ConsumerRef, Shard};
use crate::signal::Signal;
use crate::topic_name::TopicName;
use magnetar_wire::{AckType, MessageId, SubscriptionType};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

pub(crate) struct Topic {
    #[allow(dead_code)]
    pub(crate) name: TopicName,
    /// The full name, `persistent://tenant/ns/local`.
    pub(crate) key: String,
    pub(crate) ledger: u64,
    /// Partition index, or -1 for a non-partitioned topic.
    pub(crate) partition: i32,
    /// Next entry id the log will assign.
    pub(crate) next_entry: Cell<u64>,
    /// Entries below this are durable and may be dispatched.
    pub(crate) durable_next: Cell<u64>,
    pub(crate) producers: RefCell<crate::producers::TopicProducers>,
    /// Set when the topic was deleted: its dispatchers stop.
    pub(crate) deleted: Cell<bool>,
    pub(crate) dedup: crate::dedup::Dedup,
    pub(crate) subs: RefCell<HashMap<String, Rc<Subscription>>>,
}

impl Topic {
    pub(crate) fn new(name: TopicName, key: String, ledger: u64, partition: i32, next_entry: u64) -> Self {
        Self {
            name,
            key,
            ledger,
            partition,
            next_entry: Cell::new(next_entry),
            // Everything recovered from the log is durable.
            durable_next: Cell::new(next_entry),
            producers: RefCell::new(crate::producers::TopicProducers::default()),
            deleted: Cell::new(false),
            dedup: crate::dedup::Dedup::default(),
            subs: RefCell::new(HashMap::new()),
        }
    }

    /// Called when `entry` became durable: wake the dispatchers.
    pub(crate) fn on_durable(&self, entry: u64) {
        if entry >= self.durable_next.get() {
            self.durable_next.set(entry + 1);
            for s in self.subs.borrow().values() {
                s.wake.notify();
            }
        }
    }
}

struct ActiveConsumer {
    consumer: ConsumerRef,
    permits: u64,
}

pub(crate) struct Subscription {
    pub(crate) name: String,
    #[allow(dead_code)]
    pub(crate) sub_type: SubscriptionType,
    pub(crate) durable: bool,
    pub(crate) cursor: RefCell<Cursor>,
    /// Next entry the dispatcher looks at.
    read_pos: Cell<u64>,
    consumer: RefCell<Option<ActiveConsumer>>,
    /// Bumped whenever the consumer changes, so an in-flight read for the old
    /// consumer is not delivered to the new one.
    generation: Cell<u64>,
    /// Deliveries per entry not yet acknowledged (for the redelivery count).
    deliveries: RefCell<HashMap<u64, u32>>,
    pub(crate) wake: Signal,
    /// Set when a non-durable subscription lost its last consumer and was
    /// dropped: its dispatcher stops.
    pub(crate) removed: Cell<bool>,
    pub(crate) dirty: Cell<bool>,
    /// Log position of the last cursor record written (0: none this run).
    pub(crate) persisted_lsn: Cell<u64>,
}

impl Subscription {
    pub(crate) fn new(name: String, sub_type: SubscriptionType, durable: bool, cursor: Cursor) -> Rc<Self> {
        let read_pos = cursor.ack_floor;
        Rc::new(Self {
            name,
            sub_type,
            durable,
            cursor: RefCell::new(cursor),
            read_pos: Cell::new(read_pos),
            consumer: RefCell::new(None),
            generation: Cell::new(0),
            deliveries: RefCell::new(HashMap::new()),
            wake: Signal::new(),
            removed: Cell::new(false),
            dirty: Cell::new(false),
            persisted_lsn: Cell::new(0),
        })
    }

    /// Consumers attached now (for the max-consumers policy).
    pub(crate) fn consumer_count(&self) -> usize {
        usize::from(self.consumer.borrow().is_some())
    }

    pub(crate) fn has_consumer(&self, c: ConsumerRef) -> bool {
        self.consumer.borrow().as_ref().is_some_and(|a| a.consumer == c)
    }

    /// Exclusive: one consumer at a time; a second one is refused.
    pub(crate) fn add_consumer(&self, c: ConsumerRef) -> Result<(), CoreError> {
        let mut slot = self.consumer.borrow_mut();
        if let Some(active) = slot.as_ref() {
            if active.consumer != c {
                return Err(CoreError::new(
                    ErrorCode::ConsumerBusy,
                    format!("exclusive subscription {:?} already has a consumer", self.name),
                ));
            }
            return Ok(());
        }
        *slot = Some(ActiveConsumer { consumer: c, permits: 0 });
        self.generation.set(self.generation.get() + 1);
        // Start from the first unacknowledged entry: whatever the previous
        // consumer received but did not acknowledge is delivered again.
        self.read_pos.set(self.cursor.borrow().ack_floor);
        self.wake.notify();
        Ok(())
    }

    pub(crate) fn remove_consumer(&self, c: ConsumerRef) {
        let mut slot = self.consumer.borrow_mut();
        if slot.as_ref().is_some_and(|a| a.consumer == c) {
            *slot = None;
            self.generation.set(self.generation.get() + 1);
            self.read_pos.set(self.cursor.borrow().ack_floor);
        }
    }

    pub(crate) fn flow(&self, c: ConsumerRef, permits: u32) {
        if let Some(active) = self.consumer.borrow_mut().as_mut() {
            if active.consumer == c {
                active.permits = active.permits.saturating_add(u64::from(permits));
                self.wake.notify();
            }
        }
    }

    /// Applies acks against the topic's `ledger`, whose next entry is
    /// `next_entry`. Returns whether the cursor changed.
    pub(crate) fn ack(
        &self,
        ledger: u64,
        next_entry: u64,
        ack_type: AckType,
        ids: &[MessageId],
    ) -> Result<bool, CoreError> {
        let mut cursor = self.cursor.borrow_mut();
        let mut changed = false;
        for id in ids {
            if id.ledger != ledger || id.entry >= next_entry {
                return Err(CoreError::new(
                    ErrorCode::NotAllowed,
                    format!("ack of {id}: no such message on this topic"),
                ));
            }
            changed |= match ack_type {
                AckType::Individual => cursor.ack(id.entry),
                AckType::Cumulative => cursor.ack_cumulative(id.entry),
            };
        }
        if changed {
            let mut d = self.deliveries.borrow_mut();
            d.retain(|e, _| !cursor.is_acked(*e));
        }
        Ok(changed)
    }
}

/// Starts the dispatcher of `sub`: it runs until the shard closes.
pub(crate) fn spawn_dispatcher(shard: Rc<Shard>, topic: Rc<Topic>, sub: Rc<Subscription>) {
    glommio::spawn_local(async move { dispatch_loop(shard, topic, sub).await }).detach();
}

async fn dispatch_loop(shard: Rc<Shard>, topic: Rc<Topic>, sub: Rc<Subscription>) {
    loop {
        sub.wake.wait().await;
        if shard.is_closed() || topic.deleted.get() || sub.removed.get() {
            return;
        }
        loop {
            let (consumer, generation) = match sub.consumer.borrow().as_ref() {
                Some(a) if a.permits > 0 => (a.consumer, sub.generation.get()),
                _ => break,
            };
            let pos = sub.read_pos.get();
            if pos >= topic.durable_next.get() {
                break;
            }
            if sub.cursor.borrow().is_acked(pos) {
                sub.read_pos.set(pos + 1);
                continue;
            }
            let blob = match shard.log.read(topic.ledger, pos).await {
                Ok(b) => b,
                Err(e) => {
                    // Unreadable data (failed checksum, I/O error) is never
                    // served: the consumer is closed with the reason.
                    tracing::error!(topic = %topic.key, entry = pos, "read failed: {e}");
                    if sub.generation.get() == generation {
                        sub.remove_consumer(consumer);
                        shard.deliver(
                            consumer,
                            ConsumerEvent::Closed {
                                consumer_id: consumer.consumer_id,
                                code: ErrorCode::PersistenceError,
                                message: format!("cannot read entry {pos} of {}: {e}", topic.key),
                            },
                        );
                    }
                    break;
                }
            };
            if sub.generation.get() != generation || sub.read_pos.get() != pos || shard.is_closed() {
                continue;
            }
            let redelivery_count = {
                let mut d = sub.deliveries.borrow_mut();
                let n = d.entry(pos).or_insert(0);
                *n += 1;
                *n - 1
            };
            // Permits count messages: a batch takes as many as it holds
            // (it goes out whole, even past the consumer's last permits).
            let messages = magnetar_wire::peek_message(&blob).map_or(1, |p| u64::from(p.num_messages.max(1)));
            if let Some(a) = sub.consumer.borrow_mut().as_mut() {
                a.permits = a.permits.saturating_sub(messages);
            }
            sub.read_pos.set(pos + 1);
            let message_id = MessageId::new(topic.ledger, pos, topic.partition, -1);
            shard.deliver(
                consumer,
                ConsumerEvent::Message { consumer_id: consumer.consumer_id, message_id, redelivery_count, blob },
            );
        }
    }
}
