//! Dispatch policies: which consumer of a subscription gets the next entry.
//!
//! The dispatcher task (`run` below) is the same for every subscription type;
//! only the choice of consumer differs, and that lives in one module per
//! policy: `failover` (Exclusive and Failover: one active consumer),
//! `shared` (round robin) and `key_shared` (hash ranges of the key).
//!
//! A pass of the dispatcher first replays entries that must be delivered
//! again (from a closed consumer, a redelivery request, a due delayed
//! message, or an entry Key_Shared had to set aside), in log order, then
//! reads fresh durable entries from `read_pos`. Everything here is owned by
//! the topic's shard and never crosses cores.

pub(crate) mod allocation;
pub(crate) mod context;
pub(crate) mod failover;
pub(crate) mod filter;
pub(crate) mod key_shared;
pub(crate) mod shared;

use crate::api::ConsumerRef;
use std::collections::HashSet;

/// A consumer attached to a subscription, as its owner shard sees it.
#[derive(Debug, Clone)]
pub(crate) struct ConsumerState {
    pub(crate) consumer: ConsumerRef,
    pub(crate) name: String,
    pub(crate) priority: i32,
    /// Messages it may still be sent (flow permits).
    pub(crate) permits: u64,
    /// Messages sent to it and not yet acknowledged (nor taken back).
    pub(crate) unacked: u32,
    /// Key_Shared: entries at or after this position were not read yet when
    /// it joined; it gets them only once no entry before this position is
    /// outstanding (so a key moved to it keeps its order). Not the ack floor:
    /// a delayed message not yet due must not hold a newcomer back.
    pub(crate) joined_at: Option<u64>,
    /// Where its client connects from (stats only).
    pub(crate) address: String,
    /// Messages sent to it that had been delivered before (redelivery
    /// count above 0), for stats.
    pub(crate) redelivered: u64,
    /// Its zone label for the Zone allocation strategy ("" = none).
    pub(crate) zone: String,
}

impl ConsumerState {
    /// Its pending entry `entry` left it (acknowledged or taken back).
    /// `unacked` counts exactly the pending entries it holds: each delivery
    /// adds one, each entry leaving it takes one, so an underflow means an
    /// entry was released twice or never counted.
    pub(crate) fn take_back_one(&mut self, entry: u64) {
        assert!(
            self.unacked > 0,
            "consumer {:?} releases entry {entry} but holds no unacknowledged entry",
            self.consumer
        );
        self.unacked -= 1;
    }
}

/// What the policy decided for one entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pick {
    /// Send it to `consumers[i]`.
    Deliver(usize),
    /// Key_Shared only: its consumer cannot take it now; set it aside (in
    /// log order) and go on with other keys. That consumer is blocked for
    /// the rest of the pass so later entries of its keys stay behind it.
    SetAside(ConsumerRef),
    /// Key_Shared sticky only: no consumer owns its key hash now; keep it
    /// in the replay set until one does. Blocks nobody.
    Hold,
    /// Nobody can take it: end the pass.
    Stop,
}

/// Facts a policy needs about one entry and the subscription.
pub(crate) struct Ask<'a> {
    pub(crate) entry: u64,
    pub(crate) key_hash: u16,
    /// The lowest entry still outstanding: delivered and not acknowledged,
    /// or waiting to be delivered again (`u64::MAX` when none). Entries in
    /// the delayed index are not outstanding: nobody has seen them yet.
    pub(crate) outstanding_floor: u64,
    pub(crate) unacked_per_consumer_max: u32,
    pub(crate) blocked: &'a HashSet<ConsumerRef>,
}

impl Ask<'_> {
    pub(crate) fn can_take(&self, c: &ConsumerState) -> bool {
        c.permits > 0 && c.unacked < self.unacked_per_consumer_max && !self.blocked.contains(&c.consumer)
    }
}

/// The policy of one subscription type.
#[derive(Debug)]
pub(crate) enum Policy {
    /// Exclusive and Failover.
    Single(failover::Active),
    Shared(shared::RoundRobin),
    KeyShared(key_shared::HashRanges),
}

impl Policy {
    pub(crate) fn pick(&self, consumers: &[ConsumerState], ask: &Ask<'_>) -> Pick {
        match self {
            Self::Single(a) => a.pick(consumers, ask),
            Self::Shared(r) => r.pick(consumers, ask),
            Self::KeyShared(h) => h.pick(consumers, ask),
        }
    }

    /// Called after a delivery to `consumers[i]`.
    pub(crate) fn delivered(&mut self, i: usize, consumers: &[ConsumerState]) {
        if let Self::Shared(r) = self {
            r.delivered(i, consumers.len());
        }
    }
}

/// Key hash of a message for Key_Shared: the ordering key if set, else the
/// partition key, else the empty key (all keyless messages share one hash).
/// Pulsar's (`Murmur3_32Hash` of the key modulo 65536), so that a key's range
/// is the same for Pulsar clients' sticky ranges and the native client's.
pub(crate) fn key_hash(ordering_key: Option<&[u8]>, partition_key: Option<&[u8]>) -> u16 {
    let bytes = ordering_key.or(partition_key).unwrap_or(&[]);
    (magnetar_pulsar_wire::pulsar_key_hash(bytes) % key_shared::HASH_RANGE) as u16
}

pub(crate) mod task;
