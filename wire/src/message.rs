//! The message blob: what one entry stores and what `Send`/`Message` frames
//! carry as payload.
//!
//! Layout, all integers little-endian (also in `docs/format.md`):
//!
//! ```text
//! offset             size           field
//! 0                  4              metadata_len
//! 4                  metadata_len   MessageMetadata flatbuffer
//! 4 + metadata_len   rest           payload (opaque to the broker)
//! ```
//!
//! The blob has no checksum of its own: on the wire the frame's CRC covers
//! it, on disk the entry log's. The broker stores it byte for byte, so its
//! layout is an on-disk format too.

use bytes::{BufMut, Bytes, BytesMut};
use flatbuffers::FlatBufferBuilder;

use crate::error::WireError;
use crate::frame::{len_u64, read_u32_le, string, with_builder};
use crate::types::{ChunkInfo, CompressionType, MessageMetadata};
use crate::{fb, verifier_options, ENCODE_VARIABLE_BYTES_MAX};

/// Bytes before the metadata flatbuffer: `metadata_len`.
pub const MESSAGE_HEADER_BYTES: usize = 4;

/// Encode `meta` and `payload` as one message blob.
///
/// Panics (an `assert!`: a caller bug, not bad input) if the metadata's
/// strings and vectors total more than [`ENCODE_VARIABLE_BYTES_MAX`]; bound
/// message sizes by the frame limit long before that.
pub fn encode_message(meta: &MessageMetadata, payload: &[u8]) -> Bytes {
    let mut dst = BytesMut::new();
    encode_message_into(meta, payload, &mut dst);
    dst.freeze()
}

/// Append one message blob to `dst`. Same contract as [`encode_message`].
pub fn encode_message_into(meta: &MessageMetadata, payload: &[u8], dst: &mut BytesMut) {
    let variable_bytes = metadata_variable_bytes(meta);
    assert!(
        variable_bytes <= ENCODE_VARIABLE_BYTES_MAX,
        "message metadata of {variable_bytes} variable bytes exceeds {ENCODE_VARIABLE_BYTES_MAX}"
    );
    with_builder(|fbb| {
        let root = build_metadata(fbb, meta);
        fbb.finish_minimal(root);
        let bytes = fbb.finished_data();
        // Below 2 GiB by the assert above (flatbuffers cannot build more).
        let metadata_len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        assert_eq!(len_u64(bytes.len()), u64::from(metadata_len));
        dst.reserve(MESSAGE_HEADER_BYTES.saturating_add(bytes.len()).saturating_add(payload.len()));
        dst.put_u32_le(metadata_len);
        dst.extend_from_slice(bytes);
        dst.extend_from_slice(payload);
    });
}

/// Decode a message blob into its metadata and payload. The payload (and the
/// ordering key) are slices of `blob`: no copy.
pub fn decode_message(blob: &Bytes) -> Result<(MessageMetadata, Bytes), WireError> {
    let (meta_bytes, payload_offset) = split_blob(blob)?;
    let meta = verify_metadata(meta_bytes)?;
    let metadata = metadata_from_fb(&meta, blob)?;
    Ok((metadata, blob.slice(payload_offset..)))
}

/// The fields the broker reads from a blob on its hot paths (index keys,
/// dedup, delayed delivery), borrowed from the blob: checked as
/// [`view_message`] checks it, but nothing is allocated or copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessagePeek<'a> {
    pub producer_name: &'a str,
    pub sequence_id: u64,
    pub publish_time_ms: u64,
    pub event_time_ms: u64,
    pub partition_key: Option<&'a str>,
    pub ordering_key: Option<&'a [u8]>,
    pub num_messages: u32,
    pub deliver_at_ms: u64,
    pub tag: Option<&'a str>,
    /// `(chunk_id, num_chunks)` of a chunk of a chunked message.
    pub chunk: Option<(u32, u32)>,
    /// The payload: the bytes after the metadata.
    pub payload: &'a [u8],
}

