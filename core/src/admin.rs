//! Admin and lookup operations ([`AdminRequest`]), executed on shard 0
//! (which owns the metadata store); requests about a topic's data go on to
//! its owner. A door maps its own format onto [`AdminRequest`] and
//! [`AdminReply`] (the native door's op names and JSON:
//! `net/src/native/admin.rs`). Topic-level retention and TTL are in
//! [`crate::topic_policies`].
//!
//! Runs on shard 0; never crosses cores.

use crate::api::{
    AdminReply, AdminRequest, FoundMessages, LastMessageId, PermissionResource, Principal, SeekTarget, ShardStats,
    SubscriptionOp, SubscriptionStart, TopicLookup, TopicOwner,
};
use crate::authz;
use crate::error::{CoreError, ErrorCode};
use crate::metadata::{parse_namespace, Metadata, Policies};
use crate::ownership;
use crate::shard::{Op, Reply, Shard, TopicPolicy};
use crate::topic_name::{Domain, TopicName};
use magnetar_wire::MessageId;
use std::rc::Rc;

pub(crate) fn metadata(shard: &Shard) -> Result<&Metadata, CoreError> {
    shard
        .metadata
        .as_ref()
        .ok_or_else(|| CoreError::new(ErrorCode::UnknownError, "internal: admin operation routed off shard 0"))
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
    let mut partitions = 0;
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
            partitions = p.partitions;
            partitioned_base = Some(base.to_string());
        }
    }
    // Topic-level retention and TTL win over the namespace's.
    let policies = crate::topic_policies::apply(md, &tn.to_string(), partitioned_base.as_deref(), policies).await?;
    Ok(TopicPolicy { policies, in_partitioned, partitions })
}

fn not_found(what: &str, name: &str) -> CoreError {
    CoreError::new(ErrorCode::TopicNotFound, format!("{what} {name:?} does not exist"))
}

/// Partition `i` of the partitioned topic `tn`.
fn partition(tn: &TopicName, i: u32) -> TopicName {
    TopicName { local: format!("{}-partition-{i}", tn.local), ..tn.clone() }
}

fn unexpected(r: Reply) -> CoreError {
    CoreError::new(ErrorCode::UnknownError, format!("internal: unexpected reply {r:?}"))
}

/// Whether authorization is enforced: only with authentication on.
fn enforced(shard: &Shard) -> bool {
    shard.config.authentication.is_some()
}

/// Runs `request` once `caller` is authorized for it (`crate::authz`); a
/// refused request has changed nothing.
pub(crate) async fn authorized_execute(
    shard: &Rc<Shard>,
    caller: &Principal,
    request: AdminRequest,
) -> Result<AdminReply, CoreError> {
    let md = metadata(shard)?;
    authz::check(md, enforced(shard), &shard.config.superuser_roles, caller, &authz::need_of(&request)).await?;
    execute(shard, request).await
}

/// Checks that `caller` may have `access` to `topic`.
pub(crate) async fn authorize_topic(
    shard: &Rc<Shard>,
    caller: &Principal,
    topic: &str,
    access: authz::TopicAccess,
) -> Result<(), CoreError> {
    if !enforced(shard) {
        return Ok(());
    }
    let md = metadata(shard)?;
    let need = authz::Need::Topic(TopicName::parse(topic)?, access);
    authz::check(md, true, &shard.config.superuser_roles, caller, &need).await
}

