//! `kiln metrics`: jobs' latest values, or their series.

use std::process::ExitCode;

use anyhow::Result;
use kiln_proto::v1 as pb;
use tabled::settings::Style;

use crate::client;
use crate::format::{self, out};

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum MetricsOutput {
    Table,
    Json,
    Csv,
}

#[derive(Debug, clap::Args)]
pub struct MetricsArgs {
    /// One job or several (their series side by side, with a job column).
    #[arg(required = true, num_args = 1..)]
    pub jobs: Vec<String>,
    /// Only these keys (repeatable); all by default.
    #[arg(long = "key", short = 'k')]
    pub keys: Vec<String>,
    /// Print every point of the series (downsampled to --max-points) instead of the latest values.
    #[arg(long)]
    pub series: bool,
    /// Points per series with --series.
    #[arg(long, default_value_t = 1000)]
    pub max_points: u32,
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: MetricsOutput,
}

/// Formats a value as Rust and JSON readers expect: NaN and the infinities by name.
fn number(value: f64) -> serde_json::Value {
    if value.is_finite() {
        serde_json::json!(value)
    } else {
        serde_json::json!(value.to_string())
    }
}

pub async fn metrics(args: MetricsArgs) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    let series = if args.series {
        let request = pb::QueryMetricsRequest {
            job_ids: args.jobs.clone(),
            keys: args.keys,
            max_points: args.max_points,
            ..Default::default()
        };
        clients.logs.query_metrics(request).await?.into_inner().series
    } else {
        let request = pb::LatestMetricsRequest {
            job_ids: args.jobs.clone(),
            keys: args.keys,
        };
        clients.logs.latest_metrics(request).await?.into_inner().series
    };
    // One job prints as before; several get a job column (first), in the order given.
    let several = args.jobs.len() > 1;
    let order = |job: &str| args.jobs.iter().position(|j| j == job).unwrap_or(usize::MAX);
    let mut series = series;
    series.sort_by(|a, b| order(&a.job_id).cmp(&order(&b.job_id)).then(a.key.cmp(&b.key)));
    let rows: Vec<(&str, &str, &pb::MetricPoint)> = series
        .iter()
        .flat_map(|s| s.points.iter().map(move |p| (s.job_id.as_str(), s.key.as_str(), p)))
        .collect();
    match args.output {
        MetricsOutput::Json => {
            let rows: Vec<serde_json::Value> = rows
                .iter()
                .map(|(job, key, p)| serde_json::json!({"job_id": job, "key": key, "step": p.step, "value": number(p.value), "timestamp_ms": p.timestamp_ms}))
                .collect();
            format::print_json(&rows)?;
        }
        MetricsOutput::Csv => {
            out!("{}key,step,value,timestamp_ms", if several { "job_id," } else { "" });
            for (job, key, p) in rows {
                let key = if key.contains([',', '"']) {
                    format!("\"{}\"", key.replace('"', "\"\""))
                } else {
                    key.to_string()
                };
                let job = if several { format!("{job},") } else { String::new() };
                out!("{job}{key},{},{},{}", p.step, p.value, p.timestamp_ms);
            }
        }
        MetricsOutput::Table => {
            let mut builder = tabled::builder::Builder::default();
            let mut header = vec!["KEY", "STEP", "VALUE"];
            if several {
                header.insert(0, "JOB");
            }
            builder.push_record(header);
            for (job, key, p) in rows {
                let mut record = vec![key.to_string(), p.step.to_string(), p.value.to_string()];
                if several {
                    record.insert(0, job.to_string());
                }
                builder.push_record(record);
            }
            out!("{}", builder.build().with(Style::blank()));
        }
    }
    Ok(ExitCode::SUCCESS)
}
