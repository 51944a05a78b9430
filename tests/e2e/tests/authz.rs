//! Every RPC of every service against every kind of caller: the methods come from the proto
//! descriptors (so a new RPC is in the matrix the day it is added, and fails it until
//! `authz/policy.rs` gives it a rule and its handler asks that rule), the requests are built
//! from each input type, filled with the ids of real objects of project `alpha` (owned by its
//! maintainer). Callers without the right get exactly the refusal their case calls for; callers
//! with it are not refused. Then the cross-project half: from beta, every request field that
//! names an object is filled with alpha's, and must be answered as an unknown object.

use kiln_core::authz::{self, JobAccess, Need};
use kiln_e2e::references::{self, Builder, Objects};
use kiln_e2e::rpc::{Requests, call};
use kiln_e2e::two_projects::{Alpha, Caller, World, world};
use kiln_proto::v1 as pb;
use prost::Message;
use prost_types::FileDescriptorSet;
use tonic::Code;

/// Whether `role` meets `need` on objects `role`'s holder does not own.
fn meets(role: pb::Role, need: Need) -> bool {
    let role = authz::Role::from_proto(role as i32).expect("a role");
    match need {
        Need::Caller => true,
        Need::Admin => false,
        Need::Role(needed) => role >= needed,
        Need::OwnerOr { others, .. } => role >= others,
    }
}

