//! Deterministic tests of the frame codec and the message blob: round trips
//! of every command and of the metadata, streaming across split points,
//! limits, corruption, and typed errors for malformed flatbuffers.

// Test code: unwrap on our own encoder's output is the assertion.
#![allow(clippy::unwrap_used)]

mod common;

use bytes::{BufMut, Bytes, BytesMut};
use common::*;
use flatbuffers::FlatBufferBuilder;
use magnetar_wire::generated::magnetar::wire as fb;
use magnetar_wire::*;

fn payload_for(command: &Command) -> Bytes {
    payload_fitting(command, encode_message(&full_metadata(), b"hello payload"))
}

/// Goal: every command survives encode → decode unchanged, with edge values.
/// Method: encode each case alone, decode it, compare; the buffer must be empty after.
#[test]
fn every_command_round_trips() {
    let commands = all_commands();
    let mut seen: Vec<&str> = commands.iter().map(Command::name).collect();
    seen.sort_unstable();
    seen.dedup();
    let mut names = command_names();
    names.sort_unstable();
    assert_eq!(seen, names, "every Command variant needs a round-trip case");

    let mut decoder = FrameDecoder::new(FRAME_BYTES_MAX_DEFAULT);
    for command in &commands {
        let payload = payload_for(command);
        let mut buf = encode(command, &payload);
        let frame = decoder.decode(&mut buf).unwrap().expect("a whole frame");
        assert_eq!(&frame.command, command);
        assert_eq!(frame.payload, payload);
        assert!(buf.is_empty(), "{} left {} bytes", command.name(), buf.len());
    }
}

/// Goal: the header fields are what docs/format.md says.
#[test]
fn frame_layout_matches_the_documented_one() {
    let payload = encode_message(&MessageMetadata::default(), b"xyz");
    let buf = encode(&Command::Send { producer_id: 1, sequence_id: 2, num_messages: 1 }, &payload);
    let frame_len = u32::from_le_bytes(buf[0..4].try_into().unwrap()) as usize;
    let checksum = u32::from_le_bytes(buf[4..8].try_into().unwrap());
    let cmd_len = u32::from_le_bytes(buf[8..12].try_into().unwrap()) as usize;
    assert_eq!(frame_len, buf.len() - 4);
    assert_eq!(frame_len, 8 + cmd_len + payload.len());
    assert_eq!(checksum, crc32fast::hash(&buf[8..]));
    assert_eq!(&buf[12 + cmd_len..], &payload[..]);
}

/// Goal: `encode_frame_head` + the payload written separately equals `encode_frame`.
#[test]
fn frame_head_plus_payload_equals_whole_frame() {
    let command = Command::Message {
        consumer_id: 1,
        message_id: MessageId::new(1, 2, 3, 4),
        redelivery_count: 0,
        ack_set: vec![],
    };
    let payload = encode_message(&full_metadata(), &[7u8; 1000]);
    let whole = encode(&command, &payload);
    let mut head = BytesMut::new();
    encode_frame_head(&command, &payload, &mut head).unwrap();
    head.extend_from_slice(&payload);
    assert_eq!(head, whole);
}

/// Goal: a stream of frames decodes identically however it is split.
/// Method: feed the concatenation byte by byte, then at every single split point.
#[test]
fn decodes_across_arbitrary_split_points() {
    let commands = all_commands();
    let mut stream = BytesMut::new();
    let mut expected = Vec::new();
    for command in &commands {
        let payload = payload_for(command);
        encode_frame(command, &payload, &mut stream).unwrap();
        expected.push(Frame { command: command.clone(), payload, payload_crc: None });
    }

    // Byte by byte.
    let mut decoder = FrameDecoder::default();
    let mut buf = BytesMut::new();
    let mut got = Vec::new();
    for byte in stream.iter() {
        buf.put_u8(*byte);
        while let Some(frame) = decoder.decode(&mut buf).unwrap() {
            got.push(frame);
        }
    }
    assert_eq!(got, expected);
    assert!(buf.is_empty());

    // Two pieces, every split point (over the first few frames, to stay quick).
    let prefix_len = {
        let mut d = FrameDecoder::default();
        let mut b = stream.clone();
        for _ in 0..4 {
            d.decode(&mut b).unwrap().unwrap();
        }
        stream.len() - b.len()
    };
    let prefix = &stream[..prefix_len];
    for split in 0..=prefix.len() {
        let mut buf = BytesMut::from(&prefix[..split]);
        let mut got = Vec::new();
        while let Some(frame) = decoder.decode(&mut buf).unwrap() {
            got.push(frame);
        }
        buf.extend_from_slice(&prefix[split..]);
        while let Some(frame) = decoder.decode(&mut buf).unwrap() {
            got.push(frame);
        }
        assert_eq!(got, expected[..4], "split at {split}");
    }
}

