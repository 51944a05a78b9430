//! `ArtifactService`: content-addressed blobs, stored once per sha256.

use std::sync::Arc;

use futures::Stream;
use futures::StreamExt;
use kiln_core::auth::Scope;
use kiln_core::authz::Caller;
use kiln_core::objects::{artifact_path, is_sha256_hex};
use kiln_core::objects::{join, outputs_prefix, relative_path};
use kiln_core::store::{NewArtifact, Store};
use kiln_proto::v1 as pb;
use kiln_proto::v1::artifact_service_server::ArtifactService;
use kiln_proto::v1::upload_artifact_request::Part;
use object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};
use sha2::{Digest, Sha256};
use tonic::{Request, Response, Status, Streaming};

use crate::error::{Error, Result};

/// ArtifactsApi serves `ArtifactService`.
#[derive(Clone)]
pub struct ArtifactsApi {
    pub(crate) store: Store,
    pub(crate) objects: Arc<dyn ObjectStore>,
    pub(crate) max_bytes: u64,
}

pub(crate) fn check_digest(digest: &str) -> Result<()> {
    if is_sha256_hex(digest) {
        Ok(())
    } else {
        Err(Error::InvalidArgument(format!(
            "digest {digest:?} is not a lowercase hex sha256 (64 characters)"
        )))
    }
}

impl ArtifactsApi {
    /// The project a blob call names (see [`blob_project`]).
    async fn blob_project(&self, caller: &Caller, named: &str) -> Result<String> {
        blob_project(&self.store, caller, named).await
    }

    async fn upload(
        &self,
        caller: &Caller,
        mut parts: Streaming<pb::UploadArtifactRequest>,
    ) -> Result<pb::UploadArtifactResponse> {
        let header = match parts.next().await {
            Some(Ok(pb::UploadArtifactRequest {
                part: Some(Part::Header(header)),
            })) => header,
            Some(Ok(_)) => {
                return Err(Error::InvalidArgument(
                    "the first message of an upload must be its header".into(),
                ));
            }
            Some(Err(status)) => {
                return Err(Error::InvalidArgument(format!(
                    "upload interrupted: {}",
                    status.message()
                )));
            }
            None => {
                return Err(Error::InvalidArgument(
                    "empty upload: send a header, then the content".into(),
                ));
            }
        };
        let project = self.blob_project(caller, &header.project).await?;
        check_digest(&header.digest)?;
        if header.size > self.max_bytes {
            return Err(Error::TooLarge(format!(
                "artifact is {} bytes; the limit is {} bytes (max-artifact-bytes)",
                header.size, self.max_bytes
            )));
        }
        let stored = self.store.artifact(&header.digest).await?;
        if let Some(existing) = &stored
            && self.store.artifact_in_project(&header.digest, &project).await?
        {
            return Ok(pb::UploadArtifactResponse {
                digest: existing.digest.clone(),
                size: u64::try_from(existing.size).unwrap_or(0),
                created: false,
            });
        }
        if stored.is_some() {
            // Stored for another project: knowing the digest is not having the content, so it
            // is received and checked like a new blob before this project may use it.
            receive(&mut parts, &header, None).await?;
            self.store.grant_artifact(&header.digest, &project).await?;
            tracing::info!(digest = %header.digest, project, "artifact proven and shared with a project");
            return Ok(pb::UploadArtifactResponse {
                digest: header.digest,
                size: header.size,
                created: false,
            });
        }
        // Stream into a multipart upload that only becomes visible once the digest checks out.
        let path = artifact_path(&header.digest);
        let mut writer = WriteMultipart::new(self.objects.put_multipart(&path).await?);
        let outcome = receive(&mut parts, &header, Some(&mut writer)).await;
        if let Err(error) = outcome {
            let _ = writer.abort().await;
            return Err(error);
        }
        writer.finish().await?;
        let created = self
            .store
            .insert_artifact(NewArtifact {
                digest: header.digest.clone(),
                size: i64::try_from(header.size).unwrap_or(i64::MAX),
                created_by: caller.user_id().to_string(),
                project: project.clone(),
            })
            .await?;
        tracing::info!(digest = %header.digest, size = header.size, created, "artifact stored");
        Ok(pb::UploadArtifactResponse {
            digest: header.digest,
            size: header.size,
            created,
        })
    }
}

