//! Isolated process jobs: each runs as a uid of its own, in a directory of its own outside the
//! runner's, so it reads neither kiln's files nor another job's.
//!
//! Layout under `work-root` (the runner's, mode 0711: traversable, not listable):
//! - `<job>-<attempt>/` the job's directory (its uid's, 0700): `code/`, `outputs/`, `data/`
//!   (links to the dataset cache), `tmp/` (its `TMPDIR`);
//! - `.uids/<uid>` (0700) one file per uid held by a live job, holding the runner's scratch
//!   directory of that job. It is made with `O_EXCL`, so two runners sharing the work root
//!   never hand out one uid twice, and it outlives a crash: the uid stays taken until the
//!   runner that holds it releases the instance (after a restart, at the latest);
//! - `.runner-<hash of the work dir>/` (0711) this runner's dataset cache and staged models,
//!   whose entries (named by digest, readable) a job reaches through its links but cannot list.
//!
//! A uid is given back only once no process of it is left, its job directory is removed and
//! what it left at the top of `/tmp`, `/var/tmp` and `/dev/shm` is removed; the next one is
//! picked from a random point of the range, so a uid is seldom reused soon.

use std::io::Write;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use sha2::{Digest, Sha256};

use super::config::{Isolation, ProcessConfig, UidRange};
use crate::error::{Error, Result};

/// The file in an instance's scratch directory naming the uid it runs as.
pub(super) const UID_FILE: &str = "uid";
const CLAIMS: &str = ".uids";

/// Where and as whom isolated jobs run.
#[derive(Debug, Clone)]
pub struct Isolated {
    pub range: UidRange,
    pub work_root: PathBuf,
    /// This runner's private part of the work root (its caches).
    pub runner_root: PathBuf,
}

/// Decides how process jobs run: `Some` when they are isolated. Checks the configuration
/// against the machine (root, the uid range against its users, groups and subordinate ids) and
/// prepares the work root.
pub fn resolve(config: &ProcessConfig, work_dir: &Path) -> Result<Option<Isolated>> {
    let root = effective_uid() == Some(0);
    let isolated = match config.isolation {
        Isolation::Off => false,
        Isolation::Auto => root,
        Isolation::Uid if root => true,
        Isolation::Uid => {
            return Err(Error::Isolation(
                "process.isolation = \"uid\" needs the runner to run as root".into(),
            ));
        }
    };
    if !isolated {
        if config.trusted_owner.is_empty() {
            tracing::warn!(
                "process jobs run as the runner's own user and process.trusted-owner is empty: every process job is refused"
            );
        }
        return Ok(None);
    }
    check_range(config.uid_range)?;
    let work_root = config.work_root.clone();
    let runner_root = runner_root(&work_root, work_dir);
    make_dir(&work_root, 0o711)?;
    make_dir(&work_root.join(CLAIMS), 0o700)?;
    make_dir(&runner_root, 0o711)?;
    check_reachable(&work_root)?;
    // The runner's own files (code archives, pid and uid files) are its alone.
    make_dir(work_dir, 0o700)?;
    tracing::info!(uid_range = %config.uid_range, work_root = %work_root.display(), "process jobs run as uids of their own");
    Ok(Some(Isolated {
        range: config.uid_range,
        work_root,
        runner_root,
    }))
}

/// This runner's part of the work root, named by its work dir (what tells runners apart on one
/// machine): `<work-root>/.runner-<16 hex digits of the work dir's sha256>`.
pub fn runner_root(work_root: &Path, work_dir: &Path) -> PathBuf {
    let hash = hex::encode(Sha256::digest(absolute(work_dir).as_os_str().as_encoded_bytes()));
    work_root.join(format!(".runner-{}", &hash[..16]))
}

fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf())
}

/// The effective uid of this process, from /proc.
pub fn effective_uid() -> Option<u32> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|line| line.starts_with("Uid:"))?;
    line.split_whitespace().nth(2)?.parse().ok()
}

fn make_dir(dir: &Path, mode: u32) -> Result<()> {
    std::fs::create_dir_all(dir).map_err(Error::io(format!("cannot create {}", dir.display())))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .map_err(Error::io(format!("cannot set the mode of {}", dir.display())))
}