/// Goal: the payload is a slice of the receive buffer, not a copy.
#[test]
fn payload_is_not_copied() {
    let payload = encode_message(&full_metadata(), &[1u8; 4096]);
    let mut buf = encode(&Command::Send { producer_id: 1, sequence_id: 1, num_messages: 1 }, &payload);
    let range = buf.as_ptr() as usize..buf.as_ptr() as usize + buf.len();
    let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
    let at = frame.payload.as_ptr() as usize;
    assert!(range.contains(&at) && at + frame.payload.len() == range.end);

    // And the blob's payload is a slice of the blob.
    let (_, inner) = decode_message(&frame.payload).unwrap();
    let blob = frame.payload.as_ptr() as usize..frame.payload.as_ptr() as usize + frame.payload.len();
    assert_eq!(inner.as_ptr() as usize + inner.len(), blob.end);
}

/// Goal: an oversize length is rejected from the 4 length bytes alone, without
/// waiting for the rest and without touching or growing the buffer.
#[test]
fn oversize_length_rejected_before_allocation() {
    let max = 1024;
    let mut decoder = FrameDecoder::new(max);
    for len in [max + 1, u32::MAX] {
        let mut buf = BytesMut::with_capacity(4);
        buf.put_u32_le(len);
        let capacity = buf.capacity();
        let err = decoder.decode(&mut buf).unwrap_err();
        assert_eq!(err, WireError::FrameTooLarge { len: u64::from(len), max: u64::from(max) });
        assert!(err.is_fatal());
        assert_eq!(buf.len(), 4, "buffer untouched");
        assert_eq!(buf.capacity(), capacity, "nothing reserved");
        assert_eq!(decoder.next_frame_bytes(&buf), Err(err));
    }
    // Exactly at the limit is fine (needs more bytes).
    let mut buf = BytesMut::new();
    buf.put_u32_le(max);
    assert_eq!(decoder.decode(&mut buf), Ok(None));
    assert_eq!(decoder.next_frame_bytes(&buf), Ok(Some(max as usize + 4)));
    // Fewer than 4 bytes: nothing known yet.
    assert_eq!(decoder.next_frame_bytes(&[1, 2, 3]), Ok(None));
}

#[test]
fn undersize_length_rejected() {
    for len in 0..FRAME_LEN_MIN {
        let mut buf = BytesMut::new();
        buf.put_u32_le(len);
        let err = FrameDecoder::default().decode(&mut buf).unwrap_err();
        assert_eq!(err, WireError::FrameTooSmall { len: u64::from(len), min: 8 });
    }
}

/// Goal: any single flipped bit after the length field is caught by the CRC.
/// Method: flip every bit of a Send frame with payload, one at a time.
#[test]
fn flipped_bit_is_a_checksum_error() {
    let payload = encode_message(&full_metadata(), b"abc");
    let clean = encode(&Command::Send { producer_id: 1, sequence_id: 2, num_messages: 1 }, &payload);
    for byte in 4..clean.len() {
        for bit in 0..8 {
            let mut buf = clean.clone();
            buf[byte] ^= 1 << bit;
            let err = FrameDecoder::default().decode(&mut buf).unwrap_err();
            assert!(matches!(err, WireError::ChecksumMismatch { .. }), "byte {byte} bit {bit}: {err:?}");
            assert!(err.is_fatal());
            assert_eq!(buf.len(), clean.len(), "a fatal error leaves the buffer alone");
        }
    }
    // Flips in the length field: never a wrong frame, only "need more" or an error.
    for bit in 0..32 {
        let mut buf = clean.clone();
        buf[bit / 8] ^= 1 << (bit % 8);
        match FrameDecoder::default().decode(&mut buf) {
            Ok(None) | Err(_) => {}
            Ok(Some(frame)) => panic!("bit {bit} of frame_len decoded {frame:?}"),
        }
    }
}

