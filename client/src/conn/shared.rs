//! The state a connection's tasks and its handles share: pending requests,
//! each producer's sends awaiting their receipts (and the one send timer
//! that times them out), each consumer's queue, and why the connection
//! ended.
//!
//! All of it sits in one `std::sync::Mutex<State>` held only for map
//! operations, never across an `.await`. When the connection ends for any
//! reason, [`Shared::fail`] empties that state under the lock and fails every
//! waiter with `ClientError::Disconnected`, so nothing waits forever.

use super::demux::Inbox;
use crate::error::{ClientError, Result};
use magnetar_wire::{Command, MessageId};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::{oneshot, watch, Notify, OwnedSemaphorePermit};

/// A send awaiting its receipt. Holding the permit here, rather than in the
/// application's future, means the producer's in-flight bound counts what the
/// broker has not answered yet, even if the application drops the future
/// (or it timed out).
pub(crate) struct InflightSend {
    pub sequence_id: u64,
    /// Where the outcome goes; taken when the send times out (the entry
    /// stays, holding its permit and its place in the order, until the
    /// broker answers or the producer or connection goes).
    done: Option<oneshot::Sender<Result<MessageId>>>,
    /// When the send times out without a receipt: the operation timeout
    /// after it was queued. Never decreasing along a producer's queue.
    deadline: tokio::time::Instant,
    _permit: OwnedSemaphorePermit,
}

impl InflightSend {
    /// Completes the send's future with `outcome`, unless it timed out.
    pub(crate) fn finish(self, outcome: Result<MessageId>) {
        if let Some(done) = self.done {
            let _ = done.send(outcome);
        }
    }
}

pub(crate) struct ProducerSlot {
    pub name: String,
    pub closed: Arc<AtomicBool>,
    /// Sends in sequence order, oldest first: the broker answers them in this order.
    pub inflight: VecDeque<InflightSend>,
    /// Whether the producer has its entry in `State::send_deadlines`. Kept
    /// while its queue is empty (until the entry falls due), so that a
    /// producer with one send at a time does not touch the heap per send.
    watched: bool,
}

impl ProducerSlot {
    pub(crate) fn new(name: String, closed: Arc<AtomicBool>) -> Self {
        Self { name, closed, inflight: VecDeque::new(), watched: false }
    }
}

pub(crate) struct ConsumerSlot {
    pub subscription: String,
    pub closed: Arc<AtomicBool>,
    /// The consumer's queue (a multi-topic consumer's members share one).
    /// Unbounded on purpose: the broker bounds what it sends by flow
    /// permits (plus at most one whole batch entry past them), and the
    /// connection's one reader must never wait on one consumer's queue —
    /// that would stall every other consumer and request on the connection.
    pub deliver: Inbox,
    /// Failover: whether the broker says this consumer is the active one.
    pub active: Arc<AtomicBool>,
    /// Wakes the consumer's timer task (which may sleep with nothing due)
    /// when the broker closes the consumer, so that it ends.
    pub timers: Arc<tokio::sync::Notify>,
}

#[derive(Default)]
pub(super) struct State {
    /// Why the connection ended; `None` while it is up.
    pub(super) closed: Option<String>,
    pub(super) requests: HashMap<u64, oneshot::Sender<Result<Command>>>,
    pub(super) producers: HashMap<u64, ProducerSlot>,
    pub(super) consumers: HashMap<u64, ConsumerSlot>,
    /// When to look at a producer's sends next (at most one entry per
    /// producer, at or before its oldest pending send's deadline): the
    /// send timer's schedule.
    pub(super) send_deadlines: BinaryHeap<Reverse<(tokio::time::Instant, u64)>>,
}

/// The state shared by the connection's tasks and its handles.
pub(crate) struct Shared {
    state: Mutex<State>,
    pub(super) shutdown: watch::Sender<bool>,
    epoch: Instant,
    /// Milliseconds since `epoch` at which the last frame arrived.
    last_frame_ms: AtomicU64,
    /// Wakes the send timer: its schedule got its first entry, or the
    /// connection ended.
    pub(super) send_timer: Notify,
}

