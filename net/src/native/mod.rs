//! The native door: Magnetar's own protocol (flatbuffers commands in
//! frames from magnetar-wire) mapped onto the session.
//!
//! The handshake is `Connect` / `Connected`: the broker announces its frame
//! limit, the shard the connection landed on and each shard's own port; a
//! client of protocol version 2 gets consecutive deliveries as `MessageRun`
//! frames within the frame size it accepts.

mod admin;

use crate::session::{ConnectionLimits, Door, Handshake, Request, Session};
use bytes::{Bytes, BytesMut};
use magnetar_core::{CoreError, ProducerHandle, SeekTarget, SubscribeRequest};
use magnetar_wire::{
    encode_frame, encode_message_frame, encode_message_run_frame, Command, ErrorCode, Frame, FrameDecoder, MessageId,
    WireError, FRAME_HEADER_BYTES, PROTOCOL_VERSION, PROTOCOL_VERSION_RUNS,
};
use std::cell::Cell;
use std::rc::Rc;

/// A `MessageRun` frame's `frame_len` at most (if the client accepts that
/// much): one frame then fits the 64 KiB read step of the SDK's reader, so
/// the reader does not allocate a larger buffer per frame.
const RUN_FRAME_BYTES_MAX: u32 = 64 * 1024 - 256;

/// Bytes of a `MessageRun` command besides its lengths vector, at most
/// (root offset, vtables, the table and its 24-byte id; a test in this file
/// checks the bound). A run frame is planned with this before it is built.
const RUN_COMMAND_BYTES_FIXED_MAX: usize = 128;

/// How many of `blobs`, from the first, fit one `MessageRun` frame whose
/// `frame_len` is at most `max` (at least one, even if that one does not fit:
/// it then goes as a `Message` frame, as it would to an older client).
fn run_frame_split(blobs: &[Bytes], max: u32) -> usize {
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    let mut len = FRAME_HEADER_BYTES - 4 + RUN_COMMAND_BYTES_FIXED_MAX;
    for (i, b) in blobs.iter().enumerate() {
        len = len.saturating_add(4).saturating_add(b.len());
        if len > max {
            return i.max(1);
        }
    }
    blobs.len()
}

/// One connection's native protocol state.
pub(crate) struct NativeDoor {
    /// Announced in `Connected`: the port of each shard's own listener.
    shard_ports: Rc<[u16]>,
    /// Largest `MessageRun` frame the client accepts (its `frame_len`); 0
    /// while it has not announced protocol version 2: one `Message` frame
    /// per entry then.
    run_frame_bytes_max: Cell<u32>,
}

impl NativeDoor {
    pub(crate) fn new(shard_ports: Rc<[u16]>) -> Self {
        Self { shard_ports, run_frame_bytes_max: Cell::new(0) }
    }
}

/// Requests of the native protocol that are not the session's.
pub(crate) enum NativeOther {
    TopicStats { request_id: u64, topic: String },
    Admin { request_id: u64, op: String, json: String },
}

/// Appends one frame of a command that carries no payload.
fn push(dst: &mut BytesMut, command: &Command) -> Result<(), WireError> {
    encode_frame(command, &[], dst)
}

impl Door for NativeDoor {
    type Frame = Frame;
    type Decoder = FrameDecoder;
    type Other = NativeOther;
    type Error = WireError;

    fn decoder(&self, limits: &ConnectionLimits) -> FrameDecoder {
        FrameDecoder::new(limits.frame_bytes_max)
    }

    fn decode(decoder: &mut FrameDecoder, buf: &mut BytesMut) -> Result<Option<Frame>, String> {
        decoder.decode(buf).map_err(|e| format!("bad frame: {e}"))
    }

    fn next_frame_bytes(decoder: &FrameDecoder, buf: &[u8]) -> Option<usize> {
        // A bad length was already refused by `decode`.
        decoder.next_frame_bytes(buf).ok().flatten()
    }

