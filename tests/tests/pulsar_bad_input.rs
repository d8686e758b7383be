//! Goal: bad input on the Pulsar door (garbage, a frame over the size limit,
//! a wrong CRC-32C, a truncated protobuf, a SEND before PRODUCER) ends in an
//! error answer or a closed connection, never a panic, and other clients
//! are unaffected.
//!
//! Method: one broker; raw TCP connections send each bad input after a
//! valid CONNECT (and read until the broker closes or answers); then the
//! official Python client produces and consumes on the same broker, and the
//! broker's log has no panic.

use bytes::BytesMut;
use magnetar_pulsar_wire::proto::{base_command::Type, BaseCommand, CommandProducer};
use magnetar_pulsar_wire::{Frame, FrameDecoder};
use magnetar_tests::pulsar_raw::{command_frame as frame, send_frame};
use magnetar_tests::{run_pulsar_test, test_dir, BrokerProcess};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const READ_TIMEOUT: Duration = Duration::from_secs(10);

fn connect() -> Vec<u8> {
    magnetar_tests::pulsar_raw::connect_frame("raw-test")
}

fn send(producer_id: u64) -> Vec<u8> {
    send_frame(producer_id, 0, b"payload")
}

/// What the broker sent until it closed the connection (`closed`) or went
/// quiet for a second after answering.
struct Answer {
    frames: Vec<Frame>,
    closed: bool,
}

fn exchange(addr: &str, bytes: &[u8]) -> Answer {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_millis(1000))).unwrap_or_else(|e| panic!("{e}"));
    // The peer may close before everything is written; that is an answer.
    let _ = s.write_all(bytes);
    let mut buf = BytesMut::new();
    let mut decoder = FrameDecoder::new(64 << 20);
    let mut frames = Vec::new();
    let deadline = Instant::now() + READ_TIMEOUT;
    let mut chunk = [0u8; 4096];
    let closed = loop {
        assert!(Instant::now() < deadline, "the broker neither answered nor closed");
        match s.read(&mut chunk) {
            Ok(0) => break true,
            Ok(n) => buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {
                if !frames.is_empty() {
                    break false;
                }
            }
            Err(_) => break true,
        }
        while let Ok(Some(f)) = decoder.decode(&mut buf) {
            frames.push(f);
        }
    };
    Answer { frames, closed }
}

fn types(a: &Answer) -> Vec<i32> {
    a.frames.iter().map(|f| f.command.r#type).collect()
}

#[test]
fn pulsar_bad_input_is_refused_without_harm() {
    let dir = test_dir("pulsar-bad-input");
    let mut broker = BrokerProcess::start(dir.path(), 1);
    let addr = broker.url();

    // A frame far over the limit, announced by its first 4 bytes.
    let mut over = connect();
    over.extend_from_slice(&(512u32 << 20).to_be_bytes());
    over.extend_from_slice(&[0u8; 64]);
    let a = exchange(&addr, &over);
    assert!(a.closed, "over-size frame: connection left open");
    assert_eq!(types(&a).first(), Some(&(Type::Connected as i32)));

    // A wrong CRC-32C on a SEND.
    let producer = frame(&BaseCommand {
        r#type: Type::Producer as i32,
        producer: Some(CommandProducer {
            topic: "persistent://public/default/bad".into(),
            producer_id: 1,
            request_id: 1,
            ..Default::default()
        }),
        ..Default::default()
    });
    let mut bad_crc = connect();
    bad_crc.extend_from_slice(&producer);
    let mut s = send(1);
    let last = s.len() - 1;
    s[last] ^= 0xff;
    bad_crc.extend_from_slice(&s);
    let a = exchange(&addr, &bad_crc);
    assert!(a.closed, "wrong CRC: connection left open");

    // A truncated protobuf: the command size covers bytes that are not one.
    let mut truncated = connect();
    truncated.extend_from_slice(&[0, 0, 0, 9, 0, 0, 0, 5, 0x08, 0xff, 0xff, 0xff, 0xff]);
    let a = exchange(&addr, &truncated);
    assert!(a.closed, "truncated protobuf: connection left open");

    // Garbage before any CONNECT: a frame that is no command.
    let a = exchange(&addr, &[0, 0, 0, 8, 0, 0, 0, 4, 0x08, 0x99, 0x99, 0x99]);
    assert!(a.closed, "garbage: connection left open");

    // A SEND before PRODUCER: a SEND_ERROR, the connection stays.
    let mut early = connect();
    early.extend_from_slice(&send(7));
    let a = exchange(&addr, &early);
    assert_eq!(types(&a), vec![Type::Connected as i32, Type::SendError as i32], "SEND before PRODUCER");
    assert!(!a.closed);

    // An unknown command type is answered, not ignored.
    let mut unknown = connect();
    unknown.extend_from_slice(&frame(&BaseCommand { r#type: Type::NewTxn as i32, ..Default::default() }));
    let a = exchange(&addr, &unknown);
    assert_eq!(types(&a), vec![Type::Connected as i32, Type::Error as i32], "NEW_TXN");

    run_pulsar_test(
        &format!("pulsar://{addr}"),
        "still_works",
        "persistent://public/default/ok",
        &[],
        Duration::from_secs(120),
    );
    broker.assert_running();
    assert!(!broker.log().contains("panicked"), "broker panicked:\n{}", broker.log_tail());
}
