//! Submit-to-running latency of a container job: kiln against the raw Docker Engine, on the
//! same engine, in one run.
//!
//! ```text
//! submit-latency --kiln target/release/kiln --docker-host unix:///var/run/docker.sock --image IMG [--runs 20]
//! ```
//!
//! It starts `kiln up --provider docker` on a temp KILN_HOME and measures, `--runs` times each:
//! - kiln, submit → RUNNING: `SubmitJob` of `true` in IMG (no code) until `WatchJob` reports the
//!   job RUNNING (the container has started);
//! - docker, create → running: create and start the same container through the engine API (what
//!   `docker run` does before it waits);
//! - end to end: `kiln run -f --no-code --image IMG -- true` against `docker run --rm IMG true`,
//!   both as commands, wall-clock.
//!
//! and prints the medians and 90th percentiles side by side.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bollard::Docker;
use bollard::models::ContainerCreateBody;
use bollard::query_parameters::RemoveContainerOptionsBuilder;
use futures::StreamExt;
use kiln_core::auth::BearerInterceptor;
use kiln_proto::v1 as pb;
use kiln_proto::v1::job_service_client::JobServiceClient;

struct Args {
    kiln: PathBuf,
    docker_host: String,
    image: String,
    runs: usize,
}

fn args() -> Result<Args> {
    let mut kiln = None;
    let mut docker_host = std::env::var("DOCKER_HOST").unwrap_or_else(|_| "unix:///var/run/docker.sock".into());
    let mut image = None;
    let mut runs = 20;
    let mut argv = std::env::args().skip(1);
    while let Some(flag) = argv.next() {
        let value = argv.next().with_context(|| format!("{flag} needs a value"))?;
        match flag.as_str() {
            "--kiln" => kiln = Some(PathBuf::from(value)),
            "--docker-host" => docker_host = value,
            "--image" => image = Some(value),
            "--runs" => runs = value.parse()?,
            other => bail!("unknown flag {other}"),
        }
    }
    Ok(Args {
        kiln: kiln.context("--kiln PATH is required")?,
        docker_host,
        image: image.context("--image IMG is required")?,
        runs,
    })
}

#[derive(serde::Deserialize)]
struct Credentials {
    api: String,
    token: String,
}

fn percentile(samples: &[Duration], p: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort();
    let rank = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[rank]
}

fn ms(duration: Duration) -> String {
    format!("{:.1} ms", duration.as_secs_f64() * 1000.0)
}

async fn kiln_submit_to_running(api: &str, token: &str, image: &str) -> Result<Duration> {
    let channel = tonic::transport::Channel::from_shared(api.to_string())?
        .connect()
        .await?;
    let mut jobs = JobServiceClient::with_interceptor(channel, BearerInterceptor::new(token));
    let spec = pb::JobSpec {
        command: vec!["true".into()],
        image: image.into(),
        resources: Some(pb::Resources {
            cpu_millis: 500,
            memory_bytes: 64 << 20,
            ..Default::default()
        }),
        ..Default::default()
    };
    let started = Instant::now();
    let job = jobs
        .submit_job(pb::SubmitJobRequest {
            spec: Some(spec),
            ..Default::default()
        })
        .await?
        .into_inner()
        .job
        .context("no job")?;
    let mut updates = jobs
        .watch_job(pb::WatchJobRequest { job_id: job.id.clone() })
        .await?
        .into_inner();
    let mut running_at = None;
    while let Some(update) = updates.next().await {
        let update = update?;
        if running_at.is_none() && update.started_at_ms > 0 {
            running_at = Some(started.elapsed());
        }
        let state = pb::JobState::try_from(update.state)?;
        if matches!(state, pb::JobState::Failed | pb::JobState::Lost | pb::JobState::Stopped) {
            bail!("the job ended {state:?}: {}", update.reason);
        }
    }
    running_at.context("the job never ran")
}

