//! A topic's ledgers: how one partition's log is split into ledgers, and
//! the topic-wide positions the rest of the core works with.
//!
//! A topic appends to its *current* ledger; the ledger rolls over (a new
//! ledger id from the shard's allocator, always larger) by entry count, by
//! bytes and by age. Entry ids restart at 0 in each ledger, so a message id
//! `ledger:entry` is strictly monotonic per partition: ledger ids grow, and
//! entries grow within a ledger.
//!
//! Subscriptions, dispatchers, dedup and delayed delivery do not deal in
//! `(ledger, entry)` pairs: they use a *position*, a `u64` that numbers the
//! topic's entries across ledgers (ledger i's entry 0 has position
//! `first_i`, and `first_{i+1} = first_i + entries_i`). Positions are stable
//! across restarts (each ledger's first position is in the topic record), so
//! a dedup snapshot may name them; whatever is persisted for a subscription
//! (the cursor record) names `(ledger, entry)` instead. Retention deletes
//! whole ledgers from the front only, so the stored positions are always one
//! range `[start, next)`.
//!
//! The topic record (`t/<topic>` in the owner shard's log) lists the
//! ledgers; version 1 (one ledger id) is still read. Layouts in
//! `docs/format.md`. Owned by the topic's shard; never crosses cores.

use magnetar_wire::MessageId;

/// Version 1 of the topic record: `u8 1, u64 ledger`.
pub(crate) const TOPIC_RECORD_V1: u8 = 1;
/// Version 2: the ledger list (see [`encode_topic_record`]).
pub(crate) const TOPIC_RECORD_V2: u8 = 2;
/// Bytes of one ledger in a version 2 topic record.
const LEDGER_RECORD_BYTES: usize = 48;
/// Most ledgers one topic record may list: the record is one log record,
/// and 50,000 × 48 B = 2.4 MB fits the smallest segment (4 MiB). Past it
/// the current ledger simply stops rolling over (50,000 ledgers of the
/// default 50,000 entries is 2.5 billion entries kept).
pub const TOPIC_LEDGERS_MAX: usize = 50_000;

/// Topic-record size up to which rollovers ignore it (341 ledgers); see
/// [`Rollover::due`].
pub const TOPIC_RECORD_FREE_BYTES: u64 = 16 << 10;
/// Past [`TOPIC_RECORD_FREE_BYTES`], a ledger rolls over for its entries or
/// bytes only when it holds this many times the new record's bytes.
pub const TOPIC_RECORD_DATA_RATIO: u64 = 16;

/// Bytes of a version 2 topic record listing `ledgers` ledgers.
pub fn topic_record_bytes(ledgers: usize) -> u64 {
    5 + (ledgers as u64).saturating_mul(LEDGER_RECORD_BYTES as u64)
}

/// One ledger of a topic.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerInfo {
    pub id: u64,
    /// Topic position of the ledger's entry 0.
    pub first: u64,
    /// Entries appended to it (for the current ledger: so far).
    pub entries: u64,
    /// Bytes of the entries' bodies.
    pub bytes: u64,
    /// When the ledger was opened (ms since the Unix epoch).
    pub created_ms: u64,
    /// When it was closed by a rollover; 0 while it is the current ledger.
    pub closed_ms: u64,
}

impl LedgerInfo {
    /// One past its last position.
    pub fn end(&self) -> u64 {
        self.first + self.entries
    }
}

