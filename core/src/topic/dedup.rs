//! Broker-side message deduplication (Pulsar's): per topic, per producer
//! name, the highest sequence id appended. A send whose sequence id is not
//! above it is a resend: it is not stored again, and it is answered with the
//! original receipt when the original is among the producer's last
//! [`DEDUP_RECENT_MAX`] entries (waiting for the original's fsync if that is
//! still pending), else with [`duplicate_id`] (the original is older than
//! the broker remembers; it was stored).
//!
//! Durability: a snapshot record `d/<topic>` (JSON: the next entry id it
//! covers, and per producer the highest sequence id and its entry) is written
//! to the owner's log with the cursors (every `cursor_persist_interval`, and
//! at shutdown). When a producer attaches to a topic of a namespace with
//! deduplication on, the state is rebuilt from the snapshot plus a replay of
//! the entries after it (their metadata names producer and sequence id), so a
//! `kill -9` loses nothing: every durable entry is either in the snapshot or
//! replayed.
//!
//! A chunked message's chunks share one sequence id: a chunk is new when
//! `(sequence id, chunk id)` is above the highest seen, so the chunks of one
//! message are stored once each and the message counts once.
//!
//! A batch (one entry) of N messages has the sequence id S of its first
//! message and covers S..S+N-1 (Pulsar's `sequence_id`/`highest_sequence_id`):
//! the highest tracked is S+N-1, and a resend is recognised by S.
//!
//! Owned by the topic's shard; never crosses cores.

use crate::error::{CoreError, ErrorCode};
use serde::{Deserialize, Serialize};
use std::cell::{Cell, RefCell};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::time::Duration;

/// Entries remembered per producer for answering resends with their
/// original message id.
pub const DEDUP_RECENT_MAX: usize = 1024;
/// Producer names tracked per topic; past this the least recently
/// written name is forgotten (its resends are then stored again).
pub const DEDUP_PRODUCERS_MAX: usize = 10_000;

/// The id answered to a resend whose original is older than the broker
/// remembers: `u64::MAX:u64::MAX:P:-1` (Pulsar answers `-1:-1`).
pub fn duplicate_id(partition: i32) -> magnetar_wire::MessageId {
    magnetar_wire::MessageId::new(u64::MAX, u64::MAX, partition, -1)
}

#[derive(Default)]
struct ProducerSeqs {
    highest: u64,
    /// Chunk id of the last chunk seen of the message `highest` (0 when it
    /// was not chunked).
    highest_chunk: u32,
    /// (sequence id, chunk id, entry, lsn of the append; 0 = known durable),
    /// oldest first.
    recent: VecDeque<(u64, u32, u64, u64)>,
    /// For eviction: bumped on every write.
    touched: u64,
}

/// What to do with a send.
pub(crate) enum Check {
    New,
    /// A resend; `Some((entry, lsn))` when the original is remembered.
    Duplicate(Option<(u64, u64)>),
}

#[derive(Default)]
pub(crate) struct Dedup {
    pub(crate) enabled: Cell<bool>,
    pub(crate) loaded: Cell<bool>,
    pub(crate) loading: Cell<bool>,
    pub(crate) dirty: Cell<bool>,
    producers: RefCell<HashMap<String, ProducerSeqs>>,
    clock: Cell<u64>,
}

#[derive(Serialize, Deserialize, Default)]
pub(crate) struct Snapshot {
    /// Entries below this are covered by the snapshot.
    pub(crate) next_entry: u64,
    /// Producer name → (highest sequence id, its entry).
    pub(crate) producers: BTreeMap<String, (u64, u64)>,
}

impl Dedup {
    /// `chunk` is the chunk id of a chunk, 0 otherwise.
    pub(crate) fn check(&self, producer: &str, seq: u64, chunk: u32) -> Check {
        let producers = self.producers.borrow();
        let Some(p) = producers.get(producer) else { return Check::New };
        if (seq, chunk) > (p.highest, p.highest_chunk) {
            return Check::New;
        }
        let original = p.recent.iter().rev().find(|(s, c, _, _)| *s == seq && *c == chunk).map(|(_, _, e, l)| (*e, *l));
        Check::Duplicate(original)
    }

