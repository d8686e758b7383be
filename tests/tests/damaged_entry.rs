//! Goal (issue #17, item 4): one entry damaged on disk does not silently
//! stop a subscription. A consumer that reaches it gets a typed error naming
//! the entry (the CLI exits non-zero and says which entry), the operator's
//! `magnetar admin subscriptions skip-damaged TOPIC SUB` moves the
//! subscription past it, later messages are delivered, and `magnetar inspect
//! --verify` names the damage.
//!
//! Method: produce 10 unbatched messages, stop the broker cleanly (so the
//! next start trusts the log without a scan and the damage is met only when
//! the entry is read), flip one byte of message 5's payload in the segment
//! file, restart, consume, skip, consume again.

use magnetar_tests::{
    expected_payload, run_cli, run_with_timeout, test_dir, BrokerOptions, BrokerProcess, ConsumeCmd, ProduceCmd,
    Received,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

const SIZE: usize = 200;
const COUNT: u64 = 10;
const DAMAGED: u64 = 5;

/// Every segment file of `data_dir` (all shards).
fn segments(data_dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for shard in std::fs::read_dir(data_dir).expect("read data dir").flatten() {
        let log = shard.path().join("log");
        if let Ok(files) = std::fs::read_dir(&log) {
            out.extend(files.flatten().map(|f| f.path()).filter(|p| p.is_file()));
        }
    }
    out.sort();
    out
}

/// Flips one byte in the middle of `needle`'s only occurrence in the
/// segments of `data_dir`; returns the file and offset.
fn damage(data_dir: &Path, needle: &[u8]) -> (PathBuf, usize) {
    let mut found = Vec::new();
    for seg in segments(data_dir) {
        let bytes = std::fs::read(&seg).expect("read segment");
        for (i, w) in bytes.windows(needle.len()).enumerate() {
            if w == needle {
                found.push((seg.clone(), i));
            }
        }
    }
    assert_eq!(found.len(), 1, "the payload must be stored once in the log, found at {found:?}");
    let (seg, at) = found.remove(0);
    let mut bytes = std::fs::read(&seg).expect("read segment");
    bytes[at + needle.len() / 2] ^= 0x01;
    std::fs::write(&seg, &bytes).expect("write segment");
    (seg, at)
}

fn seqs(received: &[Received]) -> Vec<u64> {
    received
        .iter()
        .map(|r| {
            magnetar_tests::parse_generated(&r.payload).unwrap_or_else(|| panic!("not a generated payload: {r:?}")).1
        })
        .collect()
}

#[test]
fn damaged_entry_is_reported_and_can_be_skipped() {
    run_with_timeout(Duration::from_secs(240), || {
        let dir = test_dir("damaged-entry");
        let options = BrokerOptions::new(1);
        let mut broker = BrokerProcess::start_with(dir.path(), &options);
        let topic = "damaged-entry";
        ProduceCmd::new(&broker.url(), topic, "p", COUNT, SIZE).run(Duration::from_secs(60));
        assert!(broker.terminate().success(), "clean stop:\n{}", broker.log_tail());
        drop(broker);
        let (seg, at) = damage(dir.path(), &expected_payload("p", DAMAGED, SIZE));
        eprintln!("damaged {} at offset {at}", seg.display());

        let broker = BrokerProcess::start_with(dir.path(), &options);
        let url = broker.url();

        // The consumer gets what comes before the damaged entry, then an
        // error naming it: the CLI exits non-zero (old code: exit 0 at its
        // idle timeout, as if the topic were drained).
        let consume = ConsumeCmd { idle_timeout_s: 10.0, ..ConsumeCmd::new(&url, topic, "sub") };
        let run = run_cli(consume.args(), Duration::from_secs(60));
        assert!(!run.status.success(), "consume must fail at the damaged entry; stderr:\n{}", run.stderr);
        let got: Vec<Received> = run.stdout_lines.iter().map(|l| Received::parse(l)).collect();
        assert_eq!(seqs(&got), (0..DAMAGED).collect::<Vec<_>>(), "stderr:\n{}", run.stderr);
        let damaged_id = format!("{}:{}", got[0].id.ledger, got[0].id.entry + DAMAGED);
        assert!(
            run.stderr.contains("damaged") && run.stderr.contains(&damaged_id),
            "the error must name damaged entry {damaged_id}:\n{}",
            run.stderr
        );

        // A reader fails the same way.
        let read =
            run_cli(["read", topic, "--timeout-s", "10", "--url", &url, "--output", "jsonl"], Duration::from_secs(60));
        assert!(!read.status.success(), "read must fail at the damaged entry; stderr:\n{}", read.stderr);
        assert!(read.stderr.contains(&damaged_id), "read must name {damaged_id}:\n{}", read.stderr);

        // The offline check names the damaged batch's file and offset.
        let verify =
            run_cli(["inspect", "--verify", dir.path().to_str().expect("utf-8 path")], Duration::from_secs(60));
        assert!(!verify.status.success(), "inspect --verify must report the damage:\n{}", verify.stderr);
        let all = format!("{}\n{}", verify.stdout_lines.join("\n"), verify.stderr);
        let file = seg.file_name().and_then(|f| f.to_str()).expect("segment name");
        assert!(all.contains(file), "inspect --verify must name {file}:\n{all}");

        // Skip it: the subscription moves on; the log says so.
        let skip =
            run_cli(["admin", "subscriptions", "skip-damaged", topic, "sub", "--url", &url], Duration::from_secs(30));
        skip.assert_success();
        assert!(skip.stderr.contains(&damaged_id), "skip-damaged must name {damaged_id}:\n{}", skip.stderr);
        // A second skip finds nothing damaged where the subscription is.
        let again =
            run_cli(["admin", "subscriptions", "skip-damaged", topic, "sub", "--url", &url], Duration::from_secs(30));
        assert!(!again.status.success(), "nothing left to skip:\n{}", again.stderr);

        let rest =
            ConsumeCmd { idle_timeout_s: 3.0, ..ConsumeCmd::new(&url, topic, "sub") }.run(Duration::from_secs(60));
        // Messages before the damage come again unless the first consumer's
        // acks landed before the broker closed it (at-least-once); the
        // damaged one never comes, every later one does, in order.
        let rest = seqs(&rest);
        assert!(!rest.contains(&DAMAGED), "the skipped entry was delivered: {rest:?}");
        let later: Vec<u64> = rest.iter().copied().filter(|s| *s > DAMAGED).collect();
        assert_eq!(later, (DAMAGED + 1..COUNT).collect::<Vec<_>>(), "got {rest:?}");
        assert!(broker.log().contains("skip-damaged"), "no log line for the skip:\n{}", broker.log_tail());
    });
}
