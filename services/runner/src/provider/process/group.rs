//! The process group a job runs in: started with a clean environment, measured, signalled,
//! recognised again after a restart, and its exit read.

use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::{ExitStatus, Stdio};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::process::Command;

use crate::error::{Error, Result};

/// Starts `command` in `workdir` with exactly `env` (plus PATH, HOME and LANG), as `uid` (with
/// the gid of the same number) when given.
///
/// With a uid, the standard library's spawn calls `setgroups(0)` before `setgid` and `setuid`
/// (it does so whenever a uid is set and no groups are), so the child keeps none of the
/// runner's supplementary groups; and a uid other than 0 leaves the child no capabilities.
pub(super) fn spawn(
    command: &[String],
    env: &BTreeMap<String, String>,
    workdir: &Path,
    uid: Option<u32>,
) -> Result<(tokio::process::Child, i32)> {
    let (program, args) = command.split_first().ok_or_else(|| Error::Spawn {
        program: String::new(),
        source: std::io::Error::new(std::io::ErrorKind::InvalidInput, "empty command"),
    })?;
    let mut path = std::env::var("PATH").unwrap_or_else(|_| "/usr/local/bin:/usr/bin:/bin".into());
    if uid.is_some() {
        // Only the directories any user reaches: one under /root would turn a missing program
        // into "permission denied".
        let reachable: Vec<&str> = path
            .split(':')
            .filter(|dir| super::isolation::check_reachable(Path::new(dir)).is_ok())
            .collect();
        path = reachable.join(":");
    }
    // Isolated: through util-linux's `setpriv --no-new-privs`, which sets the flag and execs the
    // command (same process), so no setuid program the job runs gains a privilege (nor makes
    // sockets as root past the firewall's owner match).
    let setpriv = uid.and(no_new_privs_program());
    if setpriv.is_some() && !findable(program, &path, workdir) {
        // What spawning it directly would have said (exit 127, "cannot start"): setpriv would
        // start and fail in the job's own words instead.
        return Err(Error::Spawn {
            program: program.clone(),
            source: std::io::Error::from(std::io::ErrorKind::NotFound),
        });
    }
    let mut builder = match &setpriv {
        Some(setpriv) => {
            let mut builder = Command::new(setpriv);
            builder.args(["--no-new-privs", "--"]).arg(program);
            builder
        }
        None => Command::new(program),
    };
    builder
        .args(args)
        .current_dir(workdir)
        .env_clear()
        .env("PATH", path)
        .env("HOME", workdir)
        .env("LANG", "C.UTF-8")
        .envs(env)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .process_group(0)
        .kill_on_drop(true);
    if let Some(uid) = uid {
        builder.uid(uid).gid(uid);
    }
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
    Ok((child, pid))
}

/// Whether `program` names a file: a path (relative to `workdir`), or a name in one of `path`'s
/// directories.
fn findable(program: &str, path: &str, workdir: &Path) -> bool {
    if program.contains('/') {
        return workdir.join(program).is_file();
    }
    std::env::split_paths(path).any(|dir| dir.join(program).is_file())
}

/// util-linux's `setpriv` (Debian's essential util-linux), or `None` (and a warning, once) where
/// the machine has none: isolated jobs then run without `no_new_privs`.
fn no_new_privs_program() -> Option<std::path::PathBuf> {
    static FOUND: std::sync::OnceLock<Option<std::path::PathBuf>> = std::sync::OnceLock::new();
    FOUND
        .get_or_init(|| {
            let found = ["/usr/bin/setpriv", "/bin/setpriv"]
                .map(std::path::PathBuf::from)
                .into_iter()
                .find(|path| path.is_file());
            if found.is_none() {
                tracing::warn!(
                    "setpriv (util-linux) not found: isolated process jobs run without no_new_privs, so a setuid program of this machine can raise their privileges"
                );
            }
            found
        })
        .clone()
}

pub(super) fn clock_ticks_per_second() -> f64 {
    match nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK) {
        Ok(Some(ticks)) if ticks > 0 => ticks as f64,
        _ => 100.0,
    }
}

/// Sums CPU time (clock ticks) and resident memory (bytes) over the processes of a group, from
/// /proc; `None` when the group has no process left.
pub(super) fn group_usage(pgid: i32) -> Option<(u64, u64)> {
    let page = match nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE) {
        Ok(Some(size)) if size > 0 => size as u64,
        _ => 4096,
    };
    let mut found = false;
    let (mut ticks, mut rss) = (0u64, 0u64);
    for entry in std::fs::read_dir("/proc").ok()?.flatten() {
        let name = entry.file_name();
        if !name.to_string_lossy().bytes().all(|b| b.is_ascii_digit()) {
            continue;
        }
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // Fields after the command, which may hold spaces: state ppid pgrp … utime(11) stime(12) … rss(21).
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        if fields.len() < 22 || fields[2].parse::<i32>().ok() != Some(pgid) {
            continue;
        }
        found = true;
        ticks += fields[11].parse::<u64>().unwrap_or(0) + fields[12].parse::<u64>().unwrap_or(0);
        rss += fields[21].parse::<u64>().unwrap_or(0) * page;
    }
    found.then_some((ticks, rss))
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
    environ.split(|&b| b == 0).any(|var| var == wanted.as_bytes())
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

/// Tells whether process `pid` handles `signal` (its bit in `SigCgt` of `/proc/<pid>/status`).
pub(super) fn catches(pid: i32, signal: Signal) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let Some(mask) = status
        .lines()
        .find_map(|line| line.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
    else {
        return false;
    };
    mask & (1u64 << (signal as i32 - 1)) != 0
}

/// Writes a job's control file: a new file beside it (created, never opened if something is
/// there, so a link the job left is not followed) renamed over it, since the job owns the
/// directory.
pub(super) fn write_control(path: &std::path::Path, note: &str) -> crate::error::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let fresh = path.with_extension(format!("new-{}", rand::random::<u64>()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o644)
        .open(&fresh)
        .and_then(|mut file| file.write_all(note.as_bytes()))
        .and_then(|()| std::fs::rename(&fresh, path));
    if written.is_err() {
        let _ = std::fs::remove_file(&fresh);
    }
    written.map_err(crate::error::Error::io(format!("cannot write {}", path.display())))
}
