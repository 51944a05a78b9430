//! The `kiln` binary end to end: `kiln up` as a child process (with its own child
//! nats-server), driven by `kiln run|ps|status|logs|stop` as a user would.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use crate::common;

use common::{KILN, Up, artifacts, text};

#[test]
fn run_follow_prints_both_streams_and_exits_with_the_job_code() {
    let up = Up::start();
    let output = up.kiln(&["run", "-f", "--", "sh", "-c", "echo hi; echo err >&2; exit 3"]);
    assert_eq!(output.status.code(), Some(3), "stderr: {}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "hi\n");
    let stderr = text(&output.stderr);
    assert!(stderr.lines().any(|l| l == "err"), "{stderr}");
    assert!(stderr.contains("FAILED: exited with code 3"), "{stderr}");

    let job_id = stderr
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    let status = up.status_json(&job_id);
    assert_eq!(status["state"], "FAILED");
    assert_eq!(status["exit_code"], 3);
    let table = text(&up.kiln(&["status", &job_id]).stdout);
    assert!(table.contains("FAILED") && table.contains("exit_code: 3"), "{table}");

    // The logs can be read again, and the job is listed.
    let logs = up.kiln(&["logs", &job_id]);
    assert_eq!(text(&logs.stdout), "hi\n");
    assert_eq!(text(&logs.stderr), "err\n");
    assert_eq!(text(&up.kiln(&["logs", &job_id, "--grep", "er"]).stdout), "err\n");
    assert_eq!(
        text(&up.kiln(&["logs", &job_id, "--grep", "^h.$", "--regex"]).stdout),
        "hi\n"
    );
    assert_eq!(up.kiln(&["logs", &job_id, "--grep", "nothing"]).status.code(), Some(1));
    assert!(text(&up.kiln(&["ps", "--all"]).stdout).contains(&job_id));
    assert!(
        !text(&up.kiln(&["ps"]).stdout).contains(&job_id),
        "finished jobs are hidden without --all"
    );
}

#[test]
fn the_job_gets_the_working_directory_and_the_same_code_is_stored_once() {
    let up = Up::start();
    std::fs::write(up.project.path().join(".kilnignore"), "secret.txt\n").unwrap();
    std::fs::write(up.project.path().join("secret.txt"), "do not ship").unwrap();
    for _ in 0..2 {
        let output = up.kiln(&["run", "-f", "--", "sh", "-c", "cat train.py; ls -A"]);
        assert!(output.status.success(), "{}", text(&output.stderr));
        assert_eq!(text(&output.stdout), "print('training')\n.kilnignore\ntrain.py\n");
    }
    assert_eq!(artifacts(up.home.path()).len(), 1);
}

#[test]
fn a_stopped_job_reaches_stopped_and_its_process_is_gone() {
    let up = Up::start();
    let output = up.kiln(&["run", "--", "sleep", "600"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let job_id = text(&output.stdout).trim().to_string();
    let running = up.wait_for_state(&job_id, "RUNNING");
    let pid: i32 = running["instance"]
        .as_str()
        .unwrap()
        .trim_start_matches("pid:")
        .parse()
        .unwrap();
    assert!(Path::new(&format!("/proc/{pid}")).try_exists().unwrap());

    let output = up.kiln(&["stop", &job_id]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let stopped = up.wait_for_state(&job_id, "STOPPED");
    // sleep died of SIGTERM (143), within the grace period: SIGKILL would read 137.
    assert_eq!(stopped["exit_code"], 143);
    assert!(
        !Path::new(&format!("/proc/{pid}")).try_exists().unwrap(),
        "process {pid} is still there"
    );
}

#[test]
fn bad_input_gets_clear_errors() {
    let up = Up::start();
    let output = up.kiln(&["run", "--mem", "abc", "--", "true"]);
    assert_eq!(output.status.code(), Some(2));
    assert!(
        text(&output.stderr).contains("\"abc\" is not a size"),
        "{}",
        text(&output.stderr)
    );

    let output = up.kiln(&["run", "--cpu", "0", "--", "true"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("cpu_millis must be greater than 0 (1000 is one core) (InvalidArgument)"),
        "{}",
        text(&output.stderr)
    );

    let output = up.kiln(&["run", "--no-code", "--"]);
    assert_eq!(output.status.code(), Some(2), "an empty command is a usage error");

    let unknown = "01a22826-4a16-7345-8170-afdecec4c749";
    let output = up.kiln(&["status", unknown]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains(&format!("job {unknown} not found (NotFound)")),
        "{}",
        text(&output.stderr)
    );

    let output = up.kiln_env(
        &["ps"],
        &[(
            "KILN_TOKEN",
            "kiln_0123456789abcdef_0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef",
        )],
    );
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("unknown, revoked or expired")
            && text(&output.stderr).contains("(Unauthenticated)"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn a_second_up_on_the_same_home_is_refused_and_ctrl_c_stops_everything() {
    let mut up = Up::start();
    let second = Command::new(KILN)
        .args([
            "up",
            "--api-addr",
            "127.0.0.1:0",
            "--logs-addr",
            "127.0.0.1:0",
            "--batch-addr",
            "127.0.0.1:0",
            "--advisor-addr",
            "127.0.0.1:0",
            "--predictor-addr",
            "127.0.0.1:0",
            "--predictor-http-addr",
            "127.0.0.1:0",
        ])
        .env("KILN_HOME", up.home.path())
        .output()
        .unwrap();
    assert_eq!(second.status.code(), Some(1));
    assert!(
        text(&second.stderr).contains("another `kiln up` is running"),
        "{}",
        text(&second.stderr)
    );
    // The first one is unharmed.
    assert!(up.kiln(&["ps"]).status.success());

    let nats = up.nats_url();
    let port: u16 = nats.rsplit(':').next().unwrap().parse().unwrap();
    assert!(std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    let status = up.interrupt();
    assert!(status.success(), "kiln up exited with {status}:\n{}", up.log());
    assert!(up.log().contains("kiln stopped"));
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "the child nats-server is still up"
    );
    // It starts again on the same home, with the same data.
    let job = up.kiln(&["run", "--no-code", "--", "true"]);
    assert!(!job.status.success(), "nothing runs while it is down");
    up.restart();
    let output = up.kiln(&["run", "-f", "--no-code", "--", "echo", "back"]);
    assert_eq!(text(&output.stdout), "back\n", "{}", text(&output.stderr));
    let listed = text(&up.kiln(&["ps", "--all", "-o", "json"]).stdout);
    assert_eq!(
        serde_json::from_str::<serde_json::Value>(&listed)
            .unwrap()
            .as_array()
            .unwrap()
            .len(),
        1
    );
}

#[test]
fn containers_datasets_and_artifacts_from_the_cli() {
    let up = Up::start_docker();
    assert!(up.log().contains("provider: docker"), "{}", up.log());
    let image =
        std::env::var("KILN_TEST_IMAGE").expect("KILN_TEST_IMAGE is not set: run the tests through scripts/test.sh");
    let data = up.project.path().join("data");
    std::fs::create_dir_all(data.join("split")).unwrap();
    std::fs::write(data.join("split/train.csv"), "a,b\n").unwrap();
    let data = data.display().to_string();
    let output = up.kiln(&["dataset", "create", "tiny", "--from", &data]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("dataset tiny created: 2 files"),
        "{}",
        text(&output.stdout)
    );
    assert!(text(&up.kiln(&["dataset", "ls"]).stdout).contains("tiny"));

    let script = "cat /kiln/data/tiny/split/train.csv; mkdir -p /kiln/outputs/ckpt; echo w > /kiln/outputs/model.txt; echo c > /kiln/outputs/ckpt/1.pt";
    let output = up.kiln(&[
        "run",
        "-f",
        "--image",
        &image,
        "--dataset",
        "tiny",
        "--cpu",
        "0.5",
        "--mem",
        "64M",
        "--",
        "sh",
        "-c",
        script,
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "a,b\n");
    let job_id = text(&output.stderr)
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();

    let listed = text(&up.kiln(&["artifacts", "ls", &job_id]).stdout);
    assert!(listed.contains("ckpt/1.pt") && listed.contains("model.txt"), "{listed}");
    let dest = tempfile::tempdir().unwrap();
    let dest_arg = dest.path().display().to_string();
    let output = up.kiln(&["artifacts", "get", &job_id, "--dest", &dest_arg]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(std::fs::read_to_string(dest.path().join("model.txt")).unwrap(), "w\n");
    assert_eq!(std::fs::read_to_string(dest.path().join("ckpt/1.pt")).unwrap(), "c\n");
    let only = tempfile::tempdir().unwrap();
    let only_arg = only.path().display().to_string();
    assert!(
        up.kiln(&["artifacts", "get", &job_id, "ckpt", "--dest", &only_arg])
            .status
            .success()
    );
    assert!(!only.path().join("model.txt").try_exists().unwrap());
    assert!(only.path().join("ckpt/1.pt").try_exists().unwrap());

    // The job has ended: the dataset may go, once.
    let output = up.kiln(&["dataset", "rm", "tiny"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert_eq!(text(&output.stdout), "dataset tiny deleted\n");
    assert!(!text(&up.kiln(&["dataset", "ls"]).stdout).contains("tiny"));
    let output = up.kiln(&["dataset", "rm", "tiny"]);
    assert!(!output.status.success());
    assert!(
        text(&output.stderr).contains("dataset tiny not found"),
        "{}",
        text(&output.stderr)
    );

    let output = up.kiln(&[
        "run",
        "-f",
        "--image",
        &image,
        "--max-runtime",
        "1s",
        "--",
        "sleep",
        "600",
    ]);
    assert!(
        text(&output.stderr).contains("STOPPED: timeout"),
        "{}",
        text(&output.stderr)
    );
}

#[test]
fn a_job_s_system_metrics_from_the_cli() {
    let up = Up::start();
    // The runner samples every 5 s by default: a job of 8 s has at least one sample.
    let output = up.kiln(&["run", "-f", "--no-code", "--", "sleep", "8"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let job_id = text(&output.stderr)
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .nth(1)
        .unwrap()
        .to_string();
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let csv = text(&up.kiln(&["metrics", &job_id, "-o", "csv"]).stdout);
        if csv.contains("sys/host_memory_used_bytes,") {
            assert!(csv.starts_with("key,step,value,timestamp_ms\n"), "{csv}");
            break;
        }
        assert!(Instant::now() < deadline, "no metrics: {csv}");
        std::thread::sleep(Duration::from_millis(200));
    }
    let series = text(
        &up.kiln(&[
            "metrics",
            &job_id,
            "--series",
            "--key",
            "sys/host_memory_used_bytes",
            "-o",
            "json",
        ])
        .stdout,
    );
    let points: serde_json::Value = serde_json::from_str(&series).unwrap();
    assert!(!points.as_array().unwrap().is_empty(), "{series}");
}

#[test]
fn quotas_explain_and_priorities_from_the_cli() {
    let up = Up::start();
    // Nothing may run: a running-jobs quota of 0 for admin.
    let output = up.kiln(&[
        "quota",
        "set",
        "user:admin",
        "--running-jobs",
        "0",
        "--queued-jobs",
        "1",
    ]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let output = up.kiln(&["quota", "ls", "-o", "json"]);
    let quotas: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(quotas[0]["scope"], "user:admin", "{quotas}");
    assert_eq!(quotas[0]["running_jobs"], 0, "{quotas}");
    assert_eq!(quotas[0]["cpu_millis"], serde_json::Value::Null, "{quotas}");

    let output = up.kiln(&["run", "--no-code", "--priority", "high", "--on-demand", "--", "true"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    let job_id = text(&output.stdout).trim().to_string();
    let status = up.status_json(&job_id);
    assert_eq!(
        (&status["priority"], &status["market"]),
        (&"high".into(), &"on-demand".into()),
        "{status}"
    );
    let output = up.kiln(&["explain", &job_id]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(
        text(&output.stdout).contains("running-jobs quota of user:admin is 0 jobs"),
        "{}",
        text(&output.stdout)
    );

    // The queued-jobs quota refuses the next submit, naming itself.
    let output = up.kiln(&["run", "--no-code", "--", "true"]);
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains("queued-jobs quota of user:admin is 1 (1 queued)")
            && text(&output.stderr).contains("(ResourceExhausted)"),
        "{}",
        text(&output.stderr)
    );
    let output = up.kiln(&["run", "--no-code", "--priority", "urgent", "--", "true"]);
    assert!(
        text(&output.stderr).contains("priority class \"urgent\" is not one of low, normal, high"),
        "{}",
        text(&output.stderr)
    );

    // Raising the quota lets the job run.
    let output = up.kiln(&["quota", "rm", "user:admin"]);
    assert!(output.status.success(), "{}", text(&output.stderr));
    up.wait_for_state(&job_id, "SUCCEEDED");
    let output = up.kiln(&["explain", &job_id]);
    assert!(
        text(&output.stdout).contains("it has ended"),
        "{}",
        text(&output.stdout)
    );
}
