//! The HTTP door: `/metrics` (Prometheus), health and readiness probes and
//! a Pulsar-compatible REST admin under `/admin/v2/`.
//!
//! The server runs on its own thread with a small single-threaded tokio
//! runtime, never on a shard's executor: parsing requests, waiting for slow
//! clients and encoding answers cost the shards nothing. It reaches the
//! shards through one bounded channel per shard ([`HttpShards`]); on each
//! shard a task ([`HttpShards::serve_shard`]), in a task queue with few
//! shares, answers with plain values (metrics snapshots, admin replies)
//! taken from the shard's [`Broker`] handle. So every admin call goes
//! through the same core API as the native door's (and its checks).
//!
//! Bounds: connections (`connections_max`, the rest are closed at once),
//! request head bytes (`head_bytes_max`), body bytes (`body_bytes_max`), the
//! time to send a request head (`head_timeout`) and a body
//! (`body_timeout`), a connection's lifetime (`connection_lifetime_max`),
//! calls queued per shard (`shard_calls_max`) and the wait for a shard's
//! answer (`shard_answer_timeout`).
//!
//! Security (see `docs/security.md`): with `tls`, connections are TLS (the
//! broker port's certificate; the handshake bounded by `handshake_timeout`
//! and, as every connection, by `connections_max`). With `authentication`,
//! every `/admin/` request is authenticated ([`auth`]) and runs as its
//! caller's principal, which the core authorizes; the probes and
//! `/metrics` stay open, as Pulsar's are by default.

// Handlers return `Result<_, Response>` where `Err` is the answer to send:
// built at most once per request, so boxing it would buy nothing.
#![allow(clippy::result_large_err)]

mod auth;
mod console;
mod exposition;
mod rest;
mod shard_side;

pub use shard_side::HttpShards;

use bytes::Bytes;
use futures::channel::{mpsc, oneshot};
use futures::SinkExt;
use http_body_util::{BodyExt, Full, Limited};
use hyper::body::Incoming;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::{TokioIo, TokioTimer};
use magnetar_core::api::{AdminReply, AdminRequest, TopicMetrics, TopicStats};
use magnetar_core::auth::Authenticator;
use magnetar_core::metrics::ShardMetricsSnapshot;
use magnetar_core::{CoreError, Principal};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// The HTTP door's settings.
#[derive(Debug, Clone)]
pub struct HttpConfig {
    pub listen: SocketAddr,
    /// Connections served at once; more are closed when accepted.
    pub connections_max: usize,
    /// Bytes of a request's head (request line and headers).
    pub head_bytes_max: usize,
    /// Bytes of a request's body.
    pub body_bytes_max: usize,
    pub head_timeout: Duration,
    pub body_timeout: Duration,
    /// A connection is closed this long after it was accepted (a
    /// keep-alive client reconnects).
    pub connection_lifetime_max: Duration,
    /// Calls waiting for one shard's task.
    pub shard_calls_max: usize,
    pub shard_answer_timeout: Duration,
    /// Pulsar's `cluster` label and cluster name.
    pub cluster: String,
    /// `pulsar_*` series per topic (and subscription); false: per
    /// namespace, summed.
    pub topic_level_metrics: bool,
    /// Authenticate `/admin/` requests (`None`: everyone is anonymous and
    /// nothing is checked).
    pub authentication: Option<Arc<Authenticator>>,
    /// Serve HTTPS with these settings (`None`: plain HTTP).
    pub tls: Option<crate::tls::TlsSettings>,
}

impl HttpConfig {
    pub fn new(listen: SocketAddr) -> Self {
        Self {
            listen,
            connections_max: 64,
            head_bytes_max: 16 * 1024,
            body_bytes_max: 1024 * 1024,
            head_timeout: Duration::from_secs(10),
            body_timeout: Duration::from_secs(10),
            connection_lifetime_max: Duration::from_secs(120),
            shard_calls_max: 64,
            shard_answer_timeout: Duration::from_secs(30),
            cluster: "standalone".to_string(),
            topic_level_metrics: true,
            authentication: None,
            tls: None,
        }
    }
}

/// What the HTTP thread asks a shard's task for.
pub(crate) enum ShardCall {
    /// The shard's metrics and its topics': their figures (`series`
    /// `None`: the console) or their series written for a scrape.
    Metrics { series: Option<exposition::SeriesWanted>, reply: oneshot::Sender<ShardReport> },
    /// An admin operation (sent to shard 0, which runs them) for
    /// `principal`, which the core authorizes.
    Admin { request: AdminRequest, principal: Principal, reply: oneshot::Sender<Result<AdminReply, CoreError>> },
    /// A topic's statistics (any shard routes it to the owner).
    TopicStats { topic: String, principal: Principal, reply: oneshot::Sender<Result<TopicStats, CoreError>> },
    /// A produce and a consume through the broker (a superuser's call).
    Health { principal: Principal, reply: oneshot::Sender<Result<(), CoreError>> },
}

