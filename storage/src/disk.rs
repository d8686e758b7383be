//! The one small trait through which every byte reaches the disk, and its
//! production backend on glommio DMA files (O_DIRECT, io_uring).
//!
//! Keeping all disk access behind [`Disk`]/[`DiskFile`] lets the tests swap in
//! [`crate::sim::SimDisk`], which keeps the *written* and the *durable* image of
//! every file apart and can produce what a crash could leave behind.
//!
//! Contract every backend honours (and the simulator enforces with asserts):
//! writes are at [`PAGE_BYTES`]-aligned positions with lengths that are
//! multiples of [`PAGE_BYTES`]; nothing written is durable until
//! [`DiskFile::sync`] returned `Ok`; a name created, renamed or removed is not
//! durable until [`Disk::sync_dir`] of its directory returned `Ok`.

use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use glommio::io::{Directory, DmaFile, OpenOptions};

/// Unit of alignment for every write, on every file this crate writes.
pub const PAGE_BYTES: u64 = 4096;

/// How [`Disk::open`] treats a missing or existing file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OpenMode {
    /// The file must exist (`NotFound` otherwise).
    Existing,
    /// Open, creating an empty file when missing.
    Create,
    /// Create, or truncate an existing file to zero length.
    Truncate,
}

/// A filesystem as the entry log sees it. Single-threaded: every backend lives
/// on one shard's executor and never crosses cores.
#[allow(async_fn_in_trait)] // Everything runs on one glommio executor: no Send bounds wanted.
pub trait Disk: Clone + 'static {
    type File: DiskFile;
    async fn open(&self, path: &Path, mode: OpenMode) -> io::Result<Self::File>;
    async fn remove(&self, path: &Path) -> io::Result<()>;
    /// Atomically replaces `to` with `from` (both in the same directory).
    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()>;
    /// Makes creations, renames and removals of names in `dir` durable.
    async fn sync_dir(&self, dir: &Path) -> io::Result<()>;
    async fn create_dir_all(&self, dir: &Path) -> io::Result<()>;
    /// Names (not paths) of the regular files in `dir`, unsorted.
    async fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>>;
    /// Called once by `open` after the directories exist, before any data
    /// file is opened. Backends that need no preparation do nothing.
    async fn prepare(&self, _dir: &Path) -> io::Result<()> {
        Ok(())
    }
    /// Whether `dir` is on tmpfs (no O_DIRECT, no durability). Backends that
    /// are not real filesystems answer `false`.
    fn is_tmpfs(&self, _dir: &Path) -> io::Result<bool> {
        Ok(false)
    }
}

/// An open file. Single-threaded, like its [`Disk`].
#[allow(async_fn_in_trait)]
pub trait DiskFile: 'static {
    /// A buffer [`write_buf`](Self::write_buf) can write without copying it
    /// first (for the production backend, memory the kernel can DMA from).
    type Buf: AsRef<[u8]> + AsMut<[u8]>;
    /// A buffer of exactly `len` bytes for [`write_buf`](Self::write_buf).
    /// Its contents are unspecified (not zeroed): the caller writes every byte.
    fn alloc_buf(&self, len: usize) -> Self::Buf;
    /// [`write_at`](Self::write_at) of a whole buffer from
    /// [`alloc_buf`](Self::alloc_buf), without the copy `write_at` may make.
    async fn write_buf(&self, pos: u64, buf: Self::Buf) -> io::Result<()>;
    /// Reads up to `len` bytes at `pos`; fewer only at the end of the file.
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>>;
    /// [`read_at`](Self::read_at) into a buffer the result is a view of,
    /// for reads whose bytes are handed on as [`bytes::Bytes`] slices (the
    /// entry log's reads for consumers). A backend may read straight into
    /// that buffer instead of copying it out of one of its own.
    async fn read_bytes(&self, pos: u64, len: usize) -> io::Result<bytes::Bytes> {
        self.read_at(pos, len).await.map(bytes::Bytes::from)
    }
    /// Writes all of `data` at `pos`; both page-aligned (see module docs).
    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()>;
    /// fdatasync: everything written before is durable when this returns Ok.
    /// After an error nothing about unsynced writes is known: callers must
    /// fail-stop, never retry and then trust the data.
    async fn sync(&self) -> io::Result<()>;
    /// [`write_at`](Self::write_at) then [`sync`](Self::sync): `data` and
    /// everything written before are durable when this returns Ok (errors as
    /// for `sync`). For a caller with nothing else to do meanwhile (the
    /// flusher, for a lone small batch): a backend may do both as one
    /// request and block the thread until it completes, yielding the CPU
    /// in a loop for up to `yield_max` first.
    async fn write_and_sync(&self, pos: u64, data: &[u8], yield_max: std::time::Duration) -> io::Result<()> {
        let _ = yield_max;
        self.write_at(pos, data).await?;
        self.sync().await
    }
    /// [`write_buf`](Self::write_buf) then [`sync`](Self::sync), without
    /// blocking the thread: `buf` and everything written before are durable
    /// when this returns Ok (errors as for `sync`). A backend may submit
    /// both as one linked request, saving the wake-up between them.
    async fn write_buf_and_sync(&self, pos: u64, buf: Self::Buf) -> io::Result<()> {
        self.write_buf(pos, buf).await?;
        self.sync().await
    }
    /// The log writes this file no more for now (the flusher moved to the
    /// next segment): a backend may free what it keeps for writing it.
    fn writes_done(&self) {}
    /// Reserves space so the file is at least `len` bytes long (zeros).
    async fn allocate(&self, len: u64) -> io::Result<()>;
    async fn truncate(&self, len: u64) -> io::Result<()>;
    async fn size(&self) -> io::Result<u64>;
}

