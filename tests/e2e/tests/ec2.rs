//! kiln rents its machines on EC2 (issue 27), end to end: moto's EC2 API behind a fault proxy,
//! kiln-provisioner as a process, the boot bridge starting a real kiln-runner (with an AEMM as
//! its instance metadata) for every instance moto runs, and the stack's api, scheduler and
//! log-ingest. Nothing here is simulated but the machines themselves.

use std::time::Duration;

use kiln_cloud::InstanceState;
use kiln_e2e::Stack;
use kiln_e2e::boot_bridge::BootBridge;
use kiln_e2e::ec2::{Ec2World, ProvisionerProcess, provisioner_config};
use kiln_proto::v1 as pb;

const MIB: u64 = 1 << 20;

/// Waits up to `secs` for `check`, polling every 250 ms; panics with `what`.
async fn eventually<F, Fut>(secs: u64, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    while !check().await {
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {secs} s waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Spot prices at about a third of on-demand, proportional to size, in both zones.
fn realistic_spot_prices() -> serde_json::Value {
    let mut prices = Vec::new();
    for zone in ["us-east-1a", "us-east-1b"] {
        prices.push(("c5.large", zone, 0.034));
        prices.push(("c5.xlarge", zone, 0.068));
        prices.push(("c5.2xlarge", zone, 0.136));
    }
    kiln_cloud::testing::spot_prices(&prices)
}

fn job(cpu_millis: u32, memory_mb: u64, seconds: u32) -> pb::JobSpec {
    pb::JobSpec {
        command: vec!["sh".into(), "-c".into(), format!("sleep {seconds}")],
        resources: Some(pb::Resources {
            cpu_millis,
            memory_bytes: memory_mb * MIB,
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forty_jobs_on_an_empty_pool_get_the_machines_they_need_and_the_pool_returns_to_zero() {
    let stack = Stack::start_without_runner().await;
    let world = Ec2World::start("forty", &stack).await;
    let bridge = BootBridge::start(&world, &stack);
    world.proxy.prices(realistic_spot_prices()).await;
    let pool = world.pool();
    let _provisioner = ProvisionerProcess::start(
        stack.dir.path(),
        &world.env,
        &provisioner_config(&stack, &world, pool.clone()),
    );
    // 40 jobs of mixed sizes: 10 each of 0.5, 1, 1.5 and 2 CPUs (50 CPUs in all).
    let mut ids = Vec::new();
    for n in 0..40 {
        let cpu = [500, 1000, 1500, 2000][n % 4];
        ids.push(stack.submit_spec(job(cpu, 256, 2)).await.id);
    }
    for id in &ids {
        let done = stack
            .wait_for(id, "SUCCEEDED", |job| {
                job.state == pb::JobState::Succeeded as i32 || job.state == pb::JobState::Failed as i32
            })
            .await;
        assert_eq!(done.state, pb::JobState::Succeeded as i32, "{done:?}");
    }
    let launched = world.instances().await;
    // No more than packing them: 50 CPUs fill seven 8-CPU machines at best; the packing of the
    // whole demand at once (the planner's figure) is the most kiln may launch.
    let cpus: i64 = launched
        .iter()
        .map(|i| kiln_e2e::ec2::shape_of(&i.key.instance_type).0 / 1000)
        .sum();
    eprintln!(
        "launched {} instances ({cpus} CPUs): {:?}",
        launched.len(),
        launched.iter().map(|i| i.key.to_string()).collect::<Vec<_>>()
    );
    assert!(cpus >= 50, "{cpus} CPUs launched for 50 CPUs of jobs");
    assert!(
        cpus <= 56,
        "{cpus} CPUs launched for 50 CPUs of jobs: more than one packing needs ({launched:?})"
    );
    assert_eq!(bridge.booted().len(), launched.len());
    // Idle for the pool's idle timeout, each runner is cordoned and its instance terminated.
    eventually(90, "every instance terminated", || async {
        world
            .instances()
            .await
            .iter()
            .all(|i| i.state == InstanceState::Terminated)
    })
    .await;
    let records = stack
        .store
        .instances(&world.cluster, &kiln_core::store::cloud::instance_state::LIVE)
        .await
        .unwrap();
    assert!(records.is_empty(), "{records:?}");
    bridge.stop().await;
    world.finish().await;
}
