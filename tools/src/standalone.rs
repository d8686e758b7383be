//! `magnetar standalone`: a broker with an embedded default configuration.

use magnetar_core::BrokerConfig;
use magnetar_net::{NetConfig, PortReservation};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

#[derive(clap::Args, Debug)]
pub struct StandaloneArgs {
    /// Where the broker keeps its data.
    #[arg(long, default_value = "./data")]
    pub data_dir: PathBuf,
    /// Address of the native protocol listener (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:6650")]
    pub listen: SocketAddr,
    /// Each shard also listens alone on port BASE + shard id (announced to
    /// clients, which connect straight to a topic's owner); 0 = a free port
    /// per shard, picked at start. The --listen port serves everything.
    #[arg(long, default_value_t = 0)]
    pub shard_port_base: u16,
    /// No per-shard ports: every connection goes through --listen and
    /// requests for another shard's topics cross between shards.
    #[arg(long)]
    pub no_shard_ports: bool,
    /// Shards (executors), one per CPU by default. Fixed for a data directory.
    #[arg(long)]
    pub shards: Option<u32>,
    /// Entry-log segment size in MiB.
    #[arg(long, default_value_t = 256)]
    pub segment_mib: u64,
    /// Write zeros over each whole new segment when it is made (the first
    /// one before the first receipt) instead of zeroing ahead of the tail
    /// (`--segment-zero-ahead-mib`): costs writing every new segment twice.
    #[arg(long)]
    pub segment_prezero: bool,
    /// Zero the tail segment this many MiB ahead of the write position in
    /// the background, while batches are small, so that a receipt's
    /// fdatasync overwrites written blocks (cheaper on ext4 than converting
    /// fallocated extents). 0: never. At most 1024 (past the segment's end
    /// nothing is zeroed anyway).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(0..=1024))]
    pub segment_zero_ahead_mib: u64,
    /// One producer sending one small message at a time: its batches are
    /// written and fdatasync'd as one request that blocks the shard's
    /// thread (about 0.6x the broker CPU per message). When one takes longer
    /// than this many microseconds (a busy disk), the next 1,024 batches go
    /// through the reactor instead: on a busy disk only one batch in 1,025
    /// holds up the shard's other topics (for as long as it takes). The
    /// pause ends early after 32 lone batches in a row took at most this
    /// long through the reactor (a spike, not a busy disk). 0: never block.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub lone_sync_max_us: u64,
    /// While the shard waits for such a lone request, it yields its CPU in
    /// a loop for up to this many microseconds before it sleeps: no
    /// wake-up per message (one at a time: p50 ~0.83x here), at the price
    /// of a busy CPU meanwhile (it counts against a CPU quota). 0: sleep
    /// at once.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    pub lone_yield_max_us: u64,
    /// Segments freed by retention or compaction kept per shard and reused
    /// as the next segments (already written) instead of deleted. 0: delete.
    #[arg(long, default_value_t = 2)]
    pub segment_recycle: usize,
    /// Recent entries kept in memory per shard, in MiB.
    #[arg(long, default_value_t = 256)]
    pub write_cache_mib: usize,
    /// Do not pin shards to CPUs.
    #[arg(long)]
    pub no_pin: bool,
    /// Accept a tmpfs data directory (for development only: no real durability).
    #[arg(long)]
    pub allow_tmpfs: bool,
    /// Data-disk usage (percent) at which produce requests are refused with
    /// the retriable StorageFull error; consumers keep reading. Warnings are
    /// logged at 75 % and 85 %.
    #[arg(long, default_value_t = 90, value_parser = clap::value_parser!(u8).range(1..=100))]
    pub disk_refuse_pct: u8,
    /// Dispatch to a consumer pauses while it holds this many unacknowledged messages.
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub unacked_per_consumer_max: u32,
    /// Dispatch on a subscription pauses while this many of its messages are unacknowledged.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u32).range(1..))]
    pub unacked_per_subscription_max: u32,
    /// Delayed messages indexed in memory per subscription; more are read
    /// again from the log as the index drains.
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u32).range(2..))]
    pub delayed_index_max: u32,
    /// A topic's current ledger rolls over after this many entries (a
    /// topic keeping over 341 ledgers: only once the ledger also holds 16×
    /// its topic record, 48 B a ledger, so rewriting the record stays cheap).
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub ledger_max_entries: u64,
    /// … or this many bytes of entries (default 2 GiB).
    #[arg(long, default_value_t = 2 << 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub ledger_max_bytes: u64,
    /// … or this age in seconds (default 4 h), even when idle.
    #[arg(long, default_value_t = 4 * 3600, value_parser = clap::value_parser!(u64).range(1..))]
    pub ledger_max_age_s: u64,
    /// A ledger younger than this (seconds) never rolls over for its entry
    /// count or bytes (default 10 min); only its age rolls it.
    #[arg(long, default_value_t = 600)]
    pub ledger_min_rollover_s: u64,
    /// How often each shard enforces retention and TTL (seconds).
    #[arg(long, default_value_t = 120, value_parser = clap::value_parser!(u64).range(1..))]
    pub retention_check_interval_s: u64,
    /// An address of its own for Apache Pulsar's protocol (port 0 picks a
    /// free port). The --listen port answers Pulsar clients too.
    #[arg(long)]
    pub pulsar_listen: Option<SocketAddr>,
    /// The host Pulsar clients are sent to by LOOKUP answers
    /// (`pulsar://HOST:PORT`); by default, the address they connected to.
    #[arg(long)]
    pub advertised_address: Option<String>,
    /// Largest message a Pulsar client may send, announced in CONNECTED
    /// (larger ones fail in the client unless it chunks them).
    #[arg(long, default_value_t = 5 * 1024 * 1024, value_parser = clap::value_parser!(u32).range(1024..=(1 << 30)))]
    pub pulsar_max_message_bytes: u32,
}

