//! Issue #19: an acknowledged produce through the Pulsar door survives
//! `kill -9`.
//!
//! Goal: every message the official Python client got a receipt for is
//! stored after the broker is killed mid-run and restarted, in send order,
//! with nothing invented.
//!
//! Method: a Python producer (batched, async, numbered payloads) prints each
//! receipt; once a few thousand receipts are in, the broker gets SIGKILL,
//! then the producer too; a restarted broker's whole topic is read with the
//! native CLI and compared with the receipts.

use magnetar_tests::{pulsar_python, pulsar_tests_dir, test_dir, BrokerProcess, ConsumeCmd};
use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const RECEIPTS_BEFORE_KILL: usize = 3_000;

#[test]
fn pulsar_kill9_during_produce() {
    let dir = test_dir("pulsar-kill9");
    let mut broker = BrokerProcess::start(dir.path(), 1);
    let topic = "persistent://public/default/kill9";
    let mut producer = Command::new(pulsar_python())
        .arg(pulsar_tests_dir().join("client_tests.py"))
        .args([&format!("pulsar://{}", broker.url()), "produce_until_killed", topic])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the Python producer");
    let stdout = producer.stdout.take().expect("piped");
    let (tx, rx) = mpsc::channel::<u64>();
    let reader = std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines().map_while(Result::ok) {
            if let Some(n) = line.strip_prefix("OUT ACK ").and_then(|n| n.trim().parse().ok()) {
                if tx.send(n).is_err() {
                    break;
                }
            }
        }
    });
    let mut acked = BTreeSet::new();
    let deadline = Instant::now() + Duration::from_secs(180);
    while acked.len() < RECEIPTS_BEFORE_KILL {
        assert!(Instant::now() < deadline, "only {} receipts before the deadline", acked.len());
        if let Ok(n) = rx.recv_timeout(Duration::from_millis(200)) {
            acked.insert(n);
        }
    }
    broker.kill9();
    // Receipts already printed before the kill count too; none can come after.
    std::thread::sleep(Duration::from_millis(300));
    let _ = producer.kill();
    let _ = producer.wait();
    let _ = reader.join();
    acked.extend(rx.try_iter());
    eprintln!("{} receipts, highest {:?}", acked.len(), acked.last());

    let mut broker = broker.restart();
    let mut consume = ConsumeCmd::new(&broker.url(), topic, "check");
    consume.idle_timeout_s = 5.0;
    let got: Vec<u64> = consume
        .run(Duration::from_secs(120))
        .iter()
        .map(|m| std::str::from_utf8(&m.payload).ok().and_then(|s| s.parse().ok()).expect("a numbered payload"))
        .collect();
    eprintln!("{} messages stored", got.len());
    assert!(got.windows(2).all(|w| w[0] < w[1]), "stored out of order or twice");
    let stored: BTreeSet<u64> = got.iter().copied().collect();
    let lost: Vec<u64> = acked.difference(&stored).copied().take(10).collect();
    assert!(lost.is_empty(), "acknowledged messages lost after kill -9: {lost:?}…");
    // Nothing invented: every stored message was sent (numbers are dense
    // from 0 because the producer sends in order).
    assert_eq!(got.first(), Some(&0));
    assert_eq!(*got.last().unwrap() as usize, got.len() - 1, "a gap or a foreign message");
    broker.assert_running();
}
