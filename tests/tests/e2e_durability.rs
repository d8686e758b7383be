//! Goal: issue #2's promise that a message whose receipt the producer got
//! survives `kill -9` of the broker: present after restart, in order, byte
//! for byte, exactly once.
//!
//! Method: a 2-shard broker as a real process. First run: 10,000 generated
//! messages over 4 topics (2 owned by each shard), one `magnetar produce`
//! process per topic, receipts from `--output jsonl`. Then, twice (so that a
//! recovered log also crashes): one producer per topic with a count too large
//! to finish; once every producer has printed some receipts (plus a seeded
//! random delay, so the kill lands at varying points of the group-commit
//! cycle), `kill -9` the broker. The producers then fail; every receipt they
//! printed is an acknowledged message. Restart on the same data directory and
//! read every topic from `earliest` with a fresh subscription
//! (`magnetar consume --output jsonl`), checking each topic with
//! `check_topic_log` against every run so far. Finally produce a little more
//! to show the recovered topics take appends after the recovered entries.

use magnetar_tests::{
    check_topic_log, run_with_timeout, test_dir, test_seed, topics_per_shard, BrokerOptions, BrokerProcess, ConsumeCmd,
    Line, ProduceCmd, ProducedRun, Receipt, Received, SplitMix64,
};
use magnetar_wire::MessageId;
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
/// Produce runs ended by `kill -9`, each followed by a restart and a check.
const CRASH_ROUNDS: u32 = 2;
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
    let mut rng = SplitMix64(seed);
    let dir = test_dir(label);
    let mut broker = BrokerProcess::start_with(dir.path(), &options);
    let topics = topics_per_shard(label, SHARDS, TOPICS_PER_SHARD);
    assert_eq!(topics.len(), SIZES.len());
    let mut runs: Vec<Vec<ProducedRun>> = vec![Vec::new(); topics.len()];

    first_run(&broker.url(), &topics, &mut runs);
    let mut last_ids = Vec::new();
    for round in 1..=CRASH_ROUNDS {
        crash_run(&mut broker, &topics, round, &mut rng, &mut runs);
        let started = Instant::now();
        broker = broker.restart();
        eprintln!("restart {round} took {:.1} s", started.elapsed().as_secs_f64());
        last_ids = verify(&broker.url(), &topics, &runs, &format!("verify-{round}"));
    }

    // The recovered topics take new appends after what was recovered, and
    // the last verifying subscription (everything acked) gets just those.
    let url = broker.url();
    for (i, (topic, _)) in topics.iter().enumerate() {
        let receipts = ProduceCmd::new(&url, topic, &format!("after-{i}"), 10, 100).run(Duration::from_secs(30));
        let last = last_ids[i];
        let first = receipts[0].id;
        assert!(
            (first.ledger, first.entry) > (last.ledger, last.entry),
            "{topic}: new message {first} is not after the recovered {last}"
        );
        let more = ConsumeCmd { count: 10, ..ConsumeCmd::new(&url, topic, &format!("verify-{CRASH_ROUNDS}")) }
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
}

/// Every message acknowledged, the producers exit 0.
fn first_run(url: &str, topics: &[(String, u32)], runs: &mut [Vec<ProducedRun>]) {
    let started = Instant::now();
    let per_topic = FIRST_RUN_MESSAGES / topics.len() as u64;
    let procs: Vec<_> = topics
        .iter()
        .enumerate()
        .map(|(i, (topic, _))| {
            let cmd = ProduceCmd::new(url, topic, &format!("first-{i}"), per_topic, SIZES[i]);
            (cmd.clone(), cmd.spawn())
        })
        .collect();
    for (i, (cmd, p)) in procs.into_iter().enumerate() {
        let run = p.finish(Duration::from_secs(90));
        run.assert_success();
        let receipts: Vec<Receipt> = run.stdout_lines.iter().map(|l| Receipt::parse(l)).collect();
        assert_eq!(receipts.len() as u64, per_topic, "first run on {}: {}", cmd.topic, run.stderr);
        runs[i].push(ProducedRun { producer: cmd.producer_name.clone(), size: cmd.size, receipts });
    }
    eprintln!("first run: {FIRST_RUN_MESSAGES} messages in {:.1} s", started.elapsed().as_secs_f64());
}