/// Receives an upload's content after its header, into `writer` when given, and checks its
/// size and sha256 against the header.
async fn receive(
    parts: &mut Streaming<pb::UploadArtifactRequest>,
    header: &pb::ArtifactHeader,
    mut writer: Option<&mut WriteMultipart>,
) -> Result<()> {
    let mut hasher = Sha256::new();
    let mut received: u64 = 0;
    while let Some(part) = parts.next().await {
        let part =
            part.map_err(|status| Error::InvalidArgument(format!("upload interrupted: {}", status.message())))?;
        let Some(Part::Chunk(chunk)) = part.part else {
            return Err(Error::InvalidArgument(
                "only the first message of an upload may be a header".into(),
            ));
        };
        received += chunk.len() as u64;
        if received > header.size {
            return Err(Error::InvalidArgument(format!(
                "upload is larger than its declared {} bytes",
                header.size
            )));
        }
        hasher.update(&chunk);
        if let Some(writer) = writer.as_deref_mut() {
            // At most 4 parts in flight: a fast client never fills the api's memory.
            writer.wait_for_capacity(4).await?;
            writer.write(&chunk);
        }
    }
    if received != header.size {
        return Err(Error::InvalidArgument(format!(
            "upload ended after {received} of {} bytes",
            header.size
        )));
    }
    let actual = hex::encode(hasher.finalize());
    if actual != header.digest {
        return Err(Error::InvalidArgument(format!(
            "content sha256 is {actual}, not the declared {}",
            header.digest
        )));
    }
    Ok(())
}

/// The project a blob call names: a job's token acts in its job's project only; a user needs the
/// method's role (viewer to ask, member to upload) in the project named (empty: `default`).
pub(crate) async fn blob_project(store: &Store, caller: &Caller, named: &str) -> Result<String> {
    if let Scope::Job(job_id) = &caller.principal.scope {
        let job = store.job(job_id).await?;
        if !named.is_empty() && named != job.project {
            return Err(kiln_core::authz::Denied::NotFound {
                kind: "project",
                id: named.to_string(),
            }
            .into());
        }
        return Ok(job.project);
    }
    crate::access::project(store, caller, named).await
}

pub(crate) type ChunkStream = std::pin::Pin<Box<dyn Stream<Item = Result<pb::OutputChunk, Status>> + Send>>;

/// Bytes per output chunk sent.
const OUTPUT_CHUNK: usize = 1 << 20;

impl ArtifactsApi {
    async fn list_outputs(
        &self,
        caller: &kiln_core::authz::Caller,
        request: pb::ListOutputsRequest,
    ) -> Result<Vec<pb::OutputFile>> {
        let job = crate::access::job(&self.store, caller, &request.job_id).await?;
        let root = outputs_prefix(&job.id);
        let prefix = if request.prefix.is_empty() {
            root.clone()
        } else {
            let relative = relative_path(&request.prefix)
                .ok_or_else(|| Error::InvalidArgument(format!("prefix {:?} is not a relative path", request.prefix)))?;
            join(&root, &relative)
        };
        let mut listing = self.objects.list(Some(&root));
        let mut files = Vec::new();
        while let Some(meta) = listing.next().await {
            let meta = meta?;
            let in_prefix = meta.location == prefix || meta.location.prefix_matches(&prefix);
            if !in_prefix {
                continue;
            }
            let Some(parts) = meta.location.prefix_match(&root) else {
                continue;
            };
            let path: Vec<String> = parts.map(|part| part.as_ref().to_string()).collect();
            files.push(pb::OutputFile {
                path: path.join("/"),
                size: meta.size,
            });
        }
        files.sort_by(|a, b| a.path.cmp(&b.path));
        Ok(files)
    }

    async fn get_output(
        &self,
        caller: &kiln_core::authz::Caller,
        request: pb::GetOutputRequest,
    ) -> Result<ChunkStream> {
        let job = crate::access::job(&self.store, caller, &request.job_id).await?;
        let relative = relative_path(&request.path)
            .ok_or_else(|| Error::InvalidArgument(format!("path {:?} is not a relative path", request.path)))?;
        let location = join(&outputs_prefix(&job.id), &relative);
        match stream_object(self.objects.as_ref(), &location).await? {
            Some(stream) => Ok(stream),
            None => Err(Error::OutputMissing {
                job_id: job.id,
                path: request.path,
            }),
        }
    }
}

