//! One client connection, whatever protocol it speaks: the state kept
//! between requests and the tasks that serve it.
//!
//! A [`Door`] is a protocol: it decodes the bytes a client sends into
//! [`Request`]s and encodes the answers. The session owns what every door
//! needs alike: producers and consumers by the client's ids, receipts
//! written in send order, the pause in reading while produce bytes await
//! their receipts, the pump of consumer events, the outbox and its writer,
//! and cleanup when the connection ends. It is generic over the door and
//! over the byte stream's halves (static dispatch), so another protocol or
//! a transport such as TLS slots in without changes here.
//!
//! Owned by the shard that accepted the connection; never crosses cores.
//! Reading stops while the bytes of produce requests awaiting their
//! receipts exceed `inflight_bytes_max`, so a fast producer cannot grow the
//! broker's memory. Reading also stops, and deliveries to the connection's
//! consumers pause, while its unwritten output exceeds `outbox_bytes_max`
//! or the shard's buffered bytes exceed theirs; timeouts close a
//! connection that does not complete its handshake, leaves a frame
//! incomplete, idles with nothing attached, or reads none of its output
//! (docs/reliability.md). Receipts of one producer are written in the
//! order of its sends.

use bytes::{Bytes, BytesMut};
use futures::future::LocalBoxFuture;
use futures::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use futures::FutureExt;
use glommio::channels::local_channel::{self, LocalReceiver, LocalSender};
use magnetar_core::signal::Signal;
use magnetar_core::Principal;
use magnetar_core::{Broker, ConsumerEvent, ConsumerHandle, CoreError, ProducerHandle, SeekTarget, SubscribeRequest};
use magnetar_wire::{AckType, ErrorCode, MessageId, ProducerAccessMode};
use std::cell::{Cell, RefCell};
use std::collections::{HashMap, HashSet};
use std::fmt::Display;
use std::future::Future;
use std::rc::Rc;
use std::time::{Duration, Instant};

use crate::slots::Control;

/// Bounds that protect the broker from one connection, whatever protocol
/// it speaks (docs/reliability.md says what happens past each).
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Largest frame accepted (and announced in the handshake).
    pub frame_bytes_max: u32,
    /// Produce payload bytes awaiting receipts before reading pauses.
    pub inflight_bytes_max: usize,
    /// Producers and consumers per connection.
    pub producers_max: usize,
    pub consumers_max: usize,
    /// Output not yet written to the client (deliveries, receipts, pongs,
    /// replies) above which the connection's consumers are paused (the
    /// broker reads no entries for them) and its requests are not read.
    pub outbox_bytes_max: usize,
    /// Bytes a client may send before its handshake completes; more closes
    /// the connection.
    pub handshake_bytes_max: usize,
    /// No completed handshake this long after connecting: closed.
    pub handshake_timeout: Duration,
    /// A frame that stays incomplete this long: closed.
    pub partial_frame_timeout: Duration,
    /// No request but pings and pongs for this long, on a connection with
    /// no producer and no consumer: closed.
    pub idle_timeout: Duration,
    /// Output waiting and the client read none of it for this long: closed.
    pub unread_output_timeout: Duration,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            frame_bytes_max: magnetar_wire::FRAME_BYTES_MAX_DEFAULT,
            inflight_bytes_max: 16 * 1024 * 1024,
            producers_max: 1024,
            consumers_max: 1024,
            outbox_bytes_max: 8 * 1024 * 1024,
            handshake_bytes_max: 64 * 1024,
            handshake_timeout: Duration::from_secs(10),
            partial_frame_timeout: Duration::from_secs(30),
            idle_timeout: Duration::from_secs(600),
            unread_output_timeout: Duration::from_secs(60),
        }
    }
}

/// A request of any protocol, in the session's terms: ids are the client's
/// (unique per connection), answers go to `request_id`.
#[derive(Debug)]
pub(crate) enum Request<O> {
    CreateProducer {
        request_id: u64,
        producer_id: u64,
        topic: String,
        producer_name: String,
        access_mode: ProducerAccessMode,
        /// The topic epoch a reconnecting exclusive producer names (Pulsar's
        /// `topic_epoch`; the native protocol has none).
        epoch: Option<u64>,
    },
    /// One entry (`num_messages` > 1 for a batch). `payload_crc` is the
    /// CRC-32 of `payload` when the door had it from checking the frame, so
    /// the log need not hash the bytes again.
    Send {
        producer_id: u64,
        sequence_id: u64,
        num_messages: u32,
        payload: Bytes,
        payload_crc: Option<u32>,
    },
    CloseProducer {
        request_id: u64,
        producer_id: u64,
    },
    /// `start`: where a new subscription begins, when not at its initial
    /// position (a Pulsar reader's start message id).
    Subscribe {
        request_id: u64,
        request: SubscribeRequest,
        start: Option<SeekTarget>,
    },
    Flow {
        consumer_id: u64,
        permits: u32,
    },
    /// `request_id` `None`: the client wants no answer, and the ack need not
    /// be durable before one.
    Ack {
        request_id: Option<u64>,
        consumer_id: u64,
        ack_type: AckType,
        message_ids: Vec<MessageId>,
        batch_sizes: Vec<u32>,
    },
    Seek {
        request_id: u64,
        consumer_id: u64,
        target: SeekTarget,
    },
    /// Empty `message_ids`: all of the consumer's unacknowledged messages.
    Redeliver {
        consumer_id: u64,
        message_ids: Vec<MessageId>,
    },
    CloseConsumer {
        request_id: u64,
        consumer_id: u64,
    },
    /// The consumer's subscription is deleted; the consumer goes with it.
    Unsubscribe {
        request_id: u64,
        consumer_id: u64,
        force: bool,
    },
    Ping,
    Pong,
    /// What only this door has (admin, lookups); see [`Door::other`].
    Other(O),
}

/// How a handshake went.
pub(crate) enum Handshake {
    /// The client may send requests. `Some`: the identity the handshake
    /// proved; `None` keeps the transport's.
    Accepted(Option<Principal>),
    /// The door wrote its refusal; the connection closes quietly.
    Refused,
    /// The client's credentials were refused (the reason, never the
    /// credentials themselves); the door wrote its refusal. Logged with the
    /// peer; the connection closes.
    Unauthenticated(String),
    /// A protocol violation; the connection closes with this reason.
    Failed(String),
}

