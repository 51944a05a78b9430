//! The values that cross the [`crate::Cloud`] trait.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};
use uuid::Uuid;

use crate::CloudError;

/// The tag (GCE: label) naming the kiln cluster an instance belongs to: the reaper's scope.
pub const TAG_CLUSTER: &str = "kiln-cluster";
/// The tag naming the instance's pool.
pub const TAG_POOL: &str = "kiln-pool";
/// The tag naming the launch intent that made the instance: adoption after a crash.
pub const TAG_INTENT: &str = "kiln-intent";

/// A launch intent's id: a UUIDv7, lowercase hex with hyphens (36 chars). It is the EC2
/// `ClientToken` (≤ 64 ASCII), the GCE `requestId` (a UUID) and the `kiln-intent` tag value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct IntentId(pub Uuid);

impl IntentId {
    pub fn new() -> IntentId {
        IntentId(Uuid::now_v7())
    }

    pub fn parse(text: &str) -> Option<IntentId> {
        Uuid::parse_str(text).ok().map(IntentId)
    }
}

impl Default for IntentId {
    fn default() -> IntentId {
        IntentId::new()
    }
}

impl fmt::Display for IntentId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.as_hyphenated().fmt(f)
    }
}

/// A cloud's instance id: `i-0abc…` on EC2, `zone/name` on GCE; opaque to the provisioner.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct InstanceId(pub String);

impl fmt::Display for InstanceId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum CapacityType {
    Spot,
    OnDemand,
}

impl CapacityType {
    pub fn as_str(self) -> &'static str {
        match self {
            CapacityType::Spot => "spot",
            CapacityType::OnDemand => "on-demand",
        }
    }
}

impl fmt::Display for CapacityType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// (instance type, zone, capacity type): the unit of price, availability and launch.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct OfferingKey {
    pub instance_type: String,
    pub zone: String,
    pub capacity: CapacityType,
}

impl fmt::Display for OfferingKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {} in {}", self.capacity, self.instance_type, self.zone)
    }
}

/// What one machine of an instance type holds.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Shape {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub gpus: i64,
    #[serde(default)]
    pub gpu_model: Option<String>,
    /// `x86_64` or `arm64`.
    #[serde(default)]
    pub arch: String,
}

/// Where an offering's price came from.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum PriceSource {
    /// The latest spot price the cloud answered, and when it was set.
    SpotHistory { at_ms: i64 },
    /// The shipped on-demand table and the date it was generated.
    Table { dated: String },
    /// The pool's configured price (negotiated rates, the sim's catalogue).
    Configured,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Offering {
    pub key: OfferingKey,
    pub shape: Shape,
    pub price_per_hour: f64,
    pub price_source: PriceSource,
    /// The pool's subnet in that zone (EC2); `None` on clouds placed by zone alone.
    pub subnet: Option<String>,
}

/// A launch template (EC2) or instance template (GCE) by name or id, and its version.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TemplateRef {
    pub name: String,
    /// `$Default` unless set.
    #[serde(default)]
    pub version: Option<String>,
}

/// What the provisioner asks for: `count` machines of one capacity type, any of `candidates`
/// (ordered, cheapest first), all-or-nothing below `min_count` (a gang sets min = count).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct LaunchIntent {
    pub id: IntentId,
    pub cluster: String,
    pub pool: String,
    pub capacity: CapacityType,
    pub count: u32,
    pub min_count: u32,
    pub single_zone: bool,
    /// A cluster placement group the instances go into (EC2; a compact placement policy on
    /// GCE): a gang's machines, when its pool names one. Only with `single_zone`.
    #[serde(default)]
    pub placement_group: Option<String>,
    /// At most 60, every one of `capacity`, each with its subnet where the cloud needs one.
    pub candidates: Vec<Offering>,
    pub template: TemplateRef,
    /// Always includes [`TAG_CLUSTER`], [`TAG_POOL`] and [`TAG_INTENT`] (see [`LaunchIntent::tags`]).
    pub labels: BTreeMap<String, String>,
    /// The root volume the machines boot with when their jobs asked for disk (`--disk`); `None`
    /// keeps the template's own.
    #[serde(default)]
    pub root_volume: Option<RootVolume>,
}

/// A machine's root volume sized for its jobs' disks: on EC2 the launch template's root device
/// with this size (its type, encryption and key stay the template's; deleted with the
/// instance); on GCE the boot disk's `diskSizeGb`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct RootVolume {
    /// The template's root device (`/dev/xvda` on Amazon Linux).
    pub device: String,
    pub size_gib: u32,
}

impl LaunchIntent {
    /// A placement group holds one zone: an intent that names one must be `single_zone`.
    pub fn check_placement(&self) -> Result<(), CloudError> {
        match &self.placement_group {
            Some(group) if !self.single_zone => Err(CloudError::Invalid(format!(
                "intent {} names the placement group {group} but spans zones: a cluster placement group is one zone",
                self.id
            ))),
            _ => Ok(()),
        }
    }

    /// Every tag set on the instances and volumes in the create call itself.
    pub fn tags(&self) -> BTreeMap<String, String> {
        let mut tags = self.labels.clone();
        tags.insert(TAG_CLUSTER.to_owned(), self.cluster.clone());
        tags.insert(TAG_POOL.to_owned(), self.pool.clone());
        tags.insert(TAG_INTENT.to_owned(), self.id.to_string());
        tags
    }
}

