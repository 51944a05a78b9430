//! The `process` provider: a job is a local child process in its own process group.
//!
//! The child starts with a clean environment (PATH, HOME, LANG, the job's env and the `KILN_*`
//! variables), so nothing of the runner's environment, credentials included, leaks into it.
//! Code, outputs and datasets are directories named by `KILN_CODE`, `KILN_OUTPUTS` and
//! `KILN_DATA` (and `KILN_RESUME_FROM`, the outputs directory holding a resumed attempt's
//! restored outputs); `KILN_DATA/<name>` links to the dataset's read-only directory in the
//! runner's cache. Stopping signals the whole group. This provider does not enforce CPU or
//! memory limits, nor a network of the job's own; the docker provider does.
//!
//! Whose jobs run, and as whom, is [`JobUsers`]: by default (`[process] isolation = "auto"`)
//! a runner that is root runs each job as a uid of its own in a directory of its own outside
//! the runner's ([`isolation`]); a runner that is not root runs the jobs of its trusted owner
//! only, as itself, in its scratch directory, and refuses the others.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::Mutex;

use futures::StreamExt;
use kiln_proto::v1::LogStream;
use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio_util::io::ReaderStream;

use super::firewall::UidFirewall;
use super::{Capacity, Exit, Instance, InstanceSpec, InstanceStats, OutputStream, Outputs, Provider};
use crate::error::{Error, Result};

pub mod config;
mod group;
pub mod isolation;
mod setup;

use group::{catches, clock_ticks_per_second, group_usage, spawn, write_control};
pub use group::{exit_code, instance_pid, is_job_process, signal_group};
pub use isolation::Isolated;
pub(crate) use setup::set_writable;
use setup::{blocking, io};

/// The file in an instance's scratch directory holding its process id.
const PID_FILE: &str = "pid";

/// The file in a job's directory its `KILN_CONTROL_FILE` names: what the runner asks of it
/// (`KILN_CHECKPOINT_NOW=1` on a rebalance recommendation).
pub(crate) const CONTROL_FILE: &str = "control";

/// The command, environment and uid (when isolated) of a provisioned, not yet started instance.
type Launch = (Vec<String>, BTreeMap<String, String>, Option<u32>);

/// Whose process jobs run, and as whom.
#[derive(Debug, Clone)]
pub enum JobUsers {
    /// Every job, each as a uid of its own (the runner is root).
    Isolated(Isolated),
    /// The jobs of this owner (a user id) only, as the runner's own user, which can read what
    /// kiln keeps; empty: none.
    Trusted(String),
}

/// Runs jobs as local processes.
pub struct ProcessProvider {
    capacity: Capacity,
    work_dir: PathBuf,
    users: JobUsers,
    /// Exit of each started instance, by instance id, set by its waiter task.
    exits: Mutex<HashMap<String, watch::Receiver<Option<Exit>>>>,
    /// The last CPU reading of each instance (when, clock ticks), for the rate.
    cpu_readings: Mutex<HashMap<String, (std::time::Instant, u64)>>,
    /// Command and environment of each provisioned instance, by scratch dir, until started.
    pending: Mutex<HashMap<PathBuf, Launch>>,
    /// Where isolated jobs' packets go through (`process.firewall`).
    firewall: Option<UidFirewall>,
}

impl ProcessProvider {
    pub fn new(capacity: Capacity, work_dir: PathBuf, users: JobUsers) -> ProcessProvider {
        ProcessProvider {
            capacity,
            work_dir,
            users,
            exits: Mutex::default(),
            cpu_readings: Mutex::default(),
            pending: Mutex::default(),
            firewall: None,
        }
    }

    /// Confines each isolated job's network to `firewall`'s chain from its start to its release.
    pub fn with_firewall(mut self, firewall: UidFirewall) -> ProcessProvider {
        self.firewall = Some(firewall);
        self
    }
}

