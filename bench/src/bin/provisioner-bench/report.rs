//! The printed report: kiln's figures per demand, the single-job latency, and Karpenter's
//! published figures beside kiln's, each labelled with where it comes from.

use std::time::Duration;

use kiln_cloud::sim::SimCalls;
use kiln_provisioner::plan::MAX_CANDIDATES;

use crate::Args;
use crate::latency::Latency;
use crate::rig::{Cost, total_calls};
use crate::scale::{Intervals, Phase, ScaleRun};

/// The service's loop wakes at most this often (`service.rs`: `batch-idle-ms.min(250)`).
const TICK_MS: u64 = 250;

/// The planner alone on one demand.
pub struct PlanTimes {
    pub new_machines: Duration,
    pub on_their_way: Duration,
}

pub struct Report<'a> {
    pub args: &'a Args,
    pub service: &'a kiln_provisioner::Config,
    pub intervals: &'a Intervals,
    pub mixed_machines: usize,
    pub scarce_cap: u32,
    pub runs: &'a [ScaleRun],
    pub plans: &'a [PlanTimes],
    pub latencies: &'a [Latency],
}

fn ms(d: Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    match ms {
        m if m >= 100.0 => format!("{m:.0} ms"),
        m if m >= 10.0 => format!("{m:.1} ms"),
        m => format!("{m:.2} ms"),
    }
}

fn wall_cpu(cost: Cost) -> String {
    format!("{} / {}", ms(cost.wall), ms(cost.cpu))
}

fn per_cycle(phase: &Phase) -> String {
    format!(
        "{} (slowest {}), {} cycles",
        wall_cpu(phase.per_cycle()),
        ms(phase.slowest.wall),
        phase.cycles
    )
}

fn calls(calls: SimCalls) -> String {
    let mut parts = Vec::new();
    for (name, count) in [
        ("create", calls.create),
        ("list", calls.list),
        ("terminate", calls.terminate),
        ("offerings", calls.offerings),
        ("get", calls.get),
    ] {
        if count > 0 {
            parts.push(format!("{count} {name}"));
        }
    }
    format!("{} ({})", total_calls(calls), parts.join(", "))
}

fn row(label: &str, runs: &[ScaleRun], cell: impl Fn(&ScaleRun) -> String) {
    let cells: Vec<String> = runs.iter().map(cell).collect();
    println!("| {label} | {} |", cells.join(" | "));
}

pub fn print(report: &Report<'_>) {
    let Report {
        args,
        service,
        intervals,
        runs,
        ..
    } = report;
    let n = args.instances;
    let profile = if cfg!(debug_assertions) {
        "dev (unoptimised)"
    } else {
        "release"
    };
    let store = if args.database_url.is_some() {
        "Postgres (--database-url)"
    } else {
        "SQLite in a temp dir"
    };
    println!(
        "provisioner-bench: {n} instances, seed {}, {profile} build, store {store}, sim cloud (standard catalogue: \
         c.large, c.xlarge, m.2xlarge × 3 zones × spot/on-demand = 18 offerings)",
        args.seed
    );
    println!(
        "  simulated time: a cycle every {} ms while the demand holds still, the reaper every {} ms, runners register \
         {} ms after the launch, idle timeout {} s, cordon settle 3 s",
        intervals.cycle_ms, intervals.reap_ms, intervals.boot_ms, args.idle_timeout_secs
    );
    println!();
    let names: Vec<&str> = runs.iter().map(|r| r.name.as_str()).collect();
    println!("| scale 0 → {n} → 0 (wall / CPU) | {} |", names.join(" | "));
    println!("|---|{}", "---|".repeat(runs.len()));
    row("demand", runs, |r| match r.name.as_str() {
        "uniform" => format!("{} jobs × (8 CPU, 32 GiB), auto", r.jobs),
        "mixed" => format!(
            "{} jobs, 1–8 CPU, 1–4 GiB/CPU; 60% auto, 30% spot, 10% on-demand (packs into {})",
            r.jobs, report.mixed_machines
        ),
        _ => format!("as uniform; spot m.2xlarge capped at {} a zone", report.scarce_cap),
    });
    row("machines launched (spot share)", runs, |r| {
        format!("{} ({:.0}% spot)", r.launched, 100.0 * r.spot_share)
    });
    row("cycles until every job has a machine on its way", runs, |r| {
        r.up.cycles.to_string()
    });
    row("their time in all (of which in sim calls)", runs, |r| {
        format!("{} ({})", wall_cpu(r.up.cost), ms(r.up.cost.cloud))
    });
    row("per launched instance", runs, |r| {
        let per = r.launched.max(1) as u32;
        format!("{} / {}", ms(r.up.cost.wall / per), ms(r.up.cost.cpu / per))
    });
    row("create calls (instances per call)", runs, |r| {
        format!(
            "{} ({:.0})",
            r.up_calls.create,
            r.launched as f64 / r.up_calls.create.max(1) as f64
        )
    });
    row("API calls to get there; per launched instance", runs, |r| {
        format!(
            "{}; {:.4}",
            calls(r.up_calls),
            total_calls(r.up_calls) as f64 / r.launched.max(1) as f64
        )
    });
    row("cost per hour: launched / greedy lower bound (ratio)", runs, |r| {
        format!(
            "${:.2} / ${:.2} ({:.3})",
            r.cost_per_hour,
            r.lower_bound_per_hour,
            r.cost_per_hour / r.lower_bound_per_hour
        )
    });
    row("cycle while they boot (same demand), mean", runs, |r| {
        per_cycle(&r.booting)
    });
    row("registration cycle (every runner at once)", runs, |r| {
        wall_cpu(r.register.cost)
    });
    row("cycle with every runner busy, mean", runs, |r| per_cycle(&r.busy));
    row("back to zero: simulated time after the jobs end", runs, |r| {
        format!("{:.0} s, {} cycles", r.down_simulated_ms as f64 / 1000.0, r.down.cycles)
    });
    row("back to zero: those cycles in all (slowest)", runs, |r| {
        format!("{} ({})", wall_cpu(r.down.cost), ms(r.down.slowest.wall))
    });
    row("back to zero: API calls", runs, |r| calls(r.down_calls));
    row("reaper rounds (list all), mean", runs, |r| per_cycle(&r.reaper));
    row("API calls, whole run; per launched instance", runs, |r| {
        format!(
            "{}; {:.4}",
            calls(r.all_calls),
            total_calls(r.all_calls) as f64 / r.launched.max(1) as f64
        )
    });
    let plans: Vec<String> = report.plans.iter().map(|p| ms(p.new_machines)).collect();
    println!(
        "| the planner alone (`plan::plan`), onto new machines, median of {} | {} |",
        args.plan_runs,
        plans.join(" | ")
    );
    let plans: Vec<String> = report.plans.iter().map(|p| ms(p.on_their_way)).collect();
    println!(
        "| the planner alone, every job on a machine on its way | {} |",
        plans.join(" | ")
    );
    println!();
    print_latency(report);
    println!();
    print_karpenter(report, service);
    println!();
    println!("cycles: `Provisioner::cycle` (reconcile, release, plan, launch, status) timed whole; wall time and the");
    println!("  process's CPU time (getrusage: the provisioner, the sim and, with SQLite, the store; not a Postgres");
    println!("  server). The sim answers in microseconds; on EC2 each create call adds its own latency (section 10).");
    println!("lower bound: Σ over jobs of min over offerings holding it, in its market (auto: either), of price ×");
    println!("  the job's dominant share of the offering (docs/provisioner.md section 7, point 5).");
    println!("back to zero: set by the idle timeout + the cordon settle, rounded up to the cycle interval; what is");
    println!("  measured is the CPU the pool's idle cycles cost on the way.");
}

