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

use crate::produce::DEFAULT_URL;
use magnetar_client::{normalize_topic, Client};
use serde_json::{json, Value};
use std::error::Error;

#[derive(clap::Args, Debug)]
pub struct AdminArgs {
    /// Broker: `magnetar://HOST:PORT` or `HOST:PORT`.
    #[arg(long, default_value = DEFAULT_URL, global = true)]
    pub url: String,

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
}

#[derive(clap::Subcommand, Debug)]
pub enum SubscriptionsCmd {
    /// Per-subscription statistics: backlog, unacked, delayed, consumers.
    Stats {
        /// Topic: `persistent://tenant/ns/topic`, `tenant/ns/topic`, or `topic`.
        topic: String,
    },
}

#[derive(clap::Subcommand, Debug)]
pub enum TenantsCmd {
    List,
    Create {
        tenant: String,
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
}

#[derive(clap::Subcommand, Debug)]
pub enum TopicsCmd {
    /// Topics of TENANT/NS (partitioned topics and their partitions included).
    List { namespace: String },
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
}

pub fn run(args: AdminArgs) -> Result<(), Box<dyn Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(admin(args))
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
        AdminCmd::Subscriptions(SubscriptionsCmd::Stats { topic }) => {
            let client = Client::connect(&args.url).await?;
            let json = client.topic_stats(&topic).await;
            client.close();
            // Pretty-printed for people; still one JSON document for scripts.
            let value: serde_json::Value = serde_json::from_str(&json?)?;
            println!("{}", serde_json::to_string_pretty(&value)?);
            return Ok(());
        }
        AdminCmd::Tenants(c) => match c {
            TenantsCmd::List => ("tenants.list", json!({}), Print::Lines),
            TenantsCmd::Create { tenant } => ("tenants.create", json!({ "tenant": tenant }), Print::Nothing),
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
            }
        }
        AdminCmd::Topics(c) => match c {
            TopicsCmd::List { namespace } => ("topics.list", json!({ "namespace": namespace }), Print::Lines),
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
        },
    };
    let client = Client::connect(&args.url).await?;
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
