//! Every record the broker persists in its shard's log besides entries: the
//! key layout of each kind, in one place. This is the seam a replicated
//! store will replace.
//!
//! | key | value |
//! |---|---|
//! | `t/<topic>` | the topic's ledger list (`ledgers.rs`, either version) |
//! | `c/<topic>\n<subscription>` | the cursor (`cursor.rs`) |
//! | `s/<topic>\n<subscription>` | the subscription's state (`sub_state.rs`) |
//! | `d/<topic>` | the dedup snapshot (`dedup.rs`) |
//! | `e/<topic>` | the topic epoch, u64 little-endian (`producers.rs`) |
//! | `x/<ledger>` | a deleted topic's newest ledger, kept reserved |
//! | `m/…` | namespace metadata (`metadata.rs`) |

use crate::topic::ledgers::{decode_topic_record, LedgerInfo, TopicLedgers};
use bytes::Bytes;
use magnetar_storage::{EntryLog, StorageError};
use std::cell::Cell;
use std::collections::HashSet;

/// Ledger ids are unique across shards: `seq * LEDGER_ID_SHARD_STRIDE + shard`.
pub const LEDGER_ID_SHARD_STRIDE: u64 = 1024;

const META_TOPIC_PREFIX: &[u8] = b"t/";
const META_CURSOR_PREFIX: &[u8] = b"c/";
/// `s/<topic>\n<sub>`: a subscription's state beside its cursor (`sub_state.rs`).
const META_SUB_STATE_PREFIX: &[u8] = b"s/";
/// `d/<topic>`: the topic's dedup snapshot (see `dedup.rs`).
const META_DEDUP_PREFIX: &[u8] = b"d/";
/// `e/<topic>`: the topic's epoch (see `topic/producers.rs`).
const META_EPOCH_PREFIX: &[u8] = b"e/";
/// `x/<ledger>`: the ledger of a deleted topic, kept so that its id is never
/// handed out again (the log may still hold its entries).
const META_DELETED_LEDGER_PREFIX: &[u8] = b"x/";

fn topic_meta_key(topic: &str) -> Vec<u8> {
    let mut k = META_TOPIC_PREFIX.to_vec();
    k.extend_from_slice(topic.as_bytes());
    k
}

/// Cursor keys are `c/<topic>\n<subscription>`; names never contain '\n'.
fn cursor_meta_key(topic: &str, sub: &str) -> Vec<u8> {
    sub_meta_key(META_CURSOR_PREFIX, topic, sub)
}

fn sub_meta_key(prefix: &[u8], topic: &str, sub: &str) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(topic.as_bytes());
    k.push(b'\n');
    k.extend_from_slice(sub.as_bytes());
    k
}

fn dedup_meta_key(topic: &str) -> Vec<u8> {
    let mut k = META_DEDUP_PREFIX.to_vec();
    k.extend_from_slice(topic.as_bytes());
    k
}

fn epoch_meta_key(topic: &str) -> Vec<u8> {
    let mut k = META_EPOCH_PREFIX.to_vec();
    k.extend_from_slice(topic.as_bytes());
    k
}

/// Ledgers of the log that no topic record names: a topic deletion writes
/// the empty topic record before deleting the ledgers, so a crash in between
/// leaves these (every ledger is named by its topic's record before its
/// first entry is appended). Nothing when any topic record does not decode
/// (a format this version does not know might name them).
fn orphan_ledgers(log: &EntryLog, in_log: &HashSet<u64>) -> Vec<u64> {
    let mut named = std::collections::HashSet::new();
    for (_, v) in log.meta_prefix(META_TOPIC_PREFIX) {
        match decode_topic_record(&v) {
            Some(list) => named.extend(list.into_iter().map(|l| l.id)),
            None => return Vec::new(),
        }
    }
    let mut out: Vec<u64> = in_log.iter().copied().filter(|l| !named.contains(l)).collect();
    out.sort_unstable();
    out
}

/// Decodes a topic record (`t/<topic>` metadata value, either version):
/// the topic's current ledger id. `None` for a value in an unknown format.
/// Public for offline tools; [`decode_topic_record`] gives every ledger.
pub fn decode_topic_meta(v: &[u8]) -> Option<u64> {
    decode_topic_record(v).and_then(|l| l.last().map(|l| l.id))
}

