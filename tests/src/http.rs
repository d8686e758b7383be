//! A minimal HTTP/1.1 client (hyper's) for the broker's HTTP server.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper_util::rt::TokioIo;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

/// How long one request may take.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(30);

/// An answer: status, `Content-Type`, body text and every header.
#[derive(Debug, Clone)]
pub struct HttpAnswer {
    pub status: u16,
    pub content_type: String,
    pub body: String,
    /// The body's bytes as received (`body` is their lossy UTF-8 text).
    pub body_bytes: Vec<u8>,
    /// Names lowercased, in the order received.
    pub headers: Vec<(String, String)>,
}

impl HttpAnswer {
    /// The body as JSON; panics with the body when it is not.
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body).unwrap_or_else(|e| panic!("not JSON ({e}): {}", self.body))
    }

    /// The first header named `name` (any case).
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers.iter().find(|(k, _)| *k == name).map(|(_, v)| v.as_str())
    }
}

/// Sends one request on a new connection; panics on a transport error or
/// after [`HTTP_TIMEOUT`].
pub async fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> HttpAnswer {
    tokio::time::timeout(HTTP_TIMEOUT, try_request(addr, method, path, body, headers))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer within {HTTP_TIMEOUT:?}"))
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

async fn try_request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    body: Option<&str>,
    headers: &[(&str, &str)],
) -> Result<HttpAnswer, Box<dyn std::error::Error + Send + Sync>> {
    let stream = tokio::net::TcpStream::connect(addr).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(conn);
    let mut req = hyper::Request::builder().method(method).uri(path).header("host", addr.to_string());
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if body.is_some() {
        req = req.header("content-type", "application/json");
    }
    let req = req.body(Full::new(Bytes::from(body.unwrap_or("").to_string())))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let content_type = resp.headers().get("content-type").and_then(|v| v.to_str().ok()).unwrap_or("").to_string();
    let headers = resp
        .headers()
        .iter()
        .map(|(k, v)| (k.as_str().to_ascii_lowercase(), String::from_utf8_lossy(v.as_bytes()).into_owned()))
        .collect();
    let bytes = resp.into_body().collect().await?.to_bytes();
    let body = String::from_utf8_lossy(&bytes).into_owned();
    Ok(HttpAnswer { status, content_type, body, body_bytes: bytes.to_vec(), headers })
}

/// One sample of a scrape: its family's name, its labels (values as
/// written, escapes kept) and its value (a histogram's: its count).
#[derive(Debug, Clone)]
pub struct MetricSample {
    pub name: String,
    pub labels: HashMap<String, String>,
    pub value: f64,
}

/// Parses Prometheus' text format 0.0.4 with a grammar-based parser
/// (openmetrics-parser); panics with the parser's error when it does not.
pub fn parse_prometheus_text(text: &str) -> Vec<MetricSample> {
    use openmetrics_parser::PrometheusValue;
    let exposition = openmetrics_parser::prometheus::parse_prometheus(text)
        .unwrap_or_else(|e| panic!("the exposition does not parse: {e}"));
    let mut out = Vec::new();
    for (name, family) in &exposition.families {
        for sample in family.iter_samples() {
            let labels = sample
                .get_labelset()
                .map(|l| l.iter().map(|(k, v)| (k.clone(), v.clone())).collect())
                .unwrap_or_default();
            let value = match &sample.value {
                PrometheusValue::Unknown(n) | PrometheusValue::Gauge(n) => n.as_f64(),
                PrometheusValue::Counter(c) => c.value.as_f64(),
                PrometheusValue::Histogram(h) => h.count.unwrap_or(0) as f64,
                PrometheusValue::Summary(_) => continue,
            };
            out.push(MetricSample { name: name.clone(), labels, value });
        }
    }
    out
}
