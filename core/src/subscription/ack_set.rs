//! A set of acknowledged positions whose memory grows with how fragmented it
//! is, not with how many positions it holds.
//!
//! A `BTreeSet<u64>` of individually acknowledged positions costs tens of
//! bytes per position: one unacknowledged message followed by millions of
//! acks (or a tag filter skipping millions of entries, which count as
//! acknowledged) grows it without bound, and expanding a persisted record
//! (up to 10,000 ranges of up to 10^8 entries) into it costs gigabytes.
//!
//! Here positions are grouped in blocks of [`BLOCK_BITS`]: a run of wholly
//! acknowledged blocks is one map entry however long (`Full`), a partly
//! acknowledged block is a fixed bitmap (`Bits`, 128 bytes), an untouched
//! block costs nothing. So a range of any length costs at most three
//! entries, and the worst pattern (every other position) costs about 1.3
//! bits per position. Like Pulsar's `ConcurrentOpenLongPairRangeSet`, which
//! keeps a bitset per ledger for the same reason.
//!
//! The representation is canonical (a `Bits` block is never empty nor full;
//! adjacent `Full` runs are merged), so derived equality is set equality.
//! Owned by the topic's shard (inside a `Cursor`); never crosses cores.

use std::collections::BTreeMap;

/// Positions per block.
pub const BLOCK_BITS: u64 = 1024;
const WORDS: usize = (BLOCK_BITS / 64) as usize;
const _: () = assert!(BLOCK_BITS.is_power_of_two() && BLOCK_BITS.is_multiple_of(64));

#[derive(Debug, Clone, PartialEq, Eq)]
enum Span {
    /// Every position of blocks `key..=end` is in the set.
    Full(u64),
    /// Some (not all, not none) positions of block `key`.
    Bits(Box<[u64; WORDS]>),
}

/// A set of `u64` positions. See the module documentation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AckSet {
    /// Block index → span starting at that block; spans are disjoint.
    spans: BTreeMap<u64, Span>,
}

fn block(p: u64) -> u64 {
    p / BLOCK_BITS
}

fn bit(p: u64) -> (usize, u64) {
    let off = p % BLOCK_BITS;
    ((off / 64) as usize, 1u64 << (off % 64))
}

/// A mask of bits `lo..=hi` (offsets within a block) for word `w`.
fn word_mask(w: usize, lo: u64, hi: u64) -> u64 {
    let (wlo, whi) = (w as u64 * 64, w as u64 * 64 + 63);
    if hi < wlo || lo > whi {
        return 0;
    }
    let (a, b) = (lo.max(wlo) - wlo, hi.min(whi) - wlo);
    let upper = if b == 63 { u64::MAX } else { (1u64 << (b + 1)) - 1 };
    upper & !((1u64 << a) - 1)
}

fn is_full(w: &[u64; WORDS]) -> bool {
    w.iter().all(|&x| x == u64::MAX)
}

fn is_empty(w: &[u64; WORDS]) -> bool {
    w.iter().all(|&x| x == 0)
}

impl AckSet {
    pub fn new() -> Self {
        Self::default()
    }

    pub fn is_empty(&self) -> bool {
        self.spans.is_empty()
    }

    pub fn clear(&mut self) {
        self.spans.clear();
    }

    /// Map entries held (each a `Full` run or a 128-byte bitmap): what the
    /// memory bound is stated in.
    pub fn span_count(&self) -> usize {
        self.spans.len()
    }

    /// Approximate heap bytes: per entry its key, value and B-tree node
    /// share, plus the bitmap of a `Bits` block.
    pub fn heap_bytes(&self) -> usize {
        let bitmaps = self.spans.values().filter(|s| matches!(s, Span::Bits(_))).count();
        self.spans.len() * 48 + bitmaps * WORDS * 8
    }

    /// The span covering block `b`, as (start block, span).
    fn span_at(&self, b: u64) -> Option<(u64, &Span)> {
        let (&k, s) = self.spans.range(..=b).next_back()?;
        match s {
            Span::Full(end) if b <= *end => Some((k, s)),
            Span::Bits(_) if k == b => Some((k, s)),
            _ => None,
        }
    }

    pub fn contains(&self, p: u64) -> bool {
        match self.span_at(block(p)) {
            Some((_, Span::Full(_))) => true,
            Some((_, Span::Bits(w))) => {
                let (i, m) = bit(p);
                w[i] & m != 0
            }
            None => false,
        }
    }

