//! The `process` provider: a job is a local child process in its own process group.
//!
//! The child starts with a clean environment (PATH, HOME, LANG, the job's env and the `KILN_*`
//! variables), so nothing of the runner's environment, credentials included, leaks into it.
//! Stopping signals the whole group. This provider does not enforce CPU or memory limits; the
//! docker provider does.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::error::{Error, Result};

/// A started job process.
pub struct Instance {
    pub child: Child,
    pub pid: i32,
}

/// Starts `command` in `workdir` with exactly `env` (plus PATH, HOME and LANG).
pub fn spawn(
    command: &[String],
    env: &BTreeMap<String, String>,
    workdir: &Path,
) -> Result<Instance> {
    let (program, args) = command.split_first().ok_or_else(|| Error::Spawn {
        program: String::new(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"),
    })?;
    let mut builder = Command::new(program);
    builder
        .args(args)
        .current_dir(workdir)
        .env_clear()
        .env(
            "PATH",
            std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into()),
        )
        .env("HOME", workdir)
        .env("LANG", "C.UTF-8")
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    let child = builder.spawn().map_err(|source| Error::Spawn {
        program: program.clone(),
        source,
    })?;
    let pid = child
        .id()
        .and_then(|pid| i32::try_from(pid).ok())
        .ok_or_else(|| Error::Spawn {
            program: program.clone(),
            source: std::io::Error::other("the process exited before it could be tracked"),
        })?;
    Ok(Instance { child, pid })
}

/// Signals every process of the job's group; a group that is gone already is fine.
pub fn signal_group(pid: i32, signal: Signal) {
    match killpg(Pid::from_raw(pid), signal) {
        Ok(()) | Err(nix::errno::Errno::ESRCH) => {}
        Err(error) => {
            tracing::warn!(pid, %signal, error = %error, "cannot signal the job's processes")
        }
    }
}

/// Tells whether `pid` is still a process of job `job_id` (a process started by an earlier runner,
/// found at restart): it must carry `KILN_JOB_ID=<job_id>` in its environment, so a reused pid is
/// never mistaken for the job.
pub fn is_job_process(pid: i32, job_id: &str) -> bool {
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    let wanted = format!("KILN_JOB_ID={job_id}");
    environ
        .split(|&b| b == 0)
        .any(|var| var == wanted.as_bytes())
}

/// The exit code kept for a job: the process's code, or 128 + the signal that killed it.
pub fn exit_code(status: ExitStatus) -> i32 {
    status
        .code()
        .or_else(|| status.signal().map(|signal| 128 + signal))
        .unwrap_or(-1)
}

/// Parses the pid out of an instance id (`pid:<n>`).
pub fn instance_pid(instance_id: &str) -> Option<i32> {
    instance_id.strip_prefix("pid:")?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn children_get_only_the_env_they_are_given() {
        let dir = tempfile::tempdir().unwrap();
        let env = BTreeMap::from([("KILN_JOB_ID".to_string(), "j1".to_string())]);
        let mut instance = spawn(
            &["sh".into(), "-c".into(), "sleep 5".into()],
            &env,
            dir.path(),
        )
        .unwrap();
        assert!(is_job_process(instance.pid, "j1"));
        assert!(!is_job_process(instance.pid, "j2"));
        signal_group(instance.pid, Signal::SIGTERM);
        let status = instance.child.wait().await.unwrap();
        assert_eq!(exit_code(status), 128 + 15);
        assert!(!is_job_process(instance.pid, "j1"));
    }

    #[test]
    fn missing_programs_are_reported() {
        let dir = tempfile::tempdir().unwrap();
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let error = runtime.block_on(async {
            spawn(
                &["/definitely/not/here".into()],
                &BTreeMap::new(),
                dir.path(),
            )
            .err()
            .unwrap()
        });
        assert!(
            error.to_string().contains("/definitely/not/here"),
            "{error}"
        );
    }

    #[test]
    fn instance_ids_hold_pids() {
        assert_eq!(instance_pid("pid:42"), Some(42));
        assert_eq!(instance_pid("container:abc"), None);
    }
}
