//! Key_Shared: the key hash space `[0, HASH_RANGE)` is split into ranges,
//! one consumer each ("auto split", as Pulsar's default): the first consumer
//! owns everything; each newcomer takes the upper half of the largest range;
//! a leaving consumer's ranges go to the owner of the range just below (or
//! above, for the lowest). A key therefore stays with one consumer until the
//! set of consumers changes.
//!
//! Order per key across a change: a newcomer gets entries at or after its
//! `joined_at` position (the first entry not yet read when it joined) only
//! once no entry before that position is outstanding (delivered and not
//! acknowledged, or waiting to be delivered again); until then such
//! entries are set aside and replayed later, in log order. Entries of a
//! leaving consumer are replayed, in log order, before any newer entry.
//! Owned by the topic's shard; never crosses cores.

use super::{Ask, ConsumerState, Pick};
use crate::shard::ConsumerRef;

/// Size of the key hash space.
pub(crate) const HASH_RANGE: u32 = 1 << 16;

#[derive(Debug, Default)]
pub(crate) struct HashRanges {
    /// `(start, end_exclusive, owner)`, sorted, covering `[0, HASH_RANGE)`
    /// when there is at least one consumer.
    ranges: Vec<(u32, u32, ConsumerRef)>,
}

impl HashRanges {
    pub(crate) fn add(&mut self, c: ConsumerRef) {
        if self.ranges.is_empty() {
            self.ranges.push((0, HASH_RANGE, c));
            return;
        }
        // Largest range; the lowest one on ties.
        let mut best = 0;
        for (i, r) in self.ranges.iter().enumerate() {
            if r.1 - r.0 > self.ranges[best].1 - self.ranges[best].0 {
                best = i;
            }
        }
        let (start, end, owner) = self.ranges[best];
        if end - start < 2 {
            // Nothing left to split (more consumers than hash values): the
            // newcomer gets no keys.
            return;
        }
        let mid = start + (end - start) / 2;
        self.ranges[best] = (start, mid, owner);
        self.ranges.insert(best + 1, (mid, end, c));
    }

    pub(crate) fn remove(&mut self, c: ConsumerRef) {
        let mut i = 0;
        while i < self.ranges.len() {
            if self.ranges[i].2 != c {
                i += 1;
                continue;
            }
            let (start, end, _) = self.ranges.remove(i);
            if i > 0 {
                self.ranges[i - 1].1 = end;
            } else if let Some(next) = self.ranges.first_mut() {
                next.0 = start;
            }
        }
        // Neighbours with one owner merge back into one range.
        self.ranges.dedup_by(|b, a| {
            if a.2 == b.2 && a.1 == b.0 {
                a.1 = b.1;
                true
            } else {
                false
            }
        });
        assert!(self.ranges.first().is_none_or(|r| r.0 == 0) && self.ranges.last().is_none_or(|r| r.1 == HASH_RANGE));
    }

    pub(crate) fn owner(&self, hash: u16) -> Option<ConsumerRef> {
        let hash = u32::from(hash);
        let i = self.ranges.partition_point(|r| r.1 <= hash);
        self.ranges.get(i).map(|r| r.2)
    }

    pub(crate) fn pick(&self, consumers: &[ConsumerState], ask: &Ask<'_>) -> Pick {
        let Some(owner) = self.owner(ask.key_hash) else { return Pick::Stop };
        let Some(i) = consumers.iter().position(|c| c.consumer == owner) else { return Pick::Stop };
        let c = &consumers[i];
        let waits_for_older = c.joined_at.is_some_and(|j| ask.entry >= j && ask.outstanding_floor < j);
        if ask.can_take(c) && !waits_for_older {
            Pick::Deliver(i)
        } else {
            Pick::SetAside(owner)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn r(id: u64) -> ConsumerRef {
        ConsumerRef { shard: 0, sink: 0, consumer_id: id }
    }

    #[test]
    fn split_and_merge_cover_the_space() {
        let mut h = HashRanges::default();
        assert_eq!(h.owner(5), None);
        h.add(r(1));
        h.add(r(2));
        h.add(r(3));
        assert_eq!(h.owner(0), Some(r(1)));
        assert_eq!(h.owner(u16::MAX), Some(r(2)));
        let mid = (HASH_RANGE / 2) as u16;
        assert_eq!(h.owner(mid), Some(r(2)));
        assert_eq!(h.owner(mid / 2 + 1), Some(r(3)));
        h.remove(r(3));
        assert_eq!(h.owner(mid / 2 + 1), Some(r(1)));
        assert_eq!(h.ranges.len(), 2);
        h.remove(r(1));
        assert_eq!(h.owner(0), Some(r(2)));
        assert_eq!(h.ranges, vec![(0, HASH_RANGE, r(2))]);
        h.remove(r(2));
        assert!(h.ranges.is_empty());
    }

    #[test]
    fn a_newcomer_waits_for_older_entries_to_be_acked() {
        let mut h = HashRanges::default();
        h.add(r(1));
        let cs = vec![ConsumerState {
            consumer: r(1),
            name: String::new(),
            priority: 0,
            permits: 1,
            unacked: 0,
            joined_at: Some(10),
        }];
        let blocked = Default::default();
        let ask = |entry, outstanding_floor| Ask {
            entry,
            key_hash: 7,
            outstanding_floor,
            unacked_per_consumer_max: 5,
            blocked: &blocked,
        };
        assert_eq!(h.pick(&cs, &ask(9, 0)), Pick::Deliver(0));
        assert_eq!(h.pick(&cs, &ask(10, 9)), Pick::SetAside(r(1)));
        assert_eq!(h.pick(&cs, &ask(10, 10)), Pick::Deliver(0));
    }
}
