//! Crash safety: a service dying at any point loses no job and applies nothing twice.

use async_nats::jetstream;
use bytes::Bytes;
use kiln_core::events::publish_job_change;
use kiln_core::store::NewJob;
use kiln_core::streams::publish;
use kiln_core::{JobState, subjects};
use kiln_e2e::{Stack, pid_of, process_alive};
use kiln_proto::v1 as pb;
use prost::Message;

#[tokio::test]
async fn a_job_whose_runner_crashed_ends_lost_and_its_process_is_killed() {
    let mut stack = Stack::start().await;
    let job = stack.submit(&["sleep", "600"]).await;
    let running = stack.wait_for_state(&job.id, pb::JobState::Running).await;
    let pid = pid_of(&running);

    stack.runner.take().unwrap().crash().await;
    // Back within its lease's TTL (10 s), the runner ends the job itself; one that stays away
    // longer has it ended by the scheduler (tests/leases.rs).
    stack.runner = Some(stack.spawn_runner(stack.runner_config("runner-1")).await);
    let lost = stack.wait_for_state(&job.id, pb::JobState::Lost).await;
    assert_eq!(lost.reason, "the runner restarted while the job ran");
    assert!(!process_alive(pid), "the job's process {pid} survived");
    // The follow of its logs ends although no end record was written.
    stack.log_lines(&job.id, true).await;
}

