//! Inference services (issue 16), side by side with Ray Serve in one run on this machine:
//! the predictor's added latency over calling a worker directly, a 2-member mean ensemble's
//! throughput against a client fanning out to the workers itself and against Ray Serve's
//! composed deployment, and one worker paused (SIGSTOP) under load.
//!
//! ```text
//! python3 -m venv target/bench-venv
//! target/bench-venv/bin/pip install "ray[serve]==2.60.0" scikit-learn==1.9.1 numpy==2.4.6 aiohttp==3.14.5 ./sdk/python
//! cargo build --release -p kiln-cli -p kiln-bench --bin serve-bench
//! ./target/release/serve-bench [--python target/bench-venv/bin/python] [--kiln target/release/kiln] [--full]
//! ```
//!
//! - kiln: a release `kiln up --provider process` on a temp KILN_HOME. `kiln run` jobs make
//!   the models — one trains scikit-learn's digits classifier (bench/serve_workers.py, an SVC
//!   on the bundled digits) and writes it to its outputs, one writes a no-op model's file —
//!   and `kiln model register` registers each twice (`digits`, `digits-b`; `noop`, `noop-b`),
//!   so an ensemble has two members. `kiln serve create` makes `noop` and `digits` (2
//!   replicas: the latency rows) and `noop-pair` and `digits-pair` (members MODEL and
//!   MODEL-b, 1 replica each, `--ensemble mean --quorum 1 --deadline-ms 50`). Every worker is
//!   `python serve_workers.py MODEL`: `kiln.serve` around the model, OMP_NUM_THREADS=1.
//!   Workers are found by their jobs (`kiln serve status -o json`) in `/proc/<pid>/environ`
//!   (`KILN_JOB_ID`, `KILN_SERVE_PORT`).
//! - Ray Serve: bench/serve_ray.py deploys the same models (the same code, kiln.serve's JSON
//!   codec around the same predict) on `ray.init(num_cpus=2)`: an app of 2 replicas per model,
//!   and a router deployment averaging two member deployments of 1 replica each.
//! - One client for all (this program: tokio + reqwest, one keep-alive connection per
//!   concurrent client, TCP_NODELAY), the same OIP JSON body (one digits image, x FP64 [1,64],
//!   `parameters.timeout` 2 s, which only kiln reads).
//! - Latency: sequential calls, direct to a worker / kiln's predictor / Ray's proxy taking
//!   turns in blocks; added latency is a system's p50 (p99) minus the direct call's.
//! - Throughput: C clients in a closed loop for `--seconds` after `--warmup-seconds`; the
//!   fan-out client calls both workers of the kiln ensemble at once and averages the answers.
//! - Pause: the digits ensemble under `--pause-clients` clients at its 50 ms deadline; the
//!   `digits-b` worker is stopped for `--pause-seconds`.

mod bare;
mod load;
mod pause;
mod ray;
mod report;
mod stack;

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result};
use bytes::Bytes;
use clap::Parser;

use crate::bare::{Bare, Hop};
use crate::load::{Endpoint, Route};
use crate::report::{LatencyRow, Report, ThroughputRow};
use crate::stack::{Kiln, Worker};

const MODELS: [&str; 2] = ["noop", "digits"];

#[derive(Parser, Debug)]
#[command(about = "kiln's inference services against Ray Serve: added latency, ensemble throughput, a paused worker")]
struct Args {
    /// The kiln binary (a release build: `cargo build --release -p kiln-cli`).
    #[arg(long)]
    kiln: Option<PathBuf>,
    /// The Python with ray[serve], scikit-learn and the kiln SDK (default: target/bench-venv).
    #[arg(long)]
    python: Option<PathBuf>,
    /// A bigger run: 10,000 latency calls, clients 1,8,32,64, 10 s rows, 3 rounds.
    #[arg(long)]
    full: bool,
    /// Timed sequential calls per system and model.
    #[arg(long)]
    requests: Option<usize>,
    /// Untimed calls before them.
    #[arg(long, default_value_t = 200)]
    warmup: usize,
    /// Consecutive calls to one system before the next takes its turn.
    #[arg(long, default_value_t = 100)]
    block: usize,
    /// Concurrent clients of the throughput rows.
    #[arg(long, value_delimiter = ',')]
    clients: Vec<usize>,
    /// Measured seconds per throughput row.
    #[arg(long)]
    seconds: Option<f64>,
    #[arg(long, default_value_t = 1.0)]
    warmup_seconds: f64,
    /// Throughput rounds (each system once per round and row); the median is printed.
    #[arg(long)]
    rounds: Option<usize>,
    /// Clients calling the ensemble while a worker is paused.
    #[arg(long, default_value_t = 4)]
    pause_clients: usize,
    #[arg(long, default_value_t = 10.0)]
    pause_seconds: f64,
    /// Ray Serve's profile: default or throughput-optimized.
    #[arg(long, default_value = "default")]
    ray_profile: String,
    /// Run only these parts (default: all).
    #[arg(long, value_delimiter = ',', value_parser = ["latency", "throughput", "pause"])]
    only: Vec<String>,
    /// Keep the temp dir (kiln up's home and log, Ray's log).
    #[arg(long)]
    keep: bool,
}

