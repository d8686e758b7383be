//! Pulsar frames.
//!
//! ```text
//! simple:  [total u32][cmd_len u32][BaseCommand]
//! payload: [total u32][cmd_len u32][BaseCommand]
//!          ([0x0e02 u16][bem_len u32][BrokerEntryMetadata])?
//!          [0x0e01 u16][crc32c u32][meta_len u32][MessageMetadata][payload]
//! ```
//!
//! All integers big-endian. `total` counts the bytes after itself. The
//! CRC-32C covers `meta_len`, the metadata and the payload. The decoder
//! checks `total` against its limit from the first four bytes, before it
//! waits for or allocates anything more, and every later length against the
//! bytes of its frame.

use crate::proto::BaseCommand;
use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

/// Magic of the checksummed part of a payload command.
pub const MAGIC_CRC32C: u16 = 0x0e01;
/// Magic of the optional broker-entry metadata before it.
pub const MAGIC_BROKER_ENTRY_METADATA: u16 = 0x0e02;
/// What Pulsar allows a frame beyond the largest message (its commands and
/// metadata): `Commands.MESSAGE_SIZE_FRAME_PADDING`.
pub const FRAME_PADDING_BYTES: u32 = 10 * 1024;

/// Bytes of magic, checksum and metadata length before the metadata.
const CHECKSUMMED_HEADER_BYTES: usize = 2 + 4 + 4;

/// Why bytes are not a Pulsar frame. All of them end the connection: after a
/// bad length or checksum the stream cannot be resynchronised.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum FrameError {
    #[error("frame of {size} bytes exceeds the limit of {max}")]
    TooLarge { size: u64, max: u32 },
    #[error("frame of {size} bytes is too small for its command length")]
    TooSmall { size: u32 },
    #[error("command length {cmd_len} exceeds the frame's {available} bytes")]
    CommandTruncated { cmd_len: u32, available: usize },
    #[error("bad BaseCommand: {0}")]
    BadCommand(String),
    #[error("payload section truncated: need {need} bytes at offset {offset}, have {have}")]
    PayloadTruncated { offset: usize, need: usize, have: usize },
    #[error("bad magic {found:#06x} (expected 0x0e01)")]
    BadMagic { found: u16 },
    #[error("CRC-32C mismatch: frame says {expected:#010x}, bytes give {actual:#010x}")]
    ChecksumMismatch { expected: u32, actual: u32 },
}

/// The checksummed part of a payload command, kept as received: from the
/// `0x0e01` magic to the end of the payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    checksummed: Bytes,
    metadata_bytes: usize,
    /// The broker-entry metadata a broker put before it, if any (only
    /// ever in frames from a broker).
    pub broker_entry_metadata: Option<Bytes>,
}

impl Payload {
    /// Magic, CRC-32C, metadata length, metadata and payload, as received
    /// (the checksum verified).
    pub fn checksummed(&self) -> &Bytes {
        &self.checksummed
    }

    /// The encoded `MessageMetadata`.
    pub fn metadata(&self) -> &[u8] {
        self.checksummed.get(CHECKSUMMED_HEADER_BYTES..CHECKSUMMED_HEADER_BYTES + self.metadata_bytes).unwrap_or(&[])
    }

    /// The message payload (a batch's records when batched).
    pub fn payload(&self) -> Bytes {
        self.checksummed.slice((CHECKSUMMED_HEADER_BYTES + self.metadata_bytes).min(self.checksummed.len())..)
    }

    /// The CRC-32C the frame carried (and the bytes matched).
    pub fn checksum(&self) -> u32 {
        read_u32(&self.checksummed, 2).unwrap_or(0)
    }
}

/// One decoded frame.
#[derive(Debug, Clone, PartialEq)]
pub struct Frame {
    pub command: BaseCommand,
    /// `Some` for a payload command (SEND, MESSAGE).
    pub payload: Option<Payload>,
}

fn read_u16(b: &[u8], at: usize) -> Option<u16> {
    let s = b.get(at..at.checked_add(2)?)?;
    Some(u16::from_be_bytes([s[0], s[1]]))
}

fn read_u32(b: &[u8], at: usize) -> Option<u32> {
    let s = b.get(at..at.checked_add(4)?)?;
    Some(u32::from_be_bytes([s[0], s[1], s[2], s[3]]))
}

/// Reads frames off a byte stream, each at most `frame_bytes_max` bytes
/// (its `total`).
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    frame_bytes_max: u32,
}

impl FrameDecoder {
    pub fn new(frame_bytes_max: u32) -> Self {
        Self { frame_bytes_max }
    }

