//! Delayed delivery: a subscription's time-ordered index of entries whose
//! `deliver_at_ms` is in the future.
//!
//! The dispatcher puts an entry here instead of delivering it, sleeps until
//! the earliest time, then replays the due entries. The index is memory
//! only: an entry stays unacknowledged in the cursor, so after a restart the
//! dispatcher reads it again from the ack floor and indexes it again.
//! Memory: 24 bytes and a map slot per delayed entry, unbounded (spilling
//! to disk is not built). Owned by the topic's shard; never crosses cores.

use std::collections::{BTreeSet, HashMap};

#[derive(Debug, Default)]
pub(crate) struct DelayedIndex {
    by_time: BTreeSet<(u64, u64)>,
    /// entry -> (deliver_at_ms, key hash)
    entries: HashMap<u64, (u64, u16)>,
}

impl DelayedIndex {
    pub(crate) fn insert(&mut self, deliver_at_ms: u64, entry: u64, key_hash: u16) {
        if let Some((old, _)) = self.entries.insert(entry, (deliver_at_ms, key_hash)) {
            self.by_time.remove(&(old, entry));
        }
        self.by_time.insert((deliver_at_ms, entry));
    }

    /// The earliest delivery time, if any.
    pub(crate) fn next_due_ms(&self) -> Option<u64> {
        self.by_time.first().map(|(t, _)| *t)
    }

    /// Removes and returns `(entry, key_hash)` of every entry due at `now_ms`.
    pub(crate) fn take_due(&mut self, now_ms: u64) -> Vec<(u64, u16)> {
        let mut out = Vec::new();
        while let Some(&(t, entry)) = self.by_time.first() {
            if t > now_ms {
                break;
            }
            self.by_time.pop_first();
            if let Some((_, h)) = self.entries.remove(&entry) {
                out.push((entry, h));
            }
        }
        out
    }

    pub(crate) fn len(&self) -> usize {
        self.entries.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn releases_in_time_order_and_not_before() {
        let mut d = DelayedIndex::default();
        d.insert(300, 1, 0);
        d.insert(100, 2, 7);
        d.insert(200, 3, 0);
        assert_eq!(d.next_due_ms(), Some(100));
        assert!(d.take_due(99).is_empty());
        assert_eq!(d.take_due(200), vec![(2, 7), (3, 0)]);
        assert_eq!(d.len(), 1);
        d.insert(50, 1, 0);
        assert_eq!(d.take_due(60), vec![(1, 0)]);
        assert_eq!(d.next_due_ms(), None);
    }
}
