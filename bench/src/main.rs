//! `magnetar-bench`: with no arguments, the canonical workload against a
//! broker it starts itself. See `bench/README.md`.

use clap::Parser;
use magnetar_bench::broker::{BrokerOptions, BrokerProcess};
use magnetar_bench::report::rate_words;
use magnetar_bench::run::{run, RunOptions};
use magnetar_bench::workload::{Compression, KeyDist, SubType, Workload};
use magnetar_bench::{plot, report};
use std::path::PathBuf;
use std::process::ExitCode;

/// Which client drives the broker.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Protocol {
    Native,
    Pulsar,
}

#[derive(Parser, Debug)]
#[command(name = "magnetar-bench", version, about = "Magnetar's benchmark harness")]
struct Args {
    /// Broker to measure (`magnetar://HOST:PORT` or `HOST:PORT`); default:
    /// start `magnetar standalone` from this target directory.
    #[arg(long)]
    url: Option<String>,
    /// Speak TLS to the broker, trusting the CA certificate(s) in FILE
    /// (PEM): a URL without a scheme becomes `magnetar+tls://HOST:PORT`. A
    /// self-started broker needs its certificate too: `--broker-arg
    /// --tls-cert=FILE --broker-arg --tls-key=FILE` (see
    /// bench/scripts/tls_ab.sh).
    #[arg(long, value_name = "FILE")]
    tls_ca: Option<PathBuf>,
    /// Client protocol: `native` (Magnetar's client) or `pulsar` (Apache
    /// Pulsar's Rust client, the `pulsar` crate, through the broker's Pulsar
    /// door on the same port); the workload and the report are the same.
    #[arg(long, value_enum, default_value_t = Protocol::Native)]
    protocol: Protocol,
    /// Workload file (TOML, keys as in `Workload`); flags override it.
    #[arg(long)]
    workload: Option<PathBuf>,
    /// Measured seconds (after warm-up).
    #[arg(long)]
    duration_s: Option<f64>,
    #[arg(long)]
    warmup_s: Option<f64>,
    /// Producers per topic.
    #[arg(long)]
    producers: Option<u32>,
    /// Consumers per subscription.
    #[arg(long)]
    consumers: Option<u32>,
    /// Subscriptions per topic.
    #[arg(long)]
    subscriptions: Option<u32>,
    #[arg(long)]
    topics: Option<u32>,
    /// Partitions per topic (a partitioned topic, created through the admin API).
    #[arg(long)]
    partitions: Option<u32>,
    /// Message size: `1024`, `100..16384` (uniform) or `100:5,1024:4,16384:1` (weighted).
    #[arg(long)]
    size: Option<String>,
    /// Target rate in msg/s over all producers; 0 = as fast as possible.
    #[arg(long)]
    rate: Option<u64>,
    /// Find the highest rate the consumers keep up with (backlog-aware
    /// search, one line per 1 s step), then warm up and measure at it;
    /// `--rate` is where the search starts (default 10,000).
    #[arg(long)]
    sustainable: bool,
    /// Longest the sustainable-rate search may take, seconds (default 60).
    #[arg(long)]
    search_max_s: Option<f64>,
    /// Messages awaiting a receipt per producer and partition; a batch counts
    /// as the messages it holds (default 1000; with one partition and
    /// `--batch-max-messages 0`, 1 = one message at a time).
    #[arg(long)]
    max_pending: Option<u32>,
    #[arg(long)]
    receiver_queue_size: Option<u32>,
    /// Messages per batch (default 1000, with 128 KiB and 1 ms: Pulsar's
    /// client defaults); 0 turns the producers' batching off.
    #[arg(long)]
    batch_max_messages: Option<u32>,
    /// With batching: longest wait of a batch's first message, ms (default 1).
    #[arg(long)]
    batch_max_delay_ms: Option<u64>,
    /// Producers' compression codec.
    #[arg(long, value_enum)]
    compression: Option<Compression>,
    /// Subscription type (Exclusive takes one consumer per subscription).
    #[arg(long, value_enum)]
    subscription_type: Option<SubType>,
    #[arg(long, value_enum)]
    key_distribution: Option<KeyDist>,
    /// Distinct keys.
    #[arg(long)]
    keys: Option<u64>,
    #[arg(long)]
    zipf_exponent: Option<f64>,
    /// Backlog phase: produce N messages first, then measure the catch-up read.
    #[arg(long)]
    backlog_messages: Option<u64>,
    #[arg(long)]
    seed: Option<u64>,
    #[arg(long)]
    topic_prefix: Option<String>,
    /// Client connections shared by all producers (and as many by all
    /// consumers); 0 = one per producer and per consumer (default).
    #[arg(long)]
    connections: Option<u32>,
    /// Choose the run's topic names so that the first topic's first
    /// partition lives on this broker shard (asked of the broker); for
    /// one-partition runs, whose figures depend on the owning shard.
    #[arg(long)]
    topic_shard: Option<u32>,

