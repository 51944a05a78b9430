//! The runner's configuration.

use std::path::PathBuf;

use kiln_core::config::{ConfigError, DatabaseConfig, GrpcConfig, NatsConfig, ObjectStoreConfig};
use kiln_core::metrics::MetricsConfig;
pub use kiln_core::runners::OnLost;
use kiln_core::runners::{LostPolicy, RunnerLease};
use kiln_core::secrets::SecretsConfig;
use kiln_core::service::{ServiceConfig, problems_to_result};
use kiln_core::subjects::validate_token;
use serde::{Deserialize, Serialize};

use crate::datasets::DatasetCacheConfig;
use crate::provider::docker::DockerConfig;
use crate::provider::process::config::ProcessConfig;
use crate::provider::sim::SimConfig;

pub const DEFAULT_PORT: u16 = 7074;

/// Default port of the runner's `/metrics`.
pub const DEFAULT_METRICS_PORT: u16 = 9474;

/// Which provider runs the instances.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum ProviderKind {
    /// Docker when the engine answers, else local processes.
    Auto,
    Docker,
    Process,
    /// A simulated cloud (see `sim`), for scale tests and scheduling studies.
    Sim,
}

/// The idle-GPU watchdog: a job whose GPUs' mean utilisation over `window-secs` stays under
/// `threshold-percent` is stopped (STOPPED, reason "idle GPU").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct IdleGpuConfig {
    pub threshold_percent: f64,
    /// 0 turns the watchdog off.
    pub window_secs: u64,
    pub sample_interval_ms: u64,
}

