//! Goal: the broker's life cycle as a user sees it: SIGTERM is a clean
//! shutdown (exit 0, in-flight produce requests finished, cursors persisted,
//! a clean-shutdown marker the next start recognises), a restart keeps data
//! and subscription cursors, and a data directory refuses another shard count
//! and a second broker while one holds it.
//!
//! Method: real broker processes on temporary directories; the client SDK
//! for precise acks, the CLI where a produce run must be interrupted.

use magnetar_client::{Client, Consumer, InitialPosition, MessageId, OutgoingMessage};
use magnetar_tests::consume::{receive, RECEIVE_TIMEOUT};
use magnetar_tests::{
    check_topic_log, run_async_with_timeout, run_with_timeout, test_dir, topics_per_shard, BrokerProcess, ConsumeCmd,
    Line, ProduceCmd, ProducedRun, Receipt, Received,
};
use std::time::{Duration, Instant};

const SHARDS: u32 = 2;

async fn assert_quiet(consumer: &Consumer, what: &str) {
    if let Ok(m) = tokio::time::timeout(Duration::from_millis(500), consumer.receive()).await {
        panic!("{what}: unexpected message {m:?}");
    }
}

async fn subscribe(client: &Client, topic: &str, sub: &str) -> Consumer {
    client
        .subscribe(topic, sub)
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .unwrap_or_else(|e| panic!("subscribe {sub} on {topic}: {e}"))
}

/// Asserts the log of a restarted broker says every shard found the
/// clean-shutdown marker (core logs `recovered entry log shard=N clean=…`).
fn assert_recovered_clean(broker: &BrokerProcess, clean: bool) {
    // The listening line arrives on stdout, the recovery lines on stderr,
    // which a separate thread drains: give that thread time to catch up.
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    let count = |log: &str| log.lines().filter(|l| l.contains("recovered entry log")).count();
    while count(&broker.log()) < broker.shards() as usize && std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
    }
    let log = broker.log();
    let lines: Vec<&str> = log.lines().filter(|l| l.contains("recovered entry log")).collect();
    assert_eq!(lines.len(), broker.shards() as usize, "recovery lines in the log:\n{}", broker.log_tail());
    let want = format!("clean={clean}");
    for l in lines {
        assert!(l.contains(&want), "expected {want} after the restart: {l}");
    }
}

const MESSAGES: u64 = 20;

fn body(i: u64) -> String {
    format!("message {i} of the shutdown test")
}

/// Unacked after: cumulative ack of 4, individual acks of 7 and 9.
fn unacked() -> Vec<u64> {
    (0..MESSAGES).filter(|i| *i > 4 && *i != 7 && *i != 9).collect()
}

#[test]
fn sigterm_when_idle_exits_0_and_a_restart_keeps_data_and_cursors() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("sigterm-idle");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let topics = topics_per_shard("sigterm", SHARDS, 1);
        let client = Client::connect(&broker.url()).await.expect("connect");
        let mut ids: Vec<Vec<MessageId>> = Vec::new();
        let mut consumers = Vec::new();
        for (topic, _) in &topics {
            let producer = client.producer(topic.as_str()).name("before").create().await.expect("producer");
            let mut t_ids = Vec::new();
            for i in 0..MESSAGES {
                t_ids.push(producer.send(OutgoingMessage::new(body(i))).await.expect("send"));
            }
            producer.close().await.expect("close producer");

            // "partial": acks with holes; "all": everything acked.
            let partial = subscribe(&client, topic, "partial").await;
            let all = subscribe(&client, topic, "all").await;
            for i in 0..MESSAGES {
                for c in [&partial, &all] {
                    let m = receive(c, topic).await;
                    assert_eq!(m.id, t_ids[i as usize]);
                }
            }
            // Plain (unconfirmed) acks: the broker persists them in the
            // background or at shutdown, not before answering.
            partial.ack_cumulative(&t_ids[4]).await.expect("ack");
            partial.ack(&t_ids[7]).await.expect("ack");
            partial.ack(&t_ids[9]).await.expect("ack");
            all.ack_cumulative(&t_ids[MESSAGES as usize - 1]).await.expect("ack");
            // The client groups acks (100 ms): put them on the wire now, so
            // the barrier below comes after them.
            partial.flush_acks().await.expect("flush acks");
            all.flush_acks().await.expect("flush acks");
            ids.push(t_ids);
            consumers.push(partial);
            consumers.push(all);
        }
        // A request/answer on the same connection to each owner shard after
        // the acks: requests of one connection keep their order, so once it
        // is answered the acks have been applied on the owner.
        for (topic, _) in &topics {
            let p = client.producer(topic.as_str()).name("barrier").create().await.expect("barrier producer");
            p.close().await.expect("close");
        }

        // SIGTERM while idle, with the connection and its consumers still open.
        let started = Instant::now();
        let status = broker.terminate();
        assert!(status.success(), "SIGTERM: broker exited with {status}\n{}", broker.log_tail());
        eprintln!("clean shutdown took {:.2} s", started.elapsed().as_secs_f64());
        assert_eq!(
            broker.log().lines().filter(|l| l.contains("log closed cleanly shard=")).count(),
            SHARDS as usize,
            "every shard should close its log cleanly:\n{}",
            broker.log_tail()
        );
        // The client learns that the broker went away.
        let err = tokio::time::timeout(RECEIVE_TIMEOUT, consumers[0].receive())
            .await
            .expect("receive should fail once the broker is gone");
        assert!(err.is_err(), "received {err:?} from a stopped broker");
        drop(consumers);
        client.close();

        let broker = broker.restart();
        assert_recovered_clean(&broker, true);
        let client = Client::connect(&broker.url()).await.expect("connect after restart");
        for ((topic, _), t_ids) in topics.iter().zip(&ids) {
            // Data intact.
            let fresh = subscribe(&client, topic, "fresh").await;
            for i in 0..MESSAGES {
                let m = receive(&fresh, topic).await;
                assert_eq!(m.id, t_ids[i as usize], "{topic}: message {i} after restart");
                assert_eq!(m.payload.as_ref(), body(i).as_bytes(), "{topic}: message {i} after restart");
            }
            assert_quiet(&fresh, topic).await;

            // Acked messages are not delivered again; unacked ones are, in order.
            let partial = subscribe(&client, topic, "partial").await;
            for i in unacked() {
                let m = receive(&partial, topic).await;
                assert_eq!(m.id, t_ids[i as usize], "{topic}: redelivery after restart");
                assert_eq!(m.payload.as_ref(), body(i).as_bytes());
            }
            assert_quiet(&partial, topic).await;
            let all = subscribe(&client, topic, "all").await;
            assert_quiet(&all, topic).await;

            // And the topic takes new messages after the old ones.
            let producer = client.producer(topic.as_str()).name("after").create().await.expect("producer");
            let id = producer.send(OutgoingMessage::new("after restart")).await.expect("send");
            assert!(id.entry > t_ids[MESSAGES as usize - 1].entry, "{topic}: {id} after restart");
            for c in [&fresh, &partial, &all] {
                assert_eq!(receive(c, topic).await.id, id, "{topic}: live message after restart");
            }
        }
    });
}

