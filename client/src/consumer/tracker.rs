//! Client-side redelivery timers of one consumer: negative acks (each with
//! its own delay) and the ack timeout (a timing wheel, as Pulsar's
//! `UnAckedMessageTracker`).
//!
//! The wheel has `ACK_TIMEOUT_BUCKETS + 1` buckets of ids; a received
//! message goes into the newest bucket, an ack removes it, and every
//! `ack_timeout / ACK_TIMEOUT_BUCKETS` (a turn) the oldest bucket falls off
//! and its ids are asked back from the broker. A message falls off at the
//! `ACK_TIMEOUT_BUCKETS + 1`-th turn after it was received, the first of
//! which comes within a turn: so an unacked message is redelivered between
//! `ack_timeout` and `ack_timeout × (1 + 1/ACK_TIMEOUT_BUCKETS)` after it
//! was received, never sooner. (With `ACK_TIMEOUT_BUCKETS` buckets it was
//! between `ack_timeout × (1 - 1/ACK_TIMEOUT_BUCKETS)` and `ack_timeout`.)
//!
//! A task per consumer (`consumer::run_timers`) serves both and the ack
//! group. It sleeps until the earliest deadline it was told of ([`arm`]):
//! the first nack due, the wheel's next turn while it holds ids. An update
//! that makes an earlier deadline says so (`received` and `nacked` return
//! true: wake the task), so an idle consumer's task does not wake at all.
//!
//! [`arm`]: Tracker::arm

use magnetar_wire::MessageId;
use std::collections::{BTreeMap, HashSet, VecDeque};
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Turns of the ack-timeout wheel in one ack timeout.
pub const ACK_TIMEOUT_BUCKETS: u32 = 10;
/// Granularity of the negative-ack timers: due times are rounded up to it,
/// so nacks falling due together wake the task once.
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

struct State {
    /// Due time (a multiple of `NACK_TICK` after `epoch`) → ids.
    nacks: BTreeMap<Instant, Vec<MessageId>>,
    /// Front = oldest bucket. Empty when the ack timeout is off.
    wheel: VecDeque<HashSet<MessageId>>,
    /// Ids in the wheel's buckets (an id may sit in two after a redelivery).
    in_wheel: usize,
    /// When the wheel last turned, or when an id went into the empty wheel.
    last_turn: Instant,
    /// The deadline the task was last told (`arm`); `None`: it sleeps
    /// until woken. An update making an earlier one wakes it.
    armed: Option<Instant>,
}

impl State {
    fn remove_from_wheel(&mut self, id: &MessageId) {
        if self.in_wheel == 0 {
            return;
        }
        for b in self.wheel.iter_mut() {
            if b.remove(id) {
                self.in_wheel -= 1;
            }
        }
    }

    /// Records `due` as the task's deadline if it is earlier than the one
    /// armed; true when the task must be woken for it.
    fn sooner(&mut self, due: Instant) -> bool {
        if self.armed.is_some_and(|a| a <= due) {
            return false;
        }
        self.armed = Some(due);
        true
    }
}

pub(crate) struct Tracker {
    ack_timeout: Option<Duration>,
    /// Origin of the nack due-time grid.
    epoch: Instant,
    state: Mutex<State>,
}

impl Tracker {
    pub(crate) fn new(ack_timeout: Option<Duration>) -> Self {
        Self::new_at(ack_timeout, Instant::now())
    }

    /// A tracker whose clock starts at `epoch`.
    pub(crate) fn new_at(ack_timeout: Option<Duration>, epoch: Instant) -> Self {
        let mut st =
            State { nacks: BTreeMap::new(), wheel: VecDeque::new(), in_wheel: 0, last_turn: epoch, armed: None };
        if ack_timeout.is_some() {
            st.wheel = (0..=ACK_TIMEOUT_BUCKETS).map(|_| HashSet::new()).collect();
        }
        Self { ack_timeout, epoch, state: Mutex::new(st) }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Only plain collection updates happen under the lock; a poisoned
        // lock still holds consistent data.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn turn(&self) -> Option<Duration> {
        self.ack_timeout.map(|t| t / ACK_TIMEOUT_BUCKETS)
    }

