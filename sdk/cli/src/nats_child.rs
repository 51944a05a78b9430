//! The nats-server that `kiln up` starts as a child, with JetStream in `KILN_HOME/nats`, on
//! loopback, admitting only the services' NKey users (its `-c` config, see `up::nats_users`).
//!
//! Two things keep a home to one server on its store:
//! - **The child dies with its parent.** It is started through `setpriv --pdeathsig KILL`
//!   (util-linux, on every Debian), which sets the Linux parent-death signal and then execs
//!   nats-server, so the pid we get is nats-server's own. Setting it ourselves would need
//!   `CommandExt::pre_exec`, which is `unsafe`, and the workspace forbids unsafe code; nix's
//!   `prctl::set_pdeathsig` is safe but can only be called from the child, i.e. inside
//!   `pre_exec`. The signal follows the death of the *thread* that forked: `kiln up` spawns
//!   from the thread that runs `block_on` (the main thread), which lives as long as the process.
//!   Without setpriv on PATH the child is started directly and only the pid file below helps.
//! - **A stale server is stopped.** The pid of the child is kept in `KILN_HOME/nats.pid`; the
//!   next `kiln up` (which holds the home's lock, so no live `kiln up` owns that server) stops
//!   the process of that pid if its command line names this home's store directory — a pid
//!   reused by another program is left alone.

use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use tokio::process::{Child, Command};

use crate::tools::{ToolDirs, find_tool};

/// How long a stopping server gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A nats-server started by `kiln up`, stopped with it.
pub struct NatsChild {
    child: Child,
    pid_file: PathBuf,
    pub url: String,
    /// Its monitoring endpoint (`/varz`), which `kiln up`'s metrics read.
    pub monitor_url: String,
}

impl NatsChild {
    /// Starts the server with the config file `config` (its `authorization` block).
    ///
    /// nats-server picks its own free ports (`-p -1 -m -1`) and writes them to a ports file:
    /// a port found free by `kiln up` and handed to it could be taken by another program in
    /// between (two `kiln up`s starting at once did), and the server would then exit while the
    /// other program answered on the port.
    pub async fn start(binary: &Path, home: &Path, config: &Path) -> Result<NatsChild> {
        let store_dir = home.join("nats");
        std::fs::create_dir_all(&store_dir)?;
        let pid_file = home.join("nats.pid");
        stop_stale(&pid_file, &store_dir).await?;
        let ports_dir = home.join("nats-ports");
        match std::fs::remove_dir_all(&ports_dir) {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(error).with_context(|| format!("cannot clear {}", ports_dir.display()));
            }
            _ => {}
        }
        std::fs::create_dir_all(&ports_dir)?;
        let log_path = home.join("nats.log");
        let log = File::create(&log_path).with_context(|| format!("cannot create {}", log_path.display()))?;
        let mut command = match find_tool("setpriv", None, &ToolDirs::from_env(home)) {
            Ok(setpriv) => {
                let mut command = Command::new(setpriv);
                command.args(["--pdeathsig", "KILL", "--"]).arg(binary);
                command
            }
            Err(_) => {
                tracing::warn!(
                    "setpriv (util-linux) is not on PATH: nats-server will outlive a killed `kiln up` until the next one stops it"
                );
                Command::new(binary)
            }
        };
        let mut child = command
            .args(["-js", "-a", "127.0.0.1", "-p", "-1", "-m", "-1", "--ports_file_dir"])
            .arg(&ports_dir)
            .arg("-sd")
            .arg(&store_dir)
            .arg("-c")
            .arg(config)
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", binary.display()))?;
        let pid = child.id().context("nats-server exited as it started")?;
        std::fs::write(&pid_file, format!("{pid}\n"))
            .with_context(|| format!("cannot write {}", pid_file.display()))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(15);
        let ports = loop {
            if let Some(ports) = read_ports(&ports_dir) {
                break ports;
            }
            if let Some(status) = child.try_wait()? {
                let _ = std::fs::remove_file(&pid_file);
                bail!("nats-server exited ({status}); see {}", log_path.display());
            }
            if tokio::time::Instant::now() > deadline {
                bail!("nats-server did not start within 15s; see {}", log_path.display());
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let (Some(url), Some(monitor_url)) = (ports.nats.into_iter().next(), ports.monitoring.into_iter().next())
        else {
            bail!(
                "nats-server's ports file in {} names no client or monitoring address",
                ports_dir.display()
            );
        };
        Ok(NatsChild {
            child,
            pid_file,
            url,
            monitor_url,
        })
    }

    /// Stops the server gracefully (SIGTERM), killing it after [`STOP_GRACE`].
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id().and_then(|pid| i32::try_from(pid).ok()) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGTERM);
        }
        if tokio::time::timeout(STOP_GRACE, self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
        }
        let _ = std::fs::remove_file(&self.pid_file);
    }
}

