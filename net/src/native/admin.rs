//! The native protocol's admin mapping: an `AdminRequest` frame names an
//! operation and carries its arguments as a JSON object; the answer is a
//! JSON value. This file is the only place that JSON is read or written:
//! [`parse`] turns op and arguments into a typed [`AdminRequest`],
//! [`render`] turns an [`AdminReply`] into text, and [`render_topic_stats`]
//! does the same for the `TopicStats` frame. The CLI's `magnetar admin …`
//! and the client's `Admin` API are thin layers over this list, and scripts
//! read the answers: field names, their order and number forms are a
//! contract.
//!
//! | op | arguments | answer |
//! |---|---|---|
//! | `tenants.list` | – | `["public", …]` |
//! | `tenants.create` | `tenant`, optional `admin_roles`, `allowed_clusters` | `null` |
//! | `tenants.get` | `tenant` | the tenant info |
//! | `tenants.delete` | `tenant` (must have no namespaces) | `null` |
//! | `namespaces.list` | `tenant` | `["public/default", …]` |
//! | `namespaces.create` | `namespace`, optional `policies` (partial) | `null` |
//! | `namespaces.delete` | `namespace` (must have no topics) | `null` |
//! | `namespaces.policies` | `namespace` | the policies |
//! | `namespaces.set-policies` | `namespace`, `policies` (partial: only the given fields change) | the new policies |
//! | `topics.create` | `topic` | `null` |
//! | `topics.create-partitioned` | `topic`, `partitions` | `null` |
//! | `topics.update-partitioned` | `topic`, `partitions` (grow only) | `null` |
//! | `topics.partitioned-metadata` | `topic` | `{"partitions": N}` (0: not partitioned) |
//! | `topics.list` | `namespace` | full names, partitions included |
//! | `topics.delete` | `topic` (a partitioned one deletes every partition) | `null` |
//! | `topics.last-message-id` | `topic` | `{"id": "L:E:P:-1" or null}`; partitioned: `{"partitions": [{"id": …}, …]}` |
//! | `topics.lookup` | `topic` | `{"bundle", "partition_owners", "partitions", "shard", "shard_port"?, "topic", "broker"?}` |
//! | `topics.owner` | `topic` (exactly this name; no side effects) | `{"bundle", "shard", "shard_port"?, "topic"}` |
//! | `messages.find` | `topic`, `key`, optional `before_ms`, `limit` (10) | `{"messages": [{"batch_messages"?, "compression"?, "id", "key", "payload_base64", "payload_size", "properties", "publish_time_ms", "topic"}, …], "truncated"}` |
//! | `broker.shard-stats` | – | `{"shards": [{"cross_shard_events", "cross_shard_requests", "port"?, "shard"}, …]}` |
//! | `topics.set-retention` | `topic`, `retention_minutes`, `retention_size_mb` (-1 = unbounded) | `null` |
//! | `topics.get-retention` | `topic` | `{"retention_minutes", "retention_size_mb"}` or `null` (none set) |
//! | `topics.remove-retention` | `topic` | `null` |
//! | `topics.set-message-ttl` | `topic`, `message_ttl_seconds` (0 = no TTL) | `null` |
//! | `topics.get-message-ttl` | `topic` | `{"message_ttl_seconds"}` or `null` (none set) |
//! | `topics.remove-message-ttl` | `topic` | `null` |
//! | `namespaces.grant-permission` | `namespace`, `role`, `actions` (`["produce", "consume"]`, at least one) | `null` |
//! | `namespaces.revoke-permission` | `namespace`, `role` | `null` |
//! | `namespaces.permissions` | `namespace` | `{ROLE: ["consume", "produce"], …}` |
//! | `topics.grant-permission` | `topic`, `role`, `actions` | `null` |
//! | `topics.revoke-permission` | `topic`, `role` | `null` |
//! | `topics.permissions` | `topic` | `{ROLE: [ACTION, …], …}` (this topic's own grants) |
//! | `subscriptions.skip-damaged` | `topic` (not a partitioned topic's name), `subscription` | `{"skipped": "L:E:P:-1"}` |
//! | `subscriptions.create` | `topic`, `subscription`, optional `position`: `"latest"` (default), `"earliest"` or `"L:E:P:B"` | `null` |
//! | `subscriptions.delete` | `topic`, `subscription`, optional `force` (false: refused while consumers are connected) | `null` |
//! | `subscriptions.skip` | `topic`, `subscription`, `count` (entries) | `null` |
//! | `subscriptions.clear-backlog` | `topic`, `subscription` | `null` |
//! | `subscriptions.reset-cursor` | `topic`, `subscription`, and `time_ms` (publish time) or `message_id` (`"L:E:P:B"`) | `null` |
//! | `subscriptions.expire` | `topic`, `subscription`, `expiry_s` | `null` |
//! | `subscriptions.peek` | `topic` (not a partitioned topic's name), `subscription`, optional `position` (1), `count` (1) | as `messages.find` |
//!
//! Objects built as `serde_json::Value` list their fields sorted by name
//! (serde_json without `preserve_order`); that order is part of the
//! contract, hence the sorted field lists above.

use base64::Engine as _;
use magnetar_core::api::{
    AdminReply, AdminRequest, FoundMessage, LastMessageId, PermissionResource, PolicyChange, SeekTarget,
    SubscriptionOp, SubscriptionStart, TopicOwner, TopicStats,
};
use magnetar_core::authz::AuthAction;
use magnetar_core::metadata::TenantInfo;
use magnetar_core::{Broker, CoreError, TopicName};
use magnetar_wire::{ErrorCode, MessageId};
use serde::{Deserialize, Deserializer, Serialize};
use serde_json::{json, Map, Value};
use std::collections::BTreeSet;

