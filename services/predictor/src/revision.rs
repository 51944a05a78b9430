//! One revision of a service, as recorded: the definition as asked, each member's model
//! resolved to a registry version, and the worker job every member runs.
//!
//! A revision never changes once recorded; an update makes the next one. Its live form, what
//! the predictors read from `kiln_services`, is [`Revision::live`].

use std::collections::BTreeMap;

use kiln_core::capacity::{DiskShmProblem, MIN_JOB_DISK_BYTES, check_disk_and_shm};
use kiln_core::serving::{Ensemble, Member, ServiceSpec, TensorSpec, check_name};
use serde::{Deserialize, Serialize};

/// The deadline of a request that gives none, when the definition does not say.
pub const DEFAULT_DEADLINE_MS: u64 = 100;

/// One member of a revision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RevisionMember {
    pub name: String,
    /// The model as asked (`name@alias`, `name:3`, `name`, each maybe `project/` first).
    pub asked: String,
    /// The model as the service's project names it: `name` of its own, `project/name` of
    /// another.
    pub model: String,
    pub version: i64,
    pub weight: f64,
}

impl RevisionMember {
    /// `name:version` (or `project/name:version` of another project's model).
    pub fn model_version(&self) -> String {
        format!("{}:{}", self.model, self.version)
    }
}

/// The worker job of every member of a revision.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct WorkerSpec {
    pub command: Vec<String>,
    pub env: BTreeMap<String, String>,
    pub image: String,
    pub cpu_millis: i64,
    pub memory_bytes: i64,
    /// A disk of its own per worker and its /dev/shm, in bytes (0: none, Docker's default).
    pub disk_bytes: i64,
    pub shm_bytes: i64,
    pub gpus: i32,
    pub code_digest: String,
    /// `auto`, `spot` or `on-demand` ([`kiln_core::scheduling::MarketPolicy`]).
    pub market: String,
    pub pool: String,
    pub secrets: Vec<String>,
    pub priority_class: String,
}

/// A recorded revision.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Revision {
    pub revision: u64,
    pub members: Vec<RevisionMember>,
    pub ensemble: Ensemble,
    pub deadline_ms: u64,
    pub quorum: usize,
    pub inputs: Vec<TensorSpec>,
    pub outputs: Vec<TensorSpec>,
    pub worker: WorkerSpec,
}

impl Revision {
    /// What the predictors answer with for service `name` of `project` at this revision.
    pub fn live(&self, name: &str, project: &str) -> ServiceSpec {
        ServiceSpec {
            name: name.to_string(),
            project: project.to_string(),
            revision: self.revision,
            members: self
                .members
                .iter()
                .map(|member| Member {
                    name: member.name.clone(),
                    model: member.model_version(),
                    weight: member.weight,
                })
                .collect(),
            ensemble: self.ensemble,
            deadline_ms: self.deadline_ms,
            quorum: self.quorum,
            inputs: self.inputs.clone(),
            outputs: self.outputs.clone(),
            cold_wait_ms: 0,
            split: None,
        }
    }

    /// Every problem of the revision, each naming its field (the service's name is checked
    /// by the live form's rules too).
    pub fn problems(&self, name: &str) -> Vec<String> {
        let mut problems = self.live(name, "").problems();
        if self.worker.command.is_empty() {
            problems.push("worker.command: give the command that starts the worker (it calls kiln.serve)".into());
        }
        if self.worker.cpu_millis <= 0 || self.worker.memory_bytes <= 0 {
            problems.push("worker.resources: give CPU and memory per worker (--cpu, --mem)".into());
        }
        let bytes = |value: i64| u64::try_from(value).unwrap_or(0);
        let (disk, shm) = (self.worker.disk_bytes, self.worker.shm_bytes);
        match check_disk_and_shm(bytes(disk), bytes(shm), bytes(self.worker.memory_bytes), &self.worker.image) {
            Err(DiskShmProblem::DiskTooSmall) => problems.push(format!(
                "worker.resources.disk_bytes is {disk}; a worker's disk is at least {MIN_JOB_DISK_BYTES} bytes (16 MiB)"
            )),
            Err(DiskShmProblem::DiskWithoutImage) => problems.push(
                "worker.resources.disk_bytes: --disk needs an image (a worker's own disk is a container's); give --image too"
                    .into(),
            ),
            Err(DiskShmProblem::ShmOverMemory) => problems.push(format!(
                "worker.resources.shm_bytes ({shm}) is more than the worker's memory, which /dev/shm counts against"
            )),
            Ok(()) => {}
        }
        for (at, tensor) in self.inputs.iter().chain(&self.outputs).enumerate() {
            if kiln_formats::oip::DataType::parse(&tensor.datatype).is_none() {
                problems.push(format!(
                    "tensor {at} (`{}`): datatype `{}` is not one of the protocol's (FP32, INT64, BYTES...)",
                    tensor.name, tensor.datatype
                ));
            }
            if tensor.shape.iter().any(|&dim| dim < -1) {
                problems.push(format!("tensor `{}`: a dimension is a size or -1", tensor.name));
            }
        }
        problems
    }
}

