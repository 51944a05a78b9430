//! The policy's inputs: resources, jobs, pools, quotas, weights and settings.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::ops::{Add, AddAssign, Neg, Sub, SubAssign};

use serde::{Deserialize, Serialize};

const GIB: i64 = 1 << 30;
const MIB: i64 = 1 << 20;

/// CPU, memory, GPUs and disk (`--disk`): what a job asks, a pool has, or a scope holds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Resources {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub gpus: i64,
    pub disk_bytes: i64,
}

impl Resources {
    pub const ZERO: Resources = Resources::new(0, 0, 0);

    pub const fn new(cpu_millis: i64, memory_bytes: i64, gpus: i64) -> Resources {
        Resources {
            cpu_millis,
            memory_bytes,
            gpus,
            disk_bytes: 0,
        }
    }

    /// The same with `disk_bytes` of disk.
    pub const fn with_disk(self, disk_bytes: i64) -> Resources {
        Resources { disk_bytes, ..self }
    }

    /// Tells whether `self` fits in `room` on every resource.
    pub fn fits_in(&self, room: &Resources) -> bool {
        self.cpu_millis <= room.cpu_millis
            && self.memory_bytes <= room.memory_bytes
            && self.gpus <= room.gpus
            && self.disk_bytes <= room.disk_bytes
    }

    /// The smaller of the two on each resource.
    pub fn min(&self, other: &Resources) -> Resources {
        Resources::new(
            self.cpu_millis.min(other.cpu_millis),
            self.memory_bytes.min(other.memory_bytes),
            self.gpus.min(other.gpus),
        )
        .with_disk(self.disk_bytes.min(other.disk_bytes))
    }

    /// Each resource floored at zero.
    pub fn clamp_negative(&self) -> Resources {
        Resources::new(self.cpu_millis.max(0), self.memory_bytes.max(0), self.gpus.max(0))
            .with_disk(self.disk_bytes.max(0))
    }

    /// The largest fraction of `total` this is, over CPU, memory and GPUs; a resource `total` has
    /// none of is skipped, so CPU-only clusters rank by CPU and memory alone.
    pub fn dominant_share(&self, total: &Resources) -> f64 {
        let fraction = |held: i64, total: i64| if total > 0 { held as f64 / total as f64 } else { 0.0 };
        fraction(self.cpu_millis, total.cpu_millis)
            .max(fraction(self.memory_bytes, total.memory_bytes))
            .max(fraction(self.gpus, total.gpus))
            .max(fraction(self.disk_bytes, total.disk_bytes))
    }
}

impl Add for Resources {
    type Output = Resources;

    fn add(self, other: Resources) -> Resources {
        Resources::new(
            self.cpu_millis + other.cpu_millis,
            self.memory_bytes + other.memory_bytes,
            self.gpus + other.gpus,
        )
        .with_disk(self.disk_bytes + other.disk_bytes)
    }
}

impl Sub for Resources {
    type Output = Resources;

    fn sub(self, other: Resources) -> Resources {
        Resources::new(
            self.cpu_millis - other.cpu_millis,
            self.memory_bytes - other.memory_bytes,
            self.gpus - other.gpus,
        )
        .with_disk(self.disk_bytes - other.disk_bytes)
    }
}

impl Neg for Resources {
    type Output = Resources;

    fn neg(self) -> Resources {
        Resources::ZERO - self
    }
}

impl AddAssign for Resources {
    fn add_assign(&mut self, other: Resources) {
        *self = *self + other;
    }
}

impl SubAssign for Resources {
    fn sub_assign(&mut self, other: Resources) {
        *self = *self - other;
    }
}

/// Reads like `2 CPUs, 4 GiB, 1 GPU`; GPUs are left out when there are none.
impl fmt::Display for Resources {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}, {}",
            format_cpu(self.cpu_millis),
            format_memory(self.memory_bytes)
        )?;
        if self.gpus != 0 {
            write!(f, ", {}", format_gpus(self.gpus))?;
        }
        if self.disk_bytes != 0 {
            write!(f, ", {} disk", format_memory(self.disk_bytes))?;
        }
        Ok(())
    }
}

