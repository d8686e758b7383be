//! A subscription's state beside its cursor: batch-index acks (Pulsar's
//! ack set), its type and tag filter, and redelivery counts.
//!
//! The cursor record (`c/<topic>\n<sub>`, `cursor.rs`) says which entries
//! are acknowledged whole. This module keeps what a restart would otherwise
//! lose about the others, in a record of its own (`s/<topic>\n<sub>`), so
//! that the cursor's format stays the ledger-rollover work's to change:
//!
//! - for each batch entry some of whose messages are acknowledged, a bitset
//!   of those messages; the entry is acknowledged whole (in the cursor) once
//!   every bit is set, and a redelivery carries the bitset so the client
//!   hands out only the others;
//! - the subscription type and tag filter, so a restart neither lets a
//!   consumer of another type take the subscription nor drops the filter;
//! - how often each redelivered entry was delivered (bounded), so redelivery
//!   counts go on after a restart (and a dead-letter limit stays a limit).
//!
//! Per-entry state is keyed by `(ledger, entry)`: a topic's log spans
//! several ledgers. Owned by the topic's shard; never crosses cores.

use crate::topic::ledgers::{Lookup, TopicLedgers};
use magnetar_wire::{AllocationStrategy, SubscriptionType};
use std::collections::{BTreeMap, HashMap};

/// `(ledger, entry)`: one entry of a topic's log.
pub(crate) type EntryKey = (u64, u64);

/// Most partially acknowledged batches written per subscription record.
/// Past this, the highest entries' bits are not persisted: after a restart
/// those batches come back whole (at-least-once, like the cursor's
/// `ACKED_RANGES_PERSISTED_MAX`).
pub const BATCH_ACKS_PERSISTED_MAX: usize = 10_000;

/// Most redelivery counts written per subscription record (the lowest
/// entries win: they are the oldest, the likeliest to reach a dead-letter
/// limit). Entries past the bound start again from 0 after a restart.
pub const REDELIVERY_COUNTS_PERSISTED_MAX: usize = 10_000;

/// Least time between two writes of a subscription's state record caused
/// by redelivery counts alone (other changes write it with the next cursor
/// flush, counts included). After a crash a count may lack the deliveries
/// of about this long (plus the cursor flush interval).
pub const REDELIVERY_COUNTS_PERSIST_INTERVAL_MS: u64 = 1_000;

/// Whether changed redelivery counts are due to be written at `now_ms`,
/// the state record having last been written at `written_ms`.
pub(crate) fn counts_write_due(now_ms: u64, written_ms: u64) -> bool {
    now_ms >= written_ms.saturating_add(REDELIVERY_COUNTS_PERSIST_INTERVAL_MS)
}

/// Largest batch a batch-index ack may describe (the wire's own bound on
/// messages per batch entry).
pub const BATCH_SIZE_MAX: u32 = magnetar_wire::BATCH_MESSAGES_MAX;

/// Most 64-bit ack-bit words one subscription holds (1 MiB), in memory and
/// in its record. A batch's size is whatever its producer claimed (up to
/// [`BATCH_SIZE_MAX`], 16,384 words), so without this bound a client that
/// produces a few claimed-huge batches and acks one index of each would make
/// the broker hold, and rewrite on every cursor flush, megabytes per entry,
/// up to a record the log refuses (which then stops the cursor persisting).
/// Past the bound an index ack of a batch not yet partly acknowledged is not
/// kept: the entry is acknowledged once all its messages are (the client
/// sends that ack), or comes back whole (at-least-once).
pub const BATCH_ACK_WORDS_MAX: usize = 1 << 17;

/// Longest tag filter kept (tags are short labels).
pub const FILTER_TAG_BYTES_MAX: usize = 1024;

/// Version 2 appends the allocation strategy and partition zones; version
/// 1 records (written before) are read with the defaults.
const STATE_FORMAT_VERSION: u8 = 2;

/// Longest zone label kept (a consumer's or a partition's).
pub const ZONE_BYTES_MAX: usize = 256;

/// Which messages of one batch entry are acknowledged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct AckBits {
    /// Messages in the batch.
    size: u32,
    /// Bit i of word i / 64: message i is acknowledged.
    words: Vec<u64>,
}

impl AckBits {
    pub(crate) fn new(size: u32) -> Self {
        assert!(size > 0 && size <= BATCH_SIZE_MAX);
        Self { size, words: vec![0; size.div_ceil(64) as usize] }
    }

    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    /// The bitset as sent to the client (`Message.ack_set`).
    pub(crate) fn words(&self) -> &[u64] {
        &self.words
    }

    /// Marks message `i` acknowledged. Returns whether it was not yet.
    pub(crate) fn set(&mut self, i: u32) -> bool {
        assert!(i < self.size);
        let (w, b) = ((i / 64) as usize, i % 64);
        let was = self.words[w] & (1 << b) != 0;
        self.words[w] |= 1 << b;
        !was
    }

