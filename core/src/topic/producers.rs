//! Producers of one topic and their access modes (Pulsar's `Shared`,
//! `Exclusive`, `WaitForExclusive`, `ExclusiveWithFencing`).
//!
//! Owned by the topic's shard; never crosses cores.

use crate::error::{CoreError, ErrorCode};
use crate::metadata::Policies;
use futures::channel::oneshot;
use magnetar_wire::ProducerAccessMode;
use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};

/// Most producers waiting for exclusive access to one topic.
pub const EXCLUSIVE_WAITERS_MAX: usize = 1024;

/// What `add` decided.
pub(crate) enum Admission {
    /// The producer is attached.
    Attached,
    /// `WaitForExclusive`: attached once this resolves (the topic inserts
    /// the name before resolving it).
    Wait(oneshot::Receiver<()>),
}

#[derive(Default)]
pub(crate) struct TopicProducers {
    names: HashMap<String, ProducerAccessMode>,
    /// `WaitForExclusive` producers in arrival order.
    waiters: VecDeque<(String, oneshot::Sender<()>)>,
    /// Names fenced off by an `ExclusiveWithFencing` producer; their sends
    /// fail with `ProducerFenced` until they close.
    fenced: HashSet<String>,
}

impl TopicProducers {
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    fn exclusive_holder(&self) -> Option<&str> {
        self.names.iter().find(|(_, m)| **m != ProducerAccessMode::Shared).map(|(n, _)| n.as_str())
    }

    /// Attaches `name` with `mode`, within `max` producers (0 = unlimited).
    pub(crate) fn add(
        &mut self,
        topic: &str,
        name: &str,
        mode: ProducerAccessMode,
        max: u32,
    ) -> Result<Admission, CoreError> {
        if self.names.contains_key(name) || self.waiters.iter().any(|(n, _)| n == name) {
            return Err(CoreError::new(
                ErrorCode::ProducerBusy,
                format!("producer {name:?} is already connected to {topic}"),
            ));
        }
        let busy = |holder: &str| {
            CoreError::new(
                ErrorCode::ProducerBusy,
                format!("topic {topic} has an exclusive producer ({holder:?}); producer {name:?} refused"),
            )
        };
        if max != 0 && self.names.len() >= max as usize && mode != ProducerAccessMode::ExclusiveWithFencing {
            if mode == ProducerAccessMode::WaitForExclusive && !self.names.is_empty() {
                // It waits anyway; the limit is checked again when it takes over.
            } else {
                return Err(CoreError::new(
                    ErrorCode::ProducerBusy,
                    format!("topic {topic} reached the namespace's max_producers_per_topic ({max})"),
                ));
            }
        }
        match mode {
            ProducerAccessMode::Shared => {
                if let Some(holder) = self.exclusive_holder() {
                    return Err(busy(holder));
                }
            }
            ProducerAccessMode::Exclusive => {
                if let Some((holder, _)) = self.names.iter().next() {
                    return Err(busy(holder));
                }
            }
            ProducerAccessMode::WaitForExclusive => {
                if !self.names.is_empty() {
                    if self.waiters.len() >= EXCLUSIVE_WAITERS_MAX {
                        return Err(CoreError::new(ErrorCode::TooManyRequests, "too many producers waiting"));
                    }
                    let (tx, rx) = oneshot::channel();
                    self.waiters.push_back((name.to_string(), tx));
                    return Ok(Admission::Wait(rx));
                }
            }
            ProducerAccessMode::ExclusiveWithFencing => {
                for (old, _) in self.names.drain() {
                    self.fenced.insert(old);
                }
            }
        }
        self.fenced.remove(name);
        self.names.insert(name.to_string(), mode);
        Ok(Admission::Attached)
    }

    /// Detaches `name` (or drops it from the wait queue); hands the topic to
    /// the first live waiter when it became free.
    pub(crate) fn remove(&mut self, name: &str) {
        self.fenced.remove(name);
        self.waiters.retain(|(n, _)| n != name);
        if self.names.remove(name).is_none() || !self.names.is_empty() {
            return;
        }
        while let Some((next, tx)) = self.waiters.pop_front() {
            self.names.insert(next.clone(), ProducerAccessMode::WaitForExclusive);
            if tx.send(()).is_ok() {
                return;
            }
            // The waiting request is gone (its connection closed).
            self.names.remove(&next);
        }
    }

