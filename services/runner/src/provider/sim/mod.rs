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
//!
//! An inference worker (its environment names `KILN_SERVE_PORT`) runs its command for real, as a
//! local process of the runner's host ([`SimProvider::with_host`]), on its simulated instance: the
//! cloud still picks, prices and boots the instance and takes it back after a spot notice
//! (the process is SIGKILLed when the notice is over), while signals, outputs and stats are the
//! process's. A runner on the sim hosts them so; without a host one runs nothing, like any job.
//!
//! [`SimCloud::preempt`] takes a spot instance back now, as a test or a study asks: the same
//! notice and end as a drawn preemption.
//!
//! `config` is the `[sim]` section of the runner's configuration, the catalogue of instance
//! types included; `lifecycle` answers the [`Provider`](super::Provider) calls, from picking
//! and booting an instance to its end; `hosted` runs a hosted instance's process; this module
//! holds the simulated cloud's state and its seeded draws.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::sys::signal::Signal;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::sync::{Notify, mpsc, watch};

use super::process::ProcessProvider;
use super::{Exit, Instance, Preemption};

mod config;
mod hosted;
mod lifecycle;

pub use config::{InstanceType, SimConfig};

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
    /// The job the instance runs.
    job_id: String,
    /// The host's instance running an inference worker's process (provisioned, then started).
    hosted: Option<Instance>,
    /// Told when [`SimCloud::preempt`] takes the instance back.
    preempt_now: Arc<Notify>,
}

type Instances = Arc<Mutex<HashMap<String, SimInstance>>>;

/// A handle on a simulated cloud's instances, kept by whoever may take them back.
#[derive(Clone)]
pub struct SimCloud {
    instances: Instances,
}

impl SimCloud {
    /// Takes back the spot instance running `job_id` as a drawn preemption does: the notice
    /// now, the instance ended when it is over. False when no spot instance runs the job.
    pub fn preempt(&self, job_id: &str) -> bool {
        let instances = self.instances.lock().expect("sim lock");
        let Some(instance) = instances
            .values()
            .find(|instance| instance.job_id == job_id && instance.record.spot && instance.signals.is_some())
        else {
            return false;
        };
        instance.preempt_now.notify_one();
        true
    }
}

/// A simulated cloud.
pub struct SimProvider {
    config: SimConfig,
    instances: Instances,
    /// Runs inference workers' processes.
    host: Option<Arc<ProcessProvider>>,
    preemptions_tx: mpsc::Sender<Preemption>,
    preemptions_rx: Mutex<Option<mpsc::Receiver<Preemption>>>,
}

impl SimProvider {
    pub fn new(config: SimConfig) -> SimProvider {
        let (preemptions_tx, preemptions_rx) = mpsc::channel(4096);
        SimProvider {
            config,
            instances: Instances::default(),
            host: None,
            preemptions_tx,
            preemptions_rx: Mutex::new(Some(preemptions_rx)),
        }
    }

    /// Runs inference workers' processes on `host` (see the module's notes).
    pub fn with_host(mut self, host: ProcessProvider) -> SimProvider {
        self.host = Some(Arc::new(host));
        self
    }

    /// A handle that takes instances back ([`SimCloud::preempt`]).
    pub fn cloud(&self) -> SimCloud {
        SimCloud {
            instances: self.instances.clone(),
        }
    }

    /// The host's instance of a hosted instance, if it is one.
    fn hosted(&self, instance: &Instance) -> Option<(Arc<ProcessProvider>, Instance)> {
        let host = self.host.clone()?;
        let hosted = self
            .instances
            .lock()
            .expect("sim lock")
            .get(&instance.id)?
            .hosted
            .clone()?;
        Some((host, hosted))
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

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::path::PathBuf;
    use std::sync::Arc;

    use kiln_core::scheduling::Market;

    use super::*;
    use crate::provider::{InstanceSpec, Provider};

    fn spec(n: usize, command: &[&str]) -> InstanceSpec {
        InstanceSpec {
            job_id: format!("job-{n:04}"),
            attempt: 1,
            runner_id: "sim".into(),
            owner_id: String::new(),
            project: "default".into(),
            pull: None,
            disk_bytes: 0,
            shm_bytes: 0,
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
