//! `magnetar standalone`: a broker with an embedded default configuration.

use magnetar_core::auth::Authenticator;
use magnetar_core::BrokerConfig;
use magnetar_net::http::{HttpConfig, HttpServer};
use magnetar_net::tls::TlsSettings;
use magnetar_net::{ConnectionLimits, NetConfig, PortReservation};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

#[derive(clap::Args, Debug)]
pub struct StandaloneArgs {
    /// A TOML configuration file (`magnetar config default` prints one with
    /// every key); MAGNETAR_SECTION_KEY variables override it, flags both.
    #[arg(long)]
    pub config: Option<PathBuf>,
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
    /// Ledger index pages kept in memory per shard, in MiB (least recently
    /// used out; the rest of the index is read from disk when needed).
    #[arg(long, default_value_t = 64, value_parser = clap::builder::RangedU64ValueParser::<usize>::new().range(1..=(1 << 20)))]
    pub index_cache_mib: usize,
    /// Do not pin shards to CPUs.
    #[arg(long)]
    pub no_pin: bool,
    /// Accept a tmpfs data directory (for development only: no real durability).
    #[arg(long)]
    pub allow_tmpfs: bool,
    /// When recovery finds damage inside data that may have been
    /// acknowledged (a damaged batch before valid ones, a rotted last
    /// batch, a truncated segment), truncate the log there and log exactly
    /// what is dropped, instead of refusing to start. Use once, after
    /// reading the refusal's message.
    #[arg(long)]
    pub accept_data_loss: bool,
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
    /// Seconds a loaded topic stays idle (no producer, no consumer, nothing
    /// held only in memory) before it is unloaded; 0: never.
    #[arg(long, default_value_t = 60)]
    pub topic_idle_unload_s: u64,
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
    /// Seconds a Pulsar client may stay silent before the broker pings it;
    /// silent as long again, its connection is closed (Pulsar's
    /// keepAliveIntervalSeconds).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    pub pulsar_keep_alive_interval_s: u64,
    /// Most connections one shard holds (docs/reliability.md).
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    pub connections_per_shard_max: u64,
    /// When fewer slots than this are free on a shard, a new connection
    /// first evicts the oldest one still in its handshake.
    #[arg(long, default_value_t = 100)]
    pub connections_reserve: u64,
    /// Most connections one peer address holds on one shard.
    #[arg(long, default_value_t = 1_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub connections_per_peer_max: u64,
    /// Seconds a connection may take to complete its handshake.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..))]
    pub handshake_timeout_s: u64,
    /// Seconds a connection with no producer and no consumer may go without
    /// a request (pings and pongs do not count) before it is closed.
    #[arg(long, default_value_t = 600, value_parser = clap::value_parser!(u64).range(1..))]
    pub idle_timeout_s: u64,
    /// Seconds a frame may stay incomplete before its connection is closed.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..))]
    pub partial_frame_timeout_s: u64,
    /// Seconds a client may read none of its waiting output before its
    /// connection is closed.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..))]
    pub unread_output_timeout_s: u64,
    /// Unwritten output of one connection above which its consumers are
    /// paused and its requests are not read.
    #[arg(long, default_value_t = 8 << 20, value_parser = clap::value_parser!(u64).range(64 * 1024..))]
    pub outbox_bytes_max: u64,
    /// Bytes one shard holds for all its clients (unwritten output and
    /// incomplete inbound frames) above which it reads no connection and
    /// pauses deliveries.
    #[arg(long, default_value_t = 512 << 20, value_parser = clap::value_parser!(u64).range(1 << 20..))]
    pub shard_buffered_bytes_max: u64,
    /// Token authentication with HS256 tokens signed by the secret key in
    /// FILE (raw bytes or base64, as `magnetar tokens create-secret-key`
    /// writes it). A token's `sub` claim is the client's role.
    #[arg(long, value_name = "FILE", conflicts_with = "auth_token_public_key")]
    pub auth_token_secret_key: Option<PathBuf>,
    /// Token authentication with RS256 or ES256 tokens, checked with the
    /// PEM public key in FILE.
    #[arg(long, value_name = "FILE")]
    pub auth_token_public_key: Option<PathBuf>,
    /// With authentication on: the role of a client that presents no
    /// credentials (without it, such a client is refused).
    #[arg(long, value_name = "ROLE")]
    pub anonymous_role: Option<String>,
    /// Roles that may do everything (comma-separated).
    #[arg(long, value_delimiter = ',', value_name = "ROLES")]
    pub superuser_roles: Vec<String>,
    /// Listen on a non-loopback address without authentication: anyone who
    /// reaches the port may do anything.
    #[arg(long)]
    pub allow_unauthenticated: bool,
    /// Serve TLS (1.2 and 1.3) on every broker port with this certificate
    /// chain (PEM), with --tls-key.
    #[arg(long, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// The TLS certificate's private key (PEM).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
    /// Require client certificates signed by a CA in this PEM file; a
    /// certificate's subject common name is the client's role (this turns
    /// authentication on).
    #[arg(long, value_name = "FILE", requires = "tls_cert")]
    pub tls_client_ca: Option<PathBuf>,
    /// TLS handshakes in progress per listener of a shard, at most; further
    /// connections are closed at once (a handshake also ends after
    /// --handshake-timeout-s).
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=100_000))]
    pub tls_handshakes_max: u64,
    /// Address of the HTTP server: /metrics, /healthz, /ready and the REST
    /// admin under /admin/v2/ (port 0 picks a free port).
    #[arg(long, default_value = "127.0.0.1:8080")]
    pub http_listen: SocketAddr,
    /// No HTTP server.
    #[arg(long)]
    pub no_http: bool,
    /// Sum the pulsar_* metrics per namespace instead of one series per
    /// topic and subscription (for brokers with very many topics).
    #[arg(long)]
    pub metrics_namespace_level: bool,
}

