//! Pulsar's token refresh on a live connection (PIP-55, the broker's
//! `ServerCnx`): when the token a connection authenticated with expires,
//! the broker sends AUTH_CHALLENGE; the client answers AUTH_RESPONSE with
//! fresh credentials (the C++ and Java clients ask their token supplier
//! again). A valid answer for the same role keeps the connection (until
//! the new token's `exp`); an invalid one, a different role, no answer
//! within [`ANSWER_TIMEOUT`], or a client that cannot refresh
//! (`supports_auth_refresh` not set in CONNECT) closes it. The role never
//! changes on a connection, so what it was authorized for stays right.

use super::{command, error_command, push, PulsarDoor};
use crate::session::Outbox;
use magnetar_core::auth::{token_expiry, Authenticator, AUTH_METHOD_TOKEN};
use magnetar_core::Principal;
use magnetar_pulsar_wire::proto as pb;
use magnetar_pulsar_wire::proto::base_command::Type;
use std::cell::{Cell, RefCell};
use std::rc::{Rc, Weak};
use std::sync::Arc;
use std::time::Duration;

/// How long the client has to answer an AUTH_CHALLENGE (Pulsar checks
/// again after `authenticationRefreshCheckSeconds`, 60 by default).
pub(crate) const ANSWER_TIMEOUT: Duration = Duration::from_secs(30);

/// The auth data of Pulsar's refresh challenge.
const REFRESH_AUTH_DATA: &[u8] = b"PulsarAuthRefresh";

/// A connection's token state, in its door.
#[derive(Default)]
pub(crate) struct TokenState {
    /// The role the connection authenticated as.
    role: RefCell<Option<String>>,
    /// The current token's `exp` (seconds since the epoch).
    expires: Cell<Option<u64>>,
    /// An AUTH_CHALLENGE is unanswered.
    pending: Cell<bool>,
}

fn now_s() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs())
}

/// After CONNECT authenticated `role` with a token (`data`): watches its
/// expiry while the connection lives.
pub(crate) fn watch(out: &Rc<Outbox<PulsarDoor>>, role: &Principal, data: &[u8], refresh: bool) {
    let (Principal::Role(role), Some(exp)) = (role, token_expiry(data)) else { return };
    let state = &out.door().tokens;
    *state.role.borrow_mut() = Some(role.clone());
    state.expires.set(Some(exp));
    let weak = Rc::downgrade(out);
    glommio::spawn_local(run(weak, refresh)).detach();
}

async fn run(weak: Weak<Outbox<PulsarDoor>>, refresh: bool) {
    loop {
        let Some(exp) = weak.upgrade().and_then(|o| o.door().tokens.expires.get()) else { return };
        // A token is valid through its `exp` second (the authenticator's
        // rule): challenge once that second is over, so that the old
        // token cannot answer and the loop never spins.
        let left = (exp + 1).saturating_sub(now_s());
        if left > 0 {
            glommio::timer::sleep(Duration::from_secs(left)).await;
            continue;
        }
        let Some(out) = weak.upgrade() else { return };
        if !refresh {
            out.control.kill("its token expired and the client cannot refresh it (no supports_auth_refresh)".into());
            return;
        }
        out.door().tokens.pending.set(true);
        let challenge = command(Type::AuthChallenge, |c| {
            c.auth_challenge = Some(pb::CommandAuthChallenge {
                server_version: Some(concat!("magnetar/", env!("CARGO_PKG_VERSION")).to_string()),
                challenge: Some(pb::AuthData {
                    auth_method_name: Some(AUTH_METHOD_TOKEN.to_string()),
                    auth_data: Some(REFRESH_AUTH_DATA.to_vec()),
                }),
                protocol_version: Some(out.door().client_version.get()),
            })
        });
        out.put("an AUTH_CHALLENGE", |_, dst| push(dst, &challenge));
        drop(out);
        glommio::timer::sleep(ANSWER_TIMEOUT).await;
        let Some(out) = weak.upgrade() else { return };
        if out.door().tokens.pending.get() {
            out.control.kill(format!("its token expired and AUTH_CHALLENGE got no valid answer in {ANSWER_TIMEOUT:?}"));
            return;
        }
    }
}

/// An AUTH_RESPONSE: `Ok` when it renews the connection's token (same
/// role); `Err` the reason to close the connection (the client is told
/// `AuthenticationError` first).
pub(crate) fn answer(
    out: &Rc<Outbox<PulsarDoor>>,
    auth: Option<&Arc<Authenticator>>,
    method: &str,
    data: &[u8],
) -> Result<(), String> {
    let state = &out.door().tokens;
    let refuse = |why: String| {
        let e = error_command(0, pb::ServerError::AuthenticationError, format!("authentication refresh failed: {why}"));
        out.put("a refusal", |_, dst| push(dst, &e));
        Err(format!("authentication refresh refused: {why}"))
    };
    let Some(auth) = auth else { return refuse("this broker has no authentication".into()) };
    let expected = state.role.borrow().clone();
    match auth.authenticate(method, data, &Principal::Anonymous) {
        Ok(Principal::Role(role)) if Some(&role) == expected.as_ref() => {
            state.expires.set(token_expiry(data));
            state.pending.set(false);
            tracing::info!(peer = %out.control.peer, role, "token refreshed");
            Ok(())
        }
        Ok(_) => refuse("the new credentials name another role (a connection keeps its role)".into()),
        Err(e) => refuse(e.to_string()),
    }
}
