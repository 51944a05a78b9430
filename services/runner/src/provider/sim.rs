//! The `sim` provider: a simulated cloud, for thousand-instance tests and scheduling studies.
//!
//! Instance types have vCPUs, memory, GPUs and on-demand and spot prices; provisioning picks
//! the cheapest type that fits the job and waits a boot latency drawn from a range; spot
//! instances are taken back at a rate per hour, with a notice period first; a cap bounds the
//! instances alive at once. Every draw comes from a generator seeded by (seed, job, attempt), so
//! a run is reproducible whatever order instances are made in. Time runs `time-scale` times
//! faster than the wall clock.
//!
//! Nothing runs on a simulated instance, and it has no filesystem: a resumed attempt's restored
//! outputs are ignored (its boot line echoes `KILN_RESUME_FROM`). The command says what it does:
//! `sleep SECS` runs that long, `exit CODE` ends with that code, anything else ends at once with
//! 0. SIGTERM ends it with 143, SIGKILL with 137; a preempted instance ends with 137 after its
//! notice.
//!
//! A batch worker (its environment names `KILN_BATCH_ID`) runs kiln-agent's loop in this process,
//! for real, with built-ins only (`kiln:noop`): it takes items from item-batch until told to
//! stop (exit 0), and a preemption or a signal ends it at once, so its items go to other workers.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::Duration;

use bytes::Bytes;
use kiln_proto::v1::LogStream;
use nix::sys::signal::Signal;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use tokio::sync::{mpsc, watch};

use super::{
    Capacity, Exit, Instance, InstanceSpec, InstanceStats, Offer, OutputStream, Outputs, Preemption, Provider,
};
use crate::error::{Error, Result};
use kiln_core::scheduling::Market;

/// A kind of simulated machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case", deny_unknown_fields)]
pub struct InstanceType {
    pub name: String,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    #[serde(default)]
    pub gpus: u32,
    pub on_demand_per_hour: f64,
    pub spot_per_hour: f64,
}

/// The simulated cloud of one runner.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct SimConfig {
    pub seed: u64,
    pub instance_types: Vec<InstanceType>,
    /// Buy spot instances (preemptible) rather than on-demand ones.
    pub spot: bool,
    /// Boot latency range, in simulated milliseconds.
    pub boot_min_ms: u64,
    pub boot_max_ms: u64,
    /// Spot preemptions per instance-hour (simulated).
    pub preemptions_per_hour: f64,
    /// Time between the notice and the preemption, simulated.
    pub notice_ms: u64,
    /// Instances alive at once, at most.
    pub max_instances: usize,
    /// Simulated time per wall-clock time.
    pub time_scale: f64,
}

impl Default for SimConfig {
    fn default() -> Self {
        let gib = 1i64 << 30;
        SimConfig {
            seed: 1,
            instance_types: vec![
                InstanceType {
                    name: "c.large".into(),
                    cpu_millis: 2000,
                    memory_bytes: 4 * gib,
                    gpus: 0,
                    on_demand_per_hour: 0.085,
                    spot_per_hour: 0.030,
                },
                InstanceType {
                    name: "c.xlarge".into(),
                    cpu_millis: 4000,
                    memory_bytes: 8 * gib,
                    gpus: 0,
                    on_demand_per_hour: 0.17,
                    spot_per_hour: 0.06,
                },
                InstanceType {
                    name: "m.2xlarge".into(),
                    cpu_millis: 8000,
                    memory_bytes: 32 * gib,
                    gpus: 0,
                    on_demand_per_hour: 0.38,
                    spot_per_hour: 0.13,
                },
                InstanceType {
                    name: "g.xlarge".into(),
                    cpu_millis: 4000,
                    memory_bytes: 16 * gib,
                    gpus: 1,
                    on_demand_per_hour: 0.53,
                    spot_per_hour: 0.21,
                },
            ],
            spot: true,
            boot_min_ms: 20_000,
            boot_max_ms: 90_000,
            preemptions_per_hour: 0.05,
            notice_ms: 120_000,
            max_instances: 1000,
            time_scale: 1.0,
        }
    }
}

