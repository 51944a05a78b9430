//! The `docker` provider: an instance is a container on a local or remote Docker Engine.
//!
//! - The image is pulled when absent, with the project's registry credentials; an image pulled
//!   with credentials is not given to another project's job from the engine's cache (`pull`). A
//!   failed pull ends the job with "image not found", a refused one with the registry's reason.
//! - CPU (NanoCPUs) and memory (no swap) limits come from the job; GPUs are device requests to
//!   the NVIDIA runtime; labels `kiln.job`, `kiln.attempt` and `kiln.runner` mark everything.
//! - Not privileged, every capability dropped, `no-new-privileges`, an init process that
//!   forwards signals, no Docker socket. The network: with `isolate-jobs` (the default) the
//!   jobs' own bridge, made at connect, whose firewall lets jobs reach only kiln's job
//!   endpoints (see `firewall`); else the network of the configuration (never the host's
//!   unless configured).
//! - Volumes ("block storage" of the instance): the code at `/kiln/code` (the working
//!   directory), outputs at `/kiln/outputs`. The code (and a resumed attempt's restored
//!   outputs) are uploaded into their volumes through the engine's archive API before the
//!   start. Each dataset is a read-only bind mount at `/kiln/data/<name>` of its entry in the
//!   runner's dataset cache, so datasets need the engine on the runner's host.
//!
//! `config` is the `[docker]` section of the runner's configuration; `engine` makes images,
//! volumes and containers and fills a container before its start; this module drives the
//! instance through the [`Provider`] calls.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use bollard::Docker;
use bollard::query_parameters::{
    DownloadFromContainerOptionsBuilder, KillContainerOptionsBuilder, StatsOptionsBuilder,
};
use futures::StreamExt;
use nix::sys::signal::Signal;
use tokio::io::AsyncWriteExt;

use super::{Capacity, Exit, Instance, InstanceSpec, InstanceStats, OUTPUTS_DIR, OutputStream, Outputs, Provider};
use crate::error::{Error, Result};

mod config;
pub mod disk;
mod engine;
mod pull;
pub use super::firewall;
pub mod network;

pub use config::{DockerConfig, FirewallMode, PRIVATE_RANGES};

pub const LABEL_JOB: &str = "kiln.job";
pub const LABEL_ATTEMPT: &str = "kiln.attempt";
pub const LABEL_RUNNER: &str = "kiln.runner";

fn docker_error(what: &str) -> impl FnOnce(bollard::errors::Error) -> Error + '_ {
    move |error| Error::Docker {
        what: what.to_string(),
        message: error.to_string(),
    }
}

fn not_found(error: &bollard::errors::Error) -> bool {
    matches!(
        error,
        bollard::errors::Error::DockerResponseServerError { status_code: 404, .. }
    )
}

/// Runs jobs as containers.
pub struct DockerProvider {
    docker: Docker,
    config: DockerConfig,
    capacity: Capacity,
    /// The host's address on the jobs' bridge, as containers see it (the isolated network, or
    /// the engine's `bridge`).
    gateway: Option<String>,
    /// The network jobs join.
    network_mode: String,
    /// Jobs' own disks (`--disk`).
    disks: disk::Disks,
}