/// The code a caller must get, or `None` for a call it may make (then it may succeed or fail
/// for any reason but its rights).
fn expected(caller: Caller, rule: &authz::Rule) -> Option<Code> {
    match caller {
        Caller::NoToken | Caller::WrongToken | Caller::Revoked | Caller::Expired => Some(Code::Unauthenticated),
        Caller::Outsider(_) => match rule.need {
            Need::Admin => Some(Code::PermissionDenied),
            // Calls on the caller's own things: answered, and checked for leaks instead.
            Need::Caller => None,
            // alpha's objects do not exist for them.
            Need::Role(_) | Need::OwnerOr { .. } => Some(Code::NotFound),
        },
        Caller::OtherJob => match rule.job {
            JobAccess::Deny => Some(Code::PermissionDenied),
            JobAccess::Allow => None,
            JobAccess::OwnJob | JobAccess::OwnBatch => Some(Code::NotFound),
        },
        Caller::Alpha(role) => (!meets(role, rule.need)).then_some(Code::PermissionDenied),
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn every_rpc_refuses_every_caller_it_must() {
    let world = world().await;
    let set = FileDescriptorSet::decode(kiln_proto::FILE_DESCRIPTOR_SET).expect("descriptors");
    let types = Requests::new(&set);
    let mut checked = 0;
    let mut failures = Vec::new();
    for file in &set.file {
        for service in &file.service {
            for method in &service.method {
                let path = format!("/{}.{}/{}", file.package(), service.name(), method.name());
                let rule = authz::rule(&path).unwrap_or_else(|| panic!("{path} has no rule in authz/policy.rs"));
                let body = types.request(method.input_type(), &world.alpha);
                for addr in world.addresses.of(service.name()) {
                    for (caller, token) in &world.tokens {
                        let answer = call(addr, method, &path, token.as_deref(), body.clone()).await;
                        checked += 1;
                        let wrong = match (expected(*caller, rule), &answer) {
                            (Some(code), Err(status)) if status.code() == code => None,
                            (Some(code), other) => Some(format!("expected {code:?}, got {other:?}")),
                            (None, Err(status))
                                if matches!(status.code(), Code::Unauthenticated | Code::PermissionDenied) =>
                            {
                                Some(format!("refused its own call: {status:?}"))
                            }
                            (None, Ok(bytes)) if !matches!(caller, Caller::Alpha(_)) && leaks(bytes, &world.alpha) => {
                                Some("answered with alpha's ids".into())
                            }
                            (None, _) => None,
                        };
                        if let Some(wrong) = wrong {
                            failures.push(format!("{path} at {addr} as {caller:?}: {wrong}"));
                        }
                        // Only alpha's own may learn anything of alpha.
                        if let (false, Err(status)) = (matches!(caller, Caller::Alpha(_)), &answer) {
                            assert!(
                                !leaks(status.message().as_bytes(), &world.alpha) || status.code() == Code::NotFound,
                                "{path} as {caller:?}: {status:?}"
                            );
                        }
                    }
                }
            }
        }
    }
    assert!(
        failures.is_empty(),
        "{} of {checked} calls answered wrongly:\n{}",
        failures.len(),
        failures.join("\n")
    );
    assert!(checked > 300, "only {checked} calls made");
    // Last: its controls change things (they submit jobs, create datasets and services).
    cross_project_references_read_as_unknown(&world, &set, &types).await;
    drop(world.stack);
}

/// The methods and fields whose check of a named object's project must be reached by the
/// controls: a caller who may read alpha (the admin), or beta's own object, is answered other
/// than for an unknown object, so the refusal of alpha's object cannot be vacuous.
const MUST_BE_REACHED: &[(&str, &str)] = &[
    ("/kiln.v1.JobService/SubmitJob", "JobSpec.datasets"),
    ("/kiln.v1.JobService/SubmitJob", "JobSpec.code_digest"),
    ("/kiln.v1.DatasetService/CreateDataset", "CreateDatasetRequest.digest"),
    (
        "/kiln.v1.BatchService/AddItemsFromObjects",
        "AddItemsFromObjectsRequest.prefix",
    ),
    (
        "/kiln.v1.BatchService/AddItemsFromObjects",
        "AddItemsFromObjectsRequest.manifest",
    ),
    ("/kiln.v1.SweepService/CreateSweep", "CreateSweepRequest.code_digest"),
    ("/kiln.v1.SweepService/CreateSweep", "CreateSweepRequest.spec_yaml"),
    ("/kiln.v1.ServeService/CreateService", "ServiceModel.model"),
    ("/kiln.v1.ServeService/CreateService", "JobSpec.code_digest"),
    ("/kiln.v1.ModelService/GetModel", "GetModelRequest.name"),
    ("/kiln.v1.ModelService/GetModelVersion", "GetModelVersionRequest.name"),
    ("/kiln.v1.ServeService/GetService", "GetServiceRequest.name"),
];

/// The cross-project matrix (kiln_e2e::references): from beta, alpha's object in any field that
/// names one is answered as an unknown object.
async fn cross_project_references_read_as_unknown(world: &World, set: &FileDescriptorSet, types: &Requests<'_>) {
    let builder = Builder {
        requests: types,
        objects: Objects {
            alpha: &world.alpha,
            references: &world.references,
        },
    };
    let beta = world
        .tokens
        .iter()
        .find(|(caller, _)| *caller == Caller::Outsider(pb::Role::Maintainer))
        .and_then(|(_, token)| token.clone())
        .expect("beta's maintainer");
    let admin = world.stack.token.clone();
    let patience = std::time::Duration::from_secs(5);
    let mut unclassified = Vec::new();
    let mut failures = Vec::new();
    let mut reached = std::collections::BTreeSet::new();
    let mut checked = 0;
    for (path, method, service) in references::methods(set) {
        let mut fields = Vec::new();
        builder.fields(method.input_type(), &mut fields, &mut unclassified, 0);
        for field in fields {
            let Some(values) = builder.objects.values(field.kind, &field.field) else {
                continue;
            };
            let shown = format!("{}.{}", field.message, field.field);
            let body = |value: &str| builder.request(method.input_type(), &field, value);
            for addr in world.addresses.of(service) {
                let ask = |token: &str, value: &str| {
                    references_call(addr, method, &path, token.to_string(), body(value), patience)
                };
                let attack = ask(&beta, &values.alpha).await;
                let unknown = ask(&beta, &values.unknown).await;
                checked += 1;
                let same = match (&attack, &unknown) {
                    (Some(Err(a)), Some(Err(u))) => {
                        references::shape(a, &values.alpha) == references::shape(u, &values.unknown)
                    }
                    (Some(Ok(a)), Some(Ok(_))) => !leaks(a, &world.alpha),
                    (None, None) => true,
                    _ => false,
                };
                if !same {
                    failures.push(format!(
                        "{path} {shown} from beta: alpha's {:?} got {attack:?}, an unknown {:?} got {unknown:?}",
                        values.alpha, values.unknown
                    ));
                }
                // Controls: the admin, who may read alpha, or beta's own object, is answered
                // otherwise than an unknown object.
                let admin_alpha = ask(&admin, &values.alpha).await;
                let admin_unknown = ask(&admin, &values.unknown).await;
                let mut differs = !same_answer(&admin_alpha, &values.alpha, &admin_unknown, &values.unknown);
                if let Some(own) = &values.own {
                    let own_answer = ask(&beta, own).await;
                    differs |= !same_answer(&own_answer, own, &unknown, &values.unknown);
                }
                if differs {
                    reached.insert((path.clone(), shown.clone()));
                }
            }
        }
    }
    unclassified.sort();
    unclassified.dedup();
    assert!(
        unclassified.is_empty(),
        "fields that may name an object have no rule in kiln_e2e::references::names: {unclassified:?}"
    );
    assert!(
        failures.is_empty(),
        "{} of {checked} cross-project references answered otherwise than an unknown object:\n{}",
        failures.len(),
        failures.join("\n")
    );
    let missed: Vec<_> = MUST_BE_REACHED
        .iter()
        .filter(|(path, field)| !reached.contains(&(path.to_string(), field.to_string())))
        .collect();
    assert!(
        missed.is_empty(),
        "no control reached the check of these references (the refusal may be vacuous): {missed:?}; reached: {reached:?}"
    );
    assert!(checked > 40, "only {checked} cross-project references tried");
}

async fn references_call(
    addr: std::net::SocketAddr,
    method: &prost_types::MethodDescriptorProto,
    path: &str,
    token: String,
    body: Vec<u8>,
    patience: std::time::Duration,
) -> Option<Result<Vec<u8>, tonic::Status>> {
    kiln_e2e::rpc::call_within(addr, method, path, Some(&token), body, patience).await
}

/// Whether two answers are alike once the values they name are set aside.
fn same_answer(
    a: &Option<Result<Vec<u8>, tonic::Status>>,
    a_value: &str,
    b: &Option<Result<Vec<u8>, tonic::Status>>,
    b_value: &str,
) -> bool {
    match (a, b) {
        (Some(Err(a)), Some(Err(b))) => references::shape(a, a_value) == references::shape(b, b_value),
        (Some(Ok(_)), Some(Ok(_))) | (None, None) => true,
        _ => false,
    }
}

/// Whether an answer names alpha's objects (a NOT_FOUND naming the id asked for leaks nothing).
fn leaks(bytes: &[u8], alpha: &Alpha) -> bool {
    let text = String::from_utf8_lossy(bytes);
    text.contains(&alpha.job_id)
        || text.contains(&alpha.batch_id)
        || text.contains(&alpha.sweep_id)
        || text.contains("alpha-maintainer")
        || text.contains("alpha-data")
}
