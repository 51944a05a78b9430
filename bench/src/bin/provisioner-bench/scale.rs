//! Scale 0 → N instances and back, through the real provisioner cycle, on simulated time: the
//! demand is launched for, the machines boot while the same demand is read again every cycle,
//! runners register busy, go idle, and the pool is cordoned and terminated back to zero. The
//! reaper runs on its own interval all along, as the service runs it.

use std::collections::HashSet;
use std::time::Duration;

use anyhow::{Result, ensure};
use kiln_cloud::OfferingKey;
use kiln_cloud::sim::{SimCalls, SimCatalogue};
use kiln_core::provisioning::{Demand, DemandJob};
use kiln_provisioner::cycle::Cycle;
use kiln_provisioner::release::Seen;

use crate::cost;
use crate::rig::{self, Cost, Rig};

/// A demand to scale for, and the simulated cloud's capacity caps.
pub struct Scenario {
    pub name: String,
    pub jobs: Vec<DemandJob>,
    /// Live instances at most per offering (the sim answers the rest with no capacity).
    pub caps: Vec<(OfferingKey, u32)>,
}

/// Cycles of one phase and what they cost together; `slowest` is the slowest cycle's.
#[derive(Debug, Clone, Copy, Default)]
pub struct Phase {
    pub cycles: usize,
    pub cost: Cost,
    pub slowest: Cost,
}

impl Phase {
    fn add(&mut self, cost: Cost) {
        self.cycles += 1;
        self.cost += cost;
        if cost.wall > self.slowest.wall {
            self.slowest = cost;
        }
    }

    pub fn per_cycle(&self) -> Cost {
        let n = self.cycles.max(1) as u32;
        Cost {
            wall: self.cost.wall / n,
            cpu: self.cost.cpu / n,
            cloud: self.cost.cloud / n,
        }
    }
}

/// Everything one scale run measured.
#[derive(Debug, Clone, Default)]
pub struct ScaleRun {
    pub name: String,
    pub jobs: usize,
    pub launched: usize,
    /// Cycles until every job had a machine on its way.
    pub up: Phase,
    pub up_calls: SimCalls,
    /// Cycles while the machines boot, the demand unchanged.
    pub booting: Phase,
    pub register: Phase,
    pub busy: Phase,
    /// From the jobs' end to zero live instances.
    pub down: Phase,
    pub down_simulated_ms: i64,
    pub down_calls: SimCalls,
    pub reaper: Phase,
    pub all_calls: SimCalls,
    pub cost_per_hour: f64,
    pub lower_bound_per_hour: f64,
    pub spot_share: f64,
}

/// The service's intervals, as simulated time steps.
pub struct Intervals {
    pub cycle_ms: i64,
    pub reap_ms: i64,
    /// How long after the launch the runners register (the sim's longest boot).
    pub boot_ms: i64,
}

/// Simulated time: the provisioner's `now_ms`, the sim's clock moved with it, and the reaper
/// rounds that fall due.
struct Clock {
    now_ms: i64,
    next_reap_ms: i64,
}

impl Clock {
    async fn step(&mut self, rig: &mut Rig, to_ms: i64, reap_ms: i64, reaper: &mut Phase) -> Result<()> {
        if to_ms > self.now_ms {
            rig.cloud
                .sim
                .advance(Duration::from_millis((to_ms - self.now_ms) as u64));
            self.now_ms = to_ms;
        }
        while self.now_ms >= self.next_reap_ms {
            reaper.add(rig.reap(self.now_ms).await?);
            self.next_reap_ms += reap_ms;
        }
        Ok(())
    }
}

fn covered(cycle: &Cycle, jobs: &[DemandJob]) -> bool {
    let Some(status) = cycle.statuses.first() else {
        return false;
    };
    let on_the_way: HashSet<&str> = status
        .launching
        .iter()
        .flat_map(|launch| launch.jobs.iter().map(String::as_str))
        .collect();
    status.held_back.is_empty() && jobs.iter().all(|job| on_the_way.contains(job.job_id.as_str()))
}

