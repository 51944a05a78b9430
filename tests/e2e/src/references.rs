//! The cross-project half of the authorisation matrix (tests/authz.rs): every string field of
//! every request that names an object — a job, batch, sweep, dataset, blob, object key, model
//! or service — is filled, in a request made from the caller's own project (`beta`), with
//! another project's object (`alpha`'s); the answer must be the one an unknown object of that
//! kind gets. Which object a field names comes from [`names`]; a field whose name says it may
//! name an object but which has no entry there fails the test, so a new field is classified the
//! day it is added.

use kiln_proto::v1 as pb;
use prost_types::field_descriptor_proto::Type;
use prost_types::{DescriptorProto, FileDescriptorSet};

use crate::rpc::Requests;

/// What a string field of a request names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Names {
    Job,
    Batch,
    Sweep,
    /// A dataset as a job names it: `NAME` of its project, or `PROJECT/NAME`.
    Dataset,
    /// A content-addressed blob by its sha256.
    Blob,
    /// A key or prefix of kiln's object store.
    ObjectKey,
    /// A model of the registry: `NAME` of the request's project, or `PROJECT/NAME` (names are
    /// unique per project).
    Model,
    /// An inference service: `NAME` of the request's project, or `PROJECT/NAME` (names are
    /// unique per project).
    Service,
    /// The object the call acts on, named together with its project (a dataset or secret to
    /// delete): the main matrix names it from outside its project.
    Target,
    /// Projects, users, tokens, scopes: the main matrix's subject.
    Tenancy,
    /// Not an object of kiln (a label, a command, a key inside an object the call names...).
    Nothing,
}

/// Field names that may name an object: each one met must have an entry in [`names`].
const SUSPECT: &[&str] = &[
    "_id", "_ids", "digest", "dataset", "model", "service", "prefix", "manifest", "path", "uri", "key", "name",
    "project", "user", "token", "scope", "alias", "sha256", "secrets", "image", "pool",
];

/// What the string field `field` of message `message` names; `None` when the table does not
/// know it.
pub fn names(message: &str, field: &str) -> Option<Names> {
    use Names::*;
    Some(match (message, field) {
        (_, "job_id" | "job_ids") => Job,
        (_, "batch_id") => Batch,
        (_, "sweep_id") => Sweep,
        ("JobSpec", "datasets") => Dataset,
        // A sweep's trial datasets are in its YAML (see `sweep_yaml`).
        ("CreateSweepRequest", "spec_yaml") => Dataset,
        (_, "digest" | "code_digest") => Blob,
        ("AddItemsFromObjectsRequest", "prefix" | "manifest") => ObjectKey,
        ("ServiceModel", "model") => Model,
        (
            "GetModelRequest"
            | "GetModelVersionRequest"
            | "ListModelVersionsRequest"
            | "SetModelAliasRequest"
            | "DeleteModelAliasRequest"
            | "SetModelTagsRequest"
            | "GetModelFileRequest",
            "name",
        ) => Model,
        ("GetServiceRequest" | "StopServiceRequest" | "ScaleServiceRequest" | "UpdateServiceRequest", "name") => {
            Service
        }
        ("DeleteDatasetRequest" | "DeleteSecretRequest" | "SetSecretRequest", "name") => Target,
        // A registry's host and its user, stored in the request's own project: not kiln objects.
        ("SetSecretRequest", "registry" | "username") => Nothing,
        (_, "project" | "user" | "scope" | "token") => Tenancy,
        ("ProjectRef" | "UserRef" | "CreateUserRequest" | "CreateProjectRequest", "name") => Tenancy,
        // The name a new object gets, or a label.
        (
            "JobSpec"
            | "BatchSpec"
            | "CreateRunRequest"
            | "CreateTokenRequest"
            | "CreateServiceRequest"
            | "CreateDatasetRequest"
            | "TensorMetadata",
            "name",
        ) => Nothing,
        // The model a version is registered as, in its job's project: another project's is
        // refused whether it has the name or not.
        ("RegisterModelRequest", "name") => Model,
        // An artifact of the job the request names.
        (
            "GetRunArtifactRequest" | "ListRunArtifactsRequest" | "SaveRunArtifactRequest" | "RunArtifactFile",
            "name",
        ) => Nothing,
        // Inside the job or model the request names: outputs, files, aliases.
        ("ListOutputsRequest", "prefix") => Nothing,
        (_, "path" | "alias") => Nothing,
        // Secrets of the request's own project, by name: another's cannot be named.
        (_, "secrets") => Nothing,
        // Item URIs are strings handed to the item's command; kiln never reads them (the agent
        // fetches nothing), and output_prefix is where that command writes.
        (_, "uri" | "output_prefix") => Nothing,
        // Metric and item keys inside a job or batch the request names.
        (_, "key" | "keys") => Nothing,
        (
            _,
            "command" | "image" | "pool" | "priority_class" | "idempotency_key" | "page_token" | "query" | "pattern"
            | "description" | "writer" | "text" | "datatype" | "ensemble" | "member" | "reason" | "value" | "error",
        ) => Nothing,
        _ => return None,
    })
}

