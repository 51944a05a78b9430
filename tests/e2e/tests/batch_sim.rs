//! A batch on the `sim` provider: up to 1,000 simulated spot workers (each runs kiln-agent's loop
//! in this process, with the built-in `kiln:sleep 1000`), seeded preemptions, and every item
//! processed once by the counters; the workers scale up to the maximum and back to zero.
//!
//! CI runs 100,000 items; `KILN_SIM_ITEMS=1000000` runs the million (see the README's
//! performance section for the figures of that run).

use std::time::{Duration, Instant};

use kiln_e2e::{BatchRun, Stack, run_batch_to_done};
use kiln_proto::v1 as pb;
use kiln_runner::provider::sim::SimConfig;

fn peak_rss_mb() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .unwrap_or(0)
        / 1024
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_items_on_a_thousand_preempted_spot_workers_are_counted_exactly() {
    let items: usize = std::env::var("KILN_SIM_ITEMS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(100_000);
    let mut stack = Stack::start_without_runner().await;
    let mut batch_config = stack.item_batch_config();
    batch_config.idle_stop_ms = 3_000;
    stack.start_item_batch(batch_config).await;
    let mut runner = stack.runner_config("sim-batch");
    runner.provider = kiln_runner::ProviderKind::Sim;
    runner.cpu_millis = 0;
    runner.memory_bytes = 0;
    runner.metrics_interval_ms = 3_600_000;
    runner.sim = SimConfig {
        seed: 7,
        spot: true,
        time_scale: 1.0,
        boot_min_ms: 100,
        boot_max_ms: 1_000,
        // About a preemption every few seconds across a thousand workers.
        preemptions_per_hour: 2.0,
        notice_ms: 1_000,
        max_instances: 1_000,
        ..SimConfig::default()
    };
    stack.runner = Some(stack.spawn_runner(runner).await);

    let spec = pb::BatchSpec {
        name: "sim".into(),
        // A second per item: a thousand workers then need 1,000 items/s, which item-batch hands
        // out even in a dev build (a fifth of a second needed 5,000/s: the dev build dispatched
        // about 1,200/s, so idle workers left and at most a few hundred were ever live).
        command: vec!["kiln:sleep".into(), "1000".into()],
        cpu_millis: 1000,
        memory_mb: 512,
        max_attempts: 3,
        max_workers: 1000,
        market: pb::Market::Spot as i32,
        ..Default::default()
    };
    let mut client = stack.batches_client().await;
    let batch = client
        .create_batch(pb::CreateBatchRequest { spec: Some(spec) })
        .await
        .unwrap()
        .into_inner();
    let started = Instant::now();
    let all: Vec<pb::Item> = (0..items)
        .map(|n| pb::Item {
            key: format!("{n:07}"),
            uri: format!("mem://{n}"),
            params: Default::default(),
        })
        .collect();
    let messages = kiln_e2e::add_requests(&batch.id, &all, 10_000);
    let added = client
        .add_items(futures::stream::iter(messages))
        .await
        .unwrap()
        .into_inner();
    assert_eq!(added.total, items as u64);
    client
        .seal_batch(pb::BatchRef {
            batch_id: batch.id.clone(),
        })
        .await
        .unwrap();
    let added_in = started.elapsed();

    let deadline = tokio::time::Instant::now() + Duration::from_secs(1800);
    let BatchRun { done, most_workers } = run_batch_to_done(&mut client, &batch.id, deadline)
        .await
        .unwrap_or_else(|now| panic!("the batch did not finish: {now:?}"));
    let c = done.counts.unwrap();
    assert_eq!(
        (c.total, c.succeeded, c.dead, c.failed),
        (items as u64, items as u64, 0, 0),
        "{c:?}"
    );
    assert_eq!(most_workers, 1000, "the workers scale up to max_workers");

    // Back to zero, and some workers were preempted on the way.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    while !stack.store.live_batch_workers(&batch.id).await.unwrap().is_empty() {
        assert!(tokio::time::Instant::now() < deadline, "workers stayed");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let workers = stack
        .store
        .list_jobs(None, &kiln_core::authz::Visible::All, true, 100_000)
        .await
        .unwrap()
        .into_iter()
        .filter(|job| job.batch_id == batch.id)
        .collect::<Vec<_>>();
    let preempted = workers.iter().filter(|job| job.attempt > 1).count();
    assert!(preempted > 0, "no worker was preempted: raise preemptions_per_hour");
    println!(
        "sim batch: {items} items in {:.1} s (added in {:.1} s), {} worker jobs, {preempted} preempted and queued again, peak RSS of the test process {} MB",
        started.elapsed().as_secs_f64(),
        added_in.as_secs_f64(),
        workers.len(),
        peak_rss_mb()
    );
}
