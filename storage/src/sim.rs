//! A simulated filesystem for crash tests.
//!
//! Every file keeps a *durable* image (what survives a crash for sure) and the
//! list of writes, size changes and directory operations issued since the last
//! `sync`/`sync_dir`. [`SimDisk::crash`] builds the disk a power cut could
//! leave, chosen by a seed: unsynced file operations dropped, all applied, or
//! torn into 512- or 4096-byte pieces of which any subset lands, in any order;
//! unsynced directory operations survive as a prefix (journaled filesystems
//! keep namespace operations in order).
//!
//! Faults: [`SimDisk::crash_at_op`] freezes the disk at the n-th mutating
//! operation (every later operation fails with EIO, and the crash image is
//! taken at that instant), and [`SimDisk::fail_nth`] makes one future write,
//! sync or allocate fail with EIO (or ENOSPC), and [`SimDisk::set_full`]
//! makes the filesystem full: whatever would need new space fails with
//! ENOSPC until it is cleared.
//!
//! Simplification: directories themselves are always durable once created.
//!
//! Single-threaded: a `SimDisk` lives on one executor and never crosses cores.

use std::cell::RefCell;
use std::collections::{BTreeMap, HashMap};
use std::io;
use std::path::{Path, PathBuf};
use std::rc::Rc;

use crate::disk::{Disk, DiskFile, OpenMode, PAGE_BYTES};

/// SplitMix64: tiny, seedable, good enough to choose crash shapes.
#[derive(Debug, Clone)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> Self {
        SimRng(seed ^ 0x5DEE_CE66_D1CE_4E5B)
    }
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        assert!(n > 0);
        self.next_u64() % n
    }
    pub fn chance(&mut self, num: u64, den: u64) -> bool {
        self.below(den) < num
    }
    /// `n` random bytes.
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
    /// A few random damages to a valid encoding, as a fuzzer's mutator would
    /// do: a bit flipped, cut short, a byte inserted or removed, or four bytes
    /// overwritten with an extreme value (all ones, zeros, a large count).
    /// Shared by the decoders' fuzz-style tests (core and `fuzz/`).
    pub fn mutate(&mut self, mut b: Vec<u8>) -> Vec<u8> {
        const EXTREMES: [[u8; 4]; 5] =
            [[0xff; 4], [0; 4], [0x00, 0x00, 0x10, 0x00], [0x01, 0x00, 0x00, 0x80], [0x01, 0x00, 0x10, 0x00]];
        for _ in 0..=self.below(4) {
            let at = self.below(b.len() as u64 + 1) as usize;
            match self.below(5) {
                0 if at < b.len() => b[at] ^= 1 << self.below(8),
                1 => b.truncate(at),
                2 => b.insert(at, self.next_u64() as u8),
                3 if at < b.len() => {
                    b.remove(at);
                }
                _ => {
                    let x = EXTREMES[self.below(EXTREMES.len() as u64) as usize];
                    let end = (at + x.len()).min(b.len());
                    b[at..end].copy_from_slice(&x[..end - at]);
                }
            }
        }
        b
    }
}

/// The error an injected fault returns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultError {
    /// EIO: the device failed.
    Io,
    /// ENOSPC: the filesystem is full.
    NoSpace,
}

impl FaultError {
    fn to_io(self, what: &str) -> io::Error {
        match self {
            FaultError::Io => eio(what),
            // ENOSPC is 28 on Linux; kind() is then StorageFull.
            FaultError::NoSpace => io::Error::from_raw_os_error(28),
        }
    }
}

/// Which kind of operation a [`SimDisk::fail_nth`] fault hits.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FaultKind {
    Write,
    Sync,
    Allocate,
    SyncDir,
}

#[derive(Debug, Clone)]
enum FileOp {
    Write { pos: u64, data: Vec<u8> },
    SetLen(u64),
}

#[derive(Debug, Clone, Default)]
struct Inode {
    durable: Vec<u8>,
    written: Vec<u8>,
    pending: Vec<FileOp>,
    /// A sync failed: its unsynced writes were dropped from the durable path
    /// (as Linux may drop dirty pages after a failed fsync, and report success
    /// on the next one), so `written` no longer converges on `durable`.
    sync_failed: bool,
}

