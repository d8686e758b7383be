//! magnetar-net: listeners and connections.
//!
//! Every shard runs one acceptor on the same port (SO_REUSEPORT), so the
//! kernel spreads connections over shards. A connection is a session
//! (`session`: producers, consumers, receipts, backpressure, the outbox)
//! behind a door, the protocol it speaks: the native one (`native`: frames
//! from magnetar-wire) or Apache Pulsar's (`pulsar`: magnetar-pulsar-wire).
//! The shared port serves both: a connection's first bytes decide
//! ([`speaks_pulsar`]); `NetConfig::pulsar_addr` serves Pulsar alone. It calls the `Broker` handle of its own
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
mod pulsar;
mod session;
mod slots;
pub mod tls;

use futures::io::AsyncReadExt;
use glommio::net::TcpStream;
use magnetar_core::Broker;
use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;

pub use pulsar::PulsarConfig;
pub use session::ConnectionLimits;

/// Network settings shared by all shards.
#[derive(Debug, Clone)]
pub struct NetConfig {
    pub limits: ConnectionLimits,
    /// Most connections one shard accepts (all its ports together); past
    /// it a new connection evicts one (see `connections_reserve`) or is
    /// closed at once.
    pub connections_per_shard_max: usize,
    /// When fewer slots than this are free, a new connection first evicts
    /// the oldest connection still in its handshake, so connections that
    /// never complete one cannot hold the last slots.
    pub connections_reserve: usize,
    /// Most connections of one shard from one peer address; more are
    /// closed at once.
    pub connections_per_peer_max: usize,
    /// Bytes one shard holds for all its clients (unwritten output and
    /// incomplete inbound frames) above which no connection of the shard
    /// is read and deliveries pause.
    pub shard_buffered_bytes_max: usize,
    /// The address shard `i` listens on by itself (ports resolved, e.g. by a
    /// [`PortReservation`] each); empty: no per-shard listeners.
    pub shard_addrs: Vec<SocketAddr>,
    /// An address of its own for the Pulsar protocol (port resolved); the
    /// shared port answers Pulsar clients too.
    pub pulsar_addr: Option<SocketAddr>,
    pub pulsar: PulsarConfig,
    /// Serve TLS on every port, whatever the protocol (`None`: plain TCP).
    pub tls: Option<tls::TlsSettings>,
}

impl Default for NetConfig {
    fn default() -> Self {
        Self {
            limits: ConnectionLimits::default(),
            connections_per_shard_max: 10_000,
            connections_reserve: 100,
            connections_per_peer_max: 1_000,
            shard_buffered_bytes_max: 512 * 1024 * 1024,
            shard_addrs: Vec::new(),
            pulsar_addr: None,
            pulsar: PulsarConfig::default(),
            tls: None,
        }
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
    let slot_limits = slots::SlotLimits {
        connections_max: config.connections_per_shard_max,
        reserve: config.connections_reserve.min(config.connections_per_shard_max),
        per_peer_max: config.connections_per_peer_max,
    };
    let buffers = Rc::new(slots::Buffers::new(config.shard_buffered_bytes_max));
    let open = Rc::new(slots::Slots::new(slot_limits, buffers));
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
        let (config, open, ports) = (config.clone(), open.clone(), shard_ports.clone());
        glommio::spawn_local(accept_loop(l, broker.owner_only(), config, open, ports, Protocol::Sniff))
    });
    let pulsar = config.pulsar_addr.and_then(|addr| match glommio::net::TcpListener::bind(addr) {
        Ok(l) => {
            tracing::info!(shard = broker.shard_id(), %addr, "accepting Pulsar connections");
            Some(l)
        }
        Err(e) => {
            tracing::error!(shard = broker.shard_id(), %addr, "cannot listen for Pulsar connections: {e}");
            None
        }
    });
    let _pulsar_loop = pulsar.map(|l| {
        let (config, open, ports) = (config.clone(), open.clone(), shard_ports.clone());
        glommio::spawn_local(accept_loop(l, broker.clone(), config, open, ports, Protocol::Pulsar))
    });
    let listener = match glommio::net::TcpListener::bind(addr) {
        Ok(l) => l,
        Err(e) => {
            tracing::error!(shard = broker.shard_id(), %addr, "cannot listen: {e}");
            return;
        }
    };
    tracing::info!(shard = broker.shard_id(), %addr, "accepting connections on the shared port");
    accept_loop(listener, broker, config, open, shard_ports, Protocol::Sniff).await;
}

/// What a listener serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Protocol {
    /// Either protocol, by the connection's first bytes.
    Sniff,
    Pulsar,
}

