//! Producing to a topic by its own name, partitioned or not: the
//! [`PartitionedProducer`] looks up the partition count, keeps one
//! [`Producer`] per partition (`…-partition-i`), routes each message, and
//! picks up partitions added later.
//!
//! Routing (Pulsar's modes plus RocketMQ's latency-aware queue selection):
//! a message with a key always goes to `hash(key) % N` (FNV-1a, 32 bits), so
//! one key stays in one partition, in order. Without a key the
//! [`RoutingMode`] decides.

use crate::error::{ClientError, Result};
use crate::message::OutgoingMessage;
use crate::producer::{Producer, ProducerBuilder};
use magnetar_wire::MessageId;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Chooses a partition for a message without a key (or for every message,
/// for a custom router).
pub trait MessageRouter: Send + Sync {
    /// A partition index below `partitions` (values above wrap around).
    fn choose(&self, msg: &OutgoingMessage, partitions: u32) -> u32;
}

/// How messages are spread over partitions.
#[derive(Clone, Default)]
pub enum RoutingMode {
    /// Keyless messages cycle over the partitions (the default). Without
    /// batching a batch boundary is every message.
    #[default]
    RoundRobin,
    /// Keyless messages all go to one partition, chosen at random at creation.
    SinglePartition,
    /// Only the key decides; a keyless message goes to partition 0.
    KeyHash,
    /// Keyless messages go to the partition with the lowest recent publish
    /// latency (exponentially weighted; RocketMQ's minimum-latency selection).
    Latency,
    /// The application decides every message, keyed or not.
    Custom(Arc<dyn MessageRouter>),
}

impl std::fmt::Debug for RoutingMode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::RoundRobin => "RoundRobin",
            Self::SinglePartition => "SinglePartition",
            Self::KeyHash => "KeyHash",
            Self::Latency => "Latency",
            Self::Custom(_) => "Custom",
        })
    }
}

/// Partition of `key` among `partitions`: the Java client's default
/// (`Murmur3_32Hash` of the key, sign bit cleared, modulo the partitions), so
/// one key lands in one partition whichever client sent it.
pub fn key_partition(key: &str, partitions: u32) -> u32 {
    magnetar_pulsar_wire::pulsar_key_hash(key.as_bytes()) % partitions.max(1)
}

/// How often the partition count is checked again for growth.
pub const PARTITIONS_REFRESH_INTERVAL: Duration = Duration::from_secs(60);

struct Partition {
    producer: Arc<Producer>,
    /// Recent publish latency in microseconds (EWMA, 1/8 weight per sample).
    latency_us: Arc<AtomicU64>,
}

/// A producer on a topic's name that covers all its partitions (or the topic
/// itself when it is not partitioned). `Send + Sync`.
pub struct PartitionedProducer {
    builder: ProducerBuilder,
    topic: String,
    partitioned: bool,
    routing: RoutingMode,
    parts: std::sync::RwLock<Vec<Partition>>,
    /// Held while adding partitions, so two refreshes do not both add them.
    growing: tokio::sync::Mutex<()>,
    next: AtomicUsize,
    single: u32,
    /// Microseconds after `created` when the partition count is next looked
    /// up (an atomic, so that a send costs no lock for it).
    next_refresh_us: AtomicU64,
    created: Instant,
}

impl std::fmt::Debug for PartitionedProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PartitionedProducer").field("topic", &self.topic).finish_non_exhaustive()
    }
}

/// The receipt of one routed send; see [`crate::SendFuture`].
pub struct RoutedSend {
    inner: crate::producer::SendFuture,
    partition: usize,
    /// When it was sent, and the partition's latency to fold the round trip
    /// into: only with `RoutingMode::Latency` (the others spare the clock).
    timing: Option<(Instant, Arc<AtomicU64>)>,
}

impl RoutedSend {
    /// The index of the partition the message was routed to (0 for a topic
    /// that is not partitioned). A partition's receipts complete in send
    /// order (per key with key-based batching).
    pub fn partition(&self) -> usize {
        self.partition
    }

