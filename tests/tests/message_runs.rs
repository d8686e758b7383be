//! Goal: a client that announces protocol version 2 gets consecutive
//! entries in `MessageRun` frames, within the frame limit it announced and
//! within its permits; a version-1 client gets the same entries, one
//! `Message` frame each; the SDK (version 2) reads runs; entries taken back
//! from a consumer come again in runs with their redelivery count.
//!
//! Method: a 2-shard broker process, a topic owned by each shard (so runs
//! travel between shards too), 200 unbatched messages each; raw connections
//! of each version read the same subscription's worth of entries and the
//! (id, blob) sequences are compared.

use bytes::Bytes;
use magnetar_client::{Client, InitialPosition, OutgoingMessage};
use magnetar_tests::consume::receive;
use magnetar_tests::{run_async_with_timeout, test_dir, topics_per_shard, BrokerProcess, RawConnection};
use magnetar_wire::{run_entries, Command, MessageId, SubscriptionType};
use std::net::SocketAddr;
use std::time::Duration;

const SHARDS: u32 = 2;
const MESSAGES: usize = 200;
/// The frame limit the small version-2 client announces: ~17 entries a run.
const SMALL_FRAME: u32 = 4096;

fn payload(i: usize) -> Vec<u8> {
    let mut p = format!("m{i}-").into_bytes();
    p.resize(200, b'.');
    p
}

/// What one raw connection received.
struct Received {
    entries: Vec<(MessageId, u32, Bytes)>,
    message_frames: usize,
    run_frames: usize,
    longest_run: usize,
}

/// Subscribes consumer 5, Exclusive. Until the broker has noticed that an
/// earlier connection holding the subscription dropped, it answers
/// `ConsumerBusy`: tried again for up to 10 s.
fn subscribe(c: &mut RawConnection, topic: &str, sub: &str, what: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    loop {
        match c.subscribe(1, 5, topic, sub, SubscriptionType::Exclusive) {
            Command::Success { request_id: 1 } => return,
            Command::Error { code: magnetar_wire::ErrorCode::ConsumerBusy, .. }
                if std::time::Instant::now() < deadline =>
            {
                std::thread::sleep(Duration::from_millis(50))
            }
            other => panic!("{what}: subscribe answered with {other:?}"),
        }
    }
}

/// Reads frames until `count` entries have come; then nothing more may come.
fn read_entries(c: &mut RawConnection, count: usize, what: &str) -> Received {
    let mut r = Received { entries: Vec::new(), message_frames: 0, run_frames: 0, longest_run: 0 };
    while r.entries.len() < count {
        let f = c.next(what);
        match f.command {
            Command::Message { consumer_id: 5, message_id, redelivery_count, ack_set } => {
                assert!(ack_set.is_empty(), "{what}: unbatched entries carry no ack set");
                r.message_frames += 1;
                r.entries.push((message_id, redelivery_count, f.payload));
            }
            Command::MessageRun { consumer_id: 5, message_id, redelivery_count, lengths } => {
                r.run_frames += 1;
                r.longest_run = r.longest_run.max(lengths.len());
                let entries = run_entries(message_id, &lengths, &f.payload).expect("the decoder checked the run");
                r.entries.extend(entries.map(|(id, blob)| (id, redelivery_count, blob)));
            }
            Command::Ping => c.send(&Command::Pong, &[]),
            other => panic!("{what}: expected deliveries, got {other:?}"),
        }
    }
    assert_eq!(r.entries.len(), count, "{what}: more entries than asked for");
    if let Some(f) = c.try_next(Duration::from_millis(300), what) {
        panic!("{what}: a frame beyond {count} entries: {:?}", f.command);
    }
    r
}

fn connect(addr: SocketAddr, version: u32, max_frame: u32) -> RawConnection {
    let mut c = RawConnection::connect(addr);
    c.handshake_as(version, max_frame);
    c
}