pub(crate) fn format_cpu(cpu_millis: i64) -> String {
    let unit = if cpu_millis == 1000 { "CPU" } else { "CPUs" };
    if cpu_millis % 1000 == 0 {
        format!("{} {unit}", cpu_millis / 1000)
    } else {
        format!("{} {unit}", trim_decimals(cpu_millis as f64 / 1000.0))
    }
}

pub(crate) fn format_memory(memory_bytes: i64) -> String {
    if memory_bytes.abs() >= GIB || memory_bytes == 0 {
        format!("{} GiB", trim_decimals(memory_bytes as f64 / GIB as f64))
    } else {
        format!("{} MiB", trim_decimals(memory_bytes as f64 / MIB as f64))
    }
}

pub(crate) fn format_gpus(gpus: i64) -> String {
    if gpus == 1 {
        "1 GPU".into()
    } else {
        format!("{gpus} GPUs")
    }
}

/// At most two decimals, without trailing zeros.
fn trim_decimals(value: f64) -> String {
    let text = format!("{value:.2}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

// === jobs and pools ===

pub use kiln_core::quotas::Quota;
pub use kiln_core::scheduling::{Market, MarketPolicy, QuotaScope};

/// A queued job.
#[derive(Debug, Clone, PartialEq)]
pub struct PendingJob {
    pub id: String,
    pub user: String,
    pub project: String,
    /// Higher runs first.
    pub priority: i32,
    pub resources: Resources,
    /// The first submit: a preempted job keeps it, and so keeps its place.
    pub submitted_at_ms: i64,
    pub market: MarketPolicy,
    /// How many times spot instances were taken back from this job.
    pub preemptions: u32,
    /// The user's estimate of its runtime; 0 when unknown.
    pub expected_runtime_secs: f64,
    /// The one pool it may run on; empty for any.
    pub pool: String,
    /// Nodes of a gang job: `resources` each, all placed in one pass or none. 1 for a job of
    /// one node.
    pub nodes: u32,
}

/// A job that holds resources: from SCHEDULED until its instance is released.
#[derive(Debug, Clone, PartialEq)]
pub struct RunningJob {
    pub id: String,
    pub user: String,
    pub project: String,
    pub priority: i32,
    pub resources: Resources,
    pub pool: String,
    /// The runner it was placed on; empty when unknown (then it counts on the pool's implicit
    /// runner, or on the first runner of its pool with room for it).
    pub runner: String,
    pub market: Market,
    pub started_at_ms: i64,
    /// Its priority class lets a higher priority preempt it.
    pub preemptible: bool,
    /// A stop or a preemption is under way: its resources free soon, and it is never chosen as
    /// a victim again (so a preempting job does not order more victims while the first stop).
    pub stopping: bool,
}

/// A pool: one instance type of a provider, as its runners report it.
#[derive(Debug, Clone, PartialEq)]
pub struct Pool {
    pub name: String,
    /// The total over its instances. What running jobs on it hold is taken off to get what is free.
    pub capacity: Resources,
    /// One instance: the largest job the pool can hold, and the unit its prices are for. A pool
    /// that is one machine (docker, process) has `instance == capacity`.
    pub instance: Resources,
    pub on_demand_per_hour: f64,
    pub spot_per_hour: f64,
    pub spot_available: bool,
    /// Observed spot preemptions per instance-hour, decayed over time ([`PreemptionRate`](super::PreemptionRate)).
    pub preemptions_per_hour: f64,
}

impl Pool {
    /// The price of one instance for an hour on `market`.
    pub fn price_per_hour(&self, market: Market) -> f64 {
        match market {
            Market::Spot => self.spot_per_hour,
            Market::OnDemand => self.on_demand_per_hour,
        }
    }

    /// Tells whether the pool could hold `asked` when it is empty.
    pub fn holds(&self, asked: &Resources) -> bool {
        asked.fits_in(&self.capacity) && asked.fits_in(&self.instance)
    }

    /// What `asked` costs per hour on `market`: its dominant share of an instance at the
    /// instance's price.
    pub fn cost_per_hour(&self, asked: &Resources, market: Market) -> f64 {
        self.price_per_hour(market) * asked.dominant_share(&self.instance)
    }
}

/// One runner of a pool, from its own capacity report: jobs are placed on a runner whose free
/// room holds them, never on a pool's sum.
#[derive(Debug, Clone, PartialEq)]
pub struct Runner {
    pub id: String,
    pub pool: String,
    /// What it reported in all. What jobs placed on it hold is taken off to get what is free.
    pub capacity: Resources,
    /// The largest job it can hold (a runner that makes an instance per job reports one
    /// instance); equal to `capacity` for a runner that is one machine.
    pub instance: Resources,
    /// It takes no new job (its instance is to be taken back): no free room on it, and no
    /// victims are chosen on it.
    pub cordoned: bool,
    /// The spot offering it runs on (`<instance type>/<zone>`), when it reads its instance's
    /// metadata and is on spot: its jobs' exposure and preemptions feed that offering's rate.
    pub spot_offering: Option<String>,
}

impl Runner {
    /// Tells whether the runner could hold `asked` when it is empty.
    pub fn holds(&self, asked: &Resources) -> bool {
        asked.fits_in(&self.capacity) && asked.fits_in(&self.instance)
    }
}

// === quotas ===

/// A running limit of a quota.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum QuotaResource {
    Cpu,
    Memory,
    Gpus,
    RunningJobs,
}

impl QuotaResource {
    /// An amount of this resource, as people read it.
    pub fn format(&self, amount: i64) -> String {
        match self {
            QuotaResource::Cpu => format_cpu(amount),
            QuotaResource::Memory => format_memory(amount),
            QuotaResource::Gpus => format_gpus(amount),
            QuotaResource::RunningJobs if amount == 1 => "1 job".into(),
            QuotaResource::RunningJobs => format!("{amount} jobs"),
        }
    }
}

impl fmt::Display for QuotaResource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            QuotaResource::Cpu => "CPU",
            QuotaResource::Memory => "memory",
            QuotaResource::Gpus => "GPU",
            QuotaResource::RunningJobs => "running-jobs",
        })
    }
}

