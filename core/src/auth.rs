//! Authentication: who a connection is, from what its handshake carries.
//!
//! Protocol-neutral: a door hands [`Authenticator::authenticate`] the auth
//! method and data its handshake carried (native `Connect`, Pulsar's
//! `CONNECT`, an HTTP `Authorization: Bearer` header) and the principal the
//! transport already proved (a TLS client certificate's subject), and gets
//! back the [`Principal`] every later request is authorized against, or a
//! typed [`AuthError`] to answer the client with. Nothing here knows a
//! socket or a protocol format.
//!
//! Tokens are compatible with Apache Pulsar's: a JWT signed with HS256 (a
//! secret key file) or RS256 / ES256 (a public key file, PEM), whose `sub`
//! claim is the role; `exp`, when present, is honoured. A secret key file
//! holds the raw key bytes (as Pulsar's), or `base64:` and the key in
//! base64.
//!
//! Shared (immutably, behind an `Arc`) by every shard.

use crate::api::Principal;
use base64::Engine as _;
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};
use std::path::Path;

/// The auth method of a JWT, as Pulsar names it.
pub const AUTH_METHOD_TOKEN: &str = "token";

/// Longest token accepted, in bytes: the decoder never works on more.
pub const TOKEN_BYTES_MAX: usize = 16 * 1024;

/// Why a handshake's credentials were refused. The text never contains
/// the token.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("authentication is required: send a token (auth method \"token\") or a TLS client certificate")]
    Missing,
    #[error("unsupported auth method {0:?} (this broker accepts \"token\")")]
    UnsupportedMethod(String),
    #[error("the token has expired")]
    Expired,
    #[error("the token's signature does not verify with this broker's key")]
    BadSignature,
    #[error("the token is signed with {0:?}, which this broker's key does not verify")]
    WrongAlgorithm(String),
    #[error("malformed token: {0}")]
    Malformed(String),
    #[error("the token has no subject (sub claim): it names no role")]
    NoSubject,
}

/// Why the broker's own key could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read {path}: {source}")]
    Read { path: String, source: std::io::Error },
    #[error("{path}: {reason}")]
    Bad { path: String, reason: String },
}

/// How a token's signature is checked.
#[derive(Clone)]
struct TokenVerifier {
    key: DecodingKey,
    algorithms: Vec<Algorithm>,
}

/// Decides who a connection is. Immutable once built; see the module
/// documentation.
#[derive(Clone, Default)]
pub struct Authenticator {
    token: Option<TokenVerifier>,
    /// TLS client certificates are verified by the transport: their
    /// subject is a role.
    tls_client_certs: bool,
    /// The role of a client that presents no credentials; `None`: such a
    /// client is refused.
    anonymous_role: Option<String>,
}

impl std::fmt::Debug for Authenticator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticator")
            .field("token_algorithms", &self.token.as_ref().map(|t| t.algorithms.clone()))
            .field("tls_client_certs", &self.tls_client_certs)
            .field("anonymous_role", &self.anonymous_role)
            .finish()
    }
}

fn read(path: &Path) -> Result<Vec<u8>, KeyError> {
    std::fs::read(path).map_err(|source| KeyError::Read { path: path.display().to_string(), source })
}

/// The bytes of an HS256 secret key file: its raw bytes, as Pulsar reads
/// a key file, or, for text starting `base64:`, the base64 that follows.
pub fn secret_key_bytes(file: &[u8]) -> Vec<u8> {
    if let Some(b64) = file.strip_prefix(b"base64:") {
        let text = String::from_utf8_lossy(b64);
        if let Ok(raw) = base64::engine::general_purpose::STANDARD.decode(text.trim()) {
            return raw;
        }
    }
    file.to_vec()
}

impl Authenticator {
    /// No authentication method yet: every client is refused unless an
    /// anonymous role is set.
    pub fn new() -> Self {
        Self::default()
    }

    /// HS256 tokens signed with the secret key in `path`.
    pub fn with_secret_key_file(mut self, path: &Path) -> Result<Self, KeyError> {
        let key = secret_key_bytes(&read(path)?);
        if key.is_empty() {
            return Err(KeyError::Bad { path: path.display().to_string(), reason: "the key is empty".into() });
        }
        self.token = Some(TokenVerifier { key: DecodingKey::from_secret(&key), algorithms: vec![Algorithm::HS256] });
        Ok(self)
    }

    /// RS256 or ES256 tokens, checked with the PEM public key in `path`
    /// (which of the two follows from the key).
    pub fn with_public_key_file(mut self, path: &Path) -> Result<Self, KeyError> {
        let pem = read(path)?;
        let bad = |reason: String| KeyError::Bad { path: path.display().to_string(), reason };
        let verifier = if let Ok(key) = DecodingKey::from_rsa_pem(&pem) {
            TokenVerifier { key, algorithms: vec![Algorithm::RS256] }
        } else if let Ok(key) = DecodingKey::from_ec_pem(&pem) {
            TokenVerifier { key, algorithms: vec![Algorithm::ES256] }
        } else {
            return Err(bad("not a PEM RSA or EC (P-256) public key".into()));
        };
        self.token = Some(verifier);
        Ok(self)
    }

