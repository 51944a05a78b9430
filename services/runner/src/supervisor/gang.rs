//! Gang jobs' nodes on this runner.
//!
//! Rank 0 is the job itself: its runner supervises it as any job, and before it starts it waits
//! until every node is ready ([`wait_for_gang`]); while it runs, its watch reads the nodes every
//! poll and ends the attempt for all when one has ended badly or gone quiet ([`trouble`]).
//!
//! A node of rank > 0 ([`supervise_node`]) is an instance of the same spec on its own runner,
//! with its own log (`<job>/node<rank>`) and no outputs of its own (node 0's are the job's). It
//! reports its state in `job_nodes` and beats its heart there ([`heartbeat_every`]); it waits for
//! the others as rank 0 does, and stops (SIGTERM, grace, SIGKILL) as soon as the job's attempt
//! is no longer running: ended, stopped, or queued again.

use std::time::Duration;

use kiln_core::JobState;
use kiln_core::store::{JobRecord, NodeRecord, node_state};
use kiln_core::subjects::node_log_id;
use kiln_proto::v1::LogStream;
use nix::sys::signal::Signal;
use tokio_util::sync::CancellationToken;

use super::{Controls, STOP_POLL};
use crate::Context;
use crate::logs::LogShipper;
use crate::provider::Instance;

/// How often a node's runner beats its heart in `job_nodes`: a third of its lease's TTL, at most
/// every 5 s.
fn heartbeat_every(ctx: &Context) -> Duration {
    Duration::from_millis((ctx.config.lease_ttl_ms / 3).clamp(100, 5_000))
}

/// A node whose heart has not beaten for this long counts as lost (its runner went away): the
/// lease TTL of rank 0's runner (a cluster's runners share one), at least 3 s.
pub(crate) fn quiet_ms(ctx: &Context) -> i64 {
    i64::try_from(ctx.config.lease_ttl_ms.max(3_000)).unwrap_or(i64::MAX)
}
/// How long the nodes wait for one another to be ready before the attempt fails.
const START_PATIENCE: Duration = Duration::from_secs(600);

/// Why a gang's attempt ends because of one of its nodes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Trouble {
    /// A node's process ended with a failure, or it could not start: the job fails.
    Failed(String),
    /// A node's runner went away, or its instance was taken back: the attempt is lost, and the
    /// job queued again as `on-lost` says, resuming from node 0's synced outputs.
    Lost(String),
}

/// What ends the attempt among `nodes` (rank 0 excepted), if anything, at `now_ms`; a node
/// quiet for `quiet_ms` is lost.
pub(crate) fn trouble(nodes: &[NodeRecord], now_ms: i64, quiet_ms: i64) -> Option<Trouble> {
    nodes.iter().filter(|node| node.rank > 0).find_map(|node| {
        let rank = node.rank;
        match node.state.as_str() {
            node_state::EXITED => match node.exit_code {
                Some(0) => None,
                Some(code) => Some(Trouble::Failed(format!("node {rank} failed: exited with code {code}"))),
                None => Some(Trouble::Failed(format!("node {rank} failed: {}", node.reason))),
            },
            node_state::LOST => Some(Trouble::Lost(format!("node {rank} was lost: {}", node.reason))),
            _ if now_ms - node.heartbeat_ms > quiet_ms => Some(Trouble::Lost(format!(
                "node {rank} was lost: its runner {} has not answered for {} s",
                node.runner_id,
                quiet_ms / 1000
            ))),
            _ => None,
        }
    })
}

/// Whether every node is ready or running.
fn all_ready(nodes: &[NodeRecord], expected: i32) -> bool {
    i32::try_from(nodes.len()).unwrap_or(0) == expected
        && nodes
            .iter()
            .all(|node| node.state == node_state::READY || node.state == node_state::RUNNING)
}

/// Whether the job's attempt `attempt` is still under way (placed, starting or running).
fn attempt_goes_on(current: &JobRecord, attempt: i32) -> bool {
    current.attempt == attempt
        && !current.stop_requested
        && matches!(
            current.state(),
            Ok(JobState::Scheduled | JobState::Provisioning | JobState::Running)
        )
}

