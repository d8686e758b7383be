//! The offline inspector (`magnetar_storage::inspect`) against recovery.
//!
//! Goal: the inspector, reading files with plain std I/O, sees exactly what
//! recovery would restore (ledgers, entry bytes, metadata, where the log
//! ends and how much torn tail gets truncated), and `Verify` names the file
//! and offset of damage anywhere in the log, the index files or the
//! checkpoint. Workloads include compaction passes.
//!
//! Method: workloads on a `SimDisk`, crashed by seed; the crash image is
//! exported to a temporary directory and loaded by the inspector in both
//! modes, then opened by `EntryLog` and compared. Every seed is printed;
//! `MAGNETAR_SEED=<seed>` replays one, `MAGNETAR_SEEDS=<n>` sets how many.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::collections::BTreeMap;
use std::path::Path;

use bytes::Bytes;
use common::{run, shard_dir, small_config};
use magnetar_storage::inspect::{ScanMode, ShardImage, Tail};
use magnetar_storage::sim::{SimDisk, SimRng};
use magnetar_storage::{CorruptReason, EntryLog, StorageError};

/// Compacts eagerly, so that crash images hold moved entries and removed
/// segments.
fn cfg() -> magnetar_storage::LogConfig {
    let mut c = small_config("/shard-0");
    c.compaction_live_pct = 60;
    c
}

fn load(root: &Path, mode: ScanMode) -> Result<ShardImage, StorageError> {
    ShardImage::load(&root.join("shard-0"), mode, &mut |_, _| {})
}

/// Appends, puts and checkpoints chosen by `rng` until done or the disk dies.
async fn workload(log: &EntryLog<SimDisk>, rng: &mut SimRng, steps: usize) {
    let mut last = None;
    let mut generation = [0u64; 5];
    for step in 0..steps {
        // Ledger ids are never reused after a deletion (the storage contract).
        let slot = rng.below(5) as usize;
        let ledger = slot as u64 + 5 * generation[slot];
        let r = match rng.below(12) {
            0..=6 => log.append(ledger, common::body(rng, step as u64)).map(|a| a.lsn),
            10 | 11 => match log.delete_ledger(ledger) {
                Err(StorageError::LedgerBusy { .. }) => continue,
                r => {
                    generation[slot] += 1;
                    r
                }
            },
            7 => log.put_meta(format!("k{}", rng.below(4)).as_bytes(), Bytes::from(format!("v{step}"))),
            8 => match last {
                Some(l) => log.wait_durable(l).await.map(|_| l),
                None => continue,
            },
            _ if rng.chance(1, 2) => match log.compact().await {
                Ok(_) => continue,
                Err(e) => Err(e),
            },
            _ => match log.checkpoint().await {
                Ok(()) => continue,
                Err(e) => Err(e),
            },
        };
        match r {
            Ok(l) => last = Some(l),
            Err(_) => return,
        }
    }
    if let Some(l) = last {
        let _ = log.wait_durable(l).await;
    }
}

