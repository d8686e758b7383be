//! `GET /metrics`: every shard's figures, encoded by `prometheus-client`
//! on the HTTP thread (the shards only copy values).
//!
//! Pulsar's own names, types and labels (`cluster`, `namespace`, `topic`,
//! `subscription`) for what Magnetar has, so Pulsar's dashboards and alerts
//! work; Magnetar's own figures as `magnetar_*`, per shard (label `shard`)
//! and summed (`shard="total"`).

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

pub(super) async fn scrape(state: &State, accept: &str) -> Response<super::Body> {
    if !state.is_ready() {
        return super::error(StatusCode::SERVICE_UNAVAILABLE, "the broker is starting (recovery not finished)");
    }
    let mut reports = Vec::with_capacity(state.shards.len());
    for shard in 0..state.shards.len() {
        match state.call(shard, |reply| ShardCall::Metrics { reply }).await {
            Ok(r) => reports.push(r),
            Err(e) => return e.response(),
        }
    }
    let openmetrics = accept.contains("application/openmetrics-text");
    match encode(&state.config.cluster, state.config.topic_level_metrics, reports) {
        Ok(body) if openmetrics => super::text(StatusCode::OK, OPENMETRICS, body),
        Ok(body) => super::text(StatusCode::OK, TEXT_004, to_text_004(&body)),
        Err(_) => super::error(StatusCode::INTERNAL_SERVER_ERROR, "encoding the metrics failed"),
    }
}

/// The exposition of `reports` in OpenMetrics text.
pub(crate) fn encode(cluster: &str, topic_level: bool, reports: Vec<ShardReport>) -> Result<String, std::fmt::Error> {
    let mut registry = prometheus_client::registry::Registry::default();
    registry.register_collector(Box::new(Snapshot { cluster: cluster.to_string(), topic_level, reports }));
    let mut out = String::new();
    prometheus_client::encoding::text::encode(&mut out, &registry)?;
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

#[derive(Debug)]
struct Snapshot {
    cluster: String,
    topic_level: bool,
    reports: Vec<ShardReport>,
}

impl std::fmt::Debug for ShardReport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardReport").field("shard", &self.metrics.shard).field("topics", &self.topics.len()).finish()
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
#[derive(Default, Clone)]
struct Agg {
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
        self.encode_pulsar(&mut enc)?;
        self.encode_magnetar(&mut enc)
    }
}

