//! Opens (recovers) a shard directory and prints what recovery did and how
//! long it took: the restart-time measurement.
//!
//!     cargo run --release -p magnetar-storage --example recover DIR
//!
//! Pair with `MAGNETAR_APPEND_ABORT=1 ... --example append COUNT SIZE IN_FLIGHT DIR`
//! (dies without a checkpoint or clean-shutdown marker, like kill -9).

#![allow(clippy::unwrap_used)] // a measuring tool: fail loudly

use std::time::Instant;

use magnetar_storage::{EntryLog, LogConfig};

fn main() {
    let dir = std::env::args().nth(1).expect("usage: recover DIR");
    glommio::LocalExecutorBuilder::default().make().unwrap().run(async move {
        let t0 = Instant::now();
        let (log, rec) = EntryLog::open(LogConfig::new(&dir)).await.unwrap();
        let open_s = t0.elapsed().as_secs_f64();
        let entries: u64 = rec.ledgers.iter().map(|(_, n)| n).sum();
        println!(
            "recover: {} in {:.3} s (clean {}, scanned {:.1} MiB, replayed {} entries, truncated {} B); {} entries in {} ledgers",
            dir,
            open_s,
            rec.clean,
            rec.scanned_bytes as f64 / (1 << 20) as f64,
            rec.entries_replayed,
            rec.truncated_bytes,
            entries,
            rec.ledgers.len()
        );
        let t1 = Instant::now();
        log.close().await.unwrap();
        let (_, rec2) = EntryLog::open(LogConfig::new(&dir)).await.unwrap();
        println!(
            "recover: after a clean close, reopen in {:.3} s (clean {}, scanned {} B); close took {:.3} s",
            rec2.elapsed.as_secs_f64(),
            rec2.clean,
            rec2.scanned_bytes,
            t1.elapsed().as_secs_f64() - rec2.elapsed.as_secs_f64()
        );
    });
}
