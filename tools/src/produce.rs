//! `magnetar produce`: publish generated, given or stdin messages through one
//! producer, keep `--max-pending` sends in flight, and report throughput and
//! publish latency.
//!
//! Output contract (issue #2, relied on by scripts): with `--output jsonl`,
//! stdout gets exactly one object per acknowledged message, in seq order,
//! `{"seq":N,"id":"L:E:P:B","key":K-or-null}`. Progress and the summary go
//! to stderr in both modes, so stdout stays machine-readable.

use crate::broker::BrokerArgs;
use bytes::Bytes;
use hdrhistogram::Histogram;
use magnetar_client::{
    BatchingOptions, ClientError, CompressionType, MessageId, OutgoingMessage, ProducerAccessMode, RoutedSend,
    RoutingMode,
};
use std::error::Error;
use std::io::{BufRead, Write};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch};

/// Output format of the client commands.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OutputFormat {
    /// Human-readable.
    Text,
    /// One JSON object per line on stdout (a stable contract for scripts).
    Jsonl,
}

#[derive(clap::Args, Debug)]
pub struct ProduceArgs {
    /// Topic: `persistent://tenant/ns/topic`, `tenant/ns/topic`, or `topic`
    /// (= `persistent://public/default/topic`).
    pub topic: String,

    /// Number of messages to send (generated ones, or copies of --message).
    #[arg(long, short = 'n', default_value_t = 1)]
    pub count: u64,

    /// Size in bytes of generated payloads: `"<producer-name>:<seq>:"` padded
    /// with `x` (just the prefix when it is longer).
    #[arg(long, default_value_t = 1024)]
    pub size: usize,

    /// Send this text instead of generated payloads (once, or --count times).
    #[arg(long, short = 'm', conflicts_with_all = ["stdin", "size"])]
    pub message: Option<String>,

    /// Send one message per line of standard input (line ending removed).
    #[arg(long, conflicts_with_all = ["count", "size"])]
    pub stdin: bool,

    /// Key of every message.
    #[arg(long, short = 'k', conflicts_with = "keys")]
    pub key: Option<String>,

    /// Give message `seq` the key `k<seq mod N>`.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub keys: Option<u64>,

    /// Message property `name=value`; repeatable.
    #[arg(long = "property", short = 'p', value_name = "NAME=VALUE", value_parser = parse_property)]
    pub properties: Vec<(String, String)>,

    /// Producer name (default: a generated unique name).
    #[arg(long)]
    pub producer_name: Option<String>,

    /// Sends awaiting their receipt at once.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    pub max_pending: u64,

    /// How keyless messages spread over a partitioned topic's partitions
    /// (a message with a key always goes to the key's partition).
    #[arg(long, value_enum, default_value_t = Routing::RoundRobin)]
    pub routing: Routing,

    /// Batch messages: send a batch once it holds N messages (turns batching on).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub batch_max_messages: Option<u64>,

    /// Batch messages: send a batch once its first message waited MS
    /// milliseconds (turns batching on; default 10 when batching).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=60_000))]
    pub batch_max_delay_ms: Option<u64>,

    /// Batch messages: send a batch once it holds this many payload bytes
    /// (turns batching on; default 131072 when batching).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=8_388_608))]
    pub batch_max_bytes: Option<u64>,

    /// `default`: one batch for all messages; `key-based`: one batch per key
    /// (turns batching on).
    #[arg(long, value_enum)]
    pub batching: Option<Batching>,

    /// Compress each entry's payload (a message's or a batch's) with this codec.
    #[arg(long, value_enum, default_value_t = Codec::None)]
    pub compression: Codec,

    /// Split messages above the chunk size (4 MiB, or --chunk-max-bytes)
    /// into chunks that the consumer reassembles. Not with batching.
    #[arg(long, conflicts_with_all = ["batch_max_messages", "batch_max_delay_ms", "batch_max_bytes", "batching"])]
    pub chunking: bool,

    /// Chunk size in bytes for --chunking.
    #[arg(long, requires = "chunking", value_parser = clap::value_parser!(u64).range(1..=5_000_000))]
    pub chunk_max_bytes: Option<u64>,

    /// How this producer shares the topic with other producers.
    #[arg(long, value_enum, default_value_t = AccessMode::Shared)]
    pub access_mode: AccessMode,

    #[command(flatten)]
    pub broker: BrokerArgs,

    /// `text`: summary on stderr. `jsonl`: one `{"seq","id","key"}` object
    /// per acknowledged message on stdout, in seq order; summary on stderr.
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,

