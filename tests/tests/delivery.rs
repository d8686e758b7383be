//! Goal: the consumption model of issue #4 holds with real broker processes:
//! Failover takeover order, Shared exactly-once across consumers, Key_Shared
//! per-key order across a join and a leave, cumulative acks, negative acks
//! with a growing redelivery count, dead letters, the ack timeout, delayed
//! delivery, tag filters and the unacked bound of a stalled consumer; where
//! it makes sense, also across a `kill -9` of the broker.
//!
//! Method: a 2-shard broker process; the topic is owned by one shard and the
//! consumers sit on connections of both shards, so dispatch crosses the mesh.
//! The CLI is used where the issue fixes its flags (nack, DLQ, delay, tags).

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{
    AckType, Client, ClientError, Consumer, ErrorCode, InitialPosition, Message, MessageId, OutgoingMessage,
    SubscriptionType,
};
use magnetar_tests::consume::{assert_quiet, receive, RECEIVE_TIMEOUT};
use magnetar_tests::{
    connect_on_shard, run_async_with_timeout, test_dir, topics_per_shard, BrokerOptions, BrokerProcess, ConsumeCmd,
    ProduceCmd,
};
use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::{Arc, Mutex};
use std::time::Duration;

const SHARDS: u32 = 2;

async fn consumer(
    client: &Client,
    topic: &str,
    sub: &str,
    sub_type: SubscriptionType,
    name: &str,
    priority: i32,
    queue: u32,
) -> Consumer {
    client
        .subscribe(topic, sub)
        .sub_type(sub_type)
        .consumer_name(name)
        .priority_level(priority)
        .receiver_queue_size(queue)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap_or_else(|e| panic!("subscribe {name}: {e}"))
}

async fn produce(client: &Client, topic: &str, n: usize, key: impl Fn(usize) -> Option<String>) -> Vec<MessageId> {
    let producer = client.producer(topic).create().await.expect("producer");
    let mut ids = Vec::new();
    for i in 0..n {
        let mut m = OutgoingMessage::new(format!("m{i}"));
        m.key = key(i);
        ids.push(producer.send(m).await.expect("send"));
    }
    producer.close().await.expect("close producer");
    ids
}

async fn wait_until(what: &str, f: impl Fn() -> bool) {
    let deadline = tokio::time::Instant::now() + RECEIVE_TIMEOUT;
    while !f() {
        assert!(tokio::time::Instant::now() < deadline, "{what}: not within {RECEIVE_TIMEOUT:?}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Failover: the active consumer is the lowest priority level, then the
/// first name; consumers are told; on close the next takes over and gets the
/// unacknowledged messages again; after a kill -9 the confirmed acks hold.
#[test]
fn failover_takeover_follows_priority_then_name() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("failover");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, owner) = topics_per_shard("failover", SHARDS, 1).remove(0);
        let url = broker.url();
        let a = connect_on_shard(&url, owner, 64).await;
        let b = connect_on_shard(&url, (owner + 1) % SHARDS, 64).await;
        let ft = SubscriptionType::Failover;
        let c_low = consumer(&a, &topic, "fo", ft, "a-low", 1, 100).await;
        let c_b = consumer(&b, &topic, "fo", ft, "b", 0, 100).await;
        let c_c = consumer(&a, &topic, "fo", ft, "c", 0, 100).await;
        wait_until("b becomes active", || c_b.is_active() && !c_c.is_active() && !c_low.is_active()).await;

        let ids = produce(&a, &topic, 6, |_| None).await;
        for id in &ids {
            assert_eq!(receive(&c_b, "active b").await.id, *id);
        }
        assert_quiet(&c_c, Duration::from_millis(300), "standby c").await;
        assert_quiet(&c_low, Duration::from_millis(100), "standby a-low").await;
        c_b.ack_confirmed(AckType::Cumulative, &[ids[1]]).await.expect("cumulative ack on failover");

        // b leaves: c (same level, next name) takes over and gets 2.. again.
        c_b.close().await.expect("close b");
        wait_until("c becomes active", || c_c.is_active()).await;
        for id in &ids[2..] {
            let m = receive(&c_c, "c after takeover").await;
            assert_eq!(m.id, *id);
            assert_eq!(m.redelivery_count(), 1, "redelivery count after takeover");
        }
        c_c.ack_confirmed(AckType::Individual, &[ids[2]]).await.expect("ack");

        // kill -9: confirmed acks survive; the lowest-priority consumer,
        // alone now, gets every other message again.
        broker.kill9();
        let broker = broker.restart();
        let url = broker.url();
        let a = Client::connect(&url).await.expect("connect after restart");
        let c_low = consumer(&a, &topic, "fo", ft, "a-low", 1, 100).await;
        for id in &ids[3..] {
            assert_eq!(receive(&c_low, "a-low after kill -9").await.id, *id);
        }
        assert_quiet(&c_low, Duration::from_millis(300), "a-low after kill -9").await;
        wait_until("a-low is active", || c_low.is_active()).await;
    });
}

