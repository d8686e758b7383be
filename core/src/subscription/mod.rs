//! Subscriptions on their topic's owner shard.
//!
//! Each subscription has a cursor, its consumers, the entries delivered and
//! not acknowledged (with the consumer holding each), and a dispatcher task
//! (`dispatcher::task`) that hands entries to consumers within their flow
//! permits. Owned by the topic's shard; never crosses cores.

pub(crate) mod ack_set;
mod admin;
pub mod cursor;
pub(crate) mod delayed;
pub(crate) mod dispatcher;
pub(crate) mod pending;
pub(crate) mod persist;
pub(crate) mod requests;
pub mod sub_state;
#[cfg(test)]
mod tests;

use crate::api::{ConsumerEvent, ConsumerRef};
use crate::error::{CoreError, ErrorCode};
use crate::signal::Signal;
use crate::topic::ledgers::TopicLedgers;
use crate::topic::Topic;
use cursor::Cursor;
use delayed::DelayedIndex;
use dispatcher::context::DeliverySink;
use dispatcher::{failover, ConsumerState, Policy};
use magnetar_wire::{AckType, AllocationStrategy, MessageId, SubscriptionType};
use pending::PendingMap;
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::rc::Rc;

/// An entry sent to a consumer and not yet acknowledged.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Pending {
    pub(crate) consumer: ConsumerRef,
    pub(crate) key_hash: u16,
    /// Messages in the entry (a batch holds several): the size a
    /// batch-index ack of it must name.
    pub(crate) num_messages: u32,
    /// Times the entry was delivered, this delivery included (its count
    /// moves to `Subscription::deliveries` when it leaves the consumer
    /// unacknowledged).
    pub(crate) deliveries: u32,
}

pub(crate) struct Subscription {
    pub(crate) name: String,
    pub(crate) sub_type: Cell<SubscriptionType>,
    pub(crate) durable: bool,
    pub(crate) cursor: RefCell<Cursor>,
    /// Next fresh entry the dispatcher looks at.
    pub(crate) read_pos: Cell<u64>,
    pub(crate) consumers: RefCell<Vec<ConsumerState>>,
    pub(crate) policy: RefCell<Policy>,
    /// Delivered, not acknowledged: entry -> who holds it.
    pub(crate) pending: RefCell<PendingMap>,
    /// To deliver again before any fresh entry, in log order: entry -> key hash.
    pub(crate) replay: RefCell<BTreeMap<u64, u16>>,
    pub(crate) delayed: RefCell<DelayedIndex>,
    /// Times delivered, for the redelivery count, of entries not
    /// acknowledged and held by no consumer now (taken back from one, or
    /// restored from the state record). An entry a consumer holds keeps its
    /// count in `Pending::deliveries`, so a first delivery and its ack touch
    /// no map here: on a catch-up every delivered entry would otherwise cost
    /// a table insert and remove, with their cache misses.
    pub(crate) deliveries: RefCell<HashMap<u64, u32>>,
    /// Only entries with this tag are delivered; others count as acknowledged.
    pub(crate) filter_tag: RefCell<Option<String>>,
    /// Partition index of the topic (Failover spreads partitions by it).
    pub(crate) partition: i32,
    /// The partitioned topic's partition count, the largest a subscribe
    /// reported (0: not a partition, or not known yet). Average and Zone
    /// allocation need it.
    pub(crate) partitions: Cell<u32>,
    /// Failover's allocation strategy and partition zones (persisted).
    pub(crate) allocation: RefCell<Allocation>,
    /// Messages sent to consumers since the subscription was loaded.
    pub(crate) delivered_total: Cell<u64>,
    pub(crate) wake: Signal,
    /// Set when a non-durable subscription lost its last consumer and was
    /// dropped: its dispatcher stops.
    pub(crate) removed: Cell<bool>,
    pub(crate) dirty: Cell<bool>,
    /// Log position of the last cursor record written (0: none this run).
    pub(crate) persisted_lsn: Cell<u64>,
    /// Batch entries partly acknowledged (batch-index acks).
    pub(crate) batch_acks: RefCell<crate::subscription::sub_state::BatchAcks>,
    /// The `s/` record (type, filter, batch acks, redelivery counts)
    /// changed since it was last written.
    pub(crate) state_dirty: Cell<bool>,
    /// A redelivery count changed since the state record was last written
    /// (written at most once per `REDELIVERY_COUNTS_PERSIST_INTERVAL_MS`).
    pub(crate) counts_dirty: Cell<bool>,
    /// When the state record was last written (ms since the epoch; 0: not
    /// this run).
    pub(crate) state_written_ms: Cell<u64>,
    /// After a restart: until this time (ms since the epoch) an idle
    /// subscription refuses a consumer of another type than the one it had,
    /// so its own consumers can come back (0: no hold).
    pub(crate) type_held_until_ms: Cell<u64>,
    /// Dispatch counters and the outgoing rate (stats).
    pub(crate) counters: crate::stats::SubCounters,
    /// Fresh entries read from disk in one run and not yet looked at.
    pub(crate) ahead: RefCell<crate::subscription::dispatcher::task::ReadAhead>,
    /// Consumers whose connection has too much unwritten output, with the
    /// permits set aside while they are paused: a paused consumer has no
    /// permits, so the dispatcher reads nothing for it and skips it.
    pub(crate) paused: RefCell<HashMap<ConsumerRef, u64>>,
    /// The position of the entry the dispatcher last found damaged on disk
    /// (failed verification), which it never serves; the subscription waits
    /// at it until `skip_damaged` moves past it.
    pub(crate) damaged: Cell<Option<u64>>,
}

