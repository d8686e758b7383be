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

use crate::metadata::STORED_MARKER;
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
/// `0x0e01` magic to the end of the payload. A slice of the bytes read, not
/// a copy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Payload {
    /// The checksummed part, preceded by the stored marker when `marked`
    /// (see [`Payload::stored_blob`]).
    bytes: Bytes,
    marked: bool,
    metadata_bytes: usize,
    /// The broker-entry metadata a broker put before it, if any (only
    /// ever in frames from a broker).
    pub broker_entry_metadata: Option<Bytes>,
}

impl Payload {
    /// Magic, CRC-32C, metadata length, metadata and payload, as received
    /// (the checksum verified).
    pub fn checksummed(&self) -> Bytes {
        if self.marked {
            self.bytes.slice(STORED_MARKER.len()..)
        } else {
            self.bytes.clone()
        }
    }

    fn checksummed_slice(&self) -> &[u8] {
        let skip = if self.marked { STORED_MARKER.len() } else { 0 };
        self.bytes.get(skip..).unwrap_or(&[])
    }

    /// The message in the layout a broker stores it (the marker, then the
    /// checksummed part: [`crate::metadata::stored_blob`]). The decoder
    /// writes the marker over the 4 bytes before the checksummed part (the
    /// end of the command, already decoded), so this is a slice of the
    /// bytes read, not a copy; only a frame with broker-entry metadata (a
    /// broker's, never a client's SEND) has no room and is copied.
    pub fn stored_blob(&self) -> Bytes {
        if self.marked {
            self.bytes.clone()
        } else {
            crate::metadata::stored_blob(&self.bytes)
        }
    }

    /// The encoded `MessageMetadata`.
    pub fn metadata(&self) -> &[u8] {
        self.checksummed_slice()
            .get(CHECKSUMMED_HEADER_BYTES..CHECKSUMMED_HEADER_BYTES + self.metadata_bytes)
            .unwrap_or(&[])
    }

    /// The message payload (a batch's records when batched).
    pub fn payload(&self) -> Bytes {
        let skip = if self.marked { STORED_MARKER.len() } else { 0 };
        self.bytes.slice((skip + CHECKSUMMED_HEADER_BYTES + self.metadata_bytes).min(self.bytes.len())..)
    }

