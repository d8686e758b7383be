//! Basic behaviour on the simulated disk and on a real directory (glommio DMA).

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use bytes::Bytes;
use common::{read_bytes_file, read_bytes_pattern, run, small_config};
use magnetar_storage::format::RECORD_HEADER_BYTES;
use magnetar_storage::sim::{FaultError, FaultKind, SimDisk, SimRng};
use magnetar_storage::{EntryLog, IndexExtras, LogConfig, NewEntry, StorageError, LONE_RESUME_FAST, LONE_STREAK_MIN};
use std::time::Duration;

/// Goal: append, group commit, read from cache and disk, close, reopen clean
/// without a scan, and the ids continue densely.
#[test]
fn sim_append_read_close_reopen() {
    run(30, || async {
        let disk = SimDisk::new();
        let cfg = small_config("/s");
        let (log, rec) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
        assert!(!rec.clean);
        assert!(rec.ledgers.is_empty());
        let mut rng = SimRng::new(1);
        let mut bodies = Vec::new();
        let mut last = 0;
        for i in 0..300u64 {
            let b = common::body(&mut rng, i);
            let a = log.append(i % 3, b.clone()).unwrap();
            assert_eq!(a.entry, i / 3);
            last = a.lsn;
            bodies.push(b);
            if i % 50 == 0 {
                log.wait_durable(a.lsn).await.unwrap();
            }
        }
        log.put_meta(b"cursor/a", Bytes::from_static(b"1")).unwrap();
        log.put_meta(b"cursor/b", Bytes::from_static(b"2")).unwrap();
        let l = log.put_meta(b"cursor/a", Bytes::from_static(b"3")).unwrap();
        assert!(l > last);
        log.wait_durable(l).await.unwrap();
        for i in 0..300u64 {
            assert_eq!(log.read(i % 3, i / 3).await.unwrap(), bodies[i as usize]);
        }
        assert!(matches!(log.read(0, 100).await, Err(StorageError::NoSuchEntry { ledger: 0, entry: 100 })));
        log.close().await.unwrap();
        assert!(matches!(log.append(0, Bytes::new()), Err(StorageError::Closed)));
        let segments = disk.names(std::path::Path::new("/s/log"));
        assert!(segments.len() > 3, "segments rolled over: {segments:?}");

        let (log, rec) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
        assert!(rec.clean, "{rec:?}");
        assert_eq!(rec.scanned_bytes, 0);
        assert_eq!(rec.ledgers, vec![(0, 100), (1, 100), (2, 100)]);
        for i in 0..300u64 {
            assert_eq!(log.read(i % 3, i / 3).await.unwrap(), bodies[i as usize]);
        }
        assert_eq!(log.meta(b"cursor/a").unwrap(), Bytes::from_static(b"3"));
        assert_eq!(
            log.meta_prefix(b"cursor/"),
            vec![(b"cursor/a".to_vec(), Bytes::from_static(b"3")), (b"cursor/b".to_vec(), Bytes::from_static(b"2"))]
        );
        let a = log.append(1, Bytes::from_static(b"more")).unwrap();
        assert_eq!(a.entry, 100);
        log.put_meta(b"cursor/b", Bytes::new()).unwrap(); // delete
        log.wait_durable(log.put_meta(b"x", Bytes::from_static(b"y")).unwrap()).await.unwrap();
        assert_eq!(log.meta(b"cursor/b"), None);
        // Crash (nothing unsynced kept): scan from the clean checkpoint.
        let disk2 = disk.fork();
        drop(log);
        let (log, rec) = EntryLog::open_with(disk2, cfg).await.unwrap();
        assert!(!rec.clean);
        assert_eq!(rec.entries_replayed, 1);
        assert_eq!(log.read(1, 100).await.unwrap(), Bytes::from_static(b"more"));
        assert_eq!(log.meta(b"cursor/b"), None);
        assert_eq!(log.meta(b"x").unwrap(), Bytes::from_static(b"y"));
    });
}

/// Goal: limits are typed errors.
#[test]
fn too_large_is_rejected() {
    run(30, || async {
        let cfg = small_config("/s");
        let max = cfg.effective_entry_bytes_max();
        let (log, _) = EntryLog::open_with(SimDisk::new(), cfg).await.unwrap();
        let big = Bytes::from(vec![7u8; max as usize + 1]);
        assert!(matches!(log.append(1, big), Err(StorageError::TooLarge { .. })));
        let ok = Bytes::from(vec![7u8; max as usize]);
        let a = log.append(1, ok.clone()).unwrap();
        log.wait_durable(a.lsn).await.unwrap();
        assert_eq!(log.read(1, 0).await.unwrap(), ok);
    });
}

/// Goal: an injected write or fsync error puts the log in fail-stop: the
/// waiter of the failed batch and all later appends get errors, nothing is
/// acknowledged after it, and a restart recovers what was acknowledged.
#[test]
fn fail_stop_on_write_and_sync_errors() {
    for (kind, error) in [
        (FaultKind::Write, FaultError::Io),
        (FaultKind::Sync, FaultError::Io),
        (FaultKind::Write, FaultError::NoSpace),
        (FaultKind::Sync, FaultError::NoSpace),
    ] {
        run(30, move || async move {
            let disk = SimDisk::new();
            let (log, _) = EntryLog::open_with(disk.clone(), small_config("/s")).await.unwrap();
            let a = log.append(1, Bytes::from_static(b"acked")).unwrap();
            log.wait_durable(a.lsn).await.unwrap();
            disk.fail_nth_with(kind, disk.count(kind), error);
            let b = log.append(1, Bytes::from_static(b"lost")).unwrap();
            let c = log.append(2, Bytes::from_static(b"lost too")).unwrap();
            assert!(matches!(log.wait_durable(b.lsn).await, Err(StorageError::Failed)));
            assert!(matches!(log.wait_durable(c.lsn).await, Err(StorageError::Failed)));
            assert!(log.is_failed());
            assert!(matches!(log.append(1, Bytes::new()), Err(StorageError::Failed)));
            assert!(matches!(log.put_meta(b"k", Bytes::new()), Err(StorageError::Failed)));
            assert!(matches!(log.close().await, Err(StorageError::Failed)));
            // Acknowledged data is still readable, and survives restart.
            assert_eq!(log.read(1, 0).await.unwrap(), Bytes::from_static(b"acked"));
            let (log2, rec) = EntryLog::open_with(disk.crash(7), small_config("/s")).await.unwrap();
            assert!(rec.ledgers.contains(&(1, 1)) || rec.ledgers.contains(&(1, 2)), "{rec:?}");
            assert_eq!(log2.read(1, 0).await.unwrap(), Bytes::from_static(b"acked"));
            drop(log);
        });
    }
}

/// Goal: a failed segment preallocation other than ENOSPC is fail-stop
/// too.
#[test]
fn fail_stop_on_allocate_error() {
    run(30, || async {
        let disk = SimDisk::new();
        disk.fail_nth_with(FaultKind::Allocate, 0, FaultError::Io);
        let (log, _) = EntryLog::open_with(disk.clone(), small_config("/s")).await.unwrap();
        let a = log.append(1, Bytes::from_static(b"x")).unwrap();
        assert!(log.wait_durable(a.lsn).await.is_err());
        assert!(log.append(1, Bytes::from_static(b"y")).is_err());
        assert_eq!(disk.faults_fired(), 1);
        // Restart: nothing was acknowledged, and the log works again.
        let (log2, _) = EntryLog::open_with(disk.crash(3), small_config("/s")).await.unwrap();
        let b = log2.append(1, Bytes::from_static(b"z")).unwrap();
        log2.wait_durable(b.lsn).await.unwrap();
        drop(log);
    });
}

/// Goal: a segment preallocation that finds no space (ENOSPC) wrote no
/// batch, so it is not a fail-stop: the creation is tried again, and what
/// was appended meanwhile becomes durable once it succeeds.
#[test]
fn no_space_for_a_segment_is_retried_not_fail_stop() {
    run(30, || async {
        let disk = SimDisk::new();
        disk.fail_nth_with(FaultKind::Allocate, 0, FaultError::NoSpace);
        let (log, _) = EntryLog::open_with(disk.clone(), small_config("/s")).await.unwrap();
        let a = log.append(1, Bytes::from_static(b"x")).unwrap();
        log.wait_durable(a.lsn).await.unwrap();
        assert_eq!(disk.faults_fired(), 1);
        assert!(!log.is_failed());
        let b = log.append(1, Bytes::from_static(b"y")).unwrap();
        log.wait_durable(b.lsn).await.unwrap();
        assert_eq!(log.read(1, 0).await.unwrap(), Bytes::from_static(b"x"));
        log.close().await.unwrap();
    });
}

