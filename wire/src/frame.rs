//! Frame codec: one command (a flatbuffer) plus an optional payload, behind a
//! length and a CRC-32.
//!
//! Layout, all integers little-endian (also in `docs/format.md`):
//!
//! ```text
//! offset        size      field
//! 0             4         frame_len  bytes after this field = 8 + cmd_len + payload_len
//! 4             4         checksum   CRC-32 (IEEE, crc32fast) of bytes [8, 4 + frame_len)
//! 8             4         cmd_len
//! 12            cmd_len   BaseCommand flatbuffer
//! 12 + cmd_len  rest      payload: the message blob for Send/Message, empty otherwise
//! ```
//!
//! The checksum covers `cmd_len`, so a corrupted command length is caught
//! before it is trusted. The payload travels beside the flatbuffer, never
//! inside it, so neither side copies message bytes into or out of a builder.

use std::cell::RefCell;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use flatbuffers::{FlatBufferBuilder, WIPOffset};

use crate::error::WireError;
use crate::types::{
    AckType, AllocationStrategy, AuthData, Command, ConsumptionModel, ErrorCode, Frame, InitialPosition, MessageId,
    ProducerAccessMode, SubscriptionMode, SubscriptionType,
};
use crate::{fb, verifier_options, ENCODE_VARIABLE_BYTES_MAX};

/// Default bound on `frame_len` (bytes after the length field).
pub const FRAME_BYTES_MAX_DEFAULT: u32 = 8 * 1024 * 1024;
/// Bytes before the command: frame_len, checksum, cmd_len.
pub const FRAME_HEADER_BYTES: usize = 12;
/// Smallest valid `frame_len`: checksum and cmd_len (an empty command then
/// fails flatbuffer verification, but the framing itself is sound).
pub const FRAME_LEN_MIN: u32 = 8;
/// Size of the frame_len field.
const FRAME_LEN_FIELD_BYTES: usize = 4;

const _: () = assert!(FRAME_HEADER_BYTES == FRAME_LEN_FIELD_BYTES + FRAME_LEN_MIN as usize);
const _: () = assert!(FRAME_BYTES_MAX_DEFAULT >= FRAME_LEN_MIN);

/// A thread's cached builder is dropped after building anything larger, so
/// one huge command does not pin its memory for the thread's life.
const BUILDER_KEEP_BYTES_MAX: usize = 1 << 20;

thread_local! {
    /// One flatbuffers builder per thread, reused so that encoding a frame
    /// does not allocate once the builder has grown. Thread-per-core: each
    /// shard gets its own, nothing is shared.
    static BUILDER: RefCell<FlatBufferBuilder<'static>> =
        RefCell::new(FlatBufferBuilder::with_capacity(1024));
}

/// Run `f` with a reset builder: the thread's cached one, or a fresh one if
/// that is already in use (it never is today; this keeps the path panic-free).
pub(crate) fn with_builder<R>(f: impl FnOnce(&mut FlatBufferBuilder<'static>) -> R) -> R {
    BUILDER.with(|cell| match cell.try_borrow_mut() {
        Ok(mut fbb) => {
            fbb.reset();
            let r = f(&mut fbb);
            if fbb.unfinished_data().len() > BUILDER_KEEP_BYTES_MAX {
                *fbb = FlatBufferBuilder::with_capacity(1024);
            } else {
                fbb.reset();
            }
            r
        }
        Err(_) => f(&mut FlatBufferBuilder::with_capacity(1024)),
    })
}

/// Append one frame carrying `command` and `payload` to `dst`.
///
/// `payload` must be empty unless the command is `Send` or `Message`
/// (`WireError::UnexpectedPayload`). The encoder does not know the peer's
/// frame limit: compare `payload.len()` with it before sending.
pub fn encode_frame(command: &Command, payload: &[u8], dst: &mut BytesMut) -> Result<(), WireError> {
    encode_frame_head(command, payload, dst)?;
    dst.extend_from_slice(payload);
    Ok(())
}

/// Append everything of a frame except the payload bytes to `dst`: the
/// header (with a checksum that covers `payload`) and the command. The caller
/// then writes `payload` itself, e.g. as a second buffer of a vectored write,
/// which spares a copy of message bytes held in a cache.
pub fn encode_frame_head(command: &Command, payload: &[u8], dst: &mut BytesMut) -> Result<(), WireError> {
    if !command.carries_payload() && !payload.is_empty() {
        return Err(WireError::UnexpectedPayload { command: command.name(), len: len_u64(payload.len()) });
    }
    if let Command::MessageRun { message_id, lengths, .. } = command {
        check_run_ids(message_id, lengths.len())?;
        check_run_lengths(lengths, payload.len())?;
    }
    let variable_bytes = command_variable_bytes(command);
    if variable_bytes > ENCODE_VARIABLE_BYTES_MAX {
        return Err(WireError::EncodeTooLarge { what: "command", len: variable_bytes, max: ENCODE_VARIABLE_BYTES_MAX });
    }
    with_builder(|fbb| {
        let root = build_command(fbb, command);
        fbb.finish_minimal(root);
        let cmd = fbb.finished_data();
        let frame_len_u64 =
            u64::from(FRAME_LEN_MIN).saturating_add(len_u64(cmd.len())).saturating_add(len_u64(payload.len()));
        let frame_len = u32::try_from(frame_len_u64)
            .map_err(|_| WireError::FrameTooLarge { len: frame_len_u64, max: u64::from(u32::MAX) })?;
        // cmd_len < frame_len, so this cannot fail once frame_len fitted.
        let cmd_len = u32::try_from(cmd.len())
            .map_err(|_| WireError::FrameTooLarge { len: frame_len_u64, max: u64::from(u32::MAX) })?;

        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&cmd_len.to_le_bytes());
        hasher.update(cmd);
        hasher.update(payload);
        let checksum = hasher.finalize();

        dst.reserve(FRAME_HEADER_BYTES.saturating_add(cmd.len()));
        dst.put_u32_le(frame_len);
        dst.put_u32_le(checksum);
        dst.put_u32_le(cmd_len);
        dst.extend_from_slice(cmd);
        Ok(())
    })
}

/// Where the fields of a `Message` command sit in a command built once,
/// so that each delivery copies the bytes and patches its values in.
struct MessageTemplate {
    cmd: Vec<u8>,
    consumer_id: usize,
    ledger: usize,
    entry: usize,
    partition: usize,
    batch_index: usize,
    redelivery_count: usize,
}