impl Shared {
    pub(super) fn new() -> Self {
        let (shutdown, _) = watch::channel(false);
        Self {
            state: Mutex::new(State::default()),
            shutdown,
            epoch: Instant::now(),
            last_frame_ms: AtomicU64::new(0),
            send_timer: Notify::new(),
        }
    }

    pub(super) fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock would be a client bug; the maps are
        // still structurally valid, so keep going rather than cascade panics.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    pub(super) fn touch(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_frame_ms.store(ms, Ordering::Relaxed);
    }

    pub(super) fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_frame_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    pub(crate) fn closed_reason(&self) -> Option<String> {
        self.lock().closed.clone()
    }

    /// End the connection: record why, stop the tasks, and fail every waiter.
    /// Idempotent: the first reason wins.
    pub(crate) fn fail(&self, reason: String) {
        let (requests, producers, consumers) = {
            let mut st = self.lock();
            if st.closed.is_some() {
                return;
            }
            st.closed = Some(reason.clone());
            st.send_deadlines.clear();
            (std::mem::take(&mut st.requests), std::mem::take(&mut st.producers), std::mem::take(&mut st.consumers))
        };
        tracing::debug!(%reason, "connection closed");
        let _ = self.shutdown.send(true);
        self.send_timer.notify_one();
        let disconnected = || ClientError::Disconnected { reason: reason.clone() };
        for (_, waiter) in requests {
            let _ = waiter.send(Err(disconnected()));
        }
        for (_, slot) in producers {
            for send in slot.inflight {
                send.finish(Err(disconnected()));
            }
        }
        // Dropping the consumers' senders lets `receive` drain what was
        // already delivered, then report the disconnection.
        drop(consumers);
    }

    /// Records a send before its frame is written, so that its receipt
    /// always finds it; it times out `after` from now. Fails if the
    /// connection or the producer is gone.
    pub(super) fn push_inflight(
        &self,
        producer_id: u64,
        sequence_id: u64,
        done: oneshot::Sender<Result<MessageId>>,
        permit: OwnedSemaphorePermit,
        after: Duration,
    ) -> Result<()> {
        let deadline = deadline_after(after);
        let mut guard = self.lock();
        let st = &mut *guard;
        if let Some(reason) = &st.closed {
            return Err(ClientError::Disconnected { reason: reason.clone() });
        }
        let Some(slot) = st.producers.get_mut(&producer_id) else {
            return Err(ClientError::ProducerClosed { producer_name: String::new() });
        };
        if let Some(last) = slot.inflight.back() {
            // Equal ids: the chunks of one chunked message.
            if last.sequence_id > sequence_id {
                return Err(ClientError::InvalidOption {
                    option: "sequence_id",
                    reason: "must be above every sequence id still awaiting its receipt",
                });
            }
        }
        slot.inflight.push_back(InflightSend { sequence_id, done: Some(done), deadline, _permit: permit });
        if !slot.watched {
            slot.watched = true;
            let first = st.send_deadlines.is_empty();
            st.send_deadlines.push(Reverse((deadline, producer_id)));
            drop(guard);
            // Otherwise the timer sleeps until an earlier entry (every
            // entry is at most `after` from now), and looks again then.
            if first {
                self.send_timer.notify_one();
            }
        }
        Ok(())
    }

    /// Restarts the timeout of the producer's newest send if it is
    /// `sequence_id` (its frame waited for room in the write queue).
    pub(super) fn restart_deadline(&self, producer_id: u64, sequence_id: u64, after: Duration) {
        let deadline = deadline_after(after);
        let mut st = self.lock();
        let newest = st.producers.get_mut(&producer_id).and_then(|slot| slot.inflight.back_mut());
        if let Some(send) = newest.filter(|s| s.sequence_id == sequence_id && s.done.is_some()) {
            // Later than every other deadline of the queue: the order holds,
            // and the producer's schedule entry (earlier) stays valid.
            send.deadline = send.deadline.max(deadline);
        }
    }

    /// Fails every send due by `now` with `Timeout` (`after` is the
    /// connection's operation timeout, for the error) and reschedules the
    /// producers that still have sends pending. The send timer's next
    /// instant (`None`: nothing scheduled); `Err` once the connection ended.
    pub(super) fn expire_sends(
        &self,
        now: tokio::time::Instant,
        after: Duration,
    ) -> std::result::Result<Option<tokio::time::Instant>, ()> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.closed.is_some() {
            return Err(());
        }
        while let Some(&Reverse((at, producer_id))) = st.send_deadlines.peek() {
            if at > now {
                return Ok(Some(at));
            }
            st.send_deadlines.pop();
            // A producer closed meanwhile has no sends left to time out.
            let Some(slot) = st.producers.get_mut(&producer_id) else { continue };
            let mut next = None;
            // Oldest first; timed-out sends (no `done`) wait for their
            // receipt at the front.
            for send in slot.inflight.iter_mut().filter(|s| s.done.is_some()) {
                if send.deadline > now {
                    next = Some(send.deadline);
                    break;
                }
                if let Some(done) = send.done.take() {
                    let _ = done.send(Err(ClientError::Timeout { operation: "send receipt", after }));
                }
            }
            match next {
                Some(at) => st.send_deadlines.push(Reverse((at, producer_id))),
                None => slot.watched = false,
            }
        }
        Ok(None)
    }
}

