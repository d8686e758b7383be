//! Chunking: a message whose (compressed) payload is above the producer's
//! chunk size is sent as several entries ("chunks") that share one sequence
//! id and carry `ChunkInfo {uuid, chunk_id, num_chunks, total_chunk_msg_size}`
//! in their metadata; the broker stores each as an ordinary entry (and
//! dedups them as one message). The consumer collects the chunks of a uuid
//! in order, concatenates them, decompresses, and hands out one message
//! whose id is the last chunk's; acknowledging it acknowledges every chunk.
//! Incomplete messages expire after a timeout (their chunks are then
//! acknowledged and dropped, as in Pulsar), and at most a bounded number are
//! kept at once (the oldest is dropped the same way).

use crate::error::Result;
use crate::message::Message;
use bytes::{Bytes, BytesMut};
use magnetar_wire::MessageId;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Incomplete chunked messages kept per consumer.
pub const INCOMPLETE_CHUNKED_MAX: usize = 100;
/// An incomplete chunked message is dropped after this long.
pub const CHUNK_EXPIRY: Duration = Duration::from_secs(60);
/// Largest reassembled payload accepted (bounds memory per message).
pub const CHUNKED_MESSAGE_BYTES_MAX: u32 = 512 * 1024 * 1024;

struct Group {
    first_at: Instant,
    num_chunks: u32,
    parts: Vec<Bytes>,
    ids: Vec<MessageId>,
}

/// What feeding one chunk gave.
pub(crate) enum Fed {
    /// The whole message, and the ids of all its chunks (last one included).
    Complete(Box<Message>, Vec<MessageId>),
    /// More chunks to come.
    Pending,
}

/// Reassembly state of one consumer.
pub(crate) struct Reassembly {
    groups: HashMap<String, Group>,
    expiry: Duration,
}

impl Default for Reassembly {
    fn default() -> Self {
        Self { groups: HashMap::new(), expiry: CHUNK_EXPIRY }
    }
}

impl Reassembly {
    /// Drops expired groups (and, beyond the bound, the oldest); returns the
    /// chunk ids to acknowledge.
    pub(crate) fn expire(&mut self) -> Vec<MessageId> {
        let mut dropped = Vec::new();
        let expiry = self.expiry;
        self.groups.retain(|uuid, g| {
            let keep = g.first_at.elapsed() < expiry;
            if !keep {
                tracing::warn!(uuid, chunks = g.ids.len(), of = g.num_chunks, "incomplete chunked message expired");
                dropped.extend(g.ids.iter().copied());
            }
            keep
        });
        while self.groups.len() > INCOMPLETE_CHUNKED_MAX {
            let Some(oldest) = self.groups.iter().min_by_key(|(_, g)| g.first_at).map(|(k, _)| k.clone()) else {
                break;
            };
            if let Some(g) = self.groups.remove(&oldest) {
                tracing::warn!(uuid = oldest, "too many incomplete chunked messages: dropped the oldest");
                dropped.extend(g.ids);
            }
        }
        dropped
    }

