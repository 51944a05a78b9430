//! A seeded discrete-event study of the scheduling policy (issue 6), printed as one table.
//!
//! ```text
//! cargo run --release -p kiln-bench --bin sched-sim -- [--seed 1] [--jobs 10000] [--users 100] [--instances 1000]
//!     [--fair-share-preemption] [--fair-share-preemptions-per-hour 20] [--no-yield-within-project]
//!     [--order fair-share-ratio|hierarchical]
//! ```
//!
//! A simulated cloud of `--instances` instances in four pools (the `sim` provider's instance
//! types and prices) takes `--jobs` jobs from `--users` users in `--projects` projects. Users
//! submit in bursts (sweeps) over `--submit-hours`, with a Zipf-skewed share of the bursts; sizes,
//! runtimes and markets are mixed, a few bursts are of a priority that may preempt. Every pass
//! interval in which something happened, `kiln_scheduler::policy::plan` decides on the current
//! pending and running sets. Spot jobs are taken back at their pool's (seeded) rate and re-queued
//! with their submit time, resuming from their last checkpoint; the policy learns each pool's
//! rate with a `PreemptionRate`.
//!
//! Modelling: a pool is its total resources (the policy's view, as runners report it); a job
//! costs its dominant share of one instance at the instance's price; a spot job is preempted as
//! a Poisson process at its pool's rate; a priority or (with `--fair-share-preemption`) a
//! fair-share preemption stops its victims at once, each kind from a token bucket of its own. A
//! stopped job loses the work since its last checkpoint, reported in instance-hours.

mod sim;
mod workload;

use std::hint::black_box;
use std::time::{Duration, Instant};

use anyhow::{Result, ensure};
use clap::{Parser, ValueEnum};
use kiln_scheduler::policy::{self, Input, Order};
use rand::SeedableRng;
use rand::rngs::StdRng;

use crate::sim::{Place, Sim, integrated_jain};
use crate::workload::{MINUTE_MS, TYPES, pending_job, pools, running_job, workload};

/// Pending jobs in the state the pass is timed on.
const TIMED_PENDING: usize = 10_000;
/// The least backlogged time of a user counted in a time-integrated fairness index (in the
/// whole run, or in an hourly window).
const MIN_BACKLOG_MINUTES: i64 = 10;
const MIN_BACKLOG_MS: f64 = (MIN_BACKLOG_MINUTES * MINUTE_MS) as f64;

#[derive(Parser, Debug)]
#[command(about = "A seeded simulation study of kiln's scheduling policy")]
pub(crate) struct Args {
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    #[arg(long, default_value_t = 10_000)]
    pub(crate) jobs: usize,
    #[arg(long, default_value_t = 100)]
    pub(crate) users: usize,
    #[arg(long, default_value_t = 10)]
    pub(crate) projects: usize,
    #[arg(long, default_value_t = 1000)]
    pub(crate) instances: usize,
    /// Hours over which the jobs are submitted.
    #[arg(long, default_value_t = 4.0)]
    pub(crate) submit_hours: f64,
    /// Simulated seconds between passes; a pass runs only after something happened.
    #[arg(long, default_value_t = 10)]
    pub(crate) pass_interval_secs: i64,
    /// Minutes between checkpoints: a preempted job loses the work since its last one.
    #[arg(long, default_value_t = 30)]
    pub(crate) checkpoint_minutes: i64,
    /// Timed calls of one pass on a state with 10,000 pending jobs.
    #[arg(long, default_value_t = 21)]
    pub(crate) timing_runs: usize,
    /// The longest runtime of a job, in hours.
    #[arg(long, default_value_t = 8.0)]
    pub(crate) max_runtime_hours: f64,
    /// The fraction of bursts that are GPU jobs.
    #[arg(long, default_value_t = 0.1)]
    pub(crate) gpu_share: f64,
    /// Turns backfill reservations off, for comparison.
    #[arg(long)]
    pub(crate) no_reservations: bool,
    /// Lets jobs below their fair share preempt jobs of users above it (same or lower priority).
    #[arg(long)]
    pub(crate) fair_share_preemption: bool,
    /// Refill rate of the fair-share preemptions' own token bucket (5 tokens), per hour.
    #[arg(long, default_value_t = 20.0)]
    pub(crate) fair_share_preemptions_per_hour: f64,
    /// Turns off yielding inside a project (users above a waiting project-mate's share go after
    /// other projects' jobs), for comparison.
    #[arg(long)]
    pub(crate) no_yield_within_project: bool,
    /// How a priority's users are ordered (the scheduler's `order`).
    #[arg(long, value_enum, default_value_t = OrderArg::FairShareRatio)]
    pub(crate) order: OrderArg,
}

