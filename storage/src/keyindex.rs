//! Per-shard key index (RocketMQ's IndexFile idea): message key hash →
//! (ledger, entry, publish time), so that "the newest messages with key K"
//! is answered without scanning the log.
//!
//! The key hash of every entry is already in its ledger's index (the
//! `key_hash` extra given at append), so this index is derived data: it is
//! never the source of truth, and whatever a crash leaves of it is rebuilt
//! from the ledger indexes (which recovery rebuilt from the log tail past
//! the checkpoint).
//!
//! Two parts:
//! - the *active* part, in memory: items of durable entries not yet in a
//!   file, in the order they were added. Rebuilt at open from the ledger
//!   indexes past what the files cover.
//! - *sealed* files `keys/<seq>.kix`, immutable, each written once (temp
//!   file, fdatasync, rename, directory fsync: after a crash it is there
//!   whole or not at all) when the active part reaches
//!   `key_index_items_per_file` items (no space to create, write or rename
//!   it: the items stay in memory and the next pass tries again; any other
//!   failed write, or a failed fsync, fails the log, as for the log
//!   itself). Items are sorted by key hash; a small
//!   fence (the first hash of each page) stays in memory, so a lookup reads
//!   one or two 4 KiB pages per file. Each file lists, per ledger, the entry
//!   range it covers; a file whose ledgers are all deleted is removed (so
//!   the index ages out with the ledgers it points to).
//!
//! Layout byte by byte: `docs/format.md`, "Key index files". Owned by the
//! shard's executor like the rest of the log; never crosses cores.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::path::{Path, PathBuf};
use std::rc::Rc;

use tracing::{debug, info, warn};

use crate::disk::{Disk, DiskFile, OpenMode, PAGE_BYTES};
use crate::error::{CorruptReason, Result, StorageError};
use crate::format::{crc, pad_to_page, rd_u16, rd_u32, rd_u64};
use crate::log::{durable_entries, EntryLog, State};

pub const KEY_FILE_MAGIC: [u8; 8] = *b"MGNTKIX1";
pub const KEY_PAGE_MAGIC: [u8; 4] = *b"MKIP";
pub const KEY_FILE_VERSION: u16 = 1;
pub const KEY_FILE_HEADER_BYTES: usize = 64;
/// Entries whose index pages catching up reads at once (64 pages).
const KEY_CATCH_UP_ENTRIES: u64 = 64 * 127;
pub const KEY_FILE_LEDGER_BYTES: usize = 24;
pub const KEY_PAGE_HEADER_BYTES: usize = 16;
pub const KEY_ITEM_BYTES: usize = 32;
pub const KEY_ITEMS_PER_PAGE: usize = (PAGE_BYTES as usize - KEY_PAGE_HEADER_BYTES) / KEY_ITEM_BYTES;
const _: () = assert!(KEY_ITEMS_PER_PAGE == 127);
const _: () = assert!(KEY_FILE_HEADER_BYTES <= PAGE_BYTES as usize);

/// One candidate of a key lookup. The hash may collide: the caller confirms
/// by reading the entry's own key.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct KeyHit {
    pub publish_time_ms: u64,
    pub ledger: u64,
    pub entry: u64,
}

/// One index item: an entry with a key.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KeyItem {
    pub key_hash: u32,
    pub ledger: u64,
    pub entry: u64,
    pub publish_time_ms: u64,
}

/// What a sealed file's header region says (kept in memory per file).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyFileHeader {
    pub seq: u64,
    pub items: u64,
    pub item_pages: u32,
    pub min_time_ms: u64,
    pub max_time_ms: u64,
    /// (ledger, first entry, end entry): the entries of each ledger the file
    /// covers (those with a key are its items).
    pub ledgers: Vec<(u64, u64, u64)>,
    /// The key hash of the first item of each item page.
    pub fence: Vec<u32>,
    /// Pages before the first item page.
    pub header_pages: u64,
}

fn wr(b: &mut [u8], off: usize, v: &[u8]) {
    b[off..off + v.len()].copy_from_slice(v);
}

