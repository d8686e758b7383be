//! Per-subscription statistics of a topic ([`TopicStats`], the admin
//! command `magnetar admin subscriptions stats TOPIC`), taken on the owner
//! shard from its subscriptions; and the meters and counters they read.

use crate::api::{ConsumerStats, LedgerStats, SubscriptionMetrics, SubscriptionStats, TopicMetrics, TopicStats};
use crate::subscription::dispatcher::Policy;
use crate::topic::Topic;
use std::cell::Cell;

/// Shortest span a rate is measured over.
const RATE_WINDOW_MS: u64 = 1_000;

/// Messages and bytes per second, over the last window of at least
/// `RATE_WINDOW_MS` (or the current one, once it is that long). Owned by
/// one shard; never crosses cores.
#[derive(Debug, Default)]
pub(crate) struct RateMeter {
    window_start_ms: Cell<u64>,
    msgs: Cell<u64>,
    bytes: Cell<u64>,
    /// Rates of the last closed window, and when it closed.
    last: Cell<(f64, f64)>,
    last_end_ms: Cell<u64>,
    /// Messages and bytes recorded since the topic was loaded (the
    /// metrics' `_total` counters).
    total_msgs: Cell<u64>,
    total_bytes: Cell<u64>,
}

impl RateMeter {
    pub(crate) fn record(&self, now_ms: u64, msgs: u64, bytes: u64) {
        self.roll(now_ms);
        self.msgs.set(self.msgs.get() + msgs);
        self.bytes.set(self.bytes.get() + bytes);
        self.total_msgs.set(self.total_msgs.get() + msgs);
        self.total_bytes.set(self.total_bytes.get() + bytes);
    }

    /// `(messages, bytes)` recorded since the topic was loaded.
    pub(crate) fn totals(&self) -> (u64, u64) {
        (self.total_msgs.get(), self.total_bytes.get())
    }

    fn roll(&self, now_ms: u64) {
        let start = self.window_start_ms.get();
        if start == 0 {
            self.window_start_ms.set(now_ms);
            return;
        }
        let span = now_ms.saturating_sub(start);
        if span >= RATE_WINDOW_MS {
            let per_s = 1000.0 / span as f64;
            self.last.set((self.msgs.get() as f64 * per_s, self.bytes.get() as f64 * per_s));
            self.last_end_ms.set(now_ms);
            self.window_start_ms.set(now_ms);
            self.msgs.set(0);
            self.bytes.set(0);
        }
    }

    /// `(messages/s, bytes/s)` at `now_ms`. A window that closed more than
    /// a window ago says nothing about now: then the open window (at least
    /// a window long by then) is measured instead.
    pub(crate) fn rates(&self, now_ms: u64) -> (f64, f64) {
        self.roll(now_ms);
        if now_ms.saturating_sub(self.last_end_ms.get()) <= RATE_WINDOW_MS {
            self.last.get()
        } else {
            (0.0, 0.0)
        }
    }
}

/// Messages per batch entry of a topic (entries of one message are not
/// kept), learned at append and when a dispatcher reads an entry, so that
/// backlogs can be counted in messages without reading entries. After a
/// restart, a batch not read since counts as one message. Bounded: every
/// `PRUNE_EVERY` notes, batches every subscription has acknowledged (below
/// the lowest ack floor) are dropped; and at most `BATCH_SIZES_TRACKED_MAX`
/// batches are kept (the lowest: the next to be consumed), since a stalled
/// subscription holds the floor while producers append without limit.
/// Batches past that count as one message. Owned by the topic's shard.
#[derive(Debug, Default)]
pub(crate) struct BatchSizes {
    /// Topic position → messages.
    sizes: std::cell::RefCell<std::collections::BTreeMap<u64, u32>>,
    notes: Cell<u64>,
}

const PRUNE_EVERY: u64 = 1024;

/// Most batch sizes a topic keeps (a few MiB at worst).
const BATCH_SIZES_TRACKED_MAX: usize = 1 << 16;

