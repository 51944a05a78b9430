//! What the provider makes on the engine: images, volumes and containers, and what it puts
//! into a created container before the start.

use bollard::container::LogOutput;
use bollard::models::{
    ContainerCreateBody, DeviceRequest, HostConfig, Mount, MountType, PortBinding, PortMap, VolumeCreateRequest,
};
use bollard::query_parameters::{
    CreateContainerOptionsBuilder, ListContainersOptionsBuilder, ListVolumesOptionsBuilder, LogsOptionsBuilder,
    RemoveContainerOptionsBuilder, RemoveVolumeOptionsBuilder, UploadToContainerOptionsBuilder,
};
use futures::StreamExt;
use kiln_core::serving::{ENV_HOST, ENV_PORT};
use kiln_proto::v1::LogStream;
use std::collections::HashMap;

use super::super::{CODE_DIR, DATA_DIR, Instance, InstanceSpec, OUTPUTS_DIR, OutputStream, Provider};
use super::{DockerProvider, LABEL_ATTEMPT, LABEL_JOB, container_id, docker_error, not_found};
use crate::error::{Error, Result};

impl DockerProvider {
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

    pub(super) async fn remove_container(&self, id: &str) -> Result<()> {
        let options = RemoveContainerOptionsBuilder::new().force(true).v(false).build();
        match self.docker.remove_container(id, Some(options)).await {
            Ok(()) => Ok(()),
            Err(error) if not_found(&error) => Ok(()),
            Err(error) => Err(docker_error("remove a container")(error)),
        }
    }

    pub(super) async fn remove_volume(&self, name: &str) -> Result<()> {
        let options = RemoveVolumeOptionsBuilder::new().force(true).build();
        match self.docker.remove_volume(name, Some(options)).await {
            Ok(()) => Ok(()),
            Err(error) if not_found(&error) => Ok(()),
            Err(error) => Err(docker_error("remove a volume")(error)),
        }
    }

