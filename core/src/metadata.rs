//! Tenants, namespaces (with their policies) and partitioned-topic metadata,
//! behind the [`MetadataStore`] trait.
//!
//! The embedded store, [`LogMetadataStore`], keeps every record in **shard
//! 0's entry log** as metadata records under `m/` (last write per key wins on
//! recovery; an empty value deletes). Shard 0 is the single writer and the
//! single source of truth; every other shard asks it through the mesh
//! (`Op::Admin`, `Op::TopicPolicy`) and caches nothing, so there is no cache
//! to invalidate and every shard sees the same metadata at once. The cost is
//! one mesh hop per producer/consumer creation and per admin call: rare
//! operations, never on the produce or dispatch path. A file written through
//! a blocking pool was the alternative; the log already gives us group
//! commit, checksums, torn-tail handling and recovery, so a second durable
//! format would only add code that can be wrong.
//!
//! In a cluster, an etcd-backed implementation of the same trait replaces
//! the embedded one; the typed layer ([`Metadata`]) does not change.
//!
//! Owned by shard 0; never crosses cores.

use crate::error::{CoreError, ErrorCode};
use bytes::Bytes;
use futures::future::LocalBoxFuture;
use futures::FutureExt;
use magnetar_storage::EntryLog;
use serde::{Deserialize, Serialize};
use std::rc::Rc;

/// Prefix of every metadata-store key in shard 0's log.
pub const META_STORE_PREFIX: &str = "m/";
/// The tenant and namespace a fresh data directory starts with.
pub const DEFAULT_TENANT: &str = "public";
pub const DEFAULT_NAMESPACE: &str = "public/default";
/// Most partitions a partitioned topic may have.
pub const PARTITIONS_MAX: u32 = 4096;
/// Most bundles a namespace may have.
pub const BUNDLES_MAX: u32 = 1024;

/// A durable key/value store of metadata records. Values are JSON documents.
/// `put` and `delete` resolve once the change is durable.
pub trait MetadataStore {
    fn get(&self, key: &str) -> LocalBoxFuture<'static, Result<Option<Bytes>, CoreError>>;
    /// Keys starting with `prefix`, sorted, with their values.
    fn list(&self, prefix: &str) -> LocalBoxFuture<'static, Result<Vec<(String, Bytes)>, CoreError>>;
    fn put(&self, key: &str, value: Bytes) -> LocalBoxFuture<'static, Result<(), CoreError>>;
    fn delete(&self, key: &str) -> LocalBoxFuture<'static, Result<(), CoreError>>;
}

/// The embedded store: metadata records in shard 0's entry log (see the
/// module documentation). Owned by shard 0; never crosses cores.
pub struct LogMetadataStore {
    log: EntryLog,
}

impl LogMetadataStore {
    pub fn new(log: EntryLog) -> Self {
        Self { log }
    }

    fn full_key(key: &str) -> Vec<u8> {
        format!("{META_STORE_PREFIX}{key}").into_bytes()
    }
}

impl MetadataStore for LogMetadataStore {
    fn get(&self, key: &str) -> LocalBoxFuture<'static, Result<Option<Bytes>, CoreError>> {
        futures::future::ready(Ok(self.log.meta(&Self::full_key(key)))).boxed_local()
    }

    fn list(&self, prefix: &str) -> LocalBoxFuture<'static, Result<Vec<(String, Bytes)>, CoreError>> {
        let strip = META_STORE_PREFIX.len();
        let items = self
            .log
            .meta_prefix(&Self::full_key(prefix))
            .into_iter()
            .filter_map(|(k, v)| Some((String::from_utf8(k.get(strip..)?.to_vec()).ok()?, v)))
            .collect();
        futures::future::ready(Ok(items)).boxed_local()
    }

    fn put(&self, key: &str, value: Bytes) -> LocalBoxFuture<'static, Result<(), CoreError>> {
        // An empty value would delete the key (the log's convention).
        assert!(!value.is_empty(), "metadata values are JSON documents, never empty");
        let log = self.log.clone();
        let put = self.log.put_meta(&Self::full_key(key), value);
        async move {
            let lsn = put?;
            log.wait_durable(lsn).await?;
            Ok(())
        }
        .boxed_local()
    }

    fn delete(&self, key: &str) -> LocalBoxFuture<'static, Result<(), CoreError>> {
        let log = self.log.clone();
        let put = self.log.put_meta(&Self::full_key(key), Bytes::new());
        async move {
            let lsn = put?;
            log.wait_durable(lsn).await?;
            Ok(())
        }
        .boxed_local()
    }
}

