//! The latency accounting against a fake broker whose delay is known.
//!
//! Goal: publish and end-to-end latency are measured from the intended send
//! time, so (a) below capacity they equal the broker's delay, and (b) above
//! capacity (the producer cannot keep its schedule) they grow with the
//! schedule slip instead of staying at the per-request delay, as a
//! closed-loop measurement ("coordinated omission") would report.
//! Method: an in-test TCP broker speaking the real frames answers every
//! `Send` exactly `DELAY` after it arrives, and at the same instant delivers
//! the message to the topic's subscriber. Runs are 1 s long.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::BytesMut;
use magnetar_bench::run::{run, RunOptions};
use magnetar_bench::stats::Percentiles;
use magnetar_bench::workload::Workload;
use magnetar_wire::{encode_frame, Command, FrameDecoder, MessageId};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;

const DELAY: Duration = Duration::from_millis(20);
const TEST_TIMEOUT: Duration = Duration::from_secs(30);

type Subscribers = Arc<Mutex<HashMap<String, (mpsc::UnboundedSender<Vec<u8>>, u64)>>>;
/// Partition counts of the partitioned topics, by short name.
type Partitioned = Arc<Mutex<HashMap<String, u64>>>;

fn frame(command: &Command, payload: &[u8]) -> Vec<u8> {
    let mut dst = BytesMut::new();
    encode_frame(command, payload, &mut dst).unwrap();
    dst.to_vec()
}

/// Accept connections forever; each gets its own reader, writer and delay line.
async fn fake_broker(delay: Duration) -> String {
    fake_broker_counting(delay, Arc::default()).await
}

/// The same, also keeping in `largest_send` the most messages one Send held.
async fn fake_broker_counting(delay: Duration, largest_send: Arc<AtomicU32>) -> String {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let subs: Subscribers = Arc::default();
    let partitioned: Partitioned = Arc::default();
    tokio::spawn(async move {
        loop {
            let (stream, _) = listener.accept().await.unwrap();
            tokio::spawn(connection(stream, delay, subs.clone(), partitioned.clone(), largest_send.clone()));
        }
    });
    addr
}

