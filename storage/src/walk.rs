//! The log walker that recovery (`recovery.rs`) and the offline inspector
//! (`inspect.rs`) share, so that the broker and the tool cannot disagree
//! about what a segment's bytes mean: which batch is valid, where the log
//! ends, what is a torn write (never acknowledged: cut it) and what is
//! damage that may hide acknowledged data (refuse, or cut only when the
//! operator accepts the loss). The case analysis is `docs/format.md`,
//! "What a crash leaves".
//!
//! The walker does no I/O of its own: the caller supplies the segments'
//! bytes through [`Segs`] (recovery through its `Disk` backend, the
//! inspector through plain `pread`s), receives each valid batch through
//! [`Visit`], and gets a [`Verdict`] on how the log ends. Acting on the
//! verdict (zeroing a torn tail, refusing, reporting) is the caller's.

use std::path::Path;

use crate::disk::PAGE_BYTES;
use crate::error::{CorruptReason, Result, StorageError};
use crate::format::{
    could_be_torn, first_record_written_here, header_written_here, BatchHeader, BATCH_HEADER_BYTES, BATCH_MAGIC,
};

/// Read granularity of a walk.
const CHUNK_BYTES: u64 = 1 << 20;
const _: () = assert!(CHUNK_BYTES.is_multiple_of(PAGE_BYTES));

/// The segments of a log, by start position, as the caller reads them.
pub(crate) trait Segs {
    fn seg_count(&self) -> usize;
    /// First log position of segment `i`.
    fn seg_start(&self, i: usize) -> u64;
    /// Usable bytes of segment `i` (whole pages).
    fn seg_len(&self, i: usize) -> u64;
    fn seg_path(&self, i: usize) -> &Path;
    /// Bytes `[off, off + len)` of segment `i`, shorter only at its end.
    async fn read_seg(&self, i: usize, off: u64, len: usize) -> Result<Vec<u8>>;

    fn seg_end(&self, i: usize) -> u64 {
        self.seg_start(i) + self.seg_len(i)
    }
}

/// What the caller does with each valid batch, and what it knows that the
/// verdicts need.
pub(crate) trait Visit {
    /// A valid batch of segment `seg` at offset `off` (log position
    /// `position`), in log order, with its body (header included).
    fn batch(&mut self, seg: usize, off: u64, position: u64, h: &BatchHeader, body: &[u8]) -> Result<()>;
    /// Entries laid out so far for `ledger` (the id its next entry record
    /// must carry), or `None` for a ledger not seen.
    fn next_entry(&self, ledger: u64) -> Option<u64>;
    /// Bytes read so far (for a progress display).
    fn progress(&mut self, _scanned: u64) {}
}

/// Where a walk starts and what it tolerates.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Start {
    pub position: u64,
    /// The seq of the batch at `position`, or `None` to take it from the
    /// first valid batch.
    pub seq: Option<u64>,
    /// Segments missing before this position were removed by garbage
    /// collection (a full scan of a log whose start was collected): the walk
    /// resumes at the next segment present, taking its seq from it. `None`:
    /// segments must be contiguous.
    pub gaps_before: Option<u64>,
    /// The accepted cut of a segment truncated by hand (recovery with
    /// `accept_data_loss`): the log ends at the last batch wholly before it.
    pub cut_at: Option<u64>,
    /// The checkpoint's position and next batch seq, for a walk that starts
    /// before it (a whole-log walk): the log reaches that position, a batch
    /// boundary or the start of a segment, where that batch belongs. The
    /// walk must arrive there exactly (never inside a batch, never short
    /// of it: everything before was synced when the checkpoint was
    /// written), and goes on from there as recovery does. Segments before
    /// it may be missing (`gaps_before` covers it).
    pub checkpoint: Option<(u64, u64)>,
}

