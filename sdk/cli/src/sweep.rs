//! `kiln sweep`: hyper-parameter sweeps run by the advisor — create from a YAML spec (packing
//! the working directory as `kiln run` does, so every trial runs that code), status, ls, stop,
//! resume and best.

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use kiln_core::runs::ConfigValue;
use kiln_proto::v1 as pb;
use serde_json::json;
use tabled::settings::Style;

use crate::client;
use crate::format::{self, Output, out};
use crate::pack;

#[derive(Debug, clap::Subcommand)]
pub enum SweepCommand {
    /// Start a sweep from a spec (see the README); prints its id on the last line.
    Create {
        /// The sweep spec (YAML); `-` reads stdin.
        #[arg(short = 'f', long = "file")]
        file: PathBuf,
        /// The directory packed and uploaded as every trial's code (default: the current one).
        #[arg(long, conflicts_with = "no_code")]
        code: Option<PathBuf>,
        /// Do not pack any code (the trial command is in the image or on the machine).
        #[arg(long)]
        no_code: bool,
        /// The project (default: the spec's `project`, else `default`).
        #[arg(long)]
        project: Option<String>,
    },
    /// A sweep's state and trials.
    Status {
        sweep: String,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Sweeps you may see (live ones; --all for finished ones too).
    Ls {
        #[arg(short, long)]
        all: bool,
        #[arg(long)]
        project: Option<String>,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
    /// Stop a sweep: no more trials start, running ones are stopped.
    Stop { sweep: String },
    /// Let a stopped sweep go on within its budget.
    Resume { sweep: String },
    /// The best trial so far: its job, knobs and objective value.
    Best {
        sweep: String,
        #[arg(short, long, value_enum, default_value = "table")]
        output: Output,
    },
}

pub async fn sweep(command: SweepCommand) -> Result<ExitCode> {
    let credentials = client::resolve().await?;
    let mut clients = client::connect(&credentials).await?;
    match command {
        SweepCommand::Create {
            file,
            code,
            no_code,
            project,
        } => {
            let spec_yaml = if file.as_os_str() == "-" {
                std::io::read_to_string(std::io::stdin()).context("cannot read the spec from stdin")?
            } else {
                std::fs::read_to_string(&file).with_context(|| format!("cannot read {}", file.display()))?
            };
            let mut code_digest = String::new();
            if !no_code {
                let root = match code {
                    Some(dir) => dir,
                    None => std::env::current_dir()?,
                };
                let bundle = tokio::task::spawn_blocking(move || pack::pack(&root)).await??;
                // The code goes to the sweep's project: the flag's, else the spec's.
                let spec_project = kiln_advisor::spec::parse(&spec_yaml)
                    .map(|checked| checked.spec.project)
                    .unwrap_or_default();
                let target = project.clone().unwrap_or(spec_project);
                pack::upload(&mut clients, &bundle, &target, "uploading code").await?;
                code_digest = bundle.digest;
            }
            let sweep = clients
                .sweeps
                .create_sweep(pb::CreateSweepRequest {
                    spec_yaml,
                    code_digest,
                    project: project.unwrap_or_default(),
                    idempotency_key: String::new(),
                })
                .await?
                .into_inner();
            out!(
                "sweep {} created: {} trials at most, {} at a time",
                sweep.name,
                sweep.max_trials,
                sweep.max_parallel
            );
            out!("{}", sweep.id);
        }
        SweepCommand::Status { sweep, output } => {
            let sweep = clients
                .sweeps
                .get_sweep(pb::GetSweepRequest { sweep_id: sweep })
                .await?
                .into_inner();
            match output {
                Output::Json => format::print_json(&sweep_json(&sweep))?,
                Output::Table => print_status(&sweep)?,
            }
        }
        SweepCommand::Ls { all, project, output } => {
            let sweeps = clients
                .sweeps
                .list_sweeps(pb::ListSweepsRequest {
                    project: project.unwrap_or_default(),
                    all,
                })
                .await?
                .into_inner()
                .sweeps;
            if output == Output::Json {
                let sweeps: Vec<_> = sweeps.iter().map(sweep_json).collect();
                return format::print_json(&sweeps).map(|()| ExitCode::SUCCESS);
            }
            let mut table = tabled::builder::Builder::default();
            table.push_record(["ID", "NAME", "STATE", "TRIALS", "BEST", "AGE"]);
            for sweep in &sweeps {
                let counts = sweep.counts.unwrap_or_default();
                table.push_record([
                    sweep.id.clone(),
                    sweep.name.clone(),
                    sweep.state.clone(),
                    format!("{}/{}", counts.suggested, sweep.max_trials),
                    best_value(sweep),
                    format::age(sweep.created_at_ms),
                ]);
            }
            out!("{}", table.build().with(Style::blank()));
        }
        SweepCommand::Stop { sweep } => {
            let sweep = clients
                .sweeps
                .stop_sweep(pb::GetSweepRequest { sweep_id: sweep })
                .await?
                .into_inner();
            out!("sweep {} is {}", sweep.id, sweep.state);
        }
        SweepCommand::Resume { sweep } => {
            let sweep = clients
                .sweeps
                .resume_sweep(pb::GetSweepRequest { sweep_id: sweep })
                .await?
                .into_inner();
            out!("sweep {} is {}", sweep.id, sweep.state);
        }
        SweepCommand::Best { sweep, output } => {
            let trial = clients
                .sweeps
                .best_trial(pb::GetSweepRequest { sweep_id: sweep })
                .await?
                .into_inner();
            match output {
                Output::Json => format::print_json(&trial_json(&trial))?,
                Output::Table => {
                    out!("trial {}  job {}  {}", trial.index, trial.job_id, trial.state);
                    out!("value   {}", trial.value.map(|v| v.to_string()).unwrap_or_default());
                    out!("config  {}", config_text(&trial.config));
                }
            }
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn best_value(sweep: &pb::Sweep) -> String {
    sweep
        .best
        .as_ref()
        .and_then(|best| best.value)
        .map(|value| format!("{value:.6}"))
        .unwrap_or_else(|| "-".into())
}

fn print_status(sweep: &pb::Sweep) -> Result<()> {
    let counts = sweep.counts.unwrap_or_default();
    out!("sweep     {} ({})", sweep.id, sweep.name);
    out!(
        "state     {}{}",
        sweep.state,
        if sweep.reason.is_empty() {
            String::new()
        } else {
            format!(": {}", sweep.reason)
        }
    );
    if !sweep.paused_reason.is_empty() {
        out!(
            "paused    {}\n          no trials run: once the owner may run jobs again, `kiln sweep resume {}`",
            sweep.paused_reason,
            sweep.id
        );
    }
    out!("objective {} {}", sweep.goal, sweep.objective_metric);
    out!("search    {}, early stop {}", sweep.algorithm, sweep.early_stop);
    out!(
        "trials    {}/{} suggested, {} running, {} succeeded, {} stopped early, {} failed",
        counts.suggested,
        sweep.max_trials,
        counts.running,
        counts.succeeded,
        counts.stopped,
        counts.failed
    );
    if sweep.gpu_hours > 0.0 {
        out!("gpu-hours {:.3}", sweep.gpu_hours);
    }
    out!("best      {}", best_value(sweep));
    if !sweep.registered.is_empty() {
        out!("model     {}", sweep.registered);
    }
    let mut table = tabled::builder::Builder::default();
    table.push_record(["TRIAL", "JOB", "STATE", "VALUE", "RESOURCE", "CONFIG"]);
    for trial in &sweep.trials {
        table.push_record([
            trial.index.to_string(),
            trial.job_id.clone(),
            trial.state.clone(),
            trial.value.map(|value| format!("{value:.6}")).unwrap_or_default(),
            trial.resource.to_string(),
            config_text(&trial.config),
        ]);
    }
    out!("{}", table.build().with(Style::blank()));
    Ok(())
}

/// `a=1 b=adam`, in key order.
fn config_text(config: &std::collections::HashMap<String, pb::ConfigValue>) -> String {
    let mut entries: Vec<_> = config.iter().collect();
    entries.sort_by(|a, b| a.0.cmp(b.0));
    entries
        .into_iter()
        .filter_map(|(key, value)| Some(format!("{key}={}", ConfigValue::from_proto(value)?)))
        .collect::<Vec<_>>()
        .join(" ")
}

fn config_json(config: &std::collections::HashMap<String, pb::ConfigValue>) -> serde_json::Value {
    let config: std::collections::BTreeMap<&String, ConfigValue> = config
        .iter()
        .filter_map(|(key, value)| Some((key, ConfigValue::from_proto(value)?)))
        .collect();
    json!(config)
}

fn trial_json(trial: &pb::Trial) -> serde_json::Value {
    json!({
        "index": trial.index,
        "job_id": trial.job_id,
        "state": trial.state,
        "config": config_json(&trial.config),
        "value": trial.value,
        "resource": trial.resource,
        "reason": trial.reason,
        "preemptions": trial.preemptions,
    })
}

fn sweep_json(sweep: &pb::Sweep) -> serde_json::Value {
    let counts = sweep.counts.unwrap_or_default();
    json!({
        "id": sweep.id,
        "name": sweep.name,
        "project": sweep.project,
        "state": sweep.state,
        "reason": sweep.reason,
        "paused_reason": sweep.paused_reason,
        "objective": {"metric": sweep.objective_metric, "goal": sweep.goal},
        "algorithm": sweep.algorithm,
        "early_stop": sweep.early_stop,
        "max_trials": sweep.max_trials,
        "max_parallel": sweep.max_parallel,
        "counts": {
            "suggested": counts.suggested,
            "running": counts.running,
            "succeeded": counts.succeeded,
            "stopped": counts.stopped,
            "failed": counts.failed,
        },
        "gpu_hours": sweep.gpu_hours,
        "best": sweep.best.as_ref().map(trial_json),
        "registered": sweep.registered,
        "trials": sweep.trials.iter().map(trial_json).collect::<Vec<_>>(),
        "created_at_ms": sweep.created_at_ms,
        "finished_at_ms": sweep.finished_at_ms,
    })
}