/// A protocol the broker speaks. One value per connection, reached by all
/// of the connection's tasks through the outbox: what the handshake
/// negotiates is kept in `Cell`s.
///
/// Encoding methods append whole frames to `dst`; on `Err` the caller logs
/// and sends nothing more of that answer.
pub(crate) trait Door: Sized + 'static {
    /// One decoded unit of the protocol.
    type Frame;
    /// The reading state (frame limits, partial frames).
    type Decoder;
    /// Requests only this door has, handled by [`Door::other`].
    type Other;
    type Error: Display;

    fn decoder(&self, limits: &ConnectionLimits) -> Self::Decoder;
    /// Takes the next whole frame off the front of `buf`; `Ok(None)` until
    /// it is all there. `Err` closes the connection with that reason.
    fn decode(decoder: &mut Self::Decoder, buf: &mut BytesMut) -> Result<Option<Self::Frame>, String>;
    /// Total bytes of the frame at the front of `buf`, once its length is
    /// there: the reader reserves room for it.
    fn next_frame_bytes(decoder: &Self::Decoder, buf: &[u8]) -> Option<usize>;
    /// The client's first frame; the door writes its answer itself.
    fn handshake(session: &Session<Self>, frame: Self::Frame) -> Handshake;
    /// Any later frame. `Err` closes the connection with that reason.
    fn request(&self, frame: Self::Frame) -> Result<Request<Self::Other>, String>;
    /// Handles a door-specific request; `Err` closes the connection.
    async fn other(session: &Rc<Session<Self>>, request: Self::Other) -> Result<(), String>;

    fn producer_created(
        &self,
        dst: &mut BytesMut,
        request_id: u64,
        producer: &ProducerHandle,
    ) -> Result<(), Self::Error>;
    /// A `WaitForExclusive` producer is queued behind the topic's current
    /// producers; `producer_created` follows once it holds the topic. A door
    /// whose clients expect a word meanwhile (Pulsar's `producer_ready =
    /// false`, which stops the client's request timeout) writes it here.
    fn producer_waiting(&self, _dst: &mut BytesMut, _request_id: u64) -> Result<(), Self::Error> {
        Ok(())
    }
    fn receipt(
        &self,
        dst: &mut BytesMut,
        producer_id: u64,
        sequence_id: u64,
        message_id: MessageId,
    ) -> Result<(), Self::Error>;
    fn send_error(
        &self,
        dst: &mut BytesMut,
        producer_id: u64,
        sequence_id: u64,
        error: CoreError,
    ) -> Result<(), Self::Error>;
    /// One delivery. `ack_set`: batch-index acks of a redelivered batch
    /// (bit i set: message i is acknowledged), empty when none is.
    fn message(
        &self,
        dst: &mut BytesMut,
        consumer_id: u64,
        message_id: &MessageId,
        redelivery_count: u32,
        ack_set: Vec<u64>,
        blob: &[u8],
    ) -> Result<(), Self::Error>;
    /// Consecutive entries of one ledger: entry i has `first`'s entry
    /// number plus i. Never empty.
    fn run(
        &self,
        dst: &mut BytesMut,
        consumer_id: u64,
        first: &MessageId,
        redelivery_count: u32,
        blobs: &[Bytes],
    ) -> Result<(), Self::Error>;
    /// The broker closed the consumer; the client may subscribe again.
    fn consumer_closed(
        &self,
        dst: &mut BytesMut,
        consumer_id: u64,
        code: ErrorCode,
        message: String,
    ) -> Result<(), Self::Error>;
    /// The broker closed the consumer for a reason its application must
    /// see, about `entry` if given (a damaged entry). A door whose protocol
    /// has no such close keeps the default: a plain close.
    fn consumer_failed(
        &self,
        dst: &mut BytesMut,
        consumer_id: u64,
        code: ErrorCode,
        message: String,
        entry: Option<&MessageId>,
    ) -> Result<(), Self::Error> {
        let _ = entry;
        self.consumer_closed(dst, consumer_id, code, message)
    }
    fn active_consumer(&self, dst: &mut BytesMut, consumer_id: u64, is_active: bool) -> Result<(), Self::Error>;
    fn success(&self, dst: &mut BytesMut, request_id: u64) -> Result<(), Self::Error>;
    fn error(&self, dst: &mut BytesMut, request_id: u64, error: &CoreError) -> Result<(), Self::Error>;
    fn pong(&self, dst: &mut BytesMut) -> Result<(), Self::Error>;
    /// A PING to the client (the keep-alive's probe).
    fn ping(&self, dst: &mut BytesMut) -> Result<(), Self::Error>;
    /// The broker's keep-alive, once the handshake is done: a connection
    /// that sent nothing for this long is pinged, and closed when it sends
    /// nothing for as long again (Apache Pulsar's `keepAliveIntervalSeconds`).
    /// `None`: the door keeps none (its clients ping the broker).
    fn keep_alive(&self) -> Option<Duration> {
        None
    }
    /// The last frame before the session closes a connection that broke
    /// the protocol.
    fn protocol_error(&self, dst: &mut BytesMut, why: &str) -> Result<(), Self::Error>;
}

/// Bytes asked of the stream per read.
pub(crate) const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Most bytes of a frame that has begun to arrive that the reader makes
/// room for at once (frames above this grow their buffer as they come).
pub(crate) const FRAME_RESERVE_AHEAD_MAX: usize = 1024 * 1024;
/// The writer keeps its buffer's capacity between rounds up to this size;
/// a larger one (after a burst) is given back.
const WRITE_BUFFER_KEEP_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Frames waiting to be written, filled by many tasks, drained by the writer.
pub(crate) struct Outbox<D> {
    door: D,
    buf: RefCell<BytesMut>,
    signal: Signal,
    closed: Cell<bool>,
    /// Bytes put and not yet written to the stream (in `buf` or in the
    /// writer's chunk); counted in the shard's buffered bytes too.
    pending: Cell<usize>,
    /// `ConnectionLimits::outbox_bytes_max`.
    max: usize,
    pub(crate) control: Rc<Control>,
    /// Wakes the task that pauses deliveries when output piles up.
    pacer: Signal,
}

impl<D: Door> Outbox<D> {
    fn new(door: D, control: Rc<Control>, max: usize) -> Self {
        Self {
            door,
            buf: RefCell::new(BytesMut::new()),
            signal: Signal::new(),
            closed: Cell::new(false),
            pending: Cell::new(0),
            max,
            control,
            pacer: Signal::new(),
        }
    }

    /// Room for more output: at most `outbox_bytes_max` unwritten.
    fn has_room(&self) -> bool {
        self.pending.get() <= self.max
    }

    /// Deliveries to this connection should stop: its own output, or the
    /// shard's buffered bytes, are above their bound.
    fn over(&self) -> bool {
        !self.has_room() || self.control.buffers.over()
    }

    /// Deliveries may resume: the output is down to half its bound and the
    /// shard within its own (the gap keeps pause and resume from
    /// alternating on every frame).
    fn drained_enough(&self) -> bool {
        self.pending.get() <= self.max / 2 && !self.control.buffers.over()
    }

    /// `n` bytes of output reached the stream.
    fn wrote(&self, n: usize) {
        self.pending.set(self.pending.get() - n);
        self.control.buffers.release(n);
        if self.has_room() {
            self.control.wake.notify();
        }
    }

    /// Forgets output that will never be written (the connection ended).
    fn release_all(&self) {
        self.control.buffers.release(self.pending.replace(0));
    }

    pub(crate) fn door(&self) -> &D {
        &self.door
    }

    /// Appends what `encode` writes (`what` names it in the log if it
    /// fails) and wakes the writer; nothing once the connection closed.
    pub(crate) fn put(&self, what: &str, encode: impl FnOnce(&D, &mut BytesMut) -> Result<(), D::Error>) {
        if self.closed.get() {
            return;
        }
        let added = {
            let mut buf = self.buf.borrow_mut();
            let before = buf.len();
            let encoded = encode(&self.door, &mut buf);
            let added = buf.len() - before;
            if let Err(e) = encoded {
                // Whatever the encoder appended before failing is dropped.
                buf.truncate(before);
                tracing::error!("cannot encode {what}: {e}");
                return;
            }
            added
        };
        self.pending.set(self.pending.get() + added);
        self.control.buffers.add(added);
        if self.over() {
            self.pacer.notify();
        }
        self.signal.notify();
    }

    pub(crate) fn error(&self, request_id: u64, e: &CoreError) {
        self.put("an error", |d, dst| d.error(dst, request_id, e));
    }

    pub(crate) fn success(&self, request_id: u64) {
        self.put("a success", |d, dst| d.success(dst, request_id));
    }

    fn is_closed(&self) -> bool {
        self.closed.get()
    }

    fn close(&self) {
        self.closed.set(true);
        self.signal.notify();
        self.pacer.notify();
    }
}

/// Writes the outbox to the stream until it is closed and drained.
///
/// Double buffering: the writer swaps its drained buffer with the outbox's
/// full one, so both keep their capacity and frames are encoded into memory
/// already mapped. (Splitting frozen chunks off the outbox would leave it
/// sharing an allocation still being written, so each round of encoding
/// would reallocate into fresh memory.)
///
/// A write that makes no progress for `unread_output_timeout` (the client
/// reads nothing) ends the connection.
async fn write_loop<D: Door, W: AsyncWrite + Unpin>(
    out: Rc<Outbox<D>>,
    mut writer: W,
    unread_output_timeout: Duration,
) {
    let mut chunk = BytesMut::new();
    loop {
        {
            let mut buf = out.buf.borrow_mut();
            std::mem::swap(&mut *buf, &mut chunk);
        }
        if chunk.is_empty() {
            if out.closed.get() {
                break;
            }
            out.signal.wait().await;
            continue;
        }
        magnetar_core::stage::mark("9_writer_woke");
        let mut at = 0;
        while at < chunk.len() {
            match write_some(&mut writer, &chunk[at..], unread_output_timeout).await {
                Ok(Some(n)) => {
                    at += n;
                    out.wrote(n);
                }
                Ok(None) => {
                    let reason = format!(
                        "the client read none of its output for {} s (unread_output_timeout): {} bytes waiting \
                         (outbox_bytes_max {})",
                        unread_output_timeout.as_secs_f64(),
                        out.pending.get(),
                        out.max
                    );
                    out.closed.set(true);
                    out.control.kill(reason);
                    return;
                }
                Err(e) => {
                    tracing::debug!(peer = %out.control.peer, "write failed: {e}");
                    out.closed.set(true);
                    // The reader may be paused on this output: wake it.
                    out.control.wake.notify();
                    return;
                }
            }
        }
        magnetar_core::stage::mark("10_written");
        chunk.clear();
        if chunk.capacity() > WRITE_BUFFER_KEEP_BYTES_MAX {
            chunk = BytesMut::new();
        }
    }
    let _ = writer.flush().await;
    let _ = writer.close().await;
}

