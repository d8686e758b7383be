//! Segment compaction: a segment held alive by a few live entries (of slow
//! ledgers) is emptied by copying those entries forward to the log's tail,
//! so that garbage collection can delete it.
//!
//! Steps, and what a crash at each leaves (details in `docs/format.md`,
//! "Compaction"):
//! 1. Pick segments wholly before the durable checkpoint whose live bytes
//!    are under `compaction_live_pct` of `segment_bytes`, fewest live bytes
//!    first, up to `compaction_bytes_per_pass` of live bytes.
//! 2. Read their live entries from disk and verify each record checksum
//!    (a damaged entry is never copied: the pass stops with `Corrupt` and
//!    the segment stays).
//! 3. Append each as a `KIND_MOVE` record through group commit. The flusher
//!    points the index at the copy when, and only when, the copy is durable,
//!    in the same step that advances the tail; until then readers read the
//!    original, which is still there. A crash before leaves the original in
//!    place (an undurable copy is torn tail; a durable one the recovery scan
//!    replays, and both hold the same bytes).
//! 4. A checkpoint: it records the moves (relocation table) and, through
//!    the existing garbage collection, deletes the segments left without a
//!    live entry. A crash before the checkpoint is durable keeps the segment
//!    and the old checkpoint; the scan replays the moves.
//!
//! Owned by the shard's executor like the rest of the log; the background
//! pass runs in its own task queue with few shares.

use std::rc::Weak;
use std::time::Duration;

use bytes::Bytes;
use tracing::{info, warn};

use crate::disk::{Disk, DiskFile};
use crate::error::{CorruptReason, Result, StorageError};
use crate::format::{check_entry_record, IndexEntry, RECORD_HEADER_BYTES};
use crate::log::{EntryLog, Mode, Shared};
use crate::pages::{PageWalk, Walked};

/// Largest span read from a segment in one request while compacting.
const COMPACT_READ_BYTES_MAX: u64 = 1 << 20;
/// Bytes of copies queued before waiting for them to be durable, so that a
/// pass never puts more than this in front of producers' appends.
const COMPACT_QUEUE_BYTES_MAX: u64 = 1 << 20;

/// What one compaction pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CompactionStats {
    /// Segments whose live entries were all copied forward (deleted by the
    /// checkpoint that ended the pass).
    pub segments_compacted: u64,
    /// Entries copied.
    pub entries_moved: u64,
    /// Record bytes copied (headers and bodies).
    pub bytes_moved: u64,
    /// Segments removed by the checkpoint at the end of the pass (including
    /// ones that held no live entry at all).
    pub segments_removed: u64,
}

struct Live {
    ledger: u64,
    entry: u64,
    ie: IndexEntry,
}

