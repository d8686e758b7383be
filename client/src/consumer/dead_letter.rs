//! Dead letters and retry: a message delivered too often goes to the
//! dead-letter topic instead of the application, and `reconsume_later`
//! sends a message around through the retry topic with a delivery time.
//! Both republish the message with its origin as properties. A retry
//! policy bounds the rounds: past its limit `reconsume_later` sends the
//! message to the dead-letter topic instead.

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

/// RocketMQ's default delay levels (`messageDelayLevel`): 1s 5s 10s 30s 1m
/// 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h.
pub const ROCKETMQ_RETRY_DELAYS: [Duration; 18] = {
    const S: u64 = 1;
    const M: u64 = 60;
    const H: u64 = 3600;
    let secs = [
        S,
        5 * S,
        10 * S,
        30 * S,
        M,
        2 * M,
        3 * M,
        4 * M,
        5 * M,
        6 * M,
        7 * M,
        8 * M,
        9 * M,
        10 * M,
        20 * M,
        30 * M,
        H,
        2 * H,
    ];
    let mut out = [Duration::ZERO; 18];
    let mut i = 0;
    while i < 18 {
        out[i] = Duration::from_secs(secs[i]);
        i += 1;
    }
    out
};

/// How often `reconsume_later` may send a message around, and after which
/// delays ([`ConsumerBuilder::retry_policy`](super::ConsumerBuilder::retry_policy)).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RetryPolicy {
    /// A message retried this many times (its `RECONSUMETIMES`) goes to the
    /// dead-letter topic when it is reconsumed once more.
    pub max_retries: u32,
    /// The delay of retry `k` (1-based) is `delays[k - 1]`, the last one for
    /// every retry past the list; never empty.
    delays: Vec<Duration>,
}

impl RetryPolicy {
    /// The same delay before every retry.
    pub fn fixed(max_retries: u32, delay: Duration) -> Self {
        Self { max_retries, delays: vec![delay] }
    }

    /// A delay per retry (the last for every retry past the list); `None`
    /// when `delays` is empty.
    pub fn schedule(max_retries: u32, delays: Vec<Duration>) -> Option<Self> {
        (!delays.is_empty()).then_some(Self { max_retries, delays })
    }

    /// RocketMQ's default levels ([`ROCKETMQ_RETRY_DELAYS`]).
    pub fn rocketmq(max_retries: u32) -> Self {
        Self { max_retries, delays: ROCKETMQ_RETRY_DELAYS.to_vec() }
    }

    /// A named schedule: `rocketmq`; or delays in milliseconds, comma
    /// separated (`100,1000,5000`).
    pub fn named(max_retries: u32, name: &str) -> Option<Self> {
        if name == "rocketmq" {
            return Some(Self::rocketmq(max_retries));
        }
        let delays: Option<Vec<Duration>> =
            name.split(',').map(|ms| ms.trim().parse::<u64>().ok().map(Duration::from_millis)).collect();
        Self::schedule(max_retries, delays?)
    }

    /// The delay before retry `retry` (1 = the first).
    pub fn delay_for(&self, retry: u32) -> Duration {
        let i = usize::try_from(retry.max(1) - 1).unwrap_or(usize::MAX).min(self.delays.len() - 1);
        self.delays[i]
    }
}

/// What [`Consumer::reconsume`] did with a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconsumed {
    /// Sent to the retry topic; it comes back after `delay`.
    Retry { id: MessageId, retry: u32, delay: Duration },
    /// It had had its retries: sent to the dead-letter topic.
    DeadLettered { id: MessageId },
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
    retry_policy: Option<RetryPolicy>,
    /// Where a message past the retry policy's limit goes: the dead-letter
    /// policy's topic (and producer) when there is one, else
    /// `<topic>-<subscription>-DLQ`.
    retry_dead_letter: Option<Arc<DeadLetter>>,
}

