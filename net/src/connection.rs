//! One client connection: decode frames, call the broker, write answers.
//!
//! Owned by the shard that accepted it; never crosses cores. Reading stops
//! while the bytes of produce requests awaiting their receipts exceed
//! `inflight_bytes_max`, so a fast producer cannot grow the broker's memory.
//! Receipts of one producer are written in the order of its sends.

use bytes::{Bytes, BytesMut};
use futures::future::LocalBoxFuture;
use futures::io::{AsyncReadExt, AsyncWriteExt};
use futures::FutureExt;
use glommio::channels::local_channel::{self, LocalSender};
use glommio::net::TcpStream;
use magnetar_core::signal::Signal;
use magnetar_core::{Broker, ConsumerEvent, ConsumerHandle, CoreError, ProducerHandle, SeekTarget, SubscribeRequest};
use magnetar_wire::{
    encode_frame, encode_message_frame, encode_message_run_frame, AckType, Command, ErrorCode, Frame, FrameDecoder,
    MessageId, FRAME_HEADER_BYTES, PROTOCOL_VERSION, PROTOCOL_VERSION_RUNS,
};
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::rc::Rc;

/// Bounds that protect the broker from one connection.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Largest frame accepted (and announced in `Connected`).
    pub frame_bytes_max: u32,
    /// Produce payload bytes awaiting receipts before reading pauses.
    pub inflight_bytes_max: usize,
    /// Producers and consumers per connection.
    pub producers_max: usize,
    pub consumers_max: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        Self {
            frame_bytes_max: magnetar_wire::FRAME_BYTES_MAX_DEFAULT,
            inflight_bytes_max: 16 * 1024 * 1024,
            producers_max: 1024,
            consumers_max: 1024,
        }
    }
}

const READ_CHUNK_BYTES: usize = 64 * 1024;
/// Most bytes of a frame that has begun to arrive that the reader makes
/// room for at once (frames above this grow their buffer as they come).
const FRAME_RESERVE_AHEAD_MAX: usize = 1024 * 1024;
/// The writer keeps its buffer's capacity between rounds up to this size;
/// a larger one (after a burst) is given back.
const WRITE_BUFFER_KEEP_BYTES_MAX: usize = 4 * 1024 * 1024;

/// Frames waiting to be written, filled by many tasks, drained by the writer.
struct Outbox {
    buf: RefCell<BytesMut>,
    signal: Signal,
    closed: Cell<bool>,
    /// Largest `MessageRun` frame the client accepts (its `frame_len`); 0
    /// while it has not announced protocol version 2: one `Message` frame
    /// per entry then.
    run_frame_bytes_max: Cell<u32>,
}

/// A `MessageRun` frame's `frame_len` at most (if the client accepts that
/// much): one frame then fits the 64 KiB read step of the SDK's reader.
/// With 256 KiB frames each frame outgrew the reader's buffer, and the
/// fresh allocation per frame cost the client ~9 % of its CPU in page
/// faults (perf, 1 GiB catch-up of 1 KiB entries).
const RUN_FRAME_BYTES_MAX: u32 = 64 * 1024 - 256;

/// Bytes of a `MessageRun` command besides its lengths vector, at most
/// (root offset, vtables, the table and its 24-byte id; a test in this file
/// checks the bound). A run frame is planned with this before it is built.
const RUN_COMMAND_BYTES_FIXED_MAX: usize = 128;

/// How many of `blobs`, from the first, fit one `MessageRun` frame whose
/// `frame_len` is at most `max` (at least one, even if that one does not fit:
/// it then goes as a `Message` frame, as it would to an older client).
fn run_frame_split(blobs: &[Bytes], max: u32) -> usize {
    let max = usize::try_from(max).unwrap_or(usize::MAX);
    let mut len = FRAME_HEADER_BYTES - 4 + RUN_COMMAND_BYTES_FIXED_MAX;
    for (i, b) in blobs.iter().enumerate() {
        len = len.saturating_add(4).saturating_add(b.len());
        if len > max {
            return i.max(1);
        }
    }
    blobs.len()
}