/// A namespace's policies. Every field has a default, so a document written
/// by an older version (or a partial `set-policies` call) still decodes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Policies {
    /// Keep acknowledged messages this long (minutes); -1 = forever. Stored
    /// here, enforced by retention (issue #3).
    pub retention_minutes: i64,
    /// Keep at most this much acknowledged data (MiB); -1 = unbounded.
    pub retention_size_mb: i64,
    /// Unacknowledged messages older than this expire (seconds); 0 = never.
    /// Stored here, enforced by the subscription side (issue #4).
    pub message_ttl_seconds: u64,
    /// Broker-side deduplication by producer name and sequence id.
    pub deduplication: bool,
    /// Producers per topic; 0 = unlimited.
    pub max_producers_per_topic: u32,
    /// Consumers per topic (all subscriptions); 0 = unlimited.
    pub max_consumers_per_topic: u32,
    /// Create a topic on its first producer or consumer.
    pub auto_topic_creation: bool,
    /// With auto creation: 0 creates a non-partitioned topic, N > 0 a
    /// partitioned one with N partitions.
    pub default_partitions: u32,
    /// Bundles of the namespace's hash ring. Fixed at creation (changing it
    /// would move topics between shards, and their data with them).
    pub bundles: u32,
}

impl Default for Policies {
    fn default() -> Self {
        Self {
            retention_minutes: 0,
            retention_size_mb: 0,
            message_ttl_seconds: 0,
            deduplication: false,
            max_producers_per_topic: 0,
            max_consumers_per_topic: 0,
            auto_topic_creation: true,
            default_partitions: 0,
            bundles: 16,
        }
    }
}

/// A topic's retention override: the same two fields, with the same
/// meaning, as the namespace's [`Policies`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRetention {
    pub retention_minutes: i64,
    pub retention_size_mb: i64,
}

/// Topic-level overrides of namespace policies (`topic-policies/<topic>`),
/// Pulsar's topic policies: a field that is set wins over the namespace's;
/// an unset one falls back to it. For a partitioned topic the record sits
/// under the partitioned topic's name and applies to every partition.
/// Unknown fields are ignored (not refused) so that a record written by a
/// later version still decodes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TopicOverrides {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub retention: Option<TopicRetention>,
    /// 0 = no TTL for this topic, whatever the namespace says.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub message_ttl_seconds: Option<u64>,
}

impl TopicOverrides {
    pub fn is_empty(&self) -> bool {
        self.retention.is_none() && self.message_ttl_seconds.is_none()
    }

    /// `policies` with these overrides applied.
    pub fn apply(&self, mut policies: Policies) -> Policies {
        if let Some(r) = self.retention {
            policies.retention_minutes = r.retention_minutes;
            policies.retention_size_mb = r.retention_size_mb;
        }
        if let Some(ttl) = self.message_ttl_seconds {
            policies.message_ttl_seconds = ttl;
        }
        policies
    }
}

#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default)]
pub struct TenantInfo {
    pub admin_roles: Vec<String>,
    pub allowed_clusters: Vec<String>,
}

/// Grants on a namespace or a topic: role -> actions
/// (`permissions/<namespace or full topic name>`).
pub type Permissions = std::collections::BTreeMap<String, std::collections::BTreeSet<crate::authz::AuthAction>>;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PartitionedMetadata {
    pub partitions: u32,
}

