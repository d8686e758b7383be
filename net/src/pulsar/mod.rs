//! The Pulsar door: Apache Pulsar's binary protocol (`magnetar-pulsar-wire`)
//! mapped onto the session, so unmodified Pulsar clients work.
//!
//! A message received in a SEND is stored as its frame carried it (see
//! `magnetar_pulsar_wire::metadata::stored_blob`), so a Pulsar consumer gets
//! the very bytes (metadata, payload, CRC-32C) the producer sent. Messages
//! stored by the native door are converted when delivered (`convert`).
//!
//! The broker sends a client only command types of the protocol version
//! its CONNECT announced (the C++ client closes the connection on an unknown
//! type). Everything the door does not serve is answered with an ERROR (or
//! the command's own response type carrying an error), never ignored.

pub(crate) mod convert;
mod refresh;

pub(crate) use convert::pulsar_to_native;

use crate::session::{ConnectionLimits, Door, Handshake, Request, Session};
use bytes::BytesMut;
use magnetar_core::api::{AdminReply, AdminRequest, LastMessageId};
use magnetar_core::{CoreError, ProducerHandle, SeekTarget, SubscribeRequest, TopicName};
use magnetar_pulsar_wire::proto::{self as pb, base_command::Type};
use magnetar_pulsar_wire::{encode_command, encode_stored_payload_command, Frame, FrameDecoder, FrameError};
use magnetar_wire::{AckType, ErrorCode, InitialPosition, MessageId, ProducerAccessMode, SubscriptionType};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::time::Duration;

/// The protocol version this door speaks (Apache Pulsar's `v21`).
pub const PROTOCOL_VERSION: i32 = 21;
/// Protocol version from which a client understands ACTIVE_CONSUMER_CHANGE.
const V_ACTIVE_CONSUMER_CHANGE: i32 = 12;
/// Protocol version from which a client understands ACK_RESPONSE.
const V_ACK_RESPONSE: i32 = 17;
/// Protocol version from which a client answers PING.
const V_PING: i32 = 1;
/// Pending ack requests remembered per connection (to answer them as
/// ACK_RESPONSE); past this, further acks with a request id are answered
/// with SUCCESS, which Pulsar clients also accept for a pending request.
const PENDING_ACKS_MAX: usize = 10_000;

/// Settings of the Pulsar door, shared by its connections.
#[derive(Debug, Clone)]
pub struct PulsarConfig {
    /// Largest message accepted, announced in CONNECTED (`max_message_size`).
    pub max_message_bytes: u32,
    /// The host named in LOOKUP answers (`pulsar://HOST:PORT`, PORT the
    /// one the client reached); `None`: the address the client reached.
    pub advertised_address: Option<String>,
    /// The port serves TLS: LOOKUP answers name it `pulsar+ssl://` too (a
    /// TLS client connects to `broker_service_url_tls`). Set by
    /// [`crate::serve`] from the TLS settings.
    pub tls: bool,
    /// A client silent this long is pinged, and its connection closed when
    /// it stays silent as long again (Pulsar's `keepAliveIntervalSeconds`).
    pub keep_alive: Duration,
}

impl Default for PulsarConfig {
    fn default() -> Self {
        Self {
            max_message_bytes: 5 * 1024 * 1024,
            advertised_address: None,
            tls: false,
            keep_alive: Duration::from_secs(30),
        }
    }
}

/// Bytes a stored Pulsar message has beyond its payload at most: the
/// stored marker and checksummed header (14) and the metadata, which Pulsar
/// bounds by its frame padding.
const STORED_OVERHEAD_BYTES_MAX: u32 = 14 + magnetar_pulsar_wire::FRAME_PADDING_BYTES;

/// The `max_message_size` announced to clients: the configured size, but
/// small enough that a message of that payload (a client's chunk, too) with
/// its metadata fits the broker's limit on a stored message.
fn announced_max_message_bytes(configured: u32, stored_max: u32) -> u32 {
    configured.min(stored_max.saturating_sub(STORED_OVERHEAD_BYTES_MAX)).max(1)
}

/// One connection's Pulsar protocol state.
pub(crate) struct PulsarDoor {
    config: Rc<PulsarConfig>,
    /// The protocol version of the client's CONNECT.
    client_version: Cell<i32>,
    /// Ack request ids awaiting an answer, with their consumer.
    pending_acks: RefCell<HashMap<u64, u64>>,
    /// Messages in each batch entry delivered on this connection, by
    /// `(ledger, entry)`: a batch-index ACK carries the batch's ack set but
    /// not its size (the C++ client), which the broker needs. Dropped when
    /// the entry is acknowledged whole; at most `BATCH_SIZES_MAX`.
    batch_sizes: RefCell<HashMap<(u64, u64), u32>>,
    /// The token the connection authenticated with, for AUTH_CHALLENGE.
    tokens: refresh::TokenState,
}

/// Batch entries whose size a connection remembers (see
/// `PulsarDoor::batch_sizes`); past this a batch-index ack of an entry
/// not remembered is not applied (the messages come again: at least once).
const BATCH_SIZES_MAX: usize = 100_000;

impl PulsarDoor {
    pub(crate) fn new(config: Rc<PulsarConfig>) -> Self {
        Self {
            config,
            client_version: Cell::new(0),
            pending_acks: RefCell::new(HashMap::new()),
            batch_sizes: RefCell::new(HashMap::new()),
            tokens: refresh::TokenState::default(),
        }
    }
}

