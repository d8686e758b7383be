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
    let (log, _) = common::open_inspected(disk.clone(), cfg()).await.unwrap();
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
    let (log, rec) = match common::open_inspected(disk.clone(), cfg()).await {
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
    want.append_crash_verify(log, &disk, cfg(), 1, b"after recovery", ctx).await;
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
            let header = b.disk.contents(&seg).unwrap()[pos as usize..pos as usize + 64].to_vec();
            d.damage(&seg, pos + t, &vec![0u8; (len - t) as usize]);
            let ctx = format!("zeroed from +{t}");
            if t > 0 && header.get(t as usize..).is_some_and(|h| h.iter().any(|&x| x != 0)) {
                // Zeros from inside the header's sector on: no tear does that
                // (a sector lands whole). With the magic intact (t >= 8) the
                // header's seq and position say it was written here:
                // refused as `HeaderDamaged`. With most of the magic gone it
                // reads as an unwritten header (docs/format.md).
                match common::open_inspected(d.clone(), cfg()).await {
                    Err(StorageError::Corrupt { offset, reason: CorruptReason::HeaderDamaged { seq: 5 }, .. }) => {
                        assert_eq!(offset, pos, "{ctx}")
                    }
                    Ok(_) if t < 8 => expect_recovered(d, &b, false, &ctx).await,
                    other => panic!("{ctx}: expected HeaderDamaged, got {other:?}"),
                }
            } else if t >= rec_end {
                // Zeroing only padding changes nothing: the batch stays valid.
                expect_recovered(d, &b, true, &ctx).await;
            } else if t.div_ceil(512) * 512 < rec_end {
                // A whole records sector is unwritten: a torn write, truncated.
                expect_recovered(d, &b, false, &ctx).await;
            } else {
                // Only part of the last records sector is zero: no device tears
                // inside a sector, so this is damage, refused and reported.
                match common::open_inspected(d, cfg()).await {
                    Err(StorageError::Corrupt { offset, reason: CorruptReason::DamagedNotTorn { .. }, .. }) => {
                        assert_eq!(offset, pos, "{ctx}")
                    }
                    other => panic!("{ctx}: expected DamagedNotTorn, got {other:?}"),
                }
            }
        }
    });
}

/// Goal (issue #17 item 5): a segment file cut at any byte of its last
/// batch, or just after it, is refused (a crash cannot shrink a
/// preallocated segment, so the cut may have taken acknowledged batches),
/// naming the file, the offset of the cut and the missing bytes; with
/// `accept_data_loss` the log opens without what was cut, says so in
/// `Recovery::dropped`, and goes on.
#[test]
fn truncated_segment_is_refused_unless_accepted() {
    run(120, || async {
        let b = build(3, 1800).await;
        let (seg, pos, len, _) = b.batches[5].clone();
        for t in (0..=len).step_by(61).chain([len - 1, len]) {
            let d = b.disk.fork();
            d.set_len(&seg, pos + t);
            let ctx = format!("cut at +{t}");
            let cut = (pos + t) / PAGE_BYTES * PAGE_BYTES;
            match common::open_inspected(d.clone(), cfg()).await {
                Err(e @ StorageError::Corrupt { .. }) => {
                    assert!(e.is_acceptable_loss(), "{ctx}: {e}");
                    let StorageError::Corrupt { file, offset, reason } = &e else { unreachable!() };
                    assert_eq!(file, &seg, "{ctx}");
                    assert_eq!(*offset, cut, "{ctx}");
                    assert!(matches!(reason, CorruptReason::SegmentTruncated { len, .. } if *len == cut), "{ctx}: {e}");
                    assert!(e.to_string().contains("missing"), "{ctx}: {e}");
                }
                other => panic!("{ctx}: expected SegmentTruncated, got {other:?}"),
            }
            let mut accept = cfg();
            accept.accept_data_loss = true;
            let (log, rec) = EntryLog::open_with(d.clone(), accept.clone()).await.unwrap();
            assert!(rec.dropped.iter().any(|l| l.contains(&seg.display().to_string())), "{ctx}: {rec:?}");
            drop(log);
            // What was accepted stays accepted: the next open finds the log
            // as it was cut (the segment is shorter, its batches say so).
            let mut want = b.model.clone();
            if t < len {
                want.recs.truncate(want.recs.len() - b.last_count);
            }
            want.acked = want.recs.len();
            let (log, _) = EntryLog::open_with(d.clone(), accept).await.unwrap();
            want.verify(&log, &ctx).await;
        }
    });
}

