//! `magnetar consume`: receive, print and acknowledge messages of one
//! subscription until `--count` messages, `--timeout-s` seconds without a
//! message, or Ctrl-C.
//!
//! Output contract (issue #2, relied on by scripts): with `--output jsonl`,
//! stdout gets one object per received message:
//! `{"id":"L:E:P:B","key":…,"properties":{…},"publish_time_ms":…,
//! "receive_time_ms":…,"redelivery_count":…,"payload":"…"}`, with
//! `"payload_base64"` instead of `"payload"` when the payload is not UTF-8,
//! then `"topic"` (the topic or partition it came from), then
//! `"deliver_at_ms"` only for a message sent with a delivery time.
//! Status lines go to stderr.
//!
//! Flags of issue #4, also a contract: `--type exclusive|failover|shared|key_shared`
//! (alias `--subscription-type`), `--priority N`, `--nack-every N`,
//! `--nack-delay-ms MS`, `--ack-timeout-s S`, `--dlq-max-redeliveries N`
//! (dead-letter topic `<topic>-<subscription>-DLQ`), `--filter-tag T`,
//! `--key-shared-ranges START-END,...` (Key_Shared sticky hash ranges).
//! Issue #22: `--retry-max N` (with `--reconsume-every N` and
//! `--retry-delays rocketmq|MS,...`): a message reconsumed N times goes to
//! the dead-letter topic; a status line on stderr says so. `--pull --batch
//! N` (with `--poll-ms`): pull consumption, same output. `--allocation
//! average|round-robin|consistent-hash|zone` (with `--zone Z` and
//! `--partition-zones Z0,Z1,...`): which Failover consumer owns which
//! partition. `--mode broadcast --name N`: every consumer gets every
//! message, with its own cursor `<subscription>/<N>`.
//! Semantics: `docs/semantics.md`.

use crate::broker::{BrokerArgs, SubType};
use crate::produce::OutputFormat;
use base64::Engine as _;
use magnetar_client::{
    AllocationStrategy, ClientError, DeadLetterPolicy, InitialPosition, Message, Reconsumed, RetryPolicy,
    SubscriptionMode, SubscriptionType,
};
use std::collections::BTreeMap;
use std::error::Error;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    Clustering,
    Broadcast,
}

