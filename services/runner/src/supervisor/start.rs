//! How an attempt's start is recorded: RUNNING written patiently while the database is away
//! for a moment, or the reason it did not start, with the exit code a shell would give.

use std::time::Duration;

use kiln_core::JobState;
use kiln_core::store::{Change, JobRecord, Store, StoreResult};

use super::Outcome;
use crate::error::Error;

/// How long a transition is tried again while the database cannot be reached.
const STORE_PATIENCE: Duration = Duration::from_secs(30);

/// Moves `job` to `state`, trying again while the database cannot be reached (a restart or a
/// fail-over) for up to [`STORE_PATIENCE`]: a job that started must not fail because its record
/// could not be written for a moment.
pub(super) async fn transition_patiently(
    store: &Store,
    job: &JobRecord,
    state: JobState,
    change: Change,
) -> StoreResult<JobRecord> {
    let deadline = tokio::time::Instant::now() + STORE_PATIENCE;
    let mut attempt = 0;
    loop {
        match store.transition(job, state, change.clone()).await {
            Err(error)
                if error.kind() == kiln_core::ErrorKind::Unavailable && tokio::time::Instant::now() < deadline =>
            {
                tracing::warn!(job_id = %job.id, error = %error, "cannot record the job's state; trying again");
                tokio::time::sleep(kiln_core::publish::backoff(attempt)).await;
                attempt += 1;
            }
            outcome => return outcome,
        }
    }
}

pub(super) fn not_started(error: Error) -> Outcome {
    let exit_code = match &error {
        Error::Spawn { source, .. } if source.kind() == std::io::ErrorKind::NotFound => Some(127),
        Error::Spawn { source, .. } if source.kind() == std::io::ErrorKind::PermissionDenied => Some(126),
        _ => None,
    };
    Outcome::NotStarted {
        reason: error.to_string(),
        exit_code,
        stopped: false,
    }
}
