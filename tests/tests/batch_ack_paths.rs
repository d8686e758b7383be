//! Goal: a partly acknowledged batch comes back without its acknowledged
//! messages on every redelivery path besides a plain close (covered in
//! `sub_state.rs`): a negative ack of one sibling while the others' acks
//! are still in the client's ack group, a Failover takeover, and a
//! cumulative ack inside a batch before the takeover.
//!
//! Method: a 1-shard broker; batches of ten messages from the SDK's
//! batching producer; consumers from the SDK.

#![allow(clippy::unwrap_used)]

use magnetar_client::{AckType, Client, InitialPosition, MessageId, SubscriptionType};
use magnetar_tests::consume::{assert_quiet, produce_one_batch, receive};
use magnetar_tests::{run_async_with_timeout, test_dir, BrokerProcess};
use std::time::Duration;

/// Nine messages acked (their acks still in a 5 s ack group), the tenth
/// negatively acked with a 50 ms backoff: only the tenth comes back. The
/// redelivery request must not overtake the grouped acks.
#[test]
fn nack_of_one_sibling_redelivers_only_it_while_acks_are_grouped() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("batch-nack-grouped");
        let _broker = BrokerProcess::start(dir.path(), 1);
        let client = Client::connect(&_broker.url()).await.expect("connect");
        let ids = produce_one_batch(&client, "nack-grouped").await;
        let c = client
            .subscribe("nack-grouped", "s")
            .sub_type(SubscriptionType::Shared)
            .initial_position(InitialPosition::Earliest)
            .ack_group(Duration::from_secs(5), 1000)
            .negative_ack_backoff(Duration::from_millis(50), Duration::from_millis(50))
            .subscribe()
            .await
            .expect("subscribe");
        let mut got = Vec::new();
        for _ in 0..10 {
            got.push(receive(&c, "first delivery").await);
        }
        assert_eq!(got.iter().map(|m| m.id).collect::<Vec<_>>(), ids);
        for m in &got[..9] {
            c.ack(&m.id).await.expect("grouped ack");
        }
        c.negative_acknowledge(&got[9]);
        let back = receive(&c, "after the nack").await;
        assert_eq!((back.id, back.redelivery_count), (ids[9], 1), "only the nacked message comes back");
        assert_quiet(&c, Duration::from_millis(500), "after the nacked message").await;
        c.ack(&back.id).await.expect("ack");
        c.close().await.expect("close");
    });
}

/// Failover: the active consumer acks the even indexes and cumulatively up
/// to index 2 (so 0..=2 and the evens), then closes; the other one takes
/// over and gets only 3, 5, 7, 9.
#[test]
fn failover_takeover_redelivers_only_the_unacked_indexes() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("batch-failover");
        let _broker = BrokerProcess::start(dir.path(), 1);
        let client = Client::connect(&_broker.url()).await.expect("connect");
        let ids = produce_one_batch(&client, "failover-batch").await;
        let subscribe = |name: &'static str, priority: i32| {
            client
                .subscribe("failover-batch", "fo")
                .sub_type(SubscriptionType::Failover)
                .consumer_name(name)
                .priority_level(priority)
                .initial_position(InitialPosition::Earliest)
                .subscribe()
        };
        let a = subscribe("a", 0).await.expect("a");
        let b = subscribe("b", 1).await.expect("b");
        let mut got = Vec::new();
        for _ in 0..10 {
            got.push(receive(&a, "a").await.id);
        }
        assert_eq!(got, ids);
        assert_quiet(&b, Duration::from_millis(200), "b while a is active").await;
        let even: Vec<MessageId> = ids.iter().copied().filter(|id| id.batch_index % 2 == 0).collect();
        a.ack_confirmed(AckType::Individual, &even).await.expect("ack the evens");
        a.ack_confirmed(AckType::Cumulative, &ids[2..3]).await.expect("cumulative to index 2");
        a.close().await.expect("close a");
        let mut rest = Vec::new();
        for _ in 0..4 {
            let m = receive(&b, "b after the takeover").await;
            assert_eq!(m.redelivery_count, 1);
            rest.push(m.id.batch_index);
        }
        assert_eq!(rest, vec![3, 5, 7, 9]);
        assert_quiet(&b, Duration::from_millis(300), "b after 3, 5, 7, 9").await;
        // Acking them completes the entry: nothing comes back.
        let rest_ids: Vec<MessageId> = ids.iter().copied().filter(|id| rest.contains(&id.batch_index)).collect();
        b.ack_confirmed(AckType::Individual, &rest_ids).await.expect("ack the rest");
        b.redeliver_unacknowledged().await.expect("redeliver");
        assert_quiet(&b, Duration::from_millis(500), "all acked").await;
    });
}