/// The shard's persisted records, by kind. Cheap to clone (the log is a
/// handle). Owned by one shard; never crosses cores.
#[derive(Clone)]
pub(crate) struct Store {
    log: EntryLog,
}

impl Store {
    pub(crate) fn new(log: EntryLog) -> Self {
        Self { log }
    }

    /// Every ledger id the topic records and the deleted topics' records
    /// name: ids that must never be handed out again.
    pub(crate) fn recorded_ledger_ids(&self) -> Vec<u64> {
        let deleted = self.log.meta_prefix(META_DELETED_LEDGER_PREFIX);
        let mut ids = Vec::new();
        for (_, v) in self.log.meta_prefix(META_TOPIC_PREFIX).into_iter().chain(deleted) {
            ids.extend(decode_topic_record(&v).unwrap_or_default().into_iter().map(|l| l.id));
        }
        ids
    }

    /// See [`orphan_ledgers`].
    pub(crate) fn orphan_ledgers(&self, in_log: &HashSet<u64>) -> Vec<u64> {
        orphan_ledgers(&self.log, in_log)
    }

    /// The topic's ledger list, `None` when it has no (readable) record.
    pub(crate) fn topic_record(&self, topic: &str) -> Option<Vec<LedgerInfo>> {
        self.log.meta(&topic_meta_key(topic)).as_deref().and_then(decode_topic_record)
    }

    /// Whether the topic has a record (of any version).
    pub(crate) fn topic_recorded(&self, topic: &str) -> bool {
        self.log.meta(&topic_meta_key(topic)).is_some()
    }

    pub(crate) fn put_topic_record(&self, topic: &str, ledgers: &TopicLedgers) -> Result<u64, StorageError> {
        self.log.put_meta(&topic_meta_key(topic), Bytes::from(ledgers.encode()))
    }

    /// Full names of the recorded topics starting with `prefix`, sorted.
    /// At most `limit` names of this shard's topics that start with
    /// `prefix` and sort after `after`, sorted.
    pub(crate) fn topic_names(&self, prefix: &str, after: Option<&str>, limit: usize) -> Vec<String> {
        let key = |name: &str| {
            let mut key = META_TOPIC_PREFIX.to_vec();
            key.extend_from_slice(name.as_bytes());
            key
        };
        let after = after.map(key);
        self.log
            .meta_keys_page(&key(prefix), after.as_deref(), limit)
            .into_iter()
            .filter_map(|k| String::from_utf8(k.get(META_TOPIC_PREFIX.len()..)?.to_vec()).ok())
            .collect()
    }

    /// The topic's durable subscriptions: `(name, cursor record)`, sorted by name.
    pub(crate) fn cursors(&self, topic: &str) -> Vec<(String, Bytes)> {
        let prefix = sub_meta_key(META_CURSOR_PREFIX, topic, "");
        self.log
            .meta_prefix(&prefix)
            .into_iter()
            .filter_map(|(k, v)| Some((std::str::from_utf8(&k[prefix.len()..]).ok()?.to_string(), v)))
            .collect()
    }

    pub(crate) fn put_cursor(&self, topic: &str, sub: &str, record: Bytes) -> Result<u64, StorageError> {
        self.log.put_meta(&cursor_meta_key(topic, sub), record)
    }

    /// The subscription's state record; `None` without one (older data).
    pub(crate) fn sub_state(&self, topic: &str, sub: &str) -> Option<Bytes> {
        self.log.meta(&sub_meta_key(META_SUB_STATE_PREFIX, topic, sub)).filter(|v| !v.is_empty())
    }

    pub(crate) fn put_sub_state(&self, topic: &str, sub: &str, record: Bytes) -> Result<u64, StorageError> {
        self.log.put_meta(&sub_meta_key(META_SUB_STATE_PREFIX, topic, sub), record)
    }

    /// Erases a deleted subscription's cursor and state records; returns
    /// the log position of the last erasure. The state record goes first:
    /// a crash in between leaves a cursor without state, which loads as a
    /// subscription of older data, never state without a cursor.
    pub(crate) fn delete_subscription(&self, topic: &str, sub: &str) -> Result<u64, StorageError> {
        let state = sub_meta_key(META_SUB_STATE_PREFIX, topic, sub);
        if self.log.meta(&state).is_some() {
            self.log.put_meta(&state, Bytes::new())?;
        }
        self.log.put_meta(&cursor_meta_key(topic, sub), Bytes::new())
    }