    pub(crate) fn acked_count(&self) -> u32 {
        self.words.iter().map(|w| w.count_ones()).sum()
    }

    pub(crate) fn all(&self) -> bool {
        self.acked_count() == self.size
    }
}

/// The outcome of one batch-index ack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum IndexAck {
    /// The bit was set already: nothing changed.
    Unchanged,
    /// Recorded; other messages of the batch are still unacknowledged.
    Partial,
    /// That was the last one: acknowledge the entry whole.
    Complete,
    /// Not kept: the subscription holds [`BATCH_ACK_WORDS_MAX`] words already.
    OverBudget,
}

/// Partially acknowledged batch entries of one subscription. Bounded by the
/// entries delivered and not acknowledged (an entry gets bits only once it
/// was delivered, or from the persisted record).
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub(crate) struct BatchAcks {
    map: BTreeMap<EntryKey, AckBits>,
    /// Bit words held by `map`, at most [`BATCH_ACK_WORDS_MAX`].
    words: usize,
}

impl BatchAcks {
    pub(crate) fn get(&self, key: EntryKey) -> Option<&AckBits> {
        self.map.get(&key)
    }

    pub(crate) fn len(&self) -> usize {
        self.map.len()
    }

    /// Acknowledges messages `first..=last` of the batch `key` of `size`
    /// messages. A size that disagrees with bits already held is refused
    /// (the client described another entry). `last` must be below `size`.
    pub(crate) fn ack(&mut self, key: EntryKey, size: u32, first: u32, last: u32) -> Result<IndexAck, String> {
        if size == 0 || size > BATCH_SIZE_MAX || first > last || last >= size {
            return Err(format!("batch index {first}..={last} of a batch of {size} messages"));
        }
        let bits = match self.map.entry(key) {
            std::collections::btree_map::Entry::Occupied(o) => o.into_mut(),
            std::collections::btree_map::Entry::Vacant(v) => {
                let need = size.div_ceil(64) as usize;
                if self.words + need > BATCH_ACK_WORDS_MAX {
                    return Ok(IndexAck::OverBudget);
                }
                self.words += need;
                v.insert(AckBits::new(size))
            }
        };
        if bits.size != size {
            return Err(format!("batch of {size} messages, but this entry holds {}", bits.size));
        }
        let mut changed = false;
        for i in first..=last {
            changed |= bits.set(i);
        }
        if bits.all() {
            self.remove(key);
            return Ok(IndexAck::Complete);
        }
        Ok(if changed { IndexAck::Partial } else { IndexAck::Unchanged })
    }

    /// Forgets the bits of entries for which `acked` holds (acknowledged whole).
    pub(crate) fn retain_unacked(&mut self, acked: impl Fn(EntryKey) -> bool) {
        self.map.retain(|k, _| !acked(*k));
        self.words = self.map.values().map(|b| b.words.len()).sum();
    }

    pub(crate) fn remove(&mut self, key: EntryKey) {
        if let Some(bits) = self.map.remove(&key) {
            self.words -= bits.words.len();
        }
    }

    pub(crate) fn clear(&mut self) {
        self.map.clear();
        self.words = 0;
    }

    /// Bit words held (bounded by [`BATCH_ACK_WORDS_MAX`]).
    #[cfg(test)]
    pub(crate) fn words(&self) -> usize {
        self.words
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = (&EntryKey, &AckBits)> {
        self.map.iter()
    }
}

/// The `s/<topic>\n<sub>` record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SubState {
    pub sub_type: SubscriptionType,
    pub filter_tag: Option<String>,
    pub(crate) batch_acks: BatchAcks,
    /// Deliveries so far of entries delivered more than once.
    pub(crate) deliveries: Vec<(EntryKey, u32)>,
    /// Failover's allocation strategy and partition zones.
    pub(crate) allocation: crate::subscription::Allocation,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("subscription state record at byte {offset}: {reason}")]
pub struct SubStateDecodeError {
    pub offset: usize,
    pub reason: &'static str,
}

fn type_code(t: SubscriptionType) -> u8 {
    match t {
        SubscriptionType::Exclusive => 0,
        SubscriptionType::Failover => 1,
        SubscriptionType::Shared => 2,
        SubscriptionType::KeyShared => 3,
    }
}

