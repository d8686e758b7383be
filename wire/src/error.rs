//! The codec's one error type.

/// Everything that can go wrong encoding or decoding frames and message blobs.
///
/// Errors carry the numbers that explain them (lengths, offsets, values), so
/// a log line is enough to tell a torn read from a hostile peer. Lengths and
/// offsets are `u64` whatever the platform.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum WireError {
    /// A frame announces (or would need) more bytes than the limit. Detected
    /// from the 4 length bytes alone, before anything is allocated.
    #[error("frame of {len} bytes (after the length field) exceeds the limit of {max} bytes")]
    FrameTooLarge { len: u64, max: u64 },

    /// A frame announces fewer bytes than its fixed header needs.
    #[error("frame of {len} bytes (after the length field) is below the minimum of {min} bytes")]
    FrameTooSmall { len: u64, min: u64 },

    /// The CRC-32 stored in the frame does not match the bytes received.
    #[error("frame checksum mismatch: header says {expected:#010x}, bytes hash to {actual:#010x}")]
    ChecksumMismatch { expected: u32, actual: u32 },

    /// A length field points past the end of the bytes it describes.
    /// `offset` is where the missing region starts, `need` its length, `have`
    /// the bytes available from `offset` on.
    #[error("{what} truncated at offset {offset}: need {need} bytes, have {have}")]
    Truncated { what: &'static str, offset: u64, need: u64, have: u64 },

    /// The bytes are not a valid flatbuffer of the expected root table
    /// (`what` is `"BaseCommand"` or `"MessageMetadata"`), or break the
    /// verifier's depth/table/size bounds.
    #[error("invalid {what} flatbuffer: {source}")]
    InvalidFlatbuffer {
        what: &'static str,
        #[source]
        source: flatbuffers::InvalidFlatbuffer,
    },

    /// A field the decoder needs is absent, e.g. `"Producer.topic"`.
    #[error("missing field {0}")]
    MissingField(&'static str),

    /// The command union holds a type this build does not know (a newer
    /// peer), or none at all (0).
    #[error("unknown command type {0}")]
    UnknownCommand(u8),

    /// An enum field holds a value this build does not know.
    #[error("field {field} holds unknown enum value {value}")]
    BadEnum { field: &'static str, value: u64 },

    /// A command other than `Send`/`Message` carries payload bytes.
    #[error("command {command} must not carry a payload, got {len} bytes")]
    UnexpectedPayload { command: &'static str, len: u64 },

    /// An encoded command or message metadata would exceed what the codec
    /// is willing to build.
    #[error("{what} of about {len} bytes exceeds the encoder limit of {max} bytes")]
    EncodeTooLarge { what: &'static str, len: u64, max: u64 },

    /// A batch payload does not hold the number of messages its metadata
    /// announces (or holds bytes after the last one).
    #[error("batch payload of {len} bytes: {reason} (expected {expected} messages, found {found})")]
    BadBatch { len: u64, expected: u32, found: u32, reason: &'static str },

    /// A `MessageRun` whose entries do not fit its payload or its ids: no
    /// entry, lengths that do not add up to the payload's length, or an
    /// entry number past `u64::MAX`.
    #[error("bad message run of {entries} entries: {reason} (lengths add up to {sum}, payload {payload} bytes)")]
    BadRun { entries: u64, sum: u64, payload: u64, reason: &'static str },

    /// A vector that must run parallel to another has another length.
    #[error("{field} holds {found} values, expected {expected} (one per message id) or none")]
    BadCount { field: &'static str, expected: u64, found: u64 },
}

impl WireError {
    /// Whether the byte stream can no longer be trusted to be in step: the
    /// frame boundary itself is in doubt (bad length or checksum). The caller
    /// must close the connection. For every other decode error the bad frame
    /// has been consumed whole, so the caller may answer with an `Error`
    /// command and keep reading (though closing is always allowed).
    pub fn is_fatal(&self) -> bool {
        matches!(self, Self::FrameTooLarge { .. } | Self::FrameTooSmall { .. } | Self::ChecksumMismatch { .. })
    }
}
