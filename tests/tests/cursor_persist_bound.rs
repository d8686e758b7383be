//! Goal (issue #17, item 6): measure the cursor's persist bound after
//! `kill -9`: plain (unconfirmed) acks older than the bound are never
//! redelivered (`docs/semantics.md`, *Cursor persistence bound*).
//!
//! Method: acks sent one at a time (`ack_group(0)`, so the client adds no
//! grouping delay), one every 5 ms for 2 s, each ack's send time noted; the
//! broker is killed with SIGKILL right after the last one. After the
//! restart the subscription redelivers from its persisted position: the
//! first redelivered message's ack was the oldest one lost, and its age at
//! the kill is the measured bound (printed). It must stay under the
//! persist interval (100 ms) plus one group commit; the assertion allows
//! `COMMIT_SLACK` for the commit on a loaded test machine, so it catches a
//! cursor persisted only at shutdown or on a much longer timer, not a slow
//! disk.

use magnetar_client::{Client, InitialPosition, OutgoingMessage};
use magnetar_tests::{test_dir, BrokerProcess};
use std::time::{Duration, Instant};

const MESSAGES: usize = 400;
const ACK_EVERY: Duration = Duration::from_millis(5);
const PERSIST_INTERVAL: Duration = Duration::from_millis(100);
const COMMIT_SLACK: Duration = Duration::from_millis(900);

#[test]
fn acks_older_than_the_persist_bound_survive_kill_9() {
    magnetar_tests::run_async_with_timeout(Duration::from_secs(180), || async {
        let dir = test_dir("cursor-persist-bound");
        let mut broker = BrokerProcess::start(dir.path(), 1);
        let topic = "persist-bound";
        let client = Client::connect(&broker.url()).await.expect("connect");
        let producer = client.producer(topic).create().await.expect("producer");
        let mut ids = Vec::new();
        for i in 0..MESSAGES {
            let r = producer.send_async(OutgoingMessage::new(format!("{i}"))).await.expect("send");
            ids.push(r);
        }
        for r in ids {
            r.await.expect("receipt");
        }
        let consumer = client
            .subscribe(topic, "s")
            .initial_position(InitialPosition::Earliest)
            .ack_group(Duration::ZERO, 1)
            .subscribe()
            .await
            .expect("subscribe");
        let mut acked_at = Vec::with_capacity(MESSAGES);
        for i in 0..MESSAGES {
            let m = magnetar_tests::consume::receive(&consumer, "first delivery").await;
            assert_eq!(m.payload, format!("{i}").as_bytes(), "in order");
            consumer.ack(&m.id).await.expect("ack");
            acked_at.push(Instant::now());
            tokio::time::sleep(ACK_EVERY).await;
        }
        broker.kill9();
        let killed = Instant::now();
        client.close();

        let broker = broker.restart();
        let client = Client::connect(&broker.url()).await.expect("connect after restart");
        let consumer = client.subscribe(topic, "s").subscribe().await.expect("subscribe after restart");
        let first = match tokio::time::timeout(Duration::from_secs(3), consumer.receive()).await {
            Err(_) => {
                eprintln!("every ack survived the kill (persist bound below {:?})", killed - acked_at[MESSAGES - 1]);
                return;
            }
            Ok(m) => m.expect("receive"),
        };
        let i: usize = std::str::from_utf8(&first.payload).expect("utf8").parse().expect("index");
        let lost_age = killed - acked_at[i];
        let kept_age = i.checked_sub(1).map(|k| killed - acked_at[k]);
        eprintln!(
            "cursor persist bound after kill -9: oldest lost ack {lost_age:?} old (message {i} of {MESSAGES}); \
             newest kept {kept_age:?}"
        );
        assert!(
            lost_age <= PERSIST_INTERVAL + COMMIT_SLACK,
            "an ack {lost_age:?} old at the kill was lost: the persist bound is {PERSIST_INTERVAL:?} plus one group commit"
        );
        client.close();
    });
}