/// One write of (part of) `bytes`: `Ok(Some(n))` once `n` > 0 bytes went
/// out, `Ok(None)` when none could for `timeout`. The timer is armed only
/// when the write has to wait.
async fn write_some<W: AsyncWrite + Unpin>(
    writer: &mut W,
    bytes: &[u8],
    timeout: Duration,
) -> std::io::Result<Option<usize>> {
    let mut write = std::pin::pin!(writer.write(bytes));
    let mut timer: Option<std::pin::Pin<Box<glommio::timer::Timer>>> = None;
    std::future::poll_fn(|cx| {
        if let std::task::Poll::Ready(r) = write.as_mut().poll(cx) {
            return std::task::Poll::Ready(match r {
                Ok(0) => Err(std::io::Error::new(std::io::ErrorKind::WriteZero, "the stream took no bytes")),
                Ok(n) => Ok(Some(n)),
                Err(e) => Err(e),
            });
        }
        let t = timer.get_or_insert_with(|| Box::pin(glommio::timer::Timer::new(timeout)));
        match t.as_mut().poll(cx) {
            std::task::Poll::Ready(_) => std::task::Poll::Ready(Ok(None)),
            std::task::Poll::Pending => std::task::Poll::Pending,
        }
    })
    .await
}

/// Produce payload bytes awaiting their receipts, and the reader's wait for
/// them to drop to the limit.
pub(crate) struct InFlight {
    bytes: Cell<usize>,
    max: usize,
    drained: Signal,
    /// The shard's metrics, whose in-flight gauge follows `bytes`.
    metrics: Option<std::sync::Arc<magnetar_core::metrics::ShardMetrics>>,
}

impl InFlight {
    pub(crate) fn new(max: usize) -> Self {
        Self { bytes: Cell::new(0), max, drained: Signal::new(), metrics: None }
    }

    /// The same, also counted in the shard's `inflight_bytes` gauge.
    pub(crate) fn counted(mut self, metrics: std::sync::Arc<magnetar_core::metrics::ShardMetrics>) -> Self {
        assert_eq!(self.bytes.get(), 0, "counted before any send");
        self.metrics = Some(metrics);
        self
    }

    fn add(&self, bytes: usize) {
        self.bytes.set(self.bytes.get() + bytes);
        if let Some(m) = &self.metrics {
            m.inflight_bytes.add(bytes as u64);
        }
    }

    /// `bytes` added before are answered (or were never sent).
    fn release(&self, bytes: usize) {
        self.bytes.set(self.bytes.get() - bytes);
        if let Some(m) = &self.metrics {
            m.inflight_bytes.sub(bytes as u64);
        }
        self.drained.notify();
    }

    fn has_room(&self) -> bool {
        self.bytes.get() <= self.max
    }
}

impl Drop for InFlight {
    /// A connection that ends with sends unanswered takes them out of the
    /// shard's gauge.
    fn drop(&mut self) {
        if let Some(m) = &self.metrics {
            m.inflight_bytes.sub(self.bytes.get() as u64);
        }
    }
}

/// A send's answer to come: `(sequence_id, payload bytes, result)`.
type Receipt = LocalBoxFuture<'static, (u64, usize, Result<MessageId, CoreError>)>;

/// Writes the receipts of producer `producer_id` in send order: each is
/// awaited in turn, whatever order the sends complete in. Frees the
/// in-flight bytes of each and wakes a reader paused on them.
async fn write_receipts<D: Door>(
    producer_id: u64,
    receipts: LocalReceiver<Receipt>,
    out: Rc<Outbox<D>>,
    inflight: Rc<InFlight>,
) {
    while let Some(receipt) = receipts.recv().await {
        let (sequence_id, bytes, result) = receipt.await;
        magnetar_core::stage::mark("8_conn_receipt");
        match result {
            Ok(message_id) => out.put("a receipt", |d, dst| d.receipt(dst, producer_id, sequence_id, message_id)),
            Err(e) => out.put("a send error", |d, dst| d.send_error(dst, producer_id, sequence_id, e)),
        }
        inflight.release(bytes);
    }
}

struct SessionProducer {
    handle: ProducerHandle,
    receipts: LocalSender<Receipt>,
}

/// The addresses of a connection, as text for logs and answers.
pub(crate) struct Endpoints {
    pub peer: String,
    /// `host:port` the client reached (lookup answers name it).
    pub local: Option<String>,
}

/// One connection's state; see the module doc.
pub(crate) struct Session<D: Door> {
    /// Replaced once, by the handshake, when it names the caller; the
    /// handle carries the caller's identity to the broker API.
    broker: RefCell<Broker>,
    limits: ConnectionLimits,
    out: Rc<Outbox<D>>,
    producers: RefCell<HashMap<u64, SessionProducer>>,
    consumers: RefCell<HashMap<u64, ConsumerHandle>>,
    sink: Cell<Option<u64>>,
    /// Producer ids whose creation is under way.
    pending_producers: RefCell<HashSet<u64>>,
    /// Set once cleanup ran: producers created after it are closed at once.
    gone: Cell<bool>,
    local_addr: Option<String>,
    inflight: Rc<InFlight>,
    /// This connection in its shard's slots: eviction, kill, activity.
    control: Rc<Control>,
    /// Deliveries to this connection's consumers are paused (its output is
    /// above its bound): consumers subscribed meanwhile are paused too.
    delivery_paused: Cell<bool>,
}

/// Why the read loop ended.
enum End {
    PeerClosed,
    Refused,
    Protocol(String),
    Io(std::io::Error),
    /// A timeout of `ConnectionLimits`; the client is told why.
    Timeout(String),
    /// Ended from outside the read loop (evicted, output unread).
    Killed(String),
}

/// Serves one connection until it ends: `reader` and `writer` are the
/// halves of its byte stream, `principal` who the transport says the
/// client is, `control` its place in the shard's slots.
pub(crate) async fn run<D, R, W>(
    broker: Broker,
    door: D,
    (mut reader, writer): (R, W),
    endpoints: Endpoints,
    principal: Principal,
    limits: ConnectionLimits,
    control: Rc<Control>,
) where
    D: Door,
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin + 'static,
{
    let out = Rc::new(Outbox::new(door, control.clone(), limits.outbox_bytes_max));
    let inflight = Rc::new(InFlight::new(limits.inflight_bytes_max).counted(broker.metrics().clone()));
    let writer_task = glommio::spawn_local(write_loop(out.clone(), writer, limits.unread_output_timeout));
    let session = Rc::new(Session {
        broker: RefCell::new(broker.with_principal(principal)),
        limits,
        out: out.clone(),
        producers: RefCell::new(HashMap::new()),
        consumers: RefCell::new(HashMap::new()),
        sink: Cell::new(None),
        pending_producers: RefCell::new(HashSet::new()),
        gone: Cell::new(false),
        local_addr: endpoints.local,
        inflight,
        control,
        delivery_paused: Cell::new(false),
    });
    let peer = endpoints.peer;
    let end = session.read_loop(&mut reader, &peer).await;
    let killed = matches!(end, End::Killed(_));
    match &end {
        End::PeerClosed => tracing::debug!(%peer, "connection closed by peer"),
        End::Refused => tracing::debug!(%peer, "handshake refused"),
        End::Protocol(why) => {
            tracing::info!(%peer, "closing connection: {why}");
            out.put("a protocol error", |d, dst| d.protocol_error(dst, why));
        }
        End::Io(e) => tracing::debug!(%peer, "connection read failed: {e}"),
        End::Timeout(why) => {
            tracing::warn!(%peer, "closing connection: {why}");
            out.put("a protocol error", |d, dst| d.protocol_error(dst, why));
        }
        End::Killed(why) => tracing::warn!(%peer, "closing connection: {why}"),
    }
    session.cleanup().await;
    out.close();
    if killed {
        // The client is not reading, or must go at once: whatever is left
        // unwritten is dropped with the writer (the stream closes).
        drop(writer_task);
    } else {
        writer_task.await;
    }
    out.release_all();
}