/// A place in the log: segment `seg` (index into [`Segs`]), offset `off`,
/// log position `position`, where batch `seq` belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct At {
    pub seg: usize,
    pub off: u64,
    pub position: u64,
    pub seq: Option<u64>,
}

/// How the log ends.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing after the last valid batch (zeros, or the end of the last
    /// segment): the log ends at `position`.
    End { position: u64, seq: Option<u64> },
    /// The batch at `at` is torn (the one write in flight at a crash, never
    /// acknowledged): the log ends there; `[at.position, nonzero_end)` holds
    /// its bytes.
    Torn { at: At, nonzero_end: u64, reason: CorruptReason },
    /// Damage at `at` that may hide acknowledged data: `damage` says why it
    /// cannot be a torn write, `reason` what is wrong with the batch.
    /// `later` when a valid batch follows (`damage` is then
    /// `DamageBeforeValidBatch`). `nonzero_end`: end of the non-zero pages of
    /// the segment from `at`.
    Damage { at: At, damage: CorruptReason, reason: CorruptReason, later: bool, nonzero_end: u64 },
    /// The walk reached [`Start::cut_at`] with no batch wholly before it.
    Cut { at: At, cut: u64 },
}

/// Why a valid batch that an earlier use of a recycled segment left counts
/// as nothing written.
pub(crate) fn stale_reason(position: u64, h: &BatchHeader) -> CorruptReason {
    CorruptReason::Field {
        field: "batch position (stale: earlier use of a recycled segment)",
        expected: position,
        found: h.position,
    }
}

/// A walk from before the checkpoint (`Start::checkpoint`) reaching its
/// position `p`: it must be exactly there, where batch `next_seq` belongs
/// (then `ckpt` is spent and `seq` is that); short of it, nothing to check.
fn at_checkpoint(
    ckpt: &mut Option<(u64, u64)>,
    position: u64,
    seq: &mut Option<u64>,
) -> std::result::Result<(), CorruptReason> {
    let Some((p, next_seq)) = *ckpt else { return Ok(()) };
    if position < p {
        return Ok(());
    }
    let (field, expected, found) = match *seq {
        _ if position != p => ("batch position (the checkpoint's, a batch boundary)", p, position),
        Some(s) if s != next_seq => ("batch seq (the checkpoint's next)", next_seq, s),
        _ => {
            *seq = Some(next_seq);
            *ckpt = None;
            return Ok(());
        }
    };
    Err(CorruptReason::Field { field, expected, found })
}

/// Reads segments through [`Segs`] in large chunks and judges their bytes.
pub(crate) struct Walker<'a, S: ?Sized> {
    segs: &'a S,
    /// (segment, offset) of `buf`.
    buf_at: (usize, u64),
    buf: Vec<u8>,
    /// Bytes read so far.
    pub scanned: u64,
}

impl<'a, S: Segs + ?Sized> Walker<'a, S> {
    pub fn new(segs: &'a S) -> Self {
        Walker { segs, buf_at: (usize::MAX, 0), buf: Vec::new(), scanned: 0 }
    }

    /// Bytes `[off, off + len)` of segment `i`, shorter only at its end.
    pub async fn get(&mut self, i: usize, off: u64, len: usize) -> Result<&[u8]> {
        let seg_len = self.segs.seg_len(i);
        let end = (off + len as u64).min(seg_len);
        let (bi, boff) = self.buf_at;
        if bi != i || off < boff || end > boff + self.buf.len() as u64 {
            let want = (len as u64).max(CHUNK_BYTES).min(seg_len.saturating_sub(off));
            self.buf = self.segs.read_seg(i, off, want as usize).await?;
            self.buf_at = (i, off);
            self.scanned += self.buf.len() as u64;
        }
        let boff = self.buf_at.1;
        let s = (off.saturating_sub(boff) as usize).min(self.buf.len());
        let e = (end.saturating_sub(boff) as usize).clamp(s, self.buf.len());
        Ok(&self.buf[s..e])
    }