    /// Total bytes (length field included) of the frame at the front of
    /// `buf`, once its length is there; `Err` for a length over the limit.
    pub fn next_frame_bytes(&self, buf: &[u8]) -> Result<Option<usize>, FrameError> {
        let Some(total) = read_u32(buf, 0) else { return Ok(None) };
        if total > self.frame_bytes_max {
            return Err(FrameError::TooLarge { size: u64::from(total), max: self.frame_bytes_max });
        }
        if total < 4 {
            return Err(FrameError::TooSmall { size: total });
        }
        Ok(Some(total as usize + 4))
    }

    /// Takes the next whole frame off the front of `buf`; `Ok(None)` until
    /// it has all arrived. The frame's bytes are consumed before they are
    /// parsed, so an `Err` leaves `buf` at the next frame (though callers
    /// close the connection).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(bytes) = self.next_frame_bytes(buf)? else { return Ok(None) };
        if buf.len() < bytes {
            return Ok(None);
        }
        let frame = buf.split_to(bytes).freeze();
        parse_frame(frame.slice(4..)).map(Some)
    }
}

/// Parses a frame's bytes after its `total` field.
fn parse_frame(body: Bytes) -> Result<Frame, FrameError> {
    let cmd_len = read_u32(&body, 0).ok_or(FrameError::TooSmall { size: body.len() as u32 })?;
    let available = body.len() - 4;
    if cmd_len as usize > available {
        return Err(FrameError::CommandTruncated { cmd_len, available });
    }
    let cmd_end = 4 + cmd_len as usize;
    let command = BaseCommand::decode(&body[4..cmd_end]).map_err(|e| FrameError::BadCommand(e.to_string()))?;
    if cmd_end == body.len() {
        return Ok(Frame { command, payload: None });
    }
    let rest = body.slice(cmd_end..);
    let mut at = 0usize;
    let truncated = |offset: usize, need: usize, have: usize| FrameError::PayloadTruncated { offset, need, have };
    let mut broker_entry_metadata = None;
    if read_u16(&rest, 0) == Some(MAGIC_BROKER_ENTRY_METADATA) {
        let len = read_u32(&rest, 2).ok_or_else(|| truncated(2, 4, rest.len().saturating_sub(2)))? as usize;
        let end =
            6usize.checked_add(len).filter(|&e| e <= rest.len()).ok_or_else(|| truncated(6, len, rest.len() - 6))?;
        broker_entry_metadata = Some(rest.slice(6..end));
        at = end;
    }
    let checksummed = rest.slice(at..);
    if checksummed.len() < CHECKSUMMED_HEADER_BYTES {
        return Err(truncated(at, CHECKSUMMED_HEADER_BYTES, checksummed.len()));
    }
    let magic = read_u16(&checksummed, 0).unwrap_or(0);
    if magic != MAGIC_CRC32C {
        return Err(FrameError::BadMagic { found: magic });
    }
    let expected = read_u32(&checksummed, 2).unwrap_or(0);
    let metadata_bytes = read_u32(&checksummed, 6).unwrap_or(0) as usize;
    let have = checksummed.len() - CHECKSUMMED_HEADER_BYTES;
    if metadata_bytes > have {
        return Err(truncated(at + CHECKSUMMED_HEADER_BYTES, metadata_bytes, have));
    }
    let actual = crc32c::crc32c(&checksummed[6..]);
    if actual != expected {
        return Err(FrameError::ChecksumMismatch { expected, actual });
    }
    Ok(Frame { command, payload: Some(Payload { checksummed, metadata_bytes, broker_entry_metadata }) })
}

fn too_large(size: usize) -> FrameError {
    FrameError::TooLarge { size: size as u64, max: u32::MAX }
}

/// Writes the size fields and the command; `extra` bytes follow it.
fn put_head(cmd: &BaseCommand, extra: usize, dst: &mut BytesMut) -> Result<(), FrameError> {
    let cmd_len = cmd.encoded_len();
    let total = cmd_len.checked_add(4).and_then(|t| t.checked_add(extra)).ok_or_else(|| too_large(usize::MAX))?;
    let total32 = u32::try_from(total).map_err(|_| too_large(total))?;
    dst.reserve(total + 4);
    dst.put_u32(total32);
    dst.put_u32(cmd_len as u32);
    cmd.encode(dst).map_err(|e| FrameError::BadCommand(e.to_string()))
}

/// Appends a simple command's frame.
pub fn encode_command(cmd: &BaseCommand, dst: &mut BytesMut) -> Result<(), FrameError> {
    put_head(cmd, 0, dst)
}

