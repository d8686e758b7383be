//! Goal: the registered read buffers' free list (`storage/src/disk/arena.rs`)
//! hands a buffer to a new read only after whoever held it last, on any
//! thread, is done reading it, and loses no buffer when several threads give
//! buffers back while the owner takes them; and the model is sharp enough
//! to catch the free list with its orderings weakened to `Relaxed`.
//!
//! Method: loom compiles the arena's own source file against loom's atomics
//! (`mod atomics` below stands for `storage/src/atomics.rs`) and runs each
//! model over every interleaving and every value a relaxed load may see.
//! A buffer's bytes are stood for by a `loom::cell::UnsafeCell` per buffer:
//! the owner's "read into it" is a write of the cell, a holder's use of the
//! bytes a read of it, and loom reports a write not ordered after the last
//! read (a causality violation). The memory itself is the arena's real
//! memory, touched as the broker touches it. Runs in about a second.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

mod atomics {
    pub(crate) use loom::sync::atomic::{AtomicU64, Ordering};
}

// `crate::PAGE_BYTES` of the included file.
use magnetar_storage::PAGE_BYTES;

#[allow(dead_code)]
#[path = "../src/disk/arena.rs"]
mod arena;

use arena::{Arena, Filled, FreeListOrdering, ReleaseAcquire, Taken, FIXED_COUNT};
use atomics::Ordering;
use loom::cell::UnsafeCell;
use loom::sync::Arc as LoomArc;
use loom::thread;

/// The deliberately broken variant: no ordering at all.
struct Unordered;

impl FreeListOrdering for Unordered {
    const TAKE: Ordering = Ordering::Relaxed;
    const GIVE: Ordering = Ordering::Relaxed;
}

/// The model's stand-in for each buffer's bytes.
type Contents = LoomArc<Vec<UnsafeCell<u64>>>;

fn contents() -> Contents {
    LoomArc::new((0..FIXED_COUNT).map(|_| UnsafeCell::new(0)).collect())
}

/// The owner's read into a taken buffer: the kernel writes it.
fn fill<O: FreeListOrdering>(taken: Taken<O>, contents: &Contents, value: u64) -> Filled<O> {
    contents[taken.index()].with_mut(|p| {
        // SAFETY: the model's cell; loom checks the access.
        #[allow(unsafe_code)]
        unsafe {
            *p = value
        }
    });
    // The real memory too, as the kernel would.
    #[allow(unsafe_code)]
    // SAFETY: the buffer is taken, so ours alone, and FIXED_BYTES >= 8.
    unsafe {
        taken.ptr().cast::<u64>().write(value)
    };
    Filled::new(taken, 8)
}

/// A holder's use of the bytes: reads them, then drops the last view
/// (which gives the buffer back).
fn use_and_drop<O: FreeListOrdering>(filled: Filled<O>, index: usize, contents: &Contents, want: u64) {
    let seen = contents[index].with(|p| {
        // SAFETY: the model's cell; loom checks the access.
        #[allow(unsafe_code)]
        unsafe {
            *p
        }
    });
    assert_eq!(seen, want, "a holder saw another read's bytes");
    let real = u64::from_ne_bytes(filled.as_ref()[..8].try_into().unwrap());
    assert_eq!(real, want);
    drop(filled);
}

/// The owner fills every buffer and hands one to another shard, which
/// reads it and drops it; meanwhile the owner waits for a free buffer and
/// reads into it. The other shard's reading must happen before the
/// owner's writing.
fn a_buffer_comes_back_from_another_thread<O: FreeListOrdering + Send + Sync + 'static>() {
    loom::model(|| {
        let arena = Arena::<O>::new().unwrap();
        let contents = contents();
        let mut held = Vec::new();
        while let Some(t) = arena.take() {
            held.push(t);
        }
        assert_eq!(held.len(), FIXED_COUNT);
        let first = held.remove(0);
        let index = first.index();
        let filled = fill(first, &contents, 1);
        let other = {
            let contents = contents.clone();
            // Moving the bytes to another shard is synchronized (a channel);
            // giving them back is not: only the free list orders it.
            thread::spawn(move || use_and_drop(filled, index, &contents, 1))
        };
        let again = loop {
            match arena.take() {
                Some(t) => break t,
                None => thread::yield_now(),
            }
        };
        assert_eq!(again.index(), index, "only the given-back buffer is free");
        let refilled = fill(again, &contents, 2);
        use_and_drop(refilled, index, &contents, 2);
        other.join().unwrap();
        drop(held);
    });
}

#[test]
fn a_reused_buffer_is_written_only_after_its_last_holder_read_it() {
    a_buffer_comes_back_from_another_thread::<ReleaseAcquire>();
}

/// The model catches the free list without release/acquire.
#[test]
#[should_panic(expected = "Causality violation")]
fn model_catches_a_relaxed_free_list() {
    a_buffer_comes_back_from_another_thread::<Unordered>();
}

/// Another shard gives a buffer back while the owner takes one and gives
/// another back: no bit is lost or doubled, and every buffer is free again
/// at the end.
#[test]
fn concurrent_give_backs_and_takes_lose_no_buffer() {
    loom::model(|| {
        let arena = Arena::<ReleaseAcquire>::new().unwrap();
        let contents = contents();
        let mut held = Vec::new();
        while let Some(t) = arena.take() {
            held.push(t);
        }
        let a = fill(held.remove(0), &contents, 10);
        let mine = held.remove(0);
        let giver = {
            let contents = contents.clone();
            thread::spawn(move || use_and_drop(a, 0, &contents, 10))
        };
        drop(mine);
        let took = arena.take().expect("buffer 1 was given back on this thread");
        assert!(took.index() < 2, "took buffer {} that was never given back", took.index());
        giver.join().unwrap();
        drop(took);
        drop(held);
        // Kept until counted: a dropped one would be given back at once.
        let mut kept = Vec::new();
        while let Some(t) = arena.take() {
            kept.push(t);
        }
        let mut all: Vec<usize> = kept.iter().map(|t| t.index()).collect();
        all.sort_unstable();
        assert_eq!(all, (0..FIXED_COUNT).collect::<Vec<_>>(), "a buffer was lost or doubled");
    });
}
