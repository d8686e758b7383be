//! Delayed delivery: a subscription's time-ordered index of entries whose
//! `deliver_at_ms` is in the future.
//!
//! The dispatcher puts an entry here instead of delivering it, sleeps until
//! the earliest time, then replays the due entries. The index is memory
//! only: an entry stays unacknowledged in the cursor, so after a restart the
//! dispatcher reads it again from the ack floor and indexes it again.
//! Memory is bounded: past `max` entries the latest-due ones are dropped
//! from memory and the lowest dropped position is remembered; once the index
//! has drained to half, the dispatcher reads again from there (the dropped
//! entries are still unacknowledged in the log) and indexes them anew. So a
//! million delayed messages cost rereads, not memory. Owned by the topic's
//! shard; never crosses cores.

use std::collections::{BTreeSet, HashMap};

#[derive(Debug)]
pub(crate) struct DelayedIndex {
    by_time: BTreeSet<(u64, u64)>,
    /// entry -> (deliver_at_ms, key hash)
    entries: HashMap<u64, (u64, u16)>,
    max: usize,
    /// Lowest position dropped for room and not read again yet.
    dropped_from: Option<u64>,
}

impl DelayedIndex {
    pub(crate) fn new(max: usize) -> Self {
        assert!(max > 0);
        Self { by_time: BTreeSet::new(), entries: HashMap::new(), max, dropped_from: None }
    }

    pub(crate) fn insert(&mut self, deliver_at_ms: u64, entry: u64, key_hash: u16) {
        if let Some((old, _)) = self.entries.insert(entry, (deliver_at_ms, key_hash)) {
            self.by_time.remove(&(old, entry));
        }
        self.by_time.insert((deliver_at_ms, entry));
        if self.entries.len() > self.max {
            // Keep the soonest due in memory; the latest is read again later.
            if let Some((_, last)) = self.by_time.pop_last() {
                self.entries.remove(&last);
                self.dropped_from = Some(self.dropped_from.map_or(last, |d| d.min(last)));
            }
        }
        assert!(self.entries.len() <= self.max && self.by_time.len() == self.entries.len());
    }

    pub(crate) fn max_entries(&self) -> usize {
        self.max
    }

    pub(crate) fn contains(&self, entry: u64) -> bool {
        self.entries.contains_key(&entry)
    }

    /// Where the dispatcher must read again from, once the index has room
    /// (half drained); `None` when nothing was dropped or there is no room yet.
    pub(crate) fn take_reread_from(&mut self) -> Option<u64> {
        if self.entries.len() > self.max / 2 {
            return None;
        }
        self.dropped_from.take()
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
    fn over_its_bound_it_drops_the_latest_and_asks_for_a_reread() {
        let mut d = DelayedIndex::new(4);
        for (t, e) in [(50, 10), (10, 11), (40, 12), (20, 13), (30, 14), (60, 15)] {
            d.insert(t, e, 0);
        }
        assert_eq!(d.len(), 4);
        assert!(!d.contains(10) && !d.contains(15) && d.contains(14));
        assert_eq!(d.take_reread_from(), None, "no room yet");
        assert_eq!(d.take_due(20), vec![(11, 0), (13, 0)]);
        assert_eq!(d.take_reread_from(), Some(10));
        assert_eq!(d.take_reread_from(), None);
    }

    #[test]
    fn releases_in_time_order_and_not_before() {
        let mut d = DelayedIndex::new(100);
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
