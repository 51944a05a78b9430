//! The job state machine.
//!
//! ```text
//! QUEUED → SCHEDULED → PROVISIONING → RUNNING → SYNCING → SUCCEEDED | FAILED | STOPPED | LOST
//!                                          ↘ PREEMPTED → QUEUED
//! ```
//! Every change is a compare-and-set on the record's version (see `store::Store::transition`).

use std::fmt;
use std::str::FromStr;

use kiln_proto::v1 as pb;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum JobState {
    Queued,
    Scheduled,
    Provisioning,
    Running,
    Syncing,
    Succeeded,
    Failed,
    Stopped,
    Preempted,
    Lost,
}

impl JobState {
    pub const ALL: [JobState; 10] = [
        JobState::Queued,
        JobState::Scheduled,
        JobState::Provisioning,
        JobState::Running,
        JobState::Syncing,
        JobState::Succeeded,
        JobState::Failed,
        JobState::Stopped,
        JobState::Preempted,
        JobState::Lost,
    ];

    /// States a job holds capacity of a pool in.
    pub const ACTIVE: [JobState; 4] = [
        JobState::Scheduled,
        JobState::Provisioning,
        JobState::Running,
        JobState::Syncing,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "QUEUED",
            JobState::Scheduled => "SCHEDULED",
            JobState::Provisioning => "PROVISIONING",
            JobState::Running => "RUNNING",
            JobState::Syncing => "SYNCING",
            JobState::Succeeded => "SUCCEEDED",
            JobState::Failed => "FAILED",
            JobState::Stopped => "STOPPED",
            JobState::Preempted => "PREEMPTED",
            JobState::Lost => "LOST",
        }
    }

    /// Tells whether the job's attempt is over: nothing will change it again, but a re-queue
    /// (or a stop) of a preempted job.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            JobState::Succeeded | JobState::Failed | JobState::Stopped | JobState::Lost | JobState::Preempted
        )
    }

    /// Tells whether the state machine allows going from `self` to `next`.
    pub fn can_move_to(self, next: JobState) -> bool {
        use JobState::*;
        match self {
            Queued => matches!(next, Scheduled | Stopped),
            Scheduled => matches!(next, Provisioning | Stopped | Queued | Lost),
            Provisioning => matches!(next, Running | Failed | Stopped | Lost | Queued),
            Running => matches!(next, Syncing | Succeeded | Failed | Stopped | Preempted | Lost | Queued),
            Syncing => matches!(next, Succeeded | Failed | Stopped | Lost | Preempted | Queued),
            Preempted => matches!(next, Queued | Stopped),
            Succeeded | Failed | Stopped | Lost => false,
        }
    }

    pub fn to_proto(self) -> pb::JobState {
        match self {
            JobState::Queued => pb::JobState::Queued,
            JobState::Scheduled => pb::JobState::Scheduled,
            JobState::Provisioning => pb::JobState::Provisioning,
            JobState::Running => pb::JobState::Running,
            JobState::Syncing => pb::JobState::Syncing,
            JobState::Succeeded => pb::JobState::Succeeded,
            JobState::Failed => pb::JobState::Failed,
            JobState::Stopped => pb::JobState::Stopped,
            JobState::Preempted => pb::JobState::Preempted,
            JobState::Lost => pb::JobState::Lost,
        }
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for JobState {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        JobState::ALL
            .into_iter()
            .find(|state| state.as_str() == text)
            .ok_or_else(|| format!("unknown job state {text:?}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for state in JobState::ALL {
            assert_eq!(state.as_str().parse::<JobState>().unwrap(), state);
        }
    }

    #[test]
    fn terminal_states_only_lead_back_to_the_queue() {
        for state in JobState::ALL.into_iter().filter(|s| s.is_terminal()) {
            for next in JobState::ALL {
                let allowed = state.can_move_to(next);
                let expected = state == JobState::Preempted && matches!(next, JobState::Queued | JobState::Stopped);
                assert_eq!(allowed, expected, "{state} → {next}");
            }
        }
        assert!(JobState::Queued.can_move_to(JobState::Scheduled));
        assert!(!JobState::Queued.can_move_to(JobState::Running));
    }
}