impl MessageTemplate {
    fn build() -> Self {
        // Distinct, nonzero values (so the builder writes every field, none
        // left to its default) whose little-endian bytes occur once.
        const CONSUMER_ID: u64 = 0x7c1d_52e3_a4b5_c6d7;
        const LEDGER: u64 = 0x6b2e_63f4_b5c6_d7e8;
        const ENTRY: u64 = 0x5a3f_7405_c6d7_e8f9;
        const PARTITION: i32 = 0x4940_8516;
        const BATCH_INDEX: i32 = 0x3851_9627;
        const REDELIVERY_COUNT: u32 = 0x2762_a738;
        let command = Command::Message {
            consumer_id: CONSUMER_ID,
            message_id: MessageId::new(LEDGER, ENTRY, PARTITION, BATCH_INDEX),
            redelivery_count: REDELIVERY_COUNT,
            ack_set: Vec::new(),
        };
        let cmd = with_builder(|fbb| {
            let root = build_command(fbb, &command);
            fbb.finish_minimal(root);
            fbb.finished_data().to_vec()
        });
        let at = |pattern: &[u8]| {
            let mut found = cmd.windows(pattern.len()).enumerate().filter(|(_, w)| *w == pattern).map(|(i, _)| i);
            let first = found.next();
            assert!(first.is_some() && found.next().is_none(), "Message template: a field is not where it is expected");
            first.unwrap_or(0)
        };
        Self {
            consumer_id: at(&CONSUMER_ID.to_le_bytes()),
            ledger: at(&LEDGER.to_le_bytes()),
            entry: at(&ENTRY.to_le_bytes()),
            partition: at(&PARTITION.to_le_bytes()),
            batch_index: at(&BATCH_INDEX.to_le_bytes()),
            redelivery_count: at(&REDELIVERY_COUNT.to_le_bytes()),
            cmd,
        }
    }
}

thread_local! {
    static MESSAGE_TEMPLATE: MessageTemplate = MessageTemplate::build();
}

/// Appends one `Message` frame (no `ack_set`) to `dst`: what
/// [`encode_frame`] writes for `Command::Message`, except that the command
/// is a copy of one built once per thread with these values patched in, so
/// every field is present even when it holds its default (a flatbuffer
/// reader sees no difference). Building the command per delivered entry
/// is a cost a catch-up pays on every entry (bench/RESULTS.md); the
/// checksum is still computed over the bytes sent.
pub fn encode_message_frame(
    consumer_id: u64,
    message_id: &MessageId,
    redelivery_count: u32,
    payload: &[u8],
    dst: &mut BytesMut,
) -> Result<(), WireError> {
    MESSAGE_TEMPLATE.with(|t| {
        let frame_len_u64 =
            u64::from(FRAME_LEN_MIN).saturating_add(len_u64(t.cmd.len())).saturating_add(len_u64(payload.len()));
        let frame_len = u32::try_from(frame_len_u64)
            .map_err(|_| WireError::FrameTooLarge { len: frame_len_u64, max: u64::from(u32::MAX) })?;
        let cmd_len = u32::try_from(t.cmd.len())
            .map_err(|_| WireError::FrameTooLarge { len: frame_len_u64, max: u64::from(u32::MAX) })?;
        let start = dst.len();
        dst.reserve(FRAME_HEADER_BYTES.saturating_add(t.cmd.len()).saturating_add(payload.len()));
        dst.put_u32_le(frame_len);
        dst.put_u32_le(0);
        dst.put_u32_le(cmd_len);
        let cmd_at = dst.len();
        dst.extend_from_slice(&t.cmd);
        let cmd = &mut dst[cmd_at..];
        let mut put = |at: usize, bytes: &[u8]| cmd[at..at + bytes.len()].copy_from_slice(bytes);
        put(t.consumer_id, &consumer_id.to_le_bytes());
        put(t.ledger, &message_id.ledger.to_le_bytes());
        put(t.entry, &message_id.entry.to_le_bytes());
        put(t.partition, &message_id.partition.to_le_bytes());
        put(t.batch_index, &message_id.batch_index.to_le_bytes());
        put(t.redelivery_count, &redelivery_count.to_le_bytes());
        // cmd_len and the command are contiguous: one pass over both.
        let mut hasher = crc32fast::Hasher::new();
        hasher.update(&dst[start + 8..]);
        hasher.update(payload);
        let checksum = hasher.finalize();
        dst[start + 4..start + 8].copy_from_slice(&checksum.to_le_bytes());
        dst.extend_from_slice(payload);
        Ok(())
    })
}

/// A run holds at least one entry, and its last entry number fits in a u64.
fn check_run_ids(first: &MessageId, entries: usize) -> Result<(), WireError> {
    if entries == 0 {
        return Err(WireError::BadRun { entries: 0, sum: 0, payload: 0, reason: "a run holds no entry" });
    }
    if first.entry.checked_add(len_u64(entries) - 1).is_none() {
        return Err(WireError::BadRun {
            entries: len_u64(entries),
            sum: 0,
            payload: 0,
            reason: "the run's last entry number overflows",
        });
    }
    Ok(())
}

/// A run's lengths add up to its payload's length exactly.
fn check_run_lengths(lengths: &[u32], payload: usize) -> Result<(), WireError> {
    let sum = lengths.iter().map(|&l| u64::from(l)).sum::<u64>();
    if sum != len_u64(payload) {
        return Err(WireError::BadRun {
            entries: len_u64(lengths.len()),
            sum,
            payload: len_u64(payload),
            reason: "the lengths do not add up to the payload",
        });
    }
    Ok(())
}

/// The entries of a `MessageRun` frame, in order: each one's id and its
/// blob, a slice of `payload` (no copy). Checks what the decoder checks (at
/// least one entry, no entry-number overflow, lengths adding up to the
/// payload), so it may be given any values.
pub fn run_entries<'a>(first: MessageId, lengths: &'a [u32], payload: &Bytes) -> Result<RunEntries<'a>, WireError> {
    check_run_ids(&first, lengths.len())?;
    check_run_lengths(lengths, payload.len())?;
    Ok(RunEntries { id: first, lengths: lengths.iter(), payload: payload.clone(), at: 0 })
}

/// Iterator of [`run_entries`].
#[derive(Debug, Clone)]
pub struct RunEntries<'a> {
    id: MessageId,
    lengths: std::slice::Iter<'a, u32>,
    payload: Bytes,
    at: usize,
}

impl Iterator for RunEntries<'_> {
    type Item = (MessageId, Bytes);

    fn next(&mut self) -> Option<Self::Item> {
        let len = usize::try_from(*self.lengths.next()?).ok()?;
        // Checked by `run_entries`: the lengths add up to the payload and
        // the entry numbers do not overflow.
        let end = self.at.checked_add(len).filter(|&e| e <= self.payload.len())?;
        let blob = self.payload.slice(self.at..end);
        self.at = end;
        let id = self.id;
        self.id.entry = self.id.entry.wrapping_add(1);
        Some((id, blob))
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        self.lengths.size_hint()
    }
}

