//! One job's life on this runner, from PROVISIONING to its end state.
//!
//! fetch and check the code, take the datasets from the runner's cache, fetch (for a resumed
//! attempt) the outputs the earlier attempts synced → provision an instance → start it →
//! RUNNING → watch (logs, stop requests, the run-time limit, runner shutdown) → stop gracefully when asked
//! (SIGTERM, grace period, SIGKILL) → SYNCING: outputs to object storage → release the instance
//! → end state. The job runs with a token scoped to itself, revoked when it ends. An attempt
//! taken from this runner (its lease lapsed and the scheduling leader ended the job or queued it
//! again) is killed and its instance released, and nothing of it is written: not its outputs,
//! which the next attempt may be restoring, nor its state, tokens or end.
//!
//! `spec` gathers what the instance is given, `end` records how the attempt ended; this
//! module runs and watches it.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use kiln_core::JobState;
use kiln_core::auth::Scope;
use kiln_core::store::{Change, JobRecord, StoreError};
use kiln_proto::v1::LogStream;
use nix::sys::signal::Signal;
use tokio_util::sync::CancellationToken;

use crate::Context;
use crate::datasets::fetch::remove_file;
use crate::error::Error;
use crate::liveness::Holding;
use crate::logs::LogShipper;
use crate::provider::{Exit, Instance};
use crate::service_metrics::{self as metrics, Phase};

mod end;
pub(crate) mod gang;
mod spec;
mod start;
mod sync;
mod watch;

use end::{conclude, stop_reason};
pub(crate) use end::{lose, publish};
use spec::instance_spec;
use start::{not_started, transition_patiently};
use sync::finish_instance;
pub(crate) use sync::{sync_live_outputs, sync_outputs};
use watch::watch;

/// How often a running job is read from the database: its stop flag, in case a control message
/// was missed, and whether it was taken from this runner.
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
    /// Cancelled when the job was found taken from this runner.
    pub taken: CancellationToken,
    /// Notified when the job should checkpoint now (its instance got a rebalance
    /// recommendation): what to write in its control file.
    pub checkpoint: Arc<tokio::sync::Notify>,
    pub checkpoint_note: Arc<std::sync::Mutex<String>>,
    /// For a gang's rank 0: why another node ended the attempt.
    pub gang_trouble: Arc<std::sync::Mutex<String>>,
}

impl Controls {
    pub fn preempt(&self, notice: Duration) {
        self.notice_ms
            .store(u64::try_from(notice.as_millis()).unwrap_or(u64::MAX), Ordering::SeqCst);
        self.preempted.cancel();
    }

    /// Asks the job to checkpoint now (it keeps running); `note` goes into its control file.
    pub fn checkpoint_now(&self, note: String) {
        *self.checkpoint_note.lock().expect("controls lock") = note;
        self.checkpoint.notify_one();
    }

    /// Preempts the job for a higher-priority one, with `grace` to checkpoint.
    pub fn preempt_for(&self, for_job: String, grace: Duration) {
        *self.preempted_for.lock().expect("controls lock") = Some(for_job);
        self.preempt(grace);
    }
}

/// What an attempt holds on the runner's host until its instance is released.
struct Host {
    scratch_dir: std::path::PathBuf,
    /// The cache entries of the job's datasets.
    datasets: Vec<crate::datasets::DatasetLease>,
    /// The instance on the `instances` gauge.
    phase: Phase,
    /// When its launch request arrived.
    received: std::time::Instant,
    /// An inference worker's relay, while it runs.
    relay: Option<watch::Relay>,
    /// The outputs sync started while the job runs (periodic, asked for, or at a checkpoint
    /// notice), awaited before the final sync so an older copy never lands after a newer one.
    checkpoint_sync: Option<tokio::task::JoinHandle<()>>,
    /// What the instance's outputs syncs stored so far; each sync holds the lock throughout.
    outputs: SyncedOutputs,
}

/// An instance's outputs manifest, shared by its syncs.
pub(crate) type SyncedOutputs = std::sync::Arc<tokio::sync::Mutex<crate::outputs::Manifest>>;

