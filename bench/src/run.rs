//! Running a workload against a broker: producers, consumers, progress.
//!
//! Shape (OpenMessaging Benchmark's): each of `topics` topics has
//! `partitions` partitions; `producers` producers per topic each write to all
//! of its partitions (round-robin, or by key hash when keys are on); each of
//! `subscriptions` subscriptions per topic has `consumers` consumers reading
//! all partitions. Each topic is a real partitioned topic, created through
//! the admin API before the run; a producer is a client `PartitionedProducer`
//! (round-robin; a keyed message goes by its key's hash) and a consumer a
//! `subscribe_partitioned()` consumer, each on its own client connection.
//!
//! Latency accounting: with `rate > 0` message `i` of producer `k` (of `n`)
//! has the intended send time `start + (i + k / n) / rate_per_producer`:
//! the producers' schedules are spread evenly over one interval, as
//! independent clients' would be (all in phase, 10,000 producers at 1 msg/s
//! each sent in the same instant once a second, and the run measured how
//! long that burst took to drain); the producer never
//! sends before it, and publish and end-to-end latency count from it. So a
//! stalled broker is charged for every message that should have gone out
//! during the stall (no coordinated omission). With `rate = 0` there is no
//! schedule: a message's time starts when it gets a free `max_pending` slot
//! and is sent (`max_pending` counts messages, per partition). Starting it
//! before the slot charged each message of a one-at-a-time run with its
//! predecessor's round trip, so that shape would report two round trips.
//! The intended time travels in the first 8 bytes of the payload
//! (nanoseconds since the run's epoch; producer and consumer share
//! one process and one monotonic clock), so end-to-end latency has
//! nanosecond resolution; payloads under 8 bytes fall back to the metadata's
//! millisecond `publish_time`.

use crate::dist::{KeyGen, Rng, SizeGen};
use crate::pace::{Next, Pace, Period, RateSearch, Schedule, SearchResult, SEARCH_PERIOD, SEARCH_START_RATE};
use crate::stats::{Recorder, Tick, Totals};
use crate::workload::{Workload, WorkloadError};
use bytes::{BufMut, Bytes, BytesMut};
use futures::stream::{FuturesUnordered, StreamExt};
use magnetar_client::{
    Client, ClientError, ClientOptions, InitialPosition, MultiTopicConsumer, OutgoingMessage, PartitionedProducer,
    RoutedSend, RoutingMode,
};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};
use tokio::sync::{mpsc, watch, Semaphore};
use tokio::task::JoinHandle;

/// Payload bytes carrying the intended send time.
pub const STAMP_BYTES: usize = 8;
/// How long the end of a run waits for outstanding receipts and for
/// consumers to catch up, at most, while they still make progress.
pub const DRAIN_IDLE_MAX: Duration = Duration::from_secs(10);

#[derive(Debug, thiserror::Error)]
pub enum RunError {
    #[error(transparent)]
    Workload(#[from] WorkloadError),
    #[error("{what}: {source}")]
    Client { what: String, source: ClientError },
    #[error("{0}")]
    Other(String),
}

pub(crate) fn client_err(what: impl Into<String>) -> impl FnOnce(ClientError) -> RunError {
    let what = what.into();
    move |source| RunError::Client { what, source }
}

/// How to run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    pub workload: Workload,
    pub url: String,
    /// Print a progress line to stderr each `tick`.
    pub progress: bool,
    pub tick: Duration,
    pub client_options: ClientOptions,
    /// Pid of a broker on this machine, to report its CPU per message.
    pub broker_pid: Option<u32>,
}

impl RunOptions {
    pub fn new(workload: Workload, url: impl Into<String>) -> RunOptions {
        RunOptions {
            workload,
            url: url.into(),
            progress: true,
            tick: Duration::from_secs(1),
            client_options: ClientOptions::default(),
            broker_pid: None,
        }
    }
}

/// The backlog phase's figures.
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq)]
pub struct BacklogResult {
    pub messages: u64,
    pub bytes: u64,
    pub produce_s: f64,
    pub produce_msgs_per_s: f64,
    pub produce_mb_per_s: f64,
    /// From the consumers' subscribe to the last backlog message received.
    pub catchup_s: f64,
    pub consume_msgs_per_s: f64,
    pub consume_mb_per_s: f64,
    /// CPU of client and broker during the catch-up alone (`catchup_s`),
    /// per backlog message received; the run's `cpu` covers both phases.
    /// Absent from results written before it was added.
    #[serde(default)]
    pub catchup_cpu: Option<crate::cpu::CpuUse>,
}

/// What a run measured.
pub struct RunOutcome {
    pub run_id: String,
    pub topics: Vec<String>,
    /// The broker shard owning each of `topics` (as the producers'
    /// connections found it); empty when not shard-aware or no producer ran.
    pub topic_shards: Vec<u32>,
    pub server_version: String,
    /// Whether producers and consumers went straight to their owner shard.
    pub shard_aware: bool,
    pub totals: Totals,
    pub backlog: Option<BacklogResult>,
    /// The sustainable-rate search, when the workload asked for one.
    pub search: Option<SearchResult>,
    /// True when every acknowledged message was received by every subscription.
    pub drained: bool,
    /// CPU of client and broker from the first send to the end of the drain.
    pub cpu: crate::cpu::CpuUse,
}