use crate::native::NativeDoor;
use crate::session::Session;
use magnetar_wire::Command;
use std::rc::Rc;

/// Runs the admin operation `op` with the JSON object `json` on `broker`;
/// answers JSON text. `local_addr` (the address the connection reached)
/// names the broker in lookup answers.
pub(crate) async fn run(broker: &Broker, op: &str, json: &str, local_addr: Option<&str>) -> Result<String, CoreError> {
    let request = parse(op, json)?;
    let mut reply = broker.admin(request).await?;
    if let AdminReply::Lookup(lookup) = &mut reply {
        lookup.broker = local_addr.map(str::to_string);
    }
    Ok(render(&reply))
}

// ------------------------------------------------------------------ requests

fn bad_args(op: &str, why: impl std::fmt::Display) -> CoreError {
    CoreError::new(ErrorCode::ProtocolError, format!("admin {op}: {why}"))
}

fn str_arg(op: &str, args: &Value, name: &str) -> Result<String, CoreError> {
    args.get(name)
        .and_then(Value::as_str)
        .map(str::to_string)
        .ok_or_else(|| bad_args(op, format!("missing string argument {name:?}")))
}

fn u32_arg(op: &str, args: &Value, name: &str) -> Result<u32, CoreError> {
    args.get(name)
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| bad_args(op, format!("missing integer argument {name:?}")))
}

/// An optional string argument: absent or null is `None`.
fn opt_str_arg(op: &str, args: &Value, name: &str) -> Result<Option<String>, CoreError> {
    match args.get(name) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(_) => Err(bad_args(op, format!("argument {name:?} must be a string"))),
    }
}

/// Most names one `topics.list` page may ask for: a page is held whole on
/// every shard and in one answer frame.
pub const TOPICS_PAGE_MAX: u32 = 100_000;

fn i64_arg(op: &str, args: &Value, name: &str) -> Result<i64, CoreError> {
    args.get(name).and_then(Value::as_i64).ok_or_else(|| bad_args(op, format!("missing integer argument {name:?}")))
}

fn topic_arg(op: &str, args: &Value) -> Result<TopicName, CoreError> {
    let t = str_arg(op, args, "topic")?;
    TopicName::parse(&t).map_err(|e| CoreError::new(ErrorCode::InvalidTopicName, e.to_string()))
}

fn u64_arg(op: &str, args: &Value, name: &str) -> Result<u64, CoreError> {
    args.get(name).and_then(Value::as_u64).ok_or_else(|| bad_args(op, format!("missing integer argument {name:?}")))
}

fn id_arg(op: &str, text: &str) -> Result<MessageId, CoreError> {
    text.parse().map_err(|e| bad_args(op, e))
}

/// The [`SubscriptionOp`] of a `subscriptions.*` operation.
fn subscription_op(op: &str, args: &Value) -> Result<SubscriptionOp, CoreError> {
    let optional_u64 = |name: &str, default: u64| match args.get(name) {
        None | Some(Value::Null) => Ok(default),
        Some(_) => u64_arg(op, args, name),
    };
    Ok(match op {
        "subscriptions.create" => {
            let at = match args.get("position").and_then(Value::as_str) {
                None | Some("latest") => SubscriptionStart::Latest,
                Some("earliest") => SubscriptionStart::Earliest,
                Some(id) => SubscriptionStart::Id(id_arg(op, id)?),
            };
            SubscriptionOp::Create { at }
        }
        "subscriptions.delete" => {
            SubscriptionOp::Delete { force: args.get("force").and_then(Value::as_bool) == Some(true) }
        }
        "subscriptions.skip" => SubscriptionOp::Skip { count: u64_arg(op, args, "count")? },
        "subscriptions.clear-backlog" => SubscriptionOp::ClearBacklog,
        "subscriptions.reset-cursor" => {
            let to = match (args.get("time_ms"), args.get("message_id").and_then(Value::as_str)) {
                (Some(_), None) => SeekTarget::PublishTime(u64_arg(op, args, "time_ms")?),
                (None, Some(id)) => SeekTarget::Id(id_arg(op, id)?),
                _ => return Err(bad_args(op, "give exactly one of \"time_ms\" and \"message_id\"")),
            };
            SubscriptionOp::ResetCursor { to }
        }
        "subscriptions.expire" => SubscriptionOp::Expire { older_than_s: u64_arg(op, args, "expiry_s")? },
        _ => {
            let count = u32::try_from(optional_u64("count", 1)?).map_err(|_| bad_args(op, "count is too large"))?;
            SubscriptionOp::Peek { position: optional_u64("position", 1)?, count }
        }
    })
}

/// A field given in a partial policies object: present means set (`null`
/// is refused as a bad value, as it is for a whole policies document).
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
}

/// The fields of `metadata::Policies`, in its order (serde's "expected one
/// of" lists them), each optional.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct PolicyFields {
    #[serde(default, deserialize_with = "present")]
    retention_minutes: Option<i64>,
    #[serde(default, deserialize_with = "present")]
    retention_size_mb: Option<i64>,
    #[serde(default, deserialize_with = "present")]
    message_ttl_seconds: Option<u64>,
    #[serde(default, deserialize_with = "present")]
    deduplication: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    max_producers_per_topic: Option<u32>,
    #[serde(default, deserialize_with = "present")]
    max_consumers_per_topic: Option<u32>,
    #[serde(default, deserialize_with = "present")]
    auto_topic_creation: Option<bool>,
    #[serde(default, deserialize_with = "present")]
    default_partitions: Option<u32>,
    #[serde(default, deserialize_with = "present")]
    bundles: Option<u32>,
}

