//! A sweep as its record tells it: the trials, their knobs, jobs, observations, stops and ends.
//! Built by replaying the events in order ([`SweepView::apply`]), by the leader when it takes
//! over a sweep and by every replica that answers GetSweep.

use std::collections::BTreeMap;

use kiln_core::runs::RunConfig;

use crate::algo::{Trial, TrialState};
use crate::record::{Event, Recorded, SWEEP_EVENT, SweepRecord};
use crate::spec::{Checked, SweepSpec};

/// One trial as recorded.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TrialView {
    pub index: u32,
    pub config: RunConfig,
    pub job_id: Option<String>,
    /// Objective points by step: (resource, value as logged).
    pub observations: BTreeMap<i64, (f64, f64)>,
    /// Stopped early: (rung, reason, when).
    pub stop: Option<(f64, String, i64)>,
    pub end: Option<TrialEnd>,
}

/// How a trial's job ended.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialEnd {
    /// The job's end state (`succeeded`, `failed`, `stopped`, `lost`).
    pub state: String,
    pub value: Option<f64>,
    pub preemptions: i32,
    pub gpu_hours: f64,
}

impl TrialView {
    /// The objective's last value as logged (at the largest step).
    pub fn last_value(&self) -> Option<f64> {
        self.observations.values().next_back().map(|(_, value)| *value)
    }

    /// The largest resource reported.
    pub fn resource(&self) -> f64 {
        self.observations
            .values()
            .map(|(resource, _)| *resource)
            .fold(0.0, f64::max)
    }

    pub fn is_live(&self) -> bool {
        self.end.is_none()
    }

    /// The state shown to users.
    pub fn state_name(&self, job_state: Option<&str>) -> String {
        match (&self.end, &self.stop) {
            (_, Some(_)) if self.end.as_ref().is_none_or(|end| end.state != "failed") => "stopped".into(),
            (Some(end), _) => end.state.clone(),
            (None, _) if self.job_id.is_none() => "pending".into(),
            (None, _) => job_state.unwrap_or("queued").to_string(),
        }
    }

    /// Whether it counts as failed (against `max-failed`).
    pub fn failed(&self) -> bool {
        self.stop.is_none() && self.end.as_ref().is_some_and(|end| end.state != "succeeded")
    }
}

/// A sweep: its record, its checked spec and its trials.
#[derive(Debug, Clone)]
pub struct SweepView {
    pub record: SweepRecord,
    pub checked: Checked,
    pub trials: Vec<TrialView>,
    pub registered: Option<String>,
    /// The seq of the last event applied (-1 for none).
    pub last_seq: i64,
    /// The algorithm has nothing more to suggest (a grid tried whole); known to the leader
    /// that asked, asked again by the next one.
    pub exhausted: bool,
}

impl SweepView {
    pub fn new(record: SweepRecord) -> crate::Result<SweepView> {
        let spec: SweepSpec = serde_json::from_str(&record.spec_json)
            .map_err(|error| crate::Error::Internal(format!("sweep {}: stored spec: {error}", record.id)))?;
        let checked = spec.check().map_err(|problems| {
            crate::Error::Internal(format!(
                "sweep {}: stored spec no longer checks: {problems:?}",
                record.id
            ))
        })?;
        Ok(SweepView {
            record,
            checked,
            trials: Vec::new(),
            registered: None,
            last_seq: -1,
            exhausted: false,
        })
    }

    pub fn spec(&self) -> &SweepSpec {
        &self.checked.spec
    }

    /// Applies recorded events in order.
    pub fn apply(&mut self, events: impl IntoIterator<Item = Recorded>) {
        for recorded in events {
            self.last_seq = self.last_seq.max(recorded.seq);
            if recorded.trial == SWEEP_EVENT {
                if let Event::Registered { version } = recorded.event {
                    self.registered = Some(version);
                }
                continue;
            }
            let Ok(index) = u32::try_from(recorded.trial) else {
                continue;
            };
            let trial = self.trial_mut(index);
            match recorded.event {
                Event::Suggest { config } => trial.config = config,
                Event::Submit { job_id } => trial.job_id = Some(job_id),
                Event::Observe { step, resource, value } => {
                    trial.observations.insert(step, (resource, value));
                }
                Event::Stop { rung, reason, .. } => trial.stop = Some((rung, reason, recorded.at_ms)),
                Event::End {
                    state,
                    value,
                    preemptions,
                    gpu_hours,
                } => {
                    trial.end = Some(TrialEnd {
                        state,
                        value,
                        preemptions,
                        gpu_hours,
                    })
                }
                Event::Registered { .. } => {}
            }
        }
    }

    fn trial_mut(&mut self, index: u32) -> &mut TrialView {
        let at = index as usize;
        while self.trials.len() <= at {
            let next = self.trials.len() as u32;
            self.trials.push(TrialView {
                index: next,
                ..TrialView::default()
            });
        }
        &mut self.trials[at]
    }

    pub fn trial_of_job(&self, job_id: &str) -> Option<&TrialView> {
        self.trials.iter().find(|trial| trial.job_id.as_deref() == Some(job_id))
    }

    /// The trials as the algorithms see them (values oriented: lower is better).
    pub fn history(&self) -> Vec<Trial> {
        let objective = &self.spec().objective;
        self.trials
            .iter()
            .map(|trial| {
                let curve = trial
                    .observations
                    .values()
                    .map(|(resource, value)| (*resource, objective.oriented(*value)))
                    .collect();
                let state = match &trial.end {
                    _ if trial.stop.is_some() => TrialState::Stopped,
                    None => TrialState::Running,
                    Some(_) if trial.failed() => TrialState::Failed,
                    Some(_) => TrialState::Done,
                };
                let value = match state {
                    TrialState::Done => trial.last_value().map(|value| objective.oriented(value)),
                    _ => None,
                };
                Trial {
                    index: u64::from(trial.index),
                    config: trial.config.clone(),
                    state,
                    value,
                    curve,
                }
            })
            .collect()
    }

    /// The trial with the best objective value so far (finished trials first; a trial stopped
    /// early competes with the value it reached).
    pub fn best(&self) -> Option<&TrialView> {
        let objective = &self.spec().objective;
        self.trials
            .iter()
            .filter(|trial| !trial.failed())
            .filter_map(|trial| Some((trial, objective.oriented(trial.last_value()?))))
            .filter(|(_, value)| value.is_finite())
            .min_by(|a, b| {
                // A trial that ran to the end beats one stopped early at the same value.
                (a.1, a.0.stop.is_some())
                    .partial_cmp(&(b.1, b.0.stop.is_some()))
                    .expect("finite")
            })
            .map(|(trial, _)| trial)
    }

    pub fn live_trials(&self) -> usize {
        self.trials.iter().filter(|trial| trial.is_live()).count()
    }

    pub fn failed_trials(&self) -> usize {
        self.trials.iter().filter(|trial| trial.failed()).count()
    }

    pub fn gpu_hours(&self) -> f64 {
        self.trials
            .iter()
            .filter_map(|trial| trial.end.as_ref())
            .map(|end| end.gpu_hours)
            .sum()
    }
}