/// Makes room in `buf` for the rest of the frame at its front (`total`
/// bytes, from the door; at most `FRAME_RESERVE_AHEAD_MAX` of them) plus one
/// more read, so that the frame's bytes are copied once, from the read
/// buffer, instead of moving to a larger allocation (copying what had
/// arrived) each time the buffer grows.
pub(crate) fn reserve_for_frame(total: Option<usize>, buf: &mut BytesMut) {
    if let Some(total) = total {
        let rest = total.saturating_sub(buf.len()).min(FRAME_RESERVE_AHEAD_MAX);
        buf.reserve(rest.saturating_add(READ_CHUNK_BYTES));
    }
}

/// What the reader checks besides the stream: the bounds that pause it
/// and the deadlines that end the connection.
struct Watch<'a, D: Door> {
    out: &'a Outbox<D>,
    inflight: &'a InFlight,
    control: &'a Control,
    limits: &'a ConnectionLimits,
    /// The handshake is done (frames may reserve room; no handshake
    /// deadline).
    connected: bool,
    /// The connection has no producer and no consumer (the idle timeout
    /// applies).
    idle: &'a dyn Fn() -> bool,
    /// The door's keep-alive period, once the handshake is done.
    keep_alive: Option<Duration>,
}

/// The reading side of a connection: bytes from the stream, frames out.
struct Reader<D: Door> {
    decoder: D::Decoder,
    /// Bytes read and not yet decoded; decoded frames keep slices of it.
    buf: BytesMut,
    /// Reads land here, zeroed once, and only the bytes read are copied
    /// into `buf`. Reading straight into `buf` needs initialized memory (no
    /// unsafe here), and zero-filling a fresh allocation per read (decoded
    /// frames keep the old one alive) costs more than the copy.
    scratch: Vec<u8>,
    /// When the incomplete frame at the front of `buf` began to arrive
    /// (time spent paused on the connection's own produce bytes in flight
    /// not counted).
    partial_since: Option<Instant>,
    /// `buf`'s bytes as counted in the shard's buffered bytes (see `count`).
    counted: usize,
    /// When the client last sent anything (time spent not reading, when
    /// its bytes may be waiting unread, not counted): the keep-alive's
    /// clock.
    heard: Instant,
    /// A keep-alive PING went out since `heard`.
    pinged: bool,
}

impl<D: Door> Reader<D> {
    fn new(decoder: D::Decoder) -> Self {
        Self {
            decoder,
            buf: BytesMut::with_capacity(READ_CHUNK_BYTES),
            scratch: vec![0u8; READ_CHUNK_BYTES],
            partial_since: None,
            counted: 0,
            heard: Instant::now(),
            pinged: false,
        }
    }

    /// Brings the shard's count of buffered bytes up to date with `buf`:
    /// what it holds, or what it has allocated beyond one read's worth (the
    /// room reserved for a frame that has begun), whichever is more.
    fn count(&mut self, control: &Control) {
        let now = self.buf.len().max(self.buf.capacity().saturating_sub(READ_CHUNK_BYTES));
        if now > self.counted {
            control.buffers.add(now - self.counted);
        } else {
            control.buffers.release(self.counted - now);
        }
        self.counted = now;
    }

    /// Gives the shard back what this reader's buffer counted.
    fn uncount(&mut self, control: &Control) {
        control.buffers.release(self.counted);
        self.counted = 0;
    }

    /// The next frame. Frames already read come first; reading more waits
    /// while the connection's produce bytes in flight, its unwritten
    /// output or the shard's buffered bytes are above their bounds
    /// (backpressure), and stops once the outbox is closed. Only a peer
    /// past the handshake gets room reserved for a frame that has begun to
    /// arrive (the length of a frame from anyone else reserves nothing).
    async fn next<R: AsyncRead + Unpin>(&mut self, reader: &mut R, w: &Watch<'_, D>) -> Result<D::Frame, End> {
        loop {
            match D::decode(&mut self.decoder, &mut self.buf) {
                Ok(Some(frame)) => {
                    self.partial_since = None;
                    self.count(w.control);
                    return Ok(frame);
                }
                Ok(None) if w.connected => {
                    reserve_for_frame(D::next_frame_bytes(&self.decoder, &self.buf), &mut self.buf)
                }
                Ok(None) => {}
                Err(why) => return Err(End::Protocol(why)),
            }
            if self.buf.is_empty() {
                self.partial_since = None;
            } else if self.partial_since.is_none() {
                self.partial_since = Some(Instant::now());
            }
            self.count(w.control);
            if !w.connected && self.buf.len() > w.limits.handshake_bytes_max {
                return Err(End::Protocol(format!(
                    "{} bytes sent before the handshake completed (handshake_bytes_max {})",
                    self.buf.len(),
                    w.limits.handshake_bytes_max
                )));
            }
            let n = self.read_some(reader, w).await?;
            if n > 0 {
                self.heard = Instant::now();
                self.pinged = false;
            }
            self.buf.extend_from_slice(&self.scratch[..n]);
            self.count(w.control);
            if n == 0 {
                return Err(if self.buf.is_empty() {
                    End::PeerClosed
                } else {
                    End::Protocol("connection closed mid-frame".into())
                });
            }
        }
    }

    /// Reads once from the stream when there is room, racing the
    /// connection's deadlines and a kill; returns the bytes read (0 at the
    /// end of the stream).
    async fn read_some<R: AsyncRead + Unpin>(&mut self, reader: &mut R, w: &Watch<'_, D>) -> Result<usize, End> {
        use std::task::Poll;
        let Self { decoder, buf, scratch, partial_since, heard, pinged, .. } = self;
        // Started once there is room, then kept across wake-ups (dropping
        // a read under way could lose what it read).
        let mut read = std::pin::pin!(None);
        let mut reading = Some((reader, scratch));
        loop {
            if let Some(why) = w.control.killed() {
                return Err(End::Killed(why));
            }
            if w.out.is_closed() {
                return Err(End::PeerClosed);
            }
            let own_pause = !w.inflight.has_room();
            let shard_full = w.control.buffers.over();
            let room = !own_pause && w.out.has_room() && !shard_full;
            if room {
                if let Some((reader, scratch)) = reading.take() {
                    read.set(Some(reader.read(scratch)));
                }
            }
            let now = Instant::now();
            let deadline = deadline::<D>(*partial_since, w);
            if let Some((at, which)) = deadline {
                if at <= now {
                    return Err(End::Timeout(which.reason::<D>(w.limits, decoder, buf)));
                }
            }
            // Keep-alive, as Apache Pulsar's broker does it: silent for a
            // period, the client is pinged; silent for another, closed. Not
            // while reading is paused: its answer may be waiting unread.
            let keep_alive =
                w.keep_alive.filter(|_| room).map(|every| *heard + if *pinged { every * 2 } else { every });
            if let (Some(at), Some(every)) = (keep_alive, w.keep_alive) {
                if at <= now {
                    if *pinged {
                        return Err(End::Timeout(format!(
                            "nothing received for {} s, a PING unanswered (keep-alive interval {} s)",
                            now.duration_since(*heard).as_secs_f64().round(),
                            every.as_secs_f64()
                        )));
                    }
                    *pinged = true;
                    w.out.put("a PING", |d, dst| d.ping(dst));
                    continue;
                }
            }
            let wake_at = match (deadline.map(|(at, _)| at), keep_alive) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            };
            let mut timer = wake_at.map(|at| Box::pin(glommio::timer::Timer::new(at - now)));
            let mut woken = std::pin::pin!(w.control.wake.wait());
            let mut drained = std::pin::pin!(w.inflight.drained.wait());
            let paused_at = own_pause.then_some(now);
            let unread_at = (!room).then_some(now);
            let outcome = std::future::poll_fn(|cx| {
                if let Some(r) = read.as_mut().as_pin_mut() {
                    if let Poll::Ready(r) = r.poll(cx) {
                        return Poll::Ready(Some(r));
                    }
                }
                let fired = timer.as_mut().is_some_and(|t| t.as_mut().poll(cx).is_ready());
                if fired
                    || woken.as_mut().poll(cx).is_ready()
                    || drained.as_mut().poll(cx).is_ready()
                    || (shard_full && w.control.buffers.poll_room(cx).is_ready())
                {
                    return Poll::Ready(None);
                }
                Poll::Pending
            })
            .await;
            if let (Some(at), Some(since)) = (paused_at, partial_since.as_mut()) {
                // Waiting for the connection's own sends to be stored does
                // not count against its partial frame.
                *since += at.elapsed();
            }
            if let Some(at) = unread_at {
                *heard += at.elapsed();
            }
            if let Some(r) = outcome {
                return r.map_err(End::Io);
            }
        }
    }
}

