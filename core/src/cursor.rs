//! A subscription's cursor: which entries of the topic's ledger are acknowledged.
//!
//! `ack_floor` is the number of leading entries all acknowledged (Pulsar's
//! mark-delete position is `ack_floor - 1`); `acked` holds the individually
//! acknowledged entries above it (the "ack holes" are the gaps). Owned by the
//! topic's shard; never crosses cores.

use std::collections::BTreeSet;

/// Most individually-acked ranges written to disk per cursor. Past this, the
/// newest ranges are not persisted and those messages may be redelivered after
/// a restart (bounded, like Pulsar's `managedLedgerMaxUnackedRangesToPersist`).
pub const ACKED_RANGES_PERSISTED_MAX: usize = 10_000;

const CURSOR_FORMAT_VERSION: u8 = 1;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Cursor {
    pub ledger: u64,
    pub ack_floor: u64,
    pub acked: BTreeSet<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cursor record: {0}")]
pub struct CursorDecodeError(pub &'static str);

impl Cursor {
    pub fn new(ledger: u64, ack_floor: u64) -> Self {
        Self { ledger, ack_floor, acked: BTreeSet::new() }
    }

    pub fn is_acked(&self, entry: u64) -> bool {
        entry < self.ack_floor || self.acked.contains(&entry)
    }

    /// Acknowledges one entry. Returns whether anything changed.
    pub fn ack(&mut self, entry: u64) -> bool {
        if self.is_acked(entry) {
            return false;
        }
        self.acked.insert(entry);
        self.compact();
        true
    }

    /// Acknowledges every entry up to and including `entry`.
    pub fn ack_cumulative(&mut self, entry: u64) -> bool {
        let floor = entry.saturating_add(1);
        if floor <= self.ack_floor {
            return false;
        }
        self.ack_floor = floor;
        self.acked = self.acked.split_off(&floor);
        self.compact();
        true
    }

    fn compact(&mut self) {
        while self.acked.remove(&self.ack_floor) {
            self.ack_floor += 1;
        }
    }

    /// Individually acked entries as inclusive ranges, ascending.
    pub fn acked_ranges(&self) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &e in &self.acked {
            match out.last_mut() {
                Some((_, end)) if *end + 1 == e => *end = e,
                _ => out.push((e, e)),
            }
        }
        out
    }

    /// Layout (little-endian): `u8 version=1, u64 ledger, u64 ack_floor,
    /// u32 range_count, range_count × (u64 first, u64 last)`.
    pub fn encode(&self) -> Vec<u8> {
        let ranges = self.acked_ranges();
        let n = ranges.len().min(ACKED_RANGES_PERSISTED_MAX);
        let mut out = Vec::with_capacity(21 + n * 16);
        out.push(CURSOR_FORMAT_VERSION);
        out.extend_from_slice(&self.ledger.to_le_bytes());
        out.extend_from_slice(&self.ack_floor.to_le_bytes());
        out.extend_from_slice(&(n as u32).to_le_bytes());
        for (a, b) in &ranges[..n] {
            out.extend_from_slice(&a.to_le_bytes());
            out.extend_from_slice(&b.to_le_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, CursorDecodeError> {
        let mut r = Reader { b: bytes };
        if r.u8()? != CURSOR_FORMAT_VERSION {
            return Err(CursorDecodeError("unknown version"));
        }
        let ledger = r.u64()?;
        let ack_floor = r.u64()?;
        let n = r.u32()? as usize;
        if n > ACKED_RANGES_PERSISTED_MAX {
            return Err(CursorDecodeError("too many ranges"));
        }
        let mut c = Cursor::new(ledger, ack_floor);
        for _ in 0..n {
            let (a, b) = (r.u64()?, r.u64()?);
            if a > b || a < ack_floor || b - a > 100_000_000 {
                return Err(CursorDecodeError("bad range"));
            }
            c.acked.extend(a..=b);
        }
        if !r.b.is_empty() {
            return Err(CursorDecodeError("trailing bytes"));
        }
        c.compact();
        Ok(c)
    }
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
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn individual_acks_fill_holes() {
        let mut c = Cursor::new(7, 0);
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

    #[test]
    fn cumulative_ack_drops_lower_holes() {
        let mut c = Cursor::new(7, 0);
        c.ack(5);
        c.ack(9);
        assert!(c.ack_cumulative(5));
        assert_eq!(c.ack_floor, 6);
        assert_eq!(c.acked.iter().copied().collect::<Vec<_>>(), vec![9]);
        assert!(!c.ack_cumulative(3));
    }

    #[test]
    fn encode_round_trips_and_rejects_garbage() {
        let mut c = Cursor::new(1024, 10);
        for e in [12, 13, 14, 20] {
            c.ack(e);
        }
        let bytes = c.encode();
        assert_eq!(Cursor::decode(&bytes).unwrap(), c);
        for cut in 0..bytes.len() {
            assert!(Cursor::decode(&bytes[..cut]).is_err());
        }
        let mut bad = bytes.clone();
        bad[0] = 9;
        assert!(Cursor::decode(&bad).is_err());
    }
}
