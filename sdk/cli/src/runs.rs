//! `kiln runs ls` and `kiln compare`: tables of runs with their config, state, duration, and the
//! latest and best values of metric keys, filtered by `--where` and sorted by `--sort`.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;

use anyhow::Result;
use kiln_core::runs::{ConfigValue, RunConfig};
use kiln_proto::v1 as pb;
use tabled::settings::Style;

use crate::client::{self, Clients};
use crate::format::{self, Output, out, state_name};

mod filter;

use filter::{Cell, Condition, Goal};

#[derive(Debug, clap::Args)]
pub struct TableArgs {
    /// Metric keys to show, with their latest and best values (repeatable).
    #[arg(long = "key", short = 'k')]
    pub keys: Vec<String>,
    /// Only runs where KEY OP VALUE holds (repeatable; all must). OP is =, !=, <, <=, >, >=;
    /// KEY is a config key, a summary key, or a metric key (its best value; KEY@last for its
    /// latest); e.g. --where 'lr<0.01' --where 'val/loss<=0.3'.
    #[arg(long = "where", short = 'w', value_name = "CONDITION")]
    pub conditions: Vec<String>,
    /// Sort by a column: id, name, state, duration, created, a config or summary key, or a
    /// metric key (its best value; KEY@last for the latest). Ascending unless --desc (or a
    /// leading '-': --sort -val/acc).
    #[arg(long, allow_hyphen_values = true)]
    pub sort: Option<String>,
    #[arg(long, requires = "sort")]
    pub desc: bool,
    /// How a metric's best value is chosen: auto is max for keys naming a score (acc, auc,
    /// f1, precision, recall, score, reward, iou, map, bleu, rouge), min otherwise.
    #[arg(long, value_enum, default_value = "auto")]
    pub goal: Goal,
    #[arg(short, long, value_enum, default_value = "table")]
    pub output: Output,
}

#[derive(Debug, clap::Subcommand)]
pub enum RunsCommand {
    /// List runs (ended ones too), newest first.
    Ls {
        /// Only this project's runs.
        #[arg(long)]
        project: Option<String>,
        /// Only the trials of this sweep.
        #[arg(long)]
        sweep: Option<String>,
        /// Runs of every user in the projects you can read, not only yours.
        #[arg(long)]
        everyone: bool,
        /// At most this many runs (before --where).
        #[arg(long, default_value_t = 100)]
        limit: u32,
        #[command(flatten)]
        table: TableArgs,
    },
}

pub async fn runs(command: RunsCommand) -> Result<ExitCode> {
    let RunsCommand::Ls {
        project,
        sweep,
        everyone,
        limit,
        table,
    } = command;
    let mut clients = client::connect(&client::resolve().await?).await?;
    let request = pb::ListJobsRequest {
        all: true,
        limit,
        project: project.unwrap_or_default(),
        everyone,
        sweep_id: sweep.unwrap_or_default(),
    };
    let jobs = clients.jobs.list_jobs(request).await?.into_inner().jobs;
    print_table(&mut clients, jobs, &table).await
}

/// `kiln compare JOB...`: the same table for the runs named, in the order given.
pub async fn compare(job_ids: Vec<String>, table: TableArgs) -> Result<ExitCode> {
    let mut clients = client::connect(&client::resolve().await?).await?;
    let mut jobs = Vec::with_capacity(job_ids.len());
    for job_id in job_ids {
        jobs.push(clients.jobs.get_job(pb::GetJobRequest { job_id }).await?.into_inner());
    }
    print_table(&mut clients, jobs, &table).await
}

/// The values of a metric key of one run: its last point (step, value) and its best value.
#[derive(Debug, Clone, Copy, Default)]
struct MetricValues {
    latest: Option<(i64, f64)>,
    best: Option<f64>,
}

struct Row {
    job: pb::Job,
    config: RunConfig,
    summary: RunConfig,
    metrics: BTreeMap<String, MetricValues>,
}

fn values(map: &std::collections::HashMap<String, pb::ConfigValue>) -> RunConfig {
    map.iter()
        .filter_map(|(key, value)| Some((key.clone(), ConfigValue::from_proto(value)?)))
        .collect()
}

