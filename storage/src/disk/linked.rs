use std::cell::RefCell;
use std::io;
use std::os::unix::io::RawFd;
use std::time::Duration;

use io_uring::{opcode, squeue, types, IoUring};

use super::PAGE_BYTES;

/// Largest write this path takes (the flusher sends it one lone batch,
/// a page or a few); larger writes go through the reactor.
pub const BYTES_MAX: usize = 64 << 10;
const WRITE: u64 = 1;
const SYNC: u64 = 2;

struct Ring {
    ring: IoUring,
    /// BYTES_MAX bytes at a page-aligned offset `at` (O_DIRECT).
    buf: Vec<u8>,
    at: usize,
}

enum State {
    Untried,
    Ready(Box<Ring>),
    /// Could not be made (e.g. io_uring refused), or an error left
    /// requests of it in flight: never used again.
    Unavailable,
}

thread_local! {
    static STATE: RefCell<State> = const { RefCell::new(State::Untried) };
}

/// Writes `data` at `pos` of `fd` and fdatasyncs, linked, waiting for
/// both; `None` when this thread has no ring or `data` is too long (the
/// caller then takes the reactor path).
pub fn write_and_sync(fd: RawFd, pos: u64, data: &[u8], yield_max: Duration) -> Option<io::Result<()>> {
    if data.len() > BYTES_MAX {
        return None;
    }
    STATE.with(|s| {
        let mut s = s.borrow_mut();
        if matches!(*s, State::Untried) {
            // COOP_TASKRUN: the write's completion work (which issues
            // the linked fdatasync) waits for this thread's next return
            // from the kernel instead of being pushed to it by an
            // interrupt. The thread returns from `sched_yield` over and
            // over, or sleeps in this ring (the kernel still wakes a
            // sleeper), so nothing is held back, and a shard on another
            // CPU than the disk's interrupt is spared an IPI per
            // message (the gain is small: bench/RESULTS.md). Never for
            // the file rings (`chained`): a shard busy in user code
            // would hold their fdatasync back until its next syscall.
            // Kernels before 5.19 lack the flag: a plain ring then.
            let ring = IoUring::builder().setup_coop_taskrun().build(4).or_else(|_| IoUring::new(4));
            *s = match ring {
                Ok(ring) => {
                    let buf = vec![0u8; BYTES_MAX + PAGE_BYTES as usize];
                    // align_offset may, in principle, say it cannot align
                    // (usize::MAX): then no ring, the reactor path.
                    match buf.as_ptr().align_offset(PAGE_BYTES as usize) {
                        at if at < PAGE_BYTES as usize => State::Ready(Box::new(Ring { ring, buf, at })),
                        _ => State::Unavailable,
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "no io_uring of our own: lone batches go through the reactor");
                    State::Unavailable
                }
            };
        }
        let State::Ready(r) = &mut *s else { return None };
        let r = &mut **r;
        match submit_and_reap(r, fd, pos, data, yield_max) {
            Ok(done) => Some(done),
            Err(Failed::NotSubmitted(e)) => {
                // The kernel took neither request (e.g. EAGAIN or ENOMEM
                // from io_uring_enter): nothing is in flight, so the ring
                // can go, and this batch and every later one take the
                // reactor path instead of failing the log.
                tracing::warn!(error = %e, "own io_uring refused a request: lone batches go through the reactor");
                *s = State::Unavailable;
                None
            }
            Err(Failed::Broken(e)) => {
                // Requests may still be in flight: keep the ring and its
                // buffer alive for good, and never use them again.
                if let State::Ready(r) = std::mem::replace(&mut *s, State::Unavailable) {
                    let _ = Box::leak(r);
                }
                Some(Err(e))
            }
        }
    })
}

/// Takes the completions that are there.
fn reap(ring: &mut IoUring, wrote: &mut Option<i32>, synced: &mut Option<i32>) {
    for cqe in ring.completion() {
        match cqe.user_data() {
            WRITE => *wrote = Some(cqe.result()),
            SYNC => *synced = Some(cqe.result()),
            other => unreachable!("unknown user_data {other}"),
        }
    }
}

