//! The client against a scripted fake broker: a tiny in-test TCP server that
//! speaks the real frames (magnetar-wire), so the client's protocol handling
//! is tested without the real broker. Each test scripts the broker's side in
//! a task and drives the client from the test body; each runs under a
//! timeout so a protocol deadlock fails instead of hanging.

// Tests may unwrap (STYLE rules); clippy.toml only covers #[test] fns, not helpers.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use bytes::{Bytes, BytesMut};
use magnetar_client::{
    AckType, Client, ClientError, ClientOptions, ErrorCode, InitialPosition, MessageId, OutgoingMessage,
    SubscriptionType,
};
use magnetar_wire::{decode_message, encode_frame, encode_message, Command, Frame, FrameDecoder, MessageMetadata};
use std::future::Future;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const TEST_TIMEOUT: Duration = Duration::from_secs(20);

async fn within<T>(fut: impl Future<Output = T>) -> T {
    tokio::time::timeout(TEST_TIMEOUT, fut).await.expect("test timed out")
}

/// The broker's end of one client connection.
struct FakeConn {
    stream: TcpStream,
    decoder: FrameDecoder,
    buf: BytesMut,
}

impl FakeConn {
    /// Next frame from the client, `None` at EOF.
    async fn recv(&mut self) -> Option<Frame> {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buf).unwrap() {
                return Some(frame);
            }
            if self.stream.read_buf(&mut self.buf).await.unwrap() == 0 {
                return None;
            }
        }
    }

    /// Next frame that is not a keepalive Ping.
    async fn recv_cmd(&mut self) -> Frame {
        loop {
            let frame = self.recv().await.expect("client closed the connection");
            if frame.command != Command::Ping {
                return frame;
            }
        }
    }

    /// Next frame if one comes within `wait`.
    async fn recv_within(&mut self, wait: Duration) -> Option<Frame> {
        tokio::time::timeout(wait, self.recv()).await.ok().flatten()
    }

    async fn send(&mut self, command: Command, payload: &[u8]) {
        let mut dst = BytesMut::new();
        encode_frame(&command, payload, &mut dst).unwrap();
        self.stream.write_all(&dst).await.unwrap();
    }

    /// Answer a `Producer` request with success under `name`.
    async fn accept_producer(&mut self, name: &str) -> u64 {
        match self.recv_cmd().await.command {
            Command::Producer { request_id, producer_id, .. } => {
                self.send(
                    Command::ProducerSuccess { request_id, producer_name: name.into(), last_sequence_id: -1 },
                    &[],
                )
                .await;
                producer_id
            }
            other => panic!("expected Producer, got {other:?}"),
        }
    }
}

/// Listen on an ephemeral port; the returned future accepts one client and
/// completes the handshake, announcing `max_frame_bytes`.
async fn listen(max_frame_bytes: u32) -> (String, impl Future<Output = FakeConn>) {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let url = format!("magnetar://{}", listener.local_addr().unwrap());
    let accept = async move {
        let (stream, _) = listener.accept().await.unwrap();
        let mut conn = FakeConn { stream, decoder: FrameDecoder::new(16 << 20), buf: BytesMut::new() };
        match conn.recv().await.unwrap().command {
            Command::Connect { protocol_version, max_frame_bytes, .. } => {
                assert_eq!(protocol_version, magnetar_wire::PROTOCOL_VERSION);
                // Version 2: the client's own frame limit, for the broker's runs.
                assert_eq!(max_frame_bytes, ClientOptions::default().max_frame_bytes);
            }
            other => panic!("expected Connect, got {other:?}"),
        }
        conn.send(
            Command::Connected {
                server_version: "fake".into(),
                protocol_version: magnetar_wire::PROTOCOL_VERSION,
                max_frame_bytes,
                shard: 1,
                shard_ports: Vec::new(),
            },
            &[],
        )
        .await;
        conn
    };
    (url, accept)
}

fn options() -> ClientOptions {
    ClientOptions { operation_timeout: Duration::from_secs(5), ..ClientOptions::default() }
}

/// Goal: pipelined sends carry the right metadata, are bounded by
/// `max_pending`, and complete in order with the broker's ids.
/// Method: the broker reads exactly `max_pending` sends, checks that no more
/// arrive while they are unanswered, then answers them all; three rounds.
#[tokio::test]
async fn produce_receipts_in_order_within_max_pending() {
    within(async {
        const MAX_PENDING: usize = 10;
        const ROUNDS: u64 = 3;
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            let producer_id = match conn.recv_cmd().await.command {
                Command::Producer { request_id, producer_id, topic, producer_name, .. } => {
                    assert_eq!(topic, "persistent://public/default/orders");
                    assert_eq!(producer_name, "");
                    conn.send(
                        Command::ProducerSuccess { request_id, producer_name: "gen-7".into(), last_sequence_id: -1 },
                        &[],
                    )
                    .await;
                    producer_id
                }
                other => panic!("expected Producer, got {other:?}"),
            };
            let mut expected_seq = 0u64;
            for _ in 0..ROUNDS {
                let mut round = Vec::new();
                for _ in 0..MAX_PENDING {
                    let frame = conn.recv_cmd().await;
                    let Command::Send { producer_id: p, sequence_id, num_messages } = frame.command else {
                        panic!("expected Send, got {:?}", frame.command)
                    };
                    assert_eq!((p, sequence_id, num_messages), (producer_id, expected_seq, 1));
                    let (meta, payload) = decode_message(&frame.payload).unwrap();
                    assert_eq!(meta.producer_name, "gen-7");
                    assert_eq!(meta.sequence_id, expected_seq);
                    assert_eq!(meta.num_messages, 1);
                    assert!(meta.publish_time_ms > 1_600_000_000_000);
                    assert_eq!(meta.partition_key, Some(format!("k{}", expected_seq % 3)));
                    assert_eq!(meta.properties, vec![("a".to_string(), "1".to_string())]);
                    assert_eq!(meta.event_time_ms, 42);
                    assert_eq!(payload, Bytes::from(format!("m{expected_seq}")));
                    round.push(sequence_id);
                    expected_seq += 1;
                }
                // The client must not exceed max_pending unanswered sends.
                if let Some(extra) = conn.recv_within(Duration::from_millis(150)).await {
                    assert_eq!(extra.command, Command::Ping, "send beyond max_pending: {:?}", extra.command);
                }
                for seq in round {
                    conn.send(
                        Command::SendReceipt {
                            producer_id,
                            sequence_id: seq,
                            message_id: MessageId::new(3, seq, -1, -1),
                        },
                        &[],
                    )
                    .await;
                }
            }
            // close(): CloseProducer, answered with Success.
            match conn.recv_cmd().await.command {
                Command::CloseProducer { request_id, producer_id: p } => {
                    assert_eq!(p, producer_id);
                    conn.send(Command::Success { request_id }, &[]).await;
                }
                other => panic!("expected CloseProducer, got {other:?}"),
            }
        });

        let client = Client::connect_with(&url, options()).await.unwrap();
        assert_eq!(client.server_info().shard, 1);
        let producer = client.producer("orders").max_pending(MAX_PENDING).create().await.unwrap();
        assert_eq!(producer.name(), "gen-7");
        assert_eq!(producer.topic(), "persistent://public/default/orders");
        let total = MAX_PENDING as u64 * ROUNDS;
        let mut receipts = Vec::new();
        for seq in 0..total {
            let msg = OutgoingMessage::new(format!("m{seq}"))
                .with_key(format!("k{}", seq % 3))
                .with_property("a", "1")
                .with_event_time_ms(42);
            let receipt = producer.send_async(msg).await.unwrap();
            assert_eq!(receipt.sequence_id(), seq);
            assert!(producer.pending() <= MAX_PENDING);
            receipts.push(receipt);
        }
        for (seq, receipt) in receipts.into_iter().enumerate() {
            assert_eq!(receipt.await.unwrap(), MessageId::new(3, seq as u64, -1, -1));
        }
        assert_eq!(producer.pending(), 0);
        producer.close().await.unwrap();
        assert!(matches!(producer.send(OutgoingMessage::new("late")).await, Err(ClientError::ProducerClosed { .. })));
        broker.await.unwrap();
    })
    .await;
}

