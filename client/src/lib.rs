//! magnetar-client: the Rust client SDK for Magnetar, on tokio.
//!
//! ```no_run
//! use magnetar_client::{Client, InitialPosition, OutgoingMessage};
//! # async fn f() -> Result<(), magnetar_client::ClientError> {
//! let client = Client::connect("magnetar://127.0.0.1:6650").await?;
//! let producer = client.producer("orders").create().await?;
//! let id = producer.send(OutgoingMessage::new("hello").with_key("k1")).await?;
//! let consumer = client.subscribe("orders", "s1").initial_position(InitialPosition::Earliest).subscribe().await?;
//! let msg = consumer.receive().await?;
//! consumer.ack(&msg.id).await?;
//! # let _ = id; Ok(()) }
//! ```
//!
//! One [`Client`] is one TCP connection to the address it was given, plus,
//! when the broker listens on a port per shard, one connection per shard
//! that owns a topic of its producers and consumers (each connects straight
//! to its topic's owner; `ClientOptions::shard_aware`). Producers and
//! consumers on the same shard share a connection. See `README.md` for the
//! threading model and limits.

mod ack_group;
mod admin;
mod batch;
mod chunking;
mod compression;
mod connection;
mod consumer;
mod error;
mod message;
mod multi;
mod names;
mod partitioned;
mod producer;
mod reconnect;
mod routing;

pub use admin::Admin;
pub use batch::BatchingOptions;
pub use chunking::{CHUNK_EXPIRY, DEFAULT_CHUNK_BYTES, INCOMPLETE_CHUNKED_MAX};
pub use compression::{compress, decompress, UNCOMPRESSED_BYTES_MAX};
mod tracker;

pub use ack_group::{ACK_GROUP_MAX_DEFAULT, ACK_GROUP_TIME_DEFAULT};
pub use connection::{ClientOptions, ServerInfo};
pub use consumer::{
    Consumer, ConsumerBuilder, DeadLetterPolicy, DEFAULT_RECEIVER_QUEUE_SIZE, PROPERTY_ORIGIN_MESSAGE_ID,
    PROPERTY_REAL_TOPIC, PROPERTY_RECONSUME_TIMES, RECEIVER_QUEUE_SIZE_MAX,
};
pub use error::{ClientError, Result};
pub use message::{Message, OutgoingMessage};
pub use multi::MultiTopicConsumer;
pub use names::{normalize_topic, parse_service_url, ServiceUrl, DEFAULT_PORT};
pub use partitioned::{
    key_partition, MessageRouter, PartitionedProducer, RoutedSend, RoutingMode, PARTITIONS_REFRESH_INTERVAL,
};
pub use producer::{Producer, ProducerBuilder, SendFuture, DEFAULT_MAX_PENDING, MAX_PENDING_MAX};
pub use reconnect::{ReconnectOptions, ResilientProducer, ServiceUrlProvider};
pub use routing::NOT_OWNER_LOOKUPS_MAX;
pub use tracker::{NackBackoff, ACK_TIMEOUT_BUCKETS};

// The protocol types an application needs, so it does not have to depend on
// magnetar-wire itself.
pub use magnetar_wire::{
    AckType, CompressionType, ErrorCode, InitialPosition, MessageId, MessageMetadata, ProducerAccessMode,
    SubscriptionType, WireError,
};

use connection::Connection;
use std::sync::Arc;

/// A connection to one broker. Cheap to clone (clones share the connection).
/// The connection closes when the client, and every producer and consumer
/// made from it, are dropped, or on [`Client::close`].
#[derive(Clone)]
pub struct Client {
    conn: Arc<Connection>,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("server", &self.conn.server).finish_non_exhaustive()
    }
}

impl Client {
    /// Connect with default options. `url` is `magnetar://HOST:PORT` or
    /// `HOST:PORT` (port defaults to 6650).
    pub async fn connect(url: &str) -> Result<Client> {
        Self::connect_with(url, ClientOptions::default()).await
    }

