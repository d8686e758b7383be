//! Messages crossing doors: a blob stored by one door, delivered through
//! the other, is converted field for field (payload bytes, keys,
//! properties, times, producer name, sequence ids; a batch stays a batch
//! of the same messages). A compressed batch's records are inside the
//! compressed bytes: it is decompressed, converted and compressed again
//! with the same codec (the only place the broker decompresses; a single
//! message's compressed payload is passed on as it is).

use bytes::{BufMut, Bytes, BytesMut};
use magnetar_pulsar_wire::proto as pb;
use magnetar_wire::{BatchMessage, ChunkInfo, CompressionType, MessageMetadata};
use prost::Message;

fn codec_to_pulsar(c: CompressionType) -> pb::CompressionType {
    match c {
        CompressionType::None => pb::CompressionType::None,
        CompressionType::Lz4 => pb::CompressionType::Lz4,
        CompressionType::Zlib => pb::CompressionType::Zlib,
        CompressionType::Zstd => pb::CompressionType::Zstd,
        CompressionType::Snappy => pb::CompressionType::Snappy,
    }
}

fn codec_to_native(c: i32) -> Result<CompressionType, String> {
    Ok(match pb::CompressionType::try_from(c).map_err(|_| format!("unknown compression {c}"))? {
        pb::CompressionType::None => CompressionType::None,
        pb::CompressionType::Lz4 => CompressionType::Lz4,
        pb::CompressionType::Zlib => CompressionType::Zlib,
        pb::CompressionType::Zstd => CompressionType::Zstd,
        pb::CompressionType::Snappy => CompressionType::Snappy,
    })
}

/// Largest uncompressed batch converted between doors: bounds the memory
/// and time one delivery takes on a shard. Clients' batches are far smaller
/// (the native and Pulsar clients close a batch at 128 KiB by default).
pub(crate) const CROSS_DOOR_BATCH_BYTES_MAX: u32 = 16 * 1024 * 1024;

/// A compressed batch payload, decompressed for conversion.
fn decompress_batch(codec: CompressionType, payload: &Bytes, uncompressed_size: u32) -> Result<Bytes, String> {
    if codec == CompressionType::None {
        return Ok(payload.clone());
    }
    if uncompressed_size > CROSS_DOOR_BATCH_BYTES_MAX {
        return Err(format!(
            "a compressed batch of {uncompressed_size} bytes uncompressed is over the {CROSS_DOOR_BATCH_BYTES_MAX} \
             converted between doors"
        ));
    }
    magnetar_wire::decompress(codec, payload, uncompressed_size).map_err(|e| e.to_string())
}

/// A converted batch payload compressed again with its codec: the payload
/// and its uncompressed size.
fn recompress(codec: CompressionType, data: &[u8]) -> Result<(Bytes, u32), String> {
    let size = u32::try_from(data.len()).map_err(|_| "converted batch too large")?;
    Ok((magnetar_wire::compress(codec, data).map_err(|e| e.to_string())?, size))
}

fn kv(props: &[(String, String)]) -> Vec<pb::KeyValue> {
    props.iter().map(|(k, v)| pb::KeyValue { key: k.clone(), value: v.clone() }).collect()
}

fn pairs(props: Vec<pb::KeyValue>) -> Vec<(String, String)> {
    props.into_iter().map(|p| (p.key, p.value)).collect()
}

