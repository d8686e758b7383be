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
    /// Reads up to `len` bytes at `pos`; fewer only at the end of the file.
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>>;
    /// Writes all of `data` at `pos`; both page-aligned (see module docs).
    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()>;
    /// fdatasync: everything written before is durable when this returns Ok.
    /// After an error nothing about unsynced writes is known: callers must
    /// fail-stop, never retry and then trust the data.
    async fn sync(&self) -> io::Result<()>;
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
        Ok(DmaDiskFile { file: Rc::new(file), path: path.to_path_buf() })
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
        std::fs::write(&probe, vec![0xa5u8; PAGE_BYTES as usize])?;
        let opened = OpenOptions::new().read(true).dma_open(&probe).await;
        let _ = std::fs::remove_file(&probe);
        opened.map_err(glommio_err)?.close().await.map_err(glommio_err)?;
        PROBED.with(|p| p.borrow_mut().insert(dev));
        Ok(())
    }
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
    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        // DmaFile::read_at aligns internally; reads past the end come back short.
        let r = self.file.read_at(pos, len).await.map_err(glommio_err)?;
        Ok(r.to_vec())
    }

    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()> {
        assert!(pos.is_multiple_of(PAGE_BYTES) && (data.len() as u64).is_multiple_of(PAGE_BYTES));
        // One copy into a DMA-able buffer. The flusher could build batches in
        // DMA buffers directly; a memcpy of <= flush_bytes_max is small next to
        // an fdatasync, so this stays simple for now.
        let mut buf = self.file.alloc_dma_buffer(data.len());
        buf.as_bytes_mut().copy_from_slice(data);
        let n = self.file.write_at(buf, pos).await.map_err(glommio_err)?;
        if n != data.len() {
            return Err(io::Error::new(
                io::ErrorKind::WriteZero,
                format!("short write: {n} of {} bytes at {pos}", data.len()),
            ));
        }
        Ok(())
    }

    async fn sync(&self) -> io::Result<()> {
        self.file.fdatasync().await.map_err(glommio_err)
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
