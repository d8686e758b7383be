//! Client-side helpers the end-to-end tests share: receive within a
//! deadline, assert that nothing arrives, produce one batch entry, read a
//! topic's stats, wait for a condition.

use magnetar_client::{BatchingOptions, Client, Consumer, Message, MessageId, OutgoingMessage};
use std::time::Duration;

/// How long [`receive`] waits for one message.
pub const RECEIVE_TIMEOUT: Duration = Duration::from_secs(10);

/// The next message, or a panic naming `what` after [`RECEIVE_TIMEOUT`].
pub async fn receive(consumer: &Consumer, what: &str) -> Message {
    tokio::time::timeout(RECEIVE_TIMEOUT, consumer.receive())
        .await
        .unwrap_or_else(|_| panic!("{what}: no message within {RECEIVE_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{what}: receive failed: {e}"))
}

/// Panics if a message (or a receive error) arrives within `wait`.
pub async fn assert_quiet(consumer: &Consumer, wait: Duration, what: &str) {
    if let Ok(m) = tokio::time::timeout(wait, consumer.receive()).await {
        panic!("{what}: expected nothing, got {:?}", m.map(|m| (m.id, m.redelivery_count)));
    }
}

/// Sends ten messages `b0`..`b9` as one batch entry and returns their ids
/// (asserted to share the entry).
pub async fn produce_one_batch(client: &Client, topic: &str) -> Vec<MessageId> {
    let options = BatchingOptions { max_messages: 10, max_delay: Duration::from_secs(5), ..Default::default() };
    let producer = client.producer(topic).batching(options).create().await.expect("producer");
    let mut receipts = Vec::new();
    for i in 0..10 {
        receipts.push(producer.send_async(OutgoingMessage::new(format!("b{i}"))).await.expect("send"));
    }
    let mut ids = Vec::new();
    for r in receipts {
        ids.push(r.await.expect("receipt"));
    }
    producer.close().await.expect("close producer");
    assert!(ids.iter().all(|id| id.entry == ids[0].entry), "one batch entry: {ids:?}");
    ids
}

/// The topic's stats (`topics.stats`) as JSON.
pub async fn topic_stats(client: &Client, topic: &str) -> serde_json::Value {
    let text = client.topic_stats(topic).await.unwrap_or_else(|e| panic!("stats of {topic}: {e}"));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("stats of {topic} are not JSON ({e}): {text}"))
}

/// Polls `f` every 100 ms until it holds; panics naming `what` after `timeout`.
pub async fn wait_for<F, Fut>(what: &str, timeout: Duration, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    while !f().await {
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {timeout:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