/// One shard's answer to [`ShardCall::Metrics`].
pub(crate) struct ShardReport {
    pub(crate) metrics: ShardMetricsSnapshot,
    /// The topics' figures (empty for a scrape).
    pub(crate) topics: Vec<TopicMetrics>,
    /// The topics' series written for a scrape (empty for the console).
    pub(crate) series: exposition::TopicSeries,
}

/// What every request handler shares.
pub(crate) struct Shared {
    pub(crate) config: HttpConfig,
    pub(crate) shards: Vec<mpsc::Sender<ShardCall>>,
    pub(crate) ready: Arc<AtomicBool>,
}

/// What a request's handler sees: the shared state, the connection's
/// peer and who the request acts for. Derefs to [`Shared`].
pub(crate) struct State {
    shared: Arc<Shared>,
    pub(crate) peer: SocketAddr,
    /// Who the transport proved the client is (a verified TLS client
    /// certificate's subject), else anonymous.
    pub(crate) transport: Principal,
    /// Who the request acts for: anonymous until authenticated.
    pub(crate) principal: Principal,
}

impl std::ops::Deref for State {
    type Target = Shared;
    fn deref(&self) -> &Shared {
        &self.shared
    }
}

/// Why a call to a shard got no answer.
#[derive(Debug)]
pub(crate) enum CallError {
    /// The shard's task is gone (shutting down) or not answering in time.
    Unavailable(String),
}

impl State {
    /// The same connection's state acting for `principal`.
    pub(crate) fn with_principal(&self, principal: Principal) -> State {
        State { shared: self.shared.clone(), peer: self.peer, transport: self.transport.clone(), principal }
    }

    /// Sends `make(reply)` to `shard` and waits for the answer.
    pub(crate) async fn call<T>(
        &self,
        shard: usize,
        make: impl FnOnce(oneshot::Sender<T>) -> ShardCall,
    ) -> Result<T, CallError> {
        let (tx, rx) = oneshot::channel();
        let mut sender = self.shards[shard].clone();
        let wait = self.config.shard_answer_timeout;
        let sent = tokio::time::timeout(wait, sender.send(make(tx))).await;
        match sent {
            Ok(Ok(())) => {}
            Ok(Err(_)) => return Err(CallError::Unavailable(format!("shard {shard} is not serving"))),
            Err(_) => return Err(CallError::Unavailable(format!("shard {shard} is busy"))),
        }
        match tokio::time::timeout(wait, rx).await {
            Ok(Ok(v)) => Ok(v),
            Ok(Err(_)) => Err(CallError::Unavailable(format!("shard {shard} dropped the call"))),
            Err(_) => Err(CallError::Unavailable(format!("shard {shard} did not answer in {wait:?}"))),
        }
    }

    pub(crate) async fn admin(&self, request: AdminRequest) -> Result<Result<AdminReply, CoreError>, CallError> {
        let principal = self.principal.clone();
        self.call(0, |reply| ShardCall::Admin { request, principal, reply }).await
    }

    pub(crate) fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }
}

