//! Producers of one topic and their access modes (Pulsar's `Shared`,
//! `Exclusive`, `WaitForExclusive`, `ExclusiveWithFencing`), and the
//! topic's epoch.
//!
//! The epoch (Pulsar's `topic_epoch`) counts the times an exclusive
//! producer took the topic: each one that takes it without naming an epoch
//! gets the previous one plus one (0 for the first). A producer that comes
//! back naming the epoch it was given is refused (`ProducerFenced`) when
//! the epoch moved on meanwhile, i.e. another exclusive producer held the
//! topic in between; naming the current epoch (or a later one, which is
//! taken) it is admitted again. Persistent topics keep the epoch durable
//! (`store.rs`, `e/<topic>`) before the producer is told it.
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
    /// The producer is attached; the topic's epoch (`None`: no exclusive
    /// producer ever took it), and whether this producer set it.
    Attached { epoch: Option<u64>, took: bool },
    /// `WaitForExclusive`: attached with the epoch it set once this
    /// resolves with `Ok` (the topic inserts the name before resolving
    /// it); `Err`: fenced by the epoch when its turn came.
    Wait(oneshot::Receiver<Result<u64, CoreError>>),
}

/// A `WaitForExclusive` producer in the queue: its name, the epoch it
/// named, and where its turn is announced.
type Waiter = (String, Option<u64>, oneshot::Sender<Result<u64, CoreError>>);

#[derive(Default)]
pub(crate) struct TopicProducers {
    names: HashMap<String, ProducerAccessMode>,
    /// `WaitForExclusive` producers in arrival order.
    waiters: VecDeque<Waiter>,
    /// Names fenced off by an `ExclusiveWithFencing` producer; their sends
    /// fail with `ProducerFenced` until they close.
    fenced: HashSet<String>,
    /// The topic's epoch; `None` until an exclusive producer takes it (or
    /// the stored one is loaded).
    epoch: Option<u64>,
    /// The stored epoch was loaded (`load_epoch`).
    epoch_loaded: bool,
}

impl TopicProducers {
    pub(crate) fn len(&self) -> usize {
        self.names.len()
    }

    /// No producer attached, waiting or fenced: what is left (the epoch)
    /// is durable, so the topic may leave memory.
    pub(crate) fn is_idle(&self) -> bool {
        self.names.is_empty() && self.waiters.is_empty() && self.fenced.is_empty()
    }

    /// The topic's epoch, from `stored` (read once, on first use).
    pub(crate) fn load_epoch(&mut self, stored: impl FnOnce() -> Option<u64>) {
        if !self.epoch_loaded {
            self.epoch_loaded = true;
            self.epoch = self.epoch.max(stored());
        }
    }

    /// An exclusive producer takes the topic: the epoch it names, unless
    /// the topic's moved past it (fenced), else the next one.
    fn take_epoch(&mut self, topic: &str, name: &str, requested: Option<u64>) -> Result<u64, CoreError> {
        self.check_epoch(topic, name, requested)?;
        let epoch = requested.unwrap_or_else(|| self.epoch.map_or(0, |c| c.saturating_add(1)));
        self.epoch = Some(epoch);
        Ok(epoch)
    }

    /// Refuses a producer naming an epoch older than the topic's.
    fn check_epoch(&self, topic: &str, name: &str, requested: Option<u64>) -> Result<(), CoreError> {
        match (requested, self.epoch) {
            (Some(r), Some(current)) if r < current => Err(CoreError::new(
                ErrorCode::ProducerFenced,
                format!(
                    "producer {name:?}: the epoch of {topic} moved on (now {current}, the producer's {r}): \
                     another exclusive producer held it in between"
                ),
            )),
            _ => Ok(()),
        }
    }

    fn exclusive_holder(&self) -> Option<&str> {
        self.names.iter().find(|(_, m)| **m != ProducerAccessMode::Shared).map(|(n, _)| n.as_str())
    }

