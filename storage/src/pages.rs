//! The ledger index in pages: what stays in memory of a ledger's index file
//! (one [`PageSum`] per page), the per-shard bounded cache of decoded pages
//! ([`IndexCache`]), and reading pages from an index file.
//!
//! A ledger's entries `0..file_entries` are in its index file (written at
//! checkpoints, never rewritten); the later ones (laid out in a batch since
//! the last checkpoint) are in memory (`Ledger::recent`), so the pages of
//! the ledger being written are always at hand. A lookup of a file entry
//! goes to the page holding it: from the cache, else one read of the page
//! (async, on the shard's executor). Owned by the shard's executor.

use crate::disk::{DiskFile, PAGE_BYTES};
use crate::error::{CorruptReason, Result, StorageError};
use crate::format::{decode_index_page, IndexEntry};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::rc::Rc;

/// Pages read from an index file in one request at most (256 KiB).
pub const PAGES_PER_READ_MAX: u64 = 64;

/// What memory keeps of one index page (32 bytes a page of up to 127
/// entries): where it starts, for lookups by entry id; its first publish
/// time, for seeks by time; the range of log positions its entries had
/// when it was written, for compaction's search of a segment's entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct PageSum {
    pub first_entry: u64,
    pub first_time_ms: u64,
    pub min_position: u64,
    pub max_position: u64,
}

impl PageSum {
    pub fn of(first_entry: u64, entries: &[IndexEntry]) -> PageSum {
        assert!(!entries.is_empty(), "an index page holds at least one entry");
        PageSum {
            first_entry,
            first_time_ms: entries[0].extras.publish_time_ms,
            min_position: entries.iter().map(|e| e.position).min().unwrap_or(0),
            max_position: entries.iter().map(|e| e.position).max().unwrap_or(0),
        }
    }
}

/// The page (index into `pages`) holding file entry `entry`, if any.
pub(crate) fn page_of(pages: &[PageSum], entry: u64) -> Option<usize> {
    pages.partition_point(|p| p.first_entry <= entry).checked_sub(1)
}

/// Bytes a cached page is charged: its entries plus the map's overhead.
pub(crate) fn page_cost(entries: usize) -> usize {
    entries * std::mem::size_of::<IndexEntry>() + 96
}

/// The per-shard cache of decoded index pages, least recently used out,
/// within `max_bytes` (always at least the page just inserted, so a lookup
/// that loaded its page finds it).
/// A cached page: its entries and its last use (a stamp in `lru`).
type Cached = (Rc<[IndexEntry]>, u64);

pub(crate) struct IndexCache {
    /// By (ledger, page number).
    pages: BTreeMap<(u64, u64), Cached>,
    lru: BTreeMap<u64, (u64, u64)>,
    stamp: u64,
    bytes: usize,
    max_bytes: usize,
    /// Lookups of file entries served from the cache, and pages read from
    /// disk (counters).
    pub hits: u64,
    pub loads: u64,
}

impl IndexCache {
    pub fn new(max_bytes: usize) -> IndexCache {
        IndexCache { pages: BTreeMap::new(), lru: BTreeMap::new(), stamp: 0, bytes: 0, max_bytes, hits: 0, loads: 0 }
    }

    pub fn bytes(&self) -> usize {
        self.bytes
    }

    pub fn max_bytes(&self) -> usize {
        self.max_bytes
    }

    pub fn len(&self) -> usize {
        self.pages.len()
    }

    /// Marks page `page` of `ledger` as just used (a lookup it served).
    pub fn touch(&mut self, ledger: u64, page: u64) {
        let Some((_, stamp)) = self.pages.get_mut(&(ledger, page)) else { return };
        self.lru.remove(stamp);
        self.stamp += 1;
        *stamp = self.stamp;
        self.lru.insert(self.stamp, (ledger, page));
        self.hits += 1;
    }

    /// Page `page` of `ledger`, marked as just used.
    pub fn get(&mut self, ledger: u64, page: u64) -> Option<Rc<[IndexEntry]>> {
        self.touch(ledger, page);
        self.peek(ledger, page).cloned()
    }

    /// Page `page` of `ledger`, leaving the eviction order as it is.
    pub fn peek(&self, ledger: u64, page: u64) -> Option<&Rc<[IndexEntry]>> {
        self.pages.get(&(ledger, page)).map(|(e, _)| e)
    }

    pub fn contains(&self, ledger: u64, page: u64) -> bool {
        self.pages.contains_key(&(ledger, page))
    }