/// Goal: broker errors surface as typed errors and do not break the
/// connection. Method: refuse one producer, fail one send, accept the next.
#[tokio::test]
async fn broker_errors_are_typed() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            match conn.recv_cmd().await.command {
                Command::Producer { request_id, .. } => {
                    conn.send(
                        Command::Error { request_id, code: ErrorCode::ProducerBusy, message: "taken".into() },
                        &[],
                    )
                    .await
                }
                other => panic!("expected Producer, got {other:?}"),
            }
            let producer_id = conn.accept_producer("p").await;
            for (i, frame) in [conn.recv_cmd().await, conn.recv_cmd().await].into_iter().enumerate() {
                let Command::Send { sequence_id, .. } = frame.command else { panic!("expected Send") };
                assert_eq!(sequence_id, i as u64);
                let answer = if i == 0 {
                    Command::SendError {
                        producer_id,
                        sequence_id,
                        code: ErrorCode::PersistenceError,
                        message: "disk".into(),
                    }
                } else {
                    Command::SendReceipt { producer_id, sequence_id, message_id: MessageId::new(1, 0, -1, -1) }
                };
                conn.send(answer, &[]).await;
            }
            // Keep the connection open until the client is done.
            while conn.recv().await.is_some() {}
        });

        let client = Client::connect_with(&url, options()).await.unwrap();
        match client.producer("t/ns/x").name("p").create().await {
            Err(ClientError::Broker { code: ErrorCode::ProducerBusy, message }) => assert_eq!(message, "taken"),
            other => panic!("expected ProducerBusy, got {other:?}"),
        }
        let producer = client.producer("t/ns/x").name("p").create().await.unwrap();
        let first = producer.send_async(OutgoingMessage::new("a")).await.unwrap();
        let second = producer.send_async(OutgoingMessage::new("b")).await.unwrap();
        match first.await {
            Err(e @ ClientError::Broker { code: ErrorCode::PersistenceError, .. }) => assert!(e.is_retriable()),
            other => panic!("expected PersistenceError, got {other:?}"),
        }
        assert_eq!(second.await.unwrap(), MessageId::new(1, 0, -1, -1));
        assert!(client.is_connected());
        drop(producer);
        client.close();
        broker.await.unwrap();
    })
    .await;
}

fn blob(seq: u64, key: &str) -> Bytes {
    let meta = MessageMetadata {
        producer_name: "p".into(),
        sequence_id: seq,
        publish_time_ms: 1_700_000_000_000 + seq,
        partition_key: Some(key.into()),
        properties: vec![("n".into(), seq.to_string())],
        num_messages: 1,
        ..MessageMetadata::default()
    };
    encode_message(&meta, format!("payload-{seq}").as_bytes())
}

/// Goal: subscribe sends the right fields, the initial Flow grants the
/// receiver queue, permits are replenished by half the queue as the
/// application receives, acks carry the right type, a broker Ping is answered,
/// a corrupt blob is reported without losing the stream.
#[tokio::test]
async fn consume_flow_replenishment_and_acks() {
    within(async {
        const QUEUE: u32 = 4;
        const MESSAGES: u64 = 12;
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            let consumer_id = match conn.recv_cmd().await.command {
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
                    filter_tag: _,
                    key_shared_ranges: _,
                    model: _,
                } => {
                    assert_eq!(topic, "persistent://public/default/orders");
                    assert_eq!(subscription, "s1");
                    assert_eq!(sub_type, SubscriptionType::Failover);
                    assert_eq!(consumer_name, "c1");
                    assert_eq!(initial_position, InitialPosition::Earliest);
                    assert!(durable);
                    assert_eq!(priority_level, 0);
                    conn.send(Command::Success { request_id }, &[]).await;
                    consumer_id
                }
                other => panic!("expected Subscribe, got {other:?}"),
            };
            // Ask the client for a Pong before anything else.
            conn.send(Command::Ping, &[]).await;
            let mut permits = 0u64;
            let mut sent = 0u64;
            let mut acks = Vec::new();
            let mut pong_seen = false;
            while acks.len() < MESSAGES as usize {
                // Use every permit we have, as a broker would.
                while permits > 0 && sent < MESSAGES {
                    // Message 5 carries a corrupt blob.
                    let payload =
                        if sent == 5 { Bytes::from_static(b"\xff\xff\xff\xffgarbage") } else { blob(sent, "k") };
                    conn.send(
                        Command::Message {
                            consumer_id,
                            message_id: MessageId::new(9, sent, -1, -1),
                            redelivery_count: 0,
                            ack_set: vec![],
                        },
                        &payload,
                    )
                    .await;
                    permits -= 1;
                    sent += 1;
                }
                let frame = conn.recv().await.expect("client went away");
                match frame.command {
                    Command::Flow { consumer_id: c, permits: p } => {
                        assert_eq!(c, consumer_id);
                        // First grant is the whole queue, later ones half of it.
                        let expected = if sent == 0 { QUEUE } else { QUEUE / 2 };
                        assert_eq!(p, expected, "flow after {sent} messages");
                        permits += u64::from(p);
                        assert!(permits <= u64::from(QUEUE), "client granted more than its queue");
                    }
                    Command::Ack { consumer_id: c, ack_type, message_ids, request_id, .. } => {
                        assert_eq!(c, consumer_id);
                        assert_eq!(request_id, 0);
                        assert_eq!(message_ids.len(), 1);
                        acks.push((ack_type, message_ids[0].entry));
                    }
                    Command::Pong => pong_seen = true,
                    Command::Ping => {}
                    other => panic!("unexpected {other:?}"),
                }
                if acks.len() == MESSAGES as usize - 1 {
                    break;
                }
            }
            assert!(pong_seen, "the client did not answer Ping");
            // All but the corrupt one were acked individually, the last cumulatively.
            let expected: Vec<(AckType, u64)> = (0..MESSAGES)
                .filter(|&s| s != 5)
                .map(|s| (if s == MESSAGES - 1 { AckType::Cumulative } else { AckType::Individual }, s))
                .collect();
            assert_eq!(acks, expected);
            loop {
                match conn.recv_cmd().await.command {
                    Command::CloseConsumer { request_id, consumer_id: c } => {
                        assert_eq!(c, consumer_id);
                        conn.send(Command::Success { request_id }, &[]).await;
                        break;
                    }
                    Command::Flow { .. } | Command::Pong => {}
                    other => panic!("expected CloseConsumer, got {other:?}"),
                }
            }
        });

        let client = Client::connect_with(&url, options()).await.unwrap();
        let consumer = client
            .subscribe("orders", "s1")
            .sub_type(SubscriptionType::Failover)
            .initial_position(InitialPosition::Earliest)
            .receiver_queue_size(QUEUE)
            .consumer_name("c1")
            // One Ack frame per ack, as this fake broker checks.
            .ack_group(Duration::ZERO, 1)
            .subscribe()
            .await
            .unwrap();
        for seq in 0..MESSAGES {
            let received = consumer.receive().await;
            if seq == 5 {
                assert!(matches!(received, Err(ClientError::Wire(_))), "{received:?}");
                continue;
            }
            let msg = received.unwrap();
            assert_eq!(msg.id, MessageId::new(9, seq, -1, -1));
            assert_eq!(msg.topic(), "persistent://public/default/orders");
            assert_eq!(msg.key(), Some("k"));
            assert_eq!(msg.property("n"), Some(seq.to_string().as_str()));
            assert_eq!(msg.publish_time_ms(), 1_700_000_000_000 + seq);
            assert_eq!(msg.payload, Bytes::from(format!("payload-{seq}")));
            if seq == MESSAGES - 1 {
                consumer.ack_cumulative(&msg.id).await.unwrap();
            } else {
                consumer.ack(&msg.id).await.unwrap();
            }
        }
        assert!(consumer.try_receive().unwrap().is_none());
        consumer.close().await.unwrap();
        assert!(matches!(consumer.ack(&MessageId::new(9, 0, -1, -1)).await, Err(ClientError::ConsumerClosed { .. })));
        broker.await.unwrap();
    })
    .await;
}