    /// Accept TLS client certificates (verified by the transport) as roles.
    pub fn with_tls_client_certs(mut self) -> Self {
        self.tls_client_certs = true;
        self
    }

    /// A client with no credentials gets `role`.
    pub fn with_anonymous_role(mut self, role: Option<String>) -> Self {
        self.anonymous_role = role;
        self
    }

    /// Who the client is. `method` and `data` are what its handshake
    /// carried (empty method: nothing); `transport` is who the transport
    /// proved it is (a verified TLS client certificate's subject), else
    /// [`Principal::Anonymous`]. Credentials in the handshake win over the
    /// transport's.
    pub fn authenticate(&self, method: &str, data: &[u8], transport: &Principal) -> Result<Principal, AuthError> {
        match method {
            "" | "none" => match transport {
                Principal::Role(_) if self.tls_client_certs => Ok(transport.clone()),
                _ => self.anonymous_role.clone().map(Principal::Role).ok_or(AuthError::Missing),
            },
            AUTH_METHOD_TOKEN if self.token.is_some() => self.verify_token(data),
            // Pulsar clients with a TLS client certificate name this method.
            "tls" if self.tls_client_certs && matches!(transport, Principal::Role(_)) => Ok(transport.clone()),
            other => Err(AuthError::UnsupportedMethod(other.chars().take(64).collect())),
        }
    }

    /// The role a token names, after checking its signature and expiry.
    pub fn verify_token(&self, data: &[u8]) -> Result<Principal, AuthError> {
        let Some(verifier) = &self.token else { return Err(AuthError::UnsupportedMethod(AUTH_METHOD_TOKEN.into())) };
        if data.len() > TOKEN_BYTES_MAX {
            return Err(AuthError::Malformed(format!("longer than {TOKEN_BYTES_MAX} bytes")));
        }
        let token = std::str::from_utf8(data).map_err(|_| AuthError::Malformed("not UTF-8 text".into()))?.trim();
        let header = jsonwebtoken::decode_header(token).map_err(|e| AuthError::Malformed(e.to_string()))?;
        if !verifier.algorithms.contains(&header.alg) {
            return Err(AuthError::WrongAlgorithm(format!("{:?}", header.alg)));
        }
        let mut validation = Validation::new(header.alg);
        // Pulsar's tokens need not expire; `exp` is checked when present.
        validation.required_spec_claims.clear();
        validation.validate_exp = true;
        validation.leeway = 0;
        validation.validate_aud = false;
        let claims = jsonwebtoken::decode::<Claims>(token, &verifier.key, &validation).map_err(|e| {
            use jsonwebtoken::errors::ErrorKind;
            match e.kind() {
                ErrorKind::ExpiredSignature => AuthError::Expired,
                ErrorKind::InvalidSignature => AuthError::BadSignature,
                _ => AuthError::Malformed(e.to_string()),
            }
        })?;
        match claims.claims.sub {
            Some(sub) if !sub.is_empty() => Ok(Principal::Role(sub)),
            _ => Err(AuthError::NoSubject),
        }
    }
}

/// The claims of a token: `sub` is the role; `exp` (seconds since the
/// epoch) is optional.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Claims {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub sub: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exp: Option<u64>,
}

/// Which key signs a new token.
pub enum SigningKey {
    /// HS256 with these secret bytes.
    Secret(Vec<u8>),
    /// RS256 or ES256 (from the key) with this PEM private key.
    PrivatePem(Vec<u8>),
}

/// A token for `subject`, expiring at `exp` (seconds since the epoch) when
/// given: what `magnetar tokens create` prints.
pub fn create_token(key: &SigningKey, subject: &str, exp: Option<u64>) -> Result<String, String> {
    let claims = Claims { sub: Some(subject.to_string()), exp };
    let (alg, key) = match key {
        SigningKey::Secret(s) => (Algorithm::HS256, EncodingKey::from_secret(s)),
        SigningKey::PrivatePem(pem) => {
            if let Ok(k) = EncodingKey::from_rsa_pem(pem) {
                (Algorithm::RS256, k)
            } else if let Ok(k) = EncodingKey::from_ec_pem(pem) {
                (Algorithm::ES256, k)
            } else {
                return Err("not a PEM RSA or EC (P-256, PKCS#8) private key".into());
            }
        }
    };
    jsonwebtoken::encode(&Header::new(alg), &claims, &key).map_err(|e| e.to_string())
}

