//! Ray Serve's side: bench/serve_ray.py in the bench venv, driven over its line protocol
//! (commands on stdin, one JSON event a line on stdout). It only deploys; serve-bench's own
//! client measures Ray's HTTP proxy exactly as it measures kiln's predictor.

use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use anyhow::{Context, Result, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader, Lines};
use tokio::process::{Child, ChildStdin, ChildStdout, Command};

/// How long Ray may take to start, or to deploy an app.
const PATIENCE: Duration = Duration::from_secs(300);

pub struct Ray {
    child: Child,
    stdin_opt: Option<ChildStdin>,
    events: Lines<BufReader<ChildStdout>>,
    pub version: String,
    pub port: u16,
    pub startup_s: f64,
}

impl Ray {
    /// Starts serve_ray.py with `python`, its stderr (and Ray's) in `log`, and waits for Ray.
    pub async fn start(python: &Path, profile: &str, log: &Path) -> Result<Ray> {
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("serve_ray.py");
        let mut child = Command::new(python)
            .arg(&script)
            .args(["--profile", profile])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(std::fs::File::create(log)?)
            .spawn()
            .with_context(|| format!("start {} {}", python.display(), script.display()))?;
        let stdin_opt = child.stdin.take();
        let events = BufReader::new(child.stdout.take().context("serve_ray.py's stdout")?).lines();
        let mut ray = Ray {
            child,
            stdin_opt,
            events,
            version: String::new(),
            port: 0,
            startup_s: 0.0,
        };
        let ready = ray
            .event()
            .await
            .with_context(|| format!("Ray Serve did not start; see {}", log.display()))?;
        ray.version = ready["ray_version"].as_str().unwrap_or_default().to_string();
        ray.port = ready["port"].as_u64().context("the proxy's port")? as u16;
        ray.startup_s = ready["startup_s"].as_f64().unwrap_or(f64::NAN);
        Ok(ray)
    }

    /// serve_ray.py's process id (Ray's processes are its descendants).
    pub fn pid(&self) -> i32 {
        self.child.id().map_or(0, |pid| pid as i32)
    }

    async fn event(&mut self) -> Result<Value> {
        let line = tokio::time::timeout(PATIENCE, self.events.next_line())
            .await
            .context("serve_ray.py did not answer in time")??
            .context("serve_ray.py exited")?;
        let event: Value = serde_json::from_str(&line).with_context(|| format!("serve_ray.py said {line}"))?;
        if event["event"] == "error" {
            bail!("serve_ray.py: {}", event["error"]);
        }
        Ok(event)
    }

    async fn command(&mut self, line: &str) -> Result<Value> {
        let stdin = self.stdin_opt.as_mut().context("serve_ray.py's stdin is closed")?;
        stdin.write_all(format!("{line}\n").as_bytes()).await?;
        stdin.flush().await?;
        self.event().await
    }

    /// The infer URL of an app of `model` with `replicas` replicas.
    pub async fn deploy_replicas(&mut self, model: &str, replicas: u32) -> Result<String> {
        let deployed = self.command(&format!("deploy replicas {model} {replicas}")).await?;
        self.url(&deployed)
    }

    /// The infer URL of a mean ensemble of two member deployments of `model`.
    pub async fn deploy_ensemble(&mut self, model: &str) -> Result<String> {
        let deployed = self.command(&format!("deploy ensemble {model}")).await?;
        self.url(&deployed)
    }

    fn url(&self, deployed: &Value) -> Result<String> {
        let path = deployed["path"].as_str().context("a deployed app's path")?;
        Ok(format!("http://127.0.0.1:{}{path}", self.port))
    }

    pub async fn delete(&mut self, url: &str) -> Result<()> {
        let app = url.rsplit('/').nth(1).context("an app's name in its URL")?.to_string();
        self.command(&format!("delete {app}")).await?;
        Ok(())
    }

    /// Shuts Serve and Ray down and waits for serve_ray.py to exit; its notes.
    pub async fn finish(mut self) -> Result<Vec<String>> {
        self.stdin_opt = None; // end of input: serve_ray.py shuts down
        let done = self.event().await?;
        tokio::time::timeout(Duration::from_secs(60), self.child.wait()).await??;
        Ok(done["notes"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|note| note.as_str().map(str::to_string))
            .collect())
    }
}

impl Drop for Ray {
    /// A run that failed half-way: SIGTERM makes serve_ray.py shut Ray down and kill what is left.
    fn drop(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = kill(Pid::from_raw(pid as i32), Signal::SIGTERM);
        }
    }
}
