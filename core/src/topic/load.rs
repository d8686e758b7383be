//! A topic's life on its shard: loaded from its record (its ledgers
//! recovered from the log) or created, asked for its last message id or the
//! first entry published at a time, and deleted. The shard's registry holds
//! the loaded topics; these functions take the loaded one when there is one.
//! Runs on the topic's shard; never crosses cores.

use super::ledgers::{deleted_prefix, LedgerInfo, TopicLedgers};
use super::{Topic, TopicCtx};
use crate::clock::now_ms;
use crate::error::{CoreError, ErrorCode};
use crate::metadata::Policies;
use crate::topic_name::{Domain, TopicName};
use magnetar_storage::EntryLog;
use magnetar_wire::MessageId;
use std::rc::Rc;

/// Loads the topic `name` (full name `key`) from its record, or creates it
/// with one empty ledger. Returns the log position of its creation record
/// when it was created now. Its subscriptions are not restored here.
pub(crate) fn load_or_create(
    ctx: &TopicCtx<'_>,
    name: &TopicName,
    key: String,
) -> Result<(Rc<Topic>, Option<u64>), CoreError> {
    if name.domain == Domain::NonPersistent {
        return Err(CoreError::new(ErrorCode::NotAllowed, "non-persistent topics are not supported yet"));
    }
    let partition = name.partition().map(|p| p as i32).unwrap_or(-1);
    let (ledgers, created_lsn) = match ctx.store.topic_record(&key) {
        Some(list) => {
            let (ledgers, repaired) = recovered_ledgers(ctx, &key, list);
            if repaired {
                ctx.store.put_topic_record(&key, &ledgers)?;
            }
            (ledgers, None)
        }
        None => {
            let ledger = ctx.ledger_ids.allocate();
            let ledgers = TopicLedgers::new(vec![LedgerInfo {
                id: ledger,
                first: 0,
                entries: 0,
                bytes: 0,
                created_ms: now_ms(),
                closed_ms: 0,
            }]);
            let lsn = ctx.store.put_topic_record(&key, &ledgers)?;
            tracing::info!(topic = %key, ledger, shard = ctx.ledger_ids.shard(), "created topic");
            (ledgers, Some(lsn))
        }
    };
    Ok((Rc::new(Topic::new(name.clone(), key, ledgers, partition)), created_lsn))
}

/// A topic's ledgers from its record and the log: the current ledger's
/// entries and bytes come from the log; leading closed ledgers the log
/// no longer has were deleted by retention just before a crash (the
/// deletion is written before the record) and are dropped. Returns
/// whether the list changed that way (the caller rewrites the record).
pub(crate) fn recovered_ledgers(ctx: &TopicCtx<'_>, topic: &str, mut list: Vec<LedgerInfo>) -> (TopicLedgers, bool) {
    let gone = deleted_prefix(&list, |id| ctx.ledger_ids.existed_at_start(id));
    if gone > 0 {
        let ids: Vec<u64> = list[..gone].iter().map(|l| l.id).collect();
        tracing::info!(topic, ledgers = ?ids, "ledgers deleted by retention before a restart dropped from the topic");
        list.drain(..gone);
    }
    let cur = list.last_mut().expect("a topic record lists a ledger");
    cur.entries = ctx.log.next_entry(cur.id);
    cur.bytes = ctx.log.ledger_bytes(cur.id);
    if cur.created_ms == 0 {
        // A version 1 record does not say: count its age from now.
        cur.created_ms = now_ms();
    }
    (TopicLedgers::new(list), gone > 0)
}

/// Refuses to create `tn` when its namespace does not auto-create topics,
/// unless it is a partition of a partitioned topic (`in_partitioned`) or
/// already `exists`.
pub(crate) fn check_auto_creation(
    tn: &TopicName,
    policies: &Policies,
    in_partitioned: bool,
    exists: impl FnOnce() -> bool,
) -> Result<(), CoreError> {
    if !in_partitioned && !policies.auto_topic_creation && !exists() {
        return Err(CoreError::new(
            ErrorCode::TopicNotFound,
            format!(
                "topic {tn} does not exist and namespace {} does not create topics automatically",
                tn.namespace_name()
            ),
        ));
    }
    Ok(())
}

