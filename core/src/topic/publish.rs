//! A topic's publish path and its ledger rollover. Runs on the topic's
//! shard; never crosses cores.

use super::dedup::{duplicate_id, Check};
use super::{Topic, TopicCtx};
use crate::clock::now_ms;
use crate::config::BrokerConfig;
use crate::error::{CoreError, ErrorCode};
use bytes::Bytes;
use magnetar_storage::{EntryLog, NewEntry};
use magnetar_wire::MessageId;

/// What [`Topic::publish`] did with a send.
pub(crate) enum Published {
    /// Appended at position `pos` with message id `id`; durable once the
    /// log's position `lsn` is.
    Appended { id: MessageId, pos: u64, lsn: u64 },
    /// A resend deduplication recognised: not stored again. The original's
    /// `(position, log position)` when it is remembered.
    Duplicate(Option<(u64, u64)>),
}

/// Refuses a message over the configured size, whatever its topic's kind.
pub(crate) fn check_message_size(config: &BrokerConfig, len: usize) -> Result<(), CoreError> {
    if len > config.message_bytes_max as usize {
        return Err(CoreError::new(
            ErrorCode::MessageTooLarge,
            format!("message of {len} bytes exceeds the limit of {}", config.message_bytes_max),
        ));
    }
    Ok(())
}

impl Topic {
    /// Appends a send of `producer` (its blob checked first, so that no
    /// consumer is ever handed an entry it cannot decode), or recognises
    /// it as a resend. The append is not durable yet: the caller waits
    /// for the log's `lsn`, then calls [`Topic::on_durable`].
    pub(crate) fn publish(
        &self,
        ctx: &TopicCtx<'_>,
        producer: &str,
        num_messages: u32,
        blob: Bytes,
        blob_crc: Option<u32>,
    ) -> Result<Published, CoreError> {
        self.producers.borrow().check_send(&self.key, producer)?;
        check_message_size(ctx.config, blob.len())?;
        let meta = crate::entry::check_send(&blob, num_messages)?;
        // Tracked while loading too: the replay stops where appends began.
        let tracked = self.dedup.loaded.get() || self.dedup.loading.get();
        let seq = meta.sequence_id;
        let chunk = meta.chunk_id();
        if self.dedup.enabled.get() {
            if meta.producer_name != producer {
                return Err(CoreError::new(
                    ErrorCode::ProtocolError,
                    format!("message metadata names producer {:?}, not {producer:?}", meta.producer_name),
                ));
            }
            if let Check::Duplicate(original) = self.dedup.check(producer, seq, chunk) {
                return Ok(Published::Duplicate(original));
            }
        }
        let extras = meta.index_extras();
        self.maybe_roll(ctx);
        let (ledger, first) = {
            let l = self.ledgers.borrow();
            (l.current().id, l.current().first)
        };
        let bytes = blob.len() as u64;
        let a = ctx.log.append(ledger, NewEntry { body: blob, extras, body_crc: blob_crc })?;
        self.ledgers.borrow_mut().appended(a.entry, bytes);
        let pos = first + a.entry;
        self.rate_in.record(now_ms(), u64::from(num_messages), bytes);
        self.note_messages(pos, num_messages);
        assert_eq!(pos, self.next_entry.get(), "positions of a topic are dense");
        self.next_entry.set(pos + 1);
        if tracked {
            self.dedup.record(producer, seq, chunk, num_messages, pos, a.lsn);
        }
        let id = MessageId::new(ledger, a.entry, self.partition, -1);
        Ok(Published::Appended { id, pos, lsn: a.lsn })
    }

    /// The receipt of a resend ([`Published::Duplicate`]): the original's
    /// id once it is durable, or [`duplicate_id`] when it is not remembered
    /// or retention deleted its ledger since.
    pub(crate) async fn resend_receipt(
        &self,
        log: &EntryLog,
        original: Option<(u64, u64)>,
    ) -> Result<MessageId, CoreError> {
        match original {
            Some((pos, lsn)) => {
                log.wait_durable(lsn).await?;
                Ok(self.message_id(pos).unwrap_or_else(|| duplicate_id(self.partition)))
            }
            None => Ok(duplicate_id(self.partition)),
        }
    }

    /// Rolls the current ledger over if it is due (see
    /// [`crate::topic::ledgers::Rollover`]). Called before an append; a
    /// rollover that cannot be written leaves the current ledger in place
    /// (if the log failed, the append right after reports it).
    pub(crate) fn maybe_roll(&self, ctx: &TopicCtx<'_>) {
        let now = now_ms();
        if ctx.config.ledger_rollover.due(&self.ledgers.borrow(), now) {
            if let Err(e) = self.roll_ledger(ctx, now) {
                tracing::warn!(topic = %self.key, "ledger rollover failed, appending to the current ledger: {e}");
            }
        }
    }

    /// Closes the current ledger and opens a new one. The new list is a
    /// metadata record in the same log, ahead of every append to the new
    /// ledger, so a crash can never leave entries of a ledger the topic
    /// does not list; producers do not wait for it (their appends queue
    /// behind it in the same group commit).
    pub(crate) fn roll_ledger(&self, ctx: &TopicCtx<'_>, now: u64) -> Result<u64, CoreError> {
        let id = ctx.ledger_ids.allocate();
        let mut next = self.ledgers.borrow().clone();
        let closed = next.current().clone();
        next.roll(id, now);
        let lsn = ctx.store.put_topic_record(&self.key, &next)?;
        *self.ledgers.borrow_mut() = next;
        tracing::info!(
            topic = %self.key,
            closed = closed.id,
            entries = closed.entries,
            bytes = closed.bytes,
            ledger = id,
            "ledger rolled over"
        );
        Ok(lsn)
    }

    /// Writes the topic record (after retention changed the ledger list).
    pub(crate) fn persist_record(&self, store: &crate::store::Store) -> Result<u64, CoreError> {
        Ok(store.put_topic_record(&self.key, &self.ledgers.borrow())?)
    }
}
