//! Payload compression in the client (LZ4 block, ZLIB, ZSTD, raw Snappy, as
//! Pulsar's codecs; the codecs are `magnetar_wire::compression`). The
//! producer compresses a message's (or a batch's) payload and records the
//! codec and the uncompressed size in the entry's metadata; the consumer
//! decompresses.

use crate::error::{ClientError, Result};
use bytes::Bytes;
use magnetar_wire::{CompressionError, CompressionType};

pub use magnetar_wire::UNCOMPRESSED_BYTES_MAX;

fn client_error(e: CompressionError) -> ClientError {
    ClientError::Compression { codec: format!("{:?}", e.codec), reason: e.reason }
}

/// Compresses `data` with `codec` (`None` returns it unchanged).
pub fn compress(codec: CompressionType, data: &[u8]) -> Result<Bytes> {
    magnetar_wire::compress(codec, data).map_err(client_error)
}

/// Decompresses `data` to exactly `uncompressed_size` bytes (at most
/// [`UNCOMPRESSED_BYTES_MAX`]).
pub fn decompress(codec: CompressionType, data: &Bytes, uncompressed_size: u32) -> Result<Bytes> {
    magnetar_wire::decompress(codec, data, uncompressed_size).map_err(client_error)
}