/// Encodes a sealed file: header region, then item pages. `items` must be
/// sorted by (key hash, ledger, entry).
pub fn encode_key_file(seq: u64, items: &[KeyItem], ledgers: &[(u64, u64, u64)]) -> Vec<u8> {
    assert!(items
        .windows(2)
        .all(|w| (w[0].key_hash, w[0].ledger, w[0].entry) < (w[1].key_hash, w[1].ledger, w[1].entry)));
    let item_pages = items.len().div_ceil(KEY_ITEMS_PER_PAGE);
    let header_len = KEY_FILE_HEADER_BYTES + ledgers.len() * KEY_FILE_LEDGER_BYTES + item_pages * 4;
    let header_pages = pad_to_page(header_len as u64) as usize / PAGE_BYTES as usize;
    let mut b = vec![0u8; (header_pages + item_pages) * PAGE_BYTES as usize];
    let (min_t, max_t) =
        items.iter().fold((u64::MAX, 0), |(lo, hi), i| (lo.min(i.publish_time_ms), hi.max(i.publish_time_ms)));
    let mut off = KEY_FILE_HEADER_BYTES;
    for (l, first, end) in ledgers {
        wr(&mut b, off, &l.to_le_bytes());
        wr(&mut b, off + 8, &first.to_le_bytes());
        wr(&mut b, off + 16, &end.to_le_bytes());
        off += KEY_FILE_LEDGER_BYTES;
    }
    for chunk in items.chunks(KEY_ITEMS_PER_PAGE) {
        wr(&mut b, off, &chunk[0].key_hash.to_le_bytes());
        off += 4;
    }
    wr(&mut b, 0, &KEY_FILE_MAGIC);
    wr(&mut b, 12, &KEY_FILE_VERSION.to_le_bytes());
    wr(&mut b, 16, &(header_len as u64).to_le_bytes());
    wr(&mut b, 24, &seq.to_le_bytes());
    wr(&mut b, 32, &(items.len() as u64).to_le_bytes());
    wr(&mut b, 40, &(ledgers.len() as u32).to_le_bytes());
    wr(&mut b, 44, &(item_pages as u32).to_le_bytes());
    wr(&mut b, 48, &(if items.is_empty() { 0 } else { min_t }).to_le_bytes());
    wr(&mut b, 56, &max_t.to_le_bytes());
    let c = crc(&[&b[12..header_len]]);
    wr(&mut b, 8, &c.to_le_bytes());
    for (p, chunk) in items.chunks(KEY_ITEMS_PER_PAGE).enumerate() {
        let base = (header_pages + p) * PAGE_BYTES as usize;
        let page = &mut b[base..base + PAGE_BYTES as usize];
        wr(page, 0, &KEY_PAGE_MAGIC);
        wr(page, 8, &(chunk.len() as u32).to_le_bytes());
        wr(page, 12, &(p as u32).to_le_bytes());
        for (i, it) in chunk.iter().enumerate() {
            let o = KEY_PAGE_HEADER_BYTES + i * KEY_ITEM_BYTES;
            wr(page, o, &it.key_hash.to_le_bytes());
            wr(page, o + 8, &it.ledger.to_le_bytes());
            wr(page, o + 16, &it.entry.to_le_bytes());
            wr(page, o + 24, &it.publish_time_ms.to_le_bytes());
        }
        let c = crc(&[&page[8..]]);
        wr(page, 4, &c.to_le_bytes());
    }
    b
}

/// Bytes of a file's header region, from its first page (before the
/// checksum can be verified: only to know how much to read).
pub fn key_file_header_len(first_page: &[u8]) -> Result<u64, CorruptReason> {
    if first_page.len() < KEY_FILE_HEADER_BYTES {
        return Err(CorruptReason::ShortFile { len: first_page.len() as u64, need: KEY_FILE_HEADER_BYTES as u64 });
    }
    if first_page[0..8] != KEY_FILE_MAGIC {
        return Err(CorruptReason::BadMagic);
    }
    Ok(rd_u64(first_page, 16))
}

