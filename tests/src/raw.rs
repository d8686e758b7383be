//! A raw native-protocol connection (blocking std TCP), for tests that must
//! send exactly the frames they choose: malformed input, or permits counted
//! one by one.

use bytes::BytesMut;
use magnetar_wire::{encode_frame, Command, FrameDecoder, SubscriptionType, PROTOCOL_VERSION};
use std::io::{ErrorKind, Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// How long [`RawConnection`] waits for an answer or for the broker to close.
pub const RAW_TIMEOUT: Duration = Duration::from_secs(10);
/// One blocking read waits at most this long.
const READ_SLICE: Duration = Duration::from_millis(100);

/// One frame from the broker.
#[derive(Debug, Clone)]
pub struct RawFrame {
    pub command: Command,
    pub payload: bytes::Bytes,
}

/// How a connection ended (see [`RawConnection::expect_closed`]).
#[derive(Debug)]
pub struct Ending {
    /// Frames the broker sent before closing.
    pub frames: Vec<Command>,
    /// Bytes after the last whole frame (a well-behaved broker leaves none).
    pub trailing: usize,
}

/// A message blob of `producer_name`'s `seq` with `payload`, its metadata
/// claiming `num_messages` (a raw producer may claim what it likes).
pub fn message_blob(producer_name: &str, seq: u64, num_messages: u32, payload: &[u8]) -> bytes::Bytes {
    let meta = magnetar_wire::MessageMetadata {
        producer_name: producer_name.into(),
        sequence_id: seq,
        publish_time_ms: 1,
        num_messages,
        ..Default::default()
    };
    magnetar_wire::encode_message(&meta, payload)
}

/// Encodes one frame.
pub fn frame_bytes(command: &Command, payload: &[u8]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    encode_frame(command, payload, &mut buf).unwrap_or_else(|e| panic!("encoding {command:?}: {e}"));
    buf.to_vec()
}

/// The `Connect` frame of protocol version 1: the broker then delivers one
/// `Message` frame per entry, which is what the raw tests read.
pub fn connect_frame() -> Vec<u8> {
    connect_frame_of(1, 0)
}

/// The `Connect` frame of `protocol_version` (up to [`PROTOCOL_VERSION`]),
/// announcing `max_frame_bytes` (0: not announced).
pub fn connect_frame_of(protocol_version: u32, max_frame_bytes: u32) -> Vec<u8> {
    assert!(protocol_version <= PROTOCOL_VERSION);
    let connect = Command::Connect {
        client_version: "magnetar-tests".into(),
        protocol_version,
        max_frame_bytes,
        auth_method: String::new(),
        auth_data: magnetar_wire::AuthData::default(),
    };
    frame_bytes(&connect, &[])
}

/// A raw TCP connection speaking frames. Not async: use it from a blocking
/// thread (`tokio::task::spawn_blocking`) inside async tests.
pub struct RawConnection {
    pub stream: TcpStream,
    buf: BytesMut,
    decoder: FrameDecoder,
    closed: bool,
}

impl RawConnection {
    pub fn connect(addr: SocketAddr) -> RawConnection {
        let stream = TcpStream::connect(addr).unwrap_or_else(|e| panic!("raw connect to {addr}: {e}"));
        stream.set_read_timeout(Some(READ_SLICE)).expect("set_read_timeout");
        let _ = stream.set_nodelay(true);
        RawConnection { stream, buf: BytesMut::new(), decoder: FrameDecoder::default(), closed: false }
    }

    /// Writes bytes; if the broker already closed, the error is ignored (the
    /// test then checks how the connection ended).
    pub fn send_bytes(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes);
    }

    pub fn send(&mut self, command: &Command, payload: &[u8]) {
        self.send_bytes(&frame_bytes(command, payload));
    }

    /// Reads what arrives within one read slice; notes EOF or reset.
    fn read_some(&mut self) {
        let mut chunk = [0u8; 64 * 1024];
        match self.stream.read(&mut chunk) {
            Ok(0) => self.closed = true,
            Ok(n) => self.buf.extend_from_slice(&chunk[..n]),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted) => {}
            // A close with unread data in the broker's socket arrives as a reset.
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::BrokenPipe) => self.closed = true,
            Err(e) => panic!("raw read: {e}"),
        }
    }

    fn pop_frame(&mut self) -> Option<RawFrame> {
        match self.decoder.decode(&mut self.buf) {
            Ok(Some(f)) => Some(RawFrame { command: f.command, payload: f.payload }),
            Ok(None) => None,
            Err(e) => panic!("the broker sent a bad frame: {e}"),
        }
    }

    /// The next frame within `timeout`; `None` on timeout. Panics if the
    /// connection closes first.
    pub fn try_next(&mut self, timeout: Duration, what: &str) -> Option<RawFrame> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(f) = self.pop_frame() {
                return Some(f);
            }
            assert!(!self.closed, "{what}: the broker closed the connection");
            if Instant::now() >= deadline {
                return None;
            }
            self.read_some();
        }
    }

    /// The next frame; panics on close or after [`RAW_TIMEOUT`].
    pub fn next(&mut self, what: &str) -> RawFrame {
        self.try_next(RAW_TIMEOUT, what).unwrap_or_else(|| panic!("{what}: no frame within {RAW_TIMEOUT:?}"))
    }

    /// Skips `Ping`s from the broker (answering them).
    pub fn next_command(&mut self, what: &str) -> Command {
        loop {
            let f = self.next(what);
            match f.command {
                Command::Ping => self.send(&Command::Pong, &[]),
                c => return c,
            }
        }
    }

    /// Sends `Subscribe` as request `request_id` (durable, from the earliest
    /// entry; no consumer name, tag filter or key ranges) and returns the
    /// broker's answer.
    pub fn subscribe(
        &mut self,
        request_id: u64,
        consumer_id: u64,
        topic: &str,
        subscription: &str,
        sub_type: SubscriptionType,
    ) -> Command {
        self.send(
            &Command::Subscribe {
                request_id,
                consumer_id,
                topic: topic.into(),
                subscription: subscription.into(),
                sub_type,
                consumer_name: String::new(),
                initial_position: magnetar_wire::InitialPosition::Earliest,
                durable: true,
                priority_level: 0,
                filter_tag: String::new(),
                key_shared_ranges: Vec::new(),
                model: Default::default(),
            },
            &[],
        );
        self.next_command("subscribe")
    }

    /// Opens producer `producer_id` on `topic` as `name` (shared access)
    /// and expects `ProducerSuccess`.
    pub fn open_producer(&mut self, producer_id: u64, topic: &str, name: &str) {
        self.send(
            &Command::Producer {
                request_id: producer_id,
                producer_id,
                topic: topic.into(),
                producer_name: name.into(),
                access_mode: Default::default(),
            },
            &[],
        );
        match self.next_command("producer") {
            Command::ProducerSuccess { .. } => {}
            other => panic!("producer {producer_id} on {topic} answered with {other:?}"),
        }
    }

    /// Sends `blob` (holding `num_messages`) as `sequence_id` of producer
    /// `producer_id` and expects its receipt.
    pub fn send_receipted(&mut self, producer_id: u64, sequence_id: u64, num_messages: u32, blob: &[u8]) {
        self.send(&Command::Send { producer_id, sequence_id, num_messages }, blob);
        match self.next_command("send") {
            Command::SendReceipt { .. } => {}
            other => panic!("send {sequence_id} answered with {other:?}"),
        }
    }

    /// Sends `Connect` of `protocol_version` announcing `max_frame_bytes`
    /// (and from now on refuses frames above it, as a client would: 0 keeps
    /// the default limit), expects `Connected`; returns the shard.
    pub fn handshake_as(&mut self, protocol_version: u32, max_frame_bytes: u32) -> u32 {
        if max_frame_bytes != 0 {
            self.decoder = FrameDecoder::new(max_frame_bytes);
        }
        self.send_bytes(&connect_frame_of(protocol_version, max_frame_bytes));
        match self.next_command("handshake") {
            Command::Connected { shard, .. } => shard,
            other => panic!("handshake answered with {other:?}"),
        }
    }

    /// Sends `Connect`, expects `Connected`; returns the shard.
    pub fn handshake(&mut self) -> u32 {
        self.send_bytes(&connect_frame());
        match self.next_command("handshake") {
            Command::Connected { shard, .. } => shard,
            other => panic!("handshake answered with {other:?}"),
        }
    }

    /// Waits (up to [`RAW_TIMEOUT`]) until the broker closes the connection;
    /// returns what it sent first.
    pub fn expect_closed(mut self, what: &str) -> Ending {
        let deadline = Instant::now() + RAW_TIMEOUT;
        while !self.closed {
            assert!(
                Instant::now() < deadline,
                "{what}: the broker did not close the connection within {RAW_TIMEOUT:?}"
            );
            self.read_some();
        }
        let mut frames = Vec::new();
        while let Some(f) = self.pop_frame() {
            frames.push(f.command);
        }
        Ending { frames, trailing: self.buf.len() }
    }
}
