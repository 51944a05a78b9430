//! Setting up and clearing away a process job's directory: its code, restored outputs and
//! dataset links, owned by the job's uid when it has one.

use std::path::{Path, PathBuf};

use super::{JobUsers, Launch, ProcessProvider, isolation};
use crate::bundle::LIMITS;
use crate::error::{Error, Result};
use crate::provider::InstanceSpec;

pub(super) fn io(what: String) -> impl FnOnce(std::io::Error) -> Error {
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
pub(super) async fn remove_scratch(dir: PathBuf) -> Result<()> {
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

/// Runs blocking filesystem and /proc work off the runtime's threads.
pub(super) async fn blocking<T: Send + 'static>(work: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(work)
        .await
        .map_err(|e| Error::io("a blocking task failed")(std::io::Error::other(e)))?
}

// === impl ProcessProvider ===

impl ProcessProvider {
    /// The directory the job of `scratch_dir` works in: its own under the work root when
    /// isolated, else the scratch directory itself.
    pub(super) fn job_dir(&self, scratch_dir: &Path) -> PathBuf {
        match &self.users {
            JobUsers::Isolated(isolated) => isolated.job_dir(scratch_dir),
            JobUsers::Trusted(_) => scratch_dir.to_path_buf(),
        }
    }

    /// Puts the job's code, restored outputs and dataset links in its directory, owned by
    /// `uid` when it has one; returns what starts it.
    pub(super) async fn prepare(&self, spec: &InstanceSpec, uid: Option<u32>) -> Result<Launch> {
        let dir = self.job_dir(&spec.scratch_dir);
        if uid.is_some() {
            // Left by an earlier try of the same attempt: nothing of it is trusted.
            remove_scratch(dir.clone()).await?;
        }
        let subs: &[&str] = if uid.is_some() {
            &["code", "outputs", "data", "tmp"]
        } else {
            &["code", "outputs", "data"]
        };
        for sub in subs {
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
        // Written by the runner when it asks the job something (a checkpoint, now).
        env.insert(
            "KILN_CONTROL_FILE".into(),
            dir.join(super::CONTROL_FILE).display().to_string(),
        );
        if !spec.gpu_devices.is_empty() {
            let devices: Vec<String> = spec.gpu_devices.iter().map(u32::to_string).collect();
            // NVML's indices are in PCI bus order; CUDA's default order is fastest first.
            env.insert("CUDA_DEVICE_ORDER".into(), "PCI_BUS_ID".into());
            env.insert("CUDA_VISIBLE_DEVICES".into(), devices.join(","));
        }
        if let Some(uid) = uid {
            env.insert("TMPDIR".into(), dir.join("tmp").display().to_string());
            let owned = dir.clone();
            blocking(move || {
                use std::os::unix::fs::PermissionsExt;
                isolation::chown_tree(&owned, uid)
                    .and_then(|()| std::fs::set_permissions(&owned, std::fs::Permissions::from_mode(0o700)))
                    .map_err(io(format!("cannot give {} to uid {uid}", owned.display())))
            })
            .await?;
        }
        Ok((spec.command.clone(), env, uid))
    }

    /// Removes the scratch directory and, when isolated, everything of the job's uid.
    pub(super) async fn release_dir(&self, scratch_dir: PathBuf) -> Result<()> {
        if let JobUsers::Isolated(isolated) = &self.users {
            let uid = isolated.recorded_uid(&scratch_dir);
            let (isolated, scratch) = (isolated.clone(), scratch_dir.clone());
            blocking(move || isolated.release(&scratch, uid)).await?;
            if let (Some(firewall), Some(uid)) = (&self.firewall, uid) {
                firewall.release(uid).await?;
            }
        }
        remove_scratch(scratch_dir).await
    }
}
