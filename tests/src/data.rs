//! Test data: directories, topic names per shard, generated payloads, and the
//! check that a consumed log holds every acknowledged message exactly once.

use crate::cli::{Receipt, Received};
use crate::scope::{self, Scope};
use magnetar_wire::MessageId;
use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};

/// Bundles per namespace of a standalone broker (`BrokerConfig::new`).
pub const BUNDLES_PER_NAMESPACE: u32 = 16;

/// A temporary directory for a broker's data, deleted on drop (and on a test
/// timeout, see [`crate::run_with_timeout`]).
///
/// It lives under `MAGNETAR_TEST_TMPDIR` if set, else under the cargo target
/// directory: the broker refuses tmpfs (no O_DIRECT durability there), and
/// `/tmp` is tmpfs on many machines, while the target dir is on a real disk.
pub struct TestDir {
    dir: Option<tempfile::TempDir>,
    scope: Option<Scope>,
}

impl TestDir {
    pub fn path(&self) -> &Path {
        self.dir.as_ref().expect("present until drop").path()
    }
}

impl Drop for TestDir {
    fn drop(&mut self) {
        if let Some(d) = self.dir.take() {
            let path = d.path().to_path_buf();
            // Keep the data of a failed test when asked to (for a post-mortem).
            if std::thread::panicking() && std::env::var_os("MAGNETAR_TEST_KEEP").is_some_and(|v| v == "1") {
                eprintln!("keeping test data in {}", d.keep().display());
            } else {
                let _ = d.close();
            }
            if let Some(s) = &self.scope {
                s.unregister_dir(&path);
            }
        }
    }
}

/// Where test directories go.
pub fn test_tmp_root() -> PathBuf {
    if let Some(p) = std::env::var_os("MAGNETAR_TEST_TMPDIR") {
        return PathBuf::from(p);
    }
    // current_exe = <target>/<profile>/deps/<test>; use <target>/e2e-tmp.
    let exe = std::env::current_exe().expect("current_exe");
    match exe.ancestors().nth(3) {
        Some(target) => target.join("e2e-tmp"),
        None => std::env::temp_dir(),
    }
}

/// A fresh directory for one broker's data.
pub fn test_dir(label: &str) -> TestDir {
    let root = test_tmp_root();
    std::fs::create_dir_all(&root).unwrap_or_else(|e| panic!("creating {}: {e}", root.display()));
    let dir = tempfile::Builder::new()
        .prefix(&format!("{label}-"))
        .tempdir_in(&root)
        .unwrap_or_else(|e| panic!("creating a temp dir in {}: {e}", root.display()));
    let scope = scope::register_dir(dir.path().to_path_buf());
    TestDir { dir: Some(dir), scope }
}

/// The shard owning `topic` on a broker with `shards` shards.
pub fn owner_shard(topic: &str, shards: u32) -> u32 {
    let name = magnetar_core::TopicName::parse(topic).unwrap_or_else(|e| panic!("{e}"));
    magnetar_core::ownership::shard_of(&name, BUNDLES_PER_NAMESPACE, shards)
}

/// `per_shard` topic names `<prefix>-<i>` owned by each of the `shards`
/// shards, as `(topic, owner)`, grouped by shard (shard 0's first).
pub fn topics_per_shard(prefix: &str, shards: u32, per_shard: usize) -> Vec<(String, u32)> {
    let mut by_shard: Vec<Vec<String>> = vec![Vec::new(); shards as usize];
    let mut i = 0u64;
    while by_shard.iter().any(|v| v.len() < per_shard) {
        assert!(i < 100_000, "could not spread topics over {shards} shards");
        let topic = format!("{prefix}-{i}");
        let s = owner_shard(&topic, shards) as usize;
        if by_shard[s].len() < per_shard {
            by_shard[s].push(topic);
        }
        i += 1;
    }
    by_shard.into_iter().enumerate().flat_map(|(s, v)| v.into_iter().map(move |t| (t, s as u32))).collect()
}

/// The payload `magnetar produce` generates for `seq`: `"<producer>:<seq>:"`
/// padded with `x` to `size` (just the prefix when that is longer).
pub fn expected_payload(producer: &str, seq: u64, size: usize) -> Vec<u8> {
    let mut p = format!("{producer}:{seq}:").into_bytes();
    if p.len() < size {
        p.resize(size, b'x');
    }
    p
}

/// Producer name and seq of a generated payload (`None` if it is not one).
pub fn parse_generated(payload: &[u8]) -> Option<(String, u64)> {
    let text = std::str::from_utf8(payload).ok()?;
    // The padding holds no ':', so the last two colons frame the seq.
    let mut parts = text.rsplitn(3, ':');
    let padding = parts.next()?;
    let seq = parts.next()?.parse().ok()?;
    let producer = parts.next()?;
    padding.bytes().all(|b| b == b'x').then(|| (producer.to_string(), seq))
}

