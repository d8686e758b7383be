//! A subscription's cursor: which of the topic's entries are acknowledged.
//!
//! In memory the cursor counts in topic positions (see `ledgers.rs`):
//! `ack_floor` is the first position not acknowledged (Pulsar's mark-delete
//! position is the one before it), and `acked` holds the individually
//! acknowledged positions above it (the "ack holes" are the gaps), as an
//! [`AckSet`] whose memory follows fragmentation, not position count. On disk
//! (the `c/<topic>\n<subscription>` record) it names `(ledger, entry)`
//! pairs, so a record stays true whatever happens to positions: version 2
//! keeps the mark-delete position as `(ledger, entry)` and the acknowledged
//! ranges per ledger; version 1 (one ledger's entries) is still read.
//! Layouts in `docs/format.md`. Owned by the topic's shard; never crosses
//! cores.

pub use crate::subscription::ack_set::AckSet;
use crate::topic::ledgers::{Lookup, TopicLedgers};

/// Most individually-acked ranges written to disk per cursor. Past this, the
/// newest ranges are not persisted and those messages may be redelivered after
/// a restart (bounded, like Pulsar's `managedLedgerMaxUnackedRangesToPersist`).
pub const ACKED_RANGES_PERSISTED_MAX: usize = 10_000;
/// Largest single acknowledged range a record may carry (decoding expands
/// ranges into an [`AckSet`], where a range costs at most three entries;
/// the bound keeps a damaged record's claims plausible).
const ACKED_RANGE_ENTRIES_MAX: u64 = 100_000_000;

const CURSOR_RECORD_V1: u8 = 1;
const CURSOR_RECORD_V2: u8 = 2;

/// A cursor in topic positions.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    pub ack_floor: u64,
    pub acked: AckSet,
}

/// A cursor as recorded: `(ledger, entry)` pairs, independent of positions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CursorRecord {
    /// Ledger of the mark-delete position.
    pub mark_delete_ledger: u64,
    /// Last entry of `mark_delete_ledger` such that it and everything before
    /// it is acknowledged; -1: none of that ledger (everything before it is).
    pub mark_delete_entry: i64,
    /// Individually acknowledged entries above the mark-delete position:
    /// per ledger (ascending), inclusive entry ranges (ascending, disjoint).
    pub acked: Vec<(u64, Vec<(u64, u64)>)>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cursor record: {0}")]
