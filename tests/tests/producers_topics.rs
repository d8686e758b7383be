//! Issue #5 end to end: tenants, namespaces and policies through the admin
//! CLI (surviving `kill -9`), partitioned topics with key routing through the
//! produce/consume CLI, and producer access modes through the SDK and CLI.
//!
//! Method: real 2-shard broker processes; the CLI's documented output
//! (one name a line, one JSON document, jsonl receipts and messages) is the
//! oracle, next to the SDK's typed errors.

use magnetar_client::{Client, ClientError, ErrorCode, OutgoingMessage, ProducerAccessMode, RoutingMode};
use magnetar_tests::{
    parse_generated, run_async_with_timeout, run_cli, test_dir, BrokerProcess, ConsumeCmd, ProduceCmd,
};
use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

const SHARDS: u32 = 2;
const CLI_TIMEOUT: Duration = Duration::from_secs(30);

/// Runs `magnetar admin ARGS --url URL`; returns (success, stdout lines, stderr).
fn admin(url: &str, args: &[&str]) -> (bool, Vec<String>, String) {
    let mut a: Vec<String> = vec!["admin".into()];
    a.extend(args.iter().map(|s| s.to_string()));
    a.push("--url".into());
    a.push(url.into());
    let run = run_cli(a, CLI_TIMEOUT);
    (run.status.success(), run.stdout_lines, run.stderr)
}

fn admin_ok(url: &str, args: &[&str]) -> Vec<String> {
    let (ok, out, err) = admin(url, args);
    assert!(ok, "magnetar admin {args:?} failed:\n{err}");
    out
}

fn admin_err(url: &str, args: &[&str], expect: &str) {
    let (ok, _, err) = admin(url, args);
    assert!(!ok, "magnetar admin {args:?} should have failed");
    assert!(err.contains(expect), "magnetar admin {args:?}: stderr should say {expect:?}:\n{err}");
}

fn json(lines: &[String]) -> serde_json::Value {
    assert_eq!(lines.len(), 1, "expected one JSON line, got {lines:?}");
    serde_json::from_str(&lines[0]).unwrap_or_else(|e| panic!("not JSON ({e}): {}", lines[0]))
}

/// Goal: `topics list` is paged: pages chained by `--after` (and the SDK's
/// pages) give exactly the whole sorted listing, a page holds at most its
/// limit however the topics spread over the shards, and a bad limit is
/// refused.
///
/// Method: a 2-shard broker, 23 topics and a partitioned topic in a fresh
/// namespace; the full listing against pages of 5.
#[test]
fn topics_list_is_paged() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("topics-paged");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        admin_ok(&url, &["namespaces", "create", "public/many"]);
        let client = Client::connect(&url).await.expect("connect");
        let admin = client.admin();
        let mut expected = BTreeSet::new();
        for i in 0..23 {
            let t = format!("persistent://public/many/t{i:02}");
            admin.call("topics.create", serde_json::json!({ "topic": t })).await.expect("create");
            expected.insert(t);
        }
        admin.create_partitioned_topic("persistent://public/many/parted", 3).await.expect("create partitioned");
        expected.insert("persistent://public/many/parted".to_string());
        let expected: Vec<String> = expected.into_iter().collect();

        let all = admin_ok(&url, &["topics", "list", "public/many"]);
        assert_eq!(all, expected);
        let mut chained: Vec<String> = Vec::new();
        loop {
            let mut args = vec!["topics", "list", "public/many", "--limit", "5"];
            let last = chained.last().cloned();
            if let Some(last) = &last {
                args.extend(["--after", last.as_str()]);
            }
            let page = admin_ok(&url, &args);
            assert!(page.len() <= 5, "{page:?}");
            let done = page.len() < 5;
            chained.extend(page);
            if done {
                break;
            }
        }
        assert_eq!(chained, expected, "pages chained by --after");
        assert_eq!(admin.list_topics("public/many").await.expect("SDK list"), expected);
        let page = admin.list_topics_page("public/many", Some("persistent://public/many/t10"), 4).await.expect("page");
        assert_eq!(page, expected[12..16].to_vec());
        for bad in [0u64, 100_001] {
            let r = admin.call("topics.list", serde_json::json!({ "namespace": "public/many", "limit": bad })).await;
            assert!(
                matches!(&r, Err(ClientError::Broker { code: ErrorCode::ProtocolError, message }) if message.contains("limit")),
                "limit {bad}: {r:?}"
            );
        }
        client.close();
    });
}

