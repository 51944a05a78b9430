//! Issue 26's hostile tenant on a fresh `kiln up` run as root, with both providers (process jobs
//! and containers of the test engine): eve, a member of project `beta` only, tries the three
//! attacks the issue opens with, then every way out a job has — kiln's files, another tenant's
//! running job, every port `kiln up` listens on (NATS, the metrics, the UI, ...) and the
//! instance metadata address. Every attempt fails, while what a job is given (the api,
//! log-ingest, item-batch, the advisor and the predictor) stays reachable. The controls: ada,
//! alpha's member, does each first step of the attacks in her own project; the same probes run
//! by kiln's own user on the host read every file and open every port.
//!
//! Needs root (CI runs the tests as root; not root, the test fails saying so), the test Docker
//! Engine and image (`KILN_TEST_DOCKER_HOST`, `KILN_TEST_IMAGE`) and iptables.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use crate::common;

use common::{Up, last_line, text};
use kiln_core::testing::hostile::{Tenant, assert_root, cross_project_attacks, env_of, pid_of_job, verdicts};

fn ok(output: std::process::Output) -> String {
    assert!(output.status.success(), "{}", text(&output.stderr));
    text(&output.stdout)
}

fn env(name: &str) -> String {
    std::env::var(name).unwrap_or_else(|_| panic!("{name} is not set: run the tests through scripts/test.sh"))
}

/// The port of a URL or `host:port`.
fn port(url: &str) -> u16 {
    url.trim_end_matches('/').rsplit(':').next().unwrap().parse().unwrap()
}

/// Every TCP port the processes of `pid`'s tree listen on.
fn listening_ports(pid: u32) -> BTreeSet<u16> {
    let mut pids = vec![pid];
    let mut at = 0;
    while at < pids.len() {
        let parent = pids[at];
        for entry in std::fs::read_dir("/proc").unwrap().flatten() {
            let Some(child) = entry.file_name().to_str().and_then(|name| name.parse::<u32>().ok()) else {
                continue;
            };
            let stat = std::fs::read_to_string(entry.path().join("stat")).unwrap_or_default();
            let ppid = stat
                .rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1))
                .and_then(|ppid| ppid.parse::<u32>().ok());
            if ppid == Some(parent) && !pids.contains(&child) {
                pids.push(child);
            }
        }
        at += 1;
    }
    let mut sockets = BTreeSet::new();
    for pid in pids {
        for fd in std::fs::read_dir(format!("/proc/{pid}/fd"))
            .into_iter()
            .flatten()
            .flatten()
        {
            let target = std::fs::read_link(fd.path()).unwrap_or_default();
            if let Some(inode) = target
                .to_str()
                .and_then(|t| t.strip_prefix("socket:["))
                .and_then(|t| t.strip_suffix(']'))
            {
                sockets.insert(inode.to_string());
            }
        }
    }
    let mut ports = BTreeSet::new();
    for table in ["/proc/net/tcp", "/proc/net/tcp6"] {
        for line in std::fs::read_to_string(table).unwrap_or_default().lines().skip(1) {
            let fields: Vec<&str> = line.split_whitespace().collect();
            // local_address, state 0A (LISTEN), inode.
            if fields.len() > 9 && fields[3] == "0A" && sockets.contains(fields[9]) {
                let port = fields[1].rsplit(':').next().unwrap();
                ports.insert(u16::from_str_radix(port, 16).unwrap());
            }
        }
    }
    ports
}

/// How many files the process probes try: the relative path, nine files of KILN_HOME, one of
/// the JetStream store, the victim's environment and its token file.
const PROBED_FILES: usize = 13;

/// A process job's probes (bash): `read|denied <file>` and `open|closed <name>` per line.
const PROCESS_PROBES: &str = r#"
home=$1; shift
probe() { if cat "$2" >/dev/null 2>&1; then echo "read $1"; else echo "denied $1"; fi; }
connect() {
  if timeout 3 bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null; then echo "open $1"; else echo "closed $1"; fi
}
probe relative-token "$KILN_CODE/../../../admin.token"
for file in admin.token credentials.toml secrets.key kiln.db logs.db metrics.db nats-server.conf nats-users/runner.nk nats-users/api.nk; do
  probe "$file" "$home/$file"