    /// Write the result as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write an SVG picture (latency percentiles, throughput over time) here.
    #[arg(long)]
    plot: Option<PathBuf>,
    /// History file each result is appended to (JSON lines); default `<target>/bench-history.jsonl`.
    #[arg(long)]
    history: Option<PathBuf>,
    #[arg(long)]
    no_history: bool,
    /// No progress lines.
    #[arg(long, short)]
    quiet: bool,
    /// Print the differences between two JSON results as ratios and exit.
    #[arg(long, num_args = 2, value_names = ["A.json", "B.json"])]
    compare: Option<Vec<PathBuf>>,

    /// Self-started broker: `magnetar` binary (default: beside this one).
    #[arg(long)]
    broker_bin: Option<PathBuf>,
    /// Self-started broker: parent of its temporary data directory (default `<target>/bench-data`; not tmpfs).
    #[arg(long)]
    data_dir: Option<PathBuf>,
    /// Self-started broker: shards (default: one per CPU).
    #[arg(long)]
    shards: Option<u32>,
    /// Self-started broker: do not pin shards to CPUs.
    #[arg(long)]
    no_pin: bool,
    /// Self-started broker: extra `magnetar standalone` argument (repeatable).
    #[arg(long = "broker-arg", allow_hyphen_values = true)]
    broker_args: Vec<String>,
    /// Connect every producer and consumer through the given address only,
    /// instead of straight to the port of the broker shard that owns its
    /// topic (the default when the broker announces per-shard ports).
    #[arg(long)]
    no_shard_aware: bool,
    /// Client runtime threads (1 = a current-thread runtime, leaving the
    /// other cores to the broker).
    #[arg(long, default_value_t = 1)]
    client_threads: usize,
}

fn workload(args: &Args) -> Result<Workload, Box<dyn std::error::Error>> {
    let mut w = match &args.workload {
        Some(path) => Workload::from_toml_file(path)?,
        None => Workload::default(),
    };
    macro_rules! set {
        ($($f:ident),*) => { $( if let Some(v) = args.$f.clone() { w.$f = v; } )* };
    }
    set!(
        duration_s,
        warmup_s,
        producers,
        consumers,
        subscriptions,
        topics,
        partitions,
        size,
        rate,
        max_pending,
        receiver_queue_size,
        batch_max_messages,
        batch_max_delay_ms,
        compression,
        subscription_type,
        key_distribution,
        keys,
        zipf_exponent,
        backlog_messages,
        seed,
        topic_prefix,
        connections,
        search_max_s
    );
    if args.sustainable {
        w.sustainable = true;
    }
    if args.topic_shard.is_some() {
        w.topic_shard = args.topic_shard;
    }
    w.validate()?;
    Ok(w)
}

fn compare(paths: &[PathBuf]) -> Result<(), Box<dyn std::error::Error>> {
    let read = |p: &PathBuf| -> Result<serde_json::Value, Box<dyn std::error::Error>> {
        let text = std::fs::read_to_string(p).map_err(|e| format!("{}: {e}", p.display()))?;
        Ok(serde_json::from_str(&text).map_err(|e| format!("{}: {e}", p.display()))?)
    };
    let (a, b) = (read(&paths[0])?, read(&paths[1])?);
    println!("A = {}\nB = {}", paths[0].display(), paths[1].display());
    print!("{}", report::compare(&a, &b));
    Ok(())
}

