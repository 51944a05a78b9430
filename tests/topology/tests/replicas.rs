//! Replicas on the topology, driven by the `kiln` CLI as a person would: the CLI and the
//! Python SDK given only the api's address and a token find every other service, `kiln logs -f` on
//! either log-ingest replica shows every line of a job, a gang of three nodes on three runner
//! processes (one per "machine") starts together or not at all and outlives a runner
//! SIGKILLed mid-run, a runner SIGKILLed for good has its job queued again and finished by the
//! other runner, and a `kiln run -f` given both api replicas outlives the one it talked to.

use std::process::Command;
use std::time::{Duration, Instant};

use kiln_topology::{Options, Topology, binaries_dir};

const PATIENCE: Duration = Duration::from_secs(180);

/// The CLI on the topology, given both api replicas; `logs` picks the log-ingest replica.
fn cli(topology: &Topology, logs: &str, args: &[&str]) -> Command {
    let mut command = Command::new(binaries_dir().join("kiln"));
    command
        .args(args)
        .env("KILN_HOME", topology.dir.join("cli-home"))
        .env(
            "KILN_ADDR",
            format!("{},{}", topology.url("api-1"), topology.url("api-2")),
        )
        .env("KILN_LOGS_ADDR", topology.url(logs))
        .env("KILN_BATCH_ADDR", topology.url("item-batch-1"))
        .env("KILN_TOKEN", &topology.token);
    command
}

/// Runs the CLI against the topology and returns what it printed; it must succeed.
fn kiln(topology: &Topology, logs: &str, args: &[&str]) -> String {
    output_of(cli(topology, logs, args))
}

/// `kiln run -f` of a shell script on pool local, without code.
fn followed(script: &str) -> [&str; 9] {
    ["run", "-f", "--no-code", "--pool", "local", "--", "sh", "-c", script]
}

/// The CLI or the SDK given what a person holds: api-1's address and a token (no credentials
/// file, no other service's address).
fn one_address(topology: &Topology, program: impl AsRef<std::ffi::OsStr>) -> Command {
    let mut command = Command::new(program);
    for variable in [
        "KILN_LOGS_ADDR",
        "KILN_BATCH_ADDR",
        "KILN_ADVISOR_ADDR",
        "KILN_PREDICTOR_ADDR",
        "KILN_UI_ADDR",
    ] {
        command.env_remove(variable);
    }
    command
        .env("KILN_HOME", topology.dir.join("one-address-home"))
        .env("KILN_ADDR", topology.url("api-1"))
        .env("KILN_TOKEN", &topology.token);
    command
}

/// What a command printed; it must succeed. A failure names the program and its arguments, not
/// its environment (which holds the token).
fn output_of(mut command: Command) -> String {
    let output = command.output().expect("the command runs");
    assert!(
        output.status.success(),
        "{:?} {:?} failed: {}{}",
        command.get_program(),
        command.get_args().collect::<Vec<_>>(),
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout).expect("utf-8 output")
}

/// The SDK's pipeline in a few lines: a job submitted, waited for and its lines read, and the
/// batches listed, each service found through the api.
const SDK_ONE_ADDRESS: &str = r#"
import kiln
with kiln.Client() as client:
    job = client.jobs.submit(["sh", "-c", "echo sdk-one-address"], workdir=None, pool="local",
                             cpus=0.25, memory="128M")
    final = client.jobs.wait(job.id, timeout=120, poll=0.2)
    assert final.state == "SUCCEEDED", final
    print("lines", [line.text for line in client.jobs.logs(job.id)])
    print("batches", len(client.batches.list(all=True)))
    print("logs at", client._logs_address)
"#;

fn status(topology: &Topology, job: &str) -> serde_json::Value {
    serde_json::from_str(&kiln(topology, "log-ingest-1", &["status", job, "-o", "json"])).expect("status json")
}

