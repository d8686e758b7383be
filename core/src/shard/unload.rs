//! Idle topics leave memory. A loaded topic idle for
//! `topic_idle_unload` (no producer, no consumer, nothing held only in
//! memory: [`Topic::unloadable`]) is dropped from its shard's registry;
//! its next request loads it again from its records, as after a restart.
//! A sweep per shard finds them, in the dispatch task queue, yielding every
//! [`SWEEP_YIELD_EVERY`] topics; the retention pass unloads at once the
//! idle topics it loaded itself (`retention.rs`).
//!
//! There is never a second instance of one topic: the unload is
//! synchronous (no await between the checks and the removal), and it
//! requires the registry to hold the topic's only strong reference besides
//! the sweep's own. Every handler that awaits holds an `Rc<Topic>` (as do
//! the queues of dirty cursors and a dispatcher during a pass; a waiting
//! dispatcher holds a `Weak`), so a topic some task is using is never
//! removed, and a removed topic is freed on the spot: its dispatchers find
//! it gone and stop. Runs on the shard; never crosses cores.

use super::Shard;
use crate::clock::now_ms;
use crate::topic::Topic;
use std::rc::{Rc, Weak};
use std::time::Duration;

/// Topics the sweep looks at between two chances to yield.
const SWEEP_YIELD_EVERY: usize = 256;

/// Starts the shard's unload sweep (none when unloading is off).
pub(crate) fn spawn(shard: Rc<Shard>) {
    let idle = shard.config.topic_idle_unload;
    if idle.is_zero() {
        return;
    }
    let tq = shard.dispatch_tq;
    match glommio::spawn_local_into(run(shard, idle), tq) {
        Ok(t) => {
            t.detach();
        }
        Err(e) => tracing::error!("cannot spawn the topic unload sweep: {e}"),
    }
}

/// How often the sweep runs: a quarter of the idle time, within bounds, so a
/// topic leaves memory at most about half again its idle time after it
/// became idle.
fn sweep_interval(idle: Duration) -> Duration {
    (idle / 4).clamp(Duration::from_millis(100), Duration::from_secs(15))
}

async fn run(shard: Rc<Shard>, idle: Duration) {
    let idle_ms = idle.as_millis() as u64;
    loop {
        glommio::timer::sleep(sweep_interval(idle)).await;
        if shard.is_closed() {
            return;
        }
        sweep(&shard, idle_ms).await;
    }
}

/// One pass over the loaded topics: unloads those idle for `idle_ms`.
/// Returns how many it unloaded.
pub(crate) async fn sweep(shard: &Rc<Shard>, idle_ms: u64) -> usize {
    // Weak: the list itself must not make every topic look busy.
    let loaded: Vec<Weak<Topic>> = shard.topics.borrow().values().map(Rc::downgrade).collect();
    let mut unloaded = 0;
    for (i, t) in loaded.into_iter().enumerate() {
        if i % SWEEP_YIELD_EVERY == SWEEP_YIELD_EVERY - 1 {
            glommio::yield_if_needed().await;
        }
        if shard.is_closed() || shard.draining.get() {
            break;
        }
        if let Some(t) = t.upgrade() {
            unloaded += usize::from(shard.unload_if_idle(t, idle_ms, now_ms()));
        }
    }
    unloaded
}

impl Shard {
    /// Unloads `t` if it is idle now and was at every look for `idle_ms`
    /// (0: idle now is enough). Returns whether it did. Synchronous, and
    /// `t` must be the caller's only strong reference: with the registry's
    /// that makes two, and any more means some task holds the topic.
    pub(crate) fn unload_if_idle(&self, t: Rc<Topic>, idle_ms: u64, now: u64) -> bool {
        let registered = self.topics.borrow().get(&t.key).is_some_and(|r| Rc::ptr_eq(r, &t));
        if !registered || Rc::strong_count(&t) != 2 || !t.unloadable() {
            t.idle_since_ms.set(0);
            return false;
        }
        if t.idle_since_ms.get() == 0 {
            t.idle_since_ms.set(now);
        }
        if now.saturating_sub(t.idle_since_ms.get()) < idle_ms {
            return false;
        }
        let removed = self.topics.borrow_mut().remove(&t.key);
        assert!(removed.is_some_and(|r| Rc::ptr_eq(&r, &t)), "the registry changed under a synchronous unload");
        self.metrics.topics_loaded.sub(1);
        self.metrics.topics_unloaded.add(1);
        // Their upgrade fails now: each dispatcher stops at this wake-up.
        for s in t.subs.borrow().values() {
            s.wake.notify();
        }
        tracing::debug!(shard = self.id, topic = %t.key, idle_s = now.saturating_sub(t.idle_since_ms.get()) / 1000, "unloaded idle topic");
        assert!(Rc::try_unwrap(t).is_ok(), "an unloaded topic had another strong reference");
        true
    }
}

#[cfg(test)]
mod tests {
    use super::sweep_interval;
    use std::time::Duration;

    #[test]
    fn the_sweep_runs_within_bounds() {
        assert_eq!(sweep_interval(Duration::from_secs(1)), Duration::from_millis(250));
        assert_eq!(sweep_interval(Duration::from_secs(60)), Duration::from_secs(15));
        assert_eq!(sweep_interval(Duration::from_secs(3600)), Duration::from_secs(15));
        assert_eq!(sweep_interval(Duration::from_millis(1)), Duration::from_millis(100));
    }
}