    /// Whether `name` may send now.
    pub(crate) fn check_send(&self, topic: &str, name: &str) -> Result<(), CoreError> {
        if self.names.contains_key(name) {
            return Ok(());
        }
        if self.fenced.contains(name) {
            return Err(CoreError::new(
                ErrorCode::ProducerFenced,
                format!("producer {name:?} was fenced off {topic} by an exclusive producer"),
            ));
        }
        Err(CoreError::new(ErrorCode::ProducerNotFound, format!("producer {name:?} is not attached to {topic}")))
    }
}

/// Names for producers that asked for none, unique in the cluster's
/// lifetime: the shard, when it started, and a counter.
pub(crate) struct ProducerNames {
    shard: u32,
    started_ms: u64,
    next: Cell<u64>,
}

impl ProducerNames {
    pub(crate) fn new(shard: u32, started_ms: u64) -> Self {
        Self { shard, started_ms, next: Cell::new(0) }
    }

    /// `requested`, or a new name when it is empty.
    pub(crate) fn or_generate(&self, requested: String) -> String {
        if !requested.is_empty() {
            return requested;
        }
        let n = self.next.get();
        self.next.set(n + 1);
        format!("magnetar-{}-{}-{}", self.shard, self.started_ms, n)
    }
}

impl super::Topic {
    /// Attaches producer `name` with `mode` under the namespace's
    /// `policies` (deduplication state loaded first when it is on), waiting
    /// for exclusive access under `WaitForExclusive` and for the topic's
    /// creation record (`created_lsn`) to be durable. Returns the
    /// producer's last durable sequence id under deduplication, else -1.
    pub(crate) async fn add_producer(
        &self,
        ctx: &super::TopicCtx<'_>,
        name: &str,
        mode: ProducerAccessMode,
        policies: &Policies,
        created_lsn: Option<u64>,
    ) -> Result<i64, CoreError> {
        if policies.deduplication {
            self.ensure_dedup_loaded(ctx).await?;
        }
        self.dedup.enabled.set(policies.deduplication);
        let admission = self.producers.borrow_mut().add(&self.key, name, mode, policies.max_producers_per_topic)?;
        if let Admission::Wait(rx) = admission {
            // WaitForExclusive: the topic attaches us when the holder leaves.
            if rx.await.is_err() {
                return Err(CoreError::new(ErrorCode::ServiceNotReady, "topic unloaded while waiting"));
            }
        }
        if let Some(lsn) = created_lsn {
            if let Err(e) = ctx.log.wait_durable(lsn).await {
                self.producers.borrow_mut().remove(name);
                return Err(e.into());
            }
        }
        Ok(if self.dedup.enabled.get() { self.dedup.last_persisted(name, ctx.log.durable_lsn()) } else { -1 })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProducerAccessMode::*;

    #[test]
    fn access_modes() {
        let mut p = TopicProducers::default();
        assert!(matches!(p.add("t", "a", Exclusive, 0), Ok(Admission::Attached)));
        assert_eq!(p.add("t", "b", Exclusive, 0).err().unwrap().code, ErrorCode::ProducerBusy);
        assert_eq!(p.add("t", "b", Shared, 0).err().unwrap().code, ErrorCode::ProducerBusy);
        let Ok(Admission::Wait(mut rx)) = p.add("t", "w", WaitForExclusive, 0) else { panic!("should wait") };
        assert!(rx.try_recv().unwrap().is_none());
        p.remove("a");
        assert_eq!(rx.try_recv().unwrap(), Some(()));
        p.check_send("t", "w").unwrap();
        assert!(matches!(p.add("t", "f", ExclusiveWithFencing, 0), Ok(Admission::Attached)));
        assert_eq!(p.check_send("t", "w").unwrap_err().code, ErrorCode::ProducerFenced);
        p.remove("f");
        assert!(matches!(p.add("t", "s1", Shared, 1), Ok(Admission::Attached)));
        assert_eq!(p.add("t", "s2", Shared, 1).err().unwrap().code, ErrorCode::ProducerBusy);
    }

    #[test]
    fn dead_waiter_is_skipped() {
        let mut p = TopicProducers::default();
        p.add("t", "a", Exclusive, 0).unwrap();
        let Ok(Admission::Wait(rx1)) = p.add("t", "w1", WaitForExclusive, 0) else { panic!() };
        let Ok(Admission::Wait(mut rx2)) = p.add("t", "w2", WaitForExclusive, 0) else { panic!() };
        drop(rx1);
        p.remove("a");
        assert_eq!(rx2.try_recv().unwrap(), Some(()));
        assert_eq!(p.len(), 1);
    }
}
