//! The shards' side of the HTTP door: one bounded channel per shard, and
//! the task on each shard that answers what the HTTP thread asks.

use super::exposition::TopicSeriesWriter;
use super::{ShardCall, ShardReport};
use futures::channel::mpsc;
use futures::StreamExt;
use glommio::channels::local_channel;
use magnetar_core::api::SubscribeRequest;
use magnetar_core::{Broker, CoreError};
use magnetar_wire::{encode_message, AckType, ErrorCode, InitialPosition, MessageMetadata, SubscriptionType};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// Shares of the HTTP task queue (the default queue, where the produce
/// path runs, has 1000): answering a scrape or an admin call yields to
/// produce and dispatch.
const HTTP_SHARES: usize = 100;

/// The topic `/admin/v2/brokers/health` produces to and consumes from.
pub(crate) const HEALTH_TOPIC: &str = "persistent://public/default/__magnetar_healthcheck";

/// How long a health check waits for its message to come back.
const HEALTH_TIMEOUT: Duration = Duration::from_secs(10);

/// The receiving ends of the shards' channels, each taken once by its
/// shard's [`serve_shard`](Self::serve_shard). Cheap to clone; `Send`, so
/// it goes into the closure every shard runs.
#[derive(Clone)]
pub struct HttpShards {
    inboxes: Arc<Vec<Mutex<Option<mpsc::Receiver<ShardCall>>>>>,
}

pub(super) fn channels(shards: u32, calls_max: usize) -> (Vec<mpsc::Sender<ShardCall>>, HttpShards) {
    let (senders, receivers): (Vec<_>, Vec<_>) =
        (0..shards).map(|_| mpsc::channel(calls_max)).map(|(tx, rx)| (tx, Mutex::new(Some(rx)))).unzip();
    (senders, HttpShards { inboxes: Arc::new(receivers) })
}

impl HttpShards {
    /// Answers the HTTP thread's calls for this shard until the broker
    /// shuts down (run it on the shard, beside the listeners).
    pub async fn serve_shard(self, broker: Broker) {
        let id = broker.shard_id() as usize;
        let taken = self.inboxes.get(id).and_then(|m| m.lock().ok().and_then(|mut g| g.take()));
        let Some(mut rx) = taken else {
            tracing::error!(shard = id, "http: this shard's channel is missing or already served");
            return;
        };
        let tq = glommio::executor().create_task_queue(
            glommio::Shares::Static(HTTP_SHARES),
            glommio::Latency::NotImportant,
            "http",
        );
        while let Some(call) = rx.next().await {
            if broker.is_draining() {
                break;
            }
            let broker = broker.clone();
            // Each call in a task of its own: an admin call waiting on
            // another shard does not hold up a scrape.
            let spawned = glommio::spawn_local_into(answer(broker, call), tq);
            if let Ok(task) = spawned {
                task.detach();
            }
        }
    }
}

async fn answer(broker: Broker, call: ShardCall) {
    match call {
        ShardCall::Metrics { series: None, reply } => {
            let mut topics = Vec::new();
            broker.for_each_topic_metrics(|t| topics.push(t.clone())).await;
            topics.sort_by(|a, b| a.topic.cmp(&b.topic));
            let report = ShardReport { metrics: broker.metrics_snapshot(), topics, series: Default::default() };
            let _ = reply.send(report);
        }
        ShardCall::Metrics { series: Some(want), reply } => {
            // Written here, a bounded slice of topics at a time (the core
            // yields between slices), so the HTTP thread only concatenates.
            let mut writer = TopicSeriesWriter::new(&want);
            broker.for_each_topic_metrics(|t| writer.add(t)).await;
            let series = writer.finish();
            let report = ShardReport { metrics: broker.metrics_snapshot(), topics: Vec::new(), series };
            let _ = reply.send(report);
        }
        ShardCall::Admin { request, principal, reply } => {
            let _ = reply.send(broker.with_principal(principal).admin(request).await);
        }
        ShardCall::TopicStats { topic, principal, reply } => {
            let _ = reply.send(broker.with_principal(principal).topic_stats(&topic).await);
        }
        ShardCall::Health { principal, reply } => {
            // Pulsar's health check is a superuser's call.
            let broker = broker.with_principal(principal);
            if let Err(e) = broker.check_superuser() {
                let _ = reply.send(Err(e));
                return;
            }
            let result = futures::future::select(
                Box::pin(health_check(&broker)),
                Box::pin(glommio::timer::sleep(HEALTH_TIMEOUT)),
            )
            .await;
            let result = match result {
                futures::future::Either::Left((r, _)) => r,
                futures::future::Either::Right(_) => Err(CoreError::new(
                    ErrorCode::ServiceNotReady,
                    format!("the health check's message did not come back in {HEALTH_TIMEOUT:?}"),
                )),
            };
            let _ = reply.send(result);
        }
    }
}

/// Pulsar's broker health check: a message produced to a topic of its own
/// and read back by a consumer, through the same broker API as clients.
async fn health_check(broker: &Broker) -> Result<(), CoreError> {
    let nonce = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_nanos());
    let (tx, rx) = local_channel::new_bounded(64);
    let sink = broker.register_sink(tx);
    let result = async {
        let req = SubscribeRequest {
            topic: HEALTH_TOPIC.to_string(),
            subscription: "healthcheck".to_string(),
            consumer_id: 1,
            sub_type: SubscriptionType::Exclusive,
            consumer_name: "healthcheck".to_string(),
            initial_position: InitialPosition::Latest,
            durable: false,
            priority_level: 0,
            filter_tag: String::new(),
            key_shared_ranges: Vec::new(),
            model: Default::default(),
            client_address: "(broker health check)".into(),
        };
        let consumer = broker.subscribe(req, sink).await?;
        let producer = broker.create_producer(HEALTH_TOPIC, "").await;
        let sent = async {
            let producer = producer?;
            let payload = format!("health-{nonce}");
            let meta = MessageMetadata {
                producer_name: producer.producer_name.clone(),
                sequence_id: 0,
                publish_time_ms: magnetar_now_ms(),
                num_messages: 1,
                ..Default::default()
            };
            let blob = encode_message(&meta, payload.as_bytes());
            let sent = broker.send(&producer, 1, blob).await;
            let _ = broker.close_producer(&producer).await;
            let id = sent?;
            broker.flow(&consumer, 16);
            loop {
                let Some(event) = rx.recv().await else {
                    return Err(CoreError::new(ErrorCode::UnknownError, "health check consumer closed"));
                };
                for (got, _, _) in event.deliveries() {
                    let _ = broker.ack(&consumer, AckType::Individual, vec![got], false).await;
                    if got == id {
                        return Ok(());
                    }
                }
            }
        }
        .await;
        let _ = broker.close_consumer(&consumer).await;
        sent
    }
    .await;
    broker.unregister_sink(sink);
    result
}

fn magnetar_now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