async fn one_seed(seed: u64) {
    let ctx = format!("seed {seed} (replay: MAGNETAR_SEED={seed})");
    let mut rng = SimRng::new(seed);
    let disk = SimDisk::new();
    let (log, _) = EntryLog::open_with(disk.clone(), cfg()).await.unwrap();
    disk.crash_at_op(disk.ops() + 5 + rng.below(200), rng.next_u64());
    let steps = 40 + rng.below(120) as usize;
    workload(&log, &mut rng, steps).await;
    if rng.chance(1, 4) {
        let _ = log.close().await;
    }
    let image = disk.crash(rng.next_u64());
    drop(log);

    let tmp = tempfile::tempdir().unwrap();
    image.export(tmp.path()).unwrap();
    if std::env::var("KEEP").is_ok() {
        image.export(Path::new("/tmp/keep")).unwrap();
    }
    let tail = load(tmp.path(), ScanMode::Tail).unwrap_or_else(|e| panic!("{ctx}: tail load: {e}"));
    let full = load(tmp.path(), ScanMode::Verify).unwrap_or_else(|e| panic!("{ctx}: verify: {e}"));
    let counts =
        |i: &ShardImage| i.ledgers.iter().map(|(id, l)| (*id, l.index.len() as u64)).collect::<BTreeMap<_, _>>();
    assert_eq!(counts(&tail), counts(&full), "{ctx}");
    assert_eq!(tail.meta, full.meta, "{ctx}");
    assert_eq!(tail.tail.position(), full.tail.position(), "{ctx}");
    for (id, l) in &tail.ledgers {
        assert_eq!(l.index, full.ledgers[id].index, "{ctx}: ledger {id}");
    }

    let (log, rec) = EntryLog::open_with(image, cfg()).await.unwrap();
    let recovered: BTreeMap<u64, u64> = log.ledgers().into_iter().filter(|(_, n)| *n > 0).collect();
    assert_eq!(counts(&tail), recovered, "{ctx}: ledgers");
    let meta: BTreeMap<Vec<u8>, Vec<u8>> = log.meta_prefix(b"").into_iter().map(|(k, v)| (k, v.to_vec())).collect();
    assert_eq!(tail.meta, meta, "{ctx}: metadata");
    let torn = match &tail.tail {
        Tail::Torn { bytes, .. } => *bytes,
        Tail::End { .. } | Tail::Clean { .. } => 0,
    };
    assert_eq!(torn, rec.truncated_bytes, "{ctx}: torn tail {:?} vs {rec:?}", tail.tail);
    assert_eq!(tail.clean, rec.clean, "{ctx}");
    for (id, l) in &tail.ledgers {
        for e in 0..l.index.len() as u64 {
            let (_, body) = tail.read_entry(*id, e).unwrap_or_else(|err| panic!("{ctx}: inspect read {id}:{e}: {err}"));
            assert_eq!(&log.read(*id, e).await.unwrap()[..], &body[..], "{ctx}: {id}:{e}");
        }
    }
}

