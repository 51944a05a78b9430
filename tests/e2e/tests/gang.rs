//! Gang jobs (`--nodes N`) on three runners of one CPU each, one node per runner: the nodes
//! start together, meet over TCP at the rendezvous kiln gives them (a sum all-reduce in Python
//! with sockets), node 0's outputs are the job's; with one runner's room taken none starts until
//! all fit; a runner SIGKILLed mid-run ends the attempt for all, and the next attempt resumes
//! from node 0's last periodic sync. And a gang on an empty provisioned pool of the sim cloud:
//! its machines come in one launch.

use std::collections::BTreeMap;
use std::time::Duration;

use kiln_e2e::{ServiceHandle, Stack, output, spec, wait_for_line};
use kiln_proto::v1 as pb;

/// Every node sends its rank + 1 to rank 0, which answers the sum: 6 for three nodes. Then
/// rank 0 counts steps into `$KILN_OUTPUTS/step` until `STEPS` (a resumed attempt starts from
/// the synced count and says so), while the others wait for rank 0 to close.
const ALL_REDUCE: &str = include_str!("../../all_reduce.py");

/// Three runners of one CPU each (`runner-1..3`), leases of 2 s, lost jobs queued again,
/// outputs synced every second.
async fn three_runners(stack: &Stack) -> BTreeMap<String, ServiceHandle> {
    let mut runners = BTreeMap::new();
    for index in 1..=3 {
        let id = format!("runner-{index}");
        runners.insert(id.clone(), stack.spawn_runner(runner(stack, &id)).await);
    }
    runners
}

fn runner(stack: &Stack, id: &str) -> kiln_runner::Config {
    kiln_runner::Config {
        cpu_millis: 1000,
        lease_ttl_ms: 2_000,
        on_lost: kiln_runner::OnLost::Requeue,
        outputs_sync_interval_secs: 1,
        work_dir: stack.dir.path().join(format!("work-{id}")),
        ..stack.runner_config(id)
    }
}

fn gang_spec(steps: u32) -> pb::JobSpec {
    let mut gang = spec(&["python3", "-c", ALL_REDUCE]);
    gang.nodes = 3;
    gang.resources = Some(pb::Resources {
        cpu_millis: 1000,
        memory_bytes: 64 << 20,
        ..Default::default()
    });
    gang.env.insert("STEPS".into(), steps.to_string());
    gang
}

/// The texts of node `rank`'s lines.
async fn node_lines(stack: &Stack, job_id: &str, rank: u32) -> Vec<String> {
    use futures::StreamExt;
    let request = pb::GetLogsRequest {
        job_id: job_id.into(),
        follow: false,
        node: rank,
        ..Default::default()
    };
    let mut lines = stack.logs_client().await.get_logs(request).await.unwrap().into_inner();
    let mut texts = Vec::new();
    while let Some(line) = lines.next().await {
        texts.push(line.unwrap().text);
    }
    texts
}

#[tokio::test]
async fn three_nodes_start_together_meet_at_the_rendezvous_and_node_0s_outputs_are_the_jobs() {
    let stack = Stack::start_without_runner().await;
    let runners = three_runners(&stack).await;
    let job = stack.submit_spec(gang_spec(3)).await;
    let running = stack.wait_for_state(&job.id, pb::JobState::Running).await;
    assert!(running.rendezvous.starts_with("127.0.0.1:"), "{running:?}");
    // Rank 0 runs only once every node is ready: submit to RUNNING is the gang's start latency
    // (printed for the README, never asserted).
    eprintln!(
        "gang start latency: {} ms from submit to all 3 nodes started",
        running.started_at_ms.saturating_sub(running.created_at_ms)
    );
    let done = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    // One node per runner: each holds one CPU.
    let nodes = stack.get(&job.id).await.nodes;
    let mut placed: Vec<&str> = nodes.iter().map(|node| node.runner_id.as_str()).collect();
    placed.sort_unstable();
    assert_eq!(placed, ["runner-1", "runner-2", "runner-3"], "{nodes:?}");
    let mut all = Vec::new();
    for rank in 0..3 {
        all.push(node_lines(&stack, &job.id, rank).await);
    }
    for (rank, lines) in all.iter().enumerate() {
        assert!(
            lines.contains(&format!("rank {rank} of 3 sum 6")),
            "node {rank}: {all:?}"
        );
    }
    assert_eq!(output(&stack, &job.id, "sum").await.unwrap(), "6");
    assert_eq!(done.attempt, 1, "{done:?}");
    for (_, runner) in runners {
        runner.stop().await;
    }
}