/// Decodes and verifies a header region (`b` holds at least `header_len` bytes).
pub fn decode_key_file_header(b: &[u8]) -> Result<KeyFileHeader, CorruptReason> {
    let header_len = key_file_header_len(b)?;
    if header_len > b.len() as u64 || header_len < KEY_FILE_HEADER_BYTES as u64 {
        return Err(CorruptReason::Length { len: header_len, limit: b.len() as u64 });
    }
    let b = &b[..header_len as usize];
    let stored = rd_u32(b, 8);
    let computed = crc(&[&b[12..]]);
    if stored != computed {
        return Err(CorruptReason::HeaderCrc { stored, computed });
    }
    let version = rd_u16(b, 12);
    if version != KEY_FILE_VERSION {
        return Err(CorruptReason::Version(version));
    }
    let nledgers = rd_u32(b, 40) as u64;
    let item_pages = rd_u32(b, 44);
    let items = rd_u64(b, 32);
    let need = KEY_FILE_HEADER_BYTES as u64 + nledgers * KEY_FILE_LEDGER_BYTES as u64 + item_pages as u64 * 4;
    if need != header_len || items.div_ceil(KEY_ITEMS_PER_PAGE as u64) != item_pages as u64 {
        return Err(CorruptReason::Field { field: "key file header length", expected: need, found: header_len });
    }
    let mut off = KEY_FILE_HEADER_BYTES;
    let mut ledgers = Vec::with_capacity(nledgers as usize);
    for _ in 0..nledgers {
        ledgers.push((rd_u64(b, off), rd_u64(b, off + 8), rd_u64(b, off + 16)));
        off += KEY_FILE_LEDGER_BYTES;
    }
    let fence = (0..item_pages as usize).map(|p| rd_u32(b, off + 4 * p)).collect();
    Ok(KeyFileHeader {
        seq: rd_u64(b, 24),
        items,
        item_pages,
        min_time_ms: rd_u64(b, 48),
        max_time_ms: rd_u64(b, 56),
        ledgers,
        fence,
        header_pages: pad_to_page(header_len) / PAGE_BYTES,
    })
}

/// Decodes and verifies item page `p` of a file.
pub fn decode_key_page(page: &[u8], p: u32) -> Result<Vec<KeyItem>, CorruptReason> {
    if page.len() < PAGE_BYTES as usize {
        return Err(CorruptReason::ShortFile { len: page.len() as u64, need: PAGE_BYTES });
    }
    let page = &page[..PAGE_BYTES as usize];
    if page[0..4] != KEY_PAGE_MAGIC {
        return Err(CorruptReason::BadMagic);
    }
    let stored = rd_u32(page, 4);
    let computed = crc(&[&page[8..]]);
    if stored != computed {
        return Err(CorruptReason::BodyCrc { stored, computed });
    }
    let n = rd_u32(page, 8) as usize;
    let found = rd_u32(page, 12);
    if found != p || n == 0 || n > KEY_ITEMS_PER_PAGE {
        return Err(CorruptReason::Field { field: "key page number/count", expected: p as u64, found: found as u64 });
    }
    Ok((0..n)
        .map(|i| {
            let o = KEY_PAGE_HEADER_BYTES + i * KEY_ITEM_BYTES;
            KeyItem {
                key_hash: rd_u32(page, o),
                ledger: rd_u64(page, o + 8),
                entry: rd_u64(page, o + 16),
                publish_time_ms: rd_u64(page, o + 24),
            }
        })
        .collect())
}

/// Item pages of a file that can hold `hash`: from the last page whose first
/// hash is below it through the pages starting with it.
pub fn key_pages_for(fence: &[u32], hash: u32) -> std::ops::Range<u32> {
    let lo = fence.partition_point(|f| *f < hash).saturating_sub(1);
    let hi = fence.partition_point(|f| *f <= hash);
    (lo as u32)..(hi.max(lo) as u32)
}

pub(crate) struct Sealed<F> {
    pub hdr: KeyFileHeader,
    pub path: PathBuf,
    pub file: F,
}

/// The key index state of one log. Owned by the shard's executor.
pub(crate) struct KeyIndex<F> {
    pub dir: PathBuf,
    pub sealed: Vec<Rc<Sealed<F>>>,
    pub next_seq: u64,
    pub active: Vec<KeyItem>,
    /// Hash chains over the active part (RocketMQ's slot + previous-item
    /// links): `heads[hash]` is the newest item with that hash, `prev[i]`
    /// the one before item i; both as global numbers (`base` + position),
    /// so that dropping sealed items from the front keeps them valid.
    heads: HashMap<u32, u64>,
    prev: Vec<u64>,
    base: u64,
    /// Per ledger, the entries the active part covers.
    pub active_cover: BTreeMap<u64, (u64, u64)>,
    /// Per ledger, the next entry to add (everything before it is in a
    /// file or in the active part).
    pub next: HashMap<u64, u64>,
    /// The ledgers that may have entries not added yet (`next` short of
    /// their laid-out end): every ledger after open, then each ledger as
    /// an entry is laid out in it. Upkeep and lookups visit these only,
    /// not every ledger of the shard (a million, idle, cost a pass of tens
    /// of milliseconds on the shard's executor).
    pub behind: BTreeSet<u64>,
    /// A seal is being written (one at a time).
    pub sealing: bool,
    /// The last seal found no space (logged once until one succeeds).
    pub space_short: bool,
}