impl SubState {
    /// Layout (little-endian), version 2:
    /// `u8 version=2, u8 type (0 exclusive, 1 failover, 2 shared,
    /// 3 key_shared), u16 tag_len, tag_len bytes UTF-8 tag filter (0: none),
    /// u32 batch_count, batch_count × (u64 ledger, u64 entry, u32 size,
    /// ceil(size/64) × u64 acked-bit words), u32 count_n, count_n × (u64
    /// ledger, u64 entry, u32 deliveries), u8 allocation (0 round-robin,
    /// 1 average, 2 consistent-hash, 3 zone), u16 zone_n, zone_n × (u16
    /// len, len bytes UTF-8 zone label of partition i)` (version 1 ends
    /// before the allocation). Batches and counts ascend by
    /// `(ledger, entry)`; past the `*_PERSISTED_MAX` bounds the highest are
    /// left out. The bit words of all batches total at most
    /// [`BATCH_ACK_WORDS_MAX`] (the bound held in memory).
    pub fn encode(&self) -> Vec<u8> {
        let mut out = vec![STATE_FORMAT_VERSION, type_code(self.sub_type)];
        let tag = self.filter_tag.as_deref().unwrap_or("").as_bytes();
        let tag = &tag[..tag.len().min(FILTER_TAG_BYTES_MAX)];
        out.extend_from_slice(&(tag.len() as u16).to_le_bytes());
        out.extend_from_slice(tag);
        let batches: Vec<_> = self.batch_acks.iter().take(BATCH_ACKS_PERSISTED_MAX).collect();
        out.extend_from_slice(&(batches.len() as u32).to_le_bytes());
        for ((ledger, entry), bits) in batches {
            out.extend_from_slice(&ledger.to_le_bytes());
            out.extend_from_slice(&entry.to_le_bytes());
            out.extend_from_slice(&bits.size.to_le_bytes());
            for w in &bits.words {
                out.extend_from_slice(&w.to_le_bytes());
            }
        }
        let mut counts = self.deliveries.clone();
        counts.sort_unstable();
        counts.truncate(REDELIVERY_COUNTS_PERSISTED_MAX);
        out.extend_from_slice(&(counts.len() as u32).to_le_bytes());
        for ((ledger, entry), n) in counts {
            out.extend_from_slice(&ledger.to_le_bytes());
            out.extend_from_slice(&entry.to_le_bytes());
            out.extend_from_slice(&n.to_le_bytes());
        }
        out.push(match self.allocation.strategy {
            AllocationStrategy::RoundRobin => 0,
            AllocationStrategy::Average => 1,
            AllocationStrategy::ConsistentHash => 2,
            AllocationStrategy::Zone => 3,
        });
        // Bounded by `check_allocation` on the way in.
        let zones = &self.allocation.partition_zones;
        assert!(zones.len() <= PARTITION_ZONES_MAX);
        out.extend_from_slice(&(zones.len() as u16).to_le_bytes());
        for z in zones {
            assert!(z.len() <= ZONE_BYTES_MAX);
            out.extend_from_slice(&(z.len() as u16).to_le_bytes());
            out.extend_from_slice(z.as_bytes());
        }
        out
    }

    pub fn decode(bytes: &[u8]) -> Result<Self, SubStateDecodeError> {
        let mut r = Reader { b: bytes, at: 0 };
        let version = r.u8()?;
        if version != 1 && version != STATE_FORMAT_VERSION {
            return Err(r.err("unknown version"));
        }
        let sub_type = match r.u8()? {
            0 => SubscriptionType::Exclusive,
            1 => SubscriptionType::Failover,
            2 => SubscriptionType::Shared,
            3 => SubscriptionType::KeyShared,
            _ => return Err(r.err("unknown subscription type")),
        };
        let tag_len = usize::from(r.u16()?);
        if tag_len > FILTER_TAG_BYTES_MAX {
            return Err(r.err("tag filter too long"));
        }
        let tag = std::str::from_utf8(r.bytes(tag_len)?).map_err(|_| r.err("tag filter is not UTF-8"))?;
        let filter_tag = (!tag.is_empty()).then(|| tag.to_string());
        let n = r.u32()? as usize;
        if n > BATCH_ACKS_PERSISTED_MAX {
            return Err(r.err("too many batches"));
        }
        let mut batch_acks = BatchAcks::default();
        let mut last: Option<EntryKey> = None;
        for _ in 0..n {
            let key = (r.u64()?, r.u64()?);
            if last.is_some_and(|l| l >= key) {
                return Err(r.err("batches out of order"));
            }
            last = Some(key);
            let size = r.u32()?;
            if size == 0 || size > BATCH_SIZE_MAX {
                return Err(r.err("bad batch size"));
            }
            let need = size.div_ceil(64) as usize;
            if batch_acks.words + need > BATCH_ACK_WORDS_MAX {
                return Err(r.err("too many ack bits"));
            }
            let mut bits = AckBits::new(size);
            for w in bits.words.iter_mut() {
                *w = r.u64()?;
            }
            // Bits past the batch's size would make `all` unreachable.
            let tail = size % 64;
            if tail != 0 && bits.words.last().is_some_and(|w| w >> tail != 0) {
                return Err(r.err("ack bits past the batch size"));
            }
            if bits.all() {
                return Err(r.err("fully acknowledged batch"));
            }
            batch_acks.words += need;
            batch_acks.map.insert(key, bits);
        }
        let n = r.u32()? as usize;
        if n > REDELIVERY_COUNTS_PERSISTED_MAX {
            return Err(r.err("too many redelivery counts"));
        }
        let mut deliveries = Vec::with_capacity(n);
        for _ in 0..n {
            deliveries.push(((r.u64()?, r.u64()?), r.u32()?));
        }
        let mut allocation = crate::subscription::Allocation::default();
        if version >= 2 {
            allocation.strategy = match r.u8()? {
                0 => AllocationStrategy::RoundRobin,
                1 => AllocationStrategy::Average,
                2 => AllocationStrategy::ConsistentHash,
                3 => AllocationStrategy::Zone,
                _ => return Err(r.err("unknown allocation strategy")),
            };
            let n = usize::from(r.u16()?);
            if n > PARTITION_ZONES_MAX {
                return Err(r.err("too many partition zones"));
            }
            for _ in 0..n {
                let len = usize::from(r.u16()?);
                if len > ZONE_BYTES_MAX {
                    return Err(r.err("zone label too long"));
                }
                let z = std::str::from_utf8(r.bytes(len)?).map_err(|_| r.err("zone label is not UTF-8"))?;
                allocation.partition_zones.push(z.to_string());
            }
        }
        if r.at != bytes.len() {
            return Err(r.err("trailing bytes"));
        }
        Ok(Self { sub_type, filter_tag, batch_acks, deliveries, allocation })
    }
}

