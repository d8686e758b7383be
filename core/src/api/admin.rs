//! Admin operations and their replies, as values: what a door asks
//! [`Broker::admin`](super::Broker::admin) for and what it gets back. A door
//! maps its own format onto these (the native door: op names with JSON
//! arguments, `net/src/native/admin.rs`); nothing here is JSON.
//!
//! Every request runs on shard 0, which owns the metadata store; requests
//! about a topic's data go on from there to the topic's owner.

use crate::authz::AuthAction;
use crate::metadata::{Permissions, Policies, TenantInfo, TopicRetention};
use crate::topic_name::TopicName;
use bytes::Bytes;
use magnetar_wire::{CompressionType, MessageId};
use std::collections::{BTreeMap, BTreeSet};

/// One admin operation with its arguments.
#[derive(Debug, Clone, PartialEq)]
pub enum AdminRequest {
    /// Answers [`AdminReply::Names`].
    ListTenants,
    CreateTenant {
        tenant: String,
        info: TenantInfo,
    },
    /// Answers [`AdminReply::Tenant`].
    GetTenant {
        tenant: String,
    },
    /// The tenant must have no namespaces.
    DeleteTenant {
        tenant: String,
    },
    /// Answers [`AdminReply::Names`] (`tenant/ns`).
    ListNamespaces {
        tenant: String,
    },
    /// `policies` apply on top of the defaults.
    CreateNamespace {
        namespace: String,
        policies: PolicyChange,
    },
    /// The namespace must have no topics.
    DeleteNamespace {
        namespace: String,
    },
    /// Answers [`AdminReply::Policies`].
    GetPolicies {
        namespace: String,
    },
    /// Only the given fields change; answers the new [`AdminReply::Policies`].
    SetPolicies {
        namespace: String,
        policies: PolicyChange,
    },
    /// A non-partitioned topic.
    CreateTopic {
        topic: TopicName,
    },
    CreatePartitionedTopic {
        topic: TopicName,
        partitions: u32,
    },
    /// Grow only.
    UpdatePartitionedTopic {
        topic: TopicName,
        partitions: u32,
    },
    /// Answers [`AdminReply::Partitions`] (0: not partitioned).
    PartitionedMetadata {
        topic: TopicName,
    },
    /// Answers [`AdminReply::Names`]: full names, partitions included,
    /// sorted; those after `after`, at most `limit` (a page; all without).
    ListTopics {
        namespace: String,
        after: Option<String>,
        limit: Option<u32>,
    },
    /// A partitioned topic deletes every partition.
    DeleteTopic {
        topic: TopicName,
    },
    /// Answers [`AdminReply::LastMessageId`].
    LastMessageId {
        topic: TopicName,
    },
    /// Answers [`AdminReply::Found`]: up to `limit` messages with key `key`,
    /// published before `before_ms` if given, newest first (all partitions
    /// of a partitioned topic).
    FindMessages {
        topic: TopicName,
        key: String,
        before_ms: Option<u64>,
        limit: u32,
    },
    /// Answers [`AdminReply::Lookup`]; may auto-create a partitioned topic's
    /// metadata, as in Pulsar.
    Lookup {
        topic: TopicName,
    },
    /// Answers [`AdminReply::Owner`]: the owner of exactly this name, with
    /// no side effects.
    Owner {
        topic: TopicName,
    },
    /// Answers [`AdminReply::ShardStats`].
    ShardStats,
    /// Topic-level overrides of the namespace's retention and TTL (see
    /// `topic_policies.rs`): the topic must exist.
    SetRetention {
        topic: TopicName,
        retention: TopicRetention,
    },
    /// Answers [`AdminReply::Retention`].
    GetRetention {
        topic: TopicName,
    },
    RemoveRetention {
        topic: TopicName,
    },
    /// 0 = no TTL for this topic, whatever the namespace says.
    SetMessageTtl {
        topic: TopicName,
        seconds: u64,
    },
    /// Answers [`AdminReply::MessageTtl`].
    GetMessageTtl {
        topic: TopicName,
    },
    RemoveMessageTtl {
        topic: TopicName,
    },
    /// Moves the subscription past the damaged entry it waits at (one that
    /// fails verification on disk and is never served); answers
    /// [`AdminReply::Skipped`]. An entry that reads back intact is not
    /// skipped (an error). Not for a partitioned topic's name: name the
    /// partition.
    SkipDamaged {
        topic: TopicName,
        subscription: String,
    },
    /// An operator's change to a subscription, or a look at its backlog
    /// ([`SubscriptionOp`]). A partitioned topic's name applies it to every
    /// partition (those nobody used yet are skipped, except by `Create`),
    /// as Pulsar does; `Peek` and `ResetCursor` to a message id name one
    /// partition instead. Answers [`AdminReply::Done`], or
    /// [`AdminReply::Found`] for `Peek`.
    Subscription {
        topic: TopicName,
        subscription: String,
        op: SubscriptionOp,
    },
    /// Adds `actions` to what `role` holds on `resource` (whose namespace
    /// must exist).
    GrantPermission {
        resource: PermissionResource,
        role: String,
        actions: BTreeSet<AuthAction>,
    },
    /// Removes every grant of `role` on `resource`.
    RevokePermission {
        resource: PermissionResource,
        role: String,
    },
    /// Answers [`AdminReply::Permissions`]: the grants on exactly this
    /// resource (not those inherited from its namespace).
    GetPermissions {
        resource: PermissionResource,
    },
}