#[test]
fn payload_on_a_command_without_one_is_rejected() {
    let mut dst = BytesMut::new();
    assert_eq!(
        encode_frame(&Command::Ping, b"x", &mut dst),
        Err(WireError::UnexpectedPayload { command: "Ping", len: 1 })
    );
    assert!(dst.is_empty());

    // A peer that sends one anyway: the frame is consumed, the stream goes on.
    let mut buf = encode(&Command::Ping, &[]);
    let cmd_len = buf.len() - 12;
    let mut forged = raw_frame(&buf[12..12 + cmd_len], b"junk");
    forged.extend_from_slice(&encode(&Command::Pong, &[]));
    let mut decoder = FrameDecoder::default();
    let err = decoder.decode(&mut forged).unwrap_err();
    assert_eq!(err, WireError::UnexpectedPayload { command: "Ping", len: 4 });
    assert!(!err.is_fatal());
    assert_eq!(decoder.decode(&mut forged).unwrap().unwrap().command, Command::Pong);
    buf.clear();
}

fn finish_base(
    fbb: &mut FlatBufferBuilder<'_>,
    ty: fb::AnyCommand,
    table: Option<flatbuffers::WIPOffset<flatbuffers::UnionWIPOffset>>,
) -> Vec<u8> {
    let root = fb::BaseCommand::create(fbb, &fb::BaseCommandArgs { command_type: ty, command: table });
    fbb.finish_minimal(root);
    fbb.finished_data().to_vec()
}

fn decode_raw(cmd: &[u8]) -> Result<Option<Frame>, WireError> {
    FrameDecoder::default().decode(&mut raw_frame(cmd, &[]))
}

/// Goal: malformed but checksummed commands give typed errors, consume the
/// frame, and never panic.
#[test]
fn malformed_commands_give_typed_errors() {
    // Not a flatbuffer at all.
    assert!(matches!(decode_raw(&[]), Err(WireError::InvalidFlatbuffer { what: "BaseCommand", .. })));
    assert!(matches!(decode_raw(&[0xff; 16]), Err(WireError::InvalidFlatbuffer { what: "BaseCommand", .. })));

    // No command in the union.
    let mut fbb = FlatBufferBuilder::new();
    let cmd = finish_base(&mut fbb, fb::AnyCommand::NONE, None);
    assert_eq!(decode_raw(&cmd), Err(WireError::UnknownCommand(0)));

    // A command type from the future.
    let mut fbb = FlatBufferBuilder::new();
    let t = fb::Ping::create(&mut fbb, &fb::PingArgs {});
    let cmd = finish_base(&mut fbb, fb::AnyCommand(200), Some(t.as_union_value()));
    assert_eq!(decode_raw(&cmd), Err(WireError::UnknownCommand(200)));

    // A missing string.
    let mut fbb = FlatBufferBuilder::new();
    let t = fb::Producer::create(
        &mut fbb,
        &fb::ProducerArgs { request_id: 1, producer_id: 2, topic: None, producer_name: None, ..Default::default() },
    );
    let cmd = finish_base(&mut fbb, fb::AnyCommand::Producer, Some(t.as_union_value()));
    assert_eq!(decode_raw(&cmd), Err(WireError::MissingField("Producer.topic")));

    // A missing message id.
    let mut fbb = FlatBufferBuilder::new();
    let t =
        fb::SendReceipt::create(&mut fbb, &fb::SendReceiptArgs { producer_id: 1, sequence_id: 2, message_id: None });
    let cmd = finish_base(&mut fbb, fb::AnyCommand::SendReceipt, Some(t.as_union_value()));
    assert_eq!(decode_raw(&cmd), Err(WireError::MissingField("SendReceipt.message_id")));

    // Union type says Producer, table is missing.
    let mut fbb = FlatBufferBuilder::new();
    let cmd = finish_base(&mut fbb, fb::AnyCommand::Producer, None);
    assert!(decode_raw(&cmd).is_err());

    // Unknown enum value.
    let mut fbb = FlatBufferBuilder::new();
    let topic = Some(fbb.create_string("t"));
    let subscription = Some(fbb.create_string("s"));
    let consumer_name = Some(fbb.create_string("c"));
    let t = fb::Subscribe::create(
        &mut fbb,
        &fb::SubscribeArgs {
            topic,
            subscription,
            consumer_name,
            sub_type: fb::SubscriptionType(9),
            ..Default::default()
        },
    );
    let cmd = finish_base(&mut fbb, fb::AnyCommand::Subscribe, Some(t.as_union_value()));
    assert_eq!(decode_raw(&cmd), Err(WireError::BadEnum { field: "Subscribe.sub_type", value: 9 }));

    // Unknown error codes degrade to UnknownError (forward compatibility).
    let mut fbb = FlatBufferBuilder::new();
    let message = Some(fbb.create_string("m"));
    let t = fb::Error::create(&mut fbb, &fb::ErrorArgs { request_id: 5, code: fb::ErrorCode(999), message });
    let cmd = finish_base(&mut fbb, fb::AnyCommand::Error, Some(t.as_union_value()));
    assert_eq!(
        decode_raw(&cmd).unwrap().unwrap().command,
        Command::Error { request_id: 5, code: ErrorCode::UnknownError, message: "m".into() }
    );

    // cmd_len pointing past the frame (checksum fixed up so it gets that far).
    let mut buf = encode(&Command::Ping, &[]);
    let bad = u32::try_from(buf.len()).unwrap();
    buf[8..12].copy_from_slice(&bad.to_le_bytes());
    fix_checksum(&mut buf);
    let total = buf.len();
    let err = FrameDecoder::default().decode(&mut buf).unwrap_err();
    assert_eq!(
        err,
        WireError::Truncated { what: "frame command", offset: 12, need: u64::from(bad), have: total as u64 - 12 }
    );
    assert!(buf.is_empty(), "a non-fatal error consumes the frame");
}