/// Kernel-picked shard ports tried before giving up on a collision.
const SHARD_PORT_TRIES_MAX: u32 = 16;

pub fn run(args: StandaloneArgs) -> Result<(), Box<dyn std::error::Error>> {
    let shards = match args.shards {
        Some(n) => n,
        None => std::thread::available_parallelism().map(|n| n.get() as u32).unwrap_or(1),
    };
    let shutdown = Arc::new(AtomicBool::new(false));
    signal_hook::flag::register(signal_hook::consts::SIGTERM, shutdown.clone())?;
    signal_hook::flag::register(signal_hook::consts::SIGINT, shutdown.clone())?;

    let reservation = PortReservation::new(args.listen).map_err(|e| format!("cannot bind {}: {e}", args.listen))?;
    let addr = reservation.addr();
    // One reservation per shard port, held until the end like the shared
    // one: a port picked here (port 0) stays ours while shards bind it.
    let mut shard_reservations: Vec<PortReservation> = Vec::new();
    if !args.no_shard_ports {
        for i in 0..shards {
            let port = match args.shard_port_base {
                0 => 0,
                base => u16::try_from(u32::from(base) + i)
                    .map_err(|_| format!("--shard-port-base {base} + {i} is not a port"))?,
            };
            let want = SocketAddr::new(addr.ip(), port);
            // A shard's port must be its own: SO_REUSEPORT would let it
            // share the --listen port or another shard's, and connections
            // there would land on any of them. A port picked by the kernel
            // (port 0) is tried again in the unlikely case it is one of them.
            let mut tries = 0;
            let r = loop {
                let r = PortReservation::new(want).map_err(|e| format!("cannot bind shard {i}'s port {want}: {e}"))?;
                let taken = r.addr().port() == addr.port()
                    || shard_reservations.iter().any(|o| o.addr().port() == r.addr().port());
                if !taken {
                    break r;
                }
                tries += 1;
                if port != 0 || tries >= SHARD_PORT_TRIES_MAX {
                    return Err(format!(
                        "shard {i}'s port {} is already the broker's (--listen or another shard's)",
                        r.addr().port()
                    )
                    .into());
                }
            };
            shard_reservations.push(r);
        }
    }
    let shard_addrs: Vec<SocketAddr> = shard_reservations.iter().map(PortReservation::addr).collect();
    let mut config = BrokerConfig::new(&args.data_dir, shards);
    config.shard_ports = shard_addrs.iter().map(SocketAddr::port).collect();
    config.pin_cpus = !args.no_pin;
    config.segment_bytes = args.segment_mib * 1024 * 1024;
    config.prezero_segments = args.segment_prezero;
    config.zero_ahead_bytes = args.segment_zero_ahead_mib * 1024 * 1024;
    config.lone_sync_max = std::time::Duration::from_micros(args.lone_sync_max_us);
    config.lone_yield_max = std::time::Duration::from_micros(args.lone_yield_max_us);
    config.recycle_segments = args.segment_recycle;
    config.write_cache_bytes = args.write_cache_mib * 1024 * 1024;
    config.allow_tmpfs = args.allow_tmpfs;
    config.disk_watermarks.refuse_pct = args.disk_refuse_pct;
    config.disk_watermarks.warn_pcts.retain(|&p| p < args.disk_refuse_pct);
    config.unacked_per_consumer_max = args.unacked_per_consumer_max;
    config.unacked_per_subscription_max = args.unacked_per_subscription_max;
    config.delayed_index_max = args.delayed_index_max;
    config.ledger_rollover = magnetar_core::ledgers::Rollover {
        max_entries: args.ledger_max_entries,
        max_bytes: args.ledger_max_bytes,
        max_age_ms: args.ledger_max_age_s.saturating_mul(1000),
        min_age_ms: args.ledger_min_rollover_s.saturating_mul(1000),
    };
    config.retention_check_interval = std::time::Duration::from_secs(args.retention_check_interval_s);
    // Restart time, reported in the log (issue #3): from here to "broker
    // ready"; each shard's own share is its "recovered entry log" line.
    let started = std::time::Instant::now();
    tracing::info!(data_dir = %args.data_dir.display(), shards, %addr, ?shard_addrs, "starting standalone broker");
    let pulsar_reservation = match args.pulsar_listen {
        Some(a) => Some(PortReservation::new(a).map_err(|e| format!("cannot bind --pulsar-listen {a}: {e}"))?),
        None => None,
    };
    let pulsar_addr = pulsar_reservation.as_ref().map(PortReservation::addr);
    let pulsar = magnetar_net::PulsarConfig {
        max_message_bytes: args.pulsar_max_message_bytes,
        advertised_address: args.advertised_address.clone(),
    };
    let net = NetConfig { shard_addrs, pulsar_addr, pulsar, ..NetConfig::default() };
    let running =
        magnetar_core::launch(config, shutdown.clone(), move |broker| magnetar_net::serve(broker, addr, net.clone()))?;
    // One line on stdout that scripts and tests wait for (the port matters
    // when --listen asked for port 0).
    println!("magnetar standalone listening on {addr}");
    if let Some(p) = pulsar_addr {
        println!("magnetar standalone listening for Pulsar on {p}");
    }
    tracing::info!(%addr, start_ms = started.elapsed().as_millis() as u64, "broker ready");
    let result = running.join();
    drop(reservation);
    drop(shard_reservations);
    drop(pulsar_reservation);
    if shutdown.load(Ordering::SeqCst) {
        tracing::info!("broker stopped");
    }
    Ok(result?)
}
