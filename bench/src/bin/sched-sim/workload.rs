//! The simulated cloud and the workload: instance types, pools, and bursts of jobs.

use kiln_scheduler::policy::{Market, MarketPolicy, PendingJob, Pool, PreemptionRate, Resources, RunningJob};
use rand::Rng;
use rand::rngs::StdRng;

use crate::Args;

const GIB: i64 = 1 << 30;
pub(crate) const HOUR_MS: f64 = 3_600_000.0;
pub(crate) const MINUTE_MS: i64 = 60_000;

/// An instance type of the `sim` provider's defaults, with its share of the instances and the
/// true spot preemption rate of its pool.
pub(crate) struct InstanceType {
    pub(crate) name: &'static str,
    pub(crate) cpus: i64,
    pub(crate) memory_gib: i64,
    pub(crate) gpus: i64,
    pub(crate) on_demand_per_hour: f64,
    pub(crate) spot_per_hour: f64,
    pub(crate) share_of_instances: f64,
    pub(crate) preemptions_per_hour: f64,
}

pub(crate) const TYPES: [InstanceType; 4] = [
    InstanceType {
        name: "c.large",
        cpus: 2,
        memory_gib: 4,
        gpus: 0,
        on_demand_per_hour: 0.085,
        spot_per_hour: 0.030,
        share_of_instances: 0.4,
        preemptions_per_hour: 0.05,
    },
    InstanceType {
        name: "c.xlarge",
        cpus: 4,
        memory_gib: 8,
        gpus: 0,
        on_demand_per_hour: 0.17,
        spot_per_hour: 0.06,
        share_of_instances: 0.3,
        preemptions_per_hour: 0.05,
    },
    InstanceType {
        name: "m.2xlarge",
        cpus: 8,
        memory_gib: 32,
        gpus: 0,
        on_demand_per_hour: 0.38,
        spot_per_hour: 0.13,
        share_of_instances: 0.2,
        preemptions_per_hour: 0.1,
    },
    InstanceType {
        name: "g.xlarge",
        cpus: 4,
        memory_gib: 16,
        gpus: 1,
        on_demand_per_hour: 0.53,
        spot_per_hour: 0.21,
        share_of_instances: 0.1,
        preemptions_per_hour: 0.4,
    },
];

/// CPU-only job shapes: (CPUs, GiB, weight).
const CPU_SHAPES: [(f64, i64, f64); 5] = [
    (1.0, 2, 0.33),
    (2.0, 4, 0.28),
    (4.0, 8, 0.17),
    (8.0, 16, 0.08),
    (2.0, 8, 0.14),
];
/// The GPU job shape: a whole g.xlarge.
const GPU_SHAPE: (f64, i64, i64) = (4.0, 16, 1);

pub(crate) fn pools(instances: usize) -> Vec<Pool> {
    TYPES
        .iter()
        .map(|kind| {
            let count = (instances as f64 * kind.share_of_instances).round() as i64;
            let instance = Resources::new(kind.cpus * 1000, kind.memory_gib * GIB, kind.gpus);
            Pool {
                name: kind.name.into(),
                capacity: Resources::new(
                    instance.cpu_millis * count,
                    instance.memory_bytes * count,
                    instance.gpus * count,
                ),
                instance,
                on_demand_per_hour: kind.on_demand_per_hour,
                spot_per_hour: kind.spot_per_hour,
                spot_available: true,
                preemptions_per_hour: PreemptionRate::DEFAULT_PRIOR_RATE_PER_HOUR,
            }
        })
        .collect()
}

pub(crate) struct JobSpec {
    pub(crate) user: usize,
    pub(crate) project: usize,
    pub(crate) priority: i32,
    pub(crate) resources: Resources,
    pub(crate) submitted_at_ms: i64,
    pub(crate) runtime_ms: i64,
    pub(crate) expected_runtime_secs: f64,
    pub(crate) market: MarketPolicy,
}

