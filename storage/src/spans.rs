//! The stretches of log that [`EntryLog::read_run`](crate::EntryLog::read_run)
//! read from disk, kept for the next runs. The partitions of one shard share
//! its log, so a run of one partition's entries reads the other partitions'
//! records between them too: without these, two partitions catching up read
//! every byte twice.
//! Owned by the log's shard (inside `State`); never crosses cores. No I/O.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::rc::Rc;
use std::time::{Duration, Instant};

use bytes::Bytes;

/// Stretches of log read by [`EntryLog::read_run`](crate::EntryLog::read_run)
/// kept for the next runs (of at most its `max_bytes` each: 1 MiB from the
/// dispatcher): without them, two partitions catching up read every byte
/// twice (1 GiB catch-up: the disk read ~2.4x what was delivered). Released
/// once reading goes idle (`LogConfig::read_span_idle`).
pub const SPANS_KEPT: usize = 8;
/// [`EntryLog::read_run`](crate::EntryLog::read_run) widens a disk read back
/// from the run's first record by less than this: to where the nearest kept
/// stretch before it ends, else to a multiple of this (log position, within
/// the segment). See [`SPANS_KEPT`].
pub const SPAN_ALIGN: u64 = 128 << 10;

/// A stretch of log read or being read from disk: runs that start inside it
/// wait for it instead of reading the same bytes.
#[derive(Default)]
pub(crate) struct SpanRead {
    /// `Some(Some(bytes))` once read in full; `Some(None)` if the read
    /// failed or came back short (waiters read for themselves).
    done: RefCell<Option<Option<Bytes>>>,
    waiters: RefCell<Vec<std::task::Waker>>,
}

impl SpanRead {
    /// Read, but not in full (waiters read for themselves).
    pub fn failed(&self) -> bool {
        matches!(*self.done.borrow(), Some(None))
    }

    /// Bytes held, once read in full.
    fn held(&self) -> u64 {
        self.done.borrow().as_ref().and_then(|b| b.as_ref().map(|b| b.len() as u64)).unwrap_or(0)
    }

    pub fn finish(&self, bytes: Option<Bytes>) {
        *self.done.borrow_mut() = Some(bytes);
        for w in self.waiters.borrow_mut().drain(..) {
            w.wake();
        }
    }

    pub async fn wait(&self) -> Option<Bytes> {
        std::future::poll_fn(|cx| match &*self.done.borrow() {
            Some(b) => std::task::Poll::Ready(b.clone()),
            None => {
                let mut waiters = self.waiters.borrow_mut();
                if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
                    waiters.push(cx.waker().clone());
                }
                std::task::Poll::Pending
            }
        })
        .await
    }
}

/// Finishes a [`SpanRead`] as failed if its reader is dropped first.
pub(crate) struct SpanGuard(pub Option<Rc<SpanRead>>);

impl Drop for SpanGuard {
    fn drop(&mut self) {
        if let Some(s) = self.0.take() {
            s.finish(None);
        }
    }
}

/// The last [`SPANS_KEPT`] stretches read, as (log position of their first
/// byte, bytes, the read), oldest first. All durable, so never changed (log
/// positions are never reused).
pub(crate) struct KeptSpans {
    kept: VecDeque<(u64, u64, Rc<SpanRead>)>,
    /// When a run last used or added one.
    used: Instant,
}

impl Default for KeptSpans {
    fn default() -> Self {
        KeptSpans { kept: VecDeque::new(), used: Instant::now() }
    }
}

impl KeptSpans {
    /// Lets every stretch go if no run used one for `idle`.
    pub fn release_if_idle(&mut self, idle: Duration) {
        if !self.kept.is_empty() && self.used.elapsed() >= idle {
            self.kept.clear();
        }
    }

