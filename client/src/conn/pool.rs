//! The connections of one `Client`, and which one a topic's producers and
//! consumers use: shard-aware routing, above the connections (a connection
//! knows nothing of its siblings).
//!
//! A broker with per-shard listeners announces their ports in `Connected`
//! (`shard_ports`). Before creating a producer or consumer, the client asks
//! which shard owns the topic (admin `topics.owner`, answered with the shard
//! and its port) and uses a connection to that port, so the broker never
//! forwards the topic's requests between shards (a cross-core hop each
//! way). Connections are pooled per address in [`Pool`] and held weakly:
//! one closes when its last producer or consumer (or the `Client`, for the
//! first one) is dropped.
//!
//! Fallbacks, all to the shared port the client was given (which serves every
//! topic): a broker without per-shard ports (an older one, or one shard), a
//! failed lookup, or a shard port that does not answer. A shard port refuses
//! producers and consumers of topics another shard owns with `NotOwner`
//! (ownership moved, or the lookup was stale); [`Pool::on_owner`] then looks
//! up again, up to [`NOT_OWNER_LOOKUPS_MAX`] times, and finally uses the
//! shared port.

use super::admin::Admin;
use super::{ClientOptions, Connection};
use crate::error::{ClientError, Result};
use magnetar_wire::ErrorCode;
use serde_json::{json, Value};
use std::collections::HashMap;
use std::future::Future;
use std::sync::{Arc, Weak};

/// Lookups a builder makes for one topic while the owner it finds answers
/// `NotOwner`, before it gives up on shard ports and uses the shared port.
pub const NOT_OWNER_LOOKUPS_MAX: u32 = 3;

/// The connections of one `Client`, by address, and how to open more.
pub(crate) struct Pool {
    /// The host the client was given; shard ports are on the same host.
    host: String,
    /// The port the client was given (served by every shard).
    shared_port: u16,
    pub(crate) options: ClientOptions,
    /// Held across a connect, so that concurrent creators reuse one
    /// connection per address rather than each opening their own.
    connecting: tokio::sync::Mutex<()>,
    /// Never held across an `.await`.
    conns: std::sync::Mutex<HashMap<String, Weak<Connection>>>,
}

/// One of a client's connections and the client's pool: where a builder
/// looks a topic's owner up from and gets the connection for it, and where
/// admin calls go. Cheap to clone; holds `conn` (not the pool's others).
#[derive(Clone)]
pub(crate) struct Origin {
    pub(crate) conn: Arc<Connection>,
    pub(crate) pool: Arc<Pool>,
}

impl Origin {
    /// [`Pool::on_owner`] from this origin's connection.
    pub(crate) async fn on_owner<T, F, Fut>(&self, topic: &str, shard_aware: bool, attempt: F) -> Result<T>
    where
        F: FnMut(Arc<Connection>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        self.pool.on_owner(&self.conn, topic, shard_aware, attempt).await
    }

    /// Admin calls on this origin's connection.
    pub(crate) fn admin(&self) -> Admin {
        Admin { conn: self.conn.clone() }
    }
}

impl Pool {
    /// Opens the client's first connection, to `host:port` (the shared
    /// port), and the pool it starts.
    pub(crate) async fn connect(host: &str, port: u16, options: ClientOptions) -> Result<Origin> {
        let conn = Arc::new(Connection::open(host, port, options.clone()).await?);
        let pool = Pool {
            host: host.to_string(),
            shared_port: port,
            options,
            connecting: tokio::sync::Mutex::new(()),
            conns: std::sync::Mutex::new(HashMap::new()),
        };
        pool.conns().insert(pool.key(port), Arc::downgrade(&conn));
        Ok(Origin { conn, pool: Arc::new(pool) })
    }

    fn conns(&self) -> std::sync::MutexGuard<'_, HashMap<String, Weak<Connection>>> {
        // Only map operations happen under the lock; a poisoned map is intact.
        self.conns.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A pooled connection to `key` that is still up.
    fn live(&self, key: &str) -> Option<Arc<Connection>> {
        self.conns().get(key).and_then(Weak::upgrade).filter(|c| c.is_open())
    }

    /// Ends every connection of the client (`Client::close`).
    pub(crate) fn close_all(&self, reason: &str) {
        let conns: Vec<Arc<Connection>> = self.conns().values().filter_map(Weak::upgrade).collect();
        for conn in conns {
            conn.fail(reason.to_string());
        }
    }

