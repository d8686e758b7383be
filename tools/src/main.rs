//! `magnetar`: one binary for the broker and its command-line clients.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod admin;
mod broker;
mod consume;
mod inspect;
mod produce;
mod read;
mod standalone;
mod tokens;

#[derive(Parser)]
#[command(name = "magnetar", version, about = "Magnetar message broker")]
struct Cli {
    #[command(subcommand)]
    command: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Run a broker with an embedded default configuration (no other service).
    Standalone(standalone::StandaloneArgs),
    /// Publish messages to a topic.
    Produce(produce::ProduceArgs),
    /// Receive and acknowledge messages from a subscription.
    Consume(consume::ConsumeArgs),
    /// Examine a data directory offline (no broker running): shards, segments,
    /// ledgers, topics, cursors; verify checksums; dump entries.
    Inspect(inspect::InspectArgs),
    /// Read a topic from a position without a subscription (a Reader).
    Read(read::ReadArgs),
    /// Administer tenants, namespaces (policies) and topics.
    Admin(admin::AdminArgs),
    /// Keys and tokens for token authentication.
    Tokens(tokens::TokensArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let result = match cli.command {
        Cmd::Standalone(args) => standalone::run(args),
        Cmd::Produce(args) => produce::run(args),
        Cmd::Consume(args) => consume::run(args),
        Cmd::Inspect(args) => inspect::run(args).map_err(Into::into),
        Cmd::Admin(args) => admin::run(args),
        Cmd::Read(args) => read::run(args),
        Cmd::Tokens(args) => tokens::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::FAILURE
        }
    }
}