/// Runs `request`.
async fn execute(shard: &Rc<Shard>, request: AdminRequest) -> Result<AdminReply, CoreError> {
    let md = metadata(shard)?;
    match request {
        AdminRequest::SetRetention { .. }
        | AdminRequest::GetRetention { .. }
        | AdminRequest::RemoveRetention { .. }
        | AdminRequest::SetMessageTtl { .. }
        | AdminRequest::GetMessageTtl { .. }
        | AdminRequest::RemoveMessageTtl { .. } => crate::topic_policies::run(shard, request).await,
        AdminRequest::GrantPermission { resource, role, actions } => {
            check_grant_target(md, &resource, &role).await?;
            let key = resource.key();
            let mut p = md.permissions(&key).await?;
            p.entry(role).or_default().extend(actions);
            md.set_permissions(&key, &p).await?;
            Ok(AdminReply::Done)
        }
        AdminRequest::RevokePermission { resource, role } => {
            check_grant_target(md, &resource, &role).await?;
            let key = resource.key();
            let mut p = md.permissions(&key).await?;
            if p.remove(&role).is_none() {
                return Err(CoreError::new(
                    ErrorCode::NotAllowed,
                    format!("role {role:?} holds no permission on {key}"),
                ));
            }
            md.set_permissions(&key, &p).await?;
            Ok(AdminReply::Done)
        }
        AdminRequest::GetPermissions { resource } => {
            check_grant_target(md, &resource, "-").await?;
            Ok(AdminReply::Permissions(md.permissions(&resource.key()).await?))
        }
        AdminRequest::ListTenants => Ok(AdminReply::Names(md.tenants().await?)),
        AdminRequest::CreateTenant { tenant, info } => {
            md.create_tenant(&tenant, info).await?;
            Ok(AdminReply::Done)
        }
        AdminRequest::GetTenant { tenant } => {
            let info = md.tenant(&tenant).await?.ok_or_else(|| not_found("tenant", &tenant))?;
            Ok(AdminReply::Tenant(info))
        }
        AdminRequest::DeleteTenant { tenant } => {
            md.delete_tenant(&tenant).await?;
            Ok(AdminReply::Done)
        }
        AdminRequest::ListNamespaces { tenant } => {
            if md.tenant(&tenant).await?.is_none() {
                return Err(not_found("tenant", &tenant));
            }
            Ok(AdminReply::Names(md.namespaces(&tenant).await?))
        }
        AdminRequest::CreateNamespace { namespace, policies } => {
            let base = Policies { bundles: shard.config.bundles_per_namespace, ..Policies::default() };
            md.create_namespace(&namespace, policies.apply(base)).await?;
            Ok(AdminReply::Done)
        }
        AdminRequest::DeleteNamespace { namespace } => {
            parse_namespace(&namespace)?;
            let topics = list_topics(shard, &namespace, None, 10).await?;
            md.delete_namespace(&namespace, &topics).await?;
            md.set_permissions(&namespace, &Default::default()).await?;
            Ok(AdminReply::Done)
        }
        AdminRequest::GetPolicies { namespace } => {
            let p = md.policies(&namespace).await?.ok_or_else(|| not_found("namespace", &namespace))?;
            Ok(AdminReply::Policies(p))
        }
        AdminRequest::SetPolicies { namespace, policies } => {
            let old = md.policies(&namespace).await?.ok_or_else(|| not_found("namespace", &namespace))?;
            let new = policies.apply(old);
            md.set_policies(&namespace, new.clone()).await?;
            Ok(AdminReply::Policies(new))
        }
        AdminRequest::CreateTopic { topic: tn } => {
            check_persistent(&tn)?;
            let topic = tn.to_string();
            let policies = namespace_must_exist(md, &tn).await?;
            if md.partitioned(&topic).await?.is_some() {
                return Err(CoreError::new(ErrorCode::NotAllowed, format!("topic {topic} already exists")));
            }
            let owner = ownership::shard_of(&tn, policies.bundles, shard.nshards);
            shard.call(owner, Op::CreateTopic { topic }).await?;
            Ok(AdminReply::Done)
        }
        AdminRequest::CreatePartitionedTopic { topic: tn, partitions } => {
            set_partitioned(shard, md, &tn, partitions, true).await?;
            Ok(AdminReply::Done)
        }
        AdminRequest::UpdatePartitionedTopic { topic: tn, partitions } => {
            set_partitioned(shard, md, &tn, partitions, false).await?;
            Ok(AdminReply::Done)
        }
        AdminRequest::PartitionedMetadata { topic: tn } => {
            Ok(AdminReply::Partitions(partitions_of(shard, md, &tn).await?))
        }
        AdminRequest::ListTopics { namespace, after, limit } => {
            parse_namespace(&namespace)?;
            if md.policies(&namespace).await?.is_none() {
                return Err(not_found("namespace", &namespace));
            }
            let limit = limit.map_or(usize::MAX, |l| l as usize);
            Ok(AdminReply::Names(list_topics(shard, &namespace, after.as_deref(), limit).await?))
        }
        AdminRequest::DeleteTopic { topic: tn } => {
            let topic = tn.to_string();
            let policies = namespace_must_exist(md, &tn).await?;
            match md.partitioned(&topic).await? {
                Some(p) => {
                    for i in 0..p.partitions {
                        let part = partition(&tn, i);
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
            md.set_permissions(&topic, &Default::default()).await?;
            Ok(AdminReply::Done)
        }
        AdminRequest::SkipDamaged { topic: tn, subscription } => {
            check_persistent(&tn)?;
            let policies = namespace_must_exist(md, &tn).await?;
            let topic = tn.to_string();
            if let Some(p) = md.partitioned(&topic).await? {
                return Err(CoreError::new(
                    ErrorCode::NotAllowed,
                    format!("{topic} is a partitioned topic with {} partitions: name the partition", p.partitions),
                ));
            }
            let owner = ownership::shard_of(&tn, policies.bundles, shard.nshards);
            match shard.call(owner, Op::SkipDamaged { topic, subscription }).await? {
                Reply::Skipped(id) => Ok(AdminReply::Skipped(id)),
                other => Err(unexpected(other)),
            }
        }
        AdminRequest::Subscription { topic: tn, subscription, op } => {
            check_persistent(&tn)?;
            let policies = namespace_must_exist(md, &tn).await?;
            match md.partitioned(&tn.to_string()).await? {
                None => subscription_op(shard, &tn, policies.bundles, &subscription, op).await,
                Some(p) => {
                    subscription_op_partitioned(shard, &tn, p.partitions, policies.bundles, &subscription, op).await
                }
            }
        }
        AdminRequest::LastMessageId { topic: tn } => {
            let policies = namespace_must_exist(md, &tn).await?;
            let last = |part: &TopicName| {
                let owner = ownership::shard_of(part, policies.bundles, shard.nshards);
                let call = shard.call(owner, Op::LastMessageId { topic: part.to_string() });
                async move {
                    match call.await? {
                        Reply::LastMessageId(id) => Ok(id),
                        other => Err(unexpected(other)),
                    }
                }
            };
            let id = match md.partitioned(&tn.to_string()).await? {
                None => LastMessageId::Topic(last(&tn).await?),
                Some(p) => {
                    let mut ids = Vec::new();
                    for i in 0..p.partitions {
                        match last(&partition(&tn, i)).await {
                            Ok(id) => ids.push(id),
                            // A partition nobody used was never created.
                            Err(e) if e.code == ErrorCode::TopicNotFound => ids.push(None),
                            Err(e) => return Err(e),
                        }
                    }
                    LastMessageId::Partitioned(ids)
                }
            };
            Ok(AdminReply::LastMessageId(id))
        }
        AdminRequest::FindMessages { topic: tn, key, before_ms, limit } => {
            check_persistent(&tn)?;
            let policies = namespace_must_exist(md, &tn).await?;
            let find = |part: &TopicName| {
                let owner = ownership::shard_of(part, policies.bundles, shard.nshards);
                let op = Op::FindMessages { topic: part.to_string(), key: key.clone(), before_ms, limit };
                let call = shard.call(owner, op);
                async move {
                    match call.await? {
                        Reply::Found(found) => Ok(found),
                        other => Err(unexpected(other)),
                    }
                }
            };
            // A partitioned topic: every partition, merged newest first.
            let found = match md.partitioned(&tn.to_string()).await? {
                None => find(&tn).await?,
                Some(p) => {
                    let mut answers: Vec<FoundMessages> = Vec::new();
                    for i in 0..p.partitions {
                        match find(&partition(&tn, i)).await {
                            Ok(found) => answers.push(found),
                            // A partition nobody used was never created.
                            Err(e) if e.code == ErrorCode::TopicNotFound => {}
                            Err(e) => return Err(e),
                        }
                    }
                    crate::find::merge(answers, limit)
                }
            };
            Ok(AdminReply::Found(found))
        }
        AdminRequest::Lookup { topic: tn } => {
            let policies = namespace_must_exist(md, &tn).await?;
            let partitions = partitions_of(shard, md, &tn).await?;
            let partition_owners =
                (0..partitions).map(|i| owner_of(shard, &partition(&tn, i), policies.bundles)).collect();
            let owner = owner_of(shard, &tn, policies.bundles);
            Ok(AdminReply::Lookup(TopicLookup { owner, partitions, partition_owners, broker: None }))
        }
        AdminRequest::Owner { topic: tn } => {
            // What a shard-aware client asks before creating a producer or
            // consumer: the owner of exactly this name, never creating
            // anything (unlike `Lookup`, which may auto-create a partitioned
            // topic's metadata).
            let policies = namespace_must_exist(md, &tn).await?;
            Ok(AdminReply::Owner(owner_of(shard, &tn, policies.bundles)))
        }
        AdminRequest::ShardStats => {
            let mut shards = Vec::new();
            for i in 0..shard.nshards {
                let Reply::Traffic(traffic) = shard.call(i, Op::Traffic).await? else {
                    return Err(CoreError::new(ErrorCode::UnknownError, "internal: unexpected reply to Traffic"));
                };
                shards.push(ShardStats { traffic, port: shard.config.shard_ports.get(i as usize).copied() });
            }
            Ok(AdminReply::ShardStats(shards))
        }
    }
}

/// Runs `op` on `subscription` of the non-partitioned topic (or partition) `tn`.
async fn subscription_op(
    shard: &Rc<Shard>,
    tn: &TopicName,
    bundles: u32,
    subscription: &str,
    op: SubscriptionOp,
) -> Result<AdminReply, CoreError> {
    let owner = ownership::shard_of(tn, bundles, shard.nshards);
    let op = Op::SubscriptionAdmin { topic: tn.to_string(), subscription: subscription.to_string(), op };
    match shard.call(owner, op).await? {
        Reply::Done => Ok(AdminReply::Done),
        Reply::Found(found) => Ok(AdminReply::Found(found)),
        Reply::Entry(entry) => Ok(AdminReply::Entry(entry)),
        other => Err(unexpected(other)),
    }
}

/// `op` on the partitioned topic `tn`, as Pulsar does: on every partition
/// (creating a subscription creates the partitions nobody used yet; the
/// other operations skip them, and a subscription no partition has is not
/// found); a peek, or a position given by message id, names one partition.
async fn subscription_op_partitioned(
    shard: &Rc<Shard>,
    tn: &TopicName,
    partitions: u32,
    bundles: u32,
    subscription: &str,
    op: SubscriptionOp,
) -> Result<AdminReply, CoreError> {
    let one_partition = |id: &MessageId| match u32::try_from(id.partition) {
        Ok(i) if i < partitions => Ok(partition(tn, i)),
        _ => Err(CoreError::new(
            ErrorCode::NotAllowed,
            format!(
                "{tn} has {partitions} partitions: a message id must name one of them (partition {})",
                id.partition
            ),
        )),
    };
    match &op {
        SubscriptionOp::Peek { .. } | SubscriptionOp::PeekEntry { .. } => {
            return Err(CoreError::new(
                ErrorCode::NotAllowed,
                format!("peek on the partitioned topic {tn} is not allowed: name a partition ({tn}-partition-<i>)"),
            ))
        }
        SubscriptionOp::ResetCursor { to: SeekTarget::Id(id) }
        | SubscriptionOp::Create { at: SubscriptionStart::Id(id) } => {
            return subscription_op(shard, &one_partition(id)?, bundles, subscription, op).await;
        }
        _ => {}
    }
    let create = matches!(op, SubscriptionOp::Create { .. });
    let mut found = false;
    for i in 0..partitions {
        let part = partition(tn, i);
        let owner = ownership::shard_of(&part, bundles, shard.nshards);
        if create && !topic_exists_on(shard, owner, &part.to_string()).await? {
            shard.call(owner, Op::CreateTopic { topic: part.to_string() }).await?;
        }
        match subscription_op(shard, &part, bundles, subscription, op.clone()).await {
            Ok(_) => found = true,
            // A partition nobody used, or one without this subscription.
            Err(e) if e.code == ErrorCode::TopicNotFound && !create => {}
            Err(e) => return Err(e),
        }
    }
    if !found && !create {
        return Err(CoreError::new(
            ErrorCode::TopicNotFound,
            format!("subscription {subscription:?} of {tn} does not exist on any partition"),
        ));
    }
    Ok(AdminReply::Done)
}

/// A grant's resource must be in an existing namespace, and the role
/// non-empty.
async fn check_grant_target(md: &Metadata, resource: &PermissionResource, role: &str) -> Result<(), CoreError> {
    let ns = resource.namespace();
    parse_namespace(&ns)?;
    if md.policies(&ns).await?.is_none() {
        return Err(not_found("namespace", &ns));
    }
    if role.is_empty() {
        return Err(CoreError::new(ErrorCode::NotAllowed, "the role may not be empty"));
    }
    Ok(())
}

/// Creates (`create`) or grows the partitioned topic `tn`.
async fn set_partitioned(
    shard: &Rc<Shard>,
    md: &Metadata,
    tn: &TopicName,
    partitions: u32,
    create: bool,
) -> Result<(), CoreError> {
    // Non-persistent topics may be partitioned too: the metadata is the
    // same, and each partition is a non-persistent topic of its own.
    if tn.partition().is_some() {
        return Err(CoreError::new(
            ErrorCode::InvalidTopicName,
            format!("a partitioned topic's name may not end in -partition-<i>: {tn}"),
        ));
    }
    let topic = tn.to_string();
    let policies = namespace_must_exist(md, tn).await?;
    if create {
        let owner = ownership::shard_of(tn, policies.bundles, shard.nshards);
        if topic_exists_on(shard, owner, &topic).await? {
            return Err(CoreError::new(
                ErrorCode::NotAllowed,
                format!("a non-partitioned topic {topic} already exists"),
            ));
        }
    }
    md.set_partitioned(&topic, partitions, create).await
}

/// The shard owning `tn` in a namespace of `bundles` bundles, and its own
/// port when the broker has per-shard listeners.
fn owner_of(shard: &Shard, tn: &TopicName, bundles: u32) -> TopicOwner {
    let bundle = ownership::bundle_of(tn, bundles);
    let owner = ownership::shard_of_bundle(bundle, shard.nshards);
    TopicOwner {
        topic: tn.to_string(),
        bundle,
        shard: owner,
        shard_port: shard.config.shard_ports.get(owner as usize).copied(),
    }
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
    match shard.call(owner, Op::ListTopics { prefix: topic.to_string(), after: None, limit: usize::MAX }).await? {
        Reply::Topics(names) => Ok(names.iter().any(|n| n == topic)),
        other => Err(CoreError::new(ErrorCode::UnknownError, format!("internal: unexpected reply {other:?}"))),
    }
}

/// The topics of `ns` (partitioned topics by their own name and their
/// created partitions) that sort after `after`, sorted, at most `limit`:
/// each shard answers with at most `limit` names, so a page costs
/// `limit` names per shard however many topics the namespace has.
async fn list_topics(shard: &Rc<Shard>, ns: &str, after: Option<&str>, limit: usize) -> Result<Vec<String>, CoreError> {
    let md = metadata(shard)?;
    let mut names = Vec::new();
    let after_ok = |t: &String| after.is_none_or(|a| t.as_str() > a);
    for domain in ["persistent", "non-persistent"] {
        let prefix = format!("{domain}://{ns}/");
        names.extend(md.partitioned_topics(&prefix).await?.into_iter().map(|(t, _)| t).filter(after_ok));
        for owner in 0..shard.nshards {
            let op = Op::ListTopics { prefix: prefix.clone(), after: after.map(str::to_owned), limit };
            if let Reply::Topics(t) = shard.call(owner, op).await? {
                names.extend(t);
            }
        }
        // Bounded as it grows: at most one page is kept between calls.
        names.sort();
        names.dedup();
        names.truncate(limit);
    }
    Ok(names)
}