/// Awaits `fut`, a read of the first bytes before any door runs (the
/// protocol sniff), within the connection's handshake timeout; `Err` says
/// why the connection ends instead (the timeout, or an eviction).
pub(crate) async fn within_handshake<F: Future>(
    fut: F,
    control: &Control,
    limits: &ConnectionLimits,
) -> Result<F::Output, String> {
    use std::task::Poll;
    let mut fut = std::pin::pin!(fut);
    loop {
        if let Some(why) = control.killed() {
            return Err(why);
        }
        let left = (control.opened_at + limits.handshake_timeout).saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(Deadline::reason_without_frame(limits));
        }
        let mut timer = std::pin::pin!(glommio::timer::Timer::new(left));
        let mut woken = std::pin::pin!(control.wake.wait());
        let outcome = std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = fut.as_mut().poll(cx) {
                return Poll::Ready(Some(r));
            }
            if timer.as_mut().poll(cx).is_ready() || woken.as_mut().poll(cx).is_ready() {
                return Poll::Ready(None);
            }
            Poll::Pending
        })
        .await;
        if let Some(r) = outcome {
            return Ok(r);
        }
    }
}

/// Which timeout would end the connection.
#[derive(Debug, Clone, Copy)]
enum Deadline {
    Handshake,
    PartialFrame,
    Idle,
}

impl Deadline {
    /// The handshake timeout's reason (no frame involved).
    fn reason_without_frame(l: &ConnectionLimits) -> String {
        format!("no handshake within {} s of connecting (handshake_timeout)", l.handshake_timeout.as_secs_f64())
    }

    /// Why the connection is closed, with the figures.
    fn reason<D: Door>(self, l: &ConnectionLimits, decoder: &D::Decoder, buf: &[u8]) -> String {
        match self {
            Self::Handshake => Self::reason_without_frame(l),
            Self::PartialFrame => {
                let of = D::next_frame_bytes(decoder, buf).map(|d| format!(" of {d}")).unwrap_or_default();
                format!(
                    "a frame stayed incomplete for {} s (partial_frame_timeout): {}{of} bytes arrived",
                    l.partial_frame_timeout.as_secs_f64(),
                    buf.len()
                )
            }
            Self::Idle => {
                format!("no request for {} s and no producer or consumer (idle_timeout)", l.idle_timeout.as_secs_f64())
            }
        }
    }
}

/// The deadline that ends the connection first, if any: no handshake, a
/// frame incomplete since `partial_since`, or idle.
fn deadline<D: Door>(partial_since: Option<Instant>, w: &Watch<'_, D>) -> Option<(Instant, Deadline)> {
    let l = w.limits;
    let handshake = (!w.connected).then(|| (w.control.opened_at + l.handshake_timeout, Deadline::Handshake));
    let other = match partial_since {
        Some(since) => Some((since + l.partial_frame_timeout, Deadline::PartialFrame)),
        None if w.connected && (w.idle)() => Some((w.control.last_request() + l.idle_timeout, Deadline::Idle)),
        None => None,
    };
    match (handshake, other) {
        (Some(h), Some(o)) => Some(if o.0 < h.0 { o } else { h }),
        (h, o) => h.or(o),
    }
}

