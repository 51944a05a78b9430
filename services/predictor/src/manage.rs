//! `ServeService`: inference services made, read, rolled to new revisions, scaled and stopped.
//!
//! A create or update checks the definition (every problem named), resolves each model to a
//! registry version the caller may read (`NAME` of the service's project, `PROJECT/NAME` of
//! another), and records the revision. Service names are unique per project: a call names a
//! service as `NAME` in its `project`, or `PROJECT/NAME`, or with neither a bare name in the one
//! project the caller may read that has it. A new service's first
//! revision is published to `kiln_services` at once; a later one is published by the
//! [`crate::controller`] once each of its members has a worker ready, so a roll fails no
//! request.

use std::sync::Arc;

use kiln_core::authz::{Caller, Holder, Need, ObjectRef, Resource, Role};
use kiln_core::scheduling::MarketPolicy;
use kiln_core::serving::{ENV_MEMBER, ENV_REVISION, Ensemble, TensorSpec};
use kiln_core::store::{JobRecord, ModelKey};
use kiln_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::feed::{Listed, ServiceChangesStream};
use crate::record::{RUNNING, ServiceRecord};
use crate::revision::{DEFAULT_DEADLINE_MS, ModelRef, Revision, RevisionMember, WorkerSpec, default_member_name};
use crate::{Error, Result, Shared};

mod scaling;

use scaling::{check_scaling, rollout_of, scaling_to_proto};

/// The most workers a member may ask for.
pub const MAX_REPLICAS: u32 = 64;

pub struct ServeApi {
    pub shared: Arc<Shared>,
}

fn caller<T>(request: &Request<T>) -> Result<Caller> {
    Ok(Caller::of(request).map_err(kiln_core::Error::from)?)
}

#[tonic::async_trait]
impl pb::serve_service_server::ServeService for ServeApi {
    async fn create_service(
        &self,
        request: Request<pb::CreateServiceRequest>,
    ) -> Result<Response<pb::Service>, Status> {
        let caller = caller(&request)?;
        Ok(Response::new(self.create(&caller, request.into_inner()).await?))
    }

    async fn get_service(&self, request: Request<pb::GetServiceRequest>) -> Result<Response<pb::Service>, Status> {
        let caller = caller(&request)?;
        let asked = request.get_ref();
        let record = self.visible(&caller, &asked.project, &asked.name).await?;
        Ok(Response::new(self.describe(&record).await?))
    }

    async fn list_services(
        &self,
        request: Request<pb::ListServicesRequest>,
    ) -> Result<Response<pb::ListServicesResponse>, Status> {
        let caller = caller(&request)?;
        let listed = Listed::of(self, &caller, request.get_ref()).await?;
        Ok(Response::new(pb::ListServicesResponse {
            services: listed.services().await?,
        }))
    }

    type WatchServicesStream = ServiceChangesStream;

    async fn watch_services(
        &self,
        request: Request<pb::WatchServicesRequest>,
    ) -> std::result::Result<Response<ServiceChangesStream>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let listed = Listed::of(self, &caller, &request.list.unwrap_or_default()).await?;
        Ok(Response::new(listed.watch(request.after_seq).await?))
    }

    async fn update_service(
        &self,
        request: Request<pb::UpdateServiceRequest>,
    ) -> Result<Response<pb::Service>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let record = self.visible(&caller, &request.project, &request.name).await?;
        running(&record)?;
        let rollout = rollout_of(request.traffic, request.shadow)?;
        match &request.definition {
            Some(definition) => {
                let next = self
                    .revision(&caller, &record.project, record.latest_revision as u64 + 1, definition)
                    .await?;
                if let Some(scaling) = &definition.scaling {
                    let scaling = check_scaling(definition.replicas, Some(scaling))?;
                    self.shared.services.set_scaling(&record.id, &scaling).await?;
                }
                self.shared.services.add_revision(&record, &next, rollout).await?;
                tracing::info!(service = %record.name, revision = next.revision, traffic = rollout.traffic, shadow = rollout.shadow, "service trying a new revision");
            }
            None => {
                self.shared.services.set_rollout(&record, rollout).await?;
                tracing::info!(service = %record.name, revision = record.latest_revision, traffic = rollout.traffic, shadow = rollout.shadow, "service's latest revision tried anew");
            }
        }
        self.shared.wake.notify_one();
        let record = self.named(&record.project, &record.name).await?;
        Ok(Response::new(self.describe(&record).await?))
    }

    async fn scale_service(&self, request: Request<pb::ScaleServiceRequest>) -> Result<Response<pb::Service>, Status> {
        let caller = caller(&request)?;
        let request = request.into_inner();
        let record = self.visible(&caller, &request.project, &request.name).await?;
        running(&record)?;
        let scaling = check_scaling(request.replicas, request.scaling.as_ref())?;
        self.shared.services.set_scaling(&record.id, &scaling).await?;
        self.shared.wake.notify_one();
        let record = self.named(&record.project, &record.name).await?;
        Ok(Response::new(self.describe(&record).await?))
    }

    async fn stop_service(&self, request: Request<pb::StopServiceRequest>) -> Result<Response<pb::Service>, Status> {
        let caller = caller(&request)?;
        let asked = request.get_ref();
        let record = self.visible(&caller, &asked.project, &asked.name).await?;
        if self.shared.services.stop(&record.id, "stopped by request").await? {
            tracing::info!(service = %record.name, project = %record.project, "service stopped");
        }
        crate::controller::forget(&self.shared, &record.key()).await?;
        self.shared.wake.notify_one();
        let record = self.named(&record.project, &record.name).await?;
        Ok(Response::new(self.describe(&record).await?))
    }
}

