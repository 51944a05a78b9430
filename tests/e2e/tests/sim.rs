//! The `sim` provider behind a real runner: simulated instances boot, run, and are preempted
//! with a notice; a preempted job is queued again as a new attempt.

use kiln_e2e::{Stack, job_events};
use kiln_proto::v1 as pb;
use kiln_runner::provider::sim::SimConfig;

async fn sim_stack(sim: SimConfig) -> Stack {
    let mut stack = Stack::start_without_runner().await;
    let mut config = stack.runner_config("sim-1");
    config.provider = kiln_runner::ProviderKind::Sim;
    config.sim = sim;
    config.cpu_millis = 0;
    config.memory_bytes = 0;
    stack.runner = Some(stack.spawn_runner(config).await);
    stack
}

#[tokio::test]
async fn a_job_runs_on_a_simulated_instance() {
    let stack = sim_stack(SimConfig {
        spot: false,
        time_scale: 1000.0,
        ..SimConfig::default()
    })
    .await;
    let job = stack.submit(&["sleep", "60"]).await;
    let done = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    assert!(done.instance_id.starts_with("sim:c.large:"), "{done:?}");
    let lines = stack.log_lines(&job.id, true).await;
    assert!(
        lines[0].text.starts_with("sim: c.large (on-demand) booted in "),
        "{lines:?}"
    );
    let failing = stack.submit(&["exit", "4"]).await;
    let failed = stack.wait_for_state(&failing.id, pb::JobState::Failed).await;
    assert_eq!(failed.exit_code, Some(4));
}

#[tokio::test]
async fn a_preempted_job_is_queued_again() {
    // Spot instances taken back every few simulated minutes; a job of a simulated hour.
    let sim = SimConfig {
        spot: true,
        time_scale: 1000.0,
        preemptions_per_hour: 20.0,
        notice_ms: 30_000,
        ..SimConfig::default()
    };
    let stack = sim_stack(sim).await;
    let job = stack.submit(&["sleep", "3600"]).await;
    let requeued = stack.wait_for(&job.id, "a second attempt", |j| j.attempt >= 2).await;
    let states: Vec<i32> = job_events(&stack, &requeued).await.iter().map(|e| e.state).collect();
    let preempted = pb::JobState::Preempted as i32;
    let at = states
        .iter()
        .position(|&s| s == preempted)
        .expect("a PREEMPTED change was published");
    assert_eq!(
        states[at - 1],
        pb::JobState::Syncing as i32,
        "outputs are synced before: {states:?}"
    );
    assert_eq!(requeued.reason, "preempted; queued again", "{requeued:?}");
    stack
        .jobs()
        .await
        .stop_job(pb::StopJobRequest { job_id: job.id.clone() })
        .await
        .unwrap();
    let stopped = stack
        .wait_for(&job.id, "the end", |j| j.state == pb::JobState::Stopped as i32)
        .await;
    assert!(stopped.attempt >= 2);
}
