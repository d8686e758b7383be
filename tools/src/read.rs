//! `magnetar read`: a Reader. Reads a topic (all partitions of a partitioned
//! one) from the earliest message, the latest, or a message id, through a
//! non-durable subscription: nothing about the read is stored on the broker,
//! and the subscription disappears when the reader leaves.
//!
//! Output: the same as `magnetar consume` (jsonl: one object per message).
//!
//! Paging (issue #22: `read --from L:E:P:B --count N`): a non-partitioned
//! topic (or one partition, `<topic>-partition-<i>`) read from an id starts
//! there at once (the reader seeks to it), and once `--count` messages are
//! printed a status line `next L:E:P:B` on stderr names the message after
//! them, the `--from` of the next page (`next none`: no further message
//! arrived within `--timeout-s`).

use crate::broker::BrokerArgs;
use crate::consume::{now_ms, record, text_line};
use crate::produce::OutputFormat;
use magnetar_client::{Consumer, InitialPosition, Message, MessageId, MultiTopicConsumer};
use std::error::Error;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(clap::Args, Debug)]
pub struct ReadArgs {
    /// Topic: `persistent://tenant/ns/topic`, `tenant/ns/topic`, or `topic`.
    pub topic: String,

    /// `earliest`, `latest`, or a message id `L:E:P:B`
    /// (ledger:entry:partition:batch_index): read from that message on
    /// (inclusive; for a partitioned topic, within its partition, other
    /// partitions from the earliest).
    #[arg(long, visible_alias = "from", default_value = "earliest")]
    pub start: String,

    /// Stop after this many messages (a page), then print on stderr the id
    /// of the next one as `next L:E:P:B`; 0 = until --timeout-s.
    #[arg(long, short = 'n', default_value_t = 0)]
    pub count: u64,

    /// Stop after this many seconds without a message.
    #[arg(long, default_value_t = 3.0)]
    pub timeout_s: f64,

    #[command(flatten)]
    pub broker: BrokerArgs,

    #[arg(long, value_enum, default_value_t = OutputFormat::Text)]
    pub output: OutputFormat,
}

pub fn run(args: ReadArgs) -> Result<(), Box<dyn Error>> {
    crate::broker::block_on(read(args))
}

/// Whether `id` comes before `start` in `start`'s partition.
fn before(id: &MessageId, start: &MessageId) -> bool {
    if start.partition >= 0 && id.partition != start.partition {
        return false;
    }
    (id.ledger, id.entry, id.batch_index.max(-1)) < (start.ledger, start.entry, start.batch_index.max(-1))
}

async fn read(args: ReadArgs) -> Result<(), Box<dyn Error>> {
    let (position, start) = match args.start.as_str() {
        "earliest" => (InitialPosition::Earliest, None),
        "latest" => (InitialPosition::Latest, None),
        id => {
            let id: MessageId = id.parse().map_err(|e| format!("--start: {e}"))?;
            (InitialPosition::Earliest, Some(id))
        }
    };
    let idle = match args.timeout_s {
        s if s.is_finite() && s > 0.0 => Duration::from_secs_f64(s),
        s => return Err(format!("--timeout-s must be positive, got {s}").into()),
    };
    let client = args.broker.connect().await?;
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_nanos()).unwrap_or(0);
    let subscription = format!("reader-{}-{nanos:x}", std::process::id());
    let builder = client.subscribe(args.topic.as_str(), subscription).initial_position(position).durable(false);
    let topic = magnetar_client::normalize_topic(&args.topic)?;
    let reader = match start {
        // One topic: start at the id at once instead of reading up to it
        // (from the latest first, so nothing older is sent meanwhile).
        Some(id) if client.admin().partitions(&topic).await? == 0 => {
            let c = builder.initial_position(InitialPosition::Latest).subscribe().await?;
            c.seek(id).await?;
            Reader::One(Box::new(c))
        }
        _ => Reader::Many(builder.subscribe_partitioned().await?),
    };
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    let mut read = 0u64;
    let mut next = None;
    // One topic's ids ascend: one at or before the last printed is a
    // message sent again across the seek.
    let mut last: Option<MessageId> = None;
    loop {
        let msg = match tokio::time::timeout(idle, reader.receive()).await {
            Err(_) => break,
            Ok(m) => m?,
        };
        // Acked so the broker forgets it (a non-durable cursor, in memory).
        reader.ack(&msg).await?;
        // Messages sent before the seek took effect may still arrive, and a
        // batch is delivered whole: skip what precedes the start.
        if start.as_ref().is_some_and(|s| before(&msg.id, s)) {
            continue;
        }
        if matches!(reader, Reader::One(_)) && last.as_ref().is_some_and(|l| !before(l, &msg.id)) {
            continue;
        }
        last = Some(msg.id);
        if args.count != 0 && read == args.count {
            next = Some(msg.id);
            break;
        }
        match args.output {
            OutputFormat::Jsonl => {
                serde_json::to_writer(&mut stdout, &record(&msg, now_ms()))?;
                stdout.write_all(b"\n")?;
            }
            OutputFormat::Text => writeln!(stdout, "{}", text_line(&msg))?,
        }
        read += 1;
    }
    stdout.flush()?;
    drop(stdout);
    let _ = reader.close().await;
    client.close();
    eprintln!("read {read} messages");
    if args.count != 0 {
        match next {
            Some(id) => eprintln!("next {id}"),
            None => eprintln!("next none"),
        }
    }
    Ok(())
}

/// A reader of one topic (it can seek) or of all partitions of one.
enum Reader {
    One(Box<Consumer>),
    Many(std::sync::Arc<MultiTopicConsumer>),
}

impl Reader {
    async fn receive(&self) -> magnetar_client::Result<Message> {
        match self {
            Self::One(c) => c.receive().await,
            Self::Many(m) => m.receive().await,
        }
    }

    async fn ack(&self, msg: &Message) -> magnetar_client::Result<()> {
        match self {
            Self::One(c) => c.ack(&msg.id).await,
            Self::Many(m) => m.ack(msg).await,
        }
    }

    async fn close(&self) -> magnetar_client::Result<()> {
        match self {
            Self::One(c) => c.close().await,
            Self::Many(m) => m.close().await,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_position() {
        let s = MessageId::new(5, 3, -1, -1);
        assert!(before(&MessageId::new(5, 2, -1, -1), &s));
        assert!(!before(&MessageId::new(5, 3, -1, -1), &s));
        assert!(!before(&MessageId::new(5, 3, -1, 2), &s));
        let s = MessageId::new(5, 3, 1, 2);
        assert!(before(&MessageId::new(5, 3, 1, 1), &s));
        assert!(!before(&MessageId::new(1, 0, 0, -1), &s), "other partitions are read from the start");
    }
}