/// Goal: the admin CLI round-trips tenants, namespaces, policies and
/// partitioned topics; bad names and forbidden changes fail with a clear
/// message; policies are enforced on producers; all of it survives kill -9.
#[test]
fn admin_cli_round_trips_policies_are_enforced_and_metadata_survives_kill9() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("admin");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();

        // A fresh broker has public/default.
        assert_eq!(admin_ok(&url, &["tenants", "list"]), vec!["public"]);
        assert_eq!(admin_ok(&url, &["namespaces", "list", "public"]), vec!["public/default"]);

        admin_ok(&url, &["tenants", "create", "acme"]);
        admin_err(&url, &["tenants", "create", "acme"], "already exists");
        admin_err(&url, &["tenants", "create", "bad name"], "invalid tenant name");
        admin_err(&url, &["namespaces", "create", "nobody/ns"], "tenant \"nobody\" does not exist");
        admin_err(&url, &["namespaces", "create", "acme"], "invalid namespace");
        admin_ok(&url, &["namespaces", "create", "acme/orders", "--bundles", "8"]);
        assert_eq!(admin_ok(&url, &["namespaces", "list", "acme"]), vec!["acme/orders"]);

        // Policy setters, read back.
        admin_ok(&url, &["namespaces", "set-max-producers", "acme/orders", "1"]);
        admin_ok(&url, &["namespaces", "set-retention", "acme/orders", "--minutes", "-1", "--size-mb", "1024"]);
        admin_ok(&url, &["namespaces", "set-message-ttl", "acme/orders", "3600"]);
        admin_ok(&url, &["namespaces", "set-deduplication", "acme/orders", "on"]);
        let p = json(&admin_ok(&url, &["namespaces", "policies", "acme/orders"]));
        assert_eq!(p["max_producers_per_topic"], 1, "{p}");
        assert_eq!(p["retention_minutes"], -1, "{p}");
        assert_eq!(p["retention_size_mb"], 1024, "{p}");
        assert_eq!(p["message_ttl_seconds"], 3600, "{p}");
        assert_eq!(p["deduplication"], true, "{p}");
        assert_eq!(p["bundles"], 8, "{p}");
        admin_err(&url, &["namespaces", "set-policies", "acme/orders", r#"{"bundles":4}"#], "fixed at creation");
        admin_err(&url, &["namespaces", "set-policies", "acme/orders", r#"{"no_such_policy":1}"#], "unknown field");

        // Partitioned topics: create, read, grow, never shrink.
        let topic = "persistent://acme/orders/pt";
        admin_ok(&url, &["topics", "create-partitioned", topic, "--partitions", "3"]);
        admin_err(&url, &["topics", "create-partitioned", topic, "-p", "3"], "already exists");
        assert_eq!(json(&admin_ok(&url, &["topics", "get-partitioned-metadata", topic]))["partitions"], 3);
        admin_ok(&url, &["topics", "update-partitioned", topic, "-p", "5"]);
        admin_err(&url, &["topics", "update-partitioned", topic, "-p", "2"], "can only grow");
        admin_err(
            &url,
            &["topics", "create-partitioned", "persistent://acme/orders/x-partition-1", "-p", "2"],
            "-partition-",
        );
        admin_err(
            &url,
            &["topics", "create-partitioned", "persistent://acme/orders/bad name", "-p", "2"],
            "invalid topic name",
        );
        let lookup = json(&admin_ok(&url, &["topics", "lookup", topic]));
        assert_eq!(lookup["partitions"], 5, "{lookup}");
        assert!(lookup["shard"].as_u64().is_some_and(|s| s < u64::from(SHARDS)), "{lookup}");
        assert_eq!(lookup["broker"], broker.addr().to_string(), "{lookup}");
        assert_eq!(lookup["partition_owners"].as_array().map(Vec::len), Some(5), "{lookup}");

        // max_producers_per_topic = 1: the second producer is refused, clearly.
        let client = Client::connect(&url).await.expect("connect");
        let plain = "persistent://acme/orders/plain";
        let first = client.producer(plain).create().await.expect("first producer");
        match client.producer(plain).create().await {
            Err(ClientError::Broker { code: ErrorCode::ProducerBusy, message }) => {
                assert!(message.contains("max_producers_per_topic"), "{message}")
            }
            other => panic!("second producer: expected ProducerBusy, got {other:?}"),
        }
        first.send(OutgoingMessage::new("x")).await.expect("send");
        // Producing to a partitioned topic's own name with a plain producer
        // is refused; its partitions are fine.
        match client.producer(topic).create().await {
            Err(ClientError::Broker { code: ErrorCode::NotAllowed, message }) => {
                assert!(message.contains("partitioned"), "{message}")
            }
            other => panic!("plain producer on a partitioned name: got {other:?}"),
        }
        match client.producer(format!("{topic}-partition-7")).create().await {
            Err(ClientError::Broker { code: ErrorCode::TopicNotFound, .. }) => {}
            other => panic!("partition 7 of 5: got {other:?}"),
        }
        // A missing namespace, and auto creation turned off.
        match client.producer("persistent://acme/nope/t").create().await {
            Err(ClientError::Broker { code: ErrorCode::TopicNotFound, message }) => {
                assert!(message.contains("namespace"), "{message}")
            }
            other => panic!("missing namespace: got {other:?}"),
        }
        admin_ok(&url, &["namespaces", "set-auto-topic-creation", "acme/orders", "off"]);
        match client.producer("persistent://acme/orders/new-one").create().await {
            Err(ClientError::Broker { code: ErrorCode::TopicNotFound, message }) => {
                assert!(message.contains("automatically"), "{message}")
            }
            other => panic!("auto creation off: got {other:?}"),
        }
        admin_ok(&url, &["topics", "create", "persistent://acme/orders/new-one"]);
        let created = client.producer("persistent://acme/orders/new-one").create().await.expect("explicitly created");
        created.close().await.expect("close");
        first.close().await.expect("close");

        let topics = admin_ok(&url, &["topics", "list", "acme/orders"]);
        for t in [topic, plain, "persistent://acme/orders/new-one"] {
            assert!(topics.iter().any(|x| x == t), "{t} missing from {topics:?}");
        }
        admin_err(&url, &["namespaces", "delete", "acme/orders"], "still has");
        admin_err(&url, &["tenants", "delete", "acme"], "still has namespaces");
        client.close();

        // Everything above is durable: kill -9, restart, read it back.
        broker.kill9();
        let broker = broker.restart();
        let url = broker.url();
        assert_eq!(admin_ok(&url, &["tenants", "list"]), vec!["acme", "public"]);
        let p = json(&admin_ok(&url, &["namespaces", "policies", "acme/orders"]));
        assert_eq!(p["max_producers_per_topic"], 1, "{p}");
        assert_eq!(p["auto_topic_creation"], false, "{p}");
        assert_eq!(json(&admin_ok(&url, &["topics", "get-partitioned-metadata", topic]))["partitions"], 5);

        // Deleting: topics, then the namespace, then the tenant.
        for t in &topics {
            if !t.contains("-partition-") {
                admin_ok(&url, &["topics", "delete", t]);
            }
        }
        assert_eq!(admin_ok(&url, &["topics", "list", "acme/orders"]), Vec::<String>::new());
        admin_ok(&url, &["namespaces", "delete", "acme/orders"]);
        admin_ok(&url, &["tenants", "delete", "acme"]);
        assert_eq!(admin_ok(&url, &["tenants", "list"]), vec!["public"]);
    });
}

/// Goal: on a partitioned topic, messages of one key all land in one
/// partition and are consumed in send order; keyless round-robin covers every
/// partition; consuming the topic's own name covers all partitions, and the
/// partition shows in the message ids.
#[test]
fn key_routing_keeps_a_key_in_one_partition_in_order() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("key-routing");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let topic = "persistent://public/default/routed";
        admin_ok(&url, &["topics", "create-partitioned", topic, "--partitions", "4"]);

        let mut keyed = ProduceCmd::new(&url, topic, "keyed", 200, 64);
        keyed.extra_args = vec!["--keys".into(), "7".into(), "--routing".into(), "round-robin".into()];
        let receipts = keyed.run(CLI_TIMEOUT);
        let mut partition_of_key: BTreeMap<String, i32> = BTreeMap::new();
        for r in &receipts {
            let key = r.key.clone().expect("keyed");
            let p = *partition_of_key.entry(key.clone()).or_insert(r.id.partition);
            assert_eq!(r.id.partition, p, "key {key} went to partitions {p} and {}", r.id.partition);
            assert!((0..4).contains(&p), "{r:?}");
        }
        assert!(
            partition_of_key.values().collect::<BTreeSet<_>>().len() > 1,
            "7 keys all hashed to one partition: {partition_of_key:?}"
        );

        let keyless = ProduceCmd::new(&url, topic, "keyless", 40, 64);
        let receipts = keyless.run(CLI_TIMEOUT);
        let used: BTreeSet<i32> = receipts.iter().map(|r| r.id.partition).collect();
        assert_eq!(used, (0..4).collect(), "round-robin should use every partition");
        let mut single = ProduceCmd::new(&url, topic, "single", 20, 64);
        single.extra_args = vec!["--routing".into(), "single".into()];
        let used: BTreeSet<i32> = single.run(CLI_TIMEOUT).iter().map(|r| r.id.partition).collect();
        assert_eq!(used.len(), 1, "single-partition routing used {used:?}");

        // Consume the partitioned name: all 260 messages, per key in order.
        let mut consume = ConsumeCmd::new(&url, topic, "all");
        consume.count = 260;
        let received = consume.run(CLI_TIMEOUT);
        assert_eq!(received.len(), 260);
        let mut last_seq: BTreeMap<String, u64> = BTreeMap::new();
        for m in &received {
            let (producer, seq) = parse_generated(&m.payload).expect("generated payload");
            if producer != "keyed" {
                continue;
            }
            let key = m.key.clone().expect("keyed message has its key");
            assert_eq!(m.id.partition, partition_of_key[&key], "{m:?}");
            if let Some(prev) = last_seq.insert(key.clone(), seq) {
                assert!(seq > prev, "key {key}: seq {seq} after {prev}");
            }
        }
        assert_eq!(last_seq.len(), 7);

        // The SDK's latency-aware mode reaches every partition too (untried
        // partitions first) and reports the partition in each id.
        let client = Client::connect(&url).await.expect("connect");
        let p = client.producer(topic).create_partitioned(RoutingMode::Latency).await.expect("producer");
        assert_eq!(p.partitions(), 4);
        let mut used = BTreeSet::new();
        for i in 0..16 {
            used.insert(p.send(OutgoingMessage::new(format!("l{i}"))).await.expect("send").partition);
        }
        assert_eq!(used, (0..4).collect());
        // Growing the topic: the producer picks up the new partitions.
        admin_ok(&url, &["topics", "update-partitioned", topic, "-p", "6"]);
        p.refresh_partitions().await.expect("refresh");
        assert_eq!(p.partitions(), 6);
        p.close().await.expect("close");
        client.close();
    });
}

