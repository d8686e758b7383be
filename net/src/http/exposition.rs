//! `GET /metrics`: every shard's figures in Prometheus' text format
//! (OpenMetrics when asked).
//!
//! Pulsar's own names, types and labels (`cluster`, `namespace`, `topic`,
//! `subscription`) for what Magnetar has, so Pulsar's dashboards and alerts
//! work; Magnetar's own figures as `magnetar_*`, per shard (label `shard`)
//! and summed (`shard="total"`).
//!
//! The topic series are most of a scrape (a dozen lines per topic): each
//! shard writes its own topics' sample lines, family by family, into text
//! fragments ([`TopicSeriesWriter`], fed by the core's bounded slices of
//! topics), and the HTTP thread only puts each family's header before the
//! shards' fragments. Sample lines are the same in both formats; only the
//! headers differ. The few `magnetar_*` families are encoded by
//! `prometheus-client` on the HTTP thread.

use super::{ShardCall, ShardReport, State};
use hyper::{Response, StatusCode};
use magnetar_core::api::TopicMetrics;
use magnetar_core::metrics::{HistogramSnapshot, ShardMetricsSnapshot, HISTOGRAM_BUCKETS};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelValue, LabelValueEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use std::collections::BTreeMap;
use std::fmt::Write;

const OPENMETRICS: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";
const TEXT_004: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Which text format a scrape is answered in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// Prometheus' text format 0.0.4.
    Text004,
    OpenMetrics,
}

pub(super) async fn scrape(state: &State, accept: &str) -> Response<super::Body> {
    if !state.is_ready() {
        return super::error(StatusCode::SERVICE_UNAVAILABLE, "the broker is starting (recovery not finished)");
    }
    let cluster: std::sync::Arc<str> = state.config.cluster.as_str().into();
    let topic_level = state.config.topic_level_metrics;
    // All shards at once: each answers in its own time.
    let calls = (0..state.shards.len()).map(|shard| {
        let series = Some(SeriesWanted { cluster: cluster.clone(), topic_level });
        state.call(shard, move |reply| ShardCall::Metrics { series, reply })
    });
    let mut reports = Vec::with_capacity(state.shards.len());
    for r in futures::future::join_all(calls).await {
        match r {
            Ok(r) => reports.push(r),
            Err(e) => return e.response(),
        }
    }
    let format = if accept.contains("application/openmetrics-text") { Format::OpenMetrics } else { Format::Text004 };
    match encode(&state.config.cluster, topic_level, reports, format) {
        Ok(body) if format == Format::OpenMetrics => super::text(StatusCode::OK, OPENMETRICS, body),
        Ok(body) => super::text(StatusCode::OK, TEXT_004, body),
        Err(_) => super::error(StatusCode::INTERNAL_SERVER_ERROR, "encoding the metrics failed"),
    }
}

/// What a shard writes of its topics for a scrape.
#[derive(Debug, Clone)]
pub(crate) struct SeriesWanted {
    pub(crate) cluster: std::sync::Arc<str>,
    pub(crate) topic_level: bool,
}

/// The exposition of `reports` in `format`. With `topic_level`, each
/// report's topic series are its fragments; without, its namespaces'
/// sums, summed again over shards here.
pub(crate) fn encode(
    cluster: &str,
    topic_level: bool,
    reports: Vec<ShardReport>,
    format: Format,
) -> Result<String, std::fmt::Error> {
    let fragments: usize = reports.iter().map(|r| r.series.bytes()).sum();
    let mut out = String::with_capacity(fragments + 64 * 1024);
    if topic_level {
        let families = TOPIC_FAMILIES.iter().map(|f| f as &dyn Family);
        let families = families.chain(SUBSCRIPTION_FAMILIES.iter().map(|f| f as &dyn Family));
        for (i, f) in families.enumerate() {
            let parts: Vec<&str> = reports.iter().filter_map(|r| r.series.lines.get(i).map(String::as_str)).collect();
            if parts.iter().all(|p| p.is_empty()) {
                continue;
            }
            header(&mut out, f, format);
            for p in parts {
                out.push_str(p);
            }
        }
    } else {
        let mut by_ns: BTreeMap<&str, Agg> = BTreeMap::new();
        for r in &reports {
            for (ns, a) in &r.series.namespaces {
                by_ns.entry(ns.as_str()).or_default().merge(a);
            }
        }
        let mut cluster_escaped = String::new();
        escape_into(&mut cluster_escaped, cluster);
        let rows: Vec<(String, &Agg)> = by_ns
            .iter()
            .map(|(ns, a)| {
                let mut labels = String::new();
                namespace_labels(&mut labels, &cluster_escaped, ns);
                (labels, a)
            })
            .collect();
        for f in NAMESPACE_FAMILIES.iter() {
            if rows.is_empty() {
                break;
            }
            header(&mut out, f, format);
            for (labels, a) in &rows {
                sample(&mut out, f, labels, (f.topic)(a));
            }
        }
    }
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(Snapshot { reports }));
    let mut magnetar = String::new();
    prometheus_client::encoding::text::encode(&mut magnetar, &registry)?;
    match format {
        Format::OpenMetrics => out.push_str(&magnetar),
        Format::Text004 => out.push_str(&to_text_004(&magnetar)),
    }
    Ok(out)
}