    fn handshake(session: &Session<Self>, frame: Frame) -> Handshake {
        let out = session.out();
        match frame.command {
            Command::Connect { protocol_version, max_frame_bytes, auth_method, auth_data, .. }
                if protocol_version >= 1 =>
            {
                let door = out.door();
                // Who the client is, when authentication is on (the
                // transport's principal otherwise: anonymous).
                let principal = match &session.broker().config().authentication {
                    None => None,
                    Some(auth) => match auth.authenticate(&auth_method, &auth_data.0, session.broker().principal()) {
                        Ok(p) => Some(p),
                        Err(e) => {
                            let refusal = Command::Error {
                                request_id: 0,
                                code: ErrorCode::AuthenticationError,
                                message: format!("authentication failed: {e}"),
                            };
                            out.put("a refusal", |_, dst| push(dst, &refusal));
                            return Handshake::Unauthenticated(e.to_string());
                        }
                    },
                };
                if protocol_version >= PROTOCOL_VERSION_RUNS {
                    // Runs stay within what the client accepts (not
                    // announced: the default limit).
                    let max =
                        if max_frame_bytes == 0 { magnetar_wire::FRAME_BYTES_MAX_DEFAULT } else { max_frame_bytes };
                    door.run_frame_bytes_max.set(max.min(RUN_FRAME_BYTES_MAX));
                }
                let connected = Command::Connected {
                    server_version: concat!("magnetar/", env!("CARGO_PKG_VERSION")).to_string(),
                    protocol_version: protocol_version.min(PROTOCOL_VERSION),
                    max_frame_bytes: session.limits().frame_bytes_max,
                    shard: session.broker().shard_id(),
                    shard_ports: door.shard_ports.to_vec(),
                };
                out.put("Connected", |_, dst| push(dst, &connected));
                Handshake::Accepted(principal)
            }
            Command::Connect { protocol_version, .. } => {
                let refusal = Command::Error {
                    request_id: 0,
                    code: ErrorCode::UnsupportedVersion,
                    message: format!("protocol version {protocol_version} is not supported"),
                };
                out.put("a refusal", |_, dst| push(dst, &refusal));
                Handshake::Refused
            }
            _ => Handshake::Failed("the first frame must be Connect".into()),
        }
    }

    fn request(&self, frame: Frame) -> Result<Request<NativeOther>, String> {
        let Frame { command, payload, payload_crc } = frame;
        Ok(match command {
            Command::Send { producer_id, sequence_id, num_messages } => {
                Request::Send { producer_id, sequence_id, num_messages, payload, payload_crc }
            }
            Command::Producer { request_id, producer_id, topic, producer_name, access_mode } => {
                Request::CreateProducer { request_id, producer_id, topic, producer_name, access_mode, epoch: None }
            }
            Command::CloseProducer { request_id, producer_id } => Request::CloseProducer { request_id, producer_id },
            Command::Subscribe {
                request_id,
                consumer_id,
                topic,
                subscription,
                sub_type,
                consumer_name,
                initial_position,
                durable,
                priority_level,
                filter_tag,
                key_shared_ranges,
                model,
            } => Request::Subscribe {
                request_id,
                request: SubscribeRequest {
                    topic,
                    subscription,
                    consumer_id,
                    sub_type,
                    consumer_name,
                    initial_position,
                    durable,
                    priority_level,
                    filter_tag,
                    key_shared_ranges,
                    model,
                    client_address: String::new(),
                },
                start: None,
            },
            Command::Flow { consumer_id, permits } => Request::Flow { consumer_id, permits },
            Command::Ack { consumer_id, ack_type, message_ids, request_id, batch_sizes } => Request::Ack {
                // 0: the client wants no answer.
                request_id: (request_id != 0).then_some(request_id),
                consumer_id,
                ack_type,
                message_ids,
                batch_sizes,
            },
            Command::Seek { request_id, consumer_id, message_id, publish_time_ms } => {
                let target = match message_id {
                    Some(id) => SeekTarget::Id(id),
                    None => SeekTarget::PublishTime(publish_time_ms),
                };
                Request::Seek { request_id, consumer_id, target }
            }
            Command::RedeliverUnacknowledged { consumer_id, message_ids } => {
                Request::Redeliver { consumer_id, message_ids }
            }
            Command::CloseConsumer { request_id, consumer_id } => Request::CloseConsumer { request_id, consumer_id },
            Command::Unsubscribe { request_id, consumer_id, force } => {
                Request::Unsubscribe { request_id, consumer_id, force }
            }
            Command::Ping => Request::Ping,
            Command::Pong => Request::Pong,
            Command::TopicStats { request_id, topic, .. } => {
                Request::Other(NativeOther::TopicStats { request_id, topic })
            }
            Command::AdminRequest { request_id, op, json } => {
                Request::Other(NativeOther::Admin { request_id, op, json })
            }
            Command::Connect { .. } => return Err("Connect sent twice".into()),
            other => return Err(format!("unexpected command from a client: {}", other.name())),
        })
    }