/// What [`AdminRequest::Subscription`] does. Acknowledgement state stays
/// consistent with what consumers hold: entries a change acknowledges leave
/// their consumers' unacknowledged sets; a change that moves the cursor
/// back or forth (`ResetCursor`) first closes the connected consumers, as
/// Pulsar does, so they subscribe again and receive from the new position
/// rather than from what their client had queued. Durable subscriptions'
/// changes are on disk before the answer.
#[derive(Debug, Clone, PartialEq)]
pub enum SubscriptionOp {
    /// A durable subscription with its cursor at `at`; refused when it
    /// exists. The topic must exist (a partition of a partitioned topic is
    /// created).
    Create { at: SubscriptionStart },
    /// Refused while consumers are connected unless `force`, which closes
    /// them first. Its cursor and state records are erased.
    Delete { force: bool },
    /// Acknowledges the next `count` unacknowledged entries (a batch is one
    /// entry, as Pulsar's skip counts entries).
    Skip { count: u64 },
    /// Acknowledges every stored entry.
    ClearBacklog,
    /// Makes the target the next entry delivered: everything before it
    /// counts as acknowledged, nothing after it.
    ResetCursor { to: super::SeekTarget },
    /// Acknowledges every entry published more than `older_than_s` seconds
    /// ago (Pulsar's expiry: by publish time, assumed to grow with the
    /// position).
    Expire { older_than_s: u64 },
    /// The messages of the unacknowledged entries from the `position`-th
    /// (1 is the next one delivered; a batch's messages one by one), up to
    /// `count` messages (at most 1,000) and 4 MiB of payload. Changes
    /// nothing.
    Peek { position: u64, count: u32 },
    /// The `position`-th unacknowledged entry (1 is the next one
    /// delivered) whole, as its door stored it: what Pulsar's admin peek
    /// answers (a batch is one entry, split by the admin client).
    /// [`AdminReply::Entry`]. Changes nothing.
    PeekEntry { position: u64 },
}

/// Where [`SubscriptionOp::Create`] puts the new cursor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SubscriptionStart {
    Earliest,
    Latest,
    /// This message is the next delivered (ids retention deleted: the
    /// oldest kept).
    Id(MessageId),
}

/// What a grant is on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PermissionResource {
    /// `tenant/ns`: every topic in it.
    Namespace(String),
    /// One topic (a partitioned topic: all its partitions).
    Topic(TopicName),
}

impl PermissionResource {
    /// The name its grants are stored under.
    pub fn key(&self) -> String {
        match self {
            Self::Namespace(ns) => ns.clone(),
            Self::Topic(t) => t.to_string(),
        }
    }

    pub fn namespace(&self) -> String {
        match self {
            Self::Namespace(ns) => ns.clone(),
            Self::Topic(t) => t.namespace_name(),
        }
    }
}

