//! Goal: unmodified official Apache Pulsar clients work against Magnetar
//! (issue #19): the Python `pulsar-client` wheel (pinned in
//! `tests/pulsar/requirements.txt`, C++ client inside) produces and
//! consumes through the Pulsar door, and messages cross between the two
//! doors with their payload, key and properties byte for byte.
//!
//! Method: each test starts its own one-shard broker on port 0 and runs one
//! test of `tests/pulsar/client_tests.py` (which asserts itself) under a
//! hard timeout, in a venv made on first use (see `magnetar_tests::pulsar`).
//! Cross-door tests drive the native side with the `magnetar` CLI and
//! compare what each side saw.

use magnetar_tests::{run_cli, run_pulsar_test, test_dir, BrokerProcess, ConsumeCmd};
use std::time::Duration;

const PY_TIMEOUT: Duration = Duration::from_secs(120);
const CLI_TIMEOUT: Duration = Duration::from_secs(60);

fn broker(label: &str) -> (magnetar_tests::TestDir, BrokerProcess) {
    let dir = test_dir(label);
    let broker = BrokerProcess::start(dir.path(), 1);
    (dir, broker)
}

fn pulsar_url(b: &BrokerProcess) -> String {
    format!("pulsar://{}", b.url())
}

fn py(name: &str) {
    let (_dir, mut b) = broker(&format!("pulsar-{name}"));
    let topic = format!("persistent://public/default/{name}");
    let run = run_pulsar_test(&pulsar_url(&b), name, &topic, &[], PY_TIMEOUT);
    eprintln!("{}", run.stdout);
    b.assert_running();
    assert!(!b.log().contains("panicked"), "broker panicked:\n{}", b.log_tail());
}

#[test]
fn pulsar_round_trip() {
    py("round_trip");
}

#[test]
fn pulsar_batching() {
    py("batching");
}

#[test]
fn pulsar_exclusive() {
    py("exclusive");
}

#[test]
fn pulsar_shared() {
    py("shared");
}

#[test]
fn pulsar_failover() {
    py("failover");
}

#[test]
fn pulsar_key_shared() {
    py("key_shared");
}

/// Sticky ranges hold the keys whose Murmur3 hash they contain (ordering
/// key first), refuse an overlapping consumer, and hold unowned keys back.
#[test]
fn pulsar_key_shared_sticky() {
    py("key_shared_sticky");
}

/// Auto split with key-based batching: one consumer per key, before and
/// after a consumer leaves.
#[test]
fn pulsar_key_shared_auto_split() {
    py("key_shared_auto_split");
}

/// Non-persistent topics: every subscription type, nothing kept for
/// nobody, and a partitioned one (made with the native admin CLI).
#[test]
fn pulsar_non_persistent() {
    let (_dir, mut b) = broker("pulsar-non-persistent");
    let topic = "non-persistent://public/default/np";
    let url = b.url();
    let parts = format!("{topic}-parts");
    run_cli(["admin", "topics", "create-partitioned", parts.as_str(), "-p", "3", "--url", url.as_str()], CLI_TIMEOUT)
        .assert_success();
    let run = run_pulsar_test(&pulsar_url(&b), "non_persistent", topic, &[], PY_TIMEOUT);
    eprintln!("{}", run.stdout);
    b.assert_running();
    assert!(!b.log().contains("panicked"), "broker panicked:\n{}", b.log_tail());
}

#[test]
fn pulsar_acks() {
    py("acks");
}

#[test]
fn pulsar_negative_ack() {
    py("negative_ack");
}

#[test]
fn pulsar_seek() {
    py("seek");
}

#[test]
fn pulsar_reader() {
    py("reader");
}

#[test]
fn pulsar_empty_topic_last_id() {
    py("empty_topic_last_id");
}

#[test]
fn pulsar_last_id_in_batch() {
    py("last_id_in_batch");
}

#[test]
fn pulsar_ack_timeout() {
    py("ack_timeout");
}

#[test]
fn pulsar_unsubscribe() {
    py("unsubscribe");
}