impl Republish {
    /// `policy` and `retry` for the consumer of `subscription` on `topic`.
    pub(super) fn new(
        pool: Arc<Pool>,
        policy: Option<DeadLetterPolicy>,
        retry: Option<RetryPolicy>,
        topic: &str,
        subscription: &str,
    ) -> Self {
        let default_topic = || format!("{topic}-{subscription}-DLQ");
        let dead_letter = policy.map(|p| {
            Arc::new(DeadLetter {
                max_redeliveries: p.max_redeliveries,
                topic: p.topic.unwrap_or_else(default_topic),
                producer: Default::default(),
            })
        });
        let retry_dead_letter = retry.as_ref().map(|_| {
            dead_letter.clone().unwrap_or_else(|| {
                Arc::new(DeadLetter {
                    // Not a redelivery limit: only `reconsume_later` uses it.
                    max_redeliveries: u32::MAX,
                    topic: default_topic(),
                    producer: Default::default(),
                })
            })
        });
        Self { pool, dead_letter, retry_producer: Default::default(), retry_policy: retry, retry_dead_letter }
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
    /// counts the rounds. With a retry policy, a message that had its
    /// `max_retries` rounds goes to the dead-letter topic instead (and the
    /// id returned is its id there).
    pub async fn reconsume_later(&self, msg: &Message, delay: Duration) -> Result<MessageId> {
        match self.reconsume_after(msg, Some(delay)).await? {
            Reconsumed::Retry { id, .. } | Reconsumed::DeadLettered { id } => Ok(id),
        }
    }

    /// `reconsume_later` with the delay of the retry policy's schedule for
    /// this round. Without a retry policy: `InvalidOption`.
    pub async fn reconsume(&self, msg: &Message) -> Result<Reconsumed> {
        if self.republish.retry_policy.is_none() {
            return Err(ClientError::InvalidOption {
                option: "retry_policy",
                reason: "reconsume needs a retry policy",
            });
        }
        self.reconsume_after(msg, None).await
    }

    /// Sends `msg` around once more (after `delay`, else the policy's delay
    /// for the round), or to the dead-letter topic past the policy's limit;
    /// then acknowledges it here.
    async fn reconsume_after(&self, msg: &Message, delay: Option<Duration>) -> Result<Reconsumed> {
        let base = msg.property(PROPERTY_REAL_TOPIC).unwrap_or(&self.topic).to_string();
        let done = msg.property(PROPERTY_RECONSUME_TIMES).and_then(|v| v.parse::<u32>().ok()).unwrap_or(0);
        let times = done.saturating_add(1);
        let origin = Origin { conn: self.conn.clone(), pool: self.republish.pool.clone() };
        let policy = self.republish.retry_policy.as_ref();
        if let (Some(p), Some(dl)) = (policy, &self.republish.retry_dead_letter) {
            if times > p.max_retries {
                let extra = vec![(PROPERTY_RECONSUME_TIMES.to_string(), done.to_string())];
                let id = republish(origin, &dl.producer, &dl.topic, msg, extra, None).await?;
                self.ack(&msg.id).await?;
                return Ok(Reconsumed::DeadLettered { id });
            }
        }
        let delay = delay.or_else(|| policy.map(|p| p.delay_for(times))).unwrap_or_default();
        let retry_topic = format!("{base}-{}-RETRY", self.subscription);
        let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
        let at = u64::try_from(now.saturating_add(delay).as_millis()).unwrap_or(u64::MAX);
        let extra = vec![(PROPERTY_RECONSUME_TIMES.to_string(), times.to_string())];
        let id = republish(origin, &self.republish.retry_producer, &retry_topic, msg, extra, Some(at)).await?;
        self.ack(&msg.id).await?;
        Ok(Reconsumed::Retry { id, retry: times, delay })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_schedules() {
        let r = RetryPolicy::rocketmq(16);
        assert_eq!(r.delay_for(1), Duration::from_secs(1));
        assert_eq!(r.delay_for(4), Duration::from_secs(30));
        assert_eq!(r.delay_for(17), Duration::from_secs(3600));
        assert_eq!(r.delay_for(18), Duration::from_secs(7200));
        assert_eq!(r.delay_for(40), Duration::from_secs(7200), "past the list: the last level");
        assert_eq!(r.delay_for(0), Duration::from_secs(1));
        assert_eq!(RetryPolicy::named(3, "rocketmq"), Some(r.clone()).map(|p| RetryPolicy { max_retries: 3, ..p }));
        let ms = RetryPolicy::named(2, "100, 2000").unwrap();
        assert_eq!(
            (ms.delay_for(1), ms.delay_for(2), ms.delay_for(3)),
            (Duration::from_millis(100), Duration::from_secs(2), Duration::from_secs(2))
        );
        assert_eq!(RetryPolicy::named(2, ""), None);
        assert_eq!(RetryPolicy::named(2, "fast"), None);
        assert_eq!(RetryPolicy::schedule(1, Vec::new()), None);
        assert_eq!(RetryPolicy::fixed(1, Duration::from_millis(5)).delay_for(9), Duration::from_millis(5));
    }
}