/// Names of tenants and namespace parts: what topic names accept.
pub fn valid_name_part(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= 128
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'=' | b':'))
}

fn bad_name(what: &str, name: &str) -> CoreError {
    CoreError::new(
        ErrorCode::InvalidTopicName,
        format!("invalid {what} name {name:?}: use 1 to 128 characters of [A-Za-z0-9-_.=:]"),
    )
}

fn not_found(what: &str, name: &str) -> CoreError {
    CoreError::new(ErrorCode::TopicNotFound, format!("{what} {name:?} does not exist"))
}

/// Splits `tenant/ns`, checking both parts.
pub fn parse_namespace(ns: &str) -> Result<(&str, &str), CoreError> {
    match ns.split_once('/') {
        Some((t, n)) if valid_name_part(t) && valid_name_part(n) => Ok((t, n)),
        _ => Err(CoreError::new(
            ErrorCode::InvalidTopicName,
            format!("invalid namespace {ns:?}: expected TENANT/NAMESPACE of [A-Za-z0-9-_.=:]"),
        )),
    }
}

fn decode<T: for<'de> Deserialize<'de>>(key: &str, v: &[u8]) -> Result<T, CoreError> {
    serde_json::from_slice(v)
        .map_err(|e| CoreError::new(ErrorCode::PersistenceError, format!("unreadable metadata record {key}: {e}")))
}

fn encode<T: Serialize>(v: &T) -> Bytes {
    // Serializing these plain structs cannot fail; "{}" keeps it panic-free.
    Bytes::from(serde_json::to_vec(v).unwrap_or_else(|_| b"{}".to_vec()))
}

/// The typed view of the store: tenants `tenants/<t>`, namespaces
/// `namespaces/<t>/<ns>`, partitioned topics `partitioned/<full topic>`.
/// Owned by shard 0; never crosses cores.
#[derive(Clone)]
pub struct Metadata {
    store: Rc<dyn MetadataStore>,
}

impl Metadata {
    pub fn new(store: Rc<dyn MetadataStore>) -> Self {
        Self { store }
    }

    /// Creates tenant `public` and namespace `public/default` in a store that
    /// has no tenant at all (a fresh data directory).
    pub async fn bootstrap(&self) -> Result<(), CoreError> {
        if !self.store.list("tenants/").await?.is_empty() {
            return Ok(());
        }
        self.create_tenant(DEFAULT_TENANT, TenantInfo::default()).await?;
        self.create_namespace(DEFAULT_NAMESPACE, Policies::default()).await?;
        tracing::info!("created tenant {DEFAULT_TENANT} and namespace {DEFAULT_NAMESPACE}");
        Ok(())
    }

    pub async fn tenant(&self, tenant: &str) -> Result<Option<TenantInfo>, CoreError> {
        let key = format!("tenants/{tenant}");
        match self.store.get(&key).await? {
            Some(v) => Ok(Some(decode(&key, &v)?)),
            None => Ok(None),
        }
    }

    pub async fn create_tenant(&self, tenant: &str, info: TenantInfo) -> Result<(), CoreError> {
        if !valid_name_part(tenant) {
            return Err(bad_name("tenant", tenant));
        }
        if self.tenant(tenant).await?.is_some() {
            return Err(CoreError::new(ErrorCode::NotAllowed, format!("tenant {tenant:?} already exists")));
        }
        self.store.put(&format!("tenants/{tenant}"), encode(&info)).await
    }

    pub async fn tenants(&self) -> Result<Vec<String>, CoreError> {
        Ok(self.store.list("tenants/").await?.into_iter().map(|(k, _)| k["tenants/".len()..].to_string()).collect())
    }

    pub async fn delete_tenant(&self, tenant: &str) -> Result<(), CoreError> {
        if self.tenant(tenant).await?.is_none() {
            return Err(not_found("tenant", tenant));
        }
        let namespaces = self.namespaces(tenant).await?;
        if !namespaces.is_empty() {
            return Err(CoreError::new(
                ErrorCode::NotAllowed,
                format!("tenant {tenant:?} still has namespaces: {}", namespaces.join(", ")),
            ));
        }
        self.store.delete(&format!("tenants/{tenant}")).await
    }