/// Shared: 3 consumers get every message exactly once while nobody leaves;
/// the unacknowledged messages of a consumer that closes go to the others;
/// cumulative acks are refused.
#[test]
fn shared_delivers_every_message_once_across_three_consumers() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("shared");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, owner) = topics_per_shard("shared", SHARDS, 1).remove(0);
        let url = broker.url();
        let a = connect_on_shard(&url, owner, 64).await;
        let b = connect_on_shard(&url, (owner + 1) % SHARDS, 64).await;
        let st = SubscriptionType::Shared;
        let consumers =
            [consumer(&a, &topic, "sh", st, "x", 0, 5).await, consumer(&b, &topic, "sh", st, "y", 0, 5).await];
        let leaver = consumer(&b, &topic, "sh", st, "z", 0, 5).await;
        let n = 150;
        let ids = produce(&a, &topic, n, |_| None).await;

        // The leaver takes a few and never acks them; then it closes.
        let mut held = Vec::new();
        for _ in 0..3 {
            let m = receive(&leaver, "leaver").await;
            assert_eq!(m.redelivery_count(), 0);
            held.push(m.id);
        }
        let refused = leaver.ack_confirmed(AckType::Cumulative, &[held[0]]).await;
        assert!(
            matches!(refused, Err(ClientError::Broker { code: ErrorCode::NotAllowed, .. })),
            "cumulative ack on Shared: {refused:?}"
        );
        leaver.close().await.expect("close leaver");

        let mut got: BTreeMap<MessageId, u32> = BTreeMap::new();
        let mut redelivered = 0;
        let mut per_consumer = [0usize; 2];
        while got.len() < n {
            let mut progressed = false;
            for (i, c) in consumers.iter().enumerate() {
                if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(50), c.receive()).await {
                    progressed = true;
                    per_consumer[i] += 1;
                    // The leaver held its 3 plus what sat in its receive
                    // queue: those come again, counted.
                    if held.contains(&m.id) {
                        assert_eq!(m.redelivery_count(), 1, "redelivery count of {}", m.id);
                    }
                    assert!(m.redelivery_count() <= 1, "redelivery count of {}", m.id);
                    redelivered += m.redelivery_count();
                    assert!(got.insert(m.id, m.redelivery_count()).is_none(), "{} delivered twice", m.id);
                    c.ack(&m.id).await.expect("ack");
                }
            }
            if !progressed {
                panic!("stalled after {} of {n} messages: {per_consumer:?}", got.len());
            }
        }
        assert_eq!(got.keys().copied().collect::<Vec<_>>(), ids, "every message, once");
        assert!(per_consumer.iter().all(|&k| k > 10), "round robin spreads messages: {per_consumer:?}");
        // At most what the leaver was granted: 5 permits, plus 2 more it
        // granted after receiving 2 (half its queue).
        assert!((3..=7).contains(&redelivered), "only the leaver's messages come again: {redelivered}");
        for c in &consumers {
            assert_quiet(c, Duration::from_millis(300), "after everything was acked").await;
        }
    });
}

#[derive(Debug, Clone)]
struct Event {
    consumer: &'static str,
    key: String,
    seq: usize,
    acked: bool,
}

/// Receives until `stop`, recording every message in `log` (in receive
/// order across consumers) and acking it unless `ack` says no.
fn spawn_recorder(
    c: Arc<Consumer>,
    name: &'static str,
    log: Arc<Mutex<Vec<Event>>>,
    ack: Arc<std::sync::atomic::AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(1500), c.receive()).await {
            let seq: usize = std::str::from_utf8(&m.payload).unwrap()[1..].parse().unwrap();
            let acked = ack.load(std::sync::atomic::Ordering::SeqCst);
            log.lock().unwrap().push(Event { consumer: name, key: m.key().unwrap().to_string(), seq, acked });
            if acked {
                c.ack(&m.id).await.expect("ack");
            }
        }
    })
}

/// Key_Shared: a key stays with one consumer while the set is stable, and
/// the acknowledged deliveries of each key come in publish order across a
/// consumer joining and another leaving with unacknowledged messages.
#[test]
fn key_shared_keeps_per_key_order_across_join_and_leave() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("key-shared");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, owner) = topics_per_shard("keyshared", SHARDS, 1).remove(0);
        let url = broker.url();
        let a = connect_on_shard(&url, owner, 64).await;
        let b = connect_on_shard(&url, (owner + 1) % SHARDS, 64).await;
        let kt = SubscriptionType::KeyShared;
        let keys = 16;
        let key = move |i: usize| Some(format!("k{}", i % keys));
        let log = Arc::new(Mutex::new(Vec::new()));
        let yes = || Arc::new(std::sync::atomic::AtomicBool::new(true));

        let first = Arc::new(consumer(&a, &topic, "ks", kt, "first", 0, 20).await);
        let first_acks = yes();
        let t1 = spawn_recorder(first.clone(), "first", log.clone(), first_acks.clone());
        let producer = a.producer(topic.as_str()).create().await.expect("producer");
        let mut seq = 0;
        let mut send = |count: usize| {
            let start = seq;
            seq += count;
            let producer = &producer;
            async move {
                for i in start..start + count {
                    let mut m = OutgoingMessage::new(format!("m{i}"));
                    m.key = key(i);
                    producer.send(m).await.expect("send");
                }
            }
        };
        send(100).await;
        // A second consumer joins while the first is busy.
        let second = Arc::new(consumer(&b, &topic, "ks", kt, "second", 0, 20).await);
        let t2 = spawn_recorder(second.clone(), "second", log.clone(), yes());
        send(100).await;
        // The first stops acking, receives some more, then leaves.
        first_acks.store(false, std::sync::atomic::Ordering::SeqCst);
        send(100).await;
        tokio::time::sleep(Duration::from_millis(300)).await;
        let closed_at = log.lock().unwrap().len();
        first.close().await.expect("close first");
        send(100).await;
        t1.await.unwrap();
        t2.await.unwrap();
        let total = seq;

        let log = log.lock().unwrap().clone();
        let mut per_key: HashMap<String, Vec<usize>> = HashMap::new();
        for e in log.iter().filter(|e| e.acked) {
            per_key.entry(e.key.clone()).or_default().push(e.seq);
        }
        let mut all = BTreeSet::new();
        for (k, seqs) in &per_key {
            assert!(seqs.windows(2).all(|w| w[0] < w[1]), "key {k}: acked deliveries out of order: {seqs:?}");
            all.extend(seqs.iter().copied());
        }
        assert_eq!(all.len(), total, "every message acknowledged exactly once");
        assert!(log.iter().any(|e| e.consumer == "second" && e.seq < 200), "the second consumer got keys");
        // Stickiness: after the join and before the first left, each key
        // went to one consumer.
        let mut owner_of: HashMap<&str, &str> = HashMap::new();
        for e in log[..closed_at].iter().filter(|e| e.seq >= 100) {
            let o = owner_of.entry(e.key.as_str()).or_insert(e.consumer);
            assert_eq!(*o, e.consumer, "key {} moved between consumers while both were attached", e.key);
        }
    });
}