/// Encodes the topic record, version 2: `u8 2, u32 count, count × (u64 id,
/// u64 first, u64 entries, u64 bytes, u64 created_ms, u64 closed_ms)`,
/// little-endian, ledgers by ascending id, the last one current (its
/// `entries`, `bytes`, `closed_ms` are written as 0: the log knows them).
pub fn encode_topic_record(ledgers: &[LedgerInfo]) -> Vec<u8> {
    assert!(!ledgers.is_empty() && ledgers.len() <= TOPIC_LEDGERS_MAX, "a topic has 1..=max ledgers");
    let mut out = Vec::with_capacity(5 + ledgers.len() * LEDGER_RECORD_BYTES);
    out.push(TOPIC_RECORD_V2);
    out.extend_from_slice(&(ledgers.len() as u32).to_le_bytes());
    let last = ledgers.len() - 1;
    for (i, l) in ledgers.iter().enumerate() {
        let current = i == last;
        for v in [
            l.id,
            l.first,
            if current { 0 } else { l.entries },
            if current { 0 } else { l.bytes },
            l.created_ms,
            if current { 0 } else { l.closed_ms },
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
    }
    out
}

/// Decodes a topic record of either version into its ledger list (the last
/// one current; for version 1 a single ledger at position 0 of unknown
/// age). `None` for a value in an unknown or damaged format.
pub fn decode_topic_record(v: &[u8]) -> Option<Vec<LedgerInfo>> {
    let u64_at = |b: &[u8], at: usize| -> Option<u64> {
        let s = b.get(at..at.checked_add(8)?)?;
        let mut a = [0u8; 8];
        a.copy_from_slice(s);
        Some(u64::from_le_bytes(a))
    };
    match *v.first()? {
        TOPIC_RECORD_V1 if v.len() == 9 => {
            Some(vec![LedgerInfo { id: u64_at(v, 1)?, first: 0, entries: 0, bytes: 0, created_ms: 0, closed_ms: 0 }])
        }
        TOPIC_RECORD_V2 => {
            let count = u32::from_le_bytes(v.get(1..5)?.try_into().ok()?) as usize;
            if count == 0 || count > TOPIC_LEDGERS_MAX || v.len() != 5 + count * LEDGER_RECORD_BYTES {
                return None;
            }
            let mut out: Vec<LedgerInfo> = Vec::with_capacity(count);
            for i in 0..count {
                let at = 5 + i * LEDGER_RECORD_BYTES;
                let l = LedgerInfo {
                    id: u64_at(v, at)?,
                    first: u64_at(v, at + 8)?,
                    entries: u64_at(v, at + 16)?,
                    bytes: u64_at(v, at + 24)?,
                    created_ms: u64_at(v, at + 32)?,
                    closed_ms: u64_at(v, at + 40)?,
                };
                // Ids ascend and positions follow on: anything else is damage.
                if let Some(p) = out.last() {
                    if l.id <= p.id || l.first != p.end() {
                        return None;
                    }
                }
                out.push(l);
            }
            Some(out)
        }
        _ => None,
    }
}

/// How many leading *closed* ledgers of a recorded list the log no longer
/// has (`in_log` says whether it has one): retention appends the ledgers'
/// deletion records before the new topic record, so a crash in between
/// leaves such a prefix, which the loader drops. A closed ledger is never
/// empty (an empty ledger does not roll over), so "not in the log" means
/// deleted. Missing ledgers after a present one are not dropped: they are
/// damage, and reading them reports it.
pub fn deleted_prefix(list: &[LedgerInfo], in_log: impl Fn(u64) -> bool) -> usize {
    assert!(!list.is_empty(), "a topic record lists a ledger");
    let closed = list.len() - 1;
    list[..closed].iter().take_while(|l| !in_log(l.id)).count()
}

/// Where a `(ledger, entry)` lies among a topic's ledgers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lookup {
    /// A stored position (for the current ledger: possibly not appended yet;
    /// the caller compares with the topic's next position).
    At(u64),
    /// In a ledger that retention deleted: older than everything stored.
    Trimmed,
    /// Not a ledger (or entry) of this topic.
    Unknown,
}

/// A topic's ledgers, oldest first, the last one current. Never empty.
/// Owned by the topic's shard; never crosses cores.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicLedgers {
    list: Vec<LedgerInfo>,
}

impl TopicLedgers {
    /// From a decoded list (see [`decode_topic_record`]).
    pub fn new(list: Vec<LedgerInfo>) -> Self {
        assert!(!list.is_empty(), "a topic has a current ledger");
        assert!(list.windows(2).all(|w| w[0].id < w[1].id && w[1].first == w[0].end()));
        Self { list }
    }

    pub fn all(&self) -> &[LedgerInfo] {
        &self.list
    }

    pub fn current(&self) -> &LedgerInfo {
        self.list.last().expect("never empty")
    }