/// Production backend: glommio DMA files (O_DIRECT) on the shard's executor.
/// Single-threaded: used only on the executor that created it.
#[derive(Clone, Debug, Default)]
pub struct DmaDisk;

/// A glommio DMA file. Owned by one shard's executor; never crosses cores.
pub struct DmaDiskFile {
    file: Rc<DmaFile>,
    path: PathBuf,
    /// This file's own io_uring for [`DiskFile::write_buf_and_sync`], made
    /// on first use (only the segment the flusher appends to gets one) and
    /// dropped by [`DiskFile::writes_done`].
    chain: std::cell::RefCell<Chain>,
}

enum Chain {
    Untried,
    Ready(Rc<chained::Ring>),
    /// Could not be made: the reactor path, for good.
    Unavailable,
}

impl std::fmt::Debug for DmaDiskFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DmaDiskFile").field("path", &self.path).finish()
    }
}

fn glommio_err(e: glommio::GlommioError<()>) -> io::Error {
    io::Error::from(e)
}

impl Disk for DmaDisk {
    type File = DmaDiskFile;

    async fn open(&self, path: &Path, mode: OpenMode) -> io::Result<DmaDiskFile> {
        let mut opts = OpenOptions::new();
        // DmaFile::create opens write-only; recovery reads what it wrote.
        opts.read(true).write(true);
        match mode {
            OpenMode::Existing => {}
            OpenMode::Create => {
                opts.create(true);
            }
            OpenMode::Truncate => {
                opts.create(true).truncate(true);
            }
        }
        let file = opts.dma_open(path).await.map_err(glommio_err)?;
        Ok(DmaDiskFile {
            file: Rc::new(file),
            path: path.to_path_buf(),
            chain: std::cell::RefCell::new(Chain::Untried),
        })
    }

    async fn remove(&self, path: &Path) -> io::Result<()> {
        glommio::io::remove(path).await.map_err(glommio_err)
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        glommio::io::rename(from, to).await.map_err(glommio_err)
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        // glommio 0.9's Directory::open fails with EBADF on a relative path
        // (e.g. the default `--data-dir ./data`): make it absolute first.
        let abs;
        let dir = if dir.is_relative() {
            abs = std::env::current_dir()?.join(dir);
            abs.as_path()
        } else {
            dir
        };
        let d = Directory::open(dir).await.map_err(glommio_err)?;
        let synced = d.sync().await.map_err(glommio_err);
        let closed = d.close().await.map_err(glommio_err);
        synced.and(closed)
    }

