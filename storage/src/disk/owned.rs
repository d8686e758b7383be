use std::cell::{Cell, RefCell};
use std::io;
use std::os::unix::io::RawFd;
use std::rc::Rc;
use std::sync::Arc;
use std::task::{Poll, Waker};

use bytes::Bytes;
use glommio::io::BufferedFile;
use io_uring::{opcode, types, IoUring};

use super::PAGE_BYTES;

/// Reads in flight at once on one executor's ring; a read beyond them
/// takes the reactor path (the dispatcher has one or two per partition
/// catching up).
pub const SLOTS: usize = 32;
use super::arena::{Arena, Filled, Taken, FIXED_BYTES};

/// A read's buffer.
enum Buffer {
    /// A registered one, read with `READ_FIXED`.
    Fixed(Taken),
    /// Heap memory, page-aligned `at` bytes in; the kernel fills its
    /// spare capacity from there.
    Heap { vec: Vec<u8>, at: usize },
}

impl Buffer {
    /// Where byte `off` of the read goes.
    fn ptr(&mut self, off: usize) -> *mut u8 {
        match self {
            Buffer::Fixed(t) => t.ptr().wrapping_add(off),
            Buffer::Heap { vec, at } => vec.as_mut_ptr().wrapping_add(*at + off),
        }
    }

    /// The bytes `from..to` of the read, which filled `got` bytes.
    fn into_bytes(self, got: usize, from: usize, to: usize) -> Bytes {
        match self {
            Buffer::Fixed(taken) => Bytes::from_owner(Filled::new(taken, got)).slice(from..to),
            Buffer::Heap { mut vec, at } => {
                // SAFETY: the kernel wrote `got` bytes from `at` (its
                // completion said so), the bytes before `at` were
                // initialized when the buffer was made, and the
                // capacity covers the whole read.
                #[allow(unsafe_code)]
                unsafe {
                    vec.set_len(at + got)
                };
                Bytes::from(vec).slice(at + from..at + to)
            }
        }
    }
}

enum Slot {
    Free,
    /// Submitted: the kernel may write into `buf`.
    /// `abandoned`: its reader is gone; the completion frees `buf`.
    InFlight {
        buf: Buffer,
        waker: Option<Waker>,
        abandoned: bool,
    },
    /// Completed with `res` (bytes read, or -errno); the reader takes it.
    Done {
        buf: Buffer,
        res: i32,
    },
}

pub struct Ring {
    ring: RefCell<IoUring>,
    /// Registered with `ring` (`None`: registering failed, e.g. over
    /// RLIMIT_MEMLOCK; reads then take heap memory).
    arena: Option<Arc<Arena>>,
    /// The eventfd registered with `ring` (blocking, so that io_uring
    /// reads of it wait for a completion instead of failing EAGAIN);
    /// shared with the task that reads it ([`reap_while_busy`]).
    event: Rc<BufferedFile>,
    slots: RefCell<Vec<Slot>>,
    in_flight: Cell<usize>,
    /// A task reaps completions ([`reap_while_busy`]).
    reaping: Cell<bool>,
    /// Takes no more reads (a refused submission, a failed wait).
    dead: Cell<bool>,
}

thread_local! {
    /// The ring of the executor on this thread, by executor id (glommio
    /// numbers executors once per process): a test may run executors
    /// one after another on one thread, and the eventfd belongs to the
    /// reactor that opened it. `None`: it could not be made. Its only
    /// strong holder across an await: an executor that ends with reads
    /// in flight leaks their tasks (glommio does not drop a task that
    /// waits for I/O), and a ring those held would never be dropped,
    /// its 20 MiB of registered buffers never freed ([`Ring::retire`]).
    static RING: RefCell<Option<(usize, Option<Rc<Ring>>)>> = const { RefCell::new(None) };
}

fn ring() -> Option<Rc<Ring>> {
    let id = glommio::executor().id();
    RING.with(|r| {
        let mut r = r.borrow_mut();
        if let Some((ex, ring)) = &*r {
            if *ex == id {
                return ring.clone();
            }
        }
        // The ring of an executor that ran here before (ended, or
        // waiting to run again): its reads still waiting for theirs are
        // woken, to read another way.
        if let Some((_, Some(old))) = r.take() {
            if let Ok(old) = Rc::try_unwrap(old) {
                old.retire(true);
            }
        }
        let ring = match Ring::new() {
            Ok(ring) => Some(Rc::new(ring)),
            Err(e) => {
                tracing::warn!(error = %e, "no io_uring of our own for reads: they go through the reactor, and a copy");
                None
            }
        };
        *r = Some((id, ring.clone()));
        ring
    })
}