/// Check a blob and borrow its hot fields; see [`MessagePeek`]. Accepts
/// exactly the blobs [`decode_message`] accepts (it is [`view_message`]),
/// so a blob the broker takes is one every consumer can decode.
pub fn peek_message(blob: &[u8]) -> Result<MessagePeek<'_>, WireError> {
    let v = view_message(blob)?;
    Ok(MessagePeek {
        producer_name: v.producer_name,
        sequence_id: v.sequence_id,
        publish_time_ms: v.publish_time_ms,
        event_time_ms: v.event_time_ms,
        partition_key: v.partition_key,
        ordering_key: v.ordering_key,
        num_messages: v.num_messages,
        deliver_at_ms: v.deliver_at_ms,
        tag: v.tag,
        chunk: v.chunk.map(|c| (c.chunk_id, c.num_chunks)),
        // `view_message` found the metadata's end inside the blob.
        payload: blob.get(v.payload_offset..).unwrap_or_default(),
    })
}

/// What a broker's dispatcher reads from a stored blob before delivering
/// it: the key (for Key_Shared), the tag (for a tag filter), the delivery
/// time and the message count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeliveryPeek<'a> {
    pub partition_key: Option<&'a [u8]>,
    pub ordering_key: Option<&'a [u8]>,
    pub tag: Option<&'a [u8]>,
    pub num_messages: u32,
    pub deliver_at_ms: u64,
}

/// Reads the [`DeliveryPeek`] fields of a blob, checking the bounds of
/// every offset it follows but verifying nothing else of the metadata.
///
/// For blobs the broker verified whole when they were appended ([`peek_message`])
/// and whose bytes the log's checksum has vouched for since: the flatbuffers
/// verifier would walk every field of the metadata again per delivered
/// entry, a cost a catch-up pays on every entry. On a valid blob it
/// returns what [`peek_message`] does (a test checks); on any other input it
/// returns some values or an error, never panics, and reads nothing out of
/// bounds (safe code, bounds-checked `get`s).
pub fn peek_for_delivery(blob: &[u8]) -> Result<DeliveryPeek<'_>, WireError> {
    let (meta, _) = split_blob(blob)?;
    let bad = || WireError::Truncated { what: "message metadata", offset: 0, need: 0, have: len_u64(meta.len()) };
    let u16_at = |at: usize| meta.get(at..at.checked_add(2)?).map(|b| u16::from_le_bytes([b[0], b[1]]));
    let u32_at = |at: usize| read_u32_le(meta, at);
    let table = usize::try_from(u32_at(0).ok_or_else(bad)?).map_err(|_| bad())?;
    let soffset = i64::from(u32_at(table).ok_or_else(bad)? as i32);
    let vtable = usize::try_from(i64::try_from(table).map_err(|_| bad())? - soffset).map_err(|_| bad())?;
    let vtable_len = usize::from(u16_at(vtable).ok_or_else(bad)?);
    // Where a field lives: None when absent (its slot is past the vtable or 0).
    let field = |slot: u16| -> Result<Option<usize>, WireError> {
        let slot = usize::from(slot);
        if slot + 2 > vtable_len {
            return Ok(None);
        }
        match u16_at(vtable.checked_add(slot).ok_or_else(bad)?).ok_or_else(bad)? {
            0 => Ok(None),
            off => Ok(Some(table.checked_add(usize::from(off)).ok_or_else(bad)?)),
        }
    };
    // A string or a byte vector: u32 offset to a u32 length and the bytes.
    let bytes_field = |slot: u16| -> Result<Option<&[u8]>, WireError> {
        let Some(at) = field(slot)? else { return Ok(None) };
        let start = at.checked_add(usize::try_from(u32_at(at).ok_or_else(bad)?).map_err(|_| bad())?).ok_or_else(bad)?;
        let len = usize::try_from(u32_at(start).ok_or_else(bad)?).map_err(|_| bad())?;
        let from = start.checked_add(4).ok_or_else(bad)?;
        Ok(Some(meta.get(from..from.checked_add(len).ok_or_else(bad)?).ok_or_else(bad)?))
    };
    let num_messages = match field(fb::MessageMetadata::VT_NUM_MESSAGES)? {
        Some(at) => u32_at(at).ok_or_else(bad)?,
        None => 0,
    };
    let deliver_at_ms = match field(fb::MessageMetadata::VT_DELIVER_AT_MS)? {
        Some(at) => {
            let b: [u8; 8] =
                meta.get(at..at.checked_add(8).ok_or_else(bad)?).ok_or_else(bad)?.try_into().map_err(|_| bad())?;
            u64::from_le_bytes(b)
        }
        None => 0,
    };
    Ok(DeliveryPeek {
        partition_key: bytes_field(fb::MessageMetadata::VT_PARTITION_KEY)?,
        ordering_key: bytes_field(fb::MessageMetadata::VT_ORDERING_KEY)?,
        tag: bytes_field(fb::MessageMetadata::VT_TAG)?,
        num_messages,
        deliver_at_ms,
    })
}

