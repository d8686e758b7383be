//! What a run does: the workload, from defaults, a TOML file and flags (flags
//! win), and the checks that refuse nonsense.

use magnetar_client::{BatchingOptions, CompressionType, SubscriptionType};
use serde::{Deserialize, Serialize};
use std::path::Path;
use std::time::Duration;

/// Errors in a workload description; each names the setting at fault.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("cannot read workload file {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("workload file {path}: {source}")]
    Parse { path: String, source: Box<toml::de::Error> },
    #[error("{setting}: {reason}")]
    Invalid { setting: &'static str, reason: String },
}

/// Most messages in one batch (the client's `BATCH_MESSAGES_LIMIT`).
pub const BATCH_MESSAGES_MAX: usize = 100_000;

/// Subscription type as the workload names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum SubType {
    #[default]
    Exclusive,
    Failover,
    Shared,
    KeyShared,
}

/// Compression codec as the workload names it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum Compression {
    #[default]
    None,
    Lz4,
    Zstd,
    Snappy,
}

/// Message sizes: fixed, uniform in `[min, max]`, or a weighted choice.
///
/// Text form (flag `--size` and TOML `size`): `1024`, `100..16384`
/// (uniform, inclusive) or `100:5,1024:4,16384:1` (size:weight list).
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum SizeDist {
    Fixed { bytes: usize },
    Uniform { min: usize, max: usize },
    Weighted { choices: Vec<(usize, u32)> },
}

impl SizeDist {
    pub fn parse(s: &str) -> Result<SizeDist, WorkloadError> {
        let bad = |reason: String| WorkloadError::Invalid { setting: "size", reason };
        let num = |t: &str| t.trim().parse::<usize>().map_err(|e| bad(format!("{t:?}: {e}")));
        let dist = if let Some((a, b)) = s.split_once("..") {
            SizeDist::Uniform { min: num(a)?, max: num(b)? }
        } else if s.contains(':') {
            let mut choices = Vec::new();
            for part in s.split(',') {
                let (size, weight) = part.split_once(':').ok_or_else(|| bad(format!("{part:?} is not SIZE:WEIGHT")))?;
                let weight = weight.trim().parse::<u32>().map_err(|e| bad(format!("weight {weight:?}: {e}")))?;
                choices.push((num(size)?, weight));
            }
            SizeDist::Weighted { choices }
        } else {
            SizeDist::Fixed { bytes: num(s)? }
        };
        dist.validate()?;
        Ok(dist)
    }

    fn validate(&self) -> Result<(), WorkloadError> {
        let bad = |reason: &str| Err(WorkloadError::Invalid { setting: "size", reason: reason.to_string() });
        match self {
            SizeDist::Fixed { .. } => Ok(()),
            SizeDist::Uniform { min, max } if min > max => bad("uniform MIN..MAX needs MIN <= MAX"),
            SizeDist::Uniform { .. } => Ok(()),
            SizeDist::Weighted { choices } if choices.is_empty() || choices.iter().all(|c| c.1 == 0) => {
                bad("a weighted list needs at least one positive weight")
            }
            SizeDist::Weighted { .. } => Ok(()),
        }
    }

    /// Largest size this distribution can produce.
    pub fn max(&self) -> usize {
        match self {
            SizeDist::Fixed { bytes } => *bytes,
            SizeDist::Uniform { max, .. } => *max,
            SizeDist::Weighted { choices } => choices.iter().map(|c| c.0).max().unwrap_or(0),
        }
    }

    /// Mean size (for reports).
    pub fn mean(&self) -> f64 {
        match self {
            SizeDist::Fixed { bytes } => *bytes as f64,
            SizeDist::Uniform { min, max } => (*min + *max) as f64 / 2.0,
            SizeDist::Weighted { choices } => {
                let total: f64 = choices.iter().map(|c| f64::from(c.1)).sum();
                choices.iter().map(|c| c.0 as f64 * f64::from(c.1)).sum::<f64>() / total
            }
        }
    }
}

impl std::fmt::Display for SizeDist {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            SizeDist::Fixed { bytes } => write!(f, "{bytes}"),
            SizeDist::Uniform { min, max } => write!(f, "{min}..{max}"),
            SizeDist::Weighted { choices } => {
                let parts: Vec<String> = choices.iter().map(|(s, w)| format!("{s}:{w}")).collect();
                write!(f, "{}", parts.join(","))
            }
        }
    }
}

/// Message keys: none, uniform over `keys` distinct keys, or Zipf-skewed
/// (exponent `zipf_exponent`, key 0 the hottest).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default, clap::ValueEnum)]
#[serde(rename_all = "snake_case")]
pub enum KeyDist {
    #[default]
    None,
    Uniform,
    Zipf,
}

