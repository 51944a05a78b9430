//! An item's own resource use. The agent runs each item's command through itself
//! (`kiln-agent --measure-into FILE -- COMMAND...`): that process's only child is the command, so
//! its `getrusage(RUSAGE_CHILDREN)` once the command has ended is the CPU time of the command's
//! whole process tree and the peak resident memory of its largest process, whatever else the
//! worker runs beside it. It writes them to FILE and ends as the command ended (its exit code, or
//! the same signal).
//!
//! Why not a cgroup per item: Docker mounts the cgroup file system read-only in the unprivileged
//! containers kiln starts, and a process worker's cgroup is the runner's; the reading above needs
//! neither. Its limits: memory is the largest process's peak, not the sum of a tree's processes
//! at one instant, and processes that leave the tree (daemons) are not counted.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::atomic::{AtomicU64, Ordering};

/// The flag that makes kiln-agent measure a command rather than work for a batch.
pub const FLAG: &str = "--measure-into";

/// How this agent measures its items: itself, and a directory the measuring processes write to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Measurer {
    agent: PathBuf,
    dir: PathBuf,
}

/// Usage files made by this agent, numbered.
static USAGE_FILES: AtomicU64 = AtomicU64::new(0);

impl Measurer {
    /// This kiln-agent, with the first writable of the temp directory and the working one (an
    /// image may have no /tmp); None when there is neither (items are then measured as the
    /// worker's children together).
    pub fn here() -> Option<Measurer> {
        let agent = std::env::current_exe().ok()?;
        let candidates = [Some(std::env::temp_dir()), std::env::current_dir().ok()];
        let dir = candidates.into_iter().flatten().find(|dir| {
            let probe = dir.join(format!(".kiln-agent-probe-{}", std::process::id()));
            let writable = std::fs::write(&probe, b"").is_ok();
            let _ = std::fs::remove_file(&probe);
            writable
        })?;
        Some(Measurer { agent, dir })
    }

    /// The program and arguments that run `command` measured, and where its usage will be.
    pub fn wrap(&self, command: &[String]) -> (PathBuf, Vec<String>, PathBuf) {
        let n = USAGE_FILES.fetch_add(1, Ordering::Relaxed);
        let file = self.dir.join(format!("kiln-agent-{}-{n}.usage", std::process::id()));
        let mut args = vec![FLAG.to_string(), file.display().to_string(), "--".to_string()];
        args.extend(command.iter().cloned());
        (self.agent.clone(), args, file)
    }
}

/// What an item's command used.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    pub cpu_seconds: f64,
    pub peak_memory_bytes: u64,
}

impl Usage {
    fn to_line(self) -> String {
        format!("{} {}\n", self.cpu_seconds, self.peak_memory_bytes)
    }

    /// Reads what [`measure`] wrote; None when it wrote nothing (it was killed).
    pub fn read(path: &Path) -> Option<Usage> {
        let text = std::fs::read_to_string(path).ok()?;
        let mut words = text.split_whitespace();
        Some(Usage {
            cpu_seconds: words.next()?.parse().ok()?,
            peak_memory_bytes: words.next()?.parse().ok()?,
        })
    }
}

/// This process's children's use so far (for the measuring process: its one command's).
pub fn children() -> Usage {
    use nix::sys::resource::{UsageWho, getrusage};
    match getrusage(UsageWho::RUSAGE_CHILDREN) {
        Ok(usage) => {
            let seconds = |t: nix::sys::time::TimeVal| t.tv_sec() as f64 + t.tv_usec() as f64 / 1e6;
            Usage {
                cpu_seconds: seconds(usage.user_time()) + seconds(usage.system_time()),
                // Linux reports the largest child's peak, in KiB.
                peak_memory_bytes: u64::try_from(usage.max_rss()).unwrap_or(0) * 1024,
            }
        }
        Err(_) => Usage::default(),
    }
}

/// `kiln-agent --measure-into FILE -- COMMAND...`: runs COMMAND, writes its usage to FILE, and
/// ends as it ended.
pub fn measure(args: &[String]) -> ExitCode {
    let (into, command) = match args {
        [into, dashes, command @ ..] if dashes == "--" && !command.is_empty() => (Path::new(into), command),
        _ => {
            eprintln!("kiln-agent: usage: kiln-agent {FLAG} FILE -- COMMAND [ARG...]");
            return ExitCode::from(64);
        }
    };
    let status = match std::process::Command::new(&command[0]).args(&command[1..]).status() {
        Ok(status) => status,
        Err(error) => {
            // As a shell says it; the agent reads the exit code 127 as "not started".
            eprintln!("kiln-agent: cannot start {}: {error}", command[0]);
            return ExitCode::from(127);
        }
    };
    if let Err(error) = std::fs::write(into, children().to_line()) {
        eprintln!(
            "kiln-agent: cannot write the item's usage to {}: {error}",
            into.display()
        );
    }
    use std::os::unix::process::ExitStatusExt;
    if let Some(signal) = status.signal() {
        // Ends by the same signal, so the agent sees what the command saw (an OOM kill is a
        // SIGKILL); its disposition here is the default one.
        if let Ok(signal) = nix::sys::signal::Signal::try_from(signal) {
            let _ = nix::sys::signal::raise(signal);
        }
        return ExitCode::from(u8::try_from(128 + signal).unwrap_or(255));
    }
    ExitCode::from(u8::try_from(status.code().unwrap_or(1)).unwrap_or(1))
}
