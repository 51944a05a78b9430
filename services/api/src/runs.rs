//! Run tracking: `UpdateRun` (a run's config and summary values) and the artifacts a run saves
//! (`SaveRunArtifact`, `ListRunArtifacts`, `GetRunArtifact`).

use std::collections::{BTreeSet, HashMap};

use kiln_core::authz::Caller;
use kiln_core::objects::{artifact_path, relative_path};
use kiln_core::runs::{ConfigValue, RunConfig};
use kiln_core::store::{JobRecord, RunArtifactFile};
use kiln_proto::v1 as pb;

use crate::artifacts::{ArtifactsApi, ChunkStream, check_digest, stream_object};
use crate::error::{Error, Result};
use crate::jobs::JobsApi;

/// Longest config or summary key, and string value.
const MAX_KEY_CHARS: usize = 256;
const MAX_STRING_CHARS: usize = 4096;
/// Most keys one request sets.
const MAX_KEYS: usize = 1000;
/// Most files of one saved artifact (a request of that many stays under gRPC's 4 MiB).
const MAX_FILES: usize = 20_000;
/// Longest artifact name.
const MAX_NAME_CHARS: usize = 256;

/// Checks the values of a config or summary (`what`) and returns them as a [`RunConfig`].
pub(crate) fn validate_values(what: &str, values: HashMap<String, pb::ConfigValue>) -> Result<RunConfig> {
    if values.len() > MAX_KEYS {
        return Err(Error::InvalidArgument(format!(
            "{what} has {} keys; at most {MAX_KEYS} at once",
            values.len()
        )));
    }
    let mut config = RunConfig::new();
    for (key, value) in values {
        if key.is_empty() || key.chars().count() > MAX_KEY_CHARS || key.chars().any(char::is_control) {
            return Err(Error::InvalidArgument(format!(
                "{what} key {key:?} must be 1 to {MAX_KEY_CHARS} characters without control characters"
            )));
        }
        let value = ConfigValue::from_proto(&value)
            .ok_or_else(|| Error::InvalidArgument(format!("{what} key {key:?} has no value")))?;
        match &value {
            ConfigValue::Float(number) if !number.is_finite() => {
                return Err(Error::InvalidArgument(format!(
                    "{what} key {key:?} is {number}; values must be finite"
                )));
            }
            ConfigValue::Str(text) if text.chars().count() > MAX_STRING_CHARS => {
                return Err(Error::InvalidArgument(format!(
                    "{what} key {key:?} is longer than {MAX_STRING_CHARS} characters"
                )));
            }
            _ => {}
        }
        config.insert(key, value);
    }
    Ok(config)
}

impl JobsApi {
    /// Merges config and summary values into the caller's run.
    pub(crate) async fn update_run(&self, caller: &Caller, request: pb::UpdateRunRequest) -> Result<JobRecord> {
        let job = crate::access::job(&self.store, caller, &request.job_id).await?;
        let config = validate_values("config", request.config)?;
        let summary = validate_values("summary", request.summary)?;
        Ok(self.store.update_run(&job.id, &config, &summary).await?)
    }
}

/// Checks an artifact name: one path component.
fn validate_name(name: &str) -> Result<()> {
    let bad = name.is_empty()
        || name == "."
        || name == ".."
        || name.chars().count() > MAX_NAME_CHARS
        || name.contains('/')
        || name.chars().any(char::is_control);
    if bad {
        return Err(Error::InvalidArgument(format!(
            "artifact name {name:?} must be 1 to {MAX_NAME_CHARS} characters, without '/' or control characters, and not . or .."
        )));
    }
    Ok(())
}

fn file_to_proto(file: RunArtifactFile) -> pb::RunArtifactFile {
    pb::RunArtifactFile {
        name: file.name,
        path: file.path,
        digest: file.digest,
        size: u64::try_from(file.size).unwrap_or(0),
    }
}

