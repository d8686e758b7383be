//! The entry log: group commit, reads, metadata, checkpoints, fail-stop.
//! Recovery (`open`) lives in `recovery.rs`.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::poll_fn;
use std::path::{Path, PathBuf};
use std::rc::{Rc, Weak};
use std::task::{Poll, Waker};
use std::time::Duration;

use bytes::Bytes;
use futures::StreamExt;
use tracing::{debug, error, info, warn};

use crate::disk::{Disk, DiskFile, DmaDisk, OpenMode, PAGE_BYTES};
use crate::error::{CorruptReason, Result, StorageError};
use crate::format::{
    check_entry_record, encode_index_page, pad_to_page, BatchHeader, Checkpoint, CheckpointLedger, CleanMarker,
    IndexEntry, IndexExtras, RecordHeader, Relocation, BATCH_FLAG_OVER_STALE, BATCH_HEADER_BYTES,
    INDEX_ENTRIES_PER_PAGE, KIND_DELETE, KIND_ENTRY, KIND_META, KIND_MOVE, META_KEY_BYTES_MAX, RECORD_HEADER_BYTES,
};
use crate::lone::{LonePolicy, Route};
use crate::spans::{KeptSpans, SpanGuard, SPAN_ALIGN};

/// Configuration of one shard's entry log.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// The shard's directory, e.g. `data/shard-0` (created if missing).
    pub dir: PathBuf,
    /// Size of each preallocated entry-log segment file. Default 256 MiB.
    pub segment_bytes: u64,
    /// Most bytes in one group-commit write (a single larger entry still goes
    /// alone in one batch). Default 4 MiB.
    pub flush_bytes_max: usize,
    /// Bound on recently appended entries kept in memory. Entries not yet
    /// durable are never evicted, so the cache can exceed this by what is in
    /// flight. Default 256 MiB.
    pub write_cache_bytes: usize,
    /// How often index pages and a checkpoint are written. Default 30 s.
    pub checkpoint_interval: Duration,
    /// Bound on the index entries laid out since the last checkpoint (32 B
    /// each, kept in memory until a checkpoint writes their pages): once
    /// this many bytes of them were laid out, a checkpoint starts before its
    /// interval, so that this memory follows the configuration and not the
    /// write rate. What is laid out while that checkpoint runs comes on top.
    /// Default 32 MiB.
    pub recent_index_bytes: usize,
    /// Allow a data directory on tmpfs (no O_DIRECT, no durability): tests only.
    pub allow_tmpfs: bool,
    /// Largest entry body. Default 5 MiB (Pulsar's default max message size);
    /// capped so that one entry always fits in one segment.
    pub entry_bytes_max: usize,
    /// Bound on entries kept after a disk read (catch-up readers), separate
    /// from the write cache so that catch-up cannot evict the tail. 0
    /// disables the read cache and read-ahead. Default 64 MiB.
    pub read_cache_bytes: usize,
    /// A read from disk that continues a sequential read of the same ledger
    /// also reads the ledger's following entries in that segment, up to this
    /// many bytes, in one request, into the read cache. Default 1 MiB.
    pub read_ahead_bytes: usize,
    /// Bound on the decoded ledger index pages kept in memory (per shard;
    /// least recently used out). Entries laid out since the last checkpoint
    /// are in memory apart from it; the rest of a ledger's index is read
    /// from its index file a page (127 entries) at a time. Default 64 MiB.
    pub index_cache_bytes: usize,
    /// A segment before the checkpoint whose live entry bytes are below this
    /// percentage of `segment_bytes` is compacted: its live entries are
    /// copied to the tail and it is deleted. 0 disables compaction. Default 25.
    pub compaction_live_pct: u8,
    /// Most live bytes one compaction pass copies. Default 64 MiB.
    pub compaction_bytes_per_pass: u64,
    /// How often the background compaction pass runs (zero: never; `compact`
    /// still works). Default 60 s.
    pub compaction_interval: Duration,
    /// Shares of the compaction task queue (glommio's default queue has
    /// 1,000), so that compaction yields to producers and readers. Default 50.
    pub compaction_shares: usize,
    /// Items (durable entries with a key) per key index file; the part not
    /// yet in a file stays in memory (32 bytes an item). Default 262,144.
    pub key_index_items_per_file: usize,
    /// How often the background task writes full key index files and
    /// removes those of deleted ledgers (zero: never; lookups still work
    /// from memory). Default 10 s.
    pub key_index_interval: Duration,
    /// Write zeros over each new segment (in the background, when the spare
    /// is created) instead of only reserving it with fallocate. On ext4 an
    /// fdatasync after writing into reserved-but-unwritten extents also
    /// commits the extent conversion in the journal; overwriting written
    /// blocks does not, so its fdatasync is faster (fio figures:
    /// bench/RESULTS.md, "Pre-zeroed segments"). Costs one
    /// extra sequential write of every segment, and the first segment is
    /// zeroed before the first batch. Default off: `zero_ahead_bytes` gets
    /// lone batches the same without either, and recycled segments need no
    /// zeroing at all.
    pub prezero_segments: bool,
    /// Segments that garbage collection frees are kept (under their old
    /// names, up to this many per shard) and renamed into place as the next
    /// spare instead of being unlinked and created afresh: their blocks are
    /// already written, so batches overwrite them instead of converting
    /// unwritten extents (an ext4 journal commit per fdatasync). Beyond the
    /// bound they are unlinked. 0 disables recycling. Default 2.
    pub recycle_segments: usize,
    /// Zero the tail segment ahead of the write position, in the
    /// background, up to this many bytes ahead of the tail (0: never), so
    /// that batches overwrite written blocks (see `prezero_segments`) without
    /// zeroing a whole segment at once. Only while recent batches are small
    /// (average at most [`ZERO_AHEAD_BATCH_MAX`]): large batches pay the
    /// extent conversion once per many bytes, and zeroing ahead of them would
    /// only write everything twice. A batch beyond the zeroed part is written
    /// all the same. Recycled segments need none. Default 8 MiB.
    pub zero_ahead_bytes: u64,
    /// A run of lone small batches ([`LONE_BATCH_BYTES_MAX`]) is written and
    /// synced as one request that blocks the shard thread: nothing else on
    /// the shard runs meanwhile (other topics' reads and connections). When
    /// one such request takes longer than this (a busy disk), the next
    /// [`LONE_PAUSE_BATCHES`] batches go through the reactor instead, so a
    /// slow disk never stalls the shard for long per batch; the pause ends
    /// early once [`LONE_RESUME_FAST`] lone batches in a row were written
    /// and synced through the reactor within this bound (the slow request
    /// was a spike, not a busy disk). Zero: never block. Default 1 ms.
    pub lone_sync_max: Duration,
    /// The stretches of log kept for [`EntryLog::read_run`]
    /// ([`SPANS_KEPT`](crate::spans::SPANS_KEPT) of them, each up to a run's bytes, its largest
    /// entry at least, plus [`SPAN_ALIGN`]: ~9 MiB with the dispatcher's
    /// 1 MiB runs, ~41 MiB with 5 MiB entries) are released once no run has used
    /// them for this long, by the next checkpoint (periodic or not).
    /// Default 10 s.
    pub read_span_idle: Duration,
    /// Damage the recovery scan finds inside data that may have been
    /// acknowledged (a damaged batch before valid ones, a complete last
    /// batch that rotted, a truncated segment): `false` (the default)
    /// refuses to open with `Corrupt` naming file, offset and what is
    /// missing; `true` truncates the log at the damage and logs exactly
    /// what was dropped (`Recovery::dropped`). An operator's decision.
    pub accept_data_loss: bool,
}

/// Zeroing ahead (`LogConfig::zero_ahead_bytes`) runs only while the
/// flusher's average batch is at most this long: lone messages (a page or
/// two per batch). With 16 producers one in flight each (~5 pages a batch)
/// zeroing ahead costs throughput (bench/RESULTS.md, "Recycled and
/// zeroed-ahead segments").
pub const ZERO_AHEAD_BATCH_MAX: u64 = 16 << 10;

/// A batch (header, record and padding) of one record and at most this
/// long, after [`LONE_STREAK_MIN`] such batches in a row, is written and synced as one blocking request
/// (`DiskFile::write_and_sync`) instead of through the reactor.
pub const LONE_BATCH_BYTES_MAX: u64 = 16 << 10;
/// See [`LONE_BATCH_BYTES_MAX`]: a run of lone batches (one producer, one
/// message in flight), not one lone batch among larger ones (several
/// producers), whose next messages the shard should read while the disk works.
pub const LONE_STREAK_MIN: u32 = 4;
/// See [`LogConfig::lone_sync_max`].
pub const LONE_PAUSE_BATCHES: u32 = 1024;

/// See [`LogConfig::lone_sync_max`]: lone batches in a row, each written and
/// synced through the reactor within `lone_sync_max`, that end a pause
/// early. On a disk whose lone requests are slow only now and then (other
/// tenants' spikes), a full pause of [`LONE_PAUSE_BATCHES`] after each
/// would send most of a one-at-a-time run through the slower reactor path
/// (bench/RESULTS.md, "One at a time, third round"); on a busy disk the
/// reactor's requests are slow too and the pause runs its course.
pub const LONE_RESUME_FAST: u32 = 32;

/// One zeroing write (then one fdatasync): a quarter of the distance ahead,
/// between 1 and 4 MiB.
fn zero_chunk_bytes(cfg: &LogConfig) -> u64 {
    (cfg.zero_ahead_bytes / 4).clamp(1 << 20, 4 << 20) / PAGE_BYTES * PAGE_BYTES
}

impl LogConfig {
    pub fn new(dir: impl Into<PathBuf>) -> Self {
        LogConfig {
            dir: dir.into(),
            segment_bytes: 256 << 20,
            flush_bytes_max: 4 << 20,
            write_cache_bytes: 256 << 20,
            checkpoint_interval: Duration::from_secs(30),
            recent_index_bytes: 32 << 20,
            allow_tmpfs: false,
            entry_bytes_max: 5 << 20,
            read_cache_bytes: 64 << 20,
            read_ahead_bytes: 1 << 20,
            index_cache_bytes: 64 << 20,
            compaction_live_pct: 25,
            compaction_bytes_per_pass: 64 << 20,
            compaction_interval: Duration::from_secs(60),
            compaction_shares: 50,
            key_index_items_per_file: 1 << 18,
            key_index_interval: Duration::from_secs(10),
            prezero_segments: false,
            recycle_segments: 2,
            zero_ahead_bytes: 8 << 20,
            lone_sync_max: Duration::from_millis(1),
            read_span_idle: Duration::from_secs(10),
            accept_data_loss: false,
        }
    }

    /// The largest body `append` accepts with this configuration.
    pub fn effective_entry_bytes_max(&self) -> u64 {
        let overhead = PAGE_BYTES + (BATCH_HEADER_BYTES + RECORD_HEADER_BYTES) as u64;
        (self.entry_bytes_max as u64).min(self.segment_bytes.saturating_sub(overhead)).min(u32::MAX as u64 - overhead)
    }

    pub(crate) fn validate(&self) -> Result<()> {
        if !self.segment_bytes.is_multiple_of(PAGE_BYTES) || self.segment_bytes < 4 * PAGE_BYTES {
            return Err(StorageError::Config(format!(
                "segment_bytes {} must be a multiple of {PAGE_BYTES} and at least {}",
                self.segment_bytes,
                4 * PAGE_BYTES
            )));
        }
        // A full batch, padded to a page, must fit in an empty segment.
        if pad_to_page(self.flush_bytes_max as u64) > self.segment_bytes || self.flush_bytes_max > 1 << 30 {
            return Err(StorageError::Config(format!(
                "flush_bytes_max {} (padded to {PAGE_BYTES}) must be at most segment_bytes {} and 1 GiB",
                self.flush_bytes_max, self.segment_bytes
            )));
        }
        if self.flush_bytes_max < PAGE_BYTES as usize {
            return Err(StorageError::Config(format!(
                "flush_bytes_max {} must be at least {PAGE_BYTES}",
                self.flush_bytes_max
            )));
        }
        Ok(())
    }
}

/// An entry for [`EntryLog::append`]: its body, the values the index keeps
/// beside its position (publish time, key and tag hash; 0 = none), and the
/// body's CRC-32 when the caller already has it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewEntry {
    pub body: Bytes,
    pub extras: IndexExtras,
    /// Computed over these very bytes (e.g. while checking the frame they
    /// came in): the record's checksum is then derived from it instead of
    /// reading the body again. A wrong value cannot serve bad bytes, but it
    /// loses more than this entry: the record fails its checksum on every
    /// read, and the batch's body checksum, which combines the record's
    /// (`BodyCrc`), is wrong too, so the next recovery finds the log
    /// `Corrupt` and refuses to open it. Pass only a checksum taken over
    /// these very bytes (debug builds check).
    pub body_crc: Option<u32>,
}

impl NewEntry {
    /// `body` with no index extras and no CRC.
    pub fn new(body: Bytes) -> NewEntry {
        NewEntry { body, extras: IndexExtras::default(), body_crc: None }
    }

    /// With the index's extras `extras`.
    pub fn extras(self, extras: IndexExtras) -> NewEntry {
        NewEntry { extras, ..self }
    }

    /// With the body's CRC-32 `body_crc` (see the field).
    pub fn body_crc(self, body_crc: Option<u32>) -> NewEntry {
        NewEntry { body_crc, ..self }
    }
}

impl From<Bytes> for NewEntry {
    fn from(body: Bytes) -> NewEntry {
        NewEntry::new(body)
    }
}

/// What `append` assigned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    /// The entry id within the ledger (dense, from 0).
    pub entry: u64,
    /// Pass to [`EntryLog::wait_durable`]. Monotonic within one open log; not
    /// persisted, not comparable across restarts.
    pub lsn: u64,
}

