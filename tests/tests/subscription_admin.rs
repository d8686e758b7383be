//! Issue #21 (and #22's "subscription administration") end to end: an
//! operator's changes to a subscription — create at a position, delete,
//! skip N, clear the backlog, reset the cursor to a time or a message id,
//! expire, peek — from `magnetar admin subscriptions …` and from Pulsar's
//! REST paths, each checked by what a consumer receives next.
//!
//! Method: a real 2-shard broker with its HTTP server on port 0; messages
//! `m0`..`m9` produced 20 ms apart (so that publish times tell them apart),
//! each with key `k<i>` and property `i=<i>`; after each operation a
//! consumer attaches, receives one message and leaves without acknowledging
//! it (so the cursor is only what the operation made it). Resets and forced
//! deletions close connected consumers (as Pulsar does): the test sees the
//! close and subscribes again. The cursor a reset left survives a restart.

use magnetar_client::{BatchingOptions, Client, ClientError, Consumer, InitialPosition, MessageId, OutgoingMessage};
use magnetar_tests::consume::{assert_quiet, receive, topic_stats};
use magnetar_tests::http::request;
use magnetar_tests::{run_async_with_timeout, run_cli, test_dir, BrokerProcess, CliRun};
use std::time::Duration;

const SHARDS: u32 = 2;
const CLI_TIMEOUT: Duration = Duration::from_secs(30);

