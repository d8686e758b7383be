//! The damage recovery cannot tell from a torn write, and cuts silently
//! (docs/reliability.md, "What remains indistinguishable from a torn
//! write"): what it does today, exactly.
//!
//! Each test damages an acknowledged last batch (or removes a segment) the
//! way the document lists, opens the log, and states what recovery reports
//! (`truncated_bytes`, nothing in `dropped` or `rebuilt`), what is served
//! (every acknowledged batch before the damaged one, byte for byte; none of
//! the damaged batch's entries: no byte whose checksum failed), and that
//! the log goes on and survives a crash after it. A test here fails when
//! recovery learns to detect one of these cases: it then moves to
//! `torn.rs`, as a refusal, and the document changes with it.
//!
//! Method: as in `torn.rs`, a log of acknowledged batches on a `SimDisk`,
//! its durable image forked and damaged by hand.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::path::{Path, PathBuf};

use bytes::Bytes;
use common::{run, small_config, Model, Rec};
use magnetar_storage::format::{BatchHeader, BATCH_FLAG_OVER_STALE, BATCH_HEADER_BYTES, RECORD_HEADER_BYTES};
use magnetar_storage::inspect::{ScanMode, ShardImage};
use magnetar_storage::sim::{SimDisk, SimRng};
use magnetar_storage::{CorruptReason, Disk, EntryLog, LogConfig, StorageError};

fn cfg() -> LogConfig {
    let mut c = small_config("/s");
    // Nothing zeroes recycled space ahead of the tail: batches there are
    // written over stale bytes.
    c.zero_ahead_bytes = 0;
    c
}

/// Random bytes with no zero byte (no sector of a record is zero by chance).
fn dense(rng: &mut SimRng, len: usize) -> Bytes {
    Bytes::from((0..len).map(|_| (rng.below(255) + 1) as u8).collect::<Vec<u8>>())
}

/// A batch of this use of its segment file: (file, offset, header).
#[derive(Clone, Debug)]
struct Batch {
    path: PathBuf,
    off: u64,
    h: BatchHeader,
}

/// Every valid batch of this use of each segment file, by log position.
fn batches(disk: &SimDisk) -> Vec<Batch> {
    let mut v = Vec::new();
    for name in disk.names(Path::new("/s/log")) {
        let path = Path::new("/s/log").join(&name);
        let start: u64 = name.trim_end_matches(".seg").parse().unwrap();
        let bytes = disk.contents(&path).unwrap();
        let mut off = 0usize;
        while off + BATCH_HEADER_BYTES <= bytes.len() {
            match BatchHeader::decode(&bytes[off..]) {
                Ok(h) if h.position == start + off as u64 && h.verify_body(&bytes[off..]).is_ok() => {
                    off += h.batch_len as usize;
                    v.push(Batch { path: path.clone(), off: off as u64 - h.batch_len as u64, h });
                }
                _ => break,
            }
        }
    }
    v.sort_by_key(|b| b.h.position);
    v
}

struct Built {
    disk: SimDisk,
    model: Model,
    /// Entries in the last batch.
    last_count: usize,
}

/// Acknowledged batches of three 700-byte entries (ledgers 0 and 1, in
/// turn) until `more` says the log is long enough, then a last batch of
/// `last` on ledger 1. With `recycle`, a ledger filling the first segments
/// is deleted first, so that later segments are recycled files.
async fn build(recycle: bool, more: impl Fn(&[Batch]) -> bool, last: Vec<Bytes>) -> Built {
    let disk = SimDisk::new();
    let (log, _) = common::open_inspected(disk.clone(), cfg()).await.unwrap();
    let mut rng = SimRng::new(17);
    let mut model = Model::default();
    if recycle {
        let mut lsn = 0;
        for _ in 0..150 {
            let body = dense(&mut rng, 1000);
            let a = log.append(9, body.clone()).unwrap();
            model.recs.push(Rec::Entry { ledger: 9, entry: a.entry, body });
            lsn = a.lsn;
        }
        log.wait_durable(lsn).await.unwrap();
        log.checkpoint().await.unwrap();
        let lsn = log.delete_ledger(9).unwrap();
        model.recs.push(Rec::Delete { ledger: 9 });
        log.wait_durable(lsn).await.unwrap();
        log.checkpoint().await.unwrap();
        assert_eq!(log.recycle_stats().0, cfg().recycle_segments, "freed segments pooled");
    }
    let mut b = 0u64;
    while more(&batches(&disk)) {
        let mut lsn = 0;
        for _ in 0..3 {
            let ledger = b % 2;
            let body = dense(&mut rng, 700);
            let a = log.append(ledger, body.clone()).unwrap();
            model.recs.push(Rec::Entry { ledger, entry: a.entry, body });
            lsn = a.lsn;
        }
        log.wait_durable(lsn).await.unwrap();
        if b == 1 {
            // What follows is after a checkpoint (recovery scans it).
            log.checkpoint().await.unwrap();
        }
        b += 1;
        assert!(b < 1000, "workload never got long enough");
    }
    let mut lsn = 0;
    let last_count = last.len();
    for body in last {
        let a = log.append(1, body.clone()).unwrap();
        model.recs.push(Rec::Entry { ledger: 1, entry: a.entry, body });
        lsn = a.lsn;
    }
    log.wait_durable(lsn).await.unwrap();
    model.acked = model.recs.len();
    let disk = disk.fork();
    drop(log);
    Built { disk, model, last_count }
}

