//! The web console: static assets embedded at build time (`net/console/`)
//! and the few JSON endpoints it needs that Pulsar's REST admin has no
//! path for, under `/admin/v2/magnetar/`:
//!
//! - `overview`: per shard its topics, connections, rates, storage, disk
//!   use and watermark state, recovery time; the broker's version and
//!   uptime. From the same per-shard reports `/metrics` encodes
//!   ([`ShardCall::Metrics`]), taken in the shards' low-share HTTP queue.
//! - `topics`: one page of a namespace's (or every namespace's) topics,
//!   searched by name, with rates, storage and backlog, so a broker with
//!   10,000 topics is never listed whole to a browser.
//! - `find`: messages by key (the core's
//!   [`AdminRequest::FindMessages`]), which Pulsar's REST has no path for.
//!
//! Everything else the console shows or does goes through Pulsar's own
//! REST paths (`rest.rs`), so a refusal there (an unknown topic, a missing
//! permission) is what the console shows.

use super::{error, json, text, Body, ShardCall, ShardReport, State};
use base64::Engine;
use hyper::{Response, StatusCode};
use magnetar_core::api::{AdminReply, AdminRequest, FoundMessage, TopicMetrics};
use magnetar_core::TopicName;
use serde_json::{json, Value};
use std::collections::{BTreeSet, HashMap};

/// The page: one document, its script modules and stylesheet. Hash routes
/// (`#/topics`, `#/topic/...`) keep every page on `/`.
pub(super) const INDEX_HTML: &str = include_str!("../../console/index.html");
pub(super) const APP_JS: &str = include_str!("../../console/app.js");
pub(super) const API_JS: &str = include_str!("../../console/api.js");
pub(super) const CHART_JS: &str = include_str!("../../console/chart.js");
pub(super) const STYLE_CSS: &str = include_str!("../../console/style.css");

/// Topics in one answer of `topics` at most.
const TOPICS_PAGE_MAX: usize = 200;
/// Topic names listed per shard in the overview (the busiest first).
const OVERVIEW_TOPICS_PER_SHARD: usize = 20;
/// Messages one `find` answers at most.
const FIND_LIMIT_MAX: u32 = 100;

/// An embedded asset. `no-cache`: a browser revalidates, so a new broker
/// binary's console is what it gets.
pub(super) fn asset(content_type: &'static str, body: &'static str) -> Response<Body> {
    let mut r = text(StatusCode::OK, content_type, body);
    let h = r.headers_mut();
    h.insert(hyper::header::CACHE_CONTROL, hyper::header::HeaderValue::from_static("no-cache"));
    h.insert(hyper::header::X_CONTENT_TYPE_OPTIONS, hyper::header::HeaderValue::from_static("nosniff"));
    // Nothing is loaded from elsewhere: the page's own scripts, styles and
    // calls only.
    h.insert(
        hyper::header::CONTENT_SECURITY_POLICY,
        hyper::header::HeaderValue::from_static(
            "default-src 'self'; img-src 'self' data:; style-src 'self'; frame-ancestors 'none'",
        ),
    );
    r
}

/// Query parameters, `%XX` and `+` decoded.
fn query(q: Option<&str>) -> HashMap<String, String> {
    q.unwrap_or("")
        .split('&')
        .filter(|p| !p.is_empty())
        .map(|p| {
            let (k, v) = p.split_once('=').unwrap_or((p, ""));
            (super::percent_decode(&k.replace('+', " ")), super::percent_decode(&v.replace('+', " ")))
        })
        .collect()
}

fn bad(why: impl Into<String>) -> Response<Body> {
    error(StatusCode::BAD_REQUEST, why)
}

fn param_usize(q: &HashMap<String, String>, k: &str, default: usize) -> Result<usize, Response<Body>> {
    match q.get(k) {
        None => Ok(default),
        Some(v) if v.is_empty() => Ok(default),
        Some(v) => v.parse().map_err(|_| bad(format!("{k} must be a non-negative integer"))),
    }
}

/// Every shard's report, as `/metrics` takes them.
async fn reports(state: &State) -> Result<Vec<ShardReport>, Response<Body>> {
    let mut out = Vec::with_capacity(state.shards.len());
    for shard in 0..state.shards.len() {
        out.push(
            state.call(shard, |reply| ShardCall::Metrics { series: None, reply }).await.map_err(|e| e.response())?,
        );
    }
    Ok(out)
}

