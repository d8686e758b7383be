//! The owner side of topic and subscription requests: publish, producers,
//! subscribe, ack, seek, dedup, ledgers and cursor persistence. Runs on the
//! shard that owns the topic; never crosses cores.

use super::routing::{OpResult, Reply};
use super::{Shard, TopicPolicy, LEDGER_ID_SHARD_STRIDE};
use crate::api::{ConsumerRef, SeekTarget, SubscribeRequest};
use crate::clock::now_ms;
use crate::error::{CoreError, ErrorCode};
use crate::subscription::sub_state::SubState;
use crate::subscription::{requests, Subscription};
use crate::topic::ledgers::{LedgerInfo, TopicLedgers};
use crate::topic::producers::Admission;
use crate::topic::Topic;
use crate::topic_name::{Domain, TopicName};
use bytes::Bytes;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use magnetar_wire::{AckType, MessageId, ProducerAccessMode, SubscriptionType};
use std::rc::Rc;
use std::time::Duration;

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
            if num_messages == 0 {
                return Err(CoreError::new(ErrorCode::ProtocolError, "send with num_messages 0"));
            }
            // A batch no consumer could split (`decode_batch` refuses it)
            // would be stored and then undeliverable; its count would also
            // inflate the backlog and rate figures.
            if num_messages > magnetar_wire::BATCH_MESSAGES_MAX {
                return Err(CoreError::new(
                    ErrorCode::ProtocolError,
                    format!(
                        "send says {num_messages} messages; a batch holds at most {}",
                        magnetar_wire::BATCH_MESSAGES_MAX
                    ),
                ));
            }
            // Validate the metadata now so that no consumer is ever handed an
            // entry it cannot decode.
            let peek = magnetar_wire::peek_message(&blob)
                .map_err(|e| CoreError::new(ErrorCode::ProtocolError, format!("bad message blob: {e}")))?;
            if peek.num_messages != 0 && peek.num_messages != num_messages {
                return Err(CoreError::new(
                    ErrorCode::ProtocolError,
                    format!("send says {num_messages} messages, its metadata {}", peek.num_messages),
                ));
            }
            let tracked = t.dedup.loaded.get() || t.dedup.loading.get();
            let seq = peek.sequence_id;
            let chunk = peek.chunk.map_or(0, |(id, _)| id);
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
            // The index keeps publish time and key hash beside the position,
            // for seek by time and lookup by key without reading payloads.
            let extras = magnetar_storage::IndexExtras {
                publish_time_ms: peek.publish_time_ms,
                key_hash: peek.partition_key.map_or(0, |k| magnetar_storage::key_hash(k.as_bytes())),
                tag_hash: magnetar_storage::tag_hash(peek.tag.map(str::as_bytes)),
            };
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
        let tn = TopicName::parse(topic).map_err(|e| CoreError::new(ErrorCode::InvalidTopicName, e.to_string()))?;
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
        let tn =
            TopicName::parse(&req.topic).map_err(|e| CoreError::new(ErrorCode::InvalidTopicName, e.to_string()))?;
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
        requests::attach(&t, &sub, &self, &self.cursors.dirty, &req, consumer)?;
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
                    Ok(blob) => match magnetar_wire::peek_message(&blob) {
                        Ok(p) => {
                            let chunk = p.chunk.map_or(0, |(id, _)| id);
                            t.dedup.record(p.producer_name, p.sequence_id, chunk, p.num_messages, entry, 0)
                        }
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
        let tn = TopicName::parse(topic).map_err(|e| CoreError::new(ErrorCode::InvalidTopicName, e.to_string()))?;
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
            let published = magnetar_wire::peek_message(&blob)
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

    /// Notes that a redelivery count of `sub` changed (see
    /// [`Dirty::mark_counts`](crate::subscription::persist::Dirty::mark_counts)).
    /// The entry point for code outside the dispatcher (which marks through
    /// its context); none calls it yet.
    #[allow(dead_code)]
    pub(crate) fn mark_counts_dirty(&self, topic: &Rc<Topic>, sub: &Rc<Subscription>) {
        self.cursors.dirty.mark_counts(topic, sub);
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