/// What nats-server writes to its `--ports_file_dir`: the URLs it listens on.
#[derive(serde::Deserialize)]
struct Ports {
    #[serde(default)]
    nats: Vec<String>,
    #[serde(default)]
    monitoring: Vec<String>,
}

/// The ports file in `dir` (`<argv0>_<pid>.ports`, the only file there, written once the server
/// listens), or `None` before it is there or while it is half-written.
fn read_ports(dir: &Path) -> Option<Ports> {
    let file = std::fs::read_dir(dir)
        .ok()?
        .filter_map(|entry| entry.ok())
        .find(|entry| entry.path().extension().is_some_and(|ext| ext == "ports"))?;
    serde_json::from_slice(&std::fs::read(file.path()).ok()?).ok()
}

/// Stops the nats-server a killed `kiln up` of this home left running (see the module doc).
async fn stop_stale(pid_file: &Path, store_dir: &Path) -> Result<()> {
    let text = match std::fs::read_to_string(pid_file) {
        Ok(text) => text,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(error) => return Err(error).with_context(|| format!("cannot read {}", pid_file.display())),
    };
    let Ok(pid) = text.trim().parse::<i32>() else {
        tracing::warn!(pid_file = %pid_file.display(), "ignoring a pid file that holds no pid");
        return Ok(());
    };
    if !serves_store(pid, store_dir) {
        std::fs::remove_file(pid_file).ok();
        return Ok(());
    }
    eprintln!(
        "kiln: stopping nats-server pid {pid}, left running on {} by a `kiln up` that did not stop cleanly",
        store_dir.display()
    );
    let pid = Pid::from_raw(pid);
    let _ = kill(pid, Signal::SIGTERM);
    let deadline = tokio::time::Instant::now() + STOP_GRACE;
    while serves_store(pid.as_raw(), store_dir) {
        if tokio::time::Instant::now() > deadline {
            let _ = kill(pid, Signal::SIGKILL);
            tokio::time::sleep(Duration::from_millis(200)).await;
            if serves_store(pid.as_raw(), store_dir) {
                bail!("cannot stop the stale nats-server pid {pid} on {}", store_dir.display());
            }
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    std::fs::remove_file(pid_file).ok();
    Ok(())
}

/// Whether process `pid` runs with `store_dir` in its command line (a gone process, or a
/// zombie, whose command line is empty, does not).
fn serves_store(pid: i32, store_dir: &Path) -> bool {
    let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
        return false;
    };
    let store = store_dir.as_os_str().as_encoded_bytes();
    cmdline.split(|byte| *byte == 0).any(|arg| arg == store)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_process_serves_a_store_only_when_its_command_line_names_it() {
        let store = tempfile::tempdir().unwrap();
        let mut sleeper = std::process::Command::new("sh")
            .args(["-c", "sleep 30; true", "sh"])
            .arg(store.path())
            .spawn()
            .unwrap();
        let pid = sleeper.id() as i32;
        // Until the child has exec'd, its command line is this test's.
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        while !serves_store(pid, store.path()) {
            assert!(std::time::Instant::now() < deadline, "sleep never ran");
            std::thread::sleep(Duration::from_millis(10));
        }
        assert!(!serves_store(pid, &store.path().join("other")));
        sleeper.kill().unwrap();
        sleeper.wait().unwrap();
        assert!(!serves_store(pid, store.path()));
    }
}
