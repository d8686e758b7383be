//! Issue #21 end to end: the broker's HTTP server — Prometheus metrics after
//! a known workload, the probes and the health check, and the REST admin's
//! status codes and JSON shapes (Pulsar's), then its topics used from the
//! native CLI.
//!
//! Method: a real 2-shard broker with its HTTP server on port 0; the CLI
//! produces and consumes a counted workload; `/metrics` is parsed with a
//! grammar-based Prometheus text parser (openmetrics-parser) and its counts compared
//! exactly.

use magnetar_client::{Client, OutgoingMessage, SubscriptionType};
use magnetar_tests::http::{parse_prometheus_text, request};
use magnetar_tests::{run_async_with_timeout, run_cli, test_dir, BrokerProcess, ConsumeCmd, ProduceCmd};
use std::collections::HashMap;
use std::time::Duration;

const SHARDS: u32 = 2;
const CLI_TIMEOUT: Duration = Duration::from_secs(60);

type Samples = HashMap<String, Vec<(HashMap<String, String>, f64)>>;

/// The samples of a text exposition (every line must parse), by name.
fn parse_metrics(text: &str) -> Samples {
    let mut out: Samples = HashMap::new();
    for s in parse_prometheus_text(text) {
        out.entry(s.name).or_default().push((s.labels, s.value));
    }
    out
}

/// The one sample of `name` whose labels include `want`.
fn sample(m: &Samples, name: &str, want: &[(&str, &str)]) -> f64 {
    let found: Vec<f64> = m
        .get(name)
        .unwrap_or_else(|| panic!("no metric {name}"))
        .iter()
        .filter(|(l, _)| want.iter().all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v)))
        .map(|(_, v)| *v)
        .collect();
    assert_eq!(found.len(), 1, "{name}{want:?}: {found:?}");
    found[0]
}

