//! Authorization: may this principal do this? Checked once, in the core,
//! for every door: on shard 0 before an admin operation runs
//! ([`crate::admin::execute`]) and before a producer or consumer is created
//! (the topic policy request every creation makes). A refused request has
//! changed nothing.
//!
//! The model is Apache Pulsar's:
//! - superuser roles (`--superuser-roles`) may do everything;
//! - a tenant's `admin_roles` may do everything within the tenant
//!   (namespaces, their policies and permissions, topics, producing and
//!   consuming);
//! - other roles hold `produce` and `consume` grants on namespaces (every
//!   topic in them) and on single topics (a partitioned topic's grant covers
//!   its partitions); lookups and partitioned metadata need either.
//!
//! Enforced only when authentication is on ([`BrokerConfig::authentication`]);
//! without it every caller is anonymous and nothing is checked.
//!
//! [`BrokerConfig::authentication`]: crate::config::BrokerConfig::authentication

use crate::api::{AdminRequest, PermissionResource, Principal};
use crate::error::{CoreError, ErrorCode};
use crate::metadata::{Metadata, Permissions};
use crate::topic_name::TopicName;
use serde::{Deserialize, Serialize};

/// What a grant allows on a namespace or a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthAction {
    Produce,
    Consume,
}

impl AuthAction {
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "produce" => Some(Self::Produce),
            "consume" => Some(Self::Consume),
            _ => None,
        }
    }
}

/// What a request on a topic needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TopicAccess {
    Produce,
    Consume,
    /// Lookups, partitioned metadata, statistics: either grant will do.
    ProduceOrConsume,
}

impl TopicAccess {
    fn granted_by(self, actions: &std::collections::BTreeSet<AuthAction>) -> bool {
        match self {
            Self::Produce => actions.contains(&AuthAction::Produce),
            Self::Consume => actions.contains(&AuthAction::Consume),
            Self::ProduceOrConsume => !actions.is_empty(),
        }
    }
}

/// What an operation needs of its caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Need {
    Superuser,
    /// An admin of this tenant (or a superuser).
    TenantAdmin(String),
    Topic(TopicName, TopicAccess),
    /// A grant on the namespace itself (topic-level grants do not count):
    /// what Pulsar asks for listing a namespace's topics.
    Namespace(String, TopicAccess),
}

fn tenant_of_namespace(ns: &str) -> String {
    ns.split_once('/').map_or(ns, |(t, _)| t).to_string()
}

/// What `request` needs (Pulsar's rules: superuser for tenants and the
/// broker; tenant admin for namespaces, policies, permissions and topic
/// administration; a grant for lookups and reading a topic's position).
///
/// As in Pulsar's `TenantsBase` and `PulsarAuthorizationProvider`: reading
/// a tenant's configuration needs a superuser (a tenant admin may list its
/// namespaces but not read its admin roles), and listing a namespace's
/// topics is open to its tenant's admins and to roles with a `consume`
/// grant on the namespace itself (`NamespaceOperation::GET_TOPICS`).
pub fn need_of(request: &AdminRequest) -> Need {
    use AdminRequest as R;
    match request {
        R::ListTenants | R::CreateTenant { .. } | R::DeleteTenant { .. } | R::GetTenant { .. } | R::ShardStats => {
            Need::Superuser
        }
        R::ListNamespaces { tenant } => Need::TenantAdmin(tenant.clone()),
        R::CreateNamespace { namespace, .. }
        | R::DeleteNamespace { namespace }
        | R::GetPolicies { namespace }
        | R::SetPolicies { namespace, .. } => Need::TenantAdmin(tenant_of_namespace(namespace)),
        R::ListTopics { namespace, .. } => Need::Namespace(namespace.clone(), TopicAccess::Consume),
        R::GrantPermission { resource, .. } | R::RevokePermission { resource, .. } | R::GetPermissions { resource } => {
            Need::TenantAdmin(match resource {
                PermissionResource::Namespace(ns) => tenant_of_namespace(ns),
                PermissionResource::Topic(t) => t.tenant.clone(),
            })
        }
        R::CreateTopic { topic }
        | R::CreatePartitionedTopic { topic, .. }
        | R::UpdatePartitionedTopic { topic, .. }
        | R::DeleteTopic { topic }
        | R::FindMessages { topic, .. }
        | R::SetRetention { topic, .. }
        | R::GetRetention { topic }
        | R::RemoveRetention { topic }
        | R::SetMessageTtl { topic, .. }
        | R::GetMessageTtl { topic }
        | R::RemoveMessageTtl { topic }
        | R::SkipDamaged { topic, .. }
        | R::Subscription { topic, .. } => Need::TenantAdmin(topic.tenant.clone()),
        R::PartitionedMetadata { topic } | R::Lookup { topic } | R::Owner { topic } => {
            Need::Topic(topic.clone(), TopicAccess::ProduceOrConsume)
        }
        R::LastMessageId { topic } => Need::Topic(topic.clone(), TopicAccess::Consume),
    }
}

