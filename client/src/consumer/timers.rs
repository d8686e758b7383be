//! A consumer's timer task: grouped acks that fall due, nacked messages
//! whose delay passed and unacknowledged ones past the ack timeout (asked
//! back from the broker), on one task per consumer that sleeps while
//! nothing is due.

use super::ack_group::AckGroup;
use super::acks::{ack_commands, group, RetryRoute};
use super::tracker::Tracker;
use crate::conn::Connection;
use crate::error::Result;
use magnetar_wire::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Instant;
use tokio::sync::Notify;

/// The clock the consumer's timers read, wherever they are updated: tokio's
/// (std's `Instant::now()`, except on a test's paused clock), so that the
/// timer task, which sleeps on tokio's, and the updates agree.
pub(super) fn clock() -> Instant {
    tokio::time::Instant::now().into_std()
}

/// Serves the consumer's timers (see `run_timers`) on the current runtime.
pub(super) fn spawn_timer_task(
    conn: Arc<Connection>,
    consumer_id: u64,
    retry: Option<Arc<RetryRoute>>,
    tracker: Arc<Tracker>,
    acks: Arc<AckGroup>,
    closed: Arc<AtomicBool>,
    wake: Arc<Notify>,
) {
    let Ok(handle) = tokio::runtime::Handle::try_current() else { return };
    let shut_down = conn.shut_down();
    let watched = conn.clone();
    let open = move || !closed.load(Ordering::Acquire) && watched.is_open();
    let send = move |command: Command| {
        let conn = conn.clone();
        async move { conn.send_command(&command).await }
    };
    handle.spawn(run_timers(consumer_id, retry, tracker, acks, wake, shut_down, open, send));
}

