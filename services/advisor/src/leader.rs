//! The leader: one advisor replica, the holder of the `advisor` lease, runs every live sweep.
//!
//! Each pass (every `pass-interval-ms`, and at once when a trial's job changes state):
//! 1. reads the job of every live trial from the database;
//! 2. reads `KILN_METRICS` up to the stream's last sequence, taken after step 1, so every point
//!    a trial logged before its job ended is recorded before its end is (the `end` event carries
//!    the objective's last value);
//! 3. per sweep: notes the ends of trials whose jobs ended (a preempted job is queued again,
//!    so its trial goes on and counts once), asks the early-stop rule about trials with new
//!    observations and stops the losers, suggests and submits new trials within the budget, and
//!    ends the sweep when it is spent.
//!
//! What a pass learns and decides about a sweep is recorded in as few transactions as the
//! rules allow (one, for a pass that ends a trial and starts the next):
//! - observations and ends are facts that can be read again (the metric messages are acked only
//!   after they are recorded; a job's end stays in its record), so they wait for the next write;
//! - a stop is recorded before its job is stopped;
//! - a trial's job is submitted first, with an idempotency key naming the sweep and the trial,
//!   then recorded with the knobs the job holds, and recorded before the next job is submitted:
//!   a leader that died in between leaves at most one job unrecorded, which its successor finds
//!   by that key and adopts ([`trials::unrecorded`]).
//!
//! Every act is idempotent (the job's key; stopping a stopped job does nothing; an event carries
//! a dedupe key), so a leader killed at any instant leaves a record and jobs its successor
//! replays to the same place: no trial twice, none lost.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use kiln_core::events::stop_job;
use kiln_core::ids::now_ms;
use kiln_core::lease::Lease;
use kiln_core::store::JobRecord;
use kiln_core::subjects;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::observe::{Drained, Interest, MetricsFeed, Point};
use crate::record::{self, Event, SWEEP_EVENT};
use crate::register::Registration;
use crate::state::SweepView;
use crate::stop::{Decision, EarlyStop};
use crate::{Shared, trials};

/// Runs the leader loop until `shutdown`: standbys keep trying for the lease.
pub async fn run(shared: Arc<Shared>, shutdown: CancellationToken) {
    let name = if shared.config.instance_name.is_empty() {
        format!("advisor-{}", kiln_core::ids::new_id())
    } else {
        shared.config.instance_name.clone()
    };
    let ttl = Duration::from_millis(shared.config.lease_ttl_ms);
    let mut lease = loop {
        match Lease::new(&shared.nats, subjects::LEASE_ADVISOR, &name, ttl).await {
            Ok(lease) => break lease,
            Err(error) => tracing::warn!(error = %error, "cannot open the advisor lease; retrying"),
        }
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
        }
    };
    let interval = Duration::from_millis(shared.config.pass_interval_ms);
    let renew_every = ttl / 3;
    let mut last_renewal: Option<tokio::time::Instant> = None;
    let mut leader: Option<Leader> = None;
    let wake = Arc::new(tokio::sync::Notify::new());
    let mut wakeups = tokio::task::JoinSet::new();
    while !shutdown.is_cancelled() {
        if last_renewal.is_none_or(|at| at.elapsed() >= renew_every) {
            last_renewal = Some(tokio::time::Instant::now());
            if let Err(error) = lease.tick().await {
                tracing::warn!(error = %error, "cannot reach the advisor lease; not leading");
            }
        }
        shared.metrics.leader.set(i64::from(lease.is_held()));
        match (lease.is_held(), leader.is_some()) {
            (true, false) => match Leader::take_over(&shared).await {
                Ok(taken) => {
                    tracing::info!(name, sweeps = taken.views.len(), "advisor leading");
                    leader = Some(taken);
                    wakeups.spawn(wake_on_job_events(shared.clone(), wake.clone(), shutdown.clone()));
                }
                Err(error) => tracing::warn!(error = %error, "cannot take over the sweeps; retrying"),
            },
            (false, true) => {
                tracing::info!(name, "advisor no longer leading");
                shared.metrics.sweeps_live.set(0);
                shared.metrics.trials_running.set(0);
                leader = None;
                wakeups.abort_all();
            }
            _ => {}
        }
        if let Some(current) = leader.as_mut() {
            let finished = match current.pass(&shared, &|| lease.is_held()).await {
                Ok(finished) => finished,
                Err(error) => {
                    tracing::warn!(error = %error, "sweep pass failed; the record is read again");
                    false
                }
            };
            if !finished {
                // The record is the truth: read it again rather than trust what this pass held.
                leader = None;
                wakeups.abort_all();
            }
        }
        let nap = interval.min(renew_every);
        tokio::select! {
            _ = shutdown.cancelled() => {}
            _ = tokio::time::sleep(nap) => {}
            _ = wake.notified() => {}
        }
    }
    if let Err(error) = lease.release().await {
        tracing::warn!(error = %error, "cannot release the advisor lease; a standby takes over when it expires");
    }
}