impl SimConfig {
    pub fn validate(&self, problems: &mut Vec<String>) {
        if self.instance_types.is_empty() {
            problems.push("sim.instance-types must name at least one type".into());
        }
        if self.boot_min_ms > self.boot_max_ms {
            problems.push("sim.boot-min-ms must not exceed sim.boot-max-ms".into());
        }
        if !(self.time_scale > 0.0 && self.time_scale.is_finite()) {
            problems.push("sim.time-scale must be a positive number".into());
        }
        if self.preemptions_per_hour < 0.0 {
            problems.push("sim.preemptions-per-hour must not be negative".into());
        }
        if self.max_instances == 0 {
            problems.push("sim.max-instances must be at least 1".into());
        }
    }
}

/// What the simulation decided for one instance, for reports and reproducibility checks.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRecord {
    pub instance_type: String,
    pub spot: bool,
    pub boot_ms: u64,
    /// Simulated time from start to preemption, when it is preempted before it ends.
    pub preempted_after_ms: Option<u64>,
    pub price_per_hour: f64,
}

struct SimInstance {
    record: SimRecord,
    command: Vec<String>,
    /// The agent's settings, for a batch worker.
    agent: Option<kiln_agent::Settings>,
    /// `KILN_RESUME_FROM` of a resumed attempt, echoed in the boot line.
    resume_from: Option<String>,
    exit: Option<watch::Receiver<Option<Exit>>>,
    signals: Option<mpsc::UnboundedSender<Signal>>,
    rng: StdRng,
}

/// A simulated cloud.
pub struct SimProvider {
    config: SimConfig,
    instances: Mutex<HashMap<String, SimInstance>>,
    preemptions_tx: mpsc::Sender<Preemption>,
    preemptions_rx: Mutex<Option<mpsc::Receiver<Preemption>>>,
}

impl SimProvider {
    pub fn new(config: SimConfig) -> SimProvider {
        let (preemptions_tx, preemptions_rx) = mpsc::channel(4096);
        SimProvider {
            config,
            instances: Mutex::default(),
            preemptions_tx,
            preemptions_rx: Mutex::new(Some(preemptions_rx)),
        }
    }

    /// Wall-clock time of a simulated duration.
    fn wall(&self, simulated_ms: u64) -> Duration {
        Duration::from_secs_f64(simulated_ms as f64 / 1000.0 / self.config.time_scale)
    }

    /// Instances alive now.
    pub fn alive(&self) -> usize {
        self.instances.lock().expect("sim lock").len()
    }

    /// What the simulation decided for an instance.
    pub fn record(&self, instance: &Instance) -> Option<SimRecord> {
        self.instances
            .lock()
            .expect("sim lock")
            .get(&instance.id)
            .map(|i| i.record.clone())
    }

    fn seeded(&self, job_id: &str, attempt: i32) -> StdRng {
        // FNV-1a over the job and attempt, mixed with the seed: order-independent draws.
        let mut hash: u64 = 0xcbf2_9ce4_8422_2325 ^ self.config.seed;
        for byte in job_id.bytes().chain(attempt.to_le_bytes()) {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(0x0100_0000_01b3);
        }
        StdRng::seed_from_u64(hash)
    }
}

/// The kiln-agent settings of a batch worker's instance; None for other jobs.
fn agent_settings(spec: &InstanceSpec) -> Option<kiln_agent::Settings> {
    Some(kiln_agent::Settings {
        batch_id: spec.env.get("KILN_BATCH_ID")?.clone(),
        addr: spec.env.get("KILN_ITEMS_ADDR")?.clone(),
        token: spec.env.get("KILN_TOKEN")?.clone(),
        slots: 1,
    })
}

