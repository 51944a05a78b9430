//! Issue 26's hostile tenant on the production topology (every service a process of its own,
//! two replicas each, a Postgres, a three-node NATS cluster with a user per service, Cassandra,
//! S3), run as root as CI runs it: eve, a member of project `beta` only, tries the three attacks
//! the issue opens with through the CLI, then a process job of hers tries kiln's files (the
//! admin's token, every service's NATS seed, the services' configurations, logs and
//! environments, another tenant's running job) and every port of the data plane and of the
//! services (Postgres, each NATS node and its monitor, Cassandra, S3, every gRPC, HTTP and
//! metrics listener) and the metadata address. Every attempt fails but the job's endpoints
//! (its runner's api and log-ingest, item-batch); the controls: ada does each first step in
//! her own project, and the same probes run by kiln's own user read and open everything.
//!
//! Needs root (not root, the test fails saying so), iptables, and what `Options::from_env`
//! names (scripts/test.sh starts it).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use kiln_core::nats_auth::Service;
use kiln_core::testing::hostile::{Tenant, assert_root, cross_project_attacks, env_of, pid_of_job, verdicts};
use kiln_topology::{Options, Topology, binaries_dir};

const PATIENCE: Duration = Duration::from_secs(120);

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// The CLI against the topology as the holder of `token`.
fn kiln(topology: &Topology, token: &str, args: &[&str]) -> Output {
    Command::new(binaries_dir().join("kiln"))
        .args(args)
        .envs(topology.client_env())
        .env("KILN_HOME", topology.dir.join("cli-home"))
        .env("KILN_TOKEN", token)
        .output()
        .expect("run kiln")
}

fn ok(output: Output) -> String {
    assert!(output.status.success(), "{}", text(&output.stderr));
    text(&output.stdout)
}

fn last_line(output: Output) -> String {
    ok(output).lines().last().unwrap_or_default().trim().to_string()
}

