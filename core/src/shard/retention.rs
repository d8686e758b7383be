//! The shard's retention task: every `retention_check_interval` it walks
//! its topics (loading those not loaded, and unloading them again after
//! their step when they are idle), asks shard 0
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
use crate::topic::Topic;
use crate::topic_name::TopicName;
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

/// One pass over every topic of the shard. A topic the pass loads (not
/// loaded before) is unloaded again right after its step when it is idle,
/// so that a pass never leaves every topic of the shard in memory
/// (`unload.rs`; unless unloading is off).
pub(crate) async fn enforce(shard: &Rc<Shard>) -> Result<(), CoreError> {
    let unload = !shard.config.topic_idle_unload.is_zero();
    let mut last_deletion = None;
    for name in shard.store.topic_names("", None, usize::MAX) {
        if shard.is_closed() {
            break;
        }
        let Ok(tn) = TopicName::parse(&name) else { continue };
        // Checked now, not when the names were read: a topic deleted
        // meanwhile must not be created again by loading it.
        let loaded = shard.topics.borrow().get(name.as_str()).cloned();
        if loaded.is_none() && !shard.store.topic_recorded(&name) {
            continue;
        }
        let (t, loaded_here) = match loaded {
            Some(t) => (t, false),
            None => match shard.get_or_create_topic(&tn) {
                Ok((t, _)) => (t, true),
                Err(e) => {
                    tracing::warn!(topic = %name, "retention: cannot load topic: {e}");
                    continue;
                }
            },
        };
        step(shard, &t, &mut last_deletion).await?;
        if loaded_here && unload {
            shard.unload_if_idle(t, 0, now_ms());
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

/// Retention and TTL on one topic; `last_deletion` is the log position of
/// the last record of a deletion.
async fn step(shard: &Rc<Shard>, t: &Rc<Topic>, last_deletion: &mut Option<u64>) -> Result<(), CoreError> {
    // Per topic, not per namespace: a topic may override its namespace's
    // retention and TTL (`crate::topic_policies`). One mesh hop to shard 0
    // per topic and pass; passes are minutes apart.
    let policies = match shard.call(0, Op::TopicPolicy { topic: t.key.clone(), caller: None }).await {
        Ok(Reply::Policy(p)) => Some(p.policies),
        Ok(_) => None,
        Err(e) => {
            tracing::debug!(topic = %t.key, "retention: no policies ({e}); topic left alone");
            None
        }
    };
    let Some(policies) = policies else { return Ok(()) };
    if t.deleted.get() || shard.is_closed() {
        return Ok(());
    }
    if policies.message_ttl_seconds > 0 {
        for s in t.expire(&shard.log, policies.message_ttl_seconds.saturating_mul(1000)).await {
            shard.mark_cursor_dirty(t, &s);
        }
    }
    if t.deleted.get() || shard.is_closed() {
        return Ok(());
    }
    let now = now_ms();
    t.maybe_roll(&shard.topic_ctx());
    let retention = Retention::from_policy(policies.retention_minutes, policies.retention_size_mb);
    if let Some(lsn) = t.trim(&shard.topic_ctx(), retention, now)? {
        *last_deletion = Some(lsn);
    }
    Ok(())
}
