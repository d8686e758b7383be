//! criterion benchmarks of the entry log on a real disk (O_DIRECT, fdatasync):
//! append with group commit at 1 KiB and 64 KiB, reads served hot (write
//! cache) and cold (disk, record checksum verified), seek by publish time,
//! index lookup, and key index lookup (from memory and from key index files).
//!
//! Run: `cargo bench -p magnetar-storage --bench storage` (add `-- --quick`
//! for a fast pass). The log lives under `MAGNETAR_BENCH_DIR` (default
//! `target/bench-disk`; it must not be tmpfs), removed at the end.
//!
//! The log needs a glommio executor, which criterion does not drive: each
//! group runs one executor thread that owns the logs, and the benchmark
//! thread hands it jobs (`iter_custom`: "do N operations, say how long they
//! took"), so only the operations themselves are timed.

#![allow(clippy::unwrap_used)] // a measuring tool: fail loudly

use std::cell::RefCell;
use std::future::Future;
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::Rc;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use magnetar_storage::{key_hash, EntryLog, IndexExtras, LogConfig, NewEntry};

type Job = Box<dyn FnOnce(Rc<Ctx>) -> Pin<Box<dyn Future<Output = Duration>>> + Send>;

/// What the executor thread owns: the logs, created there (not `Send`).
#[derive(Default)]
struct Ctx {
    logs: RefCell<Vec<EntryLog>>,
    rng: RefCell<u64>,
}

impl Ctx {
    fn log(&self, i: usize) -> EntryLog {
        self.logs.borrow()[i].clone()
    }
    fn below(&self, n: u64) -> u64 {
        let mut x = self.rng.borrow_mut();
        *x ^= *x << 13;
        *x ^= *x >> 7;
        *x ^= *x << 17;
        *x % n.max(1)
    }
}

/// One glommio executor thread taking jobs.
struct Worker {
    jobs: Option<mpsc::Sender<(Job, mpsc::Sender<Duration>)>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Worker {
    fn new() -> Worker {
        let (tx, rx) = mpsc::channel::<(Job, mpsc::Sender<Duration>)>();
        let thread = std::thread::spawn(move || {
            let ex = glommio::LocalExecutorBuilder::default().make().unwrap();
            ex.run(async move {
                let ctx = Rc::new(Ctx { rng: RefCell::new(0x9E37_79B9_7F4A_7C15), ..Default::default() });
                loop {
                    match rx.try_recv() {
                        Ok((job, reply)) => {
                            let d = job(ctx.clone()).await;
                            if reply.send(d).is_err() {
                                break;
                            }
                        }
                        Err(mpsc::TryRecvError::Empty) => glommio::timer::sleep(Duration::from_micros(100)).await,
                        Err(mpsc::TryRecvError::Disconnected) => break,
                    }
                }
                let logs: Vec<EntryLog> = ctx.logs.borrow_mut().drain(..).collect();
                for log in logs {
                    let _ = log.close().await;
                }
            });
        });
        Worker { jobs: Some(tx), thread: Some(thread) }
    }

    fn run<F, Fut>(&self, f: F) -> Duration
    where
        F: FnOnce(Rc<Ctx>) -> Fut + Send + 'static,
        Fut: Future<Output = Duration> + 'static,
    {
        let (tx, rx) = mpsc::channel();
        self.jobs.as_ref().unwrap().send((Box::new(move |c| Box::pin(f(c))), tx)).unwrap();
        rx.recv().unwrap()
    }
}

impl Drop for Worker {
    fn drop(&mut self) {
        // Disconnecting ends the thread's loop; it closes the logs.
        self.jobs.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

fn bench_dir(name: &str) -> PathBuf {
    let base = std::env::var("MAGNETAR_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target/bench-disk"));
    let dir = base.join(format!("storage-bench-{name}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::canonicalize(&dir).unwrap()
}

fn config(dir: &std::path::Path) -> LogConfig {
    let mut c = LogConfig::new(dir.join("shard-0"));
    c.compaction_interval = Duration::ZERO;
    c.key_index_interval = Duration::ZERO;
    c
}

/// Appends `n` entries of `size` bytes to `ledger`, keeping `in_flight`
/// appends waiting for durability (group commit), and waits for the last.
async fn append_n(log: &EntryLog, ledger: u64, n: u64, size: usize, in_flight: usize) -> Duration {
    let body = Bytes::from(vec![0x5au8; size]);
    let mut window = std::collections::VecDeque::with_capacity(in_flight);
    let t = Instant::now();
    for _ in 0..n {
        let a = log.append(ledger, body.clone()).unwrap();
        window.push_back(a.lsn);
        if window.len() >= in_flight {
            let lsn = window.pop_front().unwrap();
            log.wait_durable(lsn).await.unwrap();
        }
    }
    if let Some(&lsn) = window.back() {
        log.wait_durable(lsn).await.unwrap();
    }
    t.elapsed()
}

fn append(c: &mut Criterion) {
    let dir = bench_dir("append");
    let w = Worker::new();
    let d = dir.clone();
    w.run(move |ctx| async move {
        let mut cfg = config(&d);
        cfg.write_cache_bytes = 16 << 20;
        let (log, _) = EntryLog::open(cfg).await.unwrap();
        ctx.logs.borrow_mut().push(log);
        Duration::ZERO
    });
    let mut g = c.benchmark_group("append_group_commit");
    g.sample_size(10).measurement_time(Duration::from_secs(10));
    for (name, size, in_flight) in [("1KiB", 1024usize, 256usize), ("64KiB", 64 << 10, 64)] {
        g.throughput(Throughput::Bytes(size as u64));
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                w.run(move |ctx| async move { append_n(&ctx.log(0), 1, iters, size, in_flight).await })
            })
        });
    }
    g.finish();
    drop(w);
    let _ = std::fs::remove_dir_all(&dir);
}