fn parse_allocation(s: &str) -> Result<AllocationStrategy, String> {
    AllocationStrategy::parse(s).ok_or_else(|| format!("{s:?}: expected average, round-robin, consistent-hash or zone"))
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub enum Position {
    Earliest,
    Latest,
}

#[derive(clap::Args, Debug)]
pub struct ConsumeArgs {
    /// Topic: `persistent://tenant/ns/topic`, `tenant/ns/topic`, or `topic`
    /// (= `persistent://public/default/topic`). A partitioned topic's name
    /// covers all its partitions.
    #[arg(required_unless_present = "topics_pattern")]
    pub topic: Option<String>,

    /// Instead of TOPIC: every topic of one namespace whose full name matches
    /// this regular expression, e.g. `persistent://public/default/orders-.*`;
    /// topics created later that match are picked up.
    #[arg(long, conflicts_with = "topic")]
    pub topics_pattern: Option<String>,

    /// How often the namespace is listed again for `--topics-pattern`.
    #[arg(long, default_value_t = 5.0)]
    pub pattern_refresh_s: f64,

    /// Subscription name.
    #[arg(long, short = 's')]
    pub subscription: String,

    /// Stop after this many messages; 0 = until --timeout-s or Ctrl-C.
    #[arg(long, short = 'n', default_value_t = 0)]
    pub count: u64,

    /// Where a new subscription starts.
    #[arg(long, value_enum, default_value_t = Position::Latest)]
    pub initial_position: Position,

    /// Before consuming, move the subscription's cursor to the first message
    /// published at or after this time (milliseconds since the Unix epoch).
    /// One non-partitioned topic only.
    #[arg(long)]
    pub seek_time_ms: Option<u64>,

    /// Stop after this many seconds without a message (fractions allowed).
    #[arg(long)]
    pub timeout_s: Option<f64>,

    /// Subscription type (`--subscription-type` is an alias).
    #[arg(long = "type", visible_alias = "subscription-type", value_enum, default_value_t = SubType(SubscriptionType::Exclusive))]
    pub sub_type: SubType,

    /// Failover priority level: the lowest level is preferred.
    #[arg(long, default_value_t = 0)]
    pub priority: i32,

    /// Negatively acknowledge every Nth message received instead of
    /// acknowledging it (it comes back after --nack-delay-ms, doubling with
    /// each redelivery).
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub nack_every: Option<u64>,

    /// Delay before a negatively acknowledged message comes back (first time).
    #[arg(long, default_value_t = 1000)]
    pub nack_delay_ms: u64,

    /// Redeliver messages not acknowledged this many seconds after receipt
    /// (fractions allowed; at least 0.1).
    #[arg(long)]
    pub ack_timeout_s: Option<f64>,

    /// Send messages redelivered more than N times to the dead-letter topic
    /// `<topic>-<subscription>-DLQ` (then acknowledge them).
    #[arg(long)]
    pub dlq_max_redeliveries: Option<u32>,

    /// Instead of acknowledging every Nth message received, reconsume it
    /// later: it goes around through `<topic>-<subscription>-RETRY` (which
    /// this consumer also consumes) after the delay of `--retry-delays`.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    pub reconsume_every: Option<u64>,

    /// A message reconsumed N times goes to the dead-letter topic
    /// (`<topic>-<subscription>-DLQ`) the next time instead of around again.
    #[arg(long)]
    pub retry_max: Option<u32>,

    /// Delays before the 1st, 2nd, … retry: `rocketmq` (RocketMQ's default
    /// levels 1s 5s 10s 30s 1m … 2h) or milliseconds, comma separated; the
    /// last one repeats.
    #[arg(long, default_value = "1000")]
    pub retry_delays: String,

    /// Pull instead of being pushed: fetch up to `--batch` messages at a
    /// time (each fetch grants the broker its own permits and waits until
    /// the batch is full or `--poll-ms` passed). One non-partitioned topic
    /// (or one partition).
    #[arg(long, conflicts_with_all = ["topics_pattern", "reconsume_every", "retry_max"])]
    pub pull: bool,

    /// With `--pull`: messages per fetch.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1_048_576), requires = "pull")]
    pub batch: u32,

    /// With `--pull`: how long one fetch waits for its batch to fill.
    #[arg(long, default_value_t = 1000, requires = "pull")]
    pub poll_ms: u64,

    /// Only messages with this tag (filtered by the broker).
    #[arg(long)]
    pub filter_tag: Option<String>,

    /// Key_Shared sticky mode: the key hash ranges this consumer owns, as
    /// inclusive `START-END` pairs (or single hashes) within 0..=65535,
    /// comma separated, e.g. `0-32767,40000-50000`. Without it: auto split.
    #[arg(long, value_parser = parse_key_shared_ranges)]
    pub key_shared_ranges: Option<KeySharedRanges>,

    /// Messages the broker may push ahead of processing.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub receiver_queue_size: u32,

    /// Consumer name (default: chosen by the broker); `--name` is an alias.
    #[arg(long, visible_alias = "name")]
    pub consumer_name: Option<String>,

    /// `clustering`: the subscription's consumers share its cursor.
    /// `broadcast`: every consumer receives every message, with a cursor of
    /// its own (the subscription `<subscription>/<name>`, needs `--name`),
    /// kept while it is away.
    #[arg(long, value_enum, default_value_t = Mode::Clustering)]
    pub mode: Mode,

    /// Failover on a partitioned topic: which consumer owns which partition.
    /// `round-robin`: partition p to the (p % n)-th consumer by name.
    /// `average`: contiguous blocks. `consistent-hash`: a hash ring (a
    /// consumer joining or leaving moves only its share). `zone`: a
    /// partition to a consumer of its zone while one exists (see `--zone`,
    /// `--partition-zones`), else by `average`. Kept with the subscription.
    #[arg(long, value_parser = parse_allocation, default_value = "round-robin")]
    pub allocation: AllocationStrategy,

    /// With `--allocation zone`: this consumer's zone.
    #[arg(long)]
    pub zone: Option<String>,

    /// With `--allocation zone`: each partition's zone, comma separated
    /// (item i is partition i's; an empty item is no zone).
    #[arg(long)]
    pub partition_zones: Option<String>,

    #[command(flatten)]
    pub broker: BrokerArgs,

    /// `text`: one readable line per message. `jsonl`: one JSON object per
    /// message on stdout (see the module docs for the fields).
    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

pub fn run(args: ConsumeArgs) -> Result<(), Box<dyn Error>> {
    crate::broker::block_on(consume(args))
}

pub(crate) fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)).unwrap_or(0)
}

