//! Goal: issue #2's promise that a message whose receipt the producer got
//! survives `kill -9` of the broker: present after restart, in order, byte
//! for byte, exactly once.
//!
//! Method: a 2-shard broker as a real process. First run: 10,000 generated
//! messages over 4 topics (2 owned by each shard), one `magnetar produce`
//! process per topic, receipts from `--output jsonl`. Second run: one
//! producer per topic with a count too large to finish; once every producer
//! has printed some receipts (plus a seeded random delay, so the kill lands at
//! varying points of the group-commit cycle), `kill -9` the broker. The
//! producers then fail; every receipt they printed is an acknowledged message.
//! Restart on the same data directory and read every topic from `earliest`
//! with a fresh subscription (`magnetar consume --output jsonl`), then check
//! each topic with `check_topic_log`. Finally produce a little more to show
//! the recovered topics take appends after the recovered entries.

use magnetar_tests::{
    check_topic_log, run_with_timeout, test_dir, test_seed, topics_per_shard, BrokerOptions, BrokerProcess, ConsumeCmd,
    Line, ProduceCmd, ProducedRun, Receipt, SplitMix64,
};
use std::time::{Duration, Instant};

const SHARDS: u32 = 2;
const TOPICS_PER_SHARD: usize = 2;
const FIRST_RUN_MESSAGES: u64 = 10_000;
/// Payload sizes per topic (shard 0's two topics first): tiny, about a page,
/// odd, more than two pages, so entries straddle 4 KiB boundaries in
/// different ways and each shard gets a small and a large one.
const SIZES: [usize; 4] = [16, 4000, 333, 9000];
/// Receipts every second-run producer must have printed before the kill.
const RECEIPTS_BEFORE_KILL: usize = 200;
/// Random extra delay before the kill, at most.
const KILL_JITTER_MS_MAX: u64 = 300;

#[test]
fn acknowledged_messages_survive_kill_9() {
    let seed = test_seed("acknowledged_messages_survive_kill_9");
    run_with_timeout(Duration::from_secs(180), move || scenario(seed, BrokerOptions::new(SHARDS), "durability"));
}

/// The same with 4 MiB segments (the smallest the default group-commit size
/// allows), so the runs roll many segments and the kill may land near a
/// roll, and a 1 MiB write cache, so most reads go to disk.
#[test]
fn acknowledged_messages_survive_kill_9_with_small_segments() {
    let seed = test_seed("acknowledged_messages_survive_kill_9_with_small_segments");
    let options = BrokerOptions { segment_mib: Some(4), write_cache_mib: Some(1), ..BrokerOptions::new(SHARDS) };
    run_with_timeout(Duration::from_secs(180), move || scenario(seed, options, "small-segments"));
}

