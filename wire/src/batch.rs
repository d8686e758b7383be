//! The batch payload: several messages in one entry (issue #5).
//!
//! An entry whose metadata says `num_messages` = N > 1 is a batch. Its
//! payload (after decompression, when `compression` is set) is N records,
//! back to back, each (all integers little-endian; also in `docs/format.md`):
//!
//! ```text
//! offset      size           field
//! 0           4              metadata_len
//! 4           metadata_len   SingleMessageMetadata flatbuffer
//! 4 + m       payload_size   the message's payload (payload_size is in the metadata)
//! ```
//!
//! Fields shared by the whole batch (producer name, publish time,
//! compression) live once in the entry's `MessageMetadata`; the per-message
//! ones (key, ordering key, properties, event time, sequence id) in each
//! record. This is Pulsar's layout with flatbuffers in place of protobuf.

use bytes::{BufMut, Bytes, BytesMut};

use crate::error::WireError;
use crate::frame::{len_u64, read_u32_le, string, with_builder};
use crate::{fb, verifier_options, ENCODE_VARIABLE_BYTES_MAX};

/// Bytes before each record's metadata: `metadata_len`.
pub const BATCH_RECORD_HEADER_BYTES: usize = 4;
/// Most messages one batch may hold (decoder bound).
pub const BATCH_MESSAGES_MAX: u32 = 1 << 20;

/// One message of a batch, as the producer gives it and the consumer gets it.
/// The payload (and ordering key) are slices of the batch: no copy.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct BatchMessage {
    pub properties: Vec<(String, String)>,
    pub partition_key: Option<String>,
    pub ordering_key: Option<Bytes>,
    /// 0 = not set.
    pub event_time_ms: u64,
    pub sequence_id: u64,
    pub payload: Bytes,
}

/// Appends one record to a batch payload.
///
/// Panics (an `assert!`: a caller bug) if the message's strings and vectors
/// total more than [`ENCODE_VARIABLE_BYTES_MAX`].
pub fn encode_batch_record_into(msg: &BatchMessage, dst: &mut BytesMut) {
    let s = |v: &str| len_u64(v.len());
    let variable = msg
        .properties
        .iter()
        .fold(0u64, |a, (k, v)| a.saturating_add(s(k)).saturating_add(s(v)).saturating_add(32))
        .saturating_add(msg.partition_key.as_deref().map_or(0, s))
        .saturating_add(msg.ordering_key.as_ref().map_or(0, |k| len_u64(k.len())));
    assert!(variable <= ENCODE_VARIABLE_BYTES_MAX, "batch record metadata of {variable} bytes is too large");
    let payload_size = u32::try_from(msg.payload.len()).unwrap_or(u32::MAX);
    assert_eq!(len_u64(msg.payload.len()), u64::from(payload_size), "batch record payload above 4 GiB");
    with_builder(|fbb| {
        let properties = crate::message::encode_properties(fbb, &msg.properties);
        let partition_key = msg.partition_key.as_deref().map(|k| fbb.create_string(k));
        let ordering_key = msg.ordering_key.as_deref().map(|k| fbb.create_vector(k));
        let root = fb::SingleMessageMetadata::create(
            fbb,
            &fb::SingleMessageMetadataArgs {
                properties,
                partition_key,
                ordering_key,
                payload_size,
                event_time_ms: msg.event_time_ms,
                sequence_id: msg.sequence_id,
            },
        );
        fbb.finish_minimal(root);
        let bytes = fbb.finished_data();
        let len = u32::try_from(bytes.len()).unwrap_or(u32::MAX);
        dst.reserve(BATCH_RECORD_HEADER_BYTES + bytes.len() + msg.payload.len());
        dst.put_u32_le(len);
        dst.extend_from_slice(bytes);
        dst.extend_from_slice(&msg.payload);
    });
}