/// Marks node `rank` ready and waits until every node of the attempt is: `Err` with the reason
/// when one ends or goes quiet first, the attempt stops going on, or the wait runs out.
pub(crate) async fn wait_for_gang(ctx: &Context, job: &JobRecord, rank: i32) -> Result<(), Trouble> {
    let report = ctx
        .store
        .report_node(&job.id, job.attempt, rank, node_state::READY, None, "")
        .await;
    if let Err(error) = report {
        return Err(Trouble::Lost(format!("node {rank} could not report ready: {error}")));
    }
    let deadline = tokio::time::Instant::now() + START_PATIENCE;
    loop {
        if let Ok(nodes) = ctx.store.gang_nodes(&job.id, job.attempt).await {
            if all_ready(&nodes, job.nodes) {
                return Ok(());
            }
            let now = kiln_core::ids::now_ms();
            if let Some(trouble) = trouble(&nodes, now, quiet_ms(ctx)) {
                return Err(trouble);
            }
        }
        match ctx.store.job(&job.id).await {
            Ok(current) if !attempt_goes_on(&current, job.attempt) => {
                return Err(Trouble::Failed("the attempt ended before every node was ready".into()));
            }
            _ => {}
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Trouble::Failed(format!(
                "not every node was ready within {} s",
                START_PATIENCE.as_secs()
            )));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Beats node `rank`'s heart every [`heartbeat_every`], for as long as it is polled: the node's
/// supervision polls it beside the node's work, so a runner that dies stops beating.
async fn heartbeat(ctx: &Context, job_id: &str, attempt: i32, rank: i32) {
    let every = heartbeat_every(ctx);
    loop {
        if let Err(error) = ctx.store.node_heartbeat(job_id, attempt, rank).await {
            tracing::warn!(job_id, rank, error = %error, "cannot beat the node's heart");
        }
        tokio::time::sleep(every).await;
    }
}

/// Runs node `rank` (> 0) of a gang job, which this runner took the launch of, to its end.
pub(crate) async fn supervise_node(
    ctx: Context,
    job: JobRecord,
    rank: i32,
    gpu_devices: Vec<u32>,
    controls: Controls,
    shutdown: CancellationToken,
) {
    let key = node_log_id(&job.id, u32::try_from(rank).unwrap_or(0));
    let shipper = LogShipper::start(ctx.nats.clone(), key.clone(), job.attempt);
    let scratch_dir = ctx
        .config
        .work_dir
        .join(format!("{key}-{}", job.attempt).replace('/', "-"));
    let work = run_node(
        &ctx,
        &job,
        rank,
        gpu_devices,
        &scratch_dir,
        &shipper,
        &controls,
        &shutdown,
    );
    let (state, exit_code, reason, instance) = tokio::select! {
        ended = work => ended,
        () = heartbeat(&ctx, &job.id, job.attempt, rank) => unreachable!("the heartbeat never ends"),
    };
    if exit_code.is_none() && !reason.is_empty() {
        shipper.line(LogStream::Stderr, format!("kiln: {reason}")).await;
    }
    if let Err(error) = shipper.finish().await {
        tracing::warn!(job_id = %job.id, rank, error = %error, "shipping the node's logs failed");
    }
    if let Some(instance) = &instance
        && let Err(error) = ctx.provider.release(instance).await
    {
        ctx.metrics.provider_error(instance.provider);
        tracing::error!(job_id = %job.id, rank, error = %error, "cannot release the node's instance; it is released at the next restart");
    }
    if let Err(error) = tokio::fs::remove_dir_all(&scratch_dir).await
        && error.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %scratch_dir.display(), error = %error, "cannot remove a scratch dir");
    }
    if let Err(error) = ctx
        .store
        .report_node(&job.id, job.attempt, rank, state, exit_code, &reason)
        .await
    {
        tracing::warn!(job_id = %job.id, rank, error = %error, "cannot record the node's end");
    }
    tracing::info!(job_id = %job.id, rank, state, ?exit_code, reason, "gang node ended");
    ctx.release_active(&key);
}

/// Provisions, waits for the gang, starts and watches node `rank`. Returns its end state,
/// exit code and reason, and the instance to release.
#[allow(clippy::too_many_arguments)]
async fn run_node(
    ctx: &Context,
    job: &JobRecord,
    rank: i32,
    gpu_devices: Vec<u32>,
    scratch_dir: &std::path::Path,
    shipper: &LogShipper,
    controls: &Controls,
    shutdown: &CancellationToken,
) -> (&'static str, Option<i32>, String, Option<Instance>) {
    let _ = ctx
        .store
        .report_node(&job.id, job.attempt, rank, node_state::PROVISIONING, None, "")
        .await;
    let mut datasets = Vec::new();
    let prepared = super::spec::instance_spec(ctx, job, rank, &gpu_devices, scratch_dir, &mut datasets).await;
    let (spec, masker) = match prepared {
        Ok(prepared) => prepared,
        Err(error) => return (node_state::EXITED, None, error.to_string(), None),
    };
    let provisioned = ctx.provider.provision(&spec).await;
    for archive in spec.code.iter().chain(spec.restore.iter()) {
        super::remove_file(archive).await;
    }
    drop(spec);
    let mut instance = match provisioned {
        Ok(instance) => instance,
        Err(error) => return (node_state::EXITED, None, error.to_string(), None),
    };
    if let Err(trouble) = wait_for_gang(ctx, job, rank).await {
        let reason = match trouble {
            Trouble::Failed(reason) | Trouble::Lost(reason) => reason,
        };
        return (
            node_state::EXITED,
            None,
            format!("not started: {reason}"),
            Some(instance),
        );
    }
    let output = match ctx.provider.start(&mut instance).await {
        Ok(output) => output,
        Err(error) => return (node_state::EXITED, None, error.to_string(), Some(instance)),
    };
    let _ = ctx
        .store
        .report_node(&job.id, job.attempt, rank, node_state::RUNNING, None, "")
        .await;
    let reader = shipper.ship(output, masker);
    let collector = tokio::spawn(crate::collector::collect(
        ctx.clone(),
        instance.clone(),
        gpu_devices,
        rank,
    ));
    tracing::info!(job_id = %job.id, rank, instance = %instance.id, "gang node running");
    let (exit, stopping) = watch_node(ctx, job, rank, &instance, controls, shutdown).await;
    collector.abort();
    let _ = ctx.provider.signal(&instance, Signal::SIGKILL).await;
    let abort = reader.abort_handle();
    if tokio::time::timeout(Duration::from_secs(5), reader).await.is_err() {
        abort.abort();
    }
    match (exit, stopping) {
        // Stopped because the attempt ended: rank 0 has recorded why.
        (Ok(exit), Some(STOPPED_WITH_GANG)) => (
            node_state::EXITED,
            Some(exit.code),
            "stopped with the gang".into(),
            Some(instance),
        ),
        (Ok(_), Some(why)) => (node_state::LOST, None, why.to_string(), Some(instance)),
        (Ok(exit), None) => (node_state::EXITED, Some(exit.code), String::new(), Some(instance)),
        (Err(error), _) => (
            node_state::LOST,
            None,
            format!("lost track of its instance: {error}"),
            Some(instance),
        ),
    }
}

