//! Dead letters and retry: a message delivered too often goes to the
//! dead-letter topic instead of the application, and `reconsume_later`
//! sends a message around through the retry topic with a delivery time.
//! Both republish the message with its origin as properties.

use super::acks::route;
use super::inbox::Delivery;
use super::timers::clock;
use super::Consumer;
use crate::conn::pool::{Origin, Pool};
use crate::error::{ClientError, Result};
use crate::message::{Message, OutgoingMessage};
use crate::producer::{Producer, ProducerBuilder};
use magnetar_wire::{AckType, Command, MessageId};
use std::sync::Arc;
use std::time::Duration;

/// Where messages go after too many deliveries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeadLetterPolicy {
    /// A message delivered this many times again (redelivery count above it)
    /// goes to the dead-letter topic instead of the application.
    pub max_redeliveries: u32,
    /// Default `<topic>-<subscription>-DLQ`.
    pub topic: Option<String>,
}

/// Property naming the topic a dead-lettered or retried message came from.
pub const PROPERTY_REAL_TOPIC: &str = "REAL_TOPIC";
/// Property holding the original message id (`L:E:P:B`).
pub const PROPERTY_ORIGIN_MESSAGE_ID: &str = "ORIGIN_MESSAGE_ID";
/// Property counting how often `reconsume_later` sent a message around.
pub const PROPERTY_RECONSUME_TIMES: &str = "RECONSUMETIMES";

/// The batch size to send with the ack of a message sent to the dead-letter
/// topic: a message of a batch is acknowledged alone (its siblings may not
/// have reached their limit).
fn dead_letter_batch_size(msg: &Message) -> Vec<u32> {
    let size = msg.entry.num_messages();
    if msg.id.batch_index >= 0 && size > 1 {
        vec![size]
    } else {
        Vec::new()
    }
}

pub(super) struct DeadLetter {
    pub(super) max_redeliveries: u32,
    topic: String,
    producer: tokio::sync::Mutex<Option<Producer>>,
}

/// Where a consumer republishes messages: to its dead-letter topic, and
/// to its retry topic (`reconsume_later`), each on a producer created on
/// first use, on the topic owner's connection as looked up from the
/// consumer's.
pub(super) struct Republish {
    pool: Arc<Pool>,
    pub(super) dead_letter: Option<Arc<DeadLetter>>,
    retry_producer: tokio::sync::Mutex<Option<Producer>>,
}

impl Republish {
    /// `policy` for the consumer of `subscription` on `topic`.
    pub(super) fn new(pool: Arc<Pool>, policy: Option<DeadLetterPolicy>, topic: &str, subscription: &str) -> Self {
        let dead_letter = policy.map(|p| DeadLetter {
            max_redeliveries: p.max_redeliveries,
            topic: p.topic.unwrap_or_else(|| format!("{topic}-{subscription}-DLQ")),
            producer: Default::default(),
        });
        Self { pool, dead_letter: dead_letter.map(Arc::new), retry_producer: Default::default() }
    }
}

/// Publishes `msg` to `topic` with its origin as properties, on a producer
/// created on first use.
async fn republish(
    origin: Origin,
    slot: &tokio::sync::Mutex<Option<Producer>>,
    topic: &str,
    msg: &Message,
    extra: Vec<(String, String)>,
    deliver_at_ms: Option<u64>,
) -> Result<MessageId> {
    let mut slot = slot.lock().await;
    if slot.as_ref().is_none_or(|p| p.is_closed()) {
        let builder = ProducerBuilder::new(origin, topic.to_string());
        *slot = Some(builder.create().await?);
    }
    let Some(producer) = slot.as_ref() else {
        return Err(ClientError::InvalidOption { option: "producer", reason: "not created" });
    };
    let mut out = OutgoingMessage::new(msg.payload.clone());
    out.key = msg.key().map(str::to_string);
    out.tag = msg.tag().map(str::to_string);
    out.event_time_ms = msg.event_time_ms();
    out.deliver_at_ms = deliver_at_ms;
    out.properties = msg
        .properties()
        .iter()
        .filter(|(k, _)| k != PROPERTY_REAL_TOPIC && k != PROPERTY_ORIGIN_MESSAGE_ID && k != PROPERTY_RECONSUME_TIMES)
        .cloned()
        .collect();
    let real_topic = msg.property(PROPERTY_REAL_TOPIC).unwrap_or(&msg.topic).to_string();
    let origin = msg.property(PROPERTY_ORIGIN_MESSAGE_ID).map(str::to_string).unwrap_or_else(|| msg.id.to_string());
    out.properties.push((PROPERTY_REAL_TOPIC.into(), real_topic));
    out.properties.push((PROPERTY_ORIGIN_MESSAGE_ID.into(), origin));
    out.properties.extend(extra);
    producer.send(out).await
}

impl Consumer {
    /// Tracks a delivered message, or sends it to the dead-letter topic
    /// (returning `None`) when it came too often.
    pub(super) fn screen(&self, delivery: Delivery) -> Option<Delivery> {
        let msg = match delivery {
            Ok(msg) => msg,
            Err(e) => return Some(Err(e)),
        };
        if let Some(dl) = &self.republish.dead_letter {
            if msg.redelivery_count > dl.max_redeliveries {
                let dl = dl.clone();
                let conn = self.conn.clone();
                let origin = Origin { conn: conn.clone(), pool: self.republish.pool.clone() };
                let consumer_id = route(self.consumer_id, &self.retry, &msg.id);
                // A task, so `receive` stays cancel-safe; the message is
                // acknowledged only once the dead-letter topic has it.
                if let Ok(handle) = tokio::runtime::Handle::try_current() {
                    handle.spawn(async move {
                        match republish(origin, &dl.producer, &dl.topic, &msg, Vec::new(), None).await {
                            Ok(_) => {
                                let ack = Command::Ack {
                                    consumer_id,
                                    ack_type: AckType::Individual,
                                    message_ids: vec![msg.id],
                                    request_id: 0,
                                    batch_sizes: dead_letter_batch_size(&msg),
                                };
                                let _ = conn.send_command(&ack).await;
                            }
                            Err(e) => tracing::warn!(error = %e, id = %msg.id, "dead-letter publish failed"),
                        }
                    });
                    return None;
                }
            }
        }
        if self.tracker.received(msg.id, clock) {
            self.timers.notify_one();
        }
        Some(Ok(msg))
    }

    /// Consume `msg` again after `delay`: it is published to
    /// `<topic>-<subscription>-RETRY` with a delivery time, then acknowledged
    /// here. With `retry_enabled(true)` this consumer also consumes that
    /// topic, so the message comes back here; its `RECONSUMETIMES` property
    /// counts the rounds.
    pub async fn reconsume_later(&self, msg: &Message, delay: Duration) -> Result<MessageId> {
        let base = msg.property(PROPERTY_REAL_TOPIC).unwrap_or(&self.topic).to_string();
        let retry_topic = format!("{base}-{}-RETRY", self.subscription);
        let times = msg.property(PROPERTY_RECONSUME_TIMES).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0) + 1;
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let at = u64::try_from(now.saturating_add(delay).as_millis()).unwrap_or(u64::MAX);
        let origin = Origin { conn: self.conn.clone(), pool: self.republish.pool.clone() };
        let extra = vec![(PROPERTY_RECONSUME_TIMES.to_string(), times.to_string())];
        let id = republish(origin, &self.republish.retry_producer, &retry_topic, msg, extra, Some(at)).await?;
        self.ack(&msg.id).await?;
        Ok(id)
    }
}