#[test]
fn pulsar_too_big() {
    py("too_big");
}

#[test]
fn pulsar_connection_loss() {
    py("connection_loss");
}

/// Exclusive, WaitForExclusive and ExclusiveWithFencing producers; the
/// waiting producer is told at once that it is queued (`producer_ready =
/// false`, which the C++ client logs), as Pulsar's broker does.
#[test]
fn pulsar_access_modes() {
    let (_dir, mut b) = broker("pulsar-access-modes");
    let topic = "persistent://public/default/access_modes";
    let run = run_pulsar_test(&pulsar_url(&b), "access_modes", topic, &[], PY_TIMEOUT);
    assert!(run.stdout.contains("has been queued up at broker"), "no producer_ready = false:\n{}", run.stdout);
    b.assert_running();
}

#[test]
fn pulsar_compression() {
    py("compression");
}

#[test]
fn pulsar_chunking() {
    py("chunking");
}

#[test]
fn pulsar_delayed_delivery() {
    py("delayed_delivery");
}

#[test]
fn pulsar_dead_letter() {
    py("dead_letter");
}

#[test]
fn pulsar_batch_index_ack() {
    py("batch_index_ack");
}

/// Dedup on for the namespace (native admin CLI), then a named Pulsar
/// producer's resend is answered without being stored again.
#[test]
fn pulsar_dedup() {
    let (_dir, mut b) = broker("pulsar-dedup");
    let url = b.url();
    run_cli(["admin", "namespaces", "set-deduplication", "public/default", "on", "--url", url.as_str()], CLI_TIMEOUT)
        .assert_success();
    run_pulsar_test(&pulsar_url(&b), "dedup", "persistent://public/default/dedup", &[], PY_TIMEOUT);
    b.assert_running();
}

/// A partitioned topic made with the native admin CLI is used by the
/// Pulsar client through PARTITIONED_METADATA and per-partition lookups.
#[test]
fn pulsar_partitioned() {
    let (_dir, mut b) = broker("pulsar-partitioned");
    let topic = "persistent://public/default/parts";
    let url = b.url();
    run_cli(["admin", "topics", "create-partitioned", topic, "-p", "3", "--url", url.as_str()], CLI_TIMEOUT)
        .assert_success();
    run_pulsar_test(&pulsar_url(&b), "partitioned", topic, &[], PY_TIMEOUT);
    b.assert_running();
}

/// The same on a two-shard broker, whose partitions span both shards:
/// LOOKUP sends the C++ client to each partition's owner shard's own port,
/// and it still produces to and consumes from every partition.
#[test]
fn pulsar_partitioned_two_shards() {
    let dir = test_dir("pulsar-partitioned-two-shards");
    let mut b = BrokerProcess::start(dir.path(), 2);
    let topic = "persistent://public/default/parts";
    let url = b.url();
    run_cli(["admin", "topics", "create-partitioned", topic, "-p", "3", "--url", url.as_str()], CLI_TIMEOUT)
        .assert_success();
    let mut shards = std::collections::BTreeSet::new();
    for i in 0..3 {
        let name = format!("{topic}-partition-{i}");
        let run = run_cli(["admin", "topics", "owner", name.as_str(), "--url", url.as_str()], CLI_TIMEOUT);
        run.assert_success();
        let owner: serde_json::Value = serde_json::from_str(&run.stdout_lines.join("\n")).expect("owner JSON");
        shards.insert(owner["shard"].as_u64().expect("shard"));
    }
    assert_eq!(shards.len(), 2, "the partitions should span both shards");
    let run = run_pulsar_test(&pulsar_url(&b), "partitioned", topic, &[], PY_TIMEOUT);
    eprintln!("{}", run.stdout);
    b.assert_running();
    assert!(!b.log().contains("panicked"), "broker panicked:\n{}", b.log_tail());
}