fn duration_ms(job: &pb::Job) -> Option<i64> {
    if job.started_at_ms == 0 {
        return None;
    }
    let end = if job.finished_at_ms > 0 {
        job.finished_at_ms
    } else {
        kiln_core::ids::now_ms()
    };
    Some((end - job.started_at_ms).max(0))
}

fn human_duration(ms: Option<i64>) -> String {
    let Some(ms) = ms else { return "-".into() };
    let secs = ms / 1000;
    match secs {
        0..60 => format!("{}.{}s", secs, (ms % 1000) / 100),
        60..3600 => format!("{}m{:02}s", secs / 60, secs % 60),
        _ => format!("{}h{:02}m", secs / 3600, (secs % 3600) / 60),
    }
}

impl Row {
    /// The value of a column for `--where` and `--sort`.
    fn cell(&self, key: &str) -> Option<Cell> {
        match key {
            "id" => return Some(Cell::Text(self.job.id.clone())),
            "name" => return Some(Cell::Text(self.job.spec.clone().unwrap_or_default().name)),
            "state" => return Some(Cell::Text(state_name(self.job.state))),
            "duration" => return duration_ms(&self.job).map(|ms| Cell::Number(ms as f64 / 1000.0)),
            "created" => return Some(Cell::Number(self.job.created_at_ms as f64)),
            _ => {}
        }
        if let Some(metric) = key.strip_suffix("@last") {
            return self.metrics.get(metric)?.latest.map(|(_, value)| Cell::Number(value));
        }
        if let Some(value) = self.config.get(key).or_else(|| self.summary.get(key)) {
            return Some(Cell::of(value));
        }
        self.metrics.get(key)?.best.map(Cell::Number)
    }
}

/// Metric keys a column or condition names that no run has as config or summary key.
fn metric_keys(table: &TableArgs, conditions: &[Condition], rows: &[Row]) -> Vec<String> {
    const BUILT_IN: [&str; 5] = ["id", "name", "state", "duration", "created"];
    let mut keys: BTreeSet<String> = table.keys.iter().cloned().collect();
    let sort = table.sort.as_deref().map(|key| key.strip_prefix('-').unwrap_or(key));
    let named = conditions.iter().map(|c| c.key.as_str()).chain(sort);
    for key in named {
        let key = key.strip_suffix("@last").unwrap_or(key);
        let is_value = rows
            .iter()
            .any(|row| row.config.contains_key(key) || row.summary.contains_key(key));
        if !BUILT_IN.contains(&key) && !is_value {
            keys.insert(key.to_string());
        }
    }
    keys.into_iter().collect()
}

/// Fills the rows' metrics: the last point of each key (LatestMetrics) and its best value
/// over every point (QueryMetrics keeps each bucket's lowest and highest point, so the global
/// min and max survive downsampling).
async fn fetch_metrics(clients: &mut Clients, rows: &mut [Row], keys: &[String], goal: Goal) -> Result<()> {
    if keys.is_empty() || rows.is_empty() {
        return Ok(());
    }
    let mut found: BTreeMap<(String, String), MetricValues> = BTreeMap::new();
    let ids: Vec<String> = rows.iter().map(|row| row.job.id.clone()).collect();
    for part in ids.chunks(50) {
        let latest = pb::LatestMetricsRequest {
            job_ids: part.to_vec(),
            keys: keys.to_vec(),
        };
        for series in clients.logs.latest_metrics(latest).await?.into_inner().series {
            if let Some(point) = series.points.last() {
                found.entry((series.job_id, series.key)).or_default().latest = Some((point.step, point.value));
            }
        }
        let query = pb::QueryMetricsRequest {
            job_ids: part.to_vec(),
            keys: keys.to_vec(),
            max_points: 1000,
            ..Default::default()
        };
        for series in clients.logs.query_metrics(query).await?.into_inner().series {
            let maximize = goal.maximizes(&series.key);
            let best = series
                .points
                .iter()
                .map(|point| point.value)
                .filter(|value| !value.is_nan())
                .reduce(|a, b| if maximize { a.max(b) } else { a.min(b) });
            found.entry((series.job_id, series.key)).or_default().best = best;
        }
    }
    for row in rows {
        for key in keys {
            let values = found.remove(&(row.job.id.clone(), key.clone())).unwrap_or_default();
            row.metrics.insert(key.clone(), values);
        }
    }
    Ok(())
}