fn print_latency(report: &Report<'_>) {
    let idle = report.service.batch_idle_ms;
    let tick = TICK_MS.min(idle);
    let cells = |f: &dyn Fn(&Latency) -> String| report.latencies.iter().map(f).collect::<Vec<_>>().join(" | ");
    println!(
        "| one new job (2 CPU, 4 GiB, auto) | {} |",
        cells(&|l| match (l.background, l.past) {
            (0, _) => "empty pool".into(),
            (busy, 0) => format!("beside {busy} busy instances"),
            (busy, past) => format!("beside {busy} busy instances, {past} intents launched before"),
        })
    );
    println!("|---|{}", "---|".repeat(report.latencies.len()));
    println!(
        "| cycle start → create call, p50 / max of {} | {} |",
        report.args.latency_runs,
        cells(&|l| format!("{} / {}", ms(l.to_create_p50), ms(l.to_create_max)))
    );
    println!(
        "| the whole cycle, p50 / max | {} |",
        cells(&|l| format!("{} / {}", ms(l.cycle_p50), ms(l.cycle_max)))
    );
    println!(
        "| demand change → create call, modelled: window {idle}–{} ms + the above | {} |",
        idle + tick,
        cells(&|l| {
            let low = Duration::from_millis(idle) + l.to_create_p50;
            let high = Duration::from_millis(idle + tick) + l.to_create_max;
            format!("{:.3}–{:.3} s", low.as_secs_f64(), high.as_secs_f64())
        })
    );
    println!(
        "window: not timed here. The service (`kiln_provisioner::service`) starts a cycle once the demand has held"
    );
    println!(
        "  still for batch-idle-ms ({idle} ms; at most batch-max-ms, {} ms, after its first change), checked",
        report.service.batch_max_ms
    );
    println!("  every {tick} ms; the scheduler's pass that publishes the demand comes before that and is not counted.");
}

fn print_karpenter(report: &Report<'_>, service: &kiln_provisioner::Config) {
    let uniform = report.runs.first();
    println!(
        "| | Karpenter: published figures, NOT measured here | kiln: this run, or its code's settings | comparable? |"
    );
    println!("|---|---|---|---|");
    println!(
        "| demand batching window | 1 s idle / 10 s max (`BATCH_IDLE_DURATION` / `BATCH_MAX_DURATION`) | {} ms idle / {} ms \
         max (config defaults), checked every {} ms | same design and defaults; settings, not measurements |",
        service.batch_idle_ms,
        service.batch_max_ms,
        TICK_MS.min(service.batch_idle_ms)
    );
    println!(
        "| unavailable-offering (ICE) cache | 3 min (`UnavailableOfferingsTTL`) | {} s (`UNAVAILABLE_TTL`), per (type, zone, \
         capacity type) | same |",
        kiln_cloud::UNAVAILABLE_TTL.as_secs()
    );
    println!(
        "| choices per create call | up to 60 instance types per CreateFleet (`maxInstanceTypes`), each × the zonal subnets \
         | up to {MAX_CANDIDATES} offerings (type × zone) per intent | kiln's 60 count zones: 60 types in 3 zones is 180 \
         overrides for Karpenter, 60 for kiln |"
    );
    println!(
        "| identical launches | CreateFleet call batcher, 35 ms idle / 1 s max → one call of n | one intent of count n per \
         group of identical machines: {} | different mechanism, same effect |",
        uniform.map_or_else(String::new, |r| format!(
            "{} machines in {} create call(s) here",
            r.launched, r.up_calls.create
        ))
    );
    println!(
        "| pending → node ready on real AWS | ~30–40 s | not measured: the sim's boot is configured (20–90 s); kiln's own part \
         is the window + the cycle above | not comparable here: needs a real account |"
    );
}
