//! `ModelService`: the model registry. The handlers find what a call addresses, have the
//! caller authorised on it (the model's project: viewers read, members register, tag and move
//! aliases), and leave the work to [`kiln_core::models`], which the advisor calls too.
//!
//! Names are unique per project. A call names a model as `NAME` in its `project` or as
//! `PROJECT/NAME`; with neither, a bare name is looked up in the projects the caller may read
//! ([`kiln_core::authz::Holder`]). A model the caller may not read is answered in the words of
//! one that does not exist.

use std::collections::BTreeMap;
use std::pin::Pin;

use futures::{Stream, StreamExt};
use kiln_core::authz::{Caller, Holder, ObjectRef, Resource};
use kiln_core::models::{
    ModelError, RegisterRequest, Registry, Version, VersionRef, validate_alias, validate_model_name, validate_tags,
};
use kiln_core::objects::artifact_path;
use kiln_core::store::{ModelKey, ModelRecord, VersionFilter};
use kiln_proto::v1 as pb;
use kiln_proto::v1::model_service_server::ModelService;
use object_store::ObjectStoreExt;
use tonic::{Request, Response, Status};

use crate::access;
use crate::error::{Error, Result};

/// Versions or models per page when the request names no limit, and at most.
const DEFAULT_PAGE: u64 = 100;
const LARGEST_PAGE: u64 = 1000;
/// Bytes per file chunk sent.
const FILE_CHUNK: usize = 1 << 20;

/// ModelsApi serves `ModelService`.
#[derive(Clone)]
pub struct ModelsApi {
    pub(crate) registry: Registry,
}

/// Characters a search text may have.
const LONGEST_QUERY: usize = 256;

fn check_query(query: &str) -> Result<()> {
    if query.chars().count() > LONGEST_QUERY {
        return Err(Error::InvalidArgument(format!(
            "the search text is longer than {LONGEST_QUERY} characters"
        )));
    }
    Ok(())
}

fn page(limit: u32) -> u64 {
    match limit {
        0 => DEFAULT_PAGE,
        n => u64::from(n).min(LARGEST_PAGE),
    }
}

impl ModelsApi {
    /// Reads the model `reference` names (`NAME` in `project`, `PROJECT/NAME`, or with neither
    /// a bare name in the one project the caller may read that has it), when the caller may act
    /// on it with the method's need; another project's model reads as not found.
    async fn model(&self, caller: &Caller, project: &str, reference: &str) -> Result<ModelRecord> {
        let unknown = || -> Error {
            ModelError::ModelNotFound {
                name: reference.to_string(),
            }
            .into()
        };
        let named = ObjectRef::parse(reference).ok_or_else(unknown)?;
        validate_model_name(&named.name)?;
        let store = &self.registry.store;
        let project = match named.project_in(project) {
            Some(project) => project.to_string(),
            None => match caller.sole_holder(store.model_projects(&named.name).await?) {
                Holder::None => return Err(unknown()),
                Holder::One(project) => project,
                Holder::Several(projects) => {
                    return Err(ModelError::Ambiguous {
                        name: named.name,
                        projects,
                    }
                    .into());
                }
            },
        };
        let model = store.model(&project, &named.name).await?.ok_or_else(unknown)?;
        match caller.authorize(&Resource::owned("model", &model.name, &model.project, "")) {
            // In the words of a model that does not exist.
            Err(kiln_core::authz::Denied::NotFound { .. }) => Err(unknown()),
            denied => {
                denied?;
                Ok(model)
            }
        }
    }

    async fn model_proto(&self, model: ModelRecord) -> Result<pb::Model> {
        let aliases = self.registry.store.model_aliases(&model.key()).await?;
        Ok(pb::Model {
            name: model.name,
            project: model.project,
            created_by: model.created_by,
            created_at_ms: model.created_at_ms,
            latest_version: model.latest_version,
            aliases: aliases.into_iter().collect(),
        })
    }

    async fn register(&self, caller: &Caller, request: pb::RegisterModelRequest) -> Result<pb::ModelVersion> {
        // A version is of the job's project: `NAME`, or `PROJECT/NAME` with that project.
        let named = ObjectRef::parse(&request.name).ok_or_else(|| {
            Error::InvalidArgument(format!(
                "model {:?}: name it NAME, or PROJECT/NAME with its job's project",
                request.name
            ))
        })?;
        validate_model_name(&named.name)?;
        let job = access::job(&self.registry.store, caller, &request.job_id).await?;
        if let Some(project) = &named.project
            && *project != job.project
        {
            return Err(Error::InvalidArgument(format!(
                "model {}: a version is registered in its job's project, {}; give the name alone or as {}/NAME",
                request.name, job.project, job.project
            )));
        }
        let version = self
            .registry
            .register(RegisterRequest {
                model: named.name,
                job,
                path: request.path,
                description: request.description,
                tags: request.tags.into_iter().collect(),
                alias: request.alias,
                registered_by: caller.principal.user_name.clone(),
            })
            .await?;
        Ok(version.to_proto())
    }

