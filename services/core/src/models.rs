//! The model registry's operations, shared by the api (`ModelService`) and the advisor (a
//! sweep's `register: {model, alias}`): [`Registry::register`] makes an immutable,
//! content-addressed version of a model from a job's synced outputs and the artifacts its run
//! saved, with its lineage.
//!
//! A version's files are copied from `outputs/<job>/...` into the blob store's
//! `artifacts/sha256/<digest>` (each file stored once, whoever else names it); its manifest is
//! the sorted list of (path, sha256, size) and its digest is the sha256 of the manifest's
//! canonical JSON. A model belongs to a project and its name is unique there (another project
//! may have a model of the same name). Authorisation is the caller's: the api checks the caller's role in the job's
//! project before calling, the advisor acts for the sweep's owner.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore, ObjectStoreExt};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::objects::{artifact_path, join, outputs_prefix, relative_path};
use crate::store::{JobRecord, ModelVersionRecord, NewArtifact, NewModelVersion, Store, StoreError};
use crate::streams::{Nats, NatsError};

mod error;
mod lineage;
mod names;
mod version;

pub use error::ModelError;
pub use lineage::{DatasetRef, Lineage, latest_values};
pub use names::{validate_alias, validate_model_name, validate_tags};
pub use version::{Version, VersionRef};

/// One file of a version: where it sits in the version, its content's sha256 and size.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManifestEntry {
    pub path: String,
    pub sha256: String,
    pub size: u64,
}

/// The digest of a manifest (entries sorted by path): `sha256:` and the hex sha256 of its JSON.
pub fn manifest_digest(entries: &[ManifestEntry]) -> String {
    let json = serde_json::to_vec(entries).expect("a manifest serialises");
    format!("sha256:{}", hex::encode(Sha256::digest(json)))
}

/// What to register: a version of `model` from `job`'s outputs under `path`.
#[derive(Debug, Clone)]
pub struct RegisterRequest {
    /// The model's name in the job's project.
    pub model: String,
    /// The source job: the model is of its project (made there on its first version).
    pub job: JobRecord,
    /// A file or directory inside the job's outputs; empty for all of them.
    pub path: String,
    pub description: String,
    pub tags: BTreeMap<String, String>,
    /// An alias to point at the new version; empty for none.
    pub alias: String,
    /// The user name recorded as the version's creator.
    pub registered_by: String,
}

/// The registry: the metadata store, the blob store, and NATS (to ask log-ingest for the
/// job's latest metric values).
#[derive(Clone)]
pub struct Registry {
    pub store: Store,
    pub objects: Arc<dyn ObjectStore>,
    pub nats: Nats,
    /// How long to wait for log-ingest's answer about the job's metrics.
    pub metrics_timeout: Duration,
}

/// A file found in a source, to copy into a version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SourceFile {
    /// Its path in the version.
    pub path: String,
    /// Where it is in the blob store.
    pub location: ObjectPath,
    pub size: u64,
}

impl Registry {
    pub fn new(store: Store, objects: Arc<dyn ObjectStore>, nats: Nats) -> Registry {
        Registry {
            store,
            objects,
            nats,
            // Beyond log-ingest's default read wait (5 s), which its answer may spend waiting
            // for the writers to store the job's last points.
            metrics_timeout: Duration::from_secs(10),
        }
    }

    /// Registers a new version: validates the names, lists the source's files, copies each into
    /// a content-addressed blob, builds the lineage, and records the version (numbered one past
    /// the model's latest) with its tags and alias, in one transaction.
    pub async fn register(&self, request: RegisterRequest) -> Result<Version, ModelError> {
        validate_model_name(&request.model)?;
        validate_tags(&request.tags, false)?;
        if !request.alias.is_empty() {
            validate_alias(&request.alias)?;
        }
        let job = &request.job;
        let state = job.state()?;
        if !state.is_terminal() {
            return Err(ModelError::JobNotEnded {
                job_id: job.id.clone(),
                state: state.as_str().to_string(),
            });
        }
        let sources = source_files(&self.store, self.objects.as_ref(), job, &request.path).await?;
        let mut manifest = Vec::with_capacity(sources.len());
        for source in &sources {
            manifest.push(self.store_blob(source, &request.registered_by, &job.project).await?);
        }
        manifest.sort_by(|a, b| a.path.cmp(&b.path));
        let metrics = latest_values(&self.nats, &job.id, self.metrics_timeout).await?;
        let lineage = lineage::build(&self.store, job, metrics, &request.path).await?;
        let new = NewModelVersion {
            model: request.model.clone(),
            project: job.project.clone(),
            created_by: request.registered_by.clone(),
            job_id: job.id.clone(),
            description: request.description.clone(),
            lineage_json: serde_json::to_string(&lineage).map_err(|e| ModelError::Corrupt(e.to_string()))?,
            digest: manifest_digest(&manifest),
            files: manifest
                .iter()
                .map(|entry| (entry.path.clone(), entry.sha256.clone(), entry.size as i64))
                .collect(),
            tags: request.tags.clone(),
            alias: (!request.alias.is_empty()).then(|| request.alias.clone()),
        };
        let record: ModelVersionRecord = self.store.insert_model_version(new).await?;
        tracing::info!(model = %record.model, project = %record.project, version = record.version,
            digest = %record.digest, files = manifest.len(), job_id = %job.id, "model version registered");
        Version::read(&self.store, &record.key(), VersionRef::Number(record.version)).await
    }