pub struct CursorDecodeError(pub &'static str);

impl Cursor {
    pub fn new(ack_floor: u64) -> Self {
        Self { ack_floor, acked: AckSet::new() }
    }

    pub fn is_acked(&self, pos: u64) -> bool {
        pos < self.ack_floor || self.acked.contains(pos)
    }

    /// Acknowledges one position. Returns whether anything changed.
    pub fn ack(&mut self, pos: u64) -> bool {
        if self.is_acked(pos) {
            return false;
        }
        if pos == self.ack_floor {
            // In order (a consumer acknowledging what it received): the
            // floor moves, and the set is touched only if it holds
            // something. Inserting the position and compacting it away
            // would allocate and free a bitmap block and split the set's map
            // on every ack.
            self.ack_floor = pos + 1;
            if !self.acked.is_empty() {
                self.compact();
            }
            return true;
        }
        self.acked.insert(pos);
        self.compact();
        true
    }

    /// Acknowledges every position up to and including `pos`.
    pub fn ack_cumulative(&mut self, pos: u64) -> bool {
        let floor = pos.saturating_add(1);
        if floor <= self.ack_floor {
            return false;
        }
        self.ack_floor = floor;
        self.acked.remove_below(floor);
        self.compact();
        true
    }

    /// Moves the floor past acknowledged positions just above it.
    fn compact(&mut self) {
        let floor = self.acked.first_absent_from(self.ack_floor);
        if floor != self.ack_floor {
            self.ack_floor = floor;
            self.acked.remove_below(floor);
        }
    }

    /// Individually acked positions as inclusive ranges, ascending; at most
    /// `max` (the lowest).
    pub fn acked_ranges(&self, max: usize) -> Vec<(u64, u64)> {
        self.acked.ranges(max)
    }

    /// The record of this cursor over `ledgers`. Positions not stored (below
    /// the first ledger) are simply acknowledged; at most
    /// [`ACKED_RANGES_PERSISTED_MAX`] ranges are kept (the newest go).
    pub fn to_record(&self, ledgers: &TopicLedgers) -> CursorRecord {
        let (mark_delete_ledger, mark_delete_entry) = match self.ack_floor.checked_sub(1).map(|p| ledgers.locate(p)) {
            Some(Some((l, e))) => (l, e as i64),
            // Nothing stored is acknowledged (or the floor is past the
            // end): "before entry 0" of the ledger holding the floor.
            _ => match ledgers.locate(self.ack_floor) {
                Some((l, e)) => (l, e as i64 - 1),
                None if self.ack_floor >= ledgers.next() && self.ack_floor > 0 => {
                    let cur = ledgers.current();
                    (cur.id, (self.ack_floor - cur.first) as i64 - 1)
                }
                None => (ledgers.all()[0].id, -1),
            },
        };
        let mut acked: Vec<(u64, Vec<(u64, u64)>)> = Vec::new();
        let mut count = 0usize;
        // Each range yields at least one persisted range, so the lowest
        // ACKED_RANGES_PERSISTED_MAX are all that can be kept.
        'ranges: for (a, b) in self.acked_ranges(ACKED_RANGES_PERSISTED_MAX) {
            // Split the range at ledger boundaries.
            let mut pos = a;
            while pos <= b {
                if count >= ACKED_RANGES_PERSISTED_MAX {
                    break 'ranges;
                }
                let (Some((l, e)), Some(ledger_end)) = (ledgers.locate(pos), ledgers.ledger_end(pos)) else { break };
                let last = b.min(ledger_end.saturating_sub(1));
                match acked.last_mut() {
                    Some((ledger, ranges)) if *ledger == l => ranges.push((e, e + (last - pos))),
                    _ => acked.push((l, vec![(e, e + (last - pos))])),
                }
                count += 1;
                pos = last + 1;
            }
        }
        CursorRecord { mark_delete_ledger, mark_delete_entry, acked }
    }

    /// The cursor a record describes over `ledgers`. A mark-delete position
    /// in a ledger retention deleted means everything stored is still to be
    /// acknowledged; acknowledged ranges in deleted ledgers are dropped.
    /// An unknown mark-delete ledger is an error (a record of another topic).
    pub fn from_record(rec: &CursorRecord, ledgers: &TopicLedgers) -> Result<Cursor, CursorDecodeError> {
        let floor = match ledgers.lookup(rec.mark_delete_ledger, 0) {
            Lookup::At(first) => first.saturating_add_signed(rec.mark_delete_entry.saturating_add(1)),
            Lookup::Trimmed => ledgers.start(),
            Lookup::Unknown => return Err(CursorDecodeError("mark-delete ledger is not a ledger of this topic")),
        };
        let mut c = Cursor::new(floor.clamp(ledgers.start(), ledgers.next()));
        for (ledger, ranges) in &rec.acked {
            let Lookup::At(first) = ledgers.lookup(*ledger, 0) else { continue };
            for &(a, b) in ranges {
                let (a, b) = (first.saturating_add(a).max(c.ack_floor), first.saturating_add(b));
                if a <= b {
                    c.acked.insert_range(a, b);
                }
            }
        }
        c.compact();
        Ok(c)
    }
}