/// What an admin operation answers; which variant goes with which request
/// is said on [`AdminRequest`]. Operations that only change something
/// answer [`AdminReply::Done`].
#[derive(Debug, Clone, PartialEq)]
pub enum AdminReply {
    Done,
    /// Tenants, namespaces or topics, sorted.
    Names(Vec<String>),
    Tenant(TenantInfo),
    Policies(Policies),
    Partitions(u32),
    LastMessageId(LastMessageId),
    Found(FoundMessages),
    Lookup(TopicLookup),
    Owner(TopicOwner),
    /// One per shard, in shard order.
    ShardStats(Vec<ShardStats>),
    /// `None`: the topic has no override; its namespace's applies.
    Retention(Option<TopicRetention>),
    /// `None`: the topic has no override; its namespace's applies.
    MessageTtl(Option<u64>),
    /// The damaged entry the subscription was moved past (batch index -1).
    Skipped(MessageId),
    /// Role -> actions, sorted.
    Permissions(Permissions),
    /// A stored entry ([`SubscriptionOp::PeekEntry`]).
    Entry(StoredEntry),
}

/// A stored entry as its door wrote it (Magnetar's or Pulsar's format).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEntry {
    /// Batch index -1.
    pub id: MessageId,
    pub blob: Bytes,
}

/// Some of a namespace's [`Policies`]: the fields that are set replace the
/// ones they are applied to.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PolicyChange {
    pub retention_minutes: Option<i64>,
    pub retention_size_mb: Option<i64>,
    pub message_ttl_seconds: Option<u64>,
    pub deduplication: Option<bool>,
    pub max_producers_per_topic: Option<u32>,
    pub max_consumers_per_topic: Option<u32>,
    pub auto_topic_creation: Option<bool>,
    pub default_partitions: Option<u32>,
    pub bundles: Option<u32>,
}

impl PolicyChange {
    /// `base` with the set fields replaced.
    pub fn apply(&self, mut base: Policies) -> Policies {
        fn set<T: Copy>(field: &mut T, to: Option<T>) {
            if let Some(v) = to {
                *field = v;
            }
        }
        set(&mut base.retention_minutes, self.retention_minutes);
        set(&mut base.retention_size_mb, self.retention_size_mb);
        set(&mut base.message_ttl_seconds, self.message_ttl_seconds);
        set(&mut base.deduplication, self.deduplication);
        set(&mut base.max_producers_per_topic, self.max_producers_per_topic);
        set(&mut base.max_consumers_per_topic, self.max_consumers_per_topic);
        set(&mut base.auto_topic_creation, self.auto_topic_creation);
        set(&mut base.default_partitions, self.default_partitions);
        set(&mut base.bundles, self.bundles);
        base
    }
}

/// The id of a topic's last stored entry (batch index -1).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LastMessageId {
    /// A non-partitioned topic (or one partition); `None`: nothing stored.
    Topic(Option<MessageId>),
    /// A partitioned topic: per partition, in order (`None` also for a
    /// partition nobody used yet).
    Partitioned(Vec<Option<MessageId>>),
}

/// Messages found by key, newest first.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FoundMessages {
    pub messages: Vec<FoundMessage>,
    /// Messages were left out to keep the answer under its payload bound.
    pub truncated: bool,
}

/// One message found by key: a message, one message of an uncompressed
/// batch, or a whole compressed batch (the broker never decompresses).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundMessage {
    /// Batch index -1 for a message that is not in a batch, or a
    /// compressed batch.
    pub id: MessageId,
    pub key: String,
    pub properties: BTreeMap<String, String>,
    pub publish_time_ms: u64,
    pub payload: Bytes,
    /// The topic (partition) it was found in.
    pub topic: String,
    /// Set when `payload` is a compressed batch.
    pub compressed: Option<CompressedBatch>,
}

/// A compressed batch returned whole.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CompressedBatch {
    pub compression: CompressionType,
    /// Messages in the batch (at least 1).
    pub messages: u32,
}

/// Where a topic lives, and its partitions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicLookup {
    pub owner: TopicOwner,
    /// 0: not partitioned.
    pub partitions: u32,
    /// Where each partition lives, in order.
    pub partition_owners: Vec<TopicOwner>,
    /// The broker's address, as the door's client reached it: set by the
    /// door (the core does not know it).
    pub broker: Option<String>,
}

/// The shard owning a topic name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TopicOwner {
    pub topic: String,
    pub bundle: u32,
    pub shard: u32,
    /// The port the shard listens on by itself, when the broker has
    /// per-shard listeners.
    pub shard_port: Option<u16>,
}

/// One shard's mesh traffic and own port.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShardStats {
    pub traffic: super::ShardTraffic,
    pub port: Option<u16>,
}
