//! Property tests: random commands and metadata round trip; arbitrary bytes
//! and mutated valid frames/blobs never panic the decoders.
//!
//! Seed: every run prints `proptest seed: N`. Replay a run with
//! `PROPTEST_RNG_SEED=N cargo test -p magnetar-wire --test proptests`.
//! Failures are also persisted by proptest in
//! `tests/proptests.proptest-regressions` (commit that file: its cases are
//! replayed first on every later run).
//! Case count: `PROPTEST_CASES` (default 1024 per property, about a second).

// Test code: unwrap on our own encoder's output is the assertion.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::OnceLock;

use bytes::{Bytes, BytesMut};
use common::*;
use magnetar_wire::*;
use proptest::prelude::*;
use proptest::test_runner::{FileFailurePersistence, RngSeed};

/// The run's seed: `PROPTEST_RNG_SEED` if set, else a random one, shared by
/// all properties of the run so one number replays them all.
fn seed() -> u64 {
    static SEED: OnceLock<u64> = OnceLock::new();
    let seed = *SEED.get_or_init(|| {
        std::env::var("PROPTEST_RNG_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            use std::hash::{BuildHasher, Hasher};
            std::collections::hash_map::RandomState::new().build_hasher().finish()
        })
    });
    // Printed by every test (output is captured per test and shown when it fails).
    eprintln!("proptest seed: {seed} (replay: PROPTEST_RNG_SEED={seed} cargo test -p magnetar-wire --test proptests)");
    seed
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(1024);
    ProptestConfig {
        cases,
        rng_seed: RngSeed::Fixed(seed()),
        // Integration tests have no lib.rs beside them, which proptest's
        // default persistence looks for; name the file outright.
        failure_persistence: Some(Box::new(FileFailurePersistence::Direct(concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/tests/proptests.proptest-regressions"
        )))),
        ..ProptestConfig::default()
    }
}

fn arb_id() -> impl Strategy<Value = MessageId> {
    (any::<u64>(), any::<u64>(), any::<i32>(), any::<i32>()).prop_map(|(l, e, p, b)| MessageId::new(l, e, p, b))
}

fn arb_code() -> impl Strategy<Value = ErrorCode> {
    (0u16..18).prop_map(ErrorCode::from_u16)
}

fn arb_string() -> impl Strategy<Value = String> {
    proptest::string::string_regex("(?s).{0,24}").unwrap()
}

