//! Admin and lookup operations, executed on shard 0 (which owns the
//! metadata store). Each operation is named (`op`) and takes a JSON object;
//! it answers a JSON value. The native protocol carries them as
//! `AdminRequest`/`AdminResponse`; the CLI's `magnetar admin …` and the
//! client's `Admin` API are thin layers over this list:
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
//! | `topics.lookup` | `topic` | `{"topic", "partitions", "bundle", "shard", "shard_port"?, "partition_owners"}` (the net layer adds `broker`) |
//! | `topics.owner` | `topic` (exactly this name; no side effects) | `{"topic", "bundle", "shard", "shard_port"?}` |
//! | `broker.shard-stats` | – | `{"shards": [{"shard", "port"?, "cross_shard_requests", "cross_shard_events"}, …]}` |
//! | `topics.{set,get,remove}-retention`, `topics.{set,get,remove}-message-ttl` | see [`crate::topic_policies`] | |
//!
//! Runs on shard 0; never crosses cores.

use crate::error::{CoreError, ErrorCode};
use crate::metadata::{parse_namespace, Metadata, Policies, TenantInfo};
use crate::ownership;
use crate::shard::{Op, Reply, Shard, TopicPolicy};
use crate::topic_name::{Domain, TopicName};
use serde_json::{json, Value};
use std::rc::Rc;

pub(crate) fn bad_args(op: &str, why: impl std::fmt::Display) -> CoreError {
    CoreError::new(ErrorCode::ProtocolError, format!("admin {op}: {why}"))
}

fn str_arg<'a>(op: &str, args: &'a Value, name: &str) -> Result<&'a str, CoreError> {
    args.get(name).and_then(Value::as_str).ok_or_else(|| bad_args(op, format!("missing string argument {name:?}")))
}

fn u32_arg(op: &str, args: &Value, name: &str) -> Result<u32, CoreError> {
    args.get(name)
        .and_then(Value::as_u64)
        .and_then(|v| u32::try_from(v).ok())
        .ok_or_else(|| bad_args(op, format!("missing integer argument {name:?}")))
}

pub(crate) fn topic_arg(op: &str, args: &Value) -> Result<TopicName, CoreError> {
    let t = str_arg(op, args, "topic")?;
    TopicName::parse(t).map_err(CoreError::from)
}

pub(crate) fn metadata(shard: &Shard) -> Result<&Metadata, CoreError> {
    shard
        .metadata
        .as_ref()
        .ok_or_else(|| CoreError::new(ErrorCode::UnknownError, "internal: admin operation routed off shard 0"))
}

/// `over` applied field by field on top of `base` (both as JSON), decoded.
fn merge_policies(op: &str, base: &Policies, over: Option<&Value>) -> Result<Policies, CoreError> {
    let mut merged = serde_json::to_value(base).map_err(|e| bad_args(op, e))?;
    if let Some(over) = over {
        let Some(fields) = over.as_object() else {
            return Err(bad_args(op, "policies must be a JSON object"));
        };
        for (k, v) in fields {
            merged[k] = v.clone();
        }
    }
    serde_json::from_value(merged).map_err(|e| CoreError::new(ErrorCode::NotAllowed, format!("admin {op}: {e}")))
}

pub(crate) async fn namespace_must_exist(md: &Metadata, tn: &TopicName) -> Result<Policies, CoreError> {
    let ns = tn.namespace_name();
    md.policies(&ns)
        .await?
        .ok_or_else(|| CoreError::new(ErrorCode::TopicNotFound, format!("namespace {ns:?} does not exist")))
}

