//! Client-side redelivery timers of one consumer: negative acks (each with
//! its own delay) and the ack timeout (a timing wheel, as Pulsar's
//! `UnAckedMessageTracker`).
//!
//! The wheel has `ACK_TIMEOUT_BUCKETS` buckets of ids; a received message
//! goes into the newest bucket, an ack removes it, and every
//! `ack_timeout / ACK_TIMEOUT_BUCKETS` the oldest bucket falls off and its
//! ids are asked back from the broker. So an unacked message is redelivered
//! between `ack_timeout` and `ack_timeout × (1 + 1/ACK_TIMEOUT_BUCKETS)`
//! after it was received. A task per consumer ticks both.

use magnetar_wire::MessageId;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Buckets of the ack-timeout wheel.
pub const ACK_TIMEOUT_BUCKETS: u32 = 10;
/// Granularity of the negative-ack timers.
pub(crate) const NACK_TICK: Duration = Duration::from_millis(10);

/// Delay before a negatively acknowledged message comes back:
/// `min × 2^redelivery_count`, at most `max`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NackBackoff {
    pub min: Duration,
    pub max: Duration,
}

impl Default for NackBackoff {
    fn default() -> Self {
        Self { min: Duration::from_secs(1), max: Duration::from_secs(60) }
    }
}

impl NackBackoff {
    pub fn delay(&self, redelivery_count: u32) -> Duration {
        let factor = 1u32.checked_shl(redelivery_count.min(20)).unwrap_or(u32::MAX);
        self.min.saturating_mul(factor).min(self.max.max(self.min))
    }
}

#[derive(Default)]
struct State {
    nacks: BTreeMap<Instant, Vec<MessageId>>,
    /// Front = oldest bucket. Empty when the ack timeout is off.
    wheel: VecDeque<HashSet<MessageId>>,
    last_turn: Option<Instant>,
}

pub(crate) struct Tracker {
    ack_timeout: Option<Duration>,
    state: Mutex<State>,
}

impl Tracker {
    pub(crate) fn new(ack_timeout: Option<Duration>) -> Self {
        let mut st = State::default();
        if ack_timeout.is_some() {
            st.wheel = (0..ACK_TIMEOUT_BUCKETS).map(|_| HashSet::new()).collect();
        }
        Self { ack_timeout, state: Mutex::new(st) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Only plain collection updates happen under the lock; a poisoned
        // lock still holds consistent data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(crate) fn received(&self, id: MessageId) {
        if self.ack_timeout.is_some() {
            if let Some(b) = self.lock().wheel.back_mut() {
                b.insert(id);
            }
        }
    }

    pub(crate) fn acked(&self, id: &MessageId) {
        if self.ack_timeout.is_some() {
            for b in self.lock().wheel.iter_mut() {
                b.remove(id);
            }
        }
    }

    pub(crate) fn acked_cumulative(&self, id: &MessageId) {
        if self.ack_timeout.is_some() {
            for b in self.lock().wheel.iter_mut() {
                b.retain(|x| x.partition != id.partition || x > id);
            }
        }
    }

    pub(crate) fn nacked(&self, id: MessageId, delay: Duration, now: Instant) {
        let mut st = self.lock();
        for b in st.wheel.iter_mut() {
            b.remove(&id);
        }
        st.nacks.entry(now + delay).or_default().push(id);
    }

    /// Forgets every timer (after a seek, nothing held is outstanding).
    pub(crate) fn clear(&self) {
        let mut st = self.lock();
        st.nacks.clear();
        for b in st.wheel.iter_mut() {
            b.clear();
        }
    }

    /// Ids due for redelivery at `now`.
    pub(crate) fn tick(&self, now: Instant) -> Vec<MessageId> {
        let mut st = self.lock();
        let later = st.nacks.split_off(&now);
        let due = std::mem::replace(&mut st.nacks, later);
        let mut out: Vec<MessageId> = due.into_values().flatten().collect();
        if let Some(timeout) = self.ack_timeout {
            let turn = timeout / ACK_TIMEOUT_BUCKETS;
            let last = *st.last_turn.get_or_insert(now);
            if now.duration_since(last) >= turn {
                st.last_turn = Some(now);
                if let Some(oldest) = st.wheel.pop_front() {
                    out.extend(oldest);
                }
                st.wheel.push_back(HashSet::new());
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(e: u64) -> MessageId {
        MessageId::new(1, e, -1, -1)
    }

    #[test]
    fn backoff_doubles_up_to_the_max() {
        let b = NackBackoff { min: Duration::from_millis(100), max: Duration::from_secs(1) };
        assert_eq!(b.delay(0), Duration::from_millis(100));
        assert_eq!(b.delay(2), Duration::from_millis(400));
        assert_eq!(b.delay(4), Duration::from_secs(1));
        assert_eq!(b.delay(u32::MAX), Duration::from_secs(1));
    }

    #[test]
    fn nacks_come_back_after_their_delay() {
        let t = Tracker::new(None);
        let t0 = Instant::now();
        t.nacked(id(1), Duration::from_millis(50), t0);
        t.nacked(id(2), Duration::from_millis(10), t0);
        assert!(t.tick(t0).is_empty());
        assert_eq!(t.tick(t0 + Duration::from_millis(20)), vec![id(2)]);
        assert_eq!(t.tick(t0 + Duration::from_millis(60)), vec![id(1)]);
        assert!(t.tick(t0 + Duration::from_millis(70)).is_empty());
    }

    #[test]
    fn unacked_ids_fall_off_the_wheel_after_the_timeout() {
        let timeout = Duration::from_millis(100);
        let t = Tracker::new(Some(timeout));
        let t0 = Instant::now();
        assert!(t.tick(t0).is_empty());
        t.received(id(1));
        t.received(id(2));
        t.acked(&id(2));
        let turn = timeout / ACK_TIMEOUT_BUCKETS;
        let mut got = Vec::new();
        let mut turns = 0;
        while got.is_empty() {
            turns += 1;
            got = t.tick(t0 + turn * turns);
            assert!(turns <= ACK_TIMEOUT_BUCKETS, "never expired");
        }
        assert_eq!(got, vec![id(1)]);
        assert_eq!(turns, ACK_TIMEOUT_BUCKETS, "expired after one full turn of the wheel");
    }
}
