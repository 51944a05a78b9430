//! Helpers for tests that need real servers (behind the `test-util` feature).
//!
//! `scripts/test.sh` installs `nats-server` and starts Postgres, exporting
//! `KILN_TEST_DATABASE_URL`; a test that needs one and finds it missing fails loudly.
//! [`NatsServer`] is one `nats-server -js`, [`NatsCluster`] three clustered ones.

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::config::{DatabaseConfig, DatabaseUrl, NatsConfig};
use crate::nats_auth::Service;

/// Returns a port that was free a moment ago and that no other test process holds, for a server
/// a test starts as a child (which binds it itself).
///
/// A port the kernel hands out for `127.0.0.1:0` is in the ephemeral range, which every outgoing
/// connection of every process draws from too: between this call and the child's bind, a client
/// connecting anywhere could take it (CI saw a topology api find its /metrics port in use). So
/// the port is picked below that range, where only explicit binds land, and claimed by a lock on
/// a file named after it (`$TMPDIR/kiln-test-ports/`), held until this process exits. A lock
/// (`flock`) taken through another open of the same file fails in this process too, so it keeps a
/// port from being handed out twice here as well as across the test processes nextest runs.
pub fn free_port() -> u16 {
    use rand::Rng;
    static CLAIMS: std::sync::Mutex<Vec<std::fs::File>> = std::sync::Mutex::new(Vec::new());
    let (dir, low, high) = test_ports();
    let mut claims = CLAIMS.lock().unwrap_or_else(|e| e.into_inner());
    for _ in 0..10_000 {
        let port = rand::rng().random_range(*low..*high);
        let claim = std::fs::OpenOptions::new()
            .create(true)
            .truncate(false)
            .write(true)
            .open(dir.join(port.to_string()))
            .expect("open a test port claim");
        if claim.try_lock().is_err() || TcpListener::bind(("127.0.0.1", port)).is_err() {
            continue;
        }
        claims.push(claim);
        return port;
    }
    panic!("no free port in {low}..{high} after 10,000 tries");
}

/// The directory of the port claims (made once), and the twelve thousand ports just below the
/// kernel's ephemeral range (`ip_local_port_range`, 32768–60999 on Linux by default).
fn test_ports() -> &'static (PathBuf, u16, u16) {
    static PORTS: std::sync::OnceLock<(PathBuf, u16, u16)> = std::sync::OnceLock::new();
    PORTS.get_or_init(|| {
        let dir = std::env::temp_dir().join("kiln-test-ports");
        std::fs::create_dir_all(&dir).expect("create the directory of test port claims");
        let ephemeral_low = std::fs::read_to_string("/proc/sys/net/ipv4/ip_local_port_range")
            .ok()
            .and_then(|range| range.split_whitespace().next()?.parse::<u16>().ok())
            .unwrap_or(32768);
        let high = ephemeral_low.max(13_024);
        (dir, high - 12_000, high)
    })
}

/// A `nats-server -js` child with its own store directory, killed on drop.
pub struct NatsServer {
    pub url: String,
    /// The port of its monitoring endpoint (`-m`: `/varz`, `/healthz`).
    pub monitor_port: u16,
    /// The users it admits ([`NatsServer::start_authorized`]); `None`: anyone.
    pub users: Option<NatsUsers>,
    child: Child,
    _dir: tempfile::TempDir,
}

impl NatsServer {
    /// Starts a server and waits until it accepts connections. A port found free may be taken
    /// by another test's server before this one binds it (this one then exits while the
    /// other answers on the port): a server that exits is started again on other ports.
    pub fn start() -> NatsServer {
        NatsServer::start_with(None)
    }

    /// Starts a server that admits only the users of a new [`NatsUsers`]: each service's, with
    /// the permissions of [`crate::nats_auth`] (the block `kiln up` writes), and the harness's.
    /// [`NatsServer::config`] is then the harness's, [`NatsServer::service_config`] a service's.
    pub fn start_authorized() -> NatsServer {
        NatsServer::start_with(Some(NatsUsers::new()))
    }

