//! The provisioner's records: intents and instances change by compare-and-set, and an instance
//! recorded twice (adopted by the reconciler and answered by the call) is kept once.

use kiln_core::store::cloud::{instance_state, intent_state};
use kiln_core::store::{InstanceRecord, IntentRecord, Store};

fn intent(id: &str) -> IntentRecord {
    IntentRecord {
        id: id.into(),
        cluster: "c1".into(),
        pool: "cpu".into(),
        capacity: "spot".into(),
        count: 2,
        min_count: 1,
        single_zone: false,
        request: "{}".into(),
        demand: "[]".into(),
        state: intent_state::PLANNED.into(),
        version: 1,
        created_at_ms: 1,
        called_at_ms: 0,
        settled_at_ms: 0,
        failures: "[]".into(),
        attempts: 0,
    }
}

fn instance(id: &str, intent: &str) -> InstanceRecord {
    InstanceRecord {
        instance_id: id.into(),
        cluster: "c1".into(),
        intent_id: intent.into(),
        pool: "cpu".into(),
        instance_type: "c5.large".into(),
        zone: "us-east-1a".into(),
        capacity: "spot".into(),
        price_per_hour: 0.03,
        state: instance_state::BOOTING.into(),
        version: 1,
        launched_at_ms: 5,
        boot_deadline_ms: 600_005,
        runner_id: String::new(),
        registered_at_ms: 0,
        cordoned_at_ms: 0,
        released_at_ms: 0,
        reason: String::new(),
    }
}

pub async fn intents_and_instances_move_by_compare_and_set(store: Store) {
    store.insert_intent(intent("i1")).await.unwrap();
    assert!(
        store.insert_intent(intent("i1")).await.is_err(),
        "an intent id is recorded once"
    );
    let calling = IntentRecord {
        state: intent_state::CALLING.into(),
        version: 2,
        attempts: 1,
        ..intent("i1")
    };
    assert!(store.update_intent(&calling).await.unwrap());
    // A second writer that read version 1 loses.
    assert!(!store.update_intent(&calling).await.unwrap());
    let found = store.intents("c1", &[intent_state::CALLING]).await.unwrap();
    assert_eq!(found, std::slice::from_ref(&calling));
    assert!(store.intents("c2", &[intent_state::CALLING]).await.unwrap().is_empty());

    assert_eq!(
        store
            .insert_instances(vec![instance("i-1", "i1"), instance("i-2", "i1")])
            .await
            .unwrap(),
        2
    );
    // Adopted again, or answered after the adoption: kept once, unchanged.
    let again = InstanceRecord {
        zone: "elsewhere".into(),
        ..instance("i-1", "i1")
    };
    assert_eq!(store.insert_instances(vec![again]).await.unwrap(), 0);
    assert_eq!(
        store
            .insert_instances(vec![instance("i-1", "i1"), instance("i-3", "i1")])
            .await
            .unwrap(),
        1
    );
    let live = store.instances("c1", &instance_state::LIVE).await.unwrap();
    assert_eq!(live.len(), 3);
    assert_eq!(live[0].zone, "us-east-1a");
    let terminating = InstanceRecord {
        state: instance_state::TERMINATING.into(),
        version: 2,
        reason: "idle".into(),
        ..instance("i-2", "i1")
    };
    assert!(store.update_instance(&terminating).await.unwrap());
    assert!(!store.update_instance(&terminating).await.unwrap());
    let booting = store.instances("c1", &[instance_state::BOOTING]).await.unwrap();
    assert_eq!(booting.len(), 2);
}

pub async fn a_create_call_of_thousands_of_instances_is_recorded_whole(store: Store) {
    // 17 columns a row: 2,000 rows in one statement would bind 34,000 variables, past SQLite's
    // 32,766.
    let many: Vec<InstanceRecord> = (0..2_500).map(|n| instance(&format!("i-{n:05}"), "big")).collect();
    assert_eq!(store.insert_instances(many.clone()).await.unwrap(), 2_500);
    // The answer after an adoption, with one more: only that one is new.
    let mut again = many;
    again.push(instance("i-99999", "big"));
    assert_eq!(store.insert_instances(again).await.unwrap(), 1);
    let live = store.instances("c1", &[instance_state::BOOTING]).await.unwrap();
    assert_eq!(live.len(), 2_501);
}
