//! Every instance of the topology planned from the compose file: its program, its `--config`
//! (compose's own TOML file), its environment (compose's, with what must differ on one machine
//! rewritten through kiln's env overrides) and the loopback port of each container port.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use kiln_core::testing::free_port;

use crate::compose::{Compose, Rewrite, Service, env_value};
use crate::{GANG_RUNNER, S3, SERVICES, SIM_RUNNER};

/// The servers the topology stands in with for compose's own.
pub struct Infra<'a> {
    pub dir: &'a Path,
    pub bin: &'a Path,
    pub database_url: String,
    /// `host:port` of the Postgres.
    pub postgres: String,
    pub nats_urls: Vec<String>,
    pub nats_monitors: Vec<String>,
    pub scylla_nodes: &'a [String],
    pub s3: &'a S3,
    pub keyspace: &'a str,
    pub lease_ttl_ms: u64,
    /// The nats-servers' client settings (their TLS, when the cluster is secure).
    pub nats: kiln_core::config::NatsConfig,
    /// Each service's NKey seed: the cluster admits only these users, each with the subjects
    /// of `kiln_core::nats_auth` (what deploy/compose's gen-creds.sh makes for compose).
    pub nats_seeds: BTreeMap<kiln_core::nats_auth::Service, PathBuf>,
    /// TLS on every gRPC listener, when the topology is TLS-only.
    pub tls: Option<&'a crate::tls::TopologyTls>,
    /// Runners of the `gang` pool (`crate::Options::gang_runners`).
    pub gang_runners: usize,
}

/// One process to start.
pub struct Instance {
    pub name: String,
    pub program: PathBuf,
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    /// Container port → its loopback address.
    pub ports: BTreeMap<u16, SocketAddr>,
    /// TOML key of every listen address (`grpc.listen`, `metrics.listen`) → its loopback address.
    pub listens: BTreeMap<String, SocketAddr>,
    /// Where the file of `bootstrap-token-file` goes, when the service has one.
    pub token_file: Option<PathBuf>,
}

fn authority(url: &str) -> String {
    let rest = url.split_once("://").map_or(url, |(_, rest)| rest);
    rest.split('/').next().unwrap_or(rest).to_string()
}

/// The instance names: two replicas of every service, the sim runner, and `gang_runners`
/// runners of the gang pool.
pub fn names(gang_runners: usize) -> Vec<String> {
    let mut names: Vec<String> = SERVICES
        .iter()
        .flat_map(|service| (1..=2).map(move |replica| format!("{service}-{replica}")))
        .collect();
    names.push(SIM_RUNNER.into());
    names.extend((1..=gang_runners).map(|n| format!("{GANG_RUNNER}{n}")));
    names
}

/// The compose service of an instance (`runner-sim` → `kiln-runner`) and the replica number of
/// the instances it talks to.
fn service_of(name: &str) -> (String, String) {
    if name == SIM_RUNNER {
        return ("kiln-runner".into(), "1".into());
    }
    if let Some(n) = name.strip_prefix(GANG_RUNNER) {
        // Half of them talk to the first replicas, half to the second.
        let n: usize = n.parse().expect("a gang runner's number");
        return ("kiln-runner".into(), ((n - 1) % 2 + 1).to_string());
    }
    let (service, replica) = name.rsplit_once('-').expect("service-replica");
    (format!("kiln-{service}"), replica.into())
}

/// Plans every instance.
pub fn plan(compose: &Compose, infra: &Infra) -> Vec<Instance> {
    let wanted: BTreeSet<String> = SERVICES.iter().map(|s| format!("kiln-{s}")).collect();
    let present: BTreeSet<String> = compose.services.keys().cloned().collect();
    assert_eq!(
        wanted, present,
        "deploy/compose/compose.yaml must have exactly the kiln services the harness runs"
    );
    let names = names(infra.gang_runners);
    let mut taken = BTreeSet::new();
    let mut ports: BTreeMap<String, BTreeMap<u16, SocketAddr>> = BTreeMap::new();
    for name in &names {
        let service = &compose.services[&service_of(name).0];
        let mut map = BTreeMap::new();
        for port in &service.ports {
            let mut free = free_port();
            while !taken.insert(free) {
                free = free_port();
            }
            map.insert(*port, SocketAddr::from(([127, 0, 0, 1], free)));
        }
        ports.insert(name.clone(), map);
    }
    names
        .iter()
        .map(|name| instance(compose, infra, &ports, name))
        .collect()
}