impl<D: Disk> EntryLog<D> {
    /// Runs one compaction pass now (the background task runs one every
    /// `compaction_interval`): copies the live entries of sparse segments to
    /// the tail, waits until the copies are durable, then checkpoints, which
    /// deletes the emptied segments. Bounded by `compaction_bytes_per_pass`.
    /// A damaged live entry stops the pass with `Corrupt` (the segment and
    /// the log stay as they are); an I/O error of the log fails the log as
    /// any append would.
    pub async fn compact(&self) -> Result<CompactionStats> {
        let sh = &self.sh;
        let _pass = sh.compact_lock.acquire_permit(1).await.map_err(|_| StorageError::Closed)?;
        // It picks segments by their live bytes.
        sh.live_counted().await?;
        let mut stats = CompactionStats::default();
        let pct = sh.cfg.compaction_live_pct as u64;
        if pct == 0 {
            return Ok(stats);
        }
        let victims: Vec<(u64, u64)> = {
            let st = sh.st.borrow();
            crate::log::check_mode(st.mode)?;
            let Some(ckpt) = st.ckpt_position else { return Ok(stats) };
            let mut v: Vec<(u64, u64)> = st
                .segments
                .values()
                .filter(|s| s.end() <= ckpt)
                .filter_map(|s| {
                    let live = st.live.get(s.start);
                    (live.entries > 0 && live.bytes * 100 < pct * s.len).then_some((live.bytes, s.start))
                })
                .collect();
            v.sort_unstable();
            v
        };
        let before = sh.st.borrow().segments.len() as u64;
        let mut budget = sh.cfg.compaction_bytes_per_pass;
        for (live_bytes, start) in victims {
            if live_bytes > budget && stats.bytes_moved > 0 {
                break;
            }
            let (moved, bytes, whole) = self.compact_segment(start, budget).await?;
            stats.entries_moved += moved;
            stats.bytes_moved += bytes;
            stats.segments_compacted += whole as u64;
            budget = budget.saturating_sub(bytes);
            if budget == 0 {
                break;
            }
            glommio::yield_if_needed().await;
        }
        if stats.entries_moved > 0 {
            // Records the moves and deletes the emptied segments.
            sh.checkpoint_or_fail().await?;
        }
        let after = sh.st.borrow().segments.len() as u64;
        stats.segments_removed = before.saturating_sub(after);
        if stats.entries_moved > 0 {
            info!(
                dir = %sh.cfg.dir.display(),
                segments = stats.segments_compacted,
                entries = stats.entries_moved,
                bytes = stats.bytes_moved,
                removed = stats.segments_removed,
                "compacted sparse segments"
            );
        }
        Ok(stats)
    }

