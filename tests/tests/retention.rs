//! Goal: issue #3's ledgers and retention with real broker processes: a
//! topic's ledger rolls over (tiny limits here) without losing, reordering
//! or duplicating anything, across `kill -9`; message ids stay monotonic;
//! retention deletes exactly the acknowledged ledgers beyond the namespace's
//! retention, never one a subscription still needs, and the segment files
//! go with them; TTL expires old backlog; a topic without subscriptions
//! keeps only what retention says.
//!
//! Method: brokers started with `--ledger-max-entries` of a few dozen,
//! `--ledger-min-rollover-s 0` and (where retention is tested)
//! `--retention-check-interval-s 1`; the Rust client produces and consumes;
//! the topic statistics (`ledgers`, `msg_backlog`) and the data directory's
//! size show what the broker kept.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{AckType, Client, Consumer, InitialPosition, Message, MessageId, OutgoingMessage};
use magnetar_tests::consume::{assert_quiet, receive, topic_stats as stats, wait_for};
use magnetar_tests::{run_async_with_timeout, test_dir, topics_per_shard, BrokerOptions, BrokerProcess};
use std::collections::BTreeSet;
use std::path::Path;
use std::sync::{Arc, Mutex};
use std::time::Duration;

fn options(shards: u32, ledger_max_entries: u64, retention_interval_s: Option<u64>) -> BrokerOptions {
    let mut o = BrokerOptions::new(shards);
    o.extra_args = vec![
        "--ledger-max-entries".into(),
        ledger_max_entries.to_string(),
        "--ledger-min-rollover-s".into(),
        "0".into(),
    ];
    if let Some(s) = retention_interval_s {
        o.extra_args.extend(["--retention-check-interval-s".into(), s.to_string()]);
    }
    o
}

fn key(id: &MessageId) -> (u64, u64) {
    (id.ledger, id.entry)
}

async fn subscribe(client: &Client, topic: &str, sub: &str) -> Consumer {
    client
        .subscribe(topic, sub)
        .initial_position(InitialPosition::Earliest)
        .receiver_queue_size(200)
        .subscribe()
        .await
        .unwrap_or_else(|e| panic!("subscribe {sub}: {e}"))
}

/// Sends `n` messages `{tag}-{i}` of `size` bytes, pipelined; returns their ids.
async fn produce(client: &Client, topic: &str, tag: &str, n: usize, size: usize) -> Vec<MessageId> {
    let producer = client.producer(topic).max_pending(200).create().await.unwrap();
    let mut pending = Vec::with_capacity(n);
    for i in 0..n {
        let mut p = format!("{tag}-{i}-").into_bytes();
        p.resize(size.max(p.len()), b'x');
        pending.push(producer.send_async(OutgoingMessage::new(p)).await.unwrap());
    }
    let mut ids = Vec::with_capacity(n);
    for f in pending {
        ids.push(f.await.unwrap());
    }
    producer.close().await.unwrap();
    ids
}

fn payload_tag(m: &Message) -> String {
    let s = String::from_utf8_lossy(&m.payload);
    let mut parts = s.splitn(3, '-');
    format!("{}-{}", parts.next().unwrap_or(""), parts.next().unwrap_or(""))
}

/// Ledger ids the topic keeps, oldest first (the last one current).
async fn ledgers(client: &Client, topic: &str) -> Vec<u64> {
    let s = stats(client, topic).await;
    s["ledgers"].as_array().unwrap().iter().map(|l| l["ledger"].as_u64().unwrap()).collect()
}

fn dir_bytes(p: &Path) -> u64 {
    let mut total = 0;
    // The broker keeps creating, renaming and removing files meanwhile
    // (segments, checkpoint.tmp, key index files): one that vanished
    // between the listing and its stat counts as gone.
    let Ok(rd) = std::fs::read_dir(p) else { return 0 };
    for e in rd.flatten() {
        let Ok(md) = e.metadata() else { continue };
        total += if md.is_dir() { dir_bytes(&e.path()) } else { md.len() };
    }
    total
}

