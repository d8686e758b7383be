//! Helpers shared by the wire tests.
#![allow(dead_code)]

use bytes::{BufMut, BytesMut};
use magnetar_wire::*;

/// One of every command, with edge values (zeros, maxima, empty and
/// non-ASCII strings, negative partitions).
pub fn all_commands() -> Vec<Command> {
    let id_max = MessageId::new(u64::MAX, u64::MAX, i32::MAX, i32::MAX);
    let id_min = MessageId::new(0, 0, -1, -1);
    let id_neg = MessageId::new(1, 2, i32::MIN, i32::MIN);
    vec![
        Command::Connect {
            client_version: "magnetar-client 0.1".into(),
            protocol_version: 1,
            max_frame_bytes: 0,
            auth_method: String::new(),
            auth_data: AuthData::default(),
        },
        Command::Connect {
            client_version: String::new(),
            protocol_version: u32::MAX,
            max_frame_bytes: u32::MAX,
            auth_method: "token".into(),
            auth_data: AuthData(b"eyJhbGciOiJIUzI1NiJ9.e30.sig".to_vec()),
        },
        Command::MessageRun {
            consumer_id: 3,
            message_id: MessageId::new(1, 2, -1, -1),
            redelivery_count: 0,
            lengths: vec![0, 5, 1],
        },
        Command::Connected {
            server_version: "magnétar ✨".into(),
            protocol_version: 1,
            max_frame_bytes: FRAME_BYTES_MAX_DEFAULT,
            shard: u32::MAX,
            shard_ports: Vec::new(),
        },
        Command::Connected {
            server_version: String::new(),
            protocol_version: 1,
            max_frame_bytes: 1,
            shard: 1,
            shard_ports: vec![6651, 0, u16::MAX],
        },
        Command::Producer {
            request_id: u64::MAX,
            producer_id: 0,
            topic: "persistent://public/default/orders".into(),
            producer_name: String::new(),
            access_mode: ProducerAccessMode::Shared,
        },
        Command::Producer {
            request_id: 1,
            producer_id: 2,
            topic: "t".into(),
            producer_name: "p".into(),
            access_mode: ProducerAccessMode::ExclusiveWithFencing,
        },
        Command::AdminRequest { request_id: 9, op: "tenants.create".into(), json: "{\"tenant\":\"a\"}".into() },
        Command::AdminResponse { request_id: 9, json: "null".into() },
        Command::ProducerSuccess { request_id: 1, producer_name: "p-1".into(), last_sequence_id: -1 },
        Command::ProducerSuccess { request_id: 0, producer_name: "\u{0}nul inside".into(), last_sequence_id: i64::MIN },
        Command::ProducerSuccess { request_id: 0, producer_name: "x".into(), last_sequence_id: 0 },
        Command::Send { producer_id: u64::MAX, sequence_id: u64::MAX, num_messages: u32::MAX },
        Command::Send { producer_id: 0, sequence_id: 0, num_messages: 0 },
        Command::SendReceipt { producer_id: 7, sequence_id: 8, message_id: id_max },
        Command::SendReceipt { producer_id: 0, sequence_id: 0, message_id: id_min },
        Command::SendError {
            producer_id: 1,
            sequence_id: 2,
            code: ErrorCode::PersistenceError,
            message: "fdatasync failed: EIO".into(),
        },
        Command::SendError { producer_id: 0, sequence_id: 0, code: ErrorCode::UnknownError, message: String::new() },
        Command::Subscribe {
            request_id: 3,
            consumer_id: 4,
            topic: "persistent://public/default/t".into(),
            subscription: "s1".into(),
            sub_type: SubscriptionType::KeyShared,
            consumer_name: "c".into(),
            initial_position: InitialPosition::Earliest,
            durable: true,
            priority_level: i32::MIN,
            filter_tag: "TagA".into(),
            key_shared_ranges: vec![(0, 100), (200, 65535)],
            model: ConsumptionModel {
                mode: SubscriptionMode::Broadcast,
                allocation: AllocationStrategy::Zone,
                zone: "eu-1".into(),
                partition_zones: vec!["eu-1".into(), String::new(), "us-2".into()],
            },
        },
        Command::Subscribe {
            request_id: 0,
            consumer_id: 0,
            topic: String::new(),
            subscription: String::new(),
            sub_type: SubscriptionType::Exclusive,
            consumer_name: String::new(),
            initial_position: InitialPosition::Latest,
            durable: false,
            priority_level: 0,
            filter_tag: String::new(),
            key_shared_ranges: Vec::new(),
            model: ConsumptionModel::default(),
        },
        Command::Success { request_id: u64::MAX },
        Command::Flow { consumer_id: 9, permits: u32::MAX },
        Command::Flow { consumer_id: 0, permits: 0 },
        Command::Unsubscribe { request_id: 7, consumer_id: u64::MAX, force: true },
        Command::Message { consumer_id: 5, message_id: id_neg, redelivery_count: u32::MAX, ack_set: vec![] },
        Command::Message { consumer_id: 5, message_id: id_max, redelivery_count: 1, ack_set: vec![0b101, u64::MAX] },
        Command::Ack {
            consumer_id: 6,
            ack_type: AckType::Individual,
            message_ids: vec![id_min, id_max, id_neg],
            request_id: 0,
            batch_sizes: vec![],
        },
        Command::Ack {
            consumer_id: 6,
            ack_type: AckType::Individual,
            message_ids: vec![id_min, id_max],
            request_id: 0,
            batch_sizes: vec![0, u32::MAX],
        },
        Command::Ack {
            consumer_id: 6,
            ack_type: AckType::Cumulative,
            message_ids: vec![id_max],
            request_id: u64::MAX,
            batch_sizes: vec![],
        },
        Command::Ack {
            consumer_id: 0,
            ack_type: AckType::Individual,
            message_ids: vec![],
            request_id: 1,
            batch_sizes: vec![],
        },
        Command::CloseProducer { request_id: 1, producer_id: u64::MAX },
        Command::CloseConsumer { request_id: u64::MAX, consumer_id: 2 },
        Command::ConsumerClosed {
            consumer_id: 3,
            code: ErrorCode::DamagedEntry,
            message: "entry 7:2 is damaged".into(),
            entry: Some(id_neg),
        },
        Command::ConsumerClosed { consumer_id: 0, code: ErrorCode::UnknownError, message: String::new(), entry: None },
        Command::Ping,
        Command::Pong,
        Command::Error { request_id: 0, code: ErrorCode::StorageFull, message: "disk above watermark".into() },
        Command::RedeliverUnacknowledged { consumer_id: 7, message_ids: vec![id_neg, id_neg] },
        Command::RedeliverUnacknowledged { consumer_id: 0, message_ids: vec![] },
        Command::ActiveConsumerChange { consumer_id: 8, is_active: true },
        Command::ActiveConsumerChange { consumer_id: 0, is_active: false },
        Command::Seek { request_id: 1, consumer_id: 2, message_id: Some(id_neg), publish_time_ms: 0 },
        Command::Seek { request_id: 0, consumer_id: 0, message_id: None, publish_time_ms: u64::MAX },
        Command::TopicStats { request_id: 3, topic: "persistent://public/default/t".into(), json: String::new() },
        Command::TopicStats { request_id: 3, topic: String::new(), json: "{\"subscriptions\":{}}".into() },
    ]
}