impl<D: Door> Session<D> {
    /// The broker handle, acting for this connection's caller. Not held
    /// across an await by callers that the handshake could race: the only
    /// replacement happens while the first frame is handled, before any
    /// request runs.
    pub(crate) fn broker(&self) -> std::cell::Ref<'_, Broker> {
        self.broker.borrow()
    }

    /// A clone of the handle, for a call that awaits (a `Ref` must not be
    /// held across an await).
    pub(crate) fn broker_handle(&self) -> Broker {
        self.broker.borrow().clone()
    }

    pub(crate) fn limits(&self) -> &ConnectionLimits {
        &self.limits
    }

    pub(crate) fn out(&self) -> &Rc<Outbox<D>> {
        &self.out
    }

    /// `host:port` the client reached, if known.
    pub(crate) fn local_addr(&self) -> Option<&str> {
        self.local_addr.as_deref()
    }

    async fn read_loop<R: AsyncRead + Unpin>(self: &Rc<Self>, reader: &mut R, peer: &str) -> End {
        let mut frames = Reader::<D>::new(self.out.door.decoder(&self.limits));
        let end = self.read_frames(&mut frames, reader, peer).await;
        frames.uncount(&self.control);
        end
    }

    /// Whether the connection has no producer and no consumer (nor one
    /// being created): what the idle timeout and eviction look at.
    fn is_idle(&self) -> bool {
        self.producers.borrow().is_empty()
            && self.consumers.borrow().is_empty()
            && self.pending_producers.borrow().is_empty()
    }

    /// Tells the shard's slots whether this connection may be evicted.
    fn note_busy(&self) {
        self.control.set_busy(!self.is_idle());
    }

    async fn read_frames<R: AsyncRead + Unpin>(
        self: &Rc<Self>,
        frames: &mut Reader<D>,
        reader: &mut R,
        peer: &str,
    ) -> End {
        let mut connected = false;
        let idle = || self.is_idle();
        loop {
            let watch = Watch {
                out: &self.out,
                inflight: &self.inflight,
                control: &self.control,
                limits: &self.limits,
                connected,
                idle: &idle,
                keep_alive: if connected { self.out.door.keep_alive() } else { None },
            };
            let frame = match frames.next(reader, &watch).await {
                Ok(frame) => frame,
                Err(end) => return end,
            };
            if !connected {
                match D::handshake(self, frame) {
                    Handshake::Accepted(principal) => {
                        connected = true;
                        self.control.handshake_done();
                        self.control.note_request();
                        if let Some(p) = principal {
                            let named = self.broker().with_principal(p);
                            *self.broker.borrow_mut() = named;
                        }
                        tracing::debug!(%peer, principal = ?self.broker().principal(), "handshake done");
                        continue;
                    }
                    Handshake::Refused => return End::Refused,
                    Handshake::Unauthenticated(why) => {
                        tracing::info!(%peer, "authentication refused: {why}");
                        return End::Refused;
                    }
                    Handshake::Failed(why) => return End::Protocol(why),
                }
            }
            let request = match self.out.door.request(frame) {
                Ok(r) => r,
                Err(why) => return End::Protocol(why),
            };
            if !matches!(request, Request::Ping | Request::Pong) {
                self.control.note_request();
            }
            let handled = self.handle(request).await;
            self.note_busy();
            if let Err(why) = handled {
                return End::Protocol(why);
            }
        }
    }

    /// Handles one request; `Err` closes the connection.
    async fn handle(self: &Rc<Self>, request: Request<D::Other>) -> Result<(), String> {
        match request {
            Request::Send { producer_id, sequence_id, num_messages, payload, payload_crc } => {
                self.on_send(producer_id, sequence_id, num_messages, payload, payload_crc);
            }
            Request::CreateProducer { request_id, producer_id, topic, producer_name, access_mode, epoch } => {
                self.create_producer(request_id, producer_id, topic, producer_name, access_mode, epoch);
            }
            Request::CloseProducer { request_id, producer_id } => {
                let p = self.producers.borrow_mut().remove(&producer_id);
                match p {
                    Some(p) => {
                        // Receipts already queued are still written (the
                        // writer task drains its channel), then it ends.
                        drop(p.receipts);
                        match self.broker_handle().close_producer(&p.handle).await {
                            Ok(()) => self.out.success(request_id),
                            Err(e) => self.out.error(request_id, &e),
                        }
                    }
                    None => {
                        self.out.error(request_id, &CoreError::new(ErrorCode::ProducerNotFound, "no such producer"))
                    }
                }
            }
            Request::Subscribe { request_id, mut request, start } => {
                // The door does not know its peer; the session does.
                request.client_address = self.out.control.peer.clone();
                if self.consumers.borrow().contains_key(&request.consumer_id) {
                    self.out.error(request_id, &CoreError::new(ErrorCode::ConsumerBusy, "consumer id already in use"));
                    return Ok(());
                }
                if self.consumers.borrow().len() >= self.limits.consumers_max {
                    self.out.error(
                        request_id,
                        &CoreError::new(ErrorCode::TooManyRequests, "too many consumers on this connection"),
                    );
                    return Ok(());
                }
                let sink = self.sink();
                let consumer_id = request.consumer_id;
                match self.broker_handle().subscribe(request, sink).await {
                    Ok(handle) => {
                        if let Some(target) = start {
                            if let Err(e) = self.broker_handle().seek(&handle, target).await {
                                let _ = self.broker_handle().close_consumer(&handle).await;
                                self.out.error(request_id, &e);
                                return Ok(());
                            }
                        }
                        if self.delivery_paused.get() {
                            self.broker().pause_delivery(&handle, true);
                        }
                        self.consumers.borrow_mut().insert(consumer_id, handle);
                        self.out.success(request_id);
                    }
                    Err(e) => self.out.error(request_id, &e),
                }
            }
            Request::Flow { consumer_id, permits } => {
                if let Some(c) = self.consumers.borrow().get(&consumer_id) {
                    self.broker().flow(c, permits);
                }
            }
            Request::Ack { request_id, consumer_id, ack_type, message_ids, batch_sizes } => {
                let durable = request_id.is_some();
                // The handle is borrowed, not cloned: a Pulsar client acks
                // every message by itself. Nothing here awaits, and the
                // core reaches the session only through its sink's channel.
                let fut = {
                    let consumers = self.consumers.borrow();
                    let Some(c) = consumers.get(&consumer_id) else {
                        if let Some(request_id) = request_id {
                            self.out.error(request_id, &consumer_not_found());
                        }
                        return Ok(());
                    };
                    if message_ids.is_empty() || (ack_type == AckType::Cumulative && message_ids.len() != 1) {
                        return Err("an ack carries at least one id, and a cumulative ack exactly one".into());
                    }
                    if !batch_sizes.is_empty() && batch_sizes.len() != message_ids.len() {
                        return Err("an ack's batch sizes are one per id, or none".into());
                    }
                    self.broker().ack_with_batch_sizes(c, ack_type, message_ids, batch_sizes, durable)
                };
                let out = self.out.clone();
                let answer = move |result: Result<(), CoreError>| match (result, request_id) {
                    (Ok(()), Some(request_id)) => out.success(request_id),
                    (Ok(()), None) => {}
                    (Err(e), Some(request_id)) => out.error(request_id, &e),
                    (Err(e), None) => tracing::debug!("ack failed: {e}"),
                };
                // On the owner shard an ack that need not be durable is
                // done when the call returns: answered here, without a task.
                let mut fut = fut;
                match (&mut fut).now_or_never() {
                    Some(result) => answer(result),
                    None => {
                        glommio::spawn_local(async move { answer(fut.await) }).detach();
                    }
                }
            }
            Request::Seek { request_id, consumer_id, target } => {
                let Some(c) = self.consumer(consumer_id) else {
                    self.out.error(request_id, &consumer_not_found());
                    return Ok(());
                };
                match self.broker_handle().seek(&c, target).await {
                    Ok(()) => self.out.success(request_id),
                    Err(e) => self.out.error(request_id, &e),
                }
            }
            Request::Redeliver { consumer_id, message_ids } => {
                if let Some(c) = self.consumers.borrow().get(&consumer_id) {
                    self.broker().redeliver_unacknowledged(c, message_ids);
                }
            }
            Request::CloseConsumer { request_id, consumer_id } => {
                let c = self.consumers.borrow_mut().remove(&consumer_id);
                match c {
                    Some(c) => match self.broker_handle().close_consumer(&c).await {
                        Ok(()) => self.out.success(request_id),
                        Err(e) => self.out.error(request_id, &e),
                    },
                    None => self.out.error(request_id, &consumer_not_found()),
                }
            }
            Request::Unsubscribe { request_id, consumer_id, force } => {
                let Some(c) = self.consumer(consumer_id) else {
                    self.out.error(request_id, &consumer_not_found());
                    return Ok(());
                };
                match self.broker_handle().unsubscribe(&c, force).await {
                    Ok(()) => {
                        // The core detached it without a word to the client.
                        self.consumers.borrow_mut().remove(&consumer_id);
                        self.out.success(request_id)
                    }
                    Err(e) => self.out.error(request_id, &e),
                }
            }
            Request::Ping => self.out.put("a pong", |d, dst| d.pong(dst)),
            Request::Pong => {}
            Request::Other(other) => return D::other(self, other).await,
        }
        Ok(())
    }

    /// Closes the consumer the client calls `consumer_id` on the broker's
    /// initiative (its unacknowledged messages go back to the
    /// subscription); false if there is none. The door tells the client.
    pub(crate) async fn detach_consumer(&self, consumer_id: u64) -> bool {
        let c = self.consumers.borrow_mut().remove(&consumer_id);
        match c {
            Some(c) => {
                let _ = self.broker_handle().close_consumer(&c).await;
                true
            }
            None => false,
        }
    }

    /// The consumer the client calls `consumer_id`, if it has one.
    pub(crate) fn consumer(&self, consumer_id: u64) -> Option<ConsumerHandle> {
        self.consumers.borrow().get(&consumer_id).cloned()
    }

    fn create_producer(
        self: &Rc<Self>,
        request_id: u64,
        producer_id: u64,
        topic: String,
        producer_name: String,
        access_mode: ProducerAccessMode,
        epoch: Option<u64>,
    ) {
        if self.producers.borrow().contains_key(&producer_id) || self.pending_producers.borrow().contains(&producer_id)
        {
            self.out.error(request_id, &CoreError::new(ErrorCode::ProducerBusy, "producer id already in use"));
            return;
        }
        if self.producers.borrow().len() >= self.limits.producers_max {
            self.out.error(
                request_id,
                &CoreError::new(ErrorCode::TooManyRequests, "too many producers on this connection"),
            );
            return;
        }
        // Created in its own task: a WaitForExclusive producer may wait a
        // long time, and must not stop this connection's other requests
        // meanwhile.
        self.pending_producers.borrow_mut().insert(producer_id);
        let me = self.clone();
        glommio::spawn_local(async move {
            let broker = me.broker_handle();
            // The owner tells when a WaitForExclusive producer joins the
            // topic's queue, before it attaches it; the client is told it
            // waits then, and always before the creation.
            let (queued_tx, queued_rx) = futures::channel::oneshot::channel();
            let tell_waiting = || {
                if !me.out.is_closed() {
                    me.out.put("a producer's wait", |d, dst| d.producer_waiting(dst, request_id));
                }
            };
            let creation = broker
                .create_producer_queued(&topic, &producer_name, access_mode, epoch, Some(queued_tx))
                .boxed_local();
            let created = match futures::future::select(creation, queued_rx).await {
                futures::future::Either::Left((created, mut queued_rx)) => {
                    // Both ready at once: the wait was announced first.
                    if let Ok(Some(())) = queued_rx.try_recv() {
                        tell_waiting();
                    }
                    created
                }
                futures::future::Either::Right((queued, creation)) => {
                    if queued.is_ok() {
                        tell_waiting();
                    }
                    creation.await
                }
            };
            me.pending_producers.borrow_mut().remove(&producer_id);
            match created {
                Ok(handle) if me.out.is_closed() || me.gone.get() => {
                    // The connection ended while we waited.
                    let _ = me.broker_handle().close_producer(&handle).await;
                }
                Ok(handle) => {
                    me.out.put("a producer's creation", |d, dst| d.producer_created(dst, request_id, &handle));
                    let (tx, rx) = local_channel::new_unbounded::<Receipt>();
                    let task = write_receipts(producer_id, rx, me.out.clone(), me.inflight.clone());
                    glommio::spawn_local(task).detach();
                    me.producers.borrow_mut().insert(producer_id, SessionProducer { handle, receipts: tx });
                }
                Err(e) => me.out.error(request_id, &e),
            }
            me.note_busy();
        })
        .detach();
    }

    fn on_send(&self, producer_id: u64, sequence_id: u64, num_messages: u32, payload: Bytes, payload_crc: Option<u32>) {
        let producers = self.producers.borrow();
        let Some(p) = producers.get(&producer_id) else {
            let e = CoreError::new(ErrorCode::ProducerNotFound, "no such producer on this connection");
            self.out.put("a send error", |d, dst| d.send_error(dst, producer_id, sequence_id, e));
            return;
        };
        magnetar_core::stage::mark("1_conn_send");
        let bytes = payload.len();
        self.inflight.add(bytes);
        let fut = self.broker().send_checked(&p.handle, num_messages, payload, payload_crc);
        let receipt: Receipt = async move { (sequence_id, bytes, fut.await) }.boxed_local();
        if p.receipts.try_send(receipt).is_err() {
            self.inflight.release(bytes);
        }
    }

    /// The sink of this connection's consumers, registered on first use; its
    /// task writes the consumers' events through the door.
    fn sink(self: &Rc<Self>) -> u64 {
        if let Some(s) = self.sink.get() {
            return s;
        }
        let (tx, rx) = local_channel::new_unbounded::<ConsumerEvent>();
        let sink = self.broker().register_sink(tx);
        self.sink.set(Some(sink));
        glommio::spawn_local(pace_deliveries(Rc::downgrade(self), self.out.clone())).detach();
        let me = Rc::downgrade(self);
        let out = self.out.clone();
        glommio::spawn_local(async move {
            while let Some(ev) = rx.recv().await {
                match ev {
                    ConsumerEvent::Message { consumer_id, message_id, redelivery_count, blob, ack_set } => {
                        out.put("a delivery", |d, dst| {
                            d.message(dst, consumer_id, &message_id, redelivery_count, ack_set, &blob)
                        });
                    }
                    ConsumerEvent::Run { consumer_id, first, redelivery_count, blobs } => {
                        out.put("a run of deliveries", |d, dst| {
                            d.run(dst, consumer_id, &first, redelivery_count, &blobs)
                        });
                    }
                    ConsumerEvent::Closed { consumer_id, code, message, entry } => {
                        if let Some(session) = me.upgrade() {
                            session.consumers.borrow_mut().remove(&consumer_id);
                            session.note_busy();
                        }
                        out.put("a consumer's close", |d, dst| {
                            d.consumer_failed(dst, consumer_id, code, message, entry.as_ref())
                        });
                    }
                    ConsumerEvent::ActiveChange { consumer_id, is_active } => {
                        out.put("an active consumer change", |d, dst| d.active_consumer(dst, consumer_id, is_active));
                    }
                }
            }
        })
        .detach();
        sink
    }

    /// Detaches everything this connection created: consumers' unacked
    /// messages go back to their subscriptions, producer names are freed.
    async fn cleanup(&self) {
        self.gone.set(true);
        let consumers: Vec<ConsumerHandle> = self.consumers.borrow_mut().drain().map(|(_, c)| c).collect();
        for c in consumers {
            let _ = self.broker_handle().close_consumer(&c).await;
        }
        let producers: Vec<SessionProducer> = self.producers.borrow_mut().drain().map(|(_, p)| p).collect();
        for p in producers {
            drop(p.receipts);
            let _ = self.broker_handle().close_producer(&p.handle).await;
        }
        if let Some(sink) = self.sink.take() {
            self.broker().unregister_sink(sink);
        }
    }
}

