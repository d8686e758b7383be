//! A shard's metrics: counters and histograms registered once, when the
//! shard starts, and written where the work happens (publish, dispatch,
//! acks, cross-shard hops, connections). Exporting them (Prometheus, the
//! HTTP door) is a later door's job; this is their home.
//!
//! Written only by the shard's own thread; read by anyone (an exporter on
//! another thread) without a mesh hop. Hence atomics with relaxed ordering:
//! a single writer per value, and a reader that only needs each value to be
//! some value it had, not a consistent cut across values.

pub use magnetar_storage::FlushStats;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A monotonic count.
#[derive(Debug, Default)]
pub struct Counter(AtomicU64);

impl Counter {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// A value that goes up and down (bytes in flight, microseconds spent in
/// recovery): one writer, the shard's thread.
#[derive(Debug, Default)]
pub struct Gauge(AtomicU64);

impl Gauge {
    pub fn add(&self, n: u64) {
        self.0.fetch_add(n, Ordering::Relaxed);
    }

    /// `n` must have been added before (the gauge never goes below 0).
    pub fn sub(&self, n: u64) {
        let before = self.0.fetch_sub(n, Ordering::Relaxed);
        assert!(before >= n, "gauge below zero: {before} - {n}");
    }

    pub fn set(&self, v: u64) {
        self.0.store(v, Ordering::Relaxed);
    }

    pub fn get(&self) -> u64 {
        self.0.load(Ordering::Relaxed)
    }
}

/// Buckets of a [`Histogram`]: bucket `i` counts values `v` with
/// `2^(i-1) <= v < 2^i` (bucket 0: `v == 0`); the last one takes the rest.
pub const HISTOGRAM_BUCKETS: usize = 40;
// The storage's flush distributions use the same buckets, so exporters
// render both alike.
const _: () = assert!(HISTOGRAM_BUCKETS == magnetar_storage::FLUSH_HISTOGRAM_BUCKETS);

/// A distribution of `u64` values (microseconds, entries, bytes) in
/// power-of-two buckets: recording is two relaxed additions and a
/// leading-zeros count, with no allocation and no lock.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; HISTOGRAM_BUCKETS],
    count: AtomicU64,
    sum: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self { buckets: std::array::from_fn(|_| AtomicU64::new(0)), count: AtomicU64::new(0), sum: AtomicU64::new(0) }
    }
}

/// The bucket of `v`; see [`HISTOGRAM_BUCKETS`].
fn bucket_of(v: u64) -> usize {
    let bits = (u64::BITS - v.leading_zeros()) as usize;
    bits.min(HISTOGRAM_BUCKETS - 1)
}

impl Histogram {
    pub fn record(&self, v: u64) {
        self.buckets[bucket_of(v)].fetch_add(1, Ordering::Relaxed);
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(v, Ordering::Relaxed);
    }

    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            count: self.count.load(Ordering::Relaxed),
            sum: self.sum.load(Ordering::Relaxed),
        }
    }
}

/// A histogram's values at one moment. `upper_bound(i)` is the exclusive
/// upper bound of bucket `i` (`None` for the last, unbounded one).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HistogramSnapshot {
    pub buckets: [u64; HISTOGRAM_BUCKETS],
    pub count: u64,
    pub sum: u64,
}

impl HistogramSnapshot {
    /// A distribution the storage keeps in the same buckets.
    pub fn from_buckets(buckets: [u64; HISTOGRAM_BUCKETS], sum: u64) -> Self {
        Self { buckets, count: buckets.iter().sum(), sum }
    }

    pub fn upper_bound(i: usize) -> Option<u64> {
        (i + 1 < HISTOGRAM_BUCKETS).then(|| 1u64 << i)
    }
}