fn segment_files(data: &Path) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for shard in std::fs::read_dir(data).unwrap().flatten() {
        if let Ok(rd) = std::fs::read_dir(shard.path().join("log")) {
            for f in rd.flatten() {
                out.insert(format!("{}/{}", shard.file_name().to_string_lossy(), f.file_name().to_string_lossy()));
            }
        }
    }
    out
}

/// Rollover with 25-entry ledgers on two shards, a subscription acking
/// across ledger boundaries (a cumulative ack and individual acks that
/// straddle one), then `kill -9` while a producer runs. After the restart:
/// the subscription gets exactly what it had not acknowledged, in order,
/// once; a fresh subscription gets every acknowledged message in order,
/// once; new messages get larger ids than anything before.
#[test]
fn rollover_survives_kill9_and_consumes_across_ledgers_in_order_once() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("rollover");
        let mut broker = BrokerProcess::start_with(dir.path(), &options(2, 25, None));
        let topics = topics_per_shard("rollover", 2, 1);
        let url = broker.url();
        let client = Client::connect(&url).await.unwrap();
        let mut produced: Vec<Vec<MessageId>> = Vec::new();
        for (t, _) in &topics {
            let ids = produce(&client, t, "a", 300, 100).await;
            assert!(ids.windows(2).all(|w| key(&w[0]) < key(&w[1])), "{t}: ids not increasing: {ids:?}");
            let distinct: BTreeSet<u64> = ids.iter().map(|i| i.ledger).collect();
            assert_eq!(distinct.len(), 12, "{t}: 300 entries in 25-entry ledgers");
            assert!(ids.iter().all(|i| i.entry < 25), "{t}: entry ids restart in each ledger");
            produced.push(ids);
        }
        // Subscription s on topic 0: cumulative ack through #129, individual
        // acks #140..=#150 (ledger boundary at #150).
        let (t0, _) = &topics[0];
        let s = subscribe(&client, t0, "s").await;
        let mut got = Vec::new();
        for i in 0..151 {
            got.push(receive(&s, &format!("s #{i}")).await.id);
        }
        assert_eq!(got, produced[0][..151].to_vec());
        s.ack_confirmed(AckType::Cumulative, &[got[129]]).await.unwrap();
        s.ack_confirmed(AckType::Individual, &got[140..=150]).await.unwrap();
        s.close().await.unwrap();
        client.close();

        // A producer runs into the kill.
        let acked: Arc<Mutex<Vec<MessageId>>> = Arc::default();
        let crash = {
            let (acked, url, t0) = (acked.clone(), url.clone(), t0.clone());
            tokio::spawn(async move {
                let c = Client::connect(&url).await.unwrap();
                let p = c.producer(&t0).create().await.unwrap();
                for i in 0.. {
                    match p.send(OutgoingMessage::new(format!("b-{i}-"))).await {
                        Ok(id) => acked.lock().unwrap().push(id),
                        Err(_) => break,
                    }
                }
            })
        };
        while acked.lock().unwrap().len() < 60 {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        broker.kill9();
        let _ = crash.await;
        let crash_acked = acked.lock().unwrap().clone();
        broker = broker.restart();
        let url = broker.url();
        let client = Client::connect(&url).await.unwrap();

        // s: #130..#139, #151.., then the crash run (what survived of it
        // beyond the acknowledged ones may be there too), each once in order.
        let mut want: Vec<MessageId> = produced[0][130..140].to_vec();
        want.extend_from_slice(&produced[0][151..]);
        let s = subscribe(&client, t0, "s").await;
        let mut seen = Vec::new();
        for id in &want {
            let m = receive(&s, "s after restart").await;
            assert_eq!(m.id, *id, "s after restart");
            seen.push(m.id);
        }
        // Then the crash run, in order, each once, every acknowledged one.
        let last_crash = *crash_acked.last().unwrap();
        loop {
            let m = receive(&s, "s: crash run").await;
            assert!(payload_tag(&m).starts_with("b-"), "s: unexpected {:?}", m.payload);
            assert!(key(&m.id) > key(seen.last().unwrap()), "s: {} after {}", m.id, seen.last().unwrap());
            seen.push(m.id);
            if key(&m.id) >= key(&last_crash) {
                break;
            }
        }
        for id in &crash_acked {
            assert!(seen.contains(id), "acknowledged {id} of the crash run is missing");
        }
        s.ack_confirmed(AckType::Cumulative, &[*seen.last().unwrap()]).await.unwrap();

        // A fresh subscription on each topic reads everything in order, once.
        for (i, (t, _)) in topics.iter().enumerate() {
            let all = subscribe(&client, t, "all").await;
            let mut prev: Option<MessageId> = None;
            let mut n = 0;
            for id in &produced[i] {
                let m = receive(&all, "all").await;
                assert_eq!(m.id, *id, "{t}: fresh subscription");
                prev = Some(m.id);
                n += 1;
            }
            if i == 0 {
                while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(500), all.receive()).await {
                    assert!(key(&m.id) > key(&prev.unwrap()), "{t}: {} after {:?}", m.id, prev);
                    prev = Some(m.id);
                    n += 1;
                }
                assert!(n >= 300 + crash_acked.len(), "{t}: {n} messages");
            } else {
                assert_quiet(&all, Duration::from_millis(300), "all on topic 1").await;
            }
            // New messages after the restart get larger ids (a new ledger
            // from the shard's allocator once this one fills).
            let more = produce(&client, t, "c", 30, 10).await;
            assert!(key(&more[0]) > key(&prev.unwrap()), "{t}: {} after {:?}", more[0], prev);
            let last = client.admin().last_message_id(t).await.unwrap().unwrap();
            assert_eq!(key(&last), key(more.last().unwrap()), "{t}: last message id");
        }
        broker.terminate();
    });
}

