//! A version as it is read back: its record, manifest, lineage, tags and aliases.

use std::collections::BTreeMap;

use super::{Lineage, ManifestEntry, ModelError};
use crate::store::{ModelKey, ModelRecord, ModelVersionRecord, Store};

/// How a call names a version: `NAME:3`, `NAME@production`, or `NAME` (the latest).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VersionRef {
    Number(i64),
    Alias(String),
    Latest,
}

impl VersionRef {
    /// From a request's `version` and `alias` fields (0 and empty: the latest).
    pub fn from_fields(version: i64, alias: &str) -> Result<VersionRef, ModelError> {
        match (version, alias.is_empty()) {
            (0, true) => Ok(VersionRef::Latest),
            (0, false) => Ok(VersionRef::Alias(alias.to_string())),
            (n, true) if n > 0 => Ok(VersionRef::Number(n)),
            (n, true) => Err(ModelError::Invalid(format!("version {n} must be 1 or more"))),
            (_, false) => Err(ModelError::Invalid("give a version or an alias, not both".into())),
        }
    }
}

/// A version with everything recorded about it.
#[derive(Debug, Clone, PartialEq)]
pub struct Version {
    pub record: ModelVersionRecord,
    pub files: Vec<ManifestEntry>,
    pub lineage: Lineage,
    pub tags: BTreeMap<String, String>,
    /// The aliases pointing at it, sorted.
    pub aliases: Vec<String>,
}

impl Version {
    /// Reads a model's record, or says it does not exist.
    pub async fn model(store: &Store, key: &ModelKey) -> Result<ModelRecord, ModelError> {
        store
            .model(&key.project, &key.name)
            .await?
            .ok_or_else(|| ModelError::ModelNotFound { name: key.name.clone() })
    }

    /// The number `reference` names in `model`, checked to exist.
    pub async fn resolve(store: &Store, model: &ModelRecord, reference: &VersionRef) -> Result<i64, ModelError> {
        let name = &model.name;
        let number = match reference {
            VersionRef::Number(number) => *number,
            VersionRef::Alias(alias) => {
                store
                    .model_alias(&model.key(), alias)
                    .await?
                    .ok_or_else(|| ModelError::AliasNotFound {
                        name: name.clone(),
                        alias: alias.clone(),
                    })?
            }
            VersionRef::Latest if model.latest_version == 0 => {
                return Err(ModelError::VersionNotFound {
                    name: name.clone(),
                    version: 0,
                });
            }
            VersionRef::Latest => model.latest_version,
        };
        if number < 1 || number > model.latest_version {
            return Err(ModelError::VersionNotFound {
                name: name.clone(),
                version: number,
            });
        }
        Ok(number)
    }

    /// Reads one version in full.
    pub async fn read(store: &Store, key: &ModelKey, reference: VersionRef) -> Result<Version, ModelError> {
        let model = Version::model(store, key).await?;
        let number = Version::resolve(store, &model, &reference).await?;
        let record = store
            .model_version(key, number)
            .await?
            .ok_or_else(|| ModelError::VersionNotFound {
                name: key.name.clone(),
                version: number,
            })?;
        let aliases = store.model_aliases(key).await?;
        let mut tags = store.model_tags(key, &[number]).await?;
        let files = store
            .model_files(key, number)
            .await?
            .into_iter()
            .map(|file| ManifestEntry {
                path: file.path,
                sha256: file.sha256,
                size: u64::try_from(file.size).unwrap_or(0),
            })
            .collect();
        Version::assemble(record, files, tags.remove(&number).unwrap_or_default(), &aliases)
    }

    /// Puts a version together from its parts (listings read tags and aliases for a page at once).
    pub fn assemble(
        record: ModelVersionRecord,
        files: Vec<ManifestEntry>,
        tags: BTreeMap<String, String>,
        aliases: &BTreeMap<String, i64>,
    ) -> Result<Version, ModelError> {
        let lineage: Lineage = serde_json::from_str(&record.lineage_json)
            .map_err(|error| ModelError::Corrupt(format!("lineage of {}:{}: {error}", record.model, record.version)))?;
        let aliases = aliases
            .iter()
            .filter(|(_, version)| **version == record.version)
            .map(|(alias, _)| alias.clone())
            .collect();
        Ok(Version {
            record,
            files,
            lineage,
            tags,
            aliases,
        })
    }

    pub fn to_proto(&self) -> kiln_proto::v1::ModelVersion {
        let record = &self.record;
        kiln_proto::v1::ModelVersion {
            model: record.model.clone(),
            version: record.version,
            digest: record.digest.clone(),
            files: self
                .files
                .iter()
                .map(|file| kiln_proto::v1::ModelFile {
                    path: file.path.clone(),
                    sha256: file.sha256.clone(),
                    size: file.size,
                })
                .collect(),
            lineage: Some(self.lineage.to_proto()),
            tags: self.tags.clone().into_iter().collect(),
            aliases: self.aliases.clone(),
            created_by: record.created_by.clone(),
            created_at_ms: record.created_at_ms,
            description: record.description.clone(),
            size: u64::try_from(record.size).unwrap_or(0),
            project: record.project.clone(),
        }
    }
}