    /// A fully valid batch at `off` of segment `i` (header and body
    /// checksums), or why not.
    pub async fn batch(&mut self, i: usize, off: u64) -> Result<Result<(BatchHeader, Vec<u8>), CorruptReason>> {
        let seg_len = self.segs.seg_len(i);
        let page = self.get(i, off, PAGE_BYTES as usize).await?;
        if page.len() < BATCH_HEADER_BYTES {
            return Ok(Err(CorruptReason::ShortFile { len: seg_len, need: off + PAGE_BYTES }));
        }
        let h = match BatchHeader::decode(page) {
            Ok(h) => h,
            Err(r) => return Ok(Err(r)),
        };
        if off + h.batch_len as u64 > seg_len {
            return Ok(Err(CorruptReason::Length { len: h.batch_len as u64, limit: seg_len - off }));
        }
        let b = self.get(i, off, h.batch_len as usize).await?;
        if b.len() != h.batch_len as usize {
            return Ok(Err(CorruptReason::ShortFile { len: seg_len, need: off + h.batch_len as u64 }));
        }
        if let Err(r) = h.verify_body(b) {
            return Ok(Err(r));
        }
        Ok(Ok((h, b.to_vec())))
    }

    /// The length segment `i` was preallocated to, as its first batch says
    /// (`BatchHeader::segment_len`), when that batch is of this use of the
    /// file and recorded it.
    pub async fn declared_len(&mut self, i: usize) -> Result<Option<u64>> {
        if self.segs.seg_len(i) < PAGE_BYTES {
            return Ok(None);
        }
        let start = self.segs.seg_start(i);
        let page = self.get(i, 0, PAGE_BYTES as usize).await?;
        Ok(BatchHeader::decode(page).ok().filter(|h| h.position == start && h.segment_len != 0).map(|h| h.segment_len))
    }

    /// Whether segment `i` is shorter than it was preallocated to: a file
    /// truncated by hand (a crash cannot shrink one), so batches may be
    /// gone. Returns the declared length and the finding: before the
    /// checkpoint position `ckpt_position` that loses data the checkpoint
    /// vouches for (`CheckpointBeyondLog`, never acceptable: index files
    /// point there); after it `SegmentTruncated`.
    pub async fn truncation(&mut self, i: usize, ckpt_position: u64) -> Result<Option<(u64, CorruptReason)>> {
        let Some(declared) = self.declared_len(i).await? else { return Ok(None) };
        let (len, end) = (self.segs.seg_len(i), self.segs.seg_end(i));
        if declared <= len {
            return Ok(None);
        }
        let reason = if end < ckpt_position {
            CorruptReason::CheckpointBeyondLog { position: ckpt_position, end }
        } else {
            CorruptReason::SegmentTruncated { len, declared }
        };
        Ok(Some((declared, reason)))
    }

    /// Looks for a fully valid batch at any page after `from`, in segment
    /// `i` and then in the later ones. Returns it (segment index, position,
    /// header) and the end of the last non-zero page of segment `i` at or
    /// after `from` (before any stale batch, see below).
    ///
    /// A valid batch whose position lies before its segment's start is
    /// stale: left by an earlier use of a recycled file. It does not count
    /// as valid data, and the search of that segment stops there: batches
    /// are written one after the other from the segment's start, each only
    /// after the one before it was synced, so a later batch of this use
    /// would have overwritten the stale one first. What lies between `from`
    /// and it (non-zero) is the torn batch in flight or stale bytes; recovery
    /// zeroes only that, never the rest of a recycled segment.
    pub async fn search_valid(&mut self, i: usize, from: u64) -> Result<(Option<(usize, u64, BatchHeader)>, u64)> {
        let mut nonzero_end = from;
        for j in i..self.segs.seg_count() {
            let (start, end) = (self.segs.seg_start(j), self.segs.seg_end(j));
            let mut q = from.max(start);
            while q + PAGE_BYTES <= end {
                let off = q - start;
                let page = self.get(j, off, PAGE_BYTES as usize).await?;
                if page.len() < PAGE_BYTES as usize {
                    break;
                }
                if page[..8] == BATCH_MAGIC {
                    if let Ok((h, _)) = self.batch(j, off).await? {
                        if h.position < start {
                            break; // stale: nothing of this use beyond (see above)
                        }
                        if q > from {
                            return Ok((Some((j, q, h)), nonzero_end));
                        }
                    }
                    // (`batch` may have moved the buffer: read again.)
                }
                let page = self.get(j, off, PAGE_BYTES as usize).await?;
                if j == i && page.iter().any(|&b| b != 0) {
                    nonzero_end = q + PAGE_BYTES;
                }
                q += PAGE_BYTES;
            }
        }
        Ok((None, nonzero_end))
    }

