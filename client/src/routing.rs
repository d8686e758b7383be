//! Shard-aware routing: producers and consumers of a topic connect straight
//! to the broker shard that owns it.
//!
//! A broker with per-shard listeners announces their ports in `Connected`
//! (`shard_ports`). Before creating a producer or consumer, the client asks
//! which shard owns the topic (admin `topics.owner`, answered with the shard
//! and its port) and uses a connection to that port, so the broker never
//! forwards the topic's requests between shards (a cross-core hop each way,
//! about 75 µs per message at p50, `bench/README.md`). Connections are pooled
//! per address in [`Peers`], shared by every connection of one `Client`, and
//! held weakly: one closes when its last producer or consumer is dropped.
//!
//! Fallbacks, all to the shared port the client was given (which serves every
//! topic): a broker without per-shard ports (an older one, or one shard), a
//! failed lookup, or a shard port that does not answer. A shard port refuses
//! producers and consumers of topics another shard owns with `NotOwner`
//! (ownership moved, or the lookup was stale); the builders then look up
//! again, up to [`NOT_OWNER_LOOKUPS_MAX`] times, and finally use the shared
//! port.

use crate::connection::{is_open, ClientOptions, Connection};
use crate::error::{ClientError, Result};
use magnetar_wire::ErrorCode;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::sync::{Arc, Weak};

/// Lookups a builder makes for one topic while the owner it finds answers
/// `NotOwner`, before it gives up on shard ports and uses the shared port.
pub const NOT_OWNER_LOOKUPS_MAX: u32 = 3;

/// The connections of one `Client`, by address, and how to open more.
pub(crate) struct Peers {
    /// The host the client was given; shard ports are on the same host.
    host: String,
    /// The port the client was given (served by every shard).
    shared_port: u16,
    options: ClientOptions,
    /// Held across a connect, so that concurrent creators reuse one
    /// connection per address rather than each opening their own.
    connecting: tokio::sync::Mutex<()>,
    /// Never held across an `.await`.
    conns: std::sync::Mutex<HashMap<String, Weak<Connection>>>,
}

impl Peers {
    pub(crate) fn new(host: &str, shared_port: u16, options: ClientOptions) -> Self {
        Self {
            host: host.to_string(),
            shared_port,
            options,
            connecting: tokio::sync::Mutex::new(()),
            conns: std::sync::Mutex::new(HashMap::new()),
        }
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<String, Weak<Connection>>> {
        // Only map operations happen under the lock; a poisoned map is intact.
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A pooled connection to `key` that is still up.
    fn live(&self, key: &str) -> Option<Arc<Connection>> {
        self.conns().get(key).and_then(Weak::upgrade).filter(|c| is_open(&c.shared))
    }

    /// Ends every connection of the client (`Client::close`).
    pub(crate) fn close_all(&self, reason: &str) {
        let conns: Vec<Arc<Connection>> = self.conns().values().filter_map(Weak::upgrade).collect();
        for conn in conns {
            conn.shared.fail(reason.to_string());
        }
    }

    fn key(&self, port: u16) -> String {
        format!("{}:{port}", self.host)
    }

    /// Records a connection opened elsewhere (the client's first one).
    pub(crate) fn adopt(&self, port: u16, conn: &Arc<Connection>) {
        self.conns().insert(self.key(port), Arc::downgrade(conn));
    }

    /// A live connection to `port` on the client's host: a pooled one, or a
    /// new one.
    async fn get(self: &Arc<Self>, port: u16) -> Result<Arc<Connection>> {
        let key = self.key(port);
        if let Some(conn) = self.live(&key) {
            return Ok(conn);
        }
        let _connecting = self.connecting.lock().await;
        // Someone else may have connected while we waited.
        if let Some(conn) = self.live(&key) {
            return Ok(conn);
        }
        let conn = Arc::new(Connection::open_in(&self.host, port, self.options.clone(), self.clone()).await?);
        let mut conns = self.conns();
        conns.retain(|_, c| c.strong_count() > 0);
        conns.insert(key, Arc::downgrade(&conn));
        Ok(conn)
    }
}

/// Whether an error says the topic's owner is elsewhere.
pub(crate) fn is_not_owner(e: &ClientError) -> bool {
    matches!(e, ClientError::Broker { code: ErrorCode::NotOwner, .. })
}

impl Connection {
    /// The connection the producers and consumers of `topic` (a full name)
    /// should use: one to the owner shard's own port when the broker has
    /// them and `shard_aware` is on, else the shared port. Never fails: every
    /// failure falls back to the shared port, which serves every topic.
    pub(crate) async fn for_topic(self: &Arc<Self>, topic: &str, shard_aware: bool) -> Arc<Connection> {
        if shard_aware && self.options.shard_aware && self.server.shard_ports.len() > 1 {
            match self.owner_connection(topic).await {
                Ok(conn) => return conn,
                Err(e) => tracing::debug!(topic, error = %e, "no connection to the owner shard; using the shared port"),
            }
        }
        self.shared_port_connection().await
    }

    async fn owner_connection(self: &Arc<Self>, topic: &str) -> Result<Arc<Connection>> {
        let answer = crate::Admin { conn: self.clone() }.call("topics.owner", json!({ "topic": topic })).await?;
        let unexpected = || ClientError::UnexpectedResponse { request: "topics.owner", got: answer.to_string() };
        let shard = answer.get("shard").and_then(Value::as_u64).ok_or_else(unexpected)?;
        if shard == u64::from(self.server.shard) {
            // Already there (the kernel put the shared-port connection on
            // the owner, or this is the owner's own port).
            return Ok(self.clone());
        }
        let port = answer.get("shard_port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok());
        let port = port.ok_or_else(unexpected)?;
        self.peers.get(port).await
    }

    /// A connection to the shared port: this one if it is one, else a
    /// pooled or new one (this one if that fails: its requests may then be
    /// refused with `NotOwner`, which the caller reports).
    async fn shared_port_connection(self: &Arc<Self>) -> Arc<Connection> {
        if self.port == self.peers.shared_port {
            return self.clone();
        }
        match self.peers.get(self.peers.shared_port).await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::debug!(error = %e, "cannot reach the shared port");
                self.clone()
            }
        }
    }
}
