//! The owner check of controllers, in the store's conformance suite (store.rs runs it on SQLite
//! and Postgres): a controller's job is inserted only while its owner is enabled and at least a
//! member of the project, and a refusal inserts nothing.

use kiln_core::authz::Role;

use super::*;

fn controller_job(owner: &str, project: &str) -> NewJob {
    NewJob {
        project: project.into(),
        batch_id: "b1".into(),
        ..new_job(owner)
    }
}

async fn refusal(store: &Store, owner: &str, project: &str) -> String {
    let before = store.owner_live_jobs(owner, None).await.unwrap().len();
    let error = store
        .insert_controller_job(controller_job(owner, project))
        .await
        .expect_err("refused");
    assert!(matches!(error, StoreError::OwnerRevoked { .. }), "{error:?}");
    assert_eq!(
        store.owner_live_jobs(owner, None).await.unwrap().len(),
        before,
        "a refusal inserted a job"
    );
    error.owner_revoked().expect("a reason").to_string()
}

pub(super) async fn controller_jobs_need_an_owner_in_good_standing(store: Store) {
    let bob = store.create_user("bob", false).await.unwrap();
    store.create_project("beta").await.unwrap();
    assert_eq!(
        refusal(&store, &bob.id, "beta").await,
        "owner bob is no longer a member of project beta"
    );
    store.set_member("beta", &bob.id, Role::Member).await.unwrap();
    store.check_owner(&bob.id, "beta").await.unwrap();
    let job = store
        .insert_controller_job(controller_job(&bob.id, "beta"))
        .await
        .unwrap();
    assert_eq!((job.state.as_str(), job.batch_id.as_str()), ("QUEUED", "b1"));
    store.set_member("beta", &bob.id, Role::Viewer).await.unwrap();
    assert_eq!(
        refusal(&store, &bob.id, "beta").await,
        "owner bob is only a viewer of project beta"
    );
    store.set_member("beta", &bob.id, Role::Maintainer).await.unwrap();
    store.check_owner(&bob.id, "beta").await.unwrap();
    store.remove_member("beta", &bob.id).await.unwrap();
    assert_eq!(
        refusal(&store, &bob.id, "beta").await,
        "owner bob is no longer a member of project beta"
    );
    store.set_member("beta", &bob.id, Role::Member).await.unwrap();
    store.disable_user(&bob.id).await.unwrap();
    assert_eq!(refusal(&store, &bob.id, "beta").await, "owner bob was disabled");
    assert_eq!(refusal(&store, "nobody", "beta").await, "owner nobody no longer exists");
    // An instance admin needs no membership.
    let root = store.create_user("root", true).await.unwrap();
    store
        .insert_controller_job(controller_job(&root.id, "beta"))
        .await
        .unwrap();
    // The owner's live jobs, by project.
    assert_eq!(store.owner_live_jobs(&bob.id, Some("beta")).await.unwrap().len(), 1);
    assert!(
        store
            .owner_live_jobs(&bob.id, Some("default"))
            .await
            .unwrap()
            .is_empty()
    );
}

/// A disable racing controller inserts: every insert that won lands before the disable, so a
/// listing of the owner's jobs after the disable finds it; none lands after.
pub(super) async fn a_disable_racing_controller_inserts_leaves_no_job_behind(store: Store) {
    let carol = store.create_user("carol", false).await.unwrap();
    store.set_member("default", &carol.id, Role::Member).await.unwrap();
    let inserts: Vec<_> = (0..20)
        .map(|_| {
            let (store, owner) = (store.clone(), carol.id.clone());
            tokio::spawn(async move { store.insert_controller_job(controller_job(&owner, "default")).await })
        })
        .collect();
    store.disable_user(&carol.id).await.unwrap();
    let seen_after_disable = store.owner_live_jobs(&carol.id, None).await.unwrap().len();
    let mut inserted = 0;
    for insert in inserts {
        match insert.await.unwrap() {
            Ok(_) => inserted += 1,
            Err(error) => assert_eq!(error.owner_revoked(), Some("owner carol was disabled"), "{error:?}"),
        }
    }
    assert_eq!(
        store.owner_live_jobs(&carol.id, None).await.unwrap().len(),
        inserted,
        "every insert that won is there"
    );
    assert_eq!(seen_after_disable, inserted, "an insert landed after the disable");
}
