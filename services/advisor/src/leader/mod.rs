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
use kiln_core::lease::Lease;
use kiln_core::store::JobRecord;
use kiln_core::subjects;
use tokio_util::sync::CancellationToken;

use crate::error::Result;
use crate::observe::{Drained, Interest, MetricsFeed, Point};
use crate::record::Event;
use crate::state::SweepView;
use crate::{Shared, trials};

mod tend;

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
    /// The versions of each live sweep's live trials' jobs when last read: a sweep whose trials
    /// changed (one started, one ended) is told to its watchers.
    trial_versions: HashMap<String, Vec<(String, i64)>>,
}

impl Leader {
    async fn take_over(shared: &Shared) -> Result<Leader> {
        let feed = MetricsFeed::open(&shared.nats).await?;
        let mut leader = Leader {
            views: HashMap::new(),
            feed,
            judged: HashMap::new(),
            stop_asked: HashMap::new(),
            trial_versions: HashMap::new(),
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
        self.tell_trial_changes(shared, &jobs);
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

    /// Tells the watchers of sweeps which live sweeps' trials' jobs changed since the last pass
    /// (their records' own changes are told as they are written).
    fn tell_trial_changes(&mut self, shared: &Shared, jobs: &HashMap<String, JobRecord>) {
        self.trial_versions
            .retain(|sweep_id, _| self.views.contains_key(sweep_id));
        for (sweep_id, view) in &self.views {
            let versions: Vec<(String, i64)> = view
                .trials
                .iter()
                .filter_map(|trial| trial.job_id.as_ref())
                .filter_map(|job_id| jobs.get(job_id).map(|job| (job_id.clone(), job.version)))
                .collect();
            if self.trial_versions.get(sweep_id) != Some(&versions) {
                shared.sweeps.touch(sweep_id);
                self.trial_versions.insert(sweep_id.clone(), versions);
            }
        }
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
