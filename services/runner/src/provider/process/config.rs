//! The `[process]` section of the runner's configuration: how the process provider keeps a
//! job away from kiln's files and from the other jobs.
//!
//! ```toml
//! [process]
//! isolation = "auto"                   # "uid" when the runner is root, else "off"
//! uid-range = "2000000000-2000065535"  # the uids (and gids) jobs run as, one per live job
//! work-root = "/var/lib/kiln-jobs"     # the jobs' work directories, outside KILN_HOME
//! trusted-owner = ""                   # with isolation off: the user whose jobs run
//! firewall = true                      # isolated jobs reach only kiln's job endpoints
//! ```

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

/// How process jobs are kept apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Isolation {
    /// `uid` when the runner runs as root, `off` otherwise.
    #[default]
    Auto,
    /// Each job runs as a uid of its own from `uid-range`, in a directory of its own under
    /// `work-root`; the runner must run as root (it refuses to start otherwise).
    Uid,
    /// Jobs run as the runner's own user, which can read everything kiln keeps: only the jobs
    /// of `trusted-owner` run, the others fail.
    Off,
}

/// A range of uids, both ends included, written `"FIRST-LAST"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct UidRange {
    pub first: u32,
    pub last: u32,
}

impl Default for UidRange {
    /// Clear of the usual allocations: users (1000–60000), systemd's dynamic users (61184–65519),
    /// subordinate ids (from 100000 in blocks of 65536) and systemd-nspawn's (524288–1879048191).
    fn default() -> Self {
        UidRange {
            first: 2_000_000_000,
            last: 2_000_065_535,
        }
    }
}

impl UidRange {
    pub fn contains(&self, id: u32) -> bool {
        (self.first..=self.last).contains(&id)
    }

    /// How many uids the range holds.
    pub fn len(&self) -> u64 {
        u64::from(self.last.saturating_sub(self.first)) + 1
    }

    pub fn is_empty(&self) -> bool {
        self.last < self.first
    }

    /// Tells whether `[first, last]` shares an id with this range.
    pub fn overlaps(&self, first: u32, last: u32) -> bool {
        first <= self.last && last >= self.first
    }
}

impl std::fmt::Display for UidRange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}-{}", self.first, self.last)
    }
}

impl std::str::FromStr for UidRange {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let bad = || format!("{text:?} is not a uid range FIRST-LAST (such as \"2000000000-2000065535\")");
        let (first, last) = text.trim().split_once('-').ok_or_else(bad)?;
        let first: u32 = first.trim().parse().map_err(|_| bad())?;
        let last: u32 = last.trim().parse().map_err(|_| bad())?;
        Ok(UidRange { first, last })
    }
}

impl Serialize for UidRange {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for UidRange {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// The `[process]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct ProcessConfig {
    pub isolation: Isolation,
    /// The uids jobs run as (each with the gid of the same number and no supplementary
    /// group). None may belong to a user or group of the machine, nor to a subordinate range
    /// (`/etc/subuid`, `/etc/subgid`): the runner checks at start. Runners of one machine share
    /// it through `work-root` (or take disjoint ranges).
    pub uid_range: UidRange,
    /// Where isolated jobs get their directories (mode 0711, the runner's); must be outside
    /// the runner's `work-dir` and every other directory of kiln, and reachable by any user.
    pub work_root: PathBuf,
    /// With isolation off: the id of the user whose process jobs this runner runs (`kiln up`
    /// sets its admin's); empty: none.
    pub trusted_owner: String,
    /// With isolation: each job's uid goes through a chain of this runner's in `OUTPUT`
    /// (iptables and ip6tables, `-m owner`) that lets it reach kiln's job endpoints (`api-url`,
    /// `logs-url`, `docker.job-endpoints`) and the internet, never another port of this host
    /// (NATS, databases, metrics), the instance metadata address or `docker.job-blocked-ranges`.
    /// The runner refuses to start when it cannot install it; `false` is an explicit opt-out.
    pub firewall: bool,
}

impl Default for ProcessConfig {
    fn default() -> Self {
        ProcessConfig {
            isolation: Isolation::Auto,
            uid_range: UidRange::default(),
            work_root: PathBuf::from("/var/lib/kiln-jobs"),
            trusted_owner: String::new(),
            firewall: true,
        }
    }
}

/// The lowest uid a job may get: the ids below are the system's and its users'.
const LOWEST_JOB_UID: u32 = 65_536;

impl ProcessConfig {
    pub fn validate(&self, work_dir: &Path, problems: &mut Vec<String>) {
        if self.isolation == Isolation::Off {
            return;
        }
        let range = self.uid_range;
        if range.is_empty() {
            problems.push(format!("process.uid-range {range} is empty"));
        } else if range.first < LOWEST_JOB_UID {
            problems.push(format!(
                "process.uid-range {range} starts below {LOWEST_JOB_UID}, among the system's and its users' ids"
            ));
        } else if range.last > i32::MAX as u32 {
            problems.push(format!(
                "process.uid-range {range} reaches past 2147483647, which some tools read as negative"
            ));
        }
        if !self.work_root.is_absolute() {
            problems.push(format!(
                "process.work-root {} must be an absolute path",
                self.work_root.display()
            ));
        } else if let Ok(work_dir) = std::path::absolute(work_dir)
            && (self.work_root.starts_with(&work_dir) || work_dir.starts_with(&self.work_root))
        {
            problems.push(format!(
                "process.work-root {} and work-dir {} must not hold one another: jobs must not reach the runner's files",
                self.work_root.display(),
                work_dir.display()
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uid_ranges_parse_print_and_are_checked() {
        let range: UidRange = "200000-265535".parse().unwrap();
        assert_eq!((range.first, range.last, range.len()), (200_000, 265_535, 65_536));
        assert_eq!(range.to_string(), "200000-265535");
        assert!(range.overlaps(265_535, 300_000) && !range.overlaps(0, 199_999));
        for bad in ["", "200000", "a-b", "-1-5", "1-2-3"] {
            assert!(bad.parse::<UidRange>().is_err(), "{bad:?} parsed");
        }
        let problems = |config: ProcessConfig| {
            let mut problems = Vec::new();
            config.validate(Path::new("/srv/kiln/work"), &mut problems);
            problems
        };
        assert!(problems(ProcessConfig::default()).is_empty());
        for range in ["1000-70000", "300000-200000", "2147000000-2148000000"] {
            let config = ProcessConfig {
                uid_range: range.parse().unwrap(),
                ..ProcessConfig::default()
            };
            assert_eq!(problems(config).len(), 1, "{range}");
        }
        for root in ["jobs", "/srv/kiln/work/jobs", "/srv/kiln"] {
            let config = ProcessConfig {
                work_root: root.into(),
                ..ProcessConfig::default()
            };
            assert_eq!(problems(config).len(), 1, "{root}");
        }
        let off = ProcessConfig {
            isolation: Isolation::Off,
            work_root: "jobs".into(),
            ..ProcessConfig::default()
        };
        assert!(problems(off).is_empty());
    }
}
