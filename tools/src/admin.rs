//! `magnetar admin`: tenants, namespaces (and their policies) and topics,
//! over the native protocol's `AdminRequest`; and `magnetar admin
//! subscriptions stats TOPIC` (issue #4, wire `TopicStats`): the topic's
//! per-subscription statistics as one pretty-printed JSON document
//! (`docs/semantics.md`).
//!
//! Output contract (relied on by scripts): `list` commands print one name a
//! line; `get`/`policies`/`lookup` commands print one JSON document on one
//! line; commands that change something print nothing. Errors go to stderr
//! with a non-zero exit status.
//!
//! `magnetar admin subscriptions create|delete|skip|clear-backlog|
//! reset-cursor|expire|peek TOPIC SUB …` (issue #21): an operator's changes
//! to a subscription (`docs/operations.md`); `peek` prints one JSON object
//! a line, as `messages find` does, the others print nothing.
//!
//! `magnetar admin messages find TOPIC --key K [--before T] [--limit N]`
//! (issue #3): the newest messages with key K (all partitions of a
//! partitioned topic), newest first, found through the broker's key index
//! without scanning the log. T is a publish time: milliseconds since the
//! epoch or RFC 3339 in UTC (`2026-11-30T03:00:00Z`); only messages
//! published before it. N defaults to 10 (at most 1,000). One JSON object a
//! line: `{"id":"L:E:P:B","key":…,"properties":{…},"publish_time_ms":…,
//! "payload_size":…,"payload":"…","topic":…}`, with `"payload_base64"`
//! instead of `"payload"` when the payload is not UTF-8 (as `consume
//! --output jsonl`); B is -1 for a message that is not in a batch. A
//! compressed batch is one line for the whole entry with `"compression"` and
//! `"batch_messages"` (the broker never decompresses). If the answer was cut
//! at its 4 MiB payload bound, stderr says so.

use crate::broker::BrokerArgs;
use magnetar_client::normalize_topic;
use serde_json::{json, Value};
use std::error::Error;

#[derive(clap::Args, Debug)]
pub struct AdminArgs {
    #[command(flatten)]
    pub broker: BrokerArgs,

    #[command(subcommand)]
    pub command: AdminCmd,
}

#[derive(clap::Subcommand, Debug)]
pub enum AdminCmd {
    /// Tenants: list, create, get, delete.
    #[command(subcommand)]
    Tenants(TenantsCmd),
    /// Namespaces and their policies.
    #[command(subcommand)]
    Namespaces(NamespacesCmd),
    /// Topics: partitioned and not.
    #[command(subcommand)]
    Topics(TopicsCmd),
    /// Subscriptions of a topic.
    #[command(subcommand)]
    Subscriptions(SubscriptionsCmd),
    #[command(subcommand)]
    Messages(MessagesCmd),
    /// The broker itself.
    #[command(subcommand)]
    Broker(BrokerCmd),
}

#[derive(clap::Subcommand, Debug)]
pub enum BrokerCmd {
    /// Per shard: its own port and the producer/consumer requests and
    /// deliveries it sent to another shard (JSON).
    ShardStats,
}

#[derive(clap::Subcommand, Debug)]
pub enum MessagesCmd {
    /// The newest messages with a key (see the module docs for the output).
    Find {
        topic: String,
        #[arg(long)]
        key: String,
        /// Only messages published before this time: ms since the epoch or
        /// RFC 3339 in UTC.
        #[arg(long, value_parser = parse_time_ms)]
        before: Option<u64>,
        #[arg(long, default_value_t = 10)]
        limit: u32,
    },
}

/// Milliseconds since the epoch, or an RFC 3339 time in UTC.
fn parse_time_ms(s: &str) -> Result<u64, String> {
    if let Ok(ms) = s.parse::<u64>() {
        return Ok(ms);
    }
    let t = humantime::parse_rfc3339(s)
        .map_err(|e| format!("{s:?} is neither milliseconds since the epoch nor RFC 3339 in UTC: {e}"))?;
    let d = t.duration_since(std::time::UNIX_EPOCH).map_err(|_| format!("{s:?} is before 1970"))?;
    u64::try_from(d.as_millis()).map_err(|_| format!("{s:?} is too far in the future"))
}

