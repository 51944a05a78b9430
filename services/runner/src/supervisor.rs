//! One job's life on this runner, from PROVISIONING to its end state.
//!
//! fetch and check the code, datasets and (for a resumed attempt) the outputs the earlier
//! attempts synced → provision an instance → start it → RUNNING → watch
//! (logs, stop requests, the run-time limit, runner shutdown) → stop gracefully when asked
//! (SIGTERM, grace period, SIGKILL) → SYNCING: outputs to object storage → release the instance
//! → end state. The job runs with a token scoped to itself, revoked when it ends.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use kiln_core::JobState;
use kiln_core::auth::Scope;
use kiln_core::events::publish_job_change;
use kiln_core::objects::artifact_path;
use kiln_core::scheduling::{Market, SPOT_PREEMPTION};
use kiln_core::store::{Change, JobRecord, StoreError};
use kiln_proto::v1::LogStream;
use nix::sys::signal::Signal;
use object_store::ObjectStoreExt;
use tokio_util::sync::CancellationToken;

use crate::Context;
use crate::bundle::MAX_UNPACKED_BYTES;
use crate::config::OnLost;
use crate::error::{Error, Result};
use crate::logs::LogShipper;
use crate::provider::{Exit, Instance, InstanceSpec, OUTPUTS_DIR};

/// The restored outputs of a resumed attempt, in its scratch dir until the instance is provisioned.
const RESTORE_ARCHIVE: &str = "restore.tar.gz";
/// How often a running job's stop flag is read from the database, in case a control message
/// was missed.
const STOP_POLL: Duration = Duration::from_secs(2);
/// How long the output readers may take to drain after the job ended.
const DRAIN: Duration = Duration::from_secs(5);

/// How the runner's other tasks act on a running job.
#[derive(Debug, Clone, Default)]
pub(crate) struct Controls {
    /// Cancelled on a user's stop request.
    pub stop: CancellationToken,
    /// Cancelled on a spot preemption notice, or a higher priority's preemption; the notice
    /// period is in `notice_ms`.
    pub preempted: CancellationToken,
    pub notice_ms: Arc<AtomicU64>,
    /// The job a priority preemption makes room for (none for a spot preemption).
    pub preempted_for: Arc<std::sync::Mutex<Option<String>>>,
}

impl Controls {
    pub fn preempt(&self, notice: Duration) {
        self.notice_ms
            .store(u64::try_from(notice.as_millis()).unwrap_or(u64::MAX), Ordering::SeqCst);
        self.preempted.cancel();
    }

    /// Preempts the job for a higher-priority one, with `grace` to checkpoint.
    pub fn preempt_for(&self, for_job: String, grace: Duration) {
        *self.preempted_for.lock().expect("controls lock") = Some(for_job);
        self.preempt(grace);
    }
}

/// Why the runner stopped a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    User,
    Timeout,
    IdleGpu,
    Preempted,
    Shutdown,
}

/// How an attempt ended, as far as the runner knows.
#[derive(Debug, Clone)]
enum Outcome {
    /// The main process exited; `stopped` says why when we stopped it.
    Exited { exit: Exit, stopped: Option<StopReason> },
    /// It never started; the reason says why.
    NotStarted {
        reason: String,
        exit_code: Option<i32>,
        stopped: bool,
    },
}

/// Runs a job that this runner has moved to PROVISIONING, to its end.
pub(crate) async fn supervise(
    ctx: Context,
    job: JobRecord,
    gpu_devices: Vec<u32>,
    controls: Controls,
    shutdown: CancellationToken,
) {
    let job_id = job.id.clone();
    let scratch_dir = ctx.config.work_dir.join(format!("{}-{}", job.id, job.attempt));
    let shipper = LogShipper::start(ctx.nats.clone(), job.id.clone(), job.attempt);
    let (outcome, current, instance) =
        execute(&ctx, job, gpu_devices, &scratch_dir, &shipper, &controls, &shutdown).await;
    if let Outcome::NotStarted { reason, .. } = &outcome {
        shipper.line(LogStream::Stderr, format!("kiln: {reason}")).await;
    }
    if let Err(error) = shipper.finish().await {
        tracing::warn!(job_id, error = %error, "shipping the job's logs failed");
    }
    let current = match &instance {
        Some(instance) => finish_instance(&ctx, current, instance).await,
        None => {
            remove_scratch(&scratch_dir).await;
            current
        }
    };
    // The instance is released: its capacity is free before the end is reported.
    ctx.release_active(&job_id);
    let mut delay = Duration::from_millis(200);
    for attempt in 1.. {
        let preempted_for = controls.preempted_for.lock().expect("controls lock").clone();
        match conclude(&ctx, current.clone(), &outcome, preempted_for).await {
            Ok(()) => break,
            // A database that is briefly away; a conflict would not get better.
            Err(error @ Error::Store(StoreError::Db(_))) if attempt < 10 => {
                tracing::warn!(job_id, attempt, error = %error, "cannot record the job's end; retrying");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(5));
            }
            Err(error) => {
                tracing::error!(job_id, error = %error, "cannot record the job's end; it ends LOST when the runner restarts");
                break;
            }
        }
    }
    if let Err(error) = ctx.store.revoke_tokens(&Scope::Job(job_id.clone())).await {
        tracing::warn!(job_id, error = %error, "cannot revoke the job's token");
    }
}