/// Goal: an entry evicted from the write cache is read from disk with its
/// checksum verified; a flipped bit yields Corrupt naming file and offset,
/// never the bytes.
#[test]
fn flipped_bit_in_evicted_entry_is_reported_not_served() {
    run(30, || async {
        let disk = SimDisk::new();
        let mut cfg = small_config("/s");
        cfg.write_cache_bytes = 0;
        // No read cache either: every read below goes to disk.
        cfg.read_cache_bytes = 0;
        let (log, _) = EntryLog::open_with(disk.clone(), cfg).await.unwrap();
        let body = Bytes::from(vec![0x55u8; 1000]);
        let a = log.append(9, body.clone()).unwrap();
        let b = log.append(9, body.clone()).unwrap();
        log.wait_durable(b.lsn).await.unwrap();
        assert_eq!(log.read(9, a.entry).await.unwrap(), body); // from disk
        let seg = std::path::Path::new("/s/log/00000000000000000000.seg");
        // Batch header 64 + record header 48: the first body byte is at 112.
        let pos = 64 + 48 + 500;
        let mut byte = disk.contents(seg).unwrap()[pos];
        byte ^= 0x10;
        disk.damage(seg, pos as u64, &[byte]);
        match log.read(9, a.entry).await {
            Err(StorageError::Corrupt { file, offset, .. }) => {
                assert_eq!(file, seg);
                assert_eq!(offset, 64);
            }
            other => panic!("expected Corrupt, got {other:?}"),
        }
        assert_eq!(log.read(9, b.entry).await.unwrap(), body);
    });
}

/// The production backend's tests: 1 MiB segments, 256 KiB writes, and
/// run even if TMPDIR is tmpfs.
fn real_dir_config(dir: &std::path::Path) -> LogConfig {
    let mut cfg = LogConfig::new(dir);
    cfg.segment_bytes = 1 << 20;
    cfg.flush_bytes_max = 256 << 10;
    cfg.allow_tmpfs = true;
    cfg
}

