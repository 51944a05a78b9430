//! A batch's spec: checked and given its defaults at CreateBatch, stored as JSON.

use std::collections::BTreeMap;

use kiln_core::capacity::{DiskShmProblem, MAX_GPUS, MIN_JOB_DISK_BYTES, check_disk_and_shm};
use kiln_proto::v1 as pb;
use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};
use crate::retry::Rule;
use crate::template;

pub const DEFAULT_MAX_ATTEMPTS: u32 = 3;
pub const DEFAULT_ITEM_TIMEOUT_SECS: u64 = 3600;
pub const DEFAULT_MAX_WORKERS: u32 = 4;
pub const DEFAULT_CPU_MILLIS: u32 = 1000;
pub const DEFAULT_MEMORY_MB: u64 = 1024;
/// Bounds that keep a typo from asking for the impossible.
const LARGEST_MAX_WORKERS: u32 = 10_000;
const LARGEST_MAX_ATTEMPTS: u32 = 100;
/// The agent's own bound on the items it runs at once.
pub const LARGEST_SLOTS: u32 = 256;
/// Longest output prefix (a path or a URI prefix, followed by each item's key).
const MAX_OUTPUT_PREFIX_BYTES: usize = 1024;

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Spec {
    pub name: String,
    pub project: String,
    pub image: String,
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub cpu_millis: u32,
    pub memory_mb: u64,
    pub output_prefix: String,
    pub max_attempts: u32,
    pub item_timeout_secs: u64,
    pub max_workers: u32,
    pub market: i32,
    /// The pool the workers run on; empty for any.
    #[serde(default)]
    pub pool: String,
    /// Names of the project's secrets every worker gets as environment variables.
    #[serde(default)]
    pub secrets: Vec<String>,
    /// What failed attempts lead to, first match wins (none: retried).
    #[serde(default)]
    pub retry_rules: Vec<Rule>,
    /// GPUs per worker.
    #[serde(default)]
    pub gpus: u32,
    /// Items a worker runs at once.
    #[serde(default = "one")]
    pub slots: u32,
    /// A disk of its own per worker, in bytes (0: none).
    #[serde(default)]
    pub disk_bytes: u64,
    /// /dev/shm per worker, in bytes (0: Docker's default).
    #[serde(default)]
    pub shm_bytes: u64,
}

fn one() -> u32 {
    1
}