/// Default retention (0 minutes, 0 MB): a ledger goes once every durable
/// subscription acknowledged it, never before, never the current one; the
/// segments holding only deleted ledgers are removed and the data
/// directory shrinks back under a bound; the slow subscription still gets
/// everything it had not acknowledged.
#[test]
fn retention_deletes_acknowledged_ledgers_and_their_segments() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("retention");
        let mut o = options(1, 100, Some(1));
        o.segment_mib = Some(4);
        // Freed segments are unlinked here, so that the files and bytes
        // below measure what retention frees; by default up to two per
        // shard are kept for reuse (storage's `freed_segments_are_recycled`).
        o.extra_args.extend(["--segment-recycle".to_string(), "0".to_string()]);
        let mut broker = BrokerProcess::start_with(dir.path(), &o);
        let url = broker.url();
        let client = Client::connect(&url).await.unwrap();
        let topic = "persistent://public/default/retained";
        let slow = subscribe(&client, topic, "slow").await;
        let fast = subscribe(&client, topic, "fast").await;
        let ids = produce(&client, topic, "a", 3000, 8 * 1024).await;
        let all_ledgers: Vec<u64> = ids.iter().map(|i| i.ledger).collect::<BTreeSet<_>>().into_iter().collect();
        assert_eq!(all_ledgers.len(), 30);
        let segments_full = segment_files(dir.path());
        let bytes_full = dir_bytes(dir.path());
        assert!(bytes_full > 24 << 20, "{bytes_full} bytes after 24 MiB");

        // fast acknowledges everything, slow the first 1,050 (10.5 ledgers).
        let mut last = None;
        for _ in 0..3000 {
            last = Some(receive(&fast, "fast").await.id);
        }
        fast.ack_confirmed(AckType::Cumulative, &[last.unwrap()]).await.unwrap();
        for id in &ids[..1050] {
            assert_eq!(receive(&slow, "slow").await.id, *id);
        }
        slow.ack_confirmed(AckType::Cumulative, &[ids[1049]]).await.unwrap();

        // Exactly the ten ledgers slow finished go.
        wait_for("ten ledgers deleted", Duration::from_secs(15), || async {
            ledgers(&client, topic).await.first() == Some(&all_ledgers[10])
        })
        .await;
        tokio::time::sleep(Duration::from_millis(2500)).await;
        // (The last of the 30 filled up, so retention rolled it over: a
        // new, empty current ledger follows.)
        let kept = ledgers(&client, topic).await;
        assert_eq!(kept[..20], all_ledgers[10..], "nothing slow needs goes: {kept:?}");
        wait_for("a log line per deletion", Duration::from_secs(5), || async {
            broker.log().matches("retention: deleted ledger").count() == 10
        })
        .await;
        // slow goes on from #1050, nothing missing.
        for id in &ids[1050..1200] {
            assert_eq!(receive(&slow, "slow after deletion").await.id, *id);
        }
        // Some segments went already (those holding only ledgers 0..9).
        let segments_mid = segment_files(dir.path());
        assert!(segments_mid.len() < segments_full.len(), "{segments_full:?} → {segments_mid:?}");

        // slow finishes: every closed ledger goes, the current one stays,
        // and the data directory returns under a bound: the current ledger
        // (a few hundred KiB) in the segment being written, its spare,
        // index files and the checkpoint.
        let mut last = None;
        for _ in 1200..3000 {
            last = Some(receive(&slow, "slow").await.id);
        }
        slow.ack_confirmed(AckType::Cumulative, &[last.unwrap()]).await.unwrap();
        wait_for("all closed ledgers deleted", Duration::from_secs(15), || async {
            let l = ledgers(&client, topic).await;
            l.len() == 1 && l[0] > *all_ledgers.last().unwrap()
        })
        .await;
        let current = ledgers(&client, topic).await;
        let bound = 2 * (4 << 20) + (1 << 20);
        wait_for("data directory under the bound", Duration::from_secs(15), || async {
            dir_bytes(dir.path()) <= bound
        })
        .await;
        eprintln!(
            "data dir: {} bytes full, {} after retention (bound {bound}); segments {} → {}",
            bytes_full,
            dir_bytes(dir.path()),
            segments_full.len(),
            segment_files(dir.path()).len()
        );
        // After a restart the topic still has its current ledger and takes
        // appends with larger ids.
        slow.close().await.unwrap();
        fast.close().await.unwrap();
        client.close();
        broker.kill9();
        broker = broker.restart();
        let client = Client::connect(&broker.url()).await.unwrap();
        assert_eq!(ledgers(&client, topic).await, current);
        let more = produce(&client, topic, "b", 5, 10).await;
        assert!(key(&more[0]) > key(ids.last().unwrap()));
        broker.terminate();
    });
}