/// Goal: Exclusive refuses a second producer; WaitForExclusive waits and
/// takes over when the holder leaves; ExclusiveWithFencing fences the
/// holder's later sends. The CLI reports a refusal.
#[test]
fn exclusive_producers_refuse_wait_and_fence() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("access-modes");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let topic = "persistent://public/default/exclusive";
        let a = Client::connect(&url).await.expect("connect");
        let b = Client::connect(&url).await.expect("connect");
        let first = a.producer(topic).name("first").access_mode(ProducerAccessMode::Exclusive).create().await;
        let first = first.expect("first exclusive producer");
        for mode in [ProducerAccessMode::Exclusive, ProducerAccessMode::Shared] {
            match b.producer(topic).access_mode(mode).create().await {
                Err(ClientError::Broker { code: ErrorCode::ProducerBusy, message }) => {
                    assert!(message.contains("exclusive"), "{message}")
                }
                other => panic!("{mode:?} next to an exclusive producer: got {other:?}"),
            }
        }
        let mut cli = ProduceCmd::new(&url, topic, "cli", 1, 8);
        cli.extra_args = vec!["--access-mode".into(), "exclusive".into()];
        let run = run_cli(cli.args(), CLI_TIMEOUT);
        assert!(!run.status.success(), "the CLI producer was accepted");
        assert!(run.stderr.contains("ProducerBusy"), "{}", run.stderr);

        // WaitForExclusive: pending while `first` holds the topic.
        let b2 = b.clone();
        let waiting = tokio::spawn(async move {
            b2.producer(topic).name("waiter").access_mode(ProducerAccessMode::WaitForExclusive).create().await
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!waiting.is_finished(), "the waiting producer was admitted while the topic was held");
        first.send(OutgoingMessage::new("from first")).await.expect("holder still sends");
        first.close().await.expect("close");
        let waiter = tokio::time::timeout(Duration::from_secs(10), waiting)
            .await
            .expect("the waiter took over within 10 s")
            .expect("task")
            .expect("waiter created");
        waiter.send(OutgoingMessage::new("from waiter")).await.expect("waiter sends");

        // Fencing: the new producer takes the topic, the waiter's sends fail.
        let fencer = a.producer(topic).access_mode(ProducerAccessMode::ExclusiveWithFencing).create().await;
        let fencer = fencer.expect("fencing producer");
        match waiter.send(OutgoingMessage::new("fenced")).await {
            Err(ClientError::Broker { code: ErrorCode::ProducerFenced, .. }) => {}
            other => panic!("send of a fenced producer: got {other:?}"),
        }
        fencer.send(OutgoingMessage::new("from fencer")).await.expect("fencer sends");
        a.close();
        b.close();
    });
}

