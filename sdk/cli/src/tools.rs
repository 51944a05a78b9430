//! Finding the programs `kiln up` starts or hands on: nats-server and the static kiln-agent.
//!
//! `scripts/setup.sh` installs them under `$KILN_TOOLS/bin` (by default `~/.kiln/tools/bin`),
//! which is not under the `KILN_HOME` a user may pick later, so every place is searched, in
//! order: the flag, `$KILN_TOOLS/bin`, `$KILN_HOME/tools/bin`, `~/.kiln/tools/bin`, then `PATH`.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

/// Where tools are searched, read from the environment once (and given by tests).
#[derive(Debug, Clone, Default)]
pub struct ToolDirs {
    /// `KILN_TOOLS`: the directory setup installed into (its `bin/` holds the programs).
    pub kiln_tools: Option<PathBuf>,
    /// The `KILN_HOME` of this `kiln up`.
    pub home: PathBuf,
    /// The user's home directory (`HOME`).
    pub user_home: Option<PathBuf>,
    /// `PATH`.
    pub path: Option<OsString>,
}

impl ToolDirs {
    pub fn from_env(home: &Path) -> ToolDirs {
        ToolDirs {
            kiln_tools: std::env::var_os("KILN_TOOLS")
                .filter(|dir| !dir.is_empty())
                .map(PathBuf::from),
            home: home.to_path_buf(),
            user_home: std::env::var_os("HOME")
                .filter(|dir| !dir.is_empty())
                .map(PathBuf::from),
            path: std::env::var_os("PATH"),
        }
    }

    /// The tool directories setup may have installed into, in search order: `bin/` holds
    /// the programs, `ui/` the built web UI.
    pub fn roots(&self) -> Vec<PathBuf> {
        let mut roots = Vec::new();
        roots.extend(self.kiln_tools.clone());
        roots.push(self.home.join("tools"));
        roots.extend(self.user_home.as_ref().map(|user_home| user_home.join(".kiln/tools")));
        roots
    }

    /// The candidate paths of `program`, in search order (the flag excepted).
    fn candidates(&self, program: &str) -> Vec<PathBuf> {
        let mut candidates: Vec<PathBuf> = self.roots().iter().map(|root| root.join("bin").join(program)).collect();
        if let Some(path) = &self.path {
            candidates.extend(std::env::split_paths(path).map(|dir| dir.join(program)));
        }
        candidates.dedup();
        candidates
    }
}

/// Finds `program`: the flag's path when given (it must exist), else the first file of the
/// search order. The error names every place looked, for the user to act on.
pub fn find_tool(program: &str, flag: Option<&Path>, dirs: &ToolDirs) -> Result<PathBuf, String> {
    if let Some(path) = flag {
        return match path.try_exists() {
            Ok(true) => Ok(path.to_path_buf()),
            _ => Err(format!("{} does not exist", path.display())),
        };
    }
    let candidates = dirs.candidates(program);
    if let Some(found) = candidates.iter().find(|path| path.is_file()) {
        return Ok(found.clone());
    }
    let mut looked: Vec<String> = Vec::new();
    if let Some(tools) = &dirs.kiln_tools {
        looked.push(format!("$KILN_TOOLS/bin ({})", tools.join("bin").display()));
    }
    looked.push(format!(
        "$KILN_HOME/tools/bin ({})",
        dirs.home.join("tools/bin").display()
    ));
    if let Some(user_home) = &dirs.user_home {
        looked.push(user_home.join(".kiln/tools/bin").display().to_string());
    }
    looked.push("PATH".into());
    Err(format!("{program} not found in {}", looked.join(", ")))
}

/// The kiln-agent `kiln up`'s process workers (batches without an image) run: the one beside
/// this `kiln` when a workspace build put one there (`target/debug`), else `found`, the agent
/// found for containers. `kiln up` as root runs process jobs as uids of their own, which a home
/// of mode 0700 keeps out of `~/.kiln/tools`: then `found` is copied into `work_root`, the
/// process jobs' own root (every directory up to it open to any user), named by its content so
/// the `kiln up`s of one machine share one copy and none writes over a copy that runs.
pub fn process_agent(found: Option<&Path>, work_root: &Path, as_root: bool) -> std::io::Result<PathBuf> {
    match (kiln_item_batch::scaler::agent_beside_program(), found) {
        (Some(beside), _) => Ok(beside),
        (None, Some(found)) if as_root => shared_copy(found, work_root),
        (None, Some(found)) => Ok(found.to_path_buf()),
        // item-batch says what is missing when a process batch asks for a worker.
        (None, None) => Ok(PathBuf::new()),
    }
}

