//! Goal: a consumer of a partitioned topic with a batched backlog gets its
//! messages. Regression: the broker may send one whole batch entry past a
//! consumer's last permits; the client's per-consumer queue was bounded at
//! exactly the receiver queue size, so the connection's single reader blocked
//! on one partition's full queue and never read the Success of the next
//! partition's Subscribe ("subscribe timed out after 30s").
//! Method: 4 partitions, 10,000 messages in batches of up to 100 (so every
//! partition holds far more than one receiver queue), then the CLI consumes
//! 3 messages and, with a fresh subscription, all 10,000.

use magnetar_tests::{run_cli, run_with_timeout, test_dir, BrokerProcess, ConsumeCmd, ProduceCmd};
use std::collections::HashSet;
use std::time::Duration;

#[test]
fn batched_backlog_on_a_partitioned_topic_is_consumed() {
    run_with_timeout(Duration::from_secs(120), || {
        let dir = test_dir("partitioned-backlog");
        let broker = BrokerProcess::start(dir.path(), 2);
        let url = broker.url();
        let topic = "persistent://public/default/backlog";
        run_cli(
            ["admin", "--url", &url, "topics", "create-partitioned", topic, "--partitions", "4"],
            Duration::from_secs(30),
        )
        .assert_success();
        // 16 keys: with Pulsar's Murmur3 routing k0..k15 reach all 4
        // partitions (k0..k7 reach only 3).
        let mut produce = ProduceCmd::new(&url, topic, "p", 10_000, 512);
        produce.extra_args =
            ["--keys", "16", "--batch-max-messages", "100", "--batch-max-delay-ms", "5"].map(String::from).to_vec();
        let receipts = produce.run(Duration::from_secs(60));
        assert_eq!(receipts.len(), 10_000);

        let mut few = ConsumeCmd::new(&url, topic, "few");
        few.count = 3;
        assert_eq!(few.run(Duration::from_secs(60)).len(), 3);

        let mut all = ConsumeCmd::new(&url, topic, "all");
        all.count = 10_000;
        let got = all.run(Duration::from_secs(60));
        let ids: HashSet<_> = got.iter().map(|m| m.id).collect();
        assert_eq!(ids.len(), 10_000, "every message once");
        let partitions: HashSet<_> = got.iter().map(|m| m.id.partition).collect();
        assert_eq!(partitions.len(), 4, "messages from every partition");
    });
}
