//! Goal: issue #22's allocation strategies hold on a real broker: which
//! Failover consumer owns which partition of a partitioned topic follows
//! the strategy the subscription names (round-robin, average,
//! consistent-hash, zone) after each join and leave; a consumer joining a
//! consistent-hash subscription takes only partitions that move to it, about
//! 1/n of them; a partition that changes owner hands its unacknowledged
//! messages to the new owner, in order; a consumer asking for another
//! strategy is refused; the strategy survives a `kill -9` of the broker.
//!
//! Method: a 2-shard broker process; each consumer subscribes by the
//! partitioned topic's name (one broker-side consumer per partition), and
//! the owner of each partition is read from that partition's stats (the
//! consumer marked active).

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{
    AllocationStrategy, Client, ClientError, ErrorCode, InitialPosition, MultiTopicConsumer, OutgoingMessage,
    SubscriptionType,
};
use magnetar_tests::consume::topic_stats;
use magnetar_tests::{run_async_with_timeout, test_dir, BrokerProcess};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

const SHARDS: u32 = 2;

async fn join(
    client: &Client,
    topic: &str,
    sub: &str,
    name: &str,
    strategy: AllocationStrategy,
    zones: Option<(&str, &[&str])>,
) -> Result<Arc<MultiTopicConsumer>, ClientError> {
    let mut b = client
        .subscribe(topic, sub)
        .sub_type(SubscriptionType::Failover)
        .consumer_name(name)
        .initial_position(InitialPosition::Earliest)
        .allocation(strategy);
    if let Some((zone, partition_zones)) = zones {
        b = b.zone(zone).partition_zones(partition_zones.iter().map(|z| z.to_string()).collect());
    }
    b.subscribe_partitioned().await
}

/// The active consumer's name of each partition of `topic`.
async fn owners(client: &Client, topic: &str, partitions: u32, sub: &str) -> Vec<String> {
    let mut out = Vec::new();
    for p in 0..partitions {
        let stats = topic_stats(client, &format!("{topic}-partition-{p}")).await;
        let consumers = stats["subscriptions"][sub]["consumers"].as_array().cloned().unwrap_or_default();
        let active: Vec<String> = consumers
            .iter()
            .filter(|c| c["active"].as_bool() == Some(true))
            .map(|c| c["name"].as_str().unwrap().to_string())
            .collect();
        assert_eq!(active.len(), 1, "partition {p}: one active consumer: {stats}");
        out.push(active[0].clone());
    }
    out
}

fn names(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Round robin and average: the tables RocketMQ's circle and average give,
/// after each join and after a leave.
#[test]
fn round_robin_and_average_assign_as_rocketmq_does() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("alloc-rr-avg");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "persistent://public/default/alloc-six";
        client.admin().create_partitioned_topic(topic, 6).await.unwrap();
        type Table = [&'static str; 6];
        let cases: [(AllocationStrategy, [Table; 4]); 2] = [
            (
                AllocationStrategy::RoundRobin,
                [
                    ["c0", "c0", "c0", "c0", "c0", "c0"],
                    ["c0", "c1", "c0", "c1", "c0", "c1"],
                    ["c0", "c1", "c2", "c0", "c1", "c2"],
                    ["c0", "c2", "c0", "c2", "c0", "c2"],
                ],
            ),
            (
                AllocationStrategy::Average,
                [
                    ["c0", "c0", "c0", "c0", "c0", "c0"],
                    ["c0", "c0", "c0", "c1", "c1", "c1"],
                    ["c0", "c0", "c1", "c1", "c2", "c2"],
                    ["c0", "c0", "c0", "c2", "c2", "c2"],
                ],
            ),
        ];
        for (strategy, tables) in cases {
            let sub = strategy.as_str();
            let mut consumers = BTreeMap::new();
            for (i, name) in ["c0", "c1", "c2"].into_iter().enumerate() {
                consumers.insert(name, join(&client, topic, sub, name, strategy, None).await.unwrap());
                assert_eq!(owners(&client, topic, 6, sub).await, names(&tables[i]), "{sub} after {name} joined");
            }
            consumers.remove("c1").unwrap().close().await.unwrap();
            assert_eq!(owners(&client, topic, 6, sub).await, names(&tables[3]), "{sub} after c1 left");
            let stats = topic_stats(&client, &format!("{topic}-partition-0")).await;
            assert_eq!(stats["subscriptions"][sub]["allocation"], sub, "{stats}");
            // Another strategy is refused while consumers are attached.
            let other = if strategy == AllocationStrategy::Average {
                AllocationStrategy::RoundRobin
            } else {
                AllocationStrategy::Average
            };
            match join(&client, topic, sub, "c9", other, None).await {
                Err(ClientError::Broker { code: ErrorCode::ConsumerBusy, message }) => {
                    assert!(message.contains("allocation"), "{message}")
                }
                Err(e) => panic!("{sub}: expected ConsumerBusy, got {e}"),
                Ok(_) => panic!("{sub}: a consumer asking for {} was admitted", other.as_str()),
            }
            assert_eq!(owners(&client, topic, 6, sub).await, names(&tables[3]), "{sub}: the refusal moved nothing");
            for (_, c) in consumers {
                c.close().await.unwrap();
            }
        }
        client.close();
    });
}

