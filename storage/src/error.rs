//! Typed errors of the storage crate.

use std::io;
use std::path::PathBuf;

/// Everything the storage layer can report. Operating errors (I/O, bad input,
/// damaged files) are returned as values; broken invariants are `assert!`ed.
#[derive(Debug, thiserror::Error)]
pub enum StorageError {
    /// A system call failed. `op` names what we were doing ("write", "fdatasync", ...).
    #[error("{op} {}: {source}", path.display())]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// Bytes on disk failed verification. Never served, never silently dropped.
    #[error("corrupt data in {} at offset {offset}: {reason}", file.display())]
    Corrupt { file: PathBuf, offset: u64, reason: CorruptReason },
    /// A new segment could not be created for lack of space (ENOSPC or
    /// EDQUOT while creating or preallocating it). Nothing was written into
    /// it, so this is not a fail-stop: the log retries the creation until
    /// space returns (see `EntryLog::space_short`).
    #[error("no space for a new segment {}: {source}", path.display())]
    NoSpace {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    /// The log hit a write or fsync error earlier and is in fail-stop state until
    /// the process restarts and recovers from disk. The cause was logged once.
    #[error("storage failed earlier (fail-stop); restart to recover from disk")]
    Failed,
    /// The entry was never appended (or is not known to this log).
    #[error("no entry {entry} in ledger {ledger}")]
    NoSuchEntry { ledger: u64, entry: u64 },
    /// An entry body or metadata record is larger than the configured limit.
    #[error("record of {len} bytes exceeds the limit of {max} bytes")]
    TooLarge { len: u64, max: u64 },
    /// A ledger with appends not yet laid out in a batch cannot be deleted.
    #[error("ledger {ledger} has appends in flight; delete it once they are durable")]
    LedgerBusy { ledger: u64 },
    /// The ledger was deleted; its id must not be reused.
    #[error("ledger {ledger} was deleted")]
    LedgerDeleted { ledger: u64 },
    /// `close` was called; the log accepts nothing more.
    #[error("log is closed")]
    Closed,
    /// The data directory is on tmpfs, which has no O_DIRECT and no durability.
    #[error("{} is on tmpfs; set allow_tmpfs for development only", .0.display())]
    Tmpfs(PathBuf),
    /// The configuration cannot work (e.g. a segment smaller than one batch).
    #[error("invalid storage configuration: {0}")]
    Config(String),
}

/// Why a piece of disk data was rejected. Numbers are what was expected and found.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CorruptReason {
    #[error("bad magic")]
    BadMagic,
    #[error("header checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    HeaderCrc { stored: u32, computed: u32 },
    #[error("body checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    BodyCrc { stored: u32, computed: u32 },
    #[error("record checksum mismatch (stored {stored:#010x}, computed {computed:#010x})")]
    RecordCrc { stored: u32, computed: u32 },
    #[error("unsupported format version {0}")]
    Version(u16),
    #[error("field {field} is {found}, expected {expected}")]
    Field { field: &'static str, expected: u64, found: u64 },
    #[error("length {len} does not fit: {limit} bytes available")]
    Length { len: u64, limit: u64 },
    /// A damaged batch is followed by a valid batch: the damage is inside data
    /// that was written (and probably acknowledged) before, not a torn tail.
    #[error("damaged batch followed by valid batch seq {later_seq} at log position {later_position}")]
    DamageBeforeValidBatch { later_seq: u64, later_position: u64 },
    /// The last batch fails its checksum but none of its 512-byte sectors is
    /// unwritten (all zero): a torn write cannot look like that, so this is
    /// damage to data that was complete (and possibly acknowledged).
    #[error("complete batch of {batch_len} bytes fails its checksum (stored {stored:#010x}, computed {computed:#010x}); not a torn write")]
    DamagedNotTorn { batch_len: u32, stored: u32, computed: u32 },
    /// The last batch's header fails its checks, yet its magic, `seq` and
    /// `position` are (nearly) the expected ones, or the first record
    /// header in its sector is the next entry of a known ledger: it was
    /// written whole and rotted since, so the batch may have been
    /// acknowledged (`format::header_written_here`,
    /// `format::first_record_written_here`).
    #[error("batch seq {seq} has a damaged header (what is left of it, or the first record beside it, says it was written here: not a torn write); its records are lost and may have been acknowledged")]
    HeaderDamaged { seq: u64 },
    /// A segment file is shorter than it was preallocated (its batches say
    /// how long that was): someone truncated it. A crash cannot do that.
    #[error("segment file is {len} bytes but was preallocated to {declared}: bytes {len}..{declared} are missing and may have held acknowledged batches")]
    SegmentTruncated { len: u64, declared: u64 },
    /// The checkpoint says the log reaches this far, but no segment does:
    /// data before the checkpoint position is gone.
    #[error("the checkpoint says the log was synced up to position {position}, but the segments end at {end}: synced data is missing")]
    CheckpointBeyondLog { position: u64, end: u64 },
    #[error("ledger {ledger}: entry {found} found where entry {expected} was expected")]
    EntryOrder { ledger: u64, expected: u64, found: u64 },
    #[error("file is {len} bytes, expected at least {need}")]
    ShortFile { len: u64, need: u64 },
}

impl StorageError {
    /// Damage found by the recovery scan after the checkpoint, inside data
    /// that may have been acknowledged: `LogConfig::accept_data_loss` would
    /// truncate the log there instead of refusing to open.
    pub fn is_acceptable_loss(&self) -> bool {
        matches!(
            self,
            StorageError::Corrupt {
                reason: CorruptReason::DamageBeforeValidBatch { .. }
                    | CorruptReason::DamagedNotTorn { .. }
                    | CorruptReason::HeaderDamaged { .. }
                    | CorruptReason::SegmentTruncated { .. },
                ..
            }
        )
    }

    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: io::Error) -> Self {
        StorageError::Io { op, path: path.into(), source }
    }

    pub(crate) fn corrupt(file: impl Into<PathBuf>, offset: u64, reason: CorruptReason) -> Self {
        StorageError::Corrupt { file: file.into(), offset, reason }
    }
}

pub type Result<T, E = StorageError> = std::result::Result<T, E>;