    fn key(&self, port: u16) -> String {
        format!("{}:{port}", self.host)
    }

    /// A live connection to `port` on the client's host: a pooled one, or a
    /// new one.
    async fn get(&self, port: u16) -> Result<Arc<Connection>> {
        let key = self.key(port);
        if let Some(conn) = self.live(&key) {
            return Ok(conn);
        }
        let _connecting = self.connecting.lock().await;
        // Someone else may have connected while we waited.
        if let Some(conn) = self.live(&key) {
            return Ok(conn);
        }
        let conn = Arc::new(Connection::open(&self.host, port, self.options.clone()).await?);
        let mut conns = self.conns();
        conns.retain(|_, c| c.strong_count() > 0);
        conns.insert(key, Arc::downgrade(&conn));
        Ok(conn)
    }

    /// Runs `attempt` (creating a producer or consumer of `topic`, a full
    /// name) on the connection [`for_topic`](Self::for_topic) picks, looked
    /// up from `from`; while the shard it lands on answers `NotOwner`, looks
    /// the owner up again, up to [`NOT_OWNER_LOOKUPS_MAX`] times, then uses
    /// the shared port. `shard_aware` false: the shared port at once.
    async fn on_owner<T, F, Fut>(
        &self,
        from: &Arc<Connection>,
        topic: &str,
        shard_aware: bool,
        mut attempt: F,
    ) -> Result<T>
    where
        F: FnMut(Arc<Connection>) -> Fut,
        Fut: Future<Output = Result<T>>,
    {
        let mut lookups = 0;
        loop {
            let shard_aware = shard_aware && lookups < NOT_OWNER_LOOKUPS_MAX;
            let conn = self.for_topic(from, topic, shard_aware).await;
            match attempt(conn).await {
                Err(e) if shard_aware && is_not_owner(&e) => {
                    tracing::debug!(%topic, error = %e, "refused by a shard that does not own the topic");
                    lookups += 1;
                }
                result => return result,
            }
        }
    }

    /// The connection the producers and consumers of `topic` (a full name)
    /// should use, asked through `from`: one to the owner shard's own port
    /// when the broker has them and `shard_aware` is on, else the shared
    /// port. Never fails: every failure falls back to the shared port, which
    /// serves every topic.
    async fn for_topic(&self, from: &Arc<Connection>, topic: &str, shard_aware: bool) -> Arc<Connection> {
        if shard_aware && self.options.shard_aware && from.server.shard_ports.len() > 1 {
            match self.owner_connection(from, topic).await {
                Ok(conn) => return conn,
                Err(e) => tracing::debug!(topic, error = %e, "no connection to the owner shard; using the shared port"),
            }
        }
        self.shared_port_connection(from).await
    }

    async fn owner_connection(&self, from: &Arc<Connection>, topic: &str) -> Result<Arc<Connection>> {
        let answer = Admin { conn: from.clone() }.call("topics.owner", json!({ "topic": topic })).await?;
        let unexpected = || ClientError::UnexpectedResponse { request: "topics.owner", got: answer.to_string() };
        let shard = answer.get("shard").and_then(Value::as_u64).ok_or_else(unexpected)?;
        if shard == u64::from(from.server.shard) {
            // Already there (the kernel put the shared-port connection on
            // the owner, or this is the owner's own port).
            return Ok(from.clone());
        }
        let port = answer.get("shard_port").and_then(Value::as_u64).and_then(|p| u16::try_from(p).ok());
        let port = port.ok_or_else(unexpected)?;
        self.get(port).await
    }

    /// A connection to the shared port: `from` if it is one, else a pooled
    /// or new one (`from` if that fails: its requests may then be refused
    /// with `NotOwner`, which the caller reports).
    async fn shared_port_connection(&self, from: &Arc<Connection>) -> Arc<Connection> {
        if from.port == self.shared_port {
            return from.clone();
        }
        match self.get(self.shared_port).await {
            Ok(conn) => conn,
            Err(e) => {
                tracing::debug!(error = %e, "cannot reach the shared port");
                from.clone()
            }
        }
    }
}

/// Whether an error says the topic's owner is elsewhere.
fn is_not_owner(e: &ClientError) -> bool {
    matches!(e, ClientError::Broker { code: ErrorCode::NotOwner, .. })
}