#[test]
fn inspector_sees_what_recovery_restores() {
    let seeds: Vec<u64> = match common::seed_from_env() {
        Some(s) => vec![s],
        None => {
            let n: u64 = std::env::var("MAGNETAR_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(60);
            let base = common::fresh_seed();
            println!("inspector_sees_what_recovery_restores: {n} seeds from base {base}");
            (0..n).map(|i| base.wrapping_add(i.wrapping_mul(0x9E37_79B9))).collect()
        }
    };
    run(300, move || async move {
        for seed in seeds {
            one_seed(seed).await;
        }
    });
}

/// A closed log with several segments, a checkpoint in the middle and
/// batches after it; returns the disk (closed cleanly).
async fn sample() -> SimDisk {
    let disk = SimDisk::new();
    let (log, _) = EntryLog::open_with(disk.clone(), small_config("/shard-0")).await.unwrap();
    for round in 0..12u64 {
        let mut last = 0;
        for i in 0..8u64 {
            last = log.append(round % 2, Bytes::from(vec![(round * 8 + i) as u8 | 1; 900])).unwrap().lsn;
        }
        log.put_meta(b"m", Bytes::from(format!("r{round}"))).unwrap();
        log.wait_durable(last + 1).await.unwrap();
        if round == 6 {
            log.checkpoint().await.unwrap();
        }
    }
    log.close().await.unwrap();
    disk
}

#[track_caller]
fn expect_corrupt(r: Result<ShardImage, StorageError>, file_ends: &str, offset: u64) -> CorruptReason {
    match r {
        Err(StorageError::Corrupt { file, offset: o, reason }) => {
            assert!(file.to_string_lossy().ends_with(file_ends), "{} vs {file_ends}", file.display());
            assert_eq!(o, offset, "{reason}");
            reason
        }
        Err(e) => panic!("expected Corrupt in {file_ends}, got {e}"),
        Ok(i) => panic!("expected Corrupt in {file_ends}, got Ok ({:?})", i.tail),
    }
}

#[test]
fn verify_names_file_and_offset_of_damage() {
    run(60, || async {
        let disk = sample().await;
        let good = tempfile::tempdir().unwrap();
        disk.export(good.path()).unwrap();
        let img = load(good.path(), ScanMode::Verify).unwrap();
        assert!(img.clean);
        assert!(matches!(img.tail, Tail::End { .. }), "{:?}", img.tail);
        assert!(img.segments.len() >= 2, "{:?}", img.segments);
        assert_eq!(img.ledgers[&0].index.len(), 48);
        assert_eq!(img.ledgers[&1].index.len(), 48);
        assert!(img.checked.index_entries > 0 && img.checked.index_pages > 0, "{:?}", img.checked);
        assert_eq!(img.meta.get(&b"m"[..]).map(|v| &v[..]), Some(&b"r11"[..]));
        let quick = load(good.path(), ScanMode::Tail).unwrap();
        assert!(matches!(quick.tail, Tail::Clean { .. }));
        assert_eq!(quick.ledgers, img.ledgers);
        let (_, body) = img.read_entry(1, 47).unwrap();
        assert_eq!(body, vec![(11 * 8 + 7) as u8 | 1; 900]);

        let seg0 = shard_dir().join("log/00000000000000000000.seg");
        // A record body in the first batch (before the checkpoint): only a
        // full verify reads it, and it names the batch.
        let d = disk.fork();
        d.damage(&seg0, 64 + 48 + 10, &[0xEE]);
        let t = tempfile::tempdir().unwrap();
        d.export(t.path()).unwrap();
        let r = expect_corrupt(load(t.path(), ScanMode::Verify), "00000000000000000000.seg", 0);
        assert!(matches!(r, CorruptReason::DamageBeforeValidBatch { .. }), "{r}");
        load(t.path(), ScanMode::Tail).unwrap();
        // Reading the damaged entry from the image is refused, with the offset.
        let img = load(t.path(), ScanMode::Tail).unwrap();
        match img.read_entry(0, 0) {
            Err(StorageError::Corrupt { offset, .. }) => assert_eq!(offset, 64),
            other => panic!("{other:?}"),
        }

        // An index page: both modes load it, both name it.
        let d = disk.fork();
        let idx = shard_dir().join(format!("index/{:020}.idx", 1));
        d.damage(&idx, 100, &[0x01]);
        let t = tempfile::tempdir().unwrap();
        d.export(t.path()).unwrap();
        expect_corrupt(load(t.path(), ScanMode::Tail), &format!("{:020}.idx", 1), 0);
        expect_corrupt(load(t.path(), ScanMode::Verify), &format!("{:020}.idx", 1), 0);

        // The checkpoint.
        let d = disk.fork();
        d.damage(&shard_dir().join("checkpoint"), 70, &[0x01]);
        let t = tempfile::tempdir().unwrap();
        d.export(t.path()).unwrap();
        expect_corrupt(load(t.path(), ScanMode::Tail), "checkpoint", 0);

        // The last batch, complete, rotted: not a torn write.
        let d = disk.fork();
        let last = img.ledgers[&1].index[47].position;
        let seg = img.segment_at(last).unwrap();
        let path = shard_dir().join("log").join(seg.path.file_name().unwrap());
        d.damage(&path, last - seg.start + 60, &[0x55]);
        let t = tempfile::tempdir().unwrap();
        d.export(t.path()).unwrap();
        let file = seg.path.file_name().unwrap().to_string_lossy().into_owned();
        let (batch_off, reason) = match load(t.path(), ScanMode::Verify) {
            Err(StorageError::Corrupt { file: f, offset, reason }) => {
                assert!(f.to_string_lossy().ends_with(&file), "{}", f.display());
                (offset, reason)
            }
            other => panic!("expected Corrupt, got {other:?}"),
        };
        assert!(matches!(reason, CorruptReason::DamagedNotTorn { .. }), "{reason}");
        assert!(batch_off % 4096 == 0 && batch_off <= last - seg.start, "{batch_off}");
        // The broker's checkpoint already covers that batch, so recovery does
        // not rescan it; a read of the entry is refused, naming the record.
        let (log, _) = EntryLog::open_with(d, small_config("/shard-0")).await.unwrap();
        match log.read(1, 47).await {
            Err(StorageError::Corrupt { offset, .. }) => assert_eq!(offset, last - seg.start),
            other => panic!("read of a rotted entry: {other:?}"),
        }
    });
}