impl ArtifactsApi {
    pub(crate) async fn save_run_artifact(
        &self,
        caller: &Caller,
        request: pb::SaveRunArtifactRequest,
    ) -> Result<pb::SaveRunArtifactResponse> {
        let job = crate::access::job(&self.store, caller, &request.job_id).await?;
        validate_name(&request.name)?;
        if request.files.is_empty() || request.files.len() > MAX_FILES {
            return Err(Error::InvalidArgument(format!(
                "an artifact has 1 to {MAX_FILES} files; this one has {}",
                request.files.len()
            )));
        }
        let single = request.files.len() == 1 && request.files[0].path.is_empty();
        let mut paths = BTreeSet::new();
        let mut files = Vec::with_capacity(request.files.len());
        let mut bytes = 0u64;
        for file in request.files {
            let path = if single {
                String::new()
            } else {
                relative_path(&file.path)
                    .ok_or_else(|| {
                        Error::InvalidArgument(format!(
                            "file path {:?} of artifact {} is not a relative path (a directory's files each need one)",
                            file.path, request.name
                        ))
                    })?
                    .to_string()
            };
            if !paths.insert(path.clone()) {
                return Err(Error::InvalidArgument(format!(
                    "artifact {} names the file {path} twice",
                    request.name
                )));
            }
            check_digest(&file.digest)?;
            // A blob of the job's project, or of one the caller reads (a blob out of reach reads
            // as one never uploaded).
            let stored = caller.usable_blob(&self.store, &file.digest, &job.project).await?;
            if stored.as_ref().and_then(|blob| u64::try_from(blob.size).ok()) != Some(file.size) {
                return Err(Error::BlobMissing {
                    digest: file.digest,
                    size: file.size,
                });
            }
            bytes += file.size;
            files.push(RunArtifactFile {
                name: request.name.clone(),
                path,
                digest: file.digest,
                size: i64::try_from(file.size).unwrap_or(i64::MAX),
            });
        }
        self.store.save_run_artifact(&job.id, &request.name, &files).await?;
        tracing::info!(job_id = %job.id, name = %request.name, files = files.len(), bytes, "run artifact saved");
        Ok(pb::SaveRunArtifactResponse {
            files: u32::try_from(files.len()).unwrap_or(u32::MAX),
            bytes,
        })
    }

    pub(crate) async fn list_run_artifacts(
        &self,
        caller: &Caller,
        request: pb::ListRunArtifactsRequest,
    ) -> Result<Vec<pb::RunArtifactFile>> {
        let job = crate::access::job(&self.store, caller, &request.job_id).await?;
        Ok(self
            .store
            .run_artifact_files(&job.id)
            .await?
            .into_iter()
            .filter(|file| request.name.is_empty() || file.name == request.name)
            .map(file_to_proto)
            .collect())
    }

    pub(crate) async fn get_run_artifact(
        &self,
        caller: &Caller,
        request: pb::GetRunArtifactRequest,
    ) -> Result<ChunkStream> {
        let job = crate::access::job(&self.store, caller, &request.job_id).await?;
        let missing = || Error::RunArtifactMissing {
            job_id: job.id.clone(),
            name: request.name.clone(),
            path: request.path.clone(),
        };
        let path = if request.path.is_empty() {
            String::new()
        } else {
            relative_path(&request.path)
                .ok_or_else(|| Error::InvalidArgument(format!("path {:?} is not a relative path", request.path)))?
                .to_string()
        };
        let file = self
            .store
            .run_artifact_file(&job.id, &request.name, &path)
            .await?
            .ok_or_else(missing)?;
        stream_object(self.objects.as_ref(), &artifact_path(&file.digest))
            .await?
            .ok_or_else(|| Error::Internal(format!("the blob {} of a saved artifact is gone", file.digest)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(value: pb::config_value::Value) -> pb::ConfigValue {
        pb::ConfigValue { value: Some(value) }
    }

    #[test]
    fn bad_values_are_refused_with_the_key_named() {
        use pb::config_value::Value;
        let nan = HashMap::from([("lr".to_string(), value(Value::FloatValue(f64::NAN)))]);
        assert!(
            validate_values("config", nan)
                .unwrap_err()
                .to_string()
                .contains("\"lr\" is NaN")
        );
        let empty = HashMap::from([("opt".to_string(), pb::ConfigValue { value: None })]);
        assert!(
            validate_values("summary", empty)
                .unwrap_err()
                .to_string()
                .contains("summary key \"opt\" has no value")
        );
        let unnamed = HashMap::from([(String::new(), value(Value::IntValue(1)))]);
        assert!(validate_values("config", unnamed).is_err());
        let good = HashMap::from([("a.b".to_string(), value(Value::IntValue(3)))]);
        assert_eq!(validate_values("config", good).unwrap()["a.b"], ConfigValue::Int(3));
    }

    #[test]
    fn names_are_one_component() {
        for bad in ["", ".", "..", "a/b", "x\n"] {
            assert!(validate_name(bad).is_err(), "{bad:?}");
        }
        validate_name("model.pt").unwrap();
    }
}