/// Reads up to `len` bytes of `fd` at `pos` (fewer only at the end of
/// the file) into a buffer of its own, page-aligned (O_DIRECT) around
/// them, and returns them as a view of it. `None`: this executor has no
/// ring, or the ring did not take the request, or was dropped while it
/// was in flight (`Ring::retire`; nothing of this read is in flight
/// then): the caller reads another way.
pub async fn read(fd: RawFd, pos: u64, len: usize) -> Option<io::Result<Bytes>> {
    let ring = ring()?;
    if ring.dead.get() {
        return None;
    }
    let page = PAGE_BYTES as usize;
    let (start, skip, want) = super::aligned_span(pos, len)?;
    u32::try_from(want).ok()?;
    if len == 0 {
        return Some(Ok(Bytes::new()));
    }
    let slot = ring.slots.borrow().iter().position(|s| matches!(s, Slot::Free))?;
    let fixed = match &ring.arena {
        Some(arena) if want <= FIXED_BYTES => arena.take(),
        _ => None,
    };
    let mut buf = match fixed {
        Some(taken) => Buffer::Fixed(taken),
        None => {
            let mut vec: Vec<u8> = Vec::with_capacity(want.checked_add(page)?);
            // `align_offset` may, in principle, say it cannot align.
            let at = vec.as_ptr().align_offset(page);
            if at >= page {
                return None;
            }
            // Initialized up to the aligned start; the kernel fills the rest.
            vec.resize(at, 0);
            Buffer::Heap { vec, at }
        }
    };
    let weak = Rc::downgrade(&ring);
    drop(ring);
    let mut got = 0usize;
    loop {
        // Only the thread's `RING` holds the ring across an await (see there).
        let Some(ring) = weak.upgrade() else {
            // Gone (see `Waiting::poll`): read another way.
            return None;
        };
        let ptr = buf.ptr(got);
        // want - got <= want, checked to fit a u32 above.
        let (n, at) = ((want - got) as u32, start + got as u64);
        let sqe = match &buf {
            // The arena is registered as buffer 0, whole.
            Buffer::Fixed(_) => opcode::ReadFixed::new(types::Fd(fd), ptr, n, 0).offset(at).build(),
            Buffer::Heap { .. } => opcode::Read::new(types::Fd(fd), ptr, n).offset(at).build(),
        }
        .user_data(slot as u64);
        ring.slots.borrow_mut()[slot] = Slot::InFlight { buf, waker: None, abandoned: false };
        // SAFETY: the entry points into the buffer now in `slot`, at
        // least `want - got` bytes past `ptr` (a registered buffer holds
        // FIXED_BYTES >= want; a heap one `at + want` bytes of capacity,
        // and its memory does not move with the Vec). The buffer leaves
        // the slot only once the read completed (`reap`), or is leaked
        // (`Ring::retire`, `finish_blocking`, a refused submission below). `fd`
        // is the caller's open file; the kernel holds its own reference
        // to it once the entry is submitted.
        #[allow(unsafe_code)]
        let submitted = unsafe { ring.submit(&sqe) };
        if let Err(e) = submitted {
            // The entry may stay queued in a ring never entered again:
            // leave its buffer to it, and read another way.
            if let Slot::InFlight { buf, .. } = std::mem::replace(&mut ring.slots.borrow_mut()[slot], Slot::Free) {
                std::mem::forget(buf);
            }
            tracing::warn!(error = %e, "our own io_uring refused a read: reads go through the reactor, and a copy");
            return None;
        }
        ring.in_flight.set(ring.in_flight.get() + 1);
        if !ring.reaping.replace(true) {
            glommio::spawn_local(reap_while_busy(weak.clone(), ring.event.clone())).detach();
        }
        drop(ring);
        let waiting = Waiting { ring: weak.clone(), slot };
        let (b, res) = std::future::poll_fn(|cx| waiting.poll(cx)).await?;
        drop(waiting);
        buf = b;
        if res < 0 {
            return Some(Err(io::Error::from_raw_os_error(-res)));
        }
        got += res as usize;
        // Short: the end of the file, or (rarely) a read the kernel
        // split; the rest is read on if the split left us aligned.
        if res == 0 || got >= want || !got.is_multiple_of(page) {
            break;
        }
    }
    let got = got.min(want);
    let end = got.min(skip + len);
    Some(Ok(buf.into_bytes(got, skip.min(end), end)))
}

/// A submitted read of `slot` its reader waits for.
struct Waiting {
    ring: std::rc::Weak<Ring>,
    slot: usize,
}