/// The policy's [`Order`], as a flag value.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum OrderArg {
    Hierarchical,
    FairShareRatio,
}

impl OrderArg {
    pub(crate) fn order(self) -> Order {
        match self {
            OrderArg::Hierarchical => Order::Hierarchical,
            OrderArg::FairShareRatio => Order::FairShareRatio,
        }
    }
}

// === the timed pass ===

/// The median time of one pass on a state with 10,000 pending jobs and the cluster full:
/// (milliseconds, running jobs, placements of the timed pass).
fn time_one_pass(args: &Args) -> (f64, usize, usize) {
    let mut rng = StdRng::seed_from_u64(args.seed.wrapping_add(2));
    let mut input = Input {
        pools: pools(args.instances),
        ..Input::default()
    };
    input.settings.preempting_priorities.insert(1);
    input.settings.preemption_budget = 5;
    input.settings.fair_share_preemption = args.fair_share_preemption;
    input.settings.fair_share_preemption_budget = 5;
    input.settings.yield_within_project = !args.no_yield_within_project;
    input.settings.order = args.order.order();
    input.weights.projects.insert("p00".into(), 2.0);
    let filler = args.instances * 4;
    input.pending = workload(args, TIMED_PENDING + filler, &mut rng)
        .iter()
        .enumerate()
        .map(|(number, spec)| pending_job(number, spec, 0))
        .collect();
    let fill = policy::plan(&input);
    let mut placed = vec![false; input.pending.len()];
    for placement in &fill.placements {
        placed[placement.job] = true;
        let job = &input.pending[placement.job];
        let running = running_job(job, &placement.pool, placement.market, 0);
        input.running.push(running);
    }
    let mut number = 0;
    input.pending.retain(|_| {
        number += 1;
        !placed[number - 1]
    });
    input.pending.truncate(TIMED_PENDING);
    let mut times: Vec<Duration> = Vec::with_capacity(args.timing_runs);
    let mut placements = 0;
    for _ in 0..args.timing_runs.max(1) {
        let started = Instant::now();
        let plan = black_box(policy::plan(black_box(&input)));
        times.push(started.elapsed());
        placements = plan.placements.len();
    }
    times.sort();
    let median = times[times.len() / 2].as_secs_f64() * 1000.0;
    (median, input.running.len(), placements)
}

// === the report ===

fn percentile(sorted: &[i64], p: f64) -> i64 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}

fn duration(ms: i64) -> String {
    let secs = ms / 1000;
    match secs {
        s if s >= 3600 => format!("{}h {:02}m", s / 3600, s % 3600 / 60),
        s if s >= 60 => format!("{}m {:02}s", s / 60, s % 60),
        s => format!("{s}s"),
    }
}

fn verdict(met: bool) -> &'static str {
    if met { "met" } else { "NOT met" }
}

fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(
        args.users > 0 && args.projects > 0 && args.jobs > 0,
        "users, projects and jobs must be positive"
    );
    ensure!(args.instances >= 10, "at least 10 instances, so every pool has one");
    let mut rng = StdRng::seed_from_u64(args.seed);
    let specs = workload(&args, args.jobs, &mut rng);
    let mut active_users = vec![false; args.users];
    specs.iter().for_each(|spec| active_users[spec.user] = true);
    let active_users = active_users.iter().filter(|active| **active).count();

    let wall = Instant::now();
    let mut sim = Sim::new(&args, specs);
    sim.run();
    let wall = wall.elapsed();
    let unfinished = sim.jobs.iter().filter(|job| job.place != Place::Done).count();
    ensure!(unfinished == 0, "{unfinished} jobs never finished");
    let (pass_ms, timed_running, timed_placements) = time_one_pass(&args);

    let stats = &mut sim.stats;
    stats.waits_ms.sort_unstable();
    let jain = stats.jain_sum / stats.jain_passes.max(1) as f64;
    let entitlement_jain = stats.entitlement_jain_sum / stats.jain_passes.max(1) as f64;
    // NaN (so "NOT met") if fewer than two users, or no window, qualify.
    let (integrated, integrated_users) = integrated_jain(&stats.backlog, MIN_BACKLOG_MS).unwrap_or((f64::NAN, 0));
    let hourly: Vec<f64> = stats
        .hourly_backlog
        .iter()
        .filter_map(|window| integrated_jain(window, MIN_BACKLOG_MS))
        .map(|(jain, _)| jain)
        .collect();
    let hourly_mean = hourly.iter().sum::<f64>() / hourly.len() as f64;
    let hourly_lowest = hourly.iter().copied().reduce(f64::min).unwrap_or(f64::NAN);
    let utilisation = stats.allocated_cpu_ms / stats.offered_cpu_ms.max(1.0);
    let saving = 1.0 - stats.cost / stats.on_demand_cost;
    let profile = if cfg!(debug_assertions) {
        "dev (unoptimised)"
    } else {
        "release"
    };

    println!(
        "sched-sim: seed {}, {} jobs from {} users ({active_users} submitted) in {} projects over {} h, {} instances, \
         {} profile",
        args.seed, args.jobs, args.users, args.projects, args.submit_hours, args.instances, profile
    );
    println!(
        "  policy: order {}, reservations {}, yield within project {}, fair-share preemption {}",
        args.order
            .to_possible_value()
            .map_or_else(String::new, |value| value.get_name().to_string()),
        if args.no_reservations { "off" } else { "on" },
        if args.order == OrderArg::FairShareRatio {
            "n/a"
        } else if args.no_yield_within_project {
            "off"
        } else {
            "on"
        },
        if args.fair_share_preemption {
            format!("on ({} per hour, own bucket)", args.fair_share_preemptions_per_hour)
        } else {
            "off".to_string()
        },
    );
    for (pool, kind) in sim.input.pools.iter().zip(&TYPES) {
        println!(
            "  pool {:<9} {:>4} × ({}) ${:.3}/h on-demand, ${:.3}/h spot, {:.2} preemptions/h (learnt {:.3})",
            pool.name,
            pool.capacity.cpu_millis / pool.instance.cpu_millis.max(1),
            pool.instance,
            pool.on_demand_per_hour,
            pool.spot_per_hour,
            kind.preemptions_per_hour,
            pool.preemptions_per_hour,
        );
    }
    println!(
        "  {} passes (every {} s with news, {:.1} ms each on average), {} spot preemptions, \
         {} priority preemptions, {} fair-share preemptions, {:.0}% of runs on spot, makespan {}, simulated in {:.1} s",
        stats.passes,
        args.pass_interval_secs,
        stats.pass_time.as_secs_f64() * 1000.0 / stats.passes.max(1) as f64,
        stats.spot_preemptions,
        stats.priority_preemptions,
        stats.fair_share_preemptions,
        100.0 * stats.spot_segments as f64 / stats.segments.max(1) as f64,
        duration(sim.clock_ms),
        wall.as_secs_f64(),
    );
    println!();
    println!("| metric | value | goal | |");
    println!("|---|---|---|---|");
    println!(
        "| Jain's fairness index against DRF shares (mean over {} passes with ≥ 2 users backlogged) | {jain:.3} | \
         ≥ 0.95 | {} |",
        stats.jain_passes,
        verdict(jain >= 0.95)
    );
    println!(
        "| Jain's index of time-integrated shares over each user's backlogged time ({integrated_users} users \
         backlogged ≥ {MIN_BACKLOG_MINUTES} min) | {integrated:.3} | ≥ 0.95 (judged on this row) | {} |",
        verdict(integrated >= 0.95)
    );
    println!(
        "| the same per hourly window (mean over {} windows with ≥ 2 such users; lowest {hourly_lowest:.3}) | \
         {hourly_mean:.3} | ≥ 0.95 (reference) | {} |",
        hourly.len(),
        verdict(hourly_mean >= 0.95)
    );
    println!("| Jain's index against demand-blind entitlements (same passes) | {entitlement_jain:.3} | | |");
    println!(
        "| utilisation while work is queued | {:.1}% | ≥ 90% | {} |",
        100.0 * utilisation,
        verdict(utilisation >= 0.90)
    );
    println!(
        "| queue wait p50 | {} | | |",
        duration(percentile(&stats.waits_ms, 0.50))
    );
    println!(
        "| queue wait p99 | {} | | |",
        duration(percentile(&stats.waits_ms, 0.99))
    );
    println!("| cost as run (spot and on-demand) | ${:.2} | | |", stats.cost);
    println!("| cost if all on-demand | ${:.2} | | |", stats.on_demand_cost);
    println!("| spot saving | {:.1}% | | |", 100.0 * saving);
    println!(
        "| work lost to preemptions: spot / priority / fair-share (instance-hours; of {:.0} run) | {:.1} / {:.1} / {:.1} | | |",
        stats.run_hours, stats.spot_lost_hours, stats.priority_lost_hours, stats.fair_share_lost_hours
    );
    println!(
        "| one pass, {TIMED_PENDING} pending, {timed_running} running, cluster full (median of {}) | {pass_ms:.1} ms | \
         ≤ 50 ms | {} |",
        args.timing_runs.max(1),
        verdict(pass_ms <= 50.0)
    );
    println!();
    println!("fairness: after each pass, each user with pending jobs gets x = dominant share / DRF share. A dominant");
    println!("  share is max(CPU, memory, GPUs held / cluster total); the DRF shares divide what all users hold now");
    println!("  weighted max-min between projects, then between a project's users, none above its demand (held +");
    println!("  queued). Jain = (Σx)² / (n·Σx²), averaged over the passes. The demand-blind row uses the project's");
    println!("  weight over the backlogged projects' weights, split evenly between its backlogged users, instead.");
    println!("  time-integrated: each user gets x = ∫ dominant share dt / ∫ DRF share dt, both over the time the");
    println!("  user has pending jobs (DRF shares as above, changing at every event and pass); Jain over the users");
    println!(
        "  with ≥ {MIN_BACKLOG_MINUTES} min of such time. Hourly: the same within each clock hour of the run, Jain per window"
    );
    println!(
        "  over its users with ≥ {MIN_BACKLOG_MINUTES} min backlogged in it, windows with fewer than 2 skipped, then the mean."
    );
    if args.fair_share_preemption {
        println!("  The goal is judged on the time-integrated row. With --fair-share-preemption a waiting user below");
        println!("  its share may preempt jobs of users above it (neither project nor user ends below it), from a");
        println!("  token bucket of its own, so passes still cannot be fair at once.");
    } else {
        println!("  The goal is judged on the time-integrated row because the scheduler never preempts for fair");
        println!("  share, so jobs started before others arrived keep their resources until they end and no pass can");
        println!("  be fair at once; what it owes a waiting user is its DRF share over the time it waits.");
    }
    println!("work lost: a preempted run loses the time since its last checkpoint (every --checkpoint-minutes),");
    println!("  counted as its dominant share of an instance of its pool times those hours.");
    println!("utilisation: allocated CPU / CPU capacity, over time, of the pools some job waits for capacity on.");
    println!("queue wait: submit to first start. cost: a job pays its dominant share of an instance at its market's");
    println!("  price while it runs, lost work included; all on-demand: its runtime at on-demand price, same pool.");
    println!("  The timed pass placed {timed_placements} jobs.");
    Ok(())
}
