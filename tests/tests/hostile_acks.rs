//! Goal: batch-index acks from a client that does not play fair cannot hurt
//! the broker or anyone else: a batch's size is what its producer claimed,
//! so a client that produces entries claiming the largest batch the wire
//! allows (2^20 messages, in a few bytes) and acks one index of each must
//! not make the subscription's state record grow past what the log takes
//! (which would fail every confirmed ack and stop the cursor persisting);
//! and acks with wrong sizes, indexes past the batch, ids never delivered,
//! or a cumulative batch-index ack on Shared are refused with an answer on a
//! connection that goes on working, the broker serving others throughout.
//!
//! Method: a 1-shard broker; a raw connection produces and consumes exactly
//! the frames under test; an SDK witness round-trips before and after; the
//! broker is restarted and the hostile subscription's confirmed acks hold.

#![allow(clippy::unwrap_used)]

use magnetar_client::{Client, InitialPosition, OutgoingMessage};
use magnetar_tests::{message_blob, run_async_with_timeout, test_dir, BrokerProcess, RawConnection};
use magnetar_wire::{AckType, Command, MessageId, SubscriptionType, BATCH_MESSAGES_MAX};
use std::net::SocketAddr;
use std::time::Duration;

/// Entries claiming `BATCH_MESSAGES_MAX` messages: their bits (128 KiB
/// each) would total more than the log's 5 MiB entry limit.
const HUGE: u64 = 48;

fn blob(seq: u64, num_messages: u32) -> bytes::Bytes {
    message_blob("hostile", seq, num_messages, b"x")
}

fn subscribe(c: &mut RawConnection, topic: &str, sub: &str, sub_type: SubscriptionType, consumer_id: u64) {
    match c.subscribe(100 + consumer_id, consumer_id, topic, sub, sub_type) {
        Command::Success { .. } => {}
        other => panic!("subscribe {sub} answered with {other:?}"),
    }
    c.send(&Command::Flow { consumer_id, permits: u32::MAX }, &[]);
}

/// Receives `n` messages for `consumer_id`: (id, ack_set).
fn receive(c: &mut RawConnection, n: u64, consumer_id: u64) -> Vec<(MessageId, Vec<u64>)> {
    (0..n)
        .map(|i| match c.next_command(&format!("message {i}")) {
            Command::Message { consumer_id: got, message_id, ack_set, .. } if got == consumer_id => {
                (message_id, ack_set)
            }
            other => panic!("expected message {i}, got {other:?}"),
        })
        .collect()
}

/// Sends an ack with `request_id` and returns the broker's answer.
fn ack(
    c: &mut RawConnection,
    consumer_id: u64,
    ack_type: AckType,
    ids: Vec<MessageId>,
    sizes: Vec<u32>,
    request_id: u64,
) -> Command {
    c.send(&Command::Ack { consumer_id, ack_type, message_ids: ids, request_id, batch_sizes: sizes }, &[]);
    c.next_command(&format!("ack {request_id}"))
}

fn in_batch(id: MessageId, index: i32) -> MessageId {
    MessageId::new(id.ledger, id.entry, id.partition, index)
}

/// Produces `HUGE` claimed-huge batches then one plain message; acks index 0
/// of each batch and the plain message whole, each confirmed.
fn hostile_huge_batches(addr: SocketAddr, topic: &str) -> Vec<MessageId> {
    let mut c = RawConnection::connect(addr);
    c.handshake();
    c.open_producer(1, topic, "hostile");
    for seq in 0..=HUGE {
        let n = if seq < HUGE { BATCH_MESSAGES_MAX } else { 1 };
        c.send_receipted(1, seq, n, &blob(seq, n));
    }
    subscribe(&mut c, topic, "hostile", SubscriptionType::Exclusive, 7);
    let got = receive(&mut c, HUGE + 1, 7);
    let ids: Vec<MessageId> = got.iter().map(|(id, _)| *id).collect();
    for (i, id) in ids.iter().enumerate() {
        let (ack_id, sizes) =
            if (i as u64) < HUGE { (in_batch(*id, 0), vec![BATCH_MESSAGES_MAX]) } else { (*id, vec![]) };
        match ack(&mut c, 7, AckType::Individual, vec![ack_id], sizes, 1000 + i as u64) {
            Command::Success { .. } => {}
            other => panic!("confirmed ack of {ack_id} (entry {i}) answered with {other:?}"),
        }
    }
    ids
}