/// Publish time and partition key of a blob, for the broker's time and key
/// indexes.
pub fn peek_publish_time_and_key(blob: &[u8]) -> Result<(u64, Option<&str>), WireError> {
    let peek = peek_message(blob)?;
    Ok((peek.publish_time_ms, peek.partition_key))
}

/// Split a blob into its metadata bytes and the offset of its payload.
fn split_blob(blob: &[u8]) -> Result<(&[u8], usize), WireError> {
    let metadata_len = read_u32_le(blob, 0).ok_or(WireError::Truncated {
        what: "message metadata_len",
        offset: 0,
        need: len_u64(MESSAGE_HEADER_BYTES),
        have: len_u64(blob.len()),
    })?;
    let have = blob.len().saturating_sub(MESSAGE_HEADER_BYTES);
    let truncated = WireError::Truncated {
        what: "message metadata",
        offset: len_u64(MESSAGE_HEADER_BYTES),
        need: u64::from(metadata_len),
        have: len_u64(have),
    };
    let end = usize::try_from(metadata_len)
        .ok()
        .and_then(|len| len.checked_add(MESSAGE_HEADER_BYTES))
        .ok_or_else(|| truncated.clone())?;
    let meta_bytes = blob.get(MESSAGE_HEADER_BYTES..end).ok_or(truncated)?;
    Ok((meta_bytes, end))
}

fn verify_metadata(bytes: &[u8]) -> Result<fb::MessageMetadata<'_>, WireError> {
    let opts = verifier_options(bytes.len());
    flatbuffers::root_with_opts::<fb::MessageMetadata<'_>>(&opts, bytes)
        .map_err(|source| WireError::InvalidFlatbuffer { what: "MessageMetadata", source })
}

fn metadata_variable_bytes(meta: &MessageMetadata) -> u64 {
    let s = |v: &str| len_u64(v.len());
    // Each property also costs a table and two offsets; 32 bytes is generous.
    let properties = meta
        .properties
        .iter()
        .fold(0u64, |acc, (k, v)| acc.saturating_add(s(k)).saturating_add(s(v)).saturating_add(32));
    s(&meta.producer_name)
        .saturating_add(meta.partition_key.as_deref().map_or(0, s))
        .saturating_add(meta.ordering_key.as_ref().map_or(0, |k| len_u64(k.len())))
        .saturating_add(properties)
        .saturating_add(meta.chunk.as_ref().map_or(0, |c| s(&c.uuid)))
        .saturating_add(meta.tag.as_deref().map_or(0, s))
}

