//! magnetar-storage: one shard's durable entry log.
//!
//! Stores opaque entries in numbered ledgers, plus small key/value metadata
//! records, in one sequence of O_DIRECT segment files per shard, with group
//! commit (one fdatasync covers many appends), per-ledger index pages written
//! behind the log, a bounded write cache, checkpoints, and crash recovery that
//! truncates a torn tail but refuses to open over damaged acknowledged data.
//! It knows nothing of brokers, topics or the wire format.
//!
//! Everything here is single-threaded: one [`EntryLog`] per shard, owned by
//! that shard's glommio executor, never crossing cores. The exceptions are
//! the registered read buffers, which come back from whatever thread drops
//! the last view of a read, and the [`stage`] trace buffer (README.md,
//! "Which thread owns what").
//!
//! ```no_run
//! # use magnetar_storage::{EntryLog, LogConfig};
//! # use bytes::Bytes;
//! glommio::LocalExecutor::default().run(async {
//!     let (log, recovery) = EntryLog::open(LogConfig::new("data/shard-0")).await?;
//!     let a = log.append(7, Bytes::from_static(b"hello"))?;
//!     log.wait_durable(a.lsn).await?; // now it survives kill -9
//!     assert_eq!(log.read(7, a.entry).await?, Bytes::from_static(b"hello"));
//!     log.close().await?;
//!     Ok::<_, magnetar_storage::StorageError>(())
//! }).unwrap();
//! ```
//!
//! On-disk layouts and the crash analysis: `docs/format.md`.

mod atomics;
mod cache;
mod compact;
pub mod disk;
mod error;
pub mod format;
pub mod inspect;
pub mod keyindex;
mod live;
mod log;
mod lone;
mod pages;
pub use pages::INDEX_FILES_OPEN_MAX;
mod recovery;
pub mod sim;
mod spans;
pub mod stage;
mod walk;

pub use compact::CompactionStats;
pub use disk::{Disk, DiskFile, DmaDisk, OpenMode, PAGE_BYTES};
pub use error::{CorruptReason, StorageError};
pub use format::{key_hash, tag_hash, IndexEntry, IndexExtras};
pub use keyindex::KeyHit;
pub use log::{
    Appended, EntryLog, FlushStats, IndexCacheStats, LogConfig, NewEntry, Recovery, FLUSH_HISTOGRAM_BUCKETS,
    LONE_BATCH_BYTES_MAX, LONE_PAUSE_BATCHES, LONE_RESUME_FAST, LONE_STREAK_MIN,
};
