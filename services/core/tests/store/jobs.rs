//! Jobs: compare-and-set transitions, new attempts, what is left to publish, who holds a job,
//! and usage by pool.

use super::*;

pub async fn transitions_compare_and_set(store: Store) {
    let queued = store.insert_job(new_job("u1")).await.unwrap();
    let scheduled = store
        .transition(
            &queued,
            JobState::Scheduled,
            Change {
                pool: Some("gpu".into()),
                ..Change::default()
            },
        )
        .await
        .unwrap();
    assert_eq!((scheduled.version, scheduled.pool.as_str()), (2, "gpu"));

    // The stale record loses.
    let stale = store.transition(&queued, JobState::Stopped, Change::default()).await;
    assert!(
        matches!(
            stale,
            Err(StoreError::Conflict {
                expected: 1,
                actual: 2,
                ..
            })
        ),
        "{stale:?}"
    );
    // The state machine refuses skipping ahead.
    let illegal = store
        .transition(&scheduled, JobState::Succeeded, Change::default())
        .await;
    assert!(
        matches!(illegal, Err(StoreError::IllegalTransition { .. })),
        "{illegal:?}"
    );

    let provisioning = store
        .transition(
            &scheduled,
            JobState::Provisioning,
            Change {
                runner_id: Some("r1".into()),
                ..Change::default()
            },
        )
        .await
        .unwrap();
    let running = store
        .transition(
            &provisioning,
            JobState::Running,
            Change {
                instance_id: Some("pid:1".into()),
                ..Change::default()
            },
        )
        .await
        .unwrap();
    assert!(running.started_at_ms.is_some());
    assert!(running.finished_at_ms.is_none());
    let failed = store
        .transition(
            &running,
            JobState::Failed,
            Change {
                exit_code: Some(3),
                reason: Some("exited with code 3".into()),
                ..Change::default()
            },
        )
        .await
        .unwrap();
    assert_eq!((failed.exit_code, failed.version), (Some(3), 5));
    assert!(failed.finished_at_ms.is_some());
    assert_eq!(failed.runner_id, "r1");
}

pub async fn concurrent_transitions_have_one_winner(store: Store) {
    let job = store.insert_job(new_job("u1")).await.unwrap();
    let mut tasks = Vec::new();
    for n in 0..8 {
        let store = store.clone();
        let job = job.clone();
        tasks.push(tokio::spawn(async move {
            let change = Change {
                pool: Some(format!("pool{n}")),
                ..Change::default()
            };
            store.transition(&job, JobState::Scheduled, change).await
        }));
    }
    let mut winners = 0;
    for task in tasks {
        match task.await.unwrap() {
            Ok(_) => winners += 1,
            Err(StoreError::Conflict { .. }) => {}
            Err(error) => panic!("unexpected error: {error}"),
        }
    }
    assert_eq!(winners, 1);
    assert_eq!(store.job(&job.id).await.unwrap().version, 2);
}

