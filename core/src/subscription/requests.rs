//! A subscription's side of consumer requests on the topic's owner:
//! subscribe, ack, redeliver, seek and close. The shard finds the topic and
//! the subscription (and creates or loads the topic); what the request does
//! to the subscription is here. Owned by the topic's shard; never crosses
//! cores.

use super::dispatcher::context::DeliverySink;
use super::persist::{CursorWriter, Dirty};
use super::{NewConsumer, Subscription};
use crate::api::{ConsumerRef, SeekTarget, SubscribeRequest};
use crate::error::{CoreError, ErrorCode};
use crate::topic::ledgers::Lookup;
use crate::topic::Topic;
use magnetar_wire::{AckType, InitialPosition, MessageId};
use std::rc::Rc;

pub(crate) fn valid_subscription_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 256 && s.chars().all(|c| !c.is_control())
}

/// `t`'s subscription `subscription`, if `consumer` is attached to it (a
/// request of a consumer that is not is refused, whatever it asks).
pub(crate) fn attached(
    t: Option<Rc<Topic>>,
    subscription: &str,
    consumer: ConsumerRef,
) -> Result<(Rc<Topic>, Rc<Subscription>), CoreError> {
    let not_found = |why: &str| CoreError::new(ErrorCode::ConsumerNotFound, why);
    let t = t.ok_or_else(|| not_found("topic not loaded"))?;
    let sub = t.subs.borrow().get(subscription).cloned().ok_or_else(|| not_found("no such subscription"))?;
    if !sub.has_consumer(consumer) {
        return Err(not_found("consumer is not attached"));
    }
    Ok((t, sub))
}

/// Refuses a subscribe request whose subscription part is malformed (name,
/// tag filter, sticky ranges), before anything is created.
pub(crate) fn check_subscribe(req: &SubscribeRequest) -> Result<(), CoreError> {
    if !valid_subscription_name(&req.subscription) {
        return Err(CoreError::new(
            ErrorCode::NotAllowed,
            "subscription names must be 1 to 256 characters without control characters",
        ));
    }
    super::sub_state::check_filter_tag(&req.filter_tag)?;
    super::sub_state::check_allocation(req.sub_type, &req.model)?;
    super::dispatcher::key_shared::check_sticky_ranges(req.sub_type, &req.key_shared_ranges)
}

/// The subscription `req` names on `t`; when it does not exist it is
/// created with its cursor at the requested initial position, listed on
/// the topic, and `true` returned (the caller starts its dispatcher and
/// persists it if durable).
pub(crate) fn get_or_create(t: &Topic, req: &SubscribeRequest, delayed_index_max: usize) -> (Rc<Subscription>, bool) {
    if let Some(sub) = t.subs.borrow().get(&req.subscription) {
        return (sub.clone(), false);
    }
    let floor = match req.initial_position {
        InitialPosition::Earliest => t.ledgers.borrow().start(),
        InitialPosition::Latest => t.next_entry.get(),
    };
    let sub = Subscription::new(
        req.subscription.clone(),
        req.sub_type,
        req.durable,
        super::cursor::Cursor::new(floor),
        t.partition,
        delayed_index_max,
    );
    t.subs.borrow_mut().insert(req.subscription.clone(), sub.clone());
    (sub, true)
}

/// Attaches `consumer` as `req` asks (see [`Subscription::add_consumer`]);
/// a changed type or filter queues the state record.
pub(crate) fn attach(
    t: &Rc<Topic>,
    sub: &Rc<Subscription>,
    sink: &impl DeliverySink,
    dirty: &Dirty,
    (req, partitions): (&SubscribeRequest, u32),
    consumer: ConsumerRef,
) -> Result<(), CoreError> {
    let name = if req.consumer_name.is_empty() {
        format!("consumer-{}-{}-{}", consumer.shard, consumer.sink, consumer.consumer_id)
    } else {
        req.consumer_name.clone()
    };
    sub.add_consumer(
        sink,
        NewConsumer {
            consumer,
            sub_type: req.sub_type,
            name,
            priority: req.priority_level,
            filter_tag: req.filter_tag.clone(),
            key_shared_ranges: req.key_shared_ranges.clone(),
            address: req.client_address.clone(),
            zone: req.model.zone.clone(),
            allocation: super::Allocation {
                strategy: req.model.allocation,
                partition_zones: req.model.partition_zones.clone(),
            },
            partitions,
        },
    )?;
    if sub.state_dirty.get() {
        dirty.mark_cursor(t, sub);
    }
    Ok(())
}