    async fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        // Blocking, but only at open time and cheap; the shard serves nothing yet.
        std::fs::create_dir_all(dir)
    }

    async fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        // Blocking, but only during open/recovery, before the shard serves anything.
        let mut names = Vec::new();
        for ent in std::fs::read_dir(dir)? {
            let ent = ent?;
            if ent.file_type()?.is_file() {
                if let Some(n) = ent.file_name().to_str() {
                    names.push(n.to_string());
                }
            }
        }
        Ok(names)
    }

    fn is_tmpfs(&self, dir: &Path) -> io::Result<bool> {
        Ok(fs_type(dir)?.as_deref() == Some("tmpfs"))
    }

    /// Works around a glommio 0.9 probe: the first DMA file an executor
    /// thread opens on a device decides, by one O_DIRECT read through the
    /// io_uring poll ring, whether that device supports IOPOLL, and caches the
    /// answer per thread. When that file is empty the read returns 0 bytes
    /// without reaching the device, IOPOLL is wrongly assumed, and every later
    /// read fails with EOPNOTSUPP (seen on virtio disks). So the first DMA
    /// open on each device is a file holding one page of real data.
    async fn prepare(&self, dir: &Path) -> io::Result<()> {
        use std::os::unix::fs::MetadataExt;
        thread_local!(static PROBED: std::cell::RefCell<std::collections::HashSet<u64>> =
            std::cell::RefCell::new(std::collections::HashSet::new()));
        let dev = std::fs::metadata(dir)?.dev();
        if PROBED.with(|p| p.borrow().contains(&dev)) {
            return Ok(());
        }
        let probe = dir.join(".dma-probe");
        // Blocking, once per device and thread, at open time.
        let file = match std::fs::write(&probe, vec![0xa5u8; PAGE_BYTES as usize]) {
            Ok(()) => probe.clone(),
            // A full disk (a process restarted after ENOSPC): a file of
            // this shard whose first page holds written data does as well.
            Err(e) => {
                let _ = std::fs::remove_file(&probe);
                match page_file(dir, dev) {
                    Some(f) => f,
                    None => return Err(e),
                }
            }
        };
        let opened = OpenOptions::new().read(true).dma_open(&file).await;
        let _ = std::fs::remove_file(&probe);
        opened.map_err(glommio_err)?.close().await.map_err(glommio_err)?;
        PROBED.with(|p| p.borrow_mut().insert(dev));
        Ok(())
    }
}

/// A file for [`DmaDisk::prepare`]'s probe when it cannot write its own:
/// a regular file (not a symlink) on device `dev`, in `dir` (the shard's
/// checkpoint, looked at first) or its `log/` (segments), whose first page
/// holds a non-zero byte. That byte proves the block was written: a
/// fallocated spare segment or a hole reads as zeros without reaching the
/// device, which is exactly what fools glommio's probe.
fn page_file(dir: &Path, dev: u64) -> Option<PathBuf> {
    use std::io::Read;
    use std::os::unix::fs::MetadataExt;
    let written = |p: &Path| -> bool {
        let Ok(m) = std::fs::symlink_metadata(p) else { return false };
        if !m.is_file() || m.dev() != dev || m.len() < PAGE_BYTES {
            return false;
        }
        let mut page = vec![0u8; PAGE_BYTES as usize];
        std::fs::File::open(p).and_then(|mut f| f.read_exact(&mut page)).is_ok() && page.iter().any(|&b| b != 0)
    };
    [dir.to_path_buf(), dir.join("log")].into_iter().find_map(|d| {
        let mut paths: Vec<PathBuf> = std::fs::read_dir(d).ok()?.flatten().map(|e| e.path()).collect();
        // Oldest segments first: the newest may be a spare made ahead.
        paths.sort();
        paths.into_iter().find(|p| written(p))
    })
}

/// The filesystem type of the mount holding `dir`, from /proc/self/mountinfo
/// (safe code only: the workspace denies `unsafe`, so no statfs(2)).
fn fs_type(dir: &Path) -> io::Result<Option<String>> {
    let dir = std::fs::canonicalize(dir)?;
    let info = std::fs::read_to_string("/proc/self/mountinfo")?;
    let mut best: Option<(usize, String)> = None;
    for line in info.lines() {
        let fields: Vec<&str> = line.split(' ').collect();
        let Some(mount_point) = fields.get(4) else {
            continue;
        };
        let Some(sep) = fields.iter().position(|f| *f == "-") else {
            continue;
        };
        let Some(fstype) = fields.get(sep + 1) else {
            continue;
        };
        let mp = mount_point.replace("\\040", " ");
        if dir.starts_with(&mp) && best.as_ref().is_none_or(|(len, _)| mp.len() >= *len) {
            best = Some((mp.len(), (*fstype).to_string()));
        }
    }
    Ok(best.map(|(_, t)| t))
}