/// Goal: the production backend (glommio DMA, O_DIRECT) on a real directory:
/// append, wait, read, close, reopen clean without a scan; then a reopen after
/// dropping the log without close scans only from the last checkpoint.
#[test]
fn dma_backend_real_directory() {
    let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let dir = tmp.path().join("shard-0");
    run(60, move || async move {
        let mut cfg = real_dir_config(&dir);
        cfg.write_cache_bytes = 64 << 10;
        let (log, rec) = EntryLog::open(cfg.clone()).await.unwrap();
        assert!(!rec.clean);
        let mut rng = SimRng::new(42);
        let mut bodies = Vec::new();
        let mut waits = Vec::new();
        for i in 0..400u64 {
            let b = common::body(&mut rng, i);
            let a = log
                .append(
                    i % 4,
                    NewEntry::new(b.clone()).extras(IndexExtras { publish_time_ms: i, key_hash: 0, tag_hash: 0 }),
                )
                .unwrap();
            bodies.push(b);
            waits.push(a.lsn);
        }
        // Many waiters, few fdatasyncs.
        let tasks: Vec<_> = waits
            .iter()
            .map(|&l| {
                let log = log.clone();
                glommio::spawn_local(async move { log.wait_durable(l).await })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        for i in 0..400u64 {
            assert_eq!(log.read(i % 4, i / 4).await.unwrap(), bodies[i as usize]);
        }
        log.close().await.unwrap();
        drop(log);

        let (log, rec) = EntryLog::open(cfg.clone()).await.unwrap();
        assert!(rec.clean, "{rec:?}");
        assert_eq!(rec.scanned_bytes, 0);
        assert_eq!(rec.ledgers, vec![(0, 100), (1, 100), (2, 100), (3, 100)]);
        for i in 0..400u64 {
            assert_eq!(log.read(i % 4, i / 4).await.unwrap(), bodies[i as usize]);
        }
        // More data, a checkpoint, more data, then drop without close.
        let a = log.append(0, Bytes::from_static(b"before checkpoint")).unwrap();
        log.wait_durable(a.lsn).await.unwrap();
        log.checkpoint().await.unwrap();
        let mut last = 0;
        for i in 0..10u64 {
            last = log.append(5, Bytes::from(format!("after {i}"))).unwrap().lsn;
        }
        log.wait_durable(last).await.unwrap();
        drop(log);

        let (log, rec) = EntryLog::open(cfg.clone()).await.unwrap();
        assert!(!rec.clean);
        assert_eq!(rec.entries_replayed, 10, "{rec:?}");
        assert!(rec.scanned_bytes > 0);
        assert_eq!(log.next_entry(0), 101);
        assert_eq!(log.next_entry(5), 10);
        assert_eq!(log.read(0, 100).await.unwrap(), Bytes::from_static(b"before checkpoint"));
        assert_eq!(log.read(5, 9).await.unwrap(), Bytes::from_static(b"after 9"));
        assert_eq!(log.read(3, 99).await.unwrap(), bodies[399]);
        log.close().await.unwrap();
    });
}

/// Goal: on the production backend, a run of lone batches (one entry
/// appended and waited for at a time) takes the linked write + fdatasync
/// path (`DiskFile::write_and_sync`), batches of several entries in between
/// do not, and everything it acknowledged is found by recovery after the
/// log is dropped without close, in order and intact.
#[test]
fn dma_backend_lone_batches_linked() {
    let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let dir = tmp.path().join("shard-0");
    run(60, move || async move {
        let mut cfg = real_dir_config(&dir);
        // Never paused by a slow disk here (see the next test).
        cfg.lone_sync_max = Duration::from_secs(60);
        let (log, _) = EntryLog::open(cfg.clone()).await.unwrap();
        // 1 KiB bodies, as the bench's: one page per batch.
        let body = |i: u64| Bytes::from(vec![i as u8; 1000]);
        let mut bodies = Vec::new();
        let lone = |log: EntryLog, b: Bytes| async move {
            let a = log.append(1, b).unwrap();
            log.wait_durable(a.lsn).await.unwrap();
        };
        for i in 0..40u64 {
            let b = body(i);
            bodies.push(b.clone());
            lone(log.clone(), b).await;
        }
        let linked = log.lone_batches();
        assert!(linked >= 40 - LONE_STREAK_MIN as u64, "only {linked} of 40 lone batches linked");
        // Several entries per batch: the reactor path, and the run restarts.
        let mut last = 0;
        for i in 40..60u64 {
            let b = body(i);
            bodies.push(b.clone());
            last = log.append(1, b).unwrap().lsn;
        }
        log.wait_durable(last).await.unwrap();
        assert!(log.lone_batches() <= linked + 1, "a batch of several entries went the lone way");
        for i in 60..80u64 {
            let b = body(i);
            bodies.push(b.clone());
            lone(log.clone(), b).await;
        }
        assert!(log.lone_batches() > linked, "the lone run after larger batches was not linked");
        drop(log);

        let (log, rec) = EntryLog::open(cfg.clone()).await.unwrap();
        assert!(!rec.clean);
        assert_eq!(log.next_entry(1), 80, "{rec:?}");
        for (i, b) in bodies.iter().enumerate() {
            assert_eq!(&log.read(1, i as u64).await.unwrap(), b, "entry {i}");
        }
        log.close().await.unwrap();
    });
}

/// Goal: a lone request slower than `lone_sync_max` pauses the blocking
/// path for `LONE_PAUSE_BATCHES` batches (a busy disk must not stall the
/// shard per batch), and a zero `lone_sync_max` never blocks. Method: real
/// directory, a bound of 1 ns (every request is slower) and of zero.
#[test]
fn slow_lone_requests_pause_the_blocking_path() {
    let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let dir = tmp.path().to_path_buf();
    run(60, move || async move {
        for (bound, linked, slow) in [(Duration::from_nanos(1), 1, 1), (Duration::ZERO, 0, 0)] {
            let mut cfg = real_dir_config(&dir.join(format!("shard-{}", bound.as_nanos())));
            cfg.lone_sync_max = bound;
            let (log, _) = EntryLog::open(cfg).await.unwrap();
            for i in 0..(LONE_STREAK_MIN as u64 + 30) {
                let a = log.append(1, Bytes::from(vec![i as u8; 1000])).unwrap();
                log.wait_durable(a.lsn).await.unwrap();
            }
            assert_eq!((log.lone_batches(), log.lone_slow()), (linked, slow), "bound {bound:?}");
            log.close().await.unwrap();
        }
    });
}

/// Goal: a pause of the blocking path (one slow lone request) ends early
/// once `LONE_RESUME_FAST` lone batches in a row were written and synced
/// through the reactor within `lone_sync_max` (a spike, not a busy disk), and
/// a slow one among them starts the count again; everything acknowledged
/// survives a crash. Method: SimDisk whose fdatasyncs sleep 600 ms while
/// set, against a bound of 500 ms (in-memory requests take microseconds).
#[test]
fn lone_pause_ends_after_a_run_of_fast_requests() {
    run(60, move || async move {
        let d = SimDisk::new();
        let mut cfg = small_config("/s");
        cfg.segment_bytes = 1 << 20;
        cfg.zero_ahead_bytes = 0;
        cfg.lone_sync_max = Duration::from_millis(500);
        let (log, _) = EntryLog::open_with(d.clone(), cfg).await.unwrap();
        let mut bodies = Vec::new();
        let lone = |log: EntryLog<SimDisk>, bodies: &mut Vec<Bytes>| {
            let b = Bytes::from(vec![bodies.len() as u8; 1000]);
            bodies.push(b.clone());
            async move {
                let a = log.append(1, b).unwrap();
                log.wait_durable(a.lsn).await.unwrap();
            }
        };
        for _ in 0..LONE_STREAK_MIN + 3 {
            lone(log.clone(), &mut bodies).await;
        }
        let linked = log.lone_batches();
        assert_eq!(linked, 3);
        // One slow lone request: paused.
        d.delay_syncs(Some(Duration::from_millis(600)));
        lone(log.clone(), &mut bodies).await;
        assert_eq!((log.lone_batches(), log.lone_slow()), (linked + 1, 1));
        // Slow through the reactor too (a busy disk): still paused.
        lone(log.clone(), &mut bodies).await;
        d.delay_syncs(None);
        // One fast request short of the run: still paused.
        for _ in 0..LONE_RESUME_FAST - 1 {
            lone(log.clone(), &mut bodies).await;
        }
        assert_eq!(log.lone_batches(), linked + 1, "resumed before the run of fast requests");
        d.delay_syncs(Some(Duration::from_millis(600)));
        lone(log.clone(), &mut bodies).await;
        d.delay_syncs(None);
        for _ in 0..LONE_RESUME_FAST - 1 {
            lone(log.clone(), &mut bodies).await;
        }
        assert_eq!(log.lone_batches(), linked + 1, "a slow request did not restart the run");
        lone(log.clone(), &mut bodies).await;
        assert_eq!(log.lone_batches(), linked + 1, "the run's last batch is still the reactor's");
        for _ in 0..5 {
            lone(log.clone(), &mut bodies).await;
        }
        assert_eq!(log.lone_batches(), linked + 6, "not resumed after the run of fast requests");
        assert_eq!(log.lone_slow(), 1);
        drop(log);

        let (log, rec) = EntryLog::open_with(d.crash(7), small_config("/s")).await.unwrap();
        assert!(!rec.clean);
        assert_eq!(log.next_entry(1), bodies.len() as u64, "{rec:?}");
        for (i, b) in bodies.iter().enumerate() {
            assert_eq!(&log.read(1, i as u64).await.unwrap(), b, "entry {i}");
        }
    });
}

/// Goal: a data directory on tmpfs (no O_DIRECT, no durability) is refused
/// unless `allow_tmpfs` is set.
#[test]
fn tmpfs_is_refused_unless_allowed() {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    let Some(tmpfs) = ["/dev/shm", "/run", "/tmp"]
        .into_iter()
        .find(|m| mounts.lines().any(|l| l.split(' ').nth(1) == Some(m) && l.split(' ').nth(2) == Some("tmpfs")))
    else {
        println!("skipped: no writable tmpfs mount (/dev/shm, /run, /tmp) on this machine");
        return;
    };
    let Ok(tmp) = tempfile::tempdir_in(tmpfs) else {
        println!("skipped: cannot create a directory in {tmpfs}");
        return;
    };
    let dir = tmp.path().join("shard-0");
    run(30, move || async move {
        let mut cfg = LogConfig::new(&dir);
        cfg.segment_bytes = 1 << 20;
        cfg.flush_bytes_max = 64 << 10;
        match EntryLog::open(cfg.clone()).await {
            Err(StorageError::Tmpfs(p)) => assert_eq!(p, dir),
            other => panic!("expected Tmpfs, got {other:?}"),
        }
        cfg.allow_tmpfs = true;
        let (log, _) = EntryLog::open(cfg).await.unwrap();
        let a = log.append(1, Bytes::from_static(b"dev only")).unwrap();
        log.wait_durable(a.lsn).await.unwrap();
        log.close().await.unwrap();
    });
}

/// Goal: configurations that cannot work are typed errors at open, not panics.
#[test]
fn bad_config_is_rejected() {
    run(30, || async {
        let mut bad = Vec::new();
        let mut c = small_config("/s");
        c.segment_bytes = 10_000; // not page-aligned
        bad.push(c);
        let mut c = small_config("/s");
        c.flush_bytes_max = c.segment_bytes as usize + 1; // pads past the segment
        bad.push(c);
        let mut c = small_config("/s");
        c.flush_bytes_max = 100;
        bad.push(c);
        for c in bad {
            match EntryLog::open_with(SimDisk::new(), c.clone()).await {
                Err(StorageError::Config(_)) => {}
                other => panic!("{c:?}: expected Config error, got {other:?}"),
            }
        }
        let mut c = small_config("/s");
        c.flush_bytes_max = c.segment_bytes as usize;
        let (log, _) = EntryLog::open_with(SimDisk::new(), c).await.unwrap();
        let mut last = 0;
        for _ in 0..100 {
            last = log.append(1, Bytes::from(vec![1u8; 3000])).unwrap().lsn;
        }
        log.wait_durable(last).await.unwrap();
    });
}

/// Goal: seek by publish time finds the first entry at or after a time by
/// binary search over the index, before and after a restart (index files
/// and the scan both keep the extras), and the key and tag hashes are kept too.
#[test]
fn seek_by_publish_time_and_key_hash_survive_restart() {
    run(30, || async {
        let disk = SimDisk::new();
        let (log, _) = EntryLog::open_with(disk.clone(), small_config("/s")).await.unwrap();
        let mut last = 0;
        for i in 0..300u64 {
            let extras = IndexExtras {
                publish_time_ms: 1000 + i * 10,
                key_hash: magnetar_storage::key_hash(&i.to_le_bytes()),
                // Odd entries carry a tag, even ones none.
                tag_hash: magnetar_storage::tag_hash((i % 2 == 1).then_some(b"t".as_slice())),
            };
            last = log.append(3, NewEntry::new(Bytes::from(vec![1u8; 100])).extras(extras)).unwrap().lsn;
            if i == 150 {
                log.wait_durable(last).await.unwrap();
                log.checkpoint().await.unwrap();
            }
        }
        log.wait_durable(last).await.unwrap();
        for log in [log.clone(), EntryLog::open_with(disk.crash(1), small_config("/s")).await.unwrap().0] {
            assert_eq!(log.seek_time(3, 0).await.unwrap(), 0);
            assert_eq!(log.seek_time(3, 1000).await.unwrap(), 0);
            assert_eq!(log.seek_time(3, 1001).await.unwrap(), 1);
            assert_eq!(log.seek_time(3, 1000 + 2990).await.unwrap(), 299);
            assert_eq!(log.seek_time(3, 5000).await.unwrap(), 300);
            assert_eq!(log.seek_time(99, 5000).await.unwrap(), 0);
            let e = log.index_entry(3, 42).await.unwrap().unwrap();
            assert_eq!(e.extras.publish_time_ms, 1420);
            assert_eq!(e.extras.key_hash, magnetar_storage::key_hash(&42u64.to_le_bytes()));
            assert_eq!(e.extras.tag_hash, magnetar_storage::tag_hash(None));
            let e = log.index_entry(3, 43).await.unwrap().unwrap();
            assert_eq!(e.extras.tag_hash, magnetar_storage::tag_hash(Some(b"t")));
        }
        assert_ne!(magnetar_storage::tag_hash(None), 0);
        assert_ne!(magnetar_storage::tag_hash(Some(b"t")), magnetar_storage::tag_hash(None));
        assert_ne!(magnetar_storage::key_hash(b""), 0);
    });
}

/// Goal: deleting a ledger frees its space: once a checkpoint covers the
/// deletion, its index file and every segment left without a live entry are
/// removed, segments still holding a live entry stay, the other ledger reads
/// back byte for byte, and all of this holds after a crash and in the
/// offline inspector's full verify.
#[test]
fn deleted_ledger_frees_its_segments() {
    run(60, || async {
        let disk = SimDisk::new();
        let mut cfg = small_config("/s");
        // Unlinked, not kept for reuse (recycling: `freed_segments_are_recycled`).
        cfg.recycle_segments = 0;
        let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
        let mut last = 0;
        // Ledger 1: ~200 KiB over several 64 KiB segments; ledger 2: one
        // entry early (pins the first segment) and one at the end.
        last = last.max(log.append(2, Bytes::from_static(b"first of two")).unwrap().lsn);
        for i in 0..200u32 {
            last = last.max(log.append(1, Bytes::from(vec![(i % 250) as u8 + 1; 1000])).unwrap().lsn);
            if i % 20 == 0 {
                log.wait_durable(last).await.unwrap();
            }
        }
        last = last.max(log.append(2, Bytes::from_static(b"second of two")).unwrap().lsn);
        log.wait_durable(last).await.unwrap();
        log.checkpoint().await.unwrap();
        let before = log.segments().await;
        assert!(before.len() >= 4, "{before:?}");
        assert!(disk.names(std::path::Path::new("/s/index")).contains(&format!("{:020}.idx", 1)));

        let lsn = log.delete_ledger(1).unwrap();
        assert!(matches!(log.read(1, 0).await, Err(StorageError::NoSuchEntry { .. })));
        log.wait_durable(lsn).await.unwrap();
        log.checkpoint().await.unwrap();
        let after = log.segments().await;
        let names = disk.names(std::path::Path::new("/s/log"));
        // The first segment (ledger 2's first entry) and the tail segment stay.
        assert_eq!(after.first().map(|s| s.0), before.first().map(|s| s.0));
        assert_eq!(after.first().map(|s| s.1), Some(1));
        assert!(after.len() <= 2 && after.len() < before.len(), "{before:?} -> {after:?}");
        for (start, _) in &before {
            let kept = after.iter().any(|(s, _)| s == start);
            assert_eq!(names.contains(&format!("{start:020}.seg")), kept, "segment {start}: {names:?}");
        }
        assert!(!disk.names(std::path::Path::new("/s/index")).contains(&format!("{:020}.idx", 1)));
        assert_eq!(&log.read(2, 0).await.unwrap()[..], b"first of two");
        assert_eq!(&log.read(2, 1).await.unwrap()[..], b"second of two");
        // Appending continues after the removed segments.
        let a = log.append(2, Bytes::from_static(b"third")).unwrap();
        log.wait_durable(a.lsn).await.unwrap();

        // A crash: recovery sees the same, and the inspector verifies the
        // log with its holes.
        let image = disk.crash(5);
        let tmp = tempfile::tempdir().unwrap();
        image.export(tmp.path()).unwrap();
        let img = magnetar_storage::inspect::ShardImage::load(
            &tmp.path().join("s"),
            magnetar_storage::inspect::ScanMode::Verify,
            &mut |_, _| {},
        )
        .unwrap();
        assert_eq!(img.ledgers.keys().copied().collect::<Vec<_>>(), vec![2]);
        assert_eq!(img.ledgers[&2].index.len(), 3);
        let (log2, _) = EntryLog::open_with(image, cfg).await.unwrap();
        assert_eq!(log2.ledgers(), vec![(2, 3)]);
        assert!(log2.read(1, 5).await.is_err());
        assert_eq!(&log2.read(2, 2).await.unwrap()[..], b"third");
        drop(log);
    });
}

/// Goal: a relative data directory works with the DMA backend (glommio's
/// directory open needs an absolute path; `magnetar standalone` defaults to
/// `./data`).
#[test]
fn dma_backend_relative_directory() {
    let tmp = tempfile::tempdir_in(".").unwrap();
    let cwd = std::env::current_dir().unwrap();
    let rel = tmp.path().strip_prefix(&cwd).unwrap().join("shard-0");
    assert!(rel.is_relative());
    run(30, move || async move {
        let (log, _) = EntryLog::open(LogConfig::new(&rel)).await.unwrap();
        let a = log.append(1, Bytes::from_static(b"relative")).unwrap();
        log.wait_durable(a.lsn).await.unwrap();
        log.close().await.unwrap();
        let (log, rec) = EntryLog::open(LogConfig::new(&rel)).await.unwrap();
        assert!(rec.clean);
        assert_eq!(&log.read(1, 0).await.unwrap()[..], b"relative");
    });
}

/// Body of entry `i` of ledger 1 in the catch-up tests.
fn catch_up_body(i: u64) -> Bytes {
    Bytes::from(vec![(i % 250) as u8 + 1; 1000])
}

/// Appends 200 entries `catch_up_body(i)` to ledger 1, each followed by a
/// small entry of ledger 2, and waits until all are durable.
async fn append_catch_up_entries(log: &EntryLog<SimDisk>) {
    let mut last = 0;
    for i in 0..200u64 {
        log.append(1, catch_up_body(i)).unwrap();
        last = log.append(2, Bytes::from_static(b"other")).unwrap().lsn;
    }
    log.wait_durable(last).await.unwrap();
}

/// Closes `log`, flips one byte in the middle of `ledger:entry`'s body on
/// disk, and opens the log again (empty caches).
async fn reopen_with_damaged_body(
    log: EntryLog<SimDisk>,
    disk: SimDisk,
    cfg: LogConfig,
    ledger: u64,
    entry: u64,
) -> EntryLog<SimDisk> {
    let pos = log.index_entry(ledger, entry).await.unwrap().unwrap().position;
    let seg_start = log.segments().await.iter().map(|s| s.0).filter(|s| *s <= pos).max().unwrap();
    log.close().await.unwrap();
    let path = cfg.dir.join("log").join(format!("{seg_start:020}.seg"));
    disk.damage(&path, pos - seg_start + 48 + 500, &[0]);
    EntryLog::open_with(disk, cfg).await.unwrap().0
}

/// Goal: a sequential catch-up read of entries evicted from the write cache
/// reads ahead (one disk request serves many entries), serves the rest from
/// the bounded read cache, returns every byte right, and still refuses a
/// damaged entry inside a read-ahead span without refusing its neighbours.
#[test]
fn read_ahead_serves_sequential_catch_up() {
    run(30, || async {
        let disk = SimDisk::new();
        let mut cfg = small_config("/s");
        cfg.read_cache_bytes = 32 << 10;
        cfg.read_ahead_bytes = 16 << 10;
        let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
        let body = catch_up_body;
        append_catch_up_entries(&log).await;
        for i in 0..200u64 {
            assert_eq!(log.read(1, i).await.unwrap(), body(i), "entry {i}");
        }
        let (hits, disk_reads) = log.read_stats();
        println!("read-ahead: {hits} read-cache hits, {disk_reads} disk reads for 200 entries");
        assert!(disk_reads < 40 && hits > 150, "{hits} hits, {disk_reads} disk reads");

        // Damage entry 150's body on disk; a fresh log (empty caches) reads
        // sequentially: 150 is refused, 149 and 151 are served.
        let log = reopen_with_damaged_body(log, disk, cfg, 1, 150).await;
        for i in 140..160u64 {
            let r = log.read(1, i).await;
            if i == 150 {
                assert!(matches!(r, Err(StorageError::Corrupt { .. })), "{r:?}");
            } else {
                assert_eq!(r.unwrap(), body(i), "entry {i}");
            }
        }
    });
}

/// Goal: `read_run` reads consecutive entries in one disk request (bounded
/// by entries and bytes, within one segment), returns every byte right,
/// ends a run before a damaged entry and refuses a damaged first entry, and
/// serves what the write cache still holds from there.
#[test]
fn read_run_reads_consecutive_entries_and_stops_at_damage() {
    run(30, || async {
        let disk = SimDisk::new();
        let cfg = small_config("/s");
        let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
        let body = catch_up_body;
        append_catch_up_entries(&log).await;
        // The newest entries are in the write cache: a run from there.
        let tail = log.read_run(1, 199, 10, 1 << 20).await.unwrap();
        assert_eq!(tail, vec![body(199)]);

        let (_, reads_before) = log.read_stats();
        let mut i = 0u64;
        let mut runs = 0;
        while i < 200 {
            let run = log.read_run(1, i, 16, 8_000).await.unwrap();
            assert!(!run.is_empty() && run.len() <= 16, "run of {} at {i}", run.len());
            // 1,000-byte bodies (and other records between them): the
            // 8,000-byte bound allows at most 8.
            assert!(run.len() <= 8, "run of {} at {i}", run.len());
            for b in run {
                assert_eq!(b, body(i), "entry {i}");
                i += 1;
            }
            runs += 1;
        }
        let (_, reads_after) = log.read_stats();
        println!("read_run: {runs} runs, {} disk reads for 200 entries", reads_after - reads_before);
        assert!(runs < 100, "{runs} runs for 200 entries");
        let one = log.read_run(1, 5, 1, 1 << 20).await.unwrap();
        assert_eq!(one, vec![body(5)]);
        assert!(matches!(log.read_run(1, 200, 4, 1 << 20).await, Err(StorageError::NoSuchEntry { .. })));

        // Damage entry 150's body; a fresh log (empty caches): a run from
        // 145 ends before 150, a run from 150 is refused, 151 reads.
        let log = reopen_with_damaged_body(log, disk, cfg, 1, 150).await;
        let run = log.read_run(1, 145, 100, 1 << 20).await.unwrap();
        assert!(!run.is_empty() && run.len() <= 5, "run of {} from 145", run.len());
        for (k, b) in run.iter().enumerate() {
            assert_eq!(*b, body(145 + k as u64));
        }
        let r = log.read_run(1, 150, 100, 1 << 20).await;
        assert!(matches!(r, Err(StorageError::Corrupt { .. })), "{r:?}");
        assert_eq!(log.read_run(1, 151, 1, 1 << 20).await.unwrap(), vec![body(151)]);
    });
}

/// Goal: with `prezero_segments`, every new segment is written with zeros
/// before use (the extra writes are there), and the log still recovers every
/// acknowledged entry after a crash — zeros read as "no batch", like
/// fallocated space.
#[test]
fn prezeroed_segments_are_written_and_recover() {
    run(30, || async {
        let mut counts = Vec::new();
        for prezero in [false, true] {
            let disk = SimDisk::new();
            let mut cfg = small_config("/s");
            cfg.prezero_segments = prezero;
            let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
            let mut rng = SimRng::new(7);
            let mut bodies = Vec::new();
            for i in 0..200u64 {
                let b = common::body(&mut rng, i);
                let a = log.append(0, b.clone()).unwrap();
                log.wait_durable(a.lsn).await.unwrap();
                bodies.push(b);
            }
            counts.push(disk.count(FaultKind::Write));
            let crashed = disk.crash(11);
            drop(log);
            let (log, _) = EntryLog::open_with(crashed, cfg).await.unwrap();
            for (i, b) in bodies.iter().enumerate() {
                assert_eq!(&log.read(0, i as u64).await.unwrap(), b, "prezero={prezero} entry {i}");
            }
        }
        // 64 KiB segments, 1 MiB zero chunks: one extra write per segment.
        assert!(counts[1] > counts[0], "zero writes happened: {counts:?}");
    });
}

/// Goal: segments that garbage collection frees are reused. Up to
/// `recycle_segments` are kept (the rest unlinked) and renamed into place as
/// the next segments, so the log directory does not grow; batches written
/// into them say so (`BATCH_FLAG_OVER_STALE`); the rest of one the log
/// rolled past is zeroed after its last batch; after a crash recovery reads
/// everything back, takes the stale batches behind the tail for nothing
/// written (zeroing at most a batch's worth, not the rest of the segment),
/// and still reports a damaged batch of this use before valid data.
#[test]
fn freed_segments_are_recycled() {
    run(60, || async {
        let disk = SimDisk::new();
        let mut cfg = small_config("/s");
        cfg.segment_bytes = 256 << 10;
        let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
        let dir = std::path::Path::new("/s/log");
        let mut last = 0;
        for i in 0..300u32 {
            last = log.append(1, Bytes::from(vec![(i % 200) as u8 + 1; 3000])).unwrap().lsn;
            if i % 10 == 9 {
                log.wait_durable(last).await.unwrap();
            }
        }
        log.wait_durable(last).await.unwrap();
        let lsn = log.delete_ledger(1).unwrap();
        log.wait_durable(lsn).await.unwrap();
        log.checkpoint().await.unwrap();
        let files = disk.names(dir).len();
        assert_eq!(log.recycle_stats(), (2, 0), "two freed segments kept, the rest unlinked: {:?}", disk.names(dir));
        // Ledger 2 rolls into both recycled files: no new file appears.
        let body = |e: u64| Bytes::from(format!("{e:06}").repeat(400));
        let mut bodies = Vec::new();
        for e in 0..200u64 {
            let a = log.append(2, body(e)).unwrap();
            bodies.push(body(e));
            if e % 4 == 3 {
                log.wait_durable(a.lsn).await.unwrap();
            }
            last = a.lsn;
        }
        log.wait_durable(last).await.unwrap();
        assert_eq!(log.recycle_stats(), (0, 2));
        assert_eq!(disk.names(dir).len(), files, "{:?}", disk.names(dir));
        let pos = log.index_entry(2, 199).await.unwrap().unwrap().position;
        let seg_start = log.segments().await.iter().map(|s| s.0).filter(|s| *s <= pos).max().unwrap();
        let seg_path = dir.join(format!("{seg_start:020}.seg"));
        let first = disk.contents(&seg_path).unwrap();
        let h = magnetar_storage::format::BatchHeader::decode(&first[..4096]).unwrap();
        assert_eq!((h.position, h.flags), (seg_start, magnetar_storage::format::BATCH_FLAG_OVER_STALE));
        // The recycled segment the log rolled past: after its last batch of
        // this use, zeros to its end (the writer zeroed what its earlier
        // use left there), so a walk that finds the next segment removed
        // can tell that nothing was written there.
        let prev = log.segments().await.iter().map(|s| s.0).filter(|s| *s < seg_start).max().unwrap();
        let bytes = disk.contents(&dir.join(format!("{prev:020}.seg"))).unwrap();
        let mut off = 0;
        while let Ok(h) = magnetar_storage::format::BatchHeader::decode(&bytes[off..off + 4096]) {
            if h.position != prev + off as u64 {
                break;
            }
            assert_eq!(h.flags, magnetar_storage::format::BATCH_FLAG_OVER_STALE);
            off += h.batch_len as usize;
        }
        assert!(off > 0 && off < bytes.len(), "batches of this use, then a rest: {off}");
        assert!(bytes[off..].iter().all(|&b| b == 0), "the rest after {off} is zeros");

        // A crash with nothing in flight: all back, stale bytes behind the
        // tail taken for nothing written, at most ~a batch zeroed.
        let image = disk.fork();
        let (log2, rec) = EntryLog::open_with(image.clone(), cfg.clone()).await.unwrap();
        assert!(rec.truncated_bytes <= 2 * cfg.flush_bytes_max as u64, "{rec:?}");
        for (e, b) in bodies.iter().enumerate() {
            assert_eq!(&log2.read(2, e as u64).await.unwrap(), b);
        }
        assert!(matches!(log2.read(1, 0).await, Err(StorageError::NoSuchEntry { .. })));
        // Appends continue in the recycled segment and survive a restart.
        let a = log2.append(2, Bytes::from_static(b"after")).unwrap();
        log2.wait_durable(a.lsn).await.unwrap();
        let image2 = image.fork();
        drop(log2);
        let (log3, _) = EntryLog::open_with(image2, cfg.clone()).await.unwrap();
        assert_eq!(&log3.read(2, 200).await.unwrap()[..], b"after");

        // Damage to a batch of this use with valid batches after it, in the
        // recycled segment: reported, not taken for a torn tail.
        let damaged = disk.fork();
        let mut e = 0;
        while log.index_entry(2, e).await.unwrap().unwrap().position <= seg_start + 4096 {
            e += 1;
        }
        let at = log.index_entry(2, e).await.unwrap().unwrap().position - seg_start + 100;
        damaged.damage(&seg_path, at, b"rot");
        match EntryLog::open_with(damaged, cfg.clone()).await {
            Err(StorageError::Corrupt {
                reason: magnetar_storage::CorruptReason::DamageBeforeValidBatch { .. },
                ..
            }) => {}
            other => panic!("expected DamageBeforeValidBatch, got {:?}", other.map(|(_, r)| r)),
        }
    });
}

/// Goal: the zeroing task (`zero_ahead_bytes`) writes zeros ahead of the
/// tail while batches are small, never more than the bound ahead of it and
/// never over a batch (everything reads back, also after a crash), and not
/// at all while batches are large.
#[test]
fn zero_ahead_follows_small_batches_only() {
    run(60, || async {
        let mut cfg = small_config("/s");
        cfg.segment_bytes = 4 << 20;
        cfg.flush_bytes_max = 1 << 20;
        cfg.zero_ahead_bytes = 512 << 10;
        // Lone appends, each waited for: one page per batch.
        let disk = SimDisk::new();
        let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
        for e in 0..300u64 {
            let a = log.append(1, Bytes::from(format!("lone {e}"))).unwrap();
            log.wait_durable(a.lsn).await.unwrap();
            for _ in 0..4 {
                futures_lite::future::yield_now().await;
            }
        }
        let tail = log.index_entry(1, 299).await.unwrap().unwrap().position + 4096;
        let zeroed = log.zeroed_ahead_bytes();
        assert!(zeroed > 0, "nothing zeroed ahead");
        assert!(zeroed <= tail + cfg.zero_ahead_bytes + (1 << 20), "zeroed {zeroed}, tail {tail}");
        let image = disk.crash(3);
        drop(log);
        let (log, _) = EntryLog::open_with(image, cfg.clone()).await.unwrap();
        for e in 0..300u64 {
            assert_eq!(log.read(1, e).await.unwrap(), Bytes::from(format!("lone {e}")));
        }
        drop(log);

        // Large batches: nothing zeroed.
        let disk = SimDisk::new();
        let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
        for round in 0..6u64 {
            let mut last = 0;
            for e in 0..100u64 {
                last = log.append(1, Bytes::from(vec![(round * 100 + e) as u8; 9000])).unwrap().lsn;
            }
            log.wait_durable(last).await.unwrap();
        }
        assert_eq!(log.zeroed_ahead_bytes(), 0);
    });
}

/// Goal: the production backend's `write_buf_and_sync` (a write and an
/// fdatasync linked on the file's own io_uring, awaited through an
/// eventfd) writes what it was given; two calls at once on one file both
/// complete; a call whose future is dropped after it submitted waits
/// for its requests (the kernel may still read the buffer) and leaves the
/// ring usable; and after `writes_done` a write makes a new ring. Method: a real file, pages of distinct bytes, read back.
#[test]
fn dma_write_buf_and_sync_linked_and_dropped() {
    use magnetar_storage::{Disk, DiskFile, DmaDisk, OpenMode, PAGE_BYTES};
    let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let path = tmp.path().join("f");
    run(60, move || async move {
        let page = PAGE_BYTES as usize;
        // glommio's IOPOLL probe (see `Disk::prepare`).
        DmaDisk::default().prepare(path.parent().unwrap()).await.unwrap();
        let file = DmaDisk::default().open(&path, OpenMode::Create).await.unwrap();
        file.allocate(64 * PAGE_BYTES).await.unwrap();
        let filled = |byte: u8, pages: usize| {
            let mut b = file.alloc_buf(pages * page);
            b.as_mut().fill(byte);
            b
        };
        file.write_buf_and_sync(0, filled(1, 3)).await.unwrap();
        // Two at once: they take turns on the one ring.
        let (a, b) = futures_lite::future::zip(
            file.write_buf_and_sync(3 * PAGE_BYTES, filled(2, 1)),
            file.write_buf_and_sync(4 * PAGE_BYTES, filled(3, 2)),
        )
        .await;
        a.unwrap();
        b.unwrap();
        // Submitted, then dropped before its completion was awaited.
        {
            let mut f = std::pin::pin!(file.write_buf_and_sync(6 * PAGE_BYTES, filled(4, 4)));
            let _ = futures_lite::future::poll_once(f.as_mut()).await;
        }
        // The ring goes once the log moves on, and comes back if needed.
        file.writes_done();
        file.write_buf_and_sync(10 * PAGE_BYTES, filled(5, 1)).await.unwrap();
        let data = file.read_at(0, 11 * page).await.unwrap();
        let want: Vec<u8> = [(1u8, 3usize), (2, 1), (3, 2), (4, 4), (5, 1)]
            .iter()
            .flat_map(|&(byte, pages)| std::iter::repeat_n(byte, pages * page))
            .collect();
        assert!(data == want, "the file does not hold what was written");
    });
}

/// Goal: a batch write the kernel refuses on the production backend's
/// linked path comes back as an error at once (the log then fail-stops)
/// instead of waiting for a completion the kernel never posts (with the
/// write's completion skipped on success, a failed write posts one and
/// its linked fdatasync none). Method: a position whose end overflows the
/// file offset type (EINVAL), under the harness's timeout; then a good
/// write on the same file still works (by the reactor path).
#[test]
fn dma_write_buf_and_sync_failure_returns_an_error() {
    use magnetar_storage::{Disk, DiskFile, DmaDisk, OpenMode, PAGE_BYTES};
    let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let path = tmp.path().join("f");
    run(20, move || async move {
        DmaDisk::default().prepare(path.parent().unwrap()).await.unwrap();
        let file = DmaDisk::default().open(&path, OpenMode::Create).await.unwrap();
        file.allocate(4 * PAGE_BYTES).await.unwrap();
        let page = |byte: u8| {
            let mut b = file.alloc_buf(PAGE_BYTES as usize);
            b.as_mut().fill(byte);
            b
        };
        file.write_buf_and_sync(0, page(1)).await.unwrap();
        let e = file.write_buf_and_sync((1u64 << 63) - PAGE_BYTES, page(2)).await.unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::EINVAL), "{e}");
        file.write_buf_and_sync(PAGE_BYTES, page(3)).await.unwrap();
        let data = file.read_at(0, 2 * PAGE_BYTES as usize).await.unwrap();
        assert!(
            data[..PAGE_BYTES as usize].iter().all(|&b| b == 1) && data[PAGE_BYTES as usize..].iter().all(|&b| b == 3)
        );
    });
}

