//! One TCP connection to a broker, shared by the producers and consumers
//! of a [`Client`](crate::Client) that use it. A connection knows nothing of
//! its siblings: the pool of a client's connections, and the choice of one
//! for a topic, is [`pool`]'s, above the connections.
//!
//! Four tokio tasks serve it:
//! - the **writer** owns the socket's write half and drains a bounded channel of
//!   already-encoded frames, gathering whatever is queued into one large write
//!   (so pipelined sends cost one syscall per batch, not per message);
//! - the **reader** owns the read half and demultiplexes frames
//!   ([`demux`]);
//! - the optional **keepalive** sends `Ping` and declares the connection dead
//!   when the broker stays silent for two intervals;
//! - the **send timer** fails each send whose receipt is overdue (one timer
//!   for the connection, not one per send: see `shared::send_timeouts`).
//!
//! Their shared state is [`shared`]'s.

pub(crate) mod admin;
pub(crate) mod demux;
pub(crate) mod pool;
mod shared;
pub(crate) mod tls;

use crate::error::{ClientError, Result};
use bytes::{Bytes, BytesMut};
use magnetar_wire::{encode_frame, Command, FrameDecoder, MessageId, PROTOCOL_VERSION};
pub(crate) use shared::ConsumerSlot;
use shared::{ProducerSlot, Shared};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, OwnedSemaphorePermit};
use tokio::task::JoinHandle;

/// Frames waiting for the writer task. Bounded so that a stalled socket pushes
/// back on senders instead of growing memory; producers are further bounded
/// by their `max_pending`, consumers by their receiver queue.
const WRITE_QUEUE_FRAMES_MAX: usize = 4096;
/// Upper bound of one gathered write. Large enough to amortize the syscall,
/// small enough that one batch does not monopolize the socket buffer.
const WRITE_BATCH_BYTES_MAX: usize = 1 << 20;
/// Read buffer growth step: what one read may take from the socket. Large,
/// so that catching up costs few read syscalls per message. A received
/// message keeps its block alive (its payload is a slice of it) until it is
/// dropped.
pub(crate) const READ_CHUNK_BYTES: usize = 256 * 1024;
/// On shutdown the writer gets this long to flush frames already queued.
const SHUTDOWN_FLUSH_TIMEOUT: Duration = Duration::from_secs(1);

/// Settings of a [`Client`](crate::Client) and its connection.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// Deadline of every request/answer exchange (connect handshake, create
    /// producer, subscribe, close, confirmed ack) and of each send receipt.
    pub operation_timeout: Duration,
    /// Deadline of the TCP connect.
    pub connect_timeout: Duration,
    /// Send a `Ping` this often; the connection is declared dead when nothing
    /// arrives from the broker for two intervals. `None` disables it (the
    /// broker's own `Ping`s are always answered).
    pub keepalive_interval: Option<Duration>,
    /// Largest frame accepted from the broker.
    pub max_frame_bytes: u32,
    /// Connect each producer and consumer straight to the port of the
    /// broker shard that owns its topic, when the broker announces per-shard
    /// ports (`conn::pool`). Off: everything uses the one connection to
    /// the given address, and the broker forwards between its shards.
    pub shard_aware: bool,
    /// A token (JWT) sent in `Connect` as auth method `token`, for a broker
    /// with token authentication on; `None`: no credentials.
    pub auth_token: Option<AuthToken>,
    /// TLS to every broker port (`None`: plain TCP). A `magnetar+tls://`
    /// URL needs it.
    pub tls: Option<tls::TlsOptions>,
}

/// The read half of a connection's byte stream, plain or TLS.
pub(crate) type ReadHalf = Box<dyn tokio::io::AsyncRead + Send + Unpin>;
/// The write half of a connection's byte stream, plain or TLS.
pub(crate) type WriteHalf = Box<dyn tokio::io::AsyncWrite + Send + Unpin>;

/// A token sent to the broker. Its `Debug` does not show it, so logged
/// options never leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct AuthToken(pub String);

impl std::fmt::Debug for AuthToken {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "AuthToken(not shown)")
    }
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            operation_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            keepalive_interval: Some(Duration::from_secs(30)),
            max_frame_bytes: magnetar_wire::FRAME_BYTES_MAX_DEFAULT,
            shard_aware: true,
            auth_token: None,
            tls: None,
        }
    }
}