    /// A message handed out: it goes on the ack-timeout wheel. `now` is
    /// read only when the wheel was empty. True: wake the task (the wheel
    /// starts turning).
    pub(crate) fn received(&self, id: MessageId, now: impl FnOnce() -> Instant) -> bool {
        let Some(turn) = self.turn() else { return false };
        let mut st = self.lock();
        let mut wake = false;
        if st.in_wheel == 0 {
            // An empty wheel does not turn: its next turn is one turn from now.
            let now = now();
            st.last_turn = now;
            wake = st.sooner(now + turn);
        }
        if let Some(b) = st.wheel.back_mut() {
            if b.insert(id) {
                st.in_wheel += 1;
            }
        }
        wake
    }

    pub(crate) fn acked(&self, id: &MessageId) {
        if self.ack_timeout.is_some() {
            self.lock().remove_from_wheel(id);
        }
    }

    pub(crate) fn acked_cumulative(&self, id: &MessageId) {
        if self.ack_timeout.is_some() {
            let mut st = self.lock();
            if st.in_wheel == 0 {
                return;
            }
            let mut removed = 0;
            for b in st.wheel.iter_mut() {
                let before = b.len();
                b.retain(|x| x.partition != id.partition || x > id);
                removed += before - b.len();
            }
            st.in_wheel -= removed;
        }
    }

    /// `at` rounded up to the nack grid.
    fn nack_slot(&self, at: Instant) -> Instant {
        let tick = NACK_TICK.as_nanos();
        let ticks = at.saturating_duration_since(self.epoch).as_nanos().div_ceil(tick);
        u64::try_from(ticks.saturating_mul(tick))
            .ok()
            .and_then(|n| self.epoch.checked_add(Duration::from_nanos(n)))
            .unwrap_or(at)
    }

    /// A negative ack: `id` is asked back `delay` after `now` (within a
    /// `NACK_TICK` more). True: wake the task (it falls due before the
    /// task's deadline).
    pub(crate) fn nacked(&self, id: MessageId, delay: Duration, now: Instant) -> bool {
        // A delay too large for the clock: a century.
        let at = now.checked_add(delay).or_else(|| now.checked_add(Duration::from_secs(100 * 365 * 86_400)));
        let due = self.nack_slot(at.unwrap_or(now));
        let mut st = self.lock();
        st.remove_from_wheel(&id);
        st.nacks.entry(due).or_default().push(id);
        st.sooner(due)
    }

    /// Forgets every timer (after a seek, nothing held is outstanding).
    pub(crate) fn clear(&self) {
        let mut st = self.lock();
        st.nacks.clear();
        for b in st.wheel.iter_mut() {
            b.clear();
        }
        st.in_wheel = 0;
    }

    /// Ids due for redelivery at `now`.
    pub(crate) fn tick(&self, now: Instant) -> Vec<MessageId> {
        let mut st = self.lock();
        let mut out: Vec<MessageId> = Vec::new();
        if st.nacks.first_key_value().is_some_and(|(due, _)| *due <= now) {
            let later = st.nacks.split_off(&now);
            let due = std::mem::replace(&mut st.nacks, later);
            out.extend(due.into_values().flatten());
            // `split_off` keeps a key equal to `now` in `later`.
            if let Some(ids) = st.nacks.remove(&now) {
                out.extend(ids);
            }
        }
        if let Some(turn) = self.turn() {
            if st.in_wheel > 0 && now.saturating_duration_since(st.last_turn) >= turn {
                st.last_turn = now;
                if let Some(oldest) = st.wheel.pop_front() {
                    st.in_wheel -= oldest.len();
                    out.extend(oldest);
                }
                st.wheel.push_back(HashSet::new());
            }
        }
        out.sort_unstable();
        out.dedup();
        out
    }

