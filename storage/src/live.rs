//! Segment liveness: how many live (not deleted) entries each segment holds,
//! and their record bytes. A segment at zero that ends at or before the
//! checkpoint position is garbage; compaction picks the segments whose live
//! bytes are a small share of their length.
//! Owned by the log's shard (inside `State`). No I/O.

use std::collections::BTreeMap;

/// One segment's live entries and their record bytes (header and body).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Live {
    pub entries: u64,
    pub bytes: u64,
}

/// Live entries per segment, by the segment's start position.
///
/// Invariant: a segment's `entries` is the number of live entries whose
/// current record (the compaction copy where there is one) lies in it, and
/// its `bytes` the sum of those records' lengths; every record has a header,
/// so `bytes` is zero exactly when `entries` is. Counting an entry out that
/// was never counted in, or twice, breaks it, and would let garbage
/// collection remove a segment that still holds live data: asserted.
#[derive(Default)]
pub(crate) struct SegLive {
    by_start: BTreeMap<u64, Live>,
}

impl SegLive {
    /// Counts `entries` live entries of `bytes` record bytes in all into the
    /// segment starting at `start`.
    pub fn add(&mut self, start: u64, entries: u64, bytes: u64) {
        assert!(entries > 0 && bytes >= entries, "segment {start}: {entries} entries of {bytes} bytes counted in");
        let l = self.by_start.entry(start).or_default();
        l.entries += entries;
        l.bytes += bytes;
    }

    /// Counts one live entry of `bytes` record bytes out of the segment
    /// starting at `start` (deleted, or moved by compaction).
    pub fn remove(&mut self, start: u64, bytes: u64) {
        let l = self.by_start.get_mut(&start);
        let l = l.unwrap_or_else(|| panic!("segment {start}: an entry counted out of a segment with none live"));
        assert!(
            l.entries >= 1 && l.bytes >= bytes,
            "segment {start}: an entry of {bytes} bytes counted out of {} live entries of {} bytes",
            l.entries,
            l.bytes
        );
        l.entries -= 1;
        l.bytes -= bytes;
        assert_eq!(l.entries == 0, l.bytes == 0, "segment {start}: {l:?}");
    }

    /// The segment starting at `start` (zero for one with no live entry).
    pub fn get(&self, start: u64) -> Live {
        self.by_start.get(&start).copied().unwrap_or_default()
    }

    /// Forgets the segment starting at `start`, which is being removed: it
    /// must hold no live entry.
    pub fn forget(&mut self, start: u64) {
        if let Some(l) = self.by_start.remove(&start) {
            assert_eq!(l, Live::default(), "segment {start} removed with live entries");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_in_and_out() {
        let mut s = SegLive::default();
        assert_eq!(s.get(0), Live::default());
        s.add(0, 2, 100);
        s.add(0, 1, 40);
        s.add(4096, 1, 10);
        assert_eq!(s.get(0), Live { entries: 3, bytes: 140 });
        s.remove(0, 40);
        s.remove(0, 60);
        assert_eq!(s.get(0), Live { entries: 1, bytes: 40 });
        s.remove(0, 40);
        assert_eq!(s.get(0), Live::default());
        s.forget(0);
        assert_eq!(s.get(4096), Live { entries: 1, bytes: 10 });
    }

    #[test]
    #[should_panic(expected = "none live")]
    fn counting_out_of_an_unknown_segment_is_a_bug() {
        SegLive::default().remove(0, 10);
    }

    #[test]
    #[should_panic(expected = "counted out of 0 live entries")]
    fn counting_out_twice_is_a_bug() {
        let mut s = SegLive::default();
        s.add(0, 1, 10);
        s.remove(0, 10);
        s.remove(0, 10);
    }

    #[test]
    #[should_panic(expected = "counted out of 1 live entries of 10 bytes")]
    fn counting_out_more_bytes_than_live_is_a_bug() {
        let mut s = SegLive::default();
        s.add(0, 1, 10);
        s.remove(0, 11);
    }

    #[test]
    #[should_panic(expected = "removed with live entries")]
    fn removing_a_live_segment_is_a_bug() {
        let mut s = SegLive::default();
        s.add(0, 1, 10);
        s.forget(0);
    }
}
