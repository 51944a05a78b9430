//! Jobs' own disks (`--disk SIZE`): a file of that size on the runner's disk (allocated up front,
//! so the space is the job's), formatted ext4 and loop-mounted under `<work-dir>/disks`, whose
//! `code`, `outputs` and `tmp` directories the container gets at `/kiln/code`, `/kiln/outputs`
//! and `/tmp`. A job writing past its size gets `ENOSPC` there, and nothing else on the runner's
//! disk fills. The limit is the file system's, so it holds on any file system the runner's
//! work dir is on (ext4 here, XFS, overlay); it needs a runner running as root with `mount` and
//! `mkfs.ext4` (e2fsprogs). The image's own writable layer is not limited by it.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use tokio::process::Command;

use crate::error::{Error, Result};

/// Where the jobs' disks are: one `<job>-<attempt>.img` and its mount point `<job>-<attempt>`
/// each.
#[derive(Debug, Clone)]
pub struct Disks {
    root: PathBuf,
}

/// A disk counts as full (the job's failure is told as its disk's) with less than this free.
const FULL_BELOW_BYTES: u64 = 1 << 20;

fn failed(what: &str) -> impl FnOnce(std::io::Error) -> Error + '_ {
    move |error| Error::Disk(format!("cannot {what}: {error}"))
}

async fn run(program: &str, args: &[&str], what: &str) -> Result<()> {
    let output = Command::new(program).args(args).output().await.map_err(failed(what))?;
    if !output.status.success() {
        return Err(Error::Disk(format!(
            "cannot {what}: {program} said {}",
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(())
}

impl Disks {
    pub fn new(root: PathBuf) -> Disks {
        Disks { root }
    }

    /// The bytes this runner can give jobs' disks: the space free under its root (90% of it, a
    /// margin for the runner's own files), or 0 with the reason when it cannot make disks.
    pub fn offer(&self) -> std::result::Result<i64, String> {
        if !nix::unistd::geteuid().is_root() {
            return Err("the runner is not root, and mounting a job's disk needs root".into());
        }
        for tool in ["/sbin/mkfs.ext4", "/usr/sbin/mkfs.ext4"] {
            if Path::new(tool).try_exists().unwrap_or(false) {
                std::fs::create_dir_all(&self.root)
                    .map_err(|e| format!("cannot create {}: {e}", self.root.display()))?;
                let stats = nix::sys::statvfs::statvfs(&self.root).map_err(|e| e.to_string())?;
                let free = stats.blocks_available().saturating_mul(stats.fragment_size());
                return Ok(i64::try_from(kiln_core::capacity::disk_offered(free)).unwrap_or(i64::MAX));
            }
        }
        Err("mkfs.ext4 is missing (apt-get install e2fsprogs)".into())
    }

    fn image(&self, job_id: &str, attempt: i32) -> PathBuf {
        self.root.join(format!("{job_id}-{attempt}.img"))
    }

    /// The mount point of a job's disk.
    pub fn mount_point(&self, job_id: &str, attempt: i32) -> PathBuf {
        self.root.join(format!("{job_id}-{attempt}"))
    }

    /// Makes, formats and mounts a disk of `bytes` for an attempt, with its `code`, `outputs`
    /// (given to `owner`) and `tmp` directories; returns its mount point.
    pub async fn make(&self, job_id: &str, attempt: i32, bytes: u64, owner: Option<(u64, u64)>) -> Result<PathBuf> {
        tokio::fs::create_dir_all(&self.root)
            .await
            .map_err(failed("create the disks directory"))?;
        let image = self.image(job_id, attempt);
        let file = std::fs::File::create(&image).map_err(failed("create the disk's file"))?;
        let length = i64::try_from(bytes).map_err(|_| Error::Disk(format!("{bytes} bytes is too large")))?;
        // Allocated, not sparse: the runner's disk cannot run out under the job later.
        nix::fcntl::fallocate(&file, nix::fcntl::FallocateFlags::empty(), 0, length)
            .map_err(|e| Error::Disk(format!("cannot allocate {bytes} bytes for the job's disk: {e}")))?;
        drop(file);
        let image_path = image.display().to_string();
        run(
            "mkfs.ext4",
            &["-q", "-F", "-m", "0", &image_path],
            "format the job's disk",
        )
        .await?;
        let mount_point = self.mount_point(job_id, attempt);
        tokio::fs::create_dir_all(&mount_point)
            .await
            .map_err(failed("create the disk's mount point"))?;
        let target = mount_point.display().to_string();
        run(
            "mount",
            &["-o", "loop,nosuid,nodev", &image_path, &target],
            "mount the job's disk",
        )
        .await?;
        for (name, mode) in [("code", 0o755), ("outputs", 0o755), ("tmp", 0o1777)] {
            let dir = mount_point.join(name);
            std::fs::create_dir(&dir).map_err(failed("make the disk's directories"))?;
            std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(mode))
                .map_err(failed("set the disk's modes"))?;
            if let Some((uid, gid)) = owner.filter(|_| name != "tmp") {
                std::os::unix::fs::chown(&dir, u32::try_from(uid).ok(), u32::try_from(gid).ok())
                    .map_err(failed("give the disk to docker.user"))?;
            }
        }
        let _ = std::fs::remove_dir_all(mount_point.join("lost+found"));
        Ok(mount_point)
    }

    /// Whether an attempt's disk is (nearly) full; false when it has none.
    pub fn full(&self, job_id: &str, attempt: i32) -> bool {
        let mount_point = self.mount_point(job_id, attempt);
        if !mounted(&mount_point) {
            return false;
        }
        nix::sys::statvfs::statvfs(&mount_point)
            .is_ok_and(|stats| stats.blocks_available() * stats.fragment_size() < FULL_BELOW_BYTES)
    }

    /// Unmounts and deletes an attempt's disk, if it has one.
    pub async fn remove(&self, job_id: &str, attempt: i32) -> Result<()> {
        let mount_point = self.mount_point(job_id, attempt);
        if mounted(&mount_point) {
            run(
                "umount",
                &[&mount_point.display().to_string()],
                "unmount the job's disk",
            )
            .await?;
        }
        match tokio::fs::remove_dir(&mount_point).await {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => {
                return Err(failed("remove the disk's mount point")(error));
            }
            _ => {}
        }
        match tokio::fs::remove_file(self.image(job_id, attempt)).await {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(failed("delete the disk's file")(error)),
            _ => Ok(()),
        }
    }

    /// Removes the disks of jobs not in `keep` (left by a runner that stopped without releasing
    /// them).
    pub async fn remove_leftovers(&self, keep: &[String]) -> Result<()> {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return Ok(());
        };
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(stem) = name.strip_suffix(".img") else {
                continue;
            };
            let Some((job_id, attempt)) = stem.rsplit_once('-') else {
                continue;
            };
            let Ok(attempt) = attempt.parse() else { continue };
            if !keep.iter().any(|kept| kept == job_id) {
                self.remove(job_id, attempt).await?;
            }
        }
        Ok(())
    }
}

/// Whether a file system is mounted at `path` (its device differs from its parent's).
fn mounted(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), path.parent().map(std::fs::metadata)) {
        (Ok(here), Some(Ok(parent))) => here.dev() != parent.dev(),
        _ => false,
    }
}