/// Goal: when the connection drops, every waiter fails with `Disconnected`:
/// in-flight sends, a pending request, a blocked receive, and later calls.
#[tokio::test]
async fn connection_loss_fails_everything_pending() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let (ready_tx, ready_rx) = tokio::sync::oneshot::channel::<()>();
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            conn.accept_producer("p").await;
            match conn.recv_cmd().await.command {
                Command::Subscribe { request_id, .. } => conn.send(Command::Success { request_id }, &[]).await,
                other => panic!("expected Subscribe, got {other:?}"),
            }
            // Flow, 3 sends, then a second Subscribe left unanswered.
            let mut sends = 0;
            let mut subscribes = 0;
            while sends < 3 || subscribes < 1 {
                match conn.recv_cmd().await.command {
                    Command::Send { .. } => sends += 1,
                    Command::Subscribe { .. } => subscribes += 1,
                    Command::Flow { .. } => {}
                    other => panic!("unexpected {other:?}"),
                }
            }
            ready_rx.await.unwrap();
            drop(conn); // the broker "crashes"
        });

        let client = Client::connect_with(&url, options()).await.unwrap();
        let producer = client.producer("t").name("p").create().await.unwrap();
        let consumer = client.subscribe("t", "s").subscribe().await.unwrap();
        let mut receipts = Vec::new();
        for i in 0..3 {
            receipts.push(producer.send_async(OutgoingMessage::new(format!("{i}"))).await.unwrap());
        }
        let client2 = client.clone();
        let pending_subscribe = tokio::spawn(async move { client2.subscribe("t", "s2").subscribe().await });
        let receiver = tokio::spawn(async move { consumer.receive().await });
        tokio::time::sleep(Duration::from_millis(100)).await;
        ready_tx.send(()).unwrap();
        for receipt in receipts {
            assert!(matches!(receipt.await, Err(ClientError::Disconnected { .. })));
        }
        assert!(matches!(pending_subscribe.await.unwrap(), Err(ClientError::Disconnected { .. })));
        assert!(matches!(receiver.await.unwrap(), Err(ClientError::Disconnected { .. })));
        assert!(matches!(producer.send(OutgoingMessage::new("x")).await, Err(ClientError::Disconnected { .. })));
        assert!(!client.is_connected());
        assert!(client.disconnect_reason().is_some());
        broker.await.unwrap();
    })
    .await;
}

/// Goal: an unanswered request times out with `Timeout`, and the connection
/// stays usable.
#[tokio::test]
async fn request_timeout() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            let _ignored = conn.recv_cmd().await; // Producer, never answered
            conn.accept_producer("p2").await;
            while conn.recv().await.is_some() {}
        });
        let opts = ClientOptions { operation_timeout: Duration::from_millis(200), ..ClientOptions::default() };
        let client = Client::connect_with(&url, opts).await.unwrap();
        match client.producer("t").create().await {
            Err(ClientError::Timeout { operation, after }) => {
                assert_eq!(operation, "create producer");
                assert_eq!(after, Duration::from_millis(200));
            }
            other => panic!("expected Timeout, got {other:?}"),
        }
        assert_eq!(client.producer("t").create().await.unwrap().name(), "p2");
        client.close();
        broker.await.unwrap();
    })
    .await;
}

/// Goal: a message over the broker's frame limit is refused locally with a
/// typed error, without touching the connection; invalid options and names
/// are refused before anything is sent.
#[tokio::test]
async fn local_refusals() {
    within(async {
        let (url, accept) = listen(1024).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            let producer_id = conn.accept_producer("p").await;
            let frame = conn.recv_cmd().await;
            let Command::Send { sequence_id, .. } = frame.command else { panic!("expected Send") };
            assert_eq!(sequence_id, 0, "the refused message must not use a sequence id");
            conn.send(Command::SendReceipt { producer_id, sequence_id, message_id: MessageId::new(1, 1, -1, -1) }, &[])
                .await;
            while conn.recv().await.is_some() {}
        });
        let client = Client::connect_with(&url, options()).await.unwrap();
        assert!(matches!(client.producer("a/b").create().await, Err(ClientError::InvalidTopic { .. })));
        assert!(matches!(client.producer("t").max_pending(0).create().await, Err(ClientError::InvalidOption { .. })));
        assert!(matches!(
            client.subscribe("t", "s").receiver_queue_size(0).subscribe().await,
            Err(ClientError::InvalidOption { .. })
        ));
        let producer = client.producer("t").create().await.unwrap();
        match producer.send(OutgoingMessage::new(vec![0u8; 2000])).await {
            Err(ClientError::MessageTooLarge { size, max_frame_bytes }) => {
                assert!(size > 2000);
                assert_eq!(max_frame_bytes, 1024);
            }
            other => panic!("expected MessageTooLarge, got {other:?}"),
        }
        assert_eq!(producer.send(OutgoingMessage::new("small")).await.unwrap(), MessageId::new(1, 1, -1, -1));
        client.close();
        broker.await.unwrap();
    })
    .await;
}

/// Goal: receipts out of sequence order are a protocol violation that ends
/// the connection instead of completing the wrong send.
#[tokio::test]
async fn out_of_order_receipt_ends_connection() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            let producer_id = conn.accept_producer("p").await;
            let _ = conn.recv_cmd().await;
            let _ = conn.recv_cmd().await;
            conn.send(
                Command::SendReceipt { producer_id, sequence_id: 1, message_id: MessageId::new(1, 1, -1, -1) },
                &[],
            )
            .await;
            while conn.recv().await.is_some() {}
        });
        let client = Client::connect_with(&url, options()).await.unwrap();
        let producer = client.producer("t").create().await.unwrap();
        let a = producer.send_async(OutgoingMessage::new("a")).await.unwrap();
        let b = producer.send_async(OutgoingMessage::new("b")).await.unwrap();
        assert!(matches!(a.await, Err(ClientError::Disconnected { .. })));
        assert!(matches!(b.await, Err(ClientError::Disconnected { .. })));
        assert!(client.disconnect_reason().unwrap().contains("receipt for sequence id 1"));
        broker.await.unwrap();
    })
    .await;
}

/// Goal: connect-time failures are typed: bad URL, refused connection, a
/// broker that refuses the handshake.
#[tokio::test]
async fn connect_failures() {
    within(async {
        assert!(matches!(Client::connect("http://x:1").await, Err(ClientError::InvalidUrl { .. })));
        // Bind then drop to get a port with (very likely) nobody listening.
        let port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        match Client::connect(&format!("127.0.0.1:{port}")).await {
            Err(ClientError::Connect { addr, .. }) => assert_eq!(addr, format!("127.0.0.1:{port}")),
            other => panic!("expected Connect, got {other:?}"),
        }

        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        let broker = tokio::spawn(async move {
            let (stream, _) = listener.accept().await.unwrap();
            let mut conn = FakeConn { stream, decoder: FrameDecoder::new(1 << 20), buf: BytesMut::new() };
            let _connect = conn.recv().await.unwrap();
            conn.send(
                Command::Error { request_id: 0, code: ErrorCode::UnsupportedVersion, message: "too new".into() },
                &[],
            )
            .await;
        });
        match Client::connect(&addr.to_string()).await {
            Err(ClientError::Broker { code: ErrorCode::UnsupportedVersion, .. }) => {}
            other => panic!("expected UnsupportedVersion, got {other:?}"),
        }
        broker.await.unwrap();
    })
    .await;
}

/// Goal: the keepalive declares a silent broker dead, and dropping every
/// handle closes the socket. Method: a broker that reads but never answers
/// Pings; then a second connection whose handles are dropped.
#[tokio::test]
async fn keepalive_and_drop() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            let mut pings = 0;
            while let Some(frame) = conn.recv().await {
                assert_eq!(frame.command, Command::Ping);
                pings += 1;
            }
            assert!(pings >= 1, "the client never pinged");
        });
        let opts = ClientOptions { keepalive_interval: Some(Duration::from_millis(100)), ..options() };
        let client = Client::connect_with(&url, opts).await.unwrap();
        let started = std::time::Instant::now();
        while client.is_connected() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert!(started.elapsed() >= Duration::from_millis(200));
        assert!(client.disconnect_reason().unwrap().contains("keepalive"));
        broker.await.unwrap();

        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            conn.accept_producer("p").await;
            // Producer drop: best-effort CloseProducer without a request id; then EOF.
            match conn.recv_cmd().await.command {
                Command::CloseProducer { request_id: 0, .. } => {}
                other => panic!("expected CloseProducer, got {other:?}"),
            }
            assert!(conn.recv().await.is_none(), "expected EOF after the last handle was dropped");
        });
        let client = Client::connect_with(&url, options()).await.unwrap();
        let producer = client.producer("t").create().await.unwrap();
        drop(client);
        drop(producer);
        broker.await.unwrap();
    })
    .await;
}

