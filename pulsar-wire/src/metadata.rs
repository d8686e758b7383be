//! A borrowing reader of Pulsar's `MessageMetadata`, and the layout in
//! which a broker stores a Pulsar message.
//!
//! The reader walks the protobuf once, checks the structure of every field
//! (varints end, lengths stay within the buffer, known string fields are
//! UTF-8) and borrows the fields a broker needs, so the dispatch path reads
//! a stored entry without allocating.

use crate::frame::MAGIC_CRC32C;
use bytes::{BufMut, Bytes, BytesMut};

/// A stored Pulsar message starts with these bytes. A native blob starts
/// with its metadata length (`u32`, little-endian), which can never be
/// `u32::MAX` (the blob would be over 4 GiB), so the two formats never
/// collide.
pub const STORED_MARKER: [u8; 4] = [0xff; 4];

/// The stored form of a message received in a SEND: the marker, then the
/// frame's checksummed part unchanged (magic `0x0e01`, CRC-32C, metadata
/// length, metadata, payload). A MESSAGE frame carries that part again, so
/// a delivery copies it without re-encoding or re-checksumming.
pub fn stored_blob(checksummed: &[u8]) -> Bytes {
    let mut b = BytesMut::with_capacity(STORED_MARKER.len() + checksummed.len());
    b.extend_from_slice(&STORED_MARKER);
    b.extend_from_slice(checksummed);
    b.freeze()
}

/// The stored form of a message from its metadata and payload (computes the
/// CRC-32C): what another door stores to make a Pulsar message.
pub fn stored_blob_from_parts(metadata: &[u8], payload: &[u8]) -> Bytes {
    let meta_len = metadata.len() as u32;
    let mut crc = crc32c::crc32c(&meta_len.to_be_bytes());
    crc = crc32c::crc32c_append(crc, metadata);
    crc = crc32c::crc32c_append(crc, payload);
    let mut b = BytesMut::with_capacity(STORED_MARKER.len() + 10 + metadata.len() + payload.len());
    b.extend_from_slice(&STORED_MARKER);
    b.put_u16(MAGIC_CRC32C);
    b.put_u32(crc);
    b.put_u32(meta_len);
    b.extend_from_slice(metadata);
    b.extend_from_slice(payload);
    b.freeze()
}

/// True for a blob in the stored Pulsar layout (by its marker).
pub fn is_stored(blob: &[u8]) -> bool {
    blob.starts_with(&STORED_MARKER)
}

/// `(checksummed, metadata, payload)` of a stored message.
pub type StoredParts<'a> = (&'a [u8], &'a [u8], &'a [u8]);

/// A stored message's parts: `(checksummed, metadata, payload)`, where
/// `checksummed` is what a MESSAGE frame carries. Checks the layout and the
/// lengths, not the checksum (checked when the message was received).
pub fn split_stored(blob: &[u8]) -> Result<StoredParts<'_>, MetadataError> {
    let checksummed = blob.strip_prefix(&STORED_MARKER[..]).ok_or(MetadataError::NotStored)?;
    let head = checksummed.get(..10).ok_or(MetadataError::Truncated)?;
    if u16::from_be_bytes([head[0], head[1]]) != MAGIC_CRC32C {
        return Err(MetadataError::NotStored);
    }
    let meta_len = u32::from_be_bytes([head[6], head[7], head[8], head[9]]) as usize;
    let rest = &checksummed[10..];
    if meta_len > rest.len() {
        return Err(MetadataError::Truncated);
    }
    let (metadata, payload) = rest.split_at(meta_len);
    Ok((checksummed, metadata, payload))
}

/// Why a `MessageMetadata` could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataError {
    #[error("not a stored Pulsar message")]
    NotStored,
    #[error("truncated protobuf")]
    Truncated,
    #[error("varint longer than 10 bytes")]
    BadVarint,
    #[error("unsupported protobuf wire type {0}")]
    BadWireType(u8),
    #[error("field {0} is not UTF-8")]
    NotUtf8(u32),
    #[error("required field {0} is missing")]
    Missing(&'static str),
}

