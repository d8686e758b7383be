//! Read-only view of a shard directory for offline tools (`magnetar
//! inspect`): no broker, no glommio, plain `std` reads, nothing written.
//!
//! [`ShardImage::load`] reads the checkpoint, the clean-shutdown marker, the
//! index pages the checkpoint names and the segments, and rebuilds what
//! recovery would: every ledger's index (entry → position, length, checksum,
//! publish time, key hash), the metadata map, and where the log ends. It
//! walks the log with the walker recovery uses (`walk.rs`: which batch is
//! valid, where the log ends, torn tail or damage) and decodes everything
//! else through the same `format` functions ([`records`],
//! [`check_entry_record`], `decode_index_page`, `Checkpoint::decode`), so the
//! tool and the broker accept and reject exactly the same bytes.
//!
//! Two modes:
//! - [`ScanMode::Tail`]: index files for everything before the checkpoint,
//!   then the log from the checkpoint position (what a crash recovery reads).
//! - [`ScanMode::Verify`]: every batch and record of every segment from the
//!   first, checksums included, arriving at the checkpoint position with
//!   its next batch and going on from there as recovery does (so both end
//!   the log at the same position), and every index entry compared with the
//!   record it points at. Damage is `StorageError::Corrupt` naming the file
//!   and offset.
//!
//! The verdicts are recovery's (`docs/format.md`, "Open"): a damaged batch
//! followed by a valid one is `Corrupt`; a damaged last batch that cannot be
//! a torn write is `Corrupt` (`DamagedNotTorn`); a torn last batch is
//! reported as [`Tail::Torn`] (recovery will truncate it; it was never
//! acknowledged), not as an error.
//!
//! Not for a directory a running broker is writing: the view would be a
//! moving target (the tool says so; nothing here can damage the files).

use std::collections::BTreeMap;
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::disk::PAGE_BYTES;
use crate::error::{CorruptReason, Result, StorageError};
use crate::format::{
    check_entry_record, decode_index_page, records, split_meta, BatchHeader, Checkpoint, CleanMarker, IndexEntry,
    KIND_DELETE, KIND_ENTRY, KIND_MOVE, RECORD_HEADER_BYTES,
};
use crate::walk::{At, Segs, Start, Verdict, Visit, Walker};
use futures_lite::future::block_on;

/// Position of an entry a full scan has not met yet: its original record
/// was in a segment compaction emptied and garbage collection removed; its
/// `KIND_MOVE` copy comes later in the log.
const HOLE: u64 = u64::MAX;

/// How much of the log [`ShardImage::load`] reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanMode {
    /// Index files, then the log from the checkpoint position (fast).
    Tail,
    /// Every batch and record checksum from the first segment on, and every
    /// index entry against its record.
    Verify,
}

/// One segment file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SegmentInfo {
    /// First log position held by the segment (from its name).
    pub start: u64,
    pub path: PathBuf,
    /// File size in bytes (preallocated: usually `segment_bytes`).
    pub file_bytes: u64,
    /// Batches scanned in this segment (0 for segments the scan skipped).
    pub batches: u64,
    /// Entries whose record lies in this segment (from the index).
    pub entries: u64,
    /// Body bytes of those entries.
    pub entry_bytes: u64,
}

/// One ledger as the index describes it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LedgerInfo {
    /// Entries `0..entries.len()`, by entry id.
    pub index: Vec<IndexEntry>,
    /// Entries `0..indexed` are in the ledger's index file (per checkpoint).
    pub indexed: u64,
    /// Sum of the entries' body lengths.
    pub bytes: u64,
}

/// Where the log ends, and in what state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Tail {
    /// A valid clean-shutdown marker names the checkpoint: the log ends at
    /// its position (the tail was not scanned in `Tail` mode).
    Clean { position: u64 },
    /// Zeros after the last valid batch: the state a recovery leaves.
    End { position: u64 },
    /// The last batch is torn (a crash during its write; never
    /// acknowledged): the next open zeroes `bytes` bytes from `offset` of
    /// `file`.
    Torn { position: u64, file: PathBuf, offset: u64, bytes: u64, reason: CorruptReason },
}