async fn admin(state: &State, request: AdminRequest) -> Result<AdminReply, Response<Body>> {
    match state.admin(request).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(error(super::rest::status_of(&e), e.message)),
        Err(e) => Err(e.response()),
    }
}

async fn names(state: &State, request: AdminRequest) -> Result<Vec<String>, Response<Body>> {
    match admin(state, request).await? {
        AdminReply::Names(n) => Ok(n),
        other => Err(error(StatusCode::INTERNAL_SERVER_ERROR, format!("internal: unexpected reply {other:?}"))),
    }
}

fn rate_out(t: &TopicMetrics) -> (f64, f64) {
    t.subscriptions.iter().fold((0.0, 0.0), |(m, b), s| (m + s.msg_rate_out, b + s.byte_rate_out))
}

fn backlog(t: &TopicMetrics) -> u64 {
    t.subscriptions.iter().map(|s| s.backlog_messages).sum()
}

/// Seconds since this process started (`/proc/self/stat`'s start time
/// against `/proc/uptime`); `None` where they cannot be read.
fn process_uptime_secs() -> Option<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name (field 2) may hold spaces: fields are counted from
    // after its closing parenthesis; the start time is field 22.
    let after = &stat[stat.rfind(')')? + 1..];
    let start_ticks: f64 = after.split_whitespace().nth(19)?.parse().ok()?;
    let uptime: f64 = std::fs::read_to_string("/proc/uptime").ok()?.split_whitespace().next()?.parse().ok()?;
    // SAFETY: sysconf takes no pointer and only reads a constant.
    #[allow(unsafe_code)]
    let ticks_per_sec = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    (ticks_per_sec > 0).then(|| (uptime - start_ticks / ticks_per_sec as f64).max(0.0))
}

/// `GET /admin/v2/magnetar/overview`.
pub(super) async fn overview(state: &State) -> Response<Body> {
    let reports = match reports(state).await {
        Ok(r) => r,
        Err(r) => return r,
    };
    let mut shards = Vec::with_capacity(reports.len());
    let mut totals = json!({
        "topics": 0, "connections": 0, "msgRateIn": 0.0, "msgRateOut": 0.0, "msgThroughputIn": 0.0,
        "msgThroughputOut": 0.0, "storageSize": 0, "backlog": 0, "subscriptions": 0, "consumers": 0,
        "producers": 0,
    });
    let mut recovery_us_max = 0;
    let mut storage_full = false;
    let mut disk_used_pct = 0;
    for r in &reports {
        let m = &r.metrics;
        let rate_in: f64 = r.topics.iter().map(|t| t.msg_rate_in).sum();
        let bytes_in: f64 = r.topics.iter().map(|t| t.byte_rate_in).sum();
        let (rate_o, bytes_o) = r.topics.iter().map(rate_out).fold((0.0, 0.0), |a, b| (a.0 + b.0, a.1 + b.1));
        let storage: u64 = r.topics.iter().map(|t| t.storage_bytes).sum();
        let backlog_sum: u64 = r.topics.iter().map(backlog).sum();
        let subs: usize = r.topics.iter().map(|t| t.subscriptions.len()).sum();
        let consumers: u64 = r.topics.iter().flat_map(|t| t.subscriptions.iter().map(|s| s.consumers)).sum();
        let producers: u64 = r.topics.iter().map(|t| t.producers).sum();
        let connections = m.connections_opened.saturating_sub(m.connections_closed);
        // The busiest topics by messages in and out, then by name.
        let mut busiest: Vec<&TopicMetrics> = r.topics.iter().collect();
        busiest.sort_by(|a, b| {
            let ka = a.msg_rate_in + rate_out(a).0;
            let kb = b.msg_rate_in + rate_out(b).0;
            kb.total_cmp(&ka).then_with(|| a.topic.cmp(&b.topic))
        });
        let listed: Vec<Value> = busiest
            .iter()
            .take(OVERVIEW_TOPICS_PER_SHARD)
            .map(|t| {
                json!({
                    "topic": t.topic, "msgRateIn": t.msg_rate_in, "msgRateOut": rate_out(t).0,
                    "storageSize": t.storage_bytes, "backlog": backlog(t),
                })
            })
            .collect();
        recovery_us_max = recovery_us_max.max(m.recovery_us);
        storage_full |= m.storage.storage_full;
        disk_used_pct = disk_used_pct.max(m.storage.disk_used_pct);
        shards.push(json!({
            "shard": m.shard,
            "topicCount": r.topics.len(),
            "topics": listed,
            "connections": connections,
            "msgRateIn": rate_in,
            "msgRateOut": rate_o,
            "msgThroughputIn": bytes_in,
            "msgThroughputOut": bytes_o,
            "messagesInTotal": m.messages_in,
            "bytesInTotal": m.bytes_in,
            "entriesOutTotal": m.entries_out,
            "storageSize": storage,
            "backlog": backlog_sum,
            "subscriptions": subs,
            "consumers": consumers,
            "producers": producers,
            "inflightBytes": m.inflight_bytes,
            "diskUsedPercent": m.storage.disk_used_pct,
            "storageFull": m.storage.storage_full,
            "recoveryMillis": m.recovery_us as f64 / 1000.0,
        }));
        let add = |v: &mut Value, k: &str, x: f64| v[k] = json!(v[k].as_f64().unwrap_or(0.0) + x);
        add(&mut totals, "topics", r.topics.len() as f64);
        add(&mut totals, "connections", connections as f64);
        add(&mut totals, "msgRateIn", rate_in);
        add(&mut totals, "msgRateOut", rate_o);
        add(&mut totals, "msgThroughputIn", bytes_in);
        add(&mut totals, "msgThroughputOut", bytes_o);
        add(&mut totals, "storageSize", storage as f64);
        add(&mut totals, "backlog", backlog_sum as f64);
        add(&mut totals, "subscriptions", subs as f64);
        add(&mut totals, "consumers", consumers as f64);
        add(&mut totals, "producers", producers as f64);
    }
    json(
        StatusCode::OK,
        &json!({
            "version": env!("CARGO_PKG_VERSION"),
            "cluster": state.config.cluster,
            "ready": state.is_ready(),
            "uptimeSeconds": process_uptime_secs(),
            // Shards recover in parallel: the start waited for the slowest.
            "recoveryMillis": recovery_us_max as f64 / 1000.0,
            "diskUsedPercent": disk_used_pct,
            "watermark": if storage_full { "produce refused: disk above the high watermark" } else { "ok" },
            "storageFull": storage_full,
            "shards": shards,
            "totals": totals,
        }),
    )
}

