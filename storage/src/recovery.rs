//! Opening a log: load the checkpoint, the index files and the metadata
//! snapshot, then (unless a clean-shutdown marker matches) scan the log from
//! the checkpoint position, verifying every batch and record, and truncate a
//! torn tail. The case analysis is in `docs/format.md`, "What a crash leaves".

use std::cell::RefCell;
use std::io;
use std::path::Path;
use std::rc::Rc;
use std::time::Instant;

use futures::{StreamExt, TryStreamExt};
use tracing::{error, info, warn};

use crate::disk::{Disk, DiskFile, DmaDisk, OpenMode, PAGE_BYTES};
use crate::error::{CorruptReason, Result, StorageError};
use crate::format::{
    records, split_meta, BatchHeader, Checkpoint, CleanMarker, IndexEntry, BATCH_FLAG_OVER_STALE, KIND_DELETE,
    KIND_ENTRY, KIND_MOVE, RECORD_HEADER_BYTES,
};
use crate::log::{checkpointer, flusher, zeroer, EntryLog, Ledger, LogConfig, Paths, Recovery, Segment, Shared, State};
use crate::pages::{read_pages, Firsts, PageWalk};
use crate::walk::{At, Segs, Start, Verdict, Visit, Walker};

/// Bytes zeroed per write when cutting a torn tail.
const ZERO_CHUNK_BYTES: u64 = 1 << 20;

impl EntryLog<DmaDisk> {
    /// Opens (creating if needed) and recovers the production log on glommio
    /// DMA files. Must be called inside a glommio executor: it spawns the
    /// group-commit flusher and the periodic checkpoint task on it.
    pub async fn open(config: LogConfig) -> Result<(EntryLog, Recovery)> {
        EntryLog::open_with(DmaDisk::default(), config).await
    }
}

fn io_err(op: &'static str, path: &Path) -> impl FnOnce(io::Error) -> StorageError {
    let path = path.to_path_buf();
    move |e| StorageError::io(op, path, e)
}

async fn read_whole<F: DiskFile>(file: &F, path: &Path) -> Result<Vec<u8>> {
    let len = file.size().await.map_err(io_err("stat", path))?;
    file.read_at(0, len as usize).await.map_err(io_err("read", path))
}

/// Recovery reads the segments for the walker through its `Disk` backend.
impl<F: DiskFile> Segs for [Rc<Segment<F>>] {
    fn seg_count(&self) -> usize {
        self.len()
    }

    fn seg_start(&self, i: usize) -> u64 {
        self[i].start
    }

    fn seg_len(&self, i: usize) -> u64 {
        self[i].len
    }

    fn seg_path(&self, i: usize) -> &Path {
        &self[i].path
    }

    async fn read_seg(&self, i: usize, off: u64, len: usize) -> Result<Vec<u8>> {
        self[i].file.read_at(off, len).await.map_err(io_err("read segment", &self[i].path))
    }
}

/// What the walk replays into the state being rebuilt.
struct Replay<'a, F> {
    segs: &'a [Rc<Segment<F>>],
    st: &'a mut State<F>,
    replayed: u64,
}

impl<F> Visit for Replay<'_, F> {
    fn batch(&mut self, seg: usize, off: u64, position: u64, h: &BatchHeader, body: &[u8]) -> Result<()> {
        self.replayed += replay(self.st, &self.segs[seg].path, off, position, h, body)?;
        Ok(())
    }

    fn next_entry(&self, ledger: u64) -> Option<u64> {
        self.st.ledgers.get(&ledger).map(|l| l.laid_out())
    }
}

/// What the scan rebuilt.
struct Scanned {
    tail: u64,
    next_seq: u64,
    scanned: u64,
    truncated: u64,
    replayed: u64,
}

