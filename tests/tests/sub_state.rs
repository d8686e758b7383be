//! Goal: what a subscription knows beyond its cursor holds with real broker
//! processes, also across `kill -9`: batch-index acks (only the unacked
//! messages of a batch come back), the subscription type (a consumer of
//! another type is refused after a restart as before it), the tag filter,
//! redelivery counts that go on, a tag filter decided from the index without
//! reading unmatched entries, and the stats (backlog bytes, rates,
//! non-durable subscriptions).
//!
//! Method: a 2-shard broker process; acks are confirmed (`ack_confirmed`)
//! before each kill, so they are durable by contract; state that persists
//! on the cursor interval (redelivery counts) is given a few intervals
//! before the kill.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{
    AckType, Client, ClientError, Consumer, ErrorCode, InitialPosition, MessageId, OutgoingMessage, SubscriptionType,
};
use magnetar_tests::consume::{assert_quiet, produce_one_batch, receive};
use magnetar_tests::{run_async_with_timeout, test_dir, topics_per_shard, BrokerProcess};
use std::time::Duration;

const SHARDS: u32 = 2;

async fn subscribe(client: &Client, topic: &str, sub: &str, t: SubscriptionType) -> Result<Consumer, ClientError> {
    client
        .subscribe(topic, sub)
        .sub_type(t)
        .receiver_queue_size(100)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
}

/// The subscription's entry in the topic stats.
async fn sub_stats(client: &Client, topic: &str, sub: &str) -> serde_json::Value {
    let json: serde_json::Value = serde_json::from_str(&client.topic_stats(topic).await.expect("stats")).unwrap();
    json["subscriptions"][sub].clone()
}

/// Acking some messages of a batch redelivers only the others: after the
/// consumer closes, and after a kill -9 (the acks were confirmed); once all
/// are acked, nothing comes back.
#[test]
fn batch_index_ack_redelivers_only_the_unacked_indexes() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("batch-index-ack");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, _) = topics_per_shard("batchack", SHARDS, 1).remove(0);
        let client = Client::connect(&broker.url()).await.expect("connect");
        let ids = produce_one_batch(&client, &topic).await;
        let shared = SubscriptionType::Shared;

        let c = subscribe(&client, &topic, "bi", shared).await.expect("subscribe");
        let mut got = Vec::new();
        for _ in 0..10 {
            got.push(receive(&c, "first delivery").await.id);
        }
        assert_eq!(got, ids);
        let even: Vec<MessageId> = ids.iter().copied().filter(|id| id.batch_index % 2 == 0).collect();
        c.ack_confirmed(AckType::Individual, &even).await.expect("ack the even indexes");
        let stats = sub_stats(&client, &topic, "bi").await;
        assert_eq!(stats["partial_batches"], 1, "{stats}");
        assert_eq!(stats["msg_backlog"], 1, "one entry: {stats}");
        assert_eq!(stats["backlog_messages"], 5, "five of its messages: {stats}");
        c.close().await.expect("close");

        // Closed with the batch unacked: it comes back without the even ones.
        let c = subscribe(&client, &topic, "bi", shared).await.expect("subscribe again");
        let mut odd = Vec::new();
        for _ in 0..5 {
            let m = receive(&c, "after close").await;
            assert_eq!(m.redelivery_count(), 1);
            odd.push(m.id);
        }
        assert!(odd.iter().all(|id| id.batch_index % 2 == 1), "only unacked indexes: {odd:?}");
        assert_quiet(&c, Duration::from_millis(300), "after the odd ones").await;
        // A grouped ack, then a confirmed one: the group goes first and the
        // confirmation covers both.
        c.ack(&odd[0]).await.expect("grouped ack of 1");
        c.ack_confirmed(AckType::Individual, &odd[1..2]).await.expect("ack 3");
        drop(c);

        broker.kill9();
        let broker = broker.restart();
        let client = Client::connect(&broker.url()).await.expect("connect after restart");
        let c = subscribe(&client, &topic, "bi", shared).await.expect("subscribe after restart");
        let mut rest = Vec::new();
        for _ in 0..3 {
            rest.push(receive(&c, "after kill -9").await.id);
        }
        assert_eq!(rest, odd[2..].to_vec(), "only the indexes still unacked");
        assert_quiet(&c, Duration::from_millis(300), "after kill -9").await;
        // The last ones complete the entry; the client acks it whole.
        c.ack_confirmed(AckType::Individual, &rest).await.expect("ack the rest");
        let stats = sub_stats(&client, &topic, "bi").await;
        assert_eq!(stats["partial_batches"], 0, "{stats}");
        assert_eq!(stats["msg_backlog"], 0, "{stats}");
        c.close().await.expect("close");
        let c = subscribe(&client, &topic, "bi", shared).await.expect("subscribe at the end");
        assert_quiet(&c, Duration::from_millis(500), "everything acked").await;
    });
}