/// Requests only this door has.
pub(crate) enum PulsarOther {
    /// The answer to an AUTH_CHALLENGE.
    AuthResponse {
        method: String,
        data: Vec<u8>,
    },
    Lookup {
        request_id: u64,
        topic: String,
    },
    PartitionedMetadata {
        request_id: u64,
        topic: String,
    },
    LastMessageId {
        request_id: u64,
        consumer_id: u64,
    },
    TopicsOfNamespace {
        request_id: u64,
        namespace: String,
        mode: i32,
    },
    /// Pulsar's seek also disconnects the subscription's consumers, which
    /// then reconnect and ask for messages again.
    Seek {
        request_id: u64,
        consumer_id: u64,
        target: SeekTarget,
    },
    GetSchema {
        request_id: u64,
    },
    /// A command the door does not serve: answered with an ERROR.
    Unsupported {
        request_id: u64,
        what: String,
    },
}

/// Pulsar's `ServerError` for a broker error, chosen so that the client
/// retries what Pulsar's clients retry (ServiceNotReady, TooManyRequests,
/// PersistenceError are retried by them).
pub(crate) fn server_error(code: ErrorCode) -> pb::ServerError {
    use pb::ServerError as S;
    match code {
        ErrorCode::UnknownError | ErrorCode::ProtocolError => S::UnknownError,
        ErrorCode::UnsupportedVersion => S::UnsupportedVersionError,
        ErrorCode::InvalidTopicName => S::InvalidTopicName,
        ErrorCode::TopicNotFound => S::TopicNotFound,
        ErrorCode::ProducerBusy => S::ProducerBusy,
        ErrorCode::ConsumerBusy => S::ConsumerBusy,
        ErrorCode::ProducerNotFound | ErrorCode::NotAllowed => S::NotAllowedError,
        ErrorCode::ConsumerNotFound => S::ConsumerNotFound,
        ErrorCode::PersistenceError | ErrorCode::StorageFull => S::PersistenceError,
        ErrorCode::ServiceNotReady | ErrorCode::NotOwner => S::ServiceNotReady,
        ErrorCode::TooManyRequests => S::TooManyRequests,
        ErrorCode::ChecksumError => S::ChecksumError,
        ErrorCode::MessageTooLarge => S::NotAllowedError,
        ErrorCode::ProducerFenced => S::ProducerFenced,
        // Not retriable: the subscription waits at the entry until an
        // operator skips it, so a client retrying would only loop.
        ErrorCode::DamagedEntry => S::UnknownError,
        ErrorCode::AuthenticationError => S::AuthenticationError,
        ErrorCode::AuthorizationError => S::AuthorizationError,
    }
}

fn id_data(id: &MessageId) -> pb::MessageIdData {
    pb::MessageIdData {
        ledger_id: id.ledger,
        entry_id: id.entry,
        partition: Some(id.partition),
        batch_index: Some(id.batch_index),
        ..Default::default()
    }
}

fn message_id(d: &pb::MessageIdData) -> MessageId {
    MessageId::new(d.ledger_id, d.entry_id, d.partition.unwrap_or(-1), d.batch_index.unwrap_or(-1))
}