/// OpenMetrics text as Prometheus' text format 0.0.4: a counter's family
/// is named with its `_total` suffix there, and there is no `# EOF`.
pub(crate) fn to_text_004(openmetrics: &str) -> String {
    let lines: Vec<&str> = openmetrics.lines().collect();
    let mut counters = std::collections::HashSet::new();
    for l in &lines {
        if let Some(rest) = l.strip_prefix("# TYPE ") {
            if let Some(name) = rest.strip_suffix(" counter") {
                counters.insert(name.to_string());
            }
        }
    }
    let mut out = String::with_capacity(openmetrics.len());
    for l in lines {
        if l == "# EOF" {
            continue;
        }
        let renamed = ["# TYPE ", "# HELP "].iter().find_map(|p| {
            let rest = l.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters.contains(name).then(|| format!("{p}{name}_total {tail}"))
        });
        match renamed {
            Some(r) => out.push_str(&r),
            None => out.push_str(l),
        }
        out.push('\n');
    }
    out
}

/// One `pulsar_*` family of topic (or namespace) figures.
struct TopicFamily {
    name: &'static str,
    help: &'static str,
    counter: bool,
    topic: fn(&Agg) -> V,
}

/// One `pulsar_subscription_*` family.
struct SubscriptionFamily {
    name: &'static str,
    help: &'static str,
    sub: fn(&magnetar_core::api::SubscriptionMetrics) -> V,
}

/// What [`header`] and [`sample`] need of a family.
trait Family {
    fn name(&self) -> &'static str;
    fn help(&self) -> &'static str;
    fn counter(&self) -> bool;
}

impl Family for TopicFamily {
    fn name(&self) -> &'static str {
        self.name
    }
    fn help(&self) -> &'static str {
        self.help
    }
    fn counter(&self) -> bool {
        self.counter
    }
}

impl Family for SubscriptionFamily {
    fn name(&self) -> &'static str {
        self.name
    }
    fn help(&self) -> &'static str {
        self.help
    }
    fn counter(&self) -> bool {
        false
    }
}

impl<F: Family + ?Sized> Family for &F {
    fn name(&self) -> &'static str {
        (**self).name()
    }
    fn help(&self) -> &'static str {
        (**self).help()
    }
    fn counter(&self) -> bool {
        (**self).counter()
    }
}