impl Tail {
    /// The log position after the last valid batch.
    pub fn position(&self) -> u64 {
        match self {
            Tail::Clean { position } | Tail::End { position } | Tail::Torn { position, .. } => *position,
        }
    }
}

/// Counters of what a load read and checked.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Checked {
    pub bytes_scanned: u64,
    pub batches: u64,
    pub records: u64,
    pub index_pages: u64,
    /// Index entries compared with their records (`Verify` only).
    pub index_entries: u64,
    /// Key index item pages verified (`Verify` only).
    pub key_pages: u64,
}

/// One key index file (`keys/<seq>.kix`; see `keyindex.rs`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFileInfo {
    pub path: PathBuf,
    pub header: crate::keyindex::KeyFileHeader,
}

/// A read-only picture of one shard directory. Plain data: owned by whoever
/// loaded it, usable from any thread.
#[derive(Debug, Clone)]
pub struct ShardImage {
    pub dir: PathBuf,
    pub checkpoint: Option<Checkpoint>,
    /// A clean-shutdown marker matches the checkpoint.
    pub clean: bool,
    pub segments: Vec<SegmentInfo>,
    /// Every ledger with an entry, by id.
    pub ledgers: BTreeMap<u64, LedgerInfo>,
    /// Metadata as recovery would restore it (last write per key wins;
    /// deleted keys absent).
    pub meta: BTreeMap<Vec<u8>, Vec<u8>>,
    pub tail: Tail,
    pub checked: Checked,
    /// Files in `log/`, `index/` or `keys/` that do not belong to the format.
    pub stray_files: Vec<PathBuf>,
    /// Key index files, by sequence number (derived data: the broker
    /// rebuilds a damaged one from the ledger indexes).
    pub key_files: Vec<KeyFileInfo>,
    ckpt_pos: u64,
    ckpt_ledgers: std::collections::HashSet<u64>,
    /// Deleted ledgers met with gaps during a full scan.
    dead: std::collections::HashSet<u64>,
    /// Indexes of ledgers whose deletion record the scan replayed.
    deleted_after: BTreeMap<u64, Vec<IndexEntry>>,
    /// Entries the scan saw moved by compaction (their index-file position
    /// is the original's).
    moved: std::collections::HashSet<(u64, u64)>,
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StorageError {
    let path = path.to_path_buf();
    move |e| StorageError::Io { op, path, source: e }
}

fn corrupt(file: &Path, offset: u64, reason: CorruptReason) -> StorageError {
    StorageError::Corrupt { file: file.to_path_buf(), offset, reason }
}

/// The segments as the walker reads them: (start, usable length, path),
/// through plain `pread`s.
struct Files(Vec<(u64, u64, PathBuf)>);

impl Segs for Files {
    fn seg_count(&self) -> usize {
        self.0.len()
    }

    fn seg_start(&self, i: usize) -> u64 {
        self.0[i].0
    }

    fn seg_len(&self, i: usize) -> u64 {
        self.0[i].1
    }

    fn seg_path(&self, i: usize) -> &Path {
        &self.0[i].2
    }

    async fn read_seg(&self, i: usize, off: u64, len: usize) -> Result<Vec<u8>> {
        let path = &self.0[i].2;
        let file = File::open(path).map_err(io_err("open segment", path))?;
        let mut buf = vec![0u8; len];
        let mut got = 0usize;
        while got < buf.len() {
            let n = file.read_at(&mut buf[got..], off + got as u64).map_err(io_err("read segment", path))?;
            if n == 0 {
                break;
            }
            got += n;
        }
        buf.truncate(got);
        Ok(buf)
    }
}

/// What the walk applies to the image being built.
struct Apply<'a> {
    img: &'a mut ShardImage,
    ckpt_pos: u64,
    total: u64,
    progress: &'a mut dyn FnMut(u64, u64),
}

impl Visit for Apply<'_> {
    fn batch(&mut self, seg: usize, off: u64, position: u64, h: &BatchHeader, body: &[u8]) -> Result<()> {
        let path = self.img.segments[seg].path.clone();
        self.img.apply(&path, off, position, h, body, position >= self.ckpt_pos)?;
        self.img.segments[seg].batches += 1;
        self.img.checked.batches += 1;
        Ok(())
    }

    fn next_entry(&self, ledger: u64) -> Option<u64> {
        self.img.ledgers.get(&ledger).map(|l| l.index.len() as u64)
    }

    fn progress(&mut self, scanned: u64) {
        (self.progress)(scanned, self.total);
    }
}