    pub async fn connect_with(url: &str, options: ClientOptions) -> Result<Client> {
        let url = parse_service_url(url)?;
        let conn = Arc::new(Connection::open(&url.host, url.port, options).await?);
        conn.peers.adopt(url.port, &conn);
        Ok(Client { conn })
    }

    /// Start building a producer on `topic` (`topic`, `tenant/ns/topic` or a full name).
    pub fn producer(&self, topic: impl Into<String>) -> ProducerBuilder {
        ProducerBuilder::new(self.conn.clone(), topic.into())
    }

    /// Start building a consumer of `subscription` on `topic`.
    pub fn subscribe(&self, topic: impl Into<String>, subscription: impl Into<String>) -> ConsumerBuilder {
        ConsumerBuilder {
            conn: self.conn.clone(),
            topic: topic.into(),
            subscription: subscription.into(),
            sub_type: SubscriptionType::default(),
            initial_position: InitialPosition::default(),
            receiver_queue_size: DEFAULT_RECEIVER_QUEUE_SIZE,
            consumer_name: String::new(),
            priority_level: 0,
            filter_tag: String::new(),
            key_shared_ranges: Vec::new(),
            nack_backoff: NackBackoff::default(),
            ack_timeout: None,
            dead_letter: None,
            retry_enabled: false,
            ack_group_time: ACK_GROUP_TIME_DEFAULT,
            ack_group_max: ACK_GROUP_MAX_DEFAULT,
            durable: true,
            inbox: None,
        }
    }

    /// Per-subscription statistics of `topic`, as the JSON object the broker
    /// builds (layout in `docs/semantics.md`).
    pub async fn topic_stats(&self, topic: &str) -> Result<String> {
        let topic = normalize_topic(topic)?;
        let answer = self
            .conn
            .request("topic stats", |request_id| magnetar_wire::Command::TopicStats {
                request_id,
                topic: topic.clone(),
                json: String::new(),
            })
            .await?;
        match answer {
            magnetar_wire::Command::TopicStats { json, .. } => Ok(json),
            other => Err(ClientError::UnexpectedResponse { request: "TopicStats", got: format!("{other:?}") }),
        }
    }

    /// Admin and lookup operations on this connection.
    pub fn admin(&self) -> Admin {
        Admin { conn: self.conn.clone() }
    }

    /// What the broker announced in its `Connected` answer.
    pub fn server_info(&self) -> &ServerInfo {
        &self.conn.server
    }

    pub fn options(&self) -> &ClientOptions {
        &self.conn.options
    }

    /// False once the connection has ended, for whatever reason.
    pub fn is_connected(&self) -> bool {
        connection::is_open(&self.conn.shared)
    }

    /// Why the connection ended, if it has.
    pub fn disconnect_reason(&self) -> Option<String> {
        self.conn.shared.closed_reason()
    }

    /// Close the connection now (and the client's connections to other
    /// shards): frames already queued get a short chance to be written,
    /// everything still waiting fails with `Disconnected`. Close producers
    /// and consumers first for a graceful end.
    pub fn close(&self) {
        self.conn.shared.fail("closed by the client".to_string());
        self.conn.peers.close_all("closed by the client");
    }
}

// Handles are shared across tasks and threads; keep them Send + Sync.
const _: fn() = || {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Client>();
    assert_send_sync::<Producer>();
    assert_send_sync::<PartitionedProducer>();
    assert_send_sync::<MultiTopicConsumer>();
    assert_send_sync::<ResilientProducer>();
    assert_send_sync::<Consumer>();
    assert_send_sync::<SendFuture>();
    assert_send_sync::<ClientError>();
    // And their futures can be spawned.
    fn _receive_is_send(m: &MultiTopicConsumer, c: &Consumer) {
        fn send<T: Send>(_: T) {}
        send(m.receive());
        send(c.receive());
    }
};
