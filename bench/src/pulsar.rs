//! `--protocol pulsar`: the workload of [`crate::run`] through the broker's
//! Pulsar door, with Apache Pulsar's Rust client (the `pulsar` crate).
//!
//! Only the client layer differs from the native run: the same topics
//! (partitioned topics created through the native admin API first, on a
//! native probe connection that also reads the server version), the same
//! producer schedule, in-flight bound, payload stamps, recorder, CPU marks,
//! drain and report. Each producer and each consumer has a `Pulsar` client
//! of its own (one connection each, as the native run's default), or one of
//! `connections` shared ones. The crate routes a partitioned producer's
//! messages round-robin, keyed ones by its hash of the key; its batches
//! follow the workload's limits (messages, 128 KiB, delay); consumers ack
//! each message individually (the crate sends one ACK per message).

use crate::run::{
    drive, now_ms, payload, prepare, Door, ProducerPlan, RunError, RunOptions, RunOutcome, Slots, PERMITS_CHUNK_MAX,
    STAMP_BYTES,
};
use crate::stats::Recorder;
use crate::workload::{Compression, SubType, Workload};
use bytes::Bytes;
use futures::stream::{FuturesUnordered, StreamExt};
use pulsar::compression::{CompressionLz4, CompressionSnappy, CompressionZstd};
use pulsar::consumer::InitialPosition;
use pulsar::producer::{Message as PulsarMessage, SendFuture};
use pulsar::{ConsumerOptions, Producer, ProducerOptions, Pulsar, TokioExecutor};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinHandle;

/// Bytes at which a batch leaves, as the native client's default (and
/// Pulsar's clients').
const BATCH_MAX_BYTES: usize = 128 * 1024;

/// The Pulsar door's URL for a broker address given as `HOST:PORT`,
/// `magnetar://HOST:PORT` or `pulsar://HOST:PORT` (one port serves both
/// protocols).
pub fn pulsar_url(url: &str) -> Result<String, RunError> {
    let addr = match url.split_once("://") {
        None => url,
        Some(("magnetar" | "pulsar", addr)) => addr,
        Some((scheme, _)) => {
            return Err(RunError::Other(format!("--protocol pulsar: {scheme}:// is not supported (plain TCP only)")))
        }
    };
    Ok(format!("pulsar://{}", addr.trim_end_matches('/')))
}

fn pulsar_err(what: impl Into<String>) -> impl FnOnce(pulsar::Error) -> RunError {
    let what = what.into();
    move |e| RunError::Other(format!("{what}: {e}"))
}

/// The crate's producer options for the workload: batching (when on) and
/// codec; sends wait for room in the client's queue rather than fail.
fn producer_options(w: &Workload) -> ProducerOptions {
    let batching = w.batching();
    ProducerOptions {
        batch_size: batching.as_ref().map(|b| b.max_messages as u32),
        batch_byte_size: batching.as_ref().map(|_| BATCH_MAX_BYTES),
        batch_timeout: batching.as_ref().map(|b| b.max_delay),
        compression: Some(match w.compression {
            Compression::None => pulsar::compression::Compression::None,
            Compression::Lz4 => pulsar::compression::Compression::Lz4(CompressionLz4::default()),
            Compression::Zstd => pulsar::compression::Compression::Zstd(CompressionZstd::default()),
            Compression::Snappy => pulsar::compression::Compression::Snappy(CompressionSnappy::default()),
        }),
        block_queue_if_full: true,
        ..ProducerOptions::default()
    }
}

fn sub_type(w: &Workload) -> pulsar::SubType {
    match w.subscription_type {
        SubType::Exclusive => pulsar::SubType::Exclusive,
        SubType::Failover => pulsar::SubType::Failover,
        SubType::Shared => pulsar::SubType::Shared,
        SubType::KeyShared => pulsar::SubType::KeyShared,
    }
}

