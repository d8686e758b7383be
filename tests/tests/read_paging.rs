//! Goal: `magnetar read TOPIC --from L:E:P:B --count N` pages through a
//! topic without a durable subscription (issue #22): each page prints N
//! messages from the id on, then `next L:E:P:B` on stderr, the start of the
//! next page; following the ids visits every message once, in order, across
//! ledgers and through the middle of a batch; the last page ends with `next
//! none`.
//!
//! Method: a broker process whose ledgers roll over every 4 entries; 7
//! single messages, one batch entry of 10, then 5 singles (22 messages);
//! pages of 6, so one page boundary falls inside the batch.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{Client, OutgoingMessage};
use magnetar_tests::consume::produce_one_batch;
use magnetar_tests::run_cli;
use magnetar_tests::{run_async_with_timeout, test_dir, BrokerOptions, BrokerProcess};
use std::time::Duration;

#[test]
fn read_pages_through_a_topic_by_message_id() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("read-paging");
        let mut o = BrokerOptions::new(1);
        o.extra_args = ["--ledger-max-entries", "4", "--ledger-min-rollover-s", "0"].map(String::from).to_vec();
        let broker = BrokerProcess::start_with(dir.path(), &o);
        let client = Client::connect(&broker.url()).await.unwrap();
        let topic = "persistent://public/default/paged";
        let mut expected: Vec<(String, String)> = Vec::new();
        let producer = client.producer(topic).create().await.unwrap();
        for i in 0..7 {
            let id = producer.send(OutgoingMessage::new(format!("s{i}"))).await.unwrap();
            expected.push((id.to_string(), format!("s{i}")));
        }
        for (i, id) in produce_one_batch(&client, topic).await.into_iter().enumerate() {
            expected.push((id.to_string(), format!("b{i}")));
        }
        for i in 7..12 {
            let id = producer.send(OutgoingMessage::new(format!("s{i}"))).await.unwrap();
            expected.push((id.to_string(), format!("s{i}")));
        }
        producer.close().await.unwrap();
        let ledgers: std::collections::BTreeSet<&str> =
            expected.iter().map(|(id, _)| id.split(':').next().unwrap()).collect();
        assert!(ledgers.len() >= 3, "the messages span ledgers: {expected:?}");

        let url = broker.url();
        let mut from = "earliest".to_string();
        let mut seen: Vec<(String, String)> = Vec::new();
        let mut pages = 0;
        loop {
            pages += 1;
            assert!(pages <= 10, "paging does not end: {seen:?}");
            let args = [
                "read",
                topic,
                "--from",
                &from,
                "--count",
                "6",
                "--timeout-s",
                "2",
                "--output",
                "jsonl",
                "--url",
                &url,
            ];
            let run = run_cli(args, Duration::from_secs(30));
            run.assert_success();
            for line in &run.stdout_lines {
                let v: serde_json::Value = serde_json::from_str(line).unwrap();
                seen.push((v["id"].as_str().unwrap().to_string(), v["payload"].as_str().unwrap().to_string()));
            }
            let next = run.stderr.lines().find_map(|l| l.strip_prefix("next ")).map(str::to_string);
            match next.as_deref() {
                Some("none") => {
                    assert_eq!(run.stdout_lines.len(), 22 % 6, "the last page: {}", run.stderr);
                    break;
                }
                Some(id) => {
                    assert_eq!(run.stdout_lines.len(), 6, "a full page before next: {}", run.stderr);
                    from = id.to_string();
                }
                None => panic!("no next line: {}", run.stderr),
            }
        }
        assert_eq!(seen, expected, "the pages, in order, are the topic");
        assert_eq!(pages, 4);
        // `latest` and `earliest` still work as starts.
        let run =
            run_cli(["read", topic, "--from", "latest", "--timeout-s", "1", "--url", &url], Duration::from_secs(30));
        run.assert_success();
        assert!(run.stdout_lines.is_empty(), "nothing after latest: {:?}", run.stdout_lines);
        client.close();
    });
}
