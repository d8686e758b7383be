//! Goal: a stalled consumer does not raise the broker's memory past a stated
//! bound (issue #4, invariant 5: memory per shard is bounded by
//! configuration, whatever clients do).
//!
//! Method: a broker with a 16 MiB write cache (the read cache is 64 MiB); a
//! Shared consumer with a receiver queue of 10 that never receives past its
//! queue and never acks; a producer writes `MAGNETAR_STALL_MB` (default 200)
//! MiB of 16 KiB messages. The broker's resident set (`VmRSS` in
//! `/proc/PID/status`) is sampled every 50 ms; its rise over the value after
//! warm-up must stay under write cache + read cache + 48 MiB of slack
//! (128 MiB), well under what was written: a broker that queued the stalled
//! consumer's messages would hold them all.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{Client, InitialPosition, OutgoingMessage, SubscriptionType};
use magnetar_tests::{run_async_with_timeout, test_dir, topics_per_shard, BrokerOptions, BrokerProcess};
use std::time::Duration;

const WRITE_CACHE_MIB: u64 = 16;
const READ_CACHE_MIB: u64 = 64;
const SLACK_MIB: u64 = 48;
const MESSAGE_BYTES: usize = 16 * 1024;

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

#[test]
fn a_stalled_consumer_does_not_raise_broker_memory_past_its_bound() {
    let written_mib: u64 = std::env::var("MAGNETAR_STALL_MB").ok().and_then(|v| v.parse().ok()).unwrap_or(200);
    run_async_with_timeout(Duration::from_secs(240), move || async move {
        let dir = test_dir("stalled-memory");
        let mut options = BrokerOptions::new(2);
        options.write_cache_mib = Some(WRITE_CACHE_MIB);
        let broker = BrokerProcess::start_with(dir.path(), &options);
        let pid = broker.pid();
        let (topic, _) = topics_per_shard("stall", 2, 1).remove(0);
        let client = Client::connect(&broker.url()).await.expect("connect");
        let stalled = client
            .subscribe(&topic, "stalled")
            .sub_type(SubscriptionType::Shared)
            .receiver_queue_size(10)
            .initial_position(InitialPosition::Earliest)
            .subscribe()
            .await
            .expect("subscribe");
        let producer = client.producer(&topic).create().await.expect("producer");
        // Warm-up: executors, buffers and the first segment are in place.
        for _ in 0..64 {
            producer.send(OutgoingMessage::new(vec![1u8; MESSAGE_BYTES])).await.expect("send");
        }
        let first = tokio::time::timeout(Duration::from_secs(10), stalled.receive()).await;
        assert!(first.is_ok(), "the consumer got nothing at all");
        let baseline = rss_kib(pid);

        let sampler = tokio::spawn(async move {
            let mut peak = 0;
            loop {
                peak = peak.max(rss_kib(pid));
                tokio::time::sleep(Duration::from_millis(50)).await;
                if std::fs::metadata(format!("/proc/{pid}")).is_err() {
                    return peak;
                }
            }
        });
        let messages = written_mib * 1024 * 1024 / MESSAGE_BYTES as u64;
        let mut receipts = std::collections::VecDeque::new();
        for _ in 0..messages {
            receipts.push_back(producer.send_async(OutgoingMessage::new(vec![2u8; MESSAGE_BYTES])).await.unwrap());
            while receipts.len() > 256 {
                receipts.pop_front().unwrap().await.expect("receipt");
            }
        }
        for r in receipts {
            r.await.expect("receipt");
        }
        // Give dispatch time to do whatever it would do with the backlog.
        tokio::time::sleep(Duration::from_millis(500)).await;
        let after = rss_kib(pid);
        sampler.abort();
        let peak = after.max(rss_kib(pid));
        let bound_kib = (WRITE_CACHE_MIB + READ_CACHE_MIB + SLACK_MIB) * 1024;
        let rise = peak.saturating_sub(baseline);
        println!(
            "stalled consumer: wrote {written_mib} MiB; broker VmRSS baseline {} MiB, after {} MiB, \
             rise {} MiB (bound {} MiB)",
            baseline / 1024,
            after / 1024,
            rise / 1024,
            bound_kib / 1024
        );
        assert!(rise < bound_kib, "broker RSS rose {rise} KiB, bound {bound_kib} KiB");
        let stats: serde_json::Value = serde_json::from_str(&client.topic_stats(&topic).await.unwrap()).unwrap();
        let unacked = stats["subscriptions"]["stalled"]["unacked"].as_u64().unwrap();
        assert!(unacked <= 11, "dispatch went past the consumer's permits: {unacked} unacked");
        drop(stalled);
    });
}