/// TTL: with `message_ttl_seconds` 1, a subscription's unacknowledged
/// backlog older than a second is acknowledged by the broker (and then, as
/// acknowledged data beyond retention, deleted); newer messages are kept.
#[test]
fn ttl_expires_old_backlog() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("ttl");
        let mut broker = BrokerProcess::start_with(dir.path(), &options(1, 20, Some(1)));
        let client = Client::connect(&broker.url()).await.unwrap();
        client.admin().create_namespace("public/ttl", serde_json::json!({"message_ttl_seconds": 1})).await.unwrap();
        let topic = "persistent://public/ttl/expiring";
        let s = subscribe(&client, topic, "s").await;
        s.close().await.unwrap();
        let old = produce(&client, topic, "old", 100, 10).await;
        let backlog = |v: serde_json::Value| v["subscriptions"]["s"]["msg_backlog"].as_u64().unwrap();
        assert_eq!(backlog(stats(&client, topic).await), 100);
        wait_for("old backlog expired", Duration::from_secs(10), || async {
            backlog(stats(&client, topic).await) == 0
        })
        .await;
        wait_for("a log line per expiry", Duration::from_secs(5), || async {
            broker.log().contains("TTL: expired unacknowledged messages")
        })
        .await;
        // Expired counts as acknowledged: the closed ledgers go too.
        wait_for("expired ledgers deleted", Duration::from_secs(10), || async {
            ledgers(&client, topic).await.len() == 1
        })
        .await;
        let new = produce(&client, topic, "new", 5, 10).await;
        assert!(key(&new[0]) > key(old.last().unwrap()));
        let s = subscribe(&client, topic, "s").await;
        for id in &new {
            assert_eq!(receive(&s, "after expiry").await.id, *id);
        }
        assert_quiet(&s, Duration::from_millis(300), "nothing expired comes back").await;
        broker.terminate();
    });
}