#[test]
fn version_two_clients_get_runs_and_version_one_clients_single_frames() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("message-runs");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let addr = broker.addr();
        let client = Client::connect(&url).await.expect("connect");
        let topics = topics_per_shard("runs", SHARDS, 1);
        let mut all_ids = Vec::new();
        for (topic, _) in &topics {
            let producer = client.producer(topic.as_str()).name("p").create().await.expect("producer");
            let mut ids = Vec::new();
            for i in 0..MESSAGES {
                ids.push(producer.send(OutgoingMessage::new(payload(i))).await.expect("send"));
            }
            all_ids.push(ids);
        }

        let raw_topics = topics.clone();
        let raw_ids = all_ids.clone();
        tokio::task::spawn_blocking(move || {
            for ((topic, owner), ids) in raw_topics.iter().zip(&raw_ids) {
                let what = |who: &str| format!("{topic} (owner shard {owner}), {who}");
                let flow =
                    |c: &mut RawConnection, permits: u32| c.send(&Command::Flow { consumer_id: 5, permits }, &[]);

                // Version 1: one Message frame per entry.
                let mut v1 = connect(addr, 1, 0);
                subscribe(&mut v1, topic, "v1", &what("v1"));
                flow(&mut v1, 1000);
                let one = read_entries(&mut v1, MESSAGES, &what("v1"));
                assert_eq!(one.run_frames, 0, "{}: a version-1 client got a run", what("v1"));
                assert_eq!(one.message_frames, MESSAGES);
                let got_ids: Vec<MessageId> = one.entries.iter().map(|(id, _, _)| *id).collect();
                assert_eq!(&got_ids, ids, "{}: dispatch order", what("v1"));
                for (i, (_, rc, blob)) in one.entries.iter().enumerate() {
                    assert_eq!(*rc, 0);
                    let (meta, p) = magnetar_wire::decode_message(blob).expect("blob");
                    assert_eq!(meta.sequence_id, i as u64);
                    assert_eq!(p.as_ref(), &payload(i)[..]);
                }

                // Version 2 with a small frame limit (the decoder refuses
                // anything larger), and with the default one: the same
                // entries, in runs.
                for (sub, max_frame) in [("v2-small", SMALL_FRAME), ("v2", 0)] {
                    let w = what(sub);
                    let mut v2 = connect(addr, 2, max_frame);
                    subscribe(&mut v2, topic, sub, &w);
                    flow(&mut v2, 1000);
                    let two = read_entries(&mut v2, MESSAGES, &w);
                    assert!(two.run_frames > 0 && two.longest_run > 1, "{w}: no run arrived");
                    assert_eq!(two.entries, one.entries, "{w}: not the entries a version-1 client got");
                    if max_frame == SMALL_FRAME {
                        // 200-odd-byte entries: the limit splits the runs.
                        assert!(two.run_frames >= MESSAGES * 200 / SMALL_FRAME as usize, "{w}: runs not split");
                    }
                }

                // Permits bound runs: 7 permits, 7 entries.
                let w = what("v2 permits");
                let mut v2 = connect(addr, 2, 0);
                subscribe(&mut v2, topic, "v2-permits", &w);
                flow(&mut v2, 7);
                let first = read_entries(&mut v2, 7, &w);
                flow(&mut v2, 1000);
                let rest = read_entries(&mut v2, MESSAGES - 7, &w);
                let both: Vec<_> = first.entries.into_iter().chain(rest.entries).collect();
                assert_eq!(both, one.entries, "{w}");

                // Taken back (the connection drops unacknowledged): they
                // come again, in runs, with their redelivery count.
                drop(v2);
                let w = what("v2 redelivered");
                let mut again = connect(addr, 2, 0);
                subscribe(&mut again, topic, "v2-permits", &w);
                flow(&mut again, 1000);
                let redelivered = read_entries(&mut again, MESSAGES, &w);
                assert!(redelivered.run_frames > 0, "{w}: no run");
                for ((id, rc, blob), (want_id, _, want_blob)) in redelivered.entries.iter().zip(&one.entries) {
                    assert_eq!((id, blob), (want_id, want_blob), "{w}");
                    assert_eq!(*rc, 1, "{w}: redelivery count of {id}");
                }
            }
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));

        // The SDK speaks version 2: it reads runs into messages.
        for ((topic, _), ids) in topics.iter().zip(&all_ids) {
            let consumer = client
                .subscribe(topic.as_str(), "sdk")
                .initial_position(InitialPosition::Earliest)
                .subscribe()
                .await
                .expect("subscribe");
            for (i, id) in ids.iter().enumerate() {
                let m = receive(&consumer, topic).await;
                assert_eq!(m.id(), *id, "{topic}: SDK order");
                assert_eq!(m.payload().as_ref(), &payload(i)[..]);
                consumer.ack(&m.id()).await.expect("ack");
            }
        }
        drop(broker);
    });
}
