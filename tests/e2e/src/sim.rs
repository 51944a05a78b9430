//! Scheduling tests on the `sim` provider: a simulated cloud, its runner, jobs sized for it, and
//! more users than the stack's admin.

use kiln_proto::v1 as pb;
use kiln_runner::provider::sim::{InstanceType, SimConfig};

use crate::Stack;

pub const GIB: i64 = 1 << 30;

/// A runner of pool `local` on the simulated cloud `sim`, sized by the cloud alone.
pub fn sim_runner(stack: &Stack, sim: SimConfig) -> kiln_runner::Config {
    let mut config = stack.runner_config("sim-1");
    config.provider = kiln_runner::ProviderKind::Sim;
    config.cpu_millis = 0;
    config.memory_bytes = 0;
    config.metrics_interval_ms = 3_600_000;
    config.sim = sim;
    config
}

/// One instance type, `count` of them, booting at once.
pub fn cloud(instance: InstanceType, count: usize, spot: bool) -> SimConfig {
    SimConfig {
        instance_types: vec![instance],
        spot,
        boot_min_ms: 10,
        boot_max_ms: 50,
        preemptions_per_hour: 0.0,
        max_instances: count,
        time_scale: 1.0,
        ..SimConfig::default()
    }
}

/// Two cores and 4 GiB.
pub fn cpu_box() -> InstanceType {
    InstanceType {
        name: "c.large".into(),
        cpu_millis: 2000,
        memory_bytes: 4 * GIB,
        gpus: 0,
        on_demand_per_hour: 0.085,
        spot_per_hour: 0.03,
    }
}

/// A job of `cpu_millis`, 1 GiB and `gpus`.
pub fn job_spec(command: &[&str], cpu_millis: u32, gpus: u32) -> pb::JobSpec {
    pb::JobSpec {
        gpus,
        resources: Some(pb::Resources {
            cpu_millis,
            memory_bytes: GIB as u64,
            ..Default::default()
        }),
        ..crate::spec(command)
    }
}

/// A user who is not an admin but a member of the `default` project, and a token of theirs.
pub async fn user(stack: &Stack, name: &str) -> String {
    stack.member(name).await
}

/// Submits as the owner of `token`.
pub async fn submit_as(stack: &Stack, token: &str, spec: pb::JobSpec) -> Result<pb::Job, tonic::Status> {
    let response = stack
        .jobs_as(token)
        .await
        .submit_job(pb::SubmitJobRequest {
            spec: Some(spec),
            ..Default::default()
        })
        .await?;
    Ok(response.into_inner().job.unwrap())
}

/// The admin's `ExplainJob` of a job.
pub async fn explain(stack: &Stack, job_id: &str) -> pb::Explanation {
    stack
        .jobs()
        .await
        .explain_job(pb::GetJobRequest { job_id: job_id.into() })
        .await
        .unwrap()
        .into_inner()
}