impl ExactSizeIterator for RunEntries<'_> {}

/// Appends one `MessageRun` frame to `dst`: the entries `blobs` (at least
/// one) delivered to `consumer_id`, the first with id `first`, each next one
/// with the next entry number. What [`encode_frame`] writes for
/// `Command::MessageRun` with the blobs as payload, without building the
/// lengths vector or the payload first: the blobs are copied once, into
/// `dst`, and hashed there.
pub fn encode_message_run_frame<B: AsRef<[u8]>>(
    consumer_id: u64,
    first: &MessageId,
    redelivery_count: u32,
    blobs: &[B],
    dst: &mut BytesMut,
) -> Result<(), WireError> {
    check_run_ids(first, blobs.len())?;
    let mut payload_len = 0u64;
    for b in blobs {
        let len = b.as_ref().len();
        if u32::try_from(len).is_err() {
            return Err(WireError::FrameTooLarge { len: len_u64(len), max: u64::from(u32::MAX) });
        }
        payload_len = payload_len.saturating_add(len_u64(len));
    }
    with_builder(|fbb| {
        fbb.start_vector::<u32>(blobs.len());
        for b in blobs.iter().rev() {
            // Checked above.
            fbb.push(u32::try_from(b.as_ref().len()).unwrap_or(u32::MAX));
        }
        let lengths = Some(fbb.end_vector(blobs.len()));
        let message_id = id_to_fb(first);
        let args = fb::MessageRunArgs { consumer_id, message_id: Some(&message_id), redelivery_count, lengths };
        let table = fb::MessageRun::create(fbb, &args).as_union_value();
        let root = fb::BaseCommand::create(
            fbb,
            &fb::BaseCommandArgs { command_type: fb::AnyCommand::MessageRun, command: Some(table) },
        );
        fbb.finish_minimal(root);
        let cmd = fbb.finished_data();
        let frame_len_u64 = u64::from(FRAME_LEN_MIN).saturating_add(len_u64(cmd.len())).saturating_add(payload_len);
        let frame_len = u32::try_from(frame_len_u64)
            .map_err(|_| WireError::FrameTooLarge { len: frame_len_u64, max: u64::from(u32::MAX) })?;
        let cmd_len = u32::try_from(cmd.len())
            .map_err(|_| WireError::FrameTooLarge { len: frame_len_u64, max: u64::from(u32::MAX) })?;
        let start = dst.len();
        dst.reserve(FRAME_HEADER_BYTES.saturating_add(usize::try_from(frame_len).unwrap_or(usize::MAX)));
        dst.put_u32_le(frame_len);
        dst.put_u32_le(0);
        dst.put_u32_le(cmd_len);
        dst.extend_from_slice(cmd);
        for b in blobs {
            dst.extend_from_slice(b.as_ref());
        }
        // Everything after the checksum field, in one pass.
        let checksum = crc32fast::hash(&dst[start + 8..]);
        dst[start + 4..start + 8].copy_from_slice(&checksum.to_le_bytes());
        Ok(())
    })
}

/// Splits frames off a receive buffer.
///
/// Owned by one connection, on that connection's core; holds no buffer and
/// no partial state (everything is re-read from `src`), so it may be dropped
/// and recreated at any point without losing bytes.
#[derive(Debug, Clone)]
pub struct FrameDecoder {
    max_frame_bytes: u32,
}

impl FrameDecoder {
    /// `max_frame_bytes` bounds `frame_len` (bytes after the length field).
    pub fn new(max_frame_bytes: u32) -> Self {
        assert!(
            max_frame_bytes >= FRAME_LEN_MIN,
            "max_frame_bytes {max_frame_bytes} is below the minimum frame of {FRAME_LEN_MIN} bytes"
        );
        Self { max_frame_bytes }
    }

    pub fn max_frame_bytes(&self) -> u32 {
        self.max_frame_bytes
    }

    /// Total size (length field included) of the frame at the start of `src`,
    /// once its 4 length bytes are there: `Ok(None)` before that. Lets a
    /// reader reserve exactly what the frame needs. A length above the limit,
    /// or below the fixed header, is rejected here, before anyone allocates.
    pub fn next_frame_bytes(&self, src: &[u8]) -> Result<Option<usize>, WireError> {
        let Some(len_bytes) = src.first_chunk::<FRAME_LEN_FIELD_BYTES>() else {
            return Ok(None);
        };
        let frame_len = u32::from_le_bytes(*len_bytes);
        if frame_len > self.max_frame_bytes {
            return Err(WireError::FrameTooLarge { len: u64::from(frame_len), max: u64::from(self.max_frame_bytes) });
        }
        if frame_len < FRAME_LEN_MIN {
            return Err(WireError::FrameTooSmall { len: u64::from(frame_len), min: u64::from(FRAME_LEN_MIN) });
        }
        // u32 + 4 fits in usize on every platform we build for (>= 32 bits
        // would overflow only at u32::MAX, excluded by the limit check when
        // max_frame_bytes < u32::MAX; saturate to be safe).
        let total = usize::try_from(frame_len).unwrap_or(usize::MAX).saturating_add(FRAME_LEN_FIELD_BYTES);
        Ok(Some(total))
    }

    /// Take the next whole frame off the front of `src`.
    ///
    /// `Ok(None)`: the frame is not all there yet; `src` is untouched and
    /// nothing was allocated (use [`Self::next_frame_bytes`] to reserve).
    /// On a fatal error ([`WireError::is_fatal`]: bad length or checksum)
    /// `src` is left as it was and the connection must be closed. On any other
    /// error the offending frame has been removed from `src`.
    ///
    /// The returned payload is a slice of the bytes split off `src`: no copy.
    pub fn decode(&mut self, src: &mut BytesMut) -> Result<Option<Frame>, WireError> {
        let Some(total) = self.next_frame_bytes(src)? else {
            return Ok(None);
        };
        let Some(frame) = src.get(..total) else {
            return Ok(None);
        };
        let (head, body) = frame.split_at_checked(8).ok_or(WireError::Truncated {
            what: "frame header",
            offset: 0,
            need: 8,
            have: len_u64(frame.len()),
        })?;
        let expected = read_u32_le(head, 4).ok_or(WireError::Truncated {
            what: "frame checksum",
            offset: 4,
            need: 4,
            have: len_u64(head.len().saturating_sub(4)),
        })?;
        let (actual, payload_crc) = body_checksum(body);
        if expected != actual {
            return Err(WireError::ChecksumMismatch { expected, actual });
        }

        // From here on the frame boundary is trusted: consume the frame so a
        // command-level error leaves the stream in step.
        let mut frame = src.split_to(total).freeze();
        frame.advance(8);
        let cmd_len_u32 = read_u32_le(&frame, 0).ok_or(WireError::Truncated {
            what: "frame cmd_len",
            offset: 8,
            need: 4,
            have: len_u64(frame.len()),
        })?;
        frame.advance(4);
        let cmd_len = usize::try_from(cmd_len_u32).unwrap_or(usize::MAX);
        if cmd_len > frame.len() {
            return Err(WireError::Truncated {
                what: "frame command",
                offset: len_u64(FRAME_HEADER_BYTES),
                need: u64::from(cmd_len_u32),
                have: len_u64(frame.len()),
            });
        }
        let payload = frame.split_off(cmd_len);
        let command = decode_command(&frame)?;
        if !command.carries_payload() && !payload.is_empty() {
            return Err(WireError::UnexpectedPayload { command: command.name(), len: len_u64(payload.len()) });
        }
        if let Command::MessageRun { lengths, .. } = &command {
            check_run_lengths(lengths, payload.len())?;
        }
        Ok(Some(Frame { command, payload, payload_crc }))
    }
}