    /// When the task must next call `tick`: the first nack due, the wheel's
    /// next turn while it holds ids; `None`: nothing is pending. Recorded
    /// as the task's deadline (later updates compare with it).
    pub(crate) fn arm(&self) -> Option<Instant> {
        let mut st = self.lock();
        let nack = st.nacks.first_key_value().map(|(due, _)| *due);
        let turn = match self.turn() {
            Some(turn) if st.in_wheel > 0 => Some(st.last_turn + turn),
            _ => None,
        };
        let next = match (nack, turn) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        st.armed = next;
        next
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
        let t0 = Instant::now();
        let t = Tracker::new_at(None, t0);
        let ms = Duration::from_millis;
        assert_eq!(t.arm(), None, "nothing pending: no deadline");
        assert!(t.nacked(id(1), ms(50), t0), "the first nack wakes the task");
        assert!(t.nacked(id(2), ms(10), t0), "a nack due sooner wakes it");
        assert!(!t.nacked(id(3), ms(55), t0 + ms(1)), "one due later does not");
        assert!(t.tick(t0).is_empty());
        assert_eq!(t.arm(), Some(t0 + ms(10)));
        assert_eq!(t.tick(t0 + ms(10)), vec![id(2)], "due on the grid: at its time");
        assert_eq!(t.arm(), Some(t0 + ms(50)));
        assert_eq!(t.tick(t0 + ms(50)), vec![id(1)]);
        // 56 ms rounds up to the 10 ms grid: never early, at most a tick late.
        assert_eq!(t.arm(), Some(t0 + ms(60)));
        assert!(t.tick(t0 + ms(59)).is_empty());
        assert_eq!(t.tick(t0 + ms(60)), vec![id(3)]);
        assert_eq!(t.arm(), None);
        // A delay too large for the clock is a long one, not a panic.
        assert!(t.nacked(id(4), Duration::MAX, t0));
        assert!(t.tick(t0 + Duration::from_secs(3600)).is_empty());
    }

    #[test]
    fn unacked_ids_fall_off_the_wheel_after_the_timeout() {
        let timeout = Duration::from_millis(100);
        let t0 = Instant::now();
        let t = Tracker::new_at(Some(timeout), t0);
        assert!(t.tick(t0).is_empty());
        assert_eq!(t.arm(), None, "an empty wheel does not turn");
        assert!(t.received(id(1), || t0), "the first id starts the wheel");
        assert!(!t.received(id(2), || unreachable!("read only for an empty wheel")));
        t.acked(&id(2));
        let turn = timeout / ACK_TIMEOUT_BUCKETS;
        let mut got = Vec::new();
        let mut turns = 0;
        while got.is_empty() {
            turns += 1;
            assert_eq!(t.arm(), Some(t0 + turn * turns), "turns while it holds ids");
            got = t.tick(t0 + turn * turns);
            assert!(turns <= ACK_TIMEOUT_BUCKETS + 1, "never expired");
        }
        assert_eq!(got, vec![id(1)]);
        // Received right at a turn: the window's far end.
        assert_eq!(turns, ACK_TIMEOUT_BUCKETS + 1, "expired at timeout + one turn");
        assert_eq!(t.arm(), None, "empty again: it stops");
        // Acked ids leave the wheel; then it stops too.
        let t1 = t0 + Duration::from_secs(10);
        assert!(t.received(id(3), || t1));
        t.acked_cumulative(&id(3));
        assert_eq!(t.arm(), None);
        assert!(t.tick(t1 + timeout * 2).is_empty());
    }

    /// Goal: an unacked message comes back between the ack timeout and one
    /// turn (a tenth of it) more, never sooner, wherever between two turns
    /// it was received. Method: a wheel turning on time from t0, an id
    /// received at several points of the first turn; when each comes back.
    #[test]
    fn the_ack_timeout_window_is_timeout_to_one_turn_more() {
        let timeout = Duration::from_millis(1000);
        let turn = timeout / ACK_TIMEOUT_BUCKETS;
        let ms = Duration::from_millis;
        for off in [ms(0), ms(1), ms(50), ms(99)] {
            let t0 = Instant::now();
            let t = Tracker::new_at(Some(timeout), t0);
            assert!(t.received(id(0), || t0), "the wheel starts turning at t0");
            let _ = t.received(id(1), || t0 + off);
            let mut k = 0;
            let back = loop {
                k += 1;
                assert!(k <= 3 * ACK_TIMEOUT_BUCKETS, "never came back");
                if t.tick(t0 + turn * k).contains(&id(1)) {
                    break turn * k;
                }
            };
            let after = back - off;
            assert!(after >= timeout && after <= timeout + turn, "received at +{off:?}: back after {after:?}");
        }
    }
}
