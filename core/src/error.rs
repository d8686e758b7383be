//! Errors the core returns to the network layer (and on to clients).

pub use magnetar_wire::ErrorCode;

/// An error answered to a client request. Carries the protocol code so the
/// network layer can forward it unchanged.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct CoreError {
    pub code: ErrorCode,
    pub message: String,
}

impl CoreError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Self { code, message: message.into() }
    }
}

/// A topic name a request carried that does not parse.
impl From<crate::topic_name::TopicNameError> for CoreError {
    fn from(e: crate::topic_name::TopicNameError) -> Self {
        CoreError::new(ErrorCode::InvalidTopicName, e.to_string())
    }
}

impl From<magnetar_storage::StorageError> for CoreError {
    fn from(e: magnetar_storage::StorageError) -> Self {
        let code = match e {
            magnetar_storage::StorageError::NoSpace { .. } => ErrorCode::StorageFull,
            _ => ErrorCode::PersistenceError,
        };
        CoreError::new(code, e.to_string())
    }
}

/// Failure to start the shards.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("data directory {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error(
        "data directory {path} is in use by another broker ({}): its lock file magnetar.lock is held",
        pid.map_or("pid unknown".to_string(), |p| format!("pid {p}"))
    )]
    Locked { path: String, pid: Option<u32> },
    #[error("data directory {path} was created with {found} shards; start with --shards {found}")]
    ShardCountMismatch { path: String, found: u32 },
    #[error("data directory {path}: unreadable format file: {reason}")]
    BadFormatFile { path: String, reason: String },
    #[error("shard {shard}: {message}")]
    Shard { shard: u32, message: String },
    #[error("invalid configuration: {0}")]
    Config(String),
}
