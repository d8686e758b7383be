//! Torn tails are truncated; damage inside acknowledged data is reported.
//!
//! Method: build a log of several acknowledged batches on a `SimDisk`, fork its
//! durable image, damage the fork in a controlled way (zero or cut the last
//! batch at many byte offsets, zero its last sector, append garbage, flip bits
//! in earlier batches, in the checkpoint, in index pages), then open it.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use common::{run, small_config, Model, Rec};
use magnetar_storage::format::BatchHeader;
use magnetar_storage::sim::{SimDisk, SimRng};
use magnetar_storage::{CorruptReason, EntryLog, LogConfig, StorageError, PAGE_BYTES};

fn cfg() -> LogConfig {
    small_config("/s")
}

struct Built {
    disk: SimDisk,
    model: Model,
    /// (segment path, offset in segment, batch length, records end offset in batch)
    batches: Vec<(PathBuf, u64, u64, u64)>,
    /// Entries in the last batch.
    last_count: usize,
}

/// Random bytes with no zero byte, so no 512-byte sector of a record is all
/// zero (which would make bit rot look like a tear; see docs/format.md).
fn dense_body(rng: &mut SimRng, len: usize) -> Bytes {
    Bytes::from((0..len).map(|_| (rng.below(255) + 1) as u8).collect::<Vec<u8>>())
}

/// Six acknowledged batches; the last holds `last_bodies` entries of `last_len` bytes.
async fn build(last_bodies: usize, last_len: usize) -> Built {
    let disk = SimDisk::new();
    let (log, _) = EntryLog::open_with(disk.clone(), cfg()).await.unwrap();
    let mut rng = SimRng::new(99);
    let mut model = Model::default();
    for b in 0..6 {
        let (n, len) = if b == 5 { (last_bodies, last_len) } else { (3, 700) };
        let mut lsn = 0;
        for _ in 0..n {
            let ledger = b % 2;
            let body = dense_body(&mut rng, len);
            let a = log.append(ledger, body.clone()).unwrap();
            model.recs.push(Rec::Entry { ledger, entry: a.entry, body });
            lsn = a.lsn;
        }
        log.wait_durable(lsn).await.unwrap();
    }
    model.acked = model.recs.len();
    let disk = disk.fork();
    drop(log);
    let mut batches = Vec::new();
    for name in disk.names(Path::new("/s/log")) {
        let path = Path::new("/s/log").join(name);
        let bytes = disk.contents(&path).unwrap();
        let mut off = 0usize;
        while off + 64 <= bytes.len() {
            match BatchHeader::decode(&bytes[off..]) {
                Ok(h) => {
                    batches.push((path.clone(), off as u64, h.batch_len as u64, 64 + h.records_len as u64));
                    off += h.batch_len as usize;
                }
                Err(_) => break,
            }
        }
    }
    assert_eq!(batches.len(), 6);
    Built { disk, model, batches, last_count: last_bodies }
}

/// Opens the damaged disk, expects the whole model or the model without the
/// last batch, checks that, then appends, crashes, reopens and checks again.
async fn expect_recovered(disk: SimDisk, b: &Built, last_present: bool, ctx: &str) {
    let (log, rec) = match EntryLog::open_with(disk.clone(), cfg()).await {
        Ok(x) => x,
        Err(e) => panic!("{ctx}: open failed: {e}"),
    };
    let mut want = b.model.clone();
    if !last_present {
        want.recs.truncate(want.recs.len() - b.last_count);
    }
    want.acked = want.recs.len();
    let got = want.verify(&log, ctx).await;
    assert_eq!(got.recs.len(), want.recs.len(), "{ctx}: {rec:?}");
    // Appending after recovery works and survives another crash.
    let body = Bytes::from_static(b"after recovery");
    let a = log.append(1, body.clone()).unwrap();
    log.wait_durable(a.lsn).await.unwrap();
    want.recs.push(Rec::Entry { ledger: 1, entry: a.entry, body });
    want.acked = want.recs.len();
    let image = disk.crash(a.lsn);
    drop(log);
    let (log, _) = EntryLog::open_with(image, cfg()).await.unwrap();
    want.verify(&log, ctx).await;
}

/// Goal: a last batch whose bytes from offset t on are zero (an unfinished
/// write into a preallocated segment) is truncated, and only it, whenever a
/// whole 512-byte sector of its records is unwritten; a zero run that starts
/// inside the last records sector cannot come from a torn write (devices
/// write sectors atomically) and is reported as damage instead.
#[test]
fn torn_last_batch_zeroed_from_many_offsets() {
    run(120, || async {
        let b = build(3, 1800).await;
        let (seg, pos, len, rec_end) = b.batches[5].clone();
        assert!(len > PAGE_BYTES, "want a multi-page last batch");
        for t in (0..len).step_by(7).chain([len - 1, rec_end - 1, rec_end]) {
            let d = b.disk.fork();
            d.damage(&seg, pos + t, &vec![0u8; (len - t) as usize]);
            let ctx = format!("zeroed from +{t}");
            if t >= rec_end {
                // Zeroing only padding changes nothing: the batch stays valid.
                expect_recovered(d, &b, true, &ctx).await;
            } else if t.div_ceil(512) * 512 < rec_end {
                // A whole records sector is unwritten: a torn write, truncated.
                expect_recovered(d, &b, false, &ctx).await;
            } else {
                // Only part of the last records sector is zero: no device tears
                // inside a sector, so this is damage, refused and reported.
                match EntryLog::open_with(d, cfg()).await {
                    Err(StorageError::Corrupt { offset, reason: CorruptReason::DamagedNotTorn { .. }, .. }) => {
                        assert_eq!(offset, pos, "{ctx}")
                    }
                    other => panic!("{ctx}: expected DamagedNotTorn, got {other:?}"),
                }
            }
        }
    });
}