/// Produces `m0`..`m9` 20 ms apart; returns their ids and publish times.
async fn produce_ten(client: &Client, topic: &str) -> Vec<(MessageId, u64)> {
    let producer = client.producer(topic).create().await.expect("producer");
    let mut out = Vec::new();
    for i in 0..10 {
        let m = OutgoingMessage::new(format!("m{i}")).with_key(format!("k{i}")).with_property("i", i.to_string());
        out.push(producer.send(m).await.expect("send"));
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    producer.close().await.expect("close producer");
    // Publish times, as the broker stored them, from a reader's view.
    let reader = client
        .subscribe(topic, "times-reader")
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .expect("reader");
    let mut with_times = Vec::new();
    for id in out {
        let m = receive(&reader, "publish times").await;
        assert_eq!(m.id, id);
        with_times.push((id, m.publish_time_ms()));
    }
    reader.close().await.expect("close reader");
    with_times
}

async fn subscribe(client: &Client, topic: &str, sub: &str) -> Consumer {
    client
        .subscribe(topic, sub)
        .initial_position(InitialPosition::Latest)
        .subscribe()
        .await
        .unwrap_or_else(|e| panic!("subscribe {sub}: {e}"))
}

/// The payload a fresh consumer of `sub` receives first (it leaves without
/// acknowledging).
async fn next_payload(client: &Client, topic: &str, sub: &str, what: &str) -> String {
    let c = subscribe(client, topic, sub).await;
    let m = receive(&c, what).await;
    c.close().await.expect("close");
    String::from_utf8_lossy(m.payload()).into_owned()
}

/// `c` is closed by the broker: after what its client had queued before
/// the close (at most the 20 messages these tests produce), a receive fails.
async fn assert_closed_by_broker(c: &Consumer, what: &str) {
    for _ in 0..=20 {
        match tokio::time::timeout(Duration::from_secs(10), c.receive()).await {
            Ok(Err(ClientError::Broker { message, .. })) => {
                assert!(message.contains("operator"), "{what}: the close should say why: {message}");
                return;
            }
            Ok(Err(ClientError::ConsumerClosed { .. })) => return,
            Ok(Err(e)) => panic!("{what}: unexpected error {e}"),
            // Queued by the client before the close.
            Ok(Ok(_)) => {}
            Err(_) => panic!("{what}: the consumer was not closed within 10 s"),
        }
    }
    panic!("{what}: the consumer kept receiving; it was not closed");
}

fn admin(url: &str, args: &[&str]) -> CliRun {
    let mut all = vec!["admin", "--url", url, "subscriptions"];
    all.extend_from_slice(args);
    run_cli(all, CLI_TIMEOUT)
}

fn admin_ok(url: &str, args: &[&str]) -> CliRun {
    let run = admin(url, args);
    run.assert_success();
    run
}

fn id_text(id: &MessageId) -> String {
    format!("{}:{}", id.ledger, id.entry)
}

fn subscriptions_of(stats: &serde_json::Value) -> Vec<String> {
    let mut names: Vec<String> = match &stats["subscriptions"] {
        serde_json::Value::Object(m) => m.keys().cloned().collect(),
        serde_json::Value::Array(a) => a.iter().filter_map(|s| s["name"].as_str().map(str::to_string)).collect(),
        _ => Vec::new(),
    };
    names.sort();
    names
}

/// Goal: every `magnetar admin subscriptions` operation changes what a
/// consumer receives next, as documented; refusals are errors with reasons;
/// a reset cursor and a deletion survive a restart.
#[test]
fn cli_operations_change_what_a_consumer_receives_next() {
    run_async_with_timeout(Duration::from_secs(300), || async {
        let dir = test_dir("sub-admin-cli");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let topic = "persistent://public/default/sub-admin-cli";
        let client = Client::connect(&url).await.expect("connect");
        let msgs = produce_ten(&client, topic).await;

        // Create at the earliest message; a second create is refused.
        admin_ok(&url, &["create", topic, "s", "--message-id", "earliest"]);
        let again = admin(&url, &["create", topic, "s"]);
        assert!(!again.status.success() && again.stderr.contains("already exists"), "{}", again.stderr);
        assert_eq!(next_payload(&client, topic, "s", "after create").await, "m0");

        // Peek: the next three, with key, properties and ids; nothing moves.
        let peek = admin_ok(&url, &["peek", topic, "s", "--count", "3"]);
        assert_eq!(peek.stdout_lines.len(), 3, "{:?}", peek.stdout_lines);
        for (i, line) in peek.stdout_lines.iter().enumerate() {
            let v: serde_json::Value = serde_json::from_str(line).expect("peek line is JSON");
            assert_eq!(v["payload"], format!("m{i}"), "{line}");
            assert_eq!(v["key"], format!("k{i}"), "{line}");
            assert_eq!(v["properties"]["i"], i.to_string(), "{line}");
            assert_eq!(v["publish_time_ms"], msgs[i].1, "{line}");
            assert!(v["id"].as_str().unwrap().starts_with(&format!("{}:", id_text(&msgs[i].0))), "{line}");
        }
        assert_eq!(next_payload(&client, topic, "s", "after peek").await, "m0");

        // Skip 2: m2 is next.
        admin_ok(&url, &["skip", topic, "s", "--count", "2"]);
        assert_eq!(next_payload(&client, topic, "s", "after skip 2").await, "m2");

        // Reset to a message id: m7 is next.
        let m7 = id_text(&msgs[7].0);
        admin_ok(&url, &["reset-cursor", topic, "s", "--message-id", &m7]);
        assert_eq!(next_payload(&client, topic, "s", "after reset to m7's id").await, "m7");

        // Reset to a publish time, in RFC 3339: m4 is next (back in time).
        let t4 = humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(msgs[4].1));
        admin_ok(&url, &["reset-cursor", topic, "s", "--time", &t4.to_string()]);
        assert_eq!(next_payload(&client, topic, "s", "after reset to m4's time").await, "m4");

        // Relative: an hour ago is before everything, so m0.
        admin_ok(&url, &["reset-cursor", topic, "s", "--relative", "1h"]);
        assert_eq!(next_payload(&client, topic, "s", "after reset 1h back").await, "m0");

        // A reset closes a connected consumer; subscribing again starts at
        // the new position.
        let connected = subscribe(&client, topic, "s").await;
        assert_eq!(receive(&connected, "before a reset under a consumer").await.payload().as_ref(), b"m0");
        admin_ok(&url, &["reset-cursor", topic, "s", "--message-id", &id_text(&msgs[5].0)]);
        assert_closed_by_broker(&connected, "a consumer under a reset").await;
        assert_eq!(next_payload(&client, topic, "s", "after a reset under a consumer").await, "m5");

        // Expire: nothing is an hour old; after a pause, newer messages stay.
        admin_ok(&url, &["expire", topic, "s", "--expiry-s", "3600"]);
        assert_eq!(next_payload(&client, topic, "s", "after expire 3600").await, "m5");
        // m5.. are over 4 s old after this pause; n0, sent next, is younger
        // than 4 s when the expiry runs.
        tokio::time::sleep(Duration::from_millis(4100)).await;
        let producer = client.producer(topic).create().await.expect("producer");
        producer.send(OutgoingMessage::new("n0")).await.expect("send");
        admin_ok(&url, &["expire", topic, "s", "--expiry-s", "4"]);
        assert_eq!(next_payload(&client, topic, "s", "after expire 2").await, "n0");

        // Clear the backlog: only what comes next is delivered.
        admin_ok(&url, &["clear-backlog", topic, "s"]);
        let c = subscribe(&client, topic, "s").await;
        assert_quiet(&c, Duration::from_millis(500), "after clear-backlog").await;
        producer.send(OutgoingMessage::new("x")).await.expect("send");
        assert_eq!(receive(&c, "after clear-backlog").await.payload().as_ref(), b"x");
        c.close().await.expect("close");

        // Bad input: an unknown subscription, a peek past the backlog.
        let unknown = admin(&url, &["skip", topic, "nope", "--count", "1"]);
        assert!(!unknown.status.success() && unknown.stderr.contains("does not exist"), "{}", unknown.stderr);
        let reset_missing = admin(&url, &["reset-cursor", topic, "s"]);
        assert!(!reset_missing.status.success(), "reset-cursor without a target must fail");

        // Delete: refused while a consumer is connected, forced closes it.
        admin_ok(&url, &["create", topic, "gone", "--message-id", "earliest"]);
        let holder = subscribe(&client, topic, "gone").await;
        let refused = admin(&url, &["delete", topic, "gone"]);
        assert!(!refused.status.success() && refused.stderr.contains("connected"), "{}", refused.stderr);
        assert_eq!(receive(&holder, "after a refused delete").await.payload().as_ref(), b"m0");
        admin_ok(&url, &["delete", topic, "gone", "--force"]);
        assert_closed_by_broker(&holder, "a consumer of a deleted subscription").await;
        assert!(!subscriptions_of(&topic_stats(&client, topic).await).contains(&"gone".to_string()));

        // The reset cursor and the deletion survive a restart.
        admin_ok(&url, &["reset-cursor", topic, "s", "--message-id", &id_text(&msgs[3].0)]);
        producer.close().await.expect("close producer");
        client.close();
        broker.terminate();
        let broker = broker.restart();
        let url = broker.url();
        let client = Client::connect(&url).await.expect("connect after restart");
        let subs = subscriptions_of(&topic_stats(&client, topic).await);
        assert!(subs.contains(&"s".to_string()) && !subs.contains(&"gone".to_string()), "{subs:?}");
        assert_eq!(next_payload(&client, topic, "s", "after restart").await, "m3");
        client.close();
    });
}