/// The optional `policies` argument: absent changes nothing.
fn policies_arg(op: &str, args: &Value) -> Result<PolicyChange, CoreError> {
    let Some(over) = args.get("policies") else { return Ok(PolicyChange::default()) };
    if !over.is_object() {
        return Err(bad_args(op, "policies must be a JSON object"));
    }
    let f = PolicyFields::deserialize(over)
        .map_err(|e| CoreError::new(ErrorCode::NotAllowed, format!("admin {op}: {e}")))?;
    Ok(PolicyChange {
        retention_minutes: f.retention_minutes,
        retention_size_mb: f.retention_size_mb,
        message_ttl_seconds: f.message_ttl_seconds,
        deduplication: f.deduplication,
        max_producers_per_topic: f.max_producers_per_topic,
        max_consumers_per_topic: f.max_consumers_per_topic,
        auto_topic_creation: f.auto_topic_creation,
        default_partitions: f.default_partitions,
        bundles: f.bundles,
    })
}

/// The namespace (`namespaces.*`) or topic (`topics.*`) a permission op is on.
fn resource_arg(op: &str, args: &Value) -> Result<PermissionResource, CoreError> {
    if op.starts_with("topics.") {
        Ok(PermissionResource::Topic(topic_arg(op, args)?))
    } else {
        Ok(PermissionResource::Namespace(str_arg(op, args, "namespace")?))
    }
}

/// `actions`: a non-empty array of `"produce"` and `"consume"`.
fn actions_arg(op: &str, args: &Value) -> Result<BTreeSet<AuthAction>, CoreError> {
    let list = args
        .get("actions")
        .and_then(Value::as_array)
        .ok_or_else(|| bad_args(op, "missing array argument \"actions\""))?;
    let mut actions = BTreeSet::new();
    for a in list {
        let action = a.as_str().and_then(AuthAction::parse).ok_or_else(|| {
            CoreError::new(ErrorCode::NotAllowed, format!("admin {op}: unknown action {a} (produce, consume)"))
        })?;
        actions.insert(action);
    }
    if actions.is_empty() {
        return Err(CoreError::new(ErrorCode::NotAllowed, format!("admin {op}: grant at least one action")));
    }
    Ok(actions)
}

/// The request `op` names, with its arguments from the JSON object `json`
/// (empty: no arguments).
pub(crate) fn parse(op: &str, json: &str) -> Result<AdminRequest, CoreError> {
    let args: Value = if json.trim().is_empty() {
        Value::Object(Map::new())
    } else {
        serde_json::from_str(json).map_err(|e| bad_args(op, format!("arguments are not JSON: {e}")))?
    };
    let args = &args;
    let topic = || topic_arg(op, args);
    Ok(match op {
        "tenants.list" => AdminRequest::ListTenants,
        "tenants.create" => {
            let tenant = str_arg(op, args, "tenant")?;
            // Malformed roles or clusters are ignored, as they always were.
            let info = TenantInfo::deserialize(args).unwrap_or_default();
            AdminRequest::CreateTenant { tenant, info }
        }
        "tenants.get" => AdminRequest::GetTenant { tenant: str_arg(op, args, "tenant")? },
        "tenants.delete" => AdminRequest::DeleteTenant { tenant: str_arg(op, args, "tenant")? },
        "namespaces.list" => AdminRequest::ListNamespaces { tenant: str_arg(op, args, "tenant")? },
        "namespaces.create" => {
            let namespace = str_arg(op, args, "namespace")?;
            AdminRequest::CreateNamespace { namespace, policies: policies_arg(op, args)? }
        }
        "namespaces.delete" => AdminRequest::DeleteNamespace { namespace: str_arg(op, args, "namespace")? },
        "namespaces.policies" => AdminRequest::GetPolicies { namespace: str_arg(op, args, "namespace")? },
        "namespaces.set-policies" => {
            let namespace = str_arg(op, args, "namespace")?;
            AdminRequest::SetPolicies { namespace, policies: policies_arg(op, args)? }
        }
        "topics.create" => AdminRequest::CreateTopic { topic: topic()? },
        "topics.create-partitioned" => {
            let topic = topic()?;
            AdminRequest::CreatePartitionedTopic { topic, partitions: u32_arg(op, args, "partitions")? }
        }
        "topics.update-partitioned" => {
            let topic = topic()?;
            AdminRequest::UpdatePartitionedTopic { topic, partitions: u32_arg(op, args, "partitions")? }
        }
        "topics.partitioned-metadata" => AdminRequest::PartitionedMetadata { topic: topic()? },
        "topics.list" => {
            let limit = match args.get("limit") {
                None | Some(Value::Null) => None,
                Some(_) => match u32_arg(op, args, "limit")? {
                    l @ 1..=TOPICS_PAGE_MAX => Some(l),
                    l => return Err(bad_args(op, format!("limit must be 1..={TOPICS_PAGE_MAX}, got {l}"))),
                },
            };
            AdminRequest::ListTopics {
                namespace: str_arg(op, args, "namespace")?,
                after: opt_str_arg(op, args, "after")?,
                limit,
            }
        }
        "topics.delete" => AdminRequest::DeleteTopic { topic: topic()? },
        "topics.last-message-id" => AdminRequest::LastMessageId { topic: topic()? },
        "messages.find" => {
            let topic = topic()?;
            let key = str_arg(op, args, "key")?;
            let before_ms = match args.get("before_ms") {
                None | Some(Value::Null) => None,
                Some(v) => {
                    Some(v.as_u64().ok_or_else(|| bad_args(op, "before_ms must be a non-negative integer (ms)"))?)
                }
            };
            let limit = match args.get("limit") {
                None | Some(Value::Null) => 10,
                Some(_) => u32_arg(op, args, "limit")?,
            };
            AdminRequest::FindMessages { topic, key, before_ms, limit }
        }
        "topics.lookup" => AdminRequest::Lookup { topic: topic()? },
        "topics.owner" => AdminRequest::Owner { topic: topic()? },
        "broker.shard-stats" => AdminRequest::ShardStats,
        "topics.set-retention" => {
            let topic = topic()?;
            let retention = magnetar_core::metadata::TopicRetention {
                retention_minutes: i64_arg(op, args, "retention_minutes")?,
                retention_size_mb: i64_arg(op, args, "retention_size_mb")?,
            };
            AdminRequest::SetRetention { topic, retention }
        }
        "topics.get-retention" => AdminRequest::GetRetention { topic: topic()? },
        "topics.remove-retention" => AdminRequest::RemoveRetention { topic: topic()? },
        "topics.set-message-ttl" => {
            let topic = topic()?;
            let seconds = args
                .get("message_ttl_seconds")
                .and_then(Value::as_u64)
                .ok_or_else(|| bad_args(op, "missing integer argument \"message_ttl_seconds\" (>= 0)"))?;
            AdminRequest::SetMessageTtl { topic, seconds }
        }
        "topics.get-message-ttl" => AdminRequest::GetMessageTtl { topic: topic()? },
        "topics.remove-message-ttl" => AdminRequest::RemoveMessageTtl { topic: topic()? },
        "namespaces.grant-permission" | "topics.grant-permission" => AdminRequest::GrantPermission {
            resource: resource_arg(op, args)?,
            role: str_arg(op, args, "role")?,
            actions: actions_arg(op, args)?,
        },
        "namespaces.revoke-permission" | "topics.revoke-permission" => {
            AdminRequest::RevokePermission { resource: resource_arg(op, args)?, role: str_arg(op, args, "role")? }
        }
        "namespaces.permissions" | "topics.permissions" => {
            AdminRequest::GetPermissions { resource: resource_arg(op, args)? }
        }
        "subscriptions.skip-damaged" => {
            AdminRequest::SkipDamaged { topic: topic()?, subscription: str_arg(op, args, "subscription")? }
        }
        "subscriptions.create"
        | "subscriptions.delete"
        | "subscriptions.skip"
        | "subscriptions.clear-backlog"
        | "subscriptions.reset-cursor"
        | "subscriptions.expire"
        | "subscriptions.peek" => AdminRequest::Subscription {
            topic: topic()?,
            subscription: str_arg(op, args, "subscription")?,
            op: subscription_op(op, args)?,
        },
        other => return Err(CoreError::new(ErrorCode::NotAllowed, format!("unknown admin operation {other:?}"))),
    })
}

