//! The owner side of topic and subscription requests: publish, producers,
//! subscribe, ack, seek, dedup, ledgers and cursor persistence. Runs on the
//! shard that owns the topic; never crosses cores.

use super::routing::{OpResult, Reply};
use super::{persist_each, Shard, TopicPolicy, LEDGER_ID_SHARD_STRIDE};
use crate::api::{ConsumerRef, SeekTarget, SubscribeRequest};
use crate::clock::now_ms;
use crate::error::{CoreError, ErrorCode};
use crate::subscription::sub_state::SubState;
use crate::subscription::{NewConsumer, Subscription};
use crate::topic::ledgers::{LedgerInfo, Lookup, TopicLedgers};
use crate::topic::producers::Admission;
use crate::topic::Topic;
use crate::topic_name::{Domain, TopicName};
use bytes::Bytes;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use magnetar_wire::{AckType, InitialPosition, MessageId, ProducerAccessMode, SubscriptionType};
use std::rc::Rc;
use std::time::Duration;

pub(crate) fn valid_subscription_name(s: &str) -> bool {
    !s.is_empty() && s.len() <= 256 && s.chars().all(|c| !c.is_control())
}

impl Shard {
    pub(super) fn handle_send(
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
            // Validate the metadata now so that no consumer is ever handed an
            // entry it cannot decode.
            let peek = crate::entry::check_send(&blob, num_messages)?;
            let tracked = t.dedup.loaded.get() || t.dedup.loading.get();
            let seq = peek.sequence_id;
            let chunk = peek.chunk_id();
            if t.dedup.enabled.get() {
                if peek.producer_name != producer {
                    return Err(CoreError::new(
                        ErrorCode::ProtocolError,
                        format!("message metadata names producer {:?}, not {producer:?}", peek.producer_name),
                    ));
                }
                if let crate::topic::dedup::Check::Duplicate(original) = t.dedup.check(producer, seq, chunk) {
                    return Ok(Err((t, original)));
                }
            }
            let extras = peek.index_extras();
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
                            let id =
                                t.message_id(pos).unwrap_or_else(|| crate::topic::dedup::duplicate_id(t.partition));
                            Ok(Reply::Sent(id))
                        }
                        None => Ok(Reply::Sent(crate::topic::dedup::duplicate_id(t.partition))),
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
    pub(super) fn get_or_create_topic(
        self: &Rc<Self>,
        name: &TopicName,
    ) -> Result<(Rc<Topic>, Option<u64>), CoreError> {
        let key = name.to_string();
        if let Some(t) = self.topics.borrow().get(&key) {
            return Ok((t.clone(), None));
        }
        if name.domain == Domain::NonPersistent {
            return Err(CoreError::new(ErrorCode::NotAllowed, "non-persistent topics are not supported yet"));
        }
        let partition = name.partition().map(|p| p as i32).unwrap_or(-1);
        let (ledgers, created_lsn) = match self.store.topic_record(&key) {
            Some(list) => {
                let (ledgers, repaired) = self.recovered_ledgers(&key, list);
                if repaired {
                    self.store.put_topic_record(&key, &ledgers)?;
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
                let lsn = self.store.put_topic_record(&key, &ledgers)?;
                tracing::info!(topic = %key, ledger, shard = self.id, "created topic");
                (ledgers, Some(lsn))
            }
        };
        let topic = Rc::new(Topic::new(name.clone(), key.clone(), ledgers, partition));
        // Restore durable subscriptions.
        for (sub_name, v) in self.store.cursors(&key) {
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
                    match self.store.sub_state(&key, sub_name).map(|v| SubState::decode(&v)) {
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
    pub(super) fn recovered_ledgers(&self, topic: &str, mut list: Vec<LedgerInfo>) -> (TopicLedgers, bool) {
        let gone = crate::topic::ledgers::deleted_prefix(&list, |id| self.ledgers_at_start.contains(&id));
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
    /// [`crate::topic::ledgers::Rollover`]). Called before an append; a rollover
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
        let lsn = self.store.put_topic_record(&t.key, &next)?;
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
        Ok(self.store.put_topic_record(&t.key, &t.ledgers.borrow())?)
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

    /// Rebuilds the topic's dedup state: snapshot, then a replay of the
    /// durable entries after it. Appends made meanwhile are tracked live.
    pub(super) async fn ensure_dedup_loaded(self: &Rc<Self>, t: &Rc<Topic>) -> Result<(), CoreError> {
        while t.dedup.loading.get() {
            glommio::timer::sleep(Duration::from_millis(2)).await;
        }
        if t.dedup.loaded.get() {
            return Ok(());
        }
        t.dedup.loading.set(true);
        let result = async {
            let snap: crate::topic::dedup::Snapshot = match self.store.dedup_snapshot(&t.key) {
                Some(v) => serde_json::from_slice(&v).map_err(|e| {
                    CoreError::new(ErrorCode::PersistenceError, format!("unreadable dedup snapshot of {}: {e}", t.key))
                })?,
                None => crate::topic::dedup::Snapshot::default(),
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
                    Ok(blob) => match crate::entry::read(&blob) {
                        Ok(m) => t.dedup.record(m.producer_name, m.sequence_id, m.chunk_id(), m.num_messages, entry, 0),
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
    pub(super) fn flush_dedup(&self) -> Result<Option<u64>, CoreError> {
        let mut last = None;
        let topics: Vec<Rc<Topic>> = self.topics.borrow().values().cloned().collect();
        for t in topics {
            if !t.dedup.loaded.get() || t.dedup.loading.get() || !t.dedup.dirty.replace(false) {
                continue;
            }
            let snap = t.dedup.snapshot(t.next_entry.get());
            let bytes = serde_json::to_vec(&snap)
                .map_err(|e| CoreError::new(ErrorCode::UnknownError, format!("encoding a dedup snapshot: {e}")))?;
            last = Some(self.store.put_dedup_snapshot(&t.key, Bytes::from(bytes))?);
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

    /// The last durable entry of `topic` as `L:E:P:-1` (a batch's last
    /// message is not singled out), `None` when the topic has no entry.
    pub(super) fn last_message_id(&self, topic: &str) -> Result<Option<MessageId>, CoreError> {
        let tn = TopicName::parse(topic)?;
        let partition = tn.partition().and_then(|p| i32::try_from(p).ok()).unwrap_or(-1);
        let (ledgers, next) = match self.topics.borrow().get(topic) {
            Some(t) => (t.ledgers.borrow().clone(), t.durable_next.get()),
            None => {
                let Some(list) = self.store.topic_record(topic) else {
                    return Err(CoreError::new(ErrorCode::TopicNotFound, format!("topic {topic} does not exist")));
                };
                let (ledgers, _) = self.recovered_ledgers(topic, list);
                let next = ledgers.next();
                (ledgers, next)
            }
        };
        Ok(next.checked_sub(1).and_then(|p| ledgers.message_id(p, partition)))
    }

    pub(super) async fn handle_delete_topic(self: Rc<Self>, topic: &str) -> OpResult {
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
        let Some(list) = self.store.topic_record(topic) else {
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
        let mut lsn = self.store.delete_topic_records(topic, ledger)?;
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

    /// The first entry whose publish time is at or after `ms`, by binary
    /// search over the durable entries' metadata. Publish times are set by
    /// producers' clocks, so this assumes they grow with the entry id (a
    /// time index is issue #3's); an unreadable entry fails the seek.
    pub(super) async fn first_entry_published_at(&self, t: &Topic, ms: u64) -> Result<u64, CoreError> {
        let (mut lo, mut hi) = (t.ledgers.borrow().start(), t.durable_next.get());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let Some((ledger, entry)) = t.ledgers.borrow().locate(mid) else {
                // Deleted by retention meanwhile: search what is left.
                lo = t.ledgers.borrow().start().max(mid + 1);
                continue;
            };
            let blob = self.log.read(ledger, entry).await?;
            let published = crate::entry::read(&blob)
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