/// Why the runner stopped a job.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum StopReason {
    User,
    Timeout,
    IdleGpu,
    Preempted,
    Shutdown,
    /// The job is no longer this runner's (see [`Controls::taken`]).
    Taken,
    /// Another node of its gang failed ([`Controls::gang_trouble`] says which): the job fails.
    GangFailed,
    /// Another node of its gang was lost: the attempt is lost, as `on-lost` says.
    GangLost,
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
    received: std::time::Instant,
) {
    let job_id = job.id.clone();
    let shipper = LogShipper::start(ctx.nats.clone(), job.id.clone(), job.attempt);
    let mut host = Host {
        scratch_dir: ctx.config.work_dir.join(format!("{}-{}", job.id, job.attempt)),
        datasets: Vec::new(),
        phase: ctx.metrics.phase(),
        received,
        relay: None,
        checkpoint_sync: None,
        outputs: SyncedOutputs::default(),
    };
    let (outcome, current, instance) = execute(&ctx, job, gpu_devices, &mut host, &shipper, &controls, &shutdown).await;
    ctx.metrics
        .stopped(stop_reason(&outcome, controls.taken.is_cancelled()));
    if let Outcome::NotStarted { reason, .. } = &outcome {
        shipper.line(LogStream::Stderr, format!("kiln: {reason}")).await;
    }
    if let Err(error) = shipper.finish().await {
        tracing::warn!(job_id, error = %error, "shipping the job's logs failed");
    }
    if controls.taken.is_cancelled() {
        tracing::warn!(
            job_id,
            attempt = current.attempt,
            "the job was taken from this runner; releasing its instance"
        );
        match &instance {
            Some(instance) => {
                if let Err(error) = ctx.provider.release(instance).await {
                    ctx.metrics.provider_error(instance.provider);
                    tracing::error!(job_id, error = %error, "cannot release the instance; it is released at the next restart");
                }
            }
            None => remove_scratch(&host.scratch_dir).await,
        }
        ctx.release_active(&job_id);
        return;
    }
    if let Some(checkpoint_sync) = host.checkpoint_sync.take() {
        let _ = checkpoint_sync.await;
    }
    let current = match &instance {
        Some(instance) => {
            host.phase.enter(metrics::SYNCING);
            finish_instance(&ctx, current, instance, &host.outputs).await
        }
        None => {
            remove_scratch(&host.scratch_dir).await;
            current
        }
    };
    drop(host);
    // The instance is released: its capacity is free before the end is reported.
    ctx.release_active(&job_id);
    let mut delay = Duration::from_millis(200);
    for attempt in 1.. {
        let preempted_for = controls.preempted_for.lock().expect("controls lock").clone();
        let gang_trouble = controls.gang_trouble.lock().expect("controls lock").clone();
        match conclude(&ctx, current.clone(), &outcome, preempted_for, gang_trouble).await {
            Ok(()) => break,
            // Taken from this runner meanwhile: the new state stays.
            Err(Error::Store(StoreError::Conflict { state, .. })) => {
                tracing::warn!(job_id, state = %state, "the job changed while it ended here; its end is not recorded");
                break;
            }
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

async fn remove_scratch(dir: &std::path::Path) {
    if let Err(error) = tokio::fs::remove_dir_all(dir).await
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = %error, "cannot remove a scratch dir");
    }
}

/// Sets up and runs the attempt. Returns how it ended, the latest record of the job, and the
/// instance to release.
async fn execute(
    ctx: &Context,
    job: JobRecord,
    gpu_devices: Vec<u32>,
    host: &mut Host,
    shipper: &LogShipper,
    controls: &Controls,
    shutdown: &CancellationToken,
) -> (Outcome, JobRecord, Option<Instance>) {
    let (spec, masker) = match instance_spec(ctx, &job, 0, &gpu_devices, &host.scratch_dir, &mut host.datasets).await {
        Ok(prepared) => prepared,
        Err(error) => return (not_started(error), job, None),
    };
    let serving = crate::relay::Member::of_env(&spec.env, &job.project);
    let provisioned = ctx.provider.provision(&spec).await;
    // The provider has put the code and restored outputs in place (or failed): their archives
    // on this host are done with. The datasets are directories of the cache, held by leases.
    for archive in spec.code.iter().chain(spec.restore.iter()) {
        remove_file(archive).await;
    }
    drop(spec);
    let mut instance = match provisioned {
        Ok(instance) => instance,
        Err(error) => {
            ctx.metrics.provider_error(ctx.provider.name_for(&job.image));
            return (not_started(error), job, None);
        }
    };
    let current = ctx.store.job(&job.id).await.ok();
    if current
        .as_ref()
        .is_some_and(|current| Holding::of(&job).is_taken_by(Holding::of(current)))
    {
        controls.taken.cancel();
        let outcome = Outcome::NotStarted {
            reason: "taken from this runner before it started".into(),
            exit_code: None,
            stopped: false,
        };
        return (outcome, job, Some(instance));
    }
    if controls.stop.is_cancelled() || current.is_some_and(|current| current.stop_requested) {
        let outcome = Outcome::NotStarted {
            reason: "stopped before it started".into(),
            exit_code: None,
            stopped: true,
        };
        return (outcome, job, Some(instance));
    }
    // A gang starts whole: every node made and waiting. A node that failed fails the job; one
    // lost (its runner gone, or never taking its launch) loses the attempt, as `on-lost` says.
    if job.nodes > 1
        && let Err(trouble) = gang::wait_for_gang(ctx, &job, 0).await
    {
        let outcome = match trouble {
            gang::Trouble::Failed(reason) => Outcome::NotStarted {
                reason: format!("the gang did not start: {reason}"),
                exit_code: None,
                stopped: false,
            },
            gang::Trouble::Lost(reason) => {
                *controls.gang_trouble.lock().expect("controls lock") = format!("the gang did not start: {reason}");
                let exit = Exit {
                    code: -1,
                    oom_killed: false,
                    disk_full: false,
                };
                Outcome::Exited {
                    exit,
                    stopped: Some(StopReason::GangLost),
                }
            }
        };
        return (outcome, job, Some(instance));
    }
    let output = match ctx.provider.start(&mut instance).await {
        Ok(output) => output,
        Err(error) => {
            ctx.metrics.provider_error(instance.provider);
            return (not_started(error), job, Some(instance));
        }
    };
    let change = Change {
        instance_id: Some(instance.id.clone()),
        ..Change::default()
    };
    let job = match transition_patiently(&ctx.store, &job, JobState::Running, change).await {
        Ok(running) => running,
        Err(error) => {
            let _ = ctx.provider.signal(&instance, Signal::SIGKILL).await;
            if let StoreError::Conflict { .. } = error
                && let Ok(current) = ctx.store.job(&job.id).await
                && Holding::of(&job).is_taken_by(Holding::of(&current))
            {
                controls.taken.cancel();
            }
            return (not_started(error.into()), job, Some(instance));
        }
    };
    host.phase.enter(metrics::RUNNING);
    ctx.metrics.launched(host.received.elapsed());
    tracing::info!(job_id = %job.id, instance = %instance.id, "job running");
    let reader = shipper.ship(output, masker);
    let collector = tokio::spawn(crate::collector::collect(
        ctx.clone(),
        instance.clone(),
        gpu_devices.clone(),
        0,
    ));
    // After the output and metrics are taken care of: the publish may wait for a stream leader.
    publish(ctx, &job).await;
    // An inference worker's relay joins its member's rotation once the worker is ready.
    host.relay = serving.map(|member| {
        let drain = CancellationToken::new();
        let relay = crate::relay::Relay::new(
            ctx.nats.client.clone(),
            member,
            ctx.config.relay.clone(),
            ctx.metrics.relays.clone(),
        );
        (drain.clone(), tokio::spawn(relay.run(drain)))
    });
    let (exit, stopped) = watch(ctx, &job, &instance, gpu_devices, controls, shutdown, host).await;
    if let Some((drain, task)) = host.relay.take() {
        drain.cancel();
        task.abort();
    }
    collector.abort();
    // Whatever the job left behind goes too, so its output streams end.
    let _ = ctx.provider.signal(&instance, Signal::SIGKILL).await;
    let abort = reader.abort_handle();
    if tokio::time::timeout(DRAIN, reader).await.is_err() {
        abort.abort();
    }
    let outcome = match exit {
        Ok(exit) => Outcome::Exited { exit, stopped },
        Err(error) => {
            ctx.metrics.provider_error(instance.provider);
            Outcome::NotStarted {
                reason: format!("lost track of the instance: {error}"),
                exit_code: None,
                stopped: false,
            }
        }
    };
    (outcome, job, Some(instance))
}