/// Goal: with deduplication on, a resend of a stored sequence id is answered
/// with the original receipt and stored once, also across a `kill -9` (the
/// state is rebuilt from the snapshot and the log tail), and a reconnecting
/// producer learns the last stored sequence id.
/// Method: send 0..100, resend 50..100, kill -9 right after the last
/// receipt, restart, resend 0..120; a consumer from the earliest position
/// must see each of 0..120 exactly once.
#[test]
fn dedup_stores_each_sequence_once_across_kill9_and_resends() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("dedup");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        admin_ok(&url, &["namespaces", "create", "public/dedup"]);
        admin_ok(&url, &["namespaces", "set-deduplication", "public/dedup", "on"]);
        let topic = "persistent://public/dedup/orders";
        let msg = |seq: u64| OutgoingMessage::new(format!("m{seq}")).with_sequence_id(seq);

        let client = Client::connect(&url).await.expect("connect");
        let p = client.producer(topic).name("dp").create().await.expect("producer");
        assert_eq!(p.last_sequence_id(), -1);
        let mut receipts = Vec::new();
        for seq in 0..100 {
            receipts.push(p.send_async(msg(seq)).await.expect("send"));
        }
        let mut ids = Vec::new();
        for r in receipts {
            ids.push(r.await.expect("receipt"));
        }
        let mut resent = Vec::new();
        for seq in 50..100u64 {
            resent.push((seq, p.send_async(msg(seq)).await.expect("resend")));
        }
        for (seq, r) in resent {
            assert_eq!(r.await.expect("resend"), ids[seq as usize], "resend of {seq} answered with another id");
        }
        broker.kill9();
        client.close();

        let broker = broker.restart();
        let url = broker.url();
        let client = Client::connect(&url).await.expect("connect");
        let p = client.producer(topic).name("dp").create().await.expect("producer after restart");
        assert_eq!(p.last_sequence_id(), 99, "the broker should remember the last stored sequence id");
        let mut resent = Vec::new();
        for seq in 0..120u64 {
            resent.push((seq, p.send_async(msg(seq)).await.expect("resend after restart")));
        }
        for (seq, r) in resent {
            let id = r.await.expect("receipt after restart");
            if seq < 100 && id.ledger != u64::MAX {
                assert_eq!(id, ids[seq as usize], "resend of {seq} after restart answered with another id");
            }
        }
        let consumer = client
            .subscribe(topic, "check")
            .initial_position(magnetar_client::InitialPosition::Earliest)
            .subscribe()
            .await
            .expect("consumer");
        let mut seen = BTreeMap::new();
        // Until 2 s pass without a message.
        while let Ok(m) = tokio::time::timeout(Duration::from_secs(2), consumer.receive()).await {
            let m = m.expect("receive");
            *seen.entry(m.sequence_id()).or_insert(0u32) += 1;
            assert_eq!(m.payload, format!("m{}", m.sequence_id()).as_bytes());
        }
        assert_eq!(seen.len(), 120, "distinct sequence ids stored: {}", seen.len());
        let dups: Vec<_> = seen.iter().filter(|(_, n)| **n != 1).collect();
        assert!(dups.is_empty(), "stored more than once: {dups:?}");
        client.close();
    });
}

