//! The services on a nats-server that speaks only TLS, verifies client certificates and admits
//! only NKey users (one per service): a job runs end to end, and clients missing a part are refused.

use std::time::Duration;

use kiln_e2e::Stack;
use kiln_proto::v1 as pb;

#[tokio::test]
async fn services_work_through_tls_and_nkey_auth_and_others_are_refused() {
    let stack = Stack::start_on_secure_nats().await;
    let job = stack.submit(&["sh", "-c", "echo through tls"]).await;
    let done = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    assert_eq!(done.exit_code, Some(0), "{done:?}");
    let lines = stack.log_lines(&job.id, false).await;
    assert!(lines.iter().any(|l| l.text == "through tls"), "{lines:?}");

    kiln_core::tls::install_default_provider();
    let secure = stack.nats.secure.as_ref().expect("a secure server");
    let full = secure.config();
    let connect = |options: async_nats::ConnectOptions| {
        let url = full.url.clone();
        async move {
            options
                .connection_timeout(Duration::from_secs(3))
                .max_reconnects(Some(0))
                .connect(url)
                .await
                .map(drop)
        }
    };
    let seed = std::fs::read_to_string(&secure.users.harness_seed_file)
        .unwrap()
        .trim()
        .to_string();
    let tls = || {
        async_nats::ConnectOptions::new()
            .require_tls(true)
            .add_root_certificates(full.tls_ca_file.clone().unwrap())
            .add_client_certificate(full.tls_cert_file.clone().unwrap(), full.tls_key_file.clone().unwrap())
    };
    connect(tls().nkey(seed.clone()))
        .await
        .expect("the full set of credentials connects");
    assert!(connect(tls()).await.is_err(), "a client without the NKey is refused");
    let stranger = nkeys::KeyPair::new_user().seed().unwrap();
    assert!(connect(tls().nkey(stranger)).await.is_err(), "another NKey is refused");
    let no_client_cert = async_nats::ConnectOptions::new()
        .require_tls(true)
        .add_root_certificates(full.tls_ca_file.clone().unwrap())
        .nkey(seed);
    assert!(
        connect(no_client_cert).await.is_err(),
        "a client without a certificate is refused"
    );
    // nats:// with no CA: the server insists on TLS, and its certificate is not trusted.
    let plain_url = full.url.replace("tls://", "nats://");
    let plain = async_nats::ConnectOptions::new()
        .connection_timeout(Duration::from_secs(3))
        .connect(plain_url)
        .await;
    assert!(plain.is_err(), "a plain-text client is refused");
}
