//! Ack grouping: individual acks are collected and sent in one `Ack`
//! command every `time` (default 100 ms) or every `max` acks (default
//! 1,000), whichever comes first; cumulative acks keep only the highest. A
//! group time of 0 sends every ack at once. `close()`, `seek`,
//! `ack_confirmed` and `redeliver_unacknowledged` send the group first, so
//! acks keep their order with what follows.

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

    /// Adds an ack; returns the whole group when it is full. `now` is read
    /// only when the group was empty.
    ///
    /// The ack of a whole batch entry (a batch index, size 0) replaces the
    /// batch-index acks of its siblings just before it in the group: the
    /// broker would record each, then the entry's ack makes them moot.
    pub(crate) fn add(
        &self,
        id: MessageId,
        batch_size: u32,
        cumulative: bool,
        now: impl FnOnce() -> Instant,
    ) -> Option<AckBatch> {
        let mut st = self.lock();
        st.since.get_or_insert_with(now);
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
            return Some(std::mem::take(&mut st.batch));
        }
        None
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
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(e: u64) -> MessageId {
        MessageId::new(1, e, -1, -1)
    }

    #[test]
    fn flushes_when_full_or_due() {
        let g = AckGroup::new(Duration::from_millis(100), 3);
        let t0 = Instant::now();
        assert_eq!(g.add(id(1), 0, false, || t0), None);
        assert_eq!(g.add(id(5), 0, true, || t0), None);
        assert_eq!(g.add(id(4), 0, true, || t0), None);
        assert_eq!(g.take_due(t0 + Duration::from_millis(99)), None);
        assert_eq!(g.add(id(2), 4, false, || t0), None);
        let full = g.add(id(3), 0, false, || t0).unwrap();
        assert_eq!(
            full,
            AckBatch {
                individual: vec![id(1), id(2), id(3)],
                batch_sizes: vec![0, 4, 0],
                cumulative: Some((id(5), 0))
            }
        );
        assert_eq!(g.take_due(t0 + Duration::from_secs(1)), None, "nothing left");
        g.add(id(9), 0, false, || t0 + Duration::from_millis(10));
        assert_eq!(g.take_due(t0 + Duration::from_millis(109)), None);
        assert_eq!(g.take_due(t0 + Duration::from_millis(110)).unwrap().individual, vec![id(9)]);
        assert!(g.take_all().is_empty());
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