    /// Adds `p`. Returns whether it was absent.
    pub fn insert(&mut self, p: u64) -> bool {
        // Fast path: a bit in an existing partial block that does not fill
        // it (the common case under fragmented acks).
        let (i, m) = bit(p);
        if let Some(Span::Bits(w)) = self.spans.get_mut(&block(p)) {
            if w[i] & m != 0 {
                return false;
            }
            if w[i] | m != u64::MAX {
                w[i] |= m;
                return true;
            }
        }
        if self.contains(p) {
            return false;
        }
        self.insert_range(p, p);
        true
    }

    /// Adds every position of `a..=b`.
    pub fn insert_range(&mut self, a: u64, b: u64) {
        assert!(a <= b, "insert_range({a}, {b})");
        let (ba, bb) = (block(a), block(b));
        if ba == bb {
            self.set_bits(ba, a % BLOCK_BITS, b % BLOCK_BITS);
            return;
        }
        self.set_bits(ba, a % BLOCK_BITS, BLOCK_BITS - 1);
        if ba + 1 < bb {
            self.insert_full(ba + 1, bb - 1);
        }
        self.set_bits(bb, 0, b % BLOCK_BITS);
    }

    /// Sets offsets `lo..=hi` of block `b`; a block that becomes full joins
    /// its neighbouring runs.
    fn set_bits(&mut self, b: u64, lo: u64, hi: u64) {
        if matches!(self.span_at(b), Some((_, Span::Full(_)))) {
            return;
        }
        let mut words = match self.spans.remove(&b) {
            Some(Span::Bits(w)) => w,
            Some(Span::Full(_)) => unreachable!("checked above"),
            None => Box::new([0u64; WORDS]),
        };
        for (i, w) in words.iter_mut().enumerate() {
            *w |= word_mask(i, lo, hi);
        }
        if is_full(&words) {
            self.insert_full(b, b);
        } else {
            self.spans.insert(b, Span::Bits(words));
        }
    }

    /// Makes blocks `b0..=b1` one `Full` run, absorbing whatever they held
    /// and merging with an adjacent run on either side.
    fn insert_full(&mut self, b0: u64, b1: u64) {
        let (mut start, mut end) = (b0, b1);
        // A run starting before b0 that reaches b0 - 1 or beyond.
        if let Some((&k, Span::Full(e))) = self.spans.range(..b0).next_back() {
            if e.saturating_add(1) >= b0 {
                start = k;
                end = end.max(*e);
            }
        }
        // Everything starting in start..=end is absorbed; a run starting
        // right after it too (a partial block there stays as it is).
        let inside: Vec<u64> = self.spans.range(start..=end).map(|(&k, _)| k).collect();
        for k in inside {
            if let Some(Span::Full(e)) = self.spans.remove(&k) {
                end = end.max(e);
            }
        }
        if let Some(Span::Full(e)) = self.spans.get(&end.saturating_add(1)) {
            let e = *e;
            self.spans.remove(&(end + 1));
            end = e;
        }
        self.spans.insert(start, Span::Full(end));
    }

    /// Removes every position below `floor`.
    pub fn remove_below(&mut self, floor: u64) {
        let fb = block(floor);
        let mut kept = self.spans.split_off(&fb);
        // The span holding `floor`'s block may start before it.
        if let Some((k, Span::Full(end))) = self.spans.pop_last() {
            if end >= fb {
                debug_assert!(k < fb);
                kept.insert(fb, Span::Full(end));
            }
        }
        self.spans = kept;
        let off = floor % BLOCK_BITS;
        if off == 0 {
            return;
        }
        // Clear offsets below `off` of block fb.
        match self.spans.remove(&fb) {
            None => {}
            Some(Span::Bits(mut w)) => {
                for (i, x) in w.iter_mut().enumerate() {
                    *x &= !word_mask(i, 0, off - 1);
                }
                if !is_empty(&w) {
                    self.spans.insert(fb, Span::Bits(w));
                }
            }
            Some(Span::Full(end)) => {
                let mut w = Box::new([u64::MAX; WORDS]);
                for (i, x) in w.iter_mut().enumerate() {
                    *x &= !word_mask(i, 0, off - 1);
                }
                self.spans.insert(fb, Span::Bits(w));
                if end > fb {
                    self.spans.insert(fb + 1, Span::Full(end));
                }
            }
        }
    }

