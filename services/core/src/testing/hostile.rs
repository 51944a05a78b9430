//! What the hostile tenant's tests share (issue 26: `tests/e2e/tests/process_isolation.rs`,
//! `sdk/cli/tests/up_hostile.rs`, `tests/topology/tests/hostile.rs`): the root they need, the
//! process of a running job and its environment, and the verdicts their probes print.

use std::collections::BTreeSet;

/// Fails the test, saying why, unless it runs as root (isolated jobs, their firewall).
pub fn assert_root() {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let root = status
        .lines()
        .find(|line| line.starts_with("Uid:"))
        .is_some_and(|line| line.split_whitespace().nth(2) == Some("0"));
    assert!(
        root,
        "isolating jobs needs root: run the tests as root (CI does, through scripts/test.sh)"
    );
}

/// The pid of a process of the running process job `job` (one whose environment names it).
pub fn pid_of_job(job: &str) -> u32 {
    let needle = format!("KILN_JOB_ID={job}");
    for entry in std::fs::read_dir("/proc").expect("/proc").flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let environ = std::fs::read(entry.path().join("environ")).unwrap_or_default();
        if environ.split(|b| *b == 0).any(|var| var == needle.as_bytes()) {
            return pid;
        }
    }
    panic!("no process of {job}");
}

/// The value of `name` in the environment of process `pid`.
pub fn env_of(pid: u32, name: &str) -> String {
    let environ = std::fs::read(format!("/proc/{pid}/environ")).expect("the process's environment");
    let prefix = format!("{name}=");
    environ
        .split(|b| *b == 0)
        .find_map(|var| var.strip_prefix(prefix.as_bytes()))
        .map(|value| String::from_utf8_lossy(value).into_owned())
        .unwrap_or_else(|| panic!("process {pid} has no {name}"))
}

/// The lines of a probe's `output` that start with `verdict` (`"read "`, `"open "`, ...), with
/// it removed.
pub fn verdicts(output: &str, verdict: &str) -> BTreeSet<String> {
    output
        .lines()
        .filter_map(|line| line.strip_prefix(verdict).map(|rest| rest.trim().to_string()))
        .collect()
}

/// Who runs a `kiln` command in [`cross_project_attacks`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tenant {
    /// A member of `alpha`, the control.
    Ada,
    /// A member of `beta` only, the attacker.
    Eve,
}

fn stdout_of(output: std::process::Output) -> String {
    assert!(output.status.success(), "{}", String::from_utf8_lossy(&output.stderr));
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn last_line_of(output: std::process::Output) -> String {
    stdout_of(output).lines().last().unwrap_or_default().trim().to_string()
}

fn refusal_of(output: std::process::Output) -> String {
    assert!(
        !output.status.success(),
        "not refused: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    String::from_utf8_lossy(&output.stderr).into_owned()
}

/// Issue 26's first two attacks through the CLI, with their controls: eve names alpha's dataset
/// from beta (bare and as `PROJECT/NAME`), and feeds a beta batch from an alpha job's outputs;
/// each is refused in the words of an object that does not exist, while ada does each in alpha.
/// `kiln` runs the CLI as a tenant; `wait_succeeded` waits for a job to succeed; `placement` is
/// what every `kiln run` adds (a pool).
pub fn cross_project_attacks(
    kiln: &dyn Fn(Tenant, &[&str]) -> std::process::Output,
    wait_succeeded: &dyn Fn(&str),
    placement: &[&str],
) {
    use Tenant::{Ada, Eve};
    let run = |tenant: Tenant, project: &str, extra: &[&str], command: &[&str]| {
        let mut args = vec!["run", "--no-code"];
        args.extend(placement);
        args.extend(["--project", project]);
        args.extend(extra);
        args.push("--");
        args.extend(command);
        kiln(tenant, &args)
    };
    // Attack 1: alpha's dataset named from beta. Jobs of the control run as uids of their own:
    // the dataset's files are read by them.
    let dir = tempfile::tempdir().expect("a temp dir");
    std::fs::write(dir.path().join("secret.txt"), "alpha-secret\n").expect("the dataset's file");
    let from = dir.path().display().to_string();
    stdout_of(kiln(
        Ada,
        &["dataset", "create", "alpha-data", "--from", &from, "--project", "alpha"],
    ));
    let run_with = |name: &str| refusal_of(run(Eve, "beta", &["--dataset", name], &["true"]));
    for (name, unknown) in [("alpha-data", "nodata"), ("alpha/alpha-data", "alpha/nodata")] {
        assert_eq!(run_with(name), run_with(unknown).replace("nodata", "alpha-data"));
    }
    let read = stdout_of(run(
        Ada,
        "alpha",
        &["-f", "--dataset", "alpha-data"],
        &["sh", "-c", "cat $KILN_DATA/alpha-data/secret.txt"],
    ));
    assert!(read.contains("alpha-secret"), "{read}");

    // Attack 2: a beta batch's items from an alpha job's outputs.
    let job = last_line_of(run(
        Ada,
        "alpha",
        &[],
        &["sh", "-c", "echo s3://alpha/private-item > $KILN_OUTPUTS/list.txt"],
    ));
    wait_succeeded(&job);
    let manifest = format!("outputs/{job}/list.txt");
    let unknown = "00000000-0000-0000-0000-000000000000";
    let eves = last_line_of(kiln(Eve, &["batch", "create", "--project", "beta", "--", "kiln:noop"]));
    let why = refusal_of(kiln(Eve, &["batch", "add", &eves, "--manifest", &manifest]));
    let manifest_of_unknown = format!("outputs/{unknown}/list.txt");
    let unknown_why = refusal_of(kiln(Eve, &["batch", "add", &eves, "--manifest", &manifest_of_unknown]));
    assert_eq!(why, unknown_why.replace(unknown, &job));
    // Refused, or taking nothing of alpha's: the items say which.
    let _ = kiln(Eve, &["batch", "add", &eves, "--prefix", "outputs/"]);
    let items = stdout_of(kiln(Eve, &["batch", "items", &eves]));
    assert!(!items.contains("private-item"), "{items}");
    // Control: ada's own batch takes the manifest.
    let adas = last_line_of(kiln(Ada, &["batch", "create", "--project", "alpha", "--", "kiln:noop"]));
    stdout_of(kiln(Ada, &["batch", "add", &adas, "--manifest", &manifest]));
    let items = stdout_of(kiln(Ada, &["batch", "items", &adas]));
    assert!(items.contains("private-item"), "{items}");
}
