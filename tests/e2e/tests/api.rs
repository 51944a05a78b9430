//! The api's edge: authentication, input validation with the right status codes, visibility of
//! other users' jobs, and content-addressed artifacts.

use kiln_core::auth::Scope;
use kiln_e2e::{Stack, bundle, spec, upload};
use kiln_proto::v1 as pb;
use kiln_proto::v1::job_service_client::JobServiceClient;
use kiln_proto::v1::log_service_client::LogServiceClient;
use tonic::Code;
use tonic::transport::Channel;

#[tokio::test]
async fn calls_without_a_valid_token_are_unauthenticated() {
    let stack = Stack::start_without_runner().await;
    let channel = Channel::from_shared(format!("http://{}", stack.api_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let mut anonymous = JobServiceClient::new(channel);
    let status = anonymous.list_jobs(pb::ListJobsRequest::default()).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated, "{status:?}");
    assert!(status.message().contains("missing bearer token"), "{status:?}");

    let forged = format!("kiln_{}_{}", "0".repeat(16), "1".repeat(64));
    // The real token with its last character changed (a `replace` of one letter changed nothing
    // in a token without that letter, and the test then failed by chance).
    let mut tampered = stack.token.clone();
    let last = tampered.pop().expect("a token");
    tampered.push(if last == '0' { '1' } else { '0' });
    for token in ["garbage", forged.as_str(), tampered.as_str()] {
        let status = stack
            .jobs_as(token)
            .await
            .list_jobs(pb::ListJobsRequest::default())
            .await
            .unwrap_err();
        assert_eq!(status.code(), Code::Unauthenticated, "token {token}: {status:?}");
    }
    let channel = Channel::from_shared(format!("http://{}", stack.logs_addr))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let request = pb::GetLogsRequest {
        job_id: kiln_core::ids::new_id(),
        follow: false,
        ..Default::default()
    };
    let status = LogServiceClient::new(channel).get_logs(request).await.unwrap_err();
    assert_eq!(status.code(), Code::Unauthenticated);

    // The right token works on both.
    assert!(
        stack
            .jobs()
            .await
            .list_jobs(pb::ListJobsRequest::default())
            .await
            .is_ok()
    );
}

#[tokio::test]
async fn bad_input_is_refused_with_a_useful_message() {
    let stack = Stack::start_without_runner().await;
    let mut jobs = stack.jobs().await;
    let submit = |spec: pb::JobSpec| pb::SubmitJobRequest {
        spec: Some(spec),
        ..Default::default()
    };
    let mut cases: Vec<(pb::JobSpec, &str)> = Vec::new();
    let mut zero_cpu = spec(&["true"]);
    zero_cpu.resources = Some(pb::Resources {
        cpu_millis: 0,
        memory_bytes: 1 << 20,
        ..Default::default()
    });
    cases.push((zero_cpu, "cpu_millis must be greater than 0"));
    let mut zero_memory = spec(&["true"]);
    zero_memory.resources = Some(pb::Resources {
        cpu_millis: 100,
        memory_bytes: 0,
        ..Default::default()
    });
    cases.push((zero_memory, "memory_bytes must be greater than 0"));
    cases.push((spec(&[]), "command is empty"));
    cases.push((spec(&[""]), "command is empty"));
    let mut bad_env = spec(&["true"]);
    bad_env.env.insert("A=B".into(), "x".into());
    cases.push((bad_env, "env name"));
    let mut bad_project = spec(&["true"]);
    bad_project.project = "no spaces".into();
    cases.push((bad_project, "project"));
    for (spec, expected) in cases {
        let status = jobs.submit_job(submit(spec.clone())).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{spec:?}: {status:?}");
        assert!(status.message().contains(expected), "{spec:?}: {status:?}");
    }

    let mut missing_code = spec(&["true"]);
    missing_code.code_digest = "c".repeat(64);
    let status = jobs.submit_job(submit(missing_code)).await.unwrap_err();
    assert_eq!(status.code(), Code::FailedPrecondition);
    assert!(status.message().contains("upload it"), "{status:?}");

    let unknown = kiln_core::ids::new_id();
    let status = jobs
        .get_job(pb::GetJobRequest {
            job_id: unknown.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    assert!(status.message().contains(&unknown));
    let status = jobs.stop_job(pb::StopJobRequest { job_id: unknown }).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let status = jobs
        .get_job(pb::GetJobRequest {
            job_id: "not-an-id".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("not a valid id"));

    // Nothing of that reached the database.
    assert!(
        stack
            .store
            .list_jobs(None, &kiln_core::authz::Visible::All, true, 100)
            .await
            .unwrap()
            .is_empty()
    );
}

#[tokio::test]
async fn users_see_only_their_projects() {
    let stack = Stack::start_without_runner().await;
    let admin_job = stack.submit(&["true"]).await;
    let ada_token = stack.create_user("ada").await;
    stack.create_project("lab").await;
    stack.add_member("lab", "ada", pb::Role::Member).await;
    let mut ada_jobs = stack.jobs_as(&ada_token).await;

    let status = ada_jobs
        .get_job(pb::GetJobRequest {
            job_id: admin_job.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let status = ada_jobs
        .stop_job(pb::StopJobRequest {
            job_id: admin_job.id.clone(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound);
    let request = pb::GetLogsRequest {
        job_id: admin_job.id.clone(),
        follow: false,
        ..Default::default()
    };
    let status = stack.logs_as(&ada_token).await.get_logs(request).await.unwrap_err();
    assert_eq!(status.code(), Code::NotFound);

    // Not a member of `default`: told it does not exist.
    let status = ada_jobs
        .submit_job(pb::SubmitJobRequest {
            spec: Some(spec(&["true"])),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::NotFound, "{status:?}");
    let ada_job = ada_jobs
        .submit_job(pb::SubmitJobRequest {
            spec: Some(pb::JobSpec {
                project: "lab".into(),
                ..spec(&["true"])
            }),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    let listed = ada_jobs
        .list_jobs(pb::ListJobsRequest {
            all: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(
        listed.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        [ada_job.id.as_str()]
    );
    // The admin sees everyone's.
    let listed = stack
        .jobs()
        .await
        .list_jobs(pb::ListJobsRequest {
            all: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(listed.len(), 2);

    // A job-scoped token (as the runner makes one for each job) cannot use the user API.
    let ada = stack.store.user_by_name("ada").await.unwrap().unwrap();
    let job_token = stack
        .store
        .create_token(&ada.id, "job", Scope::Job(ada_job.id.clone()))
        .await
        .unwrap()
        .token;
    let status = stack
        .jobs_as(&job_token)
        .await
        .list_jobs(pb::ListJobsRequest::default())
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::PermissionDenied);
}

#[tokio::test]
async fn the_same_bundle_is_stored_once() {
    let stack = Stack::start_without_runner().await;
    let mut artifacts = stack.artifacts().await;
    let (bytes, digest) = bundle(&[("train.py", "print('hi')\n")]);

    let stat = artifacts
        .stat_artifact(pb::StatArtifactRequest {
            digest: digest.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!stat.exists);
    let first = upload(&mut artifacts, &bytes, &digest).await.unwrap();
    assert!(first.created);
    let second = upload(&mut artifacts, &bytes, &digest).await.unwrap();
    assert!(!second.created);
    let stat = artifacts
        .stat_artifact(pb::StatArtifactRequest {
            digest: digest.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(stat.exists);
    assert_eq!(stat.size, bytes.len() as u64);

    let stored: Vec<_> = std::fs::read_dir(stack.objects_dir().join("artifacts/sha256"))
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .collect();
    assert_eq!(stored, std::slice::from_ref(&digest));
    assert_eq!(
        std::fs::read(stack.objects_dir().join("artifacts/sha256").join(&digest)).unwrap(),
        bytes
    );
}

#[tokio::test]
async fn corrupt_uploads_store_nothing() {
    let stack = Stack::start_without_runner().await;
    let mut artifacts = stack.artifacts().await;
    let (bytes, _) = bundle(&[("a", "b")]);
    let wrong = "d".repeat(64);
    let status = upload(&mut artifacts, &bytes, &wrong).await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    assert!(status.message().contains("not the declared"), "{status:?}");
    let status = upload(&mut artifacts, &bytes, "XYZ").await.unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let stat = artifacts
        .stat_artifact(pb::StatArtifactRequest {
            digest: wrong.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert!(!stat.exists);
    let dir = stack.objects_dir().join("artifacts/sha256");
    let stored = std::fs::read_dir(&dir).map(|entries| entries.count()).unwrap_or(0);
    assert_eq!(stored, 0);
}

#[tokio::test]
async fn runs_outside_kiln_are_created_and_finished() {
    let stack = Stack::start().await;
    let mut jobs = stack.jobs().await;
    let run = jobs
        .create_run(pb::CreateRunRequest {
            name: "notebook".into(),
            project: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (run.state, run.pool.as_str()),
        (pb::JobState::Running as i32, "external")
    );
    assert!(run.started_at_ms > 0);
    // The scheduler and the runner leave it alone.
    tokio::time::sleep(std::time::Duration::from_millis(500)).await;
    assert_eq!(stack.get(&run.id).await.version, run.version);
    let ended = jobs
        .finish_run(pb::FinishRunRequest {
            job_id: run.id.clone(),
            exit_code: 2,
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(
        (ended.state, ended.reason.as_str()),
        (pb::JobState::Failed as i32, "exited with code 2")
    );
    // Finishing twice is harmless; a kiln job cannot be finished from outside.
    jobs.finish_run(pb::FinishRunRequest {
        job_id: run.id.clone(),
        exit_code: 0,
    })
    .await
    .unwrap();
    let job = stack.submit(&["sleep", "5"]).await;
    let status = jobs
        .finish_run(pb::FinishRunRequest {
            job_id: job.id,
            exit_code: 0,
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
    let status = jobs
        .create_run(pb::CreateRunRequest {
            name: String::new(),
            project: "bad project".into(),
        })
        .await
        .unwrap_err();
    assert_eq!(status.code(), Code::InvalidArgument);
}

#[tokio::test]
async fn a_submit_retried_with_its_idempotency_key_makes_one_job() {
    let stack = Stack::start_without_runner().await;
    let keyed = |command: &str, key: &str| pb::SubmitJobRequest {
        spec: Some(spec(&[command])),
        idempotency_key: key.into(),
    };
    let mut jobs = stack.jobs().await;
    let first = jobs
        .submit_job(keyed("true", "retry-1"))
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    let again = jobs
        .submit_job(keyed("true", "retry-1"))
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_eq!(again.id, first.id, "a retry gets the job of the first submit");
    let listed = jobs
        .list_jobs(pb::ListJobsRequest {
            all: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .jobs;
    assert_eq!(listed.len(), 1, "{listed:?}");

    // The same key for another spec is refused, naming the job it made.
    let status = jobs.submit_job(keyed("false", "retry-1")).await.unwrap_err();
    assert_eq!(status.code(), Code::AlreadyExists, "{status:?}");
    assert!(status.message().contains(&first.id), "{status:?}");
    // So is the same key with any other part of the spec changed (the whole spec is hashed):
    // env, GPUs, priority, market and run time, which the old comparison left out.
    type Change = (&'static str, fn(&mut pb::JobSpec));
    let changes: [Change; 5] = [
        ("env", |spec| {
            spec.env.insert("SEED".into(), "2".into());
        }),
        ("gpus", |spec| spec.gpus = 1),
        ("priority", |spec| spec.priority_class = "high".into()),
        ("market", |spec| spec.market = pb::Market::Spot as i32),
        ("max runtime", |spec| spec.max_runtime_secs = 60),
    ];
    for (what, change) in changes {
        let mut changed = keyed("true", "retry-1");
        change(changed.spec.as_mut().expect("spec"));
        let status = jobs.submit_job(changed).await.unwrap_err();
        assert_eq!(status.code(), Code::AlreadyExists, "{what}: {status:?}");
    }

    // Keys are per user: another user's equal key is another job.
    let ada_token = stack.member("ada").await;
    let theirs = stack
        .jobs_as(&ada_token)
        .await
        .submit_job(keyed("true", "retry-1"))
        .await
        .unwrap()
        .into_inner()
        .job
        .unwrap();
    assert_ne!(theirs.id, first.id);

    // Concurrent submits with one key: one job, every answer naming it.
    let answers = futures::future::join_all((0..8).map(|_| {
        let mut jobs = jobs.clone();
        async move {
            jobs.submit_job(keyed("true", "race"))
                .await
                .unwrap()
                .into_inner()
                .job
                .unwrap()
                .id
        }
    }))
    .await;
    assert!(answers.iter().all(|id| *id == answers[0]), "{answers:?}");

    for bad in ["has space", &"k".repeat(129)] {
        let status = jobs.submit_job(keyed("true", bad)).await.unwrap_err();
        assert_eq!(status.code(), Code::InvalidArgument, "{bad:?}: {status:?}");
    }
}
