//! The ledger index in pages (issue #18): memory holds a bounded cache of
//! index pages, not every entry.
//!
//! Goal: a reader of a backlog whose index is many times larger than the
//! index cache gets every entry right while the cache never holds more
//! than its bound (the figure `index_cache_stats` exposes); seek by publish
//! time and lookups by entry id land right in the middle of it; all of this
//! after a clean restart and after a crash with a checkpoint behind the
//! tail.
//!
//! Method: a `SimDisk` log with one ledger of 12,000 entries (about 95
//! index pages written by several checkpoints) and an index cache of 8
//! pages; reads in runs and one by one, seeks at random times (seed
//! printed; `MAGNETAR_SEED` replays), checked against the model.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use bytes::Bytes;
use common::{fresh_seed, run, seed_from_env, small_config};
use magnetar_storage::sim::{SimDisk, SimRng};
use magnetar_storage::{EntryLog, IndexExtras, LogConfig, NewEntry};

const LEDGER: u64 = 5;
const N: u64 = 12_000;
const BASE_MS: u64 = 1_000_000;

fn body(e: u64) -> Bytes {
    Bytes::from(format!("entry-{e:08}"))
}

/// Entry `e` is published at `BASE_MS + e / 2` (two per millisecond).
fn time_of(e: u64) -> u64 {
    BASE_MS + e / 2
}

fn config() -> LogConfig {
    let mut cfg = small_config("/s");
    cfg.segment_bytes = 1 << 20;
    // Eight pages of 127 entries: ~1,000 of the 12,000 entries' index.
    cfg.index_cache_bytes = 8 * (127 * 32 + 96);
    cfg.read_cache_bytes = 0;
    cfg
}

async fn fill(disk: &SimDisk) {
    let (log, _) = EntryLog::open_with(disk.clone(), config()).await.unwrap();
    let mut last = 0;
    for e in 0..N {
        let extras = IndexExtras { publish_time_ms: time_of(e), ..IndexExtras::default() };
        last = log.append(LEDGER, NewEntry::new(body(e)).extras(extras)).unwrap().lsn;
        // Several checkpoints, so the index file has partly filled pages too.
        if e % 2_500 == 2_499 {
            log.wait_durable(last).await.unwrap();
            log.checkpoint().await.unwrap();
        }
    }
    log.wait_durable(last).await.unwrap();
    log.checkpoint().await.unwrap();
    log.close().await.unwrap();
}

fn assert_bounded(log: &EntryLog<SimDisk>, context: &str) {
    let c = log.index_cache_stats();
    assert!(c.bytes <= c.max_bytes, "{context}: index cache holds {} bytes, bound {}", c.bytes, c.max_bytes);
}

async fn check(log: &EntryLog<SimDisk>, rng: &mut SimRng, context: &str) {
    // A catch-up reader from the start, in runs.
    let mut e = 0;
    while e < N {
        let run = log.read_run(LEDGER, e, 500, 64 << 10).await.unwrap();
        assert!(!run.is_empty(), "{context}: empty run at {e}");
        for (i, b) in run.iter().enumerate() {
            assert_eq!(b, &body(e + i as u64), "{context}: entry {}", e + i as u64);
        }
        e += run.len() as u64;
        assert_bounded(log, context);
    }
    // Seeks by time and lookups anywhere.
    for _ in 0..200 {
        let target = BASE_MS + rng.below(N / 2 + 10);
        let found = log.seek_time(LEDGER, target).await.unwrap();
        let want = ((target - BASE_MS) * 2).min(N);
        assert_eq!(found, want, "{context}: seek to {target}");
        if found < N {
            let ie = log.index_entry(LEDGER, found).await.unwrap().unwrap();
            assert_eq!(ie.extras.publish_time_ms, time_of(found), "{context}: entry {found}");
            assert_eq!(log.read(LEDGER, found).await.unwrap(), body(found), "{context}: read {found}");
        }
        assert_bounded(log, context);
    }
    let c = log.index_cache_stats();
    assert!(c.loads > 0 && c.pages <= 8, "{context}: {c:?}");
    // The ledger's bytes, without reading its index.
    let bytes: u64 = (0..N).map(|e| body(e).len() as u64).sum();
    assert_eq!(log.ledger_bytes(LEDGER), bytes, "{context}");
}

#[test]
fn a_backlog_larger_than_the_index_cache_reads_and_seeks_within_its_bound() {
    let seed = seed_from_env().unwrap_or_else(fresh_seed);
    eprintln!("seed {seed} (MAGNETAR_SEED={seed} replays)");
    run(120, move || async move {
        let mut rng = SimRng::new(seed);
        let disk = SimDisk::new();
        fill(&disk).await;

        // Clean restart: every entry is in the index file.
        let (log, rec) = EntryLog::open_with(disk.clone(), config()).await.unwrap();
        assert!(rec.clean);
        check(&log, &mut rng, "after a clean restart").await;

        // Another ledger written after the restart (its index in memory,
        // then in its own file) leaves the first one's pages alone.
        let mut last = 0;
        for e in 0..300u64 {
            last = log.append(LEDGER + 1, body(e)).unwrap().lsn;
        }
        log.wait_durable(last).await.unwrap();
        log.checkpoint().await.unwrap();
        check(&log, &mut rng, "with a second ledger").await;

        // A crash with entries after the checkpoint: the scan replays them
        // into memory, the pages stay on disk.
        let mut last = 0;
        for e in 300..400u64 {
            last = log.append(LEDGER + 1, body(e)).unwrap().lsn;
        }
        log.wait_durable(last).await.unwrap();
        let crashed = disk.crash(seed);
        drop(log);
        let (log, rec) = EntryLog::open_with(crashed, config()).await.unwrap();
        assert!(!rec.clean);
        check(&log, &mut rng, "after a crash").await;
        for e in 0..400u64 {
            assert_eq!(log.read(LEDGER + 1, e).await.unwrap(), body(e), "after a crash: ledger 2 entry {e}");
        }
        log.close().await.unwrap();
    });
}

/// Without a checkpoint timer, the index laid out since the last checkpoint
/// still stays near `recent_index_bytes`: reaching it starts a checkpoint.
#[test]
fn the_index_laid_out_since_the_last_checkpoint_stays_near_its_bound() {
    run(60, || async {
        const BOUND_ENTRIES: u64 = 1_000;
        let disk = SimDisk::new();
        let mut cfg = config();
        cfg.checkpoint_interval = std::time::Duration::from_secs(3_600);
        cfg.recent_index_bytes = BOUND_ENTRIES as usize * std::mem::size_of::<magnetar_storage::IndexEntry>();
        let (log, _) = EntryLog::open_with(disk.clone(), cfg).await.unwrap();
        let mut peak = 0;
        for round in 0..20u64 {
            let mut last = 0;
            for e in 0..500 {
                last = log.append(LEDGER, body(round * 500 + e)).unwrap().lsn;
            }
            log.wait_durable(last).await.unwrap();
            // Room for the checkpointer to run.
            glommio::timer::sleep(std::time::Duration::from_millis(20)).await;
            peak = peak.max(log.index_cache_stats().recent_entries);
        }
        // 10,000 entries laid out: without the bound all would be in memory.
        // With it, at most the bound plus what came while a checkpoint ran
        // (here, one round of 500).
        assert!(peak <= BOUND_ENTRIES + 500, "{peak} index entries in memory, bound {BOUND_ENTRIES}");
        assert!(peak > 0);
        for e in 0..10_000u64 {
            assert_eq!(log.read(LEDGER, e).await.unwrap(), body(e), "entry {e}");
        }
        log.close().await.unwrap();
    });
}
