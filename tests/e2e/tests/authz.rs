//! Every RPC of every service against every kind of caller: the methods come from the proto
//! descriptors (so a new RPC is in the matrix the day it is added, and fails it until
//! `authz/policy.rs` gives it a rule and its handler asks that rule), the requests are built
//! from each input type, filled with the ids of real objects of project `alpha` (owned by its
//! maintainer). Callers without the right get exactly the refusal their case calls for; callers
//! with it are not refused.

use std::net::SocketAddr;
use std::time::Duration;

use kiln_core::authz::{self, JobAccess, Need};
use kiln_e2e::rpc::{Requests, Targets, call};
use kiln_e2e::{PATIENCE, Stack, spec, wait_for_line};
use kiln_proto::v1 as pb;
use prost::Message;
use prost_types::FileDescriptorSet;
use tonic::Code;

/// The five services of the stack, by the gRPC services each serves.
struct Addresses {
    api: SocketAddr,
    logs: SocketAddr,
    batches: SocketAddr,
    scheduler: SocketAddr,
    runner: SocketAddr,
}

impl Addresses {
    /// Where a gRPC service is served; NodeService is everywhere.
    fn of(&self, service: &str) -> Vec<SocketAddr> {
        match service {
            "JobService" | "QuotaService" | "ArtifactService" | "DatasetService" | "UserService" | "ProjectService"
            | "SecretService" => vec![self.api],
            "LogService" => vec![self.logs],
            "BatchService" | "ItemWorkService" => vec![self.batches],
            "NodeService" => vec![self.api, self.logs, self.batches, self.scheduler, self.runner],
            other => panic!("{other} is served by no service this test knows: add it to Addresses::of"),
        }
    }
}

/// The objects of project `alpha` the requests name.
type Alpha = Targets;

/// A caller who must be refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Caller {
    NoToken,
    WrongToken,
    Revoked,
    Expired,
    /// A viewer, member or maintainer of project `beta` only.
    Outsider(pb::Role),
    /// The token of a job of project `beta`.
    OtherJob,
    /// A viewer or member of `alpha` who owns none of its objects, or its maintainer.
    Alpha(pb::Role),
}

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

// === the stack ===

struct World {
    stack: Stack,
    addresses: Addresses,
    alpha: Alpha,
    tokens: Vec<(Caller, Option<String>)>,
    _runner: kiln_e2e::ServiceHandle,
}

/// Runs `script` as a job of `project` by `token`'s owner, and returns it.
async fn submit(stack: &Stack, token: &str, project: &str, script: &str) -> pb::Job {
    stack
        .jobs_as(token)
        .await
        .submit_job(pb::SubmitJobRequest {
            spec: Some(pb::JobSpec {
                project: project.into(),
                ..spec(&["sh", "-c", script])
            }),
            ..Default::default()
        })
        .await
        .expect("submit")
        .into_inner()
        .job
        .expect("job")
}