    async fn other(session: &Rc<Session<Self>>, request: NativeOther) -> Result<(), String> {
        match request {
            NativeOther::TopicStats { request_id, topic } => admin::topic_stats(session, request_id, topic).await,
            NativeOther::Admin { request_id, op, json } => admin::spawn_admin(session, request_id, op, json),
        }
        Ok(())
    }

    fn producer_created(
        &self,
        dst: &mut BytesMut,
        request_id: u64,
        producer: &ProducerHandle,
    ) -> Result<(), WireError> {
        let success = Command::ProducerSuccess {
            request_id,
            producer_name: producer.producer_name.clone(),
            last_sequence_id: producer.last_sequence_id,
        };
        push(dst, &success)
    }

    fn receipt(
        &self,
        dst: &mut BytesMut,
        producer_id: u64,
        sequence_id: u64,
        message_id: MessageId,
    ) -> Result<(), WireError> {
        push(dst, &Command::SendReceipt { producer_id, sequence_id, message_id })
    }

    fn send_error(
        &self,
        dst: &mut BytesMut,
        producer_id: u64,
        sequence_id: u64,
        e: CoreError,
    ) -> Result<(), WireError> {
        push(dst, &Command::SendError { producer_id, sequence_id, code: e.code, message: e.message })
    }

    fn message(
        &self,
        dst: &mut BytesMut,
        consumer_id: u64,
        message_id: &MessageId,
        redelivery_count: u32,
        ack_set: Vec<u64>,
        blob: &[u8],
    ) -> Result<(), WireError> {
        if magnetar_pulsar_wire::metadata::is_stored(blob) {
            // Stored by the Pulsar door: converted for a native consumer.
            let converted = match crate::pulsar::pulsar_to_native(blob) {
                Ok(b) => b,
                Err(why) => {
                    tracing::error!("cannot deliver entry {message_id} to native consumer {consumer_id}: {why}");
                    return Ok(());
                }
            };
            let message = Command::Message { consumer_id, message_id: *message_id, redelivery_count, ack_set };
            return encode_frame(&message, &converted, dst);
        }
        if ack_set.is_empty() {
            // Straight into the outbox, from a command built once.
            encode_message_frame(consumer_id, message_id, redelivery_count, blob, dst)
        } else {
            let message = Command::Message { consumer_id, message_id: *message_id, redelivery_count, ack_set };
            encode_frame(&message, blob, dst)
        }
    }