/// Goal: after producing 150 messages and consuming 100 of them, the
/// scraped Pulsar and Magnetar counts are exact; every line of both
/// formats parses; the probes say 200 and the health check really
/// produces and consumes.
#[test]
fn metrics_count_a_known_workload_exactly_and_probes_answer() {
    run_async_with_timeout(Duration::from_secs(180), || async {
        let dir = test_dir("http-metrics");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let http = broker.http_addr();
        let url = broker.url();
        let topic = "persistent://public/default/http-metrics";

        assert_eq!(request(http, "GET", "/healthz", None, &[]).await.status, 200);
        assert_eq!(request(http, "GET", "/ready", None, &[]).await.status, 200);
        assert_eq!(request(http, "GET", "/admin/v2/brokers/ready", None, &[]).await.status, 200);

        // Two subscriptions first, so that they see every message; s1
        // then reads and acknowledges everything, s2 nothing.
        for name in ["s1", "s2"] {
            let mut sub = ConsumeCmd::new(&url, topic, name);
            sub.idle_timeout_s = 0.5;
            assert!(sub.run(CLI_TIMEOUT).is_empty());
        }
        ProduceCmd::new(&url, topic, "p1", 150, 100).run(CLI_TIMEOUT);
        let mut consume = ConsumeCmd::new(&url, topic, "s1");
        consume.count = 150;
        assert_eq!(consume.run(CLI_TIMEOUT).len(), 150);

        let answer = request(http, "GET", "/metrics", None, &[]).await;
        assert_eq!(answer.status, 200);
        assert!(answer.content_type.starts_with("text/plain; version=0.0.4"), "{}", answer.content_type);
        assert!(!answer.body.contains("# EOF"));
        let m = parse_metrics(&answer.body);
        let t = [("cluster", "standalone"), ("namespace", "public/default"), ("topic", topic)];
        assert_eq!(sample(&m, "pulsar_in_messages_total", &t), 150.0);
        assert_eq!(sample(&m, "pulsar_out_messages_total", &t), 150.0);
        assert_eq!(sample(&m, "pulsar_msg_backlog", &t), 150.0);
        assert_eq!(sample(&m, "pulsar_subscriptions_count", &t), 2.0);
        assert_eq!(sample(&m, "pulsar_producers_count", &t), 0.0);
        assert!(sample(&m, "pulsar_storage_size", &t) >= 150.0 * 100.0);
        let s = [("topic", topic), ("subscription", "s1")];
        assert_eq!(sample(&m, "pulsar_subscription_back_log", &s), 0.0);
        assert_eq!(sample(&m, "pulsar_subscription_back_log", &[("topic", topic), ("subscription", "s2")]), 150.0);
        assert_eq!(sample(&m, "pulsar_subscription_unacked_messages", &s), 0.0);
        assert_eq!(sample(&m, "pulsar_subscription_delayed", &s), 0.0);
        // The broker's own counters: this workload is all there was.
        assert_eq!(sample(&m, "magnetar_messages_in_total", &[("shard", "total")]), 150.0);
        let per_shard: f64 =
            (0..SHARDS).map(|i| sample(&m, "magnetar_messages_in_total", &[("shard", i.to_string().as_str())])).sum();
        assert_eq!(per_shard, 150.0);
        assert_eq!(sample(&m, "magnetar_publish_latency_seconds", &[("shard", "total")]), 150.0);
        assert!(sample(&m, "magnetar_group_commits_total", &[("shard", "total")]) >= 1.0);
        assert!(sample(&m, "magnetar_bytes_synced_total", &[("shard", "total")]) >= 15_000.0);
        assert_eq!(sample(&m, "magnetar_inflight_bytes", &[("shard", "total")]), 0.0);
        assert_eq!(sample(&m, "magnetar_storage_full", &[("shard", "total")]), 0.0);
        for name in ["magnetar_recovery_seconds", "magnetar_connections", "magnetar_disk_used_percent"] {
            assert!(m.contains_key(name), "no {name}");
        }

        // OpenMetrics when asked.
        let om =
            request(http, "GET", "/metrics", None, &[("accept", "application/openmetrics-text; version=1.0.0")]).await;
        assert_eq!(om.status, 200);
        assert!(om.content_type.starts_with("application/openmetrics-text"), "{}", om.content_type);
        assert!(om.body.ends_with("# EOF\n"));
        assert!(om.body.contains("# TYPE pulsar_in_messages counter"));
        openmetrics_parser::openmetrics::parse_openmetrics(&om.body)
            .unwrap_or_else(|e| panic!("the OpenMetrics exposition does not parse: {e}"));

        // The health check produces and consumes through the broker.
        let h = request(http, "GET", "/admin/v2/brokers/health", None, &[]).await;
        assert_eq!((h.status, h.body.as_str()), (200, "ok"));
        let m = parse_metrics(&request(http, "GET", "/metrics", None, &[]).await.body);
        assert_eq!(sample(&m, "magnetar_messages_in_total", &[("shard", "total")]), 151.0);
    });
}