/// Every subscription/error variant name covered by `all_commands`, so a new
/// variant without a round-trip case fails loudly.
pub fn command_names() -> Vec<&'static str> {
    vec![
        "Connect",
        "Connected",
        "Producer",
        "ProducerSuccess",
        "Send",
        "SendReceipt",
        "SendError",
        "Subscribe",
        "Success",
        "Flow",
        "Message",
        "Ack",
        "CloseProducer",
        "CloseConsumer",
        "Ping",
        "Pong",
        "Error",
        "RedeliverUnacknowledged",
        "ActiveConsumerChange",
        "Seek",
        "TopicStats",
        "AdminRequest",
        "AdminResponse",
        "MessageRun",
        "ConsumerClosed",
        "Unsubscribe",
    ]
}

/// A payload that fits `command`: for a `MessageRun`, `lengths` bytes per
/// entry (entry i filled with byte i); for `Send`/`Message`, `blob`;
/// nothing otherwise.
pub fn payload_fitting(command: &Command, blob: bytes::Bytes) -> bytes::Bytes {
    match command {
        Command::MessageRun { lengths, .. } => {
            let mut p = Vec::new();
            for (i, &len) in lengths.iter().enumerate() {
                p.extend(std::iter::repeat_n(i as u8, len as usize));
            }
            bytes::Bytes::from(p)
        }
        c if c.carries_payload() => blob,
        _ => bytes::Bytes::new(),
    }
}

pub fn full_metadata() -> MessageMetadata {
    MessageMetadata {
        producer_name: "producer-ü".into(),
        sequence_id: u64::MAX,
        publish_time_ms: 1_700_000_000_000,
        event_time_ms: u64::MAX,
        partition_key: Some("key-1".into()),
        ordering_key: Some(bytes::Bytes::from_static(&[0, 1, 2, 255])),
        properties: vec![
            ("a".into(), "1".into()),
            ("a".into(), "duplicate keys keep their order".into()),
            (String::new(), String::new()),
        ],
        num_messages: u32::MAX,
        deliver_at_ms: 42,
        compression: CompressionType::Zstd,
        uncompressed_size: u32::MAX,
        chunk: Some(ChunkInfo { uuid: "uuid-1".into(), chunk_id: 3, num_chunks: 4, total_chunk_msg_size: u32::MAX }),
        tag: Some("TagA".into()),
    }
}

/// A frame around raw command bytes, with a correct checksum: lets tests
/// reach the flatbuffer decoder with bytes our encoder would never write.
pub fn raw_frame(cmd: &[u8], payload: &[u8]) -> BytesMut {
    let cmd_len = u32::try_from(cmd.len()).unwrap();
    let frame_len = 8 + cmd_len + u32::try_from(payload.len()).unwrap();
    let mut body = BytesMut::new();
    body.put_u32_le(cmd_len);
    body.extend_from_slice(cmd);
    body.extend_from_slice(payload);
    let mut out = BytesMut::new();
    out.put_u32_le(frame_len);
    out.put_u32_le(crc32fast::hash(&body));
    out.extend_from_slice(&body);
    out
}

/// Recompute the checksum of the frame at the start of `frame` after a test
/// mutated its body.
pub fn fix_checksum(frame: &mut [u8]) {
    if frame.len() < 8 {
        return;
    }
    let crc = crc32fast::hash(&frame[8..]);
    frame[4..8].copy_from_slice(&crc.to_le_bytes());
}

pub fn encode(command: &Command, payload: &[u8]) -> BytesMut {
    let mut dst = BytesMut::new();
    encode_frame(command, payload, &mut dst).unwrap();
    dst
}
