//! TLS on the broker port (rustls; TLS 1.2 and 1.3 only): the stream is
//! wrapped before any door reads a byte, so every protocol served on the
//! port is served over TLS alike.
//!
//! A handshake is bounded in time (`handshake_timeout`) and in number: at
//! most `handshakes_max` are in progress per shard, further connections are
//! closed at once, so slow or stalled handshakes cannot hold a shard. With
//! a client CA, a client must present a certificate it signed; the
//! certificate's subject common name (the whole subject when it has none)
//! becomes the connection's role, as Pulsar's TLS authentication does.

use futures_rustls::TlsAcceptor;
use magnetar_core::Principal;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{RootCertStore, ServerConfig};
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// TLS settings of the broker port, shared by every shard.
#[derive(Clone)]
pub struct TlsSettings {
    pub acceptor: TlsAcceptor,
    /// The same configuration, for the HTTP door's tokio acceptor.
    pub server_config: Arc<ServerConfig>,
    /// Client certificates are required (and verified).
    pub client_certs: bool,
    /// Longest a handshake may take before the connection is closed.
    pub handshake_timeout: Duration,
    /// Handshakes in progress per shard, at most.
    pub handshakes_max: usize,
}

impl std::fmt::Debug for TlsSettings {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsSettings")
            .field("client_certs", &self.client_certs)
            .field("handshake_timeout", &self.handshake_timeout)
            .field("handshakes_max", &self.handshakes_max)
            .finish()
    }
}

/// Why the TLS settings could not be built.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("{path}: {reason}")]
    File { path: String, reason: String },
    #[error("TLS configuration: {0}")]
    Config(#[from] rustls::Error),
    #[error("client CA: {0}")]
    ClientCa(String),
}

fn certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |reason: String| TlsError::File { path: path.display().to_string(), reason };
    let certs: Vec<_> = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate in it".into()));
    }
    Ok(certs)
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

impl TlsSettings {
    /// Serves the certificate chain `cert` with the private key `key` (PEM
    /// files); with `client_ca`, requires client certificates it signed.
    pub fn from_pem_files(cert: &Path, key: &Path, client_ca: Option<&Path>) -> Result<Self, TlsError> {
        let chain = certs(cert)?;
        let key = PrivateKeyDer::from_pem_file(key)
            .map_err(|e| TlsError::File { path: key.display().to_string(), reason: e.to_string() })?;
        let builder = ServerConfig::builder_with_provider(provider())
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])?;
        let config = match client_ca {
            None => builder.with_no_client_auth().with_single_cert(chain, key)?,
            Some(ca) => {
                let mut roots = RootCertStore::empty();
                for c in certs(ca)? {
                    roots.add(c)?;
                }
                let verifier = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                    .build()
                    .map_err(|e| TlsError::ClientCa(e.to_string()))?;
                builder.with_client_cert_verifier(verifier).with_single_cert(chain, key)?
            }
        };
        let config = Arc::new(config);
        Ok(Self {
            acceptor: TlsAcceptor::from(config.clone()),
            server_config: config,
            client_certs: client_ca.is_some(),
            handshake_timeout: Duration::from_secs(10),
            handshakes_max: 64,
        })
    }
}

/// The role a verified client certificate names: its subject's common
/// name, or the whole subject when it has none. `Anonymous` without a
/// certificate (or one that does not parse, which the verifier would not
/// have accepted).
pub(crate) fn peer_principal(certs: Option<&[CertificateDer<'_>]>) -> Principal {
    let Some(leaf) = certs.and_then(|c| c.first()) else { return Principal::Anonymous };
    let Ok((_, cert)) = x509_parser::parse_x509_certificate(leaf.as_ref()) else { return Principal::Anonymous };
    let subject = cert.subject();
    let cn = subject.iter_common_name().next().and_then(|cn| cn.as_str().ok()).map(str::to_string);
    Principal::Role(cn.unwrap_or_else(|| subject.to_string()))
}

/// Counts one handshake in progress for as long as it lives.
pub(crate) struct HandshakeSlot(std::rc::Rc<std::cell::Cell<usize>>);

impl HandshakeSlot {
    /// A slot, unless `max` handshakes are already in progress.
    pub(crate) fn take(count: &std::rc::Rc<std::cell::Cell<usize>>, max: usize) -> Option<Self> {
        if count.get() >= max {
            return None;
        }
        count.set(count.get() + 1);
        Some(Self(count.clone()))
    }
}

impl Drop for HandshakeSlot {
    fn drop(&mut self) {
        // Each slot was counted once when taken.
        assert!(self.0.get() > 0, "more handshakes ended than began");
        self.0.set(self.0.get() - 1);
    }
}
