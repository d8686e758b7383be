//! Stored message metadata: the only code that reads a stored entry's blob
//! (publish time, partition and ordering keys, key hash, deliver-at, tag,
//! batch count, chunk fields, producer name and sequence id).
//!
//! A blob is stored byte for byte as its producer sent it, so its layout is
//! an on-disk format. [`Format`] names the formats a blob may be in; every
//! reader here matches on it (static dispatch), so a second format (Pulsar's
//! protobuf `MessageMetadata`) is one more arm in this file and no other
//! module changes. Two today: [`Format::Native`], the native protocol's
//! flatbuffers blob (`magnetar_wire::message`), and [`Format::Pulsar`],
//! a message received through the Pulsar door, stored as that door's frame
//! carried it (`magnetar_pulsar_wire::metadata::stored_blob`).
//!
//! The readers return format-neutral values borrowed from the blob; none of
//! them allocates except [`with_key`] (admin lookups, off the hot paths).

use crate::error::{CoreError, ErrorCode};
use bytes::Bytes;
use magnetar_wire::{CompressionType, WireError};

/// Most messages one batch entry may hold: what a consumer can split.
pub(crate) const BATCH_MESSAGES_MAX: u32 = magnetar_wire::BATCH_MESSAGES_MAX;

/// The stored formats of a message blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// `u32` metadata length, flatbuffers `MessageMetadata`, payload.
    Native,
    /// Marker `ff ff ff ff` (a native blob's metadata length can never be
    /// `u32::MAX`), then magic `0x0e01`, CRC-32C, `u32` big-endian metadata
    /// length, protobuf `MessageMetadata` (Apache Pulsar's), payload.
    Pulsar,
}

impl Format {
    /// The format `blob` is in, by the marker a Pulsar blob starts with.
    #[inline]
    fn of(blob: &[u8]) -> Self {
        if magnetar_pulsar_wire::metadata::is_stored(blob) {
            Format::Pulsar
        } else {
            Format::Native
        }
    }
}

/// Why a blob could not be read. Displays as the format's own decoder error.
#[derive(Debug, thiserror::Error)]
pub(crate) enum EntryError {
    #[error(transparent)]
    Native(WireError),
    #[error("Pulsar message: {0}")]
    Pulsar(magnetar_pulsar_wire::MetadataError),
}

/// A Pulsar blob's metadata, read without allocating.
fn pulsar_meta(blob: &[u8]) -> Result<magnetar_pulsar_wire::MetadataPeek<'_>, EntryError> {
    let (_, metadata, _) = magnetar_pulsar_wire::metadata::split_stored(blob).map_err(EntryError::Pulsar)?;
    magnetar_pulsar_wire::peek_metadata(metadata).map_err(EntryError::Pulsar)
}

/// `(chunk_id, num_chunks)` of a Pulsar chunk.
fn pulsar_chunk(m: &magnetar_pulsar_wire::MetadataPeek<'_>) -> Option<(u32, u32)> {
    match (m.chunk_id, m.num_chunks_from_msg) {
        (Some(id), Some(n)) if n > 1 => Some((id, n)),
        _ => None,
    }
}

/// A stored entry's metadata, checked whole and borrowed from its blob.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Meta<'a> {
    pub(crate) producer_name: &'a str,
    pub(crate) sequence_id: u64,
    /// Set by the producer's clock; milliseconds since the Unix epoch.
    pub(crate) publish_time_ms: u64,
    pub(crate) partition_key: Option<&'a str>,
    pub(crate) ordering_key: Option<&'a [u8]>,
    /// Messages in the entry as its metadata says: 0 or 1 unless batched.
    pub(crate) num_messages: u32,
    /// 0: deliver at once.
    pub(crate) deliver_at_ms: u64,
    pub(crate) tag: Option<&'a str>,
    /// `(chunk_id, num_chunks)` of a chunk of a chunked message.
    pub(crate) chunk: Option<(u32, u32)>,
}