fn number(value: f64) -> serde_json::Value {
    if value.is_finite() {
        serde_json::json!(value)
    } else {
        serde_json::json!(value.to_string())
    }
}

async fn print_table(clients: &mut Clients, jobs: Vec<pb::Job>, table: &TableArgs) -> Result<ExitCode> {
    let conditions = table
        .conditions
        .iter()
        .map(|text| Condition::parse(text))
        .collect::<Result<Vec<_>>>()?;
    let mut rows: Vec<Row> = jobs
        .into_iter()
        .map(|job| Row {
            config: values(&job.config),
            summary: values(&job.summary),
            job,
            metrics: BTreeMap::new(),
        })
        .collect();
    let keys = metric_keys(table, &conditions, &rows);
    fetch_metrics(clients, &mut rows, &keys, table.goal).await?;
    rows.retain(|row| conditions.iter().all(|c| c.holds(row.cell(&c.key).as_ref())));
    if let Some(sort) = &table.sort {
        let (sort, desc) = match sort.strip_prefix('-') {
            Some(key) => (key, true),
            None => (sort.as_str(), table.desc),
        };
        // Runs without the column go last either way.
        rows.sort_by(|a, b| match (a.cell(sort), b.cell(sort)) {
            (Some(a), Some(b)) if desc => b.compare(&a),
            (Some(a), Some(b)) => a.compare(&b),
            (a, b) => a.is_none().cmp(&b.is_none()),
        });
    }
    if table.output == Output::Json {
        let json: Vec<serde_json::Value> = rows.iter().map(|row| row_json(row, table.goal)).collect();
        format::print_json(&json)?;
        return Ok(ExitCode::SUCCESS);
    }
    let config_keys: BTreeSet<&String> = rows.iter().flat_map(|row| row.config.keys()).collect();
    let mut builder = tabled::builder::Builder::default();
    let mut header: Vec<String> = ["ID", "NAME", "STATE", "DURATION"].map(String::from).to_vec();
    header.extend(config_keys.iter().map(|key| key.to_string()));
    for key in &keys {
        let goal = if table.goal.maximizes(key) { "max" } else { "min" };
        header.push(format!("{key} (last)"));
        header.push(format!("{key} ({goal})"));
    }
    builder.push_record(header);
    for row in &rows {
        let spec = row.job.spec.clone().unwrap_or_default();
        let mut record = vec![
            row.job.id.clone(),
            spec.name,
            state_name(row.job.state),
            human_duration(duration_ms(&row.job)),
        ];
        record.extend(config_keys.iter().map(|key| {
            row.config
                .get(*key)
                .map(ToString::to_string)
                .unwrap_or_else(|| "-".into())
        }));
        for key in &keys {
            let values = row.metrics.get(key).copied().unwrap_or_default();
            record.push(
                values
                    .latest
                    .map(|(_, v)| format!("{v:.6}"))
                    .unwrap_or_else(|| "-".into()),
            );
            record.push(values.best.map(|v| format!("{v:.6}")).unwrap_or_else(|| "-".into()));
        }
        builder.push_record(record);
    }
    out!("{}", builder.build().with(Style::blank()));
    Ok(ExitCode::SUCCESS)
}

fn row_json(row: &Row, goal: Goal) -> serde_json::Value {
    let spec = row.job.spec.clone().unwrap_or_default();
    let metrics: serde_json::Map<String, serde_json::Value> = row
        .metrics
        .iter()
        .map(|(key, values)| {
            let value = serde_json::json!({
                "latest": values.latest.map(|(_, v)| number(v)),
                "latest_step": values.latest.map(|(step, _)| step),
                "best": values.best.map(number),
                "goal": if goal.maximizes(key) { "max" } else { "min" },
            });
            (key.clone(), value)
        })
        .collect();
    serde_json::json!({
        "id": row.job.id,
        "name": spec.name,
        "project": spec.project,
        "state": state_name(row.job.state),
        "sweep_id": row.job.sweep_id,
        "duration_s": duration_ms(&row.job).map(|ms| ms as f64 / 1000.0),
        "created_at_ms": row.job.created_at_ms,
        "config": row.config,
        "summary": row.summary,
        "metrics": metrics,
    })
}