/// Cumulative ack, then a new consumer: nothing old comes back, also after
/// a kill -9 (the ack was confirmed, so it is durable).
#[test]
fn cumulative_ack_then_reconnect_gets_nothing_old() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("cumulative");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, _) = topics_per_shard("cumulative", SHARDS, 1).remove(0);
        let client = Client::connect(&broker.url()).await.expect("connect");
        let ids = produce(&client, &topic, 10, |_| None).await;
        let c = consumer(&client, &topic, "cu", SubscriptionType::Exclusive, "c", 0, 100).await;
        for id in &ids {
            assert_eq!(receive(&c, "first").await.id, *id);
        }
        c.ack_confirmed(AckType::Cumulative, &[ids[6]]).await.expect("cumulative ack");
        c.close().await.expect("close");
        let c = consumer(&client, &topic, "cu", SubscriptionType::Exclusive, "c", 0, 100).await;
        for id in &ids[7..] {
            assert_eq!(receive(&c, "after reconnect").await.id, *id);
        }
        c.ack_confirmed(AckType::Cumulative, &[ids[9]]).await.expect("cumulative ack");
        assert_quiet(&c, Duration::from_millis(300), "after reconnect").await;
        broker.kill9();
        let broker = broker.restart();
        let client = Client::connect(&broker.url()).await.expect("connect");
        let c = consumer(&client, &topic, "cu", SubscriptionType::Exclusive, "c", 0, 100).await;
        assert_quiet(&c, Duration::from_millis(500), "after kill -9").await;
    });
}

/// `--nack-every 1`: every message comes back with a growing redelivery
/// count, no sooner than the (doubling) delay; with
/// `--dlq-max-redeliveries 2` it then goes to `<topic>-<sub>-DLQ` with its
/// origin as properties.
#[test]
fn nack_redelivers_with_growing_count_then_dead_letters() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("nack");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let (topic, _) = topics_per_shard("nack", SHARDS, 1).remove(0);
        let receipts = ProduceCmd::new(&url, &topic, "p", 3, 16).run(Duration::from_secs(30));
        let mut cmd = ConsumeCmd::new(&url, &topic, "nk");
        cmd.idle_timeout_s = 2.0;
        cmd.extra_args =
            ["--type", "shared", "--nack-every", "1", "--nack-delay-ms", "100", "--dlq-max-redeliveries", "2"]
                .map(String::from)
                .to_vec();
        let got = cmd.run(Duration::from_secs(30));
        for r in &receipts {
            let mine: Vec<_> = got.iter().filter(|m| m.id == r.id).collect();
            let counts: Vec<u64> = mine.iter().map(|m| m.redelivery_count).collect();
            assert_eq!(counts, vec![0, 1, 2], "deliveries of {}", r.id);
            for w in mine.windows(2) {
                let gap = w[1].receive_time_ms - w[0].receive_time_ms;
                let min = 100 << w[0].redelivery_count;
                assert!(gap + 15 >= min, "{}: came back after {gap} ms, backoff is {min} ms", r.id);
            }
        }
        let mut dlq = ConsumeCmd::new(&url, &format!("{topic}-nk-DLQ"), "d");
        dlq.count = 3;
        let dead = dlq.run(Duration::from_secs(30));
        let origins: BTreeSet<String> = dead
            .iter()
            .map(|m| {
                let p: HashMap<_, _> = m.properties.iter().cloned().collect();
                assert_eq!(
                    p.get("REAL_TOPIC").map(String::as_str),
                    Some(format!("persistent://public/default/{topic}").as_str())
                );
                p.get("ORIGIN_MESSAGE_ID").cloned().expect("ORIGIN_MESSAGE_ID")
            })
            .collect();
        let sent: BTreeSet<String> = receipts.iter().map(|r| r.id.to_string()).collect();
        assert_eq!(origins, sent, "every message dead-lettered once");
        // They were acked on the original subscription: nothing comes again.
        let mut again = ConsumeCmd::new(&url, &topic, "nk");
        again.idle_timeout_s = 1.0;
        again.extra_args = vec!["--type".into(), "shared".into()];
        assert!(again.run(Duration::from_secs(30)).is_empty(), "dead-lettered messages came back");
    });
}

/// Ack timeout (client timing wheel): an unacknowledged message comes back.
#[test]
fn ack_timeout_redelivers_unacked_messages() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("ack-timeout");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, _) = topics_per_shard("acktimeout", SHARDS, 1).remove(0);
        let client = Client::connect(&broker.url()).await.expect("connect");
        let ids = produce(&client, &topic, 2, |_| None).await;
        let c = client
            .subscribe(topic.as_str(), "at")
            .initial_position(InitialPosition::Earliest)
            .ack_timeout(Duration::from_millis(300))
            .subscribe()
            .await
            .expect("subscribe");
        let first = receive(&c, "first").await;
        let started = std::time::Instant::now();
        let second = receive(&c, "second").await;
        c.ack(&second.id).await.expect("ack");
        assert_eq!((first.id, second.id), (ids[0], ids[1]));
        let again = receive(&c, "after the ack timeout").await;
        assert_eq!((again.id, again.redelivery_count()), (ids[0], 1));
        assert!(started.elapsed() >= Duration::from_millis(250), "came back after {:?}", started.elapsed());
        c.ack(&again.id).await.expect("ack");
        assert_quiet(&c, Duration::from_millis(600), "acked").await;
    });
}

