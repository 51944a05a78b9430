//! A sweep as its record tells it: the trials, their knobs, jobs, observations, stops and ends.
//! Built by replaying the events in order ([`SweepView::apply`]), by the leader when it takes
//! over a sweep and by every replica that answers GetSweep.

use std::collections::BTreeMap;

use kiln_core::runs::RunConfig;

use crate::algo::{Trial, TrialState};
use crate::record::{Event, Recorded, SWEEP_EVENT, SweepRecord, SweepStore};
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
    /// The trials as the algorithms see them, one per trial ([`SweepView::history`]).
    history: Vec<Trial>,
    /// Events applied but not yet recorded ([`SweepView::stage`]), numbered from
    /// `last_seq - staged.len() + 1`.
    staged: Vec<(i32, Event)>,
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
            history: Vec::new(),
            staged: Vec::new(),
        })
    }

    pub fn spec(&self) -> &SweepSpec {
        &self.checked.spec
    }

    /// Appends `events` (by trial) to the sweep's record, numbered after the last one applied,
    /// then applies them: [`SweepView::stage`] and [`SweepView::flush`] at once.
    pub async fn append(&mut self, sweeps: &SweepStore, events: Vec<(i32, Event)>) -> crate::Result<()> {
        self.stage(events);
        self.flush(sweeps).await.map(drop)
    }

    /// Applies `events` now and keeps them for the next [`SweepView::flush`], so that what one
    /// pass learns (observations, ends, stops, a suggestion) is one transaction. Only facts that
    /// can be read again (points from the stream, ends from the jobs) and a suggestion whose job
    /// adopts it may wait; a stop is flushed before its job is stopped.
    pub fn stage(&mut self, events: Vec<(i32, Event)>) {
        let first = self.last_seq + 1;
        let at_ms = kiln_core::ids::now_ms();
        self.staged.extend(events.iter().cloned());
        self.apply(events.into_iter().zip(first..).map(|((trial, event), seq)| Recorded {
            seq,
            trial,
            event,
            at_ms,
        }));
    }

    /// Records the staged events (an event already recorded, by a leader that died after it
    /// recorded it, is skipped by its dedupe key). Returns them.
    pub async fn flush(&mut self, sweeps: &SweepStore) -> crate::Result<Vec<(i32, Event)>> {
        if self.staged.is_empty() {
            return Ok(Vec::new());
        }
        let first = self.last_seq + 1 - self.staged.len() as i64;
        sweeps.append(&self.record.id, first, &self.staged).await?;
        Ok(std::mem::take(&mut self.staged))
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
            let config_changed = matches!(recorded.event, Event::Suggest { .. });
            match recorded.event {
                Event::Suggest { config, job_id } => {
                    trial.config = config;
                    trial.job_id = Some(job_id);
                }
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
            self.refresh_history(index as usize, config_changed);
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

    /// The trials as the algorithms see them (values oriented: lower is better), kept up to
    /// date as events are applied, so that a suggestion does not copy the whole sweep.
    pub fn history(&self) -> &[Trial] {
        &self.history
    }

    /// Brings trial `index`'s entry of [`SweepView::history`] up to date (its knobs are copied
    /// only when `config_changed`).
    fn refresh_history(&mut self, index: usize, config_changed: bool) {
        let objective = &self.checked.spec.objective;
        let trial = &self.trials[index];
        while self.history.len() <= index {
            let next = self.history.len() as u64;
            self.history.push(Trial {
                index: next,
                config: RunConfig::new(),
                state: TrialState::Running,
                value: None,
                curve: Vec::new(),
            });
        }
        let entry = &mut self.history[index];
        if config_changed {
            entry.config = trial.config.clone();
        }
        entry.curve = trial
            .observations
            .values()
            .map(|(resource, value)| (*resource, objective.oriented(*value)))
            .collect();
        entry.state = match &trial.end {
            _ if trial.stop.is_some() => TrialState::Stopped,
            None => TrialState::Running,
            Some(_) if trial.failed() => TrialState::Failed,
            Some(_) => TrialState::Done,
        };
        entry.value = match entry.state {
            TrialState::Done => trial.last_value().map(|value| objective.oriented(value)),
            _ => None,
        };
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::algo::Algorithm;

    const SPEC: &str = r#"
name: replay
objective: {metric: acc, goal: maximize}
algorithm: {name: random, seed: 3}
budget: {max-trials: 10, max-parallel: 2}
parameters:
  lr: {type: float, min: 0.001, max: 0.1, log: true}
trial: {command: [train]}
"#;

    fn view() -> SweepView {
        let checked = crate::spec::parse(SPEC).expect("the spec checks");
        let record = SweepRecord {
            id: "s1".into(),
            owner_id: "u1".into(),
            project: "default".into(),
            name: "replay".into(),
            spec_yaml: SPEC.into(),
            spec_json: serde_json::to_string(&checked.spec).unwrap(),
            code_digest: String::new(),
            state: crate::record::RUNNING.into(),
            reason: String::new(),
            submit_key: String::new(),
            registered: String::new(),
            created_at_ms: 0,
            finished_at_ms: None,
            paused_reason: String::new(),
        };
        SweepView::new(record).unwrap()
    }

    fn recorded(seq: i64, trial: i32, event: Event) -> Recorded {
        Recorded {
            seq,
            trial,
            event,
            at_ms: 1000 + seq,
        }
    }

    fn end(state: &str, value: Option<f64>) -> Event {
        Event::End {
            state: state.into(),
            value,
            preemptions: 0,
            gpu_hours: 0.5,
        }
    }

    /// A record of three trials: 0 ran to the end, 1 was stopped early at a better value, 2 runs.
    fn events() -> Vec<Recorded> {
        let view = view();
        let config = |index| {
            Algorithm::Random { seed: 3 }
                .suggest(&view.checked.space, &[], index)
                .unwrap()
        };
        let suggest = |index, job_id: &str| Event::Suggest {
            config: config(index),
            job_id: job_id.into(),
        };
        let observe = |step, value| Event::Observe {
            step,
            resource: step as f64,
            value,
        };
        vec![
            recorded(0, 0, suggest(0, "j0")),
            recorded(1, 1, suggest(1, "j1")),
            recorded(2, 0, observe(1, 0.5)),
            recorded(3, 1, observe(1, 0.9)),
            recorded(4, 0, observe(2, 0.7)),
            recorded(
                5,
                1,
                Event::Stop {
                    job_id: "j1".into(),
                    rung: 1.0,
                    reason: "stopped early at 1".into(),
                },
            ),
            recorded(6, 0, end("succeeded", Some(0.7))),
            recorded(7, 1, end("stopped", Some(0.9))),
            recorded(8, 2, suggest(2, "j2")),
            recorded(9, SWEEP_EVENT, Event::Registered { version: "m:1".into() }),
        ]
    }

    #[test]
    fn a_replayed_record_tells_the_trials_as_they_went() {
        let mut view = view();
        view.apply(events());
        assert_eq!(view.last_seq, 9);
        assert_eq!(view.trials.len(), 3);
        assert_eq!(view.registered.as_deref(), Some("m:1"));
        let [ran, stopped, running] = &view.trials[..] else {
            panic!("three trials")
        };
        assert_eq!(
            (ran.last_value(), ran.resource(), ran.state_name(None)),
            (Some(0.7), 2.0, "succeeded".to_string())
        );
        assert_eq!(stopped.state_name(None), "stopped");
        assert!(!stopped.failed(), "a trial stopped early does not count as failed");
        assert_eq!(running.state_name(Some("running")), "running");
        assert_eq!((view.live_trials(), view.failed_trials()), (1, 0));
        assert_eq!(view.gpu_hours(), 1.0);
        assert_eq!(view.trial_of_job("j1").map(|t| t.index), Some(1));
        // Maximised: the stopped trial's 0.9 is the best value, and the algorithms see it negated.
        assert_eq!(view.best().map(|t| t.index), Some(1));
        let history = view.history();
        assert_eq!(history.len(), 3);
        assert_eq!(history[0].value, Some(-0.7));
        assert_eq!(history[1].state, TrialState::Stopped);
        assert_eq!(history[2].state, TrialState::Running);
    }

    #[test]
    fn replaying_in_two_parts_or_again_changes_nothing() {
        let mut whole = view();
        whole.apply(events());
        let mut parts = view();
        let all = events();
        let (first, second) = all.split_at(5);
        parts.apply(first.to_vec());
        parts.apply(second.to_vec());
        assert_eq!(parts.trials, whole.trials);
        // A new leader that reads an event it already applied (an at-least-once read) stays put.
        parts.apply(events().into_iter().skip(6));
        assert_eq!(parts.trials, whole.trials);
        assert_eq!(parts.last_seq, whole.last_seq);
    }
}
