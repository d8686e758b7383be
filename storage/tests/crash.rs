//! Simulated crashes over the Disk trait.
//!
//! Goal: whatever a power cut leaves (unsynced writes dropped, torn into 512 or
//! 4096-byte pieces applied in any order, directory operations partly
//! applied), recovery returns exactly a prefix of what was appended that
//! contains everything whose `wait_durable` returned Ok: in order, byte for
//! byte, exactly once, with metadata last-write-wins.
//!
//! Method: a workload (appends to a few ledgers, metadata puts and deletes, ledger deletions,
//! compaction passes, key index upkeep (every recovery is also checked
//! against the key index: exactly the recovered entries with each key),
//! waits from spawned tasks, checkpoints, sometimes a clean close) runs on a
//! `SimDisk` that freezes at operation n; the crash image is opened and
//! compared with the model. `crash_at_every_step` tries every n of one
//! workload; `random_crashes` draws workload, crash point and tear pattern
//! from a seed, also crashes during recovery itself, and chains rounds of
//! append/crash/recover on the same data. In a third of the rounds an EIO or
//! ENOSPC is injected on a write, sync or allocate: the log must fail-stop
//! (no receipt after it; a failed sync also loses its writes in the
//! simulator, so a retried sync that acknowledged would lose acknowledged
//! data and fail the oracle), and the restart recovers. 2,000 seeds by
//! default. Every seed is printed; `MAGNETAR_SEED=<seed>` replays one,
//! `MAGNETAR_SEEDS=<n>` sets how many.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::cell::Cell;
use std::rc::Rc;

use bytes::Bytes;
use common::{run, small_config, Model, Rec};
use magnetar_storage::sim::{FaultError, FaultKind, SimDisk, SimRng};
use magnetar_storage::{key_hash, EntryLog, IndexExtras, LogConfig, NewEntry, StorageError};
use std::collections::{BTreeMap, BTreeSet};

/// Runs `steps` random operations on `log`, extending `model`. Returns when
/// done or as soon as the log refuses work (the disk crashed under it).
async fn workload(log: &EntryLog<SimDisk>, model: &mut Model, rng: &mut SimRng, steps: usize, may_close: bool) {
    let base = model.recs.len();
    let mut lsns: Vec<u64> = Vec::new();
    let acked_lsn = Rc::new(Cell::new(0u64));
    let mut tasks = Vec::new();
    let mut stopped = false;
    for step in 0..steps {
        match rng.below(24) {
            0..=11 => {
                let ledger = model.ledger_of(rng.below(4));
                let body = common::body(rng, step as u64);
                // Every other entry comes with its body's checksum, as the
                // broker's large entries do (`NewEntry::body_crc`): the record's
                // checksum is then derived, not hashed from the bytes.
                let body_crc = (step % 2 == 0).then(|| magnetar_storage::format::crc(&[&body]));
                match log.append(ledger, NewEntry { body: body.clone(), extras: extras_of(&body, step), body_crc }) {
                    Ok(a) => {
                        assert_eq!(
                            a.entry,
                            model.next_entry(ledger),
                            "ledger {ledger} (replay: MAGNETAR_SEED={})",
                            SEED.with(|s| s.get())
                        );
                        model.recs.push(Rec::Entry { ledger, entry: a.entry, body });
                        lsns.push(a.lsn);
                    }
                    Err(_) => {
                        stopped = true;
                        break;
                    }
                }
            }
            12..=13 => {
                let key = format!("k{}", rng.below(6)).into_bytes();
                let value =
                    if rng.chance(1, 4) { Bytes::new() } else { Bytes::from(format!("v{step}-{}", rng.next_u64())) };
                match log.put_meta(&key, value.clone()) {
                    Ok(lsn) => {
                        model.recs.push(Rec::Meta { key, value });
                        lsns.push(lsn);
                    }
                    Err(_) => {
                        stopped = true;
                        break;
                    }
                }
            }
            14..=16 => {
                if let Some(&l) = lsns.last() {
                    let log = log.clone();
                    let acked = acked_lsn.clone();
                    tasks.push(glommio::spawn_local(async move {
                        if log.wait_durable(l).await.is_ok() {
                            acked.set(acked.get().max(l));
                        }
                    }));
                }
            }
            17 => {
                if let Some(&l) = lsns.last() {
                    if log.wait_durable(l).await.is_err() {
                        stopped = true;
                        break;
                    }
                    acked_lsn.set(acked_lsn.get().max(l));
                }
            }
            19 => {
                // Compaction: copies live entries of sparse segments to the
                // tail, then checkpoints (which deletes the emptied ones).
                match log.compact().await {
                    Ok(st) => {
                        COMPACTED.with(|c| {
                            let (m, r) = c.get();
                            c.set((m + st.entries_moved, r + st.segments_removed));
                        });
                    }
                    Err(StorageError::Corrupt { .. }) => {
                        panic!("compaction found damage (replay: MAGNETAR_SEED={})", SEED.with(|s| s.get()))
                    }
                    Err(_) => {
                        stopped = true;
                        break;
                    }
                }
            }
            18 if rng.chance(1, 3) => {
                // Key index upkeep: writes files of 16 items.
                if log.maintain_key_index(rng.chance(1, 4)).await.is_err() && log.is_failed() {
                    stopped = true;
                    break;
                }
            }
            18 => {
                for _ in 0..rng.below(4) {
                    futures_lite::future::yield_now().await;
                }
            }
            20..=22 => {
                let ledger = model.ledger_of(rng.below(4));
                match log.delete_ledger(ledger) {
                    Ok(lsn) => {
                        model.recs.push(Rec::Delete { ledger });
                        lsns.push(lsn);
                    }
                    Err(StorageError::LedgerBusy { .. }) => {}
                    Err(_) => {
                        stopped = true;
                        break;
                    }
                }
            }
            _ => {
                if rng.chance(1, 2) && log.checkpoint().await.is_err() {
                    stopped = true;
                    break;
                }
            }
        }
    }
    if !stopped {
        if let Some(&l) = lsns.last() {
            if log.wait_durable(l).await.is_ok() {
                acked_lsn.set(acked_lsn.get().max(l));
            }
        }
    }
    for t in tasks {
        t.await;
    }
    if !stopped && may_close && rng.chance(1, 3) && log.close().await.is_ok() {
        acked_lsn.set(acked_lsn.get().max(lsns.last().copied().unwrap_or(0)));
    }
    RECYCLED.with(|r| r.set(r.get() + log.recycle_stats().1));
    ZEROED.with(|r| r.set(r.get() + log.zeroed_ahead_bytes()));
    let acked_new = lsns.iter().filter(|&&l| l <= acked_lsn.get()).count();
    model.acked = model.acked.max(base + acked_new);
}