impl DiskFile for DmaDiskFile {
    type Buf = glommio::io::DmaBuffer;

    fn alloc_buf(&self, len: usize) -> glommio::io::DmaBuffer {
        self.file.alloc_dma_buffer(len)
    }

    async fn write_buf(&self, pos: u64, buf: glommio::io::DmaBuffer) -> io::Result<()> {
        let len = buf.len();
        assert!(pos.is_multiple_of(PAGE_BYTES) && (len as u64).is_multiple_of(PAGE_BYTES));
        let n = self.file.write_at(buf, pos).await.map_err(glommio_err)?;
        if n != len {
            return Err(io::Error::new(io::ErrorKind::WriteZero, format!("short write: {n} of {len} bytes at {pos}")));
        }
        Ok(())
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        // Aligned here, not by DmaFile::read_at: of a stretch running past
        // the end of the file, glommio 0.9's returns `len` bytes from `pos`
        // whenever the aligned read got at least `len`, counting the bytes
        // before `pos` that the alignment added (so some past the end).
        let (start, skip, size) = aligned_span(pos, len)
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, format!("a read of {len} bytes is too long")))?;
        let r = self.file.read_at_aligned(start, size).await.map_err(glommio_err)?;
        let end = r.len().min(skip + len);
        Ok(r.get(skip.min(end)..end).unwrap_or_default().to_vec())
    }

    /// Reads on the executor's own io_uring ([`owned`]) straight into a
    /// buffer the returned bytes are a view of, instead of through
    /// glommio's, whose read buffer cannot leave the thread (its
    /// `ReadResult` is not `Send`, and entries go to other shards'
    /// connections) and so had to be copied out: a copy of every byte a
    /// catch-up from disk reads (figures in bench/RESULTS.md). Falls back to
    /// [`read_at`](DiskFile::read_at) and a copy when that ring cannot be
    /// made or refuses the request.
    async fn read_bytes(&self, pos: u64, len: usize) -> io::Result<bytes::Bytes> {
        use std::os::unix::io::AsRawFd;
        if let Some(r) = owned::read(self.file.as_raw_fd(), pos, len).await {
            return r;
        }
        self.read_at(pos, len).await.map(bytes::Bytes::from)
    }

    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()> {
        // One copy into a DMA-able buffer (the flusher builds its batches in
        // one from `alloc_buf` instead).
        let mut buf = self.file.alloc_dma_buffer(data.len());
        buf.as_bytes_mut().copy_from_slice(data);
        self.write_buf(pos, buf).await
    }

    async fn sync(&self) -> io::Result<()> {
        self.file.fdatasync().await.map_err(glommio_err)
    }

    /// Submits the write and the fdatasync linked (`IOSQE_IO_LINK`: the
    /// fdatasync starts only once the whole write succeeded) on this thread's
    /// own small io_uring and waits for both, blocking the executor (yielding
    /// the CPU in a loop for up to `yield_max`, then sleeping), instead
    /// of two round trips through glommio's reactor. Each of those costs a
    /// reactor wake-up, its timer re-arming and a park (`membarrier`), on
    /// the executor's one CPU, which the kernel's completion workers share:
    /// for a lone 4 KiB batch those round trips outweigh the rest of the
    /// broker's work (bench/RESULTS.md, "Where a lone message's time goes").
    /// Blocking is only for the flusher's lone small batches; anything
    /// larger, or a thread where the ring cannot be made, takes the reactor
    /// path.
    async fn write_and_sync(&self, pos: u64, data: &[u8], yield_max: std::time::Duration) -> io::Result<()> {
        assert!(pos.is_multiple_of(PAGE_BYTES) && (data.len() as u64).is_multiple_of(PAGE_BYTES));
        use std::os::unix::io::AsRawFd;
        if let Some(r) = linked::write_and_sync(self.file.as_raw_fd(), pos, data, yield_max) {
            return r;
        }
        self.write_at(pos, data).await?;
        self.sync().await
    }

    /// The write and the fdatasync linked (`IOSQE_IO_LINK`) on this file's
    /// own small io_uring, whose completions raise an eventfd the reactor
    /// reads: the reactor wakes the flusher once per batch instead of twice
    /// (after the write, to submit the fdatasync, then after that; the
    /// write's completion still runs as kernel work on this thread, which
    /// is what issues the linked fdatasync), and the executor runs other
    /// tasks meanwhile. Falls back to the reactor path when the ring
    /// cannot be made or refuses the request before taking it.
    async fn write_buf_and_sync(&self, pos: u64, buf: glommio::io::DmaBuffer) -> io::Result<()> {
        use std::os::unix::io::AsRawFd;
        assert!(pos.is_multiple_of(PAGE_BYTES) && (buf.len() as u64).is_multiple_of(PAGE_BYTES));
        let ring = {
            let mut chain = self.chain.borrow_mut();
            match &*chain {
                Chain::Ready(r) => Some(r.clone()),
                Chain::Unavailable => None,
                Chain::Untried => match chained::Ring::new() {
                    Ok(r) => {
                        let r = Rc::new(r);
                        *chain = Chain::Ready(r.clone());
                        Some(r)
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, path = %self.path.display(), "no io_uring of the file's own: batches go through the reactor");
                        *chain = Chain::Unavailable;
                        None
                    }
                },
            }
        };
        let buf = match ring {
            Some(r) => match r.write_and_sync(self.file.as_raw_fd(), pos, buf).await {
                chained::Outcome::Done(result) => return result,
                chained::Outcome::NotSubmitted(buf, e) => {
                    if let Some(e) = e {
                        tracing::warn!(error = %e, path = %self.path.display(), "the file's own io_uring refused a request: its batches go through the reactor");
                    }
                    buf
                }
            },
            None => buf,
        };
        self.write_buf(pos, buf).await?;
        self.sync().await
    }

    fn writes_done(&self) {
        let mut chain = self.chain.borrow_mut();
        if matches!(*chain, Chain::Ready(_)) {
            // A call still running keeps its clone until it returns.
            *chain = Chain::Untried;
        }
    }

    async fn allocate(&self, len: u64) -> io::Result<()> {
        self.file.pre_allocate(len, false).await.map_err(glommio_err)
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        self.file.truncate(len).await.map_err(glommio_err)
    }

    async fn size(&self) -> io::Result<u64> {
        self.file.file_size().await.map_err(glommio_err)
    }
}