/// How a Failover subscription spreads partitions over its consumers; kept
/// with the subscription (its state record), like its type.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Allocation {
    pub(crate) strategy: AllocationStrategy,
    /// Zone strategy: item `i` is partition `i`'s zone label.
    pub(crate) partition_zones: Vec<String>,
}

pub(crate) fn policy_for(t: SubscriptionType) -> Policy {
    match t {
        SubscriptionType::Exclusive | SubscriptionType::Failover => Policy::Single(failover::Active::default()),
        SubscriptionType::Shared => Policy::Shared(Default::default()),
        SubscriptionType::KeyShared => Policy::KeyShared(Default::default()),
    }
}

/// What a new consumer asks for.
pub(crate) struct NewConsumer {
    pub(crate) consumer: ConsumerRef,
    pub(crate) sub_type: SubscriptionType,
    pub(crate) name: String,
    pub(crate) priority: i32,
    pub(crate) filter_tag: String,
    /// Key_Shared sticky ranges (inclusive), already checked; empty = auto.
    pub(crate) key_shared_ranges: Vec<(u32, u32)>,
    /// For stats only.
    pub(crate) address: String,
    /// Its zone label (Zone allocation).
    pub(crate) zone: String,
    /// The allocation it asks for; the subscription's when it has
    /// consumers already (else refused).
    pub(crate) allocation: Allocation,
    /// The partitioned topic's partition count (0: not a partition).
    pub(crate) partitions: u32,
}

impl Subscription {
    pub(crate) fn new(
        name: String,
        sub_type: SubscriptionType,
        durable: bool,
        cursor: Cursor,
        partition: i32,
        delayed_index_max: usize,
    ) -> Rc<Self> {
        let read_pos = cursor.ack_floor;
        Rc::new(Self {
            name,
            sub_type: Cell::new(sub_type),
            durable,
            cursor: RefCell::new(cursor),
            read_pos: Cell::new(read_pos),
            consumers: RefCell::new(Vec::new()),
            paused: RefCell::new(HashMap::new()),
            policy: RefCell::new(policy_for(sub_type)),
            pending: RefCell::new(PendingMap::default()),
            replay: RefCell::new(BTreeMap::new()),
            delayed: RefCell::new(DelayedIndex::new(delayed_index_max)),
            deliveries: RefCell::new(HashMap::new()),
            filter_tag: RefCell::new(None),
            partition,
            partitions: Cell::new(0),
            allocation: RefCell::new(Allocation::default()),
            delivered_total: Cell::new(0),
            wake: Signal::new(),
            removed: Cell::new(false),
            dirty: Cell::new(false),
            persisted_lsn: Cell::new(0),
            batch_acks: RefCell::new(Default::default()),
            // A new subscription's type is news to the log.
            state_dirty: Cell::new(true),
            counts_dirty: Cell::new(false),
            state_written_ms: Cell::new(0),
            type_held_until_ms: Cell::new(0),
            counters: Default::default(),
            ahead: RefCell::new(Default::default()),
            damaged: Cell::new(None),
        })
    }

