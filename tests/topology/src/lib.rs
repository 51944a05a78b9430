//! kiln-topology: the production topology on one machine, every part a separate process on
//! 127.0.0.1, for the chaos tests and for a person (`scripts/cluster.sh up|down`).
//!
//! It starts a Postgres of its own ([`postgres`]) and three clustered nats-servers with
//! JetStream ([`kiln_core::testing::NatsCluster`]), uses the Cassandra of
//! `KILN_TEST_SCYLLA_NODES` (a fresh keyspace) for the Scylla stores and the S3 server of
//! `KILN_TEST_S3_*` (a fresh prefix of its bucket) for the objects, and then two
//! replicas of every service binary from `target/` — api, scheduler, runner (process provider),
//! log-ingest, item-batch, advisor, predictor — plus one runner of a simulated pool
//! ([`Topology::start`]).
//!
//! The services are those of `deploy/compose/compose.yaml`, read through compose itself
//! ([`compose`]: `docker-compose config --format json`, the binary of `KILN_TEST_COMPOSE`):
//! each instance runs the local binary named by the service's entrypoint with compose's
//! command, its bind-mounted TOML file (unchanged) and its environment. What must differ on
//! one machine ([`plan`]) is set through kiln's env overrides (`KILN_<SVC>__SECTION__KEY`):
//! compose's host names become the loopback servers above, every container port a free
//! loopback port of its own (kept in [`Topology::listens`]), volumes directories of the
//! topology, the runner's docker provider the process provider, and the sim runner is
//! compose's runner with `pool = "sim"`. Secrets reach a process only through its environment.
//! Every process can be SIGKILLed and restarted by name ([`proc`]).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use kiln_core::testing::NatsCluster;

pub mod compose;
pub mod plan;
pub mod postgres;
pub mod proc;
pub mod tls;

use postgres::Postgres;
use proc::Proc;

/// The service binaries, each run as two replicas.
pub const SERVICES: [&str; 7] = [
    "api",
    "scheduler",
    "runner",
    "log-ingest",
    "item-batch",
    "advisor",
    "predictor",
];
/// The runner of the simulated pool.
pub const SIM_RUNNER: &str = "runner-sim";
/// The names of the gang pool's runners: this and their number from 1 ([`Options::gang_runners`]).
pub const GANG_RUNNER: &str = "runner-gang-";
/// How long the harness waits for a process to listen.
const START_PATIENCE: Duration = Duration::from_secs(90);

/// What to start.
#[derive(Debug, Clone)]
pub struct Options {
    /// Cassandra/Scylla contact points (`KILN_TEST_SCYLLA_NODES`).
    pub scylla_nodes: Vec<String>,
    /// Where the topology keeps its files; a temp dir when `None`.
    pub dir: Option<PathBuf>,
    /// The S3 server: endpoint, bucket, access key id, secret (`KILN_TEST_S3_*`).
    pub s3: S3,
    /// The runners' and schedulers' lease TTL, in milliseconds (short in tests, so a dead one
    /// is noticed quickly).
    pub lease_ttl_ms: u64,
    /// TLS only: every gRPC listener requires client certificates of the topology's CA, and
    /// the nats-servers TLS and client certificates ([`tls`]). The nats-servers admit only
    /// the services' NKey users (one each) with or without it.
    pub tls: bool,
    /// Runners of pool `gang` besides the others (`runner-gang-1`, …), one CPU each, their
    /// process jobs not isolated (a gang's nodes must reach one another), outputs synced every
    /// second: only the gang test starts them.
    pub gang_runners: usize,
}

/// Where the objects go: a bucket of an S3-compatible server.
#[derive(Debug, Clone)]
pub struct S3 {
    pub endpoint: String,
    pub bucket: String,
    pub access_key_id: String,
    pub secret_access_key: String,
}

fn required(name: &str, what: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| {
        panic!("{name} is not set: run the tests through scripts/test.sh (or scripts/cluster.sh), which start {what}")
    })
}