/// `Pulsar` clients: one per producer and consumer, or `n` shared round-robin.
struct Clients {
    url: String,
    /// Room in each client's outbound queue (messages awaiting the socket).
    outbound: usize,
    shared: Vec<Pulsar<TokioExecutor>>,
    next: usize,
}

impl Clients {
    async fn connect(&self) -> Result<Pulsar<TokioExecutor>, RunError> {
        Pulsar::builder(self.url.clone(), TokioExecutor)
            .with_outbound_channel_size(self.outbound)
            .build()
            .await
            .map_err(pulsar_err(format!("connecting to {}", self.url)))
    }

    async fn next(&mut self, n: u32) -> Result<Pulsar<TokioExecutor>, RunError> {
        if n == 0 {
            return self.connect().await;
        }
        let i = self.next % n as usize;
        self.next += 1;
        if i == self.shared.len() {
            let c = self.connect().await?;
            self.shared.push(c);
        }
        Ok(self.shared[i].clone())
    }
}

/// A send on its way: intended time, size, and the crate's receipt future.
struct Sent {
    intended: Instant,
    bytes: usize,
    receipt: SendFuture,
}

/// Records receipts as they complete, giving back one in-flight permit each.
async fn collect(mut rx: mpsc::UnboundedReceiver<Vec<Sent>>, rec: Recorder, in_flight: Arc<Semaphore>) {
    let mut pending = FuturesUnordered::new();
    let mut open = true;
    loop {
        tokio::select! {
            next = rx.recv(), if open => match next {
                Some(run) => {
                    for Sent { intended, bytes, receipt } in run {
                        pending.push(async move {
                            let r = receipt.await;
                            (intended, Instant::now(), bytes, r)
                        });
                    }
                }
                None => open = false,
            },
            Some((intended, at, bytes, r)) = pending.next(), if !pending.is_empty() => {
                match r {
                    Ok(_) => rec.published(intended, at, bytes),
                    Err(e) => rec.publish_failed(e.to_string()),
                }
                in_flight.add_permits(1);
            }
            else => break,
        }
    }
}

struct ProducerCtx {
    producer: Producer<TokioExecutor>,
    receipts: mpsc::UnboundedSender<Vec<Sent>>,
    in_flight: Arc<Semaphore>,
    permits_chunk: u32,
}

async fn open_producer(
    w: &Workload,
    topic: &str,
    rec: &Recorder,
    collectors: &mut Vec<JoinHandle<()>>,
    clients: &mut Clients,
) -> Result<ProducerCtx, RunError> {
    let client = clients.next(w.connections).await?;
    let producer = client
        .producer()
        .with_topic(topic)
        .with_options(producer_options(w))
        .build()
        .await
        .map_err(pulsar_err(format!("create producer on {topic}")))?;
    // As the native run: max_pending messages in flight per partition, a
    // message's permit given back when its receipt is recorded.
    let limit = (w.max_pending as usize).saturating_mul(w.partitions as usize).max(1);
    let in_flight = Arc::new(Semaphore::new(limit));
    let permits_chunk = u32::try_from(limit / 16).unwrap_or(u32::MAX).clamp(1, PERMITS_CHUNK_MAX);
    let (tx, rx) = mpsc::unbounded_channel();
    collectors.push(tokio::spawn(collect(rx, rec.clone(), in_flight.clone())));
    Ok(ProducerCtx { producer, receipts: tx, in_flight, permits_chunk })
}