/// The fields of a `MessageMetadata` a broker reads, borrowed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct MetadataPeek<'a> {
    pub producer_name: &'a str,
    pub sequence_id: u64,
    pub publish_time_ms: u64,
    pub partition_key: Option<&'a str>,
    pub ordering_key: Option<&'a [u8]>,
    /// `num_messages_in_batch` when present (Pulsar's default is 1).
    pub num_messages_in_batch: Option<u32>,
    pub event_time_ms: u64,
    /// `deliver_at_time`; 0 when absent or not positive.
    pub deliver_at_ms: u64,
    pub compression: u32,
    pub highest_sequence_id: u64,
    pub uuid: Option<&'a str>,
    pub chunk_id: Option<u32>,
    pub num_chunks_from_msg: Option<u32>,
    pub marker_type: Option<i32>,
    pub null_value: bool,
}

fn varint(b: &[u8], at: &mut usize) -> Result<u64, MetadataError> {
    let mut v = 0u64;
    for i in 0..10 {
        let byte = *b.get(*at).ok_or(MetadataError::Truncated)?;
        *at += 1;
        v |= u64::from(byte & 0x7f) << (7 * i);
        if byte & 0x80 == 0 {
            return Ok(v);
        }
    }
    Err(MetadataError::BadVarint)
}

/// One protobuf field's value.
enum Value<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    Fixed,
}

/// Calls `f` with each field of the protobuf message `b`, in order.
fn walk<'a>(b: &'a [u8], mut f: impl FnMut(u32, Value<'a>) -> Result<(), MetadataError>) -> Result<(), MetadataError> {
    let mut at = 0usize;
    while at < b.len() {
        let key = varint(b, &mut at)?;
        let field = (key >> 3) as u32;
        let value = match (key & 7) as u8 {
            0 => Value::Varint(varint(b, &mut at)?),
            1 | 5 => {
                let n = if key & 7 == 1 { 8 } else { 4 };
                at = at.checked_add(n).filter(|&e| e <= b.len()).ok_or(MetadataError::Truncated)?;
                Value::Fixed
            }
            2 => {
                let len = usize::try_from(varint(b, &mut at)?).map_err(|_| MetadataError::Truncated)?;
                let end = at.checked_add(len).filter(|&e| e <= b.len()).ok_or(MetadataError::Truncated)?;
                let v = &b[at..end];
                at = end;
                Value::Bytes(v)
            }
            t => return Err(MetadataError::BadWireType(t)),
        };
        f(field, value)?;
    }
    Ok(())
}

fn text(field: u32, v: &[u8]) -> Result<&str, MetadataError> {
    std::str::from_utf8(v).map_err(|_| MetadataError::NotUtf8(field))
}

/// Reads a `MessageMetadata`; the three fields the protocol requires must
/// be there.
pub fn peek_metadata(b: &[u8]) -> Result<MetadataPeek<'_>, MetadataError> {
    let mut m = MetadataPeek::default();
    let (mut name, mut seq, mut time) = (false, false, false);
    walk(b, |field, value| {
        match (field, value) {
            (1, Value::Bytes(v)) => {
                m.producer_name = text(1, v)?;
                name = true;
            }
            (2, Value::Varint(v)) => {
                m.sequence_id = v;
                seq = true;
            }
            (3, Value::Varint(v)) => {
                m.publish_time_ms = v;
                time = true;
            }
            (6, Value::Bytes(v)) => m.partition_key = Some(text(6, v)?),
            (8, Value::Varint(v)) => m.compression = v as u32,
            (11, Value::Varint(v)) => m.num_messages_in_batch = Some(v as u32),
            (12, Value::Varint(v)) => m.event_time_ms = v,
            (18, Value::Bytes(v)) => m.ordering_key = Some(v),
            (19, Value::Varint(v)) => m.deliver_at_ms = (v as i64).max(0) as u64,
            (20, Value::Varint(v)) => m.marker_type = Some(v as i32),
            (24, Value::Varint(v)) => m.highest_sequence_id = v,
            (25, Value::Varint(v)) => m.null_value = v != 0,
            (26, Value::Bytes(v)) => m.uuid = Some(text(26, v)?),
            (27, Value::Varint(v)) => m.num_chunks_from_msg = Some(v as u32),
            (29, Value::Varint(v)) => m.chunk_id = Some(v as u32),
            _ => {}
        }
        Ok(())
    })?;
    if !name {
        return Err(MetadataError::Missing("producer_name"));
    }
    if !seq {
        return Err(MetadataError::Missing("sequence_id"));
    }
    if !time {
        return Err(MetadataError::Missing("publish_time"));
    }
    Ok(m)
}