#[derive(clap::Subcommand, Debug)]
pub enum SubscriptionsCmd {
    /// Per-subscription statistics: backlog, unacked, delayed, consumers.
    Stats {
        /// Topic: `persistent://tenant/ns/topic`, `tenant/ns/topic`, or `topic`.
        topic: String,
    },
    /// Move the subscription past the damaged entry it waits at (one that
    /// fails its checksum on the broker's disk, which consumers are told
    /// about): the entry counts as acknowledged for this subscription. An
    /// entry that reads back intact is not skipped. For a partitioned
    /// topic, name the partition (`TOPIC-partition-N`). Prints the skipped
    /// entry's id to stderr.
    SkipDamaged {
        /// Topic: `persistent://tenant/ns/topic`, `tenant/ns/topic`, or `topic`.
        topic: String,
        subscription: String,
    },
    /// Create a durable subscription with its cursor at a position (a
    /// partitioned topic: on every partition).
    Create {
        topic: String,
        subscription: String,
        /// `latest`, `earliest`, or a message id `L:E[:P[:B]]` (the next
        /// message delivered).
        #[arg(long, default_value = "latest")]
        message_id: String,
    },
    /// Delete a subscription and its cursor. Refused while consumers are
    /// connected, unless `--force` (which closes them).
    Delete {
        topic: String,
        subscription: String,
        #[arg(long)]
        force: bool,
    },
    /// Acknowledge the next N unacknowledged entries (a batch is one).
    Skip {
        topic: String,
        subscription: String,
        #[arg(long)]
        count: u64,
    },
    /// Acknowledge every stored message (skip all).
    ClearBacklog { topic: String, subscription: String },
    /// Move the cursor: the next message delivered is the first published
    /// at or after a time, or the given message. Connected consumers are
    /// closed and receive from the new position when they subscribe again.
    #[command(group(clap::ArgGroup::new("target").required(true).args(["time", "relative", "message_id"])))]
    ResetCursor {
        topic: String,
        subscription: String,
        /// A publish time: RFC 3339 in UTC (`2026-11-30T03:00:00Z`) or
        /// milliseconds since the epoch.
        #[arg(long, value_parser = parse_time_ms)]
        time: Option<u64>,
        /// This long before now (`10m`, `1h 30m`, `2d`).
        #[arg(long, value_parser = humantime::parse_duration)]
        relative: Option<std::time::Duration>,
        /// `L:E[:P[:B]]`.
        #[arg(long)]
        message_id: Option<String>,
    },
    /// Acknowledge every message published more than T seconds ago.
    Expire {
        topic: String,
        subscription: String,
        #[arg(long)]
        expiry_s: u64,
    },
    /// Show the next N messages the subscription would deliver (one JSON
    /// object a line, as `messages find`), without changing anything. Not
    /// for a partitioned topic's name: name the partition.
    Peek {
        topic: String,
        subscription: String,
        #[arg(long, default_value_t = 1)]
        count: u32,
    },
}

/// A message id as the CLI takes it, `L:E[:P[:B]]`, in the broker's full
/// `L:E:P:B` form (P and B default to -1).
fn full_message_id(s: &str) -> Result<String, String> {
    let parts: Vec<&str> = s.split(':').collect();
    if !(2..=4).contains(&parts.len()) {
        return Err(format!("{s:?} is not a message id LEDGER:ENTRY[:PARTITION[:BATCH_INDEX]]"));
    }
    let mut full: Vec<String> = parts.iter().map(|p| p.to_string()).collect();
    full.resize(4, "-1".to_string());
    let id = full.join(":");
    id.parse::<magnetar_wire::MessageId>().map_err(|e| e.to_string())?;
    Ok(id)
}

