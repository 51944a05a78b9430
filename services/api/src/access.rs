//! The api's side of authorisation: it finds what a call addresses and asks the caller's rule
//! ([`kiln_core::authz`]) about it; no handler decides on roles itself.

use kiln_core::authz::Caller;
use kiln_core::store::{JobRecord, Store, StoreError};
use tonic::Request;

use crate::error::{Error, Result};

/// The caller the auth layer established for this request.
pub(crate) fn caller<T>(request: &Request<T>) -> Result<Caller> {
    Ok(Caller::of(request)?)
}

/// Reads a job the call may act on; see [`Caller::job`].
pub(crate) async fn job(store: &Store, caller: &Caller, job_id: &str) -> Result<JobRecord> {
    match caller.job(store, job_id).await {
        Err(kiln_core::Error::Store(StoreError::JobNotFound { job_id })) => Err(Error::JobNotFound { job_id }),
        found => Ok(found?),
    }
}

/// Checks a project named by a call (empty: `default`); see [`Caller::named_project`].
pub(crate) async fn project(store: &Store, caller: &Caller, name: &str) -> Result<String> {
    Ok(caller.named_project(store, name).await?)
}
