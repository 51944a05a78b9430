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
    /// Network of job containers when `isolate-jobs = false`: `bridge` (the engine's default
    /// bridge, default), `none`, or a network name (a compose network, say: jobs then reach
    /// every service on it). `host` is refused unless `allow-host-network`. With
    /// `isolate-jobs = true` only `none` (no network at all) is honoured; jobs otherwise join
    /// `job-network`.
    pub network: String,
    pub allow_host_network: bool,
    /// User the job runs as (numeric `uid[:gid]`, gid 0 when left out); empty for the image's
    /// own. Its outputs directory and restored outputs belong to it.
    pub user: String,
    /// Longest an image pull may take, in seconds.
    pub pull_timeout_secs: u64,
    /// Most processes a job may have at once.
    pub pids_limit: i64,
    /// Jobs join `job-network`, a bridge the runner makes (containers on it cannot reach each
    /// other), and a firewall (iptables, `DOCKER-USER` and `INPUT`) lets them reach only
    /// kiln's job endpoints (`api-url`, `logs-url`, `job-endpoints`), never the instance
    /// metadata address, the host's other ports or `job-blocked-ranges`. The runner refuses to
    /// start when it cannot install the firewall; `false` is an explicit opt-out.
    pub isolate_jobs: bool,
    /// Who installs the jobs' firewall: `runner` (this runner, at its start, which refuses to
    /// start when it cannot), `external` (something else on the Docker host: compose's
    /// `jobs-firewall`; this runner only makes the network), or `keeper` (this process only
    /// keeps the firewall, checking it every 30 s: what `jobs-firewall` runs).
    pub firewall: FirewallMode,
    /// The iptables program: `iptables` (Debian's default, nf_tables), or `iptables-legacy` on a
    /// host whose Docker Engine uses the legacy tables.
    pub iptables: String,
    /// Name of the jobs' network and of its bridge interface (at most 15 characters).
    pub job_network: String,
    /// IPv4 subnet of `job-network` (`172.30.0.0/24`); empty: one the engine picks.
    pub job_subnet: String,
    /// More TCP endpoints jobs may reach besides `api-url` and `logs-url`: item-batch's
    /// advertised address (batch workers), as `host:port` or a URL. A loopback host means a
    /// port of the runner's host, which jobs reach at the network's gateway.
    pub job_endpoints: Vec<String>,
    /// Destinations jobs may not reach (besides the allowed endpoints): where kiln's services
    /// live. The instance metadata address is dropped whatever this says.
    pub job_blocked_ranges: Vec<String>,
    /// Bytes of disk this runner gives jobs' own disks (`--disk`), counted in placement; 0 for
    /// none. Unset: 90% of the space free under the work dir at the start, when the runner can
    /// make disks (root, `mkfs.ext4`), else none.
    pub disk_bytes: Option<i64>,
}

/// Who installs the jobs' firewall (`docker.firewall`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum FirewallMode {
    Runner,
    External,
    Keeper,
}

/// Private, shared and link-local IPv4 ranges: where a cloud's and kiln's services live.
pub const PRIVATE_RANGES: [&str; 5] = [
    "10.0.0.0/8",
    "172.16.0.0/12",
    "192.168.0.0/16",
    "100.64.0.0/10",
    "169.254.0.0/16",
];

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
            isolate_jobs: true,
            firewall: FirewallMode::Runner,
            iptables: "iptables".into(),
            job_network: "kiln-jobs".into(),
            job_subnet: String::new(),
            job_endpoints: Vec::new(),
            job_blocked_ranges: PRIVATE_RANGES.iter().map(|range| range.to_string()).collect(),
            disk_bytes: None,
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

    /// Whether jobs join the isolated `job-network` (isolation on and a network at all).
    pub fn isolated(&self) -> bool {
        self.isolate_jobs && self.network != "none"
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
        if self.isolate_jobs && !matches!(self.network.as_str(), "bridge" | "none") {
            problems.push(format!(
                "docker.network = {:?} is used only with docker.isolate-jobs = false; isolated jobs join docker.job-network",
                self.network
            ));
        }
        self.validate_isolation(problems);
        if !(self.host.starts_with("unix://") || self.host.starts_with("tcp://") || self.host.starts_with("http")) {
            problems.push(format!(
                "docker.host {:?} must start with unix://, tcp:// or http(s)://",
                self.host
            ));
        }
    }
}

impl DockerConfig {
    fn validate_isolation(&self, problems: &mut Vec<String>) {
        let name = &self.job_network;
        let name_ok = !name.is_empty()
            && name.len() <= 15
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_')
            && !matches!(name.as_str(), "bridge" | "host" | "none");
        if !name_ok {
            problems.push(format!(
                "docker.job-network {name:?} must be 1 to 15 letters, digits, - or _ (it names the bridge interface), and not bridge, host or none"
            ));
        }
        if self.firewall == FirewallMode::Keeper && !self.isolated() {
            problems.push(
                "docker.firewall = \"keeper\" needs docker.isolate-jobs = true and a network other than none".into(),
            );
        }
        if !self.job_subnet.is_empty() && super::firewall::parse_cidr(&self.job_subnet).is_none() {
            problems.push(format!(
                "docker.job-subnet {:?} must be an IPv4 subnet such as 172.30.0.0/24",
                self.job_subnet
            ));
        }
        for endpoint in &self.job_endpoints {
            if super::firewall::host_and_port(endpoint).is_none() {
                problems.push(format!(
                    "docker.job-endpoints: {endpoint:?} must be host:port or a URL with a host"
                ));
            }
        }
        for range in &self.job_blocked_ranges {
            if super::firewall::parse_cidr(range).is_none() {
                problems.push(format!(
                    "docker.job-blocked-ranges: {range:?} must be an IPv4 address or subnet"
                ));
            }
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

    #[test]
    fn isolation_settings_are_checked() {
        let problems_of = |config: DockerConfig| {
            let mut problems = Vec::new();
            config.validate(&mut problems);
            problems
        };
        assert!(problems_of(DockerConfig::default()).is_empty());
        let custom = DockerConfig {
            network: "kiln".into(),
            ..DockerConfig::default()
        };
        assert!(problems_of(custom.clone())[0].contains("isolate-jobs = false"));
        assert!(
            problems_of(DockerConfig {
                isolate_jobs: false,
                ..custom
            })
            .is_empty()
        );
        let bad = DockerConfig {
            job_network: "a-name-far-too-long".into(),
            job_subnet: "172.30.0.0/33".into(),
            job_endpoints: vec!["nope".into(), "127.0.0.1:7075".into(), "http://api:7070".into()],
            job_blocked_ranges: vec!["10.0.0.0/8".into(), "ten".into()],
            ..DockerConfig::default()
        };
        let problems = problems_of(bad);
        assert_eq!(problems.len(), 4, "{problems:?}");
    }
}