/// The type, tag filter and redelivery counts survive a kill -9: before its
/// consumers are back, a consumer of another type is refused (as while they
/// were attached), the filter still applies, and the redelivery count goes
/// on from where it was.
#[test]
fn subscription_type_filter_and_redelivery_counts_survive_kill9() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("sub-state-kill9");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, _) = topics_per_shard("substate", SHARDS, 1).remove(0);
        let client = Client::connect(&broker.url()).await.expect("connect");
        let producer = client.producer(&topic).create().await.expect("producer");
        for i in 0..4 {
            let tag = if i % 2 == 0 { "keep" } else { "drop" };
            let mut m = OutgoingMessage::new(format!("m{i}"));
            m.tag = Some(tag.into());
            producer.send(m).await.expect("send");
        }
        let c = client
            .subscribe(&topic, "st")
            .sub_type(SubscriptionType::Shared)
            .filter_tag("keep")
            .initial_position(InitialPosition::Earliest)
            .subscribe()
            .await
            .expect("subscribe");
        for round in 0..3 {
            let a = receive(&c, "kept").await;
            let b = receive(&c, "kept").await;
            assert_eq!((a.tag(), b.tag()), (Some("keep"), Some("keep")));
            assert_eq!((a.redelivery_count(), b.redelivery_count()), (round, round));
            if round < 2 {
                c.redeliver_unacknowledged().await.expect("redeliver");
            }
        }
        // Delivered three times; counts alone persist at most once per
        // REDELIVERY_COUNTS_PERSIST_INTERVAL_MS (1 s) plus the cursor flush
        // interval (docs/semantics.md): wait that long.
        tokio::time::sleep(Duration::from_millis(1_300)).await;
        let refused = subscribe(&client, &topic, "st", SubscriptionType::Exclusive).await;
        assert!(matches!(refused, Err(ClientError::Broker { code: ErrorCode::ConsumerBusy, .. })), "{refused:?}");
        drop(c);
        drop(producer);

        broker.kill9();
        let broker = broker.restart();
        let client = Client::connect(&broker.url()).await.expect("connect after restart");
        let stats = sub_stats(&client, &topic, "st").await;
        assert_eq!(stats["type"], "Shared", "{stats}");
        assert_eq!(stats["filter_tag"], "keep", "{stats}");
        let refused = subscribe(&client, &topic, "st", SubscriptionType::Exclusive).await;
        match refused {
            Err(ClientError::Broker { code: ErrorCode::ConsumerBusy, message }) => {
                assert!(message.contains("Shared"), "{message}")
            }
            other => panic!("an exclusive consumer after the restart: {other:?}"),
        }
        let c = client
            .subscribe(&topic, "st")
            .sub_type(SubscriptionType::Shared)
            .filter_tag("keep")
            .subscribe()
            .await
            .expect("shared after restart");
        for _ in 0..2 {
            let m = receive(&c, "after kill -9").await;
            assert_eq!(m.tag(), Some("keep"));
            assert_eq!(m.redelivery_count(), 3, "the count goes on");
        }
        assert_quiet(&c, Duration::from_millis(300), "filtered ones").await;
    });
}

