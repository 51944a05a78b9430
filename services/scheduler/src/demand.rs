//! The provisioner's demand from a pass (docs/provisioner.md section 5): every job that passed
//! quotas and fair share but fits no live runner's free room. Jobs waiting on a quota are not
//! demand (a job that may not run rents no machine), nor are jobs no pool can hold, nor those
//! whose room is already held by preemptions. A gang is demand for the nodes live runners
//! cannot hold now, which the provisioner launches together.

use kiln_core::provisioning::{Demand, DemandJob};
use kiln_core::scheduling::MarketPolicy;

use crate::policy::{Input, Plan, Wait};

/// The demand a plan leaves, as of `now_ms`.
pub fn of_plan(input: &Input, plan: &Plan, now_ms: i64) -> Demand {
    let jobs = plan
        .waits
        .iter()
        .filter_map(|wait| {
            let job = &input.pending[wait.job];
            let nodes = match &wait.reason {
                Wait::Provisioning { .. } => job.nodes.max(1),
                Wait::NoCapacity { .. } | Wait::Reserved { .. } => 1,
                Wait::Gang { nodes, fit, .. } => nodes.saturating_sub(*fit),
                _ => 0,
            };
            (nodes > 0).then_some((job, nodes))
        })
        .map(|(job, nodes)| {
            // `auto` runs on demand past its spot preemptions (as the pass's choose_market does).
            let chosen = match job.market {
                MarketPolicy::Auto if job.preemptions >= input.settings.max_spot_preemptions => "on-demand",
                _ => "",
            };
            DemandJob {
                job_id: job.id.clone(),
                pool: job.pool.clone(),
                resources: kiln_core::capacity::Instance {
                    cpu_millis: job.resources.cpu_millis,
                    memory_bytes: job.resources.memory_bytes,
                    gpus: job.resources.gpus,
                    disk_bytes: job.resources.disk_bytes,
                },
                nodes,
                market: job.market.as_str().into(),
                chosen_market: chosen.into(),
                priority: job.priority,
                submitted_at_ms: job.submitted_at_ms,
            }
        })
        .collect();
    Demand { at_ms: now_ms, jobs }
}

#[cfg(test)]
mod tests {
    use kiln_core::capacity::Instance;
    use kiln_core::provisioning::PoolStatus;

    use super::*;
    use crate::input::{pools, with_provisioned};
    use crate::policy::{PendingJob, Resources, Runner, plan};

    const GIB: i64 = 1 << 30;

    fn job(id: &str, cpus: i64, pool: &str) -> PendingJob {
        PendingJob {
            id: id.into(),
            user: "u".into(),
            project: "p".into(),
            priority: 0,
            resources: Resources::new(cpus * 1000, GIB, 0),
            submitted_at_ms: 0,
            market: MarketPolicy::Auto,
            preemptions: 0,
            expected_runtime_secs: 0.0,
            pool: pool.into(),
            nodes: 1,
        }
    }

    fn runner(id: &str, cpus: i64) -> Runner {
        Runner {
            id: id.into(),
            pool: "cpu".into(),
            capacity: Resources::new(cpus * 1000, 8 * GIB, 0),
            instance: Resources::new(cpus * 1000, 8 * GIB, 0),
            cordoned: false,
            spot_offering: None,
        }
    }

    fn status(pool: &str, cpus: i64) -> PoolStatus {
        PoolStatus {
            pool: pool.into(),
            largest: Instance {
                cpu_millis: cpus * 1000,
                memory_bytes: 16 * GIB,
                gpus: 0,
                disk_bytes: 0,
            },
            spot_offered: true,
            on_demand_per_hour: 0.34,
            spot_per_hour: 0.1,
            ..PoolStatus::default()
        }
    }

    fn demand_of(statuses: &[PoolStatus]) -> (Vec<String>, Vec<String>) {
        let pending = vec![
            job("two", 2, ""),
            job("three", 3, ""),
            job("huge", 16, ""),
            job("big-pool", 4, "big"),
        ];
        let (placed, demand) = demand_of_queue(pending, statuses);
        (placed, demand.into_iter().map(|j| j.job_id).collect())
    }

