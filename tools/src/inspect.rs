//! `magnetar inspect DATA_DIR`: an offline look at a broker's data directory
//! without a running broker: shards, segments, ledgers, topics and cursors;
//! `--verify` checks every batch, record and index checksum; `--dump` prints
//! entries. Reads with plain `std` I/O through
//! `magnetar_storage::inspect::ShardImage` (the same format code recovery
//! uses) and never writes.

use bytes::Bytes;
use magnetar_core::cursor::CursorRecord;
use magnetar_storage::inspect::{ScanMode, ShardImage, Tail};
use serde_json::{json, Value};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct InspectArgs {
    /// The broker's data directory (holding `shard-<i>/`), or one shard directory.
    pub data_dir: PathBuf,
    /// Check every batch and record checksum from the first segment on, and
    /// every index entry against its record. Exits non-zero naming the file
    /// and offset of the first damage.
    #[arg(long)]
    pub verify: bool,
    /// Print entries of a ledger: `LEDGER[:FROM[:COUNT]]` (COUNT defaults to all).
    #[arg(long, value_name = "LEDGER[:FROM[:COUNT]]")]
    pub dump: Option<String>,
    /// Output format.
    #[arg(long, value_enum, default_value = "text")]
    pub output: Output,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Output {
    Text,
    Json,
}

#[derive(Debug, thiserror::Error)]
pub enum InspectError {
    #[error("{0}")]
    Storage(#[from] magnetar_storage::StorageError),
    #[error("{path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{0}")]
    Usage(String),
}

/// Shard directories under `dir` (sorted by shard number), or `dir` itself.
fn shard_dirs(dir: &Path) -> Result<Vec<(String, PathBuf)>, InspectError> {
    if ShardImage::is_shard_dir(dir) {
        let name = dir.file_name().map_or_else(|| dir.display().to_string(), |n| n.to_string_lossy().into_owned());
        return Ok(vec![(name, dir.to_path_buf())]);
    }
    let rd = std::fs::read_dir(dir).map_err(|source| InspectError::Io { path: dir.display().to_string(), source })?;
    let mut out = Vec::new();
    for ent in rd.flatten() {
        let name = ent.file_name().to_string_lossy().into_owned();
        if let Some(n) = name.strip_prefix("shard-").and_then(|n| n.parse::<u32>().ok()) {
            if ShardImage::is_shard_dir(&ent.path()) {
                out.push((n, name, ent.path()));
            }
        }
    }
    out.sort();
    if out.is_empty() {
        return Err(InspectError::Usage(format!("{}: no shard directories (shard-<i>/log) found", dir.display())));
    }
    Ok(out.into_iter().map(|(_, name, p)| (name, p)).collect())
}

/// `LEDGER[:FROM[:COUNT]]`.
fn parse_dump(s: &str) -> Result<(u64, u64, Option<u64>), InspectError> {
    let bad = || InspectError::Usage(format!("--dump {s:?}: expected LEDGER[:FROM[:COUNT]] (numbers)"));
    let mut it = s.split(':');
    let ledger = it.next().and_then(|v| v.parse().ok()).ok_or_else(bad)?;
    let from = match it.next() {
        Some(v) => v.parse().map_err(|_| bad())?,
        None => 0,
    };
    let count = match it.next() {
        Some(v) => Some(v.parse().map_err(|_| bad())?),
        None => None,
    };
    if it.next().is_some() {
        return Err(bad());
    }
    Ok((ledger, from, count))
}

/// Prints a progress line to stderr about once a second once a scan has run
/// for a second (a verify of a large log takes a while).
struct Progress {
    label: String,
    started: Instant,
    last: Instant,
    shown: bool,
    tty: bool,
}

impl Progress {
    fn new(label: String) -> Self {
        let now = Instant::now();
        Progress { label, started: now, last: now, shown: false, tty: std::io::stderr().is_terminal() }
    }

    fn update(&mut self, done: u64, total: u64) {
        let now = Instant::now();
        if now.duration_since(self.started) < Duration::from_secs(1)
            || now.duration_since(self.last) < Duration::from_secs(1)
        {
            return;
        }
        self.last = now;
        self.shown = true;
        let secs = now.duration_since(self.started).as_secs_f64();
        let mib = done as f64 / (1 << 20) as f64;
        // `total` is the scan's estimate from the segment sizes it knew when
        // it started; reads past it (index files, relocated copies, a
        // rolled-over batch) must not show as more than "at most".
        let total = total.max(done);
        let line = format!(
            "{}: {:.0} of at most {:.0} MiB read ({:.0} MiB/s)",
            self.label,
            mib,
            total as f64 / (1 << 20) as f64,
            mib / secs.max(0.001)
        );
        let mut err = std::io::stderr();
        let _ = if self.tty { write!(err, "\r{line}") } else { writeln!(err, "{line}") };
    }

    fn finish(&self) {
        if self.shown && self.tty {
            eprintln!();
        }
    }
}

pub fn run(args: InspectArgs) -> Result<(), InspectError> {
    let dump = args.dump.as_deref().map(parse_dump).transpose()?;
    let mode = if args.verify { ScanMode::Verify } else { ScanMode::Tail };
    let mut shards = Vec::new();
    let mut images = Vec::new();
    for (name, dir) in shard_dirs(&args.data_dir)? {
        let label = format!("{} {name}", if args.verify { "verifying" } else { "reading" });
        let mut progress = Progress::new(label);
        let loaded = ShardImage::load(&dir, mode, &mut |d, t| progress.update(d, t));
        progress.finish();
        let img = loaded?;
        shards.push(shard_json(&name, &img));
        images.push((name, img));
    }

    let mut dumped = Vec::new();
    if let Some((ledger, from, count)) = dump {
        // Ledger ids are unique across shards; find the shard that has it.
        let Some((_, img)) = images.iter().find(|(_, i)| i.ledgers.contains_key(&ledger)) else {
            return Err(InspectError::Usage(format!("ledger {ledger} not found in any shard")));
        };
        let n = img.ledgers[&ledger].index.len() as u64;
        let end = count.map_or(n, |c| from.saturating_add(c).min(n));
        for entry in from..end {
            let (ie, body) = img.read_entry(ledger, entry)?;
            dumped.push(entry_json(ledger, entry, ie.position, ie.extras.publish_time_ms, ie.extras.key_hash, body));
        }
    }

    match args.output {
        Output::Json => {
            let mut v = json!({
                "data_dir": args.data_dir.display().to_string(),
                "verified": args.verify,
                "shards": shards,
            });
            if dump.is_some() {
                v["entries"] = Value::Array(dumped);
            }
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
        }
        Output::Text => {
            println!("data directory {}", args.data_dir.display());
            for (name, img) in &images {
                print_shard(name, img, args.verify);
            }
            for e in &dumped {
                print_entry(e);
            }
        }
    }
    Ok(())
}

fn mib(b: u64) -> String {
    format!("{:.1} MiB", b as f64 / (1 << 20) as f64)
}

/// What a metadata key and value mean, as JSON.
fn meta_json(k: &[u8], v: &[u8]) -> Value {
    if let Some(topic) = k.strip_prefix(b"t/") {
        let topic = String::from_utf8_lossy(topic);
        return match magnetar_core::ledgers::decode_topic_record(v) {
            Some(ledgers) => {
                let current = ledgers.last().map(|l| l.id);
                let list: Vec<Value> = ledgers
                    .iter()
                    .map(|l| {
                        json!({"ledger": l.id, "first": l.first, "entries": l.entries, "bytes": l.bytes,
                               "created_ms": l.created_ms, "closed_ms": l.closed_ms})
                    })
                    .collect();
                json!({"kind": "topic", "topic": topic, "ledger": current, "ledgers": list})
            }
            None => json!({"kind": "topic", "topic": topic, "error": "unknown topic record format", "bytes": v.len()}),
        };
    }
    if let Some(rest) = k.strip_prefix(b"c/") {
        let rest = String::from_utf8_lossy(rest);
        let (topic, sub) = rest.split_once('\n').unwrap_or((&rest, ""));
        return match CursorRecord::decode(v) {
            Ok(c) => {
                let acked: Vec<Value> = c
                    .acked
                    .iter()
                    .map(|(l, ranges)| {
                        let r: Vec<Value> = ranges.iter().map(|(a, b)| json!([a, b])).collect();
                        json!({"ledger": l, "ranges": r})
                    })
                    .collect();
                json!({"kind": "cursor", "topic": topic, "subscription": sub,
                       "mark_delete": format!("{}:{}", c.mark_delete_ledger, c.mark_delete_entry),
                       "acked": acked})
            }
            Err(e) => json!({"kind": "cursor", "topic": topic, "subscription": sub, "error": e.to_string()}),
        };
    }
    json!({"kind": "other", "key": String::from_utf8_lossy(k), "bytes": v.len()})
}

fn tail_json(t: &Tail) -> Value {
    match t {
        Tail::Clean { position } => json!({"state": "clean", "position": position}),
        Tail::End { position } => json!({"state": "end", "position": position}),
        Tail::Torn { position, file, offset, bytes, reason } => json!({
            "state": "torn", "position": position, "file": file.display().to_string(),
            "offset": offset, "bytes": bytes, "reason": reason.to_string(),
        }),
    }
}

fn shard_json(name: &str, img: &ShardImage) -> Value {
    let segments: Vec<Value> = img
        .segments
        .iter()
        .map(|s| {
            json!({"file": s.path.display().to_string(), "start": s.start, "file_bytes": s.file_bytes,
                   "batches_scanned": s.batches, "entries": s.entries, "entry_bytes": s.entry_bytes})
        })
        .collect();
    let ledgers: Vec<Value> = img
        .ledgers
        .iter()
        .map(|(id, l)| json!({"ledger": id, "entries": l.index.len(), "bytes": l.bytes, "indexed": l.indexed}))
        .collect();
    let meta: Vec<Value> = img.meta.iter().map(|(k, v)| meta_json(k, v)).collect();
    let c = &img.checked;
    json!({
        "shard": name,
        "dir": img.dir.display().to_string(),
        "clean_shutdown": img.clean,
        "checkpoint": img.checkpoint.as_ref().map(|c| json!({"seq": c.ckpt_seq, "position": c.position,
            "next_batch_seq": c.next_batch_seq, "ledgers": c.ledgers.len(), "meta_keys": c.meta.len(),
            "relocations": c.relocations.len()})),
        "tail": tail_json(&img.tail),
        "segments": segments,
        "ledgers": ledgers,
        "metadata": meta,
        "checked": {"bytes_scanned": c.bytes_scanned, "batches": c.batches, "records": c.records,
                    "index_pages": c.index_pages, "index_entries": c.index_entries},
        "stray_files": img.stray_files.iter().map(|p| p.display().to_string()).collect::<Vec<_>>(),
        "key_files": img.key_files.iter().map(|k| json!({"file": k.path.display().to_string(), "seq": k.header.seq,
            "items": k.header.items, "ledgers": k.header.ledgers.len(), "min_publish_time_ms": k.header.min_time_ms,
            "max_publish_time_ms": k.header.max_time_ms})).collect::<Vec<_>>(),
        "key_pages_checked": c.key_pages,
    })
}

fn print_shard(name: &str, img: &ShardImage, verified: bool) {
    let state =
        if img.clean { "clean shutdown" } else { "not shut down cleanly (the broker scans from the checkpoint)" };
    println!("\n{name} ({}): {state}", img.dir.display());
    match &img.checkpoint {
        Some(c) => println!(
            "  checkpoint #{} at log position {} (batch {}), {} ledgers indexed, {} metadata keys, {} entries relocated by compaction",
            c.ckpt_seq,
            c.position,
            c.next_batch_seq,
            c.ledgers.len(),
            c.meta.len(),
            c.relocations.len()
        ),
        None => println!("  no checkpoint yet"),
    }
    match &img.tail {
        Tail::Clean { position } => println!("  log ends at {position}"),
        Tail::End { position } => println!("  log ends at {position}"),
        Tail::Torn { position, file, offset, bytes, reason } => println!(
            "  log ends at {position}; last batch at {}:{offset} ({bytes} bytes) does not verify ({reason}) and \
             looks like a write a crash interrupted, never acknowledged (damage a crash cannot leave, such as a \
             rotted header or a cut segment, is an error instead; docs/format.md lists what still looks like a \
             tear); the next start truncates it",
            file.display()
        ),
    }
    println!("  segments:");
    for s in &img.segments {
        let name = s.path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        println!(
            "    {name}  start {:>14}  file {:>10}  entries {:>9}  ({}){}",
            s.start,
            mib(s.file_bytes),
            s.entries,
            mib(s.entry_bytes),
            if s.batches > 0 { format!("  batches scanned {}", s.batches) } else { String::new() }
        );
    }
    println!("  ledgers:");
    for (id, l) in &img.ledgers {
        println!("    {id:>12}  entries {:>9}  {}  (indexed {})", l.index.len(), mib(l.bytes), l.indexed);
    }
    println!("  metadata:");
    for (k, v) in &img.meta {
        let m = meta_json(k, v);
        match m["kind"].as_str() {
            Some("topic") => println!(
                "    topic {}  ledger {}  ({} ledgers)",
                m["topic"].as_str().unwrap_or(""),
                m["ledger"],
                m["ledgers"].as_array().map_or(0, |a| a.len())
            ),
            Some("cursor") => println!(
                "    cursor {} / {}  mark-delete {}  acked ranges {}",
                m["topic"].as_str().unwrap_or(""),
                m["subscription"].as_str().unwrap_or(""),
                m["mark_delete"].as_str().unwrap_or(""),
                m["acked"]
                    .as_array()
                    .map_or(0, |a| a.iter().map(|l| l["ranges"].as_array().map_or(0, |r| r.len())).sum())
            ),
            _ => println!("    {}  ({} bytes)", m["key"].as_str().unwrap_or(""), m["bytes"]),
        }
        if let Some(e) = m["error"].as_str() {
            println!("      unreadable: {e}");
        }
    }
    if !img.key_files.is_empty() {
        println!("  key index files:");
        for k in &img.key_files {
            let name = k.path.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
            println!(
                "    {name}  items {:>9}  ledgers {:>5}  publish times {}..={}",
                k.header.items,
                k.header.ledgers.len(),
                k.header.min_time_ms,
                k.header.max_time_ms
            );
        }
    }
    for p in &img.stray_files {
        println!("  stray file {}", p.display());
    }
    let c = &img.checked;
    if verified {
        println!(
            "  verify OK: {} batches, {} records, {} index pages, {} index entries, {} key index pages checked ({} read)",
            c.batches,
            c.records,
            c.index_pages,
            c.index_entries,
            c.key_pages,
            mib(c.bytes_scanned)
        );
    }
}

fn entry_json(ledger: u64, entry: u64, position: u64, publish_time_ms: u64, key_hash: u32, body: Vec<u8>) -> Value {
    use base64::Engine;
    let len = body.len();
    let blob = Bytes::from(body);
    let mut v = json!({"id": format!("{ledger}:{entry}"), "ledger": ledger, "entry": entry,
                       "position": position, "bytes": len,
                       "index_publish_time_ms": publish_time_ms, "index_key_hash": key_hash});
    match magnetar_wire::decode_message(&blob) {
        Ok((m, payload)) => {
            v["producer_name"] = json!(m.producer_name);
            v["sequence_id"] = json!(m.sequence_id);
            v["publish_time_ms"] = json!(m.publish_time_ms);
            v["event_time_ms"] = json!(m.event_time_ms);
            v["partition_key"] = json!(m.partition_key);
            v["num_messages"] = json!(m.num_messages);
            v["deliver_at_ms"] = json!(m.deliver_at_ms);
            v["tag"] = json!(m.tag);
            v["properties"] = Value::Array(m.properties.iter().map(|(k, val)| json!([k, val])).collect());
            v["payload_base64"] = json!(base64::engine::general_purpose::STANDARD.encode(&payload));
            if let Ok(s) = std::str::from_utf8(&payload) {
                v["payload_utf8"] = json!(s);
            }
        }
        Err(e) => {
            v["decode_error"] = json!(e.to_string());
            v["body_base64"] = json!(base64::engine::general_purpose::STANDARD.encode(&blob));
        }
    }
    v
}

fn print_entry(e: &Value) {
    let id = e["id"].as_str().unwrap_or("");
    if let Some(err) = e["decode_error"].as_str() {
        println!("{id}  position {}  {} bytes  not a message blob: {err}", e["position"], e["bytes"]);
        return;
    }
    let payload = match e["payload_utf8"].as_str() {
        Some(s) => format!("{s:?}"),
        None => format!("base64:{}", e["payload_base64"].as_str().unwrap_or("")),
    };
    println!(
        "{id}  position {}  producer {}  seq {}  publish {}  key {}  messages {}  payload {payload}",
        e["position"],
        e["producer_name"].as_str().unwrap_or(""),
        e["sequence_id"],
        e["publish_time_ms"],
        e["partition_key"],
        e["num_messages"],
    );
}