impl Meta<'_> {
    /// The chunk id deduplication tracks: 0 for a whole message.
    pub(crate) fn chunk_id(&self) -> u32 {
        self.chunk.map_or(0, |(id, _)| id)
    }

    /// What the storage index keeps beside the entry's position, so that
    /// seek by time and lookup by key or tag need not read payloads.
    pub(crate) fn index_extras(&self) -> magnetar_storage::IndexExtras {
        magnetar_storage::IndexExtras {
            publish_time_ms: self.publish_time_ms,
            key_hash: self.partition_key.map_or(0, |k| magnetar_storage::key_hash(k.as_bytes())),
            tag_hash: magnetar_storage::tag_hash(self.tag.map(str::as_bytes)),
        }
    }
}

/// Checks `blob` whole and reads its metadata. Accepts exactly the blobs a
/// consumer's decoder accepts, and allocates nothing.
pub(crate) fn read(blob: &[u8]) -> Result<Meta<'_>, EntryError> {
    match Format::of(blob) {
        Format::Native => {
            let p = magnetar_wire::peek_message(blob).map_err(EntryError::Native)?;
            Ok(Meta {
                producer_name: p.producer_name,
                sequence_id: p.sequence_id,
                publish_time_ms: p.publish_time_ms,
                partition_key: p.partition_key,
                ordering_key: p.ordering_key,
                num_messages: p.num_messages,
                deliver_at_ms: p.deliver_at_ms,
                tag: p.tag,
                chunk: p.chunk,
            })
        }
        Format::Pulsar => {
            let m = pulsar_meta(blob)?;
            Ok(Meta {
                producer_name: m.producer_name,
                sequence_id: m.sequence_id,
                publish_time_ms: m.publish_time_ms,
                partition_key: m.partition_key,
                ordering_key: m.ordering_key,
                // Present only on a batch (Pulsar's default is 1).
                num_messages: m.num_messages_in_batch.unwrap_or(0),
                deliver_at_ms: m.deliver_at_ms,
                tag: None,
                chunk: pulsar_chunk(&m),
            })
        }
    }
}

/// The batch index of the last message in a stored entry: -1 when the entry
/// is one message, `n - 1` for a batch of `n`. A Pulsar batch says so by
/// carrying `num_messages_in_batch` (even 1); a native entry is a batch when
/// it holds more than one message.
pub(crate) fn last_batch_index(blob: &[u8]) -> Result<i32, EntryError> {
    let meta = read(blob)?;
    let batched = match Format::of(blob) {
        Format::Pulsar => meta.num_messages >= 1,
        Format::Native => meta.num_messages > 1,
    };
    Ok(if batched { i32::try_from(meta.num_messages - 1).unwrap_or(i32::MAX) } else { -1 })
}

/// [`read`] for a blob offered for storage: a blob no consumer could
/// decode is refused (`ProtocolError`), so none is ever stored.
pub(crate) fn check(blob: &[u8]) -> Result<Meta<'_>, CoreError> {
    read(blob).map_err(|e| CoreError::new(ErrorCode::ProtocolError, format!("bad message blob: {e}")))
}

/// The produce path's check of a persistent send: `num_messages` (the
/// send's count) must be one a consumer can split and agree with the
/// metadata's, and the blob must pass [`check`]. One walk over the
/// metadata; its fields are returned for the index and deduplication.
pub(crate) fn check_send(blob: &[u8], num_messages: u32) -> Result<Meta<'_>, CoreError> {
    if num_messages == 0 {
        return Err(CoreError::new(ErrorCode::ProtocolError, "send with num_messages 0"));
    }
    // A batch no consumer could split would be stored and then
    // undeliverable; its count would also inflate the backlog and rates.
    if num_messages > BATCH_MESSAGES_MAX {
        return Err(CoreError::new(
            ErrorCode::ProtocolError,
            format!("send says {num_messages} messages; a batch holds at most {BATCH_MESSAGES_MAX}"),
        ));
    }
    let meta = check(blob)?;
    if meta.num_messages != 0 && meta.num_messages != num_messages {
        return Err(CoreError::new(
            ErrorCode::ProtocolError,
            format!("send says {num_messages} messages, its metadata {}", meta.num_messages),
        ));
    }
    Ok(meta)
}