/// What `open` found and did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recovery {
    /// A clean-shutdown marker matched the checkpoint: no scan was needed.
    pub clean: bool,
    /// The log position after the last valid batch: where appends go on.
    pub tail: u64,
    /// Bytes of log read by the scan (0 when clean).
    pub scanned_bytes: u64,
    /// Bytes of torn tail zeroed.
    pub truncated_bytes: u64,
    /// Entry records replayed from the log into the index.
    pub entries_replayed: u64,
    pub elapsed: Duration,
    /// Every ledger known to the log with its next entry id, sorted by ledger.
    pub ledgers: Vec<(u64, u64)>,
    /// What `LogConfig::accept_data_loss` dropped, one line per finding
    /// (also logged at `error`); empty without damage.
    pub dropped: Vec<String>,
    /// Damaged index files or checkpoint that were rebuilt (from the log,
    /// or from `checkpoint.copy`), one line each (also logged at `warn`).
    pub rebuilt: Vec<String>,
}

/// One shard's entry log handle. Single-threaded: owned by the shard's glommio
/// executor and never crosses cores. Cheap to clone (an `Rc` inside); all
/// clones are the same log.
///
/// `D` is the disk backend; `EntryLog` (no parameter) is the production one on
/// glommio DMA files. Tests use `EntryLog<SimDisk>`.
pub struct EntryLog<D: Disk = DmaDisk> {
    pub(crate) sh: Rc<Shared<D>>,
}

impl<D: Disk> Clone for EntryLog<D> {
    fn clone(&self) -> Self {
        EntryLog { sh: self.sh.clone() }
    }
}

impl<D: Disk> std::fmt::Debug for EntryLog<D> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryLog").field("dir", &self.sh.cfg.dir).finish()
    }
}

pub(crate) struct Paths {
    pub dir: PathBuf,
    pub log_dir: PathBuf,
    pub index_dir: PathBuf,
    pub keys_dir: PathBuf,
    pub checkpoint: PathBuf,
    pub checkpoint_tmp: PathBuf,
    /// A second copy of `checkpoint`, written after it (docs/format.md).
    pub checkpoint_copy: PathBuf,
    pub checkpoint_copy_tmp: PathBuf,
    pub clean: PathBuf,
}

impl Paths {
    pub fn new(dir: &Path) -> Paths {
        Paths {
            dir: dir.to_path_buf(),
            log_dir: dir.join("log"),
            index_dir: dir.join("index"),
            keys_dir: dir.join("keys"),
            checkpoint: dir.join("checkpoint"),
            checkpoint_tmp: dir.join("checkpoint.tmp"),
            checkpoint_copy: dir.join("checkpoint.copy"),
            checkpoint_copy_tmp: dir.join("checkpoint.copy.tmp"),
            clean: dir.join("CLEAN"),
        }
    }
    pub fn segment(&self, start: u64) -> PathBuf {
        self.log_dir.join(format!("{start:020}.seg"))
    }
    pub fn index(&self, ledger: u64) -> PathBuf {
        self.index_dir.join(format!("{ledger:020}.idx"))
    }
}

pub(crate) struct Segment<F> {
    pub start: u64,
    pub len: u64,
    pub path: PathBuf,
    pub file: F,
    /// A recycled file: the space behind the tail holds stale bytes of an
    /// earlier use, not zeros (batches written into it say so in their
    /// header, `BATCH_FLAG_OVER_STALE`).
    pub recycled: std::cell::Cell<bool>,
}

impl<F> Segment<F> {
    pub fn end(&self) -> u64 {
        self.start + self.len
    }
}

/// [`EntryLog::index_cache_stats`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexCacheStats {
    /// Bytes the cached pages are charged (entries plus overhead).
    pub bytes: usize,
    /// `LogConfig::index_cache_bytes` (the cache holds at least one page).
    pub max_bytes: usize,
    pub pages: usize,
    /// Lookups of index-file entries served from the cache.
    pub hits: u64,
    /// Index pages read from disk.
    pub loads: u64,
    /// Index entries laid out and not yet in index files, held in memory
    /// beside the cache until a checkpoint writes their pages
    /// (`LogConfig::recent_index_bytes`). Counted over every ledger.
    pub recent_entries: u64,
}

pub(crate) struct Ledger {
    pub next_entry: u64,
    /// Entries `file_entries..` laid out in a batch (written or in flight)
    /// and not yet in the index file, by entry id.
    pub recent: Vec<IndexEntry>,
    /// Entries 0..file_entries are in the index file, in file_pages pages
    /// (`pages` sums them up; the pages themselves are read on demand).
    pub file_entries: u64,
    pub file_pages: u64,
    pub pages: Vec<crate::pages::PageSum>,
    /// Body bytes of the laid-out entries.
    pub bytes: u64,
    /// The ledger's index file exists (pages were written to it, or
    /// recovery found it). It is opened on demand through the shard's
    /// bounded set of open index files (`State::index_fds`), never held per
    /// ledger: a shard may have more ledgers than the process may open files.
    pub has_index_file: bool,
    /// `delete_ledger` was called: `Some(None)` until its record is laid out
    /// in a batch, then `Some(Some(position))`. The ledger stays in the
    /// checkpoint (and its segments stay) until a checkpoint covers that
    /// position, so a crash before the deletion is durable loses nothing.
    pub deleted: Option<Option<u64>>,
}

impl Ledger {
    pub fn new() -> Self {
        Ledger {
            next_entry: 0,
            recent: Vec::new(),
            file_entries: 0,
            file_pages: 0,
            pages: Vec::new(),
            bytes: 0,
            has_index_file: false,
            deleted: None,
        }
    }

    /// Entries laid out in a batch: in the index file or in `recent`.
    pub fn laid_out(&self) -> u64 {
        self.file_entries + self.recent.len() as u64
    }
}

/// Where the index entry of laid-out entry `entry` of `ledger` is.
pub(crate) enum Lookup {
    Found(IndexEntry),
    /// In a page of the ledger's index file that is not in the cache.
    Page,
    /// Not laid out (or no such ledger).
    None,
}

/// The index entry of `ledger:entry` from memory: the ledger's recent
/// entries, compaction's relocations, or the index page cache (marking the
/// page used).
pub(crate) fn lookup<F>(st: &mut State<F>, ledger: u64, entry: u64) -> Lookup {
    let (found, page) = find(st, ledger, entry);
    if let Some(p) = page {
        st.icache.touch(ledger, p);
    }
    found
}

/// [`lookup`] leaving the cache's eviction order alone (background work).
pub(crate) fn peek<F>(st: &State<F>, ledger: u64, entry: u64) -> Lookup {
    find(st, ledger, entry).0
}