impl<D: Disk> EntryLog<D> {
    /// Opens (creating if needed) and recovers a log on any [`Disk`] backend.
    /// Must be called inside a glommio executor (it spawns the flusher and the
    /// checkpoint task on the current one).
    pub async fn open_with(disk: D, config: LogConfig) -> Result<(EntryLog<D>, Recovery)> {
        let started = Instant::now();
        config.validate()?;
        let paths = Paths::new(&config.dir);
        for d in [&paths.dir, &paths.log_dir, &paths.index_dir] {
            disk.create_dir_all(d).await.map_err(io_err("create directory", d))?;
        }
        // The directories themselves must be durable before anything in them
        // is acknowledged: fsync the shard directory (holding log/ and index/)
        // and its parent (holding the shard directory).
        let parent = paths.dir.parent().filter(|p| !p.as_os_str().is_empty());
        for d in std::iter::once(paths.dir.as_path()).chain(parent) {
            disk.sync_dir(d).await.map_err(io_err("fsync directory", d))?;
        }
        disk.prepare(&paths.dir).await.map_err(io_err("prepare", &paths.dir))?;
        if !config.allow_tmpfs && disk.is_tmpfs(&paths.dir).map_err(io_err("statfs", &paths.dir))? {
            return Err(StorageError::Tmpfs(paths.dir.clone()));
        }
        let mut st: State<D::File> = State::new();
        st.icache = crate::pages::IndexCache::new(config.index_cache_bytes);

        // Segments, by start position.
        let mut names = disk.list_dir(&paths.log_dir).await.map_err(io_err("list", &paths.log_dir))?;
        names.sort();
        let mut segs: Vec<Rc<Segment<D::File>>> = Vec::new();
        for name in names {
            let Some(start) = name.strip_suffix(".seg").filter(|s| s.len() == 20).and_then(|s| s.parse::<u64>().ok())
            else {
                warn!(name, "ignoring unexpected file in log directory");
                continue;
            };
            let path = paths.log_dir.join(&name);
            let file = disk.open(&path, OpenMode::Existing).await.map_err(io_err("open segment", &path))?;
            let size = file.size().await.map_err(io_err("stat segment", &path))?;
            segs.push(Rc::new(Segment { start, len: size - size % PAGE_BYTES, path, file, recycled: false.into() }));
        }
        segs.sort_by_key(|s| s.start);

        // Checkpoint: written by rename after fsync, so it is complete or
        // absent; damaged only by rot (or a hand). Then its copy, written
        // the same way after it; then, when the log still starts at
        // position 0 (no segment ever removed), the log itself.
        let mut rebuilt: Vec<String> = Vec::new();
        // Falling back on the copy is said once, in the log and in the
        // recovery report.
        let mut use_copy = |why: String, c: Checkpoint| {
            let line = format!(
                "{why}; using {} (checkpoint {}, position {})",
                paths.checkpoint_copy.display(),
                c.ckpt_seq,
                c.position
            );
            warn!("{line}");
            rebuilt.push(line);
            Some(c)
        };
        let ckpt = match read_checkpoint(&disk, &paths.checkpoint).await? {
            // The copy is written after the checkpoint: with no checkpoint
            // there is none, unless the checkpoint was removed by hand.
            Ok(None) => match read_checkpoint(&disk, &paths.checkpoint_copy).await? {
                Ok(Some(c)) => use_copy(format!("{} is missing", paths.checkpoint.display()), c),
                _ => None,
            },
            Ok(c) => c,
            Err(damage) => match read_checkpoint(&disk, &paths.checkpoint_copy).await? {
                Ok(Some(c)) => use_copy(damage.to_string(), c),
                _ if segs.first().is_none_or(|s| s.start == 0) => {
                    let line = format!("{damage}; rebuilding it from the whole log (it starts at position 0)");
                    warn!("{line}");
                    rebuilt.push(line);
                    None
                }
                _ => return Err(damage),
            },
        };
        let marker = match disk.open(&paths.clean, OpenMode::Existing).await {
            Ok(f) => {
                let b = read_whole(&f, &paths.clean).await?;
                let m = CleanMarker::decode(&b);
                if m.is_none() {
                    warn!(path = %paths.clean.display(), "ignoring damaged clean-shutdown marker");
                }
                m
            }
            Err(e) if e.kind() == io::ErrorKind::NotFound => None,
            Err(e) => return Err(StorageError::io("open", &paths.clean, e)),
        };
        let clean = match (&ckpt, &marker) {
            (Some(c), Some(m)) => {
                m.ckpt_seq == c.ckpt_seq && m.position == c.position && m.next_batch_seq == c.next_batch_seq
            }
            _ => false,
        };

        // Index files and metadata snapshot as of the checkpoint.
        let (mut position, mut seq) = (segs.first().map_or(0, |s| s.start), 0);
        if let Some(c) = &ckpt {
            position = c.position;
            seq = c.next_batch_seq;
            st.ckpt_seq = c.ckpt_seq;
            st.ckpt_position = Some(c.position);
            for (k, v) in &c.meta {
                let v = bytes::Bytes::copy_from_slice(v);
                st.meta.insert(k.clone(), v.clone());
                st.meta_durable.insert(k.clone(), v);
            }
            // Entries compaction moved after their index page was written
            // (applied while the pages are read).
            let bad = |field, expected, found| {
                StorageError::corrupt(&paths.checkpoint, 0, CorruptReason::Field { field, expected, found })
            };
            let mut relocs: std::collections::HashMap<u64, Vec<&crate::format::Relocation>> =
                std::collections::HashMap::new();
            let listed: std::collections::HashSet<u64> = c.ledgers.iter().map(|cl| cl.ledger).collect();
            for r in &c.relocations {
                if !listed.contains(&r.ledger) {
                    return Err(bad("relocation ledger (not in the checkpoint)", 0, r.ledger));
                }
                if r.position >= c.position {
                    return Err(bad("relocation position", c.position, r.position));
                }
                relocs.entry(r.ledger).or_default().push(r);
            }
            let mut work = Vec::with_capacity(c.ledgers.len());
            for cl in &c.ledgers {
                let rs = relocs.remove(&cl.ledger).unwrap_or_default();
                if let Some(r) = rs.iter().find(|r| r.entry >= cl.indexed_entries) {
                    return Err(bad("relocation entry", cl.indexed_entries, r.entry));
                }
                work.push((cl, rs));
            }
            // INDEX_READS_IN_FLIGHT ledgers' files are read at once (one
            // after the other, a start waits for a read per ledger in turn),
            // their results taken in the checkpoint's order.
            let (disk_ref, paths_ref) = (&disk, &paths);
            let mut loads = futures::stream::iter(work)
                .map(|(cl, rs)| async move {
                    let loaded =
                        load_index(disk_ref, paths_ref, cl.ledger, cl.indexed_entries, cl.pages, c.position, &rs).await;
                    (cl, rs, loaded)
                })
                .buffered(INDEX_READS_IN_FLIGHT);
            while let Some((cl, rs, loaded)) = loads.next().await {
                let ledger = match loaded {
                    Ok((l, relocated)) => {
                        st.relocated.extend(relocated);
                        l
                    }
                    Err(damage @ (StorageError::Corrupt { .. } | StorageError::Io { .. })) => {
                        // Derived data: the entries are in the log before
                        // `P` (live ledgers keep their segments). They stay
                        // in `recent` with no index file, so the next
                        // checkpoint writes the file afresh from page 0.
                        let mut recent = rebuild_index(&segs, cl.ledger, cl.indexed_entries, c.position).await?;
                        // `recent` is the ledger's whole index now, and the
                        // pages the next checkpoint writes come from it: no
                        // relocation may stand beside it (a later copy found
                        // by the scan updates `recent` only), including any
                        // the failed load put there before the damage.
                        let stale: Vec<(u64, u64)> =
                            st.relocated.range((cl.ledger, 0)..=(cl.ledger, u64::MAX)).map(|(k, _)| *k).collect();
                        for k in stale {
                            st.relocated.remove(&k);
                        }
                        for r in &rs {
                            let ie = &mut recent[r.entry as usize];
                            ie.position = r.position;
                            ie.record_crc = r.record_crc;
                        }
                        let line = format!(
                            "{damage}; rebuilt the index of ledger {} ({} entries) from the log",
                            cl.ledger, cl.indexed_entries
                        );
                        warn!("{line}");
                        rebuilt.push(line);
                        let mut l = Ledger::new();
                        l.next_entry = cl.indexed_entries;
                        l.bytes = recent.iter().map(|e| e.body_len as u64).sum();
                        l.recent = recent;
                        l
                    }
                    Err(e) => return Err(e),
                };
                st.ledgers.insert(cl.ledger, ledger);
            }
        }

        let rewrite_now = !rebuilt.is_empty();
        let mut dropped = Vec::new();
        let scanned = if clean {
            Scanned { tail: position, next_seq: seq, scanned: 0, truncated: 0, replayed: 0 }
        } else {
            let accept = config.accept_data_loss;
            scan(&disk, &paths, &mut segs, &mut st, position, seq, accept, &mut dropped).await?
        };
        st.tail = scanned.tail;
        st.next_seq = scanned.next_seq;
        // Segments at or after the tail hold no batch: spares made ahead of
        // need, or leftovers of a creation a crash interrupted (whose size or
        // name may not be durable). Remove them; the flusher makes fresh ones.
        let mut removed_segment = false;
        for s in segs {
            if s.start >= scanned.tail {
                disk.remove(&s.path).await.map_err(io_err("remove unused segment", &s.path))?;
                removed_segment = true;
            } else {
                st.segments.insert(s.start, s);
            }
        }
        if removed_segment {
            disk.sync_dir(&paths.log_dir).await.map_err(io_err("fsync log directory", &paths.log_dir))?;
        }
        // The flusher goes on writing into the last segment: if it is a
        // recycled one (its first batch says so), so are its next batches.
        if let Some(seg) = st.segments.values().next_back() {
            let page = seg.file.read_at(0, PAGE_BYTES as usize).await.map_err(io_err("read segment", &seg.path))?;
            if page.len() == PAGE_BYTES as usize {
                if let Ok(h) = BatchHeader::decode(&page) {
                    seg.recycled.set(h.position == seg.start && h.flags & BATCH_FLAG_OVER_STALE != 0);
                }
            }
            // Written up to the tail; a recycled segment all through.
            st.zeroed = if seg.recycled.get() { seg.end() } else { scanned.tail };
        }
        // Live entries per segment, for garbage collection and compaction.
        // Those in `recent` are counted now; those in index files are read
        // again after open, in the background (`count_live_in_files`):
        // reading every index file a second time here made a start with a
        // large backlog or a million ledgers twice as long. Garbage
        // collection and compaction wait for those counts; until then
        // nothing counts an entry out, so they only ever add up.
        let mut ids: Vec<u64> = st.ledgers.keys().copied().collect();
        ids.sort_unstable();
        let in_files: Vec<(u64, usize)> = ids
            .iter()
            .map(|id| (*id, &st.ledgers[id]))
            .filter(|(_, l)| l.has_index_file && !l.pages.is_empty())
            .map(|(id, l)| (id, l.pages.len()))
            .collect();
        st.live_counted = in_files.is_empty();
        for id in ids {
            let path = paths.index(id);
            let l = &st.ledgers[&id];
            let recent: Vec<(u64, IndexEntry)> =
                l.recent.iter().enumerate().map(|(i, e)| (l.file_entries + i as u64, *e)).collect();
            for (i, e) in recent {
                count_live(&mut st, &path, i, e)?;
            }
        }
        // Index files no checkpoint refers to: of deleted ledgers whose
        // removal a crash interrupted, or written by a checkpoint that never
        // completed. Nothing reads them; a later checkpoint recreates a file
        // for a live ledger from page 0.
        let referenced: std::collections::HashSet<u64> =
            ckpt.as_ref().map(|c| c.ledgers.iter().map(|l| l.ledger).collect()).unwrap_or_default();
        let mut removed_index = false;
        for name in disk.list_dir(&paths.index_dir).await.map_err(io_err("list", &paths.index_dir))? {
            let Some(ledger) = name.strip_suffix(".idx").filter(|s| s.len() == 20).and_then(|s| s.parse::<u64>().ok())
            else {
                continue;
            };
            if !referenced.contains(&ledger) {
                let p = paths.index(ledger);
                disk.remove(&p).await.map_err(io_err("remove unreferenced index file", &p))?;
                removed_index = true;
            }
        }
        if removed_index {
            disk.sync_dir(&paths.index_dir).await.map_err(io_err("fsync index directory", &paths.index_dir))?;
        }

        // Leftovers of an interrupted checkpoint, and the marker: once we
        // accept appends, a later crash must not be mistaken for a clean stop.
        let mut dir_changed = false;
        for p in [&paths.checkpoint_tmp, &paths.checkpoint_copy_tmp, &paths.clean] {
            match disk.remove(p).await {
                Ok(()) => dir_changed = true,
                Err(e) if e.kind() == io::ErrorKind::NotFound => {}
                Err(e) => return Err(StorageError::io("remove", p, e)),
            }
        }
        if dir_changed {
            disk.sync_dir(&paths.dir).await.map_err(io_err("fsync directory", &paths.dir))?;
        }

        let mut ledgers: Vec<(u64, u64)> = st.ledgers.iter().map(|(id, l)| (*id, l.next_entry)).collect();
        ledgers.sort_unstable();
        let recovery = Recovery {
            clean,
            tail: scanned.tail,
            scanned_bytes: scanned.scanned,
            truncated_bytes: scanned.truncated,
            entries_replayed: scanned.replayed,
            elapsed: started.elapsed(),
            ledgers,
            dropped,
            rebuilt,
        };
        info!(
            dir = %config.dir.display(),
            clean,
            scanned_bytes = scanned.scanned,
            truncated_bytes = scanned.truncated,
            entries_replayed = scanned.replayed,
            tail = scanned.tail,
            elapsed_ms = recovery.elapsed.as_millis() as u64,
            "entry log opened"
        );

        // The key index: its files, extended later from the ledger indexes.
        let mut keys = crate::keyindex::load(&disk, &paths.keys_dir).await?;
        // Any ledger may have entries past what the key files hold.
        keys.behind = st.ledgers.keys().copied().collect();

        // A checkpoint that was rebuilt is written again at once (with the
        // rebuilt index files), so the damaged files are replaced now.
        if rewrite_now {
            st.ckpt_position = None;
        }
        let entry_max = config.effective_entry_bytes_max();
        let interval = config.checkpoint_interval;
        let sh = Rc::new(Shared {
            disk,
            cfg: config,
            entry_max,
            paths,
            st: RefCell::new(st),
            ckpt_lock: glommio::sync::Semaphore::new(1),
            compact_lock: glommio::sync::Semaphore::new(1),
            zero_lock: glommio::sync::Semaphore::new(1),
            keys: RefCell::new(keys),
            space_short: std::cell::Cell::new(false),
            ckpt_short: std::cell::Cell::new(false),
            copy_stale: std::cell::Cell::new(false),
        });
        if !in_files.is_empty() {
            glommio::spawn_local(count_live_in_files(Rc::downgrade(&sh), in_files)).detach();
        }
        if rewrite_now {
            // With its garbage collection: after the live counts.
            sh.live_counted().await?;
            sh.checkpoint(false).await?;
            info!(dir = %sh.cfg.dir.display(), "wrote a fresh checkpoint and index files after rebuilding them");
        }
        glommio::spawn_local(flusher(Rc::downgrade(&sh))).detach();
        glommio::spawn_local(checkpointer(Rc::downgrade(&sh), interval)).detach();
        let zero = sh.cfg.zero_ahead_bytes > 0;
        // Compaction and key index upkeep are background work: their own
        // queue with few shares, so that producers' appends and readers go first.
        let (compaction_interval, keys_interval) = (sh.cfg.compaction_interval, sh.cfg.key_index_interval);
        if !compaction_interval.is_zero() || !keys_interval.is_zero() {
            let tq = glommio::executor().create_task_queue(
                glommio::Shares::Static(sh.cfg.compaction_shares.max(1)),
                glommio::Latency::NotImportant,
                "magnetar-storage-background",
            );
            let qerr = |e| StorageError::Config(format!("background task queue: {e}"));
            let task =
                crate::compact::every(Rc::downgrade(&sh), compaction_interval, "compaction pass", |log| async move {
                    log.compact().await.map(drop)
                });
            glommio::spawn_local_into(task, tq).map_err(qerr)?.detach();
            let task = crate::compact::every(Rc::downgrade(&sh), keys_interval, "key index upkeep", |log| async move {
                log.maintain_key_index(false).await.map(drop)
            });
            glommio::spawn_local_into(task, tq).map_err(qerr)?.detach();
            if zero {
                glommio::spawn_local_into(zeroer(Rc::downgrade(&sh)), tq).map_err(qerr)?.detach();
            }
        } else if zero {
            // (Tests: no background queue per open; same task, default queue.)
            glommio::spawn_local(zeroer(Rc::downgrade(&sh))).detach();
        }
        Ok((EntryLog { sh }, recovery))
    }
}

