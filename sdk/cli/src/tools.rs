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

#[cfg(test)]
mod tests {
    use super::*;

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
