//! Topic-level retention and TTL (issue #3: "per namespace or topic"),
//! Pulsar's topic policies: admin operations that set, read and remove a
//! topic's overrides of its namespace's `retention_minutes`,
//! `retention_size_mb` and `message_ttl_seconds`. The overrides are a
//! metadata record (`topic-policies/<topic>`, see
//! [`crate::metadata::TopicOverrides`]); every consumer of a topic's
//! policies (the retention task among them) gets them applied on top of the
//! namespace's by [`crate::admin::topic_policy`].
//!
//! The requests are [`AdminRequest`]'s `SetRetention`, `GetRetention`,
//! `RemoveRetention`, `SetMessageTtl`, `GetMessageTtl` and
//! `RemoveMessageTtl`; a get answers `None` when no override is set.
//!
//! A partitioned topic's overrides are kept under its own name and apply to
//! all its partitions (a partition's own record, if any, wins). Deleting a
//! topic deletes its overrides. Runs on shard 0; never crosses cores.

use crate::admin::{metadata, namespace_must_exist, topic_exists_on};
use crate::api::{AdminReply, AdminRequest};
use crate::error::{CoreError, ErrorCode};
use crate::metadata::{Metadata, Policies, TopicOverrides};
use crate::ownership;
use crate::shard::Shard;
use crate::topic_name::TopicName;
use std::rc::Rc;

/// Runs one of this module's requests.
pub(crate) async fn run(shard: &Rc<Shard>, request: AdminRequest) -> Result<AdminReply, CoreError> {
    let md = metadata(shard)?;
    let tn = match &request {
        AdminRequest::SetRetention { topic, .. }
        | AdminRequest::GetRetention { topic }
        | AdminRequest::RemoveRetention { topic }
        | AdminRequest::SetMessageTtl { topic, .. }
        | AdminRequest::GetMessageTtl { topic }
        | AdminRequest::RemoveMessageTtl { topic } => topic,
        other => {
            return Err(CoreError::new(ErrorCode::UnknownError, format!("internal: {other:?} is not a topic policy")))
        }
    };
    let topic = tn.to_string();
    must_exist(shard, md, tn).await?;
    let mut o = md.topic_overrides(&topic).await?;
    match request {
        AdminRequest::GetRetention { .. } => return Ok(AdminReply::Retention(o.retention)),
        AdminRequest::GetMessageTtl { .. } => return Ok(AdminReply::MessageTtl(o.message_ttl_seconds)),
        AdminRequest::SetRetention { retention, .. } => o.retention = Some(retention),
        AdminRequest::RemoveRetention { .. } => o.retention = None,
        AdminRequest::SetMessageTtl { seconds, .. } => o.message_ttl_seconds = Some(seconds),
        // RemoveMessageTtl: the others were refused above.
        _ => o.message_ttl_seconds = None,
    }
    md.set_topic_overrides(&topic, &o).await?;
    tracing::info!(topic, overrides = ?o, "topic policies changed");
    Ok(AdminReply::Done)
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