/// Streams an object in chunks of at most [`OUTPUT_CHUNK`] bytes; `None` when it does not exist.
pub(crate) async fn stream_object(
    objects: &dyn ObjectStore,
    location: &object_store::path::Path,
) -> Result<Option<ChunkStream>> {
    let object = match objects.get(location).await {
        Ok(object) => object,
        Err(object_store::Error::NotFound { .. }) => return Ok(None),
        Err(error) => return Err(error.into()),
    };
    let chunks = object.into_stream().flat_map(|bytes| {
        let items: Vec<Result<pb::OutputChunk, Status>> = match bytes {
            Ok(bytes) => bytes
                .chunks(OUTPUT_CHUNK)
                .map(|chunk| Ok(pb::OutputChunk { data: chunk.to_vec() }))
                .collect(),
            Err(error) => vec![Err(Status::from(Error::from(error)))],
        };
        futures::stream::iter(items)
    });
    Ok(Some(Box::pin(chunks)))
}

#[tonic::async_trait]
impl ArtifactService for ArtifactsApi {
    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn list_outputs(
        &self,
        request: Request<pb::ListOutputsRequest>,
    ) -> Result<Response<pb::ListOutputsResponse>, Status> {
        let caller = crate::access::caller(&request)?;
        let files = self.list_outputs(&caller, request.into_inner()).await?;
        Ok(Response::new(pb::ListOutputsResponse { files }))
    }

    type GetOutputStream = ChunkStream;

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn get_output(
        &self,
        request: Request<pb::GetOutputRequest>,
    ) -> Result<Response<Self::GetOutputStream>, Status> {
        let caller = crate::access::caller(&request)?;
        let stream = self.get_output(&caller, request.into_inner()).await?;
        Ok(Response::new(stream))
    }

    #[tracing::instrument(skip_all, fields(digest = %request.get_ref().digest))]
    async fn stat_artifact(
        &self,
        request: Request<pb::StatArtifactRequest>,
    ) -> Result<Response<pb::StatArtifactResponse>, Status> {
        let caller = crate::access::caller(&request)?;
        let request = request.into_inner();
        let project = self.blob_project(&caller, &request.project).await?;
        check_digest(&request.digest)?;
        // Only the project's own blobs: another's reads as absent (and is uploaded again).
        let found = match self.store.artifact(&request.digest).await.map_err(Error::from)? {
            Some(blob)
                if self
                    .store
                    .artifact_in_project(&request.digest, &project)
                    .await
                    .map_err(Error::from)? =>
            {
                Some(blob)
            }
            _ => None,
        };
        Ok(Response::new(pb::StatArtifactResponse {
            exists: found.is_some(),
            size: found.map(|a| u64::try_from(a.size).unwrap_or(0)).unwrap_or(0),
        }))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn save_run_artifact(
        &self,
        request: Request<pb::SaveRunArtifactRequest>,
    ) -> Result<Response<pb::SaveRunArtifactResponse>, Status> {
        let caller = crate::access::caller(&request)?;
        Ok(Response::new(
            self.save_run_artifact(&caller, request.into_inner()).await?,
        ))
    }

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn list_run_artifacts(
        &self,
        request: Request<pb::ListRunArtifactsRequest>,
    ) -> Result<Response<pb::ListRunArtifactsResponse>, Status> {
        let caller = crate::access::caller(&request)?;
        let files = self.list_run_artifacts(&caller, request.into_inner()).await?;
        Ok(Response::new(pb::ListRunArtifactsResponse { files }))
    }

    type GetRunArtifactStream = ChunkStream;

    #[tracing::instrument(skip_all, fields(job_id = %request.get_ref().job_id))]
    async fn get_run_artifact(
        &self,
        request: Request<pb::GetRunArtifactRequest>,
    ) -> Result<Response<Self::GetRunArtifactStream>, Status> {
        let caller = crate::access::caller(&request)?;
        Ok(Response::new(
            self.get_run_artifact(&caller, request.into_inner()).await?,
        ))
    }

    #[tracing::instrument(skip_all)]
    async fn upload_artifact(
        &self,
        request: Request<Streaming<pb::UploadArtifactRequest>>,
    ) -> Result<Response<pb::UploadArtifactResponse>, Status> {
        let caller = crate::access::caller(&request)?;
        let response = self.upload(&caller, request.into_inner()).await?;
        Ok(Response::new(response))
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        /// A digest is accepted exactly when it is 64 lowercase hex characters; a refusal says
        /// what a digest is.
        #[test]
        fn a_digest_is_64_lowercase_hex(digest in "[0-9a-f]{64}|[0-9a-fA-F]{60,68}|.{0,70}") {
            let valid = digest.len() == 64 && digest.bytes().all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
            match check_digest(&digest) {
                Ok(()) => prop_assert!(valid),
                Err(error) => {
                    prop_assert!(!valid);
                    prop_assert!(error.to_string().contains("digest"));
                    prop_assert!(error.to_string().contains("lowercase hex sha256"));
                }
            }
        }
    }
}