/// Reads and decodes a checkpoint file: `Ok(None)` when absent, `Err` (the
/// damage, as a `Corrupt` error) when it does not decode.
async fn read_checkpoint<D: Disk>(disk: &D, path: &Path) -> Result<Result<Option<Checkpoint>, StorageError>> {
    match disk.open(path, OpenMode::Existing).await {
        Ok(f) => {
            let b = read_whole(&f, path).await?;
            Ok(Checkpoint::decode(&b).map(Some).map_err(|r| StorageError::corrupt(path, 0, r)))
        }
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(Ok(None)),
        Err(e) => Err(StorageError::io("open", path, e)),
    }
}

/// Rebuilds entries `0..entries` of `ledger`'s index from the log before
/// `ckpt_position`, for a damaged index file: walks the valid batches of
/// every segment from its start (segments before the checkpoint may have
/// garbage-collection holes between them, but each begins with a batch)
/// and takes each entry's record, or its latest compaction copy (kind 4,
/// later in log order). A live ledger keeps every segment holding one of its
/// entries (or the copy), so all are found unless the log is damaged too:
/// then `Corrupt` naming the index file and the first missing entry.
async fn rebuild_index<F: DiskFile>(
    segs: &[Rc<Segment<F>>],
    ledger: u64,
    entries: u64,
    ckpt_position: u64,
) -> Result<Vec<IndexEntry>> {
    let mut found: Vec<Option<IndexEntry>> = vec![None; entries as usize];
    for seg in segs.iter().filter(|s| s.start < ckpt_position) {
        let mut r = Walker::new(std::slice::from_ref(seg));
        let mut off = 0;
        while seg.start + off < ckpt_position.min(seg.end()) {
            let Ok((h, b)) = r.batch(0, off).await? else { break };
            if h.position != seg.start + off {
                break; // stale: nothing of this use beyond
            }
            for rec in records(&h, &b) {
                let Ok(rec) = rec else { break };
                let rh = rec.header;
                if rh.ledger != ledger {
                    continue;
                }
                if rh.kind == KIND_DELETE {
                    found.iter_mut().for_each(|e| *e = None);
                } else if (rh.kind == KIND_ENTRY || rh.kind == KIND_MOVE) && rh.entry < entries {
                    found[rh.entry as usize] = Some(IndexEntry {
                        position: h.position + rec.offset as u64,
                        body_len: rh.body_len,
                        record_crc: rh.crc,
                        extras: rh.extras,
                    });
                }
            }
            off += h.batch_len as u64;
        }
    }
    let mut index = Vec::with_capacity(found.len());
    for (i, e) in found.into_iter().enumerate() {
        let Some(e) = e else {
            return Err(StorageError::corrupt(
                format!("index/{ledger:020}.idx (rebuilding from the log)"),
                0,
                CorruptReason::Field { field: "entry (not found in the log)", expected: i as u64, found: entries },
            ));
        };
        index.push(e);
    }
    Ok(index)
}

