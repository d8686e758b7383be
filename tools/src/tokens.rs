//! `magnetar tokens`: keys and tokens for token authentication, as `pulsar
//! tokens` has them. `create` prints the token alone on stdout so that
//! scripts can capture it; `show` prints the header and the claims, one JSON
//! document a line, without checking the signature.

use magnetar_core::auth::{create_token, secret_key_bytes, show_token, SigningKey};
use rand::RngCore;
use std::error::Error;
use std::path::{Path, PathBuf};

/// Bytes of a new HS256 secret key (256 bits, as Pulsar's).
const SECRET_KEY_BYTES: usize = 32;

#[derive(clap::Args, Debug)]
pub struct TokensArgs {
    #[command(subcommand)]
    pub command: TokensCmd,
}

#[derive(clap::Subcommand, Debug)]
pub enum TokensCmd {
    /// Write a new secret key (HS256) to FILE, readable by its owner only.
    CreateSecretKey {
        #[arg(long, value_name = "FILE")]
        output: PathBuf,
    },
    /// Write a new ES256 key pair (PEM): the private key signs tokens, the
    /// broker checks them with the public key.
    CreateKeyPair {
        #[arg(long, value_name = "FILE")]
        output_private_key: PathBuf,
        #[arg(long, value_name = "FILE")]
        output_public_key: PathBuf,
    },
    /// Print a token whose subject (role) is ROLE.
    Create {
        #[arg(long, value_name = "FILE", conflicts_with = "private_key", required_unless_present = "private_key")]
        secret_key: Option<PathBuf>,
        #[arg(long, value_name = "FILE")]
        private_key: Option<PathBuf>,
        #[arg(long, value_name = "ROLE")]
        subject: String,
        /// Lifetime, e.g. 1h, 30m, 7d; without it the token does not expire.
        #[arg(long, value_parser = humantime::parse_duration)]
        expiry: Option<std::time::Duration>,
    },
    /// Print a token's header and claims (the signature is not checked).
    Show { token: String },
}

/// Writes `bytes` to a new file only its owner may read.
fn write_private(path: &Path, bytes: &[u8]) -> Result<(), Box<dyn Error>> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(bytes)?;
    f.sync_all()?;
    Ok(())
}

fn read(path: &Path) -> Result<Vec<u8>, Box<dyn Error>> {
    Ok(std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?)
}

pub fn run(args: TokensArgs) -> Result<(), Box<dyn Error>> {
    match args.command {
        TokensCmd::CreateSecretKey { output } => {
            let mut key = [0u8; SECRET_KEY_BYTES];
            rand::rng().fill_bytes(&mut key);
            write_private(&output, &key)
        }
        TokensCmd::CreateKeyPair { output_private_key, output_public_key } => {
            let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256)?;
            write_private(&output_private_key, pair.serialize_pem().as_bytes())?;
            std::fs::write(&output_public_key, pair.public_key_pem())
                .map_err(|e| format!("{}: {e}", output_public_key.display()))?;
            Ok(())
        }
        TokensCmd::Create { secret_key, private_key, subject, expiry } => {
            let key = match (secret_key, private_key) {
                (Some(f), _) => SigningKey::Secret(secret_key_bytes(&read(&f)?)),
                (None, Some(f)) => SigningKey::PrivatePem(read(&f)?),
                (None, None) => return Err("give --secret-key FILE or --private-key FILE".into()),
            };
            let exp = match expiry {
                Some(d) => {
                    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH)?;
                    Some(now.saturating_add(d).as_secs())
                }
                None => None,
            };
            println!("{}", create_token(&key, &subject, exp)?);
            Ok(())
        }
        TokensCmd::Show { token } => {
            let (header, claims) = show_token(&token)?;
            println!("{header}");
            println!("{claims}");
            Ok(())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use magnetar_core::auth::Authenticator;
    use magnetar_core::Principal;

    /// Goal: the key files the commands write are what the broker reads:
    /// a token made with the new private key (or secret key) verifies with
    /// the public key (or the same secret key), and names its subject.
    #[test]
    fn keys_written_here_verify_tokens_made_here() {
        let dir = tempfile::tempdir().unwrap();
        let (private, public, secret) =
            (dir.path().join("priv.pem"), dir.path().join("pub.pem"), dir.path().join("secret.key"));
        run(TokensArgs {
            command: TokensCmd::CreateKeyPair {
                output_private_key: private.clone(),
                output_public_key: public.clone(),
            },
        })
        .unwrap();
        run(TokensArgs { command: TokensCmd::CreateSecretKey { output: secret.clone() } }).unwrap();
        assert_eq!(std::fs::read(&secret).unwrap().len(), SECRET_KEY_BYTES);

        let es = create_token(&SigningKey::PrivatePem(std::fs::read(&private).unwrap()), "app", None).unwrap();
        let by_public = Authenticator::new().with_public_key_file(&public).unwrap();
        assert_eq!(by_public.verify_token(es.as_bytes()), Ok(Principal::Role("app".into())));
        let (header, claims) = show_token(&es).unwrap();
        assert!(header.contains("ES256") && claims.contains("\"sub\":\"app\""), "{header} {claims}");

        let hs =
            create_token(&SigningKey::Secret(secret_key_bytes(&std::fs::read(&secret).unwrap())), "ops", None).unwrap();
        let by_secret = Authenticator::new().with_secret_key_file(&secret).unwrap();
        assert_eq!(by_secret.verify_token(hs.as_bytes()), Ok(Principal::Role("ops".into())));
        // A token of one key is refused by the other.
        assert!(by_public.verify_token(hs.as_bytes()).is_err());
        assert!(by_secret.verify_token(es.as_bytes()).is_err());
    }
}