/// The page-aligned stretch an O_DIRECT read of `len` bytes at `pos`
/// covers: its start, how many of its bytes come before `pos`, and its
/// length; `None` when that length overflows.
fn aligned_span(pos: u64, len: usize) -> Option<(u64, usize, usize)> {
    let start = pos / PAGE_BYTES * PAGE_BYTES;
    let skip = (pos - start) as usize;
    let size = skip.checked_add(len)?.checked_next_multiple_of(PAGE_BYTES as usize)?;
    Some((start, skip, size))
}

/// A new eventfd that `ring` raises on every completion, as a file glommio's
/// reactor can read (blocking, so that a read of it waits for a completion
/// instead of failing EAGAIN); closed when dropped, through the reactor of
/// the executor it was made on.
fn completion_eventfd(ring: &io_uring::IoUring) -> io::Result<glommio::io::BufferedFile> {
    use std::os::unix::io::FromRawFd;
    // SAFETY: eventfd takes no pointers; the result is checked.
    #[allow(unsafe_code)]
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: `fd` is a fresh eventfd owned by nothing else; the file
    // closes it.
    #[allow(unsafe_code)]
    let event = unsafe { glommio::io::BufferedFile::from_raw_fd(fd) };
    ring.submitter().register_eventfd(fd)?;
    Ok(event)
}

/// Enters a private io_uring (the lone ring, a file's ring) to submit what is
/// queued. Tests can make the next call on this thread fail as
/// `io_uring_enter` can before it takes anything ([`fault::refuse_next`]).
fn submit_queued(ring: &mut io_uring::IoUring) -> io::Result<usize> {
    #[cfg(test)]
    if let Some(errno) = fault::take() {
        return Err(io::Error::from_raw_os_error(errno));
    }
    ring.submit()
}

#[cfg(test)]
mod fault {
    use std::cell::Cell;

    thread_local! {
        static NEXT: Cell<Option<i32>> = const { Cell::new(None) };
    }