/// Pauses deliveries to the connection's consumers while its output (or
/// the shard's buffered bytes) is above its bound, and resumes them once
/// it has drained to half; ends with the connection.
async fn pace_deliveries<D: Door>(session: std::rc::Weak<Session<D>>, out: Rc<Outbox<D>>) {
    loop {
        if out.is_closed() {
            return;
        }
        let Some(s) = session.upgrade() else { return };
        let paused = s.delivery_paused.get();
        let change = if !paused && out.over() {
            Some(true)
        } else if paused && out.drained_enough() {
            Some(false)
        } else {
            None
        };
        if let Some(pause) = change {
            s.delivery_paused.set(pause);
            let consumers: Vec<ConsumerHandle> = s.consumers.borrow().values().cloned().collect();
            for c in &consumers {
                s.broker().pause_delivery(c, pause);
            }
            tracing::debug!(
                peer = %out.control.peer,
                outbox_bytes = out.pending.get(),
                shard_buffered_bytes = out.control.buffers.bytes(),
                "deliveries {}",
                if pause { "paused" } else { "resumed" }
            );
        }
        let paused = s.delivery_paused.get();
        drop(s);
        if paused {
            // Draining has no signal of its own here: look again soon.
            glommio::timer::sleep(PACE_RECHECK).await;
        } else {
            out.pacer.wait().await;
        }
    }
}

/// How often paused deliveries look whether they may resume.
const PACE_RECHECK: Duration = Duration::from_millis(10);