/// Families over topics and namespaces alike, in the order written.
const TOPIC_FAMILIES: [TopicFamily; 13] = [
    TopicFamily {
        name: "pulsar_rate_in",
        help: "Messages per second published",
        counter: false,
        topic: |a| V::Gauge(a.rate_in),
    },
    TopicFamily {
        name: "pulsar_rate_out",
        help: "Messages per second sent to consumers",
        counter: false,
        topic: |a| V::Gauge(a.rate_out),
    },
    TopicFamily {
        name: "pulsar_throughput_in",
        help: "Bytes per second published",
        counter: false,
        topic: |a| V::Gauge(a.throughput_in),
    },
    TopicFamily {
        name: "pulsar_throughput_out",
        help: "Bytes per second sent to consumers",
        counter: false,
        topic: |a| V::Gauge(a.throughput_out),
    },
    TopicFamily {
        name: "pulsar_storage_size",
        help: "Bytes of stored entries",
        counter: false,
        topic: |a| V::Count(a.storage),
    },
    TopicFamily {
        name: "pulsar_msg_backlog",
        help: "Messages not acknowledged, summed over subscriptions",
        counter: false,
        topic: |a| V::Count(a.backlog),
    },
    TopicFamily {
        name: "pulsar_producers_count",
        help: "Producers attached",
        counter: false,
        topic: |a| V::Count(a.producers),
    },
    TopicFamily {
        name: "pulsar_consumers_count",
        help: "Consumers attached",
        counter: false,
        topic: |a| V::Count(a.consumers),
    },
    TopicFamily {
        name: "pulsar_subscriptions_count",
        help: "Subscriptions",
        counter: false,
        topic: |a| V::Count(a.subscriptions),
    },
    TopicFamily {
        name: "pulsar_in_messages",
        help: "Messages published since the topic was loaded",
        counter: true,
        topic: |a| V::Count(a.in_total),
    },
    TopicFamily {
        name: "pulsar_out_messages",
        help: "Messages sent to consumers since the topic was loaded",
        counter: true,
        topic: |a| V::Count(a.out_total),
    },
    TopicFamily {
        name: "pulsar_in_bytes",
        help: "Bytes published since the topic was loaded",
        counter: true,
        topic: |a| V::Count(a.bytes_in_total),
    },
    TopicFamily {
        name: "pulsar_out_bytes",
        help: "Bytes sent to consumers since the topic was loaded",
        counter: true,
        topic: |a| V::Count(a.bytes_out_total),
    },
];

/// Only when aggregated to namespaces (between the gauges and the counters).
const TOPICS_COUNT: TopicFamily =
    TopicFamily { name: "pulsar_topics_count", help: "Topics loaded", counter: false, topic: |a| V::Count(a.topics) };

/// The namespace-level families, in the order written.
static NAMESPACE_FAMILIES: std::sync::LazyLock<Vec<&'static TopicFamily>> = std::sync::LazyLock::new(|| {
    let (gauges, counters) = TOPIC_FAMILIES.split_at(9);
    gauges.iter().chain(std::iter::once(&TOPICS_COUNT)).chain(counters.iter()).collect()
});

/// Per subscription (topic level only, as in Pulsar).
const SUBSCRIPTION_FAMILIES: [SubscriptionFamily; 6] = [
    SubscriptionFamily {
        name: "pulsar_subscription_back_log",
        help: "Messages not acknowledged",
        sub: |s| V::Count(s.backlog_messages),
    },
    SubscriptionFamily {
        name: "pulsar_subscription_msg_rate_out",
        help: "Messages per second sent to consumers",
        sub: |s| V::Gauge(s.msg_rate_out),
    },
    SubscriptionFamily {
        name: "pulsar_subscription_msg_throughput_out",
        help: "Bytes per second sent to consumers",
        sub: |s| V::Gauge(s.byte_rate_out),
    },
    SubscriptionFamily {
        name: "pulsar_subscription_unacked_messages",
        help: "Entries delivered and not acknowledged",
        sub: |s| V::Count(s.unacked),
    },
    SubscriptionFamily {
        name: "pulsar_subscription_delayed",
        help: "Delayed messages not yet due",
        sub: |s| V::Count(s.delayed),
    },
    SubscriptionFamily {
        name: "pulsar_subscription_consumers_count",
        help: "Consumers attached",
        sub: |s| V::Count(s.consumers),
    },
];

/// A family's `# HELP` and `# TYPE` lines: a counter is named without its
/// `_total` suffix in OpenMetrics, with it in text 0.0.4.
fn header(out: &mut String, f: &(impl Family + ?Sized), format: Format) {
    let suffix = if f.counter() && format == Format::Text004 { "_total" } else { "" };
    let ty = if f.counter() { "counter" } else { "gauge" };
    for (what, tail) in [("# HELP ", f.help()), ("# TYPE ", ty)] {
        out.push_str(what);
        out.push_str(f.name());
        out.push_str(suffix);
        out.push(' ');
        out.push_str(tail);
        out.push('\n');
    }
}

/// One sample line: `name{labels} value` (a counter's sample is named
/// `_total` in both formats).
fn sample(out: &mut String, f: &(impl Family + ?Sized), labels: &str, v: V) {
    out.push_str(f.name());
    if f.counter() {
        out.push_str("_total");
    }
    out.push('{');
    out.push_str(labels);
    out.push_str("} ");
    match v {
        V::Gauge(x) => out.push_str(dtoa::Buffer::new().format(x)),
        V::Count(n) => out.push_str(itoa::Buffer::new().format(n)),
    }
    out.push('\n');
}

