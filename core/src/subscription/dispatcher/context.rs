//! What a dispatcher needs from its surroundings, and nothing more: where
//! consumer events go ([`DeliverySink`]), what it reads entries and index
//! facts from ([`LogReader`]), its limits, the dirty-cursor queues and the
//! shard's closed flag. The shard builds one [`DispatchCtx`] per
//! subscription when it starts its dispatcher; tests build one over a fake
//! sink and an in-memory log.
//!
//! Both seams are generic parameters, not trait objects: the dispatch pass
//! is the hot path of delivery, and static dispatch keeps each call as
//! cheap as calling the shard and the log directly. Owned by the topic's
//! shard; never crosses cores.

use crate::api::{ConsumerEvent, ConsumerRef};
use crate::subscription::persist::Dirty;
use bytes::Bytes;
use futures::channel::oneshot;
use magnetar_storage::{EntryLog, StorageError};
use std::cell::Cell;
use std::future::Future;
use std::rc::Rc;

/// Where consumer events go: to the consumer's connection, on whichever
/// shard it lives.
pub(crate) trait DeliverySink {
    fn deliver(&self, to: ConsumerRef, event: ConsumerEvent);
}

impl<T: DeliverySink + ?Sized> DeliverySink for Rc<T> {
    fn deliver(&self, to: ConsumerRef, event: ConsumerEvent) {
        (**self).deliver(to, event)
    }
}

/// A run of entries read in the background (see [`LogReader::read_run_ahead`]).
pub(crate) type RunReceiver = oneshot::Receiver<Result<Vec<Bytes>, StorageError>>;

/// What the dispatcher reads: stored entries, by `(ledger, entry)`, and
/// the index's facts about them.
pub(crate) trait LogReader {
    /// One entry. Unreadable data (a failed checksum, an I/O error) is an
    /// error, never served.
    fn read(&self, ledger: u64, entry: u64) -> impl Future<Output = Result<Bytes, StorageError>>;

    /// Consecutive entries of `ledger` from `entry`: at least one, at most
    /// `max_entries`, and no more than `max_bytes` past the first.
    fn read_run(
        &self,
        ledger: u64,
        entry: u64,
        max_entries: usize,
        max_bytes: usize,
    ) -> impl Future<Output = Result<Vec<Bytes>, StorageError>>;

    /// Starts [`read_run`](Self::read_run) in the background, so the disk
    /// works while the dispatcher delivers; `None` when it cannot start.
    fn read_run_ahead(&self, ledger: u64, entry: u64, max_entries: usize, max_bytes: usize) -> Option<RunReceiver>;

    /// The tag hash the index keeps for the entry (0: not recorded), `None`
    /// when the entry is not laid out in the index.
    fn tag_hash(&self, ledger: u64, entry: u64) -> Option<u32>;
}

/// The shard's entry log, read by its dispatchers. Background reads run in
/// the dispatch task queue, which has fewer shares than the default queue
/// where the log's flusher (the fsync path of every receipt) runs.
pub(crate) struct EntryLogReader {
    pub(crate) log: EntryLog,
    pub(crate) tq: glommio::TaskQueueHandle,
}

impl LogReader for EntryLogReader {
    fn read(&self, ledger: u64, entry: u64) -> impl Future<Output = Result<Bytes, StorageError>> {
        self.log.read(ledger, entry)
    }

    fn read_run(
        &self,
        ledger: u64,
        entry: u64,
        max_entries: usize,
        max_bytes: usize,
    ) -> impl Future<Output = Result<Vec<Bytes>, StorageError>> {
        self.log.read_run(ledger, entry, max_entries, max_bytes)
    }

    fn read_run_ahead(&self, ledger: u64, entry: u64, max_entries: usize, max_bytes: usize) -> Option<RunReceiver> {
        let (tx, rx) = oneshot::channel();
        let log = self.log.clone();
        let read = async move {
            let _ = tx.send(log.read_run(ledger, entry, max_entries, max_bytes).await);
        };
        match glommio::spawn_local_into(read, self.tq) {
            Ok(t) => {
                t.detach();
                Some(rx)
            }
            Err(e) => {
                tracing::debug!("cannot start a background read: {e}");
                None
            }
        }
    }

    fn tag_hash(&self, ledger: u64, entry: u64) -> Option<u32> {
        // Only what is in memory: an index page not at hand means "read the
        // entry and compare its tag" (the dispatcher never waits on a page).
        self.log.index_entry_cached(ledger, entry).map(|e| e.extras.tag_hash)
    }
}

/// The broker's limits on what a subscription hands out (copied from the
/// broker configuration, which does not change while it runs).
#[derive(Debug, Clone, Copy)]
pub(crate) struct DispatchLimits {
    pub(crate) unacked_per_consumer_max: u32,
    pub(crate) unacked_per_subscription_max: u32,
}

/// Everything one subscription's dispatcher uses besides its topic and
/// subscription.
pub(crate) struct DispatchCtx<S, L> {
    pub(crate) sink: S,
    pub(crate) log: L,
    pub(crate) limits: DispatchLimits,
    /// Cursors changed by dispatch (entries filtered out count as
    /// acknowledged) and redelivery counts wait here for the flusher.
    pub(crate) dirty: Rc<Dirty>,
    /// Set when the shard shuts down: dispatch stops.
    pub(crate) closed: Rc<Cell<bool>>,
}

impl<S: DeliverySink, L: LogReader> DispatchCtx<S, L> {
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.get()
    }
}