impl Outbox {
    fn push(&self, command: &Command, payload: &[u8]) {
        if self.closed.get() {
            return;
        }
        if let Err(e) = encode_frame(command, payload, &mut self.buf.borrow_mut()) {
            tracing::error!("cannot encode {command:?}: {e}");
            return;
        }
        self.signal.notify();
    }

    /// A delivery; see `magnetar_wire::encode_message_frame`.
    fn message(&self, consumer_id: u64, message_id: &MessageId, redelivery_count: u32, ack_set: Vec<u64>, blob: &[u8]) {
        if !ack_set.is_empty() {
            self.push(&Command::Message { consumer_id, message_id: *message_id, redelivery_count, ack_set }, blob);
            return;
        }
        if self.closed.get() {
            return;
        }
        if let Err(e) =
            encode_message_frame(consumer_id, message_id, redelivery_count, blob, &mut self.buf.borrow_mut())
        {
            tracing::error!("cannot encode a delivery to consumer {consumer_id}: {e}");
            return;
        }
        self.signal.notify();
    }

    /// A run of deliveries (`ConsumerEvent::Run`): `MessageRun` frames
    /// within the client's frame limit, or one `Message` frame per entry to
    /// a client that did not announce protocol version 2.
    fn run(&self, consumer_id: u64, first: &MessageId, redelivery_count: u32, blobs: &[Bytes]) {
        let max = self.run_frame_bytes_max.get();
        let mut id = *first;
        let mut rest = blobs;
        while !rest.is_empty() {
            let n = if max == 0 { 1 } else { run_frame_split(rest, max) };
            let (now, later) = rest.split_at(n);
            if let [blob] = now {
                self.message(consumer_id, &id, redelivery_count, Vec::new(), blob);
            } else if !self.closed.get() {
                if let Err(e) =
                    encode_message_run_frame(consumer_id, &id, redelivery_count, now, &mut self.buf.borrow_mut())
                {
                    // Not expected (the plan keeps a run within the limit);
                    // if it happens the entries still go, one frame each.
                    tracing::error!("cannot encode a run of {n} deliveries to consumer {consumer_id}: {e}");
                    let mut one = id;
                    for blob in now {
                        self.message(consumer_id, &one, redelivery_count, Vec::new(), blob);
                        one.entry = one.entry.wrapping_add(1);
                    }
                }
                self.signal.notify();
            }
            id.entry = id.entry.wrapping_add(n as u64);
            rest = later;
        }
    }

    fn error(&self, request_id: u64, e: &CoreError) {
        self.push(&Command::Error { request_id, code: e.code, message: e.message.clone() }, &[]);
    }

    fn close(&self) {
        self.closed.set(true);
        self.signal.notify();
    }
}

type Receipt = LocalBoxFuture<'static, (u64, usize, Result<MessageId, CoreError>)>;

struct ConnProducer {
    handle: ProducerHandle,
    receipts: LocalSender<Receipt>,
}

struct Conn {
    broker: Broker,
    limits: ConnectionLimits,
    out: Rc<Outbox>,
    producers: RefCell<HashMap<u64, ConnProducer>>,
    consumers: RefCell<HashMap<u64, ConsumerHandle>>,
    sink: Cell<Option<u64>>,
    /// Producer ids whose creation is under way.
    pending_producers: RefCell<std::collections::HashSet<u64>>,
    /// Set once cleanup ran: producers created after it are closed at once.
    gone: Cell<bool>,
    /// `host:port` this connection reached (for lookup answers).
    local_addr: Option<String>,
    /// Announced in `Connected`: the port of each shard's own listener.
    shard_ports: Rc<[u16]>,
    inflight_bytes: Rc<Cell<usize>>,
    drained: Rc<Signal>,
}

/// Why the read loop ended.
enum End {
    PeerClosed,
    Protocol(String),
    Io(std::io::Error),
}