/// Message properties as a vector of `KeyValue` tables (`None` when empty,
/// so an absent field costs nothing). Shared by message and batch metadata.
pub(crate) fn encode_properties<'a>(
    fbb: &mut FlatBufferBuilder<'a>,
    properties: &[(String, String)],
) -> Option<flatbuffers::WIPOffset<flatbuffers::Vector<'a, flatbuffers::ForwardsUOffset<fb::KeyValue<'a>>>>> {
    if properties.is_empty() {
        return None;
    }
    let tables: Vec<_> = properties
        .iter()
        .map(|(k, v)| {
            let key = Some(fbb.create_string(k));
            let value = Some(fbb.create_string(v));
            fb::KeyValue::create(fbb, &fb::KeyValueArgs { key, value })
        })
        .collect();
    Some(fbb.create_vector(&tables))
}

fn compression_to_fb(c: CompressionType) -> fb::CompressionType {
    match c {
        CompressionType::None => fb::CompressionType::None,
        CompressionType::Lz4 => fb::CompressionType::Lz4,
        CompressionType::Zlib => fb::CompressionType::Zlib,
        CompressionType::Zstd => fb::CompressionType::Zstd,
        CompressionType::Snappy => fb::CompressionType::Snappy,
    }
}

fn compression_from_fb(c: fb::CompressionType) -> Result<CompressionType, WireError> {
    match c {
        fb::CompressionType::None => Ok(CompressionType::None),
        fb::CompressionType::Lz4 => Ok(CompressionType::Lz4),
        fb::CompressionType::Zlib => Ok(CompressionType::Zlib),
        fb::CompressionType::Zstd => Ok(CompressionType::Zstd),
        fb::CompressionType::Snappy => Ok(CompressionType::Snappy),
        other => Err(WireError::BadEnum { field: "MessageMetadata.compression", value: u64::from(other.0) }),
    }
}

fn build_metadata<'b>(
    fbb: &mut FlatBufferBuilder<'b>,
    meta: &MessageMetadata,
) -> flatbuffers::WIPOffset<fb::MessageMetadata<'b>> {
    let producer_name = Some(fbb.create_string(&meta.producer_name));
    let partition_key = meta.partition_key.as_deref().map(|k| fbb.create_string(k));
    let ordering_key = meta.ordering_key.as_deref().map(|k| fbb.create_vector(k));
    let properties = encode_properties(fbb, &meta.properties);
    let chunk = meta.chunk.as_ref().map(|c| {
        let uuid = Some(fbb.create_string(&c.uuid));
        fb::ChunkInfo::create(
            fbb,
            &fb::ChunkInfoArgs {
                uuid,
                chunk_id: c.chunk_id,
                num_chunks: c.num_chunks,
                total_chunk_msg_size: c.total_chunk_msg_size,
            },
        )
    });
    let tag = meta.tag.as_deref().map(|t| fbb.create_string(t));
    fb::MessageMetadata::create(
        fbb,
        &fb::MessageMetadataArgs {
            producer_name,
            sequence_id: meta.sequence_id,
            publish_time_ms: meta.publish_time_ms,
            event_time_ms: meta.event_time_ms,
            partition_key,
            ordering_key,
            properties,
            num_messages: meta.num_messages,
            deliver_at_ms: meta.deliver_at_ms,
            compression: compression_to_fb(meta.compression),
            uncompressed_size: meta.uncompressed_size,
            chunk,
            tag,
        },
    )
}

