//! `QuotaService`: quotas by scope (global, a project, a user): a project's maintainers set its
//! own, the admin the rest; everyone reads those that apply to them. The queued-jobs limit is
//! checked here, at submit; the others (CPU, memory, GPUs, running jobs) by the scheduler, which
//! makes a job over them wait.

use kiln_core::authz::{Caller, Need, Resource, Role};
use kiln_core::quotas;
use kiln_core::scheduling::QuotaScope;
use kiln_core::store::{JobRecord, NewJob, QuotaRecord, Store};
use kiln_proto::v1 as pb;
use kiln_proto::v1::quota_service_server::QuotaService;
use tonic::{Request, Response, Status};

use crate::access;
use crate::error::{Error, Result};

/// The range of a fair-share weight: wide enough for any sensible ratio, narrow enough that
/// shares divided by it stay well inside an f64's precision.
const MIN_WEIGHT: f64 = 0.001;
const MAX_WEIGHT: f64 = 1000.0;

/// Checks a quota's limits and weight for its scope: limits are 0 or more, a weight is finite,
/// in range and not given to the global scope.
fn check_quota(quota: &pb::Quota, scope: &QuotaScope) -> Result<()> {
    let limits = [
        ("cpu_millis", quota.cpu_millis),
        ("memory_bytes", quota.memory_bytes),
        ("gpus", quota.gpus),
        ("running_jobs", quota.running_jobs),
        ("queued_jobs", quota.queued_jobs),
    ];
    if let Some((name, value)) = limits.iter().find(|(_, v)| v.is_some_and(|v| v < 0)) {
        return Err(Error::InvalidArgument(format!(
            "{name} is {}; a limit is 0 or more (leave it out for no limit)",
            value.unwrap_or_default()
        )));
    }
    if let Some(weight) = quota.weight {
        if *scope == QuotaScope::Global {
            return Err(Error::InvalidArgument(
                "the global scope has no fair-share weight: give one to a project or a user".into(),
            ));
        }
        if !(weight.is_finite() && (MIN_WEIGHT..=MAX_WEIGHT).contains(&weight)) {
            return Err(Error::InvalidArgument(format!(
                "weight {weight} is out of range: a weight is {MIN_WEIGHT} to {MAX_WEIGHT} (leave it out for 1)"
            )));
        }
    }
    Ok(())
}

/// QuotasApi serves `QuotaService`.
#[derive(Clone)]
pub struct QuotasApi {
    pub(crate) store: Store,
}

fn to_proto(record: QuotaRecord) -> pb::Quota {
    pb::Quota {
        scope: record.scope,
        cpu_millis: record.cpu_millis,
        memory_bytes: record.memory_bytes,
        gpus: record.gpus,
        running_jobs: record.running_jobs,
        queued_jobs: record.queued_jobs,
        weight: record.weight,
    }
}

/// What a quota's scope is to the authorisation rule: a project's quota belongs to the project
/// (set by its maintainers), a user's and the global one to the instance (set by the admin).
fn resource<'a>(scope: &'a QuotaScope, text: &'a str) -> Resource<'a> {
    match scope {
        QuotaScope::Project(project) => Resource::owned("quota", text, project, ""),
        QuotaScope::User(_) | QuotaScope::Global => Resource::instance("quota", text),
    }
}

/// Whether the caller may read a quota: the global one and their own always, a project's as
/// its viewer, anyone's as the admin.
fn readable(caller: &Caller, scope: &QuotaScope, text: &str) -> bool {
    match scope {
        QuotaScope::Global => true,
        QuotaScope::User(name) if *name == caller.principal.user_name => true,
        _ => caller
            .authorize_with(Need::Role(Role::Viewer), &resource(scope, text))
            .is_ok(),
    }
}

fn parse_scope(text: &str) -> Result<QuotaScope> {
    QuotaScope::parse(text).map_err(Error::InvalidArgument)
}

/// Submits `new`, refused when it would take the user, their project or everyone over a
/// queued-jobs quota (the message names the quota). Counted and inserted as one step for all
/// api replicas ([`Store::insert_job_admitted`]), so concurrent submits cannot pass it together.
pub(crate) async fn submit_within_quota(
    store: &Store,
    principal: &kiln_core::auth::Principal,
    new: NewJob,
) -> Result<JobRecord> {
    let quotas = quotas::read(store).await?;
    if quotas.iter().all(|quota| quota.queued_jobs.is_none()) {
        return Ok(store.insert_job(new).await?);
    }
    let project = new.project.clone();
    store
        .insert_job_admitted(new, |counts| {
            quotas::check_submit(&quotas, &counts, &principal.user_name, &project)
        })
        .await?
        .map_err(|exceeded| {
            Error::QuotaExceeded(format!(
                "{exceeded}: wait for some to start, or ask an admin to raise it (`kiln quota set {} --queued-jobs N`)",
                exceeded.scope
            ))
        })
}

#[tonic::async_trait]
impl QuotaService for QuotasApi {
    #[tracing::instrument(skip_all, fields(scope = %request.get_ref().scope))]
    async fn set_quota(&self, request: Request<pb::Quota>) -> Result<Response<pb::Quota>, Status> {
        let caller = access::caller(&request)?;
        let quota = request.into_inner();
        let scope = parse_scope(&quota.scope)?;
        caller.authorize(&resource(&scope, &quota.scope)).map_err(Error::from)?;
        if let QuotaScope::Project(project) = &scope {
            access::project(&self.store, &caller, project).await?;
        }
        if let QuotaScope::User(name) = &scope
            && !self
                .store
                .user_names()
                .await
                .map_err(Error::from)?
                .values()
                .any(|n| n == name)
        {
            return Err(Error::NotFound(format!("user {name} does not exist")).into());
        }
        check_quota(&quota, &scope)?;
        let record = QuotaRecord {
            scope: scope.to_string(),
            cpu_millis: quota.cpu_millis,
            memory_bytes: quota.memory_bytes,
            gpus: quota.gpus,
            running_jobs: quota.running_jobs,
            queued_jobs: quota.queued_jobs,
            updated_at_ms: 0,
            weight: quota.weight,
        };
        let saved = self.store.set_quota(record).await.map_err(Error::from)?;
        tracing::info!(scope = %saved.scope, by = %caller.principal.user_name, "quota set");
        Ok(Response::new(to_proto(saved)))
    }