/// Consistent hash: every partition that changes owner on a join goes to
/// the joiner, and about 1/n of them move; on a leave only the leaver's
/// partitions move.
#[test]
fn consistent_hash_moves_only_the_joiners_share() {
    run_async_with_timeout(Duration::from_secs(180), || async {
        let dir = test_dir("alloc-ring");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "persistent://public/default/alloc-ring";
        let partitions = 32u32;
        client.admin().create_partitioned_topic(topic, partitions).await.unwrap();
        let strategy = AllocationStrategy::ConsistentHash;
        let sub = "ring";
        let mut consumers = Vec::new();
        let mut before: Option<Vec<String>> = None;
        for n in 0..4usize {
            let name = format!("member-{n}");
            consumers.push((name.clone(), join(&client, topic, sub, &name, strategy, None).await.unwrap()));
            let now = owners(&client, topic, partitions, sub).await;
            if let Some(before) = &before {
                let moved: Vec<usize> = (0..now.len()).filter(|&p| now[p] != before[p]).collect();
                for &p in &moved {
                    assert_eq!(now[p], name, "partition {p} moved to a consumer that did not join: {now:?}");
                }
                let fair = f64::from(partitions) / (n + 1) as f64;
                println!("join of {name}: {} of {partitions} partitions moved (fair share {fair:.1})", moved.len());
                assert!(
                    moved.len() as f64 <= fair * 2.0,
                    "{} moved on a join to {n} consumers: {before:?} -> {now:?}",
                    moved.len()
                );
                assert!(!moved.is_empty(), "the joiner got nothing: {now:?}");
            }
            before = Some(now);
        }
        // member-1 leaves: only its partitions move.
        let (gone, c) = consumers.remove(1);
        c.close().await.unwrap();
        let before = before.unwrap();
        let now = owners(&client, topic, partitions, sub).await;
        for p in 0..now.len() {
            if before[p] != gone {
                assert_eq!(now[p], before[p], "partition {p} of a consumer that stayed moved: {now:?}");
            } else {
                assert_ne!(now[p], gone);
            }
        }
        for (_, c) in consumers {
            c.close().await.unwrap();
        }
        client.close();
    });
}

/// Zone: a partition goes to a consumer of its zone while one exists (by
/// average among them), the others by average over all consumers.
#[test]
fn zone_prefers_consumers_of_the_partitions_zone() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("alloc-zone");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "persistent://public/default/alloc-zone";
        client.admin().create_partitioned_topic(topic, 6).await.unwrap();
        // Partition 4 is in a zone nobody is in, partition 5 in none.
        let zones: &[&str] = &["a", "a", "b", "b", "c", ""];
        let strategy = AllocationStrategy::Zone;
        let mut consumers = BTreeMap::new();
        let steps = [
            ("c0", "a", ["c0", "c0", "c0", "c0", "c0", "c0"]),
            ("c1", "b", ["c0", "c0", "c1", "c1", "c0", "c1"]),
            ("c2", "a", ["c0", "c2", "c1", "c1", "c0", "c1"]),
        ];
        for (name, zone, table) in steps {
            consumers.insert(name, join(&client, topic, "z", name, strategy, Some((zone, zones))).await.unwrap());
            assert_eq!(owners(&client, topic, 6, "z").await, names(&table), "after {name} joined");
        }
        // Other partition zones than the subscription's are refused.
        let other: &[&str] = &["a", "b"];
        assert!(join(&client, topic, "z", "c9", strategy, Some(("a", other))).await.is_err());
        // Zone b's only consumer leaves: its partitions fall back to all.
        consumers.remove("c1").unwrap().close().await.unwrap();
        assert_eq!(owners(&client, topic, 6, "z").await, names(&["c0", "c2", "c0", "c0", "c2", "c2"]), "after c1 left");
        for (_, c) in consumers {
            c.close().await.unwrap();
        }
        client.close();
    });
}