/// Random, incompressible filler that payloads are cut from.
pub(crate) fn filler(len: usize, seed: u64) -> Bytes {
    let mut rng = Rng::new(seed ^ 0xF111);
    let mut b = BytesMut::with_capacity(len + 8);
    while b.len() < len {
        b.put_u64_le(rng.next_u64());
    }
    b.truncate(len);
    b.freeze()
}

/// Build one payload of `size` bytes stamped with `stamp`.
pub fn payload(filler: &Bytes, size: usize, stamp: u64) -> Bytes {
    if size < STAMP_BYTES {
        return filler.slice(..size);
    }
    let mut b = BytesMut::with_capacity(size);
    b.put_u64_le(stamp);
    b.extend_from_slice(&filler[STAMP_BYTES..size]);
    b.freeze()
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as u64).unwrap_or(0)
}

struct ProducerCtx {
    producer: Arc<PartitionedProducer>,
    /// One channel per partition's collector (see `open_producer`); the
    /// produce loop hands sends over in runs (see `Handoff`).
    receipts: Vec<mpsc::UnboundedSender<Vec<Sent>>>,
    /// One permit per message in flight (`max_pending × partitions`): the
    /// client's own bound counts sends, and a batch is one send. Taken in
    /// chunks of `permits_chunk` and given back by the collectors in runs,
    /// which keeps fewer messages in flight, never more.
    in_flight: Arc<Semaphore>,
    permits_chunk: u32,
}

/// A message on its way: its intended send time, size and receipt. Its
/// in-flight permit is given back when its receipt is recorded. (The
/// channels are unbounded: the permits bound what they hold.)
struct Sent {
    intended: Instant,
    bytes: usize,
    receipt: RoutedSend,
}

/// The produce loop's sends not yet handed to their collectors: one run
/// per collector. Handed over once per `permits_chunk` messages and before
/// every wait of the loop (a timer, an in-flight slot, a send that does not
/// complete at once), so a collector sees a send no later than the loop's
/// next wait, and never while the loop holds its permits idle. Batching
/// the hand-over spares a channel send and a collector wake-up per
/// message, a cost the client pays on every message of a fast run.
struct Handoff {
    runs: Vec<Vec<Sent>>,
    /// Room a new run is made with.
    capacity: usize,
}

impl Handoff {
    fn new(collectors: usize, capacity: usize) -> Handoff {
        Handoff { runs: (0..collectors).map(|_| Vec::with_capacity(capacity)).collect(), capacity }
    }

    fn push(&mut self, collector: usize, sent: Sent) {
        if let Some(run) = self.runs.get_mut(collector) {
            run.push(sent);
        }
    }

    /// Hands every run over to its collector.
    fn hand_over(&mut self, collectors: &[mpsc::UnboundedSender<Vec<Sent>>]) {
        for (run, tx) in self.runs.iter_mut().zip(collectors) {
            if !run.is_empty() {
                let _ = tx.send(std::mem::replace(run, Vec::with_capacity(self.capacity)));
            }
        }
    }
}

/// Most permits the produce loop takes at once.
pub(crate) const PERMITS_CHUNK_MAX: u32 = 64;
/// Most receipts a collector holds before recording them and giving their
/// permits back.
const RECEIPTS_RUN_MAX: usize = 256;

/// The client connections of a run: one per producer and consumer, or
/// `connections` of each kind shared round-robin.
struct Connections {
    shared: Vec<Client>,
    next: usize,
}

impl Connections {
    fn new() -> Connections {
        Connections { shared: Vec::new(), next: 0 }
    }

    /// The connection for the next producer (or consumer): a new one, or the
    /// next of the `n` shared ones (opened on first use).
    async fn next(&mut self, opts: &RunOptions, n: u32) -> Result<Client, RunError> {
        if n == 0 {
            return Client::connect_with(&opts.url, opts.client_options.clone()).await.map_err(client_err(&opts.url));
        }
        let i = self.next % n as usize;
        self.next += 1;
        if i == self.shared.len() {
            let c =
                Client::connect_with(&opts.url, opts.client_options.clone()).await.map_err(client_err(&opts.url))?;
            self.shared.push(c);
        }
        Ok(self.shared[i].clone())
    }
}

pub(crate) struct ProducerPlan {
    pub index: u32,
    /// Where in one interval of the rate this producer's messages fall:
    /// `index / producers` (see the module doc).
    pub phase: f64,
    /// Stop after this many messages (backlog phase).
    pub count: Option<u64>,
    /// Rate and stop time, shared by all producers (changed by a search).
    pub pace: Arc<Pace>,
}

