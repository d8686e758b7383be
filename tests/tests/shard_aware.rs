//! Goal: with per-shard ports, the shard-aware client connects each producer
//! and consumer straight to the shard that owns its topic, so nothing crosses
//! between shards; the shared port keeps serving everything; a shard's own
//! port refuses another shard's topics with `NotOwner`.
//!
//! Method: a 2-shard broker process. Topics are chosen by
//! `ownership::shard_of` so that both shards own some; the per-shard counters
//! of admin `broker.shard-stats` (producer and consumer requests routed to an
//! owner on another shard, and deliveries sent to a connection on another
//! shard) must stay at 0 through producing, consuming and acknowledging with
//! the default (shard-aware) client, whichever shard its first connection
//! landed on, and must grow when a non-shard-aware client on the other shard
//! does the same (so the counters do count).

use magnetar_client::{AckType, Client, ClientError, ClientOptions, ErrorCode, InitialPosition, OutgoingMessage};
use magnetar_tests::consume::{assert_quiet, receive};
use magnetar_tests::{connect_on_shard, run_async_with_timeout, test_dir, topics_per_shard, BrokerProcess};
use serde_json::{json, Value};
use std::time::Duration;

const SHARDS: u32 = 2;
const MESSAGES: u64 = 50;
const CONNECT_ATTEMPTS: usize = 64;
const QUIET: Duration = Duration::from_millis(300);

/// `[(cross_shard_requests, cross_shard_events)]` per shard.
async fn traffic(client: &Client) -> Vec<(u64, u64)> {
    let v = client.admin().call("broker.shard-stats", json!({})).await.expect("broker.shard-stats");
    let shards = v["shards"].as_array().unwrap_or_else(|| panic!("no shards in {v}"));
    assert_eq!(shards.len(), SHARDS as usize, "{v}");
    shards
        .iter()
        .enumerate()
        .map(|(i, s)| {
            assert_eq!(s["shard"], i as u64, "{v}");
            let n = |k: &str| s[k].as_u64().unwrap_or_else(|| panic!("no {k} in {v}"));
            (n("cross_shard_requests"), n("cross_shard_events"))
        })
        .collect()
}

/// Produces `MESSAGES` messages to `topic`, consumes them (checking ids and
/// payloads) and acknowledges them with a confirmed cumulative ack.
async fn produce_and_consume(client: &Client, topic: &str, what: &str) {
    let consumer = client
        .subscribe(topic, "s")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap_or_else(|e| panic!("{what}: subscribe: {e}"));
    let producer = client.producer(topic).max_pending(16).create().await.unwrap_or_else(|e| panic!("{what}: {e}"));
    let mut receipts = Vec::new();
    for i in 0..MESSAGES {
        receipts.push(producer.send_async(OutgoingMessage::new(format!("{topic}/{i}"))).await.expect("send"));
    }
    let mut ids = Vec::new();
    for r in receipts {
        ids.push(r.await.unwrap_or_else(|e| panic!("{what}: receipt: {e}")));
    }
    for (i, id) in ids.iter().enumerate() {
        let m = receive(&consumer, what).await;
        assert_eq!(m.id, *id, "{what}: message {i}");
        assert_eq!(m.payload.as_ref(), format!("{topic}/{i}").as_bytes(), "{what}: message {i}");
    }
    assert_quiet(&consumer, QUIET, what).await;
    consumer.ack_confirmed(AckType::Cumulative, &[ids[ids.len() - 1]]).await.expect("ack");
    producer.close().await.expect("close producer");
    consumer.close().await.expect("close consumer");
}

/// A default (shard-aware) client whose first connection is on `shard`.
async fn aware_client_on_shard(url: &str, shard: u32) -> Client {
    for _ in 0..CONNECT_ATTEMPTS {
        let c = Client::connect(url).await.expect("connect");
        if c.server_info().shard == shard {
            return c;
        }
        c.close();
    }
    panic!("{CONNECT_ATTEMPTS} connections to {url} never landed on shard {shard}");
}