async fn witness_round_trip(url: &str, topic: &str, when: &str) {
    let client = Client::connect(url).await.expect("client");
    let producer = client.producer(topic).create().await.expect("producer");
    let consumer =
        client.subscribe(topic, "w").initial_position(InitialPosition::Earliest).subscribe().await.expect("subscribe");
    let id = producer.send(OutgoingMessage::new(when.to_string())).await.expect("send");
    loop {
        let m = tokio::time::timeout(Duration::from_secs(10), consumer.receive())
            .await
            .unwrap_or_else(|_| panic!("witness: nothing {when}"))
            .expect("receive");
        consumer.ack(&m.id).await.expect("ack");
        if m.id == id {
            break;
        }
    }
    client.close();
}

#[test]
fn claimed_huge_batches_keep_the_state_record_bounded() {
    run_async_with_timeout(Duration::from_secs(120), || async move {
        let dir = test_dir("hostile-huge-batches");
        let mut broker = BrokerProcess::start(dir.path(), 1);
        let (url, addr) = (broker.url(), broker.addr());
        witness_round_trip(&url, "witness", "before").await;
        let ids = tokio::task::spawn_blocking(move || hostile_huge_batches(addr, "huge"))
            .await
            .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        witness_round_trip(&url, "witness", "after").await;
        broker.assert_running();
        assert!(broker.terminate().success(), "{}", broker.log_tail());

        let mut broker = broker.restart();
        let addr = broker.addr();
        tokio::task::spawn_blocking(move || {
            let mut c = RawConnection::connect(addr);
            c.handshake();
            subscribe(&mut c, "huge", "hostile", SubscriptionType::Exclusive, 8);
            let back = receive(&mut c, HUGE, 8);
            // The plain message was acked whole and confirmed: never back.
            let back_ids: Vec<MessageId> = back.iter().map(|(id, _)| *id).collect();
            assert_eq!(back_ids, ids[..HUGE as usize].to_vec());
            // The batches whose bits were kept come back with bit 0 set,
            // the first ones (the lowest entries are kept); the others whole.
            let kept = back.iter().take_while(|(_, set)| set.first() == Some(&1)).count();
            assert!(kept >= 1, "no batch kept its bits");
            assert!(back[kept..].iter().all(|(_, set)| set.is_empty()), "bits past the bound");
            if let Some(f) = c.try_next(Duration::from_millis(300), "quiet") {
                panic!("more than the batches came back: {:?}", f.command);
            }
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        assert!(!broker.log().contains("panicked"), "{}", broker.log_tail());
        assert!(broker.terminate().success());
    });
}

#[test]
fn bad_batch_index_acks_are_refused_and_the_connection_goes_on() {
    run_async_with_timeout(Duration::from_secs(120), || async move {
        let dir = test_dir("hostile-bad-index-acks");
        let mut broker = BrokerProcess::start(dir.path(), 1);
        let (url, addr) = (broker.url(), broker.addr());
        witness_round_trip(&url, "witness", "before").await;
        tokio::task::spawn_blocking(move || {
            let mut c = RawConnection::connect(addr);
            c.handshake();
            c.open_producer(1, "bad-acks", "bad");
            for seq in 0..4u64 {
                c.send_receipted(1, seq, 4, &blob(seq, 4));
            }
            subscribe(&mut c, "bad-acks", "s", SubscriptionType::Shared, 3);
            let ids: Vec<MessageId> = receive(&mut c, 4, 3).into_iter().map(|(id, _)| id).collect();
            let refused = |answer: Command, what: &str| match answer {
                Command::Error { .. } => {}
                other => panic!("{what}: answered with {other:?}"),
            };
            let accepted = |answer: Command, what: &str| match answer {
                Command::Success { .. } => {}
                other => panic!("{what}: answered with {other:?}"),
            };
            let a = in_batch(ids[0], 1);
            refused(ack(&mut c, 3, AckType::Individual, vec![a], vec![5], 1), "size other than the entry's");
            refused(ack(&mut c, 3, AckType::Individual, vec![a], vec![u32::MAX], 2), "size u32::MAX");
            refused(ack(&mut c, 3, AckType::Individual, vec![in_batch(ids[0], 4)], vec![4], 3), "index = size");
            refused(
                ack(&mut c, 3, AckType::Individual, vec![in_batch(ids[0], i32::MAX)], vec![4], 4),
                "index i32::MAX",
            );
            refused(ack(&mut c, 3, AckType::Cumulative, vec![a], vec![4], 5), "cumulative on Shared");
            let never = MessageId::new(ids[0].ledger, ids[3].entry + 10, ids[0].partition, 0);
            refused(ack(&mut c, 3, AckType::Individual, vec![never], vec![4], 6), "an entry never written");
            // Sizes on an id without a batch index: the whole entry.
            accepted(ack(&mut c, 3, AckType::Individual, vec![ids[1]], vec![4], 7), "whole entry with a size");
            // A negative index other than -1 acknowledges the whole entry.
            accepted(
                ack(&mut c, 3, AckType::Individual, vec![in_batch(ids[2], i32::MIN)], vec![4], 8),
                "index i32::MIN",
            );
            // A good index ack still works after all that.
            accepted(ack(&mut c, 3, AckType::Individual, vec![a], vec![4], 9), "a good index ack");
            c.send(&Command::Ping, &[]);
            assert!(matches!(c.next_command("ping"), Command::Pong));
            // The broker redelivers entry 0 with bit 1 set, and 3 whole.
            c.send(&Command::RedeliverUnacknowledged { consumer_id: 3, message_ids: vec![] }, &[]);
            let mut back = receive(&mut c, 2, 3);
            back.sort_by_key(|(id, _)| id.entry);
            assert_eq!(back, vec![(ids[0], vec![0b10]), (ids[3], vec![])]);
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        witness_round_trip(&url, "witness", "after").await;
        broker.assert_running();
        assert!(!broker.log().contains("panicked"), "{}", broker.log_tail());
        assert!(broker.terminate().success());
    });
}

/// A tag filter longer than the state record keeps is refused at subscribe
/// (cut at 1,024 bytes it came back after a restart as another filter, and
/// every entry counted as acknowledged); one of exactly 1,024 bytes holds
/// across a restart.
#[test]
fn overlong_tag_filter_is_refused_and_the_longest_holds_across_restart() {
    run_async_with_timeout(Duration::from_secs(120), || async move {
        let dir = test_dir("hostile-long-filter");
        let mut broker = BrokerProcess::start(dir.path(), 1);
        let client = Client::connect(&broker.url()).await.expect("client");
        let subscribe = |tag: String| {
            client.subscribe("tagged", "f").filter_tag(tag).initial_position(InitialPosition::Earliest).subscribe()
        };
        match subscribe("é".repeat(512) + "x").await {
            Err(magnetar_client::ClientError::Broker { code: magnetar_wire::ErrorCode::NotAllowed, .. }) => {}
            other => panic!("a 1,025-byte filter: {:?}", other.map(|_| ())),
        }
        let longest = "é".repeat(512);
        let consumer = subscribe(longest.clone()).await.expect("a 1,024-byte filter");
        consumer.close().await.expect("close");
        client.close();
        assert!(broker.terminate().success());

        let mut broker = broker.restart();
        let client = Client::connect(&broker.url()).await.expect("client");
        let producer = client.producer("tagged").create().await.expect("producer");
        producer.send(OutgoingMessage::new("other").with_tag("other")).await.expect("send");
        let id = producer.send(OutgoingMessage::new("mine").with_tag(longest.clone())).await.expect("send");
        // The record decodes (the filter in it is whole): only the matching
        // message comes.
        let consumer = client
            .subscribe("tagged", "f")
            .filter_tag(longest)
            .initial_position(InitialPosition::Earliest)
            .subscribe()
            .await
            .expect("subscribe after restart");
        let m = tokio::time::timeout(Duration::from_secs(10), consumer.receive()).await.expect("message").expect("ok");
        assert_eq!(m.id, id);
        client.close();
        assert!(!broker.log().contains("unreadable subscription state"), "{}", broker.log_tail());
        assert!(broker.terminate().success());
    });
}

/// An ack refused at its second id keeps what its first id did, and
/// accounts for it: the entry leaves the consumer's unacked ones and the
/// cursor is persisted (so a `kill -9` does not bring it back).
#[test]
fn an_ack_refused_midway_keeps_and_persists_what_it_applied() {
    run_async_with_timeout(Duration::from_secs(120), || async move {
        let dir = test_dir("hostile-midway");
        let mut broker = BrokerProcess::start(dir.path(), 1);
        let (url, addr) = (broker.url(), broker.addr());
        let (c, ids) = tokio::task::spawn_blocking(move || {
            let mut c = RawConnection::connect(addr);
            c.handshake();
            c.open_producer(1, "midway", "midway");
            for (seq, n) in [(0u64, 1u32), (1, 1), (2, 4)] {
                c.send_receipted(1, seq, n, &blob(seq, n));
            }
            subscribe(&mut c, "midway", "s", SubscriptionType::Exclusive, 5);
            let ids: Vec<MessageId> = receive(&mut c, 3, 5).into_iter().map(|(id, _)| id).collect();
            // Entry 0 whole, then index 9 of a batch of 4: refused.
            match ack(&mut c, 5, AckType::Individual, vec![ids[0], in_batch(ids[2], 9)], vec![0, 4], 1) {
                Command::Error { .. } => {}
                other => panic!("an ack with an index past its batch answered with {other:?}"),
            }
            (c, ids)
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        let client = Client::connect(&url).await.expect("client");
        let stats: serde_json::Value =
            serde_json::from_str(&client.topic_stats("midway").await.expect("stats")).unwrap();
        assert_eq!(stats["subscriptions"]["s"]["unacked"], 2, "{stats}");
        assert_eq!(stats["subscriptions"]["s"]["consumers"][0]["unacked"], 2, "{stats}");
        client.close();
        // Several persist intervals, then a crash.
        tokio::time::sleep(Duration::from_millis(600)).await;
        broker.kill9();
        drop(c);
        let mut broker = broker.restart();
        let addr = broker.addr();
        tokio::task::spawn_blocking(move || {
            let mut c = RawConnection::connect(addr);
            c.handshake();
            subscribe(&mut c, "midway", "s", SubscriptionType::Exclusive, 6);
            let back: Vec<MessageId> = receive(&mut c, 2, 6).into_iter().map(|(id, _)| id).collect();
            assert_eq!(back, ids[1..].to_vec(), "entry 0 was acked");
            if let Some(f) = c.try_next(Duration::from_millis(300), "quiet") {
                panic!("more came back: {:?}", f.command);
            }
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        assert!(broker.terminate().success());
    });
}

/// A cumulative batch-index ack with an index past its batch is refused
/// before it moves anything (it used to move the floor, leaving the entries
/// below it counted as unacked).
#[test]
fn a_refused_cumulative_index_ack_changes_nothing() {
    run_async_with_timeout(Duration::from_secs(120), || async move {
        let dir = test_dir("hostile-cumulative");
        let mut broker = BrokerProcess::start(dir.path(), 1);
        let (url, addr) = (broker.url(), broker.addr());
        let c = tokio::task::spawn_blocking(move || {
            let mut c = RawConnection::connect(addr);
            c.handshake();
            c.open_producer(1, "cumulative", "cumulative");
            for (seq, n) in [(0u64, 1u32), (1, 4)] {
                c.send_receipted(1, seq, n, &blob(seq, n));
            }
            subscribe(&mut c, "cumulative", "s", SubscriptionType::Exclusive, 5);
            let ids: Vec<MessageId> = receive(&mut c, 2, 5).into_iter().map(|(id, _)| id).collect();
            match ack(&mut c, 5, AckType::Cumulative, vec![in_batch(ids[1], 4)], vec![4], 1) {
                Command::Error { .. } => {}
                other => panic!("a cumulative ack past its batch answered with {other:?}"),
            }
            c
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));
        let client = Client::connect(&url).await.expect("client");
        let stats: serde_json::Value =
            serde_json::from_str(&client.topic_stats("cumulative").await.expect("stats")).unwrap();
        let s = &stats["subscriptions"]["s"];
        assert_eq!((s["ack_floor"].as_u64(), s["unacked"].as_u64()), (Some(0), Some(2)), "{stats}");
        client.close();
        drop(c);
        assert!(broker.terminate().success());
    });
}
