//! kiln-topology: the production topology on one machine, every part a separate process on
//! 127.0.0.1, for the chaos tests and for a person (`scripts/cluster.sh up|down`).
//!
//! It starts a Postgres of its own ([`postgres`]) and three clustered nats-servers with
//! JetStream ([`kiln_core::testing::NatsCluster`]), uses the Cassandra of
//! `KILN_TEST_SCYLLA_NODES` (a fresh keyspace) for the Scylla stores and the S3 server of
//! `KILN_TEST_S3_*` (a fresh prefix of its bucket) for the objects, and then two
//! replicas of every service binary from `target/` — api, scheduler, runner (process provider),
//! log-ingest, item-batch — plus one runner of a simulated pool ([`Topology::start`]). Each
//! instance reads a TOML file made from the templates in `deploy/topology/` (the same files
//! `deploy/` uses), with its own values filled in; secrets reach it only through its
//! environment. Every process can be SIGKILLed and restarted by name ([`proc`]).
#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kiln_core::testing::{NatsCluster, free_port};

pub mod postgres;
pub mod proc;

use postgres::Postgres;
use proc::Proc;

/// The service binaries, each run as two replicas.
pub const SERVICES: [&str; 5] = ["api", "scheduler", "runner", "log-ingest", "item-batch"];
/// The runner of the simulated pool.
pub const SIM_RUNNER: &str = "runner-sim";
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
    /// The bootstrap admin's token.
    pub token: String,
}

/// The workspace's target directory of the running program (`target/debug`), where the service
/// binaries are.
pub fn binaries_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the program's path");
    let dir = exe.parent().expect("a directory").to_path_buf();
    // Test binaries live in target/<profile>/deps.
    let dir = if dir.file_name().is_some_and(|name| name == "deps") {
        dir.parent().expect("target/<profile>").to_path_buf()
    } else {
        dir
    };
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

/// The templates in `deploy/topology/`.
fn templates_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/topology")
}