    /// Of the stretches holding all of `from..end` (and not failed), the one
    /// reaching furthest.
    pub fn holding(&self, from: u64, end: u64) -> Option<(u64, u64, Rc<SpanRead>)> {
        self.kept
            .iter()
            .filter(|(at, len, read)| *at <= from && end <= at + len && !read.failed())
            .max_by_key(|(at, len, _)| at + len)
            .map(|(at, len, read)| (*at, *len, read.clone()))
    }

    /// A run used a kept stretch.
    pub fn touch(&mut self) {
        self.used = Instant::now();
    }

    /// Where the nearest stretch that ends at or before `position`, less than
    /// [`SPAN_ALIGN`] before it, ends (failed ones aside).
    pub fn joined_end(&self, position: u64) -> Option<u64> {
        self.kept
            .iter()
            .map(|(at, len, read)| (at + len, read))
            .filter(|(end, read)| *end <= position && position - end < SPAN_ALIGN && !read.failed())
            .map(|(end, _)| end)
            .max()
    }

    /// Announces a read of `len` bytes from log position `from`, before it is
    /// issued, so that runs starting inside it wait for it; the oldest
    /// stretch gives way beyond [`SPANS_KEPT`].
    pub fn announce(&mut self, from: u64, len: u64) -> Rc<SpanRead> {
        let read = Rc::new(SpanRead::default());
        if self.kept.len() == SPANS_KEPT {
            self.kept.pop_front();
        }
        self.kept.push_back((from, len, read.clone()));
        self.touch();
        read
    }

    /// How many are kept, and the bytes held by those read in full.
    pub fn stats(&self) -> (usize, u64) {
        (self.kept.len(), self.kept.iter().map(|(_, _, r)| r.held()).sum())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_last_few_and_finds_the_one_reaching_furthest() {
        let mut k = KeptSpans::default();
        let a = k.announce(0, 1000);
        let b = k.announce(500, 1000);
        assert_eq!(k.holding(600, 900).map(|s| s.0), Some(500), "the one reaching furthest");
        assert_eq!(k.holding(100, 900).map(|s| s.0), Some(0));
        assert!(k.holding(100, 1600).is_none(), "no stretch holds all of it");
        b.finish(None);
        assert_eq!(k.holding(600, 900).map(|s| s.0), Some(0), "a failed read is no help");
        a.finish(Some(Bytes::from(vec![0u8; 1000])));
        assert_eq!(k.stats(), (2, 1000), "only what was read in full is held");
        for i in 0..SPANS_KEPT as u64 {
            k.announce(10_000 + i * 100, 100);
        }
        assert_eq!(k.stats(), (SPANS_KEPT, 0), "the oldest gave way");
        assert!(k.holding(0, 10).is_none());
    }

    #[test]
    fn a_read_starts_where_a_kept_stretch_just_before_it_ends() {
        let mut k = KeptSpans::default();
        k.announce(0, 4096);
        assert_eq!(k.joined_end(4096), Some(4096));
        assert_eq!(k.joined_end(4096 + SPAN_ALIGN - 1), Some(4096));
        assert_eq!(k.joined_end(4096 + SPAN_ALIGN), None, "too far back");
        assert_eq!(k.joined_end(4000), None, "not before the position");
        k.announce(8192, 100).finish(None);
        assert_eq!(k.joined_end(8292), Some(4096), "a failed read is not joined");
    }

    #[test]
    fn released_once_idle() {
        let mut k = KeptSpans::default();
        k.announce(0, 10);
        k.release_if_idle(Duration::from_secs(3600));
        assert_eq!(k.stats().0, 1);
        k.release_if_idle(Duration::ZERO);
        assert_eq!(k.stats().0, 0);
    }

    #[test]
    fn a_dropped_reader_fails_its_read() {
        let mut k = KeptSpans::default();
        let read = k.announce(0, 10);
        drop(SpanGuard(Some(read.clone())));
        assert!(read.failed());
        assert!(k.holding(0, 10).is_none());
    }
}