#[derive(Debug, Clone)]
enum DirOp {
    Link(String, u64),
    Unlink(String),
    Rename(String, String),
}

#[derive(Debug, Clone, Default)]
struct Dir {
    written: BTreeMap<String, u64>,
    durable: BTreeMap<String, u64>,
    pending: Vec<DirOp>,
}

#[derive(Debug, Default)]
struct SimState {
    alive: bool,
    inodes: HashMap<u64, Inode>,
    next_inode: u64,
    dirs: BTreeMap<PathBuf, Dir>,
    ops: u64,
    crash_at: Option<(u64, u64)>,
    crashed: Option<SimDisk>,
    faults: Vec<(FaultKind, u64, FaultError)>,
    faults_fired: u64,
    kind_counts: HashMap<FaultKind, u64>,
    /// Every fdatasync first sleeps this long (glommio timer): a slow disk.
    sync_delay: Option<std::time::Duration>,
    /// Bytes returned by file reads so far.
    bytes_read: u64,
    /// The filesystem is full (`SimDisk::set_full`).
    full: bool,
}

/// The simulated disk. Cheap to clone (shared state).
#[derive(Clone, Debug)]
pub struct SimDisk {
    st: Rc<RefCell<SimState>>,
}

impl Default for SimDisk {
    fn default() -> Self {
        Self::new()
    }
}

fn eio(what: &str) -> io::Error {
    io::Error::other(format!("simulated EIO: {what}"))
}

fn apply(img: &mut Vec<u8>, op: &FileOp) {
    match op {
        FileOp::Write { pos, data } => {
            let pos = *pos as usize;
            let end = pos + data.len();
            if img.len() < end {
                img.resize(end, 0);
            }
            img[pos..end].copy_from_slice(data);
        }
        FileOp::SetLen(len) => img.resize(*len as usize, 0),
    }
}

fn apply_dir(entries: &mut BTreeMap<String, u64>, op: &DirOp) {
    match op {
        DirOp::Link(name, ino) => {
            entries.insert(name.clone(), *ino);
        }
        DirOp::Unlink(name) => {
            entries.remove(name);
        }
        DirOp::Rename(from, to) => {
            if let Some(ino) = entries.remove(from) {
                entries.insert(to.clone(), ino);
            }
        }
    }
}

fn split(path: &Path) -> io::Result<(PathBuf, String)> {
    let parent = path.parent().ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no parent"))?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "no file name"))?;
    Ok((parent.to_path_buf(), name.to_string()))
}

impl SimState {
    /// Accounts one mutating operation: fails it if the disk is dead, a fault
    /// is armed for it, or the scheduled crash point is reached.
    fn step(&mut self, kind: Option<FaultKind>, what: &str) -> io::Result<()> {
        if !self.alive {
            return Err(eio(what));
        }
        if let Some((at, seed)) = self.crash_at {
            if self.ops >= at {
                let image = self.image(seed);
                self.crashed = Some(image);
                self.alive = false;
                return Err(eio(what));
            }
        }
        self.ops += 1;
        if let Some(kind) = kind {
            let n = self.kind_counts.entry(kind).or_insert(0);
            let nth = *n;
            *n += 1;
            if let Some(i) = self.faults.iter().position(|f| (f.0, f.1) == (kind, nth)) {
                let (_, _, err) = self.faults.swap_remove(i);
                self.faults_fired += 1;
                return Err(err.to_io(what));
            }
        }
        Ok(())
    }

    fn check_alive(&self, what: &str) -> io::Result<()> {
        if self.alive {
            Ok(())
        } else {
            Err(eio(what))
        }
    }