/// Goal: with `block_if_queue_full(false)`, a send beyond `max_pending`
/// fails at once with `ProducerQueueFull` instead of waiting, and sends work
/// again once receipts free slots. Method: the broker holds two receipts back.
#[tokio::test]
async fn full_queue_fails_fast_when_asked() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            let producer_id = conn.accept_producer("p").await;
            let mut seqs = Vec::new();
            for _ in 0..2 {
                let frame = conn.recv_cmd().await;
                let Command::Send { sequence_id, .. } = frame.command else { panic!("expected Send") };
                seqs.push(sequence_id);
            }
            // Hold the receipts until the client saw the queue full.
            tokio::time::sleep(Duration::from_millis(200)).await;
            for seq in seqs {
                let message_id = MessageId::new(1, seq, -1, -1);
                conn.send(Command::SendReceipt { producer_id, sequence_id: seq, message_id }, &[]).await;
            }
            let frame = conn.recv_cmd().await;
            let Command::Send { sequence_id, .. } = frame.command else { panic!("expected Send") };
            let message_id = MessageId::new(1, sequence_id, -1, -1);
            conn.send(Command::SendReceipt { producer_id, sequence_id, message_id }, &[]).await;
            conn
        });
        let client = Client::connect_with(&url, options()).await.unwrap();
        let producer = client.producer("t").max_pending(2).block_if_queue_full(false).create().await.unwrap();
        let a = producer.send_async(OutgoingMessage::new("a")).await.unwrap();
        let b = producer.send_async(OutgoingMessage::new("b")).await.unwrap();
        let started = std::time::Instant::now();
        let full = producer.send_async(OutgoingMessage::new("c")).await;
        assert!(started.elapsed() < Duration::from_millis(150), "a full queue must not wait");
        match full {
            Err(e @ ClientError::ProducerQueueFull { max_pending: 2, .. }) => assert!(e.is_retriable()),
            other => panic!("expected ProducerQueueFull, got {:?}", other.map(|f| f.sequence_id())),
        }
        assert_eq!(a.await.unwrap().entry, 0);
        assert_eq!(b.await.unwrap().entry, 1);
        // Slots are free again; the failed send used no sequence id.
        let c = producer.send(OutgoingMessage::new("c")).await.unwrap();
        assert_eq!(c.entry, 2);
        drop(broker.await.unwrap());
    })
    .await;
}

/// Goal: an unbatched send without a receipt fails with `Timeout` after the
/// operation timeout (the connection's send timer, which replaced a timer
/// per send), and keeps its `max_pending` slot until the broker answers
/// late; a send whose future was dropped frees its slot at its receipt.
/// Method: `max_pending(1)`, a 300 ms operation timeout; the broker holds
/// the first receipt until the client saw the timeout and the slot still
/// taken, then answers everything at once.
#[tokio::test]
async fn an_unanswered_send_times_out_and_keeps_its_slot_until_answered() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let (answer_tx, answer_rx) = tokio::sync::oneshot::channel::<()>();
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            let producer_id = conn.accept_producer("p").await;
            let mut held = Some(answer_rx);
            for _ in 0..3 {
                let frame = conn.recv_cmd().await;
                let Command::Send { sequence_id, .. } = frame.command else { panic!("expected Send") };
                if let Some(answer) = held.take() {
                    answer.await.unwrap();
                }
                let message_id = MessageId::new(1, sequence_id, -1, -1);
                conn.send(Command::SendReceipt { producer_id, sequence_id, message_id }, &[]).await;
            }
            while conn.recv().await.is_some() {}
        });
        let after = Duration::from_millis(300);
        let opts = ClientOptions { operation_timeout: after, ..ClientOptions::default() };
        let client = Client::connect_with(&url, opts).await.unwrap();
        let producer = client.producer("t").max_pending(1).block_if_queue_full(false).create().await.unwrap();
        let started = std::time::Instant::now();
        let first = producer.send_async(OutgoingMessage::new("a")).await.unwrap();
        match first.await {
            Err(ClientError::Timeout { operation: "send receipt", after: a }) => assert_eq!(a, after),
            other => panic!("expected the receipt's Timeout, got {other:?}"),
        }
        let took = started.elapsed();
        assert!(took >= after && took < after + Duration::from_millis(700), "timed out after {took:?}");
        // Unanswered still: its slot is taken.
        assert_eq!(producer.pending(), 1);
        match producer.send_async(OutgoingMessage::new("b")).await {
            Err(ClientError::ProducerQueueFull { max_pending: 1, .. }) => {}
            other => panic!("expected ProducerQueueFull, got {:?}", other.map(|f| f.sequence_id())),
        }
        let freed = || async {
            while producer.pending() != 0 {
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        };
        answer_tx.send(()).unwrap();
        freed().await;
        drop(producer.send_async(OutgoingMessage::new("b")).await.unwrap());
        freed().await;
        assert_eq!(producer.send(OutgoingMessage::new("c")).await.unwrap(), MessageId::new(1, 2, -1, -1));
        client.close();
        broker.await.unwrap();
    })
    .await;
}

/// Goal: the messages of one batch share the batch's receipt: each gets the
/// entry's id with its own batch index, in send order, and the entry on the
/// wire carries every message once with sequence ids `batch id + index`; a
/// "batch" of one goes out as a plain message and keeps the plain id; an
/// entry the broker refuses fails each of its messages with the broker's
/// error.
/// Method: a batching producer (5 messages per batch) sends 5, then 5 that
/// the broker refuses, then 1 flushed alone; the broker decodes each Send.
#[tokio::test]
async fn batched_receipts_share_the_entry_id() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            let producer_id = conn.accept_producer("b").await;
            for (batch, expected_seq) in [(0u64, 0u64), (1, 5)] {
                let frame = conn.recv_cmd().await;
                let Command::Send { sequence_id, num_messages, .. } = frame.command else {
                    panic!("expected Send, got {:?}", frame.command)
                };
                assert_eq!((sequence_id, num_messages), (expected_seq, 5));
                let (meta, payload) = decode_message(&frame.payload).unwrap();
                assert_eq!((meta.producer_name.as_str(), meta.sequence_id, meta.num_messages), ("b", sequence_id, 5));
                assert_eq!(meta.uncompressed_size as usize, payload.len());
                let records = magnetar_wire::decode_batch(&payload, 5).unwrap();
                for (i, r) in records.iter().enumerate() {
                    assert_eq!(r.sequence_id, sequence_id + i as u64);
                    assert_eq!(r.payload, Bytes::from(format!("m{}", sequence_id + i as u64)));
                    assert_eq!(r.partition_key.as_deref(), Some("k"));
                }
                let answer = if batch == 0 {
                    Command::SendReceipt { producer_id, sequence_id, message_id: MessageId::new(7, 1, -1, -1) }
                } else {
                    Command::SendError {
                        producer_id,
                        sequence_id,
                        code: ErrorCode::PersistenceError,
                        message: "disk".into(),
                    }
                };
                conn.send(answer, &[]).await;
            }
            let frame = conn.recv_cmd().await;
            let Command::Send { sequence_id, num_messages, .. } = frame.command else {
                panic!("expected Send, got {:?}", frame.command)
            };
            assert_eq!((sequence_id, num_messages), (10, 1));
            let (meta, payload) = decode_message(&frame.payload).unwrap();
            assert_eq!((meta.num_messages, payload), (1, Bytes::from("alone")));
            conn.send(Command::SendReceipt { producer_id, sequence_id, message_id: MessageId::new(7, 3, -1, -1) }, &[])
                .await;
            while conn.recv().await.is_some() {}
        });
        let client = Client::connect_with(&url, options()).await.unwrap();
        let batching = magnetar_client::BatchingOptions {
            max_messages: 5,
            max_delay: Duration::from_secs(60),
            ..Default::default()
        };
        let producer = client.producer("t").batching(batching).create().await.unwrap();
        let mut receipts = Vec::new();
        for i in 0..10 {
            receipts.push(producer.send_async(OutgoingMessage::new(format!("m{i}")).with_key("k")).await.unwrap());
        }
        let alone = producer.send_async(OutgoingMessage::new("alone")).await.unwrap();
        producer.flush().await.unwrap();
        for (i, r) in receipts.into_iter().enumerate() {
            match (i, r.await) {
                (0..=4, Ok(id)) => assert_eq!(id, MessageId::new(7, 1, -1, i as i32)),
                (_, Err(ClientError::Broker { code: ErrorCode::PersistenceError, message })) => {
                    assert!(i >= 5 && message == "disk", "message {i}: {message}");
                }
                (i, other) => panic!("message {i}: {other:?}"),
            }
        }
        assert_eq!(alone.await.unwrap(), MessageId::new(7, 3, -1, -1));
        client.close();
        broker.await.unwrap();
    })
    .await;
}