/// SYNCING: copies the outputs to object storage, then releases the instance.
async fn finish_instance(ctx: &Context, job: JobRecord, instance: &Instance) -> JobRecord {
    let job = match job.state() {
        Ok(JobState::Running) => match ctx.store.transition(&job, JobState::Syncing, Change::default()).await {
            Ok(syncing) => {
                publish(ctx, &syncing).await;
                syncing
            }
            Err(error) => {
                tracing::warn!(job_id = %job.id, error = %error, "cannot record SYNCING");
                job
            }
        },
        _ => job,
    };
    sync_outputs(ctx, instance).await;
    if let Err(error) = ctx.provider.release(instance).await {
        tracing::error!(job_id = %job.id, error = %error, "cannot release the instance; it is released at the next restart");
    }
    job
}

/// Copies an ended instance's outputs to object storage; a failure is logged, not fatal.
pub(crate) async fn sync_outputs(ctx: &Context, instance: &Instance) {
    let synced = match ctx.provider.outputs(instance).await {
        Ok(outputs) => crate::outputs::sync(ctx.objects.clone(), &instance.job_id, outputs).await,
        Err(error) => Err(error),
    };
    match synced {
        Ok(synced) => {
            tracing::info!(job_id = %instance.job_id, files = synced.files, bytes = synced.bytes, "outputs synced")
        }
        Err(error) => tracing::error!(job_id = %instance.job_id, error = %error, "cannot sync the outputs"),
    }
}

async fn remove_scratch(dir: &std::path::Path) {
    if let Err(error) = tokio::fs::remove_dir_all(dir).await
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = %error, "cannot remove a scratch dir");
    }
}

/// Reads an archive from object storage and checks it before any engine unpacks it.
async fn fetch_archive(ctx: &Context, digest: &str, what: &str) -> Result<Bytes> {
    let archive = ctx.objects.get(&artifact_path(digest)).await?.bytes().await?;
    let checked = archive.clone();
    let what = what.to_string();
    tokio::task::spawn_blocking(move || crate::bundle::check(checked.as_ref(), MAX_UNPACKED_BYTES))
        .await
        .map_err(|e| Error::BadBundle(e.to_string()))?
        .map_err(|error| Error::BadBundle(format!("{what}: {error}")))?;
    Ok(archive)
}

