//! Objects a request names besides the one it acts on: a job's datasets and code, a dataset's
//! archive, a run's saved blobs. Each needs a role in *its* project; one the caller may not read
//! is answered exactly as an unknown one (`None`), so a name or digest of another project leaks
//! nothing.

use super::{Caller, Role};
use crate::store::entities::{artifact, dataset};
use crate::store::{DatasetRef, Store};

impl Caller {
    /// Tells whether the caller may read what `project` holds (the viewer role, or the admin).
    pub fn may_read(&self, project: &str) -> bool {
        self.principal.is_admin
            || self
                .principal
                .roles
                .get(project)
                .is_some_and(|role| *role >= Role::Viewer)
    }

    /// The dataset a request made in `home` names by `reference` (`NAME` in `home`, or
    /// `PROJECT/NAME`), when the caller may read it; `None` when it does not exist or may not be
    /// read (the same answer).
    pub async fn readable_dataset(
        &self,
        store: &Store,
        home: &str,
        reference: &str,
    ) -> Result<Option<dataset::Model>, crate::Error> {
        let Some(named) = DatasetRef::parse(reference, home) else {
            return Ok(None);
        };
        if named.project != home && !self.may_read(&named.project) {
            return Ok(None);
        }
        Ok(store.dataset(&named.project, &named.name).await?)
    }

    /// The blob `digest` for use in `project` (as a job's code, a dataset's archive, a run's
    /// saved file), when `project` has it or the caller may read a project that has it; then
    /// `project` has it from now on. `None` when it is unknown or out of the caller's reach.
    pub async fn usable_blob(
        &self,
        store: &Store,
        digest: &str,
        project: &str,
    ) -> Result<Option<artifact::Model>, crate::Error> {
        let Some(blob) = store.artifact(digest).await? else {
            return Ok(None);
        };
        let holders = store.artifact_projects(digest).await?;
        if holders.iter().any(|holder| holder == project) {
            return Ok(Some(blob));
        }
        if !holders.iter().any(|holder| self.may_read(holder)) {
            return Ok(None);
        }
        store.grant_artifact(digest, project).await?;
        Ok(Some(blob))
    }
}
