//! Parsing and printing sizes, durations and jobs, and the output layer every command prints
//! through: [`out!`] writes a line to stdout and returns an error instead of panicking when
//! stdout is closed (`kiln ps | head`); `main` ends quietly on that error ([`is_broken_pipe`]).

use kiln_proto::v1 as pb;
use serde_json::json;

/// How a listing or a record is printed: `-o table` (the default) or `-o json`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Output {
    Table,
    Json,
}

/// Writes one line to stdout, like `println!`, but returns the write error (with `?`) instead
/// of panicking, so a closed pipe ends the command quietly.
macro_rules! out {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        writeln!(std::io::stdout().lock(), $($arg)*)?
    }};
}
pub(crate) use out;

/// Prints a value as pretty JSON (`-o json`).
pub fn print_json(value: &impl serde::Serialize) -> anyhow::Result<()> {
    out!("{}", serde_json::to_string_pretty(value)?);
    Ok(())
}

/// Whether an error is a write to a closed stdout (the reader of the pipe went away).
pub fn is_broken_pipe(error: &anyhow::Error) -> bool {
    error.chain().any(|cause| {
        cause
            .downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::BrokenPipe)
    })
}

pub use kiln_formats::units::{parse_cpu, parse_duration_secs, parse_size};

/// Parses `KEY=VALUE`.
pub fn parse_env(text: &str) -> Result<(String, String), String> {
    text.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{text:?} is not KEY=VALUE"))
}

pub fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = n as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    if unit == 0 {
        format!("{n}B")
    } else {
        format!("{value:.1}{}", UNITS[unit])
    }
}

pub fn state_name(state: i32) -> String {
    pb::JobState::try_from(state)
        .map(|s| s.as_str_name().trim_start_matches("JOB_STATE_").to_string())
        .unwrap_or_else(|_| "UNKNOWN".into())
}

/// Seconds or minutes since a time in ms.
pub fn age(created_at_ms: i64) -> String {
    let seconds = (kiln_core::ids::now_ms() - created_at_ms).max(0) / 1000;
    match seconds {
        0..60 => format!("{seconds}s"),
        60..3600 => format!("{}m", seconds / 60),
        3600..86400 => format!("{}h", seconds / 3600),
        _ => format!("{}d", seconds / 86400),
    }
}

/// A job's market policy as `kiln run` spells it.
pub fn market_policy(market: i32) -> String {
    match pb::Market::try_from(market) {
        Ok(pb::Market::Spot) => "spot",
        Ok(pb::Market::OnDemand) => "on-demand",
        _ => "auto",
    }
    .to_string()
}

pub fn job_json(job: &pb::Job) -> serde_json::Value {
    let spec = job.spec.clone().unwrap_or_default();
    let resources = spec.resources.unwrap_or_default();
    json!({
        "id": job.id,
        "name": spec.name,
        "project": spec.project,
        "state": state_name(job.state),
        "exit_code": job.exit_code,
        "reason": job.reason,
        "command": spec.command,
        "cpu": f64::from(resources.cpu_millis) / 1000.0,
        "memory_bytes": resources.memory_bytes,
        "disk_bytes": (resources.disk_bytes > 0).then_some(resources.disk_bytes),
        "shm_bytes": (resources.shm_bytes > 0).then_some(resources.shm_bytes),
        "code_digest": spec.code_digest,
        "image": spec.image,
        "gpus": spec.gpus,
        "nodes": (spec.nodes > 1).then(|| json!({
            "count": spec.nodes,
            "rendezvous": job.rendezvous,
            "states": job.nodes.iter().map(|node| match node.exit_code {
                Some(code) => format!("{} {} on {} (exit {code})", node.rank, node.state, node.runner_id),
                None => format!("{} {} on {}", node.rank, node.state, node.runner_id),
            }).collect::<Vec<_>>(),
        })),
        "max_runtime_secs": (spec.max_runtime_secs > 0).then_some(spec.max_runtime_secs),
        "datasets": spec.datasets,
        // Names only: no read returns a value.
        "secrets": spec.secrets.iter().map(|name| format!("{name}={}", kiln_core::secrets::MASK)).collect::<Vec<_>>(),
        "priority": spec.priority_class,
        "market": if job.market.is_empty() { market_policy(spec.market) } else { job.market.clone() },
        "attempt": job.attempt,
        "preemptions": job.preemptions,
        "cost": job.cost,
        "on_demand_cost": job.on_demand_cost,
        "resume_from": (!job.resume_from.is_empty()).then_some(&job.resume_from),
        // The last sync of the outputs while the job ran (periodic or asked for).
        "outputs_synced": (job.outputs_synced_at_ms > 0).then(|| json!({
            "at_ms": job.outputs_synced_at_ms,
            "bytes": job.outputs_synced_bytes,
            "size": bytes(job.outputs_synced_bytes),
        })),
        "version": job.version,
        "pool": job.pool,
        "requested_pool": (!spec.pool.is_empty()).then_some(&spec.pool),
        "runner": job.runner_id,
        "instance": job.instance_id,
        "stop_requested": job.stop_requested,
        "created_at_ms": job.created_at_ms,
        "started_at_ms": (job.started_at_ms > 0).then_some(job.started_at_ms),
        "finished_at_ms": (job.finished_at_ms > 0).then_some(job.finished_at_ms),
        "sweep_id": (!job.sweep_id.is_empty()).then_some(&job.sweep_id),
        "config": config_json(&job.config),
        "summary": config_json(&job.summary),
    })
}

/// A run's config or summary as a JSON object of plain values, sorted by key.
pub fn config_json(values: &std::collections::HashMap<String, pb::ConfigValue>) -> serde_json::Value {
    let config: kiln_core::runs::RunConfig = values
        .iter()
        .filter_map(|(key, value)| Some((key.clone(), kiln_core::runs::ConfigValue::from_proto(value)?)))
        .collect();
    serde_json::json!(config)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn env_pairs_parse() {
        assert_eq!(parse_env("A=b=c").unwrap(), ("A".into(), "b=c".into()));
        assert!(parse_env("A").is_err());
    }
}