impl Default for IdleGpuConfig {
    fn default() -> Self {
        IdleGpuConfig {
            threshold_percent: 5.0,
            window_secs: 1800,
            sample_interval_ms: 10_000,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct Config {
    /// Health endpoint.
    pub grpc: GrpcConfig,
    /// The runner's own `/metrics` (the jobs' system metrics are `metrics-interval-ms`).
    pub metrics: MetricsConfig,
    pub database: DatabaseConfig,
    pub nats: NatsConfig,
    pub objects: ObjectStoreConfig,
    /// The key that opens project secrets: the api's, which sealed them.
    pub secrets: SecretsConfig,
    /// Unique name of this runner; jobs it runs carry it.
    pub runner_id: String,
    /// Pool this runner serves (`kiln.launch.<pool>`).
    pub pool: String,
    /// CPU this runner offers, in thousandths of a core; 0 means every core of the machine.
    pub cpu_millis: i64,
    /// Memory this runner offers, in bytes; 0 means the machine's memory.
    pub memory_bytes: i64,
    /// GPUs this runner offers; 0 means every GPU NVML finds (none without NVML).
    pub gpus: i64,
    /// Stops jobs whose GPUs stay idle.
    pub idle_gpu: IdleGpuConfig,
    /// Where jobs' code is unpacked and run.
    pub work_dir: PathBuf,
    /// How the relays of inference workers treat them (`[relay]`).
    pub relay: crate::relay::RelaySettings,
    /// Datasets on this runner's disk, fetched once and shared by the jobs that name them.
    pub dataset_cache: DatasetCacheConfig,
    /// Time between SIGTERM and SIGKILL when a job is stopped, in milliseconds.
    pub stop_grace_period_ms: u64,
    /// How often a running job's outputs are synced to object storage (only what changed is
    /// sent), so an attempt lost without notice resumes from the last sync; 0 turns it off.
    /// A job also asks for a sync by touching `$KILN_OUTPUTS/.kiln-sync`.
    pub outputs_sync_interval_secs: u64,
    /// The address other machines reach this runner's jobs at: a gang job's nodes meet at its
    /// rank 0's runner (`MASTER_ADDR`). 127.0.0.1 fits runners that share one machine.
    pub advertise_host: String,
    /// Address of the api, given to jobs as `KILN_API`.
    pub api_url: String,
    /// Address of log-ingest, given to jobs as `KILN_LOGS` (where they write their metrics).
    pub logs_url: String,
    /// What jobs trust for `https://` kiln addresses (`ca-file`) and the client certificate they
    /// present (`cert-file`, `key-file`), given to them as PEM text in `KILN_CA_PEM`,
    /// `KILN_CLIENT_CERT_PEM` and `KILN_CLIENT_KEY_PEM` (kiln-agent and the SDK read them).
    pub job_tls: kiln_core::tls::ClientTlsConfig,
    /// The static kiln-agent put into the containers of batch workers (at
    /// `/kiln/bin/kiln-agent`); empty: batch workers run only as processes.
    pub agent_binary: PathBuf,
    pub provider: ProviderKind,
    pub docker: DockerConfig,
    /// How process jobs are kept from kiln's files and from each other (`[process]`).
    pub process: ProcessConfig,
    pub sim: SimConfig,
    /// What happens to a job whose runner went away while it ran (this one restarted, or its
    /// lease expired): `fail` ends it LOST, `requeue` queues it again.
    pub on_lost: OnLost,
    /// Attempts a job gets when `on-lost = "requeue"`.
    pub max_attempts: i32,
    /// How long this runner's lease lasts without renewal (it renews every third of it): once
    /// it lapses, the scheduling leader ends or queues again the runner's jobs and stops counting
    /// its capacity, and the runner takes no launch until it holds the lease again.
    pub lease_ttl_ms: u64,
    /// How often system metrics of running jobs are sampled, in milliseconds.
    pub metrics_interval_ms: u64,
    /// How often capacity is reported, in milliseconds.
    pub report_interval_ms: u64,
    /// The instance metadata service of the cloud instance the runner is on (`[imds]`): its
    /// identity goes into the capacity reports, and its spot notices cordon the runner and
    /// checkpoint or stop its jobs.
    pub imds: crate::metadata::ImdsConfig,
    /// Registries whose images every job here pulls with the instance role's ECR token
    /// (`[ecr]`), unless its project has credentials of its own for them.
    pub ecr: crate::ecr::EcrConfig,
}

impl Default for Config {
    fn default() -> Self {
        Config {
            grpc: GrpcConfig::local(DEFAULT_PORT),
            metrics: MetricsConfig::local(DEFAULT_METRICS_PORT),
            database: DatabaseConfig::default(),
            nats: NatsConfig::default(),
            objects: ObjectStoreConfig::default(),
            secrets: SecretsConfig::default(),
            runner_id: "local".into(),
            pool: "local".into(),
            cpu_millis: 0,
            memory_bytes: 0,
            gpus: 0,
            idle_gpu: IdleGpuConfig::default(),
            work_dir: PathBuf::from("./data/work"),
            relay: Default::default(),
            dataset_cache: DatasetCacheConfig::default(),
            stop_grace_period_ms: 10_000,
            outputs_sync_interval_secs: 300,
            advertise_host: "127.0.0.1".into(),
            api_url: "http://127.0.0.1:7070".into(),
            logs_url: "http://127.0.0.1:7071".into(),
            job_tls: kiln_core::tls::ClientTlsConfig::default(),
            agent_binary: PathBuf::new(),
            provider: ProviderKind::Auto,
            docker: DockerConfig::default(),
            process: ProcessConfig::default(),
            sim: SimConfig::default(),
            on_lost: OnLost::Fail,
            max_attempts: 3,
            lease_ttl_ms: 10_000,
            report_interval_ms: if cfg!(test) { 200 } else { 5_000 },
            metrics_interval_ms: 5_000,
            imds: crate::metadata::ImdsConfig::default(),
            ecr: crate::ecr::EcrConfig::default(),
        }
    }
}

impl ServiceConfig for Config {
    fn apply_env(&mut self, env: &std::collections::HashMap<String, String>) {
        self.objects.apply_env(env);
    }

    fn validate(&self) -> Result<(), ConfigError> {
        let mut problems = Vec::new();
        self.database.validate(&mut problems);
        self.grpc.validate(&mut problems);
        self.job_tls.validate("job-tls", &mut problems);
        self.nats.validate(&mut problems);
        self.objects.validate(&mut problems);
        self.metrics.validate(&mut problems);
        self.secrets.validate(&mut problems);
        if let Err(problem) = validate_token("runner-id", &self.runner_id) {
            problems.push(problem);
        }
        if let Err(problem) = validate_token("pool", &self.pool) {
            problems.push(problem);
        }
        if self.cpu_millis < 0 || self.memory_bytes < 0 {
            problems.push("cpu-millis and memory-bytes must not be negative".into());
        }
        self.docker.validate(&mut problems);
        if self.provider != ProviderKind::Docker {
            self.process.validate(&self.work_dir, &mut problems);
        }
        self.sim.validate(&mut problems);
        self.imds.validate(&mut problems);
        self.ecr.validate(&mut problems);
        self.dataset_cache.validate(&self.work_dir, &mut problems);
        if !(0.0..=100.0).contains(&self.idle_gpu.threshold_percent) {
            problems.push("idle-gpu.threshold-percent must be between 0 and 100".into());
        }
        if self.idle_gpu.sample_interval_ms == 0 {
            problems.push("idle-gpu.sample-interval-ms must be at least 1".into());
        }
        if self.gpus < 0 {
            problems.push("gpus must not be negative".into());
        }
        if self.max_attempts < 1 {
            problems.push("max-attempts must be at least 1".into());
        }
        if self.metrics_interval_ms == 0 {
            problems.push("metrics-interval-ms must be at least 1".into());
        }
        if self.report_interval_ms == 0 {
            problems.push("report-interval-ms must be at least 1".into());
        }
        if !(300..=600_000).contains(&self.lease_ttl_ms) {
            problems.push(format!(
                "lease-ttl-ms is {}; give 300 to 600000 (the runner bucket keeps an expired lease for an hour)",
                self.lease_ttl_ms
            ));
        }
        problems_to_result(problems)
    }
}

impl Config {
    /// What is done with this runner's jobs when it goes away.
    pub fn lost_policy(&self) -> LostPolicy {
        LostPolicy {
            on_lost: self.on_lost,
            max_attempts: self.max_attempts,
        }
    }

    /// What this runner's lease tells the scheduler.
    pub fn runner_lease(&self) -> RunnerLease {
        RunnerLease {
            pool: self.pool.clone(),
            lost: self.lost_policy(),
        }
    }

    /// Whether process jobs run as uids of their own: `[process] isolation`, `auto` read as
    /// "the runner is root" (a docker runner runs none).
    pub fn isolates_processes(&self) -> bool {
        use crate::provider::process::config::Isolation;
        self.provider != ProviderKind::Docker
            && match self.process.isolation {
                Isolation::Off => false,
                Isolation::Uid => true,
                Isolation::Auto => crate::provider::process::isolation::effective_uid() == Some(0),
            }
    }

    /// Where staged files live that isolated jobs must reach: this runner's part of the work
    /// root when process jobs are isolated, else the work dir.
    pub fn shared_root(&self) -> Option<PathBuf> {
        self.isolates_processes()
            .then(|| crate::provider::process::isolation::runner_root(&self.process.work_root, &self.work_dir))
    }

    /// The dataset cache's directory: `[dataset-cache] dir`, else `datasets` in this runner's
    /// part of the work root when process jobs are isolated, else `<work-dir>/.datasets`.
    pub fn dataset_cache_dir(&self) -> PathBuf {
        match self.shared_root() {
            Some(root) if self.dataset_cache.dir.as_os_str().is_empty() => root.join("datasets"),
            _ => self.dataset_cache.dir_under(&self.work_dir),
        }
    }

    /// Where inference workers' model versions are staged: `models` in this runner's part of
    /// the work root when process jobs are isolated, else `<work-dir>/.models`.
    pub fn models_dir(&self) -> PathBuf {
        match self.shared_root() {
            Some(root) => root.join("models"),
            None => self.work_dir.join(".models"),
        }
    }

    /// CPU offered, with 0 read as the machine's cores.
    pub fn offered_cpu_millis(&self) -> i64 {
        if self.cpu_millis > 0 {
            return self.cpu_millis;
        }
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1);
        i64::try_from(cores).unwrap_or(1) * 1000
    }

    /// Memory offered, with 0 read as the machine's memory.
    pub fn offered_memory_bytes(&self) -> i64 {
        if self.memory_bytes > 0 {
            return self.memory_bytes;
        }
        machine_memory_bytes().unwrap_or(4 << 30)
    }
}

/// Reads MemTotal from /proc/meminfo.
fn machine_memory_bytes() -> Option<i64> {
    let meminfo = std::fs::read_to_string("/proc/meminfo").ok()?;
    let line = meminfo.lines().find(|line| line.starts_with("MemTotal:"))?;
    let kib: i64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kib * 1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_lease_ttl_is_checked_and_the_lease_carries_the_lost_policy() {
        let config = Config {
            on_lost: OnLost::Requeue,
            max_attempts: 5,
            pool: "gpu".into(),
            ..Config::default()
        };
        assert!(config.validate().is_ok());
        let lease = config.runner_lease();
        assert_eq!(
            (lease.pool.as_str(), lease.lost.on_lost, lease.lost.max_attempts),
            ("gpu", OnLost::Requeue, 5)
        );
        for lease_ttl_ms in [0, 299, 600_001] {
            let config = Config {
                lease_ttl_ms,
                ..Config::default()
            };
            let Err(ConfigError::Invalid(problems)) = config.validate() else {
                panic!("lease-ttl-ms {lease_ttl_ms} passed");
            };
            assert!(
                problems.len() == 1 && problems[0].starts_with("lease-ttl-ms"),
                "{problems:?}"
            );
        }
    }
}