/// The policies governing `topic`, after the checks every producer and
/// consumer goes through: its namespace exists, and it is not the name of a
/// partitioned topic (whose data lives in its partitions).
pub(crate) async fn topic_policy(shard: &Rc<Shard>, topic: &str) -> Result<TopicPolicy, CoreError> {
    let md = metadata(shard)?;
    let tn = TopicName::parse(topic)?;
    let policies = namespace_must_exist(md, &tn).await?;
    if let Some(p) = md.partitioned(topic).await? {
        return Err(CoreError::new(
            ErrorCode::NotAllowed,
            format!(
                "{topic} is a partitioned topic with {} partitions: use its partitions {topic}-partition-<i> \
                 (the client SDK does this for you)",
                p.partitions
            ),
        ));
    }
    let mut in_partitioned = false;
    let mut partitioned_base = None;
    if let (Some(i), Some((base, _))) = (tn.partition(), tn.local.rsplit_once("-partition-")) {
        let base = TopicName { local: base.to_string(), ..tn.clone() };
        if let Some(p) = md.partitioned(&base.to_string()).await? {
            if i >= p.partitions {
                return Err(CoreError::new(
                    ErrorCode::TopicNotFound,
                    format!("{base} has {} partitions; there is no partition {i}", p.partitions),
                ));
            }
            in_partitioned = true;
            partitioned_base = Some(base.to_string());
        }
    }
    // Topic-level retention and TTL win over the namespace's.
    let policies = crate::topic_policies::apply(md, &tn.to_string(), partitioned_base.as_deref(), policies).await?;
    Ok(TopicPolicy { policies, in_partitioned })
}

/// Runs `op` with the JSON object `json`; answers JSON text.
pub(crate) async fn execute(shard: Rc<Shard>, op: &str, json: &str) -> Result<String, CoreError> {
    let args: Value = if json.trim().is_empty() {
        Value::Object(Default::default())
    } else {
        serde_json::from_str(json).map_err(|e| bad_args(op, format!("arguments are not JSON: {e}")))?
    };
    let answer = run(&shard, op, &args).await?;
    Ok(answer.to_string())
}