    pub async fn policies(&self, namespace: &str) -> Result<Option<Policies>, CoreError> {
        let key = format!("namespaces/{namespace}");
        match self.store.get(&key).await? {
            Some(v) => Ok(Some(decode(&key, &v)?)),
            None => Ok(None),
        }
    }

    pub async fn create_namespace(&self, namespace: &str, policies: Policies) -> Result<(), CoreError> {
        let (tenant, _) = parse_namespace(namespace)?;
        check_policies(&policies)?;
        if self.tenant(tenant).await?.is_none() {
            return Err(not_found("tenant", tenant));
        }
        if self.policies(namespace).await?.is_some() {
            return Err(CoreError::new(ErrorCode::NotAllowed, format!("namespace {namespace:?} already exists")));
        }
        self.store.put(&format!("namespaces/{namespace}"), encode(&policies)).await
    }

    /// Namespaces of `tenant`, as `tenant/ns`.
    pub async fn namespaces(&self, tenant: &str) -> Result<Vec<String>, CoreError> {
        let prefix = format!("namespaces/{tenant}/");
        Ok(self.store.list(&prefix).await?.into_iter().map(|(k, _)| k["namespaces/".len()..].to_string()).collect())
    }

    /// Replaces the namespace's policies; the bundle count may not change.
    pub async fn set_policies(&self, namespace: &str, policies: Policies) -> Result<(), CoreError> {
        check_policies(&policies)?;
        let old = self.policies(namespace).await?.ok_or_else(|| not_found("namespace", namespace))?;
        if old.bundles != policies.bundles {
            return Err(CoreError::new(
                ErrorCode::NotAllowed,
                format!(
                    "the bundle count of {namespace:?} is fixed at creation ({}); bundle splitting is not built yet",
                    old.bundles
                ),
            ));
        }
        self.store.put(&format!("namespaces/{namespace}"), encode(&policies)).await
    }

    /// Deletes an empty namespace; `topics` are the topics it still holds.
    pub async fn delete_namespace(&self, namespace: &str, topics: &[String]) -> Result<(), CoreError> {
        if self.policies(namespace).await?.is_none() {
            return Err(not_found("namespace", namespace));
        }
        if !topics.is_empty() {
            return Err(CoreError::new(
                ErrorCode::NotAllowed,
                format!("namespace {namespace:?} still has {} topic(s), e.g. {}", topics.len(), topics[0]),
            ));
        }
        self.store.delete(&format!("namespaces/{namespace}")).await
    }

    pub async fn partitioned(&self, topic: &str) -> Result<Option<PartitionedMetadata>, CoreError> {
        let key = format!("partitioned/{topic}");
        match self.store.get(&key).await? {
            Some(v) => Ok(Some(decode(&key, &v)?)),
            None => Ok(None),
        }
    }

    /// Creates or grows (never shrinks) a partitioned topic.
    pub async fn set_partitioned(&self, topic: &str, partitions: u32, create: bool) -> Result<(), CoreError> {
        if partitions == 0 || partitions > PARTITIONS_MAX {
            return Err(CoreError::new(
                ErrorCode::NotAllowed,
                format!("a partitioned topic has 1 to {PARTITIONS_MAX} partitions, not {partitions}"),
            ));
        }
        match (self.partitioned(topic).await?, create) {
            (Some(_), true) => {
                return Err(CoreError::new(ErrorCode::NotAllowed, format!("topic {topic:?} already exists")))
            }
            (None, false) => return Err(not_found("partitioned topic", topic)),
            (Some(old), false) if partitions < old.partitions => {
                return Err(CoreError::new(
                    ErrorCode::NotAllowed,
                    format!("partitions can only grow: {topic:?} has {}, asked for {partitions}", old.partitions),
                ))
            }
            _ => {}
        }
        self.store.put(&format!("partitioned/{topic}"), encode(&PartitionedMetadata { partitions })).await
    }