/// Goal: the production backend's `read_bytes` (reads into buffers of its
/// own on the executor's own io_uring) returns exactly the bytes asked
/// for, at any offset and length, fewer only at the end of the file (none
/// past it), and so does `read_at`; more reads at once than its ring has
/// registered buffers and slots all complete (the rest take heap memory,
/// then the reactor path); a read whose
/// future is dropped after it was submitted leaves the ring usable; and
/// the bytes may be dropped on another thread. Method: a real file of
/// position-dependent bytes; reads checked against the pattern.
#[test]
fn dma_read_bytes_reads_what_is_there() {
    use magnetar_storage::{DiskFile, PAGE_BYTES};
    let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let path = tmp.path().join("f");
    run(60, move || async move {
        let pages = 40u64;
        let size = pages * PAGE_BYTES;
        let file = std::rc::Rc::new(read_bytes_file(&path, pages).await);
        let check = |pos: u64, len: usize, got: &[u8]| {
            let end = (pos + len as u64).min(size).max(pos);
            assert_eq!(got.len() as u64, end - pos, "length of a read of {len} at {pos}");
            for (i, &b) in got.iter().enumerate() {
                assert_eq!(b, read_bytes_pattern(pos + i as u64), "byte {i} of a read of {len} at {pos}");
            }
        };
        let cases: &[(u64, usize)] = &[
            (0, 1),
            (0, PAGE_BYTES as usize),
            (1, 10),
            (4095, 2),
            (4096, 4096),
            (5000, 70_000),
            (3 * PAGE_BYTES + 17, 9 * PAGE_BYTES as usize + 5),
            (size - 100, 100),
            (size - 100, 5000),
            (size - 1, 1 << 20),
            // Larger than a registered buffer: heap memory.
            (5, 2 << 20),
            (size, 10),
            (size + 3 * PAGE_BYTES + 1, 10),
            (7, 0),
        ];
        for &(pos, len) in cases {
            let got = file.read_bytes(pos, len).await.unwrap();
            check(pos, len, &got);
            // `read_at` too (it once returned bytes past the end of the
            // file for a stretch running past it, as glommio's does).
            let old = file.read_at(pos, len).await.unwrap();
            check(pos, len, &old);
        }
        // More at once than the ring's 16 registered buffers and 32 slots,
        // held until all are done.
        let tasks: Vec<_> = (0..48u64)
            .map(|i| {
                let file = file.clone();
                glommio::spawn_local(async move {
                    let (pos, len) = (i * 3001 % size, 20_000 + i as usize * 77);
                    (pos, len, file.read_bytes(pos, len).await.unwrap())
                })
            })
            .collect();
        let mut held = Vec::new();
        for t in tasks {
            let (pos, len, got) = t.await;
            check(pos, len, &got);
            held.push(got);
        }
        drop(held);
        // Submitted, then dropped before its completion was awaited. Some
        // disks complete an O_DIRECT read within the submitting call now and
        // then (a host's cache behind a virtual disk): tried until one is
        // still in flight when dropped.
        let mut in_flight = false;
        for i in 0..200u64 {
            let mut f = std::pin::pin!(file.read_bytes((i % 30) * PAGE_BYTES, 8 * PAGE_BYTES as usize));
            if futures_lite::future::poll_once(f.as_mut()).await.is_none() {
                in_flight = true;
                break;
            }
        }
        if !in_flight {
            eprintln!("every read completed within its submission: the drop of one in flight was not exercised");
        }
        let got = file.read_bytes(2 * PAGE_BYTES + 3, 30_000).await.unwrap();
        check(2 * PAGE_BYTES + 3, 30_000, &got);
        // Handed to another thread and dropped there.
        let checked = std::thread::spawn(move || {
            let ok = got.iter().enumerate().all(|(i, &b)| b == read_bytes_pattern(2 * PAGE_BYTES + 3 + i as u64));
            drop(got);
            ok
        })
        .join()
        .unwrap();
        assert!(checked);
    });
}