    /// Volumes carrying a label value.
    pub(super) async fn volumes_labelled(
        &self,
        label: &str,
        value: &str,
    ) -> Result<Vec<(String, HashMap<String, String>)>> {
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
    pub(super) async fn containers_labelled(
        &self,
        label: &str,
        value: &str,
    ) -> Result<Vec<(String, HashMap<String, String>)>> {
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
    pub(super) async fn release_attempt(&self, job_id: &str, attempt: &str) -> Result<()> {
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

    /// Creates the volumes, the container (datasets bind-mounted from the cache), and uploads
    /// the code.
    pub(super) async fn create_instance(&self, spec: &InstanceSpec) -> Result<Instance> {
        if spec.env.contains_key(super::super::GANG_NODES_VAR) && self.network_mode != "host" {
            return Err(Error::Gang(format!(
                "a gang's containers reach one another over the host's network, and this runner's jobs join {:?}: give the gang's pool runners with docker.network = \"host\", allow-host-network = true and isolate-jobs = false (see the README, \"Gang jobs\")",
                self.network_mode
            )));
        }
        let labels = DockerProvider::labels(&spec.job_id, spec.attempt, &spec.runner_id);
        let mut mounts = if spec.disk_bytes > 0 {
            // Its own disk holds the code, the outputs and /tmp.
            let disk = self
                .disks
                .make(
                    &spec.job_id,
                    spec.attempt,
                    spec.disk_bytes.unsigned_abs(),
                    self.config.owner(),
                )
                .await?;
            vec![
                bind_mount(&disk.join("code"), CODE_DIR, false),
                bind_mount(&disk.join("outputs"), OUTPUTS_DIR, false),
                bind_mount(&disk.join("tmp"), "/tmp", false),
            ]
        } else {
            let code_volume = volume_name(&spec.job_id, spec.attempt, "code");
            let outputs_volume = volume_name(&spec.job_id, spec.attempt, "outputs");
            self.create_volume(&code_volume, &labels).await?;
            self.create_volume(&outputs_volume, &labels).await?;
            vec![
                volume_mount(&code_volume, CODE_DIR, false),
                volume_mount(&outputs_volume, OUTPUTS_DIR, false),
            ]
        };
        // The runner's cache entry itself, read-only: the engine shares the runner's host.
        for (name, cached) in &spec.datasets {
            mounts.push(bind_mount(cached, &format!("{DATA_DIR}/{name}"), true));
        }
        let mut env: Vec<String> = spec
            .env
            .iter()
            .map(|(k, v)| format!("{k}={}", self.reachable(v)))
            .collect();
        env.push(format!("KILN_CODE={CODE_DIR}"));
        env.push(format!("KILN_OUTPUTS={OUTPUTS_DIR}"));
        env.push(format!("KILN_DATA={DATA_DIR}"));
        if !spec.gpu_devices.is_empty() {
            // The runtime gives the container the devices of these NVML (PCI bus order)
            // indices; CUDA numbers them in the same order only when told to.
            env.push("CUDA_DEVICE_ORDER=PCI_BUS_ID".into());
        }
        // An inference worker listens on every address of its container, and its port is
        // published on the host's loopback, where its relay calls it (with host networking it
        // is there already).
        let serve_port = spec.env.get(ENV_PORT).filter(|_| self.config.network != "host");
        if spec.env.contains_key(ENV_PORT) {
            env.push(format!("{ENV_HOST}=0.0.0.0"));
        }
        let port_bindings = serve_port.map(|port| {
            PortMap::from([(
                format!("{port}/tcp"),
                Some(vec![PortBinding {
                    host_ip: Some("127.0.0.1".into()),
                    host_port: Some(port.clone()),
                }]),
            )])
        });
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
            exposed_ports: serve_port.map(|port| vec![format!("{port}/tcp")]),
            labels: Some(labels),
            user: (!self.config.user.is_empty()).then(|| self.config.user.clone()),
            host_config: Some(HostConfig {
                nano_cpus: Some(spec.cpu_millis * 1_000_000),
                memory: Some(spec.memory_bytes),
                memory_swap: Some(spec.memory_bytes),
                pids_limit: Some(self.config.pids_limit),
                shm_size: (spec.shm_bytes > 0).then_some(spec.shm_bytes),
                init: Some(true),
                privileged: Some(false),
                cap_drop: Some(vec!["ALL".into()]),
                security_opt: Some(vec!["no-new-privileges".into()]),
                network_mode: Some(self.network_mode.clone()),
                mounts: Some(mounts),
                port_bindings,
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
        // A job's own disk was given to the user when it was made.
        if let Some(owner) = self.config.owner().filter(|_| spec.disk_bytes == 0) {
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
            self.upload_file(container, CODE_DIR, code, "upload the code").await?;
        }
        if let Some(restore) = &spec.restore {
            self.upload_file(container, OUTPUTS_DIR, restore, "restore the outputs")
                .await?;
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

    /// Unpacks a tar (or tar.gz) on the runner's host into a created container at `path`,
    /// streamed from the file through the engine's archive API: the code, a dataset into its
    /// loader, a resumed attempt's restored outputs.
    async fn upload_file(&self, container: &str, path: &str, archive: &std::path::Path, what: &str) -> Result<()> {
        let file = tokio::fs::File::open(archive)
            .await
            .map_err(Error::io(format!("cannot read {}", archive.display())))?;
        let options = UploadToContainerOptionsBuilder::new().path(path).build();
        self.docker
            .upload_to_container(
                container,
                Some(options),
                bollard::body_try_stream(tokio_util::io::ReaderStream::new(file)),
            )
            .await
            .map_err(docker_error(what))
    }

    pub(super) async fn start_instance(&self, instance: &mut Instance) -> Result<OutputStream> {
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

/// A tar holding one directory entry, `name`, of `owner`: uploaded into the directory above a
/// fresh volume's mount point, it gives the volume's root to the job's user.
fn owned_directory(name: &str, owner: (u64, u64)) -> Result<bytes::Bytes> {
    let now = u64::try_from(kiln_core::ids::now_ms() / 1000).unwrap_or(0);
    let mut header = crate::outputs::directory_header(owner, now);
    let mut builder = tar::Builder::new(Vec::new());
    builder
        .append_data(&mut header, name, std::io::empty())
        .and_then(|()| builder.into_inner())
        .map(bytes::Bytes::from)
        .map_err(Error::io(format!("cannot pack the directory {name}")))
}

pub(super) fn volume_mount(volume: &str, target: &str, read_only: bool) -> Mount {
    Mount {
        target: Some(target.to_string()),
        source: Some(volume.to_string()),
        typ: Some(MountType::VOLUME),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// A bind mount of a directory of the runner's host.
fn bind_mount(source: &std::path::Path, target: &str, read_only: bool) -> Mount {
    Mount {
        target: Some(target.to_string()),
        source: Some(source.display().to_string()),
        typ: Some(MountType::BIND),
        read_only: Some(read_only),
        ..Default::default()
    }
}

/// Name of a volume of an instance.
pub(super) fn volume_name(job_id: &str, attempt: i32, purpose: &str) -> String {
    format!("kiln-{job_id}-{attempt}-{purpose}")
}