    /// The first position at or after `p` not in the set.
    pub fn first_absent_from(&self, mut p: u64) -> u64 {
        // Each turn moves past one span: bounded by the span count.
        loop {
            match self.span_at(block(p)) {
                None => return p,
                Some((_, Span::Full(end))) => p = (end + 1) * BLOCK_BITS,
                Some((k, Span::Bits(w))) => {
                    for off in p % BLOCK_BITS..BLOCK_BITS {
                        let (i, m) = bit(off);
                        if w[i] & m == 0 {
                            return k * BLOCK_BITS + off;
                        }
                    }
                    p = (k + 1) * BLOCK_BITS;
                }
            }
        }
    }

    /// How many positions of `a..b` (exclusive) are in the set.
    pub fn count_in(&self, a: u64, b: u64) -> u64 {
        if a >= b {
            return 0;
        }
        let (ba, bb) = (block(a), block(b - 1));
        let first = self.span_at(ba).map_or(ba, |(k, _)| k);
        let mut n = 0u64;
        for (&k, s) in self.spans.range(first..=bb) {
            match s {
                Span::Full(end) => {
                    let lo = (k * BLOCK_BITS).max(a);
                    let hi = ((end + 1) * BLOCK_BITS).min(b);
                    n += hi.saturating_sub(lo);
                }
                Span::Bits(w) => {
                    let lo = if k == ba { a % BLOCK_BITS } else { 0 };
                    let hi = if k == bb { (b - 1) % BLOCK_BITS } else { BLOCK_BITS - 1 };
                    n += w
                        .iter()
                        .enumerate()
                        .map(|(i, x)| u64::from((x & word_mask(i, lo, hi)).count_ones()))
                        .sum::<u64>();
                }
            }
        }
        n
    }

