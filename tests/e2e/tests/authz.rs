//! Every RPC of every service against every kind of caller: the methods come from the proto
//! descriptors (so a new RPC is in the matrix the day it is added, and fails it until
//! `authz/policy.rs` gives it a rule and its handler asks that rule), the requests are built
//! from each input type, filled with the ids of real objects of project `alpha` (owned by its
//! maintainer). Callers without the right get exactly the refusal their case calls for; callers
//! with it are not refused.

use kiln_core::authz::{self, JobAccess, Need};
use kiln_e2e::rpc::{Requests, call};
use kiln_e2e::two_projects::{Alpha, Caller, world};
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
    drop(world.stack);
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
