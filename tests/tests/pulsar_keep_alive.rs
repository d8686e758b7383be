//! Goal: the Pulsar door keeps connections alive as Apache Pulsar's broker
//! does (issue #19): a client silent for `--pulsar-keep-alive-interval-s`
//! is pinged; one that answers stays connected, one that stays silent as
//! long again is closed, and what it held is released: its consumer's
//! unacked messages go to another consumer, its exclusive producer's hold
//! on a topic ends.
//!
//! Method: one broker with a 1 s interval and two raw connections. `silent`
//! subscribes, receives messages without acking them, takes a topic with an
//! exclusive producer and then sends nothing; `good` answers every PING and
//! otherwise sends nothing while `silent` is watched for its end in a
//! thread. Then `good`, still connected, subscribes and gets `silent`'s
//! messages, and takes the exclusive producer's topic.

use magnetar_pulsar_wire::proto::{
    base_command::Type, command_subscribe::SubType, CommandProducer, CommandSubscribe, ProducerAccessMode,
};
use magnetar_pulsar_wire::Frame;
use magnetar_tests::pulsar_raw::{Got, RawPulsar};
use magnetar_tests::{test_dir, BrokerOptions, BrokerProcess};
use std::time::{Duration, Instant};

const TOPIC: &str = "persistent://public/default/keep-alive";
const EXCLUSIVE_TOPIC: &str = "persistent://public/default/keep-alive-exclusive";
const INTERVAL_S: u64 = 1;
const MESSAGES: usize = 5;

fn open(addr: &str, answer_pings: bool) -> RawPulsar {
    RawPulsar::open(addr, "raw-keep-alive-test", answer_pings, Duration::from_millis(50))
}

/// Subscribes `consumer_id` to TOPIC (Shared) with 1,000 permits.
fn subscribe(c: &mut RawPulsar, consumer_id: u64) {
    let subscribe = CommandSubscribe {
        topic: TOPIC.into(),
        subscription: "s".into(),
        sub_type: SubType::Shared as i32,
        consumer_id,
        request_id: 100 + consumer_id,
        ..Default::default()
    };
    c.subscribe(subscribe, 1000);
}

/// PRODUCER and its answer.
fn producer(c: &mut RawPulsar, producer_id: u64, topic: &str, mode: ProducerAccessMode) -> Frame {
    c.producer(CommandProducer {
        topic: topic.into(),
        producer_id,
        request_id: 200 + producer_id,
        producer_name: Some(format!("p{producer_id}")),
        producer_access_mode: Some(mode as i32),
        ..Default::default()
    })
}

#[test]
fn pulsar_keep_alive_closes_silent_clients() {
    let dir = test_dir("pulsar-keep-alive");
    let mut options = BrokerOptions::new(1);
    options.extra_args = vec![format!("--pulsar-keep-alive-interval-s={INTERVAL_S}")];
    let broker = BrokerProcess::start_with(dir.path(), &options);
    let addr = broker.url();
    let interval = Duration::from_secs(INTERVAL_S);

    let mut good = open(&addr, true);
    let mut silent = open(&addr, false);
    subscribe(&mut silent, 1);
    let f = producer(&mut silent, 2, EXCLUSIVE_TOPIC, ProducerAccessMode::Exclusive);
    assert!(f.command.producer_success.is_some(), "{:?}", f.command);
    // `silent` sends nothing from here on.
    let last_sent = Instant::now();

    let f = producer(&mut good, 1, TOPIC, ProducerAccessMode::Shared);
    assert!(f.command.producer_success.is_some(), "{:?}", f.command);
    for seq in 0..MESSAGES as u64 {
        good.send(1, seq, format!("m{seq}").as_bytes());
        assert_eq!(good.next_frame().command.r#type, Type::SendReceipt as i32);
    }
    let held = silent.messages(MESSAGES);
    // The topic is held while `silent` is connected.
    let f = producer(&mut good, 3, EXCLUSIVE_TOPIC, ProducerAccessMode::Exclusive);
    assert_eq!(f.command.r#type, Type::Error as i32, "{:?}", f.command);

    let (closed_after, silent_pings) = std::thread::scope(|scope| {
        let watch = scope.spawn(move || loop {
            match silent.poll() {
                Got::Closed => break (last_sent.elapsed(), silent.pings),
                Got::Frame(f) => assert_eq!(f.command.r#type, Type::Error as i32, "{:?}", f.command),
                Got::Nothing => assert!(last_sent.elapsed() < interval * 6, "the silent client is still connected"),
            }
        });
        // `good` only answers PINGs meanwhile, for longer than `silent` had.
        let until = Instant::now() + interval * 4;
        while Instant::now() < until {
            match good.poll() {
                Got::Frame(f) => panic!("unexpected {:?}", f.command),
                Got::Closed => panic!("the broker closed a client that answers its PINGs"),
                Got::Nothing => {}
            }
        }
        watch.join().unwrap_or_else(|e| std::panic::resume_unwind(e))
    });
    println!("silent client closed {closed_after:?} after it last sent, {silent_pings} PING(s) unanswered");
    assert!(silent_pings >= 1, "closed without a PING first");
    assert!(closed_after >= interval * 2 - Duration::from_millis(100), "closed too early: {closed_after:?}");
    // No upper bound but the watch's (6 intervals): a loaded CI machine
    // may be late by seconds.
    assert!(good.pings >= 2, "the broker pinged the answering client {} time(s)", good.pings);

    // What `silent` held is released.
    subscribe(&mut good, 4);
    let mut again = good.messages(MESSAGES);
    again.sort_unstable();
    let mut held = held;
    held.sort_unstable();
    assert_eq!(again, held, "the silent consumer's unacked messages");
    let f = producer(&mut good, 3, EXCLUSIVE_TOPIC, ProducerAccessMode::Exclusive);
    assert!(f.command.producer_success.is_some(), "{:?}", f.command);
    let log = broker.log();
    assert!(log.contains("keep-alive"), "{}", broker.log_tail());
    assert!(!log.contains("panicked"), "{}", broker.log_tail());
}