    /// The next `submit_queued` on this thread fails with `errno`, taking
    /// nothing (both entries stay queued, as after a real EAGAIN).
    pub fn refuse_next(errno: i32) {
        NEXT.with(|n| n.set(Some(errno)));
    }

    pub fn take() -> Option<i32> {
        NEXT.with(|n| n.take())
    }
}

/// The production backend's linked write + fdatasync
/// ([`DmaDiskFile::write_and_sync`]): one io_uring per executor thread,
/// private to it, with its own page-aligned buffer (O_DIRECT), used only
/// synchronously: every call reaps both completions before it returns, so
/// nothing in flight ever outlives a call.
mod linked {
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
}

mod arena;

/// [`DmaDiskFile::read_bytes`]: reads into buffers of our own, on a small
/// io_uring per executor whose completions raise an eventfd that glommio's
/// reactor reads (as [`chained`] does for writes). Up to [`owned::SLOTS`]
/// reads are in flight at once; a task reaps the completions while any is
/// and wakes each reader. A reader dropped before its read completed
/// leaves the buffer to the ring, which frees it when the completion comes
/// (the kernel may write into it until then); a ring dropped with reads in
/// flight (its executor ended with them) waits a little for them, and
/// leaks the buffers of those still not done.
///
/// Reads up to [`arena::FIXED_BYTES`] go into one of [`arena::FIXED_COUNT`]
/// buffers registered with the ring (`READ_FIXED`), as glommio's own reads
/// do: into heap memory, the kernel pins and dirties every page per read
/// (`get_user_pages`, `bio_set_pages_dirty`), costing nearly as much as
/// the copy this path spares; registered buffers are pinned once. They are
/// handed on inside the returned bytes and come back when the last view of
/// them drops, on whatever thread; when none is free, a read takes heap
/// memory.
mod owned {
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
                                    *slot =
                                        Slot::Done { buf: Buffer::Heap { vec: Vec::new(), at: 0 }, res: -libc::EIO };
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
}

/// [`DmaDiskFile::write_buf_and_sync`]: a write and an fdatasync linked on
/// a small io_uring of the file's own, awaited through an eventfd that the
/// ring raises on every completion and that glommio's reactor reads. One
/// request pair at a time per file (a semaphore); a pair in flight when
/// its future is dropped is waited for, blocking, before its buffer goes.
mod chained {
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
            let write =
                opcode::Write::new(types::Fd(fd), buf.as_ptr(), u32::try_from(len).expect("a batch under 4 GiB"))
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
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::os::unix::fs::MetadataExt;