/// Goal: batching (by count, and one batch per key) with every compression
/// codec round-trips byte for byte through the broker, which stores a batch
/// as one entry; consumers see each message with its own id `L:E:P:B`.
/// Method: the produce CLI with batching flags and `--compression`, then the
/// consume CLI from the earliest position; payloads are the CLI's generated
/// ones, checked against `expected_payload`.
#[test]
fn batching_and_key_based_batching_round_trip_with_every_codec() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("batching");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        const N: u64 = 60;
        const SIZE: usize = 300;
        for codec in ["none", "lz4", "zlib", "zstd", "snappy"] {
            for key_based in [false, true] {
                let what = format!("{codec}, key-based {key_based}");
                let topic = format!("persistent://public/default/batch-{codec}-{key_based}");
                let name = format!("b-{codec}");
                let mut produce = ProduceCmd::new(&url, &topic, &name, N, SIZE);
                produce.extra_args = vec![
                    "--keys".into(),
                    "3".into(),
                    "--batch-max-messages".into(),
                    "10".into(),
                    "--batch-max-delay-ms".into(),
                    "50".into(),
                    "--compression".into(),
                    codec.into(),
                ];
                if key_based {
                    produce.extra_args.extend(["--batching".into(), "key-based".into()]);
                }
                let receipts = produce.run(CLI_TIMEOUT);
                let entries: BTreeSet<(u64, u64)> = receipts.iter().map(|r| (r.id.ledger, r.id.entry)).collect();
                assert!(
                    entries.len() < N as usize / 2,
                    "{what}: {} entries for {N} messages: not batched",
                    entries.len()
                );
                assert!(receipts.iter().any(|r| r.id.batch_index > 0), "{what}: no batch index in the receipts");

                let mut consume = ConsumeCmd::new(&url, &topic, "check");
                consume.count = N;
                let received = consume.run(CLI_TIMEOUT);
                assert_eq!(received.len() as u64, N, "{what}");
                let mut keys_of_entry: BTreeMap<(u64, u64), BTreeSet<Option<String>>> = BTreeMap::new();
                let mut seqs = BTreeSet::new();
                for m in &received {
                    let (producer, seq) = parse_generated(&m.payload).unwrap_or_else(|| panic!("{what}: {m:?}"));
                    assert_eq!(producer, name);
                    assert_eq!(m.payload, magnetar_tests::expected_payload(&name, seq, SIZE), "{what}: seq {seq}");
                    assert_eq!(m.key.as_deref(), Some(format!("k{}", seq % 3).as_str()), "{what}: seq {seq}");
                    let receipt = &receipts[seq as usize];
                    assert_eq!(m.id, receipt.id, "{what}: seq {seq} consumed with another id than its receipt");
                    keys_of_entry.entry((m.id.ledger, m.id.entry)).or_default().insert(m.key.clone());
                    seqs.insert(seq);
                }
                assert_eq!(seqs.len() as u64, N, "{what}: duplicates or gaps");
                if key_based {
                    for (entry, keys) in &keys_of_entry {
                        assert_eq!(keys.len(), 1, "{what}: entry {entry:?} mixes keys {keys:?}");
                    }
                }
            }
        }
    });
}

