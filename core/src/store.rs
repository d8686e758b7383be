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
//! | `x/<ledger>` | a deleted topic's newest ledger, kept reserved |
//! | `m/…` | namespace metadata (`metadata.rs`) |

use crate::topic::ledgers::decode_topic_record;
use magnetar_storage::EntryLog;

pub(crate) const META_TOPIC_PREFIX: &[u8] = b"t/";
pub(crate) const META_CURSOR_PREFIX: &[u8] = b"c/";
/// `s/<topic>\n<sub>`: a subscription's state beside its cursor (`sub_state.rs`).
pub(crate) const META_SUB_STATE_PREFIX: &[u8] = b"s/";
/// `d/<topic>`: the topic's dedup snapshot (see `dedup.rs`).
pub(crate) const META_DEDUP_PREFIX: &[u8] = b"d/";
/// `x/<ledger>`: the ledger of a deleted topic, kept so that its id is never
/// handed out again (the log may still hold its entries).
pub(crate) const META_DELETED_LEDGER_PREFIX: &[u8] = b"x/";

pub(crate) fn topic_meta_key(topic: &str) -> Vec<u8> {
    let mut k = META_TOPIC_PREFIX.to_vec();
    k.extend_from_slice(topic.as_bytes());
    k
}

/// Cursor keys are `c/<topic>\n<subscription>`; names never contain '\n'.
pub(crate) fn cursor_meta_key(topic: &str, sub: &str) -> Vec<u8> {
    sub_meta_key(META_CURSOR_PREFIX, topic, sub)
}

pub(crate) fn sub_meta_key(prefix: &[u8], topic: &str, sub: &str) -> Vec<u8> {
    let mut k = prefix.to_vec();
    k.extend_from_slice(topic.as_bytes());
    k.push(b'\n');
    k.extend_from_slice(sub.as_bytes());
    k
}

pub(crate) fn dedup_meta_key(topic: &str) -> Vec<u8> {
    let mut k = META_DEDUP_PREFIX.to_vec();
    k.extend_from_slice(topic.as_bytes());
    k
}

/// Ledgers of the log that no topic record names: a topic deletion writes
/// the empty topic record before deleting the ledgers, so a crash in between
/// leaves these (every ledger is named by its topic's record before its
/// first entry is appended). Nothing when any topic record does not decode
/// (a format this version does not know might name them).
pub(crate) fn orphan_ledgers(log: &EntryLog, in_log: &std::collections::HashSet<u64>) -> Vec<u64> {
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