/// Regex subscriptions (GET_TOPICS_OF_NAMESPACE): the matching topics that
/// exist, a partitioned one whole, and one created after subscribing, found
/// by the client's periodic discovery.
#[test]
fn pulsar_regex() {
    let (_dir, mut b) = broker("pulsar-regex");
    let topic = "persistent://public/default/regex";
    let url = b.url();
    let parts = format!("{topic}-parts");
    run_cli(["admin", "topics", "create-partitioned", parts.as_str(), "-p", "2", "--url", url.as_str()], CLI_TIMEOUT)
        .assert_success();
    let run = run_pulsar_test(&pulsar_url(&b), "regex", topic, &[], PY_TIMEOUT);
    eprintln!("{}", run.stdout);
    b.assert_running();
}

/// The native CLI's codecs (the same four as Pulsar's).
const CODECS: [&str; 4] = ["lz4", "zlib", "zstd", "snappy"];

/// Native CLI produce → Pulsar consume: payload, key and properties arrive
/// as sent, unbatched, batched, and in batches compressed with each codec.
#[test]
fn pulsar_cross_native_to_pulsar() {
    let (_dir, mut b) = broker("pulsar-cross-n2p");
    let topic = "persistent://public/default/n2p";
    let url = b.url();
    // Long enough that the codecs find repeats to compress.
    let text = "hello \u{e9}\u{1f600} ".repeat(20);
    let produce = |extra: &[&str]| {
        let mut args = vec![
            "produce",
            topic,
            "-m",
            text.as_str(),
            "--count",
            "3",
            "-k",
            "key-1",
            "-p",
            "a=1",
            "-p",
            "b=two",
            "--url",
            url.as_str(),
        ];
        args.extend_from_slice(extra);
        run_cli(args, CLI_TIMEOUT).assert_success();
    };
    produce(&[]);
    produce(&["--batch-max-messages", "3", "--batch-max-delay-ms", "1000"]);
    // Compressed batches: decompressed, converted and compressed again.
    for codec in CODECS {
        produce(&["--batch-max-messages", "3", "--batch-max-delay-ms", "1000", "--compression", codec]);
    }
    let n = 6 + 3 * CODECS.len();
    let run = run_pulsar_test(&pulsar_url(&b), "cross_consume", topic, &[&n.to_string()], PY_TIMEOUT);
    assert_eq!(run.out.len(), n, "{}", run.stdout);
    let mut batched = 0;
    for line in &run.out {
        let v: serde_json::Value = serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line}"));
        let payload = base64_decode(v["payload"].as_str().unwrap_or_default());
        assert_eq!(payload, text.as_bytes(), "{line}");
        assert_eq!(v["key"], "key-1", "{line}");
        assert_eq!(v["properties"], serde_json::json!({"a": "1", "b": "two"}), "{line}");
        if v["id"][2].as_i64().unwrap_or(-1) >= 0 {
            batched += 1;
        }
    }
    assert_eq!(batched, n - 3, "the batches' messages carry batch indexes: {:?}", run.out);
    b.assert_running();
}

/// Pulsar produce → native CLI consume: binary payloads, keys and
/// properties arrive as sent, unbatched and batched. The CLI is given the
/// same `pulsar://` URL as the Pulsar client (the port serves both doors).
#[test]
fn pulsar_cross_pulsar_to_native() {
    let (_dir, mut b) = broker("pulsar-cross-p2n");
    let topic = "persistent://public/default/p2n";
    run_pulsar_test(&pulsar_url(&b), "cross_produce", topic, &[], PY_TIMEOUT);
    let mut consume = ConsumeCmd::new(&pulsar_url(&b), topic, "native");
    consume.count = 10;
    let got = consume.run(CLI_TIMEOUT);
    assert_eq!(got.len(), 10, "{got:?}");
    for (i, m) in got.iter().enumerate() {
        let (kind, n, prefix) = if i < 5 { ("single", i, [0u8, 255]) } else { ("batched", i - 5, [1u8, 254]) };
        let mut want = prefix.to_vec();
        want.push(n as u8);
        want.extend_from_slice(kind.as_bytes());
        assert_eq!(m.payload, want, "message {i}: {m:?}");
        let key = if i < 5 { format!("k{n}") } else { format!("b{n}") };
        assert_eq!(m.key.as_deref(), Some(key.as_str()), "message {i}");
        assert_eq!(m.properties, vec![("n".to_string(), n.to_string())], "message {i}");
    }
    b.assert_running();
}