/// One `KeyValue` (a property), borrowed.
fn key_value(b: &[u8]) -> Result<(&str, &str), MetadataError> {
    let (mut key, mut value) = (None, None);
    walk(b, |field, v| {
        match (field, v) {
            (1, Value::Bytes(v)) => key = Some(text(1, v)?),
            (2, Value::Bytes(v)) => value = Some(text(2, v)?),
            _ => {}
        }
        Ok(())
    })?;
    Ok((key.ok_or(MetadataError::Missing("key"))?, value.ok_or(MetadataError::Missing("value"))?))
}

/// The properties of a `MessageMetadata` (those of a whole message, or a
/// batch's first message's), in order.
pub fn metadata_properties(b: &[u8]) -> Result<Vec<(&str, &str)>, MetadataError> {
    let mut out = Vec::new();
    walk(b, |field, v| {
        if let (4, Value::Bytes(v)) = (field, v) {
            out.push(key_value(v)?);
        }
        Ok(())
    })?;
    Ok(out)
}

/// One message of an uncompressed Pulsar batch, borrowed from its payload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRecord<'a> {
    pub partition_key: Option<&'a str>,
    pub properties: Vec<(&'a str, &'a str)>,
    /// `event_time` when present.
    pub event_time_ms: Option<u64>,
    pub ordering_key: Option<&'a [u8]>,
    /// The `sequence_id` its producer gave it, when present.
    pub sequence_id: Option<u64>,
    pub payload: &'a [u8],
}

