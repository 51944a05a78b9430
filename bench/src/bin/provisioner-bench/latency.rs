//! Demand → create call for one new job: the time from the start of the cycle that reads the
//! changed demand to the create call entering the cloud, on a warm leader (offerings read). The
//! service's batching window before that cycle is modelled, not timed (see `main.rs`).

use std::time::Duration;

use anyhow::{Context, Result, ensure};
use kiln_cloud::sim::SimCatalogue;
use kiln_cloud::{CapacityType, IntentId, LaunchIntent, Offering, TemplateRef};
use kiln_core::provisioning::Demand;
use kiln_core::store::IntentRecord;
use kiln_core::store::cloud::{instance_state, intent_state};

use crate::rig::{self, Rig};
use crate::{cost, demand};

/// Percentiles of the runs.
#[derive(Debug, Clone, Default)]
pub struct Latency {
    /// Live instances in the pool while it was measured.
    pub background: usize,
    /// Intents launched before, in the store.
    pub past: usize,
    pub to_create_p50: Duration,
    pub to_create_max: Duration,
    pub cycle_p50: Duration,
    pub cycle_max: Duration,
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    sorted
        .get(((sorted.len().max(1) - 1) as f64 * p).round() as usize)
        .copied()
        .unwrap_or_default()
}

/// Writes `count` intents the pool launched long ago, as a long-lived cluster accumulates them
/// (an intent stays `launched` after its instances are gone: the reaper adopts by it).
async fn history(rig: &Rig, count: usize, at_ms: i64) -> Result<()> {
    let offerings = cost::offerings(&rig.pool).await?;
    let candidates: Vec<Offering> = offerings
        .into_iter()
        .filter(|o| o.key.capacity == CapacityType::Spot)
        .collect();
    for n in 0..count {
        let intent = LaunchIntent {
            id: IntentId::new(),
            cluster: rig.cluster.clone(),
            pool: rig.pool.name.clone(),
            capacity: CapacityType::Spot,
            count: 1,
            min_count: 1,
            single_zone: false,
            placement_group: None,
            candidates: candidates.clone(),
            template: TemplateRef {
                name: rig.pool.launch_template.clone(),
                version: None,
            },
            labels: Default::default(),
            root_volume: None,
        };
        let at = at_ms - (count - n) as i64 * 60_000;
        rig.store
            .insert_intent(IntentRecord {
                id: intent.id.to_string(),
                cluster: intent.cluster.clone(),
                pool: intent.pool.clone(),
                capacity: "spot".into(),
                count: 1,
                min_count: 1,
                single_zone: false,
                request: serde_json::to_string(&intent)?,
                demand: serde_json::to_string(&[format!("old-{n}")])?,
                state: intent_state::LAUNCHED.into(),
                version: 3,
                created_at_ms: at,
                called_at_ms: at,
                settled_at_ms: at,
                failures: "[]".into(),
                attempts: 1,
            })
            .await?;
    }
    Ok(())
}

/// `runs` single jobs, one after another, on a pool already running `background` busy
/// instances, with `past` intents launched before.
pub async fn measure(
    database_url: Option<&str>,
    background: usize,
    past: usize,
    runs: usize,
    cycle_ms: i64,
) -> Result<Latency> {
    let max = (background + runs + 1) as u32;
    let mut rig = Rig::new(database_url, rig::pool(max, 300), SimCatalogue::standard()).await?;
    let mut now_ms = kiln_core::ids::now_ms();
    history(&rig, past, now_ms).await?;
    // Warm: the offerings are read, the background instances launched and registered busy.
    let jobs = demand::uniform(background);
    rig.cycle(&Demand { at_ms: now_ms, jobs }, &Default::default(), now_ms)
        .await?;
    now_ms += cycle_ms;
    let mut seen = rig.runners(true).await?;
    let empty = Demand::default();
    rig.cycle(&empty, &seen, now_ms).await?;
    let mut to_create = Vec::with_capacity(runs);
    let mut cycles = Vec::with_capacity(runs);
    for run in 0..runs {
        now_ms += cycle_ms;
        let wanted = Demand {
            at_ms: now_ms,
            jobs: vec![rig::job(format!("latency-{run}"), 2, 4, "auto")],
        };
        rig.cloud.take_first_create();
        let started = std::time::Instant::now();
        let (cycle, cost) = rig.cycle(&wanted, &seen, now_ms).await?;
        let created = rig.cloud.take_first_create().context("no create call for a new job")?;
        ensure!(cycle.launched == 1, "run {run}: {} launched", cycle.launched);
        to_create.push(created - started);
        cycles.push(cost.wall);
        // Its runner registers busy, so the next job needs a machine of its own.
        now_ms += cycle_ms;
        for record in rig.live().await? {
            if record.state == instance_state::BOOTING {
                let runner = format!("r-{}", record.instance_id);
                seen.busy.insert(runner.clone());
                seen.runner_on.insert(record.instance_id, runner);
            }
        }
        rig.cycle(&empty, &seen, now_ms).await?;
    }
    to_create.sort();
    cycles.sort();
    Ok(Latency {
        background,
        past,
        to_create_p50: percentile(&to_create, 0.5),
        to_create_max: percentile(&to_create, 1.0),
        cycle_p50: percentile(&cycles, 0.5),
        cycle_max: percentile(&cycles, 1.0),
    })
}