/// The key an entry is appended with (none for a quarter of them), from
/// its body, so that the oracle can recompute it.
fn key_of(body: &[u8]) -> Option<String> {
    let k = body.first().copied().unwrap_or(0) % 4;
    (k != 0).then(|| format!("key-{k}"))
}

fn extras_of(body: &[u8], step: usize) -> IndexExtras {
    IndexExtras {
        publish_time_ms: step as u64,
        key_hash: key_of(body).map_or(0, |k| key_hash(k.as_bytes())),
        tag_hash: 0,
    }
}

/// The key index after recovery: exactly the recovered entries with each key.
async fn check_keys(model: &Model, log: &EntryLog<SimDisk>, ctx: &str) {
    let mut want: BTreeMap<String, BTreeSet<(u64, u64)>> = BTreeMap::new();
    let deleted: BTreeSet<u64> =
        model.recs.iter().filter_map(|r| if let Rec::Delete { ledger } = r { Some(*ledger) } else { None }).collect();
    for r in &model.recs {
        if let Rec::Entry { ledger, entry, body } = r {
            if let (Some(k), false) = (key_of(body), deleted.contains(ledger)) {
                want.entry(k).or_default().insert((*ledger, *entry));
            }
        }
    }
    for k in 1..4 {
        let key = format!("key-{k}");
        let got: BTreeSet<(u64, u64)> = log
            .find_key(key_hash(key.as_bytes()), &|_| true, None, usize::MAX)
            .await
            .unwrap_or_else(|e| panic!("{ctx}: find_key: {e}"))
            .into_iter()
            .map(|h| (h.ledger, h.entry))
            .collect();
        assert_eq!(got, want.remove(&key).unwrap_or_default(), "{ctx}: key index for {key}");
    }
}

fn cfg() -> LogConfig {
    let mut c = small_config("/shard-0");
    c.key_index_items_per_file = 16;
    // Compact eagerly, so that the small workloads do it often.
    c.compaction_live_pct = 60;
    c
}