    /// Records an appended (or replayed) entry with sequence id `seq` and
    /// `num_messages` messages.
    pub(crate) fn record(&self, producer: &str, seq: u64, chunk: u32, num_messages: u32, entry: u64, lsn: u64) {
        let high = seq.saturating_add(u64::from(num_messages.max(1)) - 1);
        let now = self.clock.get() + 1;
        self.clock.set(now);
        let mut producers = self.producers.borrow_mut();
        if !producers.contains_key(producer) && producers.len() >= DEDUP_PRODUCERS_MAX {
            let oldest = producers.iter().min_by_key(|(_, p)| p.touched).map(|(n, _)| n.clone());
            if let Some(oldest) = oldest {
                producers.remove(&oldest);
            }
        }
        let p = producers.entry(producer.to_string()).or_default();
        if (high, chunk) > (p.highest, p.highest_chunk) {
            p.highest = high;
            p.highest_chunk = chunk;
        }
        p.touched = now;
        p.recent.push_back((seq, chunk, entry, lsn));
        if p.recent.len() > DEDUP_RECENT_MAX {
            p.recent.pop_front();
        }
        self.dirty.set(true);
    }

    /// Highest sequence id of `producer` known durable (`durable_lsn`), or -1.
    pub(crate) fn last_persisted(&self, producer: &str, durable_lsn: u64) -> i64 {
        let producers = self.producers.borrow();
        let Some(p) = producers.get(producer) else { return -1 };
        let as_i64 = |s: u64| i64::try_from(s).unwrap_or(i64::MAX);
        if let Some((s, _, _, _)) = p.recent.iter().rev().find(|(_, _, _, lsn)| *lsn <= durable_lsn) {
            // The newest durable entry; a batch's covers up to `highest` when newest.
            let newest = p.recent.back().is_some_and(|(b, _, _, _)| b == s);
            return as_i64(if newest { p.highest } else { *s });
        }
        // Nothing remembered is durable yet (or nothing is remembered: the
        // state came from a snapshot, which holds durable entries only).
        match p.recent.front() {
            Some((first, _, _, _)) => as_i64(*first) - 1,
            None => as_i64(p.highest),
        }
    }

    pub(crate) fn snapshot(&self, next_entry: u64) -> Snapshot {
        let producers = self
            .producers
            .borrow()
            .iter()
            .map(|(n, p)| {
                // The entry of the newest sequence id (a batch's first id may
                // be below `highest`).
                let entry = p.recent.back().map_or(u64::MAX, |(_, _, e, _)| *e);
                (n.clone(), (p.highest, entry))
            })
            .collect();
        Snapshot { next_entry, producers }
    }

    /// Loads a snapshot (before the replay of the entries after it).
    pub(crate) fn restore(&self, snap: &Snapshot) {
        for (name, (seq, entry)) in &snap.producers {
            if *entry == u64::MAX {
                let mut producers = self.producers.borrow_mut();
                let p = producers.entry(name.clone()).or_default();
                p.highest = p.highest.max(*seq);
            } else {
                self.record(name, *seq, 0, 1, *entry, 0);
            }
        }
    }
}

impl super::Topic {
    /// Rebuilds the topic's dedup state: snapshot, then a replay of the
    /// durable entries after it. Appends made meanwhile are tracked live.
    pub(crate) async fn ensure_dedup_loaded(&self, ctx: &super::TopicCtx<'_>) -> Result<(), CoreError> {
        while self.dedup.loading.get() {
            glommio::timer::sleep(Duration::from_millis(2)).await;
        }
        if self.dedup.loaded.get() {
            return Ok(());
        }
        self.dedup.loading.set(true);
        let result = self.replay_dedup(ctx).await;
        self.dedup.loading.set(false);
        if result.is_ok() {
            self.dedup.loaded.set(true);
        }
        result
    }

