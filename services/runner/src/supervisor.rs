//! One job's life on this runner, from PROVISIONING to its end state.
//!
//! set up (work dir, code bundle) → start the process → RUNNING → watch (logs, stop requests,
//! runner shutdown) → stop gracefully when asked (SIGTERM, grace period, SIGKILL) → kill what
//! is left of the process group → ship the end of the logs → end state → clean up.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use kiln_core::JobState;
use kiln_core::events::publish_job_change;
use kiln_core::objects::artifact_path;
use kiln_core::store::{Change, JobRecord, StoreError};
use kiln_proto::v1::LogStream;
use nix::sys::signal::Signal;
use object_store::ObjectStoreExt;
use tokio_util::sync::CancellationToken;

use crate::Context;
use crate::config::OnLost;
use crate::error::{Error, Result};
use crate::logs::LogShipper;
use crate::process;

/// Largest size a code bundle may unpack to.
const MAX_UNPACKED_BYTES: u64 = 16 << 30;
/// How often a running job's stop flag is read from the database, in case a control message
/// was missed.
const STOP_POLL: Duration = Duration::from_secs(2);

/// How an attempt ended, as far as the runner knows.
#[derive(Debug, Clone)]
enum Outcome {
    /// The process exited; `stopped` when we stopped it on request.
    Exited { exit_code: i32, stopped: bool },
    /// It never started; the reason says why.
    NotStarted {
        reason: String,
        exit_code: Option<i32>,
        stopped: bool,
    },
    /// The runner is shutting down.
    Interrupted,
}