async fn connection(
    stream: TcpStream,
    delay: Duration,
    subs: Subscribers,
    partitioned: Partitioned,
    largest_send: Arc<AtomicU32>,
) {
    stream.set_nodelay(true).unwrap();
    let (mut rd, mut wr) = stream.into_split();
    let (tx, mut rx) = mpsc::unbounded_channel::<Vec<u8>>();
    tokio::spawn(async move {
        while let Some(bytes) = rx.recv().await {
            if wr.write_all(&bytes).await.is_err() {
                break;
            }
        }
    });
    // Receipts leave in arrival order, each `delay` after its Send arrived.
    let (line_tx, mut line_rx) = mpsc::unbounded_channel::<(Instant, Vec<u8>, Option<(String, Vec<u8>)>)>();
    let out = tx.clone();
    let subs2 = subs.clone();
    tokio::spawn(async move {
        while let Some((due, receipt, delivery)) = line_rx.recv().await {
            tokio::time::sleep_until(due.into()).await;
            let _ = out.send(receipt);
            if let Some((topic, blob)) = delivery {
                if let Some((consumer_tx, _)) = subs2.lock().unwrap().get(&topic) {
                    let _ = consumer_tx.send(blob);
                }
            }
        }
    });
    let mut decoder = FrameDecoder::new(16 << 20);
    let mut buf = BytesMut::new();
    let mut producers: HashMap<u64, String> = HashMap::new();
    loop {
        let f = match decoder.decode(&mut buf).unwrap() {
            Some(f) => f,
            None => {
                if rd.read_buf(&mut buf).await.unwrap_or(0) == 0 {
                    return;
                }
                continue;
            }
        };
        let now = Instant::now();
        let reply = |c: Command| {
            let _ = tx.send(frame(&c, &[]));
        };
        match f.command {
            Command::Connect { .. } => reply(Command::Connected {
                server_version: "fake".into(),
                protocol_version: magnetar_wire::PROTOCOL_VERSION,
                max_frame_bytes: 16 << 20,
                shard: 0,
                shard_ports: Vec::new(),
            }),
            Command::Producer { request_id, producer_id, topic, .. } => {
                producers.insert(producer_id, topic);
                reply(Command::ProducerSuccess {
                    request_id,
                    producer_name: format!("p{producer_id}"),
                    last_sequence_id: -1,
                });
            }
            Command::Send { producer_id, sequence_id, num_messages } => {
                largest_send.fetch_max(num_messages, Ordering::SeqCst);
                let id = MessageId::new(1, sequence_id, -1, -1);
                let receipt = frame(&Command::SendReceipt { producer_id, sequence_id, message_id: id }, &[]);
                let topic = producers.get(&producer_id).cloned().unwrap();
                let consumer = subs.lock().unwrap().get(&topic).map(|s| s.1);
                let delivery = consumer.map(|consumer_id| {
                    (
                        topic,
                        frame(
                            &Command::Message { consumer_id, message_id: id, redelivery_count: 0, ack_set: vec![] },
                            &f.payload,
                        ),
                    )
                });
                line_tx.send((now + delay, receipt, delivery)).unwrap();
            }
            Command::Subscribe { request_id, consumer_id, topic, .. } => {
                subs.lock().unwrap().insert(topic, (tx.clone(), consumer_id));
                reply(Command::Success { request_id });
            }
            Command::CloseProducer { request_id, .. } | Command::CloseConsumer { request_id, .. }
                if request_id != 0 =>
            {
                reply(Command::Success { request_id })
            }
            // The harness creates its topics partitioned, and the client's
            // partitioned producer and consumer ask for the partition count.
            Command::AdminRequest { request_id, op, json } => {
                let args: serde_json::Value = serde_json::from_str(&json).unwrap();
                let topic = args["topic"].as_str().unwrap();
                let short = topic.rsplit('/').next().unwrap().to_string();
                let answer = match op.as_str() {
                    "topics.create-partitioned" => {
                        partitioned.lock().unwrap().insert(short, args["partitions"].as_u64().unwrap());
                        serde_json::Value::Null
                    }
                    "topics.partitioned-metadata" => {
                        serde_json::json!({ "partitions": partitioned.lock().unwrap().get(&short).copied().unwrap_or(0) })
                    }
                    other => panic!("fake broker: unexpected admin op {other}"),
                };
                reply(Command::AdminResponse { request_id, json: answer.to_string() });
            }
            Command::Ping => reply(Command::Pong),
            _ => {}
        }
    }
}

fn workload(rate: u64, max_pending: u32) -> Workload {
    // Unbatched: the capacity arithmetic below is one message per send.
    Workload {
        partitions: 1,
        rate,
        max_pending,
        batch_max_messages: 0,
        warmup_s: 0.0,
        duration_s: 1.0,
        ..Workload::default()
    }
}

async fn measure(rate: u64, max_pending: u32) -> (Percentiles, Percentiles, u64) {
    let addr = fake_broker(DELAY).await;
    let mut opts = RunOptions::new(workload(rate, max_pending), addr);
    opts.progress = false;
    let outcome = run(opts).await.unwrap();
    assert!(outcome.drained, "every message reached the consumer");
    assert_eq!(outcome.totals.publish_errors, 0, "{:?}", outcome.totals.last_error);
    let publish = Percentiles::of(&outcome.totals.publish);
    let e2e = Percentiles::of(&outcome.totals.e2e);
    eprintln!("rate {rate} max_pending {max_pending}: publish {publish:?}\n e2e {e2e:?}");
    (publish, e2e, outcome.totals.produced_all)
}