impl<F> KeyIndex<F> {
    pub fn empty(dir: PathBuf) -> Self {
        KeyIndex {
            dir,
            sealed: Vec::new(),
            next_seq: 0,
            active: Vec::new(),
            heads: HashMap::new(),
            prev: Vec::new(),
            base: 0,
            active_cover: BTreeMap::new(),
            next: HashMap::new(),
            behind: BTreeSet::new(),
            sealing: false,
            space_short: false,
        }
    }

    pub fn path(&self, seq: u64) -> PathBuf {
        self.dir.join(format!("{seq:020}.kix"))
    }

    /// Adds the durable entries of every live ledger not yet indexed, at
    /// most until the active part holds `limit` items. A ledger stops at
    /// an entry whose index page is not in the cache: every such
    /// `(ledger, entry)` is returned, for the caller to read its pages and
    /// go on with that ledger alone ([`catch_up_ledger`](Self::catch_up_ledger)).
    /// (Returning only the first, to be called again, made a pass over
    /// every ledger per page read: quadratic in ledgers after a restart.)
    pub fn catch_up<G>(&mut self, st: &State<G>, limit: Option<usize>) -> Vec<(u64, u64)> {
        let mut missing = Vec::new();
        let mut from = Some(0);
        while let Some(id) = from.and_then(|f| self.behind.range(f..).next().copied()) {
            if limit.is_some_and(|n| self.active.len() >= n) {
                break;
            }
            from = id.checked_add(1);
            if let Some(e) = self.catch_up_ledger(st, id, limit) {
                missing.push((id, e));
            }
        }
        missing
    }

    /// Adds ledger `id`'s durable entries not yet indexed, at most until
    /// the active part holds `limit` items; the entry whose index page is
    /// not in the cache, if it stopped at one.
    pub fn catch_up_ledger<G>(&mut self, st: &State<G>, id: u64, limit: Option<usize>) -> Option<u64> {
        let Some(l) = st.ledgers.get(&id).filter(|l| l.deleted.is_none()) else {
            self.behind.remove(&id);
            return None;
        };
        let durable = durable_entries(l, st.tail);
        let from = self.next.get(&id).copied().unwrap_or(0);
        if durable <= from {
            if from >= l.laid_out() {
                self.behind.remove(&id);
            }
            return None;
        }
        let mut missing = None;
        let mut e = from;
        while e < durable {
            if limit.is_some_and(|n| self.active.len() >= n) {
                break;
            }
            let ie = match crate::log::peek(st, id, e) {
                crate::log::Lookup::Found(ie) => ie,
                crate::log::Lookup::Page => {
                    missing = Some(e);
                    break;
                }
                crate::log::Lookup::None => break,
            };
            if ie.extras.key_hash != 0 {
                let item = KeyItem {
                    key_hash: ie.extras.key_hash,
                    ledger: id,
                    entry: e,
                    publish_time_ms: ie.extras.publish_time_ms,
                };
                push_item(&mut self.active, &mut self.prev, &mut self.heads, self.base, item);
            }
            e += 1;
        }
        if e > from {
            let c = self.active_cover.entry(id).or_insert((from, from));
            c.1 = e;
            self.next.insert(id, e);
        }
        if e >= l.laid_out() {
            self.behind.remove(&id);
        }
        missing
    }
}

/// No item (end of a hash chain).
const CHAIN_END: u64 = u64::MAX;

fn push_item(active: &mut Vec<KeyItem>, prev: &mut Vec<u64>, heads: &mut HashMap<u32, u64>, base: u64, item: KeyItem) {
    let g = base + active.len() as u64;
    prev.push(heads.insert(item.key_hash, g).unwrap_or(CHAIN_END));
    active.push(item);
}

impl<F> KeyIndex<F> {
    /// Active items with `hash`, newest first, by walking its chain.
    fn chain(&self, hash: u32) -> impl Iterator<Item = &KeyItem> + '_ {
        let mut g = self.heads.get(&hash).copied().unwrap_or(CHAIN_END);
        std::iter::from_fn(move || {
            if g == CHAIN_END || g < self.base {
                return None;
            }
            let i = (g - self.base) as usize;
            let item = self.active.get(i)?;
            g = self.prev.get(i).copied().unwrap_or(CHAIN_END);
            Some(item)
        })
    }

    /// Drops the `n` oldest active items (now in a file).
    fn drop_front(&mut self, n: usize) {
        self.active.drain(..n);
        self.prev.drain(..n);
        self.base += n as u64;
        let base = self.base;
        self.heads.retain(|_, g| *g >= base);
    }

    /// Keeps only the active items `keep` accepts, relinking the chains.
    fn retain_items(&mut self, keep: impl Fn(&KeyItem) -> bool) {
        let items = std::mem::take(&mut self.active);
        self.prev.clear();
        self.heads.clear();
        self.base = 0;
        for it in items.into_iter().filter(|i| keep(i)) {
            push_item(&mut self.active, &mut self.prev, &mut self.heads, self.base, it);
        }
    }
}