    /// Runs `f` on a glommio executor of its own thread; fails after `secs`.
    fn on_executor<F, Fut>(secs: u64, f: F)
    where
        F: FnOnce() -> Fut + Send + 'static,
        Fut: std::future::Future<Output = ()> + 'static,
    {
        let (done, finished) = std::sync::mpsc::channel();
        let worker = std::thread::spawn(move || {
            glommio::LocalExecutorBuilder::default().make().unwrap().run(f());
            let _ = done.send(());
        });
        match finished.recv_timeout(std::time::Duration::from_secs(secs)) {
            Ok(()) | Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                if let Err(panic) = worker.join() {
                    std::panic::resume_unwind(panic);
                }
            }
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => panic!("test hung for {secs} s"),
        }
    }

    /// A DMA file in a fresh directory of the real disk, and its pages of
    /// `byte`.
    async fn dma_file(dir: &Path) -> DmaDiskFile {
        DmaDisk.prepare(dir).await.unwrap();
        let file = DmaDisk.open(&dir.join("f"), OpenMode::Create).await.unwrap();
        file.allocate(16 * PAGE_BYTES).await.unwrap();
        file
    }

    async fn assert_pages(file: &DmaDiskFile, want: &[u8]) {
        let page = PAGE_BYTES as usize;
        let data = file.read_at(0, want.len() * page).await.unwrap();
        for (i, &byte) in want.iter().enumerate() {
            assert!(data[i * page..(i + 1) * page].iter().all(|&b| b == byte), "page {i} does not hold {byte}");
        }
    }

    /// Goal: when the kernel refuses the lone path's linked pair before
    /// taking it (EAGAIN from io_uring_enter), the batch is still written
    /// and synced (by the reactor), nothing fails, and this thread's lone
    /// ring is not used again. Method: a real file; the refusal injected
    /// before the second write; a third refusal armed afterwards must stay
    /// unconsumed (no private ring entered), and every page reads back.
    #[test]
    fn lone_ring_refused_falls_back_to_the_reactor() {
        let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let dir = tmp.path().to_path_buf();
        on_executor(30, move || async move {
            let file = dma_file(&dir).await;
            let page = |byte: u8| vec![byte; PAGE_BYTES as usize];
            let wait = std::time::Duration::from_micros(500);
            file.write_and_sync(0, &page(1), wait).await.unwrap();
            fault::refuse_next(libc::EAGAIN);
            file.write_and_sync(PAGE_BYTES, &page(2), wait).await.unwrap();
            assert_eq!(fault::take(), None, "the refusal was met");
            fault::refuse_next(libc::EAGAIN);
            file.write_and_sync(2 * PAGE_BYTES, &page(3), wait).await.unwrap();
            assert_eq!(fault::take(), Some(libc::EAGAIN), "the lone ring was entered again");
            assert_pages(&file, &[1, 2, 3]).await;
        });
    }

    /// Goal: the same for a file's own ring (`write_buf_and_sync`): a
    /// refused pair is written through the reactor with the buffer handed
    /// back, the ring is not entered again, and once the log moves on
    /// (`writes_done`) a new ring is made and used. Method: as above.
    #[test]
    fn file_ring_refused_falls_back_to_the_reactor() {
        let tmp = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
        let dir = tmp.path().to_path_buf();
        on_executor(30, move || async move {
            let file = dma_file(&dir).await;
            let page = |byte: u8| {
                let mut b = file.alloc_buf(PAGE_BYTES as usize);
                b.as_mut().fill(byte);
                b
            };
            file.write_buf_and_sync(0, page(1)).await.unwrap();
            fault::refuse_next(libc::EAGAIN);
            file.write_buf_and_sync(PAGE_BYTES, page(2)).await.unwrap();
            assert_eq!(fault::take(), None, "the refusal was met");
            fault::refuse_next(libc::EAGAIN);
            file.write_buf_and_sync(2 * PAGE_BYTES, page(3)).await.unwrap();
            assert_eq!(fault::take(), Some(libc::EAGAIN), "the refused ring was entered again");
            file.writes_done();
            file.write_buf_and_sync(3 * PAGE_BYTES, page(4)).await.unwrap();
            fault::refuse_next(libc::EAGAIN);
            file.write_buf_and_sync(4 * PAGE_BYTES, page(5)).await.unwrap();
            assert_eq!(fault::take(), None, "a new ring was made and entered");
            assert_pages(&file, &[1, 2, 3, 4, 5]).await;
        });
    }

    /// Goal: the probe's fallback never takes a file whose first page was
    /// not written (a fallocated spare segment, a hole: reading it does not
    /// reach the device), nor a symlink; it takes the checkpoint first.
    #[test]
    fn page_file_takes_only_written_pages() {
        let dir = tempfile::tempdir().unwrap();
        let dev = std::fs::metadata(dir.path()).unwrap().dev();
        let log = dir.path().join("log");
        std::fs::create_dir(&log).unwrap();
        // A spare segment: length without written blocks.
        let spare = std::fs::File::create(log.join("00000000000000000001.seg")).unwrap();
        spare.set_len(1 << 20).unwrap();
        // A page of zeros written is not proof either (cannot be told from a hole).
        std::fs::write(log.join("00000000000000000000.seg"), vec![0u8; PAGE_BYTES as usize]).unwrap();
        assert_eq!(page_file(dir.path(), dev), None);
        let mut data = vec![0u8; PAGE_BYTES as usize];
        data[100] = 1;
        std::fs::write(log.join("00000000000000000002.seg"), &data).unwrap();
        assert_eq!(page_file(dir.path(), dev), Some(log.join("00000000000000000002.seg")));
        std::os::unix::fs::symlink(log.join("00000000000000000002.seg"), dir.path().join("a-link")).unwrap();
        assert_eq!(page_file(dir.path(), dev), Some(log.join("00000000000000000002.seg")), "not the symlink");
        std::fs::write(dir.path().join("checkpoint"), &data).unwrap();
        assert_eq!(page_file(dir.path(), dev), Some(dir.path().join("checkpoint")));
        assert_eq!(page_file(dir.path(), dev.wrapping_add(1)), None, "another device");
    }
}
