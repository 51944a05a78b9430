//! `kiln quota set|get|ls|rm`: quotas by scope (global, project:NAME, user:NAME), and the
//! fair-share weights of projects and users.

use std::process::ExitCode;

use anyhow::Result;
use kiln_proto::v1 as pb;
use tabled::settings::Style;

use crate::client;
use crate::format::{self, Output, bytes, out};

#[derive(Debug, clap::Subcommand)]
pub enum QuotaCommand {
    /// Set the limits of a scope (project:NAME by its maintainers, others by the admin); limits left out are unlimited.
    Set {
        /// global, project:NAME or user:NAME.
        scope: String,
        /// CPU cores the scope's running jobs may hold together (0.5 is half a core).
        #[arg(long, value_parser = format::parse_cpu)]
        cpu: Option<u32>,
        /// Memory they may hold together, such as 64G.
        #[arg(long, value_parser = format::parse_size)]
        mem: Option<u64>,
        /// GPUs they may hold together.
        #[arg(long)]
        gpus: Option<u32>,
        /// Jobs of the scope running at once.
        #[arg(long)]
        running_jobs: Option<u32>,
        /// Jobs of the scope waiting in the queue; a submit beyond it is refused.
        #[arg(long)]
        queued_jobs: Option<u32>,
        /// Fair-share weight of a project or user (1 when left out): weight 2 is entitled to
        /// twice the share of weight 1.
        #[arg(long)]
        weight: Option<f64>,
    },
    /// Show the quota of a scope.
    Get {
        scope: String,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// List the quotas you can see.
    Ls {
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Remove the quota of a scope (as for set).
    Rm { scope: String },
}

fn limit(value: Option<i64>, show: impl Fn(i64) -> String) -> String {
    value.map_or_else(|| "-".to_string(), show)
}

fn json(quota: &pb::Quota) -> serde_json::Value {
    serde_json::json!({
        "scope": quota.scope,
        "cpu_millis": quota.cpu_millis,
        "memory_bytes": quota.memory_bytes,
        "gpus": quota.gpus,
        "running_jobs": quota.running_jobs,
        "queued_jobs": quota.queued_jobs,
        "weight": quota.weight,
    })
}

fn print(quotas: &[pb::Quota], output: Output) -> Result<()> {
    if output == Output::Json {
        let all: Vec<_> = quotas.iter().map(json).collect();
        format::print_json(&all)?;
        return Ok(());
    }
    let mut builder = tabled::builder::Builder::default();
    builder.push_record([
        "SCOPE",
        "CPU",
        "MEMORY",
        "GPUS",
        "RUNNING JOBS",
        "QUEUED JOBS",
        "WEIGHT",
    ]);
    for quota in quotas {
        builder.push_record([
            quota.scope.clone(),
            limit(quota.cpu_millis, |m| format!("{}", m as f64 / 1000.0)),
            limit(quota.memory_bytes, |b| bytes(u64::try_from(b).unwrap_or(0))),
            limit(quota.gpus, |n| n.to_string()),
            limit(quota.running_jobs, |n| n.to_string()),
            limit(quota.queued_jobs, |n| n.to_string()),
            quota.weight.map_or_else(|| "-".to_string(), |w| w.to_string()),
        ]);
    }
    out!("{}", builder.build().with(Style::blank()));
    Ok(())
}

pub async fn quota(command: QuotaCommand) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    match command {
        QuotaCommand::Set {
            scope,
            cpu,
            mem,
            gpus,
            running_jobs,
            queued_jobs,
            weight,
        } => {
            let quota = pb::Quota {
                scope,
                cpu_millis: cpu.map(i64::from),
                memory_bytes: mem.map(|m| i64::try_from(m).unwrap_or(i64::MAX)),
                gpus: gpus.map(i64::from),
                running_jobs: running_jobs.map(i64::from),
                queued_jobs: queued_jobs.map(i64::from),
                weight,
            };
            let saved = clients.quotas.set_quota(quota).await?.into_inner();
            print(&[saved], Output::Table)?;
        }
        QuotaCommand::Get { scope, output } => {
            let quota = clients.quotas.get_quota(pb::QuotaRef { scope }).await?.into_inner();
            print(&[quota], output)?;
        }
        QuotaCommand::Ls { output } => {
            let quotas = clients
                .quotas
                .list_quotas(pb::ListQuotasRequest {})
                .await?
                .into_inner()
                .quotas;
            print(&quotas, output)?;
        }
        QuotaCommand::Rm { scope } => {
            let removed = clients.quotas.delete_quota(pb::QuotaRef { scope }).await?.into_inner();
            out!("removed the quota of {}", removed.scope);
        }
    }
    Ok(ExitCode::SUCCESS)
}