    pub async fn delete_partitioned(&self, topic: &str) -> Result<(), CoreError> {
        if self.partitioned(topic).await?.is_none() {
            return Err(not_found("partitioned topic", topic));
        }
        self.store.delete(&format!("partitioned/{topic}")).await
    }

    /// The topic's overrides of its namespace's policies (empty when none).
    pub async fn topic_overrides(&self, topic: &str) -> Result<TopicOverrides, CoreError> {
        let key = format!("topic-policies/{topic}");
        match self.store.get(&key).await? {
            Some(v) => decode(&key, &v),
            None => Ok(TopicOverrides::default()),
        }
    }

    /// Replaces the topic's overrides; empty ones delete the record.
    pub async fn set_topic_overrides(&self, topic: &str, o: &TopicOverrides) -> Result<(), CoreError> {
        if let Some(r) = o.retention {
            if r.retention_minutes < -1 || r.retention_size_mb < -1 {
                return Err(CoreError::new(ErrorCode::NotAllowed, "retention values are -1 (unbounded) or >= 0"));
            }
        }
        let key = format!("topic-policies/{topic}");
        if o.is_empty() {
            if self.store.get(&key).await?.is_some() {
                self.store.delete(&key).await?;
            }
            return Ok(());
        }
        self.store.put(&key, encode(o)).await
    }

    /// The grants on `resource` (a namespace `tenant/ns` or a full topic
    /// name); empty when there are none.
    pub async fn permissions(&self, resource: &str) -> Result<Permissions, CoreError> {
        let key = format!("permissions/{resource}");
        match self.store.get(&key).await? {
            Some(v) => decode(&key, &v),
            None => Ok(Permissions::new()),
        }
    }

    /// Replaces the grants on `resource`; none deletes the record.
    pub async fn set_permissions(&self, resource: &str, p: &Permissions) -> Result<(), CoreError> {
        let key = format!("permissions/{resource}");
        if p.is_empty() {
            if self.store.get(&key).await?.is_some() {
                self.store.delete(&key).await?;
            }
            return Ok(());
        }
        self.store.put(&key, encode(p)).await
    }

    /// Partitioned topics whose name starts with `prefix` (a full
    /// `persistent://tenant/ns/` prefix).
    pub async fn partitioned_topics(&self, prefix: &str) -> Result<Vec<(String, u32)>, CoreError> {
        let mut out = Vec::new();
        for (k, v) in self.store.list(&format!("partitioned/{prefix}")).await? {
            let meta: PartitionedMetadata = decode(&k, &v)?;
            out.push((k["partitioned/".len()..].to_string(), meta.partitions));
        }
        Ok(out)
    }
}

