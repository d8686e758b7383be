//! The atomics of the cross-core structures (`start_gate.rs`): `std`'s here;
//! the loom models compile those files against `loom`'s instead.

pub(crate) use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