/// Counts entry `entry` (at `e`) as live in the segment that holds it; an
/// entry no segment holds was lost (e.g. a segment deleted while still
/// referenced), never dropped.
fn count_live<F>(st: &mut State<F>, path: &Path, entry: u64, e: IndexEntry) -> Result<()> {
    let start = segment_of(st, path, entry, e)?;
    st.live.add(start, 1, (RECORD_HEADER_BYTES as u64) + e.body_len as u64);
    Ok(())
}

/// The start of the segment holding entry `entry` (`e`) of the index file at
/// `path`; an entry no segment holds was lost.
fn segment_of<F>(st: &State<F>, path: &Path, entry: u64, e: IndexEntry) -> Result<u64> {
    match st.segment_at(e.position) {
        Some(seg) => Ok(seg.start),
        None => Err(StorageError::corrupt(
            path,
            0,
            CorruptReason::Field { field: "entry position (no segment holds it)", expected: entry, found: e.position },
        )),
    }
}

/// Index files read at once while a log opens, and by
/// [`count_live_in_files`].
const INDEX_READS_IN_FLIGHT: usize = 32;

/// Counts the live entries in the index files as they were at open (ledger,
/// pages then), at their copies where compaction moved them, into
/// `State::live`, INDEX_READS_IN_FLIGHT files at once, each opened for the
/// walk and closed after it (a shard may have more ledgers than the process
/// may open files), read a few pages at a time; then sets
/// `State::live_counted`. Runs after open. Until it ends no garbage
/// collection or compaction runs, so none of these ledgers goes, no index
/// entry moves, and what a checkpoint appends to a file lies after the pages
/// counted here (appends count themselves). Every entry must lie in a
/// segment: one that does not was lost (a segment deleted while still
/// referenced), and the log fails (fail-stop), as open would have.
pub(crate) async fn count_live_in_files<D: Disk>(weak: std::rc::Weak<Shared<D>>, files: Vec<(u64, usize)>) {
    let started = Instant::now();
    let n = files.len();
    let one = |(id, pages): (u64, usize)| {
        let weak = weak.clone();
        async move {
            let Some(sh) = weak.upgrade() else { return Err(StorageError::Closed) };
            let (path, sums) = {
                let st = sh.st.borrow();
                let l = st.ledgers.get(&id).expect("no ledger goes before the live counts are in");
                (sh.paths.index(id), l.pages[..pages].to_vec())
            };
            let file =
                Rc::new(sh.disk.open(&path, OpenMode::Existing).await.map_err(io_err("open index file", &path))?);
            let mut walk = PageWalk::all(file, path.clone(), id, &sums);
            let mut counts: std::collections::BTreeMap<u64, (u64, u64)> = Default::default();
            while let Some(read) = walk.next(|entry| sh.st.borrow().relocated.get(&(id, entry)).copied()).await? {
                let st = sh.st.borrow();
                for e in read {
                    // A moved entry lives at its copy, which must be the same entry.
                    if let Some(m) = e.moved.filter(|m| (m.body_len, m.extras) != (e.paged.body_len, e.paged.extras)) {
                        return Err(StorageError::corrupt(
                            &path,
                            0,
                            CorruptReason::Field {
                                field: "moved record length",
                                expected: e.paged.body_len as u64,
                                found: m.body_len as u64,
                            },
                        ));
                    }
                    let ie = e.current();
                    let c = counts.entry(segment_of(&st, &path, e.entry, ie)?).or_default();
                    c.0 += 1;
                    c.1 += (RECORD_HEADER_BYTES as u64) + ie.body_len as u64;
                }
            }
            let mut st = sh.st.borrow_mut();
            for (start, (n, bytes)) in counts {
                st.live.add(start, n, bytes);
            }
            Ok(())
        }
    };
    let counted =
        futures::stream::iter(files).map(one).buffer_unordered(INDEX_READS_IN_FLIGHT).try_collect::<()>().await;
    let Some(sh) = weak.upgrade() else { return };
    match counted {
        Ok(()) => {
            let mut st = sh.st.borrow_mut();
            st.live_counted = true;
            st.wake_live_waiters();
            info!(
                dir = %sh.cfg.dir.display(), index_files = n, elapsed_ms = started.elapsed().as_millis() as u64,
                "live entries per segment counted"
            );
        }
        Err(StorageError::Closed) => {}
        Err(e) => {
            error!(dir = %sh.cfg.dir.display(), error = %e, "counting the live entries in the index files failed");
            sh.fail(&e);
        }
    }
}

