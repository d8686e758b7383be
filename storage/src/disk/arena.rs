//! The registered read buffers' free list (`disk::owned`): one executor's
//! arena of [`FIXED_COUNT`] buffers of [`FIXED_BYTES`], taken by that
//! executor's reads and given back when the last view of a buffer drops, on
//! whatever thread (a consumer's connection on another shard may hold the
//! bytes last).
//!
//! The one hand-made cross-core structure besides the start gate. Giving a
//! buffer back is a release of its free bit and taking one an acquire, so
//! whatever a holder read of a buffer happens before the kernel writes into
//! it for its next read.
//!
//! The atomics come from `crate::atomics`: `std`'s in the broker, `loom`'s
//! in `storage/tests/loom_arena.rs`, which compiles this same file and
//! checks it (and a variant with the orderings weakened, which the model
//! must catch) over every interleaving.

use crate::atomics::{AtomicU64, Ordering};
use crate::PAGE_BYTES;
use std::marker::PhantomData;
use std::sync::Arc;

/// Bytes of one registered buffer: the entry log's catch-up reads (a
/// run of up to 1 MiB, widened back by up to 128 KiB, page-aligned) fit.
pub(crate) const FIXED_BYTES: usize = 1280 << 10;
/// Registered buffers per executor (20 MiB, pinned): the entry log keeps
/// up to 8 stretches, plus the reads in flight and the bytes consumers'
/// connections still hold.
pub(crate) const FIXED_COUNT: usize = 16;
const _: () = assert!(FIXED_COUNT <= 64 && FIXED_BYTES.is_multiple_of(PAGE_BYTES as usize));

/// Memory orderings of the free list; a type parameter so that the loom
/// model can check a deliberately broken variant of exactly this code.
pub(crate) trait FreeListOrdering {
    /// Of the loads and the compare-exchange that take a buffer.
    const TAKE: Ordering;
    /// Of the read-modify-write that gives one back.
    const GIVE: Ordering;
}

/// The orderings the broker uses: acquire to take, release to give back.
pub(crate) struct ReleaseAcquire;

impl FreeListOrdering for ReleaseAcquire {
    const TAKE: Ordering = Ordering::Acquire;
    const GIVE: Ordering = Ordering::Release;
}

/// The registered buffers' memory: `FIXED_COUNT` buffers of
/// `FIXED_BYTES`, zeroed at allocation, page-aligned. Freed when the
/// last holder goes: the ring that registered it (while registered) and
/// every buffer taken from it.
pub(crate) struct Arena<O = ReleaseAcquire> {
    base: std::ptr::NonNull<u8>,
    /// Bit i set: buffer i is free.
    free: AtomicU64,
    ordering: PhantomData<O>,
}

// SAFETY: the arena is plain memory. A buffer is written (by the
// kernel) only while one `Taken` owns it and no slice of it exists;
// after the read completed it is only read, through `Filled`, until
// it is given back (`free`, Release; taken again with Acquire).
#[allow(unsafe_code)]
unsafe impl<O> Send for Arena<O> {}
#[allow(unsafe_code)]
unsafe impl<O> Sync for Arena<O> {}

impl<O: FreeListOrdering> Arena<O> {
    fn layout() -> std::alloc::Layout {
        std::alloc::Layout::from_size_align(FIXED_BYTES * FIXED_COUNT, PAGE_BYTES as usize)
            .expect("a valid layout (constants)")
    }

    pub(crate) fn new() -> Option<Arc<Self>> {
        // SAFETY: the layout has a non-zero size.
        #[allow(unsafe_code)]
        let base = unsafe { std::alloc::alloc_zeroed(Self::layout()) };
        let base = std::ptr::NonNull::new(base)?;
        let all = if FIXED_COUNT == 64 { u64::MAX } else { (1u64 << FIXED_COUNT) - 1 };
        Some(Arc::new(Arena { base, free: AtomicU64::new(all), ordering: PhantomData }))
    }

    /// A free buffer, or `None` when all are taken.
    pub(crate) fn take(self: &Arc<Self>) -> Option<Taken<O>> {
        let mut free = self.free.load(O::TAKE);
        loop {
            if free == 0 {
                return None;
            }
            let index = free.trailing_zeros() as usize;
            match self.free.compare_exchange_weak(free, free & !(1 << index), O::TAKE, O::TAKE) {
                Ok(_) => return Some(Taken { arena: self.clone(), index }),
                Err(now) => free = now,
            }
        }
    }

    /// The whole arena, for registering it with a ring as one buffer.
    pub(crate) fn iovec(&self) -> libc::iovec {
        libc::iovec { iov_base: self.base.as_ptr().cast(), iov_len: FIXED_BYTES * FIXED_COUNT }
    }
}

impl<O> Drop for Arena<O> {
    fn drop(&mut self) {
        let layout = std::alloc::Layout::from_size_align(FIXED_BYTES * FIXED_COUNT, PAGE_BYTES as usize)
            .expect("a valid layout (constants)");
        // SAFETY: allocated in `new` with this layout; nothing refers
        // to it any more (every holder kept an Arc).
        #[allow(unsafe_code)]
        unsafe {
            std::alloc::dealloc(self.base.as_ptr(), layout)
        };
    }
}

/// One registered buffer, owned; given back when dropped.
pub(crate) struct Taken<O: FreeListOrdering = ReleaseAcquire> {
    arena: Arc<Arena<O>>,
    index: usize,
}

impl<O: FreeListOrdering> Taken<O> {
    /// Which buffer of the arena (read by the loom model).
    #[allow(dead_code)]
    pub(crate) fn index(&self) -> usize {
        self.index
    }

    /// Its first byte.
    pub(crate) fn ptr(&self) -> *mut u8 {
        self.arena.base.as_ptr().wrapping_add(self.index * FIXED_BYTES)
    }
}

impl<O: FreeListOrdering> Drop for Taken<O> {
    fn drop(&mut self) {
        self.arena.free.fetch_or(1 << self.index, O::GIVE);
    }
}

/// A registered buffer whose first `len` bytes a read filled: the
/// owner of the [`bytes::Bytes`] a read returns.
pub(crate) struct Filled<O: FreeListOrdering = ReleaseAcquire> {
    taken: Taken<O>,
    len: usize,
}

impl<O: FreeListOrdering> Filled<O> {
    /// `taken` after a completed read wrote its first `len` bytes; the
    /// kernel writes into it no more.
    pub(crate) fn new(taken: Taken<O>, len: usize) -> Self {
        assert!(len <= FIXED_BYTES, "a read of {len} bytes into a buffer of {FIXED_BYTES}");
        Filled { taken, len }
    }
}

impl<O: FreeListOrdering> AsRef<[u8]> for Filled<O> {
    fn as_ref(&self) -> &[u8] {
        // SAFETY: `len <= FIXED_BYTES` bytes of this buffer, inside
        // the arena (alive: `taken` holds it), initialized (zeroed at
        // allocation, then written by the kernel), and no longer
        // written: the read completed and `taken` is not given back
        // before this drops.
        #[allow(unsafe_code)]
        unsafe {
            std::slice::from_raw_parts(self.taken.ptr(), self.len)
        }
    }
}
