//! Consuming several topics through one handle: a partitioned topic by its
//! own name (one consumer per partition), or a list of topics. Messages of
//! all of them arrive on one queue; each keeps its topic and its id (whose
//! `partition` names the partition), and acks go to the consumer of the
//! message's topic.

use crate::consumer::{Consumer, ConsumerBuilder};
use crate::error::{ClientError, Result};
use crate::message::Message;
use serde_json::json;
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// A consumer over several topics. `Send + Sync`.
pub struct MultiTopicConsumer {
    subscription: String,
    consumers: Mutex<HashMap<String, Arc<Consumer>>>,
    tx: mpsc::Sender<Result<Message>>,
    rx: tokio::sync::Mutex<mpsc::Receiver<Result<Message>>>,
    tasks: Mutex<Vec<JoinHandle<()>>>,
}

impl std::fmt::Debug for MultiTopicConsumer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MultiTopicConsumer").field("subscription", &self.subscription).finish_non_exhaustive()
    }
}

impl Drop for MultiTopicConsumer {
    fn drop(&mut self) {
        for t in self.tasks.lock().unwrap_or_else(|p| p.into_inner()).drain(..) {
            t.abort();
        }
    }
}

impl MultiTopicConsumer {
    /// An empty consumer; add topics with [`add_topic`](Self::add_topic).
    /// `queue` bounds the shared queue (each topic's consumer has its own
    /// receiver queue besides).
    pub(crate) fn new(subscription: String, queue: usize) -> Self {
        let (tx, rx) = mpsc::channel(queue.max(1));
        Self {
            subscription,
            consumers: Mutex::new(HashMap::new()),
            tx,
            rx: tokio::sync::Mutex::new(rx),
            tasks: Mutex::new(Vec::new()),
        }
    }

    fn lock_consumers(&self) -> std::sync::MutexGuard<'_, HashMap<String, Arc<Consumer>>> {
        self.consumers.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Topics consumed now, sorted.
    pub fn topics(&self) -> Vec<String> {
        let mut t: Vec<String> = self.lock_consumers().keys().cloned().collect();
        t.sort();
        t
    }

    pub fn subscription(&self) -> &str {
        &self.subscription
    }

    /// Subscribes `builder`'s topic (a single topic or partition) and feeds
    /// its messages into the shared queue. A topic already consumed is skipped.
    pub async fn add_topic(&self, builder: ConsumerBuilder) -> Result<()> {
        let topic = crate::names::normalize_topic(&builder.topic)?;
        if self.lock_consumers().contains_key(&topic) {
            return Ok(());
        }
        let consumer = Arc::new(builder.subscribe().await?);
        self.lock_consumers().insert(topic, consumer.clone());
        let tx = self.tx.clone();
        let task = tokio::spawn(async move {
            loop {
                let m = consumer.receive().await;
                let end = m.is_err() && consumer.is_closed();
                if tx.send(m).await.is_err() || end {
                    return;
                }
                // Then hand over what is already queued without an await
                // per message while the shared queue has room.
                loop {
                    let m = match consumer.try_receive() {
                        Ok(Some(m)) => Ok(m),
                        Ok(None) => break,
                        Err(e) => Err(e),
                    };
                    let end = m.is_err() && consumer.is_closed();
                    let sent = match tx.try_send(m) {
                        Ok(()) => true,
                        Err(mpsc::error::TrySendError::Full(m)) => tx.send(m).await.is_ok(),
                        Err(mpsc::error::TrySendError::Closed(_)) => false,
                    };
                    if !sent || end {
                        return;
                    }
                }
            }
        });
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).push(task);
        Ok(())
    }

    pub(crate) fn adopt_task(&self, task: JoinHandle<()>) {
        self.tasks.lock().unwrap_or_else(|p| p.into_inner()).push(task);
    }

    /// The next message of any topic. Cancel-safe.
    pub async fn receive(&self) -> Result<Message> {
        let mut rx = self.rx.lock().await;
        rx.recv().await.unwrap_or(Err(ClientError::ConsumerClosed { subscription: self.subscription.clone() }))
    }

    /// The next message if one is already here.
    pub fn try_receive(&self) -> Result<Option<Message>> {
        let Ok(mut rx) = self.rx.try_lock() else { return Ok(None) };
        match rx.try_recv() {
            Ok(m) => m.map(Some),
            Err(mpsc::error::TryRecvError::Empty) => Ok(None),
            Err(mpsc::error::TryRecvError::Disconnected) => {
                Err(ClientError::ConsumerClosed { subscription: self.subscription.clone() })
            }
        }
    }

    fn consumer_of(&self, msg: &Message) -> Result<Arc<Consumer>> {
        self.lock_consumers()
            .get(&msg.topic)
            .cloned()
            .ok_or_else(|| ClientError::ConsumerClosed { subscription: self.subscription.clone() })
    }

    /// Acknowledge `msg` on its topic's subscription.
    pub async fn ack(&self, msg: &Message) -> Result<()> {
        self.consumer_of(msg)?.ack(&msg.id).await
    }

    /// Negative acknowledgement: the message comes again after the
    /// consumer's backoff (see `Consumer::negative_acknowledge`).
    pub fn negative_acknowledge(&self, msg: &Message) {
        if let Ok(c) = self.consumer_of(msg) {
            c.negative_acknowledge(msg);
        }
    }

    pub async fn ack_cumulative(&self, msg: &Message) -> Result<()> {
        self.consumer_of(msg)?.ack_cumulative(&msg.id).await
    }

    /// Close every topic's consumer; the first error is returned.
    pub async fn close(&self) -> Result<()> {
        let consumers: Vec<Arc<Consumer>> = self.lock_consumers().values().cloned().collect();
        let mut first = Ok(());
        for c in consumers {
            if let Err(e) = c.close().await {
                if first.is_ok() {
                    first = Err(e);
                }
            }
        }
        first
    }
}

