//! Issue #3: `magnetar admin messages find TOPIC --key K [--before T]
//! [--limit N]` against a real broker.
//!
//! Goal: the newest messages with the key come first, exactly those with the
//! key (the index stores 32-bit hashes; the broker confirms each), with
//! their properties and payload (text, or base64 when not UTF-8); `--before`
//! keeps only older ones; `--limit` cuts; messages inside a key-based batch
//! are found one by one; a partitioned topic is searched in every
//! partition; the answers are the same after `kill -9` and a restart (the
//! key index is rebuilt from the recovered log).
//!
//! Method: a 2-shard broker whose topics roll over to a new ledger every 7
//! entries; messages sent through the SDK with known keys,
//! payloads and properties; the CLI's JSON lines compared with that model.

use magnetar_client::{BatchingOptions, Client, OutgoingMessage};
use magnetar_tests::{run_async_with_timeout, run_cli, test_dir, BrokerOptions, BrokerProcess};
use serde_json::Value;
use std::time::Duration;

const CLI_TIMEOUT: Duration = Duration::from_secs(30);

fn admin_ok(url: &str, args: &[&str]) -> Vec<String> {
    let mut a: Vec<String> = vec!["admin".into()];
    a.extend(args.iter().map(|s| s.to_string()));
    a.extend(["--url".to_string(), url.to_string()]);
    let run = run_cli(a, CLI_TIMEOUT);
    run.assert_success();
    run.stdout_lines
}