/// The messages of an uncompressed batch payload (each a big-endian `u32`
/// length, a `SingleMessageMetadata`, then `payload_size` bytes), at most
/// `n` of them. Every length is checked against the bytes there.
pub fn batch_records(payload: &[u8], n: u32) -> Result<Vec<BatchRecord<'_>>, MetadataError> {
    let mut at = 0usize;
    let mut out = Vec::new();
    for _ in 0..n {
        let len =
            payload.get(at..at.checked_add(4).ok_or(MetadataError::Truncated)?).ok_or(MetadataError::Truncated)?;
        let len = u32::from_be_bytes([len[0], len[1], len[2], len[3]]) as usize;
        let start = at + 4;
        let meta_end = start.checked_add(len).filter(|&e| e <= payload.len()).ok_or(MetadataError::Truncated)?;
        let mut record = BatchRecord {
            partition_key: None,
            properties: Vec::new(),
            event_time_ms: None,
            ordering_key: None,
            sequence_id: None,
            payload: &[],
        };
        let mut size = None;
        walk(&payload[start..meta_end], |field, v| {
            match (field, v) {
                (1, Value::Bytes(v)) => record.properties.push(key_value(v)?),
                (2, Value::Bytes(v)) => record.partition_key = Some(text(2, v)?),
                // int32: a negative size is encoded as a 10-byte varint.
                (3, Value::Varint(v)) => size = Some(usize::try_from(v).map_err(|_| MetadataError::Truncated)?),
                (5, Value::Varint(v)) => record.event_time_ms = Some(v),
                (7, Value::Bytes(v)) => record.ordering_key = Some(v),
                (8, Value::Varint(v)) => record.sequence_id = Some(v),
                _ => {}
            }
            Ok(())
        })?;
        let size = size.ok_or(MetadataError::Missing("payload_size"))?;
        let end = meta_end.checked_add(size).filter(|&e| e <= payload.len()).ok_or(MetadataError::Truncated)?;
        record.payload = &payload[meta_end..end];
        out.push(record);
        at = end;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::{KeyValue, MessageMetadata};
    use prost::Message;

    /// Goal: the borrowing reader reads what prost encodes, and a stored
    /// blob splits back into its parts.
    #[test]
    fn reads_what_prost_encodes() {
        let meta = MessageMetadata {
            producer_name: "p-1".into(),
            sequence_id: 42,
            publish_time: 1_700_000_000_123,
            properties: vec![KeyValue { key: "k".into(), value: "v".into() }],
            partition_key: Some("key".into()),
            num_messages_in_batch: Some(3),
            event_time: Some(9),
            ordering_key: Some(b"ord".to_vec()),
            deliver_at_time: Some(1_700_000_005_000),
            highest_sequence_id: Some(44),
            uuid: Some("u".into()),
            chunk_id: Some(2),
            num_chunks_from_msg: Some(5),
            ..Default::default()
        };
        let bytes = meta.encode_to_vec();
        let m = peek_metadata(&bytes).unwrap();
        assert_eq!((m.producer_name, m.sequence_id, m.publish_time_ms), ("p-1", 42, 1_700_000_000_123));
        assert_eq!((m.partition_key, m.ordering_key), (Some("key"), Some(&b"ord"[..])));
        assert_eq!((m.num_messages_in_batch, m.event_time_ms, m.deliver_at_ms), (Some(3), 9, 1_700_000_005_000));
        assert_eq!(
            (m.highest_sequence_id, m.uuid, m.chunk_id, m.num_chunks_from_msg),
            (44, Some("u"), Some(2), Some(5))
        );
        let blob = stored_blob_from_parts(&bytes, b"payload");
        assert!(is_stored(&blob));
        let (checksummed, metadata, payload) = split_stored(&blob).unwrap();
        assert_eq!((metadata, payload), (&bytes[..], &b"payload"[..]));
        assert_eq!(&checksummed[..2], &[0x0e, 0x01]);
        assert_eq!(peek_metadata(&[]), Err(MetadataError::Missing("producer_name")));
        for cut in 0..bytes.len() {
            let _ = peek_metadata(&bytes[..cut]);
        }
    }

    /// Goal: a batch payload as Pulsar clients build it splits into its
    /// messages with their keys, properties and payloads; a record that
    /// claims more bytes than there are is refused, not read past.
    #[test]
    fn splits_a_batch_payload() {
        use crate::proto::SingleMessageMetadata;
        let mut payload = Vec::new();
        for (i, (key, body)) in [(Some("a"), &b"one"[..]), (None, b"two!")].into_iter().enumerate() {
            let single = SingleMessageMetadata {
                properties: vec![KeyValue { key: "p".into(), value: body.len().to_string() }],
                partition_key: key.map(str::to_string),
                payload_size: body.len() as i32,
                event_time: (i == 0).then_some(77),
                ordering_key: (i == 0).then(|| b"ord".to_vec()),
                sequence_id: (i == 0).then_some(9),
                ..Default::default()
            }
            .encode_to_vec();
            payload.extend_from_slice(&(single.len() as u32).to_be_bytes());
            payload.extend_from_slice(&single);
            payload.extend_from_slice(body);
        }
        let records = batch_records(&payload, 2).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(records.len(), 2);
        assert_eq!((records[0].partition_key, records[0].payload), (Some("a"), &b"one"[..]));
        assert_eq!(records[0].properties, vec![("p", "3")]);
        assert_eq!((records[1].partition_key, records[1].payload), (None, &b"two!"[..]));
        assert_eq!(
            (records[0].event_time_ms, records[0].ordering_key, records[0].sequence_id),
            (Some(77), Some(&b"ord"[..]), Some(9))
        );
        assert_eq!((records[1].event_time_ms, records[1].ordering_key, records[1].sequence_id), (None, None, None));
        assert_eq!(batch_records(&payload, 3), Err(MetadataError::Truncated));
        assert_eq!(batch_records(&payload[..payload.len() - 1], 2), Err(MetadataError::Truncated));
        let meta = MessageMetadata {
            producer_name: "p".into(),
            properties: vec![KeyValue { key: "k".into(), value: "v".into() }],
            ..Default::default()
        }
        .encode_to_vec();
        assert_eq!(metadata_properties(&meta), Ok(vec![("k", "v")]));
    }
}
