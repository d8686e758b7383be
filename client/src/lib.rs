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
//!
//! Layout, each depending only on the ones after it:
//! - `consumer/`: builder and subscribe, the queue and batch unpacking,
//!   acks (grouping, batch-index acks), the ack-timeout and nack tracker,
//!   chunk reassembly, dead letters and retry, multi-topic consumers;
//! - `producer/`: builder, sends and their receipts, batching, chunking,
//!   partitioned routing, the reconnecting producer;
//! - `conn/`: one connection (socket tasks, frame demultiplexing, send
//!   timeouts), the pool of a client's connections with the owner lookup
//!   and its `NotOwner` retry, and admin;
//! - `message`, `names`, `compression`, `error`: values shared by all.
//!
//! Builders reach the pool through a `conn::pool::Origin` (a connection
//! and the pool), not through `Client`; only `ResilientProducer`, which
//! makes whole clients, names `Client`.

mod compression;
mod conn;
mod consumer;
mod error;
mod message;
mod names;
mod producer;

pub use compression::{compress, decompress, UNCOMPRESSED_BYTES_MAX};
pub use conn::admin::{Admin, TOPICS_PAGE};
pub use conn::pool::NOT_OWNER_LOOKUPS_MAX;
pub use conn::tls::TlsOptions;
pub use conn::{AuthToken, ClientOptions, ServerInfo};
pub use consumer::ack_group::{ACK_GROUP_MAX_DEFAULT, ACK_GROUP_TIME_DEFAULT};
pub use consumer::chunking::{CHUNK_EXPIRY, INCOMPLETE_CHUNKED_MAX};
pub use consumer::multi::MultiTopicConsumer;
pub use consumer::tracker::{NackBackoff, ACK_TIMEOUT_BUCKETS};
pub use consumer::{
    Consumer, ConsumerBuilder, DeadLetterPolicy, Reconsumed, RetryPolicy, DEFAULT_RECEIVER_QUEUE_SIZE,
    PROPERTY_ORIGIN_MESSAGE_ID, PROPERTY_REAL_TOPIC, PROPERTY_RECONSUME_TIMES, RECEIVER_QUEUE_SIZE_MAX,
    ROCKETMQ_RETRY_DELAYS,
};
pub use error::{ClientError, Result};
pub use message::{Message, OutgoingMessage};
pub use names::{normalize_topic, parse_service_url, ServiceUrl, DEFAULT_PORT};
pub use producer::batch::BatchingOptions;
pub use producer::partitioned::{
    key_partition, MessageRouter, PartitionedProducer, RoutedSend, RoutingMode, PARTITIONS_REFRESH_INTERVAL,
};
pub use producer::reconnect::{ReconnectOptions, ResilientProducer, ServiceUrlProvider};
pub use producer::{Producer, ProducerBuilder, SendFuture, DEFAULT_CHUNK_BYTES, DEFAULT_MAX_PENDING, MAX_PENDING_MAX};

// The protocol types an application needs, so it does not have to depend on
// magnetar-wire itself.
pub use magnetar_wire::{
    AckType, AllocationStrategy, CompressionType, ConsumptionModel, ErrorCode, InitialPosition, MessageId,
    MessageMetadata, ProducerAccessMode, SubscriptionMode, SubscriptionType, WireError,
};

use conn::pool::{Origin, Pool};

/// A client of one broker: its connection to the address it was given, and
/// the pool of its connections to the broker's shards. Cheap to clone
/// (clones share them). The first connection closes when the client, and
/// every producer and consumer on it, are dropped, or on [`Client::close`].
#[derive(Clone)]
pub struct Client {
    /// The connection to the address the client was given (lookups and
    /// admin go through it), and the pool.
    origin: Origin,
}

impl std::fmt::Debug for Client {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Client").field("server", &self.origin.conn.server).finish_non_exhaustive()
    }
}

impl Client {
    /// Connect with default options. `url` is `magnetar://HOST:PORT` or
    /// `HOST:PORT` (port defaults to 6650).
    pub async fn connect(url: &str) -> Result<Client> {
        Self::connect_with(url, ClientOptions::default()).await
    }

    /// A `magnetar+tls://` (or `pulsar+ssl://`) URL needs `options.tls`
    /// (the CA to trust); with `options.tls` set, any URL uses TLS.
    pub async fn connect_with(url: &str, options: ClientOptions) -> Result<Client> {
        let url = parse_service_url(url)?;
        if url.tls && options.tls.is_none() {
            return Err(ClientError::Tls {
                reason: format!("{url} needs the CA to trust: set ClientOptions::tls (the CLI's --tls-ca FILE)"),
            });
        }
        let origin = Pool::connect(&url.host, url.port, options).await?;
        Ok(Client { origin })
    }

    /// Start building a producer on `topic` (`topic`, `tenant/ns/topic` or a full name).
    pub fn producer(&self, topic: impl Into<String>) -> ProducerBuilder {
        ProducerBuilder::new(self.origin.clone(), topic.into())
    }

    /// Start building a consumer of `subscription` on `topic`.
    pub fn subscribe(&self, topic: impl Into<String>, subscription: impl Into<String>) -> ConsumerBuilder {
        ConsumerBuilder::new(self.origin.clone(), topic.into(), subscription.into())
    }

    /// Per-subscription statistics of `topic`, as the JSON object the broker
    /// builds (layout in `docs/semantics.md`).
    pub async fn topic_stats(&self, topic: &str) -> Result<String> {
        let topic = normalize_topic(topic)?;
        let answer = self
            .origin
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
        self.origin.admin()
    }

    /// What the broker announced in its `Connected` answer.
    pub fn server_info(&self) -> &ServerInfo {
        &self.origin.conn.server
    }

    pub fn options(&self) -> &ClientOptions {
        &self.origin.pool.options
    }

    /// False once the connection has ended, for whatever reason.
    pub fn is_connected(&self) -> bool {
        self.origin.conn.is_open()
    }

    /// Why the connection ended, if it has.
    pub fn disconnect_reason(&self) -> Option<String> {
        self.origin.conn.closed_reason()
    }

    /// Close the connection now (and the client's connections to other
    /// shards): frames already queued get a short chance to be written,
    /// everything still waiting fails with `Disconnected`. Close producers
    /// and consumers first for a graceful end.
    pub fn close(&self) {
        self.origin.conn.fail("closed by the client".to_string());
        self.origin.pool.close_all("closed by the client");
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
