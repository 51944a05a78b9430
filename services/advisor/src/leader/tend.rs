//! One sweep's turn in a leader's pass: the ends of its trials, early stops, suggestions and
//! submissions within the budget, and its own end (with its best trial registered).

use std::collections::HashMap;

use kiln_core::events::stop_job;
use kiln_core::ids::now_ms;
use kiln_core::store::{JobRecord, paused_reason};

use super::{Leader, flush};
use crate::Shared;
use crate::error::{Error, Result};
use crate::record::{self, Event, SWEEP_EVENT};
use crate::register::Registration;
use crate::state::SweepView;
use crate::stop::{Decision, EarlyStop};
use crate::trials;

impl Leader {
    /// One sweep's turn: ends, early stops, submissions, suggestions, and its own end.
    pub(super) async fn tend(
        &mut self,
        shared: &Shared,
        sweep_id: &str,
        jobs: &HashMap<String, JobRecord>,
    ) -> Result<()> {
        let Some(view) = self.views.get_mut(sweep_id) else {
            return Ok(());
        };
        // A sweep whose owner may no longer run jobs pauses: it stops like a stopped sweep.
        if view.record.state == record::RUNNING
            && let Err(error) = shared
                .store
                .check_owner(&view.record.owner_id, &view.record.project)
                .await
        {
            pause(shared, view, error.into()).await?;
        }
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
                        reason: match view.record.paused_reason.as_str() {
                            "" => "the sweep was stopped".into(),
                            paused => paused.to_string(),
                        },
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
                let reason = match view.record.paused_reason.as_str() {
                    "" => "stopped by request",
                    paused => paused,
                };
                shared
                    .sweeps
                    .set_state(sweep_id, &[record::STOPPING], record::STOPPED, reason)
                    .await?;
            }
            record::RUNNING => match suggest(shared, view, jobs).await {
                // The owner lost the right between the check above and the insert.
                Err(error) if error.owner_revoked().is_some() => pause(shared, view, error).await?,
                suggested => {
                    suggested?;
                    finish_if_spent(shared, view).await?;
                }
            },
            _ => {}
        }
        flush(shared, view).await
    }
}

/// Pauses a running sweep for `error` when it is [`kiln_core::store::StoreError::OwnerRevoked`]
/// (and returns any other error): the sweep stops, its trials with it, and says why. Its
/// record is read again, so the rest of the turn acts on the pause.
async fn pause(shared: &Shared, view: &mut SweepView, error: Error) -> Result<()> {
    let Some(why) = error.owner_revoked() else {
        return Err(error);
    };
    let reason = paused_reason(why);
    if let Some(paused) = shared.sweeps.pause(&view.record.id, &reason).await? {
        tracing::warn!(sweep_id = %view.record.id, reason = %reason, "sweep paused: its owner may no longer run jobs");
        view.record = paused;
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
