//! The greedy lower bound on the cost of a demand (docs/provisioner.md section 7, point 5): each
//! job pays only its dominant share of the offering that is cheapest per dominant share among
//! those that hold it, as if the rest of that machine were filled by other jobs for free.

use anyhow::Result;
use kiln_cloud::sim::{SimCatalogue, SimCloud, SimConfig};
use kiln_cloud::{CapacityType, Cloud, Offering, PoolSpec};
use kiln_core::provisioning::DemandJob;

/// The pool's offerings and prices, read from a simulated cloud of its own so the benchmark's
/// call counts stay the provisioner's.
pub async fn offerings(pool: &PoolSpec) -> Result<Vec<Offering>> {
    let sim = SimCloud::new(SimCatalogue::standard(), SimConfig::default());
    Ok(sim.offerings(pool).await?)
}

/// The largest share of the offering's CPU, memory or GPUs the job asks for; `None` when it
/// does not fit.
fn dominant_share(job: &DemandJob, offering: &Offering) -> Option<f64> {
    let asked = &job.resources;
    let shape = &offering.shape;
    if asked.cpu_millis > shape.cpu_millis || asked.memory_bytes > shape.memory_bytes || asked.gpus > shape.gpus {
        return None;
    }
    let share = |used: i64, total: i64| if total > 0 { used as f64 / total as f64 } else { 0.0 };
    Some(
        share(asked.cpu_millis, shape.cpu_millis)
            .max(share(asked.memory_bytes, shape.memory_bytes))
            .max(share(asked.gpus, shape.gpus)),
    )
}

fn accepts(job: &DemandJob, capacity: CapacityType) -> bool {
    match job.market.as_str() {
        "spot" => capacity == CapacityType::Spot,
        "on-demand" => capacity == CapacityType::OnDemand,
        _ => true,
    }
}

/// The job's share of the cheapest machine per share that holds it, in its market.
pub fn job_lower_bound(job: &DemandJob, offerings: &[Offering]) -> f64 {
    offerings
        .iter()
        .filter(|offering| accepts(job, offering.key.capacity))
        .filter_map(|offering| dominant_share(job, offering).map(|share| share * offering.price_per_hour))
        .fold(f64::INFINITY, f64::min)
}

/// `Σ_jobs min_offering (price × dominant share of the job on it)`, per hour.
pub fn lower_bound(jobs: &[DemandJob], offerings: &[Offering]) -> f64 {
    jobs.iter().map(|job| job_lower_bound(job, offerings)).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rig;

    #[tokio::test]
    async fn a_job_pays_its_share_of_the_cheapest_machine_per_share_in_its_market() {
        let offerings = offerings(&rig::pool(10, 60)).await.unwrap();
        // 1 CPU, 1 GiB: half a spot c.large (0.030/h) = 0.015; a quarter of a c.xlarge (0.06) is
        // the same; an eighth of an m.2xlarge (0.13) is 0.01625.
        let small = rig::job("a".into(), 1, 1, "auto");
        assert!((job_lower_bound(&small, &offerings) - 0.015).abs() < 1e-9);
        // On-demand only: half a c.large at 0.085.
        let on_demand = rig::job("b".into(), 1, 1, "on-demand");
        assert!((job_lower_bound(&on_demand, &offerings) - 0.0425).abs() < 1e-9);
        // 8 CPUs and 32 GiB: only an m.2xlarge holds it, all of it.
        let whole = rig::job("c".into(), 8, 32, "spot");
        assert!((lower_bound(&[whole], &offerings) - 0.13).abs() < 1e-9);
    }
}