/// One producer per topic with a count it cannot finish; `kill -9` the broker
/// once each has printed `RECEIPTS_BEFORE_KILL` receipts (plus jitter).
fn crash_run(
    broker: &mut BrokerProcess,
    topics: &[(String, u32)],
    round: u32,
    rng: &mut SplitMix64,
    runs: &mut [Vec<ProducedRun>],
) {
    let url = broker.url();
    let mut procs: Vec<_> = topics
        .iter()
        .enumerate()
        .map(|(i, (topic, _))| {
            let cmd = ProduceCmd::new(&url, topic, &format!("crash{round}-{i}"), 100_000_000, SIZES[i]);
            let p = cmd.spawn();
            (cmd, p, Vec::<String>::new())
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(60);
    while procs.iter().any(|(_, _, lines)| lines.len() < RECEIPTS_BEFORE_KILL) {
        assert!(Instant::now() < deadline, "round {round}: producers printed too few receipts within 60 s");
        for (cmd, p, lines) in procs.iter_mut() {
            match p.next_line(Duration::from_millis(20)) {
                Line::Line(l) => lines.push(l),
                Line::Timeout => {}
                Line::Eof => panic!("producer on {} ended before the kill:\n{}", cmd.topic, p.stderr()),
            }
        }
    }
    let jitter = rng.below(KILL_JITTER_MS_MAX + 1);
    std::thread::sleep(Duration::from_millis(jitter));
    broker.kill9();
    eprintln!("round {round}: killed the broker {jitter} ms after every producer had {RECEIPTS_BEFORE_KILL} receipts");
    for (i, (cmd, p, mut lines)) in procs.into_iter().enumerate() {
        let run = p.finish(Duration::from_secs(30));
        // The producer cannot finish its count: the broker died under it.
        assert!(!run.status.success(), "producer on {} exited 0 after the kill", cmd.topic);
        lines.extend(run.stdout_lines);
        let receipts: Vec<Receipt> = lines.iter().map(|l| Receipt::parse(l)).collect();
        for (j, r) in receipts.iter().enumerate() {
            assert_eq!(r.seq, j as u64, "round {round}: receipts on {} out of seq order", cmd.topic);
        }
        eprintln!("round {round} on {}: {} receipts before the kill", cmd.topic, receipts.len());
        runs[i].push(ProducedRun { producer: cmd.producer_name.clone(), size: cmd.size, receipts });
    }
}

/// Reads every topic from `earliest` with a fresh subscription and checks it
/// against all runs so far. Returns the last id of each topic.
fn verify(url: &str, topics: &[(String, u32)], runs: &[Vec<ProducedRun>], subscription: &str) -> Vec<MessageId> {
    let consumers: Vec<_> = topics.iter().map(|(topic, _)| ConsumeCmd::new(url, topic, subscription).spawn()).collect();
    let mut last_ids = Vec::new();
    for (i, c) in consumers.into_iter().enumerate() {
        let run = c.finish(Duration::from_secs(90));
        run.assert_success();
        let received: Vec<_> = run.stdout_lines.iter().map(|l| Received::parse(l)).collect();
        let (topic, owner) = &topics[i];
        let check = check_topic_log(topic, &runs[i], &received);
        eprintln!(
            "{subscription} {topic} (shard {owner}): {} received, {} acknowledged, {} present without receipt",
            check.received, check.acknowledged, check.unacknowledged_present
        );
        for m in &received {
            assert_eq!(m.redelivery_count, 0, "{topic}: a fresh subscription saw a redelivery: {m:?}");
        }
        last_ids.push(received.last().map(|m| m.id).expect("every topic has messages"));
    }
    last_ids
}

/// Many topics and subscriptions: after `kill -9` every topic comes back with
/// its own ledger and entries, every durable cursor with its position, and
/// topics created after the restart get ledgers of their own (a ledger id
/// handed out twice would show one topic's messages in another).
#[test]
fn many_topics_and_cursors_survive_kill_9() {
    const TOPICS: usize = 60;
    const PER_TOPIC: usize = 10;
    magnetar_tests::run_async_with_timeout(Duration::from_secs(120), || async {
        use magnetar_client::{AckType, Client, InitialPosition, OutgoingMessage};
        let dir = test_dir("many-topics");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let client = Client::connect(&broker.url()).await.expect("connect");
        let topics: Vec<String> = (0..TOPICS).map(|i| format!("many-{i}")).collect();
        let mut ids = Vec::new();
        for t in &topics {
            let producer = client.producer(t.as_str()).name("p").create().await.expect("producer");
            let mut receipts = Vec::new();
            for j in 0..PER_TOPIC {
                receipts.push(producer.send_async(OutgoingMessage::new(format!("{t}/{j}"))).await.expect("send"));
            }
            let mut t_ids = Vec::new();
            for r in receipts {
                t_ids.push(r.await.expect("receipt"));
            }
            // A durable cursor per topic, at a topic-dependent position.
            let consumer = client
                .subscribe(t.as_str(), "c")
                .initial_position(InitialPosition::Earliest)
                .subscribe()
                .await
                .expect("sub");
            let upto = ids.len() % PER_TOPIC;
            for _ in 0..=upto {
                recv(&consumer).await;
            }
            consumer.ack_confirmed(AckType::Cumulative, &[t_ids[upto]]).await.expect("ack");
            ids.push(t_ids);
        }
        let ledgers: std::collections::HashSet<u64> = ids.iter().map(|t| t[0].ledger).collect();
        assert_eq!(ledgers.len(), TOPICS, "two topics share a ledger");
        broker.kill9();
        client.close();

        let broker = broker.restart();
        let client = Client::connect(&broker.url()).await.expect("connect after restart");
        // New topics first, so that a reused ledger id would collide with a
        // recovered topic before that topic is loaded again.
        for i in 0..8 {
            let t = format!("new-after-restart-{i}");
            let producer = client.producer(t.as_str()).create().await.expect("producer");
            let id = producer.send(OutgoingMessage::new(t.clone())).await.expect("send");
            assert!(!ledgers.contains(&id.ledger), "{t} got ledger {} of a recovered topic", id.ledger);
            assert_eq!(id.entry, 0, "{t}: a new topic starts at entry 0, got {id}");
        }
        for (i, (t, t_ids)) in topics.iter().zip(&ids).enumerate() {
            let fresh = client
                .subscribe(t.as_str(), "fresh")
                .initial_position(InitialPosition::Earliest)
                .subscribe()
                .await
                .expect("sub");
            for (j, id) in t_ids.iter().enumerate() {
                let m = recv(&fresh).await;
                assert_eq!((m.id, m.payload.as_ref()), (*id, format!("{t}/{j}").as_bytes()), "{t} after restart");
            }
            let cursor = client.subscribe(t.as_str(), "c").subscribe().await.expect("sub");
            let upto = i % PER_TOPIC;
            if upto + 1 < PER_TOPIC {
                assert_eq!(recv(&cursor).await.id, t_ids[upto + 1], "{t}: the cursor after restart");
            } else if let Ok(m) = tokio::time::timeout(Duration::from_millis(200), cursor.receive()).await {
                panic!("{t}: everything was acked, yet {m:?}");
            }
            fresh.close().await.expect("close");
            cursor.close().await.expect("close");
        }
    });
}

async fn recv(c: &magnetar_client::Consumer) -> magnetar_client::Message {
    tokio::time::timeout(Duration::from_secs(10), c.receive()).await.expect("receive timed out").expect("receive")
}