/// Deliveries per entry as the dispatcher counts them (by topic position),
/// restricted to the ones worth persisting (delivered more than once), as
/// `(ledger, entry)`.
pub(crate) fn redelivered(
    ledgers: &TopicLedgers,
    deliveries: &HashMap<u64, u32>,
    pending: &crate::subscription::pending::PendingMap,
) -> Vec<(EntryKey, u32)> {
    deliveries
        .iter()
        .map(|(p, n)| (*p, *n))
        .chain(pending.iter().map(|(p, h)| (p, h.deliveries)))
        .filter(|(_, n)| *n > 1)
        .filter_map(|(p, n)| Some((ledgers.locate(p)?, n)))
        .collect()
}

/// Whether the cursor (in topic positions) acknowledges `(ledger, entry)`
/// whole; an entry in a ledger retention deleted is acknowledged.
fn acked_whole(ledgers: &TopicLedgers, cursor: &crate::subscription::cursor::Cursor, (l, e): EntryKey) -> bool {
    match ledgers.lookup(l, e) {
        Lookup::At(p) => cursor.is_acked(p),
        Lookup::Trimmed => true,
        Lookup::Unknown => false,
    }
}

/// What one batch-index ack did.
pub(crate) struct IndexAckDone {
    /// The cursor or the batch-ack state changed.
    pub(crate) changed: bool,
    /// It acknowledged the entry whole (its last unacknowledged message).
    pub(crate) whole: bool,
}

/// Applies `id` as a batch-index ack when it is one (a batch index and a
/// batch of more than one message); `None` when it acknowledges its entry
/// whole. Individual: message `batch_index`; cumulative: every entry before
/// and messages `0..=batch_index` of this one (Pulsar's semantics). The
/// size is checked against the entry's when it is outstanding. An index ack
/// of an entry neither outstanding nor partly acknowledged (a stale ack
/// after the entry went back to the subscription) is dropped: the entry is
/// delivered again whole, which at-least-once allows, and no client can
/// make the broker keep bits for entries it was never sent. `pos` is the
/// topic position of `id` (the cursor and the pending map count in them).
pub(crate) fn batch_index_ack(
    sub: &crate::subscription::Subscription,
    cursor: &mut crate::subscription::cursor::Cursor,
    ack_type: magnetar_wire::AckType,
    id: magnetar_wire::MessageId,
    pos: u64,
    size: u32,
) -> Result<Option<IndexAckDone>, crate::error::CoreError> {
    use crate::error::{CoreError, ErrorCode};
    let Ok(index) = u32::try_from(id.batch_index) else { return Ok(None) };
    if size <= 1 {
        return Ok(None);
    }
    let key = (id.ledger, id.entry);
    let outstanding = sub.pending.borrow().get(pos).map(|p| p.num_messages);
    if outstanding.is_some_and(|n| n != size) {
        return Err(CoreError::new(
            ErrorCode::NotAllowed,
            format!("batch-index ack of {id} names a batch of {size} messages; the entry holds {outstanding:?}"),
        ));
    }
    // Refused before anything changes: a cumulative ack would otherwise
    // have moved the floor already.
    if index >= size || size > BATCH_SIZE_MAX {
        return Err(CoreError::new(
            ErrorCode::NotAllowed,
            format!("batch-index ack of {id}: no index {index} in a batch of {size} messages"),
        ));
    }
    let mut changed = false;
    let first = match ack_type {
        magnetar_wire::AckType::Individual => index,
        magnetar_wire::AckType::Cumulative => {
            if let Some(before) = pos.checked_sub(1) {
                changed |= cursor.ack_cumulative(before);
            }
            0
        }
    };
    let known = outstanding.is_some() || sub.batch_acks.borrow().get(key).is_some();
    if cursor.is_acked(pos) || !known {
        return Ok(Some(IndexAckDone { changed, whole: false }));
    }
    let outcome = sub
        .batch_acks
        .borrow_mut()
        .ack(key, size, first, index)
        .map_err(|e| CoreError::new(ErrorCode::NotAllowed, format!("batch-index ack of {id}: {e}")))?;
    Ok(Some(match outcome {
        IndexAck::Unchanged | IndexAck::OverBudget => IndexAckDone { changed, whole: false },
        IndexAck::Partial => {
            sub.state_dirty.set(true);
            IndexAckDone { changed: true, whole: false }
        }
        IndexAck::Complete => {
            sub.state_dirty.set(true);
            cursor.ack(pos);
            IndexAckDone { changed: true, whole: true }
        }
    }))
}