/// The values a reference takes: alpha's object, an unknown one, and beta's own (when beta has
/// one of that kind).
pub struct Values {
    pub alpha: String,
    pub unknown: String,
    pub own: Option<String>,
}

/// The objects of both projects the values come from.
pub struct Objects<'a> {
    pub alpha: &'a crate::rpc::Targets,
    pub references: &'a crate::two_projects::References,
}

impl Objects<'_> {
    /// The values of a reference of `kind` in field `field` (a manifest names an object, a
    /// prefix the objects under it).
    pub fn values(&self, kind: Names, field: &str) -> Option<Values> {
        let unknown_id = kiln_core::ids::new_id();
        let refs = self.references;
        Some(match kind {
            Names::Job => Values {
                alpha: self.alpha.job_id.clone(),
                unknown: unknown_id,
                own: Some(refs.beta_job_id.clone()),
            },
            Names::Batch => Values {
                alpha: self.alpha.batch_id.clone(),
                unknown: unknown_id,
                own: Some(refs.beta_batch_id.clone()),
            },
            Names::Sweep => Values {
                alpha: self.alpha.sweep_id.clone(),
                unknown: unknown_id,
                own: None,
            },
            Names::Dataset => Values {
                alpha: "alpha/alpha-data".into(),
                unknown: "beta/no-such-data".into(),
                own: Some("beta-data".into()),
            },
            Names::Blob => Values {
                alpha: refs.alpha_digest.clone(),
                unknown: "e".repeat(64),
                own: Some(refs.beta_digest.clone()),
            },
            Names::ObjectKey => {
                let file = if field == "manifest" { "/item.txt" } else { "" };
                Values {
                    alpha: format!("outputs/{}/in{file}", self.alpha.job_id),
                    unknown: format!("outputs/{unknown_id}/in{file}"),
                    own: Some(format!("outputs/{}/in{file}", refs.beta_job_id)),
                }
            }
            // Both projects have a model and a service called `matrix`: from beta the bare name
            // is beta's own, and alpha's is named as alpha's.
            Names::Model => Values {
                alpha: "alpha/matrix".into(),
                unknown: "alpha/no-such-model".into(),
                own: Some("matrix".into()),
            },
            Names::Service => Values {
                alpha: "alpha/matrix".into(),
                unknown: "alpha/no-such-service".into(),
                own: Some("matrix".into()),
            },
            Names::Target | Names::Tenancy | Names::Nothing => return None,
        })
    }
}

/// A sweep spec of one trial, naming `dataset` among its trial's datasets when given.
fn sweep_yaml(dataset: Option<&str>) -> String {
    let datasets = dataset
        .map(|name| format!(", datasets: [\"{name}\"]"))
        .unwrap_or_default();
    format!(
        "name: refs\nobjective: {{metric: loss, goal: minimize}}\nalgorithm: {{name: random}}\n\
         budget: {{max-trials: 1}}\nparameters: {{x: {{type: float, min: 0, max: 1}}}}\n\
         trial: {{command: [\"true\"]{datasets}}}\n"
    )
}

/// One string field of one message type, as a request can hold it.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Field {
    pub message: String,
    pub field: String,
    pub kind: Names,
}

/// Encodes requests whose references are all beta's own except one field, which holds a value
/// of the test's choosing.
pub struct Builder<'a> {
    pub requests: &'a Requests<'a>,
    pub objects: Objects<'a>,
}