impl Snapshot {
    fn encode_pulsar(&self, enc: &mut DescriptorEncoder<'_>) -> Result<(), std::fmt::Error> {
        let cluster = self.cluster.as_str();
        let topics: Vec<&TopicMetrics> = self.reports.iter().flat_map(|r| r.topics.iter()).collect();
        // (labels, figures) per topic, or per namespace.
        let rows: Vec<(Labels<'_>, Agg)> = if self.topic_level {
            topics
                .iter()
                .map(|t| {
                    let mut a = Agg::default();
                    a.add(t);
                    let labels = vec![
                        ("cluster", Lv(cluster)),
                        ("namespace", Lv(namespace_of(&t.topic))),
                        ("topic", Lv(&t.topic)),
                    ];
                    (labels, a)
                })
                .collect()
        } else {
            let mut by_ns: BTreeMap<&str, Agg> = BTreeMap::new();
            for t in &topics {
                by_ns.entry(namespace_of(&t.topic)).or_default().add(t);
            }
            by_ns.into_iter().map(|(ns, a)| (vec![("cluster", Lv(cluster)), ("namespace", Lv(ns))], a)).collect()
        };
        type Pick = fn(&Agg) -> V;
        let gauges: [(&str, &str, Pick); 9] = [
            ("pulsar_rate_in", "Messages per second published", |a| V::Gauge(a.rate_in)),
            ("pulsar_rate_out", "Messages per second sent to consumers", |a| V::Gauge(a.rate_out)),
            ("pulsar_throughput_in", "Bytes per second published", |a| V::Gauge(a.throughput_in)),
            ("pulsar_throughput_out", "Bytes per second sent to consumers", |a| V::Gauge(a.throughput_out)),
            ("pulsar_storage_size", "Bytes of stored entries", |a| V::Count(a.storage)),
            ("pulsar_msg_backlog", "Messages not acknowledged, summed over subscriptions", |a| V::Count(a.backlog)),
            ("pulsar_producers_count", "Producers attached", |a| V::Count(a.producers)),
            ("pulsar_consumers_count", "Consumers attached", |a| V::Count(a.consumers)),
            ("pulsar_subscriptions_count", "Subscriptions", |a| V::Count(a.subscriptions)),
        ];
        for (name, help, pick) in gauges {
            family(enc, name, help, MetricType::Gauge, rows.iter().map(|(l, a)| (l.clone(), pick(a))))?;
        }
        if !self.topic_level {
            family(
                enc,
                "pulsar_topics_count",
                "Topics loaded",
                MetricType::Gauge,
                rows.iter().map(|(l, a)| (l.clone(), V::Count(a.topics))),
            )?;
        }
        let counters: [(&str, &str, Pick); 4] = [
            ("pulsar_in_messages", "Messages published since the topic was loaded", |a| V::Count(a.in_total)),
            ("pulsar_out_messages", "Messages sent to consumers since the topic was loaded", |a| V::Count(a.out_total)),
            ("pulsar_in_bytes", "Bytes published since the topic was loaded", |a| V::Count(a.bytes_in_total)),
            ("pulsar_out_bytes", "Bytes sent to consumers since the topic was loaded", |a| V::Count(a.bytes_out_total)),
        ];
        for (name, help, pick) in counters {
            family(enc, name, help, MetricType::Counter, rows.iter().map(|(l, a)| (l.clone(), pick(a))))?;
        }
        if !self.topic_level {
            return Ok(());
        }
        // Per subscription (topic level only, as in Pulsar).
        let subs: Vec<(Labels<'_>, &magnetar_core::api::SubscriptionMetrics)> = topics
            .iter()
            .flat_map(|t| {
                t.subscriptions.iter().map(move |s| {
                    let labels = vec![
                        ("cluster", Lv(cluster)),
                        ("namespace", Lv(namespace_of(&t.topic))),
                        ("topic", Lv(&t.topic)),
                        ("subscription", Lv(&s.name)),
                    ];
                    (labels, s)
                })
            })
            .collect();
        type SubPick = fn(&magnetar_core::api::SubscriptionMetrics) -> V;
        let sub_gauges: [(&str, &str, SubPick); 6] = [
            ("pulsar_subscription_back_log", "Messages not acknowledged", |s| V::Count(s.backlog_messages)),
            ("pulsar_subscription_msg_rate_out", "Messages per second sent to consumers", |s| V::Gauge(s.msg_rate_out)),
            ("pulsar_subscription_msg_throughput_out", "Bytes per second sent to consumers", |s| {
                V::Gauge(s.byte_rate_out)
            }),
            ("pulsar_subscription_unacked_messages", "Entries delivered and not acknowledged", |s| V::Count(s.unacked)),
            ("pulsar_subscription_delayed", "Delayed messages not yet due", |s| V::Count(s.delayed)),
            ("pulsar_subscription_consumers_count", "Consumers attached", |s| V::Count(s.consumers)),
        ];
        for (name, help, pick) in sub_gauges {
            family(enc, name, help, MetricType::Gauge, subs.iter().map(|(l, s)| (l.clone(), pick(s))))?;
        }
        Ok(())
    }

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
        let counters: [(&str, &str, Pick); 13] = [
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
        ];
        for (name, help, pick) in counters {
            family(enc, name, help, MetricType::Counter, per_shard(&pick))?;
        }
        let gauges: [(&str, &str, Pick); 5] = [
            ("magnetar_connections", "Connections open", |m| m.connections_opened.saturating_sub(m.connections_closed)),
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

    fn report(shard: u32, topics: Vec<TopicMetrics>) -> ShardReport {
        let m = ShardMetrics::new();
        m.messages_in.add(7);
        m.publish_latency_us.record(300);
        ShardReport { metrics: m.snapshot(shard, Default::default()), topics }
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
        let reports = vec![
            report(0, vec![topic("persistent://t/ns/x", weird, 3)]),
            report(1, vec![topic("persistent://t/ns/y", "s", 4)]),
        ];
        let om = encode("standalone", true, reports).expect("encodes");
        openmetrics_parser::openmetrics::parse_openmetrics(&om).unwrap_or_else(|e| panic!("{e}\n{om}"));
        let text = to_text_004(&om);
        let samples = parse(&text);
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
        let reports = vec![
            report(0, vec![topic("persistent://t/ns/x", "s", 3)]),
            report(1, vec![topic("persistent://t/ns/y", "s", 4), topic("persistent://t/other/z", "s", 1)]),
        ];
        let text = to_text_004(&encode("standalone", false, reports).expect("encodes"));
        let samples = parse(&text);
        let ns = find(&samples, "pulsar_msg_backlog", ("namespace", "t/ns"));
        assert_eq!(ns.len(), 1, "{text}");
        assert_eq!(ns[0].2, 7.0);
        assert!(ns[0].1.iter().all(|(k, _)| k != "topic"));
        assert_eq!(find(&samples, "pulsar_topics_count", ("namespace", "t/ns"))[0].2, 2.0);
        assert!(!text.contains("pulsar_subscription_back_log"));
    }
}