/// An admin lookup by key looks inside Pulsar batches: with key-based
/// batching, `admin messages find` by one key returns exactly that key's
/// messages, each with its own properties and batch index, newest first,
/// and an unbatched Pulsar message with its properties.
#[test]
fn pulsar_find_by_key_in_batches() {
    let (_dir, mut b) = broker("pulsar-find");
    let topic = "persistent://public/default/find";
    run_pulsar_test(&pulsar_url(&b), "find_produce", topic, &[], PY_TIMEOUT);
    let url = b.url();
    let run = run_cli(["admin", "messages", "find", topic, "--key", "k1", "--url", url.as_str()], CLI_TIMEOUT);
    run.assert_success();
    let found: Vec<serde_json::Value> = run
        .stdout_lines
        .iter()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect();
    let payloads: Vec<&str> = found.iter().map(|m| m["payload"].as_str().unwrap_or("<none>")).collect();
    // Newest first: the batch's k1 messages (sent 1, 4, ..., 16), then the
    // unbatched one sent before them.
    let mut want: Vec<String> = (0..18).filter(|i| i % 3 == 1).rev().map(|i| format!("batched-{i}")).collect();
    want.push("single-k1".into());
    assert_eq!(payloads, want, "{found:?}");
    for m in &found {
        assert_eq!(m["key"], "k1", "{m}");
        assert_eq!(m["properties"]["key"], "k1", "{m}");
        let p = m["payload"].as_str().unwrap_or_default();
        let n = p.strip_prefix("batched-").unwrap_or("single");
        assert_eq!(m["properties"]["n"], n, "{m}");
        let id = m["id"].as_str().unwrap_or_default();
        assert_eq!(id.split(':').count(), 4, "{m}");
        assert_eq!(id.ends_with(":-1"), n == "single", "batch index of {m}");
    }
    b.assert_running();
}

/// Pulsar produce → native CLI consume with each codec: a compressed batch
/// is seen as its messages, and a compressed single message as itself, with
/// payloads byte for byte, keys and properties.
#[test]
fn pulsar_cross_compressed_pulsar_to_native() {
    let (_dir, mut b) = broker("pulsar-cross-p2n-z");
    let topic = "persistent://public/default/p2nz";
    run_pulsar_test(&pulsar_url(&b), "cross_produce_compressed", topic, &[], PY_TIMEOUT);
    let mut consume = ConsumeCmd::new(&pulsar_url(&b), topic, "native");
    consume.count = 20;
    let got = consume.run(CLI_TIMEOUT);
    assert_eq!(got.len(), 20, "{got:?}");
    for (k, m) in got.iter().enumerate() {
        let (n, i) = (k / 5, k % 5);
        let (tag, key, mut props) = if i < 4 {
            (i as u8, format!("c{n}-{i}"), vec![("codec".to_string(), n.to_string()), ("i".to_string(), i.to_string())])
        } else {
            (9, format!("c{n}-single"), vec![("codec".to_string(), n.to_string())])
        };
        assert_eq!(m.payload, [n as u8, tag, 0, 255].repeat(100), "message {k}: {m:?}");
        assert_eq!(m.key.as_deref(), Some(key.as_str()), "message {k}");
        let mut got_props = m.properties.clone();
        got_props.sort();
        props.sort();
        assert_eq!(got_props, props, "message {k}");
        assert_eq!(m.id.batch_index >= 0, i < 4, "message {k}: {:?}", m.id);
    }
    b.assert_running();
    assert!(!b.log().contains("cannot deliver"), "{}", b.log_tail());
}

fn base64_decode(s: &str) -> Vec<u8> {
    use base64::Engine;
    base64::engine::general_purpose::STANDARD.decode(s).unwrap_or_else(|e| panic!("{e}: {s}"))
}