pub async fn requeue_starts_a_new_attempt(store: Store) {
    let job = store.insert_job(new_job("u1")).await.unwrap();
    let job = place(&store, job, "r").await;
    let requeued = store
        .transition(
            &job,
            JobState::Queued,
            Change {
                next_attempt: true,
                ..Change::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (requeued.attempt, requeued.runner_id.as_str(), requeued.pool.as_str()),
        (2, "", "")
    );
}

pub async fn unpublished_changes_are_found_until_marked(store: Store) {
    let job = store.insert_job(new_job("u1")).await.unwrap();
    let pending = store.unpublished_jobs(&[JobState::Queued]).await.unwrap();
    assert_eq!(pending.len(), 1);
    store.mark_published(&job.id, 1).await.unwrap();
    assert!(store.unpublished_jobs(&[JobState::Queued]).await.unwrap().is_empty());
    let scheduled = store
        .transition(
            &job,
            JobState::Scheduled,
            Change {
                pool: Some("p".into()),
                ..Change::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(store.unpublished_jobs(&[JobState::Scheduled]).await.unwrap().len(), 1);
    // A runner's own: the job is on none yet, then on "r1", never on "r2".
    assert!(store.unpublished_jobs_on("r1").await.unwrap().is_empty());
    store.mark_published(&job.id, scheduled.version).await.unwrap();
    let running = store
        .transition(
            &scheduled,
            JobState::Provisioning,
            Change {
                runner_id: Some("r1".into()),
                ..Change::default()
            },
        )
        .await
        .unwrap();
    let on_r1 = store.unpublished_jobs_on("r1").await.unwrap();
    assert_eq!(
        on_r1.iter().map(|j| (j.id.as_str(), j.version)).collect::<Vec<_>>(),
        [(job.id.as_str(), running.version)]
    );
    assert!(store.unpublished_jobs_on("r2").await.unwrap().is_empty());
    store.mark_published(&job.id, running.version).await.unwrap();
    assert!(store.unpublished_jobs_on("r1").await.unwrap().is_empty());
    // Marking an older version never moves the mark back.
    store.mark_published(&job.id, 1).await.unwrap();
    assert_eq!(store.job(&job.id).await.unwrap().published_version, running.version);
}

/// A queued job placed on `runner` (SCHEDULED, then PROVISIONING there).
async fn place(store: &Store, job: JobRecord, runner: &str) -> JobRecord {
    let scheduled = store
        .transition(
            &job,
            JobState::Scheduled,
            Change {
                pool: Some("p".into()),
                ..Change::default()
            },
        )
        .await
        .unwrap();
    store
        .transition(
            &scheduled,
            JobState::Provisioning,
            Change {
                runner_id: Some(runner.into()),
                ..Change::default()
            },
        )
        .await
        .unwrap()
}

pub async fn busy_runners_are_those_holding_an_active_job(store: Store) {
    // Queued (no runner): nobody is busy.
    let a = store.insert_job(new_job("u1")).await.unwrap();
    assert!(store.busy_runners().await.unwrap().is_empty());
    let a = place(&store, a, "r1").await;
    let b = place(&store, store.insert_job(new_job("u1")).await.unwrap(), "r1").await;
    let c = place(&store, store.insert_job(new_job("u1")).await.unwrap(), "r2").await;
    let mut busy = store.busy_runners().await.unwrap();
    busy.sort();
    assert_eq!(busy, ["r1", "r2"], "each runner once");
    // r2's job ended: r2 is idle; r1 keeps one.
    store.transition(&c, JobState::Lost, Change::default()).await.unwrap();
    store.transition(&a, JobState::Lost, Change::default()).await.unwrap();
    assert_eq!(store.busy_runners().await.unwrap(), ["r1"]);
    store.transition(&b, JobState::Lost, Change::default()).await.unwrap();
    assert!(store.busy_runners().await.unwrap().is_empty());
}

pub async fn stop_requests_keep_the_version(store: Store) {
    let job = store.insert_job(new_job("u1")).await.unwrap();
    let hold = |stop_requested| kiln_core::store::JobHold {
        state: Some(JobState::Queued),
        attempt: 1,
        runner_id: String::new(),
        stop_requested,
    };
    assert_eq!(store.job_hold(&job.id).await.unwrap(), hold(false));
    let flagged = store.request_stop(&job.id).await.unwrap();
    assert!(flagged.stop_requested);
    assert_eq!(flagged.version, job.version);
    assert_eq!(store.job_hold(&job.id).await.unwrap(), hold(true));
    assert!(matches!(
        store.job_hold("job-none").await,
        Err(kiln_core::store::StoreError::JobNotFound { .. })
    ));
}

pub async fn usage_is_summed_by_pool(store: Store) {
    for pool in ["a", "a", "b"] {
        let job = store.insert_job(new_job("u1")).await.unwrap();
        store
            .transition(
                &job,
                JobState::Scheduled,
                Change {
                    pool: Some(pool.into()),
                    ..Change::default()
                },
            )
            .await
            .unwrap();
    }
    store.insert_job(new_job("u1")).await.unwrap();
    let usage = store.active_usage_by_pool().await.unwrap();
    assert_eq!(
        (usage["a"].cpu_millis, usage["a"].memory_bytes, usage["a"].gpus),
        (3000, 2 << 30, 0)
    );
    assert_eq!((usage["b"].cpu_millis, usage["b"].memory_bytes), (1500, 1 << 30));
    assert_eq!(usage.len(), 2);
}