    /// Feeds one chunk (a message whose metadata has `chunk`). A chunk out
    /// of order restarts nothing: the group is dropped and its ids returned
    /// in `Err`-free form through `expire`-like acknowledgement by the caller.
    pub(crate) fn feed(&mut self, msg: Message, stray: &mut Vec<MessageId>) -> Result<Fed> {
        let Some(info) = msg.entry.metadata().chunk.clone() else {
            let id = msg.id;
            return Ok(Fed::Complete(Box::new(msg), vec![id]));
        };
        if info.num_chunks == 0
            || info.chunk_id >= info.num_chunks
            || info.total_chunk_msg_size > CHUNKED_MESSAGE_BYTES_MAX
        {
            tracing::warn!(uuid = info.uuid, "chunk with inconsistent chunk info dropped");
            stray.push(msg.id);
            return Ok(Fed::Pending);
        }
        let group = self.groups.entry(info.uuid.clone()).or_insert_with(|| Group {
            first_at: Instant::now(),
            num_chunks: info.num_chunks,
            parts: Vec::new(),
            ids: Vec::new(),
        });
        let expected = u32::try_from(group.parts.len()).unwrap_or(u32::MAX);
        if info.chunk_id < expected {
            // A redelivered chunk we already hold.
            return Ok(Fed::Pending);
        }
        if info.chunk_id != expected || info.num_chunks != group.num_chunks {
            tracing::warn!(uuid = info.uuid, got = info.chunk_id, expected, "chunk out of order: message dropped");
            if let Some(g) = self.groups.remove(&info.uuid) {
                stray.extend(g.ids);
            }
            stray.push(msg.id);
            return Ok(Fed::Pending);
        }
        group.parts.push(msg.payload.clone());
        group.ids.push(msg.id);
        if group.parts.len() < group.num_chunks as usize {
            return Ok(Fed::Pending);
        }
        let Some(group) = self.groups.remove(&info.uuid) else { return Ok(Fed::Pending) };
        let total: usize = group.parts.iter().map(Bytes::len).sum();
        let mut joined = BytesMut::with_capacity(total);
        for p in &group.parts {
            joined.extend_from_slice(p);
        }
        let mut metadata = msg.entry.metadata().clone();
        let payload =
            crate::compression::decompress(metadata.compression, &joined.freeze(), metadata.uncompressed_size)?;
        metadata.compression = magnetar_wire::CompressionType::None;
        metadata.chunk = None;
        let whole = Message::of_entry(msg.id, msg.topic.clone(), Arc::new(metadata), payload, msg.redelivery_count);
        Ok(Fed::Complete(Box::new(whole), group.ids))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_wire::{ChunkInfo, MessageMetadata};

    fn chunk(uuid: &str, id: u32, of: u32, entry: u64, payload: &'static [u8]) -> Message {
        Message::new(
            MessageId::new(1, entry, -1, -1),
            "t",
            MessageMetadata {
                chunk: Some(ChunkInfo { uuid: uuid.into(), chunk_id: id, num_chunks: of, total_chunk_msg_size: 4 }),
                uncompressed_size: 4,
                ..MessageMetadata::default()
            },
            Bytes::from_static(payload),
        )
    }

    #[test]
    fn reassembles_in_order_and_drops_what_cannot_complete() {
        let mut r = Reassembly::default();
        let mut stray = Vec::new();
        assert!(matches!(r.feed(chunk("a", 0, 2, 1, b"ab"), &mut stray).unwrap(), Fed::Pending));
        assert!(matches!(r.feed(chunk("a", 0, 2, 1, b"ab"), &mut stray).unwrap(), Fed::Pending), "redelivery");
        match r.feed(chunk("a", 1, 2, 2, b"cd"), &mut stray).unwrap() {
            Fed::Complete(m, ids) => {
                assert_eq!(&m.payload[..], b"abcd");
                assert_eq!(m.id, MessageId::new(1, 2, -1, -1));
                assert_eq!(ids.len(), 2);
                assert!(m.entry.metadata().chunk.is_none());
            }
            Fed::Pending => panic!("incomplete"),
        }
        // Out of order: the group is dropped, its chunks to be acked.
        assert!(matches!(r.feed(chunk("b", 0, 3, 3, b"ab"), &mut stray).unwrap(), Fed::Pending));
        assert!(matches!(r.feed(chunk("b", 2, 3, 5, b"cd"), &mut stray).unwrap(), Fed::Pending));
        assert_eq!(stray.len(), 2);
        // Expiry.
        r.expiry = Duration::ZERO;
        assert!(matches!(r.feed(chunk("c", 0, 2, 6, b"ab"), &mut stray).unwrap(), Fed::Pending));
        assert_eq!(r.expire(), vec![MessageId::new(1, 6, -1, -1)]);
    }
}