    /// Whether the subscription holds nothing that exists only in memory:
    /// durable, no consumer (so nothing delivered and unacknowledged, none
    /// paused), and its cursor, state record and redelivery counts written.
    /// Entries set aside for replay and the delayed-delivery index are
    /// rebuilt from the cursor when the topic loads again, as after a
    /// restart (the dispatcher reads again from the ack floor); a type hold
    /// counts from the shard's start, so loading again restores its end.
    pub(crate) fn unloadable(&self) -> bool {
        self.durable
            && !self.removed.get()
            && self.consumers.borrow().is_empty()
            && self.pending.borrow().len() == 0
            && self.paused.borrow().is_empty()
            && !self.dirty.get()
            && !self.state_dirty.get()
            && !self.counts_dirty.get()
    }

    /// Consumers attached now (for the max-consumers policy).
    pub(crate) fn consumer_count(&self) -> usize {
        self.consumers.borrow().len()
    }

    pub(crate) fn has_consumer(&self, c: ConsumerRef) -> bool {
        self.consumers.borrow().iter().any(|s| s.consumer == c)
    }

    /// Attaches a consumer. Exclusive refuses a second one; a subscription
    /// with consumers refuses one of another type; an idle subscription
    /// takes the type (and tag filter) of its new consumer.
    pub(crate) fn add_consumer(&self, sink: &impl DeliverySink, new: NewConsumer) -> Result<(), CoreError> {
        let c = new.consumer;
        if self.has_consumer(c) {
            return Ok(());
        }
        let mut consumers = self.consumers.borrow_mut();
        if consumers.is_empty() {
            crate::subscription::sub_state::check_type_hold(self, new.sub_type, crate::clock::now_ms())?;
            if self.sub_type.get() != new.sub_type {
                self.sub_type.set(new.sub_type);
                *self.policy.borrow_mut() = policy_for(new.sub_type);
                self.state_dirty.set(true);
            }
            let filter = (!new.filter_tag.is_empty()).then_some(new.filter_tag);
            if *self.filter_tag.borrow() != filter {
                *self.filter_tag.borrow_mut() = filter;
                self.state_dirty.set(true);
            }
            if *self.allocation.borrow() != new.allocation {
                *self.allocation.borrow_mut() = new.allocation;
                self.state_dirty.set(true);
            }
        } else if self.sub_type.get() == SubscriptionType::Exclusive {
            return Err(CoreError::new(
                ErrorCode::ConsumerBusy,
                format!("exclusive subscription {:?} already has a consumer", self.name),
            ));
        } else if self.sub_type.get() != new.sub_type {
            return Err(CoreError::new(
                ErrorCode::ConsumerBusy,
                format!(
                    "subscription {:?} is {:?} and has consumers; cannot attach a {:?} consumer",
                    self.name,
                    self.sub_type.get(),
                    new.sub_type
                ),
            ));
        } else if self.filter_tag.borrow().as_deref().unwrap_or("") != new.filter_tag {
            // Handing it the existing filter silently would deliver it
            // messages it did not ask for (or hide the ones it did).
            return Err(CoreError::new(
                ErrorCode::ConsumerBusy,
                format!(
                    "subscription {:?} has consumers with tag filter {:?}; cannot attach a consumer with filter {:?}",
                    self.name,
                    self.filter_tag.borrow().as_deref().unwrap_or(""),
                    new.filter_tag
                ),
            ));
        } else if *self.allocation.borrow() != new.allocation {
            // Admitted, it would own partitions by a strategy it did not
            // ask for.
            let a = self.allocation.borrow();
            return Err(CoreError::new(
                ErrorCode::ConsumerBusy,
                format!(
                    "subscription {:?} has consumers with allocation {} (partition zones {:?}); \
                     cannot attach a consumer with allocation {} (partition zones {:?})",
                    self.name,
                    a.strategy.as_str(),
                    a.partition_zones,
                    new.allocation.strategy.as_str(),
                    new.allocation.partition_zones
                ),
            ));
        }
        // Partitions only grow: the largest count reported is the current one.
        if new.partitions > self.partitions.get() {
            self.partitions.set(new.partitions);
        }
        if let Policy::KeyShared(ranges) = &mut *self.policy.borrow_mut() {
            // Before the consumer is listed: a refused one leaves no trace.
            ranges.admit(c, &new.key_shared_ranges, &consumers)?;
        }
        consumers.push(ConsumerState {
            consumer: c,
            name: new.name,
            priority: new.priority,
            permits: 0,
            unacked: 0,
            joined_at: None,
            address: new.address,
            redelivered: 0,
            zone: new.zone,
        });
        match &mut *self.policy.borrow_mut() {
            Policy::Single(active) => {
                let change = self.choose_active(active, &consumers);
                drop(consumers);
                match change {
                    Some((old, now)) => self.active_changed(sink, old, now),
                    // Not the active one: say so, so it knows it is a standby.
                    None if self.sub_type.get() == SubscriptionType::Failover => {
                        sink.deliver(c, ConsumerEvent::ActiveChange { consumer_id: c.consumer_id, is_active: false })
                    }
                    None => {}
                }
            }
            Policy::Shared(_) => {}
            Policy::KeyShared(ranges) => {
                // Admitted above. Sticky needs no joined_at (see key_shared).
                if let Some(me) = consumers.last_mut().filter(|_| !ranges.is_sticky()) {
                    me.joined_at = Some(self.read_pos.get());
                }
            }
        }
        self.wake.notify();
        Ok(())
    }