impl CursorRecord {
    /// Version 2, little-endian: `u8 2, u64 mark_delete_ledger,
    /// i64 mark_delete_entry, u32 ledger_count, ledger_count × (u64 ledger,
    /// u32 range_count, range_count × (u64 first, u64 last))`.
    pub fn encode(&self) -> Vec<u8> {
        let ranges: usize = self.acked.iter().map(|(_, r)| r.len()).sum();
        let mut out = Vec::with_capacity(21 + self.acked.len() * 12 + ranges * 16);
        out.push(CURSOR_RECORD_V2);
        out.extend_from_slice(&self.mark_delete_ledger.to_le_bytes());
        out.extend_from_slice(&self.mark_delete_entry.to_le_bytes());
        out.extend_from_slice(&(self.acked.len() as u32).to_le_bytes());
        for (ledger, ranges) in &self.acked {
            out.extend_from_slice(&ledger.to_le_bytes());
            out.extend_from_slice(&(ranges.len() as u32).to_le_bytes());
            for (a, b) in ranges {
                out.extend_from_slice(&a.to_le_bytes());
                out.extend_from_slice(&b.to_le_bytes());
            }
        }
        out
    }

    /// Decodes version 2, or version 1 (`u8 1, u64 ledger, u64 ack_floor,
    /// u32 range_count, range_count × (u64 first, u64 last)`: one ledger's
    /// entries), checking every count, order and bound.
    pub fn decode(bytes: &[u8]) -> Result<Self, CursorDecodeError> {
        let mut r = Reader { b: bytes };
        let rec = match r.u8()? {
            CURSOR_RECORD_V1 => {
                let ledger = r.u64()?;
                let ack_floor = r.u64()?;
                let floor = i64::try_from(ack_floor).map_err(|_| CursorDecodeError("ack floor out of range"))?;
                let ranges = read_ranges(&mut r, ACKED_RANGES_PERSISTED_MAX)?;
                if ranges.first().is_some_and(|(a, _)| *a < ack_floor) {
                    return Err(CursorDecodeError("bad range"));
                }
                let acked = if ranges.is_empty() { Vec::new() } else { vec![(ledger, ranges)] };
                CursorRecord { mark_delete_ledger: ledger, mark_delete_entry: floor - 1, acked }
            }
            CURSOR_RECORD_V2 => {
                let mark_delete_ledger = r.u64()?;
                let mark_delete_entry = r.i64()?;
                if mark_delete_entry < -1 {
                    return Err(CursorDecodeError("mark-delete entry below -1"));
                }
                let n = r.u32()? as usize;
                if n > ACKED_RANGES_PERSISTED_MAX {
                    return Err(CursorDecodeError("too many ledgers"));
                }
                let mut acked: Vec<(u64, Vec<(u64, u64)>)> = Vec::with_capacity(n);
                let mut left = ACKED_RANGES_PERSISTED_MAX;
                for _ in 0..n {
                    let ledger = r.u64()?;
                    if ledger < mark_delete_ledger || acked.last().is_some_and(|(l, _)| *l >= ledger) {
                        return Err(CursorDecodeError("ledgers out of order"));
                    }
                    let ranges = read_ranges(&mut r, left)?;
                    left -= ranges.len();
                    // Compared wide: an entry above i64::MAX (which a version 1
                    // record may hold) is above any mark, not below it.
                    let above_mark = |(a, _): &(u64, u64)| {
                        ledger > mark_delete_ledger || i128::from(*a) > i128::from(mark_delete_entry)
                    };
                    if ranges.is_empty() || !ranges.first().is_some_and(above_mark) {
                        return Err(CursorDecodeError("bad range"));
                    }
                    acked.push((ledger, ranges));
                }
                CursorRecord { mark_delete_ledger, mark_delete_entry, acked }
            }
            _ => return Err(CursorDecodeError("unknown version")),
        };
        if !r.b.is_empty() {
            return Err(CursorDecodeError("trailing bytes"));
        }
        Ok(rec)
    }
}

/// `u32 count, count × (u64 first, u64 last)`: ascending, disjoint, each at
/// most [`ACKED_RANGE_ENTRIES_MAX`] long, at most `max` of them.
fn read_ranges(r: &mut Reader<'_>, max: usize) -> Result<Vec<(u64, u64)>, CursorDecodeError> {
    let n = r.u32()? as usize;
    if n > max {
        return Err(CursorDecodeError("too many ranges"));
    }
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(n);
    for _ in 0..n {
        let (a, b) = (r.u64()?, r.u64()?);
        if a > b || b - a > ACKED_RANGE_ENTRIES_MAX || out.last().is_some_and(|(_, pb)| *pb >= a) {
            return Err(CursorDecodeError("bad range"));
        }
        out.push((a, b));
    }
    Ok(out)
}