async fn docker_create_to_running(docker: &Docker, image: &str) -> Result<Duration> {
    let body = ContainerCreateBody {
        image: Some(image.into()),
        cmd: Some(vec!["true".into()]),
        ..Default::default()
    };
    let started = Instant::now();
    let created = docker
        .create_container(None::<bollard::query_parameters::CreateContainerOptions>, body)
        .await?;
    docker.start_container(&created.id, None).await?;
    let elapsed = started.elapsed();
    let _ = docker.wait_container(&created.id, None).next().await;
    docker
        .remove_container(
            &created.id,
            Some(RemoveContainerOptionsBuilder::new().force(true).build()),
        )
        .await?;
    Ok(elapsed)
}

fn timed(command: &mut Command) -> Result<Duration> {
    let started = Instant::now();
    let status = command.stdout(Stdio::null()).stderr(Stdio::null()).status()?;
    if !status.success() {
        bail!("{command:?} failed with {status}");
    }
    Ok(started.elapsed())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = args()?;
    let home = tempfile::tempdir()?;
    let mut up = Command::new(&args.kiln)
        .args(["up", "--provider", "docker", "--docker-host", &args.docker_host])
        .args([
            "--api-addr",
            "127.0.0.1:0",
            "--logs-addr",
            "127.0.0.1:0",
            "--batch-addr",
            "127.0.0.1:0",
        ])
        .env("KILN_HOME", home.path())
        .env("KILN_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    let credentials_path = home.path().join("credentials.toml");
    let deadline = Instant::now() + Duration::from_secs(60);
    while !credentials_path.try_exists()? {
        if Instant::now() > deadline {
            bail!("kiln up did not start");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let credentials: Credentials = toml::from_str(&std::fs::read_to_string(&credentials_path)?)?;
    let socket = args
        .docker_host
        .strip_prefix("unix://")
        .context("a unix:// docker host")?;
    let docker = Docker::connect_with_socket(socket, 120, bollard::API_DEFAULT_VERSION)?
        .negotiate_version()
        .await?;

    // One of each first, so images and caches are warm.
    kiln_submit_to_running(&credentials.api, &credentials.token, &args.image).await?;
    docker_create_to_running(&docker, &args.image).await?;
    let (mut kiln, mut raw, mut kiln_cli, mut docker_cli) = (Vec::new(), Vec::new(), Vec::new(), Vec::new());
    for _ in 0..args.runs {
        kiln.push(kiln_submit_to_running(&credentials.api, &credentials.token, &args.image).await?);
        raw.push(docker_create_to_running(&docker, &args.image).await?);
        kiln_cli.push(timed(
            Command::new(&args.kiln)
                .args([
                    "run",
                    "-f",
                    "--no-code",
                    "--cpu",
                    "0.5",
                    "--mem",
                    "64M",
                    "--image",
                    &args.image,
                    "--",
                    "true",
                ])
                .env("KILN_HOME", home.path()),
        )?);
        docker_cli.push(timed(
            Command::new("docker")
                .args(["run", "--rm", &args.image, "true"])
                .env("DOCKER_HOST", &args.docker_host),
        )?);
    }
    let _ = Command::new("kill").args(["-INT", &up.id().to_string()]).status();
    let _ = up.wait();

    println!(
        "submit-to-running latency, {} runs each, same engine ({})",
        args.runs, args.docker_host
    );
    println!("{:<48} {:>10} {:>10}", "", "median", "p90");
    let rows = [
        ("kiln: SubmitJob -> RUNNING (container started)", &kiln),
        ("docker API: create + start", &raw),
        ("kiln run -f --no-code --image IMG -- true", &kiln_cli),
        ("docker run --rm IMG true", &docker_cli),
    ];
    for (name, samples) in rows {
        println!(
            "{name:<48} {:>10} {:>10}",
            ms(percentile(samples, 0.5)),
            ms(percentile(samples, 0.9))
        );
    }
    let overhead = percentile(&kiln, 0.5).saturating_sub(percentile(&raw, 0.5));
    println!(
        "kiln adds {} to the engine's median create+start (goal: at most 150 ms)",
        ms(overhead)
    );
    Ok(())
}