impl BatchSizes {
    /// Position `key` holds `messages` messages. `floor` gives the lowest
    /// position still unacknowledged by some subscription, for pruning.
    pub(crate) fn note(&self, key: u64, messages: u32, floor: impl FnOnce() -> u64) {
        if messages <= 1 {
            return;
        }
        {
            let mut sizes = self.sizes.borrow_mut();
            sizes.insert(key, messages);
            if sizes.len() > BATCH_SIZES_TRACKED_MAX {
                sizes.pop_last();
            }
        }
        self.notes.set(self.notes.get() + 1);
        if self.notes.get().is_multiple_of(PRUNE_EVERY) {
            let keep = self.sizes.borrow_mut().split_off(&floor());
            *self.sizes.borrow_mut() = keep;
        }
    }

    /// Messages beyond one per entry in the batches at positions
    /// `from..to` that `acked` does not cover.
    fn extra_messages(&self, from: u64, to: u64, acked: impl Fn(u64) -> bool) -> u64 {
        self.sizes.borrow().range(from..to.max(from)).filter(|(e, _)| !acked(**e)).map(|(_, n)| u64::from(n - 1)).sum()
    }
}

/// A subscription's dispatch counters. Owned by the topic's shard.
#[derive(Debug, Default)]
pub(crate) struct SubCounters {
    /// Entries the dispatcher read from storage.
    pub(crate) entries_read: Cell<u64>,
    /// Entries a tag filter skipped from the index alone, unread.
    pub(crate) skipped_by_index: Cell<u64>,
    /// Messages and bytes sent to consumers.
    pub(crate) out: RateMeter,
}

/// Bytes of the entries of `t` not acknowledged by a subscription whose
/// cursor is `cursor`, from the index in memory (no entry and no index page
/// is read). A partly acknowledged batch counts whole. Exact for the first
/// 65,536 entries of the backlog while their index pages are in memory,
/// estimated past them and for those whose pages are not (see
/// [`backlog_bytes_by`]).
fn backlog_bytes(log: &magnetar_storage::EntryLog, t: &Topic, cursor: &crate::subscription::cursor::Cursor) -> u64 {
    backlog_bytes_by(cursor, t.durable_next.get(), |e| {
        let (l, e) = t.ledgers.borrow().locate(e)?;
        log.index_entry_peek(l, e).map(|ie| u64::from(ie.body_len))
    })
}

/// Most index lookups one subscription's `backlog_bytes` makes.
const BACKLOG_BYTES_LOOKUPS_MAX: u64 = 1 << 16;

/// [`backlog_bytes`] over `len` (an entry's stored bytes, from the index).
/// Past `BACKLOG_BYTES_LOOKUPS_MAX` unacknowledged entries, the rest count
/// at the mean size of those looked up, and so do those `len` does not
/// know: a stats request holds the shard for a bounded time whatever the
/// backlog.
fn backlog_bytes_by(
    cursor: &crate::subscription::cursor::Cursor,
    next: u64,
    mut len: impl FnMut(u64) -> Option<u64>,
) -> u64 {
    let (mut bytes, mut found, mut lookups) = (0u64, 0u64, 0u64);
    let mut e = cursor.ack_floor;
    while e < next && lookups < BACKLOG_BYTES_LOOKUPS_MAX {
        if !cursor.acked.contains(e) {
            lookups += 1;
            if let Some(n) = len(e) {
                bytes += n;
                found += 1;
            }
        }
        e += 1;
    }
    if found > 0 && found < lookups {
        let estimate = u128::from(lookups - found) * u128::from(bytes) / u128::from(found);
        bytes = bytes.saturating_add(u64::try_from(estimate).unwrap_or(u64::MAX));
        found = lookups;
    }
    if e < next && found > 0 {
        let rest = (next - e) - cursor.acked.count_in(e, next);
        let estimate = u128::from(rest) * u128::from(bytes) / u128::from(found);
        bytes = bytes.saturating_add(u64::try_from(estimate).unwrap_or(u64::MAX));
    }
    bytes
}

