//! Unpacking an entry as the broker sent it into the messages the
//! application receives: decompression, and the split of a batch into its
//! messages. Done by the consumer as it takes an entry off its queue (see
//! `inbox`), not by the connection's reader. Payloads stay slices of the
//! frame they came in (`Bytes`): no copy.

use crate::error::Result;
use crate::message::Message;
use bytes::Bytes;
use magnetar_wire::MessageId;
use std::sync::Arc;

/// What one entry holds: a message, or a batch's messages in order.
pub(super) enum Unpacked {
    One(Message),
    Batch(Vec<Message>),
}

/// The flow permits the broker charged for an entry it delivered: the
/// messages its metadata claims (1 for a blob whose metadata does not
/// read), less those of a redelivered batch acknowledged before. The
/// broker counts them so, whether or not the batch can be split; a
/// consumer that counts an entry it cannot unpack as one message would
/// leave the broker without permits for good once the entry claims more
/// than the queue (issue #17: a batch claiming 2^20 messages stalled it).
pub(super) fn charged_permits(blob: &[u8], ack_set: &[u64]) -> u32 {
    let claimed = magnetar_wire::view_message(blob).map_or(1, |v| v.num_messages.max(1));
    let acked: u32 = ack_set.iter().map(|w| w.count_ones()).sum();
    claimed.saturating_sub(acked).max(1)
}

/// Decodes one entry into its messages, in order: decompresses the payload when the producer compressed it, and
/// splits a batch (`num_messages` > 1) into its messages, numbered by
/// `batch_index`. The messages of a batch share one `Arc` of the entry's
/// metadata (`num_messages` is the batch size the consumer's ack tracker
/// needs) and carry their own key, properties, event time and sequence id. Messages whose bit is
/// set in `ack_set` (a batch redelivered after some of its messages were
/// acknowledged) are left out.
pub(super) fn unpack_entry(
    blob: Bytes,
    id: MessageId,
    topic: &Arc<str>,
    redelivery_count: u32,
    ack_set: Vec<u64>,
) -> Result<Unpacked> {
    // Checked whole here (a bad blob is this message's error), read
    // without allocating.
    let view = magnetar_wire::view_message(&blob)?;
    let payload = blob.slice(view.payload_offset..);
    if view.chunk.is_some() {
        // A chunk: decompressed once the whole message is reassembled.
        let metadata = Arc::new(view.to_metadata(&blob));
        return Ok(Unpacked::One(Message::of_entry(id, topic.clone(), metadata, payload, redelivery_count)));
    }
    let payload = match view.compression {
        magnetar_wire::CompressionType::None => payload,
        codec => crate::compression::decompress(codec, &payload, view.uncompressed_size)?,
    };
    if view.num_messages <= 1 {
        return Ok(Unpacked::One(Message::of_blob(id, topic.clone(), blob, payload, redelivery_count)));
    }
    let mut metadata = view.to_metadata(&blob);
    metadata.compression = magnetar_wire::CompressionType::None;
    let records = magnetar_wire::decode_batch(&payload, metadata.num_messages)?;
    // One metadata for the entry, shared by its messages (the per-message
    // fields are each message's own); its payload size is the batch's.
    let entry = Arc::new(metadata);
    let acked = |i: usize| ack_set.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0);
    let mut messages = Vec::with_capacity(records.len());
    for (i, r) in records.into_iter().enumerate() {
        if acked(i) {
            continue;
        }
        let fields = (r.partition_key.is_some() || r.ordering_key.is_some() || !r.properties.is_empty()).then(|| {
            Box::new(crate::message::RecordFields {
                partition_key: r.partition_key,
                ordering_key: r.ordering_key,
                properties: r.properties,
            })
        });
        messages.push(Message {
            id: MessageId { batch_index: i32::try_from(i).unwrap_or(i32::MAX), ..id },
            topic: topic.clone(),
            payload: r.payload,
            redelivery_count,
            ack_set: ack_set.clone(),
            entry: crate::message::Entry::Batched(
                entry.clone(),
                crate::message::Record { fields, sequence_id: r.sequence_id, event_time_ms: r.event_time_ms },
            ),
        });
    }
    Ok(Unpacked::Batch(messages))
}

