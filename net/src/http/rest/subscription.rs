//! `/persistent/{tenant}/{namespace}/{topic}/subscription/{sub}/…`: Apache
//! Pulsar's subscription administration (create at a position, delete,
//! `skip_all`, `skip/{n}`, `resetcursor`, `expireMessages`, peek
//! `position/{n}`), each one [`AdminRequest::Subscription`] run by the core.
//! A partitioned topic's name applies to all its partitions, as in Pulsar;
//! a peek or a reset to a message id on one answers 405, as Pulsar does.

use super::{bad_body, body_json, core_error, not_supported, partitions_of, unexpected};
use crate::http::{error, no_content, Body, State};
use bytes::Bytes;
use hyper::body::Incoming;
use hyper::header::{HeaderName, HeaderValue};
use hyper::{Method, Request, Response, StatusCode};
use magnetar_core::api::{AdminReply, AdminRequest, SeekTarget, StoredEntry, SubscriptionOp, SubscriptionStart};
use magnetar_core::TopicName;
use magnetar_pulsar_wire::proto as pb;
use magnetar_wire::{ErrorCode, MessageId};
use prost::Message;
use serde_json::Value;

/// Handles `rest` = `[sub, …]` after `…/{topic}/subscription/`.
pub(super) async fn handle(
    state: &State,
    req: Request<Incoming>,
    method: &Method,
    topic: TopicName,
    rest: &[&str],
) -> Response<Body> {
    let Some((sub, tail)) = rest.split_first() else {
        return not_supported(&format!("{method} on a topic's \"subscription\""));
    };
    let subscription = sub.to_string();
    let op = match (method, tail) {
        (&Method::PUT, []) => {
            let body = match body_json(state, req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            match start_of(&body) {
                Ok(at) => SubscriptionOp::Create { at },
                Err(r) => return r,
            }
        }
        (&Method::DELETE, []) => SubscriptionOp::Delete { force: query_flag(&req, "force") },
        (&Method::POST, ["skip_all"]) => SubscriptionOp::ClearBacklog,
        (&Method::POST, ["skip", n]) => match number(n, "the number of messages to skip") {
            Ok(count) => SubscriptionOp::Skip { count },
            Err(r) => return r,
        },
        (&Method::POST, ["resetcursor", ts]) => match number(ts, "the timestamp") {
            Ok(ms) => SubscriptionOp::ResetCursor { to: SeekTarget::PublishTime(ms) },
            Err(r) => return r,
        },
        (&Method::POST, ["resetcursor"]) => {
            let body = match body_json(state, req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let id = match message_id_of(&body) {
                Ok(id) => id,
                Err(r) => return r,
            };
            if is_partitioned(state, &topic).await {
                return error(
                    StatusCode::METHOD_NOT_ALLOWED,
                    "Reset-cursor at position is not allowed for partitioned-topic",
                );
            }
            SubscriptionOp::ResetCursor { to: SeekTarget::Id(id) }
        }
        (&Method::POST, ["expireMessages", s]) => match number(s, "the expiry time in seconds") {
            Ok(older_than_s) => SubscriptionOp::Expire { older_than_s },
            Err(r) => return r,
        },
        (&Method::GET, ["position", n]) => {
            let position = match number(n, "the message position") {
                Ok(0) => return bad_body("the message position starts at 1"),
                Ok(p) => p,
                Err(r) => return r,
            };
            if is_partitioned(state, &topic).await {
                return error(StatusCode::METHOD_NOT_ALLOWED, "Peek messages on a partitioned topic is not allowed");
            }
            SubscriptionOp::PeekEntry { position }
        }
        _ => return not_supported(&format!("{method} on a subscription's {:?}", tail.join("/"))),
    };
    let deleting = matches!(op, SubscriptionOp::Delete { .. });
    let peeking = matches!(op, SubscriptionOp::PeekEntry { .. });
    let reply = match state.admin(AdminRequest::Subscription { topic, subscription, op }).await {
        Ok(Ok(r)) => r,
        // Pulsar refuses to delete a subscription with consumers with 412.
        Ok(Err(e)) if deleting && e.code == ErrorCode::ConsumerBusy => {
            return error(StatusCode::PRECONDITION_FAILED, e.message)
        }
        Ok(Err(e)) => return core_error(e),
        Err(e) => return e.response(),
    };
    match reply {
        AdminReply::Entry(entry) if peeking => match peeked(&entry) {
            Ok(r) => r,
            Err(why) => error(
                StatusCode::INTERNAL_SERVER_ERROR,
                format!("entry {}:{} cannot be read: {why}", entry.id.ledger, entry.id.entry),
            ),
        },
        AdminReply::Done if !peeking => no_content(),
        other => unexpected(other),
    }
}

async fn is_partitioned(state: &State, topic: &TopicName) -> bool {
    matches!(partitions_of(state, topic).await, Ok(n) if n > 0)
}

fn number(text: &str, what: &str) -> Result<u64, Response<Body>> {
    text.parse().map_err(|_| bad_body(format!("{what} must be a non-negative integer, not {text:?}")))
}

/// `?name=true` in the request's query.
fn query_flag(req: &Request<Incoming>, name: &str) -> bool {
    req.uri().query().unwrap_or("").split('&').any(|kv| kv.split_once('=') == Some((name, "true")))
}

fn int_field(body: &Value, k: &str) -> Result<Option<i64>, Response<Body>> {
    match body.get(k) {
        None | Some(Value::Null) => Ok(None),
        Some(v) => v.as_i64().map(Some).ok_or_else(|| bad_body(format!("{k} must be an integer"))),
    }
}

/// Pulsar's `MessageId` / `ResetCursorData` JSON: `ledgerId`, `entryId`,
/// optional `partitionIndex` and `batchIndex`; `isExcluded` (start after
/// the message) is not supported.
fn message_id_of(body: &Value) -> Result<MessageId, Response<Body>> {
    let Some(obj) = body.as_object() else { return Err(bad_body("the body must be a MessageId object")) };
    for k in obj.keys() {
        match k.as_str() {
            "ledgerId" | "entryId" | "partitionIndex" | "batchIndex" | "properties" => {}
            "isExcluded" if obj[k] == Value::Bool(false) => {}
            "isExcluded" => return Err(not_supported("resetting the cursor after a message (isExcluded)")),
            other => return Err(bad_body(format!("unknown field {other:?} of MessageId"))),
        }
    }
    let need = |k: &str| int_field(body, k)?.ok_or_else(|| bad_body(format!("the MessageId needs {k}")));
    let (ledger, entry) = (need("ledgerId")?, need("entryId")?);
    let (Ok(ledger), Ok(entry)) = (u64::try_from(ledger), u64::try_from(entry)) else {
        return Err(bad_body("ledgerId and entryId must not be negative"));
    };
    let small = |k: &str| -> Result<i32, Response<Body>> {
        let v = int_field(body, k)?.unwrap_or(-1);
        i32::try_from(v).map_err(|_| bad_body(format!("{k} is out of range")))
    };
    Ok(MessageId::new(ledger, entry, small("partitionIndex")?, small("batchIndex")?))
}

/// Where `PUT …/subscription/{sub}` starts: Pulsar's body is a MessageId,
/// `MessageId.latest` when absent; `MessageId.earliest` is ledger and entry
/// -1, `latest` is ledger and entry `Long.MAX_VALUE`.
fn start_of(body: &Value) -> Result<SubscriptionStart, Response<Body>> {
    if body.is_null() {
        return Ok(SubscriptionStart::Latest);
    }
    let (ledger, entry) = (int_field(body, "ledgerId")?, int_field(body, "entryId")?);
    match (ledger, entry) {
        (Some(-1), Some(-1)) => Ok(SubscriptionStart::Earliest),
        (Some(i64::MAX), _) | (_, Some(i64::MAX)) => Ok(SubscriptionStart::Latest),
        _ => message_id_of(body).map(SubscriptionStart::Id),
    }
}

/// What Pulsar's admin peek answers of an entry: its metadata's figures
/// and its payload, a batch's being every message with its
/// `SingleMessageMetadata` (Pulsar's batch format, which Pulsar's admin
/// clients split).
struct PeekedEntry {
    publish_time_ms: u64,
    key: Option<String>,
    properties: Vec<(String, String)>,
    /// Messages of a batch entry.
    batch: Option<u32>,
    /// A compressed payload's codec (the payload is returned as stored,
    /// not decompressed as Pulsar's broker does).
    compression: Option<String>,
    payload: Bytes,
}

impl PeekedEntry {
    /// Either door's stored entry: a Pulsar entry as it is; a Magnetar
    /// batch converted to Pulsar's batch format, as the Pulsar door
    /// delivers it.
    fn of(blob: &Bytes) -> Result<Self, String> {
        if magnetar_pulsar_wire::metadata::is_stored(blob) {
            let (_, metadata, payload) =
                magnetar_pulsar_wire::metadata::split_stored(blob).map_err(|e| e.to_string())?;
            let m = pb::MessageMetadata::decode(metadata).map_err(|e| e.to_string())?;
            let compression = match pb::CompressionType::try_from(m.compression.unwrap_or(0)) {
                Ok(pb::CompressionType::None) => None,
                Ok(c) => Some(c.as_str_name().to_string()),
                Err(_) => Some(format!("{:?}", m.compression)),
            };
            return Ok(PeekedEntry {
                publish_time_ms: m.publish_time,
                key: m.partition_key,
                properties: m.properties.into_iter().map(|kv| (kv.key, kv.value)).collect(),
                batch: m.num_messages_in_batch.and_then(|n| u32::try_from(n).ok()),
                compression,
                payload: blob.slice_ref(payload),
            });
        }
        let (meta, payload) = magnetar_wire::decode_message(blob).map_err(|e| e.to_string())?;
        let batched = meta.num_messages > 1 && meta.chunk.is_none();
        let compressed = meta.compression != magnetar_wire::CompressionType::None;
        let payload = if batched && !compressed { crate::pulsar::convert::native_to_pulsar(blob)?.1 } else { payload };
        Ok(PeekedEntry {
            publish_time_ms: meta.publish_time_ms,
            key: meta.partition_key,
            properties: meta.properties,
            batch: batched.then_some(meta.num_messages),
            compression: compressed.then(|| format!("{:?}", meta.compression).to_uppercase()),
            payload,
        })
    }
}

/// A peeked entry as Pulsar's admin answers it (`generateResponseWithEntry`):
/// the payload as the body, the rest in `X-Pulsar-*` headers; a batch with
/// `X-Pulsar-num-batch-message`.
fn peeked(entry: &StoredEntry) -> Result<Response<Body>, String> {
    let m = PeekedEntry::of(&entry.blob)?;
    let mut r = Response::new(Body::new(m.payload.clone()));
    let h = r.headers_mut();
    h.insert(hyper::header::CONTENT_TYPE, HeaderValue::from_static("application/octet-stream"));
    let mut put = |name: &str, value: String| {
        if let (Ok(n), Ok(v)) = (HeaderName::try_from(name), HeaderValue::try_from(value)) {
            h.insert(n, v);
        }
    };
    put("X-Pulsar-Message-ID", format!("{}:{}", entry.id.ledger, entry.id.entry));
    let published = std::time::UNIX_EPOCH + std::time::Duration::from_millis(m.publish_time_ms);
    put("X-Pulsar-publish-time", humantime::format_rfc3339_millis(published).to_string());
    if let Some(key) = m.key.filter(|k| !k.is_empty()) {
        put("X-Pulsar-partition-key", key);
    }
    if let Some(n) = m.batch {
        put("X-Pulsar-num-batch-message", n.to_string());
        put("X-Pulsar-batch-size", m.payload.len().to_string());
    }
    if let Some(c) = m.compression {
        put("X-Pulsar-compression", c);
    }
    // Both of Pulsar's forms: one header per property (older brokers) and
    // all of them as one JSON object (newer ones).
    let properties: std::collections::BTreeMap<&str, &str> =
        m.properties.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    for (k, v) in &properties {
        put(&format!("X-Pulsar-PROPERTY-{k}"), v.to_string());
    }
    if !properties.is_empty() {
        put("X-Pulsar-PROPERTY", serde_json::to_string(&properties).unwrap_or_default());
    }
    Ok(r)
}
