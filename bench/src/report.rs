//! Results: the JSON document of a run (a contract for scripts), the
//! history file, the printed summary, and `--compare`.

use crate::pace::SearchResult;
use crate::run::{BacklogResult, RunOutcome};
use crate::stats::{Percentiles, Tick};
use crate::workload::Workload;
use hdrhistogram::Histogram;
use serde::Serialize;
use serde_json::Value;
use std::io::Write;
use std::path::Path;

/// Bumped when a contract field changes meaning.
pub const REPORT_SCHEMA: u32 = 1;

#[derive(Debug, Clone, Serialize)]
pub struct Throughput {
    /// Events inside the measured window.
    pub msgs: u64,
    pub bytes: u64,
    pub msgs_per_s: f64,
    pub mb_per_s: f64,
}

#[derive(Debug, Clone, Serialize)]
pub struct Environment {
    pub hostname: String,
    pub cpus: usize,
    pub kernel: String,
    /// `self-started` or `external`.
    pub broker: String,
    pub url: String,
    pub server_version: String,
    pub data_dir: Option<String>,
    pub broker_args: Vec<String>,
    /// Producers and consumers connected straight to the port of the shard
    /// owning their topic (the client is shard-aware and the broker
    /// announced more than one shard port).
    pub shard_aware: bool,
}

#[derive(Debug, Clone, Serialize)]
pub struct Histograms {
    pub unit: &'static str,
    /// `[value, count]` for every recorded bucket (HdrHistogram, 3 significant digits).
    pub publish: Vec<[u64; 2]>,
    pub e2e: Vec<[u64; 2]>,
}

/// The JSON of one run. `produce.msgs_per_s`, `produce.mb_per_s`,
/// `consume.msgs_per_s`, `publish_latency_ms.{p50,p99,p999,max}` and
/// `e2e_latency_ms.{p50,p99,p999,max}` are a contract.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    pub schema: u32,
    pub tool: &'static str,
    pub run_id: String,
    /// Unix seconds at the end of the run.
    pub finished_at: u64,
    pub git_commit: String,
    pub git_dirty: bool,
    pub workload: Workload,
    /// The producers' batching in words, so that nobody reads a batched
    /// figure as an unbatched one (the canonical workload batches as
    /// Pulsar's clients do by default).
    pub batching: String,
    /// What `workload.max_pending` bounds.
    pub max_pending_counts: &'static str,
    /// Partition topics this run used (`<topic>-partition-<i>`).
    pub topics: Vec<String>,
    /// The broker shard owning each of `topics`, as the producers'
    /// shard-aware connections found it; empty when the client was not
    /// shard-aware or no producer ran.
    pub topic_shards: Vec<u32>,
    pub environment: Environment,
    pub measured_s: f64,
    pub produce: Throughput,
    pub consume: Throughput,
    pub publish_errors: u64,
    pub last_error: Option<String>,
    pub publish_latency_ms: Percentiles,
    pub e2e_latency_ms: Percentiles,
    pub backlog: Option<BacklogResult>,
    /// The sustainable-rate search (`--sustainable`): the rate found, its
    /// steps, and whether the measured window held it; null otherwise.
    pub sustainable: Option<SearchResult>,
    /// Every acknowledged message reached every subscription by the end.
    pub drained: bool,
    /// CPU seconds of the client and (self-started) broker over the run,
    /// and per message (warm-up and drain included).
    pub cpu: crate::cpu::CpuUse,
    pub timeline: Vec<Tick>,
    pub histograms: Histograms,
}

fn buckets(h: &Histogram<u64>) -> Vec<[u64; 2]> {
    h.iter_recorded().map(|v| [v.value_iterated_to(), v.count_at_value()]).collect()
}