    /// Walks the log from `s`, handing every valid batch to `v` in log
    /// order, and says how it ends. A valid batch in the wrong place (seq or
    /// position) is not a torn write: `Corrupt`, as is a missing segment.
    pub async fn walk<V: Visit>(&mut self, s: Start, v: &mut V) -> Result<Verdict> {
        let segs = self.segs;
        let (mut position, mut seq) = (s.position, s.seq);
        // The checkpoint's position while the walk is short of it (the
        // segments before it may have been removed).
        assert!(s.checkpoint.is_none_or(|(p, _)| s.gaps_before.is_some_and(|g| p <= g)));
        let mut ckpt = s.checkpoint.filter(|(p, _)| *p > position);
        let count = segs.seg_count();
        let Some(mut i) = (0..count).position(|i| segs.seg_end(i) > position) else {
            return self.end(ckpt, position, seq);
        };
        while i < count {
            let (start, end) = (segs.seg_start(i), segs.seg_end(i));
            if position < start && s.gaps_before.is_some_and(|g| start <= g) {
                // Segments removed by garbage collection: go on with the
                // next batch present.
                position = start;
                seq = None;
            }
            if position < start {
                // Segments are contiguous and the walk enters each at its
                // start; a gap means a segment file is missing (or the one
                // before was truncated).
                let reason = CorruptReason::Field {
                    field: "segment start (expected log position)",
                    expected: position,
                    found: start,
                };
                return Err(StorageError::corrupt(segs.seg_path(i), 0, reason));
            }
            at_checkpoint(&mut ckpt, position, &mut seq)
                .map_err(|r| StorageError::corrupt(segs.seg_path(i), position - start, r))?;
            if position + PAGE_BYTES > end {
                i += 1; // the rest of the segment is unused
                continue;
            }
            let off = position - start;
            let at = At { seg: i, off, position, seq };
            v.progress(self.scanned);
            let found = match self.batch(i, off).await? {
                // A batch of an earlier use of this (recycled) file:
                // positions are never reused, so nothing of this use was
                // written here.
                Ok((h, _)) if h.position < start => Err(stale_reason(position, &h)),
                other => other,
            };
            if let Some(c) = s.cut_at.filter(|c| *c > start && *c <= end) {
                let whole = matches!(&found, Ok((h, _)) if position + h.batch_len as u64 <= c);
                if !whole {
                    return Ok(Verdict::Cut { at, cut: c });
                }
            }
            let reason = match found {
                Ok((h, b)) => {
                    let expected = seq.unwrap_or(h.seq);
                    if h.seq != expected || h.position != position {
                        let (field, expected, found) = if h.seq != expected {
                            ("batch seq", expected, h.seq)
                        } else {
                            ("batch position", position, h.position)
                        };
                        let reason = CorruptReason::Field { field, expected, found };
                        return Err(StorageError::corrupt(segs.seg_path(i), off, reason));
                    }
                    v.batch(i, off, position, &h, &b)?;
                    position += h.batch_len as u64;
                    seq = Some(expected + 1);
                    continue;
                }
                Err(reason) => reason,
            };
            // Damaged or absent.
            let (later, nonzero_end) = self.search_valid(i, position).await?;
            // The next segment follows: contiguous, or after segments that
            // garbage collection removed.
            let follows = |n: usize| segs.seg_start(n) == end || s.gaps_before.is_some_and(|g| segs.seg_start(n) <= g);
            // Or the checkpoint says the log goes on at or after the end of
            // this segment.
            let goes_on = later.is_some() && i + 1 < count && follows(i + 1) || ckpt.is_some_and(|(p, _)| end <= p);
            // (A valid batch later in this segment was written after
            // whatever stood here: then this is no unwritten rest.)
            let rest = nonzero_end == position && later.is_none_or(|(j, _, _)| j > i);
            if rest && goes_on {
                // Nothing was ever written here, and valid data follows: the
                // next batch did not fit and went to the next segment. Judge
                // what is there, so that damage is reported where it is.
                position = end;
                i += 1;
                continue;
            }
            match later {
                Some((j, q, lh))
                    if j == i + 1
                        && seq.is_none_or(|s| s == lh.seq)
                        && q == segs.seg_start(j)
                        && q == end
                        && lh.batch_len as u64 > end - position =>
                {
                    // The batch did not fit here and went to the next
                    // segment; the rest of this one was never written.
                    position = q;
                    i += 1;
                }
                Some((_, q, lh)) => {
                    let damage = CorruptReason::DamageBeforeValidBatch { later_seq: lh.seq, later_position: q };
                    return Ok(Verdict::Damage { at, damage, reason, later: true, nonzero_end });
                }
                None => {
                    // Nothing valid after it, so this was the one batch in
                    // flight: a torn write, unless it cannot be one. Not
                    // before the checkpoint's position: everything there
                    // was synced.
                    let short = ckpt.map(|(p, _)| CorruptReason::CheckpointBeyondLog { position: p, end: position });
                    return Ok(match (self.not_torn(at, &reason, v).await?, short) {
                        (Some(damage), _) | (None, Some(damage)) => {
                            Verdict::Damage { at, damage, reason, later: false, nonzero_end }
                        }
                        (None, None) => Verdict::Torn { at, nonzero_end, reason },
                    });
                }
            }
        }
        self.end(ckpt, position, seq)
    }