/// A partition that moves on a join takes its unacknowledged messages to
/// the new owner, in order, before anything newer.
#[test]
fn a_moved_partition_redelivers_its_unacked_messages_to_the_new_owner_in_order() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("alloc-move");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "persistent://public/default/alloc-move";
        client.admin().create_partitioned_topic(topic, 2).await.unwrap();
        let strategy = AllocationStrategy::Average;
        let first = join(&client, topic, "m", "c0", strategy, None).await.unwrap();
        // Partition 1 moves to c1 when it joins (average: one each).
        let producer = client.producer(format!("{topic}-partition-1")).create().await.unwrap();
        for i in 0..5 {
            producer.send(OutgoingMessage::new(format!("m{i}"))).await.unwrap();
        }
        for i in 0..5 {
            let m = tokio::time::timeout(Duration::from_secs(10), first.receive()).await.unwrap().unwrap();
            assert_eq!(m.payload, format!("m{i}").as_bytes(), "c0 gets partition 1 first");
        }
        let second = join(&client, topic, "m", "c1", strategy, None).await.unwrap();
        assert_eq!(owners(&client, topic, 2, "m").await, names(&["c0", "c1"]));
        producer.send(OutgoingMessage::new("m5")).await.unwrap();
        for i in 0..6 {
            let m = tokio::time::timeout(Duration::from_secs(10), second.receive()).await.unwrap().unwrap();
            assert_eq!(m.payload, format!("m{i}").as_bytes(), "c1 gets partition 1's unacked messages in order");
            assert_eq!(m.redelivery_count, u32::from(i < 5), "m{i}");
            second.ack(&m).await.unwrap();
        }
        first.close().await.unwrap();
        second.close().await.unwrap();
        client.close();
    });
}

/// The strategy is kept with the subscription: after a `kill -9` the
/// subscription still names it, and consumers joining again are placed by
/// it.
#[test]
fn the_strategy_survives_kill_9() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("alloc-kill9");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "persistent://public/default/alloc-kill9";
        client.admin().create_partitioned_topic(topic, 4).await.unwrap();
        let strategy = AllocationStrategy::Average;
        let a = join(&client, topic, "k", "c0", strategy, None).await.unwrap();
        let b = join(&client, topic, "k", "c1", strategy, None).await.unwrap();
        assert_eq!(owners(&client, topic, 4, "k").await, names(&["c0", "c0", "c1", "c1"]));
        // The state record goes with the next cursor flush (100 ms).
        tokio::time::sleep(Duration::from_millis(500)).await;
        drop((a, b));
        client.close();
        broker.kill9();
        let broker = broker.restart();
        let client = Client::connect(&broker.url()).await.unwrap();
        for p in 0..4 {
            let stats = topic_stats(&client, &format!("{topic}-partition-{p}")).await;
            assert_eq!(stats["subscriptions"]["k"]["allocation"], "average", "partition {p} after kill -9: {stats}");
        }
        let a = join(&client, topic, "k", "c0", strategy, None).await.unwrap();
        let b = join(&client, topic, "k", "c1", strategy, None).await.unwrap();
        assert_eq!(owners(&client, topic, 4, "k").await, names(&["c0", "c0", "c1", "c1"]));
        a.close().await.unwrap();
        b.close().await.unwrap();
        client.close();
    });
}
