//! The secrets table on SQLite and Postgres: sealed values in, names out.

use kiln_core::secrets::{SecretsKey, generate_key_hex};
use kiln_core::store::Store;

async fn secrets_are_sealed_listed_and_deleted(store: Store) {
    let key = SecretsKey::from_hex(&generate_key_hex().unwrap(), "test").unwrap();
    let sealed = key.seal("default", "HF_TOKEN", b"hf_value_1").unwrap();
    let first = store.set_secret("default", "HF_TOKEN", sealed).await.unwrap();
    let resealed = key.seal("default", "HF_TOKEN", b"hf_value_2").unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
    let second = store.set_secret("default", "HF_TOKEN", resealed).await.unwrap();
    assert_eq!(
        second.created_at_ms, first.created_at_ms,
        "an update keeps the creation time"
    );
    assert!(second.updated_at_ms > first.updated_at_ms);
    store
        .set_secret(
            "other",
            "HF_TOKEN",
            key.seal("other", "HF_TOKEN", b"other-value").unwrap(),
        )
        .await
        .unwrap();
    let read = store.secret("default", "HF_TOKEN").await.unwrap().unwrap();
    assert_eq!(key.open("default", "HF_TOKEN", &read.sealed).unwrap(), b"hf_value_2");

    let listed = store.list_secrets("default").await.unwrap();
    assert_eq!(listed.len(), 1);
    assert!(listed[0].sealed.is_empty(), "a listing carries no sealed value");
    let names = ["A_MISSING".to_string(), "HF_TOKEN".to_string()];
    assert_eq!(
        store.missing_secret("default", &names).await.unwrap().as_deref(),
        Some("A_MISSING")
    );
    assert_eq!(store.missing_secret("default", &names[1..]).await.unwrap(), None);
    assert_eq!(
        store.missing_secret("nowhere", &names[1..]).await.unwrap().as_deref(),
        Some("HF_TOKEN")
    );

    assert!(store.delete_secret("default", "HF_TOKEN").await.unwrap().is_some());
    assert!(store.delete_secret("default", "HF_TOKEN").await.unwrap().is_none());
    assert!(store.secret("other", "HF_TOKEN").await.unwrap().is_some());
}

#[tokio::test]
async fn sqlite() {
    let dir = tempfile::tempdir().unwrap();
    let store = Store::connect(&kiln_core::testing::sqlite_config(dir.path()))
        .await
        .unwrap();
    store.migrate().await.unwrap();
    secrets_are_sealed_listed_and_deleted(store).await;
}

#[tokio::test]
async fn postgres() {
    let config = kiln_core::testing::postgres_config().await;
    let store = Store::connect(&config).await.unwrap();
    store.migrate().await.unwrap();
    secrets_are_sealed_listed_and_deleted(store).await;
}