impl<D: Disk> EntryLog<D> {
    /// The newest entries whose key hash is `key_hash`, newest first by
    /// publish time, at most `max`: only entries of ledgers `ledger_ok`
    /// accepts, and with `before_ms`, only those published before it.
    /// Reads the in-memory part and one or two pages per key index file;
    /// never the log. Hashes collide: confirm each hit by reading the
    /// entry's key. Only durable entries are indexed.
    pub async fn find_key(
        &self,
        key_hash: u32,
        ledger_ok: &dyn Fn(u64) -> bool,
        before_ms: Option<u64>,
        max: usize,
    ) -> Result<Vec<KeyHit>> {
        let sh = &self.sh;
        let time_ok = |t: u64| before_ms.is_none_or(|b| t < b);
        // Entries not indexed yet whose index pages are on disk only (after
        // a restart): their pages first.
        self.catch_up_keys(None).await?;
        let (mut hits, files) = {
            let k = sh.keys.borrow();
            let hits: Vec<KeyHit> = k
                .chain(key_hash)
                .filter(|i| i.key_hash == key_hash && ledger_ok(i.ledger) && time_ok(i.publish_time_ms))
                .map(|i| KeyHit { publish_time_ms: i.publish_time_ms, ledger: i.ledger, entry: i.entry })
                .collect();
            let files: Vec<Rc<Sealed<D::File>>> = k
                .sealed
                .iter()
                .filter(|f| f.hdr.items > 0 && before_ms.is_none_or(|b| f.hdr.min_time_ms < b))
                .filter(|f| f.hdr.ledgers.iter().any(|(l, _, _)| ledger_ok(*l)))
                .cloned()
                .collect();
            (hits, files)
        };
        for f in files.iter().rev() {
            for p in key_pages_for(&f.hdr.fence, key_hash) {
                let off = (f.hdr.header_pages + p as u64) * PAGE_BYTES;
                let page = f
                    .file
                    .read_at(off, PAGE_BYTES as usize)
                    .await
                    .map_err(|e| StorageError::io("read key index page", &f.path, e))?;
                let items = decode_key_page(&page, p).map_err(|r| StorageError::corrupt(&f.path, off, r))?;
                hits.extend(
                    items
                        .into_iter()
                        .filter(|i| i.key_hash == key_hash && ledger_ok(i.ledger) && time_ok(i.publish_time_ms))
                        .map(|i| KeyHit { publish_time_ms: i.publish_time_ms, ledger: i.ledger, entry: i.entry }),
                );
            }
        }
        // Files and memory may still name entries of deleted ledgers (until
        // upkeep ages them out) or, after a crash, entries past a ledger's end.
        {
            let st = sh.st.borrow();
            hits.retain(|h| st.ledgers.get(&h.ledger).is_some_and(|l| l.deleted.is_none() && h.entry < l.laid_out()));
        }
        hits.sort_unstable_by(|a, b| b.cmp(a));
        hits.dedup();
        hits.truncate(max);
        Ok(hits)
    }

    /// Key index upkeep (the background task calls this): index durable
    /// entries, write a file for every `key_index_items_per_file` items, and
    /// remove files whose ledgers are all deleted. `force` seals whatever
    /// is in memory (tests, benchmarks).
    pub async fn maintain_key_index(&self, force: bool) -> Result<()> {
        let sh = &self.sh;
        let per_file = sh.cfg.key_index_items_per_file.max(1);
        loop {
            {
                let st = sh.st.borrow();
                if sh.keys.borrow().sealing {
                    return Ok(());
                }
                crate::log::check_mode(st.mode)?;
            }
            // Entries whose index pages are on disk only (after a
            // restart): their pages first, while there is room.
            self.catch_up_keys(Some(per_file)).await?;
            let full = {
                let k = sh.keys.borrow();
                k.active.len() >= per_file || (force && !k.active_cover.is_empty())
            };
            if !full {
                break;
            }
            self.seal_keys().await?;
            if force && sh.keys.borrow().active_cover.is_empty() {
                break;
            }
        }
        self.age_out_keys().await
    }