impl Waiting {
    /// `None`: the ring was dropped with the read in flight (it took
    /// the buffer; `Ring::retire`), when the thread's `RING` went to
    /// another executor while this one's tasks waited: the reader
    /// reads another way.
    fn poll(&self, cx: &mut std::task::Context<'_>) -> Poll<Option<(Buffer, i32)>> {
        let Some(ring) = self.ring.upgrade() else {
            return Poll::Ready(None);
        };
        let mut slots = ring.slots.borrow_mut();
        match &mut slots[self.slot] {
            Slot::InFlight { waker, .. } => {
                if !waker.as_ref().is_some_and(|w| w.will_wake(cx.waker())) {
                    *waker = Some(cx.waker().clone());
                }
                Poll::Pending
            }
            Slot::Done { .. } => match std::mem::replace(&mut slots[self.slot], Slot::Free) {
                Slot::Done { buf, res } => Poll::Ready(Some((buf, res))),
                _ => unreachable!("matched Done above"),
            },
            Slot::Free => unreachable!("a waited-for slot is in flight or done"),
        }
    }
}

impl Drop for Waiting {
    fn drop(&mut self) {
        let Some(ring) = self.ring.upgrade() else {
            return;
        };
        let mut slots = ring.slots.borrow_mut();
        match &mut slots[self.slot] {
            Slot::InFlight { waker, abandoned, .. } => {
                *waker = None;
                *abandoned = true;
            }
            Slot::Done { .. } => slots[self.slot] = Slot::Free,
            Slot::Free => {}
        }
    }
}

/// Reaps completions while reads are in flight, waking for each
/// signal of the eventfd.
/// Holds the ring only between waits (see `RING`).
async fn reap_while_busy(ring: std::rc::Weak<Ring>, event: Rc<BufferedFile>) {
    loop {
        {
            let Some(ring) = ring.upgrade() else {
                return;
            };
            ring.reap(true);
            if ring.in_flight.get() == 0 {
                ring.reaping.set(false);
                return;
            }
        }
        let read = event.read_at(0, 8).await;
        let Some(ring) = ring.upgrade() else {
            return;
        };
        if let Err(e) = read {
            tracing::warn!(error = %e, "reading the read ring's eventfd failed: its reads are waited for here, later ones go through the reactor");
            ring.dead.set(true);
            ring.finish_blocking();
            ring.reaping.set(false);
            return;
        }
    }
}

impl Ring {
    fn new() -> io::Result<Ring> {
        let ring = IoUring::new(SLOTS as u32)?;
        // The eventfd is closed through this executor's reactor: a ring
        // that outlives its executor (the thread's `RING`, until the
        // thread exits or the next executor there reads) leaks it, as
        // glommio leaks its own eventfd of every executor.
        let event = Rc::new(super::completion_eventfd(&ring)?);
        let arena = Arena::new().filter(|arena| {
            // SAFETY: the arena's memory stays valid while the ring
            // lives: the ring holds it (`Ring::arena`), and leaks it if
            // dropped with reads in flight.
            #[allow(unsafe_code)]
            let registered = unsafe { ring.submitter().register_buffers(&[arena.iovec()]) };
            if let Err(e) = &registered {
                tracing::info!(error = %e, "cannot register read buffers with our own io_uring: reads take heap memory");
            }
            registered.is_ok()
        });
        Ok(Ring {
            ring: RefCell::new(ring),
            arena,
            event,
            slots: RefCell::new((0..SLOTS).map(|_| Slot::Free).collect()),
            in_flight: Cell::new(0),
            reaping: Cell::new(false),
            dead: Cell::new(false),
        })
    }

    /// Pushes `sqe` and submits it. `Err`: the kernel did not take it
    /// (it may stay queued), and the ring is dead.
    ///
    /// # Safety
    /// The memory `sqe` points to must stay valid until its completion
    /// is reaped, or for good if this fails.
    #[allow(unsafe_code)]
    unsafe fn submit(&self, sqe: &io_uring::squeue::Entry) -> io::Result<()> {
        let mut ring = self.ring.borrow_mut();
        // SAFETY: as the caller promised.
        let pushed = unsafe { ring.submission().push(sqe).is_ok() };
        // Every push is submitted at once: the queue is empty before it.
        assert!(pushed, "an empty submission queue takes an entry");
        loop {
            match ring.submit() {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                // Taken (an error then is about something else).
                _ if ring.submission().is_empty() => return Ok(()),
                refused => {
                    self.dead.set(true);
                    return Err(refused.err().unwrap_or_else(|| io::Error::other("io_uring took no request")));
                }
            }
        }
    }

