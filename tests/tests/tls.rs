//! Goal: TLS on the broker port (issue #20): the SDK produces and consumes
//! over `magnetar+tls://` trusting a test CA; `openssl s_client` completes
//! a verified handshake; a plain-text client to the TLS port gets an error,
//! not a hang; with `--tls-client-ca`, a client certificate's common name is
//! the role (here a superuser) and a client without one is refused.
//!
//! The Python Pulsar client speaks `pulsar+ssl://` with a trust file; the
//! HTTP port serves HTTPS with the same certificate (and, with a client CA,
//! takes the certificate's role). A TCP client that never finishes its
//! handshake is closed after the handshake timeout, and no more than
//! `--tls-handshakes-max` handshakes are in progress at once.
//!
//! Method: a CA, a server certificate for 127.0.0.1 / localhost and a
//! client certificate made in the test with rcgen; one broker per
//! configuration.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{Client, ClientError, ClientOptions, OutgoingMessage, TlsOptions};
use magnetar_tests::{run_async_with_timeout, run_pulsar_test, test_dir, BrokerOptions, BrokerProcess};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, PKCS_ECDSA_P256_SHA256,
};
use std::path::{Path, PathBuf};
use std::time::Duration;

struct Pki {
    ca: PathBuf,
    server_cert: PathBuf,
    server_key: PathBuf,
    client_cert: PathBuf,
    client_key: PathBuf,
}

/// A CA, a server certificate (127.0.0.1, localhost) and a client
/// certificate (CN `tls-client`), as PEM files in `dir`.
fn make_pki(dir: &Path) -> Pki {
    let ca_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params.distinguished_name.push(DnType::CommonName, "magnetar test CA");
    let ca = ca_params.self_signed(&ca_key).unwrap();

    let server_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut sp = CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()]).unwrap();
    sp.distinguished_name.push(DnType::CommonName, "magnetar broker");
    sp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    let server = sp.signed_by(&server_key, &ca, &ca_key).unwrap();

    let client_key = KeyPair::generate_for(&PKCS_ECDSA_P256_SHA256).unwrap();
    let mut cp = CertificateParams::new(Vec::<String>::new()).unwrap();
    cp.distinguished_name.push(DnType::CommonName, "tls-client");
    cp.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let client = cp.signed_by(&client_key, &ca, &ca_key).unwrap();

    let write = |name: &str, pem: String| {
        let p = dir.join(name);
        std::fs::write(&p, pem).unwrap();
        p
    };
    Pki {
        ca: write("ca.pem", ca.pem()),
        server_cert: write("server.pem", server.pem()),
        server_key: write("server.key", server_key.serialize_pem()),
        client_cert: write("client.pem", client.pem()),
        client_key: write("client.key", client_key.serialize_pem()),
    }
}

fn s(p: &Path) -> String {
    p.to_str().unwrap().to_string()
}

fn tls_url(broker: &BrokerProcess) -> String {
    format!("magnetar+tls://127.0.0.1:{}", broker.addr().port())
}

#[test]
fn sdk_and_openssl_speak_tls_and_a_plain_client_is_refused() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("tls");
        let pki = make_pki(dir.path());
        let mut opts = BrokerOptions::new(1);
        opts.extra_args = vec!["--tls-cert".into(), s(&pki.server_cert), "--tls-key".into(), s(&pki.server_key)];
        let broker = BrokerProcess::start_with(&dir.path().join("data"), &opts);

        // The SDK: produce and consume one message over TLS.
        let options =
            ClientOptions { tls: Some(TlsOptions::from_pem_files(&pki.ca, None).unwrap()), ..Default::default() };
        let client = Client::connect_with(&tls_url(&broker), options.clone()).await.unwrap();
        let consumer = client.subscribe("tls-topic", "s").subscribe().await.unwrap();
        let producer = client.producer("tls-topic").create().await.unwrap();
        producer.send(OutgoingMessage::new("over tls")).await.unwrap();
        let m = tokio::time::timeout(Duration::from_secs(20), consumer.receive()).await.unwrap().unwrap();
        assert_eq!(&m.payload()[..], b"over tls");
        client.close();

        // A TLS URL without a CA to trust is refused before connecting.
        let e = Client::connect(&tls_url(&broker)).await.err().unwrap();
        assert!(matches!(e, ClientError::Tls { .. }), "{e}");

        // A plain-text client to the TLS port: an error, promptly.
        let plain = tokio::time::timeout(Duration::from_secs(20), Client::connect(&broker.url())).await;
        let Err(e) = plain.expect("a plain client to the TLS port hung") else { panic!("a plain client got in") };
        println!("plain client to the TLS port: {e}");

        // openssl s_client completes a verified handshake.
        let out = std::process::Command::new("openssl")
            .args(["s_client", "-connect", &format!("127.0.0.1:{}", broker.addr().port())])
            .args(["-CAfile", &s(&pki.ca), "-verify_return_error", "-brief"])
            .stdin(std::process::Stdio::null())
            .output();
        match out {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => println!("openssl not installed: skipped"),
            Err(e) => panic!("running openssl: {e}"),
            Ok(out) => {
                let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
                assert!(out.status.success(), "openssl s_client failed:\n{text}");
                assert!(text.contains("Verification: OK"), "{text}");
                assert!(text.contains("TLSv1.3") || text.contains("TLSv1.2"), "{text}");
            }
        }
        assert!(broker.log().contains("TLS handshake failed"), "the plain client's refusal was not logged");
    });
}

