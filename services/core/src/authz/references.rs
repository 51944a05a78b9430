//! Objects a request names besides the one it acts on: a job's datasets and code, a dataset's
//! archive, a run's saved blobs, a service's models. Each needs a role in *its* project; one the
//! caller may not read is answered exactly as an unknown one (`None`), so a name or digest of
//! another project leaks nothing.
//!
//! Names of datasets, models and services are unique per project. A request names one as
//! [`ObjectRef`]: `NAME` (in the request's project) or `PROJECT/NAME`; a request that names no
//! project finds a bare name in the one project the caller may read that has it
//! ([`Caller::sole_holder`]).

use super::{Caller, Role};
use crate::auth::Principal;
use crate::store::entities::{artifact, dataset};
use crate::store::{DatasetRef, Store};

/// How a request names an object of a project: `NAME`, or `PROJECT/NAME`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectRef {
    /// The project it writes; `None` for a bare name.
    pub project: Option<String>,
    pub name: String,
}

impl ObjectRef {
    /// Splits a reference; `None` when a part is empty or it has more than one `/` (it then
    /// names nothing, and reads as unknown).
    pub fn parse(reference: &str) -> Option<ObjectRef> {
        match reference.split_once('/') {
            Some((project, name)) if !project.is_empty() && !name.is_empty() && !name.contains('/') => {
                Some(ObjectRef {
                    project: Some(project.to_string()),
                    name: name.to_string(),
                })
            }
            Some(_) => None,
            None if reference.is_empty() => None,
            None => Some(ObjectRef {
                project: None,
                name: reference.to_string(),
            }),
        }
    }

    /// The project it addresses from a request whose `project` field is `home`: the one it
    /// writes, else `home`; `None` when neither says (see [`Caller::sole_holder`]).
    pub fn project_in<'a>(&'a self, home: &'a str) -> Option<&'a str> {
        self.project.as_deref().or((!home.is_empty()).then_some(home))
    }
}

/// Which project a bare name with no project given means, among those holding the name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Holder {
    /// No project the caller may read has it (it reads as unknown).
    None,
    One(String),
    /// Several projects the caller may read have it: the request must say which.
    Several(Vec<String>),
}

impl Principal {
    /// Tells whether the principal may read what `project` holds (the viewer role, or the
    /// admin). A job's token reads nothing this way.
    pub fn may_read(&self, project: &str) -> bool {
        matches!(self.scope, crate::auth::Scope::User)
            && (self.is_admin || self.roles.get(project).is_some_and(|role| *role >= Role::Viewer))
    }

    /// The one project among `holders` the principal may read; the others are never told.
    pub fn sole_holder(&self, holders: impl IntoIterator<Item = String>) -> Holder {
        let mut readable: Vec<String> = holders.into_iter().filter(|project| self.may_read(project)).collect();
        readable.sort();
        readable.dedup();
        match readable.len() {
            0 => Holder::None,
            1 => Holder::One(readable.remove(0)),
            _ => Holder::Several(readable),
        }
    }
}

impl Caller {
    /// Tells whether the caller may read what `project` holds (the viewer role, or the admin).
    pub fn may_read(&self, project: &str) -> bool {
        self.principal.may_read(project)
    }

    /// See [`Principal::sole_holder`].
    pub fn sole_holder(&self, holders: impl IntoIterator<Item = String>) -> Holder {
        self.principal.sole_holder(holders)
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