/// `after` from now on tokio's clock (a year when that overflows: no
/// deadline).
fn deadline_after(after: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(after).unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// The connection's send timer: fails each send still without a receipt
/// at its deadline (`Timeout`, "send receipt", after `after`). One timer for
/// the connection instead of one per send (a timer per send costs two trips
/// through tokio's timer wheel per message): the producers' oldest pending sends are
/// scheduled in `State::send_deadlines`, each producer's sends time out in
/// queue order (their deadlines never decrease along it), and a producer is
/// looked at again at its next pending send's deadline. Sleeps while
/// nothing is scheduled; ends with the connection.
pub(super) async fn send_timeouts(shared: Arc<Shared>, after: Duration) {
    loop {
        let Ok(next) = shared.expire_sends(tokio::time::Instant::now(), after) else { return };
        // A push after the look above leaves a permit here: no lost wake-up.
        let woken = shared.send_timer.notified();
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = woken => {}
                }
            }
            None => woken.await,
        }
    }
}

#[cfg(test)]
mod tests {
    // Test code: unwrap on our own encoder's output is the assertion.
    #![allow(clippy::unwrap_used)]
    use super::super::demux::dispatch;
    use super::*;
    use bytes::Bytes;
    use tokio::sync::mpsc;
    use tokio::sync::oneshot::error::TryRecvError;

