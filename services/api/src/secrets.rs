//! `SecretService`: a project's secrets, sealed with the api's secrets key before they are
//! stored ([`kiln_core::secrets`]). No RPC returns a value: reads give names and times only.
//! Setting and removing need the project's maintainer, listing its member (the policy table).

use std::sync::Arc;

use kiln_core::secrets::{self, SecretsError, SecretsKey};
use kiln_core::store::{SecretRecord, Store};
use kiln_proto::v1 as pb;
use kiln_proto::v1::secret_service_server::SecretService;
use tonic::{Request, Response, Status};

use crate::access;
use crate::error::{Error, Result};

/// SecretsApi serves `SecretService`.
#[derive(Clone)]
pub struct SecretsApi {
    pub(crate) store: Store,
    /// The key values are sealed with; `None` when the config names none (setting is refused).
    pub(crate) key: Option<Arc<SecretsKey>>,
}

fn to_proto(record: SecretRecord) -> pb::Secret {
    pb::Secret {
        project: record.project,
        name: record.name,
        created_at_ms: record.created_at_ms,
        updated_at_ms: record.updated_at_ms,
    }
}

/// The name and value a set stores: the request's own, or for a registry's credentials
/// `registry:<registry>` and the user and password as JSON.
fn stored_secret(request: pb::SetSecretRequest) -> Result<(String, String)> {
    if request.registry.is_empty() {
        secrets::validate_name(&request.name).map_err(Error::InvalidArgument)?;
        if !request.username.is_empty() {
            return Err(Error::InvalidArgument(
                "a username goes with registry credentials only: give --registry too".into(),
            ));
        }
        secrets::validate_value(&request.value)
            .map_err(|why| Error::InvalidArgument(format!("secret {}: {why}", request.name)))?;
        return Ok((request.name, request.value));
    }
    let name = secrets::registry_secret_name(&request.registry).map_err(Error::InvalidArgument)?;
    if !request.name.is_empty() {
        return Err(Error::InvalidArgument(format!(
            "give a name or a registry, not both: registry credentials are stored as {name}"
        )));
    }
    if request.username.is_empty() || request.username.len() > 256 || request.username.chars().any(char::is_control) {
        return Err(Error::InvalidArgument(
            "registry credentials need a username (at most 256 printable characters): the registry's user, or AWS for an ECR token".into(),
        ));
    }
    secrets::validate_value(&request.value)
        .map_err(|why| Error::InvalidArgument(format!("the password for {}: {why}", request.registry)))?;
    let credentials = secrets::RegistryCredentials {
        username: request.username,
        password: request.value,
    };
    let value = serde_json::to_string(&credentials).map_err(|e| Error::Internal(e.to_string()))?;
    Ok((name, value))
}

#[tonic::async_trait]
impl SecretService for SecretsApi {
    #[tracing::instrument(skip_all, fields(project = %request.get_ref().project, name = %request.get_ref().name))]
    async fn set_secret(&self, request: Request<pb::SetSecretRequest>) -> Result<Response<pb::Secret>, Status> {
        let caller = access::caller(&request)?;
        let request = request.into_inner();
        let project = access::project(&self.store, &caller, &request.project).await?;
        let (name, value) = stored_secret(request)?;
        let key = self
            .key
            .as_ref()
            .ok_or(Error::Secrets(SecretsError::NoKey { service: "the api" }))?;
        let sealed = key.seal(&project, &name, value.as_bytes()).map_err(Error::from)?;
        let saved = self
            .store
            .set_secret(&project, &name, sealed)
            .await
            .map_err(Error::from)?;
        tracing::info!(project = %saved.project, name = %saved.name, by = %caller.principal.user_name, "secret set");
        Ok(Response::new(to_proto(saved)))
    }

    #[tracing::instrument(skip_all, fields(project = %request.get_ref().project))]
    async fn list_secrets(
        &self,
        request: Request<pb::ListSecretsRequest>,
    ) -> Result<Response<pb::ListSecretsResponse>, Status> {
        let caller = access::caller(&request)?;
        let project = access::project(&self.store, &caller, &request.get_ref().project).await?;
        let listed = self.store.list_secrets(&project).await.map_err(Error::from)?;
        Ok(Response::new(pb::ListSecretsResponse {
            secrets: listed.into_iter().map(to_proto).collect(),
        }))
    }

    #[tracing::instrument(skip_all, fields(project = %request.get_ref().project, name = %request.get_ref().name))]
    async fn delete_secret(&self, request: Request<pb::DeleteSecretRequest>) -> Result<Response<pb::Secret>, Status> {
        let caller = access::caller(&request)?;
        let request = request.into_inner();
        let project = access::project(&self.store, &caller, &request.project).await?;
        secrets::validate_stored_name(&request.name).map_err(Error::InvalidArgument)?;
        let deleted = self
            .store
            .delete_secret(&project, &request.name)
            .await
            .map_err(Error::from)?
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "project {project} has no secret {}; `kiln secret ls --project {project}` lists them",
                    request.name
                ))
            })?;
        tracing::info!(project = %deleted.project, name = %deleted.name, by = %caller.principal.user_name, "secret deleted");
        Ok(Response::new(to_proto(deleted)))
    }
}