/// Delayed delivery: never before its time, on time, and not lost across
/// a kill -9 right after the send.
#[test]
fn delayed_messages_are_never_early_and_survive_kill9() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("delayed");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let (topic, _) = topics_per_shard("delayed", SHARDS, 1).remove(0);
        let delay_ms = 1500u64;
        let mut delayed = ProduceCmd::new(&url, &topic, "late", 5, 16);
        delayed.extra_args = vec!["--deliver-after-ms".into(), delay_ms.to_string()];
        let late = delayed.run(Duration::from_secs(30));
        let now = ProduceCmd::new(&url, &topic, "now", 5, 16).run(Duration::from_secs(30));
        let mut cmd = ConsumeCmd::new(&url, &topic, "dl");
        cmd.count = 10;
        cmd.extra_args = vec!["--type".into(), "shared".into()];
        let got = cmd.run(Duration::from_secs(30));
        let by_id: HashMap<MessageId, &magnetar_tests::Received> = got.iter().map(|m| (m.id, m)).collect();
        for r in &now {
            assert!(by_id.contains_key(&r.id), "undelayed {} missing", r.id);
        }
        for r in &late {
            let m = by_id.get(&r.id).unwrap_or_else(|| panic!("delayed {} missing", r.id));
            // The client fixes deliver_at when the message is made, a moment
            // before it stamps the publish time: "never early" is against
            // deliver_at, "on time" against the publish time.
            let at = m.deliver_at_ms.unwrap_or_else(|| panic!("delayed {} has no deliver_at_ms", r.id));
            assert!(at >= m.publish_time_ms + delay_ms - 1000, "{} deliver_at {at} far before its delay", r.id);
            assert!(
                m.receive_time_ms >= at,
                "{} delivered at {} ms, before its deliver_at {at}",
                r.id,
                m.receive_time_ms
            );
            let waited = m.receive_time_ms - m.publish_time_ms;
            assert!(waited < delay_ms + 1000, "{} delivered {waited} ms after publish: late", r.id);
        }

        // Across kill -9: sent, broker killed at once, restarted.
        let mut delayed = ProduceCmd::new(&url, &topic, "crash", 5, 16);
        delayed.extra_args = vec!["--deliver-after-ms".into(), delay_ms.to_string()];
        let crash = delayed.run(Duration::from_secs(30));
        broker.kill9();
        let broker = broker.restart();
        let mut cmd = ConsumeCmd::new(&broker.url(), &topic, "dl");
        cmd.idle_timeout_s = 2.5;
        cmd.extra_args = vec!["--type".into(), "shared".into()];
        let got = cmd.run(Duration::from_secs(30));
        let ids: BTreeSet<MessageId> = got.iter().map(|m| m.id).collect();
        // Acks of the last persist interval before the kill may be lost, so
        // earlier messages may come again (at-least-once); the delayed ones
        // sent just before the kill must all come.
        for r in &crash {
            assert!(ids.contains(&r.id), "delayed {} lost across kill -9; got {ids:?}", r.id);
        }
        for m in &got {
            if let Some(at) = m.deliver_at_ms {
                assert!(m.receive_time_ms >= at, "{} early after restart", m.id);
            }
        }
    });
}

/// Tag filter: only matching messages are delivered; the others count as
/// acknowledged for the subscription.
#[test]
fn a_tag_filter_delivers_only_its_tag() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("tags");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let (topic, _) = topics_per_shard("tags", SHARDS, 1).remove(0);
        let mut a = ProduceCmd::new(&url, &topic, "a", 4, 16);
        a.extra_args = vec!["--tag".into(), "red".into()];
        let mut b = ProduceCmd::new(&url, &topic, "b", 4, 16);
        b.extra_args = vec!["--tag".into(), "blue".into()];
        let blue = b.run(Duration::from_secs(30));
        let red = a.run(Duration::from_secs(30));
        let mut cmd = ConsumeCmd::new(&url, &topic, "f");
        cmd.idle_timeout_s = 1.0;
        cmd.extra_args = vec!["--filter-tag".into(), "red".into()];
        let got: Vec<MessageId> = cmd.run(Duration::from_secs(30)).iter().map(|m| m.id).collect();
        assert_eq!(got, red.iter().map(|r| r.id).collect::<Vec<_>>());
        assert!(blue.iter().all(|r| !got.contains(&r.id)));
    });
}

/// A consumer that never acks stops receiving at its unacked bound, however
/// many permits it grants; acks let dispatch go on.
#[test]
fn a_stalled_consumer_stops_at_its_unacked_bound() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("stalled");
        let mut options = BrokerOptions::new(SHARDS);
        options.extra_args = vec!["--unacked-per-consumer-max".into(), "50".into()];
        let broker = BrokerProcess::start_with(dir.path(), &options);
        let (topic, _) = topics_per_shard("stalled", SHARDS, 1).remove(0);
        let client = Client::connect(&broker.url()).await.expect("connect");
        produce(&client, &topic, 200, |_| None).await;
        let c = consumer(&client, &topic, "st", SubscriptionType::Shared, "c", 0, 1000).await;
        let mut got = Vec::new();
        for _ in 0..50 {
            got.push(receive(&c, "below the bound").await.id);
        }
        assert_quiet(&c, Duration::from_millis(500), "at the bound").await;
        for id in &got[..10] {
            c.ack(id).await.expect("ack");
        }
        for _ in 0..10 {
            receive(&c, "after acks").await;
        }
        assert_quiet(&c, Duration::from_millis(300), "at the bound again").await;
    });
}