/// Goal: `magnetar read` reads from earliest, latest or a message id without
/// leaving a subscription behind; `magnetar consume --topics-pattern` picks
/// up a matching topic created after it started, and ignores others.
#[test]
fn reader_positions_and_a_pattern_subscription_picks_up_new_topics() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("reader");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let topic = "persistent://public/default/readme";
        let receipts = ProduceCmd::new(&url, topic, "r", 10, 16).run(CLI_TIMEOUT);
        let read = |start: &str| {
            let args: Vec<String> =
                ["read", topic, "--start", start, "--timeout-s", "1", "--output", "jsonl", "--url", &url]
                    .iter()
                    .map(|s| s.to_string())
                    .collect();
            let run = run_cli(args, CLI_TIMEOUT);
            run.assert_success();
            run.stdout_lines.iter().map(|l| magnetar_tests::Received::parse(l)).collect::<Vec<_>>()
        };
        let all = read("earliest");
        assert_eq!(all.iter().map(|m| m.id).collect::<Vec<_>>(), receipts.iter().map(|r| r.id).collect::<Vec<_>>());
        // Nothing was kept: reading again gives everything again.
        assert_eq!(read("earliest").len(), 10);
        let from5 = read(&receipts[5].id.to_string());
        assert_eq!(
            from5.iter().map(|m| m.id).collect::<Vec<_>>(),
            receipts[5..].iter().map(|r| r.id).collect::<Vec<_>>()
        );
        assert!(read("latest").is_empty());
        let last = json(&admin_ok(&url, &["topics", "last-message-id", topic]));
        assert_eq!(last["id"], receipts[9].id.to_string(), "{last}");
        admin_err(&url, &["topics", "last-message-id", "persistent://public/default/never"], "does not exist");

        // Pattern subscription: pat-a exists, pat-b is created later, other never matches.
        ProduceCmd::new(&url, "persistent://public/default/pat-a", "a", 2, 16).run(CLI_TIMEOUT);
        let mut consume = ConsumeCmd::new(&url, "unused", "pattern");
        consume.count = 4;
        consume.idle_timeout_s = 15.0;
        let mut args = consume.args();
        args.remove(1); // the positional topic
        args.extend(["--topics-pattern".into(), "persistent://public/default/pat-.*".into()]);
        args.extend(["--pattern-refresh-s".into(), "0.3".into()]);
        let mut cli = magnetar_tests::CliProcess::spawn(args);
        let first = match cli.next_line(Duration::from_secs(20)) {
            magnetar_tests::Line::Line(l) => magnetar_tests::Received::parse(&l),
            other => panic!("pattern consumer: no first message ({other:?}):\n{}", cli.stderr()),
        };
        assert!(first.payload.starts_with(b"a:"), "{first:?}");
        ProduceCmd::new(&url, "persistent://public/default/other", "o", 2, 16).run(CLI_TIMEOUT);
        ProduceCmd::new(&url, "persistent://public/default/pat-b", "b", 2, 16).run(CLI_TIMEOUT);
        let run = cli.finish(Duration::from_secs(30));
        run.assert_success();
        let rest: Vec<_> = run.stdout_lines.iter().map(|l| magnetar_tests::Received::parse(l)).collect();
        let producers: Vec<String> =
            std::iter::once(&first).chain(&rest).map(|m| parse_generated(&m.payload).expect("payload").0).collect();
        assert_eq!(producers, vec!["a", "a", "b", "b"], "{producers:?}");
    });
}

