//! `scale-topics`: puts many idle topics on a running broker, for
//! `bench/scripts/scale.sh --topics N` (issue #18): each topic gets a few
//! messages and one durable subscription, then its producer and consumer
//! close, so what stays in the broker is what an idle topic costs.
//!
//!   scale-topics --url 127.0.0.1:6650 --topics 100000 [--messages 3] [--concurrency 64]
//!
//! Prints one progress line to stderr every 10,000 topics and, at the end,
//! one line on stdout: `topics=N messages=M elapsed_ms=T`.

use clap::Parser;
use magnetar_client::{Client, InitialPosition, OutgoingMessage};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

#[derive(Parser, Debug)]
struct Args {
    /// Broker address (`host:port` or `pulsar://host:port`).
    #[arg(long)]
    url: String,
    /// Topics to create (`persistent://public/default/<prefix>-<i>`).
    #[arg(long)]
    topics: u64,
    /// Messages sent to each topic.
    #[arg(long, default_value_t = 3)]
    messages: u64,
    /// Topics set up at once.
    #[arg(long, default_value_t = 64)]
    concurrency: u64,
    /// Topic name prefix.
    #[arg(long, default_value = "idle")]
    prefix: String,
    /// Subscription name (durable; created at the earliest position).
    #[arg(long, default_value = "s")]
    subscription: String,
}

async fn one_topic(client: &Client, args: &Args, i: u64) -> Result<(), String> {
    let topic = format!("persistent://public/default/{}-{i}", args.prefix);
    let producer = client.producer(topic.as_str()).create().await.map_err(|e| format!("producer on {topic}: {e}"))?;
    for m in 0..args.messages {
        producer
            .send(OutgoingMessage::new(format!("{topic}:{m}")))
            .await
            .map_err(|e| format!("send to {topic}: {e}"))?;
    }
    producer.close().await.map_err(|e| format!("close producer on {topic}: {e}"))?;
    let consumer = client
        .subscribe(topic.as_str(), args.subscription.as_str())
        .initial_position(InitialPosition::Earliest)
        .subscribe()
        .await
        .map_err(|e| format!("subscribe to {topic}: {e}"))?;
    consumer.close().await.map_err(|e| format!("close consumer on {topic}: {e}"))
}

fn main() -> Result<(), String> {
    let args = Arc::new(Args::parse());
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(async move {
        let client = Client::connect(&args.url).await.map_err(|e| format!("connect to {}: {e}", args.url))?;
        let started = Instant::now();
        let next = Arc::new(AtomicU64::new(0));
        let done = Arc::new(AtomicU64::new(0));
        let mut tasks = Vec::new();
        for _ in 0..args.concurrency.max(1) {
            let (client, args, next, done) = (client.clone(), args.clone(), next.clone(), done.clone());
            tasks.push(tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= args.topics {
                        return Ok::<(), String>(());
                    }
                    one_topic(&client, &args, i).await?;
                    let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                    if d % 10_000 == 0 {
                        eprintln!("{d} topics in {:.1} s", started.elapsed().as_secs_f64());
                    }
                }
            }));
        }
        for t in tasks {
            t.await.map_err(|e| e.to_string())??;
        }
        println!(
            "topics={} messages={} elapsed_ms={}",
            args.topics,
            args.topics * args.messages,
            started.elapsed().as_millis()
        );
        client.close();
        Ok(())
    })
}
