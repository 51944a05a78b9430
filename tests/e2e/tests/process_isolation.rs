//! Issue 26, tenant isolation of process jobs, through the api of a real stack: a hostile job
//! reads kiln's files (`cat $KILN_CODE/../../../admin.token` and the like) and another running
//! job's environment, and connects to the stack's NATS, to another port of the host (where a
//! database or a metrics endpoint would listen) and to the instance metadata address. On a
//! runner that runs as root (the default isolates each job as a uid of its own, outside the
//! runner's directories, behind `process.firewall`, with `no_new_privs`) every read and every connection fails,
//! while the api it is given stays reachable; the control, the same job on a runner that runs
//! jobs as its own user, reads each file and opens each local port, so the test cannot pass
//! vacuously. A runner that cannot isolate runs its trusted owner's jobs only and fails the
//! others'.
//!
//! Needs root (CI runs the tests as root; not root, the test fails saying so), iptables and
//! nats-server (`KILN_TEST_NATS_SERVER`).

use kiln_core::testing::hostile::{assert_root, env_of};
use kiln_e2e::*;
use kiln_proto::v1 as pb;
use kiln_runner::provider::process::config::{Isolation, ProcessConfig};

/// Says, for each of kiln's files and the victim's environment, whether it could be read, and
/// for each address whether a TCP connection opened.
const HOSTILE: &str = r#"
probe() { if cat "$2" >/dev/null 2>&1; then echo "read $1"; else echo "denied $1"; fi; }
probe relative-token "$KILN_CODE/../../../admin.token"
probe token "$1/admin.token"
probe secrets-key "$1/secrets.key"
probe database "$1/kiln.db"
probe jetstream "$2"
probe victim-environ "/proc/$3/environ"
probe victim-token-file "$4"
connect() {
  if timeout 3 bash -c "exec 3<>/dev/tcp/$2/$3" 2>/dev/null; then echo "open $1"; else echo "closed $1"; fi
}
connect nats 127.0.0.1 "$5"
connect host-port 127.0.0.1 "$6"
connect metadata 169.254.169.254 80
# no_new_privs: 1 when no setuid program can raise the job's privileges.
echo "nnp $(awk '/^NoNewPrivs/ { print $2 }' /proc/self/status)"
api=${KILN_API#*//}
connect api "${api%:*}" "${api##*:}"
"#;

const PROBES: [&str; 7] = [
    "relative-token",
    "token",
    "secrets-key",
    "database",
    "jetstream",
    "victim-environ",
    "victim-token-file",
];

/// Where the job may not connect: the stack's NATS, and a port of the host standing in for a
/// database or a metrics endpoint.
const CONNECTIONS: [&str; 3] = ["nats", "host-port", "metadata"];

/// A file of the stack's JetStream store.
fn jetstream_file(stack: &Stack) -> std::path::PathBuf {
    // Under `jetstream/`: the store dir of the tests' server also holds its config file.
    let mut pending = vec![
        stack
            .nats
            .store_dir()
            .expect("the stack's own nats-server")
            .join("jetstream"),
    ];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("the JetStream store").flatten() {
            let path = entry.path();
            if path.is_dir() {
                pending.push(path);
            } else {
                return path;
            }
        }
    }
    panic!("the JetStream store holds no file");
}

/// A stack whose runner does not isolate process jobs and trusts only the admin's (a laptop's
/// `kiln up` that is not root).
async fn stack_without_isolation() -> Stack {
    let mut stack = Stack::start_without_runner().await;
    let config = kiln_runner::Config {
        process: ProcessConfig {
            isolation: Isolation::Off,
            trusted_owner: admin_id(&stack).await,
            ..ProcessConfig::default()
        },
        ..stack.runner_config("runner-1")
    };
    stack.runner = Some(stack.spawn_runner(config).await);
    stack
}

async fn admin_id(stack: &Stack) -> String {
    stack
        .store
        .user_by_name("admin")
        .await
        .expect("store")
        .expect("the bootstrap admin")
        .id
}

/// The stack's runner as it comes as root (`[process] isolation = "auto"`), with the process
/// jobs' firewall on (the tests' default turns it off); removes its chain when dropped.
struct Firewalled {
    stack: Stack,
    work_dir: std::path::PathBuf,
}

impl Firewalled {
    async fn start() -> Firewalled {
        let mut stack = Stack::start_without_runner().await;
        let mut config = stack.runner_config("runner-1");
        config.process.firewall = true;
        let work_dir = config.work_dir.clone();
        stack.runner = Some(stack.spawn_runner(config).await);
        Firewalled { stack, work_dir }
    }

    /// The packets the chain's first rule (the metadata address) rejected.
    fn metadata_rejections(&self) -> u64 {
        let chain = kiln_runner::provider::firewall::uid_chain(&self.work_dir);
        let output = std::process::Command::new("iptables")
            .args(["-w", "10", "-n", "-v", "-x", "-L", &chain])
            .output()
            .expect("iptables");
        let listing = String::from_utf8_lossy(&output.stdout).into_owned();
        let rule = listing
            .lines()
            .find(|line| line.contains("169.254.169.254"))
            .unwrap_or_else(|| panic!("no metadata rule in {chain}:\n{listing}"));
        rule.split_whitespace().next().unwrap().parse().expect("a packet count")
    }
}