    fn lookup(&self, path: &Path) -> io::Result<u64> {
        let (parent, name) = split(path)?;
        self.dirs
            .get(&parent)
            .and_then(|d| d.written.get(&name))
            .copied()
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, format!("{}", path.display())))
    }

    /// What a power cut now could leave, chosen by `seed` (`durable_only`:
    /// exactly the synced state, nothing unsynced survives).
    fn image(&self, seed: u64) -> SimDisk {
        self.image_with(seed, false)
    }

    fn image_with(&self, seed: u64, durable_only: bool) -> SimDisk {
        let mut rng = SimRng::new(seed);
        let mut dirs = BTreeMap::new();
        for (path, dir) in &self.dirs {
            let mut durable = dir.durable.clone();
            let keep = if durable_only { 0 } else { rng.below(dir.pending.len() as u64 + 1) as usize };
            for op in &dir.pending[..keep] {
                apply_dir(&mut durable, op);
            }
            dirs.insert(path.clone(), Dir { written: durable.clone(), durable, pending: Vec::new() });
        }
        let mut inodes = HashMap::new();
        let mut ids: Vec<u64> = self.inodes.keys().copied().collect();
        ids.sort_unstable(); // HashMap order is random per process: keep seeds replayable.
        for id in ids {
            let ino = &self.inodes[&id];
            let mut img = ino.durable.clone();
            if !ino.pending.is_empty() && !durable_only {
                match rng.below(4) {
                    0 => {} // nothing unsynced reached the platter
                    1 => {
                        for op in &ino.pending {
                            apply(&mut img, op);
                        }
                    }
                    _ => {
                        // Torn: pieces of 512 or 4096 bytes, any subset, any order.
                        let mut pieces = Vec::new();
                        for op in &ino.pending {
                            match op {
                                FileOp::Write { pos, data } => {
                                    let piece = if rng.chance(1, 2) { 512 } else { 4096 };
                                    for (i, c) in data.chunks(piece).enumerate() {
                                        pieces.push(FileOp::Write { pos: pos + (i * piece) as u64, data: c.to_vec() });
                                    }
                                }
                                FileOp::SetLen(_) => pieces.push(op.clone()),
                            }
                        }
                        for i in (1..pieces.len()).rev() {
                            let j = rng.below(i as u64 + 1) as usize;
                            pieces.swap(i, j);
                        }
                        for p in &pieces {
                            if rng.chance(1, 2) {
                                apply(&mut img, p);
                            }
                        }
                    }
                }
            }
            inodes.insert(id, Inode { durable: img.clone(), written: img, pending: Vec::new(), sync_failed: false });
        }
        SimDisk {
            st: Rc::new(RefCell::new(SimState {
                alive: true,
                inodes,
                next_inode: self.next_inode,
                dirs,
                ..Default::default()
            })),
        }
    }
}

impl SimDisk {
    pub fn new() -> Self {
        SimDisk { st: Rc::new(RefCell::new(SimState { alive: true, next_inode: 1, ..Default::default() })) }
    }

    /// Power cut now: returns the disk as it could be found after reboot, and
    /// kills this one (every later operation on it fails with EIO, so tasks
    /// still holding it cannot touch the new image).
    pub fn crash(&self, seed: u64) -> SimDisk {
        let mut st = self.st.borrow_mut();
        let image = st.crashed.take().unwrap_or_else(|| st.image(seed));
        st.alive = false;
        image
    }

    /// A copy of exactly the durable state, leaving this disk alive: what a
    /// crash that keeps nothing unsynced would leave. Tests fork a disk to
    /// damage one copy and keep the other.
    pub fn fork(&self) -> SimDisk {
        self.st.borrow().image_with(0, true)
    }

    /// Schedules a power cut just before mutating operation number `op`
    /// (0-based, counting from the creation of this disk).
    pub fn crash_at_op(&self, op: u64, seed: u64) {
        self.st.borrow_mut().crash_at = Some((op, seed));
    }

    /// Whether the scheduled crash happened (the disk is frozen).
    pub fn has_crashed(&self) -> bool {
        self.st.borrow().crashed.is_some()
    }

    /// Mutating operations so far.
    pub fn ops(&self) -> u64 {
        self.st.borrow().ops
    }