fn command_output(cmd: &mut std::process::Command) -> Option<String> {
    let out = cmd.output().ok()?;
    out.status.success().then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// The commit of the source tree this binary was built from (it lives in
/// `<repo>/target/...`), else of the current directory; `unknown` outside git.
pub fn git_commit() -> (String, bool) {
    let dirs: Vec<std::path::PathBuf> = crate::broker::exe_dir().into_iter().chain([".".into()]).collect();
    for dir in dirs {
        if let Some(commit) =
            command_output(std::process::Command::new("git").arg("-C").arg(&dir).args(["rev-parse", "HEAD"]))
        {
            let dirty = command_output(std::process::Command::new("git").arg("-C").arg(&dir).args([
                "status",
                "--porcelain",
                "--untracked-files=no",
            ]))
            .is_some_and(|s| !s.is_empty());
            return (commit, dirty);
        }
    }
    ("unknown".into(), false)
}

pub fn environment(
    url: &str,
    self_started: bool,
    server_version: String,
    data_dir: Option<String>,
    broker_args: Vec<String>,
    shard_aware: bool,
) -> Environment {
    let read = |p: &str| std::fs::read_to_string(p).map(|s| s.trim().to_string()).unwrap_or_default();
    Environment {
        hostname: read("/proc/sys/kernel/hostname"),
        cpus: std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        kernel: read("/proc/sys/kernel/osrelease"),
        broker: if self_started { "self-started" } else { "external" }.into(),
        url: url.into(),
        server_version,
        data_dir,
        broker_args,
        shard_aware,
    }
}

/// `batching` of the JSON and the summary.
pub fn batching_words(w: &Workload) -> String {
    match w.batching() {
        Some(b) => format!(
            "on: a batch leaves at {} messages, {} bytes or {} ms{}",
            b.max_messages,
            b.max_bytes,
            b.max_delay.as_millis(),
            if (b.max_messages, b.max_bytes, b.max_delay.as_millis()) == (1000, 128 * 1024, 1) {
                " (Pulsar's client defaults)"
            } else {
                ""
            }
        ),
        None => "off: one message per send".into(),
    }
}

pub fn build(workload: &Workload, outcome: &RunOutcome, environment: Environment) -> Report {
    let t = &outcome.totals;
    let secs = t.window.as_secs_f64().max(1e-9);
    let (git_commit, git_dirty) = git_commit();
    let finished_at =
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let mut consume = Throughput {
        msgs: t.consumed_msgs,
        bytes: t.consumed_bytes,
        msgs_per_s: t.consumed_msgs as f64 / secs,
        mb_per_s: t.consumed_bytes as f64 / secs / 1e6,
    };
    if let Some(b) = &outcome.backlog {
        // A backlog run's consume figures are the catch-up read.
        consume = Throughput {
            msgs: b.messages,
            bytes: b.bytes,
            msgs_per_s: b.consume_msgs_per_s,
            mb_per_s: b.consume_mb_per_s,
        };
    }
    Report {
        schema: REPORT_SCHEMA,
        tool: "magnetar-bench",
        run_id: outcome.run_id.clone(),
        finished_at,
        git_commit,
        git_dirty,
        workload: workload.clone(),
        batching: batching_words(workload),
        max_pending_counts:
            "messages awaiting a receipt, per producer and partition (a batch counts as the messages it holds)",
        topics: outcome.topics.clone(),
        topic_shards: outcome.topic_shards.clone(),
        environment,
        measured_s: secs,
        produce: Throughput {
            msgs: t.produced_msgs,
            bytes: t.produced_bytes,
            msgs_per_s: t.produced_msgs as f64 / secs,
            mb_per_s: t.produced_bytes as f64 / secs / 1e6,
        },
        consume,
        publish_errors: t.publish_errors,
        last_error: t.last_error.clone(),
        publish_latency_ms: Percentiles::of(&t.publish),
        e2e_latency_ms: Percentiles::of(&t.e2e),
        backlog: outcome.backlog.clone(),
        sustainable: outcome.search.clone(),
        drained: outcome.drained,
        cpu: outcome.cpu,
        timeline: t.ticks.clone(),
        histograms: Histograms { unit: "ns", publish: buckets(&t.publish), e2e: buckets(&t.e2e) },
    }
}

/// Write the report as pretty JSON.
pub fn write_json(report: &Report, path: &Path) -> std::io::Result<()> {
    let text = serde_json::to_string_pretty(report).map_err(std::io::Error::other)?;
    std::fs::write(path, text + "\n")
}

/// Append the report as one line to a JSON-lines history file.
pub fn append_history(report: &Report, path: &Path) -> std::io::Result<()> {
    if let Some(parent) = path.parent() {
        if !parent.as_os_str().is_empty() {
            std::fs::create_dir_all(parent)?;
        }
    }
    let line = serde_json::to_string(report).map_err(std::io::Error::other)?;
    let mut f = std::fs::OpenOptions::new().create(true).append(true).open(path)?;
    writeln!(f, "{line}")
}

fn lat_line(name: &str, p: &Percentiles) -> String {
    format!(
        "{name:<19} p50 {:.3}  p90 {:.3}  p99 {:.3}  p99.9 {:.3}  p99.99 {:.3}  max {:.3}  (ms, {} samples)",
        p.p50, p.p90, p.p99, p.p999, p.p9999, p.max, p.count
    )
}

/// The rate of a run in words: `max`, `N msg/s`, or the sustainable rate found.
pub fn rate_words(w: &Workload, found: Option<&SearchResult>) -> String {
    match found {
        Some(f) => format!("sustainable ({:.0} msg/s)", f.rate),
        None if w.rate == 0 => "max".to_string(),
        None => format!("{} msg/s", w.rate),
    }
}

/// The human summary printed at the end.
pub fn summary(r: &Report) -> String {
    let w = &r.workload;
    let rate = rate_words(w, r.sustainable.as_ref());
    let mut s = format!(
        "magnetar-bench {}: {} topic(s) x {} partition(s), {} producer(s)/topic, {} subscription(s) x {} consumer(s), size {} B, rate {}, max_pending {} msgs/partition\n",
        r.run_id, w.topics, w.partitions, w.producers, w.subscriptions, w.consumers, w.size, rate, w.max_pending
    );
    s += &format!("batching {}\n", r.batching);
    if let Some(found) = &r.sustainable {
        let kept = found.steps.iter().filter(|s| s.verdict == crate::pace::Verdict::Kept).count();
        s += &format!(
            "sustainable rate: {:.0} msg/s, found in {:.1} s ({} steps, {} kept){}; measured window {}\n",
            found.rate,
            found.search_s,
            found.steps.len(),
            kept,
            if found.converged { "" } else { ", NOT settled (search_max_s ran out)" },
            match found.held {
                Some(true) => "held it",
                Some(false) => "did NOT hold it (produced or received under 99 %)",
                None => "not judged",
            }
        );
    }
    if let Some(b) = &r.backlog {
        s += &format!(
            "backlog phase: {} msgs ({:.1} MB) produced in {:.2} s ({:.0} msg/s, {:.1} MB/s); caught up in {:.2} s: {:.0} msg/s, {:.1} MB/s\n",
            b.messages, b.bytes as f64 / 1e6, b.produce_s, b.produce_msgs_per_s, b.produce_mb_per_s, b.catchup_s,
            b.consume_msgs_per_s, b.consume_mb_per_s
        );
        if let Some(c) = &b.catchup_cpu {
            s += &format!(
                "catch-up cpu per message: client {:.2} us, broker {}\n",
                c.client_us_per_msg,
                c.broker_us_per_msg.map(|v| format!("{v:.2} us")).unwrap_or_else(|| "unknown (external)".into()),
            );
        }
    } else {
        s += &format!("measured {:.1} s after {:.1} s warm-up\n", r.measured_s, w.warmup_s);
    }
    s += &format!(
        "produce: {:>10.0} msg/s {:>8.1} MB/s  ({} msgs, {} errors)\n",
        r.produce.msgs_per_s, r.produce.mb_per_s, r.produce.msgs, r.publish_errors
    );
    s += &format!(
        "consume: {:>10.0} msg/s {:>8.1} MB/s  ({} msgs)\n",
        r.consume.msgs_per_s, r.consume.mb_per_s, r.consume.msgs
    );
    s += &lat_line("publish latency", &r.publish_latency_ms);
    s.push('\n');
    s += &lat_line("end-to-end latency", &r.e2e_latency_ms);
    s.push('\n');
    s += &format!(
        "cpu per message: client {:.2} us, broker {} ({} msgs, warm-up and drain included)\n",
        r.cpu.client_us_per_msg,
        r.cpu.broker_us_per_msg.map(|v| format!("{v:.2} us")).unwrap_or_else(|| "unknown (external)".into()),
        r.cpu.messages
    );
    if let Some(e) = &r.last_error {
        s += &format!("last publish error: {e}\n");
    }
    if !r.drained {
        s += "WARNING: consumers did not receive every acknowledged message by the end of the run\n";
    }
    s
}

/// Metrics `--compare` prints: (JSON path, higher is better).
pub const COMPARED: &[(&str, bool)] = &[
    ("produce.msgs_per_s", true),
    ("produce.mb_per_s", true),
    ("consume.msgs_per_s", true),
    ("consume.mb_per_s", true),
    ("publish_latency_ms.p50", false),
    ("publish_latency_ms.p90", false),
    ("publish_latency_ms.p99", false),
    ("publish_latency_ms.p999", false),
    ("publish_latency_ms.p9999", false),
    ("publish_latency_ms.max", false),
    ("e2e_latency_ms.p50", false),
    ("e2e_latency_ms.p90", false),
    ("e2e_latency_ms.p99", false),
    ("e2e_latency_ms.p999", false),
    ("e2e_latency_ms.p9999", false),
    ("e2e_latency_ms.max", false),
    ("cpu.broker_us_per_msg", false),
    ("cpu.client_us_per_msg", false),
    ("sustainable.rate", true),
    ("backlog.consume_msgs_per_s", true),
    ("backlog.consume_mb_per_s", true),
    ("backlog.catchup_cpu.broker_us_per_msg", false),
    ("backlog.catchup_cpu.client_us_per_msg", false),
];

fn lookup(v: &Value, path: &str) -> Option<f64> {
    path.split('.').try_fold(v, |v, k| v.get(k))?.as_f64()
}

/// Compare two reports: a table of A, B and B/A for each metric present in
/// both; a verdict says whether B is better (↑ better throughput, ↓ lower latency).
pub fn compare(a: &Value, b: &Value) -> String {
    let mut s = format!("{:<28} {:>14} {:>14} {:>9}\n", "metric", "A", "B", "B/A");
    for (path, higher_better) in COMPARED {
        let (Some(x), Some(y)) = (lookup(a, path), lookup(b, path)) else { continue };
        let ratio = if x != 0.0 { y / x } else { f64::NAN };
        let verdict = if !ratio.is_finite() || (ratio - 1.0).abs() < 0.02 {
            "same"
        } else if (ratio > 1.0) == *higher_better {
            "better"
        } else {
            "worse"
        };
        s += &format!("{path:<28} {x:>14.3} {y:>14.3} {ratio:>8.3}x {verdict}\n");
    }
    for key in ["git_commit", "run_id"] {
        if let (Some(x), Some(y)) = (a.get(key).and_then(Value::as_str), b.get(key).and_then(Value::as_str)) {
            s += &format!("{key:<28} {x} -> {y}\n");
        }
    }
    if a.get("workload") != b.get("workload") {
        s += "note: the two runs used different workloads\n";
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compare_prints_ratios_and_verdicts() {
        let a = serde_json::json!({"produce": {"msgs_per_s": 100.0}, "publish_latency_ms": {"p99": 2.0}, "workload": {"size": "1024"}});
        let b = serde_json::json!({"produce": {"msgs_per_s": 150.0}, "publish_latency_ms": {"p99": 4.0}, "workload": {"size": "100"}});
        let out = compare(&a, &b);
        assert!(out.contains("produce.msgs_per_s") && out.contains("1.500x better"), "{out}");
        assert!(out.contains("publish_latency_ms.p99") && out.contains("2.000x worse"), "{out}");
        assert!(out.contains("different workloads"));
        assert!(!out.contains("e2e_latency_ms"), "absent metrics are skipped");
    }
}