/// Reads and checks pages 0..pages of a ledger's index file, which the
/// checkpoint says hold entries 0..entries, keeping only their summaries;
/// and answers the entries of `relocs` at their copies (for
/// `State::relocated`). They were fsynced before that checkpoint was
/// written, so any damage is corruption, not a torn write. Reads only.
async fn load_index<D: Disk>(
    disk: &D,
    paths: &Paths,
    ledger: u64,
    entries: u64,
    pages: u64,
    ckpt_position: u64,
    relocs: &[&crate::format::Relocation],
) -> Result<(Ledger, Vec<((u64, u64), IndexEntry)>)> {
    let mut relocated = Vec::new();
    let path = paths.index(ledger);
    let file = disk.open(&path, OpenMode::Existing).await.map_err(io_err("open index file", &path))?;
    let mut l = Ledger::new();
    let mut next = 0u64;
    let mut p = 0u64;
    while p < pages {
        let n = (pages - p).min(crate::pages::PAGES_PER_READ_MAX);
        let read = read_pages(&file, &path, ledger, p, Firsts::Contiguous { n, first: next }).await?;
        for (i, (first, es)) in read.into_iter().enumerate() {
            let off = (p + i as u64) * PAGE_BYTES;
            for e in &es {
                if e.position >= ckpt_position {
                    return Err(StorageError::corrupt(
                        &path,
                        off,
                        CorruptReason::Field {
                            field: "index entry position",
                            expected: ckpt_position,
                            found: e.position,
                        },
                    ));
                }
                l.bytes += e.body_len as u64;
            }
            for r in relocs.iter().filter(|r| r.entry >= first && r.entry < first + es.len() as u64) {
                let e = es[(r.entry - first) as usize];
                relocated.push(((ledger, r.entry), IndexEntry { position: r.position, record_crc: r.record_crc, ..e }));
            }
            l.pages.push(crate::pages::PageSum::of(first, &es));
            next += es.len() as u64;
        }
        p += n;
    }
    if next != entries {
        return Err(StorageError::corrupt(
            &path,
            0,
            CorruptReason::Field { field: "index entries", expected: entries, found: next },
        ));
    }
    l.next_entry = entries;
    l.file_entries = entries;
    l.file_pages = pages;
    l.has_index_file = true;
    Ok((l, relocated))
}