impl DockerProvider {
    /// Connects to the engine, negotiating the API version (Debian's engine speaks 1.41), and
    /// checks it answers. `cpu_millis`/`memory_bytes` of 0 take the engine's own figures. With
    /// `isolate-jobs`, makes the jobs' network and installs its firewall, letting jobs reach
    /// `job_endpoints` (the URLs kiln gives them) and `docker.job-endpoints`; a failure there
    /// is an error: no job runs unconfined unless the configuration says so.
    /// Jobs' disks go under `disks_dir`.
    pub async fn connect(
        config: DockerConfig,
        cpu_millis: i64,
        memory_bytes: i64,
        job_endpoints: &[String],
        disks_dir: PathBuf,
    ) -> Result<DockerProvider> {
        let docker = DockerProvider::engine(&config).await?;
        let info = docker.info().await.map_err(docker_error("read the engine's info"))?;
        let disks = disk::Disks::new(disks_dir);
        let disk_bytes = match config.disk_bytes {
            Some(bytes) => bytes,
            None => disks.offer().unwrap_or_else(|why| {
                tracing::warn!(why, "this runner gives jobs no disk of their own (--disk)");
                0
            }),
        };
        let capacity = Capacity {
            cpu_millis: if cpu_millis > 0 {
                cpu_millis
            } else {
                info.ncpu.unwrap_or(1) * 1000
            },
            memory_bytes: if memory_bytes > 0 {
                memory_bytes
            } else {
                info.mem_total.unwrap_or(0)
            },
            gpus: 0,
            disk_bytes,
        };
        if config.isolated() {
            let network = network::isolate(&docker, &config, job_endpoints).await?;
            return Ok(DockerProvider {
                docker,
                network_mode: network.name,
                gateway: Some(network.gateway),
                config,
                capacity,
                disks,
            });
        }
        if config.network != "none" {
            tracing::warn!(
                network = %config.network,
                "docker.isolate-jobs = false: jobs reach whatever this network reaches (kiln's services, the instance metadata address)"
            );
        }
        let gateway = if config.network == "bridge" {
            match docker
                .inspect_network("bridge", None::<bollard::query_parameters::InspectNetworkOptions>)
                .await
            {
                Ok(network) => bridge_gateway(network.ipam.and_then(|ipam| ipam.config).unwrap_or_default()),
                Err(error) => {
                    tracing::warn!(error = %error, "cannot inspect the bridge network; containers may not reach kiln");
                    None
                }
            }
        } else {
            None
        };
        Ok(DockerProvider {
            docker,
            network_mode: config.network.clone(),
            config,
            capacity,
            gateway,
            disks,
        })
    }

    /// A client of the engine of `config`, at the API version both speak.
    pub async fn engine(config: &DockerConfig) -> Result<Docker> {
        let timeout = 120;
        let docker = if let Some(path) = config.host.strip_prefix("unix://") {
            Docker::connect_with_socket(path, timeout, bollard::API_DEFAULT_VERSION)
        } else if let (Some(ca), Some(cert), Some(key)) = (&config.tls_ca, &config.tls_cert, &config.tls_key) {
            Docker::connect_with_ssl(&config.host, key, cert, ca, timeout, bollard::API_DEFAULT_VERSION)
        } else {
            Docker::connect_with_http(&config.host, timeout, bollard::API_DEFAULT_VERSION)
        }
        .map_err(docker_error("connect"))?;
        docker
            .negotiate_version()
            .await
            .map_err(docker_error("negotiate the API version"))
    }

    /// Rewrites loopback URLs of kiln (`http://127.0.0.1:7070`, each of a comma-separated list)
    /// to the host's address on the bridge, which the container can reach; other values are
    /// left as they are.
    fn reachable(&self, value: &str) -> String {
        let Some(gateway) = &self.gateway else {
            return value.to_string();
        };
        ["//127.0.0.1:", "//localhost:", "//0.0.0.0:"]
            .iter()
            .fold(value.to_string(), |value, loopback| {
                value.replace(loopback, &format!("//{gateway}:"))
            })
    }

    fn labels(spec_job: &str, attempt: i32, runner_id: &str) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_JOB.to_string(), spec_job.to_string()),
            (LABEL_ATTEMPT.to_string(), attempt.to_string()),
            (LABEL_RUNNER.to_string(), runner_id.to_string()),
        ])
    }
}

/// The host's address on a bridge: its IPAM gateway, or (the default bridge of Engine 20.10
/// names none) the first address of its IPv4 subnet, where dockerd puts the host.
pub(crate) fn bridge_gateway(configs: Vec<bollard::models::IpamConfig>) -> Option<String> {
    configs.into_iter().find_map(|config| {
        if let Some(gateway) = config.gateway.filter(|g| !g.is_empty()) {
            return Some(gateway);
        }
        let (network, _) = config
            .subnet?
            .split_once('/')
            .map(|(a, b)| (a.to_string(), b.to_string()))?;
        let network: std::net::Ipv4Addr = network.parse().ok()?;
        Some(std::net::Ipv4Addr::from(u32::from(network) + 1).to_string())
    })
}

fn container_id(instance: &Instance) -> &str {
    instance.id.strip_prefix("docker:").unwrap_or(&instance.id)
}

