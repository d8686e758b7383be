//! The atomics of the cross-core structures (`disk/arena.rs`): `std`'s
//! here; the loom model compiles that file against `loom`'s instead.

pub(crate) use std::sync::atomic::{AtomicU64, Ordering};