/// Goal: Pulsar's REST paths, verbs and status codes for subscriptions,
/// each checked by the next message; a partitioned topic's name applies to
/// every partition.
#[test]
fn rest_subscription_endpoints_follow_pulsar() {
    run_async_with_timeout(Duration::from_secs(300), || async {
        let dir = test_dir("sub-admin-rest");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let (url, http) = (broker.url(), broker.http_addr());
        let topic = "persistent://public/default/sub-admin-rest";
        let base = "/admin/v2/persistent/public/default/sub-admin-rest/subscription";
        let client = Client::connect(&url).await.expect("connect");
        let msgs = produce_ten(&client, topic).await;
        let call = |method: &'static str, path: String, body: Option<String>| async move {
            request(http, method, &path, body.as_deref(), &[]).await
        };

        // Create at earliest (Pulsar's MessageId.earliest); again: 409.
        let earliest = Some(r#"{"ledgerId":-1,"entryId":-1}"#.to_string());
        assert_eq!(call("PUT", format!("{base}/r"), earliest.clone()).await.status, 204);
        let dup = call("PUT", format!("{base}/r"), earliest).await;
        assert_eq!(dup.status, 409, "{}", dup.body);
        assert!(dup.json()["reason"].is_string());

        // Peek position 1: payload as the body, the rest in headers.
        let p = call("GET", format!("{base}/r/position/1"), None).await;
        assert_eq!(p.status, 200, "{}", p.body);
        assert_eq!(p.body, "m0");
        assert_eq!(p.header("X-Pulsar-Message-ID"), Some(id_text(&msgs[0].0).as_str()));
        assert_eq!(p.header("X-Pulsar-partition-key"), Some("k0"));
        assert_eq!(p.header("X-Pulsar-PROPERTY-i"), Some("0"));
        let published = humantime::format_rfc3339_millis(std::time::UNIX_EPOCH + Duration::from_millis(msgs[0].1));
        assert_eq!(p.header("X-Pulsar-publish-time"), Some(published.to_string().as_str()));
        assert_eq!(call("GET", format!("{base}/r/position/3"), None).await.body, "m2");
        assert_eq!(call("GET", format!("{base}/r/position/abc"), None).await.status, 400);
        assert_eq!(call("GET", format!("{base}/r/position/0"), None).await.status, 400);
        assert_eq!(call("GET", format!("{base}/r/position/11"), None).await.status, 404);

        // skip/N, skip/garbage.
        assert_eq!(call("POST", format!("{base}/r/skip/2"), None).await.status, 204);
        assert_eq!(next_payload(&client, topic, "r", "after skip/2").await, "m2");
        assert_eq!(call("POST", format!("{base}/r/skip/two"), None).await.status, 400);

        // resetcursor/{timestamp}, then to a MessageId body.
        assert_eq!(call("POST", format!("{base}/r/resetcursor/{}", msgs[4].1), None).await.status, 204);
        assert_eq!(next_payload(&client, topic, "r", "after resetcursor/{ts}").await, "m4");
        let id7 = format!(r#"{{"ledgerId":{},"entryId":{},"partitionIndex":-1}}"#, msgs[7].0.ledger, msgs[7].0.entry);
        assert_eq!(call("POST", format!("{base}/r/resetcursor"), Some(id7)).await.status, 204);
        assert_eq!(next_payload(&client, topic, "r", "after resetcursor {id}").await, "m7");
        assert_eq!(call("POST", format!("{base}/r/resetcursor"), Some("{nope".into())).await.status, 400);
        assert_eq!(call("POST", format!("{base}/r/resetcursor/yesterday"), None).await.status, 400);

        // A reset under a connected consumer closes it.
        let connected = subscribe(&client, topic, "r").await;
        assert_eq!(receive(&connected, "before a REST reset").await.payload().as_ref(), b"m7");
        assert_eq!(call("POST", format!("{base}/r/resetcursor/0"), None).await.status, 204);
        assert_closed_by_broker(&connected, "a consumer under a REST reset").await;
        assert_eq!(next_payload(&client, topic, "r", "after resetcursor/0").await, "m0");

        // expireMessages: an hour keeps everything, 0 expires everything.
        assert_eq!(call("POST", format!("{base}/r/expireMessages/3600"), None).await.status, 204);
        assert_eq!(call("GET", format!("{base}/r/position/1"), None).await.body, "m0");
        assert_eq!(call("POST", format!("{base}/r/expireMessages/0"), None).await.status, 204);
        assert_eq!(call("GET", format!("{base}/r/position/1"), None).await.status, 404);

        // skip_all after a rewind: nothing left, and the stats agree.
        assert_eq!(call("POST", format!("{base}/r/resetcursor/0"), None).await.status, 204);
        assert_eq!(call("POST", format!("{base}/r/skip_all"), None).await.status, 204);
        let stats = call("GET", "/admin/v2/persistent/public/default/sub-admin-rest/stats".into(), None).await.json();
        assert_eq!(stats["subscriptions"]["r"]["msgBacklog"], 0, "{stats}");

        // Unknown subscription or topic: 404; unsupported: 501 with a reason.
        assert_eq!(call("POST", format!("{base}/nope/skip_all"), None).await.status, 404);
        let no_topic = "/admin/v2/persistent/public/default/no-such-topic/subscription/r/skip_all";
        assert_eq!(call("POST", no_topic.into(), None).await.status, 404);
        let unsupported = call("POST", format!("{base}/r/analyzeBacklog"), None).await;
        assert_eq!(unsupported.status, 501);
        assert!(unsupported.json()["reason"].is_string());

        // Delete: 412 with a consumer, 204 forced, then 404.
        let holder = subscribe(&client, topic, "r").await;
        let refused = call("DELETE", format!("{base}/r"), None).await;
        assert_eq!(refused.status, 412, "{}", refused.body);
        assert_eq!(call("DELETE", format!("{base}/r?force=true"), None).await.status, 204);
        assert_closed_by_broker(&holder, "a consumer of a subscription deleted over REST").await;
        assert_eq!(call("DELETE", format!("{base}/r"), None).await.status, 404);
        let list = call("GET", "/admin/v2/persistent/public/default/sub-admin-rest/subscriptions".into(), None).await;
        assert!(!list.json().as_array().unwrap().iter().any(|s| s == "r"), "{}", list.body);

        // A partitioned topic: the base name applies to every partition.
        let ptopic = "persistent://public/default/sub-admin-part";
        let pbase = "/admin/v2/persistent/public/default/sub-admin-part";
        assert_eq!(call("PUT", format!("{pbase}/partitions"), Some("2".into())).await.status, 204);
        let producer = client
            .producer(ptopic)
            .create_partitioned(magnetar_client::RoutingMode::RoundRobin)
            .await
            .expect("partitioned producer");
        for i in 0..20 {
            producer.send(OutgoingMessage::new(format!("p{i}"))).await.expect("send");
        }
        producer.close().await.expect("close");
        let backlog = |v: serde_json::Value| -> Vec<i64> {
            (0..2)
                .map(|i| {
                    v["partitions"][format!("{ptopic}-partition-{i}")]["subscriptions"]["ps"]["msgBacklog"]
                        .as_i64()
                        .unwrap_or(-1)
                })
                .collect()
        };
        let earliest = Some(r#"{"ledgerId":-1,"entryId":-1}"#.to_string());
        assert_eq!(call("PUT", format!("{pbase}/subscription/ps"), earliest).await.status, 204);
        let full = backlog(call("GET", format!("{pbase}/partitioned-stats"), None).await.json());
        assert_eq!(full.iter().sum::<i64>(), 20, "{full:?}");
        assert!(full.iter().all(|b| *b > 0), "both partitions got messages: {full:?}");
        assert_eq!(call("POST", format!("{pbase}/subscription/ps/skip_all"), None).await.status, 204);
        assert_eq!(backlog(call("GET", format!("{pbase}/partitioned-stats"), None).await.json()), vec![0, 0]);
        assert_eq!(call("POST", format!("{pbase}/subscription/ps/resetcursor/0"), None).await.status, 204);
        assert_eq!(backlog(call("GET", format!("{pbase}/partitioned-stats"), None).await.json()), full);
        assert_eq!(call("GET", format!("{pbase}/subscription/ps/position/1"), None).await.status, 405);
        let id = Some(r#"{"ledgerId":1,"entryId":0}"#.to_string());
        assert_eq!(call("POST", format!("{pbase}/subscription/ps/resetcursor"), id).await.status, 405);
        // One partition by its own name: peek works there.
        let part0 = call("GET", format!("{pbase}-partition-0/subscription/ps/position/1"), None).await;
        assert_eq!(part0.status, 200, "{}", part0.body);
        assert!(part0.body.starts_with('p'), "{}", part0.body);
        assert_eq!(call("DELETE", format!("{pbase}/subscription/ps"), None).await.status, 204);
        let after = call("GET", format!("{pbase}/partitioned-stats"), None).await.json();
        assert_eq!(backlog(after), vec![-1, -1], "the subscription is gone from both partitions");
        client.close();
    });
}

/// The messages of a Pulsar batch payload: each one's
/// `SingleMessageMetadata` (4-byte length first) and payload, as Pulsar's
/// admin client splits a peeked batch.
fn split_pulsar_batch(mut body: &[u8], n: usize) -> Vec<(magnetar_pulsar_wire::proto::SingleMessageMetadata, Vec<u8>)> {
    use prost::Message;
    let mut out = Vec::new();
    for i in 0..n {
        assert!(body.len() >= 4, "message {i}: truncated batch");
        let len = u32::from_be_bytes([body[0], body[1], body[2], body[3]]) as usize;
        let meta = magnetar_pulsar_wire::proto::SingleMessageMetadata::decode(&body[4..4 + len])
            .unwrap_or_else(|e| panic!("message {i}: bad SingleMessageMetadata: {e}"));
        let size = meta.payload_size as usize;
        out.push((meta, body[4 + len..4 + len + size].to_vec()));
        body = &body[4 + len + size..];
    }
    assert!(body.is_empty(), "{} bytes after the batch's {n} messages", body.len());
    out
}

/// Goal: Pulsar's peek answers the n-th *entry*; a batch published by a
/// Magnetar producer comes whole, in Pulsar's batch format (each message
/// with its `SingleMessageMetadata`) with `X-Pulsar-num-batch-message`, so
/// that Pulsar's admin clients split it into every message, as they do a
/// batch published through the Pulsar door.
#[test]
fn rest_peek_of_a_native_batch_answers_every_message() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("sub-admin-peek-batch");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let (url, http) = (broker.url(), broker.http_addr());
        let topic = "persistent://public/default/peek-batch";
        let base = "/admin/v2/persistent/public/default/peek-batch/subscription";
        let client = Client::connect(&url).await.expect("connect");
        let created = request(http, "PUT", "/admin/v2/persistent/public/default/peek-batch", None, &[]).await;
        assert_eq!(created.status, 204, "{}", created.body);
        let earliest = r#"{"ledgerId":-1,"entryId":-1}"#;
        assert_eq!(request(http, "PUT", &format!("{base}/s"), Some(earliest), &[]).await.status, 204);

        let single = client.producer(topic).create().await.expect("producer");
        single.send(OutgoingMessage::new("alone")).await.expect("send");
        single.close().await.expect("close");
        let options = BatchingOptions { max_messages: 5, max_delay: Duration::from_secs(5), ..Default::default() };
        let batched = client.producer(topic).batching(options).create().await.expect("batching producer");
        let mut receipts = Vec::new();
        for i in 0..5 {
            let m = OutgoingMessage::new(format!("b{i}")).with_key(format!("k{i}")).with_property("i", i.to_string());
            receipts.push(batched.send_async(m).await.expect("send"));
        }
        let mut ids = Vec::new();
        for r in receipts {
            ids.push(r.await.expect("receipt"));
        }
        batched.close().await.expect("close");
        assert!(ids.iter().all(|id| (id.ledger, id.entry) == (ids[0].ledger, ids[0].entry)), "one batch: {ids:?}");

        // Position 1: the single message, as before.
        let p = request(http, "GET", &format!("{base}/s/position/1"), None, &[]).await;
        assert_eq!((p.status, p.body.as_str()), (200, "alone"));
        assert_eq!(p.header("X-Pulsar-num-batch-message"), None);
        // Position 2: the whole batch entry.
        let p = request(http, "GET", &format!("{base}/s/position/2"), None, &[]).await;
        assert_eq!(p.status, 200, "{}", p.body);
        assert_eq!(p.header("X-Pulsar-Message-ID"), Some(format!("{}:{}", ids[0].ledger, ids[0].entry).as_str()));
        assert_eq!(p.header("X-Pulsar-num-batch-message"), Some("5"));
        assert_eq!(p.header("X-Pulsar-batch-size"), Some(p.body_bytes.len().to_string().as_str()));
        let messages = split_pulsar_batch(&p.body_bytes, 5);
        for (i, (meta, payload)) in messages.iter().enumerate() {
            assert_eq!(payload, format!("b{i}").as_bytes(), "message {i}");
            assert_eq!(meta.partition_key.as_deref(), Some(format!("k{i}").as_str()), "message {i}");
            let props: Vec<(&str, &str)> = meta.properties.iter().map(|p| (p.key.as_str(), p.value.as_str())).collect();
            assert_eq!(props, vec![("i", i.to_string().as_str())], "message {i}");
        }
        // One entry past the batch: nothing.
        assert_eq!(request(http, "GET", &format!("{base}/s/position/3"), None, &[]).await.status, 404);
        client.close();
    });
}
