//! One shard: a glommio executor's share of the broker.
//!
//! A `Shard` owns the topics whose bundles map to it, its own entry log, and
//! its ends of the cross-shard mesh. Doors (in the net crate) talk to the
//! [`Broker`](crate::api::Broker) handle of the shard they landed on; the
//! handle routes each request to the owner shard (`routing.rs`), through the
//! mesh when that is another shard. Everything here is owned by one shard and
//! never crosses cores; only `MeshMsg` values travel between shards.
//!
//! - `routing.rs`: the mesh protocol (`Op`/`Reply`) and where each request runs.
//! - `owner.rs`: the owner side of topic and subscription requests: thin
//!   handlers over the registry that call the topic's behaviour (`topic/`).
//! - `retention.rs`: the task applying retention and TTL to every topic.
//! - `unload.rs`: the sweep dropping idle topics from memory.
//! - `launch.rs`, `start_gate.rs`, `mesh.rs`: executors, the start gate, the channels.

pub mod launch;
pub(crate) mod mesh;
pub mod metrics;
mod owner;
pub(crate) mod retention;
pub(crate) mod routing;
pub(crate) mod start_gate;
mod sub_admin;
pub(crate) mod unload;

pub(crate) use crate::subscription::requests::valid_subscription_name;
pub(crate) use routing::{Op, OpResult, Reply, TopicPolicy};

use crate::api::{ConsumerEvent, ShardTraffic};
use crate::clock::now_ms;
use crate::config::BrokerConfig;
use crate::metadata::Metadata;
use crate::signal::Signal;
use crate::store::{LedgerIds, Store};
use crate::subscription::dispatcher::context::{DeliverySink, DispatchCtx, DispatchLimits, EntryLogReader};
use crate::subscription::persist::CursorWriter;
use crate::subscription::Subscription;
use crate::topic::producers::ProducerNames;
use crate::topic::{Topic, TopicCtx};
use futures::channel::oneshot;
use glommio::channels::local_channel::LocalSender;
use magnetar_storage::EntryLog;
use mesh::Mesh;
use metrics::{ShardMetrics, ShardMetricsSnapshot, StorageFigures};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;
use std::sync::Arc;
use std::time::Duration;

pub use crate::store::LEDGER_ID_SHARD_STRIDE;
/// Most shards a broker may run (ledger ids reserve room for this many).
pub const SHARDS_MAX: u32 = LEDGER_ID_SHARD_STRIDE as u32;

/// The dispatchers' sink: the shard routes each event to its consumer's
/// connection, here or through the mesh.
impl DeliverySink for Shard {
    fn deliver(&self, to: crate::api::ConsumerRef, event: ConsumerEvent) {
        Shard::deliver(self, to, event)
    }
}

/// Shares of the dispatchers' task queue; the default queue (flusher,
/// produce path) has 1000.
const DISPATCH_SHARES: usize = 250;

pub(crate) struct Shard {
    pub(crate) id: u32,
    pub(crate) nshards: u32,
    pub(crate) config: Arc<BrokerConfig>,
    pub(crate) log: EntryLog,
    /// Every record besides entries (topics, cursors, states, dedup).
    pub(crate) store: Store,
    /// The metadata store's typed view; `Some` on shard 0 only.
    pub(crate) metadata: Option<Metadata>,
    pub(crate) topics: RefCell<HashMap<String, Rc<Topic>>>,
    /// Non-persistent topics with producers or consumers attached.
    pub(crate) np_topics: RefCell<HashMap<String, Rc<crate::nonpersistent::NpTopic>>>,
    pub(crate) ledger_ids: LedgerIds,
    pub(crate) mesh: Mesh,
    pub(crate) pending: RefCell<HashMap<u64, oneshot::Sender<OpResult>>>,
    pub(crate) next_req: Cell<u64>,
    pub(crate) sinks: RefCell<HashMap<u64, LocalSender<ConsumerEvent>>>,
    pub(crate) next_sink: Cell<u64>,
    pub(crate) producer_names: ProducerNames,
    /// Appends on this shard not yet durable (shutdown waits for them).
    pub(crate) inflight: Cell<u64>,
    pub(crate) draining: Cell<bool>,
    /// Shared with the dispatchers (their context), which stop when it is set.
    pub(crate) closed: Rc<Cell<bool>>,
    /// Changed cursors and redelivery counts, and their writer.
    pub(crate) cursors: CursorWriter,
    pub(crate) cursor_flush: Signal,
    /// Data disk usage in percent at the last check, and whether produce is
    /// refused because it reached the refusal watermark.
    pub(crate) disk_pct: Cell<u8>,
    pub(crate) storage_full: Cell<bool>,
    /// Task queue of the dispatchers, whose catch-up reads go to disk: fewer
    /// shares than the default queue, where the log's flusher (the fsync
    /// path of every receipt) runs.
    pub(crate) dispatch_tq: glommio::TaskQueueHandle,
    /// Counters and histograms, written where the work happens and read
    /// by exporters on any thread (`metrics.rs`).
    pub(crate) metrics: Arc<ShardMetrics>,
    /// When the shard started (ms since the epoch): subscriptions keep
    /// their type for `subscription_type_hold` from then.
    pub(crate) started_ms: u64,
}

