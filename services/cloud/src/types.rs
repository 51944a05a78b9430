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