impl Spec {
    /// Checks a requested spec and fills in its defaults.
    pub fn from_proto(spec: Option<pb::BatchSpec>) -> Result<Spec> {
        let spec = spec.ok_or_else(|| Error::InvalidArgument("spec is missing".into()))?;
        template::validate(&spec.command).map_err(|e| Error::InvalidArgument(e.to_string()))?;
        if spec.name.len() > 200 || spec.name.chars().any(char::is_control) {
            return Err(Error::InvalidArgument(
                "name must be at most 200 bytes, without control characters".into(),
            ));
        }
        if let Some(key) = spec
            .env
            .keys()
            .find(|k| k.is_empty() || k.contains(['=', '\0']) || k.starts_with("KILN_"))
        {
            return Err(Error::InvalidArgument(format!(
                "env name {key:?}: env names must be non-empty, without '=' or NUL, and not start with KILN_ (kiln sets those)"
            )));
        }
        if let Some(key) = spec.env.iter().find_map(|(k, v)| v.contains('\0').then_some(k)) {
            return Err(Error::InvalidArgument(format!(
                "env {key:?} has a NUL byte in its value, which no process can be given"
            )));
        }
        if !spec.project.is_empty() {
            kiln_core::subjects::validate_token("project", &spec.project).map_err(Error::InvalidArgument)?;
        }
        if !spec.image.is_empty() && !kiln_formats::image::valid_reference(&spec.image) {
            return Err(Error::InvalidArgument(format!(
                "image {:?} is not a valid image reference",
                spec.image.chars().take(80).collect::<String>()
            )));
        }
        if spec.output_prefix.len() > MAX_OUTPUT_PREFIX_BYTES || spec.output_prefix.contains('\0') {
            return Err(Error::InvalidArgument(format!(
                "output_prefix must be at most {MAX_OUTPUT_PREFIX_BYTES} bytes, without NUL"
            )));
        }
        let secrets =
            kiln_core::secrets::validate_names(&spec.secrets, spec.env.keys()).map_err(Error::InvalidArgument)?;
        if spec.max_attempts > LARGEST_MAX_ATTEMPTS {
            return Err(Error::InvalidArgument(format!(
                "max_attempts {} is more than {LARGEST_MAX_ATTEMPTS}",
                spec.max_attempts
            )));
        }
        if spec.max_workers > LARGEST_MAX_WORKERS {
            return Err(Error::InvalidArgument(format!(
                "max_workers {} is more than {LARGEST_MAX_WORKERS}",
                spec.max_workers
            )));
        }
        if !spec.pool.is_empty() {
            kiln_core::subjects::validate_token("pool", &spec.pool).map_err(Error::InvalidArgument)?;
        }
        if spec.gpus > MAX_GPUS {
            return Err(Error::InvalidArgument(format!(
                "gpus is {} per worker; at most {MAX_GPUS}",
                spec.gpus
            )));
        }
        if spec.slots > LARGEST_SLOTS {
            return Err(Error::InvalidArgument(format!(
                "slots {} is more than {LARGEST_SLOTS}",
                spec.slots
            )));
        }
        let or = |value: u64, default: u64| if value == 0 { default } else { value };
        let slots = spec.slots.max(1);
        let worker_memory = or(spec.memory_mb, DEFAULT_MEMORY_MB)
            .saturating_mul(1 << 20)
            .saturating_mul(u64::from(slots));
        check_disk_and_shm(spec.disk_bytes, spec.shm_bytes, worker_memory, &spec.image).map_err(|problem| {
            Error::InvalidArgument(match problem {
                DiskShmProblem::DiskTooSmall => format!(
                    "disk_bytes is {}; a worker's disk is at least {MIN_JOB_DISK_BYTES} bytes (16 MiB)",
                    spec.disk_bytes
                ),
                DiskShmProblem::DiskWithoutImage => {
                    "--disk needs an image: runners give a worker its own disk in a container (the docker provider); give --image too".into()
                }
                DiskShmProblem::ShmOverMemory => format!(
                    "shm_bytes ({}) is more than a worker's memory ({worker_memory}: --mem times --slots), which /dev/shm counts against",
                    spec.shm_bytes
                ),
            })
        })?;
        let retry_rules = Rule::from_protos(&spec.retry_rules)?;
        if pb::Market::try_from(spec.market).is_err() {
            return Err(Error::InvalidArgument(format!(
                "market {} is not a market",
                spec.market
            )));
        }
        Ok(Spec {
            name: if spec.name.is_empty() {
                "batch".into()
            } else {
                spec.name
            },
            project: if spec.project.is_empty() {
                "default".into()
            } else {
                spec.project
            },
            image: spec.image,
            command: spec.command,
            env: spec.env.into_iter().collect(),
            cpu_millis: if spec.cpu_millis == 0 {
                DEFAULT_CPU_MILLIS
            } else {
                spec.cpu_millis
            },
            memory_mb: or(spec.memory_mb, DEFAULT_MEMORY_MB),
            output_prefix: spec.output_prefix,
            max_attempts: if spec.max_attempts == 0 {
                DEFAULT_MAX_ATTEMPTS
            } else {
                spec.max_attempts
            },
            item_timeout_secs: or(spec.item_timeout_secs, DEFAULT_ITEM_TIMEOUT_SECS),
            max_workers: if spec.max_workers == 0 {
                DEFAULT_MAX_WORKERS
            } else {
                spec.max_workers
            },
            market: spec.market,
            secrets,
            pool: spec.pool,
            retry_rules,
            gpus: spec.gpus,
            slots,
            disk_bytes: spec.disk_bytes,
            shm_bytes: spec.shm_bytes,
        })
    }

    pub fn to_proto(&self) -> pb::BatchSpec {
        pb::BatchSpec {
            name: self.name.clone(),
            project: self.project.clone(),
            image: self.image.clone(),
            command: self.command.clone(),
            env: self.env.clone().into_iter().collect(),
            cpu_millis: self.cpu_millis,
            memory_mb: self.memory_mb,
            output_prefix: self.output_prefix.clone(),
            max_attempts: self.max_attempts,
            item_timeout_secs: self.item_timeout_secs,
            max_workers: self.max_workers,
            market: self.market,
            pool: self.pool.clone(),
            secrets: self.secrets.clone(),
            retry_rules: self.retry_rules.iter().map(Rule::to_proto).collect(),
            gpus: self.gpus,
            slots: self.slots,
            disk_bytes: self.disk_bytes,
            shm_bytes: self.shm_bytes,
        }
    }

    pub fn from_json(json: &str) -> Result<Spec> {
        serde_json::from_str(json)
            .map_err(|e| Error::Store(kiln_core::store::StoreError::Corrupt(format!("batch spec: {e}"))))
    }

    pub fn to_json(&self) -> String {
        serde_json::to_string(self).expect("a spec serializes")
    }

    /// Where an item's outputs go ({output}).
    pub fn output_of(&self, key: &str) -> String {
        if self.output_prefix.is_empty() {
            format!("/kiln/outputs/items/{key}")
        } else {
            format!("{}{key}", self.output_prefix)
        }
    }
}

#[cfg(test)]
mod properties;
