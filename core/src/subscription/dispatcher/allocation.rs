//! Failover on a partitioned topic: which consumer owns which partition
//! (RocketMQ's allocation strategies, issue #22).
//!
//! Each partition is a topic of its own with its own copy of the
//! subscription, and each copy sees the same consumers (a partitioned
//! consumer attaches to every partition). So every copy must reach the same
//! answer on its own: [`owner`] is a pure function of the consumers (already
//! in the order `failover` sorts them: name, then consumer ref), the
//! partition, the partition count and the subscription's partition zones.
//!
//! - RoundRobin (RocketMQ's circle): partition `p` to consumer `p % n`.
//! - Average: contiguous blocks; with `N` partitions and `n` consumers the
//!   first `N % n` consumers own `N / n + 1` partitions, the others `N / n`.
//! - ConsistentHash: a ring of [`VIRTUAL_NODES`] points per consumer name;
//!   a partition goes to the first point at or after its own hash. A joining
//!   consumer takes only the partitions that now fall on its points, about
//!   `1/n` of them; a leaving one hands over only its own.
//! - Zone: a partition whose zone label has a consumer of the same zone
//!   goes to one of those, by Average over that zone's partitions; the
//!   others (no label, or no consumer of their zone) by Average over all
//!   consumers, among those partitions.
//!
//! Owned by the topic's shard; never crosses cores.

use magnetar_wire::AllocationStrategy;

/// Points each consumer has on the consistent-hash ring. More points spread
/// partitions more evenly at the cost of a larger ring (built only when a
/// consumer joins or leaves).
pub(crate) const VIRTUAL_NODES: u32 = 160;

/// What the strategy knows of one consumer.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Member<'a> {
    pub(crate) name: &'a str,
    pub(crate) zone: &'a str,
}

