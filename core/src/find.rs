//! Lookup of messages by key (`magnetar admin messages find`), on the shard
//! that owns the topic: candidates from the storage key index (newest
//! first, by key hash, without scanning the log), each confirmed by reading
//! the entry and comparing its key, since 32-bit hashes collide.
//!
//! What is indexed is the entry's key: a message's key, or a batch's shared
//! key (key-based batching; a batch of mixed keys has none, so its messages
//! are not found by key). Inside an uncompressed batch, the messages with
//! the key are returned one by one; a compressed one is returned whole (the
//! broker never decompresses).

use std::collections::BTreeMap;
use std::rc::Rc;

use magnetar_storage::{key_hash, StorageError};
use magnetar_wire::{ErrorCode, MessageId};

use crate::api::{CompressedBatch, FoundMessage, FoundMessages};
use crate::error::CoreError;
use crate::shard::Shard;
use crate::topic_name::TopicName;

/// Most messages one lookup returns.
pub(crate) const FIND_LIMIT_MAX: u32 = 1000;
/// Most payload bytes one answer carries (the rest of the messages are left
/// out and `truncated` is set), so an answer stays far below the frame limit.
pub(crate) const FIND_PAYLOAD_BYTES_MAX: usize = 4 << 20;
/// Rounds of asking the index for more candidates when hash collisions or
/// deleted entries left fewer confirmed messages than asked for.
const FIND_ROUNDS_MAX: usize = 4;

/// The ledgers holding `topic`'s entries on this shard, if it exists.
pub(crate) fn topic_ledgers(shard: &Shard, topic: &str) -> Option<Vec<u64>> {
    shard.topic_ledger_ids(topic)
}

/// Finds up to `limit` messages of `topic` (one partition or a plain topic)
/// with key `key`, published before `before_ms` if given, newest first.
pub(crate) async fn find_messages(
    shard: &Rc<Shard>,
    topic: &str,
    key: &str,
    before_ms: Option<u64>,
    limit: u32,
) -> Result<FoundMessages, CoreError> {
    let tn = TopicName::parse(topic)?;
    let partition = tn.partition().and_then(|p| i32::try_from(p).ok()).unwrap_or(-1);
    let ledgers = topic_ledgers(shard, topic)
        .ok_or_else(|| CoreError::new(ErrorCode::TopicNotFound, format!("topic {topic} does not exist")))?;
    let limit = limit.min(FIND_LIMIT_MAX) as usize;
    let hash = key_hash(key.as_bytes());
    let mut out: Vec<FoundMessage> = Vec::new();
    let mut payload_bytes = 0usize;
    let mut truncated = false;
    let mut seen = 0usize;
    let mut want = limit * 2 + 16;
    'rounds: for _ in 0..FIND_ROUNDS_MAX {
        let ok = |l: u64| ledgers.contains(&l);
        let hits = shard.log.find_key(hash, &ok, before_ms, want).await?;
        for hit in hits.iter().skip(seen) {
            let blob = match shard.log.read(hit.ledger, hit.entry).await {
                Ok(b) => b,
                // Deleted meanwhile (retention): not an error for a lookup.
                Err(StorageError::NoSuchEntry { .. }) => continue,
                Err(e) => return Err(e.into()),
            };
            let Ok(meta) = crate::entry::with_key(&blob, key) else { continue };
            let compression =
                meta.compression.map(|compression| CompressedBatch { compression, messages: meta.num_messages.max(1) });
            let found = meta.messages.into_iter().map(|m| {
                let id = MessageId::new(hit.ledger, hit.entry, partition, m.batch_index as i32);
                let properties: BTreeMap<String, String> = m.properties.into_iter().collect();
                (id, properties, m.payload)
            });
            for (id, properties, payload) in found {
                if out.len() >= limit {
                    break 'rounds;
                }
                if payload_bytes + payload.len() > FIND_PAYLOAD_BYTES_MAX {
                    truncated = true;
                    break 'rounds;
                }
                payload_bytes += payload.len();
                out.push(FoundMessage {
                    id,
                    key: key.to_string(),
                    properties,
                    publish_time_ms: meta.publish_time_ms,
                    payload,
                    topic: topic.to_string(),
                    compressed: compression,
                });
            }
        }
        if out.len() >= limit || hits.len() < want {
            break;
        }
        seen = hits.len();
        want *= 4;
    }
    Ok(FoundMessages { messages: out, truncated })
}

/// Merges the answers of several partitions: newest first, `limit` in all.
pub(crate) fn merge(answers: Vec<FoundMessages>, limit: u32) -> FoundMessages {
    let mut all: Vec<FoundMessage> = Vec::new();
    let mut truncated = false;
    for a in answers {
        truncated |= a.truncated;
        all.extend(a.messages);
    }
    // Stable: within one partition the order (batch index) is kept.
    all.sort_by_key(|m| std::cmp::Reverse(m.publish_time_ms));
    all.truncate(limit.min(FIND_LIMIT_MAX) as usize);
    FoundMessages { messages: all, truncated }
}