impl Shard {
    pub(crate) fn new(id: u32, nshards: u32, config: Arc<BrokerConfig>, log: EntryLog, mesh: Mesh) -> Rc<Self> {
        let store = Store::new(log.clone());
        let ledger_ids = LedgerIds::new(id, &store);
        for l in store.orphan_ledgers(ledger_ids.at_start()) {
            match log.delete_ledger(l) {
                Ok(_) => tracing::info!(
                    shard = id,
                    ledger = l,
                    "deleted a ledger no topic names (topic deleted before a crash)"
                ),
                Err(e) => tracing::warn!(shard = id, ledger = l, "cannot delete an orphan ledger: {e}"),
            }
        }
        let metadata = (id == 0).then(|| {
            let store: Rc<dyn crate::metadata::MetadataStore> =
                Rc::new(crate::metadata::LogMetadataStore::new(log.clone()));
            Metadata::new(store)
        });
        Rc::new(Self {
            id,
            nshards,
            config,
            log,
            store: store.clone(),
            metadata,
            topics: RefCell::new(HashMap::new()),
            np_topics: RefCell::new(HashMap::new()),
            ledger_ids,
            mesh,
            pending: RefCell::new(HashMap::new()),
            next_req: Cell::new(1),
            sinks: RefCell::new(HashMap::new()),
            next_sink: Cell::new(1),
            producer_names: ProducerNames::new(id, now_ms()),
            inflight: Cell::new(0),
            draining: Cell::new(false),
            closed: Rc::new(Cell::new(false)),
            cursors: CursorWriter::new(store),
            cursor_flush: Signal::new(),
            disk_pct: Cell::new(0),
            storage_full: Cell::new(false),
            dispatch_tq: glommio::executor().create_task_queue(
                glommio::Shares::Static(DISPATCH_SHARES),
                glommio::Latency::NotImportant,
                "dispatch",
            ),
            metrics: ShardMetrics::new(),
            started_ms: now_ms(),
        })
    }

