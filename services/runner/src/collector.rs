//! System metrics of a running job, every `metrics-interval-ms`, on `kiln.metrics.<job>` under
//! `sys/...` keys: the instance's CPU and memory (from the engine's stats, or /proc for a
//! process), the host's CPU and memory (sysinfo), and its GPUs' utilisation (NVML) when it has
//! any. A gang's node K > 0 samples its own under `sys/nodeK/...` ([`node_key`]). Each batch's
//! message id is `<job>:<attempt>:sys:<step>` (`sysK` for node K), so a retried publish is kept
//! once. Batches are published in order by a task of their own, which sends each again until
//! stored and outlives the sampling (aborted when the job ends) until it has sent what was
//! sampled: a stream electing its leader delays the points, it does not lose them.

use std::time::Duration;

use bytes::Bytes;
use kiln_core::ids::now_ms;
use kiln_core::streams::publish;
use kiln_core::subjects;
use kiln_proto::v1::{MetricBatch, MetricPoint};
use prost::Message;

use crate::Context;
use crate::provider::Instance;

pub const CPU_PERCENT: &str = "sys/cpu_percent";
pub const MEMORY_BYTES: &str = "sys/memory_bytes";
pub const HOST_CPU_PERCENT: &str = "sys/host_cpu_percent";
pub const HOST_MEMORY_USED_BYTES: &str = "sys/host_memory_used_bytes";
pub const GPU_PERCENT: &str = "sys/gpu_percent";

/// Batches sampled and not yet published, at most; sampling waits when they are.
const QUEUED_BATCHES: usize = 64;

/// The key of system metric `key` (`sys/...`) of a gang's node `rank`: node 0's, as a one-node
/// job's, is `key`; node K's is `sys/nodeK/...`.
pub fn node_key(rank: i32, key: &str) -> String {
    match rank {
        0 => key.to_string(),
        _ => format!("sys/node{rank}/{}", key.trim_start_matches("sys/")),
    }
}

/// Samples and publishes until the task is aborted (when the job ends, or node `rank` of a
/// gang does).
pub(crate) async fn collect(ctx: Context, instance: Instance, gpu_devices: Vec<u32>, rank: i32) {
    let interval = Duration::from_millis(ctx.config.metrics_interval_ms);
    let (tx, mut rx) = tokio::sync::mpsc::channel::<(String, Bytes)>(QUEUED_BATCHES);
    let js = ctx.nats.jetstream.clone();
    let job_id = instance.job_id.clone();
    tokio::spawn(async move {
        let subject = subjects::metrics(&job_id);
        while let Some((msg_id, payload)) = rx.recv().await {
            if let Err(error) = publish(&js, subject.clone(), &msg_id, payload).await {
                tracing::warn!(job_id = %job_id, error = %error, "cannot publish system metrics");
            }
        }
    });
    // Host figures are skipped where sysinfo cannot read the system.
    let mut system = sysinfo::System::new().ok();
    let mut step: i64 = 0;
    loop {
        tokio::time::sleep(interval).await;
        step += 1;
        let at = now_ms();
        let point = |key: &str, value: f64| MetricPoint {
            key: node_key(rank, key),
            step,
            value,
            timestamp_ms: at,
        };
        let mut points = Vec::with_capacity(5);
        match ctx.provider.stats(&instance).await {
            Ok(Some(stats)) => {
                points.push(point(CPU_PERCENT, stats.cpu_percent));
                points.push(point(MEMORY_BYTES, stats.memory_bytes as f64));
            }
            Ok(None) => {}
            Err(error) => {
                tracing::debug!(job_id = %instance.job_id, error = %error, "cannot read the instance's stats")
            }
        }
        if let Some(system) = system.as_mut() {
            system.refresh_cpu_usage();
            system.refresh_memory();
            points.push(point(HOST_CPU_PERCENT, f64::from(system.global_cpu_usage())));
            points.push(point(HOST_MEMORY_USED_BYTES, system.used_memory() as f64));
        }
        if let Some(sampler) = &ctx.sampler
            && !gpu_devices.is_empty()
            && let Some(utilization) = sampler.utilization(&gpu_devices).await
        {
            points.push(point(GPU_PERCENT, utilization));
        }
        let batch = MetricBatch {
            job_id: instance.job_id.clone(),
            attempt: instance.attempt,
            points,
            columns: None,
        };
        let node = if rank == 0 { String::new() } else { rank.to_string() };
        let msg_id = format!("{}:{}:sys{node}:{step}", instance.job_id, instance.attempt);
        if tx.send((msg_id, Bytes::from(batch.encode_to_vec()))).await.is_err() {
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_gang_nodes_system_metrics_carry_its_rank_but_node_0s() {
        assert_eq!(node_key(0, CPU_PERCENT), "sys/cpu_percent");
        assert_eq!(node_key(2, CPU_PERCENT), "sys/node2/cpu_percent");
        assert_eq!(node_key(1, GPU_PERCENT), "sys/node1/gpu_percent");
    }
}
