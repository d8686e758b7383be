use std::cell::{Cell, RefCell};
use std::io;
use std::os::unix::io::RawFd;

use glommio::io::{BufferedFile, DmaBuffer};
use glommio::sync::Semaphore;
use io_uring::{opcode, squeue, types, IoUring};

const WRITE: u64 = 1;
const SYNC: u64 = 2;

pub struct Ring {
    ring: RefCell<IoUring>,
    /// The eventfd registered with `ring` (blocking, so that io_uring
    /// reads of it wait for a completion instead of failing EAGAIN).
    event: BufferedFile,
    one_at_a_time: Semaphore,
    /// The write's completion is posted only when it failed
    /// (`IOSQE_CQE_SKIP_SUCCESS`, Linux 5.17+): usually one eventfd
    /// signal per pair. A signal can still be left over (a pair found
    /// complete before its first read): the next pair's first read then
    /// returns at once and it reads again; no wake-up is lost, since the
    /// kernel signals after publishing the completion and a read takes
    /// the whole count.
    skip_write_cqe: bool,
    /// Never used again: entries may be stuck in it (a refused or
    /// failed submission, a failed wait).
    dead: Cell<bool>,
}

pub enum Outcome {
    Done(io::Result<()>),
    /// The kernel took neither request (or the ring is no longer
    /// used): nothing is in flight; the buffer comes back for the
    /// reactor path. `None`: the ring was already out of use.
    NotSubmitted(DmaBuffer, Option<io::Error>),
}

impl Ring {
    pub fn new() -> io::Result<Ring> {
        // Never IORING_SETUP_DEFER_TASKRUN here: the write's completion
        // work (which issues the linked fdatasync) would then run only
        // when this ring is entered to wait, and the eventfd path never
        // does that: the pair would hang.
        let ring = IoUring::new(4)?;
        let event = super::completion_eventfd(&ring)?;
        let skip_write_cqe = ring.params().is_feature_skip_cqe_on_success();
        Ok(Ring {
            ring: RefCell::new(ring),
            event,
            one_at_a_time: Semaphore::new(1),
            skip_write_cqe,
            dead: Cell::new(false),
        })
    }

    pub async fn write_and_sync(&self, fd: RawFd, pos: u64, buf: DmaBuffer) -> Outcome {
        let Ok(_turn) = self.one_at_a_time.acquire_permit(1).await else {
            return Outcome::NotSubmitted(buf, None);
        };
        if self.dead.get() {
            return Outcome::NotSubmitted(buf, None);
        }
        let len = buf.len();
        let write_flags = if self.skip_write_cqe {
            squeue::Flags::IO_LINK | squeue::Flags::SKIP_SUCCESS
        } else {
            squeue::Flags::IO_LINK
        };
        // A batch is at most a few MiB (LogConfig::batch_bytes_max).
        let write = opcode::Write::new(types::Fd(fd), buf.as_ptr(), u32::try_from(len).expect("a batch under 4 GiB"))
            .offset(pos)
            .build()
            .flags(write_flags)
            .user_data(WRITE);
        let sync = opcode::Fsync::new(types::Fd(fd)).flags(types::FsyncFlags::DATASYNC).build().user_data(SYNC);
        let mut pair = InFlight {
            ring: &self.ring,
            dead: &self.dead,
            buf: Some(buf),
            skip_write_cqe: self.skip_write_cqe,
            wrote: None,
            synced: None,
            submitted: false,
        };
        {
            let mut ring = self.ring.borrow_mut();
            assert!(
                ring.completion().is_empty() && ring.submission().is_empty(),
                "every pair is reaped before the next"
            );
            // SAFETY: the entries point into `pair.buf`, which `pair`
            // keeps alive until both completions are reaped (its Drop
            // waits for them, or leaks the buffer), and use `fd`, which
            // the caller's file keeps open for as long as this future lives.
            #[allow(unsafe_code)]
            let pushed = unsafe {
                let mut sq = ring.submission();
                sq.push(&write).is_ok() && sq.push(&sync).is_ok()
            };
            assert!(pushed, "an empty ring of 4 entries takes two");
            loop {
                match super::submit_queued(&mut ring) {
                    Ok(2) => break,
                    Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                    // io_uring_enter fails without submitting only when
                    // it took no entry: both still queued means neither
                    // reached the kernel. They stay queued in a ring
                    // never entered again.
                    refused if ring.submission().len() == 2 => {
                        self.dead.set(true);
                        let e = refused.err().unwrap_or_else(|| io::Error::other("io_uring took neither request"));
                        return Outcome::NotSubmitted(pair.buf.take().expect("the buffer is here"), Some(e));
                    }
                    // The write was taken and the fdatasync not (or the
                    // kernel says so): submitting that later, unlinked,
                    // could sync before the write lands. Fail the batch
                    // (the log fail-stops), never enter this ring again
                    // and leave the buffer to the kernel.
                    taken => {
                        self.dead.set(true);
                        pair.abandon();
                        let e = taken.err().unwrap_or_else(|| io::Error::other("io_uring took 1 of 2 requests"));
                        return Outcome::Done(Err(e));
                    }
                }
            }
            pair.submitted = true;
        }
        while !pair.reap() {
            if let Err(e) = self.event.read_at(0, 8).await {
                // Cannot wait through the reactor: wait here, and use
                // the reactor path from now on.
                tracing::warn!(error = %e, "reading the file's io_uring eventfd failed");
                pair.finish_blocking();
                self.dead.set(true);
                break;
            }
        }
        pair.submitted = false;
        let result = pair.result(len, pos);
        if result.is_err() {
            // After a failure, a completion the kernel still posts must
            // not meet the next pair: use the reactor path from now on.
            self.dead.set(true);
        }
        Outcome::Done(result)
    }
}