/// Runs a job that this runner has moved to PROVISIONING, to its end.
pub(crate) async fn supervise(
    ctx: Context,
    job: JobRecord,
    stop: CancellationToken,
    shutdown: CancellationToken,
) {
    let job_id = job.id.clone();
    let dir = ctx
        .config
        .work_dir
        .join(format!("{}-{}", job.id, job.attempt));
    let shipper = LogShipper::start(ctx.nats.clone(), job.id.clone(), job.attempt);
    let (outcome, current) = execute(&ctx, job, &dir, &shipper, &stop, &shutdown).await;
    if let Outcome::NotStarted { reason, .. } = &outcome {
        shipper
            .line(LogStream::Stderr, format!("kiln: {reason}"))
            .await;
    }
    if let Err(error) = shipper.finish().await {
        tracing::warn!(job_id, error = %error, "shipping the job's logs failed");
    }
    if let Err(error) = tokio::fs::remove_dir_all(&dir).await
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(job_id, dir = %dir.display(), error = %error, "cannot remove the work dir");
    }
    // The instance is released: its capacity is free before the end is reported.
    ctx.active.lock().expect("active jobs lock").remove(&job_id);
    let mut delay = Duration::from_millis(200);
    for attempt in 1.. {
        match conclude(&ctx, current.clone(), &outcome).await {
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
}

/// Sets up and runs the attempt. Returns how it ended, with the latest record of the job.
async fn execute(
    ctx: &Context,
    job: JobRecord,
    dir: &std::path::Path,
    shipper: &LogShipper,
    stop: &CancellationToken,
    shutdown: &CancellationToken,
) -> (Outcome, JobRecord) {
    let code_dir = dir.join("code");
    if let Err(error) = prepare(ctx, &job, &code_dir).await {
        return (not_started(error), job);
    }
    let env = match job_env(ctx, &job) {
        Ok(env) => env,
        Err(error) => return (not_started(error), job),
    };
    if stop.is_cancelled()
        || ctx
            .store
            .job(&job.id)
            .await
            .map(|j| j.stop_requested)
            .unwrap_or(false)
    {
        return (
            Outcome::NotStarted {
                reason: "stopped before it started".into(),
                exit_code: None,
                stopped: true,
            },
            job,
        );
    }
    let command = match job.command() {
        Ok(command) => command,
        Err(error) => return (not_started(error.into()), job),
    };
    let mut instance = match process::spawn(&command, &env, &code_dir) {
        Ok(instance) => instance,
        Err(error) => return (not_started(error), job),
    };
    let change = Change {
        instance_id: Some(format!("pid:{}", instance.pid)),
        ..Change::default()
    };
    let job = match ctx.store.transition(&job, JobState::Running, change).await {
        Ok(running) => running,
        Err(error) => {
            process::signal_group(instance.pid, Signal::SIGKILL);
            let _ = instance.child.wait().await;
            return (not_started(error.into()), job);
        }
    };
    tracing::info!(job_id = %job.id, pid = instance.pid, "job running");
    publish(ctx, &job).await;
    let readers = [
        instance
            .child
            .stdout
            .take()
            .map(|pipe| shipper.read(LogStream::Stdout, pipe)),
        instance
            .child
            .stderr
            .take()
            .map(|pipe| shipper.read(LogStream::Stderr, pipe)),
    ];
    let grace = Duration::from_millis(ctx.config.stop_grace_period_ms);
    let mut stopping: Option<bool> = None; // Some(true): stop request; Some(false): shutdown.
    let status = loop {
        tokio::select! {
            status = instance.child.wait() => break status,
            _ = stop.cancelled(), if stopping.is_none() => stopping = Some(true),
            _ = shutdown.cancelled(), if stopping.is_none() => stopping = Some(false),
            _ = tokio::time::sleep(STOP_POLL), if stopping.is_none() => {
                if ctx.store.job(&job.id).await.map(|j| j.stop_requested).unwrap_or(false) {
                    stopping = Some(true);
                }
            }
        }
        if stopping.is_some() {
            tracing::info!(job_id = %job.id, grace_ms = ctx.config.stop_grace_period_ms, "stopping job: SIGTERM");
            process::signal_group(instance.pid, Signal::SIGTERM);
            match tokio::time::timeout(grace, instance.child.wait()).await {
                Ok(status) => break status,
                Err(_) => {
                    tracing::info!(job_id = %job.id, "grace period over: SIGKILL");
                    process::signal_group(instance.pid, Signal::SIGKILL);
                    break instance.child.wait().await;
                }
            }
        }
    };
    // Whatever the job left behind in its group goes too.
    process::signal_group(instance.pid, Signal::SIGKILL);
    for reader in readers.into_iter().flatten() {
        let abort = reader.abort_handle();
        if tokio::time::timeout(Duration::from_secs(5), reader)
            .await
            .is_err()
        {
            abort.abort();
        }
    }
    let outcome = match (status, stopping) {
        (_, Some(false)) => Outcome::Interrupted,
        (Ok(status), stopped) => Outcome::Exited {
            exit_code: process::exit_code(status),
            stopped: stopped.is_some(),
        },
        (Err(error), _) => Outcome::NotStarted {
            reason: format!("lost track of the process: {error}"),
            exit_code: None,
            stopped: false,
        },
    };
    (outcome, job)
}

fn not_started(error: Error) -> Outcome {
    let exit_code = match &error {
        Error::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound => Some(127),
        Error::Spawn { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => {
            Some(126)
        }
        _ => None,
    };
    Outcome::NotStarted {
        reason: error.to_string(),
        exit_code,
        stopped: false,
    }
}

/// Creates the work dir and unpacks the code bundle into it.
async fn prepare(ctx: &Context, job: &JobRecord, code_dir: &std::path::Path) -> Result<()> {
    tokio::fs::create_dir_all(code_dir)
        .await
        .map_err(Error::io(format!("cannot create {}", code_dir.display())))?;
    if job.code_digest.is_empty() {
        return Ok(());
    }
    let bundle = ctx
        .objects
        .get(&artifact_path(&job.code_digest))
        .await?
        .bytes()
        .await?;
    let dest: PathBuf = code_dir.to_path_buf();
    let entries = tokio::task::spawn_blocking(move || {
        crate::bundle::unpack(bundle.as_ref(), &dest, MAX_UNPACKED_BYTES)
    })
    .await
    .map_err(|e| Error::BadBundle(e.to_string()))??;
    tracing::debug!(job_id = %job.id, entries, "code bundle unpacked");
    Ok(())
}

/// The job's environment: its own variables, then kiln's.
fn job_env(ctx: &Context, job: &JobRecord) -> Result<BTreeMap<String, String>> {
    let mut env = job.env()?;
    env.insert("KILN_JOB_ID".into(), job.id.clone());
    env.insert("KILN_ATTEMPT".into(), job.attempt.to_string());
    env.insert("KILN_API".into(), ctx.config.api_url.clone());
    Ok(env)
}

/// Records the end of the attempt.
async fn conclude(ctx: &Context, job: JobRecord, outcome: &Outcome) -> Result<()> {
    let (state, change) = match outcome.clone() {
        Outcome::Exited {
            exit_code,
            stopped: true,
        } => (
            JobState::Stopped,
            Change {
                exit_code: Some(exit_code),
                reason: Some("stopped by user".into()),
                ..Change::default()
            },
        ),
        Outcome::Exited {
            exit_code: 0,
            stopped: false,
        } => (
            JobState::Succeeded,
            Change {
                exit_code: Some(0),
                ..Change::default()
            },
        ),
        Outcome::Exited {
            exit_code,
            stopped: false,
        } => {
            let reason = if exit_code > 128 {
                format!("killed by signal {}", exit_code - 128)
            } else {
                format!("exited with code {exit_code}")
            };
            (
                JobState::Failed,
                Change {
                    exit_code: Some(exit_code),
                    reason: Some(reason),
                    ..Change::default()
                },
            )
        }
        Outcome::NotStarted {
            reason,
            exit_code,
            stopped,
        } => {
            let state = if stopped {
                JobState::Stopped
            } else {
                JobState::Failed
            };
            (
                state,
                Change {
                    exit_code,
                    reason: Some(reason),
                    ..Change::default()
                },
            )
        }
        Outcome::Interrupted => {
            return lose(ctx, &job, "the runner shut down while the job ran").await;
        }
    };
    let ended = ctx.store.transition(&job, state, change).await?;
    tracing::info!(job_id = %ended.id, state = %ended.state, exit_code = ?ended.exit_code, "job ended");
    publish(ctx, &ended).await;
    Ok(())
}

/// Ends a job whose runner went away: LOST, or queued again when the policy says so.
pub(crate) async fn lose(ctx: &Context, job: &JobRecord, why: &str) -> Result<()> {
    let requeue = ctx.config.on_lost == OnLost::Requeue && job.attempt < ctx.config.max_attempts;
    let (state, change) = if requeue {
        (
            JobState::Queued,
            Change {
                reason: Some(format!("{why}; queued again")),
                next_attempt: true,
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