/// Every figure one shard keeps. Shared (`Arc`) between the shard, which
/// writes it, and whoever exports it.
#[derive(Debug, Default)]
pub struct ShardMetrics {
    /// Messages and payload bytes appended by producers (a batch counts
    /// its messages).
    pub messages_in: Counter,
    pub bytes_in: Counter,
    /// Microseconds from a send reaching its owner shard to its entry
    /// being durable (what the receipt waits for on the broker).
    pub publish_latency_us: Histogram,
    /// Entries handed to consumers (a run counts each entry; a batch is one
    /// entry) and their bytes, on the topic's owner shard.
    pub entries_out: Counter,
    pub bytes_out: Counter,
    /// Ack requests applied (one per request, whatever its id count).
    pub acks: Counter,
    /// Producer and consumer requests this shard routed to a topic's owner
    /// on another shard, and consumer events it sent to a consumer's
    /// connection on another shard (a run counts one per entry).
    pub cross_shard_requests: Counter,
    pub cross_shard_events: Counter,
    /// Connections accepted and closed on this shard's ports.
    pub connections_opened: Counter,
    pub connections_closed: Counter,
    /// Payload bytes of sends received on this shard's connections and not
    /// yet answered.
    pub inflight_bytes: Gauge,
    /// Microseconds this shard took to open and recover its entry log at
    /// start.
    pub recovery_us: Gauge,
    /// Topics loaded on this shard now, and topics unloaded for being idle
    /// since the start (`shard/unload.rs`).
    pub topics_loaded: Gauge,
    pub topics_unloaded: Counter,
}

/// A shard's metrics and the storage figures of its log, at one moment.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMetricsSnapshot {
    pub shard: u32,
    pub messages_in: u64,
    pub bytes_in: u64,
    pub publish_latency_us: HistogramSnapshot,
    pub entries_out: u64,
    pub bytes_out: u64,
    pub acks: u64,
    pub cross_shard_requests: u64,
    pub cross_shard_events: u64,
    pub connections_opened: u64,
    pub connections_closed: u64,
    pub inflight_bytes: u64,
    pub recovery_us: u64,
    pub topics_loaded: u64,
    pub topics_unloaded: u64,
    pub storage: StorageFigures,
}

/// What the shard's entry log says of itself, read on the shard.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageFigures {
    /// Log sequence number up to which every record is durable (records,
    /// not bytes: it grows by one per append or metadata record).
    pub durable_lsn: u64,
    /// Bytes appended and not yet written.
    pub pending_bytes: u64,
    /// Batches written and synced alone on their ring (one at a time).
    pub lone_batches: u64,
    /// Data disk usage at the last check, in percent, and whether produce
    /// is refused for it.
    pub disk_used_pct: u8,
    pub storage_full: bool,
    /// Entry reads served from the read cache, and reads that went to disk.
    pub read_cache_hits: u64,
    pub disk_reads: u64,
    /// Group commits: batches written and fdatasync'd, their records and
    /// bytes, and the distributions of records per batch and of each
    /// batch's write-and-fdatasync time.
    pub flush: FlushStats,
}

impl ShardMetrics {
    pub fn new() -> Arc<Self> {
        Arc::new(Self::default())
    }

    /// The counters now, with `storage` (which only the shard can read).
    pub fn snapshot(&self, shard: u32, storage: StorageFigures) -> ShardMetricsSnapshot {
        ShardMetricsSnapshot {
            shard,
            messages_in: self.messages_in.get(),
            bytes_in: self.bytes_in.get(),
            publish_latency_us: self.publish_latency_us.snapshot(),
            entries_out: self.entries_out.get(),
            bytes_out: self.bytes_out.get(),
            acks: self.acks.get(),
            cross_shard_requests: self.cross_shard_requests.get(),
            cross_shard_events: self.cross_shard_events.get(),
            connections_opened: self.connections_opened.get(),
            connections_closed: self.connections_closed.get(),
            inflight_bytes: self.inflight_bytes.get(),
            recovery_us: self.recovery_us.get(),
            topics_loaded: self.topics_loaded.get(),
            topics_unloaded: self.topics_unloaded.get(),
            storage,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: every value lands in the bucket whose bounds hold it, and the
    /// count and sum follow. Method: values at and around each power of two.
    #[test]
    fn histogram_buckets_hold_their_values() {
        let h = Histogram::default();
        let mut values = vec![0u64, 1, u64::MAX];
        for k in 1..63 {
            values.extend([(1u64 << k) - 1, 1 << k, (1 << k) + 1]);
        }
        for &v in &values {
            h.record(v % (1 << 40));
            let b = bucket_of(v);
            let lower = if b == 0 { 0 } else { 1u64 << (b - 1) };
            assert!(v >= lower, "{v} below bucket {b}");
            if let Some(upper) = HistogramSnapshot::upper_bound(b) {
                assert!(v < upper, "{v} not below bucket {b}'s bound {upper}");
            }
        }
        let s = h.snapshot();
        assert_eq!(s.count, values.len() as u64);
        assert_eq!(s.buckets.iter().sum::<u64>(), s.count);
        assert_eq!(s.sum, values.iter().map(|v| v % (1 << 40)).sum::<u64>());
    }
}
