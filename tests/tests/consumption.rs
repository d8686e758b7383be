//! Goal: the subscription gaps of issue #22 stay closed, with real broker
//! processes: a consumer asking for another tag filter than the attached
//! consumers' is refused (as another type is); a consumer subscribed by a
//! partitioned topic's name picks up partitions added later; non-persistent
//! topics take every subscription type, can be partitioned and are listed.
//!
//! Method: a 2-shard broker process per test; consumers and producers
//! through the SDK, admin calls through its admin channel.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{
    Client, ClientError, Consumer, ErrorCode, InitialPosition, MultiTopicConsumer, OutgoingMessage, SubscriptionType,
};
use magnetar_tests::consume::receive;
use magnetar_tests::{run_async_with_timeout, test_dir, BrokerProcess};
use serde_json::json;
use std::collections::BTreeSet;
use std::time::Duration;

const SHARDS: u32 = 2;

async fn subscribe(
    client: &Client,
    topic: &str,
    sub: &str,
    t: SubscriptionType,
    tag: &str,
) -> Result<Consumer, ClientError> {
    client
        .subscribe(topic, sub)
        .sub_type(t)
        .filter_tag(tag)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
}

fn assert_busy<T>(r: Result<T, ClientError>, expect: &str, what: &str) {
    match r {
        Err(ClientError::Broker { code: ErrorCode::ConsumerBusy, message }) => {
            assert!(message.contains(expect), "{what}: the refusal should say {expect:?}: {message:?}")
        }
        Err(e) => panic!("{what}: expected ConsumerBusy, got {e}"),
        Ok(_) => panic!("{what}: accepted"),
    }
}

async fn receive_multi(c: &MultiTopicConsumer, what: &str) -> magnetar_client::Message {
    tokio::time::timeout(Duration::from_secs(10), c.receive())
        .await
        .unwrap_or_else(|_| panic!("{what}: no message within 10 s"))
        .unwrap_or_else(|e| panic!("{what}: receive failed: {e}"))
}

/// A second consumer with another tag filter (or none) is refused while the
/// subscription has consumers; one with the same filter is admitted; once
/// the subscription is idle, the next consumer sets the filter again.
#[test]
fn a_different_tag_filter_is_refused_while_consumers_are_attached() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("filter-mismatch");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "filter-mismatch";
        let producer = client.producer(topic).create().await.unwrap();
        for tag in ["a", "b", "a", "b"] {
            let mut m = OutgoingMessage::new(tag);
            m.tag = Some(tag.into());
            producer.send(m).await.unwrap();
        }
        let shared = SubscriptionType::Shared;
        let first = subscribe(&client, topic, "f", shared, "a").await.expect("first consumer");
        assert_busy(subscribe(&client, topic, "f", shared, "b").await, "tag filter", "filter b on a");
        assert_busy(subscribe(&client, topic, "f", shared, "").await, "tag filter", "no filter on a");
        let second = subscribe(&client, topic, "f", shared, "a").await.expect("same filter is admitted");
        // The refusals changed nothing: only "a" messages come, to either consumer.
        for _ in 0..2 {
            let (m, by) = tokio::select! {
                m = first.receive() => (m.unwrap(), &first),
                m = second.receive() => (m.unwrap(), &second),
                _ = tokio::time::sleep(Duration::from_secs(10)) => panic!("no message"),
            };
            assert_eq!(m.tag(), Some("a"));
            by.ack_confirmed(magnetar_client::AckType::Individual, &[m.id]).await.unwrap();
        }
        first.close().await.unwrap();
        second.close().await.unwrap();
        // Idle: the next consumer decides the filter. (The "b" messages
        // before were acknowledged as the "a" filter passed them.)
        let b = subscribe(&client, topic, "f", shared, "b").await.expect("idle subscription takes a new filter");
        for tag in ["a", "b"] {
            let mut m = OutgoingMessage::new(tag);
            m.tag = Some(tag.into());
            producer.send(m).await.unwrap();
        }
        let m = receive(&b, "b after the filter changed").await;
        assert_eq!((m.tag(), &m.payload[..]), (Some("b"), &b"b"[..]));
        client.close();
    });
}

/// A consumer subscribed by a partitioned topic's name gets the messages of
/// a partition added after it subscribed, from that partition's first
/// message (sent before the consumer saw the partition).
#[test]
fn a_partitioned_consumer_picks_up_partitions_added_later() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("partitions-added");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "persistent://public/default/grows";
        client.admin().create_partitioned_topic(topic, 2).await.unwrap();
        let consumer = client
            .subscribe(topic, "g")
            .sub_type(SubscriptionType::Shared)
            .partitions_refresh(Duration::from_millis(200))
            .subscribe_partitioned()
            .await
            .unwrap();
        assert_eq!(consumer.topics().len(), 2, "{:?}", consumer.topics());
        client.admin().call("topics.update-partitioned", json!({ "topic": topic, "partitions": 3 })).await.unwrap();
        let p2 = format!("{topic}-partition-2");
        let producer = client.producer(p2.as_str()).create().await.unwrap();
        let sent = producer.send(OutgoingMessage::new("on the new partition")).await.unwrap();
        let m = receive_multi(&consumer, "message of the added partition").await;
        assert_eq!((m.id, &*m.topic), (sent, p2.as_str()));
        consumer.ack(&m).await.unwrap();
        assert_eq!(consumer.topics().len(), 3, "{:?}", consumer.topics());
        consumer.close().await.unwrap();
        client.close();
    });
}