    /// Indexes every durable entry not yet indexed, reading the index
    /// pages that are on disk only, until the active part holds `limit`
    /// items: one pass over the ledgers finds those that stop at a page
    /// not in the cache, then each of them goes on alone, a read at a time.
    async fn catch_up_keys(&self, limit: Option<usize>) -> Result<()> {
        let sh = &self.sh;
        let full = |k: &KeyIndex<D::File>| limit.is_some_and(|n| k.active.len() >= n);
        loop {
            let missing = {
                let st = sh.st.borrow();
                sh.keys.borrow_mut().catch_up(&st, limit)
            };
            if missing.is_empty() {
                return Ok(());
            }
            for (ledger, mut entry) in missing {
                loop {
                    sh.ensure_index(ledger, entry, KEY_CATCH_UP_ENTRIES).await?;
                    let st = sh.st.borrow();
                    crate::log::check_mode(st.mode)?;
                    let mut k = sh.keys.borrow_mut();
                    if full(&k) {
                        return Ok(());
                    }
                    match k.catch_up_ledger(&st, ledger, limit) {
                        Some(e) => entry = e,
                        None => break,
                    }
                }
            }
        }
    }

    async fn seal_keys(&self) -> Result<()> {
        let sh = &self.sh;
        // A copy: until the file is durable, lookups keep finding the items
        // in memory (appends only go to the end of the active part).
        // At most `key_index_items_per_file` of the oldest items. Per ledger
        // they are in entry order, so the file covers each ledger from its
        // cover start through its last item in the file (all of the active
        // cover when the whole active part goes).
        let per_file = sh.cfg.key_index_items_per_file.max(1);
        let (seq, mut items, ledgers, path) = {
            let mut k = sh.keys.borrow_mut();
            k.sealing = true;
            let seq = k.next_seq;
            k.next_seq += 1;
            let n = k.active.len().min(per_file);
            let items = k.active[..n].to_vec();
            let mut cover: BTreeMap<u64, (u64, u64)> = BTreeMap::new();
            if n == k.active.len() {
                cover = k.active_cover.clone();
            } else {
                for i in &items {
                    let start = k.active_cover.get(&i.ledger).map_or(i.entry, |c| c.0);
                    let c = cover.entry(i.ledger).or_insert((start, i.entry + 1));
                    c.1 = c.1.max(i.entry + 1);
                }
            }
            let ledgers: Vec<(u64, u64, u64)> = cover.iter().map(|(l, (a, b))| (*l, *a, *b)).collect();
            (seq, items, ledgers, k.path(seq))
        };
        let n = items.len();
        items.sort_unstable_by_key(|i| (i.key_hash, i.ledger, i.entry));
        let bytes = encode_key_file(seq, &items, &ledgers);
        let tmp = path.with_extension("kix.tmp");
        let written: Result<D::File> = async {
            let io = |op: &'static str, p: &Path| {
                let p = p.to_path_buf();
                move |e| StorageError::io(op, p, e)
            };
            let f = sh.disk.open(&tmp, OpenMode::Truncate).await.map_err(io("create key index file", &tmp))?;
            f.write_at(0, &bytes).await.map_err(io("write key index file", &tmp))?;
            f.sync().await.map_err(io("fdatasync key index file", &tmp))?;
            sh.disk.rename(&tmp, &path).await.map_err(io("rename key index file", &tmp))?;
            let dir = sh.keys.borrow().dir.clone();
            sh.disk.sync_dir(&dir).await.map_err(io("fsync key index directory", &dir))?;
            Ok(f)
        }
        .await;
        let mut k = sh.keys.borrow_mut();
        k.sealing = false;
        match written {
            Ok(file) => {
                if std::mem::take(&mut k.space_short) {
                    info!(path = %path.display(), "key index file written again after a lack of space");
                }
                let hdr = decode_key_file_header(&bytes).map_err(|r| StorageError::corrupt(&path, 0, r))?;
                debug!(path = %path.display(), items = n, "key index file written");
                k.sealed.push(Rc::new(Sealed { hdr, path, file }));
                k.drop_front(n);
                for (l, _, end) in ledgers {
                    let drop_it = match k.active_cover.get_mut(&l) {
                        Some(c) if c.1 > end => {
                            c.0 = end;
                            false
                        }
                        Some(_) => true,
                        None => false,
                    };
                    if drop_it {
                        k.active_cover.remove(&l);
                    }
                }
                Ok(())
            }
            Err(e) if short_of_space(&e) => {
                // Nothing names the temporary file until the rename and the
                // items are still in memory: the next pass writes it again
                // (under the same number, over the same temporary file).
                k.next_seq = seq;
                if !std::mem::replace(&mut k.space_short, true) {
                    warn!(path = %path.display(), error = %e, "no space for a key index file: its items stay in memory and the next pass tries again");
                }
                Err(e)
            }
            Err(e) => {
                // As for the log itself: after a failed write or fsync, do not
                // go on as if nothing happened (fail-stop; a restart rebuilds
                // the key index from the ledger indexes).
                drop(k);
                sh.fail(&e);
                Err(e)
            }
        }
    }

    async fn age_out_keys(&self) -> Result<()> {
        let sh = &self.sh;
        let (gone, dir) = {
            let st = sh.st.borrow();
            let mut k = sh.keys.borrow_mut();
            // Dead only once the deletion is durable: a crash may still undo
            // one that is not, and the ledger's entries must stay findable.
            let tail = st.tail;
            let live = |l: &u64| st.ledgers.get(l).is_some_and(|l| !matches!(l.deleted, Some(Some(p)) if p < tail));
            let (gone, keep): (Vec<_>, Vec<_>) =
                std::mem::take(&mut k.sealed).into_iter().partition(|f| !f.hdr.ledgers.iter().any(|(l, _, _)| live(l)));
            k.sealed = keep;
            k.next.retain(|l, _| st.ledgers.contains_key(l));
            if !k.sealing {
                if k.active.iter().any(|i| !live(&i.ledger)) {
                    k.retain_items(|i| live(&i.ledger));
                }
                k.active_cover.retain(|l, _| live(l));
            }
            (gone, k.dir.clone())
        };
        if gone.is_empty() {
            return Ok(());
        }
        let removed: Result<()> = async {
            for f in &gone {
                match sh.disk.remove(&f.path).await {
                    Ok(()) => {}
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => return Err(StorageError::io("remove key index file", &f.path, e)),
                }
            }
            sh.disk.sync_dir(&dir).await.map_err(|e| StorageError::io("fsync key index directory", &dir, e))
        }
        .await;
        if let Err(e) = removed {
            sh.fail(&e);
            return Err(e);
        }
        info!(files = gone.len(), "removed key index files of deleted ledgers");
        Ok(())
    }

    /// Key index files: (sequence, items, path), oldest first; and the
    /// items still in memory.
    pub fn key_index_files(&self) -> (Vec<(u64, u64, PathBuf)>, usize) {
        let k = self.sh.keys.borrow();
        (k.sealed.iter().map(|f| (f.hdr.seq, f.hdr.items, f.path.clone())).collect(), k.active.len())
    }

    /// How many ledgers the next upkeep or lookup visits for entries not
    /// yet in the key index (every ledger after open, then those appended
    /// to since).
    pub fn key_index_behind(&self) -> usize {
        self.sh.keys.borrow().behind.len()
    }
}