    pub fn insert(&mut self, ledger: u64, page: u64, entries: Rc<[IndexEntry]>) {
        self.remove(ledger, page);
        self.stamp += 1;
        self.bytes += page_cost(entries.len());
        self.pages.insert((ledger, page), (entries, self.stamp));
        self.lru.insert(self.stamp, (ledger, page));
        while self.bytes > self.max_bytes && self.pages.len() > 1 {
            let Some((_, key)) = self.lru.pop_first() else { break };
            if let Some((e, _)) = self.pages.remove(&key) {
                self.bytes -= page_cost(e.len());
            }
        }
        assert!(self.bytes <= self.max_bytes || self.pages.len() == 1, "index cache over its bound");
    }

    fn remove(&mut self, ledger: u64, page: u64) {
        if let Some((e, stamp)) = self.pages.remove(&(ledger, page)) {
            self.lru.remove(&stamp);
            self.bytes -= page_cost(e.len());
        }
    }

    /// Forgets every page of `ledger` (deleted).
    pub fn drop_ledger(&mut self, ledger: u64) {
        let keys: Vec<(u64, u64)> = self.pages.range((ledger, 0)..=(ledger, u64::MAX)).map(|(k, _)| *k).collect();
        for (l, p) in keys {
            self.remove(l, p);
        }
    }
}

/// What the first entry of each page [`read_pages`] reads must be.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Firsts<'a> {
    /// Page `i` of the read starts at entry `firsts[i]` (from the pages'
    /// summaries).
    Known(&'a [u64]),
    /// `n` pages, each starting where the one before it ended, the first at
    /// entry `first` (an index file read before its summaries exist).
    Contiguous { n: u64, first: u64 },
}

impl Firsts<'_> {
    fn len(&self) -> u64 {
        match self {
            Firsts::Known(f) => f.len() as u64,
            Firsts::Contiguous { n, .. } => *n,
        }
    }
}

/// Reads and checks pages `from..from + firsts.len()` of `ledger`'s index
/// file, as (first entry, entries) a page; each page's first entry must be
/// the one `firsts` says. The pages were fdatasync'd before a checkpoint
/// named them, so any damage is corruption.
pub(crate) async fn read_pages<F: DiskFile>(
    file: &F,
    path: &Path,
    ledger: u64,
    from: u64,
    firsts: Firsts<'_>,
) -> Result<Vec<(u64, Vec<IndexEntry>)>> {
    let n = firsts.len();
    assert!(n > 0, "reading no index page");
    let need = n * PAGE_BYTES;
    let b = file
        .read_at(from * PAGE_BYTES, need as usize)
        .await
        .map_err(|e| StorageError::io("read index pages", path, e))?;
    if (b.len() as u64) < need {
        let len = from * PAGE_BYTES + b.len() as u64;
        return Err(StorageError::corrupt(path, len, CorruptReason::ShortFile { len, need: from * PAGE_BYTES + need }));
    }
    let mut out = Vec::with_capacity(n as usize);
    let mut next = match firsts {
        Firsts::Known(f) => f[0],
        Firsts::Contiguous { first, .. } => first,
    };
    for (i, page) in b.chunks(PAGE_BYTES as usize).enumerate() {
        let off = (from + i as u64) * PAGE_BYTES;
        let (first, es) = decode_index_page(page, ledger).map_err(|r| StorageError::corrupt(path, off, r))?;
        if let Firsts::Known(f) = firsts {
            next = f[i];
        }
        if first != next {
            return Err(StorageError::corrupt(
                path,
                off,
                CorruptReason::Field { field: "index page first entry", expected: next, found: first },
            ));
        }
        next += es.len() as u64;
        out.push((first, es));
    }
    Ok(out)
}

/// The first entries of pages `from..from + n` (for [`read_pages`]).
pub(crate) fn firsts(sums: &[PageSum], from: u64, n: u64) -> Vec<u64> {
    sums[from as usize..(from + n) as usize].iter().map(|s| s.first_entry).collect()
}

/// One entry a [`PageWalk`] read: its id, the entry as its page has it, and
/// its copy if compaction moved it after the page was written.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Walked {
    pub entry: u64,
    pub paged: IndexEntry,
    pub moved: Option<IndexEntry>,
}

impl Walked {
    /// Where the entry is now: its copy if it moved, else where its page says.
    pub fn current(&self) -> IndexEntry {
        self.moved.unwrap_or(self.paged)
    }
}

/// A walk over some pages of a ledger's index file, straight from the file
/// (not through the cache), [`PAGES_PER_READ_MAX`] adjacent pages a read at
/// the most, so that walking a large index keeps only one read's entries in
/// memory. Recovery's live counts, garbage collection of a deleted ledger
/// and compaction's search of a segment's entries all walk this way.
pub(crate) struct PageWalk<F> {
    file: Rc<F>,
    path: PathBuf,
    ledger: u64,
    /// Runs of adjacent pages still to read: (first page, first entry of
    /// each of its pages), in page order.
    runs: std::vec::IntoIter<(u64, Vec<u64>)>,
}