/// The native run's produce loop (see `crate::run`) on the crate's producer:
/// the same schedule, slot and stamp; sends are handed to the collector in
/// runs, before every wait.
async fn produce_loop(
    mut ctx: ProducerCtx,
    plan: ProducerPlan,
    w: Workload,
    rec: Recorder,
    filler: Bytes,
) -> Producer<TokioExecutor> {
    let sizes = match w.size_dist() {
        Ok(d) => crate::dist::SizeGen::new(d),
        Err(e) => {
            rec.publish_failed(e.to_string());
            return ctx.producer;
        }
    };
    let keys = crate::dist::KeyGen::new(w.key_distribution, w.keys, w.zipf_exponent);
    let mut rng = crate::dist::Rng::new(w.seed.wrapping_mul(1_000_003).wrapping_add(u64::from(plan.index)));
    let mut slots = Slots::new(&plan, ctx.in_flight.clone(), ctx.permits_chunk);
    let mut run: Vec<Sent> = Vec::with_capacity(ctx.permits_chunk as usize);
    let hand_over = |run: &mut Vec<Sent>, tx: &mpsc::UnboundedSender<Vec<Sent>>, cap: usize| {
        if !run.is_empty() {
            let _ = tx.send(std::mem::replace(run, Vec::with_capacity(cap)));
        }
    };
    let cap = ctx.permits_chunk as usize;
    while let Some(intended) = slots.next(|| hand_over(&mut run, &ctx.receipts, cap)).await {
        let size = sizes.next(&mut rng);
        let msg = PulsarMessage {
            payload: payload(&filler, size, rec.stamp(intended)).to_vec(),
            partition_key: keys.next(&mut rng).map(|k| format!("k{k}")),
            ..PulsarMessage::default()
        };
        let mut send = std::pin::pin!(ctx.producer.send_non_blocking(msg));
        let sent = match futures::poll!(send.as_mut()) {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => {
                hand_over(&mut run, &ctx.receipts, cap);
                send.await
            }
        };
        match sent {
            Ok(receipt) => run.push(Sent { intended, bytes: size, receipt }),
            Err(e) => {
                ctx.in_flight.add_permits(1);
                rec.publish_failed(e.to_string());
                break;
            }
        }
    }
    hand_over(&mut run, &ctx.receipts, cap);
    slots.give_back_unused();
    // A batch still open goes out now (its receipts are awaited by the collector).
    let _ = ctx.producer.send_batch().await;
    // Dropping the sender lets the collector end once every receipt is in;
    // the producer is closed after that.
    drop(ctx.receipts);
    ctx.producer
}

async fn consume_loop(
    mut consumer: pulsar::Consumer<Vec<u8>, TokioExecutor>,
    rec: Recorder,
    mut stop: watch::Receiver<bool>,
    timed: bool,
) {
    let stopped = stop.changed();
    tokio::pin!(stopped);
    loop {
        let msg = tokio::select! {
            biased;
            _ = &mut stopped => break,
            msg = consumer.next() => msg,
        };
        let now = Instant::now();
        match msg {
            Some(Ok(m)) => {
                let data = &m.payload.data;
                let bytes = data.len();
                if !timed {
                    rec.received_untimed(now, bytes);
                } else if bytes >= STAMP_BYTES {
                    let mut stamp = [0u8; STAMP_BYTES];
                    stamp.copy_from_slice(&data[..STAMP_BYTES]);
                    rec.received(rec.instant_of(u64::from_le_bytes(stamp)), now, bytes);
                } else {
                    let publish_ms = m.payload.metadata.publish_time;
                    let age = Duration::from_millis(now_ms().saturating_sub(publish_ms));
                    rec.received(now.checked_sub(age).unwrap_or(now), now, bytes);
                }
                if consumer.ack(&m).await.is_err() {
                    break;
                }
            }
            Some(Err(_)) => continue,
            None => break,
        }
    }
    let _ = consumer.close().await;
}

async fn open_consumers(
    w: &Workload,
    topics: &[String],
    rec: &Recorder,
    stop: &watch::Receiver<bool>,
    timed: bool,
    clients: &mut Clients,
) -> Result<Vec<JoinHandle<()>>, RunError> {
    let mut tasks = Vec::new();
    for topic in topics {
        for s in 0..w.subscriptions {
            for _c in 0..w.consumers {
                let client = clients.next(w.connections).await?;
                let consumer: pulsar::Consumer<Vec<u8>, TokioExecutor> = client
                    .consumer()
                    .with_topic(topic)
                    .with_subscription(format!("sub-{s}"))
                    .with_subscription_type(sub_type(w))
                    .with_batch_size(w.receiver_queue_size)
                    .with_options(ConsumerOptions::default().with_initial_position(InitialPosition::Earliest))
                    .build()
                    .await
                    .map_err(pulsar_err(format!("subscribe to {topic}")))?;
                tasks.push(tokio::spawn(consume_loop(consumer, rec.clone(), stop.clone(), timed)));
            }
        }
    }
    Ok(tasks)
}

