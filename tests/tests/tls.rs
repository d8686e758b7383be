//! Goal: TLS on the broker port (issue #20): the SDK produces and consumes
//! over `magnetar+tls://` trusting a test CA; `openssl s_client` completes
//! a verified handshake; a plain-text client to the TLS port gets an error,
//! not a hang; with `--tls-client-ca`, a client certificate's common name is
//! the role (here a superuser) and a client without one is refused.
//!
//! Method: a CA, a server certificate for 127.0.0.1 / localhost and a
//! client certificate made in the test with rcgen; one broker per
//! configuration.

// Tests may unwrap (the project's rule): a failure names its line.
#![allow(clippy::unwrap_used)]

use magnetar_client::{Client, ClientError, ClientOptions, OutgoingMessage, TlsOptions};
use magnetar_tests::{run_async_with_timeout, test_dir, BrokerOptions, BrokerProcess};
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

#[test]
fn a_client_certificate_names_the_role() {
    run_async_with_timeout(Duration::from_secs(120), || async {
        let dir = test_dir("tls-client-ca");
        let pki = make_pki(dir.path());
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
        let broker = BrokerProcess::start_with(&dir.path().join("data"), &opts);
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
