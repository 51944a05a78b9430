//! The store suite's run-tracking tests: config, summary and sweep of a job, and the files a
//! run saved.

use kiln_core::authz::Visible;
use kiln_core::runs::{ConfigValue, RunConfig};
use kiln_core::store::{JobFilter, NewArtifact, NewJob, RunArtifactFile, Store};

use super::new_job;

fn config(pairs: &[(&str, ConfigValue)]) -> RunConfig {
    pairs.iter().map(|(k, v)| (k.to_string(), v.clone())).collect()
}

fn filter(sweep_id: Option<&str>) -> JobFilter {
    JobFilter {
        owner_id: None,
        projects: Visible::All,
        all: true,
        sweep_id: sweep_id.map(str::to_string),
        limit: 100,
    }
}

pub async fn runs_keep_config_summary_and_sweep(store: Store) {
    let given = config(&[
        ("optimizer.lr", ConfigValue::Float(0.1)),
        ("optimizer.name", ConfigValue::Str("adam".into())),
        ("layers", ConfigValue::Int(3)),
        ("augment", ConfigValue::Bool(true)),
        // A whole float stays a float, a large int exact.
        ("scale", ConfigValue::Float(1.0)),
        ("seed", ConfigValue::Int(i64::MAX - 1)),
    ]);
    let trial = store
        .insert_job(NewJob {
            config: given.clone(),
            sweep_id: "sweep-1".into(),
            ..new_job("u1")
        })
        .await
        .unwrap();
    let other = store.insert_job(new_job("u1")).await.unwrap();
    assert_eq!(trial.config().unwrap(), given);
    assert_eq!(trial.summary().unwrap(), RunConfig::new());
    assert_eq!((trial.sweep_id.as_str(), other.sweep_id.as_str()), ("sweep-1", ""));
    assert_eq!(other.config().unwrap(), RunConfig::new(), "'{{}}' by default");

    let updated = store
        .update_run(
            &trial.id,
            &config(&[
                ("layers", ConfigValue::Int(4)),
                ("seed", ConfigValue::Int(7)),
                ("new", ConfigValue::Int(1)),
            ]),
            &config(&[("best/acc", ConfigValue::Float(0.93))]),
        )
        .await
        .unwrap();
    let mut expected = given.clone();
    expected.insert("layers".into(), ConfigValue::Int(4));
    expected.insert("seed".into(), ConfigValue::Int(7));
    expected.insert("new".into(), ConfigValue::Int(1));
    assert_eq!(
        updated.config().unwrap(),
        expected,
        "merged: new keys added, given keys replaced"
    );
    assert_eq!(updated.summary().unwrap()["best/acc"], ConfigValue::Float(0.93));
    assert_eq!(updated.version, trial.version, "not a state change");
    let shown = updated.to_proto();
    assert_eq!(shown.sweep_id, "sweep-1");
    assert_eq!(
        ConfigValue::from_proto(&shown.config["optimizer.name"]),
        Some(ConfigValue::Str("adam".into()))
    );
    assert_eq!(
        ConfigValue::from_proto(&shown.summary["best/acc"]),
        Some(ConfigValue::Float(0.93))
    );

    let of_sweep = store.list_jobs_where(&filter(Some("sweep-1"))).await.unwrap();
    assert_eq!(
        of_sweep.iter().map(|j| j.id.as_str()).collect::<Vec<_>>(),
        [trial.id.as_str()]
    );
    assert_eq!(store.list_jobs_where(&filter(None)).await.unwrap().len(), 2);
    assert!(
        store
            .list_jobs_where(&filter(Some("sweep-2")))
            .await
            .unwrap()
            .is_empty()
    );
}

pub async fn concurrent_run_updates_all_land(store: Store) {
    let run = store.insert_job(new_job("u1")).await.unwrap();
    let updates = (0..16).map(|n| {
        let store = store.clone();
        let id = run.id.clone();
        tokio::spawn(async move {
            let values = config(&[(&format!("k{n}"), ConfigValue::Int(n))]);
            store.update_run(&id, &values, &values).await.unwrap();
        })
    });
    for update in updates.collect::<Vec<_>>() {
        update.await.unwrap();
    }
    let run = store.job(&run.id).await.unwrap();
    assert_eq!(run.config().unwrap().len(), 16, "no merge lost another's keys");
    assert_eq!(run.summary().unwrap().len(), 16);
}

fn file(name: &str, path: &str, digest: &str, size: i64) -> RunArtifactFile {
    RunArtifactFile {
        name: name.into(),
        path: path.into(),
        digest: digest.into(),
        size,
    }
}

pub async fn run_artifacts_are_saved_listed_and_replaced(store: Store) {
    let run = store.insert_job(new_job("u1")).await.unwrap();
    let (a, b, c) = ("a".repeat(64), "b".repeat(64), "c".repeat(64));
    for digest in [&a, &b, &c] {
        store
            .insert_artifact(NewArtifact {
                digest: digest.clone(),
                size: 10,
                created_by: "u1".into(),
                project: "default".into(),
            })
            .await
            .unwrap();
    }
    assert!(!store.blob_in_use(&a).await.unwrap());
    store
        .save_run_artifact(&run.id, "model.pt", &[file("model.pt", "", &a, 10)])
        .await
        .unwrap();
    let checkpoint = [
        file("ckpt", "opt/state.bin", &c, 10),
        file("ckpt", "weights.bin", &b, 10),
    ];
    store.save_run_artifact(&run.id, "ckpt", &checkpoint).await.unwrap();
    let listed = store.run_artifact_files(&run.id).await.unwrap();
    assert_eq!(
        listed,
        [
            checkpoint[0].clone(),
            checkpoint[1].clone(),
            file("model.pt", "", &a, 10)
        ],
        "by name, then path"
    );
    assert_eq!(
        store.run_artifact_file(&run.id, "ckpt", "weights.bin").await.unwrap(),
        Some(checkpoint[1].clone())
    );
    assert_eq!(store.run_artifact_file(&run.id, "ckpt", "nope").await.unwrap(), None);
    assert!(store.blob_in_use(&a).await.unwrap(), "a saved artifact keeps its blob");

    // Saving under a name again replaces what it held.
    store
        .save_run_artifact(&run.id, "ckpt", &[file("ckpt", "weights.bin", &a, 10)])
        .await
        .unwrap();
    let listed = store.run_artifact_files(&run.id).await.unwrap();
    assert_eq!(
        listed
            .iter()
            .map(|f| (f.name.as_str(), f.path.as_str()))
            .collect::<Vec<_>>(),
        [("ckpt", "weights.bin"), ("model.pt", "")]
    );
    assert!(!store.blob_in_use(&c).await.unwrap());
    let other = store.insert_job(new_job("u1")).await.unwrap();
    assert!(store.run_artifact_files(&other.id).await.unwrap().is_empty());
}
