//! magnetar-net: listeners and connections.
//!
//! Every shard runs one acceptor on the same port (SO_REUSEPORT), so the
//! kernel spreads connections over shards. A connection speaks the native
//! protocol (frames from magnetar-wire) with the `Broker` handle of its own
//! shard, which routes each request to the topic's owner shard. This crate
//! knows nothing of files; core knows nothing of sockets.

mod connection;

use magnetar_core::Broker;
use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;

pub use connection::ConnectionLimits;

/// Network settings shared by all shards.
#[derive(Debug, Clone)]
pub struct NetConfig {
    pub limits: ConnectionLimits,
    /// Most connections one shard accepts; more are closed at once.
    pub connections_per_shard_max: usize,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self { limits: ConnectionLimits::default(), connections_per_shard_max: 10_000 }
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

/// The accept loop of one shard. Runs until the future is dropped (the core
/// drops it at shutdown).
pub async fn serve(broker: Broker, addr: SocketAddr, config: NetConfig) {
    let listener = match glommio::net::TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(shard = broker.shard_id(), %addr, "cannot listen: {e}");
            return;
        }
    };
    tracing::debug!(shard = broker.shard_id(), %addr, "listening");
    let open = Rc::new(Cell::new(0usize));
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
        let (broker, limits, open) = (broker.clone(), config.limits.clone(), open.clone());
        glommio::spawn_local(async move {
            connection::run(broker, stream, limits).await;
            open.set(open.get() - 1);
        })
        .detach();
    }
}