    #[tracing::instrument(skip_all, fields(scope = %request.get_ref().scope))]
    async fn get_quota(&self, request: Request<pb::QuotaRef>) -> Result<Response<pb::Quota>, Status> {
        let caller = access::caller(&request)?;
        let scope = parse_scope(&request.get_ref().scope)?;
        let missing = || Error::NotFound(format!("{scope} has no quota"));
        if !readable(&caller, &scope, &request.get_ref().scope) {
            return Err(missing().into());
        }
        let record = self.store.quota(&scope.to_string()).await.map_err(Error::from)?;
        Ok(Response::new(to_proto(record.ok_or_else(missing)?)))
    }

    #[tracing::instrument(skip_all)]
    async fn list_quotas(
        &self,
        request: Request<pb::ListQuotasRequest>,
    ) -> Result<Response<pb::ListQuotasResponse>, Status> {
        let caller = access::caller(&request)?;
        let quotas = self
            .store
            .quotas()
            .await
            .map_err(Error::from)?
            .into_iter()
            .filter(|q| QuotaScope::parse(&q.scope).is_ok_and(|scope| readable(&caller, &scope, &q.scope)))
            .map(to_proto)
            .collect();
        Ok(Response::new(pb::ListQuotasResponse { quotas }))
    }

    #[tracing::instrument(skip_all, fields(scope = %request.get_ref().scope))]
    async fn delete_quota(&self, request: Request<pb::QuotaRef>) -> Result<Response<pb::Quota>, Status> {
        let caller = access::caller(&request)?;
        let scope = parse_scope(&request.get_ref().scope)?;
        caller
            .authorize(&resource(&scope, &request.get_ref().scope))
            .map_err(Error::from)?;
        let removed = self.store.delete_quota(&scope.to_string()).await.map_err(Error::from)?;
        let removed = removed.ok_or_else(|| Error::NotFound(format!("{scope} has no quota")))?;
        tracing::info!(%scope, by = %caller.principal.user_name, "quota deleted");
        Ok(Response::new(to_proto(removed)))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn limit() -> impl Strategy<Value = Option<i64>> {
        prop::option::of(prop_oneof![
            Just(i64::MIN),
            Just(-1),
            Just(0),
            any::<i64>(),
            0..i64::MAX
        ])
    }

    fn quota() -> impl Strategy<Value = pb::Quota> {
        (
            (limit(), limit(), limit(), limit(), limit()),
            prop::option::of(prop_oneof![
                Just(f64::NAN),
                Just(f64::INFINITY),
                Just(0.0),
                Just(MIN_WEIGHT),
                Just(MAX_WEIGHT),
                any::<f64>(),
                MIN_WEIGHT..MAX_WEIGHT
            ]),
        )
            .prop_map(
                |((cpu_millis, memory_bytes, gpus, running_jobs, queued_jobs), weight)| pb::Quota {
                    scope: String::new(),
                    cpu_millis,
                    memory_bytes,
                    gpus,
                    running_jobs,
                    queued_jobs,
                    weight,
                },
            )
    }

    fn scope() -> impl Strategy<Value = QuotaScope> {
        prop_oneof![
            Just(QuotaScope::Global),
            "[a-z]{1,8}".prop_map(QuotaScope::Project),
            "[a-z]{1,8}".prop_map(QuotaScope::User),
        ]
    }

    proptest! {
        /// Any quota is accepted exactly when its limits are 0 or more and its weight (if any)
        /// is in range and not global; a refusal names the field.
        #[test]
        fn a_quota_is_accepted_when_its_fields_are_and_a_refusal_names_the_field(quota in quota(), scope in scope()) {
            let limits = [
                ("cpu_millis", quota.cpu_millis),
                ("memory_bytes", quota.memory_bytes),
                ("gpus", quota.gpus),
                ("running_jobs", quota.running_jobs),
                ("queued_jobs", quota.queued_jobs),
            ];
            let bad_limit = limits.iter().find(|(_, v)| v.is_some_and(|v| v < 0)).map(|(name, _)| *name);
            let bad_weight = quota.weight.is_some_and(|w| {
                scope == QuotaScope::Global || !(w.is_finite() && (MIN_WEIGHT..=MAX_WEIGHT).contains(&w))
            });
            match check_quota(&quota, &scope) {
                Ok(()) => prop_assert!(bad_limit.is_none() && !bad_weight),
                Err(error) => {
                    prop_assert_eq!(error.kind(), kiln_core::ErrorKind::InvalidArgument);
                    let message = error.to_string();
                    match bad_limit {
                        Some(name) => prop_assert!(message.contains(name), "{}", message),
                        None => prop_assert!(bad_weight && message.contains("weight"), "{}", message),
                    }
                }
            }
        }

        /// Any scope text is parsed or refused with the forms named.
        #[test]
        fn any_scope_text_is_parsed_or_refused(text in ".{0,20}|(global|project|user)(:.{0,8})?") {
            match parse_scope(&text) {
                Ok(scope) => prop_assert!(text == "global" || scope.to_string() == text),
                Err(error) => prop_assert!(error.to_string().contains("global, project:<name>, user:<name>")),
            }
        }
    }
}
