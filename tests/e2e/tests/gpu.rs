//! GPUs: allocation by the runner, the scheduler's GPU capacity, and the idle-GPU watchdog
//! driven by a scripted sampler (NVML stands behind the same trait on GPU machines).

use std::sync::Arc;

use kiln_e2e::{Stack, spec};
use kiln_proto::v1 as pb;
use kiln_runner::config::IdleGpuConfig;
use kiln_runner::gpu::ScriptedSampler;

async fn gpu_stack(utilization: f64) -> Stack {
    let mut stack = Stack::start_without_runner().await;
    let mut config = stack.runner_config("gpu-1");
    config.gpus = 1;
    config.idle_gpu = IdleGpuConfig {
        threshold_percent: 10.0,
        window_secs: 1,
        sample_interval_ms: 100,
    };
    let sampler = Arc::new(ScriptedSampler { count: 1, utilization });
    stack.runner = Some(stack.spawn_runner_with_sampler(config, sampler).await);
    stack
}

fn gpu_spec(command: &[&str], gpus: u32) -> pb::JobSpec {
    let mut spec = spec(command);
    spec.gpus = gpus;
    spec
}

#[tokio::test]
async fn a_job_whose_gpus_stay_idle_is_stopped() {
    let stack = gpu_stack(2.0).await;
    let job = stack
        .submit_spec(gpu_spec(&["sh", "-c", "echo gpus=$CUDA_VISIBLE_DEVICES; sleep 600"], 1))
        .await;
    let stopped = stack.wait_for_state(&job.id, pb::JobState::Stopped).await;
    assert_eq!(stopped.reason, "idle GPU");
    let lines = stack.log_lines(&job.id, true).await;
    assert_eq!(lines[0].text, "gpus=0");
}

#[tokio::test]
async fn a_busy_job_is_left_alone() {
    let stack = gpu_stack(85.0).await;
    let job = stack.submit_spec(gpu_spec(&["sleep", "2"], 1)).await;
    let done = stack.wait_for(&job.id, "the end", |j| j.finished_at_ms > 0).await;
    assert_eq!((done.state, done.reason.as_str()), (pb::JobState::Succeeded as i32, ""));
}

#[tokio::test]
async fn jobs_wait_for_gpus() {
    let stack = gpu_stack(85.0).await;
    // Two GPUs never fit a one-GPU pool; one GPU fits once the first job gives it back.
    let too_big = stack.submit_spec(gpu_spec(&["true"], 2)).await;
    let first = stack.submit_spec(gpu_spec(&["sleep", "1"], 1)).await;
    let second = stack.submit_spec(gpu_spec(&["true"], 1)).await;
    let first = stack.wait_for_state(&first.id, pb::JobState::Succeeded).await;
    let second = stack.wait_for_state(&second.id, pb::JobState::Succeeded).await;
    assert!(
        second.started_at_ms >= first.finished_at_ms,
        "the GPU was shared: {first:?} {second:?}"
    );
    assert_eq!(stack.get(&too_big.id).await.state, pb::JobState::Queued as i32);
}