    /// First stored position (older ones were deleted by retention).
    pub fn start(&self) -> u64 {
        self.list[0].first
    }

    /// The position the next append gets.
    pub fn next(&self) -> u64 {
        self.current().end()
    }

    /// Body bytes stored in all ledgers.
    pub fn bytes(&self) -> u64 {
        self.list.iter().map(|l| l.bytes).sum()
    }

    /// Records one append to the current ledger.
    pub fn appended(&mut self, entry: u64, bytes: u64) {
        let cur = self.list.last_mut().expect("never empty");
        assert_eq!(entry, cur.entries, "entry ids of a ledger are dense");
        cur.entries += 1;
        cur.bytes += bytes;
    }

    /// Closes the current ledger at `now_ms` and opens `id` after it.
    pub fn roll(&mut self, id: u64, now_ms: u64) {
        let cur = self.list.last_mut().expect("never empty");
        assert!(id > cur.id, "ledger ids of a topic grow ({id} after {})", cur.id);
        cur.closed_ms = now_ms;
        let first = cur.end();
        self.list.push(LedgerInfo { id, first, entries: 0, bytes: 0, created_ms: now_ms, closed_ms: 0 });
        assert!(self.list.len() <= TOPIC_LEDGERS_MAX, "more ledgers than a topic record holds");
    }

    /// Forgets the `n` oldest ledgers (never the current one).
    pub fn trim_front(&mut self, n: usize) {
        assert!(n < self.list.len(), "the current ledger is never trimmed");
        self.list.drain(..n);
    }

    /// `(ledger, entry)` of a stored position, `None` outside `[start, next)`.
    pub fn locate(&self, pos: u64) -> Option<(u64, u64)> {
        if pos < self.start() || pos >= self.next() {
            return None;
        }
        // The last ledger starting at or before `pos` holds it (empty
        // ledgers share their successor's first position).
        let i = self.list.partition_point(|l| l.first <= pos).checked_sub(1)?;
        let l = &self.list[i];
        Some((l.id, pos - l.first))
    }

    /// One past the last position of the ledger holding `pos`; `u64::MAX`
    /// for the current ledger (it grows), `None` when `pos` is not stored.
    pub fn ledger_end(&self, pos: u64) -> Option<u64> {
        self.locate(pos)?;
        let i = self.list.partition_point(|l| l.first <= pos);
        Some(if i == self.list.len() { u64::MAX } else { self.list[i - 1].end() })
    }

    /// The message id of a stored position.
    pub fn message_id(&self, pos: u64, partition: i32) -> Option<MessageId> {
        self.locate(pos).map(|(l, e)| MessageId::new(l, e, partition, -1))
    }

    /// The position of `ledger:entry`.
    pub fn lookup(&self, ledger: u64, entry: u64) -> Lookup {
        match self.list.binary_search_by_key(&ledger, |l| l.id) {
            Ok(i) => {
                let l = &self.list[i];
                if i + 1 < self.list.len() && entry >= l.entries {
                    return Lookup::Unknown;
                }
                l.first.checked_add(entry).map_or(Lookup::Unknown, Lookup::At)
            }
            Err(0) => Lookup::Trimmed,
            Err(_) => Lookup::Unknown,
        }
    }

    pub fn encode(&self) -> Vec<u8> {
        encode_topic_record(&self.list)
    }
}

/// When a topic's current ledger rolls over (Pulsar's
/// `managedLedgerMaxEntriesPerLedger`, `…MaxSizePerLedgerMbytes`,
/// `…MaxLedgerRolloverTimeMinutes`, `…MinLedgerRolloverTimeMinutes`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rollover {
    pub max_entries: u64,
    /// Body bytes.
    pub max_bytes: u64,
    pub max_age_ms: u64,
    /// A ledger younger than this never rolls over for entries or bytes
    /// (keeps ledger counts down under bursts); age alone rolls at max age.
    pub min_age_ms: u64,
}

impl Default for Rollover {
    fn default() -> Self {
        Self { max_entries: 50_000, max_bytes: 2 << 30, max_age_ms: 4 * 3_600_000, min_age_ms: 10 * 60_000 }
    }
}