/// A request pair in flight and its buffer.
struct InFlight<'a> {
    ring: &'a RefCell<IoUring>,
    dead: &'a Cell<bool>,
    buf: Option<DmaBuffer>,
    skip_write_cqe: bool,
    wrote: Option<i32>,
    synced: Option<i32>,
    /// Completions are owed (Drop waits for them).
    submitted: bool,
}

impl InFlight<'_> {
    /// Takes whatever completions are there; true once the pair is done.
    fn reap(&mut self) -> bool {
        let mut ring = self.ring.borrow_mut();
        for cqe in ring.completion() {
            match cqe.user_data() {
                WRITE => self.wrote = Some(cqe.result()),
                SYNC => self.synced = Some(cqe.result()),
                other => unreachable!("unknown user_data {other}"),
            }
        }
        if self.skip_write_cqe {
            // The write posts a completion only when it failed or was
            // short, and then the linked fdatasync posts none (the
            // kernel skips the completions of the rest of a failed
            // link); no write completion means it wrote everything,
            // and the fdatasync's completion, whatever its result,
            // ends the pair.
            self.wrote.is_some() || self.synced.is_some()
        } else {
            // Both always post (a failed write cancels the fdatasync:
            // -ECANCELED).
            self.wrote.is_some() && self.synced.is_some()
        }
    }

    /// Gives up on a pair the kernel may still be working on: its
    /// buffer is leaked (the kernel may read it) and nothing waits.
    fn abandon(&mut self) {
        std::mem::forget(self.buf.take());
        self.submitted = false;
    }

    /// Waits for the pair, blocking the thread. If waiting fails, the
    /// buffer is leaked (the kernel may still read it) and the ring is
    /// not used again.
    fn finish_blocking(&mut self) {
        while !self.reap() {
            let waited = self.ring.borrow_mut().submit_and_wait(1);
            match waited {
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => {
                    tracing::error!(error = %e, "waiting on the file's own io_uring failed: its buffer is leaked");
                    std::mem::forget(self.buf.take());
                    self.dead.set(true);
                    self.wrote = self.wrote.or(Some(-libc::EIO));
                    self.synced = self.synced.or(Some(-libc::EIO));
                    return;
                }
            }
        }
    }

    fn result(&self, len: usize, pos: u64) -> io::Result<()> {
        let synced = self.synced.unwrap_or(-libc::EIO);
        // Skipped: the write succeeded in full.
        let wrote = self.wrote.unwrap_or(len as i32);
        if wrote < 0 {
            return Err(io::Error::from_raw_os_error(-wrote));
        }
        if wrote as usize != len {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {wrote} of {len} bytes at {pos}"),
            ));
        }
        if synced < 0 {
            return Err(io::Error::from_raw_os_error(-synced));
        }
        Ok(())
    }
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        if self.submitted {
            self.finish_blocking();
        }
    }
}
