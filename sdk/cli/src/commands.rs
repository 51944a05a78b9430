//! The client commands: run, ps, status, explain, stop (logs and grep: `job_logs`).

use std::path::PathBuf;
use std::process::ExitCode;

use anyhow::{Context, Result};
use kiln_proto::v1 as pb;
use tabled::settings::Style;

use crate::client;
use crate::format::{self, Output, job_json, out, state_name};
use crate::{job_logs, pack};

#[derive(Debug, clap::Args)]
pub struct RunArgs {
    /// CPU cores (0.5 is half a core).
    #[arg(long, default_value = "1", value_parser = format::parse_cpu)]
    pub cpu: u32,
    /// Memory, such as 512M or 4G.
    #[arg(long, default_value = "1G", value_parser = format::parse_size)]
    pub mem: u64,
    /// The job's own disk, such as 20G: a volume of that size holding /kiln/code, /kiln/outputs
    /// and /tmp, where writing past it fails (needs --image; counted in placement).
    #[arg(long, value_parser = format::parse_size)]
    pub disk: Option<u64>,
    /// Size of /dev/shm, such as 1G (Docker's default is 64M); counts against --mem.
    #[arg(long, value_parser = format::parse_size)]
    pub shm: Option<u64>,
    /// Environment variable for the job, KEY=VALUE (repeatable).
    #[arg(long = "env", short = 'e', value_parser = format::parse_env)]
    pub env: Vec<(String, String)>,
    /// Name of the job (default: the program's name).
    #[arg(long)]
    pub name: Option<String>,
    /// Project the job belongs to.
    #[arg(long)]
    pub project: Option<String>,
    /// Directory to pack as the job's code (default: the current directory).
    #[arg(long)]
    pub code: Option<PathBuf>,
    /// Do not pack and upload any code.
    #[arg(long, conflicts_with = "code")]
    pub no_code: bool,
    /// Container image to run in (default: a local process, when kiln runs one).
    #[arg(long)]
    pub image: Option<String>,
    /// GPUs the job needs (on each node).
    #[arg(long, default_value_t = 0)]
    pub gpus: u32,
    /// Nodes of a gang job: N instances of this shape, started together or not at all, each
    /// told its rank and the rendezvous (KILN_NODE_RANK, MASTER_ADDR, ... see the README).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub nodes: u32,
    /// Stop the job after this long (for example 90s, 30m, 2h).
    #[arg(long, value_parser = format::parse_duration_secs)]
    pub max_runtime: Option<u64>,
    /// Dataset to mount read-only at /kiln/data/NAME (repeatable).
    #[arg(long = "dataset")]
    pub datasets: Vec<String>,
    /// Project secret to set as the environment variable of its name (repeatable; `kiln secret set`).
    #[arg(long = "secret")]
    pub secrets: Vec<String>,
    /// Priority class: low, normal or high (high may preempt lower classes).
    #[arg(long, default_value = "normal")]
    pub priority: String,
    /// Run on spot instances only.
    #[arg(long, conflicts_with = "on_demand")]
    pub spot: bool,
    /// Run on on-demand instances only (the default, auto, lets the scheduler choose).
    #[arg(long)]
    pub on_demand: bool,
    /// Run only on this pool (default: any pool that fits).
    #[arg(long)]
    pub pool: Option<String>,
    /// Stream the logs and exit with the job's exit code.
    #[arg(short, long)]
    pub follow: bool,
    /// The command to run, after `--`.
    #[arg(last = true, required = true)]
    pub command: Vec<String>,
}

pub async fn run(args: RunArgs) -> Result<ExitCode> {
    let credentials = client::resolve().await?;
    let mut clients = client::connect(&credentials).await?;
    let code_digest = if args.no_code {
        String::new()
    } else {
        pack::upload_code(&mut clients, args.code, args.project.as_deref().unwrap_or_default()).await?
    };
    let spec = pb::JobSpec {
        name: args.name.unwrap_or_default(),
        command: args.command,
        env: args.env.into_iter().collect(),
        resources: Some(pb::Resources {
            cpu_millis: args.cpu,
            memory_bytes: args.mem,
            disk_bytes: args.disk.unwrap_or(0),
            shm_bytes: args.shm.unwrap_or(0),
        }),
        code_digest,
        project: args.project.unwrap_or_default(),
        image: args.image.unwrap_or_default(),
        gpus: args.gpus,
        max_runtime_secs: args.max_runtime.unwrap_or(0),
        datasets: args.datasets,
        priority_class: args.priority,
        market: match (args.spot, args.on_demand) {
            (true, _) => pb::Market::Spot,
            (_, true) => pb::Market::OnDemand,
            _ => pb::Market::Unspecified,
        } as i32,
        pool: args.pool.unwrap_or_default(),
        secrets: args.secrets,
        nodes: args.nodes,
    };
    // One key for this submit and its retries: an answer lost with a dying api replica is
    // retried without making a second job.
    let request = pb::SubmitJobRequest {
        spec: Some(spec),
        idempotency_key: kiln_core::ids::new_id(),
    };
    let job = client::while_unavailable(async || clients.jobs.submit_job(request.clone()).await)
        .await?
        .into_inner()
        .job
        .context("the server answered without a job")?;
    if !args.follow {
        out!("{}", job.id);
        return Ok(ExitCode::SUCCESS);
    }
    eprintln!("job {} submitted", job.id);
    job_logs::print_logs(&mut clients, &job.id, true, None).await?;
    let job = client::while_unavailable(async || {
        let request = pb::GetJobRequest { job_id: job.id.clone() };
        clients.jobs.get_job(request).await
    })
    .await?
    .into_inner();
    let state = pb::JobState::try_from(job.state).unwrap_or(pb::JobState::Unspecified);
    let reason = if job.reason.is_empty() {
        String::new()
    } else {
        format!(": {}", job.reason)
    };
    eprintln!("job {} {}{reason}", job.id, state_name(job.state));
    let code = match (job.exit_code, state) {
        (Some(code), _) => code.clamp(0, 255) as u8,
        (None, pb::JobState::Succeeded) => 0,
        (None, _) => 1,
    };
    Ok(ExitCode::from(code))
}