/// Key_Shared, the join rule itself: a consumer that joins gets nothing of
/// the keys it takes over until the messages sent before it joined are
/// acknowledged, then gets them in order.
#[test]
fn key_shared_newcomer_waits_for_older_messages_to_be_acked() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("key-shared-join");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, owner) = topics_per_shard("ksjoin", SHARDS, 1).remove(0);
        let url = broker.url();
        let a = connect_on_shard(&url, owner, 64).await;
        let b = connect_on_shard(&url, (owner + 1) % SHARDS, 64).await;
        let kt = SubscriptionType::KeyShared;
        let keys = 16;
        let first = consumer(&a, &topic, "ks", kt, "first", 0, 100).await;
        let old = produce(&a, &topic, keys, |i| Some(format!("k{i}"))).await;
        let mut held = Vec::new();
        for _ in 0..keys {
            held.push(receive(&first, "first, before the join").await);
        }
        let second = consumer(&b, &topic, "ks", kt, "second", 0, 100).await;
        let new = produce(&a, &topic, keys, |i| Some(format!("k{i}"))).await;
        // The first still gets new messages of the keys it kept.
        let mut kept = BTreeSet::new();
        while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), first.receive()).await {
            assert!(new.contains(&m.id), "first got {} again", m.id);
            kept.insert(m.key().unwrap().to_string());
        }
        assert!(kept.len() < keys, "the second consumer took no keys");
        assert_quiet(&second, Duration::from_millis(300), "second, before the older messages are acked").await;
        for m in &held {
            first.ack(&m.id).await.expect("ack");
        }
        let mut moved = Vec::new();
        for _ in 0..keys - kept.len() {
            let m = receive(&second, "second, after the acks").await;
            assert!(!kept.contains(m.key().unwrap()), "key {} went to both", m.key().unwrap());
            moved.push(m.id);
        }
        assert!(moved.windows(2).all(|w| w[0] < w[1]), "in log order: {moved:?}");
        assert_eq!(old.len(), keys);
    });
}

/// Shared across a kill -9: what was acked with confirmation never comes
/// again; everything else comes again, each message to one consumer.
#[test]
fn shared_after_kill9_redelivers_only_unconfirmed_messages() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("shared-kill");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, owner) = topics_per_shard("sharedkill", SHARDS, 1).remove(0);
        let url = broker.url();
        let a = connect_on_shard(&url, owner, 64).await;
        let b = connect_on_shard(&url, (owner + 1) % SHARDS, 64).await;
        let st = SubscriptionType::Shared;
        let cs = [consumer(&a, &topic, "sk", st, "x", 0, 10).await, consumer(&b, &topic, "sk", st, "y", 0, 10).await];
        let ids = produce(&a, &topic, 60, |_| None).await;
        let mut confirmed = BTreeSet::new();
        let mut seen = BTreeSet::new();
        'outer: loop {
            for c in &cs {
                if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(50), c.receive()).await {
                    assert!(seen.insert(m.id), "{} delivered twice before the crash", m.id);
                    // Confirm every other one; leave the rest unacked.
                    if m.id.entry % 2 == 0 {
                        c.ack_confirmed(AckType::Individual, &[m.id]).await.expect("ack");
                        confirmed.insert(m.id);
                    }
                    if seen.len() == 30 {
                        break 'outer;
                    }
                }
            }
        }
        broker.kill9();
        let broker = broker.restart();
        let url = broker.url();
        let a = connect_on_shard(&url, owner, 64).await;
        let b = connect_on_shard(&url, (owner + 1) % SHARDS, 64).await;
        let cs = [consumer(&a, &topic, "sk", st, "x", 0, 10).await, consumer(&b, &topic, "sk", st, "y", 0, 10).await];
        let mut after = BTreeSet::new();
        let expected: BTreeSet<MessageId> = ids.iter().copied().filter(|id| !confirmed.contains(id)).collect();
        while after.len() < expected.len() {
            let mut progressed = false;
            for c in &cs {
                if let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(100), c.receive()).await {
                    progressed = true;
                    assert!(!confirmed.contains(&m.id), "confirmed ack of {} lost", m.id);
                    assert!(after.insert(m.id), "{} delivered twice after the restart", m.id);
                    c.ack(&m.id).await.expect("ack");
                }
            }
            assert!(progressed, "stalled after {} of {} messages", after.len(), expected.len());
        }
        assert_eq!(after, expected);
    });
}