/// Open one logical producer: a connection and a partitioned producer on
/// `topic` (with the workload's batching and codec), plus the tasks that
/// await its receipts: one per partition, since receipts of different
/// partitions complete independently (one slow partition must not delay the
/// time recorded for the others), while one partition's complete in send
/// order, so its collector awaits them in turn.
async fn open_producer(
    opts: &RunOptions,
    topic: &str,
    rec: &Recorder,
    collectors: &mut Vec<JoinHandle<()>>,
    conns: &mut Connections,
) -> Result<(Client, ProducerCtx), RunError> {
    let w = &opts.workload;
    let client = conns.next(opts, w.connections).await?;
    let mut builder =
        client.producer(topic.to_string()).max_pending(w.max_pending as usize).compression(w.compression_type());
    let batching = w.batching();
    // Key-based batches of one partition complete in the order they fill,
    // not in send order.
    let in_send_order = !batching.as_ref().is_some_and(|b| b.key_based);
    if let Some(batching) = batching {
        builder = builder.batching(batching);
    }
    let producer = builder
        .create_partitioned(RoutingMode::RoundRobin)
        .await
        .map_err(client_err(format!("create producer on {topic}")))?;
    // What may be in flight: max_pending messages per partition. The permit
    // of a message is given back when its receipt is recorded, so the
    // producer never runs ahead of its own receipts.
    let limit = (w.max_pending as usize).saturating_mul(w.partitions as usize).max(1);
    let in_flight = Arc::new(Semaphore::new(limit));
    let permits_chunk = u32::try_from(limit / 16).unwrap_or(u32::MAX).clamp(1, PERMITS_CHUNK_MAX);
    let mut receipts = Vec::new();
    for _ in 0..producer.partitions().max(1) {
        let (tx, rx) = mpsc::unbounded_channel();
        receipts.push(tx);
        let (rec, in_flight) = (rec.clone(), in_flight.clone());
        collectors.push(if in_send_order {
            tokio::spawn(collect_in_order(rx, rec, in_flight))
        } else {
            tokio::spawn(collect_as_they_come(rx, rec, in_flight))
        });
    }
    let ctx = ProducerCtx { producer: Arc::new(producer), receipts, in_flight, permits_chunk };
    Ok((client, ctx))
}

/// Records one partition's receipts, awaiting them in send order. The
/// messages of one entry (a batch) complete at once: they share one clock
/// reading and one lock of the recorder.
async fn collect_in_order(mut rx: mpsc::UnboundedReceiver<Vec<Sent>>, rec: Recorder, in_flight: Arc<Semaphore>) {
    let mut run: Vec<(Instant, usize)> = Vec::with_capacity(RECEIPTS_RUN_MAX);
    // The entry whose receipt the run holds, and when it was seen.
    let mut seen: Option<((i32, u64, u64), Instant)> = None;
    let record = |run: &mut Vec<(Instant, usize)>, seen: &Option<(_, Instant)>| {
        if let (Some((_, at)), false) = (seen, run.is_empty()) {
            rec.published_many(*at, run);
            in_flight.add_permits(run.len());
            run.clear();
        }
    };
    let mut sends = Vec::new().into_iter();
    loop {
        let sent = match sends.next() {
            Some(sent) => sent,
            None => {
                sends = match rx.try_recv() {
                    Ok(run) => run.into_iter(),
                    Err(mpsc::error::TryRecvError::Disconnected) => break,
                    Err(mpsc::error::TryRecvError::Empty) => {
                        // Never wait while holding permits.
                        record(&mut run, &seen);
                        match rx.recv().await {
                            Some(run) => run.into_iter(),
                            None => break,
                        }
                    }
                };
                continue;
            }
        };
        let mut receipt = std::pin::pin!(sent.receipt.receipt());
        let result = match futures::poll!(receipt.as_mut()) {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => {
                record(&mut run, &seen);
                receipt.await
            }
        };
        match result {
            Ok(id) => {
                let entry = (id.partition, id.ledger, id.entry);
                if seen.is_none_or(|(e, _)| e != entry) || run.len() >= RECEIPTS_RUN_MAX {
                    record(&mut run, &seen);
                    seen = Some((entry, Instant::now()));
                }
                run.push((sent.intended, sent.bytes));
            }
            Err(e) => {
                record(&mut run, &seen);
                rec.publish_failed(e.to_string());
                in_flight.add_permits(1);
            }
        }
    }
    record(&mut run, &seen);
}