// === weights and settings ===

/// Fair-share weights: a project (or a user inside a project) with weight 2 is entitled to twice
/// the dominant share of one with weight 1. Absent, zero, negative or non-finite weights count as 1.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Weights {
    pub projects: HashMap<String, f64>,
    /// Keyed by (project, user).
    pub users: HashMap<(String, String), f64>,
}

impl Weights {
    pub fn project(&self, project: &str) -> f64 {
        sane_weight(self.projects.get(project).copied())
    }

    pub fn user(&self, project: &str, user: &str) -> f64 {
        sane_weight(self.users.get(&(project.to_string(), user.to_string())).copied())
    }
}

fn sane_weight(weight_opt: Option<f64>) -> f64 {
    match weight_opt {
        Some(weight) if weight > 0.0 && weight.is_finite() => weight,
        _ => 1.0,
    }
}

/// How a pass orders the users of one priority.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Order {
    /// The project with the smallest weighted dominant share, then its user with the smallest
    /// share (with `yield_within_project`, users above a waiting project-mate go last).
    Hierarchical,
    /// The user (in a project) with the smallest held dominant share over their fair share, one
    /// order across projects. The fair shares are computed at the start of each priority's walk
    /// by water-filling what all users hold between projects (by weight), then between a
    /// project's users (by weight), none above its demand (held plus queued); the same
    /// definition as the study's. `yield_within_project` does not apply. The default.
    #[default]
    FairShareRatio,
}