impl<F: DiskFile> PageWalk<F> {
    /// Every page of the file (`sums` are its pages' summaries).
    pub fn all(file: Rc<F>, path: PathBuf, ledger: u64, sums: &[PageSum]) -> PageWalk<F> {
        PageWalk::matching(file, path, ledger, sums, |_| true)
    }

    /// The pages whose summary `want` selects.
    pub fn matching(
        file: Rc<F>,
        path: PathBuf,
        ledger: u64,
        sums: &[PageSum],
        want: impl Fn(&PageSum) -> bool,
    ) -> PageWalk<F> {
        let mut runs: Vec<(u64, Vec<u64>)> = Vec::new();
        for (p, sum) in sums.iter().enumerate() {
            if !want(sum) {
                continue;
            }
            match runs.last_mut() {
                Some((from, firsts))
                    if *from + firsts.len() as u64 == p as u64 && (firsts.len() as u64) < PAGES_PER_READ_MAX =>
                {
                    firsts.push(sum.first_entry)
                }
                _ => runs.push((p as u64, vec![sum.first_entry])),
            }
        }
        PageWalk { file, path, ledger, runs: runs.into_iter() }
    }

    /// The entries of the next run of pages, in entry order, each with its
    /// copy as `moved` (called after the read) finds it; `None` when every
    /// selected page was read.
    pub async fn next(&mut self, moved: impl Fn(u64) -> Option<IndexEntry>) -> Result<Option<Vec<Walked>>> {
        let Some((from, firsts)) = self.runs.next() else { return Ok(None) };
        let pages = read_pages(&*self.file, &self.path, self.ledger, from, Firsts::Known(&firsts)).await?;
        let mut out = Vec::with_capacity(pages.iter().map(|(_, es)| es.len()).sum());
        for (first, es) in pages {
            for (i, paged) in es.into_iter().enumerate() {
                let entry = first + i as u64;
                out.push(Walked { entry, paged, moved: moved(entry) });
            }
        }
        Ok(Some(out))
    }
}

/// Index files a shard keeps open at most. Beyond it the least recently
/// used is closed (once no read or write holds it) and opened again on its
/// next use.
pub const INDEX_FILES_OPEN_MAX: usize = 256;

/// The shard's open index files, least recently used out, at most `max`:
/// a ledger's index file is opened on demand, so a shard's open file count
/// does not grow with its ledgers (a million topics would otherwise need a
/// million descriptors, past any process's limit).
pub(crate) struct OpenIndexFiles<F> {
    files: lru::LruCache<u64, Rc<F>>,
}

impl<F> OpenIndexFiles<F> {
    pub fn new(max: usize) -> OpenIndexFiles<F> {
        let max = std::num::NonZeroUsize::new(max).expect("at least one index file stays open");
        OpenIndexFiles { files: lru::LruCache::new(max) }
    }

    /// `ledger`'s open file, marked used now.
    pub fn get(&mut self, ledger: u64) -> Option<Rc<F>> {
        self.files.get(&ledger).cloned()
    }

    /// Keeps `file` open as `ledger`'s (replacing an earlier one), closing
    /// the least recently used beyond the bound.
    pub fn insert(&mut self, ledger: u64, file: Rc<F>) {
        self.files.put(ledger, file);
    }

    /// Forgets `ledger`'s file (its ledger is gone, or the file is rewritten).
    pub fn remove(&mut self, ledger: u64) {
        self.files.pop(&ledger);
    }

    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.files.len()
    }
}

#[cfg(test)]
mod open_files_tests {
    use super::OpenIndexFiles;
    use std::rc::Rc;

    #[test]
    fn least_recently_used_closes_beyond_the_bound() {
        let mut f = OpenIndexFiles::new(2);
        f.insert(1, Rc::new("a"));
        f.insert(2, Rc::new("b"));
        assert_eq!(f.get(1).as_deref(), Some(&"a"));
        f.insert(3, Rc::new("c"));
        assert_eq!(f.len(), 2);
        assert!(f.get(2).is_none(), "2 was the least recently used");
        assert_eq!(f.get(1).as_deref(), Some(&"a"));
        assert_eq!(f.get(3).as_deref(), Some(&"c"));
        f.insert(3, Rc::new("d"));
        assert_eq!(f.len(), 2);
        assert_eq!(f.get(3).as_deref(), Some(&"d"));
        f.remove(1);
        assert_eq!(f.len(), 1);
        assert!(f.get(1).is_none());
    }
}
