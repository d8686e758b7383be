//! The owner side of topic and subscription requests. For topics these are
//! thin handlers: the shard's own refusals (draining, disk full), the
//! registry of loaded topics, then the topic's behaviour (`topic/`). The
//! subscription side (subscribe, ack, seek, cursor persistence) still works
//! on the subscription's cells here. Runs on the shard that owns the topic;
//! never crosses cores.

use super::routing::{OpResult, Reply};
use super::{Shard, TopicPolicy};
use crate::api::{ConsumerRef, SeekTarget, SubscribeRequest};
use crate::error::{CoreError, ErrorCode};
use crate::subscription::sub_state::SubState;
use crate::subscription::{requests, Subscription};
use crate::topic::publish::Published;
use crate::topic::Topic;
use crate::topic_name::TopicName;
use bytes::Bytes;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use magnetar_wire::{AckType, MessageId, ProducerAccessMode, SubscriptionType};
use std::rc::Rc;

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
        let (arrived, bytes) = (std::time::Instant::now(), blob.len() as u64);
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
                self.metrics.messages_in.add(u64::from(num_messages));
                self.metrics.bytes_in.add(bytes);
                let me = self.clone();
                async move {
                    let r = me.log.wait_durable(lsn).await;
                    crate::stage::mark("7_owner_durable");
                    me.inflight.set(me.inflight.get() - 1);
                    r?;
                    me.metrics.publish_latency_us.record(arrived.elapsed().as_micros() as u64);
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
        if self.log.space_short() {
            // Exact, unlike the sampled percentage: the log could not
            // reserve its next segment, so what is accepted now might have
            // to wait for space. Retriable: the log retries the reservation
            // and produce resumes by itself once it succeeds.
            return Err(CoreError::new(
                ErrorCode::StorageFull,
                "no space on the data disk for the log's next segment; produce is refused until space is freed",
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
        self.metrics.topics_loaded.add(1);
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
                            // From the shard's start, not this load: a topic
                            // loaded again after an unload holds no type.
                            self.started_ms,
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
        epoch: Option<u64>,
        queued: Option<futures::channel::oneshot::Sender<()>>,
    ) -> OpResult {
        let tn = TopicName::parse(topic)?;
        self.check_auto_creation(&tn, &policy)?;
        let (t, lsn) = self.get_or_create_topic(&tn)?;
        let name = self.producer_names.or_generate(name);
        let (last_sequence_id, epoch) =
            t.add_producer(&self.topic_ctx(), &name, mode, &policy.policies, lsn, epoch, queued).await?;
        Ok(Reply::Producer { name, last_sequence_id, epoch })
    }

    pub(super) async fn handle_subscribe(
        self: Rc<Self>,
        req: SubscribeRequest,
        consumer: ConsumerRef,
        policy: TopicPolicy,
    ) -> OpResult {
        let tn = TopicName::parse(&req.topic)?;
        self.check_auto_creation(&tn, &policy)?;
        requests::check_subscribe(&req)?;
        let (t, created_lsn) = self.get_or_create_topic(&tn)?;
        let max = policy.policies.max_consumers_per_topic;
        let attached: usize = t.subs.borrow().values().map(|s| s.consumer_count()).sum();
        if max != 0 && attached >= max as usize {
            return Err(CoreError::new(
                ErrorCode::ConsumerBusy,
                format!("topic {} reached the namespace's max_consumers_per_topic ({max})", t.key),
            ));
        }
        let (sub, created) = requests::get_or_create(&t, &req, self.config.delayed_index_max as usize);
        let mut sub_lsn = None;
        if created {
            self.spawn_dispatcher(t.clone(), sub.clone());
            if req.durable {
                sub_lsn = Some(self.persist_cursor(&t, &sub)?);
            }
        }
        requests::attach(&t, &sub, &self, &self.cursors.dirty, (&req, policy.partitions), consumer)?;
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

    /// The id of the topic's last message: the last entry's, and in a batch
    /// its last message's batch index (as Pulsar answers), so a reader that
    /// has read part of the last batch still sees messages available. The
    /// entry is read for its metadata; one that is damaged answers the
    /// damage, not a guess.
    pub(super) async fn handle_last_message_id(&self, topic: &str) -> Result<Option<MessageId>, CoreError> {
        let Some(id) = self.last_message_id(topic)? else { return Ok(None) };
        let blob = match self.log.read(id.ledger, id.entry).await {
            Ok(blob) => blob,
            // Trimmed by retention meanwhile: the id stands without a batch index.
            Err(magnetar_storage::StorageError::NoSuchEntry { .. }) => return Ok(Some(id)),
            Err(e) => return Err(e.into()),
        };
        let batch_index = crate::entry::last_batch_index(&blob)
            .map_err(|e| CoreError::new(ErrorCode::DamagedEntry, format!("entry {}:{}: {e}", id.ledger, id.entry)))?;
        Ok(Some(MessageId::new(id.ledger, id.entry, id.partition, batch_index)))
    }

    /// Deletes a topic without producers or consumers: unloaded (its
    /// dispatchers stop), then its records and ledgers erased.
    pub(super) async fn handle_delete_topic(self: Rc<Self>, topic: &str) -> OpResult {
        let ctx = self.topic_ctx();
        let loaded = self.topics.borrow().get(topic).cloned();
        let ledgers = crate::topic::load::check_deletable(&ctx, topic, loaded.as_deref())?;
        let removed = self.topics.borrow_mut().remove(topic);
        if let Some(t) = removed {
            self.metrics.topics_loaded.sub(1);
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
        let entry = match requests::seek_to(&t, target)? {
            requests::SeekTo::Entry(entry) => entry,
            requests::SeekTo::PublishedAt(ms) => self.first_entry_published_at(&t, ms).await?,
        };
        if let Some(lsn) = requests::seek(&self.cursors, &t, &sub, entry, consumer)? {
            self.log.wait_durable(lsn).await?;
        }
        tracing::info!(topic, subscription, entry, ?target, "seek");
        Ok(Reply::Done)
    }

    /// Moves `subscription` of `topic` past the damaged entry it waits at:
    /// the one its dispatcher found damaged, else its first unacknowledged
    /// entry. The entry is read again first, and only an entry that still
    /// fails verification is skipped (acknowledged for this subscription,
    /// durably, with a log line); an intact one is an error, so a stale
    /// request never drops a good message. Answers the skipped entry's id.
    pub(super) async fn handle_skip_damaged(self: Rc<Self>, topic: &str, subscription: &str) -> OpResult {
        let tn = TopicName::parse(topic)?;
        if !self.topics.borrow().contains_key(topic) && !self.store.topic_recorded(topic) {
            return Err(CoreError::new(ErrorCode::TopicNotFound, format!("no topic {topic}")));
        }
        let (t, _) = self.get_or_create_topic(&tn)?;
        let sub = t.subs.borrow().get(subscription).cloned().ok_or_else(|| {
            CoreError::new(ErrorCode::TopicNotFound, format!("{topic} has no subscription {subscription:?}"))
        })?;
        let pos = sub.damaged.get().unwrap_or_else(|| {
            let c = sub.cursor.borrow();
            c.acked.first_absent_from(c.ack_floor)
        });
        let nothing = |why: String| CoreError::new(ErrorCode::NotAllowed, why);
        let (Some(id), Some((ledger, entry))) = (t.message_id(pos), t.ledgers.borrow().locate(pos)) else {
            return Err(nothing(format!("subscription {subscription:?} of {topic} has no entry left to skip")));
        };
        if pos >= t.durable_next.get() || sub.cursor.borrow().is_acked(pos) {
            sub.damaged.set(None);
            return Err(nothing(format!("subscription {subscription:?} of {topic} has no damaged entry to skip")));
        }
        match self.log.read(ledger, entry).await {
            Ok(_) => {
                sub.damaged.set(None);
                return Err(nothing(format!(
                    "entry {}:{} of {topic}, where subscription {subscription:?} is, reads back intact: \
                     nothing to skip",
                    id.ledger, id.entry
                )));
            }
            Err(magnetar_storage::StorageError::Corrupt { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        let lsn = requests::ack(&self.cursors, &t, &sub, AckType::Individual, (&[id], &[]), true)?;
        if let Some(lsn) = lsn {
            self.log.wait_durable(lsn).await?;
        }
        sub.damaged.set(None);
        sub.wake.notify();
        tracing::warn!(
            topic, subscription, entry = %format_args!("{}:{}", id.ledger, id.entry),
            "skip-damaged: the subscription moved past a damaged entry; its messages are not delivered to it"
        );
        Ok(Reply::Skipped(id))
    }

    /// See [`Topic::first_entry_published_at`].
    pub(super) async fn first_entry_published_at(&self, t: &Topic, ms: u64) -> Result<u64, CoreError> {
        t.first_entry_published_at(&self.log, ms).await
    }

    /// Applies an ack (see [`requests::ack`]).
    pub(super) fn handle_ack(
        self: &Rc<Self>,
        topic: &str,
        subscription: &str,
        consumer: ConsumerRef,
        ack_type: AckType,
        ids: (&[MessageId], &[u32]),
        persist_now: bool,
    ) -> Result<Option<u64>, CoreError> {
        let (t, sub) = self.attached(topic, subscription, consumer)?;
        requests::ack(&self.cursors, &t, &sub, ack_type, ids, persist_now)
    }

    /// Writes `sub`'s cursor record (and its state record when changed) now;
    /// see [`CursorWriter::persist`](crate::subscription::persist::CursorWriter::persist).
    pub(crate) fn persist_cursor(&self, topic: &Rc<Topic>, sub: &Rc<Subscription>) -> Result<u64, CoreError> {
        self.cursors.persist(topic, sub)
    }

    /// Queues `sub`'s cursor record for the next flush.
    pub(crate) fn mark_cursor_dirty(&self, topic: &Rc<Topic>, sub: &Rc<Subscription>) {
        self.cursors.dirty.mark_cursor(topic, sub);
    }

    /// Writes every changed cursor to the log. Returns the last position written.
    pub(super) fn flush_cursors(&self) -> Result<Option<u64>, CoreError> {
        self.flush_cursors_and_counts(false)
    }

    pub(super) fn flush_cursors_and_counts(&self, force_counts: bool) -> Result<Option<u64>, CoreError> {
        let dedup = self.flush_dedup()?;
        Ok(self.cursors.flush(force_counts)?.or(dedup))
    }
}