/// Goal: batched receipts still end without an answer: a batch whose entry
/// gets no receipt times out (each message), and the messages of a batch
/// that never went out fail when the producer is dropped.
/// Method: a broker that takes the Send and never answers, a 300 ms
/// operation timeout; then a second batch left open (long delay) and the
/// producer dropped.
#[tokio::test]
async fn batched_receipts_time_out_or_fail_when_abandoned() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            conn.accept_producer("b").await;
            let frame = conn.recv_cmd().await;
            assert!(matches!(frame.command, Command::Send { num_messages: 3, .. }), "{:?}", frame.command);
            while conn.recv().await.is_some() {}
        });
        let opts = ClientOptions { operation_timeout: Duration::from_millis(300), ..ClientOptions::default() };
        let client = Client::connect_with(&url, opts).await.unwrap();
        let batching = magnetar_client::BatchingOptions {
            max_messages: 3,
            max_delay: Duration::from_secs(60),
            ..Default::default()
        };
        let producer = client.producer("t").batching(batching).create().await.unwrap();
        let mut unanswered = Vec::new();
        for i in 0..3 {
            unanswered.push(producer.send_async(OutgoingMessage::new(format!("m{i}"))).await.unwrap());
        }
        let open = producer.send_async(OutgoingMessage::new("never sent")).await.unwrap();
        for r in unanswered {
            match r.await {
                Err(ClientError::Timeout { operation: "send receipt", .. }) => {}
                other => panic!("expected Timeout, got {other:?}"),
            }
        }
        drop(producer);
        match open.await {
            Err(ClientError::Disconnected { reason }) => assert!(reason.contains("abandoned"), "{reason}"),
            other => panic!("expected Disconnected, got {other:?}"),
        }
        client.close();
        broker.await.unwrap();
    })
    .await;
}

/// Goal: batches leave in the order they filled even when several tasks
/// fill them and one of them gives up: a message is in its batch once
/// `send_async` has taken it, a full batch waits for a free `max_pending`
/// slot without holding up other tasks' adds, and a batch closed by a task
/// whose `send_async` future was dropped still goes out, after the batch
/// before it.
/// Method: 2 messages per batch, 1 send in flight. Task A fills batches 1
/// and 2 (batch 2 waits for batch 1's receipt); the test body fills batch 3
/// and drops its second `send_async` after 100 ms (still waiting behind
/// batch 2); the broker answers only then, and checks each entry's records.
#[tokio::test]
async fn batches_leave_in_fill_order_across_tasks_and_dropped_sends() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let (gave_up_tx, gave_up_rx) = tokio::sync::oneshot::channel::<()>();
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            let producer_id = conn.accept_producer("o").await;
            let mut gave_up = Some(gave_up_rx);
            for (entry, expected) in [["a0", "a1"], ["a2", "a3"], ["b0", "b1"]].iter().enumerate() {
                let frame = conn.recv_cmd().await;
                let Command::Send { sequence_id, num_messages, .. } = frame.command else {
                    panic!("expected Send, got {:?}", frame.command)
                };
                assert_eq!((sequence_id, num_messages), (2 * entry as u64, 2), "entry {entry}");
                let (_, payload) = decode_message(&frame.payload).unwrap();
                let records = magnetar_wire::decode_batch(&payload, 2).unwrap();
                let got: Vec<&[u8]> = records.iter().map(|r| r.payload.as_ref()).collect();
                assert_eq!(got, expected.iter().map(|e| e.as_bytes()).collect::<Vec<_>>(), "entry {entry}");
                if let Some(rx) = gave_up.take() {
                    // Batch 1 stays unanswered until the test body gave up
                    // on b1's send_async.
                    rx.await.unwrap();
                }
                let message_id = MessageId::new(9, entry as u64, -1, -1);
                conn.send(Command::SendReceipt { producer_id, sequence_id, message_id }, &[]).await;
            }
            let frame = conn.recv_cmd().await;
            assert!(matches!(frame.command, Command::Send { sequence_id: 6, num_messages: 1, .. }), "{frame:?}");
            conn.send(
                Command::SendReceipt { producer_id, sequence_id: 6, message_id: MessageId::new(9, 3, -1, -1) },
                &[],
            )
            .await;
            while conn.recv().await.is_some() {}
        });
        let (client, producer) = pairs_producer(&url).await;
        let a = {
            let producer = producer.clone();
            tokio::spawn(async move {
                let mut receipts = Vec::new();
                for m in ["a0", "a1", "a2", "a3"] {
                    receipts.push(producer.send_async(OutgoingMessage::new(m)).await.unwrap());
                }
                receipts
            })
        };
        // A is now waiting with batch 2 for batch 1's receipt.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert!(!a.is_finished(), "batch 2 went out before batch 1 had its receipt");
        let b0 = producer.send_async(OutgoingMessage::new("b0")).await.unwrap();
        let b1 =
            tokio::time::timeout(Duration::from_millis(100), producer.send_async(OutgoingMessage::new("b1"))).await;
        assert!(b1.is_err(), "b1's send_async returned while batch 2 waited");
        gave_up_tx.send(()).unwrap();
        let receipts = a.await.unwrap();
        for (i, r) in receipts.into_iter().enumerate() {
            assert_eq!(r.await.unwrap(), MessageId::new(9, i as u64 / 2, -1, i as i32 % 2));
        }
        assert_eq!(b0.await.unwrap(), MessageId::new(9, 2, -1, 0));
        let c0 = producer.send_async(OutgoingMessage::new("c0")).await.unwrap();
        producer.flush().await.unwrap();
        assert_eq!(c0.await.unwrap(), MessageId::new(9, 3, -1, -1));
        client.close();
        broker.await.unwrap();
    })
    .await;
}

/// A client and a producer on topic "t" that batches two messages at a time
/// (never by delay) with one send in flight: the batching-order tests.
async fn pairs_producer(url: &str) -> (Client, std::sync::Arc<magnetar_client::Producer>) {
    let client = Client::connect_with(url, options()).await.unwrap();
    let batching =
        magnetar_client::BatchingOptions { max_messages: 2, max_delay: Duration::from_secs(60), ..Default::default() };
    let producer = client.producer("t").max_pending(1).batching(batching).create().await.unwrap();
    (client, std::sync::Arc::new(producer))
}