/// The running HTTP server: its thread, its address and the readiness
/// flag the probes answer from.
pub struct HttpServer {
    addr: SocketAddr,
    ready: Arc<AtomicBool>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpServer {
    /// Binds `config.listen` now (so a bad address fails the start) and
    /// serves from a thread of its own. Requests needing the shards wait
    /// on their channels until each shard runs [`HttpShards::serve_shard`];
    /// the probes say "not ready" until [`set_ready`](Self::set_ready).
    pub fn start(config: HttpConfig, shards: u32) -> std::io::Result<(HttpServer, HttpShards)> {
        let listener = std::net::TcpListener::bind(config.listen)?;
        listener.set_nonblocking(true)?;
        let addr = listener.local_addr()?;
        let (senders, inbox) = shard_side::channels(shards, config.shard_calls_max);
        let ready = Arc::new(AtomicBool::new(false));
        let state = Arc::new(Shared { config, shards: senders, ready: ready.clone() });
        let (stop_tx, stop_rx) = tokio::sync::oneshot::channel();
        let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
        let thread = std::thread::Builder::new().name("http".into()).spawn(move || {
            lower_this_threads_priority();
            runtime.block_on(async move {
                let listener = match tokio::net::TcpListener::from_std(listener) {
                    Ok(l) => l,
                    Err(e) => {
                        tracing::error!("http listener: {e}");
                        return;
                    }
                };
                tokio::select! {
                    _ = accept_loop(listener, state) => {}
                    _ = stop_rx => {}
                }
            });
        })?;
        tracing::info!(%addr, "http listening");
        Ok((HttpServer { addr, ready, stop: Some(stop_tx), thread: Some(thread) }, inbox))
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Recovery finished and every shard serves: readiness probes say 200.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Stops serving and joins the thread.
    pub fn stop(mut self) {
        self.stop_now();
    }

    fn stop_now(&mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.stop_now();
    }
}

/// Nice value of the HTTP thread. The shards' threads run at the default 0:
/// where they are pinned to every CPU, encoding a large scrape competes
/// with them for a CPU, and the scheduler then favours the shards (at nice
/// 10, about 10 times the weight).
const HTTP_THREAD_NICE: i32 = 10;

fn lower_this_threads_priority() {
    // SAFETY: neither call takes a pointer; on Linux, PRIO_PROCESS with a
    // thread id changes that one thread's nice value.
    #[allow(unsafe_code)]
    let r = unsafe { libc::setpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t, HTTP_THREAD_NICE) };
    if r != 0 {
        tracing::warn!("cannot lower the http thread's priority: {}", std::io::Error::last_os_error());
    }
}

async fn accept_loop(listener: tokio::net::TcpListener, state: Arc<Shared>) {
    let permits = Arc::new(tokio::sync::Semaphore::new(state.config.connections_max));
    loop {
        let (stream, peer) = match listener.accept().await {
            Ok(x) => x,
            Err(e) => {
                tracing::warn!("http accept failed: {e}");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tracing::warn!(%peer, "http connection limit reached; closing a new connection");
            continue;
        };
        let state = state.clone();
        tokio::spawn(async move {
            let _ = stream.set_nodelay(true);
            let lifetime = state.config.connection_lifetime_max;
            let conn = State { shared: state, peer, transport: Principal::Anonymous, principal: Principal::Anonymous };
            // The TLS handshake counts in the connection's lifetime, and
            // the permit bounds handshakes in progress with connections.
            let _ = tokio::time::timeout(lifetime, serve_connection(conn, stream)).await;
            drop(permit);
        });
    }
}

/// One connection: its TLS handshake (within `head_timeout`) when the
/// server has TLS, then its requests.
async fn serve_connection(mut conn: State, stream: tokio::net::TcpStream) {
    let Some(tls) = conn.config.tls.clone() else {
        serve_requests(conn, TokioIo::new(stream)).await;
        return;
    };
    let acceptor = tokio_rustls::TlsAcceptor::from(tls.server_config.clone());
    let stream = match tokio::time::timeout(tls.handshake_timeout, acceptor.accept(stream)).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => {
            tracing::info!(peer = %conn.peer, "http TLS handshake failed: {e}");
            return;
        }
        Err(_) => {
            tracing::info!(peer = %conn.peer, "http TLS handshake not done in {:?}; closing", tls.handshake_timeout);
            return;
        }
    };
    conn.transport = crate::tls::peer_principal(stream.get_ref().1.peer_certificates());
    serve_requests(conn, TokioIo::new(stream)).await;
}

async fn serve_requests<S>(conn: State, io: TokioIo<S>)
where
    S: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (head_timeout, head_bytes) = (conn.config.head_timeout, conn.config.head_bytes_max);
    let conn = Arc::new(conn);
    let service = hyper::service::service_fn(move |req| {
        let state = conn.clone();
        async move { Ok::<_, std::convert::Infallible>(handle(&state, req).await) }
    });
    let _ = hyper::server::conn::http1::Builder::new()
        .timer(TokioTimer::new())
        .header_read_timeout(head_timeout)
        .max_buf_size(head_bytes.max(8192))
        .serve_connection(io, service)
        .await;
}

pub(crate) type Body = Full<Bytes>;

/// A JSON answer.
pub(crate) fn json(status: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::from(value.to_string())));
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static("application/json"));
    r
}

/// Pulsar's error body: `{"reason": "..."}`.
pub(crate) fn error(status: StatusCode, reason: impl Into<String>) -> Response<Body> {
    json(status, &serde_json::json!({ "reason": reason.into() }))
}

pub(crate) fn text(status: StatusCode, content_type: &'static str, body: impl Into<Bytes>) -> Response<Body> {
    let mut r = Response::new(Full::new(body.into()));
    *r.status_mut() = status;
    r.headers_mut().insert(hyper::header::CONTENT_TYPE, hyper::header::HeaderValue::from_static(content_type));
    r
}