impl Options {
    /// Scylla from `KILN_TEST_SCYLLA_NODES`; fails loudly when it is missing.
    pub fn from_env() -> Options {
        let nodes = required("KILN_TEST_SCYLLA_NODES", "Cassandra");
        Options {
            scylla_nodes: nodes.split(',').map(str::to_string).collect(),
            s3: S3 {
                endpoint: required("KILN_TEST_S3_ENDPOINT", "versitygw"),
                bucket: required("KILN_TEST_S3_BUCKET", "versitygw"),
                access_key_id: required("KILN_TEST_S3_ACCESS_KEY_ID", "versitygw"),
                secret_access_key: required("KILN_TEST_S3_SECRET_ACCESS_KEY", "versitygw"),
            },
            dir: None,
            lease_ttl_ms: 3_000,
            tls: false,
            gang_runners: 0,
        }
    }
}

/// The topology, running.
pub struct Topology {
    /// Where configs, logs and data live.
    pub dir: PathBuf,
    _temp: Option<tempfile::TempDir>,
    pub postgres: Postgres,
    pub nats: NatsCluster,
    /// The keyspace of the Scylla stores and the prefix of the objects in the bucket, both
    /// this topology's own.
    pub keyspace: String,
    /// Every service process by instance name (`api-1`, `runner-2`, `runner-sim`, …).
    procs: BTreeMap<String, Proc>,
    /// The gRPC address of every instance.
    pub addrs: BTreeMap<String, SocketAddr>,
    /// Every listen address of every instance by TOML key (`grpc.listen`, `metrics.listen`):
    /// the loopback port that stands in for the container port of compose.yaml.
    pub listens: BTreeMap<String, BTreeMap<String, SocketAddr>>,
    /// The bootstrap admin's token.
    pub token: String,
    /// The CA and certificates of a TLS-only topology.
    pub tls: Option<tls::TopologyTls>,
}

/// Where the service binaries are: `KILN_TOPOLOGY_BIN` when set (a benchmark runs the release
/// builds), else the workspace's target directory of the running program (`target/debug`).
pub fn binaries_dir() -> PathBuf {
    let dir = std::env::var_os("KILN_TOPOLOGY_BIN").map_or_else(program_dir, PathBuf::from);
    for service in SERVICES {
        let binary = dir.join(format!("kiln-{service}"));
        assert!(
            binary.try_exists().unwrap_or(false),
            "{} does not exist: build the workspace first (cargo build --workspace)",
            binary.display()
        );
    }
    dir
}

fn program_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the program's path");
    let dir = exe.parent().expect("a directory").to_path_buf();
    // Test binaries live in target/<profile>/deps.
    if dir.file_name().is_some_and(|name| name == "deps") {
        dir.parent().expect("target/<profile>").to_path_buf()
    } else {
        dir
    }
}

