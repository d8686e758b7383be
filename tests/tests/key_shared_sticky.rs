//! Goal: Key_Shared sticky hash ranges (issue #4) hold with a real broker:
//! every message goes to the consumer owning its key hash; an overlapping
//! consumer, a consumer of the other mode and invalid ranges are refused;
//! keys of a range nobody owns wait, and come (in per-key order) once a
//! consumer covering them attaches, also through the CLI flag
//! `--key-shared-ranges`; a leaving consumer's unacked messages go, in
//! per-key order, to the next owner of its ranges.
//!
//! Method: a 2-shard broker process; consumers on connections of both
//! shards. Keys are fixed strings, so their hashes (Pulsar's Murmur3 % 65536, as the
//! broker computes them) are fixed too; the test checks its own premise
//! that every range gets keys.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{
    Client, ClientError, Consumer, ErrorCode, InitialPosition, Message, OutgoingMessage, SubscriptionType,
};
use magnetar_tests::{
    connect_on_shard, run_async_with_timeout, run_cli, test_dir, topics_per_shard, BrokerProcess, ConsumeCmd,
};
use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

const SHARDS: u32 = 2;
const KEYS: usize = 60;
const LOW: (u16, u16) = (0, 32767);
const MID: (u16, u16) = (32768, 49999);
/// Owned by nobody until the CLI consumer attaches.
const HIGH: (u16, u16) = (50000, 65535);

fn hash(key: &str) -> u16 {
    (magnetar_pulsar_wire::pulsar_key_hash(key.as_bytes()) % 65536) as u16
}

fn key_of(seq: usize) -> String {
    format!("k{}", seq % KEYS)
}

fn in_range(key: &str, r: (u16, u16)) -> bool {
    (r.0..=r.1).contains(&hash(key))
}

fn seq_of(payload: &[u8]) -> usize {
    std::str::from_utf8(payload).unwrap()[1..].parse().unwrap()
}

async fn sticky(client: &Client, topic: &str, name: &str, ranges: Vec<(u16, u16)>) -> Result<Consumer, ClientError> {
    client
        .subscribe(topic, "ks")
        .sub_type(SubscriptionType::KeyShared)
        .consumer_name(name)
        .receiver_queue_size(50)
        .initial_position(InitialPosition::Earliest)
        .key_shared_ranges(ranges)
        .subscribe()
        .await
}

async fn receive(c: &Consumer, what: &str) -> Message {
    tokio::time::timeout(Duration::from_secs(10), c.receive())
        .await
        .unwrap_or_else(|_| panic!("{what}: no message within 10 s"))
        .unwrap_or_else(|e| panic!("{what}: receive failed: {e}"))
}

async fn assert_quiet(c: &Consumer, what: &str) {
    if let Ok(m) = tokio::time::timeout(Duration::from_millis(500), c.receive()).await {
        panic!("{what}: expected nothing, got {:?}", m.map(|m| (m.key().map(str::to_string), m.id)));
    }
}

fn refused(r: Result<Consumer, ClientError>, code: ErrorCode, says: &str, what: &str) {
    match r {
        Err(ClientError::Broker { code: c, message }) => {
            assert_eq!(c, code, "{what}: {message}");
            assert!(message.contains(says), "{what}: the refusal should say {says:?}: {message:?}");
        }
        Err(e) => panic!("{what}: expected {code:?}, got {e}"),
        Ok(_) => panic!("{what}: accepted"),
    }
}

/// Asserts each key's sequence numbers ascend.
fn assert_per_key_order(got: &[(String, usize)], what: &str) {
    let mut per_key: BTreeMap<&str, Vec<usize>> = BTreeMap::new();
    for (k, s) in got {
        per_key.entry(k).or_default().push(*s);
    }
    for (k, seqs) in per_key {
        assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{what}: key {k} out of order: {seqs:?}");
    }
}

