//! The `docker` provider: an instance is a container on a local or remote Docker Engine.
//!
//! - The image is pulled when absent; a failed pull ends the job with "image not found".
//! - CPU (NanoCPUs) and memory (no swap) limits come from the job; GPUs are device requests to
//!   the NVIDIA runtime; labels `kiln.job`, `kiln.attempt` and `kiln.runner` mark everything.
//! - Not privileged, every capability dropped, `no-new-privileges`, an init process that
//!   forwards signals, no Docker socket, and the network of the configuration (never the host's
//!   unless configured).
//! - Volumes ("block storage" of the instance): the code at `/kiln/code` (the working
//!   directory), outputs at `/kiln/outputs`, each dataset read-only at `/kiln/data/<name>`. The
//!   code (and a resumed attempt's restored outputs) are uploaded into their volumes through the
//!   engine's archive API before the start, and datasets through a short-lived loader
//!   container, so a remote engine works the same.

use std::collections::HashMap;
use std::path::PathBuf;
use std::time::Duration;

use bollard::Docker;
use bollard::container::LogOutput;
use bollard::models::{ContainerCreateBody, DeviceRequest, HostConfig, Mount, MountType, VolumeCreateRequest};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, CreateImageOptionsBuilder, DownloadFromContainerOptionsBuilder,
    KillContainerOptionsBuilder, ListContainersOptionsBuilder, ListVolumesOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder, StatsOptionsBuilder, UploadToContainerOptionsBuilder,
};
use futures::StreamExt;
use kiln_proto::v1::LogStream;
use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};
use tokio::io::AsyncWriteExt;

use super::{
    CODE_DIR, Capacity, DATA_DIR, Exit, Instance, InstanceSpec, InstanceStats, OUTPUTS_DIR, OutputStream, Outputs,
    Provider,
};
use crate::error::{Error, Result};

pub const LABEL_JOB: &str = "kiln.job";
pub const LABEL_ATTEMPT: &str = "kiln.attempt";
pub const LABEL_RUNNER: &str = "kiln.runner";

/// How the runner reaches its Docker Engine, and how it runs containers.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, rename_all = "kebab-case", deny_unknown_fields)]
pub struct DockerConfig {
    /// `unix:///var/run/docker.sock`, or `tcp://host:2376` for a remote engine.
    pub host: String,
    /// TLS for a remote engine: all three files, or none.
    pub tls_ca: Option<PathBuf>,
    pub tls_cert: Option<PathBuf>,
    pub tls_key: Option<PathBuf>,
    /// Network of job containers: `bridge` (default), `none`, or a network name. `host` is
    /// refused unless `allow-host-network`.
    pub network: String,
    pub allow_host_network: bool,
    /// User the job runs as (numeric `uid[:gid]`, gid 0 when left out); empty for the image's
    /// own. Its outputs directory and restored outputs belong to it.
    pub user: String,
    /// Longest an image pull may take, in seconds.
    pub pull_timeout_secs: u64,
    /// Most processes a job may have at once.
    pub pids_limit: i64,
}

impl Default for DockerConfig {
    fn default() -> Self {
        DockerConfig {
            host: "unix:///var/run/docker.sock".into(),
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            network: "bridge".into(),
            allow_host_network: false,
            user: String::new(),
            pull_timeout_secs: 600,
            pids_limit: 4096,
        }
    }
}

impl DockerConfig {
    /// The (uid, gid) of `user`; `None` when jobs run as the image's user, or `user` is not
    /// numeric (refused by [`DockerConfig::validate`]).
    pub fn owner(&self) -> Option<(u64, u64)> {
        let (uid, gid) = match self.user.split_once(':') {
            Some((uid, gid)) => (uid, gid),
            None => (self.user.as_str(), "0"),
        };
        Some((uid.parse().ok()?, gid.parse().ok()?))
    }

