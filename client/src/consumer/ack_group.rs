//! Ack grouping: individual acks are collected and sent in one `Ack`
//! command every `time` (default 100 ms) or every `max` acks (default
//! 1,000), whichever comes first; cumulative acks keep only the highest. A
//! group time of 0 sends every ack at once. `close()`, `seek`,
//! `ack_confirmed` and `redeliver_unacknowledged` send the group first, so
//! acks keep their order with what follows.
//!
//! The consumer's timer task sends a group that is due; it sleeps until the
//! group's deadline ([`AckGroup::arm`]), and the first ack into an empty
//! group wakes it when that deadline is earlier (`Added::wake`).

use magnetar_wire::MessageId;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Default longest an ack waits in the group.
pub const ACK_GROUP_TIME_DEFAULT: Duration = Duration::from_millis(100);
/// Default most acks in one group.
pub const ACK_GROUP_MAX_DEFAULT: usize = 1000;

/// Acks to send now.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct AckBatch {
    pub(crate) individual: Vec<MessageId>,
    /// One per `individual` id: its batch's size for a batch-index ack, 0
    /// for an ack of the whole entry.
    pub(crate) batch_sizes: Vec<u32>,
    /// The highest cumulative ack, with its batch size (as above).
    pub(crate) cumulative: Option<(MessageId, u32)>,
}

impl AckBatch {
    pub(crate) fn is_empty(&self) -> bool {
        self.individual.is_empty() && self.cumulative.is_none()
    }
}

#[derive(Default)]
struct State {
    batch: AckBatch,
    /// When the oldest ack in the group was added.
    since: Option<Instant>,
    /// The deadline the timer task was last told (`arm`); `None`: it does
    /// not wake for the group.
    armed: Option<Instant>,
}

/// What [`AckGroup::add`] did.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Added {
    /// The whole group, to send now: it is full.
    pub(crate) full: Option<AckBatch>,
    /// The group started and falls due before the timer task would wake:
    /// wake it.
    pub(crate) wake: bool,
}

pub(crate) struct AckGroup {
    time: Duration,
    max: usize,
    state: Mutex<State>,
}

impl AckGroup {
    pub(crate) fn new(time: Duration, max: usize) -> Self {
        Self { time, max: max.max(1), state: Mutex::new(State::default()) }
    }

