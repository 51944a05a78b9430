//! Job containers on their own network (`docker.isolate-jobs`, the default): a job of the
//! test image probes, from inside its container, what a tenant would try to reach on the
//! runner's host: a NATS server, a TCP port that is no job endpoint, the runner's `/metrics`,
//! and the instance metadata address; and the endpoint it is meant to use (item-batch). With
//! the isolation every probe but the last fails; the control (the engine's bridge, isolation
//! off) reaches the host's ports. Whether anything answers at the metadata address depends on
//! the machine, so the isolated test also reads its DROP rule's packet counter, which shows the
//! job's packets met it.
//!
//! Needs root (iptables) and the Docker Engine of scripts/test.sh; each test removes its
//! network and its rules, also when it fails.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use kiln_core::metrics::MetricsConfig;
use kiln_core::testing::free_port;
use kiln_e2e::{ServiceHandle, Stack, docker, labelled, spec, test_image};
use kiln_proto::v1 as pb;
use kiln_runner::provider::docker::{LABEL_RUNNER, firewall, network};

/// Each probe: `<name> open` when the connection was made (the peer closed it, or held it until
/// `timeout` ended nc), else `<name> closed <exit code> <nc's message>`.
const PROBES: &str = r#"gw=${KILN_API#*//}; gw=${gw%:*}
probe() {
  out=$(timeout 4 nc -w 2 "$1" "$2" </dev/null 2>&1); rc=$?
  if [ $rc = 0 ] || [ $rc = 143 ]; then echo "$3 open"; else echo "$3 closed $rc $out"; fi
}
probe "$gw" "$PROBE_NATS" nats &
probe "$gw" "$PROBE_HOST" host-port &
probe "$gw" "$PROBE_METRICS" runner-metrics &
probe 169.254.169.254 80 metadata &
probe "$gw" "$PROBE_BATCH" item-batch &
wait"#;

/// A nats-server listening on every address of the host, killed on drop.
struct OpenNats(Child);

impl OpenNats {
    fn start(port: u16) -> OpenNats {
        let binary = std::env::var("KILN_TEST_NATS_SERVER")
            .expect("KILN_TEST_NATS_SERVER is not set: run the tests through scripts/test.sh");
        let child = Command::new(binary)
            .args(["-a", "0.0.0.0", "-p", &port.to_string()])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("start nats-server");
        // Owned (killed and waited for on drop) before it is waited for.
        let nats = OpenNats(child);
        for _ in 0..250 {
            if std::net::TcpStream::connect(("127.0.0.1", port)).is_ok() {
                return nats;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!("nats-server did not listen on {port}");
    }
}

impl Drop for OpenNats {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Removes the jobs' network and its rules when the test ends, passed or not.
struct Cleanup(String);

impl Drop for Cleanup {
    fn drop(&mut self) {
        let name = self.0.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().expect("a runtime");
            runtime.block_on(async {
                if let Err(error) = network::remove(&docker().await, "iptables", &name).await {
                    eprintln!("cannot remove the network {name}: {error}");
                }
            });
        })
        .join()
        .expect("cleanup");
    }
}

/// A port of the host, on every address, that is no job endpoint (a database, say): it
/// greets and hangs up.
async fn host_listener() -> u16 {
    let listener = tokio::net::TcpListener::bind("0.0.0.0:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move {
        use tokio::io::AsyncWriteExt;
        while let Ok((mut stream, _)) = listener.accept().await {
            let _ = stream.write_all(b"hello\n").await;
        }
    });
    port
}

/// What the job's probes found, by name; and the runner's id.
async fn probe_from_a_job(isolate: bool, network_name: &str) -> (BTreeMap<String, String>, Stack) {
    let mut stack = Stack::start_without_runner().await;
    // item-batch as batch workers reach it: beyond loopback, at the network's gateway.
    let mut batches = stack.item_batch_config();
    batches.grpc.listen = SocketAddr::from(([0, 0, 0, 0], 0));
    stack.start_item_batch(batches).await;
    let batch_port = stack.batches_addr.unwrap().port();
    let nats_port = free_port();
    let nats = OpenNats::start(nats_port);
    let host_port = host_listener().await;
    let metrics_port = free_port();

    let mut runner = stack.docker_runner_config(&stack.docker_runner_id());
    runner.docker.network = "bridge".into();
    runner.docker.isolate_jobs = isolate;
    runner.docker.job_network = network_name.into();
    runner.docker.job_endpoints = vec![format!("127.0.0.1:{batch_port}")];
    runner.metrics = MetricsConfig {
        enabled: true,
        listen: SocketAddr::from(([0, 0, 0, 0], metrics_port)),
        ..MetricsConfig::default()
    };
    stack.runner = Some(ServiceHandle::spawn(|token| kiln_runner::run(runner, token)));

    let mut job_spec = spec(&["sh", "-c", PROBES]);
    job_spec.image = test_image();
    job_spec.env = [
        ("PROBE_NATS", nats_port),
        ("PROBE_HOST", host_port),
        ("PROBE_METRICS", metrics_port),
        ("PROBE_BATCH", batch_port),
    ]
    .into_iter()
    .map(|(name, port)| (name.to_string(), port.to_string()))
    .collect();
    let job = stack.submit_spec(job_spec).await;
    let running = stack.wait_for_state(&job.id, pb::JobState::Running).await;
    let container = running.instance_id.trim_start_matches("docker:").to_string();
    let inspected = docker().await.inspect_container(&container, None).await.unwrap();
    let mode = inspected.host_config.unwrap().network_mode.unwrap_or_default();
    assert_eq!(mode, if isolate { network_name } else { "bridge" });
    let lines = stack.log_lines(&job.id, true).await;
    drop(nats);
    let found = lines
        .iter()
        .filter_map(|line| line.text.split_once(' '))
        .map(|(name, result)| (name.to_string(), result.to_string()))
        .collect();
    let (containers, volumes) = labelled(&docker().await, LABEL_RUNNER, &stack.docker_runner_id()).await;
    assert!(
        containers.is_empty() && volumes.is_empty(),
        "{containers:?} {volumes:?}"
    );
    (found, stack)
}