/// The answer to a create call: partial fulfilment is normal.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Launched {
    pub instances: Vec<CloudInstance>,
    pub failures: Vec<OfferingFailure>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct OfferingFailure {
    pub key: OfferingKey,
    pub reason: Unavailable,
    /// The cloud's code and message, as it said them.
    pub message: String,
}

/// Why an offering is unavailable for a while, as `kiln explain` names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", tag = "kind")]
pub enum Unavailable {
    /// `InsufficientInstanceCapacity`, `ZONE_RESOURCE_POOL_EXHAUSTED`.
    NoCapacity,
    /// A quota of the account ("on-demand vCPU (standard family)", `PREEMPTIBLE_CPUS`): not
    /// per zone, so every offering of the quota's bucket and capacity type is marked.
    Quota { name: String },
    /// `SpotMaxPriceTooLow`.
    SpotPriceTooHigh,
    /// `Unsupported`: the type is not offered there.
    NotOffered,
    /// `InsufficientFreeAddressesInSubnet`.
    SubnetFull { subnet: String },
    /// A spot notice on this offering.
    Interrupted,
}

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Unavailable::NoCapacity => f.write_str("no capacity"),
            Unavailable::Quota { name } => write!(f, "{name} quota reached"),
            Unavailable::SpotPriceTooHigh => f.write_str("spot price above the maximum"),
            Unavailable::NotOffered => f.write_str("not offered"),
            Unavailable::SubnetFull { subnet } => write!(f, "subnet {subnet} has no free address"),
            Unavailable::Interrupted => f.write_str("interrupted recently"),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum InstanceState {
    Pending,
    Running,
    Stopping,
    Terminated,
}

impl InstanceState {
    pub fn is_live(self) -> bool {
        !matches!(self, InstanceState::Terminated)
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CloudInstance {
    pub id: InstanceId,
    /// Read back from the [`TAG_INTENT`] tag.
    pub intent: Option<IntentId>,
    /// Read back from the [`TAG_POOL`] tag.
    pub pool: Option<String>,
    /// The real type, zone and capacity type.
    pub key: OfferingKey,
    pub state: InstanceState,
    pub launched_at: SystemTime,
    pub private_ip: Option<IpAddr>,
}

/// Which tagged instances [`crate::Cloud::list`] returns.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct TagSelector {
    pub cluster: String,
    pub pool: Option<String>,
    pub intent: Option<IntentId>,
    /// Only pending, running and stopping instances.
    pub live_only: bool,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NoticeAction {
    Terminate,
    Stop,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Interruption {
    Rebalance {
        instance: InstanceId,
        at: SystemTime,
    },
    Notice {
        instance: InstanceId,
        action: NoticeAction,
        at: SystemTime,
    },
    Gone {
        instance: InstanceId,
    },
}

/// Instance requirements instead of a list of types: every type of the cloud's catalogue
/// inside all ranges (inclusive) qualifies.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct Requirements {
    #[serde(default)]
    pub vcpu: Option<[u32; 2]>,
    #[serde(default)]
    pub memory_gib: Option<[f64; 2]>,
    #[serde(default)]
    pub gpus: Option<[u32; 2]>,
    #[serde(default)]
    pub gpu_model: Vec<String>,
    /// Type families (`c6i`, `g5`): the part of the type's name before the dot.
    #[serde(default)]
    pub families: Vec<String>,
}

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
    /// when they ask for none (or the pool sizes no volumes). The runner offers jobs 90% of its
    /// free space (docs/design-notes.md, "Job disks"), so the jobs' part is a ninth larger than
    /// their sum; the template's own size holds the rest.
    pub fn root_volume(&self, jobs_disk_bytes: i64) -> Option<RootVolume> {
        if jobs_disk_bytes <= 0 || self.disk.max_job_gib == 0 {
            return None;
        }
        let jobs_gib = u64::try_from(jobs_disk_bytes).unwrap_or(0).div_ceil(GIB as u64);
        let size = u64::from(self.disk.root_gib) + (jobs_gib * 10).div_ceil(9);
        Some(RootVolume {
            device: self.disk.root_device.clone(),
            size_gib: u32::try_from(size).unwrap_or(u32::MAX),
        })
    }

    /// What a machine launched with `volume` offers jobs' disks: the inverse of
    /// [`PoolSpec::root_volume`], 0 for a machine on the template's own volume.
    pub fn job_disk_of(&self, volume: Option<&RootVolume>) -> i64 {
        volume.map_or(0, |v| {
            let jobs_gib = i64::from(v.size_gib.saturating_sub(self.disk.root_gib));
            jobs_gib * GIB * 9 / 10
        })
    }

    /// Every problem of the declaration, each naming its field.
    pub fn validate(&self, problems: &mut Vec<String>) {
        let at = format!("pools[{}]", self.name);
        if self.disk.max_job_gib > 0 {
            if self.disk.root_device.trim().is_empty() {
                problems.push(format!("{at}.disk.root-device: name the launch template's root device"));
            }
            let largest = u64::from(self.disk.root_gib) + (u64::from(self.disk.max_job_gib) * 10).div_ceil(9);
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
