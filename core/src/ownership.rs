//! Topic → bundle → shard ownership.
//!
//! A namespace's 32-bit hash ring is split into `bundles` equal ranges; a
//! topic belongs to the bundle holding `crc32(full topic name)`; a bundle is
//! owned by shard `bundle % shards`. Ownership moves by bundle, never by topic,
//! so a cluster can later hand bundles to brokers without renaming anything.

use crate::topic_name::TopicName;

/// Position of a topic on the namespace's hash ring.
pub fn topic_hash(topic: &TopicName) -> u32 {
    crc32fast::hash(topic.to_string().as_bytes())
}

/// Index of the bundle holding `topic` (0..bundles).
pub fn bundle_of(topic: &TopicName, bundles: u32) -> u32 {
    assert!(bundles > 0);
    ((u64::from(topic_hash(topic)) * u64::from(bundles)) >> 32) as u32
}

/// Shard owning `bundle`.
pub fn shard_of_bundle(bundle: u32, shards: u32) -> u32 {
    assert!(shards > 0);
    bundle % shards
}

/// Shard owning `topic`.
pub fn shard_of(topic: &TopicName, bundles: u32, shards: u32) -> u32 {
    shard_of_bundle(bundle_of(topic, bundles), shards)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_cover_the_ring_and_spread_topics() {
        let mut per_shard = [0u32; 2];
        for i in 0..200 {
            let t = TopicName::parse(&format!("t{i}")).unwrap();
            let b = bundle_of(&t, 16);
            assert!(b < 16);
            per_shard[shard_of(&t, 16, 2) as usize] += 1;
        }
        assert!(per_shard[0] > 50 && per_shard[1] > 50, "{per_shard:?}");
    }
}