/// Goal (issue #17 item 5): a segment cut inside an earlier batch (data
/// synced long before) is refused too; accepted, the log keeps exactly the
/// batches before the cut and names the batches it dropped.
#[test]
fn truncation_inside_earlier_batch() {
    run(60, || async {
        let b = build(3, 700).await;
        let (seg, pos, _, _) = b.batches[2].clone();
        let d = b.disk.fork();
        d.set_len(&seg, pos + 100);
        match common::open_inspected(d.clone(), cfg()).await {
            Err(StorageError::Corrupt { reason: CorruptReason::SegmentTruncated { .. }, file, .. }) => {
                assert_eq!(file, seg)
            }
            other => panic!("expected SegmentTruncated, got {other:?}"),
        }
        let mut accept = cfg();
        accept.accept_data_loss = true;
        let (log, rec) = EntryLog::open_with(d.clone(), accept).await.unwrap();
        assert!(!rec.dropped.is_empty(), "{rec:?}");
        let mut want = b.model.clone();
        want.recs.truncate(2 * 3);
        want.acked = want.recs.len();
        want.verify(&log, "cut in batch 2").await;
        // The log goes on after the cut, and that survives a crash.
        want.append_crash_verify(log, &d, cfg(), 0, b"after the cut", "after the cut").await;
    });
}