/// Payloads of at least this many bytes get their own CRC-32 while the
/// frame's checksum is checked ([`Frame::payload_crc`]): the frame's is then
/// combined from the command's and the payload's, which costs ~0.3 µs, about
/// what hashing 8 KiB does.
pub const PAYLOAD_CRC_MIN: usize = 8 << 10;

/// The checksum of a frame's `body` (everything after the checksum field:
/// cmd_len, command, payload), and the payload's own CRC-32 when the payload
/// is large; one pass over the bytes either way.
fn body_checksum(body: &[u8]) -> (u32, Option<u32>) {
    let payload_at = read_u32_le(body, 0)
        .and_then(|cmd_len| usize::try_from(cmd_len).ok())
        .and_then(|cmd_len| cmd_len.checked_add(4))
        .filter(|&at| at <= body.len() && body.len() - at >= PAYLOAD_CRC_MIN);
    let Some(at) = payload_at else {
        return (crc32fast::hash(body), None);
    };
    let (head, payload) = body.split_at(at);
    let payload_crc = crc32fast::hash(payload);
    let mut h = crc32fast::Hasher::new();
    h.update(head);
    h.combine(&crc32fast::Hasher::new_with_initial_len(payload_crc, len_u64(payload.len())));
    (h.finalize(), Some(payload_crc))
}

impl Default for FrameDecoder {
    fn default() -> Self {
        Self::new(FRAME_BYTES_MAX_DEFAULT)
    }
}

pub(crate) fn len_u64(len: usize) -> u64 {
    u64::try_from(len).unwrap_or(u64::MAX)
}

pub(crate) fn read_u32_le(bytes: &[u8], offset: usize) -> Option<u32> {
    let end = offset.checked_add(4)?;
    let field: [u8; 4] = bytes.get(offset..end)?.try_into().ok()?;
    Some(u32::from_le_bytes(field))
}

/// Bytes of strings and vectors in `command`: what the flatbuffer grows with.
fn command_variable_bytes(command: &Command) -> u64 {
    let s = |v: &str| len_u64(v.len());
    match command {
        Command::Connect { client_version, auth_method, auth_data, .. } => {
            s(client_version).saturating_add(s(auth_method)).saturating_add(len_u64(auth_data.0.len()))
        }
        Command::Connected { server_version, shard_ports, .. } => {
            s(server_version).saturating_add(len_u64(shard_ports.len()).saturating_mul(2))
        }
        Command::Producer { topic, producer_name, .. } => s(topic).saturating_add(s(producer_name)),
        Command::ProducerSuccess { producer_name, .. } => s(producer_name),
        Command::SendError { message, .. }
        | Command::Error { message, .. }
        | Command::ConsumerClosed { message, .. } => s(message),
        Command::AdminRequest { op, json, .. } => s(op).saturating_add(s(json)),
        Command::AdminResponse { json, .. } => s(json),
        Command::TopicStats { topic, json, .. } => s(topic).saturating_add(s(json)),
        Command::Subscribe { topic, subscription, consumer_name, filter_tag, key_shared_ranges, model, .. } => s(topic)
            .saturating_add(s(subscription))
            .saturating_add(s(consumer_name))
            .saturating_add(s(filter_tag))
            .saturating_add(len_u64(key_shared_ranges.len()).saturating_mul(8))
            .saturating_add(s(&model.zone))
            // Each string also costs its offset in the vector.
            .saturating_add(model.partition_zones.iter().fold(0u64, |n, z| n.saturating_add(s(z)).saturating_add(4))),
        Command::Ack { message_ids, batch_sizes, .. } => len_u64(message_ids.len())
            .saturating_mul(len_u64(std::mem::size_of::<fb::MessageIdData>()))
            .saturating_add(len_u64(batch_sizes.len()).saturating_mul(4)),
        Command::RedeliverUnacknowledged { message_ids, .. } => {
            len_u64(message_ids.len()).saturating_mul(len_u64(std::mem::size_of::<fb::MessageIdData>()))
        }
        Command::Message { ack_set, .. } => len_u64(ack_set.len()).saturating_mul(8),
        Command::MessageRun { lengths, .. } => len_u64(lengths.len()).saturating_mul(4),
        Command::Send { .. }
        | Command::SendReceipt { .. }
        | Command::Success { .. }
        | Command::Flow { .. }
        | Command::CloseProducer { .. }
        | Command::CloseConsumer { .. }
        | Command::Unsubscribe { .. }
        | Command::ActiveConsumerChange { .. }
        | Command::Seek { .. }
        | Command::Ping
        | Command::Pong => 0,
    }
}

fn id_to_fb(id: &MessageId) -> fb::MessageIdData {
    fb::MessageIdData::new(id.ledger, id.entry, id.partition, id.batch_index)
}

fn id_from_fb(id: &fb::MessageIdData) -> MessageId {
    MessageId::new(id.ledger(), id.entry(), id.partition(), id.batch_index())
}

fn error_code_to_fb(code: ErrorCode) -> fb::ErrorCode {
    fb::ErrorCode(code as u16)
}

fn sub_type_to_fb(t: SubscriptionType) -> fb::SubscriptionType {
    match t {
        SubscriptionType::Exclusive => fb::SubscriptionType::Exclusive,
        SubscriptionType::Failover => fb::SubscriptionType::Failover,
        SubscriptionType::Shared => fb::SubscriptionType::Shared,
        SubscriptionType::KeyShared => fb::SubscriptionType::KeyShared,
    }
}

