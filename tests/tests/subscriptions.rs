//! Goal: an Exclusive subscription has one consumer at a time. A second one
//! is refused with a clear, typed error (from the SDK and from the CLI), the
//! refusal disturbs nothing, and once the first consumer leaves the next one
//! is accepted and gets the unacknowledged messages again.
//!
//! Method: a 2-shard broker process; the two competing consumers sit on
//! connections on different shards, for a topic owned by each shard.
//!
//! Also here: a consumer whose connection drops without closing frees the
//! subscription and its unacknowledged messages come again; and the broker
//! dispatches exactly within the flow permits a consumer grants (checked on
//! a raw connection, which grants permits one `Flow` frame at a time).

use magnetar_client::{AckType, Client, ClientError, Consumer, ErrorCode, InitialPosition, OutgoingMessage};
use magnetar_tests::consume::receive;
use magnetar_tests::{
    connect_on_shard, run_async_with_timeout, run_cli, test_dir, topics_per_shard, BrokerProcess, ConsumeCmd,
    RawConnection,
};
use magnetar_wire::{Command, SubscriptionType};
use std::time::Duration;

const SHARDS: u32 = 2;

async fn subscribe(client: &Client, topic: &str, sub: &str) -> Result<Consumer, ClientError> {
    client.subscribe(topic, sub).initial_position(InitialPosition::Earliest).subscribe().await
}

fn assert_busy(result: Result<Consumer, ClientError>, what: &str) {
    match result {
        Err(ClientError::Broker { code: ErrorCode::ConsumerBusy, message }) => {
            assert!(message.contains("exclusive"), "{what}: the refusal should say why: {message:?}");
        }
        Err(e) => panic!("{what}: expected ConsumerBusy, got {e}"),
        Ok(_) => panic!("{what}: a second consumer was accepted on an exclusive subscription"),
    }
}

#[test]
fn an_exclusive_subscription_refuses_a_second_consumer() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("exclusive");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let a = connect_on_shard(&url, 0, 64).await;
        let b = connect_on_shard(&url, 1, 64).await;
        for (topic, owner) in topics_per_shard("exclusive", SHARDS, 1) {
            let what = format!("{topic} (owner shard {owner})");
            let first = subscribe(&a, &topic, "ex").await.expect("first consumer");
            assert_busy(subscribe(&b, &topic, "ex").await, &format!("{what}, from another shard"));
            assert_busy(subscribe(&a, &topic, "ex").await, &format!("{what}, from the same connection"));

            // The CLI says so too, and fails.
            let run = run_cli(ConsumeCmd::new(&url, &topic, "ex").args(), Duration::from_secs(30));
            assert!(!run.status.success(), "{what}: magnetar consume on a busy exclusive subscription exited 0");
            assert!(
                run.stderr.contains("ConsumerBusy") && run.stderr.contains("exclusive"),
                "{what}: the CLI should name the reason:\n{}",
                run.stderr
            );

            // The refusals disturbed nothing: the first consumer still gets messages.
            let producer = b.producer(topic.as_str()).create().await.expect("producer");
            let mut ids = Vec::new();
            for i in 0..3 {
                ids.push(producer.send(OutgoingMessage::new(format!("m{i}"))).await.expect("send"));
            }
            for id in &ids {
                let m = receive(&first, &what).await;
                assert_eq!(m.id, *id, "{what}");
                assert_eq!(m.redelivery_count(), 0);
            }
            first.ack_confirmed(AckType::Individual, &ids[..1]).await.expect("ack");

            // Another subscription on the same topic is independent.
            let other = subscribe(&b, &topic, "other").await.expect("another subscription");
            for id in &ids {
                assert_eq!(receive(&other, &what).await.id, *id, "{what}: subscription \"other\"");
            }

            // Once the first consumer leaves, the next is accepted and gets
            // the unacknowledged messages again, counted as redeliveries.
            first.close().await.expect("close");
            let second = subscribe(&b, &topic, "ex").await.expect("consumer after the first left");
            for id in &ids[1..] {
                let m = receive(&second, &what).await;
                assert_eq!(m.id, *id, "{what}: redelivery");
                assert_eq!(m.redelivery_count(), 1, "{what}: redelivery count of {id}");
            }
            second.close().await.expect("close");
            other.close().await.expect("close");
            producer.close().await.expect("close");
        }
        drop(broker);
    });
}