/// `s` as a label value, escaped as the text formats require (`\`, `"`,
/// newline): topic and subscription names are client input.
fn escape_into(out: &mut String, s: &str) {
    if !s.contains(['\\', '"', '\n']) {
        out.push_str(s);
        return;
    }
    for c in s.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
}

fn namespace_labels(out: &mut String, cluster_escaped: &str, namespace: &str) {
    out.clear();
    out.push_str("cluster=\"");
    out.push_str(cluster_escaped);
    out.push_str("\",namespace=\"");
    escape_into(out, namespace);
    out.push('"');
}

/// A shard's topic series for one scrape (see [`TopicSeriesWriter`]).
#[derive(Debug, Default)]
pub(crate) struct TopicSeries {
    /// Topic level: per family of [`TOPIC_FAMILIES`] then
    /// [`SUBSCRIPTION_FAMILIES`], this shard's sample lines.
    lines: Vec<String>,
    /// Namespace level: this shard's topics summed per namespace.
    namespaces: BTreeMap<String, Agg>,
}

impl TopicSeries {
    fn bytes(&self) -> usize {
        self.lines.iter().map(String::len).sum()
    }
}

/// Writes a shard's topics into a [`TopicSeries`], one topic at a time:
/// labels escaped once per topic into a reused buffer, values appended to
/// each family's fragment; nothing allocated per line.
pub(crate) struct TopicSeriesWriter {
    cluster_escaped: String,
    topic_level: bool,
    labels: String,
    sub_labels: String,
    series: TopicSeries,
}

impl TopicSeriesWriter {
    pub(crate) fn new(want: &SeriesWanted) -> Self {
        let mut cluster_escaped = String::new();
        escape_into(&mut cluster_escaped, &want.cluster);
        let families = if want.topic_level { TOPIC_FAMILIES.len() + SUBSCRIPTION_FAMILIES.len() } else { 0 };
        TopicSeriesWriter {
            cluster_escaped,
            topic_level: want.topic_level,
            labels: String::new(),
            sub_labels: String::new(),
            series: TopicSeries { lines: vec![String::new(); families], namespaces: BTreeMap::new() },
        }
    }

    pub(crate) fn add(&mut self, t: &TopicMetrics) {
        let namespace = namespace_of(&t.topic);
        let mut a = Agg::default();
        a.add(t);
        if !self.topic_level {
            match self.series.namespaces.get_mut(namespace) {
                Some(sum) => sum.merge(&a),
                None => {
                    self.series.namespaces.insert(namespace.to_string(), a);
                }
            }
            return;
        }
        namespace_labels(&mut self.labels, &self.cluster_escaped, namespace);
        self.labels.push_str(",topic=\"");
        escape_into(&mut self.labels, &t.topic);
        self.labels.push('"');
        let (topic_lines, sub_lines) = self.series.lines.split_at_mut(TOPIC_FAMILIES.len());
        for (f, out) in TOPIC_FAMILIES.iter().zip(topic_lines.iter_mut()) {
            sample(out, f, &self.labels, (f.topic)(&a));
        }
        for s in &t.subscriptions {
            self.sub_labels.clear();
            self.sub_labels.push_str(&self.labels);
            self.sub_labels.push_str(",subscription=\"");
            escape_into(&mut self.sub_labels, &s.name);
            self.sub_labels.push('"');
            for (f, out) in SUBSCRIPTION_FAMILIES.iter().zip(sub_lines.iter_mut()) {
                sample(out, f, &self.sub_labels, (f.sub)(s));
            }
        }
    }

    pub(crate) fn finish(self) -> TopicSeries {
        self.series
    }
}

/// A label value, escaped as the text formats require (`\`, `"`, newline):
/// topic and subscription names are client input.
#[derive(Debug, Clone)]
struct Lv<'a>(&'a str);

impl EncodeLabelValue for Lv<'_> {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        for c in self.0.chars() {
            match c {
                '\\' => encoder.write_str("\\\\")?,
                '"' => encoder.write_str("\\\"")?,
                '\n' => encoder.write_str("\\n")?,
                c => encoder.write_char(c)?,
            }
        }
        Ok(())
    }
}