    fn demand_of_queue(pending: Vec<PendingJob>, statuses: &[PoolStatus]) -> (Vec<String>, Vec<DemandJob>) {
        let runners = vec![runner("r-1", 2), runner("r-2", 2)];
        let reports: std::collections::BTreeMap<_, _> = [(
            "cpu".to_string(),
            kiln_core::capacity::PoolCapacity {
                cpu_millis: 4000,
                memory_bytes: 16 * GIB,
                runners: 2,
                instance: Instance {
                    cpu_millis: 2000,
                    memory_bytes: 8 * GIB,
                    gpus: 0,
                    disk_bytes: 0,
                },
                ..Default::default()
            },
        )]
        .into();
        let mut input = Input {
            pending,
            pools: pools(&reports, &|_| 0.0),
            runners,
            ..Input::default()
        };
        with_provisioned(&mut input.pools, &mut input.runners, statuses, |_| 0.0);
        let plan = plan(&input);
        let placed = plan
            .placements
            .iter()
            .map(|p| input.pending[p.job].id.clone())
            .collect();
        let mut demand = of_plan(&input, &plan, 7).jobs;
        demand.sort_by(|a, b| a.job_id.cmp(&b.job_id));
        (placed, demand)
    }

    fn gang(id: &str, cpus: i64, pool: &str, nodes: u32) -> PendingJob {
        PendingJob {
            nodes,
            ..job(id, cpus, pool)
        }
    }

    #[test]
    fn a_gang_asks_for_the_nodes_live_runners_cannot_hold() {
        // Two runners of 2 CPUs: a gang of three 2-CPU nodes fits two of them, and asks for one
        // machine more; a gang on a pool with no runner yet asks for all of its nodes.
        let (placed, demand) = demand_of_queue(
            vec![gang("three-nodes", 2, "", 3), gang("on-big", 4, "big", 2)],
            &[status("cpu", 8), status("big", 8)],
        );
        assert!(placed.is_empty(), "{placed:?}");
        let asked: Vec<(&str, u32)> = demand.iter().map(|j| (j.job_id.as_str(), j.nodes)).collect();
        assert_eq!(asked, [("on-big", 2), ("three-nodes", 1)]);
        assert_eq!(demand[1].resources.cpu_millis, 2000, "one node's resources");
    }

    #[test]
    fn jobs_a_pools_machines_could_hold_are_demand_and_wait_for_a_real_runner() {
        let (placed, demand) = demand_of(&[status("cpu", 8), status("big", 8)]);
        assert_eq!(placed, ["two"]);
        // Larger than any runner, not than the pool's machines; and a pool with no runner yet.
        assert_eq!(demand, ["big-pool", "three"]);
    }

    #[test]
    fn a_disk_job_is_demand_of_a_pool_that_sizes_volumes_and_of_no_other() {
        let disk_job = || PendingJob {
            resources: Resources::new(1000, GIB, 0).with_disk(50 * GIB),
            ..job("disk", 1, "")
        };
        // The runners report no disk and the pool's machines none: it waits, and is no demand.
        let (placed, demand) = demand_of_queue(vec![disk_job()], &[status("cpu", 8)]);
        assert!(placed.is_empty() && demand.is_empty(), "{placed:?} {demand:?}");
        // The pool's volumes are sized for up to 500 GiB of jobs' disks: its demand, with its disk.
        let mut sized = status("cpu", 8);
        sized.largest.disk_bytes = 500 * GIB;
        let (placed, demand) = demand_of_queue(vec![disk_job()], &[sized]);
        assert!(placed.is_empty(), "no runner reports disk: {placed:?}");
        assert_eq!(demand.len(), 1, "{demand:?}");
        assert_eq!(demand[0].resources.disk_bytes, 50 * GIB);
    }

    #[test]
    fn without_the_provisioner_nothing_is_demand() {
        // The control: the same queue with no provisioned pool leaves no demand (a job larger
        // than every runner just waits for one).
        let (placed, demand) = demand_of(&[]);
        assert_eq!(placed, ["two"]);
        assert!(demand.is_empty(), "{demand:?}");
    }
}