    /// Attaches `name` with `mode`, within `max` producers (0 = unlimited);
    /// `epoch` is the topic epoch the producer names (a reconnecting
    /// exclusive producer).
    pub(crate) fn add(
        &mut self,
        topic: &str,
        name: &str,
        mode: ProducerAccessMode,
        max: u32,
        epoch: Option<u64>,
    ) -> Result<Admission, CoreError> {
        if self.names.contains_key(name) || self.waiters.iter().any(|(n, _, _)| n == name) {
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
                    self.waiters.push_back((name.to_string(), epoch, tx));
                    return Ok(Admission::Wait(rx));
                }
            }
            ProducerAccessMode::ExclusiveWithFencing => {
                // Checked before anyone is fenced: a stale producer fences
                // nobody.
                self.check_epoch(topic, name, epoch)?;
                for (old, _) in self.names.drain() {
                    self.fenced.insert(old);
                }
                for (waiter, _, tx) in self.waiters.drain(..) {
                    let _ = tx.send(Err(CoreError::new(
                        ErrorCode::ProducerFenced,
                        format!("producer {waiter:?} was fenced off {topic} while waiting, by {name:?}"),
                    )));
                }
            }
        }
        let took = mode != ProducerAccessMode::Shared;
        let epoch = if took { Some(self.take_epoch(topic, name, epoch)?) } else { self.epoch };
        self.fenced.remove(name);
        self.names.insert(name.to_string(), mode);
        Ok(Admission::Attached { epoch, took })
    }

    /// Detaches `name` (or drops it from the wait queue); hands the topic to
    /// the first live waiter when it became free.
    pub(crate) fn remove(&mut self, topic: &str, name: &str) {
        self.fenced.remove(name);
        self.waiters.retain(|(n, _, _)| n != name);
        if self.names.remove(name).is_none() || !self.names.is_empty() {
            return;
        }
        while let Some((next, requested, tx)) = self.waiters.pop_front() {
            if tx.is_canceled() {
                // The waiting request is gone (its connection closed).
                continue;
            }
            let before = self.epoch;
            match self.take_epoch(topic, &next, requested) {
                Ok(epoch) => {
                    self.names.insert(next.clone(), ProducerAccessMode::WaitForExclusive);
                    if tx.send(Ok(epoch)).is_ok() {
                        return;
                    }
                    self.names.remove(&next);
                    self.epoch = before;
                }
                Err(e) => {
                    let _ = tx.send(Err(e));
                }
            }
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
    /// creation record (`created_lsn`) and the topic epoch it set to be
    /// durable. Returns the producer's last durable sequence id under
    /// deduplication (else -1) and the topic's epoch (`epoch` is the one the
    /// producer names). `queued` is told when the producer joins the
    /// `WaitForExclusive` queue.
    #[allow(clippy::too_many_arguments)]
    pub(crate) async fn add_producer(
        &self,
        ctx: &super::TopicCtx<'_>,
        name: &str,
        mode: ProducerAccessMode,
        policies: &Policies,
        created_lsn: Option<u64>,
        epoch: Option<u64>,
        queued: Option<oneshot::Sender<()>>,
    ) -> Result<(i64, Option<u64>), CoreError> {
        if policies.deduplication {
            self.ensure_dedup_loaded(ctx).await?;
        }
        self.dedup.enabled.set(policies.deduplication);
        let admission = {
            let mut producers = self.producers.borrow_mut();
            producers.load_epoch(|| ctx.store.topic_epoch(&self.key));
            producers.add(&self.key, name, mode, policies.max_producers_per_topic, epoch)?
        };
        let (epoch, took) = match admission {
            Admission::Attached { epoch, took } => (epoch, took),
            // WaitForExclusive: the topic attaches us when the holder leaves.
            Admission::Wait(rx) => {
                if let Some(q) = queued {
                    let _ = q.send(());
                }
                match rx.await {
                    Ok(Ok(epoch)) => (Some(epoch), true),
                    Ok(Err(e)) => return Err(e),
                    Err(_) => return Err(CoreError::new(ErrorCode::ServiceNotReady, "topic unloaded while waiting")),
                }
            }
        };
        let epoch_lsn = match epoch.filter(|_| took) {
            Some(e) => match ctx.store.put_topic_epoch(&self.key, e) {
                Ok(lsn) => Some(lsn),
                Err(e) => {
                    self.producers.borrow_mut().remove(&self.key, name);
                    return Err(e.into());
                }
            },
            None => None,
        };
        for lsn in [created_lsn, epoch_lsn].into_iter().flatten() {
            if let Err(e) = ctx.log.wait_durable(lsn).await {
                self.producers.borrow_mut().remove(&self.key, name);
                return Err(e.into());
            }
        }
        let last = if self.dedup.enabled.get() { self.dedup.last_persisted(name, ctx.log.durable_lsn()) } else { -1 };
        Ok((last, epoch))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ProducerAccessMode::*;

    fn epoch_of(a: Result<Admission, CoreError>) -> Option<u64> {
        match a {
            Ok(Admission::Attached { epoch, .. }) => epoch,
            _ => panic!("not attached"),
        }
    }

    #[test]
    fn access_modes() {
        let mut p = TopicProducers::default();
        assert_eq!(epoch_of(p.add("t", "a", Exclusive, 0, None)), Some(0));
        assert_eq!(p.add("t", "b", Exclusive, 0, None).err().unwrap().code, ErrorCode::ProducerBusy);
        assert_eq!(p.add("t", "b", Shared, 0, None).err().unwrap().code, ErrorCode::ProducerBusy);
        let Ok(Admission::Wait(mut rx)) = p.add("t", "w", WaitForExclusive, 0, None) else { panic!("should wait") };
        assert!(rx.try_recv().unwrap().is_none());
        p.remove("t", "a");
        assert_eq!(rx.try_recv().unwrap(), Some(Ok(1)));
        p.check_send("t", "w").unwrap();
        assert_eq!(epoch_of(p.add("t", "f", ExclusiveWithFencing, 0, None)), Some(2));
        assert_eq!(p.check_send("t", "w").unwrap_err().code, ErrorCode::ProducerFenced);
        p.remove("t", "f");
        // Shared producers leave the epoch alone and are told it.
        assert_eq!(epoch_of(p.add("t", "s1", Shared, 1, None)), Some(2));
        assert_eq!(p.add("t", "s2", Shared, 1, None).err().unwrap().code, ErrorCode::ProducerBusy);
    }

    /// Goal: Pulsar's topic epoch. Each exclusive taker without an epoch
    /// moves it on; one naming an epoch older than the topic's is fenced
    /// (whatever its mode, and before fencing anyone); naming the current
    /// one it is admitted again; the stored epoch is loaded once.
    #[test]
    fn topic_epoch() {
        let mut p = TopicProducers::default();
        p.load_epoch(|| Some(4));
        p.load_epoch(|| panic!("loaded twice"));
        assert_eq!(epoch_of(p.add("t", "a", Exclusive, 0, None)), Some(5));
        p.remove("t", "a");
        assert_eq!(epoch_of(p.add("t", "b", Exclusive, 0, None)), Some(6));
        p.remove("t", "b");
        // `a` comes back with the epoch it was given: b held it since.
        assert_eq!(p.add("t", "a", Exclusive, 0, Some(5)).err().unwrap().code, ErrorCode::ProducerFenced);
        assert_eq!(p.add("t", "a", WaitForExclusive, 0, Some(5)).err().unwrap().code, ErrorCode::ProducerFenced);
        assert_eq!(epoch_of(p.add("t", "b", Exclusive, 0, Some(6))), Some(6));
        assert_eq!(p.add("t", "a", ExclusiveWithFencing, 0, Some(5)).err().unwrap().code, ErrorCode::ProducerFenced);
        p.check_send("t", "b").unwrap();
        // A waiter whose epoch went stale while it waited is refused when
        // its turn comes; the next one takes the topic.
        let Ok(Admission::Wait(mut stale)) = p.add("t", "w1", WaitForExclusive, 0, Some(5)) else { panic!() };
        let Ok(Admission::Wait(mut next)) = p.add("t", "w2", WaitForExclusive, 0, None) else { panic!() };
        p.remove("t", "b");
        assert_eq!(stale.try_recv().unwrap().unwrap().unwrap_err().code, ErrorCode::ProducerFenced);
        assert_eq!(next.try_recv().unwrap(), Some(Ok(7)));
        // A fencing producer fails the waiters.
        let Ok(Admission::Wait(mut w3)) = p.add("t", "w3", WaitForExclusive, 0, None) else { panic!() };
        assert_eq!(epoch_of(p.add("t", "f", ExclusiveWithFencing, 0, None)), Some(8));
        assert_eq!(w3.try_recv().unwrap().unwrap().unwrap_err().code, ErrorCode::ProducerFenced);
    }

    #[test]
    fn dead_waiter_is_skipped() {
        let mut p = TopicProducers::default();
        p.add("t", "a", Exclusive, 0, None).unwrap();
        let Ok(Admission::Wait(rx1)) = p.add("t", "w1", WaitForExclusive, 0, None) else { panic!() };
        let Ok(Admission::Wait(mut rx2)) = p.add("t", "w2", WaitForExclusive, 0, None) else { panic!() };
        drop(rx1);
        p.remove("t", "a");
        assert_eq!(rx2.try_recv().unwrap(), Some(Ok(1)));
        assert_eq!(p.len(), 1);
    }
}
