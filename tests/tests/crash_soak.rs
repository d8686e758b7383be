//! Goal: every message a producer got a receipt for survives `kill -9` of
//! the broker at a random moment, cycle after cycle: present after restart,
//! at its receipt's id, in order, byte for byte, exactly once; including
//! kills while the broker recovers its log and while it shuts down.
//!
//! Method: epochs of `CYCLES_PER_EPOCH` cycles on one data directory, each
//! epoch of one shape (round robin from the seed): plain (one producer, one
//! topic); batched and compressed; a 4-partition topic with key routing;
//! two producers on one topic. A cycle starts the epoch's producers
//! (`magnetar produce --output jsonl`, counts too large to finish), waits
//! for a first receipt plus a random delay, then ends the broker one of
//! three ways: `kill -9`; SIGTERM then `kill -9` a random moment into the
//! shutdown; or `kill -9` followed by one or two restarts killed a random
//! moment into recovery. Then it restarts the broker and reads every topic
//! (every partition) from `earliest` with a fresh subscription, checking it
//! with `check_topic_log` against every receipt of the epoch. A new epoch
//! starts on a new directory, so a check reads a bounded log.
//!
//! `MAGNETAR_SOAK_CYCLES` (default 20, the CI run) sets the cycles;
//! `scripts/crash-soak.sh` runs many. The seed is printed
//! (`MAGNETAR_TEST_SEED` replays it, up to the kill timing the OS decides).

use magnetar_tests::{
    check_topic_log, run_cli, run_with_timeout, test_dir, test_seed, BrokerOptions, BrokerProcess, CliProcess,
    ConsumeCmd, Line, ProduceCmd, ProducedRun, Receipt, Received, SplitMix64,
};
use std::collections::HashMap;
use std::time::{Duration, Instant};

const SHARDS: u32 = 2;
const CYCLES_PER_EPOCH: u64 = 5;
const PARTITIONS: u32 = 4;
/// What one producer sends in a cycle, at most (payload bytes, messages).
const MESSAGE_BYTES_PER_CYCLE: u64 = 8 << 20;
const MESSAGES_PER_CYCLE_MAX: u64 = 20_000;
/// Random delay between the first receipt and the end of the broker.
const KILL_AFTER_MS_MAX: u64 = 500;
/// How long after SIGTERM (or after a spawn, in recovery) a kill may land.
const SHUTDOWN_KILL_MS_MAX: u64 = 150;
const RECOVERY_KILL_MS_MAX: u64 = 400;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Shape {
    Plain,
    BatchedCompressed,
    PartitionedKeys,
    TwoProducers,
}

const SHAPES: [Shape; 4] = [Shape::Plain, Shape::BatchedCompressed, Shape::PartitionedKeys, Shape::TwoProducers];

#[derive(Debug, Clone, Copy)]
enum Ending {
    Kill,
    KillInShutdown,
    KillInRecovery(u32),
}

/// Totals over the soak, printed at the end.
#[derive(Debug, Default)]
struct Totals {
    cycles: u64,
    acknowledged: u64,
    /// Acknowledged messages checked present, summed over every check (a
    /// message is checked at every later cycle of its epoch).
    verified: u64,
    kills_in_shutdown: u64,
    kills_in_recovery: u64,
}

fn cycles() -> u64 {
    std::env::var("MAGNETAR_SOAK_CYCLES")
        .ok()
        .map_or(20, |s| s.parse().unwrap_or_else(|_| panic!("MAGNETAR_SOAK_CYCLES={s:?} is not a number")))
}

#[test]
fn acknowledged_messages_survive_random_kills() {
    let seed = test_seed("acknowledged_messages_survive_random_kills");
    let cycles = cycles();
    // About 5 s a cycle on a loaded 2-core machine; generous for the timeout.
    let timeout = Duration::from_secs(120 + 30 * cycles);
    run_with_timeout(timeout, move || {
        let mut rng = SplitMix64(seed);
        let mut totals = Totals::default();
        let started = Instant::now();
        let first_shape = rng.below(SHAPES.len() as u64) as usize;
        let mut epoch = 0usize;
        while totals.cycles < cycles {
            let shape = SHAPES[(first_shape + epoch) % SHAPES.len()];
            let n = CYCLES_PER_EPOCH.min(cycles - totals.cycles);
            run_epoch(epoch, shape, n, &mut rng, &mut totals);
            epoch += 1;
        }
        eprintln!(
            "soak seed {seed}: {} cycles in {epoch} epochs, {:.0} s: {} messages acknowledged, {} checks of acknowledged \
             messages passed; {} kills during shutdown, {} during recovery; no finding",
            totals.cycles,
            started.elapsed().as_secs_f64(),
            totals.acknowledged,
            totals.verified,
            totals.kills_in_shutdown,
            totals.kills_in_recovery
        );
    });
}

