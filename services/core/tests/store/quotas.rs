//! The quota part of the store's conformance suite (store.rs runs it on SQLite and Postgres).

use super::*;

pub(super) async fn quotas_round_trip_and_queued_jobs_are_counted(store: Store) {
    use kiln_core::store::{QueuedCounts, QuotaRecord};
    let quota = QuotaRecord {
        scope: "user:alice".into(),
        cpu_millis: None,
        memory_bytes: Some(1 << 34),
        gpus: Some(2),
        running_jobs: None,
        queued_jobs: Some(10),
        updated_at_ms: 0,
        weight: None,
    };
    store.set_quota(quota.clone()).await.unwrap();
    let changed = QuotaRecord {
        gpus: Some(4),
        weight: Some(2.5),
        ..quota.clone()
    };
    store.set_quota(changed).await.unwrap();
    store
        .set_quota(QuotaRecord {
            scope: "global".into(),
            ..quota
        })
        .await
        .unwrap();
    let read = store.quota("user:alice").await.unwrap().unwrap();
    assert_eq!(
        (read.gpus, read.cpu_millis, read.queued_jobs, read.weight),
        (Some(4), None, Some(10), Some(2.5))
    );
    let scopes: Vec<String> = store.quotas().await.unwrap().into_iter().map(|q| q.scope).collect();
    assert_eq!(scopes, ["global", "user:alice"]);
    assert!(store.delete_quota("global").await.unwrap().is_some());
    assert!(store.delete_quota("global").await.unwrap().is_none());

    let mut other = new_job("u2");
    other.project = "vision".into();
    store.insert_job(new_job("u1")).await.unwrap();
    store.insert_job(new_job("u1")).await.unwrap();
    let started = store.insert_job(other).await.unwrap();
    store
        .transition(&started, JobState::Scheduled, Change::default())
        .await
        .unwrap();
    store.insert_job(new_job("u2")).await.unwrap();
    assert_eq!(
        store.queued_counts("u1", "default").await.unwrap(),
        QueuedCounts {
            user: 2,
            project: 3,
            global: 3
        }
    );
    let job = store
        .insert_job(NewJob {
            priority_class: "high".into(),
            market_policy: kiln_core::scheduling::MarketPolicy::Spot,
            ..new_job("u1")
        })
        .await
        .unwrap();
    assert_eq!((job.priority, job.market_policy.as_str()), (200, "spot"));
    let scheduled = store
        .transition(
            &job,
            JobState::Scheduled,
            Change {
                market: Some(kiln_core::scheduling::Market::Spot),
                cost_micros: Some((5, 12)),
                gpu_ms: Some(7),
                ..Change::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(
        (
            scheduled.market.as_str(),
            scheduled.cost_micros,
            scheduled.on_demand_cost_micros,
            scheduled.gpu_ms
        ),
        ("spot", 5, 12, 7)
    );
}

/// Sixteen submits at once, as from several api replicas, under a queued quota of five.
pub(super) async fn concurrent_submits_never_pass_a_queued_quota_together(store: Store) {
    let submits: Vec<_> = (0..16)
        .map(|_| {
            let store = store.clone();
            tokio::spawn(async move {
                store
                    .insert_job_admitted(
                        new_job("u1"),
                        |counts| {
                            if counts.user < 5 { Ok(()) } else { Err(counts.user) }
                        },
                    )
                    .await
                    .unwrap()
            })
        })
        .collect();
    let (mut admitted, mut refused) = (0, 0);
    for submit in submits {
        match submit.await.unwrap() {
            Ok(job) => {
                assert_eq!(job.state().unwrap(), JobState::Queued);
                admitted += 1;
            }
            Err(seen) => {
                assert_eq!(seen, 5, "a refused submit saw {seen} queued");
                refused += 1;
            }
        }
    }
    assert_eq!((admitted, refused), (5, 11));
    assert_eq!(store.queued_counts("u1", "default").await.unwrap().user, 5);
}