#[test]
fn a_dropped_connection_frees_the_subscription_and_its_messages() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("dropped");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        for (topic, owner) in topics_per_shard("dropped", SHARDS, 1) {
            let what = format!("{topic} (owner shard {owner})");
            let other = (owner + 1) % SHARDS;
            let a = connect_on_shard(&url, other, 64).await;
            let producer = a.producer(topic.as_str()).create().await.expect("producer");
            let mut ids = Vec::new();
            for i in 0..5 {
                ids.push(producer.send(OutgoingMessage::new(format!("m{i}"))).await.expect("send"));
            }
            let first = subscribe(&a, &topic, "drop").await.expect("subscribe");
            for id in &ids {
                assert_eq!(receive(&first, &what).await.id, *id);
            }
            // Hang up without closing anything.
            a.close();

            // The broker notices the closed connection soon; until then the
            // subscription is still taken.
            let b = Client::connect(&url).await.expect("connect");
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            let second = loop {
                match subscribe(&b, &topic, "drop").await {
                    Ok(c) => break c,
                    Err(ClientError::Broker { code: ErrorCode::ConsumerBusy, .. })
                        if tokio::time::Instant::now() < deadline =>
                    {
                        tokio::time::sleep(Duration::from_millis(50)).await
                    }
                    Err(e) => panic!("{what}: subscribing after the first consumer's connection dropped: {e}"),
                }
            };
            for id in &ids {
                let m = receive(&second, &what).await;
                assert_eq!(m.id, *id, "{what}: redelivery after a dropped connection");
                assert_eq!(m.redelivery_count(), 1, "{what}");
            }
            second.close().await.expect("close");
        }
        drop(broker);
    });
}

#[test]
fn dispatch_stays_within_the_flow_permits() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("permits");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let addr = broker.addr();
        let client = Client::connect(&url).await.expect("connect");
        let topics = topics_per_shard("permits", SHARDS, 1);
        let mut all_ids = Vec::new();
        for (topic, _) in &topics {
            let producer = client.producer(topic.as_str()).name("p").create().await.expect("producer");
            let mut ids = Vec::new();
            for i in 0..10 {
                ids.push(producer.send(OutgoingMessage::new(format!("m{i}"))).await.expect("send"));
            }
            all_ids.push(ids);
        }
        tokio::task::spawn_blocking(move || {
            for ((topic, owner), ids) in topics.iter().zip(&all_ids) {
                let what = format!("{topic} (owner shard {owner})");
                let mut c = RawConnection::connect(addr);
                let shard = c.handshake();
                eprintln!("{what}: raw connection on shard {shard}");
                match c.subscribe(1, 9, topic, "permits", SubscriptionType::Exclusive) {
                    Command::Success { request_id: 1 } => {}
                    other => panic!("{what}: subscribe answered with {other:?}"),
                }
                let quiet = |c: &mut RawConnection, after: &str| {
                    if let Some(f) = c.try_next(Duration::from_millis(300), &what) {
                        panic!("{what}: a frame beyond the permits after {after}: {:?}", f.command);
                    }
                };
                quiet(&mut c, "subscribing (no permits yet)");
                let mut next = 0usize;
                for permits in [3u32, 2, 100] {
                    c.send(&Command::Flow { consumer_id: 9, permits }, &[]);
                    let expect = (permits as usize).min(ids.len() - next);
                    for _ in 0..expect {
                        let f = c.next(&what);
                        match f.command {
                            Command::Message { consumer_id: 9, message_id, redelivery_count: 0, .. } => {
                                assert_eq!(message_id, ids[next], "{what}: dispatch order");
                                let (meta, payload) = magnetar_wire::decode_message(&f.payload).expect("blob");
                                assert_eq!(meta.sequence_id, next as u64);
                                assert_eq!(payload.as_ref(), format!("m{next}").as_bytes());
                            }
                            other => panic!("{what}: expected a message, got {other:?}"),
                        }
                        next += 1;
                    }
                    quiet(&mut c, &format!("{permits} permits"));
                }
                assert_eq!(next, ids.len());
            }
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        drop(broker);
    });
}
