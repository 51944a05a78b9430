//! `kiln metrics`: a job's latest values, or its series.

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
    pub job: String,
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
    let mut clients = client::connect(&client::resolve()?).await?;
    let series = if args.series {
        let request = pb::QueryMetricsRequest {
            job_ids: vec![args.job],
            keys: args.keys,
            max_points: args.max_points,
            ..Default::default()
        };
        clients.logs.query_metrics(request).await?.into_inner().series
    } else {
        let request = pb::LatestMetricsRequest {
            job_ids: vec![args.job],
            keys: args.keys,
        };
        clients.logs.latest_metrics(request).await?.into_inner().series
    };
    let rows: Vec<(&str, &pb::MetricPoint)> = series
        .iter()
        .flat_map(|s| s.points.iter().map(move |p| (s.key.as_str(), p)))
        .collect();
    match args.output {
        MetricsOutput::Json => {
            let rows: Vec<serde_json::Value> = rows
                .iter()
                .map(|(key, p)| serde_json::json!({"key": key, "step": p.step, "value": number(p.value), "timestamp_ms": p.timestamp_ms}))
                .collect();
            format::print_json(&rows)?;
        }
        MetricsOutput::Csv => {
            out!("key,step,value,timestamp_ms");
            for (key, p) in rows {
                let key = if key.contains([',', '"']) {
                    format!("\"{}\"", key.replace('"', "\"\""))
                } else {
                    key.to_string()
                };
                out!("{key},{},{},{}", p.step, p.value, p.timestamp_ms);
            }
        }
        MetricsOutput::Table => {
            let mut builder = tabled::builder::Builder::default();
            builder.push_record(["KEY", "STEP", "VALUE"]);
            for (key, p) in rows {
                builder.push_record([key.to_string(), p.step.to_string(), p.value.to_string()]);
            }
            out!("{}", builder.build().with(Style::blank()));
        }
    }
    Ok(ExitCode::SUCCESS)
}
