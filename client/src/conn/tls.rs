//! TLS to the broker (rustls; TLS 1.2 and 1.3 only): the trust anchors
//! (`tls_ca`) and an optional client certificate, for `magnetar+tls://`
//! (and `pulsar+ssl://`) URLs or any connection whose options carry them.

use crate::error::{ClientError, Result};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use rustls::{ClientConfig, RootCertStore};
use std::path::Path;
use std::sync::Arc;

/// TLS settings of a client: built once, shared by all its connections.
#[derive(Clone)]
pub struct TlsOptions {
    config: Arc<ClientConfig>,
    /// The name the broker's certificate must carry; `None`: the host of
    /// the URL.
    pub server_name: Option<String>,
}

impl std::fmt::Debug for TlsOptions {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsOptions").field("server_name", &self.server_name).finish_non_exhaustive()
    }
}

fn tls_err(what: &Path, e: impl std::fmt::Display) -> ClientError {
    ClientError::Tls { reason: format!("{}: {e}", what.display()) }
}

impl TlsOptions {
    /// Trusts the CA certificates in the PEM file `ca`; with `cert` and
    /// `key` (PEM), presents that client certificate.
    pub fn from_pem_files(ca: &Path, client: Option<(&Path, &Path)>) -> Result<Self> {
        let mut roots = RootCertStore::empty();
        let mut n = 0;
        for c in CertificateDer::pem_file_iter(ca).map_err(|e| tls_err(ca, e))? {
            roots.add(c.map_err(|e| tls_err(ca, e))?).map_err(|e| tls_err(ca, e))?;
            n += 1;
        }
        if n == 0 {
            return Err(tls_err(ca, "no PEM certificate in it"));
        }
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = ClientConfig::builder_with_provider(provider)
            .with_protocol_versions(&[&rustls::version::TLS13, &rustls::version::TLS12])
            .map_err(|e| ClientError::Tls { reason: e.to_string() })?
            .with_root_certificates(roots);
        let config = match client {
            None => builder.with_no_client_auth(),
            Some((cert, key)) => {
                let chain: Vec<_> = CertificateDer::pem_file_iter(cert)
                    .map_err(|e| tls_err(cert, e))?
                    .collect::<std::result::Result<_, _>>()
                    .map_err(|e| tls_err(cert, e))?;
                let key = PrivateKeyDer::from_pem_file(key).map_err(|e| tls_err(key, e))?;
                builder.with_client_auth_cert(chain, key).map_err(|e| ClientError::Tls { reason: e.to_string() })?
            }
        };
        Ok(Self { config: Arc::new(config), server_name: None })
    }

    /// The TLS handshake over `stream`, checking the broker's certificate
    /// against `host` (or `server_name`).
    pub(crate) async fn connect(
        &self,
        host: &str,
        stream: tokio::net::TcpStream,
    ) -> Result<tokio_rustls::client::TlsStream<tokio::net::TcpStream>> {
        let name = self.server_name.as_deref().unwrap_or(host);
        let name = ServerName::try_from(name.to_string())
            .map_err(|e| ClientError::Tls { reason: format!("{name:?} is not a valid server name: {e}") })?;
        tokio_rustls::TlsConnector::from(self.config.clone())
            .connect(name, stream)
            .await
            .map_err(|e| ClientError::Tls { reason: format!("handshake with {host} failed: {e}") })
    }
}
