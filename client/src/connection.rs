//! One TCP connection to a broker, shared by every producer and consumer of a
//! [`Client`](crate::Client).
//!
//! Three tokio tasks serve it:
//! - the **writer** owns the socket's write half and drains a bounded channel of
//!   already-encoded frames, gathering whatever is queued into one large write
//!   (so pipelined sends cost one syscall per batch, not per message);
//! - the **reader** owns the read half, decodes frames and demultiplexes them to
//!   pending requests (by `request_id`), producers (by `producer_id`, receipts
//!   in sequence order) and consumers (by `consumer_id`); it answers `Ping`;
//! - the optional **keepalive** sends `Ping` and declares the connection dead
//!   when the broker stays silent for two intervals;
//! - the **send timer** fails each send whose receipt is overdue (one timer
//!   for the connection, not one per send: see [`send_timeouts`]).
//!
//! All routing state sits in one `std::sync::Mutex<State>` held only for map
//! operations, never across an `.await`. When the connection ends for any
//! reason, [`Shared::fail`] empties that state under the lock and fails every
//! waiter with `ClientError::Disconnected`, so nothing waits forever.

use crate::error::{ClientError, Result};
use crate::message::Message;
use bytes::{Bytes, BytesMut};
use magnetar_wire::{encode_frame, Command, FrameDecoder, MessageId, PROTOCOL_VERSION};
use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch, Notify, OwnedSemaphorePermit};
use tokio::task::JoinHandle;

/// Frames waiting for the writer task. Bounded so that a stalled socket pushes
/// back on senders instead of growing memory; producers are further bounded
/// by their `max_pending`, consumers by their receiver queue.
const WRITE_QUEUE_FRAMES_MAX: usize = 4096;
/// Upper bound of one gathered write. Large enough to amortize the syscall,
/// small enough that one batch does not monopolize the socket buffer.
const WRITE_BATCH_BYTES_MAX: usize = 1 << 20;
/// Read buffer growth step: what one read may take from the socket. A
/// catch-up read fills it; at 64 KiB the reads' syscalls were a visible
/// part of the client's CPU per message. A received message keeps its
/// block alive (its payload is a slice of it) until it is dropped.
const READ_CHUNK_BYTES: usize = 256 * 1024;
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
    /// ports (`crate::routing`). Off: everything uses the one connection to
    /// the given address, and the broker forwards between its shards.
    pub shard_aware: bool,
}