/// Goal: metadata round trips exactly, `None` and `Some("")` stay distinct.
#[test]
fn message_metadata_round_trips() {
    let cases = [
        MessageMetadata::default(),
        full_metadata(),
        MessageMetadata {
            partition_key: Some(String::new()),
            ordering_key: Some(Bytes::new()),
            chunk: Some(ChunkInfo::default()),
            tag: Some(String::new()),
            num_messages: 1,
            ..MessageMetadata::default()
        },
    ];
    for meta in &cases {
        for payload in [&b""[..], b"p", &[0xAB; 10_000]] {
            let blob = encode_message(meta, payload);
            let (got, got_payload) = decode_message(&blob).unwrap();
            assert_eq!(&got, meta);
            assert_eq!(&got_payload[..], payload);

            let peek = peek_message(&blob).unwrap();
            assert_eq!(peek.producer_name, meta.producer_name);
            assert_eq!(peek.sequence_id, meta.sequence_id);
            assert_eq!(peek.publish_time_ms, meta.publish_time_ms);
            assert_eq!(peek.event_time_ms, meta.event_time_ms);
            assert_eq!(peek.partition_key, meta.partition_key.as_deref());
            assert_eq!(peek.ordering_key, meta.ordering_key.as_deref());
            assert_eq!(peek.num_messages, meta.num_messages);
            assert_eq!(peek.deliver_at_ms, meta.deliver_at_ms);
            assert_eq!(peek.tag, meta.tag.as_deref());
            assert_eq!(peek.payload, payload);
            assert_eq!(
                peek_publish_time_and_key(&blob).unwrap(),
                (meta.publish_time_ms, meta.partition_key.as_deref())
            );

            let mut into = BytesMut::from(&b"prefix"[..]);
            encode_message_into(meta, payload, &mut into);
            assert_eq!(&into[6..], &blob[..]);
        }
    }
}

#[test]
fn message_blob_layout_matches_the_documented_one() {
    let blob = encode_message(&full_metadata(), b"PAYLOAD");
    let metadata_len = u32::from_le_bytes(blob[0..4].try_into().unwrap()) as usize;
    assert_eq!(&blob[4 + metadata_len..], b"PAYLOAD");
}