    /// Delayed delivery (issue #4): consumers get each message no earlier
    /// than this many milliseconds after it is sent.
    #[arg(long)]
    pub deliver_after_ms: Option<u64>,

    /// Tag every message with this (for subscriptions with `--filter-tag`).
    #[arg(long)]
    pub tag: Option<String>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Routing {
    RoundRobin,
    Single,
    Key,
    Latency,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Batching {
    Default,
    KeyBased,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Codec {
    None,
    Lz4,
    Zlib,
    Zstd,
    Snappy,
}

impl From<Codec> for CompressionType {
    fn from(c: Codec) -> Self {
        match c {
            Codec::None => CompressionType::None,
            Codec::Lz4 => CompressionType::Lz4,
            Codec::Zlib => CompressionType::Zlib,
            Codec::Zstd => CompressionType::Zstd,
            Codec::Snappy => CompressionType::Snappy,
        }
    }
}

impl ProduceArgs {
    /// Batching options when any batching flag was given.
    pub fn batching_options(&self) -> Option<BatchingOptions> {
        if self.batch_max_messages.is_none()
            && self.batch_max_delay_ms.is_none()
            && self.batch_max_bytes.is_none()
            && self.batching.is_none()
        {
            return None;
        }
        let mut o = BatchingOptions::default();
        if let Some(n) = self.batch_max_messages {
            o.max_messages = usize::try_from(n).unwrap_or(usize::MAX);
        }
        if let Some(ms) = self.batch_max_delay_ms {
            o.max_delay = Duration::from_millis(ms);
        }
        if let Some(b) = self.batch_max_bytes {
            o.max_bytes = usize::try_from(b).unwrap_or(usize::MAX);
        }
        o.key_based = self.batching == Some(Batching::KeyBased);
        Some(o)
    }
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum AccessMode {
    Shared,
    Exclusive,
    WaitForExclusive,
    ExclusiveWithFencing,
}

impl From<Routing> for RoutingMode {
    fn from(r: Routing) -> Self {
        match r {
            Routing::RoundRobin => RoutingMode::RoundRobin,
            Routing::Single => RoutingMode::SinglePartition,
            Routing::Key => RoutingMode::KeyHash,
            Routing::Latency => RoutingMode::Latency,
        }
    }
}

impl From<AccessMode> for ProducerAccessMode {
    fn from(m: AccessMode) -> Self {
        match m {
            AccessMode::Shared => ProducerAccessMode::Shared,
            AccessMode::Exclusive => ProducerAccessMode::Exclusive,
            AccessMode::WaitForExclusive => ProducerAccessMode::WaitForExclusive,
            AccessMode::ExclusiveWithFencing => ProducerAccessMode::ExclusiveWithFencing,
        }
    }
}

fn parse_property(s: &str) -> Result<(String, String), String> {
    match s.split_once('=') {
        Some((name, value)) if !name.is_empty() => Ok((name.to_string(), value.to_string())),
        _ => Err(format!("expected NAME=VALUE, got {s:?}")),
    }
}

pub fn run(args: ProduceArgs) -> Result<(), Box<dyn Error>> {
    crate::broker::block_on(produce(args))
}

/// A unique default producer name: pid plus the start time in nanoseconds.
fn generated_name() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("produce-{}-{nanos:x}", std::process::id())
}

/// The generated payload of message `seq`: `"<name>:<seq>:"` padded with `x`
/// to `size` bytes, so a consumer can check every byte.
pub fn generated_payload(name: &str, seq: u64, size: usize) -> Vec<u8> {
    let mut payload = format!("{name}:{seq}:").into_bytes();
    if payload.len() < size {
        payload.resize(size, b'x');
    }
    payload
}

/// Where the payloads come from.
enum Source {
    Generated {
        size: usize,
        count: u64,
    },
    Fixed {
        payload: Bytes,
        count: u64,
    },
    /// Lines read by a blocking thread (stdin has no async API in our tokio
    /// feature set, and a blocking read must not stall the connection's tasks).
    Stdin(mpsc::Receiver<std::io::Result<Vec<u8>>>),
}

impl Source {
    async fn next(&mut self, name: &str, seq: u64) -> Result<Option<Bytes>, Box<dyn Error>> {
        Ok(match self {
            Self::Generated { size, count } => (seq < *count).then(|| generated_payload(name, seq, *size).into()),
            Self::Fixed { payload, count } => (seq < *count).then(|| payload.clone()),
            Self::Stdin(lines) => match lines.recv().await {
                Some(line) => Some(line.map_err(|e| format!("reading stdin: {e}"))?.into()),
                None => None,
            },
        })
    }
}

fn spawn_stdin_reader() -> mpsc::Receiver<std::io::Result<Vec<u8>>> {
    let (tx, rx) = mpsc::channel(1024);
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut input = stdin.lock();
        loop {
            let mut line = Vec::new();
            match input.read_until(b'\n', &mut line) {
                Ok(0) => return,
                Ok(_) => {
                    if line.last() == Some(&b'\n') {
                        line.pop();
                        if line.last() == Some(&b'\r') {
                            line.pop();
                        }
                    }
                    if tx.blocking_send(Ok(line)).is_err() {
                        return;
                    }
                }
                Err(e) => {
                    let _ = tx.blocking_send(Err(e));
                    return;
                }
            }
        }
    });
    rx
}

/// A send handed to the collector, which awaits receipts in seq order.
struct InFlight {
    seq: u64,
    key: Option<String>,
    payload_bytes: u64,
    queued_at: Instant,
    receipt: RoutedSend,
}

#[derive(serde::Serialize)]
struct AckRecord<'a> {
    seq: u64,
    id: String,
    key: Option<&'a str>,
}