    /// `MessageRun` frames within the client's frame limit, or one `Message`
    /// frame per entry to a client that did not announce protocol version 2.
    /// An entry that cannot be encoded is logged and skipped; the others go.
    fn run(
        &self,
        dst: &mut BytesMut,
        consumer_id: u64,
        first: &MessageId,
        redelivery_count: u32,
        blobs: &[Bytes],
    ) -> Result<(), WireError> {
        if blobs.iter().any(|b| magnetar_pulsar_wire::metadata::is_stored(b)) {
            // Entries of the Pulsar door among them: one converted
            // `Message` frame each.
            let mut id = *first;
            for blob in blobs {
                self.message(dst, consumer_id, &id, redelivery_count, Vec::new(), blob)?;
                id.entry = id.entry.wrapping_add(1);
            }
            return Ok(());
        }
        let max = self.run_frame_bytes_max.get();
        let one = |dst: &mut BytesMut, id: &MessageId, blob: &[u8]| {
            if let Err(e) = encode_message_frame(consumer_id, id, redelivery_count, blob, dst) {
                tracing::error!("cannot encode a delivery to consumer {consumer_id}: {e}");
            }
        };
        let mut id = *first;
        let mut rest = blobs;
        while !rest.is_empty() {
            let n = if max == 0 { 1 } else { run_frame_split(rest, max) };
            let (now, later) = rest.split_at(n);
            if let [blob] = now {
                one(dst, &id, blob);
            } else if let Err(e) = encode_message_run_frame(consumer_id, &id, redelivery_count, now, dst) {
                // Not expected (the plan keeps a run within the limit); if it
                // happens the entries still go, one frame each.
                tracing::error!("cannot encode a run of {n} deliveries to consumer {consumer_id}: {e}");
                let mut each = id;
                for blob in now {
                    one(dst, &each, blob);
                    each.entry = each.entry.wrapping_add(1);
                }
            }
            id.entry = id.entry.wrapping_add(n as u64);
            rest = later;
        }
        Ok(())
    }

    /// The native protocol has no frame for this: an `Error` tied to no
    /// request.
    fn consumer_closed(
        &self,
        dst: &mut BytesMut,
        _consumer_id: u64,
        code: ErrorCode,
        message: String,
    ) -> Result<(), WireError> {
        push(dst, &Command::Error { request_id: 0, code, message })
    }

    fn consumer_failed(
        &self,
        dst: &mut BytesMut,
        consumer_id: u64,
        code: ErrorCode,
        message: String,
        entry: Option<&MessageId>,
    ) -> Result<(), WireError> {
        push(dst, &Command::ConsumerClosed { consumer_id, code, message, entry: entry.copied() })
    }

    fn active_consumer(&self, dst: &mut BytesMut, consumer_id: u64, is_active: bool) -> Result<(), WireError> {
        push(dst, &Command::ActiveConsumerChange { consumer_id, is_active })
    }

    fn success(&self, dst: &mut BytesMut, request_id: u64) -> Result<(), WireError> {
        push(dst, &Command::Success { request_id })
    }

    fn error(&self, dst: &mut BytesMut, request_id: u64, e: &CoreError) -> Result<(), WireError> {
        push(dst, &Command::Error { request_id, code: e.code, message: e.message.clone() })
    }

    fn pong(&self, dst: &mut BytesMut) -> Result<(), WireError> {
        push(dst, &Command::Pong)
    }

    fn ping(&self, dst: &mut BytesMut) -> Result<(), WireError> {
        push(dst, &Command::Ping)
    }

