//! Goal: the start gate (`core/src/start_gate.rs`) publishes what each shard
//! did before arriving to every shard that sees the gate open, and lets a
//! waiting shard go when shutdown is asked for although another shard never
//! arrives; and the model is sharp enough to catch the gate with its
//! orderings weakened to `Relaxed`.
//!
//! Method: loom compiles the gate's own source file against loom's atomics
//! (`mod atomics` below stands for `core/src/atomics.rs`) and runs each
//! model over every interleaving and every value a relaxed load may see.
//! "What a shard did" is a relaxed store the others read after the gate
//! opens: only the gate's release/acquire makes them see it. Runs in about a
//! second in the default `cargo test`.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

mod atomics {
    pub(crate) use loom::sync::atomic::{AtomicBool, AtomicU32, Ordering};
}

#[allow(dead_code)]
#[path = "../src/shard/start_gate.rs"]
mod start_gate;

use atomics::{AtomicBool, AtomicU32, Ordering};
use loom::sync::Arc;
use loom::thread;
use start_gate::{GateOrdering, GateState, ReleaseAcquire, StartGate};

/// The deliberately broken variant: no ordering at all.
struct Unordered;

impl GateOrdering for Unordered {
    const ARRIVE: Ordering = Ordering::Relaxed;
    const OBSERVE: Ordering = Ordering::Relaxed;
}

/// Two shards each record their start (a relaxed store), arrive, wait for
/// the gate, then check they see the other's start.
fn shards_see_each_other<O: GateOrdering + Send + Sync + 'static>() {
    loom::model(|| {
        let gate = Arc::new(StartGate::<O>::new(2));
        let shutdown = Arc::new(AtomicBool::new(false));
        let started = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
        let shards: Vec<_> = (0..2usize)
            .map(|me| {
                let (gate, shutdown, started) = (gate.clone(), shutdown.clone(), started.clone());
                thread::spawn(move || {
                    started[me].store(me as u32 + 1, Ordering::Relaxed);
                    gate.arrive();
                    loop {
                        match gate.state(&shutdown) {
                            GateState::Open => break,
                            GateState::ShuttingDown => unreachable!("nobody asked for shutdown"),
                            GateState::Waiting => thread::yield_now(),
                        }
                    }
                    let other = 1 - me;
                    assert_eq!(
                        started[other].load(Ordering::Relaxed),
                        other as u32 + 1,
                        "shard {me} serves before it sees shard {other}'s start"
                    );
                })
            })
            .collect();
        for s in shards {
            s.join().unwrap();
        }
    });
}

#[test]
fn open_gate_publishes_every_shards_start() {
    shards_see_each_other::<ReleaseAcquire>();
}

/// The model catches the gate without release/acquire.
#[test]
#[should_panic(expected = "serves before it sees")]
fn model_catches_a_relaxed_gate() {
    shards_see_each_other::<Unordered>();
}

/// A shard whose peer never arrives (its log failed to open) stops waiting
/// once shutdown is asked for, and never sees the gate open.
#[test]
fn shutdown_releases_a_waiting_shard() {
    loom::model(|| {
        let gate = Arc::new(StartGate::<ReleaseAcquire>::new(2));
        let shutdown = Arc::new(AtomicBool::new(false));
        let waiter = {
            let (gate, shutdown) = (gate.clone(), shutdown.clone());
            thread::spawn(move || {
                gate.arrive();
                loop {
                    match gate.state(&shutdown) {
                        GateState::Open => panic!("the gate opened with one shard of two"),
                        GateState::ShuttingDown => return,
                        GateState::Waiting => thread::yield_now(),
                    }
                }
            })
        };
        shutdown.store(true, Ordering::SeqCst);
        waiter.join().unwrap();
    });
}