fn find(url: &str, topic: &str, key: &str, extra: &[&str]) -> Vec<Value> {
    let mut args = vec!["messages", "find", topic, "--key", key];
    args.extend_from_slice(extra);
    admin_ok(url, &args)
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

fn payloads(found: &[Value]) -> Vec<String> {
    found.iter().map(|m| m["payload"].as_str().unwrap_or("<none>").to_string()).collect()
}

#[test]
fn find_by_key_newest_first_before_limit_partitions_and_after_kill9() {
    run_async_with_timeout(Duration::from_secs(180), || async {
        let dir = test_dir("find-messages");
        // Ledgers roll over every 7 entries, so one key's messages span
        // many ledgers of the topic.
        let mut options = BrokerOptions::new(2);
        options.extra_args =
            ["--ledger-max-entries", "7", "--ledger-min-rollover-s", "0"].iter().map(|s| s.to_string()).collect();
        let mut broker = BrokerProcess::start_with(dir.path(), &options);
        let url = broker.url();
        let client = Client::connect(&url).await.expect("connect");

        // A plain topic: 200 messages over 5 keys, one binary payload.
        let p = client.producer("find-plain").create().await.expect("producer");
        for i in 0..200u32 {
            let m =
                OutgoingMessage::new(format!("m{i}")).with_key(format!("k{}", i % 5)).with_property("i", i.to_string());
            p.send(m).await.expect("send");
        }
        p.send(OutgoingMessage::new(vec![0xffu8, 0x00, 0x80]).with_key("bin")).await.expect("send");
        // Key-based batches: messages inside batches, found one by one.
        let batching = BatchingOptions { key_based: true, max_delay: Duration::from_millis(50), ..Default::default() };
        let b = client.producer("find-batched").batching(batching).create().await.expect("batching producer");
        let mut sends = Vec::new();
        for i in 0..30u32 {
            let key = if i % 3 == 0 { "kb" } else { "other" };
            sends.push(b.send_async(OutgoingMessage::new(format!("b{i}")).with_key(key)).await.expect("queue"));
        }
        for s in sends {
            s.await.expect("batched send");
        }
        // A partitioned topic with the same key in every partition.
        admin_ok(&url, &["topics", "create-partitioned", "find-part", "--partitions", "3"]);
        for part in 0..3u32 {
            let pp = client.producer(format!("find-part-partition-{part}")).create().await.expect("partition producer");
            for i in 0..10u32 {
                pp.send(OutgoingMessage::new(format!("p{part}-{i}")).with_key("pk")).await.expect("send");
            }
        }
        client.close();

        let check = |url: &str, when: &str| {
            // Newest first, only the key, with properties.
            let all = find(url, "find-plain", "k3", &["--limit", "1000"]);
            let want: Vec<String> = (0..200u32).rev().filter(|i| i % 5 == 3).map(|i| format!("m{i}")).collect();
            assert_eq!(payloads(&all), want, "{when}");
            for m in &all {
                assert_eq!(m["key"], "k3", "{when}: {m}");
                let i = m["payload"].as_str().unwrap().trim_start_matches('m');
                assert_eq!(m["properties"]["i"], i, "{when}: {m}");
                assert_eq!(m["payload_size"], m["payload"].as_str().unwrap().len(), "{when}: {m}");
                assert_eq!(m["topic"], "persistent://public/default/find-plain", "{when}: {m}");
                let id = m["id"].as_str().unwrap();
                assert!(id.ends_with(":-1:-1") && id.split(':').count() == 4, "{when}: id {id}");
            }
            let ledgers: std::collections::BTreeSet<&str> =
                all.iter().map(|m| m["id"].as_str().unwrap().split(':').next().unwrap()).collect();
            assert!(ledgers.len() > 5, "{when}: one key over several ledgers: {ledgers:?}");
            let ts: Vec<u64> = all.iter().map(|m| m["publish_time_ms"].as_u64().unwrap()).collect();
            assert!(ts.windows(2).all(|w| w[0] >= w[1]), "{when}: not newest first: {ts:?}");
            // --limit: the newest N.
            assert_eq!(payloads(&find(url, "find-plain", "k3", &["--limit", "5"])), want[..5].to_vec(), "{when}");
            // Default limit 10.
            assert_eq!(find(url, "find-plain", "k3", &[]).len(), 10, "{when}");
            // --before: only older ones (ms, and the same as RFC 3339).
            let t = ts[ts.len() / 2];
            let older: Vec<String> = all
                .iter()
                .filter(|m| m["publish_time_ms"].as_u64().unwrap() < t)
                .map(|m| m["payload"].as_str().unwrap().to_string())
                .collect();
            assert!(!older.is_empty() || ts.iter().all(|x| *x >= t));
            let before = find(url, "find-plain", "k3", &["--limit", "1000", "--before", &t.to_string()]);
            assert_eq!(payloads(&before), older, "{when}: --before {t}");
            let secs = t / 1000;
            let rfc = humantime_like(secs, t % 1000);
            assert_eq!(
                payloads(&find(url, "find-plain", "k3", &["--limit", "1000", "--before", &rfc])),
                older,
                "{when}: --before {rfc}"
            );
            // Not UTF-8: base64.
            let bin = find(url, "find-plain", "bin", &[]);
            assert_eq!(bin.len(), 1, "{when}: {bin:?}");
            assert_eq!(bin[0]["payload_base64"], "/wCA", "{when}: {bin:?}");
            assert!(bin[0].get("payload").is_none());
            // No such key.
            assert!(find(url, "find-plain", "nope", &[]).is_empty(), "{when}");
            // Inside key-based batches.
            let kb = find(url, "find-batched", "kb", &["--limit", "100"]);
            let want: Vec<String> = (0..30u32).rev().filter(|i| i % 3 == 0).map(|i| format!("b{i}")).collect();
            let mut got = payloads(&kb);
            got.sort_by_key(|p| std::cmp::Reverse(p[1..].parse::<u32>().unwrap()));
            assert_eq!(got, want, "{when}: {kb:?}");
            assert!(kb.iter().any(|m| !m["id"].as_str().unwrap().ends_with(":-1")), "{when}: no batch index in {kb:?}");
            // Every partition.
            let pk = find(url, "find-part", "pk", &["--limit", "100"]);
            assert_eq!(pk.len(), 30, "{when}: {pk:?}");
            for part in 0..3 {
                let topic = format!("persistent://public/default/find-part-partition-{part}");
                let mine: Vec<String> = pk
                    .iter()
                    .filter(|m| m["topic"] == topic.as_str())
                    .map(|m| m["payload"].as_str().unwrap().to_string())
                    .collect();
                let want: Vec<String> = (0..10).rev().map(|i| format!("p{part}-{i}")).collect();
                assert_eq!(mine, want, "{when}: partition {part}");
                for m in pk.iter().filter(|m| m["topic"] == topic.as_str()) {
                    let id = m["id"].as_str().unwrap();
                    assert_eq!(id.split(':').nth(2), Some(part.to_string().as_str()), "{when}: id {id}");
                }
            }
        };
        check(&url, "before the crash");

        broker.kill9();
        let broker2 = broker.restart();
        check(&broker2.url(), "after kill -9 and restart");
    });
}

/// `secs.millis` as RFC 3339 in UTC (civil-from-days, so the test needs no
/// date crate).
fn humantime_like(secs: u64, millis: u64) -> String {
    let days = (secs / 86_400) as i64;
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { y + 1 } else { y };
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{millis:03}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}
