//! The model registry's part of the store's conformance suite (store.rs runs it on SQLite and
//! Postgres): version numbers, names per project, tags, search, and aliases under concurrent
//! moves.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kiln_core::store::{ModelKey, NewModelVersion, VersionFilter};

use super::*;

fn version_of(model: &str, job: &str) -> NewModelVersion {
    NewModelVersion {
        model: model.into(),
        project: "default".into(),
        created_by: "ada".into(),
        job_id: job.into(),
        lineage_json: "{}".into(),
        digest: format!("sha256:{}", "0".repeat(64)),
        files: vec![("model.bin".into(), "a".repeat(64), 3)],
        ..NewModelVersion::default()
    }
}

async fn register(store: &Store, new: NewModelVersion) -> i64 {
    store.insert_model_version(new).await.unwrap().version
}

fn key(name: &str) -> ModelKey {
    ModelKey::new("default", name)
}

pub(super) async fn model_versions_are_numbered_and_searched(store: Store) {
    assert_eq!(register(&store, version_of("resnet", "job-1")).await, 1);
    let tagged = NewModelVersion {
        description: "trained on cifar-100".into(),
        tags: BTreeMap::from([("stage".into(), "prod".into())]),
        alias: Some("production".into()),
        ..version_of("resnet", "job-2")
    };
    assert_eq!(register(&store, tagged).await, 2);
    // Names are unique per project: another project's `resnet` is a model of its own.
    let elsewhere = NewModelVersion {
        project: "beta".into(),
        files: vec![("other.bin".into(), "b".repeat(64), 4)],
        ..version_of("resnet", "job-3")
    };
    let theirs = store.insert_model_version(elsewhere).await.unwrap();
    assert_eq!((theirs.project.as_str(), theirs.version), ("beta", 1));
    let model = store.model("default", "resnet").await.unwrap().unwrap();
    assert_eq!((model.latest_version, model.project.as_str()), (2, "default"));
    let beta = ModelKey::new("beta", "resnet");
    assert_eq!(store.model("beta", "resnet").await.unwrap().unwrap().latest_version, 1);
    assert!(store.model("gamma", "resnet").await.unwrap().is_none());
    assert_eq!(store.model_projects("resnet").await.unwrap(), ["beta", "default"]);
    assert_eq!(store.model_alias(&key("resnet"), "production").await.unwrap(), Some(2));
    assert_eq!(store.model_alias(&beta, "production").await.unwrap(), None);
    assert_eq!(store.model_files(&key("resnet"), 2).await.unwrap()[0].path, "model.bin");
    assert_eq!(store.model_files(&beta, 1).await.unwrap()[0].path, "other.bin");
    assert!(store.model_version(&beta, 2).await.unwrap().is_none());
    assert!(store.blob_in_model(&"a".repeat(64)).await.unwrap());
    assert!(
        store.blob_in_use(&"a".repeat(64)).await.unwrap(),
        "a model's file is in use"
    );

    let search = |query: &str, tags: &[(&str, &str)]| VersionFilter {
        query: query.into(),
        tags: tags.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect(),
        before_version: 0,
        limit: 10,
    };
    let numbers = |versions: Vec<kiln_core::store::ModelVersionRecord>| -> Vec<i64> {
        versions.into_iter().map(|v| v.version).collect()
    };
    let listed = |filter| {
        let store = store.clone();
        async move { numbers(store.list_model_versions(&key("resnet"), &filter).await.unwrap()) }
    };
    assert_eq!(listed(search("", &[])).await, [2, 1], "newest first");
    assert_eq!(listed(search("cifar", &[])).await, [2]);
    assert_eq!(listed(search("job-1", &[])).await, [1]);
    assert_eq!(listed(search("pro", &[])).await, [2], "a tag value matches");
    assert_eq!(listed(search("", &[("stage", "prod")])).await, [2]);
    assert_eq!(listed(search("", &[("stage", "dev")])).await, Vec::<i64>::new());
    assert_eq!(
        listed(search("%", &[])).await,
        Vec::<i64>::new(),
        "wildcards are literal"
    );
    let page = VersionFilter {
        before_version: 2,
        ..search("", &[])
    };
    assert_eq!(listed(page).await, [1]);
    let theirs = store.list_model_versions(&beta, &search("", &[])).await.unwrap();
    assert_eq!(
        theirs
            .iter()
            .map(|v| (v.project.as_str(), v.job_id.as_str()))
            .collect::<Vec<_>>(),
        [("beta", "job-3")]
    );

    store
        .set_model_tags(
            &key("resnet"),
            2,
            &BTreeMap::from([("stage".into(), String::new()), ("team".into(), "vision".into())]),
        )
        .await
        .unwrap();
    let tags = store.model_tags(&key("resnet"), &[1, 2]).await.unwrap();
    assert_eq!(tags[&2], BTreeMap::from([("team".to_string(), "vision".to_string())]));
    assert!(!tags.contains_key(&1));

    register(&store, version_of("bert", "job-9")).await;
    let all = kiln_core::authz::Visible::All;
    let names = |models: Vec<kiln_core::store::ModelRecord>| -> Vec<String> {
        models.iter().map(|m| format!("{}/{}", m.project, m.name)).collect()
    };
    assert_eq!(
        names(store.list_models(&all, "", ("", ""), 10).await.unwrap()),
        ["default/bert", "beta/resnet", "default/resnet"],
        "by name, then project"
    );
    // A page ends between two models of one name: the next starts with the other one.
    assert_eq!(
        names(store.list_models(&all, "", ("resnet", "beta"), 10).await.unwrap()),
        ["default/resnet"]
    );
    // A bare name (a page token of before names were per project): after every model of it.
    assert_eq!(
        names(store.list_models(&all, "", ("bert", ""), 10).await.unwrap()),
        ["beta/resnet", "default/resnet"]
    );
    let beta_only = kiln_core::authz::Visible::Only(vec!["beta".into()]);
    assert_eq!(
        names(store.list_models(&beta_only, "", ("", ""), 10).await.unwrap()),
        ["beta/resnet"]
    );
    let none = kiln_core::authz::Visible::Only(vec!["gamma".into()]);
    assert!(store.list_models(&none, "", ("", ""), 10).await.unwrap().is_empty());
    assert_eq!(store.list_models(&all, "sne", ("", ""), 10).await.unwrap().len(), 2);

    assert_eq!(
        store.delete_model_alias(&key("resnet"), "production").await.unwrap(),
        Some(2)
    );
    assert_eq!(
        store.delete_model_alias(&key("resnet"), "production").await.unwrap(),
        None
    );
}

