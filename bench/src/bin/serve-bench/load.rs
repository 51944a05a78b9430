//! The client side, the same for kiln, the workers and Ray Serve: one keep-alive HTTP/1.1
//! connection per concurrent client (a `reqwest::Client` each, TCP_NODELAY), sequential
//! latency samples interleaved across the systems, closed-loop throughput, and the mean
//! ensemble a client computes itself from the two workers' answers.

use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use bytes::Bytes;
use reqwest::header::{AUTHORIZATION, CONTENT_TYPE, HeaderValue};
use serde_json::Value;
use tokio::time::Instant;

/// Where a request goes: an infer URL and, for kiln's predictor, the bearer token.
#[derive(Clone, Debug)]
pub struct Endpoint {
    pub url: String,
    pub authorization_opt: Option<HeaderValue>,
}

impl Endpoint {
    pub fn plain(url: String) -> Endpoint {
        Endpoint {
            url,
            authorization_opt: None,
        }
    }

    pub fn with_token(url: String, token: &str) -> Result<Endpoint> {
        Ok(Endpoint {
            url,
            authorization_opt: Some(HeaderValue::from_str(&format!("Bearer {token}"))?),
        })
    }
}

/// What one client talks to: one endpoint, or the two workers of an ensemble, asked at once
/// and averaged by the client.
#[derive(Clone, Debug)]
pub enum Route {
    One(Endpoint),
    FanOut(Endpoint, Endpoint),
}

/// How a request ended.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// 200, every member in the answer.
    Complete,
    /// 200 flagged `kiln.partial`.
    Partial,
    Failed(String),
}

/// A client's connection: a client with one pooled connection (two for a fan-out).
pub fn connection() -> Result<reqwest::Client> {
    Ok(reqwest::Client::builder()
        .no_proxy()
        .tcp_nodelay(true)
        .pool_max_idle_per_host(1)
        .timeout(Duration::from_secs(30))
        .build()?)
}

async fn post(client: &reqwest::Client, endpoint: &Endpoint, body: &Bytes) -> Result<Bytes> {
    let mut request = client
        .post(&endpoint.url)
        .header(CONTENT_TYPE, "application/json")
        .body(body.clone());
    if let Some(authorization) = &endpoint.authorization_opt {
        request = request.header(AUTHORIZATION, authorization.clone());
    }
    let response = request.send().await?;
    let status = response.status();
    let answer = response.bytes().await?;
    if !status.is_success() {
        bail!(
            "{status}: {}",
            String::from_utf8_lossy(&answer[..answer.len().min(200)])
        );
    }
    Ok(answer)
}

/// The first output's data of an OIP JSON answer, as numbers.
fn first_output(answer: &Value) -> Result<Vec<f64>> {
    answer["outputs"][0]["data"]
        .as_array()
        .context("an answer without outputs[0].data")?
        .iter()
        .map(|value| value.as_f64().context("a data element that is not a number"))
        .collect()
}

/// One client: its connections and its route.
pub struct Client {
    route: Route,
    first: reqwest::Client,
    second: reqwest::Client,
}

impl Client {
    pub fn new(route: &Route) -> Result<Client> {
        Ok(Client {
            route: route.clone(),
            first: connection()?,
            second: connection()?,
        })
    }

    /// Sends `body` and reads the answer: kiln's `kiln.partial` flag, or the client's own
    /// element-wise mean of both workers' first outputs.
    pub async fn call(&self, body: &Bytes) -> Outcome {
        match self.try_call(body).await {
            Ok(outcome) => outcome,
            Err(error) => Outcome::Failed(format!("{error:#}")),
        }
    }

    async fn try_call(&self, body: &Bytes) -> Result<Outcome> {
        match &self.route {
            Route::One(endpoint) => {
                let answer: Value = serde_json::from_slice(&post(&self.first, endpoint, body).await?)?;
                first_output(&answer)?;
                let partial = answer["parameters"]["kiln.partial"].as_bool() == Some(true);
                Ok(if partial { Outcome::Partial } else { Outcome::Complete })
            }
            Route::FanOut(first, second) => {
                let (a, b) = tokio::join!(post(&self.first, first, body), post(&self.second, second, body));
                let (a, b): (Value, Value) = (serde_json::from_slice(&a?)?, serde_json::from_slice(&b?)?);
                let (a, b) = (first_output(&a)?, first_output(&b)?);
                ensure!(a.len() == b.len(), "the workers' outputs differ in size");
                let mean: Vec<f64> = a.iter().zip(&b).map(|(x, y)| (x + y) / 2.0).collect();
                ensure!(mean.iter().all(|value| value.is_finite()), "the mean is not finite");
                Ok(Outcome::Complete)
            }
        }
    }
}