/// A topic without subscriptions keeps only what retention says: with the
/// defaults nothing beyond the current ledger; with 1 MiB of size retention,
/// at most 1 MiB of closed ledgers, the newest, still readable from the start.
#[test]
fn topic_without_subscriptions_keeps_only_retention() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("nosubs");
        let mut broker = BrokerProcess::start_with(dir.path(), &options(1, 10, Some(1)));
        let client = Client::connect(&broker.url()).await.unwrap();
        client
            .admin()
            .create_namespace("public/keep", serde_json::json!({"retention_minutes": -1, "retention_size_mb": 1}))
            .await
            .unwrap();
        let none = "persistent://public/default/unsubscribed";
        let kept = "persistent://public/keep/unsubscribed";
        produce(&client, none, "a", 100, 1000).await;
        // 400 × 16 KiB in 10-entry ledgers: 40 ledgers of 160 KiB.
        let ids = produce(&client, kept, "a", 400, 16 * 1024).await;
        wait_for("default retention keeps nothing closed", Duration::from_secs(10), || async {
            ledgers(&client, none).await.len() == 1
        })
        .await;
        let closed_bytes = |v: &serde_json::Value| -> u64 {
            let l = v["ledgers"].as_array().unwrap();
            l[..l.len() - 1].iter().map(|x| x["bytes"].as_u64().unwrap()).sum()
        };
        wait_for("size retention applied", Duration::from_secs(10), || async {
            closed_bytes(&stats(&client, kept).await) <= 1 << 20
        })
        .await;
        let v = stats(&client, kept).await;
        let l = v["ledgers"].as_array().unwrap();
        // 6 closed ledgers of 160 KiB fit in 1 MiB, a 7th would not; the
        // 40th ledger filled up, so retention rolled it over (an empty
        // current one follows).
        assert_eq!(l.len(), 7, "{v}");
        let first_kept = l[0]["ledger"].as_u64().unwrap();
        let from = ids.iter().position(|i| i.ledger == first_kept).unwrap();
        assert_eq!(from, 340);
        // What is kept is readable from its first entry.
        let r = subscribe(&client, kept, "late").await;
        for id in &ids[from..] {
            assert_eq!(receive(&r, "kept by retention").await.id, *id);
        }
        broker.terminate();
    });
}

/// Dedup and seek across ledgers: with deduplication on and 10-entry
/// ledgers, resends are answered with their original ids in older ledgers,
/// also after `kill -9` (snapshot + replay of the tail across ledgers);
/// seek by id and by publish time land in the right ledger.
#[test]
fn dedup_and_seek_work_across_ledgers() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("dedup-ledgers");
        let mut broker = BrokerProcess::start_with(dir.path(), &options(1, 10, None));
        let client = Client::connect(&broker.url()).await.unwrap();
        client.admin().create_namespace("public/dd", serde_json::json!({"deduplication": true})).await.unwrap();
        let topic = "persistent://public/dd/orders";
        let msg = |seq: u64| OutgoingMessage::new(format!("m{seq}")).with_sequence_id(seq);
        let p = client.producer(topic).name("dp").create().await.unwrap();
        let mut ids = Vec::new();
        for seq in 0..60 {
            ids.push(p.send(msg(seq)).await.unwrap());
        }
        assert_eq!(ids.iter().map(|i| i.ledger).collect::<BTreeSet<_>>().len(), 6);
        for seq in 20..30u64 {
            assert_eq!(p.send(msg(seq)).await.unwrap(), ids[seq as usize], "resend of {seq}");
        }
        broker.kill9();
        client.close();

        broker = broker.restart();
        let client = Client::connect(&broker.url()).await.unwrap();
        let p = client.producer(topic).name("dp").create().await.unwrap();
        assert_eq!(p.last_sequence_id(), 59);
        for seq in 0..60u64 {
            let id = p.send(msg(seq)).await.unwrap();
            if id.ledger != u64::MAX {
                assert_eq!(id, ids[seq as usize], "resend of {seq} after restart");
            }
        }
        let next = p.send(msg(60)).await.unwrap();
        assert!(key(&next) > key(&ids[59]));
        p.close().await.unwrap();

        let c = subscribe(&client, topic, "sk").await;
        assert_eq!(receive(&c, "first").await.id, ids[0]);
        c.seek(ids[35]).await.unwrap();
        assert_eq!(receive(&c, "after seek by id").await.id, ids[35]);
        c.seek(ids[3]).await.unwrap();
        assert_eq!(receive(&c, "after seek back to the first ledger").await.id, ids[3]);
        // Publish times of #47 and its neighbours, to check the landing spot.
        let mut times = Vec::new();
        for _ in 4..60 {
            times.push(receive(&c, "read on").await.publish_time_ms());
        }
        let t47 = times[47 - 4];
        c.seek_by_time(t47).await.unwrap();
        let m = receive(&c, "after seek by time").await;
        let i = ids.iter().position(|x| *x == m.id).unwrap();
        assert!(i <= 47 && m.publish_time_ms() >= t47, "seek by time landed on #{i}");
        assert!(i < 5 || times[i - 1 - 4] < t47, "seek by time landed on #{i}, after an earlier match");
        broker.terminate();
    });
}