/// Wakes the leader when a job changes state (`KILN_JOBS`): a trial that ended frees its slot
/// for the next one at once. The pass itself reads the jobs from the database.
async fn wake_on_job_events(shared: Arc<Shared>, wake: Arc<tokio::sync::Notify>, shutdown: CancellationToken) {
    let subscription = async {
        let stream = shared.nats.jetstream.get_stream(subjects::STREAM_JOBS).await.ok()?;
        let consumer: async_nats::jetstream::consumer::PullConsumer = stream
            .get_or_create_consumer(
                subjects::CONSUMER_ADVISOR_JOBS,
                async_nats::jetstream::consumer::pull::Config {
                    durable_name: Some(subjects::CONSUMER_ADVISOR_JOBS.to_string()),
                    filter_subject: subjects::JOB_EVENT_ALL.to_string(),
                    ack_policy: async_nats::jetstream::consumer::AckPolicy::None,
                    deliver_policy: async_nats::jetstream::consumer::DeliverPolicy::New,
                    ..Default::default()
                },
            )
            .await
            .ok()?;
        consumer.messages().await.ok()
    };
    let Some(mut messages) = subscription.await else {
        tracing::warn!("cannot read job events; the leader passes on its interval only");
        return;
    };
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            message = messages.next() => match message {
                Some(Ok(_)) => wake.notify_one(),
                Some(Err(error)) => tracing::debug!(error = %error, "job event read failed"),
                None => return,
            },
        }
    }
}

/// What the leader holds between passes: the live sweeps as their records tell them.
struct Leader {
    views: HashMap<String, SweepView>,
    feed: MetricsFeed,
    /// Observations each trial had when the early-stop rule last looked at it.
    judged: HashMap<(String, u32), usize>,
    /// When each live trial's job was last asked to stop.
    stop_asked: HashMap<String, i64>,
}

impl Leader {
    async fn take_over(shared: &Shared) -> Result<Leader> {
        let feed = MetricsFeed::open(&shared.nats).await?;
        let mut leader = Leader {
            views: HashMap::new(),
            feed,
            judged: HashMap::new(),
            stop_asked: HashMap::new(),
        };
        leader.refresh(shared).await?;
        Ok(leader)
    }

    /// Loads the sweeps that became live, re-reads the records of the others, drops the ended.
    async fn refresh(&mut self, shared: &Shared) -> Result<()> {
        let live = shared.sweeps.live_sweeps().await?;
        self.views.retain(|id, _| live.iter().any(|record| &record.id == id));
        for record in live {
            match self.views.get_mut(&record.id) {
                Some(view) => view.record = record,
                None => {
                    let mut view = SweepView::new(record)?;
                    view.apply(shared.sweeps.events(&view.record.id).await?);
                    if let Some(job) = trials::unrecorded(shared, &view).await? {
                        let index = view.trials.len() as u32;
                        tracing::info!(sweep_id = %view.record.id, trial = index, job_id = %job.id, "adopting a trial the last leader submitted but did not record");
                        view.stage(vec![trials::suggestion(index, &job)?]);
                        flush(shared, &mut view).await?;
                    }
                    self.views.insert(view.record.id.clone(), view);
                }
            }
        }
        Ok(())
    }

    /// One pass over every live sweep; `false` when the lease was lost part-way (the leader is
    /// then dropped with what it had not recorded, which its successor reads again).
    async fn pass(&mut self, shared: &Shared, leading: &(dyn Fn() -> bool + Sync)) -> Result<bool> {
        self.refresh(shared).await?;
        let mut jobs: HashMap<String, JobRecord> = HashMap::new();
        for view in self.views.values() {
            for trial in view.trials.iter().filter(|trial| trial.is_live()) {
                if let Some(job_id) = &trial.job_id {
                    jobs.insert(job_id.clone(), shared.store.job(job_id).await?);
                }
            }
        }
        let read = self.observe(shared).await?;
        let ids: Vec<String> = self.views.keys().cloned().collect();
        for sweep_id in ids {
            if !leading() {
                return Ok(false);
            }
            self.tend(shared, &sweep_id, &jobs).await?;
        }
        // Every point read is recorded (each sweep's turn ends with a flush): ack the messages.
        for drained in read {
            drained.ack().await;
        }
        let running: usize = self.views.values().map(SweepView::live_trials).sum();
        shared.metrics.sweeps_live.set(self.views.len() as i64);
        shared.metrics.trials_running.set(running as i64);
        Ok(true)
    }