/// Runs one scenario on a fresh store and cloud.
pub async fn run(
    database_url: Option<&str>,
    scenario: Scenario,
    max_instances: u32,
    idle_timeout_secs: u64,
    intervals: &Intervals,
) -> Result<ScaleRun> {
    let pool = rig::pool(max_instances, idle_timeout_secs);
    let mut rig = Rig::new(database_url, pool, SimCatalogue::standard()).await?;
    for (key, cap) in &scenario.caps {
        rig.cloud.sim.set_capacity(key, Some(*cap));
    }
    let mut out = ScaleRun {
        name: scenario.name.clone(),
        jobs: scenario.jobs.len(),
        ..ScaleRun::default()
    };
    let start_ms = kiln_core::ids::now_ms();
    let mut clock = Clock {
        now_ms: start_ms,
        next_reap_ms: start_ms,
    };
    let none = Seen::default();
    let demand = Demand {
        at_ms: start_ms,
        jobs: scenario.jobs.clone(),
    };
    let calls_at_start = rig.cloud.calls();

    // Up: cycles (each a window apart) until every job has a machine on its way.
    loop {
        let (cycle, cost) = rig.cycle(&demand, &none, clock.now_ms).await?;
        out.up.add(cost);
        out.launched += cycle.launched;
        if covered(&cycle, &scenario.jobs) {
            break;
        }
        ensure!(
            out.up.cycles < 20,
            "{}: jobs still without a machine after 20 cycles",
            scenario.name
        );
        let next = clock.now_ms + intervals.cycle_ms;
        clock.step(&mut rig, next, intervals.reap_ms, &mut out.reaper).await?;
    }
    out.up_calls = rig::calls_between(calls_at_start, rig.cloud.calls());
    let live = rig.live().await?;
    ensure!(
        live.len() == out.launched,
        "{}: {} records for {} launched",
        scenario.name,
        live.len(),
        out.launched
    );
    out.cost_per_hour = live.iter().map(|record| record.price_per_hour).sum();
    out.spot_share = live.iter().filter(|record| record.capacity == "spot").count() as f64 / live.len().max(1) as f64;
    let offerings = cost::offerings(&rig.pool).await?;
    out.lower_bound_per_hour = cost::lower_bound(&scenario.jobs, &offerings);

    // Booting: the scheduler's demand is unchanged until runners register; cycles at the
    // service's interval must launch nothing more.
    let up_at_ms = clock.now_ms;
    loop {
        let next = clock.now_ms + intervals.cycle_ms;
        if next >= up_at_ms + intervals.boot_ms {
            break;
        }
        clock.step(&mut rig, next, intervals.reap_ms, &mut out.reaper).await?;
        let (cycle, cost) = rig.cycle(&demand, &none, clock.now_ms).await?;
        ensure!(
            cycle.calls == 0,
            "{}: launched again for jobs on their way",
            scenario.name
        );
        out.booting.add(cost);
    }

    // Every runner registers, busy: the jobs left the demand.
    let empty = Demand {
        at_ms: up_at_ms + intervals.boot_ms,
        jobs: Vec::new(),
    };
    clock
        .step(
            &mut rig,
            up_at_ms + intervals.boot_ms,
            intervals.reap_ms,
            &mut out.reaper,
        )
        .await?;
    let busy = rig.runners(true).await?;
    let (cycle, cost) = rig.cycle(&empty, &busy, clock.now_ms).await?;
    ensure!(
        cycle.released.registered == out.launched,
        "{}: {} of {} registered",
        scenario.name,
        cycle.released.registered,
        out.launched
    );
    out.register.add(cost);
    for _ in 0..3 {
        let next = clock.now_ms + intervals.cycle_ms;
        clock.step(&mut rig, next, intervals.reap_ms, &mut out.reaper).await?;
        let (_, cost) = rig.cycle(&empty, &busy, clock.now_ms).await?;
        out.busy.add(cost);
    }

    // The jobs end: idle, cordoned after the idle timeout, terminated a settle time later.
    let idle = rig.runners(false).await?;
    let end_ms = clock.now_ms + intervals.cycle_ms;
    let calls_at_end = rig.cloud.calls();
    let most = (idle_timeout_secs as i64 * 1000 / intervals.cycle_ms.max(1)) as usize + 20;
    loop {
        let next = clock.now_ms + intervals.cycle_ms;
        clock.step(&mut rig, next, intervals.reap_ms, &mut out.reaper).await?;
        let (_, cost) = rig.cycle(&empty, &idle, clock.now_ms).await?;
        out.down.add(cost);
        if rig.live().await?.is_empty() && rig.cloud.sim.live_instances() == 0 {
            break;
        }
        ensure!(
            out.down.cycles < most,
            "{}: not back to zero after {most} cycles",
            scenario.name
        );
    }
    out.down_simulated_ms = clock.now_ms - end_ms;
    out.down_calls = rig::calls_between(calls_at_end, rig.cloud.calls());
    out.all_calls = rig::calls_between(calls_at_start, rig.cloud.calls());
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::demand;

    const INTERVALS: Intervals = Intervals {
        cycle_ms: 5_000,
        reap_ms: 30_000,
        boot_ms: 90_000,
    };

    #[tokio::test]
    async fn a_pool_scales_to_its_demand_in_one_call_and_back_to_zero() {
        let scenario = Scenario {
            name: "uniform".into(),
            jobs: demand::uniform(8),
            caps: Vec::new(),
        };
        let run = run(None, scenario, 8, 60, &INTERVALS).await.unwrap();
        assert_eq!((run.launched, run.up.cycles, run.up_calls.create), (8, 1, 1));
        assert!((run.cost_per_hour / run.lower_bound_per_hour - 1.0).abs() < 1e-9);
        // Idle from the first cycle after the jobs end, cordoned 60 s later, terminated at the
        // first cycle past the 3 s settle: 65 s at a cycle every 5 s.
        assert_eq!(run.down_simulated_ms, 65_000);
        assert_eq!(run.down_calls.terminate, 1);
    }

    #[tokio::test]
    async fn spot_running_out_goes_on_demand_in_the_same_cycle() {
        let caps = ["sim-a", "sim-b", "sim-c"]
            .iter()
            .map(|zone| {
                let key = OfferingKey {
                    instance_type: "m.2xlarge".into(),
                    zone: (*zone).into(),
                    capacity: kiln_cloud::CapacityType::Spot,
                };
                (key, 1)
            })
            .collect();
        let scenario = Scenario {
            name: "scarce".into(),
            jobs: demand::uniform(8),
            caps,
        };
        let run = run(None, scenario, 8, 60, &INTERVALS).await.unwrap();
        assert_eq!((run.launched, run.up.cycles, run.up_calls.create), (8, 1, 2));
        assert!((run.spot_share - 3.0 / 8.0).abs() < 1e-9);
    }
}