    /// How the log ends at `position`, past its last segment, with `ckpt`
    /// the checkpoint's position and next seq until the walk arrived there.
    /// Short of it, the segments up to it were removed (garbage collection;
    /// or, after the last batch, recovery's removal of a segment holding
    /// none): the log ends there.
    fn end(&self, mut ckpt: Option<(u64, u64)>, position: u64, mut seq: Option<u64>) -> Result<Verdict> {
        if let Some((p, next_seq)) = ckpt.filter(|(p, _)| position < *p) {
            return Ok(Verdict::End { position: p, seq: Some(next_seq) });
        }
        at_checkpoint(&mut ckpt, position, &mut seq).map_err(|r| {
            // (Past the checkpoint's position only by leaving a segment.)
            let last = self.segs.seg_count() - 1;
            StorageError::corrupt(self.segs.seg_path(last), self.segs.seg_len(last), r)
        })?;
        Ok(Verdict::End { position, seq })
    }

    /// Why the last batch, at `at` and damaged for `reason`, cannot be a
    /// torn write (so may have been acknowledged), or `None` when it can:
    /// a header that was written here whole (`header_written_here`,
    /// `first_record_written_here`), or a complete body with no unwritten
    /// sector (`could_be_torn`).
    async fn not_torn<V: Visit>(&mut self, at: At, reason: &CorruptReason, v: &V) -> Result<Option<CorruptReason>> {
        let page = self.get(at.seg, at.off, PAGE_BYTES as usize).await?.to_vec();
        if matches!(reason, CorruptReason::BadMagic | CorruptReason::HeaderCrc { .. } | CorruptReason::Version(_)) {
            // (With no seq known yet, nothing says what belongs here.)
            if let Some(seq) = at.seq.filter(|s| {
                header_written_here(&page, *s, at.position) || first_record_written_here(&page, |l| v.next_entry(l))
            }) {
                return Ok(Some(CorruptReason::HeaderDamaged { seq }));
            }
        }
        if let CorruptReason::BodyCrc { stored, computed } = *reason {
            // Only a header of this use of the segment says what was
            // written here.
            let start = self.segs.seg_start(at.seg);
            if let Some(h) = BatchHeader::decode(&page).ok().filter(|h| h.position >= start) {
                let b = self.get(at.seg, at.off, h.batch_len as usize).await?;
                if !could_be_torn(&h, b) {
                    return Ok(Some(CorruptReason::DamagedNotTorn { batch_len: h.batch_len, stored, computed }));
                }
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::crc;
    use futures_lite::future::block_on;
    use std::path::PathBuf;

    const SEG: u64 = 4 * PAGE_BYTES;

    /// Segments in memory: (start, bytes, path).
    struct Mem(Vec<(u64, Vec<u8>, PathBuf)>);

    impl Segs for Mem {
        fn seg_count(&self) -> usize {
            self.0.len()
        }
        fn seg_start(&self, i: usize) -> u64 {
            self.0[i].0
        }
        fn seg_len(&self, i: usize) -> u64 {
            self.0[i].1.len() as u64
        }
        fn seg_path(&self, i: usize) -> &Path {
            &self.0[i].2
        }
        async fn read_seg(&self, i: usize, off: u64, len: usize) -> Result<Vec<u8>> {
            let b = &self.0[i].1;
            let s = (off as usize).min(b.len());
            Ok(b[s..(s + len).min(b.len())].to_vec())
        }
    }

    /// Counts the batches a walk visits.
    struct Count(u64);

    impl Visit for Count {
        fn batch(&mut self, _: usize, _: u64, _: u64, _: &BatchHeader, _: &[u8]) -> Result<()> {
            self.0 += 1;
            Ok(())
        }
        fn next_entry(&self, _: u64) -> Option<u64> {
            None
        }
    }

    /// A segment starting at `start` with one-page batches of no record
    /// (seq, page index) written into zeros.
    fn segment(start: u64, batches: &[(u64, u64)]) -> (u64, Vec<u8>, PathBuf) {
        let mut b = vec![0u8; SEG as usize];
        for &(seq, page) in batches {
            let off = (page * PAGE_BYTES) as usize;
            let body_crc = crc(&[&b[off + BATCH_HEADER_BYTES..off + PAGE_BYTES as usize]]);
            let position = start + page * PAGE_BYTES;
            let h = BatchHeader {
                batch_len: PAGE_BYTES as u32,
                record_count: 0,
                seq,
                position,
                records_len: 0,
                body_crc,
                flags: 0,
                segment_len: SEG,
            };
            h.encode(&mut b[off..]);
        }
        (start, b, PathBuf::from(format!("{start:020}.seg")))
    }

    /// A whole-log walk (what `inspect --verify` does): from the first
    /// segment, gaps allowed before the checkpoint at `ckpt` (position,
    /// next seq).
    fn verify(segs: &Mem, ckpt: (u64, u64)) -> (Result<Verdict>, u64) {
        let mut v = Count(0);
        let start = Start { position: 0, seq: None, gaps_before: Some(ckpt.0), cut_at: None, checkpoint: Some(ckpt) };
        let r = block_on(Walker::new(segs).walk(start, &mut v));
        (r, v.0)
    }

    /// A walk that ends without damage: where (as an `End`: zeros after the
    /// last batch are a torn write of nothing) and batches visited.
    fn ended(r: (Result<Verdict>, u64)) -> (Verdict, u64) {
        let v = match r.0.unwrap_or_else(|e| panic!("{e}")) {
            Verdict::Torn { at, nonzero_end, .. } if nonzero_end == at.position => {
                Verdict::End { position: at.position, seq: at.seq }
            }
            v => v,
        };
        (v, r.1)
    }

    #[test]
    fn the_unwritten_rest_of_a_segment_before_a_collected_one_is_zeros_and_nothing_else() {
        // Goal: a whole-log walk passes the rest of a segment the log
        // rolled past when the next segment was garbage collected (nothing
        // says how long the batch that did not fit was) only when that rest
        // is zeros; non-zero bytes there, followed by valid data, are damage.
        // Method: segment 0 with batches 0 and 1, segment 1 removed,
        // segment 2 with batch 5; then the same with a headerless non-zero
        // page in segment 0's rest.
        let mut segs = Mem(vec![segment(0, &[(0, 0), (1, 1)]), segment(2 * SEG, &[(5, 0)])]);
        let ckpt = (2 * SEG + PAGE_BYTES, 6);
        assert_eq!(ended(verify(&segs, ckpt)), (Verdict::End { position: ckpt.0, seq: Some(6) }, 3));

        segs.0[0].1[(2 * PAGE_BYTES) as usize + 100] = 0x5a;
        let (r, _) = verify(&segs, ckpt);
        assert!(
            matches!(
                r,
                Ok(Verdict::Damage {
                    damage: CorruptReason::DamageBeforeValidBatch { later_seq: 5, .. },
                    later: true,
                    ..
                })
            ),
            "{r:?}"
        );

        // Zeros (a batch gone) before a valid batch of the same segment
        // are no unwritten rest either.
        let segs = Mem(vec![segment(0, &[(0, 0), (1, 1), (3, 3)]), segment(2 * SEG, &[(5, 0)])]);
        let (r, _) = verify(&segs, ckpt);
        assert!(
            matches!(
                r,
                Ok(Verdict::Damage {
                    damage: CorruptReason::DamageBeforeValidBatch { later_seq: 3, .. },
                    later: true,
                    ..
                })
            ),
            "{r:?}"
        );
    }

    #[test]
    fn a_whole_log_walk_ends_where_the_checkpoint_says_the_log_goes_on() {
        // Goal: the checkpoint may name the start of a segment the log
        // rolled to before the batch in flight there was lost (the rest of
        // the previous segment zero, the new one empty or removed): the
        // whole-log walk ends there as recovery does, with the checkpoint's
        // next seq. A checkpoint position the walk cannot arrive at exactly
        // (inside zeros, inside a batch) or a different seq there is damage.
        let two = || segment(0, &[(0, 0), (1, 1)]);
        let p = (SEG, 2);
        let end = Verdict::End { position: SEG, seq: Some(2) };
        assert_eq!(ended(verify(&Mem(vec![two(), segment(SEG, &[])]), p)), (end.clone(), 2));
        assert_eq!(ended(verify(&Mem(vec![two()]), p)), (end, 2));

        let (r, _) = verify(&Mem(vec![two(), segment(SEG, &[])]), (3 * PAGE_BYTES, 2));
        assert!(
            matches!(r, Ok(Verdict::Damage { damage: CorruptReason::CheckpointBeyondLog { position, end }, .. })
                if position == 3 * PAGE_BYTES && end == 2 * PAGE_BYTES),
            "{r:?}"
        );
        let (r, _) = verify(&Mem(vec![two()]), (PAGE_BYTES + 1, 2));
        assert!(matches!(r, Err(StorageError::Corrupt { .. })), "{r:?}");
        let (r, _) = verify(&Mem(vec![two(), segment(SEG, &[])]), (SEG, 7));
        assert!(
            matches!(r, Err(StorageError::Corrupt { reason: CorruptReason::Field { expected: 7, found: 2, .. }, .. })),
            "{r:?}"
        );
    }
}
