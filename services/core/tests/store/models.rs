//! The model registry's part of the store's conformance suite (store.rs runs it on SQLite and
//! Postgres): version numbers, projects, tags, search, and aliases under concurrent moves.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use kiln_core::store::{NewModelVersion, Registered, VersionFilter};

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
    match store.insert_model_version(new).await.unwrap() {
        Registered::Version(version) => version.version,
        other => panic!("not registered: {other:?}"),
    }
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
    // Names are unique in the instance: another project's register is refused.
    let elsewhere = NewModelVersion {
        project: "beta".into(),
        ..version_of("resnet", "job-3")
    };
    assert_eq!(
        store.insert_model_version(elsewhere).await.unwrap(),
        Registered::OtherProject {
            project: "default".into()
        }
    );
    let model = store.model("resnet").await.unwrap().unwrap();
    assert_eq!((model.latest_version, model.project.as_str()), (2, "default"));
    assert_eq!(store.model_alias("resnet", "production").await.unwrap(), Some(2));
    assert_eq!(store.model_files("resnet", 2).await.unwrap()[0].path, "model.bin");
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
        async move { numbers(store.list_model_versions("resnet", &filter).await.unwrap()) }
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

    store
        .set_model_tags(
            "resnet",
            2,
            &BTreeMap::from([("stage".into(), String::new()), ("team".into(), "vision".into())]),
        )
        .await
        .unwrap();
    let tags = store.model_tags("resnet", &[1, 2]).await.unwrap();
    assert_eq!(tags[&2], BTreeMap::from([("team".to_string(), "vision".to_string())]));
    assert!(!tags.contains_key(&1));

    register(&store, version_of("bert", "job-9")).await;
    let all = store
        .list_models(&kiln_core::authz::Visible::All, "", "", 10)
        .await
        .unwrap();
    assert_eq!(
        all.iter().map(|m| m.name.as_str()).collect::<Vec<_>>(),
        ["bert", "resnet"]
    );
    let after = store
        .list_models(&kiln_core::authz::Visible::All, "", "bert", 10)
        .await
        .unwrap();
    assert_eq!(after.len(), 1);
    let none = kiln_core::authz::Visible::Only(vec!["beta".into()]);
    assert!(store.list_models(&none, "", "", 10).await.unwrap().is_empty());
    assert_eq!(
        store
            .list_models(&kiln_core::authz::Visible::All, "sne", "", 10)
            .await
            .unwrap()
            .len(),
        1
    );

    assert_eq!(store.delete_model_alias("resnet", "production").await.unwrap(), Some(2));
    assert_eq!(store.delete_model_alias("resnet", "production").await.unwrap(), None);
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
    store.set_model_alias("gpt", "production", 1).await.unwrap();

    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let (store, done) = (store.clone(), done.clone());
        tokio::spawn(async move {
            let mut reads = 0;
            while !done.load(Ordering::Relaxed) || reads < 10 {
                let aliases = store.model_aliases("gpt").await.unwrap();
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
                    store.set_model_alias("gpt", "production", version).await.unwrap();
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
    store.set_model_alias("gpt", "production", 5).await.unwrap();
    assert_eq!(store.model_alias("gpt", "production").await.unwrap(), Some(5));
    assert_eq!(store.model_aliases("gpt").await.unwrap().len(), 1);
}