fn check_policies(p: &Policies) -> Result<(), CoreError> {
    if p.bundles == 0 || p.bundles > BUNDLES_MAX {
        return Err(CoreError::new(ErrorCode::NotAllowed, format!("bundles must be 1..={BUNDLES_MAX}")));
    }
    if p.default_partitions > PARTITIONS_MAX {
        return Err(CoreError::new(ErrorCode::NotAllowed, format!("default_partitions must be 0..={PARTITIONS_MAX}")));
    }
    if p.retention_minutes < -1 || p.retention_size_mb < -1 {
        return Err(CoreError::new(ErrorCode::NotAllowed, "retention values are -1 (unbounded) or >= 0"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    /// An in-memory store, to test the typed layer without a log.
    #[derive(Default)]
    struct MemStore(RefCell<BTreeMap<String, Bytes>>);

    impl MetadataStore for MemStore {
        fn get(&self, key: &str) -> LocalBoxFuture<'static, Result<Option<Bytes>, CoreError>> {
            futures::future::ready(Ok(self.0.borrow().get(key).cloned())).boxed_local()
        }
        fn list(&self, prefix: &str) -> LocalBoxFuture<'static, Result<Vec<(String, Bytes)>, CoreError>> {
            let v = self
                .0
                .borrow()
                .range(prefix.to_string()..)
                .take_while(|(k, _)| k.starts_with(prefix))
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect();
            futures::future::ready(Ok(v)).boxed_local()
        }
        fn put(&self, key: &str, value: Bytes) -> LocalBoxFuture<'static, Result<(), CoreError>> {
            self.0.borrow_mut().insert(key.to_string(), value);
            futures::future::ready(Ok(())).boxed_local()
        }
        fn delete(&self, key: &str) -> LocalBoxFuture<'static, Result<(), CoreError>> {
            self.0.borrow_mut().remove(key);
            futures::future::ready(Ok(())).boxed_local()
        }
    }

    #[test]
    fn tenants_namespaces_and_partitions() {
        futures::executor::block_on(async {
            let m = Metadata::new(Rc::new(MemStore::default()));
            m.bootstrap().await.unwrap();
            m.bootstrap().await.unwrap();
            assert_eq!(m.tenants().await.unwrap(), vec!["public"]);
            assert_eq!(m.namespaces("public").await.unwrap(), vec!["public/default"]);
            assert!(m.create_tenant("public", TenantInfo::default()).await.is_err());
            assert_eq!(
                m.create_tenant("a b", TenantInfo::default()).await.unwrap_err().code,
                ErrorCode::InvalidTopicName
            );
            assert_eq!(
                m.create_namespace("nope/ns", Policies::default()).await.unwrap_err().code,
                ErrorCode::TopicNotFound
            );
            assert!(m.delete_tenant("public").await.is_err(), "tenant with namespaces deleted");
            let t = "persistent://public/default/p";
            m.set_partitioned(t, 4, true).await.unwrap();
            assert!(m.set_partitioned(t, 4, true).await.is_err());
            assert!(m.set_partitioned(t, 3, false).await.is_err(), "shrunk");
            m.set_partitioned(t, 6, false).await.unwrap();
            assert_eq!(m.partitioned(t).await.unwrap(), Some(PartitionedMetadata { partitions: 6 }));
            let mut p = m.policies("public/default").await.unwrap().unwrap();
            p.bundles = 4;
            assert!(m.set_policies("public/default", p).await.is_err(), "bundle count changed");
            // Topic overrides: set, applied field by field, removed.
            let t1 = "persistent://public/default/t1";
            assert!(m.topic_overrides(t1).await.unwrap().is_empty());
            let mut o = TopicOverrides {
                retention: Some(TopicRetention { retention_minutes: 5, retention_size_mb: -1 }),
                ..Default::default()
            };
            m.set_topic_overrides(t1, &o).await.unwrap();
            let ns = Policies { message_ttl_seconds: 9, ..Policies::default() };
            let applied = m.topic_overrides(t1).await.unwrap().apply(ns.clone());
            assert_eq!((applied.retention_minutes, applied.retention_size_mb, applied.message_ttl_seconds), (5, -1, 9));
            o.retention = Some(TopicRetention { retention_minutes: -2, retention_size_mb: 0 });
            assert!(m.set_topic_overrides(t1, &o).await.is_err(), "bad retention accepted");
            m.set_topic_overrides(t1, &TopicOverrides::default()).await.unwrap();
            assert!(m.store.get("topic-policies/persistent://public/default/t1").await.unwrap().is_none());
            // A record from a later version with an extra field still decodes.
            m.store
                .put("topic-policies/x", Bytes::from_static(br#"{"message_ttl_seconds":3,"future":1}"#))
                .await
                .unwrap();
            assert_eq!(m.topic_overrides("x").await.unwrap().message_ttl_seconds, Some(3));
            m.delete_namespace("public/default", &[]).await.unwrap();
            m.delete_tenant("public").await.unwrap();
            assert!(m.tenants().await.unwrap().is_empty());
        });
    }
}