    pub fn validate(&self, problems: &mut Vec<String>) {
        let tls = [&self.tls_ca, &self.tls_cert, &self.tls_key];
        let set = tls.iter().filter(|f| f.is_some()).count();
        if set != 0 && set != 3 {
            problems.push("docker.tls-ca, docker.tls-cert and docker.tls-key go together".into());
        }
        if !self.user.is_empty() && self.owner().is_none() {
            problems.push(format!(
                "docker.user {:?} must be a numeric uid or uid:gid (the runner gives the job's outputs to it)",
                self.user
            ));
        }
        if self.network == "host" && !self.allow_host_network {
            problems.push("docker.network = \"host\" needs docker.allow-host-network = true".into());
        }
        if !(self.host.starts_with("unix://") || self.host.starts_with("tcp://") || self.host.starts_with("http")) {
            problems.push(format!(
                "docker.host {:?} must start with unix://, tcp:// or http(s)://",
                self.host
            ));
        }
    }
}

/// A tar holding one directory entry, `name`, of `owner`: uploaded into the directory above a
/// fresh volume's mount point, it gives the volume's root to the job's user.
fn owned_directory(name: &str, (uid, gid): (u64, u64)) -> Result<bytes::Bytes> {
    let mut header = tar::Header::new_gnu();
    header.set_entry_type(tar::EntryType::Directory);
    header.set_mode(0o755);
    header.set_uid(uid);
    header.set_gid(gid);
    header.set_size(0);
    header.set_mtime(u64::try_from(kiln_core::ids::now_ms() / 1000).unwrap_or(0));
    let mut builder = tar::Builder::new(Vec::new());
    builder
        .append_data(&mut header, name, std::io::empty())
        .and_then(|()| builder.into_inner())
        .map(bytes::Bytes::from)
        .map_err(Error::io(format!("cannot pack the directory {name}")))
}

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
    /// The host's address on the default bridge, as containers see it (for `bridge` networks).
    gateway: Option<String>,
}

