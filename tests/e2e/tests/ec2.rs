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

/// One test's stack, EC2 world (spot prices set) and boot bridge.
struct Scene {
    stack: Stack,
    world: Ec2World,
    bridge: BootBridge,
}

impl Scene {
    async fn start(name: &str) -> Scene {
        let stack = Stack::start_without_runner().await;
        let world = Ec2World::start(name, &stack).await;
        world.proxy.prices(realistic_spot_prices()).await;
        let bridge = BootBridge::start(&world, &stack);
        Scene { stack, world, bridge }
    }

    /// kiln-provisioner for `pool`, its config as the test tweaks it.
    fn provisioner(
        &self,
        pool: kiln_cloud::PoolSpec,
        tweak: impl FnOnce(&mut serde_json::Value),
    ) -> ProvisionerProcess {
        let mut config = provisioner_config(&self.stack, &self.world, pool);
        tweak(&mut config);
        ProvisionerProcess::start(self.stack.dir.path(), &self.world.env, &config)
    }

    async fn finish(self) {
        self.bridge.stop().await;
        self.world.finish().await;
    }
}

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
            ..Default::default()
        }),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn forty_jobs_on_an_empty_pool_get_the_machines_they_need_and_the_pool_returns_to_zero() {
    let scene = Scene::start("forty").await;
    let (stack, world, bridge) = (&scene.stack, &scene.world, &scene.bridge);
    let _provisioner = scene.provisioner(world.pool(), |_| {});
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
        // Priced as the spot instance it ran on (its pool's prices, from the provisioner).
        assert_eq!(done.market, "spot");
        assert!(done.cost > 0.0 && done.cost < done.on_demand_cost, "{done:?}");
    }
    // Figures for the README (printed, never asserted: tests do not time).
    let mut jobs = Vec::new();
    for id in &ids {
        jobs.push(stack.get(id).await);
    }
    let submitted = jobs.iter().map(|j| j.created_at_ms).min().unwrap_or_default();
    let all_running = jobs.iter().map(|j| j.started_at_ms).max().unwrap_or_default();
    let intents = stack
        .store
        .intents(&world.cluster, &[kiln_core::store::cloud::intent_state::LAUNCHED])
        .await
        .unwrap();
    let first_call = intents.iter().map(|i| i.called_at_ms).min().unwrap_or_default();
    eprintln!(
        "figures: first submit → first CreateFleet {} ms; → all 40 RUNNING {} ms; CreateFleet calls {}, TerminateInstances calls {}",
        first_call - submitted,
        all_running - submitted,
        world.proxy.calls("CreateFleet").await,
        world.proxy.calls("TerminateInstances").await,
    );
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
    scene.finish().await;
}