/// `blob` is the buffer `meta` was verified in; byte fields are sliced from it.
fn metadata_from_fb(meta: &fb::MessageMetadata<'_>, blob: &Bytes) -> Result<MessageMetadata, WireError> {
    let properties = match meta.properties() {
        None => Vec::new(),
        Some(props) => props
            .iter()
            .map(|kv| Ok((string(kv.key(), "KeyValue.key")?, string(kv.value(), "KeyValue.value")?)))
            .collect::<Result<Vec<_>, WireError>>()?,
    };
    let chunk = match meta.chunk() {
        None => None,
        Some(c) => Some(ChunkInfo {
            uuid: string(c.uuid(), "ChunkInfo.uuid")?,
            chunk_id: c.chunk_id(),
            num_chunks: c.num_chunks(),
            total_chunk_msg_size: c.total_chunk_msg_size(),
        }),
    };
    Ok(MessageMetadata {
        producer_name: string(meta.producer_name(), "MessageMetadata.producer_name")?,
        sequence_id: meta.sequence_id(),
        publish_time_ms: meta.publish_time_ms(),
        event_time_ms: meta.event_time_ms(),
        partition_key: meta.partition_key().map(str::to_owned),
        // The verified vector lies inside `blob`, so slice_ref cannot fail.
        ordering_key: meta.ordering_key().map(|k| blob.slice_ref(k.bytes())),
        properties,
        num_messages: meta.num_messages(),
        deliver_at_ms: meta.deliver_at_ms(),
        compression: compression_from_fb(meta.compression())?,
        uncompressed_size: meta.uncompressed_size(),
        chunk,
        tag: meta.tag().map(str::to_owned),
    })
}

/// A message blob's metadata, checked whole and borrowed from the blob:
/// what [`decode_message`] decodes, without allocating. See [`view_message`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MessageView<'a> {
    pub producer_name: &'a str,
    pub sequence_id: u64,
    pub publish_time_ms: u64,
    pub event_time_ms: u64,
    pub partition_key: Option<&'a str>,
    pub ordering_key: Option<&'a [u8]>,
    pub properties: PropertiesView<'a>,
    pub num_messages: u32,
    pub deliver_at_ms: u64,
    pub compression: CompressionType,
    pub uncompressed_size: u32,
    pub chunk: Option<ChunkView<'a>>,
    pub tag: Option<&'a str>,
    /// Where the payload starts in the blob.
    pub payload_offset: usize,
    /// Where the ordering key lies in the blob (for a zero-copy slice).
    ordering_key_at: Option<(usize, usize)>,
}

/// [`MessageView`]'s chunk fields.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChunkView<'a> {
    pub uuid: &'a str,
    pub chunk_id: u32,
    pub num_chunks: u32,
    pub total_chunk_msg_size: u32,
}

/// [`MessageView`]'s properties: checked, read on iteration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PropertiesView<'a> {
    meta: &'a [u8],
    /// Position of the first element (a `u32` offset) in `meta`.
    start: usize,
    len: usize,
}

impl<'a> PropertiesView<'a> {
    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The `(key, value)` pairs, in order.
    pub fn iter(&self) -> impl Iterator<Item = (&'a str, &'a str)> + 'a {
        let meta = self.meta;
        let start = self.start;
        // Checked by `view_message`; with the same bytes every read below
        // succeeds again (and a failing one would only end the iteration).
        (0..self.len).map_while(move |i| {
            let mut w = Walker::unbounded(meta);
            let elem = start.checked_add(i.checked_mul(4)?)?;
            let table = w.table_at(elem)?;
            let key = w.string_field(&table, fb::KeyValue::VT_KEY)?;
            let value = w.string_field(&table, fb::KeyValue::VT_VALUE)?;
            Some((key?, value?))
        })
    }
}

impl MessageView<'_> {
    /// The owned metadata, as [`decode_message`] returns it. `blob` is the
    /// blob this view was made of (the ordering key is sliced from it).
    pub fn to_metadata(&self, blob: &Bytes) -> MessageMetadata {
        MessageMetadata {
            producer_name: self.producer_name.to_owned(),
            sequence_id: self.sequence_id,
            publish_time_ms: self.publish_time_ms,
            event_time_ms: self.event_time_ms,
            partition_key: self.partition_key.map(str::to_owned),
            ordering_key: self.ordering_key_at.and_then(|(from, to)| (to <= blob.len()).then(|| blob.slice(from..to))),
            properties: self.properties.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect(),
            num_messages: self.num_messages,
            deliver_at_ms: self.deliver_at_ms,
            compression: self.compression,
            uncompressed_size: self.uncompressed_size,
            chunk: self.chunk.map(|c| ChunkInfo {
                uuid: c.uuid.to_owned(),
                chunk_id: c.chunk_id,
                num_chunks: c.num_chunks,
                total_chunk_msg_size: c.total_chunk_msg_size,
            }),
            tag: self.tag.map(str::to_owned),
        }
    }
}