fn running(record: &ServiceRecord) -> Result<()> {
    if record.state == RUNNING {
        Ok(())
    } else {
        Err(Error::FailedPrecondition(format!(
            "service {} is {}; create it again to serve it",
            record.name, record.state
        )))
    }
}

impl ServeApi {
    async fn create(&self, caller: &Caller, request: pb::CreateServiceRequest) -> Result<pb::Service> {
        let project = caller.named_project(&self.shared.store, &request.project).await?;
        caller
            .authorize(&Resource::project(&project))
            .map_err(kiln_core::Error::from)?;
        kiln_core::serving::check_name("name", &request.name).map_err(Error::InvalidArgument)?;
        if kiln_core::serving::RESERVED_SERVICE_NAMES.contains(&request.name.as_str()) {
            return Err(Error::InvalidArgument(format!(
                "name `{}` is a word of the inference URLs (/v2/models/NAME/{}); pick another",
                request.name, request.name
            )));
        }
        let definition = request
            .definition
            .ok_or_else(|| Error::InvalidArgument("definition is missing".into()))?;
        let scaling = check_scaling(definition.replicas, definition.scaling.as_ref())?;
        let first = self.revision(caller, &project, 1, &definition).await?;
        let record = self
            .shared
            .services
            .create(&request.name, &project, caller.user_id(), &scaling, &first)
            .await?;
        crate::controller::publish(&self.shared, &crate::controller::live(&record, &first)).await?;
        tracing::info!(service = %record.name, project = %record.project, owner = %caller.principal.user_name, "service created");
        // A name made again after a stop starts with no traffic of its own.
        self.shared.traffic.forget(&record.key());
        self.shared.wake.notify_one();
        self.describe(&record).await
    }

    /// Checks a definition and resolves its models into revision `number`.
    async fn revision(
        &self,
        caller: &Caller,
        project: &str,
        number: u64,
        definition: &pb::ServiceDefinition,
    ) -> Result<Revision> {
        let ensemble = match definition.ensemble.as_str() {
            "" => Ensemble::Mean,
            other => Ensemble::parse(other).ok_or_else(|| {
                Error::InvalidArgument(format!(
                    "ensemble is `{other}`; give mean, weighted-mean, vote or first"
                ))
            })?,
        };
        let worker = definition.worker.clone().unwrap_or_default();
        let resources = worker.resources.unwrap_or_default();
        let store = &self.shared.store;
        if !worker.code_digest.is_empty() && caller.usable_blob(store, &worker.code_digest, project).await?.is_none() {
            return Err(Error::FailedPrecondition(format!(
                "code bundle {} is not uploaded; upload it with ArtifactService first",
                worker.code_digest
            )));
        }
        if let Some(name) = store.missing_secret(project, &worker.secrets).await? {
            return Err(Error::FailedPrecondition(format!(
                "project {project} has no secret {name}; set it with `kiln secret set {name} --project {project}`"
            )));
        }
        let mut members = Vec::new();
        for model in &definition.models {
            let reference = ModelRef::parse(&model.model).map_err(Error::InvalidArgument)?;
            let (key, version) = self.resolve(caller, project, &reference).await?;
            members.push(RevisionMember {
                name: if model.member.is_empty() {
                    default_member_name(reference.name())
                } else {
                    model.member.clone()
                },
                asked: model.model.clone(),
                model: key.relative_to(project),
                version,
                weight: if model.weight == 0.0 { 1.0 } else { model.weight },
            });
        }
        let tensors = |tensors: &[pb::TensorMetadata]| -> Vec<TensorSpec> {
            tensors
                .iter()
                .map(|tensor| TensorSpec {
                    name: tensor.name.clone(),
                    datatype: tensor.datatype.clone(),
                    shape: tensor.shape.clone(),
                })
                .collect()
        };
        let revision = Revision {
            revision: number,
            members,
            ensemble,
            deadline_ms: if definition.deadline_ms == 0 {
                DEFAULT_DEADLINE_MS
            } else {
                definition.deadline_ms
            },
            quorum: definition.quorum.max(1) as usize,
            inputs: tensors(&definition.inputs),
            outputs: tensors(&definition.outputs),
            worker: WorkerSpec {
                command: worker.command,
                env: worker.env.into_iter().collect(),
                image: worker.image,
                cpu_millis: i64::from(resources.cpu_millis),
                memory_bytes: i64::try_from(resources.memory_bytes).unwrap_or(i64::MAX),
                disk_bytes: i64::try_from(resources.disk_bytes).unwrap_or(i64::MAX),
                shm_bytes: i64::try_from(resources.shm_bytes).unwrap_or(i64::MAX),
                gpus: i32::try_from(worker.gpus).unwrap_or(i32::MAX),
                code_digest: worker.code_digest,
                market: MarketPolicy::from_proto(pb::Market::try_from(worker.market).unwrap_or_default())
                    .as_str()
                    .to_string(),
                pool: worker.pool,
                secrets: worker.secrets,
                priority_class: worker.priority_class,
            },
        };
        let problems = revision.problems("service");
        if !problems.is_empty() {
            return Err(Error::InvalidArgument(format!(
                "the service definition has {} problem(s): {}",
                problems.len(),
                problems.join("; ")
            )));
        }
        Ok(revision)
    }

