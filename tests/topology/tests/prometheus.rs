//! Every Grafana panel's query, run through a real Prometheus that scrapes the topology while a
//! workload runs: each must return data, and every metric it names must be one kiln exports.
//!
//! Prometheus is Debian's (`KILN_TEST_PROMETHEUS`, default /usr/bin/prometheus), scraping every
//! replica's `metrics.listen` each second under the job names of
//! deploy/compose/prometheus/prometheus.yml, with deploy/compose/prometheus/rules.yml loaded.
//! The workload: jobs that succeed, fail and checkpoint on the process runners, one writing
//! metric points and log lines through the Python SDK, jobs of the simulated spot and on-demand
//! pool, and a batch with an item retried and one dead-lettered.

use crate::{client, dashboards, workload};

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use kiln_proto::v1 as pb;
use kiln_topology::proc::Proc;
use kiln_topology::{Options, Topology};

use client::Clients;
use workload::{
    Kind, get_batch, get_job, sdk_job, sdk_python, spec, start_batch, stored_lines, stored_points, submit, terminal,
};

const PATIENCE: Duration = Duration::from_secs(240);
/// How long Prometheus scrapes before the queries run.
const SCRAPED_FOR: Duration = Duration::from_secs(75);
/// The scrape jobs, as deploy/compose/prometheus/prometheus.yml names them, and the instances
/// of each.
const JOBS: [(&str, &str); 7] = [
    ("kiln-api", "api-"),
    ("kiln-scheduler", "scheduler-"),
    ("kiln-runner", "runner-"),
    ("kiln-log-ingest", "log-ingest-"),
    ("kiln-item-batch", "item-batch-"),
    ("kiln-advisor", "advisor-"),
    ("kiln-predictor", "predictor-"),
];

fn prometheus_binary() -> PathBuf {
    let path = PathBuf::from(std::env::var("KILN_TEST_PROMETHEUS").unwrap_or_else(|_| "/usr/bin/prometheus".into()));
    assert!(
        path.is_file(),
        "{} does not exist: install Debian's prometheus (apt-get install prometheus) or set KILN_TEST_PROMETHEUS",
        path.display()
    );
    path
}

fn compose_prometheus_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../deploy/compose/prometheus")
}

/// The scrape config: every replica of each service under its compose job name.
fn scrape_config(topology: &Topology) -> String {
    let mut text = String::from("global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n");
    let rules = compose_prometheus_dir().join("rules.yml");
    if rules.is_file() {
        text.push_str(&format!("rule_files:\n  - {:?}\n", rules.display().to_string()));
    }
    text.push_str("scrape_configs:\n");
    for (job, prefix) in JOBS {
        let targets: Vec<String> = topology
            .instances()
            .iter()
            .filter(|name| name.starts_with(prefix))
            .map(|name| format!("\"{}\"", topology.metrics_addr(name)))
            .collect();
        assert!(!targets.is_empty(), "no instance of {job}");
        text.push_str(&format!(
            "  - job_name: {job}\n    static_configs:\n      - targets: [{}]\n",
            targets.join(", ")
        ));
    }
    text
}

struct Prometheus {
    proc: Proc,
    url: String,
    http: reqwest::Client,
}