/// One line of `--output jsonl`. Field order follows the documented contract.
#[derive(serde::Serialize)]
pub(crate) struct ReceiveRecord<'a> {
    id: String,
    key: Option<&'a str>,
    /// Duplicate property names: the last value wins (a JSON object has unique keys).
    properties: BTreeMap<&'a str, &'a str>,
    publish_time_ms: u64,
    receive_time_ms: u64,
    redelivery_count: u32,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload: Option<&'a str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_base64: Option<String>,
    /// The topic (a partition's own name for a partitioned topic); added by
    /// issue #5 for multi-topic consumption.
    topic: &'a str,
    /// The time the producer asked delivery to wait for (absent: none).
    #[serde(skip_serializing_if = "Option::is_none")]
    deliver_at_ms: Option<u64>,
}

pub(crate) fn record(msg: &Message, receive_time_ms: u64) -> ReceiveRecord<'_> {
    let (payload, payload_base64) = match std::str::from_utf8(&msg.payload) {
        Ok(text) => (Some(text), None),
        Err(_) => (None, Some(base64::engine::general_purpose::STANDARD.encode(&msg.payload))),
    };
    ReceiveRecord {
        id: msg.id.to_string(),
        key: msg.key(),
        properties: msg.properties().iter().map(|(k, v)| (k.as_str(), v.as_str())).collect(),
        publish_time_ms: msg.publish_time_ms(),
        receive_time_ms,
        redelivery_count: msg.redelivery_count,
        payload,
        payload_base64,
        topic: &msg.topic,
        deliver_at_ms: msg.deliver_at_ms(),
    }
}

/// Longest payload shown in text mode, in characters.
const TEXT_PAYLOAD_SHOWN_MAX: usize = 200;

pub(crate) fn text_line(msg: &Message) -> String {
    let props: Vec<String> = msg.properties().iter().map(|(k, v)| format!("{k}={v}")).collect();
    let shown = match std::str::from_utf8(&msg.payload) {
        Ok(text) => {
            let head: String = text.chars().take(TEXT_PAYLOAD_SHOWN_MAX).collect();
            let more = text.chars().count().saturating_sub(TEXT_PAYLOAD_SHOWN_MAX);
            if more > 0 {
                format!("{head:?} (+{more} chars)")
            } else {
                format!("{head:?}")
            }
        }
        Err(_) => format!("<{} bytes, not UTF-8>", msg.payload.len()),
    };
    format!(
        "{} key={} props={{{}}} publish_time_ms={} redelivery={} payload={}",
        msg.id,
        msg.key().unwrap_or("-"),
        props.join(","),
        msg.publish_time_ms(),
        msg.redelivery_count,
        shown
    )
}

enum Stop {
    CountReached,
    Timeout(Duration),
    Interrupted,
}