thread_local! {
    /// (recoveries, with a torn tail truncated, crashes inside recovery,
    ///  unacknowledged records lost, unacknowledged records recovered)
    static STATS: Cell<(u64, u64, u64, u64, u64)> = const { Cell::new((0, 0, 0, 0, 0)) };
    /// Entries moved and segments removed by compaction passes.
    static COMPACTED: Cell<(u64, u64)> = const { Cell::new((0, 0)) };
    /// Recoveries that found segments removed by garbage collection.
    static GC_SEEN: Cell<u64> = const { Cell::new(0) };
    /// Segments made by recycling a freed one (then crashed and recovered).
    static RECYCLED: Cell<u64> = const { Cell::new(0) };
    /// Bytes the zeroing task wrote ahead of the tail.
    static ZEROED: Cell<u64> = const { Cell::new(0) };
    /// The seed being run, for messages from inside the workload.
    static SEED: Cell<u64> = const { Cell::new(0) };
    /// Injected faults that fired, by (kind, error).
    static FAULTS: std::cell::RefCell<std::collections::BTreeMap<String, u64>> = Default::default();
}

fn stat(f: impl FnOnce(&mut (u64, u64, u64, u64, u64))) {
    STATS.with(|s| {
        let mut v = s.get();
        f(&mut v);
        s.set(v);
    });
}

fn print_stats(name: &str) {
    let (n, torn, in_rec, lost, kept) = STATS.with(|s| s.get());
    println!(
        "{name}: {n} recoveries, {torn} truncated a torn tail, {in_rec} crashed inside recovery, \
         unacknowledged records: {lost} lost, {kept} recovered"
    );
    println!("{name}: {} recoveries found segments removed by garbage collection", GC_SEEN.with(|g| g.get()));
    println!("{name}: {} segments made by recycling a freed one", RECYCLED.with(|g| g.get()));
    println!("{name}: {} bytes zeroed ahead of the tail", ZEROED.with(|g| g.get()));
    let (moved, removed) = COMPACTED.with(|c| c.get());
    println!("{name}: compaction moved {moved} entries; its checkpoints removed {removed} segments");
    FAULTS.with(|f| {
        if !f.borrow().is_empty() {
            println!("{name}: injected faults that fired: {:?}", f.borrow());
        }
    });
}

/// Verifies and counts what happened to unacknowledged records.
async fn check(model: &Model, log: &EntryLog<SimDisk>, ctx: &str) -> Model {
    let m = model.verify(log, ctx).await;
    check_keys(&m, log, ctx).await;
    // Holes in the segment sequence: garbage collection removed segments.
    let segs = log.segments().await;
    if segs.windows(2).any(|w| w[1].0 != w[0].0 + (64 << 10)) || segs.first().is_some_and(|s| s.0 > 0) {
        GC_SEEN.with(|g| g.set(g.get() + 1));
    }
    stat(|s| {
        s.3 += (model.recs.len() - m.recs.len()) as u64;
        s.4 += (m.recs.len() - model.acked) as u64;
    });
    m
}

async fn reopen(disk: SimDisk, crash_in_recovery: Option<(u64, u64)>, ctx: &str) -> (EntryLog<SimDisk>, SimDisk) {
    let mut disk = disk;
    if let Some((at, seed)) = crash_in_recovery {
        disk.crash_at_op(disk.ops() + at, seed);
        match EntryLog::open_with(disk.clone(), cfg()).await {
            Ok((log, _)) => {
                // Recovery needed fewer operations than `at`: crash later instead.
                let image = disk.crash(seed);
                drop(log);
                disk = image;
            }
            Err(StorageError::Io { .. }) if disk.has_crashed() => {
                stat(|s| s.2 += 1);
                disk = disk.crash(seed);
            }
            Err(e) => panic!("{ctx}: open failed with a non-crash error: {e}"),
        }
    }
    let seen = common::inspect_image(&disk, &cfg().dir);
    match EntryLog::open_with(disk.clone(), cfg()).await {
        Ok((log, rec)) => {
            common::assert_inspector_agrees(&seen, Ok(&rec), ctx);
            stat(|s| {
                s.0 += 1;
                s.1 += (rec.truncated_bytes > 0) as u64;
            });
            (log, disk)
        }
        Err(e) => panic!("{ctx}: recovery failed: {e}"),
    }
}

