//! A producer that survives broker restarts and lost connections: it keeps
//! every message until its receipt arrives, reconnects when the connection
//! fails (to the address a [`ServiceUrlProvider`] gives at that moment), and
//! resends what had no receipt **with the original sequence ids**. With
//! deduplication on in the namespace, the broker stores each of them once
//! and answers a resend of a stored one with its original receipt; without
//! dedup a resend may be stored twice (at-least-once).
//!
//! One driver task owns the connection and the pending messages; the handle
//! talks to it through a bounded channel.

use crate::error::{ClientError, Result};
use crate::message::OutgoingMessage;
use crate::producer::{Producer, SendFuture};
use crate::{Client, ClientOptions};
use magnetar_wire::{MessageId, ProducerAccessMode};
use std::collections::VecDeque;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::{mpsc, oneshot};

/// Where to connect now: called before every (re)connection.
pub type ServiceUrlProvider = Arc<dyn Fn() -> String + Send + Sync>;

/// How a [`ResilientProducer`] reconnects.
#[derive(Debug, Clone)]
pub struct ReconnectOptions {
    /// Give up (failing every pending message) after trying this long.
    pub give_up_after: Duration,
    /// Wait between attempts (doubling up to `backoff_max`).
    pub backoff_min: Duration,
    pub backoff_max: Duration,
    /// Messages awaiting receipts (and resends) at once.
    pub max_pending: usize,
}

impl Default for ReconnectOptions {
    fn default() -> Self {
        Self {
            give_up_after: Duration::from_secs(60),
            backoff_min: Duration::from_millis(50),
            backoff_max: Duration::from_secs(2),
            max_pending: 1000,
        }
    }
}

type Request = (OutgoingMessage, oneshot::Sender<Result<MessageId>>);

/// A producer that reconnects and resends; see the module documentation.
/// `Send + Sync`.
pub struct ResilientProducer {
    tx: mpsc::Sender<Request>,
    name: String,
    reconnects: Arc<std::sync::atomic::AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl std::fmt::Debug for ResilientProducer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ResilientProducer").field("name", &self.name).finish_non_exhaustive()
    }
}

impl Drop for ResilientProducer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Target {
    urls: ServiceUrlProvider,
    client_options: ClientOptions,
    topic: String,
    name: String,
    access_mode: ProducerAccessMode,
    options: ReconnectOptions,
}

impl Target {
    async fn connect(&self) -> Result<(Client, Producer)> {
        let client = Client::connect_with(&(self.urls)(), self.client_options.clone()).await?;
        let producer = client
            .producer(self.topic.as_str())
            .name(self.name.as_str())
            .max_pending(self.options.max_pending)
            .access_mode(self.access_mode)
            .create()
            .await?;
        Ok((client, producer))
    }

    /// Connects, retrying with backoff until `give_up_after`.
    async fn reconnect(&self) -> Result<(Client, Producer)> {
        let started = Instant::now();
        let mut backoff = self.options.backoff_min;
        loop {
            match self.connect().await {
                Ok(x) => return Ok(x),
                Err(e) if e.is_retriable() && started.elapsed() < self.options.give_up_after => {
                    tracing::debug!(error = %e, "reconnect attempt failed");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(self.options.backoff_max);
                }
                Err(e) => return Err(e),
            }
        }
    }
}

struct Pending {
    seq: u64,
    msg: OutgoingMessage,
    done: oneshot::Sender<Result<MessageId>>,
    receipt: Option<SendFuture>,
}

