//! The metadata store's conformance suite: every test runs on SQLite and on Postgres
//! (`KILN_TEST_DATABASE_URL`, started by scripts/test.sh), after applying the migrations.

use std::collections::BTreeMap;

use kiln_core::JobState;
use kiln_core::auth::Scope;
use kiln_core::store::{Change, JobRecord, NewArtifact, NewJob, Store, StoreError};

#[path = "store/cloud.rs"]
mod cloud;
#[path = "store/jobs.rs"]
mod jobs;
#[path = "store/logins.rs"]
mod logins;
#[path = "store/models.rs"]
mod models;
#[path = "store/names.rs"]
mod names;
#[path = "store/owners.rs"]
mod owners;
#[path = "store/quotas.rs"]
mod quotas;
#[path = "store/runs.rs"]
mod runs;

use cloud::{a_create_call_of_thousands_of_instances_is_recorded_whole, intents_and_instances_move_by_compare_and_set};
use jobs::{
    busy_runners_are_those_holding_an_active_job, concurrent_transitions_have_one_winner, requeue_starts_a_new_attempt,
    stop_requests_keep_the_version, transitions_compare_and_set, unpublished_changes_are_found_until_marked,
    usage_is_summed_by_pool,
};
use logins::{
    a_code_approved_by_another_user_cancels_the_login, a_login_is_redeemed_once_and_only_by_the_browser_that_asked,
    wrong_codes_run_out_and_expired_logins_are_refused,
};
use models::{aliases_move_atomically_under_concurrent_calls, model_versions_are_numbered_and_searched};
use owners::{
    a_disable_racing_controller_inserts_leaves_no_job_behind, controller_jobs_need_an_owner_in_good_standing,
};
use quotas::{concurrent_submits_never_pass_a_queued_quota_together, quotas_round_trip_and_queued_jobs_are_counted};
use runs::{
    concurrent_run_updates_all_land, run_artifacts_are_saved_listed_and_replaced, runs_keep_config_summary_and_sweep,
};

fn new_job(owner: &str) -> NewJob {
    NewJob {
        owner_id: owner.into(),
        project: "default".into(),
        name: "train".into(),
        command: vec!["python".into(), "train.py".into()],
        env: BTreeMap::from([("SEED".into(), "1".into())]),
        cpu_millis: 1500,
        memory_bytes: 1 << 30,
        ..NewJob::default()
    }
}

async fn migrations_apply_and_are_idempotent(store: Store) {
    store.check_schema().await.unwrap();
    store.migrate().await.unwrap();
    store.check_schema().await.unwrap();
}

async fn jobs_round_trip(store: Store) {
    let job = store.insert_job(new_job("u1")).await.unwrap();
    assert_eq!(job.state().unwrap(), JobState::Queued);
    assert_eq!((job.version, job.published_version, job.attempt), (1, 0, 1));
    let read = store.job(&job.id).await.unwrap();
    assert_eq!(read, job);
    assert_eq!(read.command().unwrap(), ["python", "train.py"]);
    assert_eq!(read.env().unwrap()["SEED"], "1");
    assert!(matches!(
        store.job("01a22826-4a16-7345-8170-000000000000").await,
        Err(StoreError::JobNotFound { .. })
    ));
}

async fn listing_filters_owner_and_state(store: Store) {
    let first = store.insert_job(new_job("u1")).await.unwrap();
    let second = store.insert_job(new_job("u1")).await.unwrap();
    store.insert_job(new_job("u2")).await.unwrap();
    store
        .transition(&first, JobState::Stopped, Change::default())
        .await
        .unwrap();

    let active = store
        .list_jobs(Some("u1"), &kiln_core::authz::Visible::All, false, 100)
        .await
        .unwrap();
    assert_eq!(
        active.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        [second.id.as_str()]
    );
    let all = store
        .list_jobs(Some("u1"), &kiln_core::authz::Visible::All, true, 100)
        .await
        .unwrap();
    assert_eq!(all.len(), 2);
    assert_eq!(all[0].id, second.id, "newest first");
    assert_eq!(
        store
            .list_jobs(None, &kiln_core::authz::Visible::All, true, 100)
            .await
            .unwrap()
            .len(),
        3
    );
    assert_eq!(
        store
            .list_jobs(None, &kiln_core::authz::Visible::All, true, 1)
            .await
            .unwrap()
            .len(),
        1
    );
}

async fn tokens_are_hashed_and_checked(store: Store) {
    let issued = store
        .bootstrap_admin()
        .await
        .unwrap()
        .expect("first start creates the admin");
    assert!(store.bootstrap_admin().await.unwrap().is_none(), "only once");
    let (id, secret) = kiln_core::auth::parse_token(&issued.token).unwrap();
    let principal = store.verify_token(id, secret).await.unwrap().unwrap();
    assert_eq!(
        (
            principal.user_name.as_str(),
            principal.is_admin,
            principal.scope.clone()
        ),
        ("admin", true, Scope::User)
    );
    let wrong = "0".repeat(64);
    assert!(store.verify_token(id, &wrong).await.unwrap().is_none());
    assert!(store.verify_token("ffffffffffffffff", secret).await.unwrap().is_none());

    let user = store.create_user("ada", false).await.unwrap();
    let job_token = store
        .create_token(&user.id, "job", Scope::Job("j1".into()))
        .await
        .unwrap();
    let (id, secret) = kiln_core::auth::parse_token(&job_token.token).unwrap();
    assert_eq!(
        store.verify_token(id, secret).await.unwrap().unwrap().scope,
        Scope::Job("j1".into())
    );
    store.revoke_tokens(&Scope::Job("j1".into())).await.unwrap();
    assert!(store.verify_token(id, secret).await.unwrap().is_none());
    // The secret itself is nowhere in the database.
    let stored = <kiln_core::store::entities::api_token::Entity as sea_orm::EntityTrait>::find_by_id(id.to_string())
        .one(store.connection())
        .await
        .unwrap()
        .unwrap();
    assert_ne!(stored.secret_sha256, secret);
}

