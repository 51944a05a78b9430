//! System metrics of running jobs reach `KILN_METRICS` under `sys/...` keys.

use kiln_e2e::{Stack, metric_batches, spec, test_image};
use kiln_proto::v1 as pb;
use kiln_runner::collector::{CPU_PERCENT, HOST_CPU_PERCENT, HOST_MEMORY_USED_BYTES, MEMORY_BYTES};

fn values(batches: &[pb::MetricBatch], key: &str) -> Vec<f64> {
    batches
        .iter()
        .flat_map(|b| &b.points)
        .filter(|p| p.key == key)
        .map(|p| p.value)
        .collect()
}

fn assert_sane(batches: &[pb::MetricBatch], job_id: &str) {
    assert!(batches.len() >= 2, "{batches:?}");
    assert!(batches.iter().all(|b| b.job_id == job_id && b.attempt == 1));
    let steps: Vec<i64> = batches.iter().map(|b| b.points[0].step).collect();
    assert!(steps.windows(2).all(|w| w[0] < w[1]), "{steps:?}");
    let memory = values(batches, MEMORY_BYTES);
    assert!(!memory.is_empty() && memory.iter().all(|&m| m > 0.0), "{memory:?}");
    assert!(values(batches, CPU_PERCENT).iter().all(|&c| c >= 0.0));
    assert!(values(batches, HOST_MEMORY_USED_BYTES).iter().all(|&m| m > 0.0));
    assert_eq!(values(batches, HOST_CPU_PERCENT).len(), batches.len());
}

#[tokio::test]
async fn a_process_job_reports_its_cpu_and_memory() {
    let stack = Stack::start().await;
    let job = stack
        .submit(&["sh", "-c", "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; sleep 1"])
        .await;
    stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    let batches = metric_batches(&stack, &job.id).await;
    assert_sane(&batches, &job.id);
    let busiest = values(&batches, CPU_PERCENT).into_iter().fold(0.0, f64::max);
    assert!(busiest > 10.0, "the busy loop should show: {busiest}");
}

#[tokio::test]
async fn a_container_job_reports_the_engines_stats() {
    let stack = Stack::start_docker().await;
    let mut job_spec = spec(&["sh", "-c", "sleep 4"]);
    job_spec.image = test_image();
    let job = stack.submit_spec(job_spec).await;
    stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;
    assert_sane(&metric_batches(&stack, &job.id).await, &job.id);
}
