//! The owner side of an operator's subscription operations
//! ([`SubscriptionOp`]): create at a position, delete, skip, clear the
//! backlog, reset the cursor, expire, peek. What each does to the
//! subscription is in `subscription/admin.rs` and `subscription/mod.rs`;
//! here the topic and subscription are found, changes persisted before the
//! answer, and peeked entries read. Runs on the shard that owns the topic;
//! never crosses cores.

use super::routing::{OpResult, Reply};
use super::Shard;
use crate::api::{FoundMessage, FoundMessages, SeekTarget, StoredEntry, SubscriptionOp, SubscriptionStart};
use crate::clock::now_ms;
use crate::error::{CoreError, ErrorCode};
use crate::subscription::cursor::Cursor;
use crate::subscription::requests::{self, SeekTo};
use crate::subscription::Subscription;
use crate::topic::Topic;
use crate::topic_name::TopicName;
use magnetar_wire::{MessageId, SubscriptionType};
use std::collections::BTreeMap;
use std::rc::Rc;

impl Shard {
    pub(super) async fn handle_subscription_admin(
        self: Rc<Self>,
        topic: &str,
        subscription: &str,
        op: SubscriptionOp,
    ) -> OpResult {
        let tn = TopicName::parse(topic)?;
        if !self.topic_exists(topic) {
            return Err(CoreError::new(ErrorCode::TopicNotFound, format!("topic {topic} does not exist")));
        }
        let (t, _) = self.get_or_create_topic(&tn)?;
        if let SubscriptionOp::Create { at } = op {
            return self.create_subscription(&t, subscription, at).await;
        }
        let sub = t.subs.borrow().get(subscription).cloned().ok_or_else(|| {
            CoreError::new(ErrorCode::TopicNotFound, format!("subscription {subscription:?} of {topic} does not exist"))
        })?;
        match op {
            SubscriptionOp::Create { .. } => unreachable!("handled above"),
            SubscriptionOp::Delete { force } => self.delete_subscription(&t, &sub, force).await,
            SubscriptionOp::Skip { count } => {
                let end = sub.skip_end(count, t.durable_next.get());
                self.move_floor(&t, &sub, end, "skip").await
            }
            SubscriptionOp::ClearBacklog => self.move_floor(&t, &sub, t.durable_next.get(), "clear-backlog").await,
            SubscriptionOp::Expire { older_than_s } => {
                let cutoff = now_ms().saturating_sub(older_than_s.saturating_mul(1000));
                let floor = sub.cursor.borrow().ack_floor;
                let end = t.first_published_at_or_after(&self.log, cutoff, floor, t.durable_next.get()).await;
                self.move_floor(&t, &sub, end, "expire").await
            }
            SubscriptionOp::ResetCursor { to } => {
                let entry = match requests::seek_to(&t, to)? {
                    SeekTo::Entry(entry) => entry,
                    SeekTo::PublishedAt(ms) => self.first_entry_published_at(&t, ms).await?,
                };
                if sub.removed.get() {
                    return Err(gone(subscription, topic));
                }
                // As Pulsar does: the consumers are closed, so that none
                // keeps (and acknowledges) what its client queued from the
                // old position; they subscribe again and get the new one.
                let closed = sub.close_consumers(
                    &*self,
                    "the subscription's cursor was reset by an operator: subscribe again to receive from its new \
                     position",
                );
                sub.reset_to(entry, None);
                if sub.durable {
                    let lsn = self.persist_cursor(&t, &sub)?;
                    self.log.wait_durable(lsn).await?;
                }
                tracing::info!(topic, subscription, entry, ?to, closed, "admin: reset cursor");
                Ok(Reply::Done)
            }
            SubscriptionOp::Peek { position, count } => self.peek(&t, &sub, position, count).await.map(Reply::Found),
            SubscriptionOp::PeekEntry { position } => self.peek_entry(&t, &sub, position).await.map(Reply::Entry),
        }
    }

