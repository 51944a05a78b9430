//! Providers: where a job's instance comes from. One trait, [`Provider`]; implementations:
//! [`process`] (a local child process, for machines without Docker) and [`docker`] (a container
//! on a local or remote Docker Engine). A cloud provider plugs in the same way.
//!
//! The runner drives an instance through `provision` (image, volumes, code, datasets, restored
//! outputs) →
//! `start` (output streams) → `signal`/`wait` → `outputs` (synced to object storage by the
//! runner) → `release` (nothing left behind).

use kiln_core::scheduling::Market;
use std::collections::BTreeMap;
use std::path::PathBuf;
use std::pin::Pin;

use bytes::Bytes;
use futures::Stream;
use kiln_proto::v1::LogStream;
use nix::sys::signal::Signal;

use crate::error::Result;

pub mod auto;
pub mod docker;
pub mod firewall;
pub mod process;
pub mod sim;

/// Where in the instance the job finds its code, writes its outputs and reads its datasets
/// (the docker provider mounts volumes there; the process provider sets these variables to
/// host directories).
pub const CODE_DIR: &str = "/kiln/code";
pub const OUTPUTS_DIR: &str = "/kiln/outputs";
pub const DATA_DIR: &str = "/kiln/data";

/// What a job needs from its instance.
#[derive(Debug, Clone)]
pub struct InstanceSpec {
    pub job_id: String,
    pub attempt: i32,
    pub runner_id: String,
    /// The id of the user who submitted the job (the process provider runs only its trusted
    /// owner's jobs when it cannot isolate them).
    pub owner_id: String,
    /// The job's project.
    pub project: String,
    /// Container image; empty for none.
    pub image: String,
    /// The project's credentials for the image's registry, when it has some.
    pub pull: Option<PullAuth>,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub gpus: u32,
    /// The job's own disk (`--disk`) and /dev/shm size (`--shm`) in bytes; 0 for none.
    pub disk_bytes: i64,
    pub shm_bytes: i64,
    /// The market the scheduler chose for the attempt.
    pub market: Market,
    /// The GPU indices the runner gave the job (`gpus` of them).
    pub gpu_devices: Vec<u32>,
    /// The code bundle: a tar.gz on the runner's host, in the scratch dir, already checked by
    /// [`crate::bundle::check`] (streamed there from object storage, never whole in memory).
    pub code: Option<PathBuf>,
    /// Datasets by name: their read-only directories in the runner's dataset cache, held for
    /// the job until its instance is released.
    pub datasets: Vec<(String, PathBuf)>,
    /// For a batch worker in a container: a tar holding `kiln/bin/kiln-agent`, unpacked at the
    /// container's root before it starts.
    pub agent: Option<Bytes>,
    /// A directory on the runner's host the instance may use for its files.
    pub scratch_dir: PathBuf,
    /// For an attempt resuming a preempted one: a tar.gz on the runner's host (regular files
    /// under checked relative paths, packed by [`crate::outputs::pack_synced`]) of the outputs
    /// the earlier attempts synced, to unpack into the outputs directory before the start. Providers without a filesystem (`sim`) ignore it.
    pub restore: Option<PathBuf>,
}

/// Credentials for pulling an image: a project's for one registry (`kiln secret set
/// --registry`). Their `Debug` shows no password.
#[derive(Debug, Clone)]
pub struct PullAuth {
    /// The registry's host, as images name it (`ghcr.io`, `127.0.0.1:5000`, `docker.io`).
    pub registry: String,
    pub credentials: kiln_core::secrets::RegistryCredentials,
}

/// The variable that marks a gang job's node (see `supervisor::gang`).
pub const GANG_NODES_VAR: &str = "KILN_NUM_NODES";

/// The file in its outputs directory a job writes (or touches) to have them synced now
/// (`kiln.checkpoint()` in the SDK); it is not synced itself.
pub const SYNC_MARKER: &str = ".kiln-sync";

/// A provisioned instance.
#[derive(Debug, Clone)]
pub struct Instance {
    /// The provider that made it (`process`, `docker`, `sim`).
    pub provider: &'static str,
    pub job_id: String,
    pub attempt: i32,
    /// The id recorded on the job (`pid:<n>`, `docker:<container>`); set once started for the
    /// process provider.
    pub id: String,
    pub(crate) scratch_dir: PathBuf,
}

/// Lines of output as they come: (stream, bytes), not split into lines.
pub type OutputStream = Pin<Box<dyn Stream<Item = (LogStream, Bytes)> + Send>>;

/// How an instance's main process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// The exit code, or 128 + the signal that killed it.
    pub code: i32,
    /// The kernel killed it for going over its memory limit.
    pub oom_killed: bool,
    /// The job's own disk (`--disk`) was full when it ended.
    pub disk_full: bool,
}

/// Where an ended instance's outputs can be read.
#[derive(Debug)]
pub enum Outputs {
    /// A directory on the runner's host.
    Dir(PathBuf),
    /// A tar archive (on the runner's host) whose entries sit under one top directory.
    Tar(PathBuf),
    /// The instance has no outputs.
    None,
}

/// Resource use of an instance, as its provider sees it.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct InstanceStats {
    /// CPU use in percent of one core (200 = two cores busy).
    pub cpu_percent: f64,
    pub memory_bytes: u64,
}

