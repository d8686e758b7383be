//! Goal: topic-level retention and TTL (issue #3, "per namespace or
//! topic"): a topic's override wins over its namespace's policy, applies to
//! every partition of a partitioned topic, survives `kill -9`, and once
//! removed the namespace's policy applies again.
//!
//! Method: a namespace that keeps everything (`retention -1/-1`), 10-entry
//! ledgers (`--ledger-max-entries 10 --ledger-min-rollover-s 0`) and a
//! retention pass every second; topics without subscriptions (which count
//! as all acknowledged); overrides set through the `magnetar admin topics`
//! CLI; the kept ledgers read from the topic statistics.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{Client, InitialPosition, OutgoingMessage};
use magnetar_tests::consume::{topic_stats as stats, wait_for};
use magnetar_tests::{run_async_with_timeout, run_cli, test_dir, BrokerOptions, BrokerProcess, CliRun};
use std::time::Duration;

const CLI_TIMEOUT: Duration = Duration::from_secs(20);

fn options() -> BrokerOptions {
    let mut o = BrokerOptions::new(2);
    o.extra_args = ["--ledger-max-entries", "10", "--ledger-min-rollover-s", "0", "--retention-check-interval-s", "1"]
        .map(String::from)
        .to_vec();
    o
}

fn admin(url: &str, args: &[&str]) -> CliRun {
    let mut a = vec!["admin", "--url", url];
    a.extend_from_slice(args);
    let run = run_cli(a, CLI_TIMEOUT);
    run.assert_success();
    run
}

async fn produce(client: &Client, topic: &str, n: usize) {
    let producer = client.producer(topic).max_pending(100).create().await.unwrap();
    let mut pending = Vec::new();
    for i in 0..n {
        pending.push(producer.send_async(OutgoingMessage::new(format!("m-{i}-{}", "x".repeat(500)))).await.unwrap());
    }
    for f in pending {
        f.await.unwrap();
    }
    producer.close().await.unwrap();
}

async fn ledger_count(client: &Client, topic: &str) -> usize {
    stats(client, topic).await["ledgers"].as_array().unwrap().len()
}

