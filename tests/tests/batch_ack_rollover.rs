//! Goal: a cumulative ack of a partly acknowledged batch that sits at
//! entry 0 of a ledger (right after a rollover) acknowledges every entry of
//! the previous ledger too, not only the batch's first messages; and that
//! stays so after `kill -9`. (Suspected bug: "the entry before `L:0`" is the
//! previous ledger's last entry, which the client does not know.)
//!
//! Method: 3-entry ledgers (`--ledger-max-entries 3 --ledger-min-rollover-s
//! 0`); three plain messages fill ledger A, then a batch of ten opens
//! ledger B at entry 0. Subscription `partial` acknowledges batch indexes
//! 0 and 1 individually, then index 4 cumulatively; subscription `direct`
//! only the cumulative ack of index 4. Both must then have a backlog of one
//! entry and, resubscribed (also after `kill -9`), get exactly indexes
//! 5..9 of the batch and nothing of ledger A.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{AckType, BatchingOptions, Client, Consumer, InitialPosition, MessageId, OutgoingMessage};
use magnetar_tests::{run_async_with_timeout, test_dir, BrokerOptions, BrokerProcess};
use std::time::Duration;

const RECEIVE_TIMEOUT: Duration = Duration::from_secs(10);

async fn subscribe(client: &Client, topic: &str, sub: &str) -> Consumer {
    client.subscribe(topic, sub).initial_position(InitialPosition::Earliest).subscribe().await.unwrap()
}

async fn receive_n(c: &Consumer, n: usize, what: &str) -> Vec<MessageId> {
    let mut out = Vec::new();
    for _ in 0..n {
        let m = tokio::time::timeout(RECEIVE_TIMEOUT, c.receive())
            .await
            .unwrap_or_else(|_| panic!("{what}: only {} of {n} within {RECEIVE_TIMEOUT:?}: {out:?}", out.len()))
            .unwrap();
        out.push(m.id);
    }
    out
}

async fn assert_quiet(c: &Consumer, what: &str) {
    if let Ok(m) = tokio::time::timeout(Duration::from_millis(500), c.receive()).await {
        panic!("{what}: expected nothing more, got {:?}", m.map(|m| m.id));
    }
}

async fn backlog(client: &Client, topic: &str, sub: &str) -> u64 {
    let v: serde_json::Value = serde_json::from_str(&client.topic_stats(topic).await.unwrap()).unwrap();
    v["subscriptions"][sub]["msg_backlog"].as_u64().unwrap()
}

#[test]
fn cumulative_ack_of_partly_acked_batch_at_ledger_start_acks_previous_ledger() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("batch-ack-rollover");
        let mut o = BrokerOptions::new(1);
        o.extra_args = ["--ledger-max-entries", "3", "--ledger-min-rollover-s", "0"].map(String::from).to_vec();
        let mut broker = BrokerProcess::start_with(dir.path(), &o);
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "persistent://public/default/batch-at-ledger-start";
        let subs = ["partial", "direct"];
        let mut consumers = Vec::new();
        for s in subs {
            consumers.push(subscribe(&client, topic, s).await);
        }

        let plain = client.producer(topic).create().await.unwrap();
        let mut a = Vec::new();
        for i in 0..3 {
            a.push(plain.send(OutgoingMessage::new(format!("plain-{i}"))).await.unwrap());
        }
        plain.close().await.unwrap();
        let options = BatchingOptions { max_messages: 10, max_delay: Duration::from_secs(5), ..Default::default() };
        let batched = client.producer(topic).batching(options).create().await.unwrap();
        let mut receipts = Vec::new();
        for i in 0..10 {
            receipts.push(batched.send_async(OutgoingMessage::new(format!("batched-{i}"))).await.unwrap());
        }
        let mut b = Vec::new();
        for r in receipts {
            b.push(r.await.unwrap());
        }
        batched.close().await.unwrap();
        assert!(a.iter().all(|id| id.ledger == a[0].ledger), "ledger A holds the plain messages: {a:?}");
        assert!(b.iter().all(|id| (id.ledger, id.entry) == (b[0].ledger, 0)), "one batch at B:0: {b:?}");
        assert!(b[0].ledger > a[0].ledger, "the batch opens a new ledger");

        for c in &consumers {
            let got = receive_n(c, 13, "first delivery").await;
            assert_eq!(got[..3], a[..]);
            assert_eq!(got[3..], b[..]);
        }
        consumers[0].ack_confirmed(AckType::Individual, &b[..2]).await.unwrap();
        for c in &consumers {
            c.ack_confirmed(AckType::Cumulative, &[b[4]]).await.unwrap();
        }
        for s in subs {
            assert_eq!(backlog(&client, topic, s).await, 1, "{s}: only the batch's entry is left");
        }
        for c in consumers.drain(..) {
            c.close().await.unwrap();
        }
        for s in subs {
            let c = subscribe(&client, topic, s).await;
            assert_eq!(receive_n(&c, 5, s).await, b[5..], "{s}: indexes 5..9 only");
            assert_quiet(&c, s).await;
            c.close().await.unwrap();
        }

        client.close();
        broker.kill9();
        broker = broker.restart();
        let client = Client::connect(&broker.url()).await.unwrap();
        for s in subs {
            assert_eq!(backlog(&client, topic, s).await, 1, "{s} after kill -9");
            let c = subscribe(&client, topic, s).await;
            assert_eq!(receive_n(&c, 5, s).await, b[5..], "{s} after kill -9: indexes 5..9 only");
            assert_quiet(&c, s).await;
            c.close().await.unwrap();
        }
        client.close();
        broker.terminate();
    });
}