async fn artifacts_are_recorded_once(store: Store) {
    let digest = "a".repeat(64);
    let new = || NewArtifact {
        digest: digest.clone(),
        size: 10,
        created_by: "u1".into(),
        project: "default".into(),
    };
    assert!(store.insert_artifact(new()).await.unwrap());
    assert!(!store.insert_artifact(new()).await.unwrap());
    assert_eq!(store.artifact(&digest).await.unwrap().unwrap().size, 10);
    assert!(store.artifact(&"b".repeat(64)).await.unwrap().is_none());
}

async fn external_runs_start_running_and_are_never_queued(store: Store) {
    let run = store.insert_external_run("u1", "default", "notebook").await.unwrap();
    assert_eq!(
        (run.state().unwrap(), run.pool.as_str(), run.version),
        (JobState::Running, "external", 1)
    );
    assert!(run.started_at_ms.is_some());
    assert!(store.jobs_in_states(&[JobState::Queued]).await.unwrap().is_empty());
    let done = store
        .transition(&run, JobState::Succeeded, Change::default())
        .await
        .unwrap();
    assert_eq!(done.version, 2);
}

/// Migration m0019 on a database filled before it (so not migrated first, as the suite is).
mod names_migration {
    #[tokio::test]
    async fn sqlite() {
        let dir = tempfile::tempdir().unwrap();
        let config = kiln_core::testing::sqlite_config(dir.path());
        let store = kiln_core::store::Store::connect(&config).await.unwrap();
        super::names::every_model_and_service_keeps_its_name(store).await;
    }

    #[tokio::test]
    async fn postgres() {
        let config = kiln_core::testing::postgres_config().await;
        let store = kiln_core::store::Store::connect(&config).await.unwrap();
        super::names::every_model_and_service_keeps_its_name(store).await;
    }
}

/// What log-ingest reads of item-batch's batches (to check a search that names one).
async fn a_batch_scope_is_read_for_other_services(store: Store) {
    use sea_orm::ConnectionTrait;
    store
        .connection()
        .execute_unprepared(
            "INSERT INTO batches (id, owner_id, project, name, spec_json, state, created_at_ms)
             VALUES ('01a24400-0000-7000-8000-000000000001', 'u1', 'alpha', 'b', '{}', 'open', 1)",
        )
        .await
        .unwrap();
    let scope = store.batch_scope("01a24400-0000-7000-8000-000000000001").await.unwrap();
    assert_eq!(
        scope,
        Some(kiln_core::store::BatchScope {
            id: "01a24400-0000-7000-8000-000000000001".into(),
            project: "alpha".into(),
            owner_id: "u1".into(),
        })
    );
    assert_eq!(
        store.batch_scope("01a24400-0000-7000-8000-000000000002").await.unwrap(),
        None
    );
}

macro_rules! store_suite {
    ($($name:ident),* $(,)?) => {
        mod sqlite {
            $(
                #[tokio::test]
                async fn $name() {
                    let dir = tempfile::tempdir().unwrap();
                    let store = kiln_core::store::Store::connect(&kiln_core::testing::sqlite_config(dir.path())).await.unwrap();
                    store.migrate().await.unwrap();
                    super::$name(store).await;
                }
            )*
        }
        mod postgres {
            $(
                #[tokio::test]
                async fn $name() {
                    let config = kiln_core::testing::postgres_config().await;
                    let store = kiln_core::store::Store::connect(&config).await.unwrap();
                    store.migrate().await.unwrap();
                    super::$name(store).await;
                }
            )*
        }
    };
}

store_suite!(
    migrations_apply_and_are_idempotent,
    controller_jobs_need_an_owner_in_good_standing,
    a_disable_racing_controller_inserts_leaves_no_job_behind,
    jobs_round_trip,
    listing_filters_owner_and_state,
    transitions_compare_and_set,
    concurrent_transitions_have_one_winner,
    requeue_starts_a_new_attempt,
    unpublished_changes_are_found_until_marked,
    stop_requests_keep_the_version,
    busy_runners_are_those_holding_an_active_job,
    usage_is_summed_by_pool,
    tokens_are_hashed_and_checked,
    a_login_is_redeemed_once_and_only_by_the_browser_that_asked,
    a_code_approved_by_another_user_cancels_the_login,
    wrong_codes_run_out_and_expired_logins_are_refused,
    artifacts_are_recorded_once,
    external_runs_start_running_and_are_never_queued,
    quotas_round_trip_and_queued_jobs_are_counted,
    concurrent_submits_never_pass_a_queued_quota_together,
    runs_keep_config_summary_and_sweep,
    concurrent_run_updates_all_land,
    run_artifacts_are_saved_listed_and_replaced,
    model_versions_are_numbered_and_searched,
    aliases_move_atomically_under_concurrent_calls,
    intents_and_instances_move_by_compare_and_set,
    a_create_call_of_thousands_of_instances_is_recorded_whole,
    a_batch_scope_is_read_for_other_services,
);