/// Seek by message id and by publish time; and the admin stats command
/// reports the subscription's backlog, unacked and consumers.
#[test]
fn seek_and_subscription_stats() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("seek");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, owner) = topics_per_shard("seek", SHARDS, 1).remove(0);
        let url = broker.url();
        let client = connect_on_shard(&url, (owner + 1) % SHARDS, 64).await;
        let mut ids = Vec::new();
        let producer = client.producer(topic.as_str()).create().await.expect("producer");
        for i in 0..10 {
            ids.push(producer.send(OutgoingMessage::new(format!("m{i}"))).await.expect("send"));
            // Distinct publish times, so a time names one message.
            tokio::time::sleep(Duration::from_millis(3)).await;
        }
        let c = consumer(&client, &topic, "sk", SubscriptionType::Exclusive, "c", 0, 100).await;
        let mut publish = Vec::new();
        for id in &ids {
            let m = receive(&c, "first pass").await;
            assert_eq!(m.id, *id);
            publish.push(m.publish_time_ms());
        }
        c.ack_confirmed(AckType::Cumulative, &[ids[9]]).await.expect("ack all");
        c.seek(ids[3]).await.expect("seek by id");
        for id in &ids[3..] {
            assert_eq!(receive(&c, "after seek by id").await.id, *id);
        }
        assert_quiet(&c, Duration::from_millis(200), "after seek by id").await;
        let first = publish.iter().position(|&p| p >= publish[7]).unwrap();
        c.seek_by_time(publish[7]).await.expect("seek by time");
        for id in &ids[first..] {
            assert_eq!(receive(&c, "after seek by time").await.id, *id);
        }
        assert_quiet(&c, Duration::from_millis(200), "after seek by time").await;

        // Stats: 10 - first messages delivered and not acknowledged.
        let run = magnetar_tests::run_cli(
            ["admin", "subscriptions", "stats", topic.as_str(), "--url", url.as_str()],
            Duration::from_secs(30),
        );
        run.assert_success();
        let v: serde_json::Value = serde_json::from_str(&run.stdout_lines.join("\n")).expect("stats JSON");
        let s = &v["subscriptions"]["sk"];
        let outstanding = (10 - first) as u64;
        assert_eq!(s["type"], "Exclusive", "{v}");
        assert_eq!(s["unacked"].as_u64(), Some(outstanding), "{v}");
        assert_eq!(s["msg_backlog"].as_u64(), Some(outstanding), "{v}");
        assert_eq!(s["consumers"][0]["name"], "c", "{v}");
        assert_eq!(s["consumers"][0]["unacked"].as_u64(), Some(outstanding), "{v}");
        let missing = magnetar_tests::run_cli(
            ["admin", "subscriptions", "stats", "no-such-topic", "--url", url.as_str()],
            Duration::from_secs(30),
        );
        assert!(!missing.status.success() && missing.stderr.contains("TopicNotFound"), "{}", missing.stderr);
    });
}

/// `reconsume_later` with the retry topic enabled: the message comes back to
/// the same consumer after the delay (not before), counted, and once acked
/// it comes from neither topic again.
#[test]
fn reconsume_later_brings_a_message_back_through_the_retry_topic() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("retry");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, _) = topics_per_shard("retry", SHARDS, 1).remove(0);
        let client = Client::connect(&broker.url()).await.expect("connect");
        let ids = produce(&client, &topic, 2, |_| None).await;
        let c = client
            .subscribe(topic.as_str(), "rt")
            .sub_type(SubscriptionType::Shared)
            .initial_position(InitialPosition::Earliest)
            .retry_enabled(true)
            .subscribe()
            .await
            .expect("subscribe");
        let first = receive(&c, "first").await;
        let second = receive(&c, "second").await;
        assert_eq!((first.id, second.id), (ids[0], ids[1]));
        c.ack(&second.id).await.expect("ack");
        let sent = std::time::Instant::now();
        c.reconsume_later(&first, Duration::from_millis(700)).await.expect("reconsume later");
        let back = receive(&c, "from the retry topic").await;
        assert!(sent.elapsed() >= Duration::from_millis(650), "back after {:?}", sent.elapsed());
        assert_eq!(back.payload, first.payload);
        assert!(back.topic.ends_with(&format!("{topic}-rt-RETRY")), "{}", back.topic);
        assert_eq!(back.property("RECONSUMETIMES"), Some("1"));
        assert_eq!(back.property("ORIGIN_MESSAGE_ID"), Some(first.id.to_string().as_str()));
        c.ack_confirmed(AckType::Individual, &[back.id]).await.expect("ack on the retry topic");
        assert_quiet(&c, Duration::from_millis(500), "after acking").await;
        c.close().await.expect("close");
        let again = client
            .subscribe(topic.as_str(), "rt")
            .sub_type(SubscriptionType::Shared)
            .retry_enabled(true)
            .subscribe()
            .await
            .expect("subscribe again");
        assert_quiet(&again, Duration::from_millis(500), "after reconnect").await;
    });
}