/// Goal: a segment file cut at any byte of its last batch (the file itself is
/// shorter) loses exactly that batch, and the log continues.
#[test]
fn torn_last_batch_file_cut_at_many_offsets() {
    run(120, || async {
        let b = build(3, 1800).await;
        let (seg, pos, len, _) = b.batches[5].clone();
        for t in (0..=len).step_by(61).chain([len - 1, len]) {
            let d = b.disk.fork();
            d.set_len(&seg, pos + t);
            expect_recovered(d, &b, t == len, &format!("cut at +{t}")).await;
        }
    });
}

/// Goal: a zeroed last sector loses the batch when records reach into it,
/// and changes nothing when it is padding.
#[test]
fn zeroed_last_sector() {
    run(60, || async {
        for (n, body_len) in [(1usize, 3900usize), (3, 3000)] {
            let b = build(n, body_len).await;
            let (seg, pos, len, rec_end) = b.batches[5].clone();
            let d = b.disk.fork();
            d.damage(&seg, pos + len - 512, &[0u8; 512]);
            let present = rec_end <= len - 512;
            expect_recovered(d, &b, present, &format!("last sector, {n} x {body_len}")).await;
        }
    });
}

/// Goal: garbage after the last batch (never written by us) is zeroed and the
/// data before it kept, also when the garbage starts with a batch magic.
#[test]
fn garbage_after_tail_is_truncated() {
    run(60, || async {
        let b = build(3, 700).await;
        let (seg, pos, len, _) = b.batches[5].clone();
        let mut rng = SimRng::new(5);
        for (skip, magic) in [(0u64, false), (0, true), (3 * PAGE_BYTES, false)] {
            let d = b.disk.fork();
            let mut g: Vec<u8> = (0..10_000).map(|_| rng.next_u64() as u8).collect();
            if magic {
                g[..8].copy_from_slice(b"MGNTBAT1");
            }
            d.damage(&seg, pos + len + skip, &g);
            let (log, rec) = EntryLog::open_with(d.clone(), cfg()).await.unwrap();
            assert!(rec.truncated_bytes >= 10_000, "{rec:?}");
            drop(log);
            expect_recovered(d, &b, true, &format!("garbage +{skip} magic {magic}")).await;
        }
    });
}

/// Goal: a flipped bit in an earlier, acknowledged batch makes `open` fail
/// with Corrupt naming the segment and the damaged batch's offset.
#[test]
fn flipped_bit_in_earlier_batch_fails_open() {
    run(60, || async {
        let b = build(3, 700).await;
        for k in 0..5 {
            let (seg, pos, _, rec_end) = b.batches[k].clone();
            for at in [20, 70, rec_end - 1] {
                let d = b.disk.fork();
                let byte = d.contents(&seg).unwrap()[(pos + at) as usize] ^ 0x04;
                d.damage(&seg, pos + at, &[byte]);
                match EntryLog::open_with(d, cfg()).await {
                    Err(StorageError::Corrupt { file, offset, reason }) => {
                        assert_eq!(file, seg, "batch {k} +{at}");
                        assert_eq!(offset, pos, "batch {k} +{at}: {reason}");
                    }
                    other => panic!("batch {k} +{at}: expected Corrupt, got {other:?}"),
                }
            }
        }
    });
}

/// Goal: a complete last batch with a flipped bit among its records is not a
/// torn write (no sector is unwritten): refused, not silently dropped.
#[test]
fn flipped_bit_in_complete_last_batch_fails_open() {
    run(60, || async {
        let b = build(1, 3900).await;
        let (seg, pos, _, rec_end) = b.batches[5].clone();
        let d = b.disk.fork();
        let at = pos + rec_end - 100;
        let byte = d.contents(&seg).unwrap()[at as usize] ^ 0x80;
        d.damage(&seg, at, &[byte]);
        match EntryLog::open_with(d, cfg()).await {
            Err(StorageError::Corrupt { file, offset, reason: CorruptReason::DamagedNotTorn { .. } }) => {
                assert_eq!(file, seg);
                assert_eq!(offset, pos);
            }
            other => panic!("expected Corrupt DamagedNotTorn, got {other:?}"),
        }
    });
}

/// Goal: damage in the checkpoint or in an index page it refers to is
/// reported with the file and offset, not papered over.
#[test]
fn damaged_checkpoint_or_index_page_fails_open() {
    run(60, || async {
        let b = build(3, 700).await;
        let (log, _) = EntryLog::open_with(b.disk.clone(), cfg()).await.unwrap();
        log.close().await.unwrap();
        drop(log);
        let ckpt = Path::new("/s/checkpoint");
        let idx = Path::new("/s/index/00000000000000000001.idx");
        for (file, at) in [(ckpt, 40u64), (idx, 100), (idx, 8)] {
            let d = b.disk.fork();
            let byte = d.contents(file).unwrap()[at as usize] ^ 1;
            d.damage(file, at, &[byte]);
            match EntryLog::open_with(d, cfg()).await {
                Err(StorageError::Corrupt { file: f, offset, .. }) => {
                    assert_eq!(f, file);
                    assert_eq!(offset, 0);
                }
                other => panic!("{}: expected Corrupt, got {other:?}", file.display()),
            }
        }
        // Undamaged: clean open, everything there.
        let (log, rec) = EntryLog::open_with(b.disk.fork(), cfg()).await.unwrap();
        assert!(rec.clean);
        b.model.verify(&log, "clean").await;
    });
}