/// [`lookup`]'s answer, and the cached page it came from.
fn find<F>(st: &State<F>, ledger: u64, entry: u64) -> (Lookup, Option<u64>) {
    let Some(l) = st.ledgers.get(&ledger) else { return (Lookup::None, None) };
    if entry >= l.file_entries {
        return match usize::try_from(entry - l.file_entries).ok().and_then(|i| l.recent.get(i)) {
            Some(e) => (Lookup::Found(*e), None),
            None => (Lookup::None, None),
        };
    }
    if let Some(e) = st.relocated.get(&(ledger, entry)) {
        return (Lookup::Found(*e), None);
    }
    let Some(p) = crate::pages::page_of(&l.pages, entry) else { return (Lookup::None, None) };
    let first = l.pages[p].first_entry;
    match st.icache.peek(ledger, p as u64) {
        Some(es) => match es.get((entry - first) as usize) {
            Some(e) => (Lookup::Found(*e), Some(p as u64)),
            None => (Lookup::None, None),
        },
        None => (Lookup::Page, None),
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Mode {
    Open,
    Closing,
    Closed,
    Failed,
}

enum PendingKind {
    Entry {
        ledger: u64,
        entry: u64,
        body: Bytes,
        /// The body's CRC-32 when the caller had it (`NewEntry::body_crc`).
        body_crc: Option<u32>,
        extras: IndexExtras,
    },
    Meta {
        key: Bytes,
        value: Bytes,
    },
    Delete {
        ledger: u64,
    },
    /// A compaction copy of `ledger:entry`, whose record is at `from` now.
    Move {
        ledger: u64,
        entry: u64,
        body: Bytes,
        extras: IndexExtras,
        from: u64,
    },
}

struct Pending {
    lsn: u64,
    kind: PendingKind,
}

impl Pending {
    fn body_len(&self) -> usize {
        match &self.kind {
            PendingKind::Entry { body, .. } | PendingKind::Move { body, .. } => body.len(),
            PendingKind::Meta { key, value } => 2 + key.len() + value.len(),
            PendingKind::Delete { .. } => 0,
        }
    }
}

pub(crate) struct State<F> {
    pub mode: Mode,
    next_lsn: u64,
    durable_lsn: u64,
    pending: VecDeque<Pending>,
    pending_bytes: u64,
    pub ledgers: HashMap<u64, Ledger>,
    /// Appended entries, kept until durable and over `write_cache_bytes`.
    cache: crate::cache::WriteCache,
    /// Read cache: entries read from disk (and read ahead), FIFO-evicted.
    rcache: crate::cache::ReadCache,
    /// The last [`SPANS_KEPT`](crate::spans::SPANS_KEPT) stretches of log that [`EntryLog::read_run`]
    /// read from disk.
    spans: KeptSpans,
    /// Last entry read from disk per ledger, to detect sequential reads.
    last_disk_read: HashMap<u64, u64>,
    /// Decoded ledger index pages (`LogConfig::index_cache_bytes`).
    pub icache: crate::pages::IndexCache,
    /// The open index files (bounded; see `Ledger::has_index_file`).
    pub index_fds: crate::pages::OpenIndexFiles<F>,
    /// Reads served from the read cache, and disk reads issued (counters).
    pub rcache_hits: u64,
    pub disk_reads: u64,
    /// Metadata including appends not yet durable (what readers see).
    pub meta: BTreeMap<Vec<u8>, Bytes>,
    /// Metadata as of the durable log position (what a checkpoint saves).
    pub meta_durable: BTreeMap<Vec<u8>, Bytes>,
    pub segments: BTreeMap<u64, Rc<Segment<F>>>,
    /// Freed segments kept for recycling, under their old names (which lie
    /// before the checkpoint position and hold nothing live), oldest first.
    pub recycle_pool: Vec<PathBuf>,
    /// Segments made by recycling since open (a counter).
    pub recycled: u64,
    /// Below this log position the tail segment's blocks are known written
    /// (batches, zeros from the zeroing task, or a recycled segment's whole
    /// length): writes there overwrite instead of converting unwritten
    /// extents. The flusher writes at or beyond it only holding `zero_lock`.
    pub zeroed: u64,
    /// Moving average of the flusher's batch length (bytes).
    pub avg_batch: u64,
    /// Which batches take the blocking lone path (`LONE_BATCH_BYTES_MAX`).
    pub lone: LonePolicy,
    pub zero_waker: Option<Waker>,
    /// Bytes zeroed ahead since open (a counter).
    pub zeroed_bytes: u64,
    /// What the flusher wrote and synced since open ([`FlushStats`]).
    pub flush: FlushStats,
    /// Live (not deleted) entries and their bytes per segment, from the
    /// index: garbage collection and compaction go by it.
    pub live: crate::live::SegLive,
    /// `live` holds the entries in index files too: counted after open, in
    /// the background (`recovery::count_live_in_files`). Garbage collection
    /// and compaction wait for it.
    pub live_counted: bool,
    live_waiters: Vec<Waker>,
    /// A checkpoint skipped its garbage collection (the live counts were
    /// not in): the next checkpoint runs even if nothing became durable
    /// since, so that a quiet log still frees what deletions released.
    gc_owed: bool,
    /// Entries moved by compaction after their index page was written: the
    /// index file keeps the old position, every checkpoint carries these.
    /// Only durable positions; dropped with the ledger.
    pub relocated: BTreeMap<(u64, u64), IndexEntry>,
    /// Ledgers whose deletion record was laid out at this log position;
    /// their index files go once a checkpoint covers the position.
    pub deleted_at: Vec<(u64, u64)>,
    /// Where the next batch goes; everything before it is durable.
    pub tail: u64,
    pub next_seq: u64,
    pub ckpt_seq: u64,
    pub ckpt_position: Option<u64>,
    /// Index entries laid out since the last checkpoint took its snapshot
    /// (`LogConfig::recent_index_bytes`).
    laid_since_ckpt: u64,
    durable_waiters: BTreeMap<u64, Vec<Waker>>,
    flusher_waker: Option<Waker>,
    flusher_done: bool,
    close_wakers: Vec<Waker>,
    ckpt_waker: Option<Waker>,
}

impl<F> State<F> {
    pub fn new() -> Self {
        State {
            mode: Mode::Open,
            next_lsn: 1,
            durable_lsn: 0,
            pending: VecDeque::new(),
            pending_bytes: 0,
            ledgers: HashMap::new(),
            cache: crate::cache::WriteCache::default(),
            rcache: crate::cache::ReadCache::default(),
            spans: KeptSpans::default(),
            last_disk_read: HashMap::new(),
            icache: crate::pages::IndexCache::new(64 << 20),
            index_fds: crate::pages::OpenIndexFiles::new(crate::pages::INDEX_FILES_OPEN_MAX),
            rcache_hits: 0,
            disk_reads: 0,
            meta: BTreeMap::new(),
            meta_durable: BTreeMap::new(),
            segments: BTreeMap::new(),
            recycle_pool: Vec::new(),
            recycled: 0,
            zeroed: 0,
            avg_batch: 0,
            lone: LonePolicy::default(),
            zero_waker: None,
            zeroed_bytes: 0,
            flush: FlushStats::default(),
            live: crate::live::SegLive::default(),
            live_counted: true,
            live_waiters: Vec::new(),
            gc_owed: false,
            relocated: BTreeMap::new(),
            deleted_at: Vec::new(),
            tail: 0,
            next_seq: 0,
            ckpt_seq: 0,
            ckpt_position: None,
            laid_since_ckpt: 0,
            durable_waiters: BTreeMap::new(),
            flusher_waker: None,
            flusher_done: false,
            close_wakers: Vec::new(),
            ckpt_waker: None,
        }
    }

    fn wake_all(&mut self) {
        for (_, ws) in std::mem::take(&mut self.durable_waiters) {
            ws.into_iter().for_each(Waker::wake);
        }
        for w in [self.flusher_waker.take(), self.ckpt_waker.take(), self.zero_waker.take()]
            .into_iter()
            .flatten()
            .chain(std::mem::take(&mut self.close_wakers))
        {
            w.wake();
        }
        self.wake_live_waiters();
    }

    pub(crate) fn wake_live_waiters(&mut self) {
        std::mem::take(&mut self.live_waiters).into_iter().for_each(Waker::wake);
    }

    /// Queues a compaction copy (see `compact.rs`); returns its lsn.
    pub(crate) fn push_move(&mut self, ledger: u64, entry: u64, body: Bytes, extras: IndexExtras, from: u64) -> u64 {
        let lsn = self.next_lsn;
        self.next_lsn += 1;
        self.pending_bytes += body.len() as u64;
        self.pending.push_back(Pending { lsn, kind: PendingKind::Move { ledger, entry, body, extras, from } });
        self.wake_flusher();
        lsn
    }

    /// Moves one entry's liveness (`bytes` of record) from the segment
    /// holding `from` to the one holding `to`: both must exist (a segment
    /// goes only once nothing in it is live).
    pub(crate) fn shift_live(&mut self, from: Option<u64>, to: Option<u64>, bytes: u64) {
        if let Some(p) = from {
            let start = self.segment_start(p);
            self.live.remove(start, bytes);
        }
        if let Some(p) = to {
            let start = self.segment_start(p);
            self.live.add(start, 1, bytes);
        }
    }

    /// The start of the segment holding log position `p`, which must be in one.
    fn segment_start(&self, p: u64) -> u64 {
        self.segment_at(p).unwrap_or_else(|| panic!("log position {p} is in no segment")).start
    }

    fn wake_flusher(&mut self) {
        if let Some(w) = self.flusher_waker.take() {
            w.wake();
        }
    }

    /// Drops the oldest cached entries while over the bound, but never one
    /// that is not durable yet: it exists nowhere else.
    fn evict(&mut self, bound: usize) {
        self.cache.evict(bound, self.durable_lsn);
    }

    pub fn segment_at(&self, position: u64) -> Option<&Rc<Segment<F>>> {
        self.segments.range(..=position).next_back().map(|(_, s)| s).filter(|s| position < s.end())
    }
}

pub(crate) struct Shared<D: Disk> {
    pub disk: D,
    pub cfg: LogConfig,
    pub entry_max: u64,
    pub paths: Paths,
    pub st: RefCell<State<D::File>>,
    /// Serializes checkpoints (the periodic task and `close`).
    pub ckpt_lock: glommio::sync::Semaphore,
    /// Serializes compaction passes (the background task and `compact`).
    pub compact_lock: glommio::sync::Semaphore,
    /// Held by the zeroing task for each zeroing write, and by the flusher
    /// for a batch that reaches `State::zeroed`: a batch is never written
    /// where a zeroing write is in flight (it could land after the batch).
    pub zero_lock: glommio::sync::Semaphore,
    /// The per-shard key index (`keyindex.rs`).
    pub keys: RefCell<crate::keyindex::KeyIndex<D::File>>,
    /// The last creation of the next segment failed for lack of space and
    /// is being retried (`create_segment_retrying`); cleared once one succeeds.
    pub space_short: std::cell::Cell<bool>,
    /// The last checkpoint failed for lack of space (logged once).
    pub ckpt_short: std::cell::Cell<bool>,
    /// The checkpoint's copy is older than the checkpoint (its write
    /// failed): the next checkpoint is written even with nothing new, so
    /// the copy and garbage collection catch up.
    pub copy_stale: std::cell::Cell<bool>,
}

impl<D: Disk> Drop for Shared<D> {
    fn drop(&mut self) {
        // Background tasks hold only Weak references and sleep on these
        // wakers: wake them so they notice the log is gone and exit.
        self.st.get_mut().wake_all();
    }
}

/// Ledgers whose index pages a checkpoint writes and syncs at once.
const INDEX_WRITES_IN_FLIGHT: usize = 32;

/// Memory a cached entry takes beyond its body: its map slot (key and
/// `Bytes`, at the map's load factor), its FIFO slot and the body's
/// allocation header. Charged with the body against the write and read cache
/// bounds, so that they bound memory and not only body bytes: with small
/// entries the overhead is most of it.
pub const CACHED_ENTRY_OVERHEAD: usize = 128;

impl<D: Disk> Shared<D> {
    /// Enters fail-stop: every waiter and every later append gets an error.
    /// Nothing is retried: after a failed write or fsync the kernel may have
    /// dropped the dirty data, so acknowledging anything later would lie.
    /// A checkpoint now (not the clean one). One that found no space is
    /// logged (once until one succeeds) and left for the next try; any other
    /// failure puts the log in fail-stop.
    pub(crate) async fn checkpoint_or_fail(&self) -> Result<()> {
        let r = self.checkpoint(false).await;
        match &r {
            Ok(()) => {
                if self.ckpt_short.replace(false) {
                    info!(dir = %self.cfg.dir.display(), "checkpoint written again after a lack of space");
                }
            }
            Err(StorageError::Closed) => {}
            Err(e) if checkpoint_short_of_space(e) && self.st.borrow().mode == Mode::Open => {
                if !self.ckpt_short.replace(true) {
                    warn!(
                        dir = %self.cfg.dir.display(), error = %e,
                        "no space for a checkpoint: the log goes on and the checkpoint is tried again"
                    );
                }
            }
            Err(e) => self.fail(e),
        }
        r
    }

    pub(crate) fn fail(&self, err: &StorageError) {
        let mut st = self.st.borrow_mut();
        if st.mode != Mode::Failed {
            error!(dir = %self.cfg.dir.display(), error = %err, "entry log failed; fail-stop until restart");
        }
        st.mode = Mode::Failed;
        st.wake_all();
    }

    /// Resolves once `State::live` counts the entries in index files too
    /// (at once but after open); `Failed` if the log failed first.
    pub(crate) async fn live_counted(&self) -> Result<()> {
        poll_fn(|cx| {
            let mut st = self.st.borrow_mut();
            if st.live_counted {
                Poll::Ready(Ok(()))
            } else if st.mode == Mode::Failed {
                Poll::Ready(Err(StorageError::Failed))
            } else {
                st.live_waiters.push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await
    }

    fn io(&self, op: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> StorageError {
        let path = path.to_path_buf();
        move |e| StorageError::io(op, path, e)
    }

    async fn create_segment(&self, start: u64) -> Result<Rc<Segment<D::File>>> {
        let path = self.paths.segment(start);
        let len = self.cfg.segment_bytes;
        let recycled = self.st.borrow_mut().recycle_pool.pop();
        if let Some(old) = recycled {
            // A freed segment, renamed into place. Its size is durable since
            // its creation; the rename must be durable before a batch in it
            // is acknowledged (a crash before that leaves the old name: an
            // unreferenced segment before the checkpoint, freed again by the
            // next one; or the new name with no valid batch of this use:
            // removed at open as an unused spare).
            self.disk.rename(&old, &path).await.map_err(self.io("rename recycled segment", &old))?;
            self.disk
                .sync_dir(&self.paths.log_dir)
                .await
                .map_err(self.io("fsync log directory", &self.paths.log_dir))?;
            let file =
                self.disk.open(&path, OpenMode::Existing).await.map_err(self.io("open recycled segment", &path))?;
            let size = file.size().await.map_err(self.io("stat recycled segment", &path))?;
            assert_eq!(size, len, "only segments of the configured size are pooled");
            self.st.borrow_mut().recycled += 1;
            debug!(from = %old.display(), path = %path.display(), start, len, "recycled segment");
            return Ok(Rc::new(Segment { start, len, path, file, recycled: true.into() }));
        }
        // Truncate: a file of this name can only be left over from a crash
        // during an earlier creation, or a creation that ran out of space,
        // before any batch reached it.
        let file = match self.disk.open(&path, OpenMode::Truncate).await {
            Ok(f) => f,
            Err(e) if is_no_space(&e) => return Err(StorageError::NoSpace { path, source: e }),
            Err(e) => return Err(self.io("create segment", &path)(e)),
        };
        if let Err(e) = file.allocate(len).await {
            if is_no_space(&e) {
                // Whatever part was reserved goes back to the filesystem
                // (it holds no batch), so the retry and everyone else have it.
                if let Err(t) = file.truncate(0).await {
                    warn!(path = %path.display(), "cannot release a segment's partial reservation: {t}");
                }
                return Err(StorageError::NoSpace { path, source: e });
            }
            return Err(self.io("preallocate segment", &path)(e));
        }
        if self.cfg.prezero_segments {
            // 1 MiB at a time (a multiple of the page size; segment_bytes is
            // one too, so the last chunk is page-aligned as well).
            let zeros = vec![0u8; (1 << 20).min(len as usize)];
            let mut pos = 0;
            while pos < len {
                let n = zeros.len().min((len - pos) as usize);
                file.write_at(pos, &zeros[..n]).await.map_err(self.io("zero new segment", &path))?;
                pos += n as u64;
            }
        }
        // Size and name must be durable before a batch in this segment is
        // acknowledged, or recovery could not find the batch.
        file.sync().await.map_err(self.io("fdatasync new segment", &path))?;
        self.disk.sync_dir(&self.paths.log_dir).await.map_err(self.io("fsync log directory", &self.paths.log_dir))?;
        debug!(path = %path.display(), start, len, "created segment");
        Ok(Rc::new(Segment { start, len, path, file, recycled: false.into() }))
    }

    /// Writes one group-commit batch: everything pending up to
    /// flush_bytes_max, one write at the tail, one fdatasync. The steps, in
    /// order: [`plan_batch`](Self::plan_batch), [`roll`](Self::roll) when
    /// the batch does not fit the tail segment, [`lay_out`](Self::lay_out),
    /// [`write_batch`](Self::write_batch), [`publish_durable`](Self::publish_durable).
    async fn flush_one(&self, spare: &mut Option<Spare<D::File>>) -> Result<()> {
        let plan = self.plan_batch();
        if let Some(start) = plan.roll_at {
            self.roll(start, plan.batch_len, spare).await?;
        }
        let (buf, batch) = self.lay_out(plan);
        let flush_us = self.write_batch(buf, &batch).await?;
        self.publish_durable(batch, flush_us)
    }

    /// Takes the batch: how many pending records go in (at least one; more
    /// while the batch stays within `flush_bytes_max`), its length padded to
    /// whole pages, and whether it needs a new segment (it never straddles
    /// two: it goes to the next one when the tail segment cannot hold it).
    fn plan_batch(&self) -> BatchPlan {
        let st = self.st.borrow();
        let mut size = BATCH_HEADER_BYTES;
        let mut count = 0usize;
        for p in &st.pending {
            let rec = RECORD_HEADER_BYTES + p.body_len();
            if count > 0 && size + rec > self.cfg.flush_bytes_max {
                break;
            }
            size += rec;
            count += 1;
        }
        assert!(count > 0);
        let batch_len = pad_to_page(size as u64);
        assert!(batch_len <= self.cfg.segment_bytes);
        let roll_at = match st.segment_at(st.tail) {
            None => Some(st.tail),
            Some(seg) => (st.tail + batch_len > seg.end()).then(|| seg.end()),
        };
        BatchPlan { count, batch_len, roll_at }
    }

    /// Moves the tail to a new segment starting at `start` (the end of the
    /// tail segment, or the tail when there is none), the spare made ahead
    /// of time when it is the one. The rest of the previous segment is
    /// zero (a recycled one is zeroed here): recovery and the inspector
    /// know a batch that did not fit moved to the next one.
    async fn roll(&self, start: u64, batch_len: u64, spare: &mut Option<Spare<D::File>>) -> Result<()> {
        // The segment the tail leaves is written no more.
        let (prev, tail) = {
            let st = self.st.borrow();
            (st.segment_at(start.saturating_sub(1)).cloned(), st.tail)
        };
        if let Some(prev) = prev {
            self.zero_rest(&prev, tail).await?;
            prev.file.writes_done();
        }
        // Open removes every segment at or after the tail, so none exists here.
        assert!(!self.st.borrow().segments.contains_key(&start));
        let seg = match spare.take() {
            // Usually made ahead of time, so the roll costs nothing.
            Some((s, task)) if s == start => match task.await {
                Some(r) => r?,
                None => self.create_segment(start).await?,
            },
            other => {
                *spare = other;
                self.create_segment(start).await?
            }
        };
        assert!(seg.len >= batch_len);
        let mut st = self.st.borrow_mut();
        // Recycled and pre-zeroed segments are written all through.
        st.zeroed = if seg.recycled.get() || self.cfg.prezero_segments { seg.end() } else { start };
        st.segments.insert(start, seg);
        st.tail = start;
        Ok(())
    }

    /// Zeroes `[tail, end)` of the recycled segment `seg` that the tail
    /// leaves, durably, before any batch goes to the next segment. Those
    /// bytes are its earlier use's, and not all of them say so: the body
    /// pages of a stale batch whose header a batch of this use overwrote
    /// carry no header. While the next segment is there, its first batch
    /// shows that the one that did not fit went there; once garbage
    /// collection removed it, a walk of the whole log (`inspect --verify`)
    /// meets this rest, a gap, then a later batch, and only zeros say that
    /// nothing was written here (other bytes could be a damaged batch of
    /// acknowledged records). Fallocated segments read as zeros there
    /// already. The rest is shorter than the batch that did not fit.
    async fn zero_rest(&self, seg: &Segment<D::File>, tail: u64) -> Result<()> {
        assert!(seg.start <= tail && tail <= seg.end());
        if !seg.recycled.get() || tail == seg.end() {
            return Ok(());
        }
        let zeros = vec![0u8; (seg.end() - tail) as usize];
        seg.file
            .write_at(tail - seg.start, &zeros)
            .await
            .map_err(self.io("zero rest of recycled segment", &seg.path))?;
        seg.file.sync().await.map_err(self.io("fdatasync rest of recycled segment", &seg.path))
    }

    /// Lays the planned records out at the tail, header last, into the
    /// buffer the disk writes from. Takes them off `pending` (which only
    /// grows at the back meanwhile) and lays entries out in their ledgers'
    /// `recent` index and the segment's live counts now; what must wait for
    /// durability (metadata's durable view, compaction moves, the tail and
    /// seq) is returned for [`publish_durable`](Self::publish_durable).
    fn lay_out(&self, plan: BatchPlan) -> (<D::File as DiskFile>::Buf, LaidOut<D::File>) {
        let BatchPlan { count, batch_len, .. } = plan;
        let mut st = self.st.borrow_mut();
        let st = &mut *st;
        let position = st.tail;
        let seq = st.next_seq;
        let seg = st.segment_at(position).cloned().expect("tail segment exists after roll");
        assert!(position + batch_len <= seg.end());
        // Laid out straight into the buffer the disk writes from (for
        // O_DIRECT, DMA-able memory): no zeroed heap buffer (a fresh mmap
        // and its page faults per flush at these sizes) and no copy into
        // a DMA buffer after. Not zeroed: every byte is written below.
        let mut dma = seg.file.alloc_buf(batch_len as usize);
        let buf = dma.as_mut();
        assert_eq!(buf.len(), batch_len as usize);
        let mut off = BATCH_HEADER_BYTES;
        // The body checksum, built as records are laid out: a large
        // record's bytes are not read a second time (see `BodyCrc`).
        let mut body_crc = crate::format::BodyCrc::new();
        let mut last_lsn = 0;
        let mut metas = Vec::new();
        let mut moves = Vec::new();
        let mut keys = self.keys.borrow_mut();
        let mut last_ledger = None;
        for _ in 0..count {
            let p = st.pending.pop_front().expect("counted above");
            st.pending_bytes -= p.body_len() as u64;
            assert!(p.lsn > last_lsn);
            last_lsn = p.lsn;
            let body_len = p.body_len();
            let (hdr, body) = buf[off..].split_at_mut(RECORD_HEADER_BYTES);
            match p.kind {
                PendingKind::Entry { ledger, entry, body: data, body_crc: data_crc, extras } => {
                    body[..body_len].copy_from_slice(&data);
                    let crc = match data_crc {
                        Some(c) => {
                            RecordHeader::encode_with_body_crc(hdr, KIND_ENTRY, ledger, entry, extras, body_len, c)
                        }
                        None => RecordHeader::encode(hdr, KIND_ENTRY, ledger, entry, extras, &[&data]),
                    };
                    body_crc.record(buf, off, crc, body_len);
                    let l = st.ledgers.get_mut(&ledger).expect("appended ledger exists");
                    assert_eq!(l.laid_out(), entry, "entries laid out in order");
                    if last_ledger != Some(ledger) {
                        // Its key index upkeep has entries to add.
                        keys.behind.insert(ledger);
                        last_ledger = Some(ledger);
                    }
                    l.recent.push(IndexEntry {
                        position: position + off as u64,
                        body_len: body_len as u32,
                        record_crc: crc,
                        extras,
                    });
                    st.laid_since_ckpt += 1;
                    l.bytes += body_len as u64;
                    st.live.add(seg.start, 1, (RECORD_HEADER_BYTES + body_len) as u64);
                }
                PendingKind::Move { ledger, entry, body: data, extras, from } => {
                    body[..body_len].copy_from_slice(&data);
                    let crc = RecordHeader::encode(hdr, KIND_MOVE, ledger, entry, extras, &[&data]);
                    body_crc.record(buf, off, crc, body_len);
                    let to = IndexEntry {
                        position: position + off as u64,
                        body_len: body_len as u32,
                        record_crc: crc,
                        extras,
                    };
                    moves.push((ledger, entry, from, to));
                }
                PendingKind::Meta { key, value } => {
                    let klen = (key.len() as u16).to_le_bytes();
                    body[..2].copy_from_slice(&klen);
                    body[2..2 + key.len()].copy_from_slice(&key);
                    body[2 + key.len()..body_len].copy_from_slice(&value);
                    RecordHeader::encode(hdr, KIND_META, 0, 0, IndexExtras::default(), &[&klen, &key, &value]);
                    metas.push((key, value));
                }
                PendingKind::Delete { ledger } => {
                    RecordHeader::encode(hdr, KIND_DELETE, ledger, 0, IndexExtras::default(), &[]);
                    let at = position + off as u64;
                    if let Some(l) = st.ledgers.get_mut(&ledger) {
                        l.deleted = Some(Some(at));
                    }
                    st.deleted_at.push((ledger, at));
                }
            }
            off += RECORD_HEADER_BYTES + body_len;
        }
        let records_len = (off - BATCH_HEADER_BYTES) as u32;
        // The page padding after the last record (covered by body_crc).
        buf[off..].fill(0);
        let body_crc = body_crc.finish(buf);
        BatchHeader {
            batch_len: batch_len as u32,
            record_count: count as u32,
            seq,
            position,
            records_len,
            body_crc,
            flags: if seg.recycled.get() { BATCH_FLAG_OVER_STALE } else { 0 },
            segment_len: seg.len,
        }
        .encode(buf);
        (dma, LaidOut { seg, position, seq, count, batch_len, last_lsn, metas, moves })
    }

    /// One write, one fdatasync; returns the microseconds they took. Only
    /// this task writes the log, so at most this batch can be torn by a
    /// crash. (Not one O_DSYNC write instead, to save the flusher's wake-up
    /// between the two: on ext4 that is far slower; bench/RESULTS.md, "Where
    /// a lone message's time goes".) Nothing is acknowledged here.
    async fn write_batch(&self, buf: <D::File as DiskFile>::Buf, b: &LaidOut<D::File>) -> Result<u64> {
        let (seg, batch_len) = (&b.seg, b.batch_len);
        let off = b.position - seg.start;
        let end = b.position + batch_len;
        // Into space not known written: wait for a zeroing write in flight.
        // (Not one O_DSYNC write for a batch wholly in written space either:
        // no faster than write + fdatasync; bench/RESULTS.md, "Recycled and
        // zeroed-ahead segments".)
        let zero_permit = if end <= self.st.borrow().zeroed {
            None
        } else {
            Some(self.zero_lock.acquire_permit(1).await.map_err(|_| StorageError::Closed)?)
        };
        // A lone small batch in a run of them (one producer, one message in
        // flight): the write and the fdatasync as one request that blocks
        // this thread (`DiskFile::write_and_sync`), which has nothing else
        // to do meanwhile. Never for batches of several records: blocking
        // would stop the shard from reading the next batch's messages while
        // the disk works. Which batches go so: `lone::LonePolicy`.
        let sync_max = self.cfg.lone_sync_max;
        let route = self.st.borrow_mut().lone.decide(b.count, batch_len, sync_max);
        crate::stage::mark("4b_write_submit");
        let began = std::time::Instant::now();
        if route == Route::Lone {
            seg.file
                .write_and_sync(off, buf.as_ref())
                .await
                .map_err(self.io("write and fdatasync batch", &seg.path))?;
        } else {
            // The write and the fdatasync as one linked request the shard
            // awaits (one wake-up per batch, not two), running other tasks
            // meanwhile.
            seg.file.write_buf_and_sync(off, buf).await.map_err(self.io("write and fdatasync batch", &seg.path))?;
        }
        let took = began.elapsed();
        {
            let mut st = self.st.borrow_mut();
            st.zeroed = st.zeroed.max(end);
            st.avg_batch = if st.avg_batch == 0 { batch_len } else { (st.avg_batch * 7 + batch_len) / 8 };
            if st.lone.observe(route, took, sync_max) {
                tracing::debug!(
                    took_us = took.as_micros() as u64,
                    "a lone batch's write and fdatasync were slow: the next batches go through the reactor"
                );
            }
        }
        drop(zero_permit);
        crate::stage::mark("6_synced");
        Ok(began.elapsed().as_micros() as u64)
    }

    /// The batch is durable: the tail and seq move past it, its metadata
    /// joins the durable view and its compaction moves the index, the
    /// zeroer is woken when the tail nears the zeroed space, and then (only
    /// then) the waiters of every lsn up to its last are woken. Unless a
    /// checkpoint failed meanwhile: then nothing is acknowledged.
    fn publish_durable(&self, b: LaidOut<D::File>, flush_us: u64) -> Result<()> {
        let LaidOut { position, seq, count, batch_len, last_lsn, metas, moves, .. } = b;
        let mut st = self.st.borrow_mut();
        if st.mode == Mode::Failed {
            // A checkpoint failed meanwhile: stay failed, acknowledge nothing.
            return Err(StorageError::Failed);
        }
        assert_eq!(st.tail, position);
        assert_eq!(st.next_seq, seq);
        st.tail = position + batch_len;
        st.next_seq = seq + 1;
        st.durable_lsn = last_lsn;
        st.flush.record(count as u64, batch_len, flush_us);
        st.lone.durable(count, batch_len);
        if !moves.is_empty() {
            apply_moves(&mut st, moves);
        }
        for (k, v) in metas {
            if v.is_empty() {
                st.meta_durable.remove(&k[..]);
            } else {
                st.meta_durable.insert(k.to_vec(), v);
            }
        }
        if self.cfg.zero_ahead_bytes > 0
            && st.zeroed < st.tail + self.cfg.zero_ahead_bytes / 2
            && st.avg_batch <= ZERO_AHEAD_BATCH_MAX
        {
            if let Some(w) = st.zero_waker.take() {
                w.wake();
            }
        }
        // Only now: a checkpoint covers durable entries alone.
        if recent_index_full(&self.cfg, st.laid_since_ckpt) {
            if let Some(w) = st.ckpt_waker.take() {
                w.wake();
            }
        }
        let later = st.durable_waiters.split_off(&(last_lsn + 1));
        let ready = std::mem::replace(&mut st.durable_waiters, later);
        for (_, ws) in ready {
            ws.into_iter().for_each(Waker::wake);
        }
        st.evict(self.cfg.write_cache_bytes);
        Ok(())
    }

    /// Writes index pages for everything durable and not yet in index files,
    /// then the checkpoint file (temp, fsync, rename, directory fsync). With
    /// `clean`, also the clean-shutdown marker naming this checkpoint.
    pub(crate) async fn checkpoint(&self, clean: bool) -> Result<()> {
        // Reading gone idle: the kept stretches go (no timer of their own;
        // a checkpoint comes every `checkpoint_interval`).
        self.st.borrow_mut().spans.release_if_idle(self.cfg.read_span_idle);
        let _permit = self.ckpt_lock.acquire_permit(1).await.map_err(|_| StorageError::Closed)?;
        struct Work {
            ledger: u64,
            first: u64,
            pages: u64,
            entries: Vec<IndexEntry>,
            /// The index file exists (else it is created).
            exists: bool,
        }
        let (position, next_seq, ckpt_seq, mut table, work, meta, relocations) = {
            let mut st = self.st.borrow_mut();
            if st.mode == Mode::Failed {
                return Err(StorageError::Failed);
            }
            // After close's clean checkpoint nothing may be written (the
            // clean marker names that checkpoint).
            if st.mode == Mode::Closed {
                return Err(StorageError::Closed);
            }
            let position = st.tail;
            // Whatever the outcome, the entries laid out so far are this
            // checkpoint's (or were not durable yet: the next one's).
            st.laid_since_ckpt = 0;
            let gc_due = st.gc_owed && st.live_counted;
            if !clean && st.ckpt_position == Some(position) && !self.copy_stale.get() && !gc_due {
                return Ok(()); // nothing became durable since the last one
            }
            let mut ids: Vec<u64> = st.ledgers.keys().copied().collect();
            ids.sort_unstable();
            let mut table = Vec::new();
            let mut work = Vec::new();
            for id in ids {
                let l = &st.ledgers[&id];
                if matches!(l.deleted, Some(Some(p)) if p < position) {
                    continue; // its deletion is durable and covered by this checkpoint
                }
                let k = durable_entries(l, position);
                assert!(k >= l.file_entries);
                if k == 0 {
                    continue;
                }
                table.push(CheckpointLedger { ledger: id, indexed_entries: k, pages: l.file_pages });
                if k > l.file_entries {
                    work.push(Work {
                        ledger: id,
                        first: l.file_entries,
                        pages: l.file_pages,
                        entries: l.recent[..(k - l.file_entries) as usize].to_vec(),
                        exists: l.has_index_file,
                    });
                }
            }
            let meta: Vec<(Vec<u8>, Vec<u8>)> = st.meta_durable.iter().map(|(k, v)| (k.clone(), v.to_vec())).collect();
            let listed: std::collections::HashSet<u64> = table.iter().map(|t| t.ledger).collect();
            let relocations: Vec<Relocation> = st
                .relocated
                .iter()
                .filter(|((ledger, _), _)| listed.contains(ledger))
                .map(|(&(ledger, entry), ie)| {
                    // Applied only once durable, so before the tail.
                    assert!(ie.position < position, "relocation {ledger}:{entry} at {} >= {position}", ie.position);
                    Relocation { ledger, entry, position: ie.position, record_crc: ie.record_crc }
                })
                .collect();
            (position, st.next_seq, st.ckpt_seq + 1, table, work, meta, relocations)
        };

        // Index pages, appended behind the log. A page is never rewritten:
        // each checkpoint starts a new page, so a crash while writing can only
        // damage pages no checkpoint refers to yet.
        // Ledgers' files are written and synced INDEX_WRITES_IN_FLIGHT at a
        // time: one after the other, a checkpoint after many topics were
        // made waits for as many fdatasyncs in turn.
        let write_pages = |w: Work| async move {
            let path = self.paths.index(w.ledger);
            let created = !w.exists;
            let file = if w.exists {
                self.index_file(w.ledger).await?
            } else {
                // (A rebuilt ledger's damaged file is truncated: pages
                // the old checkpoint named may be damaged by a crash
                // now, and are rebuilt from the log again.)
                let f = Rc::new(
                    self.disk.open(&path, OpenMode::Truncate).await.map_err(self.io("create index file", &path))?,
                );
                self.st.borrow_mut().index_fds.insert(w.ledger, f.clone());
                f
            };
            let mut pages = Vec::new();
            let mut first = w.first;
            let mut written = Vec::new();
            for chunk in w.entries.chunks(INDEX_ENTRIES_PER_PAGE) {
                pages.extend_from_slice(&encode_index_page(w.ledger, first, chunk));
                written.push((crate::pages::PageSum::of(first, chunk), Rc::<[IndexEntry]>::from(chunk)));
                first += chunk.len() as u64;
            }
            let new_pages = w.pages + pages.len() as u64 / PAGE_BYTES;
            file.write_at(w.pages * PAGE_BYTES, &pages).await.map_err(self.io("write index pages", &path))?;
            file.sync().await.map_err(self.io("fdatasync index file", &path))?;
            Ok::<_, StorageError>((w.ledger, first, new_pages, written, created))
        };
        let mut created = false;
        let mut opened = Vec::new();
        let mut writes = futures::stream::iter(work).map(write_pages).buffer_unordered(INDEX_WRITES_IN_FLIGHT);
        let mut failed = None;
        while let Some(done) = writes.next().await {
            // After a failure the writes in flight still run to their end
            // (their buffers stay theirs until the kernel is done), then the
            // first error is answered.
            let (ledger, first, new_pages, written, made) = match done {
                Ok(d) if failed.is_none() => d,
                Ok(_) => continue,
                Err(e) => {
                    failed.get_or_insert(e);
                    continue;
                }
            };
            created |= made;
            // `table` is in ledger order.
            if let Ok(i) = table.binary_search_by_key(&ledger, |t| t.ledger) {
                table[i].pages = new_pages;
            }
            opened.push((ledger, first, new_pages, written));
        }
        drop(writes);
        if let Some(e) = failed {
            return Err(e);
        }
        if created {
            self.disk
                .sync_dir(&self.paths.index_dir)
                .await
                .map_err(self.io("fsync index directory", &self.paths.index_dir))?;
        }

        let ckpt = Checkpoint { ckpt_seq, position, next_batch_seq: next_seq, ledgers: table, meta, relocations };
        let bytes = ckpt.encode();
        self.write_atomically(&self.paths.checkpoint_tmp, &self.paths.checkpoint, &bytes).await?;
        {
            let mut st = self.st.borrow_mut();
            let st = &mut *st;
            for (id, entries, pages, written) in opened {
                let l = st.ledgers.get_mut(&id).expect("ledgers are never removed");
                // The entries now in the file leave `recent`; their pages go
                // to the cache (readers near the tail still want them).
                let moved = entries - l.file_entries;
                l.recent.drain(..moved as usize);
                // A burst's capacity is not kept per ledger, nor is an
                // emptied one's (with many ledgers either adds up to more
                // than their entries).
                if l.recent.is_empty() || l.recent.capacity() > 2 * l.recent.len() + 16 {
                    l.recent.shrink_to(l.recent.len() * 2);
                }
                let first_page = l.pages.len() as u64;
                assert_eq!(first_page + written.len() as u64, pages, "one summary per valid page");
                l.file_entries = entries;
                l.file_pages = pages;
                l.has_index_file = true;
                for (i, (sum, es)) in written.into_iter().enumerate() {
                    l.pages.push(sum);
                    st.icache.insert(id, first_page + i as u64, es);
                }
            }
            st.ckpt_seq = ckpt_seq;
            st.ckpt_position = Some(position);
        }
        // The same bytes again under a second name, so that one damaged
        // file does not lose the metadata snapshot of segments garbage
        // collection removed. Garbage goes only after both are durable, so
        // either file (this checkpoint or, after a crash between the two,
        // the previous one) has every segment it needs. The state above
        // already follows the checkpoint (durable by now): a failure here
        // leaves a stale copy and no garbage collected, and the next
        // checkpoint appends its pages after this one's.
        self.copy_stale.set(true);
        self.write_atomically(&self.paths.checkpoint_copy_tmp, &self.paths.checkpoint_copy, &bytes).await?;
        self.copy_stale.set(false);
        if clean {
            let marker = CleanMarker { ckpt_seq, position, next_batch_seq: next_seq };
            let path = &self.paths.clean;
            let f = self.disk.open(path, OpenMode::Truncate).await.map_err(self.io("create clean marker", path))?;
            f.write_at(0, &marker.encode()).await.map_err(self.io("write clean marker", path))?;
            f.sync().await.map_err(self.io("fdatasync clean marker", path))?;
            self.disk.sync_dir(&self.paths.dir).await.map_err(self.io("fsync shard directory", &self.paths.dir))?;
        }
        // Garbage goes only now that a durable checkpoint no longer needs it.
        self.collect_garbage(position).await?;
        debug!(ckpt_seq, position, clean, "checkpoint written");
        Ok(())
    }

    /// Removes the index files of ledgers whose deletion record lies before
    /// `position` (the durable checkpoint's), and every segment that ends
    /// at or before it and holds no live entry: its metadata records are in
    /// the checkpoint's snapshot and its entries belong to deleted ledgers.
    /// A crash before the directory fsync may bring a name back; it is
    /// unreferenced, and removed again (index files at open, segments at the
    /// next checkpoint).
    /// Skipped until the live counts are in (`State::live_counted`): the
    /// next checkpoint collects then.
    async fn collect_garbage(&self, position: u64) -> Result<()> {
        {
            let mut st = self.st.borrow_mut();
            st.gc_owed = !st.live_counted;
            if st.gc_owed {
                debug!(position, "garbage collection waits for the live counts");
                return Ok(());
            }
        }
        // Deleted ledgers this checkpoint no longer lists: forget them.
        let (index_files, removed) = {
            let mut st = self.st.borrow_mut();
            let st = &mut *st;
            let (done, keep): (Vec<_>, Vec<_>) = st.deleted_at.drain(..).partition(|(_, p)| *p < position);
            st.deleted_at = keep;
            // A ledger id appended to again after its (empty) deletion is a
            // new ledger: leave it and its index file alone.
            let done: Vec<(u64, u64)> = done
                .into_iter()
                .filter(|(ledger, _)| {
                    st.ledgers.get(ledger).is_none_or(|l| matches!(l.deleted, Some(Some(q)) if q < position))
                })
                .collect();
            let mut removed = Vec::new();
            for (ledger, _) in &done {
                let l = st.ledgers.remove(ledger);
                let gone: Vec<(u64, u64)> =
                    st.relocated.range((*ledger, 0)..=(*ledger, u64::MAX)).map(|(k, _)| *k).collect();
                let mut moved = HashMap::new();
                for k in gone {
                    if let Some(ie) = st.relocated.remove(&k) {
                        moved.insert(k.1, ie);
                    }
                }
                st.icache.drop_ledger(*ledger);
                st.index_fds.remove(*ledger);
                if let Some(l) = l {
                    removed.push((*ledger, l, moved));
                }
            }
            (done, removed)
        };
        // Their entries no longer keep segments alive: walk their index
        // files a few pages at a time (a checkpoint holds `ckpt_lock`, so
        // no other garbage collection runs meanwhile).
        for (ledger, l, moved) in removed {
            let mut gone: Vec<IndexEntry> = l.recent.clone();
            let mut walk = match l.has_index_file {
                true => {
                    let path = self.paths.index(ledger);
                    let f =
                        self.disk.open(&path, OpenMode::Existing).await.map_err(self.io("open index file", &path))?;
                    Some(crate::pages::PageWalk::all(Rc::new(f), path, ledger, &l.pages))
                }
                false => None,
            };
            loop {
                {
                    let mut st = self.st.borrow_mut();
                    for e in gone.drain(..) {
                        st.shift_live(Some(e.position), None, (RECORD_HEADER_BYTES as u64) + e.body_len as u64);
                    }
                }
                let Some(w) = walk.as_mut() else { break };
                let Some(read) = w.next(|entry| moved.get(&entry).copied()).await? else { break };
                gone.extend(read.iter().map(crate::pages::Walked::current));
            }
        }
        let segments = {
            let mut st = self.st.borrow_mut();
            let st = &mut *st;
            let dead: Vec<Rc<Segment<D::File>>> = st
                .segments
                .values()
                .filter(|s| s.end() <= position && st.live.get(s.start).entries == 0)
                .cloned()
                .collect();
            for s in &dead {
                st.segments.remove(&s.start);
                st.live.forget(s.start);
            }
            dead
        };
        if !index_files.is_empty() {
            for (ledger, _) in &index_files {
                let path = self.paths.index(*ledger);
                match self.disk.remove(&path).await {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(StorageError::io("remove index file", path, e)),
                }
            }
            self.disk
                .sync_dir(&self.paths.index_dir)
                .await
                .map_err(self.io("fsync index directory", &self.paths.index_dir))?;
        }
        // Freed segments of the configured size go to the recycling pool
        // (nothing to do on disk: they keep their names until reused); the
        // rest are unlinked.
        let mut removed = 0;
        for s in &segments {
            {
                let mut st = self.st.borrow_mut();
                if s.len == self.cfg.segment_bytes && st.recycle_pool.len() < self.cfg.recycle_segments {
                    st.recycle_pool.push(s.path.clone());
                    continue;
                }
            }
            self.disk.remove(&s.path).await.map_err(self.io("remove dead segment", &s.path))?;
            removed += 1;
        }
        if removed > 0 {
            self.disk
                .sync_dir(&self.paths.log_dir)
                .await
                .map_err(self.io("fsync log directory", &self.paths.log_dir))?;
        }
        if !segments.is_empty() {
            info!(dir = %self.cfg.dir.display(), removed, kept_for_reuse = segments.len() - removed, "freed segments holding no live entry");
        }
        Ok(())
    }

    /// temp file + fdatasync + rename + directory fsync: after a crash either
    /// the old or the new file is found under `path`, complete.
    async fn write_atomically(&self, tmp: &Path, path: &Path, bytes: &[u8]) -> Result<()> {
        let f = self.disk.open(tmp, OpenMode::Truncate).await.map_err(self.io("create", tmp))?;
        f.write_at(0, bytes).await.map_err(self.io("write", tmp))?;
        f.sync().await.map_err(self.io("fdatasync", tmp))?;
        self.disk.rename(tmp, path).await.map_err(self.io("rename", tmp))?;
        self.disk.sync_dir(&self.paths.dir).await.map_err(self.io("fsync directory", &self.paths.dir))
    }
}

/// How many of a ledger's entries lie before log position `position`.
/// Compaction moves only entries already in the index file
/// (`< file_entries`), so the entries after those are in log order.
pub(crate) fn durable_entries(l: &Ledger, position: u64) -> u64 {
    l.file_entries + l.recent.partition_point(|e| e.position < position) as u64
}

/// Points index entries at their compaction copies once the copies are
/// durable (called with the batch's tail advance, under the same borrow, so
/// a checkpoint sees both or neither). A copy of an entry whose ledger was
/// deleted meanwhile, or that moved since, is left unreferenced.
fn apply_moves<F>(st: &mut State<F>, moves: Vec<(u64, u64, u64, IndexEntry)>) {
    for (ledger, entry, from, to) in moves {
        let Some(l) = st.ledgers.get_mut(&ledger) else { continue };
        if l.deleted.is_some() {
            continue;
        }
        assert!(entry < l.file_entries, "compaction moved {ledger}:{entry}, which is not in the index file yet");
        // Index pages never change: an entry is where its page says unless
        // relocated, and compaction read `from` from there or from here.
        if let Some(ie) = st.relocated.get(&(ledger, entry)) {
            if ie.position != from {
                continue;
            }
            assert_eq!((ie.body_len, ie.extras), (to.body_len, to.extras), "a copy is the same entry");
        }
        st.relocated.insert((ledger, entry), to);
        st.shift_live(Some(from), Some(to.position), (RECORD_HEADER_BYTES as u64) + to.body_len as u64);
    }
}

/// A segment being created ahead of need: (start position, creation task).
/// What [`Shared::plan_batch`] decided: the first `count` pending records
/// go in a batch of `batch_len` bytes (whole pages), into a new segment
/// starting at `roll_at` when set.
struct BatchPlan {
    count: usize,
    batch_len: u64,
    roll_at: Option<u64>,
}

/// A batch laid out at `position` of `seg` (batch `seq`), written but not
/// yet published: what becomes true once it is durable.
struct LaidOut<F> {
    seg: Rc<Segment<F>>,
    position: u64,
    seq: u64,
    count: usize,
    batch_len: u64,
    /// The lsn of its last record: every lsn up to it is durable with it.
    last_lsn: u64,
    /// Metadata writes, for the durable view.
    metas: Vec<(Bytes, Bytes)>,
    /// Compaction copies: (ledger, entry, old position, the copy).
    moves: Vec<(u64, u64, u64, IndexEntry)>,
}

type Spare<F> = (u64, glommio::task::JoinHandle<Result<Rc<Segment<F>>>>);

/// Starts creating the next segment in the background once the current one
/// is half full (or none exists), so that rolling over does not put a
/// fallocate and two fsyncs in front of the next batch's receipt. An unused
/// spare after a crash holds no valid batch and is removed by recovery.
fn make_spare<D: Disk>(sh: &Rc<Shared<D>>, spare: &mut Option<Spare<D::File>>) {
    if spare.is_some() {
        return;
    }
    let start = {
        let st = sh.st.borrow();
        match st.segment_at(st.tail) {
            None => st.tail,
            Some(seg) if seg.end() - st.tail < sh.cfg.segment_bytes / 2 => seg.end(),
            Some(_) => return,
        }
    };
    if sh.st.borrow().segments.contains_key(&start) {
        return;
    }
    let task = glommio::spawn_local(create_segment_retrying(Rc::downgrade(sh), start)).detach();
    *spare = Some((start, task));
}

/// How long a segment creation that ran out of space waits before trying
/// again.
const SPACE_RETRY: Duration = Duration::from_millis(250);

/// Whether `e` says the filesystem (or the quota) has no room.
pub(crate) fn is_no_space(e: &std::io::Error) -> bool {
    // glommio's errors become `io::Error`s that keep the kind but not
    // always the raw errno.
    matches!(e.raw_os_error(), Some(libc::ENOSPC) | Some(libc::EDQUOT))
        || matches!(e.kind(), std::io::ErrorKind::StorageFull | std::io::ErrorKind::QuotaExceeded)
}

/// Creates the segment at `start`, trying again every `SPACE_RETRY` while
/// there is no space for it and the log is open (`Shared::space_short` is
/// set meanwhile, so the caller can refuse what would need the space). A
/// failed creation wrote no batch, so retrying is safe; it is never a
/// fail-stop by itself. Once the log leaves `Open` the `NoSpace` error is
/// returned (a close with appends it cannot write then fails).
async fn create_segment_retrying<D: Disk>(weak: Weak<Shared<D>>, start: u64) -> Result<Rc<Segment<D::File>>> {
    loop {
        let Some(sh) = weak.upgrade() else { return Err(StorageError::Closed) };
        match sh.create_segment(start).await {
            Err(e @ StorageError::NoSpace { .. }) => {
                if sh.st.borrow().mode != Mode::Open {
                    return Err(e);
                }
                if !sh.space_short.replace(true) {
                    warn!(
                        dir = %sh.cfg.dir.display(), error = %e,
                        "no space for the next segment: retrying every {} ms until space is freed",
                        SPACE_RETRY.as_millis()
                    );
                }
            }
            r => {
                if r.is_ok() && sh.space_short.replace(false) {
                    info!(dir = %sh.cfg.dir.display(), start, "space for the next segment again");
                }
                return r;
            }
        }
        drop(sh);
        glommio::timer::sleep(SPACE_RETRY).await;
    }
}

/// The group-commit task: one batch in flight at a time.
pub(crate) async fn flusher<D: Disk>(weak: Weak<Shared<D>>) {
    let mut spare: Option<Spare<D::File>> = None;
    loop {
        let work = poll_fn(|cx| {
            let Some(sh) = weak.upgrade() else {
                return Poll::Ready(None);
            };
            let mut st = sh.st.borrow_mut();
            match st.mode {
                Mode::Failed | Mode::Closed => return Poll::Ready(None),
                Mode::Open | Mode::Closing => {}
            }
            if !st.pending.is_empty() {
                drop(st);
                return Poll::Ready(Some(sh));
            }
            if st.mode == Mode::Closing {
                return Poll::Ready(None);
            }
            st.flusher_waker = Some(cx.waker().clone());
            Poll::Pending
        })
        .await;
        let Some(sh) = work else { break };
        crate::stage::mark("4_flusher_woke");
        make_spare(&sh, &mut spare);
        if let Err(e) = sh.flush_one(&mut spare).await {
            // A roll that found no space for its segment wrote nothing:
            // the records stay pending and the roll is tried again.
            if matches!(e, StorageError::NoSpace { .. }) && sh.st.borrow().mode == Mode::Open {
                sh.space_short.set(true);
                drop(sh);
                glommio::timer::sleep(SPACE_RETRY).await;
                continue;
            }
            sh.fail(&e);
            break;
        }
        make_spare(&sh, &mut spare);
    }
    // Let a spare being created finish, so that close() returns with no
    // file operation of this log still running. A spare that found no
    // space held nothing: not a failure of the log.
    if let Some((_, task)) = spare.take() {
        match task.await {
            Some(Err(StorageError::NoSpace { .. } | StorageError::Closed)) | Some(Ok(_)) | None => {}
            Some(Err(e)) => {
                if let Some(sh) = weak.upgrade() {
                    sh.fail(&e);
                }
            }
        }
    }
    if let Some(sh) = weak.upgrade() {
        let mut st = sh.st.borrow_mut();
        st.flusher_done = true;
        std::mem::take(&mut st.close_wakers).into_iter().for_each(Waker::wake);
    }
}

/// The zeroing task (`LogConfig::zero_ahead_bytes`): writes zeros over the
/// tail segment ahead of the tail, one chunk at a time (no fdatasync of its
/// own, see `zero_ahead`), while the flusher's batches are small. Woken by
/// the flusher.
pub(crate) async fn zeroer<D: Disk>(weak: Weak<Shared<D>>) {
    loop {
        let work = while_open(&weak, |st| &mut st.zero_waker, |sh, st| zero_target(&sh.cfg, st).is_some()).await;
        let Some(sh) = work else { break };
        if let Err(e) = sh.zero_ahead().await {
            sh.fail(&e);
            break;
        }
    }
}

/// Waits, for a background task, until `ready` holds (returns the log) or
/// the log is gone or no longer `Open` (returns `None`); between checks
/// the task's waker sits in the slot `waker` picks, which whoever changes
/// what `ready` reads wakes.
async fn while_open<D: Disk>(
    weak: &Weak<Shared<D>>,
    waker: fn(&mut State<D::File>) -> &mut Option<Waker>,
    ready: impl Fn(&Shared<D>, &State<D::File>) -> bool,
) -> Option<Rc<Shared<D>>> {
    poll_fn(|cx| {
        let Some(sh) = weak.upgrade() else {
            return Poll::Ready(None);
        };
        let mut st = sh.st.borrow_mut();
        if st.mode != Mode::Open {
            return Poll::Ready(None);
        }
        if ready(&sh, &st) {
            drop(st);
            return Poll::Ready(Some(sh));
        }
        *waker(&mut st) = Some(cx.waker().clone());
        Poll::Pending
    })
    .await
}

/// Ledger `ledger` if entry `entry` of it may be read: appended to, and
/// the ledger not deleted.
fn readable_ledger<F>(st: &State<F>, ledger: u64, entry: u64) -> Result<&Ledger> {
    match st.ledgers.get(&ledger) {
        Some(l) if entry < l.next_entry && l.deleted.is_none() => Ok(l),
        _ => Err(StorageError::NoSuchEntry { ledger, entry }),
    }
}

/// Where entry `entry` of ledger `l` (id `ledger`) is on disk: its index
/// entry and the segment holding it.
fn locate<F>(st: &State<F>, ie: IndexEntry, ledger: u64, entry: u64) -> Result<(IndexEntry, Rc<Segment<F>>)> {
    let no = || StorageError::NoSuchEntry { ledger, entry };
    let seg = st.segment_at(ie.position).ok_or_else(no)?.clone();
    Ok((ie, seg))
}

impl<D: Disk> Shared<D> {
    /// `ledger`'s index file (which exists: `Ledger::has_index_file`), from
    /// the shard's open set or opened now and kept there.
    pub(crate) async fn index_file(&self, ledger: u64) -> Result<Rc<D::File>> {
        if let Some(f) = self.st.borrow_mut().index_fds.get(ledger) {
            return Ok(f);
        }
        let path = self.paths.index(ledger);
        let file = Rc::new(self.disk.open(&path, OpenMode::Existing).await.map_err(self.io("open index file", &path))?);
        self.st.borrow_mut().index_fds.insert(ledger, file.clone());
        Ok(file)
    }

    /// Brings the index pages holding `ledger`'s entries `entry..entry +
    /// count` that are in its index file (at most
    /// [`PAGES_PER_READ_MAX`](crate::pages::PAGES_PER_READ_MAX) pages from
    /// `entry`'s) into the cache, in one read from the first missing page
    /// to the last. `entry`'s page goes in last, so the cache's bound never
    /// pushes it out again.
    pub(crate) async fn ensure_index(&self, ledger: u64, entry: u64, count: u64) -> Result<()> {
        use crate::pages::{page_of, read_pages, PAGES_PER_READ_MAX};
        let (sums, from, n) = {
            let st = self.st.borrow();
            let Some(l) = st.ledgers.get(&ledger) else { return Ok(()) };
            if !l.has_index_file || entry >= l.file_entries {
                return Ok(());
            }
            let Some(p0) = page_of(&l.pages, entry) else { return Ok(()) };
            let last = entry.saturating_add(count.max(1) - 1).min(l.file_entries - 1);
            let p1 = page_of(&l.pages, last).unwrap_or(p0).min(p0 + PAGES_PER_READ_MAX as usize - 1);
            let missing: Vec<usize> = (p0..=p1).filter(|p| !st.icache.contains(ledger, *p as u64)).collect();
            let (Some(&a), Some(&b)) = (missing.first(), missing.last()) else { return Ok(()) };
            (crate::pages::firsts(&l.pages, a as u64, (b - a + 1) as u64), a as u64, (b - a + 1) as u64)
        };
        let file = self.index_file(ledger).await?;
        let path = self.paths.index(ledger);
        let pages = read_pages(&*file, &path, ledger, from, crate::pages::Firsts::Known(&sums)).await?;
        let mut st = self.st.borrow_mut();
        st.icache.loads += n;
        for (i, (_, es)) in pages.into_iter().enumerate().rev() {
            st.icache.insert(ledger, from + i as u64, Rc::from(es));
        }
        Ok(())
    }
}

/// The next chunk to zero, `(segment, from, to)` as log positions, if any.
fn zero_target<F>(cfg: &LogConfig, st: &State<F>) -> Option<(Rc<Segment<F>>, u64, u64)> {
    if cfg.zero_ahead_bytes == 0 || st.avg_batch > ZERO_AHEAD_BATCH_MAX {
        return None;
    }
    let seg = st.segment_at(st.tail)?;
    // Everything before the tail is written; so is everything before
    // `zeroed` (which the flusher raises past each batch it writes).
    let from = st.zeroed.max(st.tail);
    let limit = (st.tail + cfg.zero_ahead_bytes).min(seg.end());
    (from < limit).then(|| (seg.clone(), from, (from + zero_chunk_bytes(cfg)).min(seg.end())))
}

impl<D: Disk> Shared<D> {
    /// Zeros one chunk ahead of the tail (holding `zero_lock`, so no batch
    /// is written there meanwhile). No fdatasync of its own: the zeros need
    /// not be durable (lost, the space reads as zeros all the same), and the
    /// next batch's fdatasync commits the chunk's extent conversion once,
    /// instead of a separate fdatasync competing with the flusher's.
    async fn zero_ahead(&self) -> Result<()> {
        let _permit = self.zero_lock.acquire_permit(1).await.map_err(|_| StorageError::Closed)?;
        let (seg, from, to) = {
            let st = self.st.borrow();
            if st.mode != Mode::Open {
                return Ok(());
            }
            match zero_target(&self.cfg, &st) {
                Some(t) => t,
                None => return Ok(()),
            }
        };
        let zeros = vec![0u8; (to - from) as usize];
        seg.file.write_at(from - seg.start, &zeros).await.map_err(self.io("zero ahead", &seg.path))?;
        let mut st = self.st.borrow_mut();
        st.zeroed = st.zeroed.max(to);
        st.zeroed_bytes += to - from;
        Ok(())
    }
}

/// The periodic checkpoint task.
pub(crate) async fn checkpointer<D: Disk>(weak: Weak<Shared<D>>, interval: Duration) {
    loop {
        // Nothing to wait for but the log leaving `Open` (or the timer).
        // Woken early when the index laid out since the last checkpoint
        // reached its bound (`LogConfig::recent_index_bytes`).
        let early = async {
            let full = |sh: &Shared<D>, st: &State<D::File>| recent_index_full(&sh.cfg, st.laid_since_ckpt);
            while_open(&weak, |st| &mut st.ckpt_waker, full).await.is_some()
        };
        let stopped = futures_lite::future::or(async { !early.await }, async {
            glommio::timer::sleep(interval).await;
            false
        })
        .await;
        if stopped {
            break;
        }
        let Some(sh) = weak.upgrade() else { break };
        if sh.checkpoint_or_fail().await.is_err() && sh.st.borrow().mode != Mode::Open {
            break;
        }
    }
}

/// Whether the index entries laid out since the last checkpoint reached
/// `LogConfig::recent_index_bytes`.
fn recent_index_full(cfg: &LogConfig, laid: u64) -> bool {
    laid.saturating_mul(std::mem::size_of::<IndexEntry>() as u64) >= cfg.recent_index_bytes as u64
}

/// Whether a checkpoint failed only for lack of space while creating,
/// writing or renaming a file. The checkpoint is derived data (the log
/// holds every acknowledged entry, and recovery replays the log from the
/// previous checkpoint), nothing names the pages or the temporary file it
/// was writing until its rename, and the state follows a checkpoint only
/// once it is durable, so such a checkpoint is tried again later instead of
/// a fail-stop. A failed sync is never retried: what it leaves on disk is
/// unknown.
fn checkpoint_short_of_space(e: &StorageError) -> bool {
    match e {
        StorageError::NoSpace { .. } => true,
        StorageError::Io { op, source, .. } => !op.contains("sync") && is_no_space(source),
        _ => false,
    }
}

impl<D: Disk> EntryLog<D> {
    /// Appends one entry to `ledger` in memory; its id is the ledger's next id
    /// (dense, from 0, in call order). Not durable until
    /// [`wait_durable`](Self::wait_durable)`(lsn)` returns `Ok`. `entry` is
    /// a [`NewEntry`], or just its body (`Bytes`).
    pub fn append(&self, ledger: u64, entry: impl Into<NewEntry>) -> Result<Appended> {
        let NewEntry { body, extras, body_crc } = entry.into();
        debug_assert!(body_crc.is_none_or(|c| c == crate::format::crc(&[&body])), "body_crc is the body's");
        let mut st = self.sh.st.borrow_mut();
        let st = &mut *st;
        check_mode(st.mode)?;
        if body.len() as u64 > self.sh.entry_max {
            return Err(StorageError::TooLarge { len: body.len() as u64, max: self.sh.entry_max });
        }
        // A deletion replayed by recovery drops the ledger from `ledgers`
        // but its index file stays (the checkpoint still names its pages)
        // until a checkpoint covers the deletion: a new ledger under the
        // same id would write its first index page over the old one.
        // (Looked up only for an id not in `ledgers`: no cost per append.)
        let l = match st.ledgers.entry(ledger) {
            std::collections::hash_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::hash_map::Entry::Vacant(v) => {
                if st.deleted_at.iter().any(|(l, _)| *l == ledger) {
                    return Err(StorageError::LedgerDeleted { ledger });
                }
                v.insert(Ledger::new())
            }
        };
        if l.deleted.is_some() {
            return Err(StorageError::LedgerDeleted { ledger });
        }
        let entry = l.next_entry;
        l.next_entry += 1;
        let lsn = st.next_lsn;
        st.next_lsn += 1;
        st.cache.insert((ledger, entry), lsn, body.clone());
        st.pending_bytes += body.len() as u64;
        st.pending.push_back(Pending { lsn, kind: PendingKind::Entry { ledger, entry, body, body_crc, extras } });
        crate::stage::mark("3_appended");
        st.wake_flusher();
        st.evict(self.sh.cfg.write_cache_bytes);
        Ok(Appended { entry, lsn })
    }

    /// Appends a metadata record: the last write per key wins after recovery;
    /// an empty value deletes the key. Group-committed like entries; visible
    /// to [`meta`](Self::meta) at once, durable after `wait_durable(lsn)`.
    pub fn put_meta(&self, key: &[u8], value: Bytes) -> Result<u64> {
        let mut st = self.sh.st.borrow_mut();
        let st = &mut *st;
        check_mode(st.mode)?;
        if key.len() > META_KEY_BYTES_MAX {
            return Err(StorageError::TooLarge { len: key.len() as u64, max: META_KEY_BYTES_MAX as u64 });
        }
        let len = 2 + key.len() as u64 + value.len() as u64;
        if len > self.sh.entry_max {
            return Err(StorageError::TooLarge { len, max: self.sh.entry_max });
        }
        if value.is_empty() {
            st.meta.remove(key);
        } else {
            st.meta.insert(key.to_vec(), value.clone());
        }
        let lsn = st.next_lsn;
        st.next_lsn += 1;
        st.pending_bytes += len;
        st.pending.push_back(Pending { lsn, kind: PendingKind::Meta { key: Bytes::copy_from_slice(key), value } });
        st.wake_flusher();
        Ok(lsn)
    }

    /// Deletes `ledger`: its entries become unreadable at once, a deletion
    /// record is group-committed like an append (durable after
    /// `wait_durable(lsn)`; replayed by recovery), and once a checkpoint
    /// covers it the ledger's index file and every segment left without a
    /// live entry are removed, freeing the space. Ledger ids must never be
    /// reused after a deletion; until a checkpoint covers the deletion
    /// (also after a restart that replayed it) appends to the id get
    /// `LedgerDeleted`. `LedgerBusy` while appends to the ledger are
    /// not yet laid out in a batch.
    pub fn delete_ledger(&self, ledger: u64) -> Result<u64> {
        let mut st = self.sh.st.borrow_mut();
        let st = &mut *st;
        check_mode(st.mode)?;
        if let Some(l) = st.ledgers.get_mut(&ledger) {
            if l.laid_out() < l.next_entry {
                return Err(StorageError::LedgerBusy { ledger });
            }
            if l.deleted.is_some() {
                return Err(StorageError::LedgerDeleted { ledger });
            }
            l.deleted = Some(None);
        }
        let lsn = st.next_lsn;
        st.next_lsn += 1;
        st.pending.push_back(Pending { lsn, kind: PendingKind::Delete { ledger } });
        st.wake_flusher();
        Ok(lsn)
    }

    /// Resolves once the live entries in the index files as they were at
    /// open are counted (in the background after open; garbage collection
    /// and compaction wait for it). `Failed` if the log failed first.
    pub async fn live_counted(&self) -> Result<()> {
        self.sh.live_counted().await
    }

    /// Segments with their count of live entries, by start position, once
    /// those in index files are counted (after open; at once if the log
    /// failed first).
    pub async fn segments(&self) -> Vec<(u64, u64)> {
        let _ = self.sh.live_counted().await;
        let st = self.sh.st.borrow();
        st.segments.keys().map(|s| (*s, st.live.get(*s).entries)).collect()
    }

    /// Resolves once everything appended with an lsn <= `lsn` is written and
    /// fdatasync'd. One fdatasync covers many appends (group commit). `Err`
    /// if the log failed (fail-stop; the cause was logged) — then nothing
    /// after the last `Ok` may be acknowledged.
    pub async fn wait_durable(&self, lsn: u64) -> Result<()> {
        poll_fn(|cx| {
            let mut st = self.sh.st.borrow_mut();
            if st.durable_lsn >= lsn {
                return Poll::Ready(Ok(()));
            }
            if st.mode == Mode::Failed {
                return Poll::Ready(Err(StorageError::Failed));
            }
            assert!(lsn < st.next_lsn, "wait_durable({lsn}) for an lsn never issued");
            if st.mode == Mode::Closed {
                return Poll::Ready(Err(StorageError::Closed));
            }
            st.durable_waiters.entry(lsn).or_default().push(cx.waker().clone());
            Poll::Pending
        })
        .await
    }

    /// Reads one entry: from the write cache when present, otherwise from disk
    /// with the record checksum verified (a mismatch is
    /// [`StorageError::Corrupt`] naming file and offset; the bytes are never
    /// returned).
    pub async fn read(&self, ledger: u64, entry: u64) -> Result<Bytes> {
        let (seg, ie, ahead) = 'found: loop {
            'missing: {
                let mut st = self.sh.st.borrow_mut();
                let st = &mut *st;
                // The ledger first: a deleted ledger's entries may linger in the cache.
                readable_ledger(st, ledger, entry)?;
                if let Some(b) = st.cache.get(&(ledger, entry)) {
                    return Ok(b.clone());
                }
                if let Some(b) = st.rcache.get(&(ledger, entry)) {
                    st.rcache_hits += 1;
                    let b = b.clone();
                    st.last_disk_read.insert(ledger, entry);
                    return Ok(b);
                }
                let ie = match lookup(st, ledger, entry) {
                    Lookup::Found(ie) => ie,
                    Lookup::Page => break 'missing,
                    Lookup::None => return Err(StorageError::NoSuchEntry { ledger, entry }),
                };
                let (ie, seg) = locate(st, ie, ledger, entry)?;
                // Sequential catch-up: also fetch the following entries of this
                // ledger that are durable (before the tail) and in this segment,
                // up to read_ahead_bytes, in the same request (while their
                // index pages are at hand).
                let sequential = entry.checked_sub(1).is_some_and(|p| st.last_disk_read.get(&ledger) == Some(&p));
                let mut ahead = Vec::new();
                if sequential && self.sh.cfg.read_cache_bytes > 0 {
                    let limit = ie.position + self.sh.cfg.read_ahead_bytes as u64;
                    let mut prev_end = ie.position + (RECORD_HEADER_BYTES as u64) + ie.body_len as u64;
                    let mut i = entry + 1;
                    while let Lookup::Found(e) = lookup(st, ledger, i) {
                        let end = e.position + (RECORD_HEADER_BYTES as u64) + e.body_len as u64;
                        // Compaction can move an entry out of log order: stop there.
                        if e.position < prev_end || end > limit || end > st.tail || end > seg.end() {
                            break;
                        }
                        prev_end = end;
                        ahead.push((i, e));
                        i += 1;
                    }
                }
                st.last_disk_read.insert(ledger, entry);
                st.disk_reads += 1;
                break 'found (seg, ie, ahead);
            }
            // Its index page (and the next, for the read-ahead), then again.
            self.sh.ensure_index(ledger, entry, 2 * INDEX_ENTRIES_PER_PAGE as u64).await?;
        };
        let off = ie.position - seg.start;
        let len = RECORD_HEADER_BYTES + ie.body_len as usize;
        let span_end = ahead.last().map_or(off + len as u64, |(_, e)| {
            e.position - seg.start + (RECORD_HEADER_BYTES as u64) + e.body_len as u64
        });
        let raw =
            seg.file.read_bytes(off, (span_end - off) as usize).await.map_err(self.sh.io("read entry", &seg.path))?;
        let corrupt = |reason| StorageError::corrupt(&seg.path, off, reason);
        if raw.len() < len {
            return Err(corrupt(CorruptReason::ShortFile {
                len: seg.start + raw.len() as u64,
                need: seg.start + len as u64,
            }));
        }
        check_entry_record(&raw[..len], &ie, ledger, entry).map_err(corrupt)?;
        let body = raw.slice(RECORD_HEADER_BYTES..len);
        let bound = self.sh.cfg.read_cache_bytes;
        let mut st = self.sh.st.borrow_mut();
        // Each entry read ahead is verified on its own; one that fails is
        // simply not cached (reading it later reports the damage).
        for (i, e) in ahead {
            let s = (e.position - ie.position) as usize;
            let n = RECORD_HEADER_BYTES + e.body_len as usize;
            if let Some(rec) = raw.get(s..s + n) {
                if check_entry_record(rec, &e, ledger, i).is_ok() {
                    // A copy, so the cache's bound counts the memory it holds
                    // (a slice would pin the whole read-ahead buffer).
                    st.rcache.put((ledger, i), Bytes::copy_from_slice(&rec[RECORD_HEADER_BYTES..]), bound);
                }
            }
        }
        if bound > 0 {
            // The cached copy is what the caller gets too: a slice of `raw`
            // would keep the whole read-ahead buffer (one of the backend's
            // few registered ones, `DiskFile::read_bytes`) for as long as
            // the caller holds this one entry.
            let copy = Bytes::copy_from_slice(&body);
            st.rcache.put((ledger, entry), copy.clone(), bound);
            return Ok(copy);
        }
        Ok(body)
    }

    /// Reads a run of consecutive entries of `ledger` from `entry` on: at
    /// least one (or an error, as [`Self::read`]), at most `max_entries`,
    /// and past the first only while the run stays within `max_bytes` (of
    /// log from the first record; of bodies for cached entries). Entries in
    /// the write or read cache come from there (the run ends at the first
    /// one that is not); otherwise one disk request reads the durable
    /// entries that follow in the same segment (other ledgers' records in
    /// between are read and skipped, as by the read-ahead), each verified
    /// (the run ends before one that fails: reading it again reports the
    /// damage). A run whose first record lies in a stretch of log an earlier
    /// run read, or is reading ([`SPANS_KEPT`](crate::spans::SPANS_KEPT)), takes its bytes from there
    /// and ends where that stretch ends. The bodies read from disk are slices of one buffer and do
    /// not go through the read cache: a sequential reader that keeps its
    /// own run pays neither a copy nor a hash insert and eviction per
    /// entry, which would be a large share of a catch-up's CPU.
    pub async fn read_run(&self, ledger: u64, entry: u64, max_entries: usize, max_bytes: usize) -> Result<Vec<Bytes>> {
        let max_entries = max_entries.max(1);
        // A run past the entry's index page needs the next pages too.
        self.sh.ensure_index(ledger, entry, max_entries as u64).await?;
        let (seg, first, run, kept) = 'found: loop {
            'missing: {
                let mut st = self.sh.st.borrow_mut();
                let st = &mut *st;
                let next_entry = readable_ledger(st, ledger, entry)?.next_entry;
                let cached = |st: &State<D::File>, e: u64| {
                    st.cache.get(&(ledger, e)).or_else(|| st.rcache.get(&(ledger, e))).cloned()
                };
                if cached(st, entry).is_some() {
                    let mut out: Vec<Bytes> = Vec::new();
                    let mut bytes = 0usize;
                    let mut e = entry;
                    while out.len() < max_entries && e < next_entry {
                        let Some(b) = cached(st, e) else { break };
                        bytes += b.len();
                        if !out.is_empty() && bytes > max_bytes {
                            break;
                        }
                        out.push(b);
                        e += 1;
                    }
                    return Ok(out);
                }
                let ie = match lookup(st, ledger, entry) {
                    Lookup::Found(ie) => ie,
                    Lookup::Page => break 'missing,
                    Lookup::None => return Err(StorageError::NoSuchEntry { ledger, entry }),
                };
                let (ie, seg) = locate(st, ie, ledger, entry)?;
                let first_end = ie.position + (RECORD_HEADER_BYTES as u64) + ie.body_len as u64;
                // A stretch read for another run (usually another partition's)
                // that holds the first record: the run stays within it.
                // Of the stretches holding the first record (and not failed),
                // the one reaching furthest.
                let kept = st.spans.holding(ie.position, first_end);
                let mut run = vec![ie];
                let mut limit = ie.position.saturating_add(max_bytes as u64);
                if let Some((at, len, _)) = &kept {
                    limit = limit.min(at + len);
                }
                let mut prev_end = first_end;
                // The run ends where the index pages at hand end.
                let mut i = entry + 1;
                while run.len() < max_entries {
                    let Lookup::Found(e) = lookup(st, ledger, i) else { break };
                    let end = e.position + (RECORD_HEADER_BYTES as u64) + e.body_len as u64;
                    // Compaction can move an entry out of log order: stop there.
                    if e.position < prev_end || end > limit || end > st.tail || end > seg.end() {
                        break;
                    }
                    prev_end = end;
                    run.push(e);
                    i += 1;
                }
                break 'found (seg, ie, run, kept);
            }
            // The index pages of the run's entries, then again.
            self.sh.ensure_index(ledger, entry, max_entries as u64).await?;
        };
        let off = first.position - seg.start;
        let span =
            run.last().map_or(0, |e| e.position + (RECORD_HEADER_BYTES as u64) + e.body_len as u64) - first.position;
        if kept.is_some() {
            self.sh.st.borrow_mut().spans.touch();
        }
        let shared = match &kept {
            Some((at, _, read)) => read.wait().await.map(|b| {
                let b = b.slice((first.position - at) as usize..);
                // A short run does not keep another reader's whole buffer
                // alive (its entries are slices of what this returns).
                if span < b.len() as u64 / 4 {
                    Bytes::copy_from_slice(&b[..span as usize])
                } else {
                    b
                }
            }),
            None => None,
        };
        let raw = match shared {
            Some(raw) => raw,
            None => {
                // Widened back (within the segment) so that another
                // partition's reader a few records behind this one finds
                // its first record inside this read: to where the kept
                // stretch nearest before the first record ends, if less
                // than SPAN_ALIGN before it (readers that took their last
                // run from that stretch continue from its end: a reader
                // alone re-reads nothing, and of two in step the one
                // polled second finds the other's read however their
                // first records lie), else to a SPAN_ALIGN boundary.
                // Announced before the read, so runs that start inside it
                // while it is in flight wait for it.
                let (from, len, read) = {
                    let mut st = self.sh.st.borrow_mut();
                    let joined = st.spans.joined_end(first.position);
                    let from = joined.unwrap_or(first.position / SPAN_ALIGN * SPAN_ALIGN).max(seg.start);
                    let len = first.position + span - from;
                    st.disk_reads += 1;
                    (from, len, st.spans.announce(from, len))
                };
                let mut guard = SpanGuard(Some(read));
                let raw = match seg.file.read_bytes(from - seg.start, len as usize).await {
                    Ok(raw) => raw,
                    // The bytes before the run's first record are not this
                    // run's: an error there must not fail it. Read just the run.
                    Err(_) if from < first.position => {
                        let narrow = seg.file.read_bytes(off, span as usize).await;
                        let raw = narrow.map_err(self.sh.io("read entry", &seg.path))?;
                        drop(guard);
                        return self.check_run(ledger, entry, &seg, off, &run, raw);
                    }
                    Err(e) => return Err(self.sh.io("read entry", &seg.path)(e)),
                };
                // Only what the disk gave back in full is shared.
                if let Some(read) = guard.0.take() {
                    read.finish((raw.len() as u64 == len).then(|| raw.clone()));
                }
                // Short: the checks below report what is missing.
                raw.slice(((first.position - from) as usize).min(raw.len())..)
            }
        };
        self.check_run(ledger, entry, &seg, off, &run, raw)
    }

    /// The entries of `run` (the first being `entry` of `ledger`) from
    /// `raw`, the log from the first one's record on (at `off` in `seg`),
    /// each verified: the run ends before one that fails, and an error if
    /// the first does.
    fn check_run(
        &self,
        ledger: u64,
        entry: u64,
        seg: &Segment<D::File>,
        off: u64,
        run: &[IndexEntry],
        raw: Bytes,
    ) -> Result<Vec<Bytes>> {
        let first = run[0];
        let mut out = Vec::with_capacity(run.len());
        for (i, e) in run.iter().enumerate() {
            let s = (e.position - first.position) as usize;
            let n = RECORD_HEADER_BYTES + e.body_len as usize;
            let at = off + s as u64;
            let checked = match raw.get(s..s + n) {
                Some(rec) => check_entry_record(rec, e, ledger, entry + i as u64),
                None => Err(CorruptReason::ShortFile {
                    len: seg.start + off + raw.len() as u64,
                    need: seg.start + at + n as u64,
                }),
            };
            match checked {
                Ok(_) => out.push(raw.slice(s + RECORD_HEADER_BYTES..s + n)),
                Err(reason) if i == 0 => return Err(StorageError::corrupt(&seg.path, at, reason)),
                Err(_) => break,
            }
        }
        Ok(out)
    }

    /// Segment recycling: (freed segments waiting in the pool, segments
    /// made by renaming a freed one since open).
    pub fn recycle_stats(&self) -> (usize, u64) {
        let st = self.sh.st.borrow();
        (st.recycle_pool.len(), st.recycled)
    }

    /// Lone batches written and synced as one request since open
    /// ([`LONE_BATCH_BYTES_MAX`]).
    pub fn lone_batches(&self) -> u64 {
        self.sh.st.borrow().lone.batches
    }

    /// Of those, the ones slower than `lone_sync_max` (each paused the path
    /// for [`LONE_PAUSE_BATCHES`] batches).
    pub fn lone_slow(&self) -> u64 {
        self.sh.st.borrow().lone.slow
    }

    /// Bytes zeroed ahead of the tail since open (`zero_ahead_bytes`).
    pub fn zeroed_ahead_bytes(&self) -> u64 {
        self.sh.st.borrow().zeroed_bytes
    }

    /// What the flusher wrote and synced since open.
    pub fn flush_stats(&self) -> FlushStats {
        self.sh.st.borrow().flush
    }

    /// Read-cache counters: (reads served from the read cache, disk reads).
    pub fn read_stats(&self) -> (u64, u64) {
        let st = self.sh.st.borrow();
        (st.rcache_hits, st.disk_reads)
    }

    /// Stretches of log kept for [`Self::read_run`] ([`SPANS_KEPT`](crate::spans::SPANS_KEPT)): how
    /// many, and the bytes held by those read in full.
    pub fn read_spans(&self) -> (usize, u64) {
        self.sh.st.borrow().spans.stats()
    }

    /// Next entry id that `append` would assign (0 for an unknown ledger).
    pub fn next_entry(&self, ledger: u64) -> u64 {
        self.sh.st.borrow().ledgers.get(&ledger).map_or(0, |l| l.next_entry)
    }

    /// Current value of a metadata key (including puts not yet durable).
    pub fn meta(&self, key: &[u8]) -> Option<Bytes> {
        self.sh.st.borrow().meta.get(key).cloned()
    }

    /// All metadata keys starting with `prefix`, sorted.
    pub fn meta_prefix(&self, prefix: &[u8]) -> Vec<(Vec<u8>, Bytes)> {
        let st = self.sh.st.borrow();
        st.meta
            .range(prefix.to_vec()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect()
    }

    /// At most `limit` metadata keys starting with `prefix` and sorting
    /// after `after` (all of them from the first when `None`), in key order,
    /// without their values: a page of a listing that may be long.
    pub fn meta_keys_page(&self, prefix: &[u8], after: Option<&[u8]>, limit: usize) -> Vec<Vec<u8>> {
        use std::ops::Bound;
        let from = match after {
            Some(a) if a >= prefix => Bound::Excluded(a.to_vec()),
            _ => Bound::Included(prefix.to_vec()),
        };
        let st = self.sh.st.borrow();
        st.meta
            .range((from, Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(limit)
            .map(|(k, _)| k.clone())
            .collect()
    }

    /// The first entry of `ledger` whose publish time (as appended with
    /// [`NewEntry::extras`]) is at least `time_ms`, by binary
    /// search over the ledger's index without reading payloads; the ledger's
    /// laid-out entry count when there is none. Exact when publish times are
    /// non-decreasing in the ledger (one producer, or clocks in step);
    /// otherwise a partition point of the index, as in Pulsar's seek by time.
    /// Entries appended but not yet handed to a batch are not searched.
    /// The search goes over the first publish time of each index page,
    /// then reads (at most) the one page that holds the answer.
    pub async fn seek_time(&self, ledger: u64, time_ms: u64) -> Result<u64> {
        loop {
            let first = {
                let mut st = self.sh.st.borrow_mut();
                let st = &mut *st;
                let Some(l) = st.ledgers.get(&ledger) else { return Ok(0) };
                let in_recent =
                    || l.file_entries + l.recent.partition_point(|e| e.extras.publish_time_ms < time_ms) as u64;
                // Pages before `k` start before `time_ms`, the others at or after it.
                let k = l.pages.partition_point(|p| p.first_time_ms < time_ms);
                let Some(p) = k.checked_sub(1) else {
                    return Ok(if l.pages.is_empty() { in_recent() } else { 0 });
                };
                let first = l.pages[p].first_entry;
                match st.icache.get(ledger, p as u64) {
                    Some(es) => {
                        let j = es.partition_point(|e| e.extras.publish_time_ms < time_ms);
                        return Ok(if j < es.len() {
                            first + j as u64
                        } else if let Some(next) = l.pages.get(k) {
                            next.first_entry
                        } else {
                            in_recent()
                        });
                    }
                    None => first,
                }
            };
            self.sh.ensure_index(ledger, first, 1).await?;
        }
    }

    /// The index entry of `ledger:entry` (position, length, checksum,
    /// publish time, key hash), if it was laid out in a batch.
    /// Reads its index page when it is not in the cache.
    pub async fn index_entry(&self, ledger: u64, entry: u64) -> Result<Option<IndexEntry>> {
        loop {
            match lookup(&mut self.sh.st.borrow_mut(), ledger, entry) {
                Lookup::Found(ie) => return Ok(Some(ie)),
                Lookup::None => return Ok(None),
                Lookup::Page => {}
            }
            self.sh.ensure_index(ledger, entry, 1).await?;
        }
    }

    /// [`index_entry`](Self::index_entry) without a disk read: `None` also
    /// when its index page is not in the cache.
    pub fn index_entry_cached(&self, ledger: u64, entry: u64) -> Option<IndexEntry> {
        match lookup(&mut self.sh.st.borrow_mut(), ledger, entry) {
            Lookup::Found(ie) => Some(ie),
            _ => None,
        }
    }

    /// [`index_entry_cached`](Self::index_entry_cached) leaving the cache's
    /// eviction order and hit count alone: for statistics, which must not
    /// steer what stays cached for readers.
    pub fn index_entry_peek(&self, ledger: u64, entry: u64) -> Option<IndexEntry> {
        match peek(&self.sh.st.borrow(), ledger, entry) {
            Lookup::Found(ie) => Some(ie),
            _ => None,
        }
    }

    /// Body bytes of `ledger`'s entries laid out in a batch (0 for an
    /// unknown ledger).
    pub fn ledger_bytes(&self, ledger: u64) -> u64 {
        self.sh.st.borrow().ledgers.get(&ledger).map_or(0, |l| l.bytes)
    }

    /// The index page cache: (bytes held, bound, pages, lookups served
    /// from it, pages read from disk).
    pub fn index_cache_stats(&self) -> IndexCacheStats {
        let st = self.sh.st.borrow();
        let c = &st.icache;
        let recent_entries = st.ledgers.values().map(|l| l.recent.len() as u64).sum();
        IndexCacheStats {
            bytes: c.bytes(),
            max_bytes: c.max_bytes(),
            pages: c.len(),
            hits: c.hits,
            loads: c.loads,
            recent_entries,
        }
    }

    /// Every ledger with its next entry id, sorted by ledger.
    pub fn ledgers(&self) -> Vec<(u64, u64)> {
        let st = self.sh.st.borrow();
        let mut v: Vec<(u64, u64)> =
            st.ledgers.iter().filter(|(_, l)| l.deleted.is_none()).map(|(id, l)| (*id, l.next_entry)).collect();
        v.sort_unstable();
        v
    }

    /// The highest lsn known durable.
    pub fn durable_lsn(&self) -> u64 {
        self.sh.st.borrow().durable_lsn
    }

    /// Bytes appended but not yet handed to a batch write. The caller bounds
    /// this (e.g. by waiting for receipts before accepting more produce).
    pub fn pending_bytes(&self) -> u64 {
        self.sh.st.borrow().pending_bytes
    }

    /// Whether the next segment could not be created for lack of space and
    /// the creation is being retried: appends still go into the current
    /// segment's rest, and once that is used up they wait (not fail) until
    /// space returns. A caller that must not let appends wait refuses new
    /// ones while this holds.
    pub fn space_short(&self) -> bool {
        self.sh.space_short.get()
    }

    /// Whether the log is in fail-stop state.
    pub fn is_failed(&self) -> bool {
        self.sh.st.borrow().mode == Mode::Failed
    }

    /// Writes index pages and a checkpoint now (the periodic task does this
    /// every `checkpoint_interval`). A failure puts the log in fail-stop,
    /// except a lack of space for the checkpoint's files: that error is
    /// returned and the log goes on (see `checkpoint_short_of_space`).
    /// Its garbage collection waits for the live counts after open (the
    /// periodic checkpoint skips it until then).
    pub async fn checkpoint(&self) -> Result<()> {
        self.sh.live_counted().await?;
        self.sh.checkpoint_or_fail().await
    }

    /// Clean shutdown: waits for pending appends, syncs, writes index pages,
    /// a checkpoint and the clean-shutdown marker, stops the background
    /// tasks. Later appends fail with `Closed`.
    pub async fn close(&self) -> Result<()> {
        {
            let mut st = self.sh.st.borrow_mut();
            match st.mode {
                Mode::Failed => return Err(StorageError::Failed),
                Mode::Closed => return Ok(()),
                Mode::Open | Mode::Closing => {}
            }
            st.mode = Mode::Closing;
            // Stop the periodic checkpoint task and let the flusher drain.
            st.wake_flusher();
            if let Some(w) = st.ckpt_waker.take() {
                w.wake();
            }
        }
        poll_fn(|cx| {
            let mut st = self.sh.st.borrow_mut();
            if st.flusher_done || st.mode == Mode::Failed {
                Poll::Ready(())
            } else {
                st.close_wakers.push(cx.waker().clone());
                Poll::Pending
            }
        })
        .await;
        if self.sh.st.borrow().mode == Mode::Failed {
            return Err(StorageError::Failed);
        }
        // A zeroing write in flight finishes first (none starts while closing).
        drop(self.sh.zero_lock.acquire_permit(1).await.map_err(|_| StorageError::Closed)?);
        // The last checkpoint collects garbage: after the live counts.
        self.sh.live_counted().await?;
        if let Err(e) = self.sh.checkpoint(true).await {
            self.sh.fail(&e);
            return Err(e);
        }
        let mut st = self.sh.st.borrow_mut();
        st.mode = Mode::Closed;
        // Nothing reads or writes index files any more.
        st.index_fds = crate::pages::OpenIndexFiles::new(crate::pages::INDEX_FILES_OPEN_MAX);
        st.wake_all();
        info!(dir = %self.sh.cfg.dir.display(), position = st.tail, "entry log closed cleanly");
        Ok(())
    }
}

pub(crate) fn check_mode(mode: Mode) -> Result<()> {
    match mode {
        Mode::Open => Ok(()),
        Mode::Failed => Err(StorageError::Failed),
        Mode::Closing | Mode::Closed => Err(StorageError::Closed),
    }
}

/// Buckets of [`FlushStats`]' distributions: bucket `i` counts values `v`
/// with `2^(i-1) <= v < 2^i` (bucket 0: `v == 0`); the last takes the rest.
pub const FLUSH_HISTOGRAM_BUCKETS: usize = 40;

/// The flusher's work since the log was opened: batches (group commits)
/// written and fdatasync'd, their records and bytes, and distributions of
/// the records per batch and of the microseconds each batch's write and
/// fdatasync took (one linked request, so timed together).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FlushStats {
    pub batches: u64,
    pub records: u64,
    /// Bytes written and synced (batch headers and page padding included).
    pub bytes: u64,
    pub records_per_batch: [u64; FLUSH_HISTOGRAM_BUCKETS],
    pub sync_us: [u64; FLUSH_HISTOGRAM_BUCKETS],
    pub sync_us_sum: u64,
}

impl Default for FlushStats {
    fn default() -> Self {
        Self {
            batches: 0,
            records: 0,
            bytes: 0,
            records_per_batch: [0; FLUSH_HISTOGRAM_BUCKETS],
            sync_us: [0; FLUSH_HISTOGRAM_BUCKETS],
            sync_us_sum: 0,
        }
    }
}

impl FlushStats {
    /// The bucket of `v` (see [`FLUSH_HISTOGRAM_BUCKETS`]).
    pub fn bucket_of(v: u64) -> usize {
        ((u64::BITS - v.leading_zeros()) as usize).min(FLUSH_HISTOGRAM_BUCKETS - 1)
    }

    fn record(&mut self, records: u64, bytes: u64, sync_us: u64) {
        self.batches += 1;
        self.records += records;
        self.bytes += bytes;
        self.records_per_batch[Self::bucket_of(records)] += 1;
        self.sync_us[Self::bucket_of(sync_us)] += 1;
        self.sync_us_sum += sync_us;
    }
}