/// SDK surface: `receive_batch`, `stream()`, `redeliver_unacknowledged`,
/// and the per-subscription unacked bound across two consumers. Also: a
/// Key_Shared newcomer is not held back by a delayed message not yet due.
#[test]
fn batch_stream_redeliver_and_the_subscription_bound() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        use futures::StreamExt;
        let dir = test_dir("sdk-surface");
        let mut options = BrokerOptions::new(SHARDS);
        options.extra_args = vec!["--unacked-per-subscription-max".into(), "30".into()];
        let broker = BrokerProcess::start_with(dir.path(), &options);
        let mut topics = topics_per_shard("surface", SHARDS, 1).into_iter().map(|(t, _)| t);
        let (topic, ks_topic) = (topics.next().unwrap(), topics.next().unwrap());
        let client = Client::connect(&broker.url()).await.expect("connect");
        let ids = produce(&client, &topic, 100, |_| None).await;
        let st = SubscriptionType::Shared;
        let x = consumer(&client, &topic, "b", st, "x", 0, 1000).await;
        let y = consumer(&client, &topic, "b", st, "y", 0, 1000).await;
        // 30 in all, however they split, then nothing until acks.
        let mut got = Vec::new();
        while got.len() < 30 {
            let batch = tokio::time::timeout(RECEIVE_TIMEOUT, x.receive_batch(100)).await;
            if let Ok(batch) = batch {
                got.extend(batch.expect("batch").into_iter().map(|m| m.id));
            }
            while let Some(m) = y.try_receive().expect("try_receive") {
                got.push(m.id);
            }
        }
        assert_eq!(got.len(), 30, "the subscription bound");
        assert_quiet(&x, Duration::from_millis(300), "x at the subscription bound").await;
        assert!(y.try_receive().expect("try_receive").is_none(), "y at the subscription bound");
        // Redeliver everything x holds: it comes again, counted.
        y.close().await.expect("close y");
        x.redeliver_unacknowledged().await.expect("redeliver");
        let again: Vec<Message> = x.stream().take(30).map(|m| m.expect("stream")).collect().await;
        assert!(again.iter().all(|m| m.redelivery_count() >= 1), "redelivered messages are counted");
        let mut again_ids: Vec<MessageId> = again.iter().map(|m| m.id).collect();
        again_ids.sort();
        assert_eq!(again_ids, ids[..30].to_vec());

        // Key_Shared with a delayed message far in the future: a newcomer
        // still gets its keys at once.
        let kt = SubscriptionType::KeyShared;
        let first = consumer(&client, &ks_topic, "k", kt, "first", 0, 100).await;
        let producer = client.producer(ks_topic.as_str()).create().await.expect("producer");
        producer
            .send(OutgoingMessage::new("late").with_key("k0").with_deliver_after(Duration::from_secs(60)))
            .await
            .expect("send");
        let second = consumer(&client, &ks_topic, "k", kt, "second", 0, 100).await;
        // 20: under this broker's subscription bound of 30.
        for i in 0..20 {
            producer.send(OutgoingMessage::new(format!("m{i}")).with_key(format!("k{i}"))).await.expect("send");
        }
        let mut n_second = 0;
        while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), second.receive()).await {
            assert_ne!(m.payload.as_ref(), b"late");
            n_second += 1;
        }
        let mut n_first = 0;
        while let Ok(Some(m)) = first.try_receive() {
            assert_ne!(m.payload.as_ref(), b"late");
            n_first += 1;
        }
        assert!(n_second > 0, "the newcomer got nothing while a delayed message waits");
        assert_eq!(n_first + n_second, 20);
    });
}

/// Receives until an error or `idle`, acking each message with confirmation
/// and recording it (receive order across consumers) once the ack is durable.
/// An ack whose answer was lost to the kill is "in doubt": it may or may not
/// be durable, so that message may or may not come again.
fn spawn_confirming_recorder(
    c: Arc<Consumer>,
    log: Arc<Mutex<Vec<(String, usize)>>>,
    in_doubt: Arc<Mutex<Vec<usize>>>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(1500), c.receive()).await {
            let seq: usize = std::str::from_utf8(&m.payload).unwrap()[1..].parse().unwrap();
            let key = m.key().unwrap().to_string();
            if c.ack_confirmed(AckType::Individual, &[m.id]).await.is_err() {
                in_doubt.lock().unwrap().push(seq);
                return; // the broker is gone
            }
            log.lock().unwrap().push((key, seq));
        }
    })
}

/// Key_Shared across a kill -9: with confirmed acks, the acknowledged
/// deliveries of each key are in publish order over the whole run, and every
/// message is acknowledged exactly once.
#[test]
fn key_shared_order_holds_across_kill9() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("key-shared-kill");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, owner) = topics_per_shard("kskill", SHARDS, 1).remove(0);
        let kt = SubscriptionType::KeyShared;
        let total = 200;
        let url = broker.url();
        let a = connect_on_shard(&url, owner, 64).await;
        let b = connect_on_shard(&url, (owner + 1) % SHARDS, 64).await;
        produce(&a, &topic, total, |i| Some(format!("k{}", i % 16))).await;
        let log = Arc::new(Mutex::new(Vec::new()));
        let doubt = Arc::new(Mutex::new(Vec::new()));
        let x = Arc::new(consumer(&a, &topic, "kk", kt, "x", 0, 10).await);
        let y = Arc::new(consumer(&b, &topic, "kk", kt, "y", 0, 10).await);
        let tx = spawn_confirming_recorder(x, log.clone(), doubt.clone());
        let ty = spawn_confirming_recorder(y, log.clone(), doubt.clone());
        wait_until("half acknowledged", || log.lock().unwrap().len() >= total / 2).await;
        broker.kill9();
        tx.await.unwrap();
        ty.await.unwrap();
        let before = log.lock().unwrap().len();
        let broker = broker.restart();
        let url = broker.url();
        let a = connect_on_shard(&url, owner, 64).await;
        let b = connect_on_shard(&url, (owner + 1) % SHARDS, 64).await;
        let x = Arc::new(consumer(&a, &topic, "kk", kt, "x", 0, 10).await);
        let y = Arc::new(consumer(&b, &topic, "kk", kt, "y", 0, 10).await);
        let tx = spawn_confirming_recorder(x, log.clone(), doubt.clone());
        let ty = spawn_confirming_recorder(y, log.clone(), doubt.clone());
        tx.await.unwrap();
        ty.await.unwrap();
        let log = log.lock().unwrap().clone();
        assert!(before < total && log.len() > before, "the kill came mid-way: {before} of {total}");
        let mut per_key: HashMap<String, Vec<usize>> = HashMap::new();
        for (k, seq) in &log {
            per_key.entry(k.clone()).or_default().push(*seq);
        }
        let doubt = doubt.lock().unwrap().clone();
        for (k, seqs) in &per_key {
            assert!(seqs.windows(2).all(|w| w[0] < w[1]), "key {k}: acknowledged deliveries out of order: {seqs:?}");
            let expected: Vec<usize> = (0..total).filter(|i| format!("k{}", i % 16) == *k).collect();
            let missing: Vec<usize> = expected.iter().copied().filter(|s| !seqs.contains(s)).collect();
            assert!(missing.iter().all(|s| doubt.contains(s)), "key {k}: lost {missing:?} (in doubt: {doubt:?})");
        }
    });
}