    /// Copies up to `budget` bytes of the live entries of the segment at
    /// `start`; returns (entries, bytes, whether all were copied).
    async fn compact_segment(&self, start: u64, budget: u64) -> Result<(u64, u64, bool)> {
        let sh = &self.sh;
        // Live entries of the segment, in position order. Ledgers are walked
        // one at a time, yielding between them, so a large index does not
        // hold the executor.
        let (seg, ids) = {
            let st = sh.st.borrow();
            let Some(seg) = st.segments.get(&start).cloned() else { return Ok((0, 0, false)) };
            (seg, st.ledgers.keys().copied().collect::<Vec<u64>>())
        };
        let mut live = Vec::new();
        for id in ids {
            // The ledger's index pages whose entries were in the segment
            // when the page was written (only entries in the index file
            // move, see `durable_entries`), read straight from the file in
            // runs of adjacent pages (not through the cache).
            let has_file = sh.st.borrow().ledgers.get(&id).is_some_and(|l| l.has_index_file && l.deleted.is_none());
            if !has_file {
                continue;
            }
            let file = sh.index_file(id).await?;
            let mut walk = {
                let st = sh.st.borrow();
                let Some(l) = st.ledgers.get(&id) else { continue };
                PageWalk::matching(file, sh.paths.index(id), id, &l.pages, |sum| {
                    sum.max_position >= seg.start && sum.min_position < seg.end()
                })
            };
            // A relocated entry is no longer where its page says.
            let relocated = |entry| sh.st.borrow().relocated.get(&(id, entry)).copied();
            while let Some(read) = walk.next(relocated).await? {
                let in_seg =
                    |e: &Walked| e.moved.is_none() && e.paged.position >= seg.start && e.paged.position < seg.end();
                live.extend(read.iter().filter(|e| in_seg(e)).map(|e| Live {
                    ledger: id,
                    entry: e.entry,
                    ie: e.paged,
                }));
            }
            glommio::yield_if_needed().await;
        }
        // Entries compaction moved here before.
        {
            let st = sh.st.borrow();
            for (&(ledger, entry), ie) in &st.relocated {
                let Some(l) = st.ledgers.get(&ledger) else { continue };
                if l.deleted.is_none() && ie.position >= seg.start && ie.position < seg.end() {
                    live.push(Live { ledger, entry, ie: *ie });
                }
            }
        }
        // A ledger deleted while its pages were read: its entries stay
        // (the copies would be unreferenced).
        {
            let st = sh.st.borrow();
            live.retain(|x| st.ledgers.get(&x.ledger).is_some_and(|l| l.deleted.is_none()));
        }
        live.sort_unstable_by_key(|l| l.ie.position);
        let total = live.len();
        let rec_bytes = |ie: &IndexEntry| (RECORD_HEADER_BYTES as u64) + ie.body_len as u64;

        let (mut moved, mut bytes, mut queued) = (0u64, 0u64, 0u64);
        let mut last_lsn = None;
        let mut i = 0;
        while i < live.len() {
            if bytes + rec_bytes(&live[i].ie) > budget && moved > 0 {
                break;
            }
            // One read for a run of entries close together.
            let span_start = live[i].ie.position;
            let mut j = i + 1;
            let mut span_end = span_start + rec_bytes(&live[i].ie);
            while j < live.len() {
                let end = live[j].ie.position + rec_bytes(&live[j].ie);
                if end - span_start > COMPACT_READ_BYTES_MAX || bytes + (end - span_start) > budget {
                    break;
                }
                span_end = end;
                j += 1;
            }
            let off = span_start - seg.start;
            let raw = seg
                .file
                .read_at(off, (span_end - span_start) as usize)
                .await
                .map_err(|e| StorageError::io("read segment for compaction", &seg.path, e))?;
            let raw = Bytes::from(raw);
            for l in &live[i..j] {
                let s = (l.ie.position - span_start) as usize;
                let n = rec_bytes(&l.ie) as usize;
                let corrupt = |r| StorageError::corrupt(&seg.path, l.ie.position - seg.start, r);
                let rec = raw.get(s..s + n).ok_or_else(|| {
                    corrupt(CorruptReason::ShortFile {
                        len: (off as usize + raw.len()) as u64,
                        need: (off as usize + s + n) as u64,
                    })
                })?;
                // Never copy a byte whose checksum failed.
                if let Err(r) = check_entry_record(rec, &l.ie, l.ledger, l.entry) {
                    warn!(file = %seg.path.display(), offset = l.ie.position - seg.start, ledger = l.ledger, entry = l.entry, reason = %r, "compaction found a damaged entry; segment kept");
                    return Err(corrupt(r));
                }
                let body = raw.slice(s + RECORD_HEADER_BYTES..s + n);
                let lsn = {
                    let mut st = sh.st.borrow_mut();
                    crate::log::check_mode(st.mode)?;
                    st.push_move(l.ledger, l.entry, body, l.ie.extras, l.ie.position)
                };
                last_lsn = Some(lsn);
                moved += 1;
                bytes += n as u64;
                queued += n as u64;
            }
            i = j;
            if queued >= COMPACT_QUEUE_BYTES_MAX {
                if let Some(lsn) = last_lsn {
                    self.wait_durable(lsn).await?;
                }
                queued = 0;
            }
        }
        if let Some(lsn) = last_lsn {
            self.wait_durable(lsn).await?;
        }
        Ok((moved, bytes, moved as usize == total))
    }
}

/// A background task of the log: `pass` every `interval`, in the task queue
/// it was spawned into (few shares). Exits when the log is closed, failed or
/// dropped. A failed pass is logged; a write or fsync failure has already
/// failed the log (fail-stop), anything else (damaged data stays where it
/// is and reads report it; a read failure) is tried again next time.
pub(crate) async fn every<D, P, F>(weak: Weak<Shared<D>>, interval: Duration, what: &'static str, pass: P)
where
    D: Disk,
    P: Fn(EntryLog<D>) -> F,
    F: std::future::Future<Output = Result<()>>,
{
    if interval.is_zero() {
        return;
    }
    loop {
        glommio::timer::sleep(interval).await;
        let Some(sh) = weak.upgrade() else { break };
        if sh.st.borrow().mode != Mode::Open {
            break;
        }
        let log = EntryLog { sh };
        if let Err(e) = pass(log.clone()).await {
            warn!(error = %e, "{what} failed");
            if log.is_failed() {
                break;
            }
        }
    }
}
