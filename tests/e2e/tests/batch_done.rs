//! A done batch stops its workers that have not started: placed on a runner that never took
//! them, or preempted after the end and queued again. The scheduler is stopped in these tests, so
//! nothing but item-batch (and the test, moving workers as runners and the scheduler would) moves
//! the workers.

use std::time::Duration;

use kiln_core::state::JobState;
use kiln_core::store::{Change, JobRecord};
use kiln_core::streams::Nats;
use kiln_e2e::{
    BATCH_PATIENCE, Stack, add_items, batch_spec, counts_of, create_batch, mem_items, seal_batch, wait_batch,
};
use kiln_proto::v1 as pb;

/// A batch of two items run to done by two workers placed as the scheduler places them: the
/// first on `runner-1`, which takes it and runs both items, the second on `runner-away`, which
/// never takes its launch and is moved on by hand through `away_states`. Returns the stack (its
/// scheduler stopped), a NATS client and that second worker as it was left.
async fn done_with_a_worker_away(away_states: &[JobState]) -> (Stack, Nats, JobRecord) {
    let mut stack = Stack::start_without_runner().await;
    stack.start_item_batch(stack.item_batch_config()).await;
    stack.scheduler.take().unwrap().stop().await;
    let mut spec = batch_spec(&["kiln:noop"]);
    spec.max_workers = 2;
    let batch = create_batch(&stack, spec).await;
    add_items(&stack, &batch.id, mem_items(["a".to_string(), "b".to_string()]))
        .await
        .unwrap();
    seal_batch(&stack, &batch.id).await;
    // One worker per item while nothing is measured.
    let deadline = tokio::time::Instant::now() + BATCH_PATIENCE;
    let workers = loop {
        let live = stack.store.live_batch_workers(&batch.id).await.unwrap();
        if live.len() == 2 {
            break live;
        }
        assert!(tokio::time::Instant::now() < deadline, "workers asked for: {live:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let runner_config = stack.runner_config("runner-1");
    let place = |runner: &str| Change {
        pool: Some(runner_config.pool.clone()),
        runner_id: Some(runner.to_string()),
        ..Change::default()
    };
    let mut away = stack
        .store
        .transition(&workers[1], JobState::Scheduled, place("runner-away"))
        .await
        .unwrap();
    for state in away_states {
        away = stack.store.transition(&away, *state, Change::default()).await.unwrap();
    }
    let runs = stack
        .store
        .transition(&workers[0], JobState::Scheduled, place("runner-1"))
        .await
        .unwrap();
    let nats = kiln_core::streams::connect(&stack.nats.config()).await.unwrap();
    kiln_core::events::publish_job_change(&nats, &stack.store, &runs)
        .await
        .unwrap();
    stack.runner = Some(stack.spawn_runner(runner_config).await);
    let done = wait_batch(&stack, &batch.id, "done", |b| b.state == pb::BatchState::Done as i32).await;
    assert_eq!(counts_of(&done).succeeded, 2);
    (stack, nats, away)
}

/// A worker placed on a runner that has not taken it (a runner slow to pull its launches, or
/// gone quiet with its lease held) is stopped once the batch has no backlog, not left holding
/// the runner's room.
#[tokio::test]
async fn workers_placed_but_not_started_are_stopped_when_the_batch_is_done() {
    let (stack, _nats, held) = done_with_a_worker_away(&[]).await;
    let stopped = stack.wait_for_state(&held.id, pb::JobState::Stopped).await;
    assert!(stopped.reason.contains("not needed"), "{}", stopped.reason);
}

/// A worker running when its batch is done and preempted after is queued again by the scheduler,
/// which knows nothing of batches; item-batch stops it before it gets a machine to find no work.
/// Its moves are made by hand as a runner's notice and the scheduler's requeue make them.
#[tokio::test]
async fn a_worker_preempted_after_its_batch_is_done_is_stopped_not_queued_for_a_machine() {
    let (stack, nats, away) = done_with_a_worker_away(&[JobState::Provisioning, JobState::Running]).await;

    // Its instance is taken back: PREEMPTED, then queued again for its next attempt.
    let preempted = stack
        .store
        .transition(&away, JobState::Preempted, Change::default())
        .await
        .unwrap();
    let queued = stack
        .store
        .transition(
            &preempted,
            JobState::Queued,
            Change {
                next_attempt: true,
                ..Change::default()
            },
        )
        .await
        .unwrap();
    kiln_core::events::publish_job_change(&nats, &stack.store, &queued)
        .await
        .unwrap();
    let stopped = stack.wait_for_state(&away.id, pb::JobState::Stopped).await;
    assert!(stopped.reason.contains("batch has ended"), "{}", stopped.reason);
}