    /// Makes the `nth` (0-based, counted from this disk's creation) operation
    /// of `kind` fail with EIO.
    pub fn fail_nth(&self, kind: FaultKind, nth: u64) {
        self.fail_nth_with(kind, nth, FaultError::Io);
    }

    /// Like [`fail_nth`](Self::fail_nth), with the error to return (EIO or
    /// ENOSPC). A failed sync also drops that file's unsynced writes from
    /// what can become durable: a later sync that succeeds does not bring
    /// them back (Linux's behaviour after a failed fsync), so a log that
    /// retried a sync and then acknowledged would lose data in the tests.
    pub fn fail_nth_with(&self, kind: FaultKind, nth: u64, error: FaultError) {
        self.st.borrow_mut().faults.push((kind, nth, error));
    }

    /// From now on every fdatasync takes at least `delay` (`None`: as fast
    /// as memory again). Needs a glommio executor while set.
    pub fn delay_syncs(&self, delay: Option<std::time::Duration>) {
        self.st.borrow_mut().sync_delay = delay;
    }

    /// A full filesystem while `full`: a write past a file's end and an
    /// allocation that grows a file fail with ENOSPC (after counting as an
    /// operation); writes inside a file's length, such as into a
    /// preallocated segment, still land. Creating, renaming and removing
    /// names, shrinking and syncing are unaffected.
    pub fn set_full(&self, full: bool) {
        self.st.borrow_mut().full = full;
    }

    /// How many injected faults fired so far.
    pub fn faults_fired(&self) -> u64 {
        self.st.borrow().faults_fired
    }

    /// Bytes file reads returned so far (read amplification in tests).
    pub fn bytes_read(&self) -> u64 {
        self.st.borrow().bytes_read
    }

    /// How many operations of `kind` ran so far.
    pub fn count(&self, kind: FaultKind) -> u64 {
        self.st.borrow().kind_counts.get(&kind).copied().unwrap_or(0)
    }

    /// Names in `dir` (written view), sorted.
    pub fn names(&self, dir: &Path) -> Vec<String> {
        self.st.borrow().dirs.get(dir).map(|d| d.written.keys().cloned().collect()).unwrap_or_default()
    }

    /// The written contents of a file (tests inspect and damage files).
    pub fn contents(&self, path: &Path) -> Option<Vec<u8>> {
        let st = self.st.borrow();
        let ino = st.lookup(path).ok()?;
        Some(st.inodes[&ino].written.clone())
    }

    /// Overwrites bytes of a file in both images, as bit rot or a stray write
    /// would (test hook: bypasses alignment rules and durability).
    pub fn damage(&self, path: &Path, pos: u64, bytes: &[u8]) {
        let mut st = self.st.borrow_mut();
        let ino = st.lookup(path).expect("damage: no such file");
        let inode = st.inodes.get_mut(&ino).expect("inode");
        let op = FileOp::Write { pos, data: bytes.to_vec() };
        apply(&mut inode.written, &op);
        apply(&mut inode.durable, &op);
    }

    /// Writes the written image of every file under `root` (a sim path
    /// `/a/b` becomes `root/a/b`), so tools that read real files (the
    /// offline inspector) can be tested on what a crash left.
    pub fn export(&self, root: &Path) -> io::Result<()> {
        let st = self.st.borrow();
        for (dir, d) in &st.dirs {
            let rel = dir.strip_prefix("/").unwrap_or(dir);
            let out = root.join(rel);
            std::fs::create_dir_all(&out)?;
            for (name, ino) in &d.written {
                if let Some(inode) = st.inodes.get(ino) {
                    std::fs::write(out.join(name), &inode.written)?;
                }
            }
        }
        Ok(())
    }

    /// Sets a file's length in both images (test hook).
    pub fn set_len(&self, path: &Path, len: u64) {
        let mut st = self.st.borrow_mut();
        let ino = st.lookup(path).expect("set_len: no such file");
        let inode = st.inodes.get_mut(&ino).expect("inode");
        apply(&mut inode.written, &FileOp::SetLen(len));
        apply(&mut inode.durable, &FileOp::SetLen(len));
    }
}