/// The world's instances that moto still runs.
async fn live(world: &Ec2World) -> Vec<kiln_cloud::CloudInstance> {
    world
        .instances()
        .await
        .into_iter()
        .filter(|i| i.state.is_live())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_provisioner_killed_after_create_fleet_adopts_its_instance_and_launches_nothing_twice() {
    let scene = Scene::start("crash").await;
    let (stack, world, bridge) = (&scene.stack, &scene.world, &scene.bridge);
    // The first CreateFleet is carried out, and its answer never reaches the provisioner.
    world
        .proxy
        .fault(serde_json::json!({"action": "CreateFleet", "drop": true, "times": 1}))
        .await;
    let mut provisioner = scene.provisioner(world.pool(), |_| {});
    let job = stack.submit_spec(job(1000, 256, 1)).await.id;
    eventually(60, "the dropped CreateFleet", || async {
        world
            .proxy
            .outcomes("CreateFleet")
            .await
            .contains(&"dropped".to_string())
    })
    .await;
    // Killed right after the call took effect, before it could record an answer.
    provisioner.kill();
    assert_eq!(live(world).await.len(), 1, "the call launched its instance");
    let recorded = stack
        .store
        .instances(&world.cluster, &kiln_core::store::cloud::instance_state::LIVE)
        .await
        .unwrap();
    assert!(recorded.is_empty(), "nothing recorded before the crash: {recorded:?}");
    // The next provisioner adopts it by its intent tag; the job runs on it.
    let _provisioner = scene.provisioner(world.pool(), |_| {});
    let done = stack
        .wait_for(&job, "SUCCEEDED", |job| job.state == pb::JobState::Succeeded as i32)
        .await;
    let instances = world.instances().await;
    assert_eq!(instances.len(), 1, "launched once: {instances:?}");
    assert_eq!(done.runner_id, instances[0].id.0, "it ran on the adopted instance");
    assert_eq!(world.proxy.calls("CreateFleet").await, 1);
    assert_eq!(bridge.booted(), [instances[0].id.0.clone()]);
    eventually(60, "the instance terminated once idle", || async {
        live(world).await.is_empty()
    })
    .await;
    scene.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_unknown_tagged_instance_is_reaped_and_one_that_never_boots_is_terminated() {
    let scene = Scene::start("reap").await;
    let (stack, world, bridge) = (&scene.stack, &scene.world, &scene.bridge);
    // Nothing boots for now: a launched instance's runner never registers.
    bridge.pause();
    // An instance with this cluster's tag that no intent of kiln's made.
    let subnet = world.subnets["us-east-1a"].clone();
    let stray = kiln_cloud::LaunchIntent {
        id: kiln_cloud::IntentId::new(),
        cluster: world.cluster.clone(),
        pool: kiln_e2e::ec2::POOL.into(),
        capacity: kiln_cloud::CapacityType::OnDemand,
        count: 1,
        min_count: 1,
        single_zone: false,
        placement_group: None,
        candidates: vec![kiln_cloud::Offering {
            key: kiln_cloud::OfferingKey {
                instance_type: "c5.large".into(),
                zone: "us-east-1a".into(),
                capacity: kiln_cloud::CapacityType::OnDemand,
            },
            shape: kiln_cloud::Shape::default(),
            price_per_hour: 0.085,
            price_source: kiln_cloud::PriceSource::Configured,
            subnet: Some(subnet),
        }],
        template: kiln_cloud::TemplateRef {
            name: world.template.clone(),
            version: None,
        },
        labels: Default::default(),
        root_volume: None,
    };
    use kiln_cloud::Cloud;
    let stray = world.cloud.create(&stray).await.expect("a stray instance").instances[0]
        .id
        .clone();
    let mut pool = world.pool();
    pool.boot_timeout_secs = 5;
    let _provisioner = scene.provisioner(pool, |_| {});
    let job = stack.submit_spec(job(1000, 256, 1)).await.id;
    // The reaper terminates the stray after its grace (8 s here); the launched instance, never
    // booted, is terminated after the pool's boot timeout (5 s).
    eventually(60, "the stray reaped and the first launch timed out", || async {
        let instances = world.instances().await;
        let stray_gone = instances
            .iter()
            .any(|i| i.id == stray && i.state == InstanceState::Terminated);
        let timed_out = instances
            .iter()
            .any(|i| i.id != stray && i.state == InstanceState::Terminated);
        stray_gone && timed_out
    })
    .await;
    let released = stack
        .store
        .instances(&world.cluster, &[kiln_core::store::cloud::instance_state::TERMINATED])
        .await
        .unwrap();
    assert!(
        released.iter().any(|r| r.reason.starts_with("boot timeout")),
        "{released:?}"
    );
    assert!(
        released.iter().all(|r| r.instance_id != stray.0),
        "the stray was never kiln's"
    );
    // With machines booting again, the job gets a new one and runs.
    bridge.resume();
    let done = stack
        .wait_for(&job, "SUCCEEDED", |job| job.state == pb::JobState::Succeeded as i32)
        .await;
    assert_ne!(done.runner_id, stray.0);
    scene.finish().await;
}

/// `kiln explain JOB` (its summary and details, a line each) once it satisfies `wanted`.
async fn explain_until(stack: &Stack, job_id: &str, secs: u64, wanted: impl Fn(&str) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(secs);
    loop {
        let explanation = stack
            .jobs()
            .await
            .explain_job(pb::GetJobRequest { job_id: job_id.into() })
            .await
            .expect("explain")
            .into_inner();
        let said = format!("{}\n{}", explanation.summary, explanation.details.join("\n"));
        if wanted(&said) {
            return said;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "explain never said it; last:\n{said}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn no_spot_capacity_on_the_cheapest_offering_launches_the_next_and_explain_says_why() {
    let scene = Scene::start("ice").await;
    let (stack, world, bridge) = (&scene.stack, &scene.world, &scene.bridge);
    bridge.pause();
    let ice = serde_json::json!({
        "action": "CreateFleet", "instance_type": "c5.large", "zone": "us-east-1a", "market": "spot",
        "error": "InsufficientInstanceCapacity",
    });
    world.proxy.fault(ice).await;
    let _provisioner = scene.provisioner(world.pool(), |config| {
        config["unavailable-ttl-ms"] = serde_json::json!(8_000);
    });
    let first = stack.submit_spec(job(2000, 512, 1)).await.id;
    eventually(60, "a launch", || async { !world.instances().await.is_empty() }).await;
    let launched = world.instances().await;
    assert_eq!(launched.len(), 1);
    assert_eq!(
        launched[0].key.to_string(),
        "spot c5.large in us-east-1b",
        "the next offering, in the same call"
    );
    assert_eq!(world.proxy.calls("CreateFleet").await, 1);
    // While the machine boots, explain names it and the offering out of capacity.
    let said = explain_until(stack, &first, 30, |said| {
        said.contains("the provisioner launches a machine for it (pool ec2)")
            && said.contains("spot c5.large in us-east-1a unavailable")
            && said.contains("no capacity")
    })
    .await;
    eprintln!("explain: {said}");
    bridge.resume();
    stack
        .wait_for(&first, "SUCCEEDED", |job| job.state == pb::JobState::Succeeded as i32)
        .await;
    // Once the offering's unavailability has run out, the cheap offering is tried first again.
    eventually(60, "the pool back to zero", || async { live(world).await.is_empty() }).await;
    tokio::time::sleep(Duration::from_secs(8)).await;
    world.proxy.clear_faults().await;
    let second = stack.submit_spec(job(2000, 512, 1)).await.id;
    stack
        .wait_for(&second, "SUCCEEDED", |job| job.state == pb::JobState::Succeeded as i32)
        .await;
    let newest = world
        .instances()
        .await
        .into_iter()
        .max_by_key(|i| i.launched_at)
        .expect("an instance");
    assert_eq!(newest.key.to_string(), "spot c5.large in us-east-1a");
    scene.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_quota_error_holds_the_job_with_the_quota_named_and_the_calls_stay_bounded() {
    let scene = Scene::start("quota").await;
    let (stack, world) = (&scene.stack, &scene.world);
    world
        .proxy
        .fault(serde_json::json!({"action": "CreateFleet", "market": "on-demand", "error": "VcpuLimitExceeded"}))
        .await;
    let _provisioner = scene.provisioner(world.pool(), |_| {});
    let mut spec = job(1000, 256, 1);
    spec.market = pb::Market::OnDemand as i32;
    let held = stack.submit_spec(spec).await.id;
    let said = explain_until(stack, &held, 60, |said| {
        said.contains("vCPU") && said.contains("quota reached")
    })
    .await;
    eprintln!("explain: {said}");
    // Cycles every half second for five seconds: the quota is not asked again while marked.
    tokio::time::sleep(Duration::from_secs(5)).await;
    assert_eq!(world.proxy.calls("CreateFleet").await, 1, "one call per unavailability");
    assert!(world.instances().await.is_empty());
    let job = stack.get(&held).await;
    assert_eq!(job.state, pb::JobState::Queued as i32);
    scene.finish().await;
}

/// Checkpoints on SIGTERM and ends; a resumed attempt prints where it resumes from and ends.
const CHECKPOINT_ON_TERM: &str = r#"
if [ -n "$KILN_RESUME_FROM" ]; then
  echo "resumed $KILN_ATTEMPT $(cat "$KILN_RESUME_FROM/ckpt/step.txt")"
  exit 0
fi
trap 'mkdir -p "$KILN_OUTPUTS/ckpt"; echo step-7 > "$KILN_OUTPUTS/ckpt/step.txt"; exit 0' TERM
echo ready
while :; do sleep 0.2; done
"#;

fn spot_job(script: &str) -> pb::JobSpec {
    pb::JobSpec {
        command: vec!["sh".into(), "-c".into(), script.into()],
        market: pb::Market::Spot as i32,
        ..job(1000, 256, 0)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_spot_interruption_preempts_the_job_which_resumes_on_another_instance_from_its_checkpoint() {
    let scene = Scene::start("notice").await;
    let (stack, world, bridge) = (&scene.stack, &scene.world, &scene.bridge);
    let _provisioner = scene.provisioner(world.pool(), |_| {});
    let job = stack.submit_spec(spot_job(CHECKPOINT_ON_TERM)).await.id;
    kiln_e2e::wait_for_line(stack, &job, "ready").await;
    let first = stack.get(&job).await.runner_id;
    let noticed = world
        .instances()
        .await
        .into_iter()
        .find(|i| i.id.0 == first)
        .expect("the job's instance");
    assert_eq!(noticed.key.capacity, kiln_cloud::CapacityType::Spot);
    bridge.trigger(&first, &[kiln_core::testing::AemmNotice::Interruption]);

    // Synced, PREEMPTED as a spot preemption, queued again and resumed from the checkpoint on
    // a new instance of another offering (the noticed one is unavailable for a while).
    let done = stack
        .wait_for(&job, "SUCCEEDED on a second attempt", |j| {
            j.state == pb::JobState::Succeeded as i32
        })
        .await;
    assert_eq!((done.attempt, done.preemptions), (2, 1), "{done:?}");
    assert_ne!(done.runner_id, first);
    assert_eq!(
        kiln_e2e::output(stack, &job, "ckpt/step.txt").await.unwrap(),
        "step-7\n"
    );
    let lines = stack.log_lines(&job, true).await;
    assert!(lines.iter().any(|l| l.text == "resumed 2 step-7"), "{lines:?}");
    let second = world
        .instances()
        .await
        .into_iter()
        .find(|i| i.id.0 == done.runner_id)
        .expect("the second instance");
    assert_ne!(second.key, noticed.key, "the interrupted offering was not taken again");
    // The noticed instance is released once its job was handed back, not after the idle timeout.
    eventually(30, "the noticed instance terminated", || async {
        world
            .instances()
            .await
            .iter()
            .any(|i| i.id.0 == first && i.state == InstanceState::Terminated)
    })
    .await;
    let records = stack
        .store
        .instances(&world.cluster, &[kiln_core::store::cloud::instance_state::TERMINATED])
        .await
        .unwrap();
    let record = records.iter().find(|r| r.instance_id == first).expect("its record");
    assert_eq!(record.reason, "spot interruption");
    // The scheduler learnt the offering's rate beside the pool's.
    let rate_key = format!(
        "{}/{}/{}",
        kiln_e2e::ec2::POOL,
        noticed.key.instance_type,
        noticed.key.zone
    );
    let kv = kiln_core::streams::connect(&stack.nats.config())
        .await
        .unwrap()
        .jetstream
        .get_key_value(kiln_core::subjects::BUCKET_SCHEDULER)
        .await
        .unwrap();
    eventually(30, "the offering's preemption rate saved", || {
        let kv = kv.clone();
        let rate_key = rate_key.clone();
        async move {
            let saved = kv.get(kiln_core::subjects::KEY_PREEMPTION_RATES).await.unwrap();
            saved
                .map(|bytes| serde_json::from_slice::<serde_json::Map<String, serde_json::Value>>(&bytes).unwrap())
                .is_some_and(|rates| rates.contains_key(&rate_key) && rates.contains_key(kiln_e2e::ec2::POOL))
        }
    })
    .await;
    scene.finish().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_rebalance_recommendation_cordons_the_instance_without_killing_its_job() {
    let scene = Scene::start("rebalance").await;
    let (stack, world, bridge) = (&scene.stack, &scene.world, &scene.bridge);
    let _provisioner = scene.provisioner(world.pool(), |_| {});
    let long = stack
        .submit_spec(spot_job("echo ready; while :; do sleep 0.2; done"))
        .await
        .id;
    kiln_e2e::wait_for_line(stack, &long, "ready").await;
    let first = stack.get(&long).await.runner_id;
    bridge.trigger(&first, &[kiln_core::testing::AemmNotice::Rebalance]);
    // A second job fits beside the first (a c5.large has 2 CPUs), but the cordoned runner takes
    // nothing new: it gets a machine of its own.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let next = stack.submit_spec(spot_job("echo done")).await.id;
    let done = stack
        .wait_for(&next, "SUCCEEDED", |j| j.state == pb::JobState::Succeeded as i32)
        .await;
    assert_ne!(done.runner_id, first);
    let still = stack.get(&long).await;
    assert_eq!(still.state, pb::JobState::Running as i32, "nothing killed: {still:?}");
    assert_eq!(still.attempt, 1);
    assert!(
        world
            .instances()
            .await
            .iter()
            .any(|i| i.id.0 == first && i.state.is_live())
    );
    stack.stop_job(&long).await;
    scene.finish().await;
}

/// A `--disk` job (issue 28): on a pool that sizes no volumes it waits and nothing is launched;
/// once the pool's machines may have 500 GiB for their jobs, the scheduler makes it the pool's
/// demand and the provisioner's `CreateFleet` grows the launch template's root volume for it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_disk_job_launches_a_machine_whose_root_volume_is_sized_for_it() {
    let scene = Scene::start("disk").await;
    let (stack, world, bridge) = (&scene.stack, &scene.world, &scene.bridge);
    // No runner registers: what is looked at is the launch, not the job's run.
    bridge.pause();
    let mut spec = job(1000, 256, 1);
    spec.image = "kiln-test/never-pulled".into();
    if let Some(resources) = spec.resources.as_mut() {
        resources.disk_bytes = 180 << 30;
    }
    let unsized_pool = scene.provisioner(world.pool(), |_| {});
    let id = stack.submit_spec(spec).await.id;
    let said = explain_until(stack, &id, 30, |said| said.contains("180 GiB disk")).await;
    assert!(!said.contains("the provisioner launches a machine"), "{said}");
    // Cycles every half second: none launches for it.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert_eq!(world.proxy.calls("CreateFleet").await, 0);
    drop(unsized_pool);

    let mut pool = world.pool();
    pool.disk.max_job_gib = 500;
    let _sized = scene.provisioner(pool, |_| {});
    // The proxy counts a call when it arrives and records its parameters once carried out.
    eventually(60, "a launch", || async {
        !world.proxy.fleet_params().await.is_empty()
    })
    .await;
    let sent = world.proxy.fleet_params().await;
    let param = |name: &str| {
        sent[0]
            .get(&format!(
                "LaunchTemplateConfigs.1.Overrides.1.BlockDeviceMapping.1.{name}"
            ))
            .and_then(|v| v.as_str())
            .map(str::to_owned)
    };
    // The template's 100 GiB and the job's 180 GiB as the runner offers it (a ninth more).
    assert_eq!(param("DeviceName").as_deref(), Some("/dev/xvda"), "{sent:?}");
    assert_eq!(param("Ebs.VolumeSize").as_deref(), Some("300"), "{sent:?}");
    assert_eq!(param("Ebs.DeleteOnTermination").as_deref(), Some("true"));
    explain_until(stack, &id, 30, |said| {
        said.contains("the provisioner launches a machine")
    })
    .await;
    scene.finish().await;
}
