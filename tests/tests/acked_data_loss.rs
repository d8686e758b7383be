//! Goal (issue #17, item 5): a segment truncated inside synced,
//! acknowledged data is found at the next start, not taken for a torn tail.
//! The broker refuses to start, naming the segment file, the offset of the
//! cut and what is missing, and pointing at `--accept-data-loss`;
//! `magnetar inspect --verify` reports the same; started with
//! `--accept-data-loss`, the broker truncates the log at the cut, logs what
//! it dropped, and serves what is left, and later starts need no flag.
//!
//! Method: produce acknowledged messages one at a time (one batch each),
//! `kill -9` the broker (so that they lie after the last checkpoint, where
//! the old recovery took a cut for a torn tail and dropped them silently),
//! cut the segment file in the page that holds message `CUT`, restart.

use magnetar_tests::{
    expected_payload, parse_generated, run_cli, run_with_timeout, test_dir, BrokerOptions, BrokerProcess, ConsumeCmd,
    ProduceCmd, Received,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

const SIZE: usize = 1500;
const COUNT: u64 = 40;
const CUT: u64 = 25;

/// The segment holding `needle` (once) and its offset there.
fn find(data_dir: &Path, needle: &[u8]) -> (PathBuf, u64) {
    let mut found = Vec::new();
    for shard in std::fs::read_dir(data_dir).expect("read data dir").flatten() {
        let Ok(files) = std::fs::read_dir(shard.path().join("log")) else { continue };
        for f in files.flatten() {
            let bytes = std::fs::read(f.path()).expect("read segment");
            for (i, w) in bytes.windows(needle.len()).enumerate() {
                if w == needle {
                    found.push((f.path(), i as u64));
                }
            }
        }
    }
    assert_eq!(found.len(), 1, "the payload must be stored once, found at {found:?}");
    found.remove(0)
}

fn seqs(received: &[Received]) -> Vec<u64> {
    received
        .iter()
        .map(|r| parse_generated(&r.payload).unwrap_or_else(|| panic!("not a generated payload: {r:?}")).1)
        .collect()
}

#[test]
fn truncated_synced_data_is_refused_until_accepted() {
    run_with_timeout(Duration::from_secs(300), || {
        let dir = test_dir("acked-data-loss");
        let mut options = BrokerOptions::new(1);
        // Small segments: the test reads them whole to find a payload.
        options.segment_mib = Some(4);
        let mut broker = BrokerProcess::start_with(dir.path(), &options);
        let topic = "acked-data-loss";
        // One in flight: each message is its own batch, acknowledged
        // (its receipt printed) only after that batch's fdatasync.
        let produce = ProduceCmd { max_pending: 1, ..ProduceCmd::new(&broker.url(), topic, "p", COUNT, SIZE) };
        let receipts = produce.run(Duration::from_secs(60));
        assert_eq!(receipts.len() as u64, COUNT);
        broker.kill9();
        drop(broker);

        let (seg, at) = find(dir.path(), &expected_payload("p", CUT, SIZE));
        let cut = at / 4096 * 4096;
        let file = std::fs::OpenOptions::new().write(true).open(&seg).expect("open segment");
        file.set_len(cut).expect("truncate segment");
        drop(file);
        let name = seg.file_name().and_then(|n| n.to_str()).expect("segment name").to_string();
        eprintln!("cut {} at {cut} (message {CUT} was at {at})", seg.display());

        // Refused, with the file, the offset, what is missing, and the way out.
        let refused = match BrokerProcess::try_start_with(dir.path(), &options) {
            Err(f) => f,
            Ok(b) => panic!("the broker started over a truncated segment:\n{}", b.log_tail()),
        };
        assert!(refused.status.is_some_and(|s| !s.success()), "must exit non-zero: {refused}");
        for want in [name.as_str(), &format!("offset {cut}"), "missing", "--accept-data-loss"] {
            assert!(refused.stderr.contains(want), "the refusal must say {want:?}:\n{}", refused.stderr);
        }

        // The offline check finds the same.
        let verify = run_cli(["inspect", "--verify", dir.path().to_str().expect("utf-8")], Duration::from_secs(60));
        assert!(!verify.status.success(), "inspect --verify must fail:\n{}", verify.stderr);
        let all = format!("{}\n{}", verify.stdout_lines.join("\n"), verify.stderr);
        assert!(all.contains(&name) && all.contains("missing"), "inspect --verify must name the cut:\n{all}");

        // Accepted: starts, says what it dropped, serves a prefix.
        options.extra_args = vec!["--accept-data-loss".into()];
        let mut broker = BrokerProcess::start_with(dir.path(), &options);
        let log = broker.log();
        assert!(log.contains("accepting data loss") && log.contains(&name), "no log line naming the loss:\n{log}");
        let consume = ConsumeCmd { earliest: true, idle_timeout_s: 3.0, ..ConsumeCmd::new(&broker.url(), topic, "s1") };
        let got = seqs(&consume.run(Duration::from_secs(60)));
        let kept = got.len() as u64;
        assert!(kept <= CUT && kept > 0, "kept {kept} of {COUNT}: {got:?}");
        assert_eq!(got, (0..kept).collect::<Vec<_>>(), "what is left must be the prefix before the cut");
        assert!(broker.terminate().success(), "clean stop:\n{}", broker.log_tail());
        drop(broker);

        // Accepted once: a plain start later finds a sound log.
        options.extra_args.clear();
        let mut broker = BrokerProcess::start_with(dir.path(), &options);
        let consume = ConsumeCmd { earliest: true, idle_timeout_s: 3.0, ..ConsumeCmd::new(&broker.url(), topic, "s2") };
        assert_eq!(seqs(&consume.run(Duration::from_secs(60))), (0..kept).collect::<Vec<_>>());
        assert!(broker.terminate().success(), "clean stop:\n{}", broker.log_tail());
    });
}