/// Drops the bits of batches the cursor now acknowledges whole: `whole`
/// (topic positions) after individual acks, a sweep after a cumulative one.
pub(crate) fn forget_acked(
    sub: &crate::subscription::Subscription,
    cursor: &crate::subscription::cursor::Cursor,
    ledgers: &TopicLedgers,
    ack_type: magnetar_wire::AckType,
    whole: &[u64],
) {
    let mut acks = sub.batch_acks.borrow_mut();
    if acks.len() == 0 {
        return;
    }
    let before = acks.len();
    match ack_type {
        magnetar_wire::AckType::Individual => {
            for p in whole {
                if let Some(key) = ledgers.locate(*p) {
                    acks.remove(key);
                }
            }
        }
        magnetar_wire::AckType::Cumulative => acks.retain_unacked(|k| acked_whole(ledgers, cursor, k)),
    }
    if acks.len() != before {
        sub.state_dirty.set(true);
    }
}

/// Refuses a tag filter longer than the state record keeps: cut there, it
/// would come back after a restart as another filter (whose hash matches
/// nothing, so every entry counted as acknowledged) or, cut inside a
/// character, as a record that does not decode.
pub(crate) fn check_filter_tag(tag: &str) -> Result<(), crate::error::CoreError> {
    if tag.len() > FILTER_TAG_BYTES_MAX {
        return Err(crate::error::CoreError::new(
            crate::error::ErrorCode::NotAllowed,
            format!("a tag filter of {} bytes; at most {FILTER_TAG_BYTES_MAX}", tag.len()),
        ));
    }
    Ok(())
}

/// Most partition zones a subscribe may list (one per partition).
pub const PARTITION_ZONES_MAX: usize = crate::metadata::PARTITIONS_MAX as usize;

/// Refuses an allocation request that cannot apply: a strategy other than
/// round robin on a subscription type that is not Failover (only Failover
/// spreads partitions over consumers), zones without the Zone strategy, or
/// labels over the bounds the state record keeps.
pub(crate) fn check_allocation(
    sub_type: SubscriptionType,
    model: &magnetar_wire::ConsumptionModel,
) -> Result<(), crate::error::CoreError> {
    let refuse = |why: String| Err(crate::error::CoreError::new(crate::error::ErrorCode::NotAllowed, why));
    if model.allocation != AllocationStrategy::RoundRobin && sub_type != SubscriptionType::Failover {
        return refuse(format!(
            "allocation {} applies to Failover subscriptions, not {sub_type:?}",
            model.allocation.as_str()
        ));
    }
    if model.allocation != AllocationStrategy::Zone && (!model.zone.is_empty() || !model.partition_zones.is_empty()) {
        return refuse("zone labels apply to the zone allocation strategy only".into());
    }
    if model.partition_zones.len() > PARTITION_ZONES_MAX {
        return refuse(format!("{} partition zones; at most {PARTITION_ZONES_MAX}", model.partition_zones.len()));
    }
    if let Some(z) = std::iter::once(&model.zone).chain(&model.partition_zones).find(|z| z.len() > ZONE_BYTES_MAX) {
        return refuse(format!("a zone label of {} bytes; at most {ZONE_BYTES_MAX}", z.len()));
    }
    Ok(())
}

