//! `ArtifactService`: content-addressed blobs, stored once per sha256.

use std::sync::Arc;

use futures::StreamExt;
use kiln_core::auth::user_principal;
use kiln_core::objects::{artifact_path, is_sha256_hex};
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

fn check_digest(digest: &str) -> Result<()> {
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
                let part = part.map_err(|status| {
                    Error::InvalidArgument(format!("upload interrupted: {}", status.message()))
                })?;
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

#[tonic::async_trait]
impl ArtifactService for ArtifactsApi {
    #[tracing::instrument(skip_all, fields(digest = %request.get_ref().digest))]
    async fn stat_artifact(
        &self,
        request: Request<pb::StatArtifactRequest>,
    ) -> Result<Response<pb::StatArtifactResponse>, Status> {
        user_principal(&request)?;
        check_digest(&request.get_ref().digest)?;
        let found = self
            .store
            .artifact(&request.get_ref().digest)
            .await
            .map_err(Error::from)?;
        Ok(Response::new(pb::StatArtifactResponse {
            exists: found.is_some(),
            size: found
                .map(|a| u64::try_from(a.size).unwrap_or(0))
                .unwrap_or(0),
        }))
    }

    #[tracing::instrument(skip_all)]
    async fn upload_artifact(
        &self,
        request: Request<Streaming<pb::UploadArtifactRequest>>,
    ) -> Result<Response<pb::UploadArtifactResponse>, Status> {
        let principal = user_principal(&request)?;
        let response = self
            .upload(&principal.user_id, request.into_inner())
            .await?;
        Ok(Response::new(response))
    }
}