fn read_file(path: &Path) -> Result<Option<Vec<u8>>> {
    match std::fs::read(path) {
        Ok(b) => Ok(Some(b)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(StorageError::Io { op: "read", path: path.to_path_buf(), source: e }),
    }
}

/// Parses `<20 digits><suffix>`.
fn numbered(name: &str, suffix: &str) -> Option<u64> {
    name.strip_suffix(suffix).filter(|s| s.len() == 20).and_then(|s| s.parse().ok())
}

impl ShardImage {
    /// Whether `dir` looks like a shard directory (has a `log/` directory).
    pub fn is_shard_dir(dir: &Path) -> bool {
        dir.join("log").is_dir()
    }

    /// Loads a shard directory; see the module docs. `progress(done, total)`
    /// is called with bytes of log read so far, about every chunk.
    pub fn load(dir: &Path, mode: ScanMode, progress: &mut dyn FnMut(u64, u64)) -> Result<ShardImage> {
        let log_dir = dir.join("log");
        let index_dir = dir.join("index");
        let ckpt_path = dir.join("checkpoint");
        let checkpoint = match read_file(&ckpt_path)? {
            Some(b) => Some(Checkpoint::decode(&b).map_err(|r| corrupt(&ckpt_path, 0, r))?),
            None => None,
        };
        let marker = read_file(&dir.join("CLEAN"))?.and_then(|b| CleanMarker::decode(&b));
        let clean = match (&checkpoint, &marker) {
            (Some(c), Some(m)) => {
                m.ckpt_seq == c.ckpt_seq && m.position == c.position && m.next_batch_seq == c.next_batch_seq
            }
            _ => false,
        };

        let mut stray_files = Vec::new();
        let mut segments = Vec::new();
        for ent in std::fs::read_dir(&log_dir).map_err(io_err("list", &log_dir))? {
            let ent = ent.map_err(io_err("list", &log_dir))?;
            let path = ent.path();
            let name = ent.file_name().to_string_lossy().into_owned();
            match numbered(&name, ".seg") {
                Some(start) => {
                    let md = ent.metadata().map_err(io_err("stat", &path))?;
                    segments.push(SegmentInfo {
                        start,
                        path,
                        file_bytes: md.len(),
                        batches: 0,
                        entries: 0,
                        entry_bytes: 0,
                    });
                }
                None => stray_files.push(path),
            }
        }
        segments.sort_by_key(|s| s.start);
        if let Ok(rd) = std::fs::read_dir(&index_dir) {
            for ent in rd.flatten() {
                let name = ent.file_name().to_string_lossy().into_owned();
                if numbered(&name, ".idx").is_none() {
                    stray_files.push(ent.path());
                }
            }
        }

        let mut img = ShardImage {
            dir: dir.to_path_buf(),
            checkpoint: checkpoint.clone(),
            clean,
            segments,
            ledgers: BTreeMap::new(),
            meta: BTreeMap::new(),
            tail: Tail::End { position: 0 },
            checked: Checked::default(),
            stray_files,
            ckpt_pos: checkpoint.as_ref().map_or(0, |c| c.position),
            ckpt_ledgers: checkpoint.as_ref().map(|c| c.ledgers.iter().map(|l| l.ledger).collect()).unwrap_or_default(),
            dead: Default::default(),
            deleted_after: BTreeMap::new(),
            moved: Default::default(),
            key_files: Vec::new(),
        };

        // Index files and metadata as of the checkpoint.
        let (ckpt_pos, ckpt_seq) = checkpoint.as_ref().map_or((0, 0), |c| (c.position, c.next_batch_seq));
        let mut from_files: BTreeMap<u64, Vec<IndexEntry>> = BTreeMap::new();
        if let Some(c) = &checkpoint {
            for (k, v) in &c.meta {
                img.meta.insert(k.clone(), v.clone());
            }
            for cl in &c.ledgers {
                let path = index_dir.join(format!("{:020}.idx", cl.ledger));
                let es = load_index(&path, cl.ledger, cl.indexed_entries, cl.pages, c.position)?;
                img.checked.index_pages += cl.pages;
                from_files.insert(cl.ledger, es);
            }
            // Entries compaction moved after their index page was written.
            let ckpt_path = dir.join("checkpoint");
            for r in &c.relocations {
                let bad =
                    |field, expected, found| corrupt(&ckpt_path, 0, CorruptReason::Field { field, expected, found });
                let es = from_files
                    .get_mut(&r.ledger)
                    .ok_or_else(|| bad("relocation ledger (not in the checkpoint)", 0, r.ledger))?;
                let len = es.len() as u64;
                let ie = usize::try_from(r.entry)
                    .ok()
                    .and_then(|i| es.get_mut(i))
                    .ok_or_else(|| bad("relocation entry", len, r.entry))?;
                if r.position >= c.position {
                    return Err(bad("relocation position", c.position, r.position));
                }
                ie.position = r.position;
                ie.record_crc = r.record_crc;
            }
        }

        let total: u64 = img.segments.iter().map(|s| s.file_bytes).sum();
        match mode {
            ScanMode::Tail => {
                for (id, es) in from_files {
                    let l = img.ledgers.entry(id).or_default();
                    l.indexed = es.len() as u64;
                    l.index = es;
                }
                if clean {
                    img.tail = Tail::Clean { position: ckpt_pos };
                } else {
                    img.scan(ckpt_pos, Some(ckpt_seq), true, total, progress)?;
                }
            }
            ScanMode::Verify => {
                // From the very first batch; its seq is taken from the log
                // (0 unless earlier segments were ever removed).
                let start = img.segments.first().map_or(0, |s| s.start);
                img.scan(start, None, false, total, progress)?;
                // Ledgers not in the checkpoint with every entry before it
                // were deleted before it.
                let (cp, cl) = (img.ckpt_pos, img.ckpt_ledgers.clone());
                img.ledgers.retain(|id, l| cl.contains(id) || l.index.last().is_some_and(|e| e.position >= cp));
                if start > ckpt_pos {
                    return Err(corrupt(
                        &log_dir,
                        0,
                        CorruptReason::Field {
                            field: "first segment start (checkpoint position)",
                            expected: ckpt_pos,
                            found: start,
                        },
                    ));
                }
                // Every index entry in the files must equal what the log says.
                for (id, es) in &from_files {
                    let path = index_dir.join(format!("{id:020}.idx"));
                    let scanned = img
                        .ledgers
                        .get(id)
                        .map(|l| &l.index[..])
                        .or_else(|| img.deleted_after.get(id).map(|v| &v[..]))
                        .unwrap_or(&[]);
                    for (i, e) in es.iter().enumerate() {
                        // A moved entry: the copy must describe the same entry.
                        let same = |s: &IndexEntry| {
                            if img.moved.contains(&(*id, i as u64)) {
                                (s.body_len, s.extras) == (e.body_len, e.extras)
                            } else {
                                s == e
                            }
                        };
                        if !scanned.get(i).is_some_and(same) {
                            let page = (i / crate::format::INDEX_ENTRIES_PER_PAGE) as u64 * PAGE_BYTES;
                            let found = scanned.get(i).map_or(u64::MAX, |s| s.position);
                            return Err(corrupt(
                                &path,
                                page,
                                CorruptReason::Field {
                                    field: "index entry position (as found in the log)",
                                    expected: e.position,
                                    found,
                                },
                            ));
                        }
                        img.checked.index_entries += 1;
                    }
                    if let Some(l) = img.ledgers.get_mut(id) {
                        l.indexed = es.len() as u64;
                    }
                }
                if clean && img.tail.position() != ckpt_pos {
                    return Err(corrupt(
                        &dir.join("CLEAN"),
                        0,
                        CorruptReason::Field {
                            field: "clean marker position (log end)",
                            expected: img.tail.position(),
                            found: ckpt_pos,
                        },
                    ));
                }
            }
        }

        img.load_key_files(&dir.join("keys"), mode)?;

        // An entry whose original went with a compacted segment must have
        // been met as a copy.
        for (id, l) in &img.ledgers {
            if let Some(i) = l.index.iter().position(|e| e.position == HOLE) {
                return Err(corrupt(
                    &index_dir.join(format!("{id:020}.idx")),
                    0,
                    CorruptReason::Field {
                        field: "entry missing from the log (no record or copy)",
                        expected: i as u64,
                        found: HOLE,
                    },
                ));
            }
        }
        // Per-segment totals from the index.
        for l in img.ledgers.values_mut() {
            l.bytes = l.index.iter().map(|e| e.body_len as u64).sum();
        }
        for l in img.ledgers.values() {
            for e in &l.index {
                let i = img.segments.partition_point(|s| s.start <= e.position);
                if let Some(s) = i.checked_sub(1).and_then(|i| img.segments.get_mut(i)) {
                    s.entries += 1;
                    s.entry_bytes += e.body_len as u64;
                }
            }
        }
        Ok(img)
    }

    /// Scans batches from `position` (batch `seq`, or whatever the first
    /// batch says when `None`), replaying entries into the ledger indexes
    /// and, at or after the checkpoint position, metadata into the map.
    fn scan(
        &mut self,
        position: u64,
        seq: Option<u64>,
        tail_only: bool,
        total: u64,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<()> {
        let ckpt_pos = self.checkpoint.as_ref().map_or(0, |c| c.position);
        let files = Files(
            self.segments.iter().map(|s| (s.start, s.file_bytes - s.file_bytes % PAGE_BYTES, s.path.clone())).collect(),
        );
        if !tail_only {
            // In Verify mode the ledgers are rebuilt from the log alone.
            self.ledgers.clear();
        }
        let mut w = Walker::new(&files);
        // A segment shorter than its batches say it was preallocated: cut
        // by hand, acknowledged batches may be gone (recovery refuses it).
        for i in 0..files.0.len() {
            if let Some((_, reason)) = block_on(w.truncation(i, ckpt_pos))? {
                return Err(corrupt(&files.0[i].2, files.0[i].1, reason));
            }
        }
        // In Verify mode, segments before the checkpoint may have been
        // removed by garbage collection: the walk resumes after the gap,
        // and must arrive at the checkpoint's position with its next batch.
        let checkpoint = self.checkpoint.as_ref().filter(|_| !tail_only).map(|c| (c.position, c.next_batch_seq));
        let start = Start { position, seq, gaps_before: (!tail_only).then_some(ckpt_pos), cut_at: None, checkpoint };
        let mut visit = Apply { img: self, ckpt_pos, total, progress };
        let verdict = block_on(w.walk(start, &mut visit))?;
        self.checked.bytes_scanned += w.scanned;
        progress(total, total);
        let path = |at: &At| files.0[at.seg].2.clone();
        self.tail = match verdict {
            Verdict::End { position, .. } => Tail::End { position },
            Verdict::Torn { at, nonzero_end, reason } if nonzero_end > at.position => Tail::Torn {
                position: at.position,
                file: path(&at),
                offset: at.off,
                bytes: nonzero_end - at.position,
                reason,
            },
            Verdict::Torn { at, .. } => Tail::End { position: at.position },
            Verdict::Damage { at, damage, .. } => return Err(corrupt(&path(&at), at.off, damage)),
            Verdict::Cut { .. } => unreachable!("the inspector never cuts"),
        };
        Ok(())
    }

    /// Applies one verified batch.
    fn apply(&mut self, path: &Path, off: u64, position: u64, h: &BatchHeader, b: &[u8], meta: bool) -> Result<()> {
        for r in records(h, b) {
            let r = r.map_err(|(o, reason)| corrupt(path, off + o as u64, reason))?;
            self.checked.records += 1;
            let rh = r.header;
            if rh.kind == KIND_DELETE {
                if let Some(l) = self.ledgers.remove(&rh.ledger) {
                    // Kept so that a full verify can still compare the
                    // ledger's index file (the checkpoint may list it).
                    self.deleted_after.insert(rh.ledger, l.index);
                }
            } else if rh.kind == KIND_MOVE {
                // A compaction copy: the entry lives here now. One for a
                // ledger gone (deleted) is unreferenced.
                // (A full scan may meet the copy before any surviving
                // record of a ledger the checkpoint lists.)
                if self.ckpt_ledgers.contains(&rh.ledger) && !self.deleted_after.contains_key(&rh.ledger) {
                    self.ledgers.entry(rh.ledger).or_default();
                }
                let Some(l) = self.ledgers.get_mut(&rh.ledger) else { continue };
                let at = position + r.offset as u64;
                let ie = IndexEntry { position: at, body_len: rh.body_len, record_crc: rh.crc, extras: rh.extras };
                let i = rh.entry as usize;
                if i >= l.index.len() {
                    // Full scan: the original was in a removed segment (a
                    // hole nothing fills is reported at the end).
                    l.index.resize(i + 1, IndexEntry { position: HOLE, ..ie });
                }
                l.index[i] = ie;
                self.moved.insert((rh.ledger, rh.entry));
            } else if rh.kind == KIND_ENTRY {
                // Before the checkpoint, a ledger the checkpoint does not list
                // was deleted; garbage collection may have removed some of
                // its segments, so its entries need not be dense. Skip it.
                let dead = |me: &Self| position < me.ckpt_pos && !me.ckpt_ledgers.contains(&rh.ledger);
                if self.dead.contains(&rh.ledger) && dead(self) {
                    continue;
                }
                let l = self.ledgers.entry(rh.ledger).or_default();
                if rh.entry != l.index.len() as u64 && dead(self) {
                    self.ledgers.remove(&rh.ledger);
                    self.dead.insert(rh.ledger);
                    continue;
                }
                let l = self.ledgers.entry(rh.ledger).or_default();
                if rh.entry > l.index.len() as u64 && self.ckpt_ledgers.contains(&rh.ledger) {
                    // A live ledger whose earlier entries' segment was
                    // compacted and removed: their copies come later.
                    let hole = IndexEntry { position: HOLE, body_len: 0, record_crc: 0, extras: rh.extras };
                    l.index.resize(rh.entry as usize, hole);
                }
                if rh.entry != l.index.len() as u64 {
                    return Err(corrupt(
                        path,
                        off + r.offset as u64,
                        CorruptReason::EntryOrder {
                            ledger: rh.ledger,
                            expected: l.index.len() as u64,
                            found: rh.entry,
                        },
                    ));
                }
                l.index.push(IndexEntry {
                    position: position + r.offset as u64,
                    body_len: rh.body_len,
                    record_crc: rh.crc,
                    extras: rh.extras,
                });
            } else if meta {
                let (k, v) = split_meta(r.body).map_err(|reason| corrupt(path, off + r.offset as u64, reason))?;
                if v.is_empty() {
                    self.meta.remove(k);
                } else {
                    self.meta.insert(k.to_vec(), v.to_vec());
                }
            }
        }
        Ok(())
    }

    /// Reads the key index files' headers; in `Verify` mode also every item
    /// page, and each item against the ledger index (same key hash) when the
    /// ledger still exists.
    fn load_key_files(&mut self, dir: &Path, mode: ScanMode) -> Result<()> {
        use crate::keyindex::{decode_key_file_header, decode_key_page, key_file_header_len};
        let Ok(rd) = std::fs::read_dir(dir) else { return Ok(()) };
        let mut files: Vec<(u64, PathBuf)> = Vec::new();
        for ent in rd.flatten() {
            let name = ent.file_name().to_string_lossy().into_owned();
            match numbered(&name, ".kix") {
                Some(seq) => files.push((seq, ent.path())),
                None => self.stray_files.push(ent.path()),
            }
        }
        files.sort();
        for (_, path) in files {
            let b = std::fs::read(&path).map_err(io_err("read key index file", &path))?;
            let len = key_file_header_len(&b).map_err(|r| corrupt(&path, 0, r))?;
            let header = decode_key_file_header(&b[..(len as usize).min(b.len())]).map_err(|r| corrupt(&path, 0, r))?;
            if mode == ScanMode::Verify {
                for p in 0..header.item_pages {
                    let off = (header.header_pages + p as u64) * PAGE_BYTES;
                    let page = b.get(off as usize..).unwrap_or(&[]);
                    let items = decode_key_page(page, p).map_err(|r| corrupt(&path, off, r))?;
                    for it in items {
                        let ie = self.ledgers.get(&it.ledger).and_then(|l| l.index.get(it.entry as usize));
                        if let Some(ie) = ie {
                            if ie.extras.key_hash != it.key_hash {
                                return Err(corrupt(
                                    &path,
                                    off,
                                    CorruptReason::Field {
                                        field: "key index item hash (as in the ledger index)",
                                        expected: ie.extras.key_hash as u64,
                                        found: it.key_hash as u64,
                                    },
                                ));
                            }
                        }
                    }
                    self.checked.key_pages += 1;
                }
            }
            self.key_files.push(KeyFileInfo { path, header });
        }
        Ok(())
    }

    /// The segment holding log position `p`.
    pub fn segment_at(&self, p: u64) -> Option<&SegmentInfo> {
        let i = self.segments.partition_point(|s| s.start <= p).checked_sub(1)?;
        self.segments.get(i).filter(|s| p < s.start + s.file_bytes)
    }

    /// Reads one entry's body from its segment, with the record checksum and
    /// fields checked against the index (`Corrupt` naming file and offset
    /// otherwise; the bytes are never returned then).
    pub fn read_entry(&self, ledger: u64, entry: u64) -> Result<(IndexEntry, Vec<u8>)> {
        let no = StorageError::NoSuchEntry { ledger, entry };
        let l = self.ledgers.get(&ledger).ok_or(no)?;
        let ie = *usize::try_from(entry)
            .ok()
            .and_then(|i| l.index.get(i))
            .ok_or(StorageError::NoSuchEntry { ledger, entry })?;
        let seg = self.segment_at(ie.position).ok_or(StorageError::NoSuchEntry { ledger, entry })?;
        let off = ie.position - seg.start;
        let len = RECORD_HEADER_BYTES + ie.body_len as usize;
        let file = File::open(&seg.path).map_err(io_err("open segment", &seg.path))?;
        let mut raw = vec![0u8; len];
        file.read_exact_at(&mut raw, off).map_err(io_err("read entry", &seg.path))?;
        check_entry_record(&raw, &ie, ledger, entry).map_err(|r| corrupt(&seg.path, off, r))?;
        raw.drain(..RECORD_HEADER_BYTES);
        Ok((ie, raw))
    }
}

/// Loads and checks pages `0..pages` of an index file (like recovery).
fn load_index(path: &Path, ledger: u64, entries: u64, pages: u64, ckpt_position: u64) -> Result<Vec<IndexEntry>> {
    let file = File::open(path).map_err(io_err("open index file", path))?;
    let need = pages * PAGE_BYTES;
    let mut b = vec![0u8; need as usize];
    let mut got = 0usize;
    while got < b.len() {
        let n = file.read_at(&mut b[got..], got as u64).map_err(io_err("read index file", path))?;
        if n == 0 {
            return Err(corrupt(path, got as u64, CorruptReason::ShortFile { len: got as u64, need }));
        }
        got += n;
    }
    let mut index: Vec<IndexEntry> = Vec::with_capacity(entries as usize);
    for (i, page) in b.chunks(PAGE_BYTES as usize).enumerate() {
        let off = i as u64 * PAGE_BYTES;
        let (first, es) = decode_index_page(page, ledger).map_err(|r| corrupt(path, off, r))?;
        if first != index.len() as u64 {
            let reason =
                CorruptReason::Field { field: "index page first entry", expected: index.len() as u64, found: first };
            return Err(corrupt(path, off, reason));
        }
        for e in es {
            if e.position >= ckpt_position {
                let reason =
                    CorruptReason::Field { field: "index entry position", expected: ckpt_position, found: e.position };
                return Err(corrupt(path, off, reason));
            }
            index.push(e);
        }
    }
    if index.len() as u64 != entries {
        let reason = CorruptReason::Field { field: "index entries", expected: entries, found: index.len() as u64 };
        return Err(corrupt(path, 0, reason));
    }
    Ok(index)
}