pub(crate) fn no_content() -> Response<Body> {
    let mut r = Response::new(Full::new(Bytes::new()));
    *r.status_mut() = StatusCode::NO_CONTENT;
    r
}

impl CallError {
    pub(crate) fn response(self) -> Response<Body> {
        match self {
            CallError::Unavailable(why) => error(StatusCode::SERVICE_UNAVAILABLE, why),
        }
    }
}

/// Reads the body within its bounds: `Err` is the answer to give.
pub(crate) async fn read_body(state: &State, body: Incoming) -> Result<Bytes, Response<Body>> {
    let limited = Limited::new(body, state.config.body_bytes_max);
    match tokio::time::timeout(state.config.body_timeout, limited.collect()).await {
        Ok(Ok(collected)) => Ok(collected.to_bytes()),
        Ok(Err(e)) if e.downcast_ref::<http_body_util::LengthLimitError>().is_some() => Err(error(
            StatusCode::PAYLOAD_TOO_LARGE,
            format!("request body larger than {} bytes", state.config.body_bytes_max),
        )),
        Ok(Err(e)) => Err(error(StatusCode::BAD_REQUEST, format!("reading the body: {e}"))),
        Err(_) => Err(error(StatusCode::REQUEST_TIMEOUT, "request body not received in time")),
    }
}

/// The router: one place maps a method and path to its handler, so new
/// endpoints (a web console's) are one arm each.
async fn handle(state: &State, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    let segments: Vec<&str> = path.trim_matches('/').split('/').filter(|s| !s.is_empty()).collect();
    match (req.method(), segments.as_slice()) {
        (&Method::GET, ["healthz"]) => text(StatusCode::OK, "text/plain", "ok\n"),
        (&Method::GET, ["ready"]) | (&Method::GET, ["admin", "v2", "brokers", "ready"]) => {
            if state.is_ready() {
                text(StatusCode::OK, "text/plain", "ok\n")
            } else {
                error(StatusCode::SERVICE_UNAVAILABLE, "the broker is starting (recovery not finished)")
            }
        }
        (&Method::GET, ["metrics"]) | (&Method::GET, ["metrics", ""]) => {
            let accept =
                req.headers().get(hyper::header::ACCEPT).and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
            exposition::scrape(state, &accept).await
        }
        (&Method::GET, []) => console::asset("text/html; charset=utf-8", console::INDEX_HTML),
        (&Method::GET, ["console", "app.js"]) => console::asset("text/javascript", console::APP_JS),
        (&Method::GET, ["console", "api.js"]) => console::asset("text/javascript", console::API_JS),
        (&Method::GET, ["console", "chart.js"]) => console::asset("text/javascript", console::CHART_JS),
        (&Method::GET, ["console", "style.css"]) => console::asset("text/css", console::STYLE_CSS),
        (_, ["admin", "v2", tail @ ..]) => {
            let caller = match auth::authenticate(state, &req) {
                Ok(c) => c,
                Err(refused) => return refused,
            };
            let method = req.method().clone();
            let response = match (&method, tail) {
                // The console's data: admin paths, authenticated like the
                // rest of `admin/v2` (the page and its scripts above hold no
                // data and stay open: they ask for the token).
                (&Method::GET, ["magnetar", "overview"]) => console::overview(&caller).await,
                (&Method::GET, ["magnetar", "topics"]) => console::topics(&caller, req.uri().query()).await,
                (&Method::GET, ["magnetar", "find"]) => console::find(&caller, req.uri().query()).await,
                _ => {
                    let segments: Vec<String> = tail.iter().map(|s| percent_decode(s)).collect();
                    rest::handle(&caller, req, segments).await
                }
            };
            auth::log_denied(&caller, &method, &path, &response);
            response
        }
        (_, ["healthz"] | ["ready"] | ["metrics"]) => error(StatusCode::METHOD_NOT_ALLOWED, "only GET"),
        _ => error(StatusCode::NOT_FOUND, format!("no such path: {path}")),
    }
}

/// `%XX` escapes of a path segment decoded (bad escapes kept as they are).
fn percent_decode(s: &str) -> String {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' && i + 2 < b.len() {
            let hex = std::str::from_utf8(&b[i + 1..i + 3]).ok().and_then(|h| u8::from_str_radix(h, 16).ok());
            if let Some(v) = hex {
                out.push(v);
                i += 3;
                continue;
            }
        }
        out.push(b[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    #[test]
    fn percent_decoding() {
        assert_eq!(super::percent_decode("a%20b"), "a b");
        assert_eq!(super::percent_decode("a%2"), "a%2");
        assert_eq!(super::percent_decode("%41"), "A");
        assert_eq!(super::percent_decode("%zz"), "%zz");
    }
}