/// A complete workload. Field names are the TOML keys (and, with `-` for
/// `_`, the flags).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Workload {
    /// Topic name prefix; each run adds a unique suffix so runs never share data.
    pub topic_prefix: String,
    pub topics: u32,
    /// Partitions per topic: each topic is a partitioned topic (its
    /// partitions are the topics `<topic>-partition-<i>`).
    pub partitions: u32,
    /// Producers per topic; each writes to all of the topic's partitions.
    pub producers: u32,
    /// Subscriptions per topic.
    pub subscriptions: u32,
    /// Consumers per subscription; each reads all of the topic's partitions.
    pub consumers: u32,
    pub subscription_type: SubType,
    /// Size distribution, in text form (see [`SizeDist::parse`]).
    pub size: String,
    pub key_distribution: KeyDist,
    /// Distinct keys when keys are on.
    pub keys: u64,
    pub zipf_exponent: f64,
    /// Target rate in messages per second over all producers; 0 = as fast as possible.
    /// With `sustainable`, where the search starts (0 = 10,000 msg/s).
    pub rate: u64,
    /// Search for the highest rate the consumers keep up with (backlog-aware,
    /// as the OpenMessaging Benchmark does), then warm up and measure at
    /// that fixed rate (see `pace.rs`).
    pub sustainable: bool,
    /// Longest the search may take, seconds; then it measures at the last
    /// rate that was kept.
    pub search_max_s: f64,
    /// Messages awaiting their receipt, per producer and partition: a
    /// producer keeps at most `max_pending × partitions` messages in flight,
    /// a batch counting as the messages it holds (so turning batching on
    /// does not multiply what is in flight). 1 with one partition and no
    /// batching = one message at a time.
    pub max_pending: u32,
    /// Messages per batch; 0 or 1 = no batching. Default 1000, with a 1 ms
    /// delay and the client's 128 KiB bound: the defaults of Pulsar's
    /// clients (`batchingMaxMessages`, `batchingMaxPublishDelay`,
    /// `batchingMaxBytes`), which pulsar-perf also uses.
    pub batch_max_messages: u32,
    /// With batching: a batch goes out once its first message waited this long.
    pub batch_max_delay_ms: u64,
    pub compression: Compression,
    /// Flow permits per consumer and partition.
    pub receiver_queue_size: u32,
    pub warmup_s: f64,
    pub duration_s: f64,
    /// Backlog phase: produce this many messages with no consumer reading,
    /// then measure the catch-up read. 0 = no backlog phase.
    pub backlog_messages: u64,
    /// Seed of the size and key generators.
    pub seed: u64,
    /// Client connections shared by all producers (and as many again by all
    /// consumers), assigned round-robin; 0 = one connection per producer and
    /// per consumer. Many topics need this: 10,000 topics would otherwise
    /// open 20,000 connections.
    pub connections: u32,
    /// Place the run on this broker shard: the run's topic names are chosen
    /// (by asking the broker, `topics.owner`) so that the first partition
    /// of the first topic lives on this shard. Meant for one-topic,
    /// one-partition shapes, whose figures depend on the owning shard
    /// (bench/README.md, "Comparing runs"). None = wherever the random run
    /// id lands.
    pub topic_shard: Option<u32>,
}

impl Default for Workload {
    /// The canonical workload (issue #6): 1 topic, 4 partitions, 1 producer,
    /// 1 consumer, 1 KiB, as fast as possible, 30 s, with the producer
    /// batching as Pulsar's clients do by default (1,000 messages, 128 KiB,
    /// 1 ms) and 1,000 messages in flight per partition.
    fn default() -> Self {
        Workload {
            topic_prefix: "bench".into(),
            topics: 1,
            partitions: 4,
            producers: 1,
            subscriptions: 1,
            consumers: 1,
            subscription_type: SubType::Exclusive,
            size: "1024".into(),
            key_distribution: KeyDist::None,
            keys: 1000,
            zipf_exponent: 0.99,
            rate: 0,
            sustainable: false,
            search_max_s: 60.0,
            max_pending: 1000,
            batch_max_messages: 1000,
            batch_max_delay_ms: 1,
            compression: Compression::None,
            receiver_queue_size: 1000,
            warmup_s: 2.0,
            duration_s: 30.0,
            backlog_messages: 0,
            seed: 1,
            connections: 0,
            topic_shard: None,
        }
    }
}