done
probe jetstream "$(find "$home/nats" -type f 2>/dev/null | head -n 1)"
probe victim-environ "/proc/$1/environ"
probe victim-outputs "$2/token"
shift 2
for port in "$@"; do connect "port-$port" 127.0.0.1 "$port"; done
connect metadata 169.254.169.254 80
"#;

/// A container's probes (busybox sh and nc): the same ports, at the host's address on the jobs'
/// network, and the metadata address.
const CONTAINER_PROBES: &str = r#"
gw=${KILN_API#*//}; gw=${gw%:*}
connect() {
  if timeout 4 nc -w 2 "$2" "$3" </dev/null >/dev/null 2>&1; then echo "open $1"; else echo "closed $1"; fi
}
for port in "$@"; do connect "port-$port" "$gw" "$port"; done
connect metadata 169.254.169.254 80
"#;

struct World {
    up: Up,
    ada: String,
    eve: String,
}

impl World {
    fn start() -> World {
        assert_root();
        // The endpoints containers use on every address (they reach the host at the jobs'
        // network's gateway), as `kiln up --help` says for container workers; plain text
        // (`--insecure`) is what this machine's tests can run, TLS is tested elsewhere.
        let up = Up::start_with(&[
            "--docker-host",
            &env("KILN_TEST_DOCKER_HOST"),
            "--api-addr",
            "0.0.0.0:0",
            "--logs-addr",
            "0.0.0.0:0",
            "--batch-addr",
            "0.0.0.0:0",
            "--insecure",
        ]);
        let user = |name: &str, project: &str| {
            let token = last_line(&up.kiln(&["user", "create", name]));
            ok(up.kiln(&["project", "create", project]));
            ok(up.kiln(&["project", "add-member", project, name, "--role", "member"]));
            token
        };
        let ada = user("ada", "alpha");
        let eve = user("eve", "beta");
        World { up, ada, eve }
    }

    fn as_ada(&self, args: &[&str]) -> std::process::Output {
        self.up.kiln_env(args, &[("KILN_TOKEN", self.ada.as_str())])
    }

    fn as_eve(&self, args: &[&str]) -> std::process::Output {
        self.up.kiln_env(args, &[("KILN_TOKEN", self.eve.as_str())])
    }

    fn home(&self) -> PathBuf {
        self.up.home.path().canonicalize().unwrap()
    }

    /// The address of `key` in the credentials file `kiln up` wrote.
    fn address(&self, key: &str) -> String {
        let credentials = std::fs::read_to_string(self.home().join("credentials.toml")).unwrap();
        credentials
            .lines()
            .find_map(|line| line.strip_prefix(&format!("{key} = ")))
            .unwrap_or_else(|| panic!("no {key} in {credentials}"))
            .trim_matches('"')
            .to_string()
    }

    /// The ports a job is given: the api (gRPC and the HTTP API, which serves the UI too),
    /// log-ingest, item-batch, the advisor and the predictor (gRPC and its Open Inference
    /// Protocol port).
    fn endpoint_ports(&self) -> BTreeSet<u16> {
        let mut ports: BTreeSet<u16> = ["api", "ui", "logs", "batches", "advisor", "predictor"]
            .iter()
            .map(|key| port(&self.address(key)))
            .collect();
        let log = self.up.log();
        let oip = log
            .lines()
            .find_map(|line| line.split("Open Inference Protocol: ").nth(1))
            .expect("the predictor's HTTP address in kiln up's output");
        ports.insert(port(oip.trim_end_matches(')')));
        ports
    }
}

#[test]
fn eve_reaches_neither_alphas_data_nor_kiln_from_her_project_on_kiln_up() {
    let world = World::start();
    cross_project_attacks(
        &|tenant, args| match tenant {
            Tenant::Ada => world.as_ada(args),
            Tenant::Eve => world.as_eve(args),
        },
        &|job| {
            world.up.wait_for_state(job, "SUCCEEDED");
        },
        &[],
    );

    // Attack 3: eve's process job against kiln's files, ada's running job and every port.
    let victim = last_line(&world.as_ada(&[
        "run",
        "--no-code",
        "--project",
        "alpha",
        "--",
        "sh",
        "-c",
        "echo $KILN_TOKEN > $KILN_OUTPUTS/token; exec sleep 600",
    ]));
    let status = world.up.wait_for_state(&victim, "RUNNING");
    let pid = pid_of_job(&victim);
    let outputs = env_of(pid, "KILN_OUTPUTS");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while !Path::new(&outputs).join("token").try_exists().unwrap() {
        assert!(std::time::Instant::now() < deadline, "the victim never wrote its token");
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    let home = world.home().display().to_string();
    let ports = listening_ports(world.up.child.id());
    let endpoints = world.endpoint_ports();
    assert!(
        endpoints.is_subset(&ports),
        "{endpoints:?} not all in {ports:?} ({status})"
    );
    let port_args: Vec<String> = ports.iter().map(u16::to_string).collect();
    let mut args = vec![
        "run",
        "-f",
        "--no-code",
        "--project",
        "beta",
        "--",
        "bash",
        "-c",
        PROCESS_PROBES,
        "bash",
    ];
    let pid_text = pid.to_string();
    args.extend([home.as_str(), pid_text.as_str(), outputs.as_str()]);
    args.extend(port_args.iter().map(String::as_str));
    let output = ok(world.as_eve(&args));
    let read = verdicts(&output, "read ");
    assert!(read.is_empty(), "eve's process job read {read:?}:\n{output}");
    assert_eq!(verdicts(&output, "denied ").len(), PROBED_FILES, "{output}");
    let expected_open: BTreeSet<String> = endpoints.iter().map(|port| format!("port-{port}")).collect();
    assert_eq!(verdicts(&output, "open "), expected_open, "{output}");
    let closed = verdicts(&output, "closed ");
    assert!(closed.contains("metadata"), "{output}");
    assert_eq!(closed.len(), ports.len() - endpoints.len() + 1, "{output}");

    // The same as a container: no port of the host but the endpoints, no metadata.
    let image = env("KILN_TEST_IMAGE");
    let mut args = vec![
        "run",
        "-f",
        "--no-code",
        "--project",
        "beta",
        "--image",
        &image,
        "--",
        "sh",
        "-c",
        CONTAINER_PROBES,
        "sh",
    ];
    args.extend(port_args.iter().map(String::as_str));
    let output = ok(world.as_eve(&args));
    let open = verdicts(&output, "open ");
    assert!(
        open.is_subset(&expected_open),
        "eve's container reached {open:?}:\n{output}"
    );
    assert!(
        open.contains(&format!("port-{}", port(&world.address("api")))),
        "{output}"
    );
    assert!(verdicts(&output, "closed ").contains("metadata"), "{output}");

    // The control: kiln's own user on the host reads every file and opens every port.
    let control = std::process::Command::new("bash")
        .args(["-c", PROCESS_PROBES, "bash", &home, &pid_text, &outputs])
        .args(&port_args)
        .env("KILN_CODE", Path::new(&home).join("work/a/b"))
        .output()
        .unwrap();
    let control = text(&control.stdout);
    let denied = verdicts(&control, "denied ");
    // KILN_CODE's relative path means nothing on the host.
    assert_eq!(denied, BTreeSet::from(["relative-token".to_string()]), "{control}");
    assert_eq!(verdicts(&control, "read ").len(), PROBED_FILES - 1, "{control}");
    // Every port (whether the metadata address answers depends on the machine: where it does,
    // the host reaches it and the jobs above did not).
    let open = verdicts(&control, "open ");
    let every_port: BTreeSet<String> = ports.iter().map(|port| format!("port-{port}")).collect();
    assert!(every_port.is_subset(&open), "{control}");
    ok(world.up.kiln(&["stop", &victim]));
}