fn last_batch(disk: &SimDisk) -> Batch {
    batches(disk).pop().unwrap()
}

/// Opens the damaged image: it opens, reports `truncated` bytes cut and
/// nothing dropped or rebuilt, serves every acknowledged record before the
/// last batch and none of the last batch (its entries are not readable);
/// then an append is acknowledged and survives a crash.
async fn expect_cut(disk: SimDisk, b: &Built, truncated: impl Fn(u64) -> bool, ctx: &str) {
    let (log, rec) = common::open_inspected(disk.clone(), cfg()).await.unwrap_or_else(|e| panic!("{ctx}: {e}"));
    assert!(truncated(rec.truncated_bytes), "{ctx}: {rec:?}");
    assert!(rec.dropped.is_empty() && rec.rebuilt.is_empty() && !rec.clean, "{ctx}: {rec:?}");
    let mut want = b.model.clone();
    want.recs.truncate(want.recs.len() - b.last_count);
    want.acked = want.recs.len();
    let got = want.verify(&log, ctx).await;
    assert_eq!(got.recs.len(), want.recs.len(), "{ctx}");
    let n = log.next_entry(1);
    for e in n..n + b.last_count as u64 {
        assert!(log.read(1, e).await.is_err(), "{ctx}: entry 1:{e} of the cut batch is served");
    }
    want.append_crash_verify(log, &disk, cfg(), 1, b"after the cut", &format!("{ctx}, after a crash")).await;
}

/// Goal: bit rot in the records of an acknowledged last batch written into
/// a recycled segment (over stale bytes of its earlier use) is cut as a torn
/// tail: a tear there leaves old, non-zero sectors, so no unwritten sector
/// tells a tear from rot. The same rot in a fresh segment is refused
/// (`flipped_bit_in_complete_last_batch_fails_open` in `torn.rs`).
#[test]
fn rot_in_last_batch_of_a_recycled_segment_is_cut() {
    run(60, || async {
        // Until the tail is in a recycled file (its batches say so).
        let over_stale = |bs: &[Batch]| bs.last().is_some_and(|b| b.h.flags & BATCH_FLAG_OVER_STALE != 0);
        let b = build(true, |bs| !over_stale(bs), vec![Bytes::from(vec![0x5a; 2000])]).await;
        let last = last_batch(&b.disk);
        assert!(last.h.flags & BATCH_FLAG_OVER_STALE != 0, "{last:?}");
        let at = last.off + (BATCH_HEADER_BYTES + RECORD_HEADER_BYTES + 1500) as u64;
        let byte = b.disk.contents(&last.path).unwrap()[at as usize] ^ 0x10;
        let d = b.disk.fork();
        d.damage(&last.path, at, &[byte]);
        // The cut zeroes the batch and the stale bytes after it up to the
        // next whole stale batch, never the rest of the file.
        let cut = |t: u64| t >= last.h.batch_len as u64 && last.off + t < 64 << 10;
        expect_cut(d, &b, cut, "rot in a recycled segment").await;
    });
}

/// Goal: an acknowledged last batch whose records hold a whole aligned
/// 512-byte sector of zeros (an entry with zeros in it) and bit rot
/// elsewhere is cut as a torn tail: the zero sector reads as one a tear
/// never wrote. Without the zero sector the same rot is refused.
#[test]
fn rot_in_last_batch_with_a_zero_sector_is_cut() {
    run(60, || async {
        let mut rng = SimRng::new(3);
        let body_off = BATCH_HEADER_BYTES + RECORD_HEADER_BYTES;
        let mut zeroed = dense(&mut rng, 3000).to_vec();
        // Batch bytes 1024..1536: one whole sector.
        zeroed[1024 - body_off..1536 - body_off].fill(0);
        let six = |bs: &[Batch]| bs.len() < 5;
        for (body, cut) in [(zeroed.clone(), true), (dense(&mut rng, 3000).to_vec(), false)] {
            let b = build(false, six, vec![Bytes::from(body)]).await;
            let last = last_batch(&b.disk);
            let at = last.off + 2600;
            let byte = b.disk.contents(&last.path).unwrap()[at as usize] ^ 0x01;
            let d = b.disk.fork();
            d.damage(&last.path, at, &[byte]);
            if cut {
                expect_cut(d, &b, |t| t > 0, "rot beside a zero sector").await;
            } else {
                match common::open_inspected(d, cfg()).await {
                    Err(StorageError::Corrupt { file, offset, reason: CorruptReason::DamagedNotTorn { .. } }) => {
                        assert_eq!((file, offset), (last.path.clone(), last.off))
                    }
                    other => panic!("rot without a zero sector: expected DamagedNotTorn, got {other:?}"),
                }
            }
        }
    });
}