fn consumer_not_found() -> CoreError {
    CoreError::new(ErrorCode::ConsumerNotFound, "no such consumer")
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::channel::oneshot;
    use std::collections::VecDeque;
    use std::convert::Infallible;
    use std::pin::{pin, Pin};
    use std::task::{Context, Poll};

    /// A door of text lines: a frame is one line, each answer a line naming
    /// what was encoded.
    struct Lines;

    fn line(dst: &mut BytesMut, text: std::fmt::Arguments<'_>) -> Result<(), Infallible> {
        dst.extend_from_slice(format!("{text}\n").as_bytes());
        Ok(())
    }

    impl Door for Lines {
        type Frame = Bytes;
        type Decoder = ();
        type Other = ();
        type Error = Infallible;

        fn decoder(&self, _: &ConnectionLimits) {}
        fn decode(_: &mut (), buf: &mut BytesMut) -> Result<Option<Bytes>, String> {
            Ok(buf.iter().position(|&b| b == b'\n').map(|i| buf.split_to(i + 1).freeze()))
        }
        fn next_frame_bytes(_: &(), _: &[u8]) -> Option<usize> {
            None
        }
        fn handshake(_: &Session<Self>, _: Bytes) -> Handshake {
            Handshake::Accepted(None)
        }
        fn request(&self, _: Bytes) -> Result<Request<()>, String> {
            Ok(Request::Ping)
        }
        async fn other(_: &Rc<Session<Self>>, _: ()) -> Result<(), String> {
            Ok(())
        }
        fn producer_created(&self, dst: &mut BytesMut, r: u64, _: &ProducerHandle) -> Result<(), Infallible> {
            line(dst, format_args!("producer {r}"))
        }
        fn receipt(&self, dst: &mut BytesMut, p: u64, s: u64, id: MessageId) -> Result<(), Infallible> {
            line(dst, format_args!("receipt {p} {s} {}", id.entry))
        }
        fn send_error(&self, dst: &mut BytesMut, p: u64, s: u64, e: CoreError) -> Result<(), Infallible> {
            line(dst, format_args!("send error {p} {s} {}", e.message))
        }
        fn message(
            &self,
            dst: &mut BytesMut,
            c: u64,
            id: &MessageId,
            _: u32,
            _: Vec<u64>,
            _: &[u8],
        ) -> Result<(), Infallible> {
            line(dst, format_args!("message {c} {}", id.entry))
        }
        fn run(&self, dst: &mut BytesMut, c: u64, id: &MessageId, _: u32, b: &[Bytes]) -> Result<(), Infallible> {
            line(dst, format_args!("run {c} {} {}", id.entry, b.len()))
        }
        fn consumer_closed(&self, dst: &mut BytesMut, c: u64, _: ErrorCode, _: String) -> Result<(), Infallible> {
            line(dst, format_args!("closed {c}"))
        }
        fn active_consumer(&self, dst: &mut BytesMut, c: u64, active: bool) -> Result<(), Infallible> {
            line(dst, format_args!("active {c} {active}"))
        }
        fn success(&self, dst: &mut BytesMut, r: u64) -> Result<(), Infallible> {
            line(dst, format_args!("success {r}"))
        }
        fn error(&self, dst: &mut BytesMut, r: u64, e: &CoreError) -> Result<(), Infallible> {
            line(dst, format_args!("error {r} {}", e.message))
        }
        fn pong(&self, dst: &mut BytesMut) -> Result<(), Infallible> {
            line(dst, format_args!("pong"))
        }
        fn ping(&self, dst: &mut BytesMut) -> Result<(), Infallible> {
            line(dst, format_args!("ping"))
        }
        fn protocol_error(&self, dst: &mut BytesMut, why: &str) -> Result<(), Infallible> {
            line(dst, format_args!("protocol error {why}"))
        }
    }

    fn written(out: &Outbox<Lines>) -> String {
        String::from_utf8(out.buf.borrow().to_vec()).unwrap()
    }

    /// Goal: a producer's receipts go out in the order of its sends even
    /// when the sends complete in another order, and its in-flight bytes are
    /// freed as each receipt is written.
    /// Method: three receipts queued for the writer, completed third,
    /// second (an error), then first; the outbox is read after each step.
    #[test]
    fn receipts_are_written_in_send_order() {
        let out = Rc::new(Outbox::new(Lines, Control::detached(usize::MAX), usize::MAX));
        let inflight = Rc::new(InFlight::new(0));
        let (tx, rx) = local_channel::new_unbounded::<Receipt>();
        let mut done = Vec::new();
        for sequence_id in 1..=3u64 {
            let (answer, answered) = oneshot::channel::<Result<MessageId, CoreError>>();
            inflight.add(10);
            let receipt: Receipt = async move { (sequence_id, 10, answered.await.unwrap()) }.boxed_local();
            assert!(tx.try_send(receipt).is_ok());
            done.push(answer);
        }
        drop(tx);
        let mut writer = pin!(write_receipts(7, rx, out.clone(), inflight.clone()));
        assert!(writer.as_mut().now_or_never().is_none());
        let [first, second, third] = <[_; 3]>::try_from(done).ok().unwrap();
        third.send(Ok(MessageId::new(4, 12, -1, -1))).unwrap();
        second.send(Err(CoreError::new(ErrorCode::PersistenceError, "disk full"))).unwrap();
        assert!(writer.as_mut().now_or_never().is_none());
        assert_eq!(written(&out), "", "a receipt went out before the first send's");
        assert_eq!(inflight.bytes.get(), 30);
        first.send(Ok(MessageId::new(4, 11, -1, -1))).unwrap();
        assert!(writer.as_mut().now_or_never().is_some(), "the writer ends once its channel is closed and drained");
        assert_eq!(written(&out), "receipt 7 1 11\nsend error 7 2 disk full\nreceipt 7 3 12\n");
        assert_eq!(inflight.bytes.get(), 0);
    }

    /// A stream that hands out one chunk per read, then the end, and counts
    /// the reads.
    struct Chunks {
        chunks: VecDeque<&'static [u8]>,
        reads: Rc<Cell<usize>>,
    }

    impl AsyncRead for Chunks {
        fn poll_read(mut self: Pin<&mut Self>, _: &mut Context<'_>, buf: &mut [u8]) -> Poll<std::io::Result<usize>> {
            self.reads.set(self.reads.get() + 1);
            let chunk = self.chunks.pop_front().unwrap_or_default();
            buf[..chunk.len()].copy_from_slice(chunk);
            Poll::Ready(Ok(chunk.len()))
        }
    }

    /// Goal: reading pauses while the bytes in flight are above the limit
    /// (frames already read are still handed out), resumes once they are
    /// back within it, and stops once the outbox is closed.
    /// Method: a stream of two chunks; after the first frame, bytes above
    /// the limit are added, then released one step at a time; the stream's
    /// read count shows whether the reader read.
    #[test]
    fn reading_pauses_while_bytes_are_in_flight() {
        let reads = Rc::new(Cell::new(0));
        let mut stream = Chunks { chunks: VecDeque::from([&b"a\nb\n"[..], b"c\n", b"d\n"]), reads: reads.clone() };
        let control = Control::detached(usize::MAX);
        let out = Outbox::new(Lines, control.clone(), usize::MAX);
        let inflight = InFlight::new(100);
        let limits = ConnectionLimits::default();
        let mut reader = Reader::<Lines>::new(());
        let watch = Watch {
            out: &out,
            inflight: &inflight,
            control: &control,
            limits: &limits,
            connected: true,
            idle: &|| false,
            keep_alive: None,
        };
        let mut next = |reader: &mut Reader<Lines>, _: &InFlight| {
            let frame = pin!(reader.next(&mut stream, &watch)).now_or_never();
            frame.map(|f| f.map_err(|e| matches!(e, End::PeerClosed)))
        };
        assert_eq!(next(&mut reader, &inflight).unwrap().ok(), Some(Bytes::from_static(b"a\n")));
        inflight.add(102);
        assert_eq!(next(&mut reader, &inflight).unwrap().ok(), Some(Bytes::from_static(b"b\n")));
        assert_eq!(reads.get(), 1);

        {
            let mut paused = pin!(reader.next(&mut stream, &watch));
            assert!(paused.as_mut().now_or_never().is_none());
            inflight.release(1);
            assert!(paused.as_mut().now_or_never().is_none(), "read with bytes in flight above the limit");
            assert_eq!(reads.get(), 1);
            inflight.release(1);
            let frame = paused.as_mut().now_or_never().unwrap().ok().unwrap();
            assert_eq!(frame, Bytes::from_static(b"c\n"));
            assert_eq!(reads.get(), 2);
        }

        out.close();
        let closed = pin!(reader.next(&mut stream, &watch)).now_or_never().unwrap();
        assert!(matches!(closed, Err(End::PeerClosed)));
        assert_eq!(reads.get(), 2, "read after the outbox closed");
    }

    /// Goal: reading pauses while the connection's unwritten output is
    /// above `outbox_bytes_max` (a client that sends requests and reads no
    /// answers gets no more of them read), and resumes once it is written.
    /// Method: an outbox bound of 10 bytes; pongs put until it is over, then
    /// written away; the stream's read count shows whether the reader read.
    #[test]
    fn reading_pauses_while_output_waits_unwritten() {
        let reads = Rc::new(Cell::new(0));
        let mut stream = Chunks { chunks: VecDeque::from([&b"a\n"[..], b"b\n"]), reads: reads.clone() };
        let control = Control::detached(usize::MAX);
        let out = Outbox::new(Lines, control.clone(), 10);
        let inflight = InFlight::new(100);
        let limits = ConnectionLimits::default();
        let watch = Watch {
            out: &out,
            inflight: &inflight,
            control: &control,
            limits: &limits,
            connected: true,
            idle: &|| false,
            keep_alive: None,
        };
        let mut reader = Reader::<Lines>::new(());
        let first = pin!(reader.next(&mut stream, &watch)).now_or_never().unwrap().ok().unwrap();
        assert_eq!(first, Bytes::from_static(b"a\n"));
        for _ in 0..3 {
            out.put("a pong", |d, dst| d.pong(dst));
        }
        assert_eq!(out.pending.get(), 15);
        assert_eq!(control.buffers.bytes(), 15, "the shard counts the outbox");
        {
            let mut paused = pin!(reader.next(&mut stream, &watch));
            assert!(paused.as_mut().now_or_never().is_none());
            assert_eq!(reads.get(), 1, "read with the output above its bound");
            out.wrote(5);
            let frame = paused.as_mut().now_or_never().unwrap().ok().unwrap();
            assert_eq!(frame, Bytes::from_static(b"b\n"));
        }
        out.release_all();
        assert_eq!(control.buffers.bytes(), 0);
    }

    /// Goal: a peer that sends more than `handshake_bytes_max` before its
    /// handshake (e.g. the start of a huge frame) is closed, and the bytes
    /// it held are given back to the shard's count.
    #[test]
    fn bytes_before_the_handshake_are_bounded() {
        static BIG: [u8; 100] = [b'x'; 100];
        let reads = Rc::new(Cell::new(0));
        let mut stream = Chunks { chunks: VecDeque::from([&BIG[..]]), reads };
        let control = Control::detached(usize::MAX);
        let out = Outbox::new(Lines, control.clone(), usize::MAX);
        let inflight = InFlight::new(100);
        let limits = ConnectionLimits { handshake_bytes_max: 64, ..ConnectionLimits::default() };
        let watch = Watch {
            out: &out,
            inflight: &inflight,
            control: &control,
            limits: &limits,
            connected: false,
            idle: &|| false,
            keep_alive: None,
        };
        let mut reader = Reader::<Lines>::new(());
        // The handshake deadline needs a timer, which needs an executor.
        let ex = glommio::LocalExecutorBuilder::default().make().unwrap();
        let end = ex.run(async { reader.next(&mut stream, &watch).await });
        assert!(matches!(&end, Err(End::Protocol(why)) if why.contains("handshake_bytes_max")));
        assert_eq!(control.buffers.bytes(), 100);
        reader.uncount(&control);
        assert_eq!(control.buffers.bytes(), 0);
    }
}
