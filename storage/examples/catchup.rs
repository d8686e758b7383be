//! Catch-up read throughput of a backlog that is not in memory: writes COUNT
//! entries of SIZE bytes into one ledger, closes the log, reopens it (so the
//! write cache is empty and every read goes to disk through O_DIRECT), then
//! reads every entry in order, one at a time, as a catch-up reader does, and
//! times that read.
//!
//!     cargo run --release -p magnetar-storage --example catchup [COUNT] [SIZE] [DIR] [READ_AHEAD]
//!
//! Defaults: 1048576 entries of 1024 bytes (1 GiB of payload) in a temporary
//! directory under $TMPDIR, read-ahead 1 MiB (`LogConfig::read_ahead_bytes`;
//! 0 turns read-ahead off). Every body read is checked (length and the entry
//! id stamped in its first bytes) inside the timed loop, as a consumer would
//! touch the bytes. Prints entries/s, MB/s of payload and the read-cache
//! counters; `bench/scripts/catchup_vs_fio.sh` puts it beside fio.

#![allow(clippy::unwrap_used)] // a measuring tool: fail loudly

use std::time::Instant;

use bytes::Bytes;
use magnetar_storage::{EntryLog, LogConfig};

/// The body of entry `i`: its index in the first 8 bytes (so a read of the
/// wrong entry is caught), the rest filler.
fn body(i: u64, size: usize) -> Bytes {
    let mut b = vec![b'x'; size];
    let n = size.min(8);
    b[..n].copy_from_slice(&i.to_le_bytes()[..n]);
    Bytes::from(b)
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let count: u64 = args.get(1).map_or(1 << 20, |s| s.parse().unwrap());
    let size: usize = args.get(2).map_or(1024, |s| s.parse().unwrap());
    let tmp = tempfile::tempdir().unwrap();
    let dir = args.get(3).map_or_else(|| tmp.path().join("shard-0"), std::path::PathBuf::from);
    let read_ahead: usize = args.get(4).map_or(1 << 20, |s| s.parse().unwrap());
    glommio::LocalExecutorBuilder::default().make().unwrap().run(async move {
        const LEDGER: u64 = 7;
        // Write: bounded batches of appends, each batch awaited durable, so
        // the pending bytes stay bounded without a task per entry.
        let (log, _) = EntryLog::open(LogConfig::new(&dir)).await.unwrap();
        let t0 = Instant::now();
        let chunk = ((8 << 20) / size.max(1)).max(1) as u64;
        let mut i = 0;
        while i < count {
            let mut last = 0;
            for j in i..(i + chunk).min(count) {
                last = log.append(LEDGER, body(j, size)).unwrap().lsn;
            }
            log.wait_durable(last).await.unwrap();
            i += chunk;
        }
        log.close().await.unwrap();
        let wsecs = t0.elapsed().as_secs_f64();
        println!(
            "catchup: wrote {count} x {size} B ({:.0} MiB) in {wsecs:.2} s ({:.1} MB/s)",
            (count as f64 * size as f64) / (1 << 20) as f64,
            count as f64 * size as f64 / wsecs / 1e6
        );

        // Reopen: a clean close, so no scan; the write cache starts empty.
        let mut cfg = LogConfig::new(&dir);
        cfg.read_ahead_bytes = read_ahead;
        let (log, rec) = EntryLog::open(cfg).await.unwrap();
        assert!(rec.clean, "the reopen after close must be clean");
        assert_eq!(log.next_entry(LEDGER), count);
        let t0 = Instant::now();
        let mut bytes = 0u64;
        for e in 0..count {
            let b = log.read(LEDGER, e).await.unwrap();
            assert_eq!(b.len(), size, "entry {e}");
            let n = size.min(8);
            assert_eq!(b[..n], e.to_le_bytes()[..n], "entry {e} holds another entry's body");
            bytes += b.len() as u64;
        }
        let secs = t0.elapsed().as_secs_f64();
        let (hits, disk) = log.read_stats();
        log.close().await.unwrap();
        println!(
            "catchup: read {count} x {size} B in order after reopen, read-ahead {read_ahead} B: \
             {secs:.2} s, {:.0} entries/s, {:.1} MB/s; {disk} disk reads, {hits} read-cache hits",
            count as f64 / secs,
            bytes as f64 / secs / 1e6
        );
    });
}