/// The index in `members` of the owner of `partition` (of `partitions`;
/// a count below `partition + 1`, e.g. 0 when the topic is not known as
/// partitioned, counts as `partition + 1`). A negative partition (a topic
/// that is not a partition) belongs to the first member. `None` when there
/// are no members.
pub(crate) fn owner(
    strategy: AllocationStrategy,
    members: &[Member<'_>],
    partition: i32,
    partitions: u32,
    partition_zones: &[String],
) -> Option<usize> {
    if members.is_empty() {
        return None;
    }
    let Ok(p) = u32::try_from(partition) else { return Some(0) };
    let n = partitions.max(p.saturating_add(1));
    let m = members.len();
    Some(match strategy {
        AllocationStrategy::RoundRobin => p as usize % m,
        AllocationStrategy::Average => average(p, n, m),
        AllocationStrategy::ConsistentHash => ring_owner(&ring(members), p),
        AllocationStrategy::Zone => zone(members, p, n, partition_zones),
    })
}

/// RocketMQ's AllocateMessageQueueAveragely, inverted: the consumer of
/// partition `p` of `n` among `m` consumers (`p < n`).
fn average(p: u32, n: u32, m: usize) -> usize {
    assert!(p < n && m > 0);
    let (n, p) = (n as usize, p as usize);
    if n <= m {
        return p;
    }
    let (q, r) = (n / m, n % m);
    // The first r consumers own q + 1 partitions each.
    let big = r * (q + 1);
    if p < big {
        p / (q + 1)
    } else {
        r + (p - big) / q
    }
}

fn ring_hash(bytes: &[u8]) -> u32 {
    magnetar_pulsar_wire::pulsar_key_hash(bytes)
}

/// The consistent-hash ring: `(point, member index)`, ascending. A point
/// is the hash of `<name>#<v>` for `v` below [`VIRTUAL_NODES`].
fn ring(members: &[Member<'_>]) -> Vec<(u32, usize)> {
    let mut ring: Vec<(u32, usize)> = Vec::with_capacity(members.len() * VIRTUAL_NODES as usize);
    let mut key = Vec::new();
    for (i, m) in members.iter().enumerate() {
        for v in 0..VIRTUAL_NODES {
            key.clear();
            key.extend_from_slice(m.name.as_bytes());
            key.push(b'#');
            key.extend_from_slice(v.to_string().as_bytes());
            ring.push((ring_hash(&key), i));
        }
    }
    // Equal points (equal names) go to the first such member: the order
    // of `members` is the same on every partition.
    ring.sort_unstable();
    ring
}

/// The member owning partition `p`: the first point at or after the hash
/// of `partition-<p>`, wrapping around.
fn ring_owner(ring: &[(u32, usize)], p: u32) -> usize {
    assert!(!ring.is_empty());
    let h = ring_hash(format!("partition-{p}").as_bytes());
    let at = ring.partition_point(|(point, _)| *point < h);
    ring[at % ring.len()].1
}

fn zone(members: &[Member<'_>], p: u32, n: u32, partition_zones: &[String]) -> usize {
    // Partitions at or past the labelled ones have no zone: they are
    // counted, not walked, so the work is bounded by the labels (a partition
    // number comes from a topic name and may be huge).
    let labelled = u32::try_from(partition_zones.len()).unwrap_or(u32::MAX);
    let zone_of = |q: u32| partition_zones.get(q as usize).map_or("", String::as_str);
    let has_consumer = |z: &str| !z.is_empty() && members.iter().any(|m| m.zone == z);
    let z = zone_of(p);
    if has_consumer(z) {
        let local: Vec<usize> = (0..members.len()).filter(|&i| members[i].zone == z).collect();
        let same: Vec<u32> = (0..n.min(labelled)).filter(|&q| zone_of(q) == z).collect();
        let at = same.iter().position(|&q| q == p).expect("p is in its own zone");
        return local[average(at as u32, same.len() as u32, local.len())];
    }
    let orphans_below = |end: u32| {
        let walked = (0..end.min(labelled)).filter(|&q| !has_consumer(zone_of(q))).count() as u32;
        walked + end.saturating_sub(labelled)
    };
    average(orphans_below(p), orphans_below(n), members.len())
}

#[cfg(test)]
mod tests {
    use super::*;
    use AllocationStrategy::*;

    fn members<'a>(names: &'a [String], zones: &'a [&'a str]) -> Vec<Member<'a>> {
        names.iter().enumerate().map(|(i, n)| Member { name: n, zone: zones.get(i).copied().unwrap_or("") }).collect()
    }

    fn table(s: AllocationStrategy, ms: &[Member<'_>], n: u32, zones: &[String]) -> Vec<usize> {
        (0..n as i32).map(|p| owner(s, ms, p, n, zones).unwrap()).collect()
    }

    /// `table` for ConsistentHash with the ring built once (the same answer
    /// as `owner`, which builds it per partition; checked on a few).
    fn ring_table(ms: &[Member<'_>], n: u32) -> Vec<usize> {
        let r = ring(ms);
        let t: Vec<usize> = (0..n).map(|p| ring_owner(&r, p)).collect();
        for p in [0, n / 2, n - 1] {
            assert_eq!(owner(ConsistentHash, ms, p as i32, n, &[]), Some(t[p as usize]));
        }
        t
    }

    fn names(k: usize) -> Vec<String> {
        (0..k).map(|i| format!("c{i}")).collect()
    }

    #[test]
    fn round_robin_and_average_match_rocketmq() {
        let ns = names(3);
        let ms = members(&ns, &[]);
        assert_eq!(table(RoundRobin, &ms, 8, &[]), vec![0, 1, 2, 0, 1, 2, 0, 1]);
        // 8 over 3: blocks of 3, 3, 2.
        assert_eq!(table(Average, &ms, 8, &[]), vec![0, 0, 0, 1, 1, 1, 2, 2]);
        assert_eq!(table(Average, &ms, 6, &[]), vec![0, 0, 1, 1, 2, 2]);
        // Fewer partitions than consumers: the last consumers own none.
        assert_eq!(table(Average, &ms, 2, &[]), vec![0, 1]);
        assert_eq!(owner(Average, &ms, -1, 0, &[]), Some(0));
        assert_eq!(owner(Average, &[], 0, 4, &[]), None);
        // An unknown count is taken as partition + 1.
        assert_eq!(owner(Average, &ms, 5, 0, &[]), Some(2));
    }

    #[test]
    fn average_owns_contiguous_blocks_of_near_equal_size() {
        for n in 1..40u32 {
            for m in 1..12usize {
                let ns = names(m);
                let t = table(Average, &members(&ns, &[]), n, &[]);
                assert!(t.windows(2).all(|w| w[0] <= w[1]), "n {n} m {m}: {t:?}");
                let counts: Vec<usize> = (0..m).map(|i| t.iter().filter(|&&o| o == i).count()).collect();
                let (lo, hi) = (counts.iter().min().unwrap(), counts.iter().max().unwrap());
                assert!(hi - lo <= 1, "n {n} m {m}: {counts:?}");
            }
        }
    }

    #[test]
    fn consistent_hash_moves_only_the_joiners_share() {
        // Goal: a consumer joining moves about 1/(n+1) of the partitions,
        // all to itself; one leaving moves only its own. Randomized names,
        // seeded (printed) so a failure can be replayed.
        let seed: u64 = std::env::var("ALLOC_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(|| {
            std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
        });
        println!("consistent_hash_moves_only_the_joiners_share seed {seed}");
        let mut rng = seed;
        let mut next = || {
            rng = rng.wrapping_mul(6364136223846793005).wrapping_add(1442695040888963407);
            rng >> 33
        };
        let partitions = 512u32;
        for n in 1..10usize {
            let mut ns: Vec<String> = (0..n).map(|_| format!("consumer-{}", next())).collect();
            ns.sort();
            let before = ring_table(&members(&ns, &[]), partitions);
            let joiner = format!("consumer-{}", next());
            let mut grown = ns.clone();
            grown.push(joiner.clone());
            grown.sort();
            let after = ring_table(&members(&grown, &[]), partitions);
            let j = grown.iter().position(|x| *x == joiner).unwrap();
            let mut moved = 0;
            for p in 0..partitions as usize {
                if grown[after[p]] != ns[before[p]] {
                    moved += 1;
                    assert_eq!(after[p], j, "seed {seed}: partition {p} moved to a consumer that did not join");
                }
            }
            let fair = f64::from(partitions) / (n + 1) as f64;
            assert!(
                f64::from(moved) <= fair * 1.5,
                "seed {seed}: {moved} of {partitions} moved on a join to {n}, about {fair:.0} expected"
            );
            // Leaving again restores the old table exactly.
            let back = ring_table(&members(&ns, &[]), partitions);
            assert_eq!(back, before, "seed {seed}");
        }
    }

    #[test]
    fn zone_prefers_consumers_of_the_partitions_zone() {
        let ns = names(3);
        let zones: Vec<String> = ["a", "a", "b", "b", "c", "", "a", "b"].iter().map(|z| z.to_string()).collect();
        // c0 and c1 in zone a, c2 in zone b; nobody in c.
        let ms = members(&ns, &["a", "a", "b"]);
        let t = table(Zone, &ms, 8, &zones);
        // Zone a's partitions 0, 1, 6 by Average over c0, c1: 0, 0, 1.
        assert_eq!((t[0], t[1], t[6]), (0, 0, 1));
        // Zone b's partitions to c2.
        assert_eq!((t[2], t[3], t[7]), (2, 2, 2));
        // Partitions 4 (zone c, nobody there) and 5 (no zone): Average over
        // all three.
        assert_eq!((t[4], t[5]), (0, 1));
        // Zone b's consumer leaves: its partitions fall back to everyone.
        let ms2 = members(&ns[..2], &["a", "a"]);
        let t2 = table(Zone, &ms2, 8, &zones);
        assert_eq!((t2[0], t2[1], t2[6]), (0, 0, 1));
        assert_eq!(vec![t2[2], t2[3], t2[4], t2[5], t2[7]], vec![0, 0, 0, 1, 1]);
    }

    /// Goal: a partition number from a topic name (up to 2^31) costs work
    /// bounded by the zone labels, not by the number; and partitions past
    /// the labels agree with the walked answer (zone labels shorter than the
    /// partition count).
    #[test]
    fn zone_work_is_bounded_by_the_labels() {
        let ns = names(3);
        let zones: Vec<String> = ["a", "", "b"].iter().map(|z| z.to_string()).collect();
        let ms = members(&ns, &["a", "b", "c"]);
        let huge = i32::MAX as u32;
        let start = std::time::Instant::now();
        let o = owner(Zone, &ms, huge as i32, 0, &zones).expect("owner");
        assert!(start.elapsed() < std::time::Duration::from_secs(1), "walked up to the partition number");
        // Orphans are 1 and 3.. (2^31 - 3 of them with p = 2^31 - 1 last).
        assert_eq!(o, average(huge - 2, huge - 1, 3));
        // Against a walk of every partition, 6 partitions, 3 labelled.
        let t = table(Zone, &ms, 6, &zones);
        assert_eq!((t[0], t[2]), (0, 1), "labelled partitions go to their zone's consumer");
        // Orphans 1, 3, 4, 5: Average of 4 over 3 consumers: 0, 0, 1, 2.
        assert_eq!((t[1], t[3], t[4], t[5]), (0, 0, 1, 2));
    }
}