/// `NAME-partition-N` as (NAME, N).
fn partition_of(name: &str) -> Option<(&str, u32)> {
    let (base, i) = name.rsplit_once("-partition-")?;
    Some((base, i.parse().ok()?))
}

/// `GET /admin/v2/magnetar/topics?namespace=t/ns&search=&offset=&limit=`:
/// one page of topics sorted by name, a partitioned topic as one row with
/// its partitions' figures summed. Without `namespace`, every namespace's.
pub(super) async fn topics(state: &State, q: Option<&str>) -> Response<Body> {
    match topics_page(state, &query(q)).await {
        Ok(v) => json(StatusCode::OK, &v),
        Err(r) => r,
    }
}

async fn topics_page(state: &State, q: &HashMap<String, String>) -> Result<Value, Response<Body>> {
    let offset = param_usize(q, "offset", 0)?;
    let limit = param_usize(q, "limit", 50)?.clamp(1, TOPICS_PAGE_MAX);
    let search = q.get("search").map(|s| s.to_lowercase()).unwrap_or_default();
    let namespaces = match q.get("namespace").filter(|s| !s.is_empty()) {
        Some(ns) => vec![ns.clone()],
        None => {
            let mut all = Vec::new();
            for t in names(state, AdminRequest::ListTenants).await? {
                all.extend(names(state, AdminRequest::ListNamespaces { tenant: t }).await?);
            }
            all
        }
    };
    let mut all = BTreeSet::new();
    for ns in &namespaces {
        all.extend(names(state, AdminRequest::ListTopics { namespace: ns.clone(), after: None, limit: None }).await?);
    }
    // A partition is shown in its partitioned topic's row.
    let rows: Vec<&String> = all
        .iter()
        .filter(|n| !partition_of(n).is_some_and(|(base, _)| all.contains(base)))
        .filter(|n| search.is_empty() || n.to_lowercase().contains(&search))
        .collect();
    let total = rows.len();
    let page: Vec<&String> = rows.into_iter().skip(offset).take(limit).collect();
    let metrics: HashMap<String, TopicMetrics> =
        reports(state).await?.into_iter().flat_map(|r| r.topics).map(|t| (t.topic.clone(), t)).collect();
    let mut out = Vec::with_capacity(page.len());
    for name in page {
        let partitions = match TopicName::parse(name) {
            Ok(tn) if partition_of(name).is_none() => {
                match admin(state, AdminRequest::PartitionedMetadata { topic: tn }).await? {
                    AdminReply::Partitions(n) => n,
                    _ => 0,
                }
            }
            _ => 0,
        };
        let parts: Vec<&TopicMetrics> = if partitions > 0 {
            (0..partitions).filter_map(|i| metrics.get(&format!("{name}-partition-{i}"))).collect()
        } else {
            metrics.get(name.as_str()).into_iter().collect()
        };
        let sum = |f: &dyn Fn(&TopicMetrics) -> f64| parts.iter().map(|t| f(t)).sum::<f64>();
        out.push(json!({
            "name": name,
            "partitions": partitions,
            "loaded": !parts.is_empty(),
            "msgRateIn": sum(&|t| t.msg_rate_in),
            "msgRateOut": sum(&|t| rate_out(t).0),
            "msgThroughputIn": sum(&|t| t.byte_rate_in),
            "msgThroughputOut": sum(&|t| rate_out(t).1),
            "storageSize": sum(&|t| t.storage_bytes as f64) as u64,
            "backlog": sum(&|t| backlog(t) as f64) as u64,
            "producers": sum(&|t| t.producers as f64) as u64,
            "subscriptions": sum(&|t| t.subscriptions.len() as f64) as u64,
            "consumers": sum(&|t| t.subscriptions.iter().map(|s| s.consumers).sum::<u64>() as f64) as u64,
        }));
    }
    Ok(json!({ "total": total, "offset": offset, "limit": limit, "topics": out }))
}

