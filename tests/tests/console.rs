//! Issue #23 end to end: the web console served by the broker, in a real
//! browser (Debian's chromium, headless, driven by Playwright for Python:
//! `tests/console/console_tests.py`).
//!
//! Method: a real 2-shard broker; a known workload through the CLI (a
//! producer sending keyed messages a few times a second, a consumer
//! `auditor` on the subscription `audit`); the browser script checks what
//! the pages show and acts through them; this side checks the broker's
//! state afterwards (what a consumer receives next). Screenshots of the
//! main pages are written under the target dir (`console-screenshots/`).

#![allow(clippy::unwrap_used)]

use magnetar_core::auth::{create_token, SigningKey};
use magnetar_tests::http::request;
use magnetar_tests::{
    run_async_with_timeout, run_console_test, run_with_timeout, test_dir, BrokerOptions, BrokerProcess, CliProcess,
    ConsumeCmd, Line, ProduceCmd, Received,
};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

const SHARDS: u32 = 2;
const CLI_TIMEOUT: Duration = Duration::from_secs(60);
const BROWSER_TIMEOUT: Duration = Duration::from_secs(180);

/// Keyed messages to `topic`, a few every 200 ms, until stopped.
struct Traffic {
    stop: Arc<AtomicBool>,
    thread: std::thread::JoinHandle<usize>,
}

impl Traffic {
    fn start(url: &str, topic: &str) -> Traffic {
        let stop = Arc::new(AtomicBool::new(false));
        let (url, topic, flag) = (url.to_string(), topic.to_string(), stop.clone());
        let thread = std::thread::spawn(move || {
            let mut sent = 0;
            let mut round = 0;
            while !flag.load(Ordering::SeqCst) {
                let mut p = ProduceCmd::new(&url, &topic, &format!("traffic-{round}"), 4, 48);
                p.extra_args = vec!["--keys".into(), "3".into()];
                sent += p.run(CLI_TIMEOUT).len();
                round += 1;
                std::thread::sleep(Duration::from_millis(200));
            }
            sent
        });
        Traffic { stop, thread }
    }

    /// Stops it; the number of messages sent.
    fn stop(self) -> usize {
        self.stop.store(true, Ordering::SeqCst);
        self.thread.join().unwrap()
    }
}

/// The subscription `audit` with its consumer `auditor` (a small receiver
/// queue, so permits show) reading `topic` from the start, while
/// [`Traffic`] sends to it.
struct Workload {
    consumer: CliProcess,
    traffic: Traffic,
}

impl Workload {
    fn start(url: &str, topic: &str) -> Workload {
        let mut c = ConsumeCmd::new(url, topic, "audit");
        c.idle_timeout_s = 400.0;
        c.extra_args = ["--consumer-name", "auditor", "--receiver-queue-size", "10"].map(String::from).to_vec();
        let consumer = c.spawn();
        Workload { consumer, traffic: Traffic::start(url, topic) }
    }

    /// Stops the traffic, waits for the consumer to receive (and
    /// acknowledge) everything sent, then closes it: the subscription
    /// stays. What it received, in topic order.
    fn drain(self) -> Vec<Received> {
        let Workload { mut consumer, traffic } = self;
        let sent = traffic.stop();
        let mut received = Vec::with_capacity(sent);
        while received.len() < sent {
            match consumer.next_line(Duration::from_secs(30)) {
                Line::Line(l) => received.push(Received::parse(&l)),
                other => panic!("consumer: {other:?} after {} of {sent}\n{}", received.len(), consumer.stderr()),
            }
        }
        consumer.kill9();
        received.sort_by_key(|r| r.id);
        received
    }
}

const TOPIC: &str = "persistent://public/default/console-orders";

/// Goal: the overview shows the topics and non-zero produce and consume
/// rates; the topics page lists and searches them; the tenants page shows
/// the namespace's policies; a topic page lists its subscription with its
/// type and its consumer, shows a non-zero rate in, and finds messages by
/// key (each with that key); a partitioned topic created and a namespace
/// policy changed through the pages are what the REST admin then reads.
#[test]
fn console_shows_a_live_workload() {
    run_with_timeout(Duration::from_secs(420), || {
        let dir = test_dir("console");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let base = format!("http://{}", broker.http_addr());

        // A second topic, idle, for the overview and the topics page.
        ProduceCmd::new(&url, "persistent://public/default/console-payments", "payments", 20, 64).run(CLI_TIMEOUT);
        let workload = Workload::start(&url, TOPIC);
        let run = run_console_test("workload", &base, &[TOPIC, "audit", "auditor", "k1"], BROWSER_TIMEOUT);
        for want in ["overview produce", "overview consume", "topic in", "subscription type Exclusive", "search rows 1"]
        {
            assert!(run.out.iter().any(|l| l.starts_with(want)), "no {want:?} in {:?}", run.out);
        }
        let found: usize =
            run.out.iter().find_map(|l| l.strip_prefix("found ")).and_then(|n| n.parse().ok()).unwrap_or(0);
        assert!(found > 0, "find by key found nothing: {:?}", run.out);
        assert!(!workload.drain().is_empty());

        // What the page did, as the REST admin reads it back.
        let http = broker.http_addr();
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let parts = rt.block_on(request(
            http,
            "GET",
            "/admin/v2/persistent/public/default/console-created/partitions",
            None,
            &[],
        ));
        assert_eq!(parts.json()["partitions"], 3, "{}", parts.body);
        let ttl = rt.block_on(request(http, "GET", "/admin/v2/namespaces/public/default/messageTTL", None, &[]));
        assert_eq!(ttl.json(), 3600, "{}", ttl.body);
        drop(broker);
    });
}