async fn world() -> World {
    let mut stack = Stack::start_without_runner().await;
    let runner = kiln_runner::Runner::bind(stack.runner_config("runner-1"))
        .await
        .expect("runner binds");
    let runner_addr = runner.local_addr();
    let runner = kiln_e2e::ServiceHandle::spawn(|token| runner.serve(token));
    stack.start_item_batch(stack.item_batch_config()).await;
    for project in ["alpha", "beta"] {
        stack.create_project(project).await;
    }
    let alpha_token = stack.create_user("alpha-maintainer").await;
    stack
        .add_member("alpha", "alpha-maintainer", pb::Role::Maintainer)
        .await;
    stack.create_user("bystander").await;
    let mut alpha_callers = Vec::new();
    for (role, name) in [(pb::Role::Viewer, "alpha-viewer"), (pb::Role::Member, "alpha-member")] {
        let token = stack.create_user(name).await;
        stack.add_member("alpha", name, role).await;
        alpha_callers.push((Caller::Alpha(role), Some(token)));
    }
    let mut tokens = vec![
        (Caller::NoToken, None),
        (
            Caller::WrongToken,
            Some(format!("kiln_{}_{}", "a".repeat(16), "b".repeat(64))),
        ),
    ];
    for (role, name) in [
        (pb::Role::Viewer, "beta-viewer"),
        (pb::Role::Member, "beta-member"),
        (pb::Role::Maintainer, "beta-maintainer"),
    ] {
        let token = stack.create_user(name).await;
        stack.add_member("beta", name, role).await;
        tokens.push((Caller::Outsider(role), Some(token)));
    }
    // alpha's objects: a running job and a batch.
    let job = submit(&stack, &alpha_token, "alpha", "echo up; sleep 120").await;
    let batch = stack
        .batches_client_at(stack.batches_addr.expect("item-batch"))
        .await
        .create_batch(pb::CreateBatchRequest {
            spec: Some(pb::BatchSpec {
                project: "alpha".into(),
                command: vec!["echo".into(), "{uri}".into()],
                ..Default::default()
            }),
        })
        .await
        .expect("create batch")
        .into_inner();
    let (archive, digest) = kiln_e2e::bundle(&[("data.txt", "alpha's")]);
    let mut artifacts = stack.artifacts_as(&alpha_token).await;
    kiln_e2e::upload(&mut artifacts, &archive, &digest)
        .await
        .expect("upload");
    stack
        .datasets_as(&alpha_token)
        .await
        .create_dataset(pb::CreateDatasetRequest {
            name: "alpha-data".into(),
            digest,
            project: "alpha".into(),
        })
        .await
        .expect("create dataset");
    // A revoked and an expired token of alpha's maintainer.
    let mut users = stack.users_as(&alpha_token).await;
    let revoked = users
        .create_token(pb::CreateTokenRequest {
            name: "to-revoke".into(),
            ..Default::default()
        })
        .await
        .expect("token")
        .into_inner()
        .secret;
    users
        .revoke_token(pb::RevokeTokenRequest {
            token: "to-revoke".into(),
        })
        .await
        .expect("revoke");
    let expired = users
        .create_token(pb::CreateTokenRequest {
            name: "short".into(),
            expires_in_secs: 1,
            ..Default::default()
        })
        .await
        .expect("token")
        .into_inner()
        .secret;
    tokens.push((Caller::Revoked, Some(revoked)));
    // The token a job of beta runs with, read from its log as the runner handed it over.
    let beta_member = tokens[3].1.clone().expect("beta member");
    let beta_job = submit(&stack, &beta_member, "beta", "echo token=$KILN_TOKEN; sleep 120").await;
    wait_for_line(&stack, &beta_job.id, "token=").await;
    let lines = stack.log_lines(&beta_job.id, false).await;
    let job_token = lines
        .iter()
        .find_map(|line| line.text.strip_prefix("token="))
        .expect("the job's token")
        .to_string();
    tokens.push((Caller::OtherJob, Some(job_token)));
    wait_for_line(&stack, &job.id, "up").await;
    // By now the short token has expired (it lived one second).
    let deadline = tokio::time::Instant::now() + PATIENCE;
    while stack
        .node_as(stack.api_addr, &expired)
        .await
        .who_am_i(pb::WhoAmIRequest {})
        .await
        .is_ok()
    {
        assert!(tokio::time::Instant::now() < deadline, "the short token never expired");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    tokens.push((Caller::Expired, Some(expired)));
    tokens.extend(alpha_callers);
    // Last: the maintainer's calls change things (stop the job, cancel the batch).
    tokens.push((Caller::Alpha(pb::Role::Maintainer), Some(alpha_token)));
    World {
        addresses: Addresses {
            api: stack.api_addr,
            logs: stack.logs_addr,
            batches: stack.batches_addr.expect("item-batch"),
            scheduler: stack.scheduler_addr,
            runner: runner_addr,
        },
        alpha: Alpha {
            job_id: job.id,
            batch_id: batch.id,
        },
        stack,
        tokens,
        _runner: runner,
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
        || text.contains("alpha-maintainer")
        || text.contains("alpha-data")
}

#[tokio::test(flavor = "multi_thread")]
async fn a_revoked_token_fails_on_every_service_at_once() {
    let world = world().await;
    let stack = &world.stack;
    let token = stack.create_user("dora").await;
    let all = world.addresses.of("NodeService");
    for addr in &all {
        let me = stack
            .node_as(*addr, &token)
            .await
            .who_am_i(pb::WhoAmIRequest {})
            .await
            .expect("whoami")
            .into_inner();
        assert_eq!(me.user, "dora");
    }
    stack
        .users_as(&token)
        .await
        .revoke_token(pb::RevokeTokenRequest {
            token: "initial".into(),
        })
        .await
        .expect("revoke");
    // The very next call on each service is refused: tokens are checked on every call.
    for addr in &all {
        let refused = stack
            .node_as(*addr, &token)
            .await
            .who_am_i(pb::WhoAmIRequest {})
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated, "{addr}: {refused:?}");
    }
}

#[tokio::test(flavor = "multi_thread")]
async fn a_narrowed_token_never_does_more_than_its_user() {
    let world = world().await;
    let stack = &world.stack;
    let token = stack.create_user("finn").await;
    stack.add_member("alpha", "finn", pb::Role::Member).await;
    let mut users = stack.users_as(&token).await;
    let above = users
        .create_token(pb::CreateTokenRequest {
            name: "above".into(),
            project: "alpha".into(),
            role: pb::Role::Maintainer as i32,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(above.code(), Code::PermissionDenied, "{above:?}");
    let elsewhere = users
        .create_token(pb::CreateTokenRequest {
            name: "elsewhere".into(),
            project: "beta".into(),
            role: pb::Role::Viewer as i32,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(elsewhere.code(), Code::NotFound, "{elsewhere:?}");
    let viewer = users
        .create_token(pb::CreateTokenRequest {
            name: "viewer".into(),
            project: "alpha".into(),
            role: pb::Role::Viewer as i32,
            ..Default::default()
        })
        .await
        .expect("a viewer token")
        .into_inner()
        .secret;
    let me = stack
        .node_as(stack.api_addr, &viewer)
        .await
        .who_am_i(pb::WhoAmIRequest {})
        .await
        .expect("whoami")
        .into_inner();
    assert_eq!(me.memberships.len(), 1);
    assert_eq!(me.memberships[0].role, pb::Role::Viewer as i32);
    let refused = submit_result(stack, &viewer, "alpha").await.unwrap_err();
    assert_eq!(refused.code(), Code::PermissionDenied, "{refused:?}");
    // Finn made maintainer later: the viewer token stays a viewer's.
    stack.add_member("alpha", "finn", pb::Role::Maintainer).await;
    assert_eq!(
        submit_result(stack, &viewer, "alpha").await.unwrap_err().code(),
        Code::PermissionDenied
    );
    // Finn removed: the token reaches nothing of alpha.
    stack
        .projects_as(&stack.token)
        .await
        .remove_member(pb::RemoveMemberRequest {
            project: "alpha".into(),
            user: "finn".into(),
        })
        .await
        .expect("remove");
    let gone = stack
        .jobs_as(&viewer)
        .await
        .get_job(pb::GetJobRequest {
            job_id: world.alpha.job_id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(gone.code(), Code::NotFound, "{gone:?}");
}

/// Submits `true` to `project` as the owner of `token`.
async fn submit_result(stack: &Stack, token: &str, project: &str) -> Result<pb::SubmitJobResponse, tonic::Status> {
    stack
        .jobs_as(token)
        .await
        .submit_job(pb::SubmitJobRequest {
            spec: Some(pb::JobSpec {
                project: project.into(),
                ..spec(&["true"])
            }),
            ..Default::default()
        })
        .await
        .map(tonic::Response::into_inner)
}

#[tokio::test(flavor = "multi_thread")]
async fn disabling_a_user_refuses_their_tokens_and_stops_their_queued_jobs() {
    let world = world().await;
    let stack = &world.stack;
    let token = stack.member("eve").await;
    // More than the one-core runner holds at once: the second waits in the queue.
    let mut queued = spec(&["sleep", "60"]);
    queued.resources = Some(pb::Resources {
        cpu_millis: 64_000,
        memory_bytes: 1 << 20,
    });
    let job = stack
        .jobs_as(&token)
        .await
        .submit_job(pb::SubmitJobRequest {
            spec: Some(queued),
            ..Default::default()
        })
        .await
        .expect("submit")
        .into_inner()
        .job
        .expect("job");
    stack
        .users_as(&stack.token)
        .await
        .disable_user(pb::UserRef { name: "eve".into() })
        .await
        .expect("disable");
    for addr in world.addresses.of("NodeService") {
        let refused = stack
            .node_as(addr, &token)
            .await
            .who_am_i(pb::WhoAmIRequest {})
            .await
            .unwrap_err();
        assert_eq!(refused.code(), Code::Unauthenticated);
    }
    stack.wait_for_state(&job.id, pb::JobState::Stopped).await;
    let users = stack
        .users_as(&stack.token)
        .await
        .list_users(pb::ListUsersRequest {})
        .await
        .expect("users")
        .into_inner()
        .users;
    assert!(users.iter().any(|u| u.name == "eve" && u.disabled));
}
