//! Authorisation: one decision for every RPC of every service.
//!
//! [`POLICY`] (in `authz/policy.rs`) gives each gRPC method a [`Rule`]: what a user's token
//! needs ([`Need`]) and what a job's token may do ([`JobAccess`]). [`crate::auth::AuthLayer`]
//! refuses a call whose method has no rule, and those it can decide without the object (admin
//! methods, methods closed to job tokens); it hands the handler a [`Caller`]. The handler finds
//! the object the call addresses and asks [`Caller::authorize`] with its [`Resource`] (project,
//! owner, job, batch); handlers never look at roles themselves.
//!
//! A caller with no role in the object's project is told the object does not exist (the same
//! NOT_FOUND an unknown id gets), so ids of other projects leak nothing; a caller who may see
//! the object but not do this to it gets PERMISSION_DENIED.

use std::collections::BTreeMap;

use tonic::Request;

use crate::auth::{Principal, Scope};
use crate::error::ErrorKind;

mod policy;
mod references;

pub use policy::POLICY;
pub use references::{Holder, ObjectRef};

/// The project of calls that name none; every instance has it.
pub const DEFAULT_PROJECT: &str = "default";

/// A role in a project; each includes the ones before it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Role {
    Viewer,
    Member,
    Maintainer,
}

impl Role {
    pub const ALL: [Role; 3] = [Role::Viewer, Role::Member, Role::Maintainer];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Viewer => "viewer",
            Role::Member => "member",
            Role::Maintainer => "maintainer",
        }
    }

    pub fn parse(text: &str) -> Option<Role> {
        Role::ALL.into_iter().find(|role| role.as_str() == text)
    }

    pub fn from_proto(role: i32) -> Option<Role> {
        match kiln_proto::v1::Role::try_from(role).ok()? {
            kiln_proto::v1::Role::Viewer => Some(Role::Viewer),
            kiln_proto::v1::Role::Member => Some(Role::Member),
            kiln_proto::v1::Role::Maintainer => Some(Role::Maintainer),
            kiln_proto::v1::Role::Unspecified => None,
        }
    }

    pub fn to_proto(self) -> kiln_proto::v1::Role {
        match self {
            Role::Viewer => kiln_proto::v1::Role::Viewer,
            Role::Member => kiln_proto::v1::Role::Member,
            Role::Maintainer => kiln_proto::v1::Role::Maintainer,
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a user's token needs to call a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Need {
    /// Any user (what it returns is the caller's own, or filtered to what it may see).
    Caller,
    /// The instance admin.
    Admin,
    /// This role in the project of the object.
    Role(Role),
    /// `owner` on objects the caller owns, `others` on the rest of the project's.
    OwnerOr { owner: Role, others: Role },
}

/// What a job's token may do with a method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobAccess {
    Deny,
    /// Call it, whatever it addresses (it answers about the job itself).
    Allow,
    /// Only on its own job.
    OwnJob,
    /// Only on the batch whose worker it is.
    OwnBatch,
}

/// The access rule of one gRPC method.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Rule {
    pub method: &'static str,
    pub need: Need,
    pub job: JobAccess,
}

/// Returns the rule of a method path (`/kiln.v1.JobService/SubmitJob`).
pub fn rule(method: &str) -> Option<&'static Rule> {
    POLICY.iter().find(|rule| rule.method == method)
}

/// What a call addresses, as its handler found it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Resource<'a> {
    /// What to call it in a NOT_FOUND message (`job`, `batch`, `project`...).
    pub kind: &'static str,
    pub id: &'a str,
    /// Its project; empty for instance-wide objects (global and user quotas), which only the
    /// admin reaches through a role rule (others are refused, not told it does not exist).
    pub project: &'a str,
    /// The user id of its owner; empty when none.
    pub owner_id: &'a str,
    /// The job it is or belongs to; empty when none.
    pub job_id: &'a str,
    /// The batch it is or belongs to; empty when none.
    pub batch_id: &'a str,
}

impl<'a> Resource<'a> {
    /// A project addressed by name (submits, creates and lists in it).
    pub fn project(name: &'a str) -> Resource<'a> {
        Resource {
            kind: "project",
            id: name,
            project: name,
            owner_id: "",
            job_id: "",
            batch_id: "",
        }
    }

    /// An object of a project with an owner.
    pub fn owned(kind: &'static str, id: &'a str, project: &'a str, owner_id: &'a str) -> Resource<'a> {
        Resource {
            kind,
            id,
            project,
            owner_id,
            job_id: "",
            batch_id: "",
        }
    }

