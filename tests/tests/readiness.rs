//! Issue #21: readiness across a long recovery. While the shards recover
//! their logs after a `kill -9`, `/ready` and `/admin/v2/brokers/ready`
//! answer 503 and `/healthz` 200; once every shard serves, both readiness
//! probes answer 200.
//!
//! Method: a 1-shard broker takes a large tail of messages and is killed
//! with SIGKILL (no clean shutdown, so the restart scans the tail); the
//! restart's HTTP server starts before recovery and prints its address
//! first, and the test polls the three probes every 10 ms until the
//! broker prints its listening line. The tail is sized so that recovery of
//! a debug build takes seconds (the run prints how long it was observed
//! not ready); a recovery too quick to observe fails the test rather than
//! passing without checking anything.

use magnetar_tests::http::request;
use magnetar_tests::{
    run_async_with_timeout, test_dir, BrokerOptions, BrokerProcess, ProduceCmd, HTTP_PREFIX, LISTENING_PREFIX,
};
use std::time::{Duration, Instant};

/// The tail: 1,500 messages of 64 KiB (about 100 MiB).
const TAIL_MESSAGES: u64 = 1500;
const TAIL_MESSAGE_BYTES: usize = 64 * 1024;

#[test]
fn readiness_is_503_during_recovery_and_200_after() {
    run_async_with_timeout(Duration::from_secs(400), || async {
        let dir = test_dir("readiness-recovery");
        let options = BrokerOptions::new(1);
        let mut broker = BrokerProcess::start_with(dir.path(), &options);
        let topic = "persistent://public/default/readiness-tail";
        ProduceCmd::new(&broker.url(), topic, "tail", TAIL_MESSAGES, TAIL_MESSAGE_BYTES).run(Duration::from_secs(300));
        broker.kill9();

        let started = Instant::now();
        let (mut child, lines) = BrokerProcess::spawn_starting(dir.path(), &options);
        let http = loop {
            let line = lines.recv_timeout(Duration::from_secs(60)).expect("the broker's HTTP address line");
            if let Some(addr) = line.strip_prefix(HTTP_PREFIX) {
                break addr.trim().parse::<std::net::SocketAddr>().expect("an HTTP address");
            }
            assert!(!line.starts_with(LISTENING_PREFIX), "the listening line came before the HTTP line");
        };
        let mut not_ready = 0u32;
        let mut not_ready_for = Duration::ZERO;
        let listening = loop {
            // The broker's own word that it serves ends the polling.
            if let Ok(line) = lines.try_recv() {
                if line.starts_with(LISTENING_PREFIX) {
                    break true;
                }
            }
            if let Some(status) = child.try_wait() {
                panic!("the broker exited during recovery ({status})");
            }
            assert!(started.elapsed() < Duration::from_secs(300), "no listening line within 300 s");
            assert_eq!(request(http, "GET", "/healthz", None, &[]).await.status, 200, "liveness during recovery");
            let ready = request(http, "GET", "/ready", None, &[]).await;
            let brokers_ready = request(http, "GET", "/admin/v2/brokers/ready", None, &[]).await;
            if ready.status == 503 {
                // Both probes read one flag; the second may already see it set.
                assert!(matches!(brokers_ready.status, 503 | 200), "{brokers_ready:?}");
                not_ready += 1;
                not_ready_for = started.elapsed();
            } else {
                assert_eq!(ready.status, 200, "{ready:?}");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert!(listening);
        println!("observed not ready {not_ready} times, for {not_ready_for:?} after the restart began");
        assert!(
            not_ready > 0,
            "recovery ended before the first probe: make the tail larger (TAIL_MESSAGES) so this test checks something"
        );
        for path in ["/ready", "/admin/v2/brokers/ready", "/healthz"] {
            assert_eq!(request(http, "GET", path, None, &[]).await.status, 200, "{path} once serving");
        }
        drop(child);
    });
}
