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
//! One log line per deletion and per expiry. Runs in the shard's dispatch
//! task queue (background work, fewer shares than the fsync path).

use crate::clock::now_ms;
use crate::error::CoreError;
use crate::shard::{Op, Reply, Shard};
use crate::subscription::Subscription;
use crate::topic::ledgers::{ledgers_to_delete, Retention};
use crate::topic::Topic;
use magnetar_storage::StorageError;
use std::rc::Rc;

/// Starts the shard's retention task.
pub(crate) fn spawn(shard: Rc<Shard>) {
    let tq = shard.dispatch_tq;
    match glommio::spawn_local_into(run(shard), tq) {
        Ok(t) => {
            t.detach();
        }
        Err(e) => tracing::error!("cannot spawn the retention task: {e}"),
    }
}

async fn run(shard: Rc<Shard>) {
    let interval = shard.config.retention_check_interval;
    loop {
        glommio::timer::sleep(interval).await;
        if shard.is_closed() {
            return;
        }
        match enforce(&shard).await {
            Ok(()) => {}
            // Shutdown closed the log under the pass: nothing is wrong.
            Err(_) if shard.is_closed() => return,
            Err(e) => tracing::error!(shard = shard.id, "retention pass failed: {e}"),
        }
    }
}

/// One pass over every topic of the shard.
pub(crate) async fn enforce(shard: &Rc<Shard>) -> Result<(), CoreError> {
    let topics = shard.load_all_topics();
    let mut last_deletion = None;
    for t in topics {
        // Per topic, not per namespace: a topic may override its
        // namespace's retention and TTL (`crate::topic_policies`). One
        // mesh hop to shard 0 per topic and pass; passes are minutes apart.
        let policies = match shard.call(0, Op::TopicPolicy { topic: t.key.clone() }).await {
            Ok(Reply::Policy(p)) => Some(p.policies),
            Ok(_) => None,
            Err(e) => {
                tracing::debug!(topic = %t.key, "retention: no policies ({e}); topic left alone");
                None
            }
        };
        let Some(policies) = policies else { continue };
        if t.deleted.get() || shard.is_closed() {
            continue;
        }
        if policies.message_ttl_seconds > 0 {
            expire(shard, &t, policies.message_ttl_seconds.saturating_mul(1000)).await;
        }
        if t.deleted.get() || shard.is_closed() {
            continue;
        }
        let now = now_ms();
        shard.maybe_roll(&t);
        let retention = Retention::from_policy(policies.retention_minutes, policies.retention_size_mb);
        if let Some(lsn) = trim(shard, &t, retention, now)? {
            last_deletion = Some(lsn);
        }
    }
    if let Some(lsn) = last_deletion {
        shard.log.wait_durable(lsn).await?;
        if shard.is_closed() {
            return Ok(()); // the clean close writes the checkpoint
        }
        // Segments go only once a durable checkpoint covers the deletions.
        shard.log.checkpoint().await?;
        shard.measure_disk();
    }
    Ok(())
}

/// Deletes the ledgers of `t` that retention no longer keeps. Returns the
/// log position of the new topic record when something was deleted.
fn trim(shard: &Shard, t: &Topic, retention: Retention, now: u64) -> Result<Option<u64>, CoreError> {
    let subs: Vec<Rc<Subscription>> = t.subs.borrow().values().cloned().collect();
    let floor = subs.iter().filter(|s| s.durable).map(|s| s.cursor.borrow().ack_floor).min();
    let floor = floor.unwrap_or(t.next_entry.get());
    let victims = {
        let l = t.ledgers.borrow();
        let n = ledgers_to_delete(l.all(), floor, now, retention);
        l.all()[..n].to_vec()
    };
    let mut done = 0;
    for v in &victims {
        match shard.log.delete_ledger(v.id) {
            Ok(_) => {}
            // Its last appends are not laid out in a batch yet: next pass.
            Err(StorageError::LedgerBusy { .. }) => break,
            Err(StorageError::LedgerDeleted { .. }) => {}
            Err(e) => return Err(e.into()),
        }
        done += 1;
        tracing::info!(
            topic = %t.key,
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
    t.ledgers.borrow_mut().trim_front(done);
    let start = t.ledgers.borrow().start();
    // Durable subscriptions are past `start` already; a reader behind it
    // moves on to the oldest entry kept.
    for s in &subs {
        s.ack_below(&t.ledgers.borrow(), start);
    }
    Ok(Some(shard.persist_topic_record(t)?))
}

/// Moves every durable subscription of `t` past the entries published more
/// than `ttl_ms` ago.
async fn expire(shard: &Rc<Shard>, t: &Rc<Topic>, ttl_ms: u64) {
    let cutoff = now_ms().saturating_sub(ttl_ms);
    let subs: Vec<Rc<Subscription>> = t.subs.borrow().values().filter(|s| s.durable).cloned().collect();
    let Some(lowest) = subs.iter().map(|s| s.cursor.borrow().ack_floor).min() else { return };
    let end = t.durable_next.get();
    if lowest >= end {
        return;
    }
    let live = first_published_at_or_after(shard, t, cutoff, lowest, end).await;
    for s in subs {
        let (floor, acked_above) = {
            let c = s.cursor.borrow();
            (c.ack_floor, c.acked.count_in(c.ack_floor, live))
        };
        if live <= floor || t.deleted.get() {
            continue;
        }
        if s.ack_below(&t.ledgers.borrow(), live) {
            shard.mark_cursor_dirty(t, &s);
            tracing::info!(
                topic = %t.key,
                subscription = %s.name,
                expired = live - floor - acked_above,
                through = ?live.checked_sub(1).and_then(|p| t.message_id(p)),
                ttl_s = ttl_ms / 1000,
                "TTL: expired unacknowledged messages"
            );
        }
    }
}

/// The first position in `[lo, hi)` published at or after `cutoff_ms`
/// (`hi` when none), by binary search: publish times grow with positions
/// when producers' clocks agree (Pulsar's expiry assumes the same).
async fn first_published_at_or_after(shard: &Shard, t: &Topic, cutoff_ms: u64, mut lo: u64, mut hi: u64) -> u64 {
    while lo < hi {
        let mid = lo + (hi - lo) / 2;
        match publish_time(shard, t, mid).await {
            Some(p) if p < cutoff_ms => lo = mid + 1,
            _ => hi = mid,
        }
    }
    lo
}

/// Publish time of a stored position: from the index, or from the entry's
/// metadata when the index has none. `None` when unknown (not stored,
/// unreadable): such an entry is never expired.
async fn publish_time(shard: &Shard, t: &Topic, pos: u64) -> Option<u64> {
    let (ledger, entry) = t.ledgers.borrow().locate(pos)?;
    if let Some(ie) = shard.log.index_entry(ledger, entry) {
        if ie.extras.publish_time_ms != 0 {
            return Some(ie.extras.publish_time_ms);
        }
    }
    let blob = shard.log.read(ledger, entry).await.ok()?;
    crate::entry::read(&blob).ok().map(|m| m.publish_time_ms)
}