    /// Stages every objective point of a live trial published so far; returns the messages
    /// read, to be acked once the points are recorded.
    async fn observe(&mut self, shared: &Shared) -> Result<Vec<Drained>> {
        let interest = self.interest();
        self.feed.retain(&interest);
        let target = MetricsFeed::last_sequence(&shared.nats).await?;
        let mut read = Vec::new();
        loop {
            let drained = self.feed.fetch(&interest).await?;
            if drained.is_empty() {
                return Ok(read);
            }
            self.stage_points(&drained.points);
            let read_to = drained.read_to;
            read.push(drained);
            if read_to >= target {
                return Ok(read);
            }
        }
    }

    fn interest(&self) -> HashMap<String, Interest> {
        let mut interest = HashMap::new();
        for view in self.views.values() {
            let resource = view
                .spec()
                .early_stop
                .resource()
                .filter(|key| *key != "step")
                .map(str::to_string);
            for trial in view.trials.iter().filter(|trial| trial.is_live()) {
                if let Some(job_id) = &trial.job_id {
                    interest.insert(
                        job_id.clone(),
                        Interest {
                            sweep_id: view.record.id.clone(),
                            trial: trial.index,
                            objective: view.spec().objective.metric.clone(),
                            resource: resource.clone(),
                        },
                    );
                }
            }
        }
        interest
    }

    fn stage_points(&mut self, points: &[Point]) {
        let mut by_sweep: HashMap<&str, Vec<(i32, Event)>> = HashMap::new();
        for point in points {
            by_sweep.entry(point.sweep_id.as_str()).or_default().push((
                point.trial as i32,
                Event::Observe {
                    step: point.step,
                    resource: point.resource,
                    value: point.value,
                },
            ));
        }
        for (sweep_id, events) in by_sweep {
            if let Some(view) = self.views.get_mut(sweep_id) {
                view.stage(events);
            }
        }
    }

    /// One sweep's turn: ends, early stops, submissions, suggestions, and its own end.
    async fn tend(&mut self, shared: &Shared, sweep_id: &str, jobs: &HashMap<String, JobRecord>) -> Result<()> {
        let Some(view) = self.views.get_mut(sweep_id) else {
            return Ok(());
        };
        // Ends of trials whose jobs ended.
        let ends: Vec<(i32, Event)> = view
            .trials
            .iter()
            .filter(|trial| trial.is_live())
            .filter_map(|trial| {
                let job = jobs.get(trial.job_id.as_ref()?)?;
                Some((trial.index as i32, trials::end_of(trial, job)?))
            })
            .collect();
        view.stage(ends);
        // Early stops.
        let stopping = view.record.state == record::STOPPING;
        let mut stops = Vec::new();
        let history = view.history();
        for trial in view
            .trials
            .iter()
            .filter(|trial| trial.is_live() && trial.stop.is_none())
        {
            let Some(job_id) = &trial.job_id else { continue };
            if stopping {
                stops.push((
                    trial.index as i32,
                    Event::Stop {
                        job_id: job_id.clone(),
                        rung: trial.resource(),
                        reason: "the sweep was stopped".into(),
                    },
                ));
                continue;
            }
            if matches!(view.checked.spec.early_stop, EarlyStop::None) {
                continue;
            }
            let seen = trial.observations.len();
            let key = (sweep_id.to_string(), trial.index);
            let judged = self.judged.get(&key).copied().unwrap_or(0);
            if seen <= judged {
                continue;
            }
            self.judged.insert(key, seen);
            // The rule judges each new observation in turn (several may come in one batch),
            // as if it had been asked when that one arrived.
            let me = &history[trial.index as usize];
            for upto in judged + 1..=seen {
                let mut so_far = me.clone();
                so_far.curve.truncate(upto);
                if let Decision::Stop { rung, reason } = view.checked.spec.early_stop.decide(&so_far, history) {
                    stops.push((
                        trial.index as i32,
                        Event::Stop {
                            job_id: job_id.clone(),
                            rung,
                            reason,
                        },
                    ));
                    break;
                }
            }
        }
        if !stops.is_empty() {
            // A stop is on record before its job is stopped.
            view.stage(stops);
            flush(shared, view).await?;
        }
        // Stop the jobs of stopped trials once the grace period (for `kiln.should_stop()`) is over.
        let grace_ms = i64::try_from(shared.config.stop_grace_ms).unwrap_or(i64::MAX);
        for trial in view.trials.iter().filter(|trial| trial.is_live()) {
            let (Some((_, reason, at_ms)), Some(job_id)) = (&trial.stop, &trial.job_id) else {
                continue;
            };
            let Some(job) = jobs.get(job_id) else { continue };
            let asked_recently = self
                .stop_asked
                .get(job_id)
                .is_some_and(|at| now_ms() - at < grace_ms.max(1000));
            if now_ms() - at_ms < grace_ms || job.stop_requested || asked_recently {
                continue;
            }
            self.stop_asked.insert(job_id.clone(), now_ms());
            tracing::info!(sweep_id, trial = trial.index, job_id, reason, "stopping a trial");
            stop_job(
                &shared.nats,
                &shared.store,
                job.clone(),
                &format!("early-stopped: {reason}"),
            )
            .await?;
        }
        match view.record.state.as_str() {
            record::STOPPING if view.live_trials() == 0 => {
                flush(shared, view).await?;
                shared
                    .sweeps
                    .set_state(sweep_id, &[record::STOPPING], record::STOPPED, "stopped by request")
                    .await?;
            }
            record::RUNNING => {
                suggest(shared, view, jobs).await?;
                finish_if_spent(shared, view).await?;
            }
            _ => {}
        }
        flush(shared, view).await
    }
}

