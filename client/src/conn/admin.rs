//! Admin and lookup over the native protocol: tenants, namespaces and their
//! policies, partitioned topics. Each call is one `AdminRequest` naming an
//! operation with JSON arguments (the list is in `net/src/native/admin.rs` and
//! `docs/internals.md`); [`Admin::call`] is the generic form, the other
//! methods are typed shortcuts.

use super::Connection;
use crate::error::{ClientError, Result};
use magnetar_wire::Command;
use serde_json::{json, Value};
use std::sync::Arc;

/// Names per `topics.list` page that [`Admin::list_topics`] asks for.
pub const TOPICS_PAGE: u32 = 10_000;

/// Made by [`Client::admin`](crate::Client::admin); cheap to clone.
#[derive(Clone)]
pub struct Admin {
    pub(crate) conn: Arc<Connection>,
}

impl std::fmt::Debug for Admin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Admin").finish_non_exhaustive()
    }
}

impl Admin {
    /// Run operation `op` with the JSON object `args`; returns its JSON answer.
    /// A refusal comes back as `ClientError::Broker` with the broker's message.
    pub async fn call(&self, op: &str, args: Value) -> Result<Value> {
        let json = args.to_string();
        let answer = self
            .conn
            .request("admin", |request_id| Command::AdminRequest { request_id, op: op.to_string(), json: json.clone() })
            .await?;
        match answer {
            Command::AdminResponse { json, .. } => serde_json::from_str(&json)
                .map_err(|e| ClientError::UnexpectedResponse { request: "AdminRequest", got: format!("{e}: {json}") }),
            other => Err(ClientError::UnexpectedResponse { request: "AdminRequest", got: format!("{other:?}") }),
        }
    }

    /// One page of the topics of `namespace` (full names, partitions
    /// included, sorted): at most `limit` (1 to 100,000), those after
    /// `after`. A page shorter than `limit` is the last.
    pub async fn list_topics_page(&self, namespace: &str, after: Option<&str>, limit: u32) -> Result<Vec<String>> {
        let v = self.call("topics.list", json!({ "namespace": namespace, "after": after, "limit": limit })).await?;
        v.as_array()
            .and_then(|a| a.iter().map(|n| n.as_str().map(str::to_owned)).collect::<Option<Vec<_>>>())
            .ok_or_else(|| ClientError::UnexpectedResponse { request: "topics.list", got: v.to_string() })
    }

    /// Every topic of `namespace`, sorted, asked for a page at a time (see
    /// [`Admin::list_topics_page`]), so that no one answer is long.
    pub async fn list_topics(&self, namespace: &str) -> Result<Vec<String>> {
        let mut all: Vec<String> = Vec::new();
        loop {
            let page = self.list_topics_page(namespace, all.last().map(String::as_str), TOPICS_PAGE).await?;
            let last = page.len() < TOPICS_PAGE as usize;
            all.extend(page);
            if last {
                return Ok(all);
            }
        }
    }

    /// Partitions of `topic` (a full name); 0 when it is not partitioned.
    pub async fn partitions(&self, topic: &str) -> Result<u32> {
        let v = self.call("topics.partitioned-metadata", json!({ "topic": topic })).await?;
        v.get("partitions").and_then(Value::as_u64).and_then(|p| u32::try_from(p).ok()).ok_or_else(|| {
            ClientError::UnexpectedResponse { request: "topics.partitioned-metadata", got: v.to_string() }
        })
    }

    /// Id of the last stored entry of a non-partitioned topic (or of one
    /// partition); `None` when it has none.
    pub async fn last_message_id(&self, topic: &str) -> Result<Option<magnetar_wire::MessageId>> {
        let v = self.call("topics.last-message-id", json!({ "topic": topic })).await?;
        match v.get("id") {
            Some(Value::Null) => Ok(None),
            Some(Value::String(s)) => s
                .parse()
                .map(Some)
                .map_err(|_| ClientError::UnexpectedResponse { request: "topics.last-message-id", got: v.to_string() }),
            _ => Err(ClientError::UnexpectedResponse { request: "topics.last-message-id", got: v.to_string() }),
        }
    }

    pub async fn create_partitioned_topic(&self, topic: &str, partitions: u32) -> Result<()> {
        self.call("topics.create-partitioned", json!({ "topic": topic, "partitions": partitions })).await.map(|_| ())
    }

    pub async fn create_tenant(&self, tenant: &str) -> Result<()> {
        self.call("tenants.create", json!({ "tenant": tenant })).await.map(|_| ())
    }

    /// Create `tenant/ns`; `policies` may give any subset of the policy fields.
    pub async fn create_namespace(&self, namespace: &str, policies: Value) -> Result<()> {
        self.call("namespaces.create", json!({ "namespace": namespace, "policies": policies })).await.map(|_| ())
    }

    /// Change the given policy fields of `namespace`; returns the new policies.
    pub async fn set_policies(&self, namespace: &str, policies: Value) -> Result<Value> {
        self.call("namespaces.set-policies", json!({ "namespace": namespace, "policies": policies })).await
    }
}