    /// False when acks go out at once.
    pub(crate) fn enabled(&self) -> bool {
        !self.time.is_zero()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        // Only plain collection updates happen under the lock.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Adds an ack; hands back the whole group when it is full. `now` is
    /// read only when the group was empty.
    ///
    /// The ack of a whole batch entry (a batch index, size 0) replaces the
    /// batch-index acks of its siblings just before it in the group: the
    /// broker would record each, then the entry's ack makes them moot.
    pub(crate) fn add(&self, id: MessageId, batch_size: u32, cumulative: bool, now: impl FnOnce() -> Instant) -> Added {
        let mut st = self.lock();
        let mut wake = false;
        // What the task was told before this call: kept if the group goes
        // out at once below (the task then never hears of this deadline).
        let armed_before = st.armed;
        if st.since.is_none() {
            let since = now();
            st.since = Some(since);
            let due = since + self.time;
            if st.armed.is_none_or(|a| due < a) {
                st.armed = Some(due);
                wake = true;
            }
        }
        if cumulative {
            let c = st.batch.cumulative.get_or_insert((id, batch_size));
            if id > c.0 {
                *c = (id, batch_size);
            }
        } else {
            if batch_size == 0 && id.batch_index >= 0 {
                let same_entry =
                    |m: &MessageId| (m.ledger, m.entry, m.partition) == (id.ledger, id.entry, id.partition);
                while st.batch.batch_sizes.last().is_some_and(|s| *s > 0)
                    && st.batch.individual.last().is_some_and(same_entry)
                {
                    st.batch.individual.pop();
                    st.batch.batch_sizes.pop();
                }
            }
            st.batch.individual.push(id);
            st.batch.batch_sizes.push(batch_size);
        }
        if st.batch.individual.len() >= self.max {
            st.since = None;
            st.armed = armed_before;
            // Sent by the caller: no need to wake the task for it.
            return Added { full: Some(std::mem::take(&mut st.batch)), wake: false };
        }
        Added { full: None, wake }
    }

    /// The group, if its oldest ack has waited `time`.
    pub(crate) fn take_due(&self, now: Instant) -> Option<AckBatch> {
        let mut st = self.lock();
        match st.since {
            Some(t) if now.duration_since(t) >= self.time => {
                st.since = None;
                Some(std::mem::take(&mut st.batch))
            }
            _ => None,
        }
    }

    pub(crate) fn take_all(&self) -> AckBatch {
        let mut st = self.lock();
        st.since = None;
        std::mem::take(&mut st.batch)
    }

    /// When the group falls due (`None`: it is empty), recorded as the
    /// timer task's deadline for it.
    pub(crate) fn arm(&self) -> Option<Instant> {
        let mut st = self.lock();
        let due = st.since.map(|t| t + self.time);
        st.armed = due;
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(e: u64) -> MessageId {
        MessageId::new(1, e, -1, -1)
    }

    /// Goal: an ack that fills the group at once (max 1) does not leave the
    /// task believed armed for a deadline it never heard of, so the next
    /// grouped ack (a cumulative one never fills the group) wakes it.
    #[test]
    fn a_group_sent_at_once_leaves_the_task_unarmed() {
        let g = AckGroup::new(Duration::from_millis(100), 1);
        let t0 = Instant::now();
        assert!(g.add(id(1), 0, false, || t0).full.is_some(), "sent by the caller");
        let later = t0 + Duration::from_millis(10);
        assert_eq!(g.add(id(2), 0, true, || later), Added { full: None, wake: true }, "the task must hear of it");
    }

    #[test]
    fn flushes_when_full_or_due() {
        let g = AckGroup::new(Duration::from_millis(100), 3);
        let t0 = Instant::now();
        let grouped = |wake| Added { full: None, wake };
        assert_eq!(g.add(id(1), 0, false, || t0), grouped(true), "the first ack wakes the task");
        assert_eq!(g.add(id(5), 0, true, || t0), grouped(false));
        assert_eq!(g.add(id(4), 0, true, || t0), grouped(false));
        assert_eq!(g.take_due(t0 + Duration::from_millis(99)), None);
        assert_eq!(g.add(id(2), 4, false, || t0), grouped(false));
        let full = g.add(id(3), 0, false, || t0).full.unwrap();
        assert_eq!(
            full,
            AckBatch {
                individual: vec![id(1), id(2), id(3)],
                batch_sizes: vec![0, 4, 0],
                cumulative: Some((id(5), 0))
            }
        );
        assert_eq!(g.take_due(t0 + Duration::from_secs(1)), None, "nothing left");
        // The task still wakes at t0 + 100 ms (it was told so): a group
        // starting later needs no wake-up, and the task is told its time.
        assert_eq!(g.add(id(9), 0, false, || t0 + Duration::from_millis(10)), grouped(false));
        assert_eq!(g.take_due(t0 + Duration::from_millis(100)), None);
        assert_eq!(g.arm(), Some(t0 + Duration::from_millis(110)));
        assert_eq!(g.take_due(t0 + Duration::from_millis(109)), None);
        assert_eq!(g.take_due(t0 + Duration::from_millis(110)).unwrap().individual, vec![id(9)]);
        assert!(g.take_all().is_empty());
        // Nothing grouped: the task sleeps, and the next ack wakes it.
        assert_eq!(g.arm(), None);
        assert_eq!(g.add(id(10), 0, false, || t0 + Duration::from_millis(500)), grouped(true));
    }

    #[test]
    fn an_entry_ack_replaces_its_batch_index_acks_just_before_it() {
        let g = AckGroup::new(Duration::from_millis(100), 100);
        let t0 = Instant::now();
        let at = |e: u64, i: i32| MessageId::new(1, e, 0, i);
        g.add(at(1, 1), 3, false, || t0);
        g.add(at(2, 0), 2, false, || t0);
        g.add(at(3, 1), 3, false, || t0);
        g.add(at(3, 0), 3, false, || t0);
        g.add(at(3, 2), 0, false, || t0);
        g.add(at(1, 0), 3, false, || t0);
        let all = g.take_all();
        assert_eq!(all.individual, vec![at(1, 1), at(2, 0), at(3, 2), at(1, 0)]);
        assert_eq!(all.batch_sizes, vec![3, 2, 0, 3]);
        // An unbatched entry's ack (batch index -1) takes nothing away.
        g.add(MessageId::new(1, 4, 0, -1), 0, false, || t0);
        g.add(MessageId::new(1, 4, 0, -1), 0, false, || t0);
        assert_eq!(g.take_all().individual.len(), 2);
    }
}