/// Goal: each REST endpoint answers Pulsar's status code and JSON fields,
/// bad input answers Pulsar's error codes with a JSON reason, and what
/// Magnetar lacks answers 501. A partitioned topic created and a namespace
/// given dedup over REST are then used from the native CLI.
#[test]
fn rest_admin_answers_pulsars_codes_and_shapes() {
    run_async_with_timeout(Duration::from_secs(180), || async {
        let dir = test_dir("http-rest");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let http = broker.http_addr();
        let url = broker.url();

        // (method, path, body, status, JSON check)
        type Check = fn(&serde_json::Value) -> bool;
        type Row = (&'static str, &'static str, Option<&'static str>, u16, Option<Check>);
        let table: Vec<Row> = vec![
            ("GET", "/admin/v2/clusters", None, 200, Some(|v| v == &serde_json::json!(["standalone"]))),
            ("GET", "/admin/v2/clusters/standalone", None, 200, None),
            ("GET", "/admin/v2/clusters/elsewhere", None, 404, Some(|v| v["reason"].is_string())),
            ("GET", "/admin/v2/tenants", None, 200, Some(|v| v == &serde_json::json!(["public"]))),
            ("PUT", "/admin/v2/tenants/acme", Some(r#"{"adminRoles":[],"allowedClusters":["standalone"]}"#), 204, None),
            ("PUT", "/admin/v2/tenants/acme", Some("{}"), 409, Some(|v| v["reason"].is_string())),
            ("PUT", "/admin/v2/tenants/bad", Some("{not json"), 400, Some(|v| v["reason"].is_string())),
            ("PUT", "/admin/v2/tenants/bad", Some(r#"{"color":"red"}"#), 400, None),
            (
                "GET",
                "/admin/v2/tenants/acme",
                None,
                200,
                Some(|v| v["allowedClusters"] == serde_json::json!(["standalone"])),
            ),
            ("GET", "/admin/v2/tenants/nobody", None, 404, None),
            ("PUT", "/admin/v2/namespaces/acme/orders", None, 204, None),
            ("PUT", "/admin/v2/namespaces/acme/orders", None, 409, None),
            ("PUT", "/admin/v2/namespaces/nobody/ns", None, 404, None),
            ("GET", "/admin/v2/namespaces/acme", None, 200, Some(|v| v == &serde_json::json!(["acme/orders"]))),
            ("POST", "/admin/v2/namespaces/acme/orders/deduplication", Some("true"), 204, None),
            (
                "GET",
                "/admin/v2/namespaces/acme/orders/deduplication",
                None,
                200,
                Some(|v| v == &serde_json::json!(true)),
            ),
            ("POST", "/admin/v2/namespaces/acme/orders/messageTTL", Some("3600"), 204, None),
            ("GET", "/admin/v2/namespaces/acme/orders/messageTTL", None, 200, Some(|v| v == &serde_json::json!(3600))),
            (
                "POST",
                "/admin/v2/namespaces/acme/orders/retention",
                Some(r#"{"retentionTimeInMinutes":60,"retentionSizeInMB":10}"#),
                204,
                None,
            ),
            (
                "GET",
                "/admin/v2/namespaces/acme/orders/retention",
                None,
                200,
                Some(|v| v["retentionTimeInMinutes"] == 60 && v["retentionSizeInMB"] == 10),
            ),
            ("POST", "/admin/v2/namespaces/acme/orders/retention", Some("7"), 400, None),
            (
                "GET",
                "/admin/v2/namespaces/acme/orders",
                None,
                200,
                Some(|v| {
                    v["deduplicationEnabled"] == true
                        && v["message_ttl_in_seconds"] == 3600
                        && v["bundles"]["numBundles"].is_u64()
                }),
            ),
            ("GET", "/admin/v2/namespaces/acme/orders/bundles", None, 200, Some(|v| v["boundaries"].is_array())),
            ("GET", "/admin/v2/namespaces/acme/orders/antiAffinity", None, 501, Some(|v| v["reason"].is_string())),
            ("PUT", "/admin/v2/persistent/acme/orders/p/partitions", Some("3"), 204, None),
            ("PUT", "/admin/v2/persistent/acme/orders/p/partitions", Some("3"), 409, None),
            ("PUT", "/admin/v2/persistent/acme/orders/z/partitions", Some("0"), 406, None),
            ("GET", "/admin/v2/persistent/acme/orders/p/partitions", None, 200, Some(|v| v["partitions"] == 3)),
            ("POST", "/admin/v2/persistent/acme/orders/p/partitions", Some("4"), 204, None),
            ("GET", "/admin/v2/persistent/acme/orders/p/partitions", None, 200, Some(|v| v["partitions"] == 4)),
            ("PUT", "/admin/v2/persistent/acme/orders/single", None, 204, None),
            (
                "GET",
                "/admin/v2/persistent/acme/orders/partitioned",
                None,
                200,
                Some(|v| v == &serde_json::json!(["persistent://acme/orders/p"])),
            ),
            (
                "GET",
                "/admin/v2/persistent/acme/orders",
                None,
                200,
                Some(|v| v.as_array().map(Vec::len) == Some(5) && v[0] == "persistent://acme/orders/p-partition-0"),
            ),
            (
                "GET",
                "/admin/v2/persistent/acme/orders/single/stats",
                None,
                200,
                Some(|v| v["msgRateIn"].is_number() && v["subscriptions"].is_object() && v["storageSize"].is_u64()),
            ),
            (
                "GET",
                "/admin/v2/persistent/acme/orders/single/internalStats",
                None,
                200,
                Some(|v| v["ledgers"].is_array() && v["entriesAddedCounter"].is_u64()),
            ),
            ("GET", "/admin/v2/persistent/acme/orders/single/lastMessageId", None, 200, Some(|v| v["ledgerId"] == -1)),
            (
                "GET",
                "/admin/v2/persistent/acme/orders/single/subscriptions",
                None,
                200,
                Some(|v| v == &serde_json::json!([])),
            ),
            (
                "GET",
                "/admin/v2/persistent/acme/orders/p/partitioned-stats",
                None,
                200,
                Some(|v| v["metadata"]["partitions"] == 4 && v["partitions"].as_object().map(|o| o.len()) == Some(4)),
            ),
            ("GET", "/admin/v2/persistent/acme/orders/single/partitioned-stats", None, 404, None),
            ("GET", "/admin/v2/persistent/nobody/ns/t/stats", None, 404, None),
            // Subscription operations: tests/tests/subscription_admin.rs.
            (
                "DELETE",
                "/admin/v2/persistent/acme/orders/single/subscription/s",
                None,
                404,
                Some(|v| v["reason"].is_string()),
            ),
            ("GET", "/admin/v2/non-persistent/acme/orders", None, 200, Some(|v| v == &serde_json::json!([]))),
            ("GET", "/admin/v2/schemas/acme/orders/p/schema", None, 501, None),
            ("DELETE", "/admin/v2/namespaces/acme/orders", None, 409, None),
            ("DELETE", "/admin/v2/persistent/acme/orders/single", None, 204, None),
            ("DELETE", "/admin/v2/persistent/acme/orders/single", None, 404, None),
            ("POST", "/metrics", None, 405, None),
            ("GET", "/nowhere", None, 404, None),
        ];
        for (method, path, body, status, check) in table {
            let a = request(http, method, path, body, &[]).await;
            assert_eq!(a.status, status, "{method} {path}: {}", a.body);
            if let Some(check) = check {
                let v = a.json();
                assert!(check(&v), "{method} {path}: unexpected JSON {v}");
            }
            if a.status >= 400 && !a.body.is_empty() {
                assert!(a.json()["reason"].is_string(), "{method} {path}: error without a reason: {}", a.body);
            }
        }

        // A body above the bound is refused.
        let huge = "1".repeat(2 * 1024 * 1024);
        let a = request(http, "POST", "/admin/v2/namespaces/acme/orders/messageTTL", Some(&huge), &[]).await;
        assert_eq!(a.status, 413, "{}", a.body);

        // The partitioned topic and the namespace's policies, used from the
        // native CLI.
        let topic = "persistent://acme/orders/p";
        ProduceCmd::new(&url, topic, "dedup-producer", 40, 10).run(CLI_TIMEOUT);
        let stats =
            request(http, "GET", "/admin/v2/persistent/acme/orders/p/partitioned-stats", None, &[]).await.json();
        assert_eq!(stats["metadata"]["partitions"], 4, "{stats}");
        let mut consume = ConsumeCmd::new(&url, topic, "all");
        consume.count = 40;
        assert_eq!(consume.run(CLI_TIMEOUT).len(), 40);
        // The native admin CLI sees what REST set.
        let run = run_cli(["admin", "namespaces", "policies", "acme/orders", "--url", &url], CLI_TIMEOUT);
        assert!(run.status.success(), "{}", run.stderr);
        let p: serde_json::Value = serde_json::from_str(&run.stdout_lines.join("")).expect("policies JSON");
        assert_eq!(p["deduplication"], true, "{p}");
        assert_eq!(p["message_ttl_seconds"], 3600, "{p}");
        let run = run_cli(["admin", "topics", "get-partitioned-metadata", topic, "--url", &url], CLI_TIMEOUT);
        assert!(run.status.success(), "{}", run.stderr);
        assert_eq!(run.stdout_lines, vec![r#"{"partitions":4}"#.to_string()]);
    });
}

/// Goal: non-persistent topics have Pulsar's REST endpoints where they make
/// sense (list, partitions, stats, partitioned-stats, subscriptions,
/// delete), 501 with a reason where Magnetar keeps nothing to show or move,
/// and their series in /metrics under the same names as persistent topics'
/// with `topic="non-persistent://..."`, counted exactly.
#[test]
fn non_persistent_topics_in_rest_and_metrics() {
    run_async_with_timeout(Duration::from_secs(180), || async {
        let dir = test_dir("http-non-persistent");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let http = broker.http_addr();
        let np = "/admin/v2/non-persistent/public/default";
        // (method, path, body, status, JSON check)
        type Check = fn(&serde_json::Value) -> bool;
        type Row = (&'static str, String, Option<&'static str>, u16, Option<Check>);
        let rows: Vec<Row> = vec![
            ("GET", np.to_string(), None, 200, Some(|v| v == &serde_json::json!([]))),
            ("PUT", format!("{np}/np-p/partitions"), Some("2"), 204, None),
            ("PUT", format!("{np}/np-p/partitions"), Some("2"), 409, None),
            ("GET", format!("{np}/np-p/partitions"), None, 200, Some(|v| v["partitions"] == 2)),
            ("POST", format!("{np}/np-p/partitions"), Some("3"), 204, None),
            ("GET", format!("{np}/np-p/partitions"), None, 200, Some(|v| v["partitions"] == 3)),
            (
                "GET",
                format!("{np}/partitioned"),
                None,
                200,
                Some(|v| v == &serde_json::json!(["non-persistent://public/default/np-p"])),
            ),
            (
                "GET",
                np.to_string(),
                None,
                200,
                Some(|v| {
                    v.as_array().map(Vec::len) == Some(3) && v[0] == "non-persistent://public/default/np-p-partition-0"
                }),
            ),
            (
                "GET",
                format!("{np}/np-p/partitioned-stats"),
                None,
                200,
                Some(|v| v["metadata"]["partitions"] == 3 && v["partitions"].as_object().map(|o| o.len()) == Some(3)),
            ),
            // Not in use: not there.
            ("GET", format!("{np}/idle/stats"), None, 404, None),
            ("GET", format!("{np}/idle/subscriptions"), None, 404, None),
            ("GET", format!("{np}/idle/partitioned-stats"), None, 404, None),
            ("DELETE", format!("{np}/idle"), None, 404, None),
            // What Magnetar keeps nothing of.
            ("PUT", format!("{np}/idle"), None, 501, None),
            ("GET", format!("{np}/idle/internalStats"), None, 501, None),
            ("GET", format!("{np}/idle/lastMessageId"), None, 501, None),
            ("PUT", format!("{np}/idle/subscription/s"), None, 501, None),
            ("POST", format!("{np}/idle/subscription/s/skip_all"), None, 501, None),
            ("GET", format!("{np}/idle/subscription/s/position/1"), None, 501, None),
            ("GET", "/admin/v2/non-persistent/nobody/ns".to_string(), None, 404, None),
            ("DELETE", format!("{np}/np-p/partitions"), None, 204, None),
            ("GET", format!("{np}/np-p/partitions"), None, 200, Some(|v| v["partitions"] == 0)),
        ];
        for (method, path, body, status, check) in rows {
            let a = request(http, method, &path, body, &[]).await;
            assert_eq!(a.status, status, "{method} {path}: {}", a.body);
            if let Some(check) = check {
                let v = a.json();
                assert!(check(&v), "{method} {path}: unexpected JSON {v}");
            }
            if a.status >= 400 {
                assert!(a.json()["reason"].is_string(), "{method} {path}: error without a reason: {}", a.body);
            }
        }

        // A topic in use: a consumer and a producer attached.
        let topic = "non-persistent://public/default/np-live";
        let client = Client::connect(&broker.url()).await.expect("connect");
        let consumer =
            client.subscribe(topic, "watch").sub_type(SubscriptionType::Shared).subscribe().await.expect("subscribe");
        let producer = client.producer(topic).create().await.expect("producer");
        // Flow permits travel after the subscribe answer.
        tokio::time::sleep(Duration::from_millis(300)).await;
        const N: usize = 20;
        for i in 0..N {
            producer.send(OutgoingMessage::new(format!("m{i:02}"))).await.expect("send");
        }
        for _ in 0..N {
            tokio::time::timeout(Duration::from_secs(10), consumer.receive()).await.expect("in time").expect("receive");
        }
        let list = request(http, "GET", np, None, &[]).await.json();
        assert_eq!(list, serde_json::json!([topic]), "{list}");
        let stats = request(http, "GET", &format!("{np}/np-live/stats"), None, &[]).await;
        assert_eq!(stats.status, 200, "{}", stats.body);
        let stats = stats.json();
        assert_eq!(stats["storageSize"], 0, "{stats}");
        assert!(stats["msgRateIn"].is_number(), "{stats}");
        assert_eq!(stats["subscriptions"]["watch"]["type"], "Shared", "{stats}");
        assert_eq!(stats["subscriptions"]["watch"]["consumers"].as_array().map(Vec::len), Some(1), "{stats}");
        let subs = request(http, "GET", &format!("{np}/np-live/subscriptions"), None, &[]).await.json();
        assert_eq!(subs, serde_json::json!(["watch"]));
        let refused = request(http, "DELETE", &format!("{np}/np-live"), None, &[]).await;
        assert_eq!(refused.status, 409, "in use: {}", refused.body);

        let m = parse_metrics(&request(http, "GET", "/metrics", None, &[]).await.body);
        let t = [("cluster", "standalone"), ("namespace", "public/default"), ("topic", topic)];
        assert_eq!(sample(&m, "pulsar_in_messages_total", &t), N as f64);
        assert_eq!(sample(&m, "pulsar_out_messages_total", &t), N as f64);
        assert_eq!(sample(&m, "pulsar_in_bytes_total", &t), sample(&m, "pulsar_out_bytes_total", &t));
        assert_eq!(sample(&m, "pulsar_producers_count", &t), 1.0);
        assert_eq!(sample(&m, "pulsar_consumers_count", &t), 1.0);
        assert_eq!(sample(&m, "pulsar_subscriptions_count", &t), 1.0);
        assert_eq!(sample(&m, "pulsar_storage_size", &t), 0.0);
        assert_eq!(sample(&m, "pulsar_msg_backlog", &t), 0.0);
        assert_eq!(
            sample(&m, "pulsar_subscription_consumers_count", &[("topic", topic), ("subscription", "watch")]),
            1.0
        );

        // Once nobody uses it, it is gone from both.
        producer.close().await.expect("close producer");
        consumer.close().await.expect("close consumer");
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(request(http, "GET", &format!("{np}/np-live/stats"), None, &[]).await.status, 404);
        let body = request(http, "GET", "/metrics", None, &[]).await.body;
        assert!(!body.contains("np-live"), "a topic nobody uses is not exported");
        client.close();
    });
}