/// Goal (issue #17 item 5): any single flipped bit in the last batch's
/// 64-byte header (its header checksum then fails, as after a torn write of
/// that sector) is refused as `HeaderDamaged` naming the file and the
/// batch's offset: the rest of the header says it was written there whole,
/// which a tear cannot do. Accepted, the batch is dropped and named.
#[test]
fn flipped_bit_in_last_batch_header_is_refused() {
    run(120, || async {
        let b = build(3, 700).await;
        let (seg, pos, _, _) = b.batches[5].clone();
        for bit in (0..64 * 8).step_by(3).chain([7, 64 * 8 - 1]) {
            let d = b.disk.fork();
            let at = pos + bit / 8;
            let byte = d.contents(&seg).unwrap()[at as usize] ^ (1 << (bit % 8));
            d.damage(&seg, at, &[byte]);
            let ctx = format!("header bit {bit}");
            match common::open_inspected(d.clone(), cfg()).await {
                Err(e @ StorageError::Corrupt { reason: CorruptReason::HeaderDamaged { seq: 5 }, .. }) => {
                    let StorageError::Corrupt { file, offset, .. } = &e else { unreachable!() };
                    assert_eq!((file, *offset), (&seg, pos), "{ctx}");
                    assert!(e.is_acceptable_loss());
                }
                other => panic!("{ctx}: expected HeaderDamaged, got {other:?}"),
            }
            if bit % 48 == 0 {
                let mut accept = cfg();
                accept.accept_data_loss = true;
                let (log, rec) = EntryLog::open_with(d.clone(), accept).await.unwrap();
                assert!(rec.dropped.iter().any(|l| l.contains("seq 5")), "{ctx}: {rec:?}");
                drop(log);
                expect_recovered(d, &b, false, &ctx).await;
            }
        }
        // A header sector that never landed (zeros) is still a tear.
        let d = b.disk.fork();
        d.damage(&seg, pos, &[0u8; 512]);
        expect_recovered(d, &b, false, "header sector unwritten").await;
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
            let (log, rec) = common::open_inspected(d.clone(), cfg()).await.unwrap();
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
                match common::open_inspected(d, cfg()).await {
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
        match common::open_inspected(d, cfg()).await {
            Err(StorageError::Corrupt { file, offset, reason: CorruptReason::DamagedNotTorn { .. } }) => {
                assert_eq!(file, seg);
                assert_eq!(offset, pos);
            }
            other => panic!("expected Corrupt DamagedNotTorn, got {other:?}"),
        }
    });
}

/// Goal (issue #17 item 5): damage in the checkpoint or in an index page
/// it refers to does not stop the log from opening: the checkpoint comes
/// from its copy (or, both damaged, from the whole log), the index from the
/// log, each named in `Recovery::rebuilt`; everything is there, and the
/// files are written afresh (the next open has nothing to rebuild).
#[test]
fn damaged_checkpoint_or_index_page_is_rebuilt() {
    run(60, || async {
        let b = build(3, 700).await;
        let (log, _) = EntryLog::open_with(b.disk.clone(), cfg()).await.unwrap();
        log.close().await.unwrap();
        drop(log);
        let ckpt = Path::new("/s/checkpoint");
        let copy = Path::new("/s/checkpoint.copy");
        let idx = Path::new("/s/index/00000000000000000001.idx");
        let cases: &[&[(&Path, u64)]] =
            &[&[(ckpt, 40)], &[(copy, 40)], &[(ckpt, 40), (copy, 70)], &[(idx, 100)], &[(idx, 8)], &[(idx, 4096 + 9)]];
        for damage in cases {
            let d = b.disk.fork();
            let mut names = Vec::new();
            for (file, at) in damage.iter() {
                let Some(bytes) = d.contents(file) else { continue };
                if *at as usize >= bytes.len() {
                    continue;
                }
                d.damage(file, *at, &[bytes[*at as usize] ^ 1]);
                names.push(file.display().to_string());
            }
            let ctx = format!("{names:?}");
            let (log, rec) = match common::open_inspected(d.clone(), cfg()).await {
                Ok(x) => x,
                Err(e) => panic!("{ctx}: open failed: {e}"),
            };
            if names.iter().any(|n| n.ends_with("checkpoint") || n.ends_with(".idx")) {
                assert!(!rec.rebuilt.is_empty(), "{ctx}: {rec:?}");
            }
            b.model.verify(&log, &ctx).await;
            log.close().await.unwrap();
            drop(log);
            let (log, rec) = common::open_inspected(d.clone(), cfg()).await.unwrap();
            assert!(rec.rebuilt.is_empty() && rec.clean, "{ctx}: second open {rec:?}");
            b.model.verify(&log, &ctx).await;
        }
    });
}

/// Goal: a segment cut by hand before the checkpoint position lost batches
/// the checkpoint vouches for: recovery refuses it (`CheckpointBeyondLog`,
/// never an acceptable loss), and so does the inspector in both modes (it
/// used to check only the segments its tail scan reads, and said nothing).
#[test]
fn segment_truncated_before_the_checkpoint_is_refused_by_both() {
    run(60, || async {
        let disk = SimDisk::new();
        let (log, _) = common::open_inspected(disk.clone(), cfg()).await.unwrap();
        let mut rng = SimRng::new(5);
        // Three 64 KiB segments' worth, then a checkpoint in the last.
        for i in 0..60u64 {
            let a = log.append(i % 3, dense_body(&mut rng, 3000)).unwrap();
            log.wait_durable(a.lsn).await.unwrap();
        }
        log.checkpoint().await.unwrap();
        let d = disk.fork();
        drop(log);
        let first = Path::new("/s/log").join(d.names(Path::new("/s/log")).into_iter().min().unwrap());
        d.set_len(&first, 2 * PAGE_BYTES);
        match common::open_inspected(d, cfg()).await {
            Err(e @ StorageError::Corrupt { reason: CorruptReason::CheckpointBeyondLog { .. }, .. }) => {
                assert!(!e.is_acceptable_loss(), "{e}")
            }
            other => panic!("expected CheckpointBeyondLog, got {other:?}"),
        }
    });
}