    /// What a topic's operations need of this shard.
    pub(crate) fn topic_ctx(&self) -> TopicCtx<'_> {
        TopicCtx {
            log: &self.log,
            store: &self.store,
            config: &self.config,
            ledger_ids: &self.ledger_ids,
            closed: &self.closed,
        }
    }

    pub(crate) fn traffic(&self) -> ShardTraffic {
        ShardTraffic {
            shard: self.id,
            cross_shard_requests: self.metrics.cross_shard_requests.get(),
            cross_shard_events: self.metrics.cross_shard_events.get(),
        }
    }

    /// Starts the dispatcher task of a subscription of one of this shard's
    /// topics (it runs until the shard closes or the subscription goes).
    pub(crate) fn spawn_dispatcher(self: &Rc<Self>, topic: Rc<Topic>, sub: Rc<Subscription>) {
        let ctx = DispatchCtx {
            sink: self.clone(),
            log: EntryLogReader { log: self.log.clone(), tq: self.dispatch_tq },
            limits: DispatchLimits {
                unacked_per_consumer_max: self.config.unacked_per_consumer_max,
                unacked_per_subscription_max: self.config.unacked_per_subscription_max,
            },
            dirty: self.cursors.dirty.clone(),
            closed: self.closed.clone(),
        };
        crate::subscription::dispatcher::task::spawn(ctx, self.dispatch_tq, topic, sub);
    }

    /// The shard's metrics with its log's figures, now.
    pub(crate) fn metrics_snapshot(&self) -> ShardMetricsSnapshot {
        let storage = StorageFigures {
            durable_lsn: self.log.durable_lsn(),
            pending_bytes: self.log.pending_bytes(),
            lone_batches: self.log.lone_batches(),
            disk_used_pct: self.disk_pct.get(),
            storage_full: self.storage_full.get(),
            read_cache_hits: self.log.read_stats().0,
            disk_reads: self.log.read_stats().1,
            flush: self.log.flush_stats(),
        };
        self.metrics.snapshot(self.id, storage)
    }

    pub(crate) fn is_closed(&self) -> bool {
        self.closed.get()
    }

    /// Background task: persists changed cursors every interval.
    pub(crate) async fn cursor_flusher(self: Rc<Self>) {
        let interval = self.config.cursor_persist_interval;
        while !self.closed.get() {
            glommio::timer::sleep(interval).await;
            if let Err(e) = self.flush_cursors() {
                tracing::error!(shard = self.id, "persisting cursors failed: {e}");
            }
        }
    }

    /// Background task: measures the data disk every `check_interval`, logs
    /// when usage rises past a warning level, and refuses produce at or
    /// above the refusal level (resuming below it).
    pub(crate) async fn disk_watch(self: Rc<Self>) {
        let wm = self.config.disk_watermarks.clone();
        let dir = self.config.data_dir.clone();
        while !self.closed.get() {
            match wm.measure(&dir) {
                Ok(pct) => self.on_disk_usage(pct, &wm),
                Err(e) => tracing::warn!(shard = self.id, dir = %dir.display(), "cannot measure disk usage: {e}"),
            }
            glommio::timer::sleep(wm.check_interval).await;
        }
    }

    /// Measures the data disk now (after retention freed space, so that a
    /// refused produce resumes without waiting for the next check).
    pub(crate) fn measure_disk(&self) {
        let wm = &self.config.disk_watermarks;
        if let Ok(pct) = wm.measure(&self.config.data_dir) {
            self.on_disk_usage(pct, wm);
        }
    }

    fn on_disk_usage(&self, pct: u8, wm: &crate::disk_watch::DiskWatermarks) {
        let before = self.disk_pct.replace(pct);
        for &level in &wm.warn_pcts {
            if before < level && pct >= level {
                tracing::warn!(shard = self.id, used_pct = pct, level, "data disk usage passed a warning level");
            }
        }
        let full = pct >= wm.refuse_pct;
        if full != self.storage_full.replace(full) {
            if full {
                tracing::error!(
                    shard = self.id,
                    used_pct = pct,
                    refuse_pct = wm.refuse_pct,
                    "data disk full: refusing produce requests (StorageFull) until space is freed"
                );
            } else {
                tracing::info!(
                    shard = self.id,
                    used_pct = pct,
                    "data disk below the refusal level: accepting produce again"
                );
            }
        }
    }

    /// Clean shutdown: stop taking produce requests, let in-flight ones
    /// finish, persist cursors, close the log (which syncs and writes the
    /// clean-shutdown marker).
    pub(crate) async fn shutdown(self: &Rc<Self>) -> Result<(), String> {
        self.draining.set(true);
        let deadline = std::time::Instant::now() + self.config.shutdown_drain_timeout;
        while self.inflight.get() > 0 && std::time::Instant::now() < deadline {
            glommio::timer::sleep(Duration::from_millis(5)).await;
        }
        if self.inflight.get() > 0 {
            tracing::warn!(
                shard = self.id,
                inflight = self.inflight.get(),
                "shutdown: in-flight appends did not finish"
            );
        }
        let mut failed = None;
        if let Err(e) = self.flush_cursors_and_counts(true) {
            tracing::error!(shard = self.id, "persisting cursors at shutdown failed: {e}");
            failed = Some(format!("persisting cursors at shutdown failed: {e}"));
        }
        self.closed.set(true);
        self.cursor_flush.notify();
        for t in self.topics.borrow().values() {
            for s in t.subs.borrow().values() {
                s.wake.notify();
            }
        }
        match self.log.close().await {
            Ok(()) => tracing::info!(shard = self.id, "log closed cleanly"),
            Err(e) => {
                tracing::error!(shard = self.id, "closing the log failed: {e}");
                failed = Some(format!("closing the log failed: {e}"));
            }
        }
        failed.map_or(Ok(()), Err)
    }
}
