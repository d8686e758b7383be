//! The start gate: shards serve only once every shard has recovered its log,
//! and stop waiting when shutdown is asked for.
//!
//! This is the broker's one hand-made cross-core structure (the mesh uses
//! glommio's channels; credit counters and the disk watermark are per shard,
//! in `Cell`s). Each shard `arrive`s once it has recovered, then polls
//! `state` until the gate opens. Arrival is a release and observation an
//! acquire: whatever a shard did before arriving happens before whatever any
//! shard does after seeing the gate open, so no request reaches a shard
//! still reading its log.
//!
//! The atomics come from `crate::atomics`: `std`'s in the broker, `loom`'s in
//! `core/tests/loom_start_gate.rs`, which compiles this same file and checks
//! it (and a variant with the orderings weakened, which the model must
//! catch) over every interleaving. Shared by all shards (`Arc`).

use crate::atomics::{AtomicBool, AtomicU32, Ordering};
use std::marker::PhantomData;

/// Memory orderings of the gate; a type parameter so that the loom model can
/// check a deliberately broken variant of exactly this code.
pub trait GateOrdering {
    /// Of the read-modify-write that records an arrival.
    const ARRIVE: Ordering;
    /// Of the loads that observe arrivals and the shutdown flag.
    const OBSERVE: Ordering;
}

/// The orderings the broker uses: release on arrival, acquire on observation.
pub struct ReleaseAcquire;

impl GateOrdering for ReleaseAcquire {
    const ARRIVE: Ordering = Ordering::AcqRel;
    const OBSERVE: Ordering = Ordering::Acquire;
}

/// What a waiting shard should do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GateState {
    /// Every shard arrived: serve.
    Open,
    /// Shutdown was asked for: stop waiting.
    ShuttingDown,
    /// Keep waiting.
    Waiting,
}

pub struct StartGate<O = ReleaseAcquire> {
    arrived: AtomicU32,
    shards: u32,
    ordering: PhantomData<O>,
}

impl<O: GateOrdering> StartGate<O> {
    pub fn new(shards: u32) -> Self {
        assert!(shards > 0);
        Self { arrived: AtomicU32::new(0), shards, ordering: PhantomData }
    }

    /// A shard has recovered. Each shard arrives exactly once.
    pub fn arrive(&self) {
        let before = self.arrived.fetch_add(1, O::ARRIVE);
        assert!(before < self.shards, "more arrivals ({}) than shards ({})", before + 1, self.shards);
    }

    /// Shutdown wins over an open gate: a shard that sees it stops.
    pub fn state(&self, shutdown: &AtomicBool) -> GateState {
        if shutdown.load(O::OBSERVE) {
            GateState::ShuttingDown
        } else if self.arrived.load(O::OBSERVE) >= self.shards {
            GateState::Open
        } else {
            GateState::Waiting
        }
    }
}