pub(crate) async fn run(broker: Broker, stream: TcpStream, limits: ConnectionLimits, shard_ports: Rc<[u16]>) {
    let _ = stream.set_nodelay(true);
    let peer = stream.peer_addr().map(|a| a.to_string()).unwrap_or_default();
    let local_addr = stream.local_addr().ok().map(|a| a.to_string());
    let (mut reader, mut writer) = stream.split();
    let out = Rc::new(Outbox {
        buf: RefCell::new(BytesMut::new()),
        signal: Signal::new(),
        closed: Cell::new(false),
        run_frame_bytes_max: Cell::new(0),
    });

    let writer_out = out.clone();
    let writer_task = glommio::spawn_local(async move {
        // Double buffering: the writer swaps its drained buffer with the
        // outbox's full one, so both keep their capacity and frames are
        // encoded into memory already mapped. Splitting frozen chunks off
        // the outbox instead left it sharing an allocation still being
        // written, so every round of encoding reallocated into fresh
        // memory: perf showed ~10 % of broker samples in page faults and
        // realloc under `Outbox::push` with batched 128 KiB deliveries
        // (issue #6).
        let mut chunk = BytesMut::new();
        loop {
            {
                let mut buf = writer_out.buf.borrow_mut();
                std::mem::swap(&mut *buf, &mut chunk);
            }
            if chunk.is_empty() {
                if writer_out.closed.get() {
                    break;
                }
                writer_out.signal.wait().await;
                continue;
            }
            magnetar_core::stage::mark("9_writer_woke");
            let written = writer.write_all(&chunk).await;
            magnetar_core::stage::mark("10_written");
            if let Err(e) = written {
                tracing::debug!("write failed: {e}");
                writer_out.closed.set(true);
                break;
            }
            chunk.clear();
            if chunk.capacity() > WRITE_BUFFER_KEEP_BYTES_MAX {
                chunk = BytesMut::new();
            }
        }
        let _ = writer.flush().await;
        let _ = writer.close().await;
    });

    let conn = Rc::new(Conn {
        broker,
        limits,
        out: out.clone(),
        producers: RefCell::new(HashMap::new()),
        consumers: RefCell::new(HashMap::new()),
        sink: Cell::new(None),
        pending_producers: RefCell::new(std::collections::HashSet::new()),
        gone: Cell::new(false),
        local_addr,
        shard_ports,
        inflight_bytes: Rc::new(Cell::new(0)),
        drained: Rc::new(Signal::new()),
    });
    let end = conn.read_loop(&mut reader).await;
    match &end {
        End::PeerClosed => tracing::debug!(%peer, "connection closed by peer"),
        End::Protocol(why) => {
            tracing::info!(%peer, "closing connection: {why}");
            out.push(&Command::Error { request_id: 0, code: ErrorCode::ProtocolError, message: why.clone() }, &[]);
        }
        End::Io(e) => tracing::debug!(%peer, "connection read failed: {e}"),
    }
    conn.cleanup().await;
    out.close();
    writer_task.await;
}

