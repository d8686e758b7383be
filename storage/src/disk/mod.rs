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
use std::time::Duration;

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
    /// request and block the thread until it completes (how it waits is
    /// the backend's own policy, e.g. [`DmaDisk::new`]'s `lone_yield_max`).
    async fn write_and_sync(&self, pos: u64, data: &[u8]) -> io::Result<()> {
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
#[derive(Clone, Debug)]
pub struct DmaDisk {
    lone_yield_max: Duration,
}

impl DmaDisk {
    /// A backend whose [`DiskFile::write_and_sync`] (the flusher's lone
    /// batches), while the shard thread waits for its linked request,
    /// yields the CPU in a loop (`sched_yield`) for up to `lone_yield_max`,
    /// then sleeps on the ring: each return from the kernel runs the
    /// completion work, so neither the thread nor its idle CPU is woken per
    /// message (lower latency one at a time), at the price of a busy CPU
    /// meanwhile (more broker CPU per message; it counts against a CPU
    /// quota; figures: bench/RESULTS.md, sixth session). Zero: sleep at
    /// once. [`EntryLog::open`](crate::EntryLog::open) uses the default,
    /// 1 ms.
    pub fn new(lone_yield_max: Duration) -> DmaDisk {
        DmaDisk { lone_yield_max }
    }
}

impl Default for DmaDisk {
    /// `lone_yield_max` of 1 ms.
    fn default() -> DmaDisk {
        DmaDisk::new(Duration::from_millis(1))
    }
}

/// A glommio DMA file. Owned by one shard's executor; never crosses cores.
pub struct DmaDiskFile {
    file: Rc<DmaFile>,
    path: PathBuf,
    /// [`DmaDisk::new`]'s `lone_yield_max`.
    lone_yield_max: Duration,
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
            lone_yield_max: self.lone_yield_max,
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
    /// the CPU in a loop for up to `lone_yield_max`, then sleeping), instead
    /// of two round trips through glommio's reactor. Each of those costs a
    /// reactor wake-up, its timer re-arming and a park (`membarrier`), on
    /// the executor's one CPU, which the kernel's completion workers share:
    /// for a lone 4 KiB batch those round trips outweigh the rest of the
    /// broker's work (bench/RESULTS.md, "Where a lone message's time goes").
    /// Blocking is only for the flusher's lone small batches; anything
    /// larger, or a thread where the ring cannot be made, takes the reactor
    /// path.
    async fn write_and_sync(&self, pos: u64, data: &[u8]) -> io::Result<()> {
        assert!(pos.is_multiple_of(PAGE_BYTES) && (data.len() as u64).is_multiple_of(PAGE_BYTES));
        use std::os::unix::io::AsRawFd;
        if let Some(r) = linked::write_and_sync(self.file.as_raw_fd(), pos, data, self.lone_yield_max) {
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
mod fault;

/// The production backend's linked write + fdatasync
/// ([`DmaDiskFile::write_and_sync`]): one io_uring per executor thread,
/// private to it, with its own page-aligned buffer (O_DIRECT), used only
/// synchronously: every call reaps both completions before it returns, so
/// nothing in flight ever outlives a call.
mod linked;

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
mod owned;

/// [`DmaDiskFile::write_buf_and_sync`]: a write and an fdatasync linked on
/// a small io_uring of the file's own, awaited through an eventfd that the
/// ring raises on every completion and that glommio's reactor reads. One
/// request pair at a time per file (a semaphore); a pair in flight when
/// its future is dropped is waited for, blocking, before its buffer goes.
mod chained;

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
        let disk = DmaDisk::new(std::time::Duration::from_micros(500));
        disk.prepare(dir).await.unwrap();
        let file = disk.open(&dir.join("f"), OpenMode::Create).await.unwrap();
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
            file.write_and_sync(0, &page(1)).await.unwrap();
            fault::refuse_next(libc::EAGAIN);
            file.write_and_sync(PAGE_BYTES, &page(2)).await.unwrap();
            assert_eq!(fault::take(), None, "the refusal was met");
            fault::refuse_next(libc::EAGAIN);
            file.write_and_sync(2 * PAGE_BYTES, &page(3)).await.unwrap();
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
