//! A pool as declared in config (`[[pools]]`) and how it sizes its machines' root volumes for
//! their jobs' disks: split from [`crate::types`], the values that cross the trait.

use std::collections::BTreeMap;

use kiln_core::capacity::{disk_needed, disk_offered};
use serde::{Deserialize, Serialize};

use crate::{CapacityType, Requirements, RootVolume};

/// One pool as declared in config (`[[pools]]`, docs/provisioner.md section 6).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct PoolSpec {
    pub name: String,
    /// `ec2` or `sim`.
    pub cloud: String,
    #[serde(default)]
    pub region: String,
    /// EC2: the subnets (their zones follow).
    #[serde(default)]
    pub subnets: Vec<String>,
    /// Clouds placed by zone alone (sim; GCE when built).
    #[serde(default)]
    pub zones: Vec<String>,
    #[serde(default)]
    pub instance_types: Vec<String>,
    #[serde(default)]
    pub requirements: Option<Requirements>,
    #[serde(default = "both_capacity_types")]
    pub capacity_types: Vec<CapacityType>,
    #[serde(default)]
    pub launch_template: String,
    #[serde(default)]
    pub launch_template_version: Option<String>,
    #[serde(default = "default_max_instances")]
    pub max_instances: u32,
    #[serde(default = "default_idle_timeout_secs")]
    pub idle_timeout_secs: u64,
    #[serde(default = "default_boot_timeout_secs")]
    pub boot_timeout_secs: u64,
    /// Extra tags (labels) on every instance and volume.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Negotiated on-demand prices per type, over the shipped table.
    #[serde(default)]
    pub on_demand_prices: BTreeMap<String, f64>,
    /// An existing cluster placement group (EC2) the pool's gangs launch into: each gang's
    /// machines in one call, one zone, that group. Other launches do not use it.
    #[serde(default)]
    pub placement_group: Option<String>,
    /// How kiln sizes the machines' root volumes for their jobs' disks (`--disk`).
    #[serde(default)]
    pub disk: PoolDisk,
}

/// A pool's `disk = { ... }`: the root volume kiln sizes for the jobs of each machine.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct PoolDisk {
    /// The launch template's root device.
    pub root_device: String,
    /// The root volume's size before jobs' disks are added: the system, images, work
    /// directories and the dataset cache (the launch template's own size).
    pub root_gib: u32,
    /// The most disk kiln gives the jobs of one machine, in GiB; 0 (the default) leaves the
    /// template's volume alone, and a job asking for disk is no demand of the pool.
    pub max_job_gib: u32,
}

impl Default for PoolDisk {
    fn default() -> PoolDisk {
        PoolDisk {
            root_device: "/dev/xvda".into(),
            root_gib: 100,
            max_job_gib: 0,
        }
    }
}

/// A GiB, in bytes.
const GIB: i64 = 1 << 30;
/// The largest EBS gp3 volume (16 TiB).
const MAX_VOLUME_GIB: u64 = 16_384;

fn both_capacity_types() -> Vec<CapacityType> {
    vec![CapacityType::Spot, CapacityType::OnDemand]
}

fn default_max_instances() -> u32 {
    20
}

fn default_idle_timeout_secs() -> u64 {
    300
}

fn default_boot_timeout_secs() -> u64 {
    600
}

impl PoolSpec {
    /// The most disk the jobs of one of the pool's machines may ask for, in bytes.
    pub fn job_disk_bytes(&self) -> i64 {
        i64::from(self.disk.max_job_gib) * GIB
    }

    /// The root volume for a machine whose jobs ask for `jobs_disk_bytes` together, or `None`
    /// when they ask for none (or the pool sizes no volumes).
    pub fn root_volume(&self, jobs_disk_bytes: i64) -> Option<RootVolume> {
        if jobs_disk_bytes <= 0 || self.disk.max_job_gib == 0 {
            return None;
        }
        let jobs_gib = u64::try_from(jobs_disk_bytes).unwrap_or(0).div_ceil(GIB as u64);
        Some(RootVolume {
            device: self.disk.root_device.clone(),
            size_gib: u32::try_from(self.volume_gib(jobs_gib)).unwrap_or(u32::MAX),
        })
    }

    /// A volume whose free space offers `jobs_gib` to jobs' disks: the template's own size, and
    /// the jobs' part grown as [`disk_needed`] says (the runner offers only [`disk_offered`]).
    fn volume_gib(&self, jobs_gib: u64) -> u64 {
        u64::from(self.disk.root_gib) + disk_needed(jobs_gib)
    }

    /// What a machine launched with `volume` offers jobs' disks: the inverse of
    /// [`PoolSpec::root_volume`], 0 for a machine on the template's own volume.
    pub fn job_disk_of(&self, volume: Option<&RootVolume>) -> i64 {
        volume.map_or(0, |v| {
            let jobs_gib = u64::from(v.size_gib.saturating_sub(self.disk.root_gib));
            i64::try_from(disk_offered(jobs_gib * GIB as u64)).unwrap_or(i64::MAX)
        })
    }

