//! Fault cases found by reading the code (issue #17): each is staged on a
//! `SimDisk` exactly as the review described it.
//!
//! - A damaged index file of a ledger whose entries compaction moved twice,
//!   the second move not yet in a checkpoint: the index rebuilt at open must
//!   point at the second copy only, so that garbage collection removing the
//!   first copy's segment loses nothing (fix 6c896da, "a rebuilt index keeps
//!   no relocations").
//! - A checkpoint whose copy (`checkpoint.copy`) found no space, on a log
//!   that then stays idle: the next checkpoint rewrites the copy and
//!   collects the garbage the failed one left (fix 6c896da, `copy_stale`).
//! - A key index file that finds no space: the log goes on, the items stay
//!   in memory and are written at a later pass once space is back; every
//!   key is found and every acknowledged entry read back, before and after
//!   a restart.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use common::{check_entries, entry_body, run, small_config};
use magnetar_storage::format::Checkpoint;
use magnetar_storage::sim::{FaultError, FaultKind, SimDisk};
use magnetar_storage::{key_hash, EntryLog, IndexExtras, KeyHit, LogConfig, NewEntry, StorageError};

const DENSE: u64 = 1;
const FAST: u64 = 2;
const SLOW: u64 = 3;
const FAST2: u64 = 4;
const SEGMENT: u64 = 64 << 10;

fn cfg() -> LogConfig {
    let mut c = small_config("/shard-0");
    c.compaction_live_pct = 25;
    // Every read goes to disk (a cached body would hide a lost segment).
    c.read_cache_bytes = 0;
    // No background zeroing: operation counts and fault ordinals are the
    // same from run to run.
    c.zero_ahead_bytes = 0;
    c
}

async fn positions(log: &EntryLog<SimDisk>, ledger: u64, n: u64) -> Vec<u64> {
    let mut v = Vec::new();
    for e in 0..n {
        v.push(log.index_entry(ledger, e).await.unwrap().unwrap().position);
    }
    v
}

fn shard() -> PathBuf {
    PathBuf::from("/shard-0")
}

fn checkpoint_of(disk: &SimDisk, name: &str) -> Checkpoint {
    Checkpoint::decode(&disk.contents(&shard().join(name)).unwrap()).unwrap()
}

const DENSE_N: u64 = 60;
const DENSE_LEN: usize = 1000;
const SLOW_LEN: usize = 300;

/// A cleanly closed log whose slow ledger was moved once by compaction (the
/// moves recorded as relocations in the checkpoint) and whose copies now sit
/// in a sparse segment wholly before the checkpoint, so that the next pass
/// moves them again. Returns the disk, the slow ledger's entry count and the
/// positions of the first copies.
async fn moved_once() -> (SimDisk, u64, Vec<u64>) {
    let disk = SimDisk::new();
    let (log, _) = EntryLog::open_with(disk.clone(), cfg()).await.unwrap();
    let mut last = 0;
    for e in 0..DENSE_N {
        last = log.append(DENSE, entry_body(DENSE, e, DENSE_LEN)).unwrap().lsn;
    }
    let mut slow_n = 0;
    for e in 0..300u64 {
        last = log.append(FAST, entry_body(FAST, e, 2000)).unwrap().lsn;
        if e % 10 == 0 {
            last = log.append(SLOW, entry_body(SLOW, slow_n, SLOW_LEN)).unwrap().lsn;
            slow_n += 1;
        }
    }
    log.wait_durable(last).await.unwrap();
    log.checkpoint().await.unwrap();
    let original = positions(&log, SLOW, slow_n).await;
    let lsn = log.delete_ledger(FAST).unwrap();
    log.wait_durable(lsn).await.unwrap();
    log.checkpoint().await.unwrap();
    let first = log.compact().await.unwrap();
    // (A slow entry in the last segment, not wholly behind the checkpoint,
    // stays.)
    assert!(first.entries_moved + 3 >= slow_n, "the first pass moves the slow entries: {first:?}");
    let p1 = positions(&log, SLOW, slow_n).await;
    let moved = p1.iter().zip(&original).filter(|(a, b)| a != b).count() as u64;
    assert_eq!(moved, first.entries_moved, "{original:?} -> {p1:?}");
    assert_eq!(checkpoint_of(&disk, "checkpoint").relocations.len() as u64, moved, "the first moves are relocations");
    // Push the tail past the copies' segment, then free what pushed it: the
    // copies' segment is now sparse and behind the checkpoint.
    for e in 0..120u64 {
        last = log.append(FAST2, entry_body(FAST2, e, 2000)).unwrap().lsn;
    }
    log.wait_durable(last).await.unwrap();
    log.checkpoint().await.unwrap();
    let lsn = log.delete_ledger(FAST2).unwrap();
    log.wait_durable(lsn).await.unwrap();
    log.checkpoint().await.unwrap();
    log.close().await.unwrap();
    drop(log);
    (disk.fork(), slow_n, p1)
}