async fn consume(args: ConsumeArgs) -> Result<(), Box<dyn Error>> {
    let idle_timeout = match args.timeout_s {
        Some(s) if s.is_finite() && s > 0.0 => Some(Duration::from_secs_f64(s)),
        Some(s) => return Err(format!("--timeout-s must be a positive number of seconds, got {s}").into()),
        None => None,
    };
    let client = args.broker.connect().await?;
    let mut builder = client
        .subscribe(args.topic.clone().unwrap_or_default(), args.subscription.as_str())
        .sub_type(args.sub_type.0)
        .initial_position(match args.initial_position {
            Position::Earliest => InitialPosition::Earliest,
            Position::Latest => InitialPosition::Latest,
        })
        .receiver_queue_size(args.receiver_queue_size)
        .priority_level(args.priority);
    if let Some(name) = &args.consumer_name {
        builder = builder.consumer_name(name.as_str());
    }
    if args.mode == Mode::Broadcast {
        if args.consumer_name.is_none() {
            return Err("--mode broadcast needs --name: the consumer's cursor is <subscription>/<name>".into());
        }
        builder = builder.mode(SubscriptionMode::Broadcast);
    }
    builder = builder.allocation(args.allocation);
    if let Some(z) = &args.zone {
        builder = builder.zone(z.as_str());
    }
    if let Some(zs) = &args.partition_zones {
        builder = builder.partition_zones(zs.split(',').map(str::to_string).collect());
    }
    let nack_delay = Duration::from_millis(args.nack_delay_ms);
    builder = builder.negative_ack_backoff(nack_delay, nack_delay.max(Duration::from_secs(60)));
    if let Some(s) = args.ack_timeout_s {
        if !(s.is_finite() && s >= 0.1) {
            return Err(format!("--ack-timeout-s must be at least 0.1 seconds, got {s}").into());
        }
        builder = builder.ack_timeout(Duration::from_secs_f64(s));
    }
    if let Some(n) = args.dlq_max_redeliveries {
        builder = builder.dead_letter_policy(DeadLetterPolicy { max_redeliveries: n, topic: None });
    }
    if args.retry_max.is_some() || args.reconsume_every.is_some() {
        let max = args.retry_max.unwrap_or(u32::MAX);
        let Some(policy) = RetryPolicy::named(max, &args.retry_delays) else {
            return Err(format!(
                "--retry-delays must be `rocketmq` or milliseconds separated by commas, got {:?}",
                args.retry_delays
            )
            .into());
        };
        builder = builder.retry_policy(policy);
    }
    if let Some(tag) = &args.filter_tag {
        builder = builder.filter_tag(tag.as_str());
    }
    if let Some(KeySharedRanges(ranges)) = &args.key_shared_ranges {
        builder = builder.key_shared_ranges(ranges.clone());
    }
    if let Some(ms) = args.seek_time_ms {
        // The cursor moves first, through a consumer of the one topic (a
        // seek goes to the subscription, which keeps it).
        if args.topics_pattern.is_some() {
            return Err("--seek-time-ms takes a TOPIC, not --topics-pattern".into());
        }
        let c = builder.clone().subscribe().await?;
        c.seek_by_time(ms).await?;
        c.close().await?;
    }
    if args.pull {
        let consumer = builder.pull_mode(true).subscribe().await?;
        let (received, stop) = pull_loop(&args, &consumer, idle_timeout).await?;
        match consumer.close().await {
            Ok(()) | Err(ClientError::Disconnected { .. }) => {}
            Err(e) => tracing::warn!(error = %e, "closing the consumer"),
        }
        client.close();
        report(received, stop);
        return Ok(());
    }
    // A partitioned topic's name covers all its partitions.
    let consumer = match &args.topics_pattern {
        Some(pattern) => {
            let refresh = match args.pattern_refresh_s {
                s if s.is_finite() && s > 0.0 => Duration::from_secs_f64(s),
                s => return Err(format!("--pattern-refresh-s must be positive, got {s}").into()),
            };
            builder.subscribe_pattern(pattern, refresh).await?
        }
        None => builder.subscribe_partitioned().await?,
    };

    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let mut received = 0u64;
    let mut acks_lost = false;
    let stop = loop {
        if args.count > 0 && received >= args.count {
            break Stop::CountReached;
        }
        let ready = match consumer.try_receive() {
            Ok(ready) => ready,
            Err(e) => return Err(format!("receive failed after {received} messages: {e}").into()),
        };
        let msg = match ready {
            Some(msg) => msg,
            None => {
                // About to wait: flush, so a reader of the pipe sees every
                // message promptly; while messages stream in, the buffer
                // batches the writes.
                stdout.flush()?;
                // `receive` is cancel-safe, so the timeout and Ctrl-C lose nothing.
                let next = async {
                    match idle_timeout {
                        Some(t) => tokio::time::timeout(t, consumer.receive()).await.ok(),
                        None => Some(consumer.receive().await),
                    }
                };
                tokio::select! {
                    next = next => match next {
                        None => break Stop::Timeout(idle_timeout.unwrap_or_default()),
                        Some(Ok(msg)) => msg,
                        Some(Err(e)) => {
                            stdout.flush()?;
                            return Err(format!("receive failed after {received} messages: {e}").into());
                        }
                    },
                    _ = &mut ctrl_c => break Stop::Interrupted,
                }
            }
        };
        let receive_time_ms = now_ms();
        match args.output {
            OutputFormat::Jsonl => {
                serde_json::to_writer(&mut stdout, &record(&msg, receive_time_ms))?;
                stdout.write_all(b"\n")?;
            }
            OutputFormat::Text => writeln!(stdout, "{}", text_line(&msg))?,
        }
        received += 1;
        if args.reconsume_every.is_some_and(|n| received.is_multiple_of(n)) {
            if let Reconsumed::DeadLettered { id } = consumer.reconsume(&msg).await? {
                eprintln!("{} dead-lettered as {id} after {} retries", msg.id, args.retry_max.unwrap_or(0));
            }
        } else if args.nack_every.is_some_and(|n| received.is_multiple_of(n)) {
            consumer.negative_acknowledge(&msg);
        } else {
            ack_unless_closed(consumer.ack(&msg).await, &mut acks_lost)?;
        }
    };
    stdout.flush()?;
    drop(stdout);

    // Close so the broker has every ack before we go (acks precede the close
    // on the connection).
    match consumer.close().await {
        Ok(()) | Err(ClientError::Disconnected { .. }) => {}
        Err(e) => tracing::warn!(error = %e, "closing the consumer"),
    }
    client.close();
    report(received, stop);
    Ok(())
}