/// `program` copied to `dir/.kiln-agent-<sha256 prefix>` (mode 0755), unless already there.
fn shared_copy(program: &Path, dir: &Path) -> std::io::Result<PathBuf> {
    use sha2::{Digest, Sha256};
    use std::os::unix::fs::PermissionsExt;
    let bytes = std::fs::read(program)?;
    let digest = hex::encode(Sha256::digest(&bytes));
    let target = dir.join(format!(".kiln-agent-{}", &digest[..16]));
    if target.try_exists()? {
        return Ok(target);
    }
    if !dir.try_exists()? {
        // As the runner makes it: any user may pass, none may list.
        std::fs::create_dir_all(dir)?;
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))?;
    }
    let partial = dir.join(format!(".kiln-agent-{}.{}.partial", &digest[..16], std::process::id()));
    std::fs::write(&partial, &bytes)?;
    std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
    std::fs::rename(&partial, &target)?;
    Ok(target)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_agent_is_copied_once_by_content_where_any_uid_can_run_it() {
        use std::os::unix::fs::PermissionsExt;
        let root = tempfile::tempdir().unwrap();
        let private = root.path().join("home/.kiln/tools/bin");
        std::fs::create_dir_all(&private).unwrap();
        let agent = private.join("kiln-agent");
        std::fs::write(&agent, b"#!/bin/sh\necho agent\n").unwrap();
        let work_root = root.path().join("kiln-jobs");
        // This test's own executable has no kiln-agent beside it.
        let copy = process_agent(Some(&agent), &work_root, true).unwrap();
        assert!(copy.starts_with(&work_root), "{}", copy.display());
        assert_eq!(std::fs::read(&copy).unwrap(), std::fs::read(&agent).unwrap());
        let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode(&copy), 0o755);
        assert_eq!(mode(&work_root), 0o711);
        // Again (another kiln up): the same copy, nothing written.
        let modified = std::fs::metadata(&copy).unwrap().modified().unwrap();
        assert_eq!(process_agent(Some(&agent), &work_root, true).unwrap(), copy);
        assert_eq!(std::fs::metadata(&copy).unwrap().modified().unwrap(), modified);
        // Another agent gets its own name; as a user (jobs run as that user) no copy at all.
        std::fs::write(&agent, b"#!/bin/sh\necho newer\n").unwrap();
        assert_ne!(process_agent(Some(&agent), &work_root, true).unwrap(), copy);
        assert_eq!(process_agent(Some(&agent), &work_root, false).unwrap(), agent);
        assert_eq!(process_agent(None, &work_root, true).unwrap(), PathBuf::new());
    }

    fn touch(path: &Path) {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, "").unwrap();
    }

    #[test]
    fn tools_are_found_in_order_whatever_the_home() {
        let root = tempfile::tempdir().unwrap();
        let user_home = root.path().join("user");
        let dirs = ToolDirs {
            kiln_tools: Some(root.path().join("tools")),
            home: root.path().join("some/dir"),
            user_home: Some(user_home.clone()),
            path: Some(std::env::join_paths([root.path().join("path-bin")]).unwrap()),
        };
        let error = find_tool("nats-server", None, &dirs).unwrap_err();
        for place in ["$KILN_TOOLS/bin", "$KILN_HOME/tools/bin", ".kiln/tools/bin", "PATH"] {
            assert!(error.contains(place), "{error}");
        }
        touch(&root.path().join("path-bin/nats-server"));
        assert_eq!(
            find_tool("nats-server", None, &dirs).unwrap(),
            root.path().join("path-bin/nats-server")
        );
        // What setup installs into ~/.kiln/tools is found with another KILN_HOME.
        touch(&user_home.join(".kiln/tools/bin/nats-server"));
        assert_eq!(
            find_tool("nats-server", None, &dirs).unwrap(),
            user_home.join(".kiln/tools/bin/nats-server")
        );
        touch(&root.path().join("some/dir/tools/bin/nats-server"));
        assert_eq!(
            find_tool("nats-server", None, &dirs).unwrap(),
            root.path().join("some/dir/tools/bin/nats-server")
        );
        touch(&root.path().join("tools/bin/nats-server"));
        assert_eq!(
            find_tool("nats-server", None, &dirs).unwrap(),
            root.path().join("tools/bin/nats-server")
        );
        let flag = root.path().join("mine");
        assert!(
            find_tool("nats-server", Some(&flag), &dirs).is_err(),
            "a flag must exist"
        );
        touch(&flag);
        assert_eq!(find_tool("nats-server", Some(&flag), &dirs).unwrap(), flag);
        // Each program is looked up by its own name.
        assert!(find_tool("kiln-agent", None, &dirs).is_err());
    }
}