    /// The CRC-32C the frame carried (and the bytes matched).
    pub fn checksum(&self) -> u32 {
        read_u32(self.checksummed_slice(), 2).unwrap_or(0)
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
    /// close the connection). A payload is a slice of `buf`'s bytes, laid
    /// out for storing (see [`Payload::stored_blob`]).
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, FrameError> {
        let Some(bytes) = self.next_frame_bytes(buf)? else { return Ok(None) };
        if buf.len() < bytes {
            return Ok(None);
        }
        let mut frame = buf.split_to(bytes);
        let layout = parse_frame(&frame[4..])?;
        let Some(p) = layout.payload else {
            return Ok(Some(Frame { command: layout.command, payload: None }));
        };
        // Offsets in `frame`, past its `total` field.
        let start = 4 + p.checksummed_at;
        let broker_entry_metadata = p.broker_entry_metadata.map(|(from, to)| (4 + from, 4 + to));
        // Without broker-entry metadata the 4 bytes before the checksummed
        // part are the command's (or its length's), decoded already: the
        // stored marker goes there.
        let marked = broker_entry_metadata.is_none();
        if marked {
            frame[start - STORED_MARKER.len()..start].copy_from_slice(&STORED_MARKER);
        }
        let frame = frame.freeze();
        let from = if marked { start - STORED_MARKER.len() } else { start };
        Ok(Some(Frame {
            command: layout.command,
            payload: Some(Payload {
                bytes: frame.slice(from..),
                marked,
                metadata_bytes: p.metadata_bytes,
                broker_entry_metadata: broker_entry_metadata.map(|(f, t)| frame.slice(f..t)),
            }),
        }))
    }
}

/// Where a frame's parts are, as offsets in its bytes after `total`.
struct Layout {
    command: BaseCommand,
    payload: Option<PayloadLayout>,
}

struct PayloadLayout {
    /// Where the checksummed part starts (it runs to the end); at least 4
    /// (after the command length), so the 4 bytes before it are the
    /// frame's.
    checksummed_at: usize,
    metadata_bytes: usize,
    broker_entry_metadata: Option<(usize, usize)>,
}

/// Parses a frame's bytes after its `total` field, checking every length
/// and the CRC-32C.
fn parse_frame(body: &[u8]) -> Result<Layout, FrameError> {
    let cmd_len = read_u32(body, 0).ok_or(FrameError::TooSmall { size: body.len() as u32 })?;
    let available = body.len() - 4;
    if cmd_len as usize > available {
        return Err(FrameError::CommandTruncated { cmd_len, available });
    }
    let cmd_end = 4 + cmd_len as usize;
    let command = BaseCommand::decode(&body[4..cmd_end]).map_err(|e| FrameError::BadCommand(e.to_string()))?;
    if cmd_end == body.len() {
        return Ok(Layout { command, payload: None });
    }
    let rest = &body[cmd_end..];
    let mut at = 0usize;
    let truncated = |offset: usize, need: usize, have: usize| FrameError::PayloadTruncated { offset, need, have };
    let mut broker_entry_metadata = None;
    if read_u16(rest, 0) == Some(MAGIC_BROKER_ENTRY_METADATA) {
        let len = read_u32(rest, 2).ok_or_else(|| truncated(2, 4, rest.len().saturating_sub(2)))? as usize;
        let end =
            6usize.checked_add(len).filter(|&e| e <= rest.len()).ok_or_else(|| truncated(6, len, rest.len() - 6))?;
        broker_entry_metadata = Some((cmd_end + 6, cmd_end + end));
        at = end;
    }
    let checksummed = &rest[at..];
    if checksummed.len() < CHECKSUMMED_HEADER_BYTES {
        return Err(truncated(at, CHECKSUMMED_HEADER_BYTES, checksummed.len()));
    }
    let magic = read_u16(checksummed, 0).unwrap_or(0);
    if magic != MAGIC_CRC32C {
        return Err(FrameError::BadMagic { found: magic });
    }
    let expected = read_u32(checksummed, 2).unwrap_or(0);
    let metadata_bytes = read_u32(checksummed, 6).unwrap_or(0) as usize;
    let have = checksummed.len() - CHECKSUMMED_HEADER_BYTES;
    if metadata_bytes > have {
        return Err(truncated(at + CHECKSUMMED_HEADER_BYTES, metadata_bytes, have));
    }
    let actual = crc32c::crc32c(&checksummed[6..]);
    if actual != expected {
        return Err(FrameError::ChecksumMismatch { expected, actual });
    }
    Ok(Layout {
        command,
        payload: Some(PayloadLayout { checksummed_at: cmd_end + at, metadata_bytes, broker_entry_metadata }),
    })
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

    /// Goal: a SEND's stored form is the very bytes read (no copy): the
    /// marker laid over the end of the already decoded command, then the
    /// checksummed part; a frame with broker-entry metadata (no room for
    /// the marker) gets the same layout by a copy.
    #[test]
    fn stored_blob_is_laid_out_in_the_read_buffer() {
        let mut wire = BytesMut::new();
        encode_payload_command(&send(), b"meta", b"data", &mut wire).unwrap();
        let read = wire.as_ptr_range();
        let read = read.start as usize..read.end as usize;
        let frame = FrameDecoder::new(1 << 20).decode(&mut wire).unwrap().unwrap();
        assert_eq!(frame.command, send());
        let payload = frame.payload.unwrap();
        let stored = payload.stored_blob();
        assert!(read.contains(&(stored.as_ptr() as usize)), "the stored blob was copied");
        assert_eq!(stored, crate::metadata::stored_blob(&payload.checksummed()));
        let (_, metadata, body) = crate::metadata::split_stored(&stored).unwrap();
        assert_eq!((metadata, body), (&b"meta"[..], &b"data"[..]));
        assert_eq!((payload.metadata(), &payload.payload()[..]), (&b"meta"[..], &b"data"[..]));

        // A broker's frame with broker-entry metadata before the checksummed part.
        let mut plain = BytesMut::new();
        encode_payload_command(&send(), b"meta", b"data", &mut plain).unwrap();
        let cmd_end = 8 + send().encoded_len();
        let mut with_bem = BytesMut::new();
        with_bem.put_u32(0);
        with_bem.extend_from_slice(&plain[4..cmd_end]);
        with_bem.put_u16(MAGIC_BROKER_ENTRY_METADATA);
        with_bem.put_u32(3);
        with_bem.extend_from_slice(b"bem");
        with_bem.extend_from_slice(&plain[cmd_end..]);
        let total = (with_bem.len() - 4) as u32;
        with_bem[..4].copy_from_slice(&total.to_be_bytes());
        let frame = FrameDecoder::new(1 << 20).decode(&mut with_bem).unwrap().unwrap();
        let payload = frame.payload.unwrap();
        assert_eq!(payload.broker_entry_metadata.as_deref(), Some(&b"bem"[..]));
        assert_eq!(payload.stored_blob(), stored);
        assert_eq!((payload.metadata(), &payload.payload()[..]), (&b"meta"[..], &b"data"[..]));
        assert_eq!(payload.checksum(), u32::from_be_bytes(plain[cmd_end + 2..cmd_end + 6].try_into().unwrap()));
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