/// An ack's outcome. Once the broker has closed the consumer (or the
/// connection broke) an ack cannot reach it, but the messages delivered
/// before the close are still queued: they are printed all the same (they
/// come again to the next consumer: at-least-once), and the receive after
/// them fails with the reason for the close, which is what the user needs.
fn ack_unless_closed(acked: Result<(), ClientError>, acks_lost: &mut bool) -> Result<(), ClientError> {
    match acked {
        Err(ClientError::ConsumerClosed { .. } | ClientError::Disconnected { .. }) => {
            if !std::mem::replace(acks_lost, true) {
                tracing::warn!("the consumer is closed: the messages printed from here on are not acknowledged");
            }
            Ok(())
        }
        other => other,
    }
}

fn report(received: u64, stop: Stop) {
    match stop {
        Stop::CountReached => eprintln!("received {received} messages: count reached"),
        Stop::Timeout(t) => eprintln!("received {received} messages: timeout, no message for {:.1} s", t.as_secs_f64()),
        Stop::Interrupted => eprintln!("received {received} messages: interrupted"),
    }
}

/// `--pull`: fetch batches until `--count`, `--timeout-s` without a
/// message, or Ctrl-C; print and acknowledge (or negatively acknowledge)
/// each message as `consume` does.
async fn pull_loop(
    args: &ConsumeArgs,
    consumer: &magnetar_client::Consumer,
    idle_timeout: Option<Duration>,
) -> Result<(u64, Stop), Box<dyn Error>> {
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    let ctrl_c = tokio::signal::ctrl_c();
    tokio::pin!(ctrl_c);
    let poll = Duration::from_millis(args.poll_ms.max(1));
    let mut received = 0u64;
    let mut acks_lost = false;
    let mut idle_since = tokio::time::Instant::now();
    let stop = loop {
        if args.count > 0 && received >= args.count {
            break Stop::CountReached;
        }
        let left = if args.count > 0 { args.count - received } else { u64::MAX };
        let want = u32::try_from(left).unwrap_or(u32::MAX).min(args.batch);
        let batch = tokio::select! {
            b = consumer.fetch(want, poll) => b.map_err(|e| format!("fetch failed after {received} messages: {e}"))?,
            _ = &mut ctrl_c => break Stop::Interrupted,
        };
        if batch.is_empty() {
            if let Some(t) = idle_timeout.filter(|t| idle_since.elapsed() >= *t) {
                break Stop::Timeout(t);
            }
            continue;
        }
        idle_since = tokio::time::Instant::now();
        for msg in &batch {
            match args.output {
                OutputFormat::Jsonl => {
                    serde_json::to_writer(&mut stdout, &record(msg, now_ms()))?;
                    stdout.write_all(b"\n")?;
                }
                OutputFormat::Text => writeln!(stdout, "{}", text_line(msg))?,
            }
            received += 1;
            if args.nack_every.is_some_and(|n| received.is_multiple_of(n)) {
                consumer.negative_acknowledge(msg);
            } else {
                ack_unless_closed(consumer.ack(&msg.id).await, &mut acks_lost)?;
            }
        }
        stdout.flush()?;
    };
    stdout.flush()?;
    Ok((received, stop))
}