#[test]
fn sigterm_during_a_produce_run_exits_0_and_keeps_every_acknowledged_message() {
    run_with_timeout(Duration::from_secs(90), || {
        let dir = test_dir("sigterm-busy");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let topics = topics_per_shard("sigterm-busy", SHARDS, 1);
        let mut producers: Vec<_> = topics
            .iter()
            .map(|(topic, owner)| {
                let cmd = ProduceCmd::new(&url, topic, &format!("busy-{owner}"), 100_000_000, 500);
                let p = cmd.spawn();
                (cmd, p, Vec::new())
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(30);
        while producers.iter().any(|(_, _, lines)| lines.len() < 200) {
            assert!(Instant::now() < deadline, "producers printed too few receipts");
            for (cmd, p, lines) in producers.iter_mut() {
                match p.next_line(Duration::from_millis(20)) {
                    Line::Line(l) => lines.push(l),
                    Line::Timeout => {}
                    Line::Eof => panic!("producer on {} ended early:\n{}", cmd.topic, p.stderr()),
                }
            }
        }
        let status = broker.terminate();
        assert!(status.success(), "SIGTERM under load: broker exited with {status}\n{}", broker.log_tail());
        let mut runs = Vec::new();
        for (cmd, p, mut lines) in producers {
            let run = p.finish(Duration::from_secs(30));
            assert!(!run.status.success(), "producer on {} finished 100M messages?", cmd.topic);
            lines.extend(run.stdout_lines);
            let receipts: Vec<Receipt> = lines.iter().map(|l| Receipt::parse(l)).collect();
            runs.push(ProducedRun { producer: cmd.producer_name.clone(), size: cmd.size, receipts });
        }

        let broker = broker.restart();
        assert_recovered_clean(&broker, true);
        for ((topic, _), run) in topics.iter().zip(&runs) {
            let received = ConsumeCmd::new(&broker.url(), topic, "check").run(Duration::from_secs(60));
            let check = check_topic_log(topic, std::slice::from_ref(run), &received);
            eprintln!("{topic}: {check:?}");
        }
    });
}

#[test]
fn a_data_directory_refuses_another_shard_count() {
    run_with_timeout(Duration::from_secs(60), || {
        let dir = test_dir("shard-count");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        assert!(broker.terminate().success());
        let failure = match BrokerProcess::try_start(dir.path(), 1) {
            Ok(_) => panic!("a 2-shard data directory started with 1 shard"),
            Err(f) => f,
        };
        let status = failure.status.expect("the broker should exit");
        assert!(!status.success(), "{failure}");
        assert!(failure.stderr.contains("created with 2 shards"), "the error should say why: {failure}");
        // The directory is untouched: the right count still starts.
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        assert!(broker.terminate().success());
    });
}

#[test]
fn a_second_broker_on_the_same_directory_is_refused() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("dir-lock");
        let mut first = BrokerProcess::start(dir.path(), SHARDS);
        let failure = match BrokerProcess::try_start(dir.path(), SHARDS) {
            Ok(_) => panic!("a second broker started on a data directory in use"),
            Err(f) => f,
        };
        let status = failure.status.expect("the second broker should exit");
        assert!(!status.success(), "{failure}");
        let want = format!("is in use by another broker (pid {})", first.pid());
        assert!(failure.stderr.contains(&want), "the error should name the holder's pid ({want}): {failure}");
        let data_dir = std::path::absolute(dir.path()).expect("absolute path");
        assert!(
            failure.stderr.contains(&data_dir.display().to_string()),
            "the error should name the directory {}: {failure}",
            data_dir.display()
        );
        // The first broker is undisturbed: it still takes and serves messages.
        first.assert_running();
        let topic = "persistent://public/default/dir-lock";
        let client = Client::connect(&first.url()).await.expect("connect");
        let consumer = subscribe(&client, topic, "s").await;
        let producer = client.producer(topic).create().await.expect("producer");
        let id = producer.send(OutgoingMessage::new(b"after".to_vec())).await.expect("send");
        assert_eq!(receive(&consumer, topic).await.id, id);
        client.close();
        assert!(first.terminate().success());
        // Once the holder has stopped, the directory opens again.
        let mut again = BrokerProcess::start(dir.path(), SHARDS);
        assert!(again.terminate().success());
    });
}