/// The statistics of `t` now (see [`TopicStats`] for what each figure
/// means). `next_entry`, `ack_floor` and a ledger's `first` are topic
/// positions (entries numbered across ledgers, see `ledgers.rs`).
pub(crate) fn topic_stats(log: &magnetar_storage::EntryLog, t: &Topic) -> TopicStats {
    let now = crate::clock::now_ms();
    let (msg_rate_in, byte_rate_in) = t.rate_in.rates(now);
    let ledgers = t
        .ledgers
        .borrow()
        .all()
        .iter()
        .map(|x| LedgerStats { ledger: x.id, first: x.first, entries: x.entries, bytes: x.bytes })
        .collect();
    let subs = t.subs.borrow();
    let mut names: Vec<&String> = subs.keys().collect();
    names.sort();
    let mut subscriptions = Vec::with_capacity(names.len());
    for name in names {
        let Some(s) = subs.get(name) else { continue };
        let cursor = s.cursor.borrow();
        let next = t.durable_next.get();
        let above_floor = cursor.acked.count_in(cursor.ack_floor, next);
        let backlog = next.saturating_sub(cursor.ack_floor).saturating_sub(above_floor);
        let partly_acked: u64 = s.batch_acks.borrow().iter().map(|(_, bits)| u64::from(bits.acked_count())).sum();
        let backlog_messages = (backlog
            + t.batch_sizes.extra_messages(cursor.ack_floor, next, |e| cursor.acked.contains(e)))
        .saturating_sub(partly_acked);
        let policy = s.policy.borrow();
        let active = match &*policy {
            Policy::Single(a) => a.current,
            _ => None,
        };
        let single = matches!(&*policy, Policy::Single(_));
        let (msg_rate_out, byte_rate_out) = s.counters.out.rates(now);
        let consumers = s
            .consumers
            .borrow()
            .iter()
            .map(|c| ConsumerStats {
                name: c.name.clone(),
                priority: c.priority,
                permits: c.permits,
                unacked: c.unacked,
                active: active == Some(c.consumer) || !single,
                address: c.address.clone(),
                redelivered: c.redelivered,
            })
            .collect();
        subscriptions.push(SubscriptionStats {
            name: name.clone(),
            sub_type: s.sub_type.get(),
            ack_floor: cursor.ack_floor,
            msg_backlog: backlog,
            backlog_messages,
            backlog_bytes: backlog_bytes(log, t, &cursor),
            unacked: s.pending.borrow().len() as u64,
            delayed: s.delayed.borrow().len() as u64,
            replay: s.replay.borrow().len() as u64,
            msg_out_total: s.delivered_total.get(),
            msg_rate_out,
            byte_rate_out,
            durable: s.durable,
            filter_tag: s.filter_tag.borrow().clone(),
            allocation: s.allocation.borrow().strategy.as_str(),
            entries_read: s.counters.entries_read.get(),
            skipped_by_index: s.counters.skipped_by_index.get(),
            partial_batches: s.batch_acks.borrow().len() as u64,
            consumers,
        });
    }
    TopicStats {
        topic: t.key.clone(),
        next_entry: t.next_entry.get(),
        ledgers,
        msg_rate_in,
        byte_rate_in,
        subscriptions,
    }
}

/// The metrics figures of `t` now (see [`TopicMetrics`]): no index
/// lookups, so a scrape of many topics stays cheap for the shard.
pub(crate) fn topic_metrics(t: &Topic) -> TopicMetrics {
    let now = crate::clock::now_ms();
    let (msg_rate_in, byte_rate_in) = t.rate_in.rates(now);
    let (msg_in_total, bytes_in_total) = t.rate_in.totals();
    let storage_bytes = t.ledgers.borrow().all().iter().map(|l| l.bytes).sum();
    let subs = t.subs.borrow();
    let mut subscriptions: Vec<SubscriptionMetrics> = subs
        .iter()
        .map(|(name, s)| {
            let cursor = s.cursor.borrow();
            let next = t.durable_next.get();
            let above_floor = cursor.acked.count_in(cursor.ack_floor, next);
            let backlog = next.saturating_sub(cursor.ack_floor).saturating_sub(above_floor);
            let partly_acked: u64 = s.batch_acks.borrow().iter().map(|(_, bits)| u64::from(bits.acked_count())).sum();
            let backlog_messages = (backlog
                + t.batch_sizes.extra_messages(cursor.ack_floor, next, |e| cursor.acked.contains(e)))
            .saturating_sub(partly_acked);
            let (msg_rate_out, byte_rate_out) = s.counters.out.rates(now);
            let (msg_out_total, bytes_out_total) = s.counters.out.totals();
            SubscriptionMetrics {
                name: name.clone(),
                backlog_messages,
                unacked: s.pending.borrow().len() as u64,
                delayed: s.delayed.borrow().len() as u64,
                msg_rate_out,
                byte_rate_out,
                msg_out_total,
                bytes_out_total,
                consumers: s.consumers.borrow().len() as u64,
            }
        })
        .collect();
    subscriptions.sort_by(|a, b| a.name.cmp(&b.name));
    TopicMetrics {
        topic: t.key.clone(),
        producers: t.producers.borrow().len() as u64,
        msg_rate_in,
        byte_rate_in,
        msg_in_total,
        bytes_in_total,
        storage_bytes,
        subscriptions,
    }
}