fn standard_normal(rng: &mut StdRng) -> f64 {
    let u1: f64 = rng.random::<f64>().max(f64::MIN_POSITIVE);
    let u2: f64 = rng.random();
    (-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()
}

fn pick(cumulative: &[f64], rng: &mut StdRng) -> usize {
    let target = rng.random::<f64>() * cumulative.last().copied().unwrap_or(0.0);
    cumulative.partition_point(|&c| c < target).min(cumulative.len() - 1)
}

fn cumulative(weights: impl Iterator<Item = f64>) -> Vec<f64> {
    weights
        .scan(0.0, |sum, weight| {
            *sum += weight;
            Some(*sum)
        })
        .collect()
}

/// Bursts of jobs (mean 20) from users drawn with Zipf weights `1/rank`, uniform over the
/// window; one shape (GPU with `--gpu-share`), market and priority per burst; runtimes
/// log-normal around 30 minutes, from 2 minutes to `--max-runtime-hours`.
pub(crate) fn workload(args: &Args, count: usize, rng: &mut StdRng) -> Vec<JobSpec> {
    let users = cumulative((0..args.users).map(|rank| 1.0 / (rank as f64 + 1.0)));
    let shapes = cumulative(CPU_SHAPES.iter().map(|shape| shape.2));
    let window_ms = args.submit_hours * HOUR_MS;
    let mut jobs = Vec::with_capacity(count);
    while jobs.len() < count {
        let user = pick(&users, rng);
        let burst = 1 + (-20.0 * rng.random::<f64>().max(f64::MIN_POSITIVE).ln()) as usize;
        let (cpus, memory_gib, gpus) = if rng.random_bool(args.gpu_share.clamp(0.0, 1.0)) {
            GPU_SHAPE
        } else {
            let (cpus, memory_gib, _) = CPU_SHAPES[pick(&shapes, rng)];
            (cpus, memory_gib, 0)
        };
        let roll: f64 = rng.random();
        let market = if roll < 0.85 {
            MarketPolicy::Auto
        } else if roll < 0.95 {
            MarketPolicy::OnDemand
        } else {
            MarketPolicy::Spot
        };
        let priority = if rng.random_bool(0.03) { 1 } else { 0 };
        let start_ms = rng.random::<f64>() * window_ms;
        let gap_ms = rng.random_range(1_000.0..30_000.0);
        for n in 0..burst.min(count - jobs.len()) {
            let runtime_ms = (30.0 * MINUTE_MS as f64 * standard_normal(rng).exp())
                .clamp(2.0 * MINUTE_MS as f64, args.max_runtime_hours * HOUR_MS) as i64;
            let estimate = runtime_ms as f64 / 1000.0 * (0.3 * standard_normal(rng)).exp();
            jobs.push(JobSpec {
                user,
                project: user % args.projects,
                priority,
                resources: Resources::new((cpus * 1000.0) as i64, memory_gib * GIB, gpus),
                submitted_at_ms: (start_ms + n as f64 * gap_ms) as i64,
                runtime_ms,
                expected_runtime_secs: estimate,
                market,
            });
        }
    }
    jobs.sort_by_key(|job| job.submitted_at_ms);
    jobs
}

pub(crate) fn pending_job(id: usize, spec: &JobSpec, preemptions: u32) -> PendingJob {
    PendingJob {
        id: format!("j{id}"),
        user: format!("u{:03}", spec.user),
        project: format!("p{:02}", spec.project),
        priority: spec.priority,
        resources: spec.resources,
        submitted_at_ms: spec.submitted_at_ms,
        market: spec.market,
        preemptions,
        expected_runtime_secs: spec.expected_runtime_secs,
        pool: String::new(),
        nodes: 1,
    }
}

pub(crate) fn running_job(pending: &PendingJob, pool: &str, market: Market, now_ms: i64) -> RunningJob {
    RunningJob {
        id: pending.id.clone(),
        user: pending.user.clone(),
        project: pending.project.clone(),
        priority: pending.priority,
        resources: pending.resources,
        pool: pool.into(),
        runner: String::new(),
        market,
        started_at_ms: now_ms,
        preemptible: pending.priority == 0,
        stopping: false,
    }
}
