//! Payload compression (LZ4 block, ZLIB, ZSTD, raw Snappy, as Pulsar's
//! codecs; `docs/format.md`, "Compression"). Clients compress a message's
//! (or a batch's) payload and decompress it; the broker only decompresses a
//! batch whose records it must convert for the other door.

use crate::CompressionType;
use bytes::Bytes;
use std::io::{Read, Write};

/// Largest uncompressed payload accepted (the size comes from the message
/// metadata, so it bounds the allocation a bad message can cause).
pub const UNCOMPRESSED_BYTES_MAX: u32 = 256 * 1024 * 1024;
/// ZSTD level: the library's default balance of speed and ratio.
const ZSTD_LEVEL: i32 = 3;

/// A payload that does not compress or decompress as its metadata says.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{codec:?} compression: {reason}")]
pub struct CompressionError {
    pub codec: CompressionType,
    pub reason: String,
}

fn err(codec: CompressionType, reason: impl std::fmt::Display) -> CompressionError {
    CompressionError { codec, reason: reason.to_string() }
}

/// Compresses `data` with `codec` (`None` returns it unchanged).
pub fn compress(codec: CompressionType, data: &[u8]) -> Result<Bytes, CompressionError> {
    Ok(match codec {
        CompressionType::None => Bytes::copy_from_slice(data),
        CompressionType::Lz4 => Bytes::from(lz4_flex::block::compress(data)),
        CompressionType::Zlib => {
            let mut e = flate2::write::ZlibEncoder::new(Vec::new(), flate2::Compression::default());
            e.write_all(data).map_err(|e2| err(codec, e2))?;
            Bytes::from(e.finish().map_err(|e2| err(codec, e2))?)
        }
        CompressionType::Zstd => Bytes::from(zstd::bulk::compress(data, ZSTD_LEVEL).map_err(|e| err(codec, e))?),
        CompressionType::Snappy => {
            Bytes::from(snap::raw::Encoder::new().compress_vec(data).map_err(|e| err(codec, e))?)
        }
    })
}

/// Decompresses `data` to exactly `uncompressed_size` bytes (at most
/// [`UNCOMPRESSED_BYTES_MAX`]).
pub fn decompress(codec: CompressionType, data: &Bytes, uncompressed_size: u32) -> Result<Bytes, CompressionError> {
    if codec == CompressionType::None {
        return Ok(data.clone());
    }
    if uncompressed_size > UNCOMPRESSED_BYTES_MAX {
        return Err(err(codec, format!("uncompressed size {uncompressed_size} exceeds {UNCOMPRESSED_BYTES_MAX}")));
    }
    let size = uncompressed_size as usize;
    let out = match codec {
        CompressionType::None => return Ok(data.clone()),
        CompressionType::Lz4 => lz4_flex::block::decompress(data, size).map_err(|e| err(codec, e))?,
        CompressionType::Zlib => {
            let mut out = Vec::with_capacity(size);
            // One byte more than announced, to notice a payload that lies.
            flate2::read::ZlibDecoder::new(&data[..])
                .take(u64::from(uncompressed_size) + 1)
                .read_to_end(&mut out)
                .map_err(|e| err(codec, e))?;
            out
        }
        CompressionType::Zstd => zstd::bulk::decompress(data, size).map_err(|e| err(codec, e))?,
        CompressionType::Snappy => {
            let announced = snap::raw::decompress_len(data).map_err(|e| err(codec, e))?;
            if announced != size {
                return Err(err(codec, format!("snappy says {announced} bytes, metadata {size}")));
            }
            snap::raw::Decoder::new().decompress_vec(data).map_err(|e| err(codec, e))?
        }
    };
    if out.len() != size {
        return Err(err(codec, format!("decompressed to {} bytes, metadata says {size}", out.len())));
    }
    Ok(Bytes::from(out))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_codec_round_trips_and_rejects_lies() {
        let data: Vec<u8> = (0..10_000u32).map(|i| (i % 7) as u8).collect();
        for codec in [
            CompressionType::None,
            CompressionType::Lz4,
            CompressionType::Zlib,
            CompressionType::Zstd,
            CompressionType::Snappy,
        ] {
            let c = compress(codec, &data).unwrap();
            if codec != CompressionType::None {
                assert!(c.len() < data.len() / 2, "{codec:?} compressed to {}", c.len());
                assert!(decompress(codec, &c, 9_999).is_err(), "{codec:?}: wrong size accepted");
                assert!(decompress(codec, &Bytes::from_static(b"garbage!"), 10_000).is_err());
            }
            assert_eq!(decompress(codec, &c, 10_000).unwrap(), data, "{codec:?}");
        }
    }
}