/// The member name a model gets when none is given: its name, made a subject token.
pub fn default_member_name(model: &str) -> String {
    let name: String = model
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() {
                c.to_ascii_lowercase()
            } else {
                '-'
            }
        })
        .collect();
    if check_name("member", &name).is_ok() {
        name
    } else {
        format!("m-{name}")
    }
}

/// A model as asked, split: `name@alias` or `name:version` or `name`, the name maybe
/// `project/name` (another project's model).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    Alias { model: String, alias: String },
    Version { model: String, version: i64 },
    Latest { model: String },
}

impl ModelRef {
    pub fn parse(text: &str) -> Result<ModelRef, String> {
        if let Some((model, alias)) = text.split_once('@') {
            return Ok(ModelRef::Alias {
                model: model.into(),
                alias: alias.into(),
            });
        }
        if let Some((model, version)) = text.rsplit_once(':') {
            let version = version
                .parse::<i64>()
                .ok()
                .filter(|version| *version > 0)
                .ok_or_else(|| format!("model `{text}`: the version after `:` must be a positive number"))?;
            return Ok(ModelRef::Version {
                model: model.into(),
                version,
            });
        }
        if text.is_empty() {
            return Err("a model is named as NAME@ALIAS, NAME:VERSION or NAME".into());
        }
        Ok(ModelRef::Latest { model: text.into() })
    }

    /// The model as written: `name` or `project/name`.
    pub fn model(&self) -> &str {
        match self {
            ModelRef::Alias { model, .. } | ModelRef::Version { model, .. } | ModelRef::Latest { model } => model,
        }
    }

    /// The model's own name, without its project.
    pub fn name(&self) -> &str {
        let model = self.model();
        model.rsplit_once('/').map_or(model, |(_, name)| name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_references_parse() {
        assert_eq!(
            ModelRef::parse("resnet-cifar@production"),
            Ok(ModelRef::Alias {
                model: "resnet-cifar".into(),
                alias: "production".into()
            })
        );
        assert_eq!(
            ModelRef::parse("other:3"),
            Ok(ModelRef::Version {
                model: "other".into(),
                version: 3
            })
        );
        assert_eq!(
            ModelRef::parse("digits"),
            Ok(ModelRef::Latest { model: "digits".into() })
        );
        let qualified = ModelRef::parse("alpha/resnet@prod").unwrap();
        assert_eq!((qualified.model(), qualified.name()), ("alpha/resnet", "resnet"));
        assert_eq!(
            ModelRef::parse("alpha/resnet:2"),
            Ok(ModelRef::Version {
                model: "alpha/resnet".into(),
                version: 2
            })
        );
        assert!(ModelRef::parse("other:x").unwrap_err().contains("positive number"));
        assert!(ModelRef::parse("other:0").is_err());
    }

    /// A worker's disk and /dev/shm are checked as a job's are, each problem naming its field.
    #[test]
    fn a_workers_disk_and_shm_are_checked() {
        let revision = |disk_bytes: i64, shm_bytes: i64, image: &str| Revision {
            revision: 1,
            members: vec![RevisionMember {
                name: "digits".into(),
                asked: "digits".into(),
                model: "digits".into(),
                version: 1,
                weight: 1.0,
            }],
            ensemble: Ensemble::Mean,
            deadline_ms: DEFAULT_DEADLINE_MS,
            quorum: 1,
            inputs: Vec::new(),
            outputs: Vec::new(),
            worker: WorkerSpec {
                command: vec!["python".into(), "serve.py".into()],
                cpu_millis: 1000,
                memory_bytes: 256 << 20,
                disk_bytes,
                shm_bytes,
                image: image.into(),
                ..WorkerSpec::default()
            },
        };
        assert_eq!(
            revision(1 << 30, 128 << 20, "python:3.12").problems("digits"),
            Vec::<String>::new()
        );
        for (disk, shm, image, field) in [
            (1 << 20, 0, "python:3.12", "disk_bytes is 1048576"),
            (1 << 30, 0, "", "--disk needs an image"),
            (0, 512 << 20, "", "shm_bytes (536870912) is more than"),
        ] {
            let problems = revision(disk, shm, image).problems("digits");
            assert!(problems.iter().any(|p| p.contains(field)), "{field}: {problems:?}");
        }
    }

    #[test]
    fn member_names_are_subject_tokens() {
        assert_eq!(default_member_name("resnet_cifar"), "resnet-cifar");
        assert_eq!(default_member_name("Digits.SVM"), "digits-svm");
        assert_eq!(default_member_name("3d"), "m-3d");
    }
}
