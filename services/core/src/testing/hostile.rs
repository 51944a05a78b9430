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