/// Fills `${NAME}` placeholders of a template; an unknown one is a bug in the harness.
fn fill(template: &str, values: &BTreeMap<&str, String>) -> String {
    let mut out = String::with_capacity(template.len());
    let mut rest = template;
    while let Some(start) = rest.find("${") {
        out.push_str(&rest[..start]);
        let end = rest[start..].find('}').expect("a closed placeholder") + start;
        let name = &rest[start + 2..end];
        let value = values
            .get(name)
            .unwrap_or_else(|| panic!("no value for ${{{name}}} in a deploy/topology template"));
        out.push_str(value);
        rest = &rest[end + 1..];
    }
    out.push_str(rest);
    out
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
        for sub in ["config", "logs", "work"] {
            std::fs::create_dir_all(dir.join(sub)).expect("topology subdir");
        }
        let postgres = Postgres::start(&dir.join("postgres"));
        let nats = NatsCluster::start().await;
        let s3 = options.s3.clone();
        let keyspace = format!("kiln_topo_{}", kiln_core::ids::new_id().replace('-', "_"));
        let keyspace: String = keyspace.chars().take(48).collect();
        let bin = binaries_dir();

        let mut names: Vec<String> = Vec::new();
        for service in SERVICES {
            for replica in 1..=2 {
                names.push(format!("{service}-{replica}"));
            }
        }
        names.push(SIM_RUNNER.into());
        let addrs: BTreeMap<String, SocketAddr> = names
            .iter()
            .map(|name| (name.clone(), SocketAddr::from(([127, 0, 0, 1], free_port()))))
            .collect();
        let url = |name: &str| format!("http://{}", addrs[name]);
        let shared: BTreeMap<&str, String> = BTreeMap::from([
            ("DIR", dir.display().to_string()),
            ("DATABASE_URL", postgres.url()),
            ("NATS_URLS", nats.url.clone()),
            ("OBJECTS_URL", format!("s3://{}/{keyspace}", s3.bucket)),
            ("S3_ENDPOINT", s3.endpoint.clone()),
            (
                "SCYLLA_NODES",
                options
                    .scylla_nodes
                    .iter()
                    .map(|node| format!("{node:?}"))
                    .collect::<Vec<_>>()
                    .join(", "),
            ),
            ("KEYSPACE", keyspace.clone()),
            ("LEASE_TTL_MS", options.lease_ttl_ms.to_string()),
            ("AGENT", bin.join("kiln-agent").display().to_string()),
            ("BATCH_URLS", format!("{},{}", url("item-batch-1"), url("item-batch-2"))),
        ]);
        let mut procs = BTreeMap::new();
        for name in &names {
            let (service, replica) = name.rsplit_once('-').expect("service-replica");
            let template_name = if name == SIM_RUNNER { "runner-sim" } else { service };
            let template_path = templates_dir().join(format!("{template_name}.toml"));
            let template = std::fs::read_to_string(&template_path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", template_path.display()));
            let mut values = shared.clone();
            values.insert("NAME", name.clone());
            values.insert("LISTEN", addrs[name].to_string());
            // Runners hand their jobs the api and log-ingest of the same number.
            let peer = if replica == "sim" { "1" } else { replica };
            values.insert("API_URL", url(&format!("api-{peer}")));
            values.insert("LOGS_URL", url(&format!("log-ingest-{peer}")));
            values.insert("WORK_DIR", dir.join("work").join(name).display().to_string());
            let config = dir.join("config").join(format!("{name}.toml"));
            std::fs::write(&config, fill(&template, &values)).expect("write config");
            let binary_service = if name == SIM_RUNNER { "runner" } else { service };
            let env = vec![
                ("AWS_ACCESS_KEY_ID".to_string(), s3.access_key_id.clone()),
                ("AWS_SECRET_ACCESS_KEY".to_string(), s3.secret_access_key.clone()),
                ("AWS_REGION".to_string(), "us-east-1".to_string()),
            ];
            let proc = Proc::new(
                name,
                &bin.join(format!("kiln-{binary_service}")),
                &["--config", &config.display().to_string()],
                env,
                dir.join("logs").join(format!("{name}.log")),
            );
            procs.insert(name.clone(), proc);
        }
        let mut topology = Topology {
            dir,
            _temp: temp,
            postgres,
            nats,
            keyspace,
            procs,
            addrs,
            token: String::new(),
        };
        // api-1 first: it applies the migrations and writes the bootstrap admin's token.
        topology.start_and_wait("api-1");
        let token_file = topology.dir.join("admin.token");
        topology.token = std::fs::read_to_string(&token_file)
            .unwrap_or_else(|e| panic!("cannot read {}: {e}", token_file.display()))
            .trim()
            .to_string();
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

    /// SIGKILLs an instance.
    pub fn kill(&mut self, name: &str) {
        self.proc(name).kill();
    }

    /// Starts a killed instance again and waits until it listens.
    pub fn restart(&mut self, name: &str) {
        self.start_and_wait(name);
    }

    pub fn url(&self, name: &str) -> String {
        format!("http://{}", self.addrs[name])
    }

    /// The `export` lines a shell can `eval` to point the CLI and the SDK at the topology.
    pub fn exports(&self) -> String {
        format!(
            "export KILN_ADDR={} KILN_LOGS_ADDR={} KILN_BATCH_ADDR={} KILN_TOKEN={}",
            self.url("api-1"),
            self.url("log-ingest-1"),
            self.url("item-batch-1"),
            self.token
        )
    }

    /// SIGTERMs every instance (the servers go when the topology is dropped).
    pub fn stop(&mut self) {
        for proc in self.procs.values_mut() {
            proc.stop(Duration::from_secs(15));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn templates_are_filled_and_unknown_placeholders_caught() {
        let values = BTreeMap::from([("A", "1".to_string()), ("B", "two".to_string())]);
        assert_eq!(fill("x=${A} y=\"${B}\"", &values), "x=1 y=\"two\"");
        let unknown = std::panic::catch_unwind(|| fill("${C}", &values));
        assert!(unknown.is_err());
    }

    #[test]
    fn every_template_fills_with_the_harness_values() {
        for entry in std::fs::read_dir(templates_dir()).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|ext| ext != "toml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let names = [
                "DIR",
                "DATABASE_URL",
                "NATS_URLS",
                "OBJECTS_URL",
                "S3_ENDPOINT",
                "SCYLLA_NODES",
                "KEYSPACE",
                "LEASE_TTL_MS",
                "AGENT",
                "BATCH_URLS",
                "NAME",
                "LISTEN",
                "API_URL",
                "LOGS_URL",
                "WORK_DIR",
            ];
            let mut values: BTreeMap<&str, String> = names.iter().map(|name| (*name, "v".to_string())).collect();
            // What the harness puts there: a number, and quoted node addresses.
            values.insert("LEASE_TTL_MS", "3000".into());
            values.insert("SCYLLA_NODES", "\"127.0.0.1:9042\"".into());
            let filled = fill(&text, &values);
            assert!(
                filled.parse::<toml::Table>().is_ok(),
                "{} is not TOML once filled",
                path.display()
            );
        }
    }
}