    async fn replay_dedup(&self, ctx: &super::TopicCtx<'_>) -> Result<(), CoreError> {
        let snap: Snapshot = match ctx.store.dedup_snapshot(&self.key) {
            Some(v) => serde_json::from_slice(&v).map_err(|e| {
                CoreError::new(ErrorCode::PersistenceError, format!("unreadable dedup snapshot of {}: {e}", self.key))
            })?,
            None => Snapshot::default(),
        };
        self.dedup.restore(&snap);
        // Appends in flight are tracked live; the replay waits until they
        // are durable so that it reads every entry below them.
        let end = self.next_entry.get();
        while self.durable_next.get() < end && !ctx.closed.get() {
            glommio::timer::sleep(Duration::from_millis(2)).await;
        }
        // Positions count across ledgers; those retention deleted teach nothing.
        let from = snap.next_entry.max(self.ledgers.borrow().start());
        for entry in from..end {
            let Some((ledger, e)) = self.ledgers.borrow().locate(entry) else { continue };
            match ctx.log.read(ledger, e).await {
                Ok(blob) => match crate::entry::read(&blob) {
                    Ok(m) => self.dedup.record(m.producer_name, m.sequence_id, m.chunk_id(), m.num_messages, entry, 0),
                    Err(e) => tracing::warn!(topic = %self.key, entry, "dedup replay: undecodable entry: {e}"),
                },
                // Gone (retention) or unreadable: nothing to learn from it.
                Err(e) => tracing::warn!(topic = %self.key, entry, "dedup replay: cannot read entry: {e}"),
            }
        }
        tracing::info!(topic = %self.key, from = snap.next_entry, to = end, "dedup state restored");
        Ok(())
    }

    /// Writes the dedup snapshot if the state changed since the last one.
    /// Returns its log position when written.
    pub(crate) fn flush_dedup(&self, store: &crate::store::Store) -> Result<Option<u64>, CoreError> {
        if !self.dedup.loaded.get() || self.dedup.loading.get() || !self.dedup.dirty.replace(false) {
            return Ok(None);
        }
        let snap = self.dedup.snapshot(self.next_entry.get());
        let bytes = serde_json::to_vec(&snap)
            .map_err(|e| CoreError::new(ErrorCode::UnknownError, format!("encoding a dedup snapshot: {e}")))?;
        Ok(Some(store.put_dedup_snapshot(&self.key, bytes::Bytes::from(bytes))?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resends_are_recognised_and_survive_a_snapshot() {
        let d = Dedup::default();
        assert!(matches!(d.check("p", 0, 0), Check::New));
        d.record("p", 0, 0, 1, 10, 5);
        d.record("p", 1, 0, 1, 11, 6);
        assert!(matches!(d.check("p", 0, 0), Check::Duplicate(Some((10, 5)))));
        assert!(matches!(d.check("p", 2, 0), Check::New));
        assert!(matches!(d.check("q", 0, 0), Check::New));
        assert_eq!(d.last_persisted("p", 5), 0);
        assert_eq!(d.last_persisted("p", 6), 1);
        assert_eq!(d.last_persisted("p", 4), -1);
        assert_eq!(d.last_persisted("q", 6), -1);
        let snap = d.snapshot(12);
        let json = serde_json::to_vec(&snap).unwrap();
        let back: Snapshot = serde_json::from_slice(&json).unwrap();
        let e = Dedup::default();
        e.restore(&back);
        assert!(matches!(e.check("p", 1, 0), Check::Duplicate(Some((11, 0)))));
        assert!(matches!(e.check("p", 0, 0), Check::Duplicate(None)));
        assert!(matches!(e.check("p", 2, 0), Check::New));
        assert_eq!(e.last_persisted("p", 0), 1);
    }

    #[test]
    fn a_batch_covers_its_sequence_ids() {
        let d = Dedup::default();
        d.record("b", 10, 0, 5, 20, 7);
        assert!(matches!(d.check("b", 10, 0), Check::Duplicate(Some((20, 7)))));
        assert!(matches!(d.check("b", 14, 0), Check::Duplicate(None)));
        assert!(matches!(d.check("b", 15, 0), Check::New));
        assert_eq!(d.last_persisted("b", 7), 14);
        assert_eq!(d.last_persisted("b", 6), 9);
    }

    #[test]
    fn the_chunks_of_one_message_share_its_sequence_id() {
        let d = Dedup::default();
        d.record("c", 3, 0, 1, 30, 1);
        assert!(matches!(d.check("c", 3, 1), Check::New));
        d.record("c", 3, 1, 1, 31, 2);
        assert!(matches!(d.check("c", 3, 0), Check::Duplicate(Some((30, 1)))));
        assert!(matches!(d.check("c", 3, 1), Check::Duplicate(Some((31, 2)))));
        assert!(matches!(d.check("c", 3, 2), Check::New));
        assert!(matches!(d.check("c", 4, 0), Check::New));
    }
}
