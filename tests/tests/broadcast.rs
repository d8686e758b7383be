//! Goal: issue #22's broadcast consumption holds on a real broker: every
//! consumer of a broadcast subscription receives every message, each with
//! its own cursor named `<subscription>/<consumer-name>` in stats; a
//! consumer that comes back under the same name resumes where it left (also
//! after a `kill -9` of the broker), and unsubscribing deletes its cursor;
//! a broadcast consumer without a name is refused; the CLI's `consume --mode broadcast --name N` does the same.
//!
//! Method: a 2-shard broker process; consumers through the SDK and the CLI.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{
    AckType, Client, ClientError, Consumer, ErrorCode, InitialPosition, OutgoingMessage, SubscriptionMode,
};
use magnetar_tests::consume::{assert_quiet, receive, topic_stats};
use magnetar_tests::run_cli;
use magnetar_tests::{run_async_with_timeout, test_dir, BrokerProcess};
use std::time::Duration;

const SHARDS: u32 = 2;

async fn broadcast(client: &Client, topic: &str, name: &str) -> Result<Consumer, ClientError> {
    let mut b = client
        .subscribe(topic, "bc")
        .mode(SubscriptionMode::Broadcast)
        // Latest: a cursor that came back must not be the reason a
        // consumer sees old messages.
        .initial_position(InitialPosition::Latest);
    if !name.is_empty() {
        b = b.consumer_name(name);
    }
    b.subscribe().await
}

async fn send(client: &Client, topic: &str, range: std::ops::Range<u32>) {
    let producer = client.producer(topic).create().await.unwrap();
    for i in range {
        producer.send(OutgoingMessage::new(format!("m{i}"))).await.unwrap();
    }
    producer.close().await.unwrap();
}

async fn expect(c: &Consumer, range: std::ops::Range<u32>, what: &str) -> Vec<magnetar_client::MessageId> {
    let mut ids = Vec::new();
    for i in range {
        let m = receive(c, what).await;
        assert_eq!(String::from_utf8_lossy(&m.payload), format!("m{i}"), "{what}");
        ids.push(m.id);
    }
    ids
}

#[test]
fn every_consumer_gets_every_message_and_resumes_by_name() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("broadcast");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "persistent://public/default/broadcast";
        match broadcast(&client, topic, "").await {
            Err(ClientError::Broker { code: ErrorCode::NotAllowed, message }) => {
                assert!(message.contains("name"), "{message}")
            }
            Err(e) => panic!("a nameless broadcast consumer: expected NotAllowed, got {e}"),
            Ok(_) => panic!("a nameless broadcast consumer was admitted"),
        }
        let a = broadcast(&client, topic, "a").await.unwrap();
        let b = broadcast(&client, topic, "b").await.unwrap();
        let c = broadcast(&client, topic, "c").await.unwrap();
        send(&client, topic, 0..10).await;
        let mut last = Vec::new();
        for (name, consumer) in [("a", &a), ("b", &b), ("c", &c)] {
            let ids = expect(consumer, 0..10, name).await;
            last.push(ids);
        }
        let stats = topic_stats(&client, topic).await;
        let subs: Vec<&String> = stats["subscriptions"].as_object().unwrap().keys().collect();
        assert_eq!(subs, vec!["bc/a", "bc/b", "bc/c"], "one cursor per consumer: {stats}");
        // a acknowledges the first five only, then leaves; b all ten.
        a.ack_confirmed(AckType::Cumulative, &[last[0][4]]).await.unwrap();
        b.ack_confirmed(AckType::Cumulative, &[last[1][9]]).await.unwrap();
        a.close().await.unwrap();
        send(&client, topic, 10..15).await;
        let ids = expect(&b, 10..15, "b while a is away").await;
        b.ack_confirmed(AckType::Cumulative, &[ids[4]]).await.unwrap();
        let stats = topic_stats(&client, topic).await;
        assert_eq!(stats["subscriptions"]["bc/a"]["msg_backlog"], 10, "a's cursor stays while it is away: {stats}");
        // a comes back under its name: from m5 on, though it asks for Latest.
        let a = broadcast(&client, topic, "a").await.unwrap();
        let ids = expect(&a, 5..15, "a back").await;
        a.ack_confirmed(AckType::Cumulative, &[ids[4]]).await.unwrap();
        // The same after a kill -9: a's cursor is at m10.
        drop((a, b, c));
        client.close();
        broker.kill9();
        let broker = broker.restart();
        let client = Client::connect(&broker.url()).await.unwrap();
        let a = broadcast(&client, topic, "a").await.unwrap();
        expect(&a, 10..15, "a after kill -9").await;
        assert_quiet(&a, Duration::from_millis(300), "a after kill -9").await;
        let b = broadcast(&client, topic, "b").await.unwrap();
        assert_quiet(&b, Duration::from_millis(300), "b acknowledged everything before kill -9").await;
        // Unsubscribing removes the consumer's own cursor, and only it.
        a.unsubscribe(false).await.unwrap();
        let stats = topic_stats(&client, topic).await;
        let subs: Vec<&String> = stats["subscriptions"].as_object().unwrap().keys().collect();
        assert_eq!(subs, vec!["bc/b", "bc/c"], "a's cursor went with its unsubscribe: {stats}");
        b.close().await.unwrap();

        // The CLI: two named broadcast consumers each print every message.
        let url = broker.url();
        send(&client, topic, 15..18).await;
        for name in ["x", "y"] {
            let args = [
                "consume",
                topic,
                "-s",
                "cli",
                "--mode",
                "broadcast",
                "--name",
                name,
                "--initial-position",
                "earliest",
                "--count",
                "18",
                "--timeout-s",
                "5",
                "--output",
                "jsonl",
                "--url",
                &url,
            ];
            let run = run_cli(args, Duration::from_secs(30));
            run.assert_success();
            assert_eq!(run.stdout_lines.len(), 18, "{name}: {}", run.stderr);
        }
        let stats = topic_stats(&client, topic).await;
        for s in ["cli/x", "cli/y"] {
            assert!(stats["subscriptions"][s].is_object(), "{s}: {stats}");
        }
        let run =
            run_cli(["consume", topic, "-s", "cli", "--mode", "broadcast", "--url", &url], Duration::from_secs(30));
        assert!(!run.status.success() && run.stderr.contains("--name"), "broadcast without --name: {}", run.stderr);
        client.close();
    });
}