/// A native blob as Pulsar's `(MessageMetadata, payload)`.
pub(crate) fn native_to_pulsar(blob: &[u8]) -> Result<(Vec<u8>, Bytes), String> {
    let blob = Bytes::copy_from_slice(blob);
    let (meta, payload) = magnetar_wire::decode_message(&blob).map_err(|e| e.to_string())?;
    let batched = meta.num_messages > 1 && meta.chunk.is_none();
    let mut m = pb::MessageMetadata {
        producer_name: meta.producer_name,
        sequence_id: meta.sequence_id,
        publish_time: meta.publish_time_ms,
        properties: kv(&meta.properties),
        partition_key: meta.partition_key,
        ordering_key: meta.ordering_key.map(|k| k.to_vec()),
        event_time: (meta.event_time_ms != 0).then_some(meta.event_time_ms),
        deliver_at_time: (meta.deliver_at_ms != 0).then_some(meta.deliver_at_ms as i64),
        ..Default::default()
    };
    if meta.compression != CompressionType::None {
        m.compression = Some(codec_to_pulsar(meta.compression) as i32);
        m.uncompressed_size = Some(meta.uncompressed_size);
    }
    if let Some(c) = meta.chunk {
        m.uuid = Some(c.uuid);
        m.chunk_id = Some(c.chunk_id as i32);
        m.num_chunks_from_msg = Some(c.num_chunks as i32);
        m.total_chunk_msg_size = Some(c.total_chunk_msg_size as i32);
    }
    if !batched {
        return Ok((m.encode_to_vec(), payload));
    }
    let codec = meta.compression;
    let payload = decompress_batch(codec, &payload, meta.uncompressed_size)?;
    let records = magnetar_wire::decode_batch(&payload, meta.num_messages).map_err(|e| e.to_string())?;
    let mut out = BytesMut::new();
    for r in &records {
        let single = pb::SingleMessageMetadata {
            properties: kv(&r.properties),
            partition_key: r.partition_key.clone(),
            payload_size: r.payload.len() as i32,
            event_time: (r.event_time_ms != 0).then_some(r.event_time_ms),
            ordering_key: r.ordering_key.as_ref().map(|k| k.to_vec()),
            sequence_id: Some(r.sequence_id),
            ..Default::default()
        };
        out.put_u32(single.encoded_len() as u32);
        single.encode(&mut out).map_err(|e| e.to_string())?;
        out.extend_from_slice(&r.payload);
    }
    m.num_messages_in_batch = Some(records.len() as i32);
    m.highest_sequence_id = records.last().map(|r| r.sequence_id);
    if codec == CompressionType::None {
        return Ok((m.encode_to_vec(), out.freeze()));
    }
    let (payload, size) = recompress(codec, &out)?;
    m.uncompressed_size = Some(size);
    Ok((m.encode_to_vec(), payload))
}