/// One seed: three rounds of workload, crash, recovery (sometimes crashing
/// again inside recovery), verification; then a clean close and reopen.
async fn one_seed(seed: u64) {
    SEED.with(|s| s.set(seed));
    let mut rng = SimRng::new(seed);
    let steps = 20 + rng.below(100) as usize;
    let mut model = Model::default();

    // Dry run to learn how many disk operations one workload takes.
    let (open_ops, total_ops) = {
        let disk = SimDisk::new();
        let (log, _) = EntryLog::open_with(disk.clone(), cfg()).await.unwrap();
        let open_ops = disk.ops();
        let mut m = Model::default();
        workload(&log, &mut m, &mut rng.clone(), steps, true).await;
        (open_ops, disk.ops())
    };

    // Crashes during the first open are covered by crash_at_every_step and by
    // the crashes inside recovery below.
    let mut disk = SimDisk::new();
    disk.crash_at_op(open_ops + rng.below(total_ops - open_ops + 1), rng.next_u64());
    let (mut log, _) = EntryLog::open_with(disk.clone(), cfg()).await.unwrap();
    for round in 0..3 {
        let ctx = format!("seed {seed} round {round} (replay: MAGNETAR_SEED={seed})");
        let fault = rng.chance(1, 3).then(|| {
            let kind = [FaultKind::Write, FaultKind::Sync, FaultKind::Allocate][rng.below(3) as usize];
            let error = if rng.chance(1, 2) { FaultError::Io } else { FaultError::NoSpace };
            let ahead = if kind == FaultKind::Allocate { 2 } else { 12 };
            disk.fail_nth_with(kind, disk.count(kind) + rng.below(ahead), error);
            (kind, error)
        });
        let fired_before = disk.faults_fired();
        workload(&log, &mut model, &mut rng, steps, true).await;
        if let Some((kind, error)) = fault {
            if disk.faults_fired() > fired_before {
                FAULTS.with(|f| *f.borrow_mut().entry(format!("{kind:?}/{error:?}")).or_default() += 1);
                if kind != FaultKind::Sync && matches!(error, FaultError::NoSpace) {
                    // No space for a segment or for a checkpoint's files
                    // wrote nothing anything refers to: it is tried again,
                    // not a fail-stop (no space for a batch in a segment
                    // still is: basic.rs covers that). A close may still
                    // fail when it needed that space; either way the check
                    // after the crash below finds every acknowledged entry.
                    let _ = log.close().await;
                } else {
                    // Fail-stop: whatever the log did since, it is failed by the
                    // time close returns, and refuses new work. (A failed spare
                    // preallocation surfaces when the spare is needed or at close.)
                    assert!(log.close().await.is_err(), "{ctx}: close succeeded after an injected {kind:?} {error:?}");
                    assert!(log.is_failed(), "{ctx}: not failed after an injected {kind:?} {error:?}");
                    assert!(
                        matches!(log.append(0, Bytes::from_static(b"no")), Err(StorageError::Failed)),
                        "{ctx}: append accepted after fail-stop"
                    );
                }
            }
        }
        let image = disk.crash(rng.next_u64());
        drop(log);
        let in_recovery = rng.chance(1, 3).then(|| (rng.below(12), rng.next_u64()));
        let (log2, d2) = reopen(image, in_recovery, &ctx).await;
        model = check(&model, &log2, &ctx).await;
        disk = d2;
        disk.crash_at_op(disk.ops() + rng.below(total_ops + 1), rng.next_u64());
        log = log2;
    }
    // Finally no crash: clean close, clean reopen without a scan, same data.
    let ctx = format!("seed {seed} final (replay: MAGNETAR_SEED={seed})");
    let image = disk.fork();
    drop(log);
    let (log, _) = EntryLog::open_with(image.clone(), cfg()).await.unwrap();
    let m = model.verify(&log, &ctx).await;
    log.close().await.unwrap();
    drop(log);
    let (log, rec) = EntryLog::open_with(image, cfg()).await.unwrap();
    assert!(rec.clean, "{ctx}: {rec:?}");
    assert_eq!(rec.scanned_bytes, 0);
    m.verify(&log, &ctx).await;
}

#[test]
fn random_crashes() {
    let seeds: Vec<u64> = match common::seed_from_env() {
        Some(s) => vec![s],
        None => {
            let n: u64 = std::env::var("MAGNETAR_SEEDS").ok().and_then(|s| s.parse().ok()).unwrap_or(2000);
            let base = common::fresh_seed();
            println!("random_crashes: {n} seeds from base {base}");
            (0..n).map(|i| base.wrapping_add(i.wrapping_mul(0x9E37_79B9))).collect()
        }
    };
    run(300, move || async move {
        for seed in seeds {
            one_seed(seed).await;
        }
        print_stats("random_crashes");
    });
}