/// A tag filter skips unmatched entries from the index's tag hash: the
/// dispatcher reads only the matching entries (its read counter), and the
/// others count as acknowledged.
#[test]
fn tag_filter_skips_unmatched_entries_without_reading_them() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("tag-index");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, _) = topics_per_shard("tagindex", SHARDS, 1).remove(0);
        let client = Client::connect(&broker.url()).await.expect("connect");
        let producer = client.producer(&topic).create().await.expect("producer");
        let mut receipts = Vec::new();
        for i in 0..500 {
            let mut m = OutgoingMessage::new(format!("m{i}"));
            m.tag = Some(if i % 50 == 0 { "rare".into() } else { format!("common{}", i % 7) });
            receipts.push(producer.send_async(m).await.expect("send"));
        }
        for r in receipts {
            r.await.expect("receipt");
        }
        let c = client
            .subscribe(&topic, "rare-only")
            .filter_tag("rare")
            .initial_position(InitialPosition::Earliest)
            .subscribe()
            .await
            .expect("subscribe");
        for _ in 0..10 {
            let m = receive(&c, "rare").await;
            assert_eq!(m.tag(), Some("rare"));
            c.ack(&m.id).await.expect("ack");
        }
        assert_quiet(&c, Duration::from_millis(300), "only the rare ones").await;
        c.flush_acks().await.expect("flush acks");
        let mut stats = sub_stats(&client, &topic, "rare-only").await;
        for _ in 0..100 {
            if stats["msg_backlog"] == 0 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
            stats = sub_stats(&client, &topic, "rare-only").await;
        }
        assert_eq!(stats["entries_read"], 10, "only matching entries are read: {stats}");
        assert_eq!(stats["skipped_by_index"], 490, "{stats}");
        assert_eq!(stats["msg_backlog"], 0, "unmatched entries count as acknowledged: {stats}");
    });
}

/// Stats: backlog in entries and bytes, unacked, rates in and out; a
/// non-durable subscription from the consumer builder shows as such and is
/// gone once its consumer closes.
#[test]
fn stats_show_backlog_bytes_rates_and_non_durable_subscriptions() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("sub-stats");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, _) = topics_per_shard("substats", SHARDS, 1).remove(0);
        let client = Client::connect(&broker.url()).await.expect("connect");
        let durable = subscribe(&client, &topic, "d", SubscriptionType::Exclusive).await.expect("durable");
        let reader = client
            .subscribe(&topic, "nd")
            .durable(false)
            .initial_position(InitialPosition::Earliest)
            .subscribe()
            .await
            .expect("non-durable");
        let producer = client.producer(&topic).create().await.expect("producer");
        let mut receipts = Vec::new();
        for _ in 0..200 {
            receipts.push(producer.send_async(OutgoingMessage::new(vec![7u8; 1000])).await.expect("send"));
        }
        for r in receipts {
            r.await.expect("receipt");
        }
        for _ in 0..50 {
            receive(&durable, "durable").await;
        }
        // Rates cover the last window of at least a second.
        tokio::time::sleep(Duration::from_millis(1100)).await;
        let stats = sub_stats(&client, &topic, "d").await;
        assert_eq!(stats["msg_backlog"], 200, "{stats}");
        assert_eq!(stats["backlog_messages"], 200, "{stats}");
        let bytes = stats["backlog_bytes"].as_u64().unwrap();
        assert!((200 * 1000..200 * 1200).contains(&bytes), "backlog bytes {bytes}: {stats}");
        assert!(stats["unacked"].as_u64().unwrap() >= 50, "{stats}");
        assert!(stats["msg_rate_in"].as_f64().unwrap() > 0.0, "{stats}");
        assert!(stats["byte_rate_in"].as_f64().unwrap() > 1000.0, "{stats}");
        assert!(stats["msg_rate_out"].as_f64().unwrap() > 0.0, "{stats}");
        assert!(stats["byte_rate_out"].as_f64().unwrap() > 1000.0, "{stats}");
        assert_eq!(stats["durable"], true);
        let nd = sub_stats(&client, &topic, "nd").await;
        assert_eq!(nd["durable"], false, "{nd}");
        reader.close().await.expect("close reader");
        let json: serde_json::Value = serde_json::from_str(&client.topic_stats(&topic).await.unwrap()).unwrap();
        assert!(json["subscriptions"].get("nd").is_none(), "non-durable subscription kept: {json}");
    });
}