fn instance(
    compose: &Compose,
    infra: &Infra,
    ports: &BTreeMap<String, BTreeMap<u16, SocketAddr>>,
    name: &str,
) -> Instance {
    let (service_name, peer) = service_of(name);
    let service: &Service = &compose.services[&service_name];
    let mut rewrite = Rewrite {
        hosts: compose.hosts.clone(),
        ..Rewrite::default()
    };
    let one = |addr: String| vec![addr];
    for (index, url) in infra.nats_urls.iter().enumerate() {
        rewrite
            .authorities
            .insert(format!("nats-{}:4222", index + 1), one(authority(url)));
    }
    for (index, url) in infra.nats_monitors.iter().enumerate() {
        rewrite
            .authorities
            .insert(format!("nats-{}:8222", index + 1), one(authority(url)));
    }
    rewrite
        .authorities
        .insert("scylla:9042".into(), infra.scylla_nodes.to_vec());
    rewrite
        .authorities
        .insert("s3:7070".into(), one(authority(&infra.s3.endpoint)));
    rewrite
        .authorities
        .insert("postgres:5432".into(), one(infra.postgres.clone()));
    // Other kiln services: the replica of the same number.
    for (other, spec) in &compose.services {
        let instance = format!("{}-{peer}", other.trim_start_matches("kiln-"));
        for port in &spec.ports {
            let addr = ports[&instance][port];
            rewrite
                .authorities
                .insert(format!("{other}:{port}"), one(addr.to_string()));
        }
    }
    for (port, addr) in &ports[name] {
        rewrite
            .authorities
            .insert(format!("0.0.0.0:{port}"), one(addr.to_string()));
    }
    for target in &service.volumes {
        let dir = infra
            .dir
            .join("volumes")
            .join(name)
            .join(target.trim_start_matches('/').replace('/', "_"));
        std::fs::create_dir_all(&dir).expect("a volume directory");
        rewrite.paths.insert(target.clone(), dir.display().to_string());
    }

    let table = service.table();
    let prefix = service.env_prefix();
    let mut env = rewrite.overrides(&prefix, &table);
    let mut set = |key: &str, value: toml::Value| {
        env.insert(format!("{prefix}{key}"), env_value(&value));
    };
    let text = |value: &str| toml::Value::String(value.to_string());
    // What differs per instance, or per test run.
    for key in ["instance-name", "runner-id"] {
        if table.contains_key(key) {
            set(&key.to_uppercase().replace('-', "_"), text(name));
        }
    }
    if table.contains_key("lease-ttl-ms") {
        let ttl = i64::try_from(infra.lease_ttl_ms).expect("a lease TTL");
        set("LEASE_TTL_MS", toml::Value::Integer(ttl));
    }
    if table.contains_key("objects") {
        set(
            "OBJECTS__URL",
            text(&format!("s3://{}/{}", infra.s3.bucket, infra.keyspace)),
        );
    }
    if table.contains_key("scylla") {
        set("SCYLLA__KEYSPACE", text(infra.keyspace));
    }
    if service_name == "kiln-runner" {
        // The predictors reach the relays' direct channels on this machine.
        set("RELAY__DIRECT_ADVERTISE_HOST", text("127.0.0.1"));
        // compose gives jobs the host's published ports (they run on an isolated network);
        // here, the api and log-ingest of the runner's replica number.
        for (key, service, port) in [("API_URL", "api", 7070), ("LOGS_URL", "log-ingest", 7071)] {
            set(
                key,
                text(&format!("http://{}", ports[&format!("{service}-{peer}")][&port])),
            );
        }
    }
    match (service_name.as_str(), name == SIM_RUNNER) {
        ("kiln-item-batch", _) => {
            // Workers are told every replica, not compose's one name.
            let grpc: u16 = table["grpc"]["listen"]
                .as_str()
                .and_then(|listen| listen.rsplit_once(':'))
                .and_then(|(_, port)| port.parse().ok())
                .expect("item-batch.toml has grpc.listen");
            let urls: Vec<String> = (1..=2)
                .map(|replica| format!("http://{}", ports[&format!("item-batch-{replica}")][&grpc]))
                .collect();
            set("ADVERTISE_URL", text(&urls.join(",")));
            set("AGENT_PATH", text(&infra.bin.join("kiln-agent").display().to_string()));
        }
        ("kiln-runner", false) => {
            // Processes instead of containers: the tests' jobs are commands of this machine.
            set("PROVIDER", text("process"));
            set("AGENT_BINARY", text(""));
            // Its isolated jobs' firewall lets them reach every replica of the api's HTTP API,
            // item-batch, the advisor and the predictor (compose names the ports the host
            // publishes).
            let mut endpoints = Vec::new();
            for (service, port) in [
                ("api", 7079),
                ("item-batch", 7075),
                ("advisor", 7076),
                ("predictor", 7077),
                ("predictor", 7078),
            ] {
                for replica in 1..=2 {
                    endpoints.push(text(&ports[&format!("{service}-{replica}")][&port].to_string()));
                }
            }
            set("DOCKER__JOB_ENDPOINTS", toml::Value::Array(endpoints));
            if name.starts_with(GANG_RUNNER) {
                // One node per runner; nodes reach one another over the machine's network.
                set("POOL", text("gang"));
                set("CPU_MILLIS", toml::Value::Integer(1000));
                set("PROCESS__ISOLATION", text("off"));
                set("OUTPUTS_SYNC_INTERVAL_SECS", toml::Value::Integer(1));
            }
        }
        ("kiln-advisor", _) => {
            // Trials reach the replica that made them at its own port.
            set("ADVERTISE_URL", text(&format!("http://{}", ports[name][&7076])));
        }
        ("kiln-runner", true) => {
            set("POOL", text("sim"));
            set("PROVIDER", text("sim"));
            set("AGENT_BINARY", text(""));
            for (key, value) in [
                ("SEED", 7),
                ("BOOT_MIN_MS", 200),
                ("BOOT_MAX_MS", 800),
                ("MAX_INSTANCES", 50),
            ] {
                set(&format!("SIM__{key}"), toml::Value::Integer(value));
            }
        }
        _ => {}
    }
    for (key, value) in &service.environment {
        // compose's Scylla requires a password; the harness's Cassandra does not, and compose's
        // secret file does not exist here.
        if key.ends_with("__SCYLLA__USERNAME") || key.ends_with("__SCYLLA__PASSWORD_FILE") {
            continue;
        }
        let value = if key.ends_with("__DATABASE__URL") {
            infra.database_url.clone()
        } else if key == "AWS_ACCESS_KEY_ID" {
            infra.s3.access_key_id.clone()
        } else if key == "AWS_SECRET_ACCESS_KEY" {
            infra.s3.secret_access_key.clone()
        } else {
            rewrite.string(value)
        };
        env.insert(key.clone(), value);
    }

    let mut nats = infra.nats.clone();
    let nats_user = kiln_core::nats_auth::Service::from_name(service_name.trim_start_matches("kiln-"));
    if let Some(seed) = nats_user.and_then(|user| infra.nats_seeds.get(&user)) {
        nats.nkey_seed_file = Some(seed.clone());
    }
    crate::tls::nats_overrides(&prefix, &nats, &mut env);
    if let Some(tls) = infra.tls {
        tls.overrides(&prefix, &service_name, &mut env);
    }

    let mut listens = BTreeMap::new();
    collect_listens("", &table, &ports[name], &mut listens);
    let token_file = table
        .get("bootstrap-token-file")
        .and_then(toml::Value::as_str)
        .map(|path| PathBuf::from(rewrite.string(path)));
    Instance {
        name: name.to_string(),
        program: infra.bin.join(&service.program),
        args: vec!["--config".into(), service.config.display().to_string()],
        env: env.into_iter().collect(),
        ports: ports[name].clone(),
        listens,
        token_file,
    }
}