/// The Pulsar door: the `pulsar` crate's clients.
struct PulsarDoor {
    w: Workload,
    consumer_clients: Clients,
    producer_clients: Clients,
    ctxs: Vec<ProducerCtx>,
    collectors: Vec<JoinHandle<()>>,
}

impl Door for PulsarDoor {
    type Finished = Producer<TokioExecutor>;

    async fn open_consumers(
        &mut self,
        topics: &[String],
        rec: &Recorder,
        stop: &watch::Receiver<bool>,
        timed: bool,
    ) -> Result<Vec<JoinHandle<()>>, RunError> {
        open_consumers(&self.w, topics, rec, stop, timed, &mut self.consumer_clients).await
    }

    async fn open_producers(&mut self, topics: &[String], rec: &Recorder) -> Result<usize, RunError> {
        for topic in topics {
            for _ in 0..self.w.producers {
                let ctx = open_producer(&self.w, topic, rec, &mut self.collectors, &mut self.producer_clients).await?;
                self.ctxs.push(ctx);
            }
        }
        Ok(self.ctxs.len())
    }

    fn topic_shards(&self) -> Vec<u32> {
        Vec::new()
    }

    fn spawn_producers(
        &mut self,
        plans: Vec<ProducerPlan>,
        rec: &Recorder,
        filler: &Bytes,
    ) -> Vec<JoinHandle<Producer<TokioExecutor>>> {
        std::mem::take(&mut self.ctxs)
            .into_iter()
            .zip(plans)
            .map(|(ctx, plan)| tokio::spawn(produce_loop(ctx, plan, self.w.clone(), rec.clone(), filler.clone())))
            .collect()
    }

    fn take_collectors(&mut self) -> Vec<JoinHandle<()>> {
        std::mem::take(&mut self.collectors)
    }

    async fn close(self, finished: Vec<Producer<TokioExecutor>>) {
        for mut p in finished {
            let _ = p.close().await;
        }
    }
}

/// [`crate::run::run`] through the Pulsar door; call inside a tokio runtime.
pub async fn run_pulsar(opts: RunOptions) -> Result<RunOutcome, RunError> {
    let w = opts.workload.clone();
    w.validate()?;
    let url = pulsar_url(&opts.url)?;
    // The native probe: server version, topic placement and creation (the
    // same partitioned topics as the native run).
    let mut probe_options = opts.client_options.clone();
    probe_options.shard_aware = false;
    let prepared = prepare(&opts, probe_options).await?;
    let outbound = (w.max_pending as usize).saturating_mul(w.partitions.max(1) as usize).max(1000);
    let door = PulsarDoor {
        consumer_clients: Clients { url: url.clone(), outbound, shared: Vec::new(), next: 0 },
        producer_clients: Clients { url, outbound, shared: Vec::new(), next: 0 },
        w,
        ctxs: Vec::new(),
        collectors: Vec::new(),
    };
    drive(&opts, prepared, false, door).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_map_to_the_pulsar_scheme() {
        assert_eq!(pulsar_url("127.0.0.1:6650").ok(), Some("pulsar://127.0.0.1:6650".into()));
        assert_eq!(pulsar_url("magnetar://h:1").ok(), Some("pulsar://h:1".into()));
        assert_eq!(pulsar_url("pulsar://h:1/").ok(), Some("pulsar://h:1".into()));
        assert!(pulsar_url("magnetar+tls://h:1").is_err());
    }
}