#[test]
fn confirmed_acks_survive_kill_9() {
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("acks-kill9");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let topics = topics_per_shard("acks-kill9", SHARDS, 1);
        let client = Client::connect(&broker.url()).await.expect("connect");
        let mut ids: Vec<Vec<MessageId>> = Vec::new();
        for (topic, _) in &topics {
            let producer = client.producer(topic.as_str()).name("p").create().await.expect("producer");
            let mut t_ids = Vec::new();
            for i in 0..MESSAGES {
                t_ids.push(producer.send(OutgoingMessage::new(body(i))).await.expect("send"));
            }
            let consumer = subscribe(&client, topic, "confirmed").await;
            for id in &t_ids {
                assert_eq!(receive(&consumer, topic).await.id, *id);
            }
            // Confirmed acks: the broker answers once the cursor is durable.
            consumer.ack_confirmed(magnetar_client::AckType::Cumulative, &[t_ids[4]]).await.expect("cumulative ack");
            consumer
                .ack_confirmed(magnetar_client::AckType::Individual, &[t_ids[7], t_ids[9]])
                .await
                .expect("individual acks");
            ids.push(t_ids);
        }
        broker.kill9();
        client.close();

        let broker = broker.restart();
        assert_recovered_clean(&broker, false);
        let client = Client::connect(&broker.url()).await.expect("connect after restart");
        for ((topic, _), t_ids) in topics.iter().zip(&ids) {
            let consumer = subscribe(&client, topic, "confirmed").await;
            for i in unacked() {
                let m = receive(&consumer, topic).await;
                assert_eq!(m.id, t_ids[i as usize], "{topic}: after kill -9, expected message {i}");
                assert_eq!(m.payload.as_ref(), body(i).as_bytes());
            }
            assert_quiet(&consumer, topic).await;
        }
    });
}

/// A clean shutdown leaves a marker; a start must not trust it once new data
/// was written after it. Clean stop, start, more acknowledged messages,
/// `kill -9`, start: the log must be recovered as unclean, with everything.
#[test]
fn a_crash_after_a_clean_restart_is_recovered_as_a_crash() {
    run_with_timeout(Duration::from_secs(90), || {
        let dir = test_dir("clean-then-crash");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let topics = topics_per_shard("clean-then-crash", SHARDS, 1);
        let mut runs: Vec<Vec<ProducedRun>> = vec![Vec::new(); topics.len()];
        for (step, (kill, clean_after)) in [(false, true), (true, false), (true, false)].into_iter().enumerate() {
            for (i, (topic, _)) in topics.iter().enumerate() {
                let cmd = ProduceCmd::new(&broker.url(), topic, &format!("step{step}"), 300, 700);
                let receipts = cmd.run(Duration::from_secs(60));
                runs[i].push(ProducedRun { producer: cmd.producer_name.clone(), size: cmd.size, receipts });
            }
            if kill {
                broker.kill9();
            } else {
                assert!(broker.terminate().success());
            }
            broker = broker.restart();
            assert_recovered_clean(&broker, clean_after);
            // Every run finished, so the exact count is known: stop there
            // rather than wait for an idle timeout (a duplicate or a stray
            // message would take the place of an expected one and fail the check).
            let consumers: Vec<_> = topics
                .iter()
                .enumerate()
                .map(|(i, (topic, _))| {
                    let count = runs[i].iter().map(|r| r.receipts.len() as u64).sum();
                    ConsumeCmd { count, ..ConsumeCmd::new(&broker.url(), topic, &format!("check{step}")) }.spawn()
                })
                .collect();
            for (i, c) in consumers.into_iter().enumerate() {
                let run = c.finish(Duration::from_secs(60));
                run.assert_success();
                let received: Vec<_> = run.stdout_lines.iter().map(|l| Received::parse(l)).collect();
                check_topic_log(&topics[i].0, &runs[i], &received);
            }
        }
    });
}