fn unix_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64
}

/// Delayed messages beyond the in-memory index bound (`--delayed-index-max
/// 4`): the index never holds more than 4, and every message still comes,
/// none before its time.
#[test]
fn delayed_messages_beyond_the_index_bound_all_come_on_time() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("delayed-bound");
        let mut options = BrokerOptions::new(SHARDS);
        options.extra_args = vec!["--delayed-index-max".into(), "4".into()];
        let broker = BrokerProcess::start_with(dir.path(), &options);
        let (topic, _) = topics_per_shard("delaybound", SHARDS, 1).remove(0);
        let client = Client::connect(&broker.url()).await.expect("connect");
        let c = consumer(&client, &topic, "db", SubscriptionType::Shared, "c", 0, 100).await;
        let producer = client.producer(topic.as_str()).create().await.expect("producer");
        let n = 12u64;
        // Later-sent messages are due sooner, so the index keeps replacing.
        for i in 0..n {
            let msg =
                OutgoingMessage::new(format!("d{i}")).with_deliver_after(Duration::from_millis(1500 + (n - i) * 40));
            producer.send(msg).await.expect("send");
        }
        producer.send(OutgoingMessage::new("now")).await.expect("send");
        assert_eq!(receive(&c, "undelayed").await.payload.as_ref(), b"now");
        let stats = client.topic_stats(&topic).await.expect("stats");
        let v: serde_json::Value = serde_json::from_str(&stats).unwrap();
        let indexed = v["subscriptions"]["db"]["delayed"].as_u64().unwrap();
        assert!(indexed <= 4, "the delayed index holds {indexed} > 4: {v}");
        let mut seen = BTreeSet::new();
        for _ in 0..n {
            let m = receive(&c, "delayed").await;
            let now = unix_ms();
            let at = m.deliver_at_ms().expect("deliver_at_ms");
            assert!(now >= at, "{} delivered {} ms early", m.id, at - now);
            assert!(now < at + 1000, "{} delivered {} ms late", m.id, now - at);
            assert!(seen.insert(m.id), "{} twice", m.id);
            c.ack(&m.id).await.unwrap();
        }
        assert_quiet(&c, Duration::from_millis(300), "after all delayed").await;
    });
}

/// Ack grouping: grouped acks reach the broker after the group time, or at
/// once when the group is full (seen in the subscription stats).
#[test]
fn grouped_acks_reach_the_broker_by_time_and_by_count() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("ack-group");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, _) = topics_per_shard("ackgroup", SHARDS, 1).remove(0);
        let client = Client::connect(&broker.url()).await.expect("connect");
        produce(&client, &topic, 10, |_| None).await;
        let unacked = |sub: &'static str| {
            let client = client.clone();
            let topic = topic.clone();
            async move {
                let v: serde_json::Value =
                    serde_json::from_str(&client.topic_stats(&topic).await.expect("stats")).unwrap();
                v["subscriptions"][sub]["unacked"].as_u64().unwrap()
            }
        };
        // By time (default 100 ms).
        let c = consumer(&client, &topic, "g1", SubscriptionType::Shared, "c", 0, 100).await;
        for _ in 0..5 {
            let m = receive(&c, "by time").await;
            c.ack(&m.id).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(unacked("g1").await, 10 - 5, "grouped acks not sent after the group time");
        // By count: a group of 5 that would otherwise wait an hour.
        let g = client
            .subscribe(topic.as_str(), "g2")
            .sub_type(SubscriptionType::Shared)
            .initial_position(InitialPosition::Earliest)
            .ack_group(Duration::from_secs(3600), 5)
            .subscribe()
            .await
            .unwrap();
        let mut ids = Vec::new();
        for _ in 0..10 {
            ids.push(receive(&g, "by count").await.id);
        }
        for id in &ids[..4] {
            g.ack(id).await.unwrap();
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(unacked("g2").await, 10, "4 acks of a group of 5 were sent early");
        g.ack(&ids[4]).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert_eq!(unacked("g2").await, 5, "a full group was not sent");
        // close() sends what is still grouped.
        g.ack(&ids[5]).await.unwrap();
        g.close().await.unwrap();
        let again = consumer(&client, &topic, "g2", SubscriptionType::Shared, "d", 0, 100).await;
        let mut back = Vec::new();
        while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), again.receive()).await {
            back.push(m.id);
        }
        back.sort();
        assert_eq!(back, ids[6..].to_vec(), "after close, only the unacked come again");
    });
}

/// Message-listener API: every message reaches the callback, which acks it;
/// the listener ends when the consumer is closed.
#[test]
fn a_listener_gets_every_message() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("listener");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, _) = topics_per_shard("listener", SHARDS, 1).remove(0);
        let client = Client::connect(&broker.url()).await.expect("connect");
        let ids = produce(&client, &topic, 20, |_| None).await;
        let c = Arc::new(consumer(&client, &topic, "l", SubscriptionType::Shared, "c", 0, 5).await);
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        let task = c.clone().listen(move |c, m| {
            let tx = tx.clone();
            async move {
                c.ack(&m.id).await.unwrap();
                tx.send(m.id).unwrap();
            }
        });
        let mut got = Vec::new();
        while got.len() < ids.len() {
            got.push(tokio::time::timeout(RECEIVE_TIMEOUT, rx.recv()).await.expect("listener stalled").unwrap());
        }
        assert_eq!(got, ids);
        c.close().await.unwrap();
        tokio::time::timeout(RECEIVE_TIMEOUT, task).await.expect("listener did not end").unwrap();
    });
}