async fn accept_loop(
    listener: glommio::net::TcpListener,
    broker: Broker,
    config: NetConfig,
    open: Rc<slots::Slots>,
    shard_ports: Rc<[u16]>,
    protocol: Protocol,
) {
    let pulsar = Rc::new(PulsarConfig {
        tls: config.tls.is_some(),
        shard_addrs: config.shard_addrs.clone(),
        ..config.pulsar.clone()
    });
    // TLS handshakes in progress on this listener.
    let handshakes = Rc::new(Cell::new(0usize));
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
        let slot = match open.admit(stream.peer_addr().ok()) {
            Ok(slot) => slot,
            Err(why) => {
                tracing::warn!(shard = broker.shard_id(), peer = ?stream.peer_addr().ok(), "refusing a connection: {why}");
                continue;
            }
        };
        broker.metrics().connections_opened.add(1);
        let (broker, limits, shard_ports, pulsar) =
            (broker.clone(), config.limits.clone(), shard_ports.clone(), pulsar.clone());
        let tls = config.tls.clone().map(|t| (t, handshakes.clone()));
        let doors = Doors { shard_ports, pulsar, protocol };
        glommio::spawn_local(async move {
            let metrics = broker.metrics().clone();
            serve_tcp(broker, stream, limits, doors, tls, slot.control.clone()).await;
            // The slot is freed here, or was when the connection was evicted.
            drop(slot);
            metrics.connections_closed.add(1);
        })
        .detach();
    }
}

/// Bytes a connection's start is judged by (see [`speaks_pulsar`]).
const SNIFF_BYTES: usize = 9;

/// Whether a connection that begins with `head` speaks Pulsar: a Pulsar
/// frame starts with its total size and its command size (big-endian; a
/// CONNECT has no payload, so the first is 4 more than the second), then a
/// protobuf `BaseCommand` whose first byte is field 1's tag (0x08). A
/// native frame starts with its little-endian length and a CRC-32, which
/// match that only by a 1-in-2^40 accident.
fn speaks_pulsar(head: &[u8]) -> bool {
    let Some(h) = head.get(..SNIFF_BYTES) else { return false };
    let total = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    let cmd = u32::from_be_bytes([h[4], h[5], h[6], h[7]]);
    cmd.checked_add(4) == Some(total) && h[8] == 0x08
}

/// Whether the first bytes read so far (fewer than [`SNIFF_BYTES`]
/// perhaps) already rule Pulsar out: a total size (the first four bytes,
/// big-endian) under 5 or over `pulsar_frame_max` (the Pulsar door would
/// refuse that frame anyway). Then the connection goes to the native door
/// at once, which judges those bytes by its own rules: a client that sent
/// four bytes of an oversized native length is refused now, not when the
/// handshake timeout ends its wait for the rest of a Pulsar header.
fn rules_out_pulsar(head: &[u8], pulsar_frame_max: u32) -> bool {
    let Some(h) = head.get(..4) else { return false };
    let total = u32::from_be_bytes([h[0], h[1], h[2], h[3]]);
    !(5..=pulsar_frame_max).contains(&total)
}

/// The read half of a stream with bytes already read off its front put
/// back.
struct Prefixed<R> {
    prefix: Vec<u8>,
    at: usize,
    inner: R,
}

impl<R: futures::io::AsyncRead + Unpin> futures::io::AsyncRead for Prefixed<R> {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut [u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        let me = &mut *self;
        if me.at < me.prefix.len() {
            let n = buf.len().min(me.prefix.len() - me.at);
            buf[..n].copy_from_slice(&me.prefix[me.at..me.at + n]);
            me.at += n;
            return std::task::Poll::Ready(Ok(n));
        }
        std::pin::Pin::new(&mut me.inner).poll_read(cx, buf)
    }
}

/// What picks and makes a connection's door.
struct Doors {
    shard_ports: Rc<[u16]>,
    pulsar: Rc<PulsarConfig>,
    protocol: Protocol,
}

/// One TCP connection: TLS first when the port serves it (the handshake
/// bounded in time and, per listener, in number), then its door.
async fn serve_tcp(
    broker: Broker,
    stream: TcpStream,
    limits: ConnectionLimits,
    doors: Doors,
    tls: Option<(tls::TlsSettings, Rc<Cell<usize>>)>,
    control: Rc<slots::Control>,
) {
    let _ = stream.set_nodelay(true);
    let endpoints = session::Endpoints {
        peer: stream.peer_addr().map(|a| a.to_string()).unwrap_or_default(),
        local: stream.local_addr().ok().map(|a| a.to_string()),
    };
    let anonymous = magnetar_core::Principal::Anonymous;
    let Some((tls, handshakes)) = tls else {
        serve_stream(broker, stream, endpoints, anonymous, limits, doors, control).await;
        return;
    };
    let peer = endpoints.peer.clone();
    let Some(slot) = tls::HandshakeSlot::take(&handshakes, tls.handshakes_max) else {
        tracing::warn!(%peer, "{} TLS handshakes in progress; closing a new connection", tls.handshakes_max);
        return;
    };
    let accept = async { tls.acceptor.accept(stream).await.map_err(glommio::GlommioError::IoError) };
    let stream = match glommio::timer::timeout(tls.handshake_timeout, accept).await {
        Ok(s) => s,
        Err(e) => {
            tracing::info!(%peer, "TLS handshake failed: {e}");
            return;
        }
    };
    drop(slot);
    let principal = tls::peer_principal(stream.get_ref().1.peer_certificates());
    serve_stream(broker, stream, endpoints, principal, limits, doors, control).await;
}