impl Rollover {
    /// Whether `cur` (the current ledger) should be closed now. An empty
    /// ledger never rolls over.
    ///
    /// Each rollover rewrites the whole topic record (48 B a ledger), so
    /// with many ledgers kept (unbounded retention, a stuck subscription)
    /// the bytes written would grow with the square of the ledger count:
    /// 20,000 messages of 100 B in 10-entry ledgers wrote 92 MiB of topic
    /// records for 1.9 MiB of payload (`bench/scripts/topic_record_growth.sh`).
    /// So once the record passes [`TOPIC_RECORD_FREE_BYTES`], a ledger rolls
    /// over for its entries or bytes only when it holds at least
    /// [`TOPIC_RECORD_DATA_RATIO`] times the new record's bytes: records
    /// then cost at most 1/16 of the data written, and the ledger grows
    /// past `max_entries` instead. Age rollovers (rare: hours) stay as they
    /// are. The record's format does not change.
    pub fn due(&self, ledgers: &TopicLedgers, now_ms: u64) -> bool {
        let n = ledgers.all().len();
        if n >= TOPIC_LEDGERS_MAX {
            return false;
        }
        let cur = ledgers.current();
        if !self.due_for(cur, now_ms) {
            return false;
        }
        let record_bytes = topic_record_bytes(n + 1);
        now_ms.saturating_sub(cur.created_ms) >= self.max_age_ms
            || record_bytes <= TOPIC_RECORD_FREE_BYTES
            || cur.bytes >= record_bytes.saturating_mul(TOPIC_RECORD_DATA_RATIO)
    }

    /// [`due`](Self::due) for the current ledger alone.
    pub fn due_for(&self, cur: &LedgerInfo, now_ms: u64) -> bool {
        let age = now_ms.saturating_sub(cur.created_ms);
        cur.entries > 0
            && (age >= self.max_age_ms
                || (age >= self.min_age_ms && (cur.entries >= self.max_entries || cur.bytes >= self.max_bytes)))
    }
}

/// A namespace's (or topic's) retention, as enforced: `None` = unbounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Keep acknowledged ledgers closed less than this long ago.
    pub time_ms: Option<u64>,
    /// Keep at most this many bytes of acknowledged ledgers.
    pub size_bytes: Option<u64>,
}

impl Retention {
    /// From the namespace policy values (-1 = unbounded, 0 = nothing).
    pub fn from_policy(minutes: i64, size_mb: i64) -> Self {
        let time_ms = u64::try_from(minutes).ok().map(|m| m.saturating_mul(60_000));
        let size_bytes = u64::try_from(size_mb).ok().map(|m| m.saturating_mul(1 << 20));
        Self { time_ms, size_bytes }
    }
}

