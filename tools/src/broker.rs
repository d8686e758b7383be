//! What the client subcommands (`produce`, `consume`, `read`, `admin`)
//! share: the broker's address, the connection to it, and the one-thread
//! runtime they run on.

use magnetar_client::{AuthToken, Client, ClientOptions, SubscriptionType, TlsOptions};
use std::error::Error;
use std::future::Future;
use std::path::PathBuf;

/// Default service URL of the client commands.
pub const DEFAULT_URL: &str = "127.0.0.1:6650";

/// The `--url` option. Global: `admin`'s subcommands take it after their
/// own name too (the other commands have no subcommands).
#[derive(clap::Args, Debug)]
pub struct BrokerArgs {
    /// Broker: `magnetar://HOST:PORT`, `HOST:PORT`, or with TLS
    /// `magnetar+tls://HOST:PORT` / `pulsar+ssl://HOST:PORT`.
    #[arg(long, default_value = DEFAULT_URL, global = true)]
    pub url: String,
    /// A token (JWT) for a broker with token authentication. Visible to
    /// other users of this machine in the process list: prefer
    /// --token-file.
    #[arg(long, global = true, conflicts_with = "token_file")]
    pub token: Option<String>,
    /// A file holding the token (surrounding whitespace ignored).
    #[arg(long, global = true)]
    pub token_file: Option<PathBuf>,
    /// TLS: trust the CA certificates in this PEM file (needed by
    /// `magnetar+tls://` and `pulsar+ssl://` URLs; with it, any URL uses TLS).
    #[arg(long, global = true, value_name = "FILE")]
    pub tls_ca: Option<PathBuf>,
    /// TLS: present this client certificate (PEM), with --tls-key.
    #[arg(long, global = true, value_name = "FILE", requires = "tls_key")]
    pub tls_cert: Option<PathBuf>,
    /// TLS: the client certificate's private key (PEM).
    #[arg(long, global = true, value_name = "FILE", requires = "tls_cert")]
    pub tls_key: Option<PathBuf>,
}

impl BrokerArgs {
    /// The client options these arguments ask for.
    pub fn options(&self) -> Result<ClientOptions, Box<dyn Error>> {
        let token = match (&self.token, &self.token_file) {
            (Some(t), _) => Some(t.trim().to_string()),
            (None, Some(path)) => Some(
                std::fs::read_to_string(path)
                    .map_err(|e| format!("--token-file {}: {e}", path.display()))?
                    .trim()
                    .to_string(),
            ),
            (None, None) => None,
        };
        let tls = match &self.tls_ca {
            Some(ca) => {
                let client = self.tls_cert.as_deref().zip(self.tls_key.as_deref());
                Some(TlsOptions::from_pem_files(ca, client)?)
            }
            None if self.tls_cert.is_some() => return Err("--tls-cert needs --tls-ca".into()),
            None => None,
        };
        Ok(ClientOptions { auth_token: token.map(AuthToken), tls, ..ClientOptions::default() })
    }

    pub async fn connect(&self) -> Result<Client, Box<dyn Error>> {
        Ok(Client::connect_with(&self.url, self.options()?).await?)
    }
}

/// Runs a subcommand on one thread: the client's reader and writer tasks
/// and the command's loops share it without cross-thread wake-ups, and
/// leave the other cores to the broker when both run on one machine.
pub fn block_on(command: impl Future<Output = Result<(), Box<dyn Error>>>) -> Result<(), Box<dyn Error>> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    runtime.block_on(command)
}

/// The SDK's [`SubscriptionType`] as a command-line value (`exclusive`,
/// `failover`, `shared`, `key_shared`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SubType(pub SubscriptionType);

impl clap::ValueEnum for SubType {
    fn value_variants<'a>() -> &'a [Self] {
        // Each one's name is in `to_possible_value`, whose match fails to
        // compile when the SDK gains a type: add it here then.
        &[
            SubType(SubscriptionType::Exclusive),
            SubType(SubscriptionType::Failover),
            SubType(SubscriptionType::Shared),
            SubType(SubscriptionType::KeyShared),
        ]
    }

    fn to_possible_value(&self) -> Option<clap::builder::PossibleValue> {
        use clap::builder::PossibleValue;
        Some(match self.0 {
            SubscriptionType::Exclusive => PossibleValue::new("exclusive"),
            SubscriptionType::Failover => PossibleValue::new("failover"),
            SubscriptionType::Shared => PossibleValue::new("shared"),
            SubscriptionType::KeyShared => PossibleValue::new("key_shared").alias("key-shared"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::ValueEnum;

    /// Goal: the `--type` values name every subscription type once, with
    /// the strings the command has always taken.
    #[test]
    fn sub_type_values() {
        for (s, t) in [
            ("exclusive", SubscriptionType::Exclusive),
            ("failover", SubscriptionType::Failover),
            ("shared", SubscriptionType::Shared),
            ("key_shared", SubscriptionType::KeyShared),
            ("key-shared", SubscriptionType::KeyShared),
        ] {
            assert_eq!(SubType::from_str(s, false), Ok(SubType(t)), "{s}");
        }
        assert_eq!(SubType::value_variants().len(), 4);
    }
}