/// Waiting on the ring failed.
enum Failed {
    /// Before the kernel took any request: nothing is in flight.
    NotSubmitted(io::Error),
    /// The ring's requests may still be in flight.
    Broken(io::Error),
}

fn submit_and_reap(
    r: &mut Ring,
    fd: RawFd,
    pos: u64,
    data: &[u8],
    yield_max: Duration,
) -> Result<io::Result<()>, Failed> {
    let buf = &mut r.buf[r.at..r.at + data.len()];
    buf.copy_from_slice(data);
    // data.len() <= BYTES_MAX, far below u32::MAX.
    let write = opcode::Write::new(types::Fd(fd), buf.as_ptr(), data.len() as u32)
        .offset(pos)
        .build()
        .flags(squeue::Flags::IO_LINK)
        .user_data(WRITE);
    let sync = opcode::Fsync::new(types::Fd(fd)).flags(types::FsyncFlags::DATASYNC).build().user_data(SYNC);
    assert!(r.ring.completion().is_empty(), "every call reaps what it submitted");
    // SAFETY: the two entries point into `r.buf` and use `fd`. The
    // buffer is not touched again before both completions are reaped
    // below, and the caller's file (fd) stays open for this synchronous
    // call. If waiting fails and requests may still run, the caller
    // leaks the ring and its buffer (`Failed::Broken`), so the memory stays valid.
    #[allow(unsafe_code)]
    let pushed = unsafe {
        let mut sq = r.ring.submission();
        sq.push(&write).is_ok() && sq.push(&sync).is_ok()
    };
    // The ring is private and drained by every call: it has room for two.
    assert!(pushed, "a drained ring of 4 entries takes two");
    let (mut wrote, mut synced) = (None, None);
    // Yield instead of sleeping at first: the shard has nothing else to
    // run meanwhile, each `sched_yield` runs the ring's completion work
    // on the way back (no wake-up of a sleeping thread, nor of an idle
    // CPU, for the write's completion and then the fdatasync's), and
    // lets the kernel's workers on this CPU (io-wq's fdatasync) run
    // first. A pure spin would hold those workers off, adding the
    // spin's length to the tail latency.
    loop {
        match super::submit_queued(&mut r.ring) {
            Ok(2) => break,
            // The kernel took the write but not the fdatasync (a request
            // allocation failed): submitting that later, unlinked, could
            // sync before the write lands. Give up on the ring.
            Ok(n) => return Err(Failed::Broken(io::Error::other(format!("io_uring took {n} of 2 requests")))),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            // io_uring_enter fails without submitting only when it took
            // no entry: both still queued means neither reached the kernel.
            Err(e) if r.ring.submission().len() == 2 => return Err(Failed::NotSubmitted(e)),
            Err(e) => return Err(Failed::Broken(e)),
        }
    }
    let began = std::time::Instant::now();
    loop {
        reap(&mut r.ring, &mut wrote, &mut synced);
        if (wrote.is_some() && synced.is_some()) || began.elapsed() >= yield_max {
            break;
        }
        std::thread::yield_now();
    }
    while wrote.is_none() || synced.is_none() {
        let want = usize::from(wrote.is_none()) + usize::from(synced.is_none());
        match r.ring.submit_and_wait(want) {
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(Failed::Broken(e)),
        }
        reap(&mut r.ring, &mut wrote, &mut synced);
    }
    let (wrote, synced) = (wrote.unwrap_or(0), synced.unwrap_or(0));
    if wrote < 0 {
        return Ok(Err(io::Error::from_raw_os_error(-wrote)));
    }
    if wrote as usize != data.len() {
        return Ok(Err(io::Error::new(
            io::ErrorKind::WriteZero,
            format!("short write: {wrote} of {} bytes at {pos}", data.len()),
        )));
    }
    if synced < 0 {
        return Ok(Err(io::Error::from_raw_os_error(-synced)));
    }
    Ok(Ok(()))
}