/// Records a sweep's staged events and counts them.
async fn flush(shared: &Shared, view: &mut SweepView) -> Result<()> {
    let metrics = &shared.metrics;
    for (_, event) in view.flush(&shared.sweeps).await? {
        match event {
            Event::Suggest { .. } => metrics.trials_submitted.inc(),
            Event::Stop { .. } => metrics.trials_stopped.inc(),
            Event::End { .. } => metrics.trials_ended.inc(),
            Event::Observe { .. } => metrics.observations.inc(),
            Event::Registered { .. } => metrics.models_registered.inc(),
        };
    }
    Ok(())
}

/// What is left of the budget, if anything: why the sweep may suggest no more.
fn spent(view: &SweepView, jobs: &HashMap<String, JobRecord>) -> Option<String> {
    let budget = &view.spec().budget;
    if view.trials.len() >= budget.max_trials as usize {
        return Some(format!("{} trials, the budget", budget.max_trials));
    }
    let max_failed = budget.max_failed.unwrap_or(budget.max_trials);
    if view.failed_trials() > max_failed as usize {
        return Some(format!(
            "{} trials failed, more than max-failed {max_failed}",
            view.failed_trials()
        ));
    }
    if let Some(hours) = budget.max_gpu_hours {
        let running: f64 = view
            .trials
            .iter()
            .filter(|trial| trial.is_live())
            .filter_map(|trial| jobs.get(trial.job_id.as_ref()?))
            .map(|job| trials::gpu_hours(job, now_ms()))
            .sum();
        if view.gpu_hours() + running >= hours {
            return Some(format!("{hours} GPU-hours, the budget"));
        }
    }
    None
}

/// Suggests and submits trials while the sweep has room (max-parallel) and budget.
async fn suggest(shared: &Shared, view: &mut SweepView, jobs: &HashMap<String, JobRecord>) -> Result<()> {
    let mut unrecorded = false;
    while view.live_trials() < view.spec().budget.max_parallel as usize && spent(view, jobs).is_none() {
        let index = view.trials.len() as u32;
        let history = view.history();
        let Some(config) = view
            .spec()
            .algorithm
            .suggest(&view.checked.space, history, u64::from(index))
        else {
            view.exhausted = true;
            return Ok(());
        };
        // One trial at most is submitted and not recorded (the one a successor adopts).
        if unrecorded {
            flush(shared, view).await?;
        }
        let job = trials::submit(shared, &view.record, &view.checked, index, &config).await?;
        view.stage(vec![trials::suggestion(index, &job)?]);
        unrecorded = true;
    }
    Ok(())
}

/// Ends a sweep with nothing live and nothing more to suggest, and registers its best trial.
async fn finish_if_spent(shared: &Shared, view: &mut SweepView) -> Result<()> {
    if view.live_trials() > 0 {
        return Ok(());
    }
    let why = match spent(view, &HashMap::new()) {
        Some(why) => why,
        None if view.exhausted => "every grid point was tried".to_string(),
        None => return Ok(()),
    };
    // The whole record before the sweep ends.
    flush(shared, view).await?;
    let budget = &view.spec().budget;
    let failed = view.failed_trials() > budget.max_failed.unwrap_or(budget.max_trials) as usize;
    let mut why = why;
    if !failed && view.registered.is_none() && view.spec().register.is_some() {
        match crate::register::best_trial(shared, view).await? {
            Registration::Registered(version) => {
                shared.sweeps.set_registered(&view.record.id, &version).await?;
                view.stage(vec![(SWEEP_EVENT, Event::Registered { version })]);
                flush(shared, view).await?;
            }
            Registration::Refused(reason) => why = format!("{why}; the best trial was not registered: {reason}"),
        }
    }
    let to = if failed { record::FAILED } else { record::FINISHED };
    shared
        .sweeps
        .set_state(&view.record.id, &[record::RUNNING], to, &why)
        .await?;
    tracing::info!(sweep_id = %view.record.id, state = to, reason = %why, "sweep ended");
    Ok(())
}