/// `--key-shared-ranges`: inclusive key hash ranges.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeySharedRanges(pub Vec<(u16, u16)>);

fn parse_key_shared_ranges(s: &str) -> Result<KeySharedRanges, String> {
    let hash = |t: &str| t.trim().parse::<u16>().map_err(|e| format!("{t:?} is not a key hash in 0..=65535: {e}"));
    let mut out = Vec::new();
    for part in s.split(',') {
        let (start, end) = match part.split_once('-') {
            Some((a, b)) => (hash(a)?, hash(b)?),
            None => {
                let h = hash(part)?;
                (h, h)
            }
        };
        if start > end {
            return Err(format!("range {part:?}: start is above end"));
        }
        out.push((start, end));
    }
    Ok(KeySharedRanges(out))
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use magnetar_client::{MessageId, MessageMetadata};

    #[test]
    fn key_shared_ranges_flag_parses() {
        assert_eq!(
            parse_key_shared_ranges("0-32767,40000-50000"),
            Ok(KeySharedRanges(vec![(0, 32767), (40000, 50000)]))
        );
        assert_eq!(parse_key_shared_ranges("7, 9-9"), Ok(KeySharedRanges(vec![(7, 7), (9, 9)])));
        assert!(parse_key_shared_ranges("5-4").is_err());
        assert!(parse_key_shared_ranges("0-65536").is_err());
        assert!(parse_key_shared_ranges("").is_err());
        assert!(parse_key_shared_ranges("a-b").is_err());
    }

    fn message(payload: &'static [u8]) -> Message {
        Message::new(
            MessageId::new(1, 2, -1, -1),
            "persistent://public/default/t",
            MessageMetadata {
                partition_key: Some("k1".into()),
                properties: vec![("b".into(), "2".into()), ("a".into(), "1".into())],
                publish_time_ms: 10,
                ..MessageMetadata::default()
            },
            Bytes::from_static(payload),
        )
    }

    #[test]
    fn jsonl_record_fields() {
        let json = serde_json::to_string(&record(&message(b"hi"), 11)).unwrap();
        assert_eq!(
            json,
            r#"{"id":"1:2:-1:-1","key":"k1","properties":{"a":"1","b":"2"},"publish_time_ms":10,"receive_time_ms":11,"redelivery_count":0,"payload":"hi","topic":"persistent://public/default/t"}"#
        );
        let json = serde_json::to_string(&record(&message(b"\xff\x00"), 11)).unwrap();
        assert!(
            json.ends_with(r#""redelivery_count":0,"payload_base64":"/wA=","topic":"persistent://public/default/t"}"#),
            "{json}"
        );
        assert!(!json.contains(r#""payload":"#));
    }

    #[test]
    fn text_line_is_readable() {
        let line = text_line(&message(b"hi"));
        assert_eq!(line, r#"1:2:-1:-1 key=k1 props={b=2,a=1} publish_time_ms=10 redelivery=0 payload="hi""#);
    }
}
