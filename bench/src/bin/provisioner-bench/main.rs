//! The provisioner at scale on the simulated cloud (issue 27), printed beside Karpenter's
//! published figures.
//!
//! ```text
//! cargo run --release -p kiln-bench --bin provisioner-bench -- [--instances 1000] [--seed 1]
//!     [--database-url postgres://...] [--latency-runs 20] [--idle-timeout-secs 300]
//! ```
//!
//! Everything goes through the real `kiln_provisioner::cycle::Provisioner`, a real store (SQLite
//! in a temp dir, or the Postgres of `--database-url`, each run under a cluster id of its own)
//! and `kiln_cloud::sim::SimCloud` behind a wrapper that counts and times its calls. Time is
//! simulated: each cycle gets the `now_ms` the service would give it (a cycle every
//! `cycle-interval-ms` while nothing changes, the reaper every `reap-interval-ms`), so nothing
//! sleeps and the idle timeout passes in a few seconds of wall time.
//!
//! - Scale 0 → N and back, three demands: N jobs of a whole m.2xlarge each; the same with the
//!   spot offerings' capacity capped (no capacity on spot after N/8 a zone, so the rest goes
//!   on-demand in the same cycle); and seeded jobs of mixed sizes and markets, as many as pack
//!   into N machines. Cycles and time until every job has a machine on its way, calls, cost
//!   against the greedy lower bound, the cycles while they boot, the registration, the idle
//!   pool's way back to zero.
//! - The planner (`plan::plan`) alone on the same demands.
//! - Demand → create call for one job, on an empty pool and beside N busy instances.
//!
//! CPU is the whole process's (`getrusage(RUSAGE_SELF)`): the provisioner, the simulated cloud
//! and, with SQLite, the store; a Postgres server's CPU is not in it.

mod cost;
mod demand;
mod latency;
mod report;
mod rig;
mod scale;

use anyhow::{Result, ensure};
use clap::Parser;
use kiln_cloud::{CapacityType, OfferingKey};

use crate::scale::{Intervals, Scenario};

#[derive(Parser, Debug)]
#[command(about = "kiln's provisioner scaling 0 → N instances and back on the simulated cloud")]
pub(crate) struct Args {
    /// The machines the demand needs (the pool's max-instances).
    #[arg(long, default_value_t = 100)]
    pub(crate) instances: usize,
    /// Seeds the mixed demand.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// A Postgres URL for the store (default: SQLite in a temp dir).
    #[arg(long)]
    pub(crate) database_url: Option<String>,
    /// Single-job launches timed, on each of the two pools.
    #[arg(long, default_value_t = 20)]
    pub(crate) latency_runs: usize,
    /// Timed calls of the planner alone (the median is printed).
    #[arg(long, default_value_t = 5)]
    pub(crate) plan_runs: usize,
    /// Intents launched before, in the store, for the third latency column (a long-lived
    /// cluster's history).
    #[arg(long, default_value_t = 2_000)]
    pub(crate) history: usize,
    /// The pool's idle timeout (the pool default is 300 s).
    #[arg(long, default_value_t = 300)]
    pub(crate) idle_timeout_secs: u64,
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    ensure!(args.instances >= 8, "--instances must be at least 8");
    let service = kiln_provisioner::Config::default();
    let intervals = Intervals {
        cycle_ms: service.cycle_interval_ms as i64,
        reap_ms: service.reap_interval_ms as i64,
        boot_ms: kiln_cloud::sim::SimConfig::default().boot_max.as_millis() as i64,
    };
    let n = args.instances;
    let pool = rig::pool(n as u32, args.idle_timeout_secs);
    let offerings = cost::offerings(&pool).await?;
    let (mixed, mixed_machines) = demand::mixed_for(&pool, &offerings, n, args.seed);
    let scarce_cap = n.div_ceil(8) as u32;
    let scenarios = vec![
        Scenario {
            name: "uniform".into(),
            jobs: demand::uniform(n),
            caps: Vec::new(),
        },
        Scenario {
            name: "uniform, spot scarce".into(),
            jobs: demand::uniform(n),
            caps: ["sim-a", "sim-b", "sim-c"]
                .iter()
                .map(|zone| {
                    let key = OfferingKey {
                        instance_type: "m.2xlarge".into(),
                        zone: (*zone).into(),
                        capacity: CapacityType::Spot,
                    };
                    (key, scarce_cap)
                })
                .collect(),
        },
        Scenario {
            name: "mixed".into(),
            jobs: mixed.clone(),
            caps: Vec::new(),
        },
    ];
    let mut plans = Vec::new();
    for scenario in &scenarios {
        plans.push(report::PlanTimes {
            new_machines: demand::time_plan(&pool, &offerings, &scenario.jobs, false, args.plan_runs),
            on_their_way: demand::time_plan(&pool, &offerings, &scenario.jobs, true, args.plan_runs),
        });
    }
    let mut runs = Vec::new();
    for scenario in scenarios {
        runs.push(
            scale::run(
                args.database_url.as_deref(),
                scenario,
                n as u32,
                args.idle_timeout_secs,
                &intervals,
            )
            .await?,
        );
    }
    let url = args.database_url.as_deref();
    let latencies = vec![
        latency::measure(url, 0, 0, args.latency_runs, intervals.cycle_ms).await?,
        latency::measure(url, n, 0, args.latency_runs, intervals.cycle_ms).await?,
        latency::measure(url, n, args.history, args.latency_runs, intervals.cycle_ms).await?,
    ];
    report::print(&report::Report {
        args: &args,
        service: &service,
        intervals: &intervals,
        mixed_machines,
        scarce_cap,
        runs: &runs,
        plans: &plans,
        latencies: &latencies,
    });
    Ok(())
}
