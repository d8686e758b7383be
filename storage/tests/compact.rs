//! Segment compaction.
//!
//! Goal: a segment kept alive by a few live entries of a slow ledger goes
//! once compacted, a segment still mostly live stays, every live entry reads
//! back byte for byte (also while it is being moved, and after a crash or a
//! clean restart), disk usage returns under a bound, and the offline
//! inspector agrees with recovery on the compacted image.
//!
//! Method: on a `SimDisk` with 64 KiB segments, a dense ledger fills the
//! first segments, then a fast ledger's entries are interleaved with a slow
//! ledger's few; the fast ledger is deleted (retention) and a compaction pass
//! runs while a reader task keeps reading the slow ledger.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::cell::Cell;
use std::rc::Rc;

use common::{check_entries, entry_body, run, small_config};
use magnetar_storage::inspect::{ScanMode, ShardImage};
use magnetar_storage::sim::SimDisk;
use magnetar_storage::{EntryLog, LogConfig};

const DENSE: u64 = 1;
const FAST: u64 = 2;
const SLOW: u64 = 3;

fn cfg() -> LogConfig {
    let mut c = small_config("/shard-0");
    c.compaction_live_pct = 25;
    // Every read goes to disk, so reads during a move hit the old or the
    // new record, never a cache.
    c.read_cache_bytes = 0;
    c
}

#[test]
fn sparse_segments_go_dense_ones_stay() {
    run(60, || async {
        let disk = SimDisk::new();
        let (log, _) = EntryLog::open_with(disk.clone(), cfg()).await.unwrap();
        // Dense: 100 × 1,000 B ≈ 1.6 segments, all of it stays live.
        let (mut last, dense_n, slow_len, fast_len) = (0, 100u64, 300usize, 2000usize);
        for e in 0..dense_n {
            last = log.append(DENSE, entry_body(DENSE, e, 1000)).unwrap().lsn;
        }
        // Fast and slow interleaved: one slow entry per ten fast ones.
        let mut slow_n = 0;
        for e in 0..600u64 {
            last = log.append(FAST, entry_body(FAST, e, fast_len)).unwrap().lsn;
            if e % 10 == 0 {
                last = log.append(SLOW, entry_body(SLOW, slow_n, slow_len)).unwrap().lsn;
                slow_n += 1;
            }
        }
        log.wait_durable(last).await.unwrap();
        log.checkpoint().await.unwrap();
        let mut dense_positions: Vec<u64> = Vec::new();
        for e in 0..dense_n {
            dense_positions.push(log.index_entry(DENSE, e).await.unwrap().unwrap().position);
        }
        let before = log.segments().await;
        // Retention deletes the fast ledger: no segment is empty (the slow
        // ledger's entries are everywhere), so garbage collection frees nothing.
        let lsn = log.delete_ledger(FAST).unwrap();
        log.wait_durable(lsn).await.unwrap();
        log.checkpoint().await.unwrap();
        let after_delete = log.segments().await;
        assert!(after_delete.len() + 1 >= before.len(), "{before:?} -> {after_delete:?}");
        assert!(after_delete.len() > 15, "workload too small: {after_delete:?}");

        // A reader keeps reading the slow ledger while its entries move.
        let stop = Rc::new(Cell::new(false));
        let reads = Rc::new(Cell::new(0u64));
        let reader = {
            let (log, stop, reads) = (log.clone(), stop.clone(), reads.clone());
            glommio::spawn_local(async move {
                let mut e = 0;
                while !stop.get() {
                    let got = log.read(SLOW, e).await.unwrap();
                    assert_eq!(got, entry_body(SLOW, e, slow_len), "read of {SLOW}:{e} during compaction");
                    reads.set(reads.get() + 1);
                    e = (e + 7) % slow_n;
                    futures_lite::future::yield_now().await;
                }
            })
        };
        let stats = log.compact().await.unwrap();
        stop.set(true);
        reader.await;
        assert!(reads.get() > 0);
        println!("compaction: {stats:?}, {} reads during it", reads.get());

        let segs = log.segments().await;
        // Nothing still needed went: every entry reads back, the dense
        // ledger's segments stay and its entries did not move.
        check_entries(&log, SLOW, slow_n, slow_len, "after compaction").await;
        check_entries(&log, DENSE, dense_n, 1000, "after compaction").await;
        let mut now: Vec<u64> = Vec::new();
        for e in 0..dense_n {
            now.push(log.index_entry(DENSE, e).await.unwrap().unwrap().position);
        }
        assert_eq!(now, dense_positions, "dense entries must not move");
        assert!(segs.iter().any(|s| s.0 == 0), "the dense first segment stays: {segs:?}");
        // The right segments went: every sparse one wholly before the
        // checkpoint. Disk use is now the live bytes plus at most the
        // partly live segments and the tail.
        assert!(stats.segments_removed >= (after_delete.len() - 5) as u64, "{stats:?} {after_delete:?}");
        let live = dense_n * 1048 + slow_n * (slow_len as u64 + 48);
        let bound = live / (64 << 10) + 5;
        assert!((segs.len() as u64) <= bound, "{} segments > bound {bound}: {segs:?}", segs.len());

        // A crash now (nothing unsynced), then a clean restart: same data.
        let image = disk.fork();
        let (log2, rec) = EntryLog::open_with(image.clone(), cfg()).await.unwrap();
        assert!(!rec.clean);
        check_entries(&log2, SLOW, slow_n, slow_len, "after crash").await;
        check_entries(&log2, DENSE, dense_n, 1000, "after crash").await;
        // The same segments, plus freed ones kept for recycling (their
        // names are back, holding nothing live, until the next checkpoint).
        let segs2 = log2.segments().await;
        assert!(segs.iter().all(|s| segs2.contains(s)), "{segs:?} -> {segs2:?}");
        assert!(segs2.len() <= segs.len() + cfg().recycle_segments, "{segs:?} -> {segs2:?}");
        assert!(segs2.iter().all(|s| segs.contains(s) || s.1 == 0), "{segs:?} -> {segs2:?}");
        log2.close().await.unwrap();
        drop(log2);
        let (log3, rec) = EntryLog::open_with(image.clone(), cfg()).await.unwrap();
        assert!(rec.clean);
        check_entries(&log3, SLOW, slow_n, slow_len, "after clean restart").await;
        // A second pass may compact the segment the copies went to (sparse
        // too, now that it is behind the checkpoint), never growing the log.
        let again = log3.compact().await.unwrap();
        println!("second pass: {again:?}");
        assert!(log3.segments().await.len() <= segs.len(), "{again:?}");
        check_entries(&log3, SLOW, slow_n, slow_len, "after a second pass").await;
        log3.close().await.unwrap();
        drop(log3);

        // The inspector verifies every checksum of the compacted image and
        // sees the same ledgers as recovery.
        let tmp = tempfile::tempdir().unwrap();
        image.export(tmp.path()).unwrap();
        for mode in [ScanMode::Verify, ScanMode::Tail] {
            let img = ShardImage::load(&tmp.path().join("shard-0"), mode, &mut |_, _| {}).unwrap();
            assert_eq!(img.ledgers.get(&SLOW).map(|l| l.index.len() as u64), Some(slow_n), "{mode:?}");
            assert_eq!(img.ledgers.get(&DENSE).map(|l| l.index.len() as u64), Some(dense_n), "{mode:?}");
            assert!(!img.ledgers.contains_key(&FAST), "{mode:?}");
            for e in 0..slow_n {
                let (_, b) = img.read_entry(SLOW, e).unwrap();
                assert_eq!(b, entry_body(SLOW, e, slow_len));
            }
        }
    });
}