/// A file on a [`SimDisk`].
#[derive(Debug)]
pub struct SimFile {
    st: Rc<RefCell<SimState>>,
    ino: u64,
}

impl Disk for SimDisk {
    type File = SimFile;

    async fn open(&self, path: &Path, mode: OpenMode) -> io::Result<SimFile> {
        futures_lite::future::yield_now().await;
        let mut st = self.st.borrow_mut();
        st.check_alive("open")?;
        let found = st.lookup(path);
        let ino = match (found, mode) {
            (Ok(ino), OpenMode::Existing | OpenMode::Create) => ino,
            (Ok(ino), OpenMode::Truncate) => {
                st.step(Some(FaultKind::Write), "truncate on open")?;
                let inode = st.inodes.get_mut(&ino).expect("inode");
                inode.pending.push(FileOp::SetLen(0));
                apply(&mut inode.written, &FileOp::SetLen(0));
                ino
            }
            (Err(e), OpenMode::Existing) => return Err(e),
            (Err(_), OpenMode::Create | OpenMode::Truncate) => {
                let (parent, name) = split(path)?;
                if !st.dirs.contains_key(&parent) {
                    return Err(io::Error::new(io::ErrorKind::NotFound, format!("no directory {}", parent.display())));
                }
                st.step(None, "create")?;
                let ino = st.next_inode;
                st.next_inode += 1;
                st.inodes.insert(ino, Inode::default());
                let dir = st.dirs.get_mut(&parent).expect("dir");
                dir.written.insert(name.clone(), ino);
                dir.pending.push(DirOp::Link(name, ino));
                ino
            }
        };
        Ok(SimFile { st: self.st.clone(), ino })
    }

    async fn remove(&self, path: &Path) -> io::Result<()> {
        futures_lite::future::yield_now().await;
        let mut st = self.st.borrow_mut();
        st.lookup(path)?;
        st.step(None, "remove")?;
        let (parent, name) = split(path)?;
        let dir = st.dirs.get_mut(&parent).expect("dir");
        dir.written.remove(&name);
        dir.pending.push(DirOp::Unlink(name));
        Ok(())
    }

    async fn rename(&self, from: &Path, to: &Path) -> io::Result<()> {
        futures_lite::future::yield_now().await;
        let mut st = self.st.borrow_mut();
        st.lookup(from)?;
        let (p1, n1) = split(from)?;
        let (p2, n2) = split(to)?;
        assert_eq!(p1, p2, "rename across directories is not modelled");
        st.step(None, "rename")?;
        let dir = st.dirs.get_mut(&p1).expect("dir");
        apply_dir(&mut dir.written, &DirOp::Rename(n1.clone(), n2.clone()));
        dir.pending.push(DirOp::Rename(n1, n2));
        Ok(())
    }

    async fn sync_dir(&self, dir: &Path) -> io::Result<()> {
        futures_lite::future::yield_now().await;
        let mut st = self.st.borrow_mut();
        st.step(Some(FaultKind::SyncDir), "sync_dir")?;
        let d = st.dirs.get_mut(dir).ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such dir"))?;
        for op in std::mem::take(&mut d.pending) {
            apply_dir(&mut d.durable, &op);
        }
        Ok(())
    }

    async fn create_dir_all(&self, dir: &Path) -> io::Result<()> {
        let mut st = self.st.borrow_mut();
        st.check_alive("mkdir")?;
        let mut p = Some(dir);
        while let Some(d) = p {
            st.dirs.entry(d.to_path_buf()).or_default();
            p = d.parent();
        }
        Ok(())
    }

    async fn list_dir(&self, dir: &Path) -> io::Result<Vec<String>> {
        let st = self.st.borrow();
        st.check_alive("list_dir")?;
        st.dirs
            .get(dir)
            .map(|d| d.written.keys().cloned().collect())
            .ok_or_else(|| io::Error::new(io::ErrorKind::NotFound, "no such dir"))
    }
}

impl SimFile {
    /// ENOSPC when the disk is full and the file would grow past its length.
    fn check_space(&self, end: u64, what: &str) -> io::Result<()> {
        let full = self.st.borrow().full;
        if full && self.with(|ino| ino.written.len() as u64) < end {
            return Err(FaultError::NoSpace.to_io(what));
        }
        Ok(())
    }