async fn run(shard: &Rc<Shard>, op: &str, args: &Value) -> Result<Value, CoreError> {
    let md = metadata(shard)?;
    match op {
        op if crate::topic_policies::handles(op) => crate::topic_policies::run(shard, op, args).await,
        "tenants.list" => Ok(json!(md.tenants().await?)),
        "tenants.create" => {
            let tenant = str_arg(op, args, "tenant")?;
            let info: TenantInfo = serde_json::from_value(args.clone()).unwrap_or_default();
            md.create_tenant(tenant, info).await?;
            Ok(Value::Null)
        }
        "tenants.get" => {
            let tenant = str_arg(op, args, "tenant")?;
            let info = md
                .tenant(tenant)
                .await?
                .ok_or_else(|| CoreError::new(ErrorCode::TopicNotFound, format!("tenant {tenant:?} does not exist")))?;
            Ok(json!(info))
        }
        "tenants.delete" => {
            md.delete_tenant(str_arg(op, args, "tenant")?).await?;
            Ok(Value::Null)
        }
        "namespaces.list" => {
            let tenant = str_arg(op, args, "tenant")?;
            if md.tenant(tenant).await?.is_none() {
                return Err(CoreError::new(ErrorCode::TopicNotFound, format!("tenant {tenant:?} does not exist")));
            }
            Ok(json!(md.namespaces(tenant).await?))
        }
        "namespaces.create" => {
            let ns = str_arg(op, args, "namespace")?;
            let base = Policies { bundles: shard.config.bundles_per_namespace, ..Policies::default() };
            let policies = merge_policies(op, &base, args.get("policies"))?;
            md.create_namespace(ns, policies).await?;
            Ok(Value::Null)
        }
        "namespaces.delete" => {
            let ns = str_arg(op, args, "namespace")?;
            parse_namespace(ns)?;
            let mut topics = list_topics(shard, ns).await?;
            topics.truncate(10);
            md.delete_namespace(ns, &topics).await?;
            Ok(Value::Null)
        }
        "namespaces.policies" => {
            let ns = str_arg(op, args, "namespace")?;
            let p = md
                .policies(ns)
                .await?
                .ok_or_else(|| CoreError::new(ErrorCode::TopicNotFound, format!("namespace {ns:?} does not exist")))?;
            Ok(json!(p))
        }
        "namespaces.set-policies" => {
            let ns = str_arg(op, args, "namespace")?;
            let old = md
                .policies(ns)
                .await?
                .ok_or_else(|| CoreError::new(ErrorCode::TopicNotFound, format!("namespace {ns:?} does not exist")))?;
            let new = merge_policies(op, &old, args.get("policies"))?;
            md.set_policies(ns, new.clone()).await?;
            Ok(json!(new))
        }
        "topics.create" => {
            let tn = topic_arg(op, args)?;
            check_persistent(&tn)?;
            let topic = tn.to_string();
            let policies = namespace_must_exist(md, &tn).await?;
            if md.partitioned(&topic).await?.is_some() {
                return Err(CoreError::new(ErrorCode::NotAllowed, format!("topic {topic} already exists")));
            }
            let owner = ownership::shard_of(&tn, policies.bundles, shard.nshards);
            shard.call(owner, Op::CreateTopic { topic }).await?;
            Ok(Value::Null)
        }
        "topics.create-partitioned" | "topics.update-partitioned" => {
            let tn = topic_arg(op, args)?;
            check_persistent(&tn)?;
            if tn.partition().is_some() {
                return Err(CoreError::new(
                    ErrorCode::InvalidTopicName,
                    format!("a partitioned topic's name may not end in -partition-<i>: {tn}"),
                ));
            }
            let partitions = u32_arg(op, args, "partitions")?;
            let topic = tn.to_string();
            let policies = namespace_must_exist(md, &tn).await?;
            let create = op == "topics.create-partitioned";
            if create {
                let owner = ownership::shard_of(&tn, policies.bundles, shard.nshards);
                if topic_exists_on(shard, owner, &topic).await? {
                    return Err(CoreError::new(
                        ErrorCode::NotAllowed,
                        format!("a non-partitioned topic {topic} already exists"),
                    ));
                }
            }
            md.set_partitioned(&topic, partitions, create).await?;
            Ok(Value::Null)
        }
        "topics.partitioned-metadata" => {
            let tn = topic_arg(op, args)?;
            let partitions = partitions_of(shard, md, &tn).await?;
            Ok(json!({ "partitions": partitions }))
        }
        "topics.list" => {
            let ns = str_arg(op, args, "namespace")?;
            parse_namespace(ns)?;
            if md.policies(ns).await?.is_none() {
                return Err(CoreError::new(ErrorCode::TopicNotFound, format!("namespace {ns:?} does not exist")));
            }
            Ok(json!(list_topics(shard, ns).await?))
        }
        "topics.delete" => {
            let tn = topic_arg(op, args)?;
            let topic = tn.to_string();
            let policies = namespace_must_exist(md, &tn).await?;
            match md.partitioned(&topic).await? {
                Some(p) => {
                    for i in 0..p.partitions {
                        let part = TopicName { local: format!("{}-partition-{i}", tn.local), ..tn.clone() };
                        let owner = ownership::shard_of(&part, policies.bundles, shard.nshards);
                        match shard.call(owner, Op::DeleteTopic { topic: part.to_string() }).await {
                            // A partition nobody used was never created.
                            Ok(_) => {}
                            Err(e) if e.code == ErrorCode::TopicNotFound => {}
                            Err(e) => return Err(e),
                        }
                        crate::topic_policies::forget(md, &part.to_string()).await?;
                    }
                    md.delete_partitioned(&topic).await?;
                }
                None => {
                    let owner = ownership::shard_of(&tn, policies.bundles, shard.nshards);
                    shard.call(owner, Op::DeleteTopic { topic: topic.clone() }).await?;
                }
            }
            crate::topic_policies::forget(md, &topic).await?;
            Ok(Value::Null)
        }
        "topics.last-message-id" => {
            let tn = topic_arg(op, args)?;
            let policies = namespace_must_exist(md, &tn).await?;
            let last = |part: TopicName| {
                let owner = ownership::shard_of(&part, policies.bundles, shard.nshards);
                shard.call(owner, Op::LastMessageId { topic: part.to_string() })
            };
            let json_of = |r: Reply| match r {
                Reply::Json(j) => serde_json::from_str::<Value>(&j).map_err(|e| bad_args(op, e)),
                other => Err(CoreError::new(ErrorCode::UnknownError, format!("internal: unexpected reply {other:?}"))),
            };
            match md.partitioned(&tn.to_string()).await? {
                None => json_of(last(tn).await?),
                Some(p) => {
                    let mut ids = Vec::new();
                    for i in 0..p.partitions {
                        let part = TopicName { local: format!("{}-partition-{i}", tn.local), ..tn.clone() };
                        match last(part).await {
                            Ok(r) => ids.push(json_of(r)?),
                            // A partition nobody used was never created.
                            Err(e) if e.code == ErrorCode::TopicNotFound => ids.push(json!({ "id": null })),
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(json!({ "partitions": ids }))
                }
            }
        }
        "messages.find" => {
            let tn = topic_arg(op, args)?;
            check_persistent(&tn)?;
            let key = str_arg(op, args, "key")?.to_string();
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
            let policies = namespace_must_exist(md, &tn).await?;
            let find = |part: TopicName| {
                let owner = ownership::shard_of(&part, policies.bundles, shard.nshards);
                shard.call(owner, Op::FindMessages { topic: part.to_string(), key: key.clone(), before_ms, limit })
            };
            let json_of = |r: Reply| match r {
                Reply::Json(j) => serde_json::from_str::<Value>(&j).map_err(|e| bad_args(op, e)),
                other => Err(CoreError::new(ErrorCode::UnknownError, format!("internal: unexpected reply {other:?}"))),
            };
            // A partitioned topic: every partition, merged newest first.
            match md.partitioned(&tn.to_string()).await? {
                None => json_of(find(tn).await?),
                Some(p) => {
                    let mut answers = Vec::new();
                    for i in 0..p.partitions {
                        let part = TopicName { local: format!("{}-partition-{i}", tn.local), ..tn.clone() };
                        match find(part).await {
                            Ok(r) => answers.push(json_of(r)?),
                            // A partition nobody used was never created.
                            Err(e) if e.code == ErrorCode::TopicNotFound => {}
                            Err(e) => return Err(e),
                        }
                    }
                    Ok(crate::find::merge(answers, limit))
                }
            }
        }
        "topics.lookup" => {
            let tn = topic_arg(op, args)?;
            let policies = namespace_must_exist(md, &tn).await?;
            let partitions = partitions_of(shard, md, &tn).await?;
            let bundle = ownership::bundle_of(&tn, policies.bundles);
            let owner = ownership::shard_of_bundle(bundle, shard.nshards);
            let parts: Vec<Value> = (0..partitions)
                .map(|i| {
                    let part = TopicName { local: format!("{}-partition-{i}", tn.local), ..tn.clone() };
                    let b = ownership::bundle_of(&part, policies.bundles);
                    let s = ownership::shard_of_bundle(b, shard.nshards);
                    with_shard_port(shard, s, json!({ "topic": part.to_string(), "bundle": b, "shard": s }))
                })
                .collect();
            let answer = json!({
                "topic": tn.to_string(),
                "partitions": partitions,
                "bundle": bundle,
                "shard": owner,
                "partition_owners": parts,
            });
            Ok(with_shard_port(shard, owner, answer))
        }
        "topics.owner" => {
            // What a shard-aware client asks before creating a producer or
            // consumer: the owner of exactly this name, never creating
            // anything (unlike `topics.lookup`, which may auto-create a
            // partitioned topic's metadata).
            let tn = topic_arg(op, args)?;
            let policies = namespace_must_exist(md, &tn).await?;
            let bundle = ownership::bundle_of(&tn, policies.bundles);
            let owner = ownership::shard_of_bundle(bundle, shard.nshards);
            Ok(with_shard_port(shard, owner, json!({ "topic": tn.to_string(), "bundle": bundle, "shard": owner })))
        }
        "broker.shard-stats" => {
            let mut shards = Vec::new();
            for i in 0..shard.nshards {
                let Reply::Traffic(t) = shard.call(i, Op::Traffic).await? else {
                    return Err(CoreError::new(ErrorCode::UnknownError, "internal: unexpected reply to Traffic"));
                };
                let entry = json!({
                    "shard": t.shard,
                    "cross_shard_requests": t.cross_shard_requests,
                    "cross_shard_events": t.cross_shard_events,
                });
                shards.push(match shard.config.shard_ports.get(i as usize) {
                    Some(port) => with_key(entry, "port", json!(port)),
                    None => entry,
                });
            }
            Ok(json!({ "shards": shards }))
        }
        other => Err(CoreError::new(ErrorCode::NotAllowed, format!("unknown admin operation {other:?}"))),
    }
}

/// Adds `"shard_port"` (the port shard `owner` listens on by itself) to a
/// lookup answer, when the broker has per-shard listeners.
fn with_shard_port(shard: &Shard, owner: u32, answer: Value) -> Value {
    match shard.config.shard_ports.get(owner as usize) {
        Some(port) => with_key(answer, "shard_port", json!(port)),
        None => answer,
    }
}

fn with_key(mut object: Value, key: &str, value: Value) -> Value {
    if let Value::Object(map) = &mut object {
        map.insert(key.to_string(), value);
    }
    object
}

fn check_persistent(tn: &TopicName) -> Result<(), CoreError> {
    if tn.domain == Domain::NonPersistent {
        return Err(CoreError::new(ErrorCode::NotAllowed, "non-persistent topics are not supported yet"));
    }
    Ok(())
}

/// Partitions of `tn`: 0 when it is not partitioned. A namespace whose
/// policies auto-create partitioned topics (`default_partitions` > 0) gets
/// the metadata created here, on the first lookup of an unknown name, as in
/// Pulsar: clients look a topic up before producing to it.
async fn partitions_of(shard: &Rc<Shard>, md: &Metadata, tn: &TopicName) -> Result<u32, CoreError> {
    let topic = tn.to_string();
    if let Some(p) = md.partitioned(&topic).await? {
        return Ok(p.partitions);
    }
    if tn.partition().is_some() || tn.domain == Domain::NonPersistent {
        return Ok(0);
    }
    let Some(policies) = md.policies(&tn.namespace_name()).await? else {
        return Ok(0);
    };
    if !policies.auto_topic_creation || policies.default_partitions == 0 {
        return Ok(0);
    }
    let owner = ownership::shard_of(tn, policies.bundles, shard.nshards);
    if topic_exists_on(shard, owner, &topic).await? {
        return Ok(0);
    }
    md.set_partitioned(&topic, policies.default_partitions, true).await?;
    tracing::info!(topic, partitions = policies.default_partitions, "auto-created partitioned topic");
    Ok(policies.default_partitions)
}

pub(crate) async fn topic_exists_on(shard: &Rc<Shard>, owner: u32, topic: &str) -> Result<bool, CoreError> {
    match shard.call(owner, Op::ListTopics { prefix: topic.to_string() }).await? {
        Reply::Topics(names) => Ok(names.iter().any(|n| n == topic)),
        other => Err(CoreError::new(ErrorCode::UnknownError, format!("internal: unexpected reply {other:?}"))),
    }
}

/// Every topic of `ns` (partitioned topics by their own name and their
/// created partitions), sorted.
async fn list_topics(shard: &Rc<Shard>, ns: &str) -> Result<Vec<String>, CoreError> {
    let md = metadata(shard)?;
    let mut names = Vec::new();
    for domain in ["persistent", "non-persistent"] {
        let prefix = format!("{domain}://{ns}/");
        for (t, _) in md.partitioned_topics(&prefix).await? {
            names.push(t);
        }
        for owner in 0..shard.nshards {
            if let Reply::Topics(t) = shard.call(owner, Op::ListTopics { prefix: prefix.clone() }).await? {
                names.extend(t);
            }
        }
    }
    names.sort();
    names.dedup();
    Ok(names)
}