/// Fails unless every directory from `/` to `dir` lets any user through (`o+x`), as jobs
/// must to reach their directories and datasets.
pub fn check_reachable(dir: &Path) -> Result<()> {
    let dir = std::fs::canonicalize(dir).map_err(Error::io(format!("cannot resolve {}", dir.display())))?;
    for ancestor in dir.ancestors() {
        let mode = std::fs::metadata(ancestor)
            .map_err(Error::io(format!("cannot read {}", ancestor.display())))?
            .mode();
        if mode & 0o001 == 0 {
            return Err(Error::Isolation(format!(
                "{} is mode {:o}: jobs cannot reach {} (give it o+x, or choose another process.work-root)",
                ancestor.display(),
                mode & 0o7777,
                dir.display()
            )));
        }
    }
    Ok(())
}

/// Fails when the range holds root, or an id of a user, a group or a subordinate range of this
/// machine: a job must never be someone.
fn check_range(range: UidRange) -> Result<()> {
    if range.contains(0) {
        return Err(Error::Isolation(format!("process.uid-range {range} holds root")));
    }
    for (file, subordinate) in [
        ("/etc/passwd", false),
        ("/etc/group", false),
        ("/etc/subuid", true),
        ("/etc/subgid", true),
    ] {
        let Ok(text) = std::fs::read_to_string(file) else {
            continue;
        };
        for line in text.lines().filter(|line| !line.starts_with('#')) {
            let fields: Vec<&str> = line.split(':').collect();
            let (name, first, last) = match (subordinate, fields.as_slice()) {
                (false, [name, _, id, ..]) => match id.parse::<u32>() {
                    Ok(id) => (name, id, id),
                    Err(_) => continue,
                },
                (true, [name, first, count, ..]) => match (first.parse::<u32>(), count.parse::<u32>()) {
                    (Ok(first), Ok(count)) if count > 0 => (name, first, first.saturating_add(count - 1)),
                    _ => continue,
                },
                _ => continue,
            };
            if range.overlaps(first, last) {
                return Err(Error::Isolation(format!(
                    "process.uid-range {range} overlaps {name}'s ids {first}-{last} in {file}; choose a range no one uses"
                )));
            }
        }
    }
    Ok(())
}

impl Isolated {
    /// The directory of the job whose scratch directory is `scratch_dir`.
    pub fn job_dir(&self, scratch_dir: &Path) -> PathBuf {
        self.work_root
            .join(scratch_dir.file_name().unwrap_or(scratch_dir.as_os_str()))
    }

    fn claim_path(&self, uid: u32) -> PathBuf {
        self.work_root.join(CLAIMS).join(uid.to_string())
    }

    /// Takes a uid no live job holds for the job of `scratch_dir`, and records it there.
    /// Blocking.
    pub fn claim(&self, scratch_dir: &Path) -> Result<u32> {
        let count = self.range.len();
        let start = rand::random_range(0..count);
        for step in 0..count {
            let uid = self.range.first + u32::try_from((start + step) % count).expect("within the range");
            let path = self.claim_path(uid);
            let mut file = match std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(&path)
            {
                Ok(file) => file,
                Err(error) if error.kind() == std::io::ErrorKind::AlreadyExists => continue,
                Err(error) => return Err(Error::io(format!("cannot create {}", path.display()))(error)),
            };
            if !processes_of(uid).is_empty() {
                // Left running by someone kiln does not know: not a uid to hand out.
                tracing::warn!(uid, "a process runs as a uid of process.uid-range; skipping it");
                drop(file);
                let _ = std::fs::remove_file(&path);
                continue;
            }
            file.write_all(absolute(scratch_dir).as_os_str().as_encoded_bytes())
                .map_err(Error::io(format!("cannot write {}", path.display())))?;
            let record = scratch_dir.join(UID_FILE);
            std::fs::write(&record, uid.to_string())
                .map_err(Error::io(format!("cannot write {}", record.display())))?;
            return Ok(uid);
        }
        Err(Error::Capacity(format!(
            "every uid of process.uid-range {} is taken",
            self.range
        )))
    }

    /// The uid recorded for the job of `scratch_dir`, if it is one of the range.
    pub fn recorded_uid(&self, scratch_dir: &Path) -> Option<u32> {
        let text = std::fs::read_to_string(scratch_dir.join(UID_FILE)).ok()?;
        text.trim().parse().ok().filter(|uid| self.range.contains(*uid))
    }