    /// Takes the completions that are there: each read's buffer goes to
    /// its slot (or is freed if its reader is gone), and its reader is
    /// woken if `wake` (else its waker is leaked: [`Ring::retire`] at
    /// the thread's exit, the executor gone).
    fn reap(&self, wake: bool) {
        let mut woken = Vec::new();
        {
            let mut ring = self.ring.borrow_mut();
            let mut slots = self.slots.borrow_mut();
            for cqe in ring.completion() {
                let Some(slot) = usize::try_from(cqe.user_data()).ok().and_then(|i| slots.get_mut(i)) else {
                    continue;
                };
                match std::mem::replace(slot, Slot::Free) {
                    Slot::InFlight { buf, waker, abandoned } => {
                        self.in_flight.set(self.in_flight.get() - 1);
                        if !abandoned {
                            *slot = Slot::Done { buf, res: cqe.result() };
                            woken.extend(waker);
                        }
                    }
                    // Not a read of ours in flight (a refused entry
                    // submitted after all): nothing to do.
                    other => *slot = other,
                }
            }
        }
        if wake {
            for w in woken {
                w.wake();
            }
        } else {
            std::mem::forget(woken);
        }
    }

    /// Waits for every read in flight, blocking the thread. If waiting
    /// fails, their buffers are leaked (the kernel may still write
    /// them) and their readers get an error.
    fn finish_blocking(&self) {
        while self.in_flight.get() > 0 {
            let waited = self.ring.borrow_mut().submit_and_wait(1);
            match waited {
                Ok(_) => self.reap(true),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::error!(error = %e, "waiting on our own io_uring failed: its reads' buffers are leaked");
                    let mut woken = Vec::new();
                    for slot in self.slots.borrow_mut().iter_mut() {
                        if let Slot::InFlight { buf, waker, abandoned } = std::mem::replace(slot, Slot::Free) {
                            std::mem::forget(buf);
                            if !abandoned {
                                *slot = Slot::Done { buf: Buffer::Heap { vec: Vec::new(), at: 0 }, res: -libc::EIO };
                                woken.extend(waker);
                            }
                        }
                    }
                    self.in_flight.set(0);
                    for w in woken {
                        w.wake();
                    }
                    return;
                }
            }
        }
    }
}

/// How long a ring dropped with reads in flight waits for them
/// ([`Ring::retire`]) before leaking their buffers.
const DROP_WAIT: std::time::Duration = std::time::Duration::from_secs(1);

impl Ring {
    /// Ends the ring's reads before it is dropped. They are still in
    /// flight only if their executor ended with them (its thread
    /// exits) or waits to run again (another executor runs on the
    /// thread now): their readers are dropped, leaked with its tasks,
    /// or wait to be polled. Those the kernel has finished give their
    /// buffers back; the rest are waited for a little (a disk read takes
    /// milliseconds), not leaked at once: a registered buffer leaked
    /// keeps the whole arena, 20 MiB a ring. Readers still waiting find
    /// the ring gone and read another way; they are woken if `wake`
    /// (not from the thread's exit: their executor is gone). Not
    /// waited for if the ring is dead: an entry it refused may still
    /// be queued, and waiting would submit it.
    fn retire(&self, wake: bool) {
        let deadline = std::time::Instant::now() + DROP_WAIT;
        loop {
            self.reap(wake);
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            if self.in_flight.get() == 0 || self.dead.get() || left.is_zero() {
                break;
            }
            let ts = types::Timespec::from(left);
            let args = types::SubmitArgs::new().timespec(&ts);
            let waited = self.ring.borrow_mut().submitter().submit_with_args(1, &args);
            match waited {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted || e.raw_os_error() == Some(libc::ETIME) => {}
                // E.g. a kernel without timed waits (before 5.11).
                Err(_) => break,
            }
        }
        let mut woken = Vec::new();
        for slot in self.slots.borrow_mut().iter_mut() {
            match std::mem::replace(slot, Slot::Free) {
                // Still in flight: the kernel may write the buffer after
                // the ring is gone (a registered one keeps the arena).
                Slot::InFlight { buf, waker, .. } => {
                    std::mem::forget(buf);
                    woken.extend(waker);
                }
                // Done, its reader not back yet: it will not take it.
                Slot::Done { .. } | Slot::Free => {}
            }
        }
        self.in_flight.set(0);
        if wake {
            for w in woken {
                w.wake();
            }
        } else {
            std::mem::forget(woken);
        }
    }
}

impl Drop for Ring {
    fn drop(&mut self) {
        self.retire(false);
    }
}
