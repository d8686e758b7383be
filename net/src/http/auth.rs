//! Who an HTTP request is, with authentication on: the same core
//! authenticator as the native and Pulsar doors, fed from the request's
//! headers. Authorization is not decided here: every admin call carries the
//! caller's principal to the core, which checks it as it does for the other
//! doors.
//!
//! Headers, as Pulsar's HTTP clients send them: `Authorization: Bearer
//! TOKEN` (auth method `token`), optionally with `X-Pulsar-Auth-Method-Name`
//! naming the method (`token`; `tls` to use the verified client certificate
//! of the connection). No credentials: the anonymous role if one is
//! configured, else 401.
//!
//! Answers: a refused authentication is 401 with Pulsar's JSON error body
//! and `WWW-Authenticate: Bearer`; a denied operation is the core's
//! `AuthorizationError`, answered 403 by the REST layer. Both are logged
//! with the peer and the reason, never the token.

use super::{error, Body, State};
use hyper::{Request, Response, StatusCode};
use magnetar_core::Principal;

/// The header Pulsar's HTTP clients name their auth method in.
const PULSAR_AUTH_METHOD_HEADER: &str = "x-pulsar-auth-method-name";

/// The auth method and data a request's headers carry (`""` method:
/// none). `Err`: a header that is not text.
fn credentials<B>(req: &Request<B>) -> Result<(String, Vec<u8>), &'static str> {
    let headers = req.headers();
    let named = match headers.get(PULSAR_AUTH_METHOD_HEADER) {
        Some(v) => Some(v.to_str().map_err(|_| "the auth method header is not text")?.trim().to_string()),
        None => None,
    };
    let (method, data) = match headers.get(hyper::header::AUTHORIZATION) {
        None => (String::new(), Vec::new()),
        Some(v) => {
            let v = v.to_str().map_err(|_| "the Authorization header is not text")?.trim();
            let (scheme, rest) = v.split_once(' ').unwrap_or((v, ""));
            if scheme.eq_ignore_ascii_case("bearer") {
                (magnetar_core::auth::AUTH_METHOD_TOKEN.to_string(), rest.trim().as_bytes().to_vec())
            } else {
                // Basic and the like: an unsupported method, by name.
                (scheme.to_ascii_lowercase(), Vec::new())
            }
        }
    };
    Ok(match named {
        Some(m) if !m.is_empty() => (m, data),
        _ => (method, data),
    })
}

/// The request's caller: `Ok` is `state` acting for it (unchanged when
/// authentication is off), `Err` the 401 to answer.
pub(super) fn authenticate<B>(state: &State, req: &Request<B>) -> Result<State, Response<Body>> {
    let Some(auth) = &state.config.authentication else { return Ok(state.with_principal(Principal::Anonymous)) };
    let peer = state.peer;
    let refused = |why: String| {
        tracing::info!(%peer, "http authentication refused: {why}");
        let mut r = error(StatusCode::UNAUTHORIZED, format!("authentication failed: {why}"));
        r.headers_mut().insert(hyper::header::WWW_AUTHENTICATE, hyper::header::HeaderValue::from_static("Bearer"));
        r
    };
    let (method, data) = credentials(req).map_err(|why| refused(why.to_string()))?;
    match auth.authenticate(&method, &data, &state.transport) {
        Ok(principal) => Ok(state.with_principal(principal)),
        Err(e) => Err(refused(e.to_string())),
    }
}

/// Logs a request the core denied (403): peer, role and what was asked.
pub(super) fn log_denied(state: &State, method: &hyper::Method, path: &str, response: &Response<Body>) {
    if response.status() == StatusCode::FORBIDDEN {
        let role = match &state.principal {
            Principal::Role(r) => r.as_str(),
            Principal::Anonymous => "(anonymous)",
        };
        tracing::info!(peer = %state.peer, role, "http request denied: {method} {path} is not authorized");
    }
}

#[cfg(test)]
mod tests {
    use super::credentials;
    use hyper::Request;

    fn req(headers: &[(&str, &str)]) -> Request<()> {
        let mut b = Request::builder().uri("/admin/v2/tenants");
        for (k, v) in headers {
            b = b.header(*k, *v);
        }
        b.body(()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn bearer_tokens_and_pulsars_method_header_are_read() {
        assert_eq!(credentials(&req(&[])), Ok((String::new(), Vec::new())));
        assert_eq!(
            credentials(&req(&[("Authorization", "Bearer abc.def")])),
            Ok(("token".into(), b"abc.def".to_vec()))
        );
        assert_eq!(credentials(&req(&[("authorization", "bearer  x ")])), Ok(("token".into(), b"x".to_vec())));
        assert_eq!(
            credentials(&req(&[("Authorization", "Bearer t"), ("X-Pulsar-Auth-Method-Name", "token")])),
            Ok(("token".into(), b"t".to_vec()))
        );
        assert_eq!(credentials(&req(&[("X-Pulsar-Auth-Method-Name", "tls")])), Ok(("tls".into(), Vec::new())));
        assert_eq!(credentials(&req(&[("Authorization", "Basic dTpw")])), Ok(("basic".into(), Vec::new())));
    }
}
