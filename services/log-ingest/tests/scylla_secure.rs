//! log-ingest on a Cassandra that requires a password (`PasswordAuthenticator`) and TLS with a
//! client certificate (`client_encryption_options`): the Cassandra scripts/cassandra/start.sh
//! starts with `CASSANDRA_SECURE_DIR` (scripts/test.sh: `KILN_TEST_SCYLLA_SECURE_NODES`, and
//! `KILN_TEST_SCYLLA_SECURE_DIR`, the directory of `scripts/test-ca.sh DIR 127.0.0.1 client`).
//! Points are stored and read back as a role kiln made for the test; without the password,
//! with a wrong one, without TLS or without a client certificate the connection is refused.

use std::path::PathBuf;

use kiln_core::config::Secret;
use kiln_log_ingest::points::{MetricStore, Point};
use kiln_log_ingest::scylla_store::{ScyllaConfig, ScyllaMetricStore, connect};

fn secure_config() -> ScyllaConfig {
    let nodes = std::env::var("KILN_TEST_SCYLLA_SECURE_NODES").expect(
        "KILN_TEST_SCYLLA_SECURE_NODES is not set: run the tests through scripts/test.sh, which starts the secure Cassandra",
    );
    let dir = PathBuf::from(
        std::env::var("KILN_TEST_SCYLLA_SECURE_DIR")
            .expect("KILN_TEST_SCYLLA_SECURE_DIR names the test CA's directory"),
    );
    ScyllaConfig {
        nodes: nodes.split(',').map(str::to_string).collect(),
        keyspace: format!("kiln_test_{}", kiln_core::ids::new_id().replace('-', "")),
        tls_ca_file: Some(dir.join("ca.pem")),
        tls_cert_file: Some(dir.join("client.pem")),
        tls_key_file: Some(dir.join("client.key")),
        ..Default::default()
    }
}

/// Makes a role of the test's own (a fresh name: Cassandra refuses to change a password twice
/// within 5 s) as the default superuser, which the secure node has from its start.
async fn kiln_role(config: &ScyllaConfig, password: &str) -> String {
    use scylla::client::session_builder::SessionBuilder;
    let tls = kiln_core::tls::ClientTlsConfig {
        ca_file: config.tls_ca_file.clone(),
        cert_file: config.tls_cert_file.clone(),
        key_file: config.tls_key_file.clone(),
    };
    let session = SessionBuilder::new()
        .known_nodes(&config.nodes)
        .user("cassandra", "cassandra")
        .tls_context(Some(tls.rustls_config().unwrap()))
        .build()
        .await
        .expect("the default superuser connects over TLS");
    let role = format!("kiln_{}", kiln_core::ids::new_id().replace('-', ""));
    session
        .query_unpaged(
            format!("CREATE ROLE {role} WITH PASSWORD = '{password}' AND LOGIN = true"),
            (),
        )
        .await
        .unwrap();
    role
}

/// The error of a connection the node refuses.
async fn refused(config: &ScyllaConfig) -> String {
    match connect(config).await {
        Ok(_) => panic!("connected with {config:?}"),
        Err(error) => error.to_string(),
    }
}

#[tokio::test]
async fn points_go_through_an_authenticated_tls_connection_and_nothing_else_connects() {
    let base = secure_config();
    let password = format!("pw-{}", kiln_core::ids::new_id());
    let role = kiln_role(&base, &password).await;
    let password_file = tempfile::NamedTempFile::new().unwrap();
    std::fs::write(password_file.path(), format!("{password}\n")).unwrap();
    let config = ScyllaConfig {
        username: role.clone(),
        password_file: Some(password_file.path().to_path_buf()),
        ..base.clone()
    };
    let mut problems = Vec::new();
    config.validate(&mut problems);
    assert!(problems.is_empty(), "{problems:?}");
    // The password never shows in the printed configuration.
    let shown = format!(
        "{:?}",
        ScyllaConfig {
            password: Secret::new(password.clone()),
            password_file: None,
            ..config.clone()
        }
    );
    assert!(!shown.contains(&password) && shown.contains("***"), "{shown}");

    let session = connect(&config)
        .await
        .expect("kiln connects with its password over TLS");
    let store = ScyllaMetricStore::new(session, &config).await.unwrap();
    let points: Vec<Point> = (0..3)
        .map(|step| Point {
            job_id: "j".into(),
            key: "loss".into(),
            step,
            value: step as f64 / 2.0,
            timestamp_ms: step + 1,
        })
        .collect();
    store.append(points).await.unwrap();
    let series = store.series("j", "loss", i64::MIN, i64::MAX, 100).await.unwrap();
    assert_eq!(
        series.points.iter().map(|p| p.value).collect::<Vec<_>>(),
        [0.0, 0.5, 1.0]
    );

    // Controls: each missing piece is refused by the node.
    let no_password = refused(&base).await;
    eprintln!("without credentials: {no_password}");
    assert!(no_password.to_lowercase().contains("auth"), "{no_password}");
    let wrong = ScyllaConfig {
        username: role.clone(),
        password: Secret::new("wrong"),
        ..base.clone()
    };
    let wrong_password = refused(&wrong).await;
    eprintln!("with a wrong password: {wrong_password}");
    assert!(
        wrong_password.contains("and/or password are incorrect") || wrong_password.to_lowercase().contains("auth"),
        "{wrong_password}"
    );
    let plain = ScyllaConfig {
        tls_ca_file: None,
        tls_cert_file: None,
        tls_key_file: None,
        ..config.clone()
    };
    let without_tls = refused(&plain).await;
    eprintln!("without TLS: {without_tls}");
    let no_client_cert = ScyllaConfig {
        tls_cert_file: None,
        tls_key_file: None,
        ..config.clone()
    };
    let without_client_cert = refused(&no_client_cert).await;
    eprintln!("without a client certificate: {without_client_cert}");
    assert!(
        without_client_cert.to_lowercase().contains("certificate"),
        "{without_client_cert}"
    );
}