    fn start_with(users: Option<NatsUsers>) -> NatsServer {
        let binary = nats_server_binary();
        for _ in 0..5 {
            let dir = tempfile::tempdir().expect("temp dir");
            let port = free_port();
            let monitor_port = free_port();
            let (port_arg, monitor) = (port.to_string(), monitor_port.to_string());
            let config_file = dir.path().join("authorization.conf");
            let mut args: Vec<&std::ffi::OsStr> = ["-js", "-a", "127.0.0.1", "-p", &port_arg, "-m", &monitor, "-sd"]
                .map(std::ffi::OsStr::new)
                .into_iter()
                .chain([dir.path().as_os_str()])
                .collect();
            if let Some(users) = &users {
                std::fs::write(&config_file, users.authorization_block()).expect("write a nats-server config");
                args.extend([std::ffi::OsStr::new("-c"), config_file.as_os_str()]);
            }
            let mut child = spawn_nats_server(&binary, &args);
            let deadline = Instant::now() + Duration::from_secs(10);
            let exited = |child: &mut Child| child.try_wait().ok().flatten().is_some();
            while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() && !exited(&mut child) {
                assert!(Instant::now() < deadline, "nats-server did not start on port {port}");
                std::thread::sleep(Duration::from_millis(20));
            }
            // One that could not bind its ports exits at once.
            std::thread::sleep(Duration::from_millis(200));
            if exited(&mut child) {
                continue;
            }
            return NatsServer {
                url: format!("nats://127.0.0.1:{port}"),
                monitor_port,
                users,
                child,
                _dir: dir,
            };
        }
        panic!("nats-server exited at start five times (ports taken?): run {binary} -js by hand to see why");
    }

    /// The base URL of its monitoring endpoint, what `metrics.nats-monitor` takes.
    /// The server's JetStream store directory (streams' messages as the server keeps them).
    pub fn store_dir(&self) -> &std::path::Path {
        self._dir.path()
    }

    pub fn monitor_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.monitor_port)
    }

    /// A client's configuration: with the harness's seed (every subject) when the server
    /// admits only its users.
    pub fn config(&self) -> NatsConfig {
        let config = NatsConfig {
            url: self.url.clone(),
            replicas: 1,
            ..NatsConfig::default()
        };
        match &self.users {
            Some(users) => users.harness_config(config),
            None => config,
        }
    }

    /// The configuration of `service`: with its own seed when the server admits only its users.
    pub fn service_config(&self, service: Service) -> NatsConfig {
        match &self.users {
            Some(users) => users.service_config(service, self.config()),
            None => self.config(),
        }
    }
}

impl Drop for NatsServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The nats-server binary of the tests (`KILN_TEST_NATS_SERVER`, else `nats-server` on `PATH`).
pub(crate) fn nats_server_binary() -> String {
    std::env::var("KILN_TEST_NATS_SERVER").unwrap_or_else(|_| "nats-server".into())
}

pub(crate) fn spawn_nats_server(binary: &str, args: &[&std::ffi::OsStr]) -> Child {
    Command::new(binary)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot start {binary} ({e}): run the tests through scripts/test.sh, which installs nats-server")
        })
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

mod aemm;
mod certs;
mod exposition;
pub mod hostile;
mod nats_cluster;
mod nats_probe;
mod nats_users;
mod secure_nats;

pub use aemm::{Aemm, AemmInstance, AemmNotice, aemm_binary};
pub use certs::{CertFiles, TestCa};
pub use nats_cluster::NatsCluster;
pub use nats_probe::{NatsProbe, nats_probe_script};
pub use nats_users::NatsUsers;
pub use secure_nats::{NatsSecurity, SecureNatsServer};

pub use exposition::{
    Sample, assert_no_ids_in_labels, http_get, promtool_binary, promtool_check_metrics, sample_value, samples,
    series_value,
};