/// What a dispatcher reads from a stored entry before delivering it: the
/// keys (Key_Shared), the tag (a tag filter), the delivery time and the
/// message count (permits).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Delivery<'a> {
    pub(crate) partition_key: Option<&'a [u8]>,
    pub(crate) ordering_key: Option<&'a [u8]>,
    pub(crate) tag: Option<&'a [u8]>,
    pub(crate) num_messages: u32,
    pub(crate) deliver_at_ms: u64,
}

/// The [`Delivery`] fields of a stored entry, on the dispatch path: no
/// allocation and no check of the rest of the metadata. A stored blob passed
/// [`check`] when appended and the log's checksum has vouched for its bytes
/// since, so checking it whole again per delivered entry would only repeat
/// that work on the hottest read path. Every offset followed is
/// bounds-checked: on any input this returns values or an error, never
/// panics.
#[inline]
pub(crate) fn for_delivery(blob: &[u8]) -> Result<Delivery<'_>, EntryError> {
    match Format::of(blob) {
        Format::Native => {
            let p = magnetar_wire::peek_for_delivery(blob).map_err(EntryError::Native)?;
            Ok(Delivery {
                partition_key: p.partition_key,
                ordering_key: p.ordering_key,
                tag: p.tag,
                num_messages: p.num_messages,
                deliver_at_ms: p.deliver_at_ms,
            })
        }
        Format::Pulsar => {
            let m = pulsar_meta(blob)?;
            Ok(Delivery {
                partition_key: m.partition_key.map(str::as_bytes),
                ordering_key: m.ordering_key,
                tag: None,
                num_messages: m.num_messages_in_batch.unwrap_or(0),
                deliver_at_ms: m.deliver_at_ms,
            })
        }
    }
}

/// One message of an entry (see [`with_key`] and [`messages`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyedMessage {
    /// Index in its batch; -1 for the whole entry.
    pub(crate) batch_index: i64,
    /// Its partition key, if it has one.
    pub(crate) key: Option<String>,
    pub(crate) properties: Vec<(String, String)>,
    pub(crate) payload: Bytes,
}

/// Messages of one entry (see [`with_key`] and [`messages`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct KeyedMessages {
    pub(crate) publish_time_ms: u64,
    pub(crate) num_messages: u32,
    /// `Some` for a compressed entry (returned whole: the broker never
    /// decompresses).
    pub(crate) compression: Option<CompressionType>,
    /// In the order [`with_key`] or [`messages`] says.
    pub(crate) messages: Vec<KeyedMessage>,
}

/// The messages of a stored entry whose partition key is `key`: inside an
/// uncompressed batch, each matching message (newest first); otherwise the
/// whole entry when its key matches. A batch whose records cannot be split
/// yields none.
pub(crate) fn with_key(blob: &Bytes, key: &str) -> Result<KeyedMessages, EntryError> {
    let mut found = select(blob, |k| k == Some(key))?;
    found.messages.reverse();
    Ok(found)
}

/// Every message of a stored entry, in batch order: an uncompressed
/// batch's messages one by one, otherwise the whole entry (a batch whose
/// records cannot be split: the whole entry as well).
pub(crate) fn messages(blob: &Bytes) -> Result<KeyedMessages, EntryError> {
    let found = select(blob, |_| true)?;
    if !found.messages.is_empty() {
        return Ok(found);
    }
    // An unsplittable batch: shown whole rather than not at all.
    let mut whole = select_whole(blob)?;
    whole.compression = None;
    Ok(whole)
}