#[test]
fn malformed_message_blobs_give_typed_errors() {
    assert_eq!(
        decode_message(&Bytes::from_static(&[1, 2])),
        Err(WireError::Truncated { what: "message metadata_len", offset: 0, need: 4, have: 2 })
    );
    assert_eq!(
        decode_message(&Bytes::from_static(&[0xff, 0xff, 0xff, 0xff, 0])),
        Err(WireError::Truncated { what: "message metadata", offset: 4, need: u64::from(u32::MAX), have: 1 })
    );
    assert!(matches!(
        decode_message(&Bytes::from_static(&[0, 0, 0, 0])),
        Err(WireError::InvalidFlatbuffer { what: "MessageMetadata", .. })
    ));

    // Valid flatbuffer, producer name missing.
    let mut fbb = FlatBufferBuilder::new();
    let t = fb::MessageMetadata::create(&mut fbb, &fb::MessageMetadataArgs::default());
    fbb.finish_minimal(t);
    let mut blob = BytesMut::new();
    blob.put_u32_le(u32::try_from(fbb.finished_data().len()).unwrap());
    blob.extend_from_slice(fbb.finished_data());
    let blob = blob.freeze();
    assert_eq!(decode_message(&blob), Err(WireError::MissingField("MessageMetadata.producer_name")));
    assert_eq!(peek_message(&blob), Err(WireError::MissingField("MessageMetadata.producer_name")));

    // Unknown compression.
    let mut fbb = FlatBufferBuilder::new();
    let producer_name = Some(fbb.create_string("p"));
    let t = fb::MessageMetadata::create(
        &mut fbb,
        &fb::MessageMetadataArgs { producer_name, compression: fb::CompressionType(77), ..Default::default() },
    );
    fbb.finish_minimal(t);
    let mut blob = BytesMut::new();
    blob.put_u32_le(u32::try_from(fbb.finished_data().len()).unwrap());
    blob.extend_from_slice(fbb.finished_data());
    assert_eq!(
        decode_message(&blob.freeze()),
        Err(WireError::BadEnum { field: "MessageMetadata.compression", value: 77 })
    );
}

#[test]
fn message_id_text_form_round_trips() {
    for id in [MessageId::new(0, 0, -1, -1), MessageId::new(u64::MAX, 7, i32::MAX, i32::MIN)] {
        assert_eq!(id.to_string().parse::<MessageId>().unwrap(), id);
    }
    assert!("1:2:3".parse::<MessageId>().is_err());
    assert!("1:2:3:4:5".parse::<MessageId>().is_err());
}

/// Goal: a `MessageRun` frame is laid out as docs/format.md says ("Message
/// runs"): the header as for every frame, the command, then the entries'
/// blobs back to back; `encode_message_run_frame` writes what `encode_frame`
/// writes for the same command.
#[test]
fn run_frame_layout_matches_the_documented_one() {
    let blobs = [Bytes::from_static(b"abc"), Bytes::new(), Bytes::from_static(b"12345")];
    let first = MessageId::new(2, 3, -1, -1);
    let mut buf = BytesMut::new();
    encode_message_run_frame(1, &first, 0, &blobs, &mut buf).unwrap();
    let frame_len = u32::from_le_bytes(buf[0..4].try_into().unwrap()) as usize;
    let checksum = u32::from_le_bytes(buf[4..8].try_into().unwrap());
    let cmd_len = u32::from_le_bytes(buf[8..12].try_into().unwrap()) as usize;
    assert_eq!(frame_len, buf.len() - 4);
    assert_eq!(frame_len, 8 + cmd_len + 8);
    assert_eq!(cmd_len, 96, "the documented example's command length");
    assert_eq!(checksum, crc32fast::hash(&buf[8..]));
    assert_eq!(&buf[12 + cmd_len..], b"abc12345");
    let command =
        Command::MessageRun { consumer_id: 1, message_id: first, redelivery_count: 0, lengths: vec![3, 0, 5] };
    assert_eq!(buf, encode(&command, b"abc12345"));
    let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
    let entries: Vec<(MessageId, Bytes)> = run_entries(first, &[3, 0, 5], &frame.payload).unwrap().collect();
    assert_eq!(
        entries,
        vec![
            (MessageId::new(2, 3, -1, -1), blobs[0].clone()),
            (MessageId::new(2, 4, -1, -1), blobs[1].clone()),
            (MessageId::new(2, 5, -1, -1), blobs[2].clone()),
        ]
    );
}