/// Non-persistent subscriptions of every type: Shared spreads messages over
/// its consumers, Failover sends all to the active one (and tells the other
/// it is a standby), Key_Shared keeps a key on one consumer, Exclusive
/// refuses a second consumer, another type is refused while attached.
#[test]
fn non_persistent_topics_take_every_subscription_type() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("np-types");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "non-persistent://public/default/np-types";
        let sub = |name: &'static str, t: SubscriptionType, cname: &'static str| {
            client.subscribe(topic, name).sub_type(t).consumer_name(cname).subscribe()
        };
        let sh1 = sub("shared", SubscriptionType::Shared, "s1").await.unwrap();
        let sh2 = sub("shared", SubscriptionType::Shared, "s2").await.unwrap();
        let fo1 = sub("failover", SubscriptionType::Failover, "a").await.unwrap();
        let fo2 = sub("failover", SubscriptionType::Failover, "b").await.unwrap();
        let ks1 = sub("keys", SubscriptionType::KeyShared, "k1").await.unwrap();
        let ks2 = sub("keys", SubscriptionType::KeyShared, "k2").await.unwrap();
        let ex = sub("excl", SubscriptionType::Exclusive, "e").await.unwrap();
        assert_busy(sub("excl", SubscriptionType::Exclusive, "e2").await, "exclusive", "second exclusive");
        assert_busy(sub("shared", SubscriptionType::Failover, "x").await, "Shared", "type mismatch");
        // Flow permits travel after the subscribe answer: wait until every
        // subscription takes messages (a probe each, on all consumers).
        let producer = client.producer(topic).create().await.unwrap();
        let all = [&sh1, &sh2, &fo1, &fo2, &ks1, &ks2, &ex];
        tokio::time::sleep(Duration::from_millis(300)).await;
        const N: usize = 40;
        for i in 0..N {
            let key = format!("key{}", i % 4);
            producer.send(OutgoingMessage::new(format!("m{i}")).with_key(key)).await.unwrap();
        }
        let mut counts = Vec::new();
        let mut keys_of = Vec::new();
        for c in all {
            let mut n = 0;
            let mut keys = BTreeSet::new();
            while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), c.receive()).await {
                keys.insert(m.key().unwrap_or_default().to_string());
                n += 1;
            }
            counts.push(n);
            keys_of.push(keys);
        }
        eprintln!("received per consumer: {counts:?}, keys {keys_of:?}");
        assert_eq!(counts[0] + counts[1], N, "shared: every message once");
        assert!(counts[0] > 0 && counts[1] > 0, "shared spreads: {counts:?}");
        assert_eq!((counts[2], counts[3]), (N, 0), "failover: all to the active one (name a)");
        assert_eq!(counts[4] + counts[5], N, "key_shared: every message once");
        assert!(keys_of[4].is_disjoint(&keys_of[5]), "key_shared: a key on one consumer: {keys_of:?}");
        assert_eq!(counts[6], N, "exclusive");
        // The standby takes over when the active one leaves.
        fo1.close().await.unwrap();
        let mut sent = false;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !sent {
            producer.send(OutgoingMessage::new("after takeover")).await.unwrap();
            if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(200), fo2.receive()).await {
                assert_eq!(m.payload, "after takeover".as_bytes());
                sent = true;
            }
            assert!(tokio::time::Instant::now() < deadline, "failover standby never became active");
        }
        assert!(fo2.is_active(), "the standby was told it is active");
        client.close();
    });
}

/// A non-persistent topic can be partitioned: a partitioned producer and a
/// consumer by the topic's name use every partition, and the topic and its
/// partitions in use are listed.
#[test]
fn non_persistent_topics_can_be_partitioned_and_are_listed() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("np-partitioned");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "non-persistent://public/default/np-parts";
        client.admin().create_partitioned_topic(topic, 3).await.expect("create a partitioned non-persistent topic");
        let meta = client.admin().partitions(topic).await.unwrap();
        assert_eq!(meta, 3);
        let consumer =
            client.subscribe(topic, "s").sub_type(SubscriptionType::Shared).subscribe_partitioned().await.unwrap();
        assert_eq!(consumer.topics().len(), 3, "{:?}", consumer.topics());
        let producer = client
            .producer(topic)
            .create_partitioned(magnetar_client::RoutingMode::RoundRobin)
            .await
            .expect("partitioned producer");
        // Until every partition's consumer has its permits, a message may be
        // missed (non-persistent): send until each partition delivered one.
        let mut seen = BTreeSet::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        let mut i = 0u64;
        while seen.len() < 3 {
            assert!(tokio::time::Instant::now() < deadline, "partitions delivered: {seen:?}");
            producer.send(OutgoingMessage::new(format!("m{i}"))).await.unwrap();
            i += 1;
            while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(50), consumer.receive()).await {
                assert!(m.topic.starts_with(&format!("{topic}-partition-")), "{}", m.topic);
                seen.insert(m.id.partition);
            }
        }
        assert_eq!(seen, BTreeSet::from([0, 1, 2]));
        let listed = client.admin().call("topics.list", json!({ "namespace": "public/default" })).await.unwrap();
        let names: Vec<&str> = listed.as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
        assert!(names.contains(&topic), "{names:?}");
        for p in 0..3 {
            let part = format!("{topic}-partition-{p}");
            assert!(names.contains(&part.as_str()), "{part} in {names:?}");
        }
        consumer.close().await.unwrap();
        producer.close().await.unwrap();
        // Nobody uses them any more: the partitions are gone from the list,
        // the partitioned topic (metadata) stays.
        let listed = client.admin().call("topics.list", json!({ "namespace": "public/default" })).await.unwrap();
        let names: Vec<&str> = listed.as_array().unwrap().iter().filter_map(|v| v.as_str()).collect();
        assert!(names.contains(&topic) && !names.iter().any(|n| n.contains("np-parts-partition-")), "{names:?}");
        client.close();
    });
}