/// Why a node stopped because its gang's attempt ended.
const STOPPED_WITH_GANG: &str = "the gang's attempt ended";

/// Waits for node `rank`'s process to end, stopping it (SIGTERM, grace, SIGKILL) when its
/// instance is taken back, its runner shuts down, or the gang's attempt ends. Returns its exit
/// and why it was stopped, if it was.
async fn watch_node(
    ctx: &Context,
    job: &JobRecord,
    rank: i32,
    instance: &Instance,
    controls: &Controls,
    shutdown: &CancellationToken,
) -> (crate::Result<crate::provider::Exit>, Option<&'static str>) {
    let wait = ctx.provider.wait(instance);
    tokio::pin!(wait);
    let mut stopping: Option<&'static str> = None;
    let exit = loop {
        tokio::select! {
            exit = &mut wait => break exit,
            _ = controls.preempted.cancelled(), if stopping.is_none() => stopping = Some("its instance was taken back"),
            _ = shutdown.cancelled(), if stopping.is_none() => stopping = Some("its runner shut down"),
            _ = tokio::time::sleep(STOP_POLL), if stopping.is_none() => {
                if let Ok(current) = ctx.store.job(&job.id).await
                    && !attempt_goes_on(&current, job.attempt)
                {
                    stopping = Some(STOPPED_WITH_GANG);
                }
            }
        }
        if let Some(why) = stopping {
            tracing::info!(job_id = %job.id, rank, why, "stopping gang node: SIGTERM");
            let _ = ctx.provider.signal(instance, Signal::SIGTERM).await;
            let grace = Duration::from_millis(ctx.config.stop_grace_period_ms);
            if let Ok(exit) = tokio::time::timeout(grace, &mut wait).await {
                break exit;
            }
            let _ = ctx.provider.signal(instance, Signal::SIGKILL).await;
            break wait.await;
        }
    };
    (exit, stopping)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(rank: i32, state: &str, exit_code: Option<i32>, heartbeat_ms: i64) -> NodeRecord {
        NodeRecord {
            job_id: "j".into(),
            attempt: 1,
            rank,
            runner_id: format!("r-{rank}"),
            state: state.into(),
            exit_code,
            reason: "why".into(),
            heartbeat_ms,
        }
    }

    #[test]
    fn a_node_that_failed_or_went_quiet_ends_the_attempt() {
        let now = 100_000;
        let fine = [
            node(0, "running", None, now),
            node(1, "running", None, now),
            node(2, "exited", Some(0), 0),
        ];
        assert_eq!(trouble(&fine, now, 30_000), None);
        let failed = [node(0, "running", None, now), node(1, "exited", Some(3), now)];
        assert_eq!(
            trouble(&failed, now, 30_000),
            Some(Trouble::Failed("node 1 failed: exited with code 3".into()))
        );
        let quiet = [node(0, "running", None, now), node(1, "running", None, now - 30_001)];
        assert!(matches!(trouble(&quiet, now, 30_000), Some(Trouble::Lost(reason)) if reason.contains("r-1")));
        let lost = [node(1, "lost", None, now)];
        assert_eq!(
            trouble(&lost, now, 30_000),
            Some(Trouble::Lost("node 1 was lost: why".into()))
        );
        // Rank 0 is the job itself: its runner's lease covers it.
        assert_eq!(trouble(&[node(0, "exited", Some(1), 0)], now, 30_000), None);
        assert!(all_ready(
            &[node(0, "ready", None, now), node(1, "running", None, now)],
            2
        ));
        assert!(!all_ready(
            &[node(0, "ready", None, now), node(1, "provisioning", None, now)],
            2
        ));
        assert!(!all_ready(&[node(0, "ready", None, now)], 2));
    }
}