    /// Every problem of the declaration, each naming its field.
    pub fn validate(&self, problems: &mut Vec<String>) {
        let at = format!("pools[{}]", self.name);
        if self.disk.max_job_gib > 0 {
            if self.disk.root_device.trim().is_empty() {
                problems.push(format!("{at}.disk.root-device: name the launch template's root device"));
            }
            let largest = self.volume_gib(u64::from(self.disk.max_job_gib));
            if self.disk.root_gib == 0 || largest > MAX_VOLUME_GIB {
                problems.push(format!(
                    "{at}.disk: root-gib ({}) and max-job-gib ({}) make volumes of up to {largest} GiB; give root-gib at least 1 and keep that within {MAX_VOLUME_GIB} GiB (EBS's largest)",
                    self.disk.root_gib, self.disk.max_job_gib
                ));
            }
        }
        if self.name.is_empty() || !self.name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-') {
            problems.push(format!(
                "{at}.name: must be letters, digits and '-', got {:?}",
                self.name
            ));
        }
        match self.cloud.as_str() {
            "ec2" => {
                if self.region.is_empty() {
                    problems.push(format!("{at}.region: required for cloud ec2"));
                }
                if self.subnets.is_empty() {
                    problems.push(format!("{at}.subnets: name at least one subnet for cloud ec2"));
                }
                if self.launch_template.is_empty() {
                    problems.push(format!("{at}.launch-template: required for cloud ec2"));
                }
            }
            "sim" => {
                if self.zones.is_empty() {
                    problems.push(format!("{at}.zones: name at least one zone for cloud sim"));
                }
                // Its machines' runners (the sim fleet's) report no disk: a machine launched for
                // a `--disk` job would never take it, and the next cycle would launch again.
                if self.disk.max_job_gib > 0 {
                    problems.push(format!(
                        "{at}.disk.max-job-gib: the simulated cloud's machines give jobs no disk; leave it 0"
                    ));
                }
            }
            other => problems.push(format!("{at}.cloud: {other:?} is not a cloud kiln knows (ec2, sim)")),
        }
        if self.instance_types.is_empty() && self.requirements.is_none() {
            problems.push(format!("{at}: name instance-types or requirements"));
        }
        if self.capacity_types.is_empty() {
            problems.push(format!("{at}.capacity-types: name spot, on-demand or both"));
        }
        if self.max_instances == 0 {
            problems.push(format!("{at}.max-instances: must be at least 1"));
        }
        if self.boot_timeout_secs == 0 {
            problems.push(format!("{at}.boot-timeout-secs: must be at least 1"));
        }
        if self
            .placement_group
            .as_deref()
            .is_some_and(|group| group.trim().is_empty())
        {
            problems.push(format!("{at}.placement-group: name the group, or leave the key out"));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An EC2 pool (the sim catalogue's, moved to EC2) with `max_job_gib`.
    fn pool(max_job_gib: u32) -> PoolSpec {
        let mut pool = crate::sim::SimCatalogue::standard().cpu_pool("cpu");
        pool.cloud = "ec2".into();
        pool.region = "eu-west-1".into();
        pool.subnets = vec!["subnet-0a".into()];
        pool.disk.max_job_gib = max_job_gib;
        pool
    }

    #[test]
    fn a_root_volume_holds_the_jobs_disks_as_the_runner_offers_them() {
        assert_eq!(pool(500).root_volume(0), None, "no disk asked");
        assert_eq!(pool(0).root_volume(50 * GIB), None, "a pool that sizes no volumes");
        // 90 GiB of jobs: the runner offers 90% of its free space, so 100 GiB on the template's 100.
        let volume = pool(500).root_volume(90 * GIB).expect("sized");
        assert_eq!(volume.device, "/dev/xvda");
        assert_eq!(volume.size_gib, 200);
        assert!(pool(500).job_disk_of(Some(&volume)) >= 90 * GIB);
        // A part of a GiB rounds up, and what the volume offers still holds it.
        let odd = 90 * GIB + 1;
        let volume = pool(500).root_volume(odd).expect("sized");
        assert_eq!(volume.size_gib, 202);
        assert!(pool(500).job_disk_of(Some(&volume)) >= odd);
        assert_eq!(pool(500).job_disk_of(None), 0);
    }

    #[test]
    fn a_pool_whose_volumes_would_pass_ebs_largest_is_refused() {
        let mut problems = Vec::new();
        pool(20_000).validate(&mut problems);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("pools[cpu].disk: root-gib (100) and max-job-gib (20000)")),
            "{problems:?}"
        );
        let mut problems = Vec::new();
        pool(1_000).validate(&mut problems);
        assert!(problems.is_empty(), "{problems:?}");
        // The sim fleet's runners report no disk: a sim pool may not size volumes.
        let mut sim = pool(1_000);
        sim.cloud = "sim".into();
        let mut problems = Vec::new();
        sim.validate(&mut problems);
        assert!(
            problems
                .iter()
                .any(|p| p.contains("pools[cpu].disk.max-job-gib: the simulated cloud")),
            "{problems:?}"
        );
    }
}