    async fn create_subscription(self: &Rc<Self>, t: &Rc<Topic>, name: &str, at: SubscriptionStart) -> OpResult {
        if !requests::valid_subscription_name(name) {
            return Err(CoreError::new(
                ErrorCode::NotAllowed,
                "subscription names must be 1 to 256 characters without control characters",
            ));
        }
        if t.subs.borrow().contains_key(name) {
            return Err(CoreError::new(
                ErrorCode::NotAllowed,
                format!("subscription {name:?} of {} already exists", t.key),
            ));
        }
        let floor = match at {
            SubscriptionStart::Earliest => t.ledgers.borrow().start(),
            SubscriptionStart::Latest => t.next_entry.get(),
            SubscriptionStart::Id(id) => match requests::seek_to(t, SeekTarget::Id(id))? {
                SeekTo::Entry(entry) => entry,
                SeekTo::PublishedAt(_) => unreachable!("an id is not a time"),
            },
        };
        // The type is the first consumer's, as for a subscription restored
        // from data without a state record.
        let sub = Subscription::new(
            name.to_string(),
            SubscriptionType::Exclusive,
            true,
            Cursor::new(floor),
            t.partition,
            self.config.delayed_index_max as usize,
        );
        t.subs.borrow_mut().insert(name.to_string(), sub.clone());
        self.spawn_dispatcher(t.clone(), sub.clone());
        let lsn = self.persist_cursor(t, &sub)?;
        self.log.wait_durable(lsn).await?;
        tracing::info!(topic = %t.key, subscription = name, floor, ?at, "admin: created subscription");
        Ok(Reply::Done)
    }

    /// A consumer's own UNSUBSCRIBE: its subscription is deleted as an
    /// operator's delete would, the requester detached first so that it is
    /// not told "closed" (its client would subscribe again). Other attached
    /// consumers refuse it unless `force`, which closes them.
    pub(super) async fn handle_unsubscribe(
        &self,
        topic: &str,
        subscription: &str,
        consumer: crate::api::ConsumerRef,
        force: bool,
    ) -> OpResult {
        let (t, sub) = self.attached(topic, subscription, consumer)?;
        let attached = sub.consumer_count();
        assert!(attached >= 1, "an attached consumer is counted");
        if attached > 1 && !force {
            return Err(CoreError::new(
                ErrorCode::ConsumerBusy,
                format!("subscription {subscription:?} of {topic} has {} other consumer(s)", attached - 1),
            ));
        }
        requests::close_consumer(&t, &sub, self, consumer);
        self.delete_subscription(&t, &sub, true).await
    }

    async fn delete_subscription(&self, t: &Rc<Topic>, sub: &Rc<Subscription>, force: bool) -> OpResult {
        let connected = sub.consumer_count();
        if connected > 0 && !force {
            return Err(CoreError::new(
                ErrorCode::ConsumerBusy,
                format!(
                    "subscription {:?} of {} has {connected} connected consumer(s): close them, or force the \
                     deletion (which closes them)",
                    sub.name, t.key
                ),
            ));
        }
        sub.close_consumers(self, "the subscription was deleted by an operator");
        t.subs.borrow_mut().remove(&sub.name);
        // Its dispatcher stops; no flush writes its records again.
        sub.removed.set(true);
        sub.dirty.set(false);
        sub.state_dirty.set(false);
        sub.counts_dirty.set(false);
        sub.wake.notify();
        if sub.durable {
            let lsn = self.store.delete_subscription(&t.key, &sub.name)?;
            self.log.wait_durable(lsn).await?;
        }
        tracing::info!(topic = %t.key, subscription = %sub.name, closed = connected, "admin: deleted subscription");
        Ok(Reply::Done)
    }