/// Appends a payload command's frame: `metadata` (an encoded
/// `MessageMetadata`) and `payload` under a CRC-32C.
pub fn encode_payload_command(
    cmd: &BaseCommand,
    metadata: &[u8],
    payload: &[u8],
    dst: &mut BytesMut,
) -> Result<(), FrameError> {
    let meta_len = u32::try_from(metadata.len()).map_err(|_| too_large(metadata.len()))?;
    let extra = CHECKSUMMED_HEADER_BYTES
        .checked_add(metadata.len())
        .and_then(|n| n.checked_add(payload.len()))
        .ok_or_else(|| too_large(usize::MAX))?;
    put_head(cmd, extra, dst)?;
    let mut crc = crc32c::crc32c(&meta_len.to_be_bytes());
    crc = crc32c::crc32c_append(crc, metadata);
    crc = crc32c::crc32c_append(crc, payload);
    dst.put_u16(MAGIC_CRC32C);
    dst.put_u32(crc);
    dst.put_u32(meta_len);
    dst.extend_from_slice(metadata);
    dst.extend_from_slice(payload);
    Ok(())
}

/// Appends a payload command whose checksummed part (magic through payload,
/// as [`Payload::checksummed`] returns it) is already encoded.
pub fn encode_stored_payload_command(
    cmd: &BaseCommand,
    checksummed: &[u8],
    dst: &mut BytesMut,
) -> Result<(), FrameError> {
    put_head(cmd, checksummed.len(), dst)?;
    dst.extend_from_slice(checksummed);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{base_command::Type, CommandPing, CommandSend};

    fn send() -> BaseCommand {
        BaseCommand {
            r#type: Type::Send as i32,
            send: Some(CommandSend { producer_id: 1, sequence_id: 7, num_messages: Some(1), ..Default::default() }),
            ..Default::default()
        }
    }

    /// Goal: the byte layout is Pulsar's: big-endian sizes, magic 0x0e01,
    /// and a CRC-32C over the metadata length, metadata and payload.
    #[test]
    fn payload_frame_layout() {
        let mut dst = BytesMut::new();
        encode_payload_command(&send(), b"meta", b"data", &mut dst).unwrap();
        let cmd_len = send().encoded_len();
        let total = u32::from_be_bytes(dst[0..4].try_into().unwrap()) as usize;
        assert_eq!(total + 4, dst.len());
        assert_eq!(u32::from_be_bytes(dst[4..8].try_into().unwrap()) as usize, cmd_len);
        let p = 8 + cmd_len;
        assert_eq!(&dst[p..p + 2], &[0x0e, 0x01]);
        let crc = u32::from_be_bytes(dst[p + 2..p + 6].try_into().unwrap());
        assert_eq!(crc, crc32c::crc32c(&[0, 0, 0, 4, b'm', b'e', b't', b'a', b'd', b'a', b't', b'a']));
        let frame = FrameDecoder::new(1 << 20).decode(&mut dst).unwrap().unwrap();
        let payload = frame.payload.unwrap();
        assert_eq!((payload.metadata(), &payload.payload()[..]), (&b"meta"[..], &b"data"[..]));
        assert_eq!(payload.checksum(), crc);
        assert!(dst.is_empty());
    }

    /// Goal: over-size is refused from the length alone, a wrong CRC and a
    /// truncated protobuf are refused, never a panic.
    #[test]
    fn refusals() {
        let mut d = FrameDecoder::new(100);
        let mut big = BytesMut::from(&[0u8, 0, 0, 101][..]);
        assert!(matches!(d.decode(&mut big), Err(FrameError::TooLarge { size: 101, max: 100 })));
        let mut dst = BytesMut::new();
        encode_payload_command(&send(), b"m", b"p", &mut dst).unwrap();
        let last = dst.len() - 1;
        dst[last] ^= 1;
        assert!(matches!(FrameDecoder::new(100).decode(&mut dst), Err(FrameError::ChecksumMismatch { .. })));
        let ping = BaseCommand { r#type: Type::Ping as i32, ping: Some(CommandPing {}), ..Default::default() };
        let mut dst = BytesMut::new();
        encode_command(&ping, &mut dst).unwrap();
        let mut cut = dst.clone();
        cut[3] -= 1;
        cut[7] -= 0;
        cut.truncate(cut.len() - 1);
        assert!(FrameDecoder::new(100).decode(&mut cut).is_err());
        let frame = FrameDecoder::new(100).decode(&mut dst).unwrap().unwrap();
        assert_eq!(frame.command, ping);
        assert!(frame.payload.is_none());
    }
}
