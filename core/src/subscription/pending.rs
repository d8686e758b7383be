//! The entries a subscription delivered and has not had acknowledged, by
//! topic position: a sorted deque instead of a `BTreeMap`.
//!
//! Deliveries come in log order and acks mostly in the same order, so an
//! insert is nearly always a push at the back and a removal a pop at the
//! front. A `BTreeMap` splits and merges nodes for that (a malloc or free
//! every few operations, and a memmove of the node's keys and values on each
//! removal from the front), on every delivery and ack.
//! Here a removal in the middle leaves a hole, dropped once it reaches an end
//! or when holes outnumber the entries (so memory stays within twice the
//! entries held, plus a constant). Out-of-order inserts (a replayed entry
//! delivered again) are a binary search and a shift.

use crate::subscription::Pending;
use std::collections::VecDeque;

/// Holes kept before a compaction is considered (beyond twice the live
/// entries).
const HOLES_SLACK: usize = 64;

#[derive(Debug, Default)]
pub(crate) struct PendingMap {
    /// Ascending by position; `None` is a removed entry (a hole). Neither
    /// end is ever a hole.
    slots: VecDeque<(u64, Option<Pending>)>,
    live: usize,
}

impl PendingMap {
    pub(crate) fn len(&self) -> usize {
        self.live
    }

    pub(crate) fn clear(&mut self) {
        self.slots.clear();
        self.live = 0;
    }

    fn find(&self, pos: u64) -> Result<usize, usize> {
        self.slots.binary_search_by_key(&pos, |(p, _)| *p)
    }

    /// Inserts `pos`; returns what it held before.
    pub(crate) fn insert(&mut self, pos: u64, p: Pending) -> Option<Pending> {
        if self.slots.back().is_none_or(|(last, _)| *last < pos) {
            self.slots.push_back((pos, Some(p)));
            self.live += 1;
            return None;
        }
        match self.find(pos) {
            Ok(i) => {
                let old = self.slots[i].1.replace(p);
                if old.is_none() {
                    self.live += 1;
                }
                old
            }
            Err(i) => {
                self.slots.insert(i, (pos, Some(p)));
                self.live += 1;
                None
            }
        }
    }

    pub(crate) fn remove(&mut self, pos: u64) -> Option<Pending> {
        let i = match self.slots.front() {
            Some((first, _)) if *first == pos => 0,
            _ => self.find(pos).ok()?,
        };
        let old = self.slots[i].1.take()?;
        self.live -= 1;
        while matches!(self.slots.front(), Some((_, None))) {
            self.slots.pop_front();
        }
        while matches!(self.slots.back(), Some((_, None))) {
            self.slots.pop_back();
        }
        if self.slots.len() > 2 * self.live + HOLES_SLACK {
            self.slots.retain(|(_, p)| p.is_some());
        }
        Some(old)
    }

    pub(crate) fn get(&self, pos: u64) -> Option<&Pending> {
        // Outside [first, last] nothing is held: the dispatcher asks this of
        // every fresh position, which is past everything delivered: two
        // compares answer it without a binary search.
        match (self.slots.front(), self.slots.back()) {
            (Some((first, _)), Some((last, _))) if *first <= pos && pos <= *last => {}
            _ => return None,
        }
        let i = self.find(pos).ok()?;
        self.slots[i].1.as_ref()
    }

    pub(crate) fn contains(&self, pos: u64) -> bool {
        self.get(pos).is_some()
    }

    /// The lowest position held.
    pub(crate) fn first(&self) -> Option<u64> {
        self.slots.front().map(|(p, _)| *p)
    }

    /// Entries in ascending position.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (u64, &Pending)> {
        self.slots.iter().filter_map(|(pos, p)| Some((*pos, p.as_ref()?)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ConsumerRef;
    use std::collections::BTreeMap;

    fn pending(n: u32) -> Pending {
        Pending {
            consumer: ConsumerRef { shard: 0, sink: 1, consumer_id: 2 },
            key_hash: 0,
            num_messages: n,
            deliveries: 1,
        }
    }

    /// Goal: random inserts (mostly ascending, some replayed below the
    /// newest) and removals (mostly from the front, some anywhere) leave
    /// the map holding exactly what a `BTreeMap` does, with its lowest key,
    /// and the deque never more than twice the entries plus the slack.
    #[test]
    fn random_operations_match_a_btreemap() {
        let seed = crate::test_seed("random_operations_match_a_btreemap");
        let mut rng = magnetar_storage::sim::SimRng::new(seed);
        let mut next = move |n: u64| rng.below(n);
        for _ in 0..20 {
            let mut m = PendingMap::default();
            let mut model: BTreeMap<u64, u32> = BTreeMap::new();
            let mut top = 0u64;
            for step in 0..3000u32 {
                match next(10) {
                    0..=3 => {
                        top += 1 + next(3);
                        assert_eq!(m.insert(top, pending(step)).map(|p| p.num_messages), model.insert(top, step));
                    }
                    4 => {
                        let pos = next(top + 1);
                        assert_eq!(m.insert(pos, pending(step)).map(|p| p.num_messages), model.insert(pos, step));
                    }
                    5..=7 => {
                        if let Some(&first) = model.keys().next() {
                            assert_eq!(m.remove(first).map(|p| p.num_messages), model.remove(&first), "seed {seed}");
                        }
                    }
                    _ => {
                        let pos = next(top + 1);
                        assert_eq!(m.remove(pos).map(|p| p.num_messages), model.remove(&pos), "seed {seed}");
                    }
                }
                assert_eq!(m.len(), model.len(), "seed {seed}");
                assert_eq!(m.first(), model.keys().next().copied(), "seed {seed}");
                assert!(m.slots.len() <= 2 * m.len() + HOLES_SLACK + 1, "seed {seed}");
                let probe = next(top + 2);
                assert_eq!(m.get(probe).map(|p| p.num_messages), model.get(&probe).copied(), "seed {seed}");
                assert_eq!(m.contains(probe), model.contains_key(&probe));
            }
            let got: Vec<(u64, u32)> = m.iter().map(|(k, p)| (k, p.num_messages)).collect();
            let want: Vec<(u64, u32)> = model.iter().map(|(k, v)| (*k, *v)).collect();
            assert_eq!(got, want, "seed {seed}");
            m.clear();
            assert_eq!((m.len(), m.first()), (0, None));
        }
    }
}
