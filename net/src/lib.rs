//! magnetar-net: listeners and connections.
//!
//! Every shard runs one acceptor on the same port (SO_REUSEPORT), so the
//! kernel spreads connections over shards. A connection is a session
//! (`session`: producers, consumers, receipts, backpressure, the outbox)
//! behind a door, the protocol it speaks: today the native one (`native`:
//! frames from magnetar-wire). It calls the `Broker` handle of its own
//! shard, which routes each request to the topic's owner shard.
//!
//! Each shard may also listen on a port of its own (`NetConfig::shard_addrs`,
//! announced in `Connected::shard_ports`): a shard-aware client connects
//! there to the owner of its topic, so its requests never cross the mesh.
//! On such a port, producers and consumers of another shard's topics are
//! refused with `NotOwner` (the client's lookup was stale).
//!
//! This crate knows nothing of files; core knows nothing of sockets.

pub mod http;
mod native;
mod session;

use futures::io::AsyncReadExt;
use glommio::net::TcpStream;
use magnetar_core::Broker;
use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;

pub use session::ConnectionLimits;

/// Network settings shared by all shards.
#[derive(Debug, Clone)]
pub struct NetConfig {
    pub limits: ConnectionLimits,
    /// Most connections one shard accepts (both its ports together); more
    /// are closed at once.
    pub connections_per_shard_max: usize,
    /// The address shard `i` listens on by itself (ports resolved, e.g. by a
    /// [`PortReservation`] each); empty: no per-shard listeners.
    pub shard_addrs: Vec<SocketAddr>,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self { limits: ConnectionLimits::default(), connections_per_shard_max: 10_000, shard_addrs: Vec::new() }
    }
}

impl NetConfig {
    /// The ports of `shard_addrs`, as announced in `Connected`.
    pub fn shard_ports(&self) -> Vec<u16> {
        self.shard_addrs.iter().map(SocketAddr::port).collect()
    }
}

/// Holds the listen port for the whole process: the socket is bound (with
/// SO_REUSEPORT) but never listens, so it receives no connections. It turns
/// port 0 into one concrete port that every shard then binds.
pub struct PortReservation {
    _socket: socket2::Socket,
    addr: SocketAddr,
}

impl PortReservation {
    pub fn new(addr: SocketAddr) -> std::io::Result<Self> {
        let domain = if addr.is_ipv6() { socket2::Domain::IPV6 } else { socket2::Domain::IPV4 };
        let socket = socket2::Socket::new(domain, socket2::Type::STREAM, Some(socket2::Protocol::TCP))?;
        socket.set_reuse_port(true)?;
        socket.bind(&addr.into())?;
        let addr = socket
            .local_addr()?
            .as_socket()
            .ok_or_else(|| std::io::Error::other("bound address is not an IP socket address"))?;
        Ok(Self { _socket: socket, addr })
    }

    /// The address every shard listens on (port resolved).
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

/// The accept loops of one shard: the shared port `addr`, and the shard's own
/// port when `config.shard_addrs` names one. Runs until the future is
/// dropped (the core drops it at shutdown).
pub async fn serve(broker: Broker, addr: SocketAddr, config: NetConfig) {
    let open = Rc::new(Cell::new(0usize));
    let shard_ports: Rc<[u16]> = config.shard_ports().into();
    let own = match config.shard_addrs.get(broker.shard_id() as usize) {
        Some(&own) => match glommio::net::TcpListener::bind(own) {
            Ok(l) => {
                tracing::info!(shard = broker.shard_id(), addr = %own, "accepting connections on the shard's own port");
                Some(l)
            }
            Err(e) => {
                // The shared port still serves everything; shard-aware
                // clients fall back to it when this port does not answer.
                tracing::error!(shard = broker.shard_id(), addr = %own, "cannot listen on the shard's own port: {e}");
                None
            }
        },
        None => None,
    };
    let _own_loop = own.map(|l| {
        glommio::spawn_local(accept_loop(l, broker.owner_only(), config.clone(), open.clone(), shard_ports.clone()))
    });
    let listener = match glommio::net::TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(shard = broker.shard_id(), %addr, "cannot listen: {e}");
            return;
        }
    };
    tracing::info!(shard = broker.shard_id(), %addr, "accepting connections on the shared port");
    accept_loop(listener, broker, config, open, shard_ports).await;
}

async fn accept_loop(
    listener: glommio::net::TcpListener,
    broker: Broker,
    config: NetConfig,
    open: Rc<Cell<usize>>,
    shard_ports: Rc<[u16]>,
) {
    loop {
        let stream = match listener.accept().await {
            Ok(s) => s,
            Err(e) => {
                // Out of file descriptors and the like: keep serving the
                // connections we have, try again shortly.
                tracing::warn!(shard = broker.shard_id(), "accept failed: {e}");
                glommio::timer::sleep(std::time::Duration::from_millis(50)).await;
                continue;
            }
        };
        if broker.is_draining() {
            continue;
        }
        if open.get() >= config.connections_per_shard_max {
            tracing::warn!(shard = broker.shard_id(), "connection limit reached; closing a new connection");
            continue;
        }
        open.set(open.get() + 1);
        broker.metrics().connections_opened.add(1);
        let (broker, limits, open, shard_ports) =
            (broker.clone(), config.limits.clone(), open.clone(), shard_ports.clone());
        glommio::spawn_local(async move {
            let metrics = broker.metrics().clone();
            serve_tcp(broker, stream, limits, shard_ports).await;
            // Each accepted connection is counted open once and closed once.
            assert!(open.get() > 0, "more connections closed than opened");
            open.set(open.get() - 1);
            metrics.connections_closed.add(1);
        })
        .detach();
    }
}

/// One plain TCP connection, speaking the native protocol.
async fn serve_tcp(broker: Broker, stream: TcpStream, limits: ConnectionLimits, shard_ports: Rc<[u16]>) {
    let _ = stream.set_nodelay(true);
    let endpoints = session::Endpoints {
        peer: stream.peer_addr().map(|a| a.to_string()).unwrap_or_default(),
        local: stream.local_addr().ok().map(|a| a.to_string()),
    };
    let door = native::NativeDoor::new(shard_ports);
    session::run(broker, door, stream.split(), endpoints, magnetar_core::Principal::Anonymous, limits).await;
}
