//! The bench binary against a real broker it starts itself.
//!
//! Goal: a short run produces a JSON result with every contract field and an
//! SVG picture, and `--compare` reads it back. Method: build the broker
//! binary (through the e2e harness's `magnetar_bin`), run `magnetar-bench`
//! for 2 s with `--broker-bin`, parse the JSON.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::Path;
use std::process::Command;
use std::time::Duration;

const BENCH: &str = env!("CARGO_BIN_EXE_magnetar-bench");

fn run_bench(args: &[&str]) -> std::process::Output {
    // The child is bounded by its own flags (2 s + drain); the harness's
    // timeout guards against a hang.
    let mut child = Command::new(BENCH)
        .args(args)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    loop {
        if child.try_wait().unwrap().is_some() {
            return child.wait_with_output().unwrap();
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("magnetar-bench did not finish within 120 s");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// `run_bench` against a broker it starts itself from `broker`, data under
/// `dir`, two unpinned shards, plus `args`.
fn run_self_started(broker: &Path, dir: &Path, args: &[&str]) -> std::process::Output {
    let mut all = vec![
        "--broker-bin",
        broker.to_str().unwrap(),
        "--data-dir",
        dir.to_str().unwrap(),
        "--shards",
        "2",
        "--no-pin",
    ];
    all.extend_from_slice(args);
    run_bench(&all)
}

/// `run_self_started` with `args` plus `--json`, `--no-history` and `-q`:
/// the run must succeed; its JSON result.
fn run_for_json(broker: &Path, dir: &Path, args: &[&str]) -> serde_json::Value {
    let json = dir.join("run.json");
    let mut all = args.to_vec();
    all.extend_from_slice(&["--json", json.to_str().unwrap(), "--no-history", "-q"]);
    let out = run_self_started(broker, dir, &all);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed\nstderr:\n{stderr}");
    serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap()
}

/// The shard owning `topic` on the two-shard broker these tests start, by
/// the broker's own ownership rule.
fn owner_shard(topic: &str) -> u64 {
    u64::from(magnetar_tests::owner_shard(topic, 2))
}

fn number(v: &serde_json::Value, path: &str) -> f64 {
    path.split('.')
        .try_fold(v, |v, k| v.get(k))
        .and_then(|v| v.as_f64())
        .unwrap_or_else(|| panic!("{path} missing or not a number"))
}

#[test]
fn short_run_writes_contract_json_and_svg() {
    let broker = magnetar_tests::magnetar_bin();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let json = dir.path().join("run.json");
    let svg = dir.path().join("run.svg");
    let history = dir.path().join("history.jsonl");
    let out = run_self_started(
        broker,
        dir.path(),
        &[
            // Not a watermark test: refuse produce only on a completely full disk.
            "--broker-arg",
            "--disk-refuse-pct=100",
            "--duration-s",
            "2",
            "--warmup-s",
            "0.5",
            "--max-pending",
            "200",
            "--json",
            json.to_str().unwrap(),
            "--plot",
            svg.to_str().unwrap(),
            "--history",
            history.to_str().unwrap(),
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("prod") && stderr.contains("backlog"), "progress lines on stderr:\n{stderr}");
    assert!(stdout.contains("publish latency") && stdout.contains("end-to-end latency"), "{stdout}");

    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    for path in [
        "produce.msgs_per_s",
        "produce.mb_per_s",
        "consume.msgs_per_s",
        "publish_latency_ms.p50",
        "publish_latency_ms.p99",
        "publish_latency_ms.p999",
        "publish_latency_ms.max",
        "e2e_latency_ms.p50",
        "e2e_latency_ms.p99",
        "e2e_latency_ms.p999",
        "e2e_latency_ms.max",
    ] {
        let x = number(&v, path);
        assert!(x > 0.0 && x.is_finite(), "{path} = {x}");
    }
    let p = &v["publish_latency_ms"];
    assert!(number(p, "p50") <= number(p, "p99") && number(p, "p99") <= number(p, "max"));
    // 1 KiB messages: MB/s and msg/s agree.
    let ratio = number(&v, "produce.mb_per_s") * 1e6 / number(&v, "produce.msgs_per_s");
    assert!((ratio - 1024.0).abs() < 1.0, "{ratio}");
    assert_eq!(v["workload"]["partitions"], 4);
    // The canonical workload batches as Pulsar's clients do by default, and
    // the result says so in words as well as in the settings.
    assert_eq!(v["workload"]["batch_max_messages"], 1000);
    let batching = v["batching"].as_str().unwrap();
    assert!(batching.starts_with("on") && batching.contains("Pulsar's client defaults"), "{batching}");
    assert!(v["max_pending_counts"].as_str().unwrap().starts_with("messages"));
    assert!(stdout.contains("batching on"), "{stdout}");
    assert_eq!(v["topics"].as_array().unwrap().len(), 4);
    // Each partition's owning shard, as the broker assigns it by default.
    let owners: Vec<u64> = v["topics"].as_array().unwrap().iter().map(|t| owner_shard(t.as_str().unwrap())).collect();
    let shards: Vec<u64> = v["topic_shards"].as_array().unwrap().iter().map(|s| s.as_u64().unwrap()).collect();
    assert_eq!(shards, owners, "topic_shards names each partition's owner");
    assert!(v["drained"].as_bool().unwrap(), "consumer got every acknowledged message");
    assert_eq!(v["environment"]["broker"], "self-started");
    assert!(!v["histograms"]["publish"].as_array().unwrap().is_empty());
    assert!(v["timeline"].as_array().unwrap().len() >= 2);
    assert!(v["git_commit"].as_str().unwrap().len() >= 7);

    let picture = std::fs::read_to_string(&svg).unwrap();
    assert!(picture.starts_with("<svg") && picture.contains("<polyline"), "{}", &picture[..200.min(picture.len())]);
    let lines = std::fs::read_to_string(&history).unwrap();
    assert_eq!(lines.lines().count(), 1);

    let cmp = run_bench(&["--compare", json.to_str().unwrap(), json.to_str().unwrap()]);
    let text = String::from_utf8_lossy(&cmp.stdout);
    assert!(cmp.status.success() && text.contains("1.000x same"), "{text}");
    assert!(!Path::new(&dir.path().join("run-")).exists());
}

/// Batching, a codec and a Shared subscription reach a real broker: every
/// acknowledged message arrives (counted per message, not per batch), and
/// the settings are recorded in the result.
#[test]
fn batched_compressed_shared_run_drains() {
    let broker = magnetar_tests::magnetar_bin();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let v = run_for_json(
        broker,
        dir.path(),
        &[
            "--duration-s",
            "1",
            "--warmup-s",
            "0.2",
            "--max-pending",
            "50",
            "--batch-max-messages",
            "50",
            "--batch-max-delay-ms",
            "2",
            "--compression",
            "lz4",
            "--subscription-type",
            "shared",
            "--consumers",
            "2",
        ],
    );
    assert!(number(&v, "produce.msgs_per_s") > 0.0);
    assert_eq!(v["publish_errors"], 0, "{}", v["last_error"]);
    assert!(v["drained"].as_bool().unwrap(), "both Shared consumers together got every acknowledged message");
    let w = &v["workload"];
    assert_eq!((w["batch_max_messages"].as_u64(), w["batch_max_delay_ms"].as_u64()), (Some(50), Some(2)));
    assert_eq!((w["compression"].as_str(), w["subscription_type"].as_str()), (Some("lz4"), Some("shared")));
    assert_eq!(v["topics"].as_array().unwrap().len(), 4);
}

/// `--sustainable` searches a rate (a line per step on stderr, the steps in
/// the JSON), then measures at it: the measured window's producers follow
/// the rate found (never faster), and the search stops by `--search-max-s`.
#[test]
fn sustainable_search_then_measures_at_the_rate_found() {
    let broker = magnetar_tests::magnetar_bin();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let json = dir.path().join("run.json");
    let out = run_self_started(
        broker,
        dir.path(),
        &[
            "--broker-arg",
            "--disk-refuse-pct=100",
            "--sustainable",
            "--rate",
            "2000",
            "--search-max-s",
            "5",
            "--duration-s",
            "2",
            "--warmup-s",
            "0.5",
            "--json",
            json.to_str().unwrap(),
            "--no-history",
        ],
    );
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "bench failed\nstdout:\n{stdout}\nstderr:\n{stderr}");
    assert!(stderr.contains("[search") && stderr.contains("tried"), "a line per search step:\n{stderr}");
    assert!(stdout.contains("sustainable rate:"), "{stdout}");
    let v: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["workload"]["sustainable"], true);
    let found = &v["sustainable"];
    let rate = number(found, "rate");
    let steps = found["steps"].as_array().unwrap();
    assert!(!steps.is_empty() && steps.len() <= 6, "one step per second of a 5 s search: {steps:?}");
    assert_eq!(number(&steps[0], "rate"), 2000.0, "the search starts at --rate");
    assert!(number(found, "search_s") < 5.0 + 1.5, "{found}");
    assert!(found["held"].is_boolean(), "{found}");
    // Paced: the window produced no faster than the rate found (allowing for
    // the window's edges).
    let produced = number(&v, "produce.msgs_per_s");
    assert!(produced > 0.0 && produced <= rate * 1.05, "produced {produced} msg/s at a rate of {rate}");
    assert!(steps.iter().any(|s| s["verdict"] == "kept"), "{steps:?}");
    assert!(v["timeline"].as_array().unwrap().iter().any(|t| t["phase"] == "search"));
}

/// `--topic-shard` places a one-partition run on the shard asked for (the
/// unbatched figures depend on it), records it in the result, and refuses a
/// shard the broker does not have with a message that says so.
#[test]
fn topic_shard_places_the_run() {
    let broker = magnetar_tests::magnetar_bin();
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for shard in ["1", "0"] {
        let v = run_for_json(
            broker,
            dir.path(),
            &[
                "--duration-s",
                "0.5",
                "--warmup-s",
                "0",
                "--partitions",
                "1",
                "--batch-max-messages",
                "0",
                "--topic-shard",
                shard,
            ],
        );
        let want: u64 = shard.parse().unwrap();
        assert_eq!(v["workload"]["topic_shard"], want);
        assert_eq!(v["topic_shards"], serde_json::json!([want]), "the producer's connection found its owner there");
        let topic = v["topics"][0].as_str().unwrap();
        assert_eq!(owner_shard(topic), want, "by the broker's rule, {topic}");
        assert!(v["drained"].as_bool().unwrap());
    }
    let out =
        run_self_started(broker, dir.path(), &["--duration-s", "0.5", "--topic-shard", "2", "--no-history", "-q"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "a third shard of two does not exist");
    assert!(stderr.contains("--topic-shard 2") && stderr.contains("shards seen: 0 to 1"), "{stderr}");
}
