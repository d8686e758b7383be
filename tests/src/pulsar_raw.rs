//! Raw Pulsar-protocol frames and a blocking connection, for tests that must
//! see what the official clients hide (PINGs, epochs, error codes, frames a
//! well-behaved client never sends).
//!
//! [`RawPulsar`] is one TCP connection after CONNECT/CONNECTED: it writes
//! commands and reads frames, counting PINGs and answering them unless told
//! not to. Every read is bounded by [`READ_TIMEOUT`].

use bytes::BytesMut;
use magnetar_pulsar_wire::proto::{
    base_command::Type, BaseCommand, CommandCloseProducer, CommandConnect, CommandFlow, CommandProducer, CommandSend,
    CommandSubscribe, MessageMetadata,
};
use magnetar_pulsar_wire::{encode_command, encode_payload_command, Frame, FrameDecoder};
use prost::Message;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// How long [`RawPulsar::next_frame`] waits for a frame before it panics.
pub const READ_TIMEOUT: Duration = Duration::from_secs(15);

/// Frames up to this size are decoded (the broker's default limit is lower).
const FRAME_MAX: u32 = 64 << 20;

/// `c` as one frame.
pub fn command_frame(c: &BaseCommand) -> Vec<u8> {
    let mut b = BytesMut::new();
    encode_command(c, &mut b).unwrap_or_else(|e| panic!("encode {:?}: {e}", c.r#type));
    b.to_vec()
}

/// CONNECT at protocol version 21, naming `client_version`.
pub fn connect_frame(client_version: &str) -> Vec<u8> {
    command_frame(&BaseCommand {
        r#type: Type::Connect as i32,
        connect: Some(CommandConnect {
            client_version: client_version.into(),
            protocol_version: Some(21),
            ..Default::default()
        }),
        ..Default::default()
    })
}

/// SEND of one unbatched message `payload` by `producer_id` (whose name is
/// `p{producer_id}`).
pub fn send_frame(producer_id: u64, sequence_id: u64, payload: &[u8]) -> Vec<u8> {
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
    encode_payload_command(&c, &meta, payload, &mut b).unwrap_or_else(|e| panic!("encode SEND: {e}"));
    b.to_vec()
}

/// What one [`RawPulsar::poll`] brought.
pub enum Got {
    Frame(Box<Frame>),
    /// Nothing within the socket's read timeout.
    Nothing,
    /// The broker closed the connection.
    Closed,
}

/// One raw Pulsar connection, CONNECTED.
pub struct RawPulsar {
    s: TcpStream,
    buf: BytesMut,
    decoder: FrameDecoder,
    /// PINGs received (and, when `answer_pings`, answered).
    pub pings: usize,
    answer_pings: bool,
}

impl RawPulsar {
    /// Connects to `addr` and completes CONNECT; each socket read waits at
    /// most `poll` (the granularity of [`RawPulsar::poll`]).
    pub fn open(addr: &str, client_version: &str, answer_pings: bool, poll: Duration) -> RawPulsar {
        let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        s.set_read_timeout(Some(poll)).unwrap_or_else(|e| panic!("{e}"));
        let mut c =
            RawPulsar { s, buf: BytesMut::new(), decoder: FrameDecoder::new(FRAME_MAX), pings: 0, answer_pings };
        c.write(&connect_frame(client_version));
        let f = c.next_frame();
        assert_eq!(f.command.r#type, Type::Connected as i32, "{:?}", f.command);
        c
    }

    pub fn write(&mut self, bytes: &[u8]) {
        self.s.write_all(bytes).unwrap_or_else(|e| panic!("write: {e}"));
    }

    pub fn put(&mut self, c: &BaseCommand) {
        self.write(&command_frame(c));
    }

    /// A frame other than PING, nothing within the read timeout, or the
    /// end of the stream.
    pub fn poll(&mut self) -> Got {
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

    /// The next frame that is not a PING; panics after [`READ_TIMEOUT`] or
    /// if the broker closes the connection.
    pub fn next_frame(&mut self) -> Frame {
        let deadline = Instant::now() + READ_TIMEOUT;
        loop {
            match self.poll() {
                Got::Frame(f) => return *f,
                Got::Closed => panic!("the broker closed the connection"),
                Got::Nothing => assert!(Instant::now() < deadline, "no answer from the broker within {READ_TIMEOUT:?}"),
            }
        }
    }

    /// Sends PRODUCER (no answer awaited).
    pub fn ask_producer(&mut self, producer: CommandProducer) {
        self.put(&BaseCommand { r#type: Type::Producer as i32, producer: Some(producer), ..Default::default() });
    }

    /// PRODUCER and the frame that answers it.
    pub fn producer(&mut self, producer: CommandProducer) -> Frame {
        self.ask_producer(producer);
        self.next_frame()
    }

    /// CLOSE_PRODUCER, asserting SUCCESS.
    pub fn close_producer(&mut self, producer_id: u64, request_id: u64) {
        self.put(&BaseCommand {
            r#type: Type::CloseProducer as i32,
            close_producer: Some(CommandCloseProducer { producer_id, request_id, ..Default::default() }),
            ..Default::default()
        });
        let f = self.next_frame();
        assert_eq!(f.command.r#type, Type::Success as i32, "{:?}", f.command);
    }

    /// SUBSCRIBE, asserting SUCCESS, then FLOW with `permits`.
    pub fn subscribe(&mut self, subscribe: CommandSubscribe, permits: u32) {
        let consumer_id = subscribe.consumer_id;
        self.put(&BaseCommand { r#type: Type::Subscribe as i32, subscribe: Some(subscribe), ..Default::default() });
        let f = self.next_frame();
        assert_eq!(f.command.r#type, Type::Success as i32, "{:?}", f.command);
        self.put(&BaseCommand {
            r#type: Type::Flow as i32,
            flow: Some(CommandFlow { consumer_id, message_permits: permits }),
            ..Default::default()
        });
    }

    /// SEND of one unbatched message (see [`send_frame`]).
    pub fn send(&mut self, producer_id: u64, sequence_id: u64, payload: &[u8]) {
        self.write(&send_frame(producer_id, sequence_id, payload));
    }

    /// `(ledger, entry)` of the next `n` MESSAGE frames.
    pub fn messages(&mut self, n: usize) -> Vec<(u64, u64)> {
        (0..n)
            .map(|_| {
                let f = self.next_frame();
                let Some(m) = f.command.message else { panic!("not a MESSAGE: {:?}", f.command.r#type) };
                (m.message_id.ledger_id, m.message_id.entry_id)
            })
            .collect()
    }
}
