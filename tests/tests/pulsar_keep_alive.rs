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

use bytes::BytesMut;
use magnetar_pulsar_wire::proto::{
    base_command::Type, command_subscribe::SubType, BaseCommand, CommandConnect, CommandFlow, CommandProducer,
    CommandSend, CommandSubscribe, MessageMetadata, ProducerAccessMode,
};
use magnetar_pulsar_wire::{encode_command, encode_payload_command, Frame, FrameDecoder};
use magnetar_tests::{test_dir, BrokerOptions, BrokerProcess};
use prost::Message;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const READ_TIMEOUT: Duration = Duration::from_secs(15);
const TOPIC: &str = "persistent://public/default/keep-alive";
const EXCLUSIVE_TOPIC: &str = "persistent://public/default/keep-alive-exclusive";
const INTERVAL_S: u64 = 1;
const MESSAGES: usize = 5;

/// One raw Pulsar connection.
struct Conn {
    s: TcpStream,
    buf: BytesMut,
    decoder: FrameDecoder,
    /// PINGs received (and, when `answer_pings`, answered).
    pings: usize,
    answer_pings: bool,
}

/// What one read brought.
enum Got {
    Frame(Box<Frame>),
    Nothing,
    Closed,
}

impl Conn {
    fn open(addr: &str, answer_pings: bool) -> Conn {
        let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        s.set_read_timeout(Some(Duration::from_millis(50))).unwrap_or_else(|e| panic!("{e}"));
        let mut c = Conn { s, buf: BytesMut::new(), decoder: FrameDecoder::new(64 << 20), pings: 0, answer_pings };
        c.put(&BaseCommand {
            r#type: Type::Connect as i32,
            connect: Some(CommandConnect {
                client_version: "raw-keep-alive-test".into(),
                protocol_version: Some(21),
                ..Default::default()
            }),
            ..Default::default()
        });
        assert_eq!(c.next().command.r#type, Type::Connected as i32);
        c
    }

    fn put(&mut self, c: &BaseCommand) {
        let mut b = BytesMut::new();
        encode_command(c, &mut b).unwrap_or_else(|e| panic!("{e}"));
        self.s.write_all(&b).unwrap_or_else(|e| panic!("write: {e}"));
    }

    /// A frame other than PING, nothing within the socket's read timeout,
    /// or the end of the stream.
    fn poll(&mut self) -> Got {
        let mut chunk = [0u8; 4096];
        loop {
            if let Some(f) = self.decoder.decode(&mut self.buf).unwrap_or_else(|e| panic!("bad frame: {e}")) {
                if f.command.r#type == Type::Ping as i32 {
                    self.pings += 1;
                    if self.answer_pings {
                        self.put(&BaseCommand {
                            r#type: Type::Pong as i32,
                            pong: Some(Default::default()),
                            ..Default::default()
                        });
                    }
                    continue;
                }
                return Got::Frame(Box::new(f));
            }
            match self.s.read(&mut chunk) {
                Ok(0) => return Got::Closed,
                Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
                Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                    return Got::Nothing
                }
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return Got::Closed,
                Err(e) => panic!("read: {e}"),
            }
        }
    }

    /// The next frame that is not a PING.
    fn next(&mut self) -> Frame {
        let deadline = Instant::now() + READ_TIMEOUT;
        loop {
            match self.poll() {
                Got::Frame(f) => return *f,
                Got::Closed => panic!("the broker closed the connection"),
                Got::Nothing => assert!(Instant::now() < deadline, "no answer from the broker within {READ_TIMEOUT:?}"),
            }
        }
    }

    fn subscribe(&mut self, consumer_id: u64) {
        self.put(&BaseCommand {
            r#type: Type::Subscribe as i32,
            subscribe: Some(CommandSubscribe {
                topic: TOPIC.into(),
                subscription: "s".into(),
                sub_type: SubType::Shared as i32,
                consumer_id,
                request_id: 100 + consumer_id,
                ..Default::default()
            }),
            ..Default::default()
        });
        let f = self.next();
        assert_eq!(f.command.r#type, Type::Success as i32, "{:?}", f.command);
        self.put(&BaseCommand {
            r#type: Type::Flow as i32,
            flow: Some(CommandFlow { consumer_id, message_permits: 1000 }),
            ..Default::default()
        });
    }

    /// PRODUCER and its answer's type.
    fn producer(&mut self, producer_id: u64, topic: &str, mode: ProducerAccessMode) -> Frame {
        self.put(&BaseCommand {
            r#type: Type::Producer as i32,
            producer: Some(CommandProducer {
                topic: topic.into(),
                producer_id,
                request_id: 200 + producer_id,
                producer_name: Some(format!("p{producer_id}")),
                producer_access_mode: Some(mode as i32),
                ..Default::default()
            }),
            ..Default::default()
        });
        self.next()
    }

    fn send(&mut self, producer_id: u64, sequence_id: u64) {
        let c = BaseCommand {
            r#type: Type::Send as i32,
            send: Some(CommandSend { producer_id, sequence_id, num_messages: Some(1), ..Default::default() }),
            ..Default::default()
        };
        let meta = MessageMetadata {
            producer_name: format!("p{producer_id}"),
            sequence_id,
            publish_time: 1,
            ..Default::default()
        }
        .encode_to_vec();
        let mut b = BytesMut::new();
        encode_payload_command(&c, &meta, format!("m{sequence_id}").as_bytes(), &mut b)
            .unwrap_or_else(|e| panic!("{e}"));
        self.s.write_all(&b).unwrap_or_else(|e| panic!("write: {e}"));
    }

    /// `(ledger, entry)` of the next `n` MESSAGE frames.
    fn messages(&mut self, n: usize) -> Vec<(u64, u64)> {
        (0..n)
            .map(|_| {
                let f = self.next();
                let Some(m) = f.command.message else { panic!("not a MESSAGE: {:?}", f.command.r#type) };
                (m.message_id.ledger_id, m.message_id.entry_id)
            })
            .collect()
    }
}

#[test]
fn pulsar_keep_alive_closes_silent_clients() {
    let dir = test_dir("pulsar-keep-alive");
    let mut options = BrokerOptions::new(1);
    options.extra_args = vec![format!("--pulsar-keep-alive-interval-s={INTERVAL_S}")];
    let broker = BrokerProcess::start_with(dir.path(), &options);
    let addr = broker.url();
    let interval = Duration::from_secs(INTERVAL_S);

    let mut good = Conn::open(&addr, true);
    let mut silent = Conn::open(&addr, false);
    silent.subscribe(1);
    let f = silent.producer(2, EXCLUSIVE_TOPIC, ProducerAccessMode::Exclusive);
    assert!(f.command.producer_success.is_some(), "{:?}", f.command);
    // `silent` sends nothing from here on.
    let last_sent = Instant::now();

    let f = good.producer(1, TOPIC, ProducerAccessMode::Shared);
    assert!(f.command.producer_success.is_some(), "{:?}", f.command);
    for seq in 0..MESSAGES as u64 {
        good.send(1, seq);
        assert_eq!(good.next().command.r#type, Type::SendReceipt as i32);
    }
    let held = silent.messages(MESSAGES);
    // The topic is held while `silent` is connected.
    let f = good.producer(3, EXCLUSIVE_TOPIC, ProducerAccessMode::Exclusive);
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
    good.subscribe(4);
    let mut again = good.messages(MESSAGES);
    again.sort_unstable();
    let mut held = held;
    held.sort_unstable();
    assert_eq!(again, held, "the silent consumer's unacked messages");
    let f = good.producer(3, EXCLUSIVE_TOPIC, ProducerAccessMode::Exclusive);
    assert!(f.command.producer_success.is_some(), "{:?}", f.command);
    let log = broker.log();
    assert!(log.contains("keep-alive"), "{}", broker.log_tail());
    assert!(!log.contains("panicked"), "{}", broker.log_tail());
}
