//! Per-stage timestamps of a message's path through the broker, for finding
//! where a lone message's time goes (what it found: bench/RESULTS.md,
//! "Where a lone message's time goes").
//!
//! Off unless `MAGNETAR_STAGE_TRACE=FILE` is set when the broker starts; then
//! every [`mark`] records (monotonic ns, thread, stage) in memory and the
//! records are appended to FILE, as text lines `ns tid stage`, every 4,096
//! marks (so a run's tail may be missing — it is a sampling tool, not a log).
//! Disabled, a mark is one relaxed atomic load. `bench/scripts/stages.py`
//! turns the file into a per-stage breakdown.
//!
//! Shared by every shard thread (the only cross-thread state in this crate
//! besides the disk): a mutex, uncontended in the one-at-a-time runs it is
//! meant for.

use std::io::Write;
use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Mutex;
use std::time::Instant;

/// 0 = not decided yet, 1 = off, 2 = on.
static STATE: AtomicU8 = AtomicU8::new(0);
static BUF: Mutex<Vec<(u64, u64, &'static str)>> = Mutex::new(Vec::new());
static START: std::sync::OnceLock<(Instant, Option<String>)> = std::sync::OnceLock::new();

static NEXT_TID: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
thread_local! {
    /// A small number per thread, to tell shards apart in the output.
    static TID: u64 = NEXT_TID.fetch_add(1, Ordering::Relaxed);
}

const FLUSH_EVERY: usize = 4096;

fn start() -> &'static (Instant, Option<String>) {
    START.get_or_init(|| (Instant::now(), std::env::var("MAGNETAR_STAGE_TRACE").ok().filter(|s| !s.is_empty())))
}

/// Records that the current thread's message reached `stage`.
#[inline]
pub fn mark(stage: &'static str) {
    match STATE.load(Ordering::Relaxed) {
        1 => {}
        2 => record(stage),
        _ => {
            let on = start().1.is_some();
            STATE.store(if on { 2 } else { 1 }, Ordering::Relaxed);
            if on {
                record(stage);
            }
        }
    }
}

fn record(stage: &'static str) {
    let (t0, path) = start();
    let ns = t0.elapsed().as_nanos() as u64;
    let tid = TID.with(|t| *t);
    let Ok(mut buf) = BUF.lock() else { return };
    buf.push((ns, tid, stage));
    if buf.len() >= FLUSH_EVERY {
        let lines: String = buf.drain(..).map(|(ns, tid, s)| format!("{ns} {tid} {s}\n")).collect();
        if let Some(path) = path {
            if let Ok(mut f) = std::fs::OpenOptions::new().create(true).append(true).open(path) {
                let _ = f.write_all(lines.as_bytes());
            }
        }
    }
}