/// Check a blob and borrow its metadata: accepts exactly the blobs
/// [`decode_message`] accepts (same error when not; a test compares the two
/// on mutated blobs) and reads the same values, but allocates nothing.
///
/// For the consumer's per-message path: the flatbuffers verifier and the
/// owned strings of [`decode_message`] are a large part of a client's CPU
/// per received message. The check is the verifier's, written
/// out for this one table (alignment, bounds, UTF-8 and terminators of
/// strings, the verifier's size and table limits), in safe code; on any
/// failure the verifier itself is run for the error.
pub fn view_message(blob: &[u8]) -> Result<MessageView<'_>, WireError> {
    let (meta, payload_offset) = split_blob(blob)?;
    match walk_metadata(meta, payload_offset) {
        Some(view) => Ok(view),
        None => Err(metadata_error(meta)),
    }
}

/// The error [`decode_message`] gives for metadata `meta` that the walker
/// refused.
#[cold]
fn metadata_error(meta: &[u8]) -> WireError {
    let fail = WireError::Truncated { what: "message metadata", offset: 0, need: 0, have: len_u64(meta.len()) };
    let m = match verify_metadata(meta) {
        Ok(m) => m,
        Err(e) => return e,
    };
    // The semantic checks of `metadata_from_fb`, in its order.
    if let Some(props) = m.properties() {
        for kv in props.iter() {
            if kv.key().is_none() {
                return WireError::MissingField("KeyValue.key");
            }
            if kv.value().is_none() {
                return WireError::MissingField("KeyValue.value");
            }
        }
    }
    if m.chunk().is_some_and(|c| c.uuid().is_none()) {
        return WireError::MissingField("ChunkInfo.uuid");
    }
    if m.producer_name().is_none() {
        return WireError::MissingField("MessageMetadata.producer_name");
    }
    if let Err(e) = compression_from_fb(m.compression()) {
        return e;
    }
    // Not reached unless the walker refuses what the verifier accepts.
    fail
}

/// A table position, its vtable and the vtable's length.
struct TablePos {
    pos: usize,
    vtable: usize,
    vtable_len: usize,
}

/// The flatbuffers verifier's checks, by hand: every read is aligned (to
/// the type's size, from the buffer's start), in bounds, and counted
/// against the apparent-size and table limits of `verifier_options`.
struct Walker<'a> {
    buf: &'a [u8],
    apparent: usize,
    apparent_max: usize,
    tables: usize,
}

impl<'a> Walker<'a> {
    fn new(buf: &'a [u8]) -> Self {
        let opts = verifier_options(buf.len());
        Walker { buf, apparent: 0, apparent_max: opts.max_apparent_size, tables: 0 }
    }

    /// For re-reading what was checked already.
    fn unbounded(buf: &'a [u8]) -> Self {
        Walker { buf, apparent: 0, apparent_max: usize::MAX, tables: 0 }
    }

    fn range(&mut self, pos: usize, size: usize) -> Option<()> {
        if pos.saturating_add(size) > self.buf.len() {
            return None;
        }
        self.apparent = self.apparent.saturating_add(size);
        (self.apparent <= self.apparent_max).then_some(())
    }

    fn bytes<const N: usize>(&mut self, pos: usize) -> Option<[u8; N]> {
        if !pos.is_multiple_of(N) {
            return None;
        }
        self.range(pos, N)?;
        self.buf.get(pos..pos.checked_add(N)?)?.try_into().ok()
    }

    fn u16(&mut self, pos: usize) -> Option<u16> {
        self.bytes::<2>(pos).map(u16::from_le_bytes)
    }