/// Below capacity: every latency is the broker's delay (plus scheduling noise).
#[tokio::test]
async fn below_capacity_latency_is_the_broker_delay() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        // 50 msg/s with one in flight and a 20 ms delay: capacity is 50/s,
        // so 25/s leaves every message on schedule.
        let (publish, e2e, produced) = measure(25, 1).await;
        assert!((24..=26).contains(&produced), "{produced} messages in 1 s at 25/s");
        // Bounds leave room for a loaded machine (timer and scheduling
        // slop of a few ms per round trip), and still tell "the delay" from
        // the hundreds of ms of the above-capacity case.
        let d = DELAY.as_secs_f64() * 1e3;
        assert!(publish.p50 >= d && publish.p50 < 2.0 * d, "publish p50 {} vs delay {d}", publish.p50);
        assert!(publish.max < 10.0 * d, "publish max {}", publish.max);
        assert!(e2e.p50 >= d && e2e.p50 < 2.0 * d, "e2e p50 {} vs delay {d}", e2e.p50);
        assert_eq!(publish.count, produced);
        assert_eq!(e2e.count, produced);
    })
    .await
    .expect("test timed out");
}

/// As fast as possible, one in flight: each message's latency is one round
/// trip (the broker's delay), not its own plus the wait for its
/// predecessor's receipt, which made this shape report two delays.
#[tokio::test]
async fn one_at_a_time_latency_is_one_round_trip() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let (publish, _e2e, produced) = measure(0, 1).await;
        // 1 s window, 20 ms per message: ~50 messages.
        assert!((20..=55).contains(&produced), "{produced} messages in 1 s one at a time");
        let d = DELAY.as_secs_f64() * 1e3;
        assert!(publish.p50 >= d && publish.p50 < 1.5 * d, "publish p50 {} vs delay {d}", publish.p50);
    })
    .await
    .expect("test timed out");
}

/// Above capacity: 100 msg/s scheduled, but one in flight and a 20 ms delay
/// allow at most 50/s, so message i (intended at 10·i ms) completes at about
/// 20·(i+1) ms or later: its latency is at least 20 + 10·i ms and grows
/// linearly with i. Over the 100 messages intended in the 1 s window the
/// median is about half the maximum and the maximum at least ~1 s. A
/// closed-loop tool would report 20 ms. The upper bound is the run's own
/// wall-clock time (a loaded machine makes every round trip slower).
#[tokio::test]
async fn above_capacity_latency_counts_from_the_intended_time() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        let started = Instant::now();
        let (publish, e2e, produced) = measure(100, 1).await;
        let elapsed_ms = started.elapsed().as_secs_f64() * 1e3;
        assert_eq!(produced, 100, "every message intended in the window is sent, late");
        assert!(
            publish.max >= 1000.0 && publish.max <= elapsed_ms,
            "publish max {} (run {elapsed_ms} ms)",
            publish.max
        );
        let half = publish.p50 / publish.max;
        assert!((0.35..0.65).contains(&half), "latency grows linearly: p50 {} vs max {}", publish.p50, publish.max);
        assert!(publish.p50 > 10.0 * DELAY.as_secs_f64() * 1e3, "not the closed-loop 20 ms");
        assert!(e2e.p50 >= publish.p50 * 0.9 && e2e.max >= 1000.0, "e2e {e2e:?}");
    })
    .await
    .expect("test timed out");
}

/// `max_pending` counts messages, not sends: with batching on (up to 50 per
/// batch) and `max_pending` 1 or 4 on one partition, no Send may carry more
/// messages than that, since a batch can only hold messages in flight.
/// (When it counted sends, one in flight could be a batch of 50.)
#[tokio::test]
async fn max_pending_bounds_messages_in_flight_with_batching() {
    tokio::time::timeout(TEST_TIMEOUT, async {
        for max_pending in [1u32, 4] {
            let largest = Arc::new(AtomicU32::new(0));
            let addr = fake_broker_counting(DELAY, largest.clone()).await;
            let w = Workload { batch_max_messages: 50, ..workload(0, max_pending) };
            let mut opts = RunOptions::new(w, addr);
            opts.progress = false;
            let outcome = run(opts).await.unwrap();
            assert_eq!(outcome.totals.publish_errors, 0, "{:?}", outcome.totals.last_error);
            assert!(outcome.totals.produced_all > 0);
            let largest = largest.load(Ordering::SeqCst);
            assert!((1..=max_pending).contains(&largest), "a send held {largest} messages, max_pending {max_pending}");
        }
    })
    .await
    .expect("test timed out");
}
