//! A version's lineage: where it came from, recorded when it is registered.

use std::collections::BTreeMap;
use std::time::Duration;

use prost::Message;
use serde::{Deserialize, Serialize};

use super::ModelError;
use crate::runs::RunConfig;
use crate::store::{JobRecord, Store};
use crate::streams::{Nats, request};
use crate::subjects;

/// A dataset a job mounted, with the archive it named then.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DatasetRef {
    pub name: String,
    pub digest: String,
}

/// Where a version came from.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct Lineage {
    pub job_id: String,
    /// The sweep the job was a trial of; empty when none.
    pub sweep_id: String,
    pub config: RunConfig,
    /// Each metric key's latest value (finite values; a NaN or infinite one is left out).
    pub metrics: BTreeMap<String, f64>,
    pub image: String,
    pub code_digest: String,
    pub datasets: Vec<DatasetRef>,
    /// The name of the user who ran the job.
    pub job_owner: String,
    pub project: String,
    /// The path in the job's outputs the files came from; empty for all of them.
    pub source_path: String,
}

/// Builds the lineage of a version of `job`'s files: the one place it is put together.
pub(super) async fn build(
    store: &Store,
    job: &JobRecord,
    metrics: BTreeMap<String, f64>,
    source_path: &str,
) -> Result<Lineage, ModelError> {
    let mut datasets = Vec::new();
    for name in job.datasets()? {
        // A dataset deleted since the job ran keeps its name, without a digest.
        let digest = store
            .dataset_named(&job.project, &name)
            .await?
            .map(|d| d.digest)
            .unwrap_or_default();
        datasets.push(DatasetRef { name, digest });
    }
    let owner = store.user_by_id(&job.owner_id).await?;
    Ok(Lineage {
        job_id: job.id.clone(),
        sweep_id: job.sweep_id.clone(),
        config: job.config()?,
        metrics: metrics.into_iter().filter(|(_, value)| value.is_finite()).collect(),
        image: job.image.clone(),
        code_digest: job.code_digest.clone(),
        datasets,
        job_owner: owner.map(|user| user.name).unwrap_or_else(|| job.owner_id.clone()),
        project: job.project.clone(),
        source_path: source_path.to_string(),
    })
}

/// Asks log-ingest for a job's latest value of every metric key (on
/// [`subjects::INGEST_LATEST_VALUES`]).
pub async fn latest_values(nats: &Nats, job_id: &str, timeout: Duration) -> Result<BTreeMap<String, f64>, ModelError> {
    let asked = kiln_proto::v1::LatestValuesRequest {
        job_id: job_id.to_string(),
    };
    let answer = request(
        nats,
        subjects::INGEST_LATEST_VALUES,
        asked.encode_to_vec().into(),
        timeout,
    )
    .await?
    .ok_or_else(|| ModelError::MetricsUnavailable {
        job_id: job_id.to_string(),
        waited: timeout,
    })?;
    let reply =
        kiln_proto::v1::LatestValuesReply::decode(answer.as_ref()).map_err(|error| ModelError::MetricsFailed {
            job_id: job_id.to_string(),
            message: format!("unreadable answer: {error}"),
        })?;
    if !reply.error.is_empty() {
        return Err(ModelError::MetricsFailed {
            job_id: job_id.to_string(),
            message: reply.error,
        });
    }
    Ok(reply.values.into_iter().collect())
}

impl Lineage {
    pub fn to_proto(&self) -> kiln_proto::v1::Lineage {
        kiln_proto::v1::Lineage {
            job_id: self.job_id.clone(),
            sweep_id: self.sweep_id.clone(),
            config: crate::runs::config_to_proto(&self.config),
            metrics: self.metrics.iter().map(|(k, v)| (k.clone(), *v)).collect(),
            image: self.image.clone(),
            code_digest: self.code_digest.clone(),
            datasets: self
                .datasets
                .iter()
                .map(|d| kiln_proto::v1::DatasetRef {
                    name: d.name.clone(),
                    digest: d.digest.clone(),
                })
                .collect(),
            job_owner: self.job_owner.clone(),
            project: self.project.clone(),
            source_path: self.source_path.clone(),
        }
    }
}