/// Goal: malformed runs are typed errors, never panics, and not fatal: a
/// run without entries, lengths that do not add up (more or fewer bytes
/// than the payload), an entry number past u64::MAX, a missing lengths
/// vector or id.
#[test]
fn malformed_runs_give_typed_errors() {
    let bad_run = |c: Command, payload: &[u8]| {
        let mut scratch = BytesMut::new();
        assert!(matches!(encode_frame(&c, payload, &mut scratch), Err(WireError::BadRun { .. })), "{c:?}");
    };
    let id = MessageId::new(1, 1, -1, -1);
    let run = |lengths: Vec<u32>, id: MessageId| Command::MessageRun {
        consumer_id: 1,
        message_id: id,
        redelivery_count: 0,
        lengths,
    };
    bad_run(run(vec![], id), b"");
    bad_run(run(vec![2, 2], id), b"abc");
    bad_run(run(vec![2], id), b"abc");
    bad_run(run(vec![u32::MAX, u32::MAX], id), b"");
    bad_run(run(vec![1, 1], MessageId::new(1, u64::MAX, -1, -1)), b"ab");
    // One entry at u64::MAX is fine.
    let mut ok = BytesMut::new();
    encode_frame(&run(vec![2], MessageId::new(1, u64::MAX, -1, -1)), b"ab", &mut ok).unwrap();
    assert!(run_entries(id, &[1, 1], &Bytes::from_static(b"abc")).is_err());
    assert!(run_entries(id, &[], &Bytes::new()).is_err());

    // Built by hand: no lengths, no id.
    let build = |with_id: bool, with_lengths: bool| {
        let mut fbb = FlatBufferBuilder::new();
        let lengths = with_lengths.then(|| fbb.create_vector(&[1u32]));
        let mid = fb::MessageIdData::new(1, 1, -1, -1);
        let args =
            fb::MessageRunArgs { consumer_id: 1, message_id: with_id.then_some(&mid), redelivery_count: 0, lengths };
        let table = fb::MessageRun::create(&mut fbb, &args).as_union_value();
        let root = fb::BaseCommand::create(
            &mut fbb,
            &fb::BaseCommandArgs { command_type: fb::AnyCommand::MessageRun, command: Some(table) },
        );
        fbb.finish_minimal(root);
        fbb.finished_data().to_vec()
    };
    for (with_id, with_lengths, field) in [(false, true, "MessageRun.message_id"), (true, false, "MessageRun.lengths")]
    {
        let mut buf = raw_frame(&build(with_id, with_lengths), b"x");
        encode_frame(&Command::Ping, &[], &mut buf).unwrap();
        let mut decoder = FrameDecoder::default();
        let e = decoder.decode(&mut buf).unwrap_err();
        assert_eq!(e, WireError::MissingField(field));
        assert!(!e.is_fatal());
        assert_eq!(decoder.decode(&mut buf).unwrap().unwrap().command, Command::Ping, "the stream stays in step");
    }
    // Well formed: decodes.
    let mut buf = raw_frame(&build(true, true), b"x");
    assert!(FrameDecoder::default().decode(&mut buf).unwrap().is_some());
}

/// Goal: a large payload comes out of the decoder with its own CRC-32 (what
/// the broker's log keeps instead of hashing the bytes again), a small one
/// without, and the frame's checksum still catches a flipped bit anywhere,
/// in the command or in the payload.
/// Method: Send frames with payloads around `PAYLOAD_CRC_MIN`; then every
/// 97th bit of a large frame flipped in turn.
#[test]
fn large_payloads_carry_their_crc_and_every_bit_still_counts() {
    let command = Command::Send { producer_id: 1, sequence_id: 2, num_messages: 3 };
    for len in [0, 1, PAYLOAD_CRC_MIN - 1, PAYLOAD_CRC_MIN, PAYLOAD_CRC_MIN + 1, 200_000] {
        let payload: Vec<u8> = (0..len).map(|i| (i * 131 + 7) as u8).collect();
        let mut stream = BytesMut::new();
        encode_frame(&command, &payload, &mut stream).unwrap();
        let whole = stream.clone();
        let frame = FrameDecoder::new(1 << 20).decode(&mut stream).unwrap().unwrap();
        assert_eq!(frame.payload, payload);
        let want = (len >= PAYLOAD_CRC_MIN).then(|| crc32fast::hash(&payload));
        assert_eq!(frame.payload_crc, want, "payload of {len} bytes");
        if len == 200_000 {
            for bit in (64..whole.len() * 8).step_by(97) {
                let mut bad = whole.clone();
                bad[bit / 8] ^= 1 << (bit % 8);
                let got = FrameDecoder::new(1 << 20).decode(&mut bad);
                assert!(matches!(got, Err(WireError::ChecksumMismatch { .. })), "bit {bit}: {got:?}");
            }
        }
    }
}