fn arb_command() -> impl Strategy<Value = Command> {
    let sub_type = prop_oneof![
        Just(SubscriptionType::Exclusive),
        Just(SubscriptionType::Failover),
        Just(SubscriptionType::Shared),
        Just(SubscriptionType::KeyShared),
    ];
    let position = prop_oneof![Just(InitialPosition::Latest), Just(InitialPosition::Earliest)];
    let ack_type = prop_oneof![Just(AckType::Individual), Just(AckType::Cumulative)];
    prop_oneof![
        (arb_string(), any::<u32>(), any::<u32>(), arb_string(), proptest::collection::vec(any::<u8>(), 0..64))
            .prop_map(|(client_version, protocol_version, max_frame_bytes, auth_method, auth_data)| {
                Command::Connect {
                    client_version,
                    protocol_version,
                    max_frame_bytes,
                    auth_method,
                    auth_data: AuthData(auth_data),
                }
            }),
        (any::<u64>(), arb_id(), any::<u32>(), proptest::collection::vec(0u32..64, 1..8)).prop_map(
            |(consumer_id, mut message_id, redelivery_count, lengths)| {
                // The last entry number must fit (the decoder checks it).
                message_id.entry = message_id.entry.min(u64::MAX - 8);
                Command::MessageRun { consumer_id, message_id, redelivery_count, lengths }
            }
        ),
        (arb_string(), any::<u32>(), any::<u32>(), any::<u32>(), proptest::collection::vec(any::<u16>(), 0..8))
            .prop_map(|(server_version, protocol_version, max_frame_bytes, shard, shard_ports)| {
                Command::Connected { server_version, protocol_version, max_frame_bytes, shard, shard_ports }
            }),
        (any::<u64>(), any::<u64>(), arb_string(), arb_string(), 0u8..4).prop_map(
            |(request_id, producer_id, topic, producer_name, mode)| Command::Producer {
                request_id,
                producer_id,
                topic,
                producer_name,
                access_mode: [
                    ProducerAccessMode::Shared,
                    ProducerAccessMode::Exclusive,
                    ProducerAccessMode::WaitForExclusive,
                    ProducerAccessMode::ExclusiveWithFencing
                ][usize::from(mode)]
            }
        ),
        (any::<u64>(), arb_string(), arb_string()).prop_map(|(request_id, op, json)| Command::AdminRequest {
            request_id,
            op,
            json
        }),
        (any::<u64>(), arb_string()).prop_map(|(request_id, json)| Command::AdminResponse { request_id, json }),
        (any::<u64>(), arb_string(), any::<i64>()).prop_map(|(request_id, producer_name, last_sequence_id)| {
            Command::ProducerSuccess { request_id, producer_name, last_sequence_id }
        }),
        (any::<u64>(), any::<u64>(), any::<u32>()).prop_map(|(producer_id, sequence_id, num_messages)| {
            Command::Send { producer_id, sequence_id, num_messages }
        }),
        (any::<u64>(), any::<u64>(), arb_id()).prop_map(|(producer_id, sequence_id, message_id)| {
            Command::SendReceipt { producer_id, sequence_id, message_id }
        }),
        (any::<u64>(), any::<u64>(), arb_code(), arb_string()).prop_map(|(producer_id, sequence_id, code, message)| {
            Command::SendError { producer_id, sequence_id, code, message }
        }),
        (
            (any::<u64>(), any::<u64>(), arb_string(), arb_string()),
            (sub_type, arb_string(), position, any::<bool>(), any::<i32>(), arb_string()),
            proptest::collection::vec((any::<u32>(), any::<u32>()), 0..4),
            (0..4usize, any::<bool>(), arb_string(), proptest::collection::vec(arb_string(), 0..4)),
        )
            .prop_map(
                |(
                    (request_id, consumer_id, topic, subscription),
                    (sub_type, consumer_name, initial_position, durable, priority_level, filter_tag),
                    key_shared_ranges,
                    (allocation, broadcast, zone, partition_zones),
                )| Command::Subscribe {
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
                    model: ConsumptionModel {
                        mode: if broadcast { SubscriptionMode::Broadcast } else { SubscriptionMode::Clustering },
                        allocation: [
                            AllocationStrategy::RoundRobin,
                            AllocationStrategy::Average,
                            AllocationStrategy::ConsistentHash,
                            AllocationStrategy::Zone,
                        ][allocation],
                        zone,
                        partition_zones,
                    },
                }
            ),
        any::<u64>().prop_map(|request_id| Command::Success { request_id }),
        (any::<u64>(), any::<u64>(), any::<bool>()).prop_map(|(request_id, consumer_id, force)| Command::Unsubscribe {
            request_id,
            consumer_id,
            force
        }),
        (any::<u64>(), any::<u32>()).prop_map(|(consumer_id, permits)| Command::Flow { consumer_id, permits }),
        (any::<u64>(), arb_id(), any::<u32>(), proptest::collection::vec(any::<u64>(), 0..3)).prop_map(
            |(consumer_id, message_id, redelivery_count, ack_set)| {
                Command::Message { consumer_id, message_id, redelivery_count, ack_set }
            }
        ),
        (
            any::<u64>(),
            ack_type,
            proptest::collection::vec((arb_id(), any::<u32>()), 0..8),
            any::<u64>(),
            any::<bool>()
        )
            .prop_map(|(consumer_id, ack_type, acks, request_id, sized)| Command::Ack {
                consumer_id,
                ack_type,
                message_ids: acks.iter().map(|a| a.0).collect(),
                request_id,
                batch_sizes: if sized { acks.iter().map(|a| a.1).collect() } else { vec![] },
            }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(request_id, producer_id)| Command::CloseProducer { request_id, producer_id }),
        (any::<u64>(), any::<u64>())
            .prop_map(|(request_id, consumer_id)| Command::CloseConsumer { request_id, consumer_id }),
        Just(Command::Ping),
        Just(Command::Pong),
        (any::<u64>(), arb_code(), arb_string()).prop_map(|(request_id, code, message)| Command::Error {
            request_id,
            code,
            message
        }),
        (any::<u64>(), proptest::collection::vec(arb_id(), 0..4))
            .prop_map(|(consumer_id, message_ids)| Command::RedeliverUnacknowledged { consumer_id, message_ids }),
        (any::<u64>(), any::<bool>())
            .prop_map(|(consumer_id, is_active)| Command::ActiveConsumerChange { consumer_id, is_active }),
        (any::<u64>(), any::<u64>(), proptest::option::of(arb_id()), any::<u64>()).prop_map(
            |(request_id, consumer_id, message_id, publish_time_ms)| Command::Seek {
                request_id,
                consumer_id,
                message_id,
                publish_time_ms
            }
        ),
        (any::<u64>(), arb_string(), arb_string()).prop_map(|(request_id, topic, json)| Command::TopicStats {
            request_id,
            topic,
            json
        }),
    ]
}