#[derive(Default)]
struct Counters {
    acked: AtomicU64,
    acked_bytes: AtomicU64,
}

/// Publish latency in microseconds, 1 µs .. 1 h, 3 significant digits.
fn new_histogram() -> Result<Histogram<u64>, Box<dyn Error>> {
    Ok(Histogram::new_with_bounds(1, 3_600_000_000, 3)?)
}

fn ms(micros: u64) -> f64 {
    micros as f64 / 1000.0
}

async fn produce(args: ProduceArgs) -> Result<(), Box<dyn Error>> {
    let client = args.broker.connect().await?;
    let requested_name = args.producer_name.clone().unwrap_or_else(generated_name);
    let max_pending = usize::try_from(args.max_pending)?;
    // A partitioned topic's name covers all its partitions (one producer
    // each, named `<name>-<i>`); a plain topic gets one producer named `<name>`.
    let mut builder = client
        .producer(args.topic.as_str())
        .name(requested_name.clone())
        .max_pending(max_pending)
        .access_mode(args.access_mode.into())
        .compression(args.compression.into());
    if let Some(b) = args.batching_options() {
        builder = builder.batching(b);
    }
    if args.chunking {
        let bytes = args.chunk_max_bytes.map_or(magnetar_client::DEFAULT_CHUNK_BYTES, |b| b as usize);
        builder = builder.chunking(bytes);
    }
    let producer = builder.create_partitioned(args.routing.into()).await?;
    let name = requested_name;
    let mut source = if args.stdin {
        Source::Stdin(spawn_stdin_reader())
    } else if let Some(text) = &args.message {
        Source::Fixed { payload: Bytes::from(text.clone()), count: args.count }
    } else {
        Source::Generated { size: args.size, count: args.count }
    };

    let counters = Arc::new(Counters::default());
    let stop = AtomicBool::new(false);
    let (inflight_tx, mut inflight_rx) = mpsc::channel::<InFlight>(max_pending);
    let (done_tx, mut done_rx) = watch::channel(false);
    let started = Instant::now();

    // Sender: queue messages as fast as the in-flight bound allows.
    let sender = async {
        let mut seq = 0u64;
        let result: Result<(), Box<dyn Error>> = async {
            while !stop.load(Ordering::Relaxed) {
                let Some(payload) = source.next(&name, seq).await? else { break };
                let key = match (&args.key, args.keys) {
                    (Some(k), _) => Some(k.clone()),
                    (None, Some(n)) => Some(format!("k{}", seq % n)),
                    (None, None) => None,
                };
                let payload_bytes = payload.len() as u64;
                let mut msg = OutgoingMessage::new(payload).with_properties(args.properties.iter().cloned());
                msg.key = key.clone();
                if let Some(ms) = args.deliver_after_ms {
                    msg = msg.with_deliver_after(Duration::from_millis(ms));
                }
                msg.tag = args.tag.clone();
                let receipt =
                    producer.send_async(msg).await.map_err(|e| format!("sending message seq {seq} failed: {e}"))?;
                let queued_at = Instant::now();
                if inflight_tx.send(InFlight { seq, key, payload_bytes, queued_at, receipt }).await.is_err() {
                    break; // the collector stopped (stdout failed)
                }
                seq += 1;
            }
            Ok(())
        }
        .await;
        drop(inflight_tx);
        result
    };

    // Collector: await receipts in seq order (they complete in that order),
    // record latency, print jsonl. Keeps draining after an error so every
    // message that was acknowledged is still reported.
    let collector = async {
        let mut histogram = new_histogram()?;
        let mut first_error: Option<String> = None;
        let mut last_id: Option<MessageId> = None;
        let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
        while let Some(inflight) = inflight_rx.recv().await {
            match inflight.receipt.receipt().await {
                Ok(id) => {
                    let micros = u64::try_from(inflight.queued_at.elapsed().as_micros()).unwrap_or(u64::MAX);
                    histogram.saturating_record(micros.max(1));
                    counters.acked.fetch_add(1, Ordering::Relaxed);
                    counters.acked_bytes.fetch_add(inflight.payload_bytes, Ordering::Relaxed);
                    last_id = Some(id);
                    if args.output == OutputFormat::Jsonl {
                        let record = AckRecord { seq: inflight.seq, id: id.to_string(), key: inflight.key.as_deref() };
                        serde_json::to_writer(&mut stdout, &record)?;
                        stdout.write_all(b"\n")?;
                    }
                }
                Err(e) => {
                    stop.store(true, Ordering::Relaxed);
                    if first_error.is_none() {
                        first_error = Some(format!("message seq {} was not stored: {e}", inflight.seq));
                    }
                }
            }
        }
        stdout.flush()?;
        let _ = done_tx.send(true);
        Ok::<_, Box<dyn Error>>((histogram, first_error, last_id))
    };

    // Progress: one line a second on stderr while the run lasts.
    let progress = async {
        let mut tick =
            tokio::time::interval_at(tokio::time::Instant::now() + Duration::from_secs(1), Duration::from_secs(1));
        let (mut last_acked, mut last_bytes) = (0u64, 0u64);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = done_rx.changed() => return,
            }
            let acked = counters.acked.load(Ordering::Relaxed);
            let bytes = counters.acked_bytes.load(Ordering::Relaxed);
            eprintln!(
                "[{:>4}s] acked {acked} ({} msg/s, {:.1} MB/s), pending {}",
                started.elapsed().as_secs(),
                acked - last_acked,
                (bytes - last_bytes) as f64 / 1e6,
                producer.pending(),
            );
            (last_acked, last_bytes) = (acked, bytes);
        }
    };

    let (sent, collected, ()) = tokio::join!(sender, collector, progress);
    let elapsed = started.elapsed();
    let (histogram, receipt_error, last_id) = collected?;

    let acked = counters.acked.load(Ordering::Relaxed);
    let bytes = counters.acked_bytes.load(Ordering::Relaxed);
    let secs = elapsed.as_secs_f64().max(1e-9);
    let last = last_id.map(|id| format!(", last id {id}")).unwrap_or_default();
    eprintln!(
        "produced {acked} messages ({bytes} bytes) in {secs:.3} s: {:.0} msg/s, {:.2} MB/s; \
         publish latency ms p50 {:.3} p99 {:.3} p999 {:.3} max {:.3}{last}",
        acked as f64 / secs,
        bytes as f64 / 1e6 / secs,
        ms(histogram.value_at_quantile(0.5)),
        ms(histogram.value_at_quantile(0.99)),
        ms(histogram.value_at_quantile(0.999)),
        ms(histogram.max()),
    );

    // A receipt error comes first in seq order; otherwise the sender's.
    if let Some(e) = receipt_error {
        client.close();
        return Err(e.into());
    }
    if let Err(e) = sent {
        client.close();
        return Err(e);
    }
    match producer.close().await {
        Ok(()) | Err(ClientError::Disconnected { .. }) => {}
        Err(e) => tracing::warn!(error = %e, "closing the producer"),
    }
    client.close();
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads() {
        assert_eq!(generated_payload("p", 7, 8), b"p:7:xxxx");
        assert_eq!(generated_payload("prod", 12, 3), b"prod:12:");
        assert_eq!(generated_payload("p", 0, 0), b"p:0:");
        assert_eq!(generated_payload("p", 3, 1024).len(), 1024);
    }

    #[test]
    fn properties() {
        assert_eq!(parse_property("a=b=c").unwrap(), ("a".to_string(), "b=c".to_string()));
        assert_eq!(parse_property("a=").unwrap(), ("a".to_string(), String::new()));
        assert!(parse_property("=b").is_err());
        assert!(parse_property("ab").is_err());
    }

    #[test]
    fn ack_record_json() {
        let r = AckRecord { seq: 3, id: MessageId::new(1, 2, -1, -1).to_string(), key: None };
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"seq":3,"id":"1:2:-1:-1","key":null}"#);
        let r = AckRecord { seq: 0, id: "0:0:0:0".into(), key: Some("k0") };
        assert_eq!(serde_json::to_string(&r).unwrap(), r#"{"seq":0,"id":"0:0:0:0","key":"k0"}"#);
    }
}