/// The `exp` claim (seconds since the epoch) of a token that
/// [`Authenticator::verify_token`] accepted: when a connection that
/// authenticated with it must authenticate again. `None`: it never expires.
pub fn token_expiry(data: &[u8]) -> Option<u64> {
    let token = std::str::from_utf8(data).ok()?;
    let (_, claims) = show_token(token).ok()?;
    serde_json::from_str::<Claims>(&claims).ok()?.exp
}

/// A token's header and claims, unverified (`magnetar tokens show`).
pub fn show_token(token: &str) -> Result<(String, String), String> {
    let mut parts = token.trim().split('.');
    let mut part = |what: &str| -> Result<String, String> {
        let p = parts.next().ok_or_else(|| format!("no {what}: a JWT is HEADER.CLAIMS.SIGNATURE"))?;
        let raw = base64::engine::general_purpose::URL_SAFE_NO_PAD
            .decode(p.trim_end_matches('='))
            .map_err(|e| format!("{what} is not base64url: {e}"))?;
        String::from_utf8(raw).map_err(|_| format!("{what} is not UTF-8"))
    };
    Ok((part("header")?, part("claims")?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hs(secret: &[u8]) -> Authenticator {
        Authenticator {
            token: Some(TokenVerifier { key: DecodingKey::from_secret(secret), algorithms: vec![Algorithm::HS256] }),
            ..Authenticator::default()
        }
    }

    fn now() -> u64 {
        std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
    }

    #[test]
    fn a_token_names_its_role_and_bad_ones_are_refused_with_their_reason() {
        let a = hs(b"secret-1");
        let good = create_token(&SigningKey::Secret(b"secret-1".to_vec()), "app", Some(now() + 60)).unwrap();
        assert_eq!(a.authenticate("token", good.as_bytes(), &Principal::Anonymous), Ok(Principal::Role("app".into())));
        let forever = create_token(&SigningKey::Secret(b"secret-1".to_vec()), "ops", None).unwrap();
        assert_eq!(a.verify_token(forever.as_bytes()), Ok(Principal::Role("ops".into())));
        let expired = create_token(&SigningKey::Secret(b"secret-1".to_vec()), "app", Some(now() - 5)).unwrap();
        assert_eq!(a.verify_token(expired.as_bytes()), Err(AuthError::Expired));
        assert_eq!(token_expiry(expired.as_bytes()), Some(now() - 5));
        assert_eq!(token_expiry(forever.as_bytes()), None);
        let other = create_token(&SigningKey::Secret(b"secret-2".to_vec()), "app", None).unwrap();
        assert_eq!(a.verify_token(other.as_bytes()), Err(AuthError::BadSignature));
        assert!(matches!(a.verify_token(b"not a jwt"), Err(AuthError::Malformed(_))));
        assert!(matches!(a.verify_token(&[0xff, 0xfe]), Err(AuthError::Malformed(_))));
        assert!(matches!(a.verify_token(&vec![b'a'; TOKEN_BYTES_MAX + 1]), Err(AuthError::Malformed(_))));
        let no_sub = jsonwebtoken::encode(
            &Header::new(Algorithm::HS256),
            &Claims { sub: None, exp: None },
            &EncodingKey::from_secret(b"secret-1"),
        )
        .unwrap();
        assert_eq!(a.verify_token(no_sub.as_bytes()), Err(AuthError::NoSubject));
        // The error text never carries the token.
        for bad in [expired, other] {
            let e = a.verify_token(bad.as_bytes()).unwrap_err().to_string();
            assert!(!e.contains(&bad), "{e}");
        }
    }

    #[test]
    fn no_credentials_get_the_anonymous_role_or_are_refused() {
        let a = hs(b"k");
        assert_eq!(a.authenticate("", b"", &Principal::Anonymous), Err(AuthError::Missing));
        assert_eq!(
            a.authenticate("basic", b"x", &Principal::Anonymous),
            Err(AuthError::UnsupportedMethod("basic".into()))
        );
        let anon = hs(b"k").with_anonymous_role(Some("guest".into()));
        assert_eq!(anon.authenticate("", b"", &Principal::Anonymous), Ok(Principal::Role("guest".into())));
        // A certificate's subject counts only when client certificates are on.
        let cert = Principal::Role("CN=client".into());
        assert_eq!(a.authenticate("", b"", &cert), Err(AuthError::Missing));
        let tls = Authenticator::new().with_tls_client_certs();
        assert_eq!(tls.authenticate("", b"", &cert), Ok(cert.clone()));
        assert_eq!(tls.authenticate("tls", b"", &cert), Ok(cert));
    }

    #[test]
    fn secret_key_files_hold_raw_bytes_or_base64() {
        assert_eq!(secret_key_bytes(b"base64:AAEC\n"), vec![0, 1, 2]);
        assert_eq!(secret_key_bytes(b"AAEC"), b"AAEC".to_vec());
        assert_eq!(secret_key_bytes(&[0xff, 0x00, 0x10]), vec![0xff, 0x00, 0x10]);
    }
}
