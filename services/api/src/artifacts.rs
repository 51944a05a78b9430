//! `ArtifactService`: content-addressed blobs, stored once per sha256.

use std::sync::Arc;

use futures::Stream;
use futures::StreamExt;
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
    async fn upload(
        &self,
        user_id: &str,
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
        check_digest(&header.digest)?;
        if header.size > self.max_bytes {
            return Err(Error::TooLarge(format!(
                "artifact is {} bytes; the limit is {} bytes (max-artifact-bytes)",
                header.size, self.max_bytes
            )));
        }
        if let Some(existing) = self.store.artifact(&header.digest).await? {
            return Ok(pb::UploadArtifactResponse {
                digest: existing.digest,
                size: u64::try_from(existing.size).unwrap_or(0),
                created: false,
            });
        }
        // Stream into a multipart upload that only becomes visible once the digest checks out.
        let path = artifact_path(&header.digest);
        let mut writer = WriteMultipart::new(self.objects.put_multipart(&path).await?);
        let mut hasher = Sha256::new();
        let mut received: u64 = 0;
        let outcome: Result<()> = async {
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
                // At most 4 parts in flight: a fast client never fills the api's memory.
                writer.wait_for_capacity(4).await?;
                writer.write(&chunk);
            }
            if received != header.size {
                return Err(Error::InvalidArgument(format!(
                    "upload ended after {received} of {} bytes",
                    header.size
                )));
            }
            let actual = hex::encode(hasher.finalize_reset());
            if actual != header.digest {
                return Err(Error::InvalidArgument(format!(
                    "content sha256 is {actual}, not the declared {}",
                    header.digest
                )));
            }
            Ok(())
        }
        .await;
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
                created_by: user_id.to_string(),
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
        crate::access::caller(&request)?;
        check_digest(&request.get_ref().digest)?;
        let found = self
            .store
            .artifact(&request.get_ref().digest)
            .await
            .map_err(Error::from)?;
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
        let response = self.upload(caller.user_id(), request.into_inner()).await?;
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