impl DockerProvider {
    /// Connects to the engine, negotiating the API version (Debian's engine speaks 1.41), and
    /// checks it answers. `cpu_millis`/`memory_bytes` of 0 take the engine's own figures.
    pub async fn connect(config: DockerConfig, cpu_millis: i64, memory_bytes: i64) -> Result<DockerProvider> {
        let timeout = 120;
        let docker = if let Some(path) = config.host.strip_prefix("unix://") {
            Docker::connect_with_socket(path, timeout, bollard::API_DEFAULT_VERSION)
        } else if let (Some(ca), Some(cert), Some(key)) = (&config.tls_ca, &config.tls_cert, &config.tls_key) {
            Docker::connect_with_ssl(&config.host, key, cert, ca, timeout, bollard::API_DEFAULT_VERSION)
        } else {
            Docker::connect_with_http(&config.host, timeout, bollard::API_DEFAULT_VERSION)
        }
        .map_err(docker_error("connect"))?;
        let docker = docker
            .negotiate_version()
            .await
            .map_err(docker_error("negotiate the API version"))?;
        let info = docker.info().await.map_err(docker_error("read the engine's info"))?;
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
        };
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
            config,
            capacity,
            gateway,
        })
    }

    /// Rewrites a loopback URL of kiln (`http://127.0.0.1:7070`) to the host's address on the
    /// bridge, which the container can reach; other values are left as they are.
    fn reachable(&self, value: &str) -> String {
        let Some(gateway) = &self.gateway else {
            return value.to_string();
        };
        for loopback in ["//127.0.0.1:", "//localhost:", "//0.0.0.0:"] {
            if value.contains(loopback) {
                return value.replacen(loopback, &format!("//{gateway}:"), 1);
            }
        }
        value.to_string()
    }

    fn labels(spec_job: &str, attempt: i32, runner_id: &str) -> HashMap<String, String> {
        HashMap::from([
            (LABEL_JOB.to_string(), spec_job.to_string()),
            (LABEL_ATTEMPT.to_string(), attempt.to_string()),
            (LABEL_RUNNER.to_string(), runner_id.to_string()),
        ])
    }

    /// Pulls the image unless the engine has it.
    async fn ensure_image(&self, image: &str) -> Result<()> {
        if self.docker.inspect_image(image).await.is_ok() {
            return Ok(());
        }
        tracing::info!(image, "pulling image");
        let options = CreateImageOptionsBuilder::new().from_image(image).build();
        let pull = async {
            let mut progress = self.docker.create_image(Some(options), None, None);
            while let Some(step) = progress.next().await {
                step.map_err(|e| e.to_string())?;
            }
            Ok::<(), String>(())
        };
        let limit = Duration::from_secs(self.config.pull_timeout_secs);
        let failure = match tokio::time::timeout(limit, pull).await {
            Ok(Ok(())) if self.docker.inspect_image(image).await.is_ok() => return Ok(()),
            Ok(Ok(())) => "the pull ended without the image".to_string(),
            Ok(Err(message)) => message,
            Err(_) => format!("the pull took longer than {}s", limit.as_secs()),
        };
        Err(Error::ImageNotFound {
            image: image.to_string(),
            message: failure,
        })
    }

    async fn create_volume(&self, name: &str, labels: &HashMap<String, String>) -> Result<()> {
        let request = VolumeCreateRequest {
            name: Some(name.to_string()),
            labels: Some(labels.clone()),
            ..Default::default()
        };
        self.docker
            .create_volume(request)
            .await
            .map_err(docker_error("create a volume"))?;
        Ok(())
    }

    /// Puts a checked tar.gz into a volume through a loader container that is never started.
    async fn load_volume(
        &self,
        image: &str,
        volume: &str,
        archive: bytes::Bytes,
        labels: &HashMap<String, String>,
    ) -> Result<()> {
        let body = ContainerCreateBody {
            image: Some(image.to_string()),
            labels: Some(labels.clone()),
            network_disabled: Some(true),
            host_config: Some(HostConfig {
                mounts: Some(vec![volume_mount(volume, "/load", false)]),
                ..Default::default()
            }),
            ..Default::default()
        };
        let loader = self
            .docker
            .create_container(None::<bollard::query_parameters::CreateContainerOptions>, body)
            .await
            .map_err(docker_error("create a loader container"))?;
        let upload = self
            .docker
            .upload_to_container(
                &loader.id,
                Some(UploadToContainerOptionsBuilder::new().path("/load").build()),
                bollard::body_full(archive),
            )
            .await
            .map_err(docker_error("load a volume"));
        self.remove_container(&loader.id).await?;
        upload
    }

    async fn remove_container(&self, id: &str) -> Result<()> {
        let options = RemoveContainerOptionsBuilder::new().force(true).v(false).build();
        match self.docker.remove_container(id, Some(options)).await {
            Ok(()) => Ok(()),
            Err(error) if not_found(&error) => Ok(()),
            Err(error) => Err(docker_error("remove a container")(error)),
        }
    }

    async fn remove_volume(&self, name: &str) -> Result<()> {
        let options = RemoveVolumeOptionsBuilder::new().force(true).build();
        match self.docker.remove_volume(name, Some(options)).await {
            Ok(()) => Ok(()),
            Err(error) if not_found(&error) => Ok(()),
            Err(error) => Err(docker_error("remove a volume")(error)),
        }
    }

    /// Volumes carrying a label value.
    async fn volumes_labelled(&self, label: &str, value: &str) -> Result<Vec<(String, HashMap<String, String>)>> {
        let filters = HashMap::from([("label", vec![format!("{label}={value}")])]);
        let listed = self
            .docker
            .list_volumes(Some(ListVolumesOptionsBuilder::new().filters(&filters).build()))
            .await
            .map_err(docker_error("list volumes"))?;
        Ok(listed
            .volumes
            .unwrap_or_default()
            .into_iter()
            .map(|v| (v.name, v.labels))
            .collect())
    }

    /// Containers (running or not) carrying a label value.
    async fn containers_labelled(&self, label: &str, value: &str) -> Result<Vec<(String, HashMap<String, String>)>> {
        let filters = HashMap::from([("label", vec![format!("{label}={value}")])]);
        let options = ListContainersOptionsBuilder::new().all(true).filters(&filters).build();
        let listed = self
            .docker
            .list_containers(Some(options))
            .await
            .map_err(docker_error("list containers"))?;
        Ok(listed
            .into_iter()
            .filter_map(|c| Some((c.id?, c.labels.unwrap_or_default())))
            .collect())
    }

    /// Removes the containers and volumes of one attempt of a job.
    async fn release_attempt(&self, job_id: &str, attempt: &str) -> Result<()> {
        for (id, labels) in self.containers_labelled(LABEL_JOB, job_id).await? {
            if labels.get(LABEL_ATTEMPT).map(String::as_str) == Some(attempt) {
                self.remove_container(&id).await?;
            }
        }
        for (name, labels) in self.volumes_labelled(LABEL_JOB, job_id).await? {
            if labels.get(LABEL_ATTEMPT).map(String::as_str) == Some(attempt) {
                self.remove_volume(&name).await?;
            }
        }
        Ok(())
    }
}