/// What an accepted data loss dropped: the valid batches after the damage.
#[derive(Default)]
struct Dropped {
    batches: u64,
    seqs: Option<(u64, u64)>,
    bytes: u64,
    /// ledger -> (first entry, last entry, entries)
    entries: std::collections::BTreeMap<u64, (u64, u64, u64)>,
    meta: u64,
    other: u64,
}

impl Dropped {
    fn add(&mut self, h: &BatchHeader, b: &[u8]) {
        self.batches += 1;
        self.bytes += h.batch_len as u64;
        self.seqs = Some(self.seqs.map_or((h.seq, h.seq), |(a, _)| (a, h.seq)));
        for r in records(h, b).flatten() {
            let rh = r.header;
            if rh.kind == KIND_ENTRY {
                let e = self.entries.entry(rh.ledger).or_insert((rh.entry, rh.entry, 0));
                e.0 = e.0.min(rh.entry);
                e.1 = e.1.max(rh.entry);
                e.2 += 1;
            } else if rh.kind == crate::format::KIND_META {
                self.meta += 1;
            } else {
                self.other += 1;
            }
        }
    }

    fn describe(&self) -> String {
        if self.batches == 0 {
            return "no valid batch after it".to_string();
        }
        let (a, b) = self.seqs.unwrap_or_default();
        let entries: Vec<String> =
            self.entries.iter().map(|(l, (f, t, n))| format!("ledger {l} entries {f}..={t} ({n})")).collect();
        format!(
            "{} valid batches after it (seq {a}..={b}, {} bytes): {}; {} metadata records, {} other records",
            self.batches,
            self.bytes,
            if entries.is_empty() { "no entries".to_string() } else { entries.join(", ") },
            self.meta,
            self.other
        )
    }
}

/// Walks every valid batch of this use after log position `from` (in
/// `segs[0]`, then the later segments) for [`Dropped`]; returns it and the
/// end of the last non-zero data in `segs[0]` at or after `from` (what a
/// cut there must zero).
async fn describe_from<F: DiskFile>(segs: &[Rc<Segment<F>>], from: u64) -> Result<(Dropped, u64)> {
    let mut w = Walker::new(segs);
    let mut d = Dropped::default();
    let (mut k, mut q) = (0usize, from);
    let mut end0 = from;
    loop {
        let (found, nonzero_end) = w.search_valid(k, q).await?;
        if k == 0 {
            end0 = end0.max(nonzero_end);
        }
        let Some((j, at, _)) = found else { break };
        k = j;
        let seg = &segs[k];
        // Valid batches follow one another: walk them, then search again.
        let mut p = at;
        while p + PAGE_BYTES <= seg.end() {
            match w.batch(k, p - seg.start).await? {
                Ok((h, b)) if h.position == p => {
                    d.add(&h, &b);
                    p += h.batch_len as u64;
                }
                _ => break,
            }
        }
        if k == 0 {
            end0 = end0.max(p);
        }
        q = p.saturating_sub(PAGE_BYTES).max(at);
    }
    Ok((d, end0))
}

/// Refuses damage inside data that may have been acknowledged, or (with
/// `accept`) records what a cut there drops and says to cut.
fn finding(
    accept: bool,
    dropped: &mut Vec<String>,
    file: &Path,
    off: u64,
    reason: CorruptReason,
    lost: String,
) -> Result<()> {
    if !accept {
        error!(file = %file.display(), offset = off, %reason, lost, "damage inside data that may have been acknowledged; refusing to open (accept_data_loss would truncate here)");
        return Err(StorageError::corrupt(file, off, reason));
    }
    let line = format!("{} at offset {off}: {reason}; dropped {lost}", file.display());
    error!("accepting data loss: {line}");
    dropped.push(line);
    Ok(())
}