struct Reader<'a> {
    b: &'a [u8],
}

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N], CursorDecodeError> {
        let (head, rest) = self.b.split_at_checked(N).ok_or(CursorDecodeError("truncated"))?;
        self.b = rest;
        let mut a = [0u8; N];
        a.copy_from_slice(head);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, CursorDecodeError> {
        Ok(self.take::<1>()?[0])
    }
    fn u32(&mut self) -> Result<u32, CursorDecodeError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, CursorDecodeError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
    fn i64(&mut self) -> Result<i64, CursorDecodeError> {
        Ok(i64::from_le_bytes(self.take()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::topic::ledgers::LedgerInfo;

    /// Found by the `core_cursor` fuzz target: a version 1 record with a
    /// range above i64::MAX decoded, but its version 2 encoding did not (the
    /// check against the mark compared the entry cast to i64, negative).
    #[test]
    fn a_v1_record_with_entries_above_i64_max_round_trips() {
        let mut v1 = vec![CURSOR_RECORD_V1];
        v1.extend_from_slice(&7u64.to_le_bytes());
        v1.extend_from_slice(&5u64.to_le_bytes());
        v1.extend_from_slice(&1u32.to_le_bytes());
        let a = u64::MAX - 1000;
        v1.extend_from_slice(&a.to_le_bytes());
        v1.extend_from_slice(&(a + 10).to_le_bytes());
        let rec = CursorRecord::decode(&v1).expect("a valid version 1 record");
        assert_eq!(rec.acked, vec![(7, vec![(a, a + 10)])]);
        assert_eq!(CursorRecord::decode(&rec.encode()), Ok(rec));
    }

    fn ledgers() -> TopicLedgers {
        let l = |id, first, entries| LedgerInfo { id, first, entries, bytes: 0, created_ms: 0, closed_ms: 0 };
        TopicLedgers::new(vec![l(1024, 0, 10), l(2048, 10, 10), l(3072, 20, 5)])
    }

    #[test]
    fn individual_acks_fill_holes() {
        let mut c = Cursor::new(0);
        assert!(c.ack(1));
        assert!(c.ack(3));
        assert_eq!(c.ack_floor, 0);
        assert!(c.ack(0));
        assert_eq!(c.ack_floor, 2);
        assert!(c.is_acked(3) && !c.is_acked(2));
        assert!(!c.ack(1));
        assert!(c.ack(2));
        assert_eq!(c.ack_floor, 4);
        assert!(c.acked.is_empty());
    }

    /// Goal: random acks, mostly in order (the fast path) with holes and
    /// cumulative acks mixed in, leave the cursor acknowledging exactly
    /// what a plain set model does, with the floor at its first gap.
    #[test]
    fn random_acks_match_a_set_model() {
        let seed = crate::test_seed("random_acks_match_a_set_model");
        let mut rng = magnetar_storage::sim::SimRng::new(seed);
        let mut next = move |n: u64| rng.below(n);
        for _ in 0..20 {
            let mut c = Cursor::new(0);
            let mut model = std::collections::BTreeSet::new();
            let mut floor = 0u64;
            let mut in_order = 0u64;
            for _ in 0..1000 {
                match next(10) {
                    0..=6 => {
                        in_order += 1;
                        let pos = in_order - 1;
                        assert_eq!(c.ack(pos), model.insert(pos), "seed {seed}: ack {pos}");
                    }
                    7 | 8 => {
                        let pos = next(1500);
                        assert_eq!(c.ack(pos), model.insert(pos), "seed {seed}: ack {pos}");
                    }
                    _ => {
                        let pos = next(1500);
                        // It changes the cursor iff it moves the floor.
                        assert_eq!(c.ack_cumulative(pos), pos + 1 > floor, "seed {seed}: cumulative {pos}");
                        model.extend(floor..=pos);
                    }
                }
                while model.contains(&floor) {
                    floor += 1;
                }
                assert_eq!(c.ack_floor, floor, "seed {seed}");
                for p in floor..floor + 16 {
                    assert_eq!(c.is_acked(p), model.contains(&p), "seed {seed}: position {p}");
                }
            }
        }
    }

    #[test]
    fn cumulative_ack_drops_lower_holes() {
        let mut c = Cursor::new(0);
        c.ack(5);
        c.ack(9);
        assert!(c.ack_cumulative(5));
        assert_eq!(c.ack_floor, 6);
        assert_eq!(c.acked_ranges(usize::MAX), vec![(9, 9)]);
        assert!(!c.ack_cumulative(3));
    }

    #[test]
    fn v2_round_trips_across_ledgers_and_rejects_garbage() {
        let ls = ledgers();
        let mut c = Cursor::new(7);
        // A range spanning the 1024/2048 boundary, one in the current ledger.
        for p in [8, 9, 10, 11, 15, 22, 23] {
            c.ack(p);
        }
        let rec = c.to_record(&ls);
        assert_eq!(
            rec,
            CursorRecord {
                mark_delete_ledger: 1024,
                mark_delete_entry: 6,
                acked: vec![(1024, vec![(8, 9)]), (2048, vec![(0, 1), (5, 5)]), (3072, vec![(2, 3)])],
            }
        );
        let bytes = rec.encode();
        assert_eq!(bytes[0], 2);
        assert_eq!(CursorRecord::decode(&bytes).unwrap(), rec);
        assert_eq!(Cursor::from_record(&rec, &ls).unwrap(), c);
        for cut in 0..bytes.len() {
            assert!(CursorRecord::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = bytes.clone();
        bad[0] = 9;
        assert!(CursorRecord::decode(&bad).is_err());
        let mut unordered = rec.clone();
        unordered.acked.swap(0, 1);
        assert!(CursorRecord::decode(&unordered.encode()).is_err());
        let mut below_mark = rec.clone();
        below_mark.acked[0].1[0] = (3, 4);
        assert!(CursorRecord::decode(&below_mark.encode()).is_err());
    }

    #[test]
    fn mark_delete_at_edges() {
        let ls = ledgers();
        // Nothing acknowledged: before entry 0 of the first ledger.
        let rec = Cursor::new(0).to_record(&ls);
        assert_eq!((rec.mark_delete_ledger, rec.mark_delete_entry), (1024, -1));
        assert_eq!(Cursor::from_record(&rec, &ls).unwrap().ack_floor, 0);
        // A whole ledger acknowledged: its last entry.
        let rec = Cursor::new(10).to_record(&ls);
        assert_eq!((rec.mark_delete_ledger, rec.mark_delete_entry), (1024, 9));
        assert_eq!(Cursor::from_record(&rec, &ls).unwrap().ack_floor, 10);
        // Everything acknowledged.
        let rec = Cursor::new(25).to_record(&ls);
        assert_eq!((rec.mark_delete_ledger, rec.mark_delete_entry), (3072, 4));
        assert_eq!(Cursor::from_record(&rec, &ls).unwrap().ack_floor, 25);
        // After retention deleted the first ledger, a record naming it means
        // "from the first stored entry", and its acked ranges are dropped.
        let mut trimmed = ls.clone();
        trimmed.trim_front(1);
        let old = CursorRecord { mark_delete_ledger: 1024, mark_delete_entry: 3, acked: vec![(1024, vec![(5, 6)])] };
        assert_eq!(Cursor::from_record(&old, &trimmed).unwrap(), Cursor::new(10));
        let rec = Cursor::new(10).to_record(&trimmed);
        assert_eq!((rec.mark_delete_ledger, rec.mark_delete_entry), (2048, -1));
        // A ledger of another topic is refused.
        let other = CursorRecord { mark_delete_ledger: 9999, mark_delete_entry: 0, acked: vec![] };
        assert!(Cursor::from_record(&other, &ls).is_err());
    }

    #[test]
    fn one_hole_under_millions_of_acks_stays_small() {
        // Goal: one unacknowledged entry under millions of acknowledged ones
        // (or of entries a tag filter skipped) costs a few spans, not one
        // element per entry.
        let mut c = Cursor::new(0);
        for p in 1..=3_000_000 {
            assert!(c.ack(p));
        }
        assert_eq!(c.ack_floor, 0);
        assert!(c.acked.span_count() <= 3, "{} spans", c.acked.span_count());
        assert!(c.ack(0));
        assert_eq!(c.ack_floor, 3_000_001);
        assert!(c.acked.is_empty());
    }

    #[test]
    fn largest_record_loads_small() {
        // Goal: the largest record decode accepts (10,000 ranges of 10^8
        // entries) loads in bounded memory; expanded per entry it was
        // 10^12 set elements. Method: build it, load it, count spans.
        let big = TopicLedgers::new(vec![LedgerInfo {
            id: 1024,
            first: 0,
            entries: u64::MAX / 4,
            bytes: 0,
            created_ms: 0,
            closed_ms: 0,
        }]);
        let n = ACKED_RANGES_PERSISTED_MAX as u64;
        let ranges: Vec<(u64, u64)> = (0..n)
            .map(|i| {
                (1 + i * (ACKED_RANGE_ENTRIES_MAX + 2), 1 + i * (ACKED_RANGE_ENTRIES_MAX + 2) + ACKED_RANGE_ENTRIES_MAX)
            })
            .collect();
        let rec = CursorRecord { mark_delete_ledger: 1024, mark_delete_entry: -1, acked: vec![(1024, ranges)] };
        let rec = CursorRecord::decode(&rec.encode()).unwrap();
        let c = Cursor::from_record(&rec, &big).unwrap();
        assert_eq!(c.ack_floor, 0);
        assert!(c.acked.span_count() <= 3 * ACKED_RANGES_PERSISTED_MAX, "{} spans", c.acked.span_count());
        assert!(c.acked.heap_bytes() < 16 << 20, "{} bytes", c.acked.heap_bytes());
        // And it writes back the same ranges.
        assert_eq!(c.to_record(&big), rec);
    }

    #[test]
    fn v1_records_still_decode() {
        // v1: u8 1, u64 ledger, u64 ack_floor, u32 n, n × (u64, u64).
        let mut v1 = vec![1u8];
        v1.extend_from_slice(&1024u64.to_le_bytes());
        v1.extend_from_slice(&3u64.to_le_bytes());
        v1.extend_from_slice(&1u32.to_le_bytes());
        v1.extend_from_slice(&5u64.to_le_bytes());
        v1.extend_from_slice(&6u64.to_le_bytes());
        let rec = CursorRecord::decode(&v1).unwrap();
        assert_eq!(
            rec,
            CursorRecord { mark_delete_ledger: 1024, mark_delete_entry: 2, acked: vec![(1024, vec![(5, 6)])] }
        );
        // Over a v1 topic (one ledger at position 0) positions are entries.
        let one = TopicLedgers::new(vec![LedgerInfo {
            id: 1024,
            first: 0,
            entries: 10,
            bytes: 0,
            created_ms: 0,
            closed_ms: 0,
        }]);
        let c = Cursor::from_record(&rec, &one).unwrap();
        assert_eq!((c.ack_floor, c.acked_ranges(usize::MAX)), (3, vec![(5, 6)]));
        // A range below the v1 floor is damage.
        let mut bad = v1.clone();
        bad[9..17].copy_from_slice(&6u64.to_le_bytes());
        assert!(CursorRecord::decode(&bad).is_err());
        for cut in 0..v1.len() {
            assert!(CursorRecord::decode(&v1[..cut]).is_err());
        }
    }
}