fn sub_type_from_fb(t: fb::SubscriptionType) -> Result<SubscriptionType, WireError> {
    match t {
        fb::SubscriptionType::Exclusive => Ok(SubscriptionType::Exclusive),
        fb::SubscriptionType::Failover => Ok(SubscriptionType::Failover),
        fb::SubscriptionType::Shared => Ok(SubscriptionType::Shared),
        fb::SubscriptionType::KeyShared => Ok(SubscriptionType::KeyShared),
        other => Err(WireError::BadEnum { field: "Subscribe.sub_type", value: u64::from(other.0) }),
    }
}

fn allocation_to_fb(a: AllocationStrategy) -> fb::AllocationStrategy {
    match a {
        AllocationStrategy::RoundRobin => fb::AllocationStrategy::RoundRobin,
        AllocationStrategy::Average => fb::AllocationStrategy::Average,
        AllocationStrategy::ConsistentHash => fb::AllocationStrategy::ConsistentHash,
        AllocationStrategy::Zone => fb::AllocationStrategy::Zone,
    }
}

fn allocation_from_fb(a: fb::AllocationStrategy) -> Result<AllocationStrategy, WireError> {
    match a {
        fb::AllocationStrategy::RoundRobin => Ok(AllocationStrategy::RoundRobin),
        fb::AllocationStrategy::Average => Ok(AllocationStrategy::Average),
        fb::AllocationStrategy::ConsistentHash => Ok(AllocationStrategy::ConsistentHash),
        fb::AllocationStrategy::Zone => Ok(AllocationStrategy::Zone),
        other => Err(WireError::BadEnum { field: "Subscribe.allocation", value: u64::from(other.0) }),
    }
}

fn access_mode_to_fb(m: ProducerAccessMode) -> fb::ProducerAccessMode {
    match m {
        ProducerAccessMode::Shared => fb::ProducerAccessMode::Shared,
        ProducerAccessMode::Exclusive => fb::ProducerAccessMode::Exclusive,
        ProducerAccessMode::WaitForExclusive => fb::ProducerAccessMode::WaitForExclusive,
        ProducerAccessMode::ExclusiveWithFencing => fb::ProducerAccessMode::ExclusiveWithFencing,
    }
}

fn access_mode_from_fb(m: fb::ProducerAccessMode) -> Result<ProducerAccessMode, WireError> {
    match m {
        fb::ProducerAccessMode::Shared => Ok(ProducerAccessMode::Shared),
        fb::ProducerAccessMode::Exclusive => Ok(ProducerAccessMode::Exclusive),
        fb::ProducerAccessMode::WaitForExclusive => Ok(ProducerAccessMode::WaitForExclusive),
        fb::ProducerAccessMode::ExclusiveWithFencing => Ok(ProducerAccessMode::ExclusiveWithFencing),
        other => Err(WireError::BadEnum { field: "Producer.access_mode", value: u64::from(other.0) }),
    }
}

fn initial_position_to_fb(p: InitialPosition) -> fb::InitialPosition {
    match p {
        InitialPosition::Latest => fb::InitialPosition::Latest,
        InitialPosition::Earliest => fb::InitialPosition::Earliest,
    }
}

fn initial_position_from_fb(p: fb::InitialPosition) -> Result<InitialPosition, WireError> {
    match p {
        fb::InitialPosition::Latest => Ok(InitialPosition::Latest),
        fb::InitialPosition::Earliest => Ok(InitialPosition::Earliest),
        other => Err(WireError::BadEnum { field: "Subscribe.initial_position", value: u64::from(other.0) }),
    }
}

fn ack_type_to_fb(t: AckType) -> fb::AckType {
    match t {
        AckType::Individual => fb::AckType::Individual,
        AckType::Cumulative => fb::AckType::Cumulative,
    }
}

fn ack_type_from_fb(t: fb::AckType) -> Result<AckType, WireError> {
    match t {
        fb::AckType::Individual => Ok(AckType::Individual),
        fb::AckType::Cumulative => Ok(AckType::Cumulative),
        other => Err(WireError::BadEnum { field: "Ack.ack_type", value: u64::from(other.0) }),
    }
}

pub(crate) fn string(value: Option<&str>, field: &'static str) -> Result<String, WireError> {
    value.map(str::to_owned).ok_or(WireError::MissingField(field))
}

