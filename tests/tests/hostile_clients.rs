//! Goal: no client can make the broker hold unbounded memory or take the
//! connection slots others need (issue #17, items 1 and 2; invariant 5:
//! memory per shard is bounded by configuration, whatever clients do).
//!
//! Method: a real broker process per test, with small bounds and timeouts
//! passed as flags so each test runs in seconds. Memory is the broker's
//! resident set (`VmRSS` in `/proc/PID/status`), sampled while the hostile
//! client works; its rise over the value before must stay under a stated
//! bound, well under what the client sent or made the broker produce.
//! Connections are raw sockets (`RawConnection`, blocking std TCP) so a test
//! can stop reading, or stop mid-frame, exactly when it chooses.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{Client, OutgoingMessage};
use magnetar_tests::{
    connect_frame, frame_bytes, run_async_with_timeout, run_with_timeout, test_dir, BrokerOptions, BrokerProcess,
    RawConnection,
};
use magnetar_wire::{Command, SubscriptionType};
use std::io::Write;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

fn rss_kib(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap();
    line.split_whitespace().nth(1).unwrap().parse().unwrap()
}

/// Samples `pid`'s resident set every 20 ms until dropped; `peak` is the
/// highest value seen.
struct RssSampler {
    stop: Arc<AtomicBool>,
    peak: Arc<AtomicU64>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl RssSampler {
    fn start(pid: u32) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let peak = Arc::new(AtomicU64::new(rss_kib(pid)));
        let (s, p) = (stop.clone(), peak.clone());
        let thread = std::thread::spawn(move || {
            while !s.load(Ordering::Relaxed) {
                if let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) {
                    if let Some(kib) = status
                        .lines()
                        .find(|l| l.starts_with("VmRSS:"))
                        .and_then(|l| l.split_whitespace().nth(1))
                        .and_then(|v| v.parse::<u64>().ok())
                    {
                        p.fetch_max(kib, Ordering::Relaxed);
                    }
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        });
        Self { stop, peak, thread: Some(thread) }
    }

    fn peak_kib(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            t.join().unwrap();
        }
        self.peak.load(Ordering::Relaxed)
    }
}

impl Drop for RssSampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

fn broker_with(dir: &std::path::Path, shards: u32, args: &[&str]) -> BrokerProcess {
    let mut options = BrokerOptions::new(shards);
    options.write_cache_mib = Some(16);
    options.extra_args = args.iter().map(|a| a.to_string()).collect();
    BrokerProcess::start_with(dir, &options)
}

