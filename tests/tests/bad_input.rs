//! Goal: invariant 6 of the design brief: bad input from a client yields an
//! error reply or a closed connection, never a panic, and never touches other
//! clients.
//!
//! Method: one 2-shard broker process. Before anything bad happens, an SDK
//! client is connected on each shard with a producer and a consumer. Then raw
//! TCP connections send: text, an oversized length, a too-small length, a
//! frame with a bad checksum (first frame and after the handshake), a frame
//! that is not `Connect` first, an undecodable command, a truncated frame, a
//! `Send` for an unknown producer and a `Send` whose message blob is invalid,
//! and finally a seeded series of random byte strings (replay with
//! `MAGNETAR_TEST_SEED`). Each must end in an error frame and/or a closed
//! connection (or, for request-level errors, an error answer on a connection
//! that keeps working). Afterwards the SDK clients, connected all along,
//! still produce and consume, and the broker is still running with no panic
//! in its log.

use magnetar_client::{Client, Consumer, InitialPosition, OutgoingMessage, Producer};
use magnetar_tests::{
    connect_frame, connect_on_shard, frame_bytes, run_async_with_timeout, test_dir, test_seed, BrokerProcess, Ending,
    RawConnection, SplitMix64, RAW_TIMEOUT,
};
use magnetar_wire::{Command, ErrorCode};
use std::net::{Shutdown, SocketAddr};
use std::time::Duration;

const SHARDS: u32 = 2;
const RANDOM_CONNECTIONS: usize = 40;

/// A connection closed for a protocol violation: any frame the broker managed
/// to send before closing must be its `Error(ProtocolError)`.
fn assert_protocol_close(ending: &Ending, what: &str) {
    eprintln!("{what}: closed after {:?}", ending.frames);
    assert_eq!(ending.trailing, 0, "{what}: partial frame from the broker: {ending:?}");
    for f in &ending.frames {
        match f {
            Command::Error { code: ErrorCode::ProtocolError, message, .. } => {
                assert!(!message.is_empty(), "{what}: an error without a message");
            }
            Command::Connected { .. } => {}
            other => panic!("{what}: unexpected frame before the close: {other:?}"),
        }
    }
}

/// An SDK client on one shard, connected before the bad input, checked after.
struct Witness {
    client: Client,
    producer: Producer,
    consumer: Consumer,
    topic: String,
}

impl Witness {
    async fn new(url: &str, shard: u32, label: &str) -> Witness {
        let client = connect_on_shard(url, shard, 64).await;
        let topic = format!("{label}-{shard}");
        let producer = client.producer(topic.as_str()).create().await.expect("producer");
        let consumer = client
            .subscribe(topic.as_str(), "w")
            .initial_position(InitialPosition::Earliest)
            .subscribe()
            .await
            .expect("subscribe");
        let w = Witness { client, producer, consumer, topic };
        w.round_trip("before the bad input").await;
        w
    }

    async fn round_trip(&self, when: &str) {
        let body = format!("{} {when}", self.topic);
        let id = self.producer.send(OutgoingMessage::new(body.clone())).await.unwrap_or_else(|e| panic!("{when}: {e}"));
        let m = tokio::time::timeout(RAW_TIMEOUT, self.consumer.receive())
            .await
            .unwrap_or_else(|_| panic!("{}: no message {when}", self.topic))
            .unwrap_or_else(|e| panic!("{}: receive {when}: {e}", self.topic));
        assert_eq!(m.id, id);
        assert_eq!(m.payload.as_ref(), body.as_bytes());
        self.consumer.ack(&m.id).await.expect("ack");
        assert!(self.client.is_connected(), "{}: witness disconnected {when}", self.topic);
    }
}

