//! Helpers shared by the storage integration tests.
#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use magnetar_storage::inspect::{ScanMode, ShardImage, Tail};
use magnetar_storage::sim::{SimDisk, SimRng};
use magnetar_storage::{Disk, EntryLog, LogConfig, Recovery, StorageError};

/// Runs `f` on a fresh glommio executor and fails the test if it takes longer
/// than `secs` (every test that awaits storage could otherwise hang). The
/// executor runs on a thread of its own, watched from this one: a task that
/// keeps its thread busy (never returning to the executor, so no timer of
/// its own fires) fails the test too, `secs` + 10 s in (the busy thread is
/// left behind).
pub fn run<F, Fut>(secs: u64, f: F)
where
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = ()> + 'static,
{
    let (done, finished) = std::sync::mpsc::channel();
    let worker = std::thread::Builder::new()
        .name("glommio-test".into())
        .spawn(move || {
            let ex = glommio::LocalExecutorBuilder::default().make().expect("glommio executor");
            ex.run(async move {
                let finished = futures_lite::future::or(
                    async {
                        f().await;
                        true
                    },
                    async {
                        glommio::timer::sleep(Duration::from_secs(secs)).await;
                        false
                    },
                )
                .await;
                assert!(finished, "test timed out after {secs} s");
            });
            // The executor's teardown is watched too: it goes before the
            // signal. Sent only on success; a panic drops `done`, which
            // ends the wait below.
            drop(ex);
            let _ = done.send(());
        })
        .expect("test thread");
    match finished.recv_timeout(Duration::from_secs(secs + 10)) {
        Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
            if let Err(panic) = worker.join() {
                std::panic::resume_unwind(panic);
            }
        }
        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
            panic!("test hung: its executor thread has been busy for {} s (past its own {secs} s timer)", secs + 10)
        }
    }
}

/// The seed for a randomized test: `MAGNETAR_SEED` replays one.
pub fn seed_from_env() -> Option<u64> {
    std::env::var("MAGNETAR_SEED").ok().map(|s| s.parse().expect("MAGNETAR_SEED must be a u64"))
}

pub fn fresh_seed() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_nanos() as u64).unwrap_or(1)
}

/// Small segments and batches so that rollover and many batches happen fast.
pub fn small_config(dir: &str) -> LogConfig {
    let mut c = LogConfig::new(dir);
    c.segment_bytes = 64 << 10;
    c.flush_bytes_max = 16 << 10;
    c.write_cache_bytes = 8 << 10;
    c.checkpoint_interval = Duration::from_secs(3600);
    c.allow_tmpfs = true;
    // Tests compact explicitly (`compact()`); no background task queue per open.
    c.compaction_interval = Duration::ZERO;
    c.key_index_interval = Duration::ZERO;
    c
}

pub fn body(rng: &mut SimRng, tag: u64) -> Bytes {
    let len = match rng.below(10) {
        0 => 0,
        1 => 5000 + rng.below(15000) as usize,
        _ => rng.below(1500) as usize,
    };
    let mut v = Vec::with_capacity(len + 8);
    v.extend_from_slice(&tag.to_le_bytes());
    while v.len() < len {
        v.push(rng.next_u64() as u8);
    }
    Bytes::from(v)
}

/// One appended record, in lsn order.
#[derive(Debug, Clone)]
pub enum Rec {
    Entry {
        ledger: u64,
        entry: u64,
        body: Bytes,
    },
    Meta {
        key: Vec<u8>,
        value: Bytes,
    },
    /// `delete_ledger`: the ledger and its entries are gone (ids are never reused).
    Delete {
        ledger: u64,
    },
}

/// What the test appended, and how much of it was acknowledged durable.
#[derive(Debug, Clone, Default)]
pub struct Model {
    pub recs: Vec<Rec>,
    /// recs[..acked] had wait_durable return Ok.
    pub acked: usize,
}

impl Model {
    /// The ledger id the workload uses for `slot` now: a deletion moves the
    /// slot to a fresh id (ids are never reused after a deletion).
    pub fn ledger_of(&self, slot: u64) -> u64 {
        let deleted = self.recs.iter().filter(|r| matches!(r, Rec::Delete { ledger } if ledger % 4 == slot)).count();
        slot + 4 * deleted as u64
    }