/// The facts a decision is made from, gathered from the metadata store.
#[derive(Debug, Default)]
pub struct Facts<'a> {
    pub superuser_roles: &'a [String],
    /// The admin roles of the tenant the request is about (empty when it
    /// has none or does not exist).
    pub tenant_admins: Vec<String>,
    /// Grants that apply to the topic: its namespace's, the topic's own
    /// and, for a partition, its partitioned topic's.
    pub grants: Vec<Permissions>,
}

/// The decision, as a pure function of the role and the facts.
pub fn allowed(role: &str, need: &Need, facts: &Facts<'_>) -> bool {
    if facts.superuser_roles.iter().any(|r| r == role) {
        return true;
    }
    if matches!(need, Need::Superuser) {
        return false;
    }
    if facts.tenant_admins.iter().any(|r| r == role) {
        return true;
    }
    match need {
        Need::Topic(_, access) | Need::Namespace(_, access) => {
            facts.grants.iter().any(|g| g.get(role).is_some_and(|a| access.granted_by(a)))
        }
        Need::Superuser | Need::TenantAdmin(_) => false,
    }
}

/// The partitioned topic `tn` is a partition of, if its name says so.
fn partitioned_base(tn: &TopicName) -> Option<TopicName> {
    tn.partition()?;
    let (base, _) = tn.local.rsplit_once("-partition-")?;
    Some(TopicName { local: base.to_string(), ..tn.clone() })
}

/// Checks `need` for `principal`, reading the facts from `md` (on shard
/// 0). `Ok` when authorization is off.
pub(crate) async fn check(
    md: &Metadata,
    enforced: bool,
    superuser_roles: &[String],
    principal: &Principal,
    need: &Need,
) -> Result<(), CoreError> {
    if !enforced {
        return Ok(());
    }
    let role = match principal {
        Principal::Role(r) => r.as_str(),
        // Authentication refuses a client without credentials unless it
        // maps it to the anonymous role; nothing is allowed without a role.
        Principal::Anonymous => return Err(denied(principal, need)),
    };
    let mut facts = Facts { superuser_roles, ..Facts::default() };
    if !allowed(role, &Need::Superuser, &facts) {
        let tenant = match need {
            Need::Superuser => None,
            Need::TenantAdmin(t) => Some(t.as_str()),
            Need::Topic(tn, _) => Some(tn.tenant.as_str()),
            Need::Namespace(ns, _) => Some(ns.split_once('/').map_or(ns.as_str(), |(t, _)| t)),
        };
        if let Some(t) = tenant {
            facts.tenant_admins = md.tenant(t).await?.map(|i| i.admin_roles).unwrap_or_default();
        }
        if let Need::Topic(tn, _) = need {
            facts.grants.push(md.permissions(&PermissionResource::Namespace(tn.namespace_name()).key()).await?);
            facts.grants.push(md.permissions(&PermissionResource::Topic(tn.clone()).key()).await?);
            if let Some(base) = partitioned_base(tn) {
                facts.grants.push(md.permissions(&PermissionResource::Topic(base).key()).await?);
            }
        }
        if let Need::Namespace(ns, _) = need {
            facts.grants.push(md.permissions(&PermissionResource::Namespace(ns.clone()).key()).await?);
        }
    }
    if allowed(role, need, &facts) {
        Ok(())
    } else {
        Err(denied(principal, need))
    }
}

/// Checks that `principal` is a superuser (`Ok` when authorization is off):
/// needs no metadata, so any shard can decide it.
pub(crate) fn check_superuser(
    enforced: bool,
    superuser_roles: &[String],
    principal: &Principal,
) -> Result<(), CoreError> {
    let facts = Facts { superuser_roles, ..Facts::default() };
    match principal {
        _ if !enforced => Ok(()),
        Principal::Role(r) if allowed(r, &Need::Superuser, &facts) => Ok(()),
        _ => Err(denied(principal, &Need::Superuser)),
    }
}