fn segment_holding(segs: &[(u64, u64)], position: u64) -> Option<u64> {
    segs.iter().map(|s| s.0).find(|s| *s <= position && position < s + SEGMENT)
}

/// Goal: entries moved by compaction twice, the second move durable in the
/// log but not in a checkpoint, then the ledger's index file damaged: the
/// index rebuilt at open points at the second copies, garbage collection
/// removes the first copies' segment, and every entry reads back byte for
/// byte, after more checkpoints, another compaction pass and restarts.
///
/// Method: crash the disk at every operation of the second compaction pass
/// (so one image has the copies durable and the pass's checkpoint not), flip
/// bytes in the slow ledger's index file, open. Before fix 6c896da the
/// rebuilt index kept the checkpoint's relocations (first copies) beside the
/// replayed second move; lookups took the relocation, and the checkpoint
/// written at open removed its segment: reads failed.
#[test]
fn damaged_index_after_two_moves_of_one_entry() {
    run(300, || async {
        let (base, slow_n, p1) = moved_once().await;
        // The second pass on an undisturbed copy: how many operations it
        // takes, and where the second copies land.
        let (ops, p2) = {
            let d = base.fork();
            let (log, rec) = EntryLog::open_with(d.clone(), cfg()).await.unwrap();
            assert!(rec.clean);
            let start = d.ops();
            let second = log.compact().await.unwrap();
            let p2 = positions(&log, SLOW, slow_n).await;
            assert!(
                p2.iter().zip(&p1).all(|(a, b)| a > b),
                "the second pass moves every slow entry: {p1:?} -> {p2:?} {second:?}"
            );
            (d.ops() - start, p2)
        };
        let idx = shard().join(format!("index/{SLOW:020}.idx"));
        let mut hazards = 0;
        for n in 0..=ops {
            let ctx = format!("crash at op {n}/{ops} of the second pass");
            let d = base.fork();
            let (log, _) = EntryLog::open_with(d.clone(), cfg()).await.unwrap();
            d.crash_at_op(d.ops() + n, n);
            let _ = log.compact().await;
            let image = d.crash(n);
            drop(log);
            // Which moves the durable checkpoint knows of.
            let ckpt = checkpoint_of(&image, "checkpoint");
            let relocated_to_p1 = ckpt.relocations.iter().any(|r| r.ledger == SLOW && p1.contains(&r.position));
            // Bit rot in the ledger's index file: page 0 no longer decodes.
            image.damage(&idx, 40, b"bit rot!");
            let (log, rec) = EntryLog::open_with(image.clone(), cfg()).await.unwrap_or_else(|e| panic!("{ctx}: {e}"));
            assert!(
                rec.rebuilt.iter().any(|l| l.contains(&format!("rebuilt the index of ledger {SLOW}"))),
                "{ctx}: {rec:?}"
            );
            let now = positions(&log, SLOW, slow_n).await;
            assert!(now.iter().enumerate().all(|(e, p)| *p == p1[e] || *p == p2[e]), "{ctx}: {now:?}");
            if relocated_to_p1 && now == p2 {
                // The case of the review: the second moves replayed from the
                // log, the checkpoint naming the first copies as
                // relocations. The checkpoint written at open collected the
                // first copies' segment (nothing live there now).
                hazards += 1;
                let first_copies = p1.iter().copied().max().unwrap();
                assert_eq!(
                    segment_holding(&log.segments().await, first_copies),
                    None,
                    "{ctx}: {:?}",
                    log.segments().await
                );
            }
            check_entries(&log, SLOW, slow_n, SLOW_LEN, &ctx).await;
            check_entries(&log, DENSE, DENSE_N, DENSE_LEN, &ctx).await;
            // More data, a checkpoint (and its garbage collection), another
            // compaction pass: still all there.
            let a = log.append(DENSE, entry_body(DENSE, DENSE_N, DENSE_LEN)).unwrap();
            log.wait_durable(a.lsn).await.unwrap();
            log.checkpoint().await.unwrap();
            check_entries(&log, SLOW, slow_n, SLOW_LEN, &format!("{ctx}, checkpointed")).await;
            log.compact().await.unwrap();
            check_entries(&log, SLOW, slow_n, SLOW_LEN, &format!("{ctx}, compacted")).await;
            // A crash (nothing unsynced), then a clean restart.
            let again = image.fork();
            log.close().await.unwrap();
            drop(log);
            for (what, disk) in [("after a crash", again), ("after a clean restart", image)] {
                let (log, rec) =
                    EntryLog::open_with(disk, cfg()).await.unwrap_or_else(|e| panic!("{ctx}, {what}: {e}"));
                assert!(rec.rebuilt.is_empty(), "{ctx}, {what}: {rec:?}");
                check_entries(&log, SLOW, slow_n, SLOW_LEN, &format!("{ctx}, {what}")).await;
                check_entries(&log, DENSE, DENSE_N + 1, DENSE_LEN, &format!("{ctx}, {what}")).await;
                drop(log);
            }
        }
        println!(
            "crashed at each of {} operations of the second pass; {hazards} left the second move in the log only",
            ops + 1
        );
        assert!(hazards > 0, "no crash point left the second move durable and out of the checkpoint");
    });
}