/// The knobs of a pass.
#[derive(Debug, Clone, PartialEq)]
pub struct Settings {
    /// `auto` runs on-demand when a spot restart is likelier than this.
    pub max_restart_probability: f64,
    /// `auto` runs on-demand once a job has been preempted this many times (K).
    pub max_spot_preemptions: u32,
    /// Priority preemptions this pass may order at most; the caller refills it from a token
    /// bucket, which rate-limits preemption across passes.
    pub preemption_budget: usize,
    /// The priorities whose jobs may preempt strictly lower ones (opt-in per priority class).
    pub preempting_priorities: BTreeSet<i32>,
    /// Hold free capacity for the first job that cannot fit, on each pool (one per pool), so a
    /// stream of small jobs cannot starve a big one. Off only for studies.
    pub reservations: bool,
    /// Lets a job below its fair share preempt jobs of the same or lower priority whose
    /// project and user (or user, inside its own project) stay at or above its own after the
    /// swap; tried after priority preemption. Off by default.
    pub fair_share_preemption: bool,
    /// Fair-share preemptions this pass may order at most: a budget of its own, refilled by the
    /// caller from its own token bucket, so fair share never spends priority preemption's.
    pub fair_share_preemption_budget: usize,
    /// Once a user's job waits for capacity, its project-mates with a larger share are walked
    /// after every other project's jobs (they backfill what is left), so the project's share can
    /// fall to that user's turn. On by default; off only for studies and tests.
    pub yield_within_project: bool,
    /// How the users of one priority are ordered.
    pub order: Order,
}

impl Default for Settings {
    fn default() -> Self {
        Settings {
            max_restart_probability: 0.5,
            max_spot_preemptions: 3,
            preemption_budget: 0,
            preempting_priorities: BTreeSet::new(),
            reservations: true,
            fair_share_preemption: false,
            fair_share_preemption_budget: 0,
            yield_within_project: true,
            order: Order::FairShareRatio,
        }
    }
}

/// Everything a pass decides from.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Input {
    pub pending: Vec<PendingJob>,
    pub running: Vec<RunningJob>,
    pub pools: Vec<Pool>,
    /// The live runners. A pool none of them belongs to counts as one implicit runner (id
    /// empty) with the pool's capacity, as studies and tests describe pools.
    pub runners: Vec<Runner>,
    pub quotas: Vec<Quota>,
    pub weights: Weights,
    pub settings: Settings,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resources_fit_and_add_up() {
        let small = Resources::new(1000, GIB, 0);
        let big = Resources::new(4000, 8 * GIB, 1);
        assert!(small.fits_in(&big));
        assert!(!big.fits_in(&small));
        assert_eq!(big - small + small, big);
        assert_eq!((small - big).clamp_negative(), Resources::ZERO);
        assert_eq!(big.min(&Resources::new(8000, GIB, 0)), Resources::new(4000, GIB, 0));
    }

    #[test]
    fn dominant_share_skips_what_the_total_lacks() {
        let total = Resources::new(10_000, 100 * GIB, 0);
        assert_eq!(Resources::new(1000, 50 * GIB, 0).dominant_share(&total), 0.5);
        assert_eq!(Resources::new(2000, GIB, 3).dominant_share(&total), 0.2);
        assert_eq!(Resources::new(1, 1, 1).dominant_share(&Resources::ZERO), 0.0);
    }

    #[test]
    fn resources_read_plainly() {
        assert_eq!(Resources::new(1000, 2 * GIB, 0).to_string(), "1 CPU, 2 GiB");
        assert_eq!(
            Resources::new(1500, 512 * MIB, 2).to_string(),
            "1.5 CPUs, 512 MiB, 2 GPUs"
        );
        assert_eq!(QuotaResource::RunningJobs.format(3), "3 jobs");
    }

    #[test]
    fn weights_default_to_one() {
        let weights = Weights {
            projects: HashMap::from([("vision".to_string(), 2.0), ("bad".to_string(), -1.0)]),
            users: HashMap::from([(("vision".to_string(), "alice".to_string()), 3.0)]),
        };
        assert_eq!(weights.project("vision"), 2.0);
        assert_eq!(weights.project("bad"), 1.0);
        assert_eq!(weights.project("other"), 1.0);
        assert_eq!(weights.user("vision", "alice"), 3.0);
        assert_eq!(weights.user("other", "alice"), 1.0);
    }
}