/// The raw cases; each runs on its own connection.
fn bad_connections(addr: SocketAddr) {
    // Text (an HTTP request): its first four bytes read as a ~540 MB length.
    let mut c = RawConnection::connect(addr);
    c.send_bytes(b"GET / HTTP/1.1\r\nHost: magnetar\r\n\r\n");
    assert_protocol_close(&c.expect_closed("http request"), "http request");

    // A length far over the frame limit, and nothing else: refused from the
    // four length bytes alone, without waiting for (or allocating) the rest.
    let mut c = RawConnection::connect(addr);
    c.send_bytes(&0x7fff_ffffu32.to_le_bytes());
    assert_protocol_close(&c.expect_closed("oversized length"), "oversized length");

    // The same after a good handshake.
    let mut c = RawConnection::connect(addr);
    c.handshake();
    c.send_bytes(&(magnetar_wire::FRAME_BYTES_MAX_DEFAULT + 1).to_le_bytes());
    c.send_bytes(&[0u8; 64]);
    assert_protocol_close(&c.expect_closed("oversized length after connect"), "oversized length after connect");

    // A length below the header size.
    let mut c = RawConnection::connect(addr);
    c.send_bytes(&3u32.to_le_bytes());
    c.send_bytes(&[0u8; 16]);
    assert_protocol_close(&c.expect_closed("too-small length"), "too-small length");

    // A Connect frame with one checksum bit flipped.
    let mut c = RawConnection::connect(addr);
    let mut f = connect_frame();
    f[4] ^= 0x01;
    c.send_bytes(&f);
    assert_protocol_close(&c.expect_closed("bad checksum on connect"), "bad checksum on connect");

    // A good handshake, then a Producer frame with a flipped command byte.
    let mut c = RawConnection::connect(addr);
    c.handshake();
    let mut f = frame_bytes(
        &Command::Producer {
            request_id: 1,
            producer_id: 1,
            topic: "bad-checksum".into(),
            producer_name: String::new(),
            access_mode: Default::default(),
        },
        &[],
    );
    let last = f.len() - 1;
    f[last] ^= 0x80;
    c.send_bytes(&f);
    assert_protocol_close(&c.expect_closed("bad checksum after connect"), "bad checksum after connect");

    // A valid frame, but not Connect, first.
    let mut c = RawConnection::connect(addr);
    c.send(&Command::Ping, &[]);
    assert_protocol_close(&c.expect_closed("ping before connect"), "ping before connect");

    // Correct framing and checksum around a command that is not a flatbuffer.
    let mut c = RawConnection::connect(addr);
    c.handshake();
    let junk = [0xabu8; 40];
    let cmd_len = junk.len() as u32;
    let mut hasher = crc32fast::Hasher::new();
    hasher.update(&cmd_len.to_le_bytes());
    hasher.update(&junk);
    let mut f = Vec::new();
    f.extend_from_slice(&(8 + cmd_len).to_le_bytes());
    f.extend_from_slice(&hasher.finalize().to_le_bytes());
    f.extend_from_slice(&cmd_len.to_le_bytes());
    f.extend_from_slice(&junk);
    c.send_bytes(&f);
    assert_protocol_close(&c.expect_closed("undecodable command"), "undecodable command");

    // Half a frame, then the client hangs up.
    let mut c = RawConnection::connect(addr);
    let f = connect_frame();
    c.send_bytes(&f[..f.len() / 2]);
    let _ = c.stream.shutdown(Shutdown::Write);
    assert_protocol_close(&c.expect_closed("truncated frame"), "truncated frame");

    // Request-level errors keep the connection: a Send for a producer that
    // does not exist, then a Send whose blob is not a message.
    let mut c = RawConnection::connect(addr);
    c.handshake();
    c.send(&Command::Send { producer_id: 42, sequence_id: 0, num_messages: 1 }, b"not a message blob");
    match c.next_command("send without producer") {
        Command::SendError { producer_id: 42, code: ErrorCode::ProducerNotFound, .. } => {}
        other => panic!("send without producer answered with {other:?}"),
    }
    c.send(
        &Command::Producer {
            request_id: 7,
            producer_id: 1,
            topic: "bad-blob".into(),
            producer_name: String::new(),
            access_mode: Default::default(),
        },
        &[],
    );
    match c.next_command("create producer") {
        Command::ProducerSuccess { request_id: 7, .. } => {}
        other => panic!("create producer answered with {other:?}"),
    }
    c.send(&Command::Send { producer_id: 1, sequence_id: 0, num_messages: 1 }, b"\xff\xff\xff\xffnot a message blob");
    match c.next_command("bad blob") {
        Command::SendError { producer_id: 1, sequence_id: 0, code, message } => {
            assert_ne!(code, ErrorCode::UnknownError, "bad blob: {message}");
        }
        other => panic!("a bad blob was answered with {other:?}"),
    }
    // A well-formed blob claiming a batch larger than the wire's batch
    // limit: refused to the producer (a consumer could never split it),
    // and the connection stays. Both a Send and its metadata saying so.
    for (claimed, seq) in [(magnetar_wire::BATCH_MESSAGES_MAX + 1, 1u64), (u32::MAX, 2)] {
        let meta = magnetar_wire::MessageMetadata {
            producer_name: "p".into(),
            sequence_id: seq,
            num_messages: claimed,
            ..Default::default()
        };
        let blob = magnetar_wire::encode_message(&meta, b"tiny");
        c.send(&Command::Send { producer_id: 1, sequence_id: seq, num_messages: claimed }, &blob);
        match c.next_command("oversized batch") {
            Command::SendError { producer_id: 1, sequence_id, code: ErrorCode::ProtocolError, message } => {
                assert_eq!(sequence_id, seq);
                assert!(message.contains("batch"), "{message}");
            }
            other => panic!("a batch of {claimed} messages was answered with {other:?}"),
        }
    }
    c.send(&Command::Ping, &[]);
    assert!(matches!(c.next_command("ping after errors"), Command::Pong), "the connection should still work");
}