    /// Hashes a source file as it streams and copies it to its content-addressed blob (unless a
    /// blob of that content is stored already); records the blob.
    async fn store_blob(
        &self,
        source: &SourceFile,
        registered_by: &str,
        project: &str,
    ) -> Result<ManifestEntry, ModelError> {
        let mut hasher = Sha256::new();
        let mut size = 0u64;
        let mut chunks = self.objects.get(&source.location).await?.into_stream();
        while let Some(chunk) = chunks.next().await {
            let chunk = chunk?;
            size += chunk.len() as u64;
            hasher.update(&chunk);
        }
        let sha256 = hex::encode(hasher.finalize());
        let blob = artifact_path(&sha256);
        match self.objects.head(&blob).await {
            Ok(_) => {}
            Err(object_store::Error::NotFound { .. }) => self.objects.copy(&source.location, &blob).await?,
            Err(error) => return Err(error.into()),
        }
        self.store
            .insert_artifact(NewArtifact {
                digest: sha256.clone(),
                size: size as i64,
                created_by: registered_by.to_string(),
                project: project.to_string(),
            })
            .await?;
        Ok(ManifestEntry {
            path: source.path.clone(),
            sha256,
            size,
        })
    }
}

/// The files a version of `job` under `path` is made of, from its two sources: the outputs it
/// synced (`outputs/<job>/...`, at their paths) and the artifacts the run saved with `kiln.save`
/// (at `NAME` for a file, `NAME/...` for a directory). `path` selects a file (named by its last
/// part) or every file under a directory (by their paths below it); empty, everything. A path
/// both sources hold is refused rather than one of the two files dropped.
pub async fn source_files(
    store: &Store,
    objects: &dyn ObjectStore,
    job: &JobRecord,
    path: &str,
) -> Result<Vec<SourceFile>, ModelError> {
    let selected = if path.is_empty() {
        None
    } else {
        Some(relative_path(path).ok_or_else(|| ModelError::InvalidPath { path: path.to_string() })?)
    };
    let mut files = output_files(objects, job, selected.as_ref()).await?;
    let selected_text = selected.as_ref().map(|p| p.as_ref()).unwrap_or_default();
    files.extend(saved_files(store, job, selected_text).await?);
    if files.is_empty() {
        return Err(ModelError::NoOutputs {
            job_id: job.id.clone(),
            path: path.to_string(),
        });
    }
    files.sort_by(|a, b| a.path.cmp(&b.path));
    if let Some(pair) = files.windows(2).find(|pair| pair[0].path == pair[1].path) {
        return Err(ModelError::Invalid(format!(
            "job {} has both an output and a saved artifact at {}; register one of them with --from {}:PATH",
            job.id, pair[0].path, job.id
        )));
    }
    Ok(files)
}

/// The synced outputs of `job` under `selected` (a checked relative path; `None` for all).
async fn output_files(
    objects: &dyn ObjectStore,
    job: &JobRecord,
    selected: Option<&ObjectPath>,
) -> Result<Vec<SourceFile>, ModelError> {
    let root = outputs_prefix(&job.id);
    let base = match selected {
        None => root.clone(),
        Some(selected) => join(&root, selected),
    };
    let mut listing = objects.list(Some(&base));
    let mut files = Vec::new();
    while let Some(meta) = listing.next().await {
        let meta = meta?;
        let below: Vec<String> = match meta.location.prefix_match(&base) {
            Some(parts) => parts.map(|part| part.as_ref().to_string()).collect(),
            None => continue,
        };
        let in_version = if below.is_empty() {
            // `selected` names this file itself.
            meta.location.filename().unwrap_or_default().to_string()
        } else {
            below.join("/")
        };
        files.push(SourceFile {
            path: in_version,
            location: meta.location,
            size: meta.size,
        });
    }
    if files.is_empty() && selected.is_some() {
        // `selected` may name a single file.
        match objects.head(&base).await {
            Ok(meta) => files.push(SourceFile {
                path: meta.location.filename().unwrap_or_default().to_string(),
                location: meta.location,
                size: meta.size,
            }),
            Err(object_store::Error::NotFound { .. }) => {}
            Err(error) => return Err(error.into()),
        }
    }
    Ok(files)
}

/// The files the run saved (`kiln.save`) under `selected`, read from their blobs.
async fn saved_files(store: &Store, job: &JobRecord, selected: &str) -> Result<Vec<SourceFile>, ModelError> {
    let mut files = Vec::new();
    for saved in store.run_artifact_files(&job.id).await? {
        let full = if saved.path.is_empty() {
            saved.name.clone()
        } else {
            format!("{}/{}", saved.name, saved.path)
        };
        let in_version = if selected.is_empty() {
            full
        } else if full == selected {
            full.rsplit('/').next().unwrap_or_default().to_string()
        } else if let Some(below) = full.strip_prefix(selected).and_then(|rest| rest.strip_prefix('/')) {
            below.to_string()
        } else {
            continue;
        };
        files.push(SourceFile {
            path: in_version,
            location: artifact_path(&saved.digest),
            size: saved.size as u64,
        });
    }
    Ok(files)
}

impl From<NatsError> for ModelError {
    fn from(error: NatsError) -> Self {
        ModelError::Nats(error)
    }
}

impl From<StoreError> for ModelError {
    fn from(error: StoreError) -> Self {
        ModelError::Store(error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_digest_is_of_the_sorted_manifest() {
        let entry = |path: &str| ManifestEntry {
            path: path.into(),
            sha256: "a".repeat(64),
            size: 3,
        };
        let digest = manifest_digest(&[entry("a"), entry("b")]);
        assert!(digest.starts_with("sha256:") && digest.len() == 71, "{digest}");
        assert_ne!(digest, manifest_digest(&[entry("b"), entry("a")]));
        assert_eq!(digest, manifest_digest(&[entry("a"), entry("b")]));
    }
}