    pub fn next_entry(&self, ledger: u64) -> u64 {
        self.recs.iter().filter(|r| matches!(r, Rec::Entry { ledger: l, .. } if *l == ledger)).count() as u64
    }

    /// Checks that the recovered log equals the state after some prefix of
    /// `recs` no shorter than `acked`: everything acknowledged is there, in
    /// order, exactly once, byte for byte, and nothing else. Returns the
    /// model truncated to that prefix (everything in it now counts as acked).
    pub async fn verify<D: Disk>(&self, log: &EntryLog<D>, context: &str) -> Model {
        let recovered: BTreeMap<u64, u64> = log.ledgers().into_iter().filter(|(_, n)| *n > 0).collect();
        let recovered_meta: BTreeMap<Vec<u8>, Bytes> = log.meta_prefix(b"").into_iter().collect();
        let mut counts: BTreeMap<u64, u64> = BTreeMap::new();
        let mut meta: BTreeMap<Vec<u8>, Bytes> = BTreeMap::new();
        let mut matched = None;
        for m in 0..=self.recs.len() {
            if m > 0 {
                match &self.recs[m - 1] {
                    Rec::Entry { ledger, .. } => *counts.entry(*ledger).or_default() += 1,
                    Rec::Delete { ledger } => {
                        counts.remove(ledger);
                    }
                    Rec::Meta { key, value } => {
                        if value.is_empty() {
                            meta.remove(key);
                        } else {
                            meta.insert(key.clone(), value.clone());
                        }
                    }
                }
            }
            // The longest matching prefix: a deletion right after its
            // ledger's entries leaves the same state as before them, and a
            // model that forgot a recovered deletion would reuse the id.
            if m >= self.acked && counts == recovered && meta == recovered_meta {
                matched = Some(m);
            }
        }
        if matched.is_some() {
            // The checks below compare against the matched state, which is
            // the recovered one.
            meta = recovered_meta.clone();
        }
        let Some(m) = matched else {
            let shape: Vec<String> = self
                .recs
                .iter()
                .map(|r| match r {
                    Rec::Entry { ledger, entry, .. } => format!("e{ledger}:{entry}"),
                    Rec::Meta { key, value } => format!("m{}={}", String::from_utf8_lossy(key), value.len()),
                    Rec::Delete { ledger } => format!("DEL{ledger}"),
                })
                .collect();
            panic!(
                "{context}: recovered state is no prefix >= acked {} of {} records\n recovered ledgers {recovered:?}\n recovered meta keys {:?}\n records {shape:?}",
                self.acked,
                self.recs.len(),
                recovered_meta.keys().collect::<Vec<_>>()
            );
        };
        // Byte for byte, read back from disk (the write cache is empty after open).
        let mut seen: HashMap<u64, u64> = HashMap::new();
        let deleted: Vec<u64> = self.recs[..m]
            .iter()
            .filter_map(|r| if let Rec::Delete { ledger } = r { Some(*ledger) } else { None })
            .collect();
        for d in &deleted {
            assert!(log.read(*d, 0).await.is_err(), "{context}: entry of deleted ledger {d} readable");
        }
        for r in &self.recs[..m] {
            if let Rec::Entry { ledger, entry, body } = r {
                if deleted.contains(ledger) {
                    continue;
                }
                let n = seen.entry(*ledger).or_default();
                assert_eq!(*n, *entry, "{context}: model entry ids dense");
                *n += 1;
                let got =
                    log.read(*ledger, *entry).await.unwrap_or_else(|e| panic!("{context}: read {ledger}:{entry}: {e}"));
                assert_eq!(&got, body, "{context}: entry {ledger}:{entry} differs");
            }
        }
        for (ledger, n) in &recovered {
            assert_eq!(log.next_entry(*ledger), *n);
            assert!(log.read(*ledger, *n).await.is_err(), "{context}: entry past the end");
        }
        for (k, v) in &meta {
            assert_eq!(log.meta(k).as_ref(), Some(v), "{context}: meta");
        }
        Model { recs: self.recs[..m].to_vec(), acked: m }
    }
}