    /// The model and version a reference in a definition of `project` names (`NAME` of
    /// `project`, `PROJECT/NAME` of another), once the caller may read the model; one it may
    /// not read is refused as an unknown one.
    async fn resolve(&self, caller: &Caller, project: &str, reference: &ModelRef) -> Result<(ModelKey, i64)> {
        let store = &self.shared.store;
        let written = reference.model();
        let unknown = || Error::InvalidArgument(format!("model {written} not found in the registry (`kiln model ls`)"));
        let named = ObjectRef::parse(written).ok_or_else(unknown)?;
        let model = store
            .model(named.project_in(project).unwrap_or(project), &named.name)
            .await?
            .ok_or_else(unknown)?;
        caller
            .authorize_with(
                Need::Role(Role::Viewer),
                &Resource {
                    kind: "model",
                    ..Resource::project(&model.project)
                },
            )
            .map_err(|_| unknown())?;
        let key = model.key();
        let version = match reference {
            ModelRef::Latest { .. } => model.latest_version,
            ModelRef::Version { version, .. } => *version,
            ModelRef::Alias { alias, .. } => store.model_alias(&key, alias).await?.ok_or_else(|| {
                Error::InvalidArgument(format!("model {written} has no alias {alias} (`kiln model alias`)"))
            })?,
        };
        if store.model_version(&key, version).await?.is_none() {
            return Err(Error::InvalidArgument(format!(
                "model {written} has no version {version}"
            )));
        }
        Ok((key, version))
    }

    /// Service `name` of `project`.
    async fn named(&self, project: &str, name: &str) -> Result<ServiceRecord> {
        self.shared
            .services
            .by_name(project, name)
            .await?
            .ok_or_else(|| Error::NotFound(format!("service {name} not found")))
    }

    /// Reads the service `reference` names (`NAME` in `project`, `PROJECT/NAME`, or with
    /// neither a bare name in the one project the caller may read that has it) and asks the
    /// caller's rule about it (an unseen one is not found, in the words of an unknown one).
    async fn visible(&self, caller: &Caller, project: &str, reference: &str) -> Result<ServiceRecord> {
        let unknown = || Error::NotFound(format!("service {reference} not found"));
        let named = ObjectRef::parse(reference).ok_or_else(unknown)?;
        let project = match named.project_in(project) {
            Some(project) => project.to_string(),
            None => match caller.sole_holder(self.shared.services.projects_named(&named.name).await?) {
                Holder::None => return Err(unknown()),
                Holder::One(project) => project,
                Holder::Several(projects) => {
                    return Err(Error::FailedPrecondition(format!(
                        "service {} is in more than one project you may read ({}): name one as PROJECT/{}, or give its project (--project)",
                        named.name,
                        projects.join(", "),
                        named.name
                    )));
                }
            },
        };
        let record = self
            .shared
            .services
            .by_name(&project, &named.name)
            .await?
            .ok_or_else(unknown)?;
        match caller.authorize(&Resource::owned(
            "service",
            &record.name,
            &record.project,
            &record.owner_id,
        )) {
            Err(kiln_core::authz::Denied::NotFound { .. }) => Err(unknown()),
            denied => {
                denied.map_err(kiln_core::Error::from)?;
                Ok(record)
            }
        }
    }