type Labels<'a> = Vec<(&'static str, Lv<'a>)>;

/// The `magnetar_*` families of a scrape, encoded by `prometheus-client`.
#[derive(Debug)]
struct Snapshot {
    reports: Vec<ShardReport>,
}

impl std::fmt::Debug for ShardReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardReport")
            .field("shard", &self.metrics.shard)
            .field("topics", &self.topics.len())
            .finish_non_exhaustive()
    }
}

/// One sample's value.
#[derive(Clone, Copy)]
enum V {
    Gauge(f64),
    Count(u64),
}

/// A family's samples, written in one go.
fn family<'a>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    ty: MetricType,
    samples: impl IntoIterator<Item = (Labels<'a>, V)>,
) -> Result<(), std::fmt::Error> {
    let mut samples = samples.into_iter().peekable();
    if samples.peek().is_none() {
        return Ok(());
    }
    let mut m = enc.encode_descriptor(name, help, None, ty)?;
    for (labels, v) in samples {
        let mut f = m.encode_family(&labels)?;
        match v {
            V::Gauge(x) => f.encode_gauge(&x)?,
            V::Count(n) if matches!(ty, MetricType::Counter) => {
                f.encode_counter::<NoLabelSet, _, u64>(&n, None)?;
            }
            V::Count(n) => f.encode_gauge(&n)?,
        }
    }
    Ok(())
}

/// A histogram family in seconds from a distribution in microseconds, or
/// unitless (`scale` 1).
fn histogram<'a>(
    enc: &mut DescriptorEncoder<'_>,
    name: &str,
    help: &str,
    scale: f64,
    samples: impl IntoIterator<Item = (Labels<'a>, HistogramSnapshot)>,
) -> Result<(), std::fmt::Error> {
    let mut m = enc.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for (labels, h) in samples {
        // Bucket i holds integers below 2^i, so at most 2^i - 1 (`le` is
        // inclusive); the last bucket is unbounded.
        let buckets: Vec<(f64, u64)> = (0..HISTOGRAM_BUCKETS)
            .map(|i| {
                let le = HistogramSnapshot::upper_bound(i).map_or(f64::MAX, |u| (u - 1) as f64 / scale);
                (le, h.buckets[i])
            })
            .collect();
        let mut f = m.encode_family(&labels)?;
        f.encode_histogram::<NoLabelSet>(h.sum as f64 / scale, h.count, &buckets, None)?;
    }
    Ok(())
}

fn sum_hist(hs: impl Iterator<Item = HistogramSnapshot>) -> HistogramSnapshot {
    let mut total = HistogramSnapshot { buckets: [0; HISTOGRAM_BUCKETS], count: 0, sum: 0 };
    for h in hs {
        for (t, b) in total.buckets.iter_mut().zip(h.buckets.iter()) {
            *t += b;
        }
        total.count += h.count;
        total.sum += h.sum;
    }
    total
}

/// `tenant/ns` of `persistent://tenant/ns/topic`.
fn namespace_of(topic: &str) -> &str {
    let rest = topic.split_once("://").map_or(topic, |(_, r)| r);
    match rest.rfind('/') {
        Some(i) => &rest[..i],
        None => rest,
    }
}

/// Figures of a topic, or of a namespace's topics summed.
#[derive(Debug, Default, Clone)]
pub(crate) struct Agg {
    rate_in: f64,
    rate_out: f64,
    throughput_in: f64,
    throughput_out: f64,
    storage: u64,
    backlog: u64,
    producers: u64,
    consumers: u64,
    subscriptions: u64,
    in_total: u64,
    out_total: u64,
    bytes_in_total: u64,
    bytes_out_total: u64,
    topics: u64,
}

impl Agg {
    fn merge(&mut self, o: &Agg) {
        self.rate_in += o.rate_in;
        self.rate_out += o.rate_out;
        self.throughput_in += o.throughput_in;
        self.throughput_out += o.throughput_out;
        self.storage += o.storage;
        self.backlog += o.backlog;
        self.producers += o.producers;
        self.consumers += o.consumers;
        self.subscriptions += o.subscriptions;
        self.in_total += o.in_total;
        self.out_total += o.out_total;
        self.bytes_in_total += o.bytes_in_total;
        self.bytes_out_total += o.bytes_out_total;
        self.topics += o.topics;
    }