/// A broker that requires client certificates from the test CA; the
/// client certificate's role (`tls-client`) is a superuser.
fn client_ca_broker(dir: &Path, pki: &Pki) -> BrokerProcess {
    let mut opts = BrokerOptions::new(1);
    opts.extra_args = vec![
        "--tls-cert".into(),
        s(&pki.server_cert),
        "--tls-key".into(),
        s(&pki.server_key),
        "--tls-client-ca".into(),
        s(&pki.ca),
        "--superuser-roles".into(),
        "tls-client".into(),
    ];
    BrokerProcess::start_with(&dir.join("data"), &opts)
}

#[test]
fn a_client_certificate_names_the_role() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("tls-client-ca");
        let pki = make_pki(dir.path());
        let broker = client_ca_broker(dir.path(), &pki);
        let with_cert = TlsOptions::from_pem_files(&pki.ca, Some((&pki.client_cert, &pki.client_key))).unwrap();
        let client =
            Client::connect_with(&tls_url(&broker), ClientOptions { tls: Some(with_cert), ..Default::default() })
                .await
                .unwrap();
        // Listing tenants needs a superuser: the certificate's CN is one.
        let tenants = client.admin().call("tenants.list", serde_json::json!({})).await.unwrap();
        assert_eq!(tenants, serde_json::json!(["public"]));
        client.close();

        let without = TlsOptions::from_pem_files(&pki.ca, None).unwrap();
        let refused = tokio::time::timeout(
            Duration::from_secs(20),
            Client::connect_with(&tls_url(&broker), ClientOptions { tls: Some(without), ..Default::default() }),
        )
        .await
        .expect("a client without a certificate hung");
        assert!(refused.is_err(), "a client without a certificate got in");
    });
}

/// One HTTPS request to `addr` trusting `ca` (with `client`'s certificate
/// and key when given): status and body.
async fn https_get(
    addr: std::net::SocketAddr,
    ca: &Path,
    client: Option<(&Path, &Path)>,
    path: &str,
) -> Result<(u16, String), Box<dyn std::error::Error + Send + Sync>> {
    use http_body_util::BodyExt;
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca)? {
        roots.add(c?)?;
    }
    let builder =
        rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(rustls::crypto::ring::default_provider()))
            .with_safe_default_protocol_versions()?
            .with_root_certificates(roots);
    let config = match client {
        None => builder.with_no_client_auth(),
        Some((cert, key)) => {
            let chain = CertificateDer::pem_file_iter(cert)?.collect::<Result<Vec<_>, _>>()?;
            builder.with_client_auth_cert(chain, PrivateKeyDer::from_pem_file(key)?)?
        }
    };
    let tcp = tokio::net::TcpStream::connect(addr).await?;
    let name = ServerName::try_from("127.0.0.1")?.to_owned();
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config)).connect(name, tcp).await?;
    let (mut sender, conn) = hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(tls)).await?;
    tokio::spawn(conn);
    let req = hyper::Request::builder()
        .uri(path)
        .header("host", addr.to_string())
        .body(http_body_util::Full::new(bytes::Bytes::new()))?;
    let resp = sender.send_request(req).await?;
    let status = resp.status().as_u16();
    let body = resp.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// The official Python Pulsar client produces and consumes over
