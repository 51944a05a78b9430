//! Gangs in a pool's plan: a job of several nodes gets machines of its own, launched together.

use kiln_cloud::CapacityType;

use super::{Machines, PoolInput, PoolPlan, Room, accepts, capacity_or_hold, cheapest_first, holding};

/// Each gang's nodes go first onto machines on their way, one node each; the rest become one
/// group of machines for that gang alone, any offering that holds a node.
pub(super) fn plan(
    input: &PoolInput<'_>,
    gangs: &[usize],
    coming_free: &mut [(CapacityType, Room)],
    out: &mut PoolPlan,
) -> Vec<Machines> {
    let mut order = gangs.to_vec();
    order.sort_by(|&a, &b| {
        let (ja, jb) = (input.demand[a], input.demand[b]);
        jb.priority
            .cmp(&ja.priority)
            .then(ja.submitted_at_ms.cmp(&jb.submitted_at_ms))
            .then(ja.job_id.cmp(&jb.job_id))
    });
    let mut launch = Vec::new();
    for index in order {
        let job = input.demand[index];
        let asked = Room::of_job(&job.resources);
        let Some(capacity) = capacity_or_hold(input, job, asked, out) else {
            continue;
        };
        let mut needed = job.nodes;
        for slot in coming_free.iter_mut() {
            if needed > 0 && accepts(job, slot.0) && asked.fits_in(slot.1) {
                slot.1 = slot.1.minus(asked);
                needed -= 1;
            }
        }
        if needed == 0 {
            out.covered.push(job.job_id.clone());
            continue;
        }
        launch.push(Machines {
            capacity,
            count: needed,
            candidates: cheapest_first(input, &holding(input, capacity, asked)),
            jobs: vec![job.job_id.clone()],
            gang: true,
            disk_bytes: super::whole_gib(asked.disk_bytes),
        });
    }
    launch
}