pub async fn ps(all: bool, project: Option<String>, everyone: bool, output: Output) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    let jobs = clients
        .jobs
        .list_jobs(pb::ListJobsRequest {
            all,
            limit: 0,
            project: project.unwrap_or_default(),
            everyone,
            sweep_id: String::new(),
        })
        .await?
        .into_inner()
        .jobs;
    if output == Output::Json {
        let jobs: Vec<_> = jobs.iter().map(job_json).collect();
        format::print_json(&jobs)?;
        return Ok(ExitCode::SUCCESS);
    }
    let mut builder = tabled::builder::Builder::default();
    builder.push_record(["ID", "NAME", "STATE", "EXIT", "CPU", "MEM", "AGE"]);
    for job in &jobs {
        let spec = job.spec.clone().unwrap_or_default();
        let resources = spec.resources.unwrap_or_default();
        builder.push_record([
            job.id.clone(),
            spec.name,
            state_name(job.state),
            job.exit_code.map(|c| c.to_string()).unwrap_or_default(),
            format!("{}", f64::from(resources.cpu_millis) / 1000.0),
            format::bytes(resources.memory_bytes),
            format::age(job.created_at_ms),
        ]);
    }
    out!("{}", builder.build().with(Style::blank()));
    Ok(ExitCode::SUCCESS)
}

pub async fn status(job_id: String, output: Output) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    let job = clients.jobs.get_job(pb::GetJobRequest { job_id }).await?.into_inner();
    let saved = crate::saved::saved_files(&mut clients, &job.id, "").await?;
    let mut json = job_json(&job);
    if output == Output::Json {
        json["artifacts"] = serde_json::json!(crate::saved::files_json(&saved));
        format::print_json(&json)?;
        return Ok(ExitCode::SUCCESS);
    }
    if let Some(fields) = json.as_object() {
        for (key, value) in fields {
            // The config and summary print one key a line, after the job's fields.
            if matches!(key.as_str(), "config" | "summary") {
                continue;
            }
            let text = match value {
                serde_json::Value::String(s) => s.clone(),
                serde_json::Value::Null => "-".into(),
                // "1.9GiB, 42s ago": what a resumed attempt would find.
                synced if key == "outputs_synced" => format!(
                    "{}, {} ago",
                    synced["size"].as_str().unwrap_or("-"),
                    format::age(synced["at_ms"].as_i64().unwrap_or(0))
                ),
                other => other.to_string(),
            };
            out!("{key:>15}: {text}");
        }
        for section in ["config", "summary"] {
            let Some(values) = fields
                .get(section)
                .and_then(|v| v.as_object())
                .filter(|v| !v.is_empty())
            else {
                continue;
            };
            out!("{section}:");
            for (key, value) in values {
                let text = value.as_str().map(str::to_string).unwrap_or_else(|| value.to_string());
                out!("  {key} = {text}");
            }
        }
    }
    if !saved.is_empty() {
        out!("artifacts:");
        for file in &saved {
            let path = if file.path.is_empty() {
                file.name.clone()
            } else {
                format!("{}/{}", file.name, file.path)
            };
            out!("  {path} ({})", format::bytes(file.size));
        }
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn explain(job_id: String, output: Output) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    let explanation = clients
        .jobs
        .explain_job(pb::GetJobRequest { job_id })
        .await?
        .into_inner();
    if output == Output::Json {
        let json = serde_json::json!({
            "job_id": explanation.job_id,
            "state": state_name(explanation.state),
            "summary": explanation.summary,
            "jobs_ahead": explanation.jobs_ahead,
            "details": explanation.details,
        });
        format::print_json(&json)?;
        return Ok(ExitCode::SUCCESS);
    }
    out!(
        "{} ({}): {}",
        explanation.job_id,
        state_name(explanation.state),
        explanation.summary
    );
    for detail in &explanation.details {
        out!("  {detail}");
    }
    Ok(ExitCode::SUCCESS)
}

pub async fn stop(job_id: String) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    let job = clients.jobs.stop_job(pb::StopJobRequest { job_id }).await?.into_inner();
    let state = state_name(job.state);
    if job.stop_requested && !matches!(state.as_str(), "STOPPED" | "SUCCEEDED" | "FAILED" | "LOST") {
        out!("{} stopping (SIGTERM, then SIGKILL after the grace period)", job.id);
    } else {
        out!("{} {state}", job.id);
    }
    Ok(ExitCode::SUCCESS)
}
