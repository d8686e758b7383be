//! The owner side of topic and subscription requests. For topics these are
//! thin handlers: the shard's own refusals (draining, disk full), the
//! registry of loaded topics, then the topic's behaviour (`topic/`). The
//! subscription side (subscribe, ack, seek, cursor persistence) still works
//! on the subscription's cells here. Runs on the shard that owns the topic;
//! never crosses cores.

use super::routing::{OpResult, Reply};
use super::{persist_each, Shard, TopicPolicy};
use crate::api::{ConsumerRef, SeekTarget, SubscribeRequest};
use crate::clock::now_ms;
use crate::error::{CoreError, ErrorCode};
use crate::subscription::sub_state::SubState;
use crate::subscription::{NewConsumer, Subscription};
use crate::topic::ledgers::Lookup;
use crate::topic::publish::Published;
use crate::topic::Topic;
use crate::topic_name::TopicName;
use bytes::Bytes;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use magnetar_wire::{AckType, InitialPosition, MessageId, ProducerAccessMode, SubscriptionType};
use std::rc::Rc;

pub(crate) fn valid_subscription_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 256 && s.chars().all(|c| !c.is_control())
}

impl Shard {
    /// The owner's side of a send: refused while the shard drains or its
    /// disk is full, else the topic's publish; the receipt waits until the
    /// append is durable.
    pub(super) fn handle_send(
        self: &Rc<Self>,
        topic: &str,
        producer: &str,
        num_messages: u32,
        blob: Bytes,
        blob_crc: Option<u32>,
    ) -> LocalBoxFuture<'static, OpResult> {
        crate::stage::mark("2_owner_send");
        let published = self.admit_send(topic).and_then(|t| {
            let p = t.publish(&self.topic_ctx(), producer, num_messages, blob, blob_crc)?;
            Ok((t, p))
        });
        match published {
            Err(e) => futures::future::ready(Err(e)).boxed_local(),
            Ok((t, Published::Duplicate(original))) => {
                let me = self.clone();
                async move { Ok(Reply::Sent(t.resend_receipt(&me.log, original).await?)) }.boxed_local()
            }
            Ok((t, Published::Appended { id, pos, lsn })) => {
                self.inflight.set(self.inflight.get() + 1);
                let me = self.clone();
                async move {
                    let r = me.log.wait_durable(lsn).await;
                    crate::stage::mark("7_owner_durable");
                    me.inflight.set(me.inflight.get() - 1);
                    r?;
                    t.on_durable(pos);
                    Ok(Reply::Sent(id))
                }
                .boxed_local()
            }
        }
    }

    /// The loaded topic a send goes to, unless the shard takes no sends.
    fn admit_send(&self, topic: &str) -> Result<Rc<Topic>, CoreError> {
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
        Ok(t)
    }

    /// Loads the topic (from recovered metadata) or creates it, and
    /// registers it with its durable subscriptions restored. Returns the
    /// log position of its creation record, if it was created now.
    pub(super) fn get_or_create_topic(
        self: &Rc<Self>,
        name: &TopicName,
    ) -> Result<(Rc<Topic>, Option<u64>), CoreError> {
        let key = name.to_string();
        if let Some(t) = self.topics.borrow().get(&key) {
            return Ok((t.clone(), None));
        }
        let (topic, created_lsn) = crate::topic::load::load_or_create(&self.topic_ctx(), name, key.clone())?;
        self.restore_subscriptions(&topic);
        self.topics.borrow_mut().insert(key, topic.clone());
        Ok((topic, created_lsn))
    }

    /// Restores the durable subscriptions of a topic being loaded, each
    /// with its dispatcher.
    fn restore_subscriptions(self: &Rc<Self>, topic: &Rc<Topic>) {
        let key = &topic.key;
        let partition = topic.partition;
        for (sub_name, v) in self.store.cursors(key) {
            let sub_name = sub_name.as_str();
            let cursor = crate::subscription::cursor::CursorRecord::decode(&v)
                .and_then(|rec| crate::subscription::cursor::Cursor::from_record(&rec, &topic.ledgers.borrow()));
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
                    match self.store.sub_state(key, sub_name).map(|v| SubState::decode(&v)) {
                        Some(Ok(state)) => crate::subscription::sub_state::restore(
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
                    self.spawn_dispatcher(topic.clone(), sub);
                }
                Err(e) => tracing::error!(topic = %key, sub = sub_name, "unreadable cursor record: {e}"),
            }
        }
    }

    /// Every topic recorded in this shard's log, loaded (retention needs
    /// them all, not only those with clients since the restart).
    pub(crate) fn load_all_topics(self: &Rc<Self>) -> Vec<Rc<Topic>> {
        let mut out = Vec::new();
        for name in self.store.topic_names("") {
            let name = name.as_str();
            let Ok(tn) = TopicName::parse(name) else { continue };
            match self.get_or_create_topic(&tn) {
                Ok((t, _)) => out.push(t),
                Err(e) => tracing::warn!(topic = name, "retention: cannot load topic: {e}"),
            }
        }
        out
    }

    /// Whether `tn` exists (loaded or recorded in the log).
    pub(super) fn topic_exists(&self, key: &str) -> bool {
        self.topics.borrow().contains_key(key) || self.store.topic_recorded(key)
    }

    /// Refuses to create `tn` when its namespace does not auto-create topics.
    pub(super) fn check_auto_creation(&self, tn: &TopicName, policy: &TopicPolicy) -> Result<(), CoreError> {
        crate::topic::load::check_auto_creation(tn, &policy.policies, policy.in_partitioned, || {
            self.topic_exists(&tn.to_string())
        })
    }

    pub(super) async fn handle_create_producer(
        self: Rc<Self>,
        topic: &str,
        name: String,
        mode: ProducerAccessMode,
        policy: TopicPolicy,
    ) -> OpResult {
        let tn = TopicName::parse(topic)?;
        self.check_auto_creation(&tn, &policy)?;
        let (t, lsn) = self.get_or_create_topic(&tn)?;
        let name = self.producer_names.or_generate(name);
        let last_sequence_id = t.add_producer(&self.topic_ctx(), &name, mode, &policy.policies, lsn).await?;
        Ok(Reply::Producer { name, last_sequence_id })
    }

    pub(super) async fn handle_subscribe(
        self: Rc<Self>,
        req: SubscribeRequest,
        consumer: ConsumerRef,
        policy: TopicPolicy,
    ) -> OpResult {
        let tn = TopicName::parse(&req.topic)?;
        self.check_auto_creation(&tn, &policy)?;
        if !valid_subscription_name(&req.subscription) {
            return Err(CoreError::new(
                ErrorCode::NotAllowed,
                "subscription names must be 1 to 256 characters without control characters",
            ));
        }
        crate::subscription::sub_state::check_filter_tag(&req.filter_tag)?;
        crate::subscription::dispatcher::key_shared::check_sticky_ranges(req.sub_type, &req.key_shared_ranges)?;
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
                let cursor = crate::subscription::cursor::Cursor::new(floor);
                let sub = Subscription::new(
                    req.subscription.clone(),
                    req.sub_type,
                    req.durable,
                    cursor,
                    t.partition,
                    self.config.delayed_index_max as usize,
                );
                t.subs.borrow_mut().insert(req.subscription.clone(), sub.clone());
                self.spawn_dispatcher(t.clone(), sub.clone());
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

    /// Writes the dedup snapshot of every topic whose state changed.
    pub(super) fn flush_dedup(&self) -> Result<Option<u64>, CoreError> {
        let mut last = None;
        let topics: Vec<Rc<Topic>> = self.topics.borrow().values().cloned().collect();
        for t in topics {
            if let Some(lsn) = t.flush_dedup(&self.store)? {
                last = Some(lsn);
            }
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
        let list = self.store.topic_record(topic)?;
        Some(list.iter().map(|l| l.id).collect())
    }

    /// The last durable entry of `topic` (see [`crate::topic::load::last_message_id`]).
    pub(super) fn last_message_id(&self, topic: &str) -> Result<Option<MessageId>, CoreError> {
        let loaded = self.topics.borrow().get(topic).cloned();
        crate::topic::load::last_message_id(&self.topic_ctx(), topic, loaded.as_deref())
    }

    /// Deletes a topic without producers or consumers: unloaded (its
    /// dispatchers stop), then its records and ledgers erased.
    pub(super) async fn handle_delete_topic(self: Rc<Self>, topic: &str) -> OpResult {
        let ctx = self.topic_ctx();
        let loaded = self.topics.borrow().get(topic).cloned();
        let ledgers = crate::topic::load::check_deletable(&ctx, topic, loaded.as_deref())?;
        if let Some(t) = self.topics.borrow_mut().remove(topic) {
            t.mark_deleted();
        }
        crate::topic::load::delete_storage(&ctx, topic, &ledgers).await?;
        Ok(Reply::Done)
    }

    pub(super) async fn handle_seek(
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

    /// See [`Topic::first_entry_published_at`].
    pub(super) async fn first_entry_published_at(&self, t: &Topic, ms: u64) -> Result<u64, CoreError> {
        t.first_entry_published_at(&self.log, ms).await
    }

    /// Applies an ack. With `persist_now` the cursor record is written at once
    /// and its log position returned; otherwise the periodic flusher writes it.
    pub(super) fn handle_ack(
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

    pub(super) fn write_cursor_records(
        &self,
        topic: &Topic,
        sub: &Subscription,
        state_dirty: bool,
    ) -> Result<u64, CoreError> {
        if state_dirty {
            let state = crate::subscription::sub_state::encode(sub, &topic.ledgers.borrow());
            self.store.put_sub_state(&topic.key, &sub.name, Bytes::from(state))?;
        }
        let bytes = sub.cursor.borrow().to_record(&topic.ledgers.borrow()).encode();
        let lsn = self.store.put_cursor(&topic.key, &sub.name, Bytes::from(bytes))?;
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
    pub(super) fn flush_counts(&self, force: bool) -> Result<Option<u64>, CoreError> {
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
            if !force && !crate::subscription::sub_state::counts_write_due(now, s.state_written_ms.get()) {
                self.dirty_counts.borrow_mut().push((t.clone(), s.clone()));
                return Ok(None);
            }
            s.state_dirty.set(true);
            self.persist_cursor(t, s).map(Some)
        })
    }

    /// Writes every changed cursor to the log. Returns the last position written.
    pub(super) fn flush_cursors(&self) -> Result<Option<u64>, CoreError> {
        self.flush_cursors_and_counts(false)
    }

    pub(super) fn flush_cursors_and_counts(&self, force_counts: bool) -> Result<Option<u64>, CoreError> {
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
}