impl Prometheus {
    async fn start(topology: &Topology) -> Prometheus {
        let dir = topology.dir.join("prometheus");
        std::fs::create_dir_all(&dir).expect("prometheus dir");
        let config = dir.join("prometheus.yml");
        std::fs::write(&config, scrape_config(topology)).expect("write prometheus.yml");
        let addr = format!("127.0.0.1:{}", kiln_core::testing::free_port());
        let mut proc = Proc::new(
            "prometheus",
            &prometheus_binary(),
            &[
                &format!("--config.file={}", config.display()),
                &format!("--storage.tsdb.path={}", dir.join("data").display()),
                &format!("--web.listen-address={addr}"),
            ],
            Vec::new(),
            dir.join("prometheus.log"),
        );
        proc.start();
        let prometheus = Prometheus {
            proc,
            url: format!("http://{addr}"),
            http: reqwest::Client::new(),
        };
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let ready = prometheus.http.get(format!("{}/-/ready", prometheus.url)).send().await;
            if ready.is_ok_and(|r| r.status().is_success()) {
                return prometheus;
            }
            assert!(
                Instant::now() < deadline,
                "prometheus did not get ready:\n{}",
                prometheus.proc.log_tail(30)
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// GET an API path; the `data` of its answer, or the error it gave.
    async fn api(&self, path: &str, params: &[(&str, &str)]) -> Result<serde_json::Value, String> {
        let url = reqwest::Url::parse_with_params(&format!("{}{path}", self.url), params).map_err(|e| e.to_string())?;
        let response = self.http.get(url).send().await.map_err(|e| e.to_string())?;
        let body: serde_json::Value = serde_json::from_str(&response.text().await.map_err(|e| e.to_string())?)
            .map_err(|e| format!("not JSON: {e}"))?;
        if body["status"] != "success" {
            return Err(format!("{}: {}", body["errorType"], body["error"]));
        }
        Ok(body["data"].clone())
    }

    /// Runs an instant query: Ok(true) when it returned data.
    async fn has_data(&self, query: &str) -> Result<bool, String> {
        let data = self.api("/api/v1/query", &[("query", query)]).await?;
        Ok(match data["resultType"].as_str() {
            Some("scalar" | "string") => true,
            _ => data["result"].as_array().is_some_and(|result| !result.is_empty()),
        })
    }

    /// Every target's health: the ones not up, with their error.
    async fn targets_down(&self) -> Vec<String> {
        let data = self.api("/api/v1/targets", &[]).await.expect("targets");
        data["activeTargets"]
            .as_array()
            .into_iter()
            .flatten()
            .filter(|target| target["health"] != "up")
            .map(|target| {
                format!(
                    "{} {}: {}",
                    target["labels"]["job"], target["scrapeUrl"], target["lastError"]
                )
            })
            .collect()
    }
}

async fn run_workload(topology: &Topology) {
    let clients = Clients {
        token: topology.token.clone(),
        api: vec![topology.url("api-1"), topology.url("api-2")],
        logs: vec![topology.url("log-ingest-1"), topology.url("log-ingest-2")],
        batches: vec![topology.url("item-batch-1"), topology.url("item-batch-2")],
    };
    // Twenty items: `d-0` fails every attempt (a dead letter), `f-1` succeeds on its third.
    let batch_id = start_batch(&clients, 20).await;
    let sdk = submit(&clients, spec("sdk", sdk_job(&sdk_python(), 2_000, 200)))
        .await
        .id;
    let mut jobs = vec![sdk.clone()];
    let mut kinds = Vec::new();
    for n in 0..6 {
        let id = submit(&clients, spec(&format!("job-{n}"), Kind::of(n).command()))
            .await
            .id;
        kinds.push((id.clone(), Kind::of(n)));
        jobs.push(id);
    }
    for (n, market) in [pb::Market::Spot, pb::Market::Spot, pb::Market::OnDemand]
        .into_iter()
        .enumerate()
    {
        let mut sim = spec(&format!("sim-{n}"), vec!["sleep".into(), "2".into()]);
        sim.pool = "sim".into();
        sim.market = market.into();
        jobs.push(submit(&clients, sim).await.id);
    }
    let deadline = Instant::now() + PATIENCE;
    loop {
        let mut open = Vec::new();
        for id in &jobs {
            let job = get_job(&clients, id).await;
            if !terminal(&job) {
                open.push(format!("{} {:?}", job.id, pb::JobState::try_from(job.state)));
            }
        }
        let batch = get_batch(&clients, &batch_id).await;
        let batch_done = batch.state == i32::from(pb::BatchState::Done);
        if open.is_empty() && batch_done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the workload did not end: jobs {open:?}, batch {:?}",
            batch.counts
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    for (id, kind) in kinds {
        let job = get_job(&clients, &id).await;
        let (state, code) = kind.expected();
        assert_eq!(
            (job.state, job.exit_code),
            (i32::from(state), Some(code)),
            "job {id} ({kind:?})"
        );
    }
    assert_eq!(
        stored_points(&clients, &sdk, 2_000).await.len(),
        2_000,
        "the SDK job's points"
    );
    let lines = stored_lines(&clients, &sdk, 1).await;
    let printed = lines.iter().filter(|line| line.starts_with("line ")).count();
    assert_eq!(printed, 200, "the SDK job's log lines: {lines:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_dashboard_query_returns_data_from_a_real_prometheus() {
    let panels = dashboards::queries();
    assert!(
        !panels.is_empty(),
        "no panel queries in deploy/compose/grafana/dashboards"
    );
    let mut topology = Topology::start(Options::from_env()).await;
    let prometheus = Prometheus::start(&topology).await;
    let scraping = Instant::now();

    run_workload(&topology).await;

    // A few scrapes after the workload's end (and the gauges' refresh), and series a minute and
    // more long: a panel's `rate(...[1m:15s])` subquery needs two 15 s steps of its series.
    let settled = (scraping + SCRAPED_FOR).max(Instant::now() + Duration::from_secs(8));
    tokio::time::sleep_until(settled.into()).await;
    let down = prometheus.targets_down().await;
    assert!(down.is_empty(), "scrape targets not up:\n{}", down.join("\n"));

    // Queries that return nothing at first are asked again for a while: a gauge refreshed every
    // few seconds, a rate needing two samples.
    let exported: BTreeSet<String> = prometheus
        .api("/api/v1/label/__name__/values", &[])
        .await
        .expect("metric names")
        .as_array()
        .expect("a list")
        .iter()
        .filter_map(|name| name.as_str().map(str::to_string))
        .collect();
    let mut failures = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    for panel in &panels {
        let unknown: Vec<&String> = panel.metrics.iter().filter(|name| !exported.contains(*name)).collect();
        if !unknown.is_empty() {
            failures.push(format!(
                "{}: {:?} names metrics kiln does not export: {unknown:?}",
                panel.title, panel.query
            ));
            continue;
        }
        loop {
            match prometheus.has_data(&panel.query).await {
                Ok(true) => break,
                Ok(false) if Instant::now() < deadline => tokio::time::sleep(Duration::from_millis(500)).await,
                Ok(false) => {
                    failures.push(format!("{}: {:?} returned no data", panel.title, panel.query));
                    break;
                }
                Err(error) => {
                    failures.push(format!("{}: {:?} failed: {error}", panel.title, panel.query));
                    break;
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {} panel queries failed:\n{}",
        failures.len(),
        panels.len(),
        failures.join("\n")
    );
    topology.stop();
}
