//! GPUs: allocation by the runner, the scheduler's GPU capacity, and the idle-GPU watchdog
//! driven by a scripted sampler (NVML stands behind the same trait on GPU machines).

use std::sync::Arc;

use kiln_e2e::{
    Stack, add_items, batch_now, batch_spec, counts_of, create_batch, live_workers, mem_items, seal_batch, spec,
    wait_batch,
};
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

/// Batch workers ask for GPUs as jobs do: a worker of a one-GPU batch gets the GPU, which its
/// items see; a batch asking two per worker never fits the one-GPU pool.
#[tokio::test]
async fn batch_workers_get_their_gpus() {
    let mut stack = gpu_stack(85.0).await;
    stack.start_item_batch(stack.item_batch_config()).await;
    let mut too_big = batch_spec(&["true"]);
    too_big.gpus = 2;
    let too_big = create_batch(&stack, too_big).await;
    add_items(&stack, &too_big.id, mem_items(["x".to_string()]))
        .await
        .unwrap();

    let mut fits = batch_spec(&["sh", "-c", "echo gpu=$CUDA_VISIBLE_DEVICES"]);
    fits.gpus = 1;
    fits.max_workers = 3;
    let fits = create_batch(&stack, fits).await;
    let keys: Vec<String> = (0..4).map(|n| format!("k{n}")).collect();
    add_items(&stack, &fits.id, mem_items(keys.clone())).await.unwrap();
    seal_batch(&stack, &fits.id).await;
    let done = wait_batch(&stack, &fits.id, "done", |b| b.state == pb::BatchState::Done as i32).await;
    assert_eq!(counts_of(&done).succeeded, 4);
    for key in keys {
        let lines = stack
            .batches_client()
            .await
            .get_item_logs(pb::GetItemLogsRequest {
                batch_id: fits.id.clone(),
                key: key.clone(),
            })
            .await
            .unwrap()
            .into_inner()
            .lines;
        let texts: Vec<&str> = lines.iter().map(|l| l.text.as_str()).collect();
        assert_eq!(texts, ["gpu=0"], "{key}");
    }

    let waiting = live_workers(&stack, &too_big.id).await;
    assert!(waiting >= 1, "the two-GPU batch asked for a worker");
    let workers = stack.store.live_batch_workers(&too_big.id).await.unwrap();
    assert!(
        workers.iter().all(|w| w.state == "QUEUED" && w.gpus == 2),
        "{:?}",
        workers.iter().map(|w| (&w.state, w.gpus)).collect::<Vec<_>>()
    );
    assert_eq!(counts_of(&batch_now(&stack, &too_big.id).await).succeeded, 0);
}
