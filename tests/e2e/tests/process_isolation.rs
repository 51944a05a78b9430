//! Issue 26, tenant isolation of process jobs, through the api of a real stack: a hostile job
//! reads kiln's files (`cat $KILN_CODE/../../../admin.token` and the like) and another running
//! job's environment. On a runner that runs as root (the default isolates each job as a uid of
//! its own, outside the runner's directories) every read fails; the control, the same job on a
//! runner that runs jobs as its own user, reads each one, so the test cannot pass vacuously.
//! A runner that cannot isolate runs its trusted owner's jobs only and fails the others'.
//!
//! Needs root (CI runs the tests as root) and nats-server (`KILN_TEST_NATS_SERVER`).

use kiln_e2e::*;
use kiln_proto::v1 as pb;
use kiln_runner::provider::process::config::{Isolation, ProcessConfig};

/// Says, for each of kiln's files and the victim's environment, whether it could be read.
const HOSTILE: &str = r#"
probe() { if cat "$2" >/dev/null 2>&1; then echo "read $1"; else echo "denied $1"; fi; }
probe relative-token "$KILN_CODE/../../../admin.token"
probe token "$1/admin.token"
probe secrets-key "$1/secrets.key"
probe database "$1/kiln.db"
probe jetstream "$2"
probe victim-environ "/proc/$3/environ"
probe victim-token-file "$4"
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

fn is_root() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let root = status
        .lines()
        .find(|line| line.starts_with("Uid:"))
        .is_some_and(|line| line.split_whitespace().nth(2) == Some("0"));
    if !root {
        eprintln!("skipped: isolating process jobs needs root (CI runs the tests as root)");
    }
    root
}

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
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("the victim's environment");
    let outputs = environ
        .split(|&b| b == 0)
        .find_map(|var| var.strip_prefix(b"KILN_OUTPUTS="))
        .map(|dir| String::from_utf8_lossy(dir).into_owned())
        .expect("KILN_OUTPUTS");
    let home = stack.dir.path().display().to_string();
    let jetstream = jetstream_file(stack).display().to_string();
    let token_file = format!("{outputs}/token");
    let hostile = stack
        .submit(&[
            "sh",
            "-c",
            HOSTILE,
            "sh",
            &home,
            &jetstream,
            &pid.to_string(),
            &token_file,
        ])
        .await;
    let lines = stack.log_lines(&hostile.id, true).await;
    let ended = stack.wait_for_state(&hostile.id, pb::JobState::Succeeded).await;
    assert_eq!(ended.exit_code, Some(0));
    stack.stop_job(&victim.id).await;
    lines.iter().map(|line| format!("{}\n", line.text)).collect()
}

#[tokio::test]
async fn a_hostile_process_job_reads_no_kiln_file_nor_another_job_on_a_root_runner() {
    if !is_root() {
        return;
    }
    // The stack's runner as it comes: root, `[process] isolation = "auto"`.
    let stack = Stack::start().await;
    let output = attack(&stack).await;
    for probe in PROBES {
        assert!(
            output.contains(&format!("denied {probe}\n")),
            "{probe} was not denied:\n{output}"
        );
    }
}

#[tokio::test]
async fn the_control_the_same_job_run_as_the_runner_reads_every_file() {
    let stack = stack_without_isolation().await;
    let output = attack(&stack).await;
    for probe in PROBES {
        assert!(
            output.contains(&format!("read {probe}\n")),
            "{probe} was not read:\n{output}"
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