    /// Ends what the job of `scratch_dir` left: every process of its uid, its directory, its
    /// files at the top of the shared temporary directories; then gives the uid back. Blocking.
    pub fn release(&self, scratch_dir: &Path, claimed: Option<u32>) -> Result<()> {
        let uid = claimed.or_else(|| self.recorded_uid(scratch_dir));
        if let Some(uid) = uid {
            kill_all(uid)?;
        }
        let job_dir = self.job_dir(scratch_dir);
        if job_dir.symlink_metadata().is_ok() {
            super::set_writable(&job_dir, true)
                .and_then(|()| std::fs::remove_dir_all(&job_dir))
                .map_err(Error::io(format!("cannot remove {}", job_dir.display())))?;
        }
        if let Some(uid) = uid {
            sweep_temp(uid);
            let claim = self.claim_path(uid);
            let holder = std::fs::read(&claim).unwrap_or_default();
            if holder == absolute(scratch_dir).as_os_str().as_encoded_bytes() {
                std::fs::remove_file(&claim).map_err(Error::io(format!("cannot remove {}", claim.display())))?;
            }
        }
        Ok(())
    }

    /// The uids held for scratch directories under `work_dir` (instances of this runner,
    /// perhaps left by an earlier run of it), with those directories. Blocking.
    pub fn claimed_under(&self, work_dir: &Path) -> Vec<(u32, PathBuf)> {
        let Ok(entries) = std::fs::read_dir(self.work_root.join(CLAIMS)) else {
            return Vec::new();
        };
        let work_dir = absolute(work_dir);
        entries
            .flatten()
            .filter_map(|entry| {
                let uid = entry.file_name().to_str()?.parse::<u32>().ok()?;
                let holder = std::fs::read(entry.path()).ok()?;
                Some((uid, PathBuf::from(String::from_utf8_lossy(&holder).into_owned())))
            })
            .filter(|(uid, holder)| self.range.contains(*uid) && holder.parent() == Some(work_dir.as_path()))
            .collect()
    }
}

/// Makes `uid` own everything under `dir` (symlinks themselves, not what they point at).
/// Blocking.
pub fn chown_tree(dir: &Path, uid: u32) -> std::io::Result<()> {
    std::os::unix::fs::lchown(dir, Some(uid), Some(uid))?;
    let metadata = std::fs::symlink_metadata(dir)?;
    if metadata.is_dir() {
        for entry in std::fs::read_dir(dir)? {
            chown_tree(&entry?.path(), uid)?;
        }
    }
    Ok(())
}

/// The live processes (zombies hold nothing) whose real, effective or saved uid is `uid`.
pub fn processes_of(uid: u32) -> Vec<i32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    let uid = uid.to_string();
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<i32>().ok())
        .filter(|pid| {
            let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
                return false;
            };
            let field = |name: &str| status.lines().find(|line| line.starts_with(name)).unwrap_or_default();
            let zombie = field("State:").contains("zombie");
            !zombie && field("Uid:").split_whitespace().skip(1).take(3).any(|id| id == uid)
        })
        .collect()
}

/// Kills every process of `uid` (those that left the job's process group too), until none is
/// left. Blocking.
pub fn kill_all(uid: u32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let left = processes_of(uid);
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(Error::Isolation(format!(
                "processes {left:?} of uid {uid} outlive SIGKILL; the uid stays taken"
            )));
        }
        for pid in left {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Removes what `uid` left at the top of the shared temporary directories, so the next job
/// given the uid finds nothing of this one. Blocking; the uid has no process left.
fn sweep_temp(uid: u32) {
    for dir in ["/tmp", "/var/tmp", "/dev/shm"] {
        let Ok(entries) = std::fs::read_dir(dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(metadata) = entry.path().symlink_metadata() else {
                continue;
            };
            if metadata.uid() != uid {
                continue;
            }
            let removed = if metadata.is_dir() {
                super::set_writable(&entry.path(), true).and_then(|()| std::fs::remove_dir_all(entry.path()))
            } else {
                std::fs::remove_file(entry.path())
            };
            if let Err(error) = removed {
                tracing::warn!(path = %entry.path().display(), error = %error, "cannot remove a job's temporary file");
            }
        }
    }
}