/// Goal: a `send_async` dropped while it sends closed batches (here by a
/// timeout) fails none of the batches other tasks closed: whoever holds the
/// sending turn sends theirs too, and a dropped caller must not take one of
/// them down with it (review finding, fifth session).
/// Method: 2 messages per batch, 1 send in flight. Batch X goes out and
/// stays unanswered; task A closes batch P and waits for the slot under a
/// 300 ms timeout; task B closes batch Q and waits for its turn. The broker
/// answers X (P goes out, and A's turn goes on to Q), answers P only after
/// A's timeout fired, then Q: B's messages must get Q's id.
#[tokio::test]
async fn a_dropped_send_fails_no_batch_another_task_closed() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let (answer_x_tx, answer_x_rx) = tokio::sync::oneshot::channel::<()>();
        let (answer_p_tx, answer_p_rx) = tokio::sync::oneshot::channel::<()>();
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            let producer_id = conn.accept_producer("d").await;
            let mut waits = [Some(answer_x_rx), Some(answer_p_rx), None].into_iter();
            for (entry, expected) in [["x0", "x1"], ["a0", "a1"], ["b0", "b1"]].iter().enumerate() {
                let frame = conn.recv_cmd().await;
                let Command::Send { sequence_id, .. } = frame.command else {
                    panic!("expected Send, got {:?}", frame.command)
                };
                let (_, payload) = decode_message(&frame.payload).unwrap();
                let records = magnetar_wire::decode_batch(&payload, 2).unwrap();
                let got: Vec<&[u8]> = records.iter().map(|r| r.payload.as_ref()).collect();
                assert_eq!(got, expected.iter().map(|e| e.as_bytes()).collect::<Vec<_>>(), "entry {entry}");
                if let Some(rx) = waits.next().flatten() {
                    rx.await.unwrap();
                }
                let message_id = MessageId::new(9, entry as u64, -1, -1);
                conn.send(Command::SendReceipt { producer_id, sequence_id, message_id }, &[]).await;
            }
            while conn.recv().await.is_some() {}
        });
        let (client, producer) = pairs_producer(&url).await;
        let x0 = producer.send_async(OutgoingMessage::new("x0")).await.unwrap();
        let x1 = producer.send_async(OutgoingMessage::new("x1")).await.unwrap();
        let a = {
            let producer = producer.clone();
            tokio::spawn(async move {
                tokio::time::timeout(Duration::from_millis(300), async {
                    let a0 = producer.send_async(OutgoingMessage::new("a0")).await.unwrap();
                    let a1 = producer.send_async(OutgoingMessage::new("a1")).await.unwrap();
                    (a0.await, a1.await)
                })
                .await
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        let b = {
            let producer = producer.clone();
            tokio::spawn(async move {
                let b0 = producer.send_async(OutgoingMessage::new("b0")).await.unwrap();
                let b1 = producer.send_async(OutgoingMessage::new("b1")).await.unwrap();
                (b0, b1)
            })
        };
        tokio::time::sleep(Duration::from_millis(50)).await;
        answer_x_tx.send(()).unwrap();
        assert!(a.await.unwrap().is_err(), "A's second send waited for P's receipt past its timeout");
        answer_p_tx.send(()).unwrap();
        assert_eq!(x0.await.unwrap(), MessageId::new(9, 0, -1, 0));
        assert_eq!(x1.await.unwrap(), MessageId::new(9, 0, -1, 1));
        let (b0, b1) = b.await.unwrap();
        assert_eq!(b0.await.unwrap(), MessageId::new(9, 2, -1, 0));
        assert_eq!(b1.await.unwrap(), MessageId::new(9, 2, -1, 1));
        client.close();
        broker.await.unwrap();
    })
    .await;
}

/// Goal: a loop of batched sends that never has to wait still lets the
/// other tasks of its thread run (the connection's reader, a consumer):
/// adding a message spends the task's cooperative budget.
/// Method: on the test's current-thread runtime, a task that counts its
/// wake-ups (it yields each time), then 5,000 `send_async` calls into one
/// open batch (no limit reached, so nothing waits); the counter must have
/// moved during the loop.
#[tokio::test]
async fn a_loop_of_batched_sends_yields_to_other_tasks() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            conn.accept_producer("y").await;
            while conn.recv().await.is_some() {}
        });
        let client = Client::connect_with(&url, options()).await.unwrap();
        let batching = magnetar_client::BatchingOptions {
            max_messages: 100_000,
            max_bytes: 64 << 20,
            max_delay: Duration::from_secs(60),
            ..Default::default()
        };
        let producer = client.producer("t").batching(batching).create().await.unwrap();
        let ticks = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let ticker = {
            let ticks = ticks.clone();
            tokio::spawn(async move {
                loop {
                    ticks.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tokio::task::yield_now().await;
                }
            })
        };
        tokio::task::yield_now().await;
        let before = ticks.load(std::sync::atomic::Ordering::Relaxed);
        let mut receipts = Vec::new();
        for i in 0..5_000 {
            receipts.push(producer.send_async(OutgoingMessage::new(format!("m{i}"))).await.unwrap());
        }
        let during = ticks.load(std::sync::atomic::Ordering::Relaxed) - before;
        assert!(during >= 10, "the other task ran {during} times during 5,000 sends");
        ticker.abort();
        drop(receipts);
        drop(producer);
        client.close();
        broker.await.unwrap();
    })
    .await;
}

/// Accepts one connection on `listener` and answers its `Connect` as shard
/// `shard` of a broker whose shards listen on `shard_ports`.
async fn accept_as_shard(listener: &TcpListener, shard: u32, shard_ports: &[u16]) -> FakeConn {
    let (stream, _) = listener.accept().await.unwrap();
    let mut conn = FakeConn { stream, decoder: FrameDecoder::new(16 << 20), buf: BytesMut::new() };
    match conn.recv().await.unwrap().command {
        Command::Connect { .. } => {}
        other => panic!("expected Connect, got {other:?}"),
    }
    let connected = Command::Connected {
        server_version: "fake".into(),
        protocol_version: magnetar_wire::PROTOCOL_VERSION,
        max_frame_bytes: 1 << 20,
        shard,
        shard_ports: shard_ports.to_vec(),
    };
    conn.send(connected, &[]).await;
    conn
}

/// Answers the next request, which must be a `topics.owner` lookup of
/// `topic`, with `shard` and `shard_port`.
async fn answer_owner(conn: &mut FakeConn, topic: &str, shard: u32, shard_port: u16) {
    match conn.recv_cmd().await.command {
        Command::AdminRequest { request_id, op, json } => {
            assert_eq!(op, "topics.owner");
            let args: serde_json::Value = serde_json::from_str(&json).unwrap();
            assert_eq!(args["topic"], topic);
            let json = serde_json::json!({ "topic": topic, "bundle": 3, "shard": shard, "shard_port": shard_port });
            conn.send(Command::AdminResponse { request_id, json: json.to_string() }, &[]).await;
        }
        other => panic!("expected the topics.owner lookup, got {other:?}"),
    }
}

/// Goal: a producer goes to the port of the shard the lookup names; told
/// `NotOwner` there, the client looks the topic up again and follows the
/// new answer (here: the shard its first connection is on).
/// Method: a fake broker with a shared listener (shard 0) and shard 1's own
/// listener; the lookup names shard 1, shard 1 refuses with `NotOwner`, the
/// second lookup names shard 0, and the producer must then be created (and
/// send) on the first connection.
#[tokio::test]
async fn producer_follows_the_owner_and_looks_up_again_when_not_owner() {
    within(async {
        let shared = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let shard1 = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ports = [shared.local_addr().unwrap().port(), shard1.local_addr().unwrap().port()];
        let url = format!("magnetar://{}", shared.local_addr().unwrap());
        let topic = "persistent://public/default/orders";
        let broker = tokio::spawn(async move {
            let mut first = accept_as_shard(&shared, 0, &ports).await;
            answer_owner(&mut first, topic, 1, ports[1]).await;
            let mut second = accept_as_shard(&shard1, 1, &ports).await;
            match second.recv_cmd().await.command {
                Command::Producer { request_id, topic: t, .. } => {
                    assert_eq!(t, topic);
                    let refusal =
                        Command::Error { request_id, code: ErrorCode::NotOwner, message: "owned by shard 0".into() };
                    second.send(refusal, &[]).await;
                }
                other => panic!("expected Producer on shard 1's port, got {other:?}"),
            }
            answer_owner(&mut first, topic, 0, ports[0]).await;
            let producer_id = first.accept_producer("p").await;
            let frame = first.recv_cmd().await;
            let Command::Send { producer_id: p, sequence_id, .. } = frame.command else {
                panic!("expected Send on the first connection, got {:?}", frame.command)
            };
            assert_eq!(p, producer_id);
            let receipt = Command::SendReceipt { producer_id, sequence_id, message_id: MessageId::new(1, 0, -1, -1) };
            first.send(receipt, &[]).await;
            (first, second)
        });
        let client = Client::connect_with(&url, options()).await.unwrap();
        assert_eq!(client.server_info().shard_ports, vec![ports[0], ports[1]]);
        let producer = client.producer("orders").create().await.unwrap();
        assert_eq!(producer.send(OutgoingMessage::new("m")).await.unwrap(), MessageId::new(1, 0, -1, -1));
        let _conns = broker.await.unwrap();
    })
    .await;
}

/// Goal: a shard port that does not answer costs nothing but the attempt:
/// the producer falls back to the shared port, which serves every topic.
/// Method: the lookup names shard 1 on a port nobody listens on (bound,
/// then closed); the producer must be created on the first connection.
#[tokio::test]
async fn producer_falls_back_to_the_shared_port_when_the_shard_port_is_closed() {
    within(async {
        let shared = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let dead_port = TcpListener::bind("127.0.0.1:0").await.unwrap().local_addr().unwrap().port();
        let ports = [shared.local_addr().unwrap().port(), dead_port];
        let url = format!("magnetar://{}", shared.local_addr().unwrap());
        let topic = "persistent://public/default/orders";
        let broker = tokio::spawn(async move {
            let mut first = accept_as_shard(&shared, 0, &ports).await;
            answer_owner(&mut first, topic, 1, ports[1]).await;
            first.accept_producer("p").await;
            first
        });
        let client = Client::connect_with(&url, options()).await.unwrap();
        let producer = client.producer("orders").create().await.unwrap();
        assert_eq!(producer.name(), "p");
        let _conn = broker.await.unwrap();
    })
    .await;
}

