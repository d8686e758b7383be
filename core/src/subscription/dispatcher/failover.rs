//! Exclusive and Failover: all entries go to one active consumer.
//!
//! The active consumer is chosen among those with the lowest priority level
//! (Pulsar: 0 is the highest priority), ordered by name; on a partitioned
//! topic the subscription's allocation strategy (`allocation.rs`; by default
//! round robin, partition `p` to the `p % n`-th) says which of them owns
//! partition `p`, so partitions spread over the consumers. Exclusive is the
//! same policy with at most one consumer. Owned by the topic's shard; never
//! crosses cores.

use super::allocation::{self, Member};
use super::{Ask, ConsumerState, Pick};
use crate::api::ConsumerRef;
use magnetar_wire::AllocationStrategy;

/// Where this copy of the subscription sits among the partitions, and how
/// they are allocated.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Placement<'a> {
    pub(crate) strategy: AllocationStrategy,
    /// -1 when the topic is not a partition.
    pub(crate) partition: i32,
    /// The partitioned topic's partition count as last reported (0: unknown).
    pub(crate) partitions: u32,
    pub(crate) partition_zones: &'a [String],
}

impl Placement<'_> {
    /// Round robin with no partition count known (non-persistent topics
    /// know no other strategy).
    pub(crate) fn round_robin(partition: i32) -> Placement<'static> {
        Placement { strategy: AllocationStrategy::RoundRobin, partition, partitions: 0, partition_zones: &[] }
    }
}

#[derive(Debug, Default)]
pub(crate) struct Active {
    pub(crate) current: Option<ConsumerRef>,
}

impl Active {
    /// Recomputes the active consumer; returns `(old, new)` when it changed.
    pub(crate) fn choose(
        &mut self,
        consumers: &[ConsumerState],
        placement: &Placement<'_>,
    ) -> Option<(Option<ConsumerRef>, Option<ConsumerRef>)> {
        let new = choose_active(consumers, placement);
        if new == self.current {
            return None;
        }
        let old = std::mem::replace(&mut self.current, new);
        Some((old, new))
    }

    pub(crate) fn pick(&self, consumers: &[ConsumerState], ask: &Ask<'_>) -> Pick {
        let Some(active) = self.current else { return Pick::Stop };
        match consumers.iter().position(|c| c.consumer == active) {
            Some(i) if ask.can_take(&consumers[i]) => Pick::Deliver(i),
            _ => Pick::Stop,
        }
    }
}

pub(crate) fn choose_active(consumers: &[ConsumerState], placement: &Placement<'_>) -> Option<ConsumerRef> {
    let best = consumers.iter().map(|c| c.priority).min()?;
    let mut candidates: Vec<&ConsumerState> = consumers.iter().filter(|c| c.priority == best).collect();
    // Name first; the consumer ref breaks ties between equal names so the
    // choice never depends on attach order.
    candidates.sort_by(|a, b| {
        a.name.cmp(&b.name).then((a.consumer.shard, a.consumer.sink, a.consumer.consumer_id).cmp(&(
            b.consumer.shard,
            b.consumer.sink,
            b.consumer.consumer_id,
        )))
    });
    let members: Vec<Member<'_>> = candidates.iter().map(|c| Member { name: &c.name, zone: &c.zone }).collect();
    let i = allocation::owner(
        placement.strategy,
        &members,
        placement.partition,
        placement.partitions,
        placement.partition_zones,
    )?;
    Some(candidates[i].consumer)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(id: u64, name: &str, priority: i32) -> ConsumerState {
        ConsumerState {
            consumer: ConsumerRef { shard: 0, sink: 1, consumer_id: id },
            name: name.into(),
            priority,
            permits: 10,
            unacked: 0,
            joined_at: None,
            address: String::new(),
            redelivered: 0,
            zone: String::new(),
        }
    }

    #[test]
    fn lowest_priority_then_name_wins_and_partitions_spread() {
        let cs = vec![c(1, "b", 1), c(2, "c", 0), c(3, "a", 0)];
        assert_eq!(choose_active(&cs, &Placement::round_robin(-1)).map(|r| r.consumer_id), Some(3));
        assert_eq!(choose_active(&cs, &Placement::round_robin(0)).map(|r| r.consumer_id), Some(3));
        assert_eq!(choose_active(&cs, &Placement::round_robin(1)).map(|r| r.consumer_id), Some(2));
        assert_eq!(choose_active(&cs, &Placement::round_robin(2)).map(|r| r.consumer_id), Some(3));
        assert_eq!(choose_active(&cs[..1], &Placement::round_robin(5)).map(|r| r.consumer_id), Some(1));
        assert_eq!(choose_active(&[], &Placement::round_robin(0)), None);
    }
}