// ------------------------------------------------------------------- replies

/// An owner as lookup and owner answers list it (fields sorted by name).
#[derive(Serialize)]
struct OwnerJson<'a> {
    bundle: u32,
    shard: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    shard_port: Option<u16>,
    topic: &'a str,
}

impl<'a> From<&'a TopicOwner> for OwnerJson<'a> {
    fn from(o: &'a TopicOwner) -> Self {
        Self { bundle: o.bundle, shard: o.shard, shard_port: o.shard_port, topic: &o.topic }
    }
}

/// A lookup answer: fields sorted by name, then `broker` (added last when
/// it was spliced into the core's JSON).
#[derive(Serialize)]
struct LookupJson<'a> {
    bundle: u32,
    partition_owners: Vec<OwnerJson<'a>>,
    partitions: u32,
    shard: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    shard_port: Option<u16>,
    topic: &'a str,
    #[serde(skip_serializing_if = "Option::is_none")]
    broker: Option<&'a str>,
}

fn id_json(id: Option<MessageId>) -> Value {
    json!({ "id": id.map(|id| id.to_string()) })
}

fn found_json(m: &FoundMessage) -> Value {
    let mut v = json!({
        "id": m.id.to_string(),
        "key": m.key,
        "properties": m.properties,
        "publish_time_ms": m.publish_time_ms,
        "payload_size": m.payload.len(),
        "payload_base64": base64::engine::general_purpose::STANDARD.encode(&m.payload),
        "topic": m.topic,
    });
    if let Some(c) = &m.compressed {
        v["compression"] = json!(format!("{:?}", c.compression));
        v["batch_messages"] = json!(c.messages);
    }
    v
}