/// Nearest-rank percentiles and the mean of a set of durations, in milliseconds.
#[derive(Clone, Copy, Debug, Default)]
pub struct Summary {
    pub p50_ms: f64,
    pub p99_ms: f64,
    pub mean_ms: f64,
    pub n: usize,
}

impl Summary {
    pub fn of(durations: &[Duration]) -> Summary {
        if durations.is_empty() {
            return Summary {
                p50_ms: f64::NAN,
                p99_ms: f64::NAN,
                mean_ms: f64::NAN,
                n: 0,
            };
        }
        let mut ms: Vec<f64> = durations.iter().map(|d| d.as_secs_f64() * 1e3).collect();
        ms.sort_by(f64::total_cmp);
        let rank = |q: f64| ms[((q * ms.len() as f64).ceil() as usize).clamp(1, ms.len()) - 1];
        Summary {
            p50_ms: rank(0.50),
            p99_ms: rank(0.99),
            mean_ms: ms.iter().sum::<f64>() / ms.len() as f64,
            n: ms.len(),
        }
    }
}

/// Sequential calls, one client per route: `warmup` untimed calls each, then `requests` timed
/// ones each, in blocks of `block` taking turns, so a slow moment of the machine falls on
/// every route alike. Every call must answer completely.
pub async fn latency(
    routes: &[Route],
    body: &Bytes,
    warmup: usize,
    requests: usize,
    block: usize,
) -> Result<Vec<Summary>> {
    let clients = routes.iter().map(Client::new).collect::<Result<Vec<_>>>()?;
    for client in &clients {
        for _ in 0..warmup {
            expect_complete(client.call(body).await)?;
        }
    }
    let mut timings = vec![Vec::with_capacity(requests); clients.len()];
    while timings[0].len() < requests {
        for (client, times) in clients.iter().zip(&mut timings) {
            for _ in 0..block.min(requests - times.len()) {
                let started = Instant::now();
                let outcome = client.call(body).await;
                times.push(started.elapsed());
                expect_complete(outcome)?;
            }
        }
    }
    Ok(timings.iter().map(|times| Summary::of(times)).collect())
}

fn expect_complete(outcome: Outcome) -> Result<()> {
    match outcome {
        Outcome::Complete => Ok(()),
        Outcome::Partial => bail!("a partial answer where every member should answer"),
        Outcome::Failed(error) => bail!("a call failed: {error}"),
    }
}

