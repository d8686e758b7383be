//! Goal: a connection on one shard can produce to and consume from a topic
//! owned by another shard (issue #2: "a request that arrives on shard A for a
//! partition owned by shard B crosses through a bounded cross-core hand-off
//! and comes back").
//!
//! Method: a 2-shard broker process; the client SDK opens connections until
//! it has one on each shard (the `Connected` answer names the shard); topic
//! names are chosen by `ownership::shard_of` so that every (connection shard,
//! owner shard) pair is exercised, the cross-shard ones included. Every
//! message is checked for id (against its receipt), payload, key, property,
//! producer name and sequence id.

use magnetar_client::{AckType, Client, Consumer, InitialPosition, Message, MessageId, OutgoingMessage};
use magnetar_tests::consume::receive;
use magnetar_tests::{connect_on_shard, run_async_with_timeout, test_dir, topics_per_shard, BrokerProcess};
use std::time::Duration;

const SHARDS: u32 = 2;
const MESSAGES: u64 = 100;
/// Connections tried to land one on a given shard.
const CONNECT_ATTEMPTS: usize = 64;

fn payload(producer: &str, i: u64) -> Vec<u8> {
    // Varying lengths, not just text: byte-level corruption must show.
    let mut p = format!("{producer}/{i}/").into_bytes();
    p.extend((0..(i % 37) * 13).map(|j| (j * 7 + i) as u8));
    p
}

/// Sends `MESSAGES` pipelined messages; returns their ids in send order.
async fn produce(client: &Client, topic: &str, producer_name: &str) -> Vec<MessageId> {
    let producer = client.producer(topic).name(producer_name).max_pending(32).create().await.expect("create producer");
    let mut receipts = Vec::new();
    for i in 0..MESSAGES {
        let msg = OutgoingMessage::new(payload(producer_name, i))
            .with_key(format!("k{}", i % 5))
            .with_property("i", i.to_string());
        receipts.push(producer.send_async(msg).await.expect("send"));
    }
    let mut ids = Vec::new();
    for r in receipts {
        ids.push(r.await.expect("receipt"));
    }
    producer.close().await.expect("close producer");
    ids
}

fn check(msg: &Message, producer_name: &str, i: u64, id: MessageId, what: &str) {
    assert_eq!(msg.id, id, "{what}: message {i}");
    assert_eq!(msg.payload.as_ref(), payload(producer_name, i).as_slice(), "{what}: payload of message {i}");
    assert_eq!(msg.key(), Some(format!("k{}", i % 5).as_str()), "{what}: key of message {i}");
    assert_eq!(msg.property("i"), Some(i.to_string().as_str()), "{what}: property of message {i}");
    assert_eq!(msg.producer_name(), producer_name, "{what}: producer of message {i}");
    assert_eq!(msg.sequence_id(), i, "{what}: sequence id of message {i}");
    assert_eq!(msg.redelivery_count(), 0, "{what}: message {i}");
}

/// Nothing more arrives within a short wait.
async fn assert_quiet(consumer: &Consumer, what: &str) {
    if let Ok(m) = tokio::time::timeout(Duration::from_millis(300), consumer.receive()).await {
        panic!("{what}: unexpected message {m:?}");
    }
}

#[test]
fn produce_and_consume_through_every_shard_pair() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("cross-shard");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        // Per owner shard, one topic per connection shard.
        let topics = topics_per_shard("cross", SHARDS, SHARDS as usize);
        for conn_shard in 0..SHARDS {
            let client = connect_on_shard(&url, conn_shard, CONNECT_ATTEMPTS).await;
            assert_eq!(client.server_info().shard, conn_shard);
            for owner in 0..SHARDS {
                let (topic, o) = topics.iter().filter(|(_, o)| *o == owner).nth(conn_shard as usize).expect("topic");
                assert_eq!(*o, owner);
                let what = format!("{topic} (owner shard {owner}) via a connection on shard {conn_shard}");
                let producer_name = format!("p{conn_shard}{owner}");
                let ids = produce(&client, topic, &producer_name).await;

                let consumer = client
                    .subscribe(topic.as_str(), "s")
                    .initial_position(InitialPosition::Earliest)
                    .subscribe()
                    .await
                    .unwrap_or_else(|e| panic!("{what}: subscribe: {e}"));
                for (i, id) in ids.iter().enumerate() {
                    let m = receive(&consumer, &what).await;
                    check(&m, &producer_name, i as u64, *id, &what);
                }
                assert_quiet(&consumer, &what).await;
                // The ack crosses to the owner and its confirmation comes back.
                consumer.ack_confirmed(AckType::Cumulative, &[ids[ids.len() - 1]]).await.expect("ack");
                consumer.close().await.expect("close consumer");

                // The cursor moved on the owner: nothing is delivered again.
                let again = client.subscribe(topic.as_str(), "s").subscribe().await.expect("subscribe again");
                assert_quiet(&again, &what).await;
                again.close().await.expect("close");
            }
            client.close();
        }
        drop(broker);
    });
}

#[test]
fn live_delivery_when_producer_and_consumer_are_on_the_other_shard() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("cross-live");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let topics = topics_per_shard("live", SHARDS, 1);
        for (topic, owner) in &topics {
            let other = (owner + 1) % SHARDS;
            let what = format!("{topic} (owner shard {owner}), clients on shard {other}");
            // Two connections on the non-owner shard: every request and every
            // dispatched message crosses the mesh.
            let consumer_client = connect_on_shard(&url, other, CONNECT_ATTEMPTS).await;
            let producer_client = connect_on_shard(&url, other, CONNECT_ATTEMPTS).await;
            let consumer = consumer_client
                .subscribe(topic.as_str(), "live")
                .initial_position(InitialPosition::Latest)
                .receiver_queue_size(10)
                .subscribe()
                .await
                .expect("subscribe");
            let producer_name = format!("live{owner}");
            let receiving = async {
                let mut got = Vec::new();
                for _ in 0..MESSAGES {
                    let m = receive(&consumer, &what).await;
                    // Individual acks, so the small queue keeps moving.
                    consumer.ack(&m.id).await.expect("ack");
                    got.push(m);
                }
                got
            };
            let (ids, got) = tokio::join!(produce(&producer_client, topic, &producer_name), receiving);
            for (i, (m, id)) in got.iter().zip(&ids).enumerate() {
                check(m, &producer_name, i as u64, *id, &what);
            }
            assert_quiet(&consumer, &what).await;
            consumer.close().await.expect("close");
        }
        drop(broker);
    });
}