/// A topic (or partition) to check, with every run that produced to it.
struct Checked {
    /// What the consumer subscribes to.
    topic: String,
    runs: Vec<ProducedRun>,
}

fn run_epoch(epoch: usize, shape: Shape, cycles: u64, rng: &mut SplitMix64, totals: &mut Totals) {
    let label = format!("soak-{epoch}");
    let dir = test_dir(&label);
    // 4 MiB segments (the smallest allowed): the kills land near segment
    // rolls too, and recovery after a kill, which reads the unsynced
    // segment whole, stays short.
    let options = BrokerOptions { segment_mib: Some(4), ..BrokerOptions::new(SHARDS) };
    let mut broker = BrokerProcess::start_with(dir.path(), &options);
    let topic = format!("persistent://public/default/{label}");
    if shape == Shape::PartitionedKeys {
        let p = PARTITIONS.to_string();
        run_cli(
            ["admin", "--url", &broker.url(), "topics", "create-partitioned", &topic, "--partitions", &p],
            Duration::from_secs(30),
        )
        .assert_success();
    }
    let checked_topics: Vec<String> = match shape {
        Shape::PartitionedKeys => (0..PARTITIONS).map(|i| format!("{topic}-partition-{i}")).collect(),
        _ => vec![topic.clone()],
    };
    // Per checked topic, per producer name: the receipts so far.
    let mut checked: Vec<Checked> =
        checked_topics.into_iter().map(|topic| Checked { topic, runs: Vec::new() }).collect();
    eprintln!("epoch {epoch}: {shape:?}, {cycles} cycles in {}", dir.path().display());
    for c in 0..cycles {
        let cycle = totals.cycles;
        let ending = match rng.below(10) {
            0..=5 => Ending::Kill,
            6 | 7 => Ending::KillInShutdown,
            _ => Ending::KillInRecovery(1 + rng.below(2) as u32),
        };
        let t0 = Instant::now();
        let produced = produce_and_end(&mut broker, shape, &topic, epoch, c, ending, rng);
        let t_produce = t0.elapsed();
        if let Ending::KillInRecovery(times) = ending {
            for _ in 0..times {
                let after = Duration::from_millis(rng.below(RECOVERY_KILL_MS_MAX + 1));
                let ready = BrokerProcess::start_and_kill9_after(dir.path(), &options, after);
                eprintln!("cycle {cycle}: killed a restart after {after:?} (ready: {ready})");
                totals.kills_in_recovery += 1;
            }
        }
        if matches!(ending, Ending::KillInShutdown) {
            totals.kills_in_shutdown += 1;
        }
        let t1 = Instant::now();
        broker = broker.restart();
        let t_restart = t1.elapsed();
        let mut acked = 0u64;
        for run in produced {
            acked += run.receipts.len() as u64;
            // A partitioned run's receipts go to the partition of their id.
            let mut by_topic: HashMap<usize, Vec<Receipt>> = HashMap::new();
            for r in run.receipts {
                let i = if checked.len() == 1 { 0 } else { r.id.partition as usize };
                assert!(i < checked.len(), "receipt {r:?} names partition {}", r.id.partition);
                by_topic.entry(i).or_default().push(r);
            }
            for (i, chk) in checked.iter_mut().enumerate() {
                let receipts = by_topic.remove(&i).unwrap_or_default();
                chk.runs.push(ProducedRun { producer: run.producer.clone(), size: run.size, receipts });
            }
        }
        totals.acknowledged += acked;
        let t2 = Instant::now();
        totals.verified += verify(&broker, &checked, shape, &format!("verify-{c}"));
        totals.cycles += 1;
        eprintln!(
            "cycle {cycle} ({shape:?}, {ending:?}): {acked} acknowledged, all present (produce and kill {:.1} s, \
             restart {:.1} s, check {:.1} s)",
            t_produce.as_secs_f64(),
            t_restart.as_secs_f64(),
            t2.elapsed().as_secs_f64()
        );
    }
    broker.terminate();
}