/// Waits up to `timeout` for `needle` in the broker's log.
fn wait_for_log(broker: &BrokerProcess, needle: &str, timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while Instant::now() < deadline {
        if broker.log().contains(needle) {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

const MIB: u64 = 1024;

/// (a) A consumer that grants a million permits and then never reads its
/// socket, while a producer writes 256 MiB to its topic: the broker pauses
/// deliveries to it once its output passes `--outbox-bytes-max` (1 MiB
/// here) and reads no more entries for it. Bound on the rise: write cache
/// (16 MiB) + read cache (64 MiB) + 48 MiB of slack = 128 MiB, half of what
/// was written (a broker that queued the deliveries holds all of it).
#[test]
fn a_consumer_that_never_reads_does_not_grow_broker_memory() {
    const MESSAGE_BYTES: usize = 64 * 1024;
    const WRITTEN_MIB: u64 = 256;
    const BOUND_MIB: u64 = 128;
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("hostile-unread-consumer");
        let broker = broker_with(dir.path(), 1, &["--outbox-bytes-max", "1048576", "--unread-output-timeout-s", "120"]);
        let pid = broker.pid();
        let addr = broker.addr();
        let topic = "unread-consumer";
        let stalled = tokio::task::spawn_blocking(move || {
            let mut raw = RawConnection::connect(addr);
            raw.handshake();
            let answer = raw.subscribe(1, 1, topic, "stalled", SubscriptionType::Exclusive);
            assert!(matches!(answer, Command::Success { .. }), "subscribe answered {answer:?}");
            raw.send(&Command::Flow { consumer_id: 1, permits: 1_000_000 }, &[]);
            raw
        })
        .await
        .unwrap();
        let client = Client::connect(&broker.url()).await.expect("connect");
        let producer = client.producer(topic).create().await.expect("producer");
        for _ in 0..16 {
            producer.send(OutgoingMessage::new(vec![1u8; MESSAGE_BYTES])).await.expect("send");
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let baseline = rss_kib(pid);
        let mut sampler = RssSampler::start(pid);
        let started = Instant::now();
        let messages = WRITTEN_MIB * 1024 * 1024 / MESSAGE_BYTES as u64;
        let mut receipts = std::collections::VecDeque::new();
        for _ in 0..messages {
            receipts.push_back(producer.send_async(OutgoingMessage::new(vec![2u8; MESSAGE_BYTES])).await.unwrap());
            while receipts.len() > 64 {
                receipts.pop_front().unwrap().await.expect("receipt");
            }
        }
        for r in receipts {
            r.await.expect("receipt");
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
        let peak = sampler.peak_kib();
        let rise = peak.saturating_sub(baseline);
        println!(
            "unread consumer: wrote {WRITTEN_MIB} MiB in {:?}; broker VmRSS baseline {} MiB, peak {} MiB, rise {} MiB \
             (bound {BOUND_MIB} MiB)",
            started.elapsed(),
            baseline / MIB,
            peak / MIB,
            rise / MIB
        );
        assert!(rise < BOUND_MIB * MIB, "broker RSS rose {} MiB, bound {BOUND_MIB} MiB", rise / MIB);
        drop(stalled);
    });
}

/// (b) A client that sends Pings as fast as it can and never reads the
/// Pongs: the broker stops reading it once the Pongs waiting pass
/// `--outbox-bytes-max` (1 MiB), and closes it after
/// `--unread-output-timeout-s` (3 s) with a logged reason. The client tries
/// to send 64 MiB of Pings; the broker's rise must stay under 16 MiB.
#[test]
fn pings_whose_pongs_are_never_read_are_bounded_and_closed() {
    const BOUND_MIB: u64 = 16;
    run_with_timeout(Duration::from_secs(60), || {
        let dir = test_dir("hostile-pings");
        let broker = broker_with(dir.path(), 1, &["--outbox-bytes-max", "1048576", "--unread-output-timeout-s", "3"]);
        let pid = broker.pid();
        let mut raw = RawConnection::connect(broker.addr());
        raw.handshake();
        let baseline = rss_kib(pid);
        let mut sampler = RssSampler::start(pid);
        let ping = frame_bytes(&Command::Ping, &[]);
        let chunk: Vec<u8> = ping.iter().copied().cycle().take(ping.len() * 4096).collect();
        let want = 64u64 << 20;
        raw.stream.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
        let mut sent = 0u64;
        let started = Instant::now();
        // Whole pings only: a partial write goes on where it stopped.
        let mut at = 0;
        while sent < want {
            match raw.stream.write(&chunk[at..]) {
                Ok(n) => {
                    sent += n as u64;
                    at = (at + n) % chunk.len();
                }
                // The broker stopped reading (or closed): the socket is full.
                Err(_) => break,
            }
        }
        let closed = wait_for_log(&broker, "unread_output_timeout", Duration::from_secs(15));
        let peak = sampler.peak_kib();
        let rise = peak.saturating_sub(baseline);
        println!(
            "unread pongs: sent {} MiB of pings in {:?}; broker VmRSS baseline {} MiB, peak {} MiB, rise {} MiB \
             (bound {BOUND_MIB} MiB)",
            sent >> 20,
            started.elapsed(),
            baseline / MIB,
            peak / MIB,
            rise / MIB
        );
        assert!(rise < BOUND_MIB * MIB, "broker RSS rose {} MiB, bound {BOUND_MIB} MiB", rise / MIB);
        assert!(closed, "the connection was not closed for unread output:\n{}", broker.log_tail());
    });
}

/// (c) 24 connections each complete the handshake, then all send 4 MiB of a
/// 6 MiB frame and stall (96 MiB in all): the shard reads no more once its
/// connections hold `--shard-buffered-bytes-max` (32 MiB), and
/// `--partial-frame-timeout-s` (2 s) closes them, a few at a time as the
/// shard reads the next ones. The rise must stay under 64 MiB; afterwards a
/// well-behaved client produces.
#[test]
fn stalled_partial_frames_are_bounded_and_time_out() {
    const CONNECTIONS: usize = 24;
    const BOUND_MIB: u64 = 64;
    run_async_with_timeout(Duration::from_secs(90), || async {
        let dir = test_dir("hostile-partial-frames");
        let broker =
            broker_with(dir.path(), 1, &["--shard-buffered-bytes-max", "33554432", "--partial-frame-timeout-s", "2"]);
        let pid = broker.pid();
        let addr = broker.addr();
        let baseline = rss_kib(pid);
        let mut sampler = RssSampler::start(pid);
        let frame = frame_bytes(&Command::Send { producer_id: 1, sequence_id: 1, num_messages: 1 }, &[7u8; 6 << 20]);
        let part = Arc::new(frame[..4 << 20].to_vec());
        let started = Instant::now();
        // Handshakes first: once the shard holds its bound, it reads nobody.
        let connected: Vec<RawConnection> = (0..CONNECTIONS)
            .map(|_| {
                let mut raw = RawConnection::connect(addr);
                raw.handshake();
                raw
            })
            .collect();
        let senders: Vec<_> = connected
            .into_iter()
            .map(|mut raw| {
                let part = part.clone();
                std::thread::spawn(move || {
                    raw.stream.set_write_timeout(Some(Duration::from_secs(2))).unwrap();
                    let _ = raw.stream.write_all(&part);
                    raw
                })
            })
            .collect();
        let raws: Vec<RawConnection> = senders.into_iter().map(|t| t.join().unwrap()).collect();
        // Every connection has sent what it could; the broker holds its
        // share of it until the partial-frame timeout.
        std::thread::sleep(Duration::from_millis(500));
        let sent_rise = rss_kib(pid).saturating_sub(baseline);
        println!(
            "partial frames: {CONNECTIONS} connections × 4 MiB sent; broker VmRSS rise {} MiB so far",
            sent_rise / MIB
        );
        assert!(sent_rise < BOUND_MIB * MIB, "broker RSS rose {} MiB, bound {BOUND_MIB} MiB", sent_rise / MIB);
        let closes: Vec<_> = raws
            .into_iter()
            .map(|raw| std::thread::spawn(move || raw.expect_closed("a stalled partial frame")))
            .collect();
        for c in closes {
            c.join().unwrap();
        }
        let peak = sampler.peak_kib();
        let rise = peak.saturating_sub(baseline);
        println!(
            "partial frames: all closed after {:?}; broker VmRSS baseline {} MiB, peak {} MiB, rise {} MiB (bound \
             {BOUND_MIB} MiB)",
            started.elapsed(),
            baseline / MIB,
            peak / MIB,
            rise / MIB
        );
        assert!(rise < BOUND_MIB * MIB, "broker RSS rose {} MiB, bound {BOUND_MIB} MiB", rise / MIB);
        assert!(broker.log().contains("partial_frame_timeout"), "no logged reason:\n{}", broker.log_tail());
        let client = Client::connect(&broker.url()).await.expect("connect after the stall");
        let producer = client.producer("after-partials").create().await.expect("producer");
        producer.send(OutgoingMessage::new("hello")).await.expect("send after the stall");
    });
}

/// (d) A shard at its connection limit (`--connections-per-shard-max 24`)
/// held by 12 connections that never handshake and 12 that handshake and
/// then idle: a well-behaved client still connects and produces, three
/// times over (each time evicting a handshake-less connection first, then
/// an idle one), while the holders' handshake and idle timeouts are far
/// away.
#[test]
fn a_well_behaved_client_connects_while_others_hold_the_slots() {
    run_async_with_timeout(Duration::from_secs(60), || async {
        let dir = test_dir("hostile-slots");
        let broker = broker_with(
            dir.path(),
            1,
            &[
                "--connections-per-shard-max",
                "24",
                "--connections-reserve",
                "4",
                "--handshake-timeout-s",
                "120",
                "--idle-timeout-s",
                "120",
            ],
        );
        let addr = broker.addr();
        let holders = tokio::task::spawn_blocking(move || {
            let mut held = Vec::new();
            for i in 0..24 {
                let mut raw = RawConnection::connect(addr);
                if i % 2 == 1 {
                    raw.handshake();
                }
                held.push(raw);
            }
            held
        })
        .await
        .unwrap();
        // Let the broker take every connection in.
        tokio::time::sleep(Duration::from_millis(300)).await;
        for round in 0..3 {
            let client = tokio::time::timeout(Duration::from_secs(10), Client::connect(&broker.url()))
                .await
                .unwrap_or_else(|_| panic!("round {round}: connect timed out"))
                .unwrap_or_else(|e| panic!("round {round}: connect failed: {e}\n{}", broker.log_tail()));
            let producer = client.producer("slots").create().await.expect("producer");
            producer.send(OutgoingMessage::new(format!("round {round}"))).await.expect("send");
            // The client stays connected: its slot is busy from now on.
            std::mem::forget(client);
        }
        assert!(broker.log().contains("evicted to make room"), "{}", broker.log_tail());
        drop(holders);
    });
}

/// (e) A connection that never sends its handshake is closed after
/// `--handshake-timeout-s` (2 s), with a logged reason; one that
/// handshakes and then only pings, with no producer or consumer, is closed
/// after `--idle-timeout-s` (2 s): pings do not count as requests.
#[test]
fn silent_and_idle_connections_are_closed() {
    run_with_timeout(Duration::from_secs(60), || {
        let dir = test_dir("hostile-silent");
        let broker = broker_with(dir.path(), 1, &["--handshake-timeout-s", "2", "--idle-timeout-s", "2"]);
        let silent = RawConnection::connect(broker.addr());
        let started = Instant::now();
        silent.expect_closed("a connection without a handshake");
        let silent_after = started.elapsed();
        assert!(wait_for_log(&broker, "handshake_timeout", Duration::from_secs(5)), "{}", broker.log_tail());

        let mut idle = RawConnection::connect(broker.addr());
        idle.handshake();
        let started = Instant::now();
        let pinger = {
            let mut stream = idle.stream.try_clone().unwrap();
            std::thread::spawn(move || {
                let ping = frame_bytes(&Command::Ping, &[]);
                while stream.write_all(&ping).is_ok() && started.elapsed() < Duration::from_secs(10) {
                    std::thread::sleep(Duration::from_millis(200));
                }
            })
        };
        let ending = idle.expect_closed("an idle connection that pings");
        let idle_after = started.elapsed();
        assert!(ending.frames.iter().any(|c| matches!(c, Command::Pong)), "no pong: {:?}", ending.frames);
        assert!(wait_for_log(&broker, "idle_timeout", Duration::from_secs(5)), "{}", broker.log_tail());
        pinger.join().unwrap();
        println!("closed: without a handshake after {silent_after:?}, idle after {idle_after:?}");
        // Connecting again works.
        let mut again = RawConnection::connect(broker.addr());
        let _ = connect_frame();
        again.handshake();
    });
}
