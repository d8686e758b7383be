//! Cursor persistence: which subscriptions' records changed, and writing
//! them through the [`Store`].
//!
//! Acks only mark a subscription dirty ([`Dirty`]); the shard's flusher
//! writes the queued ones every `cursor_persist_interval` (and an ack that
//! asks for durability writes at once). Redelivery counts ride in the
//! state record, written at most once per
//! `REDELIVERY_COUNTS_PERSIST_INTERVAL_MS`. Owned by one shard; never
//! crosses cores.

use crate::clock::now_ms;
use crate::error::CoreError;
use crate::store::Store;
use crate::subscription::Subscription;
use crate::topic::Topic;
use bytes::Bytes;
use std::cell::RefCell;
use std::rc::Rc;

/// Subscriptions whose records wait to be written. A subscription is in a
/// queue at most once: its `dirty` (or `counts_dirty`) flag says it is
/// queued, so marking costs one flag test on the ack and dispatch paths.
#[derive(Default)]
pub(crate) struct Dirty {
    cursors: RefCell<Vec<(Rc<Topic>, Rc<Subscription>)>>,
    counts: RefCell<Vec<(Rc<Topic>, Rc<Subscription>)>>,
}

impl Dirty {
    /// Queues `sub`'s cursor record for the next flush.
    pub(crate) fn mark_cursor(&self, topic: &Rc<Topic>, sub: &Rc<Subscription>) {
        if !sub.dirty.replace(true) {
            self.cursors.borrow_mut().push((topic.clone(), sub.clone()));
        }
    }

    /// Notes that a redelivery count of `sub` changed. Unlike an ack, this
    /// does not queue a write at once: the state record carrying the counts
    /// can be large (every partly acked batch's bits and every count), and
    /// under constant redelivery rewriting it on every cursor flush would
    /// multiply writes for a figure that only needs to be roughly right
    /// after a crash (docs/semantics.md states the lag).
    pub(crate) fn mark_counts(&self, topic: &Rc<Topic>, sub: &Rc<Subscription>) {
        if !sub.counts_dirty.replace(true) {
            self.counts.borrow_mut().push((topic.clone(), sub.clone()));
        }
    }
}

/// Writes subscriptions' cursor and state records.
pub(crate) struct CursorWriter {
    store: Store,
    pub(crate) dirty: Rc<Dirty>,
}

impl CursorWriter {
    pub(crate) fn new(store: Store) -> Self {
        Self { store, dirty: Rc::new(Dirty::default()) }
    }

    /// Writes the cursor record, and the state record when it changed
    /// (the state first: a crash between them leaves bits for entries the
    /// cursor does not yet acknowledge, never the other way round).
    /// On failure the subscription is queued again (both records marked
    /// changed), so the next flush retries it: a write error delays a
    /// cursor, never drops it.
    pub(crate) fn persist(&self, topic: &Rc<Topic>, sub: &Rc<Subscription>) -> Result<u64, CoreError> {
        let state_dirty = sub.state_dirty.replace(false);
        sub.dirty.set(false);
        let written = self.write(topic, sub, state_dirty);
        if written.is_ok() && state_dirty {
            // The state record carries every redelivery count.
            sub.counts_dirty.set(false);
            sub.state_written_ms.set(now_ms());
        }
        if written.is_err() {
            if state_dirty {
                sub.state_dirty.set(true);
            }
            self.dirty.mark_cursor(topic, sub);
        }
        written
    }

    fn write(&self, topic: &Topic, sub: &Subscription, state_dirty: bool) -> Result<u64, CoreError> {
        if state_dirty {
            let state = crate::subscription::sub_state::encode(sub, &topic.ledgers.borrow());
            self.store.put_sub_state(&topic.key, &sub.name, Bytes::from(state))?;
        }
        let bytes = sub.cursor.borrow().to_record(&topic.ledgers.borrow()).encode();
        let lsn = self.store.put_cursor(&topic.key, &sub.name, Bytes::from(bytes))?;
        sub.persisted_lsn.set(lsn);
        Ok(lsn)
    }

    /// Writes the state record of subscriptions whose redelivery counts
    /// changed and whose state record is at least
    /// `REDELIVERY_COUNTS_PERSIST_INTERVAL_MS` old (all of them if `force`);
    /// the others wait in the queue.
    pub(crate) fn flush_counts(&self, force: bool) -> Result<Option<u64>, CoreError> {
        let now = now_ms();
        let batch = std::mem::take(&mut *self.dirty.counts.borrow_mut());
        persist_each(batch, |(t, s)| {
            if !s.counts_dirty.get() {
                // Written meanwhile along with another change.
                return Ok(None);
            }
            if !s.durable || s.removed.get() {
                s.counts_dirty.set(false);
                return Ok(None);
            }
            if !force && !crate::subscription::sub_state::counts_write_due(now, s.state_written_ms.get()) {
                self.dirty.counts.borrow_mut().push((t.clone(), s.clone()));
                return Ok(None);
            }
            s.state_dirty.set(true);
            self.persist(t, s).map(Some)
        })
    }

    /// Writes every queued cursor, then the due redelivery counts (all of
    /// them with `force_counts`). Returns the last position written.
    pub(crate) fn flush(&self, force_counts: bool) -> Result<Option<u64>, CoreError> {
        let dirty = std::mem::take(&mut *self.dirty.cursors.borrow_mut());
        // Every subscription taken is written or (by `persist`) queued
        // again: stopping at the first error would leave the rest marked
        // dirty but in no queue, never persisted again.
        let last = persist_each(dirty, |(t, s)| {
            if !(s.dirty.get() && s.durable) {
                s.dirty.set(false);
                return Ok(None);
            }
            self.persist(t, s).map(Some)
        });
        let counts = self.flush_counts(force_counts);
        Ok(counts?.or(last?))
    }
}

/// Runs `persist` on every item of `batch`, whatever fails: returns the last
/// position written, or the first error once all were tried.
pub(crate) fn persist_each<T, E>(
    batch: Vec<T>,
    mut persist: impl FnMut(&T) -> Result<Option<u64>, E>,
) -> Result<Option<u64>, E> {
    let (mut last, mut first_err) = (None, None);
    for item in &batch {
        match persist(item) {
            Ok(Some(lsn)) => last = Some(lsn),
            Ok(None) => {}
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    match first_err {
        Some(e) => Err(e),
        None => Ok(last),
    }
}

#[cfg(test)]
mod tests {
    use super::persist_each;

    #[test]
    fn a_failed_write_does_not_skip_the_rest_of_the_batch() {
        // Goal: one subscription whose record cannot be written (e.g. a
        // state record over the entry size limit) must not stop the others
        // in the same flush from being written. Method: fail the second of
        // five; all five must be tried and the error still reported.
        let mut tried = Vec::new();
        let r = persist_each(vec![1u64, 2, 3, 4, 5], |&i| {
            tried.push(i);
            if i == 2 {
                Err("too large")
            } else {
                Ok(Some(i * 10))
            }
        });
        assert_eq!(tried, vec![1, 2, 3, 4, 5]);
        assert_eq!(r, Err("too large"));
        assert_eq!(persist_each(vec![1u64, 2], |&i| Ok::<_, ()>((i == 1).then_some(7))), Ok(Some(7)));
    }
}