#[test]
fn shard_aware_client_never_crosses_between_shards() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("shard-aware");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();

        // The default client, its first connection on each shard in turn (so
        // that for every topic, one of the two runs starts on the wrong one).
        for first in 0..SHARDS {
            let probe = connect_on_shard(&url, first, CONNECT_ATTEMPTS).await;
            let ports = probe.server_info().shard_ports.clone();
            assert_eq!(ports.len(), SHARDS as usize, "Connected names every shard's port");
            probe.close();
            let client = aware_client_on_shard(&url, first).await;
            let before = traffic(&client).await;
            for (topic, owner) in &topics_per_shard(&format!("sa{first}"), SHARDS, 2) {
                let what = format!("{topic} (owner shard {owner}), first connection on shard {first}");
                produce_and_consume(&client, topic, &what).await;
            }
            let after = traffic(&client).await;
            assert_eq!(after, before, "the shard-aware client crossed between shards (before, after per shard)");
            client.close();
        }

        // The shared port still serves everything: a client that is not
        // shard-aware, on the other shard than each topic's owner, works,
        // and its requests and deliveries cross (counted).
        for (topic, owner) in &topics_per_shard("shared", SHARDS, 1) {
            let other = (owner + 1) % SHARDS;
            let client = connect_on_shard(&url, other, CONNECT_ATTEMPTS).await;
            let before = traffic(&client).await;
            let what = format!("{topic} (owner shard {owner}) via the shared port on shard {other}");
            produce_and_consume(&client, topic, &what).await;
            let after = traffic(&client).await;
            let (b, a) = (before[other as usize], after[other as usize]);
            // At least: create, MESSAGES sends, subscribe, flow, ack, closes.
            assert!(a.0 >= b.0 + MESSAGES + 4, "{what}: requests routed from shard {other}: {b:?} -> {a:?}");
            // Every message delivered from the owner to shard `other`.
            let (bo, ao) = (before[*owner as usize], after[*owner as usize]);
            assert!(ao.1 >= bo.1 + MESSAGES, "{what}: events sent from owner {owner}: {bo:?} -> {ao:?}");
            client.close();
        }
        drop(broker);
    });
}

#[test]
fn a_shard_port_refuses_other_shards_topics_with_not_owner() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("shard-port");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let shared = Client::connect(&broker.url()).await.expect("connect");
        let ports = shared.server_info().shard_ports.clone();
        assert_eq!(ports.len(), SHARDS as usize);
        let topics = topics_per_shard("port", SHARDS, 1);
        for (shard, port) in ports.iter().enumerate() {
            let shard = shard as u32;
            let url = format!("127.0.0.1:{port}");
            let direct = ClientOptions { shard_aware: false, ..Default::default() };
            let client = Client::connect_with(&url, direct.clone()).await.expect("connect to a shard port");
            assert_eq!(client.server_info().shard, shard, "port {port} is shard {shard}'s own");
            for (topic, owner) in &topics {
                let created = client.producer(topic.as_str()).create().await;
                let subscribed = client.subscribe(topic.as_str(), "s").subscribe().await;
                if *owner == shard {
                    created.unwrap_or_else(|e| panic!("{topic}: producer on its owner's port: {e}"));
                    subscribed.unwrap_or_else(|e| panic!("{topic}: consumer on its owner's port: {e}"));
                } else {
                    for r in [created.map(|_| ()), subscribed.map(|_| ())] {
                        match r {
                            Err(ClientError::Broker { code: ErrorCode::NotOwner, .. }) => {}
                            other => panic!("{topic} (owner {owner}) on shard {shard}'s port: {other:?}"),
                        }
                    }
                }
            }
            // Admin and lookups work on any port; the shard-aware client
            // given a shard port follows the lookup to the owner.
            let owner_answer: Value =
                client.admin().call("topics.owner", json!({ "topic": topics[0].0 })).await.expect("topics.owner");
            assert_eq!(owner_answer["shard"], topics[0].1, "{owner_answer}");
            assert_eq!(owner_answer["shard_port"], ports[topics[0].1 as usize], "{owner_answer}");
            client.close();
            let aware = Client::connect(&url).await.expect("connect");
            for (topic, _) in &topics {
                let p =
                    aware.producer(topic.as_str()).create().await.expect("the shard-aware client follows the owner");
                p.send(OutgoingMessage::new("x")).await.expect("send");
                p.close().await.expect("close");
            }
            aware.close();
        }
        drop(broker);
    });
}