    fn with<R>(&self, f: impl FnOnce(&mut Inode) -> R) -> R {
        let mut st = self.st.borrow_mut();
        f(st.inodes.get_mut(&self.ino).expect("inode"))
    }
}

impl DiskFile for SimFile {
    type Buf = Vec<u8>;

    /// Filled with a non-zero pattern, as the production backend's buffers
    /// may hold anything: a byte the caller forgets to write shows up in the
    /// simulations as a checksum failure instead of a lucky zero.
    fn alloc_buf(&self, len: usize) -> Vec<u8> {
        vec![0xA5; len]
    }

    async fn write_buf(&self, pos: u64, buf: Vec<u8>) -> io::Result<()> {
        self.write_at(pos, &buf).await
    }

    async fn read_at(&self, pos: u64, len: usize) -> io::Result<Vec<u8>> {
        futures_lite::future::yield_now().await;
        self.st.borrow().check_alive("read")?;
        let data = self.with(|ino| {
            let start = (pos as usize).min(ino.written.len());
            let end = (pos as usize + len).min(ino.written.len());
            ino.written[start..end].to_vec()
        });
        self.st.borrow_mut().bytes_read += data.len() as u64;
        Ok(data)
    }

    async fn write_at(&self, pos: u64, data: &[u8]) -> io::Result<()> {
        // O_DIRECT rules, enforced so the simulator catches what the kernel would.
        assert!(pos.is_multiple_of(PAGE_BYTES), "unaligned write position {pos}");
        assert!((data.len() as u64).is_multiple_of(PAGE_BYTES), "unaligned write length {}", data.len());
        futures_lite::future::yield_now().await;
        self.st.borrow_mut().step(Some(FaultKind::Write), "write")?;
        self.check_space(pos + data.len() as u64, "write")?;
        let op = FileOp::Write { pos, data: data.to_vec() };
        self.with(|ino| {
            apply(&mut ino.written, &op);
            ino.pending.push(op);
        });
        Ok(())
    }

    async fn sync(&self) -> io::Result<()> {
        futures_lite::future::yield_now().await;
        let delay = self.st.borrow().sync_delay;
        if let Some(d) = delay {
            glommio::timer::sleep(d).await;
        }
        let fired = self.st.borrow().faults_fired;
        let stepped = self.st.borrow_mut().step(Some(FaultKind::Sync), "fdatasync");
        if let Err(e) = stepped {
            if self.st.borrow().faults_fired > fired {
                // Injected: the unsynced writes never become durable.
                self.with(|ino| {
                    ino.pending.clear();
                    ino.sync_failed = true;
                });
            }
            return Err(e);
        }
        self.with(|ino| {
            for op in std::mem::take(&mut ino.pending) {
                apply(&mut ino.durable, &op);
            }
            debug_assert!(ino.sync_failed || ino.durable == ino.written);
        });
        Ok(())
    }

    async fn allocate(&self, len: u64) -> io::Result<()> {
        futures_lite::future::yield_now().await;
        self.st.borrow_mut().step(Some(FaultKind::Allocate), "fallocate")?;
        self.check_space(len, "fallocate")?;
        self.with(|ino| {
            if (ino.written.len() as u64) < len {
                let op = FileOp::SetLen(len);
                apply(&mut ino.written, &op);
                ino.pending.push(op);
            }
        });
        Ok(())
    }

    async fn truncate(&self, len: u64) -> io::Result<()> {
        futures_lite::future::yield_now().await;
        self.st.borrow_mut().step(Some(FaultKind::Write), "ftruncate")?;
        self.with(|ino| {
            let op = FileOp::SetLen(len);
            apply(&mut ino.written, &op);
            ino.pending.push(op);
        });
        Ok(())
    }

    async fn size(&self) -> io::Result<u64> {
        self.st.borrow().check_alive("stat")?;
        Ok(self.with(|ino| ino.written.len() as u64))
    }
}