impl Args {
    fn runs(&self, part: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|only| only == part)
    }
}

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// The request every system gets: one digits image as x FP64 [1, 64] (pixel values 0..16)
/// and a 2 s deadline (kiln's `parameters.timeout`; the workers and Ray ignore it).
fn body(timeout_opt: Option<Duration>) -> Bytes {
    // The first image of scikit-learn's digits set (serve_workers.digits_row(0)).
    const ZERO: [u8; 64] = [
        0, 0, 5, 13, 9, 1, 0, 0, 0, 0, 13, 15, 10, 15, 5, 0, 0, 3, 15, 2, 0, 11, 8, 0, 0, 4, 12, 0, 0, 8, 8, 0, 0, 5,
        8, 0, 0, 9, 8, 0, 0, 4, 11, 0, 1, 12, 7, 0, 0, 2, 14, 5, 10, 12, 0, 0, 0, 0, 6, 13, 10, 0, 0, 0,
    ];
    let data: Vec<f64> = ZERO.iter().map(|&pixel| f64::from(pixel)).collect();
    let mut request = serde_json::json!({
        "inputs": [{"name": "x", "shape": [1, 64], "datatype": "FP64", "data": data}],
    });
    if let Some(timeout) = timeout_opt {
        request["parameters"] = serde_json::json!({"timeout": timeout.as_micros() as u64});
    }
    Bytes::from(serde_json::to_vec(&request).expect("a JSON body"))
}

/// Makes the models through jobs and registers them, and makes the services; their workers.
async fn set_up(kiln: &Kiln, code: &Path, python: &str) -> Result<Vec<(String, Vec<Worker>)>> {
    eprintln!("serve-bench: training the digits model in a kiln job");
    let digits = kiln
        .run_job(
            code,
            &[
                "sh",
                "-c",
                r#"exec "$0" serve_workers.py digits --save "$KILN_OUTPUTS/model""#,
                python,
            ],
        )
        .await?;
    let noop = kiln
        .run_job(
            code,
            &[
                "sh",
                "-c",
                r#"mkdir -p "$KILN_OUTPUTS/model" && echo noop > "$KILN_OUTPUTS/model/NOOP""#,
            ],
        )
        .await?;
    for (model, job) in [("digits", &digits), ("noop", &noop)] {
        for name in [model.to_string(), format!("{model}-b")] {
            let (registered, _) = kiln
                .cli(&["model", "register", &name, "--from", &format!("{job}:model")])
                .await?;
            eprintln!("serve-bench: registered {}", registered.trim());
        }
    }
    let code = code.display().to_string();
    let mut services = Vec::new();
    for model in MODELS {
        let worker = [python, "serve_workers.py", model];
        let pair_b = format!("{model}-b");
        let pair = format!("{model}-pair");
        let shapes: [&[&str]; 2] = [
            &[model, "--model", model, "--replicas", "2", "--deadline-ms", "2000"],
            &[
                pair.as_str(),
                "--model",
                model,
                "--model",
                pair_b.as_str(),
                "--ensemble",
                "mean",
                "--quorum",
                "1",
                "--deadline-ms",
                "50",
            ],
        ];
        for shape in shapes {
            let mut args = vec!["serve", "create"];
            args.extend_from_slice(shape);
            args.extend_from_slice(&[
                "--cpu",
                "0.2",
                "--mem",
                "512M",
                "-e",
                "OMP_NUM_THREADS=1",
                "--code",
                &code,
                "--",
            ]);
            args.extend_from_slice(&worker);
            kiln.cli(&args).await?;
            services.push(shape[0].to_string());
        }
    }
    let mut found = Vec::new();
    for service in services {
        let workers = kiln.wait_workers(&service).await?;
        eprintln!(
            "serve-bench: {service}: workers {}",
            workers
                .iter()
                .map(|w| format!("{} pid {} port {}", w.member, w.pid, w.port))
                .collect::<Vec<_>>()
                .join(", ")
        );
        found.push((service, workers));
    }
    Ok(found)
}

