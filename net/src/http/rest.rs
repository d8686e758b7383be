//! The REST admin under `/admin/v2/`: Apache Pulsar's paths, verbs, status
//! codes and JSON shapes, for what Magnetar has. Every operation is a typed
//! [`AdminRequest`] run by the core (so its checks apply, whatever the
//! door); what Magnetar does not do answers 501 with a JSON reason.

mod subscription;

use super::{error, json, no_content, read_body, Body, CallError, ShardCall, State};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use magnetar_core::api::{AdminReply, AdminRequest, LastMessageId, PolicyChange, TopicStats};
use magnetar_core::metadata::{Policies, TenantInfo};
use magnetar_core::{CoreError, TopicName};
use magnetar_wire::{ErrorCode, MessageId};
use serde_json::{json, Value};

/// Pulsar's status for a core error.
pub(crate) fn status_of(e: &CoreError) -> StatusCode {
    match e.code {
        ErrorCode::TopicNotFound => StatusCode::NOT_FOUND,
        ErrorCode::InvalidTopicName => StatusCode::PRECONDITION_FAILED,
        ErrorCode::NotAllowed | ErrorCode::ProducerBusy | ErrorCode::ConsumerBusy => StatusCode::CONFLICT,
        ErrorCode::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
        ErrorCode::ServiceNotReady | ErrorCode::StorageFull => StatusCode::SERVICE_UNAVAILABLE,
        ErrorCode::AuthenticationError => StatusCode::UNAUTHORIZED,
        ErrorCode::AuthorizationError => StatusCode::FORBIDDEN,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

fn core_error(e: CoreError) -> Response<Body> {
    error(status_of(&e), e.message)
}

fn not_supported(what: &str) -> Response<Body> {
    error(StatusCode::NOT_IMPLEMENTED, format!("{what} is not supported by Magnetar"))
}

/// Runs `request` on the core; `Ok` is its reply, `Err` the answer to give.
async fn admin(state: &State, request: AdminRequest) -> Result<AdminReply, Response<Body>> {
    match state.admin(request).await {
        Ok(Ok(r)) => Ok(r),
        Ok(Err(e)) => Err(core_error(e)),
        Err(e) => Err(e.response()),
    }
}

/// Runs a request whose success is "204 No Content".
async fn done(state: &State, request: AdminRequest) -> Response<Body> {
    match admin(state, request).await {
        Ok(_) => no_content(),
        Err(r) => r,
    }
}

async fn names(state: &State, request: AdminRequest) -> Response<Body> {
    match admin(state, request).await {
        Ok(AdminReply::Names(n)) => json(StatusCode::OK, &json!(n)),
        Ok(other) => unexpected(other),
        Err(r) => r,
    }
}

fn unexpected(reply: AdminReply) -> Response<Body> {
    error(StatusCode::INTERNAL_SERVER_ERROR, format!("internal: unexpected reply {reply:?}"))
}

/// The body as JSON (an empty body is `null`).
async fn body_json(state: &State, req: Request<Incoming>) -> Result<Value, Response<Body>> {
    let bytes = read_body(state, req.into_body()).await?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(Value::Null);
    }
    serde_json::from_slice(&bytes).map_err(|e| error(StatusCode::BAD_REQUEST, format!("malformed JSON body: {e}")))
}

fn bad_body(why: impl Into<String>) -> Response<Body> {
    error(StatusCode::BAD_REQUEST, why)
}

/// A topic's full name from its path parts.
fn topic_name(domain: &str, tenant: &str, ns: &str, topic: &str) -> Result<TopicName, Response<Body>> {
    TopicName::parse(&format!("{domain}://{tenant}/{ns}/{topic}"))
        .map_err(|e| error(StatusCode::PRECONDITION_FAILED, e.to_string()))
}

pub(super) async fn handle(state: &State, req: Request<Incoming>, segs: Vec<String>) -> Response<Body> {
    let method = req.method().clone();
    let s: Vec<&str> = segs.iter().map(String::as_str).collect();
    match (&method, s.as_slice()) {
        // ---------------------------------------------------------- brokers
        (&Method::GET, ["brokers", "health"]) => {
            if !state.is_ready() {
                return error(StatusCode::SERVICE_UNAVAILABLE, "the broker is starting");
            }
            let principal = state.principal.clone();
            match state.call(0, |reply| ShardCall::Health { principal, reply }).await {
                Ok(Ok(())) => super::text(StatusCode::OK, "text/plain", "ok"),
                Ok(Err(e)) if e.code == ErrorCode::AuthorizationError => core_error(e),
                Ok(Err(e)) => error(StatusCode::SERVICE_UNAVAILABLE, format!("health check failed: {}", e.message)),
                Err(e) => e.response(),
            }
        }
        // --------------------------------------------------------- clusters
        (&Method::GET, ["clusters"]) => json(StatusCode::OK, &json!([state.config.cluster])),
        (&Method::GET, ["clusters", c]) if *c == state.config.cluster => {
            json(StatusCode::OK, &json!({ "serviceUrl": "", "brokerServiceUrl": "" }))
        }
        (&Method::GET, ["clusters", c]) => error(StatusCode::NOT_FOUND, format!("Cluster {c} does not exist")),
        (_, ["clusters", ..]) => not_supported("changing clusters"),
        // ---------------------------------------------------------- tenants
        (&Method::GET, ["tenants"]) => names(state, AdminRequest::ListTenants).await,
        (&Method::GET, ["tenants", t]) => match admin(state, AdminRequest::GetTenant { tenant: t.to_string() }).await {
            Ok(AdminReply::Tenant(info)) => json(StatusCode::OK, &tenant_json(&info)),
            Ok(other) => unexpected(other),
            Err(r) => r,
        },
        (&Method::PUT, ["tenants", t]) => {
            let tenant = t.to_string();
            let body = match body_json(state, req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let info = match tenant_info(&body) {
                Ok(i) => i,
                Err(r) => return r,
            };
            done(state, AdminRequest::CreateTenant { tenant, info }).await
        }
        (&Method::DELETE, ["tenants", t]) => done(state, AdminRequest::DeleteTenant { tenant: t.to_string() }).await,
        // ------------------------------------------------------- namespaces
        (&Method::GET, ["namespaces", t]) => names(state, AdminRequest::ListNamespaces { tenant: t.to_string() }).await,
        (&Method::PUT, ["namespaces", t, ns]) => {
            let namespace = format!("{t}/{ns}");
            let body = match body_json(state, req).await {
                Ok(b) => b,
                Err(r) => return r,
            };
            let policies = match &body {
                Value::Null => PolicyChange::default(),
                Value::Object(_) => match policy_change(&body) {
                    Ok(p) => p,
                    Err(r) => return r,
                },
                _ => return bad_body("the body must be a Policies object"),
            };
            done(state, AdminRequest::CreateNamespace { namespace, policies }).await
        }
        (&Method::DELETE, ["namespaces", t, ns]) => {
            done(state, AdminRequest::DeleteNamespace { namespace: format!("{t}/{ns}") }).await
        }
        (&Method::GET, ["namespaces", t, ns]) => match get_policies(state, &format!("{t}/{ns}")).await {
            Ok(p) => json(StatusCode::OK, &policies_json(&p)),
            Err(r) => r,
        },
        (_, ["namespaces", t, ns, policy]) => {
            let namespace = format!("{t}/{ns}");
            namespace_policy(state, req, &method, namespace, policy).await
        }
        // ----------------------------------------------------------- topics
        (&Method::GET, [domain @ ("persistent" | "non-persistent"), t, ns]) => {
            match namespace_topics(state, domain, &format!("{t}/{ns}")).await {
                Ok((topics, _)) => json(StatusCode::OK, &json!(topics)),
                Err(r) => r,
            }
        }
        (&Method::GET, [domain @ ("persistent" | "non-persistent"), t, ns, "partitioned"]) => {
            match namespace_topics(state, domain, &format!("{t}/{ns}")).await {
                Ok((_, partitioned)) => json(StatusCode::OK, &json!(partitioned)),
                Err(r) => r,
            }
        }
        (_, [domain @ ("persistent" | "non-persistent"), t, ns, topic, rest @ ..]) => {
            let name = match topic_name(domain, t, ns, topic) {
                Ok(n) => n,
                Err(r) => return r,
            };
            if name.domain == magnetar_core::topic_name::Domain::NonPersistent {
                if let Some(why) = non_persistent_unsupported(&method, rest) {
                    return error(StatusCode::NOT_IMPLEMENTED, why);
                }
            }
            topic_op(state, req, &method, name, rest).await
        }
        _ => not_supported(&format!("{method} /admin/v2/{}", segs.join("/"))),
    }
}

fn tenant_json(info: &TenantInfo) -> Value {
    json!({ "adminRoles": info.admin_roles, "allowedClusters": info.allowed_clusters })
}

/// Pulsar's `TenantInfo`: `adminRoles` and `allowedClusters`, both
/// optional; other fields are refused.
fn tenant_info(body: &Value) -> Result<TenantInfo, Response<Body>> {
    let mut info = TenantInfo { admin_roles: Vec::new(), allowed_clusters: Vec::new() };
    let obj = match body {
        Value::Null => return Ok(info),
        Value::Object(o) => o,
        _ => return Err(bad_body("the body must be a TenantInfo object")),
    };
    for (k, v) in obj {
        let list = v
            .as_array()
            .and_then(|a| a.iter().map(|x| x.as_str().map(str::to_string)).collect::<Option<Vec<String>>>())
            .ok_or_else(|| bad_body(format!("{k} must be a list of strings")))?;
        match k.as_str() {
            "adminRoles" => info.admin_roles = list,
            "allowedClusters" => info.allowed_clusters = list,
            other => return Err(bad_body(format!("unknown field {other:?} of TenantInfo"))),
        }
    }
    Ok(info)
}

/// `count` bundles' boundaries over the 32-bit hash range, as Pulsar
/// writes them.
fn bundles_json(count: u32) -> Value {
    let count = u64::from(count.max(1));
    let full = 1u64 << 32;
    let boundaries: Vec<String> = (0..=count)
        .map(|i| {
            let b = if i == count { full - 1 } else { full * i / count };
            format!("0x{b:08x}")
        })
        .collect();
    json!({ "boundaries": boundaries, "numBundles": count })
}

fn auto_topic_json(p: &Policies) -> Value {
    let kind = if p.default_partitions > 0 { "partitioned" } else { "non-partitioned" };
    let mut v = json!({ "allowAutoTopicCreation": p.auto_topic_creation, "topicType": kind });
    if p.default_partitions > 0 {
        v["defaultNumPartitions"] = json!(p.default_partitions);
    }
    v
}

fn retention_json(p: &Policies) -> Value {
    json!({ "retentionTimeInMinutes": p.retention_minutes, "retentionSizeInMB": p.retention_size_mb })
}

/// The parts of Pulsar's `Policies` Magnetar has.
fn policies_json(p: &Policies) -> Value {
    json!({
        "bundles": bundles_json(p.bundles),
        "retention_policies": retention_json(p),
        "message_ttl_in_seconds": p.message_ttl_seconds,
        "deduplicationEnabled": p.deduplication,
        "max_producers_per_topic": p.max_producers_per_topic,
        "max_consumers_per_topic": p.max_consumers_per_topic,
        "autoTopicCreationOverride": auto_topic_json(p),
    })
}

/// A `Policies` object given at namespace creation: the fields Magnetar has.
fn policy_change(body: &Value) -> Result<PolicyChange, Response<Body>> {
    let mut c = PolicyChange::default();
    let Some(obj) = body.as_object() else { return Err(bad_body("the body must be a Policies object")) };
    for (k, v) in obj {
        match k.as_str() {
            "bundles" => c.bundles = Some(num_bundles(v)?),
            "retention_policies" => {
                let (m, s) = retention_of(v)?;
                c.retention_minutes = Some(m);
                c.retention_size_mb = Some(s);
            }
            "message_ttl_in_seconds" => c.message_ttl_seconds = Some(u64_of(k, v)?),
            "deduplicationEnabled" => c.deduplication = Some(bool_of(k, v)?),
            "max_producers_per_topic" => c.max_producers_per_topic = Some(u32_of(k, v)?),
            "max_consumers_per_topic" => c.max_consumers_per_topic = Some(u32_of(k, v)?),
            "autoTopicCreationOverride" => {
                let (allow, parts) = auto_topic_of(v)?;
                c.auto_topic_creation = Some(allow);
                c.default_partitions = Some(parts);
            }
            other => return Err(not_supported(&format!("the namespace policy {other:?}"))),
        }
    }
    Ok(c)
}

fn u64_of(k: &str, v: &Value) -> Result<u64, Response<Body>> {
    v.as_u64().ok_or_else(|| bad_body(format!("{k} must be a non-negative integer")))
}

fn u32_of(k: &str, v: &Value) -> Result<u32, Response<Body>> {
    u64_of(k, v)?.try_into().map_err(|_| bad_body(format!("{k} is too large")))
}

fn bool_of(k: &str, v: &Value) -> Result<bool, Response<Body>> {
    v.as_bool().ok_or_else(|| bad_body(format!("{k} must be true or false")))
}

fn num_bundles(v: &Value) -> Result<u32, Response<Body>> {
    let n = v.get("numBundles").ok_or_else(|| bad_body("bundles needs numBundles"))?;
    u32_of("numBundles", n)
}

fn retention_of(v: &Value) -> Result<(i64, i64), Response<Body>> {
    let get =
        |k: &str| v.get(k).and_then(Value::as_i64).ok_or_else(|| bad_body(format!("retention needs an integer {k}")));
    Ok((get("retentionTimeInMinutes")?, get("retentionSizeInMB")?))
}

fn auto_topic_of(v: &Value) -> Result<(bool, u32), Response<Body>> {
    let allow = bool_of("allowAutoTopicCreation", v.get("allowAutoTopicCreation").unwrap_or(&Value::Null))?;
    let kind = v.get("topicType").and_then(Value::as_str).unwrap_or("non-partitioned");
    let parts = match kind {
        "non-partitioned" => 0,
        "partitioned" => {
            let n = u32_of("defaultNumPartitions", v.get("defaultNumPartitions").unwrap_or(&Value::Null))?;
            if n == 0 {
                return Err(bad_body("defaultNumPartitions must be at least 1 for partitioned topics"));
            }
            n
        }
        other => return Err(bad_body(format!("unknown topicType {other:?}"))),
    };
    Ok((allow, parts))
}

async fn get_policies(state: &State, namespace: &str) -> Result<Policies, Response<Body>> {
    match admin(state, AdminRequest::GetPolicies { namespace: namespace.to_string() }).await? {
        AdminReply::Policies(p) => Ok(p),
        other => Err(unexpected(other)),
    }
}

/// `/namespaces/{tenant}/{namespace}/{policy}`: read, set or remove one.
async fn namespace_policy(
    state: &State,
    req: Request<Incoming>,
    method: &Method,
    namespace: String,
    policy: &str,
) -> Response<Body> {
    type Render = fn(&Policies) -> Value;
    let render: Option<Render> = match policy {
        "retention" => Some(retention_json),
        "messageTTL" => Some(|p| json!(p.message_ttl_seconds)),
        "deduplication" => Some(|p| json!(p.deduplication)),
        "maxProducersPerTopic" => Some(|p| json!(p.max_producers_per_topic)),
        "maxConsumersPerTopic" => Some(|p| json!(p.max_consumers_per_topic)),
        "autoTopicCreation" => Some(auto_topic_json),
        "bundles" => Some(|p| bundles_json(p.bundles)),
        _ => None,
    };
    let Some(render) = render else { return not_supported(&format!("the namespace policy {policy:?}")) };
    match *method {
        Method::GET => match get_policies(state, &namespace).await {
            Ok(p) => json(StatusCode::OK, &render(&p)),
            Err(r) => r,
        },
        Method::POST | Method::DELETE => {
            let body = if *method == Method::POST {
                match body_json(state, req).await {
                    Ok(b) => b,
                    Err(r) => return r,
                }
            } else {
                Value::Null
            };
            let defaults = Policies::default();
            let remove = *method == Method::DELETE;
            let mut c = PolicyChange::default();
            let parsed = match policy {
                "retention" if remove => {
                    c.retention_minutes = Some(defaults.retention_minutes);
                    c.retention_size_mb = Some(defaults.retention_size_mb);
                    Ok(())
                }
                "retention" => retention_of(&body).map(|(m, s)| {
                    c.retention_minutes = Some(m);
                    c.retention_size_mb = Some(s);
                }),
                "messageTTL" if remove => {
                    c.message_ttl_seconds = Some(defaults.message_ttl_seconds);
                    Ok(())
                }
                "messageTTL" => u64_of("messageTTL", &body).map(|v| c.message_ttl_seconds = Some(v)),
                "deduplication" if remove => {
                    c.deduplication = Some(defaults.deduplication);
                    Ok(())
                }
                "deduplication" => bool_of("deduplication", &body).map(|v| c.deduplication = Some(v)),
                "maxProducersPerTopic" if remove => {
                    c.max_producers_per_topic = Some(0);
                    Ok(())
                }
                "maxProducersPerTopic" => u32_of(policy, &body).map(|v| c.max_producers_per_topic = Some(v)),
                "maxConsumersPerTopic" if remove => {
                    c.max_consumers_per_topic = Some(0);
                    Ok(())
                }
                "maxConsumersPerTopic" => u32_of(policy, &body).map(|v| c.max_consumers_per_topic = Some(v)),
                "autoTopicCreation" if remove => {
                    c.auto_topic_creation = Some(defaults.auto_topic_creation);
                    c.default_partitions = Some(defaults.default_partitions);
                    Ok(())
                }
                "autoTopicCreation" => auto_topic_of(&body).map(|(a, n)| {
                    c.auto_topic_creation = Some(a);
                    c.default_partitions = Some(n);
                }),
                _ => return not_supported(&format!("changing the namespace policy {policy:?}")),
            };
            if let Err(r) = parsed {
                return r;
            }
            done(state, AdminRequest::SetPolicies { namespace, policies: c }).await
        }
        _ => error(StatusCode::METHOD_NOT_ALLOWED, format!("{method} is not allowed on {policy}")),
    }
}

/// What Magnetar cannot do on a non-persistent topic, and why (`None`:
/// served as for a persistent topic). A non-persistent topic exists while
/// it has a producer or a consumer, and keeps nothing: no ledgers, no
/// cursors, so nothing to create ahead, to look into or to move.
fn non_persistent_unsupported(method: &Method, rest: &[&str]) -> Option<String> {
    let why = match (method, rest) {
        (&Method::PUT, []) => {
            "creating a non-persistent topic ahead of use (Magnetar's exist while they have a \
                               producer or a consumer; a partitioned one can be created)"
        }
        (_, ["internalStats"]) => "internalStats of a non-persistent topic (it has no ledgers or cursors)",
        (_, ["lastMessageId"]) => "lastMessageId of a non-persistent topic (it keeps no messages)",
        (_, ["subscription", ..]) => {
            "subscription administration on a non-persistent topic (its subscriptions keep no cursor: they \
             exist while they have consumers)"
        }
        _ => return None,
    };
    Some(format!("{why} is not supported by Magnetar"))
}

/// A namespace's topics of `domain` (`persistent` or `non-persistent`) as
/// Pulsar lists them: (non-partitioned topics and every partition,
/// partitioned topics by their own name).
async fn namespace_topics(
    state: &State,
    domain: &str,
    namespace: &str,
) -> Result<(Vec<String>, Vec<String>), Response<Body>> {
    let names =
        match admin(state, AdminRequest::ListTopics { namespace: namespace.to_string(), after: None, limit: None })
            .await?
        {
            AdminReply::Names(n) => n,
            other => return Err(unexpected(other)),
        };
    let prefix = format!("{domain}://");
    let mut topics = Vec::new();
    let mut partitioned = Vec::new();
    for name in names.into_iter().filter(|n| n.starts_with(&prefix)) {
        if is_partition(&name) {
            topics.push(name);
            continue;
        }
        let tn = match TopicName::parse(&name) {
            Ok(tn) => tn,
            Err(_) => continue,
        };
        match partitions_of(state, &tn).await? {
            0 => topics.push(name),
            n => {
                topics.extend((0..n).map(|i| format!("{name}-partition-{i}")));
                partitioned.push(name);
            }
        }
    }
    topics.sort();
    topics.dedup();
    Ok((topics, partitioned))
}

/// `NAME-partition-N`.
fn is_partition(name: &str) -> bool {
    name.rsplit_once("-partition-").is_some_and(|(_, i)| i.parse::<u32>().is_ok())
}

async fn topic_stats(state: &State, topic: &str) -> Result<TopicStats, Response<Body>> {
    topic_stats_or(state, topic, false).await
}

/// With `unused_is_empty`, a topic never created (a partition nobody used
/// yet, which Pulsar would have created with its partitioned topic) has
/// empty statistics rather than none.
async fn topic_stats_or(state: &State, topic: &str, unused_is_empty: bool) -> Result<TopicStats, Response<Body>> {
    let name = topic.to_string();
    let principal = state.principal.clone();
    match state.call(0, |reply| ShardCall::TopicStats { topic: name, principal, reply }).await {
        Ok(Ok(s)) => Ok(s),
        Ok(Err(e)) if unused_is_empty && e.code == ErrorCode::TopicNotFound => Ok(TopicStats {
            topic: topic.to_string(),
            next_entry: 0,
            ledgers: Vec::new(),
            msg_rate_in: 0.0,
            byte_rate_in: 0.0,
            subscriptions: Vec::new(),
        }),
        Ok(Err(e)) => Err(core_error(e)),
        Err(e @ CallError::Unavailable(_)) => Err(e.response()),
    }
}

fn id_json(id: &MessageId) -> Value {
    json!({ "ledgerId": id.ledger, "entryId": id.entry, "partitionIndex": id.partition })
}

async fn partitions_of(state: &State, topic: &TopicName) -> Result<u32, Response<Body>> {
    match admin(state, AdminRequest::PartitionedMetadata { topic: topic.clone() }).await? {
        AdminReply::Partitions(n) => Ok(n),
        other => Err(unexpected(other)),
    }
}

async fn body_partitions(state: &State, req: Request<Incoming>) -> Result<u32, Response<Body>> {
    let body = body_json(state, req).await?;
    match u32_of("the body (partitions)", &body)? {
        0 => Err(error(StatusCode::NOT_ACCEPTABLE, "Number of partitions should be more than 0")),
        n => Ok(n),
    }
}

/// `/persistent/{tenant}/{namespace}/{topic}/...` and
/// `/non-persistent/...` (less [`non_persistent_unsupported`]).
async fn topic_op(
    state: &State,
    req: Request<Incoming>,
    method: &Method,
    topic: TopicName,
    rest: &[&str],
) -> Response<Body> {
    match (method, rest) {
        (&Method::PUT, []) => done(state, AdminRequest::CreateTopic { topic }).await,
        (&Method::DELETE, []) | (&Method::DELETE, ["partitions"]) => {
            done(state, AdminRequest::DeleteTopic { topic }).await
        }
        (&Method::PUT, ["partitions"]) => match body_partitions(state, req).await {
            Ok(partitions) => done(state, AdminRequest::CreatePartitionedTopic { topic, partitions }).await,
            Err(r) => r,
        },
        (&Method::POST, ["partitions"]) => match body_partitions(state, req).await {
            Ok(partitions) => done(state, AdminRequest::UpdatePartitionedTopic { topic, partitions }).await,
            Err(r) => r,
        },
        (&Method::GET, ["partitions"]) => match partitions_of(state, &topic).await {
            Ok(n) => json(StatusCode::OK, &json!({ "partitions": n })),
            Err(r) => r,
        },
        (&Method::GET, ["stats"]) => match topic_stats(state, &topic.to_string()).await {
            Ok(s) => json(StatusCode::OK, &stats_json(&s)),
            Err(r) => r,
        },
        (&Method::GET, ["partitioned-stats"]) => {
            let n = match partitions_of(state, &topic).await {
                Ok(0) => return error(StatusCode::NOT_FOUND, "Partitioned Topic not found"),
                Ok(n) => n,
                Err(r) => return r,
            };
            let mut parts = Vec::with_capacity(n as usize);
            for i in 0..n {
                let name = format!("{topic}-partition-{i}");
                match topic_stats_or(state, &name, true).await {
                    Ok(s) => parts.push(s),
                    Err(r) => return r,
                }
            }
            json(StatusCode::OK, &partitioned_stats_json(n, &parts))
        }
        (&Method::GET, ["internalStats"]) => match topic_stats(state, &topic.to_string()).await {
            Ok(s) => json(StatusCode::OK, &internal_stats_json(&s)),
            Err(r) => r,
        },
        (&Method::GET, ["lastMessageId"]) => match admin(state, AdminRequest::LastMessageId { topic }).await {
            Ok(AdminReply::LastMessageId(LastMessageId::Topic(Some(id)))) => json(StatusCode::OK, &id_json(&id)),
            Ok(AdminReply::LastMessageId(LastMessageId::Topic(None))) => {
                json(StatusCode::OK, &json!({ "ledgerId": -1, "entryId": -1, "partitionIndex": -1 }))
            }
            Ok(AdminReply::LastMessageId(LastMessageId::Partitioned(_))) => {
                error(StatusCode::METHOD_NOT_ALLOWED, "GetLastMessageId on a partitioned topic is not allowed")
            }
            Ok(other) => unexpected(other),
            Err(r) => r,
        },
        (&Method::GET, ["subscriptions"]) => match topic_stats(state, &topic.to_string()).await {
            Ok(s) => json(StatusCode::OK, &json!(s.subscriptions.iter().map(|x| &x.name).collect::<Vec<_>>())),
            Err(r) => r,
        },
        (_, ["subscription", rest @ ..]) => subscription::handle(state, req, method, topic, rest).await,
        _ => not_supported(&format!("{method} on a topic's {:?}", rest.join("/"))),
    }
}

/// Pulsar's `TopicStats` for what Magnetar counts.
fn stats_json(s: &TopicStats) -> Value {
    let storage: u64 = s.ledgers.iter().map(|l| l.bytes).sum();
    let mut subs = serde_json::Map::new();
    let (mut rate_out, mut tput_out) = (0.0, 0.0);
    let mut backlog_bytes = 0;
    for sub in &s.subscriptions {
        rate_out += sub.msg_rate_out;
        tput_out += sub.byte_rate_out;
        backlog_bytes += sub.backlog_bytes;
        let consumers: Vec<Value> = sub
            .consumers
            .iter()
            .map(|c| {
                json!({
                    "consumerName": c.name,
                    "address": c.address,
                    // Magnetar's: messages sent to it again since it attached.
                    "redeliveredMessages": c.redelivered,
                    "availablePermits": c.permits,
                    "unackedMessages": c.unacked,
                    "priorityLevel": c.priority,
                    "isActive": c.active,
                })
            })
            .collect();
        subs.insert(
            sub.name.clone(),
            json!({
                "msgRateOut": sub.msg_rate_out,
                "msgThroughputOut": sub.byte_rate_out,
                "msgBacklog": sub.backlog_messages,
                "backlogSize": sub.backlog_bytes,
                "unackedMessages": sub.unacked,
                "msgDelayed": sub.delayed,
                "type": format!("{:?}", sub.sub_type),
                "isDurable": sub.durable,
                "consumers": consumers,
            }),
        );
    }
    json!({
        "msgRateIn": s.msg_rate_in,
        "msgThroughputIn": s.byte_rate_in,
        "msgRateOut": rate_out,
        "msgThroughputOut": tput_out,
        "storageSize": storage,
        "backlogSize": backlog_bytes,
        "publishers": [],
        "subscriptions": subs,
    })
}

fn partitioned_stats_json(n: u32, parts: &[TopicStats]) -> Value {
    let mut total = json!({
        "msgRateIn": parts.iter().map(|p| p.msg_rate_in).sum::<f64>(),
        "msgThroughputIn": parts.iter().map(|p| p.byte_rate_in).sum::<f64>(),
        "msgRateOut": parts.iter().flat_map(|p| p.subscriptions.iter().map(|s| s.msg_rate_out)).sum::<f64>(),
        "msgThroughputOut": parts.iter().flat_map(|p| p.subscriptions.iter().map(|s| s.byte_rate_out)).sum::<f64>(),
        "storageSize": parts.iter().flat_map(|p| p.ledgers.iter().map(|l| l.bytes)).sum::<u64>(),
        "metadata": { "partitions": n },
    });
    let per: serde_json::Map<String, Value> = parts.iter().map(|p| (p.topic.clone(), stats_json(p))).collect();
    total["partitions"] = Value::Object(per);
    total
}

/// Pulsar's `PersistentTopicInternalStats` for what Magnetar has: ledgers
/// and entry counts; cursors by their ack floor (a topic position).
fn internal_stats_json(s: &TopicStats) -> Value {
    let entries: u64 = s.ledgers.iter().map(|l| l.entries).sum();
    let size: u64 = s.ledgers.iter().map(|l| l.bytes).sum();
    let current = s.ledgers.last();
    let last_confirmed = current
        .filter(|l| l.entries > 0)
        .map_or_else(|| "-1:-1".to_string(), |l| format!("{}:{}", l.ledger, l.entries - 1));
    let ledgers: Vec<Value> =
        s.ledgers.iter().map(|l| json!({ "ledgerId": l.ledger, "entries": l.entries, "size": l.bytes })).collect();
    let cursors: serde_json::Map<String, Value> = s
        .subscriptions
        .iter()
        .map(|c| {
            (
                c.name.clone(),
                json!({ "messagesConsumedCounter": c.msg_out_total, "numberOfEntriesSinceFirstNotAckedMessage": c.msg_backlog }),
            )
        })
        .collect();
    json!({
        "entriesAddedCounter": s.next_entry,
        "numberOfEntries": entries,
        "totalSize": size,
        "currentLedgerEntries": current.map_or(0, |l| l.entries),
        "currentLedgerSize": current.map_or(0, |l| l.bytes),
        "lastConfirmedEntry": last_confirmed,
        "ledgers": ledgers,
        "cursors": cursors,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_split_the_hash_range_as_pulsar_writes_it() {
        let v = bundles_json(4);
        assert_eq!(v["numBundles"], 4);
        assert_eq!(v["boundaries"], json!(["0x00000000", "0x40000000", "0x80000000", "0xc0000000", "0xffffffff"]));
    }

    #[test]
    fn partition_names_are_recognized() {
        assert!(is_partition("persistent://a/b/p-partition-0"));
        assert!(!is_partition("persistent://a/b/p-partition-x"));
        assert!(!is_partition("persistent://a/b/p"));
    }

    #[test]
    fn core_errors_map_to_pulsars_statuses() {
        let e = |c| CoreError::new(c, "x");
        assert_eq!(status_of(&e(ErrorCode::TopicNotFound)), StatusCode::NOT_FOUND);
        assert_eq!(status_of(&e(ErrorCode::NotAllowed)), StatusCode::CONFLICT);
        assert_eq!(status_of(&e(ErrorCode::InvalidTopicName)), StatusCode::PRECONDITION_FAILED);
        assert_eq!(status_of(&e(ErrorCode::AuthenticationError)), StatusCode::UNAUTHORIZED);
        assert_eq!(status_of(&e(ErrorCode::AuthorizationError)), StatusCode::FORBIDDEN);
    }
}