impl Workload {
    pub fn from_toml_file(path: &Path) -> Result<Workload, WorkloadError> {
        let text = std::fs::read_to_string(path)
            .map_err(|source| WorkloadError::Read { path: path.display().to_string(), source })?;
        Self::from_toml(&text).map_err(|e| match e {
            WorkloadError::Parse { source, .. } => WorkloadError::Parse { path: path.display().to_string(), source },
            other => other,
        })
    }

    pub fn from_toml(text: &str) -> Result<Workload, WorkloadError> {
        toml::from_str(text).map_err(|e| WorkloadError::Parse { path: "<text>".into(), source: Box::new(e) })
    }

    pub fn size_dist(&self) -> Result<SizeDist, WorkloadError> {
        SizeDist::parse(&self.size)
    }

    /// Refuse nonsense.
    pub fn validate(&self) -> Result<(), WorkloadError> {
        let invalid =
            |setting: &'static str, reason: &str| Err(WorkloadError::Invalid { setting, reason: reason.into() });
        if self.topics == 0 || self.partitions == 0 {
            return invalid("topics/partitions", "must be at least 1");
        }
        if self.producers == 0 && self.consumers == 0 {
            return invalid("producers/consumers", "nothing to do with neither producers nor consumers");
        }
        if self.subscriptions == 0 && self.consumers > 0 {
            return invalid("subscriptions", "consumers need at least one subscription");
        }
        if self.max_pending == 0 || self.receiver_queue_size == 0 {
            return invalid("max_pending/receiver_queue_size", "must be at least 1");
        }
        // Written so that NaN fails too.
        if !(self.duration_s.is_finite() && self.duration_s > 0.0 && self.warmup_s.is_finite() && self.warmup_s >= 0.0)
        {
            return invalid("duration_s/warmup_s", "duration must be > 0 and warm-up >= 0");
        }
        if self.key_distribution != KeyDist::None && self.keys == 0 {
            return invalid("keys", "a key distribution needs at least one key");
        }
        if self.key_distribution == KeyDist::Zipf && !(self.zipf_exponent.is_finite() && self.zipf_exponent > 0.0) {
            return invalid("zipf_exponent", "must be > 0");
        }
        if self.backlog_messages > 0 && (self.producers == 0 || self.consumers == 0) {
            return invalid("backlog_messages", "the backlog phase needs producers and consumers");
        }
        if self.sustainable
            && (self.producers == 0 || self.consumers == 0 || self.subscriptions == 0 || self.backlog_messages > 0)
        {
            return invalid("sustainable", "the rate search needs producers and consumers and no backlog phase");
        }
        if self.sustainable && !(self.search_max_s.is_finite() && self.search_max_s > 0.0) {
            return invalid("search_max_s", "must be > 0");
        }
        let size = self.size_dist()?;
        if size.max() > 5 * 1024 * 1024 {
            return invalid("size", "the broker refuses messages over 5 MiB");
        }
        if self.batch_max_messages > 1 && self.batch_max_delay_ms == 0 {
            return invalid("batch_max_delay_ms", "batching needs a delay of at least 1 ms");
        }
        if self.batch_max_messages as usize > BATCH_MESSAGES_MAX {
            return invalid("batch_max_messages", "the client batches at most 100000 messages");
        }
        if self.subscription_type == SubType::Exclusive && self.consumers > 1 {
            return invalid(
                "consumers",
                "an Exclusive subscription takes one consumer; use --subscriptions N for N independent readers",
            );
        }
        Ok(())
    }

    /// The producers' batching: `None` unless `batch_max_messages > 1`.
    /// Batches also close at the client's default 128 KiB (or one message
    /// larger than that). Key-based batches for Key_Shared with keys, so a
    /// batch never mixes keys that the broker dispatches to different consumers.
    pub fn batching(&self) -> Option<BatchingOptions> {
        (self.batch_max_messages > 1).then(|| BatchingOptions {
            max_messages: self.batch_max_messages as usize,
            max_delay: Duration::from_millis(self.batch_max_delay_ms),
            key_based: self.subscription_type == SubType::KeyShared && self.key_distribution != KeyDist::None,
            ..BatchingOptions::default()
        })
    }

    /// The producers' codec.
    pub fn compression_type(&self) -> CompressionType {
        match self.compression {
            Compression::None => CompressionType::None,
            Compression::Lz4 => CompressionType::Lz4,
            Compression::Zstd => CompressionType::Zstd,
            Compression::Snappy => CompressionType::Snappy,
        }
    }