/// Seeded random byte strings, some after a good handshake. The client
/// half-closes after sending, so a broker waiting for the rest of a frame
/// sees EOF and must close too.
fn random_connections(addr: SocketAddr, seed: u64) {
    let mut rng = SplitMix64(seed);
    for i in 0..RANDOM_CONNECTIONS {
        let mut c = RawConnection::connect(addr);
        let handshake = rng.below(2) == 0;
        if handshake {
            c.handshake();
        }
        let mut bytes = vec![0u8; rng.below(2048) as usize + 1];
        rng.fill(&mut bytes);
        if bytes.len() >= 4 && rng.below(4) == 0 {
            // A plausible length prefix, so the body is read as a frame.
            let len = (bytes.len() as u32).saturating_sub(4);
            bytes[..4].copy_from_slice(&len.to_le_bytes());
        }
        c.send_bytes(&bytes);
        let _ = c.stream.shutdown(Shutdown::Write);
        let what = format!("random connection {i} (seed {seed}, handshake {handshake}, {} bytes)", bytes.len());
        let ending = c.expect_closed(&what);
        assert_eq!(ending.trailing, 0, "{what}: partial frame from the broker");
    }
}

#[test]
fn bad_input_closes_only_the_bad_connection() {
    let seed = test_seed("bad_input_closes_only_the_bad_connection");
    run_async_with_timeout(Duration::from_secs(120), move || async move {
        let dir = test_dir("bad-input");
        let mut broker = BrokerProcess::start(dir.path(), SHARDS);
        let url = broker.url();
        let addr = broker.addr();
        let mut witnesses = Vec::new();
        for shard in 0..SHARDS {
            witnesses.push(Witness::new(&url, shard, "witness").await);
        }

        // The raw cases block; run them off the runtime so the witnesses'
        // connections keep being served (keepalives) meanwhile.
        tokio::task::spawn_blocking(move || {
            bad_connections(addr);
            random_connections(addr, seed);
        })
        .await
        .unwrap_or_else(|e| std::panic::resume_unwind(e.into_panic()));

        broker.assert_running();
        for w in &witnesses {
            w.round_trip("after the bad input").await;
        }
        // A new client works too, on each shard.
        for shard in 0..SHARDS {
            Witness::new(&url, shard, "late-witness").await.round_trip("new client after the bad input").await;
        }
        let log = broker.log();
        assert!(!log.contains("panicked"), "the broker logged a panic:\n{}", broker.log_tail());
        let status = broker.terminate();
        assert!(status.success(), "after the bad input, SIGTERM gave {status}\n{}", broker.log_tail());
    });
}