impl Conn {
    async fn read_loop<R: futures::io::AsyncRead + Unpin>(self: &Rc<Self>, reader: &mut R) -> End {
        let mut decoder = FrameDecoder::new(self.limits.frame_bytes_max);
        let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
        // Reads land in this scratch buffer, zeroed once, and only the bytes
        // read are copied into `buf`. Reading straight into `buf` needs
        // initialized memory (no unsafe here), and zero-filling 64 KiB per
        // read cost more than the copy: decoded frames keep slices of `buf`
        // alive, so each fill went to a fresh allocation and page-faulted
        // (perf, issue #6: ~4% of broker CPU in memset + page faults at
        // 100k msg/s, and 64 KiB of memset per message at one in flight).
        let mut scratch = vec![0u8; READ_CHUNK_BYTES];
        let mut connected = false;
        loop {
            // Backpressure: wait for receipts before reading more.
            while self.inflight_bytes.get() > self.limits.inflight_bytes_max {
                self.drained.wait().await;
            }
            if self.out.closed.get() {
                return End::PeerClosed;
            }
            let n = match reader.read(&mut scratch).await {
                Ok(n) => n,
                Err(e) => return End::Io(e),
            };
            buf.extend_from_slice(&scratch[..n]);
            if n == 0 {
                return if buf.is_empty() {
                    End::PeerClosed
                } else {
                    End::Protocol("connection closed mid-frame".into())
                };
            }
            loop {
                let frame = match decoder.decode(&mut buf) {
                    Ok(Some(f)) => f,
                    Ok(None) => {
                        // Only for a peer that completed the handshake: 4
                        // bytes of a length from anyone else reserve nothing.
                        if connected {
                            reserve_for_frame(&decoder, &mut buf);
                        }
                        break;
                    }
                    Err(e) => return End::Protocol(format!("bad frame: {e}")),
                };
                if !connected {
                    match frame.command {
                        Command::Connect { protocol_version, max_frame_bytes, .. } if protocol_version >= 1 => {
                            connected = true;
                            if protocol_version >= PROTOCOL_VERSION_RUNS {
                                // Runs stay within what the client accepts
                                // (not announced: the default limit).
                                let max = if max_frame_bytes == 0 {
                                    magnetar_wire::FRAME_BYTES_MAX_DEFAULT
                                } else {
                                    max_frame_bytes
                                };
                                self.out.run_frame_bytes_max.set(max.min(RUN_FRAME_BYTES_MAX));
                            }
                            self.out.push(
                                &Command::Connected {
                                    server_version: concat!("magnetar/", env!("CARGO_PKG_VERSION")).to_string(),
                                    protocol_version: protocol_version.min(PROTOCOL_VERSION),
                                    max_frame_bytes: self.limits.frame_bytes_max,
                                    shard: self.broker.shard_id(),
                                    shard_ports: self.shard_ports.to_vec(),
                                },
                                &[],
                            );
                            continue;
                        }
                        Command::Connect { protocol_version, .. } => {
                            self.out.push(
                                &Command::Error {
                                    request_id: 0,
                                    code: ErrorCode::UnsupportedVersion,
                                    message: format!("protocol version {protocol_version} is not supported"),
                                },
                                &[],
                            );
                            return End::PeerClosed;
                        }
                        _ => return End::Protocol("the first frame must be Connect".into()),
                    }
                }
                if let Err(why) = self.handle(frame).await {
                    return End::Protocol(why);
                }
            }
        }
    }