/// How many of the oldest ledgers retention deletes now (Pulsar's trim):
/// walking from the oldest, a ledger goes when it is closed, every entry in
/// it is acknowledged by every durable subscription (it ends at or below
/// `ack_floor`, the slowest subscription's first unacknowledged position,
/// or the next position when there is no subscription), and it is beyond
/// retention: closed longer ago than the retention time, or the
/// acknowledged ledgers still kept exceed the retention size. The walk
/// stops at the first ledger that must stay, so only a prefix goes.
/// Unbounded time and size keep everything; 0 and 0 delete as soon as acked.
pub fn ledgers_to_delete(ledgers: &[LedgerInfo], ack_floor: u64, now_ms: u64, retention: Retention) -> usize {
    assert!(!ledgers.is_empty(), "a topic has a current ledger");
    let closed = ledgers.len() - 1;
    let acked: Vec<&LedgerInfo> = ledgers[..closed].iter().take_while(|l| l.end() <= ack_floor).collect();
    let acked_bytes: u64 = acked.iter().map(|l| l.bytes).sum();
    let mut deleted_bytes = 0u64;
    let mut n = 0;
    for l in acked {
        let expired = retention.time_ms.is_some_and(|t| now_ms.saturating_sub(l.closed_ms) > t);
        let over_size = retention.size_bytes.is_some_and(|s| acked_bytes - deleted_bytes > s);
        if !(expired || over_size) {
            break;
        }
        deleted_bytes += l.bytes;
        n += 1;
    }
    n
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(id: u64, first: u64, entries: u64, bytes: u64, closed_ms: u64) -> LedgerInfo {
        LedgerInfo { id, first, entries, bytes, created_ms: 1, closed_ms }
    }

    /// Three closed ledgers of 10 entries / 1000 bytes, closed at 100, 200,
    /// 300 ms, and the current one.
    fn four() -> Vec<LedgerInfo> {
        vec![
            ledger(1024, 0, 10, 1000, 100),
            ledger(2048, 10, 10, 1000, 200),
            ledger(3072, 20, 10, 1000, 300),
            ledger(4096, 30, 5, 500, 0),
        ]
    }

    #[test]
    fn record_v2_round_trips_and_v1_still_decodes() {
        let mut l = four();
        let bytes = encode_topic_record(&l);
        // The current ledger's counters are not recorded (the log has them).
        l[3] = LedgerInfo { entries: 0, bytes: 0, closed_ms: 0, ..l[3].clone() };
        assert_eq!(decode_topic_record(&bytes), Some(l));
        for cut in 0..bytes.len() {
            assert_eq!(decode_topic_record(&bytes[..cut]), None, "cut at {cut}");
        }
        let mut v1 = vec![1u8];
        v1.extend_from_slice(&7u64.to_le_bytes());
        let d = decode_topic_record(&v1).unwrap();
        assert_eq!((d.len(), d[0].id, d[0].first), (1, 7, 0));
        // Positions that do not follow on are damage.
        let mut bad = four();
        bad[1].first = 11;
        assert_eq!(decode_topic_record(&encode_topic_record(&bad)), None);
    }

    #[test]
    fn positions_map_to_ids_across_ledgers() {
        let mut l = four();
        // An empty ledger between two others shares its successor's start.
        l.insert(2, ledger(2500, 20, 0, 0, 250));
        let t = TopicLedgers::new(l);
        assert_eq!((t.start(), t.next()), (0, 35));
        assert_eq!(t.locate(0), Some((1024, 0)));
        assert_eq!(t.locate(19), Some((2048, 9)));
        assert_eq!(t.locate(20), Some((3072, 0)));
        assert_eq!(t.locate(34), Some((4096, 4)));
        assert_eq!(t.locate(35), None);
        assert_eq!(t.lookup(3072, 0), Lookup::At(20));
        assert_eq!(t.lookup(3072, 10), Lookup::Unknown, "past a closed ledger's end");
        assert_eq!(t.lookup(4096, 9), Lookup::At(39), "the current ledger may grow");
        assert_eq!(t.lookup(5000, 0), Lookup::Unknown);
        let mut t = t;
        t.trim_front(2);
        assert_eq!(t.start(), 20);
        assert_eq!(t.lookup(1024, 3), Lookup::Trimmed);
        assert_eq!(t.locate(5), None);
        t.roll(9999, 400);
        assert_eq!((t.current().id, t.current().first, t.next()), (9999, 35, 35));
    }

    #[test]
    fn rollover_by_entries_bytes_and_age_after_the_minimum() {
        let r = Rollover { max_entries: 10, max_bytes: 1000, max_age_ms: 5000, min_age_ms: 100 };
        let cur = |entries, bytes| LedgerInfo { id: 1, first: 0, entries, bytes, created_ms: 1000, closed_ms: 0 };
        assert!(!r.due_for(&cur(9, 999), 1200));
        assert!(r.due_for(&cur(10, 0), 1200));
        assert!(r.due_for(&cur(1, 1000), 1200));
        assert!(!r.due_for(&cur(10, 1000), 1050), "younger than the minimum");
        assert!(r.due_for(&cur(1, 1), 6000), "by age");
        assert!(!r.due_for(&cur(0, 0), 60_000), "an empty ledger stays");
        assert!(r.due(&TopicLedgers::new(vec![cur(10, 0)]), 1200));
        let full: Vec<LedgerInfo> = (0..TOPIC_LEDGERS_MAX as u64)
            .map(|i| LedgerInfo { id: i + 1, first: i * 10, entries: 10, bytes: 0, created_ms: 1000, closed_ms: 1 })
            .collect();
        assert!(!r.due(&TopicLedgers::new(full), 1200), "a full ledger list stops rolling");
    }

    /// Past 16 KiB of topic record, a ledger full by its entry count rolls
    /// over only once it holds 16 × the record's bytes; by age it always
    /// does; below 16 KiB the record's size does not matter.
    #[test]
    fn rollover_keeps_the_topic_record_a_fraction_of_the_data() {
        let r = Rollover { max_entries: 10, max_bytes: 1 << 40, max_age_ms: 5000, min_age_ms: 0 };
        let list = |n: u64, cur_bytes: u64| {
            let mut l: Vec<LedgerInfo> = (0..n)
                .map(|i| LedgerInfo {
                    id: i + 1,
                    first: i * 10,
                    entries: 10,
                    bytes: 100,
                    created_ms: 1000,
                    closed_ms: 1,
                })
                .collect();
            let last = l.last_mut().unwrap();
            (last.bytes, last.closed_ms) = (cur_bytes, 0);
            TopicLedgers::new(l)
        };
        let free = (TOPIC_RECORD_FREE_BYTES as usize - 5) / LEDGER_RECORD_BYTES;
        assert!(topic_record_bytes(free) <= TOPIC_RECORD_FREE_BYTES);
        assert!(topic_record_bytes(free + 1) > TOPIC_RECORD_FREE_BYTES);
        assert!(r.due(&list(free as u64 - 1, 100), 1200), "below the free size: by entries");
        assert!(!r.due(&list(free as u64, 100), 1200), "past it: 100 B is too little");
        let need = topic_record_bytes(free + 1) * TOPIC_RECORD_DATA_RATIO;
        assert!(!r.due(&list(free as u64, need - 1), 1200));
        assert!(r.due(&list(free as u64, need), 1200));
        assert!(r.due(&list(free as u64, 100), 6000), "by age");
    }

    #[test]
    fn ledgers_deleted_before_the_record_was_rewritten_are_dropped_at_load() {
        let l = four();
        assert_eq!(deleted_prefix(&l, |_| true), 0);
        assert_eq!(deleted_prefix(&l, |id| id > 2048), 2);
        assert_eq!(deleted_prefix(&l, |id| id != 2048), 0, "a hole after a present ledger is not retention's");
        assert_eq!(deleted_prefix(&l, |_| false), 3, "never the current ledger (empty, so not in the log)");
    }

    #[test]
    fn retention_deletes_only_acked_closed_ledgers_beyond_retention() {
        let l = four();
        let none = Retention { time_ms: Some(0), size_bytes: Some(0) };
        // Defaults (0, 0): whatever every subscription acknowledged goes,
        // never the current ledger.
        assert_eq!(ledgers_to_delete(&l, 35, 1000, none), 3);
        assert_eq!(ledgers_to_delete(&l, 25, 1000, none), 2, "ledger 3 is half acked");
        assert_eq!(ledgers_to_delete(&l, 9, 1000, none), 0);
        // Unbounded both ways: nothing goes.
        let forever = Retention { time_ms: None, size_bytes: None };
        assert_eq!(ledgers_to_delete(&l, 35, 1000, forever), 0);
        // By time only: closed more than 150 ms before now=400.
        let time = Retention { time_ms: Some(150), size_bytes: None };
        assert_eq!(ledgers_to_delete(&l, 35, 400, time), 2);
        // By size only: keep at most 1500 bytes of acked ledgers.
        let size = Retention { time_ms: None, size_bytes: Some(1500) };
        assert_eq!(ledgers_to_delete(&l, 35, 400, size), 2);
        assert_eq!(ledgers_to_delete(&l, 20, 400, size), 1);
        // Either limit deletes: the time limit keeps all, the size limit not.
        let both = Retention { time_ms: Some(10_000), size_bytes: Some(2000) };
        assert_eq!(ledgers_to_delete(&l, 35, 400, both), 1);
        assert_eq!(Retention::from_policy(-1, 0), Retention { time_ms: None, size_bytes: Some(0) });
        assert_eq!(Retention::from_policy(2, -1), Retention { time_ms: Some(120_000), size_bytes: None });
    }
}