fn arb_metadata() -> impl Strategy<Value = MessageMetadata> {
    let compression = prop_oneof![
        Just(CompressionType::None),
        Just(CompressionType::Lz4),
        Just(CompressionType::Zlib),
        Just(CompressionType::Zstd),
        Just(CompressionType::Snappy),
    ];
    let chunk = proptest::option::of((arb_string(), any::<u32>(), any::<u32>(), any::<u32>()).prop_map(
        |(uuid, chunk_id, num_chunks, total_chunk_msg_size)| ChunkInfo {
            uuid,
            chunk_id,
            num_chunks,
            total_chunk_msg_size,
        },
    ));
    (
        (arb_string(), any::<u64>(), any::<u64>(), any::<u64>(), proptest::option::of(arb_string())),
        (
            proptest::option::of(proptest::collection::vec(any::<u8>(), 0..16)),
            proptest::collection::vec((arb_string(), arb_string()), 0..4),
            any::<u32>(),
            any::<u64>(),
            compression,
        ),
        (any::<u32>(), chunk, proptest::option::of(arb_string())),
    )
        .prop_map(
            |(
                (producer_name, sequence_id, publish_time_ms, event_time_ms, partition_key),
                (ordering_key, properties, num_messages, deliver_at_ms, compression),
                (uncompressed_size, chunk, tag),
            )| MessageMetadata {
                producer_name,
                sequence_id,
                publish_time_ms,
                event_time_ms,
                partition_key,
                ordering_key: ordering_key.map(Bytes::from),
                properties,
                num_messages,
                deliver_at_ms,
                compression,
                uncompressed_size,
                chunk,
                tag,
            },
        )
}

/// Drain `buf` through a decoder the way a connection would: stop at "need
/// more" or at a fatal error, skip past non-fatal ones. Bounded: every
/// non-fatal outcome consumes at least one byte.
fn drain(decoder: &mut FrameDecoder, buf: &mut BytesMut) {
    loop {
        let before = buf.len();
        match decoder.decode(buf) {
            Ok(None) => return,
            Err(e) if e.is_fatal() => return,
            Ok(Some(_)) | Err(_) => assert!(buf.len() < before, "decode made no progress"),
        }
    }
}

