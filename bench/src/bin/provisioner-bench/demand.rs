//! The demands the benchmark scales for, and the planner's decision timed on its own
//! (`kiln_provisioner::plan::plan`, the pure function at the heart of every cycle).

use std::hint::black_box;
use std::time::{Duration, Instant};

use kiln_cloud::{CapacityType, Offering, PoolSpec};
use kiln_core::provisioning::DemandJob;
use kiln_provisioner::plan::{self, Coming, PoolInput, Room};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::rig::job;

/// `n` jobs, each the size of the pool's largest machine (an m.2xlarge: 8 CPUs, 32 GiB), `auto`.
pub fn uniform(n: usize) -> Vec<DemandJob> {
    (0..n).map(|i| job(format!("u{i:05}"), 8, 32, "auto")).collect()
}

/// `count` seeded jobs of 1–8 CPUs and 1–4 GiB a CPU; 60% `auto`, 30% `spot`, 10% `on-demand`.
/// Every prefix is the same jobs, so a count can be searched for.
pub fn mixed(count: usize, seed: u64) -> Vec<DemandJob> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..count)
        .map(|i| {
            let cpus = [1, 1, 2, 2, 2, 4, 4, 6, 8][rng.random_range(0..9)];
            let memory_gib = (cpus * [1, 2, 2, 4][rng.random_range(0..4)]).min(32);
            let market = match rng.random_range(0..10) {
                0 => "on-demand",
                1..=3 => "spot",
                _ => "auto",
            };
            job(format!("m{i:05}"), cpus, memory_gib, market)
        })
        .collect()
}

fn input<'a>(
    pool: &'a PoolSpec,
    offerings: &'a [Offering],
    jobs: &'a [DemandJob],
    coming: Vec<Coming>,
) -> PoolInput<'a> {
    PoolInput {
        pool: &pool.name,
        offerings,
        unavailable_reasons: Vec::new(),
        demand: jobs.iter().collect(),
        coming,
        live_instances: 0,
        max_instances: u32::MAX,
        capacity_types: &pool.capacity_types,
        job_disk_bytes: pool.job_disk_bytes(),
    }
}

/// How many machines the planner launches for `jobs` on an empty pool.
pub fn machines_for(pool: &PoolSpec, offerings: &[Offering], jobs: &[DemandJob]) -> usize {
    let decided = plan::plan(&input(pool, offerings, jobs, Vec::new()));
    decided.launch.iter().map(|machines| machines.count as usize).sum()
}

/// The most mixed jobs (seeded) whose packing needs at most `machines` machines, and how many
/// it needs.
pub fn mixed_for(pool: &PoolSpec, offerings: &[Offering], machines: usize, seed: u64) -> (Vec<DemandJob>, usize) {
    let all = mixed(machines * 8, seed);
    let (mut low, mut high) = (1, all.len());
    while low < high {
        let middle = (low + high).div_ceil(2);
        if machines_for(pool, offerings, &all[..middle]) <= machines {
            low = middle;
        } else {
            high = middle - 1;
        }
    }
    let jobs = all[..low].to_vec();
    let needed = machines_for(pool, offerings, &jobs);
    (jobs, needed)
}

/// The median time of `runs` calls of the planner on `jobs`, onto new machines or (`on_their_way`)
/// with a machine on its way for every job, as in the cycles while they boot.
pub fn time_plan(
    pool: &PoolSpec,
    offerings: &[Offering],
    jobs: &[DemandJob],
    on_their_way: bool,
    runs: usize,
) -> Duration {
    let coming: Vec<Coming> = if on_their_way {
        let largest = offerings
            .iter()
            .filter(|o| o.key.capacity == CapacityType::Spot)
            .max_by_key(|o| (o.shape.cpu_millis, o.shape.memory_bytes))
            .map(|o| Room::of_shape(&o.shape, 0))
            .unwrap_or_default();
        jobs.iter()
            .map(|_| Coming {
                capacity: CapacityType::Spot,
                room: largest,
            })
            .collect()
    } else {
        Vec::new()
    };
    let input = input(pool, offerings, jobs, coming);
    let mut times: Vec<Duration> = (0..runs.max(1))
        .map(|_| {
            let started = Instant::now();
            black_box(plan::plan(black_box(&input)));
            started.elapsed()
        })
        .collect();
    times.sort();
    times[times.len() / 2]
}
