//! Migration m0019 (model and service names unique per project) on a database written before
//! it: every model, version, file, tag, alias and service keeps its name in its project, a
//! service's reference to another project's model is qualified, and afterwards two projects
//! may each have a model and a service of the same name. Run on SQLite and Postgres by
//! store.rs.

use kiln_core::store::{ModelKey, NewModelVersion, Store};
use kiln_migrations::{Migrator, MigratorTrait};
use sea_orm::{ConnectionTrait, Statement};

/// The migrations before m0019.
const BEFORE: u32 = 18;

/// What the instance held when names were global: alpha's `resnet` (3 versions, the third
/// tagged and aliased), beta's `bert`, and beta's service `digits` serving both, with a worker.
const OLD_ROWS: &[&str] = &[
    "INSERT INTO models (name, project, created_by, created_at_ms, latest_version)
        VALUES ('resnet', 'alpha', 'ada', 1, 3), ('bert', 'beta', 'bob', 2, 1)",
    "INSERT INTO model_versions (model, version, digest, size, job_id, description, lineage_json,
            created_by, created_at_ms)
        VALUES ('resnet', 1, 'sha256:r1', 1, 'j1', '', '{}', 'ada', 1),
               ('resnet', 2, 'sha256:r2', 1, 'j2', '', '{}', 'ada', 1),
               ('resnet', 3, 'sha256:r3', 4, 'j3', 'the best', '{}', 'ada', 1),
               ('bert', 1, 'sha256:b1', 2, 'j4', '', '{}', 'bob', 2)",
    "INSERT INTO model_files (model, version, path, sha256, size)
        VALUES ('resnet', 3, 'w.bin', 'aaaa', 4), ('bert', 1, 'b.bin', 'bbbb', 2)",
    "INSERT INTO model_tags (model, version, \"key\", \"value\") VALUES ('resnet', 3, 'stage', 'prod')",
    "INSERT INTO model_aliases (model, alias, version, updated_at_ms) VALUES ('resnet', 'production', 3, 1)",
    "INSERT INTO services (id, name, project, owner_id, state, revision, latest_revision, replicas,
            reason, created_at_ms, updated_at_ms, scaling_json, traffic, shadow, paused_reason)
        VALUES ('s1', 'digits', 'beta', 'u1', 'RUNNING', 1, 1, 1, '', 1, 1, '', 100, FALSE, '')",
    "INSERT INTO service_revisions (service_id, revision, spec_json, created_at_ms)
        VALUES ('s1', 1, '{\"revision\":1,\"members\":[
            {\"name\":\"resnet\",\"asked\":\"resnet@production\",\"model\":\"resnet\",\"version\":3,\"weight\":1.0},
            {\"name\":\"bert\",\"asked\":\"bert\",\"model\":\"bert\",\"version\":1,\"weight\":1.0}]}', 1)",
];

async fn execute(store: &Store, sql: &str) -> Result<(), sea_orm::DbErr> {
    store.connection().execute_unprepared(sql).await.map(|_| ())
}

async fn text_column(store: &Store, sql: &str, column: &str) -> Vec<String> {
    let db = store.connection();
    let statement = Statement::from_string(db.get_database_backend(), sql.to_string());
    db.query_all_raw(statement)
        .await
        .unwrap()
        .into_iter()
        .map(|row| row.try_get::<String>("", column).unwrap())
        .collect()
}

/// `store` is an empty database: migrated to just before m0019, filled, then migrated.
pub(super) async fn every_model_and_service_keeps_its_name(store: Store) {
    Migrator::up(store.connection(), Some(BEFORE)).await.unwrap();
    for statement in OLD_ROWS {
        execute(&store, statement).await.unwrap();
    }
    // A worker of `digits` (in beta) loading alpha's resnet by its then global name: the row
    // of the jobs table as it was then (the entity has columns of later migrations).
    execute(
        &store,
        "INSERT INTO jobs (id, owner_id, project, name, command_json, env_json, cpu_millis, memory_bytes,
            code_digest, state, version, published_version, attempt, pool, runner_id, instance_id,
            exit_code, reason, stop_requested, created_at_ms, updated_at_ms, started_at_ms,
            finished_at_ms, image, gpus, max_runtime_secs, datasets_json, batch_id, priority,
            priority_class, market_policy, market, preemptions, resume_from, cost_micros,
            on_demand_cost_micros, submit_key, submit_hash, requested_pool, secrets_json, config_json,
            summary_json, sweep_id, service_id, gpu_ms)
        VALUES ('w1', 'u1', 'beta', 'digits-resnet-r1', '[\"serve\"]',
            '{\"KILN_SERVE_MODEL\":\"resnet:3\",\"KILN_SERVE_SERVICE\":\"digits\"}', 100, 1048576,
            '', 'QUEUED', 1, 1, 0, '', '', '', NULL, '', FALSE, 1, 1, NULL, NULL, '', 0, 0, '[]', '',
            0, 'normal', 'auto', '', 0, '', 0, 0, NULL, '', '', '[]', '{}', '{}', '', 's1', 0)",
    )
    .await
    .unwrap();
    store.migrate().await.unwrap();
    store.check_schema().await.unwrap();

    // Every model, version, file, tag and alias, in its project.
    let resnet = ModelKey::new("alpha", "resnet");
    let model = store.model("alpha", "resnet").await.unwrap().expect("alpha's resnet");
    assert_eq!((model.latest_version, model.created_by.as_str()), (3, "ada"));
    assert!(store.model("beta", "bert").await.unwrap().is_some());
    assert!(store.model("beta", "resnet").await.unwrap().is_none());
    assert_eq!(store.model_projects("resnet").await.unwrap(), ["alpha"]);
    let third = store.model_version(&resnet, 3).await.unwrap().expect("resnet:3");
    assert_eq!(
        (third.digest.as_str(), third.description.as_str()),
        ("sha256:r3", "the best")
    );
    assert!(store.model_version(&resnet, 2).await.unwrap().is_some());
    assert_eq!(store.model_files(&resnet, 3).await.unwrap()[0].sha256, "aaaa");
    assert_eq!(
        store.model_files(&ModelKey::new("beta", "bert"), 1).await.unwrap()[0].path,
        "b.bin"
    );
    assert_eq!(store.model_tags(&resnet, &[3]).await.unwrap()[&3]["stage"], "prod");
    assert_eq!(store.model_alias(&resnet, "production").await.unwrap(), Some(3));
    assert!(store.blob_in_model("aaaa").await.unwrap());

    // The service keeps its name; its reference to alpha's model is qualified, its own model's
    // is not; so is its worker's.
    assert_eq!(
        text_column(
            &store,
            "SELECT project FROM project_services WHERE name = 'digits'",
            "project"
        )
        .await,
        ["beta"]
    );
    let spec: serde_json::Value =
        serde_json::from_str(&text_column(&store, "SELECT spec_json FROM service_revisions", "spec_json").await[0])
            .unwrap();
    assert_eq!(spec["members"][0]["model"], "alpha/resnet");
    assert_eq!(spec["members"][0]["asked"], "alpha/resnet@production");
    assert_eq!(spec["members"][1]["model"], "bert");
    let env = store.job("w1").await.unwrap().env().unwrap();
    assert_eq!(env["KILN_SERVE_MODEL"], "alpha/resnet:3");
    assert_eq!(env["KILN_SERVE_SERVICE"], "digits");

    // Names are now per project: beta makes a resnet of its own, alpha a service `digits`.
    let beta_resnet = store
        .insert_model_version(NewModelVersion {
            model: "resnet".into(),
            project: "beta".into(),
            created_by: "bob".into(),
            job_id: "j5".into(),
            lineage_json: "{}".into(),
            digest: "sha256:x".into(),
            ..NewModelVersion::default()
        })
        .await
        .unwrap();
    assert_eq!((beta_resnet.project.as_str(), beta_resnet.version), ("beta", 1));
    assert_eq!(store.model("alpha", "resnet").await.unwrap().unwrap().latest_version, 3);
    let service = |id: &str, project: &str| {
        format!(
            "INSERT INTO project_services (id, name, project, owner_id, state, revision, latest_revision,
                replicas, reason, created_at_ms, updated_at_ms)
             VALUES ('{id}', 'digits', '{project}', 'u2', 'RUNNING', 1, 1, 1, '', 1, 1)"
        )
    };
    execute(&store, &service("s2", "alpha")).await.unwrap();
    assert!(
        execute(&store, &service("s3", "alpha")).await.is_err(),
        "a project has one service of a name"
    );

    // Down (one model and service per name, the first project's) and up again: m0019 and every
    // migration after it.
    let from_m0019 = Migrator::migrations().len() as u32 - BEFORE;
    Migrator::down(store.connection(), Some(from_m0019)).await.unwrap();
    assert_eq!(
        text_column(&store, "SELECT project FROM models WHERE name = 'resnet'", "project").await,
        ["alpha"]
    );
    store.migrate().await.unwrap();
    assert_eq!(store.model("alpha", "resnet").await.unwrap().unwrap().latest_version, 3);
    assert_eq!(store.model_alias(&resnet, "production").await.unwrap(), Some(3));
}