/// What the broker said in `Connected`.
#[derive(Debug, Clone)]
pub struct ServerInfo {
    pub server_version: String,
    pub protocol_version: u32,
    /// Largest frame the broker accepts; bigger messages are refused locally.
    pub max_frame_bytes: u32,
    /// Shard the connection landed on.
    pub shard: u32,
    /// The port each shard listens on by itself (index = shard id); empty
    /// when the broker has none (an older broker).
    pub shard_ports: Vec<u16>,
}
/// A live connection. Dropping the last handle stops the reader and keepalive
/// and lets the writer flush and close the socket.
pub(crate) struct Connection {
    shared: Arc<Shared>,
    write: mpsc::Sender<Bytes>,
    pub server: ServerInfo,
    pub options: ClientOptions,
    /// The port this connection reached.
    pub port: u16,
    next_request_id: AtomicU64,
    next_handle_id: AtomicU64,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// Refuses `frame` when the broker would, for its size: `MessageTooLarge`
/// naming `size`, the bytes of the message it carries.
pub(crate) fn check_frame_size(frame: &[u8], size: usize, max_frame_bytes: u32) -> Result<()> {
    // The limit counts the bytes after the 4-byte length field.
    let frame_len = frame.len().saturating_sub(4);
    if u32::try_from(frame_len).map_or(true, |len| len > max_frame_bytes) {
        return Err(ClientError::MessageTooLarge { size, max_frame_bytes });
    }
    Ok(())
}

/// Checks an answer that must be `Success`; anything else is an
/// `UnexpectedResponse` to `request`.
pub(crate) fn expect_success(answer: Command, request: &'static str) -> Result<()> {
    match answer {
        Command::Success { .. } => Ok(()),
        other => Err(ClientError::UnexpectedResponse { request, got: format!("{other:?}") }),
    }
}

fn encode(command: &Command, payload: &[u8]) -> Result<Bytes> {
    let mut dst = BytesMut::with_capacity(payload.len() + 128);
    encode_frame(command, payload, &mut dst)?;
    Ok(dst.freeze())
}

impl Connection {
    /// Open the TCP connection, do the `Connect`/`Connected` handshake and
    /// start the tasks.
    pub(crate) async fn open(host: &str, port: u16, options: ClientOptions) -> Result<Connection> {
        let stream = tokio::time::timeout(options.connect_timeout, TcpStream::connect((host, port)))
            .await
            .map_err(|_| ClientError::Timeout { operation: "connect", after: options.connect_timeout })?
            .map_err(|source| ClientError::Connect { addr: format!("{host}:{port}"), source })?;
        // Latency matters more than packet count: the writer already batches.
        stream.set_nodelay(true)?;
        let (mut rd, mut wr): (ReadHalf, WriteHalf) = match &options.tls {
            None => {
                let (rd, wr) = stream.into_split();
                (Box::new(rd), Box::new(wr))
            }
            Some(tls) => {
                let stream = tokio::time::timeout(options.connect_timeout, tls.connect(host, stream)).await.map_err(
                    |_| ClientError::Timeout { operation: "TLS handshake", after: options.connect_timeout },
                )??;
                let (rd, wr) = tokio::io::split(stream);
                (Box::new(rd), Box::new(wr))
            }
        };
        let mut decoder = FrameDecoder::new(options.max_frame_bytes);
        let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES);