/// The host's address on a bridge: its IPAM gateway, or (the default bridge of Engine 20.10
/// names none) the first address of its IPv4 subnet, where dockerd puts the host.
fn bridge_gateway(configs: Vec<bollard::models::IpamConfig>) -> Option<String> {
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

impl DockerProvider {
    /// Creates the volumes (loading the datasets), the container, and uploads the code.
    async fn create_instance(&self, spec: &InstanceSpec) -> Result<Instance> {
        let labels = DockerProvider::labels(&spec.job_id, spec.attempt, &spec.runner_id);
        let code_volume = volume_name(&spec.job_id, spec.attempt, "code");
        let outputs_volume = volume_name(&spec.job_id, spec.attempt, "outputs");
        self.create_volume(&code_volume, &labels).await?;
        self.create_volume(&outputs_volume, &labels).await?;
        let mut mounts = vec![
            volume_mount(&code_volume, CODE_DIR, false),
            volume_mount(&outputs_volume, OUTPUTS_DIR, false),
        ];
        for (name, archive) in &spec.datasets {
            let volume = volume_name(&spec.job_id, spec.attempt, &format!("data-{name}"));
            self.create_volume(&volume, &labels).await?;
            self.load_volume(&spec.image, &volume, archive.clone(), &labels).await?;
            mounts.push(volume_mount(&volume, &format!("{DATA_DIR}/{name}"), true));
        }
        let mut env: Vec<String> = spec
            .env
            .iter()
            .map(|(k, v)| format!("{k}={}", self.reachable(v)))
            .collect();
        env.push(format!("KILN_CODE={CODE_DIR}"));
        env.push(format!("KILN_OUTPUTS={OUTPUTS_DIR}"));
        env.push(format!("KILN_DATA={DATA_DIR}"));
        let device_requests = (!spec.gpu_devices.is_empty()).then(|| {
            vec![DeviceRequest {
                driver: Some("nvidia".into()),
                device_ids: Some(spec.gpu_devices.iter().map(u32::to_string).collect()),
                capabilities: Some(vec![vec!["gpu".into()]]),
                ..Default::default()
            }]
        });
        let body = ContainerCreateBody {
            image: Some(spec.image.clone()),
            cmd: Some(spec.command.clone()),
            env: Some(env),
            working_dir: Some(CODE_DIR.into()),
            labels: Some(labels),
            user: (!self.config.user.is_empty()).then(|| self.config.user.clone()),
            host_config: Some(HostConfig {
                nano_cpus: Some(spec.cpu_millis * 1_000_000),
                memory: Some(spec.memory_bytes),
                memory_swap: Some(spec.memory_bytes),
                pids_limit: Some(self.config.pids_limit),
                init: Some(true),
                privileged: Some(false),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                network_mode: Some(self.config.network.clone()),
                mounts: Some(mounts),
                device_requests,
                ..Default::default()
            }),
            ..Default::default()
        };
        let name = format!("kiln-{}-{}", spec.job_id, spec.attempt);
        let options = CreateContainerOptionsBuilder::new().name(&name).build();
        let created = self
            .docker
            .create_container(Some(options), body)
            .await
            .map_err(docker_error("create the container"))?;
        let instance = Instance {
            provider: "docker",
            job_id: spec.job_id.clone(),
            attempt: spec.attempt,
            id: format!("docker:{}", created.id),
            scratch_dir: spec.scratch_dir.clone(),
        };
        if let Err(error) = self.fill(&created.id, spec).await {
            self.release(&instance).await?;
            return Err(error);
        }
        Ok(instance)
    }

    /// Puts into a created container what its job needs before it starts: the outputs volume
    /// given to `docker.user`, kiln-agent, the code, the restored outputs.
    async fn fill(&self, container: &str, spec: &InstanceSpec) -> Result<()> {
        if let Some(owner) = self.config.owner() {
            let (parent, name) = OUTPUTS_DIR.rsplit_once('/').expect("OUTPUTS_DIR is an absolute path");
            let entry = owned_directory(name, owner)?;
            self.upload(container, parent, entry, "give the outputs to docker.user")
                .await?;
        }
        if let Some(agent) = &spec.agent {
            self.upload(container, "/", agent.clone(), "put kiln-agent into the container")
                .await?;
        }
        if let Some(code) = &spec.code {
            self.upload(container, CODE_DIR, code.clone(), "upload the code")
                .await?;
        }
        if let Some(restore) = &spec.restore {
            self.restore_outputs(container, restore).await?;
        }
        Ok(())
    }

    /// Unpacks a tar into a created container at `path`, through the engine's archive API.
    async fn upload(&self, container: &str, path: &str, archive: bytes::Bytes, what: &str) -> Result<()> {
        let options = UploadToContainerOptionsBuilder::new().path(path).build();
        self.docker
            .upload_to_container(container, Some(options), bollard::body_full(archive))
            .await
            .map_err(docker_error(what))
    }

    /// Uploads a resumed attempt's restored outputs (a checked tar.gz on the runner's host) into
    /// the created container's outputs volume, streamed from the file.
    async fn restore_outputs(&self, container: &str, archive: &std::path::Path) -> Result<()> {
        let file = tokio::fs::File::open(archive)
            .await
            .map_err(Error::io(format!("cannot read {}", archive.display())))?;
        let options = UploadToContainerOptionsBuilder::new().path(OUTPUTS_DIR).build();
        self.docker
            .upload_to_container(
                container,
                Some(options),
                bollard::body_try_stream(tokio_util::io::ReaderStream::new(file)),
            )
            .await
            .map_err(docker_error("restore the outputs"))
    }

    async fn start_instance(&self, instance: &mut Instance) -> Result<OutputStream> {
        let id = container_id(instance).to_string();
        self.docker
            .start_container(&id, None)
            .await
            .map_err(docker_error("start the container"))?;
        let options = LogsOptionsBuilder::new().follow(true).stdout(true).stderr(true).build();
        let logs = self.docker.logs(&id, Some(options)).filter_map(|chunk| async move {
            match chunk {
                Ok(LogOutput::StdOut { message }) => Some((LogStream::Stdout, message)),
                Ok(LogOutput::StdErr { message }) => Some((LogStream::Stderr, message)),
                Ok(LogOutput::Console { message }) => Some((LogStream::Stdout, message)),
                Ok(LogOutput::StdIn { .. }) => None,
                Err(error) => {
                    tracing::warn!(error = %error, "reading the container's logs failed");
                    None
                }
            }
        });
        Ok(Box::pin(logs))
    }
}

fn volume_mount(volume: &str, target: &str, read_only: bool) -> Mount {
    Mount {
        target: Some(target.to_string()),
        source: Some(volume.to_string()),
        typ: Some(MountType::VOLUME),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// Name of a volume of an instance.
fn volume_name(job_id: &str, attempt: i32, purpose: &str) -> String {
    format!("kiln-{job_id}-{attempt}-{purpose}")
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
        self.ensure_image(&spec.image).await?;
        match self.create_instance(spec).await {
            Ok(instance) => Ok(instance),
            Err(error) => {
                // Nothing half-made stays behind.
                if let Err(cleanup) = self.release_attempt(&spec.job_id, &spec.attempt.to_string()).await {
                    tracing::warn!(job_id = %spec.job_id, error = %cleanup, "cannot clean up a failed provision");
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
            });
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
        Ok(released)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_user(user: &str) -> DockerConfig {
        DockerConfig {
            user: user.into(),
            ..DockerConfig::default()
        }
    }

    #[test]
    fn the_user_is_a_numeric_uid_and_gid() {
        assert_eq!(with_user("").owner(), None);
        assert_eq!(with_user("1000").owner(), Some((1000, 0)));
        assert_eq!(with_user("1000:1001").owner(), Some((1000, 1001)));
        for bad in ["nobody", "1000:staff", ":", "1000:"] {
            let mut problems = Vec::new();
            with_user(bad).validate(&mut problems);
            assert_eq!(problems.len(), 1, "{bad}: {problems:?}");
            assert!(problems[0].contains("numeric uid or uid:gid"), "{problems:?}");
        }
        let mut problems = Vec::new();
        with_user("65534:65534").validate(&mut problems);
        assert!(problems.is_empty(), "{problems:?}");
    }
}