    async fn list_models(&self, caller: &Caller, request: pb::ListModelsRequest) -> Result<pb::ListModelsResponse> {
        let visible = caller.listed_projects(&self.registry.store, &request.project).await?;
        check_query(&request.query)?;
        let limit = page(request.limit);
        // `NAME/PROJECT` of the last model of a page (a bare name, as earlier pages gave: after
        // every model of that name).
        let after = request.page_token.split_once('/').unwrap_or((&request.page_token, ""));
        let models = self
            .registry
            .store
            .list_models(&visible, &request.query, after, limit)
            .await?;
        let next_page_token = match models.last() {
            Some(last) if models.len() as u64 == limit => format!("{}/{}", last.name, last.project),
            _ => String::new(),
        };
        let mut out = Vec::with_capacity(models.len());
        for model in models {
            out.push(self.model_proto(model).await?);
        }
        Ok(pb::ListModelsResponse {
            models: out,
            next_page_token,
        })
    }

    async fn list_versions(
        &self,
        caller: &Caller,
        request: pb::ListModelVersionsRequest,
    ) -> Result<pb::ListModelVersionsResponse> {
        let model = self.model(caller, &request.project, &request.name).await?;
        let tags: BTreeMap<String, String> = request.tags.into_iter().collect();
        validate_tags(&tags, false)?;
        check_query(&request.query)?;
        if request.before_version < 0 {
            return Err(Error::InvalidArgument("before_version must be 0 or more".into()));
        }
        let filter = VersionFilter {
            query: request.query,
            tags,
            before_version: request.before_version,
            limit: page(request.limit),
        };
        let store = &self.registry.store;
        let key = model.key();
        let records = store.list_model_versions(&key, &filter).await?;
        let numbers: Vec<i64> = records.iter().map(|r| r.version).collect();
        let mut tags = store.model_tags(&key, &numbers).await?;
        let aliases = store.model_aliases(&key).await?;
        let next_before_version = match records.last() {
            Some(last) if records.len() as u64 == filter.limit && last.version > 1 => last.version,
            _ => 0,
        };
        // Listings leave the files out; `GetModelVersion` has them.
        let versions = records
            .into_iter()
            .map(|record| {
                let tags = tags.remove(&record.version).unwrap_or_default();
                Ok(Version::assemble(record, Vec::new(), tags, &aliases)?.to_proto())
            })
            .collect::<Result<Vec<_>>>()?;
        Ok(pb::ListModelVersionsResponse {
            versions,
            next_before_version,
        })
    }

    async fn version(&self, caller: &Caller, project: &str, name: &str, reference: VersionRef) -> Result<Version> {
        let model = self.model(caller, project, name).await?;
        if let VersionRef::Alias(alias) = &reference {
            validate_alias(alias)?;
        }
        Ok(Version::read(&self.registry.store, &model.key(), reference).await?)
    }

    async fn set_alias(&self, caller: &Caller, request: pb::SetModelAliasRequest) -> Result<pb::ModelVersion> {
        let model = self.model(caller, &request.project, &request.name).await?;
        validate_alias(&request.alias)?;
        let store = &self.registry.store;
        let key: ModelKey = model.key();
        let number = Version::resolve(store, &model, &VersionRef::from_fields(request.version, "")?).await?;
        store.set_model_alias(&key, &request.alias, number).await?;
        tracing::info!(model = %model.name, project = %model.project, version = number, alias = %request.alias, "model alias set");
        Ok(Version::read(store, &key, VersionRef::Number(number)).await?.to_proto())
    }

    async fn delete_alias(&self, caller: &Caller, request: pb::DeleteModelAliasRequest) -> Result<i64> {
        let model = self.model(caller, &request.project, &request.name).await?;
        validate_alias(&request.alias)?;
        let held = self
            .registry
            .store
            .delete_model_alias(&model.key(), &request.alias)
            .await?;
        held.ok_or_else(|| {
            ModelError::AliasNotFound {
                name: model.name,
                alias: request.alias,
            }
            .into()
        })
    }

    async fn set_tags(&self, caller: &Caller, request: pb::SetModelTagsRequest) -> Result<pb::ModelVersion> {
        let model = self.model(caller, &request.project, &request.name).await?;
        let tags: BTreeMap<String, String> = request.tags.into_iter().collect();
        validate_tags(&tags, true)?;
        if tags.is_empty() {
            return Err(Error::InvalidArgument(
                "give at least one tag (key=value, or key= to remove)".into(),
            ));
        }
        let store = &self.registry.store;
        let key = model.key();
        let number = Version::resolve(store, &model, &VersionRef::from_fields(request.version, "")?).await?;
        store.set_model_tags(&key, number, &tags).await?;
        Ok(Version::read(store, &key, VersionRef::Number(number)).await?.to_proto())
    }