/// Zeroes `[off, to)` of `segs[i]` (the new tail) and removes the later
/// segments (and `segs[i]` itself when the cut is at its start).
async fn cut<D: Disk>(
    disk: &D,
    paths: &Paths,
    segs: &mut Vec<Rc<Segment<D::File>>>,
    i: usize,
    off: u64,
    to: u64,
) -> Result<()> {
    let seg = segs[i].clone();
    let to = to.min(seg.end()).max(seg.start + off);
    if to > seg.start + off {
        zero(&seg, off, to - seg.start).await?;
    }
    let removed: Vec<_> = segs.drain(i + 1..).collect();
    let drop_this = off == 0;
    if drop_this {
        segs.pop();
    }
    let mut dir_changed = false;
    for s in removed.iter().chain(drop_this.then_some(&seg)) {
        disk.remove(&s.path).await.map_err(io_err("remove empty segment", &s.path))?;
        dir_changed = true;
    }
    if dir_changed {
        disk.sync_dir(&paths.log_dir).await.map_err(io_err("fsync log directory", &paths.log_dir))?;
    }
    Ok(())
}

/// Scans the log from `position` (batch `seq`), replaying records into `st`.
/// Damage that may hide acknowledged data is refused (`Corrupt`) unless
/// `accept`: then the log is cut there and `dropped` says what went.
#[allow(clippy::too_many_arguments)]
async fn scan<D: Disk>(
    disk: &D,
    paths: &Paths,
    segs: &mut Vec<Rc<Segment<D::File>>>,
    st: &mut State<D::File>,
    position: u64,
    seq: u64,
    accept: bool,
    dropped: &mut Vec<String>,
) -> Result<Scanned> {
    let mut out = Scanned { tail: position, next_seq: seq, scanned: 0, truncated: 0, replayed: 0 };
    // A segment is preallocated and made durable at its full length before
    // any batch goes into it, and its batches record that length: a shorter
    // file was truncated by hand (a crash cannot shrink it). Before the
    // checkpoint that loses data the checkpoint vouches for (never
    // acceptable: index files point there); after it, what the scan would
    // otherwise take for a torn tail.
    let mut cut_at: Option<u64> = None;
    for i in 0..segs.len() {
        let Some((declared, reason)) = Walker::new(&segs[..]).truncation(i, position).await? else { continue };
        let seg = segs[i].clone();
        if let CorruptReason::CheckpointBeyondLog { .. } = reason {
            error!(file = %seg.path.display(), offset = seg.len, %reason, "segment truncated before the checkpoint position");
            return Err(StorageError::corrupt(&seg.path, seg.len, reason));
        }
        let lost = format!("whatever was written in bytes {}..{declared} of the file", seg.len);
        finding(accept, dropped, &seg.path, seg.len, reason, lost)?;
        // Accepted: the file gets its length back (zeros past the cut), so
        // that the next start finds a whole segment, and the log ends at
        // the cut (below).
        seg.file.allocate(declared).await.map_err(io_err("re-extend truncated segment", &seg.path))?;
        seg.file.sync().await.map_err(io_err("fdatasync re-extended segment", &seg.path))?;
        cut_at.get_or_insert(seg.end());
        drop(seg);
        let old = segs.remove(i);
        let Ok(old) = Rc::try_unwrap(old) else { unreachable!("recovery holds the only reference to its segments") };
        segs.insert(i, Rc::new(Segment { len: declared, ..old }));
    }
    let Some(first) = segs.iter().position(|s| s.end() > position) else {
        return Ok(out); // nothing written after the checkpoint
    };
    // Data left by a previous process is trusted only after an fsync: it may
    // still sit in a volatile cache.
    for s in &segs[first..] {
        s.file.sync().await.map_err(io_err("fdatasync segment on open", &s.path))?;
    }
    let verdict = {
        let mut w = Walker::new(&segs[..]);
        let mut visit = Replay { segs: &segs[..], st, replayed: 0 };
        // (From the checkpoint's position: nothing before it to vouch for.)
        let start = Start { position, seq: Some(seq), gaps_before: None, cut_at, checkpoint: None };
        let verdict = w.walk(start, &mut visit).await?;
        out.scanned += w.scanned;
        out.replayed += visit.replayed;
        verdict
    };
    let at = match verdict {
        Verdict::End { position, seq } => {
            out.tail = position;
            out.next_seq = seq.expect("the walk started with a seq");
            return Ok(out);
        }
        Verdict::Cut { at, cut: c } => {
            // The accepted cut of a truncated segment: the log ends at the
            // last batch wholly before it.
            let seg = segs[at.seg].clone();
            let (d, _) = describe_from(&segs[at.seg..], c.saturating_sub(PAGE_BYTES).max(at.position)).await?;
            let line = format!(
                "{}: log cut at position {} (batch seq {}), the last batch wholly before the truncation; also dropped {}",
                seg.path.display(),
                at.position,
                at.seq.unwrap_or_default(),
                d.describe()
            );
            error!("accepting data loss: {line}");
            dropped.push(line);
            out.truncated += c - at.position;
            cut(disk, paths, segs, at.seg, at.off, c).await?;
            at
        }
        Verdict::Damage { at, damage, reason, later: true, nonzero_end } => {
            let seg = segs[at.seg].clone();
            warn!(file = %seg.path.display(), offset = at.off, %reason, "damaged batch before valid data");
            let (d, end0) = describe_from(&segs[at.seg..], at.position).await?;
            let seq = at.seq.unwrap_or_default();
            let lost = format!("the damaged batch seq {seq} ({reason}) and {}", d.describe());
            finding(accept, dropped, &seg.path, at.off, damage, lost)?;
            out.truncated += end0.saturating_sub(at.position);
            cut(disk, paths, segs, at.seg, at.off, end0.max(nonzero_end)).await?;
            at
        }
        Verdict::Damage { at, damage, reason, later: false, nonzero_end } => {
            // The last batch cannot be a torn write: it may have been
            // acknowledged. Accepted as lost: cut it as a torn tail.
            let seg = segs[at.seg].clone();
            let lost =
                format!("the batch seq {} at log position {} ({reason})", at.seq.unwrap_or_default(), at.position);
            finding(accept, dropped, &seg.path, at.off, damage, lost)?;
            cut_tail(disk, paths, segs, at, nonzero_end, &reason, &mut out).await?;
            at
        }
        Verdict::Torn { at, nonzero_end, reason } => {
            cut_tail(disk, paths, segs, at, nonzero_end, &reason, &mut out).await?;
            at
        }
    };
    out.tail = at.position;
    out.next_seq = at.seq.expect("the walk started with a seq");
    Ok(out)
}

