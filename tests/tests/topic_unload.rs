//! Goal: issue #18's idle topics leave memory (`--topic-idle-unload-s`)
//! and come back unchanged: acks with a hole, deduplication's last sequence
//! id and a delayed message not yet due all survive an unload; a topic with
//! a producer or a consumer attached is never unloaded; a retention pass
//! does not leave every topic of the shard loaded.
//!
//! Method: one-shard brokers with a 1 s idle time; the Rust client
//! produces and consumes; `/metrics` (`magnetar_topics_loaded`,
//! `magnetar_topics_unloaded_total`) shows what is in memory. Topic stats
//! are not read while waiting for an unload: reading them loads the topic.

use magnetar_client::{AckType, Client, Consumer, InitialPosition, MessageId, OutgoingMessage, SubscriptionType};
use magnetar_tests::consume::{assert_quiet, receive, wait_for};
use magnetar_tests::http::{parse_prometheus_text, request};
use magnetar_tests::{run_async_with_timeout, run_cli, test_dir, BrokerOptions, BrokerProcess, TestDir};
use std::net::SocketAddr;
use std::time::Duration;

const CLI_TIMEOUT: Duration = Duration::from_secs(30);

fn options(idle_unload_s: u64, retention_interval_s: Option<u64>) -> BrokerOptions {
    let mut o = BrokerOptions::new(1);
    o.extra_args = vec!["--topic-idle-unload-s".into(), idle_unload_s.to_string()];
    if let Some(s) = retention_interval_s {
        o.extra_args.extend(["--retention-check-interval-s".into(), s.to_string()]);
    }
    o
}

/// A one-shard broker with a 1 s idle time in a fresh directory named
/// after `label`, and a client connected to it; the directory goes with
/// the returned guard.
async fn broker_and_client(label: &str) -> (TestDir, BrokerProcess, Client, SocketAddr) {
    let dir = test_dir(label);
    let broker = BrokerProcess::start_with(dir.path(), &options(1, None));
    let client = Client::connect(&broker.url()).await.expect("connect");
    let http = broker.http_addr();
    (dir, broker, client, http)
}

/// `magnetar_topics_loaded` and `magnetar_topics_unloaded_total`, all shards.
async fn topics(http: SocketAddr) -> (u64, u64) {
    let answer = request(http, "GET", "/metrics", None, &[]).await;
    assert_eq!(answer.status, 200);
    let pick = |name: &str| {
        let found: Vec<f64> = parse_prometheus_text(&answer.body)
            .into_iter()
            .filter(|s| s.name == name && s.labels.get("shard").map(String::as_str) == Some("total"))
            .map(|s| s.value)
            .collect();
        assert_eq!(found.len(), 1, "{name}: {found:?}");
        found[0] as u64
    };
    (pick("magnetar_topics_loaded"), pick("magnetar_topics_unloaded_total"))
}

async fn wait_unloaded(http: SocketAddr, what: &str, unloaded_at_least: u64) {
    wait_for(what, Duration::from_secs(15), || async move {
        let (loaded, unloaded) = topics(http).await;
        loaded == 0 && unloaded >= unloaded_at_least
    })
    .await;
}

async fn subscribe(client: &Client, topic: &str, sub: &str, kind: SubscriptionType) -> Consumer {
    client
        .subscribe(topic, sub)
        .sub_type(kind)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap_or_else(|e| panic!("subscribe {sub}: {e}"))
}

fn admin_ok(url: &str, args: &[&str]) {
    let mut a: Vec<String> = vec!["admin".into()];
    a.extend(args.iter().map(|s| s.to_string()));
    a.extend(["--url".into(), url.into()]);
    let run = run_cli(a, CLI_TIMEOUT);
    assert!(run.status.success(), "magnetar admin {args:?} failed:\n{}", run.stderr);
}

/// Goal: an idle topic is unloaded, and loading it again loses and changes
/// nothing: a consumer gets exactly the unacknowledged messages (an ack
/// hole included), the producer learns its last sequence id, and a resend
/// of a stored sequence id is still dropped.
#[test]
fn an_idle_topic_unloads_and_comes_back_with_its_acks_and_dedup_state() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let (_dir, broker, client, http) = broker_and_client("unload-state").await;
        admin_ok(&broker.url(), &["namespaces", "create", "public/dd"]);
        admin_ok(&broker.url(), &["namespaces", "set-deduplication", "public/dd", "on"]);
        let topic = "persistent://public/dd/unload";
        let msg = |seq: u64| OutgoingMessage::new(format!("m{seq}")).with_sequence_id(seq);

        let c = subscribe(&client, topic, "s", SubscriptionType::Exclusive).await;
        let p = client.producer(topic).name("dp").create().await.expect("producer");
        let mut ids = Vec::new();
        for seq in 0..10 {
            ids.push(p.send(msg(seq)).await.expect("send"));
        }
        for (i, id) in ids.iter().enumerate() {
            let m = receive(&c, "first delivery").await;
            assert_eq!(m.id, *id, "message {i}");
        }
        // 0, 1, 2 and 5 acknowledged: a hole at 3 and 4.
        let acked: Vec<MessageId> = [0, 1, 2, 5].iter().map(|&i| ids[i]).collect();
        c.ack_confirmed(AckType::Individual, &acked).await.expect("ack");
        c.close().await.expect("close consumer");
        p.close().await.expect("close producer");

        wait_unloaded(http, "the idle topic unloaded", 1).await;

        let c = subscribe(&client, topic, "s", SubscriptionType::Exclusive).await;
        for i in [3, 4, 6, 7, 8, 9] {
            let m = receive(&c, "after the unload").await;
            assert_eq!(m.id, ids[i], "unacknowledged message {i} after the unload");
        }
        assert_quiet(&c, Duration::from_millis(500), "everything else was acknowledged").await;
        let p = client.producer(topic).name("dp").create().await.expect("producer again");
        assert_eq!(p.last_sequence_id(), 9, "the last stored sequence id after the unload");
        let again = p.send(msg(5)).await.expect("resend");
        assert!(again == ids[5] || again.ledger == u64::MAX, "a resend answered with a new id: {again:?}");
        assert_quiet(&c, Duration::from_millis(500), "a resend is not stored again").await;
        let new = p.send(msg(10)).await.expect("send 10");
        assert_eq!(receive(&c, "a new message").await.id, new);
        client.close();
    });
}

