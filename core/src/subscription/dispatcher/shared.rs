//! Shared: round robin over the consumers that have permits and room for
//! more unacknowledged messages. Each entry goes to exactly one consumer at
//! a time. Owned by the topic's shard; never crosses cores.

use super::{Ask, ConsumerState, Pick};

#[derive(Debug, Default)]
pub(crate) struct RoundRobin {
    /// Index of the consumer to try first.
    next: usize,
}

impl RoundRobin {
    pub(crate) fn pick(&self, consumers: &[ConsumerState], ask: &Ask<'_>) -> Pick {
        let n = consumers.len();
        (0..n).map(|k| (self.next + k) % n).find(|&i| ask.can_take(&consumers[i])).map_or(Pick::Stop, Pick::Deliver)
    }

    pub(crate) fn delivered(&mut self, i: usize, n: usize) {
        self.next = if n == 0 { 0 } else { (i + 1) % n };
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::api::ConsumerRef;
    use std::collections::HashSet;

    #[test]
    fn rotates_and_skips_consumers_without_permits() {
        let mut cs: Vec<ConsumerState> = (0..3)
            .map(|i| ConsumerState {
                consumer: ConsumerRef { shard: 0, sink: 0, consumer_id: i },
                name: String::new(),
                priority: 0,
                permits: 5,
                unacked: 0,
                joined_at: None,
                address: String::new(),
                redelivered: 0,
                zone: String::new(),
            })
            .collect();
        cs[1].permits = 0;
        let blocked = HashSet::new();
        let ask = Ask { entry: 0, key_hash: 0, outstanding_floor: 0, unacked_per_consumer_max: 10, blocked: &blocked };
        let mut rr = RoundRobin::default();
        let mut got = Vec::new();
        for _ in 0..4 {
            let Pick::Deliver(i) = rr.pick(&cs, &ask) else { panic!("stopped") };
            got.push(i);
            rr.delivered(i, cs.len());
        }
        assert_eq!(got, vec![0, 2, 0, 2]);
        cs[0].unacked = 10;
        cs[2].permits = 0;
        assert_eq!(rr.pick(&cs, &ask), Pick::Stop);
    }
}