/// What a provider offers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Capacity {
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    pub gpus: u32,
    /// Bytes the provider gives jobs' own disks (`--disk`); 0 for none.
    pub disk_bytes: i64,
}

/// What one instance of a provider is and costs. The default: the whole capacity is one
/// machine, on-demand only, at no price (docker, process).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Offer {
    /// The largest instance; `None` when the capacity is one machine.
    pub instance: Option<Capacity>,
    pub on_demand_per_hour: f64,
    pub spot_per_hour: f64,
    /// Spot instances can be had.
    pub spot: bool,
    /// The provider's hours per wall-clock hour (a simulated cloud runs faster), for costs.
    pub time_scale: f64,
}

impl Default for Offer {
    fn default() -> Self {
        Offer {
            instance: None,
            on_demand_per_hour: 0.0,
            spot_per_hour: 0.0,
            spot: false,
            time_scale: 1.0,
        }
    }
}

impl Offer {
    /// What `cpu_millis`, `memory_bytes` and `gpus` cost per hour on `market`: their dominant
    /// share of an instance at the instance's price (0 without prices).
    pub fn cost_per_hour(&self, capacity: &Capacity, asked: (i64, i64, u32), market: Market) -> f64 {
        let instance = self.instance.unwrap_or(*capacity);
        let share = |asked: f64, of: f64| if of > 0.0 { asked / of } else { 0.0 };
        let dominant = share(asked.0 as f64, instance.cpu_millis as f64)
            .max(share(asked.1 as f64, instance.memory_bytes as f64))
            .max(share(f64::from(asked.2), f64::from(instance.gpus)));
        let price = match market {
            Market::Spot => self.spot_per_hour,
            Market::OnDemand => self.on_demand_per_hour,
        };
        price * dominant
    }
}

/// A spot instance about to be taken back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Preemption {
    pub job_id: String,
    pub notice: std::time::Duration,
}

#[async_trait::async_trait]
pub trait Provider: Send + Sync + 'static {
    /// The provider's name, as reported with the runner's capacity.
    fn name(&self) -> &'static str;

    /// The provider that makes the instance of a job with this image (`auto` has two).
    fn name_for(&self, _image: &str) -> &'static str {
        self.name()
    }

    /// Prepares an instance: image, volumes, code and datasets. Nothing runs yet.
    async fn provision(&self, spec: &InstanceSpec) -> Result<Instance>;

    /// Starts the job's command; returns its output.
    async fn start(&self, instance: &mut Instance) -> Result<OutputStream>;

    /// Sends a signal to the job's processes.
    async fn signal(&self, instance: &Instance, signal: Signal) -> Result<()>;

    /// Asks a running job to checkpoint now: writes `note` (`KEY=value` lines, among them
    /// `KILN_CHECKPOINT_NOW=1`) to the file its `KILN_CONTROL_FILE` names, and sends its main
    /// process SIGUSR1 when that process handles the signal (SIGUSR1's default action ends a
    /// process: a job that does not catch it is not sent it). Returns whether it was signalled.
    /// Providers without a control file (docker, sim) do nothing.
    async fn ask_checkpoint(&self, _instance: &Instance, _note: &str) -> Result<bool> {
        Ok(false)
    }

    /// Waits until the job's main process ends. Dropping the future and calling again is fine.
    async fn wait(&self, instance: &Instance) -> Result<Exit>;

    /// A copy of a running instance's outputs so far, read safely while the job runs (never
    /// with more rights than the job's own); `Outputs::None` for providers that cannot.
    async fn live_outputs(&self, _instance: &Instance) -> Result<Outputs> {
        Ok(Outputs::None)
    }

    /// When the job last asked for a sync of its outputs: the modification time, in
    /// milliseconds, of [`SYNC_MARKER`] in its outputs directory (read without following a
    /// link); `None` when it never did or the provider cannot tell.
    async fn sync_asked(&self, _instance: &Instance) -> Result<Option<i64>> {
        Ok(None)
    }

    /// Where the outputs of an ended instance can be read.
    async fn outputs(&self, instance: &Instance) -> Result<Outputs>;

    /// Reads the instance's CPU and memory use; `None` when it is not running.
    async fn stats(&self, instance: &Instance) -> Result<Option<InstanceStats>>;

    /// Kills whatever is left and removes everything the instance held.
    async fn release(&self, instance: &Instance) -> Result<()>;

    /// What the provider offers in all.
    async fn capacity(&self) -> Result<Capacity>;

    /// One instance, its prices, and whether spot is offered.
    fn offer(&self) -> Offer {
        Offer::default()
    }

    /// Spot preemption notices; `None` for providers without spot instances. Called once.
    fn preemptions(&self) -> Option<tokio::sync::mpsc::Receiver<Preemption>> {
        None
    }

    /// Finds the instance a job had on this runner before it restarted, if it still exists.
    async fn recover(
        &self,
        job_id: &str,
        attempt: i32,
        instance_id: &str,
        scratch_dir: PathBuf,
    ) -> Result<Option<Instance>>;

    /// Releases every instance this runner left behind whose job is not in `keep`.
    async fn release_leftovers(&self, runner_id: &str, keep: &[String]) -> Result<usize>;
}