    /// A job (or a run).
    pub fn job(job: &'a crate::store::JobRecord) -> Resource<'a> {
        Resource {
            kind: "job",
            id: &job.id,
            project: &job.project,
            owner_id: &job.owner_id,
            job_id: &job.id,
            batch_id: &job.batch_id,
        }
    }

    /// A batch (its items, their lines).
    pub fn batch(id: &'a str, project: &'a str, owner_id: &'a str) -> Resource<'a> {
        Resource {
            kind: "batch",
            id,
            project,
            owner_id,
            job_id: "",
            batch_id: id,
        }
    }

    /// Something of the whole instance (a global quota, another user's records): only the admin.
    pub fn instance(kind: &'static str, id: &'a str) -> Resource<'a> {
        Resource::owned(kind, id, "", "")
    }
}

/// Why a call was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Denied {
    /// The caller may not know the object exists: worded as for an unknown id.
    #[error("{kind} {id} not found")]
    NotFound { kind: &'static str, id: String },
    #[error("{0}")]
    PermissionDenied(String),
    #[error("{0}")]
    Unauthenticated(String),
    /// The call names its object badly (an id or a project name that cannot be one).
    #[error("{0}")]
    Invalid(String),
    /// The caller may act in the project, but it does not exist (only the admin learns this).
    #[error("project {name} not found; an admin creates it with `kiln project create {name}`")]
    NoProject { name: String },
}

impl Denied {
    pub fn kind(&self) -> ErrorKind {
        match self {
            Denied::NotFound { .. } | Denied::NoProject { .. } => ErrorKind::NotFound,
            Denied::Invalid(_) => ErrorKind::InvalidArgument,
            Denied::PermissionDenied(_) => ErrorKind::PermissionDenied,
            Denied::Unauthenticated(_) => ErrorKind::Unauthenticated,
        }
    }
}

/// Which projects a listing may show.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Visible {
    All,
    Only(Vec<String>),
}

impl Visible {
    pub fn contains(&self, project: &str) -> bool {
        match self {
            Visible::All => true,
            Visible::Only(projects) => projects.iter().any(|p| p == project),
        }
    }
}

/// The caller of one call and the rule of its method; [`crate::auth::AuthLayer`] puts it in the
/// request's extensions.
#[derive(Debug, Clone)]
pub struct Caller {
    pub principal: Principal,
    pub rule: &'static Rule,
}

impl Caller {
    /// Returns the caller the auth layer established for this request.
    pub fn of<T>(request: &Request<T>) -> Result<Caller, Denied> {
        request
            .extensions()
            .get::<Caller>()
            .cloned()
            .ok_or_else(|| Denied::Unauthenticated("missing credentials".into()))
    }

    /// Decides the call on what it addresses.
    pub fn authorize(&self, resource: &Resource<'_>) -> Result<(), Denied> {
        decide(&self.principal, self.rule.need, self.rule.job, resource)
    }

    /// Decides a second object of the same call with a need of its own (a token narrowed to a
    /// project needs a role there).
    pub fn authorize_with(&self, need: Need, resource: &Resource<'_>) -> Result<(), Denied> {
        decide(&self.principal, need, JobAccess::Deny, resource)
    }

    /// Tells whether the call may see this object (for filtering listings).
    pub fn may(&self, resource: &Resource<'_>) -> bool {
        self.authorize(resource).is_ok()
    }

    /// The projects in which the caller has the role the method needs (for listings).
    pub fn visible_projects(&self) -> Visible {
        let principal = &self.principal;
        if principal.is_admin {
            return Visible::All;
        }
        if let Scope::Job(_) = principal.scope {
            return Visible::Only(Vec::new());
        }
        let least = match self.rule.need {
            Need::Role(role) => role,
            Need::OwnerOr { owner, others } => owner.min(others),
            Need::Caller => Role::Viewer,
            Need::Admin => return Visible::Only(Vec::new()),
        };
        Visible::Only(
            principal
                .roles
                .iter()
                .filter(|(_, role)| **role >= least)
                .map(|(project, _)| project.clone())
                .collect(),
        )
    }

    /// Checks a project a call names (empty: [`DEFAULT_PROJECT`]): the caller needs the
    /// method's role in it, and it must exist. Returns its name.
    pub async fn named_project(&self, store: &crate::store::Store, name: &str) -> Result<String, crate::Error> {
        let name = if name.is_empty() { DEFAULT_PROJECT } else { name };
        crate::subjects::validate_token("project", name).map_err(Denied::Invalid)?;
        self.authorize(&Resource::project(name))?;
        if store.project(name).await?.is_none() {
            return Err(Denied::NoProject { name: name.to_string() }.into());
        }
        Ok(name.to_string())
    }