        let connect = Command::Connect {
            client_version: concat!("magnetar-client/", env!("CARGO_PKG_VERSION")).to_string(),
            protocol_version: PROTOCOL_VERSION,
            // Protocol version 2: the broker keeps its runs within it.
            max_frame_bytes: options.max_frame_bytes,
            auth_method: if options.auth_token.is_some() { "token".into() } else { String::new() },
            auth_data: magnetar_wire::AuthData(
                options.auth_token.as_ref().map(|t| t.0.trim().as_bytes().to_vec()).unwrap_or_default(),
            ),
        };
        wr.write_all(&encode(&connect, &[])?).await?;
        let handshake = async {
            loop {
                if let Some(frame) = decoder.decode(&mut buf)? {
                    return Ok::<_, ClientError>(frame.command);
                }
                buf.reserve(READ_CHUNK_BYTES);
                if rd.read_buf(&mut buf).await? == 0 {
                    return Err(ClientError::Disconnected {
                        reason: "broker closed the connection during the handshake".into(),
                    });
                }
            }
        };
        let answer = tokio::time::timeout(options.operation_timeout, handshake)
            .await
            .map_err(|_| ClientError::Timeout { operation: "connect handshake", after: options.operation_timeout })??;
        let server = match answer {
            Command::Connected { server_version, protocol_version, max_frame_bytes, shard, shard_ports } => {
                ServerInfo { server_version, protocol_version, max_frame_bytes, shard, shard_ports }
            }
            Command::Error { code, message, .. } => return Err(ClientError::Broker { code, message }),
            other => return Err(ClientError::UnexpectedResponse { request: "Connect", got: format!("{other:?}") }),
        };

        let shared = Arc::new(Shared::new());
        let (write, write_rx) = mpsc::channel(WRITE_QUEUE_FRAMES_MAX);
        let pong = encode(&Command::Pong, &[])?;
        // The writer is not aborted on drop: it ends by itself once every
        // sender is gone, after writing what was queued (e.g. the
        // CloseProducer of a dropped producer).
        tokio::spawn(writer_loop(shared.clone(), wr, write_rx));
        let mut tasks = Vec::with_capacity(3);
        tasks.push(tokio::spawn(demux::reader_loop(shared.clone(), rd, decoder, buf, write.downgrade(), pong)));
        tasks.push(tokio::spawn(shared::send_timeouts(shared.clone(), options.operation_timeout)));
        if let Some(interval) = options.keepalive_interval {
            let ping = encode(&Command::Ping, &[])?;
            tasks.push(tokio::spawn(keepalive_loop(shared.clone(), write.downgrade(), ping, interval)));
        }
        Ok(Connection {
            shared,
            write,
            server,
            options,
            port,
            next_request_id: AtomicU64::new(1),
            next_handle_id: AtomicU64::new(1),
            tasks,
        })
    }

    fn disconnected(&self) -> ClientError {
        let reason = self.shared.closed_reason().unwrap_or_else(|| "writer stopped".into());
        ClientError::Disconnected { reason }
    }

    /// A fresh producer or consumer id, unique on this connection.
    pub(crate) fn next_handle_id(&self) -> u64 {
        self.next_handle_id.fetch_add(1, Ordering::Relaxed)
    }

    /// Encode a frame, refusing what the broker would refuse for size.
    pub(crate) fn encode(&self, command: &Command, payload: &[u8]) -> Result<Bytes> {
        let frame = encode(command, payload)?;
        check_frame_size(&frame, payload.len(), self.server.max_frame_bytes)?;
        Ok(frame)
    }

    /// Queue an encoded frame for the writer; waits while the queue is full.
    pub(crate) async fn write(&self, frame: Bytes) -> Result<()> {
        if self.shared.closed_reason().is_some() {
            return Err(self.disconnected());
        }
        self.write.send(frame).await.map_err(|_| self.disconnected())
    }