/// The consumer's timer task: sends grouped acks that are due and asks the
/// broker back for messages whose nack delay or ack timeout passed. It
/// sleeps until the earliest deadline (`Tracker::arm`, `AckGroup::arm`):
/// without grouped acks, nacks or ids on the ack-timeout wheel it does not
/// wake at all, until an update that falls due sooner wakes it through
/// `wake` (a `notify_one` before it waits is kept, so none is lost). Ends
/// when `open` says no (checked at each wake-up: the consumer wakes it when
/// it closes, the connection's reader when the broker closes it), when
/// `shut_down` completes (the connection went down) or a send fails.
#[allow(clippy::too_many_arguments)]
async fn run_timers<S, F>(
    consumer_id: u64,
    retry: Option<Arc<RetryRoute>>,
    tracker: Arc<Tracker>,
    acks: Arc<AckGroup>,
    wake: Arc<Notify>,
    shut_down: impl std::future::Future<Output = ()>,
    open: impl Fn() -> bool,
    send: S,
) where
    S: Fn(Command) -> F,
    F: std::future::Future<Output = Result<()>>,
{
    let mut shut_down = std::pin::pin!(shut_down);
    loop {
        if !open() {
            return;
        }
        let now = clock();
        let due = tracker.tick(now);
        // Grouped acks go before a redelivery request, due or not: the
        // broker sends a batch back with the bits of the acks it has,
        // and the acks still grouped here would come back as messages.
        let batch = if due.is_empty() { acks.take_due(now) } else { Some(acks.take_all()) };
        if let Some(batch) = batch.filter(|b| !b.is_empty()) {
            for command in ack_commands(consumer_id, &retry, batch) {
                if let Err(e) = send(command).await {
                    tracing::debug!(error = %e, "grouped acks not sent");
                    return;
                }
            }
        }
        if !due.is_empty() {
            // Several frames for many ids keep each frame small.
            for (consumer_id, ids) in group(consumer_id, &retry, &due, |id| id) {
                for ids in ids.chunks(1000) {
                    let command = Command::RedeliverUnacknowledged { consumer_id, message_ids: ids.to_vec() };
                    if let Err(e) = send(command).await {
                        tracing::debug!(error = %e, "redelivery request not sent");
                        return;
                    }
                }
            }
        }
        // Whatever changes after `arm` and falls due sooner notifies.
        let next = match (tracker.arm(), acks.arm()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at.into()) => {}
                    () = wake.notified() => {}
                    () = &mut shut_down => return,
                }
            }
            None => {
                tokio::select! {
                    () = wake.notified() => {}
                    () = &mut shut_down => return,
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::consumer::tracker::ACK_TIMEOUT_BUCKETS;
    use crate::error::ClientError;
    use magnetar_wire::MessageId;
    use std::sync::atomic::AtomicUsize;
    use std::time::Duration;
    use tokio::sync::mpsc;

    fn id(e: u64) -> MessageId {
        MessageId::new(1, e, 0, -1)
    }

    fn now() -> Instant {
        tokio::time::Instant::now().into_std()
    }

    /// Goal: a consumer's timer task does not wake while nothing is
    /// pending, yet grouped acks
    /// go out at the group time, a nack comes back at its delay (within the
    /// 10 ms grid), grouped acks go before a redelivery request, an unacked
    /// message comes back after the ack timeout, and the task ends when the
    /// consumer closes. Method: `run_timers` on tokio's paused clock, its
    /// commands into a channel with their send times, its wake-ups counted
    /// by its `open` check.
    #[tokio::test(start_paused = true)]
    async fn an_idle_consumer_timer_task_sleeps_until_something_falls_due() {
        let ms = Duration::from_millis;
        let ack_timeout = Duration::from_secs(1);
        let tracker = Arc::new(Tracker::new_at(Some(ack_timeout), now()));
        let acks = Arc::new(AckGroup::new(ms(100), 1000));
        let wake = Arc::new(Notify::new());
        let wakes = Arc::new(AtomicUsize::new(0));
        let open = Arc::new(AtomicBool::new(true));
        let (tx, mut rx) = mpsc::unbounded_channel();
        let task = tokio::spawn(run_timers(
            7,
            None,
            tracker.clone(),
            acks.clone(),
            wake.clone(),
            std::future::pending(),
            {
                let (wakes, open) = (wakes.clone(), open.clone());
                move || {
                    wakes.fetch_add(1, Ordering::Relaxed);
                    open.load(Ordering::Acquire)
                }
            },
            move |command| {
                let sent = tx
                    .send((tokio::time::Instant::now(), command))
                    .map_err(|_| ClientError::Disconnected { reason: "test over".into() });
                async move { sent }
            },
        ));
        let idle = |what: &'static str| {
            let wakes = wakes.clone();
            async move {
                let before = wakes.load(Ordering::Relaxed);
                tokio::time::sleep(Duration::from_secs(10)).await;
                assert_eq!(wakes.load(Ordering::Relaxed) - before, 0, "woke while idle ({what})");
            }
        };
        tokio::task::yield_now().await;
        assert_eq!(wakes.load(Ordering::Relaxed), 1, "the task looked once");
        // The paused clock jumps to the timeout if the task never sends.
        async fn next(
            rx: &mut mpsc::UnboundedReceiver<(tokio::time::Instant, Command)>,
        ) -> (tokio::time::Instant, Command) {
            let sent = tokio::time::timeout(Duration::from_secs(60), rx.recv()).await;
            sent.expect("the task sent nothing: a lost wake-up").expect("the task ended")
        }
        idle("from the start").await;
        assert!(rx.try_recv().is_err());

        // A grouped ack goes out at the group time.
        let t1 = tokio::time::Instant::now();
        let added = acks.add(id(1), 0, false, now);
        assert!(added.wake);
        wake.notify_one();
        let (at, ack) = next(&mut rx).await;
        assert_eq!(at - t1, ms(100));
        assert!(matches!(&ack, Command::Ack { message_ids, .. } if *message_ids == [id(1)]), "{ack:?}");
        idle("after the ack").await;

        // A nack comes back at its delay, after the acks grouped before it.
        let t2 = tokio::time::Instant::now();
        if tracker.nacked(id(2), Duration::from_secs(1), now()) {
            wake.notify_one();
        }
        tokio::time::sleep(ms(950)).await;
        assert!(acks.add(id(3), 0, false, now).wake.then(|| wake.notify_one()).is_some());
        let (at, ack) = next(&mut rx).await;
        assert!(matches!(&ack, Command::Ack { message_ids, .. } if *message_ids == [id(3)]), "{ack:?}");
        assert_eq!(at - t2, Duration::from_secs(1), "sent with the nack's request, before its group time");
        let (at, redeliver) = next(&mut rx).await;
        assert_eq!(at - t2, Duration::from_secs(1));
        assert!(
            matches!(&redeliver, Command::RedeliverUnacknowledged { consumer_id: 7, message_ids } if *message_ids == [id(2)]),
            "{redeliver:?}"
        );
        // Off the grid: at most one NACK_TICK late, never early.
        tokio::time::sleep(ms(3)).await;
        let t3 = tokio::time::Instant::now();
        if tracker.nacked(id(4), ms(20), now()) {
            wake.notify_one();
        }
        let (at, _) = next(&mut rx).await;
        assert!(at - t3 >= ms(20) && at - t3 <= ms(30), "{:?}", at - t3);
        idle("after the nacks").await;

        // An unacked message comes back after the ack timeout; one acked
        // does not, and the wheel stops once empty.
        let t4 = tokio::time::Instant::now();
        assert!(tracker.received(id(5), now), "the first id into the wheel wakes the task");
        wake.notify_one();
        assert!(!tracker.received(id(6), now));
        tracker.acked(&id(6));
        let (at, redeliver) = next(&mut rx).await;
        assert!(
            matches!(&redeliver, Command::RedeliverUnacknowledged { message_ids, .. } if *message_ids == [id(5)]),
            "{redeliver:?}"
        );
        let after = at - t4;
        assert!(after >= ack_timeout && after <= ack_timeout + ack_timeout / ACK_TIMEOUT_BUCKETS, "{after:?}");
        idle("after the ack timeout").await;

        // Closing wakes it to end.
        open.store(false, Ordering::Release);
        wake.notify_one();
        tokio::time::timeout(ms(1), task).await.expect("the task ended").unwrap();
    }
}