fn wait_for_state(topology: &Topology, job: &str, state: &str) {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let status = ok(kiln(topology, &topology.token, &["status", job, "-o", "json"]));
        if status.contains(&format!("\"{state}\"")) {
            return;
        }
        assert!(Instant::now() < deadline, "{job} never {state}: {status}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

fn port_of(address: &str) -> u16 {
    address
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .parse()
        .unwrap()
}

/// A process job's probes (bash): `read|denied <file>` per file argument before `--`, then
/// `open|closed port-<port>` per port after it, then the metadata address.
const PROBES: &str = r#"
probe() { if cat "$1" >/dev/null 2>&1; then echo "read $1"; else echo "denied $1"; fi; }
connect() {
  if timeout 3 bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null; then echo "open $1"; else echo "closed $1"; fi
}
while [ "$1" != -- ]; do probe "$1"; shift; done
shift
for port in "$@"; do connect "port-$port" 127.0.0.1 "$port"; done
connect metadata 169.254.169.254 80
"#;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn eve_reaches_neither_alphas_data_nor_the_data_plane_on_the_topology() {
    assert_root();
    let options = Options::from_env();
    let topology = Topology::start(options.clone()).await;
    let admin = topology.token.clone();
    let user = |name: &str, project: &str| {
        let token = last_line(kiln(&topology, &admin, &["user", "create", name]));
        ok(kiln(&topology, &admin, &["project", "create", project]));
        ok(kiln(
            &topology,
            &admin,
            &["project", "add-member", project, name, "--role", "member"],
        ));
        token
    };
    let ada = user("ada", "alpha");
    let eve = user("eve", "beta");
    let as_ada = |args: &[&str]| kiln(&topology, &ada, args);
    let as_eve = |args: &[&str]| kiln(&topology, &eve, args);

    // Attacks 1 and 2: alpha's dataset and job outputs from beta.
    cross_project_attacks(
        &|tenant, args| match tenant {
            Tenant::Ada => as_ada(args),
            Tenant::Eve => as_eve(args),
        },
        &|job| wait_for_state(&topology, job, "SUCCEEDED"),
        &["--pool", "local"],
    );

    // Attack 3: eve's process job against kiln's files and every port.
    let victim = last_line(as_ada(&[
        "run",
        "--no-code",
        "--pool",
        "local",
        "--project",
        "alpha",
        "--",
        "sh",
        "-c",
        "echo $KILN_TOKEN > $KILN_OUTPUTS/token; exec sleep 600",
    ]));
    wait_for_state(&topology, &victim, "RUNNING");
    let victim_pid = pid_of_job(&victim);
    let outputs = env_of(victim_pid, "KILN_OUTPUTS");
    let deadline = Instant::now() + PATIENCE;
    while !Path::new(&outputs).join("token").try_exists().unwrap() {
        assert!(Instant::now() < deadline, "the victim never wrote its token");
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut files: Vec<PathBuf> = vec![
        PathBuf::from(format!("/proc/{victim_pid}/environ")),
        Path::new(&outputs).join("token"),
        topology.dir.join("logs/api-1.log"),
    ];
    let users = topology.nats.users.as_ref().expect("the cluster's users");
    files.extend(
        Service::ALL
            .iter()
            .map(|service| users.seed_file(*service).to_path_buf()),
    );
    for service in ["api-1", "runner-1", "item-batch-1", "log-ingest-1"] {
        // A service's environment holds its secrets (S3 keys, the database URL).
        let pid = topology.pid(service);
        files.push(PathBuf::from(format!("/proc/{pid}/environ")));
    }
    for entry in std::fs::read_dir(topology.dir.join("config"))
        .unwrap()
        .flatten()
        .take(3)
    {
        files.push(entry.path());
    }
    let mut ports: BTreeSet<u16> = topology
        .listens
        .values()
        .flat_map(|listens| listens.values().map(|address| address.port()))
        .collect();
    ports.insert(topology.postgres.port);
    ports.extend(topology.nats.urls().iter().map(|url| port_of(url)));
    ports.extend(topology.nats.monitor_urls().iter().map(|url| port_of(url)));
    ports.extend(options.scylla_nodes.iter().map(|node| port_of(node)));
    ports.insert(port_of(&options.s3.endpoint));
    let endpoint_of = |name: &str| format!("port-{}", topology.addrs[name].port());
    // What jobs are given: every listener but the metrics of the api, log-ingest, item-batch,
    // the advisor and the predictor (the runners' job endpoints, tests/topology/src/plan.rs).
    let endpoints: BTreeSet<String> = topology
        .listens
        .iter()
        .filter(|(name, _)| {
            ["api-", "log-ingest-", "item-batch-", "advisor-", "predictor-"]
                .iter()
                .any(|service| name.starts_with(service))
        })
        .flat_map(|(_, listens)| listens.iter())
        .filter(|(key, _)| key.as_str() != "metrics.listen")
        .map(|(_, address)| format!("port-{}", address.port()))
        .collect();

    let mut args: Vec<String> = [
        "run",
        "-f",
        "--no-code",
        "--pool",
        "local",
        "--project",
        "beta",
        "--",
        "bash",
        "-c",
        PROBES,
        "bash",
    ]
    .iter()
    .map(|arg| arg.to_string())
    .collect();
    let file_args: Vec<String> = files.iter().map(|file| file.display().to_string()).collect();
    let port_args: Vec<String> = ports.iter().map(u16::to_string).collect();
    args.extend(file_args.iter().cloned());
    args.push("--".into());
    args.extend(port_args.iter().cloned());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();

    // The control first: kiln's own user reads every file and reaches the data plane; what it
    // opens is what listens (a configured listener may be off).
    let control = Command::new("bash")
        .args(["-c", PROBES, "bash"])
        .args(&file_args)
        .arg("--")
        .args(&port_args)
        .output()
        .unwrap();
    let control = text(&control.stdout);
    assert_eq!(verdicts(&control, "read ").len(), files.len(), "{control}");
    let listening = verdicts(&control, "open ");
    let mut data_plane = vec![topology.postgres.port, port_of(&options.s3.endpoint)];
    data_plane.extend(topology.nats.urls().iter().map(|url| port_of(url)));
    data_plane.extend(options.scylla_nodes.iter().map(|node| port_of(node)));
    for port in data_plane {
        assert!(listening.contains(&format!("port-{port}")), "{port}: {control}");
    }
    assert!(listening.len() > 20, "{control}");

    let output = ok(as_eve(&args));
    let read = verdicts(&output, "read ");
    assert!(read.is_empty(), "eve's job read {read:?}:\n{output}");
    assert_eq!(verdicts(&output, "denied ").len(), files.len(), "{output}");
    let open = verdicts(&output, "open ");
    assert!(
        open.is_subset(&endpoints),
        "eve's job reached {:?}:\n{output}",
        open.difference(&endpoints)
    );
    // Its runner's api and log-ingest, and both item-batch replicas, are what it is given.
    for name in ["item-batch-1", "item-batch-2"] {
        assert!(open.contains(&endpoint_of(name)), "{name}:\n{output}");
    }
    assert!(
        open.contains(&endpoint_of("api-1")) || open.contains(&endpoint_of("api-2")),
        "{output}"
    );
    let closed = verdicts(&output, "closed ");
    assert!(closed.contains("metadata"), "{output}");
    for port in listening.difference(&endpoints) {
        assert!(closed.contains(port), "{port} was not closed:\n{output}");
    }

    ok(kiln(&topology, &admin, &["stop", &victim]));
}
