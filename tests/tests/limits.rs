//! Goal: the broker's bounds hold from a client's point of view. A producer
//! with far more bytes in flight than a connection may have is slowed down
//! (the broker stops reading it) but not stuck, and other clients are not
//! held up meanwhile; a message over the size limit is refused on its own,
//! leaving the producer usable.
//!
//! Method: a 2-shard broker process; the CLI for the bulk run (its receipts
//! checked like the durability test's), the SDK for precise errors.

use magnetar_client::{ClientError, ErrorCode, InitialPosition, OutgoingMessage};
use magnetar_tests::{
    check_topic_log, connect_on_shard, owner_shard, run_async_with_timeout, run_with_timeout, test_dir, BrokerProcess,
    ConsumeCmd, ProduceCmd, ProducedRun,
};
use std::time::{Duration, Instant};

const SHARDS: u32 = 2;
/// The broker's default `message_bytes_max` (metadata + payload).
const MESSAGE_BYTES_MAX: usize = 5 * 1024 * 1024;

#[test]
fn a_producer_far_ahead_of_the_disk_is_slowed_not_stuck() {
    run_with_timeout(Duration::from_secs(120), || {
        let dir = test_dir("backpressure");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        // 600 × 64 KiB = 39 MB, all of it allowed in flight by the client,
        // against the connection's 16 MiB in-flight limit.
        let cmd = ProduceCmd { max_pending: 600, ..ProduceCmd::new(&url, "backpressure", "bulk", 600, 64 * 1024) };
        let bulk = cmd.spawn();

        // Meanwhile another client keeps getting prompt answers.
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().expect("runtime");
        let slowest = rt.block_on(async {
            let client = magnetar_client::Client::connect(&url).await.expect("connect");
            let producer = client.producer("bystander").create().await.expect("producer");
            let mut slowest = Duration::ZERO;
            for i in 0..20 {
                let t = Instant::now();
                producer.send(OutgoingMessage::new(format!("small {i}"))).await.expect("bystander send");
                slowest = slowest.max(t.elapsed());
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            slowest
        });
        eprintln!("bystander: slowest send {slowest:?}");
        assert!(slowest < Duration::from_secs(5), "a bystander waited {slowest:?} for a receipt");

        let run = bulk.finish(Duration::from_secs(90));
        run.assert_success();
        let receipts: Vec<_> = run.stdout_lines.iter().map(|l| magnetar_tests::Receipt::parse(l)).collect();
        assert_eq!(receipts.len(), 600);
        let received = ConsumeCmd::new(&url, "backpressure", "check").run(Duration::from_secs(60));
        let runs = [ProducedRun { producer: "bulk".into(), size: cmd.size, receipts }];
        let check = check_topic_log("backpressure", &runs, &received);
        assert_eq!(check.unacknowledged_present, 0);
    });
}

#[test]
fn an_oversized_message_is_refused_alone() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("sizes");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        // A connection on the shard that does not own the topic, so the big
        // message crosses the mesh too.
        let topic = "sizes";
        let other = (owner_shard(topic, SHARDS) + 1) % SHARDS;
        let client = connect_on_shard(&url, other, 64).await;
        let producer = client.producer(topic).name("sizes").create().await.expect("producer");

        let big: Vec<u8> = (0..MESSAGE_BYTES_MAX - 4096).map(|i| (i % 251) as u8).collect();
        let big_id = producer.send(OutgoingMessage::new(big.clone())).await.expect("a message under the limit");

        match producer.send(OutgoingMessage::new(vec![7u8; MESSAGE_BYTES_MAX + 1])).await {
            Err(ClientError::Broker { code: ErrorCode::MessageTooLarge, message }) => {
                assert!(
                    message.contains(&MESSAGE_BYTES_MAX.to_string()),
                    "the refusal should name the limit: {message}"
                );
            }
            other => panic!("a message over the limit: {other:?}"),
        }
        // Over the frame limit the client refuses before sending anything.
        let frame_max = client.server_info().max_frame_bytes as usize;
        match producer.send(OutgoingMessage::new(vec![7u8; frame_max + 1])).await {
            Err(ClientError::MessageTooLarge { .. }) => {}
            other => panic!("a message over the frame limit: {other:?}"),
        }
        let small_id = producer.send(OutgoingMessage::new("still works")).await.expect("a send after the refusals");
        assert!(small_id.entry == big_id.entry + 1, "refused messages took no entry: {big_id} then {small_id}");

        let consumer = client
            .subscribe(topic, "s")
            .initial_position(InitialPosition::Earliest)
            .subscribe()
            .await
            .expect("subscribe");
        let m = tokio::time::timeout(Duration::from_secs(10), consumer.receive()).await.expect("timeout").expect("big");
        assert_eq!(m.id, big_id);
        assert!(m.payload.as_ref() == big.as_slice(), "the big message came back different");
        let m =
            tokio::time::timeout(Duration::from_secs(10), consumer.receive()).await.expect("timeout").expect("small");
        assert_eq!((m.id, m.payload.as_ref()), (small_id, b"still works".as_slice()));
        drop(broker);
    });
}