/// `reply` as the JSON text the native protocol answers.
pub(crate) fn render(reply: &AdminReply) -> String {
    let v = match reply {
        AdminReply::Done => Value::Null,
        AdminReply::Names(names) => json!(names),
        AdminReply::Tenant(info) => json!(info),
        AdminReply::Policies(p) => json!(p),
        AdminReply::Partitions(n) => json!({ "partitions": n }),
        AdminReply::Skipped(id) => json!({ "skipped": id.to_string() }),
        AdminReply::LastMessageId(LastMessageId::Topic(id)) => id_json(*id),
        AdminReply::LastMessageId(LastMessageId::Partitioned(ids)) => {
            json!({ "partitions": ids.iter().map(|id| id_json(*id)).collect::<Vec<_>>() })
        }
        AdminReply::Found(found) => {
            let messages: Vec<Value> = found.messages.iter().map(found_json).collect();
            json!({ "messages": messages, "truncated": found.truncated })
        }
        // Not asked for over this door (its peek is by message); the
        // entry's id and size if it ever is.
        AdminReply::Entry(e) => json!({ "id": e.id.to_string(), "bytes": e.blob.len() }),
        AdminReply::Lookup(l) => {
            let answer = LookupJson {
                bundle: l.owner.bundle,
                partition_owners: l.partition_owners.iter().map(OwnerJson::from).collect(),
                partitions: l.partitions,
                shard: l.owner.shard,
                shard_port: l.owner.shard_port,
                topic: &l.owner.topic,
                broker: l.broker.as_deref(),
            };
            return serde_json::to_string(&answer).unwrap_or_default();
        }
        AdminReply::Owner(o) => return serde_json::to_string(&OwnerJson::from(o)).unwrap_or_default(),
        AdminReply::ShardStats(shards) => {
            let shards: Vec<Value> = shards
                .iter()
                .map(|s| {
                    let mut entry = json!({
                        "shard": s.traffic.shard,
                        "cross_shard_requests": s.traffic.cross_shard_requests,
                        "cross_shard_events": s.traffic.cross_shard_events,
                    });
                    if let Some(port) = s.port {
                        entry["port"] = json!(port);
                    }
                    entry
                })
                .collect();
            json!({ "shards": shards })
        }
        AdminReply::Retention(r) => r.map_or(Value::Null, |r| json!(r)),
        AdminReply::MessageTtl(s) => s.map_or(Value::Null, |s| json!({ "message_ttl_seconds": s })),
        AdminReply::Permissions(p) => json!(p),
    };
    v.to_string()
}

// --------------------------------------------------------------- topic stats

/// A topic's statistics as the `TopicStats` frame's JSON (`magnetar admin
/// subscriptions stats`). Layout, in this order: `{"topic":…,
/// "next_entry":…,"ledgers":[{"ledger":…,"first":…,"entries":…,"bytes":…}],
/// "subscriptions":{NAME:{"type":…,"ack_floor":…,"msg_backlog":…,
/// "backlog_messages":…,"backlog_bytes":…,"unacked":…,"delayed":…,
/// "replay":…,"msg_out_total":…,"msg_rate_in":…,"byte_rate_in":…,
/// "msg_rate_out":…,"byte_rate_out":…,"durable":…,"filter_tag":…,
/// "allocation":…,"entries_read":…,"skipped_by_index":…,"partial_batches":…,
/// "consumers":[{"name":…,"priority":…,"permits":…,"unacked":…,
/// "active":…,"address":…,"redelivered":…}]}}}`; rates with one decimal; `msg_rate_in` and
/// `byte_rate_in` are the topic's, repeated in every subscription.
pub(crate) fn render_topic_stats(s: &TopicStats) -> String {
    let ledgers: Vec<String> = s
        .ledgers
        .iter()
        .map(|x| {
            format!("{{\"ledger\":{},\"first\":{},\"entries\":{},\"bytes\":{}}}", x.ledger, x.first, x.entries, x.bytes)
        })
        .collect();
    let mut out = format!(
        "{{\"topic\":{},\"next_entry\":{},\"ledgers\":[{}],\"subscriptions\":{{",
        quote(&s.topic),
        s.next_entry,
        ledgers.join(",")
    );
    for (i, sub) in s.subscriptions.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        let filter = sub.filter_tag.as_deref().map_or_else(|| "null".to_string(), quote);
        out.push_str(&format!(
            "{}:{{\"type\":\"{:?}\",\"ack_floor\":{},\"msg_backlog\":{},\"backlog_messages\":{},\"backlog_bytes\":{},\"unacked\":{},\"delayed\":{},\"replay\":{},\"msg_out_total\":{},\"msg_rate_in\":{:.1},\"byte_rate_in\":{:.1},\"msg_rate_out\":{:.1},\"byte_rate_out\":{:.1},\"durable\":{},\"filter_tag\":{},\"allocation\":\"{}\",\"entries_read\":{},\"skipped_by_index\":{},\"partial_batches\":{},\"consumers\":[",
            quote(&sub.name),
            sub.sub_type,
            sub.ack_floor,
            sub.msg_backlog,
            sub.backlog_messages,
            sub.backlog_bytes,
            sub.unacked,
            sub.delayed,
            sub.replay,
            sub.msg_out_total,
            s.msg_rate_in,
            s.byte_rate_in,
            sub.msg_rate_out,
            sub.byte_rate_out,
            sub.durable,
            filter,
            sub.allocation,
            sub.entries_read,
            sub.skipped_by_index,
            sub.partial_batches,
        ));
        for (j, c) in sub.consumers.iter().enumerate() {
            if j > 0 {
                out.push(',');
            }
            out.push_str(&format!(
                "{{\"name\":{},\"priority\":{},\"permits\":{},\"unacked\":{},\"active\":{},\"address\":{},\"redelivered\":{}}}",
                quote(&c.name),
                c.priority,
                c.permits,
                c.unacked,
                c.active,
                quote(&c.address),
                c.redelivered
            ));
        }
        out.push_str("]}");
    }
    out.push_str("}}");
    out
}

