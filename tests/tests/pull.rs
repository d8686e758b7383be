//! Goal: pull consumption (issue #22): a pull consumer gets nothing until
//! it fetches; `fetch(max, timeout)` returns at most `max` messages, waits
//! for them up to the timeout (long poll) and returns what arrived; acks
//! and redelivery work as for push; the CLI's `consume --pull --batch N`
//! reads and acknowledges everything.
//!
//! Method: a 2-shard broker process. Timing is checked loosely: a fetch
//! that times out returned no earlier than its timeout allows (a lower
//! bound, not a speed assertion).

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{Client, InitialPosition, OutgoingMessage, SubscriptionType};
use magnetar_tests::consume::{assert_quiet, topic_stats};
use magnetar_tests::{run_async_with_timeout, test_dir, BrokerProcess, ConsumeCmd};
use std::time::{Duration, Instant};

const SHARDS: u32 = 2;

#[test]
fn fetch_long_polls_within_its_permits_and_acks_and_redelivers() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("pull");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "persistent://public/default/pull";
        let producer = client.producer(topic).create().await.unwrap();
        let mut ids = Vec::new();
        for i in 0..5 {
            ids.push(producer.send(OutgoingMessage::new(format!("m{i}"))).await.unwrap());
        }
        let c = client
            .subscribe(topic, "p")
            .sub_type(SubscriptionType::Shared)
            .initial_position(InitialPosition::Earliest)
            .ack_group(Duration::ZERO, 1)
            .pull_mode(true)
            .subscribe()
            .await
            .unwrap();
        // Nothing is pushed before a fetch.
        assert_quiet(&c, Duration::from_millis(300), "a pull consumer before any fetch").await;
        let stats = topic_stats(&client, topic).await;
        assert_eq!(stats["subscriptions"]["p"]["consumers"][0]["permits"], 0, "{stats}");

        let got = c.fetch(3, Duration::from_secs(10)).await.unwrap();
        assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), ids[..3].to_vec());
        let stats = topic_stats(&client, topic).await;
        assert_eq!(stats["subscriptions"]["p"]["consumers"][0]["permits"], 0, "only what was asked: {stats}");

        // Two are left: a fetch of 10 returns them once its timeout passed.
        let started = Instant::now();
        let rest = c.fetch(10, Duration::from_millis(400)).await.unwrap();
        let waited = started.elapsed();
        assert_eq!(rest.iter().map(|m| m.id).collect::<Vec<_>>(), ids[3..].to_vec());
        assert!(waited >= Duration::from_millis(350), "returned before its timeout with a short batch: {waited:?}");

        for m in got.iter().chain(&rest).filter(|m| m.id != ids[1]) {
            c.ack(&m.id).await.unwrap();
        }
        let empty = c.fetch(10, Duration::from_millis(200)).await.unwrap();
        assert!(empty.is_empty(), "{:?}", empty.iter().map(|m| m.id).collect::<Vec<_>>());

        // The unacknowledged one comes back on request, counted.
        c.redeliver_unacknowledged().await.unwrap();
        let again = c.fetch(1, Duration::from_secs(10)).await.unwrap();
        assert_eq!(again.len(), 1);
        assert_eq!((again[0].id, again[0].redelivery_count()), (ids[1], 1));
        c.ack(&again[0].id).await.unwrap();

        // Long poll: a message sent while the fetch waits ends it.
        let p2 = client.producer(topic).create().await.unwrap();
        let send = tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(500)).await;
            p2.send(OutgoingMessage::new("late")).await.unwrap()
        });
        let started = Instant::now();
        let late = c.fetch(1, Duration::from_secs(20)).await.unwrap();
        let late_id = send.await.unwrap();
        assert_eq!(late.iter().map(|m| m.id).collect::<Vec<_>>(), vec![late_id]);
        assert!(started.elapsed() >= Duration::from_millis(400), "{:?}", started.elapsed());
        c.ack(&late_id).await.unwrap();
        c.close().await.unwrap();

        // Everything was acknowledged: a push consumer gets nothing.
        let push = client.subscribe(topic, "p").sub_type(SubscriptionType::Shared).subscribe().await.unwrap();
        assert_quiet(&push, Duration::from_millis(500), "all acked").await;

        // A push consumer cannot fetch.
        assert!(push.fetch(1, Duration::from_millis(1)).await.is_err());
        client.close();
    });
}

#[test]
fn the_cli_pulls_in_batches_and_acknowledges() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("pull-cli");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let client = Client::connect(&url).await.unwrap();
        let topic = "persistent://public/default/pull-cli";
        let producer = client.producer(topic).create().await.unwrap();
        for i in 0..7 {
            producer.send(OutgoingMessage::new(format!("m{i}"))).await.unwrap();
        }
        let mut cmd = ConsumeCmd::new(&url, topic, "s");
        cmd.count = 7;
        cmd.extra_args = ["--pull", "--batch", "3", "--poll-ms", "200"].map(String::from).to_vec();
        let c2 = cmd.clone();
        let got = tokio::task::spawn_blocking(move || c2.run(Duration::from_secs(60))).await.unwrap();
        let payloads: Vec<Vec<u8>> = got.iter().map(|r| r.payload.clone()).collect();
        assert_eq!(payloads, (0..7).map(|i| format!("m{i}").into_bytes()).collect::<Vec<_>>());
        // Acknowledged: the same subscription, pulled again, has nothing.
        cmd.count = 0;
        cmd.idle_timeout_s = 1.0;
        let rest = tokio::task::spawn_blocking(move || cmd.run(Duration::from_secs(60))).await.unwrap();
        assert!(rest.is_empty(), "{rest:?}");
        client.close();
    });
}