impl Drop for Firewalled {
    fn drop(&mut self) {
        let work_dir = self.work_dir.clone();
        std::thread::spawn(move || {
            let runtime = tokio::runtime::Runtime::new().expect("a runtime");
            if let Err(error) =
                runtime.block_on(kiln_runner::provider::firewall::remove_uid_chain("iptables", &work_dir))
            {
                eprintln!("cannot remove the chain of {}: {error}", work_dir.display());
            }
        })
        .join()
        .expect("the chain's removal");
    }
}

/// Runs the victim (a job that keeps a token in a file of its own) and the hostile job beside
/// it; returns what the hostile job printed.
async fn attack(stack: &Stack) -> String {
    // As `kiln up` makes KILN_HOME: kiln's alone. (A temp dir is 0755, and SQLite makes kiln.db
    // 0644: in a directory others can enter, a job of any uid would read the database.)
    std::fs::set_permissions(stack.dir.path(), std::os::unix::fs::PermissionsExt::from_mode(0o700))
        .expect("the stack's dir made private");
    let victim = stack
        .submit(&[
            "sh",
            "-c",
            "echo $KILN_TOKEN > $KILN_OUTPUTS/token; echo ready; exec sleep 600",
        ])
        .await;
    wait_for_line(stack, &victim.id, "ready").await;
    let victim = stack.get(&victim.id).await;
    let pid = pid_of(&victim);
    // Where the victim keeps its token: in its outputs directory, wherever the runner put it.
    let outputs = env_of(u32::try_from(pid).expect("a pid"), "KILN_OUTPUTS");
    let home = stack.dir.path().display().to_string();
    let jetstream = jetstream_file(stack).display().to_string();
    let token_file = format!("{outputs}/token");
    let nats_port = stack.nats.url.rsplit(':').next().expect("a port").to_string();
    // A port of the host that is none of the job's endpoints: a database, a metrics endpoint.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("a listener");
    let host_port = listener.local_addr().expect("its address").port().to_string();
    let hostile = stack
        .submit(&[
            "bash",
            "-c",
            HOSTILE,
            "bash",
            &home,
            &jetstream,
            &pid.to_string(),
            &token_file,
            &nats_port,
            &host_port,
        ])
        .await;
    let lines = stack.log_lines(&hostile.id, true).await;
    let ended = stack.wait_for_state(&hostile.id, pb::JobState::Succeeded).await;
    assert_eq!(ended.exit_code, Some(0));
    stack.stop_job(&victim.id).await;
    lines.iter().map(|line| format!("{}\n", line.text)).collect()
}

#[tokio::test]
async fn a_hostile_process_job_reads_no_kiln_file_nor_another_job_and_reaches_no_port_on_a_root_runner() {
    assert_root();
    let firewalled = Firewalled::start().await;
    let before = firewalled.metadata_rejections();
    let output = attack(&firewalled.stack).await;
    for probe in PROBES {
        assert!(
            output.contains(&format!("denied {probe}\n")),
            "{probe} was not denied:\n{output}"
        );
    }
    for connection in CONNECTIONS {
        assert!(
            output.contains(&format!("closed {connection}\n")),
            "{connection} was reached:\n{output}"
        );
    }
    // What the job is given stays open, and its packets to the metadata address met the rule.
    assert!(output.contains("open api\n"), "{output}");
    // And no setuid program of the machine raises its privileges (past the owner match, say).
    assert!(output.contains("nnp 1\n"), "{output}");
    assert!(firewalled.metadata_rejections() > before, "{output}");
}

#[tokio::test]
async fn the_control_the_same_job_run_as_the_runner_reads_every_file_and_opens_every_local_port() {
    let stack = stack_without_isolation().await;
    let output = attack(&stack).await;
    for probe in PROBES {
        assert!(
            output.contains(&format!("read {probe}\n")),
            "{probe} was not read:\n{output}"
        );
    }
    assert!(output.contains("nnp 0\n"), "{output}");
    for connection in ["nats", "host-port", "api"] {
        assert!(
            output.contains(&format!("open {connection}\n")),
            "{connection} was not reached:\n{output}"
        );
    }
}

#[tokio::test]
async fn a_runner_that_cannot_isolate_fails_the_process_jobs_of_others() {
    // As on a laptop where kiln up is not root: isolation is off, the admin is trusted.
    let stack = stack_without_isolation().await;
    let bob = stack.member("bob").await;
    let job = stack
        .jobs_as(&bob)
        .await
        .submit_job(pb::SubmitJobRequest {
            spec: Some(spec(&["true"])),
            ..Default::default()
        })
        .await
        .expect("submit")
        .into_inner()
        .job
        .expect("job");
    let failed = stack.wait_for_state(&job.id, pb::JobState::Failed).await;
    for words in ["process.trusted-owner", "run as root", "[process] isolation", "--image"] {
        assert!(failed.reason.contains(words), "{:?} lacks {words:?}", failed.reason);
    }
    // The control: the trusted owner's own job runs.
    let own = stack.submit(&["true"]).await;
    stack.wait_for_state(&own.id, pb::JobState::Succeeded).await;
}