/// Whether sealing failed only for lack of space while creating, writing or
/// renaming the file (a failed sync is never retried: what it leaves on
/// disk is unknown).
fn short_of_space(e: &StorageError) -> bool {
    match e {
        StorageError::Io { op, source, .. } => !op.contains("sync") && crate::log::is_no_space(source),
        _ => false,
    }
}

/// Loads the sealed files of `dir` at open. A damaged file (and every later
/// one, whose coverage would otherwise skip its entries) is removed: the
/// entries are indexed again from the ledger indexes.
pub(crate) async fn load<D: Disk>(disk: &D, dir: &Path) -> Result<KeyIndex<D::File>> {
    let io = |op: &'static str, p: &Path| {
        let p = p.to_path_buf();
        move |e| StorageError::io(op, p, e)
    };
    disk.create_dir_all(dir).await.map_err(io("create directory", dir))?;
    if let Some(parent) = dir.parent() {
        disk.sync_dir(parent).await.map_err(io("fsync directory", parent))?;
    }
    let mut k = KeyIndex::empty(dir.to_path_buf());
    let mut names = disk.list_dir(dir).await.map_err(io("list", dir))?;
    names.sort();
    let mut remove = Vec::new();
    let mut damaged = false;
    for name in names {
        let path = dir.join(&name);
        let Some(seq) = name.strip_suffix(".kix").filter(|s| s.len() == 20).and_then(|s| s.parse::<u64>().ok()) else {
            // A temp file of an interrupted seal, or a stranger.
            if name.ends_with(".kix.tmp") {
                remove.push(path);
            }
            continue;
        };
        k.next_seq = k.next_seq.max(seq + 1);
        if damaged {
            remove.push(path);
            continue;
        }
        let loaded: Result<Sealed<D::File>> = async {
            let file = disk.open(&path, OpenMode::Existing).await.map_err(io("open key index file", &path))?;
            let first = file.read_at(0, PAGE_BYTES as usize).await.map_err(io("read key index file", &path))?;
            let len = key_file_header_len(&first).map_err(|r| StorageError::corrupt(&path, 0, r))?;
            // The length is checked against the file before anything that
            // size is read (a damaged field must not allocate gigabytes).
            let size = file.size().await.map_err(io("stat key index file", &path))?;
            if len > size {
                return Err(StorageError::corrupt(&path, 16, CorruptReason::Length { len, limit: size }));
            }
            let b = file.read_at(0, pad_to_page(len) as usize).await.map_err(io("read key index file", &path))?;
            let hdr = decode_key_file_header(&b).map_err(|r| StorageError::corrupt(&path, 0, r))?;
            let need = (hdr.header_pages + hdr.item_pages as u64) * PAGE_BYTES;
            if size < need || hdr.seq != seq {
                return Err(StorageError::corrupt(&path, size, CorruptReason::ShortFile { len: size, need }));
            }
            Ok(Sealed { hdr, path: path.clone(), file })
        }
        .await;
        match loaded {
            Ok(s) => k.sealed.push(Rc::new(s)),
            Err(e) => {
                warn!(error = %e, "damaged key index file: removed with the later ones; rebuilt from the ledger indexes");
                damaged = true;
                remove.push(path);
            }
        }
    }
    for p in &remove {
        disk.remove(p).await.map_err(io("remove key index file", p))?;
    }
    if !remove.is_empty() {
        disk.sync_dir(dir).await.map_err(io("fsync key index directory", dir))?;
    }
    // Per ledger, the entries covered from 0 on without a gap. A gap (a
    // file removed while a crash undid the deletion that allowed it) is
    // indexed again from the ledger index; lookups drop the duplicates.
    let mut ranges: BTreeMap<u64, Vec<(u64, u64)>> = BTreeMap::new();
    for f in &k.sealed {
        for (l, first, end) in &f.hdr.ledgers {
            ranges.entry(*l).or_default().push((*first, *end));
        }
    }
    for (l, mut rs) in ranges {
        rs.sort_unstable();
        let mut next = 0;
        for (first, end) in rs {
            if first > next {
                break;
            }
            next = next.max(end);
        }
        k.next.insert(l, next);
    }
    Ok(k)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_round_trip_and_page_search() {
        let mut items: Vec<KeyItem> = (0..1000u64)
            .map(|i| KeyItem { key_hash: (i % 97) as u32 + 1, ledger: i % 3, entry: i, publish_time_ms: 1000 + i })
            .collect();
        items.sort_unstable_by_key(|i| (i.key_hash, i.ledger, i.entry));
        let ledgers = vec![(0, 0, 500), (1, 0, 400), (2, 10, 20)];
        let b = encode_key_file(7, &items, &ledgers);
        let hdr = decode_key_file_header(&b).unwrap();
        assert_eq!((hdr.seq, hdr.items, hdr.ledgers.clone()), (7, 1000, ledgers));
        assert_eq!((hdr.min_time_ms, hdr.max_time_ms), (1000, 1999));
        for hash in [1u32, 2, 50, 97, 98, 0] {
            let mut found = Vec::new();
            for p in key_pages_for(&hdr.fence, hash) {
                let off = ((hdr.header_pages + p as u64) * PAGE_BYTES) as usize;
                found.extend(decode_key_page(&b[off..], p).unwrap().into_iter().filter(|i| i.key_hash == hash));
            }
            let want: Vec<KeyItem> = items.iter().filter(|i| i.key_hash == hash).copied().collect();
            assert_eq!(found, want, "hash {hash}");
        }
        let mut bad = b.clone();
        bad[70] ^= 1;
        assert!(decode_key_file_header(&bad).is_err());
        let mut bad = b;
        let off = (hdr.header_pages * PAGE_BYTES) as usize + 100;
        bad[off] ^= 1;
        assert!(decode_key_page(&bad[off - 100..], 0).is_err());
    }
}