/// Goal: with `shard_aware` off the client never looks up owners, whatever
/// the broker announces. Method: the fake broker announces two shard ports
/// and expects the `Producer` request first.
#[tokio::test]
async fn shard_aware_off_uses_the_given_address_only() {
    within(async {
        let shared = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let ports = [shared.local_addr().unwrap().port(), 1];
        let url = format!("magnetar://{}", shared.local_addr().unwrap());
        let broker = tokio::spawn(async move {
            let mut first = accept_as_shard(&shared, 0, &ports).await;
            first.accept_producer("p").await;
            first
        });
        let client = Client::connect_with(&url, ClientOptions { shard_aware: false, ..options() }).await.unwrap();
        client.producer("orders").create().await.unwrap();
        let _conn = broker.await.unwrap();
    })
    .await;
}

/// Answers the client's `topics.partitioned-metadata` request: `partitions`.
async fn answer_partitions(conn: &mut FakeConn, partitions: u32) {
    match conn.recv_cmd().await.command {
        Command::AdminRequest { request_id, op, .. } => {
            assert_eq!(op, "topics.partitioned-metadata");
            let json = format!(r#"{{"partitions":{partitions}}}"#);
            conn.send(Command::AdminResponse { request_id, json }, &[]).await;
        }
        other => panic!("expected AdminRequest, got {other:?}"),
    }
}

/// Goal: a multi-topic consumer (a partitioned topic by its own name) hands
/// out each partition's messages in order through its one queue, gives a
/// partition's permits back only as the application receives that
/// partition's messages, routes each ack to the partition's consumer, and
/// reports the end of the connection instead of waiting for ever.
/// Method: a fake broker with a 2-partition topic sends each partition's
/// permits' worth of messages, interleaved, and checks Flows and Acks.
#[tokio::test]
async fn multi_topic_consumer_orders_permits_acks_and_end() {
    within(async {
        const QUEUE: u32 = 4;
        const PER_PARTITION: u64 = 8;
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            answer_partitions(&mut conn, 2).await;
            // consumer id of partition p at [p].
            let mut ids = [0u64; 2];
            let mut permits = [0u32; 2];
            let mut subscribed = 0;
            while subscribed < 2 || permits.contains(&0) {
                match conn.recv_cmd().await.command {
                    Command::Subscribe { request_id, consumer_id, topic, .. } => {
                        assert_eq!(topic, format!("persistent://public/default/orders-partition-{subscribed}"));
                        ids[subscribed] = consumer_id;
                        subscribed += 1;
                        conn.send(Command::Success { request_id }, &[]).await;
                    }
                    Command::Flow { consumer_id, permits: n } => {
                        assert_eq!(n, QUEUE, "the first grant is the whole queue");
                        permits[ids.iter().position(|&i| i == consumer_id).unwrap()] += n;
                    }
                    other => panic!("expected Subscribe or Flow, got {other:?}"),
                }
            }
            let partition_of = |c: u64| ids.iter().position(|&i| i == c).expect("unknown consumer id");
            let mut sent = [0u64; 2];
            let mut acked = [Vec::new(), Vec::new()];
            while acked.iter().map(Vec::len).sum::<usize>() < 2 * PER_PARTITION as usize {
                // Interleave the partitions, as far as their permits go.
                while (0..2).any(|p| permits[p] > 0 && sent[p] < PER_PARTITION) {
                    for p in 0..2 {
                        if permits[p] > 0 && sent[p] < PER_PARTITION {
                            let id = MessageId::new(10 + p as u64, sent[p], p as i32, -1);
                            let command = Command::Message {
                                consumer_id: ids[p],
                                message_id: id,
                                redelivery_count: 0,
                                ack_set: vec![],
                            };
                            conn.send(command, &blob(sent[p], "k")).await;
                            permits[p] -= 1;
                            sent[p] += 1;
                        }
                    }
                }
                match conn.recv_cmd().await.command {
                    Command::Flow { consumer_id, permits: n } => {
                        let p = partition_of(consumer_id);
                        // Outstanding = sent and not yet acknowledged (the
                        // application acks each message as it receives it,
                        // so at most one more than not yet received): a
                        // Flow never lets it pass the queue.
                        let outstanding = sent[p] - acked[p].len() as u64;
                        assert!(
                            u64::from(permits[p] + n) + outstanding <= u64::from(QUEUE) + 1,
                            "partition {p}: {n} permits with {} unused and {outstanding} outstanding",
                            permits[p]
                        );
                        permits[p] += n;
                    }
                    Command::Ack { consumer_id, message_ids, .. } => {
                        let p = partition_of(consumer_id);
                        for id in message_ids {
                            assert_eq!(
                                (id.ledger, id.partition),
                                (10 + p as u64, p as i32),
                                "ack sent to the wrong consumer"
                            );
                            acked[p].push(id.entry);
                        }
                    }
                    other => panic!("unexpected {other:?}"),
                }
            }
            for a in &acked {
                assert_eq!(*a, (0..PER_PARTITION).collect::<Vec<_>>());
            }
            drop(conn); // the broker goes away
        });

        let client = Client::connect_with(&url, options()).await.unwrap();
        let consumer = client
            .subscribe("orders", "s")
            .receiver_queue_size(QUEUE)
            .ack_group(Duration::ZERO, 1)
            .subscribe_partitioned()
            .await
            .unwrap();
        let mut next = [0u64; 2];
        for _ in 0..2 * PER_PARTITION {
            let msg = consumer.receive().await.unwrap();
            let p = usize::try_from(msg.id.partition).unwrap();
            assert_eq!(msg.topic(), format!("persistent://public/default/orders-partition-{p}"));
            assert_eq!(msg.id.entry, next[p], "partition {p} out of order");
            assert_eq!(msg.sequence_id(), next[p]);
            next[p] += 1;
            consumer.ack(&msg).await.unwrap();
        }
        broker.await.unwrap();
        // Both partitions' slots are gone: receive reports it, every time.
        for _ in 0..3 {
            let end = consumer.receive().await;
            assert!(matches!(end, Err(ClientError::Disconnected { .. })), "{end:?}");
        }
    })
    .await;
}

/// Goal: a multi-topic consumer whose member is refused once with
/// `NotOwner` and then subscribes (the client's retry) delivers that
/// member's messages; the failed attempt must not end the member (its
/// queue index is shared with the retry), which once made `receive` return
/// `ConsumerClosed` while the member was alive.
/// Method: a fake broker answers the first Subscribe with `NotOwner`, the
/// second with Success, then sends one message.
#[tokio::test]
async fn multi_topic_member_retried_after_not_owner_is_not_ended() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            answer_partitions(&mut conn, 0).await;
            match conn.recv_cmd().await.command {
                Command::Subscribe { request_id, .. } => {
                    let refusal =
                        Command::Error { request_id, code: ErrorCode::NotOwner, message: "owned by shard 1".into() };
                    conn.send(refusal, &[]).await;
                }
                other => panic!("expected Subscribe, got {other:?}"),
            }
            let consumer_id = loop {
                match conn.recv_cmd().await.command {
                    Command::Subscribe { request_id, consumer_id, .. } => {
                        conn.send(Command::Success { request_id }, &[]).await;
                        break consumer_id;
                    }
                    Command::CloseConsumer { .. } => {}
                    other => panic!("expected the retried Subscribe, got {other:?}"),
                }
            };
            loop {
                if let Command::Flow { consumer_id: c, .. } = conn.recv_cmd().await.command {
                    assert_eq!(c, consumer_id);
                    break;
                }
            }
            let command = Command::Message {
                consumer_id,
                message_id: MessageId::new(7, 0, -1, -1),
                redelivery_count: 0,
                ack_set: vec![],
            };
            conn.send(command, &blob(0, "k")).await;
            conn
        });
        let client = Client::connect_with(&url, options()).await.unwrap();
        let consumer = client.subscribe("orders", "s").subscribe_partitioned().await.unwrap();
        let msg = consumer.receive().await.expect("the retried member's message, not an end");
        assert_eq!(msg.id, MessageId::new(7, 0, -1, -1));
        let _conn = broker.await.unwrap();
    })
    .await;
}