fn build_command<'b>(fbb: &mut FlatBufferBuilder<'b>, command: &Command) -> WIPOffset<fb::BaseCommand<'b>> {
    let (command_type, table) = match command {
        Command::Connect { client_version, protocol_version, max_frame_bytes, auth_method, auth_data } => {
            let client_version = Some(fbb.create_string(client_version));
            let auth_method = (!auth_method.is_empty()).then(|| fbb.create_string(auth_method));
            let auth_data = (!auth_data.0.is_empty()).then(|| fbb.create_vector(&auth_data.0));
            let args = fb::ConnectArgs {
                client_version,
                protocol_version: *protocol_version,
                max_frame_bytes: *max_frame_bytes,
                auth_method,
                auth_data,
            };
            (fb::AnyCommand::Connect, fb::Connect::create(fbb, &args).as_union_value())
        }
        Command::Connected { server_version, protocol_version, max_frame_bytes, shard, shard_ports } => {
            let server_version = Some(fbb.create_string(server_version));
            let shard_ports = (!shard_ports.is_empty()).then(|| fbb.create_vector(shard_ports));
            let args = fb::ConnectedArgs {
                server_version,
                protocol_version: *protocol_version,
                max_frame_bytes: *max_frame_bytes,
                shard: *shard,
                shard_ports,
            };
            (fb::AnyCommand::Connected, fb::Connected::create(fbb, &args).as_union_value())
        }
        Command::Producer { request_id, producer_id, topic, producer_name, access_mode } => {
            let topic = Some(fbb.create_string(topic));
            let producer_name = Some(fbb.create_string(producer_name));
            let args = fb::ProducerArgs {
                request_id: *request_id,
                producer_id: *producer_id,
                topic,
                producer_name,
                access_mode: access_mode_to_fb(*access_mode),
            };
            (fb::AnyCommand::Producer, fb::Producer::create(fbb, &args).as_union_value())
        }
        Command::ProducerSuccess { request_id, producer_name, last_sequence_id } => {
            let producer_name = Some(fbb.create_string(producer_name));
            let args =
                fb::ProducerSuccessArgs { request_id: *request_id, producer_name, last_sequence_id: *last_sequence_id };
            let table = fb::ProducerSuccess::create(fbb, &args);
            (fb::AnyCommand::ProducerSuccess, table.as_union_value())
        }
        Command::Send { producer_id, sequence_id, num_messages } => {
            let args =
                fb::SendArgs { producer_id: *producer_id, sequence_id: *sequence_id, num_messages: *num_messages };
            (fb::AnyCommand::Send, fb::Send::create(fbb, &args).as_union_value())
        }
        Command::SendReceipt { producer_id, sequence_id, message_id } => {
            let message_id = id_to_fb(message_id);
            let args = fb::SendReceiptArgs {
                producer_id: *producer_id,
                sequence_id: *sequence_id,
                message_id: Some(&message_id),
            };
            (fb::AnyCommand::SendReceipt, fb::SendReceipt::create(fbb, &args).as_union_value())
        }
        Command::SendError { producer_id, sequence_id, code, message } => {
            let message = Some(fbb.create_string(message));
            let args = fb::SendErrorArgs {
                producer_id: *producer_id,
                sequence_id: *sequence_id,
                code: error_code_to_fb(*code),
                message,
            };
            (fb::AnyCommand::SendError, fb::SendError::create(fbb, &args).as_union_value())
        }
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
        } => {
            let topic = Some(fbb.create_string(topic));
            let subscription = Some(fbb.create_string(subscription));
            let consumer_name = Some(fbb.create_string(consumer_name));
            // Absent when empty, so an old peer's frames and ours look alike.
            let filter_tag = (!filter_tag.is_empty()).then(|| fbb.create_string(filter_tag));
            let key_shared_ranges = (!key_shared_ranges.is_empty()).then(|| {
                let ranges: Vec<fb::KeyHashRange> =
                    key_shared_ranges.iter().map(|&(start, end)| fb::KeyHashRange::new(start, end)).collect();
                fbb.create_vector(&ranges)
            });
            let zone = (!model.zone.is_empty()).then(|| fbb.create_string(&model.zone));
            let partition_zones = (!model.partition_zones.is_empty()).then(|| {
                let zones: Vec<_> = model.partition_zones.iter().map(|z| fbb.create_string(z)).collect();
                fbb.create_vector(&zones)
            });
            let args = fb::SubscribeArgs {
                request_id: *request_id,
                consumer_id: *consumer_id,
                topic,
                subscription,
                sub_type: sub_type_to_fb(*sub_type),
                consumer_name,
                initial_position: initial_position_to_fb(*initial_position),
                durable: *durable,
                priority_level: *priority_level,
                filter_tag,
                key_shared_ranges,
                allocation: allocation_to_fb(model.allocation),
                zone,
                partition_zones,
                mode: match model.mode {
                    SubscriptionMode::Clustering => fb::SubscriptionMode::Clustering,
                    SubscriptionMode::Broadcast => fb::SubscriptionMode::Broadcast,
                },
            };
            (fb::AnyCommand::Subscribe, fb::Subscribe::create(fbb, &args).as_union_value())
        }
        Command::Success { request_id } => {
            let args = fb::SuccessArgs { request_id: *request_id };
            (fb::AnyCommand::Success, fb::Success::create(fbb, &args).as_union_value())
        }
        Command::Flow { consumer_id, permits } => {
            let args = fb::FlowArgs { consumer_id: *consumer_id, permits: *permits };
            (fb::AnyCommand::Flow, fb::Flow::create(fbb, &args).as_union_value())
        }
        Command::Message { consumer_id, message_id, redelivery_count, ack_set } => {
            let message_id = id_to_fb(message_id);
            // Absent when empty: the common case costs no bytes.
            let ack_set = (!ack_set.is_empty()).then(|| fbb.create_vector(ack_set));
            let args = fb::MessageArgs {
                consumer_id: *consumer_id,
                message_id: Some(&message_id),
                redelivery_count: *redelivery_count,
                ack_set,
            };
            (fb::AnyCommand::Message, fb::Message::create(fbb, &args).as_union_value())
        }
        Command::MessageRun { consumer_id, message_id, redelivery_count, lengths } => {
            let message_id = id_to_fb(message_id);
            let lengths = Some(fbb.create_vector(lengths));
            let args = fb::MessageRunArgs {
                consumer_id: *consumer_id,
                message_id: Some(&message_id),
                redelivery_count: *redelivery_count,
                lengths,
            };
            (fb::AnyCommand::MessageRun, fb::MessageRun::create(fbb, &args).as_union_value())
        }
        Command::Ack { consumer_id, ack_type, message_ids, request_id, batch_sizes } => {
            fbb.start_vector::<fb::MessageIdData>(message_ids.len());
            for id in message_ids.iter().rev() {
                fbb.push(id_to_fb(id));
            }
            let message_ids = Some(fbb.end_vector(message_ids.len()));
            let batch_sizes = (!batch_sizes.is_empty()).then(|| fbb.create_vector(batch_sizes));
            let args = fb::AckArgs {
                consumer_id: *consumer_id,
                ack_type: ack_type_to_fb(*ack_type),
                message_ids,
                request_id: *request_id,
                batch_sizes,
            };
            (fb::AnyCommand::Ack, fb::Ack::create(fbb, &args).as_union_value())
        }
        Command::CloseProducer { request_id, producer_id } => {
            let args = fb::CloseProducerArgs { request_id: *request_id, producer_id: *producer_id };
            let table = fb::CloseProducer::create(fbb, &args);
            (fb::AnyCommand::CloseProducer, table.as_union_value())
        }
        Command::CloseConsumer { request_id, consumer_id } => {
            let args = fb::CloseConsumerArgs { request_id: *request_id, consumer_id: *consumer_id };
            let table = fb::CloseConsumer::create(fbb, &args);
            (fb::AnyCommand::CloseConsumer, table.as_union_value())
        }
        Command::Unsubscribe { request_id, consumer_id, force } => {
            let args = fb::UnsubscribeArgs { request_id: *request_id, consumer_id: *consumer_id, force: *force };
            let table = fb::Unsubscribe::create(fbb, &args);
            (fb::AnyCommand::Unsubscribe, table.as_union_value())
        }
        Command::Ping => (fb::AnyCommand::Ping, fb::Ping::create(fbb, &fb::PingArgs {}).as_union_value()),
        Command::Pong => (fb::AnyCommand::Pong, fb::Pong::create(fbb, &fb::PongArgs {}).as_union_value()),
        Command::Error { request_id, code, message } => {
            let message = Some(fbb.create_string(message));
            let args = fb::ErrorArgs { request_id: *request_id, code: error_code_to_fb(*code), message };
            (fb::AnyCommand::Error, fb::Error::create(fbb, &args).as_union_value())
        }
        Command::RedeliverUnacknowledged { consumer_id, message_ids } => {
            fbb.start_vector::<fb::MessageIdData>(message_ids.len());
            for id in message_ids.iter().rev() {
                fbb.push(id_to_fb(id));
            }
            let message_ids = Some(fbb.end_vector(message_ids.len()));
            let args = fb::RedeliverUnacknowledgedArgs { consumer_id: *consumer_id, message_ids };
            let table = fb::RedeliverUnacknowledged::create(fbb, &args);
            (fb::AnyCommand::RedeliverUnacknowledged, table.as_union_value())
        }
        Command::ActiveConsumerChange { consumer_id, is_active } => {
            let args = fb::ActiveConsumerChangeArgs { consumer_id: *consumer_id, is_active: *is_active };
            let table = fb::ActiveConsumerChange::create(fbb, &args);
            (fb::AnyCommand::ActiveConsumerChange, table.as_union_value())
        }
        Command::ConsumerClosed { consumer_id, code, message, entry } => {
            let message = Some(fbb.create_string(message));
            let entry = entry.as_ref().map(id_to_fb);
            let args = fb::ConsumerClosedArgs {
                consumer_id: *consumer_id,
                code: error_code_to_fb(*code),
                message,
                entry: entry.as_ref(),
            };
            (fb::AnyCommand::ConsumerClosed, fb::ConsumerClosed::create(fbb, &args).as_union_value())
        }
        Command::Seek { request_id, consumer_id, message_id, publish_time_ms } => {
            let message_id = message_id.as_ref().map(id_to_fb);
            let args = fb::SeekArgs {
                request_id: *request_id,
                consumer_id: *consumer_id,
                message_id: message_id.as_ref(),
                publish_time_ms: *publish_time_ms,
            };
            (fb::AnyCommand::Seek, fb::Seek::create(fbb, &args).as_union_value())
        }
        Command::TopicStats { request_id, topic, json } => {
            let topic = Some(fbb.create_string(topic));
            let json = Some(fbb.create_string(json));
            let args = fb::TopicStatsArgs { request_id: *request_id, topic, json };
            (fb::AnyCommand::TopicStats, fb::TopicStats::create(fbb, &args).as_union_value())
        }
        Command::AdminRequest { request_id, op, json } => {
            let op = Some(fbb.create_string(op));
            let json = Some(fbb.create_string(json));
            let args = fb::AdminRequestArgs { request_id: *request_id, op, json };
            (fb::AnyCommand::AdminRequest, fb::AdminRequest::create(fbb, &args).as_union_value())
        }
        Command::AdminResponse { request_id, json } => {
            let json = Some(fbb.create_string(json));
            let args = fb::AdminResponseArgs { request_id: *request_id, json };
            (fb::AnyCommand::AdminResponse, fb::AdminResponse::create(fbb, &args).as_union_value())
        }
    };
    fb::BaseCommand::create(fbb, &fb::BaseCommandArgs { command_type, command: Some(table) })
}