/// One connection's byte stream (plain or TLS): the native protocol or
/// Pulsar's, as its first bytes say (or Pulsar's on a Pulsar-only
/// listener). `principal`: who the transport says the client is.
async fn serve_stream<S>(
    broker: Broker,
    stream: S,
    endpoints: session::Endpoints,
    principal: magnetar_core::Principal,
    limits: ConnectionLimits,
    doors: Doors,
    control: Rc<slots::Control>,
) where
    S: futures::io::AsyncRead + futures::io::AsyncWrite + Unpin + 'static,
{
    let (mut reader, writer) = stream.split();
    let mut head = Vec::with_capacity(SNIFF_BYTES);
    if doors.protocol == Protocol::Sniff {
        let mut byte = [0u8; SNIFF_BYTES];
        let pulsar_frame_max = doors.pulsar.max_message_bytes.saturating_add(magnetar_pulsar_wire::FRAME_PADDING_BYTES);
        while head.len() < SNIFF_BYTES && !rules_out_pulsar(&head, pulsar_frame_max) {
            // The first bytes come within the handshake timeout, like the
            // rest of the handshake, and an eviction ends the wait.
            let read = reader.read(&mut byte[..SNIFF_BYTES - head.len()]);
            match session::within_handshake(read, &control, &limits).await {
                Ok(Ok(0) | Err(_)) => return,
                Ok(Ok(n)) => head.extend_from_slice(&byte[..n]),
                Err(why) => {
                    tracing::warn!(peer = %endpoints.peer, "closing connection: {why}");
                    return;
                }
            }
        }
    }
    let pulsar_door = doors.protocol == Protocol::Pulsar || speaks_pulsar(&head);
    let reader = Prefixed { prefix: head, at: 0, inner: reader };
    if pulsar_door {
        let door = pulsar::PulsarDoor::new(doors.pulsar);
        session::run(broker, door, (reader, writer), endpoints, principal, limits, control).await;
    } else {
        let door = native::NativeDoor::new(doors.shard_ports);
        session::run(broker, door, (reader, writer), endpoints, principal, limits, control).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a Pulsar CONNECT is recognised, a native Connect is not.
    #[test]
    fn first_bytes_pick_the_door() {
        use magnetar_pulsar_wire::proto::{base_command::Type, BaseCommand, CommandConnect};
        let connect = BaseCommand {
            r#type: Type::Connect as i32,
            connect: Some(CommandConnect {
                client_version: "x".into(),
                protocol_version: Some(21),
                ..Default::default()
            }),
            ..Default::default()
        };
        let mut pulsar = bytes::BytesMut::new();
        magnetar_pulsar_wire::encode_command(&connect, &mut pulsar).unwrap_or_else(|e| panic!("{e}"));
        assert!(speaks_pulsar(&pulsar));
        let native = magnetar_wire::Command::Connect {
            client_version: "x".into(),
            protocol_version: magnetar_wire::PROTOCOL_VERSION,
            max_frame_bytes: 0,
            auth_method: String::new(),
            auth_data: magnetar_wire::AuthData::default(),
        };
        let mut wire = bytes::BytesMut::new();
        magnetar_wire::encode_frame(&native, &[], &mut wire).unwrap_or_else(|e| panic!("{e}"));
        assert!(!speaks_pulsar(&wire));
        assert!(!speaks_pulsar(&pulsar[..8]));

        // Early: no prefix of a Pulsar CONNECT rules Pulsar out; four bytes
        // of a native frame, an oversized native length or text do.
        let max = 5 * 1024 * 1024 + magnetar_pulsar_wire::FRAME_PADDING_BYTES;
        for n in 0..=SNIFF_BYTES {
            assert!(!rules_out_pulsar(&pulsar[..n], max), "{n} bytes of a Pulsar CONNECT");
        }
        assert!(!rules_out_pulsar(&wire[..3], max));
        assert!(rules_out_pulsar(&wire[..4], max), "a native Connect's length");
        assert!(rules_out_pulsar(&0x7fff_ffffu32.to_le_bytes(), max));
        assert!(rules_out_pulsar(&3u32.to_le_bytes(), max));
        assert!(rules_out_pulsar(b"GET ", max));
        assert!(rules_out_pulsar(&[0, 0, 0, 4], max), "smaller than any frame");
        assert!(rules_out_pulsar(&(max + 1).to_be_bytes(), max));
        assert!(!rules_out_pulsar(&max.to_be_bytes(), max));
    }
}