impl StandaloneArgs {
    /// The network settings these flags give (shard ports aside).
    fn net_config(&self) -> NetConfig {
        let defaults = NetConfig::default();
        let size = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        let limits = ConnectionLimits {
            outbox_bytes_max: size(self.outbox_bytes_max),
            handshake_timeout: Duration::from_secs(self.handshake_timeout_s),
            partial_frame_timeout: Duration::from_secs(self.partial_frame_timeout_s),
            idle_timeout: Duration::from_secs(self.idle_timeout_s),
            unread_output_timeout: Duration::from_secs(self.unread_output_timeout_s),
            ..defaults.limits.clone()
        };
        let connections_per_shard_max = size(self.connections_per_shard_max);
        NetConfig {
            limits,
            connections_per_shard_max,
            connections_reserve: size(self.connections_reserve).min(connections_per_shard_max),
            connections_per_peer_max: size(self.connections_per_peer_max),
            shard_buffered_bytes_max: size(self.shard_buffered_bytes_max),
            ..defaults
        }
    }
}

/// The authenticator the flags ask for; `None`: authentication is off.
fn authentication(args: &StandaloneArgs) -> Result<Option<Authenticator>, Box<dyn std::error::Error>> {
    let auth = match (&args.auth_token_secret_key, &args.auth_token_public_key) {
        (Some(f), _) => Authenticator::new().with_secret_key_file(f)?,
        (None, Some(f)) => Authenticator::new().with_public_key_file(f)?,
        (None, None) if args.tls_client_ca.is_some() => Authenticator::new(),
        (None, None) => {
            if args.anonymous_role.is_some() {
                return Err("--anonymous-role needs authentication on (--auth-token-secret-key or \
                            --auth-token-public-key)"
                    .into());
            }
            return Ok(None);
        }
    };
    let auth = if args.tls_client_ca.is_some() { auth.with_tls_client_certs() } else { auth };
    Ok(Some(auth.with_anonymous_role(args.anonymous_role.clone())))
}

/// Safe by default: a broker reachable from other hosts refuses to start
/// without authentication unless told to.
/// `flag` names the listener (`--listen`, `--pulsar-listen`,
/// `--http-listen`).
fn check_exposure(
    flag: &str,
    listen: SocketAddr,
    authenticated: bool,
    allow_unauthenticated: bool,
) -> Result<(), String> {
    if listen.ip().is_loopback() || authenticated || allow_unauthenticated {
        return Ok(());
    }
    let port = listen.port();
    Err(format!(
        "refusing to listen on {listen} ({flag}) without authentication: anyone who can reach it could produce, \
         consume and administer everything. Turn authentication on (--auth-token-secret-key FILE or \
         --auth-token-public-key FILE, see docs/security.md), listen on a loopback address ({flag} \
         127.0.0.1:{port}), or pass --allow-unauthenticated to accept the risk"
    ))
}