    /// Acknowledges everything below `end` for `sub` and, if that moved its
    /// cursor, waits until the cursor record is durable.
    async fn move_floor(&self, t: &Rc<Topic>, sub: &Rc<Subscription>, end: u64, what: &str) -> OpResult {
        if sub.removed.get() {
            return Err(gone(&sub.name, &t.key));
        }
        let before = sub.cursor.borrow().ack_floor;
        if sub.acknowledge_below(&t.ledgers.borrow(), end) && sub.durable {
            let lsn = self.persist_cursor(t, sub)?;
            self.log.wait_durable(lsn).await?;
        }
        tracing::info!(topic = %t.key, subscription = %sub.name, from = before, to = end, "admin: {what}");
        Ok(Reply::Done)
    }

    /// `sub`'s `position`-th unacknowledged entry, as
    /// [`SubscriptionOp::PeekEntry`] says.
    async fn peek_entry(&self, t: &Rc<Topic>, sub: &Rc<Subscription>, position: u64) -> Result<StoredEntry, CoreError> {
        if position == 0 {
            return Err(CoreError::new(ErrorCode::NotAllowed, "peek positions start at 1"));
        }
        let not_found = || {
            CoreError::new(
                ErrorCode::TopicNotFound,
                format!("subscription {:?} of {} has no message at position {position}", sub.name, t.key),
            )
        };
        let pos = *sub.unacked_from(position, 1, t.durable_next.get()).first().ok_or_else(not_found)?;
        let (ledger, entry) = t.ledgers.borrow().locate(pos).ok_or_else(not_found)?;
        let blob = self.log.read(ledger, entry).await?;
        Ok(StoredEntry { id: MessageId::new(ledger, entry, t.partition, -1), blob })
    }

    /// The messages of `sub`'s unacknowledged entries from the
    /// `position`-th, as [`SubscriptionOp::Peek`] says.
    async fn peek(
        &self,
        t: &Rc<Topic>,
        sub: &Rc<Subscription>,
        position: u64,
        count: u32,
    ) -> Result<FoundMessages, CoreError> {
        if position == 0 {
            return Err(CoreError::new(ErrorCode::NotAllowed, "peek positions start at 1"));
        }
        let count = count.clamp(1, crate::find::FIND_LIMIT_MAX) as usize;
        let positions = sub.unacked_from(position, count, t.durable_next.get());
        if positions.is_empty() {
            return Err(CoreError::new(
                ErrorCode::TopicNotFound,
                format!("subscription {:?} of {} has no message at position {position}", sub.name, t.key),
            ));
        }
        let mut out = Vec::new();
        let mut bytes = 0usize;
        let mut truncated = false;
        'entries: for pos in positions {
            let Some((ledger, entry)) = t.ledgers.borrow().locate(pos) else { continue };
            let blob = self.log.read(ledger, entry).await?;
            let m = crate::entry::messages(&blob).map_err(|e| {
                CoreError::new(ErrorCode::PersistenceError, format!("entry {ledger}:{entry} of {}: {e}", t.key))
            })?;
            let compressed = m
                .compression
                .map(|compression| crate::api::CompressedBatch { compression, messages: m.num_messages.max(1) });
            for msg in m.messages {
                if out.len() >= count {
                    break 'entries;
                }
                if bytes + msg.payload.len() > crate::find::FIND_PAYLOAD_BYTES_MAX && !out.is_empty() {
                    truncated = true;
                    break 'entries;
                }
                bytes += msg.payload.len();
                let properties: BTreeMap<String, String> = msg.properties.into_iter().collect();
                out.push(FoundMessage {
                    id: MessageId::new(ledger, entry, t.partition, msg.batch_index as i32),
                    key: msg.key.unwrap_or_default(),
                    properties,
                    publish_time_ms: m.publish_time_ms,
                    payload: msg.payload,
                    topic: t.key.clone(),
                    compressed,
                });
            }
        }
        Ok(FoundMessages { messages: out, truncated })
    }
}

fn gone(subscription: &str, topic: &str) -> CoreError {
    CoreError::new(ErrorCode::TopicNotFound, format!("subscription {subscription:?} of {topic} was deleted meanwhile"))
}
