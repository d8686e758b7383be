//! Goal: an entry whose metadata claims a batch of 2^20 messages but whose
//! payload does not split into them does not stall an SDK consumer. The
//! broker charges a consumer's flow permits for the messages an entry
//! claims (it never looks inside a batch); the SDK hands such an entry to
//! the application as an error, and must grant back what the broker
//! charged, or the broker, out of permits, sends nothing more (before the
//! fix: the consumer waited for ever after the error).
//!
//! Method: a 1-shard broker; a raw connection produces one entry claiming
//! `BATCH_MESSAGES_MAX` messages with a 1-byte payload, then `COUNT` plain
//! messages; an SDK consumer with a receiver queue of 10 subscribes from the
//! earliest message and must get the error, then every plain message, each
//! within a bound.

#![allow(clippy::unwrap_used)]

use magnetar_client::{Client, ClientError, InitialPosition};
use magnetar_tests::{message_blob, run_async_with_timeout, test_dir, BrokerProcess, RawConnection};
use magnetar_wire::BATCH_MESSAGES_MAX;
use std::time::Duration;

const COUNT: u64 = 50;

#[test]
fn a_batch_that_claims_more_than_it_holds_does_not_stall_the_consumer() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("undecodable-batch");
        let broker = BrokerProcess::start(dir.path(), 1);
        let topic = "undecodable-batch";
        let mut c = RawConnection::connect(broker.addr());
        c.handshake();
        c.open_producer(1, topic, "raw");
        for seq in 0..=COUNT {
            let (n, b) = if seq == 0 {
                (BATCH_MESSAGES_MAX, message_blob("raw", seq, BATCH_MESSAGES_MAX, b"x"))
            } else {
                (1, message_blob("raw", seq, 1, format!("m{seq}").as_bytes()))
            };
            c.send_receipted(1, seq, n, &b);
        }

        let client = Client::connect(&broker.url()).await.expect("client");
        let consumer = client
            .subscribe(topic, "s")
            .initial_position(InitialPosition::Earliest)
            .receiver_queue_size(10)
            .subscribe()
            .await
            .expect("subscribe");
        let first = tokio::time::timeout(Duration::from_secs(20), consumer.receive()).await.expect("first delivery");
        assert!(matches!(first, Err(ClientError::Wire(_))), "the claimed batch must be an error: {first:?}");
        for seq in 1..=COUNT {
            let m = tokio::time::timeout(Duration::from_secs(20), consumer.receive())
                .await
                .unwrap_or_else(|_| panic!("message {seq} never came: the consumer stalled after the bad batch"))
                .expect("message");
            assert_eq!(m.payload.as_ref(), format!("m{seq}").as_bytes());
            consumer.ack(&m.id).await.expect("ack");
        }
    });
}