    /// Goal: the connection's one send timer keeps each send's own timeout:
    /// a send without a receipt fails with `Timeout` at its deadline (not a
    /// millisecond before), in queue order, for sends queued at different
    /// times and on two producers; a send answered in time is not failed; a
    /// send whose frame waited for the write queue times out from when it
    /// got in; a timed-out send keeps its `max_pending` permit until its
    /// late receipt (then dropped quietly), as does a send whose future was
    /// dropped; the timer sleeps with nothing scheduled and ends with the
    /// connection. Method: `send_timeouts` on tokio's paused clock, receipts
    /// through `dispatch`.
    #[tokio::test(start_paused = true)]
    async fn sends_time_out_at_their_deadlines_on_one_timer() {
        let after = Duration::from_secs(5);
        let (s, ms) = (Duration::from_secs, Duration::from_millis);
        let shared = Arc::new(Shared::new());
        for id in [1, 2] {
            let slot = ProducerSlot::new(format!("p{id}"), Arc::new(AtomicBool::new(false)));
            shared.lock().producers.insert(id, slot);
        }
        let permits = Arc::new(tokio::sync::Semaphore::new(10));
        let push = |producer_id: u64, sequence_id: u64| {
            let (done, rx) = oneshot::channel();
            let permit = permits.clone().try_acquire_owned().unwrap();
            shared.push_inflight(producer_id, sequence_id, done, permit, after).unwrap();
            rx
        };
        let (write, _queued) = mpsc::channel(1);
        let (write, pong) = (write.downgrade(), Bytes::new());
        let receipt = |producer_id: u64, sequence_id: u64| {
            let (shared, write, pong) = (shared.clone(), write.clone(), pong.clone());
            async move {
                let message_id = MessageId::new(1, sequence_id, -1, -1);
                let command = Command::SendReceipt { producer_id, sequence_id, message_id };
                dispatch(&shared, command, Bytes::new(), &write, &pong).await.unwrap();
            }
        };
        async fn settle() {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        }
        fn pending(rx: &mut oneshot::Receiver<Result<MessageId>>, what: &str) {
            assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)), "{what} is no longer pending");
        }
        fn timed_out(rx: &mut oneshot::Receiver<Result<MessageId>>, after: Duration, what: &str) {
            match rx.try_recv() {
                Ok(Err(ClientError::Timeout { operation: "send receipt", after: a })) if a == after => {}
                other => panic!("{what}: expected the receipt's Timeout, got {other:?}"),
            }
        }
        let t0 = tokio::time::Instant::now();
        let timer = tokio::spawn(send_timeouts(shared.clone(), after));
        // The timer now waits with nothing scheduled: the first push wakes it.
        settle().await;
        let mut a = push(1, 1);
        let mut b = push(1, 2);
        tokio::time::sleep_until(t0 + s(1)).await;
        receipt(1, 1).await;
        assert_eq!(a.try_recv().unwrap().unwrap(), MessageId::new(1, 1, -1, -1));
        tokio::time::sleep_until(t0 + s(2)).await;
        let mut c = push(1, 3);
        let mut d = push(2, 1);
        tokio::time::sleep_until(t0 + s(3)).await;
        drop(push(1, 4));
        tokio::time::sleep_until(t0 + s(4)).await;
        // d's frame got into the write queue only now.
        shared.restart_deadline(2, 1, after);

        tokio::time::sleep_until(t0 + s(5) - ms(1)).await;
        settle().await;
        pending(&mut b, "b, 1 ms before its deadline");
        tokio::time::sleep_until(t0 + s(5)).await;
        settle().await;
        timed_out(&mut b, after, "b");
        pending(&mut c, "c, at b's deadline");
        pending(&mut d, "d, at b's deadline");
        // b, c, d and the dropped one hold their permits.
        assert_eq!(permits.available_permits(), 6);

        tokio::time::sleep_until(t0 + s(7) - ms(1)).await;
        settle().await;
        pending(&mut c, "c, 1 ms before its deadline");
        tokio::time::sleep_until(t0 + s(7)).await;
        settle().await;
        timed_out(&mut c, after, "c");
        pending(&mut d, "d, at its first deadline (restarted)");
        tokio::time::sleep_until(t0 + s(9) - ms(1)).await;
        settle().await;
        pending(&mut d, "d, 1 ms before its restarted deadline");
        tokio::time::sleep_until(t0 + s(9)).await;
        settle().await;
        timed_out(&mut d, after, "d");
        assert_eq!(permits.available_permits(), 6);

        // Late receipts release the permits, the dropped send's too.
        for (producer_id, sequence_id) in [(1, 2), (1, 3), (1, 4), (2, 1)] {
            receipt(producer_id, sequence_id).await;
        }
        assert_eq!(permits.available_permits(), 10);
        assert!(shared.lock().producers.values().all(|p| p.inflight.is_empty()));
        // Nothing pending: the timer's schedule empties (each producer's
        // entry falls due once more) and the timer then sleeps.
        tokio::time::sleep_until(t0 + s(60)).await;
        settle().await;
        assert!(shared.lock().send_deadlines.is_empty());
        assert!(shared.lock().producers.values().all(|p| !p.watched));
        assert!(!timer.is_finished());
        shared.fail("test over".into());
        settle().await;
        assert!(timer.is_finished(), "the send timer outlived its connection");
    }
}
