//! Retention and TTL, enforced by each shard on the topics of its log.
//!
//! Every `retention_check_interval` the shard walks its topics (loading
//! those not loaded since the restart) and, with the namespace's policies
//! overridden by the topic's own where it has them
//! (`magnetar admin topics set-retention` / `set-message-ttl`):
//!
//! 1. **TTL** (`message_ttl_seconds` > 0): each durable subscription's
//!    cursor moves past the entries published more than the TTL ago (found
//!    by binary search over publish times, from the index without reading
//!    payloads); they count as acknowledged, delivered or not.
//! 2. **Age rollover**: a current ledger past the maximum age rolls over
//!    even when nobody writes, so an idle topic's data can be deleted.
//! 3. **Retention** (`retention_minutes`, `retention_size_mb`): the oldest
//!    closed ledgers that every durable subscription has acknowledged and
//!    that are beyond the retention time or size are deleted
//!    (`ledgers::ledgers_to_delete`; a topic without subscriptions counts
//!    as all acknowledged). The deletions go to the log first, then the
//!    new ledger list; a checkpoint then lets the storage remove every
//!    segment left without a live entry, and the disk watermark is measured
//!    again so that a refused produce resumes as soon as space is back.
//!
//! The decisions and the record rewrites are the topic's (here); the
//! shard's retention task (`shard/retention.rs`) walks its topics, asks for
//! their policies and applies these. One log line per deletion and per
//! expiry. Runs on the topic's shard; never crosses cores.

use super::ledgers::{ledgers_to_delete, Retention};
use super::{Topic, TopicCtx};
use crate::clock::now_ms;
use crate::error::CoreError;
use crate::subscription::Subscription;
use magnetar_storage::{EntryLog, StorageError};
use std::rc::Rc;

impl Topic {
    /// Deletes the ledgers that retention no longer keeps. Returns the
    /// log position of the new topic record when something was deleted.
    pub(crate) fn trim(&self, ctx: &TopicCtx<'_>, retention: Retention, now: u64) -> Result<Option<u64>, CoreError> {
        let subs: Vec<Rc<Subscription>> = self.subs.borrow().values().cloned().collect();
        let floor = subs.iter().filter(|s| s.durable).map(|s| s.cursor.borrow().ack_floor).min();
        let floor = floor.unwrap_or(self.next_entry.get());
        let victims = {
            let l = self.ledgers.borrow();
            let n = ledgers_to_delete(l.all(), floor, now, retention);
            l.all()[..n].to_vec()
        };
        let mut done = 0;
        for v in &victims {
            match ctx.log.delete_ledger(v.id) {
                Ok(_) => {}
                // Its last appends are not laid out in a batch yet: next pass.
                Err(StorageError::LedgerBusy { .. }) => break,
                Err(StorageError::LedgerDeleted { .. }) => {}
                Err(e) => return Err(e.into()),
            }
            done += 1;
            tracing::info!(
                topic = %self.key,
                ledger = v.id,
                entries = v.entries,
                bytes = v.bytes,
                closed_s_ago = now.saturating_sub(v.closed_ms) / 1000,
                retention_minutes = ?retention.time_ms.map(|m| m / 60_000),
                retention_bytes = ?retention.size_bytes,
                "retention: deleted ledger"
            );
        }
        if done == 0 {
            return Ok(None);
        }
        self.ledgers.borrow_mut().trim_front(done);
        let start = self.ledgers.borrow().start();
        // Durable subscriptions are past `start` already; a reader behind it
        // moves on to the oldest entry kept.
        for s in &subs {
            s.ack_below(&self.ledgers.borrow(), start);
        }
        Ok(Some(self.persist_record(ctx.store)?))
    }

    /// Moves every durable subscription past the entries published more
    /// than `ttl_ms` ago. Returns those whose cursor moved (their records are
    /// to be written).
    pub(crate) async fn expire(&self, log: &EntryLog, ttl_ms: u64) -> Vec<Rc<Subscription>> {
        let mut moved = Vec::new();
        let cutoff = now_ms().saturating_sub(ttl_ms);
        let subs: Vec<Rc<Subscription>> = self.subs.borrow().values().filter(|s| s.durable).cloned().collect();
        let Some(lowest) = subs.iter().map(|s| s.cursor.borrow().ack_floor).min() else { return moved };
        let end = self.durable_next.get();
        if lowest >= end {
            return moved;
        }
        let live = self.first_published_at_or_after(log, cutoff, lowest, end).await;
        for s in subs {
            let (floor, acked_above) = {
                let c = s.cursor.borrow();
                (c.ack_floor, c.acked.count_in(c.ack_floor, live))
            };
            if live <= floor || self.deleted.get() {
                continue;
            }
            if s.ack_below(&self.ledgers.borrow(), live) {
                tracing::info!(
                    topic = %self.key,
                    subscription = %s.name,
                    expired = live - floor - acked_above,
                    through = ?live.checked_sub(1).and_then(|p| self.message_id(p)),
                    ttl_s = ttl_ms / 1000,
                    "TTL: expired unacknowledged messages"
                );
                moved.push(s);
            }
        }
        moved
    }

    /// The first position in `[lo, hi)` published at or after `cutoff_ms`
    /// (`hi` when none), by binary search: publish times grow with positions
    /// when producers' clocks agree (Pulsar's expiry assumes the same).
    pub(crate) async fn first_published_at_or_after(
        &self,
        log: &EntryLog,
        cutoff_ms: u64,
        mut lo: u64,
        mut hi: u64,
    ) -> u64 {
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.publish_time(log, mid).await {
                Some(p) if p < cutoff_ms => lo = mid + 1,
                _ => hi = mid,
            }
        }
        lo
    }

    /// Publish time of a stored position: from the index, or from the entry's
    /// metadata when the index has none. `None` when unknown (not stored,
    /// unreadable): such an entry is never expired.
    async fn publish_time(&self, log: &EntryLog, pos: u64) -> Option<u64> {
        let (ledger, entry) = self.ledgers.borrow().locate(pos)?;
        if let Some(ie) = log.index_entry(ledger, entry).await.ok().flatten() {
            if ie.extras.publish_time_ms != 0 {
                return Some(ie.extras.publish_time_ms);
            }
        }
        let blob = log.read(ledger, entry).await.ok()?;
        crate::entry::read(&blob).ok().map(|m| m.publish_time_ms)
    }
}