#[test]
fn crash_between_copy_and_checkpoint_keeps_everything() {
    // Goal: copies durable but no checkpoint yet (the pass's checkpoint is
    // cut off): the old segments are still there and recovery replays the
    // moves; nothing is lost, nothing read twice. Method: crash the disk at
    // every operation of a compaction pass.
    run(120, || async {
        let build = || async {
            let disk = SimDisk::new();
            let (log, _) = EntryLog::open_with(disk.clone(), cfg()).await.unwrap();
            let mut last = 0;
            let mut slow_n = 0;
            for e in 0..300u64 {
                last = log.append(FAST, entry_body(FAST, e, 2000)).unwrap().lsn;
                if e % 10 == 0 {
                    last = log.append(SLOW, entry_body(SLOW, slow_n, 300)).unwrap().lsn;
                    slow_n += 1;
                }
            }
            log.wait_durable(last).await.unwrap();
            log.checkpoint().await.unwrap();
            let lsn = log.delete_ledger(FAST).unwrap();
            log.wait_durable(lsn).await.unwrap();
            log.checkpoint().await.unwrap();
            (disk, log, slow_n)
        };
        let (disk, log, _) = build().await;
        let base = disk.ops();
        let stats = log.compact().await.unwrap();
        assert!(stats.entries_moved > 0 && stats.segments_removed > 0, "{stats:?}");
        let pass_ops = disk.ops() - base;
        drop(log);
        for n in 0..=pass_ops {
            let ctx = format!("crash at op {n}/{pass_ops} of the pass");
            let (disk, log, slow_n) = build().await;
            disk.crash_at_op(disk.ops() + n, n);
            let _ = log.compact().await;
            let image = disk.crash(n);
            drop(log);
            let (log, _) = EntryLog::open_with(image, cfg()).await.unwrap_or_else(|e| panic!("{ctx}: {e}"));
            check_entries(&log, SLOW, slow_n, 300, &ctx).await;
            assert_eq!(log.next_entry(FAST), 0, "{ctx}");
            // And the next pass finishes the job.
            log.compact().await.unwrap();
            check_entries(&log, SLOW, slow_n, 300, &ctx).await;
        }
        println!("crashed at each of {} operations of a compaction pass", pass_ops + 1);
    });
}
