//! A real `kill -9` of a process appending through the production backend.
//!
//! Goal: every append whose `wait_durable` returned before SIGKILL is found
//! after restart, in order, byte for byte, exactly once.
//!
//! Method: the test re-runs its own binary as a child (`MAGNETAR_STORAGE_CHILD`
//! names the directory). The child appends entry `i` (ledger `i % 4`, body a
//! pure function of `i`) forever with many appends in flight, and prints
//! `acked <i>` once `wait_durable` for it returned. The parent kills it with
//! SIGKILL at a random moment, opens the log itself, checks it, and repeats;
//! each child continues from what was recovered. Seeded (printed; replay with
//! `MAGNETAR_SEED`).

#![allow(clippy::unwrap_used)] // tests may unwrap

mod common;

use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use magnetar_storage::sim::SimRng;
use magnetar_storage::{EntryLog, LogConfig};

const LEDGERS: u64 = 4;

fn body(i: u64) -> Bytes {
    let mut v = format!("{i}:").into_bytes();
    v.resize(8 + (i * 7919 % 3000) as usize, b'x');
    Bytes::from(v)
}

fn config(dir: &std::path::Path) -> LogConfig {
    let mut c = LogConfig::new(dir);
    c.segment_bytes = 4 << 20;
    c.flush_bytes_max = 256 << 10;
    c.write_cache_bytes = 1 << 20;
    c.checkpoint_interval = Duration::from_millis(300);
    c.allow_tmpfs = true;
    c
}

fn child(dir: String) {
    common::run(600, move || async move {
        let (log, rec) = EntryLog::open(config(std::path::Path::new(&dir))).await.unwrap();
        let mut i: u64 = rec.ledgers.iter().map(|(_, n)| n).sum();
        let sem = std::rc::Rc::new(glommio::sync::Semaphore::new(64));
        loop {
            let permit = sem.clone().acquire_static_permit(1).await.unwrap();
            let a = log.append(i % LEDGERS, body(i)).unwrap();
            assert_eq!(a.entry, i / LEDGERS);
            let log = log.clone();
            glommio::spawn_local(async move {
                log.wait_durable(a.lsn).await.unwrap();
                println!("acked {i}");
                drop(permit);
            })
            .detach();
            i += 1;
        }
    });
}

#[test]
fn kill9_real_process() {
    if let Ok(dir) = std::env::var("MAGNETAR_STORAGE_CHILD") {
        child(dir);
        return;
    }
    let seed = common::seed_from_env().unwrap_or_else(common::fresh_seed);
    println!("kill9_real_process: seed {seed} (replay: MAGNETAR_SEED={seed})");
    let mut rng = SimRng::new(seed);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("shard-0");
    let mut acked_total: Option<u64> = None;
    for round in 0..3 {
        let mut child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "kill9_real_process", "--nocapture", "--test-threads=1"])
            .env("MAGNETAR_STORAGE_CHILD", &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let kill_after = 200 + rng.below(3000);
        let started = Instant::now();
        let mut max_acked: Option<u64> = None;
        let mut seen = 0;
        for line in out.lines() {
            let line = line.unwrap();
            if let Some(n) = line.strip_prefix("acked ") {
                let n: u64 = n.parse().unwrap();
                max_acked = Some(max_acked.map_or(n, |m| m.max(n)));
                seen += 1;
                if seen >= kill_after {
                    break;
                }
            }
            assert!(started.elapsed() < Duration::from_secs(60), "child too slow");
        }
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Acks are printed out of order across waiters; an ack for i means
        // every entry <= i is durable (group commit is in order).
        let acked = max_acked.expect("child acknowledged nothing");
        acked_total = Some(acked_total.map_or(acked, |a| a.max(acked)));

        let dir2 = dir.clone();
        let want = acked_total.unwrap_or(0);
        common::run(120, move || async move {
            let (log, rec) = EntryLog::open(config(&dir2)).await.unwrap();
            let total: u64 = rec.ledgers.iter().map(|(_, n)| n).sum();
            println!("round {round}: acked through {want}, recovered {total} entries, {:?}", rec);
            assert!(total > want, "lost acknowledged entries: {total} <= {want}");
            for i in 0..total {
                let got = log.read(i % LEDGERS, i / LEDGERS).await.unwrap();
                assert_eq!(got, body(i), "entry {i}");
            }
            for l in 0..LEDGERS {
                assert_eq!(log.next_entry(l), total / LEDGERS + u64::from(l < total % LEDGERS));
            }
            // Leave without close: the next child recovers from a crash again.
        });
    }
}
