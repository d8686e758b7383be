//! Key_Shared: the key hash space `[0, HASH_RANGE)` is split into ranges,
//! one consumer each. Two modes, as in Pulsar; the first consumer of an idle
//! subscription decides which, and a consumer of the other mode is refused
//! while any consumer is attached.
//!
//! *Auto split* (Pulsar's default): the first consumer owns everything; each
//! newcomer takes the upper half of the largest range; a leaving consumer's
//! ranges go to the owner of the range just below (or above, for the
//! lowest). A key therefore stays with one consumer until the set of
//! consumers changes.
//!
//! *Sticky* (Pulsar's `KeySharedPolicySticky`): each consumer declares the
//! inclusive ranges it owns; a consumer whose ranges overlap another's is
//! refused. Ranges never move between attached consumers; a leaving
//! consumer's ranges become unowned. Entries whose key hash nobody owns are
//! held in the replay set (they wait, as in Pulsar) and go out, in log
//! order, once a consumer covering them attaches.
//!
//! Order per key across a change: a newcomer gets entries at or after its
//! `joined_at` position (the first entry not yet read when it joined) only
//! once no entry before that position is outstanding (delivered and not
//! acknowledged, or waiting to be delivered again); until then such
//! entries are set aside and replayed later, in log order. Entries of a
//! leaving consumer are replayed, in log order, before any newer entry.
//! A sticky newcomer needs no `joined_at`: its ranges were unowned when it
//! joined, so every outstanding entry of its keys is in the replay set,
//! which each pass serves first, in log order (and waiting on the whole
//! subscription's floor would stall it behind held keys of ranges nobody
//! owns).
//! Owned by the topic's shard; never crosses cores.

use super::{Ask, ConsumerState, Pick};
use crate::api::ConsumerRef;
use crate::error::CoreError;
use magnetar_wire::{ErrorCode, SubscriptionType};

/// Size of the key hash space.
pub(crate) const HASH_RANGE: u32 = 1 << 16;

/// Most sticky ranges one consumer may declare (bounds the work of the
/// overlap check and the size of the range table).
pub(crate) const MAX_STICKY_RANGES: usize = 256;

/// Checks a consumer's declared sticky ranges (inclusive `(start, end)`)
/// on their own: only Key_Shared takes them, at most `MAX_STICKY_RANGES`,
/// each `start <= end <= 65535`, none overlapping another of the same list.
pub(crate) fn check_sticky_ranges(sub_type: SubscriptionType, ranges: &[(u32, u32)]) -> Result<(), CoreError> {
    if ranges.is_empty() {
        return Ok(());
    }
    let refuse = |m: String| Err(CoreError::new(ErrorCode::NotAllowed, m));
    if sub_type != SubscriptionType::KeyShared {
        return refuse(format!("key_shared_ranges apply only to key_shared subscriptions, not {sub_type:?}"));
    }
    if ranges.len() > MAX_STICKY_RANGES {
        return refuse(format!("{} key_shared_ranges given; at most {MAX_STICKY_RANGES} allowed", ranges.len()));
    }
    for &(start, end) in ranges {
        if start > end || end >= HASH_RANGE {
            return refuse(format!(
                "key_shared_range {start}-{end} is invalid: need start <= end <= {}",
                HASH_RANGE - 1
            ));
        }
    }
    let mut sorted = ranges.to_vec();
    sorted.sort_unstable();
    for w in sorted.windows(2) {
        if w[1].0 <= w[0].1 {
            return refuse(format!(
                "key_shared_ranges {}-{} and {}-{} overlap each other",
                w[0].0, w[0].1, w[1].0, w[1].1
            ));
        }
    }
    Ok(())
}

#[derive(Debug, Default)]
pub(crate) struct HashRanges {
    /// `(start, end_exclusive, owner)`, sorted and disjoint. In auto-split
    /// mode they cover `[0, HASH_RANGE)` when there is at least one
    /// consumer; in sticky mode, whatever the consumers declared.
    ranges: Vec<(u32, u32, ConsumerRef)>,
    /// Sticky mode; set by the first consumer of an idle subscription.
    sticky: bool,
}

impl HashRanges {
    pub(crate) fn is_sticky(&self) -> bool {
        self.sticky
    }

    /// Admits consumer `c` with its declared sticky ranges (inclusive,
    /// already checked by `check_sticky_ranges`; empty = auto split), given
    /// the consumers attached before it. Refuses a consumer of the other
    /// mode, or sticky ranges overlapping another consumer's; nothing
    /// changes then.
    pub(crate) fn admit(
        &mut self,
        c: ConsumerRef,
        sticky: &[(u32, u32)],
        attached: &[ConsumerState],
    ) -> Result<(), CoreError> {
        let wants_sticky = !sticky.is_empty();
        if attached.is_empty() {
            self.ranges.clear();
            self.sticky = wants_sticky;
        } else if self.sticky != wants_sticky {
            let (is, not) =
                if self.sticky { ("sticky hash ranges", "an auto-split") } else { ("auto split", "a sticky") };
            return Err(CoreError::new(
                ErrorCode::ConsumerBusy,
                format!("this key_shared subscription uses {is} while it has consumers; cannot attach {not} consumer"),
            ));
        }
        if !self.sticky {
            self.add(c);
            return Ok(());
        }
        for &(start, end) in sticky {
            let (start, end) = (start, end + 1);
            if let Some(&(s, e, other)) = self.ranges.iter().find(|r| r.0 < end && start < r.1) {
                let name = attached.iter().find(|a| a.consumer == other).map_or("?", |a| a.name.as_str());
                return Err(CoreError::new(
                    ErrorCode::ConsumerBusy,
                    format!(
                        "key_shared_range {}-{} overlaps range {}-{} of consumer {name:?}",
                        start,
                        end - 1,
                        s,
                        e - 1
                    ),
                ));
            }
        }
        self.ranges.extend(sticky.iter().map(|&(s, e)| (s, e + 1, c)));
        self.ranges.sort_unstable_by_key(|r| r.0);
        Ok(())
    }