/// A fixed workload, crashed before each of its disk operations in turn.
#[test]
fn crash_at_every_step() {
    run(300, || async {
        let seed = common::seed_from_env().unwrap_or(7);
        println!("crash_at_every_step: workload seed {seed}");
        let steps = 60;
        let total_ops = {
            let disk = SimDisk::new();
            let (log, _) = EntryLog::open_with(disk.clone(), cfg()).await.unwrap();
            let mut m = Model::default();
            workload(&log, &mut m, &mut SimRng::new(seed), steps, false).await;
            log.close().await.unwrap();
            disk.ops()
        };
        assert!(total_ops > 20, "workload too small: {total_ops} ops");
        for n in 0..=total_ops {
            for tear in 0..3u64 {
                let ctx = format!("crash before op {n}/{total_ops}, tear {tear} (workload seed {seed})");
                let disk = SimDisk::new();
                disk.crash_at_op(n, n * 3 + tear);
                let mut model = Model::default();
                match EntryLog::open_with(disk.clone(), cfg()).await {
                    Ok((log, _)) => {
                        workload(&log, &mut model, &mut SimRng::new(seed), steps, false).await;
                        let _ = log.close().await;
                    }
                    Err(StorageError::Io { .. }) => {}
                    Err(e) => panic!("{ctx}: {e}"),
                }
                let image = disk.crash(n * 3 + tear);
                let (log, disk2) = reopen(image, None, &ctx).await;
                let model = check(&model, &log, &ctx).await;
                // Appending after recovery works and survives another crash.
                let a = log.append(9, Bytes::from_static(b"after")).unwrap();
                log.wait_durable(a.lsn).await.unwrap();
                let mut m2 = model.clone();
                m2.recs.push(Rec::Entry { ledger: 9, entry: a.entry, body: Bytes::from_static(b"after") });
                m2.acked = m2.recs.len();
                let image2 = disk2.crash(tear);
                drop(log);
                let (log2, _) = reopen(image2, None, &ctx).await;
                m2.verify(&log2, &ctx).await;
            }
        }
        println!("crash_at_every_step: {} crash points x 3 tear patterns", total_ops + 1);
        print_stats("crash_at_every_step");
    });
}

/// A deletion that recovery replays (no checkpoint covers it yet) keeps
/// its id refused until one does: a new ledger under the id would write
/// its first index page over the deleted ledger's, which the durable
/// checkpoint still names (seed 1796023584210104839 of `random_crashes`
/// found this through a model that reused the id).
#[test]
fn a_replayed_deletion_refuses_its_id_until_a_checkpoint_covers_it() {
    run(60, || async {
        let disk = SimDisk::new();
        let (log, _) = EntryLog::open_with(disk.clone(), cfg()).await.unwrap();
        let a = log.append(3, Bytes::from_static(b"first")).unwrap();
        log.wait_durable(a.lsn).await.unwrap();
        log.checkpoint().await.unwrap(); // ledger 3's index page 0 is now named by the checkpoint
        let d = log.delete_ledger(3).unwrap();
        log.wait_durable(d).await.unwrap();
        let image = disk.crash(1);
        drop(log);

        let (log, _) = EntryLog::open_with(image.clone(), cfg()).await.unwrap();
        assert!(matches!(log.append(3, Bytes::from_static(b"again")), Err(StorageError::LedgerDeleted { ledger: 3 })));
        // The checkpoint named by the disk still opens (its index page intact).
        let image2 = image.crash(2);
        drop(log);
        let (log, _) = EntryLog::open_with(image2, cfg()).await.unwrap();
        assert!(log.read(3, 0).await.is_err());
        log.checkpoint().await.unwrap();
        // Covered by a checkpoint: the index file is gone, the refusal too.
        let again = log.append(3, Bytes::from_static(b"again")).unwrap();
        assert_eq!(again.entry, 0);
    });
}