    pub(crate) fn dedup_snapshot(&self, topic: &str) -> Option<Bytes> {
        self.log.meta(&dedup_meta_key(topic))
    }

    /// The topic's epoch; `None` without one (or an unreadable record,
    /// which only the next exclusive producer's epoch replaces).
    pub(crate) fn topic_epoch(&self, topic: &str) -> Option<u64> {
        let v = self.log.meta(&epoch_meta_key(topic))?;
        Some(u64::from_le_bytes(v.as_ref().try_into().ok()?))
    }

    pub(crate) fn put_topic_epoch(&self, topic: &str, epoch: u64) -> Result<u64, StorageError> {
        self.log.put_meta(&epoch_meta_key(topic), Bytes::copy_from_slice(&epoch.to_le_bytes()))
    }

    pub(crate) fn put_dedup_snapshot(&self, topic: &str, snapshot: Bytes) -> Result<u64, StorageError> {
        self.log.put_meta(&dedup_meta_key(topic), snapshot)
    }

    /// Erases every record of a deleted topic, keeping `newest_ledger`
    /// reserved (an `x/` record holding a version 1 topic record) so that
    /// the allocator never hands it, or an older id, out again. The topic
    /// record goes last; returns its log position.
    pub(crate) fn delete_topic_records(&self, topic: &str, newest_ledger: u64) -> Result<u64, StorageError> {
        let mut tomb = META_DELETED_LEDGER_PREFIX.to_vec();
        tomb.extend_from_slice(&newest_ledger.to_le_bytes());
        let mut v1 = vec![crate::topic::ledgers::TOPIC_RECORD_V1];
        v1.extend_from_slice(&newest_ledger.to_le_bytes());
        self.log.put_meta(&tomb, Bytes::from(v1))?;
        for (k, _) in self.log.meta_prefix(&sub_meta_key(META_CURSOR_PREFIX, topic, "")) {
            self.log.put_meta(&k, Bytes::new())?;
        }
        for (k, v) in self.log.meta_prefix(&sub_meta_key(META_SUB_STATE_PREFIX, topic, "")) {
            if !v.is_empty() {
                self.log.put_meta(&k, Bytes::new())?;
            }
        }
        if self.log.meta(&dedup_meta_key(topic)).is_some() {
            self.log.put_meta(&dedup_meta_key(topic), Bytes::new())?;
        }
        if self.log.meta(&epoch_meta_key(topic)).is_some() {
            self.log.put_meta(&epoch_meta_key(topic), Bytes::new())?;
        }
        self.log.put_meta(&topic_meta_key(topic), Bytes::new())
    }
}

/// The ledger ids of one shard: unique across shards, and each larger than
/// every id the shard used before, in this run or an earlier one (a reused
/// id would mix a deleted topic's entries into a new one). Owned by one
/// shard; never crosses cores.
pub(crate) struct LedgerIds {
    shard: u32,
    next_seq: Cell<u64>,
    /// Ledgers the log held when the shard started (deleted ones excluded):
    /// a closed ledger of a topic record missing here was deleted by
    /// retention before the record was rewritten (a crash in between).
    at_start: HashSet<u64>,
}

impl LedgerIds {
    /// Ids already used come from the topic records (every ledger they
    /// list), the deleted topics' records and the log.
    pub(crate) fn new(shard: u32, store: &Store) -> Self {
        let at_start: HashSet<u64> = store.log.ledgers().into_iter().map(|(l, _)| l).collect();
        let seq = store
            .recorded_ledger_ids()
            .into_iter()
            .chain(at_start.iter().copied())
            .map(|l| l / LEDGER_ID_SHARD_STRIDE + 1)
            .max()
            .unwrap_or(0);
        Self { shard, next_seq: Cell::new(seq), at_start }
    }

    pub(crate) fn shard(&self) -> u32 {
        self.shard
    }

    /// A new ledger id.
    pub(crate) fn allocate(&self) -> u64 {
        let seq = self.next_seq.get();
        self.next_seq.set(seq + 1);
        seq * LEDGER_ID_SHARD_STRIDE + u64::from(self.shard)
    }

    /// Whether the log held ledger `id` when the shard started.
    pub(crate) fn existed_at_start(&self, id: u64) -> bool {
        self.at_start.contains(&id)
    }

    /// Every ledger the log held when the shard started.
    pub(crate) fn at_start(&self) -> &HashSet<u64> {
        &self.at_start
    }
}