    fn protocol_error(&self, dst: &mut BytesMut, why: &str) -> Result<(), WireError> {
        push(dst, &Command::Error { request_id: 0, code: ErrorCode::ProtocolError, message: why.to_string() })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::session::{reserve_for_frame, FRAME_RESERVE_AHEAD_MAX, READ_CHUNK_BYTES};

    /// Goal: a frame that arrives over many reads, behind frames still
    /// referenced elsewhere, is copied once into its buffer (no move to a
    /// larger allocation as it grows) and still decodes whole, and a frame
    /// above `FRAME_RESERVE_AHEAD_MAX` is not reserved in full up front.
    /// Method: a small frame, then a 130 KiB `Send` fed in 16 KiB pieces (the
    /// first decoded frame kept alive, as the broker's write cache does);
    /// the buffer's address is compared after each piece.
    #[test]
    fn a_frame_arriving_in_pieces_stays_in_one_allocation() {
        let mut small = BytesMut::new();
        encode_frame(&Command::Ping, &[], &mut small).unwrap_or_else(|e| panic!("{e}"));
        let payload: Vec<u8> = (0..130 * 1024u32).map(|i| (i % 251) as u8).collect();
        let mut big = BytesMut::new();
        let send = Command::Send { producer_id: 1, sequence_id: 2, num_messages: 3 };
        encode_frame(&send, &payload, &mut big).unwrap_or_else(|e| panic!("{e}"));
        let mut wire = small.to_vec();
        wire.extend_from_slice(&big);

        let mut decoder = FrameDecoder::new(5 << 20);
        let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
        let mut pieces = wire.chunks(16 * 1024);
        buf.extend_from_slice(pieces.next().unwrap_or_default());
        let kept = decoder.decode(&mut buf).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(kept, Some(Frame { command: Command::Ping, .. })));
        assert!(decoder.decode(&mut buf).unwrap_or_else(|e| panic!("{e}")).is_none());
        reserve_for_frame(NativeDoor::next_frame_bytes(&decoder, &buf), &mut buf);
        let at = buf.as_ptr();
        let mut frame = None;
        for piece in pieces {
            buf.extend_from_slice(piece);
            assert_eq!(buf.as_ptr(), at, "the frame moved to a new allocation");
            if let Some(f) = decoder.decode(&mut buf).unwrap_or_else(|e| panic!("{e}")) {
                frame = Some(f);
            }
        }
        let frame = frame.unwrap_or_else(|| panic!("the Send frame did not decode"));
        assert_eq!(frame.command, send);
        assert_eq!(frame.payload.as_ref(), payload.as_slice());
        drop(kept);

        // A frame far above the cap: only the cap and one read are reserved.
        let mut huge = BytesMut::new();
        huge.extend_from_slice(&(4u32 << 20).to_le_bytes());
        let mut buf = huge;
        reserve_for_frame(NativeDoor::next_frame_bytes(&decoder, &buf), &mut buf);
        assert!(buf.capacity() <= FRAME_RESERVE_AHEAD_MAX + READ_CHUNK_BYTES + 64, "{}", buf.capacity());
        assert!(buf.capacity() >= FRAME_RESERVE_AHEAD_MAX, "{}", buf.capacity());
    }

    /// Goal: the run frames the connection plans stay within the frame
    /// limit: the command besides its lengths is within the fixed bound
    /// (whatever the ids, consumer id and redelivery count), and a split never passes `max` unless a lone
    /// entry is bigger by itself (which then goes as a `Message` frame).
    #[test]
    fn planned_run_frames_fit_the_limit() {
        let ids = [MessageId::new(0, 0, -1, -1), MessageId::new(u64::MAX, u64::MAX - 1000, i32::MIN, i32::MAX)];
        for (id, redelivery_count) in ids.into_iter().flat_map(|id| [(id, 0u32), (id, u32::MAX)]) {
            for (n, size) in [(2usize, 0usize), (2, 1024), (60, 1000), (300, 7), (63, 1024), (1, 70_000)] {
                let blobs: Vec<Bytes> = (0..n).map(|i| Bytes::from(vec![i as u8; size])).collect();
                for max in [RUN_FRAME_BYTES_MAX, 4096, 2000, 100] {
                    let mut rest = &blobs[..];
                    while !rest.is_empty() {
                        let k = run_frame_split(rest, max);
                        assert!(k >= 1 && k <= rest.len());
                        let (now, later) = rest.split_at(k);
                        let mut buf = BytesMut::new();
                        encode_message_run_frame(u64::MAX, &id, redelivery_count, now, &mut buf).unwrap();
                        let cmd_len = u32::from_le_bytes(buf[8..12].try_into().unwrap()) as usize;
                        assert!(cmd_len <= RUN_COMMAND_BYTES_FIXED_MAX + 4 * k, "{cmd_len} for {k} entries");
                        let frame_len = buf.len() - 4;
                        if k > 1 {
                            assert!(frame_len <= max as usize, "{k} entries of {size} bytes: {frame_len} > {max}");
                        }
                        // Greedy: one more entry would not have fitted.
                        if let Some(next) = later.first() {
                            let planned = 8
                                + RUN_COMMAND_BYTES_FIXED_MAX
                                + 4 * (k + 1)
                                + now.iter().map(Bytes::len).sum::<usize>()
                                + next.len();
                            assert!(planned > max as usize, "{k} entries: one more would have fitted");
                        }
                        assert_eq!(FRAME_HEADER_BYTES + cmd_len + now.iter().map(Bytes::len).sum::<usize>(), buf.len());
                        rest = later;
                    }
                }
            }
        }
    }
}