/// A closed-loop throughput row.
#[derive(Clone, Debug, Default)]
pub struct Throughput {
    /// Complete answers per second in the measured window.
    pub rps: f64,
    pub latency: Summary,
    pub partial: usize,
    pub failed: usize,
    pub first_error_opt: Option<String>,
    /// The measured window's length.
    pub seconds: f64,
    /// CPU seconds each group of serving processes, and this client, used in the window.
    pub server_cpu_s: Vec<(&'static str, f64)>,
    pub client_cpu_s: f64,
}

/// Processes whose CPU a row counts, by name: `pids`, with their descendants or alone.
#[derive(Clone, Debug)]
pub struct CpuGroup {
    pub label: &'static str,
    pub pids: Vec<i32>,
    pub descendants: bool,
}

impl CpuGroup {
    pub fn seconds(&self) -> f64 {
        cpu_seconds(&self.pids, self.descendants)
    }
}

/// CPU seconds (user + system, all threads) used so far by `pids` (and their descendants).
pub fn cpu_seconds(pids: &[i32], descendants: bool) -> f64 {
    let ticks = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as f64;
    let mut stats: Vec<(i32, i32, u64)> = Vec::new(); // pid, parent, ticks
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry.file_name().to_str().and_then(|name| name.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let Some((_, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let fields: Vec<&str> = rest.split_whitespace().collect();
        let number = |at: usize| fields.get(at).and_then(|field| field.parse::<u64>().ok()).unwrap_or(0);
        // After the command: state, ppid, ... utime (12th), stime (13th).
        stats.push((pid, number(1) as i32, number(11) + number(12)));
    }
    let mut tree: Vec<i32> = pids.to_vec();
    let mut at = 0;
    while descendants && at < tree.len() {
        let parent = tree[at];
        tree.extend(
            stats
                .iter()
                .filter(|(pid, ppid, _)| *ppid == parent && !pids.contains(pid))
                .map(|s| s.0),
        );
        at += 1;
    }
    stats
        .iter()
        .filter(|(pid, ..)| tree.contains(pid))
        .map(|(.., used)| *used as f64 / ticks)
        .sum()
}

/// `clients` clients, each calling `route` in a loop for `warmup` then `measured`: the calls
/// that ended inside the measured window.
/// `servers`: the processes whose CPU the row counts.
pub async fn throughput(
    route: &Route,
    body: &Bytes,
    clients: usize,
    (warmup, measured): (Duration, Duration),
    servers: &[CpuGroup],
) -> Result<Throughput> {
    let start = Instant::now();
    let (from, until) = (start + warmup, start + warmup + measured);
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let client = Client::new(route)?;
        let body = body.clone();
        tasks.spawn(async move {
            let (mut times, mut partial, mut failed, mut first_error_opt) = (Vec::new(), 0, 0, None);
            while Instant::now() < until {
                let began = Instant::now();
                let outcome = client.call(&body).await;
                let ended = Instant::now();
                if ended < from || ended > until {
                    continue;
                }
                match outcome {
                    Outcome::Complete => times.push(ended - began),
                    Outcome::Partial => partial += 1,
                    Outcome::Failed(error) => {
                        failed += 1;
                        first_error_opt.get_or_insert(error);
                    }
                }
            }
            (times, partial, failed, first_error_opt)
        });
    }
    let me = [std::process::id() as i32];
    tokio::time::sleep_until(from).await;
    let sample = || {
        let groups: Vec<f64> = servers.iter().map(CpuGroup::seconds).collect();
        (groups, cpu_seconds(&me, false))
    };
    let (server_from, client_from) = sample();
    tokio::time::sleep_until(until).await;
    let (server_until, client_until) = sample();
    let mut row = Throughput {
        server_cpu_s: servers
            .iter()
            .zip(server_until.iter().zip(&server_from))
            .map(|(group, (until, from))| (group.label, until - from))
            .collect(),
        client_cpu_s: client_until - client_from,
        seconds: measured.as_secs_f64(),
        ..Default::default()
    };
    let mut times = Vec::new();
    while let Some(joined) = tasks.join_next().await {
        let (client_times, partial, failed, first_error_opt) = joined?;
        times.extend(client_times);
        row.partial += partial;
        row.failed += failed;
        if row.first_error_opt.is_none() {
            row.first_error_opt = first_error_opt;
        }
    }
    row.rps = times.len() as f64 / measured.as_secs_f64();
    row.latency = Summary::of(&times);
    Ok(row)
}

/// One call of a recorded run: when it was sent (since the run's start), how long it took and
/// how it ended.
#[derive(Clone, Debug)]
pub struct Sample {
    pub sent: Duration,
    pub took: Duration,
    pub outcome: Outcome,
}

/// `clients` clients calling `route` in a loop until `stop` is cancelled, every call recorded.
pub fn record(
    route: &Route,
    body: &Bytes,
    clients: usize,
    epoch: Instant,
    stop: tokio_util::sync::CancellationToken,
) -> Result<tokio::task::JoinSet<Vec<Sample>>> {
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..clients {
        let client = Client::new(route)?;
        let body = body.clone();
        let stop = stop.clone();
        tasks.spawn(async move {
            let mut samples = Vec::new();
            while !stop.is_cancelled() {
                let began = Instant::now();
                let outcome = client.call(&body).await;
                samples.push(Sample {
                    sent: began - epoch,
                    took: began.elapsed(),
                    outcome,
                });
            }
            samples
        });
    }
    Ok(tasks)
}