/// Splits a topics pattern into its literal namespace (`tenant/ns`) and the
/// anchored regular expression over full topic names.
pub(crate) fn parse_pattern(pattern: &str) -> Result<(String, regex::Regex)> {
    let bad = |reason| ClientError::InvalidTopic { topic: pattern.to_string(), reason };
    let full =
        if pattern.contains("://") { pattern.to_string() } else { format!("persistent://public/default/{pattern}") };
    let rest = full.split_once("://").map(|(_, r)| r).unwrap_or_default();
    let mut parts = rest.splitn(3, '/');
    let (Some(tenant), Some(ns), Some(_)) = (parts.next(), parts.next(), parts.next()) else {
        return Err(bad("a topics pattern is DOMAIN://TENANT/NAMESPACE/REGEX"));
    };
    let literal = |s: &str| !s.is_empty() && s.chars().all(|c| c.is_ascii_alphanumeric() || "-_=:".contains(c));
    if !literal(tenant) || !literal(ns) {
        return Err(bad("the tenant and namespace of a topics pattern must be literal names"));
    }
    let regex = regex::Regex::new(&format!("^(?:{full})$")).map_err(|_| bad("not a valid regular expression"))?;
    Ok((format!("{tenant}/{ns}"), regex))
}

/// Subscribes every topic of `namespace` matching `regex` not yet consumed.
pub(crate) async fn add_matching(
    template: &ConsumerBuilder,
    multi: &MultiTopicConsumer,
    namespace: &str,
    regex: &regex::Regex,
) -> Result<()> {
    let admin = crate::Admin { conn: template.conn.clone() };
    let listed = admin.call("topics.list", json!({ "namespace": namespace })).await?;
    let names: Vec<String> =
        listed.as_array().map(|a| a.iter().filter_map(|v| v.as_str().map(str::to_owned)).collect()).unwrap_or_default();
    for name in &names {
        // A partition is covered by its partitioned topic's own name.
        if let Some((base, _)) = name.rsplit_once("-partition-") {
            if names.iter().any(|n| n == base) {
                continue;
            }
        }
        if regex.is_match(name) {
            template.add_by_name(multi, name).await?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns() {
        let (ns, re) = parse_pattern("persistent://public/default/orders-.*").unwrap();
        assert_eq!(ns, "public/default");
        assert!(re.is_match("persistent://public/default/orders-eu"));
        assert!(!re.is_match("persistent://public/default/x-orders-eu"));
        assert!(!re.is_match("persistent://public/other/orders-eu"));
        let (ns, _) = parse_pattern("orders.*").unwrap();
        assert_eq!(ns, "public/default");
        assert!(parse_pattern("persistent://pub.*/default/x").is_err());
        assert!(parse_pattern("persistent://public/default/(").is_err());
    }
}