/// A JSON string literal (control characters as `\u00XX`).
fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for ch in s.chars() {
        match ch {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// Per-subscription statistics of `topic`, answered as JSON. Awaited
/// before the connection's next request is read.
pub(super) async fn topic_stats(session: &Rc<Session<NativeDoor>>, request_id: u64, topic: String) {
    match session.broker_handle().topic_stats(&topic).await {
        Ok(stats) => {
            let stats = Command::TopicStats { request_id, topic, json: render_topic_stats(&stats) };
            session.out().put("topic stats", |_, dst| super::push(dst, &stats));
        }
        Err(e) => session.out().error(request_id, &e),
    }
}

/// An admin or lookup operation, in its own task: the connection's other
/// requests go on meanwhile.
pub(super) fn spawn_admin(session: &Rc<Session<NativeDoor>>, request_id: u64, op: String, json: String) {
    let session = session.clone();
    glommio::spawn_local(async move {
        let broker = session.broker_handle();
        match run(&broker, &op, &json, session.local_addr()).await {
            Ok(json) => {
                let response = Command::AdminResponse { request_id, json };
                session.out().put("an admin response", |_, dst| super::push(dst, &response));
            }
            Err(e) => session.out().error(request_id, &e),
        }
    })
    .detach();
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use magnetar_core::api::{
        CompressedBatch, ConsumerStats, FoundMessages, LedgerStats, ShardStats, SubscriptionStats, TopicLookup,
    };
    use magnetar_core::metadata::{Policies, TopicRetention};
    use magnetar_core::ShardTraffic;
    use magnetar_wire::{CompressionType, SubscriptionType};

    fn err(op: &str, json: &str) -> CoreError {
        match parse(op, json) {
            Ok(r) => panic!("{op} {json}: parsed as {r:?}"),
            Err(e) => e,
        }
    }

    fn topic(t: &str) -> TopicName {
        TopicName::parse(t).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn requests_parse_with_typed_arguments() {
        let t = || topic("persistent://public/default/t");
        assert_eq!(parse("tenants.list", ""), Ok(AdminRequest::ListTenants));
        assert_eq!(parse("broker.shard-stats", "  "), Ok(AdminRequest::ShardStats));
        assert_eq!(
            parse("topics.create-partitioned", r#"{"topic":"t","partitions":3}"#),
            Ok(AdminRequest::CreatePartitionedTopic { topic: t(), partitions: 3 })
        );
        assert_eq!(
            parse("messages.find", r#"{"topic":"t","key":"k","before_ms":null}"#),
            Ok(AdminRequest::FindMessages { topic: t(), key: "k".into(), before_ms: None, limit: 10 })
        );
        assert_eq!(
            parse("messages.find", r#"{"topic":"t","key":"k","before_ms":5,"limit":2}"#),
            Ok(AdminRequest::FindMessages { topic: t(), key: "k".into(), before_ms: Some(5), limit: 2 })
        );
        assert_eq!(
            parse("topics.set-retention", r#"{"topic":"t","retention_minutes":-1,"retention_size_mb":7}"#),
            Ok(AdminRequest::SetRetention {
                topic: t(),
                retention: TopicRetention { retention_minutes: -1, retention_size_mb: 7 }
            })
        );
        assert_eq!(
            parse("tenants.create", r#"{"tenant":"a","admin_roles":["r"]}"#),
            Ok(AdminRequest::CreateTenant {
                tenant: "a".into(),
                info: TenantInfo { admin_roles: vec!["r".into()], allowed_clusters: vec![] }
            })
        );
        // Malformed tenant info is ignored, not refused.
        assert_eq!(
            parse("tenants.create", r#"{"tenant":"a","admin_roles":5}"#),
            Ok(AdminRequest::CreateTenant { tenant: "a".into(), info: TenantInfo::default() })
        );
    }

    #[test]
    fn bad_arguments_keep_their_codes_and_messages() {
        let cases = [
            ("topics.create", "{", ErrorCode::ProtocolError, "admin topics.create: arguments are not JSON: "),
            ("topics.create", "{}", ErrorCode::ProtocolError, "admin topics.create: missing string argument \"topic\""),
            ("topics.create", r#"{"topic":"a/b"}"#, ErrorCode::InvalidTopicName, "invalid topic name \"a/b\": "),
            (
                "topics.create-partitioned",
                r#"{"topic":"t","partitions":-1}"#,
                ErrorCode::ProtocolError,
                "admin topics.create-partitioned: missing integer argument \"partitions\"",
            ),
            (
                "topics.update-partitioned",
                r#"{"topic":"t","partitions":4294967296}"#,
                ErrorCode::ProtocolError,
                "admin topics.update-partitioned: missing integer argument \"partitions\"",
            ),
            (
                "messages.find",
                r#"{"topic":"t","key":"k","before_ms":-1}"#,
                ErrorCode::ProtocolError,
                "admin messages.find: before_ms must be a non-negative integer (ms)",
            ),
            (
                "messages.find",
                r#"{"topic":"t","key":"k","limit":"x"}"#,
                ErrorCode::ProtocolError,
                "admin messages.find: missing integer argument \"limit\"",
            ),
            (
                "topics.set-message-ttl",
                r#"{"topic":"t","message_ttl_seconds":-1}"#,
                ErrorCode::ProtocolError,
                "admin topics.set-message-ttl: missing integer argument \"message_ttl_seconds\" (>= 0)",
            ),
            (
                "topics.set-retention",
                r#"{"topic":"t","retention_minutes":1}"#,
                ErrorCode::ProtocolError,
                "admin topics.set-retention: missing integer argument \"retention_size_mb\"",
            ),
            (
                "namespaces.set-policies",
                r#"{"namespace":"a/b","policies":null}"#,
                ErrorCode::ProtocolError,
                "admin namespaces.set-policies: policies must be a JSON object",
            ),
            ("no.such", "{}", ErrorCode::NotAllowed, "unknown admin operation \"no.such\""),
            ("no.such", "[", ErrorCode::ProtocolError, "admin no.such: arguments are not JSON: "),
        ];
        for (op, json, code, message) in cases {
            let e = err(op, json);
            assert_eq!(e.code, code, "{op} {json}: {e:?}");
            assert!(e.message.starts_with(message), "{op} {json}: {:?} does not start with {message:?}", e.message);
        }
    }

    /// Today's `merge_policies` before the typed API: the given fields
    /// written over the base's JSON, decoded as a whole.
    fn merged_as_before(op: &str, base: &Policies, over: &Value) -> Result<Policies, CoreError> {
        let mut merged = serde_json::to_value(base).unwrap_or_else(|e| panic!("{e}"));
        for (k, v) in over.as_object().unwrap_or_else(|| panic!("not an object")) {
            merged[k] = v.clone();
        }
        serde_json::from_value(merged).map_err(|e| CoreError::new(ErrorCode::NotAllowed, format!("admin {op}: {e}")))
    }

    #[test]
    fn partial_policies_apply_and_fail_as_the_merged_document_did() {
        let base = Policies { bundles: 8, message_ttl_seconds: 30, ..Policies::default() };
        let overs = [
            json!({}),
            json!({"max_producers_per_topic": 2}),
            json!({"retention_minutes": -1, "retention_size_mb": 1024, "deduplication": true}),
            json!({"auto_topic_creation": false, "default_partitions": 4, "bundles": 4, "message_ttl_seconds": 0}),
            json!({"max_consumers_per_topic": 3, "no_such_policy": 1}),
            json!({"zzz": 1, "bundles": "x"}),
            json!({"bundles": null}),
            json!({"bundles": 5_000_000_000u64}),
            json!({"message_ttl_seconds": -5}),
            json!({"deduplication": "yes", "aaa": 1}),
        ];
        for over in overs {
            let args = json!({ "namespace": "a/b", "policies": over });
            let now = parse("namespaces.set-policies", &args.to_string()).map(|r| match r {
                AdminRequest::SetPolicies { policies, .. } => policies.apply(base.clone()),
                other => panic!("{other:?}"),
            });
            assert_eq!(now, merged_as_before("namespaces.set-policies", &base, &over), "policies {over}");
        }
        // Absent: nothing changes.
        match parse("namespaces.create", r#"{"namespace":"a/b"}"#) {
            Ok(AdminRequest::CreateNamespace { policies, .. }) => assert_eq!(policies, PolicyChange::default()),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn replies_render_the_json_text_of_before() {
        assert_eq!(render(&AdminReply::Done), "null");
        assert_eq!(render(&AdminReply::Names(vec!["a".into(), "b\"".into()])), r#"["a","b\""]"#);
        assert_eq!(render(&AdminReply::Tenant(TenantInfo::default())), r#"{"admin_roles":[],"allowed_clusters":[]}"#);
        assert_eq!(
            render(&AdminReply::Policies(Policies { retention_minutes: -1, ..Policies::default() })),
            r#"{"auto_topic_creation":true,"bundles":16,"deduplication":false,"default_partitions":0,"max_consumers_per_topic":0,"max_producers_per_topic":0,"message_ttl_seconds":0,"retention_minutes":-1,"retention_size_mb":0}"#
        );
        assert_eq!(render(&AdminReply::Partitions(3)), r#"{"partitions":3}"#);
        let id = MessageId::new(7, 9, -1, -1);
        assert_eq!(render(&AdminReply::LastMessageId(LastMessageId::Topic(Some(id)))), r#"{"id":"7:9:-1:-1"}"#);
        assert_eq!(render(&AdminReply::LastMessageId(LastMessageId::Topic(None))), r#"{"id":null}"#);
        assert_eq!(
            render(&AdminReply::LastMessageId(LastMessageId::Partitioned(vec![
                None,
                Some(MessageId::new(1, 2, 1, -1))
            ]))),
            r#"{"partitions":[{"id":null},{"id":"1:2:1:-1"}]}"#
        );
        assert_eq!(
            render(&AdminReply::Retention(Some(TopicRetention { retention_minutes: 5, retention_size_mb: -1 }))),
            r#"{"retention_minutes":5,"retention_size_mb":-1}"#
        );
        assert_eq!(render(&AdminReply::Retention(None)), "null");
        assert_eq!(render(&AdminReply::MessageTtl(Some(1))), r#"{"message_ttl_seconds":1}"#);
        assert_eq!(render(&AdminReply::MessageTtl(None)), "null");
        let traffic = |shard| ShardTraffic { shard, cross_shard_requests: 5, cross_shard_events: 6 };
        assert_eq!(
            render(&AdminReply::ShardStats(vec![
                ShardStats { traffic: traffic(0), port: Some(7001) },
                ShardStats { traffic: traffic(1), port: None },
            ])),
            r#"{"shards":[{"cross_shard_events":6,"cross_shard_requests":5,"port":7001,"shard":0},{"cross_shard_events":6,"cross_shard_requests":5,"shard":1}]}"#
        );
    }

    #[test]
    fn lookup_and_owner_render_with_the_broker_last() {
        let owner =
            |topic: &str, bundle, shard, shard_port| TopicOwner { topic: topic.into(), bundle, shard, shard_port };
        let t = "persistent://public/default/t";
        let mut lookup = TopicLookup {
            owner: owner(t, 3, 1, Some(7002)),
            partitions: 1,
            partition_owners: vec![owner("persistent://public/default/t-partition-0", 1, 0, Some(7001))],
            broker: Some("127.0.0.1:6650".into()),
        };
        assert_eq!(
            render(&AdminReply::Lookup(lookup.clone())),
            r#"{"bundle":3,"partition_owners":[{"bundle":1,"shard":0,"shard_port":7001,"topic":"persistent://public/default/t-partition-0"}],"partitions":1,"shard":1,"shard_port":7002,"topic":"persistent://public/default/t","broker":"127.0.0.1:6650"}"#
        );
        lookup.broker = None;
        lookup.owner.shard_port = None;
        lookup.partition_owners.clear();
        lookup.partitions = 0;
        assert_eq!(
            render(&AdminReply::Lookup(lookup)),
            r#"{"bundle":3,"partition_owners":[],"partitions":0,"shard":1,"topic":"persistent://public/default/t"}"#
        );
        assert_eq!(
            render(&AdminReply::Owner(owner(t, 2, 0, None))),
            r#"{"bundle":2,"shard":0,"topic":"persistent://public/default/t"}"#
        );
    }

    #[test]
    fn found_messages_render_sorted_fields_and_base64() {
        let m = FoundMessage {
            id: MessageId::new(4, 5, 2, 1),
            key: "k".into(),
            properties: [("b".to_string(), "2".to_string()), ("a".to_string(), "1".to_string())].into(),
            publish_time_ms: 1_700_000_000_000,
            payload: Bytes::from_static(b"hi"),
            topic: "persistent://public/default/f-partition-2".into(),
            compressed: None,
        };
        let zipped = FoundMessage {
            id: MessageId::new(4, 6, 2, -1),
            compressed: Some(CompressedBatch { compression: CompressionType::Lz4, messages: 3 }),
            ..m.clone()
        };
        assert_eq!(
            render(&AdminReply::Found(FoundMessages { messages: vec![m, zipped], truncated: true })),
            concat!(
                r#"{"messages":[{"id":"4:5:2:1","key":"k","payload_base64":"aGk=","payload_size":2,"properties":{"a":"1","b":"2"},"publish_time_ms":1700000000000,"topic":"persistent://public/default/f-partition-2"},"#,
                r#"{"batch_messages":3,"compression":"Lz4","id":"4:6:2:-1","key":"k","payload_base64":"aGk=","payload_size":2,"properties":{"a":"1","b":"2"},"publish_time_ms":1700000000000,"topic":"persistent://public/default/f-partition-2"}],"truncated":true}"#
            )
        );
    }

    #[test]
    fn topic_stats_render_in_their_fixed_order() {
        let sub = |name: &str, consumers| SubscriptionStats {
            name: name.into(),
            sub_type: SubscriptionType::KeyShared,
            ack_floor: 3,
            msg_backlog: 4,
            backlog_messages: 5,
            backlog_bytes: 6,
            unacked: 7,
            delayed: 8,
            replay: 9,
            msg_out_total: 10,
            msg_rate_out: 2.25,
            byte_rate_out: 0.0,
            durable: true,
            filter_tag: None,
            allocation: "round-robin",
            entries_read: 11,
            skipped_by_index: 12,
            partial_batches: 13,
            consumers,
        };
        let c = |name: &str, active| ConsumerStats {
            name: name.into(),
            priority: -1,
            permits: 100,
            unacked: 2,
            active,
            address: String::new(),
            redelivered: 0,
        };
        let mut tagged = sub("s\n2", vec![]);
        tagged.filter_tag = Some("x\"".into());
        tagged.sub_type = SubscriptionType::Failover;
        let stats = TopicStats {
            topic: "persistent://public/default/t".into(),
            next_entry: 42,
            ledgers: vec![
                LedgerStats { ledger: 1, first: 0, entries: 40, bytes: 4000 },
                LedgerStats { ledger: 2, first: 40, entries: 2, bytes: 200 },
            ],
            msg_rate_in: 1.04,
            byte_rate_in: 1234.56,
            subscriptions: vec![sub("s1", vec![c("a", true), c("b", false)]), tagged],
        };
        assert_eq!(
            render_topic_stats(&stats),
            concat!(
                r#"{"topic":"persistent://public/default/t","next_entry":42,"ledgers":[{"ledger":1,"first":0,"entries":40,"bytes":4000},{"ledger":2,"first":40,"entries":2,"bytes":200}],"subscriptions":{"#,
                r#""s1":{"type":"KeyShared","ack_floor":3,"msg_backlog":4,"backlog_messages":5,"backlog_bytes":6,"unacked":7,"delayed":8,"replay":9,"msg_out_total":10,"msg_rate_in":1.0,"byte_rate_in":1234.6,"msg_rate_out":2.2,"byte_rate_out":0.0,"durable":true,"filter_tag":null,"allocation":"round-robin","entries_read":11,"skipped_by_index":12,"partial_batches":13,"consumers":[{"name":"a","priority":-1,"permits":100,"unacked":2,"active":true,"address":"","redelivered":0},{"name":"b","priority":-1,"permits":100,"unacked":2,"active":false,"address":"","redelivered":0}]},"#,
                r#""s\u000a2":{"type":"Failover","ack_floor":3,"msg_backlog":4,"backlog_messages":5,"backlog_bytes":6,"unacked":7,"delayed":8,"replay":9,"msg_out_total":10,"msg_rate_in":1.0,"byte_rate_in":1234.6,"msg_rate_out":2.2,"byte_rate_out":0.0,"durable":true,"filter_tag":"x\"","allocation":"round-robin","entries_read":11,"skipped_by_index":12,"partial_batches":13,"consumers":[]}}}"#
            )
        );
        // Whatever the names hold, the text is JSON.
        let v: Value = serde_json::from_str(&render_topic_stats(&stats)).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(v["subscriptions"]["s\n2"]["filter_tag"], "x\"");
    }

    #[test]
    fn quotes_escape() {
        assert_eq!(quote("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
    }
}