    /// Recomputes the active consumer of this partition by the allocation
    /// strategy; returns `(old, new)` when it changed.
    fn choose_active(
        &self,
        active: &mut failover::Active,
        consumers: &[ConsumerState],
    ) -> Option<(Option<ConsumerRef>, Option<ConsumerRef>)> {
        let a = self.allocation.borrow();
        let placement = failover::Placement {
            strategy: a.strategy,
            partition: self.partition,
            partitions: self.partitions.get(),
            partition_zones: &a.partition_zones,
        };
        active.choose(consumers, &placement)
    }

    /// The active consumer of a Failover/Exclusive subscription changed:
    /// whatever the old one held goes back for the new one, in log order,
    /// and both are told.
    fn active_changed(&self, sink: &impl DeliverySink, old: Option<ConsumerRef>, now: Option<ConsumerRef>) {
        self.take_back(|_, _| true);
        let failover = self.sub_type.get() == SubscriptionType::Failover;
        if let Some(o) = old.filter(|o| failover && self.has_consumer(*o)) {
            sink.deliver(o, ConsumerEvent::ActiveChange { consumer_id: o.consumer_id, is_active: false });
        }
        if let Some(n) = now.filter(|_| failover) {
            sink.deliver(n, ConsumerEvent::ActiveChange { consumer_id: n.consumer_id, is_active: true });
        }
    }

    /// Moves pending entries matching `which` back to the replay set.
    /// Returns how many moved.
    fn take_back(&self, which: impl Fn(u64, &Pending) -> bool) -> usize {
        let mut pending = self.pending.borrow_mut();
        let mut replay = self.replay.borrow_mut();
        let mut deliveries = self.deliveries.borrow_mut();
        let mut consumers = self.consumers.borrow_mut();
        let taken: Vec<u64> = pending.iter().filter(|(e, p)| which(*e, p)).map(|(e, _)| e).collect();
        for e in &taken {
            if let Some(p) = pending.remove(*e) {
                replay.insert(*e, p.key_hash);
                deliveries.insert(*e, p.deliveries);
                if let Some(c) = consumers.iter_mut().find(|c| c.consumer == p.consumer) {
                    c.take_back_one(*e);
                }
            }
        }
        taken.len()
    }

    pub(crate) fn remove_consumer(&self, sink: &impl DeliverySink, c: ConsumerRef) {
        if !self.has_consumer(c) {
            return;
        }
        // Its unacknowledged entries go to the others (or the next consumer).
        self.take_back(|_, p| p.consumer == c);
        self.consumers.borrow_mut().retain(|s| s.consumer != c);
        self.paused.borrow_mut().remove(&c);
        let change = match &mut *self.policy.borrow_mut() {
            Policy::Single(active) => self.choose_active(active, &self.consumers.borrow()),
            Policy::Shared(_) => None,
            Policy::KeyShared(ranges) => {
                ranges.remove(c);
                None
            }
        };
        if let Some((old, now)) = change {
            self.active_changed(sink, old, now);
        }
        self.wake.notify();
    }