/// Everything the instance needs: code, datasets, environment (with the job's token).
async fn instance_spec(
    ctx: &Context,
    job: &JobRecord,
    gpu_devices: &[u32],
    scratch_dir: &std::path::Path,
) -> Result<InstanceSpec> {
    let code = if job.code_digest.is_empty() {
        None
    } else {
        Some(fetch_archive(ctx, &job.code_digest, "code bundle").await?)
    };
    let mut datasets = Vec::new();
    for name in job.datasets()? {
        let dataset = ctx
            .store
            .dataset(&name)
            .await?
            .ok_or_else(|| Error::BadBundle(format!("dataset {name} does not exist")))?;
        datasets.push((
            name.clone(),
            fetch_archive(ctx, &dataset.digest, &format!("dataset {name}")).await?,
        ));
    }
    let restore = if job.resume_from.is_empty() {
        None
    } else {
        restore_archive(ctx, job, scratch_dir).await?
    };
    let token = ctx
        .store
        .create_token(&job.owner_id, &format!("job {}", job.id), Scope::Job(job.id.clone()))
        .await?;
    let mut env = job.env()?;
    env.insert("KILN_JOB_ID".into(), job.id.clone());
    if !job.resume_from.is_empty() {
        // Where the instance finds the restored outputs; providers whose outputs directory is
        // elsewhere (`process`) point it at theirs.
        env.insert("KILN_RESUME_FROM".into(), OUTPUTS_DIR.into());
    }
    env.insert("KILN_ATTEMPT".into(), job.attempt.to_string());
    env.insert("KILN_API".into(), ctx.config.api_url.clone());
    env.insert("KILN_LOGS".into(), ctx.config.logs_url.clone());
    env.insert("KILN_TOKEN".into(), token.token);
    Ok(InstanceSpec {
        job_id: job.id.clone(),
        attempt: job.attempt,
        runner_id: ctx.config.runner_id.clone(),
        image: job.image.clone(),
        command: job.command()?,
        env,
        cpu_millis: job.cpu_millis,
        memory_bytes: job.memory_bytes,
        gpus: u32::try_from(job.gpus).unwrap_or(0),
        market: market_of(ctx, job),
        gpu_devices: gpu_devices.to_vec(),
        code,
        datasets,
        agent: if job.batch_id.is_empty() || job.image.is_empty() {
            None
        } else {
            Some(agent_archive(ctx).await?)
        },
        scratch_dir: PathBuf::from(scratch_dir),
        restore,
    })
}

/// Packs the outputs the earlier attempts synced (under `job.resume_from`) into a tar.gz in the
/// scratch dir; `None` when there is nothing to restore. The archive needs no second check:
/// `pack_synced` writes only regular files under paths `relative_path` accepted, within the
/// limit (and the process provider's unpack refuses escapes anyway).
async fn restore_archive(ctx: &Context, job: &JobRecord, scratch_dir: &std::path::Path) -> Result<Option<PathBuf>> {
    let prefix = object_store::path::Path::parse(&job.resume_from)
        .map_err(|e| Error::Restore(format!("bad prefix {:?}: {e}", job.resume_from)))?;
    let archive = scratch_dir.join(RESTORE_ARCHIVE);
    let owner = ctx.config.docker.owner();
    let packed =
        crate::outputs::pack_synced(ctx.objects.clone(), prefix, archive.clone(), MAX_UNPACKED_BYTES, owner).await?;
    if packed.files == 0 {
        // The previous attempts synced nothing (or only paths that were skipped).
        remove_file(&archive).await;
        return Ok(None);
    }
    tracing::info!(job_id = %job.id, files = packed.files, bytes = packed.bytes, "outputs to restore packed");
    Ok(Some(archive))
}

async fn remove_file(path: &std::path::Path) {
    if let Err(error) = tokio::fs::remove_file(path).await
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(path = %path.display(), error = %error, "cannot remove a file");
    }
}

/// A tar holding the static kiln-agent at `kiln/bin/kiln-agent`, for batch workers' containers:
/// read and packed once per runner.
async fn agent_archive(ctx: &Context) -> Result<Bytes> {
    ctx.agent_archive
        .get_or_try_init(|| pack_agent(ctx.config.agent_binary.clone()))
        .await
        .cloned()
}

async fn pack_agent(path: PathBuf) -> Result<Bytes> {
    if path.as_os_str().is_empty() {
        return Err(Error::BadBundle(
            "this runner has no agent-binary: it cannot start batch workers in containers".into(),
        ));
    }
    tokio::task::spawn_blocking(move || {
        let binary = std::fs::read(&path)
            .map_err(|e| Error::BadBundle(format!("cannot read the agent binary {}: {e}", path.display())))?;
        let mut archive = tar::Builder::new(Vec::new());
        for dir in ["kiln/", "kiln/bin/"] {
            let mut header = tar::Header::new_gnu();
            header.set_entry_type(tar::EntryType::Directory);
            header.set_mode(0o755);
            header.set_size(0);
            header.set_cksum();
            archive
                .append_data(&mut header, dir, std::io::empty())
                .map_err(|e| Error::BadBundle(e.to_string()))?;
        }
        let mut header = tar::Header::new_gnu();
        header.set_mode(0o755);
        header.set_size(binary.len() as u64);
        header.set_cksum();
        archive
            .append_data(&mut header, "kiln/bin/kiln-agent", binary.as_slice())
            .map_err(|e| Error::BadBundle(e.to_string()))?;
        let bytes = archive.into_inner().map_err(|e| Error::BadBundle(e.to_string()))?;
        Ok(Bytes::from(bytes))
    })
    .await
    .map_err(|e| Error::BadBundle(format!("packing the agent failed: {e}")))?
}