fn denied(principal: &Principal, need: &Need) -> CoreError {
    let who = match principal {
        Principal::Role(r) => format!("role {r:?}"),
        Principal::Anonymous => "an anonymous client".to_string(),
    };
    let what = match need {
        Need::Superuser => "this needs a superuser role".to_string(),
        Need::TenantAdmin(t) => format!("this needs an admin role of tenant {t:?}"),
        Need::Topic(tn, TopicAccess::Produce) => format!("no produce permission on {tn}"),
        Need::Topic(tn, TopicAccess::Consume) => format!("no consume permission on {tn}"),
        Need::Topic(tn, TopicAccess::ProduceOrConsume) => format!("no produce or consume permission on {tn}"),
        Need::Namespace(ns, TopicAccess::Produce) => format!("no produce permission on namespace {ns}"),
        Need::Namespace(ns, TopicAccess::Consume) => format!("no consume permission on namespace {ns}"),
        Need::Namespace(ns, TopicAccess::ProduceOrConsume) => {
            format!("no produce or consume permission on namespace {ns}")
        }
    };
    CoreError::new(ErrorCode::AuthorizationError, format!("{who} is not authorized: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{BTreeMap, BTreeSet};

    fn grant(role: &str, actions: &[AuthAction]) -> Permissions {
        BTreeMap::from([(role.to_string(), actions.iter().copied().collect::<BTreeSet<_>>())])
    }

    #[test]
    fn superusers_tenant_admins_and_grants_decide_as_pulsar_does() {
        let supers = vec!["root".to_string()];
        let t = TopicName::parse("persistent://a/ns/t").unwrap();
        let produce = Need::Topic(t.clone(), TopicAccess::Produce);
        let consume = Need::Topic(t.clone(), TopicAccess::Consume);
        let either = Need::Topic(t, TopicAccess::ProduceOrConsume);
        let facts = Facts {
            superuser_roles: &supers,
            tenant_admins: vec!["admin-a".into()],
            grants: vec![grant("p", &[AuthAction::Produce]), grant("c", &[AuthAction::Consume])],
        };
        for need in [&Need::Superuser, &Need::TenantAdmin("a".into()), &produce, &consume, &either] {
            assert!(allowed("root", need, &facts));
            assert!(!allowed("nobody", need, &facts));
        }
        assert!(!allowed("admin-a", &Need::Superuser, &facts));
        assert!(allowed("admin-a", &Need::TenantAdmin("a".into()), &facts));
        assert!(allowed("admin-a", &produce, &facts));
        assert!(allowed("p", &produce, &facts) && !allowed("p", &consume, &facts) && allowed("p", &either, &facts));
        assert!(!allowed("c", &produce, &facts) && allowed("c", &consume, &facts) && allowed("c", &either, &facts));
        assert!(!allowed("p", &Need::TenantAdmin("a".into()), &facts));
        // A namespace need is met by the grants gathered for it.
        let ns_consume = Need::Namespace("a/ns".into(), TopicAccess::Consume);
        assert!(allowed("c", &ns_consume, &facts) && !allowed("p", &ns_consume, &facts));
        assert!(allowed("admin-a", &ns_consume, &facts) && allowed("root", &ns_consume, &facts));
        // An empty grant allows nothing.
        let empty = Facts { superuser_roles: &supers, grants: vec![grant("e", &[])], ..Facts::default() };
        assert!(!allowed("e", &either, &empty));
    }

    #[test]
    fn admin_operations_need_what_pulsar_asks() {
        let t = TopicName::parse("persistent://a/ns/t").unwrap();
        assert_eq!(need_of(&AdminRequest::ListTenants), Need::Superuser);
        assert_eq!(need_of(&AdminRequest::GetTenant { tenant: "a".into() }), Need::Superuser);
        assert_eq!(
            need_of(&AdminRequest::ListTopics { namespace: "a/ns".into(), after: None, limit: None }),
            Need::Namespace("a/ns".into(), TopicAccess::Consume)
        );
        assert_eq!(need_of(&AdminRequest::DeleteTenant { tenant: "a".into() }), Need::Superuser);
        assert_eq!(need_of(&AdminRequest::ListNamespaces { tenant: "a".into() }), Need::TenantAdmin("a".into()));
        assert_eq!(need_of(&AdminRequest::GetPolicies { namespace: "a/ns".into() }), Need::TenantAdmin("a".into()));
        assert_eq!(need_of(&AdminRequest::DeleteTopic { topic: t.clone() }), Need::TenantAdmin("a".into()));
        assert_eq!(
            need_of(&AdminRequest::Lookup { topic: t.clone() }),
            Need::Topic(t.clone(), TopicAccess::ProduceOrConsume)
        );
        assert_eq!(
            need_of(&AdminRequest::GetPermissions { resource: PermissionResource::Topic(t) }),
            Need::TenantAdmin("a".into())
        );
        let p = TopicName::parse("persistent://a/ns/t-partition-3").unwrap();
        assert_eq!(partitioned_base(&p).map(|b| b.to_string()).as_deref(), Some("persistent://a/ns/t"));
    }
}