/// A workload that recycles segments: ledger 1 fills three segments and is
/// deleted, the checkpoint frees them (two kept for reuse), and ledger 2
/// then rolls into the recycled files, over their stale batches. Returns
/// when done or when the log refuses work.
async fn recycle_workload(log: &EntryLog<SimDisk>, model: &mut Model) {
    async fn ack(log: &EntryLog<SimDisk>, model: &mut Model, lsn: u64) -> bool {
        let ok = log.wait_durable(lsn).await.is_ok();
        if ok {
            model.acked = model.recs.len();
        }
        ok
    }
    let mut last = 0;
    for (ledger, n, len) in [(2u64, 1u64, 100usize), (1, 60, 3000)] {
        for e in 0..n {
            let body = Bytes::from(vec![(ledger * 50 + e % 50) as u8; len]);
            let Ok(a) = log.append(ledger, body.clone()) else { return };
            model.recs.push(Rec::Entry { ledger, entry: a.entry, body });
            last = a.lsn;
            if e % 8 == 7 && !ack(log, model, last).await {
                return;
            }
        }
    }
    if !ack(log, model, last).await {
        return;
    }
    let Ok(lsn) = log.delete_ledger(1) else { return };
    model.recs.push(Rec::Delete { ledger: 1 });
    if !ack(log, model, lsn).await || log.checkpoint().await.is_err() {
        return;
    }
    for e in 1..70u64 {
        let body = Bytes::from(vec![(200 + e % 50) as u8; 2500]);
        let Ok(a) = log.append(2, body.clone()) else { return };
        model.recs.push(Rec::Entry { ledger: 2, entry: a.entry, body });
        if e % 5 == 0 && !ack(log, model, a.lsn).await {
            return;
        }
        last = a.lsn;
    }
    if ack(log, model, last).await {
        let _ = log.checkpoint().await;
    }
}

/// Goal: recycling is crash-safe at every step. `recycle_workload` (which
/// does rename freed segments into place and write over their stale
/// batches) crashed before each of its disk operations in turn, three tear
/// patterns each: recovery returns an acknowledged prefix byte for byte,
/// never mistakes a stale batch for data or for damage, and appending after
/// it survives another crash.
#[test]
fn recycling_crash_at_every_step() {
    run(300, || async {
        let total_ops = {
            let disk = SimDisk::new();
            let (log, _) = EntryLog::open_with(disk.clone(), cfg()).await.unwrap();
            let mut m = Model::default();
            recycle_workload(&log, &mut m).await;
            assert!(log.recycle_stats().1 >= 2, "the workload did not recycle: {:?}", log.recycle_stats());
            log.close().await.unwrap();
            disk.ops()
        };
        let mut torn = 0;
        for n in 0..=total_ops {
            for tear in 0..3u64 {
                let ctx = format!("recycling: crash before op {n}/{total_ops}, tear {tear}");
                let disk = SimDisk::new();
                disk.crash_at_op(n, n * 3 + tear);
                let mut model = Model::default();
                match EntryLog::open_with(disk.clone(), cfg()).await {
                    Ok((log, _)) => {
                        recycle_workload(&log, &mut model).await;
                        let _ = log.close().await;
                    }
                    Err(StorageError::Io { .. }) => {}
                    Err(e) => panic!("{ctx}: {e}"),
                }
                let image = disk.crash(n * 3 + tear);
                let (log, rec) = match EntryLog::open_with(image.clone(), cfg()).await {
                    Ok(x) => x,
                    Err(e) => panic!("{ctx}: recovery failed: {e}"),
                };
                torn += (rec.truncated_bytes > 0) as u64;
                // Only the batch in flight and stale bytes up to the next
                // stale batch are zeroed, never a whole recycled segment.
                assert!(rec.truncated_bytes <= 32 << 10, "{ctx}: {rec:?}");
                let model = model.verify(&log, &ctx).await;
                let a = log.append(9, Bytes::from_static(b"after")).unwrap();
                log.wait_durable(a.lsn).await.unwrap();
                let mut m2 = model.clone();
                m2.recs.push(Rec::Entry { ledger: 9, entry: a.entry, body: Bytes::from_static(b"after") });
                m2.acked = m2.recs.len();
                let image2 = image.crash(tear);
                drop(log);
                let (log2, _) =
                    EntryLog::open_with(image2, cfg()).await.unwrap_or_else(|e| panic!("{ctx}: again: {e}"));
                m2.verify(&log2, &ctx).await;
            }
        }
        println!(
            "recycling_crash_at_every_step: {} crash points x 3 tear patterns, {torn} truncated a torn tail",
            total_ops + 1
        );
    });
}
