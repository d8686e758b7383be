//! Goal: an Exclusive subscription has one consumer at a time. A second one
//! is refused with a clear, typed error (from the SDK and from the CLI), the
//! refusal disturbs nothing, and once the first consumer leaves the next one
//! is accepted and gets the unacknowledged messages again.
//!
//! Method: a 2-shard broker process; the two competing consumers sit on
//! connections on different shards, for a topic owned by each shard.

use magnetar_client::{AckType, Client, ClientError, Consumer, ErrorCode, InitialPosition, Message, OutgoingMessage};
use magnetar_tests::{
    connect_on_shard, run_async_with_timeout, run_cli, test_dir, topics_per_shard, BrokerProcess, ConsumeCmd,
};
use std::time::Duration;

const SHARDS: u32 = 2;
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(10);

async fn receive(consumer: &Consumer, what: &str) -> Message {
    tokio::time::timeout(RECEIVE_TIMEOUT, consumer.receive())
        .await
        .unwrap_or_else(|_| panic!("{what}: no message within {RECEIVE_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{what}: receive failed: {e}"))
}

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