/// Verify `bytes` as a BaseCommand flatbuffer and convert it to a `Command`.
pub fn decode_command(bytes: &[u8]) -> Result<Command, WireError> {
    let opts = verifier_options(bytes.len());
    let base = fb::root_as_base_command_with_opts(&opts, bytes)
        .map_err(|source| WireError::InvalidFlatbuffer { what: "BaseCommand", source })?;
    command_from_fb(&base)
}

fn command_from_fb(base: &fb::BaseCommand<'_>) -> Result<Command, WireError> {
    const MISSING: WireError = WireError::MissingField("BaseCommand.command");
    let command = match base.command_type() {
        fb::AnyCommand::Connect => {
            let c = base.command_as_connect().ok_or(MISSING)?;
            Command::Connect {
                client_version: string(c.client_version(), "Connect.client_version")?,
                protocol_version: c.protocol_version(),
                max_frame_bytes: c.max_frame_bytes(),
                // Absent (an older client): no credentials.
                auth_method: c.auth_method().unwrap_or_default().to_string(),
                auth_data: AuthData(c.auth_data().map(|v| v.bytes().to_vec()).unwrap_or_default()),
            }
        }
        fb::AnyCommand::Connected => {
            let c = base.command_as_connected().ok_or(MISSING)?;
            Command::Connected {
                server_version: string(c.server_version(), "Connected.server_version")?,
                protocol_version: c.protocol_version(),
                max_frame_bytes: c.max_frame_bytes(),
                shard: c.shard(),
                shard_ports: c.shard_ports().map(|v| v.iter().collect()).unwrap_or_default(),
            }
        }
        fb::AnyCommand::Producer => {
            let c = base.command_as_producer().ok_or(MISSING)?;
            Command::Producer {
                request_id: c.request_id(),
                producer_id: c.producer_id(),
                topic: string(c.topic(), "Producer.topic")?,
                producer_name: string(c.producer_name(), "Producer.producer_name")?,
                access_mode: access_mode_from_fb(c.access_mode())?,
            }
        }
        fb::AnyCommand::ProducerSuccess => {
            let c = base.command_as_producer_success().ok_or(MISSING)?;
            Command::ProducerSuccess {
                request_id: c.request_id(),
                producer_name: string(c.producer_name(), "ProducerSuccess.producer_name")?,
                last_sequence_id: c.last_sequence_id(),
            }
        }
        fb::AnyCommand::Send => {
            let c = base.command_as_send().ok_or(MISSING)?;
            Command::Send { producer_id: c.producer_id(), sequence_id: c.sequence_id(), num_messages: c.num_messages() }
        }
        fb::AnyCommand::SendReceipt => {
            let c = base.command_as_send_receipt().ok_or(MISSING)?;
            let message_id = c.message_id().ok_or(WireError::MissingField("SendReceipt.message_id"))?;
            Command::SendReceipt {
                producer_id: c.producer_id(),
                sequence_id: c.sequence_id(),
                message_id: id_from_fb(message_id),
            }
        }
        fb::AnyCommand::SendError => {
            let c = base.command_as_send_error().ok_or(MISSING)?;
            Command::SendError {
                producer_id: c.producer_id(),
                sequence_id: c.sequence_id(),
                // Unknown codes from a newer peer degrade to UnknownError.
                code: ErrorCode::from_u16(c.code().0),
                message: string(c.message(), "SendError.message")?,
            }
        }
        fb::AnyCommand::Subscribe => {
            let c = base.command_as_subscribe().ok_or(MISSING)?;
            Command::Subscribe {
                request_id: c.request_id(),
                consumer_id: c.consumer_id(),
                topic: string(c.topic(), "Subscribe.topic")?,
                subscription: string(c.subscription(), "Subscribe.subscription")?,
                sub_type: sub_type_from_fb(c.sub_type())?,
                consumer_name: string(c.consumer_name(), "Subscribe.consumer_name")?,
                initial_position: initial_position_from_fb(c.initial_position())?,
                durable: c.durable(),
                priority_level: c.priority_level(),
                filter_tag: c.filter_tag().unwrap_or_default().to_owned(),
                key_shared_ranges: c
                    .key_shared_ranges()
                    .map(|v| v.iter().map(|r| (r.start(), r.end())).collect())
                    .unwrap_or_default(),
                model: ConsumptionModel {
                    mode: match c.mode() {
                        fb::SubscriptionMode::Clustering => SubscriptionMode::Clustering,
                        fb::SubscriptionMode::Broadcast => SubscriptionMode::Broadcast,
                        other => return Err(WireError::BadEnum { field: "Subscribe.mode", value: u64::from(other.0) }),
                    },
                    allocation: allocation_from_fb(c.allocation())?,
                    zone: c.zone().unwrap_or_default().to_owned(),
                    partition_zones: c
                        .partition_zones()
                        .map(|v| v.iter().map(str::to_owned).collect())
                        .unwrap_or_default(),
                },
            }
        }
        fb::AnyCommand::Success => {
            let c = base.command_as_success().ok_or(MISSING)?;
            Command::Success { request_id: c.request_id() }
        }
        fb::AnyCommand::Flow => {
            let c = base.command_as_flow().ok_or(MISSING)?;
            Command::Flow { consumer_id: c.consumer_id(), permits: c.permits() }
        }
        fb::AnyCommand::Message => {
            let c = base.command_as_message().ok_or(MISSING)?;
            let message_id = c.message_id().ok_or(WireError::MissingField("Message.message_id"))?;
            Command::Message {
                consumer_id: c.consumer_id(),
                message_id: id_from_fb(message_id),
                redelivery_count: c.redelivery_count(),
                ack_set: c.ack_set().map(|v| v.iter().collect()).unwrap_or_default(),
            }
        }
        fb::AnyCommand::MessageRun => {
            let c = base.command_as_message_run().ok_or(MISSING)?;
            let message_id = id_from_fb(c.message_id().ok_or(WireError::MissingField("MessageRun.message_id"))?);
            let lengths: Vec<u32> = c.lengths().ok_or(WireError::MissingField("MessageRun.lengths"))?.iter().collect();
            check_run_ids(&message_id, lengths.len())?;
            Command::MessageRun {
                consumer_id: c.consumer_id(),
                message_id,
                redelivery_count: c.redelivery_count(),
                lengths,
            }
        }
        fb::AnyCommand::Ack => {
            let c = base.command_as_ack().ok_or(MISSING)?;
            let ids = c.message_ids().ok_or(WireError::MissingField("Ack.message_ids"))?;
            let batch_sizes: Vec<u32> = c.batch_sizes().map(|v| v.iter().collect()).unwrap_or_default();
            if !batch_sizes.is_empty() && batch_sizes.len() != ids.len() {
                return Err(WireError::BadCount {
                    field: "Ack.batch_sizes",
                    expected: len_u64(ids.len()),
                    found: len_u64(batch_sizes.len()),
                });
            }
            Command::Ack {
                consumer_id: c.consumer_id(),
                ack_type: ack_type_from_fb(c.ack_type())?,
                message_ids: ids.iter().map(id_from_fb).collect(),
                request_id: c.request_id(),
                batch_sizes,
            }
        }
        fb::AnyCommand::CloseProducer => {
            let c = base.command_as_close_producer().ok_or(MISSING)?;
            Command::CloseProducer { request_id: c.request_id(), producer_id: c.producer_id() }
        }
        fb::AnyCommand::CloseConsumer => {
            let c = base.command_as_close_consumer().ok_or(MISSING)?;
            Command::CloseConsumer { request_id: c.request_id(), consumer_id: c.consumer_id() }
        }
        fb::AnyCommand::Unsubscribe => {
            let c = base.command_as_unsubscribe().ok_or(MISSING)?;
            Command::Unsubscribe { request_id: c.request_id(), consumer_id: c.consumer_id(), force: c.force() }
        }
        fb::AnyCommand::Ping => {
            base.command_as_ping().ok_or(MISSING)?;
            Command::Ping
        }
        fb::AnyCommand::Pong => {
            base.command_as_pong().ok_or(MISSING)?;
            Command::Pong
        }
        fb::AnyCommand::Error => {
            let c = base.command_as_error().ok_or(MISSING)?;
            Command::Error {
                request_id: c.request_id(),
                code: ErrorCode::from_u16(c.code().0),
                message: string(c.message(), "Error.message")?,
            }
        }
        fb::AnyCommand::RedeliverUnacknowledged => {
            let c = base.command_as_redeliver_unacknowledged().ok_or(MISSING)?;
            let ids = c.message_ids().ok_or(WireError::MissingField("RedeliverUnacknowledged.message_ids"))?;
            Command::RedeliverUnacknowledged {
                consumer_id: c.consumer_id(),
                message_ids: ids.iter().map(id_from_fb).collect(),
            }
        }
        fb::AnyCommand::ActiveConsumerChange => {
            let c = base.command_as_active_consumer_change().ok_or(MISSING)?;
            Command::ActiveConsumerChange { consumer_id: c.consumer_id(), is_active: c.is_active() }
        }
        fb::AnyCommand::Seek => {
            let c = base.command_as_seek().ok_or(MISSING)?;
            Command::Seek {
                request_id: c.request_id(),
                consumer_id: c.consumer_id(),
                message_id: c.message_id().map(id_from_fb),
                publish_time_ms: c.publish_time_ms(),
            }
        }
        fb::AnyCommand::TopicStats => {
            let c = base.command_as_topic_stats().ok_or(MISSING)?;
            Command::TopicStats {
                request_id: c.request_id(),
                topic: string(c.topic(), "TopicStats.topic")?,
                json: string(c.json(), "TopicStats.json")?,
            }
        }
        fb::AnyCommand::AdminRequest => {
            let c = base.command_as_admin_request().ok_or(MISSING)?;
            Command::AdminRequest {
                request_id: c.request_id(),
                op: string(c.op(), "AdminRequest.op")?,
                json: string(c.json(), "AdminRequest.json")?,
            }
        }
        fb::AnyCommand::AdminResponse => {
            let c = base.command_as_admin_response().ok_or(MISSING)?;
            Command::AdminResponse { request_id: c.request_id(), json: string(c.json(), "AdminResponse.json")? }
        }
        fb::AnyCommand::ConsumerClosed => {
            let c = base.command_as_consumer_closed().ok_or(MISSING)?;
            Command::ConsumerClosed {
                consumer_id: c.consumer_id(),
                code: ErrorCode::from_u16(c.code().0),
                message: string(c.message(), "ConsumerClosed.message")?,
                entry: c.entry().map(id_from_fb),
            }
        }
        other => return Err(WireError::UnknownCommand(other.0)),
    };
    Ok(command)
}