/// Goal: a checkpoint whose own file was written but whose copy found no
/// space, on a log that then stays idle (nothing appended, so the tail does
/// not move): the next checkpoint writes the copy again and collects the
/// garbage the failed one left, and the copy serves when the checkpoint is
/// damaged.
///
/// Method: on a disk with nothing else writing, the write after the
/// checkpoint's own is the copy's; it fails with ENOSPC. Before fix 6c896da
/// the next checkpoint saw nothing new since the last one and did nothing:
/// the copy stayed stale and the dead segments stayed, for as long as the
/// log stayed idle.
#[test]
fn a_checkpoint_copy_short_of_space_is_rewritten_on_an_idle_log() {
    run(60, || async {
        let mut c = cfg();
        // Dead segments are unlinked, not kept for reuse.
        c.recycle_segments = 0;
        let disk = SimDisk::new();
        let (log, _) = EntryLog::open_with(disk.clone(), c.clone()).await.unwrap();
        // The fast ledger alone fills the first three segments.
        let mut last = 0;
        for e in 0..200u64 {
            last = log.append(FAST, entry_body(FAST, e, 1000)).unwrap().lsn;
        }
        for e in 0..20u64 {
            last = log.append(SLOW, entry_body(SLOW, e, 500)).unwrap().lsn;
        }
        log.wait_durable(last).await.unwrap();
        log.checkpoint().await.unwrap();
        let lsn = log.delete_ledger(FAST).unwrap();
        log.wait_durable(lsn).await.unwrap();
        let before = checkpoint_of(&disk, "checkpoint");
        assert_eq!(checkpoint_of(&disk, "checkpoint.copy"), before);
        let seg0 = Path::new("/shard-0/log/00000000000000000000.seg");
        assert!(log.segments().await.len() > 3 && log.segments().await[0].0 == 0, "{:?}", log.segments().await);

        // The checkpoint's own file is written (one write: no index page is
        // due), then its copy's: that one finds no space.
        let w = disk.count(FaultKind::Write);
        disk.fail_nth_with(FaultKind::Write, w + 1, FaultError::NoSpace);
        let err = log.checkpoint().await.unwrap_err();
        assert_eq!(disk.faults_fired(), 1, "{err}");
        assert!(!log.is_failed(), "a checkpoint short of space is no fail-stop: {err}");
        let written = checkpoint_of(&disk, "checkpoint");
        assert_eq!(written.ckpt_seq, before.ckpt_seq + 1, "the checkpoint itself was written ({err})");
        assert_eq!(checkpoint_of(&disk, "checkpoint.copy"), before, "the copy is stale ({err})");
        assert!(log.segments().await.iter().any(|s| s.0 == 0), "no garbage collected: {:?}", log.segments().await);

        // Space is back, nothing was appended: the next checkpoint rewrites
        // the copy and the garbage goes.
        log.checkpoint().await.unwrap();
        let now = checkpoint_of(&disk, "checkpoint");
        assert_eq!(checkpoint_of(&disk, "checkpoint.copy"), now, "the copy is written again");
        assert!(now.ckpt_seq > written.ckpt_seq);
        assert!(
            log.segments().await.iter().all(|s| s.0 >= 3 * SEGMENT),
            "dead segments stay: {:?}",
            log.segments().await
        );
        assert!(
            disk.contents(seg0).is_none(),
            "the first segment's file stays: {:?}",
            disk.names(&shard().join("log"))
        );
        check_entries(&log, SLOW, 20, 500, "after the checkpoint").await;
        assert_eq!(log.next_entry(FAST), 0);

        // The copy serves a damaged checkpoint (a crash image: the log is
        // left as it is).
        let image = disk.fork();
        image.damage(&shard().join("checkpoint"), 0, b"bit rot!");
        drop(log);
        let (log, rec) = EntryLog::open_with(image, c).await.unwrap();
        assert!(rec.rebuilt.iter().any(|l| l.contains("checkpoint.copy")), "{rec:?}");
        check_entries(&log, SLOW, 20, 500, "opened from the copy").await;
        assert_eq!(log.next_entry(FAST), 0);
    });
}