    fn u32(&mut self, pos: usize) -> Option<u32> {
        self.bytes::<4>(pos).map(u32::from_le_bytes)
    }

    fn u64(&mut self, pos: usize) -> Option<u64> {
        self.bytes::<8>(pos).map(u64::from_le_bytes)
    }

    /// Follows the `u32` offset at `pos`.
    fn uoffset(&mut self, pos: usize) -> Option<usize> {
        let off = usize::try_from(self.u32(pos)?).ok()?;
        Some(off.saturating_add(pos))
    }

    fn table(&mut self, pos: usize) -> Option<TablePos> {
        let soffset = i32::from_le_bytes(self.bytes::<4>(pos)?);
        let magnitude = usize::try_from(soffset.unsigned_abs()).ok()?;
        let vtable = if soffset > 0 { pos.checked_sub(magnitude) } else { pos.checked_add(magnitude) }?;
        if vtable >= self.buf.len() {
            return None;
        }
        let vtable_len = usize::from(self.u16(vtable)?);
        if !vtable.saturating_add(vtable_len).is_multiple_of(2) {
            return None;
        }
        self.range(vtable, vtable_len)?;
        self.tables += 1;
        (self.tables <= crate::FLATBUFFER_TABLES_MAX).then_some(TablePos { pos, vtable, vtable_len })
    }

    /// The table at the offset at `pos`.
    fn table_at(&mut self, pos: usize) -> Option<TablePos> {
        let at = self.uoffset(pos)?;
        self.table(at)
    }

    /// The string field `voffset` of `t`; `Some(None)` when absent.
    fn string_field(&mut self, t: &TablePos, voffset: u16) -> Option<Option<&'a str>> {
        let field = self.field(t, voffset)?;
        self.string(field)
    }

    /// Where field `voffset` of `t` lives; `Some(None)` when absent.
    fn field(&mut self, t: &TablePos, voffset: u16) -> Option<Option<usize>> {
        let voffset = usize::from(voffset);
        if voffset >= t.vtable_len {
            return Some(None);
        }
        match self.u16(t.vtable.saturating_add(voffset))? {
            0 => Some(None),
            off => Some(Some(t.pos.saturating_add(usize::from(off)))),
        }
    }

    /// A vector of `elem_size`-byte elements at the offset at `pos`: the
    /// position of its first element and its length.
    fn vector(&mut self, pos: usize, elem_size: usize) -> Option<(usize, usize)> {
        let at = self.uoffset(pos)?;
        let len = usize::try_from(self.u32(at)?).ok()?;
        let start = at.saturating_add(4);
        if !start.is_multiple_of(elem_size) {
            return None;
        }
        self.range(start, len.saturating_mul(elem_size))?;
        Some((start, len))
    }

    fn byte_vector(&mut self, field: Option<usize>) -> Option<Option<(usize, usize)>> {
        let Some(pos) = field else { return Some(None) };
        let (start, len) = self.vector(pos, 1)?;
        Some(Some((start, start.checked_add(len)?)))
    }

    fn string(&mut self, field: Option<usize>) -> Option<Option<&'a str>> {
        let Some((start, end)) = self.byte_vector(field)? else { return Some(None) };
        // The terminator, as the verifier wants it.
        if self.buf.get(end) != Some(&0) {
            return None;
        }
        std::str::from_utf8(self.buf.get(start..end)?).ok().map(Some)
    }

    fn scalar_u32(&mut self, field: Option<usize>) -> Option<u32> {
        field.map_or(Some(0), |pos| self.u32(pos))
    }

    fn scalar_u64(&mut self, field: Option<usize>) -> Option<u64> {
        field.map_or(Some(0), |pos| self.u64(pos))
    }
}

