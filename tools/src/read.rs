//! `magnetar read`: a Reader. Reads a topic (all partitions of a partitioned
//! one) from the earliest message, the latest, or a message id, through a
//! non-durable subscription: nothing about the read is stored on the broker,
//! and the subscription disappears when the reader leaves.
//!
//! Output: the same as `magnetar consume` (jsonl: one object per message).

use crate::broker::BrokerArgs;
use crate::consume::{now_ms, record, text_line};
use crate::produce::OutputFormat;
use magnetar_client::{InitialPosition, MessageId};
use std::error::Error;
use std::io::Write;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

#[derive(clap::Args, Debug)]
pub struct ReadArgs {
    /// Topic: `persistent://tenant/ns/topic`, `tenant/ns/topic`, or `topic`.
    pub topic: String,

    /// `earliest`, `latest`, or a message id `L:E:P:B`: read from that
    /// message on (inclusive; for a partitioned topic, within its partition,
    /// other partitions from the earliest).
    #[arg(long, visible_alias = "from", default_value = "earliest")]
    pub start: String,

    /// Stop after this many messages; 0 = until --timeout-s.
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
    let reader = client
        .subscribe(args.topic.as_str(), subscription)
        .initial_position(position)
        .durable(false)
        .subscribe_partitioned()
        .await?;
    let mut stdout = std::io::BufWriter::new(std::io::stdout().lock());
    let mut read = 0u64;
    while args.count == 0 || read < args.count {
        let msg = match tokio::time::timeout(idle, reader.receive()).await {
            Err(_) => break,
            Ok(m) => m?,
        };
        // Acked so the broker forgets it (a non-durable cursor, in memory).
        reader.ack(&msg).await?;
        if start.as_ref().is_some_and(|s| before(&msg.id, s)) {
            continue;
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
    Ok(())
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
