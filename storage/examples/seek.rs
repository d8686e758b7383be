//! Seek-by-time latency on a large ledger: appends COUNT tiny entries to one
//! ledger with non-decreasing publish times (`append` of a `NewEntry` with `IndexExtras`,
//! four entries per millisecond so that equal times occur), then times
//! `EntryLog::seek_time` for SAMPLES random target times (some before the
//! first and after the last publish time) and prints p50/p99/p999/max in
//! nanoseconds. Each answer is checked against the index outside the timed
//! call: the entry found has publish time >= target, the one before < target.
//!
//!     cargo run --release -p magnetar-storage --example seek [COUNT] [SAMPLES] [DIR]
//!
//! Defaults: 10000000 entries of 8 bytes, 100000 samples, a temporary
//! directory under $TMPDIR. The random targets come from a seed printed at
//! start; `MAGNETAR_SEED=<n>` replays it. `seek_time` only searches the
//! in-memory index, so the appends are the slow part (the log is written
//! with fdatasync like any other).

#![allow(clippy::unwrap_used)] // a measuring tool: fail loudly

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use magnetar_storage::{EntryLog, IndexExtras, LogConfig, NewEntry};

/// xorshift64*: enough for picking targets, and replayable from the seed.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let count: u64 = args.get(1).map_or(10_000_000, |s| s.parse().unwrap());
    let samples: usize = args.get(2).map_or(100_000, |s| s.parse().unwrap());
    let tmp = tempfile::tempdir().unwrap();
    let dir = args.get(3).map_or_else(|| tmp.path().join("shard-0"), std::path::PathBuf::from);
    let seed = std::env::var("MAGNETAR_SEED").map_or_else(
        |_| SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_nanos() as u64 | 1,
        |s| s.parse().unwrap(),
    );
    println!("seek: seed {seed} (MAGNETAR_SEED={seed} replays the targets)");
    glommio::LocalExecutorBuilder::default().make().unwrap().run(async move {
        const LEDGER: u64 = 3;
        const BASE_MS: u64 = 1_700_000_000_000;
        let mut cfg = LogConfig::new(&dir);
        // The write cache bound counts body bytes only; with 8-byte bodies the
        // default would keep tens of millions of entries (and their map
        // overhead) in memory, which is not what is measured here.
        cfg.write_cache_bytes = 1 << 20;
        let (log, _) = EntryLog::open(cfg).await.unwrap();
        let t0 = Instant::now();
        let body = Bytes::from_static(b"12345678");
        let chunk = 100_000;
        let mut i = 0;
        while i < count {
            let mut last = 0;
            for j in i..(i + chunk).min(count) {
                let extras = IndexExtras { publish_time_ms: BASE_MS + j / 4, key_hash: 0, tag_hash: 0 };
                last = log.append(LEDGER, NewEntry::new(body.clone()).extras(extras)).unwrap().lsn;
            }
            log.wait_durable(last).await.unwrap();
            i += chunk;
        }
        println!("seek: appended {count} entries in {:.1} s", t0.elapsed().as_secs_f64());
        assert_eq!(log.next_entry(LEDGER), count);

        let mut rng = Rng(seed);
        let span = count / 4 + 2000;
        let mut ns = Vec::with_capacity(samples);
        let mut checksum = 0u64;
        for _ in 0..samples {
            // From 1000 ms before the first publish time to ~1000 ms after the last.
            let target = BASE_MS - 1000 + rng.next() % span;
            let t = Instant::now();
            let found = log.seek_time(LEDGER, target).await.unwrap();
            ns.push(t.elapsed().as_nanos() as u64);
            checksum = checksum.wrapping_add(found);
            // The answer is the partition point: checked outside the timing.
            if found < count {
                assert!(log.index_entry(LEDGER, found).await.unwrap().unwrap().extras.publish_time_ms >= target);
            }
            if found > 0 {
                assert!(log.index_entry(LEDGER, found - 1).await.unwrap().unwrap().extras.publish_time_ms < target);
            }
        }
        log.close().await.unwrap();
        // On a shared machine the max is usually a preemption, not the search:
        // say how many samples were that slow and whether the first (cold) one was.
        let slow = ns.iter().filter(|&&n| n > 100_000).count();
        let first = ns[0];
        ns.sort_unstable();
        let p = |q: f64| ns[((ns.len() as f64 * q) as usize).min(ns.len() - 1)];
        println!(
            "seek: seek_time on {count} entries, {samples} random targets: ns p50 {} p99 {} p999 {} max {}; \
             {slow} over 100 us, first (cold) {first} (sum of answers {checksum})",
            p(0.5),
            p(0.99),
            p(0.999),
            ns[ns.len() - 1]
        );
    });
}