/// Simulated run time of a command, in ms, and its exit code.
fn behaviour(command: &[String]) -> (u64, i32) {
    match command {
        [program, secs] if program == "sleep" => (secs.parse::<f64>().map(|s| (s * 1000.0) as u64).unwrap_or(0), 0),
        [program, code] if program == "exit" => (0, code.parse().unwrap_or(1)),
        _ => (0, 0),
    }
}

#[async_trait::async_trait]
impl Provider for SimProvider {
    fn name(&self) -> &'static str {
        "sim"
    }

    async fn provision(&self, spec: &InstanceSpec) -> Result<Instance> {
        let instance_type = self
            .config
            .instance_types
            .iter()
            .filter(|t| t.cpu_millis >= spec.cpu_millis && t.memory_bytes >= spec.memory_bytes && t.gpus >= spec.gpus)
            .min_by(|a, b| a.on_demand_per_hour.total_cmp(&b.on_demand_per_hour))
            .ok_or_else(|| {
                Error::Capacity(format!(
                    "no simulated instance type has {} CPU millis, {} bytes and {} GPUs",
                    spec.cpu_millis, spec.memory_bytes, spec.gpus
                ))
            })?
            .clone();
        let mut rng = self.seeded(&spec.job_id, spec.attempt);
        let boot_ms = rng.random_range(self.config.boot_min_ms..=self.config.boot_max_ms);
        let spot = self.config.spot && spec.market == Market::Spot;
        let preempted_after_ms = (spot && self.config.preemptions_per_hour > 0.0).then(|| {
            // Exponential time to preemption.
            let uniform: f64 = rng.random_range(f64::EPSILON..1.0);
            (-uniform.ln() / self.config.preemptions_per_hour * 3_600_000.0) as u64
        });
        let id = format!("sim:{}:{}-{}", instance_type.name, spec.job_id, spec.attempt);
        {
            let mut instances = self.instances.lock().expect("sim lock");
            if instances.len() >= self.config.max_instances {
                return Err(Error::Capacity(format!(
                    "the simulated cloud's cap of {} instances is reached",
                    self.config.max_instances
                )));
            }
            let record = SimRecord {
                price_per_hour: if spot {
                    instance_type.spot_per_hour
                } else {
                    instance_type.on_demand_per_hour
                },
                instance_type: instance_type.name,
                spot,
                boot_ms,
                preempted_after_ms,
            };
            instances.insert(
                id.clone(),
                SimInstance {
                    record,
                    command: spec.command.clone(),
                    agent: agent_settings(spec),
                    resume_from: spec.env.get("KILN_RESUME_FROM").cloned(),
                    exit: None,
                    signals: None,
                    rng,
                },
            );
        }
        tokio::time::sleep(self.wall(boot_ms)).await;
        Ok(Instance {
            provider: "sim",
            job_id: spec.job_id.clone(),
            attempt: spec.attempt,
            id,
            scratch_dir: PathBuf::new(),
        })
    }

    async fn start(&self, instance: &mut Instance) -> Result<OutputStream> {
        let (exit_tx, exit_rx) = watch::channel(None);
        let (signals_tx, mut signals_rx) = mpsc::unbounded_channel();
        let (record, command, agent, resume_from) = {
            let mut instances = self.instances.lock().expect("sim lock");
            let sim = instances
                .get_mut(&instance.id)
                .ok_or_else(|| Error::Capacity("the instance is gone".into()))?;
            sim.exit = Some(exit_rx);
            sim.signals = Some(signals_tx);
            let _ = sim.rng.random::<u64>();
            (
                sim.record.clone(),
                sim.command.clone(),
                sim.agent.clone(),
                sim.resume_from.clone(),
            )
        };
        // An agent runs until told to stop: a year stands for "no end of its own".
        let (run_ms, code) = match agent {
            Some(_) => (365 * 86_400_000, 0),
            None => behaviour(&command),
        };
        let run = self.wall(run_ms);
        let preemption = record.preempted_after_ms.filter(|&after| after < run_ms);
        // A batch worker's agent: it ends the instance when item-batch tells it to stop.
        let agent_stop = tokio_util::sync::CancellationToken::new();
        let mut agent_done = match agent {
            Some(settings) => {
                let stop = agent_stop.clone();
                let task = tokio::spawn(async move {
                    match kiln_agent::run(settings, kiln_agent::Runner::BuiltinsOnly, stop).await {
                        Ok(kiln_agent::Ended::Stopped(_)) => 0,
                        Ok(kiln_agent::Ended::Terminated) => 128 + 15,
                        Err(_) => 1,
                    }
                });
                Some(task)
            }
            None => None,
        };
        let notice = self.wall(self.config.notice_ms);
        let preemptions = self.preemptions_tx.clone();
        let job_id = instance.job_id.clone();
        let notify_at = preemption.map(|after| self.wall(after.saturating_sub(self.config.notice_ms)));
        let notice_ms = self.config.notice_ms;
        tokio::spawn(async move {
            let started = tokio::time::Instant::now();
            let agent_ended = async {
                match agent_done.as_mut() {
                    Some(task) => task.await.unwrap_or(1),
                    None => std::future::pending().await,
                }
            };
            tokio::pin!(agent_ended);
            let exit_code = loop {
                let notify = async {
                    match notify_at {
                        Some(at) => tokio::time::sleep_until(started + at).await,
                        None => std::future::pending().await,
                    }
                };
                tokio::select! {
                    _ = tokio::time::sleep_until(started + run) => break code,
                    code = &mut agent_ended => break code,
                    signal = signals_rx.recv() => match signal {
                        Some(Signal::SIGKILL) | None => break 128 + 9,
                        Some(Signal::SIGTERM) => break 128 + 15,
                        Some(_) => {}
                    },
                    _ = notify => {
                        let _ = preemptions.send(Preemption { job_id: job_id.clone(), notice: Duration::from_millis(notice_ms) }).await;
                        // The cloud takes the machine back after the notice, whatever the job does.
                        tokio::select! {
                            _ = tokio::time::sleep(notice) => break 128 + 9,
                            signal = signals_rx.recv() => break match signal {
                                Some(Signal::SIGTERM) => 128 + 15,
                                _ => 128 + 9,
                            },
                        }
                    }
                }
            };
            // Whatever ended the instance ends its agent (a preempted worker's items go back).
            agent_stop.cancel();
            let _ = exit_tx.send(Some(Exit {
                code: exit_code,
                oom_killed: false,
            }));
        });
        let mut line = format!(
            "sim: {} ({}) booted in {} ms",
            record.instance_type,
            if record.spot { "spot" } else { "on-demand" },
            record.boot_ms
        );
        if let Some(resume_from) = &resume_from {
            line.push_str(&format!("; KILN_RESUME_FROM={resume_from}"));
        }
        Ok(Box::pin(futures::stream::iter([(
            LogStream::Stdout,
            Bytes::from(line + "\n"),
        )])))
    }

    async fn signal(&self, instance: &Instance, signal: Signal) -> Result<()> {
        if let Some(signals) = self
            .instances
            .lock()
            .expect("sim lock")
            .get(&instance.id)
            .and_then(|i| i.signals.clone())
        {
            let _ = signals.send(signal);
        }
        Ok(())
    }

    async fn wait(&self, instance: &Instance) -> Result<Exit> {
        let exit = self
            .instances
            .lock()
            .expect("sim lock")
            .get(&instance.id)
            .and_then(|i| i.exit.clone());
        let Some(mut exit) = exit else {
            return Ok(Exit {
                code: -1,
                oom_killed: false,
            });
        };
        let exit = exit
            .wait_for(Option::is_some)
            .await
            .map_err(|e| Error::Capacity(e.to_string()))?;
        Ok(exit.expect("waited for some"))
    }

    async fn outputs(&self, _instance: &Instance) -> Result<Outputs> {
        Ok(Outputs::None)
    }

    async fn stats(&self, _instance: &Instance) -> Result<Option<InstanceStats>> {
        Ok(None)
    }

    async fn release(&self, instance: &Instance) -> Result<()> {
        if let Some(sim) = self.instances.lock().expect("sim lock").remove(&instance.id)
            && let Some(signals) = sim.signals
        {
            let _ = signals.send(Signal::SIGKILL);
        }
        Ok(())
    }

    async fn capacity(&self) -> Result<Capacity> {
        let largest = |f: fn(&InstanceType) -> i64| self.config.instance_types.iter().map(f).max().unwrap_or(0);
        let count = i64::try_from(self.config.max_instances).unwrap_or(i64::MAX);
        Ok(Capacity {
            cpu_millis: largest(|t| t.cpu_millis).saturating_mul(count),
            memory_bytes: largest(|t| t.memory_bytes).saturating_mul(count),
            gpus: u32::try_from(largest(|t| i64::from(t.gpus)).saturating_mul(count)).unwrap_or(u32::MAX),
        })
    }

    fn offer(&self) -> Offer {
        // The biggest job the cloud takes (each resource's largest type), priced as a share of
        // the type with the most CPU: an estimate, as the catalogue mixes shapes.
        let types = &self.config.instance_types;
        let largest = types.iter().max_by_key(|t| (t.cpu_millis, t.memory_bytes));
        Offer {
            instance: Some(Capacity {
                cpu_millis: types.iter().map(|t| t.cpu_millis).max().unwrap_or(0),
                memory_bytes: types.iter().map(|t| t.memory_bytes).max().unwrap_or(0),
                gpus: types.iter().map(|t| t.gpus).max().unwrap_or(0),
            }),
            on_demand_per_hour: largest.map_or(0.0, |t| t.on_demand_per_hour),
            spot_per_hour: largest.map_or(0.0, |t| t.spot_per_hour),
            spot: self.config.spot,
            time_scale: self.config.time_scale,
        }
    }

    fn preemptions(&self) -> Option<mpsc::Receiver<Preemption>> {
        self.preemptions_rx.lock().expect("sim lock").take()
    }

    async fn recover(
        &self,
        _job_id: &str,
        _attempt: i32,
        _instance_id: &str,
        _scratch_dir: PathBuf,
    ) -> Result<Option<Instance>> {
        // A simulated cloud lives in its runner: nothing outlives a restart.
        Ok(None)
    }

    async fn release_leftovers(&self, _runner_id: &str, _keep: &[String]) -> Result<usize> {
        Ok(0)
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Arc;

    use super::*;

    fn spec(n: usize, command: &[&str]) -> InstanceSpec {
        InstanceSpec {
            job_id: format!("job-{n:04}"),
            attempt: 1,
            runner_id: "sim".into(),
            image: String::new(),
            command: command.iter().map(|s| s.to_string()).collect(),
            env: BTreeMap::new(),
            cpu_millis: if n.is_multiple_of(3) { 3000 } else { 1000 },
            memory_bytes: 1 << 30,
            gpus: 0,
            market: Market::Spot,
            gpu_devices: Vec::new(),
            code: None,
            datasets: Vec::new(),
            agent: None,
            scratch_dir: PathBuf::new(),
            restore: None,
        }
    }

    fn config(seed: u64) -> SimConfig {
        // A very preemptible cloud, so a thousand one-hour jobs see preemptions.
        SimConfig {
            seed,
            preemptions_per_hour: 0.5,
            ..SimConfig::default()
        }
    }

    /// Provisions, runs and releases 1,000 instances at once; returns what happened to each.
    async fn run_thousand(seed: u64) -> Vec<(String, SimRecord, i32, bool)> {
        let provider = Arc::new(SimProvider::new(config(seed)));
        let mut notices = provider.preemptions().expect("a sim has preemptions");
        let mut tasks = Vec::new();
        for n in 0..1000 {
            let provider = provider.clone();
            tasks.push(tokio::spawn(async move {
                let mut instance = provider.provision(&spec(n, &["sleep", "3600"])).await.unwrap();
                let record = provider.record(&instance).unwrap();
                let _output = provider.start(&mut instance).await.unwrap();
                let exit = provider.wait(&instance).await.unwrap();
                provider.release(&instance).await.unwrap();
                (instance.job_id, record, exit.code)
            }));
        }
        let mut results = Vec::new();
        for task in tasks {
            results.push(task.await.unwrap());
        }
        assert_eq!(provider.alive(), 0, "every instance is released");
        let mut noticed = std::collections::HashSet::new();
        while let Ok(notice) = notices.try_recv() {
            noticed.insert(notice.job_id);
        }
        results
            .into_iter()
            .map(|(job, record, code)| {
                let n = noticed.contains(&job);
                (job, record, code, n)
            })
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_thousand_instances_are_reproducible_from_the_seed() {
        let first = run_thousand(7).await;
        let second = run_thousand(7).await;
        assert_eq!(first, second);
        let preempted: Vec<_> = first
            .iter()
            .filter(|(_, record, _, _)| record.preempted_after_ms.is_some_and(|ms| ms < 3_600_000))
            .collect();
        assert!(
            preempted.len() > 100 && preempted.len() < 600,
            "{} preempted",
            preempted.len()
        );
        for (_, record, code, noticed) in &first {
            let was_preempted = record.preempted_after_ms.is_some_and(|ms| ms < 3_600_000);
            assert_eq!(
                *noticed, was_preempted,
                "a notice comes before every preemption, and only then"
            );
            assert_eq!(*code, if was_preempted { 137 } else { 0 });
            assert!((20_000..=90_000).contains(&record.boot_ms));
        }
        // Bigger jobs get bigger machines.
        assert!(first.iter().all(|(job, record, _, _)| {
            let n: usize = job.trim_start_matches("job-").parse().unwrap();
            n.is_multiple_of(3) == (record.instance_type == "c.xlarge")
        }));
        assert_ne!(first, run_thousand(8).await);
    }

    #[tokio::test(start_paused = true)]
    async fn the_cap_holds() {
        let provider = SimProvider::new(SimConfig {
            max_instances: 2,
            ..config(1)
        });
        let a = provider.provision(&spec(1, &["true"])).await.unwrap();
        provider.provision(&spec(2, &["true"])).await.unwrap();
        let error = provider.provision(&spec(4, &["true"])).await.unwrap_err();
        assert!(error.to_string().contains("cap of 2"), "{error}");
        provider.release(&a).await.unwrap();
        provider.provision(&spec(4, &["true"])).await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn commands_say_what_the_instance_does() {
        let provider = SimProvider::new(SimConfig {
            spot: false,
            ..config(1)
        });
        let mut failing = provider.provision(&spec(1, &["exit", "3"])).await.unwrap();
        let _output = provider.start(&mut failing).await.unwrap();
        assert_eq!(provider.wait(&failing).await.unwrap().code, 3);
        let mut sleeping = provider.provision(&spec(2, &["sleep", "600"])).await.unwrap();
        let _output = provider.start(&mut sleeping).await.unwrap();
        provider.signal(&sleeping, Signal::SIGTERM).await.unwrap();
        assert_eq!(provider.wait(&sleeping).await.unwrap().code, 143);
        let error = provider
            .provision(&InstanceSpec {
                gpus: 8,
                ..spec(3, &["true"])
            })
            .await
            .unwrap_err();
        assert!(error.to_string().contains("8 GPUs"), "{error}");
    }
}