/// Refuses a consumer of another type than the subscription had before a
/// restart while the hold lasts; a consumer that may attach ends the hold.
pub(crate) fn check_type_hold(
    sub: &crate::subscription::Subscription,
    wanted: SubscriptionType,
    now_ms: u64,
) -> Result<(), crate::error::CoreError> {
    let until = sub.type_held_until_ms.get();
    if until > now_ms && wanted != sub.sub_type.get() {
        return Err(crate::error::CoreError::new(
            crate::error::ErrorCode::ConsumerBusy,
            format!(
                "subscription {:?} is {:?} (kept across the broker's restart); a {wanted:?} consumer may attach \
                 once its consumers had {} s more to come back",
                sub.name,
                sub.sub_type.get(),
                (until - now_ms).div_ceil(1000)
            ),
        ));
    }
    sub.type_held_until_ms.set(0);
    Ok(())
}

/// The record of `sub` on a topic with these ledgers.
pub(crate) fn encode(sub: &crate::subscription::Subscription, ledgers: &TopicLedgers) -> Vec<u8> {
    SubState {
        sub_type: sub.sub_type.get(),
        filter_tag: sub.filter_tag.borrow().clone(),
        batch_acks: sub.batch_acks.borrow().clone(),
        deliveries: redelivered(ledgers, &sub.deliveries.borrow(), &sub.pending.borrow()),
        allocation: sub.allocation.borrow().clone(),
    }
    .encode()
}