    async fn file(&self, caller: &Caller, request: pb::GetModelFileRequest) -> Result<FileStream> {
        let version = self
            .version(
                caller,
                &request.project,
                &request.name,
                VersionRef::from_fields(request.version, "")?,
            )
            .await?;
        let file = version
            .files
            .iter()
            .find(|file| file.path == request.path)
            .ok_or_else(|| ModelError::FileNotFound {
                name: request.name.clone(),
                version: version.record.version,
                path: request.path.clone(),
            })?;
        let object = self.registry.objects.get(&artifact_path(&file.sha256)).await?;
        let chunks = object.into_stream().flat_map(|bytes| {
            let items: Vec<Result<pb::ModelFileChunk, Status>> = match bytes {
                Ok(bytes) => bytes
                    .chunks(FILE_CHUNK)
                    .map(|chunk| Ok(pb::ModelFileChunk { data: chunk.to_vec() }))
                    .collect(),
                Err(error) => vec![Err(Status::from(Error::from(error)))],
            };
            futures::stream::iter(items)
        });
        Ok(Box::pin(chunks))
    }
}

type FileStream = Pin<Box<dyn Stream<Item = Result<pb::ModelFileChunk, Status>> + Send>>;

#[tonic::async_trait]
impl ModelService for ModelsApi {
    #[tracing::instrument(skip_all, fields(model = %request.get_ref().name, job_id = %request.get_ref().job_id))]
    async fn register_model(
        &self,
        request: Request<pb::RegisterModelRequest>,
    ) -> Result<Response<pb::ModelVersion>, Status> {
        let caller = access::caller(&request)?;
        Ok(Response::new(self.register(&caller, request.into_inner()).await?))
    }

    #[tracing::instrument(skip_all, fields(model = %request.get_ref().name))]
    async fn get_model(&self, request: Request<pb::GetModelRequest>) -> Result<Response<pb::Model>, Status> {
        let caller = access::caller(&request)?;
        let asked = request.get_ref();
        let model = self.model(&caller, &asked.project, &asked.name).await?;
        Ok(Response::new(self.model_proto(model).await?))
    }

    #[tracing::instrument(skip_all)]
    async fn list_models(
        &self,
        request: Request<pb::ListModelsRequest>,
    ) -> Result<Response<pb::ListModelsResponse>, Status> {
        let caller = access::caller(&request)?;
        Ok(Response::new(self.list_models(&caller, request.into_inner()).await?))
    }

    #[tracing::instrument(skip_all, fields(model = %request.get_ref().name))]
    async fn get_model_version(
        &self,
        request: Request<pb::GetModelVersionRequest>,
    ) -> Result<Response<pb::ModelVersion>, Status> {
        let caller = access::caller(&request)?;
        let asked = request.into_inner();
        let reference = VersionRef::from_fields(asked.version, &asked.alias).map_err(Error::from)?;
        let version = self.version(&caller, &asked.project, &asked.name, reference).await?;
        Ok(Response::new(version.to_proto()))
    }

    #[tracing::instrument(skip_all, fields(model = %request.get_ref().name))]
    async fn list_model_versions(
        &self,
        request: Request<pb::ListModelVersionsRequest>,
    ) -> Result<Response<pb::ListModelVersionsResponse>, Status> {
        let caller = access::caller(&request)?;
        Ok(Response::new(self.list_versions(&caller, request.into_inner()).await?))
    }

    #[tracing::instrument(skip_all, fields(model = %request.get_ref().name, alias = %request.get_ref().alias))]
    async fn set_model_alias(
        &self,
        request: Request<pb::SetModelAliasRequest>,
    ) -> Result<Response<pb::ModelVersion>, Status> {
        let caller = access::caller(&request)?;
        Ok(Response::new(self.set_alias(&caller, request.into_inner()).await?))
    }

    #[tracing::instrument(skip_all, fields(model = %request.get_ref().name, alias = %request.get_ref().alias))]
    async fn delete_model_alias(
        &self,
        request: Request<pb::DeleteModelAliasRequest>,
    ) -> Result<Response<pb::DeleteModelAliasResponse>, Status> {
        let caller = access::caller(&request)?;
        let version = self.delete_alias(&caller, request.into_inner()).await?;
        Ok(Response::new(pb::DeleteModelAliasResponse { version }))
    }

    #[tracing::instrument(skip_all, fields(model = %request.get_ref().name))]
    async fn set_model_tags(
        &self,
        request: Request<pb::SetModelTagsRequest>,
    ) -> Result<Response<pb::ModelVersion>, Status> {
        let caller = access::caller(&request)?;
        Ok(Response::new(self.set_tags(&caller, request.into_inner()).await?))
    }

    type GetModelFileStream = FileStream;

    #[tracing::instrument(skip_all, fields(model = %request.get_ref().name))]
    async fn get_model_file(
        &self,
        request: Request<pb::GetModelFileRequest>,
    ) -> Result<Response<Self::GetModelFileStream>, Status> {
        let caller = access::caller(&request)?;
        Ok(Response::new(self.file(&caller, request.into_inner()).await?))
    }
}