fn found_json(m: &FoundMessage) -> Value {
    json!({
        "messageId": m.id.to_string(),
        "topic": m.topic,
        "key": m.key,
        "properties": m.properties,
        "publishTime": m.publish_time_ms,
        "payloadSize": m.payload.len(),
        "payloadBase64": base64::engine::general_purpose::STANDARD.encode(&m.payload),
        "compression": m.compressed.map(|c| format!("{:?}", c.compression)),
        "batchMessages": m.compressed.map(|c| c.messages),
    })
}

/// `GET /admin/v2/magnetar/find?topic=persistent://t/ns/x&key=K&limit=N&before=MS`:
/// messages with key `K`, newest first.
pub(super) async fn find(state: &State, q: Option<&str>) -> Response<Body> {
    let q = query(q);
    let Some(topic) = q.get("topic") else { return bad("topic is required") };
    let topic = match TopicName::parse(topic) {
        Ok(t) => t,
        Err(e) => return error(StatusCode::PRECONDITION_FAILED, e.to_string()),
    };
    let Some(key) = q.get("key").cloned() else { return bad("key is required") };
    let limit = match param_usize(&q, "limit", 10) {
        Ok(n) => (n as u32).clamp(1, FIND_LIMIT_MAX),
        Err(r) => return r,
    };
    let before_ms = match q.get("before").filter(|s| !s.is_empty()) {
        None => None,
        Some(v) => match v.parse() {
            Ok(ms) => Some(ms),
            Err(_) => return bad("before must be milliseconds since the epoch"),
        },
    };
    match admin(state, AdminRequest::FindMessages { topic, key, before_ms, limit }).await {
        Ok(AdminReply::Found(f)) => json(
            StatusCode::OK,
            &json!({ "messages": f.messages.iter().map(found_json).collect::<Vec<_>>(), "truncated": f.truncated }),
        ),
        Ok(other) => error(StatusCode::INTERNAL_SERVER_ERROR, format!("internal: unexpected reply {other:?}")),
        Err(r) => r,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn query_parameters_are_decoded() {
        let q = query(Some("namespace=public%2Fdefault&search=a+b&limit=5&flag"));
        assert_eq!(q["namespace"], "public/default");
        assert_eq!(q["search"], "a b");
        assert_eq!(q["limit"], "5");
        assert_eq!(q["flag"], "");
        assert!(query(None).is_empty());
    }

    #[test]
    fn partition_names_split() {
        assert_eq!(partition_of("persistent://a/b/t-partition-3"), Some(("persistent://a/b/t", 3)));
        assert_eq!(partition_of("persistent://a/b/t-partition-x"), None);
        assert_eq!(partition_of("persistent://a/b/t"), None);
    }

    #[test]
    fn this_process_has_an_uptime() {
        let up = process_uptime_secs().expect("readable on Linux");
        assert!((0.0..86_400.0 * 365.0).contains(&up), "{up}");
    }
}