    /// The set as inclusive ranges, ascending; at most `max` of them (the
    /// lowest), so a caller that keeps a bounded number pays for no more.
    pub fn ranges(&self, max: usize) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        // Returns false once `max` ranges are complete.
        let push = |out: &mut Vec<(u64, u64)>, a: u64, b: u64| -> bool {
            if let Some((_, end)) = out.last_mut() {
                if *end + 1 == a {
                    *end = b;
                    return true;
                }
            }
            if out.len() == max {
                return false;
            }
            out.push((a, b));
            true
        };
        'spans: for (&k, s) in &self.spans {
            match s {
                Span::Full(end) => {
                    if !push(&mut out, k * BLOCK_BITS, (end + 1) * BLOCK_BITS - 1) {
                        break;
                    }
                }
                Span::Bits(w) => {
                    let mut off = 0;
                    while off < BLOCK_BITS {
                        let (i, m) = bit(off);
                        if w[i] & m == 0 {
                            off += 1;
                            continue;
                        }
                        let start = off;
                        while off < BLOCK_BITS && {
                            let (i, m) = bit(off);
                            w[i] & m != 0
                        } {
                            off += 1;
                        }
                        if !push(&mut out, k * BLOCK_BITS + start, k * BLOCK_BITS + off - 1) {
                            break 'spans;
                        }
                    }
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    #[test]
    fn ranges_cost_at_most_three_spans() {
        let mut s = AckSet::new();
        s.insert_range(5, 100_000_005);
        assert_eq!(s.span_count(), 3);
        assert_eq!(s.count_in(0, u64::MAX), 100_000_001);
        assert_eq!(s.ranges(10), vec![(5, 100_000_005)]);
        assert!(s.contains(5) && s.contains(100_000_005) && !s.contains(4) && !s.contains(100_000_006));
        assert_eq!(s.first_absent_from(5), 100_000_006);
        s.remove_below(50_000_000);
        assert_eq!(s.ranges(10), vec![(50_000_000, 100_000_005)]);
        assert_eq!(s.count_in(0, u64::MAX), 50_000_006);
        // Filling the gaps merges everything into one run.
        s.insert_range(0, 49_999_999);
        s.insert_range(100_000_006, 1024 * 100_000 - 1);
        assert_eq!(s.span_count(), 1);
        assert_eq!(s.ranges(10), vec![(0, 1024 * 100_000 - 1)]);
    }

    #[test]
    fn every_other_of_ten_million_stays_small() {
        // Goal: the worst fragmentation (every other position acked) costs
        // a bitmap's worth, not a tree node per position. 10 M positions:
        // 5 M acks; a BTreeSet<u64> holds ~80 MB for them.
        let mut s = AckSet::new();
        let t = std::time::Instant::now();
        for p in (1..10_000_000u64).step_by(2) {
            assert!(s.insert(p));
        }
        let bytes = s.heap_bytes();
        println!("every other of 10 M: {} spans, ~{bytes} bytes, {:?}", s.span_count(), t.elapsed());
        assert!(bytes < 2 << 20, "{bytes} bytes");
        assert_eq!(s.count_in(0, 10_000_000), 5_000_000);
        assert_eq!(s.first_absent_from(1), 2);
        assert_eq!(s.ranges(3), vec![(1, 1), (3, 3), (5, 5)]);
        // Filling the holes collapses it to a single run.
        for p in (0..10_000_000u64).step_by(2) {
            assert!(s.insert(p));
        }
        assert_eq!(s.ranges(usize::MAX), vec![(0, 9_999_999)]);
        assert!(s.span_count() <= 2);
    }

    #[derive(Debug, Clone)]
    enum Op {
        Insert(u64),
        Range(u64, u64),
        RemoveBelow(u64),
    }

    fn op(space: u64) -> impl Strategy<Value = Op> {
        prop_oneof![
            6 => (0..space).prop_map(Op::Insert),
            2 => (0..space, 0..3 * BLOCK_BITS).prop_map(|(a, n)| Op::Range(a, a + n)),
            1 => (0..space).prop_map(Op::RemoveBelow),
        ]
    }

    fn model_ranges(m: &BTreeSet<u64>) -> Vec<(u64, u64)> {
        let mut out: Vec<(u64, u64)> = Vec::new();
        for &e in m {
            match out.last_mut() {
                Some((_, end)) if *end + 1 == e => *end = e,
                _ => out.push((e, e)),
            }
        }
        out
    }

    #[test]
    fn matches_a_naive_set() {
        // Goal: every operation agrees with a BTreeSet<u64> model, and the
        // representation is canonical (equal sets compare equal). Method:
        // random operation sequences over a few blocks, replayable with
        // MAGNETAR_SEED.
        let seed = crate::test_seed("matches_a_naive_set");
        let mut bytes = [0u8; 32];
        bytes[..8].copy_from_slice(&seed.to_le_bytes());
        let config = ProptestConfig { cases: 256, failure_persistence: None, ..ProptestConfig::default() };
        let mut runner = proptest::test_runner::TestRunner::new_with_rng(
            config,
            proptest::test_runner::TestRng::from_seed(proptest::test_runner::RngAlgorithm::ChaCha, &bytes),
        );
        let space = 5 * BLOCK_BITS;
        let result = runner.run(&(proptest::collection::vec(op(space), 1..300), 0..space), |(ops, probe)| {
            let mut s = AckSet::new();
            let mut m = BTreeSet::new();
            for op in &ops {
                match *op {
                    Op::Insert(p) => prop_assert_eq!(s.insert(p), m.insert(p)),
                    Op::Range(a, b) => {
                        s.insert_range(a, b);
                        m.extend(a..=b);
                    }
                    Op::RemoveBelow(f) => {
                        s.remove_below(f);
                        m = m.split_off(&f);
                    }
                }
                prop_assert_eq!(s.is_empty(), m.is_empty());
            }
            prop_assert_eq!(s.ranges(usize::MAX), model_ranges(&m));
            prop_assert_eq!(s.ranges(2), model_ranges(&m).into_iter().take(2).collect::<Vec<_>>());
            for p in probe.saturating_sub(70)..probe + 70 {
                prop_assert_eq!(s.contains(p), m.contains(&p), "contains({})", p);
            }
            let absent = (probe..).find(|p| !m.contains(p)).unwrap_or(u64::MAX);
            prop_assert_eq!(s.first_absent_from(probe), absent);
            for (a, b) in [(0, space * 2), (probe, probe + 1500), (probe / 2, probe), (probe, probe)] {
                prop_assert_eq!(s.count_in(a, b), m.range(a..b.max(a)).count() as u64, "count_in({}, {})", a, b);
            }
            // Canonical: rebuilding from the model gives an equal value.
            let mut rebuilt = AckSet::new();
            for (a, b) in model_ranges(&m) {
                rebuilt.insert_range(a, b);
            }
            prop_assert_eq!(&rebuilt, &s);
            Ok(())
        });
        if let Err(e) = result {
            panic!("{e} (MAGNETAR_SEED={seed})");
        }
    }
}