    /// The consumers' subscription type.
    pub fn subscription_type(&self) -> SubscriptionType {
        match self.subscription_type {
            SubType::Exclusive => SubscriptionType::Exclusive,
            SubType::Failover => SubscriptionType::Failover,
            SubType::Shared => SubscriptionType::Shared,
            SubType::KeyShared => SubscriptionType::KeyShared,
        }
    }

    /// Name of (partitioned) topic `t` of a run with unique `run_id`.
    pub fn topic_name(&self, run_id: &str, t: u32) -> String {
        format!("{}-{run_id}-{t}", self.topic_prefix)
    }

    /// Partition topic names of topic `t` of a run with unique `run_id`.
    pub fn partition_topics(&self, run_id: &str, t: u32) -> Vec<String> {
        let topic = self.topic_name(run_id, t);
        (0..self.partitions).map(|p| format!("{topic}-partition-{p}")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn size_forms() {
        assert_eq!(SizeDist::parse("1024").unwrap(), SizeDist::Fixed { bytes: 1024 });
        assert_eq!(SizeDist::parse("100..200").unwrap(), SizeDist::Uniform { min: 100, max: 200 });
        let w = SizeDist::parse("100:3,1000:1").unwrap();
        assert_eq!(w, SizeDist::Weighted { choices: vec![(100, 3), (1000, 1)] });
        assert_eq!(w.mean(), 325.0);
        assert_eq!(w.to_string(), "100:3,1000:1");
        assert!(SizeDist::parse("200..100").is_err());
        assert!(SizeDist::parse("x").is_err());
        assert!(SizeDist::parse("100:0").is_err());
    }

    #[test]
    fn toml_overrides_defaults_and_rejects_unknown_keys() {
        let w = Workload::from_toml("topics = 3\nsize = \"100..200\"\nkey_distribution = \"zipf\"\n").unwrap();
        assert_eq!(w.topics, 3);
        assert_eq!(w.partitions, 4);
        assert_eq!(w.key_distribution, KeyDist::Zipf);
        w.validate().unwrap();
        assert!(Workload::from_toml("topicz = 3\n").is_err());
    }

    #[test]
    fn shipped_workload_files_are_valid() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("workloads");
        let mut n = 0;
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            let w = Workload::from_toml_file(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            w.validate().unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            n += 1;
        }
        assert!(n >= 5);
    }

    #[test]
    fn batching_compression_and_sub_types_reach_the_client_settings() {
        let w = Workload::default();
        w.validate().unwrap();
        let b = w.batching().expect("the canonical workload batches as Pulsar's clients do by default");
        assert_eq!((b.max_messages, b.max_bytes, b.max_delay), (1000, 128 * 1024, Duration::from_millis(1)));
        assert!(Workload { batch_max_messages: 0, ..Workload::default() }.batching().is_none());
        assert_eq!(w.compression_type(), CompressionType::None);
        assert_eq!(w.subscription_type(), SubscriptionType::Exclusive);
        // A batch of one is no batching.
        assert!(Workload { batch_max_messages: 1, ..Workload::default() }.batching().is_none());

        let w = Workload::from_toml(
            "batch_max_messages = 100\nbatch_max_delay_ms = 5\ncompression = \"lz4\"\n\
             subscription_type = \"key_shared\"\nkey_distribution = \"zipf\"\nconsumers = 2\n",
        )
        .unwrap();
        w.validate().unwrap();
        let b = w.batching().unwrap();
        assert_eq!(b.max_messages, 100);
        assert_eq!(b.max_delay, Duration::from_millis(5));
        assert!(b.key_based, "Key_Shared with keys batches per key");
        assert_eq!(w.compression_type(), CompressionType::Lz4);
        assert_eq!(w.subscription_type(), SubscriptionType::KeyShared);
        for (c, t) in [(Compression::Zstd, CompressionType::Zstd), (Compression::Snappy, CompressionType::Snappy)] {
            assert_eq!(Workload { compression: c, ..Workload::default() }.compression_type(), t);
        }
        for (s, t) in [(SubType::Failover, SubscriptionType::Failover), (SubType::Shared, SubscriptionType::Shared)] {
            let w = Workload { subscription_type: s, consumers: 3, ..Workload::default() };
            w.validate().unwrap();
            assert_eq!(w.subscription_type(), t);
        }

        // Still refused: nonsense, and several consumers on one Exclusive subscription.
        assert!(Workload { batch_max_messages: 10, batch_max_delay_ms: 0, ..Workload::default() }.validate().is_err());
        assert!(Workload { batch_max_messages: 200_000, ..Workload::default() }.validate().is_err());
        assert!(Workload { consumers: 2, ..Workload::default() }.validate().is_err());
    }
}