impl Default for ClientOptions {
    fn default() -> Self {
        Self {
            operation_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            keepalive_interval: Some(Duration::from_secs(30)),
            max_frame_bytes: magnetar_wire::FRAME_BYTES_MAX_DEFAULT,
            shard_aware: true,
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

/// A send awaiting its receipt. Holding the permit here, rather than in the
/// application's future, means the producer's in-flight bound counts what the
/// broker has not answered yet, even if the application drops the future
/// (or it timed out).
pub(crate) struct InflightSend {
    pub sequence_id: u64,
    /// Where the outcome goes; taken when the send times out (the entry
    /// stays, holding its permit and its place in the order, until the
    /// broker answers or the producer or connection goes).
    done: Option<oneshot::Sender<Result<MessageId>>>,
    /// When the send times out without a receipt: the operation timeout
    /// after it was queued. Never decreasing along a producer's queue.
    deadline: tokio::time::Instant,
    _permit: OwnedSemaphorePermit,
}

impl InflightSend {
    /// Completes the send's future with `outcome`, unless it timed out.
    pub(crate) fn finish(self, outcome: Result<MessageId>) {
        if let Some(done) = self.done {
            let _ = done.send(outcome);
        }
    }
}

pub(crate) struct ProducerSlot {
    pub name: String,
    pub closed: Arc<AtomicBool>,
    /// Sends in sequence order, oldest first: the broker answers them in this order.
    pub inflight: VecDeque<InflightSend>,
    /// Whether the producer has its entry in `State::send_deadlines`. Kept
    /// while its queue is empty (until the entry falls due), so that a
    /// producer with one send at a time does not touch the heap per send.
    watched: bool,
}

impl ProducerSlot {
    pub(crate) fn new(name: String, closed: Arc<AtomicBool>) -> Self {
        Self { name, closed, inflight: VecDeque::new(), watched: false }
    }
}

pub(crate) type Delivery = Result<Message>;

pub(crate) struct ConsumerSlot {
    /// Shared with every message delivered (no copy per message).
    pub topic: Arc<str>,
    pub subscription: String,
    pub closed: Arc<AtomicBool>,
    /// The consumer's queue (a multi-topic consumer's members share one).
    /// Unbounded on purpose: the broker bounds what it sends by flow
    /// permits (plus at most one whole batch entry past them), and the
    /// connection's one reader must never wait on one consumer's queue —
    /// that would stall every other consumer and request on the connection.
    pub deliver: crate::consumer::Inbox,
    /// Failover: whether the broker says this consumer is the active one.
    pub active: Arc<AtomicBool>,
    /// Wakes the consumer's timer task (which may sleep with nothing due)
    /// when the broker closes the consumer, so that it ends.
    pub timers: Arc<tokio::sync::Notify>,
}

#[derive(Default)]
struct State {
    /// Why the connection ended; `None` while it is up.
    closed: Option<String>,
    requests: HashMap<u64, oneshot::Sender<Result<Command>>>,
    producers: HashMap<u64, ProducerSlot>,
    consumers: HashMap<u64, ConsumerSlot>,
    /// When to look at a producer's sends next (at most one entry per
    /// producer, at or before its oldest pending send's deadline): the
    /// send timer's schedule.
    send_deadlines: BinaryHeap<Reverse<(tokio::time::Instant, u64)>>,
}

/// The state shared by the connection's tasks and its handles.
pub(crate) struct Shared {
    state: Mutex<State>,
    shutdown: watch::Sender<bool>,
    epoch: Instant,
    /// Milliseconds since `epoch` at which the last frame arrived.
    last_frame_ms: AtomicU64,
    /// Wakes the send timer: its schedule got its first entry, or the
    /// connection ended.
    send_timer: Notify,
}

impl Shared {
    fn new() -> Self {
        let (shutdown, _) = watch::channel(false);
        Self {
            state: Mutex::new(State::default()),
            shutdown,
            epoch: Instant::now(),
            last_frame_ms: AtomicU64::new(0),
            send_timer: Notify::new(),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // A panic while holding this lock would be a client bug; the maps are
        // still structurally valid, so keep going rather than cascade panics.
        self.state.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    fn touch(&self) {
        let ms = u64::try_from(self.epoch.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.last_frame_ms.store(ms, Ordering::Relaxed);
    }

    fn idle(&self) -> Duration {
        let last = Duration::from_millis(self.last_frame_ms.load(Ordering::Relaxed));
        self.epoch.elapsed().saturating_sub(last)
    }

    pub(crate) fn closed_reason(&self) -> Option<String> {
        self.lock().closed.clone()
    }

    /// End the connection: record why, stop the tasks, and fail every waiter.
    /// Idempotent: the first reason wins.
    pub(crate) fn fail(&self, reason: String) {
        let (requests, producers, consumers) = {
            let mut st = self.lock();
            if st.closed.is_some() {
                return;
            }
            st.closed = Some(reason.clone());
            st.send_deadlines.clear();
            (std::mem::take(&mut st.requests), std::mem::take(&mut st.producers), std::mem::take(&mut st.consumers))
        };
        tracing::debug!(%reason, "connection closed");
        let _ = self.shutdown.send(true);
        self.send_timer.notify_one();
        let disconnected = || ClientError::Disconnected { reason: reason.clone() };
        for (_, waiter) in requests {
            let _ = waiter.send(Err(disconnected()));
        }
        for (_, slot) in producers {
            for send in slot.inflight {
                send.finish(Err(disconnected()));
            }
        }
        // Dropping the consumers' senders lets `receive` drain what was
        // already delivered, then report the disconnection.
        drop(consumers);
    }

    /// Records a send before its frame is written, so that its receipt
    /// always finds it; it times out `after` from now. Fails if the
    /// connection or the producer is gone.
    fn push_inflight(
        &self,
        producer_id: u64,
        sequence_id: u64,
        done: oneshot::Sender<Result<MessageId>>,
        permit: OwnedSemaphorePermit,
        after: Duration,
    ) -> Result<()> {
        let deadline = deadline_after(after);
        let mut guard = self.lock();
        let st = &mut *guard;
        if let Some(reason) = &st.closed {
            return Err(ClientError::Disconnected { reason: reason.clone() });
        }
        let Some(slot) = st.producers.get_mut(&producer_id) else {
            return Err(ClientError::ProducerClosed { producer_name: String::new() });
        };
        if let Some(last) = slot.inflight.back() {
            // Equal ids: the chunks of one chunked message.
            if last.sequence_id > sequence_id {
                return Err(ClientError::InvalidOption {
                    option: "sequence_id",
                    reason: "must be above every sequence id still awaiting its receipt",
                });
            }
        }
        slot.inflight.push_back(InflightSend { sequence_id, done: Some(done), deadline, _permit: permit });
        if !slot.watched {
            slot.watched = true;
            let first = st.send_deadlines.is_empty();
            st.send_deadlines.push(Reverse((deadline, producer_id)));
            drop(guard);
            // Otherwise the timer sleeps until an earlier entry (every
            // entry is at most `after` from now), and looks again then.
            if first {
                self.send_timer.notify_one();
            }
        }
        Ok(())
    }

    /// Restarts the timeout of the producer's newest send if it is
    /// `sequence_id` (its frame waited for room in the write queue).
    fn restart_deadline(&self, producer_id: u64, sequence_id: u64, after: Duration) {
        let deadline = deadline_after(after);
        let mut st = self.lock();
        let newest = st.producers.get_mut(&producer_id).and_then(|slot| slot.inflight.back_mut());
        if let Some(send) = newest.filter(|s| s.sequence_id == sequence_id && s.done.is_some()) {
            // Later than every other deadline of the queue: the order holds,
            // and the producer's schedule entry (earlier) stays valid.
            send.deadline = send.deadline.max(deadline);
        }
    }

    /// Fails every send due by `now` with `Timeout` (`after` is the
    /// connection's operation timeout, for the error) and reschedules the
    /// producers that still have sends pending. The send timer's next
    /// instant (`None`: nothing scheduled); `Err` once the connection ended.
    fn expire_sends(
        &self,
        now: tokio::time::Instant,
        after: Duration,
    ) -> std::result::Result<Option<tokio::time::Instant>, ()> {
        let mut guard = self.lock();
        let st = &mut *guard;
        if st.closed.is_some() {
            return Err(());
        }
        while let Some(&Reverse((at, producer_id))) = st.send_deadlines.peek() {
            if at > now {
                return Ok(Some(at));
            }
            st.send_deadlines.pop();
            // A producer closed meanwhile has no sends left to time out.
            let Some(slot) = st.producers.get_mut(&producer_id) else { continue };
            let mut next = None;
            // Oldest first; timed-out sends (no `done`) wait for their
            // receipt at the front.
            for send in slot.inflight.iter_mut().filter(|s| s.done.is_some()) {
                if send.deadline > now {
                    next = Some(send.deadline);
                    break;
                }
                if let Some(done) = send.done.take() {
                    let _ = done.send(Err(ClientError::Timeout { operation: "send receipt", after }));
                }
            }
            match next {
                Some(at) => st.send_deadlines.push(Reverse((at, producer_id))),
                None => slot.watched = false,
            }
        }
        Ok(None)
    }
}

/// `after` from now on tokio's clock (a year when that overflows: no
/// deadline).
fn deadline_after(after: Duration) -> tokio::time::Instant {
    let now = tokio::time::Instant::now();
    now.checked_add(after).unwrap_or_else(|| now + Duration::from_secs(365 * 24 * 3600))
}

/// The connection's send timer: fails each send still without a receipt
/// at its deadline (`Timeout`, "send receipt", after `after`). One timer for
/// the connection instead of one per send (each send's own timer went
/// through tokio's timer wheel twice, a measurable share of the client's
/// CPU with 10,000 producers): the producers' oldest pending sends are
/// scheduled in `State::send_deadlines`, each producer's sends time out in
/// queue order (their deadlines never decrease along it), and a producer is
/// looked at again at its next pending send's deadline. Sleeps while
/// nothing is scheduled; ends with the connection.
async fn send_timeouts(shared: Arc<Shared>, after: Duration) {
    loop {
        let Ok(next) = shared.expire_sends(tokio::time::Instant::now(), after) else { return };
        // A push after the look above leaves a permit here: no lost wake-up.
        let woken = shared.send_timer.notified();
        match next {
            Some(at) => {
                tokio::select! {
                    () = tokio::time::sleep_until(at) => {}
                    () = woken => {}
                }
            }
            None => woken.await,
        }
    }
}

/// A live connection. Dropping the last handle stops the reader and keepalive
/// and lets the writer flush and close the socket.
pub(crate) struct Connection {
    pub shared: Arc<Shared>,
    write: mpsc::Sender<Bytes>,
    pub server: ServerInfo,
    pub options: ClientOptions,
    /// The port this connection reached, and the client's other connections.
    pub port: u16,
    pub peers: Arc<crate::routing::Peers>,
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

fn encode(command: &Command, payload: &[u8]) -> Result<Bytes> {
    let mut dst = BytesMut::with_capacity(payload.len() + 128);
    encode_frame(command, payload, &mut dst)?;
    Ok(dst.freeze())
}

impl Connection {
    /// Open the TCP connection, do the `Connect`/`Connected` handshake and
    /// start the tasks.
    pub(crate) async fn open(host: &str, port: u16, options: ClientOptions) -> Result<Connection> {
        let peers = Arc::new(crate::routing::Peers::new(host, port, options.clone()));
        Self::open_in(host, port, options, peers).await
    }

    /// [`open`](Self::open) a further connection of the client that `peers`
    /// belongs to.
    pub(crate) async fn open_in(
        host: &str,
        port: u16,
        options: ClientOptions,
        peers: Arc<crate::routing::Peers>,
    ) -> Result<Connection> {
        let stream = tokio::time::timeout(options.connect_timeout, TcpStream::connect((host, port)))
            .await
            .map_err(|_| ClientError::Timeout { operation: "connect", after: options.connect_timeout })?
            .map_err(|source| ClientError::Connect { addr: format!("{host}:{port}"), source })?;
        // Latency matters more than packet count: the writer already batches.
        stream.set_nodelay(true)?;
        let (mut rd, mut wr) = stream.into_split();
        let mut decoder = FrameDecoder::new(options.max_frame_bytes);
        let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES);

        let connect = Command::Connect {
            client_version: concat!("magnetar-client/", env!("CARGO_PKG_VERSION")).to_string(),
            protocol_version: PROTOCOL_VERSION,
            // Protocol version 2: the broker keeps its runs within it.
            max_frame_bytes: options.max_frame_bytes,
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
        tasks.push(tokio::spawn(reader_loop(shared.clone(), rd, decoder, buf, write.downgrade(), pong)));
        tasks.push(tokio::spawn(send_timeouts(shared.clone(), options.operation_timeout)));
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
            peers,
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
        let max_frame_bytes = self.server.max_frame_bytes;
        // The limit counts the bytes after the 4-byte length field.
        let frame_len = frame.len().saturating_sub(4);
        if u32::try_from(frame_len).map_or(true, |len| len > max_frame_bytes) {
            return Err(ClientError::MessageTooLarge { size: payload.len(), max_frame_bytes });
        }
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

async fn writer_loop(shared: Arc<Shared>, mut wr: OwnedWriteHalf, mut rx: mpsc::Receiver<Bytes>) {
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

async fn reader_loop(
    shared: Arc<Shared>,
    mut rd: OwnedReadHalf,
    mut decoder: FrameDecoder,
    mut buf: BytesMut,
    write: mpsc::WeakSender<Bytes>,
    pong: Bytes,
) {
    let mut shutdown = shared.shutdown.subscribe();
    // One wait for shutdown for the whole loop: a new one per read
    // registered with the watch (and unregistered) each time.
    let stopped = shutdown.changed();
    tokio::pin!(stopped);
    shared.touch();
    let reason = 'conn: loop {
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => {
                    shared.touch();
                    if let Err(reason) = dispatch(&shared, frame.command, frame.payload, &write, &pong).await {
                        break 'conn reason;
                    }
                }
                Ok(None) => break,
                // A bad length or checksum loses the frame boundary: nothing
                // after it can be trusted.
                Err(e) if e.is_fatal() => break 'conn format!("undecodable frame from broker: {e}"),
                // The frame was sound but its command was not understood (e.g.
                // a newer broker); the decoder skipped it.
                Err(e) => tracing::warn!(error = %e, "skipped a frame from the broker"),
            }
        }
        buf.reserve(READ_CHUNK_BYTES);
        tokio::select! {
            read = rd.read_buf(&mut buf) => match read {
                Ok(0) => break 'conn "broker closed the connection".to_string(),
                Ok(_) => {}
                Err(e) => break 'conn format!("read from broker failed: {e}"),
            },
            _ = &mut stopped => return,
        }
    };
    shared.fail(reason);
}

/// What one entry holds: a message, or a batch's messages in order.
enum Unpacked {
    One(Message),
    Batch(Vec<Message>),
}

/// Decodes one entry into its messages, in order: decompresses the payload when the producer compressed it, and
/// splits a batch (`num_messages` > 1) into its messages, numbered by
/// `batch_index`. The messages of a batch share one `Arc` of the entry's
/// metadata (`num_messages` is the batch size the consumer's ack tracker
/// needs) and carry their own key, properties, event time and sequence id. Messages whose bit is
/// set in `ack_set` (a batch redelivered after some of its messages were
/// acknowledged) are left out.
fn unpack_entry(
    blob: Bytes,
    id: MessageId,
    topic: &Arc<str>,
    redelivery_count: u32,
    ack_set: Vec<u64>,
) -> Result<Unpacked> {
    // Checked whole here (a bad blob is this message's error), read
    // without allocating.
    let view = magnetar_wire::view_message(&blob)?;
    let payload = blob.slice(view.payload_offset..);
    if view.chunk.is_some() {
        // A chunk: decompressed once the whole message is reassembled.
        let metadata = Arc::new(view.to_metadata(&blob));
        return Ok(Unpacked::One(Message::of_entry(id, topic.clone(), metadata, payload, redelivery_count)));
    }
    let payload = match view.compression {
        magnetar_wire::CompressionType::None => payload,
        codec => crate::compression::decompress(codec, &payload, view.uncompressed_size)?,
    };
    if view.num_messages <= 1 {
        return Ok(Unpacked::One(Message::of_blob(id, topic.clone(), blob, payload, redelivery_count)));
    }
    let mut metadata = view.to_metadata(&blob);
    metadata.compression = magnetar_wire::CompressionType::None;
    let records = magnetar_wire::decode_batch(&payload, metadata.num_messages)?;
    // One metadata for the entry, shared by its messages (the per-message
    // fields are each message's own); its payload size is the batch's.
    let entry = Arc::new(metadata);
    let acked = |i: usize| ack_set.get(i / 64).is_some_and(|w| w & (1 << (i % 64)) != 0);
    let mut messages = Vec::with_capacity(records.len());
    for (i, r) in records.into_iter().enumerate() {
        if acked(i) {
            continue;
        }
        let fields = (r.partition_key.is_some() || r.ordering_key.is_some() || !r.properties.is_empty()).then(|| {
            Box::new(crate::message::RecordFields {
                partition_key: r.partition_key,
                ordering_key: r.ordering_key,
                properties: r.properties,
            })
        });
        messages.push(Message {
            id: MessageId { batch_index: i32::try_from(i).unwrap_or(i32::MAX), ..id },
            topic: topic.clone(),
            payload: r.payload,
            redelivery_count,
            ack_set: ack_set.clone(),
            entry: crate::message::Entry::Batched(
                entry.clone(),
                crate::message::Record { fields, sequence_id: r.sequence_id, event_time_ms: r.event_time_ms },
            ),
        });
    }
    Ok(Unpacked::Batch(messages))
}

/// Route one frame from the broker. An `Err` is a protocol violation that
/// ends the connection.
async fn dispatch(
    shared: &Shared,
    command: Command,
    payload: Bytes,
    write: &mpsc::WeakSender<Bytes>,
    pong: &Bytes,
) -> std::result::Result<(), String> {
    match command {
        Command::ProducerSuccess { request_id, .. }
        | Command::Success { request_id }
        | Command::AdminResponse { request_id, .. }
        | Command::TopicStats { request_id, .. } => {
            complete_request(shared, request_id, Ok(command));
        }
        Command::Error { request_id: 0, code, message } => {
            // Not tied to a request (e.g. a fire-and-forget ack failed).
            tracing::warn!(?code, %message, "broker reported an error");
        }
        Command::Error { request_id, code, message } => {
            complete_request(shared, request_id, Err(ClientError::Broker { code, message }));
        }
        Command::SendReceipt { producer_id, sequence_id, message_id } => {
            let mut st = shared.lock();
            let Some(slot) = st.producers.get_mut(&producer_id) else {
                tracing::debug!(producer_id, sequence_id, "receipt for an unknown producer");
                return Ok(());
            };
            match slot.inflight.front() {
                Some(front) if front.sequence_id == sequence_id => {
                    if let Some(send) = slot.inflight.pop_front() {
                        send.finish(Ok(message_id));
                    }
                }
                Some(front) if front.sequence_id < sequence_id => {
                    // Receipts must come in sequence order: one for a later
                    // message means the broker skipped ours; whether it is
                    // stored is unknown, so the connection cannot be trusted.
                    return Err(format!(
                        "receipt for sequence id {sequence_id} of producer {producer_id} \
                         before the one for {}",
                        front.sequence_id
                    ));
                }
                // Older than anything in flight: a duplicate; harmless.
                _ => tracing::debug!(producer_id, sequence_id, "receipt for a send not in flight"),
            }
        }
        Command::SendError { producer_id, sequence_id, code, message } => {
            let mut st = shared.lock();
            if let Some(slot) = st.producers.get_mut(&producer_id) {
                if let Some(pos) = slot.inflight.iter().position(|s| s.sequence_id == sequence_id) {
                    if let Some(send) = slot.inflight.remove(pos) {
                        send.finish(Err(ClientError::Broker { code, message }));
                    }
                }
            }
        }
        Command::Message { consumer_id, message_id, redelivery_count, ack_set } => {
            let Some((deliver, topic)) = consumer_target(shared, consumer_id) else {
                tracing::debug!(consumer_id, %message_id, "message for an unknown consumer");
                return Ok(());
            };
            // Only this entry can be bad; the frame itself was sound, so the
            // application hears about it and the connection goes on.
            // A batch's messages go into the consumer's queue as one item.
            let _ = match unpack_entry(payload, message_id, &topic, redelivery_count, ack_set) {
                Ok(Unpacked::One(m)) => deliver.send(Ok(m)),
                Ok(Unpacked::Batch(messages)) if messages.is_empty() => true,
                Ok(Unpacked::Batch(messages)) => deliver.send_batch(messages),
                Err(e) => deliver.send(Err(e)),
            };
        }
        Command::MessageRun { consumer_id, message_id, redelivery_count, lengths } => {
            // One lookup for the run's entries.
            let Some((deliver, topic)) = consumer_target(shared, consumer_id) else {
                tracing::debug!(consumer_id, %message_id, "message run for an unknown consumer");
                return Ok(());
            };
            // The decoder checked the lengths against the payload; a run
            // that does not fit is a broker fault, and ends the connection.
            let entries = magnetar_wire::run_entries(message_id, &lengths, &payload).map_err(|e| e.to_string())?;
            // The run's messages go into the consumer's queue as one item;
            // an entry that cannot be read goes in as an error in its place.
            let mut messages = Vec::with_capacity(entries.len());
            for (id, blob) in entries {
                match unpack_entry(blob, id, &topic, redelivery_count, Vec::new()) {
                    Ok(Unpacked::One(m)) => messages.push(m),
                    Ok(Unpacked::Batch(batch)) => messages.extend(batch),
                    Err(e) => {
                        if !messages.is_empty() {
                            deliver.send_batch(std::mem::take(&mut messages));
                        }
                        deliver.send(Err(e));
                    }
                }
            }
            if !messages.is_empty() {
                deliver.send_batch(messages);
            }
        }
        Command::CloseProducer { producer_id, .. } => {
            // The broker closed our producer (e.g. topic unloaded).
            let slot = shared.lock().producers.remove(&producer_id);
            if let Some(slot) = slot {
                slot.closed.store(true, Ordering::Release);
                for send in slot.inflight {
                    send.finish(Err(ClientError::ProducerClosed { producer_name: slot.name.clone() }));
                }
            }
        }
        Command::CloseConsumer { consumer_id, .. } => {
            let slot = shared.lock().consumers.remove(&consumer_id);
            if let Some(slot) = slot {
                tracing::debug!(subscription = %slot.subscription, "consumer closed by the broker");
                slot.closed.store(true, Ordering::Release);
                slot.timers.notify_one();
            }
        }
        Command::ActiveConsumerChange { consumer_id, is_active } => {
            if let Some(slot) = shared.lock().consumers.get(&consumer_id) {
                slot.active.store(is_active, Ordering::Release);
            }
        }
        Command::Ping => {
            // Best effort: if the write queue is full the connection is
            // evidently alive and busy, and the broker will see traffic.
            if let Some(w) = write.upgrade() {
                let _ = w.try_send(pong.clone());
            }
        }
        Command::Pong => {}
        other => return Err(format!("unexpected command from broker: {other:?}")),
    }
    Ok(())
}

/// Where deliveries to `consumer_id` go: its queue and its topic (`None`
/// for a consumer this connection does not know, e.g. closed meanwhile).
fn consumer_target(shared: &Shared, consumer_id: u64) -> Option<(crate::consumer::Inbox, Arc<str>)> {
    let st = shared.lock();
    st.consumers.get(&consumer_id).map(|c| (c.deliver.clone(), c.topic.clone()))
}

fn complete_request(shared: &Shared, request_id: u64, answer: Result<Command>) {
    let waiter = shared.lock().requests.remove(&request_id);
    match waiter {
        Some(w) => {
            let _ = w.send(answer);
        }
        // Timed out already, or a fire-and-forget request (id 0).
        None => tracing::debug!(request_id, "answer to no pending request"),
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

/// Completes once the connection shuts down (at once if it already has).
pub(crate) fn shut_down(shared: &Shared) -> impl std::future::Future<Output = ()> + Send + 'static {
    let mut rx = shared.shutdown.subscribe();
    async move {
        // A dropped sender (the connection gone) ends the wait too.
        let _ = rx.wait_for(|down| *down).await;
    }
}

/// Whether the connection is still up.
pub(crate) fn is_open(shared: &Shared) -> bool {
    shared.closed_reason().is_none()
}

#[cfg(test)]
mod tests {
    // Test code: unwrap on our own encoder's output is the assertion.
    #![allow(clippy::unwrap_used)]
    use super::*;
    use magnetar_wire::{encode_message, CompressionType, MessageMetadata};
    use tokio::sync::oneshot::error::TryRecvError;

    /// Goal: the connection's one send timer keeps each send's own timeout:
    /// a send without a receipt fails with `Timeout` at its deadline (not a
    /// millisecond before), in queue order, for sends queued at different
    /// times and on two producers; a send answered in time is not failed; a
    /// send whose frame waited for the write queue times out from when it
    /// got in; a timed-out send keeps its `max_pending` permit until its
    /// late receipt (then dropped quietly), as does a send whose future was
    /// dropped; the timer sleeps with nothing scheduled and ends with the
    /// connection. Method: `send_timeouts` on tokio's paused clock, receipts
    /// through `dispatch`.
    #[tokio::test(start_paused = true)]
    async fn sends_time_out_at_their_deadlines_on_one_timer() {
        let after = Duration::from_secs(5);
        let (s, ms) = (Duration::from_secs, Duration::from_millis);
        let shared = Arc::new(Shared::new());
        for id in [1, 2] {
            let slot = ProducerSlot::new(format!("p{id}"), Arc::new(AtomicBool::new(false)));
            shared.lock().producers.insert(id, slot);
        }
        let permits = Arc::new(tokio::sync::Semaphore::new(10));
        let push = |producer_id: u64, sequence_id: u64| {
            let (done, rx) = oneshot::channel();
            let permit = permits.clone().try_acquire_owned().unwrap();
            shared.push_inflight(producer_id, sequence_id, done, permit, after).unwrap();
            rx
        };
        let (write, _queued) = mpsc::channel(1);
        let (write, pong) = (write.downgrade(), Bytes::new());
        let receipt = |producer_id: u64, sequence_id: u64| {
            let (shared, write, pong) = (shared.clone(), write.clone(), pong.clone());
            async move {
                let message_id = MessageId::new(1, sequence_id, -1, -1);
                let command = Command::SendReceipt { producer_id, sequence_id, message_id };
                dispatch(&shared, command, Bytes::new(), &write, &pong).await.unwrap();
            }
        };
        async fn settle() {
            for _ in 0..10 {
                tokio::task::yield_now().await;
            }
        }
        fn pending(rx: &mut oneshot::Receiver<Result<MessageId>>, what: &str) {
            assert!(matches!(rx.try_recv(), Err(TryRecvError::Empty)), "{what} is no longer pending");
        }
        fn timed_out(rx: &mut oneshot::Receiver<Result<MessageId>>, after: Duration, what: &str) {
            match rx.try_recv() {
                Ok(Err(ClientError::Timeout { operation: "send receipt", after: a })) if a == after => {}
                other => panic!("{what}: expected the receipt's Timeout, got {other:?}"),
            }
        }
        let t0 = tokio::time::Instant::now();
        let timer = tokio::spawn(send_timeouts(shared.clone(), after));
        // The timer now waits with nothing scheduled: the first push wakes it.
        settle().await;
        let mut a = push(1, 1);
        let mut b = push(1, 2);
        tokio::time::sleep_until(t0 + s(1)).await;
        receipt(1, 1).await;
        assert_eq!(a.try_recv().unwrap().unwrap(), MessageId::new(1, 1, -1, -1));
        tokio::time::sleep_until(t0 + s(2)).await;
        let mut c = push(1, 3);
        let mut d = push(2, 1);
        tokio::time::sleep_until(t0 + s(3)).await;
        drop(push(1, 4));
        tokio::time::sleep_until(t0 + s(4)).await;
        // d's frame got into the write queue only now.
        shared.restart_deadline(2, 1, after);

        tokio::time::sleep_until(t0 + s(5) - ms(1)).await;
        settle().await;
        pending(&mut b, "b, 1 ms before its deadline");
        tokio::time::sleep_until(t0 + s(5)).await;
        settle().await;
        timed_out(&mut b, after, "b");
        pending(&mut c, "c, at b's deadline");
        pending(&mut d, "d, at b's deadline");
        // b, c, d and the dropped one hold their permits.
        assert_eq!(permits.available_permits(), 6);

        tokio::time::sleep_until(t0 + s(7) - ms(1)).await;
        settle().await;
        pending(&mut c, "c, 1 ms before its deadline");
        tokio::time::sleep_until(t0 + s(7)).await;
        settle().await;
        timed_out(&mut c, after, "c");
        pending(&mut d, "d, at its first deadline (restarted)");
        tokio::time::sleep_until(t0 + s(9) - ms(1)).await;
        settle().await;
        pending(&mut d, "d, 1 ms before its restarted deadline");
        tokio::time::sleep_until(t0 + s(9)).await;
        settle().await;
        timed_out(&mut d, after, "d");
        assert_eq!(permits.available_permits(), 6);

        // Late receipts release the permits, the dropped send's too.
        for (producer_id, sequence_id) in [(1, 2), (1, 3), (1, 4), (2, 1)] {
            receipt(producer_id, sequence_id).await;
        }
        assert_eq!(permits.available_permits(), 10);
        assert!(shared.lock().producers.values().all(|p| p.inflight.is_empty()));
        // Nothing pending: the timer's schedule empties (each producer's
        // entry falls due once more) and the timer then sleeps.
        tokio::time::sleep_until(t0 + s(60)).await;
        settle().await;
        assert!(shared.lock().send_deadlines.is_empty());
        assert!(shared.lock().producers.values().all(|p| !p.watched));
        assert!(!timer.is_finished());
        shared.fail("test over".into());
        settle().await;
        assert!(timer.is_finished(), "the send timer outlived its connection");
    }

    fn one(blob: Bytes) -> Result<Message> {
        let topic: Arc<str> = "persistent://public/default/t".into();
        match unpack_entry(blob, MessageId::new(3, 7, -1, -1), &topic, 2, Vec::new())? {
            Unpacked::One(m) => Ok(m),
            Unpacked::Batch(_) => panic!("a whole entry unpacked as a batch"),
        }
    }

    /// Goal: a whole entry, kept as its blob and read lazily, answers every
    /// accessor as the decoded metadata does (compression reads as `None`
    /// once the payload is decompressed).
    #[test]
    fn a_blob_message_reads_as_its_decoded_metadata() {
        let bare = MessageMetadata { producer_name: "p".into(), sequence_id: 5, ..MessageMetadata::default() };
        let full = MessageMetadata {
            producer_name: "producer-1".into(),
            sequence_id: 42,
            publish_time_ms: 1_700_000_000_123,
            event_time_ms: 99,
            partition_key: Some("key".into()),
            ordering_key: Some(Bytes::from_static(b"ok")),
            properties: vec![("a".into(), "1".into()), ("b".into(), "2".into()), ("a".into(), "3".into())],
            num_messages: 1,
            deliver_at_ms: 1_800_000_000_000,
            tag: Some("tag".into()),
            ..MessageMetadata::default()
        };
        let body = b"the payload, the payload, the payload".as_slice();
        let lz4 = crate::compression::compress(CompressionType::Lz4, body).unwrap();
        let compressed = MessageMetadata {
            compression: CompressionType::Lz4,
            uncompressed_size: u32::try_from(body.len()).unwrap(),
            ..full.clone()
        };
        // Metadata too large to read again per accessor: decoded on first use.
        let big = MessageMetadata {
            properties: (0..20).map(|i| (format!("name-{i:02}"), format!("a value long enough {i}"))).collect(),
            ..full.clone()
        };
        for (meta, payload) in [(bare, body), (full, body), (compressed, &lz4[..]), (big, body)] {
            let m = one(encode_message(&meta, payload)).unwrap();
            let want_meta = MessageMetadata { compression: CompressionType::None, ..meta };
            let want = Message {
                redelivery_count: 2,
                ..Message::new(m.id, m.topic.clone(), want_meta.clone(), Bytes::from_static(body))
            };
            assert!(matches!(m.entry, crate::message::Entry::Blob(..)));
            assert_eq!(m.payload, body);
            // Before and after the metadata is decoded.
            for _ in 0..2 {
                assert_eq!(m.key(), want.key());
                assert_eq!(m.ordering_key(), want.ordering_key());
                assert_eq!(m.properties(), want.properties());
                for name in ["a", "b", "c", "name-07"] {
                    assert_eq!(m.property(name), want.property(name), "{name}");
                }
                assert_eq!(m.publish_time_ms(), want.publish_time_ms());
                assert_eq!(m.event_time_ms(), want.event_time_ms());
                assert_eq!(m.producer_name(), want.producer_name());
                assert_eq!(m.sequence_id(), want.sequence_id());
                assert_eq!(m.tag(), want.tag());
                assert_eq!(m.deliver_at_ms(), want.deliver_at_ms());
                assert_eq!(m.batch_size(), want.batch_size());
                assert_eq!(m.redelivery_count(), 2);
                assert_eq!(m.entry_metadata(), &want_meta);
            }
            assert_eq!(m, want);
            assert_eq!(m.clone(), m);
        }
    }

    /// Goal: a bad blob is that message's error, never a panic.
    #[test]
    fn a_bad_blob_is_an_error() {
        let blob = encode_message(&MessageMetadata { producer_name: "p".into(), ..Default::default() }, b"x");
        for cut in 0..blob.len() - 1 {
            assert!(matches!(one(blob.slice(..cut)), Err(ClientError::Wire(_))), "cut at {cut}");
        }
        let mut bad = BytesMut::from(&blob[..]);
        // The root offset, pointing past the metadata.
        bad[4] = 0xff;
        assert!(matches!(one(bad.freeze()), Err(ClientError::Wire(_))));
    }
}
