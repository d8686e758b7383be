//! Topics on their owner shard.
//!
//! A topic appends to its current ledger in its shard's entry log; its
//! ledgers roll over and old ones are deleted by retention (`ledgers.rs`,
//! `retention.rs`). Everything here counts in topic positions (numbering
//! the topic's entries across ledgers); message ids are made from them at
//! the edges. Owned by the topic's shard; never crosses cores.
//!
//! The topic's behaviour (publish and rollover in `publish.rs`; loading,
//! creating, deleting and the last id in `load.rs`; deduplication's
//! loading in `dedup.rs`; producers in `producers.rs`; retention's
//! decisions in `retention.rs`) takes what it needs of its shard as a
//! [`TopicCtx`]. The shard keeps the registry of topics and the routing.

pub mod dedup;
pub mod ledgers;
pub(crate) mod load;
pub(crate) mod producers;
pub(crate) mod publish;
pub(crate) mod retention;

use crate::config::BrokerConfig;
use crate::error::{CoreError, ErrorCode};
use crate::store::{LedgerIds, Store};
use crate::subscription::Subscription;
use crate::topic_name::TopicName;
use ledgers::{Lookup, TopicLedgers};
use magnetar_storage::EntryLog;
use magnetar_wire::MessageId;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// What a topic's operations use of the shard that owns it: its log, its
/// records, its configuration and its ledger ids. Borrowed for one call.
#[derive(Clone, Copy)]
pub(crate) struct TopicCtx<'a> {
    pub(crate) log: &'a EntryLog,
    pub(crate) store: &'a Store,
    pub(crate) config: &'a BrokerConfig,
    pub(crate) ledger_ids: &'a LedgerIds,
    /// Set when the shard shut down: waits for appends in flight end.
    pub(crate) closed: &'a Cell<bool>,
}

pub(crate) struct Topic {
    #[allow(dead_code)]
    pub(crate) name: TopicName,
    /// The full name, `persistent://tenant/ns/local`.
    pub(crate) key: String,
    /// The topic's ledgers, the last one current.
    pub(crate) ledgers: RefCell<TopicLedgers>,
    /// Partition index, or -1 for a non-partitioned topic.
    pub(crate) partition: i32,
    /// Position the next append gets.
    pub(crate) next_entry: Cell<u64>,
    /// Positions below this are durable and may be dispatched.
    pub(crate) durable_next: Cell<u64>,
    pub(crate) producers: RefCell<crate::topic::producers::TopicProducers>,
    /// Set when the topic was deleted: its dispatchers stop.
    pub(crate) deleted: Cell<bool>,
    pub(crate) dedup: crate::topic::dedup::Dedup,
    pub(crate) subs: RefCell<HashMap<String, Rc<Subscription>>>,
    /// Messages and bytes appended (the subscriptions' rate in).
    pub(crate) rate_in: crate::stats::RateMeter,
    /// Messages per batch entry, for backlogs in messages.
    pub(crate) batch_sizes: crate::stats::BatchSizes,
    /// When the shard's unload sweep first found the topic idle (ms since
    /// the epoch; 0: not idle at its last look). See `shard/unload.rs`.
    pub(crate) idle_since_ms: Cell<u64>,
}

impl Topic {
    pub(crate) fn new(name: TopicName, key: String, ledgers: TopicLedgers, partition: i32) -> Self {
        let next_entry = ledgers.next();
        Self {
            name,
            key,
            ledgers: RefCell::new(ledgers),
            partition,
            next_entry: Cell::new(next_entry),
            // Everything recovered from the log is durable.
            durable_next: Cell::new(next_entry),
            producers: RefCell::new(crate::topic::producers::TopicProducers::default()),
            deleted: Cell::new(false),
            dedup: crate::topic::dedup::Dedup::default(),
            subs: RefCell::new(HashMap::new()),
            rate_in: Default::default(),
            batch_sizes: Default::default(),
            idle_since_ms: Cell::new(0),
        }
    }

    /// The message id of a stored position.
    pub(crate) fn message_id(&self, pos: u64) -> Option<MessageId> {
        self.ledgers.borrow().message_id(pos, self.partition)
    }

    /// The position of `id` if it is one of this topic's appended
    /// entries: `Ok(None)` when retention deleted its ledger, an error when
    /// it is not a message of this topic.
    pub(crate) fn position_of(&self, id: &MessageId) -> Result<Option<u64>, CoreError> {
        match self.ledgers.borrow().lookup(id.ledger, id.entry) {
            Lookup::At(p) if p < self.next_entry.get() => Ok(Some(p)),
            Lookup::Trimmed => Ok(None),
            _ => Err(CoreError::new(ErrorCode::NotAllowed, format!("{id}: no such message on this topic"))),
        }
    }

    /// Records that position `pos` holds `messages` messages (for backlogs
    /// in messages); batches every subscription acknowledged are pruned.
    pub(crate) fn note_messages(&self, pos: u64, messages: u32) {
        self.batch_sizes.note(pos, messages, || {
            let floor = self.subs.borrow().values().map(|s| s.cursor.borrow().ack_floor).min();
            floor.unwrap_or(self.next_entry.get())
        });
    }

    /// Marks the topic deleted: its dispatchers stop at their next wake-up.
    pub(crate) fn mark_deleted(&self) {
        self.deleted.set(true);
        for s in self.subs.borrow().values() {
            s.wake.notify();
        }
    }

    /// Whether dropping the topic from memory would lose or change nothing:
    /// no producer (attached, waiting or fenced), no append waiting to be
    /// durable, no unwritten deduplication snapshot, and every subscription
    /// durable with nothing that lives only in memory
    /// ([`Subscription::unloadable`]). What is left is in the log, and
    /// loading the topic again rebuilds it as a restart does. A
    /// subscription's strong references must be its topic's map and its
    /// dispatcher only (no task holds it across an await). The shard checks
    /// the same of the topic itself (`shard/unload.rs`).
    pub(crate) fn unloadable(&self) -> bool {
        !self.deleted.get()
            && self.producers.borrow().is_idle()
            && self.next_entry.get() == self.durable_next.get()
            && !self.dedup.dirty.get()
            && !self.dedup.loading.get()
            && self.subs.borrow().values().all(|s| Rc::strong_count(s) <= 2 && s.unloadable())
    }

    /// Producers and consumers attached.
    pub(crate) fn attached(&self) -> (usize, usize) {
        let consumers = self.subs.borrow().values().map(|s| s.consumer_count()).sum();
        (self.producers.borrow().len(), consumers)
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