/// The whole entry as one message.
fn select_whole(blob: &Bytes) -> Result<KeyedMessages, EntryError> {
    match Format::of(blob) {
        Format::Native => {
            let (meta, payload) = magnetar_wire::decode_message(blob).map_err(EntryError::Native)?;
            Ok(KeyedMessages {
                publish_time_ms: meta.publish_time_ms,
                num_messages: meta.num_messages,
                compression: None,
                messages: vec![KeyedMessage {
                    batch_index: -1,
                    key: meta.partition_key,
                    properties: meta.properties,
                    payload,
                }],
            })
        }
        Format::Pulsar => {
            let m = pulsar_meta(blob)?;
            let (_, _, payload) = magnetar_pulsar_wire::metadata::split_stored(blob).map_err(EntryError::Pulsar)?;
            Ok(KeyedMessages {
                publish_time_ms: m.publish_time_ms,
                num_messages: m.num_messages_in_batch.unwrap_or(0),
                compression: None,
                messages: vec![KeyedMessage {
                    batch_index: -1,
                    key: m.partition_key.map(str::to_string),
                    properties: Vec::new(),
                    payload: blob.slice_ref(payload),
                }],
            })
        }
    }
}

/// The messages of a stored entry whose key `want` accepts, in batch order.
fn select(blob: &Bytes, want: impl Fn(Option<&str>) -> bool) -> Result<KeyedMessages, EntryError> {
    match Format::of(blob) {
        Format::Native => {
            let (meta, payload) = magnetar_wire::decode_message(blob).map_err(EntryError::Native)?;
            let compressed = meta.compression != CompressionType::None;
            let mut messages = Vec::new();
            if meta.num_messages <= 1 || compressed {
                if want(meta.partition_key.as_deref()) {
                    messages.push(KeyedMessage {
                        batch_index: -1,
                        key: meta.partition_key,
                        properties: meta.properties,
                        payload,
                    });
                }
            } else if let Ok(records) = magnetar_wire::decode_batch(&payload, meta.num_messages) {
                for (i, r) in records.into_iter().enumerate() {
                    if want(r.partition_key.as_deref()) {
                        messages.push(KeyedMessage {
                            batch_index: i as i64,
                            key: r.partition_key,
                            properties: r.properties,
                            payload: r.payload,
                        });
                    }
                }
            }
            Ok(KeyedMessages {
                publish_time_ms: meta.publish_time_ms,
                num_messages: meta.num_messages,
                compression: (compressed && !messages.is_empty()).then_some(meta.compression),
                messages,
            })
        }
        Format::Pulsar => {
            let m = pulsar_meta(blob)?;
            let (_, metadata, payload) =
                magnetar_pulsar_wire::metadata::split_stored(blob).map_err(EntryError::Pulsar)?;
            let compressed = m.compression != 0;
            let owned = |kv: Vec<(&str, &str)>| kv.into_iter().map(|(k, v)| (k.to_string(), v.to_string())).collect();
            let mut messages = Vec::new();
            match m.num_messages_in_batch {
                // A compressed batch is taken whole by its own key (its
                // first message's): finding by key does not decompress
                // (only the Pulsar door's converter does, between doors).
                None => {}
                Some(n) if !compressed => {
                    if let Ok(records) =
                        magnetar_pulsar_wire::metadata::batch_records(payload, n.min(BATCH_MESSAGES_MAX))
                    {
                        for (i, r) in records.into_iter().enumerate() {
                            if want(r.partition_key) {
                                messages.push(KeyedMessage {
                                    batch_index: i as i64,
                                    key: r.partition_key.map(str::to_string),
                                    properties: owned(r.properties),
                                    payload: blob.slice_ref(r.payload),
                                });
                            }
                        }
                    }
                }
                Some(_) => {}
            }
            let whole = m.num_messages_in_batch.is_none() || compressed;
            if whole && want(m.partition_key) {
                let properties =
                    magnetar_pulsar_wire::metadata::metadata_properties(metadata).map_err(EntryError::Pulsar)?;
                messages.push(KeyedMessage {
                    batch_index: -1,
                    key: m.partition_key.map(str::to_string),
                    properties: owned(properties),
                    payload: blob.slice_ref(payload),
                });
            }
            Ok(KeyedMessages {
                publish_time_ms: m.publish_time_ms,
                num_messages: m.num_messages_in_batch.unwrap_or(0),
                compression: if compressed && !messages.is_empty() { pulsar_compression(m.compression) } else { None },
                messages,
            })
        }
    }
}