/// Every `0.0.0.0:PORT` of the file, by dotted key, with the loopback address it became.
fn collect_listens(
    prefix: &str,
    table: &toml::Table,
    ports: &BTreeMap<u16, SocketAddr>,
    out: &mut BTreeMap<String, SocketAddr>,
) {
    for (key, value) in table {
        let path = format!("{prefix}{key}");
        match value {
            toml::Value::Table(inner) => collect_listens(&format!("{path}."), inner, ports, out),
            toml::Value::String(text) => {
                if let Some(port) = text.strip_prefix("0.0.0.0:") {
                    let port: u16 = port.parse().expect("a port");
                    if port == 0 {
                        // Any free port (the relays' direct channels): on the loopback here too.
                        out.insert(path, SocketAddr::from(([127, 0, 0, 1], 0)));
                        continue;
                    }
                    let addr = ports
                        .get(&port)
                        .unwrap_or_else(|| panic!("{path} = {text:?} listens on a port compose.yaml does not publish"));
                    out.insert(path, *addr);
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The real compose file plans every instance: each listens on its own loopback ports for
    /// gRPC and metrics (the predictor also for its REST API), and no host name of compose's
    /// network is left in its environment.
    #[test]
    fn the_compose_file_plans_every_instance() {
        let compose = crate::compose::load();
        let dir = tempfile::tempdir().unwrap();
        let s3 = S3 {
            endpoint: "http://127.0.0.1:1".into(),
            bucket: "b".into(),
            access_key_id: "id".into(),
            secret_access_key: "secret".into(),
        };
        let nodes = vec!["127.0.0.1:9042".to_string(), "127.0.0.1:9043".to_string()];
        let infra = Infra {
            dir: dir.path(),
            bin: Path::new("/bin-dir"),
            database_url: "postgres://postgres@127.0.0.1:5/postgres".into(),
            postgres: "127.0.0.1:5".into(),
            nats_urls: (1..=3).map(|n| format!("nats://127.0.0.1:{n}")).collect(),
            nats_monitors: (1..=3).map(|n| format!("http://127.0.0.1:1{n}")).collect(),
            scylla_nodes: &nodes,
            s3: &s3,
            keyspace: "ks",
            lease_ttl_ms: 3000,
            nats: kiln_core::config::NatsConfig::default(),
            nats_seeds: [(kiln_core::nats_auth::Service::Runner, PathBuf::from("/seeds/runner.nk"))].into(),
            tls: None,
            gang_runners: 2,
        };
        let instances = plan(&compose, &infra);
        assert_eq!(instances.len(), names(2).len());
        let gang = instances
            .iter()
            .find(|i| i.name == "runner-gang-2")
            .expect("a gang runner");
        for (key, value) in [("POOL", "\"gang\""), ("PROCESS__ISOLATION", "\"off\"")] {
            assert!(
                gang.env
                    .iter()
                    .any(|(k, v)| k.ends_with(&format!("__{key}")) && v == value),
                "{:?}",
                gang.env
            );
        }
        let mut seen = BTreeSet::new();
        for instance in &instances {
            for key in ["grpc.listen", "metrics.listen"] {
                assert!(instance.listens.contains_key(key), "{}: no {key}", instance.name);
            }
            for (key, addr) in &instance.listens {
                // Port 0 (the relays' direct channels) is any free port: never taken twice.
                assert!(
                    addr.port() == 0 || seen.insert(*addr),
                    "{}: {key} {addr} is taken twice",
                    instance.name
                );
            }
            let env: BTreeMap<&str, &str> = instance.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
            // Rewrite::string panics on a value still naming a compose host.
            let check = Rewrite {
                hosts: compose.hosts.clone(),
                ..Rewrite::default()
            };
            for value in env.values() {
                check.string(value);
            }
            assert!(
                instance.program.starts_with("/bin-dir"),
                "{}",
                instance.program.display()
            );
        }
        let scheduler = instances.iter().find(|i| i.name == "scheduler-1").unwrap();
        let env: BTreeMap<&str, &str> = scheduler.env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
        assert_eq!(
            env["KILN_SCHEDULER__NATS__URL"],
            "\"nats://127.0.0.1:1,nats://127.0.0.1:2,nats://127.0.0.1:3\""
        );
        assert_eq!(
            env["KILN_SCHEDULER__METRICS__NATS_MONITOR"],
            "[\"http://127.0.0.1:11\", \"http://127.0.0.1:12\", \"http://127.0.0.1:13\"]"
        );
        assert_eq!(env["KILN_SCHEDULER__DATABASE__URL"], infra.database_url);
        // Each service its own NATS user: the runner's seed to the runners only.
        assert!(!env.contains_key("KILN_SCHEDULER__NATS__NKEY_SEED_FILE"));
        let runner = instances.iter().find(|i| i.name.starts_with("runner")).unwrap();
        assert!(
            runner.env.contains(&(
                "KILN_RUNNER__NATS__NKEY_SEED_FILE".into(),
                "\"/seeds/runner.nk\"".into()
            )),
            "{:?}",
            runner.env
        );
        // Each predictor replica advertises its own REST API.
        for name in ["predictor-1", "predictor-2"] {
            let predictor = instances.iter().find(|i| i.name == name).unwrap();
            let http = predictor.listens["http-listen"];
            assert!(
                predictor.env.contains(&(
                    "KILN_PREDICTOR__HTTP_ADVERTISE_URL".into(),
                    format!("\"http://{http}\"")
                )),
                "{name}: {:?}",
                predictor.env
            );
        }
        let sim = instances.iter().find(|i| i.name == SIM_RUNNER).unwrap();
        assert!(sim.env.contains(&("KILN_RUNNER__POOL".into(), "\"sim\"".into())));
        let api = instances.iter().find(|i| i.name == "api-1").unwrap();
        assert!(api.token_file.as_ref().unwrap().starts_with(dir.path()));
    }
}