/// Concurrent registers get distinct numbers 1..=n; concurrent moves of one alias leave it on
/// exactly one version at every read, and on the last version a move set.
pub(super) async fn aliases_move_atomically_under_concurrent_calls(store: Store) {
    const REGISTERS: i64 = 8;
    let registers: Vec<_> = (0..REGISTERS)
        .map(|i| {
            let store = store.clone();
            tokio::spawn(async move { register(&store, version_of("gpt", &format!("job-{i}"))).await })
        })
        .collect();
    let mut numbers = Vec::new();
    for register in registers {
        numbers.push(register.await.unwrap());
    }
    numbers.sort();
    assert_eq!(numbers, (1..=REGISTERS).collect::<Vec<_>>());
    store.set_model_alias(&key("gpt"), "production", 1).await.unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (store, done) = (store.clone(), done.clone());
        tokio::spawn(async move {
            let mut reads = 0;
            while !done.load(Ordering::Relaxed) || reads < 10 {
                let aliases = store.model_aliases(&key("gpt")).await.unwrap();
                let holders: Vec<i64> = (1..=REGISTERS)
                    .filter(|version| aliases.get("production") == Some(version))
                    .collect();
                assert_eq!(holders.len(), 1, "exactly one version holds the alias: {aliases:?}");
                reads += 1;
            }
            reads
        })
    };
    let movers: Vec<_> = (0..16)
        .map(|task| {
            let store = store.clone();
            tokio::spawn(async move {
                for round in 0..10 {
                    let version = (task + round) % REGISTERS + 1;
                    store.set_model_alias(&key("gpt"), "production", version).await.unwrap();
                }
            })
        })
        .collect();
    for mover in movers {
        mover.await.unwrap();
    }
    done.store(true, Ordering::Relaxed);
    assert!(reader.await.unwrap() >= 10);
    // Moved once more by one caller, the alias is where that call put it.
    store.set_model_alias(&key("gpt"), "production", 5).await.unwrap();
    assert_eq!(store.model_alias(&key("gpt"), "production").await.unwrap(), Some(5));
    assert_eq!(store.model_aliases(&key("gpt")).await.unwrap().len(), 1);
}
