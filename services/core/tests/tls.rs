//! TLS serving and connecting: a health service behind `kiln_core::tls::incoming`, reached
//! through `kiln_core::tls::endpoint` with certificates of test CAs.

use std::net::SocketAddr;
use std::time::Duration;

use kiln_core::testing::TestCa;
use kiln_core::tls::{ClientTlsConfig, ServerTlsConfig, endpoint, incoming};
use tokio_util::sync::CancellationToken;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_client::HealthClient;

/// Serves gRPC health on a free loopback port with `tls` until the token is cancelled.
async fn serve(tls: &ServerTlsConfig) -> (SocketAddr, CancellationToken) {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    let connections = incoming(listener, tls).expect("TLS config loads");
    let (_reporter, health) = tonic_health::server::health_reporter();
    let shutdown = CancellationToken::new();
    let stop = shutdown.clone();
    tokio::spawn(async move {
        tonic::transport::Server::builder()
            .add_service(health)
            .serve_with_incoming_shutdown(connections, stop.cancelled_owned())
            .await
            .expect("serve");
    });
    (addr, shutdown)
}

/// Checks health at `url` with `tls`; the error's text when it fails.
async fn check(url: &str, tls: &ClientTlsConfig) -> Result<(), String> {
    let channel = endpoint(url, tls)
        .map_err(|e| e.to_string())?
        .connect_timeout(Duration::from_secs(5))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .map_err(|e| format!("connect: {e:?}"))?;
    HealthClient::new(channel)
        .check(HealthCheckRequest::default())
        .await
        .map(drop)
        .map_err(|status| format!("check: {status:?}"))
}

#[tokio::test]
async fn mutual_tls_admits_only_clients_of_its_ca() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "kiln");
    let other = TestCa::new(dir.path(), "other");
    let (addr, shutdown) = serve(&ca.server_tls("server", true)).await;
    let url = format!("https://localhost:{}", addr.port());

    check(&url, &ca.client_tls("client"))
        .await
        .expect("a client of the CA is served");
    check(&format!("https://127.0.0.1:{}", addr.port()), &ca.client_tls("by-ip"))
        .await
        .expect("the certificate names 127.0.0.1 too");

    let error = check(
        &format!("http://127.0.0.1:{}", addr.port()),
        &ClientTlsConfig::default(),
    )
    .await
    .expect_err("a plain-text client is refused");
    assert!(!error.is_empty());

    let no_cert = ClientTlsConfig {
        ca_file: Some(ca.ca_file.clone()),
        ..ClientTlsConfig::default()
    };
    check(&url, &no_cert)
        .await
        .expect_err("a client without a certificate is refused");

    let mut foreign = other.client_tls("foreign");
    foreign.ca_file = Some(ca.ca_file.clone());
    check(&url, &foreign)
        .await
        .expect_err("a certificate of another CA is refused");

    check(&url, &other.client_tls("distrusting"))
        .await
        .expect_err("a client that does not trust the server's CA does not connect");

    check(&url, &ca.client_tls("after"))
        .await
        .expect("the server still accepts after refusals");
    shutdown.cancel();
}

#[tokio::test]
async fn client_certificates_are_optional_unless_required() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "kiln");
    let (addr, shutdown) = serve(&ca.server_tls("server", false)).await;
    let url = format!("https://localhost:{}", addr.port());
    let server_only = ClientTlsConfig {
        ca_file: Some(ca.ca_file.clone()),
        ..ClientTlsConfig::default()
    };
    check(&url, &server_only).await.expect("no client certificate needed");
    check(&url, &ca.client_tls("client"))
        .await
        .expect("a valid one is fine too");
    shutdown.cancel();
}

#[tokio::test]
async fn a_replaced_certificate_is_served_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let first = TestCa::new(dir.path(), "first");
    let second = TestCa::new(dir.path(), "second");
    let tls = ServerTlsConfig {
        require_client_cert: false,
        client_ca_file: None,
        ..first.server_tls("server", false)
    };
    let (addr, shutdown) = serve(&tls).await;
    let url = format!("https://localhost:{}", addr.port());
    let trusts = |ca: &TestCa| ClientTlsConfig {
        ca_file: Some(ca.ca_file.clone()),
        ..ClientTlsConfig::default()
    };
    check(&url, &trusts(&first))
        .await
        .expect("the first certificate is served");

    // A broken pair is not taken: the old one keeps being served.
    std::fs::write(tls.key_file.as_ref().unwrap(), "not a key").unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    check(&url, &trusts(&first))
        .await
        .expect("a broken new pair keeps the old one");

    let renewed = second.server_cert("renewed");
    std::fs::copy(&renewed.cert_file, tls.cert_file.as_ref().unwrap()).unwrap();
    std::fs::copy(&renewed.key_file, tls.key_file.as_ref().unwrap()).unwrap();
    tokio::time::sleep(Duration::from_millis(1100)).await;
    check(&url, &trusts(&second))
        .await
        .expect("a new connection sees the new certificate");
    check(&url, &trusts(&first))
        .await
        .expect_err("the old certificate is no longer served");
    shutdown.cancel();
}

#[test]
fn validation_names_every_problem() {
    let dir = tempfile::tempdir().unwrap();
    let ca = TestCa::new(dir.path(), "kiln");
    let other = ca.server_cert("other");
    let mut problems = Vec::new();
    ServerTlsConfig {
        key_file: Some(other.key_file),
        ..ca.server_tls("server", false)
    }
    .validate("grpc.tls", &mut problems);
    assert!(problems[0].contains("does not match"), "{problems:?}");

    let mut problems = Vec::new();
    ServerTlsConfig {
        cert_file: Some(dir.path().join("missing.pem")),
        key_file: None,
        client_ca_file: None,
        require_client_cert: true,
    }
    .validate("grpc.tls", &mut problems);
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems[0].contains("go together"), "{problems:?}");
    assert!(problems[1].contains("client-ca-file"), "{problems:?}");

    let mut problems = Vec::new();
    ServerTlsConfig::default().validate("grpc.tls", &mut problems);
    assert!(problems.is_empty(), "TLS is off by default: {problems:?}");
}