#[cfg(test)]
mod tests {
    // Test code: unwrap on our own encoder's output is the assertion.
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::error::ClientError;
    use bytes::BytesMut;
    use magnetar_wire::{encode_message, CompressionType, MessageMetadata};

    fn one(blob: Bytes) -> Result<Message> {
        let topic: Arc<str> = "persistent://public/default/t".into();
        match unpack_entry(blob, MessageId::new(3, 7, -1, -1), &topic, 2, Vec::new())? {
            Unpacked::One(m) => Ok(m),
            Unpacked::Batch(_) => panic!("a whole entry unpacked as a batch"),
        }
    }

    /// Goal: a whole entry, kept as its blob and read lazily, answers every
    /// accessor as the decoded metadata does (compression reads as `None`
    /// once the payload is decompressed).
    #[test]
    fn a_blob_message_reads_as_its_decoded_metadata() {
        let bare = MessageMetadata { producer_name: "p".into(), sequence_id: 5, ..MessageMetadata::default() };
        let full = MessageMetadata {
            producer_name: "producer-1".into(),
            sequence_id: 42,
            publish_time_ms: 1_700_000_000_123,
            event_time_ms: 99,
            partition_key: Some("key".into()),
            ordering_key: Some(Bytes::from_static(b"ok")),
            properties: vec![("a".into(), "1".into()), ("b".into(), "2".into()), ("a".into(), "3".into())],
            num_messages: 1,
            deliver_at_ms: 1_800_000_000_000,
            tag: Some("tag".into()),
            ..MessageMetadata::default()
        };
        let body = b"the payload, the payload, the payload".as_slice();
        let lz4 = crate::compression::compress(CompressionType::Lz4, body).unwrap();
        let compressed = MessageMetadata {
            compression: CompressionType::Lz4,
            uncompressed_size: u32::try_from(body.len()).unwrap(),
            ..full.clone()
        };
        // Metadata too large to read again per accessor: decoded on first use.
        let big = MessageMetadata {
            properties: (0..20).map(|i| (format!("name-{i:02}"), format!("a value long enough {i}"))).collect(),
            ..full.clone()
        };
        for (meta, payload) in [(bare, body), (full, body), (compressed, &lz4[..]), (big, body)] {
            let m = one(encode_message(&meta, payload)).unwrap();
            let want_meta = MessageMetadata { compression: CompressionType::None, ..meta };
            let want = Message {
                redelivery_count: 2,
                ..Message::new(m.id, m.topic.clone(), want_meta.clone(), Bytes::from_static(body))
            };
            assert!(matches!(m.entry, crate::message::Entry::Blob(..)));
            assert_eq!(m.payload, body);
            // Before and after the metadata is decoded.
            for _ in 0..2 {
                assert_eq!(m.key(), want.key());
                assert_eq!(m.ordering_key(), want.ordering_key());
                assert_eq!(m.properties(), want.properties());
                for name in ["a", "b", "c", "name-07"] {
                    assert_eq!(m.property(name), want.property(name), "{name}");
                }
                assert_eq!(m.publish_time_ms(), want.publish_time_ms());
                assert_eq!(m.event_time_ms(), want.event_time_ms());
                assert_eq!(m.producer_name(), want.producer_name());
                assert_eq!(m.sequence_id(), want.sequence_id());
                assert_eq!(m.tag(), want.tag());
                assert_eq!(m.deliver_at_ms(), want.deliver_at_ms());
                assert_eq!(m.batch_size(), want.batch_size());
                assert_eq!(m.redelivery_count(), 2);
                assert_eq!(m.entry_metadata(), &want_meta);
            }
            assert_eq!(m, want);
            assert_eq!(m.clone(), m);
        }
    }

    /// Goal: a bad blob is that message's error, never a panic.
    #[test]
    fn a_bad_blob_is_an_error() {
        let blob = encode_message(&MessageMetadata { producer_name: "p".into(), ..Default::default() }, b"x");
        for cut in 0..blob.len() - 1 {
            assert!(matches!(one(blob.slice(..cut)), Err(ClientError::Wire(_))), "cut at {cut}");
        }
        let mut bad = BytesMut::from(&blob[..]);
        // The root offset, pointing past the metadata.
        bad[4] = 0xff;
        assert!(matches!(one(bad.freeze()), Err(ClientError::Wire(_))));
    }
}