    pub async fn receipt(self) -> Result<MessageId> {
        let r = self.inner.await;
        if let (Ok(_), Some((started, latency_us))) = (&r, self.timing) {
            let us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
            let old = latency_us.load(Ordering::Relaxed);
            let new = if old == 0 { us } else { old - old / 8 + us / 8 };
            latency_us.store(new, Ordering::Relaxed);
        }
        r
    }
}

/// `PARTITIONS_REFRESH_INTERVAL` in microseconds.
fn refresh_interval_us() -> u64 {
    u64::try_from(PARTITIONS_REFRESH_INTERVAL.as_micros()).unwrap_or(u64::MAX)
}

impl PartitionedProducer {
    pub(crate) async fn create(builder: ProducerBuilder, routing: RoutingMode) -> Result<Self> {
        let topic = crate::names::normalize_topic(&builder.topic)?;
        let admin = builder.origin.admin();
        let n = admin.partitions(&topic).await?;
        let me = Self {
            // "Random" enough to spread single-partition producers.
            single: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos() ^ std::process::id())
                % n.max(1),
            builder,
            topic,
            partitioned: n > 0,
            routing,
            parts: std::sync::RwLock::new(Vec::new()),
            growing: tokio::sync::Mutex::new(()),
            next: AtomicUsize::new(0),
            next_refresh_us: AtomicU64::new(refresh_interval_us()),
            created: Instant::now(),
        };
        me.grow_to(n.max(1)).await?;
        Ok(me)
    }

    /// Adds producers for partitions `len..n`.
    async fn grow_to(&self, n: u32) -> Result<()> {
        let _growing = self.growing.lock().await;
        let have = u32::try_from(self.read_parts().len()).unwrap_or(u32::MAX);
        for i in have..n {
            let topic = if self.partitioned { format!("{}-partition-{i}", self.topic) } else { self.topic.clone() };
            let b = &self.builder;
            let name = b.name.as_ref().map(|n| if self.partitioned { format!("{n}-{i}") } else { n.clone() });
            let builder = ProducerBuilder {
                origin: b.origin.clone(),
                topic,
                name,
                max_pending: b.max_pending,
                access_mode: b.access_mode,
                batching: b.batching.clone(),
                compression: b.compression,
                chunk_bytes: b.chunk_bytes,
                block_if_queue_full: b.block_if_queue_full,
            };
            let producer = builder.create().await?;
            let part = Partition { producer: Arc::new(producer), latency_us: Arc::new(AtomicU64::new(0)) };
            self.parts.write().unwrap_or_else(|p| p.into_inner()).push(part);
        }
        Ok(())
    }

    /// Checks the partition count again (at most once a refresh interval) and
    /// starts producers on new partitions; `now_us` is the time since `created`.
    async fn maybe_refresh(&self, now_us: u64) -> Result<()> {
        if !self.partitioned {
            return Ok(());
        }
        let due = self.next_refresh_us.load(Ordering::Relaxed);
        if now_us < due {
            return Ok(());
        }
        let next = now_us.saturating_add(refresh_interval_us());
        // One concurrent send wins the refresh; the others go on.
        if self.next_refresh_us.compare_exchange(due, next, Ordering::Relaxed, Ordering::Relaxed).is_err() {
            return Ok(());
        }
        self.refresh_partitions().await
    }

    /// Looks the partition count up now and covers new partitions.
    pub async fn refresh_partitions(&self) -> Result<()> {
        let admin = self.builder.origin.admin();
        let n = admin.partitions(&self.topic).await?;
        self.grow_to(n.max(1)).await
    }

    pub fn topic(&self) -> &str {
        &self.topic
    }

    fn read_parts(&self) -> std::sync::RwLockReadGuard<'_, Vec<Partition>> {
        // Poisoned only by a panic in a push; the vector is still valid.
        self.parts.read().unwrap_or_else(|p| p.into_inner())
    }

    fn producers(&self) -> Vec<Arc<Producer>> {
        self.read_parts().iter().map(|p| p.producer.clone()).collect()
    }

    /// [`Producer::shard`] of each partition covered now, in partition order.
    pub fn partition_shards(&self) -> Vec<u32> {
        self.read_parts().iter().map(|p| p.producer.shard()).collect()
    }

    /// Partitions covered now (1 for a non-partitioned topic).
    pub fn partitions(&self) -> usize {
        self.read_parts().len()
    }

    /// Sends awaiting their receipt, over all partitions.
    pub fn pending(&self) -> usize {
        self.read_parts().iter().map(|p| p.producer.pending()).sum()
    }

    /// Whether the topic is partitioned (else one producer on the topic itself).
    pub fn is_partitioned(&self) -> bool {
        self.partitioned
    }

    /// `now_us`: the time since `created`.
    fn route(&self, msg: &OutgoingMessage, parts: &[Partition], now_us: u64) -> usize {
        let n = u32::try_from(parts.len()).unwrap_or(u32::MAX).max(1);
        let i = match (&self.routing, &msg.key) {
            (RoutingMode::Custom(r), _) => r.choose(msg, n) % n,
            (_, Some(key)) => key_partition(key, n),
            (RoutingMode::RoundRobin, None) => match &self.builder.batching {
                // With batching, switch partition once per batching period
                // so that batches fill (Pulsar's round-robin router).
                Some(b) => {
                    let period = u64::try_from(b.max_delay.as_micros()).unwrap_or(u64::MAX).max(1);
                    u32::try_from((now_us / period) % u64::from(n)).unwrap_or(0)
                }
                None => u32::try_from(self.next.fetch_add(1, Ordering::Relaxed) % parts.len().max(1)).unwrap_or(0),
            },
            (RoutingMode::SinglePartition, None) => self.single % n,
            (RoutingMode::KeyHash, None) => 0,
            (RoutingMode::Latency, None) => {
                // Untried partitions (latency 0) first, in round-robin order.
                let start = self.next.fetch_add(1, Ordering::Relaxed);
                let mut best = start % parts.len().max(1);
                let mut best_us = u64::MAX;
                for k in 0..parts.len() {
                    let j = (start + k) % parts.len();
                    let us = parts[j].latency_us.load(Ordering::Relaxed);
                    if us < best_us {
                        best_us = us;
                        best = j;
                    }
                }
                u32::try_from(best).unwrap_or(0)
            }
        };
        usize::try_from(i).unwrap_or(0)
    }

    /// Route and queue one message; the returned receipt resolves once the
    /// partition's broker made it durable. Its id names the partition.
    pub async fn send_async(&self, msg: OutgoingMessage) -> Result<RoutedSend> {
        // One clock read per send, for the refresh, the routing and the latency.
        let now = Instant::now();
        let now_us = u64::try_from(now.saturating_duration_since(self.created).as_micros()).unwrap_or(u64::MAX);
        self.maybe_refresh(now_us).await?;
        let (producer, partition, timing) = {
            let parts = self.read_parts();
            let i = self.route(&msg, &parts, now_us);
            let p = parts.get(i).ok_or(ClientError::InvalidOption { option: "router", reason: "no partition" })?;
            let timing = matches!(self.routing, RoutingMode::Latency).then(|| (now, p.latency_us.clone()));
            (p.producer.clone(), i, timing)
        };
        let inner = producer.send_async(msg).await?;
        Ok(RoutedSend { inner, partition, timing })
    }

    pub async fn send(&self, msg: OutgoingMessage) -> Result<MessageId> {
        self.send_async(msg).await?.receipt().await
    }

    pub async fn flush(&self) -> Result<()> {
        for p in self.producers() {
            p.flush().await?;
        }
        Ok(())
    }

    pub async fn close(&self) -> Result<()> {
        let mut first = Ok(());
        for p in self.producers() {
            if let Err(e) = p.close().await {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_partition_is_stable_and_spread() {
        assert_eq!(key_partition("k", 4), key_partition("k", 4));
        let mut seen = [0u32; 4];
        for i in 0..400 {
            seen[key_partition(&format!("key-{i}"), 4) as usize] += 1;
        }
        assert!(seen.iter().all(|&c| c > 50), "{seen:?}");
        assert_eq!(key_partition("x", 0), 0);
    }
}