    fn add(&mut self, t: &TopicMetrics) {
        self.rate_in += t.msg_rate_in;
        self.throughput_in += t.byte_rate_in;
        self.storage += t.storage_bytes;
        self.producers += t.producers;
        self.in_total += t.msg_in_total;
        self.bytes_in_total += t.bytes_in_total;
        self.subscriptions += t.subscriptions.len() as u64;
        self.topics += 1;
        for s in &t.subscriptions {
            self.rate_out += s.msg_rate_out;
            self.throughput_out += s.byte_rate_out;
            self.backlog += s.backlog_messages;
            self.consumers += s.consumers;
            self.out_total += s.msg_out_total;
            self.bytes_out_total += s.bytes_out_total;
        }
    }
}

impl Collector for Snapshot {
    fn encode(&self, mut enc: DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        self.encode_magnetar(&mut enc)
    }
}

impl Snapshot {
    fn encode_magnetar(&self, enc: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let shard_names: Vec<String> = self.reports.iter().map(|r| r.metrics.shard.to_string()).collect();
        // The total is the sum, or for figures of the one data disk all
        // shards share (usage, the watermark), the largest.
        let per_shard_or_max = |pick: &dyn Fn(&ShardMetricsSnapshot) -> u64, max: bool| -> Vec<(Labels<'_>, V)> {
            let mut v: Vec<(Labels<'_>, V)> = self
                .reports
                .iter()
                .zip(&shard_names)
                .map(|(r, n)| (vec![("shard", Lv(n.as_str()))], V::Count(pick(&r.metrics))))
                .collect();
            let values = self.reports.iter().map(|r| pick(&r.metrics));
            let total = if max { values.max().unwrap_or(0) } else { values.sum() };
            v.push((vec![("shard", Lv("total"))], V::Count(total)));
            v
        };
        let per_shard = |pick: &dyn Fn(&ShardMetricsSnapshot) -> u64| per_shard_or_max(pick, false);
        type Pick = fn(&ShardMetricsSnapshot) -> u64;
        let counters: [(&str, &str, Pick); 14] = [
            ("magnetar_messages_in", "Messages appended by producers", |m| m.messages_in),
            ("magnetar_bytes_in", "Payload bytes appended by producers", |m| m.bytes_in),
            ("magnetar_entries_out", "Entries handed to consumers", |m| m.entries_out),
            ("magnetar_bytes_out", "Bytes of entries handed to consumers", |m| m.bytes_out),
            ("magnetar_acks", "Ack requests applied", |m| m.acks),
            ("magnetar_cross_shard_requests", "Requests routed to a topic's owner on another shard", |m| {
                m.cross_shard_requests
            }),
            ("magnetar_cross_shard_events", "Consumer events sent to a connection on another shard", |m| {
                m.cross_shard_events
            }),
            ("magnetar_connections_opened", "Connections accepted", |m| m.connections_opened),
            ("magnetar_connections_closed", "Connections closed", |m| m.connections_closed),
            ("magnetar_group_commits", "Batches written and fdatasync'd by the log (group commits)", |m| {
                m.storage.flush.batches
            }),
            ("magnetar_bytes_synced", "Bytes written and fdatasync'd by the log (headers and padding included)", |m| {
                m.storage.flush.bytes
            }),
            ("magnetar_read_cache_hits", "Entry reads served from the read cache", |m| m.storage.read_cache_hits),
            ("magnetar_disk_reads", "Entry reads that went to disk", |m| m.storage.disk_reads),
            ("magnetar_topics_unloaded", "Topics unloaded from memory for being idle", |m| m.topics_unloaded),
        ];
        for (name, help, pick) in counters {
            family(enc, name, help, MetricType::Counter, per_shard(&pick))?;
        }
        let gauges: [(&str, &str, Pick); 6] = [
            ("magnetar_connections", "Connections open", |m| m.connections_opened.saturating_sub(m.connections_closed)),
            ("magnetar_topics_loaded", "Persistent topics loaded in memory", |m| m.topics_loaded),
            ("magnetar_inflight_bytes", "Payload bytes of sends received and not yet answered", |m| m.inflight_bytes),
            ("magnetar_pending_bytes", "Bytes appended to the log and not yet written", |m| m.storage.pending_bytes),
            ("magnetar_disk_used_percent", "Data disk usage at the last check, in percent", |m| {
                u64::from(m.storage.disk_used_pct)
            }),
            ("magnetar_storage_full", "1 while produce is refused because the data disk passed its watermark", |m| {
                u64::from(m.storage.storage_full)
            }),
        ];
        for (name, help, pick) in gauges {
            let max = name == "magnetar_disk_used_percent" || name == "magnetar_storage_full";
            family(enc, name, help, MetricType::Gauge, per_shard_or_max(&pick, max))?;
        }
        // Recovery time in seconds (a float, so not through per_shard).
        let mut rec: Vec<(Labels<'_>, V)> = self
            .reports
            .iter()
            .zip(&shard_names)
            .map(|(r, n)| (vec![("shard", Lv(n.as_str()))], V::Gauge(r.metrics.recovery_us as f64 / 1e6)))
            .collect();
        let longest = self.reports.iter().map(|r| r.metrics.recovery_us).max().unwrap_or(0);
        rec.push((vec![("shard", Lv("total"))], V::Gauge(longest as f64 / 1e6)));
        family(
            enc,
            "magnetar_recovery_seconds",
            "Seconds the shard took to open and recover its entry log at start (total: the longest)",
            MetricType::Gauge,
            rec,
        )?;
        let hist = |pick: &dyn Fn(&ShardMetricsSnapshot) -> HistogramSnapshot| -> Vec<(Labels<'_>, HistogramSnapshot)> {
            let mut v: Vec<(Labels<'_>, HistogramSnapshot)> = self
                .reports
                .iter()
                .zip(&shard_names)
                .map(|(r, n)| (vec![("shard", Lv(n.as_str()))], pick(&r.metrics)))
                .collect();
            v.push((vec![("shard", Lv("total"))], sum_hist(self.reports.iter().map(|r| pick(&r.metrics)))));
            v
        };
        histogram(
            enc,
            "magnetar_publish_latency_seconds",
            "From a send reaching its owner shard to its entry being durable",
            1e6,
            hist(&|m| m.publish_latency_us.clone()),
        )?;
        histogram(
            enc,
            "magnetar_fdatasync_latency_seconds",
            "One group commit's write and fdatasync (one linked request)",
            1e6,
            hist(&|m| HistogramSnapshot::from_buckets(m.storage.flush.sync_us, m.storage.flush.sync_us_sum)),
        )?;
        histogram(
            enc,
            "magnetar_group_commit_records",
            "Records per group commit",
            1.0,
            hist(&|m| HistogramSnapshot::from_buckets(m.storage.flush.records_per_batch, m.storage.flush.records)),
        )?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_core::api::SubscriptionMetrics;
    use magnetar_core::metrics::ShardMetrics;

    /// A shard's report as a scrape gets it: its topics written on the
    /// shard's side.
    fn report(shard: u32, topic_level: bool, topics: Vec<TopicMetrics>) -> ShardReport {
        let m = ShardMetrics::new();
        m.messages_in.add(7);
        m.publish_latency_us.record(300);
        let mut w = TopicSeriesWriter::new(&SeriesWanted { cluster: "stand\"alone".into(), topic_level });
        for t in &topics {
            w.add(t);
        }
        ShardReport { metrics: m.snapshot(shard, Default::default()), topics: Vec::new(), series: w.finish() }
    }

    fn topic(name: &str, sub: &str, backlog: u64) -> TopicMetrics {
        TopicMetrics {
            topic: name.to_string(),
            producers: 1,
            msg_rate_in: 2.5,
            byte_rate_in: 250.0,
            msg_in_total: 10,
            bytes_in_total: 1000,
            storage_bytes: 4096,
            subscriptions: vec![SubscriptionMetrics {
                name: sub.to_string(),
                backlog_messages: backlog,
                unacked: 1,
                delayed: 0,
                msg_rate_out: 1.0,
                byte_rate_out: 100.0,
                msg_out_total: 5,
                bytes_out_total: 500,
                consumers: 2,
            }],
        }
    }

    /// A sample: family, labels, value.
    type Parsed = (String, Vec<(String, String)>, f64);

    /// `(family, labels, value)` of every sample of a text 0.0.4
    /// exposition, parsed by a grammar-based parser.
    fn parse(text: &str) -> Vec<Parsed> {
        use openmetrics_parser::PrometheusValue;
        let e = openmetrics_parser::prometheus::parse_prometheus(text).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let mut out = Vec::new();
        for (name, f) in &e.families {
            for s in f.iter_samples() {
                let labels = s.get_labelset().expect("labels").iter().map(|(k, v)| (k.clone(), v.clone())).collect();
                let v = match &s.value {
                    PrometheusValue::Gauge(n) | PrometheusValue::Unknown(n) => n.as_f64(),
                    PrometheusValue::Counter(c) => c.value.as_f64(),
                    PrometheusValue::Histogram(h) => h.count.unwrap_or(0) as f64,
                    PrometheusValue::Summary(_) => continue,
                };
                out.push((name.clone(), labels, v));
            }
        }
        out
    }

    fn find<'a>(samples: &'a [Parsed], name: &str, label: (&str, &str)) -> Vec<&'a Parsed> {
        samples.iter().filter(|(n, l, _)| n == name && l.iter().any(|(k, v)| k == label.0 && v == label.1)).collect()
    }

    /// Goal: label values from clients (subscription names) are escaped so
    /// that every line of both formats still parses with a grammar-based
    /// parser, the escaped text being exactly the name's; per-shard series
    /// come with a summed one.
    #[test]
    fn label_values_are_escaped_and_shards_summed() {
        let weird = "a\"b\\c\nd";
        let reports = || {
            vec![
                report(0, true, vec![topic("persistent://t/ns/x", weird, 3)]),
                report(1, true, vec![topic("non-persistent://t/ns/y", "s", 4)]),
            ]
        };
        let om = encode("stand\"alone", true, reports(), Format::OpenMetrics).expect("encodes");
        openmetrics_parser::openmetrics::parse_openmetrics(&om).unwrap_or_else(|e| panic!("{e}\n{om}"));
        let text = encode("stand\"alone", true, reports(), Format::Text004).expect("encodes");
        // The same samples in both formats, as prometheus-client converts them.
        assert_eq!(text, to_text_004(&om));
        let samples = parse(&text);
        let rate = find(&samples, "pulsar_rate_in", ("topic", "non-persistent://t/ns/y"));
        assert_eq!(rate.len(), 1, "{text}");
        assert_eq!(rate[0].2, 2.5);
        assert!(rate[0].1.contains(&("cluster".to_string(), r#"stand\"alone"#.to_string())), "{text}");
        let sent = find(&samples, "pulsar_out_messages_total", ("topic", "persistent://t/ns/x"));
        assert_eq!(sent[0].2, 5.0, "{text}");
        let escaped = r#"a\"b\\c\nd"#;
        let backlog = find(&samples, "pulsar_subscription_back_log", ("subscription", escaped));
        assert_eq!(backlog.len(), 1, "{text}");
        assert_eq!(backlog[0].2, 3.0);
        let total = find(&samples, "magnetar_messages_in_total", ("shard", "total"));
        assert_eq!(total.len(), 1, "{text}");
        assert_eq!(total[0].2, 14.0);
        let latency = find(&samples, "magnetar_publish_latency_seconds", ("shard", "total"));
        assert_eq!(latency[0].2, 2.0, "{text}");
    }

    /// Goal: with topic-level series off, the pulsar_* series are per
    /// namespace, summed, and no subscription series are written.
    #[test]
    fn namespace_level_sums_topics() {
        let reports = || {
            vec![
                report(0, false, vec![topic("persistent://t/ns/x", "s", 3)]),
                report(1, false, vec![topic("persistent://t/ns/y", "s", 4), topic("persistent://t/other/z", "s", 1)]),
            ]
        };
        let om = encode("standalone", false, reports(), Format::OpenMetrics).expect("encodes");
        openmetrics_parser::openmetrics::parse_openmetrics(&om).unwrap_or_else(|e| panic!("{e}\n{om}"));
        let text = encode("standalone", false, reports(), Format::Text004).expect("encodes");
        assert_eq!(text, to_text_004(&om));
        let samples = parse(&text);
        let ns = find(&samples, "pulsar_msg_backlog", ("namespace", "t/ns"));
        assert_eq!(ns.len(), 1, "{text}");
        assert_eq!(ns[0].2, 7.0);
        assert!(ns[0].1.iter().all(|(k, _)| k != "topic"));
        assert_eq!(find(&samples, "pulsar_topics_count", ("namespace", "t/ns"))[0].2, 2.0);
        assert!(!text.contains("pulsar_subscription_back_log"));
    }
}
