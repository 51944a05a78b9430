//! The metadata store talks to Postgres over TLS when its URL asks (`sslmode=verify-full` with
//! `sslrootcert`): against the test Postgres, which scripts/test.sh starts with a certificate
//! of a CA of its own (`KILN_TEST_DATABASE_CA`).

use kiln_core::config::{DatabaseConfig, DatabaseUrl};
use kiln_core::store::Store;
use kiln_core::testing::{TestCa, postgres_config};
use sea_orm::{ConnectionTrait, Database, DbBackend, Statement};

fn test_ca() -> String {
    std::env::var("KILN_TEST_DATABASE_CA")
        .expect("KILN_TEST_DATABASE_CA is not set: run the tests through scripts/test.sh, whose Postgres offers TLS")
}

/// Whether the server says this connection is encrypted.
async fn encrypted(url: &str) -> bool {
    let db = Database::connect(url).await.expect("connect");
    let row = db
        .query_one_raw(Statement::from_string(
            DbBackend::Postgres,
            "SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()",
        ))
        .await
        .expect("query")
        .expect("a row");
    row.try_get::<bool>("", "ssl").expect("ssl")
}

#[tokio::test]
async fn the_store_reaches_postgres_over_verified_tls_and_refuses_another_ca() {
    let plain = postgres_config().await;
    let base = plain.url.expose().to_string();
    let verified = format!("{base}?sslmode=verify-full&sslrootcert={}", test_ca());
    assert!(encrypted(&verified).await, "verify-full must encrypt");
    assert!(
        !encrypted(&format!("{base}?sslmode=disable")).await,
        "the check tells the two apart"
    );

    // The store itself, migrations and all, over the verified connection.
    let store = Store::connect(&DatabaseConfig {
        url: DatabaseUrl::new(verified),
        ..plain.clone()
    })
    .await
    .expect("store over TLS");
    store.migrate().await.expect("migrate over TLS");
    assert!(store.project("default").await.unwrap().is_some());

    // A server certificate of another CA is refused.
    let dir = tempfile::tempdir().unwrap();
    let other = TestCa::new(dir.path(), "another CA");
    let refused = Database::connect(format!(
        "{base}?sslmode=verify-full&sslrootcert={}",
        other.ca_file.display()
    ))
    .await;
    assert!(refused.is_err(), "a certificate of another CA must be refused");
}
