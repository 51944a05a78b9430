//! The `auto` provider of a machine with Docker: jobs that name an image run in containers,
//! jobs that do not run as local processes. Each call goes to the provider that made the
//! instance.

use std::path::PathBuf;

use nix::sys::signal::Signal;

use super::docker::DockerProvider;
use super::process::ProcessProvider;
use super::{Capacity, Exit, Instance, InstanceSpec, InstanceStats, OutputStream, Outputs, Preemption, Provider};
use crate::error::Result;

/// Docker for image jobs, processes for the rest.
pub struct AutoProvider {
    docker: DockerProvider,
    process: ProcessProvider,
}

impl AutoProvider {
    pub fn new(docker: DockerProvider, process: ProcessProvider) -> AutoProvider {
        AutoProvider { docker, process }
    }

    fn of(&self, instance: &Instance) -> &dyn Provider {
        match instance.provider {
            "docker" => &self.docker,
            _ => &self.process,
        }
    }
}

#[async_trait::async_trait]
impl Provider for AutoProvider {
    fn name(&self) -> &'static str {
        "docker+process"
    }

    fn name_for(&self, image: &str) -> &'static str {
        if image.is_empty() { "process" } else { "docker" }
    }

    async fn provision(&self, spec: &InstanceSpec) -> Result<Instance> {
        if spec.image.is_empty() {
            self.process.provision(spec).await
        } else {
            self.docker.provision(spec).await
        }
    }

    async fn start(&self, instance: &mut Instance) -> Result<OutputStream> {
        match instance.provider {
            "docker" => self.docker.start(instance).await,
            _ => self.process.start(instance).await,
        }
    }

    async fn signal(&self, instance: &Instance, signal: Signal) -> Result<()> {
        self.of(instance).signal(instance, signal).await
    }

    async fn wait(&self, instance: &Instance) -> Result<Exit> {
        self.of(instance).wait(instance).await
    }

    async fn ask_checkpoint(&self, instance: &Instance, note: &str) -> Result<bool> {
        self.of(instance).ask_checkpoint(instance, note).await
    }

    async fn live_outputs(&self, instance: &Instance) -> Result<Outputs> {
        self.of(instance).live_outputs(instance).await
    }

    async fn sync_asked(&self, instance: &Instance) -> Result<Option<i64>> {
        self.of(instance).sync_asked(instance).await
    }

    async fn outputs(&self, instance: &Instance) -> Result<Outputs> {
        self.of(instance).outputs(instance).await
    }

    async fn stats(&self, instance: &Instance) -> Result<Option<InstanceStats>> {
        self.of(instance).stats(instance).await
    }

    async fn release(&self, instance: &Instance) -> Result<()> {
        self.of(instance).release(instance).await
    }

    async fn capacity(&self) -> Result<Capacity> {
        // Both run on the same machine: the engine's figures stand for it.
        self.docker.capacity().await
    }

    fn preemptions(&self) -> Option<tokio::sync::mpsc::Receiver<Preemption>> {
        None
    }

    async fn recover(
        &self,
        job_id: &str,
        attempt: i32,
        instance_id: &str,
        scratch_dir: PathBuf,
    ) -> Result<Option<Instance>> {
        if instance_id.starts_with("docker:") {
            return self.docker.recover(job_id, attempt, instance_id, scratch_dir).await;
        }
        match self
            .process
            .recover(job_id, attempt, instance_id, scratch_dir.clone())
            .await?
        {
            Some(instance) => Ok(Some(instance)),
            // Provisioned in a container but not started when the runner went away.
            None => self.docker.recover(job_id, attempt, instance_id, scratch_dir).await,
        }
    }

    async fn release_leftovers(&self, runner_id: &str, keep: &[String]) -> Result<usize> {
        Ok(self.docker.release_leftovers(runner_id, keep).await?
            + self.process.release_leftovers(runner_id, keep).await?)
    }
}
