//! Append throughput and latency of the entry log on the real disk (glommio
//! DMA, fdatasync per group commit). Zero required arguments:
//!
//!     cargo run --release -p magnetar-storage --example append [COUNT] [SIZE] [IN_FLIGHT] [DIR]
//!
//! Defaults: 200000 entries of 1024 bytes, 256 appends waiting at a time, in a
//! temporary directory under $TMPDIR. Prints entries/s, MB/s, fdatasyncs and
//! latency percentiles from append to `wait_durable` returning. With
//! `MAGNETAR_APPEND_ABORT=1` it aborts after the last receipt instead of
//! closing (what kill -9 leaves), for `examples/recover.rs` to time.

#![allow(clippy::unwrap_used)] // a measuring tool: fail loudly

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Instant;

use bytes::Bytes;
use magnetar_storage::{EntryLog, LogConfig};

fn main() {
    let args: Vec<String> = std::env::args().collect();
    let count: usize = args.get(1).map_or(200_000, |s| s.parse().unwrap());
    let size: usize = args.get(2).map_or(1024, |s| s.parse().unwrap());
    let in_flight: usize = args.get(3).map_or(256, |s| s.parse().unwrap());
    let tmp = tempfile::tempdir().unwrap();
    let dir = args.get(4).map_or_else(|| tmp.path().join("shard-0"), std::path::PathBuf::from);
    glommio::LocalExecutorBuilder::default().make().unwrap().run(async move {
        let (log, _) = EntryLog::open(LogConfig::new(&dir)).await.unwrap();
        let body = Bytes::from(vec![b'x'; size]);
        let lat: Rc<RefCell<Vec<u32>>> = Rc::new(RefCell::new(Vec::with_capacity(count)));
        let sem = Rc::new(glommio::sync::Semaphore::new(in_flight as u64));
        let started = Instant::now();
        let mut tasks = Vec::new();
        for i in 0..count {
            let permit = sem.clone().acquire_static_permit(1).await.unwrap();
            let t0 = Instant::now();
            let a = log.append((i % 8) as u64, body.clone()).unwrap();
            let (log, lat) = (log.clone(), lat.clone());
            tasks.push(glommio::spawn_local(async move {
                log.wait_durable(a.lsn).await.unwrap();
                lat.borrow_mut().push(t0.elapsed().as_micros() as u32);
                drop(permit);
            }));
        }
        for t in tasks {
            t.await;
        }
        let secs = started.elapsed().as_secs_f64();
        if std::env::var_os("MAGNETAR_APPEND_ABORT").is_some() {
            // For recovery measurements: die like kill -9 after the last
            // receipt (no checkpoint, no clean-shutdown marker).
            println!("append: {count} x {size} B durable in {secs:.2} s; aborting without close");
            std::process::abort();
        }
        log.close().await.unwrap();
        let mut l = lat.borrow_mut();
        l.sort_unstable();
        let p = |q: f64| l[((l.len() as f64 * q) as usize).min(l.len() - 1)];
        println!(
            "append: {count} x {size} B, {in_flight} in flight: {:.0} entries/s, {:.1} MB/s, \
                 latency us p50 {} p99 {} p999 {} max {}",
            count as f64 / secs,
            (count * size) as f64 / secs / 1e6,
            p(0.5),
            p(0.99),
            p(0.999),
            l[l.len() - 1]
        );
    });
}