/// Sets up and runs the attempt. Returns how it ended, the latest record of the job, and the
/// instance to release.
async fn execute(
    ctx: &Context,
    job: JobRecord,
    gpu_devices: Vec<u32>,
    scratch_dir: &std::path::Path,
    shipper: &LogShipper,
    controls: &Controls,
    shutdown: &CancellationToken,
) -> (Outcome, JobRecord, Option<Instance>) {
    let spec = match instance_spec(ctx, &job, &gpu_devices, scratch_dir).await {
        Ok(spec) => spec,
        Err(error) => return (not_started(error), job, None),
    };
    let provisioned = ctx.provider.provision(&spec).await;
    // The provider has put the restored outputs in place (or failed): the archive is done with.
    if let Some(restore) = &spec.restore {
        remove_file(restore).await;
    }
    drop(spec);
    let mut instance = match provisioned {
        Ok(instance) => instance,
        Err(error) => return (not_started(error), job, None),
    };
    if controls.stop.is_cancelled() || ctx.store.job(&job.id).await.map(|j| j.stop_requested).unwrap_or(false) {
        let outcome = Outcome::NotStarted {
            reason: "stopped before it started".into(),
            exit_code: None,
            stopped: true,
        };
        return (outcome, job, Some(instance));
    }
    let output = match ctx.provider.start(&mut instance).await {
        Ok(output) => output,
        Err(error) => return (not_started(error), job, Some(instance)),
    };
    let change = Change {
        instance_id: Some(instance.id.clone()),
        ..Change::default()
    };
    let job = match ctx.store.transition(&job, JobState::Running, change).await {
        Ok(running) => running,
        Err(error) => {
            let _ = ctx.provider.signal(&instance, Signal::SIGKILL).await;
            return (not_started(error.into()), job, Some(instance));
        }
    };
    tracing::info!(job_id = %job.id, instance = %instance.id, "job running");
    publish(ctx, &job).await;
    let reader = shipper.ship(output);
    let collector = tokio::spawn(crate::collector::collect(
        ctx.clone(),
        instance.clone(),
        gpu_devices.clone(),
    ));
    let (exit, stopped) = watch(ctx, &job, &instance, gpu_devices, controls, shutdown).await;
    collector.abort();
    // Whatever the job left behind goes too, so its output streams end.
    let _ = ctx.provider.signal(&instance, Signal::SIGKILL).await;
    let abort = reader.abort_handle();
    if tokio::time::timeout(DRAIN, reader).await.is_err() {
        abort.abort();
    }
    let outcome = match exit {
        Ok(exit) => Outcome::Exited { exit, stopped },
        Err(error) => Outcome::NotStarted {
            reason: format!("lost track of the instance: {error}"),
            exit_code: None,
            stopped: false,
        },
    };
    (outcome, job, Some(instance))
}