/// A name no other test run uses, short enough for a bridge interface.
fn unique_network(tag: &str) -> String {
    format!("kj{tag}{}", std::process::id() % 100_000)
}

/// The rules of DOCKER-USER with their counters, as `iptables -L -v -n -x` prints them.
fn docker_user_counters() -> String {
    let output = Command::new("iptables")
        .args(["-w", "10", "-L", firewall::DOCKER_USER, "-v", "-n", "-x"])
        .output()
        .expect("iptables");
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[tokio::test]
async fn an_isolated_job_reaches_its_endpoint_and_nothing_else_of_the_host() {
    let name = unique_network("i");
    let _cleanup = Cleanup(name.clone());
    let (found, stack) = probe_from_a_job(true, &name).await;
    eprintln!("isolated job's probes: {found:?}");
    let result = |probe: &str| found.get(probe).cloned().unwrap_or_else(|| "missing".into());
    assert_eq!(result("item-batch"), "open", "{found:?}");
    for probe in ["nats", "host-port", "runner-metrics", "metadata"] {
        assert!(result(probe).starts_with("closed"), "{probe} must be closed: {found:?}");
    }
    // Refused at once by the REJECT rules; the metadata address is dropped (nc times out).
    assert!(result("host-port").contains("refused"), "{found:?}");
    assert!(result("metadata").contains("timed out"), "{found:?}");

    // The network: no traffic between its containers, a bridge of its own name.
    let inspected = docker()
        .await
        .inspect_network(&name, None::<bollard::query_parameters::InspectNetworkOptions>)
        .await
        .unwrap();
    let options = inspected.options.unwrap_or_default();
    assert_eq!(
        options.get("com.docker.network.bridge.enable_icc").map(String::as_str),
        Some("false")
    );
    // The job's packets to the metadata address met the DROP rule.
    let marker = firewall::comment(&name);
    let counters = docker_user_counters();
    let drop_rule = counters
        .lines()
        .find(|line| line.contains("169.254.169.254") && line.contains(&marker) && line.contains("DROP"))
        .unwrap_or_else(|| panic!("no DROP rule for the metadata address:\n{counters}"));
    let packets: u64 = drop_rule.split_whitespace().next().unwrap().parse().unwrap();
    assert!(packets > 0, "the DROP rule saw no packet:\n{drop_rule}");

    // A runner starting again keeps the rules as they are; one finding a stale rule of the
    // network (a restart after a change of endpoints) replaces the set: no duplicates.
    let before = firewall_rules(&marker);
    assert_eq!(before.len(), 17, "{before:#?}");
    start_again(&stack, &name).await;
    assert_eq!(firewall_rules(&marker), before);
    let stale = Command::new("iptables")
        .args([
            "-w", "10", "-A", "INPUT", "-i", &name, "-p", "tcp", "--dport", "1", "-j", "ACCEPT",
        ])
        .args(["-m", "comment", "--comment", &marker])
        .status()
        .expect("iptables");
    assert!(stale.success());
    assert_eq!(firewall_rules(&marker).len(), 18);
    start_again(&stack, &name).await;
    assert_eq!(firewall_rules(&marker), before);
}

/// Binds (and drops) another runner of the same jobs' network and endpoints.
async fn start_again(stack: &Stack, name: &str) {
    let mut again = stack.docker_runner_config(&format!("{}-again", stack.docker_runner_id()));
    again.docker.network = "bridge".into();
    again.docker.job_network = name.to_string();
    again.docker.job_endpoints = vec![format!("127.0.0.1:{}", stack.batches_addr.unwrap().port())];
    drop(kiln_runner::Runner::bind(again).await.expect("a second start"));
}

/// The rules carrying `marker`, in DOCKER-USER then INPUT, as `iptables -S` prints them.
fn firewall_rules(marker: &str) -> Vec<String> {
    [firewall::DOCKER_USER, firewall::INPUT]
        .iter()
        .flat_map(|chain| {
            let output = Command::new("iptables")
                .args(["-w", "10", "-S", chain])
                .output()
                .expect("iptables");
            String::from_utf8_lossy(&output.stdout)
                .lines()
                .filter(|line| line.contains(marker))
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test]
async fn without_isolation_the_same_job_reaches_the_host_s_ports() {
    let name = unique_network("c");
    let _cleanup = Cleanup(name.clone());
    let (found, _stack) = probe_from_a_job(false, &name).await;
    eprintln!("unconfined job's probes: {found:?}");
    for probe in ["item-batch", "nats", "host-port", "runner-metrics"] {
        assert_eq!(found.get(probe).map(String::as_str), Some("open"), "{probe}: {found:?}");
    }
    // Whether something answers at the metadata address depends on the machine (on the one
    // these tests were written on, something does: the control reaches it, the isolated job
    // does not); the isolated test shows the DROP rule met the job's packets.
    eprintln!("metadata address without isolation: {:?}", found.get("metadata"));
    assert!(firewall_rules(&firewall::comment(&name)).is_empty());
}
