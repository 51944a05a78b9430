//! kiln's side: a release `kiln up` (process runner) on a temp `KILN_HOME`, driven through
//! its CLI as a user would — a job trains the digits classifier and the model is registered
//! from its outputs, services are made with `kiln serve create` — and the workers found where
//! they run: `kiln serve status -o json` names their jobs, `/proc/<pid>/environ` the process
//! and port of each (`KILN_JOB_ID`, `KILN_SERVE_PORT`).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use nix::sys::signal::{Signal, kill, killpg};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::Instant;

/// How long any one step of the setup may take.
const PATIENCE: Duration = Duration::from_secs(300);

/// A running `kiln up` and what its start printed.
pub struct Kiln {
    binary: PathBuf,
    home: PathBuf,
    up: Child,
    /// The predictor's REST API, `http://127.0.0.1:PORT`.
    pub predictor: String,
    /// Every service's `/metrics`.
    pub metrics: String,
    /// The child nats-server's URL.
    pub nats: String,
    pub token: String,
}

/// An inference worker process of a service.
#[derive(Clone, Debug)]
pub struct Worker {
    pub job_id: String,
    pub member: String,
    pub pid: i32,
    pub port: u16,
}

impl Worker {
    pub fn infer_url(&self, model: &str) -> String {
        format!("http://127.0.0.1:{}/v2/models/{model}/infer", self.port)
    }
}