impl Builder<'_> {
    /// The string fields of `name` and every message under it, classified; the ones [`names`]
    /// does not know but whose names are [`SUSPECT`] come back in `unknown`.
    pub fn fields(&self, name: &str, found: &mut Vec<Field>, unknown: &mut Vec<String>, depth: usize) {
        let message = self.requests.get(name);
        let short = short(name);
        for field in &message.field {
            match field.r#type() {
                Type::String => match names(short, field.name()) {
                    Some(kind) => {
                        let entry = Field {
                            message: short.to_string(),
                            field: field.name().to_string(),
                            kind,
                        };
                        if !found.contains(&entry) {
                            found.push(entry);
                        }
                    }
                    None if SUSPECT.iter().any(|suspect| field.name().contains(suspect)) => {
                        unknown.push(format!("{short}.{}", field.name()))
                    }
                    None => {}
                },
                Type::Message if depth < 4 && nested(field.type_name()) => {
                    self.fields(field.type_name(), found, unknown, depth + 1)
                }
                _ => {}
            }
        }
    }

    /// Encodes a request of type `name` made in beta, with `value` in `target` and beta's own
    /// objects (or nothing) in the other references.
    pub fn request(&self, name: &str, target: &Field, value: &str) -> Vec<u8> {
        self.encode(name, target, value, 0)
    }

    fn encode(&self, name: &str, target: &Field, value: &str, depth: usize) -> Vec<u8> {
        let message: &DescriptorProto = self.requests.get(name);
        let short = short(name);
        let mut out = Vec::new();
        for field in &message.field {
            let number = field.number() as u32;
            match field.r#type() {
                Type::String => {
                    let is_target = target.message == short && target.field == field.name();
                    let text = if is_target {
                        Some(value.to_string())
                    } else {
                        self.default_text(short, field.name())
                    };
                    let text = match (short, field.name()) {
                        ("CreateSweepRequest", "spec_yaml") => Some(sweep_yaml(text.as_deref())),
                        _ => text,
                    };
                    if let Some(text) = text {
                        prost::encoding::string::encode(number, &text, &mut out);
                    }
                }
                Type::Message if depth < 4 && nested(field.type_name()) => {
                    let inner = self.encode(field.type_name(), target, value, depth + 1);
                    if !inner.is_empty() {
                        prost::encoding::encode_key(number, prost::encoding::WireType::LengthDelimited, &mut out);
                        prost::encoding::encode_varint(inner.len() as u64, &mut out);
                        out.extend_from_slice(&inner);
                    }
                }
                Type::Enum if field.name() == "role" => {
                    prost::encoding::int32::encode(number, &(pb::Role::Viewer as i32), &mut out)
                }
                Type::Uint32 | Type::Uint64 if field.name() == "max_replicas" => {
                    prost::encoding::uint32::encode(number, &1, &mut out)
                }
                _ => {}
            }
        }
        out
    }

    /// What a field that is not the one tested holds: beta's own objects and names, a command
    /// that runs, nothing for references beta has no object of.
    fn default_text(&self, short: &str, field: &str) -> Option<String> {
        let kind = names(short, field)?;
        match kind {
            Names::Tenancy => match field {
                "project" => Some("beta".into()),
                "scope" => Some("project:beta".into()),
                _ => None,
            },
            Names::Nothing => match field {
                "command" => Some(if short == "BatchSpec" { "echo {uri}" } else { "true" }.into()),
                "name" => Some("refs".into()),
                _ => None,
            },
            // The sources of AddItemsFromObjects are a oneof: only the one tested is set.
            Names::Target | Names::ObjectKey => None,
            // A sweep's YAML is written whole by `encode`.
            Names::Dataset if short == "CreateSweepRequest" => None,
            other => self.objects.values(other, field).and_then(|values| values.own),
        }
    }
}

fn short(name: &str) -> &str {
    name.rsplit('.').next().unwrap_or(name)
}

/// Whether a message field is worth filling (kiln's own messages; not maps nor well-known types).
fn nested(type_name: &str) -> bool {
    type_name.starts_with(".kiln.") && !type_name.ends_with("Entry")
}

/// The message of a status with the value it names replaced, for comparing two refusals.
pub fn shape(status: &tonic::Status, value: &str) -> (tonic::Code, String) {
    (status.code(), status.message().replace(value, "<ref>"))
}

/// Every method of the set, with its path.
pub fn methods(set: &FileDescriptorSet) -> Vec<(String, &prost_types::MethodDescriptorProto, &str)> {
    let mut methods = Vec::new();
    for file in &set.file {
        for service in &file.service {
            for method in &service.method {
                let path = format!("/{}.{}/{}", file.package(), service.name(), method.name());
                methods.push((path, method, service.name()));
            }
        }
    }
    methods
}
