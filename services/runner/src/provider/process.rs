//! The `process` provider: a job is a local child process in its own process group.
//!
//! The child starts with a clean environment (PATH, HOME, LANG, the job's env and the `KILN_*`
//! variables), so nothing of the runner's environment, credentials included, leaks into it.
//! Code, outputs and datasets are directories under the instance's scratch directory, named by
//! `KILN_CODE`, `KILN_OUTPUTS` and `KILN_DATA` (and `KILN_RESUME_FROM`, the outputs directory
//! holding a resumed attempt's restored outputs); `KILN_DATA/<name>` links to the dataset's
//! directory in the runner's cache, read-only by its modes (which a job of the runner's own user,
//! or root, could change: only containers isolate). Stopping signals the whole group. This provider does not
//! enforce CPU or memory limits; the docker provider does.

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use futures::StreamExt;
use kiln_proto::v1::LogStream;
use nix::sys::signal::Signal;
use tokio::sync::watch;
use tokio_util::io::ReaderStream;

use super::{Capacity, Exit, Instance, InstanceSpec, InstanceStats, OutputStream, Outputs, Provider};
use crate::bundle::LIMITS;
use crate::error::{Error, Result};

mod group;

use group::{clock_ticks_per_second, group_usage, spawn};
pub use group::{exit_code, instance_pid, is_job_process, signal_group};

/// The file in an instance's scratch directory holding its process id.
const PID_FILE: &str = "pid";

/// The command and environment of a provisioned, not yet started instance.
type Launch = (Vec<String>, BTreeMap<String, String>);

/// Runs jobs as local processes.
pub struct ProcessProvider {
    capacity: Capacity,
    work_dir: PathBuf,
    /// Exit of each started instance, by instance id, set by its waiter task.
    exits: Mutex<HashMap<String, watch::Receiver<Option<Exit>>>>,
    /// The last CPU reading of each instance (when, clock ticks), for the rate.
    cpu_readings: Mutex<HashMap<String, (std::time::Instant, u64)>>,
    /// Command and environment of each provisioned instance, by scratch dir, until started.
    pending: Mutex<HashMap<PathBuf, Launch>>,
}

impl ProcessProvider {
    pub fn new(capacity: Capacity, work_dir: PathBuf) -> ProcessProvider {
        ProcessProvider {
            capacity,
            work_dir,
            exits: Mutex::default(),
            cpu_readings: Mutex::default(),
            pending: Mutex::default(),
        }
    }
}

fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
    Error::io(what)
}

/// Unpacks a tar.gz on the runner's host into `dir` on a blocking thread, streamed from the file.
async fn unpack_into(archive: PathBuf, dir: PathBuf) -> Result<()> {
    tokio::task::spawn_blocking(move || {
        let file = std::fs::File::open(&archive).map_err(io(format!("cannot read {}", archive.display())))?;
        crate::bundle::unpack(std::io::BufReader::new(file), &dir, LIMITS)
    })
    .await
    .map_err(|e| Error::BadBundle(e.to_string()))?
    .map(|_| ())
}

/// Sets the write bits of everything under `dir` (on again to remove read-only trees).
pub(crate) fn set_writable(dir: &Path, writable: bool) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    let metadata = std::fs::symlink_metadata(dir)?;
    if metadata.file_type().is_symlink() {
        return Ok(());
    }
    if metadata.is_dir() && writable {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755))?;
    }
    if metadata.is_dir() {
        for entry in std::fs::read_dir(dir)? {
            set_writable(&entry?.path(), writable)?;
        }
    }
    let mode = match (metadata.is_dir(), writable) {
        (true, true) => 0o755,
        (true, false) => 0o555,
        (false, true) => metadata.permissions().mode() | 0o200,
        (false, false) => metadata.permissions().mode() & !0o222,
    };
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
}

/// Removes a scratch directory, read-only datasets included.
async fn remove_scratch(dir: PathBuf) -> Result<()> {
    tokio::task::spawn_blocking(move || {
        if !dir.try_exists()? {
            return Ok(());
        }
        set_writable(&dir, true)?;
        std::fs::remove_dir_all(&dir)
    })
    .await
    .map_err(|e| Error::io("cannot remove a scratch directory")(std::io::Error::other(e)))?
    .map_err(io("cannot remove a scratch directory".into()))
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
        let dir = spec.scratch_dir.clone();
        for sub in ["code", "outputs", "data"] {
            let path = dir.join(sub);
            tokio::fs::create_dir_all(&path)
                .await
                .map_err(io(format!("cannot create {}", path.display())))?;
        }
        if let Some(code) = &spec.code {
            unpack_into(code.clone(), dir.join("code")).await?;
        }
        if let Some(restore) = &spec.restore {
            unpack_into(restore.clone(), dir.join("outputs")).await?;
        }
        // The cache's read-only directory itself, through a link in the instance's data dir.
        for (name, cached) in &spec.datasets {
            let path = dir.join("data").join(name);
            tokio::fs::symlink(cached, &path)
                .await
                .map_err(io(format!("cannot link {}", path.display())))?;
        }
        let mut env = spec.env.clone();
        env.insert("KILN_CODE".into(), dir.join("code").display().to_string());
        env.insert("KILN_OUTPUTS".into(), dir.join("outputs").display().to_string());
        if env.contains_key("KILN_RESUME_FROM") {
            // The restored outputs are in this instance's outputs directory.
            env.insert("KILN_RESUME_FROM".into(), dir.join("outputs").display().to_string());
        }
        env.insert("KILN_DATA".into(), dir.join("data").display().to_string());
        if !spec.gpu_devices.is_empty() {
            let devices: Vec<String> = spec.gpu_devices.iter().map(u32::to_string).collect();
            env.insert("CUDA_VISIBLE_DEVICES".into(), devices.join(","));
        }
        self.pending
            .lock()
            .expect("pending lock")
            .insert(dir.clone(), (spec.command.clone(), env));
        Ok(Instance {
            provider: "process",
            job_id: spec.job_id.clone(),
            attempt: spec.attempt,
            id: String::new(),
            scratch_dir: dir,
        })
    }

    async fn start(&self, instance: &mut Instance) -> Result<OutputStream> {
        let (command, env) = self
            .pending
            .lock()
            .expect("pending lock")
            .remove(&instance.scratch_dir)
            .ok_or_else(|| Error::io("start")(std::io::Error::other("the instance was not provisioned")))?;
        let (mut child, pid) = spawn(&command, &env, &instance.scratch_dir.join("code"))?;
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
                },
                Err(_) => Exit {
                    code: -1,
                    oom_killed: false,
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
                    });
                };
                while is_job_process(pid, &instance.job_id) {
                    tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                }
                Ok(Exit {
                    code: -1,
                    oom_killed: false,
                })
            }
        }
    }

    async fn outputs(&self, instance: &Instance) -> Result<Outputs> {
        Ok(Outputs::Dir(instance.scratch_dir.join("outputs")))
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
        remove_scratch(instance.scratch_dir.clone()).await
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
                remove_scratch(entry.path()).await?;
                released += 1;
            }
        }
        Ok(released)
    }
}

#[cfg(test)]
mod tests;