/// Starts the shape's producers, lets them collect receipts for a random
/// while, then ends the broker as `ending` says. Returns each producer's
/// receipts (every one an acknowledged message).
fn produce_and_end(
    broker: &mut BrokerProcess,
    shape: Shape,
    topic: &str,
    epoch: usize,
    c: u64,
    ending: Ending,
    rng: &mut SplitMix64,
) -> Vec<ProducedRun> {
    let url = broker.url();
    let size = [16usize, 333, 4000, 9000][rng.below(4) as usize];
    // Bounded, so that an epoch's log (read whole at every check) stays
    // small; usually more than the producer sends before the kill.
    let count = |size: usize| (MESSAGE_BYTES_PER_CYCLE / size as u64).clamp(500, MESSAGES_PER_CYCLE_MAX);
    let mut cmds = Vec::new();
    let mut cmd = ProduceCmd::new(&url, topic, &format!("e{epoch}c{c}a"), count(size), size);
    match shape {
        Shape::Plain | Shape::TwoProducers => {}
        Shape::BatchedCompressed => {
            let codec = ["lz4", "zlib", "zstd", "snappy"][rng.below(4) as usize];
            cmd.extra_args = ["--batch-max-messages", "50", "--batch-max-delay-ms", "2", "--compression", codec]
                .map(String::from)
                .to_vec();
        }
        Shape::PartitionedKeys => {
            cmd.extra_args = ["--keys", "16"].map(String::from).to_vec();
        }
    }
    cmds.push(cmd);
    if shape == Shape::TwoProducers {
        cmds.push(ProduceCmd::new(&url, topic, &format!("e{epoch}c{c}b"), count(100), 100));
    }
    let mut procs: Vec<(ProduceCmd, CliProcess, Vec<String>, bool)> =
        cmds.into_iter().map(|cmd| (cmd.clone(), cmd.spawn(), Vec::new(), false)).collect();
    let collect = |procs: &mut Vec<(ProduceCmd, CliProcess, Vec<String>, bool)>| {
        for (_, p, lines, eof) in procs.iter_mut() {
            if *eof {
                continue;
            }
            match p.next_line(Duration::from_millis(5)) {
                Line::Line(l) => lines.push(l),
                Line::Timeout => {}
                Line::Eof => *eof = true,
            }
        }
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while procs.iter().any(|(_, _, lines, eof)| lines.is_empty() && !eof) {
        assert!(Instant::now() < deadline, "producers printed no receipt within 60 s");
        collect(&mut procs);
    }
    let until = Instant::now() + Duration::from_millis(rng.below(KILL_AFTER_MS_MAX + 1));
    while Instant::now() < until {
        collect(&mut procs);
    }
    match ending {
        Ending::Kill | Ending::KillInRecovery(_) => {
            broker.kill9();
        }
        Ending::KillInShutdown => {
            broker.sigterm();
            std::thread::sleep(Duration::from_millis(rng.below(SHUTDOWN_KILL_MS_MAX + 1)));
            broker.kill9();
        }
    }
    procs
        .into_iter()
        .map(|(cmd, p, mut lines, _)| {
            let run = p.finish(Duration::from_secs(60));
            lines.extend(run.stdout_lines);
            let receipts: Vec<Receipt> = lines.iter().map(|l| Receipt::parse(l)).collect();
            // Exit 0 only if it finished its count before the broker went.
            assert_eq!(
                run.status.success(),
                receipts.len() as u64 == cmd.count,
                "producer {} exited with {} after {} of {} receipts:\n{}",
                cmd.producer_name,
                run.status,
                receipts.len(),
                cmd.count,
                run.stderr
            );
            // In seq order; with gaps only on a partitioned topic, whose
            // partitions' sends fail independently when the broker dies
            // (a later message may have been acknowledged on one partition
            // while an earlier one on another was lost with the broker).
            for (j, pair) in receipts.windows(2).enumerate() {
                let gap_allowed = shape == Shape::PartitionedKeys;
                assert!(
                    pair[1].seq == pair[0].seq + 1 || (gap_allowed && pair[1].seq > pair[0].seq),
                    "receipts #{j} and #{} of {} out of seq order: {:?}",
                    j + 1,
                    cmd.producer_name,
                    &pair
                );
            }
            if let Some(first) = receipts.first() {
                assert!(
                    first.seq == 0 || shape == Shape::PartitionedKeys,
                    "first receipt of {}: {first:?}",
                    cmd.producer_name
                );
            }
            ProducedRun { producer: cmd.producer_name.clone(), size: cmd.size, receipts }
        })
        .collect()
}

/// Reads every checked topic from `earliest` and checks it against the
/// epoch's receipts. Returns the acknowledged messages found.
fn verify(broker: &BrokerProcess, checked: &[Checked], shape: Shape, subscription: &str) -> u64 {
    let url = broker.url();
    let consumers: Vec<_> = checked
        .iter()
        .map(|c| {
            let mut cmd = ConsumeCmd::new(&url, &c.topic, subscription);
            cmd.idle_timeout_s = 1.5;
            cmd.spawn()
        })
        .collect();
    let mut verified = 0;
    let mut key_partition: HashMap<String, usize> = HashMap::new();
    for (i, p) in consumers.into_iter().enumerate() {
        let run = p.finish(Duration::from_secs(120));
        run.assert_success();
        let received: Vec<Received> = run.stdout_lines.iter().map(|l| Received::parse(l)).collect();
        let chk = check_topic_log(&checked[i].topic, &checked[i].runs, &received);
        verified += chk.acknowledged as u64;
        if shape == Shape::PartitionedKeys {
            for m in &received {
                let key = m.key.clone().expect("keyed messages");
                let first = *key_partition.entry(key.clone()).or_insert(i);
                assert_eq!(first, i, "key {key} found in partitions {first} and {i}");
            }
        }
    }
    verified
}