impl Kiln {
    /// Starts `kiln up --provider process` with every listener on a free port, its data in
    /// `dir/home` and its log in `dir/up.log`, and waits until it is up.
    pub async fn start(binary: &Path, dir: &Path) -> Result<Kiln> {
        let home = dir.join("home");
        std::fs::create_dir_all(&home)?;
        let log = std::fs::File::create(dir.join("up.log"))?;
        let mut command = Command::new(binary);
        command
            .arg("up")
            .arg("--home")
            .arg(&home)
            .args(["--provider", "process", "--grace-period", "2"])
            .args(["--api-addr", "127.0.0.1:0", "--logs-addr", "127.0.0.1:0"])
            .args(["--batch-addr", "127.0.0.1:0", "--advisor-addr", "127.0.0.1:0"])
            .args([
                "--predictor-addr",
                "127.0.0.1:0",
                "--predictor-http-addr",
                "127.0.0.1:0",
            ])
            .args(["--metrics-addr", "127.0.0.1:0"])
            .env("KILN_HOME", &home)
            .env("KILN_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .process_group(0);
        let mut up = command
            .spawn()
            .with_context(|| format!("start {} up", binary.display()))?;
        let mut lines = BufReader::new(up.stdout.take().context("kiln up's stdout")?).lines();
        let (mut predictor, mut metrics, mut nats) = (None, None, None);
        let deadline = Instant::now() + PATIENCE;
        while predictor.is_none() || metrics.is_none() || nats.is_none() {
            let line = tokio::time::timeout_at(deadline, lines.next_line())
                .await
                .context("kiln up did not come up in time")??
                .with_context(|| format!("kiln up exited; see {}", dir.join("up.log").display()))?;
            if let Some((_, rest)) = line.split_once("Open Inference Protocol: ") {
                predictor = Some(rest.trim_end_matches(')').to_string());
            }
            if let Some(rest) = line.trim().strip_prefix("metrics:") {
                metrics = Some(rest.trim().to_string());
            }
            if let Some(rest) = line.trim().strip_prefix("nats:") {
                nats = Some(rest.trim().to_string());
            }
        }
        // The rest of its stdout is not needed, but must be read so it never blocks.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        let credentials: toml::Table = toml::from_str(&std::fs::read_to_string(home.join("credentials.toml"))?)?;
        let token = credentials["token"]
            .as_str()
            .context("a token in credentials.toml")?
            .to_string();
        Ok(Kiln {
            binary: binary.to_path_buf(),
            home,
            up,
            predictor: predictor.unwrap_or_default(),
            metrics: metrics.unwrap_or_default(),
            nats: nats.unwrap_or_default(),
            token,
        })
    }

    /// kiln up's process id.
    pub fn pid(&self) -> i32 {
        self.up.id().map_or(0, |pid| pid as i32)
    }

    /// The child nats-server's process id (`KILN_HOME/nats.pid`).
    pub fn nats_pid(&self) -> Option<i32> {
        std::fs::read_to_string(self.home.join("nats.pid"))
            .ok()?
            .trim()
            .parse()
            .ok()
    }

    /// Runs `kiln ARGS` against this instance: its stdout and stderr, or an error with both.
    pub async fn cli(&self, args: &[&str]) -> Result<(String, String)> {
        let output = Command::new(&self.binary)
            .args(args)
            .env("KILN_HOME", &self.home)
            .stdin(Stdio::null())
            .output()
            .await?;
        let (stdout, stderr) = (
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        );
        ensure!(
            output.status.success(),
            "kiln {} failed ({}): {stdout}{stderr}",
            args.join(" "),
            output.status
        );
        Ok((stdout, stderr))
    }

    /// `kiln run -f` of `command` with `code` as its code; the job's id once it succeeded.
    pub async fn run_job(&self, code: &Path, command: &[&str]) -> Result<String> {
        let code = code.display().to_string();
        let mut args = vec!["run", "-f", "--code", &code, "--cpu", "1", "--mem", "1G", "--"];
        args.extend_from_slice(command);
        let (_, stderr) = self.cli(&args).await?;
        let job = stderr
            .lines()
            .find_map(|line| line.strip_prefix("job ")?.strip_suffix(" submitted"))
            .context("kiln run printed no `job ID submitted`")?;
        Ok(job.to_string())
    }

    /// `kiln serve status NAME -o json`.
    pub async fn status(&self, name: &str) -> Result<Value> {
        let (stdout, _) = self.cli(&["serve", "status", name, "-o", "json"]).await?;
        Ok(serde_json::from_str(&stdout)?)
    }

    /// Waits until every member of service `name` has its wanted workers running and each of
    /// them answers `/v2/health/ready`; returns them, found by their job ids in `/proc`.
    pub async fn wait_workers(&self, name: &str) -> Result<Vec<Worker>> {
        let deadline = Instant::now() + PATIENCE;
        let ready = connection_for_probes()?;
        loop {
            let status = self.status(name).await?;
            let mut wanted_jobs = HashMap::new();
            let mut enough = true;
            for member in status["members"].as_array().into_iter().flatten() {
                if member["revision"] != status["revision"] {
                    continue;
                }
                let running: Vec<&str> = member["workers"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter(|worker| {
                        worker["state"]
                            .as_str()
                            .is_some_and(|s| s.eq_ignore_ascii_case("running"))
                    })
                    .filter_map(|worker| worker["job_id"].as_str())
                    .collect();
                enough &= running.len() as u64 >= member["wanted"].as_u64().unwrap_or(1);
                for job in running {
                    wanted_jobs.insert(
                        job.to_string(),
                        member["member"].as_str().unwrap_or_default().to_string(),
                    );
                }
            }
            if enough && !wanted_jobs.is_empty() {
                let workers = find_workers(name, &wanted_jobs);
                if workers.len() == wanted_jobs.len() && all_ready(&ready, &workers).await {
                    return Ok(workers);
                }
            }
            if Instant::now() > deadline {
                bail!("service {name}'s workers were not all ready in time: {status}");
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Stops `kiln up` (SIGINT: it stops its jobs), then kills whatever of it is left: its
    /// process group and any process still working in its data directory (the jobs).
    pub async fn stop(mut self) -> Result<()> {
        if let Some(pid) = self.up.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGINT);
        }
        let exited = tokio::time::timeout(Duration::from_secs(40), self.up.wait()).await;
        if exited.is_err() {
            self.kill_all();
        }
        for pid in processes_under(&self.home) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        Ok(())
    }

    fn kill_all(&mut self) {
        if let Some(pid) = self.up.id() {
            let _ = killpg(Pid::from_raw(pid as i32), Signal::SIGKILL);
        }
        for pid in processes_under(&self.home) {
            let _ = kill(Pid::from_raw(pid), Signal::SIGCONT);
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
    }
}

impl Drop for Kiln {
    /// A run that failed half-way leaves nothing running.
    fn drop(&mut self) {
        if self.up.id().is_some() {
            self.kill_all();
        }
    }
}

fn connection_for_probes() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()?)
}

async fn all_ready(client: &reqwest::Client, workers: &[Worker]) -> bool {
    for worker in workers {
        let url = format!("http://127.0.0.1:{}/v2/health/ready", worker.port);
        let ok = client
            .get(&url)
            .send()
            .await
            .is_ok_and(|response| response.status().is_success());
        if !ok {
            return false;
        }
    }
    true
}

/// The environment of process `pid`, when it can be read.
fn environ(pid: i32) -> Option<HashMap<String, String>> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    Some(
        raw.split(|&byte| byte == 0)
            .filter_map(|entry| {
                let text = std::str::from_utf8(entry).ok()?;
                let (key, value) = text.split_once('=')?;
                Some((key.to_string(), value.to_string()))
            })
            .collect(),
    )
}

fn pids() -> Vec<i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|entry| entry.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

/// The worker processes of `service` whose jobs are among `jobs` (job id → member).
fn find_workers(service: &str, jobs: &HashMap<String, String>) -> Vec<Worker> {
    let mut workers: Vec<Worker> = pids()
        .into_iter()
        .filter_map(|pid| {
            let env = environ(pid)?;
            if env.get("KILN_SERVE_SERVICE").map(String::as_str) != Some(service) {
                return None;
            }
            let job_id = env.get("KILN_JOB_ID")?.clone();
            let member = jobs.get(&job_id)?.clone();
            ensure_member(&env, &member)?;
            Some(Worker {
                job_id,
                member,
                pid,
                port: env.get("KILN_SERVE_PORT")?.parse().ok()?,
            })
        })
        .collect();
    workers.sort_by(|a, b| (&a.member, &a.job_id).cmp(&(&b.member, &b.job_id)));
    workers
}

fn ensure_member(env: &HashMap<String, String>, member: &str) -> Option<()> {
    (env.get("KILN_SERVE_MEMBER").map(String::as_str) == Some(member)).then_some(())
}

/// Processes whose working directory is under `dir` (kiln up's jobs work in `home/work`).
fn processes_under(dir: &Path) -> Vec<i32> {
    pids()
        .into_iter()
        .filter(|&pid| pid != std::process::id() as i32)
        .filter(|&pid| std::fs::read_link(format!("/proc/{pid}/cwd")).is_ok_and(|cwd| cwd.starts_with(dir)))
        .collect()
}

/// Workers in rotation of `member` of `service`, as the relays report them
/// (`kiln_runner_serve_in_rotation` on kiln up's `/metrics` at `metrics_url`).
pub async fn in_rotation(client: &reqwest::Client, metrics_url: &str, service: &str, member: &str) -> Result<f64> {
    let text = client.get(metrics_url).send().await?.text().await?;
    let (service, member) = (format!("service=\"{service}\""), format!("member=\"{member}\""));
    text.lines()
        .find(|line| {
            line.starts_with("kiln_runner_serve_in_rotation{") && line.contains(&service) && line.contains(&member)
        })
        .and_then(|line| line.rsplit(' ').next()?.parse().ok())
        .context("no kiln_runner_serve_in_rotation line for the member")
}

/// SIGSTOPs `pid` and waits until every thread of it has stopped (the signal is delivered
/// asynchronously: a thread may finish what it is doing first).
pub async fn pause(pid: i32) -> Result<()> {
    kill(Pid::from_raw(pid), Signal::SIGSTOP)?;
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let stopped = std::fs::read_dir(format!("/proc/{pid}/task"))?.all(|task| {
            task.ok()
                .and_then(|task| std::fs::read_to_string(task.path().join("stat")).ok())
                .and_then(|stat| {
                    stat.rsplit_once(')')
                        .map(|(_, rest)| rest.trim_start().starts_with(['T', 't']))
                })
                .unwrap_or(true)
        });
        if stopped {
            return Ok(());
        }
        ensure!(Instant::now() < deadline, "worker {pid} never stopped");
        tokio::time::sleep(Duration::from_micros(200)).await;
    }
}

pub fn resume(pid: i32) -> Result<()> {
    Ok(kill(Pid::from_raw(pid), Signal::SIGCONT)?)
}