/// Cuts the torn tail at `at` (never acknowledged, or accepted as lost):
/// zeroes it so its bytes can never parse later, and drops empty segments.
async fn cut_tail<D: Disk>(
    disk: &D,
    paths: &Paths,
    segs: &mut Vec<Rc<Segment<D::File>>>,
    at: At,
    nonzero_end: u64,
    reason: &CorruptReason,
    out: &mut Scanned,
) -> Result<()> {
    if nonzero_end > at.position {
        let file = segs[at.seg].path.display();
        info!(%file, offset = at.off, bytes = nonzero_end - at.position, %reason, "truncating torn tail");
        out.truncated += nonzero_end - at.position;
    }
    cut(disk, paths, segs, at.seg, at.off, nonzero_end).await
}

/// Overwrites [from, to) of a segment with zeros and syncs it.
async fn zero<F: DiskFile>(seg: &Segment<F>, from: u64, to: u64) -> Result<()> {
    assert!(from.is_multiple_of(PAGE_BYTES) && to.is_multiple_of(PAGE_BYTES) && from <= to);
    let zeros = vec![0u8; ZERO_CHUNK_BYTES as usize];
    let mut p = from;
    while p < to {
        let n = (to - p).min(ZERO_CHUNK_BYTES);
        seg.file.write_at(p, &zeros[..n as usize]).await.map_err(io_err("zero torn tail", &seg.path))?;
        p += n;
    }
    seg.file.sync().await.map_err(io_err("fdatasync after truncation", &seg.path))
}

/// Applies the records of one verified batch; returns the entries replayed.
fn replay<F>(st: &mut State<F>, path: &Path, batch_off: u64, position: u64, h: &BatchHeader, b: &[u8]) -> Result<u64> {
    let mut entries = 0;
    for r in records(h, b) {
        let r = r.map_err(|(o, reason)| StorageError::corrupt(path, batch_off + o as u64, reason))?;
        let corrupt = |reason| StorageError::corrupt(path, batch_off + r.offset as u64, reason);
        let rh = r.header;
        if rh.kind == KIND_DELETE {
            st.ledgers.remove(&rh.ledger);
            let gone: Vec<(u64, u64)> =
                st.relocated.range((rh.ledger, 0)..=(rh.ledger, u64::MAX)).map(|(k, _)| *k).collect();
            for k in gone {
                st.relocated.remove(&k);
            }
            st.deleted_at.push((rh.ledger, position + r.offset as u64));
        } else if rh.kind == KIND_MOVE {
            // A compaction copy: the entry now lives here. A copy for a
            // ledger deleted before it (or never indexed) is unreferenced.
            let Some(l) = st.ledgers.get(&rh.ledger) else { continue };
            if rh.entry >= l.laid_out() {
                return Err(corrupt(CorruptReason::EntryOrder {
                    ledger: rh.ledger,
                    expected: l.laid_out(),
                    found: rh.entry,
                }));
            }
            // The copy is checked against the original (same length and
            // extras) once the index pages are read again, after the scan.
            if let Some(ie) = st.relocated.get(&(rh.ledger, rh.entry)) {
                if ie.body_len != rh.body_len || ie.extras != rh.extras {
                    return Err(corrupt(CorruptReason::Field {
                        field: "moved record length",
                        expected: ie.body_len as u64,
                        found: rh.body_len as u64,
                    }));
                }
            }
            let ie = IndexEntry {
                position: position + r.offset as u64,
                body_len: rh.body_len,
                record_crc: rh.crc,
                extras: rh.extras,
            };
            if rh.entry < l.file_entries {
                st.relocated.insert((rh.ledger, rh.entry), ie);
            } else {
                // Still in `recent` (an index rebuilt at open, or no usable
                // checkpoint): the next checkpoint writes the copy's position.
                let l = st.ledgers.get_mut(&rh.ledger).expect("looked up above");
                let i = usize::try_from(rh.entry - l.file_entries).expect("below laid_out");
                let old = &mut l.recent[i];
                if old.body_len != rh.body_len || old.extras != rh.extras {
                    return Err(corrupt(CorruptReason::Field {
                        field: "moved record length",
                        expected: old.body_len as u64,
                        found: rh.body_len as u64,
                    }));
                }
                *old = ie;
            }
        } else if rh.kind == KIND_ENTRY {
            let l = st.ledgers.entry(rh.ledger).or_insert_with(Ledger::new);
            if rh.entry != l.laid_out() {
                return Err(corrupt(CorruptReason::EntryOrder {
                    ledger: rh.ledger,
                    expected: l.laid_out(),
                    found: rh.entry,
                }));
            }
            l.recent.push(IndexEntry {
                position: position + r.offset as u64,
                body_len: rh.body_len,
                record_crc: rh.crc,
                extras: rh.extras,
            });
            l.bytes += rh.body_len as u64;
            l.next_entry = l.laid_out();
            entries += 1;
        } else {
            let (k, v) = split_meta(r.body).map_err(corrupt)?;
            if v.is_empty() {
                st.meta.remove(k);
                st.meta_durable.remove(k);
            } else {
                let v = bytes::Bytes::copy_from_slice(v);
                st.meta.insert(k.to_vec(), v.clone());
                st.meta_durable.insert(k.to_vec(), v);
            }
        }
    }
    Ok(entries)
}
