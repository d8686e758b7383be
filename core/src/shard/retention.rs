//! The shard's retention task: every `retention_check_interval` it walks
//! its topics (loading those not loaded since the restart), asks shard 0
//! for each one's policies and applies the topic's retention decisions
//! (`topic/retention.rs`): TTL, age rollover, deletion of old ledgers.
//! After deletions a checkpoint lets the storage remove every segment left
//! without a live entry, and the disk watermark is measured again so that a
//! refused produce resumes as soon as space is back. Runs in the shard's
//! dispatch task queue (background work, fewer shares than the fsync path).

use super::{Op, Reply, Shard};
use crate::clock::now_ms;
use crate::error::CoreError;
use crate::topic::ledgers::Retention;
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
        let policies = match shard.call(0, Op::TopicPolicy { topic: t.key.clone(), caller: None }).await {
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
            for s in t.expire(&shard.log, policies.message_ttl_seconds.saturating_mul(1000)).await {
                shard.mark_cursor_dirty(&t, &s);
            }
        }
        if t.deleted.get() || shard.is_closed() {
            continue;
        }
        let now = now_ms();
        t.maybe_roll(&shard.topic_ctx());
        let retention = Retention::from_policy(policies.retention_minutes, policies.retention_size_mb);
        if let Some(lsn) = t.trim(&shard.topic_ctx(), retention, now)? {
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
