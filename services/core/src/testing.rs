//! Helpers for tests that need real servers (behind the `test-util` feature).
//!
//! `scripts/test.sh` installs `nats-server` and starts Postgres, exporting
//! `KILN_TEST_DATABASE_URL`; a test that needs one and finds it missing fails loudly.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::{DatabaseConfig, DatabaseUrl, NatsConfig};

/// Returns a port that was free a moment ago.
pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("bind a free port")
        .port()
}

/// A `nats-server -js` child with its own store directory, killed on drop.
pub struct NatsServer {
    pub url: String,
    child: Child,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts a server and waits until it accepts connections.
    pub fn start() -> NatsServer {
        let binary = std::env::var("KILN_TEST_NATS_SERVER").unwrap_or_else(|_| "nats-server".into());
        let dir = tempfile::tempdir().expect("temp dir");
        let port = free_port();
        let child = Command::new(&binary)
            .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
            .arg(dir.path())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| {
                panic!("cannot start {binary} ({e}): run the tests through scripts/test.sh, which installs nats-server")
            });
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
            assert!(Instant::now() < deadline, "nats-server did not start on port {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        NatsServer {
            url: format!("nats://127.0.0.1:{port}"),
            child,
            _dir: dir,
        }
    }

    pub fn config(&self) -> NatsConfig {
        NatsConfig {
            url: self.url.clone(),
            replicas: 1,
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A SQLite database file in `dir`.
pub fn sqlite_config(dir: &std::path::Path) -> DatabaseConfig {
    let path: PathBuf = dir.join("kiln.db");
    DatabaseConfig {
        url: DatabaseUrl::new(format!("sqlite://{}?mode=rwc", path.display())),
        max_connections: 4,
    }
}

/// A fresh, empty Postgres database on the server of `KILN_TEST_DATABASE_URL`.
pub async fn postgres_config() -> DatabaseConfig {
    use sea_orm::{ConnectionTrait, Database};
    let admin_url = std::env::var("KILN_TEST_DATABASE_URL")
        .expect("KILN_TEST_DATABASE_URL is not set: run the tests through scripts/test.sh, which starts Postgres");
    let name = format!("kiln_test_{}", uuid::Uuid::now_v7().simple());
    let admin = Database::connect(admin_url.as_str())
        .await
        .expect("connect to the test Postgres");
    admin
        .execute_unprepared(&format!("CREATE DATABASE {name}"))
        .await
        .expect("create a test database");
    let base = admin_url.rsplit_once('/').map(|(base, _)| base).unwrap_or(&admin_url);
    DatabaseConfig {
        url: DatabaseUrl::new(format!("{base}/{name}")),
        max_connections: 4,
    }
}

/// An object store under a fresh prefix (`<what>-<id>`) of the test S3 bucket: the versitygw
/// that scripts/test.sh starts (`KILN_TEST_S3_ENDPOINT`, `KILN_TEST_S3_BUCKET`,
/// `KILN_TEST_S3_ACCESS_KEY_ID`, `KILN_TEST_S3_SECRET_ACCESS_KEY`).
pub fn s3_objects_config(what: &str) -> crate::config::ObjectStoreConfig {
    let var = |name: &str| {
        std::env::var(name).unwrap_or_else(|_| {
            panic!("{name} is not set: run the tests through scripts/test.sh, which starts versitygw (S3)")
        })
    };
    crate::config::ObjectStoreConfig {
        url: format!("s3://{}/{what}-{}", var("KILN_TEST_S3_BUCKET"), crate::ids::new_id()),
        endpoint: var("KILN_TEST_S3_ENDPOINT"),
        access_key_id: var("KILN_TEST_S3_ACCESS_KEY_ID"),
        secret_access_key: crate::config::Secret::new(var("KILN_TEST_S3_SECRET_ACCESS_KEY")),
        allow_http: true,
        ..crate::config::ObjectStoreConfig::default()
    }
}