/// `pulsar+ssl://` trusting the test CA, and a plain-text Pulsar client on
/// the TLS port gets an error without disturbing it; the HTTP port serves
/// HTTPS with the broker's certificate and refuses plain HTTP.
#[test]
fn pulsar_python_client_and_https_over_tls() {
    run_async_with_timeout(Duration::from_secs(240), || async {
        let dir = test_dir("tls-pulsar");
        let pki = make_pki(dir.path());
        let mut opts = BrokerOptions::new(1);
        // LOOKUP answers name the broker by a host name: the C++ client
        // sends it as SNI, which cannot be an IP address (the certificate
        // names localhost too).
        opts.extra_args = vec![
            "--tls-cert".into(),
            s(&pki.server_cert),
            "--tls-key".into(),
            s(&pki.server_key),
            "--advertised-address".into(),
            "localhost".into(),
        ];
        let mut broker = BrokerProcess::start_with(&dir.path().join("data"), &opts);
        let port = broker.addr().port();
        let ca = s(&pki.ca);
        let plain = format!("pulsar://127.0.0.1:{port}");
        let run = run_pulsar_test(
            &format!("pulsar+ssl://localhost:{port}"),
            "tls",
            "persistent://public/default/tls",
            &[&ca, &plain],
            Duration::from_secs(120),
        );
        assert!(run.stdout.contains("plain-text client on the TLS port"), "{}", run.stdout);
        broker.assert_running();

        let http = broker.http_addr();
        let (status, body) = https_get(http, &pki.ca, None, "/healthz").await.unwrap();
        assert_eq!((status, body.as_str()), (200, "ok\n"));
        let (status, body) = https_get(http, &pki.ca, None, "/admin/v2/tenants").await.unwrap();
        assert_eq!((status, body.as_str()), (200, r#"["public"]"#));
        // Plain HTTP to the HTTPS port: no answer but a closed connection.
        let plain =
            tokio::time::timeout(Duration::from_secs(30), tokio::net::TcpStream::connect(http)).await.unwrap().unwrap();
        let answer = plain_exchange(plain, b"GET /healthz HTTP/1.1\r\nhost: x\r\n\r\n").await;
        assert!(!answer.starts_with(b"HTTP/1.1 200"), "plain HTTP was answered on the HTTPS port");
        // The broker logs the refusal (its log is read as it comes).
        let deadline = std::time::Instant::now() + Duration::from_secs(30);
        while !broker.log().contains("http TLS handshake failed") {
            assert!(std::time::Instant::now() < deadline, "not logged:\n{}", broker.log_tail());
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    });
}

/// Writes `request`, then reads until the server closes (or 30 s).
async fn plain_exchange(mut stream: tokio::net::TcpStream, request: &[u8]) -> Vec<u8> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = stream.write_all(request).await;
    let mut out = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(30), stream.read_to_end(&mut out)).await;
    out
}

/// With a client CA, HTTPS takes the client certificate's role too (here
/// a superuser, so listing tenants is allowed) and refuses a client with
/// no certificate.
#[test]
fn https_takes_the_client_certificates_role() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("tls-https-client-ca");
        let pki = make_pki(dir.path());
        let broker = client_ca_broker(dir.path(), &pki);
        let http = broker.http_addr();
        let cert = Some((pki.client_cert.as_path(), pki.client_key.as_path()));
        let (status, body) = https_get(http, &pki.ca, cert, "/admin/v2/tenants").await.unwrap();
        assert_eq!((status, body.as_str()), (200, r#"["public"]"#));
        // Without a certificate the handshake (or the first request) fails.
        let without = https_get(http, &pki.ca, None, "/admin/v2/tenants").await;
        assert!(without.is_err(), "a client without a certificate was answered: {without:?}");
    });
}

/// TCP clients that connect to the TLS port and never send a byte hold a
/// handshake slot only until the handshake timeout; while
/// `--tls-handshakes-max` of them are in progress, a further connection is
/// closed at once; afterwards TLS clients are served again.
#[test]
fn stalled_tls_handshakes_are_bounded_in_time_and_number() {
    run_async_with_timeout(Duration::from_secs(180), || async {
        use tokio::io::AsyncReadExt;
        let dir = test_dir("tls-stalled");
        let pki = make_pki(dir.path());
        let mut opts = BrokerOptions::new(1);
        opts.extra_args = vec![
            "--tls-cert".into(),
            s(&pki.server_cert),
            "--tls-key".into(),
            s(&pki.server_key),
            "--handshake-timeout-s".into(),
            "3".into(),
            "--tls-handshakes-max".into(),
            "2".into(),
            "--no-shard-ports".into(),
        ];
        let mut broker = BrokerProcess::start_with(&dir.path().join("data"), &opts);
        let addr = broker.addr();
        // Two silent connections hold both handshake slots; a third is then
        // closed at once. The broker takes a slot when it accepts the
        // connection, a moment after connect() returns: should the third
        // have come first (it then stalls too, and the timeout ends it), try
        // again with fresh connections.
        let refused_line = "2 TLS handshakes in progress; closing a new connection";
        let deadline = std::time::Instant::now() + Duration::from_secs(90);
        let stalled = loop {
            let mut stalled = Vec::new();
            for _ in 0..2 {
                stalled.push(tokio::net::TcpStream::connect(addr).await.unwrap());
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
            let mut extra = tokio::net::TcpStream::connect(addr).await.unwrap();
            let mut buf = [0u8; 1];
            let _ = tokio::time::timeout(Duration::from_secs(30), extra.read(&mut buf)).await;
            if broker.log().contains(refused_line) {
                break stalled;
            }
            assert!(std::time::Instant::now() < deadline, "no connection was refused:\n{}", broker.log_tail());
        };
        // The stalled ones are closed by the broker after the timeout.
        for mut c in stalled {
            let mut buf = [0u8; 16];
            let n = tokio::time::timeout(Duration::from_secs(60), c.read(&mut buf))
                .await
                .expect("a stalled handshake was never closed");
            assert!(matches!(n, Ok(0) | Err(_)), "the broker sent bytes to a silent client: {n:?}");
        }
        assert!(broker.log().contains("TLS handshake failed"), "{}", broker.log_tail());
        // The slots are free again: a TLS client is served.
        let options =
            ClientOptions { tls: Some(TlsOptions::from_pem_files(&pki.ca, None).unwrap()), ..Default::default() };
        let client = Client::connect_with(&tls_url(&broker), options).await.unwrap();
        let producer = client.producer("after-stall").create().await.unwrap();
        producer.send(OutgoingMessage::new("served")).await.unwrap();
        client.close();
        broker.assert_running();
    });
}