/// Waits for the job to end, stopping it on request, on timeout, when its GPUs stay idle, or
/// at shutdown.
async fn watch(
    ctx: &Context,
    job: &JobRecord,
    instance: &Instance,
    gpu_devices: Vec<u32>,
    controls: &Controls,
    shutdown: &CancellationToken,
) -> (Result<Exit>, Option<StopReason>) {
    let deadline = (job.max_runtime_secs > 0).then(|| {
        tokio::time::Instant::now() + Duration::from_secs(u64::try_from(job.max_runtime_secs).unwrap_or(u64::MAX / 2))
    });
    let wait = ctx.provider.wait(instance);
    tokio::pin!(wait);
    let idle_gpu = async {
        match &ctx.sampler {
            Some(sampler) => crate::gpu::idle(sampler.clone(), gpu_devices, ctx.config.idle_gpu.clone()).await,
            None => std::future::pending().await,
        }
    };
    tokio::pin!(idle_gpu);
    let mut stopping: Option<StopReason> = None;
    loop {
        tokio::select! {
            exit = &mut wait => return (exit, stopping),
            _ = controls.stop.cancelled(), if stopping.is_none() => stopping = Some(StopReason::User),
            _ = controls.preempted.cancelled(), if stopping.is_none() => stopping = Some(StopReason::Preempted),
            _ = shutdown.cancelled(), if stopping.is_none() => stopping = Some(StopReason::Shutdown),
            _ = tokio::time::sleep_until(deadline.unwrap_or_else(tokio::time::Instant::now)), if stopping.is_none() && deadline.is_some() => {
                stopping = Some(StopReason::Timeout);
            }
            _ = &mut idle_gpu, if stopping.is_none() => stopping = Some(StopReason::IdleGpu),
            _ = tokio::time::sleep(STOP_POLL), if stopping.is_none() => {
                if ctx.store.job(&job.id).await.map(|j| j.stop_requested).unwrap_or(false) {
                    stopping = Some(StopReason::User);
                }
            }
        }
        if let Some(reason) = stopping {
            tracing::info!(job_id = %job.id, ?reason, grace_ms = ctx.config.stop_grace_period_ms, "stopping job: SIGTERM");
            if let Err(error) = ctx.provider.signal(instance, Signal::SIGTERM).await {
                tracing::warn!(job_id = %job.id, error = %error, "SIGTERM failed");
            }
            // A preempted job has the notice period to checkpoint; the cloud ends it after.
            let grace = match reason {
                StopReason::Preempted => Duration::from_millis(controls.notice_ms.load(Ordering::SeqCst)),
                _ => Duration::from_millis(ctx.config.stop_grace_period_ms),
            };
            if let Ok(exit) = tokio::time::timeout(grace, &mut wait).await {
                return (exit, stopping);
            }
            tracing::info!(job_id = %job.id, "grace period over: SIGKILL");
            if let Err(error) = ctx.provider.signal(instance, Signal::SIGKILL).await {
                tracing::warn!(job_id = %job.id, error = %error, "SIGKILL failed");
            }
            return (wait.await, stopping);
        }
    }
}

