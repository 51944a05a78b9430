//! One worker of a 2-member mean ensemble (quorum 1, 50 ms deadline) paused with SIGSTOP for a
//! while under load, every call recorded, and the relay's rotation gauge sampled meanwhile.
//!
//! The observables: every call sent while the worker is stopped must be answered (200) and
//! flagged `kiln.partial`; their p99; when the relay took the worker out of rotation
//! (`kiln_runner_serve_in_rotation` of its member reading 0, sampled every 20 ms) and when the
//! first partial answer came in under half the deadline (no longer waiting for the member); and after SIGCONT when the gauge reads 1 again
//! and when the first call is answered by both members again.

use std::time::Duration;

use anyhow::Result;
use bytes::Bytes;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use crate::load::{self, Outcome, Route, Sample, Summary};
use crate::stack::{self, Kiln, Worker};

#[derive(Debug)]
pub struct Plan {
    pub service: String,
    pub clients: usize,
    pub before: Duration,
    pub paused: Duration,
    pub after: Duration,
    pub deadline: Duration,
}

#[derive(Debug, Default)]
pub struct PauseReport {
    /// Calls sent after SIGSTOP that ended before SIGCONT.
    pub during: usize,
    pub during_latency: Summary,
    pub during_failed: usize,
    pub during_complete: usize,
    pub first_failure_opt: Option<String>,
    /// Every call of the run.
    pub all_latency: Summary,
    pub all_failed: usize,
    /// From SIGSTOP: the gauge read 0; the first partial answer in under half the deadline
    /// (the predictor no longer waiting for the paused member) ended.
    pub ejected_gauge_opt: Option<Duration>,
    pub first_quick_partial_opt: Option<Duration>,
    /// From SIGCONT: the gauge read 1; the first call sent after it answered by both members.
    pub back_gauge_opt: Option<Duration>,
    pub back_complete_opt: Option<Duration>,
}

pub async fn run(kiln: &Kiln, plan: &Plan, paused: &Worker, body: &Bytes) -> Result<PauseReport> {
    let route = Route::One(load::Endpoint::with_token(
        format!("{}/v2/models/{}/infer", kiln.predictor, plan.service),
        &kiln.token,
    )?);
    let epoch = Instant::now();
    let stop = CancellationToken::new();
    let gauge = tokio::spawn(sample_gauge(
        kiln.metrics.clone(),
        plan.service.clone(),
        paused.member.clone(),
        epoch,
        stop.clone(),
    ));
    let mut clients = load::record(&route, body, plan.clients, epoch, stop.clone())?;
    tokio::time::sleep(plan.before).await;
    // Ejection is timed from the signal; calls count as sent while paused from the moment
    // every thread of the worker has stopped (one may finish a call in between).
    let signalled_at = epoch.elapsed();
    let guard = Resume(paused.pid);
    stack::pause(paused.pid).await?;
    let stopped_at = epoch.elapsed();
    tokio::time::sleep(plan.paused).await;
    drop(guard); // SIGCONT
    let resumed_at = epoch.elapsed();
    tokio::time::sleep(plan.after).await;
    stop.cancel();
    let mut samples: Vec<Sample> = Vec::new();
    while let Some(joined) = clients.join_next().await {
        samples.extend(joined?);
    }
    let readings = gauge.await??;
    Ok(report(
        plan,
        &samples,
        &readings,
        [signalled_at, stopped_at, resumed_at],
    ))
}

/// SIGCONTs the worker when dropped, so an error never leaves it stopped.
struct Resume(i32);

impl Drop for Resume {
    fn drop(&mut self) {
        let _ = stack::resume(self.0);
    }
}

/// (since the epoch, the gauge's value) every 20 ms until `stop`.
async fn sample_gauge(
    metrics_url: String,
    service: String,
    member: String,
    epoch: Instant,
    stop: CancellationToken,
) -> Result<Vec<(Duration, f64)>> {
    let client = reqwest::Client::builder()
        .no_proxy()
        .timeout(Duration::from_secs(2))
        .build()?;
    let mut readings = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_millis(20));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    while !stop.is_cancelled() {
        tick.tick().await;
        if let Ok(value) = stack::in_rotation(&client, &metrics_url, &service, &member).await {
            readings.push((epoch.elapsed(), value));
        }
    }
    Ok(readings)
}

fn report(
    plan: &Plan,
    samples: &[Sample],
    readings: &[(Duration, f64)],
    [signalled_at, stopped_at, resumed_at]: [Duration; 3],
) -> PauseReport {
    let mut report = PauseReport::default();
    let all: Vec<Duration> = samples.iter().map(|sample| sample.took).collect();
    report.all_latency = Summary::of(&all);
    report.all_failed = samples
        .iter()
        .filter(|sample| matches!(sample.outcome, Outcome::Failed(_)))
        .count();
    let during: Vec<&Sample> = samples
        .iter()
        .filter(|sample| sample.sent >= stopped_at && sample.sent + sample.took <= resumed_at)
        .collect();
    report.during = during.len();
    report.during_latency = Summary::of(&during.iter().map(|sample| sample.took).collect::<Vec<_>>());
    for sample in &during {
        match &sample.outcome {
            Outcome::Partial => {}
            Outcome::Complete => report.during_complete += 1,
            Outcome::Failed(error) => {
                report.during_failed += 1;
                report.first_failure_opt.get_or_insert_with(|| error.clone());
            }
        }
    }
    // Until the relay ejects the paused worker, a call waits out the deadline for it; after,
    // the predictor learns at once that the member has no worker in rotation.
    let quick = plan.deadline / 2;
    report.first_quick_partial_opt = during
        .iter()
        .filter(|sample| sample.outcome == Outcome::Partial && sample.took < quick)
        .map(|sample| sample.sent + sample.took - signalled_at)
        .min();
    report.ejected_gauge_opt = readings
        .iter()
        .find(|(at, value)| *at >= signalled_at && *value < 1.0)
        .map(|(at, _)| *at - signalled_at);
    report.back_gauge_opt = readings
        .iter()
        .find(|(at, value)| *at >= resumed_at && *value >= 1.0)
        .map(|(at, _)| *at - resumed_at);
    report.back_complete_opt = samples
        .iter()
        .filter(|sample| sample.sent >= resumed_at && sample.outcome == Outcome::Complete)
        .map(|sample| sample.sent + sample.took - resumed_at)
        .min();
    report
}