/// A stored Pulsar blob as a native blob.
pub(crate) fn pulsar_to_native(blob: &[u8]) -> Result<Bytes, String> {
    let (_, metadata, payload) = magnetar_pulsar_wire::metadata::split_stored(blob).map_err(|e| e.to_string())?;
    let m = pb::MessageMetadata::decode(metadata).map_err(|e| e.to_string())?;
    let compression = codec_to_native(m.compression.unwrap_or(0))?;
    let chunk = match (m.chunk_id, m.num_chunks_from_msg) {
        (Some(id), Some(n)) if n > 1 => Some(ChunkInfo {
            uuid: m.uuid.clone().unwrap_or_default(),
            chunk_id: id.max(0) as u32,
            num_chunks: n as u32,
            total_chunk_msg_size: m.total_chunk_msg_size.unwrap_or(0).max(0) as u32,
        }),
        _ => None,
    };
    let mut meta = MessageMetadata {
        producer_name: m.producer_name,
        sequence_id: m.sequence_id,
        publish_time_ms: m.publish_time,
        event_time_ms: m.event_time.unwrap_or(0),
        partition_key: m.partition_key,
        ordering_key: m.ordering_key.map(Bytes::from),
        properties: pairs(m.properties),
        num_messages: 0,
        deliver_at_ms: m.deliver_at_time.unwrap_or(0).max(0) as u64,
        compression,
        uncompressed_size: m.uncompressed_size.unwrap_or(0),
        chunk,
        tag: None,
    };
    let Some(n) = m.num_messages_in_batch else {
        return Ok(magnetar_wire::encode_message(&meta, payload));
    };
    let payload = decompress_batch(compression, &Bytes::copy_from_slice(payload), meta.uncompressed_size)?;
    let n = u32::try_from(n).unwrap_or(0).min(magnetar_wire::BATCH_MESSAGES_MAX);
    let records = magnetar_pulsar_wire::metadata::batch_records(&payload, n).map_err(|e| e.to_string())?;
    let owned = |kv: &[(&str, &str)]| kv.iter().map(|&(k, v)| (k.to_string(), v.to_string())).collect();
    // The converted payload, compressed again as it came.
    let encode = |mut meta: MessageMetadata, data: &[u8]| -> Result<Bytes, String> {
        if compression == CompressionType::None {
            return Ok(magnetar_wire::encode_message(&meta, data));
        }
        let (payload, size) = recompress(compression, data)?;
        meta.uncompressed_size = size;
        Ok(magnetar_wire::encode_message(&meta, &payload))
    };
    if let [single] = &records[..] {
        // A batch of one is a single message to a native consumer.
        meta.properties = owned(&single.properties);
        meta.partition_key = single.partition_key.map(str::to_string);
        meta.ordering_key = single.ordering_key.map(|k| payload.slice_ref(k));
        if let Some(t) = single.event_time_ms {
            meta.event_time_ms = t;
        }
        meta.num_messages = 1;
        return encode(meta, single.payload);
    }
    let mut out = BytesMut::new();
    for record in &records {
        let r = BatchMessage {
            properties: owned(&record.properties),
            partition_key: record.partition_key.map(str::to_string),
            ordering_key: record.ordering_key.map(|k| payload.slice_ref(k)),
            event_time_ms: record.event_time_ms.unwrap_or(0),
            sequence_id: record.sequence_id.unwrap_or(0),
            payload: payload.slice_ref(record.payload),
        };
        magnetar_wire::encode_batch_record_into(&r, &mut out);
    }
    meta.num_messages = records.len() as u32;
    encode(meta, &out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a native batch converts to a Pulsar batch and back with every
    /// message's payload, key, ordering key, properties, event time and sequence id,
    /// uncompressed and compressed with each codec (compressed again with
    /// the same codec, its uncompressed size recomputed).
    #[test]
    fn batches_cross_both_ways() {
        let mut payload = BytesMut::new();
        for i in 0..3u64 {
            let r = BatchMessage {
                properties: vec![("k".into(), format!("v{i}"))],
                partition_key: Some(format!("key-{i}")),
                ordering_key: (i == 1).then(|| Bytes::from_static(b"ord")),
                event_time_ms: 100 + i,
                sequence_id: 10 + i,
                payload: Bytes::from(vec![i as u8; 500]),
            };
            magnetar_wire::encode_batch_record_into(&r, &mut payload);
        }
        let payload = payload.freeze();
        for codec in [
            CompressionType::None,
            CompressionType::Lz4,
            CompressionType::Zlib,
            CompressionType::Zstd,
            CompressionType::Snappy,
        ] {
            let meta = MessageMetadata {
                producer_name: "p".into(),
                sequence_id: 10,
                publish_time_ms: 7,
                num_messages: 3,
                compression: codec,
                uncompressed_size: if codec == CompressionType::None { 0 } else { payload.len() as u32 },
                ..Default::default()
            };
            let native = magnetar_wire::encode_message(&meta, &magnetar_wire::compress(codec, &payload).unwrap());
            let (pm, pp) = native_to_pulsar(&native).unwrap();
            let decoded = pb::MessageMetadata::decode(&pm[..]).unwrap();
            assert_eq!(decoded.compression.unwrap_or(0), codec_to_pulsar(codec) as i32, "{codec:?}");
            if codec != CompressionType::None {
                let size = decoded.uncompressed_size.unwrap();
                let plain = magnetar_wire::decompress(codec, &pp, size).unwrap();
                assert_eq!(magnetar_pulsar_wire::metadata::batch_records(&plain, 3).unwrap().len(), 3, "{codec:?}");
            }
            let stored = magnetar_pulsar_wire::metadata::stored_blob_from_parts(&pm, &pp);
            let back = pulsar_to_native(&stored).unwrap();
            let (m2, p2) = magnetar_wire::decode_message(&back).unwrap();
            assert_eq!(
                (m2.producer_name.as_str(), m2.sequence_id, m2.publish_time_ms, m2.num_messages, m2.compression),
                ("p", 10, 7, 3, codec)
            );
            let p2 = magnetar_wire::decompress(codec, &p2, m2.uncompressed_size).unwrap();
            let a = magnetar_wire::decode_batch(&payload, 3).unwrap();
            let b = magnetar_wire::decode_batch(&p2, 3).unwrap();
            assert_eq!(a, b, "{codec:?}");
        }
    }

    /// Goal: a compressed batch that says it decompresses to more than the
    /// door converts, or does not decompress as it says, is refused (not
    /// delivered, no panic).
    #[test]
    fn bad_compressed_batches_are_refused() {
        let meta = MessageMetadata {
            num_messages: 2,
            compression: CompressionType::Lz4,
            uncompressed_size: CROSS_DOOR_BATCH_BYTES_MAX + 1,
            ..Default::default()
        };
        let err = native_to_pulsar(&magnetar_wire::encode_message(&meta, b"xx")).unwrap_err();
        assert!(err.contains("over the"), "{err}");
        let meta = MessageMetadata { uncompressed_size: 1000, ..meta };
        assert!(native_to_pulsar(&magnetar_wire::encode_message(&meta, b"garbage")).is_err());
    }
}