#[async_trait::async_trait]
impl Provider for ProcessProvider {
    fn name(&self) -> &'static str {
        "process"
    }

    async fn provision(&self, spec: &InstanceSpec) -> Result<Instance> {
        if !spec.image.is_empty() {
            return Err(Error::ImageUnsupported {
                image: spec.image.clone(),
            });
        }
        if self.firewall.is_some() && spec.env.contains_key(super::GANG_NODES_VAR) {
            return Err(Error::Gang(
                "this runner's isolated jobs reach only kiln's endpoints, not the other nodes of their gang; run gangs on runners without process isolation, or in containers with host networking".into(),
            ));
        }
        let uid = match &self.users {
            JobUsers::Trusted(owner) if owner.is_empty() || *owner != spec.owner_id => {
                return Err(Error::UntrustedOwner {
                    owner: spec.owner_id.clone(),
                });
            }
            JobUsers::Trusted(_) => None,
            JobUsers::Isolated(isolated) => {
                let (isolated, scratch) = (isolated.clone(), spec.scratch_dir.clone());
                tokio::fs::create_dir_all(&scratch)
                    .await
                    .map_err(io(format!("cannot create {}", scratch.display())))?;
                Some(blocking(move || isolated.claim(&scratch)).await?)
            }
        };
        let prepared = self.prepare(spec, uid).await;
        if prepared.is_err()
            && let JobUsers::Isolated(isolated) = &self.users
        {
            // No instance comes of it: what the claim holds is given back now.
            let (isolated, scratch) = (isolated.clone(), spec.scratch_dir.clone());
            if let Err(error) = blocking(move || isolated.release(&scratch, None)).await {
                tracing::warn!(job_id = %spec.job_id, error = %error, "cannot give back the uid of a job that did not start");
            }
        }
        let launch = prepared?;
        self.pending
            .lock()
            .expect("pending lock")
            .insert(spec.scratch_dir.clone(), launch);
        Ok(Instance {
            provider: "process",
            job_id: spec.job_id.clone(),
            attempt: spec.attempt,
            id: String::new(),
            scratch_dir: spec.scratch_dir.clone(),
        })
    }

    async fn start(&self, instance: &mut Instance) -> Result<OutputStream> {
        let (command, env, uid) = self
            .pending
            .lock()
            .expect("pending lock")
            .remove(&instance.scratch_dir)
            .ok_or_else(|| Error::io("start")(std::io::Error::other("the instance was not provisioned")))?;
        let code = self.job_dir(&instance.scratch_dir).join("code");
        if let (Some(firewall), Some(uid)) = (&self.firewall, uid) {
            firewall.admit(uid).await?;
        }
        let (mut child, pid) = spawn(&command, &env, &code, uid)?;
        instance.id = format!("pid:{pid}");
        // A restarted runner finds the process of an attempt taken from it by this file.
        let pid_file = instance.scratch_dir.join(PID_FILE);
        if let Err(error) = tokio::fs::write(&pid_file, pid.to_string()).await {
            tracing::warn!(path = %pid_file.display(), error = %error, "cannot record the job's pid");
        }
        let stdout = child
            .stdout
            .take()
            .map(|pipe| ReaderStream::new(pipe).map(|chunk| (LogStream::Stdout, chunk)));
        let stderr = child
            .stderr
            .take()
            .map(|pipe| ReaderStream::new(pipe).map(|chunk| (LogStream::Stderr, chunk)));
        let (tx, rx) = watch::channel(None);
        self.exits.lock().expect("exits lock").insert(instance.id.clone(), rx);
        tokio::spawn(async move {
            let exit = match child.wait().await {
                Ok(status) => Exit {
                    code: exit_code(status),
                    oom_killed: false,
                    disk_full: false,
                },
                Err(_) => Exit {
                    code: -1,
                    oom_killed: false,
                    disk_full: false,
                },
            };
            let _ = tx.send(Some(exit));
        });
        let streams = futures::stream::select(
            futures::stream::iter(stdout).flatten(),
            futures::stream::iter(stderr).flatten(),
        );
        Ok(Box::pin(streams.filter_map(|(stream, chunk)| async move {
            chunk.ok().map(|bytes| (stream, bytes))
        })))
    }

    async fn signal(&self, instance: &Instance, signal: Signal) -> Result<()> {
        if let Some(pid) = instance_pid(&instance.id) {
            signal_group(pid, signal);
        }
        Ok(())
    }

    async fn ask_checkpoint(&self, instance: &Instance, note: &str) -> Result<bool> {
        let path = self.job_dir(&instance.scratch_dir).join(CONTROL_FILE);
        let note = note.to_string();
        blocking(move || write_control(&path, &note)).await?;
        let Some(pid) = instance_pid(&instance.id) else {
            return Ok(false);
        };
        if !catches(pid, Signal::SIGUSR1) {
            return Ok(false);
        }
        Ok(nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), Signal::SIGUSR1).is_ok())
    }

    async fn wait(&self, instance: &Instance) -> Result<Exit> {
        let exit = self.exits.lock().expect("exits lock").get(&instance.id).cloned();
        match exit {
            Some(mut rx) => {
                let exit = rx
                    .wait_for(Option::is_some)
                    .await
                    .map_err(|e| Error::io("wait")(std::io::Error::other(e)))?;
                Ok(exit.expect("waited for some"))
            }
            // Not our child (an instance recovered after a restart): wait for it to go.
            None => {
                let Some(pid) = instance_pid(&instance.id) else {
                    return Ok(Exit {
                        code: -1,
                        oom_killed: false,
                        disk_full: false,
                    });
                };
                while is_job_process(pid, &instance.job_id) {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Ok(Exit {
                    code: -1,
                    oom_killed: false,
                    disk_full: false,
                })
            }
        }
    }

    async fn live_outputs(&self, instance: &Instance) -> Result<Outputs> {
        let dir = self.job_dir(&instance.scratch_dir);
        let uid = match &self.users {
            JobUsers::Isolated(isolated) => isolated.recorded_uid(&instance.scratch_dir),
            JobUsers::Trusted(_) => None,
        };
        // A trusted job runs as the runner's user: its outputs are read as they are.
        let Some(uid) = uid else {
            return Ok(Outputs::Dir(dir.join("outputs")));
        };
        // An isolated job still runs and may swap a file for a link to what only root reads:
        // its outputs are archived by `tar` running as its uid, which reads only what it can.
        let archive = instance.scratch_dir.join("live-outputs.tar");
        let file = std::fs::File::create(&archive).map_err(io(format!("cannot create {}", archive.display())))?;
        let status = tokio::process::Command::new("tar")
            .args(["-cf", "-", "-C"])
            .arg(&dir)
            .arg("outputs")
            .uid(uid)
            .gid(uid)
            .stdin(std::process::Stdio::null())
            .stdout(file)
            .stderr(std::process::Stdio::null())
            .status()
            .await
            .map_err(|source| Error::Spawn {
                program: "tar".into(),
                source,
            })?;
        // 1: a file changed while it was read (the job writes on); what was read is kept.
        match status.code() {
            Some(0 | 1) => Ok(Outputs::Tar(archive)),
            _ => Err(Error::io("cannot archive the outputs")(std::io::Error::other(format!(
                "tar as uid {uid}: {status}"
            )))),
        }
    }

    async fn sync_asked(&self, instance: &Instance) -> Result<Option<i64>> {
        let marker = self
            .job_dir(&instance.scratch_dir)
            .join("outputs")
            .join(super::SYNC_MARKER);
        // lstat: a link the job made is not followed, and counts as no marker.
        match tokio::fs::symlink_metadata(&marker).await {
            Ok(metadata) if metadata.is_file() => Ok(Some(
                i64::try_from(crate::outputs::modified(&metadata).as_millis()).unwrap_or(i64::MAX),
            )),
            Ok(_) => Ok(None),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(error) => Err(io(format!("cannot read {}", marker.display()))(error)),
        }
    }

    async fn outputs(&self, instance: &Instance) -> Result<Outputs> {
        if let JobUsers::Isolated(isolated) = &self.users
            && let Some(uid) = isolated.recorded_uid(&instance.scratch_dir)
        {
            // The runner reads them as root: nothing of the job may still be changing them (a
            // file swapped for a link to kiln's own files, say).
            blocking(move || isolation::kill_all(uid)).await?;
        }
        Ok(Outputs::Dir(self.job_dir(&instance.scratch_dir).join("outputs")))
    }

    async fn stats(&self, instance: &Instance) -> Result<Option<InstanceStats>> {
        let Some(pid) = instance_pid(&instance.id) else {
            return Ok(None);
        };
        let Some((ticks, rss_bytes)) = tokio::task::spawn_blocking(move || group_usage(pid))
            .await
            .ok()
            .flatten()
        else {
            return Ok(None);
        };
        let now = std::time::Instant::now();
        let previous = self
            .cpu_readings
            .lock()
            .expect("cpu readings lock")
            .insert(instance.id.clone(), (now, ticks));
        let cpu_percent = match previous {
            Some((at, before)) if now > at => {
                let seconds = ticks.saturating_sub(before) as f64 / clock_ticks_per_second();
                seconds / now.duration_since(at).as_secs_f64() * 100.0
            }
            _ => 0.0,
        };
        Ok(Some(InstanceStats {
            cpu_percent,
            memory_bytes: rss_bytes,
        }))
    }

    async fn release(&self, instance: &Instance) -> Result<()> {
        self.cpu_readings
            .lock()
            .expect("cpu readings lock")
            .remove(&instance.id);
        if let Some(pid) = instance_pid(&instance.id) {
            signal_group(pid, Signal::SIGKILL);
        }
        self.exits.lock().expect("exits lock").remove(&instance.id);
        self.pending.lock().expect("pending lock").remove(&instance.scratch_dir);
        self.release_dir(instance.scratch_dir.clone()).await
    }

    async fn capacity(&self) -> Result<Capacity> {
        Ok(self.capacity)
    }

    async fn recover(
        &self,
        job_id: &str,
        attempt: i32,
        instance_id: &str,
        scratch_dir: PathBuf,
    ) -> Result<Option<Instance>> {
        let alive = instance_pid(instance_id).is_some_and(|pid| is_job_process(pid, job_id));
        let exists = alive || scratch_dir.try_exists().unwrap_or(false);
        Ok(exists.then(|| Instance {
            provider: "process",
            job_id: job_id.to_string(),
            attempt,
            id: instance_id.to_string(),
            scratch_dir,
        }))
    }

    async fn release_leftovers(&self, _runner_id: &str, keep: &[String]) -> Result<usize> {
        let mut released = 0;
        let Ok(mut entries) = tokio::fs::read_dir(&self.work_dir).await else {
            return Ok(0);
        };
        while let Some(entry) = entries
            .next_entry()
            .await
            .map_err(io("cannot list the work dir".into()))?
        {
            let name = entry.file_name().to_string_lossy().into_owned();
            // Not an instance's: the dataset cache (`.datasets`) and the like.
            if name.starts_with('.') {
                continue;
            }
            let job_id = name.rsplit_once('-').map(|(job, _)| job).unwrap_or(&name);
            if !keep.iter().any(|kept| kept == job_id) {
                // The process of an attempt taken from this runner while it was away.
                let pid = tokio::fs::read_to_string(entry.path().join(PID_FILE)).await.ok();
                if let Some(pid) = pid.and_then(|pid| pid.trim().parse::<i32>().ok())
                    && is_job_process(pid, job_id)
                {
                    tracing::warn!(job_id, pid, "killing the process of a job this runner no longer holds");
                    signal_group(pid, Signal::SIGKILL);
                }
                self.release_dir(entry.path()).await?;
                released += 1;
            }
        }
        if let JobUsers::Isolated(isolated) = &self.users {
            // Uids taken by instances whose scratch directory went (a crash in between).
            let (lister, work_dir) = (isolated.clone(), self.work_dir.clone());
            let claimed = blocking(move || Ok(lister.claimed_under(&work_dir))).await?;
            for (uid, scratch) in claimed {
                let name = scratch.file_name().map(|name| name.to_string_lossy().into_owned());
                let job_id = name
                    .as_deref()
                    .and_then(|name| name.rsplit_once('-'))
                    .map(|(job, _)| job);
                if !job_id.is_some_and(|job_id| keep.iter().any(|kept| kept == job_id)) {
                    tracing::warn!(uid, scratch = %scratch.display(), "giving back the uid of a job this runner no longer holds");
                    let isolated = isolated.clone();
                    blocking(move || isolated.release(&scratch, Some(uid))).await?;
                    released += 1;
                }
            }
            if let Some(firewall) = &self.firewall {
                // Jumps of uids given back while this runner was down.
                let (lister, work_dir) = (isolated.clone(), self.work_dir.clone());
                let held: Vec<u32> = blocking(move || Ok(lister.claimed_under(&work_dir)))
                    .await?
                    .into_iter()
                    .map(|(uid, _)| uid)
                    .collect();
                for uid in firewall.admitted().await? {
                    if !held.contains(&uid) {
                        firewall.release(uid).await?;
                    }
                }
            }
        }
        Ok(released)
    }
}

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
mod tests;
