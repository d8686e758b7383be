//! A subscription's side of operator changes (`magnetar admin subscriptions
//! …`, Pulsar's REST `…/subscription/{sub}/…`): skipping entries, closing
//! its consumers before a reset or a deletion, and finding the entries a
//! peek shows. The shard side (`shard/sub_admin.rs`) finds the subscription,
//! persists and answers. Owned by the topic's shard; never crosses cores.

use super::dispatcher::context::DeliverySink;
use super::Subscription;
use crate::api::{ConsumerEvent, ConsumerRef};
use crate::error::ErrorCode;
use crate::topic::ledgers::TopicLedgers;

impl Subscription {
    /// The position `e` in `floor..=end` such that `floor..e` holds `count`
    /// unacknowledged positions (or all of them when fewer): acknowledging
    /// everything below `e` skips exactly the next `count` unacknowledged
    /// entries. A binary search over the acked set's counts, so a skip of
    /// millions costs a few span walks, not one step per entry.
    pub(crate) fn skip_end(&self, count: u64, end: u64) -> u64 {
        let cursor = self.cursor.borrow();
        let floor = cursor.ack_floor;
        if end <= floor || count == 0 {
            return floor;
        }
        let unacked = |e: u64| (e - floor) - cursor.acked.count_in(floor, e);
        if unacked(end) <= count {
            return end;
        }
        // unacked(lo) < count <= unacked(hi); unacked grows by at most 1 a
        // step, so the least e with unacked(e) == count exists in lo+1..=hi.
        let (mut lo, mut hi) = (floor, end);
        while hi - lo > 1 {
            let mid = lo + (hi - lo) / 2;
            if unacked(mid) >= count {
                hi = mid;
            } else {
                lo = mid;
            }
        }
        hi
    }

    /// Acknowledges everything below `end` (see [`Self::ack_below`]) and
    /// says whether the cursor moved.
    pub(crate) fn acknowledge_below(&self, ledgers: &TopicLedgers, end: u64) -> bool {
        let moved = self.ack_below(ledgers, end);
        if moved {
            self.state_dirty.set(true);
        }
        moved
    }

    /// Closes every connected consumer, telling each why: their
    /// unacknowledged entries go back to the subscription, and their clients
    /// drop what they queued (a Pulsar client subscribes again by itself).
    /// Returns how many were closed.
    pub(crate) fn close_consumers(&self, sink: &impl DeliverySink, why: &str) -> usize {
        let consumers: Vec<ConsumerRef> = self.consumers.borrow().iter().map(|c| c.consumer).collect();
        for &c in &consumers {
            self.remove_consumer(sink, c);
            sink.deliver(
                c,
                ConsumerEvent::Closed {
                    consumer_id: c.consumer_id,
                    code: ErrorCode::ServiceNotReady,
                    message: why.to_string(),
                    entry: None,
                },
            );
        }
        consumers.len()
    }

    /// The unacknowledged positions below `end` from the `nth` (1-based),
    /// at most `max` of them, in order. The ones before the `nth` are
    /// jumped over by [`Self::skip_end`], not walked.
    pub(crate) fn unacked_from(&self, nth: u64, max: usize, end: u64) -> Vec<u64> {
        let start = self.skip_end(nth.saturating_sub(1), end);
        let cursor = self.cursor.borrow();
        let mut out = Vec::new();
        let mut pos = cursor.acked.first_absent_from(start.max(cursor.ack_floor));
        while pos < end && out.len() < max {
            out.push(pos);
            pos = cursor.acked.first_absent_from(pos + 1);
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use crate::subscription::cursor::Cursor;
    use crate::subscription::Subscription;
    use magnetar_wire::SubscriptionType;

    fn sub_with_acks(floor: u64, acked: &[u64]) -> std::rc::Rc<Subscription> {
        let mut cursor = Cursor::new(floor);
        for &p in acked {
            cursor.ack(p);
        }
        Subscription::new("s".into(), SubscriptionType::Shared, true, cursor, -1, 16)
    }

    /// Goal: skipping N counts only unacknowledged entries, jumping over
    /// acknowledged holes, and stops at the end of the stored entries.
    #[test]
    fn skip_end_counts_unacknowledged_entries_only() {
        // Floor 10; 12, 13 and 15 acknowledged: unacked 10, 11, 14, 16, 17, ...
        let s = sub_with_acks(10, &[12, 13, 15]);
        assert_eq!(s.skip_end(0, 30), 10);
        assert_eq!(s.skip_end(1, 30), 11);
        assert_eq!(s.skip_end(2, 30), 12);
        // The third unacknowledged is 14: everything below 15 goes.
        assert_eq!(s.skip_end(3, 30), 15);
        assert_eq!(s.skip_end(4, 30), 17);
        assert_eq!(s.skip_end(1000, 30), 30);
        assert_eq!(s.skip_end(5, 10), 10);
        // Peeking from the nth unacknowledged.
        assert_eq!(s.unacked_from(1, 3, 30), vec![10, 11, 14]);
        assert_eq!(s.unacked_from(3, 2, 30), vec![14, 16]);
        assert_eq!(s.unacked_from(25, 2, 30), Vec::<u64>::new());
    }
}
