//! Goal: retry with a limit (issue #22): a message reconsumed `max_retries`
//! times goes to the dead-letter topic the next time instead of around
//! again, with its origin and retry count as properties, and is not seen
//! again on the subscription; through the SDK's retry policy and through
//! `magnetar consume --reconsume-every 1 --retry-max N`.
//!
//! Method: a 2-shard broker process; short retry delays (100 ms), so the
//! delayed retry topic brings messages back quickly; no timing assertions.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{
    Client, InitialPosition, OutgoingMessage, Reconsumed, RetryPolicy, SubscriptionType, PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_TOPIC, PROPERTY_RECONSUME_TIMES,
};
use magnetar_tests::consume::{assert_quiet, receive};
use magnetar_tests::{run_async_with_timeout, run_cli, test_dir, BrokerProcess, ConsumeCmd};
use std::time::Duration;

const SHARDS: u32 = 2;

#[test]
fn a_message_goes_to_the_dead_letter_topic_after_max_retries() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("retry-limit");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "persistent://public/default/retry-limit";
        let producer = client.producer(topic).create().await.unwrap();
        let original = producer.send(OutgoingMessage::new("payload").with_key("k")).await.unwrap();
        let consumer = client
            .subscribe(topic, "s")
            .sub_type(SubscriptionType::Shared)
            .initial_position(InitialPosition::Earliest)
            .retry_policy(RetryPolicy::fixed(2, Duration::from_millis(100)))
            .subscribe()
            .await
            .unwrap();
        for round in 0..=2u32 {
            let m = receive(&consumer, &format!("round {round}")).await;
            assert_eq!(&m.payload[..], b"payload");
            let times = m.property(PROPERTY_RECONSUME_TIMES).map(|v| v.parse::<u32>().unwrap()).unwrap_or(0);
            assert_eq!(times, round, "RECONSUMETIMES of round {round}");
            match consumer.reconsume(&m).await.unwrap() {
                Reconsumed::Retry { retry, delay, .. } => {
                    assert!(round < 2, "round {round} went around again past the limit");
                    assert_eq!((retry, delay), (round + 1, Duration::from_millis(100)));
                }
                Reconsumed::DeadLettered { .. } => assert_eq!(round, 2, "dead-lettered before the limit"),
            }
        }
        assert_quiet(&consumer, Duration::from_secs(1), "after the message was dead-lettered").await;

        let dlq = client
            .subscribe(format!("{topic}-s-DLQ"), "check")
            .initial_position(InitialPosition::Earliest)
            .subscribe()
            .await
            .unwrap();
        let d = receive(&dlq, "the dead letter").await;
        assert_eq!((&d.payload[..], d.key()), (&b"payload"[..], Some("k")));
        assert_eq!(d.property(PROPERTY_RECONSUME_TIMES), Some("2"));
        assert_eq!(d.property(PROPERTY_REAL_TOPIC), Some(topic));
        assert_eq!(d.property(PROPERTY_ORIGIN_MESSAGE_ID), Some(original.to_string().as_str()));
        assert_quiet(&dlq, Duration::from_millis(300), "one dead letter").await;
        client.close();
    });
}

#[test]
fn the_cli_retry_max_sends_to_the_dead_letter_topic() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("retry-limit-cli");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let client = Client::connect(&url).await.unwrap();
        let topic = "persistent://public/default/retry-cli";
        let producer = client.producer(topic).create().await.unwrap();
        producer.send(OutgoingMessage::new("a")).await.unwrap();
        producer.send(OutgoingMessage::new("b")).await.unwrap();
        let mut cmd = ConsumeCmd::new(&url, topic, "s");
        // Two messages, each seen once and then on each of its 3 retries.
        cmd.count = 8;
        cmd.extra_args = ["--type", "shared", "--reconsume-every", "1", "--retry-max", "3", "--retry-delays", "100"]
            .map(String::from)
            .to_vec();
        let run = tokio::task::spawn_blocking(move || run_cli(cmd.args(), Duration::from_secs(60))).await.unwrap();
        run.assert_success();
        assert_eq!(run.stdout_lines.len(), 8, "{:?}", run.stdout_lines);
        assert_eq!(run.stderr.matches("dead-lettered").count(), 2, "{}", run.stderr);
        let dlq = client
            .subscribe(format!("{topic}-s-DLQ"), "check")
            .initial_position(InitialPosition::Earliest)
            .subscribe()
            .await
            .unwrap();
        let mut got = [receive(&dlq, "dead letter 1").await, receive(&dlq, "dead letter 2").await];
        got.sort_by(|x, y| x.payload.cmp(&y.payload));
        assert_eq!((&got[0].payload[..], &got[1].payload[..]), (&b"a"[..], &b"b"[..]));
        assert!(got.iter().all(|m| m.property(PROPERTY_RECONSUME_TIMES) == Some("3")));
        // The subscription is done with both: nothing comes back.
        let mut again = ConsumeCmd { count: 0, idle_timeout_s: 1.5, ..ConsumeCmd::new(&url, topic, "s") };
        again.extra_args = ["--type", "shared", "--retry-max", "3"].map(String::from).to_vec();
        let rest = tokio::task::spawn_blocking(move || again.run(Duration::from_secs(30))).await.unwrap();
        assert!(rest.is_empty(), "{rest:?}");
        client.close();
    });
}