#[async_trait::async_trait]
impl Provider for DockerProvider {
    fn name(&self) -> &'static str {
        "docker"
    }

    async fn provision(&self, spec: &InstanceSpec) -> Result<Instance> {
        if spec.image.is_empty() {
            return Err(Error::NoImage);
        }
        self.ensure_image(&spec.image, &spec.project, spec.pull.as_ref())
            .await?;
        match self.create_instance(spec).await {
            Ok(instance) => Ok(instance),
            Err(error) => {
                // Nothing half-made stays behind.
                if let Err(cleanup) = self.release_attempt(&spec.job_id, &spec.attempt.to_string()).await {
                    tracing::warn!(job_id = %spec.job_id, error = %cleanup, "cannot clean up a failed provision");
                }
                if let Err(cleanup) = self.disks.remove(&spec.job_id, spec.attempt).await {
                    tracing::warn!(job_id = %spec.job_id, error = %cleanup, "cannot remove a failed provision's disk");
                }
                Err(error)
            }
        }
    }

    async fn start(&self, instance: &mut Instance) -> Result<OutputStream> {
        self.start_instance(instance).await
    }

    async fn signal(&self, instance: &Instance, signal: Signal) -> Result<()> {
        let options = KillContainerOptionsBuilder::new().signal(signal.as_str()).build();
        match self.docker.kill_container(container_id(instance), Some(options)).await {
            Ok(()) => Ok(()),
            // Not running (any more): nothing to signal.
            Err(bollard::errors::Error::DockerResponseServerError {
                status_code: 404 | 409, ..
            }) => Ok(()),
            Err(error) => Err(docker_error("signal the container")(error)),
        }
    }

    async fn wait(&self, instance: &Instance) -> Result<Exit> {
        let id = container_id(instance);
        loop {
            // The wait ends with an error for a non-zero exit code; the inspection tells.
            let _ = self.docker.wait_container(id, None).next().await;
            let inspected = self
                .docker
                .inspect_container(id, None)
                .await
                .map_err(docker_error("inspect the container"))?;
            let state = inspected.state.unwrap_or_default();
            if state.running == Some(true) {
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
            let code = i32::try_from(state.exit_code.unwrap_or(-1)).unwrap_or(-1);
            return Ok(Exit {
                code,
                oom_killed: state.oom_killed.unwrap_or(false),
                disk_full: code != 0 && self.disks.full(&instance.job_id, instance.attempt),
            });
        }
    }

    /// The engine archives a running container's outputs as it does an ended one's.
    async fn live_outputs(&self, instance: &Instance) -> Result<Outputs> {
        self.outputs(instance).await
    }

    /// The engine's archive of the marker alone: its tar header has the time (in seconds).
    async fn sync_asked(&self, instance: &Instance) -> Result<Option<i64>> {
        let path = format!("{OUTPUTS_DIR}/{}", super::SYNC_MARKER);
        let options = DownloadFromContainerOptionsBuilder::new().path(&path).build();
        let mut archive = self
            .docker
            .download_from_container(container_id(instance), Some(options));
        let mut bytes = Vec::new();
        while let Some(chunk) = archive.next().await {
            match chunk {
                // A marker is empty or small; the first header is all that is read.
                Ok(chunk) if bytes.len() < 512 => bytes.extend_from_slice(&chunk),
                Ok(_) => {}
                Err(error) if not_found(&error) => return Ok(None),
                Err(error) => return Err(docker_error("read the sync marker")(error)),
            }
        }
        let Some(header) = bytes.get(..512) else {
            return Ok(None);
        };
        let header = tar::Header::from_byte_slice(header);
        match (header.entry_type().is_file(), header.mtime()) {
            (true, Ok(mtime)) => Ok(Some(i64::try_from(mtime).unwrap_or(i64::MAX / 1000) * 1000)),
            _ => Ok(None),
        }
    }

    async fn outputs(&self, instance: &Instance) -> Result<Outputs> {
        let path = instance.scratch_dir.join("outputs.tar");
        tokio::fs::create_dir_all(&instance.scratch_dir)
            .await
            .map_err(Error::io(format!("cannot create {}", instance.scratch_dir.display())))?;
        let mut file = tokio::fs::File::create(&path)
            .await
            .map_err(Error::io(format!("cannot create {}", path.display())))?;
        let options = DownloadFromContainerOptionsBuilder::new().path(OUTPUTS_DIR).build();
        let mut archive = self
            .docker
            .download_from_container(container_id(instance), Some(options));
        while let Some(chunk) = archive.next().await {
            match chunk {
                Ok(bytes) => file
                    .write_all(&bytes)
                    .await
                    .map_err(Error::io("cannot spool the outputs"))?,
                Err(error) if not_found(&error) => return Ok(Outputs::None),
                Err(error) => return Err(docker_error("download the outputs")(error)),
            }
        }
        file.flush().await.map_err(Error::io("cannot spool the outputs"))?;
        Ok(Outputs::Tar(path))
    }

    async fn stats(&self, instance: &Instance) -> Result<Option<InstanceStats>> {
        // One sample; the engine fills the previous one a second earlier, for the CPU delta.
        let options = StatsOptionsBuilder::new().stream(false).build();
        let Some(stats) = self.docker.stats(container_id(instance), Some(options)).next().await else {
            return Ok(None);
        };
        let stats = match stats {
            Ok(stats) => stats,
            Err(error) if not_found(&error) => return Ok(None),
            Err(error) => return Err(docker_error("read the container's stats")(error)),
        };
        let total = |cpu: &Option<bollard::models::ContainerCpuStats>| {
            let cpu = cpu.as_ref();
            let used = cpu
                .and_then(|c| c.cpu_usage.as_ref())
                .and_then(|u| u.total_usage)
                .unwrap_or(0);
            (used, cpu.and_then(|c| c.system_cpu_usage).unwrap_or(0))
        };
        let (used, system) = total(&stats.cpu_stats);
        let (used_before, system_before) = total(&stats.precpu_stats);
        let cpus = stats.cpu_stats.as_ref().and_then(|c| c.online_cpus).unwrap_or(1);
        let system_delta = system.saturating_sub(system_before);
        let cpu_percent = if system_delta > 0 {
            used.saturating_sub(used_before) as f64 / system_delta as f64 * f64::from(cpus) * 100.0
        } else {
            0.0
        };
        let memory_bytes = stats.memory_stats.and_then(|m| m.usage).unwrap_or(0);
        Ok(Some(InstanceStats {
            cpu_percent,
            memory_bytes,
        }))
    }

    async fn release(&self, instance: &Instance) -> Result<()> {
        self.release_attempt(&instance.job_id, &instance.attempt.to_string())
            .await?;
        self.disks.remove(&instance.job_id, instance.attempt).await?;
        match tokio::fs::remove_dir_all(&instance.scratch_dir).await {
            Err(error) if error.kind() != std::io::ErrorKind::NotFound => Err(Error::io(format!(
                "cannot remove {}",
                instance.scratch_dir.display()
            ))(error)),
            _ => Ok(()),
        }
    }

    async fn capacity(&self) -> Result<Capacity> {
        Ok(self.capacity)
    }

    async fn recover(
        &self,
        job_id: &str,
        attempt: i32,
        _instance_id: &str,
        scratch_dir: PathBuf,
    ) -> Result<Option<Instance>> {
        let wanted = attempt.to_string();
        let found = self
            .containers_labelled(LABEL_JOB, job_id)
            .await?
            .into_iter()
            .find(|(_, labels)| labels.get(LABEL_ATTEMPT) == Some(&wanted));
        Ok(found.map(|(id, _)| Instance {
            provider: "docker",
            job_id: job_id.to_string(),
            attempt,
            id: format!("docker:{id}"),
            scratch_dir,
        }))
    }

    async fn release_leftovers(&self, runner_id: &str, keep: &[String]) -> Result<usize> {
        let mut released = 0;
        for (id, labels) in self.containers_labelled(LABEL_RUNNER, runner_id).await? {
            if !labels.get(LABEL_JOB).is_some_and(|job| keep.contains(job)) {
                self.remove_container(&id).await?;
                released += 1;
            }
        }
        for (name, labels) in self.volumes_labelled(LABEL_RUNNER, runner_id).await? {
            if !labels.get(LABEL_JOB).is_some_and(|job| keep.contains(job)) {
                self.remove_volume(&name).await?;
            }
        }
        self.disks.remove_leftovers(keep).await?;
        Ok(released)
    }
}
