#![allow(clippy::unwrap_used)]
//! Goal: a shard's metrics are written where the work happens: a publish
//! counts its messages and bytes and records its latency, a delivery counts
//! its entry and bytes on the owner shard, an ack counts once, and a request
//! routed to another shard counts a cross-shard hop. Method: a two-shard
//! broker without sockets; from shard 0, publish to a topic of shard 0,
//! consume and ack it, and publish once to a topic of shard 1; compare the
//! snapshots taken before and after.

mod common;

use bytes::Bytes;
use glommio::channels::local_channel;
use magnetar_core::{ownership, BrokerConfig, ConsumerEvent, TopicName};
use magnetar_wire::{encode_message, AckType, MessageMetadata};
use std::time::Duration;

fn topic_on_shard(shard: u32) -> String {
    (0..1000)
        .map(|i| format!("persistent://public/default/metrics-{i}"))
        .find(|t| ownership::shard_of(&TopicName::parse(t).unwrap(), 16, 2) == shard)
        .unwrap()
}

fn blob(seq: u64, messages: u32) -> Bytes {
    let meta = MessageMetadata {
        producer_name: "p".into(),
        sequence_id: seq,
        publish_time_ms: 1,
        num_messages: messages,
        ..Default::default()
    };
    encode_message(&meta, &[7u8; 100])
}

#[test]
fn metrics_count_publish_delivery_acks_and_hops() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = BrokerConfig::new(dir.path(), 2);
    config.pin_cpus = false;
    config.segment_bytes = 4 * 1024 * 1024;
    config.write_cache_bytes = 1024 * 1024;
    config.disk_watermarks.refuse_pct = 100;
    common::run_on_shard0(config, |broker| async move {
        let here = topic_on_shard(0);
        let there = topic_on_shard(1);
        let before = broker.metrics_snapshot();
        let producer = broker.create_producer(&here, "p").await.unwrap();
        let mut bytes = 0u64;
        for seq in 0..5u64 {
            // A batch of 3 messages counts 3.
            let b = blob(seq, 3);
            bytes += b.len() as u64;
            broker.send(&producer, 3, b).await.unwrap();
        }
        let (tx, rx) = local_channel::new_unbounded::<ConsumerEvent>();
        let sink = broker.register_sink(tx);
        let consumer = broker.subscribe(common::exclusive_from_earliest(&here), sink).await.unwrap();
        broker.flow(&consumer, 100);
        let mut ids = Vec::new();
        while ids.len() < 5 {
            let ev = glommio::timer::timeout(Duration::from_secs(10), async { Ok(rx.recv().await) })
                .await
                .expect("deliveries within 10 s")
                .expect("sink open");
            ids.extend(ev.deliveries().into_iter().map(|(id, _, _)| id));
        }
        broker.ack(&consumer, AckType::Cumulative, vec![ids[4]], true).await.unwrap();
        let mid = broker.metrics_snapshot();
        assert_eq!(mid.messages_in - before.messages_in, 15, "{mid:?}");
        assert_eq!(mid.bytes_in - before.bytes_in, bytes, "{mid:?}");
        assert_eq!(mid.publish_latency_us.count - before.publish_latency_us.count, 5, "{mid:?}");
        assert_eq!(mid.entries_out - before.entries_out, 5, "{mid:?}");
        assert_eq!(mid.bytes_out - before.bytes_out, bytes, "{mid:?}");
        assert_eq!(mid.acks - before.acks, 1, "{mid:?}");
        assert_eq!(mid.cross_shard_requests, before.cross_shard_requests, "all of it stayed on shard 0");
        assert!(mid.storage.durable_lsn > before.storage.durable_lsn, "{mid:?}");

        // A producer of shard 1's topic crosses the mesh: create and send.
        let far = broker.create_producer(&there, "p").await.unwrap();
        broker.send(&far, 1, blob(0, 1)).await.unwrap();
        let after = broker.metrics_snapshot();
        assert_eq!(after.cross_shard_requests - mid.cross_shard_requests, 2, "{after:?}");
        // The append happened on shard 1: shard 0's publish figures did not move.
        assert_eq!(after.messages_in, mid.messages_in, "{after:?}");
    });
}