#[derive(clap::Subcommand, Debug)]
pub enum TenantsCmd {
    List,
    Create {
        tenant: String,
        /// Roles that administer the tenant (its namespaces, policies,
        /// permissions and topics), comma-separated.
        #[arg(long, value_delimiter = ',')]
        admin_roles: Vec<String>,
    },
    Get {
        tenant: String,
    },
    /// Delete a tenant without namespaces.
    Delete {
        tenant: String,
    },
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnOff {
    On,
    Off,
}

impl OnOff {
    fn on(self) -> bool {
        self == OnOff::On
    }
}

#[derive(clap::Subcommand, Debug)]
pub enum NamespacesCmd {
    /// Namespaces of a tenant.
    List { tenant: String },
    /// Create TENANT/NS.
    Create {
        namespace: String,
        /// Bundles of the namespace's hash ring (fixed at creation).
        #[arg(long)]
        bundles: Option<u32>,
    },
    /// Delete a namespace without topics.
    Delete { namespace: String },
    /// Print the namespace's policies (JSON).
    Policies { namespace: String },
    /// Retention of acknowledged messages (-1 = unbounded).
    SetRetention {
        namespace: String,
        #[arg(long, allow_hyphen_values = true)]
        minutes: i64,
        #[arg(long, allow_hyphen_values = true)]
        size_mb: i64,
    },
    /// Message TTL in seconds (0 = none).
    SetMessageTtl { namespace: String, seconds: u64 },
    /// Broker-side deduplication.
    SetDeduplication { namespace: String, state: OnOff },
    /// Producers per topic (0 = unlimited).
    SetMaxProducers { namespace: String, max: u32 },
    /// Consumers per topic (0 = unlimited).
    SetMaxConsumers { namespace: String, max: u32 },
    /// Automatic topic creation; `--default-partitions N` makes new topics partitioned.
    SetAutoTopicCreation {
        namespace: String,
        state: OnOff,
        #[arg(long)]
        default_partitions: Option<u32>,
    },
    /// Set any policy fields from a JSON object, e.g. '{"max_producers_per_topic":2}'.
    SetPolicies { namespace: String, json: String },
    /// Grant a role actions on every topic of the namespace.
    GrantPermission {
        namespace: String,
        #[arg(long)]
        role: String,
        /// Comma-separated: produce, consume.
        #[arg(long, value_delimiter = ',', required = true)]
        actions: Vec<String>,
    },
    /// Remove every grant of a role on the namespace.
    RevokePermission {
        namespace: String,
        #[arg(long)]
        role: String,
    },
    /// Print the namespace's grants: `{"ROLE":["consume","produce"],…}`.
    Permissions { namespace: String },
}

#[derive(clap::Subcommand, Debug)]
pub enum TopicsCmd {
    /// Topics of TENANT/NS (partitioned topics and their partitions
    /// included), sorted, one per line; asked for a page at a time.
    List {
        namespace: String,
        /// Only the topics whose full name sorts after NAME (to resume a
        /// listing where an earlier one stopped).
        #[arg(long, value_name = "NAME")]
        after: Option<String>,
        /// At most N topics.
        #[arg(long, value_name = "N")]
        limit: Option<u64>,
    },
    /// Create a non-partitioned topic.
    Create { topic: String },
    /// Create a partitioned topic with N partitions.
    CreatePartitioned {
        topic: String,
        #[arg(long, short = 'p')]
        partitions: u32,
    },
    /// Grow a partitioned topic to N partitions.
    UpdatePartitioned {
        topic: String,
        #[arg(long, short = 'p')]
        partitions: u32,
    },
    /// Print `{"partitions":N}` (0: not partitioned).
    GetPartitionedMetadata { topic: String },
    /// Delete a topic (a partitioned one with all its partitions).
    Delete { topic: String },
    /// Which broker and shard own the topic (JSON).
    Lookup { topic: String },
    /// The shard owning exactly this topic name, and its port (JSON).
    Owner { topic: String },
    /// The id of the topic's last stored entry: `{"id":"L:E:P:-1"}` (or
    /// null), per partition for a partitioned topic.
    LastMessageId { topic: String },
    /// Retention of the topic's acknowledged messages, overriding its
    /// namespace's (-1 = unbounded). A partitioned topic: all partitions.
    SetRetention {
        topic: String,
        /// Keep acknowledged ledgers closed less than this long ago (minutes).
        #[arg(long, visible_alias = "minutes", allow_hyphen_values = true)]
        time_minutes: i64,
        /// Keep at most this much acknowledged data (MiB).
        #[arg(long, allow_hyphen_values = true)]
        size_mb: i64,
    },
    /// Print the topic's retention override (JSON; null: the namespace's applies).
    GetRetention { topic: String },
    /// Remove the topic's retention override (the namespace's applies again).
    RemoveRetention { topic: String },
    /// Message TTL of the topic, overriding its namespace's (0 = none).
    SetMessageTtl {
        topic: String,
        /// Unacknowledged messages older than this (seconds) expire.
        #[arg(long)]
        ttl_s: u64,
    },
    /// Print the topic's TTL override (JSON; null: the namespace's applies).
    GetMessageTtl { topic: String },
    /// Remove the topic's TTL override (the namespace's applies again).
    RemoveMessageTtl { topic: String },
    /// Grant a role actions on this topic (a partitioned one: all partitions).
    GrantPermission {
        topic: String,
        #[arg(long)]
        role: String,
        /// Comma-separated: produce, consume.
        #[arg(long, value_delimiter = ',', required = true)]
        actions: Vec<String>,
    },
    /// Remove every grant of a role on this topic.
    RevokePermission {
        topic: String,
        #[arg(long)]
        role: String,
    },
    /// Print the topic's own grants (not its namespace's): `{"ROLE":[…],…}`.
    Permissions { topic: String },
}

pub fn run(args: AdminArgs) -> Result<(), Box<dyn Error>> {
    crate::broker::block_on(admin(args))
}

enum Print {
    Nothing,
    Lines,
    Json,
}

fn topic(t: &str) -> Result<String, Box<dyn Error>> {
    Ok(normalize_topic(t)?)
}

async fn admin(args: AdminArgs) -> Result<(), Box<dyn Error>> {
    let (op, body, print) = match args.command {
        AdminCmd::Topics(TopicsCmd::List { namespace, after, limit }) => {
            let client = args.broker.connect().await?;
            let listed = list_topics(&client.admin(), &namespace, after, limit).await;
            client.close();
            return listed;
        }
        AdminCmd::Subscriptions(SubscriptionsCmd::Stats { topic }) => {
            let client = args.broker.connect().await?;
            let json = client.topic_stats(&topic).await;
            client.close();
            // Pretty-printed for people; still one JSON document for scripts.
            let value: serde_json::Value = serde_json::from_str(&json?)?;
            println!("{}", serde_json::to_string_pretty(&value)?);
            return Ok(());
        }
        AdminCmd::Subscriptions(SubscriptionsCmd::SkipDamaged { topic: t, subscription }) => {
            let client = args.broker.connect().await?;
            let answer = client
                .admin()
                .call("subscriptions.skip-damaged", json!({ "topic": topic(&t)?, "subscription": subscription }))
                .await;
            client.close();
            let answer = answer?;
            eprintln!(
                "subscription {subscription:?} of {t} moved past damaged entry {}",
                answer["skipped"].as_str().unwrap_or("?")
            );
            return Ok(());
        }
        AdminCmd::Subscriptions(SubscriptionsCmd::Peek { topic: t, subscription, count }) => {
            let client = args.broker.connect().await?;
            let body = json!({ "topic": topic(&t)?, "subscription": subscription, "count": count });
            let answer = client.admin().call("subscriptions.peek", body).await;
            client.close();
            let answer = answer?;
            for m in answer["messages"].as_array().map(Vec::as_slice).unwrap_or_default() {
                println!("{}", found_line(m));
            }
            if answer["truncated"].as_bool() == Some(true) {
                eprintln!("answer cut at the broker's payload bound; ask with a smaller --count");
            }
            return Ok(());
        }
        AdminCmd::Subscriptions(c) => {
            let body = |t: &str, sub: &str| -> Result<Value, Box<dyn Error>> {
                Ok(json!({ "topic": topic(t)?, "subscription": sub }))
            };
            let (op, body) = match c {
                SubscriptionsCmd::Create { topic: t, subscription, message_id } => {
                    let mut b = body(&t, &subscription)?;
                    b["position"] = match message_id.as_str() {
                        "latest" | "earliest" => json!(message_id),
                        id => json!(full_message_id(id)?),
                    };
                    ("subscriptions.create", b)
                }
                SubscriptionsCmd::Delete { topic: t, subscription, force } => {
                    let mut b = body(&t, &subscription)?;
                    b["force"] = json!(force);
                    ("subscriptions.delete", b)
                }
                SubscriptionsCmd::Skip { topic: t, subscription, count } => {
                    let mut b = body(&t, &subscription)?;
                    b["count"] = json!(count);
                    ("subscriptions.skip", b)
                }
                SubscriptionsCmd::ClearBacklog { topic: t, subscription } => {
                    ("subscriptions.clear-backlog", body(&t, &subscription)?)
                }
                SubscriptionsCmd::ResetCursor { topic: t, subscription, time, relative, message_id } => {
                    let mut b = body(&t, &subscription)?;
                    match (time, relative, message_id) {
                        (Some(ms), _, _) => b["time_ms"] = json!(ms),
                        (_, Some(ago), _) => {
                            let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
                            b["time_ms"] = json!(now.saturating_sub(ago).as_millis() as u64);
                        }
                        (_, _, Some(id)) => b["message_id"] = json!(full_message_id(&id)?),
                        _ => return Err("give --time, --relative or --message-id".into()),
                    }
                    ("subscriptions.reset-cursor", b)
                }
                SubscriptionsCmd::Expire { topic: t, subscription, expiry_s } => {
                    let mut b = body(&t, &subscription)?;
                    b["expiry_s"] = json!(expiry_s);
                    ("subscriptions.expire", b)
                }
                SubscriptionsCmd::Stats { .. }
                | SubscriptionsCmd::SkipDamaged { .. }
                | SubscriptionsCmd::Peek { .. } => {
                    unreachable!("handled above")
                }
            };
            (op, body, Print::Nothing)
        }
        AdminCmd::Messages(MessagesCmd::Find { topic: t, key, before, limit }) => {
            let client = args.broker.connect().await?;
            let answer = client
                .admin()
                .call("messages.find", json!({ "topic": topic(&t)?, "key": key, "before_ms": before, "limit": limit }))
                .await;
            client.close();
            let answer = answer?;
            for m in answer["messages"].as_array().map(Vec::as_slice).unwrap_or_default() {
                println!("{}", found_line(m));
            }
            if answer["truncated"].as_bool() == Some(true) {
                eprintln!(
                    "answer cut at the broker's payload bound; ask with a smaller --limit or an earlier --before"
                );
            }
            return Ok(());
        }
        AdminCmd::Tenants(c) => match c {
            TenantsCmd::List => ("tenants.list", json!({}), Print::Lines),
            TenantsCmd::Create { tenant, admin_roles } => {
                ("tenants.create", json!({ "tenant": tenant, "admin_roles": admin_roles }), Print::Nothing)
            }
            TenantsCmd::Get { tenant } => ("tenants.get", json!({ "tenant": tenant }), Print::Json),
            TenantsCmd::Delete { tenant } => ("tenants.delete", json!({ "tenant": tenant }), Print::Nothing),
        },
        AdminCmd::Namespaces(c) => {
            let set = |ns: String, policies: Value| {
                ("namespaces.set-policies", json!({ "namespace": ns, "policies": policies }), Print::Nothing)
            };
            match c {
                NamespacesCmd::List { tenant } => ("namespaces.list", json!({ "tenant": tenant }), Print::Lines),
                NamespacesCmd::Create { namespace, bundles } => {
                    let policies = match bundles {
                        Some(b) => json!({ "bundles": b }),
                        None => json!({}),
                    };
                    ("namespaces.create", json!({ "namespace": namespace, "policies": policies }), Print::Nothing)
                }
                NamespacesCmd::Delete { namespace } => {
                    ("namespaces.delete", json!({ "namespace": namespace }), Print::Nothing)
                }
                NamespacesCmd::Policies { namespace } => {
                    ("namespaces.policies", json!({ "namespace": namespace }), Print::Json)
                }
                NamespacesCmd::SetRetention { namespace, minutes, size_mb } => {
                    set(namespace, json!({ "retention_minutes": minutes, "retention_size_mb": size_mb }))
                }
                NamespacesCmd::SetMessageTtl { namespace, seconds } => {
                    set(namespace, json!({ "message_ttl_seconds": seconds }))
                }
                NamespacesCmd::SetDeduplication { namespace, state } => {
                    set(namespace, json!({ "deduplication": state.on() }))
                }
                NamespacesCmd::SetMaxProducers { namespace, max } => {
                    set(namespace, json!({ "max_producers_per_topic": max }))
                }
                NamespacesCmd::SetMaxConsumers { namespace, max } => {
                    set(namespace, json!({ "max_consumers_per_topic": max }))
                }
                NamespacesCmd::SetAutoTopicCreation { namespace, state, default_partitions } => {
                    let mut p = json!({ "auto_topic_creation": state.on() });
                    if let Some(n) = default_partitions {
                        p["default_partitions"] = json!(n);
                    }
                    set(namespace, p)
                }
                NamespacesCmd::SetPolicies { namespace, json } => {
                    let policies: Value =
                        serde_json::from_str(&json).map_err(|e| format!("policies are not JSON: {e}"))?;
                    set(namespace, policies)
                }
                NamespacesCmd::GrantPermission { namespace, role, actions } => (
                    "namespaces.grant-permission",
                    json!({ "namespace": namespace, "role": role, "actions": actions }),
                    Print::Nothing,
                ),
                NamespacesCmd::RevokePermission { namespace, role } => {
                    ("namespaces.revoke-permission", json!({ "namespace": namespace, "role": role }), Print::Nothing)
                }
                NamespacesCmd::Permissions { namespace } => {
                    ("namespaces.permissions", json!({ "namespace": namespace }), Print::Json)
                }
            }
        }
        AdminCmd::Broker(BrokerCmd::ShardStats) => ("broker.shard-stats", json!({}), Print::Json),
        AdminCmd::Topics(c) => match c {
            TopicsCmd::List { .. } => unreachable!("listed above"),
            TopicsCmd::Create { topic: t } => ("topics.create", json!({ "topic": topic(&t)? }), Print::Nothing),
            TopicsCmd::CreatePartitioned { topic: t, partitions } => {
                ("topics.create-partitioned", json!({ "topic": topic(&t)?, "partitions": partitions }), Print::Nothing)
            }
            TopicsCmd::UpdatePartitioned { topic: t, partitions } => {
                ("topics.update-partitioned", json!({ "topic": topic(&t)?, "partitions": partitions }), Print::Nothing)
            }
            TopicsCmd::GetPartitionedMetadata { topic: t } => {
                ("topics.partitioned-metadata", json!({ "topic": topic(&t)? }), Print::Json)
            }
            TopicsCmd::Delete { topic: t } => ("topics.delete", json!({ "topic": topic(&t)? }), Print::Nothing),
            TopicsCmd::Lookup { topic: t } => ("topics.lookup", json!({ "topic": topic(&t)? }), Print::Json),
            TopicsCmd::Owner { topic: t } => ("topics.owner", json!({ "topic": topic(&t)? }), Print::Json),
            TopicsCmd::LastMessageId { topic: t } => {
                ("topics.last-message-id", json!({ "topic": topic(&t)? }), Print::Json)
            }
            TopicsCmd::SetRetention { topic: t, time_minutes, size_mb } => (
                "topics.set-retention",
                json!({ "topic": topic(&t)?, "retention_minutes": time_minutes, "retention_size_mb": size_mb }),
                Print::Nothing,
            ),
            TopicsCmd::GetRetention { topic: t } => {
                ("topics.get-retention", json!({ "topic": topic(&t)? }), Print::Json)
            }
            TopicsCmd::RemoveRetention { topic: t } => {
                ("topics.remove-retention", json!({ "topic": topic(&t)? }), Print::Nothing)
            }
            TopicsCmd::SetMessageTtl { topic: t, ttl_s } => {
                ("topics.set-message-ttl", json!({ "topic": topic(&t)?, "message_ttl_seconds": ttl_s }), Print::Nothing)
            }
            TopicsCmd::GetMessageTtl { topic: t } => {
                ("topics.get-message-ttl", json!({ "topic": topic(&t)? }), Print::Json)
            }
            TopicsCmd::RemoveMessageTtl { topic: t } => {
                ("topics.remove-message-ttl", json!({ "topic": topic(&t)? }), Print::Nothing)
            }
            TopicsCmd::GrantPermission { topic: t, role, actions } => (
                "topics.grant-permission",
                json!({ "topic": topic(&t)?, "role": role, "actions": actions }),
                Print::Nothing,
            ),
            TopicsCmd::RevokePermission { topic: t, role } => {
                ("topics.revoke-permission", json!({ "topic": topic(&t)?, "role": role }), Print::Nothing)
            }
            TopicsCmd::Permissions { topic: t } => ("topics.permissions", json!({ "topic": topic(&t)? }), Print::Json),
        },
    };
    let client = args.broker.connect().await?;
    let answer = client.admin().call(op, body).await;
    client.close();
    let answer = answer?;
    match print {
        Print::Nothing => {}
        Print::Json => println!("{answer}"),
        Print::Lines => {
            for v in answer.as_array().map(Vec::as_slice).unwrap_or_default() {
                println!("{}", v.as_str().unwrap_or_default());
            }
        }
    }
    Ok(())
}

/// `topics list`: pages of the namespace's topics printed as they come,
/// so a namespace of a million topics is never held whole.
async fn list_topics(
    admin: &magnetar_client::Admin,
    namespace: &str,
    mut after: Option<String>,
    limit: Option<u64>,
) -> Result<(), Box<dyn Error>> {
    use std::io::Write;
    let mut left = limit.unwrap_or(u64::MAX);
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    while left > 0 {
        let page = u32::try_from(left).unwrap_or(u32::MAX).min(magnetar_client::TOPICS_PAGE);
        let names = admin.list_topics_page(namespace, after.as_deref(), page).await?;
        for name in &names {
            writeln!(out, "{name}")?;
        }
        left -= names.len() as u64;
        if names.len() < page as usize {
            break;
        }
        after = names.into_iter().last();
    }
    out.flush()?;
    Ok(())
}

/// One output line of `messages find`, fields in contract order.
#[derive(serde::Serialize)]
struct FoundRecord<'a> {
    id: &'a Value,
    key: &'a Value,
    properties: &'a Value,
    publish_time_ms: &'a Value,
    payload_size: &'a Value,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_base64: Option<&'a str>,
    topic: &'a Value,
    #[serde(skip_serializing_if = "Value::is_null")]
    compression: &'a Value,
    #[serde(skip_serializing_if = "Value::is_null")]
    batch_messages: &'a Value,
}

