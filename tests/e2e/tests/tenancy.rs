//! Tenancy on the two-project stack (kiln_e2e::two_projects): a revoked token fails on every
//! service at once, a narrowed token never does more than its user, and disabling a user
//! refuses their tokens and stops their queued jobs.

use kiln_e2e::two_projects::world;
use kiln_e2e::{Stack, spec};
use kiln_proto::v1 as pb;
use tonic::Code;

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
    let narrowed = |name: &str, project: &str, role: pb::Role| pb::CreateTokenRequest {
        name: name.into(),
        project: project.into(),
        role: role as i32,
        ..Default::default()
    };
    let above = users
        .create_token(narrowed("above", "alpha", pb::Role::Maintainer))
        .await
        .unwrap_err();
    assert_eq!(above.code(), Code::PermissionDenied, "{above:?}");
    let elsewhere = users
        .create_token(narrowed("elsewhere", "beta", pb::Role::Viewer))
        .await
        .unwrap_err();
    assert_eq!(elsewhere.code(), Code::NotFound, "{elsewhere:?}");
    let viewer = users
        .create_token(narrowed("viewer", "alpha", pb::Role::Viewer))
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
        ..Default::default()
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
