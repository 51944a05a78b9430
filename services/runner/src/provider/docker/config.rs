//! How the runner reaches its Docker Engine and runs containers: `[docker]` of its config.

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// How the runner reaches its Docker Engine, and how it runs containers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct DockerConfig {
    /// `unix:///var/run/docker.sock`, or `tcp://host:2376` for a remote engine.
    pub host: String,
    /// TLS for a remote engine: all three files, or none.
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Network of job containers: `bridge` (default), `none`, or a network name. `host` is
    /// refused unless `allow-host-network`.
    pub network: String,
    pub allow_host_network: bool,
    /// User the job runs as (numeric `uid[:gid]`, gid 0 when left out); empty for the image's
    /// own. Its outputs directory and restored outputs belong to it.
    pub user: String,
    /// Longest an image pull may take, in seconds.
    pub pull_timeout_secs: u64,
    /// Most processes a job may have at once.
    pub pids_limit: i64,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            host: "unix:///var/run/docker.sock".into(),
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            network: "bridge".into(),
            allow_host_network: false,
            user: String::new(),
            pull_timeout_secs: 600,
            pids_limit: 4096,
        }
    }
}

impl DockerConfig {
    /// The (uid, gid) of `user`; `None` when jobs run as the image's user, or `user` is not
    /// numeric (refused by [`DockerConfig::validate`]).
    pub fn owner(&self) -> Option<(u64, u64)> {
        let (uid, gid) = match self.user.split_once(':') {
            Some((uid, gid)) => (uid, gid),
            None => (self.user.as_str(), "0"),
        };
        Some((uid.parse().ok()?, gid.parse().ok()?))
    }

    pub fn validate(&self, problems: &mut Vec<String>) {
        let tls = [&self.tls_ca, &self.tls_cert, &self.tls_key];
        let set = tls.iter().filter(|f| f.is_some()).count();
        if set != 0 && set != 3 {
            problems.push("docker.tls-ca, docker.tls-cert and docker.tls-key go together".into());
        }
        if !self.user.is_empty() && self.owner().is_none() {
            problems.push(format!(
                "docker.user {:?} must be a numeric uid or uid:gid (the runner gives the job's outputs to it)",
                self.user
            ));
        }
        if self.network == "host" && !self.allow_host_network {
            problems.push("docker.network = \"host\" needs docker.allow-host-network = true".into());
        }
        if !(self.host.starts_with("unix://") || self.host.starts_with("tcp://") || self.host.starts_with("http")) {
            problems.push(format!(
                "docker.host {:?} must start with unix://, tcp:// or http(s)://",
                self.host
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_user(user: &str) -> DockerConfig {
        DockerConfig {
            user: user.into(),
            ..DockerConfig::default()
        }
    }

    #[test]
    fn the_user_is_a_numeric_uid_and_gid() {
        assert_eq!(with_user("").owner(), None);
        assert_eq!(with_user("1000").owner(), Some((1000, 0)));
        assert_eq!(with_user("1000:1001").owner(), Some((1000, 1001)));
        for bad in ["nobody", "1000:staff", ":", "1000:"] {
            let mut problems = Vec::new();
            with_user(bad).validate(&mut problems);
            assert_eq!(problems.len(), 1, "{bad}: {problems:?}");
            assert!(problems[0].contains("numeric uid or uid:gid"), "{problems:?}");
        }
        let mut problems = Vec::new();
        with_user("65534:65534").validate(&mut problems);
        assert!(problems.is_empty(), "{problems:?}");
    }
}