/// Goal: an acknowledged last batch whose header lost its magic, batch
/// number and position at once (more than 16 bits of them differ from the
/// expected, so `header_written_here` says no) is refused when its first
/// record header, in the same sector, is the next entry of a known ledger:
/// that sector was written, so the header rotted (`HeaderDamaged`). When the
/// damage took the first record header too, nothing tells it from a header
/// sector a tear never wrote: cut. (Lighter header damage:
/// `flipped_bit_in_last_batch_header_is_refused` in `torn.rs`.)
#[test]
fn last_header_that_lost_magic_number_and_position() {
    run(60, || async {
        let b = build(false, |bs| bs.len() < 5, vec![Bytes::from(vec![7u8; 1500]); 2]).await;
        let last = last_batch(&b.disk);
        let stray = b"a stray write over the header, 40 bytes".to_vec();
        for (what, garbage) in [("ones", vec![0xffu8; 40]), ("a stray write", stray.clone())] {
            let d = b.disk.fork();
            d.damage(&last.path, last.off, &garbage);
            match common::open_inspected(d.clone(), cfg()).await {
                Err(StorageError::Corrupt { file, offset, reason: CorruptReason::HeaderDamaged { seq } }) => {
                    assert_eq!((file, offset, seq), (last.path.clone(), last.off, last.h.seq), "{what}")
                }
                other => panic!("header overwritten by {what}: expected HeaderDamaged, got {other:?}"),
            }
            // The offline inspector finds the same.
            let tmp = tempfile::tempdir().unwrap();
            d.export(tmp.path()).unwrap();
            match ShardImage::load(&tmp.path().join("s"), ScanMode::Verify, &mut |_, _| {}) {
                Err(StorageError::Corrupt { offset, reason: CorruptReason::HeaderDamaged { .. }, .. }) => {
                    assert_eq!(offset, last.off, "{what}")
                }
                other => panic!("inspect, header overwritten by {what}: expected HeaderDamaged, got {:?}", other.err()),
            }
            // Accepted, the batch is dropped and named.
            let mut accept = cfg();
            accept.accept_data_loss = true;
            let (log, rec) = EntryLog::open_with(d.clone(), accept).await.unwrap();
            assert!(rec.dropped.iter().any(|l| l.contains(&format!("seq {}", last.h.seq))), "{what}: {rec:?}");
            drop(log);
        }
        // The header and the first record header overwritten: cut.
        let d = b.disk.fork();
        let mut garbage = stray.repeat(3);
        garbage.truncate(BATCH_HEADER_BYTES + RECORD_HEADER_BYTES);
        d.damage(&last.path, last.off, &garbage);
        expect_cut(d, &b, |t| t > 0, "header and first record header overwritten").await;
    });
}

/// Goal: the last segment file removed after the checkpoint loses its
/// batches without a word: the scan ends where the previous segment's
/// batches end (nothing to cut), as after a crash before the roll. A
/// segment removed from the middle (a later one still there) is refused.
#[test]
fn last_segment_deleted_after_the_checkpoint() {
    run(60, || async {
        // Batches in three segments (64 KiB each), the checkpoint in the
        // first.
        let three = |bs: &[Batch]| bs.last().is_none_or(|b| b.h.position < 2 * (64 << 10));
        let b = build(false, three, vec![Bytes::from(vec![1u8; 100])]).await;
        let all = batches(&b.disk);
        let last_seg = all.last().unwrap().path.clone();
        let mid_seg = all.iter().find(|x| x.h.position >= 64 << 10).unwrap().path.clone();
        assert_ne!(last_seg, mid_seg);
        let lost: Vec<&Batch> = all.iter().filter(|x| x.path == last_seg).collect();
        // Entries (as records of the model) in the batches of the last file.
        let lost_records: u64 = lost.iter().map(|x| x.h.record_count as u64).sum();

        let d = b.disk.fork();
        d.remove(&last_seg).await.unwrap();
        let (log, rec) = common::open_inspected(d.clone(), cfg()).await.unwrap();
        assert_eq!(rec.truncated_bytes, 0, "{rec:?}");
        assert!(rec.dropped.is_empty() && rec.rebuilt.is_empty(), "{rec:?}");
        let mut want = b.model.clone();
        want.recs.truncate(want.recs.len() - lost_records as usize);
        want.acked = want.recs.len();
        let got = want.verify(&log, "last segment removed").await;
        assert_eq!(got.recs.len(), want.recs.len());
        drop(log);

        let d = b.disk.fork();
        d.remove(&mid_seg).await.unwrap();
        match common::open_inspected(d, cfg()).await {
            Err(e @ StorageError::Corrupt { .. }) => println!("a middle segment removed: {e}"),
            other => panic!("a middle segment removed: expected Corrupt, got {other:?}"),
        }
    });
}
