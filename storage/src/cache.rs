//! The entry log's caches of entry bodies: the write cache (entries appended
//! and not yet evicted, so that readers near the tail need no disk read) and
//! the read cache (entries read from disk and read ahead).
//! Owned by the log's shard (inside `State`); never crosses cores. No I/O.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;

use crate::log::CACHED_ENTRY_OVERHEAD;

/// What one cached body is charged against a cache's bound: the body and
/// [`CACHED_ENTRY_OVERHEAD`], so that the bound is on memory, not body bytes.
pub(crate) fn charge(body: &Bytes) -> usize {
    body.len() + CACHED_ENTRY_OVERHEAD
}

/// Appended entries by (ledger, entry), evicted oldest first but never
/// above the durable log position: an entry that is not durable yet exists
/// nowhere else.
///
/// Invariant: `bytes` is the sum of the charges recorded in `fifo`, and
/// every record in `fifo` is one insertion not yet evicted.
#[derive(Default)]
pub(crate) struct WriteCache {
    entries: HashMap<(u64, u64), Bytes>,
    /// (ledger, entry, lsn, bytes charged) in append order, for eviction.
    fifo: VecDeque<(u64, u64, u64, usize)>,
    bytes: usize,
}

impl WriteCache {
    /// Keeps `body`, appended at log sequence number `lsn`. Appends come in
    /// lsn order, so the FIFO is in lsn order too.
    pub fn insert(&mut self, key: (u64, u64), lsn: u64, body: Bytes) {
        debug_assert!(self.fifo.back().is_none_or(|&(_, _, last, _)| last < lsn), "appends in lsn order");
        let cost = charge(&body);
        self.entries.insert(key, body);
        self.fifo.push_back((key.0, key.1, lsn, cost));
        self.bytes += cost;
    }

    pub fn get(&self, key: &(u64, u64)) -> Option<&Bytes> {
        self.entries.get(key)
    }

    /// Bytes charged for what the cache holds.
    #[cfg(test)]
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Drops the oldest cached entries while over `bound`, but never one
    /// whose lsn is above `durable_lsn`: it exists nowhere else.
    pub fn evict(&mut self, bound: usize, durable_lsn: u64) {
        while self.bytes > bound {
            let Some(&(ledger, entry, lsn, len)) = self.fifo.front() else {
                break;
            };
            if lsn > durable_lsn {
                break;
            }
            self.fifo.pop_front();
            self.entries.remove(&(ledger, entry));
            assert!(self.bytes >= len, "write cache charged less than it holds");
            self.bytes -= len;
        }
    }
}

/// Entries read from disk (and read ahead) by (ledger, entry), evicted
/// oldest first so that at most the bound passed to [`put`](Self::put) is
/// charged. Kept apart from the write cache so that catch-up reads cannot
/// evict the tail.
///
/// Invariant: `bytes` is the sum of the charges of the entries present, and
/// every entry present has one record in `fifo`.
#[derive(Default)]
pub(crate) struct ReadCache {
    entries: HashMap<(u64, u64), Bytes>,
    /// (key, bytes charged) in insertion order, for eviction.
    fifo: VecDeque<((u64, u64), usize)>,
    bytes: usize,
}

impl ReadCache {
    /// Keeps an entry read from disk, within `bound` bytes (oldest first
    /// out). A body larger than the bound, or a key already held, is not
    /// kept.
    pub fn put(&mut self, key: (u64, u64), body: Bytes, bound: usize) {
        let cost = charge(&body);
        if cost > bound || self.entries.contains_key(&key) {
            return;
        }
        self.bytes += cost;
        self.fifo.push_back((key, cost));
        self.entries.insert(key, body);
        while self.bytes > bound {
            let Some((k, len)) = self.fifo.pop_front() else { break };
            if self.entries.remove(&k).is_some() {
                assert!(self.bytes >= len, "read cache charged less than it holds");
                self.bytes -= len;
            }
        }
        assert!(self.bytes <= bound);
    }