fn not_started(error: Error) -> Outcome {
    let exit_code = match &error {
        Error::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound => Some(127),
        Error::Spawn { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => Some(126),
        _ => None,
    };
    Outcome::NotStarted {
        reason: error.to_string(),
        exit_code,
        stopped: false,
    }
}

/// Records the end of the attempt.
/// `preempted_for` names the job a priority preemption made room for.
async fn conclude(ctx: &Context, job: JobRecord, outcome: &Outcome, preempted_for: Option<String>) -> Result<()> {
    let cost = attempt_cost(ctx, &job);
    let change = |exit_code: Option<i32>, reason: &str| Change {
        exit_code,
        reason: Some(reason.to_string()),
        cost_micros: cost,
        ..Change::default()
    };
    let (state, change) = match outcome.clone() {
        Outcome::Exited {
            stopped: Some(StopReason::Shutdown),
            ..
        } => {
            return lose(ctx, &job, "the runner shut down while the job ran").await;
        }
        Outcome::Exited {
            exit,
            stopped: Some(StopReason::Preempted),
        } => {
            return requeue_preempted(ctx, job, exit.code, preempted_for, cost).await;
        }
        Outcome::Exited {
            exit,
            stopped: Some(StopReason::User),
        } => (JobState::Stopped, change(Some(exit.code), "stopped by user")),
        Outcome::Exited {
            exit,
            stopped: Some(StopReason::Timeout),
        } => (JobState::Stopped, change(Some(exit.code), "timeout")),
        Outcome::Exited {
            exit,
            stopped: Some(StopReason::IdleGpu),
        } => (JobState::Stopped, change(Some(exit.code), "idle GPU")),
        Outcome::Exited { exit, stopped: None } if exit.code == 0 => (JobState::Succeeded, change(Some(0), "")),
        Outcome::Exited { exit, stopped: None } if exit.oom_killed => {
            let reason = format!("out of memory: the limit is {} bytes", job.memory_bytes);
            (JobState::Failed, change(Some(exit.code), &reason))
        }
        Outcome::Exited { exit, stopped: None } => {
            let reason = if exit.code > 128 {
                format!("killed by signal {}", exit.code - 128)
            } else {
                format!("exited with code {}", exit.code)
            };
            (JobState::Failed, change(Some(exit.code), &reason))
        }
        Outcome::NotStarted {
            reason,
            exit_code,
            stopped,
        } => {
            let state = if stopped { JobState::Stopped } else { JobState::Failed };
            (state, change(exit_code, &reason))
        }
    };
    let ended = ctx.store.transition(&job, state, change).await?;
    tracing::info!(job_id = %ended.id, state = %ended.state, exit_code = ?ended.exit_code, reason = %ended.reason, "job ended");
    publish(ctx, &ended).await;
    Ok(())
}

/// The market of an attempt: the scheduler's choice, or (for a job placed before schedulers
/// chose) spot when the provider offers it.
fn market_of(ctx: &Context, job: &JobRecord) -> Market {
    Market::parse(&job.market).unwrap_or(if ctx.provider.offer().spot {
        Market::Spot
    } else {
        Market::OnDemand
    })
}

/// What the attempt cost from its start until now, and what on-demand would have cost, in
/// millionths; `None` when it never ran.
fn attempt_cost(ctx: &Context, job: &JobRecord) -> Option<(i64, i64)> {
    let started = job.started_at_ms?;
    let offer = ctx.provider.offer();
    let hours = (kiln_core::ids::now_ms() - started).max(0) as f64 / 3_600_000.0 * offer.time_scale;
    let asked = (job.cpu_millis, job.memory_bytes, u32::try_from(job.gpus).unwrap_or(0));
    let cost = |market| (offer.cost_per_hour(&ctx.capacity, asked, market) * hours * 1e6).round() as i64;
    Some((cost(market_of(ctx, job)), cost(Market::OnDemand)))
}

/// The instance was taken back (a spot preemption) or a higher priority needs the room: the job
/// ends PREEMPTED and is queued again as a new attempt, keeping its id, with `resume_from`
/// naming its synced outputs (checkpoints included): the next attempt finds them in its outputs
/// directory, which `KILN_RESUME_FROM` names.
async fn requeue_preempted(
    ctx: &Context,
    job: JobRecord,
    exit_code: i32,
    for_job: Option<String>,
    cost_micros: Option<(i64, i64)>,
) -> Result<()> {
    let reason = match for_job {
        Some(for_job) => format!("preempted for {for_job}, of a higher priority"),
        None => SPOT_PREEMPTION.to_string(),
    };
    let change = Change {
        exit_code: Some(exit_code),
        reason: Some(reason),
        preempted: true,
        resume_from: Some(kiln_core::objects::outputs_prefix(&job.id).to_string()),
        cost_micros,
        ..Change::default()
    };
    let preempted = ctx.store.transition(&job, JobState::Preempted, change).await?;
    publish(ctx, &preempted).await;
    let change = Change {
        reason: Some("preempted; queued again".into()),
        next_attempt: true,
        ..Change::default()
    };
    let queued = match ctx.store.transition(&preempted, JobState::Queued, change).await {
        Ok(queued) => queued,
        // Stopped by its user in the meantime: it stays stopped.
        Err(StoreError::Conflict { .. }) => return Ok(()),
        Err(error) => return Err(error.into()),
    };
    tracing::warn!(job_id = %queued.id, attempt = queued.attempt, "job preempted; queued again");
    publish(ctx, &queued).await;
    Ok(())
}

/// Ends a job whose runner went away: LOST, or queued again when the policy says so, resuming
/// like a preempted job from the outputs synced so far (the callers sync what the dead attempt
/// left before they call this).
pub(crate) async fn lose(ctx: &Context, job: &JobRecord, why: &str) -> Result<()> {
    let requeue = ctx.config.on_lost == OnLost::Requeue && job.attempt < ctx.config.max_attempts;
    let (state, change) = if requeue {
        (
            JobState::Queued,
            Change {
                reason: Some(format!("{why}; queued again")),
                next_attempt: true,
                resume_from: Some(kiln_core::objects::outputs_prefix(&job.id).to_string()),
                ..Change::default()
            },
        )
    } else {
        (
            JobState::Lost,
            Change {
                reason: Some(why.to_string()),
                ..Change::default()
            },
        )
    };
    match ctx.store.transition(job, state, change).await {
        Ok(changed) => {
            tracing::warn!(job_id = %changed.id, state = %changed.state, why, "job lost its runner");
            publish(ctx, &changed).await;
            Ok(())
        }
        Err(StoreError::Conflict { .. }) => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Publishes a committed change; a failure is re-driven by the reconciler.
pub(crate) async fn publish(ctx: &Context, job: &JobRecord) {
    if let Err(error) = publish_job_change(&ctx.nats, &ctx.store, job).await {
        tracing::warn!(job_id = %job.id, error = %error, "publish failed; the reconciler will retry");
    }
}
