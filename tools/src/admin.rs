//! `magnetar admin …`: administrative commands against a running broker.
//!
//! Today: `magnetar admin subscriptions stats TOPIC` prints the topic's
//! per-subscription statistics as one JSON object on stdout (layout in
//! `docs/semantics.md`).

use crate::produce::DEFAULT_URL;
use magnetar_client::Client;
use std::error::Error;

#[derive(clap::Args, Debug)]
pub struct AdminArgs {
    #[command(subcommand)]
    pub command: AdminCmd,
}

#[derive(clap::Subcommand, Debug)]
pub enum AdminCmd {
    /// Subscriptions of a topic.
    Subscriptions {
        #[command(subcommand)]
        command: SubscriptionsCmd,
    },
}

#[derive(clap::Subcommand, Debug)]
pub enum SubscriptionsCmd {
    /// Per-subscription statistics: backlog, unacked, delayed, consumers.
    Stats {
        /// Topic: `persistent://tenant/ns/topic`, `tenant/ns/topic`, or `topic`.
        topic: String,
        /// Broker: `magnetar://HOST:PORT` or `HOST:PORT`.
        #[arg(long, default_value = DEFAULT_URL)]
        url: String,
    },
}

pub fn run(args: AdminArgs) -> Result<(), Box<dyn Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(async {
        match args.command {
            AdminCmd::Subscriptions { command: SubscriptionsCmd::Stats { topic, url } } => {
                let client = Client::connect(&url).await?;
                let json = client.topic_stats(&topic).await?;
                client.close();
                // Pretty-printed for people; still one JSON document for scripts.
                let value: serde_json::Value = serde_json::from_str(&json)?;
                println!("{}", serde_json::to_string_pretty(&value)?);
                Ok(())
            }
        }
    })
}