    pub fn get(&self, key: &(u64, u64)) -> Option<&Bytes> {
        self.entries.get(key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `bytes` is the sum of the charges of the entries present.
    fn assert_accounted(c: &WriteCache) {
        let sum: usize = c.entries.values().map(charge).sum();
        assert_eq!(c.bytes, sum);
        assert_eq!(c.fifo.iter().map(|r| r.3).sum::<usize>(), c.bytes);
        assert_eq!(c.fifo.len(), c.entries.len());
    }

    fn body(n: usize) -> Bytes {
        Bytes::from(vec![7u8; n])
    }

    #[test]
    fn an_insert_is_charged_its_body_and_the_overhead() {
        let mut c = WriteCache::default();
        c.insert((1, 0), 1, body(10));
        c.insert((1, 1), 2, body(0));
        assert_eq!(c.bytes(), 10 + 2 * CACHED_ENTRY_OVERHEAD);
        assert_eq!(c.get(&(1, 0)).map(Bytes::len), Some(10));
        assert!(c.get(&(2, 0)).is_none());
        assert_accounted(&c);
    }

    #[test]
    fn eviction_drops_the_oldest_durable_entries_until_within_the_bound() {
        // Five entries, all durable; a bound of two entries keeps the last two.
        let mut c = WriteCache::default();
        for i in 0..5 {
            c.insert((3, i), i + 1, body(100));
        }
        let one = 100 + CACHED_ENTRY_OVERHEAD;
        c.evict(2 * one, 5);
        assert_eq!(c.bytes(), 2 * one);
        assert!(c.get(&(3, 2)).is_none());
        assert!(c.get(&(3, 3)).is_some() && c.get(&(3, 4)).is_some());
        assert_accounted(&c);
    }

    #[test]
    fn eviction_never_drops_an_entry_above_the_durable_lsn() {
        // Nothing durable: the cache stays over its bound and keeps all.
        let mut c = WriteCache::default();
        for i in 0..4 {
            c.insert((1, i), i + 1, body(50));
        }
        c.evict(0, 0);
        assert_eq!(c.fifo.len(), 4);
        // Two durable: only they go, even with a bound of zero.
        c.evict(0, 2);
        assert!(c.get(&(1, 1)).is_none());
        assert!(c.get(&(1, 2)).is_some());
        assert_eq!(c.bytes(), 2 * (50 + CACHED_ENTRY_OVERHEAD));
        assert_accounted(&c);
        c.evict(0, 4);
        assert_eq!(c.bytes(), 0);
        assert_accounted(&c);
    }

    #[test]
    fn within_the_bound_nothing_is_evicted() {
        let mut c = WriteCache::default();
        c.insert((1, 0), 1, body(5));
        c.evict(usize::MAX, 1);
        assert!(c.get(&(1, 0)).is_some());
        assert_accounted(&c);
    }

    /// `bytes` is the sum of the charges of the entries present.
    fn assert_read_accounted(c: &ReadCache) {
        let sum: usize = c.entries.values().map(charge).sum();
        assert_eq!(c.bytes, sum);
        assert_eq!(c.fifo.len(), c.entries.len());
    }

    #[test]
    fn a_put_stays_within_the_bound_by_dropping_the_oldest() {
        let one = 10 + CACHED_ENTRY_OVERHEAD;
        let mut c = ReadCache::default();
        for i in 0..5 {
            c.put((1, i), body(10), 3 * one);
            assert!(c.bytes <= 3 * one);
            assert_read_accounted(&c);
        }
        assert!(c.get(&(1, 1)).is_none());
        assert!((2..5).all(|i| c.get(&(1, i)).is_some()));
    }

    #[test]
    fn a_body_over_the_bound_or_a_key_held_is_not_kept() {
        let mut c = ReadCache::default();
        c.put((1, 0), body(10), CACHED_ENTRY_OVERHEAD + 9);
        assert!(c.get(&(1, 0)).is_none());
        assert_eq!(c.bytes, 0);
        c.put((1, 0), body(10), 1 << 20);
        c.put((1, 0), body(20), 1 << 20);
        assert_eq!(c.get(&(1, 0)).map(Bytes::len), Some(10));
        assert_read_accounted(&c);
    }

    #[test]
    fn a_smaller_bound_on_a_later_put_shrinks_the_cache() {
        let mut c = ReadCache::default();
        for i in 0..4 {
            c.put((2, i), body(100), 1 << 20);
        }
        c.put((2, 9), body(0), CACHED_ENTRY_OVERHEAD);
        assert_eq!(c.bytes, CACHED_ENTRY_OVERHEAD);
        assert!(c.get(&(2, 9)).is_some());
        assert_read_accounted(&c);
    }
}