/// Batch-index acks (kept per `(ledger, entry)` beside the cursor) in a
/// later ledger, while retention deletes the ledger before it: after a
/// `kill -9` only the unacknowledged messages of the batch come back.
#[test]
fn batch_index_acks_in_a_later_ledger_survive_retention_and_kill9() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("batch-ledgers");
        let mut broker = BrokerProcess::start_with(dir.path(), &options(1, 3, Some(1)));
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "persistent://public/default/batches";
        let c = subscribe(&client, topic, "bi").await;
        let plain = produce(&client, topic, "p", 3, 10).await;
        let options = magnetar_client::BatchingOptions {
            max_messages: 10,
            max_delay: Duration::from_secs(5),
            ..Default::default()
        };
        let producer = client.producer(topic).batching(options).create().await.unwrap();
        let mut receipts = Vec::new();
        for i in 0..10 {
            receipts.push(producer.send_async(OutgoingMessage::new(format!("b-{i}-"))).await.unwrap());
        }
        let mut batch = Vec::new();
        for r in receipts {
            batch.push(r.await.unwrap());
        }
        producer.close().await.unwrap();
        assert!(batch.iter().all(|id| (id.ledger, id.entry) == (batch[0].ledger, 0)), "{batch:?}");
        assert!(batch[0].ledger > plain[0].ledger, "the batch opens the second ledger");
        for id in &plain {
            assert_eq!(receive(&c, "plain").await.id, *id);
        }
        for id in &batch {
            assert_eq!(receive(&c, "batch").await.id, *id);
        }
        c.ack_confirmed(AckType::Cumulative, &[plain[2]]).await.unwrap();
        let even: Vec<MessageId> = batch.iter().copied().filter(|id| id.batch_index % 2 == 0).collect();
        c.ack_confirmed(AckType::Individual, &even).await.unwrap();
        // Retention deletes the first ledger (all acknowledged), not the second.
        wait_for("first ledger deleted", Duration::from_secs(10), || async {
            ledgers(&client, topic).await.first() == Some(&batch[0].ledger)
        })
        .await;
        c.close().await.unwrap();
        broker.kill9();
        broker = broker.restart();
        let client = Client::connect(&broker.url()).await.unwrap();
        let c = subscribe(&client, topic, "bi").await;
        let mut odd = Vec::new();
        for _ in 0..5 {
            odd.push(receive(&c, "after kill -9").await.id);
        }
        assert!(odd.iter().all(|id| id.batch_index % 2 == 1 && id.ledger == batch[0].ledger), "{odd:?}");
        assert_quiet(&c, Duration::from_millis(300), "only the unacked indexes").await;
        broker.terminate();
    });
}