/// The last durable entry of topic `key` as `L:E:P:-1` (a batch's last
/// message is not singled out), `None` when the topic has no entry.
/// `loaded` is the topic when its shard has it loaded; otherwise its record
/// answers (loading nothing).
pub(crate) fn last_message_id(
    ctx: &TopicCtx<'_>,
    key: &str,
    loaded: Option<&Topic>,
) -> Result<Option<MessageId>, CoreError> {
    let tn = TopicName::parse(key)?;
    let partition = tn.partition().and_then(|p| i32::try_from(p).ok()).unwrap_or(-1);
    let (ledgers, next) = match loaded {
        Some(t) => (t.ledgers.borrow().clone(), t.durable_next.get()),
        None => {
            let Some(list) = ctx.store.topic_record(key) else {
                return Err(CoreError::new(ErrorCode::TopicNotFound, format!("topic {key} does not exist")));
            };
            let (ledgers, _) = recovered_ledgers(ctx, key, list);
            let next = ledgers.next();
            (ledgers, next)
        }
    };
    Ok(next.checked_sub(1).and_then(|p| ledgers.message_id(p, partition)))
}

/// Whether topic `key` may be deleted now: it exists (`loaded`, or
/// recorded) and nothing is attached to it. Returns its recorded ledgers,
/// for [`delete_storage`].
pub(crate) fn check_deletable(
    ctx: &TopicCtx<'_>,
    key: &str,
    loaded: Option<&Topic>,
) -> Result<Vec<LedgerInfo>, CoreError> {
    let not_found = || CoreError::new(ErrorCode::TopicNotFound, format!("topic {key} does not exist"));
    if loaded.is_none() && !ctx.store.topic_recorded(key) {
        return Err(not_found());
    }
    if let Some(t) = loaded {
        let (producers, consumers) = t.attached();
        if producers > 0 || consumers > 0 {
            return Err(CoreError::new(
                ErrorCode::NotAllowed,
                format!("topic {key} has connected producers or consumers"),
            ));
        }
    }
    ctx.store.topic_record(key).ok_or_else(not_found)
}

/// Erases the records and ledgers of topic `key` (`ledgers`, from
/// [`check_deletable`]; the caller has unloaded it) and waits until that is
/// durable.
pub(crate) async fn delete_storage(ctx: &TopicCtx<'_>, key: &str, ledgers: &[LedgerInfo]) -> Result<(), CoreError> {
    let newest = ledgers.last().map_or(0, |l| l.id);
    // The newest ledger id stays reserved (x/ record, a version 1 topic
    // record) so that the allocator never hands it (or an older one)
    // out again; the ledgers themselves are deleted, freeing the space.
    let mut lsn = ctx.store.delete_topic_records(key, newest)?;
    // The ledgers go after the topic record: a crash in between leaves
    // ledgers no record names, which the next start deletes (see
    // `orphan_ledgers`), never a topic whose ledgers are gone.
    for l in ledgers {
        match ctx.log.delete_ledger(l.id) {
            Ok(d) => lsn = d,
            // Never written to, or already gone.
            Err(magnetar_storage::StorageError::LedgerDeleted { .. }) => {}
            Err(e) => tracing::warn!(topic = key, ledger = l.id, "deleting a ledger of a deleted topic: {e}"),
        }
    }
    ctx.log.wait_durable(lsn).await?;
    tracing::info!(topic = key, ledger = newest, shard = ctx.ledger_ids.shard(), "deleted topic");
    Ok(())
}

impl Topic {
    /// The first entry whose publish time is at or after `ms`, by binary
    /// search over the durable entries' metadata. Publish times are set by
    /// producers' clocks, so this assumes they grow with the position (as
    /// Pulsar's seek by time does); an unreadable entry fails the search.
    pub(crate) async fn first_entry_published_at(&self, log: &EntryLog, ms: u64) -> Result<u64, CoreError> {
        let (mut lo, mut hi) = (self.ledgers.borrow().start(), self.durable_next.get());
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let Some((ledger, entry)) = self.ledgers.borrow().locate(mid) else {
                // Deleted by retention meanwhile: search what is left.
                lo = self.ledgers.borrow().start().max(mid + 1);
                continue;
            };
            let blob = log.read(ledger, entry).await?;
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
}