fn main_inner(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    if let Some(paths) = &args.compare {
        return compare(paths);
    }
    let w = workload(&args)?;
    let mut broker = None;
    let url = match &args.url {
        Some(url) => url.clone(),
        None => {
            let options = BrokerOptions {
                bin: args.broker_bin.clone(),
                data_parent: args.data_dir.clone(),
                shards: args.shards,
                no_pin: args.no_pin,
                extra_args: args.broker_args.clone(),
            };
            let b = BrokerProcess::start(&options)?;
            if !args.quiet {
                eprintln!(
                    "started {} (pid {}) on {}, data in {}",
                    b.bin.display(),
                    b.pid(),
                    b.addr,
                    b.data_dir.display()
                );
            }
            let addr = b.addr.clone();
            broker = Some(b);
            addr
        }
    };
    let runtime = if args.client_threads <= 1 {
        tokio::runtime::Builder::new_current_thread().enable_all().build()?
    } else {
        tokio::runtime::Builder::new_multi_thread().worker_threads(args.client_threads).enable_all().build()?
    };
    let url = match &args.tls_ca {
        Some(_) if !url.contains("://") => format!("magnetar+tls://{url}"),
        _ => url,
    };
    let mut options = RunOptions::new(w.clone(), url.clone());
    if let Some(ca) = &args.tls_ca {
        options.client_options.tls = Some(magnetar_client::TlsOptions::from_pem_files(ca, None)?);
    }
    options.progress = !args.quiet;
    options.client_options.shard_aware = !args.no_shard_aware;
    options.broker_pid = broker.as_ref().map(|b| b.pid());
    let outcome = match args.protocol {
        Protocol::Native => runtime.block_on(run(options))?,
        Protocol::Pulsar => {
            if args.tls_ca.is_some() {
                return Err("--protocol pulsar: TLS (--tls-ca) is not supported by the bench".into());
            }
            runtime.block_on(magnetar_bench::pulsar::run_pulsar(options))?
        }
    };
    let mut broker_args = args.broker_args.clone();
    if let Some(s) = args.shards {
        broker_args.push(format!("--shards={s}"));
    }
    // A Pulsar run names its door by the URL's scheme (`pulsar://`).
    let url = match args.protocol {
        Protocol::Native => url,
        Protocol::Pulsar => magnetar_bench::pulsar::pulsar_url(&url)?,
    };
    let env = report::environment(
        &url,
        broker.is_some(),
        outcome.server_version.clone(),
        broker.as_ref().map(|b| b.data_dir.display().to_string()),
        broker_args,
        outcome.shard_aware,
    );
    if let Some(mut b) = broker.take() {
        b.stop();
    }
    let rep = report::build(&w, &outcome, env);
    print!("{}", report::summary(&rep));
    if let Some(path) = &args.json {
        report::write_json(&rep, path).map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if let Some(path) = &args.plot {
        let title = format!(
            "magnetar-bench {}: {} x {} partitions, {} producer(s), size {}, rate {}",
            rep.run_id,
            w.topics,
            w.partitions,
            w.producers,
            w.size,
            rate_words(&w, rep.sustainable.as_ref())
        );
        let curves = [plot::curve("publish", &outcome.totals.publish), plot::curve("end-to-end", &outcome.totals.e2e)];
        std::fs::write(path, plot::svg(&title, &curves, &outcome.totals.ticks))
            .map_err(|e| format!("writing {}: {e}", path.display()))?;
    }
    if !args.no_history {
        let path = args.history.clone().unwrap_or_else(|| {
            magnetar_bench::broker::exe_dir()
                .and_then(|d| d.parent().map(|p| p.join("bench-history.jsonl")))
                .unwrap_or_else(|| PathBuf::from("bench-history.jsonl"))
        });
        report::append_history(&rep, &path).map_err(|e| format!("appending to {}: {e}", path.display()))?;
    }
    if rep.publish_errors > 0 && rep.produce.msgs == 0 {
        return Err(format!("every send failed; last error: {}", rep.last_error.unwrap_or_default()).into());
    }
    Ok(())
}

fn main() -> ExitCode {
    let args = Args::parse();
    match main_inner(args) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("magnetar-bench: {e}");
            ExitCode::FAILURE
        }
    }
}