/// [`view_message`]'s walk of the metadata `meta`; `None` on anything
/// [`decode_message`] would refuse.
fn walk_metadata(meta: &[u8], payload_offset: usize) -> Option<MessageView<'_>> {
    use fb::MessageMetadata as M;
    let mut w = Walker::new(meta);
    let t = w.table_at(0)?;
    let producer_name = w.field(&t, M::VT_PRODUCER_NAME)?;
    let producer_name = w.string(producer_name)?;
    let f = w.field(&t, M::VT_SEQUENCE_ID)?;
    let sequence_id = w.scalar_u64(f)?;
    let f = w.field(&t, M::VT_PUBLISH_TIME_MS)?;
    let publish_time_ms = w.scalar_u64(f)?;
    let f = w.field(&t, M::VT_EVENT_TIME_MS)?;
    let event_time_ms = w.scalar_u64(f)?;
    let f = w.field(&t, M::VT_PARTITION_KEY)?;
    let partition_key = w.string(f)?;
    let f = w.field(&t, M::VT_ORDERING_KEY)?;
    let ordering_key_range = w.byte_vector(f)?;
    let properties = match w.field(&t, M::VT_PROPERTIES)? {
        None => PropertiesView { meta, start: 0, len: 0 },
        Some(pos) => {
            let (start, len) = w.vector(pos, 4)?;
            for i in 0..len {
                let kv = w.table_at(start.checked_add(i.checked_mul(4)?)?)?;
                w.string_field(&kv, fb::KeyValue::VT_KEY)??;
                w.string_field(&kv, fb::KeyValue::VT_VALUE)??;
            }
            PropertiesView { meta, start, len }
        }
    };
    let f = w.field(&t, M::VT_NUM_MESSAGES)?;
    let num_messages = w.scalar_u32(f)?;
    let f = w.field(&t, M::VT_DELIVER_AT_MS)?;
    let deliver_at_ms = w.scalar_u64(f)?;
    let compression = match w.field(&t, M::VT_COMPRESSION)? {
        None => CompressionType::None,
        Some(pos) => {
            w.range(pos, 1)?;
            compression_from_fb(fb::CompressionType(*meta.get(pos)?)).ok()?
        }
    };
    let f = w.field(&t, M::VT_UNCOMPRESSED_SIZE)?;
    let uncompressed_size = w.scalar_u32(f)?;
    let chunk = match w.field(&t, M::VT_CHUNK)? {
        None => None,
        Some(pos) => {
            let c = w.table_at(pos)?;
            let uuid = w.string_field(&c, fb::ChunkInfo::VT_UUID)??;
            let f = w.field(&c, fb::ChunkInfo::VT_CHUNK_ID)?;
            let chunk_id = w.scalar_u32(f)?;
            let f = w.field(&c, fb::ChunkInfo::VT_NUM_CHUNKS)?;
            let num_chunks = w.scalar_u32(f)?;
            let f = w.field(&c, fb::ChunkInfo::VT_TOTAL_CHUNK_MSG_SIZE)?;
            let total_chunk_msg_size = w.scalar_u32(f)?;
            Some(ChunkView { uuid, chunk_id, num_chunks, total_chunk_msg_size })
        }
    };
    let f = w.field(&t, M::VT_TAG)?;
    let tag = w.string(f)?;
    let ordering_key = match ordering_key_range {
        Some((from, to)) => Some(meta.get(from..to)?),
        None => None,
    };
    // Offsets in the blob: the metadata starts after its length field.
    let ordering_key_at = ordering_key_range
        .map(|(from, to)| Some((from.checked_add(MESSAGE_HEADER_BYTES)?, to.checked_add(MESSAGE_HEADER_BYTES)?)))
        .map_or(Some(None), |r| r.map(Some))?;
    Some(MessageView {
        producer_name: producer_name?,
        sequence_id,
        publish_time_ms,
        event_time_ms,
        partition_key,
        ordering_key,
        properties,
        num_messages,
        deliver_at_ms,
        compression,
        uncompressed_size,
        chunk,
        tag,
        payload_offset,
        ordering_key_at,
    })
}