/// Goal: the split of a frame's checksum into command and payload parts
/// (`Frame::payload_crc`) trusts nothing in the frame: whatever `cmd_len` a
/// frame with a correct checksum claims (0, inside the payload, exactly at
/// the end, past it, u32::MAX), and however short the frame, decoding gives
/// a frame or an error and never panics; a decoded frame's `payload_crc` is
/// the CRC-32 of exactly its payload, present only for large payloads.
/// Method: a large Send frame with its `cmd_len` rewritten and the checksum
/// made right again; then the smallest frames, with every `cmd_len` byte
/// pattern that matters.
#[test]
fn hostile_cmd_len_never_misattributes_a_payload_crc() {
    let command = Command::Send { producer_id: 1, sequence_id: 2, num_messages: 1 };
    let payload: Vec<u8> = (0..PAYLOAD_CRC_MIN + 100).map(|i| (i * 7 + 1) as u8).collect();
    let mut good = BytesMut::new();
    encode_frame(&command, &payload, &mut good).unwrap();
    let body_len = good.len() - 8;
    let real_cmd_len = u32::from_le_bytes(good[8..12].try_into().unwrap()) as usize;
    let rest = body_len - 4;
    let cmd_lens: Vec<u32> = [
        0,
        1,
        real_cmd_len,
        real_cmd_len + 1,
        rest - PAYLOAD_CRC_MIN - 1,
        rest - PAYLOAD_CRC_MIN,
        rest - PAYLOAD_CRC_MIN + 1,
        rest - 1,
        rest,
        rest + 1,
        body_len,
    ]
    .into_iter()
    .map(|v| v as u32)
    .chain([u32::MAX - 4, u32::MAX - 3, u32::MAX])
    .collect();
    let check = |frame: &[u8], what: &str| {
        let mut buf = BytesMut::from(frame);
        match FrameDecoder::new(1 << 20).decode(&mut buf) {
            Ok(Some(f)) => {
                let want = (f.payload.len() >= PAYLOAD_CRC_MIN).then(|| crc32fast::hash(&f.payload));
                assert_eq!(f.payload_crc, want, "{what}: payload of {} bytes", f.payload.len());
            }
            Ok(None) => panic!("{what}: a whole frame did not decode"),
            Err(e) => assert!(!matches!(e, WireError::ChecksumMismatch { .. }), "{what}: {e}"),
        }
    };
    for cmd_len in cmd_lens {
        let mut f = good.clone();
        f[8..12].copy_from_slice(&cmd_len.to_le_bytes());
        let c = crc32fast::hash(&f[8..]);
        f[4..8].copy_from_slice(&c.to_le_bytes());
        check(&f, &format!("cmd_len {cmd_len}"));
    }
    // The smallest frames: frame_len 8 (a 4-byte body: cmd_len alone) up to
    // a few bytes more.
    for extra in 0..4usize {
        for cmd_len in [0u32, 1, 3, 4, 5, u32::MAX] {
            let mut f = Vec::new();
            f.extend_from_slice(&((FRAME_LEN_MIN as usize + extra) as u32).to_le_bytes());
            f.extend_from_slice(&[0; 4]);
            f.extend_from_slice(&cmd_len.to_le_bytes());
            f.extend(std::iter::repeat_n(0xA5u8, extra));
            let c = crc32fast::hash(&f[8..]);
            f[4..8].copy_from_slice(&c.to_le_bytes());
            check(&f, &format!("frame_len {} cmd_len {cmd_len}", FRAME_LEN_MIN as usize + extra));
        }
    }
}