/// The payload as text when it is UTF-8, else base64 (as the broker sent it).
fn found_line(m: &Value) -> String {
    use base64::Engine as _;
    let b64 = m["payload_base64"].as_str().unwrap_or_default();
    let bytes = base64::engine::general_purpose::STANDARD.decode(b64).unwrap_or_default();
    let (payload, payload_base64) = match String::from_utf8(bytes) {
        Ok(text) => (Some(text), None),
        Err(_) => (None, Some(b64)),
    };
    let r = FoundRecord {
        id: &m["id"],
        key: &m["key"],
        properties: &m["properties"],
        publish_time_ms: &m["publish_time_ms"],
        payload_size: &m["payload_size"],
        payload,
        payload_base64,
        topic: &m["topic"],
        compression: &m["compression"],
        batch_messages: &m["batch_messages"],
    };
    serde_json::to_string(&r).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn before_accepts_ms_and_rfc3339() {
        assert_eq!(parse_time_ms("1700000000123"), Ok(1_700_000_000_123));
        assert_eq!(parse_time_ms("2023-11-14T22:13:20Z"), Ok(1_700_000_000_000));
        assert_eq!(parse_time_ms("2023-11-14T22:13:20.5Z"), Ok(1_700_000_000_500));
        assert!(parse_time_ms("yesterday").is_err());
    }

    #[test]
    fn found_line_text_or_base64() {
        let m = json!({"id":"1:2:-1:-1","key":"k","properties":{"a":"b"},"publish_time_ms":5,"payload_size":2,
            "payload_base64":"aGk=","topic":"persistent://public/default/t"});
        assert_eq!(
            found_line(&m),
            r#"{"id":"1:2:-1:-1","key":"k","properties":{"a":"b"},"publish_time_ms":5,"payload_size":2,"payload":"hi","topic":"persistent://public/default/t"}"#
        );
        let m = json!({"id":"1:2:-1:-1","payload_base64":"/w==","payload_size":1});
        assert!(found_line(&m).contains(r#""payload_base64":"/w==""#));
    }
}