/// Goal: resetting a subscription's cursor by time through the topic page
/// changes what a consumer receives next: the first message published at
/// or after that time, which it had already received and acknowledged; the
/// page's peek shows that message first. Then skipping its backlog and
/// deleting it through the page leave no subscription.
#[test]
fn console_resets_a_cursor_by_time_and_a_consumer_receives_from_there() {
    run_with_timeout(Duration::from_secs(420), || {
        let dir = test_dir("console-reset");
        let broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let base = format!("http://{}", broker.http_addr());

        let workload = Workload::start(&url, TOPIC);
        // Traffic over more than two whole seconds, so a whole second
        // falls inside it.
        std::thread::sleep(Duration::from_secs(4));
        let received = workload.drain();
        let first = received.first().unwrap().publish_time_ms;
        let last = received.last().unwrap().publish_time_ms;
        assert!(last - first >= 2000, "the traffic lasted {} ms: too short to reset inside it", last - first);
        // A whole second inside the run (the page's time field has
        // seconds), and the first message at or after it.
        let when = (first / 1000 + 1) * 1000;
        let expected = received.iter().find(|r| r.publish_time_ms >= when).unwrap();
        assert!(expected.id > received[0].id, "the reset point must be after the first message");

        let run = run_console_test("reset", &base, &[TOPIC, "audit", &when.to_string()], BROWSER_TIMEOUT);
        let peeked = run.out.iter().find_map(|l| l.strip_prefix("peek first ")).unwrap();
        assert_eq!(peeked, String::from_utf8_lossy(&expected.payload), "peek after the reset: {:?}", run.out);

        // A consumer now receives from the reset point again.
        let mut again = ConsumeCmd::new(&url, TOPIC, "audit");
        again.count = 1;
        let got = again.run(CLI_TIMEOUT);
        assert_eq!(got.len(), 1, "nothing received after the reset");
        assert_eq!(got[0].id, expected.id, "after the reset to {when} the consumer got {:?}", got[0]);
        assert_eq!(got[0].payload, expected.payload);

        // Skip its backlog and delete it through the page.
        run_console_test("skip_delete", &base, &[TOPIC, "audit"], BROWSER_TIMEOUT);
        let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
        let path = "/admin/v2/persistent/public/default/console-orders/subscriptions";
        let subs = rt.block_on(request(broker.http_addr(), "GET", path, None, &[]));
        assert_eq!(subs.json(), serde_json::json!([]), "the deleted subscription is listed");
        drop(broker);
    });
}

const SECRET: &[u8] = b"console test secret, 32 bytes ok";

fn token(role: &str) -> String {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_secs();
    create_token(&SigningKey::Secret(SECRET.to_vec()), role, Some(now + 3600)).unwrap()
}

/// Goal: with token authentication on, the console asks for a token when
/// the broker refuses it one, keeps it in the tab's sessionStorage, and an
/// action the token's role may not do (create a topic, as a role with no
/// grants) shows the broker's own refusal; the topic is not created.
#[test]
fn console_asks_for_a_token_and_shows_the_brokers_refusal() {
    run_async_with_timeout(Duration::from_secs(300), || async {
        let dir = test_dir("console-auth");
        let key = dir.path().join("secret.key");
        std::fs::write(&key, SECRET).unwrap();
        let mut opts = BrokerOptions::new(1);
        opts.extra_args = vec![
            "--auth-token-secret-key".into(),
            key.to_str().unwrap().into(),
            "--superuser-roles".into(),
            "root".into(),
        ];
        let broker = BrokerProcess::start_with(&dir.path().join("data"), &opts);
        let http = broker.http_addr();
        let base = format!("http://{http}");
        let path = "/admin/v2/persistent/public/default/console-denied";
        let root = format!("Bearer {}", token("root"));

        // What the broker itself answers the limited role, for comparison.
        let viewer = token("viewer");
        let direct = request(http, "PUT", path, None, &[("authorization", &format!("Bearer {viewer}"))]).await;
        assert!(
            direct.status == 401 || direct.status == 403,
            "the broker let a role with no grants create a topic over HTTP ({}): {}",
            direct.status,
            direct.body
        );
        let reason = direct.json()["reason"].as_str().unwrap().to_string();

        let run = tokio::task::spawn_blocking(move || {
            run_console_test("refused", &base, &[&viewer, "console-denied"], BROWSER_TIMEOUT)
        })
        .await
        .unwrap();
        let shown = run.out.iter().find_map(|l| l.strip_prefix("refused ")).unwrap();
        assert!(shown.starts_with("Refused:"), "{shown}");
        assert!(shown.contains(&format!("(HTTP {})", direct.status)), "{shown}");
        assert!(shown.contains(&reason), "the page showed {shown:?}, the broker's reason is {reason:?}");
        let stats = request(http, "GET", &format!("{path}/stats"), None, &[("authorization", &root)]).await;
        assert_eq!(stats.status, 404, "the refused topic exists: {}", stats.body);
    });
}