/// Records one partition's receipts as they complete (key-based batching,
/// where they need not complete in send order).
async fn collect_as_they_come(mut rx: mpsc::UnboundedReceiver<Vec<Sent>>, rec: Recorder, in_flight: Arc<Semaphore>) {
    let mut pending = FuturesUnordered::new();
    let mut open = true;
    loop {
        tokio::select! {
            next = rx.recv(), if open => match next {
                Some(run) => {
                    for Sent { intended, bytes, receipt } in run {
                        pending.push(async move {
                            let r = receipt.receipt().await;
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

/// One producer's schedule and in-flight slots, shared by both doors'
/// produce loops: when the next message counts from, once it has a slot.
pub(crate) struct Slots {
    count: Option<u64>,
    pace: Arc<Pace>,
    schedule: Schedule,
    in_flight: Arc<Semaphore>,
    chunk: u32,
    /// In-flight permits taken and not yet used by a message.
    spare: u32,
    /// Messages given a slot so far.
    given: u64,
}

impl Slots {
    pub(crate) fn new(plan: &ProducerPlan, in_flight: Arc<Semaphore>, chunk: u32) -> Slots {
        Slots {
            count: plan.count,
            pace: plan.pace.clone(),
            schedule: Schedule::new(Instant::now(), plan.phase),
            in_flight,
            chunk,
            spare: 0,
            given: 0,
        }
    }

    /// The next message's intended time, with its in-flight permit taken;
    /// `None` once the run is over (its count reached, its stop time
    /// passed). `before_wait` runs before every wait, so what the caller
    /// holds goes out first. With a rate the intended time is fixed by the
    /// schedule, so waiting for a slot is charged to latency; without one
    /// the message's time starts once it has a slot (see the module doc).
    pub(crate) async fn next(&mut self, mut before_wait: impl FnMut()) -> Option<Instant> {
        if self.count.is_some_and(|c| self.given >= c) {
            return None;
        }
        let stop_at = self.pace.stop_at();
        let scheduled = match self.schedule.intended(&self.pace, self.given) {
            Some(at) if stop_at.is_some_and(|s| at >= s) => return None,
            Some(at) => {
                let now = Instant::now();
                if at > now {
                    before_wait();
                    tokio::time::sleep_until(at.into()).await;
                } else {
                    self.pace.note_lag(now - at);
                }
                Some(at)
            }
            None => None,
        };
        if self.spare == 0 {
            before_wait();
            // Never closed while the producer runs.
            let permits = self.in_flight.acquire_many(self.chunk).await.ok()?;
            permits.forget();
            self.spare = self.chunk;
        }
        let intended = match scheduled {
            Some(at) => at,
            None => {
                let now = Instant::now();
                if stop_at.is_some_and(|s| now >= s) {
                    return None;
                }
                now
            }
        };
        self.spare -= 1;
        self.given += 1;
        Some(intended)
    }

    /// Gives back the permits taken and not used (at the end of the run).
    pub(crate) fn give_back_unused(&mut self) {
        self.in_flight.add_permits(std::mem::take(&mut self.spare) as usize);
    }
}

async fn produce_loop(ctx: ProducerCtx, plan: ProducerPlan, w: Workload, rec: Recorder, filler: Bytes) {
    let sizes = match w.size_dist() {
        Ok(d) => SizeGen::new(d),
        Err(e) => return rec.publish_failed(e.to_string()),
    };
    let keys = KeyGen::new(w.key_distribution, w.keys, w.zipf_exponent);
    let mut rng = Rng::new(w.seed.wrapping_mul(1_000_003).wrapping_add(u64::from(plan.index)));
    let mut slots = Slots::new(&plan, ctx.in_flight.clone(), ctx.permits_chunk);
    let mut handoff = Handoff::new(ctx.receipts.len(), ctx.permits_chunk as usize);
    // Timer lateness (tokio's is up to ~1 ms) is charged to the measurement,
    // since latency counts from the intended time.
    while let Some(intended) = slots.next(|| handoff.hand_over(&ctx.receipts)).await {
        let size = sizes.next(&mut rng);
        // The client routes: keyed messages by the key's hash (FNV-1a),
        // the others round-robin.
        let mut msg = OutgoingMessage::new(payload(&filler, size, rec.stamp(intended)));
        msg.key = keys.next(&mut rng).map(|k| format!("k{k}"));
        let mut send = std::pin::pin!(ctx.producer.send_async(msg));
        let sent = match futures::poll!(send.as_mut()) {
            std::task::Poll::Ready(r) => r,
            std::task::Poll::Pending => {
                handoff.hand_over(&ctx.receipts);
                send.await
            }
        };
        match sent {
            Ok(receipt) => {
                let collector = receipt.partition() % ctx.receipts.len().max(1);
                handoff.push(collector, Sent { intended, bytes: size, receipt });
            }
            Err(e) => {
                ctx.in_flight.add_permits(1);
                let fatal = !matches!(e, ClientError::MessageTooLarge { .. });
                rec.publish_failed(e.to_string());
                if fatal {
                    break;
                }
            }
        }
    }
    handoff.hand_over(&ctx.receipts);
    slots.give_back_unused();
    // Dropping `ctx.receipts` lets the collectors end once every receipt is in.
}

async fn consume_loop(
    consumer: std::sync::Arc<MultiTopicConsumer>,
    rec: Recorder,
    mut stop: watch::Receiver<bool>,
    timed: bool,
) {
    // One wait for the stop signal for the whole loop: a new one per message
    // would register with the watch each time, a per-message cost that
    // shows in a catch-up.
    let stopped = stop.changed();
    tokio::pin!(stopped);
    loop {
        let msg = tokio::select! {
            biased;
            _ = &mut stopped => break,
            msg = consumer.receive() => msg,
        };
        let now = Instant::now();
        match msg {
            Ok(m) => {
                let bytes = m.payload.len();
                if !timed {
                    rec.received_untimed(now, bytes);
                } else if bytes >= STAMP_BYTES {
                    let mut stamp = [0u8; STAMP_BYTES];
                    stamp.copy_from_slice(&m.payload[..STAMP_BYTES]);
                    rec.received(rec.instant_of(u64::from_le_bytes(stamp)), now, bytes);
                } else {
                    let age = Duration::from_millis(now_ms().saturating_sub(m.publish_time_ms()));
                    rec.received(now.checked_sub(age).unwrap_or(now), now, bytes);
                }
                if consumer.ack(&m).await.is_err() {
                    break;
                }
            }
            Err(ClientError::Wire(_)) => continue,
            Err(_) => break,
        }
    }
    let _ = consumer.close().await;
}

/// Subscribe every consumer of every topic (all its partitions); spawn
/// their receive loops.
async fn open_consumers(
    opts: &RunOptions,
    topics: &[String],
    rec: &Recorder,
    stop: &watch::Receiver<bool>,
    timed: bool,
    clients: &mut Vec<Client>,
) -> Result<Vec<JoinHandle<()>>, RunError> {
    let w = &opts.workload;
    let mut tasks = Vec::new();
    let mut conns = Connections::new();
    for topic in topics {
        for s in 0..w.subscriptions {
            for _c in 0..w.consumers {
                let client = conns.next(opts, w.connections).await?;
                let consumer = client
                    .subscribe(topic.clone(), format!("sub-{s}"))
                    .sub_type(w.subscription_type())
                    .initial_position(InitialPosition::Earliest)
                    .receiver_queue_size(w.receiver_queue_size)
                    .subscribe_partitioned()
                    .await
                    .map_err(client_err(format!("subscribe to {topic}")))?;
                tasks.push(tokio::spawn(consume_loop(consumer, rec.clone(), stop.clone(), timed)));
                clients.push(client);
            }
        }
    }
    Ok(tasks)
}

fn fmt_count(v: f64) -> String {
    let n = v.round() as u64;
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// One progress line.
pub fn progress_line(t: &Tick) -> String {
    format!(
        "[{:>5.1}s {:<7}] prod {:>9} msg/s {:>7.1} MB/s | cons {:>9} msg/s {:>7.1} MB/s | pub p50 {:>7.3} p99 {:>8.3} ms | e2e p99 {:>8.3} ms | backlog {}{}",
        t.t_s,
        t.phase,
        fmt_count(t.produce_msgs_per_s),
        t.produce_mb_per_s,
        fmt_count(t.consume_msgs_per_s),
        t.consume_mb_per_s,
        t.publish_p50_ms,
        t.publish_p99_ms,
        t.e2e_p99_ms,
        t.backlog,
        if t.publish_errors > 0 { format!(" | {} errors", t.publish_errors) } else { String::new() },
    )
}

pub(crate) fn spawn_ticker(
    rec: &Recorder,
    every: Duration,
    print: bool,
    mut stop: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let rec = rec.clone();
    tokio::spawn(async move {
        let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + every, every);
        loop {
            tokio::select! {
                _ = interval.tick() => {}
                _ = stop.changed() => break,
            }
            let t = rec.tick(Instant::now());
            if print {
                eprintln!("{}", progress_line(&t));
            }
        }
    })
}

/// Wait until `done()` or until `progress()` stops changing for `idle_max`.
pub(crate) async fn wait_quiet(
    mut done: impl FnMut() -> bool,
    mut progress: impl FnMut() -> u64,
    idle_max: Duration,
) -> bool {
    let mut last = progress();
    let mut last_change = Instant::now();
    loop {
        if done() {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        let now_progress = progress();
        if now_progress != last {
            last = now_progress;
            last_change = Instant::now();
        } else if last_change.elapsed() >= idle_max {
            return done();
        }
    }
}

/// Whether a measured window kept up with `rate`: it produced at least 99 %
/// of the rate and its consumers received at least 99 % of that (a
/// shortfall of 1 % adds 10 ms of lag per second).
pub(crate) fn held(totals: &Totals, rate: f64) -> bool {
    let secs = totals.window.as_secs_f64().max(1e-9);
    let produced = totals.produced_msgs as f64 / secs;
    let consumed = totals.consumed_msgs as f64 / secs;
    produced >= 0.99 * rate && consumed >= 0.99 * produced
}

/// The sustainable-rate search (see [`crate::pace`]): one period at a time,
/// until the controller settles, `search_max_s` runs out, or every producer
/// has stopped. Prints a line per period with `progress`.
pub(crate) async fn search_rate<T>(
    rec: &Recorder,
    pace: &Pace,
    start_rate: f64,
    w: &Workload,
    progress: bool,
    producers: &[JoinHandle<T>],
) -> SearchResult {
    let subs = f64::from(w.subscriptions.max(1));
    let began = Instant::now();
    let mut search = RateSearch::new(start_rate);
    let (mut produced_last, mut consumed_last, mut at_last) = (rec.produced_all(), rec.consumed_all(), began);
    let mut settled = None;
    while began.elapsed().as_secs_f64() < w.search_max_s && !producers.iter().all(|t| t.is_finished()) {
        tokio::time::sleep(SEARCH_PERIOD).await;
        let (produced, consumed, now) = (rec.produced_all(), rec.consumed_all(), Instant::now());
        let period = Period {
            secs: now.duration_since(at_last).as_secs_f64(),
            produced: produced - produced_last,
            consumed: (consumed - consumed_last) as f64 / subs,
            backlog: rec.backlog() as f64 / subs,
            lag: pace.take_lag(),
        };
        (produced_last, consumed_last, at_last) = (produced, consumed, now);
        let next = search.observe(now.duration_since(began).as_secs_f64(), period);
        if progress {
            if let Some(step) = search.steps.last() {
                eprintln!(
                    "[search {:>5.1}s] tried {:>9} msg/s: produced {:>9} consumed {:>9} msg/s, backlog {}, lag {:.1} ms: {:?}{}",
                    step.t_s,
                    fmt_count(step.rate),
                    fmt_count(step.produce_msgs_per_s),
                    fmt_count(step.consume_msgs_per_s),
                    fmt_count(step.backlog),
                    step.lag_ms,
                    step.verdict,
                    match next {
                        Next::Try(r) => format!(" -> {} msg/s", fmt_count(r)),
                        Next::Done(r) => format!(" -> settled at {} msg/s", fmt_count(r)),
                    }
                );
            }
        }
        match next {
            Next::Try(rate) => pace.set_rate(rate / (producers.len().max(1) as f64)),
            Next::Done(rate) => {
                settled = Some(rate);
                break;
            }
        }
    }
    let rate = settled.unwrap_or_else(|| search.fallback());
    if progress && settled.is_none() {
        eprintln!("[search] did not settle within {} s; measuring at {} msg/s", w.search_max_s, fmt_count(rate));
    }
    SearchResult {
        rate,
        converged: settled.is_some(),
        search_s: began.elapsed().as_secs_f64(),
        steps: search.steps,
        held: None,
    }
}

/// A unique id for this run's topic names.
pub fn new_run_id() -> String {
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    format!("{:x}{:04x}", (nanos as u64) & 0xFFFF_FFFF_FFFF, std::process::id() & 0xFFFF)
}

/// Candidate run ids [`placed_run_id`] tries: with S shards about one in S
/// lands on a given shard, so running out means the shard does not exist.
const PLACEMENT_TRIES: u32 = 256;

/// A run id whose first topic's first partition is owned by broker shard
/// `shard`, found by asking the broker (`topics.owner`, which creates
/// nothing) about candidate names.
pub(crate) async fn placed_run_id(probe: &Client, w: &Workload, shard: u32) -> Result<String, RunError> {
    let base = new_run_id();
    let mut seen_max = 0;
    for k in 0..PLACEMENT_TRIES {
        let run_id = format!("{base}{k:02x}");
        let name = w.partition_topics(&run_id, 0).swap_remove(0);
        let answer = probe
            .admin()
            .call("topics.owner", serde_json::json!({ "topic": name }))
            .await
            .map_err(client_err(format!("topics.owner {name}")))?;
        let owner = answer["shard"]
            .as_u64()
            .ok_or_else(|| RunError::Other(format!("topics.owner {name}: no shard in the answer {answer}")))?;
        if owner == u64::from(shard) {
            return Ok(run_id);
        }
        seen_max = seen_max.max(owner);
    }
    Err(RunError::Other(format!(
        "--topic-shard {shard}: none of {PLACEMENT_TRIES} topic names landed on that shard (shards seen: 0 to {seen_max})"
    )))
}

/// A protocol's client layer: all that differs between the doors. How
/// consumers and producers are opened, how a producer's loop is started and
/// how producers are closed; the schedule around them ([`drive`]: windows,
/// pace, rate search, CPU marks, backlog catch-up, drain, report) is one.
pub(crate) trait Door {
    /// What a producer task hands back, closed once every receipt is in.
    type Finished: Send + 'static;
    /// Subscribes every consumer of every topic and starts its loop.
    async fn open_consumers(
        &mut self,
        topics: &[String],
        rec: &Recorder,
        stop: &watch::Receiver<bool>,
        timed: bool,
    ) -> Result<Vec<JoinHandle<()>>, RunError>;
    /// Opens the workload's producers on each of `topics` (with their
    /// receipt collectors); returns how many.
    async fn open_producers(&mut self, topics: &[String], rec: &Recorder) -> Result<usize, RunError>;
    /// Which shard owns each partition, when the door knows.
    fn topic_shards(&self) -> Vec<u32>;
    /// Starts the loop of every opened producer, `plans[i]` for the i-th.
    fn spawn_producers(
        &mut self,
        plans: Vec<ProducerPlan>,
        rec: &Recorder,
        filler: &Bytes,
    ) -> Vec<JoinHandle<Self::Finished>>;
    /// The receipt collectors: each ends after its producer's last receipt.
    fn take_collectors(&mut self) -> Vec<JoinHandle<()>>;
    /// Closes the producers and every connection.
    async fn close(self, finished: Vec<Self::Finished>);
}

/// A run's topics, made before any client of the door connects.
pub(crate) struct Prepared {
    pub server_version: String,
    /// The broker's shard ports (more than one: a shard-aware client can
    /// connect straight to an owner).
    pub shard_ports: usize,
    pub run_id: String,
    pub topics: Vec<String>,
}

/// Asks a native probe connection for the server's version and shards,
/// picks the run id (placed on `--topic-shard` if asked) and creates the
/// run's partitioned topics.
pub(crate) async fn prepare(opts: &RunOptions, probe_options: ClientOptions) -> Result<Prepared, RunError> {
    let w = &opts.workload;
    let probe = Client::connect_with(&opts.url, probe_options).await.map_err(client_err(&opts.url))?;
    let server_version = probe.server_info().server_version.clone();
    let shard_ports = probe.server_info().shard_ports.len();
    let run_id = match w.topic_shard {
        Some(shard) => placed_run_id(&probe, w, shard).await?,
        None => new_run_id(),
    };
    let topics: Vec<String> = (0..w.topics).map(|t| w.topic_name(&run_id, t)).collect();
    for topic in &topics {
        probe
            .admin()
            .create_partitioned_topic(topic, w.partitions)
            .await
            .map_err(client_err(format!("create partitioned topic {topic} ({} partitions)", w.partitions)))?;
    }
    probe.close();
    Ok(Prepared { server_version, shard_ports, run_id, topics })
}

/// The native door: the Magnetar SDK.
struct Native<'a> {
    opts: &'a RunOptions,
    shard_aware: bool,
    clients: Vec<Client>,
    conns: Connections,
    ctxs: Vec<ProducerCtx>,
    producers: Vec<Arc<PartitionedProducer>>,
    collectors: Vec<JoinHandle<()>>,
}

impl Door for Native<'_> {
    type Finished = ();

    async fn open_consumers(
        &mut self,
        topics: &[String],
        rec: &Recorder,
        stop: &watch::Receiver<bool>,
        timed: bool,
    ) -> Result<Vec<JoinHandle<()>>, RunError> {
        open_consumers(self.opts, topics, rec, stop, timed, &mut self.clients).await
    }

    async fn open_producers(&mut self, topics: &[String], rec: &Recorder) -> Result<usize, RunError> {
        for topic in topics {
            for _ in 0..self.opts.workload.producers {
                let (client, ctx) = open_producer(self.opts, topic, rec, &mut self.collectors, &mut self.conns).await?;
                self.producers.push(ctx.producer.clone());
                self.ctxs.push(ctx);
                self.clients.push(client);
            }
        }
        Ok(self.ctxs.len())
    }

    /// The first producer of each topic went straight to the owner of each
    /// partition (a one-partition run lands on a shard by chance, and the
    /// figures depend on which: bench/README.md, "Comparing runs").
    fn topic_shards(&self) -> Vec<u32> {
        let each = self.opts.workload.producers as usize;
        if !self.shard_aware || each == 0 {
            return Vec::new();
        }
        self.producers.iter().step_by(each).flat_map(|p| p.partition_shards()).collect()
    }

    fn spawn_producers(&mut self, plans: Vec<ProducerPlan>, rec: &Recorder, filler: &Bytes) -> Vec<JoinHandle<()>> {
        let w = &self.opts.workload;
        std::mem::take(&mut self.ctxs)
            .into_iter()
            .zip(plans)
            .map(|(ctx, plan)| tokio::spawn(produce_loop(ctx, plan, w.clone(), rec.clone(), filler.clone())))
            .collect()
    }

    fn take_collectors(&mut self) -> Vec<JoinHandle<()>> {
        std::mem::take(&mut self.collectors)
    }

    async fn close(self, _finished: Vec<()>) {
        for p in &self.producers {
            let _ = p.close().await;
        }
    }
}

/// Run the workload; call inside a tokio runtime.
pub async fn run(opts: RunOptions) -> Result<RunOutcome, RunError> {
    opts.workload.validate()?;
    let prepared = prepare(&opts, opts.client_options.clone()).await?;
    let shard_aware = opts.client_options.shard_aware && prepared.shard_ports > 1;
    let door = Native {
        opts: &opts,
        shard_aware,
        clients: Vec::new(),
        conns: Connections::new(),
        ctxs: Vec::new(),
        producers: Vec::new(),
        collectors: Vec::new(),
    };
    drive(&opts, prepared, shard_aware, door).await
}

/// The run's schedule through `door`: consumers (now, or after the
/// backlog is written), producers paced by the workload (or a rate search),
/// the measured window, the catch-up and the drain.
pub(crate) async fn drive<D: Door>(
    opts: &RunOptions,
    prepared: Prepared,
    shard_aware: bool,
    mut door: D,
) -> Result<RunOutcome, RunError> {
    let w = opts.workload.clone();
    let size = w.size_dist()?;
    let Prepared { server_version, run_id, topics, .. } = prepared;
    let rec = Recorder::new(w.subscriptions);
    let filler = filler(size.max().max(STAMP_BYTES), w.seed);
    let (stop_tx, stop_rx) = watch::channel(false);

    let backlog_mode = w.backlog_messages > 0;
    let mut consumer_tasks =
        if backlog_mode { Vec::new() } else { door.open_consumers(&topics, &rec, &stop_rx, true).await? };
    let producers = door.open_producers(&topics, &rec).await?;
    let producers_total = producers as u64;
    let topic_shards = door.topic_shards();

    let ticker = spawn_ticker(&rec, opts.tick, opts.progress, stop_rx.clone());
    let cpu_mark = crate::cpu::CpuMark::start(opts.broker_pid);
    let start = Instant::now();
    let per_producer = |rate: f64| if producers_total > 0 { rate / producers_total as f64 } else { 0.0 };
    let (stop_at, count_each, rate) = if backlog_mode {
        rec.start_window(start);
        (None, Some(w.backlog_messages.div_ceil(producers_total.max(1))), w.rate as f64)
    } else if w.sustainable {
        // The window opens once the search has settled on a rate.
        rec.begin_search();
        (None, None, if w.rate > 0 { w.rate as f64 } else { SEARCH_START_RATE })
    } else {
        let window_start = start + Duration::from_secs_f64(w.warmup_s);
        let stop_at = window_start + Duration::from_secs_f64(w.duration_s);
        rec.start_window(window_start);
        rec.end_window(stop_at);
        (Some(stop_at), None, w.rate as f64)
    };
    let pace = Arc::new(Pace::new(start, per_producer(rate), stop_at));
    let plans = (0..producers)
        .map(|index| ProducerPlan {
            index: index as u32,
            phase: index as f64 / producers as f64,
            count: count_each,
            pace: pace.clone(),
        })
        .collect();
    let producer_tasks = door.spawn_producers(plans, &rec, &filler);
    let mut search = None;
    if w.sustainable {
        let found = search_rate(&rec, &pace, rate, &w, opts.progress, &producer_tasks).await;
        pace.set_rate(per_producer(found.rate));
        let window_start = Instant::now() + Duration::from_secs_f64(w.warmup_s);
        let stop_at = window_start + Duration::from_secs_f64(w.duration_s);
        rec.start_window(window_start);
        rec.end_window(stop_at);
        pace.set_stop(stop_at);
        search = Some(found);
    }
    if producers_total == 0 {
        if let Some(stop_at) = stop_at {
            tokio::time::sleep_until(stop_at.into()).await;
        }
    }
    let mut finished = Vec::new();
    for t in producer_tasks {
        if let Ok(f) = t.await {
            finished.push(f);
        }
    }
    // Outstanding receipts: each collector ends after its last receipt (or
    // the client's operation timeout fails it).
    for t in door.take_collectors() {
        let _ = t.await;
    }
    let produced_end = Instant::now();

    let mut backlog = None;
    if backlog_mode {
        rec.end_window(produced_end);
        let produced = rec.produced_all();
        let produce_s = produced_end.duration_since(start).as_secs_f64();
        let catchup_start = Instant::now();
        let catchup_mark = crate::cpu::CpuMark::start(opts.broker_pid);
        consumer_tasks = door.open_consumers(&topics, &rec, &stop_rx, false).await?;
        let target = produced * u64::from(w.subscriptions);
        let (r2, r3) = (rec.clone(), rec.clone());
        wait_quiet(move || r2.consumed_all() >= target, move || r3.consumed_all(), DRAIN_IDLE_MAX).await;
        let catchup_s = catchup_start.elapsed().as_secs_f64();
        let consumed = rec.consumed_all();
        let catchup_cpu = catchup_mark.finish(consumed);
        let bytes = (produced as f64 * size.mean()) as u64;
        backlog = Some(BacklogResult {
            messages: produced,
            bytes,
            produce_s,
            produce_msgs_per_s: produced as f64 / produce_s,
            produce_mb_per_s: bytes as f64 / produce_s / 1e6,
            catchup_s,
            consume_msgs_per_s: consumed as f64 / catchup_s,
            consume_mb_per_s: consumed as f64 * size.mean() / catchup_s / 1e6,
            catchup_cpu: Some(catchup_cpu),
        });
    }

    // Let consumers catch up with everything acknowledged.
    let subs = u64::from(w.subscriptions);
    let has_consumers = w.consumers > 0 && w.subscriptions > 0;
    let (r2, r3) = (rec.clone(), rec.clone());
    let drained = !has_consumers
        || wait_quiet(move || r2.consumed_all() >= r2.produced_all() * subs, move || r3.consumed_all(), DRAIN_IDLE_MAX)
            .await;
    let cpu = cpu_mark.finish(rec.produced_all());
    let _ = stop_tx.send(true);
    let _ = ticker.await;
    for t in consumer_tasks {
        let _ = t.await;
    }
    door.close(finished).await;
    let totals = rec.totals();
    let flat_topics = (0..w.topics).flat_map(|t| w.partition_topics(&run_id, t)).collect();
    if let Some(search) = &mut search {
        search.held = Some(held(&totals, search.rate));
    }
    Ok(RunOutcome {
        run_id,
        topics: flat_topics,
        topic_shards,
        server_version,
        shard_aware,
        totals,
        backlog,
        search,
        drained,
        cpu,
    })
}
