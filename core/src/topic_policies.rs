//! Topic-level retention and TTL (issue #3: "per namespace or topic"),
//! Pulsar's topic policies: admin operations that set, read and remove a
//! topic's overrides of its namespace's `retention_minutes`,
//! `retention_size_mb` and `message_ttl_seconds`. The overrides are a
//! metadata record (`topic-policies/<topic>`, see
//! [`crate::metadata::TopicOverrides`]); every consumer of a topic's
//! policies (the retention task among them) gets them applied on top of the
//! namespace's by [`crate::admin::topic_policy`].
//!
//! | op | arguments | answer |
//! |---|---|---|
//! | `topics.set-retention` | `topic`, `retention_minutes`, `retention_size_mb` (-1 = unbounded) | `null` |
//! | `topics.get-retention` | `topic` | `{"retention_minutes", "retention_size_mb"}` or `null` (none set) |
//! | `topics.remove-retention` | `topic` | `null` |
//! | `topics.set-message-ttl` | `topic`, `message_ttl_seconds` (0 = no TTL) | `null` |
//! | `topics.get-message-ttl` | `topic` | `{"message_ttl_seconds"}` or `null` (none set) |
//! | `topics.remove-message-ttl` | `topic` | `null` |
//!
//! A partitioned topic's overrides are kept under its own name and apply to
//! all its partitions (a partition's own record, if any, wins). Deleting a
//! topic deletes its overrides. Runs on shard 0; never crosses cores.

use crate::admin::{bad_args, metadata, namespace_must_exist, topic_arg, topic_exists_on};
use crate::error::{CoreError, ErrorCode};
use crate::metadata::{Metadata, Policies, TopicOverrides, TopicRetention};
use crate::ownership;
use crate::shard::Shard;
use crate::topic_name::TopicName;
use serde_json::{json, Value};
use std::rc::Rc;

/// Whether `op` is one of this module's operations.
pub(crate) fn handles(op: &str) -> bool {
    matches!(
        op,
        "topics.set-retention"
            | "topics.get-retention"
            | "topics.remove-retention"
            | "topics.set-message-ttl"
            | "topics.get-message-ttl"
            | "topics.remove-message-ttl"
    )
}

fn i64_arg(op: &str, args: &Value, name: &str) -> Result<i64, CoreError> {
    args.get(name).and_then(Value::as_i64).ok_or_else(|| bad_args(op, format!("missing integer argument {name:?}")))
}

pub(crate) async fn run(shard: &Rc<Shard>, op: &str, args: &Value) -> Result<Value, CoreError> {
    let md = metadata(shard)?;
    let tn = topic_arg(op, args)?;
    let topic = tn.to_string();
    must_exist(shard, md, &tn).await?;
    let mut o = md.topic_overrides(&topic).await?;
    match op {
        "topics.get-retention" => return Ok(o.retention.map_or(Value::Null, |r| json!(r))),
        "topics.get-message-ttl" => {
            return Ok(o.message_ttl_seconds.map_or(Value::Null, |s| json!({ "message_ttl_seconds": s })))
        }
        "topics.set-retention" => {
            o.retention = Some(TopicRetention {
                retention_minutes: i64_arg(op, args, "retention_minutes")?,
                retention_size_mb: i64_arg(op, args, "retention_size_mb")?,
            })
        }
        "topics.remove-retention" => o.retention = None,
        "topics.set-message-ttl" => {
            let s = args
                .get("message_ttl_seconds")
                .and_then(Value::as_u64)
                .ok_or_else(|| bad_args(op, "missing integer argument \"message_ttl_seconds\" (>= 0)"))?;
            o.message_ttl_seconds = Some(s);
        }
        "topics.remove-message-ttl" => o.message_ttl_seconds = None,
        other => return Err(CoreError::new(ErrorCode::NotAllowed, format!("unknown admin operation {other:?}"))),
    }
    md.set_topic_overrides(&topic, &o).await?;
    tracing::info!(topic, overrides = ?o, "topic policies changed");
    Ok(Value::Null)
}

/// Refuses overrides for a topic that does not exist (as Pulsar does): a
/// typo would otherwise leave a record that governs nothing.
async fn must_exist(shard: &Rc<Shard>, md: &Metadata, tn: &TopicName) -> Result<(), CoreError> {
    let topic = tn.to_string();
    let policies = namespace_must_exist(md, tn).await?;
    if md.partitioned(&topic).await?.is_some() {
        return Ok(());
    }
    let owner = ownership::shard_of(tn, policies.bundles, shard.nshards);
    if topic_exists_on(shard, owner, &topic).await? {
        return Ok(());
    }
    Err(CoreError::new(ErrorCode::TopicNotFound, format!("topic {topic} does not exist")))
}

/// `policies` (the namespace's) with the overrides of `topic` applied: the
/// partitioned topic's (`base`, when `topic` is one of its partitions)
/// first, then the topic's own, field by field.
pub(crate) async fn apply(
    md: &Metadata,
    topic: &str,
    base: Option<&str>,
    mut policies: Policies,
) -> Result<Policies, CoreError> {
    if let Some(base) = base {
        policies = md.topic_overrides(base).await?.apply(policies);
    }
    Ok(md.topic_overrides(topic).await?.apply(policies))
}

/// Deletes the overrides of a deleted topic.
pub(crate) async fn forget(md: &Metadata, topic: &str) -> Result<(), CoreError> {
    md.set_topic_overrides(topic, &TopicOverrides::default()).await
}