/// The native name of a Pulsar codec (`CompressionType` in PulsarApi.proto).
fn pulsar_compression(codec: u32) -> Option<CompressionType> {
    match codec {
        1 => Some(CompressionType::Lz4),
        2 => Some(CompressionType::Zlib),
        3 => Some(CompressionType::Zstd),
        4 => Some(CompressionType::Snappy),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_wire::{encode_batch_record_into, encode_message, BatchMessage, ChunkInfo, MessageMetadata};

    fn full() -> MessageMetadata {
        MessageMetadata {
            producer_name: "p-1".into(),
            sequence_id: 42,
            publish_time_ms: 1_700_000_000_123,
            event_time_ms: 7,
            partition_key: Some("key-a".into()),
            ordering_key: Some(Bytes::from_static(b"ord")),
            properties: vec![("k".into(), "v".into())],
            num_messages: 3,
            deliver_at_ms: 1_700_000_005_000,
            compression: CompressionType::None,
            uncompressed_size: 0,
            chunk: Some(ChunkInfo { uuid: "u".into(), chunk_id: 2, num_chunks: 5, total_chunk_msg_size: 99 }),
            tag: Some("tag-x".into()),
        }
    }

    #[test]
    fn last_batch_index_of_native_entries() {
        // Goal: a batch of n answers n - 1; a single message answers -1.
        let batch = encode_message(&MessageMetadata { chunk: None, ..full() }, b"payload");
        assert_eq!(last_batch_index(&batch).unwrap(), 2);
        let single = encode_message(&MessageMetadata { num_messages: 1, chunk: None, ..full() }, b"p");
        assert_eq!(last_batch_index(&single).unwrap(), -1);
        assert!(last_batch_index(b"not an entry").is_err());
    }

    #[test]
    fn reads_back_what_the_wire_encodes() {
        // Goal: every field the broker reads comes back as encoded, by the
        // checked reader and the delivery reader alike.
        let blob = encode_message(&full(), b"payload");
        let m = read(&blob).unwrap();
        assert_eq!(m.producer_name, "p-1");
        assert_eq!(m.sequence_id, 42);
        assert_eq!(m.publish_time_ms, 1_700_000_000_123);
        assert_eq!(m.partition_key, Some("key-a"));
        assert_eq!(m.ordering_key, Some(&b"ord"[..]));
        assert_eq!(m.num_messages, 3);
        assert_eq!(m.deliver_at_ms, 1_700_000_005_000);
        assert_eq!(m.tag, Some("tag-x"));
        assert_eq!(m.chunk, Some((2, 5)));
        assert_eq!(m.chunk_id(), 2);
        let x = m.index_extras();
        assert_eq!(x.publish_time_ms, m.publish_time_ms);
        assert_eq!(x.key_hash, magnetar_storage::key_hash(b"key-a"));
        assert_eq!(x.tag_hash, magnetar_storage::tag_hash(Some(b"tag-x")));
        let d = for_delivery(&blob).unwrap();
        assert_eq!(
            d,
            Delivery {
                partition_key: Some(b"key-a"),
                ordering_key: Some(b"ord"),
                tag: Some(b"tag-x"),
                num_messages: 3,
                deliver_at_ms: 1_700_000_005_000,
            }
        );
        assert_eq!(check_send(&blob, 3).unwrap(), m);

        // Absent fields read as absent, in both readers.
        let bare = MessageMetadata { producer_name: "p".into(), ..Default::default() };
        let blob = encode_message(&bare, b"");
        let m = read(&blob).unwrap();
        assert_eq!((m.partition_key, m.ordering_key, m.tag, m.chunk), (None, None, None, None));
        assert_eq!((m.num_messages, m.deliver_at_ms, m.chunk_id()), (0, 0, 0));
        assert_eq!(m.index_extras().key_hash, 0);
        let d = for_delivery(&blob).unwrap();
        assert_eq!((d.partition_key, d.ordering_key, d.tag, d.num_messages, d.deliver_at_ms), (None, None, None, 0, 0));
        assert_eq!(check_send(&blob, 1).unwrap(), m);
    }

    #[test]
    fn refuses_what_the_produce_path_refused() {
        // Goal: the same blobs and counts are refused as before the entry
        // module, with the same codes and messages.
        let blob = encode_message(&full(), b"payload");
        let refused = |b: &[u8], n: u32| check_send(b, n).unwrap_err();
        let e = refused(&blob, 0);
        assert_eq!((e.code, e.message.as_str()), (ErrorCode::ProtocolError, "send with num_messages 0"));
        let e = refused(&blob, BATCH_MESSAGES_MAX + 1);
        assert_eq!(e.code, ErrorCode::ProtocolError);
        assert!(e.message.contains("a batch holds at most"), "{e}");
        let e = refused(&blob, 2);
        assert_eq!(e.message, "send says 2 messages, its metadata 3");
        for bad in [&b""[..], &b"\x01\x00"[..], &b"\xff\xff\xff\x7fxx"[..], &blob[..blob.len() / 2]] {
            let e = refused(bad, 3);
            assert_eq!(e.code, ErrorCode::ProtocolError);
            let wire = magnetar_wire::peek_message(bad).unwrap_err();
            assert_eq!(e.message, format!("bad message blob: {wire}"));
            assert!(read(bad).is_err());
            assert!(check(bad).is_err());
        }
        // Every corruption of a valid blob is refused exactly when the
        // wire's checked reader refuses it; the delivery reader never panics.
        for i in 0..blob.len() {
            for flip in [0x01u8, 0x80, 0xff] {
                let mut b = blob.to_vec();
                b[i] ^= flip;
                assert_eq!(read(&b).is_ok(), magnetar_wire::peek_message(&b).is_ok(), "byte {i} ^ {flip:#x}");
                let _ = for_delivery(&b);
            }
        }
    }

    #[test]
    fn finds_keyed_messages_whole_or_in_a_batch() {
        // A plain message with the key is returned whole.
        let mut one = full();
        one.num_messages = 1;
        one.chunk = None;
        let blob = encode_message(&one, b"payload");
        let k = with_key(&blob, "key-a").unwrap();
        assert_eq!((k.publish_time_ms, k.num_messages, k.compression), (one.publish_time_ms, 1, None));
        assert_eq!(k.messages.len(), 1);
        assert_eq!(k.messages[0].batch_index, -1);
        assert_eq!(k.messages[0].payload, Bytes::from_static(b"payload"));
        assert_eq!(k.messages[0].properties, vec![("k".to_string(), "v".to_string())]);
        assert!(with_key(&blob, "other").unwrap().messages.is_empty());

        // In an uncompressed batch, the matching records, newest first.
        let mut payload = bytes::BytesMut::new();
        for (i, key) in ["a", "b", "a"].iter().enumerate() {
            let r = BatchMessage {
                partition_key: Some(key.to_string()),
                payload: Bytes::from(format!("m{i}")),
                ..Default::default()
            };
            encode_batch_record_into(&r, &mut payload);
        }
        let batch = MessageMetadata { producer_name: "p".into(), num_messages: 3, ..Default::default() };
        let blob = encode_message(&batch, &payload);
        let k = with_key(&blob, "a").unwrap();
        let got: Vec<(i64, &[u8])> = k.messages.iter().map(|m| (m.batch_index, &m.payload[..])).collect();
        assert_eq!(got, vec![(2, &b"m2"[..]), (0, &b"m0"[..])]);

        // A compressed batch is returned whole when its shared key matches.
        let zipped = MessageMetadata {
            producer_name: "p".into(),
            num_messages: 3,
            compression: CompressionType::Lz4,
            partition_key: Some("a".into()),
            ..Default::default()
        };
        let blob = encode_message(&zipped, b"opaque");
        let k = with_key(&blob, "a").unwrap();
        assert_eq!((k.compression, k.messages.len(), k.messages[0].batch_index), (Some(CompressionType::Lz4), 1, -1));
        assert_eq!(with_key(&blob, "b").unwrap().compression, None);
        assert!(with_key(&Bytes::from_static(b"\x01"), "a").is_err());
    }
}