    /// [`write`](Self::write) the frame of the send just recorded with
    /// [`push_inflight`](Self::push_inflight); if it had to wait for room in
    /// the queue, its timeout starts again when it got in (a receipt's time
    /// counts from `send_async`'s return).
    pub(crate) async fn write_send(&self, frame: Bytes, producer_id: u64, sequence_id: u64) -> Result<()> {
        if self.shared.closed_reason().is_some() {
            return Err(self.disconnected());
        }
        match self.write.try_send(frame) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(self.disconnected()),
            Err(mpsc::error::TrySendError::Full(frame)) => {
                self.write.send(frame).await.map_err(|_| self.disconnected())?;
                self.shared.restart_deadline(producer_id, sequence_id, self.options.operation_timeout);
                Ok(())
            }
        }
    }

    /// Encode and queue a command that expects no answer.
    pub(crate) async fn send_command(&self, command: &Command) -> Result<()> {
        let frame = self.encode(command, &[])?;
        self.write(frame).await
    }

    /// Queue a command without blocking the caller: directly if the write
    /// queue has room, else from a spawned task (needs a tokio runtime).
    /// For callers that must stay cancel-safe, like `Consumer::receive`.
    pub(crate) fn send_command_nowait(self: &Arc<Self>, command: &Command) -> Result<()> {
        let frame = self.encode(command, &[])?;
        match self.write.try_send(frame) {
            Ok(()) => Ok(()),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(self.disconnected()),
            Err(mpsc::error::TrySendError::Full(frame)) => {
                let handle = tokio::runtime::Handle::try_current().map_err(|_| ClientError::InvalidOption {
                    option: "runtime",
                    reason: "the client must be used inside a tokio runtime",
                })?;
                let conn = self.clone();
                handle.spawn(async move {
                    let _ = conn.write(frame).await;
                });
                Ok(())
            }
        }
    }

    /// Queue a command without waiting (for `Drop` paths); dropped if the queue is full.
    pub(crate) fn try_send_command(&self, command: &Command) {
        if let Ok(frame) = self.encode(command, &[]) {
            let _ = self.write.try_send(frame);
        }
    }

    /// Send the command built from a fresh request id and await the answer
    /// that echoes it, within the operation timeout. A broker `Error` becomes
    /// `ClientError::Broker`.
    pub(crate) async fn request(&self, operation: &'static str, build: impl FnOnce(u64) -> Command) -> Result<Command> {
        self.request_within(operation, self.options.operation_timeout, build).await
    }

    /// [`request`](Self::request) with its own deadline (e.g. a producer
    /// that waits for exclusive access).
    pub(crate) async fn request_within(
        &self,
        operation: &'static str,
        after: Duration,
        build: impl FnOnce(u64) -> Command,
    ) -> Result<Command> {
        let request_id = self.next_request_id.fetch_add(1, Ordering::Relaxed);
        let (tx, rx) = oneshot::channel();
        {
            let mut st = self.shared.lock();
            if let Some(reason) = &st.closed {
                return Err(ClientError::Disconnected { reason: reason.clone() });
            }
            st.requests.insert(request_id, tx);
        }
        let command = build(request_id);
        let frame = match self.encode(&command, &[]) {
            Ok(frame) => frame,
            Err(e) => {
                self.shared.lock().requests.remove(&request_id);
                return Err(e);
            }
        };
        self.write(frame).await?;
        match tokio::time::timeout(after, rx).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(self.disconnected()),
            Err(_) => {
                self.shared.lock().requests.remove(&request_id);
                Err(ClientError::Timeout { operation, after })
            }
        }
    }

    pub(crate) fn register_producer(&self, producer_id: u64, name: String, closed: Arc<AtomicBool>) -> Result<()> {
        let mut st = self.shared.lock();
        if let Some(reason) = &st.closed {
            return Err(ClientError::Disconnected { reason: reason.clone() });
        }
        let previous = st.producers.insert(producer_id, ProducerSlot::new(name, closed));
        assert!(previous.is_none(), "producer id {producer_id} registered twice");
        Ok(())
    }

    /// Record a send before its frame is written, so that its receipt always
    /// finds it; `done` gets the outcome: the receipt, the broker's error,
    /// the connection's or producer's end, or `Timeout` when no receipt came
    /// within the operation timeout. `permit` is held until the broker
    /// answers (or the producer or connection goes). Fails if the connection
    /// or the producer is gone.
    pub(crate) fn push_inflight(
        &self,
        producer_id: u64,
        sequence_id: u64,
        done: oneshot::Sender<Result<MessageId>>,
        permit: OwnedSemaphorePermit,
    ) -> Result<()> {
        self.shared.push_inflight(producer_id, sequence_id, done, permit, self.options.operation_timeout)
    }

    /// Forget a producer, failing its in-flight sends with `ProducerClosed`.
    pub(crate) fn remove_producer(&self, producer_id: u64) {
        let slot = self.shared.lock().producers.remove(&producer_id);
        if let Some(slot) = slot {
            slot.closed.store(true, Ordering::Release);
            for send in slot.inflight {
                send.finish(Err(ClientError::ProducerClosed { producer_name: slot.name.clone() }));
            }
        }
    }

    pub(crate) fn register_consumer(&self, consumer_id: u64, slot: ConsumerSlot) -> Result<()> {
        let mut st = self.shared.lock();
        if let Some(reason) = &st.closed {
            return Err(ClientError::Disconnected { reason: reason.clone() });
        }
        let previous = st.consumers.insert(consumer_id, slot);
        assert!(previous.is_none(), "consumer id {consumer_id} registered twice");
        Ok(())
    }

    pub(crate) fn remove_consumer(&self, consumer_id: u64) {
        let slot = self.shared.lock().consumers.remove(&consumer_id);
        if let Some(slot) = slot {
            slot.closed.store(true, Ordering::Release);
        }
    }

    /// Removes a consumer whose subscribe failed: as `remove_consumer`,
    /// but its queue gets no `End`. (A multi-topic member retried after
    /// `NotOwner` shares its queue index with the failed attempt; an `End`
    /// from that attempt would end the member that then subscribed.)
    pub(crate) fn forget_consumer(&self, consumer_id: u64) {
        let slot = self.shared.lock().consumers.remove(&consumer_id);
        if let Some(mut slot) = slot {
            slot.closed.store(true, Ordering::Release);
            slot.deliver.disarm();
        }
    }
}