/// A command of type `t` with one field set by `set`.
fn command(t: Type, set: impl FnOnce(&mut pb::BaseCommand)) -> pb::BaseCommand {
    let mut c = pb::BaseCommand { r#type: t as i32, ..Default::default() };
    set(&mut c);
    c
}

fn push(dst: &mut BytesMut, c: &pb::BaseCommand) -> Result<(), FrameError> {
    encode_command(c, dst)
}

fn error_command(request_id: u64, error: pb::ServerError, message: String) -> pb::BaseCommand {
    command(Type::Error, |c| c.error = Some(pb::CommandError { request_id, error: error as i32, message }))
}

fn sub_type(t: i32) -> Option<SubscriptionType> {
    use pb::command_subscribe::SubType as S;
    Some(match S::try_from(t).ok()? {
        S::Exclusive => SubscriptionType::Exclusive,
        S::Shared => SubscriptionType::Shared,
        S::Failover => SubscriptionType::Failover,
        S::KeyShared => SubscriptionType::KeyShared,
    })
}

/// `Some(request_id)` of a command this door does not serve, to answer it.
fn unsupported_request_id(c: &pb::BaseCommand) -> u64 {
    let ids = [
        c.consumer_stats.as_ref().map(|x| x.request_id),
        c.get_or_create_schema.as_ref().map(|x| x.request_id),
        c.new_txn.as_ref().map(|x| x.request_id),
        c.add_partition_to_txn.as_ref().map(|x| x.request_id),
        c.add_subscription_to_txn.as_ref().map(|x| x.request_id),
        c.end_txn.as_ref().map(|x| x.request_id),
        c.tc_client_connect_request.as_ref().map(|x| x.request_id),
        c.watch_topic_list.as_ref().map(|x| x.request_id),
        c.watch_topic_list_close.as_ref().map(|x| x.request_id),
        c.unsubscribe.as_ref().map(|x| x.request_id),
    ];
    ids.into_iter().flatten().next().unwrap_or(0)
}

impl Door for PulsarDoor {
    type Frame = Frame;
    type Decoder = FrameDecoder;
    type Other = PulsarOther;
    type Error = FrameError;

    /// Frames up to the largest message plus Pulsar's padding for the
    /// command and metadata.
    fn decoder(&self, _limits: &ConnectionLimits) -> FrameDecoder {
        FrameDecoder::new(self.config.max_message_bytes.saturating_add(magnetar_pulsar_wire::FRAME_PADDING_BYTES))
    }

    fn decode(decoder: &mut FrameDecoder, buf: &mut BytesMut) -> Result<Option<Frame>, String> {
        decoder.decode(buf).map_err(|e| format!("bad Pulsar frame: {e}"))
    }

    fn next_frame_bytes(decoder: &FrameDecoder, buf: &[u8]) -> Option<usize> {
        decoder.next_frame_bytes(buf).ok().flatten()
    }

    /// CONNECT → CONNECTED, with the lower of the two protocol versions and
    /// the largest message size, once CONNECT's credentials (or the
    /// transport's client certificate) pass the core's authenticator when
    /// authentication is on.
    fn handshake(session: &Session<Self>, frame: Frame) -> Handshake {
        let out = session.out();
        let Some(connect) = frame.command.connect.filter(|_| frame.command.r#type == Type::Connect as i32) else {
            return Handshake::Failed("the first Pulsar command must be CONNECT".into());
        };
        // Who the client is, when authentication is on: its auth method
        // (`token`) and data, or the transport's principal (a TLS client
        // certificate), through the core's protocol-neutral authenticator.
        let principal = match &session.broker().config().authentication {
            None => None,
            Some(auth) => {
                let method = connect.auth_method_name.as_deref().unwrap_or_default();
                let data = connect.auth_data.as_deref().unwrap_or_default();
                match auth.authenticate(method, data, session.broker().principal()) {
                    Ok(p) => Some(p),
                    Err(e) => {
                        let refusal = error_command(
                            0,
                            pb::ServerError::AuthenticationError,
                            format!("authentication failed: {e}"),
                        );
                        out.put("a refusal", |_, dst| push(dst, &refusal));
                        return Handshake::Unauthenticated(e.to_string());
                    }
                }
            }
        };
        let door = out.door();
        let version = connect.protocol_version.unwrap_or(0).clamp(0, PROTOCOL_VERSION);
        door.client_version.set(version);
        let connected = command(Type::Connected, |c| {
            c.connected = Some(pb::CommandConnected {
                server_version: concat!("magnetar/", env!("CARGO_PKG_VERSION")).to_string(),
                protocol_version: Some(version),
                max_message_size: Some(announced_max_message_bytes(
                    door.config.max_message_bytes,
                    session.broker().config().message_bytes_max,
                ) as i32),
                feature_flags: Some(pb::FeatureFlags::default()),
            })
        });
        out.put("CONNECTED", |_, dst| push(dst, &connected));
        if let Some(p) = &principal {
            if connect.auth_method_name.as_deref() == Some(magnetar_core::auth::AUTH_METHOD_TOKEN) {
                let refresh = connect.feature_flags.as_ref().and_then(|f| f.supports_auth_refresh).unwrap_or(false);
                refresh::watch(out, p, connect.auth_data.as_deref().unwrap_or_default(), refresh);
            }
        }
        Handshake::Accepted(principal)
    }

    fn request(&self, frame: Frame) -> Result<Request<PulsarOther>, String> {
        let Frame { command: c, payload } = frame;
        let t = Type::try_from(c.r#type).map_err(|_| format!("unknown Pulsar command type {}", c.r#type))?;
        let missing = || format!("{} without its command", t.as_str_name());
        Ok(match t {
            Type::Send => {
                let send = c.send.ok_or_else(missing)?;
                let payload = payload.ok_or("SEND without a payload")?;
                Request::Send {
                    producer_id: send.producer_id,
                    sequence_id: send.sequence_id,
                    num_messages: u32::try_from(send.num_messages.unwrap_or(1)).unwrap_or(0),
                    payload: magnetar_pulsar_wire::metadata::stored_blob(payload.checksummed()),
                    payload_crc: None,
                }
            }
            Type::Producer => {
                let p = c.producer.ok_or_else(missing)?;
                let access_mode = match pb::ProducerAccessMode::try_from(p.producer_access_mode.unwrap_or(0)) {
                    Ok(pb::ProducerAccessMode::Shared) | Err(_) => ProducerAccessMode::Shared,
                    Ok(pb::ProducerAccessMode::Exclusive) => ProducerAccessMode::Exclusive,
                    Ok(pb::ProducerAccessMode::WaitForExclusive) => ProducerAccessMode::WaitForExclusive,
                    Ok(pb::ProducerAccessMode::ExclusiveWithFencing) => ProducerAccessMode::ExclusiveWithFencing,
                };
                Request::CreateProducer {
                    request_id: p.request_id,
                    producer_id: p.producer_id,
                    topic: p.topic,
                    producer_name: p.producer_name.unwrap_or_default(),
                    access_mode,
                    epoch: p.topic_epoch,
                }
            }
            Type::CloseProducer => {
                let p = c.close_producer.ok_or_else(missing)?;
                Request::CloseProducer { request_id: p.request_id, producer_id: p.producer_id }
            }
            Type::Subscribe => {
                let s = c.subscribe.ok_or_else(missing)?;
                let Some(sub_type) = sub_type(s.sub_type) else {
                    return Ok(Request::Other(PulsarOther::Unsupported {
                        request_id: s.request_id,
                        what: format!("subscription type {}", s.sub_type),
                    }));
                };
                let mut initial_position = match s.initial_position {
                    Some(1) => InitialPosition::Earliest,
                    _ => InitialPosition::Latest,
                };
                // A reader's start: earliest is -1:-1 (all ones), latest is
                // i64::MAX:i64::MAX; any other id is a position to seek to.
                let mut start = None;
                if let Some(id) = &s.start_message_id {
                    if id.ledger_id == u64::MAX || id.entry_id == u64::MAX {
                        initial_position = InitialPosition::Earliest;
                    } else if id.ledger_id >= i64::MAX as u64 {
                        initial_position = InitialPosition::Latest;
                    } else {
                        start = Some(SeekTarget::Id(message_id(id)));
                    }
                }
                let key_shared_ranges = s
                    .key_shared_meta
                    .as_ref()
                    .filter(|m| m.key_shared_mode == pb::KeySharedMode::Sticky as i32)
                    .map(|m| m.hash_ranges.iter().map(|r| (r.start.max(0) as u32, r.end.max(0) as u32)).collect())
                    .unwrap_or_default();
                Request::Subscribe {
                    request_id: s.request_id,
                    request: SubscribeRequest {
                        topic: s.topic,
                        subscription: s.subscription,
                        consumer_id: s.consumer_id,
                        sub_type,
                        consumer_name: s.consumer_name.unwrap_or_default(),
                        initial_position,
                        durable: s.durable.unwrap_or(true),
                        priority_level: s.priority_level.unwrap_or(0),
                        filter_tag: String::new(),
                        key_shared_ranges,
                        model: Default::default(),
                        client_address: String::new(),
                    },
                    start,
                }
            }
            Type::Flow => {
                let f = c.flow.ok_or_else(missing)?;
                Request::Flow { consumer_id: f.consumer_id, permits: f.message_permits }
            }
            Type::Ack => {
                let a = c.ack.ok_or_else(missing)?;
                let ack_type = if a.ack_type == 1 { AckType::Cumulative } else { AckType::Individual };
                let (message_ids, batch_sizes) = ack_ids(&a.message_id, &mut self.batch_sizes.borrow_mut());
                if let Some(r) = a.request_id {
                    let mut pending = self.pending_acks.borrow_mut();
                    if pending.len() < PENDING_ACKS_MAX {
                        pending.insert(r, a.consumer_id);
                    }
                }
                Request::Ack {
                    request_id: a.request_id,
                    consumer_id: a.consumer_id,
                    ack_type,
                    message_ids,
                    batch_sizes,
                }
            }
            Type::RedeliverUnacknowledgedMessages => {
                let r = c.redeliver_unacknowledged_messages.ok_or_else(missing)?;
                Request::Redeliver {
                    consumer_id: r.consumer_id,
                    message_ids: r.message_ids.iter().map(message_id).collect(),
                }
            }
            Type::Seek => {
                let s = c.seek.ok_or_else(missing)?;
                let target = match (&s.message_id, s.message_publish_time) {
                    (Some(id), _) => SeekTarget::Id(message_id(id)),
                    (None, Some(t)) => SeekTarget::PublishTime(t),
                    (None, None) => {
                        return Ok(Request::Other(PulsarOther::Unsupported {
                            request_id: s.request_id,
                            what: "SEEK without a message id or publish time".into(),
                        }))
                    }
                };
                Request::Other(PulsarOther::Seek { request_id: s.request_id, consumer_id: s.consumer_id, target })
            }
            Type::Unsubscribe => {
                let u = c.unsubscribe.ok_or_else(missing)?;
                Request::Unsubscribe {
                    request_id: u.request_id,
                    consumer_id: u.consumer_id,
                    force: u.force.unwrap_or(false),
                }
            }
            Type::CloseConsumer => {
                let x = c.close_consumer.ok_or_else(missing)?;
                Request::CloseConsumer { request_id: x.request_id, consumer_id: x.consumer_id }
            }
            Type::Ping => Request::Ping,
            Type::Pong => Request::Pong,
            Type::AuthResponse => {
                let r = c.auth_response.ok_or_else(missing)?.response.unwrap_or_default();
                Request::Other(PulsarOther::AuthResponse {
                    method: r.auth_method_name.unwrap_or_default(),
                    data: r.auth_data.unwrap_or_default(),
                })
            }
            Type::Lookup => {
                let l = c.lookup_topic.ok_or_else(missing)?;
                Request::Other(PulsarOther::Lookup { request_id: l.request_id, topic: l.topic })
            }
            Type::PartitionedMetadata => {
                let p = c.partition_metadata.ok_or_else(missing)?;
                Request::Other(PulsarOther::PartitionedMetadata { request_id: p.request_id, topic: p.topic })
            }
            Type::GetLastMessageId => {
                let g = c.get_last_message_id.ok_or_else(missing)?;
                Request::Other(PulsarOther::LastMessageId { request_id: g.request_id, consumer_id: g.consumer_id })
            }
            Type::GetTopicsOfNamespace => {
                let g = c.get_topics_of_namespace.ok_or_else(missing)?;
                Request::Other(PulsarOther::TopicsOfNamespace {
                    request_id: g.request_id,
                    namespace: g.namespace,
                    mode: g.mode.unwrap_or(0),
                })
            }
            Type::GetSchema => {
                let g = c.get_schema.ok_or_else(missing)?;
                Request::Other(PulsarOther::GetSchema { request_id: g.request_id })
            }
            Type::Connect => return Err("CONNECT sent twice".into()),
            // Commands only a broker sends: a client sending one is broken.
            Type::Connected
            | Type::SendReceipt
            | Type::SendError
            | Type::Message
            | Type::Success
            | Type::Error
            | Type::ProducerSuccess
            | Type::PartitionedMetadataResponse
            | Type::LookupResponse
            | Type::ConsumerStatsResponse
            | Type::ReachedEndOfTopic
            | Type::GetLastMessageIdResponse
            | Type::ActiveConsumerChange
            | Type::GetTopicsOfNamespaceResponse
            | Type::GetSchemaResponse
            | Type::AckResponse => return Err(format!("{} is sent by brokers, not clients", t.as_str_name())),
            _ => Request::Other(PulsarOther::Unsupported {
                request_id: unsupported_request_id(&c),
                what: t.as_str_name().to_string(),
            }),
        })
    }

    async fn other(session: &Rc<Session<Self>>, request: PulsarOther) -> Result<(), String> {
        let out = session.out().clone();
        match request {
            PulsarOther::AuthResponse { method, data } => {
                refresh::answer(&out, session.broker().config().authentication.as_ref(), &method, &data)?;
            }
            PulsarOther::Lookup { request_id, topic } => {
                let address = lookup_address(session);
                let tls = session.out().door().config.tls;
                let answer = match TopicName::parse(&topic) {
                    Ok(_) => pb::CommandLookupTopicResponse {
                        broker_service_url: Some(format!("pulsar://{address}")),
                        broker_service_url_tls: tls.then(|| format!("pulsar+ssl://{address}")),
                        response: Some(pb::command_lookup_topic_response::LookupType::Connect as i32),
                        request_id,
                        authoritative: Some(true),
                        ..Default::default()
                    },
                    Err(e) => pb::CommandLookupTopicResponse {
                        response: Some(pb::command_lookup_topic_response::LookupType::Failed as i32),
                        request_id,
                        error: Some(pb::ServerError::InvalidTopicName as i32),
                        message: Some(e.to_string()),
                        ..Default::default()
                    },
                };
                let c = command(Type::LookupResponse, |c| c.lookup_topic_response = Some(answer));
                out.put("a LOOKUP_RESPONSE", |_, dst| push(dst, &c));
            }
            PulsarOther::PartitionedMetadata { request_id, topic } => {
                // Lookup auto-creates a partitioned topic's metadata as the
                // namespace's policy says, as Pulsar does here.
                let result = match TopicName::parse(&topic) {
                    Ok(topic) => session.broker_handle().admin(AdminRequest::Lookup { topic }).await,
                    Err(e) => Err(CoreError::new(ErrorCode::InvalidTopicName, e.to_string())),
                };
                use pb::command_partitioned_topic_metadata_response::LookupType;
                let answer = match result {
                    Ok(AdminReply::Lookup(l)) => pb::CommandPartitionedTopicMetadataResponse {
                        partitions: Some(l.partitions),
                        request_id,
                        response: Some(LookupType::Success as i32),
                        ..Default::default()
                    },
                    Ok(other) => pb::CommandPartitionedTopicMetadataResponse {
                        request_id,
                        response: Some(LookupType::Failed as i32),
                        error: Some(pb::ServerError::UnknownError as i32),
                        message: Some(format!("unexpected answer {other:?}")),
                        ..Default::default()
                    },
                    Err(e) => pb::CommandPartitionedTopicMetadataResponse {
                        request_id,
                        response: Some(LookupType::Failed as i32),
                        error: Some(server_error(e.code) as i32),
                        message: Some(e.message),
                        ..Default::default()
                    },
                };
                let c = command(Type::PartitionedMetadataResponse, |c| c.partition_metadata_response = Some(answer));
                out.put("a PARTITIONED_METADATA_RESPONSE", |_, dst| push(dst, &c));
            }
            PulsarOther::LastMessageId { request_id, consumer_id } => {
                let Some(consumer) = session.consumer(consumer_id) else {
                    out.error(request_id, &CoreError::new(ErrorCode::ConsumerNotFound, "no such consumer"));
                    return Ok(());
                };
                let result = match TopicName::parse(&consumer.topic) {
                    Ok(topic) => session.broker_handle().admin(AdminRequest::LastMessageId { topic }).await,
                    Err(e) => Err(CoreError::new(ErrorCode::InvalidTopicName, e.to_string())),
                };
                match result {
                    Ok(AdminReply::LastMessageId(LastMessageId::Topic(last))) => {
                        // Nothing stored: entry -1 (and ledger -1), as Pulsar
                        // answers for an empty topic.
                        let partition =
                            TopicName::parse(&consumer.topic).ok().and_then(|t| t.partition()).map_or(-1, |p| p as i32);
                        let id = last.unwrap_or(MessageId::new(u64::MAX, u64::MAX, partition, -1));
                        let c = command(Type::GetLastMessageIdResponse, |c| {
                            c.get_last_message_id_response = Some(pb::CommandGetLastMessageIdResponse {
                                last_message_id: id_data(&id),
                                request_id,
                                consumer_mark_delete_position: None,
                            })
                        });
                        out.put("a GET_LAST_MESSAGE_ID_RESPONSE", |_, dst| push(dst, &c));
                    }
                    Ok(other) => out.error(
                        request_id,
                        &CoreError::new(ErrorCode::UnknownError, format!("unexpected answer {other:?}")),
                    ),
                    Err(e) => out.error(request_id, &e),
                }
            }
            PulsarOther::TopicsOfNamespace { request_id, namespace, mode } => {
                match session
                    .broker_handle()
                    .admin(AdminRequest::ListTopics { namespace, after: None, limit: None })
                    .await
                {
                    Ok(AdminReply::Names(names)) => {
                        let topics = topics_of_namespace(names, mode);
                        let c = command(Type::GetTopicsOfNamespaceResponse, |c| {
                            c.get_topics_of_namespace_response = Some(pb::CommandGetTopicsOfNamespaceResponse {
                                request_id,
                                topics,
                                ..Default::default()
                            })
                        });
                        out.put("a GET_TOPICS_OF_NAMESPACE_RESPONSE", |_, dst| push(dst, &c));
                    }
                    Ok(other) => out.error(
                        request_id,
                        &CoreError::new(ErrorCode::UnknownError, format!("unexpected answer {other:?}")),
                    ),
                    Err(e) => out.error(request_id, &e),
                }
            }
            PulsarOther::Seek { request_id, consumer_id, target } => {
                let Some(consumer) = session.consumer(consumer_id) else {
                    out.error(request_id, &CoreError::new(ErrorCode::ConsumerNotFound, "no such consumer"));
                    return Ok(());
                };
                match session.broker_handle().seek(&consumer, target).await {
                    Ok(()) => {
                        out.success(request_id);
                        // As Pulsar does: the consumer is disconnected and
                        // subscribes again, asking for messages afresh.
                        if session.detach_consumer(consumer_id).await {
                            out.put("a CLOSE_CONSUMER", |d, dst| {
                                d.consumer_closed(dst, consumer_id, ErrorCode::ServiceNotReady, String::new())
                            });
                        }
                    }
                    Err(e) => out.error(request_id, &e),
                }
            }
            PulsarOther::GetSchema { request_id } => {
                // Topics carry no schema (bytes): Pulsar answers this for a
                // topic without one.
                let c = command(Type::GetSchemaResponse, |c| {
                    c.get_schema_response = Some(pb::CommandGetSchemaResponse {
                        request_id,
                        error_code: Some(pb::ServerError::TopicNotFound as i32),
                        error_message: Some("Topic does not have schema".into()),
                        ..Default::default()
                    })
                });
                out.put("a GET_SCHEMA_RESPONSE", |_, dst| push(dst, &c));
            }
            PulsarOther::Unsupported { request_id, what } => {
                let c = error_command(
                    request_id,
                    pb::ServerError::NotAllowedError,
                    format!("{what} is not supported by this broker"),
                );
                out.put("an ERROR", |_, dst| push(dst, &c));
            }
        }
        Ok(())
    }

    fn producer_created(&self, dst: &mut BytesMut, request_id: u64, p: &ProducerHandle) -> Result<(), FrameError> {
        push(
            dst,
            &command(Type::ProducerSuccess, |c| {
                c.producer_success = Some(pb::CommandProducerSuccess {
                    request_id,
                    producer_name: p.producer_name.clone(),
                    last_sequence_id: Some(p.last_sequence_id),
                    producer_ready: Some(true),
                    topic_epoch: p.topic_epoch,
                    ..Default::default()
                })
            }),
        )
    }

    fn producer_waiting(&self, dst: &mut BytesMut, request_id: u64) -> Result<(), FrameError> {
        // Pulsar's clients keep a request answered with `producer_ready =
        // false` pending without a timeout until the second PRODUCER_SUCCESS.
        push(
            dst,
            &command(Type::ProducerSuccess, |c| {
                c.producer_success =
                    Some(pb::CommandProducerSuccess { request_id, producer_ready: Some(false), ..Default::default() })
            }),
        )
    }

    fn receipt(&self, dst: &mut BytesMut, producer_id: u64, sequence_id: u64, id: MessageId) -> Result<(), FrameError> {
        // A resend answered from dedup carries u64::MAX:u64::MAX, which
        // Pulsar's clients read as -1:-1 (what Pulsar answers).
        push(
            dst,
            &command(Type::SendReceipt, |c| {
                c.send_receipt = Some(pb::CommandSendReceipt {
                    producer_id,
                    sequence_id,
                    message_id: Some(id_data(&id)),
                    highest_sequence_id: None,
                })
            }),
        )
    }

    fn send_error(
        &self,
        dst: &mut BytesMut,
        producer_id: u64,
        sequence_id: u64,
        e: CoreError,
    ) -> Result<(), FrameError> {
        push(
            dst,
            &command(Type::SendError, |c| {
                c.send_error = Some(pb::CommandSendError {
                    producer_id,
                    sequence_id,
                    error: server_error(e.code) as i32,
                    message: e.message,
                })
            }),
        )
    }

    fn message(
        &self,
        dst: &mut BytesMut,
        consumer_id: u64,
        id: &MessageId,
        redelivery_count: u32,
        ack_set: Vec<u64>,
        blob: &[u8],
    ) -> Result<(), FrameError> {
        let c = command(Type::Message, |c| {
            c.message = Some(pb::CommandMessage {
                consumer_id,
                message_id: id_data(id),
                redelivery_count: Some(redelivery_count),
                ack_set: pulsar_ack_set(&ack_set),
                consumer_epoch: None,
            })
        });
        match magnetar_pulsar_wire::metadata::split_stored(blob) {
            Ok((checksummed, metadata, _)) => {
                if let Some(n) =
                    magnetar_pulsar_wire::peek_metadata(metadata).ok().and_then(|m| m.num_messages_in_batch)
                {
                    self.remember_batch(id, n);
                }
                encode_stored_payload_command(&c, checksummed, dst)
            }
            Err(_) => match convert::native_to_pulsar(blob) {
                Ok((metadata, payload)) => {
                    if let Some(n) =
                        magnetar_pulsar_wire::peek_metadata(&metadata).ok().and_then(|m| m.num_messages_in_batch)
                    {
                        self.remember_batch(id, n);
                    }
                    magnetar_pulsar_wire::encode_payload_command(&c, &metadata, &payload, dst)
                }
                Err(why) => {
                    // Not expected (stored blobs were checked when they
                    // were appended); the others of a run still go.
                    tracing::error!("cannot deliver entry {id} to Pulsar consumer {consumer_id}: {why}");
                    Ok(())
                }
            },
        }
    }

    fn run(
        &self,
        dst: &mut BytesMut,
        consumer_id: u64,
        first: &MessageId,
        redelivery_count: u32,
        blobs: &[bytes::Bytes],
    ) -> Result<(), FrameError> {
        let mut id = *first;
        for blob in blobs {
            self.message(dst, consumer_id, &id, redelivery_count, Vec::new(), blob)?;
            id.entry = id.entry.wrapping_add(1);
        }
        Ok(())
    }

    fn consumer_closed(&self, dst: &mut BytesMut, consumer_id: u64, _: ErrorCode, _: String) -> Result<(), FrameError> {
        push(
            dst,
            &command(Type::CloseConsumer, |c| {
                c.close_consumer = Some(pb::CommandCloseConsumer { consumer_id, request_id: 0, ..Default::default() })
            }),
        )
    }

    fn active_consumer(&self, dst: &mut BytesMut, consumer_id: u64, is_active: bool) -> Result<(), FrameError> {
        if self.client_version.get() < V_ACTIVE_CONSUMER_CHANGE {
            return Ok(());
        }
        push(
            dst,
            &command(Type::ActiveConsumerChange, |c| {
                c.active_consumer_change =
                    Some(pb::CommandActiveConsumerChange { consumer_id, is_active: Some(is_active) })
            }),
        )
    }

    fn success(&self, dst: &mut BytesMut, request_id: u64) -> Result<(), FrameError> {
        if let Some(consumer_id) = self.take_pending_ack(request_id) {
            return push(
                dst,
                &command(Type::AckResponse, |c| {
                    c.ack_response =
                        Some(pb::CommandAckResponse { consumer_id, request_id: Some(request_id), ..Default::default() })
                }),
            );
        }
        push(dst, &command(Type::Success, |c| c.success = Some(pb::CommandSuccess { request_id, schema: None })))
    }

    fn error(&self, dst: &mut BytesMut, request_id: u64, e: &CoreError) -> Result<(), FrameError> {
        if let Some(consumer_id) = self.take_pending_ack(request_id) {
            return push(
                dst,
                &command(Type::AckResponse, |c| {
                    c.ack_response = Some(pb::CommandAckResponse {
                        consumer_id,
                        request_id: Some(request_id),
                        error: Some(server_error(e.code) as i32),
                        message: Some(e.message.clone()),
                        ..Default::default()
                    })
                }),
            );
        }
        push(dst, &error_command(request_id, server_error(e.code), e.message.clone()))
    }

    fn pong(&self, dst: &mut BytesMut) -> Result<(), FrameError> {
        push(dst, &command(Type::Pong, |c| c.pong = Some(pb::CommandPong {})))
    }

    fn ping(&self, dst: &mut BytesMut) -> Result<(), FrameError> {
        push(dst, &command(Type::Ping, |c| c.ping = Some(pb::CommandPing {})))
    }

    fn keep_alive(&self) -> Option<Duration> {
        (self.client_version.get() >= V_PING).then_some(self.config.keep_alive)
    }

    fn protocol_error(&self, dst: &mut BytesMut, why: &str) -> Result<(), FrameError> {
        push(dst, &error_command(0, pb::ServerError::UnknownError, why.to_string()))
    }
}

impl PulsarDoor {
    fn remember_batch(&self, id: &MessageId, n: u32) {
        let mut known = self.batch_sizes.borrow_mut();
        if known.len() < BATCH_SIZES_MAX {
            known.insert((id.ledger, id.entry), n);
        }
    }

    /// The consumer of a pending ack request, when its answer should be an
    /// ACK_RESPONSE (the client announced it understands one).
    fn take_pending_ack(&self, request_id: u64) -> Option<u64> {
        let consumer_id = self.pending_acks.borrow_mut().remove(&request_id)?;
        (self.client_version.get() >= V_ACK_RESPONSE).then_some(consumer_id)
    }
}

/// The ids of an ACK and the batch size of each (0: the whole entry). An
/// id with an `ack_set` (batch-index ack: bit i set means message i is
/// still unacknowledged) becomes one id per acknowledged index.
fn ack_ids(ids: &[pb::MessageIdData], known: &mut HashMap<(u64, u64), u32>) -> (Vec<MessageId>, Vec<u32>) {
    let mut out = Vec::with_capacity(ids.len());
    let mut sizes = Vec::with_capacity(ids.len());
    for d in ids {
        let id = message_id(d);
        let remembered = known.get(&(id.ledger, id.entry)).copied();
        if d.ack_set.is_empty() {
            known.remove(&(id.ledger, id.entry));
            let size = d.batch_size.unwrap_or(0).max(0) as u32;
            out.push(id);
            sizes.push(if id.batch_index >= 0 { size } else { 0 });
            continue;
        }
        let Some(size) = d.batch_size.map(|s| s.max(0) as u32).or(remembered) else {
            // A batch-index ack of an entry of unknown size: not applied.
            continue;
        };
        if size <= 1 {
            known.remove(&(id.ledger, id.entry));
            out.push(MessageId { batch_index: -1, ..id });
            sizes.push(0);
            continue;
        }
        // Bounded by the batch size the client states, itself bounded by
        // what a batch may hold.
        let size = size.min(magnetar_wire::BATCH_MESSAGES_MAX);
        for i in 0..size {
            let word = d.ack_set.get((i / 64) as usize).copied().unwrap_or(0) as u64;
            if word & (1u64 << (i % 64)) == 0 {
                out.push(MessageId { batch_index: i as i32, ..id });
                sizes.push(size);
            }
        }
    }
    (out, sizes)
}

/// The broker's ack set (bit i set: message i acknowledged) as Pulsar's
/// (bit i set: message i still to be delivered). Empty stays empty.
fn pulsar_ack_set(acked: &[u64]) -> Vec<i64> {
    acked.iter().map(|w| !w as i64).collect()
}

/// `host:port` for LOOKUP answers: the advertised host, else the address
/// the client reached.
fn lookup_address(session: &Session<PulsarDoor>) -> String {
    let local = session.local_addr().unwrap_or("127.0.0.1:6650");
    match &session.out().door().config.advertised_address {
        Some(host) => {
            let port = local.rsplit_once(':').map_or("6650", |(_, p)| p);
            format!("{host}:{port}")
        }
        None => local.to_string(),
    }
}

/// A namespace's topics for GET_TOPICS_OF_NAMESPACE: partitions collapsed to
/// their topic, filtered by mode (0 persistent, 1 non-persistent, 2 all).
fn topics_of_namespace(names: Vec<String>, mode: i32) -> Vec<String> {
    let mut topics: Vec<String> = Vec::new();
    for name in names {
        let persistent = name.starts_with("persistent://");
        let keep = match mode {
            0 => persistent,
            1 => !persistent,
            _ => true,
        };
        if !keep {
            continue;
        }
        let base = match name.rfind("-partition-") {
            Some(i) if name[i + 11..].bytes().all(|b| b.is_ascii_digit()) && i + 11 < name.len() => {
                name[..i].to_string()
            }
            _ => name,
        };
        if !topics.contains(&base) {
            topics.push(base);
        }
    }
    topics
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a batch-index ack acknowledges exactly the indices whose bit
    /// is clear, and a plain ack the whole entry.
    #[test]
    fn ack_sets_map_to_batch_indices() {
        let whole = pb::MessageIdData { ledger_id: 1, entry_id: 2, ..Default::default() };
        let mut known = HashMap::from([((1, 3), 4)]);
        let (ids, sizes) = ack_ids(&[whole], &mut known);
        assert_eq!((ids, sizes), (vec![MessageId::new(1, 2, -1, -1)], vec![0]));
        let part = pb::MessageIdData {
            ledger_id: 1,
            entry_id: 3,
            batch_index: Some(-1),
            batch_size: Some(4),
            ack_set: vec![0b1010],
            ..Default::default()
        };
        let (ids, sizes) = ack_ids(std::slice::from_ref(&part), &mut known);
        assert_eq!(ids, vec![MessageId::new(1, 3, -1, 0), MessageId::new(1, 3, -1, 2)]);
        assert_eq!(sizes, vec![4, 4]);
        // Without batch_size (the C++ client), the size delivered is used;
        // unknown, the ack is not applied.
        let no_size = pb::MessageIdData { batch_size: None, ..part };
        assert_eq!(ack_ids(std::slice::from_ref(&no_size), &mut known).0.len(), 2);
        assert!(ack_ids(&[no_size], &mut HashMap::new()).0.is_empty());
        assert_eq!(pulsar_ack_set(&[0b0101]), vec![!0b0101i64]);
    }

    #[test]
    fn topics_collapse_partitions_and_filter_by_mode() {
        let names = vec![
            "persistent://public/default/a-partition-0".to_string(),
            "persistent://public/default/a-partition-1".to_string(),
            "persistent://public/default/b".to_string(),
            "non-persistent://public/default/c".to_string(),
        ];
        assert_eq!(
            topics_of_namespace(names.clone(), 0),
            vec!["persistent://public/default/a".to_string(), "persistent://public/default/b".to_string()]
        );
        assert_eq!(topics_of_namespace(names.clone(), 1), vec!["non-persistent://public/default/c".to_string()]);
        assert_eq!(topics_of_namespace(names, 2).len(), 3);
    }
}