/// Reads: hot from the write cache; cold from disk (the log reopened, read
/// cache off, every read one O_DIRECT pread and a record checksum).
fn read(c: &mut Criterion) {
    const N: u64 = 100_000;
    let dir = bench_dir("read");
    let w = Worker::new();
    let d = dir.clone();
    w.run(move |ctx| async move {
        let mut cfg = config(&d.join("hot"));
        cfg.write_cache_bytes = 256 << 20;
        let (hot, _) = EntryLog::open(cfg).await.unwrap();
        append_n(&hot, 1, N, 1024, 256).await;
        let (cold, _) = EntryLog::open(config(&d.join("cold"))).await.unwrap();
        append_n(&cold, 1, N, 1024, 256).await;
        cold.close().await.unwrap();
        drop(cold);
        let mut cfg = config(&d.join("cold"));
        cfg.read_cache_bytes = 0;
        let (cold, _) = EntryLog::open(cfg).await.unwrap();
        ctx.logs.borrow_mut().extend([hot, cold]);
        Duration::ZERO
    });
    let mut g = c.benchmark_group("read_1KiB");
    g.throughput(Throughput::Elements(1));
    for (name, i) in [("hot_write_cache", 0usize), ("cold_disk", 1)] {
        g.bench_function(name, |b| {
            b.iter_custom(|iters| {
                w.run(move |ctx| async move {
                    let log = ctx.log(i);
                    let picks: Vec<u64> = (0..iters).map(|_| ctx.below(N)).collect();
                    let t = Instant::now();
                    for e in picks {
                        std::hint::black_box(log.read(1, e).await.unwrap());
                    }
                    t.elapsed()
                })
            })
        });
    }
    g.finish();
    drop(w);
    let _ = std::fs::remove_dir_all(&dir);
}

/// seek_time, index_entry and find_key on one ledger of 1,000,000 entries
/// (publish times non-decreasing; 10,000 distinct keys, so ~100 entries a
/// key), the key index from memory and, after upkeep, from its files.
fn index(c: &mut Criterion) {
    const N: u64 = 1_000_000;
    const KEYS: u64 = 10_000;
    const BASE_MS: u64 = 1_700_000_000_000;
    let dir = bench_dir("index");
    let w = Worker::new();
    let d = dir.clone();
    w.run(move |ctx| async move {
        let mut cfg = config(&d);
        cfg.write_cache_bytes = 1 << 20;
        let (log, _) = EntryLog::open(cfg).await.unwrap();
        let body = Bytes::from_static(b"12345678");
        let mut last = 0;
        for i in 0..N {
            let key = format!("key-{}", i % KEYS);
            let extras = IndexExtras {
                publish_time_ms: BASE_MS + i / 4,
                key_hash: key_hash(key.as_bytes()),
                ..Default::default()
            };
            last = log.append(1, NewEntry::new(body.clone()).extras(extras)).unwrap().lsn;
            if i % 10_000 == 9_999 {
                log.wait_durable(last).await.unwrap();
            }
        }
        log.wait_durable(last).await.unwrap();
        ctx.logs.borrow_mut().push(log);
        Duration::ZERO
    });
    let mut g = c.benchmark_group("index_1M_entries");
    g.throughput(Throughput::Elements(1));
    g.bench_function("seek_time", |b| {
        b.iter_custom(|iters| {
            w.run(move |ctx| async move {
                let log = ctx.log(0);
                let targets: Vec<u64> = (0..iters).map(|_| BASE_MS + ctx.below(N / 4)).collect();
                let t = Instant::now();
                for ms in targets {
                    std::hint::black_box(log.seek_time(1, ms).await.unwrap());
                }
                t.elapsed()
            })
        })
    });
    g.bench_function("index_entry", |b| {
        b.iter_custom(|iters| {
            w.run(move |ctx| async move {
                let log = ctx.log(0);
                let picks: Vec<u64> = (0..iters).map(|_| ctx.below(N)).collect();
                let t = Instant::now();
                for e in picks {
                    std::hint::black_box(log.index_entry(1, e).await.unwrap());
                }
                t.elapsed()
            })
        })
    });
    let find = |ctx: Rc<Ctx>, iters: u64| async move {
        let log = ctx.log(0);
        let hashes: Vec<u32> = (0..iters).map(|_| key_hash(format!("key-{}", ctx.below(KEYS)).as_bytes())).collect();
        let t = Instant::now();
        for h in hashes {
            let hits = log.find_key(h, &|l| l == 1, None, 10).await.unwrap();
            assert_eq!(hits.len(), 10);
        }
        t.elapsed()
    };
    g.bench_function("find_key_newest_10_in_memory", |b| b.iter_custom(|iters| w.run(move |ctx| find(ctx, iters))));
    w.run(|ctx| async move {
        let log = ctx.log(0);
        log.maintain_key_index(true).await.unwrap();
        let (files, in_memory) = log.key_index_files();
        println!("key index: {} files, {in_memory} items in memory", files.len());
        Duration::ZERO
    });
    g.bench_function("find_key_newest_10_from_files", |b| b.iter_custom(|iters| w.run(move |ctx| find(ctx, iters))));
    g.finish();
    drop(w);
    let _ = std::fs::remove_dir_all(&dir);
}

criterion_group!(benches, append, read, index);
criterion_main!(benches);
