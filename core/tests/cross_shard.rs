#![allow(clippy::unwrap_used)]
//! Goal: the core routes produce, subscribe, flow and ack between shards
//! without any socket. Method: start two shards on a temporary data directory;
//! from shard 0, use topics owned by shard 0 and by shard 1; produce, consume
//! within permits, ack; then restart and check the cursor survived.

mod common;

use bytes::Bytes;
use glommio::channels::local_channel;
use magnetar_core::{ownership, Broker, BrokerConfig, ConsumerEvent, TopicName};
use magnetar_wire::{encode_message, AckType, MessageMetadata};
use std::time::Duration;

fn topic_on_shard(shard: u32, salt: &str) -> String {
    (0..1000)
        .map(|i| format!("persistent://public/default/{salt}-{i}"))
        .find(|t| ownership::shard_of(&TopicName::parse(t).unwrap(), 16, 2) == shard)
        .unwrap()
}

fn blob(producer: &str, seq: u64) -> Bytes {
    let meta = MessageMetadata {
        producer_name: producer.into(),
        sequence_id: seq,
        publish_time_ms: 1,
        num_messages: 1,
        ..Default::default()
    };
    encode_message(&meta, format!("{producer}:{seq}").as_bytes())
}

fn config(dir: &std::path::Path) -> BrokerConfig {
    let mut c = BrokerConfig::new(dir, 2);
    c.pin_cpus = false;
    c.segment_bytes = 4 * 1024 * 1024;
    c.write_cache_bytes = 1024 * 1024;
    // Not a watermark test: refuse produce only on a completely full disk.
    c.disk_watermarks.refuse_pct = 100;
    c
}

/// Runs `scenario` on shard 0 of a fresh two-shard broker, then shuts down.
fn with_broker<F, Fut>(dir: &std::path::Path, scenario: F)
where
    F: Fn(Broker) -> Fut + Send + Clone + Sync + 'static,
    Fut: std::future::Future<Output = ()> + 'static,
{
    common::run_on_shard0(config(dir), scenario);
}

thread_local! {
    /// Entries of a `Run` event not yet taken by `next_message`.
    static RUN_REST: std::cell::RefCell<std::collections::VecDeque<(magnetar_wire::MessageId, u32, Bytes)>> =
        Default::default();
}

/// The next entry delivered to the sink (a `Run` event's entries one by one).
async fn next_message(rx: &local_channel::LocalReceiver<ConsumerEvent>) -> (magnetar_wire::MessageId, u32, Bytes) {
    if let Some(d) = RUN_REST.with(|r| r.borrow_mut().pop_front()) {
        return d;
    }
    let ev = glommio::timer::timeout(Duration::from_secs(10), async { Ok(rx.recv().await) })
        .await
        .expect("no message within 10 s")
        .expect("sink closed");
    match ev {
        ev @ (ConsumerEvent::Message { .. } | ConsumerEvent::Run { .. }) => {
            let mut d = ev.deliveries().into_iter();
            let first = d.next().expect("a delivery event holds an entry");
            RUN_REST.with(|r| r.borrow_mut().extend(d));
            first
        }
        other => panic!("unexpected event {other:?}"),
    }
}

#[test]
fn produce_consume_ack_across_shards_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let topics = [topic_on_shard(0, "local"), topic_on_shard(1, "remote")];
    let t2 = topics.clone();
    with_broker(dir.path(), move |broker| {
        let topics = t2.clone();
        async move {
            for topic in &topics {
                let p = broker.create_producer(topic, "p").await.unwrap();
                // A second producer with the same name is refused.
                assert!(broker.create_producer(topic, "p").await.is_err());
                let mut receipts = Vec::new();
                for seq in 0..20 {
                    receipts.push(broker.send(&p, 1, blob("p", seq)));
                }
                let mut last = None;
                for (seq, r) in receipts.into_iter().enumerate() {
                    let id = r.await.unwrap();
                    assert_eq!(id.entry, seq as u64);
                    if let Some(prev) = last {
                        assert!(id > prev);
                    }
                    last = Some(id);
                }
                let (tx, rx) = local_channel::new_unbounded();
                let sink = broker.register_sink(tx);
                let req = common::exclusive_from_earliest(topic);
                let c = broker.subscribe(req.clone(), sink).await.unwrap();
                // Exclusive: a second consumer is refused.
                let mut second = req.clone();
                second.consumer_id = 2;
                assert!(broker.subscribe(second, sink).await.is_err());
                broker.flow(&c, 10);
                let mut ids = Vec::new();
                for seq in 0..10u64 {
                    let (id, redeliveries, b) = next_message(&rx).await;
                    let (meta, payload) = magnetar_wire::decode_message(&b).unwrap();
                    assert_eq!(meta.sequence_id, seq);
                    assert_eq!(&payload[..], format!("p:{seq}").as_bytes());
                    assert_eq!(redeliveries, 0);
                    ids.push(id);
                }
                // Within permits: nothing more arrives until we grant more
                // (neither left over from a run nor later).
                assert!(RUN_REST.with(|r| r.borrow().is_empty()), "a run held entries beyond the granted permits");
                let more = glommio::timer::timeout(Duration::from_millis(200), async { Ok(rx.recv().await) }).await;
                assert!(more.is_err(), "a message arrived beyond the granted permits");
                // Ack the first 5 durably.
                broker.ack(&c, AckType::Cumulative, vec![ids[4]], true).await.unwrap();
                broker.close_consumer(&c).await.unwrap();
            }
        }
    });
    // Restart: the cursor resumes after the acknowledged entries; entries
    // 5..10 were delivered but not acknowledged, so they come again.
    with_broker(dir.path(), move |broker| {
        let topics = topics.clone();
        async move {
            for topic in &topics {
                let (tx, rx) = local_channel::new_unbounded();
                let sink = broker.register_sink(tx);
                let req = common::exclusive_from_earliest(topic);
                let c = broker.subscribe(req, sink).await.unwrap();
                broker.flow(&c, 100);
                for seq in 5..20u64 {
                    let (id, _, b) = next_message(&rx).await;
                    assert_eq!(id.entry, seq);
                    let (meta, _) = magnetar_wire::decode_message(&b).unwrap();
                    assert_eq!(meta.sequence_id, seq);
                }
                // The producer name is free again after restart.
                let p = broker.create_producer(topic, "p").await.unwrap();
                let id = broker.send(&p, 1, blob("p", 20)).await.unwrap();
                assert_eq!(id.entry, 20);
                let (id2, _, _) = next_message(&rx).await;
                assert_eq!(id2, id);
            }
        }
    });
}