/// One line per listening socket, for the start-up log (issue #17 item 7):
/// what it serves and its address, and whether that address is every
/// interface of the host (`0.0.0.0` or `::`), so that an operator sees every
/// port the broker opened, per-shard ports included.
fn bound_addresses(
    native: SocketAddr,
    shards: &[SocketAddr],
    pulsar: Option<SocketAddr>,
    http: Option<SocketAddr>,
) -> Vec<String> {
    let line = |what: String, a: SocketAddr| {
        let scope = if a.ip().is_unspecified() {
            "every interface of this host"
        } else if a.ip().is_loopback() {
            "loopback only"
        } else {
            "one interface"
        };
        format!("{what} listening on {a} ({scope})")
    };
    let mut out = vec![line("native and Pulsar protocols (all shards)".into(), native)];
    out.extend(shards.iter().enumerate().map(|(i, a)| line(format!("shard {i}'s own port"), *a)));
    out.extend(pulsar.map(|a| line("Pulsar protocol (--pulsar-listen)".into(), a)));
    out.extend(http.map(|a| line("HTTP (metrics, probes, admin)".into(), a)));
    out
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

    let auth = authentication(&args)?;
    check_exposure("--listen", args.listen, auth.is_some(), args.allow_unauthenticated)?;
    if let Some(pulsar_listen) = args.pulsar_listen {
        check_exposure("--pulsar-listen", pulsar_listen, auth.is_some(), args.allow_unauthenticated)?;
    }
    if !args.no_http {
        // The REST admin changes everything the broker port does.
        check_exposure("--http-listen", args.http_listen, auth.is_some(), args.allow_unauthenticated)?;
    }
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
    config.index_cache_bytes = args.index_cache_mib * 1024 * 1024;
    config.allow_tmpfs = args.allow_tmpfs;
    config.accept_data_loss = args.accept_data_loss;
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
    config.topic_idle_unload = std::time::Duration::from_secs(args.topic_idle_unload_s);
    if auth.is_none() && !args.superuser_roles.is_empty() {
        tracing::warn!("--superuser-roles has no effect without authentication: nothing is authorized");
    }
    config.authentication = auth.map(Arc::new);
    config.superuser_roles = args.superuser_roles.clone();
    // Restart time, reported in the log (issue #3): from here to "broker
    // ready"; each shard's own share is its "recovered entry log" line.
    let started = std::time::Instant::now();
    tracing::info!(
        data_dir = %args.data_dir.display(),
        shards,
        %addr,
        ?shard_addrs,
        authentication = ?config.authentication,
        tls = args.tls_cert.is_some(),
        "starting standalone broker"
    );
    let pulsar_reservation = match args.pulsar_listen {
        Some(a) => Some(PortReservation::new(a).map_err(|e| format!("cannot bind --pulsar-listen {a}: {e}"))?),
        None => None,
    };
    let pulsar_addr = pulsar_reservation.as_ref().map(PortReservation::addr);
    let pulsar = magnetar_net::PulsarConfig {
        max_message_bytes: args.pulsar_max_message_bytes,
        advertised_address: args.advertised_address.clone(),
        keep_alive: Duration::from_secs(args.pulsar_keep_alive_interval_s),
        ..Default::default()
    };
    let tls = match (&args.tls_cert, &args.tls_key) {
        (Some(cert), Some(key)) => {
            let mut tls = TlsSettings::from_pem_files(cert, key, args.tls_client_ca.as_deref())?;
            tls.handshake_timeout = Duration::from_secs(args.handshake_timeout_s);
            tls.handshakes_max = usize::try_from(args.tls_handshakes_max).unwrap_or(usize::MAX);
            Some(tls)
        }
        _ => None,
    };
    let net = NetConfig { shard_addrs, pulsar_addr, pulsar, tls: tls.clone(), ..args.net_config() };
    // The HTTP server starts before recovery, so that probes can say "not
    // ready" meanwhile; it reaches each shard through the task below.
    let http = if args.no_http {
        None
    } else {
        let mut hc = HttpConfig::new(args.http_listen);
        hc.topic_level_metrics = !args.metrics_namespace_level;
        hc.authentication = config.authentication.clone();
        hc.tls = tls.clone();
        let (server, shards_side) = HttpServer::start(hc, shards)
            .map_err(|e| format!("cannot bind --http-listen {}: {e}", args.http_listen))?;
        // Printed now, not once ready: probes are answered during recovery.
        println!("magnetar standalone http on {}", server.addr());
        Some((server, shards_side))
    };
    let http_shards = http.as_ref().map(|(_, s)| s.clone());
    for line in bound_addresses(addr, &net.shard_addrs, pulsar_addr, http.as_ref().map(|(s, _)| s.addr())) {
        if line.contains("every interface") {
            tracing::warn!("{line}");
        } else {
            tracing::info!("{line}");
        }
    }
    let running = magnetar_core::launch(config, shutdown.clone(), move |broker| {
        let serve = magnetar_net::serve(broker.clone(), addr, net.clone());
        let http = http_shards.clone();
        async move {
            match http {
                Some(h) => {
                    futures::future::join(serve, h.serve_shard(broker)).await;
                }
                None => serve.await,
            }
        }
    })?;
    let http = http.map(|(server, _)| server);
    if let Some(server) = &http {
        server.set_ready(true);
    }
    // One line on stdout that scripts and tests wait for (the port matters
    // when --listen asked for port 0).
    println!("magnetar standalone listening on {addr}");
    if let Some(p) = pulsar_addr {
        println!("magnetar standalone listening for Pulsar on {p}");
    }
    // systemd (Type=notify): every shard recovered and serves.
    if let Err(e) = crate::sd_notify::notify("READY=1") {
        tracing::warn!("cannot notify systemd of readiness: {e}");
    }
    tracing::info!(%addr, start_ms = started.elapsed().as_millis() as u64, "broker ready");
    // Once shutdown begins (SIGTERM), say so to systemd.
    let stopping = std::thread::spawn({
        let shutdown = shutdown.clone();
        move || {
            while !shutdown.load(Ordering::SeqCst) {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            let _ = crate::sd_notify::notify("STOPPING=1");
        }
    });
    let result = running.join();
    shutdown.store(true, Ordering::SeqCst);
    let _ = stopping.join();
    if let Some(server) = http {
        server.set_ready(false);
        server.stop();
    }
    drop(reservation);
    drop(shard_reservations);
    drop(pulsar_reservation);
    if shutdown.load(Ordering::SeqCst) {
        tracing::info!("broker stopped");
    }
    Ok(result?)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal (issue #17 item 7): every listening address is in the start-up
    /// log, each shard's port included, and one on every interface says so.
    #[test]
    fn every_bound_address_is_listed() {
        let any: SocketAddr = "0.0.0.0:6650".parse().unwrap();
        let shards: Vec<SocketAddr> = vec!["0.0.0.0:6700".parse().unwrap(), "0.0.0.0:6701".parse().unwrap()];
        let http: SocketAddr = "127.0.0.1:8080".parse().unwrap();
        let lines = bound_addresses(any, &shards, None, Some(http));
        assert_eq!(lines.len(), 4, "{lines:?}");
        for (l, a) in lines.iter().zip(["0.0.0.0:6650", "0.0.0.0:6700", "0.0.0.0:6701"]) {
            assert!(l.contains(a) && l.contains("every interface"), "{l}");
        }
        assert!(lines[3].contains("127.0.0.1:8080") && lines[3].contains("loopback"), "{}", lines[3]);
    }

    #[test]
    fn a_non_loopback_listener_needs_authentication_or_an_explicit_opt_out() {
        let any: SocketAddr = "0.0.0.0:6650".parse().unwrap();
        let lo: SocketAddr = "127.0.0.1:6650".parse().unwrap();
        let lo6: SocketAddr = "[::1]:6650".parse().unwrap();
        let l = "--listen";
        assert!(check_exposure(l, lo, false, false).is_ok());
        assert!(check_exposure(l, lo6, false, false).is_ok());
        let e = check_exposure(l, any, false, false).unwrap_err();
        assert!(e.contains("--allow-unauthenticated") && e.contains("--auth-token-secret-key"), "{e}");
        let e = check_exposure("--http-listen", "0.0.0.0:8080".parse().unwrap(), false, false).unwrap_err();
        assert!(e.contains("--http-listen 127.0.0.1:8080"), "{e}");
        assert!(check_exposure(l, any, true, false).is_ok());
        assert!(check_exposure(l, any, false, true).is_ok());
    }
}