/// Splits a batch payload into its `num_messages` messages. Never panics:
/// any inconsistency is an error naming offsets and counts.
pub fn decode_batch(payload: &Bytes, num_messages: u32) -> Result<Vec<BatchMessage>, WireError> {
    let len = len_u64(payload.len());
    let bad = |found: u32, reason| WireError::BadBatch { len, expected: num_messages, found, reason };
    if num_messages == 0 || num_messages > BATCH_MESSAGES_MAX {
        return Err(bad(0, "message count out of range"));
    }
    // Each record takes at least its 4-byte header: bound the allocation.
    let cap = usize::try_from(num_messages).unwrap_or(0).min(payload.len() / BATCH_RECORD_HEADER_BYTES);
    let mut out = Vec::with_capacity(cap);
    let mut pos = 0usize;
    for i in 0..num_messages {
        let truncated = |what, need: u64, have: usize| WireError::Truncated {
            what,
            offset: len_u64(pos),
            need,
            have: len_u64(have),
        };
        let meta_len = read_u32_le(payload, pos)
            .ok_or_else(|| truncated("batch record metadata_len", 4, payload.len().saturating_sub(pos)))?;
        let start = pos + BATCH_RECORD_HEADER_BYTES;
        let end = usize::try_from(meta_len).ok().and_then(|m| start.checked_add(m));
        let meta_bytes = end.and_then(|e| payload.get(start..e)).ok_or_else(|| {
            truncated("batch record metadata", u64::from(meta_len), payload.len().saturating_sub(start))
        })?;
        let opts = verifier_options(meta_bytes.len());
        let meta = flatbuffers::root_with_opts::<fb::SingleMessageMetadata<'_>>(&opts, meta_bytes)
            .map_err(|source| WireError::InvalidFlatbuffer { what: "SingleMessageMetadata", source })?;
        let pstart = start + meta_bytes.len();
        let pend = usize::try_from(meta.payload_size()).ok().and_then(|s| pstart.checked_add(s));
        let body = match pend {
            Some(e) if e <= payload.len() => payload.slice(pstart..e),
            _ => {
                return Err(truncated(
                    "batch record payload",
                    u64::from(meta.payload_size()),
                    payload.len().saturating_sub(pstart),
                ))
            }
        };
        let properties = match meta.properties() {
            None => Vec::new(),
            Some(props) => props
                .iter()
                .map(|kv| Ok((string(kv.key(), "KeyValue.key")?, string(kv.value(), "KeyValue.value")?)))
                .collect::<Result<Vec<_>, WireError>>()?,
        };
        out.push(BatchMessage {
            properties,
            partition_key: meta.partition_key().map(str::to_owned),
            ordering_key: meta.ordering_key().map(|k| payload.slice_ref(k.bytes())),
            event_time_ms: meta.event_time_ms(),
            sequence_id: meta.sequence_id(),
            payload: body,
        });
        pos = pstart + out.last().map_or(0, |m| m.payload.len());
        if i + 1 < num_messages && pos >= payload.len() {
            return Err(bad(i + 1, "payload ends early"));
        }
    }
    if pos != payload.len() {
        return Err(bad(num_messages, "bytes after the last message"));
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(i: u64) -> BatchMessage {
        BatchMessage {
            properties: if i.is_multiple_of(2) { vec![("a".into(), format!("{i}"))] } else { Vec::new() },
            partition_key: (!i.is_multiple_of(3)).then(|| format!("k{i}")),
            ordering_key: (i == 1).then(|| Bytes::from_static(b"ok")),
            event_time_ms: i * 7,
            sequence_id: 100 + i,
            payload: Bytes::from(vec![i as u8; i as usize * 3]),
        }
    }

    #[test]
    fn round_trip_and_every_truncation_fails_cleanly() {
        let msgs: Vec<BatchMessage> = (0..5).map(sample).collect();
        let mut buf = BytesMut::new();
        for m in &msgs {
            encode_batch_record_into(m, &mut buf);
        }
        let batch = buf.freeze();
        assert_eq!(decode_batch(&batch, 5).unwrap(), msgs);
        assert!(decode_batch(&batch, 4).is_err(), "trailing message accepted");
        assert!(decode_batch(&batch, 6).is_err(), "missing message accepted");
        assert!(decode_batch(&batch, 0).is_err());
        for cut in 0..batch.len() {
            assert!(decode_batch(&batch.slice(..cut), 5).is_err(), "cut at {cut} accepted");
        }
        let mut flipped = batch.to_vec();
        for i in 0..flipped.len() {
            flipped[i] ^= 0xff;
            let _ = decode_batch(&Bytes::from(flipped.clone()), 5); // must not panic
            flipped[i] ^= 0xff;
        }
    }
}