/// Goal: a `ResilientProducer` keeps every message until its receipt,
/// reconnects after the broker is killed (`kill -9`) and restarted (on a new
/// port, given by its URL provider), resends what had no receipt with the
/// original sequence ids, and with dedup on every message ends up stored
/// exactly once, in order.
#[test]
fn a_resilient_producer_resends_after_kill9_and_each_message_is_stored_once() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("resilient");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = Arc::new(std::sync::Mutex::new(broker.url()));
        admin_ok(&broker.url(), &["namespaces", "create", "public/dd"]);
        admin_ok(&broker.url(), &["namespaces", "set-deduplication", "public/dd", "on"]);
        let topic = "persistent://public/dd/resilient";
        let provider_url = url.clone();
        let provider: magnetar_client::ServiceUrlProvider = Arc::new(move || provider_url.lock().unwrap().clone());
        let producer = magnetar_client::ResilientProducer::create(
            provider,
            magnetar_client::ClientOptions::default(),
            topic,
            "rp",
            ProducerAccessMode::Shared,
            magnetar_client::ReconnectOptions { max_pending: 50, ..Default::default() },
        )
        .await
        .expect("resilient producer");
        const N: usize = 400;
        let mut receipts = Vec::new();
        for i in 0..N {
            receipts.push(producer.send_async(OutgoingMessage::new(format!("m{i}"))).await.expect("queue"));
            if i == 150 {
                broker.kill9();
                broker = broker.restart();
                *url.lock().unwrap() = broker.url();
            }
        }
        for (i, r) in receipts.into_iter().enumerate() {
            r.await.expect("receipt channel").unwrap_or_else(|e| panic!("message {i}: {e}"));
        }
        assert!(producer.reconnects() >= 1, "the producer never reconnected");

        let client = Client::connect(&broker.url()).await.expect("connect");
        let consumer = client
            .subscribe(topic, "check")
            .initial_position(magnetar_client::InitialPosition::Earliest)
            .subscribe()
            .await
            .expect("consumer");
        let mut payloads = Vec::new();
        while let Ok(m) = tokio::time::timeout(Duration::from_secs(2), consumer.receive()).await {
            payloads.push(String::from_utf8(m.expect("receive").payload.to_vec()).expect("utf8"));
        }
        let expected: Vec<String> = (0..N).map(|i| format!("m{i}")).collect();
        assert_eq!(payloads.len(), N, "stored {} messages for {N} sent", payloads.len());
        assert_eq!(payloads, expected, "each message once, in order");
        client.close();
    });
}