impl Model {
    /// Appends one entry of `ledger` to `log` (recovered from `disk`), waits
    /// until it is durable, crashes the disk there and reopens with `cfg`:
    /// appending after a recovery works, and the new entry survives another
    /// crash with everything in `self` (all of it counted acknowledged).
    pub async fn append_crash_verify(
        mut self,
        log: EntryLog<magnetar_storage::sim::SimDisk>,
        disk: &magnetar_storage::sim::SimDisk,
        cfg: LogConfig,
        ledger: u64,
        body: &'static [u8],
        context: &str,
    ) {
        let body = Bytes::from_static(body);
        let a = log.append(ledger, body.clone()).unwrap();
        log.wait_durable(a.lsn).await.unwrap();
        self.recs.push(Rec::Entry { ledger, entry: a.entry, body });
        self.acked = self.recs.len();
        let image = disk.crash(a.lsn);
        drop(log);
        let (log, _) = open_inspected(image, cfg).await.unwrap();
        self.verify(&log, context).await;
    }
}

pub fn shard_dir() -> PathBuf {
    PathBuf::from("/shard-0")
}

/// Byte `p` of the file the `read_bytes` tests write: differs between
/// neighbouring bytes and between pages, so a view off by a byte or a page fails.
pub fn read_bytes_pattern(p: u64) -> u8 {
    (p % 251 + p / 4096) as u8
}

/// Writes `pages` pages of [`read_bytes_pattern`] to a new file at `path`.
pub async fn read_bytes_file(
    path: &std::path::Path,
    pages: u64,
) -> <magnetar_storage::DmaDisk as magnetar_storage::Disk>::File {
    use magnetar_storage::{Disk, DiskFile, DmaDisk, OpenMode, PAGE_BYTES};
    DmaDisk::default().prepare(path.parent().unwrap()).await.unwrap();
    let file = DmaDisk::default().open(path, OpenMode::Create).await.unwrap();
    let mut b = file.alloc_buf((pages * PAGE_BYTES) as usize);
    for (i, x) in b.as_mut().iter_mut().enumerate() {
        *x = read_bytes_pattern(i as u64);
    }
    file.write_buf(0, b).await.unwrap();
    file.sync().await.unwrap();
    file
}

/// The body of entry `entry` of `ledger`, `len` bytes (at least its
/// `ledger:entry:` prefix): each entry's bytes differ, so a read of the
/// wrong copy or position shows.
pub fn entry_body(ledger: u64, entry: u64, len: usize) -> Bytes {
    let mut v = format!("{ledger}:{entry}:").into_bytes();
    while v.len() < len {
        v.push((v.len() as u64 * 31 + entry * 7 + ledger) as u8);
    }
    Bytes::from(v)
}

/// Asserts that `ledger` holds exactly entries `0..n`, each
/// `entry_body(ledger, e, len)` byte for byte.
pub async fn check_entries<D: Disk>(log: &EntryLog<D>, ledger: u64, n: u64, len: usize, ctx: &str) {
    assert_eq!(log.next_entry(ledger), n, "{ctx}: ledger {ledger} entries");
    for e in 0..n {
        let got = log.read(ledger, e).await.unwrap_or_else(|err| panic!("{ctx}: read {ledger}:{e}: {err}"));
        assert_eq!(got, entry_body(ledger, e, len), "{ctx}: {ledger}:{e} differs");
    }
}

/// What the offline inspector (`magnetar inspect`, [`ShardImage`]) made of
/// a shard image, in both modes, read before recovery ran on it.
pub struct Inspected {
    /// No shard directory yet (a first open): nothing to compare.
    pub absent: bool,
    pub tail: Result<ShardImage, StorageError>,
    pub verify: Result<ShardImage, StorageError>,
}