    pub(crate) async fn describe(&self, record: &ServiceRecord) -> Result<pb::Service> {
        let services = &self.shared.services;
        let latest = services.revision(&record.id, record.latest_revision).await?;
        let workers = self.shared.store.live_service_workers(&record.id).await?;
        let mut members = Vec::new();
        let mut revisions = vec![record.revision];
        if record.latest_revision != record.revision {
            revisions.push(record.latest_revision);
        }
        for number in revisions {
            let revision = services.revision(&record.id, number).await?;
            for member in &revision.members {
                members.push(pb::ServiceMember {
                    member: member.name.clone(),
                    model_version: member.model_version(),
                    weight: member.weight,
                    revision: revision.revision,
                    wanted: if record.state == RUNNING {
                        workers_of(&workers, revision.revision, &member.name)
                            .filter(|job| !job.stop_requested)
                            .count() as u32
                    } else {
                        0
                    },
                    workers: workers_of(&workers, revision.revision, &member.name)
                        .map(|job| pb::ServiceWorker {
                            job_id: job.id.clone(),
                            state: job.to_proto().state,
                        })
                        .collect(),
                });
            }
        }
        Ok(pb::Service {
            name: record.name.clone(),
            project: record.project.clone(),
            owner: record.owner_id.clone(),
            state: record.state.clone(),
            reason: record.reason.clone(),
            revision: record.revision as u64,
            latest_revision: record.latest_revision as u64,
            definition: Some(definition_of(&latest, record.replicas)),
            traffic: record.rollout().traffic,
            shadow: record.rollout().shadow,
            scaling: Some(scaling_to_proto(&record.scaling())),
            members,
            created_at_ms: record.created_at_ms,
            updated_at_ms: record.updated_at_ms,
            url: self.shared.http_url.clone(),
            recent: Some(self.shared.traffic.summary(&record.key(), std::time::Instant::now())),
            paused_reason: record.paused_reason.clone(),
        })
    }
}

/// The workers (live jobs) of `member` of `revision`.
pub fn workers_of<'a>(
    workers: &'a [JobRecord],
    revision: u64,
    member: &'a str,
) -> impl Iterator<Item = &'a JobRecord> + 'a {
    workers.iter().filter(move |job| {
        let env = job.env().unwrap_or_default();
        env.get(ENV_REVISION).and_then(|value| value.parse::<u64>().ok()) == Some(revision)
            && env.get(ENV_MEMBER).map(String::as_str) == Some(member)
    })
}

fn definition_of(revision: &Revision, replicas: i32) -> pb::ServiceDefinition {
    let tensors = |tensors: &[TensorSpec]| -> Vec<pb::TensorMetadata> {
        tensors
            .iter()
            .map(|tensor| pb::TensorMetadata {
                name: tensor.name.clone(),
                datatype: tensor.datatype.clone(),
                shape: tensor.shape.clone(),
            })
            .collect()
    };
    let worker = &revision.worker;
    pb::ServiceDefinition {
        models: revision
            .members
            .iter()
            .map(|member| pb::ServiceModel {
                model: member.asked.clone(),
                weight: member.weight,
                member: member.name.clone(),
            })
            .collect(),
        ensemble: revision.ensemble.as_str().to_string(),
        deadline_ms: revision.deadline_ms,
        quorum: revision.quorum as u32,
        replicas: replicas as u32,
        worker: Some(pb::JobSpec {
            command: worker.command.clone(),
            env: worker.env.clone().into_iter().collect(),
            resources: Some(pb::Resources {
                cpu_millis: u32::try_from(worker.cpu_millis).unwrap_or(0),
                memory_bytes: u64::try_from(worker.memory_bytes).unwrap_or(0),
                disk_bytes: u64::try_from(worker.disk_bytes).unwrap_or(0),
                shm_bytes: u64::try_from(worker.shm_bytes).unwrap_or(0),
            }),
            code_digest: worker.code_digest.clone(),
            image: worker.image.clone(),
            gpus: u32::try_from(worker.gpus).unwrap_or(0),
            market: MarketPolicy::parse(&worker.market).to_proto() as i32,
            pool: worker.pool.clone(),
            secrets: worker.secrets.clone(),
            priority_class: worker.priority_class.clone(),
            ..Default::default()
        }),
        inputs: tensors(&revision.inputs),
        outputs: tensors(&revision.outputs),
        scaling: None,
    }
}