/// Goal: a delayed message not yet due when its topic is unloaded is
/// delivered at its time after the topic loads again (the delayed index is
/// rebuilt from the log, as after a restart), not before.
#[test]
fn a_delayed_message_survives_an_unload() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let (_dir, _broker, client, http) = broker_and_client("unload-delayed").await;
        let topic = "persistent://public/default/unload-delayed";
        let c = subscribe(&client, topic, "d", SubscriptionType::Shared).await;
        let p = client.producer(topic).create().await.expect("producer");
        let late = p.send(OutgoingMessage::new("late").with_deliver_after(Duration::from_secs(6))).await.unwrap();
        let now = p.send(OutgoingMessage::new("now")).await.unwrap();
        let m = receive(&c, "the undelayed message").await;
        assert_eq!(m.id, now);
        c.ack_confirmed(AckType::Individual, &[now]).await.expect("ack");
        c.close().await.expect("close consumer");
        p.close().await.expect("close producer");

        wait_unloaded(http, "the topic with a delayed message unloaded", 1).await;

        let c = subscribe(&client, topic, "d", SubscriptionType::Shared).await;
        let m = receive(&c, "the delayed message").await;
        assert_eq!(m.id, late);
        let at = m.deliver_at_ms().expect("deliver_at");
        let arrived = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as u64;
        assert!(arrived >= at, "delivered {} ms early", at - arrived);
        client.close();
    });
}

/// Goal: a topic with a consumer, and one with a producer, stay loaded
/// however long they are idle.
#[test]
fn a_topic_with_a_client_attached_stays_loaded() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let (_dir, _broker, client, http) = broker_and_client("unload-attached").await;
        let c = subscribe(&client, "persistent://public/default/with-consumer", "s", SubscriptionType::Shared).await;
        let p = client.producer("persistent://public/default/with-producer").create().await.expect("producer");
        p.send(OutgoingMessage::new("x")).await.expect("send");
        tokio::time::sleep(Duration::from_secs(5)).await;
        assert_eq!(topics(http).await, (2, 0), "(loaded, unloaded) with clients attached");
        // Once they leave, both go.
        c.close().await.expect("close consumer");
        p.close().await.expect("close producer");
        wait_unloaded(http, "both topics unloaded once idle", 2).await;
        client.close();
    });
}

/// Goal: a retention pass loads the topics it checks and unloads again those
/// it loaded, so the shard does not keep every topic in memory after it.
/// Method: 20 topics with a message and a subscription each; a restart with
/// an idle time of an hour (the sweep unloads nothing) and a pass every
/// second: after a few passes at most the one topic a pass is on is loaded,
/// and every one was unloaded at least once.
#[test]
fn a_retention_pass_leaves_the_topics_it_loaded_unloaded() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("unload-retention");
        const TOPICS: u64 = 20;
        let mut broker = BrokerProcess::start_with(dir.path(), &options(3600, None));
        let client = Client::connect(&broker.url()).await.expect("connect");
        for i in 0..TOPICS {
            let topic = format!("persistent://public/default/kept-{i}");
            let c = subscribe(&client, &topic, "s", SubscriptionType::Shared).await;
            let p = client.producer(&topic).create().await.expect("producer");
            p.send(OutgoingMessage::new("x")).await.expect("send");
            p.close().await.expect("close producer");
            c.close().await.expect("close consumer");
        }
        client.close();
        assert_eq!(topics(broker.http_addr()).await, (TOPICS, 0));
        broker.terminate();
        let broker = BrokerProcess::start_with(dir.path(), &options(3600, Some(1)));
        let http = broker.http_addr();
        tokio::time::sleep(Duration::from_secs(4)).await;
        let (loaded, unloaded) = topics(http).await;
        assert!(loaded <= 1, "{loaded} topics still loaded after retention passes");
        assert!(unloaded >= TOPICS, "only {unloaded} unloaded: did the passes run over every topic?");
    });
}