/// Loads the image `disk` holds of shard directory `dir` with the inspector
/// (exported to a temporary directory first: it reads real files).
pub fn inspect_image(disk: &SimDisk, dir: &Path) -> Inspected {
    let tmp = tempfile::tempdir().unwrap();
    disk.export(tmp.path()).unwrap();
    let at = tmp.path().join(dir.strip_prefix("/").unwrap_or(dir));
    Inspected {
        absent: !ShardImage::is_shard_dir(&at),
        tail: ShardImage::load(&at, ScanMode::Tail, &mut |_, _| {}),
        verify: ShardImage::load(&at, ScanMode::Verify, &mut |_, _| {}),
    }
}

/// Checks that the inspector's verdicts on an image (`seen`, see
/// [`inspect_image`]) are what recovery did with it: recovered to the same
/// tail, cutting the same torn bytes, with the same ledgers; or refused
/// with the same damage at the same offset. (Recovery and the inspector
/// share one log walker, `storage/src/walk.rs`; this keeps it so.)
pub fn assert_inspector_agrees(seen: &Inspected, recovered: std::result::Result<&Recovery, &StorageError>, ctx: &str) {
    if seen.absent {
        return;
    }
    match recovered {
        Ok(rec) if rec.dropped.is_empty() && rec.rebuilt.is_empty() => {
            let img = seen.tail.as_ref().unwrap_or_else(|e| panic!("{ctx}: recovered, but inspect refuses: {e}"));
            let (tail, torn) = match &img.tail {
                Tail::Clean { position } => {
                    assert!(rec.clean, "{ctx}: inspect sees a clean shutdown, recovery did not: {rec:?}");
                    (*position, 0)
                }
                Tail::End { position } => (*position, 0),
                Tail::Torn { position, bytes, .. } => (*position, *bytes),
            };
            assert_eq!((tail, torn), (rec.tail, rec.truncated_bytes), "{ctx}: (tail, torn bytes) inspect vs recovery");
            if !rec.clean {
                assert!(!matches!(img.tail, Tail::Clean { .. }), "{ctx}: recovery scanned, inspect saw a clean stop");
            }
            let ledgers: Vec<(u64, u64)> = img.ledgers.iter().map(|(id, l)| (*id, l.index.len() as u64)).collect();
            assert_eq!(ledgers, rec.ledgers, "{ctx}: ledgers (id, entries) inspect vs recovery");
            let v =
                seen.verify.as_ref().unwrap_or_else(|e| panic!("{ctx}: recovered, but inspect --verify refuses: {e}"));
            assert_eq!(v.tail.position(), rec.tail, "{ctx}: tail, inspect --verify vs recovery");
            let vl: Vec<(u64, u64)> = v.ledgers.iter().map(|(id, l)| (*id, l.index.len() as u64)).collect();
            assert_eq!(vl, rec.ledgers, "{ctx}: ledgers (id, entries) inspect --verify vs recovery");
        }
        Ok(_) => {} // rebuilt or accepted a loss: the inspector only reports
        Err(StorageError::Corrupt { offset, reason, .. }) => {
            for (mode, got) in [("inspect", &seen.tail), ("inspect --verify", &seen.verify)] {
                match got {
                    Err(StorageError::Corrupt { offset: o, reason: r, .. }) => {
                        assert_eq!((o, r), (offset, reason), "{ctx}: {mode} refuses otherwise than recovery")
                    }
                    Err(e) => panic!("{ctx}: recovery refused ({reason} at {offset}), {mode} failed otherwise: {e}"),
                    Ok(img) => {
                        panic!("{ctx}: recovery refused ({reason} at {offset}), {mode} accepts (tail {:?})", img.tail)
                    }
                }
            }
        }
        Err(_) => {} // an I/O error (an injected fault): nothing to compare
    }
}

/// Opens (recovers) the log on `disk`, having first checked that the
/// offline inspector's verdict on the same image agrees with what recovery
/// does ([`assert_inspector_agrees`]).
pub async fn open_inspected(
    disk: SimDisk,
    cfg: LogConfig,
) -> std::result::Result<(EntryLog<SimDisk>, Recovery), StorageError> {
    let seen = inspect_image(&disk, &cfg.dir);
    let opened = EntryLog::open_with(disk, cfg).await;
    assert_inspector_agrees(&seen, opened.as_ref().map(|(_, rec)| rec), "inspect vs recovery");
    opened
}