    /// Handles one frame; `Err` closes the connection.
    async fn handle(self: &Rc<Self>, frame: Frame) -> Result<(), String> {
        let Frame { command, payload, payload_crc } = frame;
        match command {
            Command::Send { producer_id, sequence_id, num_messages } => {
                self.on_send(producer_id, sequence_id, num_messages, payload, payload_crc)
            }
            Command::Producer { request_id, producer_id, topic, producer_name, access_mode } => {
                if self.producers.borrow().contains_key(&producer_id)
                    || self.pending_producers.borrow().contains(&producer_id)
                {
                    self.out.error(request_id, &CoreError::new(ErrorCode::ProducerBusy, "producer id already in use"));
                } else if self.producers.borrow().len() >= self.limits.producers_max {
                    self.out.error(
                        request_id,
                        &CoreError::new(ErrorCode::TooManyRequests, "too many producers on this connection"),
                    );
                } else {
                    // Created in its own task: a WaitForExclusive producer may
                    // wait a long time, and must not stop this connection's
                    // other requests meanwhile.
                    self.pending_producers.borrow_mut().insert(producer_id);
                    let me = self.clone();
                    glommio::spawn_local(async move {
                        let created = me.broker.create_producer_with(&topic, &producer_name, access_mode).await;
                        me.pending_producers.borrow_mut().remove(&producer_id);
                        match created {
                            Ok(handle) if me.out.closed.get() || me.gone.get() => {
                                // The connection ended while we waited.
                                let _ = me.broker.close_producer(&handle).await;
                            }
                            Ok(handle) => {
                                me.out.push(
                                    &Command::ProducerSuccess {
                                        request_id,
                                        producer_name: handle.producer_name.clone(),
                                        last_sequence_id: handle.last_sequence_id,
                                    },
                                    &[],
                                );
                                let receipts = me.spawn_receipt_writer(producer_id);
                                me.producers.borrow_mut().insert(producer_id, ConnProducer { handle, receipts });
                            }
                            Err(e) => me.out.error(request_id, &e),
                        }
                    })
                    .detach();
                }
                Ok(())
            }
            Command::CloseProducer { request_id, producer_id } => {
                let p = self.producers.borrow_mut().remove(&producer_id);
                match p {
                    Some(p) => {
                        // Receipts already queued are still written (the
                        // writer task drains its channel), then it ends.
                        drop(p.receipts);
                        match self.broker.close_producer(&p.handle).await {
                            Ok(()) => self.out.push(&Command::Success { request_id }, &[]),
                            Err(e) => self.out.error(request_id, &e),
                        }
                    }
                    None => {
                        self.out.error(request_id, &CoreError::new(ErrorCode::ProducerNotFound, "no such producer"))
                    }
                }
                Ok(())
            }
            Command::Subscribe {
                request_id,
                consumer_id,
                topic,
                subscription,
                sub_type,
                consumer_name,
                initial_position,
                durable,
                priority_level,
                filter_tag,
                key_shared_ranges,
            } => {
                if self.consumers.borrow().contains_key(&consumer_id) {
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
                let req = SubscribeRequest {
                    topic,
                    subscription,
                    consumer_id,
                    sub_type,
                    consumer_name,
                    initial_position,
                    durable,
                    priority_level,
                    filter_tag,
                    key_shared_ranges,
                };
                match self.broker.subscribe(req, sink).await {
                    Ok(handle) => {
                        self.consumers.borrow_mut().insert(consumer_id, handle);
                        self.out.push(&Command::Success { request_id }, &[]);
                    }
                    Err(e) => self.out.error(request_id, &e),
                }
                Ok(())
            }
            Command::Flow { consumer_id, permits } => {
                if let Some(c) = self.consumers.borrow().get(&consumer_id) {
                    self.broker.flow(c, permits);
                }
                Ok(())
            }
            Command::Ack { consumer_id, ack_type, message_ids, request_id, batch_sizes } => {
                let Some(c) = self.consumers.borrow().get(&consumer_id).cloned() else {
                    if request_id != 0 {
                        self.out.error(request_id, &CoreError::new(ErrorCode::ConsumerNotFound, "no such consumer"));
                    }
                    return Ok(());
                };
                if message_ids.is_empty() || (ack_type == AckType::Cumulative && message_ids.len() != 1) {
                    return Err("an ack carries at least one id, and a cumulative ack exactly one".into());
                }
                if !batch_sizes.is_empty() && batch_sizes.len() != message_ids.len() {
                    return Err("an ack's batch sizes are one per id, or none".into());
                }
                let fut = self.broker.ack_with_batch_sizes(&c, ack_type, message_ids, batch_sizes, request_id != 0);
                let out = self.out.clone();
                glommio::spawn_local(async move {
                    match fut.await {
                        Ok(()) if request_id != 0 => out.push(&Command::Success { request_id }, &[]),
                        Ok(()) => {}
                        Err(e) if request_id != 0 => out.error(request_id, &e),
                        Err(e) => tracing::debug!("ack failed: {e}"),
                    }
                })
                .detach();
                Ok(())
            }
            Command::Seek { request_id, consumer_id, message_id, publish_time_ms } => {
                let Some(c) = self.consumers.borrow().get(&consumer_id).cloned() else {
                    self.out.error(request_id, &CoreError::new(ErrorCode::ConsumerNotFound, "no such consumer"));
                    return Ok(());
                };
                let target = match message_id {
                    Some(id) => SeekTarget::Id(id),
                    None => SeekTarget::PublishTime(publish_time_ms),
                };
                match self.broker.seek(&c, target).await {
                    Ok(()) => self.out.push(&Command::Success { request_id }, &[]),
                    Err(e) => self.out.error(request_id, &e),
                }
                Ok(())
            }
            Command::TopicStats { request_id, topic, .. } => {
                match self.broker.topic_stats(&topic).await {
                    Ok(stats) => {
                        let json = crate::native::admin::render_topic_stats(&stats);
                        self.out.push(&Command::TopicStats { request_id, topic, json }, &[])
                    }
                    Err(e) => self.out.error(request_id, &e),
                }
                Ok(())
            }
            Command::RedeliverUnacknowledged { consumer_id, message_ids } => {
                if let Some(c) = self.consumers.borrow().get(&consumer_id) {
                    self.broker.redeliver_unacknowledged(c, message_ids);
                }
                Ok(())
            }
            Command::CloseConsumer { request_id, consumer_id } => {
                let c = self.consumers.borrow_mut().remove(&consumer_id);
                match c {
                    Some(c) => match self.broker.close_consumer(&c).await {
                        Ok(()) => self.out.push(&Command::Success { request_id }, &[]),
                        Err(e) => self.out.error(request_id, &e),
                    },
                    None => {
                        self.out.error(request_id, &CoreError::new(ErrorCode::ConsumerNotFound, "no such consumer"))
                    }
                }
                Ok(())
            }
            Command::Ping => {
                self.out.push(&Command::Pong, &[]);
                Ok(())
            }
            Command::AdminRequest { request_id, op, json } => {
                let me = self.clone();
                glommio::spawn_local(async move {
                    match crate::native::admin::run(&me.broker, &op, &json, me.local_addr.as_deref()).await {
                        Ok(json) => me.out.push(&Command::AdminResponse { request_id, json }, &[]),
                        Err(e) => me.out.error(request_id, &e),
                    }
                })
                .detach();
                Ok(())
            }
            Command::Pong => Ok(()),
            Command::Connect { .. } => Err("Connect sent twice".into()),
            other => Err(format!("unexpected command from a client: {}", other.name())),
        }
    }

    fn on_send(
        self: &Rc<Self>,
        producer_id: u64,
        sequence_id: u64,
        num_messages: u32,
        payload: Bytes,
        payload_crc: Option<u32>,
    ) -> Result<(), String> {
        let producers = self.producers.borrow();
        let Some(p) = producers.get(&producer_id) else {
            self.out.push(
                &Command::SendError {
                    producer_id,
                    sequence_id,
                    code: ErrorCode::ProducerNotFound,
                    message: "no such producer on this connection".into(),
                },
                &[],
            );
            return Ok(());
        };
        magnetar_core::stage::mark("1_conn_send");
        let bytes = payload.len();
        self.inflight_bytes.set(self.inflight_bytes.get() + bytes);
        let fut = self.broker.send_checked(&p.handle, sequence_id, num_messages, payload, payload_crc);
        let receipt: Receipt = async move { (sequence_id, bytes, fut.await) }.boxed_local();
        if p.receipts.try_send(receipt).is_err() {
            self.inflight_bytes.set(self.inflight_bytes.get() - bytes);
        }
        Ok(())
    }

    /// One task per producer writes its receipts in send order.
    fn spawn_receipt_writer(self: &Rc<Self>, producer_id: u64) -> LocalSender<Receipt> {
        let (tx, rx) = local_channel::new_unbounded::<Receipt>();
        let out = self.out.clone();
        let inflight = self.inflight_bytes.clone();
        let drained = self.drained.clone();
        glommio::spawn_local(async move {
            while let Some(receipt) = rx.recv().await {
                let (sequence_id, bytes, result) = receipt.await;
                magnetar_core::stage::mark("8_conn_receipt");
                match result {
                    Ok(message_id) => out.push(&Command::SendReceipt { producer_id, sequence_id, message_id }, &[]),
                    Err(e) => out
                        .push(&Command::SendError { producer_id, sequence_id, code: e.code, message: e.message }, &[]),
                }
                inflight.set(inflight.get() - bytes);
                drained.notify();
            }
        })
        .detach();
        tx
    }

    /// The sink of this connection's consumers, registered on first use.
    fn sink(self: &Rc<Self>) -> u64 {
        if let Some(s) = self.sink.get() {
            return s;
        }
        let (tx, rx) = local_channel::new_unbounded::<ConsumerEvent>();
        let sink = self.broker.register_sink(tx);
        self.sink.set(Some(sink));
        let me = Rc::downgrade(self);
        let out = self.out.clone();
        glommio::spawn_local(async move {
            while let Some(ev) = rx.recv().await {
                match ev {
                    ConsumerEvent::Message { consumer_id, message_id, redelivery_count, blob, ack_set } => {
                        out.message(consumer_id, &message_id, redelivery_count, ack_set, &blob);
                    }
                    ConsumerEvent::Run { consumer_id, first, redelivery_count, blobs } => {
                        out.run(consumer_id, &first, redelivery_count, &blobs);
                    }
                    ConsumerEvent::Closed { consumer_id, code, message } => {
                        if let Some(conn) = me.upgrade() {
                            conn.consumers.borrow_mut().remove(&consumer_id);
                        }
                        out.push(&Command::Error { request_id: 0, code, message }, &[]);
                    }
                    ConsumerEvent::ActiveChange { consumer_id, is_active } => {
                        out.push(&Command::ActiveConsumerChange { consumer_id, is_active }, &[]);
                    }
                }
            }
        })
        .detach();
        sink
    }

    /// Detaches everything this connection created: consumers' unacked
    /// messages go back to their subscriptions, producer names are freed.
    async fn cleanup(self: &Rc<Self>) {
        self.gone.set(true);
        let consumers: Vec<ConsumerHandle> = self.consumers.borrow_mut().drain().map(|(_, c)| c).collect();
        for c in consumers {
            let _ = self.broker.close_consumer(&c).await;
        }
        let producers: Vec<ConnProducer> = self.producers.borrow_mut().drain().map(|(_, p)| p).collect();
        for p in producers {
            drop(p.receipts);
            let _ = self.broker.close_producer(&p.handle).await;
        }
        if let Some(sink) = self.sink.take() {
            self.broker.unregister_sink(sink);
        }
    }
}
/// Makes room in `buf` for the rest of the frame at its front (up to
/// `FRAME_RESERVE_AHEAD_MAX`) plus one more read, so that the frame's bytes
/// are copied once, from the read buffer. Without it a batch frame (~130
/// KiB) spanning several reads moved to a larger allocation as it grew,
/// copying what had arrived each time (`BytesMut::reserve` under
/// `extend_from_slice`: ~9 % of broker CPU in the canonical bench, issue #6).
fn reserve_for_frame(decoder: &FrameDecoder, buf: &mut BytesMut) {
    // A bad length was already refused by `decode`.
    if let Ok(Some(total)) = decoder.next_frame_bytes(buf) {
        let rest = total.saturating_sub(buf.len()).min(FRAME_RESERVE_AHEAD_MAX);
        buf.reserve(rest.saturating_add(READ_CHUNK_BYTES));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Goal: a frame that arrives over many reads, behind frames still
    /// referenced elsewhere, is copied once into its buffer (no move to a
    /// larger allocation as it grows) and still decodes whole, and a frame
    /// above `FRAME_RESERVE_AHEAD_MAX` is not reserved in full up front.
    /// Method: a small frame, then a 130 KiB `Send` fed in 16 KiB pieces (the
    /// first decoded frame kept alive, as the broker's write cache does);
    /// the buffer's address is compared after each piece.
    #[test]
    fn a_frame_arriving_in_pieces_stays_in_one_allocation() {
        let mut small = BytesMut::new();
        encode_frame(&Command::Ping, &[], &mut small).unwrap_or_else(|e| panic!("{e}"));
        let payload: Vec<u8> = (0..130 * 1024u32).map(|i| (i % 251) as u8).collect();
        let mut big = BytesMut::new();
        let send = Command::Send { producer_id: 1, sequence_id: 2, num_messages: 3 };
        encode_frame(&send, &payload, &mut big).unwrap_or_else(|e| panic!("{e}"));
        let mut wire = small.to_vec();
        wire.extend_from_slice(&big);

        let mut decoder = FrameDecoder::new(5 << 20);
        let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
        let mut pieces = wire.chunks(16 * 1024);
        buf.extend_from_slice(pieces.next().unwrap_or_default());
        let kept = decoder.decode(&mut buf).unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(kept, Some(Frame { command: Command::Ping, .. })));
        assert!(decoder.decode(&mut buf).unwrap_or_else(|e| panic!("{e}")).is_none());
        reserve_for_frame(&decoder, &mut buf);
        let at = buf.as_ptr();
        let mut frame = None;
        for piece in pieces {
            buf.extend_from_slice(piece);
            assert_eq!(buf.as_ptr(), at, "the frame moved to a new allocation");
            if let Some(f) = decoder.decode(&mut buf).unwrap_or_else(|e| panic!("{e}")) {
                frame = Some(f);
            }
        }
        let frame = frame.unwrap_or_else(|| panic!("the Send frame did not decode"));
        assert_eq!(frame.command, send);
        assert_eq!(frame.payload.as_ref(), payload.as_slice());
        drop(kept);

        // A frame far above the cap: only the cap and one read are reserved.
        let mut huge = BytesMut::new();
        huge.extend_from_slice(&(4u32 << 20).to_le_bytes());
        let mut buf = huge;
        reserve_for_frame(&decoder, &mut buf);
        assert!(buf.capacity() <= FRAME_RESERVE_AHEAD_MAX + READ_CHUNK_BYTES + 64, "{}", buf.capacity());
        assert!(buf.capacity() >= FRAME_RESERVE_AHEAD_MAX, "{}", buf.capacity());
    }

    /// Goal: the run frames the connection plans stay within the frame
    /// limit: the command besides its lengths is within the fixed bound
    /// (whatever the ids, consumer id and redelivery count), and a split never passes `max` unless a lone
    /// entry is bigger by itself (which then goes as a `Message` frame).
    #[test]
    fn planned_run_frames_fit_the_limit() {
        let ids = [MessageId::new(0, 0, -1, -1), MessageId::new(u64::MAX, u64::MAX - 1000, i32::MIN, i32::MAX)];
        for (id, redelivery_count) in ids.into_iter().flat_map(|id| [(id, 0u32), (id, u32::MAX)]) {
            for (n, size) in [(2usize, 0usize), (2, 1024), (60, 1000), (300, 7), (63, 1024), (1, 70_000)] {
                let blobs: Vec<Bytes> = (0..n).map(|i| Bytes::from(vec![i as u8; size])).collect();
                for max in [RUN_FRAME_BYTES_MAX, 4096, 2000, 100] {
                    let mut rest = &blobs[..];
                    while !rest.is_empty() {
                        let k = run_frame_split(rest, max);
                        assert!(k >= 1 && k <= rest.len());
                        let (now, later) = rest.split_at(k);
                        let mut buf = BytesMut::new();
                        encode_message_run_frame(u64::MAX, &id, redelivery_count, now, &mut buf).unwrap();
                        let cmd_len = u32::from_le_bytes(buf[8..12].try_into().unwrap()) as usize;
                        assert!(cmd_len <= RUN_COMMAND_BYTES_FIXED_MAX + 4 * k, "{cmd_len} for {k} entries");
                        let frame_len = buf.len() - 4;
                        if k > 1 {
                            assert!(frame_len <= max as usize, "{k} entries of {size} bytes: {frame_len} > {max}");
                        }
                        // Greedy: one more entry would not have fitted.
                        if let Some(next) = later.first() {
                            let planned = 8
                                + RUN_COMMAND_BYTES_FIXED_MAX
                                + 4 * (k + 1)
                                + now.iter().map(Bytes::len).sum::<usize>()
                                + next.len();
                            assert!(planned > max as usize, "{k} entries: one more would have fitted");
                        }
                        assert_eq!(FRAME_HEADER_BYTES + cmd_len + now.iter().map(Bytes::len).sum::<usize>(), buf.len());
                        rest = later;
                    }
                }
            }
        }
    }
}