#[tokio::test]
async fn with_requeue_a_job_whose_runner_crashed_runs_again() {
    let mut stack = Stack::start_without_runner().await;
    let mut config = stack.runner_config("runner-1");
    config.on_lost = kiln_runner::OnLost::Requeue;
    stack.runner = Some(stack.spawn_runner(config.clone()).await);
    let shared = kiln_e2e::job_writable_dir();
    let marker = kiln_e2e::job_writable_file(shared.path(), "attempts.txt");
    // Each attempt says what it resumed from, then checkpoints.
    let script = format!(
        "echo attempt $KILN_ATTEMPT resumes ${{KILN_RESUME_FROM:+$(cat $KILN_RESUME_FROM/ckpt)}} >> {0}; \
         echo step-$KILN_ATTEMPT > $KILN_OUTPUTS/ckpt; echo checkpointed >> {0}; sleep 600",
        marker.display()
    );
    let job = stack.submit(&["sh", "-c", &script]).await;
    let first = stack.wait_for_state(&job.id, pb::JobState::Running).await;
    let deadline = tokio::time::Instant::now() + kiln_e2e::PATIENCE;
    while !std::fs::read_to_string(&marker)
        .unwrap_or_default()
        .contains("checkpointed")
    {
        assert!(
            tokio::time::Instant::now() < deadline,
            "the first attempt never checkpointed"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    stack.runner.take().unwrap().crash().await;
    stack.runner = Some(stack.spawn_runner(config).await);
    let second = stack
        .wait_for(&job.id, "the second attempt", |j| {
            j.attempt == 2 && j.state == pb::JobState::Running as i32
        })
        .await;
    assert!(!process_alive(pid_of(&first)));
    assert_ne!(pid_of(&first), pid_of(&second));
    stack
        .jobs()
        .await
        .stop_job(pb::StopJobRequest { job_id: job.id.clone() })
        .await
        .unwrap();
    stack.wait_for_state(&job.id, pb::JobState::Stopped).await;
    // The restarted runner synced what the killed attempt left, and the next one resumed from it.
    assert_eq!(second.resume_from, format!("outputs/{}", job.id));
    let attempts = std::fs::read_to_string(&marker).unwrap();
    assert_eq!(
        attempts,
        "attempt 1 resumes\ncheckpointed\nattempt 2 resumes step-1\ncheckpointed\n"
    );
}

#[tokio::test]
async fn a_change_committed_before_an_api_crash_is_published_on_restart() {
    let mut stack = Stack::start_without_runner().await;
    // Only the api's reconciler may publish QUEUED changes: keep the scheduler out of the way.
    stack.scheduler.take().unwrap().crash().await;
    stack.api.take().unwrap().crash().await;
    // The api committed the job and died before publishing it: the database has it, NATS not.
    let (token_id, secret) = kiln_core::auth::parse_token(&stack.token).unwrap();
    let owner = stack.store.verify_token(token_id, secret).await.unwrap().unwrap();
    let job = stack
        .store
        .insert_job(NewJob {
            owner_id: owner.user_id,
            project: "default".into(),
            name: "orphan".into(),
            command: vec!["true".into()],
            cpu_millis: 100,
            memory_bytes: 1 << 20,
            ..NewJob::default()
        })
        .await
        .unwrap();
    assert_eq!(job.published_version, 0);

    stack.restart_api().await;
    let deadline = tokio::time::Instant::now() + kiln_e2e::PATIENCE;
    while stack.store.job(&job.id).await.unwrap().published_version < job.version {
        assert!(tokio::time::Instant::now() < deadline, "the reconciler did not publish");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let js = jetstream::new(stack.nats.client().await);
    let stream = js.get_stream(subjects::STREAM_JOBS).await.unwrap();
    let message = stream
        .get_last_raw_message_by_subject(subjects::JOB_QUEUED)
        .await
        .unwrap();
    let event = pb::JobEvent::decode(message.payload.as_ref()).unwrap();
    assert_eq!(
        (event.job_id.as_str(), event.version, event.state),
        (job.id.as_str(), 1, pb::JobState::Queued as i32)
    );
    let msg_id = message.headers.get("Nats-Msg-Id").map(|v| v.to_string());
    assert_eq!(msg_id, Some(subjects::job_msg_id(&job.id, 1)));
    // The restarted api serves the job as usual.
    assert_eq!(stack.get(&job.id).await.state, pb::JobState::Queued as i32);
}

#[tokio::test]
async fn republishing_a_change_stores_it_once() {
    let stack = Stack::start_without_runner().await;
    let job = stack.submit(&["true"]).await;
    let record = stack.store.job(&job.id).await.unwrap();
    let js = jetstream::new(stack.nats.client().await);
    let mut stream = js.get_stream(subjects::STREAM_JOBS).await.unwrap();
    let before = stream.info().await.unwrap().state.messages;
    // The reconciler publishing the same version again (a crash before the mark).
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.unwrap();
    publish_job_change(&nats, &stack.store, &record).await.unwrap();
    publish_job_change(&nats, &stack.store, &record).await.unwrap();
    let after = stream.info().await.unwrap().state.messages;
    assert_eq!(before, after, "duplicates were stored");
}

#[tokio::test]
async fn a_duplicate_launch_runs_nothing_twice() {
    let stack = Stack::start().await;
    let shared = kiln_e2e::job_writable_dir();
    let marker = kiln_e2e::job_writable_file(shared.path(), "runs.txt");
    let script = format!("echo run >> {}", marker.display());
    let job = stack.submit(&["sh", "-c", &script]).await;
    let done = stack.wait_for_state(&job.id, pb::JobState::Succeeded).await;

    // Redeliver its launch request with another message id, past JetStream's de-duplication.
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.unwrap();
    let scheduled_version = 2;
    let launch = pb::LaunchRequest {
        job_id: job.id.clone(),
        version: scheduled_version,
        attempt: 1,
        node_rank: 0,
    };
    for n in 0..3 {
        let msg_id = format!("{}:replay:{n}", job.id);
        publish(
            &nats.jetstream,
            subjects::launch_on("local", &done.runner_id),
            &msg_id,
            Bytes::from(launch.encode_to_vec()),
        )
        .await
        .unwrap();
    }
    // Wait until the runner has taken them all from the work queue.
    let js = jetstream::new(stack.nats.client().await);
    let mut stream = js.get_stream(subjects::STREAM_LAUNCH).await.unwrap();
    let deadline = tokio::time::Instant::now() + kiln_e2e::PATIENCE;
    while stream.info().await.unwrap().state.messages > 0 {
        assert!(tokio::time::Instant::now() < deadline, "launches not consumed");
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
    let after = stack.get(&job.id).await;
    assert_eq!((after.state, after.version), (done.state, done.version));
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "run\n");
    assert_eq!(
        stack.store.job(&job.id).await.unwrap().state().unwrap(),
        JobState::Succeeded
    );
}