    pub(crate) fn flow(&self, c: ConsumerRef, permits: u32) {
        if let Some(held) = self.paused.borrow_mut().get_mut(&c) {
            *held = held.saturating_add(u64::from(permits));
            return;
        }
        if let Some(s) = self.consumers.borrow_mut().iter_mut().find(|s| s.consumer == c) {
            s.permits = s.permits.saturating_add(u64::from(permits));
            self.wake.notify();
        }
    }

    /// Pauses delivery to `c` (its permits set aside, so the dispatcher
    /// neither reads for it nor picks it) or resumes it with those permits
    /// and any granted meanwhile. Entries it already holds stay its own.
    pub(crate) fn pause(&self, c: ConsumerRef, paused: bool) {
        let mut consumers = self.consumers.borrow_mut();
        let Some(s) = consumers.iter_mut().find(|s| s.consumer == c) else { return };
        let mut set_aside = self.paused.borrow_mut();
        if paused {
            set_aside.entry(c).or_insert_with(|| std::mem::take(&mut s.permits));
        } else if let Some(held) = set_aside.remove(&c) {
            s.permits = s.permits.saturating_add(held);
            self.wake.notify();
        }
    }

    /// Sends the given pending entries of `c` (all of them when `entries` is
    /// empty) again, to whichever consumer the policy picks. Entries `c`
    /// does not hold are ignored.
    pub(crate) fn redeliver(&self, c: ConsumerRef, entries: &[u64]) -> usize {
        let wanted: HashSet<u64> = entries.iter().copied().collect();
        let n = self.take_back(|e, p| p.consumer == c && (wanted.is_empty() || wanted.contains(&e)));
        if n > 0 {
            self.wake.notify();
        }
        n
    }

    /// Moves the cursor so that `entry` is the next one delivered: every
    /// entry before it counts as acknowledged, none after it. Whatever was
    /// delivered, set aside or delayed is forgotten. `seeker`'s permits drop
    /// to 0 (its client drops its queue and grants them again); other
    /// consumers keep theirs. An operator's reset has no seeker (it closes
    /// the consumers first).
    pub(crate) fn reset_to(&self, entry: u64, seeker: Option<ConsumerRef>) {
        {
            let mut cursor = self.cursor.borrow_mut();
            cursor.ack_floor = entry;
            cursor.acked.clear();
        }
        self.pending.borrow_mut().clear();
        self.replay.borrow_mut().clear();
        let max = self.delayed.borrow().max_entries();
        *self.delayed.borrow_mut() = DelayedIndex::new(max);
        self.deliveries.borrow_mut().clear();
        self.batch_acks.borrow_mut().clear();
        self.state_dirty.set(true);
        self.read_pos.set(entry);
        for c in self.consumers.borrow_mut().iter_mut() {
            c.unacked = 0;
            if Some(c.consumer) == seeker {
                c.permits = 0;
                if let Some(held) = self.paused.borrow_mut().get_mut(&c.consumer) {
                    *held = 0;
                }
            }
            // Key_Shared: nothing is outstanding any more, so nobody waits.
            c.joined_at = None;
        }
        self.wake.notify();
    }

