//! `DmaDiskFile::read_bytes` when its executor ends with reads in flight.
//! A test binary of its own: it measures the process's resident memory,
//! which other tests running at once would disturb.

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use magnetar_storage::{DiskFile, PAGE_BYTES};

/// Resident memory of this process, in KiB.
fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).expect("VmRSS in /proc/self/status");
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Goal: an executor that ends with `read_bytes` reads in flight (their
/// tasks never awaited) leaves nothing behind once its thread is gone:
/// the reads' buffers (for a registered one, the executor's whole 20 MiB
/// of them) are given back once the kernel is done with them, not leaked.
/// Method: rounds of a thread running an executor that leaves reads in
/// flight, then ends; the process's resident memory after them, against
/// after the first two (which warm up the allocator and glommio).
#[test]
fn read_bytes_in_flight_at_executor_end_leak_nothing() {
    let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let path = tmp.path().join("f");
    let round = |path: std::path::PathBuf| {
        std::thread::spawn(move || {
            let ex = glommio::LocalExecutorBuilder::default().make().expect("glommio executor");
            ex.run(async move {
                let file = std::rc::Rc::new(common::read_bytes_file(&path, 64).await);
                // One read completed, so that the ring exists.
                assert_eq!(file.read_bytes(1, 10).await.unwrap()[..], [1u8, 2, 3, 4, 5, 6, 7, 8, 9, 10]);
                for i in 0..8u64 {
                    let file = file.clone();
                    glommio::spawn_local(async move {
                        let _ = file.read_bytes(i * PAGE_BYTES, 100_000).await;
                    })
                    .detach();
                }
                // The reads are submitted (each task runs to its first wait).
                glommio::executor().yield_now().await;
            });
            drop(ex);
            // The reads complete on the disk meanwhile, if not already.
            std::thread::sleep(std::time::Duration::from_millis(50));
        })
        .join()
        .expect("executor thread");
    };
    // Two first: the allocator keeps a freed arena's memory for the next
    // (glibc raises its mmap threshold on the first free of one).
    round(path.clone());
    round(path.clone());
    let before = rss_kib();
    let rounds = 6;
    for _ in 0..rounds {
        round(path.clone());
    }
    let grown = rss_kib().saturating_sub(before);
    // A leaked arena would be 20 MiB a round (120 MiB before the fix).
    assert!(grown < 40 << 10, "resident memory grew {grown} KiB over {rounds} executors");
}