#[tokio::test]
async fn with_one_runners_room_taken_no_node_starts_until_all_fit() {
    let stack = Stack::start_without_runner().await;
    let runners = three_runners(&stack).await;
    let mut sleeper = spec(&["sleep", "600"]);
    sleeper.resources = Some(pb::Resources {
        cpu_millis: 1000,
        memory_bytes: 64 << 20,
        ..Default::default()
    });
    let sleeper = stack.submit_spec(sleeper).await;
    stack.wait_for_state(&sleeper.id, pb::JobState::Running).await;
    let job = stack.submit_spec(gang_spec(3)).await;
    // Passes come and go; the gang stays queued whole, and no node of it was placed.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let waiting = stack.get(&job.id).await;
    assert_eq!(waiting.state, pb::JobState::Queued as i32, "{waiting:?}");
    assert!(waiting.nodes.is_empty(), "{waiting:?}");
    stack.stop_job(&sleeper.id).await;
    let done = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    assert_eq!(output(&stack, &job.id, "sum").await.unwrap(), "6", "{done:?}");
    for (_, runner) in runners {
        runner.stop().await;
    }
}

#[tokio::test]
async fn a_node_whose_runner_is_killed_ends_the_attempt_for_all_and_the_next_resumes_from_the_sync() {
    let stack = Stack::start_without_runner().await;
    let mut runners = three_runners(&stack).await;
    let job = stack.submit_spec(gang_spec(1_000_000)).await;
    stack.wait_for_state(&job.id, pb::JobState::Running).await;
    let synced = stack
        .wait_for(&job.id, "node 0's outputs synced", |j| j.outputs_synced_at_ms > 0)
        .await;
    let node_1 = synced
        .nodes
        .iter()
        .find(|node| node.rank == 1)
        .map(|node| node.runner_id.clone())
        .expect("node 1");
    let spare = stack.spawn_runner(runner(&stack, "runner-4")).await;
    runners.remove(&node_1).expect("node 1's runner").crash().await;
    // The next attempt runs to the end quickly: it resumes at the synced step and stops there.
    let resumed = stack
        .wait_for(&job.id, "the second attempt running", |j| {
            j.attempt == 2 && j.state == pb::JobState::Running as i32 || j.finished_at_ms > 0
        })
        .await;
    if resumed.attempt != 2 {
        let mut all = Vec::new();
        for rank in 0..3 {
            all.push(node_lines(&stack, &job.id, rank).await);
        }
        panic!("{resumed:?}: {all:?}");
    }
    assert!(resumed.resume_from.contains(&job.id), "{resumed:?}");
    wait_for_line(&stack, &job.id, "attempt 2 resumes at step ").await;
    // Every node sampled its own system metrics: node 0's under sys/, node K's under sys/nodeK/.
    let keys = stack
        .logs_client()
        .await
        .list_metric_keys(pb::ListMetricKeysRequest { job_id: job.id.clone() })
        .await
        .unwrap()
        .into_inner()
        .keys;
    for key in [
        "sys/host_cpu_percent",
        "sys/node1/host_cpu_percent",
        "sys/node2/host_cpu_percent",
    ] {
        assert!(keys.iter().any(|k| k == key), "no {key} in {keys:?}");
    }
    stack.stop_job(&job.id).await;
    stack.wait_for_state(&job.id, pb::JobState::Stopped).await;
    spare.stop().await;
    for (_, runner) in runners {
        runner.stop().await;
    }
}

/// A gang on a provisioned pool of the simulated cloud that has no machine: the scheduler asks
/// for its three nodes, the provisioner launches them in one call, in one zone and the pool's
/// placement group, a runner boots on each, and the gang runs whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_gang_on_an_empty_provisioned_pool_gets_its_machines_in_one_launch_and_runs() {
    use kiln_core::store::cloud::intent_state;
    use kiln_e2e::sim_fleet::{FleetConfig, SIM_PLACEMENT_GROUP, SIM_POOL, SimFleet};

    let stack = Stack::start_without_runner().await;
    let fleet = SimFleet::start(
        &stack,
        FleetConfig {
            max_instances: 4,
            preemptions_per_hour: 0.0,
            seed: 3,
            idle_timeout_secs: 2,
            runner_lease_secs: 10,
        },
    )
    .await;
    // A c.large (the cheapest) holds one node of two CPUs.
    let mut gang = spec(&["sleep", "1"]);
    gang.nodes = 3;
    gang.pool = SIM_POOL.into();
    gang.market = pb::Market::Spot as i32;
    gang.resources = Some(pb::Resources {
        cpu_millis: 2000,
        memory_bytes: 1 << 30,
        ..Default::default()
    });
    let job = stack.submit_spec(gang).await;
    let done = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    assert_eq!(done.attempt, 1, "{done:?}");
    let intents = stack
        .store
        .intents(&fleet.cluster, &[intent_state::LAUNCHED])
        .await
        .expect("intents");
    let sent: Vec<kiln_cloud::LaunchIntent> = intents
        .iter()
        .map(|record| serde_json::from_str(&record.request).expect("an intent"))
        .collect();
    assert_eq!(sent.len(), 1, "one launch for the gang: {sent:?}");
    assert_eq!((sent[0].count, sent[0].min_count, sent[0].single_zone), (3, 3, true));
    assert_eq!(sent[0].placement_group.as_deref(), Some(SIM_PLACEMENT_GROUP));
    let launched = fleet.live().await;
    assert_eq!(launched.len(), 3, "{launched:?}");
    assert!(
        launched.iter().all(|i| i.key.zone == launched[0].key.zone),
        "{launched:?}"
    );
    fleet.stop().await;
}