/// Applies an ack of `sub`'s consumer. With `persist_now` the cursor record
/// is written at once and its log position returned; otherwise the periodic
/// flusher writes it.
pub(crate) fn ack(
    writer: &CursorWriter,
    t: &Rc<Topic>,
    sub: &Rc<Subscription>,
    ack_type: AckType,
    (ids, batch_sizes): (&[MessageId], &[u32]),
    persist_now: bool,
) -> Result<Option<u64>, CoreError> {
    if ack_type == AckType::Cumulative && ids.len() != 1 {
        return Err(CoreError::new(ErrorCode::ProtocolError, "a cumulative ack carries exactly one id"));
    }
    if !batch_sizes.is_empty() && batch_sizes.len() != ids.len() {
        return Err(CoreError::new(ErrorCode::ProtocolError, "an ack's batch sizes must be one per id, or none"));
    }
    let acked = sub.ack(t, ack_type, ids, batch_sizes);
    // A refused ack may have applied the ids before the refused one.
    if acked.as_ref().map_or(true, |changed| *changed) {
        writer.dirty.mark_cursor(t, sub);
    }
    acked?;
    if !(persist_now && sub.durable) {
        return Ok(None);
    }
    if sub.dirty.get() {
        return Ok(Some(writer.persist(t, sub)?));
    }
    // Nothing new, but the last cursor record may not be on disk yet:
    // the answer waits for it all the same.
    Ok(Some(sub.persisted_lsn.get()))
}

/// Sends `consumer`'s entries with these ids again (all it holds when `ids`
/// is empty). Ids of another ledger are none of ours: nothing to do for
/// them, but an all-foreign list must not mean "all".
pub(crate) fn redeliver(t: &Topic, sub: &Subscription, consumer: ConsumerRef, ids: &[MessageId]) {
    let entries: Vec<u64> = ids.iter().filter_map(|id| t.position_of(id).ok().flatten()).collect();
    if ids.is_empty() || !entries.is_empty() {
        sub.redeliver(consumer, &entries);
    }
}

/// Where a seek goes, as far as the topic's ledgers tell.
pub(crate) enum SeekTo {
    /// This position is next.
    Entry(u64),
    /// The first entry published at or after this time is next (a search
    /// of the topic's entries).
    PublishedAt(u64),
}

pub(crate) fn seek_to(t: &Topic, target: SeekTarget) -> Result<SeekTo, CoreError> {
    let id = match target {
        SeekTarget::Id(id) => id,
        SeekTarget::PublishTime(ms) => return Ok(SeekTo::PublishedAt(ms)),
    };
    let lookup = t.ledgers.borrow().lookup(id.ledger, id.entry);
    match lookup {
        Lookup::At(p) => Ok(SeekTo::Entry(p.min(t.durable_next.get()))),
        // Deleted by retention: the oldest message kept is next.
        Lookup::Trimmed => Ok(SeekTo::Entry(t.ledgers.borrow().start())),
        _ => Err(CoreError::new(ErrorCode::NotAllowed, format!("seek to {id}: not a message of {}", t.key))),
    }
}

/// Moves `sub` so that `entry` is next (see [`Subscription::reset_to`]);
/// a durable subscription's cursor record is written at once and its log
/// position returned, for the answer to wait on.
pub(crate) fn seek(
    writer: &CursorWriter,
    t: &Rc<Topic>,
    sub: &Rc<Subscription>,
    entry: u64,
    seeker: ConsumerRef,
) -> Result<Option<u64>, CoreError> {
    sub.reset_to(entry, Some(seeker));
    if sub.durable {
        return Ok(Some(writer.persist(t, sub)?));
    }
    Ok(None)
}

/// Detaches `consumer`. A non-durable subscription (a reader) lives only as
/// long as its consumer: when the last one leaves it is dropped from the
/// topic and its dispatcher stops.
pub(crate) fn close_consumer(t: &Topic, sub: &Subscription, sink: &impl DeliverySink, consumer: ConsumerRef) {
    sub.remove_consumer(sink, consumer);
    if !sub.durable && sub.consumer_count() == 0 {
        t.subs.borrow_mut().remove(&sub.name);
        sub.removed.set(true);
        sub.wake.notify();
    }
}