/// A topic override of 0/0 in a namespace that keeps everything deletes
/// the topic's closed ledgers (and those of every partition of a
/// partitioned topic), but no other topic's; it is still in force after a
/// `kill -9`; removed, the namespace's policy keeps data again.
#[test]
fn topic_retention_override_wins_over_namespace_and_survives_kill9() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("topic-retention");
        let mut broker = BrokerProcess::start_with(dir.path(), &options());
        let url = broker.url();
        let client = Client::connect(&url).await.unwrap();
        client
            .admin()
            .create_namespace("public/keep", serde_json::json!({"retention_minutes": -1, "retention_size_mb": -1}))
            .await
            .unwrap();
        let kept = "persistent://public/keep/kept";
        let short = "persistent://public/keep/short";
        let parted = "persistent://public/keep/parted";
        client.admin().create_partitioned_topic(parted, 2).await.unwrap();
        let parts = [format!("{parted}-partition-0"), format!("{parted}-partition-1")];
        for t in [kept, short, &parts[0], &parts[1]] {
            produce(&client, t, 100).await;
        }
        // Unknown topics are refused; nothing is set yet.
        let missing = run_cli(
            [
                "admin",
                "--url",
                &url,
                "topics",
                "set-retention",
                "public/keep/nope",
                "--time-minutes",
                "0",
                "--size-mb",
                "0",
            ],
            CLI_TIMEOUT,
        );
        assert!(!missing.status.success(), "override of a missing topic accepted");
        assert_eq!(admin(&url, &["topics", "get-retention", short]).stdout_lines, ["null"]);
        // The namespace keeps everything: three passes later, 10 full
        // ledgers and a current one on each topic.
        tokio::time::sleep(Duration::from_secs(3)).await;
        for t in [kept, short, &parts[0], &parts[1]] {
            assert!(ledger_count(&client, t).await >= 10, "{t}: {}", stats(&client, t).await);
        }

        admin(&url, &["topics", "set-retention", short, "--time-minutes", "0", "--size-mb", "0"]);
        admin(&url, &["topics", "set-retention", parted, "--time-minutes", "0", "--size-mb", "0"]);
        let got: serde_json::Value =
            serde_json::from_str(&admin(&url, &["topics", "get-retention", short]).stdout_lines[0]).unwrap();
        assert_eq!(got, serde_json::json!({"retention_minutes": 0, "retention_size_mb": 0}));
        for t in [short, &parts[0], &parts[1]] {
            wait_for(&format!("{t}: override applied"), Duration::from_secs(10), || async {
                ledger_count(&client, t).await == 1
            })
            .await;
        }
        assert!(ledger_count(&client, kept).await >= 10, "the namespace's policy still keeps {kept}");
        assert!(broker.log().contains("topic policies changed"));

        // kill -9, restart: the overrides are still in force.
        client.close();
        broker.kill9();
        broker = broker.restart();
        let url = broker.url();
        let client = Client::connect(&url).await.unwrap();
        let got: serde_json::Value =
            serde_json::from_str(&admin(&url, &["topics", "get-retention", parted]).stdout_lines[0]).unwrap();
        assert_eq!(got["retention_minutes"], 0);
        for t in [short, &parts[1]] {
            produce(&client, t, 50).await;
            wait_for(&format!("{t}: override applied after kill -9"), Duration::from_secs(10), || async {
                ledger_count(&client, t).await == 1
            })
            .await;
        }
        assert!(ledger_count(&client, kept).await >= 10);

        // Removed: the namespace's "keep everything" applies again.
        admin(&url, &["topics", "remove-retention", short]);
        assert_eq!(admin(&url, &["topics", "get-retention", short]).stdout_lines, ["null"]);
        produce(&client, short, 50).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert!(ledger_count(&client, short).await >= 5, "{}", stats(&client, short).await);

        // Deleting the topic deletes its overrides: a new topic of the same
        // name starts with none.
        admin(&url, &["topics", "delete", parted]);
        client.admin().create_partitioned_topic(parted, 2).await.unwrap();
        assert_eq!(admin(&url, &["topics", "get-retention", parted]).stdout_lines, ["null"]);
        client.close();
        broker.terminate();
    });
}

/// A topic TTL in a namespace without TTL expires that topic's backlog
/// only; `remove-message-ttl` stops it.
#[test]
fn topic_ttl_override_expires_only_that_topics_backlog() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("topic-ttl");
        let mut broker = BrokerProcess::start_with(dir.path(), &options());
        let url = broker.url();
        let client = Client::connect(&url).await.unwrap();
        let ttl = "persistent://public/default/ttl";
        let plain = "persistent://public/default/plain";
        for t in [ttl, plain] {
            let c = client.subscribe(t, "s").initial_position(InitialPosition::Earliest).subscribe().await.unwrap();
            c.close().await.unwrap();
            produce(&client, t, 30).await;
        }
        eprintln!("produced; setting the TTL");
        admin(&url, &["topics", "set-message-ttl", ttl, "--ttl-s", "1"]);
        assert_eq!(admin(&url, &["topics", "get-message-ttl", ttl]).stdout_lines, [r#"{"message_ttl_seconds":1}"#]);
        let backlog = |v: serde_json::Value| v["subscriptions"]["s"]["msg_backlog"].as_u64().unwrap();
        wait_for("topic TTL expired the backlog", Duration::from_secs(10), || async {
            backlog(stats(&client, ttl).await) == 0
        })
        .await;
        assert_eq!(backlog(stats(&client, plain).await), 30, "the namespace has no TTL");
        eprintln!("expired; removing the TTL");
        admin(&url, &["topics", "remove-message-ttl", ttl]);
        assert_eq!(admin(&url, &["topics", "get-message-ttl", ttl]).stdout_lines, ["null"]);
        produce(&client, ttl, 10).await;
        tokio::time::sleep(Duration::from_secs(3)).await;
        assert_eq!(backlog(stats(&client, ttl).await), 10, "no TTL after removal");
        client.close();
        broker.terminate();
    });
}
