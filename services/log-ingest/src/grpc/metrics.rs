//! A job's metric points: writing them to `KILN_METRICS` within the per-job key limit, and
//! reading series and latest values.

use std::collections::HashSet;

use kiln_core::authz::Caller;
use kiln_formats::columns::{append_columns, split_columns};
use kiln_proto::v1 as pb;
use prost::Message;

use super::checks::{check_write_metrics, invalid};
use super::{LogsApi, MAX_KEYS_PER_JOB};
use crate::error::Error;

/// Points per message published: about 25 bytes each in columns, well under NATS' default
/// payload limit of 1 MiB.
const POINTS_PER_MESSAGE: usize = 16_384;
/// Jobs whose metric keys are kept in memory, at most (then the cache starts over).
const KEY_CACHE_JOBS: usize = 1024;
/// Default and largest `max_points` of a query.
const DEFAULT_MAX_POINTS: usize = 1000;
const LARGEST_MAX_POINTS: usize = 100_000;

impl LogsApi {
    pub(super) async fn write_metrics(&self, caller: &Caller, request: pb::WriteMetricsRequest) -> Result<u32, Error> {
        let keys = check_write_metrics(&request)?;
        let job = self.visible_job(caller, &request.job_id).await?;
        self.admit_keys(&job.id, &keys.iter().map(String::as_str).collect::<Vec<_>>())
            .await?;
        let columns = request.columns.unwrap_or_default();
        let mut all = pb::MetricColumns::default();
        append_columns(&mut all, request.points, columns, kiln_core::ids::now_ms()).map_err(invalid)?;
        let accepted = u32::try_from(all.steps.len()).unwrap_or(u32::MAX);
        // Answered once durable: every part is acknowledged by JetStream. Points are keyed by
        // (job, key, step), so a retried request stores nothing twice.
        for part in split_columns(&all, POINTS_PER_MESSAGE).map_err(invalid)? {
            let batch = pb::MetricBatch {
                job_id: job.id.clone(),
                attempt: job.attempt,
                points: Vec::new(),
                columns: Some(part),
            };
            let msg_id = kiln_core::ids::new_id();
            kiln_core::streams::publish(
                &self.nats.jetstream,
                kiln_core::subjects::metrics(&job.id),
                &msg_id,
                batch.encode_to_vec().into(),
            )
            .await?;
        }
        Ok(accepted)
    }

    /// Refuses keys that would take a job over [`MAX_KEYS_PER_JOB`]. The keys a job has are read
    /// from the store once, then kept in memory (for a bounded number of jobs): another replica's
    /// new keys are seen when this one reads the job again.
    async fn admit_keys(&self, job_id: &str, keys: &[&str]) -> Result<(), Error> {
        let cached = {
            let known = self.known_keys.lock().expect("the key cache is never poisoned");
            known.get(job_id).map(|set| keys.iter().all(|key| set.contains(*key)))
        };
        if cached == Some(true) {
            return Ok(());
        }
        if cached.is_none() {
            let stored: HashSet<String> = self.points.keys(job_id).await?.into_iter().collect();
            let mut known = self.known_keys.lock().expect("the key cache is never poisoned");
            if known.len() >= KEY_CACHE_JOBS {
                known.clear();
            }
            known.entry(job_id.to_string()).or_default().extend(stored);
        }
        let mut known = self.known_keys.lock().expect("the key cache is never poisoned");
        let set = known.entry(job_id.to_string()).or_default();
        let new = keys.iter().filter(|key| !set.contains(**key)).count();
        if set.len() + new > MAX_KEYS_PER_JOB {
            return Err(Error::TooLarge(format!(
                "job {job_id} would have {} metric keys; the limit is {MAX_KEYS_PER_JOB} keys per job",
                set.len() + new
            )));
        }
        set.extend(keys.iter().map(|key| (*key).to_string()));
        Ok(())
    }

    /// The keys to read of a job: those asked for, or all it has.
    async fn keys_of(&self, job_id: &str, keys: &[String]) -> Result<Vec<String>, Error> {
        if keys.is_empty() {
            self.points.keys(job_id).await
        } else {
            Ok(keys.to_vec())
        }
    }

    pub(super) async fn query_metrics(
        &self,
        caller: &Caller,
        request: pb::QueryMetricsRequest,
    ) -> Result<Vec<pb::MetricSeries>, Error> {
        let max_points = match request.max_points {
            0 => DEFAULT_MAX_POINTS,
            n => (n as usize).min(LARGEST_MAX_POINTS),
        };
        // The sampler gives each bucket two points (its lowest and highest): bands want
        // max_points buckets.
        let sampled_points = if request.bands { max_points * 2 } else { max_points };
        let min_step = request.min_step.unwrap_or(i64::MIN);
        let max_step = request.max_step.unwrap_or(i64::MAX);
        let mut jobs = Vec::with_capacity(request.job_ids.len());
        for job_id in &request.job_ids {
            jobs.push(self.visible_job(caller, job_id).await?);
        }
        self.caught_up().await;
        let mut out = Vec::new();
        for job in jobs {
            for key in self.keys_of(&job.id, &request.keys).await? {
                let series = self
                    .points
                    .series(&job.id, &key, min_step, max_step, sampled_points)
                    .await?;
                let (points, bands) = if request.bands {
                    (Vec::new(), Some(bands_to_proto(&series.bands)))
                } else {
                    (series.points.into_iter().map(to_proto).collect(), None)
                };
                out.push(pb::MetricSeries {
                    job_id: job.id.clone(),
                    points,
                    key,
                    total_points: series.total,
                    bands,
                });
            }
        }
        Ok(out)
    }

    pub(super) async fn latest_metrics(
        &self,
        caller: &Caller,
        request: pb::LatestMetricsRequest,
    ) -> Result<Vec<pb::MetricSeries>, Error> {
        let mut jobs = Vec::with_capacity(request.job_ids.len());
        for job_id in &request.job_ids {
            jobs.push(self.visible_job(caller, job_id).await?);
        }
        self.caught_up().await;
        let mut out = Vec::new();
        for job in jobs {
            for key in self.keys_of(&job.id, &request.keys).await? {
                if let Some(point) = self.points.latest(&job.id, &key).await? {
                    out.push(pb::MetricSeries {
                        job_id: job.id.clone(),
                        key,
                        points: vec![to_proto(point)],
                        total_points: 1,
                        bands: None,
                    });
                }
            }
        }
        Ok(out)
    }
}

fn bands_to_proto(bands: &[crate::points::Band]) -> pb::MetricBands {
    pb::MetricBands {
        steps: bands.iter().map(|band| band.step).collect(),
        timestamps_ms: bands.iter().map(|band| band.timestamp_ms).collect(),
        mins: bands.iter().map(|band| band.min).collect(),
        maxs: bands.iter().map(|band| band.max).collect(),
        lasts: bands.iter().map(|band| band.last).collect(),
    }
}

fn to_proto(point: crate::points::Point) -> pb::MetricPoint {
    pb::MetricPoint {
        key: point.key.to_string(),
        step: point.step,
        value: point.value,
        timestamp_ms: point.timestamp_ms,
    }
}