/// Goal: the consumer reads a `MessageRun` (protocol version 2) as its
/// entries in order, with consecutive ids and the run's redelivery count; an
/// entry whose blob is not a message is reported in its place and the
/// entries after it still come; a `Message` after the run comes after them.
/// Method: a fake broker sends a run of four entries (the third a garbage
/// blob), then one `Message`.
#[tokio::test]
async fn message_runs_are_read_entry_by_entry() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            let consumer_id = match conn.recv_cmd().await.command {
                Command::Subscribe { request_id, consumer_id, .. } => {
                    conn.send(Command::Success { request_id }, &[]).await;
                    consumer_id
                }
                other => panic!("expected Subscribe, got {other:?}"),
            };
            loop {
                if let Command::Flow { .. } = conn.recv_cmd().await.command {
                    break;
                }
            }
            let blobs = [blob(0, "k"), blob(1, "k"), Bytes::from_static(b"not a message"), blob(3, "k")];
            let lengths = blobs.iter().map(|b| u32::try_from(b.len()).unwrap()).collect();
            let run = Command::MessageRun {
                consumer_id,
                message_id: MessageId::new(9, 0, -1, -1),
                redelivery_count: 2,
                lengths,
            };
            conn.send(run, &blobs.concat()).await;
            let single = Command::Message {
                consumer_id,
                message_id: MessageId::new(9, 4, -1, -1),
                redelivery_count: 0,
                ack_set: vec![],
            };
            conn.send(single, &blob(4, "k")).await;
            conn
        });
        let client = Client::connect_with(&url, options()).await.unwrap();
        let consumer = client.subscribe("orders", "s").subscribe().await.unwrap();
        for seq in [0u64, 1] {
            let m = consumer.receive().await.expect("an entry of the run");
            assert_eq!(m.id, MessageId::new(9, seq, -1, -1));
            assert_eq!(m.redelivery_count, 2);
            assert_eq!(m.payload.as_ref(), format!("payload-{seq}").as_bytes());
        }
        assert!(consumer.receive().await.is_err(), "the garbage entry is reported in its place");
        let m = consumer.receive().await.expect("the entry after the bad one");
        assert_eq!((m.id, m.redelivery_count), (MessageId::new(9, 3, -1, -1), 2));
        let m = consumer.receive().await.expect("the Message after the run");
        assert_eq!((m.id, m.redelivery_count), (MessageId::new(9, 4, -1, -1), 0));
        assert_eq!(m.payload.as_ref(), b"payload-4");
        let _conn = broker.await.unwrap();
    })
    .await;
}

/// The broker's side of the batch-timing tests: accepts producer `name`,
/// then answers two batch entries of two messages each, as entries 0 and 1
/// of ledger `ledger`.
async fn answer_pairs(accept: impl Future<Output = FakeConn>, name: &str, ledger: u64) {
    let mut conn = accept.await;
    let producer_id = conn.accept_producer(name).await;
    for entry in 0..2u64 {
        let frame = conn.recv_cmd().await;
        let Command::Send { sequence_id, num_messages, .. } = frame.command else {
            panic!("expected Send, got {:?}", frame.command)
        };
        assert_eq!(num_messages, 2, "entry {entry}");
        let message_id = MessageId::new(ledger, entry, -1, -1);
        conn.send(Command::SendReceipt { producer_id, sequence_id, message_id }, &[]).await;
    }
    while conn.recv().await.is_some() {}
}

/// Goal: the batch flusher, which sleeps while no batch is open (it used to
/// wake every `max_delay / 2` regardless), still sends a batch that opens
/// after an idle spell at its `max_delay`: the open wakes it. Method: a
/// 50 ms delay, two rounds of 300 ms idle then two messages; the broker
/// answers each entry at once, and each receipt must come after the delay
/// (not sooner: the batch was not full) and well before a second.
#[tokio::test]
async fn a_batch_opened_after_an_idle_spell_goes_out_at_its_delay() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(answer_pairs(accept, "idle", 7));
        let client = Client::connect_with(&url, options()).await.unwrap();
        let delay = Duration::from_millis(50);
        let batching = magnetar_client::BatchingOptions { max_messages: 100, max_delay: delay, ..Default::default() };
        let producer = client.producer("t").batching(batching).create().await.unwrap();
        for entry in 0..2u64 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let started = std::time::Instant::now();
            let a = producer.send_async(OutgoingMessage::new("a")).await.unwrap();
            let b = producer.send_async(OutgoingMessage::new("b")).await.unwrap();
            assert_eq!(b.await.unwrap(), MessageId::new(7, entry, -1, 1));
            assert_eq!(a.await.unwrap(), MessageId::new(7, entry, -1, 0));
            let took = started.elapsed();
            assert!(took >= delay && took < Duration::from_secs(1), "entry {entry} went out after {took:?}");
        }
        client.close();
        broker.await.unwrap();
    })
    .await;
}

/// Goal: a `max_delay` beyond the clock's range (`Duration::MAX`: batches
/// close by size only) is accepted and works; it overflowed `Instant + d`
/// in `send_async` (review finding, seventh session). Method: two messages
/// per batch, two batches; each goes out when full and gets its receipt.
#[tokio::test]
async fn batching_by_size_only_with_an_endless_delay() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let broker = tokio::spawn(answer_pairs(accept, "endless", 8));
        let client = Client::connect_with(&url, options()).await.unwrap();
        let batching =
            magnetar_client::BatchingOptions { max_messages: 2, max_delay: Duration::MAX, ..Default::default() };
        let producer = client.producer("t").batching(batching).create().await.unwrap();
        for entry in 0..2u64 {
            let a = producer.send_async(OutgoingMessage::new("a")).await.unwrap();
            let b = producer.send_async(OutgoingMessage::new("b")).await.unwrap();
            assert_eq!(a.await.unwrap(), MessageId::new(8, entry, -1, 0));
            assert_eq!(b.await.unwrap(), MessageId::new(8, entry, -1, 1));
        }
        client.close();
        broker.await.unwrap();
    })
    .await;
}

/// Goal: an idle consumer's timer task (asleep with nothing due) ends when
/// the broker closes the consumer, and when the connection goes down, not
/// only when the application drops the `Consumer` (review finding, seventh
/// session: it used to notice only at its next wake-up, which an idle one
/// never has). Method: two consumers on one connection, both kept alive;
/// the broker closes the first (one task fewer: its timer task), then drops
/// the connection (the second's timer task ends with the connection's own).
#[tokio::test]
async fn an_idle_consumers_timer_task_ends_when_closed_by_the_broker_or_disconnected() {
    within(async {
        let (url, accept) = listen(1 << 20).await;
        let (close_tx, close_rx) = tokio::sync::oneshot::channel::<()>();
        let (drop_tx, drop_rx) = tokio::sync::oneshot::channel::<()>();
        let broker = tokio::spawn(async move {
            let mut conn = accept.await;
            let mut ids = Vec::new();
            while ids.len() < 2 {
                if let Command::Subscribe { request_id, consumer_id, .. } = conn.recv_cmd().await.command {
                    conn.send(Command::Success { request_id }, &[]).await;
                    ids.push(consumer_id);
                }
            }
            close_rx.await.unwrap();
            conn.send(Command::CloseConsumer { request_id: 0, consumer_id: ids[0] }, &[]).await;
            drop_rx.await.unwrap();
        });
        let client = Client::connect_with(&url, options()).await.unwrap();
        let first = client.subscribe("t", "s1").subscribe().await.unwrap();
        let second = client.subscribe("t", "s2").subscribe().await.unwrap();
        /// Waits until the runtime's live tasks drop to `want` or below.
        async fn settle(want: usize) {
            let alive = || tokio::runtime::Handle::current().metrics().num_alive_tasks();
            for _ in 0..200 {
                if alive() <= want {
                    return;
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            panic!("{} tasks alive after 2 s, expected {want} at most", alive());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
        let before = tokio::runtime::Handle::current().metrics().num_alive_tasks();
        close_tx.send(()).unwrap();
        settle(before - 1).await;
        drop_tx.send(()).unwrap();
        broker.await.unwrap();
        // Left: this test's own task and whatever the client keeps besides
        // its connection (nothing of the two consumers).
        settle(1).await;
        drop((first, second));
        client.close();
    })
    .await;
}
