//! Acting on the instance's spot notices, polled every `[imds] poll-interval-ms`:
//!
//! - a **rebalance recommendation** cordons the runner (its report says so at once: no free
//!   room, and it refuses launches as it refuses one that does not fit), asks each job to
//!   checkpoint (`KILN_CHECKPOINT_NOW=1` in its control file, SIGUSR1 when it handles it) and
//!   syncs its outputs so far. Nothing is stopped.
//! - an **interruption notice** cordons the runner and stops every job as a spot preemption
//!   does: SIGTERM, the notice less [`SYNC_MARGIN`] to checkpoint, SIGKILL, outputs synced;
//!   each ends PREEMPTED (reason `spot preemption`, its event naming the instance type and
//!   zone) and is queued again, resuming from that sync.
//!
//! Each, once, is also told on `kiln.instance.notice.<pool>` for the provisioner.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use kiln_core::capacity::InstanceNotice;
use kiln_core::ids::now_ms;
use kiln_core::subjects;
use tokio_util::sync::CancellationToken;

use super::{Interruption, MetadataSource};
use crate::Context;

/// What an interrupted job's stop leaves for the outputs sync and the end's record, before the
/// cloud takes the instance.
pub const SYNC_MARGIN: Duration = Duration::from_secs(30);
/// The least a job is given to stop after SIGTERM, however late the notice was read.
const MIN_GRACE: Duration = Duration::from_secs(1);

/// Polls `source` for notices until shutdown, or until an interruption was acted on.
pub(crate) async fn watch_notices(ctx: Context, source: Arc<dyn MetadataSource>, shutdown: CancellationToken) {
    let interval = Duration::from_millis(ctx.config.imds.poll_interval_ms);
    let mut rebalanced = false;
    let mut failing = false;
    loop {
        match source.notices().await {
            Ok(notices) => {
                if failing {
                    tracing::info!("instance metadata answers again");
                    failing = false;
                }
                if let Some(interruption) = notices.interruption {
                    interrupt(&ctx, &interruption).await;
                    return;
                }
                if let Some(at_ms) = notices.rebalance_at_ms
                    && !rebalanced
                {
                    rebalanced = true;
                    rebalance(&ctx, at_ms).await;
                }
            }
            // Said once per outage, not every poll.
            Err(error) if !failing => {
                failing = true;
                tracing::warn!(error = %error, "cannot read the instance's notices");
            }
            Err(_) => {}
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(interval) => {}
        }
    }
}

/// A rebalance recommendation: cordon, ask every job to checkpoint now, sync their outputs.
async fn rebalance(ctx: &Context, at_ms: i64) {
    let jobs = cordon(ctx).await;
    tracing::warn!(
        jobs = jobs.len(),
        "rebalance recommendation: cordoned; asking the jobs to checkpoint"
    );
    let note = format!("KILN_CHECKPOINT_NOW=1\nKILN_NOTICE=rebalance\nKILN_NOTICE_AT_MS={at_ms}\n");
    for_each_job(ctx, |controls| controls.checkpoint_now(note.clone()));
    tell(ctx, "rebalance", at_ms, jobs).await;
}

/// An interruption notice: cordon, and stop every job within the notice as a spot preemption.
async fn interrupt(ctx: &Context, interruption: &Interruption) {
    let jobs = cordon(ctx).await;
    let left = Duration::from_millis(u64::try_from(interruption.at_ms - now_ms()).unwrap_or(0));
    let grace = left.saturating_sub(SYNC_MARGIN).max(MIN_GRACE);
    tracing::warn!(
        action = %interruption.action,
        jobs = jobs.len(),
        left_ms = left.as_millis() as u64,
        grace_ms = grace.as_millis() as u64,
        "interruption notice: cordoned; stopping the jobs"
    );
    // Told first: the provisioner replaces the capacity while the jobs stop.
    tell(ctx, &interruption.action, interruption.at_ms, jobs).await;
    for_each_job(ctx, |controls| controls.preempt(grace));
}

/// Cordons the runner and says so in a capacity report now; returns the jobs it holds.
async fn cordon(ctx: &Context) -> Vec<String> {
    ctx.cordoned.store(true, Ordering::SeqCst);
    crate::report::report_once(ctx).await;
    let mut jobs: Vec<String> = ctx.active.lock().expect("active jobs lock").keys().cloned().collect();
    jobs.sort();
    jobs
}

fn for_each_job(ctx: &Context, act: impl Fn(&crate::supervisor::Controls)) {
    for active in ctx.active.lock().expect("active jobs lock").values() {
        act(&active.controls);
    }
}

/// Publishes the notice on `kiln.instance.notice.<pool>`; a failure is logged (the cordon in
/// the capacity report and the jobs' events say the same, later).
async fn tell(ctx: &Context, action: &str, at_ms: i64, jobs: Vec<String>) {
    let Some(identity) = ctx.identity.as_deref() else {
        return;
    };
    let notice = InstanceNotice {
        runner_id: ctx.config.runner_id.clone(),
        pool: ctx.config.pool.clone(),
        instance_id: identity.instance_id.clone(),
        instance_type: identity.instance_type.clone(),
        zone: identity.zone.clone(),
        action: action.to_string(),
        at_ms,
        jobs,
    };
    let payload = match serde_json::to_vec(&notice) {
        Ok(payload) => payload,
        Err(error) => {
            tracing::warn!(error = %error, "cannot encode the instance notice");
            return;
        }
    };
    let subject = subjects::instance_notice(&ctx.config.pool);
    let published = async {
        ctx.nats.client.publish(subject, payload.into()).await?;
        ctx.nats.client.flush().await?;
        Ok::<(), Box<dyn std::error::Error + Send + Sync>>(())
    };
    if let Err(error) = published.await {
        tracing::warn!(action, error = %error, "cannot tell the instance notice");
    }
}