#[test]
fn sticky_ranges_route_refuse_and_hold() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let keys: Vec<String> = (0..KEYS).map(key_of).collect();
        for r in [LOW, MID, HIGH] {
            assert!(keys.iter().filter(|k| in_range(k, r)).count() >= 2, "premise: range {r:?} gets keys");
        }
        let dir = test_dir("key-shared-sticky");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let (topic, owner) = topics_per_shard("sticky", SHARDS, 1).remove(0);
        let url = broker.url();
        let a = connect_on_shard(&url, owner, 64).await;
        let b = connect_on_shard(&url, (owner + 1) % SHARDS, 64).await;

        let low = sticky(&a, &topic, "low", vec![LOW]).await.expect("low");
        let mid = sticky(&b, &topic, "mid", vec![MID]).await.expect("mid");
        refused(
            sticky(&a, &topic, "over", vec![(60000, 60001), (30000, 40000)]).await,
            ErrorCode::ConsumerBusy,
            "30000-40000 overlaps range 0-32767 of consumer \"low\"",
            "overlapping consumer",
        );
        refused(sticky(&b, &topic, "auto", vec![]).await, ErrorCode::ConsumerBusy, "sticky", "auto-split consumer");
        refused(sticky(&b, &topic, "bad", vec![(5, 4)]).await, ErrorCode::NotAllowed, "5-4 is invalid", "start > end");
        let too_many: Vec<(u16, u16)> = (0..257).map(|i| (60000 + i, 60000 + i)).collect();
        refused(sticky(&b, &topic, "many", too_many).await, ErrorCode::NotAllowed, "at most 256", "257 ranges");

        let producer = a.producer(topic.as_str()).create().await.expect("producer");
        let send = |range: std::ops::Range<usize>| {
            let producer = &producer;
            async move {
                for i in range {
                    let mut m = OutgoingMessage::new(format!("m{i}"));
                    m.key = Some(key_of(i));
                    producer.send(m).await.expect("send");
                }
            }
        };
        send(0..300).await;
        let count = |r: (u16, u16), seqs: std::ops::Range<usize>| seqs.filter(|s| in_range(&key_of(*s), r)).count();

        // Every message to the owner of its key hash; mid leaves the second
        // half unacknowledged.
        let mut got_low = Vec::new();
        for _ in 0..count(LOW, 0..300) {
            let m = receive(&low, "low").await;
            let k = m.key().unwrap().to_string();
            assert!(in_range(&k, LOW), "low got key {k} (hash {})", hash(&k));
            got_low.push((k, seq_of(&m.payload)));
            low.ack(&m.id).await.expect("ack");
        }
        let mut got_mid = Vec::new();
        for _ in 0..count(MID, 0..300) {
            let m = receive(&mid, "mid").await;
            let k = m.key().unwrap().to_string();
            assert!(in_range(&k, MID), "mid got key {k} (hash {})", hash(&k));
            let s = seq_of(&m.payload);
            got_mid.push((k, s));
            if s < 150 {
                mid.ack(&m.id).await.expect("ack");
            }
        }
        // Keys of HIGH have no owner: nobody gets them.
        assert_quiet(&low, "low after its share").await;
        assert_quiet(&mid, "mid after its share").await;
        assert_per_key_order(&got_low, "low");
        assert_per_key_order(&got_mid, "mid");

        // mid leaves with unacked messages; more arrive while MID is unowned.
        mid.close().await.expect("close mid");
        send(300..360).await;

        // A CLI consumer covering HIGH gets exactly the held HIGH messages.
        // An overlapping CLI consumer is refused first.
        let cli = |ranges: &str, count: usize| ConsumeCmd {
            count: count as u64,
            extra_args: vec!["--type".into(), "key_shared".into(), "--key-shared-ranges".into(), ranges.into()],
            ..ConsumeCmd::new(&url, &topic, "ks")
        };
        let bad = cli("0-10,50000-65535", 1).args();
        let run = tokio::task::spawn_blocking(move || run_cli(bad, Duration::from_secs(30))).await.unwrap();
        assert!(!run.status.success(), "an overlapping CLI consumer was accepted");
        assert!(run.stderr.contains("ConsumerBusy") && run.stderr.contains("overlaps"), "{}", run.stderr);
        let high_count = count(HIGH, 0..360);
        let good = cli("50000-65535", high_count);
        let got_high = tokio::task::spawn_blocking(move || good.run(Duration::from_secs(60))).await.unwrap();
        assert_eq!(got_high.len(), high_count, "the held HIGH messages");
        let got_high: Vec<(String, usize)> =
            got_high.iter().map(|r| (r.key.clone().unwrap(), seq_of(&r.payload))).collect();
        for (k, _) in &got_high {
            assert!(in_range(k, HIGH), "the HIGH consumer got key {k} (hash {})", hash(k));
        }
        assert_per_key_order(&got_high, "high (CLI)");
        let want: BTreeSet<usize> = (0..360).filter(|s| in_range(&key_of(*s), HIGH)).collect();
        assert_eq!(got_high.iter().map(|g| g.1).collect::<BTreeSet<_>>(), want, "every HIGH message once");

        // low gets its share of the new batch meanwhile.
        for _ in 0..count(LOW, 300..360) {
            let m = receive(&low, "low, second batch").await;
            assert!(in_range(m.key().unwrap(), LOW));
            low.ack(&m.id).await.expect("ack");
        }

        // The next owner of MID gets mid's unacked messages and the new
        // ones, each key in publish order.
        let mid2 = sticky(&a, &topic, "mid2", vec![MID]).await.expect("mid2");
        let want: BTreeSet<usize> = (150..360).filter(|s| in_range(&key_of(*s), MID)).collect();
        let mut got = Vec::new();
        for _ in 0..want.len() {
            let m = receive(&mid2, "mid2").await;
            got.push((m.key().unwrap().to_string(), seq_of(&m.payload)));
            mid2.ack(&m.id).await.expect("ack");
        }
        assert_per_key_order(&got, "mid2");
        assert_eq!(got.iter().map(|g| g.1).collect::<BTreeSet<_>>(), want, "mid's unacked and the new MID messages");
        assert_quiet(&mid2, "mid2 after its share").await;
        assert_quiet(&low, "low at the end").await;
    });
}