    /// Applies acks of `topic`'s messages. `batch_sizes` is empty or one per
    /// id: a size above 1 makes the id a batch-index ack (`sub_state.rs`).
    /// Ids in ledgers retention deleted are acknowledged already. Returns
    /// whether the cursor or the batch-ack state changed; an error names the
    /// first id refused, the ones before it applied (the caller persists
    /// either way).
    pub(crate) fn ack(
        &self,
        topic: &Topic,
        ack_type: AckType,
        ids: &[MessageId],
        batch_sizes: &[u32],
    ) -> Result<bool, CoreError> {
        if ack_type == AckType::Cumulative
            && matches!(self.sub_type.get(), SubscriptionType::Shared | SubscriptionType::KeyShared)
        {
            return Err(CoreError::new(
                ErrorCode::NotAllowed,
                format!("cumulative ack is not allowed on {:?} subscription {:?}", self.sub_type.get(), self.name),
            ));
        }
        let mut changed = false;
        // Positions acknowledged whole by these ids (batch-index acks that
        // left messages unacknowledged are not among them).
        let mut whole: Vec<u64> = Vec::with_capacity(ids.len());
        // A refused id ends the ack, but what the ids before it did stays
        // done and accounted for below (their entries leave `pending`).
        let mut refused = None;
        {
            let mut cursor = self.cursor.borrow_mut();
            for (i, id) in ids.iter().enumerate() {
                let size = batch_sizes.get(i).copied().unwrap_or(0);
                let done = topic.position_of(id).and_then(|pos| match pos {
                    Some(pos) => Ok(Some((
                        pos,
                        crate::subscription::sub_state::batch_index_ack(self, &mut cursor, ack_type, *id, pos, size)?,
                    ))),
                    None => Ok(None),
                });
                let (pos, done) = match done {
                    Ok(Some(x)) => x,
                    Ok(None) => continue,
                    Err(e) => {
                        refused = Some(e);
                        break;
                    }
                };
                if let Some(done) = done {
                    changed |= done.changed;
                    if done.whole {
                        whole.push(pos);
                    }
                    continue;
                }
                whole.push(pos);
                changed |= match ack_type {
                    AckType::Individual => cursor.ack(pos),
                    AckType::Cumulative => cursor.ack_cumulative(pos),
                };
            }
        }
        if changed {
            self.forget_acked(&topic.ledgers.borrow(), ack_type, &whole);
        }
        match refused {
            Some(e) => Err(e),
            None => Ok(changed),
        }
    }

    /// Acknowledges everything before `floor` whatever the subscription
    /// type (TTL expiry; positions retention deleted). Returns whether the
    /// cursor changed.
    pub(crate) fn ack_below(&self, ledgers: &TopicLedgers, floor: u64) -> bool {
        let Some(last) = floor.checked_sub(1) else { return false };
        let changed = self.cursor.borrow_mut().ack_cumulative(last);
        if changed {
            self.forget_acked(ledgers, AckType::Cumulative, &[]);
        }
        if self.read_pos.get() < floor {
            self.read_pos.set(floor);
        }
        changed
    }

    /// After the cursor moved: drop what it now covers from the batch-ack,
    /// delivered, set-aside and redelivery-count state (`whole`: the
    /// positions individual acks acknowledged whole).
    fn forget_acked(&self, ledgers: &TopicLedgers, ack_type: AckType, whole: &[u64]) {
        let cursor = self.cursor.borrow();
        crate::subscription::sub_state::forget_acked(self, &cursor, ledgers, ack_type, whole);
        {
            let mut deliveries = self.deliveries.borrow_mut();
            let mut replay = self.replay.borrow_mut();
            let mut pending = self.pending.borrow_mut();
            let mut consumers = self.consumers.borrow_mut();
            // Individual acks touch only their entries (an ack costs O(log n),
            // not a scan of everything unacknowledged); a cumulative one
            // sweeps below the new floor.
            let mut unhold = |e: u64, pending: &mut PendingMap| {
                if let Some(p) = pending.remove(e) {
                    if let Some(c) = consumers.iter_mut().find(|c| c.consumer == p.consumer) {
                        c.take_back_one(e);
                    }
                }
            };
            match ack_type {
                AckType::Individual => {
                    // Usually both are empty: no hashing then.
                    let (counted, set_aside) = (!deliveries.is_empty(), !replay.is_empty());
                    for &e in whole {
                        if counted {
                            deliveries.remove(&e);
                        }
                        if set_aside {
                            replay.remove(&e);
                        }
                        unhold(e, &mut pending);
                    }
                }
                AckType::Cumulative => {
                    deliveries.retain(|e, _| !cursor.is_acked(*e));
                    replay.retain(|e, _| !cursor.is_acked(*e));
                    let acked: Vec<u64> = pending.iter().map(|(e, _)| e).filter(|e| cursor.is_acked(*e)).collect();
                    for e in acked {
                        unhold(e, &mut pending);
                    }
                }
            }
            // Room freed, and Key_Shared newcomers may be waiting on the floor.
            self.wake.notify();
        }
    }
}