proptest! {
    #![proptest_config(config())]

    /// Goal: encode → decode is the identity for any command and blob payload.
    #[test]
    fn command_round_trips(command in arb_command(), meta in arb_metadata(), body in proptest::collection::vec(any::<u8>(), 0..64)) {
        let payload = payload_fitting(&command, encode_message(&meta, &body));
        let mut buf = encode(&command, &payload);
        let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
        prop_assert_eq!(frame.command, command);
        prop_assert_eq!(frame.payload, payload);
        prop_assert!(buf.is_empty());
    }

    /// Goal: the templated Message frame decodes to the command and payload
    /// it was given, whatever the values (defaults included).
    #[test]
    fn templated_message_frames_round_trip(
        consumer_id in prop_oneof![Just(0u64), any::<u64>()],
        id in arb_id(),
        redelivery_count in prop_oneof![Just(0u32), any::<u32>()],
        meta in arb_metadata(),
        body in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let payload = encode_message(&meta, &body);
        let mut buf = BytesMut::new();
        encode_message_frame(consumer_id, &id, redelivery_count, &payload, &mut buf).unwrap();
        // Twice in a row: the template is reused.
        encode_message_frame(consumer_id, &id, redelivery_count, &payload, &mut buf).unwrap();
        let want = Command::Message { consumer_id, message_id: id, redelivery_count, ack_set: Vec::new() };
        for _ in 0..2 {
            let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
            prop_assert_eq!(&frame.command, &want);
            prop_assert_eq!(&frame.payload, &payload);
        }
        prop_assert!(buf.is_empty());
    }

    #[test]
    fn metadata_round_trips(meta in arb_metadata(), body in proptest::collection::vec(any::<u8>(), 0..64)) {
        let blob = encode_message(&meta, &body);
        let (got, payload) = decode_message(&blob).unwrap();
        prop_assert_eq!(got, meta);
        prop_assert_eq!(&payload[..], &body[..]);
    }

    /// Goal: arbitrary bytes never panic the frame decoder (small and default limits).
    #[test]
    fn arbitrary_bytes_never_panic_decoder(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        for max in [FRAME_LEN_MIN, 64, FRAME_BYTES_MAX_DEFAULT, u32::MAX] {
            drain(&mut FrameDecoder::new(max), &mut BytesMut::from(&bytes[..]));
        }
        // With a plausible header in front, so the bytes reach the verifier.
        let mut framed = raw_frame(&bytes, &[]);
        drain(&mut FrameDecoder::default(), &mut framed);
    }

    /// Goal: mutated valid frames (checksum fixed up, so the mutation reaches
    /// the flatbuffer verifier and converter) never panic, and a result that
    /// decodes is a well-formed command.
    #[test]
    fn mutated_frames_never_panic(
        command in arb_command(),
        mutations in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        truncate in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let payload = payload_fitting(&command, encode_message(&MessageMetadata::default(), b"x"));
        let mut buf = encode(&command, &payload);
        for (index, xor) in &mutations {
            // Leave frame_len alone (covered by the arbitrary-bytes property)
            // so the frame stays whole and its command gets decoded.
            let i = 8 + index.index(buf.len() - 8);
            buf[i] ^= xor;
        }
        fix_checksum(&mut buf);
        if let Some(t) = truncate {
            let len = t.index(buf.len() + 1);
            buf.truncate(len);
        }
        drain(&mut FrameDecoder::default(), &mut buf);
    }

    /// Goal: a run frame built from blobs decodes to the same entries, in
    /// order, with consecutive ids, each blob a slice of the received frame
    /// (no copy); and it is byte for byte what `encode_frame` writes for the
    /// same `MessageRun` command.
    #[test]
    fn run_frames_round_trip(
        consumer_id in any::<u64>(),
        first in arb_id(),
        redelivery_count in any::<u32>(),
        blobs in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 1..40),
    ) {
        let mut first = first;
        first.entry = first.entry.min(u64::MAX - 40);
        let blobs: Vec<Bytes> = blobs.into_iter().map(Bytes::from).collect();
        let mut buf = BytesMut::new();
        encode_message_run_frame(consumer_id, &first, redelivery_count, &blobs, &mut buf).unwrap();
        let lengths: Vec<u32> = blobs.iter().map(|b| u32::try_from(b.len()).unwrap()).collect();
        let command = Command::MessageRun { consumer_id, message_id: first, redelivery_count, lengths: lengths.clone() };
        let whole = encode(&command, &blobs.concat());
        prop_assert_eq!(&buf[..], &whole[..]);

        let frame = FrameDecoder::default().decode(&mut buf).unwrap().unwrap();
        prop_assert!(buf.is_empty());
        prop_assert_eq!(&frame.command, &command);
        let Command::MessageRun { message_id, lengths, .. } = &frame.command else { unreachable!() };
        let got: Vec<(MessageId, Bytes)> = run_entries(*message_id, lengths, &frame.payload).unwrap().collect();
        prop_assert_eq!(got.len(), blobs.len());
        let range = frame.payload.as_ptr() as usize..frame.payload.as_ptr() as usize + frame.payload.len() + 1;
        for (i, ((id, blob), want)) in got.iter().zip(&blobs).enumerate() {
            prop_assert_eq!(*id, MessageId { entry: first.entry + i as u64, ..first });
            prop_assert_eq!(blob, want);
            prop_assert!(range.contains(&(blob.as_ptr() as usize)), "entry {} is not a slice of the frame", i);
        }
    }

    /// Goal: a `MessageRun` whose lengths do not add up to its payload (or
    /// that holds none) is a typed, non-fatal error from the decoder and
    /// from `run_entries`, never a panic; the stream stays in step.
    #[test]
    fn run_lengths_that_do_not_add_up_are_typed_errors(
        lengths in proptest::collection::vec(prop_oneof![0u32..16, any::<u32>()], 0..6),
        payload in proptest::collection::vec(any::<u8>(), 0..64),
        entry in any::<u64>(),
    ) {
        let first = MessageId::new(1, entry, -1, -1);
        let command = Command::MessageRun { consumer_id: 1, message_id: first, redelivery_count: 0, lengths: lengths.clone() };
        let sum: u64 = lengths.iter().map(|&l| u64::from(l)).sum();
        let fits = !lengths.is_empty()
            && sum == payload.len() as u64
            && entry.checked_add(lengths.len() as u64 - 1).is_some();
        // The encoder refuses what the decoder would.
        let mut scratch = BytesMut::new();
        prop_assert_eq!(encode_frame(&command, &payload, &mut scratch).is_ok(), fits);
        let payload = Bytes::from(payload);
        match run_entries(first, &lengths, &payload) {
            Ok(entries) => {
                prop_assert!(fits);
                prop_assert_eq!(entries.map(|(_, b)| b.len() as u64).sum::<u64>(), sum);
            }
            Err(e) => {
                prop_assert!(!fits);
                prop_assert!(matches!(e, WireError::BadRun { .. }), "{:?}", e);
            }
        }
        // The same command and payload built by hand, then a Ping behind it.
        let mut cmd = BytesMut::new();
        let mut builder = flatbuffers::FlatBufferBuilder::new();
        let lengths_v = builder.create_vector(&lengths);
        let id = generated::magnetar::wire::MessageIdData::new(1, entry, -1, -1);
        let run = generated::magnetar::wire::MessageRun::create(&mut builder, &generated::magnetar::wire::MessageRunArgs {
            consumer_id: 1,
            message_id: Some(&id),
            redelivery_count: 0,
            lengths: Some(lengths_v),
        });
        let root = generated::magnetar::wire::BaseCommand::create(&mut builder, &generated::magnetar::wire::BaseCommandArgs {
            command_type: generated::magnetar::wire::AnyCommand::MessageRun,
            command: Some(run.as_union_value()),
        });
        builder.finish_minimal(root);
        cmd.extend_from_slice(builder.finished_data());
        let mut buf = raw_frame(&cmd, &payload);
        encode_frame(&Command::Ping, &[], &mut buf).unwrap();
        let mut decoder = FrameDecoder::default();
        match decoder.decode(&mut buf) {
            Ok(Some(frame)) => {
                prop_assert!(fits);
                prop_assert_eq!(frame.payload, payload);
            }
            Err(e) => {
                prop_assert!(!fits);
                prop_assert!(!e.is_fatal());
                prop_assert!(matches!(e, WireError::BadRun { .. }), "{:?}", e);
            }
            Ok(None) => prop_assert!(false, "a whole frame was there"),
        }
        prop_assert_eq!(decoder.decode(&mut buf).unwrap().map(|f| f.command), Some(Command::Ping));
    }

    /// Goal: arbitrary bytes never panic the blob decoders.
    #[test]
    fn arbitrary_blobs_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let blob = Bytes::from(bytes);
        let _ = decode_message(&blob);
        let _ = peek_message(&blob);
        // With a metadata_len that fits, so the bytes reach the verifier.
        let mut fitted = BytesMut::new();
        fitted.extend_from_slice(&u32::try_from(blob.len()).unwrap().to_le_bytes());
        fitted.extend_from_slice(&blob);
        let fitted = fitted.freeze();
        let _ = decode_message(&fitted);
        let _ = peek_message(&fitted);
        let _ = peek_for_delivery(&blob);
        let _ = peek_for_delivery(&fitted);
    }

    /// Goal: on any valid blob the dispatcher's bounds-checked reader
    /// (`peek_for_delivery`) reads what the verifying peek reads.
    #[test]
    fn delivery_peek_matches_verified_peek(meta in arb_metadata(), body in proptest::collection::vec(any::<u8>(), 0..64)) {
        let blob = encode_message(&meta, &body);
        let full = peek_message(&blob).unwrap();
        let fast = peek_for_delivery(&blob).unwrap();
        prop_assert_eq!(fast.partition_key, full.partition_key.map(str::as_bytes));
        prop_assert_eq!(fast.ordering_key, full.ordering_key);
        prop_assert_eq!(fast.tag, full.tag.map(str::as_bytes));
        prop_assert_eq!(fast.num_messages, full.num_messages);
        prop_assert_eq!(fast.deliver_at_ms, full.deliver_at_ms);
    }

    /// Goal: mutated and truncated valid blobs never panic the delivery
    /// peek (it follows offsets without the verifier).
    #[test]
    fn mutated_blobs_never_panic_delivery_peek(
        meta in arb_metadata(),
        mutations in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
        truncate in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let mut blob = BytesMut::from(&encode_message(&meta, b"payload")[..]);
        for (index, xor) in &mutations {
            let i = index.index(blob.len());
            blob[i] ^= xor;
        }
        if let Some(t) = truncate {
            let len = t.index(blob.len() + 1);
            blob.truncate(len);
        }
        let _ = peek_for_delivery(&blob);
    }

    /// Goal: mutated valid blobs never panic, and decode and peek agree.
    #[test]
    fn mutated_blobs_never_panic(
        meta in arb_metadata(),
        mutations in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..8),
    ) {
        let mut blob = BytesMut::from(&encode_message(&meta, b"payload")[..]);
        for (index, xor) in &mutations {
            let i = index.index(blob.len());
            blob[i] ^= xor;
        }
        let blob = blob.freeze();
        let decoded = decode_message(&blob);
        let peeked = peek_message(&blob);
        if let (Ok((meta, payload)), Ok(peek)) = (&decoded, &peeked) {
            prop_assert_eq!(peek.sequence_id, meta.sequence_id);
            prop_assert_eq!(peek.payload, &payload[..]);
        }
        // Peek accepts exactly what decode accepts: a blob the broker takes
        // is one every consumer can decode.
        prop_assert_eq!(decoded.is_ok(), peeked.is_ok());
        if let (Err(d), Err(p)) = (&decoded, &peeked) {
            prop_assert_eq!(d, p);
        }
    }
}