/// The bare proxies of [`bare`], by what their rows are called.
fn floors(kiln: &Kiln, workers: &[String]) -> Result<Vec<(&'static str, Bare)>> {
    let hops = [
        ("bare proxy -> worker", Hop::Worker),
        ("bare proxy -> HTTP -> relay -> worker", Hop::Relay),
        (
            "bare proxy -> NATS -> relay -> worker",
            Hop::Nats { url: kiln.nats.clone() },
        ),
    ];
    hops.into_iter()
        .map(|(label, hop)| Ok((label, Bare::start(workers, &hop)?)))
        .collect()
}

fn workers_of<'a>(services: &'a [(String, Vec<Worker>)], name: &str) -> Result<&'a [Worker]> {
    services
        .iter()
        .find(|(service, _)| service == name)
        .map(|(_, workers)| workers.as_slice())
        .with_context(|| format!("no workers of {name}"))
}

fn median_row(mut rows: Vec<load::Throughput>) -> load::Throughput {
    rows.sort_by(|a, b| a.rps.total_cmp(&b.rps));
    rows.swap_remove(rows.len() / 2)
}

async fn measure(args: &Args, kiln: &Kiln, python: &Path, dir: &Path, report: &mut Report) -> Result<()> {
    let python_text = python.display().to_string();
    let code = dir.join("code");
    std::fs::create_dir_all(&code)?;
    std::fs::copy(repo().join("bench/serve_workers.py"), code.join("serve_workers.py"))?;
    let started = tokio::time::Instant::now();
    let services = set_up(kiln, &code, &python_text).await?;
    report.kiln_setup_s = started.elapsed().as_secs_f64();
    let request = body(Some(Duration::from_secs(2)));
    let kiln_url =
        |service: &str| Endpoint::with_token(format!("{}/v2/models/{service}/infer", kiln.predictor), &kiln.token);

    let needs_ray = args.runs("latency") || args.runs("throughput");
    let mut ray_opt = if needs_ray {
        eprintln!("serve-bench: starting Ray Serve");
        Some(ray::Ray::start(python, &args.ray_profile, &dir.join("ray.log")).await?)
    } else {
        None
    };
    if let Some(ray) = &ray_opt {
        report.ray_version = ray.version.clone();
        report.ray_startup_s = ray.startup_s;
    }
    let requests = args.requests.unwrap_or(if args.full { 10_000 } else { 2_000 });
    if let (true, Some(ray)) = (args.runs("latency"), ray_opt.as_mut()) {
        let mut ray_urls = Vec::new();
        for model in MODELS {
            ray_urls.push(ray.deploy_replicas(model, 2).await?);
        }
        for (model, ray_url) in MODELS.iter().zip(&ray_urls) {
            eprintln!("serve-bench: latency, {model}");
            let worker = &workers_of(&services, model)?[0];
            let bare = floors(kiln, &[worker.infer_url(model)])?;
            let mut routes = vec![
                Route::One(Endpoint::plain(worker.infer_url(model))),
                Route::One(kiln_url(model)?),
                Route::One(Endpoint::plain(ray_url.clone())),
            ];
            routes.extend(
                bare.iter()
                    .map(|(_, proxy)| Route::One(Endpoint::plain(proxy.url.clone()))),
            );
            let summaries = load::latency(&routes, &request, args.warmup, requests, args.block).await?;
            report.latency.push(LatencyRow {
                model: model.to_string(),
                direct: summaries[0],
                kiln: summaries[1],
                ray: summaries[2],
                floors: bare
                    .iter()
                    .map(|(label, _)| *label)
                    .zip(summaries[3..].iter().copied())
                    .collect(),
            });
        }
        for url in &ray_urls {
            ray.delete(url).await?;
        }
    }
    let clients = if !args.clients.is_empty() {
        args.clients.clone()
    } else if args.full {
        vec![1, 8, 32, 64]
    } else {
        vec![8, 32]
    };
    let seconds = Duration::from_secs_f64(args.seconds.unwrap_or(if args.full { 10.0 } else { 5.0 }));
    let warmup = Duration::from_secs_f64(args.warmup_seconds);
    let rounds = args.rounds.unwrap_or(if args.full { 3 } else { 1 }).max(1);
    if let (true, Some(ray)) = (args.runs("throughput"), ray_opt.as_mut()) {
        for model in MODELS {
            let ray_url = ray.deploy_ensemble(model).await?;
            let pair = format!("{model}-pair");
            let workers = workers_of(&services, &pair)?;
            let fan_out = Route::FanOut(
                Endpoint::plain(workers[0].infer_url(&workers[0].member)),
                Endpoint::plain(workers[1].infer_url(&workers[1].member)),
            );
            let bare = floors(
                kiln,
                &[
                    workers[0].infer_url(&workers[0].member),
                    workers[1].infer_url(&workers[1].member),
                ],
            )?;
            let mut routes = vec![
                fan_out,
                Route::One(kiln_url(&pair)?),
                Route::One(Endpoint::plain(ray_url.clone())),
            ];
            routes.extend(
                bare.iter()
                    .map(|(_, proxy)| Route::One(Endpoint::plain(proxy.url.clone()))),
            );
            // Whose CPU each system's row counts: the two workers; kiln up (predictor, relays,
            // ...) with its nats-server and every worker, and its parts; serve_ray.py with
            // Ray's processes.
            let group = |label, pids: Vec<i32>, descendants| load::CpuGroup {
                label,
                pids,
                descendants,
            };
            let pair_pids = vec![workers[0].pid, workers[1].pid];
            let nats = || group("nats-server", kiln.nats_pid().into_iter().collect(), false);
            let servers = [
                vec![group("the 2 workers", pair_pids.clone(), false)],
                vec![
                    group("kiln up and children", vec![kiln.pid()], true),
                    group("kiln up alone", vec![kiln.pid()], false),
                    nats(),
                    group("the 2 workers", pair_pids.clone(), false),
                ],
                vec![group("Ray's processes", vec![ray.pid()], true)],
                // The bare proxies and relays run in this process: the client's CPU has them.
                vec![group("the 2 workers", pair_pids.clone(), false)],
                vec![group("the 2 workers", pair_pids.clone(), false)],
                vec![nats(), group("the 2 workers", pair_pids, false)],
            ];
            for &concurrency in &clients {
                eprintln!("serve-bench: throughput, {model}, {concurrency} clients");
                let mut measured: Vec<Vec<load::Throughput>> = vec![Vec::new(); routes.len()];
                for _ in 0..rounds {
                    for ((route, rows), servers) in routes.iter().zip(&mut measured).zip(&servers) {
                        rows.push(load::throughput(route, &request, concurrency, (warmup, seconds), servers).await?);
                    }
                }
                let mut rows: Vec<load::Throughput> = measured.into_iter().map(median_row).collect();
                let floors = rows.split_off(3);
                let [fan_out, kiln_row, ray_row]: [load::Throughput; 3] =
                    rows.try_into().expect("the three systems' rows");
                report.throughput.push(ThroughputRow {
                    model: model.to_string(),
                    clients: concurrency,
                    fan_out,
                    kiln: kiln_row,
                    ray: ray_row,
                    floors: bare.iter().map(|(label, _)| *label).zip(floors).collect(),
                });
            }
            ray.delete(&ray_url).await?;
        }
    }
    if let Some(ray) = ray_opt.take() {
        report.ray_notes = ray.finish().await?;
    }
    if args.runs("pause") {
        eprintln!("serve-bench: pausing a worker of digits-pair");
        let workers = workers_of(&services, "digits-pair")?;
        let paused = workers
            .iter()
            .find(|worker| worker.member == "digits-b")
            .context("the digits-b worker")?;
        let plan = pause::Plan {
            service: "digits-pair".into(),
            clients: args.pause_clients,
            before: Duration::from_secs(3),
            paused: Duration::from_secs_f64(args.pause_seconds),
            after: Duration::from_secs(5),
            deadline: Duration::from_millis(50),
        };
        report.pause_opt = Some(pause::run(kiln, &plan, paused, &body(None)).await?);
        report.pause_plan_opt = Some(plan);
    }
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> Result<()> {
    let args = Args::parse();
    let kiln_binary = args.kiln.clone().unwrap_or_else(|| repo().join("target/release/kiln"));
    // Absolute (not canonical: a venv's python is a symlink whose target is not the venv's),
    // since jobs run it from their own working directory.
    let python = std::path::absolute(
        args.python
            .clone()
            .unwrap_or_else(|| repo().join("target/bench-venv/bin/python")),
    )?;
    let dir = tempfile::Builder::new().prefix("serve-bench-").tempdir()?;
    let mut report = Report {
        load_start: report::load_average(),
        ..Default::default()
    };
    let started = tokio::time::Instant::now();
    eprintln!("serve-bench: kiln up in {}", dir.path().display());
    let kiln = Kiln::start(&kiln_binary, dir.path()).await?;
    let outcome = measure(&args, &kiln, &python, dir.path(), &mut report).await;
    kiln.stop().await?;
    report.wall_s = started.elapsed().as_secs_f64();
    report.load_end = report::load_average();
    if args.keep {
        eprintln!("serve-bench: kept {}", dir.keep().display());
    }
    outcome?;
    report.print();
    Ok(())
}