fn key_cfg() -> LogConfig {
    let mut c = cfg();
    // Many small key index files.
    c.key_index_items_per_file = 40;
    c
}

struct Keyed {
    ledger: u64,
    entry: u64,
    key: String,
    time: u64,
}

fn keyed_body(i: u64) -> Bytes {
    let mut v = format!("keyed {i}:").into_bytes();
    v.resize(60, (i % 251) as u8);
    Bytes::from(v)
}

/// Appends keyed entries `from..from + n` (ledgers 1 to 3, 12 keys) and
/// waits until they are durable: they are acknowledged.
async fn append_keyed(log: &EntryLog<SimDisk>, model: &mut Vec<Keyed>, from: u64, n: u64) {
    let mut last = 0;
    for i in from..from + n {
        let (ledger, key, time) = (1 + i % 3, format!("key-{}", i % 12), 1_000 + i);
        let extras = IndexExtras { publish_time_ms: time, key_hash: key_hash(key.as_bytes()), tag_hash: 0 };
        let a = log.append(ledger, NewEntry::new(keyed_body(i)).extras(extras)).unwrap();
        last = a.lsn;
        model.push(Keyed { ledger, entry: a.entry, key, time });
    }
    log.wait_durable(last).await.unwrap();
}

/// Every key finds every entry with it, newest first, and every entry reads
/// back byte for byte.
async fn check_keys(log: &EntryLog<SimDisk>, model: &[Keyed], ctx: &str) {
    for k in 0..12 {
        let key = format!("key-{k}");
        let got = log.find_key(key_hash(key.as_bytes()), &|_| true, None, 10_000).await.unwrap();
        let mut want: Vec<KeyHit> = model
            .iter()
            .filter(|m| m.key == key)
            .map(|m| KeyHit { publish_time_ms: m.time, ledger: m.ledger, entry: m.entry })
            .collect();
        want.sort_unstable_by(|a, b| b.cmp(a));
        assert_eq!(got, want, "{ctx}: {key}");
    }
    for (i, m) in model.iter().enumerate() {
        let got =
            log.read(m.ledger, m.entry).await.unwrap_or_else(|e| panic!("{ctx}: read {}:{}: {e}", m.ledger, m.entry));
        assert_eq!(got, keyed_body(i as u64), "{ctx}: {}:{}", m.ledger, m.entry);
    }
}