fn scenario(seed: u64, options: BrokerOptions, label: &str) {
    {
        let mut rng = SplitMix64(seed);
        let dir = test_dir(label);
        let mut broker = BrokerProcess::start_with(dir.path(), &options);
        let url = broker.url();
        let topics = topics_per_shard(label, SHARDS, TOPICS_PER_SHARD);
        assert_eq!(topics.len(), SIZES.len());
        let mut runs: Vec<Vec<ProducedRun>> = vec![Vec::new(); topics.len()];

        // First run: every message acknowledged, the producers exit 0.
        let started = Instant::now();
        let per_topic = FIRST_RUN_MESSAGES / topics.len() as u64;
        let first: Vec<_> = topics
            .iter()
            .enumerate()
            .map(|(i, (topic, _))| {
                let cmd = ProduceCmd::new(&url, topic, &format!("first-{i}"), per_topic, SIZES[i]);
                (cmd.clone(), cmd.spawn())
            })
            .collect();
        for (i, (cmd, proc_)) in first.into_iter().enumerate() {
            let run = proc_.finish(Duration::from_secs(90));
            run.assert_success();
            let receipts: Vec<Receipt> = run.stdout_lines.iter().map(|l| Receipt::parse(l)).collect();
            assert_eq!(receipts.len() as u64, per_topic, "first run on {}: {}", cmd.topic, run.stderr);
            runs[i].push(ProducedRun { producer: cmd.producer_name.clone(), size: cmd.size, receipts });
        }
        eprintln!("first run: {FIRST_RUN_MESSAGES} messages in {:.1} s", started.elapsed().as_secs_f64());

        // Second run: kill -9 the broker in the middle of it.
        let mut second: Vec<_> = topics
            .iter()
            .enumerate()
            .map(|(i, (topic, _))| {
                let cmd = ProduceCmd::new(&url, topic, &format!("second-{i}"), 100_000_000, SIZES[i]);
                let p = cmd.spawn();
                (cmd, p, Vec::<String>::new(), false)
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(60);
        while second.iter().any(|(_, _, lines, _)| lines.len() < RECEIPTS_BEFORE_KILL) {
            assert!(Instant::now() < deadline, "second-run producers printed too few receipts within 60 s");
            for (cmd, p, lines, eof) in second.iter_mut() {
                if *eof {
                    continue;
                }
                match p.next_line(Duration::from_millis(20)) {
                    Line::Line(l) => lines.push(l),
                    Line::Timeout => {}
                    Line::Eof => {
                        *eof = true;
                        panic!("producer on {} ended before the kill:\n{}", cmd.topic, p.stderr());
                    }
                }
            }
        }
        let jitter = rng.below(KILL_JITTER_MS_MAX + 1);
        std::thread::sleep(Duration::from_millis(jitter));
        broker.kill9();
        eprintln!("killed the broker {jitter} ms after every producer had {RECEIPTS_BEFORE_KILL} receipts");
        for (i, (cmd, p, mut lines, _)) in second.into_iter().enumerate() {
            let run = p.finish(Duration::from_secs(30));
            // The producer cannot finish its count: the broker died under it.
            assert!(!run.status.success(), "producer on {} exited 0 after the kill", cmd.topic);
            lines.extend(run.stdout_lines);
            let receipts: Vec<Receipt> = lines.iter().map(|l| Receipt::parse(l)).collect();
            for (j, r) in receipts.iter().enumerate() {
                assert_eq!(r.seq, j as u64, "second-run receipts on {} out of seq order", cmd.topic);
            }
            eprintln!("second run on {}: {} receipts before the kill", cmd.topic, receipts.len());
            runs[i].push(ProducedRun { producer: cmd.producer_name.clone(), size: cmd.size, receipts });
        }

        // Restart and read everything back.
        let started = Instant::now();
        let broker = broker.restart();
        eprintln!("restarted in {:.1} s", started.elapsed().as_secs_f64());
        let url = broker.url();
        let consumers: Vec<_> =
            topics.iter().map(|(topic, _)| ConsumeCmd::new(&url, topic, "verify-after-crash").spawn()).collect();
        let mut last_ids = Vec::new();
        for (i, c) in consumers.into_iter().enumerate() {
            let run = c.finish(Duration::from_secs(90));
            run.assert_success();
            let received: Vec<_> = run.stdout_lines.iter().map(|l| magnetar_tests::Received::parse(l)).collect();
            let (topic, owner) = &topics[i];
            let check = check_topic_log(topic, &runs[i], &received);
            eprintln!(
                "{topic} (shard {owner}): {} received, {} acknowledged, {} present without receipt",
                check.received, check.acknowledged, check.unacknowledged_present
            );
            for m in &received {
                assert_eq!(m.redelivery_count, 0, "{topic}: a fresh subscription saw a redelivery: {m:?}");
            }
            last_ids.push(received.last().map(|m| m.id));
        }

        // The recovered topics take new appends after what was recovered.
        for (i, (topic, _)) in topics.iter().enumerate() {
            let receipts = ProduceCmd::new(&url, topic, &format!("third-{i}"), 10, 100).run(Duration::from_secs(30));
            let last = last_ids[i].expect("every topic has messages");
            let first = receipts[0].id;
            assert!(
                (first.ledger, first.entry) > (last.ledger, last.entry),
                "{topic}: new message {first} is not after the recovered {last}"
            );
            let more = ConsumeCmd { count: 10, ..ConsumeCmd::new(&url, topic, "verify-after-crash") }
                .run(Duration::from_secs(30));
            let ids: Vec<_> = more.iter().map(|m| m.id).collect();
            let want: Vec<_> = receipts.iter().map(|r| r.id).collect();
            assert_eq!(ids, want, "{topic}: the subscription after recovery");
        }
        for shard in 0..SHARDS {
            let d = dir.path().join(format!("shard-{shard}/log"));
            let files: Vec<_> = std::fs::read_dir(&d).map(|r| r.flatten().collect()).unwrap_or_default();
            let bytes: u64 = files.iter().filter_map(|f| f.metadata().ok()).map(|m| m.len()).sum();
            eprintln!("{label}: {} holds {} files, {bytes} bytes", d.display(), files.len());
        }
        drop(broker);
    }
}