    /// Reads a job the call may act on; a job of a project the caller is not in reads as not
    /// found, worded as for an unknown id.
    pub async fn job(
        &self,
        store: &crate::store::Store,
        job_id: &str,
    ) -> Result<crate::store::JobRecord, crate::Error> {
        let job_id = crate::ids::parse_id("job", job_id).map_err(Denied::Invalid)?;
        let job = store.job(&job_id).await?;
        self.authorize(&Resource::job(&job))?;
        Ok(job)
    }

    /// Reads the scope of a batch the call names (for a service other than item-batch); a
    /// batch of a project the caller is not in reads as not found, as an unknown id does.
    pub async fn batch(
        &self,
        store: &crate::store::Store,
        batch_id: &str,
    ) -> Result<crate::store::BatchScope, crate::Error> {
        let batch_id = crate::ids::parse_id("batch", batch_id).map_err(Denied::Invalid)?;
        let not_found = || Denied::NotFound {
            kind: "batch",
            id: batch_id.clone(),
        };
        let batch = store.batch_scope(&batch_id).await?.ok_or_else(not_found)?;
        self.authorize(&Resource::batch(&batch.id, &batch.project, &batch.owner_id))?;
        Ok(batch)
    }

    /// The projects a listing shows: the one it names (checked as [`Caller::named_project`]),
    /// or every project the caller may read.
    pub async fn listed_projects(&self, store: &crate::store::Store, name: &str) -> Result<Visible, crate::Error> {
        if name.is_empty() {
            return Ok(self.visible_projects());
        }
        Ok(Visible::Only(vec![self.named_project(store, name).await?]))
    }

    pub fn user_id(&self) -> &str {
        &self.principal.user_id
    }

    pub fn is_admin(&self) -> bool {
        self.principal.is_admin
    }
}

/// Decides the part of a rule that needs no object: run by the auth layer before the handler.
pub fn precheck(principal: &Principal, rule: &Rule) -> Result<(), Denied> {
    match (&principal.scope, rule.job) {
        (Scope::Job(_), JobAccess::Deny) => Err(Denied::PermissionDenied(format!(
            "a job's token may not call {}; use a user's token",
            rule.method
        ))),
        (Scope::Job(_), _) => Ok(()),
        (Scope::User, _) if rule.need == Need::Admin && !principal.is_admin => Err(Denied::PermissionDenied(format!(
            "{} needs the instance admin",
            rule.method
        ))),
        (Scope::User, _) => Ok(()),
        (Scope::Login, _) => Err(Denied::Unauthenticated(
            "a retired login code is not a bearer token; sign in with `kiln ui`".into(),
        )),
    }
}

/// The decision: may `principal` do a call needing `need` (and `job` for job tokens) to
/// `resource`?
pub fn decide(principal: &Principal, need: Need, job: JobAccess, resource: &Resource<'_>) -> Result<(), Denied> {
    let hidden = || Denied::NotFound {
        kind: resource.kind,
        id: resource.id.to_string(),
    };
    if let Scope::Job(own_job) = &principal.scope {
        let allowed = match job {
            JobAccess::Deny => false,
            JobAccess::Allow => true,
            JobAccess::OwnJob => !resource.job_id.is_empty() && resource.job_id == own_job,
            JobAccess::OwnBatch => principal
                .job_batch_id
                .as_deref()
                .is_some_and(|batch| !resource.batch_id.is_empty() && resource.batch_id == batch),
        };
        return if allowed { Ok(()) } else { Err(hidden()) };
    }
    if principal.is_admin {
        return Ok(());
    }
    let needed = match need {
        Need::Caller => return Ok(()),
        Need::Admin => return Err(Denied::PermissionDenied("this needs the instance admin".into())),
        Need::Role(role) => role,
        Need::OwnerOr { owner, others } => {
            if !resource.owner_id.is_empty() && resource.owner_id == principal.user_id {
                owner
            } else {
                others
            }
        }
    };
    if resource.project.is_empty() {
        // Instance-wide things (global and user quotas) are no secret, only the admin's.
        return Err(Denied::PermissionDenied(format!(
            "{} {} is the instance admin's to change",
            resource.kind, resource.id
        )));
    }
    let Some(have) = principal.roles.get(resource.project).copied() else {
        return Err(hidden());
    };
    if have >= needed {
        return Ok(());
    }
    let whose = if resource.owner_id.is_empty() || resource.owner_id == principal.user_id {
        String::new()
    } else {
        " another user's".to_string()
    };
    Err(Denied::PermissionDenied(format!(
        "this needs the {needed} role in project {} to act on{whose} {} {}; you are {have} there",
        resource.project, resource.kind, resource.id
    )))
}

/// Project roles of a principal, as the store reads them.
pub type Roles = BTreeMap<String, Role>;

#[cfg(test)]
mod tests;