fn tmp_key_files(disk: &SimDisk) -> Vec<String> {
    disk.names(&shard().join("keys")).into_iter().filter(|n| n.ends_with(".tmp")).collect()
}

/// Goal: a key index file that finds no space loses nothing and stops
/// nothing: the log goes on acknowledging entries (into its preallocated
/// segment), lookups by key find every key from memory meanwhile, and once
/// space is back a later pass writes the files; every key is found and
/// every acknowledged entry read back, then and after a restart (clean, or
/// from a crash while the disk was full).
///
/// Method: `SimDisk::set_full` refuses every write that would grow a file.
/// Before this test the seal's write failure, ENOSPC included, put the log
/// in fail-stop (appends failed) although docs/reliability.md promised a
/// retry at the next pass.
#[test]
fn a_key_index_file_short_of_space_loses_nothing() {
    run(60, || async {
        let disk = SimDisk::new();
        let (log, _) = EntryLog::open_with(disk.clone(), key_cfg()).await.unwrap();
        let mut model = Vec::new();
        append_keyed(&log, &mut model, 0, 200).await;
        log.maintain_key_index(false).await.unwrap();
        assert_eq!(log.key_index_files().0.len(), 5, "{:?}", log.key_index_files());
        log.checkpoint().await.unwrap();

        disk.set_full(true);
        append_keyed(&log, &mut model, 200, 100).await;
        let err = log.maintain_key_index(false).await.unwrap_err();
        assert!(matches!(&err, StorageError::Io { .. } | StorageError::NoSpace { .. }), "{err:?}");
        assert!(!log.is_failed(), "a key index file short of space is no fail-stop: {err}");
        assert_eq!(log.key_index_files().0.len(), 5, "nothing sealed: {err}");
        check_keys(&log, &model, "disk full, items in memory").await;
        // The log goes on, and so do later passes (each tries again).
        append_keyed(&log, &mut model, 300, 20).await;
        assert!(log.maintain_key_index(false).await.is_err());
        assert!(log.checkpoint().await.is_err(), "no space for index pages either");
        assert!(!log.is_failed());
        check_keys(&log, &model, "disk full, second pass").await;
        // What a crash now would leave.
        let crashed = disk.fork();

        disk.set_full(false);
        log.maintain_key_index(false).await.unwrap();
        let (files, in_memory) = log.key_index_files();
        assert_eq!(files.len(), 320 / 40, "every full file written once space is back ({in_memory} in memory)");
        assert_eq!(tmp_key_files(&disk), Vec::<String>::new());
        check_keys(&log, &model, "space back").await;
        log.checkpoint().await.unwrap();
        append_keyed(&log, &mut model, 320, 10).await;
        check_keys(&log, &model, "space back, appending").await;
        log.close().await.unwrap();
        drop(log);

        let (log, rec) = EntryLog::open_with(disk.clone(), key_cfg()).await.unwrap();
        assert!(rec.clean);
        check_keys(&log, &model, "after a clean restart").await;
        drop(log);
        // The crash image: the files of before the disk filled, the rest
        // indexed again from the ledger indexes.
        let (log, rec) = EntryLog::open_with(crashed.clone(), key_cfg()).await.unwrap();
        assert!(!rec.clean);
        assert_eq!(tmp_key_files(&crashed), Vec::<String>::new());
        check_keys(&log, &model[..320], "after a crash while the disk was full").await;
    });
}