fn wait_listening(proc: &mut Proc, addr: SocketAddr) {
    let deadline = Instant::now() + START_PATIENCE;
    while std::net::TcpStream::connect(addr).is_err() {
        if let Some(status) = proc.exited() {
            panic!(
                "{} exited ({status}) before listening:\n{}",
                proc.name,
                proc.log_tail(40)
            );
        }
        assert!(
            Instant::now() < deadline,
            "{} did not listen on {addr}:\n{}",
            proc.name,
            proc.log_tail(40)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

impl Topology {
    /// Starts everything and waits until every instance listens.
    pub async fn start(options: Options) -> Topology {
        let (dir, temp) = match &options.dir {
            Some(dir) => {
                std::fs::create_dir_all(dir).expect("topology dir");
                (dir.clone(), None)
            }
            None => {
                let temp = tempfile::Builder::new()
                    .prefix("kiln-topology.")
                    .tempdir()
                    .expect("temp dir");
                (temp.path().to_path_buf(), Some(temp))
            }
        };
        // The services' files (configs, logs, volumes) are kiln's alone, as each service's own
        // machine or container keeps them: the runners' isolated jobs run as other users here.
        // The topology's root lets others through only (Postgres, run as its own user, keeps
        // its data in a directory of its own under it).
        let private = |path: &std::path::Path, mode: u32| {
            std::fs::set_permissions(path, std::os::unix::fs::PermissionsExt::from_mode(mode))
                .expect("a topology dir's mode")
        };
        private(&dir, 0o711);
        for sub in ["config", "logs", "work", "volumes", "tls", "cli-home"] {
            std::fs::create_dir_all(dir.join(sub)).expect("topology subdir");
            private(&dir.join(sub), 0o700);
        }
        let postgres = Postgres::start(&dir.join("postgres"));
        let nats = if options.tls {
            NatsCluster::start_secure().await
        } else {
            NatsCluster::start_authorized().await
        };
        let tls = options.tls.then(|| tls::TopologyTls::new(&dir.join("tls")));
        let s3 = options.s3.clone();
        let keyspace = format!("kiln_topo_{}", kiln_core::ids::new_id().replace('-', "_"));
        let keyspace: String = keyspace.chars().take(48).collect();
        let bin = binaries_dir();
        let compose = compose::load();
        let infra = plan::Infra {
            dir: &dir,
            bin: &bin,
            database_url: postgres.url(),
            postgres: format!("127.0.0.1:{}", postgres.port),
            nats_urls: nats.urls(),
            nats_monitors: nats.monitor_urls(),
            scylla_nodes: &options.scylla_nodes,
            s3: &s3,
            keyspace: &keyspace,
            lease_ttl_ms: options.lease_ttl_ms,
            nats: nats.config(),
            nats_seeds: nats.users.as_ref().map(|users| users.seed_files()).unwrap_or_default(),
            tls: tls.as_ref(),
            gang_runners: options.gang_runners,
        };
        let instances = plan::plan(&compose, &infra);
        let names: Vec<String> = instances.iter().map(|instance| instance.name.clone()).collect();
        let mut procs = BTreeMap::new();
        let mut addrs = BTreeMap::new();
        let mut listens = BTreeMap::new();
        let mut token_file = None;
        for instance in instances {
            let grpc = *instance
                .listens
                .get("grpc.listen")
                .unwrap_or_else(|| panic!("{}: its config has no grpc.listen", instance.name));
            addrs.insert(instance.name.clone(), grpc);
            if instance.name == "api-1" {
                token_file = instance.token_file.clone();
            }
            let args: Vec<&str> = instance.args.iter().map(String::as_str).collect();
            let proc = Proc::new(
                &instance.name,
                &instance.program,
                &args,
                instance.env,
                dir.join("logs").join(format!("{}.log", instance.name)),
            );
            procs.insert(instance.name.clone(), proc);
            listens.insert(instance.name, instance.listens);
        }
        let token_file = token_file.expect("api.toml has bootstrap-token-file");
        let mut topology = Topology {
            dir,
            _temp: temp,
            postgres,
            nats,
            keyspace,
            procs,
            addrs,
            listens,
            token: String::new(),
            tls,
        };
        // api-1 first: it applies the migrations and writes the bootstrap admin's token.
        topology.start_and_wait("api-1");
        topology.token = std::fs::read_to_string(&token_file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", token_file.display()))
            .trim()
            .to_string();
        // The gang runners' jobs run as their own user: the admin's jobs only (its id is made
        // by api-1's bootstrap).
        let gang: Vec<&String> = names.iter().filter(|name| name.starts_with(GANG_RUNNER)).collect();
        if !gang.is_empty() {
            let admin = topology.admin_id().await;
            for name in gang {
                let proc = topology.procs.get_mut(name).expect("a process");
                proc.set_env("KILN_RUNNER__PROCESS__TRUSTED_OWNER", &format!("{admin:?}"));
            }
        }
        let rest: Vec<String> = names.iter().filter(|name| *name != "api-1").cloned().collect();
        for name in &rest {
            topology.procs.get_mut(name).expect("a process").start();
        }
        for name in &rest {
            let addr = topology.addrs[name];
            wait_listening(topology.procs.get_mut(name).expect("a process"), addr);
        }
        topology
    }

    /// The bootstrap admin's user id.
    async fn admin_id(&self) -> String {
        let config = kiln_core::config::DatabaseConfig {
            url: kiln_core::config::DatabaseUrl::new(self.postgres.url()),
            ..Default::default()
        };
        let store = kiln_core::store::Store::connect(&config)
            .await
            .expect("the topology's Postgres");
        let users = store.list_users().await.expect("its users");
        users
            .into_iter()
            .find(|user| user.name == "admin")
            .expect("api-1 made the admin")
            .id
    }

    fn start_and_wait(&mut self, name: &str) {
        let addr = self.addrs[name];
        let proc = self.procs.get_mut(name).unwrap_or_else(|| panic!("no process {name}"));
        proc.start();
        wait_listening(proc, addr);
    }

    /// Every service instance's name.
    pub fn instances(&self) -> Vec<String> {
        self.procs.keys().cloned().collect()
    }

    pub fn proc(&mut self, name: &str) -> &mut Proc {
        self.procs.get_mut(name).unwrap_or_else(|| panic!("no process {name}"))
    }

    /// The pid of a running instance.
    pub fn pid(&self, name: &str) -> u32 {
        self.procs
            .get(name)
            .and_then(Proc::pid)
            .unwrap_or_else(|| panic!("{name} does not run"))
    }

    /// SIGKILLs an instance.
    pub fn kill(&mut self, name: &str) {
        self.proc(name).kill();
    }

    /// Starts a killed instance again and waits until it listens.
    pub fn restart(&mut self, name: &str) {
        self.start_and_wait(name);
    }

    /// The `/metrics` address of an instance (its `metrics.listen`).
    pub fn metrics_addr(&self, name: &str) -> SocketAddr {
        *self
            .listens
            .get(name)
            .and_then(|listens| listens.get("metrics.listen"))
            .unwrap_or_else(|| panic!("{name} has no metrics.listen in deploy/compose/config"))
    }

    pub fn url(&self, name: &str) -> String {
        let scheme = if self.tls.is_some() { "https" } else { "http" };
        format!("{scheme}://{}", self.addrs[name])
    }

    /// The variables that point the CLI and the SDK at the topology: its addresses, the token,
    /// and with TLS the CA and a client certificate.
    pub fn client_env(&self) -> Vec<(&'static str, String)> {
        let mut env = vec![
            ("KILN_ADDR", self.url("api-1")),
            ("KILN_LOGS_ADDR", self.url("log-ingest-1")),
            ("KILN_BATCH_ADDR", self.url("item-batch-1")),
            ("KILN_ADVISOR_ADDR", self.url("advisor-1")),
            ("KILN_PREDICTOR_ADDR", self.url("predictor-1")),
            ("KILN_TOKEN", self.token.clone()),
        ];
        if let Some(tls) = &self.tls {
            let path = |path: &std::path::Path| path.display().to_string();
            env.push(("KILN_CA_FILE", path(&tls.ca.ca_file)));
            env.push(("KILN_CLIENT_CERT", path(&tls.client.cert_file)));
            env.push(("KILN_CLIENT_KEY", path(&tls.client.key_file)));
        }
        env
    }

    /// The `export` lines a shell can `eval` to point the CLI and the SDK at the topology.
    pub fn exports(&self) -> String {
        let pairs: Vec<String> = self
            .client_env()
            .into_iter()
            .map(|(name, value)| format!("{name}={value}"))
            .collect();
        format!("export {}", pairs.join(" "))
    }

    /// SIGTERMs every instance (the servers go when the topology is dropped).
    pub fn stop(&mut self) {
        for proc in self.procs.values_mut() {
            proc.stop(Duration::from_secs(15));
        }
    }
}