async fn writer_loop(shared: Arc<Shared>, mut wr: WriteHalf, mut rx: mpsc::Receiver<Bytes>) {
    let mut shutdown = shared.shutdown.subscribe();
    let mut batch = BytesMut::with_capacity(WRITE_BATCH_BYTES_MAX);
    let mut frames: Vec<Bytes> = Vec::with_capacity(256);
    loop {
        let first = tokio::select! {
            biased;
            frame = rx.recv() => frame,
            _ = shutdown.changed() => {
                // Flush what is already queued (e.g. acks before a close),
                // within a short bound, then close the socket.
                let flush = async {
                    while let Ok(frame) = rx.try_recv() {
                        wr.write_all(&frame).await?;
                    }
                    wr.shutdown().await
                };
                let _ = tokio::time::timeout(SHUTDOWN_FLUSH_TIMEOUT, flush).await;
                return;
            }
        };
        let Some(first) = first else {
            // Every handle is gone: close our side; the broker then closes its side.
            let _ = wr.shutdown().await;
            return;
        };
        let mut bytes = first.len();
        frames.push(first);
        while bytes < WRITE_BATCH_BYTES_MAX {
            match rx.try_recv() {
                Ok(frame) => {
                    bytes += frame.len();
                    frames.push(frame);
                }
                Err(_) => break,
            }
        }
        let result = if let [only] = frames.as_slice() {
            wr.write_all(only).await
        } else {
            // One copy into a contiguous buffer is far cheaper than one
            // syscall per frame.
            batch.clear();
            for frame in &frames {
                batch.extend_from_slice(frame);
            }
            wr.write_all(&batch).await
        };
        frames.clear();
        if let Err(e) = result {
            shared.fail(format!("write to broker failed: {e}"));
            return;
        }
    }
}
async fn keepalive_loop(shared: Arc<Shared>, write: mpsc::WeakSender<Bytes>, ping: Bytes, interval: Duration) {
    let mut shutdown = shared.shutdown.subscribe();
    loop {
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = shutdown.changed() => return,
        }
        let idle = shared.idle();
        if idle > interval * 2 {
            shared.fail(format!("no frame from broker for {idle:?} (keepalive)"));
            return;
        }
        let Some(w) = write.upgrade() else { return };
        let _ = w.try_send(ping.clone());
    }
}

impl Connection {
    /// Completes once the connection shuts down (at once if it already has).
    pub(crate) fn shut_down(&self) -> impl std::future::Future<Output = ()> + Send + 'static {
        let mut rx = self.shared.shutdown.subscribe();
        async move {
            // A dropped sender (the connection gone) ends the wait too.
            let _ = rx.wait_for(|down| *down).await;
        }
    }

    /// Whether the connection is still up.
    pub(crate) fn is_open(&self) -> bool {
        self.shared.closed_reason().is_none()
    }

    /// Why the connection ended, if it has.
    pub(crate) fn closed_reason(&self) -> Option<String> {
        self.shared.closed_reason()
    }

    /// End the connection (idempotent: the first reason wins); everything
    /// waiting on it fails with `Disconnected`.
    pub(crate) fn fail(&self, reason: String) {
        self.shared.fail(reason);
    }
}