impl ResilientProducer {
    /// Connects to `urls()` and creates the producer `name` on `topic` (a
    /// single topic or partition).
    pub async fn create(
        urls: ServiceUrlProvider,
        client_options: ClientOptions,
        topic: &str,
        name: &str,
        access_mode: ProducerAccessMode,
        options: ReconnectOptions,
    ) -> Result<Self> {
        if name.is_empty() {
            return Err(ClientError::InvalidOption {
                option: "name",
                reason: "a resilient producer needs a fixed name (dedup is per name)",
            });
        }
        let target = Target {
            urls,
            client_options,
            topic: topic.to_string(),
            name: name.to_string(),
            access_mode,
            options: options.clone(),
        };
        let (client, producer) = target.connect().await?;
        let (tx, rx) = mpsc::channel(options.max_pending.max(1));
        let reconnects = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let task = tokio::spawn(drive(target, client, producer, rx, reconnects.clone()));
        Ok(Self { tx, name: name.to_string(), reconnects, task })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// Reconnections so far.
    pub fn reconnects(&self) -> u64 {
        self.reconnects.load(std::sync::atomic::Ordering::Relaxed)
    }

    /// Queue a message; the returned receiver resolves with its receipt
    /// (after any number of reconnections), or the error that ended the
    /// producer. The message's sequence id is assigned here, in call order.
    pub async fn send_async(&self, msg: OutgoingMessage) -> Result<oneshot::Receiver<Result<MessageId>>> {
        let (done, rx) = oneshot::channel();
        self.tx
            .send((msg, done))
            .await
            .map_err(|_| ClientError::ProducerClosed { producer_name: self.name.clone() })?;
        Ok(rx)
    }

    pub async fn send(&self, msg: OutgoingMessage) -> Result<MessageId> {
        let rx = self.send_async(msg).await?;
        rx.await.map_err(|_| ClientError::ProducerClosed { producer_name: self.name.clone() })?
    }
}

async fn drive(
    target: Target,
    mut client: Client,
    mut producer: Producer,
    mut rx: mpsc::Receiver<Request>,
    reconnects: Arc<std::sync::atomic::AtomicU64>,
) {
    let mut next_seq = u64::try_from(producer.last_sequence_id().saturating_add(1)).unwrap_or(0);
    let mut pending: VecDeque<Pending> = VecDeque::new();
    let mut open = true;
    loop {
        if !open && pending.is_empty() {
            break;
        }
        // Await the oldest receipt, or take a new message while there is room.
        let room = pending.len() < target.options.max_pending;
        let unsent = pending.front().is_some_and(|p| p.receipt.is_none());
        let front = pending.front_mut().and_then(|p| p.receipt.as_mut());
        let outcome = if unsent {
            // Its send failed (the connection broke): reconnect and resend.
            Some(Err(ClientError::Disconnected { reason: "send failed".into() }))
        } else {
            tokio::select! {
                biased;
                r = async { match front { Some(f) => f.await, None => std::future::pending().await } } => Some(r),
                req = rx.recv(), if open && room => {
                    match req {
                        Some((msg, done)) => {
                            let seq = next_seq;
                            next_seq += 1;
                            let receipt = producer.send_async(msg.clone().with_sequence_id(seq)).await.ok();
                            // A failed send is retried below, after reconnecting.
                            let failed = receipt.is_none();
                            pending.push_back(Pending { seq, msg, done, receipt });
                            if failed { Some(Err(ClientError::Disconnected { reason: "send failed".into() })) } else { None }
                        }
                        None => { open = false; None }
                    }
                }
            }
        };
        match outcome {
            None => {}
            Some(Ok(id)) => {
                if let Some(p) = pending.pop_front() {
                    let _ = p.done.send(Ok(id));
                }
            }
            Some(Err(e)) if e.is_retriable() => {
                tracing::info!(error = %e, pending = pending.len(), "producer connection lost; reconnecting");
                client.close();
                match target.reconnect().await {
                    Ok((c, p)) => {
                        reconnects.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        client = c;
                        producer = p;
                        let last = u64::try_from(producer.last_sequence_id().saturating_add(1)).unwrap_or(0);
                        next_seq = next_seq.max(last);
                        // Resend everything without a receipt, same ids, in order.
                        for p in pending.iter_mut() {
                            p.receipt = producer.send_async(p.msg.clone().with_sequence_id(p.seq)).await.ok();
                        }
                    }
                    Err(e) => {
                        for p in pending.drain(..) {
                            let _ = p
                                .done
                                .send(Err(ClientError::Disconnected { reason: format!("gave up reconnecting: {e}") }));
                        }
                        return;
                    }
                }
            }
            Some(Err(e)) => {
                // Not retriable (e.g. refused by the broker): this message fails.
                if let Some(p) = pending.pop_front() {
                    let _ = p.done.send(Err(e));
                }
            }
        }
    }
    let _ = producer.close().await;
    client.close();
}