fn wait_for(
    topology: &Topology,
    job: &str,
    what: &str,
    done: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let now = status(topology, job);
        if done(&now) {
            return now;
        }
        assert!(Instant::now() < deadline, "job {job} never {what}: {now}");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The gang test's program (tests/all_reduce.py): nodes meet at the rendezvous and sum their
/// ranks + 1 (6 for three); rank 0 then counts `STEPS` steps into its outputs.
const ALL_REDUCE: &str = include_str!("../../all_reduce.py");

/// Submits a 3-node gang to the gang pool (one CPU a node: one node per runner).
fn gang(topology: &Topology, steps: u32) -> String {
    let steps = format!("STEPS={steps}");
    let args = [
        "run",
        "--no-code",
        "--pool",
        "gang",
        "--nodes",
        "3",
        "--cpu",
        "1",
        "--mem",
        "64M",
        "-e",
        &steps,
        "--",
        "python3",
        "-c",
        ALL_REDUCE,
    ];
    kiln(topology, "log-ingest-1", &args).trim().to_string()
}

/// Each node's rank and runner, from `kiln status` (`"0 RUNNING on runner-gang-2"`).
fn nodes(status: &serde_json::Value) -> Vec<(String, String)> {
    let states = status["nodes"]["states"].as_array().cloned().unwrap_or_default();
    states
        .iter()
        .map(|state| {
            let words: Vec<&str> = state.as_str().expect("a node's state").split(' ').collect();
            (words[0].to_string(), words[3].to_string())
        })
        .collect()
}

/// The gang steps: together, whole or not at all, and past a runner killed mid-run.
fn gangs(topology: &mut Topology) {
    // Together: every node on a runner process of its own meets the others over TCP; node 0's
    // outputs are the job's.
    let job = gang(topology, 3);
    let done = wait_for(topology, &job, "succeeded", |s| s["state"] == "SUCCEEDED");
    let mut runners: Vec<String> = nodes(&done).into_iter().map(|(_, runner)| runner).collect();
    runners.sort();
    assert_eq!(runners, ["runner-gang-1", "runner-gang-2", "runner-gang-3"], "{done}");
    for rank in ["0", "1", "2"] {
        let lines = kiln(topology, "log-ingest-2", &["logs", &job, "--node", rank]);
        assert!(
            lines.contains(&format!("rank {rank} of 3 sum 6")),
            "node {rank}: {lines}"
        );
    }
    let dest = topology.dir.join("gang-outputs");
    kiln(
        topology,
        "log-ingest-1",
        &[
            "artifacts",
            "get",
            &job,
            "sum",
            "--dest",
            dest.to_str().expect("a path"),
        ],
    );
    assert_eq!(std::fs::read_to_string(dest.join("sum")).expect("node 0's sum"), "6");

    // Whole or not at all: with one runner's CPU taken, no node starts until it is free.
    let sleeper = kiln(
        topology,
        "log-ingest-1",
        &[
            "run",
            "--no-code",
            "--pool",
            "gang",
            "--cpu",
            "1",
            "--mem",
            "64M",
            "--",
            "sleep",
            "600",
        ],
    )
    .trim()
    .to_string();
    wait_for(topology, &sleeper, "ran", |s| s["state"] == "RUNNING");
    let job = gang(topology, 3);
    std::thread::sleep(Duration::from_secs(3));
    let waiting = status(topology, &job);
    assert_eq!(waiting["state"], "QUEUED", "{waiting}");
    assert!(nodes(&waiting).is_empty(), "a node was placed: {waiting}");
    let why = kiln(topology, "log-ingest-1", &["explain", &job]);
    assert!(why.contains("whole or not at all"), "{why}");
    kiln(topology, "log-ingest-1", &["stop", &sleeper]);
    wait_for(topology, &job, "succeeded", |s| s["state"] == "SUCCEEDED");

    // A node's runner SIGKILLed mid-run ends the attempt for all; the next attempt (once the
    // runner is back: every node needs a runner of its own) resumes from node 0's last sync.
    let job = gang(topology, 1_000_000);
    let synced = wait_for(topology, &job, "synced node 0's outputs", |s| {
        s["state"] == "RUNNING" && !s["outputs_synced"].is_null()
    });
    let node_1 = nodes(&synced)
        .into_iter()
        .find(|(rank, _)| rank == "1")
        .map(|(_, runner)| runner)
        .expect("node 1");
    topology.kill(&node_1);
    wait_for(topology, &job, "was queued again", |s| s["attempt"] == 2);
    topology.restart(&node_1);
    let deadline = Instant::now() + PATIENCE;
    loop {
        let lines = kiln(topology, "log-ingest-1", &["logs", &job, "--node", "0"]);
        if lines.contains("attempt 2 resumes at step ") {
            break;
        }
        assert!(Instant::now() < deadline, "attempt 2 never resumed: {lines}");
        std::thread::sleep(Duration::from_millis(500));
    }
    kiln(topology, "log-ingest-1", &["stop", &job]);
    wait_for(topology, &job, "stopped", |s| s["state"] == "STOPPED");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn logs_on_either_replica_a_gang_and_a_runner_lost_for_good() {
    let mut topology = Topology::start(Options {
        gang_runners: 3,
        ..Options::from_env()
    })
    .await;

    // 0. KILN_ADDR and KILN_TOKEN are all the CLI and the SDK need: log-ingest (the lines of a
    // followed job), item-batch and the rest come from the api's DiscoveryService. Each service
    // listens on a port of its own here, so a client that guessed would miss them.
    let mut run = one_address(&topology, binaries_dir().join("kiln"));
    run.args(followed("echo cli-one-address"));
    assert!(output_of(run).contains("cli-one-address"));
    let mut batches = one_address(&topology, binaries_dir().join("kiln"));
    batches.args(["batch", "ls"]);
    output_of(batches);
    let mut doctor = one_address(&topology, binaries_dir().join("kiln"));
    doctor.arg("doctor");
    let checked = output_of(doctor);
    for service in ["log-ingest-1", "item-batch-1", "advisor-1", "predictor-1"] {
        let url = topology.url(service);
        assert!(
            checked.lines().any(|line| line.contains(&url) && line.contains("ok: ")),
            "kiln doctor did not find {service} at {url} through the api: {checked}"
        );
    }
    let python = std::env::var("KILN_TEST_PYTHON")
        .expect("KILN_TEST_PYTHON is not set: run the tests through scripts/test.sh, which installs the SDK");
    let mut sdk = one_address(&topology, python);
    sdk.args(["-c", SDK_ONE_ADDRESS]);
    let said = output_of(sdk);
    assert!(said.contains("lines ['sdk-one-address']"), "{said}");
    assert!(
        said.contains(&format!("logs at {}", topology.url("log-ingest-1"))),
        "the SDK's log-ingest address did not come from the api: {said}"
    );

    // 1. Two log-ingest replicas on Scylla: following on either shows all the lines, in order.
    let script = "i=0; while [ $i -lt 3000 ]; do echo \"line $i\"; i=$((i+1)); done; sleep 1";
    let job = kiln(
        &topology,
        "log-ingest-1",
        &["run", "--no-code", "--pool", "local", "--", "sh", "-c", script],
    )
    .trim()
    .to_string();
    let followers: Vec<std::thread::JoinHandle<String>> = ["log-ingest-1", "log-ingest-2"]
        .into_iter()
        .map(|replica| {
            let (binary, home) = (binaries_dir().join("kiln"), topology.dir.join("cli-home"));
            let env = [
                ("KILN_HOME", home.display().to_string()),
                ("KILN_ADDR", topology.url("api-1")),
                ("KILN_LOGS_ADDR", topology.url(replica)),
                ("KILN_TOKEN", topology.token.clone()),
            ];
            let job = job.clone();
            std::thread::spawn(move || {
                let output = Command::new(binary)
                    .args(["logs", "-f", &job])
                    .envs(env)
                    .output()
                    .expect("kiln logs -f");
                assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
                String::from_utf8(output.stdout).expect("utf-8")
            })
        })
        .collect();
    let expected: Vec<String> = (0..3000).map(|n| format!("line {n}")).collect();
    for (follower, replica) in followers.into_iter().zip(["log-ingest-1", "log-ingest-2"]) {
        let shown: Vec<String> = follower.join().expect("follower").lines().map(str::to_string).collect();
        assert!(
            shown == expected,
            "kiln logs -f on {replica} showed {} lines, not the 3000 in order",
            shown.len()
        );
    }
    let ended = wait_for(&topology, &job, "ended", |s| s["state"] == "SUCCEEDED");
    assert_eq!(ended["exit_code"], 0);

    // 2. Gangs over three runner processes.
    gangs(&mut topology);

    // 3. A runner SIGKILLed and never restarted: its job is queued again (on-lost = requeue)
    // once its lease expires, and the other runner finishes it.
    let counter = "for i in 1 2 3 4 5 6 7 8; do sleep 0.5; done";
    let job = kiln(
        &topology,
        "log-ingest-1",
        &["run", "--no-code", "--pool", "local", "--", "sh", "-c", counter],
    )
    .trim()
    .to_string();
    let running = wait_for(&topology, &job, "ran", |s| s["state"] == "RUNNING");
    let runner = running["runner"].as_str().expect("a runner").to_string();
    topology.kill(&runner);
    let done = wait_for(&topology, &job, "finished elsewhere", |s| s["state"] == "SUCCEEDED");
    assert_ne!(done["runner"].as_str(), Some(runner.as_str()), "{done}");
    assert_eq!(done["attempt"], 2, "{done}");

    // 4. `kiln run -f` given both api replicas (KILN_ADDR=api-1,api-2) submits through api-1,
    // which is SIGKILLed while the job runs: the follow ends with the job's state read through
    // api-2 and the job's exit. A CLI given api-1 alone cannot reach kiln then (the control).
    let follow = cli(&topology, "log-ingest-1", &followed("sleep 4; echo done"))
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("kiln run -f");
    let deadline = Instant::now() + PATIENCE;
    while !kiln(&topology, "log-ingest-1", &["ps"]).contains("RUNNING") {
        assert!(Instant::now() < deadline, "the followed job never ran");
        std::thread::sleep(Duration::from_millis(200));
    }
    topology.kill("api-1");
    let followed = follow.wait_with_output().expect("kiln run -f");
    assert!(
        followed.status.success(),
        "kiln run -f did not outlive api-1: {}",
        String::from_utf8_lossy(&followed.stderr)
    );
    assert!(String::from_utf8_lossy(&followed.stdout).contains("done"));
    assert!(
        String::from_utf8_lossy(&followed.stderr).contains("trying again"),
        "the follow never found api-1 gone, so it proves nothing: {}",
        String::from_utf8_lossy(&followed.stderr)
    );
    let alone = cli(&topology, "log-ingest-1", &["ps"])
        .env("KILN_ADDR", topology.url("api-1"))
        .output()
        .expect("kiln ps");
    assert!(
        !alone.status.success(),
        "a CLI given only the killed api-1 still answered"
    );
    topology.stop();
}