/// What one producer run got acknowledged on a topic.
#[derive(Debug, Clone)]
pub struct ProducedRun {
    pub producer: String,
    pub size: usize,
    pub receipts: Vec<Receipt>,
}

/// Summary of [`check_topic_log`].
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct LogCheck {
    pub received: usize,
    pub acknowledged: usize,
    /// Messages present that were sent but never acknowledged (allowed after a crash).
    pub unacknowledged_present: usize,
}

/// Checks what a fresh subscription from `earliest` received on one topic
/// against what producers got acknowledged:
///
/// - every acknowledged message is present, at the id of its receipt;
/// - every received payload is a generated one, byte for byte, from a known
///   producer (unacknowledged messages may be present: they may have been
///   durable when the broker died, only their receipt was lost);
/// - ids strictly increase (log order) and each producer's seqs strictly
///   increase (its send order);
/// - no message id and no (producer, seq) appears twice.
pub fn check_topic_log(topic: &str, runs: &[ProducedRun], received: &[Received]) -> LogCheck {
    let sizes: HashMap<&str, usize> = runs.iter().map(|r| (r.producer.as_str(), r.size)).collect();
    assert_eq!(sizes.len(), runs.len(), "{topic}: producer names of the runs must differ");
    let mut seen_ids: HashSet<MessageId> = HashSet::new();
    let mut seen_seqs: HashMap<(String, u64), MessageId> = HashMap::new();
    let mut last_seq: HashMap<String, u64> = HashMap::new();
    let mut last_id: Option<MessageId> = None;
    for (i, m) in received.iter().enumerate() {
        let (producer, seq) = parse_generated(&m.payload).unwrap_or_else(|| {
            panic!(
                "{topic}: message #{i} at {} has a payload that is not a generated one: {:?}",
                m.id,
                String::from_utf8_lossy(&m.payload)
            )
        });
        let size = *sizes
            .get(producer.as_str())
            .unwrap_or_else(|| panic!("{topic}: message #{i} at {} from unknown producer {producer:?}", m.id));
        assert!(
            m.payload == expected_payload(&producer, seq, size),
            "{topic}: message #{i} at {} ({producer}:{seq}) differs from the generated payload ({} bytes, want {size})",
            m.id,
            m.payload.len()
        );
        assert!(seen_ids.insert(m.id), "{topic}: message id {} received twice", m.id);
        if let Some(prev) = seen_seqs.insert((producer.clone(), seq), m.id) {
            panic!("{topic}: {producer}:{seq} received twice, at {prev} and {}", m.id);
        }
        if let Some(last) = last_id {
            assert!(
                (m.id.ledger, m.id.entry, m.id.batch_index) > (last.ledger, last.entry, last.batch_index),
                "{topic}: message #{i} id {} does not follow {last}",
                m.id
            );
        }
        last_id = Some(m.id);
        if let Some(&prev) = last_seq.get(&producer) {
            assert!(seq > prev, "{topic}: {producer}:{seq} received after {producer}:{prev}");
        }
        last_seq.insert(producer, seq);
    }
    let mut acknowledged = 0;
    for run in runs {
        for r in &run.receipts {
            acknowledged += 1;
            match seen_seqs.get(&(run.producer.clone(), r.seq)) {
                Some(id) => assert_eq!(
                    *id, r.id,
                    "{topic}: {}:{} was acknowledged at {} but received at {id}",
                    run.producer, r.seq, r.id
                ),
                None => panic!(
                    "{topic}: acknowledged message {}:{} (id {}) is missing; received {} messages",
                    run.producer,
                    r.seq,
                    r.id,
                    received.len()
                ),
            }
        }
    }
    LogCheck { received: received.len(), acknowledged, unacknowledged_present: received.len() - acknowledged }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_payloads_round_trip() {
        assert_eq!(expected_payload("p", 7, 8), b"p:7:xxxx");
        assert_eq!(expected_payload("prod", 12, 3), b"prod:12:");
        assert_eq!(parse_generated(b"p:7:xxxx"), Some(("p".into(), 7)));
        assert_eq!(parse_generated(b"a:b:12:"), Some(("a:b".into(), 12)));
        assert_eq!(parse_generated(b"p:7:xxyx"), None);
        assert_eq!(parse_generated(b"p:x:xx"), None);
        assert_eq!(parse_generated(b"\xff"), None);
    }

    #[test]
    fn topics_spread_over_shards() {
        let t = topics_per_shard("spread", 2, 3);
        assert_eq!(t.len(), 6);
        for (topic, shard) in &t {
            assert_eq!(owner_shard(topic, 2), *shard);
        }
        assert_eq!(t.iter().filter(|(_, s)| *s == 0).count(), 3);
    }
}