#[cfg(test)]
mod tests {
    use super::{backlog_bytes_by, BatchSizes, RateMeter, BATCH_SIZES_TRACKED_MAX, PRUNE_EVERY};

    #[test]
    fn backlog_bytes_looks_up_a_bounded_number_of_entries() {
        // A stats request runs on the topic's shard: with a backlog of
        // millions of entries it must not look each one up.
        let mut cursor = crate::subscription::cursor::Cursor::new(0);
        cursor.ack(1);
        let mut lookups = 0u64;
        let next = 5_000_000;
        let bytes = backlog_bytes_by(&cursor, next, |e| {
            lookups += 1;
            Some(100 + e % 2)
        });
        assert!(lookups <= super::BACKLOG_BYTES_LOOKUPS_MAX, "{lookups} index lookups");
        // Mean 100.5 bytes over the 4,999,999 unacked entries.
        let exact = 4_999_999 * 100 + 2_499_999;
        assert!(bytes.abs_diff(exact) * 1000 < exact, "{bytes} vs {exact}");
        // A small backlog is exact.
        let mut lookups = 0u64;
        assert_eq!(
            backlog_bytes_by(&cursor, 10, |e| {
                lookups += 1;
                Some(e)
            }),
            45 - 1
        );
        assert_eq!(lookups, 9);
    }

    #[test]
    fn batch_sizes_stay_bounded_behind_a_stalled_subscription() {
        // The floor never moves (a subscription that never acks) while
        // batches keep coming.
        let b = BatchSizes::default();
        let n = BATCH_SIZES_TRACKED_MAX as u64 * 3;
        for e in 0..n {
            b.note(e, 10, || 0);
        }
        assert!(b.sizes.borrow().len() <= BATCH_SIZES_TRACKED_MAX, "{} sizes kept", b.sizes.borrow().len());
        // The lowest are kept: the next to be consumed count exactly.
        assert_eq!(b.extra_messages(0, 100, |_| false), 900);
        // The others count as one message each.
        assert_eq!(b.extra_messages(n - 100, n, |_| false), 0);
    }

    #[test]
    fn batch_sizes_count_extra_messages_and_prune() {
        let b = BatchSizes::default();
        b.note(3, 10, || 0);
        b.note(4, 1, || 0);
        b.note(7, 5, || 0);
        assert_eq!(b.extra_messages(0, 10, |_| false), 9 + 4);
        assert_eq!(b.extra_messages(0, 10, |e| e == 3), 4);
        assert_eq!(b.extra_messages(4, 7, |_| false), 0, "end is exclusive");
        assert_eq!(b.extra_messages(10, 5, |_| false), 0, "an empty range");
        for e in 10..10 + PRUNE_EVERY {
            b.note(e, 2, || 9);
        }
        assert_eq!(b.extra_messages(0, 9, |_| false), 0, "pruned below the floor");
        assert_eq!(b.extra_messages(10, 11, |_| false), 1, "kept above it");
    }

    #[test]
    fn rate_covers_the_last_window() {
        let m = RateMeter::default();
        m.record(10_000, 0, 0);
        for i in 0..10 {
            m.record(10_000 + i * 100, 5, 500);
        }
        assert_eq!(m.rates(10_500), (0.0, 0.0), "no window closed yet");
        let (msgs, bytes) = m.rates(11_000);
        assert!((msgs - 50.0).abs() < 1e-9 && (bytes - 5000.0).abs() < 1e-9, "{msgs} {bytes}");
        assert_eq!(m.rates(11_900), (msgs, bytes), "still the last window");
        // Idle for long: the open window (nothing in it) is measured.
        assert_eq!(m.rates(15_000), (0.0, 0.0));
    }
}