    /// Auto split: `c` takes the upper half of the largest range.
    fn add(&mut self, c: ConsumerRef) {
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
        if self.sticky {
            // Its ranges become unowned: their keys wait for a new owner.
            self.ranges.retain(|r| r.2 != c);
            return;
        }
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
        self.ranges.get(i).filter(|r| r.0 <= hash).map(|r| r.2)
    }

    pub(crate) fn pick(&self, consumers: &[ConsumerState], ask: &Ask<'_>) -> Pick {
        let Some(owner) = self.owner(ask.key_hash) else {
            // Sticky: nobody owns this key now; it waits for an owner.
            // Auto split: no consumers at all.
            return if self.sticky { Pick::Hold } else { Pick::Stop };
        };
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
            address: String::new(),
            redelivered: 0,
            zone: String::new(),
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

    fn state(id: u64, name: &str) -> ConsumerState {
        ConsumerState {
            consumer: r(id),
            name: name.into(),
            priority: 0,
            permits: 10,
            unacked: 0,
            joined_at: None,
            address: String::new(),
            redelivered: 0,
            zone: String::new(),
        }
    }

    #[test]
    fn sticky_ranges_are_checked_on_their_own() {
        let ks = SubscriptionType::KeyShared;
        assert!(check_sticky_ranges(ks, &[]).is_ok());
        assert!(check_sticky_ranges(SubscriptionType::Shared, &[]).is_ok());
        assert!(check_sticky_ranges(ks, &[(0, 0), (1, 65535)]).is_ok());
        let err = |t, r: &[(u32, u32)]| check_sticky_ranges(t, r).expect_err("accepted").message;
        assert!(err(SubscriptionType::Shared, &[(0, 1)]).contains("only to key_shared"));
        assert!(err(ks, &[(5, 4)]).contains("5-4 is invalid"));
        assert!(err(ks, &[(0, 65536)]).contains("invalid"));
        assert!(err(ks, &[(u32::MAX, u32::MAX)]).contains("invalid"));
        assert!(err(ks, &[(10, 20), (0, 10)]).contains("0-10 and 10-20 overlap"));
        let many: Vec<(u32, u32)> = (0..=MAX_STICKY_RANGES as u32).map(|i| (i * 2, i * 2)).collect();
        assert!(err(ks, &many).contains("at most 256"));
        assert!(check_sticky_ranges(ks, &many[..MAX_STICKY_RANGES]).is_ok());
    }

    #[test]
    fn sticky_owners_overlap_and_holes() {
        let mut h = HashRanges::default();
        let mut attached = Vec::new();
        h.admit(r(1), &[(0, 99), (1000, 1999)], &attached).expect("first");
        attached.push(state(1, "a"));
        assert!(h.is_sticky());
        h.admit(r(2), &[(100, 199)], &attached).expect("disjoint");
        attached.push(state(2, "b"));
        // Overlaps: the message names both ranges and the owner.
        let e = h.admit(r(3), &[(300, 400), (1999, 2500)], &attached).expect_err("overlap");
        assert_eq!(e.code, ErrorCode::ConsumerBusy);
        assert!(e.message.contains("1999-2500 overlaps range 1000-1999 of consumer \"a\""), "{}", e.message);
        // An auto-split consumer cannot join a sticky subscription.
        let e = h.admit(r(3), &[], &attached).expect_err("mixed");
        assert!(e.message.contains("cannot attach an auto-split consumer"), "{}", e.message);
        // Refusals changed nothing.
        assert_eq!(h.owner(350), None);
        assert_eq!(h.owner(0), Some(r(1)));
        assert_eq!(h.owner(99), Some(r(1)));
        assert_eq!(h.owner(100), Some(r(2)));
        assert_eq!(h.owner(199), Some(r(2)));
        assert_eq!(h.owner(200), None);
        assert_eq!(h.owner(1500), Some(r(1)));
        assert_eq!(h.owner(u16::MAX), None);
        // Unowned keys are held without blocking anyone; owned ones go out.
        let blocked = Default::default();
        let ask =
            |key_hash| Ask { entry: 1, key_hash, outstanding_floor: 0, unacked_per_consumer_max: 5, blocked: &blocked };
        assert_eq!(h.pick(&attached, &ask(500)), Pick::Hold);
        assert_eq!(h.pick(&attached, &ask(150)), Pick::Deliver(1));
        // Leaving frees the ranges (no neighbour takes them over).
        h.remove(r(1));
        attached.remove(0);
        assert_eq!(h.owner(0), None);
        assert_eq!(h.owner(1500), None);
        h.admit(r(3), &[(0, 99)], &attached).expect("freed range");
        assert_eq!(h.owner(50), Some(r(3)));
        // Once idle, the next first consumer picks the mode again.
        h.remove(r(2));
        h.remove(r(3));
        h.admit(r(4), &[], &[]).expect("auto");
        assert!(!h.is_sticky());
        assert_eq!(h.owner(65535), Some(r(4)));
        let e = h.admit(r(5), &[(0, 1)], &[state(4, "d")]).expect_err("mixed");
        assert!(e.message.contains("uses auto split"), "{}", e.message);
    }
}