/// Goal: `read_bytes` works in an executor that runs on a thread after
/// another executor there used it (each executor has its own ring: the
/// eventfd belongs to the reactor that opened it). Method: two executors
/// one after the other on one thread, each reading the same file.
#[test]
fn dma_read_bytes_executors_one_after_another() {
    use magnetar_storage::{DiskFile, PAGE_BYTES};
    let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let path = tmp.path().join("f");
    let worker = std::thread::spawn(move || {
        for round in 0..2u64 {
            let ex = glommio::LocalExecutorBuilder::default().make().expect("glommio executor");
            let path = path.clone();
            ex.run(async move {
                let file = read_bytes_file(&path, 4).await;
                let pos = 100 + round;
                let got = file.read_bytes(pos, 3 * PAGE_BYTES as usize).await.unwrap();
                assert_eq!(got.len(), 3 * PAGE_BYTES as usize);
                assert!(got.iter().enumerate().all(|(i, &b)| b == read_bytes_pattern(pos + i as u64)), "round {round}");
            });
        }
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !worker.is_finished() {
        assert!(std::time::Instant::now() < deadline, "timed out after 60 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    worker.join().unwrap();
}

/// Body of entry `i` of `ledger` in the interleaved-ledger tests.
fn interleaved_body(ledger: u64, i: u64) -> Bytes {
    Bytes::from(vec![(ledger * 100 + i % 100) as u8; 1000])
}

/// A simulated disk whose log (1 MiB segments) holds `n` entries of each of
/// ledgers 1 and 2, appended alternately (two partitions of one shard), a
/// durable wait every `every` pairs; closed. Returns the disk and config.
async fn interleaved_log(n: u64, every: u64) -> (SimDisk, LogConfig) {
    ledgers_log(2, n, every).await
}

/// As [`interleaved_log`], with ledgers `1..=ledgers`.
async fn ledgers_log(ledgers: u64, n: u64, every: u64) -> (SimDisk, LogConfig) {
    let disk = SimDisk::new();
    let mut cfg = small_config("/s");
    cfg.segment_bytes = 1 << 20;
    let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
    let mut last = 0;
    for i in 0..n {
        for ledger in 1..=ledgers {
            last = log.append(ledger, interleaved_body(ledger, i)).unwrap().lsn;
        }
        if i % every == 0 {
            log.wait_durable(last).await.unwrap();
        }
    }
    log.wait_durable(last).await.unwrap();
    log.close().await.unwrap();
    (disk, cfg)
}

/// Reads entries `0..n` of ledger 1 run by run (`max_entries`, `max_bytes`
/// per run), checking each; returns the number of runs. Every run must
/// make progress: a reader that stops advancing fails instead of looping.
async fn read_alone(log: &EntryLog<SimDisk>, n: u64, max_entries: usize, max_bytes: usize) -> u64 {
    let (mut i, mut runs) = (0u64, 0u64);
    while i < n {
        let run = log.read_run(1, i, max_entries, max_bytes).await.unwrap();
        assert!(!run.is_empty(), "an empty run at {i}");
        for b in run {
            assert_eq!(b, interleaved_body(1, i), "ledger 1 entry {i}");
            i += 1;
        }
        runs += 1;
    }
    runs
}

/// Reads entries `0..n` of ledgers 1 and 2 in step, as two catching-up
/// consumers do: one run of each awaited together per step, each entry
/// checked; returns the number of steps. Every step must advance a reader.
async fn read_in_step(log: &EntryLog<SimDisk>, n: u64, max_entries: usize, max_bytes: usize) -> u64 {
    let mut next = [0u64, 0];
    let mut steps = 0;
    while next.iter().any(|&e| e < n) {
        let run_of = |ledger: u64, from: u64| async move {
            if from < n {
                log.read_run(ledger, from, max_entries, max_bytes).await.unwrap()
            } else {
                Vec::new()
            }
        };
        let (r1, r2) = futures_lite::future::zip(run_of(1, next[0]), run_of(2, next[1])).await;
        assert!(!r1.is_empty() || !r2.is_empty(), "no progress at {next:?}");
        for (k, run) in [r1, r2].into_iter().enumerate() {
            let ledger = k as u64 + 1;
            for b in run {
                assert_eq!(b, interleaved_body(ledger, next[k]), "ledger {ledger} entry {}", next[k]);
                next[k] += 1;
            }
        }
        steps += 1;
    }
    steps
}

/// Goal: two ledgers whose records interleave in the log (two partitions
/// of one shard), read run by run in step as two catching-up consumers do,
/// get every entry right while the disk is read about once, not once per
/// ledger: a run starting inside a stretch another run read (or is
/// reading) takes its bytes from there. Method: the simulated disk,
/// entries of ledgers 1 and 2 appended alternately, a fresh log (empty
/// caches), runs of both ledgers awaited together; the disk reads counted
/// against reading one ledger alone.
#[test]
fn read_run_shares_disk_reads_between_interleaved_ledgers() {
    run(30, || async {
        let (disk, cfg) = interleaved_log(400, 7).await;

        let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
        let (_, before) = log.read_stats();
        read_alone(&log, 400, 64, 64 << 10).await;
        let alone = log.read_stats().1 - before;
        log.close().await.unwrap();

        let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
        let (_, before) = log.read_stats();
        read_in_step(&log, 400, 64, 64 << 10).await;
        let both = log.read_stats().1 - before;
        println!("disk reads: one ledger alone {alone}, both in step {both}");
        assert!(both * 2 < alone * 3, "both ledgers took {both} disk reads, one alone {alone}");
        log.close().await.unwrap();
    });
}

/// Goal: runs of a few hundred entries (stretches read from 128 KiB
/// boundaries, shared between two interleaved ledgers) across segment
/// boundaries return every entry right and always make progress, read
/// alone or in step. Method: the simulated disk, 1 MiB segments, entries of
/// each ledger appended alternately (1,500 with a durable wait every 4
/// pairs: small batches; 3,000 every 50: the shape that once hung, see
/// below), runs of up to 256 entries or 1 MiB. A reader stuck in place
/// fails the progress checks of `read_alone` / `read_in_step`; a task that
/// spins without returning to the executor fails `run`'s watch.
/// (Grid run on this code, none hung or failed: 2,000 / 3,000 / 5,000
/// entries x a wait every 1 / 7 / 50 / 200 x runs of 16 / 64 / 256 x
/// 64 KiB / 1 MiB, with 64 KiB, 256 KiB, 1 MiB and 4 MiB segments.)
#[test]
fn read_run_in_step_across_segments() {
    run(60, || async {
        for (n, every) in [(1500, 4), (3000, 50)] {
            let (disk, cfg) = interleaved_log(n, every).await;
            let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
            let runs = read_alone(&log, n, 256, 1 << 20).await;
            log.close().await.unwrap();
            let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
            let steps = read_in_step(&log, n, 256, 1 << 20).await;
            println!("{n} entries, a wait every {every}: alone {runs} runs; in step {steps} steps");
            log.close().await.unwrap();
        }
    });
}

/// Goal: read_run reads each byte of log from disk once, for a reader alone
/// (which used to re-read up to 128 KiB per run: its reads were widened
/// back to a 128 KiB boundary although the stretch before was kept; with
/// 8 MiB segments 1.30x the bytes delivered with runs of 1 MiB, 4.8x with
/// runs of 16 entries of 1 KiB) as for two interleaved ledgers read in step
/// (2.2x with 1 MiB runs: the reader polled first started its read at a
/// boundary past the other's first record). Method: the simulated disk, counting the bytes
/// its reads return; `n` entries of 1,000 bytes per ledger, runs of
/// 1 MiB, 64 and 16 entries; bytes read against the log bytes up to the
/// end of the last record (a bound every byte read once meets) and, for
/// the lone reader of a one-ledger log, against the bodies delivered
/// (1,000 of the ~1,170 log bytes per entry; each record has a 48-byte
/// header, each batch is padded to a page).
#[test]
fn read_run_reads_each_log_byte_once() {
    run(60, || async {
        let n = 2000;
        for ledgers in [1u64, 2] {
            let (disk, cfg) = ledgers_log(ledgers, n, 7).await;
            for (max_entries, max_bytes) in [(100_000, 1 << 20), (64, 1 << 20), (16, 1 << 20)] {
                let shapes: &[(u64, &str)] =
                    if ledgers == 1 { &[(1, "alone")] } else { &[(1, "alone"), (2, "in step")] };
                for &(readers, what) in shapes {
                    let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
                    let last = log.index_entry(ledgers, n - 1).await.unwrap().unwrap();
                    let log_bytes = last.position + RECORD_HEADER_BYTES as u64 + last.body_len as u64;
                    let before = disk.bytes_read();
                    let pages_before = log.index_cache_stats().loads;
                    if readers == 1 {
                        read_alone(&log, n, max_entries, max_bytes).await;
                    } else {
                        read_in_step(&log, n, max_entries, max_bytes).await;
                    }
                    // Index pages read on the way are not log bytes.
                    let index_read = (log.index_cache_stats().loads - pages_before) * 4096;
                    let read = disk.bytes_read() - before - index_read;
                    println!("index pages read: {index_read} bytes");
                    let delivered = readers * n * 1000;
                    println!(
                        "{ledgers} ledger(s), {what}, runs of {max_entries} / {max_bytes}: read {read} for {log_bytes} \
                         of log, {delivered} delivered ({:.3}x)",
                        read as f64 / delivered as f64
                    );
                    assert!(read <= log_bytes, "read {read} bytes of {log_bytes} of log ({what}, {max_entries})");
                    if ledgers == 1 {
                        assert!(read * 5 <= delivered * 6, "read {read} bytes to deliver {delivered}");
                    }
                    log.close().await.unwrap();
                }
            }
        }
    });
}

/// Goal: the stretches of log kept for read_run (up to ~9 MiB a shard) are
/// released once reading goes idle, by the periodic checkpoint (no timer of
/// their own), not while runs use them, and reading goes on right after.
/// Method: the simulated disk, `read_span_idle` 1 s, a checkpoint every
/// 100 ms; two interleaved ledgers read in step part of the way; the kept
/// stretches watched every 50 ms until they go.
#[test]
fn read_run_releases_kept_stretches_when_idle() {
    run(30, || async {
        let (disk, mut cfg) = interleaved_log(400, 7).await;
        cfg.checkpoint_interval = Duration::from_millis(100);
        cfg.read_span_idle = Duration::from_secs(1);
        let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
        let mut next = [0u64, 0];
        // Taken before each run: the last run's use of a stretch is later.
        let mut read_at = std::time::Instant::now();
        for _ in 0..3 {
            for (k, ledger) in [1u64, 2].into_iter().enumerate() {
                read_at = std::time::Instant::now();
                next[k] += log.read_run(ledger, next[k], 64, 64 << 10).await.unwrap().len() as u64;
            }
        }
        let (kept, held) = log.read_spans();
        assert!(kept > 0 && held > 0, "nothing kept after reading: {kept} stretches, {held} bytes");
        log.checkpoint().await.unwrap();
        assert_eq!(log.read_spans(), (kept, held), "released by a checkpoint right after reading");
        while log.read_spans().0 > 0 {
            assert!(read_at.elapsed() < Duration::from_secs(5), "still kept: {:?}", log.read_spans());
            glommio::timer::sleep(Duration::from_millis(50)).await;
        }
        let idle = read_at.elapsed();
        println!("{kept} stretches ({held} bytes) released {idle:?} after the last run started");
        assert!(idle >= Duration::from_secs(1), "released after {idle:?}, before read_span_idle");
        for (k, ledger) in [1u64, 2].into_iter().enumerate() {
            for (i, b) in log.read_run(ledger, next[k], 64, 64 << 10).await.unwrap().into_iter().enumerate() {
                assert_eq!(b, interleaved_body(ledger, next[k] + i as u64));
            }
        }
        assert!(log.read_spans().0 > 0);
        log.close().await.unwrap();
    });
}

/// Goal: the production backend's `read_bytes` never hands out bytes that
/// change afterwards (a registered buffer reused while a view of it is
/// still held, on this thread or another) and never returns other bytes
/// than the file's, under random reads of any offset and length (within a
/// registered buffer, larger, past the end), many in flight at once, some
/// dropped before, some after their completion. Method: random reads of a
/// pattern file (seed printed; `MAGNETAR_SEED` replays one), each checked;
/// a third of the results sent to another thread that keeps the last 24
/// and re-checks every one of them on each arrival.
#[test]
fn dma_read_bytes_views_stay_valid_under_random_reads() {
    use magnetar_storage::{DiskFile, PAGE_BYTES};
    let seed: u64 = std::env::var("MAGNETAR_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64 | 1
    });
    eprintln!("dma_read_bytes_views_stay_valid_under_random_reads: MAGNETAR_SEED={seed}");
    let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let path = tmp.path().join("f");
    let (held_tx, held_rx) = std::sync::mpsc::channel::<(u64, bytes::Bytes)>();
    let checker = std::thread::spawn(move || {
        let mut held = std::collections::VecDeque::new();
        while let Ok(view) = held_rx.recv() {
            held.push_back(view);
            if held.len() > 24 {
                held.pop_front();
            }
            for (pos, b) in &held {
                for (i, &x) in b.iter().enumerate() {
                    assert_eq!(x, read_bytes_pattern(pos + i as u64), "byte {i} of a view at {pos}, seed {seed}");
                }
            }
        }
    });
    run(120, move || async move {
        let pages = 1024u64;
        let size = pages * PAGE_BYTES;
        let file = std::rc::Rc::new(read_bytes_file(&path, pages).await);
        let mut rng = seed;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let mut tasks = Vec::new();
        for _ in 0..1500 {
            let r = next();
            let pos = r % (size + 3 * PAGE_BYTES);
            let len = match r >> 61 {
                0 => (r >> 20) as usize % (3 << 20),
                1 | 2 => (r >> 20) as usize % 5000,
                _ => (r >> 20) as usize % (1280 << 10),
            };
            // 0: awaited; else dropped after that many polls (a yield between).
            let polls = if (r >> 40) % 4 == 0 { 1 + (r >> 42) % 3 } else { 0 };
            let hold = (r >> 45) % 3 == 0;
            let (file, held_tx) = (file.clone(), held_tx.clone());
            tasks.push(glommio::spawn_local(async move {
                let mut read = std::pin::pin!(file.read_bytes(pos, len));
                if polls > 0 {
                    for _ in 0..polls {
                        if futures_lite::future::poll_once(read.as_mut()).await.is_some() {
                            return;
                        }
                        futures_lite::future::yield_now().await;
                    }
                    return;
                }
                let got = read.await.unwrap();
                let end = (pos + len as u64).min(size).max(pos);
                assert_eq!(got.len() as u64, end - pos, "length of a read of {len} at {pos}, seed {seed}");
                for (i, &x) in got.iter().enumerate() {
                    assert_eq!(
                        x,
                        read_bytes_pattern(pos + i as u64),
                        "byte {i} of a read of {len} at {pos}, seed {seed}"
                    );
                }
                if hold {
                    held_tx.send((pos, got)).unwrap();
                }
            }));
            if tasks.len() == 40 {
                for t in tasks.drain(..) {
                    t.await;
                }
            }
        }
        for t in tasks {
            t.await;
        }
    });
    // Every sender went with the executor's tasks.
    checker.join().unwrap();
}

/// Goal: a `read_bytes` still waiting when its executor stops running
/// (its `run` returned) completes with the right bytes once that executor
/// runs again, though another executor read on the thread meanwhile (and
/// so made the thread's read ring its own). Method: executor A leaves a
/// read in flight, executor B reads, A runs again and awaits A's read.
#[test]
#[allow(clippy::async_yields_async)] // A's read is handed out of its first run, to await in its second.
fn dma_read_bytes_waiting_across_another_executor() {
    use magnetar_storage::{DiskFile, PAGE_BYTES};
    let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let path = tmp.path().join("f");
    let worker = std::thread::spawn(move || {
        let a = glommio::LocalExecutorBuilder::default().make().expect("glommio executor");
        let b = glommio::LocalExecutorBuilder::default().make().expect("glommio executor");
        let p = path.clone();
        let pending = a.run(async move {
            let file = read_bytes_file(&p, 64).await;
            let read = glommio::spawn_local(async move { file.read_bytes(5, 200_000).await });
            // It runs to its wait for the disk.
            glommio::executor().yield_now().await;
            read
        });
        b.run(async move {
            let file = read_bytes_file(&path, 64).await;
            let got = file.read_bytes(7, 3 * PAGE_BYTES as usize).await.unwrap();
            assert!(got.iter().enumerate().all(|(i, &x)| x == read_bytes_pattern(7 + i as u64)));
        });
        let got = a.run(pending).unwrap();
        assert_eq!(got.len(), 200_000);
        assert!(got.iter().enumerate().all(|(i, &x)| x == read_bytes_pattern(5 + i as u64)));
    });
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !worker.is_finished() {
        assert!(std::time::Instant::now() < deadline, "timed out after 60 s");
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    worker.join().unwrap();
}

/// Goal (issue #17, item 3): a checkpoint that finds no space for its index
/// pages, its file or its copy is not a fail-stop. The checkpoint is derived
/// data: appends go on, the checkpoint is tried again and succeeds once
/// there is space, and a crash after that loses nothing acknowledged.
///
/// Method: with nothing else writing, ENOSPC on the checkpoint's first,
/// second or third write (one ledger: its index page, the checkpoint file,
/// the copy); then an append and a checkpoint that must succeed; then a
/// crash and a restart that must read both entries.
#[test]
fn no_space_for_a_checkpoint_is_retried_not_fail_stop() {
    for (skip, what) in [(0u64, "index page"), (1, "checkpoint file"), (2, "checkpoint copy")] {
        run(30, move || async move {
            let disk = SimDisk::new();
            let mut cfg = small_config("/s");
            cfg.zero_ahead_bytes = 0;
            let (log, _) = EntryLog::open_with(disk.clone(), cfg.clone()).await.unwrap();
            let a = log.append(1, Bytes::from_static(b"before")).unwrap();
            log.wait_durable(a.lsn).await.unwrap();
            disk.fail_nth_with(FaultKind::Write, disk.count(FaultKind::Write) + skip, FaultError::NoSpace);
            let r = log.checkpoint().await;
            assert!(r.is_err(), "{what}: the checkpoint must report the lack of space");
            assert_eq!(disk.faults_fired(), 1, "{what}");
            assert!(!log.is_failed(), "{what}: no space for a checkpoint must not fail-stop the log");
            let b = log.append(1, Bytes::from_static(b"after")).unwrap();
            log.wait_durable(b.lsn).await.unwrap();
            log.checkpoint().await.unwrap_or_else(|e| panic!("{what}: the checkpoint tried again: {e}"));
            let (log2, _) = EntryLog::open_with(disk.crash(11), cfg).await.unwrap();
            assert_eq!(log2.read(1, 0).await.unwrap(), Bytes::from_static(b"before"), "{what}");
            assert_eq!(log2.read(1, 1).await.unwrap(), Bytes::from_static(b"after"), "{what}");
            drop(log);
        });
    }
}

/// Index files of this log's directory the process has open, once files
/// just dropped are closed (glommio closes a dropped file through its
/// reactor, a little later).
async fn open_index_files(dir: &std::path::Path) -> usize {
    glommio::timer::sleep(std::time::Duration::from_millis(50)).await;
    let index = dir.join("index");
    std::fs::read_dir("/proc/self/fd")
        .unwrap()
        .filter_map(|e| std::fs::read_link(e.ok()?.path()).ok())
        .filter(|target| target.starts_with(&index))
        .count()
}

/// Goal: a shard's open index files do not grow with its ledgers. More
/// ledgers than `INDEX_FILES_OPEN_MAX` get their index files at a
/// checkpoint, through a clean close and a reopen, and every entry of every
/// ledger reads back (its page loaded from its file, opened on demand), with
/// at most `INDEX_FILES_OPEN_MAX` of them open at any point. Before, each
/// ledger held its file open: past the process's limit a checkpoint failed
/// with "Too many open files" and the log stopped.
#[test]
fn more_ledgers_than_open_index_files() {
    let tmp = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let dir = tmp.path().to_path_buf();
    let ledgers = 3 * magnetar_storage::INDEX_FILES_OPEN_MAX as u64;
    run(120, move || async move {
        let mut cfg = real_dir_config(&dir);
        // One page in the cache: every read below goes to its file.
        cfg.index_cache_bytes = 1;
        let (log, _) = EntryLog::open(cfg.clone()).await.unwrap();
        let body = |l: u64, e: u64| Bytes::from(format!("ledger {l} entry {e}"));
        let mut last = 0;
        for l in 0..ledgers {
            for e in 0..2 {
                last = log.append(l, body(l, e)).unwrap().lsn;
            }
        }
        log.wait_durable(last).await.unwrap();
        log.checkpoint().await.unwrap();
        let open = open_index_files(&dir).await;
        assert!(open <= magnetar_storage::INDEX_FILES_OPEN_MAX, "{open} index files open after the checkpoint");
        for l in 0..ledgers {
            log.append(l, body(l, 2)).unwrap();
        }
        log.close().await.unwrap();
        drop(log);
        assert_eq!(open_index_files(&dir).await, 0, "a closed log keeps no index file open");

        let (log, rec) = EntryLog::open(cfg).await.unwrap();
        assert!(rec.clean, "{rec:?}");
        log.live_counted().await.unwrap();
        assert_eq!(open_index_files(&dir).await, 0, "recovery and the live count after it keep no index file open");
        for l in 0..ledgers {
            for e in 0..3 {
                assert_eq!(log.read(l, e).await.unwrap(), body(l, e), "entry {l}:{e}");
            }
            if l % 64 == 63 {
                let open = open_index_files(&dir).await;
                assert!(
                    open <= magnetar_storage::INDEX_FILES_OPEN_MAX,
                    "{open} index files open after reading ledger {l}"
                );
            }
        }
        assert!(log.index_cache_stats().loads >= ledgers, "the pages were read from their files");
        log.close().await.unwrap();
    });
}