/// `view_message`'s answer in `decode_message`'s terms.
fn viewed(blob: &Bytes) -> Result<(MessageMetadata, Bytes), WireError> {
    let view = view_message(blob)?;
    Ok((view.to_metadata(blob), blob.slice(view.payload_offset..)))
}

proptest! {
    #![proptest_config(config())]

    /// Goal: the allocation-free view reads exactly what `decode_message`
    /// decodes from any valid blob.
    #[test]
    fn view_matches_decode(meta in arb_metadata(), body in proptest::collection::vec(any::<u8>(), 0..64)) {
        let blob = encode_message(&meta, &body);
        let view = view_message(&blob).unwrap();
        prop_assert_eq!(view.properties.len(), meta.properties.len());
        let props: Vec<(String, String)> = view.properties.iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
        prop_assert_eq!(&props, &meta.properties);
        prop_assert_eq!(view.ordering_key, meta.ordering_key.as_deref());
        prop_assert_eq!(viewed(&blob), Ok((meta, Bytes::from(body))));
    }

    /// Goal: on mutated and truncated blobs, the view (the verifier's checks
    /// written out by hand) accepts exactly what `decode_message` (the
    /// flatbuffers verifier) accepts, with the same values or the same error.
    /// Small additions hit the alignment, bound and terminator edges that
    /// random XORs rarely do.
    #[test]
    fn view_agrees_with_decode_on_mutated_blobs(
        meta in arb_metadata(),
        mutations in proptest::collection::vec((any::<prop::sample::Index>(), any::<u8>(), any::<bool>()), 1..6),
        truncate in proptest::option::of(any::<prop::sample::Index>()),
    ) {
        let mut blob = BytesMut::from(&encode_message(&meta, b"payload")[..]);
        for (index, value, small) in &mutations {
            let i = index.index(blob.len());
            blob[i] = if *small { blob[i].wrapping_add(value % 9).wrapping_sub(4) } else { blob[i] ^ value };
        }
        if let Some(t) = truncate {
            let len = t.index(blob.len() + 1);
            blob.truncate(len);
        }
        let blob = blob.freeze();
        prop_assert_eq!(viewed(&blob), decode_message(&blob));
    }

    /// Goal: arbitrary bytes behind a fitting metadata_len: view and decode agree.
    #[test]
    fn view_agrees_with_decode_on_arbitrary_blobs(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut fitted = BytesMut::new();
        fitted.extend_from_slice(&u32::try_from(bytes.len()).unwrap().to_le_bytes());
        fitted.extend_from_slice(&bytes);
        let fitted = fitted.freeze();
        prop_assert_eq!(viewed(&fitted), decode_message(&fitted));
    }
}