/// Goal: a 20 MiB message (4× the broker's message limit) is chunked by the
/// producer and reassembled byte for byte by the consumer, compressed or
/// not; without `--chunking` it is refused.
#[test]
fn a_20_mib_message_is_chunked_and_reassembled() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("chunking");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        const SIZE: usize = 20 * 1024 * 1024;
        let topic = "persistent://public/default/big";
        let refused = run_cli(ProduceCmd::new(&url, topic, "nochunk", 1, SIZE).args(), CLI_TIMEOUT);
        assert!(!refused.status.success(), "a 20 MiB message was accepted without chunking");
        assert!(refused.stderr.contains("larger than"), "{}", refused.stderr);
        for (name, extra) in [("chunked", vec![]), ("chunked-lz4", vec!["--compression".to_string(), "lz4".into()])] {
            let mut produce = ProduceCmd::new(&url, topic, name, 2, SIZE);
            produce.extra_args = vec!["--chunking".into()];
            produce.extra_args.extend(extra);
            let receipts = produce.run(Duration::from_secs(60));
            assert_eq!(receipts.len(), 2);
        }
        // The SDK sees each whole message once; its id is its last chunk's.
        let client = Client::connect(&url).await.expect("connect");
        let consumer = client
            .subscribe(topic, "big")
            .initial_position(magnetar_client::InitialPosition::Earliest)
            .subscribe()
            .await
            .expect("consumer");
        let mut got = Vec::new();
        while let Ok(m) = tokio::time::timeout(Duration::from_secs(3), consumer.receive()).await {
            let m = m.expect("receive");
            let (producer, seq) = parse_generated(&m.payload[..64.min(m.payload.len())]).expect("generated payload");
            assert_eq!(m.payload.len(), SIZE, "{producer}:{seq}");
            assert_eq!(&m.payload[..], &magnetar_tests::expected_payload(&producer, seq, SIZE)[..], "{producer}:{seq}");
            consumer.ack(&m.id).await.expect("ack");
            got.push((producer, seq));
        }
        got.sort();
        let want: Vec<(String, u64)> = [("chunked", 0), ("chunked", 1), ("chunked-lz4", 0), ("chunked-lz4", 1)]
            .iter()
            .map(|(p, s)| (p.to_string(), *s))
            .collect();
        assert_eq!(got, want);
        // Everything was acknowledged, chunks included: a new consumer of the
        // subscription gets nothing.
        consumer.close().await.expect("close");
        let again = client.subscribe(topic, "big").subscribe().await.expect("consumer");
        assert!(tokio::time::timeout(Duration::from_secs(1), again.receive()).await.is_err(), "chunks redelivered");
        client.close();
    });
}

/// Goal: a non-persistent topic delivers to the consumer connected now,
/// acknowledges sends without the disk, gives a later consumer nothing of
/// what came before it, and keeps nothing across a restart.
#[test]
fn non_persistent_delivers_to_connected_consumers_only() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("non-persistent");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let topic = "non-persistent://public/default/live";
        let client = Client::connect(&url).await.expect("connect");
        let consumer = client.subscribe(topic, "s").subscribe().await.expect("consumer");
        let producer = client.producer(topic).name("np").create().await.expect("producer");
        let mut ids = Vec::new();
        for i in 0..10 {
            ids.push(producer.send(OutgoingMessage::new(format!("live{i}"))).await.expect("send"));
        }
        for (i, id) in ids.iter().enumerate() {
            let m =
                tokio::time::timeout(Duration::from_secs(5), consumer.receive()).await.expect("in time").expect("m");
            assert_eq!(m.payload, format!("live{i}").as_bytes());
            assert_eq!(m.id, *id);
            consumer.ack(&m.id).await.expect("ack");
        }
        consumer.close().await.expect("close");
        // Nobody listens: acknowledged, and gone.
        for i in 0..5 {
            producer.send(OutgoingMessage::new(format!("lost{i}"))).await.expect("send without consumers");
        }
        let late = client.subscribe(topic, "s").subscribe().await.expect("late consumer");
        producer.send(OutgoingMessage::new("after")).await.expect("send");
        let m = tokio::time::timeout(Duration::from_secs(5), late.receive()).await.expect("in time").expect("m");
        assert_eq!(m.payload, "after".as_bytes(), "a late consumer got a message sent before it came");
        client.close();

        broker.kill9();
        let broker = broker.restart();
        let client = Client::connect(&broker.url()).await.expect("connect");
        let after_restart = client.subscribe(topic, "s").subscribe().await.expect("consumer");
        assert!(
            tokio::time::timeout(Duration::from_millis(500), after_restart.receive()).await.is_err(),
            "a non-persistent message survived a restart"
        );
        client.close();
    });
}