/// Puts a recovered record back into a subscription just loaded from its
/// cursor; the type is held for `hold_ms` (see `check_type_hold`).
pub(crate) fn restore(
    sub: &crate::subscription::Subscription,
    state: SubState,
    ledgers: &TopicLedgers,
    now_ms: u64,
    hold_ms: u64,
) {
    sub.sub_type.set(state.sub_type);
    *sub.policy.borrow_mut() = crate::subscription::policy_for(state.sub_type);
    *sub.filter_tag.borrow_mut() = state.filter_tag;
    *sub.allocation.borrow_mut() = state.allocation;
    let cursor = sub.cursor.borrow();
    let mut acks = state.batch_acks;
    // The cursor may have been written after the last state record: an
    // entry it acknowledges whole needs no bits.
    acks.retain_unacked(|k| acked_whole(ledgers, &cursor, k));
    *sub.batch_acks.borrow_mut() = acks;
    let mut deliveries = sub.deliveries.borrow_mut();
    for ((l, e), n) in state.deliveries {
        if let Lookup::At(p) = ledgers.lookup(l, e) {
            if !cursor.is_acked(p) {
                deliveries.insert(p, n);
            }
        }
    }
    sub.type_held_until_ms.set(now_ms.saturating_add(hold_ms));
    sub.state_dirty.set(false);
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn err(&self, reason: &'static str) -> SubStateDecodeError {
        SubStateDecodeError { offset: self.at, reason }
    }
    fn bytes(&mut self, n: usize) -> Result<&'a [u8], SubStateDecodeError> {
        let end = self.at.checked_add(n).filter(|e| *e <= self.b.len()).ok_or(self.err("truncated"))?;
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }
    fn take<const N: usize>(&mut self) -> Result<[u8; N], SubStateDecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.bytes(N)?);
        Ok(a)
    }
    fn u8(&mut self) -> Result<u8, SubStateDecodeError> {
        Ok(self.take::<1>()?[0])
    }
    fn u16(&mut self) -> Result<u16, SubStateDecodeError> {
        Ok(u16::from_le_bytes(self.take()?))
    }
    fn u32(&mut self) -> Result<u32, SubStateDecodeError> {
        Ok(u32::from_le_bytes(self.take()?))
    }
    fn u64(&mut self) -> Result<u64, SubStateDecodeError> {
        Ok(u64::from_le_bytes(self.take()?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn largest_state_record_and_its_write_rate() {
        // Goal: measure what constant redelivery used to rewrite every
        // cursor flush, and check counts alone now write at most once per
        // interval. Method: fill a state to its persisted bounds, encode it.
        let mut acks = BatchAcks::default();
        let per_batch = (BATCH_ACK_WORDS_MAX / BATCH_ACKS_PERSISTED_MAX) as u32 * 64;
        for e in 0..BATCH_ACKS_PERSISTED_MAX as u64 {
            assert_eq!(acks.ack((1, e), per_batch, 0, 0), Ok(IndexAck::Partial));
        }
        let deliveries = (0..REDELIVERY_COUNTS_PERSISTED_MAX as u64).map(|e| ((2, e), 7)).collect();
        let state = SubState {
            sub_type: SubscriptionType::Shared,
            filter_tag: None,
            batch_acks: acks,
            deliveries,
            allocation: Default::default(),
        };
        let bytes = state.encode().len();
        let flush_ms = 100u64;
        println!(
            "largest s/ record: {bytes} bytes; under constant redelivery: {} B/s written at one write per {flush_ms} ms \
             flush, {} B/s at one per {REDELIVERY_COUNTS_PERSIST_INTERVAL_MS} ms",
            bytes as u64 * 1000 / flush_ms,
            bytes as u64 * 1000 / REDELIVERY_COUNTS_PERSIST_INTERVAL_MS
        );
        assert!(bytes > 1 << 20, "{bytes}");
        // Counts alone: written right away the first time, then at most
        // once per interval.
        assert!(counts_write_due(5_000, 0));
        let written = 10_000;
        for now in (written..written + REDELIVERY_COUNTS_PERSIST_INTERVAL_MS).step_by(flush_ms as usize) {
            assert!(!counts_write_due(now, written), "due at {now}");
        }
        assert!(counts_write_due(written + REDELIVERY_COUNTS_PERSIST_INTERVAL_MS, written));
    }

    #[test]
    fn batch_completes_when_every_index_is_acked() {
        let mut b = BatchAcks::default();
        assert_eq!(b.ack((5, 1), 3, 0, 0), Ok(IndexAck::Partial));
        assert_eq!(b.ack((5, 1), 3, 0, 0), Ok(IndexAck::Unchanged));
        assert!(b.ack((5, 1), 4, 1, 1).is_err(), "another size for the same entry");
        assert!(b.ack((5, 1), 3, 3, 3).is_err(), "index past the batch");
        assert_eq!(b.ack((5, 1), 3, 2, 2), Ok(IndexAck::Partial));
        assert_eq!(b.get((5, 1)).map(|x| x.words().to_vec()), Some(vec![0b101]));
        assert_eq!(b.ack((5, 1), 3, 1, 1), Ok(IndexAck::Complete));
        assert_eq!(b.len(), 0);
        // A cumulative ack inside a batch sets a prefix.
        assert_eq!(b.ack((5, 2), 130, 0, 128), Ok(IndexAck::Partial));
        assert_eq!(b.get((5, 2)).map(AckBits::acked_count), Some(129));
    }

    #[test]
    fn record_round_trips_and_rejects_garbage() {
        let mut batch_acks = BatchAcks::default();
        batch_acks.ack((7, 3), 100, 5, 70).unwrap();
        batch_acks.ack((9, 0), 2, 1, 1).unwrap();
        let s = SubState {
            sub_type: SubscriptionType::KeyShared,
            filter_tag: Some("tagA".into()),
            batch_acks,
            deliveries: vec![((9, 4), 3), ((7, 2), 2)],
            allocation: crate::subscription::Allocation {
                strategy: AllocationStrategy::Zone,
                partition_zones: vec!["eu".into(), String::new(), "us".into()],
            },
        };
        let bytes = s.encode();
        let back = SubState::decode(&bytes).unwrap();
        assert_eq!(back.sub_type, s.sub_type);
        assert_eq!(back.filter_tag, s.filter_tag);
        assert_eq!(back.batch_acks, s.batch_acks);
        assert_eq!(back.deliveries, vec![((7, 2), 2), ((9, 4), 3)]);
        assert_eq!(back.allocation, s.allocation);
        for cut in 0..bytes.len() {
            assert!(SubState::decode(&bytes[..cut]).is_err(), "cut at {cut}");
        }
        let mut bad = bytes.clone();
        bad[0] = 3;
        assert!(SubState::decode(&bad).is_err());
        let mut bad = bytes.clone();
        bad[1] = 9;
        assert!(SubState::decode(&bad).is_err());
        let mut long = bytes;
        long.push(0);
        assert!(SubState::decode(&long).is_err());
    }

    #[test]
    fn claimed_huge_batches_cannot_grow_the_bits_without_bound() {
        // A producer may claim up to BATCH_SIZE_MAX messages in a tiny
        // entry; a consumer then acks index 0 of each such entry.
        let mut b = BatchAcks::default();
        let mut kept = 0;
        for e in 0..100 {
            match b.ack((1, e), BATCH_SIZE_MAX, 0, 0) {
                Ok(IndexAck::Partial) => kept += 1,
                Ok(IndexAck::OverBudget) => {}
                other => panic!("entry {e}: {other:?}"),
            }
        }
        assert!(b.words() <= BATCH_ACK_WORDS_MAX, "{} words held", b.words());
        assert_eq!(kept, BATCH_ACK_WORDS_MAX / (BATCH_SIZE_MAX as usize / 64));
        let s = SubState {
            sub_type: SubscriptionType::Exclusive,
            filter_tag: None,
            batch_acks: b.clone(),
            deliveries: Vec::new(),
            allocation: Default::default(),
        };
        let bytes = s.encode();
        assert!(bytes.len() < 2 << 20, "a record of {} bytes", bytes.len());
        assert_eq!(SubState::decode(&bytes).unwrap().batch_acks, b);
        // Bits already held still take acks; freeing some makes room again.
        assert_eq!(b.ack((1, 0), BATCH_SIZE_MAX, 1, 1), Ok(IndexAck::Partial));
        b.remove((1, 0));
        assert_eq!(b.ack((1, 99), BATCH_SIZE_MAX, 0, 0), Ok(IndexAck::Partial));
        assert_eq!(b.words(), BATCH_ACK_WORDS_MAX);
        b.retain_unacked(|(_, e)| e < 5);
        assert_eq!(b.words(), b.iter().map(|(_, bits)| bits.words().len()).sum::<usize>());
        b.clear();
        assert_eq!(b.words(), 0);
    }

    #[test]
    fn decode_refuses_more_bits_than_memory_holds() {
        // A hand-made record with one batch past the words bound.
        let batches = BATCH_ACK_WORDS_MAX / (BATCH_SIZE_MAX as usize / 64) + 1;
        let mut r = vec![1u8, 0, 0, 0];
        r.extend_from_slice(&(batches as u32).to_le_bytes());
        for e in 0..batches as u64 {
            r.extend_from_slice(&1u64.to_le_bytes());
            r.extend_from_slice(&e.to_le_bytes());
            r.extend_from_slice(&BATCH_SIZE_MAX.to_le_bytes());
            r.extend_from_slice(&[0u8; BATCH_SIZE_MAX as usize / 8]);
        }
        r.extend_from_slice(&0u32.to_le_bytes());
        let err = SubState::decode(&r).unwrap_err();
        assert_eq!(err.reason, "too many ack bits", "{err}");
    }

    /// Decoding a damaged or hostile `s/` record errors and never panics:
    /// random byte strings, and valid records with bytes flipped, cut,
    /// inserted or overwritten with extreme values. A record that decodes
    /// encodes to one that decodes to the same state. Prints its seed;
    /// `MAGNETAR_SEED=<n>` replays it.
    #[test]
    fn decode_of_damaged_records_errors_and_never_panics() {
        let seed = crate::test_seed("decode_of_damaged_records_errors_and_never_panics");
        let mut rng = magnetar_storage::sim::SimRng::new(seed);
        let mut valid = Vec::new();
        for v in 0..16u64 {
            let mut batch_acks = BatchAcks::default();
            for e in 0..rng.below(6) {
                let size = [2, 63, 64, 65, 130, 1000][rng.below(6) as usize];
                let last = rng.below(u64::from(size) - 1) as u32;
                let first = rng.below(u64::from(last) + 1) as u32;
                batch_acks.ack((v, e * 3), size, first, last).unwrap();
            }
            let tag = ["", "a", "tagé", "long-tag-name"][rng.below(4) as usize];
            valid.push(
                SubState {
                    sub_type: SubscriptionType::Shared,
                    filter_tag: (!tag.is_empty()).then(|| tag.to_string()),
                    batch_acks,
                    deliveries: (0..rng.below(4)).map(|e| ((v, e), 2 + e as u32)).collect(),
                    allocation: Default::default(),
                }
                .encode(),
            );
        }
        for case in 0..20_000u64 {
            let bytes = if rng.below(4) == 0 {
                let n = rng.below(300) as usize;
                let mut b = rng.bytes(n);
                if !b.is_empty() {
                    b[0] = 1;
                }
                b
            } else {
                let pick = valid[rng.below(valid.len() as u64) as usize].clone();
                rng.mutate(pick)
            };
            let decoded = std::panic::catch_unwind(|| SubState::decode(&bytes))
                .unwrap_or_else(|_| panic!("decode panicked: MAGNETAR_SEED={seed}, case {case}, bytes {bytes:?}"));
            if let Ok(state) = decoded {
                let again = SubState::decode(&state.encode())
                    .unwrap_or_else(|e| panic!("re-encoded record does not decode ({e}): seed {seed}, case {case}"));
                assert_eq!(again.batch_acks, state.batch_acks, "seed {seed}, case {case}");
                assert_eq!(again.filter_tag, state.filter_tag, "seed {seed}, case {case}");
            }
        }
    }

    #[test]
    fn empty_state_is_small() {
        let s = SubState {
            sub_type: SubscriptionType::Exclusive,
            filter_tag: None,
            batch_acks: BatchAcks::default(),
            deliveries: Vec::new(),
            allocation: Default::default(),
        };
        assert_eq!(s.encode(), vec![2, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]);
        assert_eq!(SubState::decode(&s.encode()).unwrap(), s);
        // A version 1 record (written before allocation strategies) reads
        // with the default allocation.
        assert_eq!(SubState::decode(&[1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0]).unwrap(), s);
    }
}
